//! The plugin against an in-process fake kubelet: a Registration server on `kubelet.sock` in a
//! temporary directory that, like kubelet, dials the plugin back and asks its options before
//! answering `Register`; then calls on the plugin's socket as kubelet makes them.

use super::*;
use muster_core::devices::probe::ProbedGpu;
use proto::device_plugin_client::DevicePluginClient;
use proto::registration_server::{Registration, RegistrationServer};
use tokio::sync::{mpsc, oneshot};
use tonic::Code;
use tonic::transport::Channel;

/// How long anything the test waits for may take.
const WAIT: Duration = Duration::from_secs(10);

fn uuid(i: usize) -> String {
    format!("GPU-{i:08x}-0000-4000-8000-00000000000{i}")
}

/// Eight GPUs in NVLink pairs (0-1, 2-3, 4-5, 6-7: NV2), PXB between the pairs of a socket,
/// SYS across; GPUs 0-3 on NUMA node 0, 4-7 on node 1, GPU 7's NUMA node unknown. Listed
/// in a shuffled order, as a driver may.
fn probe() -> Probe {
    let order = [5usize, 2, 7, 0, 3, 6, 1, 4];
    let link = |i: usize, j: usize| match () {
        _ if i == j => Link::SelfLink,
        _ if i / 2 == j / 2 => Link::NvLink(2),
        _ if i / 4 == j / 4 => Link::Pxb,
        _ => Link::Sys,
    };
    let gpus = order
        .iter()
        .map(|&i| ProbedGpu {
            index: i as u32,
            uuid: uuid(i),
            numa: (i != 7).then_some((i / 4) as u32),
            memory_total_mib: 81920,
            memory_free_mib: None,
            temperature_c: None,
            utilization: None,
        })
        .collect();
    let links = order.iter().map(|&i| order.iter().map(|&j| link(i, j)).collect()).collect();
    Probe { gpus, links }
}

fn inventory() -> Inventory {
    Inventory::from_probe(&probe(), &[uuid(6)]).unwrap_or_else(|e| panic!("{e}"))
}

fn ids(indices: &[usize]) -> Vec<String> {
    indices.iter().map(|&i| uuid(i)).collect()
}

#[test]
fn inventory_lists_gpus_in_index_order_with_health_and_numa() {
    let devices = inventory().devices();
    let got: Vec<(&str, &str, Option<Vec<i64>>)> = devices
        .iter()
        .map(|d| {
            (d.id.as_str(), d.health.as_str(), d.topology.as_ref().map(|t| t.nodes.iter().map(|n| n.id).collect()))
        })
        .collect();
    let want: Vec<(String, &str, Option<Vec<i64>>)> = (0..8)
        .map(|i| {
            let health = if i == 6 { UNHEALTHY } else { HEALTHY };
            (uuid(i), health, (i != 7).then(|| vec![(i / 4) as i64]))
        })
        .collect();
    let want: Vec<(&str, &str, Option<Vec<i64>>)> = want.iter().map(|(u, h, n)| (u.as_str(), *h, n.clone())).collect();
    assert_eq!(got, want);
}

#[test]
fn broken_probes_and_unknown_unhealthy_are_refused() {
    let short = Probe { links: probe().links[1..].to_vec(), ..probe() };
    assert_eq!(Inventory::from_probe(&short, &[]), Err(InventoryError::Links { gpus: 8 }));
    let mut twice = probe();
    twice.gpus[1].uuid = twice.gpus[0].uuid.clone();
    assert!(matches!(Inventory::from_probe(&twice, &[]), Err(InventoryError::Duplicate(_))));
    let mut blank = probe();
    blank.gpus[0].uuid.clear();
    assert_eq!(Inventory::from_probe(&blank, &[]), Err(InventoryError::NoUuid { index: 5 }));
    assert_eq!(
        Inventory::from_probe(&probe(), &["GPU-nope".into()]),
        Err(InventoryError::UnknownUnhealthy("GPU-nope".into()))
    );
}

#[test]
fn preferred_maps_ids_and_ignores_kubelets_order() {
    let inv = inventory();
    // kubelet lists a Go set: any order gives the same answer.
    let fragmented = ids(&[7, 3, 1, 5, 2]);
    let mut reversed = fragmented.clone();
    reversed.reverse();
    for available in [fragmented, reversed] {
        assert_eq!(inv.preferred(&available, &[], 2), Ok(ids(&[2, 3])), "{available:?}");
    }
    assert_eq!(inv.preferred(&ids(&[0, 1, 2, 3, 4, 5, 6, 7]), &ids(&[5]), 2), Ok(ids(&[4, 5])));
    assert_eq!(inv.preferred(&ids(&[0, 1]), &[], -1), Ok(vec![]));
    assert_eq!(
        inv.preferred(&[uuid(0), "GPU-x".into()], &["GPU-y".into()], 1),
        Err(UnknownDevices(vec!["GPU-x".into(), "GPU-y".into()]))
    );
}

#[test]
fn allocation_is_the_envvar_strategy_only() {
    let got = container_allocation(&ids(&[3, 0]));
    assert_eq!(got.envs, HashMap::from([(VISIBLE_DEVICES.to_string(), format!("{},{}", uuid(3), uuid(0)))]));
}

#[test]
fn cli_defaults() {
    #[derive(clap::Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: Args,
    }
    let parse = |argv: &[&str]| <Wrapper as clap::Parser>::try_parse_from(argv).map(|w| w.args);
    let args = parse(&["device-plugin", "--probe-file", "p.json"]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(args.resource_name, "nvidia.com/gpu");
    assert_eq!(args.device_plugin_dir, Path::new("/var/lib/kubelet/device-plugins"));
    assert_eq!(args.socket_name, "muster-gpu.sock");
    assert!(args.unhealthy.is_empty());
    let args = parse(&["device-plugin", "--probe-file", "p.json", "--unhealthy", "GPU-a,GPU-b"])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(args.unhealthy, ["GPU-a", "GPU-b"]);
    assert!(parse(&["device-plugin"]).is_err(), "--probe-file is required");
    let bad = Args { socket_name: "kubelet.sock".into(), ..args };
    assert!(load(&bad).is_err());
}

/// What the fake kubelet saw of one `Register`.
#[derive(Debug)]
struct Registered {
    request: proto::RegisterRequest,
    /// The plugin's answer to `GetDevicePluginOptions`, asked while `Register` was open.
    options: Result<proto::DevicePluginOptions, String>,
}

/// kubelet's Registration service, as far as the plugin can tell.
struct FakeRegistration {
    dir: PathBuf,
    seen: mpsc::UnboundedSender<Registered>,
}

#[tonic::async_trait]
impl Registration for FakeRegistration {
    async fn register(&self, request: Request<proto::RegisterRequest>) -> Result<Response<proto::Empty>, Status> {
        let request = request.into_inner();
        let options = async {
            let mut plugin = connect(&self.dir.join(&request.endpoint)).await?;
            let options = plugin.get_device_plugin_options(proto::Empty {}).await.map_err(|s| s.to_string())?;
            Ok(options.into_inner())
        }
        .await;
        let _ = self.seen.send(Registered { request, options });
        Ok(Response::new(proto::Empty {}))
    }
}

/// A fake kubelet serving Registration on `dir/kubelet.sock` until dropped.
struct FakeKubelet {
    stop: Option<oneshot::Sender<()>>,
}

impl FakeKubelet {
    fn start(dir: &Path, seen: &mpsc::UnboundedSender<Registered>) -> FakeKubelet {
        let listener = bind(&dir.join(KUBELET_SOCKET)).unwrap_or_else(|e| panic!("{e:#}"));
        let service = RegistrationServer::new(FakeRegistration { dir: dir.to_path_buf(), seen: seen.clone() });
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(tonic::transport::Server::builder().add_service(service).serve_with_incoming_shutdown(
            UnixListenerStream::new(listener),
            async {
                let _ = stopped.await;
            },
        ));
        FakeKubelet { stop: Some(stop) }
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn connect(socket: &Path) -> Result<DevicePluginClient<Channel>, String> {
    let path = socket.to_path_buf();
    let connector = tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move { UnixStream::connect(path).await.map(TokioIo::new) }
    });
    let channel =
        Endpoint::from_static(UNUSED_URI).connect_with_connector(connector).await.map_err(|e| e.to_string())?;
    Ok(DevicePluginClient::new(channel))
}

async fn next_registration(seen: &mut mpsc::UnboundedReceiver<Registered>) -> Registered {
    match tokio::time::timeout(WAIT, seen.recv()).await {
        Ok(Some(r)) => r,
        Ok(None) => panic!("the fake kubelets are gone"),
        Err(_) => panic!("no Register within {WAIT:?}"),
    }
}

fn preferred_request(
    available: &[usize],
    must_include: &[usize],
    size: i32,
) -> proto::ContainerPreferredAllocationRequest {
    proto::ContainerPreferredAllocationRequest {
        available_device_ids: ids(available),
        must_include_device_ids: ids(must_include),
        allocation_size: size,
    }
}

/// The first ListAndWatch message on `socket`, and the stream, still open.
async fn first_devices(
    socket: &Path,
) -> (Vec<proto::Device>, tonic::Streaming<proto::ListAndWatchResponse>, DevicePluginClient<Channel>) {
    let mut client = connect(socket).await.unwrap_or_else(|e| panic!("{e}"));
    let mut stream =
        client.list_and_watch(proto::Empty {}).await.unwrap_or_else(|e| panic!("ListAndWatch: {e}")).into_inner();
    let first = tokio::time::timeout(WAIT, stream.message()).await;
    let Ok(Ok(Some(first))) = first else { panic!("no first ListAndWatch message: {first:?}") };
    (first.devices, stream, client)
}

#[tokio::test]
async fn registers_serves_kubelets_calls_and_registers_again_after_kubelet_restarts() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let dir = tmp.path().join("device-plugins");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let (seen_tx, mut seen) = mpsc::unbounded_channel();
    let kubelet = FakeKubelet::start(&dir, &seen_tx);

    let options = Options {
        dir: dir.clone(),
        socket_name: DEFAULT_SOCKET.into(),
        resource: "nvidia.com/gpu".into(),
        poll: Duration::from_millis(50),
        retry: Duration::from_millis(200),
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let plugin = tokio::spawn(run_until(Arc::new(inventory()), options, async {
        let _ = stopped.await;
    }));

    // Register: the fields kubelet checks, and the options the plugin answers while it is open.
    let first = next_registration(&mut seen).await;
    assert_eq!(first.request.version, "v1beta1");
    assert_eq!(first.request.endpoint, "muster-gpu.sock");
    assert_eq!(first.request.resource_name, "nvidia.com/gpu");
    let declared = proto::DevicePluginOptions { pre_start_required: false, get_preferred_allocation_available: true };
    assert_eq!(first.request.options, Some(declared));
    assert_eq!(first.options, Ok(declared));

    // ListAndWatch: every device at once, then the stream stays open.
    let socket = dir.join(DEFAULT_SOCKET);
    let (devices, mut stream, mut client) = first_devices(&socket).await;
    assert_eq!(devices, inventory().devices());
    assert_eq!(devices.iter().filter(|d| d.health == UNHEALTHY).map(|d| d.id.clone()).collect::<Vec<_>>(), ids(&[6]));
    assert!(tokio::time::timeout(Duration::from_millis(300), stream.message()).await.is_err(), "the stream ended");

    // GetPreferredAllocation: one answer per container, as the policy chooses.
    let asked = proto::PreferredAllocationRequest {
        container_requests: vec![
            preferred_request(&[7, 3, 1, 5, 2], &[], 2),
            preferred_request(&[0, 1, 2, 3, 4, 5, 7], &[5], 2),
            preferred_request(&[0, 1, 2, 3, 4, 5, 7], &[], 4),
            preferred_request(&[0, 1], &[], 3),
        ],
    };
    let answer = client.get_preferred_allocation(asked).await.unwrap_or_else(|e| panic!("{e}")).into_inner();
    let got: Vec<Vec<String>> = answer.container_responses.into_iter().map(|c| c.device_ids).collect();
    assert_eq!(got, [ids(&[2, 3]), ids(&[4, 5]), ids(&[0, 1, 2, 3]), vec![]]);

    // Allocate: NVIDIA_VISIBLE_DEVICES per container, in request order, nothing else.
    let asked = proto::AllocateRequest {
        container_requests: vec![
            proto::ContainerAllocateRequest { device_ids: ids(&[3, 2]) },
            proto::ContainerAllocateRequest { device_ids: ids(&[5]) },
        ],
    };
    let answer = client.allocate(asked).await.unwrap_or_else(|e| panic!("{e}")).into_inner();
    let envs: Vec<HashMap<String, String>> = answer.container_responses.into_iter().map(|c| c.envs).collect();
    assert_eq!(
        envs,
        [
            HashMap::from([(VISIBLE_DEVICES.to_string(), format!("{},{}", uuid(3), uuid(2)))]),
            HashMap::from([(VISIBLE_DEVICES.to_string(), uuid(5))]),
        ]
    );

    // Unknown IDs are refused, naming them.
    let asked = proto::AllocateRequest {
        container_requests: vec![proto::ContainerAllocateRequest { device_ids: vec![uuid(0), "GPU-nope".into()] }],
    };
    let refused = client.allocate(asked).await.err().unwrap_or_else(|| panic!("an unknown ID was allocated"));
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(refused.message().contains("GPU-nope") && !refused.message().contains(&uuid(0)), "{}", refused.message());
    let asked = proto::PreferredAllocationRequest {
        container_requests: vec![proto::ContainerPreferredAllocationRequest {
            available_device_ids: vec!["GPU-nope".into()],
            must_include_device_ids: vec![],
            allocation_size: 1,
        }],
    };
    let refused = client.get_preferred_allocation(asked).await.err();
    assert_eq!(refused.map(|s| s.code()), Some(Code::InvalidArgument));
    let pre = client.pre_start_container(proto::PreStartContainerRequest { device_ids: ids(&[0]) }).await;
    assert!(pre.is_ok());

    // kubelet restarts: it goes away, deletes the plugin sockets, and serves a new kubelet.sock.
    drop(kubelet);
    std::fs::remove_file(dir.join(KUBELET_SOCKET)).unwrap_or_else(|e| panic!("{e}"));
    std::fs::remove_file(&socket).unwrap_or_else(|e| panic!("{e}"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let kubelet = FakeKubelet::start(&dir, &seen_tx);
    let again = next_registration(&mut seen).await;
    assert_eq!(again.request, first.request);
    assert_eq!(again.options, Ok(declared));
    // The old generation's stream ended; the new socket serves the devices.
    let ended = tokio::time::timeout(WAIT, stream.message()).await;
    assert!(matches!(ended, Ok(Ok(None)) | Ok(Err(_))), "the old stream is still open: {ended:?}");
    let (devices, _stream, _client) = first_devices(&socket).await;
    assert_eq!(devices, inventory().devices());

    // Only kubelet.sock is new (the plugin's socket left alone): registers again too.
    drop(kubelet);
    let _kubelet = FakeKubelet::start(&dir, &seen_tx);
    let third = next_registration(&mut seen).await;
    assert_eq!(third.request, first.request);
    assert_eq!(third.options, Ok(declared));

    // Shutdown: stops serving and removes its socket.
    let _ = stop.send(());
    let ended = tokio::time::timeout(WAIT, plugin).await;
    assert!(matches!(ended, Ok(Ok(Ok(())))), "{ended:?}");
    assert!(!socket.exists());
}

#[tokio::test]
async fn registers_once_kubelet_appears() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let dir = tmp.path().to_path_buf();
    let options = Options {
        dir: dir.clone(),
        socket_name: "other.sock".into(),
        resource: "example.com/gpu".into(),
        poll: Duration::from_millis(50),
        retry: Duration::from_secs(60),
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let plugin = tokio::spawn(run_until(Arc::new(inventory()), options, async {
        let _ = stopped.await;
    }));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(dir.join("other.sock").exists(), "serves before kubelet is there");
    let (seen_tx, mut seen) = mpsc::unbounded_channel();
    let _kubelet = FakeKubelet::start(&dir, &seen_tx);
    let r = next_registration(&mut seen).await;
    assert_eq!((r.request.endpoint.as_str(), r.request.resource_name.as_str()), ("other.sock", "example.com/gpu"));
    let _ = stop.send(());
    assert!(matches!(tokio::time::timeout(WAIT, plugin).await, Ok(Ok(Ok(())))));
}

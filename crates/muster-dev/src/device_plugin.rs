//! `muster dev device-plugin`: a test device plugin that registers fake `nvidia.com/gpu`
//! devices with a real kubelet over the real device-plugin gRPC API (v1beta1), so kubelet
//! itself chooses the device IDs a container gets and the node agent reads that choice back
//! through PodResources.
//!
//! The devices are the GPUs of a recorded probe (`--probe-file`, the file `muster node-agent
//! --probe-file` replays): device ID = GPU UUID, topology = the GPU's NUMA node. The plugin
//! answers as NVIDIA's k8s-device-plugin does with its defaults: `GetPreferredAllocation` by
//! go-gpuallocator's best-effort policy ([`policy`]), `Allocate` with the `envvar` device-list
//! strategy (`NVIDIA_VISIBLE_DEVICES=<uuid,...>` and nothing else, so a container runs with
//! plain runc on a machine without GPUs). Like NVIDIA's plugin it serves again and registers
//! again when kubelet restarts (kubelet then deletes the plugin sockets and makes a new
//! `kubelet.sock`).
//!
//! Nothing of muster's runtime uses it.

pub mod policy;

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::Stream;
use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Endpoint, Uri};
use tonic::{Request, Response, Status};

use muster_core::devices::Link;
use muster_core::devices::probe::Probe;

use proto::device_plugin_server::{DevicePlugin, DevicePluginServer};
use proto::registration_client::RegistrationClient;

/// The messages, clients and servers of kubelet's device-plugin API, generated from
/// `proto/deviceplugin/v1beta1/deviceplugin.proto` (proto package `v1beta1`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("v1beta1");
}

/// The API version sent in `Register`.
pub const API_VERSION: &str = "v1beta1";
/// kubelet's registration socket, in the device-plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// The directory kubelet serves `kubelet.sock` in.
pub const DEFAULT_DIR: &str = "/var/lib/kubelet/device-plugins";
/// The plugin's own socket name, by default.
pub const DEFAULT_SOCKET: &str = "muster-gpu.sock";
/// The variable NVIDIA's `envvar` device-list strategy sets.
pub const VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
/// Device health as kubelet spells it.
pub const HEALTHY: &str = "Healthy";
/// Device health as kubelet spells it.
pub const UNHEALTHY: &str = "Unhealthy";

/// How often kubelet's restart is looked for (as NVIDIA's plugin watches the directory).
const POLL: Duration = Duration::from_secs(1);
/// How long after a refused or failed registration it is tried again, kubelet unchanged.
const RETRY: Duration = Duration::from_secs(5);
/// How long connecting to kubelet, and kubelet's answer to `Register`, may take.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a stopping server may take to finish its calls before it is dropped.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// Any URI: the connector ignores it and dials the socket.
const UNUSED_URI: &str = "http://[::1]:0";

/// Arguments of `muster dev device-plugin`.
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
pub struct Args {
    /// The recorded probe (JSON) whose GPUs are the devices, the file `muster node-agent
    /// --probe-file` replays: device IDs are the GPUs' UUIDs, each device's topology its NUMA node.
    #[arg(long)]
    pub probe_file: PathBuf,
    /// The extended resource the devices are registered as.
    #[arg(long, default_value = crate::GPU_RESOURCE)]
    pub resource_name: String,
    /// kubelet's device-plugin directory: kubelet.sock is in it, and the plugin's socket goes there.
    #[arg(long, default_value = DEFAULT_DIR)]
    pub device_plugin_dir: PathBuf,
    /// The plugin's socket file name, in --device-plugin-dir.
    #[arg(long, default_value = DEFAULT_SOCKET)]
    pub socket_name: String,
    /// GPUs (UUIDs, comma-separated) reported Unhealthy: kubelet allocates them to nobody.
    #[arg(long, value_name = "UUID,...", value_delimiter = ',')]
    pub unhealthy: Vec<String>,
}

/// One device the plugin serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    /// Index as nvidia-smi numbers it.
    pub index: u32,
    /// `GPU-...` UUID: the device ID.
    pub uuid: String,
    /// NUMA node, when known.
    pub numa: Option<u32>,
    /// Reported Healthy (or Unhealthy).
    pub healthy: bool,
}

/// PURE: the plugin's devices (in index order) and the links between them, from a probe.
#[derive(Clone, Debug, PartialEq)]
pub struct Inventory {
    gpus: Vec<Gpu>,
    /// `links[i][j]` between `gpus[i]` and `gpus[j]`.
    links: Vec<Vec<Link>>,
    by_uuid: HashMap<String, usize>,
}

/// A probe the plugin cannot serve.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InventoryError {
    /// The link matrix is not one row and one column per GPU.
    #[error("the link matrix must be {gpus}x{gpus}, one row and one column per GPU")]
    Links {
        /// GPUs in the probe.
        gpus: usize,
    },
    /// A GPU without a UUID (the device ID).
    #[error("GPU {index} has no UUID")]
    NoUuid {
        /// Its index.
        index: u32,
    },
    /// Two GPUs with one UUID.
    #[error("UUID {0} is listed twice")]
    Duplicate(String),
    /// An `--unhealthy` UUID the probe does not have.
    #[error("--unhealthy {0}: no GPU of the probe has this UUID")]
    UnknownUnhealthy(String),
}

/// Device IDs the plugin does not serve.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown device ID(s) {}", .0.join(", "))]
pub struct UnknownDevices(pub Vec<String>);

impl Inventory {
    /// The devices of `probe`, those in `unhealthy` reported Unhealthy.
    pub fn from_probe(probe: &Probe, unhealthy: &[String]) -> Result<Inventory, InventoryError> {
        let n = probe.gpus.len();
        if probe.links.len() != n || probe.links.iter().any(|row| row.len() != n) {
            return Err(InventoryError::Links { gpus: n });
        }
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&p| probe.gpus[p].index);
        let mut gpus = Vec::with_capacity(n);
        let mut by_uuid = HashMap::with_capacity(n);
        for &p in &order {
            let g = &probe.gpus[p];
            if g.uuid.is_empty() {
                return Err(InventoryError::NoUuid { index: g.index });
            }
            if by_uuid.insert(g.uuid.clone(), gpus.len()).is_some() {
                return Err(InventoryError::Duplicate(g.uuid.clone()));
            }
            gpus.push(Gpu { index: g.index, uuid: g.uuid.clone(), numa: g.numa, healthy: true });
        }
        for uuid in unhealthy.iter().map(|u| u.trim()).filter(|u| !u.is_empty()) {
            let &at = by_uuid.get(uuid).ok_or_else(|| InventoryError::UnknownUnhealthy(uuid.to_string()))?;
            gpus[at].healthy = false;
        }
        let links = order.iter().map(|&i| order.iter().map(|&j| probe.links[i][j]).collect()).collect();
        Ok(Inventory { gpus, links, by_uuid })
    }

    /// The devices, in index order.
    pub fn gpus(&self) -> &[Gpu] {
        &self.gpus
    }

    /// The devices as `ListAndWatch` sends them.
    pub fn devices(&self) -> Vec<proto::Device> {
        self.gpus
            .iter()
            .map(|g| proto::Device {
                id: g.uuid.clone(),
                health: if g.healthy { HEALTHY } else { UNHEALTHY }.to_string(),
                topology: g.numa.map(|n| proto::TopologyInfo { nodes: vec![proto::NumaNode { id: i64::from(n) }] }),
            })
            .collect()
    }

    /// Positions of `ids`, or every ID that is not a device.
    fn positions(&self, ids: &[String]) -> Result<Vec<usize>, UnknownDevices> {
        let mut unknown = Vec::new();
        let mut positions = Vec::with_capacity(ids.len());
        for id in ids {
            match self.by_uuid.get(id) {
                Some(&p) => positions.push(p),
                None => unknown.push(id.clone()),
            }
        }
        if unknown.is_empty() { Ok(positions) } else { Err(UnknownDevices(unknown)) }
    }

    /// Fails with every ID of `ids` that is not a device.
    pub fn check_known(&self, ids: &[String]) -> Result<(), UnknownDevices> {
        self.positions(ids).map(|_| ())
    }

    /// The preferred `size` devices of `available`, including `must_include`, by the
    /// best-effort policy ([`policy::best_effort`]), in index order. The order kubelet lists
    /// the IDs in (a Go set's, so random) does not matter: ties go to the lowest indices.
    /// Empty when there is no such choice (kubelet then picks by itself).
    pub fn preferred(
        &self,
        available: &[String],
        must_include: &[String],
        size: i32,
    ) -> Result<Vec<String>, UnknownDevices> {
        let (mut available, mut required) = match (self.positions(available), self.positions(must_include)) {
            (Ok(a), Ok(r)) => (a, r),
            (a, r) => {
                let unknown = [a.err(), r.err()].into_iter().flatten().flat_map(|e| e.0).collect();
                return Err(UnknownDevices(unknown));
            }
        };
        available.sort_unstable();
        required.sort_unstable();
        let size = usize::try_from(size).unwrap_or(0);
        let chosen = policy::best_effort(&self.links, &available, &required, size);
        Ok(chosen.into_iter().map(|p| self.gpus[p].uuid.clone()).collect())
    }
}

/// The `Allocate` answer for one container: `NVIDIA_VISIBLE_DEVICES` with the IDs in request
/// order, as NVIDIA's `envvar` strategy sets it; no device nodes, mounts or annotations.
pub fn container_allocation(ids: &[String]) -> proto::ContainerAllocateResponse {
    proto::ContainerAllocateResponse { envs: HashMap::from([(VISIBLE_DEVICES.to_string(), ids.join(","))]) }
}

/// The options the plugin declares, in `Register` and `GetDevicePluginOptions`.
pub fn options() -> proto::DevicePluginOptions {
    proto::DevicePluginOptions { pre_start_required: false, get_preferred_allocation_available: true }
}

/// The DevicePlugin service of one serving generation.
#[derive(Clone, Debug)]
struct Plugin {
    inventory: Arc<Inventory>,
    resource: String,
    /// True once this generation stops: open ListAndWatch streams then end.
    stopped: watch::Receiver<bool>,
}

fn refuse(resource: &str, e: &UnknownDevices) -> Status {
    Status::invalid_argument(format!("{resource}: {e}: this plugin serves only the GPUs of its probe file"))
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<proto::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for Plugin {
    type ListAndWatchStream = DeviceStream;

    async fn get_device_plugin_options(
        &self,
        _request: Request<proto::Empty>,
    ) -> Result<Response<proto::DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    async fn list_and_watch(
        &self,
        _request: Request<proto::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let devices = self.inventory.devices();
        tracing::info!(resource = %self.resource, devices = devices.len(), "ListAndWatch: sending the devices");
        let first = futures::stream::once(std::future::ready(Ok(proto::ListAndWatchResponse { devices })));
        // Nothing changes afterwards: the stream stays open until this generation stops.
        let mut stopped = self.stopped.clone();
        let open = futures::stream::once(async move {
            let _ = stopped.wait_for(|s| *s).await;
        });
        let rest = futures::StreamExt::filter_map(open, |()| std::future::ready(None));
        Ok(Response::new(Box::pin(futures::StreamExt::chain(first, rest))))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<proto::PreferredAllocationRequest>,
    ) -> Result<Response<proto::PreferredAllocationResponse>, Status> {
        let mut container_responses = Vec::new();
        for r in request.into_inner().container_requests {
            let chosen = self
                .inventory
                .preferred(&r.available_device_ids, &r.must_include_device_ids, r.allocation_size)
                .map_err(|e| refuse(&self.resource, &e))?;
            tracing::info!(
                resource = %self.resource,
                available = ?r.available_device_ids,
                must_include = ?r.must_include_device_ids,
                size = r.allocation_size,
                preferred = ?chosen,
                "GetPreferredAllocation"
            );
            container_responses.push(proto::ContainerPreferredAllocationResponse { device_ids: chosen });
        }
        Ok(Response::new(proto::PreferredAllocationResponse { container_responses }))
    }

    async fn allocate(
        &self,
        request: Request<proto::AllocateRequest>,
    ) -> Result<Response<proto::AllocateResponse>, Status> {
        let requests = request.into_inner().container_requests;
        for r in &requests {
            if let Err(e) = self.inventory.check_known(&r.device_ids) {
                tracing::warn!(resource = %self.resource, ids = ?r.device_ids, error = %e, "Allocate refused");
                return Err(refuse(&self.resource, &e));
            }
        }
        let container_responses = requests
            .iter()
            .map(|r| {
                tracing::info!(resource = %self.resource, ids = ?r.device_ids, "Allocate");
                container_allocation(&r.device_ids)
            })
            .collect();
        Ok(Response::new(proto::AllocateResponse { container_responses }))
    }

    async fn pre_start_container(
        &self,
        _request: Request<proto::PreStartContainerRequest>,
    ) -> Result<Response<proto::PreStartContainerResponse>, Status> {
        Ok(Response::new(proto::PreStartContainerResponse {}))
    }
}

/// Where and what the plugin serves, and how often it looks for kubelet's restart.
#[derive(Clone, Debug)]
pub struct Options {
    /// kubelet's device-plugin directory.
    pub dir: PathBuf,
    /// The plugin's socket file name in `dir`.
    pub socket_name: String,
    /// The extended resource.
    pub resource: String,
    /// How often the sockets are looked at.
    pub poll: Duration,
    /// How long after a failed registration it is tried again.
    pub retry: Duration,
}

impl Options {
    fn socket(&self) -> PathBuf {
        self.dir.join(&self.socket_name)
    }

    fn kubelet_socket(&self) -> PathBuf {
        self.dir.join(KUBELET_SOCKET)
    }

    /// What `Register` sends.
    pub fn register_request(&self) -> proto::RegisterRequest {
        proto::RegisterRequest {
            version: API_VERSION.to_string(),
            endpoint: self.socket_name.clone(),
            resource_name: self.resource.clone(),
            options: Some(options()),
        }
    }
}

/// One serving generation: the DevicePlugin server on the plugin's socket.
struct Served {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Served {
    /// Serves `inventory` on `socket` (a file left there is replaced) until stopped.
    fn start(socket: &Path, inventory: &Arc<Inventory>, resource: &str) -> anyhow::Result<Served> {
        let listener = bind(socket)?;
        let (stop, stopped) = watch::channel(false);
        let plugin = Plugin { inventory: Arc::clone(inventory), resource: resource.to_string(), stopped };
        let mut until = stop.subscribe();
        let serve = tonic::transport::Server::builder()
            .add_service(DevicePluginServer::new(plugin))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                let _ = until.wait_for(|s| *s).await;
            });
        let shown = socket.display().to_string();
        let task = tokio::spawn(async move {
            if let Err(e) = serve.await {
                tracing::warn!(socket = %shown, error = %e, "the device plugin's server failed");
            }
        });
        Ok(Served { stop, task })
    }

    /// Ends open streams and calls, then the server (dropped if it takes too long).
    async fn stop(self) {
        let _ = self.stop.send(true);
        let mut task = self.task;
        if tokio::time::timeout(STOP_TIMEOUT, &mut task).await.is_err() {
            task.abort();
        }
    }
}

/// Listens on `socket`, replacing a file left there.
fn bind(socket: &Path) -> anyhow::Result<UnixListener> {
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    match std::fs::remove_file(socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing the stale {}", socket.display())),
    }
    UnixListener::bind(socket).with_context(|| format!("listening on {}", socket.display()))
}

/// Which file is at `path` now, if any: device, inode and change time (a file made anew may
/// get the inode number of the one it replaces, not its change time).
fn file_id(path: &Path) -> Option<(u64, u64, i64, i64)> {
    std::fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}

/// Registers with kubelet on `kubelet_socket`.
async fn register(kubelet_socket: &Path, request: proto::RegisterRequest) -> anyhow::Result<()> {
    let path = kubelet_socket.to_path_buf();
    let connector = tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move { UnixStream::connect(path).await.map(TokioIo::new) }
    });
    let channel =
        tokio::time::timeout(REGISTER_TIMEOUT, Endpoint::from_static(UNUSED_URI).connect_with_connector(connector))
            .await
            .map_err(|_| anyhow::anyhow!("no connection to {} within {REGISTER_TIMEOUT:?}", kubelet_socket.display()))?
            .with_context(|| format!("connecting to {}", kubelet_socket.display()))?;
    let mut client = RegistrationClient::new(channel);
    tokio::time::timeout(REGISTER_TIMEOUT, client.register(request))
        .await
        .map_err(|_| anyhow::anyhow!("kubelet did not answer Register within {REGISTER_TIMEOUT:?}"))?
        .map_err(|s| anyhow::anyhow!("kubelet refused the registration: {} ({:?})", s.message(), s.code()))?;
    Ok(())
}

/// Serves and registers, again each time kubelet restarts, until `shutdown` resolves; then
/// stops serving and removes the plugin's socket. Fails only when the socket cannot be served.
pub async fn run_until(
    inventory: Arc<Inventory>,
    options: Options,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    tokio::pin!(shutdown);
    let socket = options.socket();
    let kubelet = options.kubelet_socket();
    loop {
        let served = Served::start(&socket, &inventory, &options.resource)?;
        let ours = file_id(&socket);
        let kubelet_at_start = file_id(&kubelet);
        let request = options.register_request();
        let attempt = tokio::select! {
            attempt = register(&kubelet, request.clone()) => attempt,
            () = &mut shutdown => return stop_serving(served, &socket).await,
        };
        let registered = match attempt {
            Ok(()) => {
                tracing::info!(
                    kubelet = %kubelet.display(),
                    version = %request.version,
                    endpoint = %request.endpoint,
                    resource = %request.resource_name,
                    devices = inventory.gpus().len(),
                    "Register: registered with kubelet"
                );
                true
            }
            Err(e) => {
                tracing::warn!(kubelet = %kubelet.display(), error = %format!("{e:#}"), "Register failed; trying again when kubelet restarts or in {:?}", options.retry);
                false
            }
        };
        let tried = Instant::now();
        loop {
            tokio::select! {
                () = &mut shutdown => return stop_serving(served, &socket).await,
                () = tokio::time::sleep(options.poll) => {}
            }
            if file_id(&socket) != ours {
                tracing::info!(socket = %socket.display(), "the plugin's socket is gone (kubelet restarted?): serving and registering again");
                break;
            }
            let now = file_id(&kubelet);
            if now != kubelet_at_start && now.is_some() {
                tracing::info!(kubelet = %kubelet.display(), "kubelet.sock is new (kubelet restarted): serving and registering again");
                break;
            }
            if !registered && now.is_some() && tried.elapsed() >= options.retry {
                break;
            }
        }
        served.stop().await;
    }
}

/// Stops serving for good and removes the plugin's socket.
async fn stop_serving(served: Served, socket: &Path) -> anyhow::Result<()> {
    served.stop().await;
    match std::fs::remove_file(socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(socket = %socket.display(), error = %e, "cannot remove the plugin's socket"),
    }
    tracing::info!(socket = %socket.display(), "stopped");
    Ok(())
}

/// Runs `muster dev device-plugin` until `shutdown` resolves (SIGTERM or Ctrl-C).
pub fn run(args: Args, shutdown: impl Future<Output = ()> + Send + 'static) -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).try_init();
    let inventory = match load(&args) {
        Ok(i) => Arc::new(i),
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    tracing::info!(
        probe = %args.probe_file.display(),
        gpus = inventory.gpus().len(),
        unhealthy = inventory.gpus().iter().filter(|g| !g.healthy).count(),
        resource = %args.resource_name,
        "serving the probe's GPUs as devices"
    );
    let options = Options {
        dir: args.device_plugin_dir,
        socket_name: args.socket_name,
        resource: args.resource_name,
        poll: POLL,
        retry: RETRY,
    };
    crate::block_on(async move {
        match run_until(inventory, options, shutdown).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        }
    })
}

/// The inventory `args` describe.
fn load(args: &Args) -> anyhow::Result<Inventory> {
    if args.socket_name.is_empty() || args.socket_name.contains('/') || args.socket_name == KUBELET_SOCKET {
        anyhow::bail!(
            "--socket-name {:?}: a file name in --device-plugin-dir other than {KUBELET_SOCKET}",
            args.socket_name
        );
    }
    let path = &args.probe_file;
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let probe: Probe = serde_json::from_str(&text).with_context(|| format!("{} is not a probe", path.display()))?;
    Inventory::from_probe(&probe, &args.unhealthy).with_context(|| path.display().to_string())
}

#[cfg(test)]
mod tests;

//! The client of kubelet's PodResources API (v1), over kubelet's unix socket: which devices
//! kubelet gave each pod's containers, and which it can allocate. The gRPC code is generated at
//! build time from the vendored proto (the `muster-podresources` crate); what the answers mean for muster is
//! decided in `devices::report`, not here.

use std::error::Error as StdError;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::devices::report::{ContainerDevices, PodDevices, ResourceDevices};

use proto::pod_resources_lister_client::PodResourcesListerClient;

/// Where kubelet serves PodResources.
pub const POD_RESOURCES_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// The largest answer accepted: kubelet's own client of this API allows 16 MiB, as a node
/// with many pods and devices answers List with more than gRPC's default 4 MiB.
const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// The URI the channel is made for; the connector ignores it and dials the socket.
const UNUSED_URI: &str = "http://localhost";

/// The gRPC method names, as errors name them.
const LIST: &str = "List";
const GET: &str = "Get";
const ALLOCATABLE: &str = "GetAllocatableResources";

/// The messages and client of the PodResources API (generated in `muster-podresources`).
pub use muster_podresources::v1 as proto;

/// Why a PodResources call gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    /// The socket is absent, refused the connection, or did not speak gRPC in time.
    #[error("cannot connect to kubelet's PodResources socket {}: {reason}", socket.display())]
    Connect {
        /// The socket dialled.
        socket: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// kubelet answered the call with an error status.
    #[error("kubelet PodResources {method} failed with {code:?}: {message}")]
    Call {
        /// The gRPC method.
        method: &'static str,
        /// The status code.
        code: tonic::Code,
        /// The status message.
        message: String,
    },
    /// kubelet did not answer the call in time.
    #[error("kubelet PodResources {method} gave no answer within {after:?}")]
    Timeout {
        /// The gRPC method.
        method: &'static str,
        /// The time allowed.
        after: Duration,
    },
}

/// A connection to kubelet's PodResources service.
#[derive(Clone, Debug)]
pub struct PodResourcesClient {
    inner: PodResourcesListerClient<Channel>,
    timeout: Duration,
}

impl PodResourcesClient {
    /// Connects over the unix socket; fails (never panics) when it is absent or refuses, within `timeout`.
    pub async fn connect(socket: &Path, timeout: Duration) -> Result<Self, KubeletError> {
        let failed = |reason: String| KubeletError::Connect { socket: socket.to_path_buf(), reason };
        let path = socket.to_path_buf();
        let connector = tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        });
        let endpoint = Endpoint::from_static(UNUSED_URI);
        let channel = tokio::time::timeout(timeout, endpoint.connect_with_connector(connector))
            .await
            .map_err(|_| failed(format!("no connection within {timeout:?}")))?
            .map_err(|e| failed(error_chain(&e)))?;
        let inner = PodResourcesListerClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES);
        Ok(PodResourcesClient { inner, timeout })
    }

    /// Every pod kubelet lists, with each container's devices.
    pub async fn list(&mut self) -> Result<Vec<PodDevices>, KubeletError> {
        let request = proto::ListPodResourcesRequest {};
        let answer = within(self.timeout, LIST, self.inner.list(request)).await?;
        Ok(answer.pod_resources.into_iter().map(pod_devices).collect())
    }

    /// One pod; Ok(None) when kubelet says NotFound.
    ///
    /// kubelet itself (up to 1.37 at least) answers an unknown pod with code Unknown and the
    /// message `pod <name> in namespace <namespace> not found`; that is taken as NotFound too.
    pub async fn get(&mut self, namespace: &str, name: &str) -> Result<Option<PodDevices>, KubeletError> {
        let request =
            proto::GetPodResourcesRequest { pod_name: name.to_string(), pod_namespace: namespace.to_string() };
        match within(self.timeout, GET, self.inner.get(request)).await {
            Ok(answer) => Ok(answer.pod_resources.map(pod_devices)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The devices kubelet can allocate (GetAllocatableResources), per resource.
    pub async fn allocatable(&mut self) -> Result<Vec<ResourceDevices>, KubeletError> {
        let request = proto::AllocatableResourcesRequest {};
        let answer = within(self.timeout, ALLOCATABLE, self.inner.get_allocatable_resources(request)).await?;
        Ok(answer.devices.into_iter().map(resource_devices).collect())
    }
}

/// The answer of one call, or why there is none.
async fn within<T>(
    timeout: Duration,
    method: &'static str,
    call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, KubeletError> {
    match tokio::time::timeout(timeout, call).await {
        Err(_) => Err(KubeletError::Timeout { method, after: timeout }),
        Ok(Err(status)) => {
            Err(KubeletError::Call { method, code: status.code(), message: status.message().to_string() })
        }
        Ok(Ok(response)) => Ok(response.into_inner()),
    }
}

/// Whether kubelet said the pod asked for does not exist.
fn is_not_found(error: &KubeletError) -> bool {
    match error {
        KubeletError::Call { code: tonic::Code::NotFound, .. } => true,
        KubeletError::Call { code: tonic::Code::Unknown, message, .. } => message.ends_with(" not found"),
        _ => false,
    }
}

/// An error with its sources, as tonic's transport error alone says only "transport error".
fn error_chain(error: &dyn StdError) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// One pod as kubelet lists it, without its CPUs, memory and DRA claims.
fn pod_devices(pod: proto::PodResources) -> PodDevices {
    PodDevices {
        namespace: pod.namespace,
        name: pod.name,
        containers: pod.containers.into_iter().map(container_devices).collect(),
    }
}

/// One container's device-plugin devices.
fn container_devices(container: proto::ContainerResources) -> ContainerDevices {
    ContainerDevices { name: container.name, devices: container.devices.into_iter().map(resource_devices).collect() }
}

/// The devices of one resource, without their NUMA topology.
fn resource_devices(devices: proto::ContainerDevices) -> ResourceDevices {
    ResourceDevices { resource: devices.resource_name, ids: devices.device_ids }
}

#[cfg(test)]
mod tests {
    use super::*;
    use muster_dev::kubelet::{Calls, FakeKubelet};

    const TIMEOUT: Duration = Duration::from_secs(5);

    fn gpus(ids: &[&str]) -> ResourceDevices {
        ResourceDevices { resource: "nvidia.com/gpu".into(), ids: ids.iter().map(|s| s.to_string()).collect() }
    }

    fn nics(ids: &[&str]) -> ResourceDevices {
        ResourceDevices { resource: "example.com/rdma".into(), ids: ids.iter().map(|s| s.to_string()).collect() }
    }

    fn container(name: &str, devices: Vec<ResourceDevices>) -> ContainerDevices {
        ContainerDevices { name: name.into(), devices }
    }

    fn two_pods() -> Vec<PodDevices> {
        vec![
            PodDevices {
                namespace: "team-a".into(),
                name: "trainer-0".into(),
                containers: vec![
                    container("main", vec![gpus(&["GPU-aaa", "GPU-bbb"]), nics(&["mlx5_0"])]),
                    container("sidecar", vec![]),
                ],
            },
            PodDevices {
                namespace: "team-b".into(),
                name: "infer-1".into(),
                containers: vec![container("server", vec![gpus(&["GPU-ccc::2"])])],
            },
        ]
    }

    async fn fake_and_client() -> (tempfile::TempDir, FakeKubelet, PodResourcesClient) {
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeKubelet::start(&dir.path().join("pod-resources/kubelet.sock")).await.unwrap();
        let client = PodResourcesClient::connect(fake.socket(), TIMEOUT).await.unwrap();
        (dir, fake, client)
    }

    #[tokio::test]
    async fn list_round_trips_pods_containers_and_resources() {
        let (_dir, fake, mut client) = fake_and_client().await;
        fake.set_pods(two_pods());
        assert_eq!(client.list().await.unwrap(), two_pods());
    }

    #[tokio::test]
    async fn list_of_an_empty_node_is_empty() {
        let (_dir, _fake, mut client) = fake_and_client().await;
        assert_eq!(client.list().await.unwrap(), vec![]);
    }

    #[tokio::test]
    async fn get_finds_a_listed_pod() {
        let (_dir, fake, mut client) = fake_and_client().await;
        fake.set_pods(two_pods());
        assert_eq!(client.get("team-b", "infer-1").await.unwrap(), Some(two_pods()[1].clone()));
    }

    #[tokio::test]
    async fn get_of_an_unknown_pod_is_none() {
        let (_dir, fake, mut client) = fake_and_client().await;
        fake.set_pods(two_pods());
        assert_eq!(client.get("team-a", "infer-1").await.unwrap(), None);
        assert_eq!(client.get("nowhere", "nothing").await.unwrap(), None);
    }

    #[tokio::test]
    async fn get_answered_not_found_is_none() {
        let (_dir, fake, mut client) = fake_and_client().await;
        fake.set_pods(two_pods());
        fake.fail_next(1, tonic::Code::NotFound);
        assert_eq!(client.get("team-a", "trainer-0").await.unwrap(), None);
    }

    #[tokio::test]
    async fn get_failing_otherwise_is_an_error() {
        let (_dir, fake, mut client) = fake_and_client().await;
        fake.set_pods(two_pods());
        fake.fail_next(1, tonic::Code::Unknown);
        let err = client.get("team-a", "trainer-0").await.unwrap_err();
        assert!(matches!(err, KubeletError::Call { method: "Get", code: tonic::Code::Unknown, .. }), "{err}");
    }

    #[tokio::test]
    async fn allocatable_lists_devices_per_resource() {
        let (_dir, fake, mut client) = fake_and_client().await;
        let devices = vec![gpus(&["GPU-aaa", "GPU-bbb", "GPU-ccc"]), nics(&["mlx5_0", "mlx5_1"])];
        fake.set_allocatable(devices.clone());
        assert_eq!(client.allocatable().await.unwrap(), devices);
    }

    #[tokio::test]
    async fn a_failing_call_is_a_call_error_with_its_code() {
        let (_dir, fake, mut client) = fake_and_client().await;
        fake.set_pods(two_pods());
        fake.fail_next(2, tonic::Code::ResourceExhausted);
        for _ in 0..2 {
            let err = client.list().await.unwrap_err();
            let KubeletError::Call { method, code, .. } = err else { panic!("not a call error: {err}") };
            assert_eq!((method, code), ("List", tonic::Code::ResourceExhausted));
        }
        fake.fail_next(1, tonic::Code::Unavailable);
        let err = client.allocatable().await.unwrap_err();
        assert!(matches!(err, KubeletError::Call { method: "GetAllocatableResources", .. }), "{err}");
        assert_eq!(client.list().await.unwrap(), two_pods());
    }

    #[tokio::test]
    async fn a_missing_socket_is_a_connect_error() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("kubelet.sock");
        let started = std::time::Instant::now();
        let err = PodResourcesClient::connect(&socket, TIMEOUT).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(1), "took {:?}", started.elapsed());
        let KubeletError::Connect { socket: named, reason } = &err else { panic!("not a connect error: {err}") };
        assert_eq!(named, &socket);
        assert!(!reason.is_empty());
    }

    #[tokio::test]
    async fn a_socket_nobody_serves_is_a_connect_error() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("kubelet.sock");
        drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
        let err = PodResourcesClient::connect(&socket, TIMEOUT).await.unwrap_err();
        assert!(matches!(err, KubeletError::Connect { .. }), "{err}");
    }

    // A listener that accepts and never speaks: the HTTP/2 handshake does not wait for the
    // server, so connecting succeeds and the call is what times out.
    #[tokio::test]
    async fn a_call_nobody_answers_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("kubelet.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let _held = tokio::spawn(async move {
            let mut open = vec![];
            while let Ok((stream, _)) = listener.accept().await {
                open.push(stream);
            }
        });
        let short = Duration::from_millis(200);
        let mut client = PodResourcesClient::connect(&socket, short).await.unwrap();
        let err = client.list().await.unwrap_err();
        assert!(matches!(err, KubeletError::Timeout { method: "List", after } if after == short), "{err}");
    }

    #[tokio::test]
    async fn the_fake_counts_every_call() {
        let (_dir, fake, mut client) = fake_and_client().await;
        fake.set_pods(two_pods());
        client.list().await.unwrap();
        client.list().await.unwrap();
        client.get("team-a", "trainer-0").await.unwrap();
        fake.fail_next(1, tonic::Code::Internal);
        client.allocatable().await.unwrap_err();
        assert_eq!(fake.calls(), Calls { list: 2, get: 1, allocatable: 1 });
    }

    #[tokio::test]
    async fn a_dropped_fake_leaves_no_socket_and_refuses() {
        let (dir, fake, mut client) = fake_and_client().await;
        let socket = fake.socket().to_path_buf();
        drop(fake);
        assert!(!socket.exists());
        let err = PodResourcesClient::connect(&socket, TIMEOUT).await.unwrap_err();
        assert!(matches!(err, KubeletError::Connect { .. }), "{err}");
        let err = client.list().await.unwrap_err();
        assert!(matches!(err, KubeletError::Call { code: tonic::Code::Unavailable, .. }), "{err}");
        // Once tonic closed the connection, the channel redials the socket, which is gone.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let err = client.list().await.unwrap_err();
        assert!(matches!(err, KubeletError::Call { code: tonic::Code::Unavailable, .. }), "{err}");
        drop(dir);
    }

    #[tokio::test]
    async fn a_stale_socket_file_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("kubelet.sock");
        drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
        let fake = FakeKubelet::start(&socket).await.unwrap();
        fake.set_pods(two_pods());
        let mut client = PodResourcesClient::connect(&socket, TIMEOUT).await.unwrap();
        assert_eq!(client.list().await.unwrap(), two_pods());
    }
}

//! A fake kubelet for tests: it serves the real, generated PodResources gRPC service on a unix
//! socket, answering what the test set, so the node agent's PodResources client (`muster::agent::kubelet`) is tested
//! over the same wire as against kubelet. Nothing of muster's runtime uses it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use anyhow::Context as _;
use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Code, Request, Response, Status};

use muster_core::devices::report::{ContainerDevices, PodDevices, ResourceDevices};
use muster_podresources::v1 as proto;
use muster_podresources::v1::pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer};

/// How many calls of each method the fake answered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Calls {
    /// `List` calls.
    pub list: usize,
    /// `Get` calls.
    pub get: usize,
    /// `GetAllocatableResources` calls.
    pub allocatable: usize,
}

/// A PodResources server on a unix socket, answering what the test set, until dropped.
#[derive(Debug)]
pub struct FakeKubelet {
    socket: PathBuf,
    state: Arc<Mutex<State>>,
    stop: Option<oneshot::Sender<()>>,
}

/// What the fake answers, and what it was asked.
#[derive(Debug, Default)]
struct State {
    pods: Vec<PodDevices>,
    allocatable: Vec<ResourceDevices>,
    failures_left: usize,
    failure: Option<Code>,
    calls: Calls,
    /// Set when the fake is dropped: tonic closes open connections only gracefully, after
    /// the drop returned, and a call on one must not be answered meanwhile.
    stopped: bool,
}

impl FakeKubelet {
    /// Serves on `socket` (parents created, a stale socket file removed) until dropped.
    pub async fn start(socket: &Path) -> anyhow::Result<FakeKubelet> {
        let listener = bind(socket).await?;
        let state = Arc::new(Mutex::new(State::default()));
        let service = PodResourcesListerServer::new(Lister { state: Arc::clone(&state) });
        let (stop, stopped) = oneshot::channel::<()>();
        let serve = tonic::transport::Server::builder().add_service(service).serve_with_incoming_shutdown(
            UnixListenerStream::new(listener),
            async {
                let _ = stopped.await;
            },
        );
        let shown = socket.display().to_string();
        tokio::spawn(async move {
            if let Err(e) = serve.await {
                tracing::warn!(socket = %shown, error = %e, "fake kubelet stopped serving");
            }
        });
        Ok(FakeKubelet { socket: socket.to_path_buf(), state, stop: Some(stop) })
    }

    /// The socket served.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// What List (and Get) answer from now on.
    pub fn set_pods(&self, pods: Vec<PodDevices>) {
        lock(&self.state).pods = pods;
    }

    /// What GetAllocatableResources answers.
    pub fn set_allocatable(&self, devices: Vec<ResourceDevices>) {
        lock(&self.state).allocatable = devices;
    }

    /// The next `n` calls (any method) fail with `code`.
    pub fn fail_next(&self, n: usize, code: Code) {
        let mut state = lock(&self.state);
        state.failures_left = n;
        state.failure = Some(code);
    }

    /// How many calls of each method were answered so far (failed ones included).
    pub fn calls(&self) -> Calls {
        lock(&self.state).calls
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        lock(&self.state).stopped = true;
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Listens on `socket`, making its directory and replacing a file left there.
async fn bind(socket: &Path) -> anyhow::Result<UnixListener> {
    if let Some(dir) = socket.parent() {
        tokio::fs::create_dir_all(dir).await.with_context(|| format!("creating {}", dir.display()))?;
    }
    match tokio::fs::remove_file(socket).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing the stale {}", socket.display())),
    }
    UnixListener::bind(socket).with_context(|| format!("listening on {}", socket.display()))
}

/// The state, even if a test panicked while holding it.
fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The PodResources service the fake serves.
struct Lister {
    state: Arc<Mutex<State>>,
}

impl Lister {
    /// Counts a call, then fails it if a failure is due, or answers it with `answer`; once the
    /// fake is dropped, fails it as a dead kubelet's connection would.
    fn answer<T>(
        &self,
        count: fn(&mut Calls),
        answer: impl FnOnce(&State) -> Result<T, Status>,
    ) -> Result<Response<T>, Status> {
        let mut state = lock(&self.state);
        if state.stopped {
            return Err(Status::unavailable("the fake kubelet stopped"));
        }
        count(&mut state.calls);
        if state.failures_left > 0 {
            state.failures_left -= 1;
            let code = state.failure.unwrap_or(Code::Unknown);
            return Err(Status::new(code, "failure injected by the fake kubelet"));
        }
        answer(&state).map(Response::new)
    }
}

#[tonic::async_trait]
impl PodResourcesLister for Lister {
    async fn list(
        &self,
        _request: Request<proto::ListPodResourcesRequest>,
    ) -> Result<Response<proto::ListPodResourcesResponse>, Status> {
        self.answer(
            |c| c.list += 1,
            |s| Ok(proto::ListPodResourcesResponse { pod_resources: s.pods.iter().map(pod_resources).collect() }),
        )
    }

    async fn get_allocatable_resources(
        &self,
        _request: Request<proto::AllocatableResourcesRequest>,
    ) -> Result<Response<proto::AllocatableResourcesResponse>, Status> {
        self.answer(
            |c| c.allocatable += 1,
            |s| {
                let devices = s.allocatable.iter().map(container_devices).collect();
                Ok(proto::AllocatableResourcesResponse { devices, cpu_ids: vec![], memory: vec![] })
            },
        )
    }

    async fn get(
        &self,
        request: Request<proto::GetPodResourcesRequest>,
    ) -> Result<Response<proto::GetPodResourcesResponse>, Status> {
        let asked = request.into_inner();
        self.answer(
            |c| c.get += 1,
            |s| {
                let pod = s.pods.iter().find(|p| p.namespace == asked.pod_namespace && p.name == asked.pod_name);
                let pod = pod.ok_or_else(|| not_found(&asked))?;
                Ok(proto::GetPodResourcesResponse { pod_resources: Some(pod_resources(pod)) })
            },
        )
    }
}

/// What kubelet answers for a pod it does not run: a plain Go error, which gRPC sends as
/// code Unknown, with kubelet's message.
fn not_found(asked: &proto::GetPodResourcesRequest) -> Status {
    Status::unknown(format!("pod {} in namespace {} not found", asked.pod_name, asked.pod_namespace))
}

/// A pod as kubelet lists it.
fn pod_resources(pod: &PodDevices) -> proto::PodResources {
    proto::PodResources {
        name: pod.name.clone(),
        namespace: pod.namespace.clone(),
        containers: pod.containers.iter().map(container_resources).collect(),
        cpu_ids: vec![],
        memory: vec![],
    }
}

/// A container as kubelet lists it: devices only, no CPUs, memory or DRA claims.
fn container_resources(container: &ContainerDevices) -> proto::ContainerResources {
    proto::ContainerResources {
        name: container.name.clone(),
        devices: container.devices.iter().map(container_devices).collect(),
        cpu_ids: vec![],
        memory: vec![],
        dynamic_resources: vec![],
    }
}

/// One resource's devices, without topology.
fn container_devices(devices: &ResourceDevices) -> proto::ContainerDevices {
    proto::ContainerDevices { resource_name: devices.resource.clone(), device_ids: devices.ids.clone(), topology: None }
}

//! What every reconciler shares: the client, the event recorder, metrics, configuration, and
//! the one error type of the shell.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use super::metrics::Metrics;

/// How admission places gangs among nodes that fit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum PlacementStrategy {
    /// Fill the fullest nodes first, keeping big holes for big gangs.
    #[default]
    BinPack,
    /// Spread pods over the emptiest nodes.
    Spread,
}

/// Settings of the controller manager (from the command line).
#[derive(Clone, Debug)]
pub struct Config {
    /// A committed pod not bound within this time fails its gang.
    pub bind_timeout: Duration,
    /// GPUs hotter than this (Celsius) are not offered.
    pub gpu_max_temperature: f64,
    /// GPUs with less free memory than this fraction are not offered.
    pub gpu_min_free_memory: f64,
    /// Prometheus with DCGM exporter series, for GPU health.
    pub prometheus_url: Option<String>,
    /// How long GPU metrics are cached.
    pub gpu_metrics_ttl: Duration,
    /// Placement scoring.
    pub placement: PlacementStrategy,
    /// Multi-GPU pods must stay within one NUMA node.
    pub require_single_numa: bool,
    /// This replica's name (pod name), for events and the Lease.
    pub identity: String,
    /// muster's own namespace (Lease, Secret).
    pub namespace: String,
    /// DeviceClass of the GPUs a MusterJob with `spec.gpuClaims` claims when it names none.
    pub dra_gpu_device_class: String,
    /// The scheduling API new MusterJobs are compiled to (`--scheduling-api`, resolved at
    /// start against what the API server serves).
    pub scheduling_api: crate::workloadbuilder::native::SchedulingApi,
    /// Whether the API server serves the native `scheduling.k8s.io/v1beta1` Workload and
    /// PodGroup (a job recorded as `upstream` needs them).
    pub native_scheduling_served: bool,
    /// The API server serves `resource.k8s.io/v1` (DRA, 1.34+): without it a job using DRA
    /// claims is `Invalid` (reason `DRANotServed`), naming the fields.
    pub dra_served: bool,
    /// Whether the API server serves the native `scheduling.k8s.io/v1alpha3`
    /// CompositePodGroup (a MusterJobSet with `spec.scheduling` in upstream mode needs it).
    pub native_composite_served: bool,
    /// What the API server keeps of a native PodGroup's gated fields (probed at start): a
    /// job using one it drops stays on muster's API.
    pub native_fields: crate::workloadbuilder::native::NativeFields,
    /// The most pods a MusterJob or MusterJobSet of this cluster may plan (`--max-job-pods`, at
    /// most [`crate::workloadbuilder::job::MAX_JOB_PODS`]): one over it is Invalid and makes
    /// nothing.
    pub max_job_pods: u32,
}

/// Default of [`Config::dra_gpu_device_class`]: the class of NVIDIA's DRA driver.
pub const DEFAULT_DRA_GPU_DEVICE_CLASS: &str = "gpu.nvidia.com";

impl Default for Config {
    fn default() -> Self {
        Self {
            bind_timeout: Duration::from_secs(60),
            gpu_max_temperature: 80.0,
            gpu_min_free_memory: 0.3,
            prometheus_url: None,
            gpu_metrics_ttl: Duration::from_secs(10),
            placement: PlacementStrategy::BinPack,
            require_single_numa: false,
            identity: "muster".into(),
            namespace: "muster-system".into(),
            dra_gpu_device_class: DEFAULT_DRA_GPU_DEVICE_CLASS.into(),
            scheduling_api: Default::default(),
            native_scheduling_served: false,
            dra_served: true,
            native_composite_served: false,
            native_fields: Default::default(),
            max_job_pods: crate::workloadbuilder::job::MAX_JOB_PODS,
        }
    }
}

/// Shared state of the reconcilers.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// The client evictions go through: it does not retry a 429 (a PodDisruptionBudget's
    /// refusal is an answer). The main client unless `muster run` made one.
    pub evictions: Client,
    /// Events (repeats folded into a series by kube-rs's recorder).
    events: Events,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Settings.
    pub config: Config,
    /// PriorityClasses, for a group's priority.
    pub priorities: Priorities,
    /// Set once RBAC refused an update of a status (see `lean_writes::replace_status`).
    pub status_updates_forbidden: std::sync::atomic::AtomicBool,
}

/// What identifies an event to kube-rs's recorder: the object, reason, action and type. The
/// recorder folds a repeat into the first event's series and keeps that event's note.
type EventKey = (String, String, String, String, bool);

/// The recorder, the last note published per event key, and the writers that send events: a
/// repeat whose note changed (a GPU problem that is another problem now) starts a fresh
/// recorder, so it is a new event with its own note instead of a count on the old one.
///
/// Events are sent by [`Events::WRITERS`] tasks of their own, as client-go's broadcaster sends
/// kube-controller-manager's and kube-scheduler's: whoever reports one goes on at once, and the
/// API server sees at most that many of muster's event writes at a time (each also takes a
/// background slot of `--kube-api-in-flight`). Each writer keeps a queue of [`Events::QUEUE`];
/// an event that finds its writer's queue full is dropped and counted
/// (`muster_events_dropped_total`), as client-go drops past its 1,000. The events of one object
/// go through one writer, in the order they were reported.
struct Events {
    client: Client,
    reporter: Reporter,
    state: std::sync::Mutex<(Recorder, HashMap<EventKey, String>)>,
    /// Started with the first event (spawning needs the runtime).
    writers: std::sync::OnceLock<Writers>,
    dropped: prometheus_client::metrics::counter::Counter,
}

/// The event writers' queues, and the writers (aborted with the context: a replica that stops
/// leading sends no more).
struct Writers {
    queues: Vec<tokio::sync::mpsc::Sender<Outgoing>>,
    _tasks: Vec<Detached<()>>,
}

/// What a writer is given.
enum Outgoing {
    /// An event to publish about an object, with the recorder that folds its repeats.
    Event(Box<(Recorder, Event, ObjectReference)>),
    /// Answered once everything queued before it is sent.
    Flush(tokio::sync::oneshot::Sender<()>),
}

impl Events {
    /// Keys remembered before starting over, which also drops the recorder's cache (it keeps
    /// every event it sent for 6 minutes to fold repeats into a series: at 10,000 keys, the GPU
    /// events of thousands of pods and nodes held tens of MiB; at 1,000, 3 MiB of a 5,000-node
    /// bench's heap). A burst of new gangs sends one event per key, which a series never folds;
    /// what repeats (a gang that stays unschedulable, a node's GPU problem) is folded while
    /// fewer than this many other keys come between.
    const LIMIT: usize = 256;
    /// Tasks that send events, each one at a time.
    const WRITERS: usize = 2;
    /// Events each writer keeps waiting at most.
    const QUEUE: usize = 512;

    fn new(client: Client, reporter: Reporter, dropped: prometheus_client::metrics::counter::Counter) -> Self {
        let recorder = Recorder::new(client.clone(), reporter.clone());
        Events {
            client,
            reporter,
            state: std::sync::Mutex::new((recorder, HashMap::new())),
            writers: std::sync::OnceLock::new(),
            dropped,
        }
    }

    /// The recorder to publish `note` under `key` with.
    fn recorder(&self, key: EventKey, note: &str) -> Recorder {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (recorder, notes) = &mut *state;
        let changed = notes.get(&key).is_some_and(|last| last != note);
        if changed || notes.len() >= Self::LIMIT {
            *recorder = Recorder::new(self.client.clone(), self.reporter.clone());
            if !changed {
                notes.clear();
            }
        }
        notes.insert(key, note.to_string());
        recorder.clone()
    }

    /// The writers, started on first use; `None` outside a tokio runtime.
    fn writers(&self) -> Option<&Writers> {
        if let Some(writers) = self.writers.get() {
            return Some(writers);
        }
        tokio::runtime::Handle::try_current().ok()?;
        Some(self.writers.get_or_init(|| {
            let (queues, tasks) = (0..Self::WRITERS)
                .map(|_| {
                    let (queue, mut receiver) = tokio::sync::mpsc::channel::<Outgoing>(Self::QUEUE);
                    let task = Detached::spawn(async move {
                        while let Some(outgoing) = receiver.recv().await {
                            match outgoing {
                                Outgoing::Event(event) => {
                                    let (recorder, event, object) = *event;
                                    if let Err(e) = recorder.publish(&event, &object).await {
                                        tracing::warn!(error = %e, reason = event.reason, "could not publish event");
                                    }
                                }
                                Outgoing::Flush(done) => {
                                    let _ = done.send(());
                                }
                            }
                        }
                    });
                    (queue, task)
                })
                .unzip();
            Writers { queues, _tasks: tasks }
        }))
    }

    /// The event to publish, and the recorder to publish it with (the note cut to 1,000 bytes).
    fn prepare(
        &self,
        object: &ObjectReference,
        warning: bool,
        reason: &str,
        action: &str,
        mut note: String,
    ) -> (Recorder, Event) {
        if note.len() > 1000 {
            let mut cut = 997;
            while !note.is_char_boundary(cut) {
                cut -= 1;
            }
            note.truncate(cut);
            note.push_str("...");
        }
        let key = (
            object.kind.clone().unwrap_or_default(),
            object.namespace.clone().unwrap_or_default(),
            object.name.clone().unwrap_or_default(),
            format!("{reason}/{action}"),
            warning,
        );
        let recorder = self.recorder(key, &note);
        let event = Event {
            type_: if warning { EventType::Warning } else { EventType::Normal },
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        (recorder, event)
    }

    /// The queue of the writer of `object`'s events.
    fn queue(&self, object: &ObjectReference) -> Option<&tokio::sync::mpsc::Sender<Outgoing>> {
        use std::hash::{Hash, Hasher};
        let writers = self.writers()?;
        let mut hasher = std::hash::DefaultHasher::new();
        (&object.namespace, &object.name).hash(&mut hasher);
        // The remainder is below WRITERS, so it fits a usize.
        let at = usize::try_from(hasher.finish() % Self::WRITERS as u64).unwrap_or(0);
        writers.queues.get(at)
    }

    /// Queues `event` about `object` on the writer of that object; dropped and counted when
    /// its queue is full (or there is no runtime to send it from).
    fn send(&self, recorder: Recorder, event: Event, object: &ObjectReference) {
        let reason = event.reason.clone();
        let queued = self
            .queue(object)
            .is_some_and(|q| q.try_send(Outgoing::Event(Box::new((recorder, event, object.clone())))).is_ok());
        if !queued {
            // The first drop and every thousandth are logged as warnings, the rest at debug.
            let before = self.dropped.inc();
            if before.is_multiple_of(1000) {
                tracing::warn!(reason, object = ?object.name, dropped = before + 1, "event dropped: its writer's queue is full");
            } else {
                tracing::debug!(reason, object = ?object.name, "event dropped: its writer's queue is full");
            }
        }
    }

    /// Queues `event` about `object`, waiting for room in its writer's queue.
    async fn send_waiting(&self, recorder: Recorder, event: Event, object: &ObjectReference) {
        let Some(queue) = self.queue(object) else {
            self.dropped.inc();
            return;
        };
        // Fails only when the writer is gone (the context is being dropped).
        let _ = queue.send(Outgoing::Event(Box::new((recorder, event, object.clone())))).await;
    }

    /// Waits until every event queued before the call has been sent (or failed).
    async fn sent(&self) {
        let Some(writers) = self.writers.get() else { return };
        for queue in &writers.queues {
            let (done, answer) = tokio::sync::oneshot::channel();
            if queue.send(Outgoing::Flush(done)).await.is_ok() {
                let _ = answer.await;
            }
        }
    }
}

impl Context {
    /// A context for `client`.
    pub fn new(client: Client, metrics: Arc<Metrics>, config: Config) -> Self {
        let reporter = Reporter { controller: "muster".into(), instance: Some(config.identity.clone()) };
        Self {
            events: Events::new(client.clone(), reporter, metrics.events_dropped.clone()),
            priorities: Priorities::default(),
            status_updates_forbidden: std::sync::atomic::AtomicBool::new(false),
            evictions: client.clone(),
            client,
            metrics,
            config,
        }
    }

    /// Reports an event about `object`: queued for a writer, so the caller goes on at once;
    /// dropped and counted when the writer's queue is full. Failures are logged, never fatal
    /// (see [`Events`]).
    pub fn event(&self, object: &ObjectReference, warning: bool, reason: &str, action: &str, note: impl Into<String>) {
        let (recorder, event) = self.events.prepare(object, warning, reason, action, note.into());
        self.events.send(recorder, event, object);
    }

    /// As [`Context::event`], but waits for room in the writer's queue instead of dropping: for
    /// a task of its own that reports many events at once (thousands of nodes appearing).
    pub async fn event_waiting(
        &self,
        object: &ObjectReference,
        warning: bool,
        reason: &str,
        action: &str,
        note: impl Into<String>,
    ) {
        let (recorder, event) = self.events.prepare(object, warning, reason, action, note.into());
        self.events.send_waiting(recorder, event, object).await;
    }

    /// Waits until every event reported before the call has been sent to the API server (or
    /// failed): for a graceful stop, and for tests.
    pub async fn events_sent(&self) {
        self.events.sent().await;
    }
}

/// Errors of the reconcilers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed a request.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The workloadbuilder could not build (a bug or a changed Workload).
    #[error("build: {0}")]
    Build(#[from] crate::workloadbuilder::BuildError),
    /// A compiled spec did not convert to the native scheduling API (a bug).
    #[error("native scheduling API: {0}")]
    Native(#[from] crate::workloadbuilder::native::NativeError),
    /// An object muster wants to own is owned by someone else.
    #[error("{0}")]
    Conflict(String),
    /// An object needed was not found (yet).
    #[error("{0}")]
    Missing(String),
    /// (De)serialization failed.
    #[error("serialization: {0}")]
    Serde(#[from] serde_json::Error),
    /// The API server gave no answer in time (the client's own retries included).
    #[error("no answer from the API server within {}s", .0.as_secs())]
    Timeout(std::time::Duration),
}

/// A task of its own whose outcome a later pass books. Aborted when dropped: a replica that
/// stops leading sends no more.
pub struct Detached<T>(tokio::task::JoinHandle<T>);

impl<T: Send + 'static> Detached<T> {
    /// Runs `future` on a task of its own.
    pub fn spawn(future: impl std::future::Future<Output = T> + Send + 'static) -> Self {
        Detached(tokio::spawn(future))
    }

    /// Whether it ended.
    pub fn is_finished(&self) -> bool {
        self.0.is_finished()
    }

    /// Its outcome (an error if it panicked or was aborted).
    pub async fn join(&mut self) -> std::result::Result<T, tokio::task::JoinError> {
        (&mut self.0).await
    }
}

impl<T> Drop for Detached<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Whether a reflector store has its first full list, for any number of tasks to await at
/// once. kube's `Store::wait_until_ready` wakes only the task that polled it last (one oneshot
/// receiver behind a mutex keeps one waker), so reconciles that wait on it together while the
/// first list is in flight can wait forever: every MusterJob of a new leader but one did,
/// and their lost pods were never replaced. One task waits on the store here and tells all.
#[derive(Clone, Debug)]
pub struct StoreReady(tokio::sync::watch::Receiver<bool>);

impl StoreReady {
    /// Starts the one task that waits for `store`.
    pub fn of<K>(store: kube::runtime::reflector::Store<K>) -> Self
    where
        K: kube::runtime::reflector::Lookup + Clone + Send + Sync + 'static,
        K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
    {
        let (tx, rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            if store.wait_until_ready().await.is_ok() {
                let _ = tx.send(true);
            }
        });
        StoreReady(rx)
    }

    /// Resolves once the store has listed everything; an error when its writer went first.
    pub async fn wait(&self) -> Result<()> {
        let mut rx = self.0.clone();
        match rx.wait_for(|ready| *ready).await {
            Ok(_) => Ok(()),
            Err(_) => Err(Error::Missing("the watch cache stopped before its first list".into())),
        }
    }
}

/// The PriorityClasses as a watch shows them, shared by the reconcilers, which resolve a
/// group's priority from them once, when the group is made: one LIST of the classes per
/// MusterJob created was a thousand LISTs for a thousand jobs, each queued behind the binds of
/// a busy API server. The watch starts on first use; a class the cache does not show, or a
/// cache without its first list yet (no RBAC to watch, say), is asked of the API server.
/// Admission of pods reads a watch cache too (upstream's Priority plugin), so a class made a
/// moment ago is missed the same way there.
#[derive(Default)]
pub struct Priorities(tokio::sync::OnceCell<(kube::runtime::reflector::Store<PriorityClass>, StoreReady)>);

/// How long a resolution waits for the PriorityClass watch's first list before asking the API
/// server.
const PRIORITIES_LIST_WAIT: Duration = Duration::from_secs(2);

impl Priorities {
    /// The cache, its watch started on the first call.
    async fn cache(&self, client: &Client) -> &(kube::runtime::reflector::Store<PriorityClass>, StoreReady) {
        self.0
            .get_or_init(|| async {
                use futures::StreamExt as _;
                use kube::runtime::{WatchStreamExt as _, reflector, watcher};
                let (store, writer) = reflector::store();
                let stream =
                    watcher::watcher(kube::Api::<PriorityClass>::all(client.clone()), watcher::Config::default())
                        .default_backoff()
                        .modify(|c: &mut PriorityClass| c.metadata.managed_fields = None)
                        .reflect(writer);
                tokio::spawn(async move {
                    let mut stream = std::pin::pin!(stream);
                    while let Some(ev) = stream.next().await {
                        if let Err(e) = ev {
                            tracing::warn!(error = %e, "PriorityClass watch");
                        }
                    }
                });
                let ready = StoreReady::of(store.clone());
                (store, ready)
            })
            .await
    }

    /// The value of PriorityClass `class`, or of the cluster's global default class when none
    /// is named, else 0 (as pod admission and upstream's PodGroup admission do).
    pub async fn resolve(&self, client: &Client, class: Option<&str>) -> Result<i32> {
        Ok(self.value_of(client, class).await?.unwrap_or(0))
    }

    /// [`Self::resolve`], telling a class that does not exist (`None`) from its value.
    pub async fn value_of(&self, client: &Client, class: Option<&str>) -> Result<Option<i32>> {
        let (store, ready) = self.cache(client).await;
        let listed = tokio::time::timeout(PRIORITIES_LIST_WAIT, ready.wait()).await.is_ok_and(|r| r.is_ok());
        let api = kube::Api::<PriorityClass>::all(client.clone());
        let value = match class {
            Some(name) => match store.get(&kube::runtime::reflector::ObjectRef::new(name)) {
                Some(c) if listed => c.value,
                _ => api.get_opt(name).await?.and_then(|c| c.value),
            },
            None if listed => Some(global_default(store.state().iter().map(|c| &**c)).unwrap_or(0)),
            None => Some(global_default(api.list(&kube::api::ListParams::default()).await?.items.iter()).unwrap_or(0)),
        };
        Ok(value)
    }
}

/// PURE: the value of the global default class among `classes` (the highest, should there be
/// several).
fn global_default<'a>(classes: impl Iterator<Item = &'a PriorityClass>) -> Option<i32> {
    classes.filter(|c| c.global_default == Some(true)).filter_map(|c| c.value).max()
}

/// How long one write of admission may take, the client's own retries of 429/503 included:
/// an API server that keeps failing one request costs the cycle this much, not minutes.
pub const WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs one request bounded by [`WRITE_TIMEOUT`].
pub async fn bounded<T>(request: impl std::future::Future<Output = kube::Result<T>>) -> Result<T> {
    match tokio::time::timeout(WRITE_TIMEOUT, request).await {
        Ok(result) => result.map_err(Error::Kube),
        Err(_) => Err(Error::Timeout(WRITE_TIMEOUT)),
    }
}

/// Runs `futures` with at most `limit` in flight, and returns their outputs in the order they
/// end. Taking the futures already made (not a closure that makes them) keeps the result
/// `Send` when they borrow (rust#102211).
pub async fn at_most<F: std::future::Future>(limit: usize, futures: Vec<F>) -> Vec<F::Output> {
    use futures::StreamExt as _;
    futures::stream::iter(futures).buffer_unordered(limit.max(1)).collect().await
}

impl Error {
    /// The object's namespace is being deleted: nothing more can be created there, and the
    /// object itself is about to go, so retrying is pointless. (Its pods go first: a job must
    /// still count and release them, see the job controller's sync.) The API server says so
    /// with a `NamespaceTerminating` cause, and in its message.
    pub fn namespace_terminating(&self) -> bool {
        let Error::Kube(kube::Error::Api(e)) = self else { return false };
        let cause = e.details.as_ref().is_some_and(|d| d.causes.iter().any(|c| c.reason == "NamespaceTerminating"));
        e.code == 403 && (cause || e.message.contains("because it is being terminated"))
    }

    /// What went wrong, finer than [`Error::metric_label`]: [`api_error_reason`] for the API
    /// server's answers.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Kube(e) => api_error_reason(e),
            other => other.metric_label(),
        }
    }

    /// Whether retrying the same request can succeed by itself (throttling, server errors,
    /// transport failures); a refusal (400, 403, 422) needs the object or the policy to change.
    pub fn transient(&self) -> bool {
        match self {
            Error::Kube(kube::Error::Api(e)) => e.code == 429 || e.code >= 500,
            Error::Kube(_) | Error::Timeout(_) => true,
            _ => false,
        }
    }

    /// A short label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(_)) => "api",
            Error::Kube(_) => "kube",
            Error::Build(_) | Error::Native(_) => "build",
            Error::Conflict(_) => "conflict",
            Error::Missing(_) => "missing",
            Error::Serde(_) => "serde",
            Error::Timeout(_) => "timeout",
        }
    }
}

/// The reason label of a failed request, for metrics: the API server's answer by class
/// (`forbidden` also covers a webhook or ValidatingAdmissionPolicy denial), or `transport`
/// when no answer came (timeouts, refused connections, TLS).
pub fn api_error_reason(e: &kube::Error) -> &'static str {
    match e {
        kube::Error::Api(s) => match s.code {
            400 => "bad_request",
            401 => "unauthorized",
            403 => "forbidden",
            404 => "not_found",
            409 => "conflict",
            413 => "too_large",
            422 => "invalid",
            429 => "too_many_requests",
            500..=599 => "server_error",
            _ => "api_other",
        },
        _ => "transport",
    }
}

/// The result of a reconcile step.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake API server that answers event writes only while its gate is open, and the reason
    /// of each event it was sent, in order; a context whose client talks to it.
    async fn held_api() -> (Context, Arc<tokio::sync::Semaphore>, Arc<std::sync::Mutex<Vec<String>>>) {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let reasons: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
        let (g, r) = (gate.clone(), reasons.clone());
        let app = axum::Router::new().fallback(move |method: axum::http::Method, body: String| {
            let (gate, reasons) = (g.clone(), r.clone());
            async move {
                let _pass = gate.acquire().await;
                let event: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
                let reason = event["reason"].as_str().unwrap_or_default().to_string();
                reasons.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(reason);
                let code = if method == axum::http::Method::POST { 201 } else { 200 };
                let json = [(axum::http::header::CONTENT_TYPE, "application/json")];
                (axum::http::StatusCode::from_u16(code).unwrap_or_default(), json, body)
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("bind: {e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("address: {e}"));
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let url = format!("http://{addr}").parse().unwrap_or_else(|e| panic!("url: {e}"));
        let client = Client::try_from(kube::Config::new(url)).unwrap_or_else(|e| panic!("client: {e}"));
        (Context::new(client, Arc::new(Metrics::default()), Config::default()), gate, reasons)
    }

    fn pod(name: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some("ns".into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn an_event_is_queued_without_waiting_and_one_objects_events_go_in_order() {
        let (ctx, gate, reasons) = held_api().await;
        // The API server answers nothing yet: each report returns at once all the same.
        for i in 0..6 {
            ctx.event(&pod("a"), false, &format!("Step{i}"), "Test", "a step");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(reasons.lock().unwrap_or_else(std::sync::PoisonError::into_inner).is_empty(), "nothing answered yet");
        gate.add_permits(1_000);
        ctx.events_sent().await;
        let sent = reasons.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        assert_eq!(sent, (0..6).map(|i| format!("Step{i}")).collect::<Vec<_>>());
        assert_eq!(ctx.metrics.events_dropped.get(), 0);
    }

    #[tokio::test]
    async fn past_a_full_queue_events_are_dropped_and_counted_unless_the_reporter_waits() {
        let (ctx, gate, reasons) = held_api().await;
        // One object's events share one writer; this test's runtime has one thread, so the
        // writer takes none from its queue before the test yields.
        let over = 7;
        for i in 0..Events::QUEUE + over {
            ctx.event(&pod("a"), false, &format!("Step{i}"), "Test", "a step");
        }
        assert_eq!(ctx.metrics.events_dropped.get(), u64::try_from(over).unwrap_or_default());

        // A reporter that waits for room drops none: it goes on as the queue drains.
        let (ctx, reporter) = (Arc::new(ctx), pod("b"));
        let waiting = {
            let ctx = ctx.clone();
            tokio::spawn(async move {
                for i in 0..Events::QUEUE + over {
                    ctx.event_waiting(&reporter, false, &format!("Wait{i}"), "Test", "a step").await;
                }
            })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiting.is_finished(), "the queue is full and nothing is answered yet");
        gate.add_permits(100_000);
        waiting.await.unwrap_or_else(|e| panic!("reporter: {e}"));
        ctx.events_sent().await;
        let sent = reasons.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let (steps, waits) = (
            sent.iter().filter(|r| r.starts_with("Step")).count(),
            sent.iter().filter(|r| r.starts_with("Wait")).count(),
        );
        assert_eq!((steps, waits), (Events::QUEUE, Events::QUEUE + over));
        assert_eq!(ctx.metrics.events_dropped.get(), u64::try_from(over).unwrap_or_default(), "no more dropped");
    }

    #[test]
    fn a_namespace_being_deleted_is_told_by_its_cause_or_its_message() {
        // As the API server answers: a Status, its cause in `details.causes[].reason`.
        let status = |code: u16, message: &str, cause: Option<&str>| {
            use kube::core::response::{StatusCause, StatusDetails};
            let mut s = kube::core::Status::failure(message, "Forbidden").with_code(code);
            if let Some(reason) = cause {
                let cause = StatusCause { reason: reason.into(), message: message.into(), field: String::new() };
                s = s.with_details(StatusDetails {
                    name: "ns".into(),
                    group: String::new(),
                    kind: "namespaces".into(),
                    uid: String::new(),
                    causes: vec![cause],
                    retry_after_seconds: 0,
                });
            }
            Error::Kube(kube::Error::Api(s.boxed()))
        };
        let told =
            "pods \"p\" is forbidden: unable to create new content in namespace ns because it is being terminated";
        assert!(status(403, told, Some("NamespaceTerminating")).namespace_terminating());
        assert!(status(403, told, None).namespace_terminating(), "an older API server's message alone");
        assert!(status(403, "forbidden", Some("NamespaceTerminating")).namespace_terminating(), "the cause alone");
        assert!(!status(403, "exceeded quota: q", None).namespace_terminating());
        assert!(!status(409, told, Some("NamespaceTerminating")).namespace_terminating(), "not a refusal");
        assert!(!Error::Missing("x".into()).namespace_terminating());
    }

    #[test]
    fn the_global_default_is_the_highest_class_marked_default() {
        let class = |name: &str, value: i32, default: Option<bool>| PriorityClass {
            metadata: kube::api::ObjectMeta { name: Some(name.into()), ..Default::default() },
            value: Some(value),
            global_default: default,
            ..Default::default()
        };
        let cases: [(&str, Vec<PriorityClass>, Option<i32>); 4] = [
            ("no classes", vec![], None),
            ("none marked", vec![class("a", 10, None), class("b", 20, Some(false))], None),
            ("one marked", vec![class("a", 10, Some(true)), class("b", 20, None)], Some(10)),
            ("two marked: the higher", vec![class("a", 10, Some(true)), class("b", 5, Some(true))], Some(10)),
        ];
        for (case, classes, want) in cases {
            assert_eq!(global_default(classes.iter()), want, "{case}");
        }
    }
    use futures::FutureExt;
    use futures::future::BoxFuture;
    use futures::task::{ArcWake, waker};
    use k8s_openapi::api::core::v1::Pod;
    use kube::runtime::{reflector, watcher};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::Context as TaskContext;

    const WAITERS: usize = 8;

    /// A waker that remembers being woken.
    #[derive(Default)]
    struct Flag(AtomicBool);

    impl ArcWake for Flag {
        fn wake_by_ref(arc_self: &Arc<Self>) {
            arc_self.0.store(true, Ordering::SeqCst);
        }
    }

    /// Polls each waiter once with a waker of its own (each waits, as a reconcile of its own
    /// would), then gives the writer its first list; returns the flags of their wakers.
    fn poll_then_list(
        waiters: &mut [BoxFuture<'static, bool>],
        writer: &mut reflector::store::Writer<Pod>,
    ) -> Vec<Arc<Flag>> {
        let flags: Vec<Arc<Flag>> = (0..waiters.len()).map(|_| Arc::new(Flag::default())).collect();
        for (w, flag) in waiters.iter_mut().zip(&flags) {
            let waker = waker(flag.clone());
            assert!(w.poll_unpin(&mut TaskContext::from_waker(&waker)).is_pending(), "nothing listed yet");
        }
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitDone);
        flags
    }

    fn woken(flags: &[Arc<Flag>]) -> usize {
        flags.iter().filter(|f| f.0.load(Ordering::SeqCst)).count()
    }

    /// Why [`StoreReady`] exists: kube's own wait wakes only the waiter that polled last. If this
    /// starts failing, kube fixed it and [`StoreReady`] can go.
    #[test]
    fn kube_wakes_one_of_many_store_waiters() {
        let (store, mut writer) = reflector::store::<Pod>();
        let mut waiters: Vec<BoxFuture<'static, bool>> = (0..WAITERS)
            .map(|_| {
                let s = store.clone();
                async move { s.wait_until_ready().await.is_ok() }.boxed()
            })
            .collect();
        let flags = poll_then_list(&mut waiters, &mut writer);
        assert_eq!(woken(&flags), 1, "kube's Store::wait_until_ready now wakes every waiter");
    }

    #[tokio::test]
    async fn store_ready_wakes_every_waiter_and_later_ones_at_once() {
        let (store, mut writer) = reflector::store::<Pod>();
        let ready = StoreReady::of(store);
        tokio::task::yield_now().await;
        let mut waiters: Vec<BoxFuture<'static, bool>> = (0..WAITERS)
            .map(|_| {
                let r = ready.clone();
                async move { r.wait().await.is_ok() }.boxed()
            })
            .collect();
        let flags = poll_then_list(&mut waiters, &mut writer);
        tokio::time::timeout(Duration::from_secs(10), async {
            while woken(&flags) < WAITERS {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("every waiter is woken");
        for w in &mut waiters {
            assert_eq!(w.now_or_never(), Some(true));
        }
        assert!(ready.wait().now_or_never().is_some_and(|r| r.is_ok()), "a later waiter does not wait");
    }

    #[tokio::test]
    async fn store_ready_fails_when_the_writer_goes_first() {
        let (store, writer) = reflector::store::<Pod>();
        let ready = StoreReady::of(store);
        drop(writer);
        let r = tokio::time::timeout(Duration::from_secs(10), ready.wait()).await.expect("resolves");
        assert!(matches!(r, Err(Error::Missing(_))), "{r:?}");
    }
}

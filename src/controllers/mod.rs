//! The imperative shell: one module per reconciler, each thin (read, call the pure core, apply
//! with server-side apply, record status and events), plus the manager that runs them on the
//! leader only and serves health and metrics on every replica.

pub mod admission;
/// Status conditions, kept the Kubernetes way (pure, in the core).
pub use muster_core::conditions;
pub mod context;
pub mod devices;
pub mod install;
pub mod job;
pub mod jobset;
pub mod lean_writes;
pub mod metrics;
pub mod own_writes;
pub mod owner;
pub mod secure_metrics;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use k8s_openapi::api::core::v1::{Service, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use tokio::sync::oneshot;

pub use context::{Config, Context, Error, PlacementStrategy};
use metrics::Metrics;

/// Name of the Lease the reconcilers' leader holds.
pub const LEASE_NAME: &str = "muster-controller-manager";

/// Owner references as the controllers write and read them (pure, in the core).
pub use muster_core::owners::{controller_ref, controller_uid};

/// Tells the owner of an object of kind `K` that does not decode why muster leaves it alone
/// (a Warning event `DecodeFailed` on it); the controllers skip such objects, so without this
/// nothing would say why it never gets a status.
pub fn report_undecodable<K: kube::Resource<DynamicType = ()>>(
    ctx: &Context,
    invalid: &kube::core::error_boundary::InvalidObject,
) {
    let kind = K::kind(&());
    tracing::warn!(kind = %kind, name = ?invalid.metadata.name, namespace = ?invalid.metadata.namespace, error = %invalid.error, "object does not decode; skipped");
    let reference = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some(K::api_version(&()).to_string()),
        kind: Some(kind.to_string()),
        name: invalid.metadata.name.clone(),
        namespace: invalid.metadata.namespace.clone(),
        uid: invalid.metadata.uid.clone(),
        ..Default::default()
    };
    let note = format!("muster cannot read this {kind} and leaves it alone: {}", invalid.error);
    ctx.event(&reference, true, "DecodeFailed", "Decode", note);
}

/// Server-side applies a headless Service `name` selecting pods with label `key=name`, owned by
/// `owner`, so pods get stable DNS names (`<hostname>.<name>`): only where no Service of that
/// name exists or `owner` controls it. A Service someone else made is never taken over (whoever
/// may create a job in a namespace must not rewrite its Services through muster): the
/// refusal's message is returned instead, for the caller to report.
pub async fn apply_headless_service(
    client: &Client,
    namespace: &str,
    name: &str,
    selector_key: &str,
    owner: OwnerReference,
    field_manager: &str,
) -> context::Result<Option<String>> {
    let api = Api::<Service>::namespaced(client.clone(), namespace);
    if let Some(existing) = api.get_opt(name).await?
        && controller_uid(&existing.metadata) != Some(owner.uid.as_str())
    {
        return Ok(Some(format!(
            "Service {name} exists and is not controlled by this {}: muster leaves it as it is, so the pods get no stable DNS names through it",
            owner.kind
        )));
    }
    let svc = Service {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            selector: Some(BTreeMap::from([(selector_key.to_string(), name.to_string())])),
            publish_not_ready_addresses: Some(true),
            ..Default::default()
        }),
        status: None,
    };
    // k8s-openapi's structs carry no apiVersion/kind; server-side apply needs them.
    let mut body = serde_json::to_value(&svc)?;
    body["apiVersion"] = "v1".into();
    body["kind"] = "Service".into();
    api.patch(name, &PatchParams::apply(field_manager).force(), &Patch::Apply(&body)).await?;
    Ok(None)
}

/// Annotation on the objects muster's job controllers apply (Workloads, PodGroups,
/// CompositePodGroups): a hash of what was applied last.
pub const APPLIED_HASH_ANNOTATION: &str = "batch.muster.dev/applied";

/// Server-side applies `desired` as `name`, unless `existing` carries it already: its
/// [`APPLIED_HASH_ANNOTATION`] is the hash of `desired` (nothing was added or removed since),
/// and every field `desired` sets holds that value (nobody changed one since). A job reconciles
/// on every change of its pods, and an apply that changes nothing still costs the API server
/// a write. Returns the object as it stands.
pub async fn apply_if_changed<K>(
    api: &Api<K>,
    name: &str,
    params: &PatchParams,
    desired: K,
    existing: Option<K>,
) -> context::Result<K>
where
    K: kube::Resource + serde::Serialize + serde::de::DeserializeOwned + Clone + std::fmt::Debug,
{
    let (desired, body, hash) = with_applied_hash(desired)?;
    if let Some(existing) = existing {
        let same = existing.meta().annotations.as_ref().and_then(|a| a.get(APPLIED_HASH_ANNOTATION)) == Some(&hash);
        if same && holds(&serde_json::to_value(&existing)?, &body) {
            return Ok(existing);
        }
    }
    Ok(api.patch(name, params, &Patch::Apply(&desired)).await?)
}

/// `desired` carrying its [`APPLIED_HASH_ANNOTATION`], with the body the hash was taken of
/// (`desired` before the annotation) and the hash.
fn with_applied_hash<K>(mut desired: K) -> context::Result<(K, serde_json::Value, String)>
where
    K: kube::Resource + serde::Serialize,
{
    use sha2::Digest as _;
    let body = serde_json::to_value(&desired)?;
    let hash = hex::encode(sha2::Sha256::digest(body.to_string().as_bytes()))[..16].to_string();
    desired
        .meta_mut()
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(APPLIED_HASH_ANNOTATION.into(), hash.clone());
    Ok((desired, body, hash))
}

/// What [`create_if_absent`] found.
#[derive(Debug)]
pub enum Made<K> {
    /// Created now: the API server's answer.
    Created(K),
    /// The name was taken: the object as the API server has it, whoever made it.
    Exists(K),
}

/// Creates `desired` (with its [`APPLIED_HASH_ANNOTATION`], as [`apply_if_changed`] would
/// apply it) for an object the cache does not show, or reads the one that holds its name. A
/// job's first pass makes its groups this way: one create, where reading first (to learn that
/// nothing is there) and then applying cost the API server two requests, the apply being
/// dearer. What it created is applied over later by `field_manager` like any object it applied.
pub async fn create_if_absent<K>(api: &Api<K>, name: &str, field_manager: &str, desired: K) -> context::Result<Made<K>>
where
    K: kube::Resource + serde::Serialize + serde::de::DeserializeOwned + Clone + std::fmt::Debug,
{
    let (desired, _, _) = with_applied_hash(desired)?;
    let params = kube::api::PostParams { field_manager: Some(field_manager.into()), ..Default::default() };
    match api.create(&params, &desired).await {
        Ok(created) => Ok(Made::Created(created)),
        Err(kube::Error::Api(e)) if e.code == 409 => match api.get_opt(name).await? {
            Some(existing) => Ok(Made::Exists(existing)),
            // Deleted between the create and the read: the next pass makes it.
            None => Err(context::Error::Missing(format!("{name}: created by another writer and deleted since"))),
        },
        Err(e) => Err(e.into()),
    }
}

/// PURE: whether `object` holds every value `wanted` sets: objects field by field, lists
/// element by element (the API server's defaults inside them are left alone), the rest equal.
pub fn holds(object: &serde_json::Value, wanted: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (object, wanted) {
        (Value::Object(o), Value::Object(w)) => {
            w.iter().all(|(k, v)| v.is_null() || o.get(k).is_some_and(|ov| holds(ov, v)))
        }
        (Value::Array(o), Value::Array(w)) => o.len() == w.len() && o.iter().zip(w).all(|(ov, wv)| holds(ov, wv)),
        _ => object == wanted,
    }
}

/// PURE: the same watch event with each object it carries read through `f` (a store that keeps
/// something else than the objects themselves: a slimmer copy, a record).
pub fn map_event<A, B>(ev: &kube::runtime::watcher::Event<A>, f: impl Fn(&A) -> B) -> kube::runtime::watcher::Event<B> {
    use kube::runtime::watcher::Event;
    match ev {
        Event::Apply(o) => Event::Apply(f(o)),
        Event::InitApply(o) => Event::InitApply(f(o)),
        Event::Delete(o) => Event::Delete(f(o)),
        Event::Init => Event::Init,
        Event::InitDone => Event::InitDone,
    }
}

/// The objects of `api` as a controller's trigger, each kept in `writer`'s store without its
/// managed fields (no reconciler reads them): `Controller::new` keeps them whole, and a
/// thousand MusterJobs held 12 MiB, most of it managed fields.
pub fn trimmed_objects<K>(
    api: Api<K>,
    writer: kube::runtime::reflector::store::Writer<K>,
) -> impl futures::Stream<Item = std::result::Result<K, kube::runtime::watcher::Error>> + Send + 'static
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    use kube::runtime::{WatchStreamExt as _, watcher};
    watcher::watcher(api, watcher::Config::default().any_semantic())
        .modify(|o: &mut K| o.meta_mut().managed_fields = None)
        .reflect(writer)
        .applied_objects()
}

/// Reconciles of one controller (MusterJob, MusterJobSet) in flight at once. kube-runtime runs
/// every object due at once by default: a thousand new MusterJobs meant a thousand reconciles,
/// each with several writes, all in flight in an API server that had to serve kube-scheduler's
/// binds and muster's own pins too (upstream's Job controller syncs 5 at a time).
pub const RECONCILE_CONCURRENCY: u16 = 64;

/// The reconcilers' error policy: no retry in a namespace being deleted; otherwise count the
/// error and try again in 5 s.
pub fn retry_after_error(controller: &str, err: &Error, ctx: &Context) -> kube::runtime::controller::Action {
    use kube::runtime::controller::Action;
    if err.namespace_terminating() {
        tracing::debug!(controller, error = %err, "namespace is being deleted; not retrying");
        return Action::await_change();
    }
    ctx.metrics.reconcile_error(controller, err.metric_label());
    tracing::warn!(controller, error = %err, "reconcile failed");
    Action::requeue(std::time::Duration::from_secs(5))
}

/// How the manager runs.
#[derive(Clone, Debug)]
pub struct ManagerOptions {
    /// Address of the health and metrics server.
    pub http_addr: SocketAddr,
    /// Run the reconcilers only while holding the Lease.
    pub leader_elect: bool,
    /// Serve the admission webhooks (on every replica).
    pub webhook: Option<crate::webhook::WebhookOptions>,
    /// Apply muster's CRDs before anything else (upgrades through Helm, which never upgrades
    /// `crds/`).
    pub install_crds: bool,
    /// `--scheduling-api` (`None`: auto).
    pub scheduling_api: Option<crate::workloadbuilder::native::SchedulingApi>,
    /// A client that does not retry a 429, for evictions (`None`: the main client).
    pub evictions: Option<NoRetryClient>,
    /// Serve `/metrics` over HTTPS to authorised scrapers only (then not on `http_addr`).
    pub secure_metrics: Option<secure_metrics::SecureMetrics>,
    /// The Lease's timings.
    pub lease: LeaseTimings,
}

/// How long the leader's Lease lasts and how early it is renewed (kube-lease-manager's
/// duration and grace).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTimings {
    /// Seconds a Lease not renewed stays held: a new leader takes over at most this long after
    /// the old one stopped renewing.
    pub duration: u64,
    /// Seconds before it expires that the holder renews it.
    pub grace: u64,
}

impl Default for LeaseTimings {
    fn default() -> Self {
        Self { duration: 15, grace: 5 }
    }
}

/// A client made with `default_retry` off (see [`ManagerOptions::evictions`]).
#[derive(Clone)]
pub struct NoRetryClient(pub Client);

impl std::fmt::Debug for NoRetryClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NoRetryClient")
    }
}

#[derive(Clone)]
struct HttpState {
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
    /// False until the webhook server serves a certificate (true when it is off).
    webhook_ready: Arc<AtomicBool>,
}

/// Serves /healthz, /readyz and, unless `metrics` is false (they are served over HTTPS
/// instead, see [`secure_metrics`]), /metrics.
async fn serve_http(listener: tokio::net::TcpListener, state: HttpState, metrics: bool) -> anyhow::Result<()> {
    let app = if metrics {
        axum::Router::new().route(
            "/metrics",
            get(|State(s): State<HttpState>| async move {
                ([("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")], s.metrics.encode())
            }),
        )
    } else {
        axum::Router::new().route(
            "/metrics",
            get(|| async {
                (StatusCode::NOT_FOUND, "/metrics is served over HTTPS (--metrics-secure-bind-address)\n")
            }),
        )
    };
    let app = app
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(s): State<HttpState>| async move {
                match (s.ready.load(Ordering::Relaxed), s.webhook_ready.load(Ordering::Relaxed)) {
                    (true, true) => (StatusCode::OK, "ok"),
                    (false, _) => (StatusCode::SERVICE_UNAVAILABLE, "not ready"),
                    (true, false) => (StatusCode::SERVICE_UNAVAILABLE, "webhook server not serving yet"),
                }
            }),
        )
        .with_state(state);
    if let Ok(addr) = listener.local_addr() {
        let what = if metrics { "/metrics, /healthz, /readyz" } else { "/healthz, /readyz" };
        tracing::info!(%addr, "serving {what}");
    }
    axum::serve(listener, app).await?;
    Ok(())
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// Runs every reconciler until `stop` fires.
async fn run_reconcilers(ctx: Arc<Context>, stop: oneshot::Receiver<()>) {
    let (job_stop, job_rx) = oneshot::channel::<()>();
    let (set_stop, set_rx) = oneshot::channel::<()>();
    let (admission_stop, admission_rx) = oneshot::channel::<()>();
    let stopper = tokio::spawn(async move {
        let _ = stop.await;
        let _ = job_stop.send(());
        let _ = set_stop.send(());
        let _ = admission_stop.send(());
    });
    tokio::join!(
        job::run(ctx.clone(), async move {
            let _ = job_rx.await;
        }),
        jobset::run(ctx.clone(), async move {
            let _ = set_rx.await;
        }),
        admission::run(ctx.clone(), async move {
            let _ = admission_rx.await;
        }),
    );
    stopper.abort();
}

/// What the API server keeps of a native PodGroup's gated fields: a server-side dry run
/// (nothing is stored) of a PodGroup setting each, read back. A failed probe keeps none, so a
/// job using one stays on muster's API, which honours it; what is dropped is logged.
async fn native_fields(client: &Client, namespace: &str) -> crate::workloadbuilder::native::NativeFields {
    use crate::workloadbuilder::native::{NativeFields, probe_pod_group};
    let api = Api::<k8s_openapi::api::scheduling::v1beta1::PodGroup>::namespaced(client.clone(), namespace);
    let params = kube::api::PostParams { dry_run: true, ..Default::default() };
    let fields = match api.create(&params, &probe_pod_group(namespace)).await {
        Ok(answer) => NativeFields::kept(&answer.spec),
        Err(e) => {
            tracing::warn!(error = %e, namespace, "cannot probe which native PodGroup fields the API server keeps (a dry-run create): jobs with a topology constraint or shared claims compile to muster's API");
            return NativeFields::default();
        }
    };
    let dropped = fields.missing();
    if dropped.is_empty() {
        tracing::info!("native PodGroups keep schedulingConstraints and resourceClaims");
    } else {
        tracing::info!(dropped = %dropped.join(", "), "the API server drops these native PodGroup fields: MusterJobs using them compile to muster's API");
    }
    fields
}

/// Runs the controller manager: health and metrics on this replica, reconcilers on the leader.
/// Returns after SIGTERM/Ctrl-C once the reconcilers have stopped.
pub async fn run(client: Client, mut config: Config, opts: ManagerOptions) -> anyhow::Result<()> {
    if opts.install_crds {
        install::install_crds(&client).await.context("installing muster's CRDs (--install-crds)")?;
    }
    let metrics = Arc::new(Metrics::default());
    let native = &["workloads", "podgroups"];
    config.native_scheduling_served =
        served(&client, "scheduling.k8s.io/v1beta1", native, "no upstream mode for MusterJobs").await;
    let dra = &["resourceclaims", "resourceclaimtemplates"];
    let unserved = "count-based GPUs only; MusterJobs asking for DRA claims (spec.gpuClaims, \
                    spec.scheduling.resourceClaims, pod resourceClaims) are Invalid, reason DRANotServed";
    config.dra_served = served(&client, "resource.k8s.io/v1", dra, unserved).await;
    config.native_composite_served = served(
        &client,
        "scheduling.k8s.io/v1alpha3",
        &["compositepodgroups"],
        "no upstream mode for MusterJobSets with spec.scheduling",
    )
    .await;
    if config.native_scheduling_served {
        config.native_fields = native_fields(&client, &config.namespace).await;
    }
    let (api, why) = crate::workloadbuilder::native::choose(opts.scheduling_api, config.native_scheduling_served);
    config.scheduling_api = api;
    tracing::info!(api = api.as_str(), why, "new MusterJobs compile to this scheduling API");
    if api == crate::workloadbuilder::native::SchedulingApi::Upstream && !config.native_composite_served {
        tracing::info!(
            "scheduling.k8s.io/v1alpha3 CompositePodGroup is not served (feature gate CompositePodGroup): new MusterJobSets with spec.scheduling compile to muster's API"
        );
    }
    let requested = opts.scheduling_api.map_or("auto", |a| a.as_str()).to_string();
    metrics.scheduling_api.get_or_create(&metrics::SchedulingApiLabels { api: api.as_str().into(), requested }).set(1);
    let ready = Arc::new(AtomicBool::new(false));
    let webhook_ready = Arc::new(AtomicBool::new(opts.webhook.is_none()));
    // Bound here, so a taken port stops muster at once instead of leaving it never ready.
    let listener =
        tokio::net::TcpListener::bind(opts.http_addr).await.with_context(|| format!("binding {}", opts.http_addr))?;
    let secure = match &opts.secure_metrics {
        Some(s) => Some(secure_metrics::bind(s, client.clone(), metrics.clone()).await?),
        None => None,
    };
    let state = HttpState { metrics: metrics.clone(), ready: ready.clone(), webhook_ready: webhook_ready.clone() };
    let http = tokio::spawn(async move {
        match secure {
            Some(secure) => tokio::try_join!(serve_http(listener, state, false), secure).map(|_| ()),
            None => serve_http(listener, state, true).await,
        }
    });
    let mut ctx = Context::new(client.clone(), metrics.clone(), config.clone());
    if let Some(NoRetryClient(evictions)) = opts.evictions.clone() {
        ctx.evictions = evictions;
    }
    let ctx = Arc::new(ctx);
    let mut shutdown = Box::pin(shutdown_signal());
    // A graceful stop talks to the API server (lease release, in-flight reconciles); when it is
    // unreachable that could hang, so a stop request ends the process after a grace period.
    tokio::spawn(async {
        shutdown_signal().await;
        tokio::time::sleep(std::time::Duration::from_secs(15)).await;
        tracing::error!("graceful shutdown took longer than 15s; exiting");
        std::process::exit(1);
    });
    let (webhook_stop, webhook_stop_rx) = oneshot::channel::<()>();
    let webhook = opts.webhook.clone().map(|w| {
        let client = client.clone();
        tokio::spawn(async move {
            let stop = async move {
                let _ = webhook_stop_rx.await;
            };
            if let Err(e) = crate::webhook::serve(client, w, metrics, webhook_ready, stop).await {
                // Webhooks fail closed for opted-in objects: without them this replica is
                // useless, so exit and let the restart policy (or the user) bring it back.
                tracing::error!(error = format!("{e:#}"), "webhook server stopped; exiting");
                std::process::exit(1);
            }
        })
    });
    let result = run_leader(client, config, opts, ctx.clone(), ready, http, &mut shutdown).await;
    // Events still queued go out, for a moment at most.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), ctx.events_sent()).await;
    let _ = webhook_stop.send(());
    if let Some(w) = webhook {
        let _ = w.await;
    }
    result
}

/// Records the scheduling API a MusterJob or MusterJobSet compiles to on it (annotation
/// `batch.muster.dev/scheduling-api`, merge patch), with a Normal `SchedulingAPI` event saying
/// why when it is not the one asked for.
pub(crate) async fn record_scheduling_api<K>(
    ctx: &context::Context,
    obj: &K,
    api: crate::workloadbuilder::native::SchedulingApi,
    why: Option<String>,
) -> context::Result<()>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    use kube::ResourceExt;
    let patch =
        serde_json::json!({"metadata": {"annotations": {crate::crds::SCHEDULING_API_ANNOTATION: api.as_str()}}});
    kube::Api::<K>::namespaced(ctx.client.clone(), &obj.namespace().unwrap_or_default())
        .patch(&obj.name_any(), &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
        .await?;
    if let Some(why) = why {
        ctx.event(&obj.object_ref(&()), false, "SchedulingAPI", "Compile", why);
    }
    Ok(())
}

/// Whether the API server serves every one of `resources` in `group_version`; when it does
/// not, `unserved` says what muster leaves out (logged once). An older API server then gets no
/// watch of a kind it lacks (the native `scheduling.k8s.io/v1beta1` Workload and PodGroup:
/// 1.37+, gate `GenericWorkload`; DRA's `resource.k8s.io/v1`: 1.34+).
pub(crate) async fn served(client: &Client, group_version: &str, resources: &[&str], unserved: &str) -> bool {
    match client.list_api_group_resources(group_version).await {
        Ok(list) => resources.iter().all(|r| list.resources.iter().any(|s| s.name == *r)),
        Err(e) => {
            tracing::info!(error = %e, "{group_version} is not served: {unserved}");
            false
        }
    }
}

async fn run_leader(
    client: Client,
    config: Config,
    opts: ManagerOptions,
    ctx: Arc<Context>,
    ready: Arc<AtomicBool>,
    http: tokio::task::JoinHandle<anyhow::Result<()>>,
    shutdown: &mut std::pin::Pin<Box<impl std::future::Future<Output = ()>>>,
) -> anyhow::Result<()> {
    if !opts.leader_elect {
        ready.store(true, Ordering::Relaxed);
        let (stop, stop_rx) = oneshot::channel();
        let reconcilers = tokio::spawn(run_reconcilers(ctx, stop_rx));
        tokio::select! {
            _ = &mut *shutdown => {}
            r = http => return Err(anyhow::anyhow!("http server stopped: {r:?}")),
        }
        let _ = stop.send(());
        let _ = reconcilers.await;
        return Ok(());
    }

    if let Some(owner) = owner::install_owner() {
        owner::own_lease(&client, &config.namespace, LEASE_NAME, owner).await;
    }
    let manager = kube_lease_manager::LeaseManagerBuilder::new(client, LEASE_NAME)
        .with_namespace(config.namespace.clone())
        .with_identity(config.identity.clone())
        .with_duration(opts.lease.duration)
        .with_grace(opts.lease.grace)
        .build()
        .await
        .context("creating the lease manager")?;
    let (mut leader, lease_task) = manager.watch().await;
    ready.store(true, Ordering::Relaxed);
    tracing::info!(lease = LEASE_NAME, namespace = %config.namespace, identity = %config.identity, "waiting for leadership");
    loop {
        tokio::select! {
            _ = &mut *shutdown => break,
            changed = leader.wait_for(|l| *l) => {
                if changed.is_err() {
                    anyhow::bail!("the lease manager stopped");
                }
            }
        }
        tracing::info!("became leader: starting reconcilers");
        let (stop, stop_rx) = oneshot::channel();
        let mut reconcilers = tokio::spawn(run_reconcilers(ctx.clone(), stop_rx));
        let quit = tokio::select! {
            _ = &mut *shutdown => true,
            _ = leader.wait_for(|l| !*l) => false,
            _ = &mut reconcilers => false,
        };
        let _ = stop.send(());
        let _ = reconcilers.await;
        if quit {
            break;
        }
        tracing::warn!("lost leadership: reconcilers stopped");
    }
    drop(leader);
    match lease_task.await {
        Ok(Ok(manager)) => {
            if let Err(e) = manager.release().await {
                tracing::warn!(error = %e, "could not release the lease");
            }
        }
        other => tracing::warn!(?other, "lease manager ended"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::holds;
    use serde_json::json;

    #[test]
    fn holds_what_was_applied_with_the_servers_defaults_beside_it() {
        let wanted = json!({"spec": {"minCount": 3, "pods": [{"name": "a"}], "gone": null}, "status": null});
        // Defaults the server added, in an object and inside a list element.
        let stored = json!({"spec": {"minCount": 3, "extra": 1, "pods": [{"name": "a", "port": 80}]}, "status": {}});
        assert!(holds(&stored, &wanted));
        for changed in [
            json!({"spec": {"minCount": 2, "pods": [{"name": "a"}]}}),
            json!({"spec": {"minCount": 3, "pods": [{"name": "b"}]}}),
            json!({"spec": {"minCount": 3, "pods": [{"name": "a"}, {"name": "b"}]}}),
            json!({"spec": {"pods": [{"name": "a"}]}}),
        ] {
            assert!(!holds(&changed, &wanted), "{changed}");
        }
    }
}

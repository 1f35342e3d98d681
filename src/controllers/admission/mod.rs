//! The admission reconciler, the paired half of kube-scheduler: on the leader only, one root at
//! a time in priority then age order, against an in-memory ledger of bound and admitted pods.
//! Quorum, placement and the commit protocol's decisions are the scheduler core's; this module
//! reads the world and carries the decisions out, one concern per file. Each file calls only the
//! files below it, never one beside or above it:
//! - `cycle` (the top): one cycle: read the caches, build the snapshot, follow plans, decide
//!   per root, and hand each decision to the one below that carries it out;
//! - `commit`: the crash-safe commit protocol (plan recorded, then each pod pinned, given its
//!   GPU indices and ungated in one patch), the bind watch and the rollback of failed attempts;
//! - `preemption`: evictions of a preemptor's victims and the nominations while they go;
//! - `status`: writes the group statuses the core decides (`scheduler::status`);
//! - `claims`: ResourceClaim allocations and their release (commit's, for DRA gangs);
//! - `nominations`: the nominated node of pods (preemption's and commit's one shared write);
//! - `report` (the bottom): Events on a root and its owner, and an error met on a root;
//! - `watches` and `trim`: the trimmed watch caches and what wakes a cycle.
//!
//! This file holds what they share: the admitter's state, the writer of commits, the root key,
//! what a fenced write came to (`Patched`), and the loop that runs cycles.

mod claims;
mod commit;
mod cycle;
mod nominations;
mod preemption;
mod report;
mod status;
pub mod trim;
mod watches;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::Future;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;
use kube::runtime::reflector::Store;

use super::context::{Context, Detached, Error, Result};
use super::devices::DeviceReconciler;
use super::devices::prometheus::PrometheusSource;
use crate::crds::POD_GROUP_LABEL;
use crate::crds::blocks::DisruptionModeKind;
use crate::crds::scheduling::{AdmissionPlan, CompositePodGroup, PlanState, PlannedPod, PodGroup};
use crate::devices::chooser::FitCache;
use crate::devices::models::GpuModels;
use crate::devices::{HealthThresholds, MetricsCache};
use crate::scheduler::status::{Outcome, SentStatus, StatusPacing};
use crate::scheduler::{Group, PatchRefused, Quiet};

/// Name of this controller in metrics and logs.
pub const CONTROLLER: &str = "admission";
/// Server-side apply field manager for group status.
pub const FIELD_MANAGER: &str = "muster-admission";
/// Test hook: exit the process after this many commit writes, pod patches and claim
/// allocations counted alike (crash-safety tests).
pub const FAULT_EXIT_ENV: &str = "MUSTER_FAULT_EXIT_AFTER_POD_PATCHES";
const MIN_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// The longest admission sleeps with no event and no timer: a cycle then runs anyway.
const IDLE_WAKE: Duration = Duration::from_secs(30);
/// The least time between the end of one cycle and the start of the next: a burst of events
/// (a job creating its pods) settles into one cycle.
const MIN_PAUSE: Duration = Duration::from_millis(50);
/// The most: however long a cycle took, the next waits no longer than this after it.
const MAX_PAUSE: Duration = Duration::from_millis(500);
/// The pause after a cycle, as a multiple of the cycle's own (wall) time: while gangs keep
/// coming, admission takes at most a thirteenth of a core. Under a burst admission runs back to
/// back, so this, not a cycle's cost, sets its CPU: with a pause of three cycles a cheaper cycle
/// only meant more cycles (a 5,000-node burst: 370 cycles of about 50 ms, a quarter of a core),
/// CPU the saturated API server was short of. Twelve rather than six halved the cycles of a
/// 5,000-node burst and cut muster's CPU by about a quarter, gangs admitted a little later at
/// the median and no later at the p99; 24 saved little more (docs/src/benchmarks.md, "The A/B
/// that chose twelve").
const PAUSE_PER_CYCLE: u32 = 12;
/// The pause after a cycle that found nothing to decide (no root waiting, being admitted or
/// followed), as long as only other workloads' pods move ([`watches::Wake::Usage`]): kube-
/// scheduler binding pods muster does not gate (upstream mode, plain Jobs) asks for no
/// decision, only for their usage and GPU indices to be booked; each cycle still builds a
/// snapshot of every node (on a 5,000-node cluster holding only those pods, 1,302 cycles in a
/// run of upstream mode that admitted nothing). Any event of muster's own, and any timer, ends
/// it sooner.
const CALM_PAUSE: Duration = MAX_PAUSE;

/// PURE: how long admission pauses after a cycle that took `cycle` before it runs the next:
/// [`PAUSE_PER_CYCLE`] times as long, from [`MIN_PAUSE`] to [`MAX_PAUSE`]. Most of a cycle's
/// cost is fixed (a snapshot of every node, the forest of every group), so on a busy cluster
/// (5,000 nodes: cycles of tens of milliseconds, more when the API server saturates the
/// machine) fewer, larger cycles decide as much for less CPU, leaving the rest of it to the
/// API server; a small or idle cluster's short cycles keep the 50 ms pause.
fn pause_after(cycle: Duration) -> Duration {
    cycle.saturating_mul(PAUSE_PER_CYCLE).clamp(MIN_PAUSE, MAX_PAUSE)
}

/// A group's identity: its kind too, so a PodGroup and a CompositePodGroup of the same name
/// never share backoff, plan tracking or status.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct RootKey {
    /// True for a CompositePodGroup.
    pub composite: bool,
    /// Namespace.
    pub ns: String,
    /// Name.
    pub name: String,
}

impl RootKey {
    /// A PodGroup's key.
    pub fn leaf(ns: &str, name: &str) -> Self {
        Self { composite: false, ns: ns.to_string(), name: name.to_string() }
    }

    /// A CompositePodGroup's key.
    pub fn composite(ns: &str, name: &str) -> Self {
        Self { composite: true, ns: ns.to_string(), name: name.to_string() }
    }

    /// The key of a group of the scheduler's forest.
    pub fn of(ns: &str, group: &Group) -> Self {
        match group {
            Group::Leaf(l) => Self::leaf(ns, &l.name),
            Group::Composite(c) => Self::composite(ns, &c.name),
        }
    }
}

impl std::fmt::Display for RootKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.composite { "CompositePodGroup" } else { "PodGroup" };
        write!(f, "{kind} {}/{}", self.ns, self.name)
    }
}

/// What a pod (or claim) patch came to.
pub(super) enum Patched {
    Ok,
    /// Deleted meanwhile, or changed since the cache showed it (409 on its resourceVersion).
    Stale,
    Refused(String),
}

/// Reads what a patch's refusal means: a stale object (404, 409) is decided again, a server
/// or transport failure is retried with a backoff, anything else is a refusal.
pub(super) fn patched(result: Result<()>) -> Result<Patched> {
    match result {
        Ok(()) => Ok(Patched::Ok),
        Err(Error::Kube(kube::Error::Api(e))) if e.code == 404 || e.code == 409 => Ok(Patched::Stale),
        Err(e) => {
            if e.transient() {
                return Err(e);
            }
            let message = match &e {
                Error::Kube(kube::Error::Api(a)) => a.message.clone(),
                other => other.to_string(),
            };
            Ok(Patched::Refused(message))
        }
    }
}

/// A plan to clear: the root, the resourceVersion the clear is fenced by, and the status
/// folded into the same patch (`scheduler::status::fold_body`) when it changed too, and the root
/// as cached (a clear fenced by that version replaces the status, see [`commit::Cached`]).
type PlanClear = (RootKey, Option<String>, Option<serde_json::Value>, Option<commit::Cached>);

/// What admission remembers of a root between cycles (never needed for correctness: the
/// cluster holds the truth; this only paces retries and explains).
#[derive(Default)]
struct RootMemory {
    /// Since when a started gang of mode `all` is below its minCount (see `DISRUPTION_SETTLE`).
    disrupted_since: Option<Instant>,
    failures: u32,
    next_attempt: Option<Instant>,
    capacity_seen: u64,
    outcome: Option<Outcome>,
    last_event: Option<String>,
    /// Errors in a row met on this root (API errors, refusals): each doubles its backoff.
    errors: u32,
    /// Not before then after an error: the other roots go on meanwhile.
    error_until: Option<Instant>,
    /// The last error, for the group's `AdmissionError` condition (`None` once an attempt
    /// goes through).
    error: Option<String>,
    /// A pod patch of the plan (by id) the API server refused: the attempt is rolled back.
    refused: Option<(String, PatchRefused)>,
    /// A preemption for this root under way: its victims terminate.
    nomination: Option<preemption::Nomination>,
    /// Nodes this root holds back from roots of lower priority while it waits (its
    /// nomination, or its reservation).
    reserved: Option<std::collections::BTreeSet<String>>,
}

/// The wait after `errors` errors in a row on one object: 1 s doubled per error, at most 60 s.
fn error_backoff(errors: u32) -> Duration {
    MIN_BACKOFF.saturating_mul(1 << errors.saturating_sub(1).min(6)).min(MAX_BACKOFF)
}

/// The caches admission decides on.
#[derive(Clone)]
struct Caches {
    /// Nodes and pod usage, kept up to date by the node and pod watches.
    cluster: Arc<std::sync::Mutex<crate::scheduler::ClusterState>>,
    pod_groups: Store<PodGroup>,
    composites: Store<CompositePodGroup>,
    /// muster's pods (every pod is read into `cluster`).
    pods: Store<Pod>,
    /// Empty: the node watch's first list is awaited on it (every node is read into
    /// `cluster`).
    nodes: Store<Node>,
    namespaces: Store<Namespace>,
    claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    classes: Store<StorageClass>,
    /// DRA objects, when the cluster serves resource.k8s.io/v1.
    dra: Option<DraCaches>,
    /// The admission configurations that may refuse a pin.
    judges: watches::Judges,
}

/// What admission reads of DRA.
#[derive(Clone)]
struct DraCaches {
    slices: Store<k8s_openapi::api::resource::v1::ResourceSlice>,
    device_classes: Store<k8s_openapi::api::resource::v1::DeviceClass>,
    claims: Store<k8s_openapi::api::resource::v1::ResourceClaim>,
    templates: Store<k8s_openapi::api::resource::v1::ResourceClaimTemplate>,
    /// Bumped on every event of the four watches.
    changes: Arc<AtomicU64>,
    /// Bumped on every event of the slices' watch (what the GPU models read).
    slice_changes: Arc<AtomicU64>,
}

/// The DRA state of a cycle, kept while nothing it was built from changes.
struct DraState {
    changes: u64,
    uuid_index: HashMap<String, HashMap<String, usize>>,
    dra: Arc<crate::scheduler::Dra>,
}

struct Admitter {
    ctx: Arc<Context>,
    caches: Caches,
    /// Bumped on changes that can free capacity (node added/changed, pod finished/deleted).
    capacity: Arc<AtomicU64>,
    roots: HashMap<RootKey, RootMemory>,
    /// Victim groups a PodDisruptionBudget protected, left out of preemption until then.
    protected: HashMap<String, Instant>,
    /// What commits write with (the commits of a cycle go out concurrently).
    writer: Writer,
    devices: DeviceReconciler,
    metrics_source: Option<PrometheusSource>,
    gpu_metrics: MetricsCache,
    /// Unhealthy GPUs per node at the last cycle: a GPU cooling down frees capacity.
    unhealthy: BTreeMap<String, crate::devices::GpuSet>,
    /// Whether some node agent publishes GPU health (then it is polled like metrics).
    agent_health: bool,
    /// GPU choices by node kind and occupancy, kept across cycles.
    fits: Arc<FitCache>,
    /// Each node's GPU model, kept across cycles (built again when its inputs change).
    gpu_models: GpuModels,
    /// GPU problems per node last reported (topology annotation, metrics, health).
    gpu_problems: BTreeMap<String, Vec<crate::devices::GpuProblem>>,
    /// Groups whose last status write failed: errors in a row, not before, the last message.
    status_errors: HashMap<RootKey, (u32, Instant, String)>,
    /// What paces each group's next status write (see `scheduler::status::StatusPacing`).
    status_pacing: HashMap<RootKey, StatusPacing>,
    /// The status last sent per group with a write to make (see `scheduler::status::SentStatus`).
    status_sent: HashMap<RootKey, SentStatus>,
    /// PodGroups whose status, as last computed, is the one cached: a fingerprint of what it
    /// was computed from (see `scheduler::status::status_inputs`). While that stands the status is not
    /// computed again: with a thousand gangs, computing every status every cycle was a large
    /// part of a cycle.
    status_settled: HashMap<RootKey, u64>,
    /// The group status writes in flight, each with its outcome (see `apply_statuses`).
    status_batch: Option<Detached<Outcomes>>,
    /// The plan clears in flight.
    clears: Option<Clears>,
    /// The Node events (GPU problems found or cleared) being sent, in the background.
    node_events: Option<Detached<()>>,
    /// Groups in excluded namespaces already reported by an event.
    excluded_reported: HashSet<RootKey>,
    /// DRA problems (devices not offered) last logged.
    dra_problems: Vec<String>,
    /// The last cycle's DRA state.
    dra_cache: Option<DraState>,
    /// The whole GPUs each node's driver publishes, with the slice changes they were read at:
    /// read again only when a slice changed (1,000 slices took about 10 ms).
    published: Option<(u64, Arc<crate::devices::dra::Published>)>,
    /// What the last cycle saw, to skip a cycle that has nothing to do.
    quiet: Quiet,
    /// Commits in flight, each on a task of its own: they go on across cycles, and the first
    /// cycle after one ends books it.
    commits: tokio::task::JoinSet<(Arc<commit::CommitJob>, Result<commit::Committed>)>,
    /// The commits in flight by root, with the decision each carries out.
    in_flight: HashMap<RootKey, InFlight>,
    /// Commits that ended, with their decisions, not yet booked (a cycle that waits for the
    /// caches books them later).
    ended: Vec<(Arc<commit::CommitJob>, crate::scheduler::Decision, Result<commit::Committed>)>,
    /// Wakes a cycle (a commit that ends does).
    signal: Arc<watches::Signal>,
    /// The last cycle found nothing to decide: no root waiting, being admitted or followed.
    calm: bool,
}

/// Plans of roots whose pods all bound, being cleared on a task of their own (a cycle never
/// waits for them; its end wakes one).
struct Clears {
    /// Their roots: not followed again while the clear is in flight.
    keys: HashSet<RootKey>,
    task: Detached<Outcomes>,
}

/// The outcome of each write of a background batch, by root.
type Outcomes = Vec<(RootKey, Result<()>)>;

/// A commit in flight.
struct InFlight {
    job: Arc<commit::CommitJob>,
    decision: crate::scheduler::Decision,
    /// Its task (a task that panicked is known by it).
    task: tokio::task::Id,
}

/// The writes of the commit protocol, by commits in flight at once (cheap to clone: each
/// commit of a cycle runs as its own task with one).
#[derive(Clone)]
struct Writer {
    ctx: Arc<Context>,
    /// Writes not yet seen in the watch caches: a decision on a stale cache could plan a
    /// gang twice or drop a plan it just wrote, so cycles leave those roots alone until the
    /// caches catch up (see [`watches::Settling`]).
    unseen: Arc<std::sync::Mutex<Unseen>>,
    /// Commit writes so far (pod patches and claim allocations), for [`FAULT_EXIT_ENV`].
    writes: Arc<AtomicU64>,
    fault_exit_after: Option<u64>,
    /// Whether pins are dry-run first (some webhook or policy may refuse them).
    judges: watches::Judges,
}

impl Writer {
    /// The writes not yet seen (a poisoned lock is taken as is: its maps stay consistent).
    fn unseen(&self) -> std::sync::MutexGuard<'_, Unseen> {
        self.unseen.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Counts one commit write (a pod patch or a claim allocation) for the test hook that
    /// exits mid-commit ([`FAULT_EXIT_ENV`]).
    pub(super) fn count_write(&self) {
        let writes = self.writes.fetch_add(1, Ordering::SeqCst) + 1;
        if self.fault_exit_after.is_some_and(|n| writes >= n) {
            tracing::error!(patches = writes, "{FAULT_EXIT_ENV} reached: exiting now (test hook)");
            std::process::exit(3);
        }
    }
}

impl Admitter {
    /// When a GPU is too hot or too full to offer.
    pub(super) fn thresholds(&self) -> HealthThresholds {
        HealthThresholds {
            max_temperature_c: self.ctx.config.gpu_max_temperature,
            min_free_memory_fraction: self.ctx.config.gpu_min_free_memory,
            ..HealthThresholds::default()
        }
    }
}

/// Writes of this process that the watch caches have not shown yet.
#[derive(Default)]
struct Unseen {
    /// Root -> the plan (id and state) it was given, or `None` when it was cleared.
    plans: HashMap<RootKey, (Option<(String, PlanState)>, Instant)>,
    /// Pods ungated by a commit: UID -> its root and pin.
    ungated: HashMap<String, (RootKey, PlannedPod, Instant)>,
    /// Claims (namespace, name) a commit allocated (true) or freed (false).
    claims: HashMap<(String, String), (bool, Instant)>,
    /// Groups whose status this process wrote, the cache still showing the version before:
    /// (that version, the version the write made). A plan write on such a root is fenced by
    /// the version the write made (see `Unseen::fence`), not the cached one, which the API
    /// server would refuse as a conflict (a round trip and a cycle spent for nothing).
    statuses: HashMap<RootKey, (String, String, Instant)>,
    /// Groups whose status write is in flight, since when: their roots are neither followed
    /// nor decided until it ends (a plan write fenced by the version before it would be
    /// refused as a conflict).
    status_writes: HashMap<RootKey, Instant>,
    /// Roots with a commit in flight: a status write of theirs still waiting for its turn in
    /// a batch is not sent (it was computed before the decision, and would move the version
    /// the commit's plan writes are fenced by).
    committing: HashSet<RootKey>,
    /// Roots whose plan is being cleared: a status write of theirs still waiting for its turn
    /// in a batch is not sent (the clear's patch carries a newer status, which it would
    /// overwrite).
    clearing: HashSet<RootKey>,
}

/// Runs admission until `shutdown` resolves.
pub async fn run(ctx: Arc<Context>, shutdown: impl Future<Output = ()> + Send + 'static) {
    let client = ctx.client.clone();
    let notify = Arc::new(watches::Signal::default());
    let capacity = Arc::new(AtomicU64::new(0));
    let dra = watches::dra_served(&client).await;
    let mutating_policies = watches::mutating_policies_served(&client).await;
    let caches = watches::watch_caches(&client, &ctx, &notify, &capacity, dra, mutating_policies);
    let ready = watches::ready(&caches);
    let mut shutdown = std::pin::pin!(shutdown);
    tokio::select! {
        _ = ready => {}
        _ = &mut shutdown => return,
    }
    let fault_exit_after = std::env::var(FAULT_EXIT_ENV).ok().and_then(|v| v.parse().ok());
    let metrics_source = ctx.config.prometheus_url.as_deref().and_then(|url| match PrometheusSource::new(url) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, url, "GPU metrics source unusable; scheduling on topology alone");
            None
        }
    });
    let gpu_metrics = MetricsCache::new(ctx.config.gpu_metrics_ttl);
    let mut devices = DeviceReconciler::default();
    devices.on_batch_done(batch_done(notify.clone()));
    let writer = Writer {
        ctx: ctx.clone(),
        unseen: Arc::default(),
        writes: Arc::default(),
        fault_exit_after,
        judges: caches.judges.clone(),
    };
    let mut admitter = Admitter {
        ctx,
        caches,
        capacity,
        roots: HashMap::new(),
        protected: HashMap::new(),
        writer,
        devices,
        metrics_source,
        gpu_metrics,
        unhealthy: BTreeMap::new(),
        agent_health: false,
        fits: Arc::default(),
        gpu_models: GpuModels::default(),
        gpu_problems: BTreeMap::new(),
        status_errors: HashMap::new(),
        status_pacing: HashMap::new(),
        status_sent: HashMap::new(),
        status_settled: HashMap::new(),
        status_batch: None,
        clears: None,
        node_events: None,
        excluded_reported: HashSet::new(),
        dra_problems: Vec::new(),
        dra_cache: None,
        published: None,
        quiet: Quiet::default(),
        commits: tokio::task::JoinSet::new(),
        in_flight: HashMap::new(),
        ended: Vec::new(),
        signal: notify.clone(),
        calm: false,
    };
    tracing::info!("admission caches ready");
    loop {
        // Leadership lost (or a stop) ends the cycle at its next await: no decision is made,
        // nor write sent, after that (a commit cut short is resumed by the next leader).
        // Nothing changed since the last cycle and no timer of it is due: its conclusions stand.
        let (events, generation) = (notify.events(), watches::lock(&admitter.caches.cluster).generation());
        let work = notify.work();
        if admitter.quiet.nothing_to_do(events, generation, Instant::now()) {
            let sleep = admitter.quiet.wake().map_or(IDLE_WAKE, |w| w.saturating_duration_since(Instant::now()));
            admitter.ctx.metrics.idle_cycles.inc();
            tokio::select! {
                _ = notify.notify.notified() => {}
                _ = tokio::time::sleep(sleep) => {}
                _ = &mut shutdown => return,
            }
            continue;
        }
        let began = Instant::now();
        let result = tokio::select! {
            r = admitter.cycle() => r,
            _ = &mut shutdown => {
                tracing::info!("admission stopped mid-cycle");
                return;
            }
        };
        let wake = match result {
            Ok(wake) => {
                // A cycle runs at least every IDLE_WAKE, events or not.
                admitter.quiet.cycled(events, generation, Some(wake.unwrap_or_else(|| Instant::now() + IDLE_WAKE)));
                wake
            }
            Err(e) => {
                admitter.quiet = Quiet::default();
                admitter.calm = false;
                admitter.ctx.metrics.reconcile_error(CONTROLLER, e.metric_label());
                tracing::warn!(error = %e, "admission cycle failed");
                Some(Instant::now() + MIN_BACKOFF)
            }
        };
        // The next cycle starts `pause` after this one ended at the soonest, and at least
        // MIN_PAUSE after the event that wakes it.
        let ended = Instant::now();
        let pause = pause_after(ended - began);
        let sleep = wake.map(|w| w.saturating_duration_since(ended)).unwrap_or(IDLE_WAKE).max(pause);
        tokio::select! {
            _ = notify.notify.notified() => {
                // Nothing to decide, and only other workloads' pods moved: their usage is booked
                // at CALM_PAUSE after this cycle, or sooner on an event of muster's own or a timer.
                let calm_until = wake.map_or(ended + CALM_PAUSE, |w| w.min(ended + CALM_PAUSE));
                while admitter.calm && notify.work() == work && Instant::now() < calm_until {
                    tokio::select! {
                        _ = notify.notify.notified() => {}
                        _ = tokio::time::sleep_until(calm_until.into()) => {}
                        _ = &mut shutdown => return,
                    }
                }
                tokio::time::sleep_until((ended + pause).max(Instant::now() + MIN_PAUSE).into()).await;
            }
            _ = tokio::time::sleep(sleep) => {}
            _ = &mut shutdown => return,
        }
    }
}

/// What a batch of GPU-index writes that ended tells admission: the next cycle's device pass
/// books it, as usage news ([`watches::Signal::usage_changed`]), not work of muster's own. A
/// cycle with nothing to decide then still waits its [`CALM_PAUSE`]. The pods of such a batch
/// were bound by kube-scheduler (upstream mode, plain Jobs; muster's own pods get their GPUs in
/// the commit's patch), and hold their GPUs in the ledger whether their write is booked or not.
/// Told as work, each batch's end woke a cycle about 160 ms after the last, which sent the next
/// batch: upstream mode ran three times the cycles of a 5,000-node burst with nothing to decide,
/// for GPU indices about 0.4 s sooner at the median (docs/src/benchmarks.md, "Runs 63 to 69").
fn batch_done(signal: Arc<watches::Signal>) -> impl Fn() + Send + Sync + 'static {
    move || signal.usage_changed()
}

fn state<K>(store: &Store<K>) -> Vec<K>
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    store.state().iter().map(|o| (**o).clone()).collect()
}

fn group_pods(pods: &[Arc<Pod>]) -> HashMap<RootKey, Vec<&Pod>> {
    let mut out: HashMap<RootKey, Vec<&Pod>> = HashMap::new();
    for pod in pods.iter().map(|p| &**p) {
        if let Some(g) = pod.labels().get(POD_GROUP_LABEL) {
            out.entry(RootKey::leaf(&pod.namespace().unwrap_or_default(), g)).or_default().push(pod);
        }
    }
    out
}

use crate::pods::is_gated;

/// What one cycle read of the caches, as the commit protocol needs it.
struct World<'a> {
    /// Every pod, by UID.
    pods_by_uid: HashMap<&'a str, &'a Pod>,
    /// Every PodGroup, by namespace and name.
    pod_groups: HashMap<(&'a str, &'a str), &'a PodGroup>,
    /// The pods of each PodGroup (by the pod-group label).
    by_group: &'a HashMap<RootKey, Vec<&'a Pod>>,
    /// The names of the nodes that exist.
    nodes: HashSet<&'a str>,
}

/// A root group of either kind.
#[derive(Clone, Copy)]
enum GroupRef<'a> {
    Leaf(&'a Arc<PodGroup>),
    Composite(&'a Arc<CompositePodGroup>),
}

impl GroupRef<'_> {
    /// The group as cached, kept for a status write made after this cycle.
    fn cached(&self) -> commit::Cached {
        match self {
            GroupRef::Leaf(pg) => commit::Cached::Leaf(Arc::clone(pg)),
            GroupRef::Composite(c) => commit::Cached::Composite(Arc::clone(c)),
        }
    }

    /// The plan recorded on the group's status.
    fn plan(&self) -> Option<&AdmissionPlan> {
        match self {
            GroupRef::Leaf(pg) => pg.status.as_ref().and_then(|s| s.plan.as_ref()),
            GroupRef::Composite(c) => c.status.as_ref().and_then(|s| s.plan.as_ref()),
        }
    }

    fn key(&self) -> RootKey {
        match self {
            GroupRef::Leaf(pg) => RootKey::leaf(&pg.namespace().unwrap_or_default(), &pg.name_any()),
            GroupRef::Composite(c) => RootKey::composite(&c.namespace().unwrap_or_default(), &c.name_any()),
        }
    }

    /// The group's resourceVersion as cached: what a decision on it was made on.
    fn version(&self) -> Option<String> {
        match self {
            GroupRef::Leaf(pg) => pg.resource_version(),
            GroupRef::Composite(c) => c.resource_version(),
        }
    }

    /// The root's disruption mode (`single` unless `all` is set).
    fn disruption(&self) -> DisruptionModeKind {
        let mode = match self {
            GroupRef::Leaf(pg) => &pg.spec.disruption_mode,
            GroupRef::Composite(c) => &c.spec.disruption_mode,
        };
        mode.kind().unwrap_or(DisruptionModeKind::Single)
    }

    /// The root's `preemptionPolicy` (unset: `PreemptLowerPriority`, as upstream).
    fn preemption_policy(&self) -> Option<crate::crds::scheduling::PreemptionPolicy> {
        match self {
            GroupRef::Leaf(pg) => pg.spec.preemption_policy,
            GroupRef::Composite(c) => c.spec.preemption_policy,
        }
    }
}

fn visit<'a>(group: &'a Group, f: &mut impl FnMut(&'a Group)) {
    f(group);
    if let Group::Composite(c) = group {
        for child in &c.children {
            visit(child, f);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pause_after_a_cycle_grows_with_its_cost_within_bounds() {
        let ms = Duration::from_millis;
        for (cycle, pause) in [
            // An idle or small cluster: the burst pause alone.
            (ms(0), MIN_PAUSE),
            (ms(2), MIN_PAUSE),
            (ms(4), MIN_PAUSE),
            // A 5,000-node cycle: twelve times its cost.
            (ms(13), ms(156)),
            (ms(25), ms(300)),
            (ms(40), ms(480)),
            (ms(42), MAX_PAUSE),
            (ms(120), MAX_PAUSE),
            // Never longer than MAX_PAUSE, however long the cycle.
            (ms(400), MAX_PAUSE),
            (Duration::from_secs(3600), MAX_PAUSE),
            (Duration::MAX, MAX_PAUSE),
        ] {
            assert_eq!(pause_after(cycle), pause, "after a cycle of {cycle:?}");
        }
    }

    #[test]
    fn a_write_batch_that_ends_wakes_admission_without_ending_a_calm_pause() {
        let signal = Arc::new(watches::Signal::default());
        let done = batch_done(signal.clone());
        done();
        done();
        assert_eq!(signal.events(), 2, "each end wakes admission, so the batch is booked");
        assert_eq!(signal.work(), 0, "an end is no work of muster's own: a calm pause holds");
        signal.wake();
        assert_eq!((signal.events(), signal.work()), (3, 1), "a wake of muster's own ends it");
    }
}

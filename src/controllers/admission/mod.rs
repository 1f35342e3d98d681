//! The admission reconciler, the paired half of kube-scheduler: on the leader only, one root at
//! a time in priority then age order, against an in-memory ledger of bound and admitted pods.
//! Quorum, placement and the commit protocol's decisions are the scheduler core's; this module
//! reads the world and carries the decisions out, one concern per file:
//! - `watches`: the trimmed watch caches and what wakes a cycle;
//! - `cycle`: one cycle: read the caches, build the snapshot, follow plans, decide per root;
//! - `commit`: the crash-safe commit protocol (plan recorded, then each pod pinned, given its
//!   GPU indices and ungated in one patch), the bind watch and the rollback of failed attempts;
//! - `status`: group status and events.

mod commit;
mod cycle;
pub mod status;
pub mod trim;
mod watches;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use futures::Future;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;
use kube::runtime::reflector::Store;
use tokio::sync::Notify;

use super::context::Context;
use super::devices::DeviceReconciler;
use super::devices::prometheus::PrometheusSource;
use crate::crds::scheduling::{AdmissionPlan, CompositePodGroup, PlanState, PodGroup};
use crate::crds::{ADMISSION_GATE, POD_GROUP_LABEL};
use crate::devices::MetricsCache;
use crate::devices::chooser::FitCache;
use crate::scheduler::Group;
use status::Outcome;

/// Name of this controller in metrics and logs.
pub const CONTROLLER: &str = "admission";
/// Server-side apply field manager for group status.
pub const FIELD_MANAGER: &str = "muster-admission";
/// Test hook: exit the process after this many pod patches (crash-safety tests).
pub const FAULT_EXIT_ENV: &str = "MUSTER_FAULT_EXIT_AFTER_POD_PATCHES";
const MIN_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(60);

type RootKey = (String, String);

/// What admission remembers of a root between cycles (never needed for correctness: the
/// cluster holds the truth; this only paces retries and explains).
#[derive(Default)]
struct RootMemory {
    failures: u32,
    next_attempt: Option<Instant>,
    capacity_seen: u64,
    quorate_since: Option<Instant>,
    outcome: Option<Outcome>,
    last_event: Option<String>,
}

/// The caches admission decides on.
#[derive(Clone)]
struct Caches {
    pod_groups: Store<PodGroup>,
    composites: Store<CompositePodGroup>,
    pods: Store<Pod>,
    nodes: Store<Node>,
    namespaces: Store<Namespace>,
    claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    classes: Store<StorageClass>,
}

struct Admitter {
    ctx: Arc<Context>,
    caches: Caches,
    /// Bumped on changes that can free capacity (node added/changed, pod finished/deleted).
    capacity: Arc<AtomicU64>,
    roots: HashMap<RootKey, RootMemory>,
    patches: u64,
    fault_exit_after: Option<u64>,
    devices: DeviceReconciler,
    metrics_source: Option<PrometheusSource>,
    gpu_metrics: MetricsCache,
    /// Writes not yet seen in the watch caches: a decision on a stale cache could plan a
    /// gang twice or drop a plan it just wrote, so cycles wait until the caches catch up.
    unseen: Unseen,
    /// Unhealthy GPUs per node at the last cycle: a GPU cooling down frees capacity.
    unhealthy: BTreeMap<String, crate::devices::GpuSet>,
    /// GPU choices by node kind and occupancy, kept across cycles.
    fits: Arc<FitCache>,
    /// GPU problems per node last reported (topology annotation, metrics, health).
    gpu_problems: BTreeMap<String, Vec<crate::devices::GpuProblem>>,
}

/// Writes of this process that the watch caches have not shown yet.
#[derive(Default)]
struct Unseen {
    /// Root -> the plan (id and state) it was given, or `None` when it was cleared.
    plans: HashMap<RootKey, (Option<(String, PlanState)>, Instant)>,
    /// Pods ungated by a commit.
    ungated: HashMap<String, Instant>,
}

/// Runs admission until `shutdown` resolves.
pub async fn run(ctx: Arc<Context>, shutdown: impl Future<Output = ()> + Send + 'static) {
    let client = ctx.client.clone();
    let notify = Arc::new(Notify::new());
    let capacity = Arc::new(AtomicU64::new(0));
    let caches = watches::watch_caches(&client, &notify, &capacity);
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
    let mut admitter = Admitter {
        ctx,
        caches,
        capacity,
        roots: HashMap::new(),
        patches: 0,
        fault_exit_after,
        devices: DeviceReconciler::default(),
        metrics_source,
        gpu_metrics,
        unseen: Unseen::default(),
        unhealthy: BTreeMap::new(),
        fits: Arc::default(),
        gpu_problems: BTreeMap::new(),
    };
    tracing::info!("admission caches ready");
    loop {
        let wake = match admitter.cycle().await {
            Ok(wake) => wake,
            Err(e) => {
                admitter.ctx.metrics.reconcile_error(CONTROLLER, e.metric_label());
                tracing::warn!(error = %e, "admission cycle failed");
                Some(Instant::now() + MIN_BACKOFF)
            }
        };
        let sleep = wake.map(|w| w.saturating_duration_since(Instant::now())).unwrap_or(Duration::from_secs(30));
        tokio::select! {
            _ = notify.notified() => {
                // Let a burst of events (a job creating its pods) settle into one cycle.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            _ = tokio::time::sleep(sleep) => {}
            _ = &mut shutdown => return,
        }
    }
}

fn state<K>(store: &Store<K>) -> Vec<K>
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    store.state().iter().map(|o| (**o).clone()).collect()
}

fn key_of(ns: &str, name: &str) -> RootKey {
    (ns.to_string(), name.to_string())
}

fn group_pods(pods: &[Pod]) -> HashMap<RootKey, Vec<&Pod>> {
    let mut out: HashMap<RootKey, Vec<&Pod>> = HashMap::new();
    for pod in pods {
        if let Some(g) = pod.labels().get(POD_GROUP_LABEL) {
            out.entry(key_of(&pod.namespace().unwrap_or_default(), g)).or_default().push(pod);
        }
    }
    out
}

fn is_gated(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| g.iter().any(|g| g.name == ADMISSION_GATE))
}

fn bound(pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty())
}

fn finished(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

/// What one cycle read of the caches, as the commit protocol needs it.
struct World<'a> {
    /// Every pod, by UID.
    pods_by_uid: HashMap<&'a str, &'a Pod>,
    /// Every PodGroup.
    pod_groups: &'a [PodGroup],
    /// The names of the nodes that exist.
    nodes: HashSet<&'a str>,
}

/// A root group of either kind.
#[derive(Clone, Copy)]
enum GroupRef<'a> {
    Leaf(&'a PodGroup),
    Composite(&'a CompositePodGroup),
}

impl GroupRef<'_> {
    /// The plan recorded on the group's status.
    fn plan(&self) -> Option<&AdmissionPlan> {
        match self {
            GroupRef::Leaf(pg) => pg.status.as_ref().and_then(|s| s.plan.as_ref()),
            GroupRef::Composite(c) => c.status.as_ref().and_then(|s| s.plan.as_ref()),
        }
    }

    fn key(&self) -> RootKey {
        match self {
            GroupRef::Leaf(pg) => key_of(&pg.namespace().unwrap_or_default(), &pg.name_any()),
            GroupRef::Composite(c) => key_of(&c.namespace().unwrap_or_default(), &c.name_any()),
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

//! The admission reconciler, the paired half of kube-scheduler: on the leader only, one root at
//! a time in priority then age order, against an in-memory ledger of bound and admitted pods.
//! Quorum and placement are the scheduler core's; this module reads the world (trimmed watch
//! caches), commits plans with the crash-safe protocol (plan recorded, then each pod pinned,
//! given its GPU indices and ungated in one patch), watches binds, and writes status and events.

pub mod status;
pub mod trim;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::{Future, StreamExt};
use k8s_openapi::api::core::v1::{Event as CoreEvent, Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tokio::sync::Notify;

use super::context::{Context, Result};
use super::devices::DeviceReconciler;
use super::devices::prometheus::PrometheusSource;
use super::metrics::NodeLabels;
use crate::crds::blocks::DisruptionModeKind;
use crate::crds::scheduling::{AdmissionPlan, CompositePodGroup, GroupPhase, PlanState, PlannedPod, PodGroup};
use crate::crds::{ADMISSION_GATE, GPU_INDICES_ANNOTATION, HOSTNAME_LABEL, POD_GROUP_LABEL};
use crate::devices::chooser::{FitCache, NodeGpus, TopologyChooser, node_gpus};
use crate::devices::{HealthThresholds, MetricsCache, SelectOptions};
use crate::scheduler::{self, Admission, Decision, Group, GroupTree, PlaceOptions, Scoring, Snapshot};
use status::{ChildSummary, Outcome};

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
    unhealthy: BTreeMap<String, u64>,
    /// GPU choices by node kind and occupancy, kept across cycles.
    fits: Arc<FitCache>,
    /// GPU problems per node last reported (topology annotation, metrics, health).
    gpu_problems: BTreeMap<String, Vec<String>>,
}

/// Writes of this process that the watch caches have not shown yet.
#[derive(Default)]
struct Unseen {
    /// Root -> the plan (id and state) it was given, or `None` when it was cleared.
    plans: HashMap<RootKey, (Option<(String, PlanState)>, Instant)>,
    /// Pods ungated by a commit.
    ungated: HashMap<String, Instant>,
}

/// How long to wait for the caches to show a write before deciding anyway.
const CACHE_SYNC_TIMEOUT: Duration = Duration::from_secs(10);

fn spawn_watch<K>(
    api: Api<K>,
    config: watcher::Config,
    trim: fn(&mut K),
    notify: Arc<Notify>,
    capacity: Arc<AtomicU64>,
    mut frees: impl FnMut(&Event<K>) -> bool + Send + 'static,
) -> Store<K>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (store, writer) = reflector::store();
    let stream = watcher::watcher(api, config).default_backoff().modify(trim).reflect(writer);
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(ev) => {
                    if frees(&ev) {
                        capacity.fetch_add(1, Ordering::Relaxed);
                    }
                    notify.notify_one();
                }
                Err(e) => tracing::warn!(error = %e, "admission watch"),
            }
        }
    });
    store
}

fn pod_frees(ev: &Event<Pod>) -> bool {
    match ev {
        Event::Delete(_) => true,
        Event::Apply(p) => matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed")),
        _ => false,
    }
}

fn never(_: &Event<PodGroup>) -> bool {
    false
}

fn never_cpg(_: &Event<CompositePodGroup>) -> bool {
    false
}

/// Runs admission until `shutdown` resolves.
pub async fn run(ctx: Arc<Context>, shutdown: impl Future<Output = ()> + Send + 'static) {
    let client = ctx.client.clone();
    let notify = Arc::new(Notify::new());
    let capacity = Arc::new(AtomicU64::new(0));
    let cfg = || watcher::Config::default().any_semantic();
    let caches = Caches {
        pod_groups: spawn_watch(
            Api::<PodGroup>::all(client.clone()),
            cfg(),
            trim::managed_fields::<PodGroup>,
            notify.clone(),
            capacity.clone(),
            never,
        ),
        composites: spawn_watch(
            Api::<CompositePodGroup>::all(client.clone()),
            cfg(),
            trim::managed_fields::<CompositePodGroup>,
            notify.clone(),
            capacity.clone(),
            never_cpg,
        ),
        // Every pod: usage counts pods of all workloads, not only muster's.
        pods: spawn_watch(
            Api::<Pod>::all(client.clone()),
            cfg(),
            trim::pod,
            notify.clone(),
            capacity.clone(),
            pod_frees,
        ),
        nodes: spawn_watch(Api::<Node>::all(client.clone()), cfg(), trim::node, notify.clone(), capacity.clone(), {
            let mut seen = trim::NodeFingerprints::default();
            move |ev: &Event<Node>| seen.changed(ev)
        }),
    };
    let ready = async {
        let _ = tokio::join!(
            caches.pod_groups.wait_until_ready(),
            caches.composites.wait_until_ready(),
            caches.pods.wait_until_ready(),
            caches.nodes.wait_until_ready()
        );
    };
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

/// Parses `gpu.muster.dev/indices` into a mask; `None` when malformed.
pub fn indices_mask(value: &str) -> Option<u64> {
    let mut mask = 0u64;
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let i: u32 = part.parse().ok()?;
        if i >= 64 {
            return None;
        }
        mask |= 1 << i;
    }
    Some(mask)
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

/// Counts a pod just pinned by `planned` in the snapshot (resources and GPU indices), so the
/// roots planned later in the same cycle see the capacity taken.
fn reserve(snapshot: &mut Snapshot, pod: &Pod, planned: &PlannedPod) {
    let mut admitted = pod.clone();
    if let Some(spec) = admitted.spec.as_mut() {
        spec.node_selector.get_or_insert_with(BTreeMap::new).insert(HOSTNAME_LABEL.into(), planned.hostname.clone());
        spec.scheduling_gates = None;
    }
    snapshot.add_pod(&admitted);
    if let Some(mask) = planned.gpu_indices.as_deref().and_then(indices_mask)
        && let Some(node) = snapshot.node(&planned.node)
    {
        let used = node.gpu_used | mask;
        snapshot.set_gpu_used(&planned.node, used);
    }
}

impl Admitter {
    fn place_options(&self) -> PlaceOptions {
        let scoring = match self.ctx.config.placement {
            super::PlacementStrategy::BinPack => Scoring::BinPack,
            super::PlacementStrategy::Spread => Scoring::Spread,
        };
        PlaceOptions { scoring, ..PlaceOptions::default() }
    }

    /// One admission cycle over every root. Returns when to wake up at the latest.
    async fn cycle(&mut self) -> Result<Option<Instant>> {
        let _timer = self.ctx.metrics.reconcile(CONTROLLER);
        let pgs = state(&self.caches.pod_groups);
        let cpgs = state(&self.caches.composites);
        let pods = state(&self.caches.pods);
        let nodes = state(&self.caches.nodes);
        if !self.caches_caught_up(&pgs, &cpgs, &pods) {
            return Ok(Some(Instant::now() + Duration::from_millis(100)));
        }
        let mut snapshot = Snapshot::from_cluster(&nodes, &pods);
        // GPUs: topology and health per node, then the ledger (the device pass first gives
        // indices to GPU pods bound without muster, so admission plans around them).
        let gpus = self.gpu_state(&nodes).await;
        let held = self.devices.pass(&self.ctx, &pods, &snapshot, &gpus).await?;
        for (node, g) in &gpus {
            let used = held.get(node).copied().unwrap_or_default().union(g.unhealthy());
            snapshot.set_gpu_used(node, used.bits());
        }
        let by_group = group_pods(&pods);
        let mut wake: Option<Instant> = None;
        let mut soonest = |t: Instant| wake = Some(wake.map_or(t, |w| w.min(t)));

        // Plans in flight first: finish (or drop) them, and watch binds.
        let mut busy: HashSet<RootKey> = HashSet::new();
        for pg in &pgs {
            if let Some(plan) = pg.status.as_ref().and_then(|s| s.plan.clone()) {
                let key = key_of(&pg.namespace().unwrap_or_default(), &pg.name_any());
                busy.insert(key.clone());
                if let Some(t) = self.follow_plan(&key, GroupRef::Leaf(pg), &plan, &by_group, &mut snapshot).await? {
                    soonest(t);
                }
            }
        }
        for cpg in &cpgs {
            if let Some(plan) = cpg.status.as_ref().and_then(|s| s.plan.clone()) {
                let key = key_of(&cpg.namespace().unwrap_or_default(), &cpg.name_any());
                busy.insert(key.clone());
                if let Some(t) =
                    self.follow_plan(&key, GroupRef::Composite(cpg), &plan, &by_group, &mut snapshot).await?
                {
                    soonest(t);
                }
            }
        }

        let mut forest = scheduler::build_forest(&pgs, &cpgs, &pods);
        scheduler::sort_for_admission(&mut forest.trees);
        let single_numa = self.ctx.config.require_single_numa;
        let chooser =
            TopologyChooser::with_cache(gpus, SelectOptions { require_single_numa: single_numa }, self.fits.clone());
        let options = self.place_options();
        let capacity = self.capacity.load(Ordering::Relaxed);
        let now = Instant::now();
        let mut pending = 0;
        for tree in &forest.trees {
            let key = key_of(&tree.namespace, tree.root.name());
            if busy.contains(&key) {
                continue;
            }
            let memory = self.roots.entry(key.clone()).or_default();
            if let Some(at) = memory.next_attempt
                && at > now
                && memory.capacity_seen == capacity
            {
                soonest(at);
                pending += 1;
                continue;
            }
            let started = Instant::now();
            let admission = scheduler::decide(&snapshot, tree, &options, &chooser);
            match admission {
                Admission::Waiting(shortfall) => {
                    memory.quorate_since = None;
                    memory.outcome = Some(Outcome::Waiting(shortfall.to_string()));
                }
                Admission::NothingGated => {
                    memory.quorate_since = None;
                    memory.failures = 0;
                    memory.next_attempt = None;
                }
                Admission::Decided(decision) => {
                    self.ctx.metrics.placement_duration.observe(started.elapsed().as_secs_f64());
                    let memory = self.roots.entry(key.clone()).or_default();
                    memory.quorate_since.get_or_insert(started);
                    if decision.admitted && !decision.plan.is_empty() {
                        self.commit(tree, &decision, &mut snapshot, &pods).await?;
                    } else if decision.admitted {
                        memory.outcome = Some(Outcome::Admitted(decision.message()));
                    } else {
                        pending += 1;
                        let retry = self.unschedulable(&key, tree, &decision, capacity).await;
                        soonest(retry);
                    }
                }
            }
        }
        self.ctx.metrics.gangs_pending.set(pending);
        for u in &forest.unresolved {
            tracing::debug!(namespace = %u.namespace, name = %u.name, reason = ?u.reason, "not admissible");
        }
        self.write_statuses(&pgs, &cpgs, &forest.trees, &by_group).await?;
        // Forget roots that are gone.
        let live: HashSet<RootKey> = forest.trees.iter().map(|t| key_of(&t.namespace, t.root.name())).collect();
        self.roots.retain(|k, _| live.contains(k) || busy.contains(k));
        if self.metrics_source.is_some() {
            // GPU health changes arrive by polling, not by watch events.
            soonest(Instant::now() + self.ctx.config.gpu_metrics_ttl);
        }
        Ok(wake)
    }

    /// True when every write of ours shows in the caches (or waited long enough).
    fn caches_caught_up(&mut self, pgs: &[PodGroup], cpgs: &[CompositePodGroup], pods: &[Pod]) -> bool {
        let now = Instant::now();
        // `None`: the group is gone (nothing to wait for); `Some(plan)`: its plan as cached.
        let plan_of = |key: &RootKey| -> Option<Option<(String, PlanState)>> {
            let same = |ns: Option<String>, name: String| ns.as_deref() == Some(key.0.as_str()) && name == key.1;
            let plan = |p: Option<&AdmissionPlan>| p.map(|p| (p.id.clone(), p.state));
            pgs.iter()
                .find(|g| same(g.namespace(), g.name_any()))
                .map(|g| plan(g.status.as_ref().and_then(|s| s.plan.as_ref())))
                .or_else(|| {
                    cpgs.iter()
                        .find(|g| same(g.namespace(), g.name_any()))
                        .map(|g| plan(g.status.as_ref().and_then(|s| s.plan.as_ref())))
                })
        };
        self.unseen.plans.retain(|key, (want, at)| {
            now.duration_since(*at) < CACHE_SYNC_TIMEOUT && plan_of(key).is_some_and(|cached| cached != *want)
        });
        let gated: HashSet<&str> =
            pods.iter().filter(|p| is_gated(p)).filter_map(|p| p.metadata.uid.as_deref()).collect();
        self.unseen
            .ungated
            .retain(|uid, at| now.duration_since(*at) < CACHE_SYNC_TIMEOUT && gated.contains(uid.as_str()));
        self.unseen.plans.is_empty() && self.unseen.ungated.is_empty()
    }

    /// Each node's GPU model and health, refreshing the metrics cache when it is stale.
    async fn gpu_state(&mut self, nodes: &[Node]) -> HashMap<String, NodeGpus> {
        let now = std::time::SystemTime::now();
        if let Some(source) = &self.metrics_source
            && self.gpu_metrics.refresh(source, now).await
            && let Some(e) = self.gpu_metrics.last_error()
        {
            tracing::warn!(error = %e, "GPU metrics unavailable; scheduling on topology alone");
        }
        let thresholds = HealthThresholds {
            max_temperature_c: self.ctx.config.gpu_max_temperature,
            min_free_memory_fraction: self.ctx.config.gpu_min_free_memory,
            ..HealthThresholds::default()
        };
        let gpus = node_gpus(nodes, &self.gpu_metrics, &thresholds, now);
        self.report_gpu_problems(nodes, &gpus).await;
        let unhealthy: BTreeMap<String, u64> =
            gpus.iter().map(|(n, g)| (n.clone(), g.unhealthy().bits())).filter(|(_, m)| *m != 0).collect();
        if unhealthy != self.unhealthy {
            // Health changed: roots waiting in backoff may fit now (or no longer).
            self.capacity.fetch_add(1, Ordering::Relaxed);
            self.unhealthy = unhealthy;
        }
        gpus
    }

    /// Tells operators, once per change, what keeps a node's GPUs from full use: a missing or
    /// malformed topology annotation, missing, stale or invalid metrics, GPUs too hot or full.
    /// A log line and an event on the Node, and the gauge `muster_gpu_node_problems`.
    async fn report_gpu_problems(&mut self, nodes: &[Node], gpus: &HashMap<String, NodeGpus>) {
        let metrics_expected = self.metrics_source.is_some();
        let now: BTreeMap<String, Vec<String>> = gpus
            .iter()
            .map(|(n, g)| (n.clone(), g.problems(metrics_expected)))
            .filter(|(_, p)| !p.is_empty())
            .collect();
        if now == self.gpu_problems {
            return;
        }
        for node in nodes {
            let name = node.name_any();
            let (before, after) = (self.gpu_problems.get(&name), now.get(&name));
            if before == after {
                continue;
            }
            let object = node.object_ref(&());
            self.ctx
                .metrics
                .gpu_node_problems
                .get_or_create(&NodeLabels { node: name.clone() })
                .set(after.map_or(0, |p| p.len() as i64));
            match after {
                Some(problems) => {
                    let note = problems.join("; ");
                    tracing::warn!(node = %name, problems = %note, "GPU problems on node");
                    self.ctx.event(&object, true, "GPUProblems", "Schedule", note).await;
                }
                None => {
                    tracing::info!(node = %name, "GPU problems on node cleared");
                    self.ctx
                        .event(
                            &object,
                            false,
                            "GPUProblemsCleared",
                            "Schedule",
                            "GPU topology and metrics usable again",
                        )
                        .await;
                }
            }
        }
        // Nodes gone: forget them.
        for name in self.gpu_problems.keys().filter(|n| !now.contains_key(*n)) {
            self.ctx.metrics.gpu_node_problems.remove(&NodeLabels { node: name.clone() });
        }
        self.gpu_problems = now;
    }

    async fn unschedulable(&mut self, key: &RootKey, tree: &GroupTree, decision: &Decision, capacity: u64) -> Instant {
        let message = decision.message();
        let memory = self.roots.entry(key.clone()).or_default();
        memory.failures = memory.failures.saturating_add(1);
        let backoff = MIN_BACKOFF.saturating_mul(1 << memory.failures.saturating_sub(1).min(6)).min(MAX_BACKOFF);
        let at = Instant::now() + backoff;
        memory.next_attempt = Some(at);
        memory.capacity_seen = capacity;
        memory.outcome = Some(Outcome::Unschedulable(message.clone()));
        let reason = decision.explanation.as_ref().map_or_else(|| "Unschedulable".into(), |e| e.metric_reason());
        self.ctx.metrics.unschedulable_attempts.get_or_create(&super::metrics::ReasonLabels { reason }).inc();
        if memory.last_event.as_deref() != Some(message.as_str()) {
            memory.last_event = Some(message.clone());
            self.group_event(tree, true, "Unschedulable", &message).await;
        }
        at
    }

    /// Events on the root group and on its owner (the MusterJob or MusterJobSet).
    async fn group_event(&self, tree: &GroupTree, warning: bool, reason: &str, message: &str) {
        let refs = self.root_refs(&tree.namespace, tree.root.name(), matches!(tree.root, Group::Composite(_)));
        for r in refs {
            self.ctx.event(&r, warning, reason, "Admit", message.to_string()).await;
        }
    }

    fn root_refs(&self, ns: &str, name: &str, composite: bool) -> Vec<ObjectReference> {
        let obj_ref = if composite {
            self.caches
                .composites
                .get(&reflector::ObjectRef::new(name).within(ns))
                .map(|c| (c.object_ref(&()), c.metadata.owner_references.clone()))
        } else {
            self.caches
                .pod_groups
                .get(&reflector::ObjectRef::new(name).within(ns))
                .map(|g| (g.object_ref(&()), g.metadata.owner_references.clone()))
        };
        let Some((me, owners)) = obj_ref else { return vec![] };
        let mut out = vec![me];
        if let Some(o) = owners.iter().flatten().find(|o| o.controller == Some(true)) {
            out.push(ObjectReference {
                api_version: Some(o.api_version.clone()),
                kind: Some(o.kind.clone()),
                name: Some(o.name.clone()),
                namespace: Some(ns.to_string()),
                uid: Some(o.uid.clone()),
                ..Default::default()
            });
        }
        out
    }

    /// The commit protocol: record the plan, pin/annotate/ungate each pod once, mark admitted.
    async fn commit(
        &mut self,
        tree: &GroupTree,
        decision: &Decision,
        snapshot: &mut Snapshot,
        pods: &[Pod],
    ) -> Result<()> {
        let ns = tree.namespace.clone();
        let composite = matches!(tree.root, Group::Composite(_));
        let root = tree.root.name().to_string();
        let now = Timestamp::now();
        let mut plan = AdmissionPlan {
            id: format!("{root}-{}", now.as_millisecond()),
            state: PlanState::Planned,
            created_at: Some(Time(now)),
            admitted_at: None,
            pods: decision.plan.iter().map(PlannedPod::from).collect(),
        };
        if !self.write_plan(&ns, &root, composite, Some(&plan)).await? {
            return Ok(()); // the group was deleted meanwhile: nothing to admit
        }
        plan.state = PlanState::Committing;
        self.write_plan(&ns, &root, composite, Some(&plan)).await?;
        let by_uid: HashMap<&str, &Pod> =
            pods.iter().filter_map(|p| p.metadata.uid.as_deref().map(|u| (u, p))).collect();
        for planned in &plan.pods {
            let Some(pod) = by_uid.get(planned.uid.as_str()) else { continue };
            self.patch_pod(&ns, pod, planned).await?;
            reserve(snapshot, pod, planned);
        }
        plan.state = PlanState::Admitted;
        plan.admitted_at = Some(Time(Timestamp::now()));
        self.write_plan(&ns, &root, composite, Some(&plan)).await?;
        let message = decision.message();
        let key = key_of(&ns, &root);
        let memory = self.roots.entry(key).or_default();
        memory.failures = 0;
        memory.next_attempt = None;
        memory.outcome = Some(Outcome::Admitted(message.clone()));
        memory.last_event = None;
        if let Some(since) = memory.quorate_since.take() {
            self.ctx.metrics.admission_latency.observe(since.elapsed().as_secs_f64());
        }
        self.ctx.metrics.gangs_admitted.inc();
        tracing::info!(namespace = %ns, root = %root, pods = plan.pods.len(), "admitted");
        self.group_event(tree, false, "Admitted", &format!("admitted {} pod(s): {message}", plan.pods.len())).await;
        Ok(())
    }

    /// Pins, annotates and ungates one pod in a single idempotent patch.
    async fn patch_pod(&mut self, ns: &str, pod: &Pod, planned: &PlannedPod) -> Result<()> {
        let remaining: Vec<serde_json::Value> = pod
            .spec
            .as_ref()
            .and_then(|s| s.scheduling_gates.as_ref())
            .map(|g| g.iter().filter(|g| g.name != ADMISSION_GATE).map(|g| json!({"name": g.name})).collect())
            .unwrap_or_default();
        let mut patch = json!({
            "metadata": {"uid": planned.uid},
            "spec": {"nodeSelector": {HOSTNAME_LABEL: planned.hostname}, "schedulingGates": remaining},
        });
        if let Some(indices) = &planned.gpu_indices {
            patch["metadata"]["annotations"] = json!({GPU_INDICES_ANNOTATION: indices});
        }
        let api = Api::<Pod>::namespaced(self.ctx.client.clone(), ns);
        match api.patch(&planned.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {
                self.unseen.ungated.insert(planned.uid.clone(), Instant::now());
            }
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 || e.code == 422 => {
                tracing::info!(pod = %planned.name, error = %e.message, "planned pod changed or is gone; skipped");
            }
            Err(e) => return Err(e.into()),
        }
        self.patches += 1;
        if self.fault_exit_after.is_some_and(|n| self.patches >= n) {
            tracing::error!(patches = self.patches, "{FAULT_EXIT_ENV} reached: exiting now (test hook)");
            std::process::exit(3);
        }
        Ok(())
    }

    /// Writes (or clears) a root's plan. Returns false when the group is gone.
    async fn write_plan(
        &mut self,
        ns: &str,
        name: &str,
        composite: bool,
        plan: Option<&AdmissionPlan>,
    ) -> Result<bool> {
        let kind = if composite { "CompositePodGroup" } else { "PodGroup" };
        // A merge patch of status.plan alone: the rest of the status is written on its own.
        let body = json!({"apiVersion": "scheduling.muster.dev/v1alpha1", "kind": kind, "status": {"plan": plan}});
        let params = PatchParams::default();
        let result = if composite {
            Api::<CompositePodGroup>::namespaced(self.ctx.client.clone(), ns)
                .patch_status(name, &params, &Patch::Merge(&body))
                .await
                .map(|_| ())
        } else {
            Api::<PodGroup>::namespaced(self.ctx.client.clone(), ns)
                .patch_status(name, &params, &Patch::Merge(&body))
                .await
                .map(|_| ())
        };
        match result {
            Ok(()) => {
                let want = plan.map(|p| (p.id.clone(), p.state));
                self.unseen.plans.insert(key_of(ns, name), (want, Instant::now()));
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Follows a recorded plan: resumes a commit cut short, drops a plan no pod saw, and fails
    /// a gang whose committed pods do not bind in time. Returns when to look again.
    async fn follow_plan(
        &mut self,
        key: &RootKey,
        group: GroupRef<'_>,
        plan: &AdmissionPlan,
        by_group: &HashMap<RootKey, Vec<&Pod>>,
        snapshot: &mut Snapshot,
    ) -> Result<Option<Instant>> {
        let (ns, root) = (&key.0, &key.1);
        let composite = matches!(group, GroupRef::Composite(_));
        let pods: Vec<&Pod> =
            by_group.values().flatten().copied().filter(|p| p.namespace().as_deref() == Some(ns.as_str())).collect();
        let by_uid: HashMap<&str, &Pod> =
            pods.iter().filter_map(|p| p.metadata.uid.as_deref().map(|u| (u, *p))).collect();
        let live: Vec<(&PlannedPod, &Pod)> = plan
            .pods
            .iter()
            .filter_map(|pp| by_uid.get(pp.uid.as_str()).map(|p| (pp, *p)))
            .filter(|(_, p)| p.metadata.deletion_timestamp.is_none())
            .collect();
        let touched = live.iter().filter(|(_, p)| !is_gated(p)).count();
        match plan.state {
            PlanState::Planned | PlanState::Committing if touched == 0 => {
                tracing::info!(namespace = %ns, root = %root, "dropping a plan no pod saw; planning afresh");
                self.write_plan(ns, root, composite, None).await?;
                return Ok(Some(Instant::now()));
            }
            PlanState::Planned | PlanState::Committing => {
                tracing::info!(namespace = %ns, root = %root, touched, total = live.len(), "resuming a commit cut short");
                for (planned, pod) in &live {
                    if is_gated(pod) {
                        self.patch_pod(ns, pod, planned).await?;
                        // The snapshot saw it gated: count it before other roots are planned.
                        reserve(snapshot, pod, planned);
                    }
                }
                let mut done = plan.clone();
                done.state = PlanState::Admitted;
                // The pods just ungated get the whole bind timeout, however long muster was down.
                done.admitted_at = Some(Time(Timestamp::now()));
                self.write_plan(ns, root, composite, Some(&done)).await?;
                self.roots.entry(key.clone()).or_default().outcome =
                    Some(Outcome::Admitted(format!("admitted {} pod(s) (commit resumed)", live.len())));
                return Ok(Some(Instant::now()));
            }
            PlanState::Admitted => {}
        }
        let unbound: Vec<&(&PlannedPod, &Pod)> = live.iter().filter(|(_, p)| !bound(p) && !finished(p)).collect();
        if unbound.is_empty() {
            // Every pod bound (or gone): the plan has served its purpose.
            self.write_plan(ns, root, composite, None).await?;
            return Ok(None);
        }
        let since = plan.admitted_at.as_ref().or(plan.created_at.as_ref()).map(|t| t.0).unwrap_or_else(Timestamp::now);
        let age = Duration::from_secs((Timestamp::now().as_second() - since.as_second()).max(0) as u64);
        let timeout = self.ctx.config.bind_timeout;
        if age < timeout {
            return Ok(Some(Instant::now() + (timeout - age) + Duration::from_millis(200)));
        }
        // The bind watchdog: the gang failed.
        let (planned, pod) = unbound[0];
        let why = self.scheduler_reason(ns, &planned.name).await;
        let message = format!(
            "pod {} was not bound to node {} within {}s{}; {} of {} planned pod(s) unbound",
            planned.name,
            planned.node,
            timeout.as_secs(),
            why.map(|w| format!(": {w}")).unwrap_or_default(),
            unbound.len(),
            live.len()
        );
        tracing::warn!(namespace = %ns, root = %root, %message, "bind timeout");
        self.ctx.metrics.bind_timeouts.inc();
        let all = match group {
            GroupRef::Leaf(pg) => pg.spec.disruption_mode.kind() == Some(DisruptionModeKind::All),
            GroupRef::Composite(c) => c.spec.disruption_mode.kind() == Some(DisruptionModeKind::All),
        };
        let api = Api::<Pod>::namespaced(self.ctx.client.clone(), ns);
        if all {
            // Replace the whole gang: its controller recreates the pods, gated again.
            for (_, p) in &live {
                if finished(p) {
                    continue;
                }
                match api.delete(&p.name_any(), &DeleteParams::background()).await {
                    Ok(_) | Err(kube::Error::Api(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        let _ = pod;
        self.write_plan(ns, root, composite, None).await?;
        let outcome_msg = if all {
            format!("{message}; the gang's pods were deleted to be recreated together (disruptionMode all)")
        } else {
            message
        };
        self.roots.entry(key.clone()).or_default().outcome = Some(Outcome::BindFailed(outcome_msg.clone()));
        for r in self.root_refs(ns, root, composite) {
            self.ctx.event(&r, true, "BindTimeout", "Admit", outcome_msg.clone()).await;
        }
        Ok(Some(Instant::now()))
    }

    /// The newest scheduler event explaining why a pod is not bound.
    async fn scheduler_reason(&self, ns: &str, pod: &str) -> Option<String> {
        let api = Api::<CoreEvent>::namespaced(self.ctx.client.clone(), ns);
        let lp = ListParams::default().fields(&format!("involvedObject.kind=Pod,involvedObject.name={pod}"));
        let events = api.list(&lp).await.ok()?;
        events
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("FailedScheduling"))
            .max_by_key(|e| e.last_timestamp.as_ref().map(|t| t.0.as_second()).unwrap_or(0))
            .and_then(|e| e.message)
    }

    /// Writes every group's status that changed (server-side apply, this reconciler's manager).
    async fn write_statuses(
        &self,
        pgs: &[PodGroup],
        cpgs: &[CompositePodGroup],
        trees: &[GroupTree],
        by_group: &HashMap<RootKey, Vec<&Pod>>,
    ) -> Result<()> {
        let now = Timestamp::now();
        // The outcome of a root applies to every group under it.
        let mut outcome_of: HashMap<RootKey, Option<&Outcome>> = HashMap::new();
        let mut quorate_of: HashMap<RootKey, bool> = HashMap::new();
        for tree in trees {
            let outcome = self.roots.get(&key_of(&tree.namespace, tree.root.name())).and_then(|m| m.outcome.as_ref());
            visit(&tree.root, &mut |g| {
                outcome_of.insert(key_of(&tree.namespace, g.name()), outcome);
                quorate_of.insert(key_of(&tree.namespace, g.name()), scheduler::is_quorate(g));
            });
        }
        let empty = Vec::new();
        let mut leaf_status: HashMap<RootKey, crate::crds::scheduling::PodGroupStatus> = HashMap::new();
        for pg in pgs {
            let key = key_of(&pg.namespace().unwrap_or_default(), &pg.name_any());
            let pods = by_group.get(&key).unwrap_or(&empty);
            let outcome = outcome_of.get(&key).copied().flatten();
            let status = status::pod_group_status(pg, pods, outcome, now);
            if !same_status(pg.status.as_ref(), &status) {
                self.apply_status::<PodGroup>(&key.0, &key.1, "PodGroup", serde_json::to_value(&status)?).await?;
            }
            leaf_status.insert(key, status);
        }
        for cpg in cpgs {
            let ns = cpg.namespace().unwrap_or_default();
            let name = cpg.name_any();
            let key = key_of(&ns, &name);
            let mut children = Vec::new();
            for pg in pgs.iter().filter(|p| {
                p.namespace().as_deref() == Some(ns.as_str())
                    && p.spec.parent_composite_pod_group_name.as_deref() == Some(name.as_str())
            }) {
                let k = key_of(&ns, &pg.name_any());
                let s = leaf_status.get(&k);
                let min = s.and_then(|s| s.min_count).unwrap_or(1);
                children.push(ChildSummary {
                    quorate: quorate_of.get(&k).copied().unwrap_or(false),
                    admitted: s.is_some_and(|s| s.admitted + s.succeeded + s.failed >= min),
                    phase: s.and_then(|s| s.phase).unwrap_or(GroupPhase::Pending),
                });
            }
            for child in cpgs.iter().filter(|c| {
                c.namespace().as_deref() == Some(ns.as_str())
                    && c.spec.parent_composite_pod_group_name.as_deref() == Some(name.as_str())
            }) {
                let k = key_of(&ns, &child.name_any());
                let s = child.status.as_ref();
                children.push(ChildSummary {
                    quorate: quorate_of.get(&k).copied().unwrap_or(false),
                    admitted: s.is_some_and(|s| s.admitted_children >= s.min_group_count.unwrap_or(1)),
                    phase: s.and_then(|s| s.phase).unwrap_or(GroupPhase::Pending),
                });
            }
            let outcome = outcome_of.get(&key).copied().flatten();
            let status = status::composite_status(cpg, &children, outcome, now);
            if !same_status(cpg.status.as_ref(), &status) {
                self.apply_status::<CompositePodGroup>(&ns, &name, "CompositePodGroup", serde_json::to_value(&status)?)
                    .await?;
            }
        }
        Ok(())
    }

    async fn apply_status<K>(&self, ns: &str, name: &str, kind: &str, mut status: serde_json::Value) -> Result<()>
    where
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + std::fmt::Debug
            + serde::de::DeserializeOwned,
    {
        // The plan is written by the commit protocol with its own patches; leave it alone here.
        if let Some(map) = status.as_object_mut() {
            map.remove("plan");
        }
        let body = json!({"apiVersion": "scheduling.muster.dev/v1alpha1", "kind": kind, "status": status});
        match Api::<K>::namespaced(self.ctx.client.clone(), ns)
            .patch_status(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// A root group of either kind.
enum GroupRef<'a> {
    Leaf(&'a PodGroup),
    Composite(&'a CompositePodGroup),
}

fn visit<'a>(group: &'a Group, f: &mut impl FnMut(&'a Group)) {
    f(group);
    if let Group::Composite(c) = group {
        for child in &c.children {
            visit(child, f);
        }
    }
}

/// A group status whose `plan` is written apart from the rest (by the commit protocol).
trait HasPlan: Clone + PartialEq {
    fn without_plan(&self) -> Self;
}

impl HasPlan for crate::crds::scheduling::PodGroupStatus {
    fn without_plan(&self) -> Self {
        Self { plan: None, ..self.clone() }
    }
}

impl HasPlan for crate::crds::scheduling::CompositePodGroupStatus {
    fn without_plan(&self) -> Self {
        Self { plan: None, ..self.clone() }
    }
}

/// Status equality that ignores the plan.
fn same_status<S: HasPlan>(old: Option<&S>, new: &S) -> bool {
    old.is_some_and(|old| old.without_plan() == new.without_plan())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_parse_into_masks() {
        assert_eq!(indices_mask("0,1,4,5"), Some(0b110011));
        assert_eq!(indices_mask(""), Some(0));
        assert_eq!(indices_mask("x"), None);
        assert_eq!(indices_mask("64"), None);
    }
}

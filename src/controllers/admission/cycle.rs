//! One admission cycle: read the caches, build the snapshot, follow the recorded plans, then
//! decide per root (quorum, placement) and commit or explain; last, write the statuses.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::commit::{CommitJob, Committed, ROLLBACK_POLICY, admitted_status, prepare_commit, reserve};
use super::preemption::{self, Held};
use super::report::object_labels;
use super::watches::Settling;
use super::{Admitter, CONTROLLER, GroupRef, InFlight, RootKey, World, error_backoff, group_pods, state};
use crate::controllers::PlacementStrategy;
use crate::controllers::context::Result;
use crate::crds::blocks::DisruptionModeKind;
use crate::crds::scheduling::{CompositePodGroup, PlannedPod, PodGroup};
use crate::devices::chooser::{ChooserNodes, GpuNode, TopologyChooser};
use crate::devices::{GpuProblem, GpuProblemKind, GpuSet, Placed, SelectOptions};
use crate::scheduler::status::Outcome;
use crate::scheduler::{
    self, Admission, Decision, Group, GroupTree, PatchRefused, PlaceOptions, PodState, Scoring, Snapshot,
};
use crate::webhook::config::excluded_namespaces;

/// How long a started gang of mode `all` must stay below its minCount before it is disrupted
/// whole: its owner ending it (suspended, complete, failed) deletes every pod within this.
const DISRUPTION_SETTLE: Duration = Duration::from_secs(5);

/// Nodes a waiting root holds back from others: its reservation keeps roots of lower priority
/// off them; its nomination (a preemption under way) those of its own priority too, as
/// kube-scheduler's nominator does.
#[derive(Debug)]
struct Hold {
    priority: i32,
    root: RootKey,
    nodes: BTreeSet<String>,
    nominated: bool,
}

impl Hold {
    fn reserved(priority: i32, root: &RootKey, nodes: BTreeSet<String>) -> Self {
        Hold { priority, root: root.clone(), nodes, nominated: false }
    }

    fn nominated(priority: i32, root: &RootKey, nodes: BTreeSet<String>) -> Self {
        Hold { priority, root: root.clone(), nodes, nominated: true }
    }

    /// Whether it keeps root `key` of `priority` off its nodes.
    fn keeps(&self, priority: i32, key: &RootKey) -> bool {
        self.priority > priority || (self.nominated && self.priority == priority && self.root != *key)
    }
}

/// The quorate roots a cycle leaves waiting, per namespace (`muster_gangs_pending`,
/// `muster_gangs_waiting`).
#[derive(Debug, Default)]
struct Pending {
    by_namespace: BTreeMap<String, i64>,
}

impl Pending {
    fn add(&mut self, namespace: &str) {
        *self.by_namespace.entry(namespace.to_string()).or_default() += 1;
    }

    fn total(&self) -> i64 {
        self.by_namespace.values().sum()
    }
}

impl Admitter {
    fn place_options(&self) -> PlaceOptions {
        let scoring = match self.ctx.config.placement {
            PlacementStrategy::BinPack => Scoring::BinPack,
            PlacementStrategy::Spread => Scoring::Spread,
        };
        PlaceOptions { scoring, ..PlaceOptions::default() }
    }

    /// One admission cycle over every root. Returns when to wake up at the latest. An error
    /// met on one root (or one status write) is that root's: it is reported and backed off
    /// alone, and the cycle goes on with the others.
    pub(super) async fn cycle(&mut self) -> Result<Option<Instant>> {
        let _timer = self.ctx.metrics.reconcile(CONTROLLER);
        let began = Instant::now();
        // The caches' objects are shared, never copied: a cycle holds `Arc`s.
        let all_pgs = self.caches.pod_groups.state();
        let all_cpgs = self.caches.composites.state();
        let pods = self.caches.pods.state();
        // Every node, by name, as the GPU model reads it (admission keeps no node objects).
        let nodes = super::watches::lock(&self.caches.cluster).gpu_nodes();
        // Commits that ended are booked below; those still in flight go on meanwhile. They
        // end before the writes the caches do not show are read, so a commit's pins are
        // counted either as in flight or as unseen.
        self.ended_commits();
        let Some(settling) = self.settling(&all_pgs, &all_cpgs, &pods) else {
            // Waiting for the caches: nothing is known to be calm.
            self.calm = false;
            return Ok(Some(Instant::now() + Duration::from_millis(100)));
        };
        // Where muster placed pods not bound yet: their plans, recorded in the status of their
        // groups (which only muster writes), and the commits the caches do not show yet.
        let plans = all_pgs
            .iter()
            .filter_map(|g| g.status.as_ref().and_then(|s| s.plan.as_ref()))
            .chain(all_cpgs.iter().filter_map(|g| g.status.as_ref().and_then(|s| s.plan.as_ref())))
            .flat_map(|plan| plan.pods.iter());
        let placed = crate::devices::trust::placed_by_plans(plans.chain(settling.pins.values()));
        // Groups where the webhook never gates pods are not muster's to admit.
        let excluded = excluded_namespaces(&self.ctx.config.namespace);
        let managed = |ns: Option<String>| !ns.is_some_and(|ns| excluded.contains(&ns));
        let (pgs, unmanaged_pgs): (Vec<Arc<PodGroup>>, Vec<Arc<PodGroup>>) =
            all_pgs.into_iter().partition(|g| managed(g.namespace()));
        let (cpgs, unmanaged_cpgs): (Vec<Arc<CompositePodGroup>>, Vec<Arc<CompositePodGroup>>) =
            all_cpgs.into_iter().partition(|g| managed(g.namespace()));
        // Pods in excluded namespaces are rare: copy the list only when there are some.
        let managed_pods: std::borrow::Cow<'_, [Arc<Pod>]> = if pods.iter().all(|p| managed(p.namespace())) {
            std::borrow::Cow::Borrowed(&pods)
        } else {
            std::borrow::Cow::Owned(pods.iter().filter(|p| managed(p.namespace())).cloned().collect())
        };
        let by_uid: HashMap<&str, &Arc<Pod>> =
            managed_pods.iter().filter_map(|p| p.metadata.uid.as_deref().map(|u| (u, p))).collect();
        let read_in = began.elapsed();
        let (mut snapshot, gpus) = self.snapshot(&nodes, &settling, &by_uid, placed).await?;

        let snapshot_in = began.elapsed();
        let by_group = group_pods(&managed_pods);
        let world = World {
            pods_by_uid: managed_pods.iter().filter_map(|p| p.metadata.uid.as_deref().map(|u| (u, &**p))).collect(),
            pod_groups: pgs
                .iter()
                .filter_map(|g| Some(((g.metadata.namespace.as_deref()?, g.metadata.name.as_deref()?), &**g)))
                .collect(),
            by_group: &by_group,
            nodes: nodes.iter().map(|(name, _)| name.as_str()).collect(),
        };
        let mut wake: Option<Instant> = None;
        let mut soonest = |t: Instant| wake = Some(wake.map_or(t, |w| w.min(t)));
        let now = Instant::now();

        // Plans in flight first: finish (or drop) them, watch binds, roll failed attempts back.
        let mut busy: HashSet<RootKey> = HashSet::new();
        let mut done = Vec::new();
        let roots = pgs.iter().map(GroupRef::Leaf).chain(cpgs.iter().map(GroupRef::Composite));
        busy.extend(settling.roots.iter().cloned());
        if let Some(at) = self.book_clears().await {
            soonest(at);
        }
        // A plan being cleared is neither followed (it would be cleared twice) nor decided.
        busy.extend(self.clears.iter().flat_map(|c| c.keys.iter().cloned()));
        for group in roots {
            let Some(plan) = group.plan() else { continue };
            let key = group.key();
            if !busy.insert(key.clone()) {
                continue;
            }
            if let Some(at) = self.backing_off(&key, now) {
                soonest(at);
                continue;
            }
            match self.follow_plan(&key, group, plan, &world, &mut snapshot, &mut done).await {
                Ok(t) => {
                    self.error_cleared(&key);
                    if let Some(t) = t {
                        soonest(t);
                    }
                }
                Err(e) => soonest(self.root_error(&key, "follow its plan", &e)),
            }
        }

        let followed_in = began.elapsed();
        let mut forest = scheduler::build_forest(pgs.iter().map(|g| &**g), cpgs.iter().map(|c| &**c), &managed_pods);
        scheduler::sort_for_admission(&mut forest.trees);
        let single_numa = self.ctx.config.require_single_numa;
        let chooser =
            TopologyChooser::shared(gpus, SelectOptions { require_single_numa: single_numa }, self.fits.clone());
        let options = self.place_options();
        let capacity = self.capacity.load(Ordering::Relaxed);
        let wall = Timestamp::now();
        let mut pending = Pending::default();
        let limit = self.writer.concurrency(COMMIT_CONCURRENCY);
        if !self.ended.is_empty() {
            let trees: HashMap<RootKey, &GroupTree> =
                forest.trees.iter().map(|t| (RootKey::of(&t.namespace, &t.root), t)).collect();
            for (job, decision, result) in std::mem::take(&mut self.ended) {
                if matches!(result, Ok(Committed::Done)) {
                    self.admitted(&job);
                    self.error_cleared(&job.key);
                    continue;
                }
                let Some(tree) = trees.get(&job.key) else { continue };
                if let Some(at) = self.commit_stopped(&job.key, tree, &decision, result, capacity, &mut pending) {
                    soonest(at);
                }
            }
        }
        let roots = roots_by_key(&pgs, &cpgs);
        let excluded_set: HashSet<String> = excluded.iter().cloned().collect();
        // Each PodGroup's disruption mode (preemption takes a gang of mode `all` whole).
        let leaf_modes: HashMap<(&str, &str), DisruptionModeKind> = pgs
            .iter()
            .filter_map(|g| {
                let (ns, name) = (g.metadata.namespace.as_deref()?, g.metadata.name.as_deref()?);
                Some(((ns, name), g.spec.disruption_mode.kind().unwrap_or(DisruptionModeKind::Single)))
            })
            .collect();
        // Nodes held back by roots that wait for them.
        let mut held: Vec<Hold> = Vec::new();
        for ti in 0..forest.trees.len() {
            let tree = &mut forest.trees[ti];
            let key = RootKey::of(&tree.namespace, &tree.root);
            if busy.contains(&key) {
                continue;
            }
            if let Some(at) = self.backing_off(&key, now) {
                soonest(at);
                pending.add(&key.ns);
                continue;
            }
            let root = roots.get(&key).copied();
            if root.is_some_and(|r| r.disruption() == DisruptionModeKind::All) {
                let gangs = scheduler::disrupted(tree, &finished_per_group(&key.ns, &by_group));
                let memory = self.roots.entry(key.clone()).or_default();
                if gangs.is_empty() {
                    memory.disrupted_since = None;
                } else {
                    // A gang whose owner ends it (a job suspended, complete or failed) loses
                    // every pod within moments; one that loses a node keeps its survivors. Only
                    // a loss that lasts is a disruption.
                    let since = *memory.disrupted_since.get_or_insert(now);
                    if now.duration_since(since) < DISRUPTION_SETTLE {
                        soonest(since + DISRUPTION_SETTLE);
                        pending.add(&key.ns);
                        continue;
                    }
                    memory.disrupted_since = None;
                    self.disrupt(&key, &gangs).await;
                    soonest(Instant::now() + Duration::from_millis(200));
                    continue;
                }
            }
            // What the root's status remembers of rollbacks: nodes to avoid, and a streak of
            // them that keeps the gang unschedulable for a while.
            let history = root.map(|r| r.history()).unwrap_or_default();
            tree.avoid_nodes = history.avoided(wall);
            // A root of higher priority waiting for its nodes keeps them from this one, and so
            // does a preemptor of its priority, or any pod of its priority or higher nominated to
            // a node (kube-scheduler would count it there when it binds this root's pins).
            tree.reserved_nodes =
                held.iter().filter(|h| h.keeps(tree.priority, &key)).flat_map(|h| h.nodes.iter().cloned()).collect();
            tree.reserved_nodes.extend(scheduler::nominated_against(&snapshot, tree));
            let tree = &forest.trees[ti];
            let memory = self.roots.entry(key.clone()).or_default();
            // A preemption under way: the root waits for its victims to go, holding its nodes.
            if let Some(n) = &memory.nomination {
                if preemption::still_waiting(n, &snapshot, now) {
                    held.extend(memory.reserved.clone().map(|r| Hold::nominated(tree.priority, &key, r)));
                    pending.add(&key.ns);
                    soonest(now + Duration::from_millis(500));
                    continue;
                }
                memory.nomination = None;
                memory.next_attempt = None;
            }
            held.extend(memory.reserved.clone().map(|r| Hold::reserved(tree.priority, &key, r)));
            if let Some(retry) = history.retry_at(&ROLLBACK_POLICY).filter(|at| *at > wall) {
                if !matches!(memory.outcome, Some(Outcome::Unschedulable(..))) {
                    memory.outcome = Some(Outcome::Unschedulable(
                        format!(
                            "{} attempts rolled back in a row after failed pins; retrying after {retry}",
                            history.recent
                        ),
                        "RollbackBackoff".into(),
                    ));
                }
                soonest(now + retry.duration_since(wall).unsigned_abs());
                pending.add(&key.ns);
                continue;
            }
            if let Some(at) = memory.next_attempt
                && at > now
                && memory.capacity_seen == capacity
            {
                soonest(at);
                pending.add(&key.ns);
                continue;
            }
            if self.commits.len() >= limit {
                // Every commit slot is taken: this root (and the ones after it, in admission
                // order) is decided once a commit ends, which wakes a cycle.
                pending.add(&key.ns);
                continue;
            }
            let started = Instant::now();
            let admission = scheduler::decide(&snapshot, tree, &options, &chooser);
            if !matches!(&admission, Admission::Decided(d) if !d.admitted) {
                // Admitted, or not quorate: it holds nothing back.
                if self.roots.entry(key.clone()).or_default().reserved.take().is_some() {
                    held.retain(|h| h.root != key);
                }
            }
            let memory = self.roots.entry(key.clone()).or_default();
            match admission {
                Admission::Waiting(shortfall) => {
                    memory.outcome = Some(Outcome::Waiting(shortfall.to_string()));
                    self.clear_nominations(&key, tree, &by_uid).await;
                }
                Admission::NothingGated => {
                    memory.failures = 0;
                    memory.next_attempt = None;
                }
                Admission::Decided(decision) => {
                    self.ctx.metrics.placement_duration.observe(started.elapsed().as_secs_f64());
                    if decision.admitted && !decision.plan.is_empty() {
                        let version = self.writer.unseen().fence(&key, root.and_then(|r| r.version()));
                        match prepare_commit(&key, version, &decision, &mut snapshot, &by_uid) {
                            Ok(mut job) => {
                                // The plan's record replaces the status of the root as cached
                                // when the decision was made on that version.
                                job.cached = root.map(|r| r.cached());
                                // A leaf root says it is admitted from its plan's write on.
                                if let Some(GroupRef::Leaf(pg)) = root {
                                    let pods = by_group.get(&key).map_or(&[][..], Vec::as_slice);
                                    let error = self.roots.get(&key).and_then(|m| m.error.as_deref());
                                    job.admitted = Some(admitted_status(pg, pods, &job, error));
                                }
                                self.spawn_commit(key, job, decision)
                            }
                            Err(stop) => {
                                if let Some(at) =
                                    self.commit_stopped(&key, tree, &decision, Ok(stop), capacity, &mut pending)
                                {
                                    soonest(at);
                                }
                            }
                        }
                    } else if decision.admitted && gated_count(tree) > 0 {
                        // Admitted before, but gated pods beyond what started do not fit (the
                        // extra pods of a gang, a basic child of a composite): say so, and retry
                        // them on a backoff, or when capacity frees, not every cycle.
                        pending.add(&key.ns);
                        soonest(self.partly(&key, tree, &decision, capacity));
                    } else if decision.admitted {
                        memory.outcome = Some(Outcome::Admitted(decision.message()));
                    } else {
                        pending.add(&key.ns);
                        let policy = preemption::root_policy(root.and_then(|r| r.preemption_policy()), tree, &by_uid);
                        // One root reserves at a time: the first in admission order (highest
                        // priority, then longest waiting) that is not placed.
                        held.retain(|h| h.root != key);
                        let head = !held.iter().any(|h| h.priority >= tree.priority);
                        let step = self
                            .preempt_or_reserve(
                                &key,
                                tree,
                                &forest.trees,
                                &roots,
                                &leaf_modes,
                                policy,
                                head,
                                &snapshot,
                                &excluded_set,
                                &options,
                                &chooser,
                            )
                            .await;
                        match step {
                            Ok(Held::Preempting(nodes)) => {
                                held.push(Hold::nominated(tree.priority, &key, nodes));
                                soonest(Instant::now() + Duration::from_millis(500));
                            }
                            Ok(Held::Waiting { reserved, note }) => {
                                held.extend(reserved.map(|r| Hold::reserved(tree.priority, &key, r)));
                                self.clear_nominations(&key, tree, &by_uid).await;
                                let message = match note {
                                    Some(note) => format!("{}; {note}", decision.message()),
                                    None => decision.message(),
                                };
                                let reason = decision
                                    .explanation
                                    .as_ref()
                                    .map_or_else(|| "Unschedulable".into(), |e| e.metric_reason());
                                soonest(self.not_admitted(&key, tree, message, &reason, capacity));
                            }
                            Err(e) => soonest(self.root_error(&key, "preempt", &e)),
                        }
                    }
                }
            }
        }
        self.ctx.metrics.set_gangs_waiting(&pending.by_namespace);
        let decided_in = began.elapsed();
        for u in &forest.unresolved {
            tracing::debug!(namespace = %u.namespace, name = %u.name, reason = ?u.reason, "not admissible");
        }
        // Roots settling keep their status until the caches show their writes; a status write
        // would also move the resourceVersion a commit in flight fences its plan write by.
        let mut settled = settling.roots;
        settled.extend(self.in_flight.keys().cloned());
        // So do roots whose plan is being cleared: the clear writes their status.
        settled.extend(self.clears.iter().flat_map(|c| c.keys.iter().cloned()));
        let unmanaged = self.report_unmanaged(&unmanaged_pgs, &unmanaged_cpgs, &pods);
        // Plans whose pods all bound are cleared last, each with its status in the same patch.
        let groups = super::status::Groups { pgs: &pgs, cpgs: &cpgs, trees: &forest.trees };
        let (retry, clears) = self.write_statuses(groups, &by_group, &settled, unmanaged, done).await;
        if let Some(t) = retry {
            soonest(t);
        }
        if let Some(at) = self.clear_plans(clears).await {
            soonest(at);
        }
        // Nothing to decide until muster's own objects move: no root waits, is being admitted,
        // is followed or settles.
        self.calm = pending.total() == 0 && busy.is_empty() && settled.is_empty() && self.commits.is_empty();
        // Forget roots that are gone.
        let live: HashSet<RootKey> = forest.trees.iter().map(|t| RootKey::of(&t.namespace, &t.root)).collect();
        self.roots.retain(|k, _| live.contains(k) || busy.contains(k));
        tracing::debug!(
            roots = forest.trees.len(),
            settling = settled.len(),
            in_flight = self.in_flight.len(),
            pending = pending.total(),
            read_ms = read_in.as_millis(),
            snapshot_ms = (snapshot_in - read_in).as_millis(),
            follow_ms = (followed_in - snapshot_in).as_millis(),
            decide_ms = (decided_in - followed_in).as_millis(),
            status_ms = (began.elapsed() - decided_in).as_millis(),
            total_ms = began.elapsed().as_millis(),
            "admission cycle"
        );
        if self.metrics_source.is_some() || self.agent_health {
            // GPU health changes arrive by polling, not by watch events (the node agent's
            // samples do not wake a cycle: see trim::NodeFingerprints).
            soonest(Instant::now() + self.ctx.config.gpu_metrics_ttl);
        }
        Ok(wake)
    }

    /// A commit that did not go through (or could not go out): the root waits, backs off or is
    /// decided again. Returns when to look again; counts the root pending when it waits.
    fn commit_stopped(
        &mut self,
        key: &RootKey,
        tree: &GroupTree,
        decision: &Decision,
        result: Result<Committed>,
        capacity: u64,
        pending: &mut Pending,
    ) -> Option<Instant> {
        let (reason, why) = match result {
            Ok(Committed::Done) => return None,
            Ok(Committed::Stale) => return Some(Instant::now() + Duration::from_millis(100)),
            Err(e) => return Some(self.root_error(key, "commit its plan", &e)),
            Ok(Committed::Refused(r)) => {
                pending.add(&key.ns);
                self.ctx.metrics.attempt(crate::controllers::metrics::AttemptResult::Error);
                return Some(self.refused(key, tree, decision, &r));
            }
            Ok(Committed::TooLarge(why)) => ("PlanTooLarge", why),
            Ok(Committed::NotReady(why)) => ("ClaimsPending", why),
        };
        pending.add(&key.ns);
        Some(self.not_admitted(key, tree, why, reason, capacity))
    }

    /// Sends a prepared commit out on a task of its own: the next roots are decided meanwhile
    /// (their snapshot counts its pods already), and later cycles count them as in flight
    /// until it ends. Its end wakes a cycle, which books it.
    fn spawn_commit(&mut self, key: RootKey, job: CommitJob, decision: Decision) {
        let job = Arc::new(job);
        let (writer, signal, task_job) = (self.writer.clone(), self.signal.clone(), job.clone());
        writer.unseen().committing.insert(key.clone());
        // A status of its sent in a batch still waiting for its turn is dropped (see
        // `apply_statuses`): it must not count as sent.
        self.status_sent.remove(&key);
        let task = self.commits.spawn(async move {
            let result = writer.commit(&task_job).await;
            writer.unseen().committing.remove(&task_job.key);
            signal.wake();
            (task_job, result)
        });
        self.in_flight.insert(key, InFlight { job, decision, task: task.id() });
    }

    /// Moves the commits that ended since the last cycle to [`Admitter::ended`], with their
    /// decisions, to be booked. A task that panicked is logged and forgotten (its plan, if
    /// written, is followed like any other).
    fn ended_commits(&mut self) {
        while let Some(r) = self.commits.try_join_next_with_id() {
            match r {
                Ok((_, (job, result))) => {
                    if let Some(flight) = self.in_flight.remove(&job.key) {
                        self.ended.push((job, flight.decision, result));
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "a commit task failed; its plan is followed next cycle");
                    self.in_flight.retain(|_, f| f.task != e.id());
                    let in_flight = &self.in_flight;
                    self.writer.unseen().committing.retain(|k| in_flight.contains_key(k));
                }
            }
        }
    }

    /// When a root backing off after errors may be tried again (`None`: now).
    fn backing_off(&self, key: &RootKey, now: Instant) -> Option<Instant> {
        self.roots.get(key).and_then(|m| m.error_until).filter(|at| *at > now)
    }

    /// A root went through a cycle without error: its error backoff starts over.
    fn error_cleared(&mut self, key: &RootKey) {
        if let Some(m) = self.roots.get_mut(key) {
            m.errors = 0;
            m.error_until = None;
            m.error = None;
        }
    }

    /// The snapshot admission decides on: nodes and the pods on them, then GPUs: topology and
    /// health per node, and the ledger (the device pass first gives indices to GPU pods bound
    /// without muster, so admission plans around them). Returns the GPUs per node too.
    /// The pods of roots settling that the cluster state does not count yet (the cache still
    /// shows them gated) are counted as pinned, read under the same lock as the snapshot.
    async fn snapshot(
        &mut self,
        nodes: &[(String, Arc<GpuNode>)],
        settling: &Settling,
        by_uid: &HashMap<&str, &Arc<Pod>>,
        placed: HashMap<String, Placed>,
    ) -> Result<(Snapshot, Arc<ChooserNodes>)> {
        let (mut snapshot, uncounted, gpu_pods) = {
            let cluster = super::watches::lock(&self.caches.cluster);
            let uncounted: Vec<(&Arc<Pod>, &PlannedPod)> = settling
                .pins
                .iter()
                .filter_map(|(uid, planned)| by_uid.get(uid.as_str()).map(|pod| (*pod, planned)))
                .filter(|(pod, _)| !cluster.counts(pod))
                .collect();
            (cluster.snapshot(), uncounted, cluster.gpu_pods())
        };
        snapshot.set_placed(placed);
        snapshot.set_namespaces(
            self.caches
                .namespaces
                .state()
                .iter()
                .map(|n| (n.name_any(), n.metadata.labels.iter().flatten().collect::<scheduler::Labels>())),
        );
        let claims: Vec<_> = self.caches.claims.state().iter().map(|c| (**c).clone()).collect();
        let volumes: Vec<_> = self.caches.volumes.state().iter().map(|v| (**v).clone()).collect();
        let classes: Vec<_> = self.caches.classes.state().iter().map(|c| (**c).clone()).collect();
        snapshot.set_volumes(scheduler::Volumes::from_cluster(&claims, &volumes, &classes));
        self.gpu_state(nodes).await;
        snapshot.set_dra(self.dra_state(nodes));
        let gpus = self.gpu_models.shared();
        let held = self.devices.pass(&self.ctx, &gpu_pods, &snapshot, &*gpus);
        for (node, (_, g)) in gpus.iter() {
            // Devices allocated to any claim (muster's, kube-scheduler's) stay taken too: the
            // snapshot counts those already, so a node with nothing else used is left as is.
            let used = held.get(node).copied().unwrap_or_default().union(g.unhealthy());
            if !used.is_empty() {
                snapshot.set_gpu_used(node, used);
            }
        }
        for (pod, planned) in uncounted {
            reserve(&mut snapshot, pod, planned);
        }
        Ok((snapshot, gpus))
    }

    /// The API server refused a pod's patch in the dry run of a commit (a webhook, a policy):
    /// nothing was ungated. The root is reported and backed off like an error.
    fn refused(&mut self, key: &RootKey, tree: &GroupTree, decision: &Decision, r: &PatchRefused) -> Instant {
        let pod = decision.plan.iter().find(|p| p.uid == r.uid).map_or(r.uid.as_str(), |p| p.pod.as_str());
        let why = format!("the API server refused pinning pod {pod}, so no pod of the gang was ungated: {}", r.message);
        self.ctx.metrics.object_errors.get_or_create(&object_labels("Pod", "refused")).inc();
        let at = self.not_admitted(key, tree, why, "PinRefused", u64::MAX);
        let memory = self.roots.entry(key.clone()).or_default();
        memory.errors = memory.errors.saturating_add(1);
        let until = Instant::now() + error_backoff(memory.errors);
        memory.error_until = Some(until);
        at.max(until)
    }

    /// Each node's GPU model and health (kept between cycles: built again for the nodes whose
    /// inputs changed), refreshing the metrics cache when it is stale. What depends on every
    /// model (problems reported, the unhealthy GPUs) is worked out again only when one changed.
    async fn gpu_state(&mut self, nodes: &[(String, Arc<GpuNode>)]) {
        let now = std::time::SystemTime::now();
        if let Some(source) = &self.metrics_source
            && self.gpu_metrics.refresh(source, now).await
            && let Some(e) = self.gpu_metrics.last_error()
        {
            tracing::warn!(error = %e, "GPU metrics unavailable; scheduling on topology alone");
        }
        // A DRA node's GPUs are the devices its slices publish (it advertises no nvidia.com/gpu).
        let published = match &self.caches.dra {
            None => Arc::default(),
            Some(d) => {
                // Read before the store: a slice event after this reads them again next cycle.
                let seen = d.slice_changes.load(Ordering::Relaxed);
                match &self.published {
                    Some((at, p)) if *at == seen => p.clone(),
                    _ => {
                        let p = Arc::new(crate::devices::dra::published_gpus(
                            &state(&d.slices),
                            crate::devices::dra::NVIDIA_GPU_DRIVER,
                        ));
                        self.published = Some((seen, p.clone()));
                        p
                    }
                }
            }
        };
        let thresholds = self.thresholds();
        let kept = nodes.iter().map(|(name, g)| (name.as_str(), g));
        if !self.gpu_models.update(kept, &published, &self.gpu_metrics, &thresholds, now, &self.fits) {
            return;
        }
        let gpus = self.gpu_models.shared();
        self.agent_health = gpus.values().any(|(_, g)| g.agent_health);
        self.report_gpu_problems(nodes, &gpus);
        // Names copied only for the nodes that have some (5,000 nodes a cycle).
        let unhealthy: BTreeMap<String, GpuSet> = gpus
            .iter()
            .filter_map(|(n, (_, g))| {
                let u = g.unhealthy();
                (!u.is_empty()).then(|| (n.clone(), u))
            })
            .collect();
        if unhealthy != self.unhealthy {
            // Health changed: roots waiting in backoff may fit now (or no longer).
            self.capacity.fetch_add(1, Ordering::Relaxed);
            self.unhealthy = unhealthy;
        }
    }

    /// Tells operators, once per change, what keeps a node's GPUs from full use: a missing or
    /// malformed topology annotation, missing, stale or invalid metrics, GPUs too hot or full.
    /// A log line and an event on the Node, and `muster_gpu_node_problems{node, kind}`: one
    /// series per kind present, removed when it clears or the node goes.
    fn report_gpu_problems(&mut self, nodes: &[(String, Arc<GpuNode>)], gpus: &ChooserNodes) {
        let metrics_expected = self.metrics_source.is_some();
        let now: BTreeMap<String, Vec<GpuProblem>> = gpus
            .iter()
            .filter_map(|(n, (_, g))| {
                let p = g.problems(metrics_expected);
                (!p.is_empty()).then(|| (n.clone(), p))
            })
            .collect();
        if now == self.gpu_problems {
            return;
        }
        let mut events = Vec::new();
        for (name, node) in nodes {
            let (before, after) = (self.gpu_problems.get(name), now.get(name));
            if before == after {
                continue;
            }
            let object = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(name.clone()),
                uid: Some(node.uid().to_string()),
                ..Default::default()
            };
            let kinds: Vec<GpuProblemKind> = after.into_iter().flatten().map(|p| p.kind).collect();
            self.ctx.metrics.set_gpu_node_problems(name, &kinds);
            match after {
                Some(problems) => {
                    let note = problems.iter().map(|p| p.message.as_str()).collect::<Vec<_>>().join("; ");
                    tracing::warn!(node = %name, problems = %note, "GPU problems on node");
                    events.push((object, true, "GPUProblems", note));
                }
                None => {
                    tracing::info!(node = %name, "GPU problems on node cleared");
                    events.push((object, false, "GPUProblemsCleared", "GPU topology and metrics usable again".into()));
                }
            }
        }
        // Queued in the background, after the ones queued before (a node's events stay in
        // order), each waiting for room in the event writers' queue: thousands of nodes appearing
        // at once make one event each, and a cycle that waited for them decided nothing for
        // minutes.
        if !events.is_empty() {
            let (ctx, before) = (self.ctx.clone(), self.node_events.take());
            self.node_events = Some(crate::controllers::context::Detached::spawn(async move {
                if let Some(mut before) = before {
                    let _ = before.join().await;
                }
                for (object, warning, reason, note) in events {
                    ctx.event_waiting(&object, warning, reason, "Schedule", note).await;
                }
            }));
        }
        // Nodes gone: forget them.
        for name in self.gpu_problems.keys().filter(|n| !now.contains_key(*n)) {
            self.ctx.metrics.set_gpu_node_problems(name, &[]);
        }
        self.gpu_problems = now;
    }

    /// A root that does not fit (or cannot be committed): outcome, metric, an event once per
    /// message, and a doubling backoff that a capacity change cuts short.
    fn not_admitted(
        &mut self,
        key: &RootKey,
        tree: &GroupTree,
        message: String,
        reason: &str,
        capacity: u64,
    ) -> Instant {
        self.waiting(key, tree, Outcome::Unschedulable(message, reason.to_string()), reason, capacity)
    }

    /// Gated pods of an admitted root that do not fit: the root stays admitted, the pods wait.
    fn partly(&mut self, key: &RootKey, tree: &GroupTree, decision: &Decision, capacity: u64) -> Instant {
        let message = format!("{} gated pod(s) not admitted: {}", gated_count(tree), decision.message());
        let reason = decision.explanation.as_ref().map_or_else(|| "Unschedulable".into(), |e| e.metric_reason());
        self.waiting(key, tree, Outcome::Partly(message), &reason, capacity)
    }

    /// Gated pods that wait: the outcome, the metric, an event once per message, the backoff.
    fn waiting(&mut self, key: &RootKey, tree: &GroupTree, outcome: Outcome, reason: &str, capacity: u64) -> Instant {
        let at = self.back_off(key, capacity);
        self.ctx.metrics.unschedulable(reason);
        self.ctx.metrics.attempt(crate::controllers::metrics::AttemptResult::Unschedulable);
        let message = outcome.message().to_string();
        let memory = self.roots.entry(key.clone()).or_default();
        memory.outcome = Some(outcome);
        if memory.last_event.as_deref() != Some(message.as_str()) {
            memory.last_event = Some(message.clone());
            self.group_event(tree, true, "Unschedulable", &message);
        }
        at
    }

    /// The next placement attempt of a root that did not fit: 1 s doubled per failure, at
    /// most 60 s, sooner when capacity changes.
    fn back_off(&mut self, key: &RootKey, capacity: u64) -> Instant {
        let memory = self.roots.entry(key.clone()).or_default();
        memory.failures = memory.failures.saturating_add(1);
        let at = Instant::now() + error_backoff(memory.failures);
        memory.next_attempt = Some(at);
        memory.capacity_seen = capacity;
        at
    }
}

/// How many roots' commits are in flight at once.
const COMMIT_CONCURRENCY: usize = 32;

/// Finished pods (not of a rolled-back attempt) per PodGroup of a namespace.
fn finished_per_group(ns: &str, by_group: &HashMap<RootKey, Vec<&Pod>>) -> BTreeMap<String, u32> {
    by_group
        .iter()
        .filter(|(k, _)| k.ns == ns)
        .map(|(k, pods)| {
            let done = pods
                .iter()
                .filter(|p| crate::pods::is_finished(p))
                .filter(|p| !p.annotations().contains_key(crate::crds::ROLLED_BACK_ANNOTATION))
                .count();
            (k.name.clone(), u32::try_from(done).unwrap_or(u32::MAX))
        })
        .collect()
}

/// Gated pods in a tree.
fn gated_count(tree: &GroupTree) -> usize {
    let mut n = 0;
    super::visit(&tree.root, &mut |g| {
        if let Group::Leaf(l) = g {
            n += l.pods.iter().filter(|p| matches!(p.state, PodState::Gated { .. } | PodState::Invalid { .. })).count();
        }
    });
    n
}

/// The root group objects by key (a lookup per tree: a scan per tree was quadratic in the
/// groups, with two string copies per group looked at).
pub(super) fn roots_by_key<'a>(
    pgs: &'a [Arc<PodGroup>],
    cpgs: &'a [Arc<CompositePodGroup>],
) -> HashMap<RootKey, GroupRef<'a>> {
    pgs.iter().map(GroupRef::Leaf).chain(cpgs.iter().map(GroupRef::Composite)).map(|g| (g.key(), g)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reservation_keeps_lower_roots_off_and_a_nomination_its_own_priority_too() {
        let (holder, other) = (RootKey::leaf("ns", "holder"), RootKey::leaf("ns", "other"));
        let nodes = BTreeSet::from(["n0".to_string()]);
        let reserved = Hold::reserved(5, &holder, nodes.clone());
        let nominated = Hold::nominated(5, &holder, nodes);
        // (hold, the root's priority, the root, kept off)
        let cases = [
            (&reserved, 4, &other, true),
            (&reserved, 5, &other, false),
            (&reserved, 6, &other, false),
            (&nominated, 4, &other, true),
            (&nominated, 5, &other, true),
            (&nominated, 5, &holder, false),
            (&nominated, 6, &other, false),
        ];
        for (hold, priority, key, want) in cases {
            assert_eq!(hold.keeps(priority, key), want, "{hold:?} against {key} at {priority}");
        }
    }
}

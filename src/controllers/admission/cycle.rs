//! One admission cycle: read the caches, build the snapshot, follow the recorded plans, then
//! decide per root (quorum, placement) and commit or explain; last, write the statuses.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::{Resource, ResourceExt};

use super::commit::ROLLBACK_POLICY;
use super::status::Outcome;
use super::{Admitter, CONTROLLER, GroupRef, MAX_BACKOFF, MIN_BACKOFF, RootKey, World, group_pods, key_of, state};
use crate::controllers::PlacementStrategy;
use crate::controllers::context::{Error, Result};
use crate::controllers::metrics::ReasonLabels;
use crate::crds::scheduling::{CompositePodGroup, PodGroup};
use crate::devices::chooser::{NodeGpus, TopologyChooser, node_gpus};
use crate::devices::{GpuProblem, GpuProblemKind, GpuSet, HealthThresholds, SelectOptions};
use crate::scheduler::{self, Admission, Decision, Group, GroupTree, PlaceOptions, RollbackHistory, Scoring, Snapshot};

impl Admitter {
    fn place_options(&self) -> PlaceOptions {
        let scoring = match self.ctx.config.placement {
            PlacementStrategy::BinPack => Scoring::BinPack,
            PlacementStrategy::Spread => Scoring::Spread,
        };
        PlaceOptions { scoring, ..PlaceOptions::default() }
    }

    /// One admission cycle over every root. Returns when to wake up at the latest.
    pub(super) async fn cycle(&mut self) -> Result<Option<Instant>> {
        let _timer = self.ctx.metrics.reconcile(CONTROLLER);
        let pgs = state(&self.caches.pod_groups);
        let cpgs = state(&self.caches.composites);
        let pods = state(&self.caches.pods);
        let nodes = state(&self.caches.nodes);
        if !self.caches_caught_up(&pgs, &cpgs, &pods) {
            return Ok(Some(Instant::now() + Duration::from_millis(100)));
        }
        let (mut snapshot, gpus) = self.snapshot(&nodes, &pods).await?;
        let by_group = group_pods(&pods);
        let world = World {
            pods_by_uid: pods.iter().filter_map(|p| p.metadata.uid.as_deref().map(|u| (u, p))).collect(),
            pod_groups: &pgs,
            nodes: nodes.iter().filter_map(|n| n.metadata.name.as_deref()).collect(),
        };
        let mut wake: Option<Instant> = None;
        let mut soonest = |t: Instant| wake = Some(wake.map_or(t, |w| w.min(t)));

        // Plans in flight first: finish (or drop) them, watch binds, roll failed attempts back.
        let mut busy: HashSet<RootKey> = HashSet::new();
        let roots = pgs.iter().map(GroupRef::Leaf).chain(cpgs.iter().map(GroupRef::Composite));
        for group in roots {
            let Some(plan) = group.plan() else { continue };
            let key = group.key();
            busy.insert(key.clone());
            match self.follow_plan(&key, group, plan, &world, &mut snapshot).await {
                Ok(Some(t)) => soonest(t),
                Ok(None) => {}
                Err(e) => soonest(self.root_error(&key, group.is_composite(), "follow its plan", &e).await),
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
        let wall = Timestamp::now();
        let mut pending = 0;
        for tree in &mut forest.trees {
            let key = key_of(&tree.namespace, tree.root.name());
            if busy.contains(&key) {
                continue;
            }
            // What the root's status remembers of rollbacks: nodes to avoid, and a streak of
            // them that keeps the gang unschedulable for a while.
            let history = root_history(&pgs, &cpgs, tree);
            tree.avoid_nodes = history.avoided(wall);
            let memory = self.roots.entry(key.clone()).or_default();
            if let Some(retry) = history.retry_at(&ROLLBACK_POLICY).filter(|at| *at > wall) {
                if !matches!(memory.outcome, Some(Outcome::Unschedulable(_))) {
                    memory.outcome = Some(Outcome::Unschedulable(format!(
                        "{} attempts rolled back in a row after failed pins; retrying after {retry}",
                        history.recent
                    )));
                }
                soonest(now + retry.duration_since(wall).unsigned_abs());
                pending += 1;
                continue;
            }
            if let Some(at) = memory.next_attempt
                && at > now
                && memory.capacity_seen == capacity
            {
                soonest(at);
                pending += 1;
                continue;
            }
            let tree = &*tree;
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
                        if let Err(e) = self.commit(tree, &decision, &mut snapshot, &pods).await {
                            let composite = matches!(tree.root, Group::Composite(_));
                            soonest(self.root_error(&key, composite, "commit its plan", &e).await);
                        }
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

    /// The snapshot admission decides on: nodes and the pods on them, then GPUs: topology and
    /// health per node, and the ledger (the device pass first gives indices to GPU pods bound
    /// without muster, so admission plans around them). Returns the GPUs per node too.
    async fn snapshot(&mut self, nodes: &[Node], pods: &[Pod]) -> Result<(Snapshot, HashMap<String, NodeGpus>)> {
        let mut snapshot = Snapshot::from_cluster(nodes, pods);
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
        let gpus = self.gpu_state(nodes).await;
        let held = self.devices.pass(&self.ctx, pods, &snapshot, &gpus).await;
        for (node, g) in &gpus {
            let used = held.get(node).copied().unwrap_or_default().union(g.unhealthy());
            snapshot.set_gpu_used(node, used);
        }
        Ok((snapshot, gpus))
    }

    /// Reports an error met on one root (log, metric, event on the group) and says when to try
    /// it again; the cycle goes on with the other roots.
    async fn root_error(&mut self, key: &RootKey, composite: bool, what: &str, e: &Error) -> Instant {
        self.ctx.metrics.reconcile_error(CONTROLLER, e.metric_label());
        tracing::warn!(namespace = %key.0, root = %key.1, error = %e, "admission could not {what}");
        let note = format!("admission could not {what}: {e}");
        if let Some(r) = self.root_refs(&key.0, &key.1, composite).into_iter().next() {
            self.ctx.event(&r, true, "AdmissionError", "Admit", note).await;
        }
        Instant::now() + MIN_BACKOFF
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
        let unhealthy: BTreeMap<String, GpuSet> =
            gpus.iter().map(|(n, g)| (n.clone(), g.unhealthy())).filter(|(_, u)| !u.is_empty()).collect();
        if unhealthy != self.unhealthy {
            // Health changed: roots waiting in backoff may fit now (or no longer).
            self.capacity.fetch_add(1, Ordering::Relaxed);
            self.unhealthy = unhealthy;
        }
        gpus
    }

    /// Tells operators, once per change, what keeps a node's GPUs from full use: a missing or
    /// malformed topology annotation, missing, stale or invalid metrics, GPUs too hot or full.
    /// A log line and an event on the Node, and `muster_gpu_node_problems{node, kind}`: one
    /// series per kind present, removed when it clears or the node goes.
    async fn report_gpu_problems(&mut self, nodes: &[Node], gpus: &HashMap<String, NodeGpus>) {
        let metrics_expected = self.metrics_source.is_some();
        let now: BTreeMap<String, Vec<GpuProblem>> = gpus
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
            let kinds: Vec<GpuProblemKind> = after.into_iter().flatten().map(|p| p.kind).collect();
            self.ctx.metrics.set_gpu_node_problems(&name, &kinds);
            match after {
                Some(problems) => {
                    let note = problems.iter().map(|p| p.message.as_str()).collect::<Vec<_>>().join("; ");
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
            self.ctx.metrics.set_gpu_node_problems(name, &[]);
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
        self.ctx.metrics.unschedulable_attempts.get_or_create(&ReasonLabels { reason }).inc();
        if memory.last_event.as_deref() != Some(message.as_str()) {
            memory.last_event = Some(message.clone());
            self.group_event(tree, true, "Unschedulable", &message).await;
        }
        at
    }
}

/// The rollback history on the status of a tree's root.
fn root_history(pgs: &[PodGroup], cpgs: &[CompositePodGroup], tree: &GroupTree) -> RollbackHistory {
    let name = tree.root.name();
    let same = |ns: Option<String>, n: String| ns.as_deref() == Some(tree.namespace.as_str()) && n == name;
    let root = match &tree.root {
        Group::Leaf(_) => pgs.iter().find(|g| same(g.namespace(), g.name_any())).map(GroupRef::Leaf),
        Group::Composite(_) => cpgs.iter().find(|g| same(g.namespace(), g.name_any())).map(GroupRef::Composite),
    };
    root.map(|r| r.history()).unwrap_or_default()
}

//! The cluster kept up to date from watch events: each node and pod is read once, when its
//! event arrives ([`NodeInfo::from_node`], [`PodUsage::of`]), and a [`Snapshot`] is assembled
//! from what was read, with no object read again. Assembling equals
//! [`Snapshot::from_cluster`] on the same objects (a property test holds it to that); what
//! changes is the cost: an event costs one object's reading, a cycle no parsing at all.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::{Node, Pod};

use super::snapshot::{NodeInfo, PodUsage, Snapshot, SnapshotError};
use crate::devices::chooser::{GpuNode, GpuReport};
use crate::pods::GpuPod;
use muster_api::NodeGPUReport;

/// One watch event, as the kept state reads it: an object added or changed, or deleted, and a
/// relist (its start, each object it lists, its end, which drops what it did not list).
#[derive(Debug)]
pub enum Change<'a, K> {
    /// Added or changed.
    Applied(&'a K),
    /// Deleted.
    Deleted(&'a K),
    /// A relist starts.
    RelistStarted,
    /// An object of the relist.
    Relisted(&'a K),
    /// The relist is complete: what it did not list is gone.
    RelistDone,
}

// By hand: derived, they would ask `K: Copy` of the objects only referred to.
impl<K> Clone for Change<'_, K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K> Copy for Change<'_, K> {}

/// What is kept of one kind, by object key (in key order: a snapshot's nodes come out sorted
/// by name, so assembling one does not sort 5,000 names again), and the keys the relist in
/// progress has listed.
#[derive(Clone, Debug)]
struct Kept<V> {
    by_key: BTreeMap<String, V>,
    listed: Option<HashSet<String>>,
}

impl<V> Default for Kept<V> {
    fn default() -> Self {
        Self { by_key: BTreeMap::new(), listed: None }
    }
}

impl<V: PartialEq> Kept<V> {
    /// Applies one event, objects keyed by `key` and read by `read` (`None`: nothing to keep);
    /// returns whether what is kept changed.
    fn change<K>(&mut self, change: Change<'_, K>, key: impl Fn(&K) -> String, read: impl Fn(&K) -> Option<V>) -> bool {
        match change {
            Change::Applied(o) => self.upsert(key(o), read(o)),
            Change::Deleted(o) => self.by_key.remove(&key(o)).is_some(),
            Change::RelistStarted => {
                self.listed = Some(HashSet::new());
                false
            }
            Change::Relisted(o) => {
                let k = key(o);
                self.listed.get_or_insert_default().insert(k.clone());
                self.upsert(k, read(o))
            }
            Change::RelistDone => {
                let listed = self.listed.take().unwrap_or_default();
                let before = self.by_key.len();
                self.by_key.retain(|k, _| listed.contains(k));
                self.by_key.len() != before
            }
        }
    }

    fn upsert(&mut self, key: String, value: Option<V>) -> bool {
        match value {
            Some(v) if self.by_key.get(&key) == Some(&v) => false,
            Some(v) => {
                self.by_key.insert(key, v);
                true
            }
            None => self.by_key.remove(&key).is_some(),
        }
    }
}

/// Nodes and pod usage as the watches last showed them.
#[derive(Clone, Debug, Default)]
pub struct ClusterState {
    /// By node name: the node as read, or why it cannot be offered.
    nodes: Kept<Result<NodeInfo, SnapshotError>>,
    /// By node name: what the GPU model reads of the node ([`GpuNode`]): admission keeps no
    /// copy of the nodes.
    gpu_nodes: Kept<Arc<GpuNode>>,
    /// By node name: what the GPU model reads of the node's NodeGPUReport ([`GpuReport`]).
    gpu_reports: Kept<Arc<GpuReport>>,
    /// By node name: each kept node with its report's health and assignments when it has one
    /// ([`GpuNode::with_report`]), joined when either changes: what [`Self::gpu_nodes`] gives.
    gpu_joined: BTreeMap<String, Arc<GpuNode>>,
    /// By namespace/name: what each pod that uses something uses.
    pods: Kept<PodUsage>,
    /// By namespace/name: what the GPU pass reads of each pod it has to do with
    /// ([`GpuPod`]): admission keeps no copy of the pods that are not muster's.
    gpu_pods: Kept<Arc<GpuPod>>,
    /// Bumped by every change that alters what a snapshot would hold.
    generation: u64,
    /// The snapshot of the nodes alone (no pod counted yet), assembled once per change of
    /// the nodes: a cycle's snapshot starts from a copy of it instead of sorting and indexing
    /// 5,000 nodes again (most cycles see pods change, few see nodes change).
    nodes_only: std::sync::OnceLock<Snapshot>,
}

fn node_key(node: &Node) -> String {
    node.metadata.name.clone().unwrap_or_default()
}

fn report_key(report: &NodeGPUReport) -> String {
    report.metadata.name.clone().unwrap_or_default()
}

fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

impl ClusterState {
    /// The state of these lists (what a relist gives).
    pub fn from_lists<'a>(nodes: impl IntoIterator<Item = &'a Node>, pods: impl IntoIterator<Item = &'a Pod>) -> Self {
        let mut state = Self::default();
        for node in nodes {
            state.apply_node(node);
        }
        for pod in pods {
            state.apply_pod(pod);
        }
        state
    }

    /// A node watch event; returns whether what a snapshot holds changed.
    pub fn node_changed(&mut self, change: Change<'_, Node>) -> bool {
        self.gpu_nodes.change(change, node_key, |n| Some(Arc::new(GpuNode::of(n))));
        self.join(change, node_key);
        let changed = self.nodes.change(change, node_key, |n| Some(NodeInfo::from_node(n)));
        self.generation += u64::from(changed);
        if changed {
            self.nodes_only = std::sync::OnceLock::new();
        }
        changed
    }

    /// A NodeGPUReport watch event (the node agent's health and assignments, which override
    /// the node's annotations of them); returns whether what the GPU model reads of its node
    /// changed. A report of a node not kept changes nothing until that node comes.
    pub fn report_changed(&mut self, change: Change<'_, NodeGPUReport>) -> bool {
        self.gpu_reports.change(change, report_key, |r| Some(Arc::new(GpuReport::of(r))));
        self.join(change, report_key)
    }

    /// Joins node and report again where `change` may have changed either; returns whether a
    /// joined node changed.
    fn join<K>(&mut self, change: Change<'_, K>, key: fn(&K) -> String) -> bool {
        match change {
            Change::Applied(o) | Change::Deleted(o) | Change::Relisted(o) => self.join_one(key(o)),
            Change::RelistStarted => false,
            Change::RelistDone => {
                let names: Vec<String> = self.gpu_nodes.by_key.keys().chain(self.gpu_joined.keys()).cloned().collect();
                names.into_iter().fold(false, |changed, name| self.join_one(name) | changed)
            }
        }
    }

    fn join_one(&mut self, name: String) -> bool {
        let joined =
            self.gpu_nodes.by_key.get(&name).map(|g| g.with_report(self.gpu_reports.by_key.get(&name).map(|r| &**r)));
        match joined {
            Some(j) if self.gpu_joined.get(&name).is_some_and(|o| Arc::ptr_eq(o, &j) || **o == *j) => false,
            Some(j) => {
                self.gpu_joined.insert(name, j);
                true
            }
            None => self.gpu_joined.remove(&name).is_some(),
        }
    }

    /// A pod watch event; returns whether what the pods use changed (what the GPU pass reads
    /// of them is kept too, but changes no snapshot).
    pub fn pod_changed(&mut self, change: Change<'_, Pod>) -> bool {
        self.gpu_pods.change(change, pod_key, |p| GpuPod::of(p).map(Arc::new));
        let changed = self.pods.change(change, pod_key, PodUsage::of);
        self.generation += u64::from(changed);
        changed
    }

    /// A node added or changed: [`Change::Applied`].
    pub fn apply_node(&mut self, node: &Node) -> bool {
        self.node_changed(Change::Applied(node))
    }

    /// A pod added or changed: [`Change::Applied`].
    pub fn apply_pod(&mut self, pod: &Pod) -> bool {
        self.pod_changed(Change::Applied(pod))
    }

    /// Bumped by every change: equal generations, equal snapshots.
    /// Whether the snapshot counts `pod` (bound, or pinned and ungated, and not finished), as
    /// this state last saw it.
    pub fn counts(&self, pod: &Pod) -> bool {
        self.pods.by_key.contains_key(&pod_key(pod))
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// What the GPU model reads of each node, by name, in name order.
    pub fn gpu_nodes(&self) -> Vec<(String, Arc<GpuNode>)> {
        self.gpu_joined.iter().map(|(name, g)| (name.clone(), g.clone())).collect()
    }

    /// What the GPU pass reads of the pods it has to do with, in key order.
    pub fn gpu_pods(&self) -> Vec<Arc<GpuPod>> {
        self.gpu_pods.by_key.values().cloned().collect()
    }

    /// How many nodes, and how many pods using something.
    pub fn len(&self) -> (usize, usize) {
        (self.nodes.by_key.len(), self.pods.by_key.len())
    }

    /// The snapshot of the state: [`Snapshot::from_cluster`] of the objects applied last,
    /// assembled without reading them again.
    pub fn snapshot(&self) -> Snapshot {
        let mut snapshot = self
            .nodes_only
            .get_or_init(|| {
                let mut problems = Vec::new();
                let infos = self
                    .nodes
                    .by_key
                    .values()
                    .filter_map(|n| n.as_ref().map_err(|e| problems.push(e.clone())).ok().cloned())
                    .collect();
                Snapshot::with_problems(infos, problems)
            })
            .clone();
        snapshot.reserve_pods(self.pods.by_key.len());
        for usage in self.pods.by_key.values() {
            snapshot.add_usage(usage);
        }
        snapshot
    }
}

/// Whether an admission cycle has anything to do: not when no event woke it since the last
/// cycle, the kept state is as that cycle saw it, and none of that cycle's timers (a backoff,
/// a bind timeout, a metrics refresh) is due. Then the last cycle's conclusions stand.
#[derive(Clone, Debug, Default)]
pub struct Quiet {
    /// Events counted, state generation and next timer at the start of the last cycle.
    last: Option<(u64, u64, Option<Instant>)>,
}

impl Quiet {
    /// A cycle started at `events` and `generation` ran through; `wake` is its next timer.
    pub fn cycled(&mut self, events: u64, generation: u64, wake: Option<Instant>) {
        self.last = Some((events, generation, wake));
    }

    /// Whether a cycle now would have nothing to do.
    pub fn nothing_to_do(&self, events: u64, generation: u64, now: Instant) -> bool {
        self.last.is_some_and(|(e, g, wake)| e == events && g == generation && wake.is_none_or(|w| now < w))
    }

    /// The last cycle's next timer.
    pub fn wake(&self) -> Option<Instant> {
        self.last.and_then(|(_, _, w)| w)
    }
}

#[cfg(test)]
mod tests;

//! The cluster kept up to date from watch events: each node and pod is read once, when its
//! event arrives ([`NodeInfo::from_node`], [`PodUsage::of`]), and a [`Snapshot`] is assembled
//! from what was read, with no object read again. Assembling equals
//! [`Snapshot::from_cluster`] on the same objects (a property test holds it to that); what
//! changes is the cost: an event costs one object's reading, a cycle no parsing at all.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use k8s_openapi::api::core::v1::{Node, Pod};

use super::snapshot::{NodeInfo, PodUsage, Snapshot, SnapshotError};

/// Nodes and pod usage as the watches last showed them.
#[derive(Clone, Debug, Default)]
pub struct ClusterState {
    /// By node name: the node as read, or why it cannot be offered.
    nodes: BTreeMap<String, Result<NodeInfo, SnapshotError>>,
    /// By namespace/name: what each pod that uses something uses.
    pods: HashMap<String, PodUsage>,
    /// Bumped by every change that alters what a snapshot would hold.
    generation: u64,
}

/// The key a pod is kept by: `namespace/name`.
pub fn pod_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
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

    /// A node added or changed; returns whether what a snapshot holds changed.
    pub fn apply_node(&mut self, node: &Node) -> bool {
        let name = node.metadata.name.clone().unwrap_or_default();
        let info = NodeInfo::from_node(node);
        if self.nodes.get(&name) == Some(&info) {
            return false;
        }
        self.nodes.insert(name, info);
        self.generation += 1;
        true
    }

    /// A node deleted; returns whether it was there.
    pub fn delete_node(&mut self, name: &str) -> bool {
        let gone = self.nodes.remove(name).is_some();
        self.generation += u64::from(gone);
        gone
    }

    /// A pod added or changed; returns whether what it uses changed.
    pub fn apply_pod(&mut self, pod: &Pod) -> bool {
        let key = pod_key(
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            pod.metadata.name.as_deref().unwrap_or_default(),
        );
        let changed = match PodUsage::of(pod) {
            Some(usage) if self.pods.get(&key) == Some(&usage) => false,
            Some(usage) => {
                self.pods.insert(key, usage);
                true
            }
            None => self.pods.remove(&key).is_some(),
        };
        self.generation += u64::from(changed);
        changed
    }

    /// A pod deleted; returns whether it used anything.
    pub fn delete_pod(&mut self, namespace: &str, name: &str) -> bool {
        let gone = self.pods.remove(&pod_key(namespace, name)).is_some();
        self.generation += u64::from(gone);
        gone
    }

    /// Keeps the nodes (by name) `keep` says to: the end of a relist drops what it did not list.
    pub fn retain_nodes(&mut self, mut keep: impl FnMut(&str) -> bool) -> bool {
        let before = self.nodes.len();
        self.nodes.retain(|name, _| keep(name));
        let changed = self.nodes.len() != before;
        self.generation += u64::from(changed);
        changed
    }

    /// Keeps the pods (by [`pod_key`]) `keep` says to.
    pub fn retain_pods(&mut self, mut keep: impl FnMut(&str) -> bool) -> bool {
        let before = self.pods.len();
        self.pods.retain(|key, _| keep(key));
        let changed = self.pods.len() != before;
        self.generation += u64::from(changed);
        changed
    }

    /// Bumped by every change: equal generations, equal snapshots.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// How many nodes, and how many pods using something.
    pub fn len(&self) -> (usize, usize) {
        (self.nodes.len(), self.pods.len())
    }

    /// Whether no node and no pod is known.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty() && self.pods.is_empty()
    }

    /// The snapshot of the state: [`Snapshot::from_cluster`] of the objects applied last,
    /// assembled without reading them again.
    pub fn snapshot(&self) -> Snapshot {
        let mut problems = Vec::new();
        let infos = self
            .nodes
            .values()
            .filter_map(|n| n.as_ref().map_err(|e| problems.push(e.clone())).ok().cloned())
            .collect();
        let mut snapshot = Snapshot::with_problems(infos, problems);
        for usage in self.pods.values() {
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

//! The decision's working state ([`Engine`]): what it added to each node, layered over the
//! snapshot, with the placed pods as the undo log, so a failed gang releases what it took.

use super::{Facts, PlaceOptions, PlacedPod};
use crate::devices::GpuSet;
use crate::scheduler::gpu::GpuChooser;
use crate::scheduler::resources::Resources;
use crate::scheduler::shape::PodShape;
use crate::scheduler::snapshot::{NodeInfo, Snapshot};
use crate::scheduler::tree::LeafGroup;

/// Why a root does not use a node it could otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Avoid {
    No,
    /// kube-scheduler refused a pin of the root's pods there recently.
    Refused,
    /// A root of higher priority waits for it (its reservation or preemption nomination).
    Reserved,
}

/// No overlay slot yet for this node.
const NO_SLOT: u32 = u32::MAX;

/// What this decision has added to one node.
pub(super) struct Delta {
    pub(super) requested: Resources,
    pub(super) gpu_used: GpuSet,
}

/// One pod placed so far in the decision; also the undo log entry.
pub(super) struct Tentative<'a> {
    pub(super) leaf: &'a LeafGroup,
    pub(super) pod: usize,
    pub(super) node: u32,
    pub(super) shape: &'a PodShape,
    pub(super) gpus: GpuSet,
}

impl Tentative<'_> {
    pub(super) fn placed(&self, snapshot: &Snapshot) -> PlacedPod {
        let pod = &self.leaf.pods[self.pod];
        let node = &snapshot.nodes()[self.node as usize];
        PlacedPod {
            pod: pod.name.clone(),
            uid: pod.uid.clone(),
            pod_group: self.leaf.name.clone(),
            node: node.name.clone(),
            hostname: node.hostname().unwrap_or(&node.name).to_string(),
            gpus: self.gpus,
        }
    }
}

/// One decision in progress: the snapshot and knobs it reads, and what it placed so far.
pub(super) struct Engine<'a> {
    pub(super) snapshot: &'a Snapshot,
    pub(super) options: &'a PlaceOptions,
    pub(super) gpus: &'a dyn GpuChooser,
    /// What the root's shapes need that does not change within the decision.
    pub(super) facts: &'a Facts<'a>,
    /// The root's namespace.
    pub(super) namespace: &'a str,
    /// Per node: index into `deltas`, or `NO_SLOT`.
    slot: Vec<u32>,
    deltas: Vec<Delta>,
    pub(super) plan: Vec<Tentative<'a>>,
    /// Per node: whether the root avoids it, and why.
    pub(super) avoided: Vec<Avoid>,
    /// Where the next one-pod scan starts.
    pub(super) rotation: std::cell::Cell<usize>,
}

impl<'a> Engine<'a> {
    pub(super) fn new(
        snapshot: &'a Snapshot,
        options: &'a PlaceOptions,
        gpus: &'a dyn GpuChooser,
        facts: &'a Facts<'a>,
    ) -> Self {
        Self {
            snapshot,
            options,
            gpus,
            facts,
            namespace: "",
            slot: vec![NO_SLOT; snapshot.nodes().len()],
            deltas: Vec::new(),
            plan: Vec::new(),
            avoided: vec![Avoid::No; snapshot.nodes().len()],
            rotation: std::cell::Cell::new(0),
        }
    }

    pub(super) fn node(&self, i: u32) -> &'a NodeInfo {
        &self.snapshot.nodes()[i as usize]
    }

    pub(super) fn delta(&self, node: u32) -> Option<&Delta> {
        match self.slot[node as usize] {
            NO_SLOT => None,
            s => self.deltas.get(s as usize),
        }
    }

    pub(super) fn gpu_used(&self, node: u32) -> GpuSet {
        self.node(node).gpu_used.union(self.delta(node).map_or(GpuSet::EMPTY, |d| d.gpu_used))
    }

    pub(super) fn apply(&mut self, t: Tentative<'a>) {
        let slot = &mut self.slot[t.node as usize];
        if *slot == NO_SLOT {
            *slot = u32::try_from(self.deltas.len()).unwrap_or(NO_SLOT);
            self.deltas.push(Delta { requested: Resources::new(), gpu_used: GpuSet::EMPTY });
        }
        let delta = &mut self.deltas[*slot as usize];
        delta.requested.add(&t.shape.requests);
        delta.gpu_used = delta.gpu_used.union(t.gpus);
        self.plan.push(t);
    }

    /// Undoes every placement after `checkpoint`.
    pub(super) fn rollback(&mut self, checkpoint: usize) {
        while self.plan.len() > checkpoint {
            let Some(t) = self.plan.pop() else { break };
            if let Some(delta) = self.deltas.get_mut(self.slot[t.node as usize] as usize) {
                delta.requested.sub(&t.shape.requests);
                delta.gpu_used = delta.gpu_used.difference(t.gpus);
            }
        }
    }
}

//! The face of a placement: its knobs ([`PlaceOptions`], [`Scoring`]), its outcome
//! ([`Decision`], [`PlacedPod`], [`Admission`]), and [`decide`] / [`place`], which run one
//! decision over a root.

use std::sync::Arc;

use super::{Avoid, Engine, Facts};
use crate::devices::{GpuSet, format_indices};
use crate::scheduler::dra::SharedChoice;
use crate::scheduler::explain::Explanation;
use crate::scheduler::gpu::GpuChooser;
use crate::scheduler::quorum::{Quorum, QuorumShortfall, quorum};
use crate::scheduler::snapshot::Snapshot;
use crate::scheduler::tree::GroupTree;
use muster_api::scheduling::PlannedPod;

/// How nodes that fit are ranked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Scoring {
    /// Fullest nodes first, keeping large holes for large gangs (kube's MostAllocated).
    #[default]
    BinPack,
    /// Emptiest nodes first, one pod per node before any node gets a second (LeastAllocated).
    Spread,
}

/// Knobs of a placement decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlaceOptions {
    /// Node ranking.
    pub scoring: Scoring,
    /// Weight of the resource score (0..=100 per node).
    pub resource_weight: u32,
    /// Weight of the GPU locality score the [`GpuChooser`] gives (0..=100 per node).
    pub gpu_weight: u32,
}

impl Default for PlaceOptions {
    fn default() -> Self {
        Self { scoring: Scoring::BinPack, resource_weight: 1, gpu_weight: 1 }
    }
}

/// One pod of the plan: where it goes and which GPUs it gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacedPod {
    /// Pod name.
    pub pod: String,
    /// Pod UID.
    pub uid: String,
    /// The pod's PodGroup.
    pub pod_group: String,
    /// Node name.
    pub node: String,
    /// The node's `kubernetes.io/hostname` label value, which the pin selects on.
    pub hostname: String,
    /// The GPU indices the pod gets.
    pub gpus: GpuSet,
}

impl PlacedPod {
    /// The `gpu.muster.dev/indices` annotation value, for GPU pods.
    pub fn gpu_indices_annotation(&self) -> Option<String> {
        (!self.gpus.is_empty()).then(|| format_indices(self.gpus))
    }
}

impl From<&PlacedPod> for PlannedPod {
    fn from(p: &PlacedPod) -> Self {
        PlannedPod {
            name: p.pod.clone(),
            uid: p.uid.clone(),
            pod_group: p.pod_group.clone(),
            node: p.node.clone(),
            hostname: if p.hostname == p.node { String::new() } else { p.hostname.clone() },
            gpu_indices: p.gpu_indices_annotation(),
            claims: Vec::new(),
        }
    }
}

/// The outcome of placing one root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The root group's name.
    pub root: String,
    /// True when the root's policy is satisfied: commit the plan.
    pub admitted: bool,
    /// Pods to admit (empty unless `admitted`), in placement order.
    pub plan: Vec<PlacedPod>,
    /// Why the root, or some of its groups or pods, were not placed.
    pub explanation: Option<Explanation>,
    /// Named DRA claims the plan's pods use that muster is to allocate, with their devices.
    pub shared_claims: Vec<Arc<SharedChoice>>,
}

impl Decision {
    /// One line for the root's status.
    pub fn message(&self) -> String {
        let placed = format!("placed {} pod(s) of group \"{}\"", self.plan.len(), self.root);
        match (&self.explanation, self.admitted) {
            (None, true) => placed,
            (Some(e), true) => format!("{placed}; {e}"),
            (Some(e), false) => e.to_string(),
            (None, false) => format!("group \"{}\" did not fit", self.root),
        }
    }
}

/// What the admission reconciler does with a root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Not quorate: keep waiting for pods or groups.
    Waiting(QuorumShortfall),
    /// Quorate, with no gated pod left to place.
    NothingGated,
    /// Placement ran: commit the plan if admitted, otherwise report the explanation.
    Decided(Decision),
}

/// Quorum (PreEnqueue), then placement for a quorate root with gated pods.
pub fn decide(snapshot: &Snapshot, tree: &GroupTree, options: &PlaceOptions, gpus: &dyn GpuChooser) -> Admission {
    match quorum(tree) {
        Quorum::Waiting(shortfall) => Admission::Waiting(shortfall),
        Quorum::NothingGated => Admission::NothingGated,
        Quorum::Ready => Admission::Decided(place(snapshot, tree, options, gpus)),
    }
}

/// Places every gated pod of the root in one decision. A gang PodGroup gets at least
/// `minCount` placed pods (counting those admitted or bound before) or none; a gang
/// CompositePodGroup gets at least `minGroupCount` placed children or none; basic groups get
/// what fits. Gang children are tried before basic ones, so basic pods never take room a gang
/// of the same composite needs, and a failed gang's room goes to the groups after it.
pub fn place(snapshot: &Snapshot, tree: &GroupTree, options: &PlaceOptions, gpus: &dyn GpuChooser) -> Decision {
    let all: Vec<u32> = (0..u32::try_from(snapshot.nodes().len()).unwrap_or(u32::MAX)).collect();
    let facts = Facts::new(snapshot, tree);
    let mut engine = Engine::new(snapshot, options, gpus, &facts);
    engine.namespace = &tree.namespace;
    for name in &tree.reserved_nodes {
        if let Some(i) = snapshot.index_of(name) {
            engine.avoided[i as usize] = Avoid::Reserved;
        }
    }
    for name in &tree.avoid_nodes {
        if let Some(i) = snapshot.index_of(name) {
            engine.avoided[i as usize] = Avoid::Refused;
        }
    }
    let attempt = engine.place_group(&tree.root, &all, None);
    let plan = engine.plan.iter().map(|t| t.placed(snapshot)).collect();
    let shared_claims = facts.shared_claims.values().filter(|c| c.allocate).cloned().collect();
    Decision {
        root: tree.root.name().to_string(),
        admitted: attempt.success,
        plan,
        explanation: attempt.explanation,
        shared_claims,
    }
}

//! PURE: admission decisions for gangs. A [`Snapshot`] of nodes and their usage, a
//! [`GroupTree`] per root (PodGroups with their pods, CompositePodGroups with their children),
//! [`quorum`] (upstream PreEnqueue) and [`place`] (one all-or-nothing decision per root, with
//! upstream PlacementFeasible) that returns a plan or an explanation.
//! No client, no clock, no randomness: the controllers read the cluster and commit the plan.
//!
//! The admission reconciler's path through it:
//! 1. [`Snapshot::from_cluster`] over the Node and Pod lists, then [`Snapshot::set_gpu_used`]
//!    from the GPU ledger;
//! 2. [`build_forest`] over the PodGroup, CompositePodGroup and Pod lists, and
//!    [`sort_for_admission`] on its trees;
//! 3. per tree, [`decide`] (or [`quorum`] then [`place`]): commit an admitted
//!    [`Decision::plan`], or write [`Decision::message`] / [`QuorumShortfall`] to status;
//! 4. per recorded plan, [`next_step`] (the commit protocol: resume, wait for binds, roll a
//!    failed attempt back), and [`RollbackHistory`] for the nodes the next plans avoid.

mod cluster;
mod commit;
mod dra;
mod explain;
mod gpu;
mod interpod;
mod judges;
mod placement;
mod preempt;
mod quantity;
mod quorum;
mod resources;
mod shape;
mod snapshot;
pub mod status;
mod tree;
mod unmodelled;
mod volumes;

#[cfg(test)]
mod interpod_properties;
#[cfg(test)]
mod properties;

pub use cluster::{Change, ClusterState, Quiet};
pub use commit::{
    CommitInput, Disrupted, FailureCause, GatedPin, GroupCount, PatchRefused, PinFailure, PinState, PlannedPodNow,
    Refusal, RemainingFits, RollBack, RollbackHistory, RollbackPolicy, StartRequirement, Step, disrupted, next_step,
    remaining_fits,
};
pub use dra::{
    ClaimInfo, ClaimSource, ClaimWrite, DeviceLoss, Dra, MAX_RESERVED_FOR, PodClaim, ShapeClaims, SharedChoice,
    own_claim_names, own_claims, own_writes, pod_claims, shared_writes,
};
pub use explain::{
    ChildrenUnplaced, DomainConflict, Explanation, ExplanationKind, FilterReason, PodsUnplaced, ReasonCount,
    TooFewPods, TopologyUnplaced,
};
pub use gpu::{GpuChoice, GpuChooser, LowestFreeIndices};
pub use interpod::{HostPort, PodRules, PodTerm, Selector, SpreadConstraint, WeightedTerm, host_ports};
pub use judges::pod_update_judges;
pub use placement::{
    Admission, Decision, Feasibility, PlaceOptions, PlacedPod, Scoring, decide, place, placement_feasible,
};
pub use preempt::{
    EXACT_UNITS, NoPreemption, Preemption, VictimGroup, VictimMode, VictimPod, VictimUnit, cost, nominated_against,
    preempt, reservation, units, unmanaged_victims, victim_groups,
};
pub use quantity::{QuantityError, parse_milli_value, parse_value};
pub use quorum::{Quorum, QuorumShortfall, is_quorate, quorum};
pub use resources::{CPU, EPHEMERAL_STORAGE, MEMORY, PODS, ResourceError, Resources, pod_requests};
pub(crate) use shape::terms_from_k8s;
pub use shape::{
    NodeSelectorTerm, Operator, PodShape, Requirement, ShapeError, Taint, TaintEffect, Toleration,
    UNSCHEDULABLE_TAINT_KEY,
};
pub use snapshot::{Labels, NodeInfo, NodePod, PodUsage, Snapshot, SnapshotError, Target, Unusable, VictimInfo};
pub use tree::{
    CompositeGroup, CompositePolicy, Forest, Group, GroupPod, GroupTree, LeafGroup, LeafPolicy, PodState, Unresolved,
    UnresolvedReason, build_forest, sort_for_admission,
};
pub use unmodelled::{DEFAULT_SCHEDULER, Unmodelled, shared_claim_warnings, unmodelled};
pub use volumes::{ClaimState, VolumeConflict, VolumeNodes, Volumes};

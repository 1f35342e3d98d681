//! PURE GPU logic: the node GPU topology model, index selection, health, node scoring, the
//! GPU ledger, and the nvidia-smi parsers and driver probe results behind `muster node-agent`.
//! Plain data in, plain data out: no Kubernetes client, no clock and no randomness here
//! (callers pass `now`).
//!
//! A gang scheduler uses it in this order, per node and pod:
//! [`GpuTopology::from_node`] -> [`healthy_mask`] -> [`available`] (healthy minus
//! [`Ledger::used_mask`]) -> [`node_score`] to rank nodes -> [`select()`] (inside the score)
//! -> [`Ledger::assign`].

pub mod chooser;
pub mod dra;
pub mod gpuset;
pub mod health;
pub mod ledger;
pub mod models;
pub mod nvidia_smi;
pub mod probe;
pub mod problem;
pub mod report;
pub mod score;
pub mod select;
pub mod topology;
pub mod trust;

/// The nvidia-smi fixture topologies, for tests and benchmarks (not part of muster's API).
#[doc(hidden)]
pub mod fixtures;

/// NVIDIA's best-effort GPU choice on muster's link model: a baseline for benchmarks, not muster's policy.
#[doc(hidden)]
pub mod nvidia_policy;

pub use gpuset::{GpuSet, MAX_GPUS};
pub use health::{
    ClusterMetrics, GpuMetrics, HealthReason, HealthThresholds, MetricsCache, MetricsError, MetricsSource, NodeHealth,
    NodeMetrics, healthy_mask,
};
pub use ledger::{
    Claim, Conflict, IndicesError, KeptLedger, Ledger, LedgerProblem, PodPhase, PodRecord, format_indices,
    parse_indices,
};
pub use problem::{GpuProblem, GpuProblemKind};
pub use score::{Fit, NodeScore, fit, node_score};
pub use select::{EXACT_LIMIT, NUMA_SPAN_PENALTY, SelectOptions, Selection, select, select_brute_force, set_cost};
pub use topology::{GpuTopology, Link, SelectionKey, TopologyAnnotation, TopologyError, TopologyProblem};
pub use trust::{Placed, Untrusted, vouch};

/// GPUs of a node a pod may be given: healthy and not held by any pod.
pub fn available(health: &NodeHealth, used: GpuSet) -> GpuSet {
    health.healthy.difference(used)
}

//! What keeps a node's GPUs from full use, as an operator should hear it: a typed problem per
//! kind, with a line naming the GPUs concerned. Stable while the situation is (no measured
//! values, no ages), so the shell can report each problem once, when it changes.

use std::fmt;

/// The kind of a GPU problem on a node: the `kind` label of `muster_gpu_node_problems`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GpuProblemKind {
    /// No `gpu.muster.dev/topology` annotation: every link is taken as `SYS`.
    TopologyMissing,
    /// The annotation does not parse or breaks a rule of the format.
    TopologyMalformed,
    /// The annotation describes another number of GPUs than the node allocates.
    TopologyMismatch,
    /// No metrics for the node, or for some of its GPUs (with a metrics source configured).
    MetricsMissing,
    /// Samples older than the metrics' maximum age, ignored.
    MetricsStale,
    /// Samples with values out of range, ignored.
    MetricsInvalid,
    /// Samples for GPU indices the node does not have.
    MetricsUnknownGpu,
    /// GPUs hotter than allowed, not offered.
    TooHot,
    /// GPUs with less free memory than allowed, not offered.
    MemoryFull,
    /// A node agent's annotation (`gpu.muster.dev/assigned` or `gpu.muster.dev/health`) that
    /// cannot be used, or that names GPUs the node does not have.
    AgentReportInvalid,
}

impl GpuProblemKind {
    /// Every kind, in label order.
    pub const ALL: [GpuProblemKind; 10] = [
        GpuProblemKind::TopologyMissing,
        GpuProblemKind::TopologyMalformed,
        GpuProblemKind::TopologyMismatch,
        GpuProblemKind::MetricsMissing,
        GpuProblemKind::MetricsStale,
        GpuProblemKind::MetricsInvalid,
        GpuProblemKind::MetricsUnknownGpu,
        GpuProblemKind::TooHot,
        GpuProblemKind::MemoryFull,
        GpuProblemKind::AgentReportInvalid,
    ];

    /// The metric label value.
    pub const fn label(self) -> &'static str {
        match self {
            GpuProblemKind::TopologyMissing => "topology_missing",
            GpuProblemKind::TopologyMalformed => "topology_malformed",
            GpuProblemKind::TopologyMismatch => "topology_mismatch",
            GpuProblemKind::MetricsMissing => "metrics_missing",
            GpuProblemKind::MetricsStale => "metrics_stale",
            GpuProblemKind::MetricsInvalid => "metrics_invalid",
            GpuProblemKind::MetricsUnknownGpu => "metrics_unknown_gpu",
            GpuProblemKind::TooHot => "too_hot",
            GpuProblemKind::MemoryFull => "memory_full",
            GpuProblemKind::AgentReportInvalid => "agent_report_invalid",
        }
    }
}

impl fmt::Display for GpuProblemKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// One kind of problem on one node, with the line an operator reads.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GpuProblem {
    /// What kind of problem.
    pub kind: GpuProblemKind,
    /// What it is, naming the GPUs concerned (e.g. `too hot, not offered: GPU 0,3`).
    pub message: String,
}

impl fmt::Display for GpuProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_distinct_and_in_order() {
        let labels: Vec<&str> = GpuProblemKind::ALL.iter().map(|k| k.label()).collect();
        let mut sorted = labels.clone();
        sorted.dedup();
        assert_eq!(sorted.len(), GpuProblemKind::ALL.len());
        assert!(GpuProblemKind::ALL.windows(2).all(|w| w[0] < w[1]));
        assert!(labels.iter().all(|l| l.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')));
    }
}

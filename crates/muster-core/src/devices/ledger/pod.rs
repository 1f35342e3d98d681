//! A pod as the ledger reads it: its phase, and the record the ledger is built from, with
//! whether the pod holds GPUs and which of two claimants is senior.

use k8s_openapi::jiff::Timestamp;

/// A pod's phase, as far as GPU ownership cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodPhase {
    /// Not yet running (includes gated and unbound pods).
    Pending,
    /// Running.
    Running,
    /// All containers ended successfully: its GPUs are free.
    Succeeded,
    /// All containers ended, one failed: its GPUs are free.
    Failed,
    /// The kubelet cannot be reached; the pod may still use its GPUs.
    Unknown,
}

impl From<crate::pods::Lifecycle> for PodPhase {
    fn from(l: crate::pods::Lifecycle) -> Self {
        use crate::pods::Lifecycle;
        match l {
            Lifecycle::Pending => PodPhase::Pending,
            Lifecycle::Running => PodPhase::Running,
            Lifecycle::Succeeded => PodPhase::Succeeded,
            Lifecycle::Failed => PodPhase::Failed,
            Lifecycle::Unknown => PodPhase::Unknown,
        }
    }
}

impl PodPhase {
    /// The phase from `status.phase`; absent (a pod just created) is `Pending`, anything
    /// unrecognised is `Unknown`, which keeps GPUs held rather than risk a double assignment.
    pub fn from_status(phase: Option<&str>) -> Self {
        match phase {
            None | Some("Pending") => PodPhase::Pending,
            Some("Running") => PodPhase::Running,
            Some("Succeeded") => PodPhase::Succeeded,
            Some("Failed") => PodPhase::Failed,
            Some(_) => PodPhase::Unknown,
        }
    }

    /// Whether the pod has finished and no longer holds GPUs.
    pub fn is_terminal(self) -> bool {
        matches!(self, PodPhase::Succeeded | PodPhase::Failed)
    }
}

/// One pod as the ledger sees it when (re)built from the API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodRecord<'a> {
    /// The node the pod is bound or pinned to.
    pub node: &'a str,
    /// `metadata.uid`.
    pub uid: &'a str,
    /// `metadata.creationTimestamp`: of two live pods claiming one GPU, the older keeps it.
    pub created: Option<Timestamp>,
    /// The `gpu.muster.dev/indices` annotation, if set.
    pub indices: Option<&'a str>,
    /// `status.phase`.
    pub phase: PodPhase,
    /// Bound to `node` (`spec.nodeName`), not only pinned there by admission.
    pub bound: bool,
    /// `metadata.deletionTimestamp` is set: the pod is in its grace period.
    pub terminating: bool,
    /// GPUs on the node, for the range check of `indices`.
    pub node_gpus: usize,
    /// `indices` are what the node gave the pod (kubelet's PodResources read back, or an
    /// allocated DRA claim), not a plan: in a conflict they outrank every plan, whatever the
    /// pods' ages, because the containers hold those GPUs.
    pub confirmed: bool,
}

impl PodRecord<'_> {
    /// Whether the pod holds GPUs: it is not finished, and it runs or may still run. A pod in
    /// its grace period still runs (preStop hooks, checkpoint flushes) until it is gone or
    /// finished; one deleted before it was bound never starts (kube-scheduler skips it).
    pub fn holds_gpus(&self) -> bool {
        !self.phase.is_terminal() && (self.bound || !self.terminating)
    }

    /// The order conflicts are resolved in: what a node confirmed first, then older pods,
    /// then by uid; a pod without a creation time (never one from the API) last.
    pub(super) fn seniority(&self) -> (bool, bool, Option<Timestamp>, &str) {
        (!self.confirmed, self.created.is_none(), self.created, self.uid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_from_status() {
        assert_eq!(PodPhase::from_status(None), PodPhase::Pending);
        assert_eq!(PodPhase::from_status(Some("Running")), PodPhase::Running);
        assert!(PodPhase::from_status(Some("Succeeded")).is_terminal());
        assert!(PodPhase::from_status(Some("Failed")).is_terminal());
        assert!(!PodPhase::from_status(Some("Unknown")).is_terminal());
    }
}

//! Why a pin failed ([`FailureCause`], [`PinFailure`]) and the message people read about it.

use std::time::Duration;

/// Why a pin failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FailureCause {
    /// The pod was not bound within the bind timeout.
    BindTimeout(Duration),
    /// The planned node was deleted after the pod was pinned to it.
    NodeGone,
    /// A plan cut short no longer fits the cluster.
    NoLongerFits(String),
    /// The API server refused the pod's patch.
    PatchRefused(String),
    /// A device of one of the attempt's claims is also allocated to another claim
    /// ([`crate::scheduler::DeviceLoss`], as said).
    DeviceTaken(String),
}

/// A failed pin: which pod, where, why, and kube-scheduler's word on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinFailure {
    /// The first failed pod's name.
    pub pod: String,
    /// Its planned node.
    pub node: String,
    /// Why it failed.
    pub cause: FailureCause,
    /// kube-scheduler's message from the pod's `PodScheduled` condition, if any.
    pub scheduler_message: Option<String>,
    /// Pods of the plan still unbound.
    pub unbound: usize,
    /// Pods of the plan that exist.
    pub planned: usize,
}

impl PinFailure {
    /// The failure for people; `scheduler_message` (or `fallback`, e.g. the newest
    /// FailedScheduling event) is quoted.
    pub fn message(&self, fallback: Option<&str>) -> String {
        let why = match &self.cause {
            FailureCause::BindTimeout(t) => format!("was not bound to node {} within {}s", self.node, t.as_secs()),
            FailureCause::NodeGone => format!("was pinned to node {}, which no longer exists", self.node),
            FailureCause::NoLongerFits(m) => format!("no longer fits node {} ({m})", self.node),
            FailureCause::PatchRefused(m) => {
                format!("could not be pinned to node {}: the API server refused: {m}", self.node)
            }
            FailureCause::DeviceTaken(m) => format!("cannot keep its devices on node {}: {m}", self.node),
        };
        let quote = self.scheduler_message.as_deref().or(fallback).map(|m| format!(": {m}")).unwrap_or_default();
        format!("pod {} {why}{quote}; {} of {} planned pod(s) unbound", self.pod, self.unbound, self.planned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::commit::fixtures::{TIMEOUT, failure};

    #[test]
    fn failure_messages_quote_kube_scheduler() {
        let f = failure("b", "n1", FailureCause::BindTimeout(TIMEOUT), 1, 2);
        assert_eq!(f.message(None), "pod b was not bound to node n1 within 60s; 1 of 2 planned pod(s) unbound");
        assert_eq!(
            f.message(Some("0/3 nodes are available")),
            "pod b was not bound to node n1 within 60s: 0/3 nodes are available; 1 of 2 planned pod(s) unbound"
        );
        let own = PinFailure { scheduler_message: Some("anti-affinity".into()), ..f };
        assert!(own.message(Some("older event")).contains(": anti-affinity;"));
        let gone = failure("b", "n3", FailureCause::NodeGone, 1, 2);
        assert_eq!(
            gone.message(None),
            "pod b was pinned to node n3, which no longer exists; 1 of 2 planned pod(s) unbound"
        );
    }
}

//! PURE: what the last admission cycle concluded about a root ([`Outcome`]), and the short
//! reason a group shows for it beside its phase.

use muster_api::scheduling::GroupPhase;

/// What the last admission cycle concluded about a group's root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Not quorate yet.
    Waiting(String),
    /// Quorate but does not fit: the message, and the short reason (the placement's
    /// `Insufficient nvidia.com/gpu`, or what holds it back: `Preempting`, `RollbackBackoff`).
    Unschedulable(String, String),
    /// Admitted in this or an earlier cycle.
    Admitted(String),
    /// A committed pod did not bind in time after the gang started whole.
    BindFailed(String),
    /// A pin failed before the gang started: the attempt was rolled back (pods recreated gated).
    RolledBack(String),
    /// Admitted before, but gated pods beyond what started do not fit (a gang's pods beyond
    /// minCount, a basic child of a composite): they wait on a backoff.
    Partly(String),
    /// In a namespace muster's webhooks skip (its own, kube-system): pods there are never
    /// gated, so muster does not admit the group.
    Excluded(String),
}

impl Outcome {
    /// The outcome's message.
    pub fn message(&self) -> &str {
        match self {
            Outcome::Waiting(m)
            | Outcome::Unschedulable(m, _)
            | Outcome::Admitted(m)
            | Outcome::BindFailed(m)
            | Outcome::RolledBack(m)
            | Outcome::Partly(m)
            | Outcome::Excluded(m) => m,
        }
    }
}

/// PURE: the short reason a group shows beside its phase (`kubectl get mpg`, column
/// `Reason`): why it waits or failed, none once it is admitted, runs or is done.
pub fn short_reason(phase: GroupPhase, outcome: Option<&Outcome>) -> Option<String> {
    if matches!(phase, GroupPhase::Admitted | GroupPhase::Running | GroupPhase::Succeeded) {
        return None;
    }
    let reason = match outcome? {
        Outcome::Waiting(_) if phase == GroupPhase::Pending => "WaitingForQuorum",
        Outcome::Unschedulable(_, r) => r.as_str(),
        Outcome::BindFailed(_) => super::reason::BIND_TIMEOUT,
        Outcome::RolledBack(_) => super::reason::BIND_FAILED,
        Outcome::Excluded(_) => "NamespaceExcluded",
        Outcome::Waiting(_) | Outcome::Admitted(_) | Outcome::Partly(_) => return None,
    };
    Some(reason.to_string())
}

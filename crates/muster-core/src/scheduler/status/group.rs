//! PURE: what the status of a PodGroup or CompositePodGroup says, from its pods (or its
//! children's summaries), its previous status and its root's [`Outcome`]: phase, short reason,
//! counts, message and conditions. No client and no clock: the caller passes `now`.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use muster_api::scheduling::{
    AdmissionPlan, CompositePodGroup, CompositePodGroupStatus, GroupPhase, PlanState, PodGroup, PodGroupStatus,
};
use muster_api::{HOSTNAME_LABEL, ROLLED_BACK_ANNOTATION};

use super::outcome::{Outcome, short_reason};
use crate::conditions;
use crate::pods::{Lifecycle, PodClass};
use crate::scheduler;

/// Condition types written by admission.
pub mod condition {
    /// Upstream: the group reached its quorum of scheduled pods once (terminal once True).
    pub const POD_GROUP_INITIALLY_SCHEDULED: &str = "PodGroupInitiallyScheduled";
    /// Upstream, for CompositePodGroups.
    pub const COMPOSITE_INITIALLY_SCHEDULED: &str = "CompositePodGroupInitiallyScheduled";
    /// Upstream: the group is being disrupted (muster: its pods were deleted after a failed bind).
    pub const DISRUPTION_TARGET: &str = "DisruptionTarget";
    /// muster: the gang was admitted (pinned and ungated) in one decision.
    pub const ADMITTED: &str = "Admitted";
    /// muster: a committed pod was not bound (reason `BindTimeout` once the gang had started,
    /// `BindFailed` when the attempt was rolled back).
    pub const BIND_FAILED: &str = "BindFailed";
    /// muster: the last attempt on the root met an API error (a refused or failed write); it is
    /// backed off alone and retried. False (reason `Recovered`) once an attempt goes through.
    pub const ADMISSION_ERROR: &str = "AdmissionError";
    /// muster: whether placement models every rule of the group's pods, so an all-or-nothing
    /// start is guaranteed (False, reason `NotModelled`, naming each field it does not model).
    pub const ALL_OR_NOTHING: &str = "AllOrNothing";
}

/// Reasons of a failed bind, on `Admitted=False`, [`condition::BIND_FAILED`] and their events.
pub mod reason {
    /// A committed pod was not bound after the gang had started: the group failed.
    pub const BIND_TIMEOUT: &str = "BindTimeout";
    /// A committed pod was not bound: the attempt was rolled back.
    pub const BIND_FAILED: &str = "BindFailed";
}

/// The reasons of an `Admitted=False` that ends an attempt: the pods were pinned and ungated,
/// then rolled back (a bind timed out or failed).
const ROLLED_BACK_REASONS: [&str; 2] = [reason::BIND_TIMEOUT, reason::BIND_FAILED];

/// PURE: when a gang's wait for admission began, read from the cluster, so a new leader
/// measures the wait its predecessor saw begin: the later of its newest pod's creation (the
/// gang complete) and the moment its `Admitted` condition last turned False after an attempt
/// was rolled back (a new wait, the pods still there). A first `Admitted=False` (waiting,
/// unschedulable) starts no wait of its own: it is stamped when the group's first status is
/// computed, seconds after the gang may have been complete (see `FIRST_STATUS_AGE`).
pub fn wait_started(
    pods_created: impl IntoIterator<Item = Timestamp>,
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
) -> Option<Timestamp> {
    let rolled_back = conditions
        .iter()
        .find(|c| {
            c.type_ == condition::ADMITTED && c.status == "False" && ROLLED_BACK_REASONS.contains(&c.reason.as_str())
        })
        .map(|c| c.last_transition_time.0);
    pods_created.into_iter().chain(rolled_back).max()
}

/// Sets [`condition::ALL_OR_NOTHING`] from what placement does not model in the pods' specs.
fn all_or_nothing_condition(
    conds: &mut Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    pods: &[&Pod],
    generation: Option<i64>,
    now: Timestamp,
) {
    let mut missing: Vec<String> =
        pods.iter().filter_map(|p| p.spec.as_ref()).flat_map(scheduler::unmodelled).map(|u| u.to_string()).collect();
    missing.sort();
    missing.dedup();
    if missing.is_empty() {
        conditions::set(
            conds,
            condition::ALL_OR_NOTHING,
            true,
            "Modelled",
            "placement models every rule of these pods",
            generation,
            now,
        );
    } else {
        let message = format!("all-or-nothing is not guaranteed: pod spec {}", missing.join("; "));
        conditions::set(conds, condition::ALL_OR_NOTHING, false, "NotModelled", &message, generation, now);
    }
}

/// Sets [`condition::ADMISSION_ERROR`] from the root's last error (`None`: the last attempt
/// went through); a group that never had one gets no such condition.
pub fn error_condition(
    conds: &mut Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    error: Option<&str>,
    generation: Option<i64>,
    now: Timestamp,
) {
    match error {
        Some(m) => {
            conditions::set(conds, condition::ADMISSION_ERROR, true, "APIError", m, generation, now);
        }
        None if conditions::is_true(conds, condition::ADMISSION_ERROR) => {
            conditions::set(conds, condition::ADMISSION_ERROR, false, "Recovered", "", generation, now);
        }
        None => {}
    }
}

/// Counts of a group's pods.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodCounts {
    /// Existing, not terminating, not finished.
    pub pods: i32,
    /// Held by the admission gate.
    pub gated: i32,
    /// Ungated (admitted), not finished.
    pub admitted: i32,
    /// Bound to a node, not finished.
    pub scheduled: i32,
    /// Running.
    pub running: i32,
    /// Succeeded.
    pub succeeded: i32,
    /// Failed.
    pub failed: i32,
}

/// Counts a group's pods; pods of a rolled-back attempt count for nothing (they end because a
/// pin failed, not by themselves).
pub fn count(pods: &[&Pod]) -> PodCounts {
    let mut c = PodCounts::default();
    let rolled_back = |p: &Pod| p.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(ROLLED_BACK_ANNOTATION));
    for pod in pods.iter().filter(|p| !rolled_back(p)) {
        let class = PodClass::of(pod);
        match class.lifecycle {
            Lifecycle::Succeeded => c.succeeded += 1,
            Lifecycle::Failed => c.failed += 1,
            _ if class.terminating => {}
            lifecycle => {
                c.pods += 1;
                if class.gated() {
                    c.gated += 1;
                } else {
                    c.admitted += 1;
                }
                if class.bound_node().is_some() {
                    c.scheduled += 1;
                }
                if lifecycle == Lifecycle::Running {
                    c.running += 1;
                }
            }
        }
    }
    c
}

/// The hostname a pod was pinned to by admission, if any.
pub fn pinned_hostname(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_selector.as_ref()?.get(HOSTNAME_LABEL).map(String::as_str)
}

fn phase_of(counts: &PodCounts, min: i32, outcome: Option<&Outcome>, plan: Option<&AdmissionPlan>) -> GroupPhase {
    let total = counts.pods + counts.succeeded + counts.failed;
    if total > 0 && counts.pods == 0 && counts.failed == 0 && counts.succeeded >= min.max(1) {
        return GroupPhase::Succeeded;
    }
    if matches!(outcome, Some(Outcome::BindFailed(_))) {
        return GroupPhase::Failed;
    }
    if counts.pods == 0 && counts.failed > 0 && counts.succeeded < min {
        return GroupPhase::Failed;
    }
    if counts.running >= min.max(1) {
        return GroupPhase::Running;
    }
    if matches!(outcome, Some(Outcome::Excluded(_))) {
        return GroupPhase::Pending;
    }
    if counts.admitted >= min.max(1) || plan.is_some_and(|p| p.state != PlanState::Planned) {
        return GroupPhase::Admitted;
    }
    match outcome {
        Some(Outcome::Unschedulable(..)) => GroupPhase::Unschedulable,
        _ => GroupPhase::Pending,
    }
}

fn message_of(outcome: Option<&Outcome>, counts: &PodCounts, min: i32) -> String {
    match outcome {
        Some(o) => o.message().to_string(),
        None if counts.pods < min => format!("waiting for quorum: {} pod(s), needs {min}", counts.pods),
        None => format!("{} of {} pod(s) admitted, {} running", counts.admitted, counts.pods, counts.running),
    }
}

fn admission_conditions(
    conds: &mut Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    outcome: Option<&Outcome>,
    generation: Option<i64>,
    now: Timestamp,
) {
    match outcome {
        Some(Outcome::Admitted(m)) => {
            conditions::set(conds, condition::ADMITTED, true, "Admitted", m, generation, now);
            conditions::set(conds, condition::BIND_FAILED, false, "Bound", "", generation, now);
        }
        Some(Outcome::Unschedulable(m, _)) => {
            conditions::set(conds, condition::ADMITTED, false, "Unschedulable", m, generation, now);
        }
        Some(Outcome::Waiting(m)) => {
            conditions::set(conds, condition::ADMITTED, false, "WaitingForQuorum", m, generation, now);
        }
        Some(Outcome::BindFailed(m)) => {
            conditions::set(conds, condition::ADMITTED, false, reason::BIND_TIMEOUT, m, generation, now);
            conditions::set(conds, condition::BIND_FAILED, true, reason::BIND_TIMEOUT, m, generation, now);
        }
        Some(Outcome::RolledBack(m)) => {
            conditions::set(conds, condition::ADMITTED, false, reason::BIND_FAILED, m, generation, now);
            conditions::set(conds, condition::BIND_FAILED, true, reason::BIND_FAILED, m, generation, now);
        }
        Some(Outcome::Partly(m)) => {
            conditions::set(conds, condition::ADMITTED, true, "PartlyAdmitted", m, generation, now);
        }
        Some(Outcome::Excluded(m)) => {
            conditions::set(conds, condition::ADMITTED, false, "NamespaceExcluded", m, generation, now);
        }
        None => {}
    }
}

/// What a root's outcome means for one PodGroup under it: a root admitted only in part is
/// unschedulable for a group still short of its minCount, partly admitted for one that has
/// it but still has gated pods, and says nothing special of one with no gated pod.
fn leaf_outcome(outcome: Option<&Outcome>, counts: &PodCounts, min: i32) -> Option<Outcome> {
    match outcome {
        Some(Outcome::Partly(_)) if counts.gated == 0 => None,
        Some(Outcome::Partly(m)) if counts.admitted + counts.succeeded + counts.failed < min.max(1) => {
            Some(Outcome::Unschedulable(m.clone(), "Unschedulable".into()))
        }
        other => other.cloned(),
    }
}

/// The status of a PodGroup from its pods, the previous status and its root's outcome.
pub fn pod_group_status(pg: &PodGroup, pods: &[&Pod], outcome: Option<&Outcome>, now: Timestamp) -> PodGroupStatus {
    let prev = pg.status.clone().unwrap_or_default();
    let generation = pg.metadata.generation;
    let min = pg.spec.scheduling_policy.min_count().unwrap_or(1);
    let counts = count(pods);
    let outcome = leaf_outcome(outcome, &counts, min);
    let outcome = outcome.as_ref();
    let mut conds = prev.conditions.clone();
    admission_conditions(&mut conds, outcome, generation, now);
    all_or_nothing_condition(&mut conds, pods, generation, now);
    // Upstream: terminal once True, even if pods are later lost.
    if !conditions::is_true(&conds, condition::POD_GROUP_INITIALLY_SCHEDULED) {
        let scheduled = counts.scheduled + counts.succeeded + counts.failed;
        if scheduled >= min {
            conditions::set(
                &mut conds,
                condition::POD_GROUP_INITIALLY_SCHEDULED,
                true,
                "Scheduled",
                &format!("{scheduled} pod(s) bound"),
                generation,
                now,
            );
        } else {
            let reason = if matches!(outcome, Some(Outcome::Unschedulable(..))) { "Unschedulable" } else { "Pending" };
            conditions::set(
                &mut conds,
                condition::POD_GROUP_INITIALLY_SCHEDULED,
                false,
                reason,
                &format!("{scheduled}/{min} pod(s) bound"),
                generation,
                now,
            );
        }
    }
    let phase = phase_of(&counts, min, outcome, prev.plan.as_ref());
    PodGroupStatus {
        phase: Some(phase),
        reason: short_reason(phase, outcome),
        min_count: Some(min),
        pods: counts.pods,
        gated: counts.gated,
        admitted: counts.admitted,
        scheduled: counts.scheduled,
        running: counts.running,
        succeeded: counts.succeeded,
        failed: counts.failed,
        conditions: conds,
        message: Some(message_of(outcome, &counts, min)),
        plan: prev.plan,
        rollbacks: prev.rollbacks,
        recent_rollbacks: prev.recent_rollbacks,
        last_rollback_time: prev.last_rollback_time,
        avoid_nodes: prev.avoid_nodes,
        // Written by the job controller (its own merge patch); carried so this apply agrees.
        resource_claim_statuses: prev.resource_claim_statuses,
        observed_generation: generation,
    }
}

/// What a CompositePodGroup's status needs of one child.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChildSummary {
    /// The child is quorate.
    pub quorate: bool,
    /// The child reached its quorum of admitted pods (or children).
    pub admitted: bool,
    /// The child's phase.
    pub phase: GroupPhase,
}

impl ChildSummary {
    /// A child PodGroup's summary from its status as computed this cycle (`None`: none yet).
    pub fn of_pod_group(status: Option<&PodGroupStatus>, quorate: bool) -> Self {
        let min = status.and_then(|s| s.min_count).unwrap_or(1);
        ChildSummary {
            quorate,
            admitted: status.is_some_and(|s| s.admitted + s.succeeded + s.failed >= min),
            phase: status.and_then(|s| s.phase).unwrap_or(GroupPhase::Pending),
        }
    }

    /// A child CompositePodGroup's summary from its status as cached (`None`: none yet).
    pub fn of_composite(status: Option<&CompositePodGroupStatus>, quorate: bool) -> Self {
        ChildSummary {
            quorate,
            admitted: status.is_some_and(|s| s.admitted_children >= s.min_group_count.unwrap_or(1)),
            phase: status.and_then(|s| s.phase).unwrap_or(GroupPhase::Pending),
        }
    }
}

/// The status of a CompositePodGroup from its children, its previous status and its root's outcome.
pub fn composite_status(
    cpg: &CompositePodGroup,
    children: &[ChildSummary],
    outcome: Option<&Outcome>,
    now: Timestamp,
) -> CompositePodGroupStatus {
    let prev = cpg.status.clone().unwrap_or_default();
    let generation = cpg.metadata.generation;
    let min = cpg.spec.scheduling_policy.min_group_count().unwrap_or(1);
    let n = |f: &dyn Fn(&ChildSummary) -> bool| children.iter().filter(|c| f(c)).count() as i32;
    let quorate = n(&|c| c.quorate);
    let admitted = n(&|c| c.admitted);
    let running = n(&|c| matches!(c.phase, GroupPhase::Running | GroupPhase::Succeeded));
    let succeeded = n(&|c| c.phase == GroupPhase::Succeeded);
    let failed = n(&|c| c.phase == GroupPhase::Failed);
    let mut conds = prev.conditions.clone();
    admission_conditions(&mut conds, outcome, generation, now);
    if !conditions::is_true(&conds, condition::COMPOSITE_INITIALLY_SCHEDULED) {
        let scheduled = n(&|c| matches!(c.phase, GroupPhase::Running | GroupPhase::Succeeded | GroupPhase::Failed));
        let ok = scheduled >= min && !children.is_empty();
        let reason = if ok {
            "Scheduled"
        } else if matches!(outcome, Some(Outcome::Unschedulable(..))) {
            "Unschedulable"
        } else {
            "Pending"
        };
        conditions::set(
            &mut conds,
            condition::COMPOSITE_INITIALLY_SCHEDULED,
            ok,
            reason,
            &format!("{scheduled}/{min} child group(s) scheduled"),
            generation,
            now,
        );
    }
    let phase = if !children.is_empty() && succeeded == children.len() as i32 {
        GroupPhase::Succeeded
    } else if matches!(outcome, Some(Outcome::BindFailed(_))) || (failed > 0 && running < min) {
        GroupPhase::Failed
    } else if running >= min {
        GroupPhase::Running
    } else if matches!(outcome, Some(Outcome::Excluded(_))) {
        GroupPhase::Pending
    } else if admitted >= min {
        GroupPhase::Admitted
    } else if matches!(outcome, Some(Outcome::Unschedulable(..))) {
        GroupPhase::Unschedulable
    } else {
        GroupPhase::Pending
    };
    let message = match outcome {
        Some(o) => o.message().to_string(),
        None => format!("{quorate}/{} child group(s) quorate, {admitted} admitted", children.len()),
    };
    CompositePodGroupStatus {
        phase: Some(phase),
        reason: short_reason(phase, outcome),
        min_group_count: Some(min),
        children: children.len() as i32,
        quorate_children: quorate,
        admitted_children: admitted,
        conditions: conds,
        message: Some(message),
        plan: prev.plan,
        rollbacks: prev.rollbacks,
        recent_rollbacks: prev.recent_rollbacks,
        last_rollback_time: prev.last_rollback_time,
        avoid_nodes: prev.avoid_nodes,
        observed_generation: generation,
    }
}

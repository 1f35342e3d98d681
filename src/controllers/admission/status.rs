//! PURE: what the status of a PodGroup or CompositePodGroup says, from its pods (or children),
//! its previous status and the last admission outcome of its root. No client, no clock.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use crate::controllers::conditions;
use crate::crds::scheduling::{
    AdmissionPlan, CompositePodGroup, CompositePodGroupStatus, GroupPhase, PlanState, PodGroup, PodGroupStatus,
};
use crate::crds::{ADMISSION_GATE, HOSTNAME_LABEL};

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
    /// muster: a committed pod was not bound within the bind timeout.
    pub const BIND_FAILED: &str = "BindFailed";
}

/// What the last admission cycle concluded about a group's root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Not quorate yet.
    Waiting(String),
    /// Quorate but does not fit.
    Unschedulable(String),
    /// Admitted in this or an earlier cycle.
    Admitted(String),
    /// A committed pod did not bind in time.
    BindFailed(String),
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

/// Counts a group's pods.
pub fn count(pods: &[&Pod]) -> PodCounts {
    let mut c = PodCounts::default();
    for pod in pods {
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
        match phase {
            "Succeeded" => c.succeeded += 1,
            "Failed" => c.failed += 1,
            _ if pod.metadata.deletion_timestamp.is_some() => {}
            _ => {
                c.pods += 1;
                let spec = pod.spec.as_ref();
                let gated = spec
                    .and_then(|s| s.scheduling_gates.as_ref())
                    .is_some_and(|g| g.iter().any(|g| g.name == ADMISSION_GATE));
                if gated {
                    c.gated += 1;
                } else {
                    c.admitted += 1;
                }
                if spec.and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty()) {
                    c.scheduled += 1;
                }
                if phase == "Running" {
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
    if counts.admitted >= min.max(1) || plan.is_some_and(|p| p.state != PlanState::Planned) {
        return GroupPhase::Admitted;
    }
    match outcome {
        Some(Outcome::Unschedulable(_)) => GroupPhase::Unschedulable,
        _ => GroupPhase::Pending,
    }
}

fn message_of(outcome: Option<&Outcome>, counts: &PodCounts, min: i32) -> String {
    match outcome {
        Some(Outcome::Waiting(m) | Outcome::Unschedulable(m) | Outcome::Admitted(m) | Outcome::BindFailed(m)) => {
            m.clone()
        }
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
        Some(Outcome::Unschedulable(m)) => {
            conditions::set(conds, condition::ADMITTED, false, "Unschedulable", m, generation, now);
        }
        Some(Outcome::Waiting(m)) => {
            conditions::set(conds, condition::ADMITTED, false, "WaitingForQuorum", m, generation, now);
        }
        Some(Outcome::BindFailed(m)) => {
            conditions::set(conds, condition::ADMITTED, false, "BindTimeout", m, generation, now);
            conditions::set(conds, condition::BIND_FAILED, true, "BindTimeout", m, generation, now);
        }
        None => {}
    }
}

/// The status of a PodGroup from its pods, the previous status and its root's outcome.
pub fn pod_group_status(pg: &PodGroup, pods: &[&Pod], outcome: Option<&Outcome>, now: Timestamp) -> PodGroupStatus {
    let prev = pg.status.clone().unwrap_or_default();
    let generation = pg.metadata.generation;
    let min = pg.spec.scheduling_policy.min_count().unwrap_or(1);
    let counts = count(pods);
    let mut conds = prev.conditions.clone();
    admission_conditions(&mut conds, outcome, generation, now);
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
            let reason = if matches!(outcome, Some(Outcome::Unschedulable(_))) { "Unschedulable" } else { "Pending" };
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
    PodGroupStatus {
        phase: Some(phase_of(&counts, min, outcome, prev.plan.as_ref())),
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
        } else if matches!(outcome, Some(Outcome::Unschedulable(_))) {
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
    } else if admitted >= min {
        GroupPhase::Admitted
    } else if matches!(outcome, Some(Outcome::Unschedulable(_))) {
        GroupPhase::Unschedulable
    } else {
        GroupPhase::Pending
    };
    let message = match outcome {
        Some(Outcome::Waiting(m) | Outcome::Unschedulable(m) | Outcome::Admitted(m) | Outcome::BindFailed(m)) => {
            m.clone()
        }
        None => format!("{quorate}/{} child group(s) quorate, {admitted} admitted", children.len()),
    };
    CompositePodGroupStatus {
        phase: Some(phase),
        min_group_count: Some(min),
        children: children.len() as i32,
        quorate_children: quorate,
        admitted_children: admitted,
        conditions: conds,
        message: Some(message),
        plan: prev.plan,
        observed_generation: generation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crds::PodGroupSpec;
    use crate::crds::blocks::{DisruptionMode, PodGroupSchedulingPolicy};
    use serde_json::json;

    fn pod(phase: &str, gated: bool, node: Option<&str>) -> Pod {
        let mut spec = json!({"containers": [{"name": "c"}]});
        if gated {
            spec["schedulingGates"] = json!([{"name": ADMISSION_GATE}]);
        }
        if let Some(n) = node {
            spec["nodeName"] = json!(n);
        }
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec, "status": {"phase": phase}}))
            .expect("pod")
    }

    fn group(min: i32) -> PodGroup {
        PodGroup::new(
            "g",
            PodGroupSpec {
                scheduling_policy: PodGroupSchedulingPolicy::gang(Some(min)),
                disruption_mode: DisruptionMode::single(),
                ..Default::default()
            },
        )
    }

    fn now() -> Timestamp {
        Timestamp::from_second(1_000).expect("ts")
    }

    #[test]
    fn counts_pods_by_state() {
        let pods = [
            pod("Pending", true, None),
            pod("Pending", false, None),
            pod("Running", false, Some("n")),
            pod("Succeeded", false, Some("n")),
            pod("Failed", false, Some("n")),
        ];
        let refs: Vec<&Pod> = pods.iter().collect();
        let c = count(&refs);
        assert_eq!((c.pods, c.gated, c.admitted, c.scheduled, c.running, c.succeeded, c.failed), (3, 1, 2, 1, 1, 1, 1));
    }

    #[test]
    fn waiting_gang_is_pending_with_the_shortfall() {
        let pods = [pod("Pending", true, None)];
        let refs: Vec<&Pod> = pods.iter().collect();
        let s = pod_group_status(&group(2), &refs, Some(&Outcome::Waiting("waiting for quorum".into())), now());
        assert_eq!(s.phase, Some(GroupPhase::Pending));
        assert_eq!(s.min_count, Some(2));
        assert_eq!(s.message.as_deref(), Some("waiting for quorum"));
        assert!(!conditions::is_true(&s.conditions, condition::POD_GROUP_INITIALLY_SCHEDULED));
    }

    #[test]
    fn unschedulable_gang_says_why() {
        let pods = [pod("Pending", true, None), pod("Pending", true, None)];
        let refs: Vec<&Pod> = pods.iter().collect();
        let s = pod_group_status(&group(2), &refs, Some(&Outcome::Unschedulable("0/2 nodes fit".into())), now());
        assert_eq!(s.phase, Some(GroupPhase::Unschedulable));
        let c = conditions::get(&s.conditions, condition::ADMITTED).expect("condition");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            ("False", "Unschedulable", "0/2 nodes fit")
        );
    }

    #[test]
    fn initially_scheduled_is_terminal() {
        let bound = [pod("Running", false, Some("n")), pod("Running", false, Some("n"))];
        let refs: Vec<&Pod> = bound.iter().collect();
        let mut g = group(2);
        let s = pod_group_status(&g, &refs, Some(&Outcome::Admitted("admitted".into())), now());
        assert!(conditions::is_true(&s.conditions, condition::POD_GROUP_INITIALLY_SCHEDULED));
        assert_eq!(s.phase, Some(GroupPhase::Running));
        g.status = Some(s);
        let lost = [pod("Pending", true, None)];
        let refs: Vec<&Pod> = lost.iter().collect();
        let s = pod_group_status(&g, &refs, None, now());
        assert!(conditions::is_true(&s.conditions, condition::POD_GROUP_INITIALLY_SCHEDULED));
    }

    #[test]
    fn bind_failure_fails_the_group() {
        let pods = [pod("Pending", false, None)];
        let refs: Vec<&Pod> = pods.iter().collect();
        let s = pod_group_status(&group(1), &refs, Some(&Outcome::BindFailed("pod p not bound".into())), now());
        assert_eq!(s.phase, Some(GroupPhase::Failed));
        assert!(conditions::is_true(&s.conditions, condition::BIND_FAILED));
    }

    #[test]
    fn all_succeeded_is_succeeded() {
        let pods = [pod("Succeeded", false, Some("n")), pod("Succeeded", false, Some("n"))];
        let refs: Vec<&Pod> = pods.iter().collect();
        assert_eq!(pod_group_status(&group(2), &refs, None, now()).phase, Some(GroupPhase::Succeeded));
    }

    #[test]
    fn composite_counts_children() {
        let cpg = CompositePodGroup::new(
            "c",
            crate::crds::CompositePodGroupSpec {
                scheduling_policy: crate::crds::blocks::CompositePodGroupSchedulingPolicy::gang(Some(2)),
                disruption_mode: DisruptionMode::single(),
                ..Default::default()
            },
        );
        let kids = [
            ChildSummary { quorate: true, admitted: true, phase: GroupPhase::Running },
            ChildSummary { quorate: true, admitted: false, phase: GroupPhase::Pending },
        ];
        let s = composite_status(&cpg, &kids, None, now());
        assert_eq!((s.children, s.quorate_children, s.admitted_children, s.min_group_count), (2, 2, 1, Some(2)));
        assert_eq!(s.phase, Some(GroupPhase::Pending));
        let kids = [ChildSummary { quorate: true, admitted: true, phase: GroupPhase::Running }; 2];
        let s = composite_status(&cpg, &kids, None, now());
        assert_eq!(s.phase, Some(GroupPhase::Running));
        assert!(conditions::is_true(&s.conditions, condition::COMPOSITE_INITIALLY_SCHEDULED));
    }
}

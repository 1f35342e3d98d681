//! Status and events. First, PURE: what the status of a PodGroup or CompositePodGroup says,
//! from its pods (or children), its previous status and the last admission outcome of its
//! root (no client, no clock). Then the shell's writes of it: server-side apply of each
//! status that changed, paced per group by its last write (`due_at`), or the same status in
//! the merge patch that clears its root's plan (`fold_body`), and events on a root and its
//! owner.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector;
use kube::{Resource, ResourceExt};
use serde_json::json;

use std::collections::HashSet;
use std::time::Instant;

use super::commit::object_labels;
use super::{Admitter, CONTROLLER, FIELD_MANAGER, RootKey, error_backoff, group_pods, visit};
use crate::controllers::conditions;
use crate::controllers::context::{Context, Detached, Error, Result, at_most, bounded};
use crate::crds::scheduling::{
    AdmissionPlan, CompositePodGroup, CompositePodGroupStatus, GroupPhase, PlanState, PodGroup, PodGroupStatus,
};
use crate::crds::{HOSTNAME_LABEL, ROLLED_BACK_ANNOTATION};
use crate::pods::{Lifecycle, PodClass};
use crate::scheduler::{self, GroupTree};

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

/// PURE: when a gang's wait for admission began, read from the cluster, so a new leader
/// measures the wait its predecessor saw begin: the later of its newest pod's creation (the
/// gang complete) and the moment its `Admitted` condition last turned False (a rolled-back
/// attempt starts a new wait; a gang whose pods were all there waits from then on).
pub fn wait_started(
    pods_created: impl IntoIterator<Item = Timestamp>,
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
) -> Option<Timestamp> {
    let admitted_false = conditions
        .iter()
        .find(|c| c.type_ == condition::ADMITTED && c.status == "False")
        .map(|c| c.last_transition_time.0);
    pods_created.into_iter().chain(admitted_false).max()
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

/// PURE: the short reason a group shows beside its phase (`kubectl get mpg`, column
/// `Reason`): why it waits or failed, none once it is admitted, runs or is done.
pub fn short_reason(phase: GroupPhase, outcome: Option<&Outcome>) -> Option<String> {
    if matches!(phase, GroupPhase::Admitted | GroupPhase::Running | GroupPhase::Succeeded) {
        return None;
    }
    let reason = match outcome? {
        Outcome::Waiting(_) if phase == GroupPhase::Pending => "WaitingForQuorum",
        Outcome::Unschedulable(_, r) => r.as_str(),
        Outcome::BindFailed(_) => "BindTimeout",
        Outcome::RolledBack(_) => "BindFailed",
        Outcome::Excluded(_) => "NamespaceExcluded",
        Outcome::Waiting(_) | Outcome::Admitted(_) | Outcome::Partly(_) => return None,
    };
    Some(reason.to_string())
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
            conditions::set(conds, condition::ADMITTED, false, "BindTimeout", m, generation, now);
            conditions::set(conds, condition::BIND_FAILED, true, "BindTimeout", m, generation, now);
        }
        Some(Outcome::RolledBack(m)) => {
            conditions::set(conds, condition::ADMITTED, false, "BindFailed", m, generation, now);
            conditions::set(conds, condition::BIND_FAILED, true, "BindFailed", m, generation, now);
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

// === the shell: writing status and events ===

impl Admitter {
    /// Events on the root group and on its owner (the MusterJob or MusterJobSet).
    pub(super) async fn group_event(&self, tree: &GroupTree, warning: bool, reason: &str, message: &str) {
        self.root_event(&RootKey::of(&tree.namespace, &tree.root), warning, reason, message).await;
    }

    /// The root group and its controller owner, as event targets.
    pub(super) fn root_refs(&self, key: &RootKey) -> Vec<ObjectReference> {
        let (ns, name) = (key.ns.as_str(), key.name.as_str());
        let obj_ref = if key.composite {
            self.caches
                .composites
                .get(&reflector::ObjectRef::new(name).within(ns))
                .map(|c| (c.object_ref(&()), c.metadata.owner_references.clone()))
        } else {
            self.caches
                .pod_groups
                .get(&reflector::ObjectRef::new(name).within(ns))
                .map(|g| (g.object_ref(&()), g.metadata.owner_references.clone()))
        };
        let Some((me, owners)) = obj_ref else { return vec![] };
        let mut out = vec![me];
        if let Some(o) = owners.iter().flatten().find(|o| o.controller == Some(true)) {
            out.push(ObjectReference {
                api_version: Some(o.api_version.clone()),
                kind: Some(o.kind.clone()),
                name: Some(o.name.clone()),
                namespace: Some(ns.to_string()),
                uid: Some(o.uid.clone()),
                ..Default::default()
            });
        }
        out
    }

    /// Writes every group's status that changed (server-side apply, this reconciler's manager).
    /// A write that fails is that group's alone: reported, retried after a backoff, and the
    /// other groups are written. Returns when to retry the failed ones, and the plans to clear
    /// (`done`: root and the version its clear is fenced by), each with its root's status when
    /// that changed too: one patch clears the plan and writes the status (see
    /// [`Self::clear_plans`]), where two writes, one racing the other, went before.
    pub(super) async fn write_statuses(
        &mut self,
        groups: Groups<'_>,
        by_group: &HashMap<RootKey, Vec<&Pod>>,
        settling: &HashSet<RootKey>,
        unmanaged: Vec<(RootKey, serde_json::Value)>,
        done: Vec<(RootKey, Option<String>)>,
    ) -> (Option<Instant>, Vec<PlanClear>) {
        let Groups { pgs, cpgs, trees } = groups;
        // The batch that ended is booked first: the pace below counts its writes.
        let booked = self.book_statuses().await;
        let now = Timestamp::now();
        let clearing: HashSet<&RootKey> = done.iter().map(|(key, _)| key).collect();
        let mut folded: HashMap<RootKey, serde_json::Value> = HashMap::new();
        // The outcome of a root applies to every group under it.
        let mut outcome_of: HashMap<RootKey, Option<Outcome>> = HashMap::new();
        let mut quorate_of: HashMap<RootKey, bool> = HashMap::new();
        // The groups under a root settling keep their status this cycle.
        let mut keep: HashSet<RootKey> = HashSet::new();
        for tree in trees {
            let root = RootKey::of(&tree.namespace, &tree.root);
            let outcome = self.roots.get(&root).and_then(|m| m.outcome.clone());
            let settles = settling.contains(&root);
            visit(&tree.root, &mut |g| {
                let key = RootKey::of(&tree.namespace, g);
                if settles {
                    keep.insert(key.clone());
                }
                outcome_of.insert(key.clone(), outcome.clone());
                quorate_of.insert(key, scheduler::is_quorate(g));
            });
        }
        let empty = Vec::new();
        let mut writes: Vec<(RootKey, Pace, Option<String>, serde_json::Value)> = Vec::new();
        let mut leaf_status: HashMap<RootKey, crate::crds::scheduling::PodGroupStatus> = HashMap::new();
        let mut settled = HashMap::with_capacity(self.status_settled.len());
        for pg in pgs {
            let key = RootKey::leaf(&pg.namespace().unwrap_or_default(), &pg.name_any());
            let pods = by_group.get(&key).unwrap_or(&empty);
            let outcome = outcome_of.get(&key).and_then(Option::as_ref);
            let error = self.roots.get(&key).and_then(|m| m.error.as_deref());
            let inputs = status_inputs(pg, pods, outcome, error);
            let clears = clearing.contains(&key);
            if !clears && self.status_settled.get(&key) == Some(&inputs) {
                // Computed from the same inputs before, and it was the status cached then.
                if pg.spec.parent_composite_pod_group_name.is_some() {
                    leaf_status.insert(key.clone(), pg.status.clone().unwrap_or_default());
                }
                settled.insert(key, inputs);
                continue;
            }
            // A root whose plan this cycle clears: its status as it stands without that plan
            // (the phase counts a plan in flight as admitted; its pods may be gone).
            let without_plan;
            let pg_now: &PodGroup = if clears && pg.status.as_ref().is_some_and(|s| s.plan.is_some()) {
                let mut g = (**pg).clone();
                if let Some(s) = g.status.as_mut() {
                    s.plan = None;
                }
                without_plan = g;
                &without_plan
            } else {
                pg
            };
            let mut status = pod_group_status(pg_now, pods, outcome, now);
            error_condition(&mut status.conditions, error, pg.metadata.generation, now);
            if same_status(pg.status.as_ref(), &status) {
                settled.insert(key.clone(), inputs);
            } else if clears {
                folded.insert(key.clone(), fold_body(pg.status.as_ref(), &status));
            } else if !keep.contains(&key) {
                let pace = pace_of(pg.status.as_ref(), &status, pg.metadata.creation_timestamp.as_ref(), now);
                let version = pg.metadata.resource_version.clone();
                writes.push((key.clone(), pace, version, serde_json::to_value(&status).unwrap_or_default()));
            }
            leaf_status.insert(key, status);
        }
        self.status_settled = settled;
        for cpg in cpgs {
            let ns = cpg.namespace().unwrap_or_default();
            let name = cpg.name_any();
            let key = RootKey::composite(&ns, &name);
            let mut children = Vec::new();
            for pg in pgs.iter().filter(|p| {
                p.metadata.namespace.as_deref() == Some(ns.as_str())
                    && p.spec.parent_composite_pod_group_name.as_deref() == Some(name.as_str())
            }) {
                let k = RootKey::leaf(&ns, &pg.name_any());
                let s = leaf_status.get(&k);
                let min = s.and_then(|s| s.min_count).unwrap_or(1);
                children.push(ChildSummary {
                    quorate: quorate_of.get(&k).copied().unwrap_or(false),
                    admitted: s.is_some_and(|s| s.admitted + s.succeeded + s.failed >= min),
                    phase: s.and_then(|s| s.phase).unwrap_or(GroupPhase::Pending),
                });
            }
            for child in cpgs.iter().filter(|c| {
                c.metadata.namespace.as_deref() == Some(ns.as_str())
                    && c.spec.parent_composite_pod_group_name.as_deref() == Some(name.as_str())
            }) {
                let k = RootKey::composite(&ns, &child.name_any());
                let s = child.status.as_ref();
                children.push(ChildSummary {
                    quorate: quorate_of.get(&k).copied().unwrap_or(false),
                    admitted: s.is_some_and(|s| s.admitted_children >= s.min_group_count.unwrap_or(1)),
                    phase: s.and_then(|s| s.phase).unwrap_or(GroupPhase::Pending),
                });
            }
            let outcome = outcome_of.get(&key).and_then(Option::as_ref);
            let mut status = composite_status(cpg, &children, outcome, now);
            let error = self.roots.get(&key).and_then(|m| m.error.as_deref());
            error_condition(&mut status.conditions, error, cpg.metadata.generation, now);
            if same_status(cpg.status.as_ref(), &status) {
                continue;
            }
            if clearing.contains(&key) {
                folded.insert(key, fold_body(cpg.status.as_ref(), &status));
            } else if !keep.contains(&key) {
                let pace = pace_of(cpg.status.as_ref(), &status, cpg.metadata.creation_timestamp.as_ref(), now);
                let version = cpg.metadata.resource_version.clone();
                writes.push((key, pace, version, serde_json::to_value(&status).unwrap_or_default()));
            }
        }
        // A group's status is paced by its last write (its plan writes count).
        let at = Instant::now();
        self.status_pacing.retain(|_, p| p.live(at));
        // What was sent for a group matters only while it has a write to make.
        let pending: HashSet<&RootKey> = writes.iter().map(|(key, ..)| key).collect();
        self.status_sent.retain(|key, _| pending.contains(key));
        let mut wait: Option<Instant> = None;
        let mut due: Vec<StatusWrite> = writes
            .into_iter()
            .filter(|(key, _, version, status)| !self.status_sent.get(key).is_some_and(|sent| sent.is(version, status)))
            .filter_map(|(key, pace, version, status)| {
                let next = due_at(pace, self.status_pacing.get(&key).copied().unwrap_or_default(), at);
                match next {
                    Some(next) => {
                        wait = Some(wait.map_or(next, |w| w.min(next)));
                        None
                    }
                    None => Some((key, version, status)),
                }
            })
            .collect();
        due.extend(unmanaged.into_iter().map(|(key, status)| (key, None, status)));
        let retry = [booked, self.apply_statuses(due).await, wait].into_iter().flatten().min();
        let clears = done
            .into_iter()
            .map(|(key, version)| {
                let status = folded.remove(&key);
                (key, version, status)
            })
            .collect();
        (retry, clears)
    }

    /// Sends the statuses due, [`STATUS_CONCURRENCY`] at a time, on a task of its own: a cycle
    /// never waits for its status writes (at 1,000 pending gangs, waiting for them was most of
    /// a cycle, and decisions and commits waited with it). One batch is in flight at a time;
    /// the next cycle after it ends (its end wakes one) books it, and writes what is still due
    /// then. Groups backing off after a failed write are skipped. Returns when the first of
    /// those may be tried again.
    async fn apply_statuses(&mut self, writes: Vec<StatusWrite>) -> Option<Instant> {
        // Booked at the start of the cycle; one that ended since is booked now, not dropped.
        let mut retry = self.book_statuses().await;
        if self.status_batch.as_ref().is_some_and(|b| !b.is_finished()) {
            return retry;
        }
        let now = Instant::now();
        let mut due = Vec::with_capacity(writes.len());
        for (key, version, status) in writes {
            if let Some((_, until, _)) = self.status_errors.get(&key).filter(|(_, until, _)| *until > now) {
                retry = Some(retry.map_or(*until, |r| r.min(*until)));
                continue;
            }
            if version.is_some() {
                self.status_sent.insert(key.clone(), SentStatus::of(&version, &status));
            }
            due.push((key, version, status));
        }
        if due.is_empty() {
            return retry;
        }
        let (ctx, writer, signal) = (self.ctx.clone(), self.writer.clone(), self.signal.clone());
        self.status_batch = Some(Detached::spawn(async move {
            let sends: Vec<_> = due
                .into_iter()
                .map(|(key, before, status)| {
                    let (ctx, writer) = (ctx.clone(), writer.clone());
                    async move {
                        // A write waits for its turn in the batch; when it comes, the root
                        // may have a commit in flight (the status is stale then: skipped).
                        // Otherwise the root is held back while the write is in flight.
                        {
                            let mut unseen = writer.unseen();
                            // Being cleared too: the clear's patch carries a newer status.
                            if unseen.committing.contains(&key) || unseen.clearing.contains(&key) {
                                return (key, Ok(()));
                            }
                            if before.is_some() {
                                unseen.status_writes.insert(key.clone(), Instant::now());
                            }
                        }
                        let result = if key.composite {
                            apply_status::<CompositePodGroup>(&ctx, &key, "CompositePodGroup", status).await
                        } else {
                            apply_status::<PodGroup>(&ctx, &key, "PodGroup", status).await
                        };
                        // The root may be decided again; until the cache shows this write, a
                        // plan write on it is fenced by the version it made (`Unseen::fence`).
                        let mut unseen = writer.unseen();
                        unseen.status_writes.remove(&key);
                        if let (Some(before), Ok(Some(after))) = (before, &result) {
                            unseen.statuses.insert(key.clone(), (before, after.clone(), Instant::now()));
                        }
                        (key, result.map(|_| ()))
                    }
                })
                .collect();
            let results = at_most(STATUS_CONCURRENCY, sends).await;
            signal.wake();
            results
        }));
        retry
    }

    /// Books the status batch that ended, if one did: a write that went through starts its
    /// group's pace, a failed one is reported and backed off. Returns when the first of those
    /// may be tried again.
    pub(super) async fn book_statuses(&mut self) -> Option<Instant> {
        let mut batch = self.status_batch.take_if(|b| b.is_finished())?;
        let results = match batch.join().await {
            Ok(results) => results,
            Err(e) => {
                tracing::warn!(error = %e, "the group status writes ended without an answer");
                // Which of them went out is unknown: none counts as sent.
                self.status_sent.clear();
                return None;
            }
        };
        let mut retry: Option<Instant> = None;
        for (key, result) in results {
            match result {
                Ok(()) => {
                    self.status_errors.remove(&key);
                    self.status_pacing.entry(key).or_default().written = Some(Instant::now());
                }
                Err(e) => {
                    self.status_sent.remove(&key);
                    let kind = if key.composite { "CompositePodGroup" } else { "PodGroup" };
                    self.ctx.metrics.reconcile_error(CONTROLLER, e.metric_label());
                    self.ctx.metrics.object_errors.get_or_create(&object_labels(kind, e.reason())).inc();
                    let (errors, last) = self.status_errors.remove(&key).map(|(n, _, m)| (n, m)).unwrap_or_default();
                    let errors = errors.saturating_add(1);
                    let until = Instant::now() + error_backoff(errors);
                    let note = format!("admission could not write the status: {e}");
                    tracing::warn!(group = %key, error = %e, errors, "admission could not write a group status");
                    if last != note {
                        self.root_event(&key, true, "StatusWriteFailed", &note).await;
                    }
                    self.status_errors.insert(key, (errors, until, note));
                    retry = Some(retry.map_or(until, |r| r.min(until)));
                }
            }
        }
        retry
    }

    /// Groups in the namespaces muster's webhooks skip: their pods are never gated, so muster
    /// does not admit them (it would count pods kube-scheduler places alone). Says so in one
    /// Warning event per group, and returns the status writes that say it on each group.
    pub(super) async fn report_unmanaged(
        &mut self,
        pgs: &[Arc<PodGroup>],
        cpgs: &[Arc<CompositePodGroup>],
        pods: &[Arc<Pod>],
    ) -> Vec<(RootKey, serde_json::Value)> {
        if pgs.is_empty() && cpgs.is_empty() {
            self.excluded_reported.clear();
            return Vec::new();
        }
        let now = Timestamp::now();
        let by_group = group_pods(pods);
        let empty = Vec::new();
        let mut writes = Vec::new();
        let mut seen = HashSet::new();
        let keys = pgs
            .iter()
            .map(|g| (RootKey::leaf(&g.namespace().unwrap_or_default(), &g.name_any()), Some(g), None))
            .chain(
                cpgs.iter()
                    .map(|c| (RootKey::composite(&c.namespace().unwrap_or_default(), &c.name_any()), None, Some(c))),
            );
        for (key, pg, cpg) in keys {
            let message = format!(
                "not admitted by muster: namespace {} is one its webhooks skip (muster's own and kube-system), \
                 so these pods are never gated and kube-scheduler places each alone; run gangs in another namespace",
                key.ns
            );
            let outcome = Outcome::Excluded(message.clone());
            let status = match (pg, cpg) {
                (Some(pg), _) => {
                    let s = pod_group_status(pg, by_group.get(&key).unwrap_or(&empty), Some(&outcome), now);
                    (!same_status(pg.status.as_ref(), &s)).then(|| serde_json::to_value(&s).unwrap_or_default())
                }
                (_, Some(cpg)) => {
                    let s = composite_status(cpg, &[], Some(&outcome), now);
                    (!same_status(cpg.status.as_ref(), &s)).then(|| serde_json::to_value(&s).unwrap_or_default())
                }
                _ => None,
            };
            if let Some(status) = status {
                writes.push((key.clone(), status));
            }
            if self.excluded_reported.insert(key.clone()) {
                tracing::warn!(group = %key, "group in a namespace muster's webhooks skip: not admitted");
                self.root_event(&key, true, "NamespaceExcluded", &message).await;
            }
            seen.insert(key);
        }
        self.excluded_reported.retain(|k| seen.contains(k));
        writes
    }
}

/// Applies one group's status (server-side apply, this reconciler's manager), without the
/// fields the commit protocol writes. Returns the group's resourceVersion after it; a group
/// gone meanwhile is no error (`None`).
async fn apply_status<K>(
    ctx: &Context,
    key: &RootKey,
    kind: &str,
    mut status: serde_json::Value,
) -> Result<Option<String>>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    if let Some(map) = status.as_object_mut() {
        for field in COMMIT_FIELDS {
            map.remove(field);
        }
    }
    let body = json!({"apiVersion": "scheduling.muster.dev/v1alpha1", "kind": kind, "status": status});
    let api = Api::<K>::namespaced(ctx.client.clone(), &key.ns);
    match bounded(api.patch_status(&key.name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body))).await {
        Ok(group) => Ok(group.resource_version()),
        Err(Error::Kube(kube::Error::Api(e))) if e.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

/// How many group status writes of a cycle are in flight at once.
const STATUS_CONCURRENCY: usize = 16;
/// The least time between a group's last write (its status, its plan, its plan's clear) and a
/// write of a new phase or condition: a gang created, admitted, bound and started within a
/// second or two makes one or two status writes, not one per step (as kube's Job controller
/// batches its status updates). In a saturated run the API server spent more on muster's
/// group status writes than on any other write of muster's; a status a second late costs a
/// user nothing.
pub(super) const STATUS_PACE: std::time::Duration = std::time::Duration::from_secs(1);
/// The least time between a group's last write and a write of its counts and messages only
/// (its phase and conditions standing): pods started one by one, seconds apart on a busy
/// cluster, make one write, not one each.
pub(super) const COUNT_PACE: std::time::Duration = std::time::Duration::from_secs(5);
/// How long a root's status waits after its commit went through: kube-scheduler binds its
/// pods meanwhile, and the plan's clear then writes the status (admitted and scheduled at
/// once) in the same patch. A gang whose binds take longer gets its admitted status then.
pub(super) const PLAN_STATUS_HOLD: std::time::Duration = std::time::Duration::from_secs(5);

/// Status fields written by the commit protocol with their own merge patches (the plan, and
/// the rollback record beside it); the server-side apply of the rest leaves them alone, so a
/// stale cache never writes an old value back.
const COMMIT_FIELDS: [&str; 5] = ["plan", "rollbacks", "recentRollbacks", "lastRollbackTime", "avoidNodes"];

/// A group status part of which is written by the commit protocol.
trait CommitRecord: Clone + PartialEq {
    fn without_commit_record(&self) -> Self;
    /// The phase and each condition's type, status and reason: a change of that is written
    /// at [`STATUS_PACE`], of counts and messages only at [`COUNT_PACE`].
    fn standing(&self) -> (Option<GroupPhase>, Vec<(&str, &str, &str)>);
}

fn condition_keys(conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]) -> Vec<(&str, &str, &str)> {
    conditions.iter().map(|c| (c.type_.as_str(), c.status.as_str(), c.reason.as_str())).collect()
}

impl CommitRecord for PodGroupStatus {
    fn without_commit_record(&self) -> Self {
        Self {
            plan: None,
            rollbacks: 0,
            recent_rollbacks: 0,
            last_rollback_time: None,
            avoid_nodes: Vec::new(),
            ..self.clone()
        }
    }

    fn standing(&self) -> (Option<GroupPhase>, Vec<(&str, &str, &str)>) {
        (self.phase, condition_keys(&self.conditions))
    }
}

impl CommitRecord for CompositePodGroupStatus {
    fn without_commit_record(&self) -> Self {
        Self {
            plan: None,
            rollbacks: 0,
            recent_rollbacks: 0,
            last_rollback_time: None,
            avoid_nodes: Vec::new(),
            ..self.clone()
        }
    }

    fn standing(&self) -> (Option<GroupPhase>, Vec<(&str, &str, &str)>) {
        (self.phase, condition_keys(&self.conditions))
    }
}

/// PURE: how long the first status of a group created at `created` may still wait at `now`:
/// until it is at least [`STATUS_PACE`] old, so a gang admitted within that time gets no
/// pending status before its admitted one. `creationTimestamp` has whole seconds (the group
/// may be up to a second younger than it says), so that is [`STATUS_PACE`] and a second after
/// the stamp. `None`: write it now (older, or a creation time ahead of this clock).
fn first_status_wait(created: Option<&Time>, now: Timestamp) -> Option<std::time::Duration> {
    let age = std::time::Duration::try_from(now.duration_since(created?.0)).ok()?;
    (STATUS_PACE + std::time::Duration::from_secs(1)).checked_sub(age).filter(|left| !left.is_zero())
}

/// Status equality that ignores what the commit protocol writes.
fn same_status<S: CommitRecord>(old: Option<&S>, new: &S) -> bool {
    old.is_some_and(|old| old.without_commit_record() == new.without_commit_record())
}

/// PURE: a fingerprint of what a PodGroup's status is computed from: the group as cached (its
/// resourceVersion), its pods as cached (each UID and resourceVersion), its root's outcome
/// and last error. Equal fingerprints, equal statuses (the clock only stamps transitions).
fn status_inputs(pg: &PodGroup, pods: &[&Pod], outcome: Option<&Outcome>, error: Option<&str>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    pg.metadata.uid.hash(&mut h);
    pg.metadata.resource_version.hash(&mut h);
    for pod in pods {
        pod.metadata.uid.hash(&mut h);
        pod.metadata.resource_version.hash(&mut h);
    }
    outcome.map(|o| (std::mem::discriminant(o), o.message())).hash(&mut h);
    error.hash(&mut h);
    h.finish()
}

/// When a group's changed status is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pace {
    /// Its phase or a condition moved: [`STATUS_PACE`] after the group's last write.
    Standing,
    /// Counts and messages only (its pods created, bound, started one by one):
    /// [`COUNT_PACE`] after the group's last write.
    Counts,
    /// Its first status, the group young: after this much more (see [`first_status_wait`]),
    /// and [`STATUS_PACE`] after the group's last write (its plan's).
    Young(std::time::Duration),
}

/// PURE: how a group's status, changed from `old` (the one cached) to `new`, is paced at
/// `now`.
fn pace_of<S: CommitRecord>(old: Option<&S>, new: &S, created: Option<&Time>, now: Timestamp) -> Pace {
    match (old, first_status_wait(created, now)) {
        (None, Some(left)) => Pace::Young(left),
        (Some(old), _) if old.standing() == new.standing() => Pace::Counts,
        _ => Pace::Standing,
    }
}

/// What paces a group's next status write: when the group was last written (its status, its
/// plan, its plan's clear), and until when its status waits for its plan's binds
/// ([`PLAN_STATUS_HOLD`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct StatusPacing {
    pub written: Option<Instant>,
    pub hold: Option<Instant>,
}

impl StatusPacing {
    /// Whether it still paces anything after `at`.
    pub(super) fn live(&self, at: Instant) -> bool {
        self.written.is_some_and(|w| w + COUNT_PACE > at) || self.hold.is_some_and(|h| h > at)
    }
}

/// PURE: when a status write paced `pace` may go at `at`: `None` now.
fn due_at(pace: Pace, pacing: StatusPacing, at: Instant) -> Option<Instant> {
    let after = |d: std::time::Duration| pacing.written.map(|w| w + d);
    let due = match pace {
        Pace::Standing => after(STATUS_PACE),
        Pace::Counts => after(COUNT_PACE),
        Pace::Young(left) => Some(after(STATUS_PACE).map_or(at + left, |d| d.max(at + left))),
    };
    [due, pacing.hold].into_iter().flatten().max().filter(|due| *due > at)
}

/// PURE: the merge patch of a root's status that clears its plan and writes `new`, the status
/// computed from `old` (the one cached): every field admission computes, a field it no longer
/// sets as `null` (a merge patch removes only what it names), `plan` as `null`, and nothing
/// of the rollback record or the job controller's claim statuses, which have writers of their
/// own.
fn fold_body<S: serde::Serialize>(old: Option<&S>, new: &S) -> serde_json::Value {
    let fields = |s: Option<&S>| match s.map(serde_json::to_value) {
        Some(Ok(serde_json::Value::Object(map))) => map,
        _ => serde_json::Map::new(),
    };
    let not_ours = |field: &str| COMMIT_FIELDS.contains(&field) || field == "resourceClaimStatuses";
    let mut body = fields(Some(new));
    body.retain(|field, _| !not_ours(field));
    for field in fields(old).keys().filter(|f| !not_ours(f)) {
        body.entry(field.clone()).or_insert(serde_json::Value::Null);
    }
    body.insert("plan".into(), serde_json::Value::Null);
    serde_json::Value::Object(body)
}

/// A plan to clear: the root, the resourceVersion the clear is fenced by, and the status
/// folded into the same patch ([`fold_body`]) when it changed too.
pub(super) type PlanClear = (RootKey, Option<String>, Option<serde_json::Value>);

/// The groups a cycle writes statuses for, as the caches show them, and the roots' trees.
#[derive(Clone, Copy)]
pub(super) struct Groups<'a> {
    pub pgs: &'a [Arc<PodGroup>],
    pub cpgs: &'a [Arc<CompositePodGroup>],
    pub trees: &'a [GroupTree],
}

/// A status sent for a group: the group's resourceVersion it was computed on, and the
/// status without its conditions' transition times. While the cache still shows that version
/// (it lags behind the write, seconds on a busy API server), the status computed again is the
/// one sent: it is not sent again (on a busy cluster a tenth of the group status writes were
/// such repeats). A status computed on another version, or another status, is sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct SentStatus {
    version: Option<String>,
    status: u64,
}

impl SentStatus {
    fn of(version: &Option<String>, status: &serde_json::Value) -> Self {
        SentStatus { version: version.clone(), status: without_transition_times(status) }
    }

    fn is(&self, version: &Option<String>, status: &serde_json::Value) -> bool {
        self.version == *version && self.status == without_transition_times(status)
    }
}

/// PURE: a fingerprint of a status without its conditions' transition times (computed again on
/// a stale cache, a transition is stamped again).
fn without_transition_times(status: &serde_json::Value) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut status = status.clone();
    if let Some(conditions) = status.get_mut("conditions").and_then(serde_json::Value::as_array_mut) {
        for c in conditions.iter_mut().filter_map(serde_json::Value::as_object_mut) {
            c.remove("lastTransitionTime");
        }
    }
    let mut h = std::hash::DefaultHasher::new();
    status.to_string().hash(&mut h);
    h.finish()
}

/// A group status to write: the group, the resourceVersion it was computed on, the status.
type StatusWrite = (RootKey, Option<String>, serde_json::Value);

#[cfg(test)]
mod error_condition_tests {
    use super::*;

    #[test]
    fn an_error_is_a_condition_until_an_attempt_goes_through() {
        let now = Timestamp::from_second(1_000).expect("ts");
        let mut conds = Vec::new();
        error_condition(&mut conds, None, Some(1), now);
        assert!(conds.is_empty(), "no error ever: no condition");
        error_condition(&mut conds, Some("admission could not commit its plan: forbidden"), Some(1), now);
        assert_eq!((conds[0].status.as_str(), conds[0].reason.as_str()), ("True", "APIError"));
        error_condition(&mut conds, None, Some(1), now);
        assert_eq!((conds[0].status.as_str(), conds[0].reason.as_str()), ("False", "Recovered"));
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
            spec["schedulingGates"] = json!([{"name": crate::crds::ADMISSION_GATE}]);
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

    #[test]
    fn the_short_reason_says_why_a_group_waits_or_failed_and_nothing_once_it_runs() {
        let unfit = Outcome::Unschedulable("0/2 nodes fit".into(), "Insufficient nvidia.com/gpu".into());
        let waiting = Outcome::Waiting("waiting for quorum".into());
        let cases = [
            (GroupPhase::Pending, Some(&waiting), Some("WaitingForQuorum")),
            (GroupPhase::Unschedulable, Some(&unfit), Some("Insufficient nvidia.com/gpu")),
            (GroupPhase::Failed, Some(&Outcome::BindFailed("x".into())), Some("BindTimeout")),
            (GroupPhase::Pending, Some(&Outcome::RolledBack("x".into())), Some("BindFailed")),
            (GroupPhase::Pending, Some(&Outcome::Excluded("x".into())), Some("NamespaceExcluded")),
            // Admitted, running or done: no reason, whatever admission last said.
            (GroupPhase::Running, Some(&unfit), None),
            (GroupPhase::Succeeded, Some(&waiting), None),
            (GroupPhase::Admitted, Some(&Outcome::Admitted("x".into())), None),
            // Failed with every pod gone, not quorate any more: the phase says it all.
            (GroupPhase::Failed, Some(&waiting), None),
            (GroupPhase::Pending, None, None),
        ];
        for (phase, outcome, want) in cases {
            assert_eq!(short_reason(phase, outcome).as_deref(), want, "{phase:?} {outcome:?}");
        }
    }

    #[test]
    fn a_wait_starts_at_the_newest_pod_or_when_admitted_last_turned_false() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
        let at = |s: i64| Timestamp::from_second(s).expect("ts");
        let condition = |type_: &str, status: &str, since: i64| Condition {
            type_: type_.into(),
            status: status.into(),
            last_transition_time: Time(at(since)),
            message: String::new(),
            reason: "R".into(),
            observed_generation: None,
        };
        let admitted = |status: &str, since: i64| condition(condition::ADMITTED, status, since);
        let other = condition("Other", "False", 900);
        let cases = [
            ("pods only: the newest", vec![100, 300, 200], vec![], Some(300)),
            ("admitted false later: a new wait", vec![100, 200], vec![admitted("False", 500)], Some(500)),
            ("admitted false before the last pod", vec![100, 700], vec![admitted("False", 500)], Some(700)),
            ("admitted true is no wait start", vec![100], vec![admitted("True", 800)], Some(100)),
            ("other conditions do not count", vec![100], vec![other.clone()], Some(100)),
            ("nothing known", vec![], vec![other], None),
        ];
        for (case, created, conditions, want) in cases {
            let got = wait_started(created.into_iter().map(at), &conditions);
            assert_eq!(got, want.map(at), "{case}");
        }
    }

    fn now() -> Timestamp {
        Timestamp::from_second(1_000).expect("ts")
    }

    #[test]
    fn a_status_is_computed_again_when_what_it_is_computed_from_changes() {
        let mut g = group(2);
        g.metadata.resource_version = Some("5".into());
        let (a, b) = (pod("Pending", true, None), pod("Pending", true, None));
        let pods: Vec<&Pod> = vec![&a, &b];
        let waiting = Outcome::Waiting("waiting for quorum".into());
        let base = status_inputs(&g, &pods, Some(&waiting), None);
        assert_eq!(base, status_inputs(&g, &pods, Some(&waiting), None), "same inputs, same fingerprint");
        let mut moved = b.clone();
        moved.metadata.resource_version = Some("9".into());
        let changed: [(&str, u64); 5] = [
            ("a pod changed", status_inputs(&g, &[&a, &moved], Some(&waiting), None)),
            ("a pod less", status_inputs(&g, &[&a], Some(&waiting), None)),
            ("another outcome", status_inputs(&g, &pods, Some(&Outcome::Admitted("x".into())), None)),
            ("an error", status_inputs(&g, &pods, Some(&waiting), Some("forbidden"))),
            ("the group changed", {
                let mut g2 = g.clone();
                g2.metadata.resource_version = Some("6".into());
                status_inputs(&g2, &pods, Some(&waiting), None)
            }),
        ];
        for (case, fingerprint) in changed {
            assert_ne!(fingerprint, base, "{case}");
        }
    }

    #[test]
    fn a_young_groups_first_status_waits_until_the_group_is_a_pace_old() {
        use std::time::Duration;
        let created = Time(Timestamp::from_second(1_000).expect("ts"));
        let at = |ms: i64| Timestamp::from_millisecond(1_000_000 + ms).expect("ts");
        // The stamp has whole seconds: a group stamped 1,000 s was made before 1,001 s.
        assert_eq!(first_status_wait(Some(&created), at(200)), Some(Duration::from_millis(1_800)));
        assert_eq!(first_status_wait(Some(&created), at(1_500)), Some(Duration::from_millis(500)));
        assert_eq!(first_status_wait(Some(&created), at(2_000)), None);
        assert_eq!(first_status_wait(Some(&created), at(5_000)), None);
        assert_eq!(first_status_wait(Some(&created), at(-500)), None, "created ahead of this clock: now");
        assert_eq!(first_status_wait(None, at(0)), None);

        let pods = [pod("Pending", true, None)];
        let refs: Vec<&Pod> = pods.iter().collect();
        let first = pod_group_status(&group(2), &refs, None, now());
        assert_eq!(pace_of(None, &first, Some(&created), at(200)), Pace::Young(Duration::from_millis(1_800)));
        assert_eq!(pace_of(None, &first, Some(&created), at(2_000)), Pace::Standing);
        let counted = PodGroupStatus { pods: first.pods + 1, ..first.clone() };
        assert_eq!(pace_of(Some(&first), &counted, Some(&created), at(200)), Pace::Counts);
        let admitted = PodGroupStatus { phase: Some(GroupPhase::Admitted), ..first.clone() };
        assert_eq!(pace_of(Some(&first), &admitted, Some(&created), at(200)), Pace::Standing);
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
    fn pods_of_a_rolled_back_attempt_are_not_counted() {
        let mut rolled = pod("Failed", false, Some("n"));
        rolled.metadata.annotations = Some([(ROLLED_BACK_ANNOTATION.to_string(), "plan-1".to_string())].into());
        let pods = [rolled, pod("Pending", true, None)];
        let refs: Vec<&Pod> = pods.iter().collect();
        let c = count(&refs);
        assert_eq!((c.pods, c.gated, c.failed), (1, 1, 0));
    }

    #[test]
    fn a_rolled_back_attempt_leaves_the_group_pending_with_bind_failed() {
        let pods = [pod("Pending", true, None)];
        let refs: Vec<&Pod> = pods.iter().collect();
        let outcome = Outcome::RolledBack("attempt 1 rolled back".into());
        let s = pod_group_status(&group(1), &refs, Some(&outcome), now());
        assert_eq!(s.phase, Some(GroupPhase::Pending), "retried, not failed");
        let c = conditions::get(&s.conditions, condition::BIND_FAILED).expect("condition");
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "BindFailed"));
        let c = conditions::get(&s.conditions, condition::ADMITTED).expect("condition");
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "BindFailed"));
        assert_eq!(s.message.as_deref(), Some("attempt 1 rolled back"));
    }

    #[test]
    fn the_group_says_whether_all_or_nothing_is_guaranteed() {
        let plain = [pod("Pending", true, None)];
        let s = pod_group_status(&group(1), &plain.iter().collect::<Vec<_>>(), None, now());
        let c = conditions::get(&s.conditions, condition::ALL_OR_NOTHING).expect("condition");
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "Modelled"));
        let mut other = pod("Pending", true, None);
        if let Some(spec) = other.spec.as_mut() {
            spec.scheduler_name = Some("volcano".into());
        }
        let pods = [other, pod("Pending", true, None)];
        let s = pod_group_status(&group(1), &pods.iter().collect::<Vec<_>>(), None, now());
        let c = conditions::get(&s.conditions, condition::ALL_OR_NOTHING).expect("condition");
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "NotModelled"));
        assert!(c.message.contains("schedulerName: \"volcano\""), "{}", c.message);
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
        let s = pod_group_status(
            &group(2),
            &refs,
            Some(&Outcome::Unschedulable("0/2 nodes fit".into(), "Insufficient nvidia.com/gpu".into())),
            now(),
        );
        assert_eq!(s.phase, Some(GroupPhase::Unschedulable));
        assert_eq!(s.reason.as_deref(), Some("Insufficient nvidia.com/gpu"));
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

#[cfg(test)]
mod pace_tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    fn status(phase: GroupPhase, pods: i32, admitted: (&str, &str, &str)) -> PodGroupStatus {
        let (status, reason, message) = admitted;
        PodGroupStatus {
            phase: Some(phase),
            pods,
            conditions: vec![Condition {
                type_: "Admitted".into(),
                status: status.into(),
                reason: reason.into(),
                message: message.into(),
                last_transition_time: Time(Timestamp::UNIX_EPOCH),
                observed_generation: None,
            }],
            ..PodGroupStatus::default()
        }
    }

    #[test]
    fn a_write_waits_for_its_pace_after_the_groups_last_write_and_for_a_plans_hold() {
        use std::time::Duration;
        let t0 = Instant::now();
        let s = |ms: u64| t0 + Duration::from_millis(ms);
        let written = |ms| StatusPacing { written: Some(s(ms)), hold: None };
        let held = |w, h| StatusPacing { written: Some(s(w)), hold: Some(s(h)) };
        let cases = [
            ("never written: now", Pace::Standing, StatusPacing::default(), 0, None),
            ("counts, never written: now", Pace::Counts, StatusPacing::default(), 0, None),
            ("a phase 0.3 s after a write: at 1 s", Pace::Standing, written(0), 300, Some(s(1_000))),
            ("a phase 1 s after a write: now", Pace::Standing, written(0), 1_000, None),
            ("counts 1 s after a write: at 5 s", Pace::Counts, written(0), 1_000, Some(s(5_000))),
            ("counts 5 s after a write: now", Pace::Counts, written(0), 5_000, None),
            (
                "a phase while a plan's binds are held: at the hold's end",
                Pace::Standing,
                held(0, 5_000),
                1_200,
                Some(s(5_000)),
            ),
            ("counts past the hold: their own pace", Pace::Counts, held(4_000, 4_500), 4_600, Some(s(9_000))),
            (
                "a young group, never written: when old enough",
                Pace::Young(Duration::from_millis(700)),
                StatusPacing::default(),
                0,
                Some(s(700)),
            ),
            (
                "a young group just committed: its plan's pace",
                Pace::Young(Duration::from_millis(200)),
                written(100),
                100,
                Some(s(1_100)),
            ),
        ];
        for (case, pace, pacing, at, want) in cases {
            assert_eq!(due_at(pace, pacing, s(at)), want, "{case}");
        }
        assert!(written(0).live(s(4_999)) && !written(0).live(s(5_000)), "kept while a count pace can wait on it");
        assert!(held(0, 6_000).live(s(5_500)));
    }

    #[test]
    fn a_status_sent_is_not_sent_again_while_the_cache_shows_the_version_it_was_computed_on() {
        let stamped = |secs: i64, running: i32| {
            let mut s = status(GroupPhase::Admitted, 3, ("True", "Admitted", "fits"));
            s.running = running;
            s.conditions[0].last_transition_time = Time(Timestamp::from_second(secs).expect("ts"));
            serde_json::to_value(&s).expect("json")
        };
        let v7 = Some("7".to_string());
        let sent = SentStatus::of(&v7, &stamped(10, 1));
        assert!(sent.is(&v7, &stamped(10, 1)), "the same status on the same version");
        assert!(sent.is(&v7, &stamped(12, 1)), "stamped again on the stale cache: still the same");
        assert!(!sent.is(&v7, &stamped(10, 2)), "another status: sent");
        assert!(!sent.is(&Some("9".to_string()), &stamped(10, 1)), "computed on another version: sent");
    }

    #[test]
    fn the_plan_clear_carries_the_status_fields_admission_computes() {
        let waiting = status(GroupPhase::Pending, 1, ("False", "Waiting", "1 of 3 pods exist"));
        let old = PodGroupStatus {
            message: Some("waiting".into()),
            observed_generation: Some(1),
            rollbacks: 2,
            resource_claim_statuses: vec![crate::crds::scheduling::PodGroupResourceClaimStatus {
                name: "shared".into(),
                resource_claim_name: Some("c".into()),
            }],
            ..waiting
        };
        let new = PodGroupStatus {
            message: None,
            observed_generation: Some(2),
            ..status(GroupPhase::Admitted, 3, ("True", "Admitted", "fits"))
        };
        let body = fold_body(Some(&old), &new);
        let map = body.as_object().expect("an object");
        assert_eq!(map["plan"], serde_json::Value::Null, "the plan is cleared");
        assert_eq!(map["phase"], "Admitted");
        assert_eq!(map["pods"], 3);
        assert_eq!(map["observedGeneration"], 2);
        assert_eq!(map["conditions"][0]["reason"], "Admitted", "the conditions as computed");
        assert_eq!(map["message"], serde_json::Value::Null, "a field no longer set is removed");
        for theirs in ["rollbacks", "recentRollbacks", "lastRollbackTime", "avoidNodes", "resourceClaimStatuses"] {
            assert!(!map.contains_key(theirs), "{theirs} has a writer of its own");
        }
        // Nothing cached before: the computed fields and the plan's null only.
        let first = fold_body::<PodGroupStatus>(None, &new);
        assert_eq!(first["plan"], serde_json::Value::Null);
        assert!(!first.as_object().expect("an object").contains_key("message"));
    }
}

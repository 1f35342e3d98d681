//! The commit protocol's state machine: from a recorded plan and its pods as they are now,
//! [`next_step`] says what the shell does next (patch, wait, clear, roll back, fail the gang).

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::failure::{FailureCause, PinFailure};
use super::pins::{PinState, PlannedPodNow, StartRequirement};
use super::plus;
use super::remaining::RemainingFits;
use crate::scheduler::DeviceLoss;
use muster_api::blocks::DisruptionModeKind;
use muster_api::scheduling::{AdmissionPlan, PlanState};

/// The API server refused a planned pod's patch (a webhook, a ValidatingAdmissionPolicy, a
/// validation rule): the pod can never be pinned as planned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PatchRefused {
    /// The pod's UID.
    pub uid: String,
    /// The API server's message.
    pub message: String,
}

/// Everything [`next_step`] decides on.
#[derive(Clone, Debug)]
pub struct CommitInput<'a> {
    /// The recorded plan.
    pub plan: &'a AdmissionPlan,
    /// Each planned pod as it is now, in the plan's order.
    pub pods: &'a [PlannedPodNow],
    /// The time of the decision.
    pub now: Timestamp,
    /// How long an ungated pod may stay unbound.
    pub bind_timeout: Duration,
    /// What counts as a started gang.
    pub requirement: &'a StartRequirement,
    /// The root's disruption mode.
    pub disruption: DisruptionModeKind,
    /// Whether the rest of a plan cut short still fits (read for `Planned`/`Committing` only).
    pub remaining_fits: RemainingFits,
    /// A patch of the plan the API server refused (read for `Planned`/`Committing` only).
    pub refused: Option<&'a PatchRefused>,
    /// A device of the plan's claims that another claim holds too ([`crate::scheduler::Dra::lost_device`]):
    /// muster and another allocator wrote it at the same moment; the plan lost it.
    pub lost: Option<&'a DeviceLoss>,
    /// How long after its creation a plan that allocated DRA claims is followed at least,
    /// every pod bound or not: another allocator's write of one of its devices may land just
    /// after the binds (kube-scheduler binds a plain pod it decided on before it saw muster's
    /// allocation), and only a followed plan can still be rolled back.
    pub claim_settle: Duration,
    /// Whether a planned pod is bound but not running yet.
    pub starting: bool,
    /// Whether a pod of the root outside the plan waits gated for a decision (a replacement, an
    /// elastic gang's next pods): the root is not decided while its plan is followed, so the
    /// plan does not wait for its pods to start.
    pub waiting: bool,
    /// How long after its creation a plan whose pods are all bound is still followed while
    /// some of them start: its clear then writes the group's status with the pods running,
    /// one status write for admitted, scheduled and running, where two went before (zero: the
    /// plan is done at the last bind).
    pub start_settle: Duration,
}

/// A failed attempt to undo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RollBack {
    /// UIDs of every existing, unfinished pod of the attempt: delete them all.
    pub delete: Vec<String>,
    /// Nodes the next plans of this root avoid (where pins failed).
    pub avoid_nodes: BTreeSet<String>,
    /// What failed.
    pub failure: PinFailure,
}

/// What the shell does next with a recorded plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// No pod was ungated and the plan cannot go on: clear it, plan the root afresh.
    Drop,
    /// Resume a commit cut short: patch these still-gated pods (UIDs), then record the plan
    /// `Admitted` (the resumed pods get the whole bind timeout from then).
    Patch(Vec<String>),
    /// Nothing to do before this time (the bind deadline).
    WaitUntil(Timestamp),
    /// Every pod bound, finished or gone: clear the plan.
    Done,
    /// A pin failed before the gang started: delete every pod of the attempt (recreated
    /// gated by their controller), clear the plan, avoid the failed nodes.
    RollBack(RollBack),
    /// A pin failed after the gang started whole: clear the plan, say so, and with disruption
    /// mode `all` delete these pods to replace the gang (`single`: `delete` is empty).
    GangFailed {
        /// UIDs of the pods to delete (mode `all`), else empty.
        delete: Vec<String>,
        /// What failed.
        failure: PinFailure,
    },
}

/// The next step of the commit protocol for one recorded plan.
pub fn next_step(input: &CommitInput<'_>) -> Step {
    let live: Vec<&PlannedPodNow> = input.pods.iter().filter(|p| p.exists()).collect();
    // A device two claims hold: whatever state the plan is in, its attempt lost it. Every pod
    // of the attempt goes (recreated gated), so its claims are freed and no device stays in
    // two claims; the next plan sees the device held by the other claim.
    if let Some(loss) = input.lost
        && let Some(first) = live.iter().copied().find(|p| p.state != PinState::Finished)
    {
        return Step::RollBack(roll_back(&live, first, BTreeSet::new(), FailureCause::DeviceTaken(loss.to_string())));
    }
    match input.plan.state {
        // A commit that ungated every live pod went through whole: it is not recorded
        // `Admitted` (one write less per gang), its binds are watched from the plan's creation.
        PlanState::Planned | PlanState::Committing
            if !live.is_empty() && live.iter().all(|p| p.state != PinState::Gated) =>
        {
            watch_binds(input, &live)
        }
        PlanState::Planned | PlanState::Committing => resume(input, &live),
        PlanState::Admitted => watch_binds(input, &live),
    }
}

/// `Planned`/`Committing`: finish the patches, or drop/roll back a plan that cannot go on.
fn resume(input: &CommitInput<'_>, live: &[&PlannedPodNow]) -> Step {
    let gated: Vec<&PlannedPodNow> = live.iter().copied().filter(|p| p.state == PinState::Gated).collect();
    if gated.len() == live.len() {
        return Step::Drop;
    }
    let Some(first_gated) = gated.first() else {
        // Nothing gated and nothing live: dropped above; every live pod ungated is watched.
        return Step::Drop;
    };
    if let Some(refused) = input.refused
        && let Some(pod) = live.iter().copied().find(|p| p.uid == refused.uid)
    {
        let cause = FailureCause::PatchRefused(refused.message.clone());
        return Step::RollBack(roll_back(live, pod, BTreeSet::new(), cause));
    }
    let lost_node = gated.iter().copied().find(|p| !p.node_exists);
    match (&input.remaining_fits, lost_node) {
        (_, Some(lost)) => Step::RollBack(roll_back(live, lost, nodes_of(&[lost]), FailureCause::NodeGone)),
        // Which node no longer fits is the ledger's to say: the next plan is made against it.
        (RemainingFits::No(why), None) => {
            Step::RollBack(roll_back(live, first_gated, BTreeSet::new(), FailureCause::NoLongerFits(why.clone())))
        }
        (RemainingFits::Yes, None) => Step::Patch(gated.iter().map(|p| p.uid.clone()).collect()),
    }
}

/// `Admitted`: wait for binds; a pin that fails rolls the attempt back or fails the gang.
fn watch_binds(input: &CommitInput<'_>, live: &[&PlannedPodNow]) -> Step {
    let unbound: Vec<&PlannedPodNow> = live.iter().copied().filter(|p| p.unbound()).collect();
    let plan = input.plan;
    if unbound.is_empty() {
        let claims = !plan.shared_claims.is_empty() || plan.pods.iter().any(|p| !p.claims.is_empty());
        let created = plan.created_at.as_ref().map(|t| t.0);
        let claim_settle = if claims { input.claim_settle } else { Duration::ZERO };
        let start_settle = if input.starting && !input.waiting { input.start_settle } else { Duration::ZERO };
        let settle = claim_settle.max(start_settle);
        return match created.map(|c| plus(c, settle)) {
            Some(settled) if !settle.is_zero() && input.now < settled => Step::WaitUntil(settled),
            _ => Step::Done,
        };
    }
    let since = plan.admitted_at.as_ref().or(plan.created_at.as_ref()).map_or(input.now, |t| t.0);
    let deadline = plus(since, input.bind_timeout);
    let timed_out = input.now >= deadline;
    let failed: Vec<&PlannedPodNow> = unbound.iter().copied().filter(|p| timed_out || !p.node_exists).collect();
    let Some(first) = failed.first().copied() else {
        return Step::WaitUntil(deadline);
    };
    let cause = if first.node_exists { FailureCause::BindTimeout(input.bind_timeout) } else { FailureCause::NodeGone };
    if input.requirement.unmet(live) {
        return Step::RollBack(roll_back(live, first, nodes_of(&failed), cause));
    }
    let failure = failure(live, first, cause);
    let delete = match input.disruption {
        DisruptionModeKind::All => unfinished(live),
        DisruptionModeKind::Single => Vec::new(),
    };
    Step::GangFailed { delete, failure }
}

fn roll_back(live: &[&PlannedPodNow], first: &PlannedPodNow, avoid: BTreeSet<String>, cause: FailureCause) -> RollBack {
    RollBack { delete: unfinished(live), avoid_nodes: avoid, failure: failure(live, first, cause) }
}

/// UIDs of the pods that have not finished (a finished pod of an attempt is left alone).
fn unfinished(live: &[&PlannedPodNow]) -> Vec<String> {
    live.iter().filter(|p| p.state != PinState::Finished).map(|p| p.uid.clone()).collect()
}

fn nodes_of(pods: &[&PlannedPodNow]) -> BTreeSet<String> {
    pods.iter().map(|p| p.node.clone()).collect()
}

/// The failure of `first`, with the plan's counts.
fn failure(live: &[&PlannedPodNow], first: &PlannedPodNow, cause: FailureCause) -> PinFailure {
    let scheduler_message = match &first.state {
        // `SchedulingGated` is no refusal: another gate still held the pod.
        PinState::Unbound { refusal: Some(r) } if !r.message.is_empty() && r.reason != "SchedulingGated" => {
            Some(r.message.clone())
        }
        _ => None,
    };
    PinFailure {
        pod: first.name.clone(),
        node: first.node.clone(),
        cause,
        scheduler_message,
        unbound: live.iter().filter(|p| p.unbound()).count(),
        planned: live.len(),
    }
}

#[cfg(test)]
mod tests;

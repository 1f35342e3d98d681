//! PURE: the commit protocol's decisions. From a recorded [`AdmissionPlan`], the plan's pods as
//! they are now, `now` and the bind timeout, [`next_step`] says what the shell does next:
//! resume the patches, wait, clear the plan, roll the attempt back, or fail a gang that did
//! start. Also the rollback memory of a root ([`RollbackHistory`]): which nodes the next plans
//! avoid, until when, and when repeated rollbacks make the gang unschedulable.
//! No client, no clock: the shell reads the pods and carries the step out.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::resources::Resources;
use super::snapshot::Snapshot;
use super::tree::{CompositePolicy, Group, GroupTree, LeafPolicy};
use muster_api::blocks::DisruptionModeKind;
use muster_api::scheduling::{AdmissionPlan, PlanState};
use crate::devices::GpuSet;

/// Where one planned pod stands now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PinState {
    /// No pod with the planned UID exists.
    Gone,
    /// Being deleted.
    Terminating,
    /// Still held by the admission gate (not patched yet).
    Gated,
    /// Ungated (pinned) but not bound; `refusal` is kube-scheduler's word on it, if any.
    Unbound {
        /// The pod's `PodScheduled=False` condition.
        refusal: Option<Refusal>,
    },
    /// Bound to this node.
    Bound {
        /// Node name.
        node: String,
    },
    /// Succeeded or failed.
    Finished,
}

/// kube-scheduler's `PodScheduled=False` condition of a pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Refusal {
    /// The condition's reason (`Unschedulable`, `SchedulerError`).
    pub reason: String,
    /// The condition's message ("0/3 nodes are available: ...").
    pub message: String,
}

/// One pod of the plan as it is now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedPodNow {
    /// Pod name.
    pub name: String,
    /// Pod UID, as planned.
    pub uid: String,
    /// The PodGroup the pod belongs to.
    pub pod_group: String,
    /// The node it was planned on.
    pub node: String,
    /// Whether that node still exists.
    pub node_exists: bool,
    /// Where the pod stands.
    pub state: PinState,
}

impl PlannedPodNow {
    fn exists(&self) -> bool {
        !matches!(self.state, PinState::Gone | PinState::Terminating)
    }

    /// Bound or finished: kube-scheduler placed it, so it counts as started.
    fn started(&self) -> bool {
        matches!(self.state, PinState::Bound { .. } | PinState::Finished)
    }

    /// Existing, ungated or not, and not placed by kube-scheduler yet.
    fn unbound(&self) -> bool {
        matches!(self.state, PinState::Gated | PinState::Unbound { .. })
    }
}

/// How many pods of an attempt must run for the gang to count as started: the `minCount` of
/// each PodGroup with pods in the plan (a PodGroup root: its own; a composite root: each
/// leaf's). A group without an entry needs 1. A plan that only adds pods to a gang already
/// running (fewer than minCount) thus rolls back just those pods when one fails.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StartRequirement {
    /// PodGroup name -> minCount (1 for a basic group).
    pub min_count: BTreeMap<String, u32>,
}

impl StartRequirement {
    /// A requirement for one PodGroup.
    pub fn leaf(name: &str, min_count: u32) -> Self {
        Self { min_count: BTreeMap::from([(name.to_string(), min_count)]) }
    }

    /// Whether some group has fewer started pods than required.
    fn unmet(&self, pods: &[&PlannedPodNow]) -> bool {
        let mut planned: BTreeMap<&str, u32> = BTreeMap::new();
        for p in pods {
            *planned.entry(p.pod_group.as_str()).or_default() += u32::from(p.started());
        }
        planned.into_iter().any(|(group, started)| started < self.min_count.get(group).copied().unwrap_or(1).max(1))
    }
}

/// Whether what is left of a plan cut short still fits the cluster as rebuilt: see
/// [`remaining_fits`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RemainingFits {
    /// It fits.
    Yes,
    /// It does not, and why.
    No(String),
}

/// A still-gated pod of a plan cut short, as [`remaining_fits`] checks it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatedPin {
    /// Pod name.
    pub name: String,
    /// The planned node.
    pub node: String,
    /// The pod's requests (as kube-scheduler's NodeResourcesFit counts them).
    pub requests: Resources,
    /// The GPU indices planned for it.
    pub gpus: GpuSet,
    /// Of those, the ones its own DRA claims hold already (allocated by this plan before the
    /// commit was cut short): the snapshot counts them used, but not against the pin itself.
    pub own_gpus: GpuSet,
}

/// Pods of one planned PodGroup that can count toward its minCount when a plan cut short is
/// resumed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupCount {
    /// Existing pods of the group: the plan's live ones and those started before it.
    pub existing: u32,
    /// The group's minCount (1 for a basic group).
    pub min_count: u32,
}

/// Re-checks what is left of a plan cut short (muster stopped between two patches) against
/// the cluster as rebuilt: each PodGroup of the plan still has `minCount` pods (pods deleted
/// meanwhile), and each still-gated pod still fits its planned node, in plan order, with the
/// requests and GPU indices of the pods already counted on it (bound or admitted while muster
/// was down, and the plan's pods checked before it). `snapshot` counts every pod bound or
/// admitted, and the GPU indices of the ledger; the gated pods of the plan are not in it.
pub fn remaining_fits(snapshot: &Snapshot, pins: &[GatedPin], groups: &BTreeMap<String, GroupCount>) -> RemainingFits {
    if let Some((group, c)) = groups.iter().find(|(_, c)| c.existing < c.min_count.max(1)) {
        return RemainingFits::No(format!(
            "group \"{group}\" has {} pod(s) left, fewer than its minCount {}",
            c.existing, c.min_count
        ));
    }
    let mut taken: BTreeMap<&str, (Resources, GpuSet)> = BTreeMap::new();
    for pin in pins {
        // A node that is gone is the state machine's own case (NodeGone).
        let Some(node) = snapshot.node(&pin.node) else { continue };
        if let Some(why) = &node.unusable {
            return RemainingFits::No(format!("node {} is unusable ({why:?})", node.name));
        }
        let (requested, gpus) =
            taken.entry(pin.node.as_str()).or_insert_with(|| (node.requested.clone(), node.gpu_used));
        for (resource, amount) in pin.requests.iter().filter(|(_, a)| *a > 0) {
            let free = node.allocatable.get(resource) - requested.get(resource);
            if amount > free {
                return RemainingFits::No(format!(
                    "pod {} needs {amount} {resource} on node {}, {free} left",
                    pin.name, node.name
                ));
            }
        }
        let held = pin.gpus.intersection(gpus.difference(pin.own_gpus));
        let missing = pin.gpus.difference(node.gpus());
        if !held.is_empty() || !missing.is_empty() {
            let what = if held.is_empty() { "no longer on the node" } else { "now held by another pod or unhealthy" };
            return RemainingFits::No(format!(
                "GPU indices {} planned for pod {} on node {} are {what}",
                held.union(missing),
                pin.name,
                node.name
            ));
        }
        requested.add(&pin.requests);
        *gpus = gpus.union(pin.gpus);
    }
    RemainingFits::Yes
}

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
}

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
        };
        let quote = self.scheduler_message.as_deref().or(fallback).map(|m| format!(": {m}")).unwrap_or_default();
        format!("pod {} {why}{quote}; {} of {} planned pod(s) unbound", self.pod, self.unbound, self.planned)
    }
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
    if unbound.is_empty() {
        return Step::Done;
    }
    let plan = input.plan;
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

/// A gang of a root in disruption mode `all` that lost pods after it started: the pods of
/// the gang still running, to delete so the gang restarts whole (their controller recreates
/// them gated, with the lost ones).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disrupted {
    /// The gang PodGroup.
    pub group: String,
    /// Its started pods left (bound or admitted, live).
    pub started: u32,
    /// Its minCount.
    pub min_count: u32,
    /// The started pods (name, UID): delete them all.
    pub delete: Vec<(String, String)>,
    /// Set when this gang lost nothing itself: the gang of the same CompositePodGroup tree
    /// that did, which takes it down with it.
    pub with: Option<String>,
}

/// The gangs of a tree (under a root in disruption mode `all`) that started and then lost
/// pods, so fewer than minCount of them are still started: left alone, the lost pods'
/// replacements would be placed one by one beside the survivors, or wait gated while the
/// survivors run, a gang partly started. Mode `all` says the gang is disrupted as a whole.
/// Pods that finished (`finished`: per PodGroup, succeeded or failed) count as started: a pod
/// that completed is no disruption. A tree whose root has a plan in flight is the commit
/// protocol's, not this check's. Under a gang CompositePodGroup root the set was admitted as one,
/// so one gang disrupted takes the started pods of every other group of the tree down too: the
/// set starts again whole, not a driver running beside workers that wait gated.
pub fn disrupted(tree: &GroupTree, finished: &BTreeMap<String, u32>) -> Vec<Disrupted> {
    let mut out = Vec::new();
    collect_disrupted(&tree.root, finished, &mut out);
    let set_as_one = matches!(&tree.root, Group::Composite(c) if matches!(c.policy, CompositePolicy::Gang { .. }));
    if let (Some(first), true) = (out.first(), set_as_one) {
        let cause = first.group.clone();
        let hit: BTreeSet<String> = out.iter().map(|d| d.group.clone()).collect();
        collect_with(&tree.root, &hit, &cause, &mut out);
    }
    out
}

/// The groups of a tree not in `hit` that have started pods, taken down with gang `cause`.
fn collect_with(group: &Group, hit: &BTreeSet<String>, cause: &str, out: &mut Vec<Disrupted>) {
    match group {
        Group::Composite(c) => c.children.iter().for_each(|g| collect_with(g, hit, cause, out)),
        Group::Leaf(l) if !hit.contains(&l.name) => {
            let started = l.placed_names();
            if !started.is_empty() {
                let min_count = match l.policy {
                    LeafPolicy::Gang { min_count } => min_count,
                    LeafPolicy::Basic => 0,
                };
                let n = u32::try_from(started.len()).unwrap_or(u32::MAX);
                out.push(Disrupted {
                    group: l.name.clone(),
                    started: n,
                    min_count,
                    delete: started,
                    with: Some(cause.to_string()),
                });
            }
        }
        Group::Leaf(_) => {}
    }
}

fn collect_disrupted(group: &Group, finished: &BTreeMap<String, u32>, out: &mut Vec<Disrupted>) {
    match group {
        Group::Composite(c) => c.children.iter().for_each(|g| collect_disrupted(g, finished, out)),
        Group::Leaf(l) => {
            let LeafPolicy::Gang { min_count } = l.policy else { return };
            let started = l.placed_names();
            let n = u32::try_from(started.len()).unwrap_or(u32::MAX);
            let done = finished.get(&l.name).copied().unwrap_or(0);
            if n > 0 && n.saturating_add(done) < min_count {
                out.push(Disrupted { group: l.name.clone(), started: n, min_count, delete: started, with: None });
            }
        }
    }
}

/// How rollbacks pace a root: how long failed nodes are avoided, and when repeated rollbacks
/// make the gang unschedulable for a while.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RollbackPolicy {
    /// How long the first rollback avoids its nodes; doubled for each recent one after.
    pub avoid_for: Duration,
    /// The longest a node is avoided.
    pub max_avoid: Duration,
    /// Rollbacks less than this apart count as recent (one streak).
    pub window: Duration,
    /// Recent rollbacks after which the gang is unschedulable until [`RollbackHistory::retry_at`].
    pub unschedulable_after: u32,
    /// The first wait once unschedulable; doubled for each recent rollback after.
    pub retry_backoff: Duration,
}

impl RollbackPolicy {
    /// Avoid for 5 minutes, doubled per recent rollback up to an hour; 3 rollbacks less than
    /// 10 minutes apart make the gang unschedulable for a minute, doubled per rollback after.
    pub const DEFAULT: Self = Self {
        avoid_for: Duration::from_secs(5 * 60),
        max_avoid: Duration::from_secs(60 * 60),
        window: Duration::from_secs(10 * 60),
        unschedulable_after: 3,
        retry_backoff: Duration::from_secs(60),
    };
}

impl Default for RollbackPolicy {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// What a root remembers of its rollbacks (the shell keeps it on the root's status, so a
/// restart or a new leader keeps avoiding the same nodes).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RollbackHistory {
    /// Rollbacks of the root so far: the gang attempt number of pods created after them.
    pub count: u32,
    /// Rollbacks in the current streak (each less than `window` after the one before).
    pub recent: u32,
    /// When the last one happened.
    pub last: Option<Timestamp>,
    /// Node name -> until when placement avoids it.
    pub avoid: BTreeMap<String, Timestamp>,
}

fn plus(t: Timestamp, d: Duration) -> Timestamp {
    SignedDuration::try_from(d).ok().and_then(|d| t.checked_add(d).ok()).unwrap_or(Timestamp::MAX)
}

/// `base * 2^exp`, at most `max`.
fn doubled(base: Duration, exp: u32, max: Duration) -> Duration {
    base.saturating_mul(1u32 << exp.min(20)).min(max)
}

impl RollbackHistory {
    /// Records a rollback at `now` whose pins failed on `nodes`; forgets expired avoidances.
    pub fn record(&mut self, nodes: &BTreeSet<String>, now: Timestamp, policy: &RollbackPolicy) {
        let in_streak = self.last.is_some_and(|last| now < plus(last, policy.window));
        self.recent = if in_streak { self.recent.saturating_add(1) } else { 1 };
        self.count = self.count.saturating_add(1);
        self.last = Some(now);
        let until = plus(now, doubled(policy.avoid_for, self.recent - 1, policy.max_avoid));
        for node in nodes {
            let entry = self.avoid.entry(node.clone()).or_insert(until);
            *entry = (*entry).max(until);
        }
        self.avoid.retain(|_, until| *until > now);
    }

    /// The nodes placement avoids at `now`.
    pub fn avoided(&self, now: Timestamp) -> BTreeSet<String> {
        self.avoid.iter().filter(|(_, until)| **until > now).map(|(n, _)| n.clone()).collect()
    }

    /// When a gang with too many recent rollbacks may be planned again; `None` while the streak
    /// is short of [`RollbackPolicy::unschedulable_after`].
    pub fn retry_at(&self, policy: &RollbackPolicy) -> Option<Timestamp> {
        let last = self.last?;
        let over = self.recent.checked_sub(policy.unschedulable_after.max(1))?;
        Some(plus(last, doubled(policy.retry_backoff, over, policy.max_avoid)))
    }

    /// True when rollbacks came so often that the gang waits, unschedulable, until `retry_at`.
    pub fn unschedulable(&self, now: Timestamp, policy: &RollbackPolicy) -> bool {
        self.retry_at(policy).is_some_and(|at| now < at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    const TIMEOUT: Duration = Duration::from_secs(60);

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_000_000 + s).expect("timestamp")
    }

    /// A pod `name` of group `group`, planned on node `node`.
    fn pod(name: &str, group: &str, node: &str, state: PinState) -> PlannedPodNow {
        PlannedPodNow {
            name: name.into(),
            uid: format!("uid-{name}"),
            pod_group: group.into(),
            node: node.into(),
            node_exists: true,
            state,
        }
    }

    fn gated(name: &str) -> PlannedPodNow {
        pod(name, "g", "n1", PinState::Gated)
    }

    fn unbound(name: &str) -> PlannedPodNow {
        pod(name, "g", "n1", PinState::Unbound { refusal: None })
    }

    fn refused(name: &str, message: &str) -> PlannedPodNow {
        let refusal = Refusal { reason: "Unschedulable".into(), message: message.into() };
        pod(name, "g", "n1", PinState::Unbound { refusal: Some(refusal) })
    }

    fn bound(name: &str) -> PlannedPodNow {
        pod(name, "g", "n1", PinState::Bound { node: "n1".into() })
    }

    fn node_gone(mut p: PlannedPodNow) -> PlannedPodNow {
        p.node_exists = false;
        p
    }

    fn on(mut p: PlannedPodNow, node: &str) -> PlannedPodNow {
        p.node = node.into();
        if let PinState::Bound { node: n } = &mut p.state {
            *n = node.into();
        }
        p
    }

    fn in_group(mut p: PlannedPodNow, group: &str) -> PlannedPodNow {
        p.pod_group = group.into();
        p
    }

    /// A plan in `state`, admitted (or created) at time 0.
    fn plan(state: PlanState) -> AdmissionPlan {
        AdmissionPlan {
            id: "p-1".into(),
            state,
            created_at: Some(Time(at(0))),
            admitted_at: (state == PlanState::Admitted).then(|| Time(at(0))),
            pods: vec![],
            shared_claims: vec![],
        }
    }

    fn uids(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| format!("uid-{n}")).collect()
    }

    fn nodes(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    struct Case {
        name: &'static str,
        state: PlanState,
        pods: Vec<PlannedPodNow>,
        now: i64,
        requirement: StartRequirement,
        disruption: DisruptionModeKind,
        fits: RemainingFits,
        refused: Option<PatchRefused>,
        want: Step,
    }

    impl Default for Case {
        fn default() -> Self {
            Self {
                name: "",
                state: PlanState::Admitted,
                pods: vec![],
                now: 0,
                requirement: StartRequirement::leaf("g", 2),
                disruption: DisruptionModeKind::Single,
                fits: RemainingFits::Yes,
                refused: None,
                want: Step::Done,
            }
        }
    }

    fn run(cases: Vec<Case>) {
        for case in cases {
            let plan = plan(case.state);
            let input = CommitInput {
                plan: &plan,
                pods: &case.pods,
                now: at(case.now),
                bind_timeout: TIMEOUT,
                requirement: &case.requirement,
                disruption: case.disruption,
                remaining_fits: case.fits.clone(),
                refused: case.refused.as_ref(),
            };
            assert_eq!(next_step(&input), case.want, "case: {}", case.name);
        }
    }

    fn failure(pod: &str, node: &str, cause: FailureCause, unbound: usize, planned: usize) -> PinFailure {
        PinFailure { pod: pod.into(), node: node.into(), cause, scheduler_message: None, unbound, planned }
    }

    #[test]
    fn a_started_gang_below_min_count_is_disrupted_whole() {
        use crate::scheduler::tree::{LeafGroup, PodState};
        let leaf = |name: &str, policy: LeafPolicy, states: Vec<PodState>| {
            let mut l = LeafGroup::new(name, policy);
            for (i, s) in states.into_iter().enumerate() {
                l.push(&format!("{name}-{i}"), &format!("u-{name}-{i}"), s);
            }
            l
        };
        let bound = || PodState::Bound { node: "n".into() };
        let pinned = || PodState::Admitted { hostname: "n".into() };
        let gated = || PodState::Gated { shape: 0 };
        let gang = |m| LeafPolicy::Gang { min_count: m };
        let cases = [
            ("whole gang running", leaf("a", gang(3), vec![bound(), bound(), pinned()]), vec![]),
            ("not started yet", leaf("a", gang(3), vec![gated(), gated(), gated()]), vec![]),
            ("one lost, its replacement gated", leaf("a", gang(3), vec![bound(), pinned(), gated()]), vec![2]),
            ("one lost, not replaced yet", leaf("a", gang(3), vec![bound(), bound()]), vec![2]),
            ("extra pods beyond minCount lost", leaf("a", gang(2), vec![bound(), bound(), gated()]), vec![]),
            ("a basic group runs what it has", leaf("a", LeafPolicy::Basic, vec![bound(), gated()]), vec![]),
        ];
        for (name, l, want) in cases {
            let tree = GroupTree::new("ns", l);
            let got: Vec<u32> = disrupted(&tree, &BTreeMap::new()).iter().map(|d| d.started).collect();
            assert_eq!(got, want, "{name}");
        }
        let early = GroupTree::new("ns", leaf("a", gang(3), vec![bound(), bound()]));
        let done = BTreeMap::from([("a".to_string(), 1)]);
        assert_eq!(disrupted(&early, &done), vec![], "a pod that completed is no disruption");
        let l = leaf("a", gang(3), vec![bound(), gated(), pinned()]);
        let d = disrupted(&GroupTree::new("ns", l), &BTreeMap::new());
        let names: Vec<&str> = d[0].delete.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a-0", "a-2"], "the started pods are deleted, the gated ones kept");

        // A set admitted as one (gang composite): the workers lose a pod, the running driver goes
        // down with them, and a child not started yet has nothing to delete.
        use crate::scheduler::tree::CompositeGroup;
        let set = |policy| {
            CompositeGroup::new("set", policy)
                .with_child(leaf("driver", gang(1), vec![bound()]))
                .with_child(leaf("workers", gang(2), vec![bound(), gated()]))
                .with_child(leaf("idle", gang(1), vec![gated()]))
        };
        let d = disrupted(&GroupTree::new("ns", set(CompositePolicy::Gang { min_group_count: 3 })), &BTreeMap::new());
        let got: Vec<(&str, Option<&str>, usize)> =
            d.iter().map(|d| (d.group.as_str(), d.with.as_deref(), d.delete.len())).collect();
        assert_eq!(got, [("workers", None, 1), ("driver", Some("workers"), 1)]);
        let d = disrupted(&GroupTree::new("ns", set(CompositePolicy::Basic)), &BTreeMap::new());
        let got: Vec<&str> = d.iter().map(|d| d.group.as_str()).collect();
        assert_eq!(got, ["workers"], "children admitted one by one go down one by one");
        let whole = CompositeGroup::new("set", CompositePolicy::Gang { min_group_count: 2 })
            .with_child(leaf("driver", gang(1), vec![bound()]))
            .with_child(leaf("workers", gang(2), vec![bound(), bound()]));
        assert_eq!(disrupted(&GroupTree::new("ns", whole), &BTreeMap::new()), vec![], "nothing lost: nothing down");
    }

    #[test]
    fn a_refused_patch_rolls_the_attempt_back_and_an_untouched_plan_is_dropped() {
        let refusal = PatchRefused { uid: "uid-b".into(), message: "denied by policy".into() };
        let cause = FailureCause::PatchRefused("denied by policy".into());
        run(vec![
            Case {
                name: "one pod ungated, the next refused: roll back both",
                state: PlanState::Committing,
                pods: vec![unbound("a"), gated("b")],
                refused: Some(refusal.clone()),
                want: Step::RollBack(RollBack {
                    delete: uids(&["a", "b"]),
                    avoid_nodes: BTreeSet::new(),
                    failure: failure("b", "n1", cause, 2, 2),
                }),
                ..Case::default()
            },
            Case {
                name: "the first pod refused: nothing ungated, drop the plan",
                state: PlanState::Committing,
                pods: vec![gated("a"), gated("b")],
                refused: Some(refusal.clone()),
                want: Step::Drop,
                ..Case::default()
            },
            Case {
                name: "a refusal of a pod no longer in the plan changes nothing",
                state: PlanState::Committing,
                pods: vec![unbound("a"), gated("c")],
                refused: Some(refusal),
                want: Step::Patch(uids(&["c"])),
                ..Case::default()
            },
        ]);
    }

    #[test]
    fn what_is_left_of_a_plan_is_checked_against_the_rebuilt_cluster() {
        use crate::scheduler::snapshot::NodeInfo;
        let node = |name: &str, used: u64| {
            NodeInfo::new(name, Resources::new().with("cpu", 8000).with("nvidia.com/gpu", 8))
                .with_requested(Resources::new().with("cpu", 2000))
                .with_gpu_used(GpuSet::from_bits(used))
        };
        let snapshot = Snapshot::new(vec![node("n1", 0b0000_0011), node("n2", 0)]);
        let pin = |name: &str, node: &str, cpu: i64, gpus: u64| GatedPin {
            name: name.into(),
            node: node.into(),
            requests: Resources::new().with("cpu", cpu).with("nvidia.com/gpu", i64::from(gpus.count_ones())),
            gpus: GpuSet::from_bits(gpus),
            own_gpus: GpuSet::EMPTY,
        };
        let own = |mut pin: GatedPin, bits: u64| {
            pin.own_gpus = GpuSet::from_bits(bits);
            pin
        };
        let quorate = BTreeMap::from([("g".to_string(), GroupCount { existing: 2, min_count: 2 })]);
        type Case<'a> = (&'a str, Vec<GatedPin>, BTreeMap<String, GroupCount>, Option<&'a str>);
        let cases: Vec<Case<'_>> = vec![
            (
                "free GPUs and cpu: fits",
                vec![pin("a", "n1", 1000, 0b1100), pin("b", "n2", 6000, 0b1)],
                quorate.clone(),
                None,
            ),
            (
                "an index taken while muster was down",
                vec![pin("a", "n1", 1000, 0b0110)],
                quorate.clone(),
                Some("GPU indices 1 planned for pod a on node n1 are now held by another pod or unhealthy"),
            ),
            (
                "cpu taken meanwhile",
                vec![pin("a", "n1", 7000, 0)],
                quorate.clone(),
                Some("pod a needs 7000 cpu on node n1, 6000 left"),
            ),
            (
                "two planned pods count against each other",
                vec![pin("a", "n2", 5000, 0), pin("b", "n2", 5000, 0)],
                quorate.clone(),
                Some("pod b needs 5000 cpu on node n2, 1000 left"),
            ),
            (
                "an index past the node's GPUs",
                vec![pin("a", "n2", 0, 1 << 9)],
                quorate.clone(),
                Some("GPU indices 9 planned for pod a on node n2 are no longer on the node"),
            ),
            (
                "planned pods deleted below minCount",
                vec![pin("a", "n2", 0, 0)],
                BTreeMap::from([("g".to_string(), GroupCount { existing: 1, min_count: 2 })]),
                Some("group \"g\" has 1 pod(s) left, fewer than its minCount 2"),
            ),
            (
                "GPUs its own DRA claim holds do not count against the pin",
                vec![own(pin("a", "n1", 1000, 0b0011), 0b0011)],
                quorate.clone(),
                None,
            ),
            (
                "GPUs held by its own claim and another pod's",
                vec![own(pin("a", "n1", 1000, 0b0011), 0b0001)],
                quorate.clone(),
                Some("GPU indices 1 planned for pod a on node n1 are now held by another pod or unhealthy"),
            ),
            ("a node that is gone is not this check's", vec![pin("a", "n9", 1, 1)], quorate, None),
        ];
        for (name, pins, groups, want) in cases {
            let got = remaining_fits(&snapshot, &pins, &groups);
            let want = want.map_or(RemainingFits::Yes, |w| RemainingFits::No(w.to_string()));
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn a_plan_cut_short_is_resumed_or_dropped() {
        run(vec![
            Case {
                name: "planned, no pod ungated: drop and plan afresh",
                state: PlanState::Planned,
                pods: vec![gated("a"), gated("b")],
                want: Step::Drop,
                ..Case::default()
            },
            Case {
                name: "committing, every planned pod gone: drop",
                state: PlanState::Committing,
                pods: vec![pod("a", "g", "n1", PinState::Gone), pod("b", "g", "n1", PinState::Terminating)],
                want: Step::Drop,
                ..Case::default()
            },
            Case {
                name: "committing, some ungated: patch the gated rest",
                state: PlanState::Committing,
                pods: vec![unbound("a"), gated("b"), gated("c")],
                want: Step::Patch(uids(&["b", "c"])),
                ..Case::default()
            },
            Case {
                name: "committing, gone pods are not patched",
                state: PlanState::Committing,
                pods: vec![bound("a"), pod("b", "g", "n1", PinState::Gone), gated("c")],
                want: Step::Patch(uids(&["c"])),
                ..Case::default()
            },
            Case {
                name: "committing, every pod ungated: the commit went through, binds are watched from its creation",
                state: PlanState::Committing,
                pods: vec![unbound("a"), bound("b")],
                now: 30,
                want: Step::WaitUntil(at(60)),
                ..Case::default()
            },
            Case {
                name: "committing, every pod ungated, all bound: done",
                state: PlanState::Committing,
                pods: vec![bound("a"), bound("b")],
                want: Step::Done,
                ..Case::default()
            },
            Case {
                name: "committing, every pod ungated, one unbound past the timeout since creation: roll back",
                state: PlanState::Committing,
                pods: vec![bound("a"), unbound("b")],
                now: 61,
                want: Step::RollBack(RollBack {
                    delete: uids(&["a", "b"]),
                    avoid_nodes: nodes(&["n1"]),
                    failure: failure("b", "n1", FailureCause::BindTimeout(TIMEOUT), 1, 2),
                }),
                ..Case::default()
            },
            Case {
                name: "resuming ignores the bind timeout (the pods just ungated get it whole)",
                state: PlanState::Committing,
                pods: vec![unbound("a"), gated("b")],
                now: 3_600,
                want: Step::Patch(uids(&["b"])),
                ..Case::default()
            },
        ]);
    }

    #[test]
    fn a_plan_cut_short_that_no_longer_fits_is_dropped_or_rolled_back() {
        run(vec![
            Case {
                name: "does not fit, nothing ungated: drop",
                state: PlanState::Committing,
                pods: vec![gated("a"), gated("b")],
                fits: RemainingFits::No("node n1 is full".into()),
                want: Step::Drop,
                ..Case::default()
            },
            Case {
                name: "planned node gone, nothing ungated: drop",
                state: PlanState::Planned,
                pods: vec![node_gone(gated("a")), gated("b")],
                want: Step::Drop,
                ..Case::default()
            },
            Case {
                name: "does not fit, some ungated: roll the attempt back",
                state: PlanState::Committing,
                pods: vec![on(unbound("a"), "n2"), gated("b")],
                fits: RemainingFits::No("node n1 is full".into()),
                want: Step::RollBack(RollBack {
                    delete: uids(&["a", "b"]),
                    avoid_nodes: nodes(&[]),
                    failure: failure("b", "n1", FailureCause::NoLongerFits("node n1 is full".into()), 2, 2),
                }),
                ..Case::default()
            },
            Case {
                name: "does not fit, but every pod already ungated: nothing left to fit, binds are watched",
                state: PlanState::Committing,
                pods: vec![unbound("a"), bound("b")],
                fits: RemainingFits::No("node n1 is full".into()),
                want: Step::WaitUntil(at(60)),
                ..Case::default()
            },
            Case {
                name: "a gated pod's node gone, some ungated: roll back, avoid that node",
                state: PlanState::Committing,
                pods: vec![on(bound("a"), "n2"), node_gone(on(gated("b"), "n3"))],
                want: Step::RollBack(RollBack {
                    delete: uids(&["a", "b"]),
                    avoid_nodes: nodes(&["n3"]),
                    failure: failure("b", "n3", FailureCause::NodeGone, 1, 2),
                }),
                ..Case::default()
            },
        ]);
    }

    #[test]
    fn an_admitted_plan_waits_for_binds_and_ends_when_all_bound() {
        run(vec![
            Case {
                name: "every pod bound: done",
                pods: vec![bound("a"), bound("b")],
                want: Step::Done,
                ..Case::default()
            },
            Case {
                name: "bound, finished or gone all count as done",
                pods: vec![bound("a"), pod("b", "g", "n1", PinState::Finished), pod("c", "g", "n1", PinState::Gone)],
                want: Step::Done,
                ..Case::default()
            },
            Case {
                name: "unbound before the deadline: wait until it",
                pods: vec![bound("a"), unbound("b")],
                now: 30,
                want: Step::WaitUntil(at(60)),
                ..Case::default()
            },
            Case {
                name: "a still-gated pod of an admitted plan waits like an unbound one",
                pods: vec![bound("a"), gated("b")],
                now: 59,
                want: Step::WaitUntil(at(60)),
                ..Case::default()
            },
        ]);
    }

    #[test]
    fn a_failed_pin_before_the_gang_started_rolls_the_attempt_back() {
        run(vec![
            Case {
                name: "bind timeout, 1 of minCount 2 bound: delete every pod, avoid the refusing node",
                pods: vec![on(bound("a"), "n2"), refused("b", "1 node(s) didn't match pod anti-affinity rules")],
                now: 60,
                want: Step::RollBack(RollBack {
                    delete: uids(&["a", "b"]),
                    avoid_nodes: nodes(&["n1"]),
                    failure: PinFailure {
                        scheduler_message: Some("1 node(s) didn't match pod anti-affinity rules".into()),
                        ..failure("b", "n1", FailureCause::BindTimeout(TIMEOUT), 1, 2)
                    },
                }),
                ..Case::default()
            },
            Case {
                name: "the same with disruption mode all",
                pods: vec![on(bound("a"), "n2"), unbound("b")],
                now: 61,
                disruption: DisruptionModeKind::All,
                want: Step::RollBack(RollBack {
                    delete: uids(&["a", "b"]),
                    avoid_nodes: nodes(&["n1"]),
                    failure: failure("b", "n1", FailureCause::BindTimeout(TIMEOUT), 1, 2),
                }),
                ..Case::default()
            },
            Case {
                name: "node deleted after pinning: roll back before the deadline",
                pods: vec![on(bound("a"), "n2"), node_gone(on(unbound("b"), "n3"))],
                now: 5,
                want: Step::RollBack(RollBack {
                    delete: uids(&["a", "b"]),
                    avoid_nodes: nodes(&["n3"]),
                    failure: failure("b", "n3", FailureCause::NodeGone, 1, 2),
                }),
                ..Case::default()
            },
            Case {
                name: "timeout avoids every node whose pin failed; finished pods are kept",
                pods: vec![pod("a", "g", "n0", PinState::Finished), on(unbound("b"), "n1"), on(unbound("c"), "n2")],
                requirement: StartRequirement::leaf("g", 3),
                now: 60,
                want: Step::RollBack(RollBack {
                    delete: uids(&["b", "c"]),
                    avoid_nodes: nodes(&["n1", "n2"]),
                    failure: failure("b", "n1", FailureCause::BindTimeout(TIMEOUT), 2, 3),
                }),
                ..Case::default()
            },
            Case {
                name: "composite: one leaf short of its minCount rolls back the whole attempt",
                pods: vec![
                    in_group(bound("a1"), "leaf-a"),
                    in_group(bound("a2"), "leaf-a"),
                    in_group(bound("b1"), "leaf-b"),
                    in_group(unbound("b2"), "leaf-b"),
                ],
                requirement: StartRequirement {
                    min_count: BTreeMap::from([("leaf-a".into(), 2), ("leaf-b".into(), 2)]),
                },
                now: 60,
                want: Step::RollBack(RollBack {
                    delete: uids(&["a1", "a2", "b1", "b2"]),
                    avoid_nodes: nodes(&["n1"]),
                    failure: failure("b2", "n1", FailureCause::BindTimeout(TIMEOUT), 1, 4),
                }),
                ..Case::default()
            },
            Case {
                name: "a plan adding one pod to a running gang rolls back just that pod",
                pods: vec![unbound("c")],
                requirement: StartRequirement::leaf("g", 2),
                now: 60,
                want: Step::RollBack(RollBack {
                    delete: uids(&["c"]),
                    avoid_nodes: nodes(&["n1"]),
                    failure: failure("c", "n1", FailureCause::BindTimeout(TIMEOUT), 1, 1),
                }),
                ..Case::default()
            },
        ]);
    }

    #[test]
    fn a_failed_pin_after_the_gang_started_keeps_the_disruption_mode() {
        let started = || vec![on(bound("a"), "n2"), on(bound("b"), "n3"), unbound("c")];
        run(vec![
            Case {
                name: "single: minCount 2 of 3 bound, the third times out: the gang failed, nothing deleted",
                pods: started(),
                now: 60,
                want: Step::GangFailed {
                    delete: vec![],
                    failure: failure("c", "n1", FailureCause::BindTimeout(TIMEOUT), 1, 3),
                },
                ..Case::default()
            },
            Case {
                name: "all: the same replaces the whole gang",
                pods: started(),
                now: 60,
                disruption: DisruptionModeKind::All,
                want: Step::GangFailed {
                    delete: uids(&["a", "b", "c"]),
                    failure: failure("c", "n1", FailureCause::BindTimeout(TIMEOUT), 1, 3),
                },
                ..Case::default()
            },
            Case {
                name: "all: finished pods are not deleted",
                pods: vec![on(pod("a", "g", "n2", PinState::Finished), "n2"), on(bound("b"), "n3"), unbound("c")],
                now: 60,
                disruption: DisruptionModeKind::All,
                want: Step::GangFailed {
                    delete: uids(&["b", "c"]),
                    failure: failure("c", "n1", FailureCause::BindTimeout(TIMEOUT), 1, 3),
                },
                ..Case::default()
            },
            Case {
                name: "single: the node of an unbound pod is gone after the gang started",
                pods: vec![on(bound("a"), "n2"), on(bound("b"), "n3"), node_gone(unbound("c"))],
                now: 1,
                want: Step::GangFailed { delete: vec![], failure: failure("c", "n1", FailureCause::NodeGone, 1, 3) },
                ..Case::default()
            },
        ]);
    }

    #[test]
    fn a_plan_without_times_counts_the_timeout_from_now() {
        let plan = AdmissionPlan { created_at: None, admitted_at: None, ..plan(PlanState::Admitted) };
        let pods = [unbound("a")];
        let requirement = StartRequirement::leaf("g", 1);
        let input = CommitInput {
            plan: &plan,
            pods: &pods,
            now: at(500),
            bind_timeout: TIMEOUT,
            requirement: &requirement,
            disruption: DisruptionModeKind::Single,
            remaining_fits: RemainingFits::Yes,
            refused: None,
        };
        assert_eq!(next_step(&input), Step::WaitUntil(at(560)));
    }

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

    #[test]
    fn rollbacks_avoid_nodes_with_backoff_and_then_make_the_gang_unschedulable() {
        let policy = RollbackPolicy::default();
        let mut h = RollbackHistory::default();
        struct Round {
            name: &'static str,
            at: i64,
            nodes: &'static [&'static str],
            recent: u32,
            avoided_until: &'static [(&'static str, i64)],
            retry_at: Option<i64>,
        }
        let steps = [
            Round {
                name: "first rollback avoids its node for 5 minutes",
                at: 0,
                nodes: &["n1"],
                recent: 1,
                avoided_until: &[("n1", 300)],
                retry_at: None,
            },
            Round {
                name: "a second within the window doubles it",
                at: 100,
                nodes: &["n2"],
                recent: 2,
                avoided_until: &[("n1", 300), ("n2", 700)],
                retry_at: None,
            },
            Round {
                name: "a third makes the gang unschedulable for the retry backoff",
                at: 200,
                nodes: &["n1"],
                recent: 3,
                avoided_until: &[("n1", 1400), ("n2", 700)],
                retry_at: Some(260),
            },
            Round {
                name: "a fourth doubles the retry backoff; expired avoidances are forgotten",
                at: 790,
                nodes: &["n3"],
                recent: 4,
                avoided_until: &[("n1", 1400), ("n3", 790 + 2400)],
                retry_at: Some(910),
            },
            Round {
                name: "after a quiet window the streak starts again",
                at: 790 + 600,
                nodes: &["n4"],
                recent: 1,
                avoided_until: &[("n1", 1400), ("n3", 3190), ("n4", 1390 + 300)],
                retry_at: None,
            },
        ];
        for (i, s) in steps.iter().enumerate() {
            h.record(&nodes(s.nodes), at(s.at), &policy);
            assert_eq!(h.count, i as u32 + 1, "{}", s.name);
            assert_eq!(h.recent, s.recent, "{}", s.name);
            let want: BTreeMap<String, Timestamp> =
                s.avoided_until.iter().map(|(n, t)| (n.to_string(), at(*t))).collect();
            assert_eq!(h.avoid, want, "{}", s.name);
            assert_eq!(h.retry_at(&policy), s.retry_at.map(at), "{}", s.name);
            assert_eq!(h.unschedulable(at(s.at), &policy), s.retry_at.is_some(), "{}", s.name);
        }
        assert_eq!(h.avoided(at(1500)), nodes(&["n3", "n4"]));
        assert_eq!(h.avoided(at(3189)), nodes(&["n3"]));
    }
}

//! PURE: JobSet v1alpha2 semantics for a MusterJobSet (kubernetes-sigs/jobset's
//! `jobset_controller.go`, `failure_policy.go`, `success_policy.go`, `startup_policy.go`,
//! `depends_on.go`, `ttl_after_finished.go`). From the spec, the last status and the child
//! MusterJobs observed, decide which children to create, delete, suspend or resume, whether
//! the set itself goes (TTL), and the new status. The children themselves are made in
//! [`child`]; the failure policy's rule matching lives in [`failure`].

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;

use super::job::MIRRORED_CONDITIONS;
use crate::conditions;
use crate::workloadbuilder::job::child_job_name;
use muster_api::REPLICATED_JOB_LABEL;
use muster_api::batch::{
    DependsOnStatus, JobPhase, JobSetPhase, MusterJob, MusterJobSet, MusterJobSetSpec, MusterJobSetStatus,
    MusterJobSpec, ReplicatedJob, ReplicatedJobStatus, RestartStrategy, StartupPolicyOrder, SuccessOperator,
};

pub mod child;
pub mod failure;

pub use child::{
    DEFAULT_GROUP_NAME, RESTART_ATTEMPT_ANNOTATION, child_job, coordinator_endpoint, dns_hostnames, jobset_keys, keys,
    publish_not_ready_addresses, subdomain,
};
pub use failure::{ChildFailure, Outcome};

/// The most children one reconcile of a set creates: the rest follow on the next passes (the
/// children made trigger them), so a set's children in memory are those that exist plus one
/// batch.
pub const CREATE_PER_PASS: usize = 100;

/// Condition reasons and messages JobSet writes besides the failure policy's
/// ([`failure::reason`]).
pub mod reason {
    /// Completed: the success policy is met.
    pub const ALL_JOBS_COMPLETED: &str = "AllJobsCompleted";
    /// Its message.
    pub const ALL_JOBS_COMPLETED_MESSAGE: &str = "jobset completed successfully";
    /// Suspended true.
    pub const SUSPENDED: &str = "SuspendedJobs";
    /// Its message.
    pub const SUSPENDED_MESSAGE: &str = "jobset is suspended";
    /// Suspended false after a resume.
    pub const RESUMED: &str = "ResumeJobs";
    /// Its message.
    pub const RESUMED_MESSAGE: &str = "jobset is resumed";
    /// StartupPolicyInProgress.
    pub const STARTUP_IN_PROGRESS: &str = "InOrderStartupPolicyInProgress";
    /// Its message.
    pub const STARTUP_IN_PROGRESS_MESSAGE: &str = "in order startup policy is in progress";
    /// StartupPolicyCompleted.
    pub const STARTUP_COMPLETED: &str = "InOrderStartupPolicyCompleted";
    /// Its message.
    pub const STARTUP_COMPLETED_MESSAGE: &str = "in order startup policy has completed";
    /// RestartingJobSet false: every child is ready.
    pub const JOBS_READY: &str = "JobsReady";
    /// Its message.
    pub const JOBS_READY_MESSAGE: &str = "all jobs are ready";
    /// RestartingJobSet false: the set failed.
    pub const JOBSET_FAILED: &str = "JobSetFailed";
    /// Its message.
    pub const JOBSET_FAILED_MESSAGE: &str = "jobset failed";
    /// RestartingJobSet false: the set completed (message: [`ALL_JOBS_COMPLETED_MESSAGE`]).
    pub const JOBSET_COMPLETED: &str = "JobSetCompleted";
    /// RestartingJobSet false: the set is suspended (message: [`SUSPENDED_MESSAGE`]).
    pub const JOBSET_SUSPENDED: &str = "JobSetSuspended";
}

/// `status.terminalState` of a set that completed.
pub const TERMINAL_COMPLETED: &str = "Completed";
/// `status.terminalState` of a set that failed.
pub const TERMINAL_FAILED: &str = "Failed";

/// Condition types of a MusterJobSet.
pub mod condition {
    /// The success policy is met.
    pub const COMPLETED: &str = "Completed";
    /// The failure policy failed the set.
    pub const FAILED: &str = "Failed";
    /// `spec.suspend` is true.
    pub const SUSPENDED: &str = "Suspended";
    /// The failure policy restarted the set; false again once every child is ready (or the
    /// set finished or is suspended).
    pub const RESTARTING: &str = "RestartingJobSet";
    /// `startupPolicy: InOrder` is creating (or resuming) replicatedJobs one after another.
    pub const STARTUP_IN_PROGRESS: &str = "StartupPolicyInProgress";
    /// `startupPolicy: InOrder` has every replicatedJob started.
    pub const STARTUP_COMPLETED: &str = "StartupPolicyCompleted";
    /// The spec is invalid; nothing is done.
    pub const INVALID: &str = "Invalid";
    /// Upstream mode: whether kube-scheduler has placed the set's native CompositePodGroup
    /// (its own condition, or what its child PodGroups say).
    pub const COMPOSITE_SCHEDULED: &str = "CompositePodGroupInitiallyScheduled";
    /// Upstream mode: kube-scheduler disrupts the set's groups.
    pub const DISRUPTION_TARGET: &str = "DisruptionTarget";
}

/// The conditions a MusterJobSet in upstream mode shows for its native CompositePodGroup.
pub const SET_MIRRORED_CONDITIONS: [&str; 2] = [condition::COMPOSITE_SCHEDULED, condition::DISRUPTION_TARGET];

/// PURE: where a set's native CompositePodGroup stands, as the conditions the set shows
/// ([`SET_MIRRORED_CONDITIONS`]). The group's own conditions when kube-scheduler wrote them;
/// otherwise (kube-scheduler 1.37 writes its verdict on the child PodGroups only) what the
/// children of the current attempt say: not scheduled when one is not (its reason and message,
/// named), scheduled once every one is (the whole composite is placed at once, so the children
/// agree), nothing while some have no verdict yet. A child disrupted makes the set a disruption
/// target.
pub fn composite_conditions(composite: &[Condition], children: &[ObservedChild], attempt: i32) -> Vec<Condition> {
    let own: Vec<Condition> =
        composite.iter().filter(|c| SET_MIRRORED_CONDITIONS.contains(&c.type_.as_str())).cloned().collect();
    if own.iter().any(|c| c.type_ == condition::COMPOSITE_SCHEDULED) {
        return own;
    }
    let current: Vec<&ObservedChild> = children.iter().filter(|c| c.attempt == attempt && !c.terminating).collect();
    let of = |child: &ObservedChild, type_: &str| child.scheduling.iter().find(|c| c.type_ == type_).cloned();
    let named = |child: &ObservedChild, c: Condition, type_: &str| Condition {
        type_: type_.to_string(),
        message: format!("child PodGroup {}: {}", child.name, c.message).trim_end_matches(": ").to_string(),
        ..c
    };
    let mut out = own;
    let verdicts: Vec<(&ObservedChild, Option<Condition>)> =
        current.iter().map(|c| (*c, of(c, "PodGroupInitiallyScheduled"))).collect();
    if let Some((child, c)) =
        verdicts.iter().find_map(|(ch, c)| c.clone().filter(|c| c.status != "True").map(|c| (ch, c)))
    {
        out.push(named(child, c, condition::COMPOSITE_SCHEDULED));
    } else if !verdicts.is_empty() && verdicts.iter().all(|(_, c)| c.is_some()) {
        let latest = verdicts
            .iter()
            .filter_map(|(_, c)| c.clone())
            .max_by(|a, b| a.last_transition_time.0.cmp(&b.last_transition_time.0));
        if let Some(c) = latest {
            let message = format!("every child PodGroup is scheduled ({})", verdicts.len());
            out.push(Condition { type_: condition::COMPOSITE_SCHEDULED.into(), message, ..c });
        }
    }
    if !out.iter().any(|c| c.type_ == condition::DISRUPTION_TARGET)
        && let Some((child, c)) = current
            .iter()
            .find_map(|ch| of(ch, condition::DISRUPTION_TARGET).filter(|c| c.status == "True").map(|c| (*ch, c)))
    {
        out.push(named(child, c, condition::DISRUPTION_TARGET));
    }
    out
}

/// What the set logic needs to know of one child MusterJob.
#[derive(Clone, Debug, PartialEq)]
pub struct ObservedChild {
    /// Child name.
    pub name: String,
    /// Its replicatedJob.
    pub replicated_job: String,
    /// Restart attempt it belongs to.
    pub attempt: i32,
    /// Its phase, once it has a status.
    pub phase: Option<JobPhase>,
    /// Being deleted.
    pub terminating: bool,
    /// JobSet's ready job: ready plus succeeded pods reach `min(parallelism, completions)`.
    pub ready: bool,
    /// It has active pods (`status.active > 0`).
    pub active: bool,
    /// Its `Complete` condition is true (or its phase says Complete).
    pub complete: bool,
    /// Its `Failed` condition when true (or an undated one when only its phase says Failed).
    pub failure: Option<ChildFailure>,
    /// `spec.suspend` of the child.
    pub suspended: bool,
    /// `spec.parallelism` of the child.
    pub parallelism: i32,
    /// `spec.completions` of the child.
    pub completions: Option<i32>,
    /// `spec.scheduling.schedulingPolicy.gang.minCount` of the child.
    pub min_count: Option<i32>,
    /// Upstream mode: the child's native PodGroup conditions it mirrors
    /// (`PodGroupInitiallyScheduled`, `DisruptionTarget`).
    pub scheduling: Vec<Condition>,
}

impl ObservedChild {
    /// Reads what the set logic needs from a child.
    pub fn from_job(job: &MusterJob) -> Self {
        let meta = &job.metadata;
        let get = |k: &str| meta.annotations.as_ref().and_then(|a| a.get(k)).cloned();
        let status = job.status.as_ref();
        let phase = status.and_then(|s| s.phase);
        let conds = status.map(|s| s.conditions.as_slice()).unwrap_or_default();
        let true_cond = |t: &str| conds.iter().find(|c| c.type_ == t && c.status == "True");
        let failure = match true_cond(super::job::condition::FAILED) {
            Some(c) => Some(ChildFailure {
                reason: c.reason.clone(),
                message: c.message.clone(),
                at: Some(c.last_transition_time.0),
            }),
            None => (phase == Some(JobPhase::Failed)).then(ChildFailure::default),
        };
        let spec = &job.spec;
        let pods = spec.completions.map_or(spec.parallelism, |c| c.min(spec.parallelism));
        let (ready, succeeded, active) = status.map_or((0, 0, 0), |s| (s.ready, s.succeeded, s.active));
        Self {
            name: meta.name.clone().unwrap_or_default(),
            replicated_job: meta.labels.as_ref().and_then(|l| l.get(REPLICATED_JOB_LABEL)).cloned().unwrap_or_default(),
            attempt: get(RESTART_ATTEMPT_ANNOTATION).and_then(|v| v.parse().ok()).unwrap_or(0),
            phase,
            terminating: meta.deletion_timestamp.is_some(),
            ready: ready.saturating_add(succeeded) >= pods,
            active: active > 0,
            complete: failure.is_none()
                && (phase == Some(JobPhase::Complete) || true_cond(super::job::condition::COMPLETE).is_some()),
            failure,
            suspended: spec.suspend,
            parallelism: spec.parallelism,
            completions: spec.completions,
            min_count: min_count(spec),
            scheduling: conds.iter().filter(|c| MIRRORED_CONDITIONS.contains(&c.type_.as_str())).cloned().collect(),
        }
    }

    /// Finished: failed or complete (JobSet's `JobFinished`).
    pub fn finished(&self) -> bool {
        self.failure.is_some() || self.complete
    }
}

fn min_count(spec: &MusterJobSpec) -> Option<i32> {
    spec.scheduling.as_ref().and_then(|s| s.scheduling_policy.as_ref()).and_then(|p| p.min_count())
}

/// New parallelism and gang quorum of a child.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resize {
    /// Child name.
    pub child: String,
    /// Its replicatedJob's parallelism.
    pub parallelism: i32,
    /// New completions, written with the parallelism: only for a child whose template leaves
    /// the mode and completions unset (Indexed, completions following parallelism, as an
    /// elastic Indexed job changes them in tandem).
    pub completions: Option<i32>,
    /// Its replicatedJob's `gang.minCount` (unset: the default follows parallelism).
    pub min_count: Option<i32>,
    /// The child has a gang policy (only then is `minCount` written).
    pub gang: bool,
}

/// The decision of one reconcile.
#[derive(Clone, Debug, PartialEq)]
pub struct SetPlan {
    /// Children to create: (replicatedJob index, replica index), at most [`CREATE_PER_PASS`].
    pub create: Vec<(usize, i32)>,
    /// More children are missing than `create` holds: the next pass makes the next batch.
    pub more_to_create: bool,
    /// Children to delete, with why.
    pub delete: Vec<(String, &'static str)>,
    /// Children whose `spec.suspend` must be set to the value given.
    pub suspend: Vec<(String, bool)>,
    /// Children whose parallelism and gang quorum must follow their replicatedJob's template
    /// (the only fields of it that may change).
    pub resize: Vec<Resize>,
    /// Events to publish: (warning, reason, message).
    pub events: Vec<(bool, String, String)>,
    /// The set finished `ttlSecondsAfterFinished` ago or more: delete it.
    pub delete_set: bool,
    /// Look at the set again after this long (its TTL runs out then).
    pub requeue_after: Option<Duration>,
    /// The status to write.
    pub status: MusterJobSetStatus,
}

fn in_order(spec: &MusterJobSetSpec) -> bool {
    spec.startup_policy.as_ref().is_some_and(|s| s.startup_policy_order == StartupPolicyOrder::InOrder)
}

/// JobSet's `allReplicasStarted`: every child of the replicatedJob is ready, succeeded or
/// failed.
fn all_started(rjob: &ReplicatedJob, status: Option<&ReplicatedJobStatus>) -> bool {
    let started = status.map_or(0i64, |s| i64::from(s.ready) + i64::from(s.succeeded) + i64::from(s.failed));
    i64::from(rjob.replicas) == started
}

/// JobSet's `dependencyReachedStatus`: every replicatedJob `rjob` depends on (listed before
/// it: `replicas` knows those) is Ready (ready + succeeded + failed children = replicas) or
/// Complete (succeeded = replicas).
fn dependencies_reached(
    rjob: &ReplicatedJob,
    replicas: &BTreeMap<&str, i32>,
    statuses: &BTreeMap<&str, ReplicatedJobStatus>,
) -> bool {
    rjob.depends_on.iter().all(|d| {
        let Some(s) = statuses.get(d.name.as_str()) else { return false };
        let want = i64::from(replicas.get(d.name.as_str()).copied().unwrap_or(0));
        match d.status {
            DependsOnStatus::Complete => want == i64::from(s.succeeded),
            DependsOnStatus::Ready => want == i64::from(s.failed) + i64::from(s.ready) + i64::from(s.succeeded),
        }
    })
}

/// Conditions kept as JobSet's `updateCondition` keeps them: a condition that is not there is
/// added only when true; `StartupPolicyInProgress` and `StartupPolicyCompleted` exclude each
/// other (setting one true makes the other false). Changes become events.
struct Conditions<'a> {
    list: &'a mut Vec<Condition>,
    generation: Option<i64>,
    now: Timestamp,
    events: &'a mut Vec<(bool, String, String)>,
}

impl Conditions<'_> {
    fn set(&mut self, type_: &str, status: bool, reason: &str, message: &str, warning: bool) {
        if !status && conditions::get(self.list, type_).is_none() {
            return;
        }
        let exclusive = match type_ {
            condition::STARTUP_IN_PROGRESS => Some(condition::STARTUP_COMPLETED),
            condition::STARTUP_COMPLETED => Some(condition::STARTUP_IN_PROGRESS),
            _ => None,
        };
        if status
            && let Some(other) = exclusive.and_then(|o| self.list.iter_mut().find(|c| c.type_ == o))
            && other.status == "True"
        {
            other.status = "False".into();
            other.last_transition_time = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(self.now);
        }
        if conditions::set(self.list, type_, status, reason, message, self.generation, self.now) {
            self.events.push((warning, reason.to_string(), message.to_string()));
        }
    }
}

/// Decides the next step of a set.
pub fn plan(set: &MusterJobSet, children: &[ObservedChild], now: Timestamp) -> SetPlan {
    let spec = &set.spec;
    let generation = set.metadata.generation;
    let prev = set.status.clone().unwrap_or_default();
    let mut status = MusterJobSetStatus {
        restarts: prev.restarts,
        restarts_count_towards_max: prev.restarts_count_towards_max,
        terminal_state: prev.terminal_state.clone(),
        conditions: prev.conditions.clone(),
        workload_name: prev.workload_name.clone(),
        composite_pod_group_name: prev.composite_pod_group_name.clone(),
        observed_generation: generation,
        ..Default::default()
    };
    let mut out = SetPlan {
        create: vec![],
        more_to_create: false,
        delete: vec![],
        suspend: vec![],
        resize: vec![],
        events: vec![],
        delete_set: false,
        requeue_after: None,
        status: MusterJobSetStatus::default(),
    };
    // muster's own condition: always there once the set was looked at.
    conditions::set(&mut status.conditions, condition::INVALID, false, "Valid", "", generation, now);
    let mut events = Vec::new();
    let mut conds = Conditions { list: &mut status.conditions, generation, now, events: &mut events };

    // Children of an older attempt go first; their names are reused by the new attempt.
    let (current, stale): (Vec<&ObservedChild>, Vec<&ObservedChild>) =
        children.iter().partition(|c| c.attempt == prev.restarts);
    for c in stale.iter().filter(|c| !c.terminating) {
        out.delete.push((c.name.clone(), "Restart"));
    }
    let live: Vec<&ObservedChild> = current.into_iter().filter(|c| !c.terminating).collect();
    let statuses = replicated_job_statuses(spec, &live);
    let finished = |list: &[Condition]| {
        [condition::COMPLETED, condition::FAILED].into_iter().find(|c| conditions::is_true(list, c)).is_some()
    };

    if !finished(conds.list) {
        let total: i64 = spec.replicated_jobs.iter().map(|r| i64::from(r.replicas.max(0))).sum();
        let ready: i64 = statuses.values().map(|s| i64::from(s.ready) + i64::from(s.succeeded)).sum();
        if !spec.suspend && total == ready {
            conds.set(condition::RESTARTING, false, reason::JOBS_READY, reason::JOBS_READY_MESSAGE, false);
        }
        let failed: Vec<&ObservedChild> = live.iter().copied().filter(|c| c.failure.is_some()).collect();
        let succeeded: Vec<&ObservedChild> = live.iter().copied().filter(|c| c.complete).collect();
        match failure::decide(spec.failure_policy.as_ref(), prev.restarts_count_towards_max, &failed) {
            Some(Outcome::Fail { reason, message }) => {
                conds.set(condition::FAILED, true, reason, &message, true);
                conds.set(condition::RESTARTING, false, reason::JOBSET_FAILED, reason::JOBSET_FAILED_MESSAGE, false);
                status.terminal_state = Some(TERMINAL_FAILED.into());
            }
            Some(Outcome::Restart { counts, condition_reason, event_reason, message }) => {
                status.restarts = status.restarts.saturating_add(1);
                if counts {
                    status.restarts_count_towards_max = status.restarts_count_towards_max.saturating_add(1);
                }
                conds.set(condition::RESTARTING, true, &condition_reason, &message, true);
                conds.events.push((true, event_reason.to_string(), message));
                for c in &live {
                    out.delete.push((c.name.clone(), "Restart"));
                }
            }
            None if !succeeded.is_empty() && success_policy_met(spec, &succeeded) => {
                conds.set(
                    condition::COMPLETED,
                    true,
                    reason::ALL_JOBS_COMPLETED,
                    reason::ALL_JOBS_COMPLETED_MESSAGE,
                    false,
                );
                conds.set(
                    condition::RESTARTING,
                    false,
                    reason::JOBSET_COMPLETED,
                    reason::ALL_JOBS_COMPLETED_MESSAGE,
                    false,
                );
                status.terminal_state = Some(TERMINAL_COMPLETED.into());
            }
            None => {
                create_children(set, children, &stale, &statuses, &mut conds, &mut out);
                suspend_or_resume(spec, &live, &statuses, &mut conds, &mut out);
                resize(spec, &live, &mut out);
            }
        }
    }
    if finished(conds.list) {
        // A finished set keeps no active child (JobSet deletes them on every pass).
        for c in live.iter().filter(|c| !c.finished()) {
            out.delete.push((c.name.clone(), "SetFinished"));
        }
        if let Some(ttl) = spec.ttl_seconds_after_finished {
            let finished_at = [condition::COMPLETED, condition::FAILED]
                .into_iter()
                .filter_map(|t| conditions::get(conds.list, t).filter(|c| c.status == "True"))
                .map(|c| c.last_transition_time.0)
                .next()
                .unwrap_or(now);
            let expires = finished_at.as_second().saturating_add(i64::from(ttl.max(0)));
            let left = expires.saturating_sub(now.as_second());
            if left <= 0 {
                out.delete_set = true;
            } else {
                out.requeue_after = Some(Duration::from_secs(left.unsigned_abs()));
            }
        }
    }

    let deleting: BTreeSet<&str> = out.delete.iter().map(|(n, _)| n.as_str()).collect();
    let kept: Vec<&ObservedChild> = live.iter().copied().filter(|c| !deleting.contains(c.name.as_str())).collect();
    let counts = replicated_job_statuses(spec, &kept);
    let total = spec.replicated_jobs.iter().map(|r| r.replicas.max(0)).fold(0i32, i32::saturating_add);
    let done = counts.values().map(|s| s.succeeded).fold(0i32, i32::saturating_add);
    status.progress = Some(format!("{done}/{total}"));
    status.replicated_jobs_status =
        spec.replicated_jobs.iter().filter_map(|r| counts.get(r.name.as_str()).cloned()).collect::<Vec<_>>();
    // Duplicate names (an invalid spec) show once.
    status.replicated_jobs_status.dedup_by(|a, b| a.name == b.name);
    status.phase = Some(if conditions::is_true(&status.conditions, condition::COMPLETED) {
        JobSetPhase::Completed
    } else if conditions::is_true(&status.conditions, condition::FAILED) {
        JobSetPhase::Failed
    } else if spec.suspend {
        JobSetPhase::Suspended
    } else if kept.iter().any(|c| c.phase == Some(JobPhase::Running)) {
        JobSetPhase::Running
    } else {
        JobSetPhase::Pending
    });
    out.events = events;
    out.status = status;
    out
}

/// JobSet's `calculateReplicatedJobStatuses` over `children` (of the current attempt): an
/// unfinished child counts as ready when its ready and succeeded pods reach
/// `min(parallelism, completions)`, active with active pods, suspended with `spec.suspend`;
/// a finished one as succeeded or failed.
fn replicated_job_statuses<'a>(
    spec: &'a MusterJobSetSpec,
    children: &[&ObservedChild],
) -> BTreeMap<&'a str, ReplicatedJobStatus> {
    let mut out: BTreeMap<&str, ReplicatedJobStatus> = spec
        .replicated_jobs
        .iter()
        .map(|r| (r.name.as_str(), ReplicatedJobStatus { name: r.name.clone(), ..Default::default() }))
        .collect();
    for c in children {
        let Some(s) = out.get_mut(c.replicated_job.as_str()) else { continue };
        if c.failure.is_some() {
            s.failed += 1;
        } else if c.complete {
            s.succeeded += 1;
        } else {
            s.ready += i32::from(c.ready);
            s.active += i32::from(c.active);
            s.suspended += i32::from(c.suspended);
        }
    }
    out
}

/// JobSet's success policy: enough children of the targeted replicatedJobs succeeded (one for
/// `Any`; every replica of every target for `All`).
fn success_policy_met(spec: &MusterJobSetSpec, succeeded: &[&ObservedChild]) -> bool {
    let policy = spec.success_policy.clone().unwrap_or_default();
    let targeted = |name: &str| {
        policy.target_replicated_jobs.is_empty() || policy.target_replicated_jobs.iter().any(|t| t == name)
    };
    let matching = succeeded.iter().filter(|c| targeted(&c.replicated_job)).count() as i64;
    let expected: i64 = match policy.operator {
        SuccessOperator::Any => 1,
        SuccessOperator::All => {
            spec.replicated_jobs.iter().filter(|r| targeted(&r.name)).map(|r| i64::from(r.replicas.max(0))).sum()
        }
    };
    matching >= expected
}

/// JobSet's `reconcileReplicatedJobs`: replicatedJobs in list order, each once its
/// dependencies are reached; with `InOrder` (and the set not suspended) one at a time, the
/// next only once every child of the one before started (ready, succeeded or failed). With
/// `BlockingRecreate`, nothing while a child of an older attempt exists.
fn create_children(
    set: &MusterJobSet,
    children: &[ObservedChild],
    stale: &[&ObservedChild],
    statuses: &BTreeMap<&str, ReplicatedJobStatus>,
    conds: &mut Conditions<'_>,
    out: &mut SetPlan,
) {
    let spec = &set.spec;
    let ordered = in_order(spec) && !spec.suspend;
    let blocking = spec.failure_policy.as_ref().and_then(|f| f.restart_strategy)
        == Some(RestartStrategy::BlockingRecreate)
        && !stale.is_empty();
    let mut replicas: BTreeMap<&str, i32> = BTreeMap::new();
    let mut chosen = Vec::new();
    let mut waiting = false;
    for (r, rjob) in spec.replicated_jobs.iter().enumerate() {
        replicas.insert(rjob.name.as_str(), rjob.replicas);
        if !dependencies_reached(rjob, &replicas, statuses) {
            continue;
        }
        if ordered && all_started(rjob, statuses.get(rjob.name.as_str())) {
            continue;
        }
        if !blocking {
            chosen.push(r);
        }
        if ordered {
            waiting = true;
            break;
        }
    }
    if ordered {
        if waiting {
            conds.set(
                condition::STARTUP_IN_PROGRESS,
                true,
                reason::STARTUP_IN_PROGRESS,
                reason::STARTUP_IN_PROGRESS_MESSAGE,
                false,
            );
        } else {
            conds.set(
                condition::STARTUP_COMPLETED,
                true,
                reason::STARTUP_COMPLETED,
                reason::STARTUP_COMPLETED_MESSAGE,
                false,
            );
        }
    }
    let taken: BTreeSet<&str> = children.iter().map(|c| c.name.as_str()).collect();
    let set_name = set.metadata.name.as_deref().unwrap_or_default();
    // The missing children, in order, one batch of them: a lazy walk over the replicas that
    // stops at the first child past the batch (never a list of every replica).
    let mut missing = chosen.into_iter().flat_map(|r| {
        let rjob = &spec.replicated_jobs[r];
        (0..rjob.replicas.max(0))
            .filter(|i| !taken.contains(child_job_name(set_name, &rjob.name, *i).as_str()))
            .map(move |i| (r, i))
    });
    out.create.extend(missing.by_ref().take(CREATE_PER_PASS));
    out.more_to_create = missing.next().is_some();
}

/// JobSet's `suspendJobs` / `resumeJobsIfNecessary`: a suspended set suspends every unfinished
/// child; a resumed one resumes them replicatedJob by replicatedJob as they are created
/// (dependencies reached; with `InOrder` one replicatedJob at a time, so the startup sequence
/// runs again), and says it is no longer suspended once all are.
fn suspend_or_resume(
    spec: &MusterJobSetSpec,
    live: &[&ObservedChild],
    statuses: &BTreeMap<&str, ReplicatedJobStatus>,
    conds: &mut Conditions<'_>,
    out: &mut SetPlan,
) {
    let unfinished = || live.iter().filter(|c| !c.finished());
    if spec.suspend {
        out.suspend.extend(unfinished().filter(|c| !c.suspended).map(|c| (c.name.clone(), true)));
        conds.set(condition::SUSPENDED, true, reason::SUSPENDED, reason::SUSPENDED_MESSAGE, false);
        conds.set(condition::RESTARTING, false, reason::JOBSET_SUSPENDED, reason::SUSPENDED_MESSAGE, false);
        return;
    }
    let ordered = in_order(spec);
    let mut replicas: BTreeMap<&str, i32> = BTreeMap::new();
    for rjob in &spec.replicated_jobs {
        replicas.insert(rjob.name.as_str(), rjob.replicas);
        if !dependencies_reached(rjob, &replicas, statuses) {
            continue;
        }
        if ordered && all_started(rjob, statuses.get(rjob.name.as_str())) {
            continue;
        }
        out.suspend.extend(
            unfinished().filter(|c| c.replicated_job == rjob.name && c.suspended).map(|c| (c.name.clone(), false)),
        );
        if ordered {
            conds.set(
                condition::STARTUP_IN_PROGRESS,
                true,
                reason::STARTUP_IN_PROGRESS,
                reason::STARTUP_IN_PROGRESS_MESSAGE,
                false,
            );
            return;
        }
    }
    conds.set(condition::SUSPENDED, false, reason::RESUMED, reason::RESUMED_MESSAGE, false);
}

/// Unfinished children follow their replicatedJob's parallelism and gang quorum (muster's
/// elastic sets); a child whose completions follow its parallelism (template mode and
/// completions unset) gets both, in tandem.
fn resize(spec: &MusterJobSetSpec, live: &[&ObservedChild], out: &mut SetPlan) {
    for c in live.iter().filter(|c| !c.finished()) {
        let template = spec.replicated_jobs.iter().find(|r| r.name == c.replicated_job).map(|r| &r.template.spec);
        let Some(t) = template else { continue };
        let tandem = t.completion_mode.is_none() && t.completions.is_none();
        let completions = if tandem { Some(t.parallelism) } else { c.completions };
        if (c.parallelism, c.completions, c.min_count) != (t.parallelism, completions, min_count(t)) {
            out.resize.push(Resize {
                child: c.name.clone(),
                parallelism: t.parallelism,
                completions: tandem.then_some(t.parallelism),
                min_count: min_count(t),
                gang: t
                    .scheduling
                    .as_ref()
                    .and_then(|s| s.scheduling_policy.as_ref())
                    .is_some_and(|p| p.gang.is_some()),
            });
        }
    }
}

#[cfg(test)]
mod tests;

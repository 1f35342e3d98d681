//! PURE: batch/v1 Job semantics for a MusterJob. From the spec, the last status and the pods
//! observed, decide which pods to create and delete, and the new status. No client, no clock.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, ObjectFieldSelector, Pod, PodSchedulingGate, PodSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;

use crate::conditions;
use crate::pods::Lifecycle;
use crate::workloadbuilder::native::SchedulingApi;
use muster_api::batch::{JobPhase, MusterJob, MusterJobSpec, MusterJobStatus, PodReplacementPolicy};
use muster_api::{
    ADMISSION_ATTEMPT_ANNOTATION, ADMISSION_GATE, COMPLETION_INDEX_ANNOTATION, GPU_INDICES_ANNOTATION, GPU_RESOURCE,
    JOB_NAME_LABEL, JOBSET_NAME_LABEL, POD_GROUP_LABEL, REPLICATED_JOB_LABEL, ROLLED_BACK_ANNOTATION,
};

/// Pod annotation: the gang attempt a pod belongs to (with disruption mode `all`, a failure
/// restarts every pod of its attempt).
pub const GANG_ATTEMPT_ANNOTATION: &str = "batch.muster.dev/gang-attempt";
/// Pod label with the completion index (for selectors), as batch/v1 does.
pub const COMPLETION_INDEX_LABEL: &str = "batch.muster.dev/job-completion-index";
/// Pod finalizer: the pod's outcome is not recorded in its job's status yet (batch/v1's
/// `batch.kubernetes.io/job-tracking`). The job controller removes it once the status counts
/// the pod, or the job is finished or gone.
pub const TRACKING_FINALIZER: &str = "batch.muster.dev/job-tracking";
/// Pod annotation: muster deleted the pod because another pod of its gang attempt failed
/// (disruption mode `all`); it did not fail and counts toward no limit.
pub const GANG_RESTARTED_ANNOTATION: &str = "batch.muster.dev/gang-restarted";
/// Pod annotation: failures of the pod's index counted before it was made
/// (`backoffLimitPerIndex`, as batch/v1's `batch.kubernetes.io/job-index-failure-count`).
pub const INDEX_FAILURE_COUNT_ANNOTATION: &str = "batch.muster.dev/job-index-failure-count";
/// Pod annotation: failures of the pod's index a `podFailurePolicy` Ignore rule left uncounted.
pub const INDEX_IGNORED_FAILURE_COUNT_ANNOTATION: &str = "batch.muster.dev/job-index-ignored-failure-count";
/// Labels and annotations of a MusterJobSet's child with this prefix are copied onto its pods
/// (JobSet's `jobset.sigs.k8s.io/jobset-name`, `replicatedjob-name`, `job-index`, ...).
pub const JOBSET_KEY_PREFIX: &str = "jobset.sigs.k8s.io/";
/// Env var with the completion index of an Indexed job's pod.
pub const COMPLETION_INDEX_ENV: &str = "JOB_COMPLETION_INDEX";
/// Env var with the GPU indices muster assigned.
pub const GPU_INDICES_ENV: &str = "MUSTER_GPU_INDICES";
/// The most pods one reconcile of a job creates: the rest follow on the next passes (the pods
/// it made trigger them), so a job's pods in memory are those that exist plus one batch.
pub const CREATE_PER_PASS: usize = 500;
/// The most completion indexes the planner reads from a status or plans among: the most pods a
/// job may ask for. A job over it is never planned (it is Invalid), and a status edited by hand
/// to `0-2147483646` is read as far as that.
const MAX_INDEXES: i32 = crate::workloadbuilder::job::MAX_JOB_PODS as i32;

/// Condition types of a MusterJob.
pub mod condition {
    /// The job succeeded and its last pods are gone.
    pub const COMPLETE: &str = "Complete";
    /// The job failed and its last pods are gone.
    pub const FAILED: &str = "Failed";
    /// The job will fail once its pods are gone (same reason and message as `Failed`).
    pub const FAILURE_TARGET: &str = "FailureTarget";
    /// The job will complete once its pods are gone (same reason and message as `Complete`).
    pub const SUCCESS_CRITERIA_MET: &str = "SuccessCriteriaMet";
    /// `spec.suspend` is true.
    pub const SUSPENDED: &str = "Suspended";
    /// The spec is invalid or a frozen field changed; nothing is done.
    pub const INVALID: &str = "Invalid";
    /// The ResourceClaims the job's pods share (its PodGroup's `resourceClaims`) exist. Only
    /// on jobs with claims.
    pub const CLAIMS_READY: &str = "ClaimsReady";
}

/// What the job logic needs to know of one of its pods.
#[derive(Clone, Debug, PartialEq)]
pub struct ObservedPod {
    /// Pod name.
    pub name: String,
    /// Phase.
    pub phase: Lifecycle,
    /// Completion index (Indexed jobs).
    pub index: Option<i32>,
    /// Gang attempt the pod was created in.
    pub attempt: i32,
    /// Being deleted.
    pub terminating: bool,
    /// Ready condition true.
    pub ready: bool,
    /// Still held by the admission gate.
    pub gated: bool,
    /// Container restarts so far, init containers included (`restartPolicy: OnFailure` counts
    /// them toward `backoffLimit`).
    pub restarts: i32,
    /// Deleted by admission with the rest of a rolled-back gang attempt (a failed pin, not a
    /// pod failure: it never counts toward `backoffLimit`).
    pub rolled_back: bool,
    /// Its `DisruptionTarget=True` condition (e.g. kube-scheduler preempting it), as the job's
    /// `DisruptionTarget` would say it: reason, `pod <name>: <message>`, transition time.
    /// Boxed: almost every pod has none.
    pub disruption: Option<Box<Condition>>,
    /// It carries the tracking finalizer ([`TRACKING_FINALIZER`]) and the controller has not
    /// released it yet: its outcome is not in the job's status yet.
    pub tracked: bool,
    /// Deleted by muster with the rest of its gang attempt after another pod failed
    /// ([`GANG_RESTARTED_ANNOTATION`]): it did not fail, and counts toward no limit.
    pub gang_restarted: bool,
    /// Failures of its index counted before it was made (`backoffLimitPerIndex`).
    pub index_failures: i32,
    /// Failures of its index ignored (a `podFailurePolicy` Ignore rule) before it was made.
    pub index_ignored: i32,
    /// Its terminated containers' (name, exit code), containers before init containers, at
    /// most [`MAX_OBSERVED`]: what `podFailurePolicy.rules[].onExitCodes` reads.
    pub exit_codes: Vec<(String, i32)>,
    /// Its conditions' (type, status), at most [`MAX_OBSERVED`], once it failed (none before):
    /// what `podFailurePolicy.rules[].onPodConditions` reads, which matches failed pods only.
    /// A live pod's conditions change at every step of its start (scheduled, bound,
    /// initialized, ready) while nothing the job reads of them does: kept, each step was a
    /// new record, and a reconcile of its job.
    pub conditions: Vec<(String, String)>,
    /// When it finished (unix seconds), as batch/v1 reads it for its failure backoff: the last
    /// container's `finishedAt` once all ended, else its `Ready=False` transition, else its
    /// deletion, else its creation.
    pub finished_at: Option<i64>,
}

/// The most container exit codes and pod conditions an [`ObservedPod`] keeps (it lives in a
/// watch cache, one per pod).
pub const MAX_OBSERVED: usize = 16;

impl ObservedPod {
    /// Reads the fields the job logic needs from a pod.
    pub fn from_pod(pod: &Pod) -> Self {
        let meta = &pod.metadata;
        let status = pod.status.as_ref();
        let phase = Lifecycle::of(pod);
        let annotation = |k: &str| meta.annotations.as_ref().and_then(|a| a.get(k)).and_then(|v| v.parse::<i32>().ok());
        Self {
            name: meta.name.clone().unwrap_or_default(),
            phase,
            index: annotation(COMPLETION_INDEX_ANNOTATION),
            attempt: annotation(GANG_ATTEMPT_ANNOTATION).unwrap_or(0),
            terminating: meta.deletion_timestamp.is_some(),
            ready: status
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
            gated: pod
                .spec
                .as_ref()
                .and_then(|s| s.scheduling_gates.as_ref())
                .is_some_and(|g| g.iter().any(|g| g.name == ADMISSION_GATE)),
            restarts: status
                .into_iter()
                .flat_map(|s| s.container_statuses.iter().flatten().chain(s.init_container_statuses.iter().flatten()))
                .map(|c| c.restart_count.max(0))
                .fold(0i32, i32::saturating_add),
            rolled_back: meta.annotations.as_ref().is_some_and(|a| a.contains_key(ROLLED_BACK_ANNOTATION)),
            disruption: status
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == DISRUPTION_TARGET && c.status == "True"))
                .map(|c| {
                    let name = meta.name.as_deref().unwrap_or_default();
                    Box::new(Condition {
                        type_: DISRUPTION_TARGET.into(),
                        status: "True".into(),
                        reason: c.reason.clone().unwrap_or_else(|| "Unknown".into()),
                        message: format!("pod {name}: {}", c.message.as_deref().unwrap_or_default()),
                        last_transition_time: c.last_transition_time.clone().unwrap_or(Time(Timestamp::UNIX_EPOCH)),
                        observed_generation: None,
                    })
                }),
            tracked: meta.finalizers.iter().flatten().any(|f| f == TRACKING_FINALIZER),
            gang_restarted: meta.annotations.as_ref().is_some_and(|a| a.contains_key(GANG_RESTARTED_ANNOTATION)),
            index_failures: annotation(INDEX_FAILURE_COUNT_ANNOTATION).unwrap_or(0).max(0),
            index_ignored: annotation(INDEX_IGNORED_FAILURE_COUNT_ANNOTATION).unwrap_or(0).max(0),
            exit_codes: status
                .into_iter()
                .flat_map(|s| s.container_statuses.iter().flatten().chain(s.init_container_statuses.iter().flatten()))
                .filter_map(|c| {
                    let t = c.state.as_ref()?.terminated.as_ref()?;
                    Some((c.name.clone(), t.exit_code))
                })
                .take(MAX_OBSERVED)
                .collect(),
            conditions: status
                .filter(|_| phase == Lifecycle::Failed)
                .and_then(|s| s.conditions.as_ref())
                .into_iter()
                .flatten()
                .map(|c| (c.type_.clone(), c.status.clone()))
                .take(MAX_OBSERVED)
                .collect(),
            finished_at: finished_at(pod),
        }
    }
    fn active(&self) -> bool {
        !self.terminating && !self.phase.is_terminal()
    }
}

/// batch/v1's `getFinishedTime`, in unix seconds.
fn finished_at(pod: &Pod) -> Option<i64> {
    let status = pod.status.as_ref();
    let containers = status.and_then(|s| s.container_statuses.as_ref()).filter(|c| !c.is_empty());
    let from_containers = containers.and_then(|cs| {
        cs.iter()
            .map(|c| c.state.as_ref()?.terminated.as_ref()?.finished_at.as_ref().map(|t| t.0.as_second()))
            .collect::<Option<Vec<i64>>>()
            .and_then(|v| v.into_iter().max())
    });
    let ready_false = || {
        status
            .and_then(|s| s.conditions.as_ref())?
            .iter()
            .find(|c| c.type_ == "Ready" && c.status == "False")?
            .last_transition_time
            .as_ref()
            .map(|t| t.0.as_second())
    };
    let deleted = || {
        let at = pod.metadata.deletion_timestamp.as_ref()?.0.as_second();
        Some(at - pod.metadata.deletion_grace_period_seconds.unwrap_or(0))
    };
    from_containers
        .or_else(ready_false)
        .or_else(deleted)
        .or_else(|| pod.metadata.creation_timestamp.as_ref().map(|t| t.0.as_second()))
}

/// batch/v1's first wait before a failed pod is replaced; it doubles with each failure since the
/// last success.
pub const POD_FAILURE_BACKOFF: i64 = 10;
/// batch/v1's longest wait before a failed pod is replaced.
pub const MAX_POD_FAILURE_BACKOFF: i64 = 600;

/// PURE: seconds still to wait before replacing a pod after `failures` failures, the last at
/// `last_failure` (batch/v1's `getRemainingTimeForFailuresCount`); 0 when none.
pub fn backoff_left(failures: i64, last_failure: Option<i64>, now: i64) -> i64 {
    let Some(last) = last_failure.filter(|_| failures > 0) else { return 0 };
    let mut wait = POD_FAILURE_BACKOFF;
    for _ in 1..failures {
        wait = wait.saturating_mul(2);
        if wait >= MAX_POD_FAILURE_BACKOFF {
            wait = MAX_POD_FAILURE_BACKOFF;
            break;
        }
    }
    (wait - (now - last)).max(0)
}

/// What the job controller's watch cache keeps of one of its pods: the job it belongs to and
/// what the job logic reads ([`ObservedPod`]). A few hundred bytes: the trimmed `Pod` it
/// replaced was about 4 KiB (13 MiB for the 3,000 pods of a 5,000-node bench run).
#[derive(Clone, Debug, PartialEq)]
pub struct JobPod {
    /// The pod's namespace.
    pub namespace: String,
    /// Its job name label.
    pub job: Option<String>,
    /// The UID of its controller (owner reference).
    pub controller_uid: Option<String>,
    /// What the job logic reads.
    pub observed: ObservedPod,
}

impl JobPod {
    /// Reads the record of `pod`.
    pub fn of(pod: &Pod) -> Self {
        let meta = &pod.metadata;
        JobPod {
            namespace: meta.namespace.clone().unwrap_or_default(),
            job: meta.labels.as_ref().and_then(|l| l.get(JOB_NAME_LABEL)).cloned(),
            controller_uid: crate::owners::controller_uid(meta).map(str::to_string),
            observed: ObservedPod::from_pod(pod),
        }
    }

    /// Whether it is a pod of the job `name` in `namespace` with UID `uid`.
    pub fn of_job(&self, namespace: &str, name: &str, uid: &str) -> bool {
        self.namespace == namespace && self.job.as_deref() == Some(name) && self.controller_uid.as_deref() == Some(uid)
    }
}

/// How long a change of the live counts alone may wait ([`status_pace`]): the counts of a
/// gang's pods starting one by one go out in one write (upstream's Job controller batches pod
/// updates for 1 s too).
pub const STATUS_PACE: std::time::Duration = std::time::Duration::from_secs(1);

/// How long kube-scheduler's `PodGroupInitiallyScheduled=True` alone may wait on a job still
/// `Pending` ([`status_pace`], upstream mode): the gang's pods bind and start next, so the
/// condition goes out with the write that says `Running`. At 1,000 gangs the job went `Running`
/// 2 to 3.6 s after the condition was first seen (a separate write for 38% of the jobs with the
/// 1 s pace); at 5,000 nodes and 1,000 gangs, 7 to 15 s after (a separate write for 68% of the
/// jobs with a 5 s pace). A `False` one (the gang does not fit) waits [`STARTING_PACE`]: nothing
/// starts next, and it says why the gang waits.
pub const SCHEDULED_PACE: std::time::Duration = std::time::Duration::from_secs(15);

/// How long a change of the live counts may wait while some of the job's active pods are not
/// ready yet ([`status_pace`]): a gang's pods start together, so the job going `Running` and its
/// last pod ready go out as one write. At 5,000 nodes in upstream mode, the 1 s pace wrote a
/// job's status 3.0 times before its last pod was bound, most of the third write a gang's pods
/// turning ready more than 1 s apart.
pub const STARTING_PACE: std::time::Duration = std::time::Duration::from_secs(5);

/// PURE: how long the change from `old` to `new` may wait before it is written: `None` when it
/// is written at once ([`status_may_wait`] is false); [`SCHEDULED_PACE`] once kube-scheduler
/// placed the gang (the mirrored `PodGroupInitiallyScheduled` is `True`) of a job that was
/// `Pending` (or had no status), when that condition is the only change or fewer pods are ready
/// than active, and for the first status of a job in upstream mode (`api`) whose gang
/// kube-scheduler has not decided on yet (no such condition) while fewer pods are ready than
/// active; [`STARTING_PACE`] when that condition alone changed otherwise, or while fewer pods
/// are ready than active; [`STATUS_PACE`] otherwise. The wait counts from when the first change
/// was seen, so the write that makes every pod ready goes at once when that first change is
/// [`STATUS_PACE`] old.
///
/// The undecided gang's wait: kube-scheduler's queue holds a gang there for as long as it is
/// behind, and nothing about the job changes until it decides (a `False` decision, the gang
/// does not fit, is written within [`STARTING_PACE`]). With the shorter wait, 61% of 1,000 jobs
/// at 5,000 nodes wrote `Pending` and then `Running`, and 20% a third status, where the write
/// that says `Running` says everything the first would have.
pub fn status_pace(
    old: Option<&MusterJobStatus>,
    new: &MusterJobStatus,
    api: SchedulingApi,
) -> Option<std::time::Duration> {
    if !status_may_wait(old, new) {
        return None;
    }
    let pending = |s: &MusterJobStatus| s.phase == Some(JobPhase::Pending);
    let without = |s: &MusterJobStatus| {
        let mut s = s.clone();
        s.conditions.retain(|c| c.type_ != MIRRORED_CONDITIONS[0]);
        s
    };
    let scheduled_only = old.is_some_and(|old| pending(old) && pending(new) && without(old) == without(new));
    // A gang kube-scheduler placed, its pods starting (the job was Pending or had no status):
    // the write that says every pod ready comes next. Counted from the first change seen, the
    // shorter pace had run out by the time the first pod was ready, and the job wrote `Running`
    // with 1 or 2 of 3 ready about a second before all 3 (581 of 1,000 jobs at 5,000 nodes).
    let starting = old.is_none_or(pending) && new.ready < new.active;
    let placed = conditions::is_true(&new.conditions, MIRRORED_CONDITIONS[0]);
    let undecided =
        api == SchedulingApi::Upstream && conditions::get(&new.conditions, MIRRORED_CONDITIONS[0]).is_none();
    Some(if (placed && (scheduled_only || starting)) || (old.is_none() && undecided && starting) {
        SCHEDULED_PACE
    } else if scheduled_only || new.ready < new.active {
        STARTING_PACE
    } else {
        STATUS_PACE
    })
}

/// PURE: whether a new status may wait for the next paced write: only `active`, `ready`,
/// `terminating`, the phase between `Pending` and `Running` (it follows the pods) and the
/// conditions mirrored from a native PodGroup ([`MIRRORED_CONDITIONS`], upstream mode) moved.
/// All are read afresh on every pass (the counts from the live pods, the conditions from the
/// group), so nothing is lost by writing them a moment later, and a gang's pods starting, or
/// kube-scheduler's quick flips of a group's condition, go out as one write; any other phase, a
/// job's own condition, a completion or a failure is written at once (the count must be
/// recorded before its pod is released). A job's first status may wait when it only says the
/// job is live ([`first_status_may_wait`]).
pub fn status_may_wait(old: Option<&MusterJobStatus>, new: &MusterJobStatus) -> bool {
    let mirrored = |c: &&Condition| MIRRORED_CONDITIONS.contains(&c.type_.as_str());
    let live = |p: Option<JobPhase>| matches!(p, Some(JobPhase::Pending | JobPhase::Running));
    let Some(old) = old else { return first_status_may_wait(new) };
    let phase = if live(old.phase) && live(new.phase) { new.phase } else { old.phase };
    let mut moved =
        MusterJobStatus { active: new.active, ready: new.ready, terminating: new.terminating, phase, ..old.clone() };
    moved.conditions.retain(|c| !mirrored(&c));
    moved.conditions.extend(new.conditions.iter().filter(mirrored).cloned());
    old != new && moved == *new
}

/// PURE: whether a job's first status may wait for the paced write: it says only that the job
/// started and its pods are live (`Pending` or `Running`, the live counts, the start time, the
/// job's groups, `Invalid` false and kube-scheduler's `PodGroupInitiallyScheduled` in upstream
/// mode), nothing counted or decided that must be recorded at once. A gang that starts within
/// [`STARTING_PACE`] of its pods' creation then gets one status write, `Running`, instead of
/// `Pending` and then `Running` (at 5,000 nodes and 1,000 gangs, 90% of jobs went `Running`
/// within 4.5 s of their first status). The controller keeps the start time it first decided
/// until the write (`prev` of [`plan`]), so `activeDeadlineSeconds` counts from it.
pub fn first_status_may_wait(new: &MusterJobStatus) -> bool {
    let quiet =
        |c: &&Condition| (c.type_ == condition::INVALID && c.status == "False") || c.type_ == MIRRORED_CONDITIONS[0];
    let only_live = MusterJobStatus {
        phase: new.phase,
        progress: new.progress.clone(),
        active: new.active,
        ready: new.ready,
        terminating: new.terminating,
        conditions: new.conditions.iter().filter(quiet).cloned().collect(),
        start_time: new.start_time.clone(),
        workload_name: new.workload_name.clone(),
        pod_group_name: new.pod_group_name.clone(),
        observed_generation: new.observed_generation,
        ..Default::default()
    };
    matches!(new.phase, Some(JobPhase::Pending | JobPhase::Running)) && only_live == *new
}

/// A pod to create.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NewPod {
    /// Completion index (Indexed jobs).
    pub index: Option<i32>,
    /// Gang attempt.
    pub attempt: i32,
    /// With `backoffLimitPerIndex`: failures of its index counted so far.
    pub index_failures: i32,
    /// With `backoffLimitPerIndex`: failures of its index a rule ignored so far.
    pub index_ignored: i32,
}

/// How a job ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finish {
    /// `Complete` or `Failed` (set now: the job's last pods are gone).
    pub condition: &'static str,
    /// Machine-readable reason.
    pub reason: &'static str,
    /// For people.
    pub message: String,
}

/// The decision of one reconcile.
#[derive(Clone, Debug, PartialEq)]
pub struct JobPlan {
    /// Pods to create: at most [`CREATE_PER_PASS`].
    pub create: Vec<NewPod>,
    /// More pods are missing than `create` holds: the next pass makes the next batch.
    pub more_to_create: bool,
    /// Names of pods to delete, with why.
    pub delete: Vec<(String, &'static str)>,
    /// The deleted pods count as failed (the job fails): their tracking finalizer stays until
    /// the status counting them is written. Otherwise it goes before the delete.
    pub deletes_counted: bool,
    /// Pods whose tracking finalizer goes once the status is written.
    pub release: Vec<String>,
    /// The job ended in this reconcile.
    pub finished: Option<Finish>,
    /// The status to write.
    pub status: MusterJobStatus,
    /// Seconds until something time-based happens (deadline, TTL).
    pub requeue_after: Option<i64>,
    /// The job should be deleted now (TTL after finished).
    pub delete_job: bool,
}

/// The number of completions a job needs (`completions`, defaulting to `parallelism`).
pub fn completions(spec: &MusterJobSpec) -> i32 {
    spec.completions.unwrap_or(spec.parallelism).max(0)
}

/// Reads the indexes below `end` in the batch/v1 form written by [`format_indexes`]; parts
/// that do not parse are skipped (the status is muster's own, so that only happens after a hand
/// edit). Only indexes in `0..end` are kept, so a range is never made larger than that.
pub fn parse_indexes(s: &str, end: i32) -> BTreeSet<i32> {
    let mut out = BTreeSet::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let range = match part.split_once('-') {
            Some((a, b)) => a.parse::<i32>().ok().zip(b.parse::<i32>().ok()),
            None => part.parse::<i32>().ok().map(|i| (i, i)),
        };
        if let Some((first, last)) = range {
            out.extend(first.max(0)..=last.min(end.saturating_sub(1)));
        }
    }
    out
}

/// Compresses indexes into the batch/v1 form: `0-2,5,7-8`.
pub fn format_indexes(indexes: &BTreeSet<i32>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut iter = indexes.iter().copied().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while iter.peek() == Some(&(end + 1)) {
            end += 1;
            iter.next();
        }
        out.push(match end - start {
            0 => start.to_string(),
            // Two in a row are written as two, as batch/v1 writes them.
            1 => format!("{start},{end}"),
            _ => format!("{start}-{end}"),
        });
    }
    out.join(",")
}

fn finished_condition(status: &MusterJobStatus) -> Option<&'static str> {
    [condition::COMPLETE, condition::FAILED].into_iter().find(|c| conditions::is_true(&status.conditions, c))
}

/// batch/v1's `pastBackoffLimitOnFailure`: with a limit of 0 one restart is too many, else the
/// job fails once the restarts reach the limit.
fn restarts_past_limit(restarts: i32, backoff_limit: i32) -> bool {
    if backoff_limit <= 0 { restarts > 0 } else { restarts >= backoff_limit }
}

/// batch/v1's reasons and messages of the terminal conditions.
pub mod reason {
    /// More pods failed than `backoffLimit` allows.
    pub const BACKOFF_LIMIT_EXCEEDED: (&str, &str) =
        ("BackoffLimitExceeded", "Job has reached the specified backoff limit");
    /// `activeDeadlineSeconds` passed.
    pub const DEADLINE_EXCEEDED: (&str, &str) = ("DeadlineExceeded", "Job was active longer than specified deadline");
    /// More indexes failed than `maxFailedIndexes` allows.
    pub const MAX_FAILED_INDEXES_EXCEEDED: (&str, &str) =
        ("MaxFailedIndexesExceeded", "Job has exceeded the specified maximal number of failed indexes");
    /// Every index finished, some failed.
    pub const FAILED_INDEXES: (&str, &str) = ("FailedIndexes", "Job has failed indexes");
    /// `completions` pods (or indexes) succeeded.
    pub const COMPLETIONS_REACHED: (&str, &str) = ("CompletionsReached", "Reached expected number of succeeded pods");
    /// A `podFailurePolicy` FailJob rule matched (the message names the pod).
    pub const POD_FAILURE_POLICY: &str = "PodFailurePolicy";
    /// A `successPolicy` rule matched (the message names the rule).
    pub const SUCCESS_POLICY: &str = "SuccessPolicy";
}

/// What becomes of one pod of the job, as batch/v1 judges it.
struct Judged<'a> {
    pod: &'a ObservedPod,
    /// One of the job's own (not rolled back, not a gang restart's victim) with a valid index.
    own: bool,
    /// Failed as batch/v1 says: phase Failed, or deleted before it finished when replacements
    /// do not wait for that (`podReplacementPolicy: TerminatingOrFailed`).
    failed: bool,
    /// The `podFailurePolicy` rule it matched.
    matched: Option<(Action, Option<String>)>,
}

impl Judged<'_> {
    /// Its failure counts toward `backoffLimit` (not ignored by a rule).
    fn counts(&self) -> bool {
        self.own && self.failed && !matches!(self.matched, Some((Action::Ignore, _)))
    }
    fn active(&self) -> bool {
        self.pod.active()
    }
}

/// How the job's pods are admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gang {
    /// Each on its own (no gang policy): failed pods are replaced after batch/v1's backoff.
    None,
    /// A gang, disruption mode `single`: a failed pod is replaced at once, while its gang still
    /// runs (a replacement made after the rest finished could never be admitted).
    Single,
    /// A gang, disruption mode `all`: a failed pod restarts its whole attempt, at once.
    All,
}

/// `true` is a gang with disruption mode `all`, `false` no gang.
impl From<bool> for Gang {
    fn from(all: bool) -> Self {
        if all { Gang::All } else { Gang::None }
    }
}

/// Decides the next step of a job in `namespace`. `gang` says how its pods are admitted (with
/// disruption mode `all` a failed pod restarts its whole attempt).
pub fn plan(
    namespace: &str,
    job_spec: &MusterJobSpec,
    generation: Option<i64>,
    prev: &MusterJobStatus,
    pods: &[ObservedPod],
    gang: impl Into<Gang>,
    now: Timestamp,
) -> JobPlan {
    let gang = gang.into();
    let indexed = job_spec.indexed();
    let want_completions = completions(job_spec);
    // NonIndexed without `completions`: a work queue, done once a pod succeeded and none runs.
    let work_queue = !indexed && job_spec.completions.is_none();
    let index_end = want_completions.min(MAX_INDEXES);
    let only_failed = job_spec.pod_replacement_policy() == PodReplacementPolicy::Failed;
    let per_index = job_spec.backoff_limit_per_index.filter(|_| indexed);
    let valid = |p: &ObservedPod| !indexed || p.index.is_some_and(|i| (0..index_end).contains(&i));
    // A pod of a rolled-back gang attempt is not the job's: it ended because a pin failed
    // (kubelet may still mark it Failed while it terminates), so it counts for nothing; nor
    // does a pod muster deleted because another of its gang attempt failed.
    let judged: Vec<Judged> = pods
        .iter()
        .map(|p| {
            let own = !p.rolled_back && !p.gang_restarted && valid(p);
            let failed =
                p.phase == Lifecycle::Failed || (!only_failed && p.terminating && p.phase != Lifecycle::Succeeded);
            let matched = job_spec
                .pod_failure_policy
                .as_ref()
                .filter(|_| own && failed)
                .and_then(|policy| policy::match_pod_failure_policy(policy, namespace, p));
            Judged { pod: p, own, failed, matched }
        })
        .collect();
    let active: Vec<&Judged> = judged.iter().filter(|j| j.active()).collect();
    let terminating_now = pods.iter().filter(|p| p.terminating && !p.phase.is_terminal()).count() as i32;

    // Counts: what the last status recorded plus the pods it does not count yet (those still
    // carrying the tracking finalizer). A finished pod is only released once a status counts
    // it, so a count never drops and no pod is counted twice.
    let new_succeeded =
        judged.iter().filter(|j| j.own && j.pod.tracked && j.pod.phase == Lifecycle::Succeeded).count() as i32;
    let visible_succeeded = judged.iter().filter(|j| j.own && j.pod.phase == Lifecycle::Succeeded).count() as i32;
    // The failures this pass judges by: those recorded and those not recorded yet (a failed pod
    // whose release waits for its index's next pod is recorded only once it is released).
    let failed =
        prev.failed.max(0).saturating_add(judged.iter().filter(|j| j.pod.tracked && j.counts()).count() as i32);
    let recorded_indexes = prev.completed_indexes.as_deref().map(|s| parse_indexes(s, index_end)).unwrap_or_default();
    let succeeded_indexes: BTreeSet<i32> = judged
        .iter()
        .filter(|j| j.own && j.pod.phase == Lifecycle::Succeeded)
        .filter_map(|j| j.pod.index)
        .chain(recorded_indexes)
        .collect();
    let succeeded = if indexed {
        succeeded_indexes.len() as i32
    } else {
        prev.succeeded.max(0).saturating_add(new_succeeded).max(visible_succeeded)
    };
    // backoffLimitPerIndex: an index fails when a counted failure of its pod reaches the
    // limit (the failures of the index before the pod are on the pod), or a FailIndex rule
    // matches.
    let failed_indexes: BTreeSet<i32> = match per_index {
        Some(limit) => judged
            .iter()
            .filter(|j| j.own && j.failed && j.pod.tracked)
            .filter(|j| match &j.matched {
                Some((Action::FailIndex, _)) => true,
                _ => j.counts() && j.pod.index_failures >= limit,
            })
            .filter_map(|j| j.pod.index)
            .chain(prev.failed_indexes.as_deref().map(|s| parse_indexes(s, index_end)).unwrap_or_default())
            .filter(|i| !succeeded_indexes.contains(i))
            .collect(),
        None => BTreeSet::new(),
    };
    // batch/v1: with `restartPolicy: OnFailure` a failing container restarts in place, so the
    // restarts of the pods still pending or running are the retries backoffLimit bounds.
    let on_failure = job_spec.template.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) == Some("OnFailure");
    let restarts = if on_failure {
        pods.iter().filter(|p| !p.phase.is_terminal()).map(|p| p.restarts).fold(0i32, i32::saturating_add)
    } else {
        0
    };

    let mut status = MusterJobStatus {
        conditions: prev.conditions.clone(),
        start_time: prev.start_time.clone(),
        completion_time: prev.completion_time.clone(),
        workload_name: prev.workload_name.clone(),
        pod_group_name: prev.pod_group_name.clone(),
        observed_generation: generation,
        ..Default::default()
    };
    let mut out = JobPlan {
        create: vec![],
        more_to_create: false,
        delete: vec![],
        deletes_counted: false,
        release: vec![],
        finished: None,
        status: MusterJobStatus::default(),
        requeue_after: None,
        delete_job: false,
    };
    conditions::set(&mut status.conditions, condition::INVALID, false, "Valid", "", generation, now);

    if let Some(kind) = finished_condition(prev) {
        // Finished: nothing changes any more (as batch/v1, which no longer syncs the job); a
        // straggler is deleted, every pod released, and the TTL runs.
        let mut status = MusterJobStatus { observed_generation: generation, ..prev.clone() };
        conditions::set(&mut status.conditions, condition::INVALID, false, "Valid", "", generation, now);
        let why = if kind == condition::COMPLETE { "JobComplete" } else { "JobFailed" };
        out.delete.extend(active.iter().map(|j| (j.pod.name.clone(), why)));
        out.release.extend(pods.iter().filter(|p| p.tracked).map(|p| p.name.clone()));
        if let Some(ttl) = job_spec.ttl_seconds_after_finished {
            let done = status
                .completion_time
                .as_ref()
                .or_else(|| conditions::get(&status.conditions, kind).map(|c| &c.last_transition_time))
                .map(|t| t.0)
                .unwrap_or(now);
            let left = done.as_second() + i64::from(ttl) - now.as_second();
            if left <= 0 {
                out.delete_job = true;
            } else {
                out.requeue_after = Some(left);
            }
        }
        out.status = status;
        return out;
    }

    // batch/v1: activeDeadlineSeconds counts the time a job is continuously active. A
    // suspended job has no startTime, and resuming one starts the clock again.
    if job_spec.suspend {
        status.start_time = None;
    } else if status.start_time.is_none() || conditions::is_true(&prev.conditions, condition::SUSPENDED) {
        status.start_time = Some(Time(now));
    }
    let started = status.start_time.as_ref().map(|t| t.0);
    let deadline_passed = match (job_spec.active_deadline_seconds, started) {
        (Some(d), Some(s)) if !job_spec.suspend => now.as_second() - s.as_second() >= d,
        _ => false,
    };

    // The interim condition (FailureTarget or SuccessCriteriaMet) with its reason and message.
    let interim = |t: &'static str| {
        conditions::get(&prev.conditions, t)
            .filter(|c| c.status == "True")
            .map(|c| (t, c.reason.clone(), c.message.clone()))
    };
    let fail = |(r, m): (&str, &str)| Some((condition::FAILURE_TARGET, r.to_string(), m.to_string()));
    let mut finishing: Option<(&'static str, String, String)> =
        interim(condition::SUCCESS_CRITERIA_MET).or_else(|| interim(condition::FAILURE_TARGET));
    if finishing.is_none() {
        finishing = judged
            .iter()
            .filter(|j| j.own && j.failed)
            .find_map(|j| match &j.matched {
                Some((Action::FailJob, Some(m))) => Some(m.clone()),
                _ => None,
            })
            .map(|m| (condition::FAILURE_TARGET, reason::POD_FAILURE_POLICY.to_string(), m));
    }
    if finishing.is_none() {
        if failed > job_spec.backoff_limit() || restarts_past_limit(restarts, job_spec.backoff_limit()) {
            finishing = fail(reason::BACKOFF_LIMIT_EXCEEDED);
        } else if deadline_passed {
            finishing = fail(reason::DEADLINE_EXCEEDED);
        }
    }
    if finishing.is_none() && per_index.is_some() {
        let failed_n = failed_indexes.len() as i64;
        if job_spec.max_failed_indexes.is_some_and(|m| failed_n > i64::from(m)) {
            finishing = fail(reason::MAX_FAILED_INDEXES_EXCEEDED);
        } else if failed_n > 0 && failed_n + succeeded_indexes.len() as i64 >= i64::from(want_completions) {
            finishing = fail(reason::FAILED_INDEXES);
        }
    }
    if finishing.is_none() && indexed {
        finishing = job_spec
            .success_policy
            .as_ref()
            .and_then(|policy| policy::match_success_policy(policy, want_completions, &succeeded_indexes))
            .map(|m| (condition::SUCCESS_CRITERIA_MET, reason::SUCCESS_POLICY.to_string(), m));
    }

    let mut terminating = terminating_now;
    if let Some((kind, why, _)) = &finishing {
        // Every pod still running goes; when the job fails, each counts as a failed pod.
        let why: &'static str = if *kind == condition::FAILURE_TARGET { reason_str(why) } else { "JobComplete" };
        out.delete.extend(active.iter().map(|j| (j.pod.name.clone(), why)));
        out.deletes_counted = *kind == condition::FAILURE_TARGET;
    } else if job_spec.suspend {
        conditions::set(
            &mut status.conditions,
            condition::SUSPENDED,
            true,
            "JobSuspended",
            "Job suspended",
            generation,
            now,
        );
        out.delete.extend(active.iter().map(|j| (j.pod.name.clone(), "JobSuspended")));
    } else {
        if conditions::is_true(&status.conditions, condition::SUSPENDED) {
            conditions::set(
                &mut status.conditions,
                condition::SUSPENDED,
                false,
                "JobResumed",
                "Job resumed",
                generation,
                now,
            );
        }
        if let (Some(d), Some(s)) = (job_spec.active_deadline_seconds, status.start_time.as_ref()) {
            out.requeue_after = Some((s.0.as_second() + d - now.as_second()).max(1));
        }
        let ctx = PodsCtx {
            judged: &judged,
            active: &active,
            succeeded_indexes: &succeeded_indexes,
            failed_indexes: &failed_indexes,
            succeeded,
            failed,
            gang_all: gang == Gang::All,
            backoff: gang == Gang::None,
            work_queue,
            terminating: if only_failed { terminating_now } else { 0 },
            now: now.as_second(),
        };
        plan_pods(job_spec, &ctx, &mut out);
    }
    let deleting: BTreeSet<&str> = out.delete.iter().map(|(n, _)| n.as_str()).collect();
    let remaining_active: Vec<&&Judged> = active.iter().filter(|j| !deleting.contains(j.pod.name.as_str())).collect();
    terminating = terminating.saturating_add(out.delete.len() as i32);
    let active_n = remaining_active.len() as i32 + out.create.len() as i32;
    if finishing.is_none() {
        let complete = if work_queue { succeeded > 0 } else { succeeded >= want_completions };
        if complete && active_n == 0 {
            let (r, m) = reason::COMPLETIONS_REACHED;
            finishing = Some((condition::SUCCESS_CRITERIA_MET, r.to_string(), m.to_string()));
        }
    }

    let mut stopped = 0;
    if let Some((kind, why, message)) = &finishing {
        if *kind == condition::FAILURE_TARGET {
            // batch/v1 counts every pod it stops as failed (unless a rule ignores it).
            stopped = judged
                .iter()
                .filter(|j| j.own && j.pod.tracked && !j.failed && j.pod.phase != Lifecycle::Succeeded)
                .count() as i32;
        }
        conditions::set(&mut status.conditions, kind, true, why, message, generation, now);
        out.release.extend(pods.iter().filter(|p| p.tracked).map(|p| p.name.clone()));
        if terminating == 0 {
            let final_kind = if *kind == condition::FAILURE_TARGET { condition::FAILED } else { condition::COMPLETE };
            conditions::set(&mut status.conditions, final_kind, true, why, message, generation, now);
            if final_kind == condition::COMPLETE {
                status.completion_time = Some(Time(now));
            }
            out.finished = Some(Finish { condition: final_kind, reason: reason_str(why), message: message.clone() });
            if let Some(ttl) = job_spec.ttl_seconds_after_finished {
                out.requeue_after = Some(i64::from(ttl).max(1));
            }
        }
    } else {
        // Released once the status written counts them: finished pods, and pods that never
        // count. With backoffLimitPerIndex a failed pod waits until its index has its next pod,
        // which carries the index's failure count on.
        let busy: BTreeSet<i32> = remaining_active
            .iter()
            .filter_map(|j| j.pod.index)
            .chain(out.create.iter().filter_map(|n| n.index))
            .collect();
        for j in judged.iter().filter(|j| j.pod.tracked) {
            let p = j.pod;
            let release = if !j.own {
                p.rolled_back || p.gang_restarted || p.terminating || p.phase.is_terminal()
            } else if p.phase == Lifecycle::Succeeded {
                true
            } else if j.failed {
                let waits = per_index.is_some()
                    && p.index.is_some_and(|i| {
                        !busy.contains(&i) && !succeeded_indexes.contains(&i) && !failed_indexes.contains(&i)
                    });
                !waits
            } else {
                false
            };
            if release {
                out.release.push(p.name.clone());
            }
        }
    }

    status.active = active_n;
    status.ready = remaining_active.iter().filter(|j| j.pod.ready).count() as i32;
    status.terminating = Some(terminating);
    status.succeeded = succeeded;
    // Recorded: the failures released now (their pods lose the tracking finalizer once this
    // status is written), and, when the job fails, every pod it stops.
    let releasing: BTreeSet<&str> = out.release.iter().map(String::as_str).collect();
    let recorded = judged.iter().filter(|j| j.pod.tracked && j.counts() && releasing.contains(j.pod.name.as_str()));
    status.failed = prev.failed.max(0).saturating_add(recorded.count() as i32).saturating_add(stopped);
    status.progress = Some(format!("{succeeded}/{want_completions}"));
    if indexed {
        status.completed_indexes = Some(format_indexes(&succeeded_indexes)).filter(|s| !s.is_empty());
    }
    if per_index.is_some() {
        status.failed_indexes = Some(format_indexes(&failed_indexes));
    }
    status.phase = Some(if conditions::is_true(&status.conditions, condition::COMPLETE) {
        JobPhase::Complete
    } else if conditions::is_true(&status.conditions, condition::FAILED) {
        JobPhase::Failed
    } else if job_spec.suspend && finishing.is_none() {
        JobPhase::Suspended
    } else if remaining_active.iter().any(|j| j.pod.phase == Lifecycle::Running) {
        JobPhase::Running
    } else {
        JobPhase::Pending
    });
    out.status = status;
    out
}

/// The `&'static` form of a terminal reason muster writes (a reason read back from a status
/// written by hand becomes `JobFailed`).
fn reason_str(r: &str) -> &'static str {
    [
        reason::BACKOFF_LIMIT_EXCEEDED.0,
        reason::DEADLINE_EXCEEDED.0,
        reason::MAX_FAILED_INDEXES_EXCEEDED.0,
        reason::FAILED_INDEXES.0,
        reason::COMPLETIONS_REACHED.0,
        reason::POD_FAILURE_POLICY,
        reason::SUCCESS_POLICY,
    ]
    .into_iter()
    .find(|k| *k == r)
    .unwrap_or("JobFailed")
}

/// What [`plan_pods`] reads of the job's pods.
struct PodsCtx<'a, 'b> {
    judged: &'a [Judged<'b>],
    active: &'a [&'a Judged<'b>],
    succeeded_indexes: &'a BTreeSet<i32>,
    failed_indexes: &'a BTreeSet<i32>,
    succeeded: i32,
    failed: i32,
    gang_all: bool,
    /// Failed pods are replaced after batch/v1's backoff (not in a gang).
    backoff: bool,
    work_queue: bool,
    /// Pods being deleted that a replacement waits for (`podReplacementPolicy: Failed`).
    terminating: i32,
    /// Unix seconds now (the failure backoff).
    now: i64,
}

fn plan_pods(spec: &MusterJobSpec, ctx: &PodsCtx, out: &mut JobPlan) {
    let want_completions = completions(spec);
    let index_end = want_completions.min(MAX_INDEXES);
    // A pod failed for the gang: phase Failed, or deleted (and so failed) while still counted.
    let gang_failed = |j: &Judged| j.own && j.failed && (j.pod.phase == Lifecycle::Failed || j.pod.tracked);
    // Disruption mode `all`: a failed pod takes its whole attempt down; the next attempt is
    // created together, so the gang starts again as a whole.
    let failed_attempts: BTreeSet<i32> = ctx.judged.iter().filter(|j| gang_failed(j)).map(|j| j.pod.attempt).collect();
    let mut keep: Vec<&ObservedPod> = Vec::new();
    for j in ctx.active {
        if ctx.gang_all && failed_attempts.contains(&j.pod.attempt) {
            out.delete.push((j.pod.name.clone(), "GangRestart"));
        } else if spec.indexed() && !j.pod.index.is_some_and(|i| (0..index_end).contains(&i)) {
            // An index past `completions` (an elastic job scaled down) or none.
            out.delete.push((j.pod.name.clone(), "TooManyActive"));
        } else {
            keep.push(j.pod);
        }
    }
    if spec.indexed() {
        // One pod per index: the extra ones of a repeated index go (gated ones first).
        let mut by_index: BTreeMap<i32, Vec<&ObservedPod>> = BTreeMap::new();
        for p in &keep {
            by_index.entry(p.index.unwrap_or_default()).or_default().push(p);
        }
        let mut dups: BTreeSet<String> = BTreeSet::new();
        for (_, mut same) in by_index.into_iter().filter(|(_, v)| v.len() > 1) {
            same.sort_by_key(|p| (!p.gated, p.phase == Lifecycle::Running, p.ready, std::cmp::Reverse(p.name.clone())));
            dups.extend(same[..same.len() - 1].iter().map(|p| p.name.clone()));
        }
        keep.retain(|p| !dups.contains(&p.name));
        out.delete.extend(dups.into_iter().map(|n| (n, "TooManyActive")));
    }
    let want_active = if ctx.work_queue {
        if ctx.succeeded > 0 { keep.len() } else { spec.parallelism.max(0) as usize }
    } else {
        spec.parallelism.max(0).min(want_completions.saturating_sub(ctx.succeeded)).max(0) as usize
    };
    if keep.len() > want_active {
        // Fewer pods wanted (parallelism lowered, or nearly complete): drop gated ones first,
        // then the highest indexes.
        let mut extra: Vec<&ObservedPod> = keep.clone();
        extra.sort_by_key(|p| (!p.gated, std::cmp::Reverse(p.index), std::cmp::Reverse(p.name.clone())));
        for p in extra.into_iter().take(keep.len() - want_active) {
            out.delete.push((p.name.clone(), "TooManyActive"));
        }
        return;
    }
    if !out.delete.is_empty() {
        // Deleting comes before creating (as batch/v1); after a gang restart, the next attempt
        // is created only once the old one is gone, so it is admitted whole.
        return;
    }
    // One batch per pass: the pods made trigger the next pass, which makes the next batch.
    let missing = want_active.saturating_sub(keep.len()).saturating_sub(ctx.terminating.max(0) as usize);
    let per_index = spec.indexed() && spec.backoff_limit_per_index.is_some();
    if missing > 0 && !per_index && ctx.backoff {
        // batch/v1's failure backoff: 10 s after a failure, doubling with each failure since
        // the last success (ignored failures too), at most 10 min.
        let finished = |j: &&Judged| j.own && j.pod.finished_at.is_some();
        let last_success = ctx
            .judged
            .iter()
            .filter(finished)
            .filter(|j| j.pod.phase == Lifecycle::Succeeded)
            .filter_map(|j| j.pod.finished_at)
            .max();
        let failures: Vec<i64> = ctx
            .judged
            .iter()
            .filter(finished)
            .filter(|j| j.failed)
            .filter_map(|j| j.pod.finished_at)
            .filter(|t| last_success.is_none_or(|s| *t > s))
            .collect();
        let left = backoff_left(failures.len() as i64, failures.iter().copied().max(), ctx.now);
        if left > 0 {
            out.requeue_after = Some(out.requeue_after.map_or(left, |r| r.min(left)));
            return;
        }
    }
    let batch = missing.min(CREATE_PER_PASS);
    // Past every counted failure and every failed attempt still visible: a new attempt never
    // reuses a number whose failure would restart it again at once.
    let attempt = ctx
        .judged
        .iter()
        .filter(|j| j.own && j.failed)
        .map(|j| j.pod.attempt.saturating_add(1))
        .fold(ctx.failed, i32::max);
    if spec.indexed() {
        // The free indexes, lowest first, as a lazy range: never a list of every index.
        let mut busy: BTreeSet<i32> = keep.iter().filter_map(|p| p.index).collect();
        if spec.pod_replacement_policy() == PodReplacementPolicy::Failed {
            busy.extend(
                ctx.judged
                    .iter()
                    .filter(|j| j.pod.terminating && !j.pod.phase.is_terminal())
                    .filter_map(|j| j.pod.index),
            );
        }
        let pending = (0..index_end)
            .filter(|i| !ctx.succeeded_indexes.contains(i) && !ctx.failed_indexes.contains(i) && !busy.contains(i))
            .take(batch);
        if per_index {
            // Each index waits its own backoff: from its last failure, doubling with its
            // failures so far (counted and ignored).
            let mut soonest: Option<i64> = None;
            for i in pending {
                let (failures, ignored) = index_counts(ctx.judged, i);
                let last = ctx
                    .judged
                    .iter()
                    .filter(|j| j.own && j.failed && j.pod.index == Some(i))
                    .filter_map(|j| j.pod.finished_at)
                    .max();
                let left =
                    if ctx.backoff { backoff_left(i64::from(failures) + i64::from(ignored), last, ctx.now) } else { 0 };
                if left > 0 {
                    soonest = Some(soonest.map_or(left, |s| s.min(left)));
                } else {
                    out.create.push(NewPod {
                        index: Some(i),
                        attempt,
                        index_failures: failures,
                        index_ignored: ignored,
                    });
                }
            }
            if let Some(left) = soonest.filter(|_| out.create.is_empty()) {
                out.requeue_after = Some(out.requeue_after.map_or(left, |r| r.min(left)));
            }
        } else {
            out.create.extend(pending.map(|i| NewPod { index: Some(i), attempt, ..NewPod::default() }));
        }
    } else {
        out.create.extend((0..batch).map(|_| NewPod { index: None, attempt, ..NewPod::default() }));
    }
    out.more_to_create = missing > out.create.len() && out.create.len() == CREATE_PER_PASS;
}

/// The failures of index `i` counted and ignored so far, as its next pod carries them: those
/// of the pod of the index that knew the most, plus its own failure while it is uncounted.
fn index_counts(judged: &[Judged], i: i32) -> (i32, i32) {
    judged
        .iter()
        .filter(|j| j.pod.index == Some(i))
        .map(|j| {
            let (mut f, mut g) = (j.pod.index_failures, j.pod.index_ignored);
            if j.own && j.failed && j.pod.tracked {
                if j.counts() {
                    f = f.saturating_add(1);
                } else {
                    g = g.saturating_add(1);
                }
            }
            (f, g)
        })
        .max_by_key(|(f, g)| (f.saturating_add(*g), *f))
        .unwrap_or((0, 0))
}

/// The subdomain of `job`'s new pods ([`new_pod`]'s `subdomain`). A set's child: the one the set
/// wrote into its pod template (its network's Service; none with DNS hostnames off). A job of
/// its own: its Indexed pods are named through the job's own headless Service.
pub fn pod_subdomain(job: &MusterJob) -> Option<String> {
    if owning_set(job).is_some() {
        job.spec.template.spec.as_ref().and_then(|s| s.subdomain.clone())
    } else {
        job.spec.indexed().then(|| job.metadata.name.clone().unwrap_or_default())
    }
}

/// The pod to create for `job`: the template plus muster's labels, gate, index and GPU env.
/// `subdomain` is the headless Service giving pods stable DNS names; `admission_attempt` is the
/// rollbacks of the pod's root gang so far (`scheduling.muster.dev/gang-attempt`).
pub fn new_pod(job: &MusterJob, new: &NewPod, pod_group: &str, subdomain: Option<&str>, admission_attempt: i32) -> Pod {
    let name = job.metadata.name.clone().unwrap_or_default();
    let template = &job.spec.template;
    let tmeta = template.metadata.clone().unwrap_or_default();
    // muster's own keys come from muster alone: a template's are dropped (the webhook refuses
    // them; this holds for a job that got past it).
    let mut labels: BTreeMap<String, String> = without_muster_keys(tmeta.labels);
    labels.extend(job_labels(job));
    labels.insert(POD_GROUP_LABEL.into(), pod_group.into());
    let mut annotations: BTreeMap<String, String> = without_muster_keys(tmeta.annotations);
    annotations.insert(GANG_ATTEMPT_ANNOTATION.into(), new.attempt.to_string());
    annotations.insert(ADMISSION_ATTEMPT_ANNOTATION.into(), admission_attempt.max(0).to_string());
    if owning_set(job).is_some() {
        // A set's child passes JobSet's labels and annotations on to its pods.
        let set_keys = |m: Option<&BTreeMap<String, String>>| {
            m.into_iter()
                .flatten()
                .filter(|(k, _)| k.starts_with(JOBSET_KEY_PREFIX))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<Vec<_>>()
        };
        labels.extend(set_keys(job.metadata.labels.as_ref()));
        annotations.extend(set_keys(job.metadata.annotations.as_ref()));
    }
    if job.spec.backoff_limit_per_index.is_some() && new.index.is_some() {
        annotations.insert(INDEX_FAILURE_COUNT_ANNOTATION.into(), new.index_failures.max(0).to_string());
        if new.index_ignored > 0 {
            annotations.insert(INDEX_IGNORED_FAILURE_COUNT_ANNOTATION.into(), new.index_ignored.to_string());
        }
    }
    let mut finalizers = tmeta.finalizers.unwrap_or_default();
    if !finalizers.iter().any(|f| f == TRACKING_FINALIZER) {
        finalizers.push(TRACKING_FINALIZER.to_string());
    }
    let mut spec: PodSpec = template.spec.clone().unwrap_or_default();
    if spec.restart_policy.is_none() {
        spec.restart_policy = Some("Never".into());
    }
    spec.scheduling_gates.get_or_insert_with(Vec::new).push(PodSchedulingGate { name: ADMISSION_GATE.into() });
    let generate_name = match new.index {
        Some(i) => {
            annotations.insert(COMPLETION_INDEX_ANNOTATION.into(), i.to_string());
            labels.insert(COMPLETION_INDEX_LABEL.into(), i.to_string());
            spec.hostname = Some(format!("{name}-{i}"));
            for c in spec.containers.iter_mut().chain(spec.init_containers.iter_mut().flatten()) {
                add_env(c, COMPLETION_INDEX_ENV, &format!("metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"));
            }
            format!("{name}-{i}-")
        }
        None => format!("{name}-"),
    };
    if let Some(sub) = subdomain {
        spec.subdomain = Some(sub.to_string());
    }
    for c in spec.containers.iter_mut() {
        if wants_gpus(c) {
            add_env(c, GPU_INDICES_ENV, &format!("metadata.annotations['{GPU_INDICES_ANNOTATION}']"));
        }
    }
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(generate_name),
            namespace: job.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: crate::owners::controller_ref(job).map(|o| vec![o]),
            finalizers: Some(finalizers),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// Turns a pod made by [`new_pod`] into one of a native PodGroup (upstream scheduling API):
/// it joins `pod_group` through `spec.schedulingGroup.podGroupName`, and carries neither
/// muster's pod-group label (muster's webhook and admission leave it alone) nor its gate, so
/// kube-scheduler's GangScheduling admits its gang.
pub fn native_pod(pod: &mut Pod, pod_group: &str) {
    if let Some(labels) = pod.metadata.labels.as_mut() {
        labels.remove(POD_GROUP_LABEL);
    }
    if let Some(annotations) = pod.metadata.annotations.as_mut() {
        annotations.remove(ADMISSION_ATTEMPT_ANNOTATION);
    }
    if let Some(spec) = pod.spec.as_mut() {
        if let Some(gates) = spec.scheduling_gates.as_mut() {
            gates.retain(|g| g.name != ADMISSION_GATE);
        }
        if spec.scheduling_gates.as_ref().is_some_and(Vec::is_empty) {
            spec.scheduling_gates = None;
        }
        spec.scheduling_group =
            Some(k8s_openapi::api::core::v1::PodSchedulingGroup { pod_group_name: Some(pod_group.to_string()) });
    }
}

/// The native PodGroup's conditions a MusterJob in upstream mode shows as its own.
pub const MIRRORED_CONDITIONS: [&str; 2] = ["PodGroupInitiallyScheduled", "DisruptionTarget"];

/// The condition type of a disruption, on pods and on groups.
const DISRUPTION_TARGET: &str = "DisruptionTarget";

/// PURE: the conditions a job in upstream mode mirrors from its native PodGroup (`group`),
/// completed from its pods: where the group has no `DisruptionTarget` (kube-scheduler 1.37
/// writes it on the pods it preempts, not on their PodGroup), the first pod by name that has one
/// and is not finished (a preempted pod is on its way out; once it is gone, so is the
/// condition).
pub fn group_conditions_with_pods(group: &[Condition], pods: &[ObservedPod]) -> Vec<Condition> {
    let mut out = group.to_vec();
    if out.iter().any(|c| c.type_ == DISRUPTION_TARGET) {
        return out;
    }
    let disrupted = pods
        .iter()
        .filter(|p| p.terminating || !p.phase.is_terminal())
        .filter_map(|p| p.disruption.as_deref().map(|c| (&p.name, c)))
        .min_by(|a, b| a.0.cmp(b.0));
    out.extend(disrupted.map(|(_, c)| c.clone()));
    out
}

/// PURE: whether the event of a mirrored condition's change is a Warning: the group not
/// scheduled, or disrupted.
pub fn mirrored_change_is_warning(c: &Condition) -> bool {
    match c.type_.as_str() {
        DISRUPTION_TARGET => c.status == "True",
        _ => c.status == "False",
    }
}

/// PURE: copies the native PodGroup's [`MIRRORED_CONDITIONS`] into a job's `conditions` (a
/// type the group no longer has goes), and returns those whose status or reason changed from
/// `before` (for events).
pub fn mirror_group_conditions(
    conditions: &mut Vec<Condition>,
    group: &[Condition],
    before: &[Condition],
) -> Vec<Condition> {
    crate::conditions::mirror(conditions, group, before, &MIRRORED_CONDITIONS)
}

/// A template's labels or annotations without muster's own keys
/// ([`crate::workloadbuilder::field::is_muster_key`]).
fn without_muster_keys(map: Option<BTreeMap<String, String>>) -> BTreeMap<String, String> {
    let mut map = map.unwrap_or_default();
    map.retain(|k, _| !crate::workloadbuilder::field::is_muster_key(k));
    map
}

/// The UID of the MusterJobSet controlling `job` (its controller owner reference), if one
/// does: only then is it a set's child, and its set labels muster's.
pub fn owning_set(job: &MusterJob) -> Option<&str> {
    job.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| {
            o.controller == Some(true) && o.kind == "MusterJobSet" && o.api_version.starts_with("batch.muster.dev/")
        })
        .map(|o| o.uid.as_str())
}

/// The labels muster puts on what it makes for `job` (pods, the GPU claim template): the job's
/// name and, for a MusterJobSet's child (a set controls it), the set and replicatedJob.
pub fn job_labels(job: &MusterJob) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([(JOB_NAME_LABEL.to_string(), job.metadata.name.clone().unwrap_or_default())]);
    if let Some(job_labels) = job.metadata.labels.as_ref().filter(|_| owning_set(job).is_some()) {
        for key in [JOBSET_NAME_LABEL, REPLICATED_JOB_LABEL] {
            if let Some(v) = job_labels.get(key) {
                labels.insert(key.into(), v.clone());
            }
        }
    }
    labels
}

/// True when a container asks for GPUs (requests or limits).
pub fn wants_gpus(c: &Container) -> bool {
    c.resources.as_ref().is_some_and(|r| {
        [r.limits.as_ref(), r.requests.as_ref()]
            .into_iter()
            .flatten()
            .any(|m| m.get(GPU_RESOURCE).is_some_and(|q| q.0 != "0"))
    })
}

fn add_env(c: &mut Container, name: &str, field_path: &str) {
    let env = c.env.get_or_insert_with(Vec::new);
    if env.iter().any(|e| e.name == name) {
        return;
    }
    env.push(EnvVar {
        name: name.into(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector { api_version: None, field_path: field_path.into() }),
            ..Default::default()
        }),
    });
}

/// An owner reference to `job` that is not the controller (for objects a job only co-owns).
pub fn plain_owner_ref(o: &OwnerReference) -> OwnerReference {
    OwnerReference { controller: None, block_owner_deletion: None, ..o.clone() }
}

mod policy;
pub use policy::{Action, match_pod_failure_policy, match_success_policy};

#[cfg(test)]
mod tests;

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
use muster_api::batch::{JobPhase, MusterJob, MusterJobSpec, MusterJobStatus};
use muster_api::{
    ADMISSION_ATTEMPT_ANNOTATION, ADMISSION_GATE, COMPLETION_INDEX_ANNOTATION, GPU_INDICES_ANNOTATION, GPU_RESOURCE,
    JOB_NAME_LABEL, JOBSET_NAME_LABEL, POD_GROUP_LABEL, REPLICATED_JOB_LABEL, ROLLED_BACK_ANNOTATION,
};

/// Pod annotation: the gang attempt a pod belongs to (with disruption mode `all`, a failure
/// restarts every pod of its attempt).
pub const GANG_ATTEMPT_ANNOTATION: &str = "batch.muster.dev/gang-attempt";
/// Pod label with the completion index (for selectors), as batch/v1 does.
pub const COMPLETION_INDEX_LABEL: &str = "batch.muster.dev/job-completion-index";
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
    /// `completions` pods succeeded.
    pub const COMPLETE: &str = "Complete";
    /// The job failed (backoff limit, deadline).
    pub const FAILED: &str = "Failed";
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
}

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
        }
    }
    fn active(&self) -> bool {
        !self.terminating && !self.phase.is_terminal()
    }
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

/// PURE: whether a new status may wait for the next paced write: only `active`, `ready` and
/// the conditions mirrored from a native PodGroup ([`MIRRORED_CONDITIONS`], upstream mode)
/// moved. All are read afresh on every pass (the counts from the live pods, the conditions from
/// the group), so nothing is lost by writing them a moment later, and kube-scheduler's quick
/// flips of a group's condition go out as one write; a phase, a job's own condition, a
/// completion or a failure is written at once (the failure count must be recorded before its
/// pod is deleted).
pub fn status_may_wait(old: Option<&MusterJobStatus>, new: &MusterJobStatus) -> bool {
    let mirrored = |c: &&Condition| MIRRORED_CONDITIONS.contains(&c.type_.as_str());
    old.is_some_and(|old| {
        let mut moved = MusterJobStatus { active: new.active, ready: new.ready, ..old.clone() };
        moved.conditions.retain(|c| !mirrored(&c));
        moved.conditions.extend(new.conditions.iter().filter(mirrored).cloned());
        old != new && moved == *new
    })
}

/// A pod to create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewPod {
    /// Completion index (Indexed jobs).
    pub index: Option<i32>,
    /// Gang attempt.
    pub attempt: i32,
}

/// How a job ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finish {
    /// `Complete` or `Failed`.
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
        out.push(if start == end { start.to_string() } else { format!("{start}-{end}") });
    }
    out.join(",")
}

/// Pod failures so far, at least: what the last status recorded, and what the failed pods still
/// visible prove. A pod of attempt `k` was created after `k` failures were counted, so `k` plus
/// the failed pods of attempts `k` and later is a lower bound even when older failed pods are
/// gone.
fn failures(recorded: i32, pods: &[ObservedPod]) -> i32 {
    let mut attempts: Vec<i32> =
        pods.iter().filter(|p| p.phase == Lifecycle::Failed).map(|p| p.attempt.max(0)).collect();
    attempts.sort_unstable_by(|a, b| b.cmp(a));
    attempts.iter().enumerate().map(|(n, a)| a.saturating_add(n as i32 + 1)).fold(recorded.max(0), i32::max)
}

/// batch/v1's `pastBackoffLimitOnFailure`: with a limit of 0 one restart is too many, else the
/// job fails once the restarts reach the limit.
fn restarts_past_limit(restarts: i32, backoff_limit: i32) -> bool {
    if backoff_limit <= 0 { restarts > 0 } else { restarts >= backoff_limit }
}

fn finished_condition(status: &MusterJobStatus) -> Option<&'static str> {
    [condition::COMPLETE, condition::FAILED].into_iter().find(|c| conditions::is_true(&status.conditions, c))
}

/// Decides the next step of a job. `gang_all` is true when the job's PodGroup has disruption
/// mode `all` (a failed pod restarts its whole attempt).
pub fn plan(
    job_spec: &MusterJobSpec,
    generation: Option<i64>,
    prev: &MusterJobStatus,
    pods: &[ObservedPod],
    gang_all: bool,
    now: Timestamp,
) -> JobPlan {
    // A pod of a rolled-back gang attempt is not the job's: it ended because a pin failed
    // (kubelet may still mark it Failed while it terminates), so it counts for nothing.
    let pods: Vec<ObservedPod> = pods.iter().filter(|p| !p.rolled_back).cloned().collect();
    let pods = pods.as_slice();
    let want_completions = completions(job_spec);
    let active: Vec<&ObservedPod> = pods.iter().filter(|p| p.active()).collect();
    // Counts never go below what the last status recorded: finished pods may be deleted (by
    // people, or pod GC), and a count that drops would let the job retry past backoffLimit or
    // run an index again that already succeeded.
    let succeeded_pods = (pods.iter().filter(|p| p.phase == Lifecycle::Succeeded).count() as i32).max(prev.succeeded);
    let failed = failures(prev.failed, pods);
    let index_end = want_completions.min(MAX_INDEXES);
    let recorded_indexes = prev.completed_indexes.as_deref().map(|s| parse_indexes(s, index_end)).unwrap_or_default();
    let succeeded_indexes: BTreeSet<i32> = pods
        .iter()
        .filter(|p| p.phase == Lifecycle::Succeeded)
        .filter_map(|p| p.index)
        .chain(recorded_indexes)
        .filter(|i| (0..index_end).contains(i))
        .collect();
    let indexed = job_spec.indexed();
    let succeeded = if indexed { succeeded_indexes.len() as i32 } else { succeeded_pods.min(want_completions) };
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
        finished: None,
        status: MusterJobStatus::default(),
        requeue_after: None,
        delete_job: false,
    };
    let delete_active = |out: &mut JobPlan, why: &'static str| {
        out.delete.extend(active.iter().map(|p| (p.name.clone(), why)));
    };

    conditions::set(&mut status.conditions, condition::INVALID, false, "Valid", "", generation, now);
    let already = finished_condition(prev);
    if already.is_none() {
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
        let finish = if succeeded >= want_completions {
            Some(Finish {
                condition: condition::COMPLETE,
                reason: "Completed",
                message: format!("{succeeded}/{want_completions} completions succeeded"),
            })
        } else if failed > job_spec.backoff_limit() {
            Some(Finish {
                condition: condition::FAILED,
                reason: "BackoffLimitExceeded",
                message: format!("{failed} pod(s) failed, more than the backoff limit of {}", job_spec.backoff_limit()),
            })
        } else if restarts_past_limit(restarts, job_spec.backoff_limit()) {
            Some(Finish {
                condition: condition::FAILED,
                reason: "BackoffLimitExceeded",
                message: format!(
                    "containers restarted {restarts} time(s) (restartPolicy OnFailure), reaching the backoff limit of {}",
                    job_spec.backoff_limit()
                ),
            })
        } else if deadline_passed {
            Some(Finish {
                condition: condition::FAILED,
                reason: "DeadlineExceeded",
                message: format!(
                    "the job was active longer than {}s",
                    job_spec.active_deadline_seconds.unwrap_or_default()
                ),
            })
        } else {
            None
        };
        if let Some(f) = finish {
            conditions::set(&mut status.conditions, f.condition, true, f.reason, &f.message, generation, now);
            status.completion_time = Some(Time(now));
            delete_active(&mut out, if f.condition == condition::COMPLETE { "JobComplete" } else { f.reason });
            out.finished = Some(f);
        }
    }

    let finished = already.or(out.finished.as_ref().map(|f| f.condition));
    if let Some(kind) = finished {
        if already.is_some() {
            delete_active(&mut out, if kind == condition::COMPLETE { "JobComplete" } else { "JobFailed" });
        }
        if let Some(ttl) = job_spec.ttl_seconds_after_finished {
            let done = status.completion_time.as_ref().map(|t| t.0).unwrap_or(now);
            let left = done.as_second() + i64::from(ttl) - now.as_second();
            if left <= 0 {
                out.delete_job = true;
            } else {
                out.requeue_after = Some(left);
            }
        }
    } else if job_spec.suspend {
        conditions::set(
            &mut status.conditions,
            condition::SUSPENDED,
            true,
            "JobSuspended",
            "the job is suspended",
            generation,
            now,
        );
        delete_active(&mut out, "JobSuspended");
    } else {
        if conditions::is_true(&status.conditions, condition::SUSPENDED) {
            conditions::set(
                &mut status.conditions,
                condition::SUSPENDED,
                false,
                "JobResumed",
                "the job was resumed",
                generation,
                now,
            );
        }
        if let (Some(d), Some(s)) = (job_spec.active_deadline_seconds, status.start_time.as_ref()) {
            out.requeue_after = Some((s.0.as_second() + d - now.as_second()).max(1));
        }
        plan_pods(job_spec, pods, &active, &succeeded_indexes, succeeded, failed, gang_all, &mut out);
    }

    let deleting: BTreeSet<&str> = out.delete.iter().map(|(n, _)| n.as_str()).collect();
    let remaining_active: Vec<&&ObservedPod> = active.iter().filter(|p| !deleting.contains(p.name.as_str())).collect();
    status.active = remaining_active.len() as i32 + out.create.len() as i32;
    status.ready = remaining_active.iter().filter(|p| p.ready).count() as i32;
    status.succeeded = succeeded;
    status.failed = failed;
    status.progress = Some(format!("{succeeded}/{want_completions}"));
    if indexed {
        status.completed_indexes = Some(format_indexes(&succeeded_indexes));
    }
    status.phase = Some(if conditions::is_true(&status.conditions, condition::COMPLETE) {
        JobPhase::Complete
    } else if conditions::is_true(&status.conditions, condition::FAILED) {
        JobPhase::Failed
    } else if job_spec.suspend {
        JobPhase::Suspended
    } else if remaining_active.iter().any(|p| p.phase == Lifecycle::Running) {
        JobPhase::Running
    } else {
        JobPhase::Pending
    });
    out.status = status;
    out
}

#[allow(clippy::too_many_arguments)]
fn plan_pods(
    spec: &MusterJobSpec,
    pods: &[ObservedPod],
    active: &[&ObservedPod],
    succeeded_indexes: &BTreeSet<i32>,
    succeeded: i32,
    failed: i32,
    gang_all: bool,
    out: &mut JobPlan,
) {
    let want_completions = completions(spec);
    // Disruption mode `all`: a failed pod takes its whole attempt down; the next attempt is
    // created together, so the gang starts again as a whole.
    let failed_attempts: BTreeSet<i32> =
        pods.iter().filter(|p| p.phase == Lifecycle::Failed).map(|p| p.attempt).collect();
    let mut keep: Vec<&ObservedPod> = Vec::new();
    for p in active {
        if gang_all && failed_attempts.contains(&p.attempt) {
            out.delete.push((p.name.clone(), "GangRestart"));
        } else {
            keep.push(p);
        }
    }
    let restarting = keep.len() < active.len();
    let want_active = spec.parallelism.max(0).min(want_completions - succeeded).max(0) as usize;
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
    if restarting && gang_all {
        // Create the next attempt only once the old one is gone, so it is admitted whole.
        return;
    }
    // One batch per pass: the pods made trigger the next pass, which makes the next batch.
    let missing = want_active - keep.len();
    let batch = missing.min(CREATE_PER_PASS);
    // `failed` never drops and is above every failed pod's attempt (see `failures`), so a new
    // attempt never reuses a number whose failure would restart it again at once.
    let attempt = failed;
    if spec.indexed() {
        // The free indexes, lowest first, as a lazy range: never a list of every index.
        let busy: BTreeSet<i32> = keep.iter().filter_map(|p| p.index).collect();
        out.create.extend(
            (0..want_completions.min(MAX_INDEXES))
                .filter(|i| !succeeded_indexes.contains(i) && !busy.contains(i))
                .take(batch)
                .map(|i| NewPod { index: Some(i), attempt }),
        );
    } else {
        out.create.extend((0..batch).map(|_| NewPod { index: None, attempt }));
    }
    out.more_to_create = missing > out.create.len() && out.create.len() == CREATE_PER_PASS;
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
            finalizers: tmeta.finalizers,
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

#[cfg(test)]
mod tests;

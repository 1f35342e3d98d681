//! PURE: JobSet-style semantics for a MusterJobSet. From the spec, the last status and the
//! child MusterJobs observed, decide which children to create and delete, and the new status.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use k8s_openapi::jiff::Timestamp;

use super::job::MIRRORED_CONDITIONS;
use crate::conditions;
use crate::workloadbuilder::job::child_job_name;
use crate::workloadbuilder::native::SchedulingApi;
use muster_api::batch::{
    JobPhase, JobSetPhase, MusterJob, MusterJobSet, MusterJobSetSpec, MusterJobSetStatus, MusterJobSpec,
    ReplicatedJobStatus, SuccessOperator,
};
use muster_api::{
    GROUP_TEMPLATE_ANNOTATION, JOBSET_NAME_LABEL, PARENT_COMPOSITE_ANNOTATION, REPLICATED_JOB_LABEL,
    SCHEDULING_API_ANNOTATION,
};

/// Child annotation: the restart attempt it was created in.
pub const RESTART_ATTEMPT_ANNOTATION: &str = "batch.muster.dev/restart-attempt";
/// The most children one reconcile of a set creates: the rest follow on the next passes (the
/// children made trigger them), so a set's children in memory are those that exist plus one
/// batch.
pub const CREATE_PER_PASS: usize = 100;

/// Condition types of a MusterJobSet.
pub mod condition {
    /// The success policy is met.
    pub const COMPLETED: &str = "Completed";
    /// A child failed after `maxRestarts` restarts.
    pub const FAILED: &str = "Failed";
    /// `spec.suspend` is true.
    pub const SUSPENDED: &str = "Suspended";
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
    /// Every wanted pod is ready.
    pub ready: bool,
    /// `spec.suspend` of the child.
    pub suspended: bool,
    /// `spec.parallelism` of the child.
    pub parallelism: i32,
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
        Self {
            name: meta.name.clone().unwrap_or_default(),
            replicated_job: meta.labels.as_ref().and_then(|l| l.get(REPLICATED_JOB_LABEL)).cloned().unwrap_or_default(),
            attempt: get(RESTART_ATTEMPT_ANNOTATION).and_then(|v| v.parse().ok()).unwrap_or(0),
            phase: status.and_then(|s| s.phase),
            terminating: meta.deletion_timestamp.is_some(),
            ready: status.is_some_and(|s| s.ready >= job.spec.parallelism.max(1) && s.active > 0),
            suspended: job.spec.suspend,
            parallelism: job.spec.parallelism,
            min_count: min_count(&job.spec),
            scheduling: status
                .map(|s| {
                    s.conditions.iter().filter(|c| MIRRORED_CONDITIONS.contains(&c.type_.as_str())).cloned().collect()
                })
                .unwrap_or_default(),
        }
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
    pub events: Vec<(bool, &'static str, String)>,
    /// The status to write.
    pub status: MusterJobSetStatus,
}

fn targets(spec: &MusterJobSetSpec) -> BTreeSet<&str> {
    let listed = spec.success_policy.as_ref().map(|s| &s.target_replicated_jobs).filter(|t| !t.is_empty());
    match listed {
        Some(t) => t.iter().map(String::as_str).collect(),
        None => spec.replicated_jobs.iter().map(|r| r.name.as_str()).collect(),
    }
}

/// Decides the next step of a set.
pub fn plan(set: &MusterJobSet, children: &[ObservedChild], now: Timestamp) -> SetPlan {
    let spec = &set.spec;
    let generation = set.metadata.generation;
    let prev = set.status.clone().unwrap_or_default();
    let mut status = MusterJobSetStatus {
        restarts: prev.restarts,
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
        status: MusterJobSetStatus::default(),
    };
    conditions::set(&mut status.conditions, condition::INVALID, false, "Valid", "", generation, now);

    // Children of an older attempt go first; their names are reused by the new attempt.
    let (current, stale): (Vec<&ObservedChild>, Vec<&ObservedChild>) =
        children.iter().partition(|c| c.attempt == status.restarts);
    for c in stale.iter().filter(|c| !c.terminating) {
        out.delete.push((c.name.clone(), "Restart"));
    }
    let live: Vec<&ObservedChild> = current.into_iter().filter(|c| !c.terminating).collect();
    let finished =
        [condition::COMPLETED, condition::FAILED].into_iter().find(|c| conditions::is_true(&status.conditions, c));
    let is_active = |c: &ObservedChild| !matches!(c.phase, Some(JobPhase::Complete) | Some(JobPhase::Failed));

    if finished.is_none() {
        let failed: Vec<&&ObservedChild> = live.iter().filter(|c| c.phase == Some(JobPhase::Failed)).collect();
        let max_restarts = spec.failure_policy.as_ref().map(|f| f.max_restarts).unwrap_or(0);
        let target = targets(spec);
        let wanted =
            |name: &str| spec.replicated_jobs.iter().find(|r| r.name == name).map(|r| r.replicas.max(0)).unwrap_or(0);
        let complete_in = |rjob: &str| {
            live.iter().filter(|c| c.replicated_job == rjob && c.phase == Some(JobPhase::Complete)).count() as i32
        };
        let success = match spec.success_policy.as_ref().map(|s| s.operator).unwrap_or_default() {
            SuccessOperator::All => target.iter().all(|r| complete_in(r) >= wanted(r)),
            SuccessOperator::Any => target.iter().any(|r| complete_in(r) > 0),
        };
        if let Some(first) = failed.first() {
            if status.restarts < max_restarts {
                status.restarts += 1;
                for c in &live {
                    out.delete.push((c.name.clone(), "Restart"));
                }
                out.events.push((
                    true,
                    "Restarting",
                    format!(
                        "child {} failed; recreating all children (restart {}/{max_restarts})",
                        first.name, status.restarts
                    ),
                ));
            } else {
                let msg =
                    format!("child {} failed and the set has no restarts left ({max_restarts} allowed)", first.name);
                conditions::set(&mut status.conditions, condition::FAILED, true, "FailedJobs", &msg, generation, now);
                out.events.push((true, "FailedJobs", msg));
            }
        } else if success {
            let msg = format!(
                "success policy {:?} met",
                spec.success_policy.as_ref().map(|s| s.operator).unwrap_or_default()
            );
            conditions::set(
                &mut status.conditions,
                condition::COMPLETED,
                true,
                "AllJobsCompleted",
                &msg,
                generation,
                now,
            );
            out.events.push((false, "Completed", msg));
        }
    }
    let finished =
        [condition::COMPLETED, condition::FAILED].into_iter().find(|c| conditions::is_true(&status.conditions, c));
    let restarting = status.restarts != prev.restarts;
    if finished.is_some() {
        for c in live.iter().filter(|c| is_active(c)) {
            out.delete.push((c.name.clone(), "SetFinished"));
        }
    } else if !restarting {
        let taken: BTreeSet<&str> = children.iter().map(|c| c.name.as_str()).collect();
        let set_name = set.metadata.name.as_deref().unwrap_or_default();
        // The missing children, in order, one batch of them: a lazy walk over the replicas
        // that stops at the first child past the batch (never a list of every replica).
        let mut missing = spec.replicated_jobs.iter().enumerate().flat_map(|(r, rjob)| {
            (0..rjob.replicas.max(0))
                .filter(|i| !taken.contains(child_job_name(set_name, &rjob.name, *i).as_str()))
                .map(move |i| (r, i))
        });
        out.create.extend(missing.by_ref().take(CREATE_PER_PASS));
        out.more_to_create = missing.next().is_some();
        for c in &live {
            let want = spec.suspend
                || spec
                    .replicated_jobs
                    .iter()
                    .find(|r| r.name == c.replicated_job)
                    .is_some_and(|r| r.template.spec.suspend);
            if c.suspended != want && is_active(c) {
                out.suspend.push((c.name.clone(), want));
            }
            let template = spec.replicated_jobs.iter().find(|r| r.name == c.replicated_job).map(|r| &r.template.spec);
            if let Some(t) = template
                && is_active(c)
                && (c.parallelism, c.min_count) != (t.parallelism, min_count(t))
            {
                out.resize.push(Resize {
                    child: c.name.clone(),
                    parallelism: t.parallelism,
                    min_count: min_count(t),
                    gang: t
                        .scheduling
                        .as_ref()
                        .and_then(|s| s.scheduling_policy.as_ref())
                        .is_some_and(|p| p.gang.is_some()),
                });
            }
        }
        let was = conditions::is_true(&status.conditions, condition::SUSPENDED);
        if spec.suspend != was {
            let (reason, msg) = if spec.suspend {
                ("JobSetSuspended", "the set is suspended")
            } else {
                ("JobSetResumed", "the set was resumed")
            };
            conditions::set(&mut status.conditions, condition::SUSPENDED, spec.suspend, reason, msg, generation, now);
        }
    }

    let deleting: BTreeSet<&str> = out.delete.iter().map(|(n, _)| n.as_str()).collect();
    let mut per_rjob: BTreeMap<&str, ReplicatedJobStatus> = spec
        .replicated_jobs
        .iter()
        .map(|r| (r.name.as_str(), ReplicatedJobStatus { name: r.name.clone(), ..Default::default() }))
        .collect();
    for c in live.iter().filter(|c| !deleting.contains(c.name.as_str())) {
        if let Some(s) = per_rjob.get_mut(c.replicated_job.as_str()) {
            match c.phase {
                Some(JobPhase::Complete) => s.succeeded += 1,
                Some(JobPhase::Failed) => s.failed += 1,
                Some(JobPhase::Suspended) => s.suspended += 1,
                _ => s.active += 1,
            }
            if c.ready {
                s.ready += 1;
            }
        }
    }
    let total = spec.replicated_jobs.iter().map(|r| r.replicas.max(0)).fold(0i32, i32::saturating_add);
    let done = per_rjob.values().map(|s| s.succeeded).fold(0i32, i32::saturating_add);
    status.progress = Some(format!("{done}/{total}"));
    status.replicated_jobs_status = per_rjob.into_values().collect();
    status.phase = Some(if conditions::is_true(&status.conditions, condition::COMPLETED) {
        JobSetPhase::Completed
    } else if conditions::is_true(&status.conditions, condition::FAILED) {
        JobSetPhase::Failed
    } else if spec.suspend {
        JobSetPhase::Suspended
    } else if live.iter().any(|c| c.phase == Some(JobPhase::Running)) {
        JobSetPhase::Running
    } else {
        JobSetPhase::Pending
    });
    out.status = status;
    out
}

/// The child MusterJob `i` of replicatedJob `r`, for restart attempt `attempt`, in the set's
/// scheduling API (`api`, stamped on it: the whole tree is in one API).
///
/// The child runs its template's spec as written. Only Indexed pods get a hostname, so only
/// they are addressable as `<set>-<rjob>-<i>-<index>.<set>` through the set's headless Service;
/// upstream JobSet defaults its Jobs to Indexed when the mode is unset, but here the CRD
/// defaults `completionMode` to `NonIndexed` and an unset mode cannot be told from a chosen
/// one, so muster does not override it: templates that want per-pod DNS names say `Indexed`.
pub fn child_job(set: &MusterJobSet, r: usize, i: i32, attempt: i32, api: SchedulingApi) -> Option<MusterJob> {
    let rjob = set.spec.replicated_jobs.get(r)?;
    let set_name = set.metadata.name.clone().unwrap_or_default();
    let meta = rjob.template.metadata.clone().unwrap_or_default();
    // muster's own keys on a child come from muster alone (the webhook refuses a template's).
    let own = |k: &String| crate::workloadbuilder::field::is_muster_key(k);
    let mut labels = meta.labels;
    labels.retain(|k, _| !own(k));
    labels.insert(JOBSET_NAME_LABEL.into(), set_name.clone());
    labels.insert(REPLICATED_JOB_LABEL.into(), rjob.name.clone());
    let mut annotations = meta.annotations;
    annotations.retain(|k, _| !own(k));
    annotations.insert(RESTART_ATTEMPT_ANNOTATION.into(), attempt.to_string());
    annotations.insert(SCHEDULING_API_ANNOTATION.into(), api.as_str().into());
    if set.spec.scheduling.is_some() {
        annotations.insert(GROUP_TEMPLATE_ANNOTATION.into(), rjob.name.clone());
        annotations.insert(PARENT_COMPOSITE_ANNOTATION.into(), set_name.clone());
    }
    let mut spec = rjob.template.spec.clone();
    spec.suspend = spec.suspend || set.spec.suspend;
    Some(MusterJob {
        metadata: ObjectMeta {
            name: Some(child_job_name(&set_name, &rjob.name, i)),
            namespace: set.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: crate::owners::controller_ref(set).map(|o| vec![o]),
            ..Default::default()
        },
        spec,
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use muster_api::batch::CompletionMode;
    use muster_api::batch::{FailurePolicy, SuccessPolicy};

    fn set(scheduling: bool, rjobs: &[(&str, i32)]) -> MusterJobSet {
        let rj: Vec<serde_json::Value> = rjobs
            .iter()
            .map(|(n, r)| serde_json::json!({"name": n, "replicas": r, "template": {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}}}))
            .collect();
        let mut spec = serde_json::json!({"replicatedJobs": rj});
        if scheduling {
            spec["scheduling"] = serde_json::json!({"schedulingPolicy": {"gang": {}}});
        }
        let mut s: MusterJobSet = serde_json::from_value(serde_json::json!({
            "apiVersion": "batch.muster.dev/v1alpha1", "kind": "MusterJobSet",
            "metadata": {"name": "s", "namespace": "ns", "uid": "u1", "generation": 1}, "spec": spec}))
        .expect("fixture");
        s.status = Some(MusterJobSetStatus::default());
        s
    }

    fn child(name: &str, rjob: &str, phase: Option<JobPhase>, attempt: i32) -> ObservedChild {
        ObservedChild {
            name: name.into(),
            replicated_job: rjob.into(),
            attempt,
            phase,
            terminating: false,
            ready: false,
            suspended: false,
            parallelism: 1,
            min_count: None,
            scheduling: Vec::new(),
        }
    }

    fn now() -> Timestamp {
        Timestamp::from_second(1_000).expect("ts")
    }

    #[test]
    fn creates_every_missing_child() {
        let p = plan(&set(true, &[("driver", 1), ("workers", 2)]), &[child("s-workers-0", "workers", None, 0)], now());
        assert_eq!(p.create, vec![(0, 0), (1, 1)]);
        assert_eq!(p.status.progress.as_deref(), Some("0/3"));
    }

    #[test]
    fn completes_when_every_child_completes() {
        let s = set(true, &[("a", 1), ("b", 1)]);
        let kids = [child("s-a-0", "a", Some(JobPhase::Complete), 0), child("s-b-0", "b", Some(JobPhase::Complete), 0)];
        let p = plan(&s, &kids, now());
        assert!(conditions::is_true(&p.status.conditions, condition::COMPLETED));
        assert_eq!(p.status.phase, Some(JobSetPhase::Completed));
        assert_eq!(p.status.progress.as_deref(), Some("2/2"));
    }

    #[test]
    fn success_policy_any_on_targets() {
        let mut s = set(false, &[("a", 2), ("b", 1)]);
        s.spec.success_policy =
            Some(SuccessPolicy { operator: SuccessOperator::Any, target_replicated_jobs: vec!["b".into()] });
        let kids = [child("s-a-0", "a", Some(JobPhase::Complete), 0), child("s-b-0", "b", Some(JobPhase::Running), 0)];
        assert!(!conditions::is_true(&plan(&s, &kids, now()).status.conditions, condition::COMPLETED));
        let kids = [child("s-a-0", "a", Some(JobPhase::Running), 0), child("s-b-0", "b", Some(JobPhase::Complete), 0)];
        let p = plan(&s, &kids, now());
        assert!(conditions::is_true(&p.status.conditions, condition::COMPLETED));
        assert_eq!(p.delete, vec![("s-a-0".to_string(), "SetFinished")]);
    }

    #[test]
    fn a_failed_child_restarts_all_children_until_max_restarts() {
        let mut s = set(true, &[("a", 1), ("b", 1)]);
        s.spec.failure_policy = Some(FailurePolicy { max_restarts: 1, ..Default::default() });
        let kids = [child("s-a-0", "a", Some(JobPhase::Failed), 0), child("s-b-0", "b", Some(JobPhase::Running), 0)];
        let p = plan(&s, &kids, now());
        assert_eq!(p.status.restarts, 1);
        assert_eq!(p.delete.len(), 2);
        assert!(p.create.is_empty(), "new children wait for the old names to be free");
        // Next round: old children gone; the new attempt is created.
        s.status = Some(p.status.clone());
        let p = plan(&s, &[], now());
        assert_eq!(p.create, vec![(0, 0), (1, 0)]);
        assert_eq!(
            child_job(&s, 0, 0, p.status.restarts, SchedulingApi::Muster)
                .and_then(|j| j.metadata.annotations)
                .and_then(|a| a.get(RESTART_ATTEMPT_ANNOTATION).cloned())
                .as_deref(),
            Some("1")
        );
        // A failure in the last attempt fails the set.
        let kids = [child("s-a-0", "a", Some(JobPhase::Failed), 1), child("s-b-0", "b", Some(JobPhase::Running), 1)];
        let p = plan(&s, &kids, now());
        assert!(conditions::is_true(&p.status.conditions, condition::FAILED));
        assert_eq!(p.delete, vec![("s-b-0".to_string(), "SetFinished")]);
        assert_eq!(p.status.phase, Some(JobSetPhase::Failed));
    }

    #[test]
    fn stale_children_are_deleted_before_recreation() {
        let mut s = set(false, &[("a", 1)]);
        s.status = Some(MusterJobSetStatus { restarts: 1, ..Default::default() });
        let mut old = child("s-a-0", "a", Some(JobPhase::Running), 0);
        let p = plan(&s, std::slice::from_ref(&old), now());
        assert_eq!(p.delete, vec![("s-a-0".to_string(), "Restart")]);
        assert!(p.create.is_empty());
        old.terminating = true;
        let p = plan(&s, &[old], now());
        assert!(p.delete.is_empty() && p.create.is_empty(), "wait until the old child is gone");
    }

    #[test]
    fn suspend_flows_to_children() {
        let mut s = set(false, &[("a", 1)]);
        s.spec.suspend = true;
        let p = plan(&s, &[child("s-a-0", "a", Some(JobPhase::Running), 0)], now());
        assert_eq!(p.suspend, vec![("s-a-0".to_string(), true)]);
        assert!(conditions::is_true(&p.status.conditions, condition::SUSPENDED));
        assert_eq!(p.status.phase, Some(JobSetPhase::Suspended));
    }

    #[test]
    fn children_are_annotated_for_delegation_only_with_scheduling() {
        let with = child_job(&set(true, &[("workers", 2)]), 0, 1, 0, SchedulingApi::Muster).expect("child");
        assert_eq!(with.metadata.name.as_deref(), Some("s-workers-1"));
        let a = with.metadata.annotations.expect("annotations");
        assert_eq!(a.get(GROUP_TEMPLATE_ANNOTATION).map(String::as_str), Some("workers"));
        assert_eq!(a.get(PARENT_COMPOSITE_ANNOTATION).map(String::as_str), Some("s"));
        assert_eq!(with.metadata.labels.expect("labels").get(JOBSET_NAME_LABEL).map(String::as_str), Some("s"));
        let without = child_job(&set(false, &[("workers", 2)]), 0, 0, 0, SchedulingApi::Muster).expect("child");
        assert!(!without.metadata.annotations.expect("annotations").contains_key(GROUP_TEMPLATE_ANNOTATION));
        // Every child is stamped with the set's scheduling API.
        for api in [SchedulingApi::Muster, SchedulingApi::Upstream] {
            for scheduling in [true, false] {
                let child = child_job(&set(scheduling, &[("workers", 2)]), 0, 0, 0, api).expect("child");
                let a = child.metadata.annotations.expect("annotations");
                assert_eq!(a.get(SCHEDULING_API_ANNOTATION).map(String::as_str), Some(api.as_str()));
            }
        }
    }

    fn cond(type_: &str, status: &str, reason: &str, message: &str, at: i64) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                Timestamp::from_second(at).expect("ts"),
            ),
            observed_generation: None,
        }
    }

    fn judged(name: &str, attempt: i32, conditions: Vec<Condition>) -> ObservedChild {
        ObservedChild { scheduling: conditions, ..child(name, "r", Some(JobPhase::Running), attempt) }
    }

    #[test]
    fn a_sets_composite_condition_is_its_own_or_what_every_child_says() {
        const PG: &str = "PodGroupInitiallyScheduled";
        let scheduled = |at| cond(PG, "True", "Scheduled", "", at);
        let unschedulable = cond(PG, "False", "Unschedulable", "0/4 placements fit", 5);
        let shown = |out: &[Condition]| -> Vec<(String, String, String, String)> {
            out.iter().map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone(), c.message.clone())).collect()
        };
        let row = |t: &str, st: &str, r: &str, m: &str| (t.to_string(), st.to_string(), r.to_string(), m.to_string());
        // Every child scheduled: scheduled, at the latest child's transition.
        let both = [judged("s-a-0", 0, vec![scheduled(10)]), judged("s-b-0", 0, vec![scheduled(20)])];
        let out = composite_conditions(&[], &both, 0);
        assert_eq!(
            shown(&out),
            [row(condition::COMPOSITE_SCHEDULED, "True", "Scheduled", "every child PodGroup is scheduled (2)")]
        );
        assert_eq!(out[0].last_transition_time.0.as_second(), 20);
        // One not scheduled: the set is not, with that child's reason and message, named.
        let one = [judged("s-a-0", 0, vec![scheduled(10)]), judged("s-b-0", 0, vec![unschedulable.clone()])];
        assert_eq!(
            shown(&composite_conditions(&[], &one, 0)),
            [row(condition::COMPOSITE_SCHEDULED, "False", "Unschedulable", "child PodGroup s-b-0: 0/4 placements fit")]
        );
        // A child without a verdict yet: nothing to say. No children: nothing either.
        let partial = [judged("s-a-0", 0, vec![scheduled(10)]), judged("s-b-0", 0, vec![])];
        assert!(composite_conditions(&[], &partial, 0).is_empty());
        assert!(composite_conditions(&[], &[], 0).is_empty());
        // Children of an older attempt, or being deleted, do not count.
        let mut going = judged("s-b-0", 0, vec![unschedulable.clone()]);
        going.terminating = true;
        let stale = [judged("s-a-0", 1, vec![scheduled(30)]), judged("s-b-0", 0, vec![unschedulable.clone()]), going];
        assert_eq!(shown(&composite_conditions(&[], &stale, 1))[0].1, "True");
        // The group's own verdict wins when kube-scheduler wrote one.
        let own = [cond(condition::COMPOSITE_SCHEDULED, "False", "Invalid", "cycle", 1)];
        assert_eq!(
            shown(&composite_conditions(&own, &both, 0)),
            [row(condition::COMPOSITE_SCHEDULED, "False", "Invalid", "cycle")]
        );
        // A disrupted child makes the set a disruption target; other condition types stay out.
        let disrupted = cond(condition::DISRUPTION_TARGET, "True", "PreemptionByScheduler", "preempted", 40);
        let kids = [judged("s-a-0", 0, vec![scheduled(10), disrupted]), judged("s-b-0", 0, vec![scheduled(10)])];
        let out = shown(&composite_conditions(&[cond("Other", "True", "X", "", 1)], &kids, 0));
        assert_eq!(
            out,
            [
                row(condition::COMPOSITE_SCHEDULED, "True", "Scheduled", "every child PodGroup is scheduled (2)"),
                row(condition::DISRUPTION_TARGET, "True", "PreemptionByScheduler", "child PodGroup s-a-0: preempted"),
            ]
        );
    }

    #[test]
    fn children_keep_the_completion_mode_of_their_template() {
        let mut s = set(true, &[("driver", 1), ("workers", 2)]);
        s.spec.replicated_jobs[0].template.spec.completions = Some(1);
        s.spec.replicated_jobs[0].template.spec.completion_mode = Some(CompletionMode::Indexed);
        let mode = |r: usize| child_job(&s, r, 0, 0, SchedulingApi::Muster).expect("child").spec.completion_mode;
        assert_eq!(mode(0), Some(CompletionMode::Indexed));
        assert_eq!(mode(1), None);
        let driver = child_job(&s, 0, 0, 0, SchedulingApi::Muster).expect("child");
        assert_eq!(driver.spec.completions, Some(1), "nothing else of the template changes");
        assert_eq!(driver.metadata.name.as_deref(), Some("s-driver-0"));
    }

    #[test]
    fn children_follow_parallelism_and_min_count_of_their_template() {
        let mut s = set(true, &[("a", 2), ("b", 1)]);
        s.spec.replicated_jobs[0].template.spec.parallelism = 3;
        s.spec.replicated_jobs[0].template.spec.scheduling = Some(muster_api::blocks::PodGroupScheduling {
            scheduling_policy: Some(muster_api::blocks::PodGroupSchedulingPolicy::gang(Some(2))),
            ..Default::default()
        });
        let mut current = child("s-a-1", "a", Some(JobPhase::Running), 0);
        (current.parallelism, current.min_count) = (3, Some(2));
        let kids = [
            child("s-a-0", "a", Some(JobPhase::Running), 0),
            current,
            child("s-b-0", "b", Some(JobPhase::Running), 0),
            child("s-a-2", "a", Some(JobPhase::Complete), 0),
        ];
        let p = plan(&s, &kids, now());
        assert_eq!(
            p.resize,
            vec![Resize { child: "s-a-0".into(), parallelism: 3, min_count: Some(2), gang: true }],
            "only active children that differ"
        );
    }

    #[test]
    fn per_replicated_job_counts() {
        let s = set(false, &[("a", 3)]);
        let mut ready = child("s-a-1", "a", Some(JobPhase::Running), 0);
        ready.ready = true;
        let kids =
            [child("s-a-0", "a", Some(JobPhase::Complete), 0), ready, child("s-a-2", "a", Some(JobPhase::Pending), 0)];
        let p = plan(&s, &kids, now());
        let r = &p.status.replicated_jobs_status[0];
        assert_eq!((r.succeeded, r.active, r.ready, r.failed), (1, 2, 1, 0));
        assert_eq!(p.status.phase, Some(JobSetPhase::Running));
    }

    #[test]
    fn children_are_created_one_batch_per_pass() {
        let s = set(false, &[("a", 150), ("b", 100)]);
        let mut kids: Vec<ObservedChild> = Vec::new();
        let mut batches = Vec::new();
        loop {
            let p = plan(&s, &kids, now());
            if p.create.is_empty() {
                assert!(!p.more_to_create);
                break;
            }
            batches.push((p.create.len(), p.more_to_create));
            for (r, i) in p.create {
                let rjob = &s.spec.replicated_jobs[r].name;
                kids.push(child(&child_job_name("s", rjob, i), rjob, None, 0));
            }
        }
        assert_eq!(batches, vec![(100, true), (100, true), (50, false)]);
        let names: BTreeSet<&str> = kids.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(names.len(), 250, "each child once");
    }

    #[test]
    fn a_set_of_billions_of_children_plans_one_batch_and_counts_without_overflow() {
        // Never planned by the controller (it is Invalid); were it, one batch and no panic.
        let s = set(false, &[("a", i32::MAX), ("b", i32::MAX), ("c", i32::MAX)]);
        let p = plan(&s, &[], now());
        assert_eq!((p.create.len(), p.more_to_create), (CREATE_PER_PASS, true));
        assert_eq!(p.create.last(), Some(&(0, CREATE_PER_PASS as i32 - 1)));
        assert_eq!(p.status.progress, Some(format!("0/{}", i32::MAX)));
    }

    #[test]
    fn a_childs_metadata_never_carries_musters_keys_from_the_template() {
        let mut s = set(true, &[("a", 1)]);
        s.spec.replicated_jobs[0].template.metadata = Some(
            serde_json::from_value(serde_json::json!({
                "labels": {"batch.muster.dev/jobset-name": "victim", "team": "a"},
                "annotations": {"scheduling.muster.dev/parent-composite-podgroup": "victim",
                                "batch.muster.dev/restart-attempt": "9", "note": "kept"},
            }))
            .expect("metadata"),
        );
        let c = child_job(&s, 0, 0, 2, SchedulingApi::Muster).expect("child");
        let labels = c.metadata.labels.expect("labels");
        assert_eq!(labels.get(JOBSET_NAME_LABEL).map(String::as_str), Some("s"));
        assert_eq!(labels.get("team").map(String::as_str), Some("a"));
        let annotations = c.metadata.annotations.expect("annotations");
        assert_eq!(annotations.get(PARENT_COMPOSITE_ANNOTATION).map(String::as_str), Some("s"));
        assert_eq!(annotations.get(RESTART_ATTEMPT_ANNOTATION).map(String::as_str), Some("2"));
        assert_eq!(annotations.get("note").map(String::as_str), Some("kept"));
        // Without scheduling, no delegation annotation at all, whatever the template said.
        s.spec.scheduling = None;
        let c = child_job(&s, 0, 0, 0, SchedulingApi::Muster).expect("child");
        assert!(!c.metadata.annotations.expect("annotations").contains_key(PARENT_COMPOSITE_ANNOTATION));
    }

    fn arb_count() -> impl proptest::strategy::Strategy<Value = i32> {
        use proptest::prelude::*;
        prop_oneof![any::<i32>(), -2..=3i32, Just(i32::MAX), Just(i32::MIN), Just(50_000_000)]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 256, ..Default::default() })]

        #[test]
        fn any_replicas_plan_one_bounded_batch_without_panic(
            replicas in proptest::collection::vec(arb_count(), 1..6),
            scheduled in proptest::prelude::any::<bool>(),
            existing in proptest::collection::vec((0usize..6, 0i32..5, proptest::option::of(0u8..4), 0i32..2), 0..10),
        ) {
            let names: Vec<String> = (0..replicas.len()).map(|i| format!("r{i}")).collect();
            let rjobs: Vec<(&str, i32)> = names.iter().map(String::as_str).zip(replicas.iter().copied()).collect();
            let s = set(scheduled, &rjobs);
            let phases = [JobPhase::Pending, JobPhase::Running, JobPhase::Complete, JobPhase::Failed];
            let kids: Vec<ObservedChild> = existing
                .iter()
                .filter(|(r, ..)| *r < names.len())
                .map(|(r, i, phase, attempt)| {
                    child(&child_job_name("s", &names[*r], *i), &names[*r], phase.map(|p| phases[p as usize]), *attempt)
                })
                .collect();
            let p = plan(&s, &kids, now());
            proptest::prop_assert!(p.create.len() <= CREATE_PER_PASS);
            proptest::prop_assert!(!p.more_to_create || p.create.len() == CREATE_PER_PASS);
            for (r, i) in &p.create {
                proptest::prop_assert!(*r < names.len() && *i >= 0 && *i < replicas[*r]);
                let name = child_job_name("s", &names[*r], *i);
                proptest::prop_assert!(!kids.iter().any(|k| k.name == name), "{} exists", name);
            }
        }
    }
}

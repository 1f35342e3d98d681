//! Table tests of the job logic, one per batch/v1 rule muster keeps.

use super::*;
use crate::crds::batch::MusterJobSpec;

fn spec(parallelism: i32, completions: Option<i32>, mode: CompletionMode) -> MusterJobSpec {
    let mut s: MusterJobSpec = serde_json::from_value(serde_json::json!({
        "parallelism": parallelism,
        "template": {"spec": {"containers": [{"name": "c", "image": "busybox",
            "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}},
    }))
    .expect("fixture");
    s.completions = completions;
    s.completion_mode = mode;
    s
}

fn pod(name: &str, phase: Phase, index: Option<i32>) -> ObservedPod {
    ObservedPod {
        name: name.into(),
        phase,
        index,
        attempt: 0,
        terminating: false,
        ready: phase == Phase::Running,
        gated: false,
    }
}

fn now() -> Timestamp {
    Timestamp::from_second(1_000_000).expect("ts")
}

fn run(s: &MusterJobSpec, pods: &[ObservedPod]) -> JobPlan {
    plan(s, Some(1), &MusterJobStatus::default(), pods, false, now())
}

#[test]
fn creates_parallelism_pods_at_start() {
    let p = run(&spec(3, Some(5), CompletionMode::NonIndexed), &[]);
    assert_eq!(p.create.len(), 3);
    assert!(p.delete.is_empty());
    assert_eq!(p.status.active, 3);
    assert_eq!(p.status.start_time, Some(Time(now())));
    assert_eq!(p.status.phase, Some(JobPhase::Pending));
}

#[test]
fn indexed_creates_lowest_missing_indexes() {
    let pods = [pod("a", Phase::Succeeded, Some(0)), pod("b", Phase::Running, Some(1))];
    let p = run(&spec(2, Some(4), CompletionMode::Indexed), &pods);
    assert_eq!(p.create, vec![NewPod { index: Some(2), attempt: 0 }]);
    assert_eq!(p.status.completed_indexes.as_deref(), Some("0"));
    assert_eq!(p.status.phase, Some(JobPhase::Running));
}

#[test]
fn never_more_active_than_remaining_completions() {
    let pods = [pod("a", Phase::Succeeded, None), pod("b", Phase::Succeeded, None), pod("c", Phase::Running, None)];
    let p = run(&spec(3, Some(3), CompletionMode::NonIndexed), &pods);
    assert!(p.create.is_empty());
    assert!(p.delete.is_empty());
    assert_eq!(p.status.progress.as_deref(), Some("2/3"));
}

#[test]
fn completes_when_completions_succeed_and_stops_the_rest() {
    let pods = [pod("a", Phase::Succeeded, None), pod("b", Phase::Succeeded, None), pod("c", Phase::Running, None)];
    let p = run(&spec(3, Some(2), CompletionMode::NonIndexed), &pods);
    assert_eq!(p.finished.as_ref().map(|f| f.condition), Some(condition::COMPLETE));
    assert_eq!(p.delete, vec![("c".to_string(), "JobComplete")]);
    assert_eq!(p.status.phase, Some(JobPhase::Complete));
    assert_eq!(p.status.completion_time, Some(Time(now())));
    assert!(conditions::is_true(&p.status.conditions, condition::COMPLETE));
}

#[test]
fn indexed_completes_only_when_every_index_succeeded() {
    let pods = [pod("a", Phase::Succeeded, Some(0)), pod("b", Phase::Succeeded, Some(0))];
    let p = run(&spec(2, Some(2), CompletionMode::Indexed), &pods);
    assert!(p.finished.is_none());
    assert_eq!(p.create, vec![NewPod { index: Some(1), attempt: 0 }]);
}

#[test]
fn failed_pods_are_replaced_until_the_backoff_limit() {
    let mut s = spec(1, Some(1), CompletionMode::NonIndexed);
    s.backoff_limit = 1;
    let p = run(&s, &[pod("a", Phase::Failed, None)]);
    assert_eq!(p.create.len(), 1);
    assert_eq!(p.create[0].attempt, 1);
    let p = run(&s, &[pod("a", Phase::Failed, None), pod("b", Phase::Failed, None)]);
    assert!(p.create.is_empty());
    let f = p.finished.expect("failed");
    assert_eq!((f.condition, f.reason), (condition::FAILED, "BackoffLimitExceeded"));
    assert_eq!(p.status.phase, Some(JobPhase::Failed));
    assert_eq!(p.status.failed, 2);
}

#[test]
fn deadline_fails_the_job() {
    let mut s = spec(1, Some(1), CompletionMode::NonIndexed);
    s.active_deadline_seconds = Some(10);
    let prev = MusterJobStatus {
        start_time: Some(Time(Timestamp::from_second(now().as_second() - 11).expect("ts"))),
        ..Default::default()
    };
    let p = plan(&s, None, &prev, &[pod("a", Phase::Running, None)], false, now());
    assert_eq!(p.finished.map(|f| f.reason), Some("DeadlineExceeded"));
    assert_eq!(p.delete, vec![("a".to_string(), "DeadlineExceeded")]);
}

#[test]
fn deadline_requeues_until_due() {
    let mut s = spec(1, Some(1), CompletionMode::NonIndexed);
    s.active_deadline_seconds = Some(10);
    let prev = MusterJobStatus {
        start_time: Some(Time(Timestamp::from_second(now().as_second() - 4).expect("ts"))),
        ..Default::default()
    };
    let p = plan(&s, None, &prev, &[pod("a", Phase::Running, None)], false, now());
    assert!(p.finished.is_none());
    assert_eq!(p.requeue_after, Some(6));
}

#[test]
fn suspend_deletes_active_pods_and_sets_the_condition() {
    let mut s = spec(2, Some(2), CompletionMode::NonIndexed);
    s.suspend = true;
    let p = run(&s, &[pod("a", Phase::Running, None), pod("b", Phase::Succeeded, None)]);
    assert_eq!(p.delete, vec![("a".to_string(), "JobSuspended")]);
    assert!(p.create.is_empty());
    assert!(conditions::is_true(&p.status.conditions, condition::SUSPENDED));
    assert_eq!(p.status.phase, Some(JobPhase::Suspended));
    s.suspend = false;
    let resumed = plan(&s, None, &p.status, &[pod("b", Phase::Succeeded, None)], false, now());
    assert_eq!(resumed.create.len(), 1);
    assert!(!conditions::is_true(&resumed.status.conditions, condition::SUSPENDED));
}

#[test]
fn lowering_parallelism_deletes_gated_pods_first() {
    let mut gated = pod("g", Phase::Pending, Some(2));
    gated.gated = true;
    let pods = [pod("r0", Phase::Running, Some(0)), pod("r1", Phase::Running, Some(1)), gated];
    let p = run(&spec(2, Some(3), CompletionMode::Indexed), &pods);
    assert_eq!(p.delete, vec![("g".to_string(), "TooManyActive")]);
}

#[test]
fn disruption_mode_all_restarts_the_whole_attempt() {
    let s = spec(3, Some(3), CompletionMode::Indexed);
    let pods = [pod("a", Phase::Failed, Some(0)), pod("b", Phase::Running, Some(1)), pod("c", Phase::Running, Some(2))];
    let p = plan(&s, None, &MusterJobStatus::default(), &pods, true, now());
    assert_eq!(p.delete, vec![("b".to_string(), "GangRestart"), ("c".to_string(), "GangRestart")]);
    assert!(p.create.is_empty(), "the next attempt waits until the old one is gone");
    // Once they are gone, the next attempt is created whole.
    let p = plan(&s, None, &MusterJobStatus::default(), &pods[..1], true, now());
    assert_eq!(p.create, (0..3).map(|i| NewPod { index: Some(i), attempt: 1 }).collect::<Vec<_>>());
}

#[test]
fn disruption_mode_single_replaces_only_the_failed_pod() {
    let s = spec(3, Some(3), CompletionMode::Indexed);
    let pods = [pod("a", Phase::Failed, Some(0)), pod("b", Phase::Running, Some(1)), pod("c", Phase::Running, Some(2))];
    let p = plan(&s, None, &MusterJobStatus::default(), &pods, false, now());
    assert!(p.delete.is_empty());
    assert_eq!(p.create, vec![NewPod { index: Some(0), attempt: 1 }]);
}

#[test]
fn ttl_after_finished_deletes_the_job_when_due() {
    let mut s = spec(1, Some(1), CompletionMode::NonIndexed);
    s.ttl_seconds_after_finished = Some(30);
    let p = run(&s, &[pod("a", Phase::Succeeded, None)]);
    assert_eq!(p.requeue_after, Some(30));
    assert!(!p.delete_job);
    let later = Timestamp::from_second(now().as_second() + 31).expect("ts");
    let p2 = plan(&s, None, &p.status, &[pod("a", Phase::Succeeded, None)], false, later);
    assert!(p2.delete_job);
    assert!(p2.finished.is_none(), "a finished job does not finish twice");
}

#[test]
fn finished_jobs_create_nothing() {
    let s = spec(1, Some(1), CompletionMode::NonIndexed);
    let p = run(&s, &[pod("a", Phase::Succeeded, None)]);
    let again =
        plan(&s, None, &p.status, &[pod("a", Phase::Succeeded, None), pod("x", Phase::Pending, None)], false, now());
    assert!(again.create.is_empty());
    assert_eq!(again.delete, vec![("x".to_string(), "JobComplete")]);
}

#[test]
fn terminating_pods_are_not_active() {
    let mut t = pod("t", Phase::Running, None);
    t.terminating = true;
    let p = run(&spec(1, Some(1), CompletionMode::NonIndexed), &[t]);
    assert_eq!(p.create.len(), 1);
}

#[test]
fn indexes_are_compressed_like_batch_v1() {
    let set: BTreeSet<i32> = [0, 1, 2, 5, 7, 8].into_iter().collect();
    assert_eq!(format_indexes(&set), "0-2,5,7-8");
    assert_eq!(format_indexes(&BTreeSet::new()), "");
}

#[test]
fn new_pods_are_gated_labelled_indexed_and_get_gpu_env() {
    let mut job = MusterJob::new("train", spec(2, Some(2), CompletionMode::Indexed));
    job.metadata.namespace = Some("ns".into());
    job.metadata.uid = Some("uid".into());
    let p = new_pod(&job, &NewPod { index: Some(1), attempt: 0 }, "train", Some("train"));
    let meta = &p.metadata;
    assert_eq!(meta.generate_name.as_deref(), Some("train-1-"));
    let labels = meta.labels.as_ref().expect("labels");
    assert_eq!(labels.get(POD_GROUP_LABEL).map(String::as_str), Some("train"));
    assert_eq!(labels.get(JOB_NAME_LABEL).map(String::as_str), Some("train"));
    assert_eq!(
        meta.annotations.as_ref().and_then(|a| a.get(COMPLETION_INDEX_ANNOTATION)).map(String::as_str),
        Some("1")
    );
    assert_eq!(meta.owner_references.as_ref().map(|o| o[0].controller), Some(Some(true)));
    let spec = p.spec.expect("spec");
    assert_eq!(spec.scheduling_gates.expect("gates")[0].name, ADMISSION_GATE);
    assert_eq!(spec.hostname.as_deref(), Some("train-1"));
    assert_eq!(spec.subdomain.as_deref(), Some("train"));
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    let env: Vec<&str> = spec.containers[0].env.iter().flatten().map(|e| e.name.as_str()).collect();
    assert_eq!(env, vec![COMPLETION_INDEX_ENV, GPU_INDICES_ENV]);
}

#[test]
fn observed_pods_read_phase_index_and_gate() {
    let mut job = MusterJob::new("train", spec(1, Some(1), CompletionMode::Indexed));
    job.metadata.uid = Some("uid".into());
    let mut pod = new_pod(&job, &NewPod { index: Some(0), attempt: 2 }, "train", None);
    pod.metadata.name = Some("train-0-abc".into());
    let o = ObservedPod::from_pod(&pod);
    assert_eq!((o.phase, o.index, o.attempt, o.gated, o.terminating), (Phase::Pending, Some(0), 2, true, false));
}

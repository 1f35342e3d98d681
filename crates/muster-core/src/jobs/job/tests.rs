//! Table tests of the job logic, one per batch/v1 rule muster keeps.

use super::*;
use crate::workloadbuilder::native::SchedulingApi::{Muster, Upstream};
use muster_api::batch::{CompletionMode, MusterJobSpec};

fn spec(parallelism: i32, completions: Option<i32>, mode: CompletionMode) -> MusterJobSpec {
    let mut s: MusterJobSpec = serde_json::from_value(serde_json::json!({
        "parallelism": parallelism,
        "template": {"spec": {"containers": [{"name": "c", "image": "busybox",
            "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}},
    }))
    .expect("fixture");
    s.completions = completions;
    s.completion_mode = Some(mode);
    s
}

fn pod(name: &str, phase: Lifecycle, index: Option<i32>) -> ObservedPod {
    ObservedPod {
        name: name.into(),
        phase,
        index,
        attempt: 0,
        terminating: false,
        ready: phase == Lifecycle::Running,
        gated: false,
        restarts: 0,
        rolled_back: false,
        disruption: None,
        tracked: true,
        gang_restarted: false,
        index_failures: 0,
        index_ignored: 0,
        exit_codes: vec![],
        conditions: vec![],
        finished_at: None,
    }
}

/// A condition as a group or a job carries it (the epoch as its transition time).
fn condition_of(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: Time(Timestamp::UNIX_EPOCH),
        observed_generation: None,
    }
}

/// The reason of the job's `FailureTarget=True` condition, if it has one.
fn failing(p: &JobPlan) -> Option<&str> {
    conditions::get(&p.status.conditions, condition::FAILURE_TARGET)
        .filter(|c| c.status == "True")
        .map(|c| c.reason.as_str())
}

/// The pods as the next pass sees them: those released untracked, those deleted gone.
fn after(p: &JobPlan, pods: &[ObservedPod]) -> Vec<ObservedPod> {
    pods.iter()
        .filter(|o| !p.delete.iter().any(|(n, _)| *n == o.name))
        .map(|o| ObservedPod { tracked: o.tracked && !p.release.contains(&o.name), ..o.clone() })
        .collect()
}

fn now() -> Timestamp {
    Timestamp::from_second(1_000_000).expect("ts")
}

fn run(s: &MusterJobSpec, pods: &[ObservedPod]) -> JobPlan {
    plan("ns", s, Some(1), &MusterJobStatus::default(), pods, false, now())
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
    let pods = [pod("a", Lifecycle::Succeeded, Some(0)), pod("b", Lifecycle::Running, Some(1))];
    let p = run(&spec(2, Some(4), CompletionMode::Indexed), &pods);
    assert_eq!(p.create, vec![NewPod { index: Some(2), attempt: 0, ..NewPod::default() }]);
    assert_eq!(p.status.completed_indexes.as_deref(), Some("0"));
    assert_eq!(p.status.phase, Some(JobPhase::Running));
}

#[test]
fn never_more_active_than_remaining_completions() {
    let pods = [
        pod("a", Lifecycle::Succeeded, None),
        pod("b", Lifecycle::Succeeded, None),
        pod("c", Lifecycle::Running, None),
    ];
    let p = run(&spec(3, Some(3), CompletionMode::NonIndexed), &pods);
    assert!(p.create.is_empty());
    assert!(p.delete.is_empty());
    assert_eq!(p.status.progress.as_deref(), Some("2/3"));
}

#[test]
fn completes_when_completions_succeed_and_stops_the_rest() {
    let pods = [
        pod("a", Lifecycle::Succeeded, None),
        pod("b", Lifecycle::Succeeded, None),
        pod("c", Lifecycle::Running, None),
    ];
    let s = spec(3, Some(2), CompletionMode::NonIndexed);
    let p = run(&s, &pods);
    // The extra pod goes first (uncounted); the criteria are met, Complete waits for it.
    assert_eq!(p.delete, vec![("c".to_string(), "TooManyActive")]);
    assert!(!p.deletes_counted);
    assert!(p.finished.is_none());
    let met = conditions::get(&p.status.conditions, condition::SUCCESS_CRITERIA_MET).expect("criteria met");
    assert_eq!(
        (met.status.as_str(), met.reason.as_str(), met.message.as_str()),
        ("True", "CompletionsReached", "Reached expected number of succeeded pods")
    );
    assert_eq!((p.status.terminating, p.status.active), (Some(1), 0));
    assert_ne!(p.status.phase, Some(JobPhase::Complete));
    // Once it is gone: Complete, with the same reason and message.
    let p = plan("ns", &s, None, &p.status, &after(&p, &pods), false, now());
    assert_eq!(p.finished.as_ref().map(|f| (f.condition, f.reason)), Some((condition::COMPLETE, "CompletionsReached")));
    assert_eq!(p.status.phase, Some(JobPhase::Complete));
    assert_eq!(p.status.completion_time, Some(Time(now())));
    assert_eq!((p.status.succeeded, p.status.failed, p.status.terminating), (2, 0, Some(0)));
    let complete = conditions::get(&p.status.conditions, condition::COMPLETE).expect("complete");
    assert_eq!(
        (complete.reason.as_str(), complete.message.as_str()),
        ("CompletionsReached", "Reached expected number of succeeded pods")
    );
}

#[test]
fn indexed_completes_only_when_every_index_succeeded() {
    let pods = [pod("a", Lifecycle::Succeeded, Some(0)), pod("b", Lifecycle::Succeeded, Some(0))];
    let p = run(&spec(2, Some(2), CompletionMode::Indexed), &pods);
    assert!(p.finished.is_none());
    assert_eq!(p.create, vec![NewPod { index: Some(1), attempt: 0, ..NewPod::default() }]);
}

#[test]
fn failed_pods_are_replaced_until_the_backoff_limit() {
    let mut s = spec(1, Some(1), CompletionMode::NonIndexed);
    s.backoff_limit = Some(1);
    let p = run(&s, &[pod("a", Lifecycle::Failed, None)]);
    assert_eq!(p.create.len(), 1);
    assert_eq!(p.create[0].attempt, 1);
    let p = run(&s, &[pod("a", Lifecycle::Failed, None), pod("b", Lifecycle::Failed, None)]);
    assert!(p.create.is_empty());
    // No pod left to stop: FailureTarget and Failed at once, with batch/v1's words.
    let f = p.finished.clone().expect("failed");
    assert_eq!(
        (f.condition, f.reason, f.message.as_str()),
        (condition::FAILED, "BackoffLimitExceeded", "Job has reached the specified backoff limit")
    );
    assert_eq!(failing(&p), Some("BackoffLimitExceeded"));
    assert_eq!(p.status.phase, Some(JobPhase::Failed));
    assert_eq!(p.status.failed, 2);
    assert_eq!(p.status.completion_time, None, "batch/v1 sets completionTime on Complete jobs only");
}

#[test]
fn deadline_fails_the_job() {
    let mut s = spec(1, Some(1), CompletionMode::NonIndexed);
    s.active_deadline_seconds = Some(10);
    let prev = MusterJobStatus {
        start_time: Some(Time(Timestamp::from_second(now().as_second() - 11).expect("ts"))),
        ..Default::default()
    };
    let pods = [pod("a", Lifecycle::Running, None)];
    let p = plan("ns", &s, None, &prev, &pods, false, now());
    assert_eq!(failing(&p), Some("DeadlineExceeded"));
    assert!(p.finished.is_none(), "Failed waits until the pod is gone");
    assert_eq!(p.delete, vec![("a".to_string(), "DeadlineExceeded")]);
    assert!(p.deletes_counted);
    assert_eq!((p.status.failed, p.status.active, p.status.terminating), (1, 0, Some(1)), "the pod stopped counts");
    let p = plan("ns", &s, None, &p.status, &after(&p, &pods), false, now());
    let f = p.finished.expect("failed");
    assert_eq!((f.reason, f.message.as_str()), ("DeadlineExceeded", "Job was active longer than specified deadline"));
    assert_eq!((p.status.failed, p.status.phase), (1, Some(JobPhase::Failed)));
}

#[test]
fn deadline_requeues_until_due() {
    let mut s = spec(1, Some(1), CompletionMode::NonIndexed);
    s.active_deadline_seconds = Some(10);
    let prev = MusterJobStatus {
        start_time: Some(Time(Timestamp::from_second(now().as_second() - 4).expect("ts"))),
        ..Default::default()
    };
    let p = plan("ns", &s, None, &prev, &[pod("a", Lifecycle::Running, None)], false, now());
    assert!(p.finished.is_none());
    assert_eq!(p.requeue_after, Some(6));
}

#[test]
fn suspend_deletes_active_pods_and_sets_the_condition() {
    let mut s = spec(2, Some(2), CompletionMode::NonIndexed);
    s.suspend = true;
    let pods = [pod("a", Lifecycle::Running, None), pod("b", Lifecycle::Succeeded, None)];
    let running = MusterJobStatus { start_time: Some(Time(now())), ..Default::default() };
    let p = plan("ns", &s, None, &running, &pods, false, now());
    assert_eq!(p.delete, vec![("a".to_string(), "JobSuspended")]);
    assert!(!p.deletes_counted, "a suspended job's pods do not fail");
    assert!(p.create.is_empty());
    let c = conditions::get(&p.status.conditions, condition::SUSPENDED).expect("suspended");
    assert_eq!((c.status.as_str(), c.reason.as_str(), c.message.as_str()), ("True", "JobSuspended", "Job suspended"));
    assert_eq!(p.status.phase, Some(JobPhase::Suspended));
    s.suspend = false;
    let resumed = plan("ns", &s, None, &p.status, &after(&p, &pods), false, now());
    assert_eq!((resumed.create.len(), resumed.status.succeeded, resumed.status.failed), (1, 1, 0));
    let c = conditions::get(&resumed.status.conditions, condition::SUSPENDED).expect("suspended");
    assert_eq!((c.status.as_str(), c.reason.as_str(), c.message.as_str()), ("False", "JobResumed", "Job resumed"));
}

#[test]
fn suspended_time_does_not_count_toward_the_deadline() {
    let mut s = spec(1, Some(1), CompletionMode::NonIndexed);
    s.active_deadline_seconds = Some(10);
    s.suspend = true;
    let long_ago = Time(Timestamp::from_second(now().as_second() - 3_600).expect("ts"));
    let running = MusterJobStatus { start_time: Some(long_ago.clone()), ..Default::default() };
    let suspended = plan("ns", &s, None, &running, &[pod("a", Lifecycle::Running, None)], false, now());
    assert!(suspended.finished.is_none(), "a suspended job never fails on its deadline");
    assert_eq!(suspended.status.start_time, None, "suspending clears startTime");
    assert_eq!(suspended.requeue_after, None);

    // Resumed an hour after the deadline would have passed: the clock starts again.
    s.suspend = false;
    let later = Timestamp::from_second(now().as_second() + 3_600).expect("ts");
    let resumed = plan("ns", &s, None, &suspended.status, &[], false, later);
    assert!(resumed.finished.is_none());
    assert_eq!(resumed.status.start_time, Some(Time(later)));
    assert_eq!(resumed.requeue_after, Some(10));
    assert_eq!(resumed.create.len(), 1);

    // A status written while suspended that still holds an old startTime is reset too.
    let stale = MusterJobStatus { start_time: Some(long_ago), ..suspended.status.clone() };
    let resumed = plan("ns", &s, None, &stale, &[], false, later);
    assert!(resumed.finished.is_none());
    assert_eq!(resumed.status.start_time, Some(Time(later)));

    // Once resumed, the deadline runs from the resume.
    let due = Timestamp::from_second(later.as_second() + 10).expect("ts");
    let p = plan("ns", &s, None, &resumed.status, &[pod("b", Lifecycle::Running, None)], false, due);
    assert_eq!(failing(&p), Some("DeadlineExceeded"));
}

#[test]
fn created_suspended_jobs_have_no_start_time_until_resumed() {
    let mut s = spec(1, Some(1), CompletionMode::NonIndexed);
    s.suspend = true;
    let p = run(&s, &[]);
    assert_eq!(p.status.start_time, None);
    assert!(p.create.is_empty());
    assert!(conditions::is_true(&p.status.conditions, condition::SUSPENDED));
    assert_eq!(p.status.phase, Some(JobPhase::Suspended));
    s.suspend = false;
    let resumed = plan("ns", &s, None, &p.status, &[], false, now());
    let c = conditions::get(&resumed.status.conditions, condition::SUSPENDED).expect("suspended");
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "JobResumed"));
    assert_eq!(resumed.create.len(), 1);
}

fn on_failure(mut s: MusterJobSpec) -> MusterJobSpec {
    if let Some(t) = s.template.spec.as_mut() {
        t.restart_policy = Some("OnFailure".into());
    }
    s
}

fn restarted(name: &str, phase: Lifecycle, restarts: i32) -> ObservedPod {
    ObservedPod { restarts, ..pod(name, phase, None) }
}

#[test]
fn on_failure_container_restarts_count_toward_the_backoff_limit() {
    let mut s = on_failure(spec(2, Some(2), CompletionMode::NonIndexed));
    s.backoff_limit = Some(3);
    let p = run(&s, &[restarted("a", Lifecycle::Running, 1), restarted("b", Lifecycle::Running, 1)]);
    assert!(p.finished.is_none(), "2 restarts, limit 3");
    let pods = [restarted("a", Lifecycle::Running, 2), restarted("b", Lifecycle::Pending, 1)];
    let p = run(&s, &pods);
    assert_eq!(failing(&p), Some("BackoffLimitExceeded"));
    assert_eq!(p.status.failed, 2, "the pods stopped count as failed, as batch/v1 counts them");
    assert_eq!(p.delete.len(), 2);
    let p = plan("ns", &s, None, &p.status, &after(&p, &pods), false, now());
    assert_eq!(p.finished.map(|f| (f.condition, f.reason)), Some((condition::FAILED, "BackoffLimitExceeded")));
    assert_eq!((p.status.failed, p.status.phase), (2, Some(JobPhase::Failed)));
}

#[test]
fn on_failure_with_backoff_limit_zero_fails_on_the_first_restart() {
    let mut s = on_failure(spec(1, Some(1), CompletionMode::NonIndexed));
    s.backoff_limit = Some(0);
    assert!(run(&s, &[restarted("a", Lifecycle::Running, 0)]).finished.is_none());
    assert_eq!(failing(&run(&s, &[restarted("a", Lifecycle::Running, 1)])), Some("BackoffLimitExceeded"));
}

#[test]
fn restarts_count_only_with_restart_policy_on_failure() {
    let mut s = spec(1, Some(1), CompletionMode::NonIndexed);
    s.backoff_limit = Some(1);
    // restartPolicy unset: muster's pods run with Never, where a pod failure is the retry.
    assert_eq!(failing(&run(&s, &[restarted("a", Lifecycle::Running, 5)])), None);
    // A finished pod's restarts are not counted again: it counts as a failed pod.
    let s = on_failure(s);
    assert_eq!(failing(&run(&s, &[restarted("a", Lifecycle::Failed, 5)])), None);
}

#[test]
fn observed_pods_sum_container_and_init_container_restarts() {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p"},
        "status": {"phase": "Running",
            "containerStatuses": [
                {"name": "a", "image": "x", "imageID": "", "ready": true, "restartCount": 2},
                {"name": "b", "image": "x", "imageID": "", "ready": true, "restartCount": 1}],
            "initContainerStatuses": [
                {"name": "i", "image": "x", "imageID": "", "ready": true, "restartCount": 3}]},
    }))
    .expect("fixture");
    assert_eq!(ObservedPod::from_pod(&pod).restarts, 6);
}

#[test]
fn deleted_failed_pods_still_count_toward_the_backoff_limit() {
    let mut s = spec(1, Some(1), CompletionMode::NonIndexed);
    s.backoff_limit = Some(2);
    let prev = MusterJobStatus { failed: 2, ..Default::default() };
    let p = plan("ns", &s, None, &prev, &[], false, now());
    assert_eq!(p.status.failed, 2, "the two failed pods were deleted; the count never drops");
    assert!(p.finished.is_none());
    assert_eq!(
        p.create,
        vec![NewPod { index: None, attempt: 2, ..NewPod::default() }],
        "attempt numbers are not reused"
    );
    // Its replacement (attempt 2: made after 2 failures) fails too: the third failure.
    let third = ObservedPod { attempt: 2, ..pod("c", Lifecycle::Failed, None) };
    let p = plan("ns", &s, None, &p.status, &[third], false, now());
    assert_eq!(p.status.failed, 3);
    assert_eq!(p.finished.map(|f| f.reason), Some("BackoffLimitExceeded"));
}

#[test]
fn counts_are_the_statuses_plus_the_pods_still_tracked() {
    let mut s = spec(1, Some(5), CompletionMode::NonIndexed);
    s.backoff_limit = Some(10);
    let failed = |name: &str, tracked: bool| ObservedPod { tracked, ..pod(name, Lifecycle::Failed, None) };
    let done = |name: &str, tracked: bool| ObservedPod { tracked, ..pod(name, Lifecycle::Succeeded, None) };
    // (recorded failed, recorded succeeded, pods) -> (failed, succeeded)
    let table = [
        (0, 0, vec![], (0, 0)),
        (4, 0, vec![failed("a", false)], (4, 0)),
        (4, 0, vec![failed("a", false), failed("b", true)], (5, 0)),
        (0, 0, vec![failed("a", true), failed("b", true)], (2, 0)),
        (1, 1, vec![done("a", false), done("b", true), failed("c", true)], (2, 2)),
        // An older muster's pods (never tracked) still prove their successes.
        (0, 0, vec![done("a", false), done("b", false)], (0, 2)),
    ];
    for (i, (f, ok, pods, want)) in table.into_iter().enumerate() {
        let prev = MusterJobStatus { failed: f, succeeded: ok, ..Default::default() };
        let p = plan("ns", &s, None, &prev, &pods, false, now());
        assert_eq!((p.status.failed, p.status.succeeded), want, "row {i}");
        // What was counted is released once the status is written; nothing else.
        let released: BTreeSet<&str> = p.release.iter().map(String::as_str).collect();
        let tracked: BTreeSet<&str> = pods.iter().filter(|p| p.tracked).map(|p| p.name.as_str()).collect();
        assert_eq!(released, tracked, "row {i}");
    }
}

#[test]
fn rolled_back_pods_never_count_toward_the_backoff_limit() {
    let mut s = spec(2, Some(2), CompletionMode::NonIndexed);
    s.backoff_limit = Some(0);
    // A rolled-back attempt: one pod bound and started, marked Failed by kubelet as it is
    // deleted; the other never bound. Both are terminating.
    let rolled =
        |name: &str, phase: Lifecycle| ObservedPod { rolled_back: true, terminating: true, ..pod(name, phase, None) };
    let pods = [rolled("a", Lifecycle::Failed), rolled("b", Lifecycle::Pending)];
    for gang_all in [false, true] {
        let p = plan("ns", &s, None, &MusterJobStatus::default(), &pods, gang_all, now());
        assert_eq!(p.status.failed, 0, "gang_all={gang_all}");
        assert!(p.finished.is_none(), "gang_all={gang_all}");
        assert_eq!(p.create.len(), 2, "both recreated at once (gang_all={gang_all})");
        assert!(p.create.iter().all(|n| n.attempt == 0), "no failure was counted (gang_all={gang_all})");
    }
    // The same pod failing on its own does count.
    let failed = ObservedPod { terminating: true, ..pod("a", Lifecycle::Failed, None) };
    let p = plan("ns", &s, None, &MusterJobStatus::default(), &[failed], false, now());
    assert_eq!(p.status.failed, 1);
}

#[test]
fn deleted_succeeded_pods_still_count_toward_completions() {
    let s = spec(1, Some(3), CompletionMode::NonIndexed);
    let prev = MusterJobStatus { succeeded: 2, ..Default::default() };
    let p = plan("ns", &s, None, &prev, &[], false, now());
    assert_eq!(p.status.succeeded, 2);
    assert_eq!(p.create.len(), 1);
    let counted = ObservedPod { tracked: false, ..pod("c", Lifecycle::Succeeded, None) };
    let p = plan("ns", &s, None, &prev, std::slice::from_ref(&counted), false, now());
    assert_eq!(p.status.succeeded, 2, "a pod released is counted already");
    let new = pod("d", Lifecycle::Succeeded, None);
    let p = plan("ns", &s, None, &p.status, &[counted, new], false, now());
    assert_eq!(p.status.succeeded, 3, "a pod still tracked is new");
}

#[test]
fn indexed_jobs_do_not_rerun_indexes_recorded_as_completed() {
    let s = spec(2, Some(4), CompletionMode::Indexed);
    let prev = MusterJobStatus { succeeded: 2, completed_indexes: Some("0,2".into()), ..Default::default() };
    // The pods of indexes 0 and 2 were deleted after they succeeded.
    let p = plan("ns", &s, None, &prev, &[pod("b", Lifecycle::Succeeded, Some(1))], false, now());
    assert_eq!(p.create, vec![NewPod { index: Some(3), attempt: 0, ..NewPod::default() }]);
    assert_eq!(p.status.completed_indexes.as_deref(), Some("0-2"));
    assert_eq!(p.status.succeeded, 3);
    let done = plan("ns", &s, None, &p.status, &[pod("d", Lifecycle::Succeeded, Some(3))], false, now());
    assert_eq!(done.finished.map(|f| f.condition), Some(condition::COMPLETE));
}

#[test]
fn completed_indexes_read_back_what_format_writes() {
    for text in ["", "0", "0-2,5,7,8", "3,4,10", "0-3"] {
        assert_eq!(format_indexes(&parse_indexes(text, 11)), text);
    }
    assert_eq!(parse_indexes(" 1 , x, 4-3", 11), [1].into_iter().collect());
}

#[test]
fn completed_indexes_are_read_only_below_the_completions() {
    // A status edited by hand to every index is read as far as the job's completions: never a
    // set of two billion indexes.
    assert_eq!(parse_indexes("0-2147483646", 3), [0, 1, 2].into_iter().collect());
    assert_eq!(parse_indexes("-5-2,2147483647", 3), BTreeSet::new(), "a negative start does not parse");
    assert_eq!(parse_indexes("1-2147483647,7", 0), BTreeSet::new());
}

#[test]
fn a_gang_restart_never_reuses_a_failed_attempt() {
    let s = spec(2, Some(2), CompletionMode::Indexed);
    // Attempt 3 failed, but the status records fewer failures (written by an older muster).
    let mut failed = pod("a", Lifecycle::Failed, Some(0));
    failed.attempt = 3;
    let p = plan("ns", &s, None, &MusterJobStatus { failed: 1, ..Default::default() }, &[failed], true, now());
    assert!(p.create.iter().all(|n| n.attempt == 4), "{:?}", p.create);
}

#[test]
fn lowering_parallelism_deletes_gated_pods_first() {
    let mut gated = pod("g", Lifecycle::Pending, Some(2));
    gated.gated = true;
    let pods = [pod("r0", Lifecycle::Running, Some(0)), pod("r1", Lifecycle::Running, Some(1)), gated];
    let p = run(&spec(2, Some(3), CompletionMode::Indexed), &pods);
    assert_eq!(p.delete, vec![("g".to_string(), "TooManyActive")]);
}

#[test]
fn disruption_mode_all_restarts_the_whole_attempt() {
    let s = spec(3, Some(3), CompletionMode::Indexed);
    let pods = [
        pod("a", Lifecycle::Failed, Some(0)),
        pod("b", Lifecycle::Running, Some(1)),
        pod("c", Lifecycle::Running, Some(2)),
    ];
    let p = plan("ns", &s, None, &MusterJobStatus::default(), &pods, true, now());
    assert_eq!(p.delete, vec![("b".to_string(), "GangRestart"), ("c".to_string(), "GangRestart")]);
    assert!(p.create.is_empty(), "the next attempt waits until the old one is gone");
    // Once they are gone, the next attempt is created whole.
    let p = plan("ns", &s, None, &MusterJobStatus::default(), &pods[..1], true, now());
    assert_eq!(
        p.create,
        (0..3).map(|i| NewPod { index: Some(i), attempt: 1, ..NewPod::default() }).collect::<Vec<_>>()
    );
}

#[test]
fn disruption_mode_single_replaces_only_the_failed_pod() {
    let s = spec(3, Some(3), CompletionMode::Indexed);
    let pods = [
        pod("a", Lifecycle::Failed, Some(0)),
        pod("b", Lifecycle::Running, Some(1)),
        pod("c", Lifecycle::Running, Some(2)),
    ];
    let p = plan("ns", &s, None, &MusterJobStatus::default(), &pods, false, now());
    assert!(p.delete.is_empty());
    assert_eq!(p.create, vec![NewPod { index: Some(0), attempt: 1, ..NewPod::default() }]);
}

#[test]
fn ttl_after_finished_deletes_the_job_when_due() {
    let mut s = spec(1, Some(1), CompletionMode::NonIndexed);
    s.ttl_seconds_after_finished = Some(30);
    let p = run(&s, &[pod("a", Lifecycle::Succeeded, None)]);
    assert_eq!(p.requeue_after, Some(30));
    assert!(!p.delete_job);
    let later = Timestamp::from_second(now().as_second() + 31).expect("ts");
    let p2 = plan("ns", &s, None, &p.status, &[pod("a", Lifecycle::Succeeded, None)], false, later);
    assert!(p2.delete_job);
    assert!(p2.finished.is_none(), "a finished job does not finish twice");
}

#[test]
fn finished_jobs_create_nothing() {
    let s = spec(1, Some(1), CompletionMode::NonIndexed);
    let p = run(&s, &[pod("a", Lifecycle::Succeeded, None)]);
    let again = plan(
        "ns",
        &s,
        None,
        &p.status,
        &[pod("a", Lifecycle::Succeeded, None), pod("x", Lifecycle::Pending, None)],
        false,
        now(),
    );
    assert!(again.create.is_empty());
    assert_eq!(again.delete, vec![("x".to_string(), "JobComplete")]);
}

#[test]
fn terminating_pods_are_not_active() {
    let mut t = pod("t", Lifecycle::Running, None);
    t.terminating = true;
    let p = run(&spec(1, Some(1), CompletionMode::NonIndexed), &[t]);
    assert_eq!(p.create.len(), 1);
}

#[test]
fn indexes_are_compressed_like_batch_v1() {
    let set: BTreeSet<i32> = [0, 1, 2, 5, 7, 8].into_iter().collect();
    assert_eq!(format_indexes(&set), "0-2,5,7,8", "two in a row are two");
    assert_eq!(format_indexes(&BTreeSet::new()), "");
}

#[test]
fn new_pods_are_gated_labelled_indexed_and_get_gpu_env() {
    let mut job = MusterJob::new("train", spec(2, Some(2), CompletionMode::Indexed));
    job.metadata.namespace = Some("ns".into());
    job.metadata.uid = Some("uid".into());
    let p = new_pod(&job, &NewPod { index: Some(1), attempt: 0, ..NewPod::default() }, "train", Some("train"), 3);
    let meta = &p.metadata;
    assert_eq!(meta.generate_name.as_deref(), Some("train-1-"));
    let labels = meta.labels.as_ref().expect("labels");
    assert_eq!(labels.get(POD_GROUP_LABEL).map(String::as_str), Some("train"));
    assert_eq!(labels.get(JOB_NAME_LABEL).map(String::as_str), Some("train"));
    assert_eq!(
        meta.annotations.as_ref().and_then(|a| a.get(COMPLETION_INDEX_ANNOTATION)).map(String::as_str),
        Some("1")
    );
    assert_eq!(
        meta.annotations.as_ref().and_then(|a| a.get(ADMISSION_ATTEMPT_ANNOTATION)).map(String::as_str),
        Some("3"),
        "the rollbacks of the gang so far"
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
    let mut pod = new_pod(&job, &NewPod { index: Some(0), attempt: 2, ..NewPod::default() }, "train", None, 0);
    pod.metadata.name = Some("train-0-abc".into());
    let o = ObservedPod::from_pod(&pod);
    assert_eq!((o.phase, o.index, o.attempt, o.gated, o.terminating), (Lifecycle::Pending, Some(0), 2, true, false));
    assert!(!o.rolled_back);
    pod.metadata.annotations.get_or_insert_default().insert(ROLLED_BACK_ANNOTATION.into(), "plan-1".into());
    assert!(ObservedPod::from_pod(&pod).rolled_back);
}

#[test]
fn a_job_pod_record_reads_as_the_whole_pod_and_names_its_job() {
    let mut job = MusterJob::new("train", spec(2, Some(2), CompletionMode::Indexed));
    job.metadata.uid = Some("uid".into());
    let mut pod = new_pod(&job, &NewPod { index: Some(1), attempt: 1, ..NewPod::default() }, "train", Some("train"), 2);
    pod.metadata.name = Some("train-1-abc".into());
    pod.metadata.namespace = Some("ns".into());
    pod.metadata.annotations.get_or_insert_default().insert(ROLLED_BACK_ANNOTATION.into(), "plan-1".into());
    pod.metadata.annotations.get_or_insert_default().insert("other.example.com/note".into(), "x".repeat(4096));
    pod.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    let status: k8s_openapi::api::core::v1::PodStatus = serde_json::from_value(serde_json::json!({
        "phase": "Running",
        "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
        "containerStatuses": [{"name": "main", "image": "img", "imageID": "id", "ready": true, "restartCount": 2,
            "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}],
        "initContainerStatuses": [{"name": "init", "image": "img", "imageID": "id", "ready": false, "restartCount": 1}],
    }))
    .expect("status");
    pod.status = Some(status);
    for gated in [true, false] {
        if !gated {
            pod.spec.as_mut().expect("spec").scheduling_gates = None;
        }
        let record = JobPod::of(&pod);
        assert_eq!(record.observed, ObservedPod::from_pod(&pod), "gated: {gated}");
        assert_eq!((record.observed.restarts, record.observed.gated, record.observed.ready), (3, gated, true));
        assert!(record.observed.terminating && record.observed.rolled_back);
        assert!(record.of_job("ns", "train", "uid"));
        assert!(!record.of_job("other", "train", "uid"), "another namespace");
        assert!(!record.of_job("ns", "train-2", "uid"), "another job");
        assert!(!record.of_job("ns", "train", "uid-2"), "a job of the same name made again");
    }
    // A pod without the job label or a controller belongs to no job.
    pod.metadata.labels.as_mut().expect("labels").remove(JOB_NAME_LABEL);
    pod.metadata.owner_references = None;
    let record = JobPod::of(&pod);
    assert_eq!((record.job.as_deref(), record.controller_uid.as_deref()), (None, None));
    assert!(!record.of_job("ns", "train", "uid"));
}

#[test]
fn only_active_and_ready_counts_wait_for_the_status_pace() {
    let old = MusterJobStatus {
        phase: Some(JobPhase::Running),
        active: 3,
        ready: 1,
        progress: Some("0/3".into()),
        ..MusterJobStatus::default()
    };
    let with = |f: &dyn Fn(&mut MusterJobStatus)| {
        let mut s = old.clone();
        f(&mut s);
        s
    };
    assert!(status_may_wait(Some(&old), &with(&|s| s.ready = 3)));
    assert!(status_may_wait(Some(&old), &with(&|s| s.active = 2)));
    assert!(status_may_wait(Some(&old), &with(&|s| s.terminating = Some(2))), "a live count too");
    assert!(!status_may_wait(Some(&old), &old), "nothing to write");
    assert!(status_may_wait(None, &old), "a first status that only says the job is live");
    assert!(!status_may_wait(Some(&old), &with(&|s| s.failed = 1)), "a failure is recorded at once");
    assert!(!status_may_wait(Some(&old), &with(&|s| s.succeeded = 1)));
    assert!(!status_may_wait(Some(&old), &with(&|s| s.phase = Some(JobPhase::Complete))));
    // How long: kube-scheduler's condition alone on a job still Pending waits for the Running
    // write; with anything else, or once Running, the short pace.
    let scheduled =
        |status: bool| condition_of(MIRRORED_CONDITIONS[0], if status { "True" } else { "False" }, "Scheduled", "");
    let waiting = with(&|s| s.phase = Some(JobPhase::Pending));
    let seen = with(&|s| {
        s.phase = Some(JobPhase::Pending);
        s.conditions.push(scheduled(true));
    });
    assert_eq!(status_pace(Some(&waiting), &seen, Muster), Some(SCHEDULED_PACE));
    let flipped = with(&|s| {
        s.phase = Some(JobPhase::Pending);
        s.conditions.push(scheduled(false));
    });
    assert_eq!(status_pace(Some(&seen), &flipped, Muster), Some(STARTING_PACE), "a flip to False: the gang waits");
    assert_eq!(status_pace(Some(&flipped), &seen, Muster), Some(SCHEDULED_PACE), "and back to True");
    let seen_ready = with(&|s| {
        s.phase = Some(JobPhase::Pending);
        s.ready = 3;
        s.conditions.push(scheduled(true));
    });
    assert_eq!(status_pace(Some(&waiting), &seen_ready, Muster), Some(STATUS_PACE), "with a count");
    // Running with `ready` of 3 pods ready and kube-scheduler's condition (placed or not).
    let running_ready = |ready: i32, placed: bool| {
        with(&|s| {
            s.phase = Some(JobPhase::Running);
            s.ready = ready;
            s.conditions.push(scheduled(placed));
        })
    };
    // The placed gang's pods starting: the job goes Running with every pod ready in one write.
    let starting = running_ready(1, true);
    assert_eq!(status_pace(Some(&seen), &starting, Muster), Some(SCHEDULED_PACE), "Running, 1 of 3 ready");
    assert_eq!(status_pace(Some(&waiting), &starting, Muster), Some(SCHEDULED_PACE), "with the condition");
    assert_eq!(status_pace(None, &starting, Muster), Some(SCHEDULED_PACE), "a first status");
    assert_eq!(status_pace(Some(&seen), &running_ready(1, false), Muster), Some(STARTING_PACE), "not placed");
    let running = with(&|s| {
        s.phase = Some(JobPhase::Running);
        s.ready = 3;
    });
    let running_seen = running_ready(3, true);
    assert_eq!(status_pace(Some(&running), &running_seen, Muster), Some(STATUS_PACE), "once Running");
    assert_eq!(
        status_pace(Some(&running_seen), &starting, Muster),
        Some(STARTING_PACE),
        "a pod of a running job restarts"
    );
    assert_eq!(status_pace(Some(&waiting), &running_seen, Muster), Some(STATUS_PACE), "with the phase");
    // While fewer pods are ready than active, a count waits longer: the gang's other pods are
    // starting, and the write with all of them ready goes at the short pace.
    assert_eq!(status_pace(Some(&old), &with(&|s| s.ready = 2), Muster), Some(STARTING_PACE), "one more of 3 ready");
    assert_eq!(status_pace(Some(&waiting), &old, Muster), Some(STARTING_PACE), "Running with 1 of 3 ready");
    assert_eq!(status_pace(Some(&old), &with(&|s| s.ready = 3), Muster), Some(STATUS_PACE), "all 3 ready");
    assert_eq!(status_pace(Some(&old), &with(&|s| s.active = 1), Muster), Some(STATUS_PACE), "as many ready as active");
    assert_eq!(status_pace(Some(&old), &with(&|s| s.failed = 1), Muster), None, "a failure at once");
    assert_eq!(status_pace(None, &old, Muster), Some(STARTING_PACE), "a first status, its gang starting");
    assert_eq!(status_pace(None, &with(&|s| s.ready = 3), Muster), Some(STATUS_PACE), "a first status, all ready");
    assert_eq!(status_pace(None, &with(&|s| s.failed = 1), Muster), None, "a first status with a failure");
    // Upstream mode: a first status whose gang kube-scheduler has not decided on yet (no
    // condition) waits as long as a placed one; once it decided, as in muster's mode.
    let undecided = with(&|s| {
        s.phase = Some(JobPhase::Pending);
        s.ready = 0;
    });
    assert_eq!(status_pace(None, &undecided, Upstream), Some(SCHEDULED_PACE), "queued in kube-scheduler");
    assert_eq!(status_pace(None, &undecided, Muster), Some(STARTING_PACE), "muster admits: no such wait");
    assert_eq!(status_pace(None, &old, Upstream), Some(SCHEDULED_PACE), "Running, 1 of 3 ready, undecided");
    let refused = with(&|s| {
        s.phase = Some(JobPhase::Pending);
        s.ready = 0;
        s.conditions.push(scheduled(false));
    });
    assert_eq!(status_pace(None, &refused, Upstream), Some(STARTING_PACE), "the gang does not fit: said soon");
    assert_eq!(status_pace(None, &starting, Upstream), Some(SCHEDULED_PACE), "placed");
    assert_eq!(status_pace(None, &with(&|s| s.ready = 3), Upstream), Some(STATUS_PACE), "every pod ready");
    assert_eq!(status_pace(None, &with(&|s| s.failed = 1), Upstream), None, "a failure at once");
    // Only a first status: a job that showed a status already keeps the shorter pace.
    assert_eq!(status_pace(Some(&undecided), &old, Upstream), Some(STARTING_PACE), "after a first status");
    // Pending and Running follow the pods: a gang starting goes out as one write.
    let pending = with(&|s| {
        s.phase = Some(JobPhase::Pending);
        s.ready = 0;
    });
    assert!(status_may_wait(Some(&pending), &old), "Pending to Running, ready with it");
    assert!(status_may_wait(Some(&old), &pending), "and back");
    for phase in [JobPhase::Failed, JobPhase::Suspended, JobPhase::Invalid, JobPhase::Complete] {
        assert!(!status_may_wait(Some(&pending), &with(&|s| s.phase = Some(phase))), "{phase:?}");
        let from = with(&|s| s.phase = Some(phase));
        assert!(!status_may_wait(Some(&from), &old), "from {phase:?}");
    }
    let unset = with(&|s| s.phase = None);
    assert!(!status_may_wait(Some(&unset), &old), "a first phase is written at once");
    assert!(!status_may_wait(
        Some(&old),
        &with(&|s| {
            s.ready = 3;
            s.progress = Some("1/3".into());
        })
    ));
    // A native PodGroup's condition (upstream mode) may wait; the job's own may not.
    let cond = |t: &str, status: &str| condition_of(t, status, "R", "");
    let scheduled = with(&|s| s.conditions.push(cond("PodGroupInitiallyScheduled", "True")));
    assert!(status_may_wait(Some(&old), &scheduled));
    let mut flipped = scheduled.clone();
    flipped.conditions[0].status = "False".into();
    flipped.ready = 2;
    assert!(status_may_wait(Some(&scheduled), &flipped));
    assert!(status_may_wait(Some(&scheduled), &old), "a mirrored condition that went");
    assert!(!status_may_wait(Some(&old), &with(&|s| s.conditions.push(cond(condition::COMPLETE, "True")))));
    let mut both = scheduled.clone();
    both.conditions.push(cond(condition::SUSPENDED, "True"));
    assert!(!status_may_wait(Some(&old), &both));
}

#[test]
fn a_first_status_waits_only_when_it_says_the_job_is_live() {
    let now = Timestamp::from_second(1_000).unwrap();
    let first = MusterJobStatus {
        phase: Some(JobPhase::Pending),
        progress: Some("0/3".into()),
        active: 3,
        conditions: vec![condition_of(condition::INVALID, "False", "Valid", "")],
        start_time: Some(Time(now)),
        workload_name: Some("train".into()),
        pod_group_name: Some("train".into()),
        observed_generation: Some(1),
        ..MusterJobStatus::default()
    };
    let with = |f: &dyn Fn(&mut MusterJobStatus)| {
        let mut s = first.clone();
        f(&mut s);
        s
    };
    assert!(first_status_may_wait(&first), "Pending, its pods created");
    assert!(first_status_may_wait(&with(&|s| {
        s.phase = Some(JobPhase::Running);
        s.ready = 3;
    })));
    let scheduled = condition_of(MIRRORED_CONDITIONS[0], "True", "Scheduled", "");
    assert!(first_status_may_wait(&with(&|s| s.conditions.push(scheduled.clone()))), "upstream mode");
    // Anything counted or decided is written at once.
    for phase in [JobPhase::Complete, JobPhase::Failed, JobPhase::Suspended, JobPhase::Invalid] {
        assert!(!first_status_may_wait(&with(&|s| s.phase = Some(phase))), "{phase:?}");
    }
    assert!(!first_status_may_wait(&with(&|s| s.phase = None)));
    assert!(!first_status_may_wait(&with(&|s| s.succeeded = 1)));
    assert!(!first_status_may_wait(&with(&|s| s.failed = 1)));
    assert!(!first_status_may_wait(&with(&|s| s.completed_indexes = Some("0".into()))));
    assert!(!first_status_may_wait(&with(&|s| s.failed_indexes = Some("1".into()))));
    assert!(!first_status_may_wait(&with(&|s| s.completion_time = Some(Time(now)))));
    assert!(!first_status_may_wait(&with(&|s| s.conditions[0].status = "True".into())), "Invalid");
    for own in [condition::SUSPENDED, condition::FAILURE_TARGET, condition::CLAIMS_READY, MIRRORED_CONDITIONS[1]] {
        assert!(!first_status_may_wait(&with(&|s| s.conditions.push(condition_of(own, "True", "R", "")))), "{own}");
    }
}

#[test]
fn a_native_pod_joins_its_group_by_scheduling_group_without_muster_label_or_gate() {
    let mut job = MusterJob::new("train", spec(2, Some(2), CompletionMode::Indexed));
    job.metadata.uid = Some("uid".into());
    let mut pod = new_pod(&job, &NewPod { index: Some(0), attempt: 0, ..NewPod::default() }, "train", None, 3);
    pod.spec
        .as_mut()
        .expect("spec")
        .scheduling_gates
        .get_or_insert_default()
        .push(PodSchedulingGate { name: "other.example.com/gate".into() });
    native_pod(&mut pod, "train");
    let labels = pod.metadata.labels.as_ref().expect("labels");
    assert!(!labels.contains_key(POD_GROUP_LABEL), "muster's webhook and admission leave it alone");
    assert_eq!(labels.get(JOB_NAME_LABEL).map(String::as_str), Some("train"), "the job still finds it");
    let annotations = pod.metadata.annotations.as_ref().expect("annotations");
    assert!(!annotations.contains_key(ADMISSION_ATTEMPT_ANNOTATION));
    assert_eq!(annotations.get(COMPLETION_INDEX_ANNOTATION).map(String::as_str), Some("0"));
    let spec = pod.spec.as_ref().expect("spec");
    let gates: Vec<&str> = spec.scheduling_gates.iter().flatten().map(|g| g.name.as_str()).collect();
    assert_eq!(gates, vec!["other.example.com/gate"], "only muster's gate goes");
    assert_eq!(spec.scheduling_group.as_ref().and_then(|g| g.pod_group_name.as_deref()), Some("train"));
    // With only muster's gate, no gate list is left at all.
    let mut pod = new_pod(&job, &NewPod { index: Some(1), attempt: 0, ..NewPod::default() }, "train", None, 0);
    native_pod(&mut pod, "train");
    assert_eq!(pod.spec.as_ref().expect("spec").scheduling_gates, None);
}

#[test]
fn the_native_groups_conditions_are_mirrored_and_their_changes_reported() {
    let cond = |t: &str, status: &str, reason: &str| condition_of(t, status, reason, &format!("{t} {reason}"));
    let own = cond(condition::COMPLETE, "False", "Running");
    let unschedulable = cond("PodGroupInitiallyScheduled", "False", "Unschedulable");
    let mut conditions = vec![own.clone()];
    let group = vec![unschedulable.clone(), cond("SomethingElse", "True", "X")];
    let changed = mirror_group_conditions(&mut conditions, &group, &[]);
    assert_eq!(conditions, vec![own.clone(), unschedulable.clone()], "only the mirrored types");
    assert_eq!(changed, vec![unschedulable.clone()]);
    // The same again: nothing to report; a new message alone is not a change.
    let mut again = conditions.clone();
    let mut reworded = unschedulable.clone();
    reworded.message = "0/3 nodes".into();
    assert!(mirror_group_conditions(&mut again, &[reworded.clone()], &conditions).is_empty());
    assert_eq!(again, vec![own.clone(), reworded]);
    // Scheduled: reported; a DisruptionTarget too; a type the group dropped goes.
    let scheduled = cond("PodGroupInitiallyScheduled", "True", "Scheduled");
    let disrupted = cond("DisruptionTarget", "True", "PreemptionByScheduler");
    let mut next = again.clone();
    let changed = mirror_group_conditions(&mut next, &[scheduled.clone(), disrupted.clone()], &again);
    assert_eq!(changed, vec![scheduled.clone(), disrupted.clone()]);
    let mut last = next.clone();
    assert!(mirror_group_conditions(&mut last, std::slice::from_ref(&scheduled), &next).is_empty());
    assert_eq!(last, vec![own, scheduled]);
}

#[test]
fn a_preempted_pod_makes_the_job_a_disruption_target_where_its_group_says_nothing() {
    let cond = condition_of;
    let scheduled = cond("PodGroupInitiallyScheduled", "True", "Scheduled", "");
    let from_group = cond("DisruptionTarget", "True", "PreemptionByScheduler", "the group's own");
    let of = |name: &str| cond("DisruptionTarget", "True", "PreemptionByScheduler", &format!("pod {name}: preempted"));
    let disrupted = |name: &str, phase: Lifecycle, terminating: bool| ObservedPod {
        terminating,
        disruption: Some(Box::new(of(name))),
        ..pod(name, phase, None)
    };
    let running = pod("a", Lifecycle::Running, None);
    // (group, pods) -> the conditions
    let table = [
        (vec![scheduled.clone()], vec![running.clone()], vec![scheduled.clone()]),
        // Preempted pods on their way out: the first by name speaks for the job.
        (
            vec![scheduled.clone()],
            vec![running.clone(), disrupted("c", Lifecycle::Running, true), disrupted("b", Lifecycle::Running, true)],
            vec![scheduled.clone(), of("b")],
        ),
        // The group's own condition wins.
        (
            vec![scheduled.clone(), from_group.clone()],
            vec![disrupted("b", Lifecycle::Running, true)],
            vec![scheduled.clone(), from_group.clone()],
        ),
        // A finished pod (not terminating) says nothing any more; a terminating one still does.
        (vec![], vec![disrupted("b", Lifecycle::Failed, false)], vec![]),
        (vec![], vec![disrupted("b", Lifecycle::Failed, true)], vec![of("b")]),
        (vec![], vec![disrupted("b", Lifecycle::Pending, false)], vec![of("b")]),
    ];
    for (i, (group, pods, want)) in table.into_iter().enumerate() {
        assert_eq!(group_conditions_with_pods(&group, &pods), want, "row {i}");
    }
}

#[test]
fn a_pods_disruption_target_reads_as_the_jobs_condition() {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "w-0", "deletionTimestamp": "2026-12-03T10:00:00Z"},
        "status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
             "message": "high/train: preempting to accommodate a higher priority pod",
             "lastTransitionTime": "2026-12-03T09:59:58Z"}]},
    }))
    .expect("pod");
    let observed = ObservedPod::from_pod(&pod);
    let c = observed.disruption.as_deref().expect("the condition");
    assert_eq!(
        (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
        ("DisruptionTarget", "True", "PreemptionByScheduler")
    );
    assert_eq!(c.message, "pod w-0: high/train: preempting to accommodate a higher priority pod");
    assert_eq!(c.last_transition_time.0.to_string(), "2026-12-03T09:59:58Z");
    let mut calm = pod.clone();
    if let Some(cs) = calm.status.as_mut().and_then(|s| s.conditions.as_mut()) {
        cs[1].status = "False".into();
    }
    assert_eq!(ObservedPod::from_pod(&calm).disruption, None, "only a True condition");
}

#[test]
fn a_mirrored_change_warns_while_the_group_is_unscheduled_or_disrupted() {
    let cond = |t: &str, status: &str| condition_of(t, status, "R", "");
    let table = [
        ("PodGroupInitiallyScheduled", "False", true),
        ("PodGroupInitiallyScheduled", "True", false),
        ("DisruptionTarget", "True", true),
        ("DisruptionTarget", "False", false),
    ];
    for (t, status, want) in table {
        assert_eq!(mirrored_change_is_warning(&cond(t, status)), want, "{t}={status}");
    }
}

/// The pods a pass made, as the next pass sees them (pending, gated).
fn made(p: &JobPlan, pass: usize) -> Vec<ObservedPod> {
    p.create
        .iter()
        .enumerate()
        .map(|(n, new)| ObservedPod { gated: true, ..pod(&format!("p{pass}-{n}"), Lifecycle::Pending, new.index) })
        .collect()
}

#[test]
fn pods_are_planned_one_batch_per_pass() {
    for mode in [CompletionMode::NonIndexed, CompletionMode::Indexed] {
        let s = spec(1_300, Some(2_000), mode);
        let mut pods: Vec<ObservedPod> = Vec::new();
        let mut batches = Vec::new();
        for pass in 0..10 {
            let p = run(&s, &pods);
            assert!(p.delete.is_empty(), "{mode:?}");
            if p.create.is_empty() {
                assert!(!p.more_to_create);
                break;
            }
            batches.push((p.create.len(), p.more_to_create));
            pods.extend(made(&p, pass));
        }
        assert_eq!(batches, vec![(500, true), (500, true), (300, false)], "{mode:?}");
        assert_eq!(pods.len(), 1_300, "{mode:?}");
        if mode == CompletionMode::Indexed {
            let indexes: BTreeSet<i32> = pods.iter().filter_map(|p| p.index).collect();
            assert_eq!(indexes, (0..1_300).collect(), "each index once, lowest first");
        }
    }
}

#[test]
fn a_fifty_million_pod_job_plans_one_batch() {
    // The controller never plans it (it is Invalid); were it planned, it would still be one batch.
    for mode in [CompletionMode::NonIndexed, CompletionMode::Indexed] {
        for n in [50_000_000, i32::MAX] {
            let p = run(&spec(n, Some(n), mode), &[]);
            assert_eq!((p.create.len(), p.more_to_create), (CREATE_PER_PASS, true), "{mode:?} {n}");
            assert_eq!(p.status.active, CREATE_PER_PASS as i32);
            if mode == CompletionMode::Indexed {
                assert_eq!(p.create.last().and_then(|c| c.index), Some(CREATE_PER_PASS as i32 - 1));
            }
        }
    }
}

#[test]
fn a_template_never_gives_pods_musters_own_keys() {
    let mut s = spec(1, Some(1), CompletionMode::Indexed);
    s.template.metadata = Some(
        serde_json::from_value(serde_json::json!({
            "labels": {"scheduling.muster.dev/pod-group": "victim", "batch.muster.dev/job-name": "other",
                       "batch.muster.dev/jobset-name": "someone", "app": "mine", "e2e.muster.dev/gang": "g"},
            "annotations": {"gpu.muster.dev/indices": "0,1,2,3", "gpu.muster.dev/assigned": "x",
                            "scheduling.muster.dev/gang-attempt": "99", "batch.muster.dev/job-completion-index": "7",
                            "muster.dev/version": "1", "sim.muster.dev/succeed-after": "1s", "note": "kept"},
        }))
        .expect("metadata"),
    );
    let mut job = MusterJob::new("train", s);
    job.metadata.uid = Some("uid".into());
    let p = new_pod(&job, &NewPod { index: Some(0), attempt: 1, ..NewPod::default() }, "train", None, 2);
    let labels = p.metadata.labels.expect("labels");
    let annotations = p.metadata.annotations.expect("annotations");
    assert_eq!(
        labels,
        [
            ("app", "mine"),
            (COMPLETION_INDEX_LABEL, "0"),
            (JOB_NAME_LABEL, "train"),
            ("e2e.muster.dev/gang", "g"),
            (POD_GROUP_LABEL, "train"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into_iter()
        .collect::<BTreeMap<_, _>>()
    );
    assert_eq!(
        annotations,
        [
            (COMPLETION_INDEX_ANNOTATION, "0"),
            (GANG_ATTEMPT_ANNOTATION, "1"),
            ("note", "kept"),
            (ADMISSION_ATTEMPT_ANNOTATION, "2"),
            ("sim.muster.dev/succeed-after", "1s"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into_iter()
        .collect::<BTreeMap<_, _>>()
    );
}

#[test]
fn set_labels_are_musters_only_on_a_sets_child() {
    let mut job = MusterJob::new("train", spec(1, Some(1), CompletionMode::NonIndexed));
    job.metadata.labels = Some(BTreeMap::from([
        (JOBSET_NAME_LABEL.to_string(), "victim".to_string()),
        (REPLICATED_JOB_LABEL.to_string(), "workers".to_string()),
    ]));
    assert_eq!(job_labels(&job).keys().collect::<Vec<_>>(), vec![JOB_NAME_LABEL], "a standalone job");
    job.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "batch.muster.dev/v1alpha1".into(),
        kind: "MusterJobSet".into(),
        name: "victim".into(),
        uid: "set-uid".into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    assert_eq!(
        job_labels(&job),
        BTreeMap::from([
            (JOB_NAME_LABEL.to_string(), "train".to_string()),
            (JOBSET_NAME_LABEL.to_string(), "victim".to_string()),
            (REPLICATED_JOB_LABEL.to_string(), "workers".to_string()),
        ]),
        "a set's child"
    );
}

fn arb_phase() -> impl proptest::strategy::Strategy<Value = Lifecycle> {
    use proptest::prelude::*;
    prop_oneof![Just(Lifecycle::Pending), Just(Lifecycle::Running), Just(Lifecycle::Succeeded), Just(Lifecycle::Failed)]
}

fn arb_count() -> impl proptest::strategy::Strategy<Value = i32> {
    use proptest::prelude::*;
    prop_oneof![any::<i32>(), -3..=3i32, 99_998..=100_002i32, Just(i32::MAX), Just(i32::MIN), Just(50_000_000)]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 512, ..Default::default() })]

    #[test]
    fn any_counts_plan_one_bounded_batch_without_panic(
        parallelism in arb_count(),
        completions in proptest::option::of(arb_count()),
        indexed in proptest::prelude::any::<bool>(),
        gang_all in proptest::prelude::any::<bool>(),
        backoff in arb_count(),
        observed in proptest::collection::vec(
            (arb_phase(), proptest::option::of(arb_count()), 0..4i32, proptest::prelude::any::<bool>()), 0..12),
        recorded in proptest::option::of("([0-9]{1,10}(-[0-9]{1,10})?,){0,3}"),
        prev_failed in arb_count(),
        prev_succeeded in arb_count(),
    ) {
        let mode = if indexed { CompletionMode::Indexed } else { CompletionMode::NonIndexed };
        let mut s = spec(parallelism, completions, mode);
        s.backoff_limit = Some(backoff);
        let pods: Vec<ObservedPod> = observed
            .iter()
            .enumerate()
            .map(|(i, (phase, index, attempt, terminating))| ObservedPod {
                attempt: *attempt,
                terminating: *terminating,
                ..pod(&format!("p{i}"), *phase, *index)
            })
            .collect();
        let prev = MusterJobStatus {
            completed_indexes: recorded,
            failed: prev_failed,
            succeeded: prev_succeeded,
            ..Default::default()
        };
        let p = plan("ns", &s, Some(1), &prev, &pods, gang_all, now());
        proptest::prop_assert!(p.create.len() <= CREATE_PER_PASS);
        proptest::prop_assert!(!p.more_to_create || p.create.len() == CREATE_PER_PASS);
        let end = super::completions(&s).min(crate::workloadbuilder::job::MAX_JOB_PODS as i32);
        let mut seen = BTreeSet::new();
        for new in &p.create {
            match (mode, new.index) {
                (CompletionMode::Indexed, Some(i)) => {
                    proptest::prop_assert!((0..end).contains(&i), "index {} of {}", i, end);
                    proptest::prop_assert!(seen.insert(i), "index {} twice", i);
                    proptest::prop_assert!(
                        !pods.iter().any(|o| o.index == Some(i) && !o.terminating && !o.phase.is_terminal()),
                        "index {} is running already", i
                    );
                }
                (CompletionMode::NonIndexed, None) => {}
                other => proptest::prop_assert!(false, "{:?}", other),
            }
        }
        if let Some(text) = &p.status.completed_indexes {
            proptest::prop_assert!(parse_indexes(text, end).len() <= end.max(0) as usize);
        }
    }
}

/// The batch/v1 rules muster added for Kubernetes 1.37's JobSpec, one table each.
mod semantics;

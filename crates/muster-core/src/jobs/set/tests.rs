use super::*;
use crate::workloadbuilder::native::SchedulingApi;
use muster_api::batch::CompletionMode;
use muster_api::batch::{FailurePolicy, SuccessPolicy};
use muster_api::{
    GROUP_TEMPLATE_ANNOTATION, JOBSET_NAME_LABEL, PARENT_COMPOSITE_ANNOTATION, SCHEDULING_API_ANNOTATION,
};

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
    let failed = phase == Some(JobPhase::Failed);
    let complete = phase == Some(JobPhase::Complete);
    ObservedChild {
        name: name.into(),
        replicated_job: rjob.into(),
        attempt,
        phase,
        terminating: false,
        ready: false,
        active: !failed && !complete,
        complete,
        failure: failed.then(|| ChildFailure {
            reason: "BackoffLimitExceeded".into(),
            message: "Job has reached the specified backoff limit".into(),
            at: Some(Timestamp::from_second(500).expect("ts")),
        }),
        suspended: false,
        parallelism: 1,
        completions: Some(1),
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
    let failed = conditions::get(&p.status.conditions, condition::FAILED).expect("Failed");
    assert_eq!(
        (failed.reason.as_str(), failed.message.as_str()),
        ("ReachedMaxRestarts", "jobset failed due to reaching max number of restarts (first failed job: s-a-0)")
    );
    assert_eq!((p.status.restarts, p.status.restarts_count_towards_max), (1, 1));
    assert_eq!(p.status.terminal_state.as_deref(), Some("Failed"));
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
    let mut s = set(true, &[("driver", 1), ("workers", 2), ("ps", 1)]);
    s.spec.replicated_jobs[0].template.spec.completions = Some(1);
    s.spec.replicated_jobs[0].template.spec.completion_mode = Some(CompletionMode::Indexed);
    s.spec.replicated_jobs[2].template.spec.completion_mode = Some(CompletionMode::NonIndexed);
    let mode = |r: usize| child_job(&s, r, 0, 0, SchedulingApi::Muster).expect("child").spec.completion_mode;
    assert_eq!(mode(0), Some(CompletionMode::Indexed), "said Indexed");
    assert_eq!(mode(1), Some(CompletionMode::Indexed), "unset: Indexed, as JobSet's webhook defaults it");
    assert_eq!(mode(2), Some(CompletionMode::NonIndexed), "said NonIndexed: kept");
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
    (current.parallelism, current.completions, current.min_count) = (3, Some(3), Some(2));
    let kids = [
        child("s-a-0", "a", Some(JobPhase::Running), 0),
        current,
        child("s-b-0", "b", Some(JobPhase::Running), 0),
        child("s-a-2", "a", Some(JobPhase::Complete), 0),
    ];
    let p = plan(&s, &kids, now());
    assert_eq!(
        p.resize,
        vec![Resize { child: "s-a-0".into(), parallelism: 3, completions: Some(3), min_count: Some(2), gang: true }],
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

// ---- JobSet v1alpha2 semantics ----

use muster_api::batch::{
    DependsOn, DependsOnStatus, FailurePolicyAction, FailurePolicyRule, Network, RestartStrategy, StartupPolicy,
    StartupPolicyOrder,
};

fn failed(name: &str, rjob: &str, reason: &str, message: &str, at: i64) -> ObservedChild {
    let mut c = child(name, rjob, Some(JobPhase::Failed), 0);
    c.failure = Some(ChildFailure {
        reason: reason.into(),
        message: message.into(),
        at: Some(Timestamp::from_second(at).expect("ts")),
    });
    c
}

fn rule(
    name: &str,
    action: FailurePolicyAction,
    reasons: &[&str],
    patterns: &[&str],
    targets: &[&str],
) -> FailurePolicyRule {
    let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
    FailurePolicyRule {
        name: name.into(),
        action,
        on_job_failure_reasons: own(reasons),
        on_job_failure_message_patterns: own(patterns),
        target_replicated_jobs: own(targets),
    }
}

fn policy(max_restarts: i32, rules: Vec<FailurePolicyRule>) -> Option<FailurePolicy> {
    Some(FailurePolicy { max_restarts, restart_strategy: None, rules })
}

#[test]
fn failure_policy_as_jobset_decides_it() {
    use FailurePolicyAction::*;
    let restart = |counts: bool, reason: &str, event: &'static str, msg: &str| Outcome::Restart {
        counts,
        condition_reason: reason.into(),
        event_reason: event,
        message: msg.into(),
    };
    let fail = |reason: &'static str, msg: &str| Outcome::Fail { reason, message: msg.into() };
    let bl = failed("s-w-1", "w", "BackoffLimitExceeded", "Job has reached the specified backoff limit", 20);
    let pfp = failed(
        "s-l-0",
        "l",
        "PodFailurePolicy",
        "Container main for pod ns/p failed with exit code 42 matching FailJob rule at index 0",
        30,
    );
    let early = failed("s-w-0", "w", "BackoffLimitExceeded", "Job has reached the specified backoff limit", 10);
    type Row<'a> = (&'a str, Option<FailurePolicy>, i32, Vec<&'a ObservedChild>, Outcome);
    let rows: Vec<Row<'_>> = vec![
        (
            "no policy: the set fails",
            None,
            0,
            vec![&bl],
            fail("FailedJobs", "jobset failed due to one or more job failures (first failed job: s-w-1)"),
        ),
        (
            "no policy: names the earliest failure",
            None,
            0,
            vec![&bl, &early],
            fail("FailedJobs", "jobset failed due to one or more job failures (first failed job: s-w-0)"),
        ),
        (
            "no rules: RestartJobSet",
            policy(2, vec![]),
            1,
            vec![&bl],
            restart(
                true,
                "DefaultFailurePolicy",
                "RestartJobSetFailurePolicyAction",
                "applying RestartJobSet failure policy action (first failed job: s-w-1)",
            ),
        ),
        (
            "no rules, max reached",
            policy(2, vec![]),
            2,
            vec![&bl],
            fail(
                "ReachedMaxRestarts",
                "jobset failed due to reaching max number of restarts (first failed job: s-w-1)",
            ),
        ),
        (
            "FailJobSet on a reason",
            policy(5, vec![rule("fatal", FailJobSet, &["PodFailurePolicy"], &[], &[])]),
            0,
            vec![&bl, &pfp],
            fail(
                "FailJobSetFailurePolicyAction",
                "applying FailJobSet failure policy action (first failed job: s-l-0)",
            ),
        ),
        (
            "reason not matched: default",
            policy(5, vec![rule("fatal", FailJobSet, &["DeadlineExceeded"], &[], &[])]),
            0,
            vec![&bl],
            restart(
                true,
                "DefaultFailurePolicy",
                "RestartJobSetFailurePolicyAction",
                "applying RestartJobSet failure policy action (first failed job: s-w-1)",
            ),
        ),
        (
            "target another replicatedJob: default",
            policy(5, vec![rule("leader", FailJobSet, &[], &[], &["l"])]),
            0,
            vec![&bl],
            restart(
                true,
                "DefaultFailurePolicy",
                "RestartJobSetFailurePolicyAction",
                "applying RestartJobSet failure policy action (first failed job: s-w-1)",
            ),
        ),
        (
            "target its replicatedJob",
            policy(5, vec![rule("leader", FailJobSet, &[], &[], &["l"])]),
            0,
            vec![&bl, &pfp],
            fail(
                "FailJobSetFailurePolicyAction",
                "applying FailJobSet failure policy action (first failed job: s-l-0)",
            ),
        ),
        (
            "message pattern (RE2)",
            policy(0, vec![rule("exit42", RestartJobSetAndIgnoreMaxRestarts, &[], &[r"exit code \d+ matching"], &[])]),
            9,
            vec![&bl, &pfp],
            restart(
                false,
                "FailurePolicy_exit42",
                "RestartJobSetAndIgnoreMaxRestartsFailurePolicyAction",
                "applying RestartJobSetAndIgnoreMaxRestarts failure policy action (first failed job: s-l-0)",
            ),
        ),
        (
            "pattern not matched",
            policy(0, vec![rule("exit7", FailJobSet, &[], &["exit code 7 "], &[])]),
            0,
            vec![&pfp],
            fail(
                "ReachedMaxRestarts",
                "jobset failed due to reaching max number of restarts (first failed job: s-l-0)",
            ),
        ),
        (
            "an invalid pattern matches nothing",
            policy(1, vec![rule("bad", FailJobSet, &[], &["(exit"], &[])]),
            0,
            vec![&pfp],
            restart(
                true,
                "DefaultFailurePolicy",
                "RestartJobSetFailurePolicyAction",
                "applying RestartJobSet failure policy action (first failed job: s-l-0)",
            ),
        ),
        (
            "the first rule wins",
            policy(
                1,
                vec![
                    rule("first", RestartJobSet, &["BackoffLimitExceeded"], &[], &[]),
                    rule("second", FailJobSet, &[], &[], &[]),
                ],
            ),
            0,
            vec![&pfp, &bl],
            restart(
                true,
                "FailurePolicy_first",
                "RestartJobSetFailurePolicyAction",
                "applying RestartJobSet failure policy action (first failed job: s-w-1)",
            ),
        ),
        (
            "a rule's earliest child",
            policy(1, vec![rule("bl", FailJobSet, &["BackoffLimitExceeded"], &[], &[])]),
            0,
            vec![&pfp, &bl, &early],
            fail(
                "FailJobSetFailurePolicyAction",
                "applying FailJobSet failure policy action (first failed job: s-w-0)",
            ),
        ),
        (
            "RestartJobSet rule at max",
            policy(1, vec![rule("r", RestartJobSet, &[], &[], &[])]),
            1,
            vec![&bl],
            fail(
                "ReachedMaxRestarts",
                "jobset failed due to reaching max number of restarts (first failed job: s-w-1)",
            ),
        ),
        (
            "ignore max never fails",
            policy(0, vec![rule("r", RestartJobSetAndIgnoreMaxRestarts, &[], &[], &[])]),
            100,
            vec![&bl],
            restart(
                false,
                "FailurePolicy_r",
                "RestartJobSetAndIgnoreMaxRestartsFailurePolicyAction",
                "applying RestartJobSetAndIgnoreMaxRestarts failure policy action (first failed job: s-w-1)",
            ),
        ),
    ];
    for (what, policy, rctm, kids, want) in rows {
        assert_eq!(failure::decide(policy.as_ref(), rctm, &kids), Some(want), "{what}");
    }
    assert_eq!(failure::decide(None, 0, &[]), None, "nothing failed");
}

#[test]
fn message_patterns_are_searched_as_go_regexp_does() {
    let rows = [
        ("exit code 42", "failed with exit code 42 matching", true),
        (r"^failed with exit code \d+", "failed with exit code 42 matching", true),
        (r"^exit", "failed with exit code 42", false),
        ("(?i)EXIT", "exit", true),
        ("", "anything", true),
        ("(", "(", false),
    ];
    for (pattern, message, want) in rows {
        assert_eq!(failure::message_matches(pattern, message), want, "{pattern:?} on {message:?}");
    }
}

#[test]
fn restarts_count_towards_max_only_for_restart_jobset() {
    let mut s = set(false, &[("a", 1)]);
    s.spec.failure_policy =
        policy(0, vec![rule("always", FailurePolicyAction::RestartJobSetAndIgnoreMaxRestarts, &[], &[], &[])]);
    for attempt in 0..3 {
        let p = plan(
            &s,
            &[failed("s-a-0", "a", "BackoffLimitExceeded", "m", 1)].map(|mut c| {
                c.attempt = attempt;
                c
            }),
            now(),
        );
        assert_eq!((p.status.restarts, p.status.restarts_count_towards_max), (attempt + 1, 0));
        assert_eq!(p.delete, vec![("s-a-0".to_string(), "Restart")]);
        let restarting = conditions::get(&p.status.conditions, condition::RESTARTING).expect("RestartingJobSet");
        assert_eq!((restarting.status.as_str(), restarting.reason.as_str()), ("True", "FailurePolicy_always"));
        assert!(p.events.iter().any(|(w, r, _)| *w && r == "RestartJobSetAndIgnoreMaxRestartsFailurePolicyAction"));
        assert!(!conditions::is_true(&p.status.conditions, condition::FAILED));
        s.status = Some(p.status);
    }
    // The new attempt's children all ready: no longer restarting.
    let mut a = child("s-a-0", "a", Some(JobPhase::Running), 3);
    a.ready = true;
    let p = plan(&s, &[a], now());
    let restarting = conditions::get(&p.status.conditions, condition::RESTARTING).expect("RestartingJobSet");
    assert_eq!((restarting.status.as_str(), restarting.reason.as_str()), ("False", "JobsReady"));
}

#[test]
fn blocking_recreate_waits_for_every_old_child() {
    for (strategy, want) in [(RestartStrategy::Recreate, vec![(1, 0)]), (RestartStrategy::BlockingRecreate, vec![])] {
        let mut s = set(false, &[("a", 1), ("b", 1)]);
        s.spec.failure_policy =
            Some(FailurePolicy { max_restarts: 3, restart_strategy: Some(strategy), rules: vec![] });
        s.status = Some(MusterJobSetStatus { restarts: 1, restarts_count_towards_max: 1, ..Default::default() });
        let mut old = child("s-a-0", "a", Some(JobPhase::Running), 0);
        old.terminating = true;
        let p = plan(&s, &[old], now());
        assert_eq!(p.create, want, "{strategy:?}: s-b-0 is free, s-a-0 is not");
    }
}

fn ordered(rjobs: &[(&str, i32)]) -> MusterJobSet {
    let mut s = set(false, rjobs);
    s.spec.startup_policy = Some(StartupPolicy { startup_policy_order: StartupPolicyOrder::InOrder });
    s
}

fn ready(name: &str, rjob: &str) -> ObservedChild {
    let mut c = child(name, rjob, Some(JobPhase::Running), 0);
    c.ready = true;
    c
}

#[test]
fn in_order_startup_creates_one_replicated_job_after_another() {
    let mut s = ordered(&[("leader", 1), ("workers", 2), ("ps", 1)]);
    let cond =
        |p: &SetPlan, t: &str| conditions::get(&p.status.conditions, t).map(|c| (c.status.clone(), c.reason.clone()));
    let in_progress = Some(("True".to_string(), "InOrderStartupPolicyInProgress".to_string()));
    // Nothing yet: the leader only.
    let p = plan(&s, &[], now());
    assert_eq!(p.create, vec![(0, 0)]);
    assert_eq!(cond(&p, condition::STARTUP_IN_PROGRESS), in_progress);
    s.status = Some(p.status);
    // The leader exists, not ready: nothing more.
    let p = plan(&s, &[child("s-leader-0", "leader", Some(JobPhase::Running), 0)], now());
    assert!(p.create.is_empty());
    // Ready: the workers, not the ps.
    let p = plan(&s, &[ready("s-leader-0", "leader")], now());
    assert_eq!(p.create, vec![(1, 0), (1, 1)]);
    // One worker ready, one failed-free but not ready: wait.
    let kids =
        [ready("s-leader-0", "leader"), ready("s-workers-0", "workers"), child("s-workers-1", "workers", None, 0)];
    assert!(plan(&s, &kids, now()).create.is_empty());
    // A succeeded leader counts as started too.
    let kids = [
        child("s-leader-0", "leader", Some(JobPhase::Complete), 0),
        ready("s-workers-0", "workers"),
        ready("s-workers-1", "workers"),
    ];
    let p = plan(&s, &kids, now());
    assert_eq!(p.create, vec![(2, 0)]);
    s.status = Some(p.status);
    let kids = [
        ready("s-leader-0", "leader"),
        ready("s-workers-0", "workers"),
        ready("s-workers-1", "workers"),
        ready("s-ps-0", "ps"),
    ];
    let p = plan(&s, &kids, now());
    assert!(p.create.is_empty());
    assert_eq!(cond(&p, condition::STARTUP_COMPLETED), Some(("True".into(), "InOrderStartupPolicyCompleted".into())));
    assert_eq!(cond(&p, condition::STARTUP_IN_PROGRESS).map(|c| c.0), Some("False".into()), "exclusive");
    let msg = conditions::get(&p.status.conditions, condition::STARTUP_COMPLETED).map(|c| c.message.clone());
    assert_eq!(msg.as_deref(), Some("in order startup policy has completed"));
    // A suspended set creates every child at once (suspended), and says nothing of the order.
    let mut s = ordered(&[("leader", 1), ("workers", 2)]);
    s.spec.suspend = true;
    let p = plan(&s, &[], now());
    assert_eq!(p.create, vec![(0, 0), (1, 0), (1, 1)]);
    assert!(cond(&p, condition::STARTUP_IN_PROGRESS).is_none());
}

#[test]
fn depends_on_waits_for_ready_or_complete() {
    for (status, kids, want) in [
        (DependsOnStatus::Ready, vec![child("s-a-0", "a", Some(JobPhase::Running), 0), ready("s-a-1", "a")], false),
        (DependsOnStatus::Ready, vec![ready("s-a-0", "a"), child("s-a-1", "a", Some(JobPhase::Complete), 0)], true),
        (DependsOnStatus::Ready, vec![ready("s-a-0", "a")], false),
        (DependsOnStatus::Complete, vec![ready("s-a-0", "a"), child("s-a-1", "a", Some(JobPhase::Complete), 0)], false),
        (
            DependsOnStatus::Complete,
            vec![child("s-a-0", "a", Some(JobPhase::Complete), 0), child("s-a-1", "a", Some(JobPhase::Complete), 0)],
            true,
        ),
    ] {
        let mut s = set(false, &[("a", 2), ("b", 1), ("c", 1)]);
        s.spec.replicated_jobs[1].depends_on = vec![DependsOn { name: "a".into(), status }];
        let p = plan(&s, &kids, now());
        let mut expect: Vec<(usize, i32)> =
            (0..2).filter(|i| !kids.iter().any(|k| k.name == format!("s-a-{i}"))).map(|i| (0, i)).collect();
        if want {
            expect.push((1, 0));
        }
        expect.push((2, 0));
        assert_eq!(
            p.create,
            expect,
            "{status:?} with {:?}",
            kids.iter().map(|k| (&k.name, k.phase, k.ready)).collect::<Vec<_>>()
        );
    }
}

#[test]
fn a_resumed_set_runs_its_startup_sequence_again() {
    let mut s = ordered(&[("leader", 1), ("workers", 1)]);
    s.spec.suspend = true;
    let suspended = |name: &str, rjob: &str| {
        let mut c = child(name, rjob, Some(JobPhase::Suspended), 0);
        (c.suspended, c.active) = (true, false);
        c
    };
    let kids = [suspended("s-leader-0", "leader"), suspended("s-workers-0", "workers")];
    let p = plan(&s, &kids, now());
    let c = conditions::get(&p.status.conditions, condition::SUSPENDED).expect("Suspended");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
        ("True", "SuspendedJobs", "jobset is suspended")
    );
    assert_eq!(p.status.replicated_jobs_status[0].suspended, 1);
    s.status = Some(p.status);
    s.spec.suspend = false;
    // The leader first; the set stays Suspended until every replicatedJob is resumed.
    let p = plan(&s, &kids, now());
    assert_eq!(p.suspend, vec![("s-leader-0".to_string(), false)]);
    assert!(conditions::is_true(&p.status.conditions, condition::SUSPENDED));
    assert!(conditions::is_true(&p.status.conditions, condition::STARTUP_IN_PROGRESS));
    s.status = Some(p.status);
    let kids = [ready("s-leader-0", "leader"), suspended("s-workers-0", "workers")];
    let p = plan(&s, &kids, now());
    assert_eq!(p.suspend, vec![("s-workers-0".to_string(), false)]);
    s.status = Some(p.status);
    let kids = [ready("s-leader-0", "leader"), ready("s-workers-0", "workers")];
    let p = plan(&s, &kids, now());
    let c = conditions::get(&p.status.conditions, condition::SUSPENDED).expect("Suspended");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
        ("False", "ResumeJobs", "jobset is resumed")
    );
    // A set never suspended shows no Suspended condition at all (JobSet adds only true ones).
    let p = plan(&set(false, &[("a", 1)]), &[], now());
    assert!(conditions::get(&p.status.conditions, condition::SUSPENDED).is_none());
}

#[test]
fn success_policy_as_jobset_counts_it() {
    let done = |n: &str, r: &str| child(n, r, Some(JobPhase::Complete), 0);
    let run = |n: &str, r: &str| child(n, r, Some(JobPhase::Running), 0);
    let rows: Vec<(SuccessOperator, Vec<&str>, Vec<ObservedChild>, bool)> = vec![
        (SuccessOperator::All, vec![], vec![done("s-a-0", "a"), done("s-a-1", "a"), run("s-b-0", "b")], false),
        (SuccessOperator::All, vec!["a"], vec![done("s-a-0", "a"), done("s-a-1", "a"), run("s-b-0", "b")], true),
        (SuccessOperator::Any, vec!["b"], vec![done("s-a-0", "a"), run("s-b-0", "b")], false),
        (SuccessOperator::Any, vec![], vec![done("s-a-0", "a"), run("s-b-0", "b")], true),
        (SuccessOperator::Any, vec!["b"], vec![run("s-a-0", "a"), done("s-b-0", "b")], true),
    ];
    for (operator, targets, kids, want) in rows {
        let mut s = set(false, &[("a", 2), ("b", 1)]);
        s.spec.success_policy =
            Some(SuccessPolicy { operator, target_replicated_jobs: targets.iter().map(|t| t.to_string()).collect() });
        let p = plan(&s, &kids, now());
        assert_eq!(conditions::is_true(&p.status.conditions, condition::COMPLETED), want, "{operator:?} {targets:?}");
        if want {
            let c = conditions::get(&p.status.conditions, condition::COMPLETED).expect("Completed");
            assert_eq!((c.reason.as_str(), c.message.as_str()), ("AllJobsCompleted", "jobset completed successfully"));
            assert_eq!(p.status.terminal_state.as_deref(), Some("Completed"));
            let active: Vec<&str> = kids.iter().filter(|k| !k.finished()).map(|k| k.name.as_str()).collect();
            let deleted: Vec<&str> = p.delete.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(deleted, active, "the active children go");
        }
    }
    // With no child succeeded, a set of no replicas does not complete (JobSet checks the
    // success policy only once a child succeeded).
    let p = plan(&set(false, &[("a", 0)]), &[], now());
    assert!(!conditions::is_true(&p.status.conditions, condition::COMPLETED));
}

#[test]
fn a_finished_set_is_deleted_ttl_seconds_after_it_finished() {
    let mut s = set(false, &[("a", 1)]);
    s.spec.ttl_seconds_after_finished = Some(10);
    // Finishes now: looked at again in 10 s.
    let p = plan(&s, &[child("s-a-0", "a", Some(JobPhase::Complete), 0)], now());
    assert_eq!((p.delete_set, p.requeue_after), (false, Some(Duration::from_secs(10))));
    s.status = Some(p.status);
    let at = |secs: i64| Timestamp::from_second(now().as_second() + secs).expect("ts");
    let p = plan(&s, &[child("s-a-0", "a", Some(JobPhase::Complete), 0)], at(3));
    assert_eq!((p.delete_set, p.requeue_after), (false, Some(Duration::from_secs(7))));
    let p = plan(&s, &[], at(10));
    assert_eq!((p.delete_set, p.requeue_after), (true, None));
    // No TTL: kept.
    s.spec.ttl_seconds_after_finished = None;
    let p = plan(&s, &[], at(1000));
    assert_eq!((p.delete_set, p.requeue_after), (false, None));
}

#[test]
fn replicated_job_status_counts_as_jobset_does() {
    let s = set(false, &[("a", 5)]);
    let mut suspended = child("s-a-3", "a", Some(JobPhase::Suspended), 0);
    (suspended.suspended, suspended.active) = (true, false);
    let mut gated = child("s-a-4", "a", Some(JobPhase::Pending), 0);
    gated.active = true;
    let kids = [
        ready("s-a-0", "a"),
        child("s-a-1", "a", Some(JobPhase::Complete), 0),
        child("s-a-2", "a", Some(JobPhase::Failed), 0),
        suspended,
        gated,
    ];
    // One failed child: the set (no failure policy) fails and deletes the active ones; count
    // before that from a set with a policy that restarts nothing yet.
    let counts = replicated_job_statuses(&s.spec, &kids.iter().collect::<Vec<_>>());
    let r = &counts["a"];
    assert_eq!((r.ready, r.succeeded, r.failed, r.active, r.suspended), (1, 1, 1, 2, 1));
}

#[test]
fn a_childs_ready_is_jobsets_ready() {
    let job = |parallelism: i32, completions: Option<i32>, ready: i32, succeeded: i32| -> MusterJob {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "batch.muster.dev/v1alpha1", "kind": "MusterJob",
            "metadata": {"name": "s-a-0", "labels": {"batch.muster.dev/replicatedjob-name": "a"},
                         "annotations": {"batch.muster.dev/restart-attempt": "2"}},
            "spec": {"parallelism": parallelism, "completions": completions,
                     "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}},
            "status": {"ready": ready, "succeeded": succeeded, "active": ready}
        }))
        .expect("job")
    };
    for (p, c, r, s, want) in [
        (3, None, 3, 0, true),
        (3, None, 2, 0, false),
        (3, Some(2), 1, 1, true),
        (3, Some(2), 1, 0, false),
        (1, Some(4), 0, 1, true),
    ] {
        let o = ObservedChild::from_job(&job(p, c, r, s));
        assert_eq!(o.ready, want, "parallelism {p} completions {c:?} ready {r} succeeded {s}");
        assert_eq!((o.attempt, o.replicated_job.as_str(), o.failure.is_none()), (2, "a", true));
    }
    // The Failed condition gives the failure its reason, message and time.
    let mut j = job(1, None, 0, 0);
    j.status.as_mut().expect("status").conditions = vec![cond("Failed", "True", "PodFailurePolicy", "exit 42", 77)];
    let o = ObservedChild::from_job(&j);
    assert_eq!(
        o.failure,
        Some(ChildFailure {
            reason: "PodFailurePolicy".into(),
            message: "exit 42".into(),
            at: Some(Timestamp::from_second(77).expect("ts"))
        })
    );
    assert!(o.finished() && !o.complete);
}

#[test]
fn children_carry_jobsets_labels_and_annotations() {
    let mut s = set(false, &[("leader", 1), ("workers", 3), ("ps", 2)]);
    s.spec.replicated_jobs[1].group_name = Some("train".into());
    s.spec.replicated_jobs[2].group_name = Some("train".into());
    s.spec.coordinator =
        Some(muster_api::batch::Coordinator { replicated_job: "leader".into(), job_index: 0, pod_index: 0 });
    let c = child_job(&s, 2, 1, 4, SchedulingApi::Muster).expect("child");
    let want = [
        ("jobset.sigs.k8s.io/jobset-name", "s"),
        ("jobset.sigs.k8s.io/jobset-uid", "u1"),
        ("jobset.sigs.k8s.io/replicatedjob-name", "ps"),
        ("jobset.sigs.k8s.io/replicatedjob-replicas", "2"),
        ("jobset.sigs.k8s.io/global-replicas", "6"),
        ("jobset.sigs.k8s.io/job-index", "1"),
        ("jobset.sigs.k8s.io/job-global-index", "5"),
        ("jobset.sigs.k8s.io/restart-attempt", "4"),
        ("jobset.sigs.k8s.io/group-name", "train"),
        ("jobset.sigs.k8s.io/group-replicas", "5"),
        ("jobset.sigs.k8s.io/job-group-index", "4"),
        ("jobset.sigs.k8s.io/coordinator", "s-leader-0-0.s"),
    ];
    let labels = c.metadata.labels.clone().expect("labels");
    let annotations = c.metadata.annotations.clone().expect("annotations");
    let tmeta = c.spec.template.metadata.clone().expect("template metadata");
    for (k, v) in want {
        assert_eq!(labels.get(k).map(String::as_str), Some(v), "label {k}");
        assert_eq!(annotations.get(k).map(String::as_str), Some(v), "annotation {k}");
        assert_eq!(tmeta.labels.as_ref().and_then(|l| l.get(k)).map(String::as_str), Some(v), "pod label {k}");
        assert_eq!(
            tmeta.annotations.as_ref().and_then(|l| l.get(k)).map(String::as_str),
            Some(v),
            "pod annotation {k}"
        );
    }
    // muster's own keys stay.
    assert_eq!(labels.get(JOBSET_NAME_LABEL).map(String::as_str), Some("s"));
    assert_eq!(annotations.get(RESTART_ATTEMPT_ANNOTATION).map(String::as_str), Some("4"));
    // The default group.
    let leader = child_job(&s, 0, 0, 0, SchedulingApi::Muster).expect("child");
    let l = leader.metadata.labels.expect("labels");
    assert_eq!(
        (
            l["jobset.sigs.k8s.io/group-name"].as_str(),
            l["jobset.sigs.k8s.io/group-replicas"].as_str(),
            l["jobset.sigs.k8s.io/job-group-index"].as_str()
        ),
        ("default", "1", "0")
    );
}

#[test]
fn network_sets_the_pods_subdomain_and_the_coordinators_name() {
    let rows: Vec<(Option<Network>, Option<&str>, &str)> = vec![
        (None, Some("s"), "s-leader-0-1.s"),
        (Some(Network { subdomain: Some("net".into()), ..Default::default() }), Some("net"), "s-leader-0-1.net"),
        (Some(Network { enable_dns_hostnames: Some(false), ..Default::default() }), None, "s-leader-0-1.s"),
    ];
    for (network, pods, coordinator) in rows {
        let mut s = set(false, &[("leader", 1)]);
        s.spec.network = network.clone();
        s.spec.coordinator =
            Some(muster_api::batch::Coordinator { replicated_job: "leader".into(), job_index: 0, pod_index: 1 });
        let c = child_job(&s, 0, 0, 0, SchedulingApi::Muster).expect("child");
        let sub = c.spec.template.spec.as_ref().and_then(|p| p.subdomain.clone());
        assert_eq!(sub.as_deref(), pods, "{network:?}");
        assert_eq!(coordinator_endpoint(&s).as_deref(), Some(coordinator));
        assert_eq!(dns_hostnames(&s.spec), pods.is_some());
    }
    assert!(publish_not_ready_addresses(&set(false, &[("a", 1)]).spec));
}

#[test]
fn a_suspended_set_makes_suspended_children_whatever_the_template_says() {
    let mut s = set(false, &[("a", 1)]);
    s.spec.replicated_jobs[0].template.spec.suspend = true;
    assert!(!child_job(&s, 0, 0, 0, SchedulingApi::Muster).expect("child").spec.suspend);
    s.spec.suspend = true;
    assert!(child_job(&s, 0, 0, 0, SchedulingApi::Muster).expect("child").spec.suspend);
}

#[test]
fn completions_follow_parallelism_only_where_the_template_leaves_both_unset() {
    let mut s = set(false, &[("elastic", 1), ("fixed", 1), ("plain", 1)]);
    for r in &mut s.spec.replicated_jobs {
        r.template.spec.parallelism = 4;
    }
    s.spec.replicated_jobs[1].template.spec.completions = Some(8);
    s.spec.replicated_jobs[2].template.spec.completion_mode = Some(CompletionMode::NonIndexed);
    // Each child as made from its template before the resize (parallelism 2).
    let kids: Vec<ObservedChild> = [("elastic", Some(2)), ("fixed", Some(8)), ("plain", None)]
        .into_iter()
        .map(|(r, completions)| ObservedChild {
            parallelism: 2,
            completions,
            ..child(&format!("s-{r}-0"), r, Some(JobPhase::Running), 0)
        })
        .collect();
    let p = plan(&s, &kids, now());
    let shown: Vec<(&str, i32, Option<i32>)> =
        p.resize.iter().map(|r| (r.child.as_str(), r.parallelism, r.completions)).collect();
    assert_eq!(shown, [("s-elastic-0", 4, Some(4)), ("s-fixed-0", 4, None), ("s-plain-0", 4, None)]);
    // A child made now: Indexed with completions = parallelism only for the elastic template.
    let made = |r: usize| child_job(&s, r, 0, 0, SchedulingApi::Muster).expect("child").spec;
    assert_eq!((made(0).completion_mode, made(0).completions), (Some(CompletionMode::Indexed), Some(4)));
    assert_eq!((made(1).completion_mode, made(1).completions), (Some(CompletionMode::Indexed), Some(8)));
    assert_eq!((made(2).completion_mode, made(2).completions), (Some(CompletionMode::NonIndexed), None));
}

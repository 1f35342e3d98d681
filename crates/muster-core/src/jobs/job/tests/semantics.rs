//! Tables of batch/v1's rules: podFailurePolicy, backoffLimitPerIndex and maxFailedIndexes,
//! successPolicy, the terminal conditions, podReplacementPolicy, elastic Indexed jobs, deleted
//! pods, the tracking finalizer and a set's keys on the pods.

use super::*;
use muster_api::batch::{
    JobSuccessPolicy, JobSuccessPolicyRule, PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement,
    PodFailurePolicyOnPodConditionsPattern, PodFailurePolicyRule,
};

fn on_exit(action: &str, container: Option<&str>, operator: &str, values: &[i32]) -> PodFailurePolicyRule {
    PodFailurePolicyRule {
        action: action.into(),
        on_exit_codes: Some(PodFailurePolicyOnExitCodesRequirement {
            container_name: container.map(str::to_string),
            operator: operator.into(),
            values: values.to_vec(),
        }),
        on_pod_conditions: None,
    }
}

fn on_condition(action: &str, type_: &str, status: Option<&str>) -> PodFailurePolicyRule {
    PodFailurePolicyRule {
        action: action.into(),
        on_exit_codes: None,
        on_pod_conditions: Some(vec![PodFailurePolicyOnPodConditionsPattern {
            type_: type_.into(),
            status: status.map(str::to_string),
        }]),
    }
}

fn policy(rules: Vec<PodFailurePolicyRule>) -> PodFailurePolicy {
    PodFailurePolicy { rules }
}

/// A failed pod whose containers ended with these codes and that has these conditions.
fn ended(name: &str, index: Option<i32>, codes: &[(&str, i32)], conditions: &[(&str, &str)]) -> ObservedPod {
    ObservedPod {
        exit_codes: codes.iter().map(|(n, c)| (n.to_string(), *c)).collect(),
        conditions: conditions.iter().map(|(t, s)| (t.to_string(), s.to_string())).collect(),
        ..pod(name, Lifecycle::Failed, index)
    }
}

#[test]
fn pod_failure_policy_rules_match_in_order_as_batch_v1() {
    let fail_42 = on_exit("FailJob", None, "In", &[42]);
    let ignore_disrupted = on_condition("Ignore", "DisruptionTarget", None);
    let main_not_0_1 = on_exit("Count", Some("main"), "NotIn", &[0, 1]);
    // (rules, pod, expected action, expected message)
    let m42 = "Container main for pod ns/p failed with exit code 42 matching FailJob rule at index 0";
    type Row<'a> = (Vec<PodFailurePolicyRule>, ObservedPod, Option<Action>, Option<&'a str>);
    let table: Vec<Row> = vec![
        (vec![fail_42.clone()], ended("p", None, &[("main", 42)], &[]), Some(Action::FailJob), Some(m42)),
        (vec![fail_42.clone()], ended("p", None, &[("main", 1)], &[]), None, None),
        // An init container's exit code is matched too, after the containers'.
        (
            vec![fail_42.clone()],
            ended("p", None, &[("main", 0), ("init", 42)], &[]),
            Some(Action::FailJob),
            Some("Container init for pod ns/p failed with exit code 42 matching FailJob rule at index 0"),
        ),
        // First rule wins.
        (
            vec![ignore_disrupted.clone(), fail_42.clone()],
            ended("p", None, &[("main", 42)], &[("DisruptionTarget", "True")]),
            Some(Action::Ignore),
            None,
        ),
        (
            vec![fail_42.clone(), ignore_disrupted.clone()],
            ended("p", None, &[("main", 42)], &[("DisruptionTarget", "True")]),
            Some(Action::FailJob),
            Some(m42),
        ),
        // The status defaults to True; False does not match it.
        (
            vec![ignore_disrupted.clone()],
            ended("p", None, &[("main", 1)], &[("DisruptionTarget", "False")]),
            None,
            None,
        ),
        (
            vec![on_condition("FailJob", "DisruptionTarget", Some("False"))],
            ended("p", None, &[], &[("DisruptionTarget", "False")]),
            Some(Action::FailJob),
            Some("Pod ns/p has condition DisruptionTarget matching FailJob rule at index 0"),
        ),
        // NotIn: exit code 0 never matches; a container name narrows it.
        (vec![main_not_0_1.clone()], ended("p", None, &[("main", 0)], &[]), None, None),
        (vec![main_not_0_1.clone()], ended("p", None, &[("main", 7)], &[]), Some(Action::Count), None),
        (vec![main_not_0_1.clone()], ended("p", None, &[("side", 7)], &[]), None, None),
        (
            vec![on_exit("FailIndex", None, "In", &[3])],
            ended("p", None, &[("main", 3)], &[]),
            Some(Action::FailIndex),
            None,
        ),
        // A pod not in phase Failed is never matched.
        (
            vec![ignore_disrupted.clone()],
            ObservedPod {
                conditions: vec![("DisruptionTarget".into(), "True".into())],
                ..pod("p", Lifecycle::Running, None)
            },
            None,
            None,
        ),
    ];
    for (i, (rules, p, action, message)) in table.into_iter().enumerate() {
        let got = match_pod_failure_policy(&policy(rules), "ns", &p);
        assert_eq!(got.as_ref().map(|g| g.0), action, "row {i}");
        assert_eq!(got.and_then(|g| g.1).as_deref(), message, "row {i}");
    }
}

#[test]
fn a_fail_job_rule_fails_the_job_and_stops_its_other_pods() {
    let mut s = spec(2, Some(2), CompletionMode::NonIndexed);
    s.pod_failure_policy = Some(policy(vec![on_exit("FailJob", Some("main"), "In", &[42])]));
    let pods = [ended("a", None, &[("main", 42)], &[]), pod("b", Lifecycle::Running, None)];
    let p = run(&s, &pods);
    assert_eq!(failing(&p), Some("PodFailurePolicy"));
    let target = conditions::get(&p.status.conditions, condition::FAILURE_TARGET).expect("target");
    assert_eq!(target.message, "Container main for pod ns/a failed with exit code 42 matching FailJob rule at index 0");
    assert_eq!(p.delete, vec![("b".to_string(), "PodFailurePolicy")]);
    assert!(p.deletes_counted);
    assert_eq!((p.status.failed, p.status.terminating), (2, Some(1)));
    assert!(p.finished.is_none());
    let p = plan("ns", &s, None, &p.status, &after(&p, &pods), false, now());
    let f = p.finished.clone().expect("failed");
    assert_eq!(
        (f.condition, f.reason, f.message.as_str()),
        (condition::FAILED, "PodFailurePolicy", target.message.as_str())
    );
    assert_eq!((p.status.failed, p.status.phase), (2, Some(JobPhase::Failed)));
}

#[test]
fn ignored_failures_count_toward_no_limit_and_are_replaced() {
    let mut s = spec(1, Some(1), CompletionMode::NonIndexed);
    s.backoff_limit = Some(0);
    s.pod_failure_policy =
        Some(policy(vec![on_condition("Ignore", "DisruptionTarget", None), on_exit("Count", None, "NotIn", &[])]));
    let preempted = ended("a", None, &[("main", 137)], &[("DisruptionTarget", "True")]);
    let p = run(&s, std::slice::from_ref(&preempted));
    assert_eq!((p.status.failed, failing(&p)), (0, None));
    assert_eq!(p.create.len(), 1, "replaced");
    assert_eq!(p.release, vec!["a".to_string()]);
    // The same failure without the condition counts (the Count rule, as no rule would).
    let p = run(&s, &[ended("a", None, &[("main", 137)], &[])]);
    assert_eq!((p.status.failed, failing(&p)), (1, Some("BackoffLimitExceeded")));
}

fn per_index(parallelism: i32, completions: i32, limit: i32) -> MusterJobSpec {
    let mut s = spec(parallelism, Some(completions), CompletionMode::Indexed);
    s.backoff_limit_per_index = Some(limit);
    s
}

#[test]
fn backoff_limit_per_index_fails_an_index_past_its_limit() {
    let s = per_index(2, 2, 1);
    assert_eq!(s.backoff_limit(), i32::MAX);
    // Index 0 fails for the first time: its next pod carries the count, the failed one waits
    // for it before it is released.
    let pods = [pod("a0", Lifecycle::Failed, Some(0)), pod("b1", Lifecycle::Running, Some(1))];
    let p = run(&s, &pods);
    assert_eq!(p.create, vec![NewPod { index: Some(0), attempt: 1, index_failures: 1, index_ignored: 0 }]);
    assert_eq!(p.status.failed_indexes.as_deref(), Some(""));
    assert_eq!(p.status.failed, 1);
    assert_eq!(p.release, vec!["a0".to_string()], "its replacement is made in this pass");
    // A pass that cannot make the replacement yet (a terminating pod still holds the index
    // with podReplacementPolicy Failed) keeps the failed pod.
    let mut waiting = s.clone();
    waiting.pod_replacement_policy = Some(PodReplacementPolicy::Failed);
    let held = ObservedPod { terminating: true, ..pod("t0", Lifecycle::Running, Some(0)) };
    let p = run(&waiting, &[pods[0].clone(), pods[1].clone(), held]);
    assert!(p.create.is_empty());
    assert!(p.release.is_empty(), "{:?}", p.release);
    assert_eq!(p.status.failed, 0, "recorded when released");
    // Its second failure reaches the limit: the index fails and is not made again.
    let second = ObservedPod { index_failures: 1, attempt: 1, ..pod("a0-2", Lifecycle::Failed, Some(0)) };
    let prev = MusterJobStatus { failed: 1, ..Default::default() };
    let released = ObservedPod { tracked: false, ..pods[0].clone() };
    let p = plan("ns", &s, None, &prev, &[released, second, pods[1].clone()], false, now());
    assert_eq!(p.status.failed_indexes.as_deref(), Some("0"));
    assert_eq!(p.status.failed, 2);
    assert!(p.create.is_empty());
    assert_eq!(failing(&p), None, "index 1 still runs");
    // Index 1 succeeds: every index finished, one failed.
    let done = pod("b1", Lifecycle::Succeeded, Some(1));
    let p = plan("ns", &s, None, &p.status, &[done], false, now());
    assert_eq!(failing(&p), Some("FailedIndexes"));
    let f = p.finished.expect("failed");
    assert_eq!((f.reason, f.message.as_str()), ("FailedIndexes", "Job has failed indexes"));
    assert_eq!((p.status.completed_indexes.as_deref(), p.status.failed_indexes.as_deref()), (Some("1"), Some("0")));
}

#[test]
fn max_failed_indexes_and_fail_index_rules() {
    let mut s = per_index(4, 4, 3);
    s.max_failed_indexes = Some(1);
    s.pod_failure_policy = Some(policy(vec![on_exit("FailIndex", None, "In", &[3])]));
    let pods = [
        ended("a0", Some(0), &[("main", 3)], &[]),
        pod("a1", Lifecycle::Running, Some(1)),
        pod("a2", Lifecycle::Running, Some(2)),
        pod("a3", Lifecycle::Running, Some(3)),
    ];
    // FailIndex: the index fails at once, whatever its limit.
    let p = run(&s, &pods);
    assert_eq!(p.status.failed_indexes.as_deref(), Some("0"));
    assert!(p.create.is_empty());
    assert_eq!(failing(&p), None);
    // A second failed index is more than maxFailedIndexes 1.
    let mut pods2 = after(&p, &pods);
    pods2[1] = ended("a1", Some(1), &[("main", 3)], &[]);
    let p = plan("ns", &s, None, &p.status, &pods2, false, now());
    assert_eq!(failing(&p), Some("MaxFailedIndexesExceeded"));
    let target = conditions::get(&p.status.conditions, condition::FAILURE_TARGET).expect("target");
    assert_eq!(target.message, "Job has exceeded the specified maximal number of failed indexes");
    assert_eq!(p.status.failed_indexes.as_deref(), Some("0,1"));
    assert_eq!(p.delete.len(), 2);
}

#[test]
fn a_success_policy_completes_the_job_early() {
    let mut s = spec(3, Some(3), CompletionMode::Indexed);
    s.success_policy = Some(JobSuccessPolicy {
        rules: vec![
            JobSuccessPolicyRule { succeeded_indexes: Some("1-2".into()), succeeded_count: None },
            JobSuccessPolicyRule { succeeded_indexes: None, succeeded_count: Some(1) },
        ],
    });
    let pods = [
        pod("a0", Lifecycle::Running, Some(0)),
        pod("a1", Lifecycle::Succeeded, Some(1)),
        pod("a2", Lifecycle::Running, Some(2)),
    ];
    let p = run(&s, &pods);
    let met = conditions::get(&p.status.conditions, condition::SUCCESS_CRITERIA_MET).expect("met");
    assert_eq!((met.reason.as_str(), met.message.as_str()), ("SuccessPolicy", "Matched rules at index 1"));
    assert!(!p.deletes_counted, "the rest is stopped, not failed");
    assert_eq!(p.delete.len(), 2);
    assert_eq!((p.status.failed, p.status.succeeded), (0, 1));
    let p = plan("ns", &s, None, &p.status, &after(&p, &pods), false, now());
    let f = p.finished.clone().expect("complete");
    assert_eq!(
        (f.condition, f.reason, f.message.as_str()),
        (condition::COMPLETE, "SuccessPolicy", "Matched rules at index 1")
    );
    assert!(p.status.completion_time.is_some());
    // The first rule: both indexes 1 and 2.
    let both = [pod("a1", Lifecycle::Succeeded, Some(1)), pod("a2", Lifecycle::Succeeded, Some(2))];
    let mut first = s.clone();
    first.success_policy.as_mut().expect("policy").rules.truncate(1);
    let p = run(&first, &both);
    let met = conditions::get(&p.status.conditions, condition::SUCCESS_CRITERIA_MET).expect("met");
    assert_eq!(met.message, "Matched rules at index 0");
    assert!(conditions::get(&run(&first, &both[..1]).status.conditions, condition::SUCCESS_CRITERIA_MET).is_none());
}

#[test]
fn success_policy_rules_read_indexes_and_counts_as_batch_v1() {
    let rule = |idx: Option<&str>, count: Option<i32>| JobSuccessPolicyRule {
        succeeded_indexes: idx.map(str::to_string),
        succeeded_count: count,
    };
    let set = |v: &[i32]| v.iter().copied().collect::<BTreeSet<i32>>();
    // (rules, completions, succeeded, matched rule)
    let table = [
        (vec![rule(Some("0,2-3"), None)], 5, set(&[0, 2, 3]), Some(0)),
        (vec![rule(Some("0,2-3"), None)], 5, set(&[0, 2]), None),
        (vec![rule(Some("0,2-3"), Some(2))], 5, set(&[0, 3, 4]), Some(0)),
        (vec![rule(None, Some(3))], 5, set(&[1, 3]), None),
        (vec![rule(Some("9"), None), rule(None, Some(2))], 5, set(&[1, 3]), Some(1)),
        (vec![rule(None, Some(1))], 5, set(&[]), None),
    ];
    for (i, (rules, completions, succeeded, want)) in table.into_iter().enumerate() {
        let got = match_success_policy(&JobSuccessPolicy { rules }, completions, &succeeded);
        assert_eq!(got, want.map(|n| format!("Matched rules at index {n}")), "row {i}");
    }
}

#[test]
fn pod_replacement_policy_decides_when_a_deleted_pod_is_replaced_and_counted() {
    let deleted = ObservedPod { terminating: true, ..pod("a", Lifecycle::Running, Some(0)) };
    // (policy, podFailurePolicy, created, failed)
    let table = [
        (None, false, 1, 1),
        (Some(PodReplacementPolicy::TerminatingOrFailed), false, 1, 1),
        (Some(PodReplacementPolicy::Failed), false, 0, 0),
        // With a podFailurePolicy the default is Failed.
        (None, true, 0, 0),
    ];
    for (i, (replacement, with_policy, created, failed)) in table.into_iter().enumerate() {
        let mut s = spec(1, Some(1), CompletionMode::Indexed);
        s.pod_replacement_policy = replacement;
        if with_policy {
            s.pod_failure_policy = Some(policy(vec![on_condition("Ignore", "DisruptionTarget", None)]));
        }
        let p = run(&s, std::slice::from_ref(&deleted));
        assert_eq!((p.create.len(), p.status.failed), (created, failed), "row {i}");
        assert_eq!(p.status.terminating, Some(1), "row {i}");
        assert_eq!(p.status.active, created as i32, "row {i}");
    }
    // Once it is Failed, it counts (or not, as the rule says) and is replaced.
    let mut s = spec(1, Some(1), CompletionMode::Indexed);
    s.pod_failure_policy = Some(policy(vec![on_condition("Ignore", "DisruptionTarget", None)]));
    let gone = ended("a", Some(0), &[("main", 143)], &[("DisruptionTarget", "True")]);
    let p = run(&s, &[gone]);
    assert_eq!((p.create.len(), p.status.failed, p.status.terminating), (1, 0, Some(0)));
}

#[test]
fn an_elastic_indexed_job_scales_down_and_trims_its_indexes() {
    let s = spec(2, Some(2), CompletionMode::Indexed);
    let prev = MusterJobStatus { completed_indexes: Some("0,3".into()), succeeded: 2, ..Default::default() };
    let pods = [
        pod("a1", Lifecycle::Running, Some(1)),
        pod("a2", Lifecycle::Running, Some(2)),
        ObservedPod { tracked: false, ..pod("a3", Lifecycle::Succeeded, Some(3)) },
    ];
    let p = plan("ns", &s, None, &prev, &pods, false, now());
    assert_eq!(p.delete, vec![("a2".to_string(), "TooManyActive")]);
    assert!(!p.deletes_counted);
    assert_eq!((p.status.completed_indexes.as_deref(), p.status.succeeded), (Some("0"), 1));
    assert!(p.create.is_empty(), "deletes before creates");
    // Scaled up again: index 2 and 3 come back.
    let up = spec(4, Some(4), CompletionMode::Indexed);
    let p = plan("ns", &up, None, &p.status, &[pods[0].clone()], false, now());
    let made: Vec<Option<i32>> = p.create.iter().map(|n| n.index).collect();
    assert_eq!(made, vec![Some(2), Some(3)]);
}

#[test]
fn a_work_queue_job_completes_once_a_pod_succeeded_and_none_runs() {
    let mut s = spec(3, None, CompletionMode::NonIndexed);
    s.completions = None;
    let pods =
        [pod("a", Lifecycle::Succeeded, None), pod("b", Lifecycle::Running, None), pod("c", Lifecycle::Running, None)];
    let p = run(&s, &pods);
    assert!(p.create.is_empty() && p.delete.is_empty(), "no new pod once one succeeded; the rest run on");
    assert!(conditions::get(&p.status.conditions, condition::SUCCESS_CRITERIA_MET).is_none());
    let finished = [pods[0].clone(), pod("b", Lifecycle::Succeeded, None), pod("c", Lifecycle::Failed, None)];
    let p = run(&s, &finished);
    assert_eq!(p.finished.map(|f| f.condition), Some(condition::COMPLETE));
    assert_eq!((p.status.succeeded, p.status.failed), (2, 1));
}

#[test]
fn gang_restart_victims_count_for_nothing_and_keep_their_index_counts() {
    let s = per_index(3, 3, 2);
    let victim = |name: &str, i: i32| ObservedPod {
        gang_restarted: true,
        terminating: true,
        index_failures: 1,
        ..pod(name, Lifecycle::Failed, Some(i))
    };
    let failed = ObservedPod { index_failures: 1, ..pod("a0", Lifecycle::Failed, Some(0)) };
    let pods = [failed, victim("a1", 1), victim("a2", 2)];
    let prev = MusterJobStatus { failed: 1, ..Default::default() };
    let p = plan("ns", &s, None, &prev, &pods, true, now());
    assert_eq!(p.status.failed, 2, "the failed pod only");
    assert_eq!(p.status.failed_indexes.as_deref(), Some(""));
    let counts: Vec<(Option<i32>, i32)> = p.create.iter().map(|n| (n.index, n.index_failures)).collect();
    assert_eq!(counts, vec![(Some(0), 2), (Some(1), 1), (Some(2), 1)]);
    // The victims lose their finalizer; the failed pod too, its index made again.
    let released: BTreeSet<&str> = p.release.iter().map(String::as_str).collect();
    assert_eq!(released, ["a0", "a1", "a2"].into_iter().collect());
}

#[test]
fn a_deleted_pod_counts_as_failed_unless_a_pod_failure_policy_waits_for_its_phase() {
    let deleted = ObservedPod { terminating: true, ..pod("a", Lifecycle::Pending, None) };
    let mut s = spec(1, Some(1), CompletionMode::NonIndexed);
    s.backoff_limit = Some(0);
    assert_eq!(failing(&run(&s, std::slice::from_ref(&deleted))), Some("BackoffLimitExceeded"));
    s.pod_failure_policy = Some(policy(vec![on_condition("Ignore", "DisruptionTarget", None)]));
    let p = run(&s, std::slice::from_ref(&deleted));
    assert_eq!((failing(&p), p.status.failed, p.create.len()), (None, 0, 0));
    assert!(p.release.is_empty(), "kept until it is Failed");
}

#[test]
fn a_finished_job_changes_nothing_and_releases_every_pod() {
    let s = spec(1, Some(1), CompletionMode::NonIndexed);
    let pods = [pod("a", Lifecycle::Succeeded, None)];
    let p = run(&s, &pods);
    assert_eq!(p.finished.as_ref().map(|f| f.condition), Some(condition::COMPLETE));
    assert_eq!(p.release, vec!["a".to_string()]);
    // Seen again before the release shows: nothing counted twice.
    let again = plan("ns", &s, None, &p.status, &pods, false, now());
    assert!(again.finished.is_none());
    assert_eq!((again.status.succeeded, again.status.failed), (1, 0));
    assert_eq!(again.release, vec!["a".to_string()]);
}

#[test]
fn a_failed_job_has_both_conditions_and_no_completion_time() {
    let mut s = spec(1, Some(1), CompletionMode::NonIndexed);
    s.backoff_limit = Some(0);
    let p = run(&s, &[pod("a", Lifecycle::Failed, None)]);
    let types: Vec<(&str, &str)> = p
        .status
        .conditions
        .iter()
        .map(|c| (c.type_.as_str(), c.status.as_str()))
        .filter(|(t, _)| *t != "Invalid")
        .collect();
    assert_eq!(types, vec![(condition::FAILURE_TARGET, "True"), (condition::FAILED, "True")]);
    assert_eq!(p.status.completion_time, None);
}

#[test]
fn new_pods_carry_the_tracking_finalizer_index_counts_and_the_sets_keys() {
    let mut s = per_index(2, 2, 1);
    s.template.metadata =
        Some(serde_json::from_value(serde_json::json!({"finalizers": ["example.com/keep"]})).expect("meta"));
    let mut job = MusterJob::new("w", s);
    job.metadata.uid = Some("uid".into());
    job.metadata.labels = Some(BTreeMap::from([
        ("jobset.sigs.k8s.io/jobset-name".to_string(), "ddp".to_string()),
        ("jobset.sigs.k8s.io/job-index".to_string(), "0".to_string()),
        ("other.example.com/x".to_string(), "no".to_string()),
    ]));
    job.metadata.annotations =
        Some(BTreeMap::from([("jobset.sigs.k8s.io/coordinator".to_string(), "ddp-leader-0-0.ddp".to_string())]));
    let new = NewPod { index: Some(1), attempt: 0, index_failures: 1, index_ignored: 2 };
    let standalone = new_pod(&job, &new, "w", None, 0);
    assert_eq!(
        standalone.metadata.finalizers,
        Some(vec!["example.com/keep".to_string(), TRACKING_FINALIZER.to_string()])
    );
    let a = standalone.metadata.annotations.as_ref().expect("annotations");
    assert_eq!(a.get(INDEX_FAILURE_COUNT_ANNOTATION).map(String::as_str), Some("1"));
    assert_eq!(a.get(INDEX_IGNORED_FAILURE_COUNT_ANNOTATION).map(String::as_str), Some("2"));
    assert!(!standalone.metadata.labels.as_ref().expect("labels").contains_key("jobset.sigs.k8s.io/jobset-name"));
    // A set's child: JobSet's keys go on its pods, nothing else of the job's.
    job.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "batch.muster.dev/v1alpha1".into(),
        kind: "MusterJobSet".into(),
        name: "ddp".into(),
        uid: "set".into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    let child = new_pod(&job, &new, "w", None, 0);
    let labels = child.metadata.labels.as_ref().expect("labels");
    assert_eq!(labels.get("jobset.sigs.k8s.io/jobset-name").map(String::as_str), Some("ddp"));
    assert_eq!(labels.get("jobset.sigs.k8s.io/job-index").map(String::as_str), Some("0"));
    assert!(!labels.contains_key("other.example.com/x"));
    let a = child.metadata.annotations.as_ref().expect("annotations");
    assert_eq!(a.get("jobset.sigs.k8s.io/coordinator").map(String::as_str), Some("ddp-leader-0-0.ddp"));
}

#[test]
fn a_pods_subdomain_is_its_own_jobs_or_the_one_its_set_wrote() {
    let mut job = MusterJob::new("w", per_index(2, 2, 1));
    assert_eq!(pod_subdomain(&job).as_deref(), Some("w"), "an Indexed job of its own: its Service");
    job.spec.completion_mode = Some(muster_api::batch::CompletionMode::NonIndexed);
    assert_eq!(pod_subdomain(&job), None, "NonIndexed pods have no hostname to name");
    job.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "batch.muster.dev/v1alpha1".into(),
        kind: "MusterJobSet".into(),
        name: "ddp".into(),
        uid: "set".into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    job.spec.completion_mode = None;
    assert_eq!(pod_subdomain(&job), None, "a set's child without DNS hostnames: none");
    job.spec.template.spec.get_or_insert_with(Default::default).subdomain = Some("net".into());
    assert_eq!(pod_subdomain(&job).as_deref(), Some("net"), "a set's child: its set's network");
}

#[test]
fn observed_pods_keep_exit_codes_conditions_and_tracking_bounded() {
    let mut statuses: Vec<serde_json::Value> = (0..20)
        .map(|i| {
            serde_json::json!({"name": format!("c{i}"), "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": i}}})
        })
        .collect();
    statuses.insert(
        0,
        serde_json::json!({"name": "run", "image": "x", "imageID": "", "ready": true, "restartCount": 0,
        "state": {"running": {}}}),
    );
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "finalizers": [TRACKING_FINALIZER],
            "annotations": {INDEX_FAILURE_COUNT_ANNOTATION: "3", GANG_RESTARTED_ANNOTATION: "true"}},
        "status": {"phase": "Failed", "containerStatuses": statuses,
            "initContainerStatuses": [{"name": "init", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 9}}}],
            "conditions": [{"type": "DisruptionTarget", "status": "True"}, {"type": "Ready", "status": "False"}]},
    }))
    .expect("pod");
    let o = ObservedPod::from_pod(&pod);
    assert_eq!(o.exit_codes.len(), MAX_OBSERVED);
    assert_eq!(o.exit_codes[0], ("c0".to_string(), 0), "only terminated containers");
    assert_eq!(
        o.conditions,
        vec![("DisruptionTarget".to_string(), "True".to_string()), ("Ready".to_string(), "False".to_string())]
    );
    assert!(o.tracked && o.gang_restarted);
    assert_eq!((o.index_failures, o.index_ignored), (3, 0));
    let mut bare = pod.clone();
    bare.metadata.finalizers = None;
    assert!(!ObservedPod::from_pod(&bare).tracked);
}

#[test]
fn a_live_pods_record_changes_with_what_the_job_reads_not_with_each_condition() {
    let pod = |phase: &str, conditions: serde_json::Value| -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "annotations": {"gpu.muster.dev/indices": "0"}},
            "status": {"phase": phase, "conditions": conditions},
        }))
        .expect("pod")
    };
    let cond = |t: &str, s: &str| serde_json::json!({"type": t, "status": s});
    // The steps of a start: unschedulable for now, scheduled, initialized: one record.
    let created = ObservedPod::from_pod(&pod("Pending", serde_json::json!([])));
    for step in [
        serde_json::json!([cond("PodScheduled", "False")]),
        serde_json::json!([cond("PodScheduled", "True")]),
        serde_json::json!([cond("PodScheduled", "True"), cond("Initialized", "True"), cond("Ready", "False")]),
    ] {
        assert_eq!(ObservedPod::from_pod(&pod("Pending", step.clone())), created, "{step}");
    }
    // What the job reads still moves it: running, ready, a disruption.
    let running = ObservedPod::from_pod(&pod("Running", serde_json::json!([cond("Ready", "False")])));
    assert_ne!(running, created);
    assert!(running.conditions.is_empty());
    let ready = ObservedPod::from_pod(&pod("Running", serde_json::json!([cond("Ready", "True")])));
    assert!(ready.ready && ready != running);
    let disrupted = ObservedPod::from_pod(&pod("Running", serde_json::json!([cond("DisruptionTarget", "True")])));
    assert!(disrupted.disruption.is_some() && disrupted != running);
    // A failed pod keeps them all, as its podFailurePolicy rules read them.
    let failed = ObservedPod::from_pod(&pod("Failed", serde_json::json!([cond("ConfigIssue", "True")])));
    assert_eq!(failed.conditions, vec![("ConfigIssue".to_string(), "True".to_string())]);
}

#[test]
fn failure_backoff_doubles_from_ten_seconds_to_ten_minutes() {
    let now = 1_000;
    // (failures, last failure, left)
    let table = [
        (0, Some(990), 0),
        (1, None, 0),
        (1, Some(1_000), 10),
        (1, Some(995), 5),
        (1, Some(980), 0),
        (2, Some(1_000), 20),
        (3, Some(990), 30),
        (7, Some(1_000), 600),
        (60, Some(1_000), 600),
    ];
    for (failures, last, left) in table {
        assert_eq!(backoff_left(failures, last, now), left, "{failures} {last:?}");
    }
}

#[test]
fn a_failed_pod_is_replaced_after_the_backoff_since_the_last_success() {
    let s = spec(1, Some(3), CompletionMode::NonIndexed);
    let t = now().as_second();
    let at = |p: ObservedPod, finished: i64| ObservedPod { finished_at: Some(finished), ..p };
    // One failure 4 s ago: 6 s left.
    let p = run(&s, &[at(pod("a", Lifecycle::Failed, None), t - 4)]);
    assert!(p.create.is_empty());
    assert_eq!(p.requeue_after, Some(6));
    // A gang's failed pod is replaced at once, while the rest of its gang still runs.
    for gang in [Gang::Single, Gang::All] {
        let p = plan(
            "ns",
            &s,
            None,
            &MusterJobStatus::default(),
            &[at(pod("a", Lifecycle::Failed, None), t - 4)],
            gang,
            now(),
        );
        assert_eq!(p.create.len(), 1, "{gang:?}");
    }
    // Two failures since the last success, the last 15 s ago: 5 s left of 20.
    let pods = [
        at(pod("a", Lifecycle::Failed, None), t - 100),
        at(pod("b", Lifecycle::Succeeded, None), t - 50),
        at(pod("c", Lifecycle::Failed, None), t - 30),
        at(pod("d", Lifecycle::Failed, None), t - 15),
    ];
    let p = run(&s, &pods);
    assert_eq!((p.create.len(), p.requeue_after), (0, Some(5)));
    // Waited enough: replaced.
    let later = Timestamp::from_second(t + 5).expect("ts");
    let p = plan("ns", &s, None, &MusterJobStatus::default(), &pods, false, later);
    assert_eq!(p.create.len(), 1);
    // Ignored failures wait too (batch/v1 counts every failed pod for its backoff).
    let mut ignoring = s.clone();
    ignoring.pod_failure_policy = Some(policy(vec![on_condition("Ignore", "DisruptionTarget", None)]));
    let disrupted = at(ended("e", None, &[("main", 137)], &[("DisruptionTarget", "True")]), t - 1);
    let p = run(&ignoring, &[disrupted]);
    assert_eq!((p.create.len(), p.status.failed, p.requeue_after), (0, 0, Some(9)));
}

#[test]
fn each_index_waits_its_own_backoff() {
    let s = per_index(2, 2, 3);
    let t = now().as_second();
    // Index 0 failed for the second time 5 s ago (its pod carried one failure): 15 s left.
    // Index 1 has no failure: made at once.
    let failed = ObservedPod { index_failures: 1, finished_at: Some(t - 5), ..pod("a0", Lifecycle::Failed, Some(0)) };
    let p = run(&s, std::slice::from_ref(&failed));
    assert_eq!(p.create.iter().map(|n| n.index).collect::<Vec<_>>(), vec![Some(1)]);
    assert!(p.release.is_empty(), "the failed pod waits for its index's next pod");
    // Only index 0 left to make: the job looks again when its backoff ends.
    let other = pod("a1", Lifecycle::Running, Some(1));
    let mut status = MusterJobStatus::default();
    for pass in 0..3 {
        // However often the job is looked at while it waits, the failure is recorded once: when
        // its pod is released.
        let p = plan("ns", &s, None, &status, &[failed.clone(), other.clone()], false, now());
        assert_eq!((p.create.len(), p.requeue_after), (0, Some(15)), "pass {pass}");
        assert_eq!(p.status.failed, 0, "pass {pass}");
        status = p.status;
    }
    let later = Timestamp::from_second(t + 15).expect("ts");
    let p = plan("ns", &s, None, &status, &[failed.clone(), other], false, later);
    assert_eq!(p.create, vec![NewPod { index: Some(0), attempt: 1, index_failures: 2, index_ignored: 0 }]);
    assert_eq!((p.status.failed, p.release.clone()), (1, vec!["a0".to_string()]));
}

#[test]
fn a_pods_finish_time_is_read_as_batch_v1_reads_it() {
    let at = |s: &str| s.parse::<Timestamp>().expect("ts").as_second();
    let pod = |status: serde_json::Value, meta: serde_json::Value| -> Pod {
        let mut metadata = serde_json::json!({"name": "p", "creationTimestamp": "2026-12-04T10:00:00Z"});
        merge(&mut metadata, meta);
        serde_json::from_value(serde_json::json!({"metadata": metadata, "status": status})).expect("pod")
    };
    let ended = |name: &str, t: &str| {
        serde_json::json!({"name": name, "image": "x", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 1, "finishedAt": t}}})
    };
    let ready_false =
        serde_json::json!([{"type": "Ready", "status": "False", "lastTransitionTime": "2026-12-04T10:00:30Z"}]);
    let table = [
        // Every container ended: the last one's end.
        (
            pod(
                serde_json::json!({"containerStatuses": [ended("a", "2026-12-04T10:00:10Z"), ended("b", "2026-12-04T10:00:20Z")],
                    "conditions": ready_false.clone()}),
                serde_json::json!({}),
            ),
            "2026-12-04T10:00:20Z",
        ),
        // One still runs: Ready=False's transition.
        (
            pod(
                serde_json::json!({"containerStatuses": [ended("a", "2026-12-04T10:00:10Z"),
                    {"name": "b", "image": "x", "imageID": "", "ready": true, "restartCount": 0, "state": {"running": {}}}],
                    "conditions": ready_false}),
                serde_json::json!({}),
            ),
            "2026-12-04T10:00:30Z",
        ),
        // Deleted: the deletion less its grace period.
        (
            pod(
                serde_json::json!({}),
                serde_json::json!({"deletionTimestamp": "2026-12-04T10:01:00Z", "deletionGracePeriodSeconds": 30}),
            ),
            "2026-12-04T10:00:30Z",
        ),
        (pod(serde_json::json!({}), serde_json::json!({})), "2026-12-04T10:00:00Z"),
    ];
    for (i, (p, want)) in table.into_iter().enumerate() {
        assert_eq!(ObservedPod::from_pod(&p).finished_at, Some(at(want)), "row {i}");
    }
}

fn merge(base: &mut serde_json::Value, more: serde_json::Value) {
    if let (Some(b), serde_json::Value::Object(m)) = (base.as_object_mut(), more) {
        b.extend(m);
    }
}

//! JobSet v1alpha2's rules on a MusterJobSet, through `validate_jobset`: create and update
//! tables with the exact errors, and properties of the rule-name pattern.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::workloadbuilder::job::test_support::{errors_match, merge};
use crate::workloadbuilder::job::validate_jobset;

fn rjob(name: &str, replicas: i32, more: Value) -> Value {
    let mut r = json!({"name": name, "replicas": replicas, "template": {"spec": {"parallelism": 2,
        "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}});
    merge(&mut r, more);
    r
}

/// A set `s` of a leader (1 child of 2 pods) and workers (2 children), plus `more`.
fn set_json(more: Value) -> Value {
    let mut spec = json!({"replicatedJobs": [rjob("leader", 1, json!({})), rjob("workers", 2, json!({}))]});
    merge(&mut spec, more);
    spec
}

fn set(spec: Value) -> MusterJobSet {
    serde_json::from_value(json!({
        "apiVersion": "batch.muster.dev/v1alpha1", "kind": "MusterJobSet",
        "metadata": {"name": "s"}, "spec": spec,
    }))
    .expect("set fixture")
}

fn lines(errs: &ErrorList) -> Vec<String> {
    errs.iter().map(|e| e.to_string()).collect()
}

fn rule(name: &str, more: Value) -> Value {
    let mut r = json!({"name": name, "action": "RestartJobSet"});
    merge(&mut r, more);
    r
}

fn with_rjobs(rjobs: Vec<Value>) -> Value {
    json!({"replicatedJobs": rjobs})
}

#[test]
fn create_rules_give_jobsets_errors() {
    let depends = |name: &str| json!([{"name": name, "status": "Ready"}]);
    let cases: Vec<(&str, Value, Vec<&str>)> = vec![
        (
            "pytorch set",
            set_json(json!({"network": {"enableDNSHostnames": true, "subdomain": "ddp"},
                "failurePolicy": {"maxRestarts": 3, "rules": [
                    rule("ignore_preemption", json!({"action": "RestartJobSetAndIgnoreMaxRestarts", "onJobFailureReasons": ["PodFailurePolicy"]})),
                    rule("Restart:workers,1", json!({"targetReplicatedJobs": ["workers"]}))]},
                "coordinator": {"replicatedJob": "leader", "jobIndex": 0, "podIndex": 1},
                "successPolicy": {"operator": "All", "targetReplicatedJobs": ["leader"]},
                "managedBy": "batch.muster.dev/jobset-controller"})),
            vec![],
        ),
        (
            "dependsOn on a later replicatedJob",
            with_rjobs(vec![rjob("a", 1, json!({})), rjob("b", 1, json!({"dependsOn": depends("a")}))]),
            vec![],
        ),
        ("in order", set_json(json!({"startupPolicy": {"startupPolicyOrder": "InOrder"}})), vec![]),
        (
            "in order with dependsOn",
            with_rjobs(vec![rjob("a", 1, json!({})), rjob("b", 1, json!({"dependsOn": depends("a")}))])
                .as_object()
                .map(|o| {
                    let mut v = Value::Object(o.clone());
                    v["startupPolicy"] = json!({"startupPolicyOrder": "InOrder"});
                    v
                })
                .expect("object"),
            vec!["spec: Invalid value: \"object\": StartupPolicy and DependsOn APIs are mutually exclusive"],
        ),
        (
            "in order under a gang",
            set_json(json!({"startupPolicy": {"startupPolicyOrder": "InOrder"},
                "scheduling": {"schedulingPolicy": {"gang": {}}}})),
            vec!["spec.startupPolicy.startupPolicyOrder"],
        ),
        (
            "in order under a basic composite",
            set_json(json!({"startupPolicy": {"startupPolicyOrder": "InOrder"},
                "scheduling": {"schedulingPolicy": {"basic": {}}}})),
            vec![],
        ),
        (
            "dependsOn under a gang",
            with_rjobs(vec![rjob("a", 1, json!({})), rjob("b", 1, json!({"dependsOn": depends("a")}))])
                .as_object()
                .map(|o| {
                    let mut v = Value::Object(o.clone());
                    v["scheduling"] = json!({"schedulingPolicy": {"gang": {}}});
                    v
                })
                .expect("object"),
            vec!["spec.replicatedJobs[1].dependsOn"],
        ),
        (
            "dependsOn on the first",
            with_rjobs(vec![rjob("a", 1, json!({"dependsOn": depends("b")})), rjob("b", 1, json!({}))]),
            vec!["spec.replicatedJobs[0].dependsOn: Forbidden: DependsOn can't be set for the first ReplicatedJob"],
        ),
        (
            "dependsOn on a later one",
            with_rjobs(vec![
                rjob("a", 1, json!({})),
                rjob("b", 1, json!({"dependsOn": depends("c")})),
                rjob("c", 1, json!({})),
            ]),
            vec![
                "spec.replicatedJobs[1].dependsOn[0].name: Invalid value: \"c\": must name an earlier replicatedJob (replicatedJob: b cannot depend on replicatedJob: c)",
            ],
        ),
        (
            "dependsOn on itself",
            with_rjobs(vec![rjob("a", 1, json!({})), rjob("b", 1, json!({"dependsOn": depends("b")}))]),
            vec!["spec.replicatedJobs[1].dependsOn[0].name"],
        ),
        (
            "rule name pattern",
            set_json(json!({"failurePolicy": {"rules": [rule("1st", json!({}))]}})),
            vec!["spec.failurePolicy.rules[0].name"],
        ),
        (
            "rule name ends with a comma",
            set_json(json!({"failurePolicy": {"rules": [rule("a,", json!({}))]}})),
            vec!["spec.failurePolicy.rules[0].name"],
        ),
        (
            "rule names repeated",
            set_json(
                json!({"failurePolicy": {"rules": [rule("r", json!({})), rule("q", json!({})), rule("r", json!({}))]}}),
            ),
            vec![
                "spec.failurePolicy.rules: Invalid value: \"r\": rule names are not unique, rules with indices [0 2] all have the same name",
            ],
        ),
        (
            "rule target unknown",
            set_json(
                json!({"failurePolicy": {"rules": [rule("r", json!({"targetReplicatedJobs": ["workers", "ps"]}))]}}),
            ),
            vec![
                "spec.failurePolicy.rules[0].targetReplicatedJobs[1]: Invalid value: \"ps\": must name a replicatedJob of this set",
            ],
        ),
        (
            "rule reason unknown",
            set_json(json!({"failurePolicy": {"rules": [rule("r", json!({"onJobFailureReasons": ["Evicted"]}))]}})),
            vec![
                "spec.failurePolicy.rules[0].onJobFailureReasons[0]: Unsupported value: \"Evicted\": supported values: \"BackoffLimitExceeded\", \"DeadlineExceeded\", \"FailedIndexes\", \"MaxFailedIndexesExceeded\", \"PodFailurePolicy\"",
            ],
        ),
        (
            "message pattern not a regular expression",
            set_json(
                json!({"failurePolicy": {"rules": [rule("r", json!({"onJobFailureMessagePatterns": ["ok.*", "(unclosed"]}))]}}),
            ),
            vec!["spec.failurePolicy.rules[0].onJobFailureMessagePatterns[1]"],
        ),
        (
            "success target unknown",
            set_json(json!({"successPolicy": {"targetReplicatedJobs": ["ps"]}})),
            vec![
                "spec.successPolicy.targetReplicatedJobs[0]: Invalid value: \"ps\": must name a replicatedJob of this set",
            ],
        ),
        (
            "coordinator unknown",
            set_json(json!({"coordinator": {"replicatedJob": "ps"}})),
            vec!["spec.coordinator.replicatedJob: Invalid value: \"ps\": must name a replicatedJob of this set"],
        ),
        (
            "coordinator job index",
            set_json(json!({"coordinator": {"replicatedJob": "workers", "jobIndex": 2}})),
            vec![
                "spec.coordinator.jobIndex: Invalid value: 2: must be less than 2 (the replicas of replicatedJob workers)",
            ],
        ),
        (
            "coordinator pod index",
            set_json(json!({"coordinator": {"replicatedJob": "leader", "podIndex": 2}})),
            vec![
                "spec.coordinator.podIndex: Invalid value: 2: must be less than 2 (the completions of replicatedJob leader)",
            ],
        ),
        (
            "coordinator in a non-indexed job",
            with_rjobs(vec![rjob("a", 1, json!({"template": {"spec": {"completionMode": "NonIndexed"}}}))])
                .as_object()
                .map(|o| {
                    let mut v = Value::Object(o.clone());
                    v["coordinator"] = json!({"replicatedJob": "a"});
                    v
                })
                .expect("object"),
            vec![
                "spec.coordinator.replicatedJob: Invalid value: \"a\": job for coordinator pod must be indexed completion mode, and completions number must be set",
            ],
        ),
        (
            "subdomain not a DNS-1035 label",
            set_json(json!({"network": {"subdomain": "1ddp"}})),
            vec!["spec.network.subdomain"],
        ),
        ("subdomain with a dot", set_json(json!({"network": {"subdomain": "a.b"}})), vec!["spec.network.subdomain"]),
        (
            "groupName not a DNS-1035 label",
            with_rjobs(vec![rjob("a", 1, json!({"groupName": "1st"}))]),
            vec!["spec.replicatedJobs[0].groupName"],
        ),
        ("groupName", with_rjobs(vec![rjob("a", 1, json!({"groupName": "trainers"}))]), vec![]),
        (
            "managedBy not a path",
            set_json(json!({"managedBy": "kueue"})),
            vec!["spec.managedBy: Invalid value: \"kueue\": must be a domain-prefixed path (such as \"acme.io/foo\")"],
        ),
        (
            "template backoffLimitPerIndex: children are Indexed by default",
            with_rjobs(vec![rjob("a", 1, json!({"template": {"spec": {"backoffLimitPerIndex": 1}}}))]),
            vec![],
        ),
        (
            "template backoffLimitPerIndex when NonIndexed",
            with_rjobs(vec![rjob(
                "a",
                1,
                json!({"template": {"spec": {"completionMode": "NonIndexed", "backoffLimitPerIndex": 1}}}),
            )]),
            vec![
                "spec.replicatedJobs[0].template.spec.backoffLimitPerIndex: Invalid value: 1: requires indexed completion mode",
            ],
        ),
    ];
    let mut failures = Vec::new();
    for (name, spec, want) in cases {
        let got = lines(&validate_jobset(&set(spec), None));
        if !errors_match(&want, &got) {
            failures.push(format!("{name}: want {want:#?}\n got {got:#?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn update_rules_freeze_what_jobset_freezes() {
    let base = || {
        set_json(json!({"network": {"subdomain": "ddp"}, "failurePolicy": {"maxRestarts": 1},
            "successPolicy": {"operator": "Any"}, "startupPolicy": {"startupPolicyOrder": "AnyOrder"}}))
    };
    let dep = |name: &str| json!([{"name": name, "status": "Ready"}]);
    let cases: Vec<(&str, Value, Vec<&str>)> = vec![
        ("suspend and ttl may change", json!({"suspend": true, "ttlSecondsAfterFinished": 5}), vec![]),
        (
            "network",
            json!({"network": {"subdomain": "other"}}),
            vec!["spec.network: Invalid value: \"object\": Value is immutable"],
        ),
        (
            "network cleared",
            json!({"network": null}),
            vec!["spec.network: Invalid value: \"object\": Value is immutable"],
        ),
        (
            "failurePolicy",
            json!({"failurePolicy": {"maxRestarts": 2}}),
            vec!["spec.failurePolicy: Invalid value: \"object\": Value is immutable"],
        ),
        (
            "successPolicy",
            json!({"successPolicy": {"operator": "All"}}),
            vec!["spec.successPolicy: Invalid value: \"object\": Value is immutable"],
        ),
        (
            "startupPolicy",
            json!({"startupPolicy": {"startupPolicyOrder": "InOrder"}}),
            vec!["spec.startupPolicy: Invalid value: \"object\": Value is immutable"],
        ),
        (
            "managedBy",
            json!({"managedBy": "example.com/x"}),
            vec!["spec.managedBy: Invalid value: \"example.com/x\": field is immutable"],
        ),
    ];
    let mut failures = Vec::new();
    for (name, patch, want) in cases {
        let old = set(base());
        let mut now = base();
        merge(&mut now, patch);
        let got = lines(&validate_jobset(&set(now), Some(&old)));
        if got != want {
            failures.push(format!("{name}: want {want:#?}\n got {got:#?}"));
        }
    }
    // dependsOn, on a replicatedJob matched by name.
    let old = set(with_rjobs(vec![rjob("a", 1, json!({})), rjob("b", 1, json!({}))]));
    let now = set(with_rjobs(vec![rjob("a", 1, json!({})), rjob("b", 1, json!({"dependsOn": dep("a")}))]));
    let got = lines(&validate_jobset(&now, Some(&old)));
    if got != ["spec.replicatedJobs[1].dependsOn: Invalid value: \"array\": Value is immutable"] {
        failures.push(format!("dependsOn set: got {got:#?}"));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn message_patterns_compile_or_say_why() {
    for ok in ["", "Pod .* failed", "^exit code (42|43)$", "[a-z]+"] {
        assert_eq!(regex_error(ok), None, "{ok}");
    }
    for bad in ["(", "[a-", "a{2,1}"] {
        assert!(regex_error(bad).is_some_and(|e| !e.is_empty()), "{bad}");
    }
}

fn reference_rule_name(s: &str) -> bool {
    // `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`, spelled out character class by character class.
    let c: Vec<char> = s.chars().collect();
    let first = |x: char| x.is_ascii_alphabetic();
    let mid = |x: char| x.is_ascii_alphanumeric() || "_,:".contains(x);
    let last = |x: char| x.is_ascii_alphanumeric() || x == '_';
    match c.as_slice() {
        [] => false,
        [a] => first(*a),
        [a, rest @ .., z] => first(*a) && rest.iter().all(|x| mid(*x)) && last(*z),
    }
}

proptest! {
    #[test]
    fn rule_names_follow_jobsets_pattern(s in "[A-Za-z0-9_,:. -]{0,6}") {
        prop_assert_eq!(is_rule_name(&s), reference_rule_name(&s));
        let spec = set_json(json!({"failurePolicy": {"rules": [rule(&s, json!({}))]}}));
        let errs = validate_jobset(&set(spec), None);
        prop_assert_eq!(errs.is_empty(), reference_rule_name(&s), "{:?}", errs);
    }
}

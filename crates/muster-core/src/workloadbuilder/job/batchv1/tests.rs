//! batch/v1's rules for the new JobSpec fields, through `validate_job` (what the webhook and
//! `muster validate` run): a table of specs with the exact errors upstream gives them, update
//! tables, and properties of the index-list parser and the selector matcher.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::workloadbuilder::job::test_support::{errors_match, merge};
use crate::workloadbuilder::job::validate_job;
use muster_api::MusterJob;

fn job(spec: Value) -> MusterJob {
    let mut spec_json = json!({
        "parallelism": 2,
        "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}],
            "initContainers": [{"name": "setup", "image": "busybox"}]}},
    });
    merge(&mut spec_json, spec);
    serde_json::from_value(json!({
        "apiVersion": "batch.muster.dev/v1alpha1", "kind": "MusterJob",
        "metadata": {"name": "j", "uid": "u-1"}, "spec": spec_json,
    }))
    .expect("job fixture")
}

fn lines(spec: Value) -> Vec<String> {
    validate_job(&job(spec), None).iter().map(|e| e.to_string()).collect()
}

fn update_lines(base: Value, patch: Value) -> Vec<String> {
    let old = job(base.clone());
    let mut now = base;
    merge(&mut now, patch);
    validate_job(&job(now), Some(&old)).iter().map(|e| e.to_string()).collect()
}

fn indexed(n: i32) -> Value {
    json!({"completionMode": "Indexed", "completions": n, "parallelism": n})
}

fn with(mut base: Value, more: Value) -> Value {
    merge(&mut base, more);
    base
}

fn exit_rule(action: &str, operator: &str, values: Value) -> Value {
    json!({"action": action, "onExitCodes": {"operator": operator, "values": values}})
}

fn pfp(rules: Value) -> Value {
    json!({"podFailurePolicy": {"rules": rules}})
}

#[test]
fn create_rules_give_batch_v1s_errors() {
    let disruption = json!({"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]});
    let cases: Vec<(&str, Value, Vec<&str>)> = vec![
        // Accepted: the PyTorch job and its neighbours.
        (
            "ddp job",
            with(
                indexed(4),
                with(
                    json!({"backoffLimitPerIndex": 1, "maxFailedIndexes": 2}),
                    pfp(json!([
                        disruption.clone(),
                        exit_rule("FailIndex", "In", json!([42])),
                        exit_rule("FailJob", "NotIn", json!([0, 1, 2]))
                    ])),
                ),
            ),
            vec![],
        ),
        (
            "pfp with replacement Failed",
            with(pfp(json!([disruption.clone()])), json!({"podReplacementPolicy": "Failed"})),
            vec![],
        ),
        ("replacement TerminatingOrFailed alone", json!({"podReplacementPolicy": "TerminatingOrFailed"}), vec![]),
        (
            "exit codes of an init container",
            pfp(
                json!([{"action": "Count", "onExitCodes": {"containerName": "setup", "operator": "In", "values": [3]}}]),
            ),
            vec![],
        ),
        (
            "condition status False",
            pfp(json!([{"action": "Ignore", "onPodConditions": [{"type": "example.com/Custom", "status": "False"}]}])),
            vec![],
        ),
        (
            "success policy",
            with(
                indexed(4),
                json!({"successPolicy": {"rules": [{"succeededIndexes": "0-2", "succeededCount": 3}, {"succeededCount": 4}]}}),
            ),
            vec![],
        ),
        ("managedBy other", json!({"managedBy": "kueue.x-k8s.io/multikueue"}), vec![]),
        (
            "manual selector matching",
            json!({"manualSelector": true, "selector": {"matchLabels": {"app": "x"}}, "template": {"metadata": {"labels": {"app": "x"}}}}),
            vec![],
        ),
        (
            "generated selector stated",
            json!({"selector": {"matchLabels": {"batch.kubernetes.io/job-name": "j", "controller-uid": "u-1"}}}),
            vec![],
        ),
        ("empty selector", json!({"selector": {}}), vec![]),
        // Refused.
        (
            "backoffLimitPerIndex non-indexed",
            json!({"backoffLimitPerIndex": 1}),
            vec!["spec.backoffLimitPerIndex: Invalid value: 1: requires indexed completion mode"],
        ),
        (
            "maxFailedIndexes alone",
            with(indexed(4), json!({"maxFailedIndexes": 1})),
            vec!["spec.backoffLimitPerIndex: Required value: when maxFailedIndexes is specified"],
        ),
        (
            "maxFailedIndexes non-indexed",
            json!({"backoffLimitPerIndex": 1, "maxFailedIndexes": 1}),
            vec![
                "spec.backoffLimitPerIndex: Invalid value: 1: requires indexed completion mode",
                "spec.maxFailedIndexes: Invalid value: 1: requires indexed completion mode",
            ],
        ),
        (
            "maxFailedIndexes above completions",
            with(indexed(4), json!({"backoffLimitPerIndex": 1, "maxFailedIndexes": 5})),
            vec!["spec.maxFailedIndexes: Invalid value: 5: must be less than or equal to completions"],
        ),
        (
            "negative per-index limit",
            with(indexed(4), json!({"backoffLimitPerIndex": -1})),
            vec!["spec.backoffLimitPerIndex: Invalid value: -1: must be greater than or equal to 0"],
        ),
        (
            "too many rules",
            pfp(Value::Array((1..=21).map(|i| exit_rule("Count", "In", json!([i]))).collect())),
            vec!["spec.podFailurePolicy.rules: Too many: 21: must have at most 20 items"],
        ),
        (
            "exit code 0 with In",
            pfp(json!([exit_rule("FailJob", "In", json!([0, 1]))])),
            vec![
                "spec.podFailurePolicy.rules[0].onExitCodes.values[0]: Invalid value: 0: must not be 0 for the In operator",
            ],
        ),
        (
            "exit codes unordered and repeated",
            pfp(json!([exit_rule("FailJob", "NotIn", json!([3, 1, 3]))])),
            vec![
                "spec.podFailurePolicy.rules[0].onExitCodes.values[2]: Duplicate value: 3",
                "spec.podFailurePolicy.rules[0].onExitCodes.values: Invalid value: [3, 1, 3]: must be ordered",
            ],
        ),
        (
            "no exit codes",
            pfp(json!([exit_rule("FailJob", "In", json!([]))])),
            vec![
                "spec.podFailurePolicy.rules[0].onExitCodes.values: Invalid value: []: at least one value is required",
            ],
        ),
        (
            "256 exit codes",
            pfp(json!([exit_rule("FailJob", "In", Value::Array((1..=256).map(|i| json!(i)).collect()))])),
            vec!["spec.podFailurePolicy.rules[0].onExitCodes.values: Too many: 256: must have at most 255 items"],
        ),
        (
            "unknown operator",
            pfp(json!([exit_rule("FailJob", "Gt", json!([1]))])),
            vec![
                "spec.podFailurePolicy.rules[0].onExitCodes.operator: Unsupported value: \"Gt\": supported values: \"In\", \"NotIn\"",
            ],
        ),
        (
            "unknown container",
            pfp(
                json!([{"action": "FailJob", "onExitCodes": {"containerName": "nope", "operator": "In", "values": [1]}}]),
            ),
            vec![
                "spec.podFailurePolicy.rules[0].onExitCodes.containerName: Invalid value: \"nope\": must be one of the container or initContainer names in the pod template",
            ],
        ),
        (
            "both requirements",
            pfp(
                json!([{"action": "Ignore", "onExitCodes": {"operator": "In", "values": [1]}, "onPodConditions": [{"type": "DisruptionTarget"}]}]),
            ),
            vec![
                "spec.podFailurePolicy.rules[0]: Invalid value: specifying both OnExitCodes and OnPodConditions is not supported",
            ],
        ),
        (
            "no requirement",
            pfp(json!([{"action": "Ignore"}])),
            vec![
                "spec.podFailurePolicy.rules[0]: Invalid value: specifying one of OnExitCodes and OnPodConditions is required",
            ],
        ),
        (
            "empty onPodConditions is no requirement",
            pfp(json!([{"action": "Ignore", "onPodConditions": []}])),
            vec![
                "spec.podFailurePolicy.rules[0]: Invalid value: specifying one of OnExitCodes and OnPodConditions is required",
            ],
        ),
        (
            "condition type not a qualified name",
            pfp(json!([{"action": "Ignore", "onPodConditions": [{"type": "Bad Type"}]}])),
            vec!["spec.podFailurePolicy.rules[0].onPodConditions[0].type"],
        ),
        (
            "condition status unknown",
            pfp(json!([{"action": "Ignore", "onPodConditions": [{"type": "Ready", "status": "Maybe"}]}])),
            vec![
                "spec.podFailurePolicy.rules[0].onPodConditions[0].status: Unsupported value: \"Maybe\": supported values: \"False\", \"True\", \"Unknown\"",
            ],
        ),
        (
            "FailIndex without per-index limit",
            with(indexed(2), pfp(json!([exit_rule("FailIndex", "In", json!([1]))]))),
            vec![
                "spec.podFailurePolicy.rules[0].action: Invalid value: \"FailIndex\": requires the backoffLimitPerIndex to be set",
            ],
        ),
        (
            "unknown action",
            pfp(json!([exit_rule("Retry", "In", json!([1]))])),
            vec![
                "spec.podFailurePolicy.rules[0].action: Unsupported value: \"Retry\": supported values: \"Count\", \"FailIndex\", \"FailJob\", \"Ignore\"",
            ],
        ),
        (
            "empty action",
            pfp(json!([exit_rule("", "In", json!([1]))])),
            vec![
                "spec.podFailurePolicy.rules[0].action: Required value: valid values: [\"Count\" \"FailIndex\" \"FailJob\" \"Ignore\"]",
            ],
        ),
        (
            "pfp with OnFailure",
            with(pfp(json!([disruption.clone()])), json!({"template": {"spec": {"restartPolicy": "OnFailure"}}})),
            vec![
                "spec.template.spec.restartPolicy: Invalid value: \"OnFailure\": only \"Never\" is supported when podFailurePolicy is specified",
            ],
        ),
        (
            "pfp with TerminatingOrFailed",
            with(pfp(json!([disruption.clone()])), json!({"podReplacementPolicy": "TerminatingOrFailed"})),
            vec!["spec.podReplacementPolicy: Unsupported value: \"TerminatingOrFailed\": supported values: \"Failed\""],
        ),
        (
            "success policy non-indexed",
            json!({"successPolicy": {"rules": [{"succeededCount": 1}]}}),
            vec!["spec.successPolicy: Invalid value: {...}: requires indexed completion mode"],
        ),
        (
            "success policy without rules",
            with(indexed(2), json!({"successPolicy": {"rules": []}})),
            vec![
                "spec.successPolicy.rules: Required value: at least one rules must be specified when the successPolicy is specified",
            ],
        ),
        (
            "success rule empty",
            with(indexed(2), json!({"successPolicy": {"rules": [{}]}})),
            vec![
                "spec.successPolicy.rules[0]: Required value: at least one of succeededCount or succeededIndexes must be specified",
            ],
        ),
        (
            "succeededCount above completions",
            with(indexed(2), json!({"successPolicy": {"rules": [{"succeededCount": 3}]}})),
            vec![
                "spec.successPolicy.rules[0].succeededCount: Invalid value: 3: must be less than or equal to 2 (the number of specified completions)",
            ],
        ),
        (
            "succeededCount above its indexes",
            with(indexed(4), json!({"successPolicy": {"rules": [{"succeededIndexes": "0,2", "succeededCount": 3}]}})),
            vec![
                "spec.successPolicy.rules[0].succeededCount: Invalid value: 3: must be less than or equal to 2 (the number of indexes in the specified succeededIndexes field)",
            ],
        ),
        (
            "succeededIndexes out of range",
            with(indexed(4), json!({"successPolicy": {"rules": [{"succeededIndexes": "1-4"}]}})),
            vec![
                "spec.successPolicy.rules[0].succeededIndexes: Invalid value: \"1-4\": error parsing succeededIndexes: too large index: \"4\"",
            ],
        ),
        (
            "managedBy not a path",
            json!({"managedBy": "muster"}),
            vec!["spec.managedBy: Invalid value: \"muster\": must be a domain-prefixed path (such as \"acme.io/foo\")"],
        ),
        (
            "managedBy too long",
            json!({"managedBy": format!("example.com/{}", "x".repeat(60))}),
            vec!["spec.managedBy: Too long: may not be more than 63 bytes"],
        ),
        ("managedBy bad host", json!({"managedBy": "Example.com/x"}), vec!["spec.managedBy"]),
        (
            "selector without manualSelector",
            json!({"selector": {"matchLabels": {"app": "x"}}, "template": {"metadata": {"labels": {"app": "x"}}}}),
            vec!["spec.selector: Invalid value: {...}: `selector` not auto-generated"],
        ),
        (
            "manual selector not matching",
            json!({"manualSelector": true, "selector": {"matchLabels": {"app": "x"}}}),
            vec!["spec.template.metadata.labels"],
        ),
        (
            "manual selector missing",
            json!({"manualSelector": true}),
            vec![
                "spec.selector: Required value",
                "spec.template.metadata.labels: Invalid value: null: `selector` does not match template `labels`",
            ],
        ),
        (
            "selector In without values",
            json!({"manualSelector": true, "selector": {"matchExpressions": [{"key": "app", "operator": "In"}]}}),
            vec![
                "spec.selector.matchExpressions[0].values: Required value: must be specified when `operator` is 'In' or 'NotIn'",
            ],
        ),
    ];
    let mut failures = Vec::new();
    for (name, spec, want) in cases {
        let got = lines(spec);
        if !errors_match(&want, &got) {
            failures.push(format!("{name}: want {want:#?}\n got {got:#?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn update_rules_freeze_what_batch_v1_freezes_and_allow_elastic_indexed_jobs() {
    let pfp_base = with(
        indexed(4),
        with(json!({"backoffLimitPerIndex": 1}), pfp(json!([exit_rule("FailIndex", "In", json!([1]))]))),
    );
    let cases: Vec<(&str, Value, Value, Vec<&str>)> = vec![
        ("elastic scale up", indexed(2), json!({"completions": 4, "parallelism": 4}), vec![]),
        ("elastic scale down", indexed(4), json!({"completions": 1, "parallelism": 1}), vec![]),
        (
            "elastic without parallelism",
            indexed(2),
            json!({"completions": 3}),
            vec!["spec.completions: Invalid value: 3: can only be modified in tandem with spec.parallelism"],
        ),
        (
            "non-indexed completions",
            json!({"completions": 2}),
            json!({"completions": 3, "parallelism": 3}),
            vec!["spec.completions: Invalid value: 3: field is immutable"],
        ),
        (
            "elastic below maxFailedIndexes",
            with(indexed(4), json!({"backoffLimitPerIndex": 1, "maxFailedIndexes": 3})),
            json!({"completions": 2, "parallelism": 2}),
            vec!["spec.maxFailedIndexes: Invalid value: 3: must be less than or equal to completions"],
        ),
        (
            "pod failure policy changed",
            pfp_base.clone(),
            pfp(json!([exit_rule("FailIndex", "In", json!([2]))])),
            vec!["spec.podFailurePolicy: Invalid value: {...}: field is immutable"],
        ),
        (
            "pod failure policy removed",
            pfp_base.clone(),
            json!({"podFailurePolicy": null}),
            vec!["spec.podFailurePolicy: Invalid value: {...}: field is immutable"],
        ),
        (
            "per-index limit changed",
            with(indexed(4), json!({"backoffLimitPerIndex": 1})),
            json!({"backoffLimitPerIndex": 2}),
            vec!["spec.backoffLimitPerIndex: Invalid value: 2: field is immutable"],
        ),
        (
            "maxFailedIndexes may change",
            with(indexed(4), json!({"backoffLimitPerIndex": 1, "maxFailedIndexes": 1})),
            json!({"maxFailedIndexes": 2}),
            vec![],
        ),
        (
            "success policy changed",
            with(indexed(4), json!({"successPolicy": {"rules": [{"succeededCount": 1}]}})),
            json!({"successPolicy": {"rules": [{"succeededCount": 2}]}}),
            vec!["spec.successPolicy: Invalid value: {...}: field is immutable"],
        ),
        (
            "managedBy set",
            json!({}),
            json!({"managedBy": "example.com/other"}),
            vec!["spec.managedBy: Invalid value: \"example.com/other\": field is immutable"],
        ),
        (
            "selector changed",
            json!({"manualSelector": true, "selector": {"matchLabels": {"app": "x"}}, "template": {"metadata": {"labels": {"app": "x", "v": "1"}}}}),
            json!({"selector": {"matchLabels": {"v": "1"}}}),
            vec!["spec.selector: Invalid value: {...}: field is immutable"],
        ),
        (
            "suspended: the template stays frozen (muster differs from batch/v1 here)",
            json!({"suspend": true}),
            json!({"template": {"spec": {"nodeSelector": {"pool": "b"}}}}),
            vec!["spec.template: Invalid value: {...}: field is immutable"],
        ),
        (
            "running: where pods go is frozen",
            json!({}),
            json!({"template": {"spec": {"nodeSelector": {"pool": "b"}}}}),
            vec!["spec.template: Invalid value: {...}: field is immutable"],
        ),
        (
            "replacement policy may change",
            json!({"podReplacementPolicy": "Failed"}),
            json!({"podReplacementPolicy": "TerminatingOrFailed"}),
            vec![],
        ),
    ];
    let mut failures = Vec::new();
    for (name, base, patch, want) in cases {
        let got = update_lines(base, patch);
        if got != want {
            failures.push(format!("{name}: want {want:#?}\n got {got:#?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn index_lists_parse_as_batch_v1_parses_them() {
    let cases: Vec<(&str, i32, Result<i64, &str>)> = vec![
        ("", 3, Ok(0)),
        ("0", 1, Ok(1)),
        ("0-2,5,7-9", 10, Ok(7)),
        ("1-4", 4, Err("too large index: \"4\"")),
        ("2,1", 4, Err("non-increasing order, previous: 2, current: 1")),
        ("0-2,2", 4, Err("non-increasing order, previous: 2, current: 2")),
        ("3-3", 4, Err("non-increasing order, previous: 3, current: 3")),
        (
            "1-2-3",
            4,
            Err(
                "the fragment \"1-2-3\" violates the requirement that an index interval can have at most two parts separated by '-'",
            ),
        ),
        ("a", 4, Err("cannot convert string to integer for index: \"a\"")),
        (",", 4, Err("cannot convert string to integer for index: \"\"")),
    ];
    for (s, completions, want) in cases {
        assert_eq!(indexes_total(s, completions), want.map_err(str::to_string), "{s}");
    }
}

fn selector(v: Value) -> LabelSelector {
    serde_json::from_value(v).expect("selector")
}

#[test]
fn selectors_match_as_label_selectors_do() {
    let labels: BTreeMap<String, String> = [("app", "x"), ("tier", "a")].map(|(k, v)| (k.into(), v.into())).into();
    let yes = [
        json!({}),
        json!({"matchLabels": {"app": "x"}}),
        json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]}),
        json!({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["b"]}, {"key": "app", "operator": "Exists"}]}),
        json!({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}),
    ];
    let no = [
        json!({"matchLabels": {"app": "y"}}),
        json!({"matchLabels": {"zone": "x"}}),
        json!({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a"]}]}),
        json!({"matchExpressions": [{"key": "zone", "operator": "Exists"}]}),
        json!({"matchLabels": {"app": "x"}, "matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}),
    ];
    for s in yes {
        assert!(matches(&selector(s.clone()), &labels), "{s}");
    }
    for s in no {
        assert!(!matches(&selector(s.clone()), &labels), "{s}");
    }
}

proptest! {
    /// Any list of increasing disjoint intervals below `completions` parses to its size; the
    /// same list past `completions` is refused.
    #[test]
    fn interval_lists_round_trip(gaps in prop::collection::vec((0i64..5, 0i64..5), 0..8)) {
        let mut next = 0i64;
        let mut parts = Vec::new();
        let mut total = 0;
        for (gap, len) in gaps {
            let x = next + gap;
            let y = x + len;
            parts.push(if len == 0 { x.to_string() } else { format!("{x}-{y}") });
            total += len + 1;
            next = y + 1;
        }
        let s = parts.join(",");
        let completions = i32::try_from(next.max(1)).unwrap();
        prop_assert_eq!(indexes_total(&s, completions), Ok(total));
        if !parts.is_empty() {
            prop_assert!(indexes_total(&s, completions - 1).is_err());
        }
    }

    /// Exit code lists: refused exactly when empty, unsorted, repeated, or holding 0 under In.
    #[test]
    fn exit_code_values(values in prop::collection::vec(0i32..6, 0..6), op_in in any::<bool>()) {
        let op = if op_in { "In" } else { "NotIn" };
        let errs = validate_job(&job(pfp(json!([exit_rule("FailJob", op, json!(values))]))), None);
        let sorted_unique = values.windows(2).all(|w| w[0] < w[1]);
        let valid = !values.is_empty() && sorted_unique && !(op_in && values.contains(&0));
        prop_assert_eq!(errs.is_empty(), valid, "{:?}", errs);
        for e in &errs {
            prop_assert!(e.path.as_str().starts_with("spec.podFailurePolicy.rules[0].onExitCodes.values"), "{}", e);
        }
    }
}

//! The validation cases of a job's spec, shared by the webhook tests (muster must refuse them
//! at these field paths) and the differential tests (a batch/v1 Job must be refused at the same
//! paths, except where a case names why muster differs on purpose).

use std::collections::BTreeSet;

use serde_json::{Value, json};

/// One create: a spec fragment merged into [`base_spec`], and what muster makes of it.
pub struct Case {
    /// What the case checks (also the object name, with `_` as `-`).
    pub name: &'static str,
    /// Merged (RFC 7386) into [`base_spec`].
    pub spec: Value,
    /// Object name, when not derived from `name`.
    pub object_name: Option<String>,
    /// The field paths muster refuses it with; empty: admitted.
    pub paths: &'static [&'static str],
    /// Where batch/v1 differs on purpose: its paths (empty: admitted) and why.
    pub upstream: Option<(&'static [&'static str], &'static str)>,
}

/// One update: a merge patch applied to a base object created from [`base_spec`] + `base`.
pub struct UpdateCase {
    /// What the case checks.
    pub name: &'static str,
    /// Name of the base object (one of [`update_bases`]).
    pub base: &'static str,
    /// The merge patch.
    pub patch: Value,
    /// The field paths muster refuses it with; empty: admitted.
    pub paths: &'static [&'static str],
    /// Where batch/v1 differs on purpose: its paths and why.
    pub upstream: Option<(&'static [&'static str], &'static str)>,
}

fn case(name: &'static str, spec: Value, paths: &'static [&'static str]) -> Case {
    Case { name, spec, object_name: None, paths, upstream: None }
}

/// A job of two pods that runs a container once.
pub fn base_spec() -> Value {
    json!({
        "parallelism": 2,
        "template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "main", "image": "registry.invalid/none"}]}},
    })
}

fn scheduling(s: Value) -> Value {
    json!({"scheduling": s})
}

fn claims(n: usize) -> Value {
    Value::Array((0..n).map(|i| json!({"name": format!("c{i}"), "resourceClaimName": "shared"})).collect())
}

const PER_INDEX: &str = "spec.backoffLimitPerIndex";
const MAX_FAILED: &str = "spec.maxFailedIndexes";

/// `spec` on an Indexed job of 2 completions.
fn indexed(spec: Value) -> Value {
    merged(json!({"completionMode": "Indexed", "completions": 2}), spec)
}

fn merged(mut a: Value, b: Value) -> Value {
    merge_patch(&mut a, &b);
    a
}

fn pfp(rules: Value) -> Value {
    json!({"podFailurePolicy": {"rules": rules}})
}

fn exit_rule(action: &str, operator: &str, values: Value) -> Value {
    json!({"action": action, "onExitCodes": {"operator": operator, "values": values}})
}

/// The usual rule of preemptible training: a pod with `DisruptionTarget` does not count.
fn disruption() -> Value {
    json!({"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]})
}

const MIN_COUNT: &str = "spec.scheduling.schedulingPolicy.gang.minCount";
const POLICY: &str = "spec.scheduling.schedulingPolicy";
const MODE: &str = "spec.scheduling.disruptionMode";

/// Every rule of a job's spec on create, and a few specs that must pass.
pub fn create_cases() -> Vec<Case> {
    vec![
        case("policy_with_both_members", scheduling(json!({"schedulingPolicy": {"basic": {}, "gang": {}}})), &[POLICY]),
        case("policy_with_no_member", scheduling(json!({"schedulingPolicy": {}})), &[POLICY]),
        case("min_count_zero", scheduling(json!({"schedulingPolicy": {"gang": {"minCount": 0}}})), &[MIN_COUNT]),
        case(
            "min_count_above_parallelism",
            scheduling(json!({"schedulingPolicy": {"gang": {"minCount": 3}}})),
            &[MIN_COUNT],
        ),
        case(
            "two_topology_constraints",
            scheduling(json!({"schedulingConstraints": {"topology": [{"key": "a"}, {"key": "b"}]}})),
            &["spec.scheduling.schedulingConstraints.topology"],
        ),
        case(
            "topology_key_not_a_label_key",
            scheduling(json!({"schedulingConstraints": {"topology": [{"key": "bad key!"}]}})),
            &["spec.scheduling.schedulingConstraints.topology[0].key"],
        ),
        case(
            "topology_key_empty",
            scheduling(json!({"schedulingConstraints": {"topology": [{"key": ""}]}})),
            &["spec.scheduling.schedulingConstraints.topology[0].key"],
        ),
        case("five_claims", scheduling(json!({"resourceClaims": claims(5)})), &["spec.scheduling.resourceClaims"]),
        case(
            "duplicate_claim_names",
            scheduling(json!({"resourceClaims": [
                {"name": "a", "resourceClaimName": "x"}, {"name": "a", "resourceClaimName": "y"}]})),
            &["spec.scheduling.resourceClaims[1]"],
        ),
        case(
            "claim_with_both_sources",
            scheduling(json!({"resourceClaims": [
                {"name": "a", "resourceClaimName": "x", "resourceClaimTemplateName": "y"}]})),
            &["spec.scheduling.resourceClaims[0]"],
        ),
        case(
            "claim_without_source",
            scheduling(json!({"resourceClaims": [{"name": "a"}]})),
            &["spec.scheduling.resourceClaims[0]"],
        ),
        case(
            "claim_name_not_a_dns_label",
            scheduling(json!({"resourceClaims": [{"name": "A_b", "resourceClaimName": "x"}]})),
            &["spec.scheduling.resourceClaims[0].name"],
        ),
        case(
            "claim_source_not_a_dns_subdomain",
            scheduling(json!({"resourceClaims": [{"name": "a", "resourceClaimTemplateName": "X_y"}]})),
            &["spec.scheduling.resourceClaims[0].resourceClaimTemplateName"],
        ),
        case(
            "basic_with_disruption_mode_all",
            scheduling(json!({"schedulingPolicy": {"basic": {}}, "disruptionMode": {"all": {}}})),
            &[MODE],
        ),
        case("default_basic_with_disruption_mode_all", scheduling(json!({"disruptionMode": {"all": {}}})), &[MODE]),
        case(
            "disruption_mode_with_both_members",
            scheduling(json!({"disruptionMode": {"single": {}, "all": {}}})),
            &[MODE],
        ),
        case("disruption_mode_with_no_member", scheduling(json!({"disruptionMode": {}})), &[MODE]),
        case(
            "restart_policy_always",
            json!({"template": {"spec": {"restartPolicy": "Always"}}}),
            &["spec.template.spec.restartPolicy"],
        ),
        case("indexed_without_completions", json!({"completionMode": "Indexed"}), &["spec.completions"]),
        case("negative_parallelism", json!({"parallelism": -1}), &["spec.parallelism"]),
        case(
            "gang_with_disruption_mode_all",
            scheduling(json!({"schedulingPolicy": {"gang": {}}, "disruptionMode": {"all": {}}})),
            &[],
        ),
        case("min_count_equal_to_parallelism", scheduling(json!({"schedulingPolicy": {"gang": {"minCount": 2}}})), &[]),
        case(
            "default_min_count_with_zero_parallelism",
            json!({"parallelism": 0, "scheduling": {"schedulingPolicy": {"gang": {}}}}),
            &[],
        ),
        case("empty_blocks", scheduling(json!({"schedulingConstraints": {"topology": []}, "resourceClaims": []})), &[]),
        case(
            "four_claims_from_both_sources",
            scheduling(json!({"resourceClaims": [
                {"name": "a", "resourceClaimName": "x"}, {"name": "b", "resourceClaimTemplateName": "y"},
                {"name": "c", "resourceClaimName": "z"}, {"name": "d", "resourceClaimTemplateName": "w"}]})),
            &[],
        ),
        // batch/v1's rules for the JobSpec fields a MusterJob shares with Job (1.37).
        case("backoff_limit_per_index_non_indexed", json!({"backoffLimitPerIndex": 1}), &[PER_INDEX]),
        case(
            "max_failed_indexes_without_backoff_limit_per_index",
            indexed(json!({"maxFailedIndexes": 1})),
            &[PER_INDEX],
        ),
        case(
            "max_failed_indexes_non_indexed",
            json!({"backoffLimitPerIndex": 1, "maxFailedIndexes": 1}),
            &[PER_INDEX, MAX_FAILED],
        ),
        case(
            "max_failed_indexes_above_completions",
            indexed(json!({"backoffLimitPerIndex": 1, "maxFailedIndexes": 3})),
            &[MAX_FAILED],
        ),
        case("negative_backoff_limit_per_index", indexed(json!({"backoffLimitPerIndex": -1})), &[PER_INDEX]),
        case(
            "twenty_one_pod_failure_policy_rules",
            pfp(Value::Array((1..=21).map(|i| exit_rule("Count", "In", json!([i]))).collect())),
            &["spec.podFailurePolicy.rules"],
        ),
        case(
            "exit_code_zero_with_in",
            pfp(json!([exit_rule("FailJob", "In", json!([0]))])),
            &["spec.podFailurePolicy.rules[0].onExitCodes.values[0]"],
        ),
        case(
            "exit_codes_unordered",
            pfp(json!([exit_rule("FailJob", "NotIn", json!([2, 1]))])),
            &["spec.podFailurePolicy.rules[0].onExitCodes.values"],
        ),
        case(
            "exit_codes_repeated",
            pfp(json!([exit_rule("FailJob", "In", json!([1, 1]))])),
            &["spec.podFailurePolicy.rules[0].onExitCodes.values[1]"],
        ),
        case(
            "exit_codes_empty",
            pfp(json!([exit_rule("FailJob", "In", json!([]))])),
            &["spec.podFailurePolicy.rules[0].onExitCodes.values"],
        ),
        case(
            "exit_codes_of_an_unknown_container",
            pfp(
                json!([{"action": "FailJob", "onExitCodes": {"containerName": "nope", "operator": "In", "values": [1]}}]),
            ),
            &["spec.podFailurePolicy.rules[0].onExitCodes.containerName"],
        ),
        case(
            "exit_codes_unknown_operator",
            pfp(json!([exit_rule("FailJob", "Gt", json!([1]))])),
            &["spec.podFailurePolicy.rules[0].onExitCodes.operator"],
        ),
        case(
            "rule_with_exit_codes_and_conditions",
            pfp(json!([{"action": "Ignore", "onExitCodes": {"operator": "In", "values": [1]},
                "onPodConditions": [{"type": "DisruptionTarget"}]}])),
            &["spec.podFailurePolicy.rules[0]"],
        ),
        case("rule_without_requirement", pfp(json!([{"action": "Ignore"}])), &["spec.podFailurePolicy.rules[0]"]),
        case(
            "condition_type_not_a_qualified_name",
            pfp(json!([{"action": "Ignore", "onPodConditions": [{"type": "Bad Type"}]}])),
            &["spec.podFailurePolicy.rules[0].onPodConditions[0].type"],
        ),
        case(
            "condition_status_unknown",
            pfp(json!([{"action": "Ignore", "onPodConditions": [{"type": "Ready", "status": "Maybe"}]}])),
            &["spec.podFailurePolicy.rules[0].onPodConditions[0].status"],
        ),
        case(
            "fail_index_without_backoff_limit_per_index",
            indexed(pfp(json!([exit_rule("FailIndex", "In", json!([42]))]))),
            &["spec.podFailurePolicy.rules[0].action"],
        ),
        case(
            "unknown_pod_failure_policy_action",
            pfp(json!([exit_rule("Retry", "In", json!([1]))])),
            &["spec.podFailurePolicy.rules[0].action"],
        ),
        case(
            "pod_failure_policy_with_restart_on_failure",
            merged(pfp(json!([disruption()])), json!({"template": {"spec": {"restartPolicy": "OnFailure"}}})),
            &["spec.template.spec.restartPolicy"],
        ),
        case(
            "pod_failure_policy_with_terminating_or_failed",
            merged(pfp(json!([disruption()])), json!({"podReplacementPolicy": "TerminatingOrFailed"})),
            &["spec.podReplacementPolicy"],
        ),
        case(
            "success_policy_non_indexed",
            json!({"successPolicy": {"rules": [{"succeededCount": 1}]}}),
            &["spec.successPolicy"],
        ),
        case(
            "success_policy_without_rules",
            indexed(json!({"successPolicy": {"rules": []}})),
            &["spec.successPolicy.rules"],
        ),
        case(
            "success_rule_without_count_or_indexes",
            indexed(json!({"successPolicy": {"rules": [{}]}})),
            &["spec.successPolicy.rules[0]"],
        ),
        case(
            "succeeded_count_above_completions",
            indexed(json!({"successPolicy": {"rules": [{"succeededCount": 3}]}})),
            &["spec.successPolicy.rules[0].succeededCount"],
        ),
        case(
            "succeeded_count_above_its_indexes",
            indexed(json!({"successPolicy": {"rules": [{"succeededIndexes": "1", "succeededCount": 2}]}})),
            &["spec.successPolicy.rules[0].succeededCount"],
        ),
        case(
            "succeeded_indexes_out_of_range",
            indexed(json!({"successPolicy": {"rules": [{"succeededIndexes": "0-2"}]}})),
            &["spec.successPolicy.rules[0].succeededIndexes"],
        ),
        case(
            "succeeded_indexes_not_increasing",
            indexed(json!({"successPolicy": {"rules": [{"succeededIndexes": "1,0"}]}})),
            &["spec.successPolicy.rules[0].succeededIndexes"],
        ),
        case(
            "unknown_pod_replacement_policy",
            json!({"podReplacementPolicy": "Sometimes"}),
            &["spec.podReplacementPolicy"],
        ),
        case("unknown_completion_mode", json!({"completionMode": "Striped"}), &["spec.completionMode"]),
        case("managed_by_not_a_domain_prefixed_path", json!({"managedBy": "muster"}), &["spec.managedBy"]),
        case(
            "managed_by_of_64_characters",
            json!({"managedBy": format!("example.com/{}", "x".repeat(52))}),
            &["spec.managedBy"],
        ),
        case(
            "selector_without_manual_selector",
            json!({"selector": {"matchLabels": {"app": "x"}}, "template": {"metadata": {"labels": {"app": "x"}}}}),
            &["spec.selector"],
        ),
        case(
            "manual_selector_not_matching_the_template",
            json!({"manualSelector": true, "selector": {"matchLabels": {"app": "x"}}}),
            &["spec.template.metadata.labels"],
        ),
        case(
            "manual_selector_without_selector",
            json!({"manualSelector": true}),
            &["spec.selector", "spec.template.metadata.labels"],
        ),
        case(
            "manual_selector_in_without_values",
            json!({"manualSelector": true, "selector": {"matchExpressions": [{"key": "app", "operator": "In"}]},
                "template": {"metadata": {"labels": {"app": "x"}}}}),
            &["spec.selector.matchExpressions[0].values"],
        ),
        case(
            "pytorch_ddp_job",
            indexed(merged(
                json!({"backoffLimitPerIndex": 1, "maxFailedIndexes": 1, "podReplacementPolicy": "Failed"}),
                pfp(json!([
                    disruption(),
                    exit_rule("FailIndex", "In", json!([42])),
                    exit_rule("FailJob", "NotIn", json!([0, 1]))
                ])),
            )),
            &[],
        ),
        case(
            "success_policy_on_indexes",
            indexed(json!({"successPolicy": {"rules": [{"succeededIndexes": "0-1", "succeededCount": 1}]}})),
            &[],
        ),
        case(
            "manual_selector_matching_the_template",
            json!({"manualSelector": true, "selector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["x"]}]},
                "template": {"metadata": {"labels": {"app": "x"}}}}),
            &[],
        ),
        case("managed_by_another_controller", json!({"managedBy": "example.com/other"}), &[]),
        case(
            "init_container_exit_codes_and_custom_condition",
            merged(
                json!({"template": {"spec": {"initContainers": [{"name": "setup", "image": "registry.invalid/none"}]}}}),
                pfp(
                    json!([{"action": "Count", "onExitCodes": {"containerName": "setup", "operator": "In", "values": [3]}},
                    {"action": "Ignore", "onPodConditions": [{"type": "example.com/Preempted", "status": "False"}]}]),
                ),
            ),
            &[],
        ),
        Case {
            upstream: Some((
                &["spec.template.spec.restartPolicy"],
                "RESTART_POLICY_DEFAULTS_TO_NEVER: muster's pods default to restartPolicy Never; a batch/v1 pod \
                 template defaults to Always, which a Job refuses",
            )),
            ..case("restart_policy_unset", json!({"template": {"spec": {"restartPolicy": null}}}), &[])
        },
        Case {
            object_name: Some("n".repeat(53)),
            upstream: Some((
                &[],
                "NAME_LEAVES_ROOM_FOR_POD_NAMES: a MusterJob name is at most 52 characters, so \
                 `<name>-<index>-<suffix>` pod names and `<name>-<index>` hostnames fit",
            )),
            ..case("name_of_53_characters", json!({}), &["metadata.name"])
        },
        Case {
            upstream: Some((&[], "NODE_NAME_FORBIDDEN: muster pins pods to nodes when it admits their gang")),
            ..case(
                "node_name_in_template",
                json!({"template": {"spec": {"nodeName": "pool-gpu-0"}}}),
                &["spec.template.spec.nodeName"],
            )
        },
        Case {
            upstream: Some((&[], "ADMISSION_GATE_RESERVED: muster adds its scheduling gate itself")),
            ..case(
                "admission_gate_in_template",
                json!({"template": {"spec": {"schedulingGates": [{"name": "scheduling.muster.dev/admission"}]}}}),
                &["spec.template.spec.schedulingGates"],
            )
        },
        Case {
            upstream: Some((&[], "POD_GROUP_LABEL_RESERVED: muster sets the pod's PodGroup label itself")),
            ..case(
                "pod_group_label_in_template",
                json!({"template": {"metadata": {"labels": {"scheduling.muster.dev/pod-group": "other"}}}}),
                &["spec.template.metadata.labels[scheduling.muster.dev/pod-group]"],
            )
        },
    ]
}

/// The objects updates start from: name and spec fragment.
pub fn update_bases() -> Vec<(&'static str, Value)> {
    vec![
        (
            "frozen",
            json!({"parallelism": 3, "completions": 3, "scheduling": {
                "schedulingPolicy": {"gang": {"minCount": 2}},
                "schedulingConstraints": {"topology": [{"key": "topology.muster.dev/rack"}]},
                "disruptionMode": {"single": {}},
                "resourceClaims": [{"name": "a", "resourceClaimName": "x"}]}}),
        ),
        ("unscheduled", json!({})),
        ("empty-scheduling", json!({"scheduling": {}})),
        ("basic", json!({"scheduling": {"schedulingPolicy": {"basic": {}}}})),
        (
            "indexed",
            json!({"completions": 2, "completionMode": "Indexed", "scheduling": {"schedulingPolicy": {"gang": {}}}}),
        ),
        (
            "policies",
            json!({"completions": 2, "completionMode": "Indexed", "backoffLimitPerIndex": 1, "maxFailedIndexes": 1,
                "podFailurePolicy": {"rules": [
                    {"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [42]}},
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]},
                "successPolicy": {"rules": [{"succeededCount": 2}]}}),
        ),
        ("suspended", json!({"suspend": true})),
        (
            "manual-selector",
            json!({"manualSelector": true, "selector": {"matchLabels": {"app": "x"}},
                "template": {"metadata": {"labels": {"app": "x", "tier": "a"}}}}),
        ),
    ]
}

fn update(name: &'static str, base: &'static str, patch: Value, paths: &'static [&'static str]) -> UpdateCase {
    UpdateCase { name, base, patch, paths, upstream: None }
}

fn spec_patch(s: Value) -> Value {
    json!({"spec": s})
}

/// Every update rule of a job's spec, and the changes that must pass.
pub fn update_cases() -> Vec<UpdateCase> {
    let sched = |s: Value| spec_patch(json!({"scheduling": s}));
    vec![
        update("min_count_changes", "frozen", sched(json!({"schedulingPolicy": {"gang": {"minCount": 3}}})), &[]),
        update("parallelism_changes", "frozen", spec_patch(json!({"parallelism": 4})), &[]),
        update(
            "min_count_above_parallelism",
            "frozen",
            sched(json!({"schedulingPolicy": {"gang": {"minCount": 4}}})),
            &[MIN_COUNT],
        ),
        update("parallelism_below_min_count", "frozen", spec_patch(json!({"parallelism": 1})), &[MIN_COUNT]),
        update("gang_to_basic", "frozen", sched(json!({"schedulingPolicy": {"gang": null, "basic": {}}})), &[POLICY]),
        update(
            "topology_changed",
            "frozen",
            sched(json!({"schedulingConstraints": {"topology": [{"key": "topology.muster.dev/zone"}]}})),
            &["spec.scheduling.schedulingConstraints"],
        ),
        update(
            "topology_removed",
            "frozen",
            sched(json!({"schedulingConstraints": null})),
            &["spec.scheduling.schedulingConstraints"],
        ),
        update(
            "disruption_mode_changed",
            "frozen",
            sched(json!({"disruptionMode": {"single": null, "all": {}}})),
            &[MODE],
        ),
        update(
            "claims_changed",
            "frozen",
            sched(json!({"resourceClaims": [{"name": "b", "resourceClaimName": "x"}]})),
            &["spec.scheduling.resourceClaims"],
        ),
        update("scheduling_cleared", "frozen", spec_patch(json!({"scheduling": null})), &["spec.scheduling"]),
        update(
            "template_changed",
            "frozen",
            spec_patch(json!({"template": {"metadata": {"labels": {"version": "2"}}}})),
            &["spec.template"],
        ),
        update("completions_changed", "frozen", spec_patch(json!({"completions": 4})), &["spec.completions"]),
        update(
            "scheduling_set",
            "unscheduled",
            sched(json!({"schedulingPolicy": {"basic": {}}})),
            &["spec.scheduling"],
        ),
        update(
            "scheduling_policy_set",
            "empty-scheduling",
            sched(json!({"schedulingPolicy": {"basic": {}}})),
            &[POLICY],
        ),
        update("basic_to_gang", "basic", sched(json!({"schedulingPolicy": {"basic": null, "gang": {}}})), &[POLICY]),
        // Elastic Indexed jobs: completions change together with parallelism, equal to it.
        update(
            "indexed_completions_scaled_with_parallelism",
            "indexed",
            spec_patch(json!({"completions": 3, "parallelism": 3})),
            &[],
        ),
        update(
            "indexed_completions_scaled_down_with_parallelism",
            "indexed",
            spec_patch(json!({"completions": 1, "parallelism": 1})),
            &[],
        ),
        update(
            "indexed_completions_without_parallelism",
            "indexed",
            spec_patch(json!({"completions": 3})),
            &["spec.completions"],
        ),
        update(
            "pod_failure_policy_changed",
            "policies",
            spec_patch(json!({"podFailurePolicy": {"rules": [
                {"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [43]}}]}})),
            &["spec.podFailurePolicy"],
        ),
        update(
            "pod_failure_policy_removed",
            "policies",
            spec_patch(json!({"podFailurePolicy": null})),
            &["spec.podFailurePolicy"],
        ),
        update(
            "backoff_limit_per_index_changed",
            "policies",
            spec_patch(json!({"backoffLimitPerIndex": 2})),
            &["spec.backoffLimitPerIndex"],
        ),
        update("max_failed_indexes_changed", "policies", spec_patch(json!({"maxFailedIndexes": 2})), &[]),
        update("backoff_limit_changed", "policies", spec_patch(json!({"backoffLimit": 3})), &[]),
        update(
            "success_policy_changed",
            "policies",
            spec_patch(json!({"successPolicy": {"rules": [{"succeededCount": 1}]}})),
            &["spec.successPolicy"],
        ),
        update(
            "success_policy_set",
            "indexed",
            spec_patch(json!({"successPolicy": {"rules": [{"succeededCount": 1}]}})),
            &["spec.successPolicy"],
        ),
        update(
            "managed_by_set",
            "unscheduled",
            spec_patch(json!({"managedBy": "example.com/other"})),
            &["spec.managedBy"],
        ),
        UpdateCase {
            upstream: Some((
                &[],
                "SUSPENDED_TEMPLATE_FROZEN: batch/v1 lets a suspended Job that has not started change its pod \
                 template's labels, annotations, nodeSelector, tolerations, schedulingGates and node affinity; \
                 muster records the template on the job's PodGroup and keeps it frozen",
            )),
            ..update(
                "suspended_pods_moved",
                "suspended",
                spec_patch(json!({"template": {"metadata": {"labels": {"queue": "a"}},
                    "spec": {"nodeSelector": {"pool": "b"}, "tolerations": [{"key": "gpu", "operator": "Exists"}]}}})),
                &["spec.template"],
            )
        },
        update(
            "manual_selector_changed",
            "manual-selector",
            spec_patch(json!({"selector": {"matchLabels": {"tier": "a"}}})),
            &["spec.selector"],
        ),
    ]
}

/// RFC 7386 merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let t = target.as_object_mut().expect("object");
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// A manifest of `kind` (`Job` or `MusterJob`) named `name` with [`base_spec`] + `spec`.
pub fn job_manifest(kind: &str, name: &str, spec: &Value) -> Value {
    let api_version = if kind == "Job" { "batch/v1" } else { "batch.muster.dev/v1alpha1" };
    let mut full = base_spec();
    merge_patch(&mut full, spec);
    json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name}, "spec": full})
}

/// The field paths of the errors in a kubectl/apiserver message
/// (`spec.x: Invalid value: ...`, one or many, from the schema, CEL or a webhook).
pub fn error_paths(message: &str) -> BTreeSet<String> {
    const KINDS: [&str; 9] = [
        ": Invalid value",
        ": Required value",
        ": Unsupported value",
        ": Duplicate value",
        ": Too many",
        ": Too long",
        ": Forbidden",
        ": Not found",
        ": Internal error",
    ];
    let mut paths = BTreeSet::new();
    for kind in KINDS {
        for (at, _) in message.match_indices(kind) {
            let before = &message[..at];
            let start = before.rfind(char::is_whitespace).map(|i| i + 1).unwrap_or(0);
            let path = before[start..].trim_start_matches('[');
            if !path.is_empty() && path != "<nil>" {
                paths.insert(path.to_string());
            }
        }
    }
    paths
}

/// `paths` as a set.
pub fn path_set(paths: &[&str]) -> BTreeSet<String> {
    paths.iter().map(|p| p.to_string()).collect()
}

#[test]
fn error_paths_reads_kubectl_messages() {
    let one = r#"The Job "p" is invalid: spec.scheduling.schedulingPolicy: Invalid value: "": must specify"#;
    assert_eq!(error_paths(one), path_set(&["spec.scheduling.schedulingPolicy"]));
    let many = "The MusterJob \"p\" is invalid: \n* spec.a.topology: Too many: 2: must have\n* <nil>: Invalid value: null: some";
    assert_eq!(error_paths(many), path_set(&["spec.a.topology"]));
    let webhook = r#"denied the request: MusterJob.batch.muster.dev "p" is invalid: [spec.template.metadata.labels[scheduling.muster.dev/pod-group]: Forbidden: is set, metadata.name: Invalid value: "x": must"#;
    assert_eq!(
        error_paths(webhook),
        path_set(&["spec.template.metadata.labels[scheduling.muster.dev/pod-group]", "metadata.name"])
    );
}

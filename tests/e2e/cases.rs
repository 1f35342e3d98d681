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
        UpdateCase {
            upstream: Some((
                &[],
                "COMPLETIONS_FROZEN: muster freezes completions; batch/v1 lets an Indexed Job change completions \
                 together with parallelism (elastic Indexed Jobs)",
            )),
            ..update(
                "indexed_completions_scaled_with_parallelism",
                "indexed",
                spec_patch(json!({"completions": 3, "parallelism": 3})),
                &["spec.completions"],
            )
        },
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

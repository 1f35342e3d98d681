//! Handler tests on AdmissionReview fixtures, as the apiserver sends them.

use kube::core::admission::AdmissionReview;
use serde_json::{Value, json};

use super::*;

fn request(
    group: &str,
    kind: &str,
    resource: &str,
    op: &str,
    object: Value,
    old: Option<Value>,
) -> AdmissionRequest<DynamicObject> {
    let review: AdmissionReview<DynamicObject> = serde_json::from_value(json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": group, "version": "v1", "kind": kind},
            "resource": {"group": group, "version": "v1", "resource": resource},
            "name": object["metadata"]["name"].clone(),
            "namespace": "team-a",
            "operation": op,
            "userInfo": {"username": "alice"},
            "object": object,
            "oldObject": old,
            "dryRun": false,
        }
    }))
    .expect("review fixture");
    review.try_into().expect("request")
}

fn job(name: &str, parallelism: i32, scheduling: Value) -> Value {
    json!({
        "apiVersion": "batch.muster.dev/v1alpha1", "kind": "MusterJob",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"parallelism": parallelism, "completionMode": "NonIndexed", "backoffLimit": 6, "suspend": false,
                 "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}},
                 "scheduling": scheduling}
    })
}

fn job_request(op: &str, new: Value, old: Option<Value>) -> AdmissionRequest<DynamicObject> {
    request("batch.muster.dev", "MusterJob", "musterjobs", op, new, old)
}

fn causes(resp: &AdmissionResponse) -> Vec<String> {
    resp.result.details.as_ref().map(|d| d.causes.iter().map(|c| c.field.clone()).collect()).unwrap_or_default()
}

#[test]
fn a_valid_job_is_allowed() {
    let (resp, outcome) =
        validate(&job_request("CREATE", job("ok", 4, json!({"schedulingPolicy": {"gang": {"minCount": 4}}})), None));
    assert!(resp.allowed);
    assert_eq!(outcome, Outcome::Allowed);
    assert_eq!(resp.uid, "705ab4f5-6393-11e8-b7cc-42010a800002");
}

#[test]
fn an_invalid_job_is_denied_with_every_field_path() {
    let scheduling = json!({"schedulingPolicy": {"gang": {"minCount": 5}}, "disruptionMode": {}});
    let (resp, outcome) = validate(&job_request("CREATE", job("bad", 4, scheduling), None));
    assert!(!resp.allowed);
    assert_eq!(outcome, Outcome::Denied);
    assert_eq!(resp.result.code, 422);
    assert_eq!(resp.result.reason, "Invalid");
    assert_eq!(causes(&resp), vec!["spec.scheduling.disruptionMode", "spec.scheduling.schedulingPolicy.gang.minCount"]);
    assert!(
        resp.result.message.starts_with("MusterJob.batch.muster.dev \"bad\" is invalid: ["),
        "{}",
        resp.result.message
    );
}

#[test]
fn min_count_may_change_on_update() {
    let old = job("j", 4, json!({"schedulingPolicy": {"gang": {"minCount": 2}}}));
    let new = job("j", 4, json!({"schedulingPolicy": {"gang": {"minCount": 4}}}));
    assert!(validate(&job_request("UPDATE", new, Some(old))).0.allowed);
}

#[test]
fn frozen_fields_are_denied_on_update() {
    let old = job("j", 4, json!({"schedulingPolicy": {"gang": {"minCount": 2}}}));
    let new = job("j", 4, json!({"schedulingPolicy": {"basic": {}}}));
    let (resp, _) = validate(&job_request("UPDATE", new, Some(old)));
    assert!(!resp.allowed);
    assert_eq!(causes(&resp), vec!["spec.scheduling.schedulingPolicy"]);
}

#[test]
fn metadata_only_updates_of_an_invalid_object_pass() {
    let bad = job("j", 1, json!({"schedulingPolicy": {"gang": {"minCount": 3}}}));
    let mut relabelled = bad.clone();
    relabelled["metadata"]["labels"] = json!({"team": "a"});
    assert!(validate(&job_request("UPDATE", relabelled, Some(bad))).0.allowed);
}

#[test]
fn deletes_are_not_validated() {
    assert!(
        validate(&job_request("DELETE", job("j", 1, json!({"schedulingPolicy": {"gang": {"minCount": 3}}})), None))
            .0
            .allowed
    );
}

#[test]
fn a_jobset_with_too_many_replicated_jobs_is_denied() {
    let rjobs: Vec<Value> = (0..9)
        .map(|i| {
            json!({"name": format!("r{i}"), "replicas": 1, "template": {"spec": {"parallelism": 1,
            "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}}}})
        })
        .collect();
    let set = json!({"apiVersion": "batch.muster.dev/v1alpha1", "kind": "MusterJobSet", "metadata": {"name": "s"},
        "spec": {"scheduling": {"schedulingPolicy": {"gang": {}}}, "replicatedJobs": rjobs}});
    let (resp, _) = validate(&request("batch.muster.dev", "MusterJobSet", "musterjobsets", "CREATE", set, None));
    assert!(!resp.allowed);
    assert_eq!(causes(&resp), vec!["spec.replicatedJobs"]);
}

#[test]
fn jobs_and_sets_over_the_pod_bounds_are_denied_at_their_fields() {
    let mut huge = job("huge", 50_000_000, Value::Null);
    huge["spec"]["completions"] = json!(50_000_000);
    huge["spec"]["completionMode"] = json!("Indexed");
    let (resp, outcome) = validate(&job_request("CREATE", huge.clone(), None));
    assert_eq!(outcome, Outcome::Denied);
    assert_eq!(causes(&resp), vec!["spec.parallelism", "spec.completions"]);
    assert_eq!(
        resp.result.message,
        "MusterJob.batch.muster.dev \"huge\" is invalid: [spec.parallelism: Invalid value: 50000000: must be less than or equal to 100000 when completion mode is Indexed, spec.completions: Invalid value: 50000000: must be less than or equal to 100000 when completion mode is Indexed]"
    );
    // A cluster's lower bound, told only once the rules pass.
    let small = job("small", 8, Value::Null);
    assert!(validate_within(&job_request("CREATE", small.clone(), None), 8).0.allowed);
    let (resp, _) = validate_within(&job_request("CREATE", small, None), 7);
    assert_eq!(causes(&resp), vec!["spec.parallelism"]);
    let (resp, _) = validate_within(&job_request("CREATE", huge, None), 7);
    assert!(resp.result.message.contains("less than or equal to 100000"), "{}", resp.result.message);

    let rjob = |name: &str, replicas: i32, parallelism: i32| {
        json!({"name": name, "replicas": replicas, "template": {"spec": {"parallelism": parallelism,
            "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}}}})
    };
    let set = json!({"apiVersion": "batch.muster.dev/v1alpha1", "kind": "MusterJobSet", "metadata": {"name": "s"},
        "spec": {"replicatedJobs": [rjob("a", 1, 1), rjob("b", 2_000_000_000, 2_000_000_000)]}});
    let set_request = request("batch.muster.dev", "MusterJobSet", "musterjobsets", "CREATE", set, None);
    let (resp, _) = validate(&set_request);
    assert_eq!(causes(&resp), vec!["spec.replicatedJobs[1].template.spec.parallelism"]);
    let set = json!({"apiVersion": "batch.muster.dev/v1alpha1", "kind": "MusterJobSet", "metadata": {"name": "s"},
        "spec": {"replicatedJobs": [rjob("a", 1, 1), rjob("b", 100_000, 2)]}});
    let set_request = request("batch.muster.dev", "MusterJobSet", "musterjobsets", "CREATE", set, None);
    let (resp, _) = validate(&set_request);
    assert_eq!(causes(&resp), vec!["spec.replicatedJobs[1].replicas"]);
    assert!(
        resp.result.message.contains("replicas × parallelism = 100000 × 2 = 200000 pods"),
        "{}",
        resp.result.message
    );
}

#[test]
fn musters_own_keys_in_a_pod_template_are_denied_at_their_path() {
    let mut forged = job("forged", 1, Value::Null);
    forged["spec"]["template"]["metadata"] = json!({"annotations": {"gpu.muster.dev/indices": "0,1"}});
    let (resp, _) = validate(&job_request("CREATE", forged, None));
    assert_eq!(causes(&resp), vec!["spec.template.metadata.annotations[gpu.muster.dev/indices]"]);
    assert!(
        resp.result.message.contains(
            "spec.template.metadata.annotations[gpu.muster.dev/indices]: Forbidden: muster's own key; muster sets the *.muster.dev/ keys"
        ),
        "{}",
        resp.result.message
    );
}

#[test]
fn pod_group_updates_allow_only_min_count() {
    let pg = |min: i32, mode: Value| {
        json!({"apiVersion": "scheduling.muster.dev/v1alpha1", "kind": "PodGroup", "metadata": {"name": "g"},
               "spec": {"schedulingPolicy": {"gang": {"minCount": min}}, "disruptionMode": mode}})
    };
    let ok = request(
        "scheduling.muster.dev",
        "PodGroup",
        "podgroups",
        "UPDATE",
        pg(3, json!({"single": {}})),
        Some(pg(2, json!({"single": {}}))),
    );
    assert!(validate(&ok).0.allowed);
    let bad = request(
        "scheduling.muster.dev",
        "PodGroup",
        "podgroups",
        "UPDATE",
        pg(3, json!({"all": {}})),
        Some(pg(2, json!({"single": {}}))),
    );
    let (resp, _) = validate(&bad);
    assert_eq!(causes(&resp), vec!["spec.disruptionMode"]);
}

fn pod(labels: Value, spec: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a", "labels": labels}, "spec": spec})
}

fn patch_of(resp: &AdmissionResponse) -> Value {
    serde_json::from_slice(resp.patch.as_deref().expect("patch")).expect("json patch")
}

#[test]
fn a_labelled_pod_is_gated() {
    let req = request(
        "",
        "Pod",
        "pods",
        "CREATE",
        pod(json!({POD_GROUP_LABEL: "train"}), json!({"containers": [{"name": "c"}]})),
        None,
    );
    let (resp, outcome) = mutate(&req);
    assert!(resp.allowed);
    assert_eq!(outcome, Outcome::Patched);
    assert_eq!(
        patch_of(&resp),
        json!([{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": ADMISSION_GATE}]}])
    );
}

#[test]
fn other_gates_are_kept() {
    let spec = json!({"containers": [{"name": "c"}], "schedulingGates": [{"name": "example.com/quota"}]});
    let (resp, _) = mutate(&request("", "Pod", "pods", "CREATE", pod(json!({POD_GROUP_LABEL: "train"}), spec), None));
    assert_eq!(
        patch_of(&resp),
        json!([{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": ADMISSION_GATE}}])
    );
}

#[test]
fn an_already_gated_pod_is_left_alone() {
    let spec = json!({"containers": [{"name": "c"}], "schedulingGates": [{"name": ADMISSION_GATE}]});
    let (resp, outcome) =
        mutate(&request("", "Pod", "pods", "CREATE", pod(json!({POD_GROUP_LABEL: "train"}), spec), None));
    assert!(resp.allowed && resp.patch.is_none());
    assert_eq!(outcome, Outcome::Allowed);
}

#[test]
fn an_unlabelled_pod_is_left_alone() {
    let (resp, _) =
        mutate(&request("", "Pod", "pods", "CREATE", pod(json!({"app": "web"}), json!({"containers": []})), None));
    assert!(resp.allowed && resp.patch.is_none());
}

#[test]
fn a_pod_naming_a_group_in_another_namespace_is_denied() {
    let (resp, _) =
        mutate(&request("", "Pod", "pods", "CREATE", pod(json!({POD_GROUP_LABEL: "team-b/train"}), json!({})), None));
    assert!(!resp.allowed);
    assert!(resp.result.message.contains("own namespace"), "{}", resp.result.message);
}

#[test]
fn a_malformed_group_name_is_denied() {
    let (resp, _) =
        mutate(&request("", "Pod", "pods", "CREATE", pod(json!({POD_GROUP_LABEL: "Train_1"}), json!({})), None));
    assert!(!resp.allowed);
    assert!(resp.result.message.contains("not a PodGroup name"), "{}", resp.result.message);
}

#[test]
fn a_pod_with_node_name_cannot_join() {
    let (resp, _) = mutate(&request(
        "",
        "Pod",
        "pods",
        "CREATE",
        pod(json!({POD_GROUP_LABEL: "train"}), json!({"nodeName": "n1"})),
        None,
    ));
    assert!(!resp.allowed);
}

#[test]
fn jobs_whose_pods_placement_cannot_model_are_admitted_with_a_warning_per_field() {
    let mut j = job("dra", 2, json!({"schedulingPolicy": {"gang": {}}}));
    j["spec"]["template"]["spec"]["schedulerName"] = json!("volcano");
    j["spec"]["template"]["spec"]["resourceClaims"] = json!([{"name": "gpu", "resourceClaimTemplateName": "gpus"}]);
    let (resp, outcome) = validate(&job_request("CREATE", j, None));
    assert!(resp.allowed);
    assert_eq!(outcome, Outcome::Allowed);
    let warnings = resp.warnings.expect("warnings");
    let fields: Vec<&str> = warnings.iter().filter_map(|w| w.split(':').next()).collect();
    // DRA claims are muster's to allocate (or to refuse with a reason at admission): no warning.
    assert_eq!(fields, vec!["spec.template.spec.schedulerName"]);
    assert!(warnings.iter().all(|w| w.contains("all-or-nothing is not guaranteed") && w.len() <= 256), "{warnings:?}");
    let (plain, _) = validate(&job_request("CREATE", job("ok", 2, json!({"schedulingPolicy": {"gang": {}}})), None));
    assert_eq!(plain.warnings, None, "nothing to say about a pod placement models");
}

#[test]
fn labelled_pods_placement_cannot_model_are_gated_with_a_warning() {
    let spec = json!({"containers": [{"name": "c"}], "schedulerName": "other"});
    let (resp, outcome) =
        mutate(&request("", "Pod", "pods", "CREATE", pod(json!({POD_GROUP_LABEL: "train"}), spec), None));
    assert_eq!(outcome, Outcome::Patched);
    let warnings = resp.warnings.expect("warnings");
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].starts_with("spec.schedulerName: \"other\""), "{warnings:?}");
}

fn pod_group(priority: Option<i32>, class: Option<&str>) -> Value {
    let mut spec = json!({"schedulingPolicy": {"basic": {}}});
    if let Some(p) = priority {
        spec["priority"] = json!(p);
    }
    if let Some(c) = class {
        spec["priorityClassName"] = json!(c);
    }
    json!({"apiVersion": "scheduling.muster.dev/v1alpha1", "kind": "PodGroup",
           "metadata": {"name": "by-hand", "namespace": "team-a"}, "spec": spec})
}

#[test]
fn a_hand_made_groups_priority_must_be_its_class_value() {
    let group = |op: &str, new: Value, old: Option<Value>| {
        request("scheduling.muster.dev", "PodGroup", "podgroups", op, new, old)
    };
    let max = crate::workloadbuilder::job::MAX_JOB_PODS;
    // (what, request, the class value looked up, allowed, the refusal's field)
    type Case = (&'static str, AdmissionRequest<DynamicObject>, Option<Option<i32>>, bool, &'static str);
    let cases: [Case; 6] = [
        ("as its class", group("CREATE", pod_group(Some(100), Some("low")), None), Some(Some(100)), true, ""),
        (
            "above its class",
            group("CREATE", pod_group(Some(1_000_000), Some("low")), None),
            Some(Some(100)),
            false,
            "spec.priority",
        ),
        ("no number: nothing to check", group("CREATE", pod_group(None, Some("low")), None), Some(Some(100)), true, ""),
        (
            "a class that does not exist",
            group("CREATE", pod_group(Some(5), Some("gone")), None),
            Some(None),
            false,
            "spec.priorityClassName",
        ),
        (
            "a metadata-only update is not checked again",
            group("UPDATE", pod_group(Some(9), Some("low")), Some(pod_group(Some(9), Some("low")))),
            Some(Some(100)),
            true,
            "",
        ),
        ("the class could not be read", group("CREATE", pod_group(Some(9), Some("low")), None), None, true, ""),
    ];
    for (what, req, value, allowed, field) in cases {
        let (resp, outcome) = validate_checked(&req, max, value);
        assert_eq!(resp.allowed, allowed, "{what}: {}", resp.result.message);
        if !allowed {
            assert_eq!(outcome, Outcome::Denied, "{what}");
            assert_eq!(causes(&resp), vec![field.to_string()], "{what}");
        }
    }
    let (resp, _) =
        validate_checked(&group("CREATE", pod_group(Some(1_000_000), Some("low")), None), max, Some(Some(100)));
    assert_eq!(
        resp.result.message,
        r#"PodGroup.scheduling.muster.dev "by-hand" is invalid: spec.priority: Invalid value: 1000000: must be 100, the value of PriorityClass "low": a group's priority comes from its class"#
    );
    // Only groups are looked up.
    assert_eq!(group_priority(&job_request("CREATE", job("j", 1, json!({})), None)), None);
    assert_eq!(group_priority(&group("CREATE", pod_group(Some(3), None), None)), Some((3, None)));
}

/// `object` with the patch of `resp` applied, as the API server applies it.
fn applied(object: &Value, resp: &AdmissionResponse) -> Value {
    let patch: json_patch::Patch = serde_json::from_value(patch_of(resp)).expect("a JSON patch");
    let mut out = object.clone();
    json_patch::patch(&mut out, &patch).expect("the patch applies");
    out
}

#[test]
fn a_new_job_gets_the_flags_api_recorded_where_the_flag_alone_decides() {
    use crate::crds::SCHEDULING_API_ANNOTATION as KEY;
    let gang = json!({"schedulingPolicy": {"gang": {"minCount": 2}}});
    let bare = job("train", 2, gang.clone());
    let mut annotated = bare.clone();
    annotated["metadata"]["annotations"] = json!({"team": "a"});
    for object in [bare.clone(), annotated] {
        let (resp, outcome) = mutate_within(&job_request("CREATE", object.clone(), None), Some(SchedulingApi::Muster));
        assert_eq!(outcome, Outcome::Patched);
        let out = applied(&object, &resp);
        assert_eq!(out["metadata"]["annotations"][KEY], "muster", "{out}");
        if object["metadata"]["annotations"]["team"] == "a" {
            assert_eq!(out["metadata"]["annotations"]["team"], "a", "other annotations are kept: {out}");
        }
        // What the webhook recorded passes the validating webhook.
        let (resp, _) = validate(&job_request("CREATE", out, None));
        assert!(resp.allowed, "{:?}", resp.result);
    }
    // `auto` and `upstream` need what only the controller knows: nothing is written.
    for default in [None, Some(SchedulingApi::Upstream)] {
        let (resp, outcome) = mutate_within(&job_request("CREATE", bare.clone(), None), default);
        assert!(resp.allowed && resp.patch.is_none(), "{default:?}");
        assert_eq!(outcome, Outcome::Allowed);
    }
    // A job choosing its own API keeps it.
    let mut chosen = bare.clone();
    chosen["metadata"]["annotations"] = json!({KEY: "upstream"});
    let (resp, _) = mutate_within(&job_request("CREATE", chosen, None), Some(SchedulingApi::Muster));
    assert!(resp.allowed && resp.patch.is_none());
    // A MusterJobSet too.
    let set = json!({
        "apiVersion": "batch.muster.dev/v1alpha1", "kind": "MusterJobSet",
        "metadata": {"name": "sweep", "namespace": "team-a"},
        "spec": {"replicatedJobs": []}
    });
    let req = request("batch.muster.dev", "MusterJobSet", "musterjobsets", "CREATE", set.clone(), None);
    let (resp, outcome) = mutate_within(&req, Some(SchedulingApi::Muster));
    assert_eq!(outcome, Outcome::Patched);
    assert_eq!(applied(&set, &resp)["metadata"]["annotations"][KEY], "muster");
    // Other kinds of muster's are not touched; a pod still gets its gate.
    let group = json!({"apiVersion": "scheduling.muster.dev/v1alpha1", "kind": "PodGroup",
                       "metadata": {"name": "g", "namespace": "team-a"}, "spec": {}});
    let req = request("scheduling.muster.dev", "PodGroup", "podgroups", "CREATE", group, None);
    assert!(mutate_within(&req, Some(SchedulingApi::Muster)).0.patch.is_none());
    let pod = pod(json!({POD_GROUP_LABEL: "train"}), json!({"containers": [{"name": "c"}]}));
    let (_, outcome) = mutate_within(&request("", "Pod", "pods", "CREATE", pod, None), Some(SchedulingApi::Muster));
    assert_eq!(outcome, Outcome::Patched);
}

#[test]
fn an_update_dropping_the_recorded_api_keeps_it_and_a_change_is_left_to_validation() {
    use crate::crds::SCHEDULING_API_ANNOTATION as KEY;
    let gang = json!({"schedulingPolicy": {"gang": {"minCount": 2}}});
    let mut recorded = job("train", 2, gang.clone());
    recorded["metadata"]["annotations"] = json!({KEY: "upstream"});
    // A server-side apply of the manifest the job was made from: the annotation is gone.
    let mut dropped = job("train", 2, gang.clone());
    dropped["metadata"]["labels"] = json!({"team": "a"});
    for default in [Some(SchedulingApi::Muster), None] {
        let req = job_request("UPDATE", dropped.clone(), Some(recorded.clone()));
        let (resp, outcome) = mutate_within(&req, default);
        assert_eq!(outcome, Outcome::Patched, "{default:?}");
        let out = applied(&dropped, &resp);
        assert_eq!(out["metadata"]["annotations"][KEY], "upstream", "the recorded API, not the flag's: {out}");
        let (resp, _) = validate(&job_request("UPDATE", out, Some(recorded.clone())));
        assert!(resp.allowed, "{:?}", resp.result);
    }
    // A change to the other API is not undone here: validation refuses it at its field path.
    let mut changed = recorded.clone();
    changed["metadata"]["annotations"] = json!({KEY: "muster"});
    let (resp, outcome) =
        mutate_within(&job_request("UPDATE", changed.clone(), Some(recorded.clone())), Some(SchedulingApi::Muster));
    assert!(resp.allowed && resp.patch.is_none());
    assert_eq!(outcome, Outcome::Allowed);
    let (resp, _) = validate(&job_request("UPDATE", changed, Some(recorded)));
    assert!(!resp.allowed);
    assert!(causes(&resp).iter().any(|f| f.contains(KEY)), "{:?}", causes(&resp));
}

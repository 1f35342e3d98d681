use super::*;
use serde_json::{Value, json};

fn pod_spec(v: Value) -> PodSpec {
    serde_json::from_value(v).expect("pod spec fixture")
}

fn gpus(n: &str) -> Value {
    json!({"limits": {"nvidia.com/gpu": n, "cpu": "1"}})
}

fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([("batch.muster.dev/job-name".to_string(), "train".to_string())])
}

fn requests(spec: &ResourceClaimTemplateSpec) -> Vec<(String, String, String, i64)> {
    let devices = spec.spec.as_ref().and_then(|s| s.devices.as_ref()).expect("devices");
    devices
        .requests
        .iter()
        .flatten()
        .map(|r| {
            let e = r.exactly.as_ref().expect("exactly");
            (
                r.name.clone(),
                e.device_class_name.clone(),
                e.allocation_mode.clone().unwrap_or_default(),
                e.count.unwrap_or(0),
            )
        })
        .collect()
}

#[test]
fn gpu_requests_follow_the_containers() {
    struct Case {
        name: &'static str,
        spec: Value,
        want: Vec<(&'static str, i64)>,
    }
    let cases = [
        Case {
            name: "one_request_per_gpu_container_named_after_it",
            spec: json!({"containers": [
                {"name": "a", "resources": gpus("2")}, {"name": "b"}, {"name": "c", "resources": gpus("4")}]}),
            want: vec![("a", 2), ("c", 4)],
        },
        Case {
            name: "a_request_alone_counts_like_a_limit",
            spec: json!({"containers": [{"name": "a", "resources": {"requests": {"nvidia.com/gpu": "3"}}}]}),
            want: vec![("a", 3)],
        },
        Case {
            name: "zero_gpus_is_no_request",
            spec: json!({"containers": [{"name": "a", "resources": gpus("0")}]}),
            want: vec![],
        },
        Case {
            name: "init_containers_share_the_main_requests",
            spec: json!({"initContainers": [{"name": "init", "resources": gpus("8")}],
                         "containers": [{"name": "a", "resources": gpus("2")}]}),
            want: vec![("a", 2)],
        },
        Case {
            name: "only_init_containers_get_one_request_of_the_largest_count",
            spec: json!({"initContainers": [{"name": "i1", "resources": gpus("1")}, {"name": "i2", "resources": gpus("3")}],
                         "containers": [{"name": "a"}]}),
            want: vec![("gpus", 3)],
        },
        Case { name: "no_gpus_no_requests", spec: json!({"containers": [{"name": "a"}]}), want: vec![] },
    ];
    for c in cases {
        let got = gpu_requests(&pod_spec(c.spec));
        let got: Vec<(&str, i64)> = got.iter().map(|r| (r.name.as_str(), r.count)).collect();
        assert_eq!(got, c.want, "{}", c.name);
    }
}

#[test]
fn the_template_asks_exactly_for_each_request_of_the_device_class() {
    let spec =
        pod_spec(json!({"containers": [{"name": "a", "resources": gpus("2")}, {"name": "b", "resources": gpus("1")}]}));
    let t = gpu_template_spec(&spec, "gpu.nvidia.com", &labels()).expect("template");
    assert_eq!(
        requests(&t),
        vec![
            ("a".into(), "gpu.nvidia.com".into(), "ExactCount".into(), 2),
            ("b".into(), "gpu.nvidia.com".into(), "ExactCount".into(), 1)
        ]
    );
    assert_eq!(t.metadata.and_then(|m| m.labels), Some(labels()), "claims made from it carry the job's labels");
    assert_eq!(gpu_template_spec(&pod_spec(json!({"containers": [{"name": "a"}]})), "x", &labels()), None);
}

#[test]
fn use_gpu_claim_moves_gpus_from_resources_to_the_claim() {
    struct Case {
        name: &'static str,
        spec: Value,
        want: Value,
    }
    let pod_claim = json!([{"name": "muster-gpus", "resourceClaimTemplateName": "train-gpus"}]);
    let cases = [
        Case {
            name: "gpu_container_references_its_request_and_keeps_other_resources",
            spec: json!({"containers": [{"name": "a", "resources": gpus("2")}, {"name": "b", "resources": {"limits": {"cpu": "1"}}}]}),
            want: json!({"containers": [
                {"name": "a", "resources": {"limits": {"cpu": "1"}, "claims": [{"name": "muster-gpus", "request": "a"}]}},
                {"name": "b", "resources": {"limits": {"cpu": "1"}}}],
                "resourceClaims": pod_claim.clone()}),
        },
        Case {
            name: "limits_and_requests_both_lose_the_gpu",
            spec: json!({"containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}}]}),
            want: json!({"containers": [{"name": "a", "resources": {"claims": [{"name": "muster-gpus", "request": "a"}]}}],
                "resourceClaims": pod_claim.clone()}),
        },
        Case {
            name: "init_container_references_the_whole_claim",
            spec: json!({"initContainers": [{"name": "i", "resources": gpus("1")}],
                         "containers": [{"name": "a", "resources": gpus("2")}]}),
            want: json!({"initContainers": [{"name": "i", "resources": {"limits": {"cpu": "1"}, "claims": [{"name": "muster-gpus"}]}}],
                "containers": [{"name": "a", "resources": {"limits": {"cpu": "1"}, "claims": [{"name": "muster-gpus", "request": "a"}]}}],
                "resourceClaims": pod_claim.clone()}),
        },
        Case {
            name: "the_pods_own_claims_stay",
            spec: json!({"containers": [{"name": "a", "resources": gpus("1")}],
                         "resourceClaims": [{"name": "mine", "resourceClaimName": "x"}]}),
            want: json!({"containers": [{"name": "a", "resources": {"limits": {"cpu": "1"}, "claims": [{"name": "muster-gpus", "request": "a"}]}}],
                "resourceClaims": [{"name": "mine", "resourceClaimName": "x"}, {"name": "muster-gpus", "resourceClaimTemplateName": "train-gpus"}]}),
        },
        Case {
            name: "no_gpus_unchanged",
            spec: json!({"containers": [{"name": "a", "resources": {"limits": {"cpu": "1"}}}]}),
            want: json!({"containers": [{"name": "a", "resources": {"limits": {"cpu": "1"}}}]}),
        },
    ];
    for c in cases {
        let mut spec = pod_spec(c.spec);
        use_gpu_claim(&mut spec, "train-gpus");
        assert_eq!(spec, pod_spec(c.want.clone()), "{}", c.name);
        let once = spec.clone();
        use_gpu_claim(&mut spec, "train-gpus");
        assert_eq!(spec, once, "{}: a second pass changes nothing", c.name);
    }
}

#[test]
fn a_template_with_other_requests_is_a_mismatch() {
    let spec = pod_spec(json!({"containers": [{"name": "a", "resources": gpus("2")}]}));
    let want = gpu_template_spec(&spec, "gpu.nvidia.com", &labels()).expect("template");
    let existing = ResourceClaimTemplate { metadata: Default::default(), spec: Some(want.clone()) };
    assert_eq!(template_mismatch(&existing, &want), None, "same requests");
    let other = gpu_template_spec(&spec, "other.example.com", &labels()).expect("template");
    let msg = template_mismatch(&ResourceClaimTemplate { metadata: Default::default(), spec: Some(other) }, &want)
        .expect("a different device class is a mismatch");
    assert!(msg.contains("other.example.com") && msg.contains("gpu.nvidia.com"), "{msg}");
    let more = pod_spec(json!({"containers": [{"name": "a", "resources": gpus("4")}]}));
    let more = gpu_template_spec(&more, "gpu.nvidia.com", &labels()).expect("template");
    assert!(
        template_mismatch(&ResourceClaimTemplate { metadata: Default::default(), spec: Some(more) }, &want).is_some()
    );
}

#[test]
fn group_claim_names_fit_in_253_characters() {
    assert_eq!(group_claim_name("train", "shared"), "train-shared");
    let long_group = "g".repeat(240);
    let name = group_claim_name(&long_group, "shared-dataset");
    assert!(name.len() <= 253, "{}", name.len());
    assert_eq!(name, group_claim_name(&long_group, "shared-dataset"), "deterministic");
    assert_ne!(name, group_claim_name(&long_group, "shared-datasex"), "the hash tells long names apart");
    assert!(name.starts_with("ggg") && name.chars().last().is_some_and(|c| c.is_ascii_alphanumeric()));
    let dashes = format!("{}-{}", "a".repeat(241), "b".repeat(20));
    let name = group_claim_name(&dashes, "x");
    assert!(!name.contains("--"), "no dash left dangling before the hash: {name}");
}

#[test]
fn group_claims_resolve_each_entry() {
    let entries: Vec<PodGroupResourceClaim> = serde_json::from_value(json!([
        {"name": "shared", "resourceClaimTemplateName": "t"},
        {"name": "data", "resourceClaimName": "dataset"}]))
    .expect("entries");
    let claims = group_claims("train", &entries);
    assert_eq!(
        claims,
        vec![
            GroupClaim { entry: "shared".into(), claim_name: "train-shared".into(), template: Some("t".into()) },
            GroupClaim { entry: "data".into(), claim_name: "dataset".into(), template: None },
        ]
    );
    let mut spec = pod_spec(json!({"containers": [{"name": "a"}]}));
    add_group_claims(&mut spec, &claims);
    assert_eq!(
        serde_json::to_value(&spec.resource_claims).expect("json"),
        json!([{"name": "shared", "resourceClaimName": "train-shared"}, {"name": "data", "resourceClaimName": "dataset"}])
    );
    let none_made = claim_statuses(&claims, &BTreeSet::new());
    assert_eq!(
        serde_json::to_value(&none_made).expect("json"),
        json!([{"name": "data", "resourceClaimName": "dataset"}])
    );
    let made = claim_statuses(&claims, &BTreeSet::from(["shared".to_string()]));
    assert_eq!(
        serde_json::to_value(&made).expect("json"),
        json!([{"name": "shared", "resourceClaimName": "train-shared"}, {"name": "data", "resourceClaimName": "dataset"}])
    );
}

#[test]
fn a_group_claim_copies_the_template_and_is_owned_by_the_group() {
    let template: ResourceClaimTemplate = serde_json::from_value(json!({
        "metadata": {"name": "t", "labels": {"on-template": "x"}},
        "spec": {"metadata": {"labels": {"team": "a"}, "annotations": {"note": "n"}},
                 "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "c", "count": 1}}]}}},
    }))
    .expect("template");
    let owner = OwnerReference {
        api_version: "scheduling.muster.dev/v1alpha1".into(),
        kind: "PodGroup".into(),
        name: "train".into(),
        uid: "u".into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    let gc = GroupClaim { entry: "shared".into(), claim_name: "train-shared".into(), template: Some("t".into()) };
    let claim = group_resource_claim(&gc, "ns", "train", &template, owner.clone());
    assert_eq!(claim.metadata.name.as_deref(), Some("train-shared"));
    assert_eq!(claim.metadata.namespace.as_deref(), Some("ns"));
    assert_eq!(claim.metadata.owner_references, Some(vec![owner]));
    let labels = claim.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("team").map(String::as_str), Some("a"));
    assert_eq!(labels.get(POD_GROUP_LABEL).map(String::as_str), Some("train"));
    assert!(!labels.contains_key("on-template"), "the template object's own labels are not the claim's");
    let annotations = claim.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(annotations.get("note").map(String::as_str), Some("n"));
    assert_eq!(annotations.get(GROUP_CLAIM_ANNOTATION).map(String::as_str), Some("shared"));
    assert_eq!(claim.spec, template.spec.and_then(|s| s.spec));
}

#[test]
fn upstream_pods_carry_their_native_groups_claim_entries_field_for_field() {
    let entries: Vec<PodGroupResourceClaim> = serde_json::from_value(json!([
        {"name": "shared", "resourceClaimTemplateName": "one-gpu"},
        {"name": "data", "resourceClaimName": "dataset"},
    ]))
    .expect("entries");
    // (the pod's own entries) -> the entries after
    let table = [
        (
            json!(null),
            json!([{"name": "shared", "resourceClaimTemplateName": "one-gpu"}, {"name": "data", "resourceClaimName": "dataset"}]),
        ),
        (
            json!([{"name": "muster-gpus", "resourceClaimTemplateName": "train-gpus"}]),
            json!([{"name": "muster-gpus", "resourceClaimTemplateName": "train-gpus"},
                   {"name": "shared", "resourceClaimTemplateName": "one-gpu"}, {"name": "data", "resourceClaimName": "dataset"}]),
        ),
        // One of that name already there is the pod's own (validation refuses the clash).
        (
            json!([{"name": "data", "resourceClaimName": "mine"}]),
            json!([{"name": "data", "resourceClaimName": "mine"}, {"name": "shared", "resourceClaimTemplateName": "one-gpu"}]),
        ),
    ];
    for (i, (own, want)) in table.into_iter().enumerate() {
        let mut spec: PodSpec =
            serde_json::from_value(json!({"containers": [{"name": "c"}], "resourceClaims": own})).expect("spec");
        add_native_group_claims(&mut spec, &entries);
        assert_eq!(serde_json::to_value(&spec.resource_claims).expect("json"), want, "row {i}");
    }
    let mut untouched: PodSpec = serde_json::from_value(json!({"containers": [{"name": "c"}]})).expect("spec");
    add_native_group_claims(&mut untouched, &[]);
    assert_eq!(untouched.resource_claims, None, "no entries: no list");
}

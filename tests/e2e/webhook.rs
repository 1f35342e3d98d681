//! muster's admission webhooks as the apiserver calls them on 127.0.0.1: what `kubectl apply`
//! refuses and with which field paths (the CRD's schema and CEL rules answer first, the
//! webhook after them; the paths asserted are the ones users see), what passes, how pods are
//! gated, and that only opted-in objects depend on muster being up.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use muster::crds::{ADMISSION_GATE, POD_GROUP_LABEL};
use serde_json::{Value, json};

use crate::cases::{
    Case, base_spec, create_cases, error_paths, job_manifest, merge_patch, path_set, update_bases, update_cases,
};
use crate::harness::manager::{Muster, NAMESPACE, muster, muster_exclusive};
use crate::harness::{client, cluster, metric, namespace};

/// `kubectl apply` of `manifest` in `ns`: `Ok` when admitted, else the error. Client-side, as
/// users type it (server-side apply refuses duplicate list keys before validation runs, with
/// no field path of its own).
fn apply(ns: &str, manifest: &Value) -> Result<String, String> {
    cluster().kubectl_stdin(&["apply", "-n", ns, "-f", "-"], Some(&manifest.to_string()))
}

/// Checks that applying `manifest` is admitted (no `want`) or refused at exactly `want`;
/// returns a line describing the mismatch, if any.
fn expect(case: &str, ns: &str, manifest: &Value, want: &[&str]) -> Option<String> {
    let got = match apply(ns, manifest) {
        Ok(_) => BTreeSet::new(),
        Err(e) => {
            let paths = error_paths(&e);
            if paths.is_empty() {
                return Some(format!("{case}: refused without a field path: {e}"));
            }
            paths
        }
    };
    (got != path_set(want)).then(|| format!("{case}: want {want:?}, got {got:?}"))
}

fn object_name(case: &Case) -> String {
    case.object_name.clone().unwrap_or_else(|| case.name.replace('_', "-"))
}

#[tokio::test]
async fn musterjobs_breaking_a_rule_are_refused_at_its_field_path() {
    let _muster = muster().await;
    let ns = namespace("webhook-jobs");
    let failures: Vec<String> = create_cases()
        .iter()
        .filter_map(|c| expect(c.name, &ns.name, &job_manifest("MusterJob", &object_name(c), &c.spec), c.paths))
        .collect();
    assert!(failures.is_empty(), "{} case(s) differ:\n{}", failures.len(), failures.join("\n"));
}

#[tokio::test]
async fn frozen_musterjob_fields_are_refused_on_update() {
    let _muster = muster().await;
    let ns = namespace("webhook-job-updates");
    let bases = update_bases();
    let mut failures = Vec::new();
    for case in update_cases() {
        // A fresh base per case, so that an admitted change does not move the next one's start.
        let name = case.name.replace('_', "-");
        let spec = &bases.iter().find(|(n, _)| *n == case.base).expect("base").1;
        let mut manifest = job_manifest("MusterJob", &name, spec);
        apply(&ns.name, &manifest).unwrap_or_else(|e| panic!("base of {}: {e}", case.name));
        merge_patch(&mut manifest, &case.patch);
        failures.extend(expect(case.name, &ns.name, &manifest, case.paths));
    }
    assert!(failures.is_empty(), "{} case(s) differ:\n{}", failures.len(), failures.join("\n"));
}

fn set_manifest(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "batch.muster.dev/v1alpha1", "kind": "MusterJobSet", "metadata": {"name": name}, "spec": spec})
}

/// `rjob` waiting for `on` to be ready.
fn depends(mut rjob: Value, on: &str) -> Value {
    rjob["dependsOn"] = json!([{"name": on, "status": "Ready"}]);
    rjob
}

fn rjob(name: &str, replicas: i32, spec: Value) -> Value {
    let mut s = base_spec();
    merge_patch(&mut s, &spec);
    json!({"name": name, "replicas": replicas, "template": {"spec": s}})
}

#[tokio::test]
async fn musterjobsets_breaking_a_rule_are_refused_at_its_field_path() {
    let _muster = muster().await;
    let ns = namespace("webhook-sets");
    let gang = json!({"schedulingPolicy": {"gang": {}}});
    let two = || vec![rjob("a", 1, json!({})), rjob("b", 1, json!({}))];
    let cases: Vec<(&str, Value, &[&str])> = vec![
        (
            "nine_replicated_jobs_with_scheduling",
            set_manifest(
                "nine",
                json!({"scheduling": gang, "replicatedJobs": (0..9).map(|i| rjob(&format!("r{i}"), 1, json!({}))).collect::<Vec<_>>()}),
            ),
            &["spec.replicatedJobs"],
        ),
        (
            "min_group_count_above_child_groups",
            set_manifest(
                "above",
                json!({"scheduling": {"schedulingPolicy": {"gang": {"minGroupCount": 3}}}, "replicatedJobs": two()}),
            ),
            &["spec.scheduling.schedulingPolicy.gang.minGroupCount"],
        ),
        (
            "min_group_count_zero",
            set_manifest(
                "zero",
                json!({"scheduling": {"schedulingPolicy": {"gang": {"minGroupCount": 0}}}, "replicatedJobs": two()}),
            ),
            &["spec.scheduling.schedulingPolicy.gang.minGroupCount"],
        ),
        (
            "composite_basic_with_disruption_mode_all",
            set_manifest("basic-all", json!({"scheduling": {"disruptionMode": {"all": {}}}, "replicatedJobs": two()})),
            &["spec.scheduling.disruptionMode"],
        ),
        (
            "child_restart_policy_always",
            set_manifest(
                "always",
                json!({"replicatedJobs": [rjob("a", 1, json!({"template": {"spec": {"restartPolicy": "Always"}}}))]}),
            ),
            &["spec.replicatedJobs[0].template.spec.template.spec.restartPolicy"],
        ),
        (
            "child_min_count_above_parallelism",
            set_manifest(
                "child-min",
                json!({"scheduling": gang, "replicatedJobs": [rjob("a", 1, json!({"scheduling": {"schedulingPolicy": {"gang": {"minCount": 3}}}}))]}),
            ),
            &["spec.replicatedJobs[0].template.spec.scheduling.schedulingPolicy.gang.minCount"],
        ),
        (
            "child_job_name_too_long",
            set_manifest(&"s".repeat(40), json!({"replicatedJobs": [rjob(&"r".repeat(12), 1, json!({}))]})),
            &["spec.replicatedJobs[0].name"],
        ),
        (
            "duplicate_replicated_job_names",
            set_manifest("dup", json!({"replicatedJobs": [rjob("a", 1, json!({})), rjob("a", 1, json!({}))]})),
            &["spec.replicatedJobs[1]"],
        ),
        (
            "success_policy_names_an_unknown_replicated_job",
            set_manifest(
                "target",
                json!({"successPolicy": {"targetReplicatedJobs": ["nope"]}, "replicatedJobs": two()}),
            ),
            &["spec.successPolicy.targetReplicatedJobs[0]"],
        ),
        // JobSet v1alpha2's rules.
        (
            "in_order_with_depends_on",
            set_manifest(
                "in-order",
                json!({"startupPolicy": {"startupPolicyOrder": "InOrder"}, "replicatedJobs": [rjob("a", 1, json!({})),
                    depends(rjob("b", 1, json!({})), "a")]}),
            ),
            &["spec"],
        ),
        (
            "depends_on_the_first_replicated_job",
            set_manifest(
                "dep-first",
                json!({"replicatedJobs": [depends(rjob("a", 1, json!({})), "b"), rjob("b", 1, json!({}))]}),
            ),
            &["spec.replicatedJobs[0].dependsOn"],
        ),
        (
            "depends_on_a_later_replicated_job",
            set_manifest(
                "dep-later",
                json!({"replicatedJobs": [rjob("a", 1, json!({})), depends(rjob("b", 1, json!({})), "c"), rjob("c", 1, json!({}))]}),
            ),
            &["spec.replicatedJobs[1].dependsOn[0].name"],
        ),
        (
            "failure_rule_name_not_matching_the_pattern",
            set_manifest(
                "rule-name",
                json!({"failurePolicy": {"rules": [{"name": "1st", "action": "FailJobSet"}]}, "replicatedJobs": two()}),
            ),
            &["spec.failurePolicy.rules[0].name"],
        ),
        (
            "failure_rule_names_repeated",
            set_manifest(
                "rule-names",
                json!({"failurePolicy": {"rules": [{"name": "r", "action": "FailJobSet"}, {"name": "r", "action": "RestartJobSet"}]},
                    "replicatedJobs": two()}),
            ),
            &["spec.failurePolicy.rules"],
        ),
        (
            "failure_rule_target_unknown",
            set_manifest(
                "rule-target",
                json!({"failurePolicy": {"rules": [{"name": "r", "action": "FailJobSet", "targetReplicatedJobs": ["ps"]}]},
                    "replicatedJobs": two()}),
            ),
            &["spec.failurePolicy.rules[0].targetReplicatedJobs[0]"],
        ),
        (
            "failure_rule_reason_unknown",
            set_manifest(
                "rule-reason",
                json!({"failurePolicy": {"rules": [{"name": "r", "action": "FailJobSet", "onJobFailureReasons": ["Evicted"]}]},
                    "replicatedJobs": two()}),
            ),
            &["spec.failurePolicy.rules[0].onJobFailureReasons[0]"],
        ),
        (
            "coordinator_replicated_job_unknown",
            set_manifest("coord-rjob", json!({"coordinator": {"replicatedJob": "ps"}, "replicatedJobs": two()})),
            &["spec.coordinator.replicatedJob"],
        ),
        (
            "coordinator_job_index_past_replicas",
            set_manifest(
                "coord-job",
                json!({"coordinator": {"replicatedJob": "a", "jobIndex": 1}, "replicatedJobs": two()}),
            ),
            &["spec.coordinator.jobIndex"],
        ),
        (
            "coordinator_pod_index_past_completions",
            set_manifest(
                "coord-pod",
                json!({"coordinator": {"replicatedJob": "a", "podIndex": 2}, "replicatedJobs": two()}),
            ),
            &["spec.coordinator.podIndex"],
        ),
        (
            "subdomain_not_a_dns_1035_label",
            set_manifest("subdomain", json!({"network": {"subdomain": "1ddp"}, "replicatedJobs": two()})),
            &["spec.network.subdomain"],
        ),
        (
            "group_name_not_a_dns_1035_label",
            set_manifest(
                "group",
                json!({"replicatedJobs": [{"groupName": "1st", "name": "a", "replicas": 1, "template": {"spec": base_spec()}}]}),
            ),
            &["spec.replicatedJobs[0].groupName"],
        ),
        (
            "set_managed_by_not_a_domain_prefixed_path",
            set_manifest("managed", json!({"managedBy": "kueue", "replicatedJobs": two()})),
            &["spec.managedBy"],
        ),
        (
            "child_backoff_limit_per_index_when_non_indexed",
            set_manifest(
                "per-index",
                json!({"replicatedJobs": [rjob("a", 1, json!({"completionMode": "NonIndexed", "backoffLimitPerIndex": 1}))]}),
            ),
            &["spec.replicatedJobs[0].template.spec.backoffLimitPerIndex"],
        ),
        (
            "child_pod_failure_policy_with_restart_on_failure",
            set_manifest(
                "child-pfp",
                json!({"replicatedJobs": [rjob("a", 1, json!({"template": {"spec": {"restartPolicy": "OnFailure"}},
                    "podFailurePolicy": {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}}))]}),
            ),
            &["spec.replicatedJobs[0].template.spec.template.spec.restartPolicy"],
        ),
        (
            "jobset_fields_together",
            set_manifest(
                "ddp",
                json!({"network": {"enableDNSHostnames": true, "subdomain": "ddp"},
                    "startupPolicy": {"startupPolicyOrder": "InOrder"},
                    "coordinator": {"replicatedJob": "a", "jobIndex": 0, "podIndex": 1},
                    "failurePolicy": {"maxRestarts": 2, "restartStrategy": "BlockingRecreate", "rules": [
                        {"name": "FailOnBadConfig", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]},
                        {"name": "restart_workers", "action": "RestartJobSet", "targetReplicatedJobs": ["b"]}]},
                    "successPolicy": {"operator": "All", "targetReplicatedJobs": ["a"]},
                    "ttlSecondsAfterFinished": 60,
                    "replicatedJobs": [
                        rjob("a", 1, json!({"completions": 2, "completionMode": "Indexed", "backoffLimitPerIndex": 0})),
                        rjob("b", 2, json!({"completions": 2, "completionMode": "Indexed"}))]}),
            ),
            &[],
        ),
        (
            "gang_of_two_children",
            set_manifest(
                "fine",
                json!({"scheduling": {"schedulingPolicy": {"gang": {"minGroupCount": 2}}}, "replicatedJobs": two()}),
            ),
            &[],
        ),
    ];
    let failures: Vec<String> =
        cases.iter().filter_map(|(name, manifest, want)| expect(name, &ns.name, manifest, want)).collect();
    assert!(failures.is_empty(), "{} case(s) differ:\n{}", failures.len(), failures.join("\n"));
}

#[tokio::test]
async fn frozen_musterjobset_fields_are_refused_on_update() {
    let _muster = muster().await;
    let ns = namespace("webhook-set-updates");
    let base = || {
        json!({"scheduling": {"schedulingPolicy": {"gang": {}}},
            "network": {"enableDNSHostnames": true},
            "successPolicy": {"operator": "All"},
            "failurePolicy": {"maxRestarts": 1},
            "startupPolicy": {"startupPolicyOrder": "AnyOrder"},
            "replicatedJobs": [
            rjob("driver", 1, json!({})),
            rjob("workers", 2, json!({"scheduling": {"schedulingPolicy": {"gang": {"minCount": 2}}}})),
        ]})
    };
    let cases: Vec<(&str, Value, &[&str])> = vec![
        (
            "scheduling_changed",
            json!({"scheduling": {"schedulingConstraints": {"topology": [{"key": "topology.muster.dev/rack"}]}}}),
            &["spec.scheduling"],
        ),
        ("scheduling_cleared", json!({"scheduling": null}), &["spec.scheduling"]),
        ("replicas_changed", json!({"replicatedJobs": [rjob("driver", 2, json!({}))]}), &["spec.replicatedJobs"]),
        (
            "child_template_changed",
            json!({"replicatedJobs": [rjob("driver", 1, json!({"template": {"metadata": {"labels": {"v": "2"}}}}))]}),
            &["spec.replicatedJobs[0].template.spec.template"],
        ),
        (
            "child_policy_changed",
            json!({"replicatedJobs": [rjob("driver", 1, json!({"scheduling": {"schedulingPolicy": {"gang": {}}}}))]}),
            &["spec.replicatedJobs[0].template.spec.scheduling"],
        ),
        ("child_min_count_changed", json!({}), &[]),
        // JobSet freezes these.
        ("network_changed", json!({"network": {"subdomain": "other"}}), &["spec.network"]),
        ("success_policy_changed", json!({"successPolicy": {"operator": "Any"}}), &["spec.successPolicy"]),
        ("failure_policy_changed", json!({"failurePolicy": {"maxRestarts": 2}}), &["spec.failurePolicy"]),
        (
            "startup_policy_changed",
            json!({"startupPolicy": {"startupPolicyOrder": "InOrder"}}),
            &["spec.startupPolicy"],
        ),
        ("managed_by_set", json!({"managedBy": "example.com/other"}), &["spec.managedBy"]),
        ("depends_on_set", json!({}), &["spec.replicatedJobs[1].dependsOn"]),
        ("ttl_changed", json!({"ttlSecondsAfterFinished": 30}), &[]),
    ];
    let mut failures = Vec::new();
    for (i, (name, change, want)) in cases.into_iter().enumerate() {
        let set = format!("set-{i}");
        let mut spec = base();
        apply(&ns.name, &set_manifest(&set, spec.clone())).unwrap_or_else(|e| panic!("base of {name}: {e}"));
        if name == "depends_on_set" {
            spec["replicatedJobs"][1]["dependsOn"] = json!([{"name": "driver", "status": "Ready"}]);
        } else if name == "child_min_count_changed" {
            spec["replicatedJobs"][1]["template"]["spec"]["scheduling"]["schedulingPolicy"]["gang"]["minCount"] =
                json!(1);
        } else if let Some(rjobs) = change.get("replicatedJobs") {
            // Replace the first replicatedJob only (a list-map merge keyed by name).
            spec["replicatedJobs"][0] = rjobs[0].clone();
        } else {
            merge_patch(&mut spec, &change);
        }
        failures.extend(expect(name, &ns.name, &set_manifest(&set, spec), want));
    }
    assert!(failures.is_empty(), "{} case(s) differ:\n{}", failures.len(), failures.join("\n"));
}

#[tokio::test]
async fn the_examples_are_admitted() {
    let _muster = muster().await;
    let ns = namespace("webhook-examples");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).collect();
    files.sort();
    assert!(!files.is_empty());
    // The examples of an API the control plane does not serve (an older Kubernetes) are left
    // out: the native scheduling kinds (examples/upstream), DRA (examples/dra).
    let native = crate::harness::served("scheduling.k8s.io/v1beta1", "podgroups").await;
    let dra = crate::harness::served("resource.k8s.io/v1", "resourceclaims").await;
    for f in files {
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if (name == "upstream" && !native) || (name == "dra" && !dra) {
            eprintln!("{}: left out, its API is not served here", f.display());
            continue;
        }
        // Dry run: admitted is the point; running them would take the shared pool's GPUs.
        let out = cluster().kubectl(&["apply", "--dry-run=server", "-n", &ns.name, "-f", f.to_str().unwrap()]);
        assert!(out.is_ok(), "{}: {out:?}", f.display());
    }
}

fn pod(name: &str, labels: Value, spec: Value) -> Pod {
    let mut s = json!({"containers": [{"name": "main", "image": "registry.invalid/none"}]});
    merge_patch(&mut s, &spec);
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}, "spec": s})).unwrap()
}

fn gates(p: &Pod) -> Vec<String> {
    let gates = p.spec.as_ref().and_then(|s| s.scheduling_gates.clone()).unwrap_or_default();
    gates.into_iter().map(|g| g.name).collect()
}

async fn mutate_requests(muster: &Muster) -> f64 {
    metric(&muster.metrics().await, "muster_webhook_requests_total", &[("path", "/mutate")])
}

#[tokio::test]
async fn labelled_pods_are_gated_and_unlabelled_pods_never_reach_the_webhook() {
    let muster = muster().await;
    let ns = namespace("webhook-pods");
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    let pp = PostParams::default();

    let patched = |t: &str| metric(t, "muster_webhook_requests_total", &[("path", "/mutate"), ("outcome", "patched")]);
    let before = patched(&muster.metrics().await);
    let gated = pods.create(&pp, &pod("joins", json!({POD_GROUP_LABEL: "g"}), json!({}))).await.unwrap();
    assert_eq!(gates(&gated), [ADMISSION_GATE]);
    assert!(patched(&muster.metrics().await) > before, "the mutating webhook counted a patch");

    let other_gate = json!({"schedulingGates": [{"name": "example.com/other"}]});
    let both = pods.create(&pp, &pod("two-gates", json!({POD_GROUP_LABEL: "g"}), other_gate)).await.unwrap();
    assert_eq!(gates(&both), ["example.com/other", ADMISSION_GATE]);
    let own_gate = json!({"schedulingGates": [{"name": ADMISSION_GATE}]});
    let once = pods.create(&pp, &pod("gated-already", json!({POD_GROUP_LABEL: "g"}), own_gate)).await.unwrap();
    assert_eq!(gates(&once), [ADMISSION_GATE], "the gate is not added twice");

    // Other tests' pods move the counter too; one quiet round proves the unlabelled pod was
    // never sent (if it were, every round would move it). The rounds are spread over about
    // 15 s, so that a burst of other tests' pods ends within them (ten rounds back to back all
    // moved once, in a full e2e run).
    let mut quiet = false;
    for i in 0..40 {
        let before = mutate_requests(&muster).await;
        let plain = pods.create(&pp, &pod(&format!("plain-{i}"), json!({"app": "x"}), json!({}))).await.unwrap();
        assert!(gates(&plain).is_empty(), "an unlabelled pod is not gated");
        if mutate_requests(&muster).await == before {
            quiet = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    assert!(quiet, "creating an unlabelled pod moved muster_webhook_requests_total{{path=\"/mutate\"}} every time");
}

#[tokio::test]
async fn pods_that_cannot_join_a_podgroup_are_refused() {
    let _muster = muster().await;
    let ns = namespace("webhook-bad-pods");
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    let pp = PostParams::default();
    let err = pods.create(&pp, &pod("bad-name", json!({POD_GROUP_LABEL: "Not_A_Name"}), json!({}))).await.unwrap_err();
    assert!(err.to_string().contains("is not a PodGroup name"), "{err}");
    let pinned = pod("pinned", json!({POD_GROUP_LABEL: "g"}), json!({"nodeName": "pool-gpu-0"}));
    let err = pods.create(&pp, &pinned).await.unwrap_err();
    assert!(err.to_string().contains("spec.nodeName"), "{err}");
}

/// With muster stopped, only what opted in is refused (its webhooks fail closed); everything
/// else is created as usual, and so are labelled pods in muster's own namespace.
#[tokio::test]
async fn with_muster_stopped_only_opted_in_objects_are_refused() {
    let muster = muster_exclusive().await;
    let ns = namespace("webhook-down");
    let c = client().await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), &ns.name);
    let pp = PostParams::default();
    muster.stop().await;

    pods.create(&pp, &pod("plain", json!({"app": "x"}), json!({}))).await.expect("an unlabelled pod");
    let kubectl = |yaml: &str| cluster().kubectl_stdin(&["-n", &ns.name, "create", "-f", "-"], Some(yaml));
    kubectl("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: plain}\ndata: {a: b}\n").expect("a ConfigMap");
    kubectl(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: plain}\nspec:\n  selector: {matchLabels: {app: x}}\n  template:\n    metadata: {labels: {app: x}}\n    spec: {containers: [{name: main, image: registry.invalid/none}]}\n",
    )
    .expect("a Deployment");
    let own: Api<Pod> = Api::namespaced(c.clone(), NAMESPACE);
    let exempt = pod("e2e-exempt", json!({POD_GROUP_LABEL: "g"}), json!({}));
    let created = own.create(&pp, &exempt).await.expect("a labelled pod in muster's namespace skips the webhook");
    assert!(gates(&created).is_empty());
    own.delete("e2e-exempt", &DeleteParams::default()).await.unwrap();

    let err = pods.create(&pp, &pod("joins", json!({POD_GROUP_LABEL: "g"}), json!({}))).await.unwrap_err();
    assert!(err.to_string().contains("gate.pods.muster.dev"), "{err}");
    let job = job_manifest("MusterJob", "refused", &json!({}));
    let err = apply(&ns.name, &job).unwrap_err();
    assert!(err.contains("validate.batch.muster.dev"), "{err}");

    muster.start().await;
    let gated = pods.create(&pp, &pod("joins", json!({POD_GROUP_LABEL: "g"}), json!({}))).await.unwrap();
    assert_eq!(gates(&gated), [ADMISSION_GATE]);
    apply(&ns.name, &job).expect("admitted again");
}

/// The objects muster compiles keep their frozen fields against hand edits too (only
/// `minCount` may change), reported at the field, and hand-written ones get the same rules;
/// composite trees keep their shape and their composite templates' priority.
#[tokio::test]
async fn compiled_workloads_and_podgroups_refuse_changes_to_frozen_fields() {
    let _muster = muster().await;
    let ns = namespace("webhook-compiled");
    let job = job_manifest(
        "MusterJob",
        "compiled",
        &json!({"scheduling": {"schedulingPolicy": {"gang": {"minCount": 2}}},
            "template": {"spec": {"nodeSelector": {"muster.dev/e2e": "nowhere"}}}}),
    );
    apply(&ns.name, &job).unwrap();
    crate::harness::wait_for("PodGroup compiled", std::time::Duration::from_secs(30), || async {
        cluster().kubectl(&["-n", &ns.name, "get", "podgroups.scheduling.muster.dev", "compiled"]).ok()
    })
    .await;
    // A hand-written composite tree (what a MusterJobSet compiles to) for the composite cases.
    let tree = |root: &str, priority: i32, children: &[&str]| {
        let children: Vec<Value> =
            children.iter().map(|c| json!({"name": c, "schedulingPolicy": {"gang": {"minCount": 1}}})).collect();
        json!({"compositePodGroupTemplates": [{"name": root, "priority": priority,
            "schedulingPolicy": {"gang": {"minGroupCount": 1}}, "podGroupTemplates": children}]})
    };
    let workload = json!({"apiVersion": "scheduling.muster.dev/v1alpha1", "kind": "Workload",
        "metadata": {"name": "tree"}, "spec": tree("root", 5, &["a", "b"])});
    apply(&ns.name, &workload).expect("a composite Workload");
    let patch = |resource: &str, p: Value| {
        let (resource, name) = resource.split_once('/').unwrap_or((resource, "compiled"));
        cluster().kubectl(&[
            "-n",
            &ns.name,
            "patch",
            resource,
            name,
            "--type=merge",
            "--dry-run=server",
            "-p",
            &p.to_string(),
        ])
    };
    let cases: Vec<(&str, &str, Value, &[&str])> = vec![
        ("min_count", "mpg", json!({"spec": {"schedulingPolicy": {"gang": {"minCount": 1}}}}), &[]),
        ("mode", "mpg", json!({"spec": {"disruptionMode": {"single": null, "all": {}}}}), &["spec.disruptionMode"]),
        (
            "policy",
            "mpg",
            json!({"spec": {"schedulingPolicy": {"gang": null, "basic": {}}}}),
            &["spec.schedulingPolicy"],
        ),
        ("workload_ref", "mpg", json!({"spec": {"workloadRef": {"templateName": "other"}}}), &["spec.workloadRef"]),
        (
            "template_mode",
            "mwl",
            json!({"spec": {"podGroupTemplates": [{"name": "main", "schedulingPolicy": {"gang": {"minCount": 2}}, "disruptionMode": {"all": {}}}]}}),
            &["spec.podGroupTemplates[0].disruptionMode"],
        ),
        (
            "template_renamed",
            "mwl",
            json!({"spec": {"podGroupTemplates": [{"name": "other", "schedulingPolicy": {"gang": {"minCount": 2}}}]}}),
            &["spec.podGroupTemplates"],
        ),
        ("controller_ref", "mwl", json!({"spec": {"controllerRef": {"name": "other"}}}), &["spec.controllerRef"]),
        ("composite_unchanged", "mwl/tree", json!({"spec": tree("root", 5, &["a", "b"])}), &[]),
        (
            "composite_child_removed",
            "mwl/tree",
            json!({"spec": tree("root", 5, &["a"])}),
            &["spec.compositePodGroupTemplates[0].podGroupTemplates"],
        ),
        (
            "composite_child_renamed",
            "mwl/tree",
            json!({"spec": tree("root", 5, &["a", "c"])}),
            &["spec.compositePodGroupTemplates[0].podGroupTemplates"],
        ),
        (
            "composite_priority",
            "mwl/tree",
            json!({"spec": tree("root", 6, &["a", "b"])}),
            &["spec.compositePodGroupTemplates[0].priority"],
        ),
        (
            "composite_renamed",
            "mwl/tree",
            json!({"spec": tree("other", 5, &["a", "b"])}),
            &["spec.compositePodGroupTemplates"],
        ),
    ];
    let mut failures = Vec::new();
    for (name, resource, p, want) in cases {
        let got = match patch(resource, p) {
            Ok(_) => BTreeSet::new(),
            Err(e) => error_paths(&e),
        };
        if got != path_set(want) {
            failures.push(format!("{name}: want {want:?}, got {got:?}"));
        }
    }
    let hand = json!({"apiVersion": "scheduling.muster.dev/v1alpha1", "kind": "PodGroup", "metadata": {"name": "hand"},
        "spec": {"parentCompositePodGroupName": "x", "schedulingPolicy": {"gang": {}}}});
    failures.extend(expect(
        "hand_written_podgroup",
        &ns.name,
        &hand,
        &["spec.schedulingPolicy.gang.minCount", "spec.workloadRef"],
    ));
    let dup = json!({"apiVersion": "scheduling.muster.dev/v1alpha1", "kind": "Workload", "metadata": {"name": "dup"},
        "spec": {"compositePodGroupTemplates": [{"name": "a", "schedulingPolicy": {"basic": {}},
            "podGroupTemplates": [{"name": "a", "schedulingPolicy": {"basic": {}}}]}]}});
    failures.extend(expect(
        "template_names_unique_across_the_tree",
        &ns.name,
        &dup,
        &["spec.compositePodGroupTemplates[0].podGroupTemplates[0].name"],
    ));
    assert!(failures.is_empty(), "{} case(s) differ:\n{}", failures.len(), failures.join("\n"));
}

/// Issue 38: a PodGroup made by hand gets its priority from its class; a number that disagrees
/// with the class is refused at `spec.priority` (the class read through the API server).
#[tokio::test]
async fn a_hand_made_pod_groups_priority_must_be_its_class_value() {
    let _muster = muster().await;
    let ns = namespace("webhook-priority");
    let class = format!("{}-low", ns.name);
    kubectl_class(&class, 100);
    let group = |name: &str, priority: i64| {
        json!({"apiVersion": "scheduling.muster.dev/v1alpha1", "kind": "PodGroup",
               "metadata": {"name": name},
               "spec": {"schedulingPolicy": {"basic": {}}, "priority": priority, "priorityClassName": class}})
    };
    let refused = apply(&ns.name, &group("forged", 1_000_000)).expect_err("a forged priority is refused");
    assert!(
        refused.contains(&format!(
            "spec.priority: Invalid value: 1000000: must be 100, the value of PriorityClass \"{class}\""
        )),
        "{refused}"
    );
    apply(&ns.name, &group("honest", 100)).expect("the class's own value is admitted");
    let missing = json!({"apiVersion": "scheduling.muster.dev/v1alpha1", "kind": "PodGroup",
        "metadata": {"name": "nowhere"},
        "spec": {"schedulingPolicy": {"basic": {}}, "priority": 5, "priorityClassName": format!("{class}-gone")}});
    let refused = apply(&ns.name, &missing).expect_err("a class that does not exist is refused");
    assert!(refused.contains("spec.priorityClassName: Not found"), "{refused}");
    let _ = cluster().kubectl(&["delete", "priorityclass", &class, "--ignore-not-found"]);
}

fn kubectl_class(name: &str, value: i32) {
    let manifest = json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
        "metadata": {"name": name}, "value": value});
    cluster().kubectl_stdin(&["apply", "-f", "-"], Some(&manifest.to_string())).expect("PriorityClass");
}

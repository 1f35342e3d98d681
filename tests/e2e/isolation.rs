//! One bad object never stalls admission for the others (issue 15): a pod patch the API server
//! refuses (a ValidatingAdmissionPolicy here; a webhook's 400/403 is the same answer) is that
//! pod's or that gang's problem, reported on it and backed off alone, while gangs elsewhere are
//! admitted. Also: a gang whose pin is refused is never half started, a group in a namespace
//! muster's webhooks skip is reported instead of counted, and a gang whose pods beyond minCount
//! do not fit says so instead of claiming to be wholly admitted.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use muster::controllers::admission::FAULT_EXIT_ENV;
use muster::crds::scheduling::PlanState;
use muster::crds::{MusterJob, PodGroup};
use serde_json::json;

use crate::gangs::{self, plain_pod};
use crate::gangs::{
    LONG, TestNodes, all_bound, apply, condition, events_of, gang, gated, gpu_job, indices_of, job_pods, merge,
    node_of, pin_of,
};
use crate::harness::extra::extra_muster;
use crate::harness::manager::muster;
use crate::harness::{client, cluster, kubectl_apply, metric, namespace, wait_for};

/// A ValidatingAdmissionPolicy (and its binding) refusing every UPDATE of a pod in `ns` whose
/// name starts with `prefix` ("": every pod), named after the namespace. Returns once the API
/// server enforces it (probed on a pod named `<prefix>probe`). Dropped: deleted.
struct LockedPods {
    name: String,
}

impl LockedPods {
    /// `reason`: the answer's reason (`Forbidden`: 403; `Invalid`: 422, a policy's default).
    async fn new(ns: &str, prefix: &str, reason: &str) -> Self {
        let name = format!("e2e-lock-{ns}");
        let policy = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods"],
                }]},
                "validations": [{
                    "expression": format!("!object.metadata.name.startsWith('{prefix}')"),
                    "message": "pods here are locked (e2e policy)",
                    "reason": reason,
                }],
            },
        });
        let binding = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}},
            },
        });
        kubectl_apply("default", &policy.to_string());
        kubectl_apply("default", &binding.to_string());
        // The API server loads policies asynchronously: wait until an update is refused.
        let probe = format!("{prefix}probe");
        let pods: Api<Pod> = Api::namespaced(client().await, ns);
        if pods.get_opt(&probe).await.ok().flatten().is_none() {
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": probe},
                "spec": {"containers": [{"name": "c", "image": "registry.invalid/none"}],
                    "schedulingGates": [{"name": "e2e.muster.dev/never"}]},
            }))
            .expect("probe pod");
            pods.create(&PostParams::default(), &pod).await.expect("create the probe pod");
        }
        wait_for("the ValidatingAdmissionPolicy to be enforced", Duration::from_secs(30), || async {
            let out = cluster().kubectl(&[
                "-n",
                ns,
                "label",
                "pod",
                &probe,
                "e2e-probe=1",
                "--overwrite",
                "--dry-run=server",
            ]);
            out.is_err().then_some(())
        })
        .await;
        Self { name }
    }
}

impl Drop for LockedPods {
    fn drop(&mut self) {
        let _ = cluster().kubectl(&["delete", "validatingadmissionpolicybinding", &self.name, "--ignore-not-found"]);
        let _ = cluster().kubectl(&["delete", "validatingadmissionpolicy", &self.name, "--ignore-not-found"]);
    }
}

/// Waits until PodGroup `ns/name` satisfies `check`.
async fn group_until(ns: &str, name: &str, what: &str, check: impl Fn(&PodGroup) -> bool) -> PodGroup {
    let groups: Api<PodGroup> = Api::namespaced(client().await, ns);
    gangs::group_until(&groups, name, what, check).await
}

fn message(g: &PodGroup) -> &str {
    g.status.as_ref().and_then(|s| s.message.as_deref()).unwrap_or_default()
}

#[tokio::test]
async fn a_pod_whose_gpu_annotation_is_refused_stalls_no_other_gang() {
    let m = muster().await;
    let locked = namespace("iso-locked");
    let lock = LockedPods::new(&locked.name, "", "Forbidden").await;
    let locked_nodes = TestNodes::add(&locked.name, 1, 4, 1).await;
    let pods: Api<Pod> = Api::namespaced(client().await, &locked.name);
    pods.create(&PostParams::default(), &plain_pod("plain", 1, &locked_nodes, json!({}))).await.expect("plain pod");
    wait_for("the plain GPU pod bound by kube-scheduler", LONG, || async {
        let p = pods.get_opt("plain").await.ok().flatten()?;
        p.spec.as_ref()?.node_name.as_ref().map(|_| ())
    })
    .await;

    // A gang elsewhere is admitted and binds whole, while the device pass keeps failing there.
    let ns = namespace("iso-free");
    let nodes = TestNodes::add(&ns.name, 1, 4, 1).await;
    apply(&ns.name, &gpu_job("train", 2, 1, &nodes, gang(2), json!({})));
    let free: Api<Pod> = Api::namespaced(client().await, &ns.name);
    all_bound(&free, "train", 2).await;

    // The refusal is reported on the pod, and counted by reason.
    let events = wait_for("a Warning event on the locked pod", LONG, || async {
        let e = events_of(&locked.name, "plain").await;
        e.iter().any(|(t, _, m)| t == "Warning" && m.contains("locked")).then_some(e)
    })
    .await;
    assert!(events.iter().any(|(_, _, m)| m.contains("pods here are locked")), "{events:?}");
    let text = m.endpoints.metrics().await;
    let refused: f64 = ["forbidden", "invalid"]
        .iter()
        .map(|r| metric(&text, "muster_device_patch_errors_total", &[("reason", r)]))
        .sum();
    assert!(refused >= 1.0, "the refused device patch is counted by reason:\n{}", grep(&text, "patch_errors"));
    drop(lock);
}

#[tokio::test]
async fn a_gang_whose_pin_is_refused_is_never_half_started_and_admitted_once_allowed() {
    let _m = muster().await;
    let ns = namespace("iso-refused");
    let nodes = TestNodes::add(&ns.name, 1, 4, 1).await;
    // Updates of the gang's second pod are refused: the dry run finds it before any pod is ungated.
    let lock = LockedPods::new(&ns.name, "train-1-", "Invalid").await;
    apply(&ns.name, &gpu_job("train", 2, 1, &nodes, gang(2), json!({})));
    let g = group_until(&ns.name, "train", "unschedulable: the API server refused a pin", |g| {
        message(g).contains("refused")
    })
    .await;
    assert!(message(&g).contains("pods here are locked"), "the API server's word is quoted: {}", message(&g));
    let admitted = condition(&g, "Admitted").expect("Admitted condition");
    assert_eq!(admitted.status, "False", "{admitted:?}");
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    // Several attempts later, still no pod of the gang ungated.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let now = job_pods(&pods, "train").await;
    assert_eq!(now.len(), 2);
    assert!(now.iter().all(gated), "no pod ungated while one pin is refused: {:?}", names(&now));

    drop(lock);
    all_bound(&pods, "train", 2).await;
}

#[tokio::test]
async fn a_group_in_a_namespace_the_webhooks_skip_is_reported_not_admitted() {
    let _m = muster().await;
    let ns = "kube-system";
    let name = format!("e2e-excluded-{}", std::process::id());
    let group: PodGroup = serde_json::from_value(json!({
        "apiVersion": "scheduling.muster.dev/v1alpha1", "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 1}}},
    }))
    .expect("pod group");
    let groups: Api<PodGroup> = Api::namespaced(client().await, ns);
    groups.create(&PostParams::default(), &group).await.expect("create the PodGroup");
    let _cleanup = Cleanup(name.clone());
    let g = group_until(ns, &name, "Admitted=False NamespaceExcluded", |g| {
        condition(g, "Admitted").is_some_and(|c| c.reason == "NamespaceExcluded" && c.status == "False")
    })
    .await;
    assert!(message(&g).contains("kube-system"), "{}", message(&g));

    // A MusterJob there is refused by its controller, which would otherwise gate pods that no
    // webhook checks.
    let job_name = format!("e2e-excluded-job-{}", std::process::id());
    let job = json!({
        "apiVersion": "batch.muster.dev/v1alpha1", "kind": "MusterJob", "metadata": {"name": job_name},
        "spec": {"parallelism": 1, "completions": 1, "scheduling": gang(1), "template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "main", "image": "registry.invalid/none"}]}}},
    });
    apply(ns, &job);
    let _job_cleanup = Cleanup(format!("musterjob/{job_name}"));
    let jobs: Api<MusterJob> = Api::namespaced(client().await, ns);
    let invalid = wait_for("the kube-system MusterJob Invalid, NamespaceExcluded", LONG, || async {
        let j = jobs.get_opt(&job_name).await.ok().flatten()?;
        let c = j.status.as_ref()?.conditions.iter().find(|c| c.type_ == "Invalid")?.clone();
        (c.reason == "NamespaceExcluded").then_some(c)
    })
    .await;
    assert!(invalid.message.contains("kube-system"), "{}", invalid.message);
    let pods: Api<Pod> = Api::namespaced(client().await, ns);
    let created =
        pods.list(&kube::api::ListParams::default().labels(&format!("batch.muster.dev/job-name={job_name}"))).await;
    assert!(created.map(|l| l.items.is_empty()).unwrap_or(true), "no pod created for it");
}

/// Deletes the kube-system PodGroup of a test.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let target = if self.0.contains('/') { self.0.clone() } else { format!("podgroup/{}", self.0) };
        let _ = cluster().kubectl(&["-n", "kube-system", "delete", &target, "--ignore-not-found"]);
    }
}

#[tokio::test]
async fn gated_pods_beyond_min_count_that_do_not_fit_are_reported_and_backed_off() {
    let _m = muster().await;
    let ns = namespace("iso-partly");
    let nodes = TestNodes::add(&ns.name, 1, 2, 1).await;
    // Three pods, minCount 2, room for two: the gang starts, the third waits and says why.
    apply(&ns.name, &gpu_job("train", 3, 1, &nodes, gang(2), json!({})));
    let g = group_until(&ns.name, "train", "partly admitted", |g| {
        condition(g, "Admitted").is_some_and(|c| c.reason == "PartlyAdmitted")
    })
    .await;
    let admitted = condition(&g, "Admitted").expect("Admitted condition");
    assert_eq!(admitted.status, "True");
    assert!(admitted.message.contains("1 gated pod(s) not admitted"), "{}", admitted.message);
    assert!(admitted.message.contains("Insufficient nvidia.com/gpu"), "{}", admitted.message);
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    let now = job_pods(&pods, "train").await;
    assert_eq!(now.iter().filter(|p| gated(p)).count(), 1, "{:?}", names(&now));
}

fn names(pods: &[Pod]) -> Vec<String> {
    pods.iter().map(|p| format!("{} gated={}", p.name_any(), gated(p))).collect()
}

fn grep(text: &str, pattern: &str) -> String {
    text.lines().filter(|l| l.contains(pattern)).collect::<Vec<_>>().join("\n")
}

/// GPU indices held twice on a node by live pods (annotation of bound or pinned pods), as
/// `node: index`.
fn held_twice(pods: &[Pod]) -> Vec<String> {
    let mut seen: std::collections::BTreeMap<(String, u32), String> = std::collections::BTreeMap::new();
    let mut twice = Vec::new();
    for p in pods.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
        let (Some(node), Some(indices)) = (node_of(p).or(pin_of(p)), indices_of(p)) else { continue };
        for i in indices.split(',').filter_map(|i| i.trim().parse::<u32>().ok()) {
            if let Some(other) = seen.insert((node.to_string(), i), p.name_any()) {
                twice.push(format!("{node}: GPU {i} held by {other} and {}", p.name_any()));
            }
        }
    }
    twice
}

/// The commit protocol re-checks a plan cut short: muster stops after the first of two pod
/// patches, a plain GPU pod binds on the planned node while it is down, and the restarted
/// muster's device pass gives that pod the very indices planned for the gang's second pod. The
/// resumed commit must see the plan no longer fits and roll the attempt back, never pin the
/// second pod onto GPUs another pod holds.
#[tokio::test]
async fn a_plan_cut_short_that_no_longer_fits_is_rolled_back_not_resumed() {
    let mut extra = extra_muster(&[], &[(FAULT_EXIT_ENV, "1")]).await;
    let ns = namespace("iso-resume");
    let nodes = TestNodes::add(&ns.name, 1, 4, 1).await;
    apply(&ns.name, &gpu_job("train", 2, 2, &nodes, gang(2), json!({})));
    let status = extra.exited(LONG).await;
    assert_eq!(status.code(), Some(3), "muster exits through the test hook after one patch");
    let groups: Api<PodGroup> = Api::namespaced(client().await, &ns.name);
    let plan = groups.get("train").await.expect("PodGroup").status.and_then(|s| s.plan).expect("a plan");
    assert_eq!((plan.state, plan.pods.len()), (PlanState::Committing, 2));

    // While muster is down, a plain 2-GPU pod binds on the planned node.
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    pods.create(&PostParams::default(), &plain_pod("plain", 2, &nodes, json!({}))).await.expect("plain pod");
    wait_for("the plain pod bound while muster is down", LONG, || async {
        let p = pods.get_opt("plain").await.ok().flatten()?;
        node_of(&p).map(|_| ())
    })
    .await;

    extra.start(&[], &[]).await;
    // Until the attempt is rolled back, no GPU is ever held twice.
    let deadline = std::time::Instant::now() + LONG;
    loop {
        let all = pods.list(&Default::default()).await.expect("list pods").items;
        let twice = held_twice(&all);
        assert!(twice.is_empty(), "GPU indices held twice after the resume: {twice:?}");
        let events = events_of(&ns.name, "train").await;
        if let Some((_, _, m)) = events.iter().find(|(_, r, _)| r == "BindFailed") {
            assert!(m.contains("no longer fits"), "the rollback says why: {m}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no rollback of the plan cut short: {events:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The plain pod keeps its GPUs; the gang (4 GPUs) no longer fits and waits wholly gated.
    let deadline = std::time::Instant::now() + LONG;
    let g = loop {
        let g = groups.get("train").await.expect("PodGroup");
        if g.status.as_ref().is_some_and(|s| s.gated == 2) && message(&g).contains("only 1 placeable") {
            break g;
        }
        assert!(std::time::Instant::now() < deadline, "the gang does not wait wholly gated: {:?}", g.status);
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(g.status.as_ref().map(|s| s.scheduled), Some(0));
    let all = pods.list(&Default::default()).await.expect("list pods").items;
    assert!(held_twice(&all).is_empty());
}

/// A PodGroup and a CompositePodGroup of the same name (a MusterJob `pair`, and a
/// CompositePodGroup `pair` made by hand with one child group and pod) are two roots: each is
/// admitted and each status speaks of its own pods.
#[tokio::test]
async fn a_pod_group_and_a_composite_of_the_same_name_are_two_roots() {
    let _m = muster().await;
    let ns = namespace("iso-samename");
    let nodes = TestNodes::add(&ns.name, 2, 4, 1).await;
    let composite = json!({
        "apiVersion": "scheduling.muster.dev/v1alpha1", "kind": "CompositePodGroup", "metadata": {"name": "pair"},
        "spec": {"workloadRef": {"workloadName": "pair", "templateName": "pair"},
            "schedulingPolicy": {"gang": {"minGroupCount": 1}}},
    });
    let child = json!({
        "apiVersion": "scheduling.muster.dev/v1alpha1", "kind": "PodGroup", "metadata": {"name": "pair-kid"},
        "spec": {"parentCompositePodGroupName": "pair", "workloadRef": {"workloadName": "pair", "templateName": "kid"},
            "schedulingPolicy": {"gang": {"minCount": 3}}},
    });
    apply(&ns.name, &composite);
    apply(&ns.name, &child);
    for i in 0..3 {
        let mut spec = json!({"restartPolicy": "Never", "containers": [{"name": "main",
            "image": "registry.invalid/none", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]});
        merge(&mut spec, nodes.placement());
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("kid-{i}"), "labels": {muster::crds::POD_GROUP_LABEL: "pair-kid"}},
            "spec": spec});
        apply(&ns.name, &pod);
    }
    apply(&ns.name, &gpu_job("pair", 4, 1, &nodes, gang(4), json!({})));
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    all_bound(&pods, "pair", 4).await;
    wait_for("the composite's 3 pods bound", LONG, || async {
        let all = pods.list(&Default::default()).await.ok()?.items;
        let kids: Vec<&Pod> = all.iter().filter(|p| p.name_any().starts_with("kid-")).collect();
        (kids.len() == 3 && kids.iter().all(|p| node_of(p).is_some())).then_some(())
    })
    .await;
    let g = group_until(&ns.name, "pair", "Admitted", |g| condition(g, "Admitted").is_some_and(|c| c.status == "True"))
        .await;
    let admitted = condition(&g, "Admitted").expect("Admitted");
    assert!(admitted.message.contains("placed 4 pod(s)"), "the PodGroup's own decision: {}", admitted.message);
    let composites: Api<muster::crds::CompositePodGroup> = Api::namespaced(client().await, &ns.name);
    let c = wait_for("CompositePodGroup pair admitted", LONG, || async {
        let c = composites.get_opt("pair").await.ok().flatten()?;
        (c.status.as_ref()?.admitted_children == 1).then_some(c)
    })
    .await;
    let message = c.status.and_then(|s| s.message).unwrap_or_default();
    assert!(message.contains("placed 3 pod(s)"), "the composite's own decision: {message}");
}

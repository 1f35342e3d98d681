//! Hostile input (issue 38): what a tenant can do with the rights of the built-in `edit` role in
//! its own namespace (a ServiceAccount, through a TokenRequest token: [`tenant_client`]) must not
//! let it take GPUs, priority or muster itself from anyone else.
//!
//! The suite runs twice. `make e2e`: muster runs as admin and no policy of the chart is applied,
//! so muster itself must ignore what the tenant forges. `make e2e-rbac`: muster runs as the
//! chart's ServiceAccount and the chart's ValidatingAdmissionPolicies are applied, so the forged
//! write is refused when it is made, by a message naming the key and muster.
//!
//! 1. GPU squatting: a pod nobody placed, pinned to a node by hostname and never bound, names
//!    `gpu.muster.dev/indices: 0,1,2,3`; a gang needing those GPUs must still be admitted, and
//!    the ignored indices reported once (`UntrustedGPUIndices`).
//! 2. Forged priority: a MusterJobSet whose `replicas: 0` replicatedJob names a class the
//!    tenant may not run pods of must not rank the set at that class and preempt others.
//! 3. Absurd size: a MusterJob of 50,000,000 pods is refused by the webhook; behind its back it
//!    is marked invalid, makes no pod, and muster keeps serving everyone else.
//! 4. muster's own keys in a pod template are refused at their field path.
//! 5. Removing the admission gate or forging the pin on a gated pod (the chart's policy only).
//! 6. A cluster limit lowered with `muster run --max-job-pods`: refused by the webhook, and a
//!    job made before it is marked `Invalid` (`PodLimitExceeded`) with no pod.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use muster::crds::{
    ADMISSION_GATE, CompositePodGroup, GPU_INDICES_ANNOTATION, GPU_RESOURCE, HOSTNAME_LABEL, JOB_NAME_LABEL, MusterJob,
    MusterJobSet, POD_GROUP_LABEL, PodGroup,
};
use serde_json::{Value, json};

use crate::cases::error_paths;
use crate::gangs::{LONG, TestNodes, apply, gang, gated, gpu_job, indices_by_node, job_pods, merge, node_of};
use crate::harness::manager::{self, muster, muster_exclusive};
use crate::harness::rbac::{self, tenant_client};
use crate::harness::{client, cluster, namespace, wait_for, wait_for_opt};
use crate::preemption::{priority_class, with_class};

/// The event reason muster reports indices it does not believe with.
const UNTRUSTED: &str = "UntrustedGPUIndices";
/// A node label no node has: a pod selecting it stays Pending, never bound.
const NOWHERE: &str = "e2e.muster.dev/nowhere";
/// The size of the absurd job, and the most muster accepts.
const ABSURD: i64 = 50_000_000;
const MOST_PODS: i64 = 100_000;

/// What the apiserver said when it refused a write.
fn refusal(e: kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message,
        other => other.to_string(),
    }
}

/// Creates `object` (JSON as written, nothing defaulted by a typed client) of kind `K` in `ns`
/// as `who`.
async fn create_as<K>(who: &kube::Client, ns: &str, object: &Value) -> Result<(), String>
where
    K: kube::Resource<DynamicType = ()>,
{
    create_with::<K>(who, ns, object, &PostParams::default()).await
}

async fn create_with<K>(who: &kube::Client, ns: &str, object: &Value, params: &PostParams) -> Result<(), String>
where
    K: kube::Resource<DynamicType = ()>,
{
    let resource = ApiResource::erase::<K>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(who.clone(), ns, &resource);
    let object: DynamicObject = serde_json::from_value(object.clone()).expect("an object");
    api.create(params, &object).await.map(|_| ()).map_err(refusal)
}

/// Checks a refusal by the chart's policy: it names `key` and muster.
fn refused_by_policy(what: &str, refused: &str, key: &str) {
    eprintln!("{what}: refused: {refused}");
    assert!(refused.contains(key), "{what}: the refusal does not name {key}: {refused}");
    assert!(refused.to_lowercase().contains("muster"), "{what}: the refusal does not name muster: {refused}");
}

/// Events of `reason` about object `name` in `namespace`, as (type, message, count).
async fn events_with(namespace: &str, name: &str, reason: &str) -> Vec<(String, String, i32)> {
    let events: Api<Event> = Api::namespaced(client().await, namespace);
    let list = events.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
    list.into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name) && e.reason.as_deref() == Some(reason))
        .map(|e| {
            let count = e.count.unwrap_or(1).max(e.series.as_ref().and_then(|s| s.count).unwrap_or(1));
            (e.type_.unwrap_or_default(), e.message.unwrap_or_default(), count)
        })
        .collect()
}

/// The status message of PodGroup `name`, for failure messages.
async fn group_message(namespace: &str, name: &str) -> String {
    let groups: Api<PodGroup> = Api::namespaced(client().await, namespace);
    let status = groups.get_opt(name).await.ok().flatten().and_then(|g| g.status);
    status.map(|s| format!("{:?}: {}", s.phase, s.message.unwrap_or_default())).unwrap_or_else(|| "no status".into())
}

/// Waits until the `n` pods of MusterJob `job` are bound; on a timeout, fails saying where its
/// PodGroup stands.
async fn gang_bound(namespace: &str, job: &str, n: usize) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client().await, namespace);
    let bound = wait_for_opt(LONG, || async {
        let live = job_pods(&pods, job).await;
        (live.len() == n && live.iter().all(|p| node_of(p).is_some())).then_some(live)
    })
    .await;
    match bound {
        Some(bound) => bound,
        None => panic!(
            "the {n} pods of {namespace}/{job} were not all bound after {LONG:?}; its PodGroup: {}",
            group_message(namespace, job).await
        ),
    }
}

/// Attack 1: in a pool of one 4-GPU node, the tenant's pod `squat` (asking for `gpus`
/// nvidia.com/gpu), pinned to the node by hostname but never bound, names GPUs 0-3. A gang of
/// 2 pods x 2 GPUs in another namespace must get exactly those four, and muster reports the
/// ignored indices once.
async fn squatted_gpus_are_still_given(prefix: &str, gpus: u32) {
    let _muster = muster().await;
    let ns = namespace(prefix);
    let other = namespace(&format!("{prefix}-gang"));
    let nodes = TestNodes::add(&other.name, 1, 4, 1).await;
    let node = nodes.names[0].clone();
    let hostname =
        Api::<Node>::all(client().await).get(&node).await.expect("the pool's node").labels()[HOSTNAME_LABEL].clone();
    let tenant = tenant_client(&ns.name).await;

    let mut spec =
        json!({"restartPolicy": "Never", "containers": [{"name": "main", "image": "registry.invalid/none"}]});
    if gpus > 0 {
        spec["containers"][0]["resources"] = json!({"limits": {GPU_RESOURCE: gpus.to_string()}});
    }
    merge(&mut spec, nodes.placement());
    merge(&mut spec, json!({"nodeSelector": {HOSTNAME_LABEL: hostname, NOWHERE: "true"}}));
    let squat: Pod = serde_json::from_value(json!({
        "metadata": {"name": "squat", "annotations": {GPU_INDICES_ANNOTATION: "0,1,2,3"}},
        "spec": spec,
    }))
    .expect("a pod");
    let tenant_pods: Api<Pod> = Api::namespaced(tenant.clone(), &ns.name);
    let created = match tenant_pods.create(&PostParams::default(), &squat).await {
        Ok(_) if rbac::enabled() => panic!("the chart's policy let the tenant write {GPU_INDICES_ANNOTATION}"),
        Ok(_) => true,
        Err(e) if rbac::enabled() => {
            refused_by_policy("a tenant's pod naming GPU indices", &refusal(e), GPU_INDICES_ANNOTATION);
            false
        }
        Err(e) => panic!("the tenant could not create its pod: {}", refusal(e)),
    };
    if created {
        // Give muster's caches the squatter before the gang comes (short once it is reported).
        let reported = wait_for_opt(Duration::from_secs(5), || async {
            (!events_with(&ns.name, "squat", UNTRUSTED).await.is_empty()).then_some(())
        })
        .await;
        eprintln!("{prefix}: {UNTRUSTED} reported before the gang came: {}", reported.is_some());
    }

    apply(&other.name, &gpu_job("gang", 2, 2, &nodes, gang(2), json!({})));
    let bound = gang_bound(&other.name, "gang", 2).await;
    assert_eq!(
        indices_by_node(&bound).get(&node).map(Vec::as_slice),
        Some([0, 1, 2, 3].as_slice()),
        "the gang holds the 4 GPUs the squatter named"
    );
    if !created {
        return;
    }
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    let squat = pods.get("squat").await.expect("the squatter");
    assert_eq!(node_of(&squat), None, "the squatter was never bound (the test's premise)");

    let first = wait_for("a Warning UntrustedGPUIndices event on the squatter", LONG, || async {
        let events = events_with(&ns.name, "squat", UNTRUSTED).await;
        (!events.is_empty()).then_some(events)
    })
    .await;
    eprintln!("{prefix}: {first:?}");
    // Each pod change runs the ledger again (the gang's admission and binding made several):
    // a report that repeats would show by now.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let events = events_with(&ns.name, "squat", UNTRUSTED).await;
    assert_eq!(events.len(), 1, "one {UNTRUSTED} event: {events:?}");
    let (type_, message, count) = &events[0];
    assert_eq!(type_, "Warning", "{events:?}");
    assert_eq!(*count, 1, "reported once, not repeated: {events:?}");
    assert!(message.contains(GPU_INDICES_ANNOTATION), "the event names the annotation: {message}");
}

#[tokio::test]
async fn gpu_indices_on_a_pod_asking_for_no_gpu_hold_nothing() {
    squatted_gpus_are_still_given("hostile-squat", 0).await;
}

#[tokio::test]
async fn gpu_indices_on_a_gpu_pod_muster_did_not_place_and_not_bound_hold_nothing() {
    squatted_gpus_are_still_given("hostile-squat-gpu", 1).await;
}

/// Attack 2: the tenant may not run pods of class `hostile-high` (its quota says 0). A
/// MusterJobSet naming that class only in a replicatedJob of `replicas: 0` must not rank at it
/// and preempt a priority-100 gang running elsewhere.
#[tokio::test]
async fn a_class_named_by_a_replicated_job_with_no_replicas_does_not_preempt() {
    let _muster = muster().await;
    priority_class("hostile-high", 1_000_000, false);
    priority_class("hostile-low", 100, false);
    let ns = namespace("hostile-prio");
    let other = namespace("hostile-prio-low");
    let nodes = TestNodes::add(&other.name, 1, 4, 1).await;
    apply(
        &ns.name,
        &json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-hostile-high"},
            "spec": {"hard": {"pods": "0"}, "scopeSelector": {"matchExpressions": [
                {"scopeName": "PriorityClass", "operator": "In", "values": ["hostile-high"]}]}}}),
    );
    let tenant = tenant_client(&ns.name).await;

    let all = json!({"schedulingPolicy": {"gang": {"minCount": 2}}, "disruptionMode": {"all": {}}});
    apply(&other.name, &with_class(gpu_job("low", 2, 2, &nodes, all, json!({})), "hostile-low"));
    let before: Vec<String> = gang_bound(&other.name, "low", 2).await.iter().map(|p| p.uid().expect("uid")).collect();

    let pod = |class: Option<&str>| {
        let mut spec = json!({"restartPolicy": "Never", "containers": [{"name": "main", "image": "registry.invalid/none",
            "resources": {"limits": {GPU_RESOURCE: "2"}}}]});
        merge(&mut spec, nodes.placement());
        if let Some(class) = class {
            spec["priorityClassName"] = json!(class);
        }
        json!({"spec": spec})
    };
    let set = json!({
        "apiVersion": "batch.muster.dev/v1alpha1",
        "kind": "MusterJobSet",
        "metadata": {"name": "forged"},
        "spec": {
            "scheduling": {"schedulingPolicy": {"gang": {}}},
            "replicatedJobs": [
                {"name": "main", "replicas": 1, "template": {"spec": {
                    "parallelism": 2, "completions": 2, "completionMode": "Indexed",
                    "scheduling": {"schedulingPolicy": {"gang": {"minCount": 2}}},
                    "template": pod(None)}}},
                {"name": "ghost", "replicas": 0, "template": {"spec": {"template": pod(Some("hostile-high"))}}},
            ],
        },
    });
    if let Err(refused) = create_as::<MusterJobSet>(&tenant, &ns.name, &set).await {
        // Refusing the forged class outright is as safe as ignoring it.
        eprintln!("the tenant's MusterJobSet was refused: {refused}");
        assert!(refused.contains("priorityClassName"), "refused for another reason: {refused}");
        if rbac::enabled() {
            assert!(refused.to_lowercase().contains("muster"), "{refused}");
        }
        return;
    }
    // The set is compiled and its pods wait for the node.
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    let made = wait_for_opt(LONG, || async {
        let live = job_pods(&pods, "forged-main-0").await;
        (live.len() == 2 && live.iter().all(gated)).then_some(())
    })
    .await;
    if made.is_none() {
        let sets: Api<MusterJobSet> = Api::namespaced(client().await, &ns.name);
        let status = sets.get("forged").await.ok().and_then(|s| s.status);
        // A failing reconcile says why only in muster's log.
        let log = std::fs::read_to_string(manager::log_path()).unwrap_or_default();
        let said: Vec<String> = log
            .lines()
            .filter(|l| l.contains(&format!("forged.{}", ns.name)) && l.contains("failed"))
            .map(|l| l.chars().take(700).collect())
            .collect();
        panic!(
            "the set's 2 pods were not made (gated) after {LONG:?}: the set's status {status:?}; events {:?}; \
             muster's log: {:?}",
            crate::gangs::events_of(&ns.name, "forged").await,
            said.last()
        );
    }
    let composites: Api<CompositePodGroup> = Api::namespaced(client().await, &ns.name);
    let root = composites.get("forged").await.expect("the set's CompositePodGroup");
    // (What ranks the set in admission is the priority of its live pods, not this field.)
    eprintln!("the set's CompositePodGroup has spec.priority {:?}", root.spec.priority);

    let low_pods: Api<Pod> = Api::namespaced(client().await, &other.name);
    let watched = std::time::Instant::now();
    while watched.elapsed() < Duration::from_secs(15) {
        let lp = ListParams::default().labels(&format!("{JOB_NAME_LABEL}=low"));
        let now = low_pods.list(&lp).await.expect("list the low gang").items;
        let uids: Vec<String> = now.iter().map(|p| p.uid().expect("uid")).collect();
        assert_eq!(uids.len(), 2, "the low gang's pods: {uids:?} (were {before:?})");
        for p in &now {
            let name = p.name_any();
            assert!(before.contains(&p.uid().expect("uid")), "{name} is not one of the low gang's first pods");
            assert!(p.metadata.deletion_timestamp.is_none(), "{name} is being deleted");
            let conditions = p.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
            let disrupted = conditions.iter().find(|c| c.type_ == "DisruptionTarget");
            assert!(disrupted.is_none(), "{name} is a disruption target: {disrupted:?}");
        }
        let set_pods = job_pods(&pods, "forged-main-0").await;
        assert!(
            set_pods.iter().all(|p| gated(p) && node_of(p).is_none()),
            "the set started: {:?}",
            set_pods.iter().map(|p| (p.name_any(), node_of(p).map(str::to_string))).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let events = crate::gangs::events_of(&ns.name, "forged").await;
    assert!(!events.iter().any(|(_, r, _)| r == "Preempting"), "{events:?}");
    eprintln!(
        "the set waits: {:?}",
        composites.get("forged").await.ok().and_then(|c| c.status).map(|s| (s.phase, s.message))
    );
    // It waits for room, not for nothing: once the low gang ends, the set is admitted.
    let finish = json!({"metadata": {"annotations": {"sim.muster.dev/succeed-after": "0s"}}});
    for p in job_pods(&low_pods, "low").await {
        low_pods.patch(&p.name_any(), &PatchParams::default(), &Patch::Merge(&finish)).await.expect("end a low pod");
    }
    gang_bound(&ns.name, "forged-main-0", 2).await;
}

/// A MusterJob of `n` pods that no node would take.
fn sized_job(name: &str, n: i64, mode: &str) -> Value {
    json!({
        "apiVersion": "batch.muster.dev/v1alpha1",
        "kind": "MusterJob",
        "metadata": {"name": name},
        "spec": {
            "parallelism": n,
            "completions": n,
            "completionMode": mode,
            "template": {"spec": {"restartPolicy": "Never", "nodeSelector": {NOWHERE: "true"},
                "containers": [{"name": "main", "image": "registry.invalid/none"}]}},
        },
    })
}

/// The resident memory of process `pid` in KiB, and whether it is alive (not a zombie).
fn resident_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    if status.lines().any(|l| l.starts_with("State:") && l.contains('Z')) {
        return None;
    }
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The `maximum` the CRD's schema sets on `spec.<field>` of MusterJob, if any.
fn schema_maximum(field: &str) -> Option<i64> {
    let crd = cluster().kubectl(&["get", "crd", "musterjobs.batch.muster.dev", "-o", "json"]).ok()?;
    let crd: Value = serde_json::from_str(&crd).ok()?;
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][field]["maximum"]
        .as_i64()
}

/// Attack 3: 50,000,000 pods. The webhook refuses it naming the field; behind the webhook's back
/// the job is marked invalid, no pod is made, and muster keeps serving others.
#[tokio::test]
async fn a_job_of_fifty_million_pods_is_refused_and_behind_the_webhook_makes_nothing() {
    let exclusive = muster_exclusive().await;
    let pid = manager::pid().expect("muster's pid");
    let ns = namespace("hostile-size");
    let tenant = tenant_client(&ns.name).await;
    let jobs = [("huge", "Indexed"), ("huge-nonindexed", "NonIndexed")];
    // A dry run: the webhook and policies answer it as they would the create, and where they
    // let it through nothing is made that would swamp the muster other tests share.
    let dry = PostParams { dry_run: true, ..Default::default() };
    for (name, mode) in jobs {
        let refused = create_with::<MusterJob>(&tenant, &ns.name, &sized_job(name, ABSURD, mode), &dry)
            .await
            .expect_err("a job of 50,000,000 pods was admitted");
        eprintln!("{mode} job of {ABSURD} pods refused: {refused}");
        let paths = error_paths(&refused);
        assert!(
            paths.contains("spec.parallelism") || paths.contains("spec.completions"),
            "{mode}: not refused at spec.parallelism/spec.completions: {refused}"
        );
    }
    // The limit itself is admitted (dry run: nothing is made).
    let at_limit =
        create_with::<MusterJob>(&tenant, &ns.name, &sized_job("at-limit", MOST_PODS, "Indexed"), &dry).await;
    assert!(at_limit.is_ok(), "a job of {MOST_PODS} pods is refused: {at_limit:?}");

    // Behind the webhook (the apiserver's schema answers first; where it sets a maximum, the
    // object cannot be made at all).
    let schema = (schema_maximum("parallelism"), schema_maximum("completions"));
    if let (Some(p), Some(c)) = schema
        && p < ABSURD
        && c < ABSURD
    {
        eprintln!("the CRD's schema caps parallelism at {p} and completions at {c}: nothing gets past it");
        return;
    }
    let away = exclusive.without_validating_webhook().await;
    for (name, mode) in jobs {
        let job = sized_job(name, ABSURD, mode).to_string();
        away.write(&["-n", &ns.name, "create", "-f", "-"], Some(&job)).await;
    }
    away.restore().await;
    // `exclusive` is held to the end: no other test restarts the shared muster meanwhile, so
    // the same process is checked below.

    let api: Api<MusterJob> = Api::namespaced(client().await, &ns.name);
    for (name, _) in jobs {
        let invalid = wait_for(&format!("{name} marked Invalid"), LONG, || async {
            let status = api.get(name).await.ok()?.status?;
            status.conditions.into_iter().find(|c| c.type_ == "Invalid" && c.status == "True")
        })
        .await;
        eprintln!("{name}: Invalid {}: {}", invalid.reason, invalid.message);
        assert_eq!(invalid.reason, "InvalidSpec", "{invalid:?}");
        assert!(
            invalid.message.contains("spec.parallelism") || invalid.message.contains("spec.completions"),
            "{name}: the condition does not name the field: {}",
            invalid.message
        );
    }
    // A pod made before the condition would be listed by now.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    let made = pods.list(&ListParams::default()).await.expect("list pods").items;
    assert!(made.is_empty(), "{} pod(s) made: {:?}", made.len(), made.iter().map(|p| p.name_any()).collect::<Vec<_>>());

    // muster is the same process, and still serves: a small job elsewhere is admitted.
    let rss = resident_kib(pid);
    eprintln!("muster (pid {pid}) VmRSS: {rss:?} KiB");
    assert_eq!(manager::pid(), Some(pid), "muster was restarted");
    let rss = rss.expect("muster is not running");
    assert!(rss < 512 * 1024, "muster's resident memory is {rss} KiB");
    let small = namespace("hostile-size-small");
    let nodes = TestNodes::add(&small.name, 1, 4, 1).await;
    apply(&small.name, &gpu_job("small", 2, 1, &nodes, gang(2), json!({})));
    gang_bound(&small.name, "small", 2).await;
    assert_eq!(manager::pid(), Some(pid), "muster was restarted");
    assert!(resident_kib(pid).is_some(), "muster exited");
}

/// Attack 4: a pod template carrying muster's own keys (the GPU indices annotation, the
/// PodGroup label) is refused at its field path.
#[tokio::test]
async fn muster_keys_in_a_pod_template_are_refused_at_their_field_path() {
    let _muster = muster().await;
    let ns = namespace("hostile-keys");
    let tenant = tenant_client(&ns.name).await;
    let cases = [
        ("annotations", json!({"annotations": {GPU_INDICES_ANNOTATION: "0,1"}}), GPU_INDICES_ANNOTATION),
        ("labels", json!({"labels": {POD_GROUP_LABEL: "other"}}), POD_GROUP_LABEL),
    ];
    let mut failures = Vec::new();
    for (field, metadata, key) in cases {
        let job = json!({
            "apiVersion": "batch.muster.dev/v1alpha1",
            "kind": "MusterJob",
            "metadata": {"name": format!("forged-{field}")},
            "spec": {"parallelism": 1, "template": {"metadata": metadata, "spec": {"restartPolicy": "Never",
                "nodeSelector": {NOWHERE: "true"}, "containers": [{"name": "main", "image": "registry.invalid/none"}]}}},
        });
        let path = format!("spec.template.metadata.{field}");
        let refused = match create_as::<MusterJob>(&tenant, &ns.name, &job).await {
            Ok(()) => {
                failures.push(format!("{key} in the template: admitted"));
                continue;
            }
            Err(refused) => refused,
        };
        eprintln!("{key} in the template: refused: {refused}");
        if !refused.contains(key) {
            failures.push(format!("{key} in the template: the refusal does not name the key: {refused}"));
        }
        let at_path = error_paths(&refused).iter().any(|p| p.starts_with(&path));
        // With the chart's policy applied, it may answer first (it runs before webhooks).
        let by_policy = rbac::enabled() && refused.to_lowercase().contains("muster");
        if !at_path && !by_policy {
            failures.push(format!("{key} in the template: not refused at {path}: {refused}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Attack 5 (the chart's policy): the tenant may not ungate its own gated pod, nor pin it.
#[tokio::test]
async fn a_tenant_cannot_remove_the_admission_gate_or_forge_the_pin() {
    if !rbac::enabled() {
        eprintln!(
            "hostile::a_tenant_cannot_remove_the_admission_gate_or_forge_the_pin: skipped, the chart's \
             policy is applied only in `make e2e-rbac` (without it, Kubernetes lets a pod's editor remove \
             its scheduling gates)"
        );
        return;
    }
    let _muster = muster().await;
    let ns = namespace("hostile-gate");
    let tenant = tenant_client(&ns.name).await;
    let job = json!({
        "apiVersion": "batch.muster.dev/v1alpha1",
        "kind": "MusterJob",
        "metadata": {"name": "waits"},
        "spec": {"parallelism": 1, "scheduling": {"schedulingPolicy": {"gang": {"minCount": 1}}},
            "template": {"spec": {"restartPolicy": "Never", "nodeSelector": {NOWHERE: "true"},
                "containers": [{"name": "main", "image": "registry.invalid/none"}]}}},
    });
    create_as::<MusterJob>(&tenant, &ns.name, &job).await.expect("the tenant's MusterJob");
    let admin_pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    let pod = wait_for("the job's pod, gated", LONG, || async {
        job_pods(&admin_pods, "waits").await.into_iter().find(gated)
    })
    .await;
    let name = pod.name_any();
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), &ns.name);

    let gates = pod.spec.as_ref().and_then(|s| s.scheduling_gates.clone()).unwrap_or_default();
    let at = gates.iter().position(|g| g.name == ADMISSION_GATE).expect("muster's gate");
    let ungate: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": format!("/spec/schedulingGates/{at}/name"), "value": ADMISSION_GATE},
        {"op": "remove", "path": format!("/spec/schedulingGates/{at}")},
    ]))
    .expect("a patch");
    let refused = pods
        .patch(&name, &PatchParams::default(), &Patch::<()>::Json(ungate))
        .await
        .map_err(refusal)
        .expect_err("the tenant removed muster's admission gate");
    refused_by_policy("removing the admission gate", &refused, ADMISSION_GATE);

    let pin = json!({"spec": {"nodeSelector": {HOSTNAME_LABEL: "pool-gpu-0"}}});
    let refused = pods
        .patch(&name, &PatchParams::default(), &Patch::Merge(&pin))
        .await
        .map_err(refusal)
        .expect_err("the tenant pinned its gated pod");
    refused_by_policy("pinning a gated pod", &refused, HOSTNAME_LABEL);

    let still = admin_pods.get(&name).await.expect("the pod");
    assert!(gated(&still), "the pod lost its gate");
    assert_eq!(crate::gangs::pin_of(&still), None, "the pod was pinned");
}

/// A cluster's own limit below the hard one (`muster run --max-job-pods 10`): the webhook
/// refuses a bigger job at its field, and a job made before the limit was lowered is marked
/// `Invalid` (`PodLimitExceeded`) and gets no pod.
#[tokio::test]
async fn a_lowered_cluster_limit_refuses_new_jobs_and_plans_none_of_the_old_ones() {
    let ns = namespace("hostile-limit");
    let job = |name: &str, pods: u32, suspend: bool| {
        format!(
            "apiVersion: batch.muster.dev/v1alpha1\nkind: MusterJob\nmetadata: {{name: {name}}}\nspec:\n  \
             parallelism: {pods}\n  completions: {pods}\n  suspend: {suspend}\n  template: {{spec: {{restartPolicy: \
             Never, nodeSelector: {{{NOWHERE}: x}}, containers: [{{name: main, image: registry.invalid/none}}]}}}}\n"
        )
    };
    {
        // Under the default limit: admitted, suspended so it makes no pod yet.
        let _shared = muster().await;
        crate::harness::kubectl_apply(&ns.name, &job("before", 11, true));
    }
    let _limited = crate::harness::extra::extra_muster(&["--max-job-pods", "10"], &[]).await;
    let refused = cluster()
        .kubectl_stdin(&["apply", "-n", &ns.name, "-f", "-"], Some(&job("after", 11, false)))
        .expect_err("a job over the cluster's limit was admitted");
    assert!(
        refused.contains(
            "spec.parallelism: Invalid value: 11: must be less than or equal to 10 (the limit of this cluster: muster run --max-job-pods)"
        ),
        "{refused}"
    );
    crate::harness::kubectl_apply(&ns.name, &job("small", 10, true));
    // Made before the limit was lowered: muster plans none of it, and resuming it is an
    // update the webhook checks against the limit too.
    let jobs: Api<MusterJob> = Api::namespaced(client().await, &ns.name);
    let resumed = jobs
        .patch("before", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"suspend": false}})))
        .await
        .map_err(refusal)
        .expect_err("a job over the cluster's limit was resumed");
    assert!(resumed.contains("the limit of this cluster: muster run --max-job-pods"), "{resumed}");
    let invalid = wait_for("the old job marked over the limit", LONG, || async {
        let job = jobs.get_opt("before").await.ok().flatten()?;
        job.status?.conditions.into_iter().find(|c| c.type_ == "Invalid" && c.reason == "PodLimitExceeded")
    })
    .await;
    assert!(invalid.message.contains("must be less than or equal to 10"), "{invalid:?}");
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    let made = pods.list(&ListParams::default().labels(&format!("{JOB_NAME_LABEL}=before"))).await.expect("pods");
    assert!(made.items.is_empty(), "{} pods of a job over the limit", made.items.len());
}

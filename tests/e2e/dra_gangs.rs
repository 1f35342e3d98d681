//! Gangs whose GPUs come through DRA claims, allocated by muster: kwok GPU nodes with the fake
//! NVIDIA driver's ResourceSlices (`harness::dra`), kube-controller-manager's resource-claim
//! controller making each pod's claim from its template, kube-scheduler binding.
//! - every pod binds where muster allocated its claim, the allocation names exactly the
//!   devices of the pod's `gpu.muster.dev/indices`, no device is in two allocations (also
//!   against a plain pod whose claim kube-scheduler allocated on the same nodes), and the
//!   devices are free again once the job is deleted;
//! - a muster killed between a claim allocation and its pod's patch leaves no pod ungated with
//!   a partial set; the next muster finishes the commit with the same devices;
//! - a named claim that does not exist keeps the gang waiting with that reason.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use muster::controllers::admission::FAULT_EXIT_ENV;
use muster::crds::scheduling::PlanState;
use muster::crds::{MusterJob, PodGroup};
use serde_json::{Value, json};

use crate::dra::{allocated, claim_spec, reserved_for};
use crate::gangs::{
    LONG, TestNodes, all_bound, apply, condition, gang, gated, group_until, indices_of, job_pods, merge, node_of,
};
use crate::harness::dra::{DraSlices, PublishOptions};
use crate::harness::extra::extra_muster;
use crate::harness::manager::muster;
use crate::harness::{client, namespace, wait_for};
use muster_dev::dra::Shape;

/// A MusterJob of `pods` pods whose GPUs come from their own claim, made from template
/// `template`, and whose pod spec also has `extra` merged in.
pub(crate) fn claim_job(name: &str, pods: u32, template: &str, nodes: &TestNodes, extra: Value) -> Value {
    let mut spec = json!({
        "restartPolicy": "Never",
        "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": template}],
        "containers": [{"name": "main", "image": "registry.invalid/none", "resources": {"claims": [{"name": "gpus"}]}}],
    });
    merge(&mut spec, nodes.placement());
    merge(&mut spec, extra);
    json!({
        "apiVersion": "batch.muster.dev/v1alpha1",
        "kind": "MusterJob",
        "metadata": {"name": name},
        "spec": {"parallelism": pods, "completions": pods, "completionMode": "Indexed",
                 "scheduling": gang(pods), "template": {"spec": spec}},
    })
}

pub(crate) async fn template(ns: &str, name: &str, count: u32) {
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(client().await, ns);
    let t: ResourceClaimTemplate =
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"spec": claim_spec(count)}})).unwrap();
    templates.create(&PostParams::default(), &t).await.expect("create the template");
}

/// The claim a pod's entry `entry` resolved to (its `status.resourceClaimStatuses`).
pub(crate) fn claim_of(pod: &Pod, entry: &str) -> Option<String> {
    let statuses = pod.status.as_ref()?.resource_claim_statuses.as_ref()?;
    statuses.iter().find(|s| s.name == entry)?.resource_claim_name.clone()
}

/// The device names `gpu-<i>` of an indices annotation such as `0,3`.
fn devices_of(indices: &str) -> BTreeSet<String> {
    indices.split(',').map(|i| format!("gpu-{i}")).collect()
}

/// Checks one bound pod against the claim of its entry `entry`: allocated on the pod's node,
/// exactly the devices of its indices, reserved for it. Returns the claim's devices as (pool,
/// device).
pub(crate) async fn check_pod_claim(claims: &Api<ResourceClaim>, pod: &Pod, entry: &str) -> Vec<(String, String)> {
    let name = claim_of(pod, entry).unwrap_or_else(|| panic!("pod {} names no claim", pod.name_any()));
    let claim = claims.get(&name).await.expect("the pod's claim");
    let devices = allocated(&claim);
    let node = node_of(pod).expect("bound").to_string();
    assert!(devices.iter().all(|(pool, _)| *pool == node), "pod {} on {node}: {devices:?}", pod.name_any());
    let indices = indices_of(pod).unwrap_or_else(|| panic!("pod {} has no GPU indices", pod.name_any()));
    let names: BTreeSet<String> = devices.iter().map(|(_, d)| d.clone()).collect();
    assert_eq!(names, devices_of(indices), "pod {}: claim {name} vs indices {indices}", pod.name_any());
    assert_eq!(reserved_for(&claim), [("pods".to_string(), pod.uid().unwrap())], "claim {name}");
    devices
}

#[tokio::test]
async fn a_gang_with_gpu_claims_binds_where_muster_allocated_and_frees_them_when_deleted() {
    gang_with_gpu_claims("dra-gang", Shape::Current).await;
}

/// The same on the driver's old shape (int `index` and `minor` attributes).
#[tokio::test]
async fn a_gang_with_gpu_claims_binds_where_muster_allocated_on_the_legacy_driver_shape() {
    gang_with_gpu_claims("dra-gang-legacy", Shape::Legacy).await;
}

/// A plain pod's claim (kube-scheduler's) and a gang's claims (muster's) on two nodes of 4 GPUs
/// published in `shape`: every device once, and free again when the job is deleted.
async fn gang_with_gpu_claims(prefix: &str, shape: Shape) {
    let _muster = muster().await;
    let ns = namespace(prefix);
    let nodes = TestNodes::add(&ns.name, 2, 4, 1).await;
    let _slices = DraSlices::publish_with(&nodes.names, &PublishOptions { shape, ..PublishOptions::default() }).await;
    template(&ns.name, "two-gpus", 2).await;
    let client = client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let claims: Api<ResourceClaim> = Api::namespaced(client, &ns.name);

    // A plain pod (no PodGroup) whose claim kube-scheduler allocates on the first node.
    let mut plain = json!({
        "metadata": {"name": "plain"},
        "spec": {"restartPolicy": "Never",
                 "nodeSelector": {"kubernetes.io/hostname": nodes.names[0]},
                 "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "two-gpus"}],
                 "containers": [{"name": "main", "image": "registry.invalid/none", "resources": {"claims": [{"name": "gpus"}]}}]},
    });
    merge(&mut plain["spec"], nodes.placement());
    pods.create(&PostParams::default(), &serde_json::from_value(plain).unwrap()).await.expect("create plain");
    let plain = wait_for("the plain pod bound", LONG, || async {
        pods.get_opt("plain").await.ok().flatten().filter(|p| node_of(p).is_some())
    })
    .await;
    let plain_claim = claims.get(&claim_of(&plain, "gpus").expect("plain's claim")).await.unwrap();
    let plain_devices = allocated(&plain_claim);
    assert_eq!(plain_devices.len(), 2);

    // 3 pods x 2 GPUs: exactly the 6 devices left on the two nodes.
    apply(&ns.name, &claim_job("train", 3, "two-gpus", &nodes, json!({})));
    let bound = all_bound(&pods, "train", 3).await;
    let mut seen: BTreeMap<(String, String), String> = BTreeMap::new();
    for d in &plain_devices {
        seen.insert(d.clone(), "plain".into());
    }
    for pod in &bound {
        for d in check_pod_claim(&claims, pod, "gpus").await {
            if let Some(other) = seen.insert(d.clone(), pod.name_any()) {
                panic!("device {d:?} is allocated to {other} and {}", pod.name_any());
            }
        }
    }
    assert_eq!(seen.len(), 8, "every device of the two nodes once: {seen:?}");

    // Deleting the job frees the devices: its pods' claims go with the pods.
    let jobs: Api<MusterJob> = Api::namespaced(pods.clone().into_client(), &ns.name);
    jobs.delete("train", &DeleteParams::foreground()).await.expect("delete the job");
    let left = wait_for("the job's claims gone", LONG, || async {
        let list = claims.list(&Default::default()).await.ok()?;
        (list.items.len() == 1).then_some(list.items)
    })
    .await;
    assert_eq!(left[0].name_any(), plain_claim.name_any(), "only the plain pod's claim is left");

    // The freed devices go to the next gang.
    apply(&ns.name, &claim_job("next", 3, "two-gpus", &nodes, json!({})));
    for pod in all_bound(&pods, "next", 3).await {
        check_pod_claim(&claims, &pod, "gpus").await;
    }
}

/// Kill muster right after it allocated the second pod's claim, before that pod's patch: the
/// pod is still gated (no pod runs on a partial set), its claim holds the planned devices, and
/// the next muster finishes the commit with exactly those devices.
#[tokio::test]
async fn a_crash_between_a_claim_and_its_pod_patch_is_resumed_with_the_same_devices() {
    // Writes: claim 1, pod 1, claim 2 -> exit.
    let mut extra = extra_muster(&[], &[(FAULT_EXIT_ENV, "3")]).await;
    let ns = namespace("dra-crash");
    let nodes = TestNodes::add(&ns.name, 2, 4, 1).await;
    let _slices = DraSlices::publish(&nodes.names).await;
    template(&ns.name, "two-gpus", 2).await;
    let client = client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns.name);
    let groups: Api<PodGroup> = Api::namespaced(client, &ns.name);
    apply(&ns.name, &claim_job("crash", 3, "two-gpus", &nodes, json!({})));
    let status = extra.exited(LONG).await;
    assert_eq!(status.code(), Some(3), "muster exits through the test hook");

    let plan = groups.get("crash").await.unwrap().status.and_then(|s| s.plan).expect("a plan");
    assert_eq!(plan.state, PlanState::Committing);
    assert!(plan.pods.iter().all(|p| p.claims.len() == 1), "the plan names each pod's claim: {:?}", plan.pods);
    let now = job_pods(&pods, "crash").await;
    let ungated: Vec<&Pod> = now.iter().filter(|p| !gated(p)).collect();
    assert_eq!(ungated.len(), 1, "one pod patched");
    // Every ungated pod has its whole set; claims allocated for gated pods name the plan's devices.
    let mut allocated_claims = 0;
    for planned in &plan.pods {
        let claim = claims.get(&planned.claims[0]).await.expect("planned claim");
        let devices: BTreeSet<String> = allocated(&claim).into_iter().map(|(_, d)| d).collect();
        let pod = now.iter().find(|p| p.uid().as_deref() == Some(planned.uid.as_str())).expect("planned pod");
        if !gated(pod) {
            assert_eq!(devices, devices_of(planned.gpu_indices.as_deref().unwrap()), "ungated pod's set");
        }
        if !devices.is_empty() {
            allocated_claims += 1;
            assert_eq!(devices, devices_of(planned.gpu_indices.as_deref().unwrap()), "claim {}", planned.claims[0]);
            assert_eq!(reserved_for(&claim), [("pods".to_string(), planned.uid.clone())]);
        }
    }
    assert_eq!(allocated_claims, 2, "claims 1 and 2 allocated, claim 3 not yet");

    extra.start(&[], &[]).await;
    let bound = all_bound(&pods, "crash", 3).await;
    let mut all = BTreeSet::new();
    for pod in &bound {
        let planned = plan.pods.iter().find(|p| p.uid == pod.uid().unwrap()).expect("a planned pod");
        assert_eq!(node_of(pod), Some(planned.node.as_str()));
        assert_eq!(indices_of(pod), planned.gpu_indices.as_deref());
        for d in check_pod_claim(&claims, pod, "gpus").await {
            assert!(all.insert(d.clone()), "device {d:?} twice");
        }
    }
    // The plan's own write says Admitted (with the decision's message); the resumed commit's
    // clear says it was resumed.
    let done = group_until(&groups, "crash", "Admitted=True, commit resumed", |g| {
        condition(g, "Admitted").is_some_and(|c| c.status == "True" && c.message.contains("commit resumed"))
    })
    .await;
    assert!(condition(&done, "Admitted").unwrap().message.contains("commit resumed"));
}

#[tokio::test]
async fn a_named_claim_that_does_not_exist_keeps_the_gang_waiting_with_that_reason() {
    let _muster = muster().await;
    let ns = namespace("dra-missing");
    let nodes = TestNodes::add(&ns.name, 1, 4, 1).await;
    let _slices = DraSlices::publish(&nodes.names).await;
    let extra = json!({"resourceClaims": [{"name": "gpus", "resourceClaimName": "nope"}]});
    apply(&ns.name, &claim_job("lost", 2, "unused", &nodes, extra));
    let groups: Api<PodGroup> = Api::namespaced(client().await, &ns.name);
    let g = group_until(&groups, "lost", "Admitted=False naming the claim", |g| {
        condition(g, "Admitted").is_some_and(|c| c.status == "False" && c.message.contains("nope"))
    })
    .await;
    let message = &condition(&g, "Admitted").unwrap().message;
    assert!(
        message
            .contains(&format!("ResourceClaim {}/nope named by resourceClaims[0] (\"gpus\") does not exist", ns.name)),
        "{message}"
    );
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    assert!(job_pods(&pods, "lost").await.iter().all(gated), "the gang stays gated");
}

/// MIG devices and ComputeDomain channels published beside the GPUs (today's shape; GPUs 0 and
/// 1 in MIG mode, so published only as MIG devices) are never given out as GPUs: a gang whose
/// pods ask for a MIG device or a ComputeDomain channel waits, every pod gated, with the reason
/// naming them and upstream mode; a gang of GPU claims gets the two whole GPUs left, by device
/// minor, and never a MIG device; the node's topology annotation (4 GPUs) disagrees with the 2
/// whole GPUs published, which is reported on the node.
#[tokio::test]
async fn mig_devices_and_compute_domain_channels_are_never_given_out_as_gpus() {
    let _muster = muster().await;
    let ns = namespace("dra-mig");
    let nodes = TestNodes::add(&ns.name, 1, 4, 1).await;
    let node = nodes.names[0].clone();
    let options = PublishOptions { mig_parents: vec![0, 1], compute_domain: true, ..PublishOptions::default() };
    let _slices = DraSlices::publish_with(&nodes.names, &options).await;
    let client = client().await;
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), &ns.name);
    for (name, class) in [("mig-one", "mig.nvidia.com"), ("channel", "compute-domain-default-channel.nvidia.com")] {
        let t: ResourceClaimTemplate = serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"spec": {
            "devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": class, "count": 1}}]}}}}))
        .unwrap();
        templates.create(&PostParams::default(), &t).await.expect("create the template");
    }
    template(&ns.name, "one-gpu", 1).await;
    apply(&ns.name, &claim_job("mig", 2, "mig-one", &nodes, json!({})));
    apply(&ns.name, &claim_job("channel", 2, "channel", &nodes, json!({})));
    apply(&ns.name, &claim_job("whole", 2, "one-gpu", &nodes, json!({})));

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns.name);
    let bound = all_bound(&pods, "whole", 2).await;
    let mut devices = BTreeSet::new();
    for pod in &bound {
        for (_, d) in check_pod_claim(&claims, pod, "gpus").await {
            assert!(devices.insert(d.clone()), "{d} twice");
        }
    }
    assert_eq!(devices, BTreeSet::from(["gpu-2".to_string(), "gpu-3".to_string()]), "the whole GPUs left");

    let groups: Api<PodGroup> = Api::namespaced(client.clone(), &ns.name);
    for (job, what) in [("mig", "MIG devices"), ("channel", "ComputeDomain devices")] {
        let g = group_until(&groups, job, "Admitted=False naming what muster does not allocate", |g| {
            condition(g, "Admitted").is_some_and(|c| c.status == "False" && c.message.contains(what))
        })
        .await;
        let message = &condition(&g, "Admitted").unwrap().message;
        assert!(message.contains("muster allocates whole GPUs only") && message.contains("upstream"), "{message}");
        assert!(job_pods(&pods, job).await.iter().all(gated), "gang {job} stays gated");
    }
    // No claim of the namespace holds a MIG device or a channel.
    for claim in claims.list(&Default::default()).await.unwrap().items {
        for (_, d) in allocated(&claim) {
            assert!(d.starts_with("gpu-") && !d.contains("mig"), "claim {} holds {d}", claim.name_any());
        }
    }
    // The annotation's 4 GPUs against 2 whole GPUs published: reported on the node.
    let note = wait_for("a GPUProblems event naming the mismatch", LONG, || async {
        let events = crate::gangs::events_of("default", &node).await;
        events
            .into_iter()
            .find(|(t, r, m)| t == "Warning" && r == "GPUProblems" && m.contains("publishes 2 whole GPUs"))
            .map(|e| e.2)
    })
    .await;
    assert!(note.contains("named by device minor"), "{note}");
}

/// `spec.gpuClaims`: the job's `nvidia.com/gpu` limit becomes a claim, which muster allocates
/// with its topology chooser; the pods' indices are what the claims hold.
#[tokio::test]
async fn a_job_opted_into_gpu_claims_gets_its_gpus_allocated_through_claims() {
    let _muster = muster().await;
    let ns = namespace("dra-opt-in");
    let nodes = TestNodes::add(&ns.name, 2, 4, 1).await;
    let _slices = DraSlices::publish(&nodes.names).await;
    let mut job = crate::gangs::gpu_job("opted", 4, 2, &nodes, gang(4), json!({}));
    job["spec"]["gpuClaims"] = json!({});
    apply(&ns.name, &job);
    let client = client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let claims: Api<ResourceClaim> = Api::namespaced(client, &ns.name);
    let mut all = BTreeSet::new();
    let bound = all_bound(&pods, "opted", 4).await;
    let mut claim_names = Vec::new();
    for pod in &bound {
        let name = pod
            .status
            .as_ref()
            .and_then(|s| s.resource_claim_statuses.as_ref())
            .and_then(|s| s.iter().find(|c| c.name == muster::crds::GPU_CLAIM_NAME))
            .and_then(|c| c.resource_claim_name.clone())
            .expect("the pod's GPU claim");
        let claim = claims.get(&name).await.unwrap();
        let devices: BTreeSet<String> = allocated(&claim).into_iter().map(|(_, d)| d).collect();
        assert_eq!(devices, devices_of(indices_of(pod).expect("indices")), "pod {}", pod.name_any());
        for d in allocated(&claim) {
            assert!(all.insert(d.clone()), "device {d:?} twice");
        }
        claim_names.push(name);
    }
    assert_eq!(all.len(), 8, "4 pods x 2 GPUs fill both nodes");

    // A pod that finishes gives its devices back: kube-controller-manager deletes the claim
    // made for it (muster put the delete-protection finalizer on, so the allocation is
    // cleared first).
    let finish = json!({"metadata": {"annotations": {"sim.muster.dev/succeed-after": "0s"}}});
    let first = bound[0].name_any();
    pods.patch(&first, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&finish)).await.unwrap();
    wait_for("the finished pod's claim gone", LONG, || async {
        matches!(claims.get_opt(&claim_names[0]).await, Ok(None)).then_some(())
    })
    .await;
}

/// A group claim (from `spec.scheduling.resourceClaims`) on a node-local device: muster
/// allocates it once, reserved for every pod, and admits the gang only on the node that
/// reaches the device.
#[tokio::test]
async fn a_shared_group_claim_is_allocated_once_and_the_gang_placed_where_it_reaches() {
    let _muster = muster().await;
    let ns = namespace("dra-shared");
    let nodes = TestNodes::add(&ns.name, 2, 4, 1).await;
    let _slices = DraSlices::publish(&nodes.names).await;
    template(&ns.name, "one-gpu", 1).await;
    let mut job = claim_job("shared", 2, "unused", &nodes, json!({}));
    job["spec"]["template"]["spec"]["resourceClaims"] = json!([]);
    job["spec"]["template"]["spec"]["containers"][0]["resources"] = json!({"claims": [{"name": "shared"}]});
    job["spec"]["scheduling"]["resourceClaims"] = json!([{"name": "shared", "resourceClaimTemplateName": "one-gpu"}]);
    apply(&ns.name, &job);
    let client = client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let claims: Api<ResourceClaim> = Api::namespaced(client, &ns.name);
    let bound = all_bound(&pods, "shared", 2).await;
    let claim = claims.get("shared-shared").await.expect("the group claim");
    let devices = allocated(&claim);
    assert_eq!(devices.len(), 1, "{devices:?}");
    for pod in &bound {
        assert_eq!(node_of(pod), Some(devices[0].0.as_str()), "pod {} is where the device is", pod.name_any());
    }
    let reserved: BTreeSet<String> = reserved_for(&claim).into_iter().map(|(_, uid)| uid).collect();
    let uids: BTreeSet<String> = bound.iter().filter_map(|p| p.uid()).collect();
    assert_eq!(reserved, uids, "reserved for every pod of the gang");
}

/// A plan dropped before any pod was ungated frees the claims it allocated: muster is killed
/// right after the first claim, the node's slice goes away (the plan no longer fits), and the
/// next muster drops the plan and clears that claim's allocation and finalizer.
#[tokio::test]
async fn a_dropped_plan_frees_the_claims_it_allocated() {
    let mut extra = extra_muster(&[], &[(FAULT_EXIT_ENV, "1")]).await;
    let ns = namespace("dra-drop");
    let nodes = TestNodes::add(&ns.name, 1, 4, 1).await;
    let slices = DraSlices::publish(&nodes.names).await;
    template(&ns.name, "two-gpus", 2).await;
    let client = client().await;
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client, &ns.name);
    apply(&ns.name, &claim_job("drop", 2, "two-gpus", &nodes, json!({})));
    assert_eq!(extra.exited(LONG).await.code(), Some(3));
    let list = claims.list(&Default::default()).await.unwrap().items;
    let held: Vec<&ResourceClaim> = list.iter().filter(|c| !allocated(c).is_empty()).collect();
    assert_eq!(held.len(), 1, "one claim allocated before the exit");
    let held = held[0].name_any();
    assert!(job_pods(&pods, "drop").await.iter().all(gated), "no pod ungated");

    slices.remove().await;
    extra.start(&[], &[]).await;
    let freed = wait_for("the dropped plan's claim freed", LONG, || async {
        let c = claims.get(&held).await.ok()?;
        let free = allocated(&c).is_empty()
            && reserved_for(&c).is_empty()
            && !c.finalizers().iter().any(|f| f == "resource.kubernetes.io/delete-protection");
        free.then_some(c)
    })
    .await;
    assert!(freed.status.and_then(|s| s.allocation).is_none());
    assert!(job_pods(&pods, "drop").await.iter().all(gated), "still gated: no GPUs published");

    // GPUs published again: the gang is admitted afresh.
    let _again = DraSlices::publish(&nodes.names).await;
    for pod in all_bound(&pods, "drop", 2).await {
        check_pod_claim(&claims, &pod, "gpus").await;
    }
}

/// A DRA-only node (no `nvidia.com/gpu`; GPUs published as devices only) keeps its topology
/// annotation: muster's chooser picks a pair behind one PCIe switch, not the lowest free
/// indices, and allocates exactly those devices.
#[tokio::test]
async fn a_dra_only_node_gets_topology_aware_gpus_through_claims() {
    let _muster = muster().await;
    let ns = namespace("dra-topology");
    let nodes = TestNodes::add_with(&ns.name, 1, 8, |s| {
        s.dra_only = true;
        s.topology = muster_dev::TopologyKind::Pcie;
    })
    .await;
    let slices = DraSlices::publish(&nodes.names).await;
    // Today's driver publishes no index: GPU 0 is named by its uuid.
    let gpu0 = slices.of(&nodes.names[0]).spec.devices.iter().flatten().find(|d| d.name == "gpu-0").unwrap();
    let uuid0 = gpu0.attributes.as_ref().unwrap()["uuid"].string.clone().unwrap();
    let client = client().await;
    let node = kube::Api::<k8s_openapi::api::core::v1::Node>::all(client.clone()).get(&nodes.names[0]).await.unwrap();
    let allocatable = node.status.and_then(|s| s.allocatable).unwrap_or_default();
    assert!(!allocatable.contains_key("nvidia.com/gpu"), "GPUs only as DRA devices");
    template(&ns.name, "two-gpus", 2).await;
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), &ns.name);
    let first: ResourceClaimTemplate = serde_json::from_value(json!({
        "metadata": {"name": "gpu-zero"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
            "deviceClassName": "gpu.nvidia.com", "count": 1,
            "selectors": [{"cel": {"expression": format!("device.attributes['gpu.nvidia.com'].uuid == '{uuid0}'")}}]}}]}}},
    }))
    .unwrap();
    templates.create(&PostParams::default(), &first).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let claims: Api<ResourceClaim> = Api::namespaced(client, &ns.name);
    // GPU 0 goes to a plain pod (kube-scheduler allocates it): the lowest free pair would be
    // 1,2, which sit behind different PCIe switches.
    let mut plain = json!({
        "metadata": {"name": "plain"},
        "spec": {"restartPolicy": "Never",
                 "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "gpu-zero"}],
                 "containers": [{"name": "main", "image": "registry.invalid/none", "resources": {"claims": [{"name": "gpus"}]}}]},
    });
    merge(&mut plain["spec"], nodes.placement());
    pods.create(&PostParams::default(), &serde_json::from_value(plain).unwrap()).await.unwrap();
    wait_for("the plain pod bound", LONG, || async {
        pods.get_opt("plain").await.ok().flatten().filter(|p| node_of(p).is_some())
    })
    .await;

    apply(&ns.name, &claim_job("pair", 1, "two-gpus", &nodes, json!({})));
    let pod = all_bound(&pods, "pair", 1).await.remove(0);
    check_pod_claim(&claims, &pod, "gpus").await;
    let indices: Vec<u32> = indices_of(&pod).unwrap().split(',').map(|i| i.parse().unwrap()).collect();
    assert!(
        indices.len() == 2 && indices[0].is_multiple_of(2) && indices[1] == indices[0] + 1 && indices[0] != 0,
        "a PIX pair other than 0-1: {indices:?}"
    );
}

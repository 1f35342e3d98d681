//! The control plane's DRA behaviour muster's device allocation relies on, with a fake NVIDIA
//! driver's ResourceSlices (`harness::dra`) on kwok nodes and no muster at all (the pods carry
//! no PodGroup label, so muster would leave them alone anyway):
//! - a pod whose claim comes from a ResourceClaimTemplate gets it from kube-controller-manager's
//!   resourceclaim-controller (while still gated), kube-scheduler allocates it and binds the pod,
//!   and the claim goes with the pod, freeing its devices;
//! - a claim allocated by hand (finalizer, then allocation and reservedFor in one status update,
//!   as muster will do) is honoured as is by kube-scheduler, and once the pod is deleted the
//!   resourceclaim-controller takes it out of reservedFor, clears the allocation and drops the
//!   finalizer.
//!
//! Each test prints what it saw and when (`cargo test ... -- --nocapture`).

use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use muster_dev::dra::{DEVICE_CLASS, DRIVER};
use serde_json::{Value, json};

use crate::gangs::{LONG, TestNodes, merge, node_of};
use crate::harness::dra::DraSlices;
use crate::harness::{client, namespace, wait_for};

/// The scheduling gate these tests hold pods with (not muster's).
const HOLD: &str = "e2e.muster.dev/hold";
/// The finalizer kube-scheduler puts on a claim it allocates.
const DELETE_PROTECTION: &str = "resource.kubernetes.io/delete-protection";

/// Claim spec: `count` whole GPUs of the class `gpu.nvidia.com`, request `gpus`.
pub(crate) fn claim_spec(count: u32) -> Value {
    json!({"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": DEVICE_CLASS, "count": count}}]}})
}

/// A pod (no PodGroup: muster ignores it) with one pod-level claim `gpus` (`source`:
/// `resourceClaimName` or `resourceClaimTemplateName`), used by its container, on `nodes`,
/// held by [`HOLD`] when `gated`.
fn claim_pod(name: &str, source: Value, nodes: &TestNodes, gated: bool) -> Pod {
    let mut claim = json!({"name": "gpus"});
    merge(&mut claim, source);
    let mut pod = json!({
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "resourceClaims": [claim],
            "containers": [{"name": "main", "image": "registry.invalid/none", "resources": {"claims": [{"name": "gpus"}]}}],
        },
    });
    if gated {
        pod["spec"]["schedulingGates"] = json!([{"name": HOLD}]);
    }
    merge(&mut pod["spec"], nodes.placement());
    serde_json::from_value(pod).expect("a claim pod")
}

async fn ungate(pods: &Api<Pod>, name: &str) {
    let patch: json_patch::Patch =
        serde_json::from_value(json!([{"op": "remove", "path": "/spec/schedulingGates"}])).expect("patch");
    pods.patch(name, &PatchParams::default(), &Patch::<()>::Json(patch)).await.expect("remove the scheduling gate");
}

async fn bound(pods: &Api<Pod>, name: &str) -> Pod {
    wait_for(&format!("pod {name} bound"), LONG, || async {
        pods.get_opt(name).await.ok().flatten().filter(|p| node_of(p).is_some())
    })
    .await
}

/// `(pool, device)` of every result of the claim's allocation, with the driver checked.
pub(crate) fn allocated(claim: &ResourceClaim) -> Vec<(String, String)> {
    let results = claim.status.as_ref().and_then(|s| s.allocation.as_ref()).and_then(|a| a.devices.as_ref());
    results
        .map(|d| d.results.clone().unwrap_or_default())
        .unwrap_or_default()
        .into_iter()
        .map(|r| {
            assert_eq!(r.driver, DRIVER, "claim {}: {r:?}", claim.name_any());
            (r.pool, r.device)
        })
        .collect()
}

pub(crate) fn reserved_for(claim: &ResourceClaim) -> Vec<(String, String)> {
    let status = claim.status.as_ref();
    status.and_then(|s| s.reserved_for.clone()).unwrap_or_default().into_iter().map(|r| (r.resource, r.uid)).collect()
}

fn node_selector_names(claim: &ResourceClaim) -> Value {
    let selector = claim.status.as_ref().and_then(|s| s.allocation.as_ref()).and_then(|a| a.node_selector.as_ref());
    serde_json::to_value(selector).expect("selector")
}

#[tokio::test]
async fn a_template_claim_is_made_allocated_by_kube_scheduler_and_goes_with_its_pod() {
    let ns = namespace("dra-template");
    let nodes = TestNodes::add(&ns.name, 2, 8, 1).await;
    let slices = DraSlices::publish(&nodes.names).await;
    let client = client().await;
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), &ns.name);
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client, &ns.name);
    let template: ResourceClaimTemplate =
        serde_json::from_value(json!({"metadata": {"name": "two-gpus"}, "spec": {"spec": claim_spec(2)}}))
            .expect("template");
    templates.create(&PostParams::default(), &template).await.expect("create the template");

    let began = Instant::now();
    let source = json!({"resourceClaimTemplateName": "two-gpus"});
    let pod =
        pods.create(&PostParams::default(), &claim_pod("worker", source, &nodes, true)).await.expect("create pod");
    // The claim controller makes the claim of a pod that is still gated, and names it in the
    // pod's status.
    let claim_name = wait_for("the claim of the gated pod", LONG, || async {
        let pod = pods.get_opt("worker").await.ok().flatten()?;
        let statuses = pod.status?.resource_claim_statuses?;
        statuses.into_iter().find(|s| s.name == "gpus")?.resource_claim_name
    })
    .await;
    let made = began.elapsed();
    let claim = claims.get(&claim_name).await.expect("the generated claim");
    let owner = claim.owner_references().first().cloned().expect("an owner");
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("Pod", pod.uid().unwrap().as_str(), Some(true))
    );
    assert_eq!(claim.annotations().get("resource.kubernetes.io/pod-claim-name").map(String::as_str), Some("gpus"));
    assert!(allocated(&claim).is_empty(), "not allocated while the pod is gated");
    assert!(node_of(&pods.get("worker").await.unwrap()).is_none());

    ungate(&pods, "worker").await;
    let ungated = Instant::now();
    let pod = bound(&pods, "worker").await;
    let bound_after = ungated.elapsed();
    let node = node_of(&pod).unwrap().to_string();
    let claim = claims.get(&claim_name).await.expect("the claim");
    let devices = allocated(&claim);
    assert_eq!(devices.len(), 2, "{devices:?}");
    let on_node = slices.devices(&node);
    for (pool, device) in &devices {
        assert_eq!(pool, &node, "the pool is the node's");
        assert!(on_node.contains(device), "{device} is a device of {node}'s slice {on_node:?}");
    }
    assert_ne!(devices[0].1, devices[1].1);
    assert_eq!(
        node_selector_names(&claim),
        json!({"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]})
    );
    assert_eq!(reserved_for(&claim), [("pods".to_string(), pod.uid().unwrap())]);
    assert!(
        claim.finalizers().iter().any(|f| f == DELETE_PROTECTION),
        "kube-scheduler's finalizer: {:?}",
        claim.finalizers()
    );

    // A pod wanting all 8 GPUs of that node waits until the first pod's claim is gone.
    let mut all = claim_pod("all-eight", json!({"resourceClaimTemplateName": "eight-gpus"}), &nodes, false);
    all.spec
        .as_mut()
        .unwrap()
        .node_selector
        .get_or_insert_default()
        .insert("kubernetes.io/hostname".into(), node.clone());
    let eight: ResourceClaimTemplate =
        serde_json::from_value(json!({"metadata": {"name": "eight-gpus"}, "spec": {"spec": claim_spec(8)}}))
            .expect("template");
    templates.create(&PostParams::default(), &eight).await.expect("create the 8-GPU template");
    pods.create(&PostParams::default(), &all).await.expect("create all-eight");
    wait_for("all-eight unschedulable", LONG, || async {
        let p = pods.get_opt("all-eight").await.ok().flatten()?;
        let conditions = p.status?.conditions?;
        conditions
            .iter()
            .any(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable"))
            .then_some(())
    })
    .await;
    assert!(node_of(&pods.get("all-eight").await.unwrap()).is_none(), "6 devices free, 8 wanted");

    let deleted = Instant::now();
    pods.delete("worker", &DeleteParams::default()).await.expect("delete worker");
    wait_for("the generated claim gone", LONG, || async {
        matches!(claims.get_opt(&claim_name).await, Ok(None)).then_some(())
    })
    .await;
    let gone_after = deleted.elapsed();
    let all = bound(&pods, "all-eight").await;
    let freed_after = deleted.elapsed();
    assert_eq!(node_of(&all), Some(node.as_str()));
    assert_eq!(slices.remove().await.len(), 2, "both slices removed");
    eprintln!(
        "dra template: claim {claim_name} made {:.2}s after the gated pod; bound to {node} {:.2}s after the gate \
         went, devices {devices:?}; claim gone {:.2}s after the pod was deleted; all 8 devices allocated and \
         all-eight bound {:.2}s after",
        made.as_secs_f64(),
        bound_after.as_secs_f64(),
        gone_after.as_secs_f64(),
        freed_after.as_secs_f64()
    );
}

#[tokio::test]
async fn a_claim_allocated_by_hand_is_honoured_and_released_by_the_claim_controller() {
    let ns = namespace("dra-hand");
    let nodes = TestNodes::add(&ns.name, 2, 8, 1).await;
    let slices = DraSlices::publish(&nodes.names).await;
    let target = nodes.names[1].clone();
    let picked: Vec<String> = slices.devices(&target).into_iter().filter(|d| d == "gpu-3" || d == "gpu-5").collect();
    assert_eq!(picked, ["gpu-3", "gpu-5"]);
    let client = client().await;
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client, &ns.name);
    let claim: ResourceClaim =
        serde_json::from_value(json!({"metadata": {"name": "hand"}, "spec": claim_spec(2)})).expect("claim");
    claims.create(&PostParams::default(), &claim).await.expect("create the claim");
    let pod = pods
        .create(&PostParams::default(), &claim_pod("worker", json!({"resourceClaimName": "hand"}), &nodes, true))
        .await
        .expect("create the pod");

    // As kube-scheduler does: the finalizer first, then allocation and reservedFor in one write.
    let finalizer: json_patch::Patch =
        serde_json::from_value(json!([{"op": "add", "path": "/metadata/finalizers", "value": [DELETE_PROTECTION]}]))
            .expect("patch");
    claims.patch("hand", &PatchParams::default(), &Patch::<()>::Json(finalizer)).await.expect("add the finalizer");
    let mut claim = claims.get("hand").await.expect("claim");
    let allocation = json!({
        "devices": {"results": picked.iter().map(|d| json!({
            "request": "gpus", "driver": DRIVER, "pool": target, "device": d,
        })).collect::<Vec<_>>()},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [target]},
        ]}]},
    });
    claim.status = Some(
        serde_json::from_value(json!({
            "allocation": allocation,
            "reservedFor": [{"resource": "pods", "name": "worker", "uid": pod.uid().unwrap()}],
        }))
        .expect("status"),
    );
    let written = claims.replace_status("hand", &PostParams::default(), &claim).await.expect("one status update");
    let written_allocation = serde_json::to_value(&written.status.as_ref().unwrap().allocation).unwrap();

    ungate(&pods, "worker").await;
    let ungated = Instant::now();
    let pod = bound(&pods, "worker").await;
    let bound_after = ungated.elapsed();
    assert_eq!(node_of(&pod), Some(target.as_str()), "bound where the allocation says");
    let claim = claims.get("hand").await.expect("claim");
    assert_eq!(serde_json::to_value(&claim.status.as_ref().unwrap().allocation).unwrap(), written_allocation);
    assert_eq!(allocated(&claim), picked.iter().map(|d| (target.clone(), d.clone())).collect::<Vec<_>>());
    assert_eq!(reserved_for(&claim), [("pods".to_string(), pod.uid().unwrap())]);
    assert_eq!(claim.finalizers(), [DELETE_PROTECTION]);
    let untouched = claim.resource_version() == written.resource_version();

    let deleted = Instant::now();
    pods.delete("worker", &DeleteParams::default()).await.expect("delete the pod");
    let released = wait_for("the claim released", LONG, || async {
        let c = claims.get_opt("hand").await.ok().flatten()?;
        let status = c.status.clone().unwrap_or_default();
        (status.allocation.is_none()
            && status.reserved_for.unwrap_or_default().is_empty()
            && !c.finalizers().iter().any(|f| f == DELETE_PROTECTION))
        .then_some(c)
    })
    .await;
    let released_after = deleted.elapsed();
    assert!(released.metadata.deletion_timestamp.is_none(), "the claim itself stays");
    eprintln!(
        "dra by hand: bound to {target} {:.2}s after the gate went, allocation unchanged (claim object {}); pod \
         deleted -> reservedFor empty, allocation cleared, finalizer gone {:.2}s later; the claim stays \
         (finalizers now {:?})",
        bound_after.as_secs_f64(),
        if untouched { "not written again" } else { "written again by someone" },
        released_after.as_secs_f64(),
        released.finalizers()
    );
}

//! Table and property tests for placing pods with DRA (`resource.k8s.io/v1`) GPU claims: a
//! pod's own claim from a ResourceClaimTemplate gets GPU indices on DRA nodes only, among the
//! devices its class and selectors allow and nobody holds; named claims keep the gang where
//! their devices reach. Pods are written as Kubernetes pods, so `PodShape::from_pod` and
//! `pod_claims` are exercised too.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::SystemTime;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate, ResourceSlice};
use proptest::prelude::*;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::*;
use crate::devices::chooser::{NodeGpus, TopologyChooser, node_gpus};
use crate::devices::dra::fixtures::each_shape::{on_each_shape, set_shape, shape};
use crate::devices::dra::fixtures::{Shape, nvidia_device_class, nvidia_slice_shaped};
use crate::devices::dra::{DeviceId, Inventory, NVIDIA_GPU_DRIVER};
use crate::devices::{GpuSet, HealthThresholds, MetricsCache, SelectOptions, set_cost};
use crate::scheduler::Labels;
use crate::scheduler::dra::Dra;
use crate::scheduler::explain::{Explanation, ExplanationKind, FilterReason, ReasonCount};
use crate::scheduler::gpu::LowestFreeIndices;
use crate::scheduler::resources::{CPU, MEMORY, PODS, Resources};
use crate::scheduler::snapshot::{NodeInfo, Snapshot};
use crate::scheduler::tree::{GroupTree, LeafGroup, LeafPolicy};
use muster_api::{ADMISSION_GATE, GPU_RESOURCE, GPU_TOPOLOGY_ANNOTATION, POD_GROUP_LABEL};

const GIB: i64 = 1 << 30;

fn from<T: DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap_or_else(|e| panic!("test object does not parse: {e}"))
}

/// A node without `nvidia.com/gpu`: its GPUs, if any, come from its ResourceSlice.
fn dra_node(name: &str) -> NodeInfo {
    NodeInfo::new(name, Resources::new().with(CPU, 64_000).with(MEMORY, 512 * GIB).with(PODS, 110))
}

/// A node with `gpus` count-based GPUs and no slice.
fn count_node(name: &str, gpus: i64) -> NodeInfo {
    NodeInfo::new(
        name,
        Resources::new().with(CPU, 64_000).with(MEMORY, 512 * GIB).with(PODS, 110).with(GPU_RESOURCE, gpus),
    )
}

/// The NVIDIA driver's slice for `node` in the running test's shape: GPUs `gpu-0..gpu-<gpus>`.
fn slice(node: &str, gpus: usize) -> ResourceSlice {
    let uuids: Vec<String> = (0..gpus).map(|i| format!("GPU-{node}-{i}")).collect();
    let devices: Vec<(usize, &str)> = uuids.iter().enumerate().map(|(i, u)| (i, u.as_str())).collect();
    nvidia_slice_shaped(node, &devices, 1, shape())
}

fn request(count: Option<i64>, mode: Option<&str>, selectors: &[&str]) -> Value {
    let selectors: Vec<Value> = selectors.iter().map(|e| json!({"cel": {"expression": e}})).collect();
    let mut exactly = json!({"deviceClassName": NVIDIA_GPU_DRIVER, "selectors": selectors});
    if let Some(c) = count {
        exactly["count"] = json!(c);
    }
    if let Some(m) = mode {
        exactly["allocationMode"] = json!(m);
    }
    json!({"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}})
}

/// A ResourceClaimTemplate in `ns` for `count` GPUs of the NVIDIA class.
fn template(name: &str, count: i64, selectors: &[&str]) -> ResourceClaimTemplate {
    from(json!({"metadata": {"namespace": "ns", "name": name},
                "spec": {"spec": request(Some(count), None, selectors)}}))
}

/// A claim of `ns` allocated `gpu-<i>` on `node`, reachable from that node only (as
/// kube-scheduler's allocator writes a node-local allocation).
fn allocated(name: &str, node: &str, indices: &[usize]) -> ResourceClaim {
    let results: Vec<Value> = indices
        .iter()
        .map(|i| json!({"request": "gpu", "driver": NVIDIA_GPU_DRIVER, "pool": node, "device": format!("gpu-{i}")}))
        .collect();
    let count = i64::try_from(indices.len()).unwrap_or(1).max(1);
    from(json!({
        "metadata": {"namespace": "ns", "name": name},
        "spec": request(Some(count), None, &[]),
        "status": {"allocation": {
            "devices": {"results": results},
            "nodeSelector": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}
        }}
    }))
}

/// A claim of `ns` for `count` GPUs, not allocated yet.
fn unallocated(name: &str, count: i64) -> ResourceClaim {
    from(json!({"metadata": {"namespace": "ns", "name": name}, "spec": request(Some(count), None, &[])}))
}

/// A gated pod of group `g` with 1 core, `extra` requests and these pod-level resourceClaims.
fn pod_with(name: &str, extra: Value, claims: Value) -> Pod {
    let mut requests = json!({"cpu": "1"});
    for (k, v) in extra.as_object().into_iter().flatten() {
        requests[k] = v.clone();
    }
    from(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                     "labels": {POD_GROUP_LABEL: "g"}},
        "spec": {
            "schedulingGates": [{"name": ADMISSION_GATE}],
            "containers": [{"name": "c", "resources": {"requests": requests}}],
            "resourceClaims": claims
        }
    }))
}

/// A gated pod whose own GPU claim comes from `template`.
fn dra_pod(name: &str, template: &str) -> Pod {
    pod_with(name, json!({}), json!([{"name": "gpu", "resourceClaimTemplateName": template}]))
}

/// A gated pod asking for `gpus` count-based GPUs.
fn count_pod(name: &str, gpus: u32) -> Pod {
    pod_with(name, json!({GPU_RESOURCE: gpus.to_string()}), json!([]))
}

fn gang(min_count: u32, pods: &[Pod]) -> GroupTree {
    let mut leaf = LeafGroup::new("g", LeafPolicy::Gang { min_count });
    for p in pods {
        assert!(leaf.add_pod(p), "pod counts");
    }
    GroupTree::new("ns", leaf)
}

fn pods(n: usize, make: impl Fn(&str) -> Pod) -> Vec<Pod> {
    (0..n).map(|i| make(&format!("p{i}"))).collect()
}

/// A snapshot of `nodes` with the DRA state of these objects (class `gpu.nvidia.com`).
fn snapshot(
    nodes: Vec<NodeInfo>,
    slices: &[ResourceSlice],
    templates: &[ResourceClaimTemplate],
    claims: &[ResourceClaim],
) -> Snapshot {
    let mut s = Snapshot::new(nodes);
    let inventory = Inventory::new(slices, &[nvidia_device_class()], claims, NVIDIA_GPU_DRIVER, &HashMap::new());
    s.set_dra(Dra::new(inventory, templates, claims));
    s
}

fn run(s: &Snapshot, tree: &GroupTree) -> Decision {
    place(s, tree, &PlaceOptions::default(), &LowestFreeIndices)
}

/// What the inventory offers a pod's own claim from `template` on `node`.
fn offered(s: &Snapshot, template: &str, node: &str) -> GpuSet {
    let dra = s.dra();
    let inventory = dra.inventory().expect("inventory");
    let spec = dra.template("ns", template).expect("template");
    let req = inventory.request_of(spec).unwrap_or_else(|e| panic!("{e}"));
    inventory.offered_gpus(&req, node)
}

/// Every pod got `want(pod)` GPUs out of what its template is offered on its node, and no
/// index went to two pods of a node.
fn assert_gpus_offered_and_disjoint(s: &Snapshot, d: &Decision, template_of: impl Fn(&str) -> (String, usize)) {
    let mut given: BTreeMap<&str, GpuSet> = BTreeMap::new();
    for p in &d.plan {
        let (template, want) = template_of(&p.pod);
        assert_eq!(p.gpus.len(), want, "{}: {} GPUs", p.pod, p.gpus);
        let offer = offered(s, &template, &p.node);
        assert!(p.gpus.is_subset(offer), "{} on {}: {} not within offered {offer}", p.pod, p.node, p.gpus);
        let on_node = given.entry(p.node.as_str()).or_default();
        assert!(on_node.is_disjoint(p.gpus), "{} on {}: {} given twice", p.pod, p.node, p.gpus);
        *on_node = on_node.union(p.gpus);
    }
}

fn reasons(d: &Decision) -> Vec<ReasonCount> {
    match &d.explanation {
        Some(Explanation { kind: ExplanationKind::Pods(p), .. }) => p.reasons.clone(),
        other => panic!("expected a pods explanation, got {other:?}"),
    }
}

fn nodes_of(d: &Decision) -> BTreeSet<&str> {
    d.plan.iter().map(|p| p.node.as_str()).collect()
}

fn set(indices: &[usize]) -> GpuSet {
    GpuSet::from_indices(indices.iter().copied()).unwrap_or_default()
}

// === a pod's own GPU claim ===

#[test]
fn a_dra_gang_goes_to_dra_nodes_only_and_gets_free_offered_gpus() {
    on_each_shape(|| {
        // "a-count" sorts first, is empty and has 8 count-based GPUs: a DRA pod must not use it.
        let nodes = vec![count_node("a-count", 8), dra_node("d1"), dra_node("d2")];
        let slices = [slice("d1", 8), slice("d2", 8)];
        let templates = [template("gpu4", 4, &[])];
        let claims = [allocated("held", "d1", &[0, 1, 2])];
        let s = snapshot(nodes, &slices, &templates, &claims);
        assert_eq!(offered(&s, "gpu4", "d1"), set(&[3, 4, 5, 6, 7]), "allocated devices are not offered");
        assert_eq!(offered(&s, "gpu4", "a-count"), GpuSet::EMPTY);

        let d = run(&s, &gang(3, &pods(3, |n| dra_pod(n, "gpu4"))));
        assert!(d.admitted, "{}", d.message());
        assert_eq!(d.plan.len(), 3);
        assert!(!nodes_of(&d).contains("a-count"), "a node without slices is never used: {:?}", d.plan);
        assert_gpus_offered_and_disjoint(&s, &d, |_| ("gpu4".into(), 4));
        for p in d.plan.iter().filter(|p| p.node == "d1") {
            assert!(p.gpus.is_disjoint(set(&[0, 1, 2])), "an index held by another claim was chosen: {}", p.gpus);
        }
        assert!(d.shared_claims.is_empty());

        // Room for 3 pods of 4 on the DRA nodes (1 on d1, 2 on d2): a fourth does not fit, and the
        // count-based node says why.
        let d = run(&s, &gang(4, &pods(4, |n| dra_pod(n, "gpu4"))));
        assert!(!d.admitted);
        assert!(d.plan.is_empty());
        assert!(reasons(&d).contains(&ReasonCount { reason: FilterReason::ClaimDevices, nodes: 1 }), "{}", d.message());
        assert!(d.message().contains("1 node(s) had no free devices matching the pod's GPU claim"), "{}", d.message());
    });
}

#[test]
fn allocated_indices_are_never_chosen_even_without_the_ledger() {
    on_each_shape(|| {
        // The shell also unions allocated GPUs into the node's used GPUs; placement must not need
        // that: the inventory's offer leaves them out.
        let s = snapshot(
            vec![dra_node("d1")],
            &[slice("d1", 8)],
            &[template("gpu1", 1, &[])],
            &[allocated("a", "d1", &[0, 2, 4]), allocated("b", "d1", &[6])],
        );
        let d = run(&s, &gang(4, &pods(4, |n| dra_pod(n, "gpu1"))));
        assert!(d.admitted, "{}", d.message());
        let all = d.plan.iter().fold(GpuSet::EMPTY, |a, p| a.union(p.gpus));
        assert_eq!(all, set(&[1, 3, 5, 7]));
        assert_gpus_offered_and_disjoint(&s, &d, |_| ("gpu1".into(), 1));
        let d = run(&s, &gang(5, &pods(5, |n| dra_pod(n, "gpu1"))));
        assert!(!d.admitted, "only 4 free devices");
    });
}

#[test]
fn a_request_selector_restricting_devices_is_honoured() {
    on_each_shape(|| {
        // GPUs 0 and 1, by the attribute each shape publishes.
        let low = match shape() {
            Shape::Legacy => "device.attributes['gpu.nvidia.com'].index < 2",
            Shape::Current => "device.attributes['resource.kubernetes.io'].pcieRoot in ['pci0000:00', 'pci0000:01']",
        };
        let s = snapshot(
            vec![dra_node("d1"), dra_node("d2")],
            &[slice("d1", 8), slice("d2", 8)],
            &[template("low", 1, &[low])],
            &[allocated("held", "d1", &[0])],
        );
        assert_eq!(offered(&s, "low", "d1"), set(&[1]));
        assert_eq!(offered(&s, "low", "d2"), set(&[0, 1]));
        let d = run(&s, &gang(3, &pods(3, |n| dra_pod(n, "low"))));
        assert!(d.admitted, "{}", d.message());
        assert_gpus_offered_and_disjoint(&s, &d, |_| ("low".into(), 1));
        assert!(d.plan.iter().all(|p| p.gpus.is_subset(set(&[0, 1]))), "{:?}", d.plan);
        // Six GPUs are free in all, but only three match the selector.
        let d = run(&s, &gang(4, &pods(4, |n| dra_pod(n, "low"))));
        assert!(!d.admitted);
        assert!(reasons(&d).iter().all(|r| r.reason == FilterReason::ClaimDevices), "{}", d.message());
    });
}

#[test]
fn a_count_based_pod_never_goes_to_a_dra_only_node() {
    on_each_shape(|| {
        let s = snapshot(vec![dra_node("d1")], &[slice("d1", 8)], &[], &[]);
        let d = run(&s, &gang(1, &[count_pod("p0", 1)]));
        assert!(!d.admitted);
        assert_eq!(d.message(), "0/1 nodes fit 1 pod of group \"g\": 1 Insufficient nvidia.com/gpu");

        // Next to a count-based node, count-based pods fill it and nothing else.
        let s = snapshot(vec![count_node("c1", 8), dra_node("d1")], &[slice("d1", 8)], &[], &[]);
        let d = run(&s, &gang(8, &pods(8, |n| count_pod(n, 1))));
        assert!(d.admitted, "{}", d.message());
        assert_eq!(nodes_of(&d), BTreeSet::from(["c1"]));
        let d = run(&s, &gang(9, &pods(9, |n| count_pod(n, 1))));
        assert!(!d.admitted);
        assert!(
            reasons(&d).contains(&ReasonCount { reason: FilterReason::Insufficient(GPU_RESOURCE.into()), nodes: 1 })
        );
    });
}

#[test]
fn mixed_dra_pods_place_the_largest_gpu_claim_first() {
    on_each_shape(|| {
        // a: 4 free GPUs, b: 1 free. A 1-GPU pod placed first takes a GPU of a and leaves the
        // 4-GPU pod nowhere to go; largest first (as for count-based pods) places both.
        let s = snapshot(
            vec![dra_node("a"), dra_node("b")],
            &[slice("a", 8), slice("b", 8)],
            &[template("gpu1", 1, &[]), template("gpu4", 4, &[])],
            &[allocated("held-a", "a", &[0, 1, 2, 3]), allocated("held-b", "b", &[0, 1, 2, 3, 4, 5, 6])],
        );
        let d = run(&s, &gang(2, &[dra_pod("p0", "gpu1"), dra_pod("p1", "gpu4")]));
        assert!(d.admitted, "{}", d.message());
        let on: BTreeMap<&str, &str> = d.plan.iter().map(|p| (p.pod.as_str(), p.node.as_str())).collect();
        assert_eq!(on, BTreeMap::from([("p0", "b"), ("p1", "a")]));
        assert_gpus_offered_and_disjoint(&s, &d, |p| if p == "p0" { ("gpu1".into(), 1) } else { ("gpu4".into(), 4) });
    });
}

// === claims placement refuses, with the reason ===

#[test]
fn claims_muster_cannot_allocate_keep_the_pod_off_every_node_with_the_reason() {
    on_each_shape(|| {
        let all: ResourceClaimTemplate = from(json!({"metadata": {"namespace": "ns", "name": "all"},
                                                  "spec": {"spec": request(None, Some("All"), &[])}}));
        let templates = [template("gpu4", 4, &[]), all];
        let s = snapshot(vec![dra_node("d1"), dra_node("d2")], &[slice("d1", 8), slice("d2", 8)], &templates, &[]);
        let two = json!([{"name": "gpu", "resourceClaimTemplateName": "gpu4"},
                     {"name": "gpu2", "resourceClaimTemplateName": "gpu4"}]);
        let cases: Vec<(&str, Pod, String)> = vec![
        (
            "missing template",
            dra_pod("p0", "x"),
            "ResourceClaimTemplate ns/x named by resourceClaims[0] (\"gpu\") does not exist".into(),
        ),
        (
            "allocationMode All",
            dra_pod("p0", "all"),
            "ResourceClaimTemplate ns/all named by resourceClaims[0] (\"gpu\"): \
             spec.devices.requests[0].exactly.allocationMode: allocationMode \"All\" is not supported (only ExactCount)"
                .into(),
        ),
        (
            "second GPU claim of its own",
            pod_with("p0", json!({}), two),
            "resourceClaims[1] (\"gpu2\"): the pod has a second GPU claim of its own; muster allocates one per pod \
             (put several requests in one template)"
                .into(),
        ),
    ];
        for (rule, pod, why) in cases {
            let d = run(&s, &gang(1, &[pod]));
            assert!(!d.admitted, "{rule}");
            assert!(d.plan.is_empty(), "{rule}");
            assert_eq!(reasons(&d), vec![ReasonCount { reason: FilterReason::Claim(why.clone()), nodes: 2 }], "{rule}");
            assert_eq!(d.message(), format!("0/2 nodes fit 1 pod of group \"g\": 2 {why}"), "{rule}");
        }
    });
}

// === named (shared) claims ===

fn with_shared(template: &str) -> impl Fn(&str) -> Pod {
    let claims = json!([{"name": "gpu", "resourceClaimTemplateName": template},
                        {"name": "shared", "resourceClaimName": "shared"}]);
    move |name| pod_with(name, json!({}), claims.clone())
}

#[test]
fn an_allocated_named_claim_keeps_the_gang_where_it_reaches() {
    on_each_shape(|| {
        // The claim is allocated gpu-7 on d2; without it the pods would go to d1 (name order).
        let s = snapshot(
            vec![dra_node("d1"), dra_node("d2")],
            &[slice("d1", 8), slice("d2", 8)],
            &[template("gpu2", 2, &[])],
            &[allocated("shared", "d2", &[7])],
        );
        let d = run(&s, &gang(3, &pods(3, with_shared("gpu2"))));
        assert!(d.admitted, "{}", d.message());
        assert_eq!(nodes_of(&d), BTreeSet::from(["d2"]));
        assert_gpus_offered_and_disjoint(&s, &d, |_| ("gpu2".into(), 2));
        assert!(d.plan.iter().all(|p| !p.gpus.contains(7)), "the shared claim's device is not given again");
        assert!(d.shared_claims.is_empty(), "already allocated: nothing to write");

        // d2 has room for 3 pods of 2; d1 cannot reach the claim.
        let d = run(&s, &gang(4, &pods(4, with_shared("gpu2"))));
        assert!(!d.admitted);
        assert!(reasons(&d).contains(&ReasonCount { reason: FilterReason::ClaimReach, nodes: 1 }), "{}", d.message());
        assert!(
            d.message().contains("1 node(s) cannot reach the devices of a shared ResourceClaim"),
            "{}",
            d.message()
        );
    });
}

#[test]
fn an_unallocated_named_claim_gets_devices_once_that_no_pod_claim_gets() {
    on_each_shape(|| {
        let s = snapshot(
            vec![dra_node("d1"), dra_node("d2")],
            &[slice("d1", 8), slice("d2", 8)],
            &[template("gpu3", 3, &[])],
            &[unallocated("shared", 1)],
        );
        let d = run(&s, &gang(2, &pods(2, with_shared("gpu3"))));
        assert!(d.admitted, "{}", d.message());
        assert_eq!(d.shared_claims.len(), 1, "one choice for the whole gang");
        let shared = &d.shared_claims[0];
        assert_eq!((shared.claim.namespace.as_str(), shared.claim.name.as_str()), ("ns", "shared"));
        assert!(shared.allocate);
        let gpu0 = DeviceId { driver: NVIDIA_GPU_DRIVER.into(), pool: "d1".into(), device: "gpu-0".into() };
        assert_eq!(shared.devices, vec![gpu0]);
        assert!(shared.reach.reaches("d1", &Labels::default()) && !shared.reach.reaches("d2", &Labels::default()));
        assert_eq!(nodes_of(&d), BTreeSet::from(["d1"]), "every pod where the shared device reaches");
        assert!(d.plan.iter().all(|p| !p.gpus.contains(0)), "the shared claim's device went to a pod: {:?}", d.plan);
        let given = d.plan.iter().fold(GpuSet::EMPTY, |a, p| a.union(p.gpus));
        assert_eq!(given.len(), 6, "two pods of 3, disjoint: {given}");

        // Seven GPUs of d1 are left for the pods' own claims: two pods of 3 fit, three do not.
        let d = run(&s, &gang(3, &pods(3, with_shared("gpu3"))));
        assert!(!d.admitted);
        assert!(reasons(&d).contains(&ReasonCount { reason: FilterReason::ClaimReach, nodes: 1 }), "{}", d.message());
    });
}

/// A claim of `ns` allocated `gpu-0` of `node`, usable from every node (no node selector),
/// reserved for `reserved` pods already.
fn allocated_everywhere(name: &str, node: &str, reserved: usize) -> ResourceClaim {
    let reserved: Vec<Value> = (0..reserved)
        .map(|i| json!({"resource": "pods", "name": format!("old-{i}"), "uid": format!("old-{i}")}))
        .collect();
    from(json!({
        "metadata": {"namespace": "ns", "name": name},
        "spec": request(Some(1), None, &[]),
        "status": {
            "allocation": {"devices": {"results": [
                {"request": "gpu", "driver": NVIDIA_GPU_DRIVER, "pool": node, "device": "gpu-0"}]}},
            "reservedFor": reserved
        }
    }))
}

/// A gated pod that uses the named claim `shared` only.
fn shared_only(name: &str) -> Pod {
    pod_with(name, json!({}), json!([{"name": "shared", "resourceClaimName": "shared"}]))
}

#[test]
fn a_named_claim_serves_at_most_256_pods_of_a_gang_and_those_reserved_already() {
    on_each_shape(|| {
        // Five nodes of 64 cores: room for 320 pods of 1 core; only the claim's reservedFor
        // limit binds.
        let names = ["d1", "d2", "d3", "d4", "d5"];
        let nodes = || names.iter().map(|n| dra_node(n)).collect::<Vec<_>>();
        let slices: Vec<ResourceSlice> = names.iter().map(|n| slice(n, 8)).collect();
        // (rule, pods of the gang, reserved already, admitted).
        let table: &[(&str, usize, usize, bool)] = &[
            ("256 new pods fit", 256, 0, true),
            ("255 new + 1 reserved fit", 255, 1, true),
            ("256 new + 1 reserved do not", 256, 1, false),
            ("257 new pods do not", 257, 0, false),
            ("a 300-pod gang does not", 300, 0, false),
        ];
        for (rule, n, reserved, admitted) in table {
            let s = snapshot(nodes(), &slices, &[], &[allocated_everywhere("shared", "d1", *reserved)]);
            let d = run(&s, &gang(u32::try_from(*n).unwrap_or(u32::MAX), &pods(*n, shared_only)));
            assert_eq!(d.admitted, *admitted, "{}: {rule}: {}", shape(), d.message());
            if *admitted {
                assert_eq!(d.plan.len(), *n, "{}: {rule}", shape());
                continue;
            }
            assert!(d.plan.is_empty(), "{}: {rule}", shape());
            let over = reasons(&d).into_iter().find_map(|r| match r.reason {
                FilterReason::Claim(why) => Some((why, r.nodes)),
                _ => None,
            });
            let (why, nodes) = over.unwrap_or_else(|| panic!("{}: {rule}: no claim reason: {}", shape(), d.message()));
            assert_eq!(nodes, 5, "{}: {rule}: kept off every node", shape());
            let serve = format!("would serve {} pods ({n} of this gang, {reserved} reserved already)", n + reserved);
            assert!(why.contains("ResourceClaim ns/shared") && why.contains(&serve), "{}: {rule}: {why}", shape());
            assert!(why.contains("256") && why.contains("upstream mode"), "{}: {rule}: {why}", shape());
        }
    });
}

// === property: DRA placement is count-based placement on the offered GPUs ===

/// Per node: GPUs (1..=8), allocated mask seed, topology pick (fixtures for 8-GPU nodes).
type NodeCase = (usize, u64, usize);

fn arb_case() -> impl Strategy<Value = (Vec<NodeCase>, Vec<u32>, u32, bool)> {
    (
        prop::collection::vec((1usize..=8, any::<u64>(), 0usize..4), 1..=6),
        prop::collection::vec(1u32..=4, 1..=6),
        any::<u32>(),
        any::<bool>(),
    )
}

/// The node objects the GPU chooser reads (count-based allocatable, topology annotation).
fn chooser_nodes(cases: &[NodeCase]) -> HashMap<String, NodeGpus> {
    let topologies = crate::devices::fixtures::all();
    let nodes: Vec<Node> = cases
        .iter()
        .enumerate()
        .map(|(i, (gpus, _, topology))| {
            let mut node: Node = from(json!({"metadata": {"name": format!("n{i}")},
                                             "status": {"allocatable": {GPU_RESOURCE: gpus.to_string()}}}));
            if *gpus == 8
                && let Some(t) = topologies.get(*topology)
            {
                node.metadata.annotations =
                    Some([(GPU_TOPOLOGY_ANNOTATION.to_string(), t.to_annotation().to_json())].into());
            }
            node
        })
        .collect();
    node_gpus(&nodes, &MetricsCache::default(), &HealthThresholds::default(), SystemTime::now())
}

fn total_cost(d: &Decision, gpus: &HashMap<String, NodeGpus>) -> u64 {
    d.plan.iter().map(|p| gpus.get(&p.node).map_or(0, |g| set_cost(&g.topology, p.gpus))).sum()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn dra_placement_matches_count_based_placement_on_the_offered_gpus(
        (cases, pod_gpus, min_seed, topology) in arb_case()
    ) {
        for shape in Shape::ALL {
        set_shape(shape);
        let used: Vec<GpuSet> =
            cases.iter().map(|(g, seed, _)| GpuSet::from_bits(*seed).intersection(GpuSet::first(*g))).collect();
        let names: Vec<String> = (0..cases.len()).map(|i| format!("n{i}")).collect();

        // DRA: no nvidia.com/gpu; a slice per node; the used GPUs held by an allocated claim.
        let slices: Vec<ResourceSlice> = cases.iter().zip(&names).map(|((g, _, _), n)| slice(n, *g)).collect();
        let claims: Vec<ResourceClaim> = used
            .iter()
            .zip(&names)
            .filter(|(u, _)| !u.is_empty())
            .map(|(u, n)| allocated(&format!("held-{n}"), n, &u.iter().collect::<Vec<_>>()))
            .collect();
        let templates: Vec<ResourceClaimTemplate> = (1..=4).map(|k| template(&format!("gpu{k}"), k, &[])).collect();
        let dra = snapshot(names.iter().map(|n| dra_node(n)).collect(), &slices, &templates, &claims);

        // Count-based: the same GPUs as nvidia.com/gpu, the same indices used.
        let count = Snapshot::new(
            cases
                .iter()
                .zip(&names)
                .zip(&used)
                .map(|(((g, _, _), n), u)| {
                    count_node(n, *g as i64)
                        .with_requested(Resources::new().with(GPU_RESOURCE, u.len() as i64))
                        .with_gpu_used(*u)
                })
                .collect(),
        );

        let min_count = 1 + min_seed % u32::try_from(pod_gpus.len()).unwrap_or(1);
        let dra_pods: Vec<Pod> =
            pod_gpus.iter().enumerate().map(|(j, k)| dra_pod(&format!("p{j}"), &format!("gpu{k}"))).collect();
        let count_pods: Vec<Pod> = pod_gpus.iter().enumerate().map(|(j, k)| count_pod(&format!("p{j}"), *k)).collect();
        // The default ranking: GPUs of a DRA claim count in the utilisation as nvidia.com/gpu does.
        let options = PlaceOptions::default();
        let gpus = chooser_nodes(&cases);
        let (d, c) = if topology {
            let chooser = TopologyChooser::new(gpus.clone(), SelectOptions::default());
            (place(&dra, &gang(min_count, &dra_pods), &options, &chooser),
             place(&count, &gang(min_count, &count_pods), &options, &chooser))
        } else {
            (place(&dra, &gang(min_count, &dra_pods), &options, &LowestFreeIndices),
             place(&count, &gang(min_count, &count_pods), &options, &LowestFreeIndices))
        };

        if d.admitted {
            let mut given: BTreeMap<&str, GpuSet> = BTreeMap::new();
            for p in &d.plan {
                let j: usize = p.pod.trim_start_matches('p').parse().unwrap_or(0);
                let i: usize = p.node.trim_start_matches('n').parse().unwrap_or(0);
                prop_assert_eq!(p.gpus.len(), pod_gpus[j] as usize, "{}: {} GPUs", shape, p.pod);
                let offer = offered(&dra, &format!("gpu{}", pod_gpus[j]), &p.node);
                prop_assert!(p.gpus.is_subset(offer), "{shape}: {} on {}: {} outside offered {}", p.pod, p.node, p.gpus, offer);
                prop_assert!(p.gpus.is_disjoint(used[i]), "{shape}: {} on {}: allocated index given", p.pod, p.node);
                let on_node = given.entry(p.node.as_str()).or_default();
                prop_assert!(on_node.is_disjoint(p.gpus), "{shape}: {} on {}: {} given twice", p.pod, p.node, p.gpus);
                *on_node = on_node.union(p.gpus);
            }
        }
        prop_assert_eq!(d.admitted, c.admitted, "{}: DRA: {} / count-based: {}", shape, d.message(), c.message());
        prop_assert_eq!(total_cost(&d, &gpus), total_cost(&c, &gpus), "{}", shape);
        let plan = |d: &Decision| d.plan.iter().map(|p| (p.pod.clone(), p.node.clone(), p.gpus)).collect::<Vec<_>>();
        prop_assert_eq!(plan(&d), plan(&c), "{}", shape);
        }
    }
}

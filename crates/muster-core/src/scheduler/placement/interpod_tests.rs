//! Table tests for the rules that relate pods to other pods (InterPodAffinity,
//! PodTopologySpread, NodePorts) and for volumes, each against what kube-scheduler's plugin of
//! the same name decides. Pods are written as Kubernetes pods, so the parsing is tested too.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use serde_json::{Value, json};

use super::*;
use crate::scheduler::gpu::LowestFreeIndices;
use crate::scheduler::resources::{CPU, MEMORY, PODS, Resources};
use crate::scheduler::snapshot::{NodeInfo, Snapshot};
use crate::scheduler::tree::{GroupTree, LeafGroup, LeafPolicy};
use crate::scheduler::volumes::Volumes;
use muster_api::{ADMISSION_GATE, GPU_RESOURCE, HOSTNAME_LABEL, POD_GROUP_LABEL};

const ZONE: &str = "topology.kubernetes.io/zone";
const RACK: &str = "topology.muster.dev/rack";

/// A node with 16 cores, 64 GiB, 8 GPUs, in `zone` and `rack`.
fn node(name: &str, zone: &str, rack: &str) -> NodeInfo {
    NodeInfo::new(name, Resources::new().with(CPU, 16_000).with(MEMORY, 64 << 30).with(PODS, 110).with(GPU_RESOURCE, 8))
        .with_label(ZONE, zone)
        .with_label(RACK, rack)
}

/// `n` nodes named `n0..`, zones and racks as given per node.
fn nodes(layout: &[(&str, &str)]) -> Vec<NodeInfo> {
    layout.iter().enumerate().map(|(i, (zone, rack))| node(&format!("n{i}"), zone, rack)).collect()
}

/// A pod of group `group` (labels `app: <app>` plus the group label) with extra spec fields.
fn pod(name: &str, group: &str, app: &str, spec: Value) -> Pod {
    let mut spec = spec;
    let base = json!({
        "containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "1"}}}],
        "schedulingGates": [{"name": ADMISSION_GATE}]
    });
    for (k, v) in base.as_object().into_iter().flatten() {
        if spec.get(k).is_none() {
            spec[k] = v.clone();
        }
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                     "labels": {"app": app, POD_GROUP_LABEL: group}},
        "spec": spec
    }))
    .expect("pod")
}

/// A pod already bound to `node`.
fn running(name: &str, app: &str, node: &str, spec: Value) -> Pod {
    let mut p = pod(name, "other", app, spec);
    if let Some(s) = p.spec.as_mut() {
        s.scheduling_gates = None;
        s.node_name = Some(node.into());
    }
    if let Some(l) = p.metadata.labels.as_mut() {
        l.remove(POD_GROUP_LABEL);
    }
    p
}

fn gang(name: &str, min: u32, pods: usize, spec: Value) -> LeafGroup {
    let mut leaf = LeafGroup::new(name, LeafPolicy::Gang { min_count: min });
    for i in 0..pods {
        assert!(leaf.add_pod(&pod(&format!("{name}-{i}"), name, name, spec.clone())));
    }
    leaf
}

fn decide_on(nodes: Vec<NodeInfo>, existing: &[Pod], root: LeafGroup) -> Decision {
    let mut snapshot = Snapshot::new(nodes);
    for p in existing {
        assert!(snapshot.add_pod(p), "existing pod {:?} is on a known node", p.metadata.name);
    }
    place(&snapshot, &GroupTree::new("ns", root), &PlaceOptions::default(), &LowestFreeIndices)
}

fn anti(key: &str, app: &str) -> Value {
    json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": key, "labelSelector": {"matchLabels": {"app": app}}}]}})
}

fn affinity(key: &str, app: &str) -> Value {
    json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": key, "labelSelector": {"matchLabels": {"app": app}}}]}})
}

fn spread(key: &str, app: &str, max_skew: i32, extra: Value) -> Value {
    let mut c = json!({"maxSkew": max_skew, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule",
                       "labelSelector": {"matchLabels": {"app": app}}});
    for (k, v) in extra.as_object().into_iter().flatten() {
        c[k] = v.clone();
    }
    json!([c])
}

fn host_port(port: i32) -> Value {
    json!([{"name": "c", "ports": [{"containerPort": 80, "hostPort": port}],
            "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "1"}}}])
}

/// Where each pod went: node name per pod, in plan order.
fn nodes_of(d: &Decision) -> Vec<String> {
    d.plan.iter().map(|p| p.node.clone()).collect()
}

fn domain_of<'n>(all: &'n [NodeInfo], node: &str, key: &str) -> &'n str {
    all.iter().find(|n| n.name == node).and_then(|n| n.labels.get(key)).unwrap_or("")
}

fn reasons(d: &Decision) -> String {
    d.message()
}

#[test]
fn anti_affinity_one_pod_per_node() {
    let spec = json!({"affinity": anti(HOSTNAME_LABEL, "train")});
    let one = decide_on(nodes(&[("a", "r1")]), &[], gang("train", 2, 2, spec.clone()));
    assert!(!one.admitted, "two pods that refuse to share a node do not fit one node");
    assert!(reasons(&one).contains("didn't match pod anti-affinity rules"), "{}", reasons(&one));
    let two = decide_on(nodes(&[("a", "r1"), ("a", "r1")]), &[], gang("train", 2, 2, spec));
    assert!(two.admitted, "{}", reasons(&two));
    let mut used = nodes_of(&two);
    used.dedup();
    assert_eq!(used.len(), 2, "one pod per node");
}

#[test]
fn anti_affinity_one_pod_per_rack() {
    let layout = [("a", "r1"), ("a", "r1"), ("a", "r2"), ("a", "r2")];
    let spec = json!({"affinity": anti(RACK, "train")});
    let three = decide_on(nodes(&layout), &[], gang("train", 3, 3, spec.clone()));
    assert!(!three.admitted, "three pods, two racks");
    let two = decide_on(nodes(&layout), &[], gang("train", 2, 2, spec));
    assert!(two.admitted);
    let all = nodes(&layout);
    let racks: BTreeSet<&str> = nodes_of(&two).iter().map(|n| domain_of(&all, n, RACK)).collect();
    assert_eq!(racks.len(), 2, "one pod per rack");
}

#[test]
fn the_symmetric_rule_keeps_pods_away_from_running_pods_that_refuse_them() {
    let layout = [("a", "r1"), ("a", "r1")];
    let guard = running("guard", "db", "n0", json!({"affinity": anti(HOSTNAME_LABEL, "train")}));
    let d = decide_on(nodes(&layout), std::slice::from_ref(&guard), gang("train", 2, 2, json!({})));
    assert!(d.admitted, "{}", reasons(&d));
    assert_eq!(nodes_of(&d), vec!["n1", "n1"], "n0 runs a pod whose anti-affinity refuses train pods");
    let rack = running("guard", "db", "n0", json!({"affinity": anti(RACK, "train")}));
    let d = decide_on(nodes(&layout), &[rack], gang("train", 1, 1, json!({})));
    assert!(!d.admitted, "the guard's rack holds every node: {}", reasons(&d));
    assert!(reasons(&d).contains("didn't satisfy existing pods anti-affinity rules"), "{}", reasons(&d));
}

#[test]
fn anti_affinity_counts_running_pods() {
    let layout = [("a", "r1"), ("a", "r1"), ("a", "r1")];
    let other = running("old", "train", "n1", json!({}));
    let d =
        decide_on(nodes(&layout), &[other], gang("train", 2, 2, json!({"affinity": anti(HOSTNAME_LABEL, "train")})));
    assert!(d.admitted);
    assert!(!nodes_of(&d).contains(&"n1".to_string()), "n1 runs a train pod already: {:?}", nodes_of(&d));
}

#[test]
fn co_location_follows_the_first_pod_or_the_pods_already_there() {
    let layout = [("a", "r1"), ("a", "r1"), ("b", "r2"), ("b", "r2")];
    let all = nodes(&layout);
    let spec = json!({"affinity": affinity(ZONE, "train")});
    let d = decide_on(nodes(&layout), &[], gang("train", 4, 4, spec));
    assert!(d.admitted, "the first pod may go anywhere, the rest follow it: {}", reasons(&d));
    let zones: BTreeSet<&str> = nodes_of(&d).iter().map(|n| domain_of(&all, n, ZONE)).collect();
    assert_eq!(zones.len(), 1);
    let db = running("db", "db", "n3", json!({}));
    let near_db = decide_on(nodes(&layout), &[db], gang("train", 2, 2, json!({"affinity": affinity(ZONE, "db")})));
    assert!(near_db.admitted);
    assert!(nodes_of(&near_db).iter().all(|n| domain_of(&all, n, ZONE) == "b"), "{:?}", nodes_of(&near_db));
    let nothing = decide_on(nodes(&layout), &[], gang("train", 1, 1, json!({"affinity": affinity(ZONE, "db")})));
    assert!(!nothing.admitted, "affinity to pods that exist nowhere, which the pod is not: never");
    assert!(reasons(&nothing).contains("didn't match pod affinity rules"));
}

#[test]
fn spread_keeps_the_skew_across_zones() {
    let layout = [("a", "r1"), ("b", "r2"), ("c", "r3")];
    let all = nodes(&layout);
    let d = decide_on(
        nodes(&layout),
        &[],
        gang("train", 3, 3, json!({"topologySpreadConstraints": spread(ZONE, "train", 1, json!({}))})),
    );
    assert!(d.admitted);
    let zones: BTreeSet<&str> = nodes_of(&d).iter().map(|n| domain_of(&all, n, ZONE)).collect();
    assert_eq!(zones.len(), 3, "one pod per zone with maxSkew 1");
    // Two matching pods run in zone a and zone c has no room left (but still counts, with 0):
    // with maxSkew 1 only one more pod fits, in zone b.
    let hog = json!({"containers": [{"name": "c", "resources": {"requests": {"cpu": "16"}}}]});
    let busy = [
        running("x", "train", "n0", json!({})),
        running("y", "train", "n0", json!({})),
        running("hog", "other", "n2", hog),
    ];
    let c = json!({"topologySpreadConstraints": spread(ZONE, "train", 1, json!({}))});
    let two = decide_on(nodes(&layout), &busy, gang("train", 2, 2, c.clone()));
    assert!(!two.admitted, "{}", reasons(&two));
    assert!(reasons(&two).contains("didn't match pod topology spread constraints"), "{}", reasons(&two));
    let one = decide_on(nodes(&layout), &busy, gang("train", 1, 1, c));
    assert_eq!(nodes_of(&one), vec!["n1"]);
}

#[test]
fn min_domains_counts_missing_domains_as_empty() {
    let layout = [("a", "r1"), ("a", "r1"), ("b", "r2"), ("b", "r2")];
    let c = spread(ZONE, "train", 1, json!({"minDomains": 3}));
    let three = decide_on(nodes(&layout), &[], gang("train", 3, 3, json!({"topologySpreadConstraints": c.clone()})));
    assert!(!three.admitted, "2 of 3 domains: the global minimum is 0, so one pod per zone");
    let two = decide_on(nodes(&layout), &[], gang("train", 2, 2, json!({"topologySpreadConstraints": c})));
    assert!(two.admitted);
}

#[test]
fn a_pinned_pod_must_pass_spread_as_kube_scheduler_sees_it_after_the_pin() {
    // One node per zone, minDomains 2, maxSkew 1: unpinned, a,b,a,b fits; pinned, kube-scheduler
    // counts only the pinned node (nodeAffinityPolicy Honor), sees 1 domain < minDomains, takes
    // the minimum as 0, and refuses a second pod on a node.
    let layout = [("a", "r1"), ("b", "r2")];
    let honor = spread(ZONE, "train", 1, json!({"minDomains": 2}));
    let d = decide_on(nodes(&layout), &[], gang("train", 4, 4, json!({"topologySpreadConstraints": honor})));
    assert!(!d.admitted, "{}", reasons(&d));
    assert!(reasons(&d).contains("once pinned"), "{}", reasons(&d));
    let ignore = spread(ZONE, "train", 1, json!({"minDomains": 2, "nodeAffinityPolicy": "Ignore"}));
    let d = decide_on(nodes(&layout), &[], gang("train", 4, 4, json!({"topologySpreadConstraints": ignore})));
    assert!(d.admitted, "with Ignore the pin does not change what kube-scheduler counts: {}", reasons(&d));
    let four_nodes = [("a", "r1"), ("a", "r1"), ("b", "r2"), ("b", "r2")];
    let honor = spread(ZONE, "train", 1, json!({"minDomains": 2}));
    let d = decide_on(nodes(&four_nodes), &[], gang("train", 4, 4, json!({"topologySpreadConstraints": honor})));
    assert!(d.admitted, "two nodes per zone: one pod per node passes both views: {}", reasons(&d));
}

#[test]
fn spread_needs_the_key_on_the_node_and_honours_inclusion_policies() {
    let mut layout = nodes(&[("a", "r1"), ("b", "r2")]);
    layout.push(NodeInfo::new("bare", layout[0].allocatable.clone()));
    let c = json!({"topologySpreadConstraints": spread(ZONE, "train", 1, json!({}))});
    let d = decide_on(layout.clone(), &[], gang("train", 3, 3, c.clone()));
    assert!(d.admitted, "{}", reasons(&d));
    assert!(!nodes_of(&d).contains(&"bare".to_string()), "the unlabelled node is not a domain");
    let bare = decide_on(vec![layout[2].clone()], &[], gang("train", 1, 1, c));
    assert!(!bare.admitted);
    assert!(reasons(&bare).contains("missing required label"), "{}", reasons(&bare));
    // nodeTaintsPolicy Honor: a tainted zone is no domain, so the minimum is over a and b.
    let mut tainted = nodes(&[("a", "r1"), ("b", "r2"), ("c", "r3")]);
    tainted[2] = tainted[2].clone().with_taint(crate::scheduler::Taint::new(
        "k",
        "v",
        crate::scheduler::TaintEffect::NoSchedule,
    ));
    let honor = json!({"topologySpreadConstraints": spread(ZONE, "train", 1, json!({"nodeTaintsPolicy": "Honor"}))});
    assert!(decide_on(tainted.clone(), &[], gang("train", 4, 4, honor)).admitted, "two domains: a,b,a,b");
    let ignore = json!({"topologySpreadConstraints": spread(ZONE, "train", 1, json!({}))});
    let d = decide_on(tainted, &[], gang("train", 4, 4, ignore));
    assert!(!d.admitted, "zone c counts with 0 pods and cannot take any: at most one pod per zone a, b");
}

#[test]
fn host_ports_are_one_pod_per_node() {
    let spec = json!({"containers": host_port(8080)});
    let one = decide_on(nodes(&[("a", "r1")]), &[], gang("train", 2, 2, spec.clone()));
    assert!(!one.admitted);
    assert!(reasons(&one).contains("free ports"), "{}", reasons(&one));
    let taken = running("web", "web", "n0", json!({"containers": host_port(8080)}));
    let d = decide_on(nodes(&[("a", "r1"), ("a", "r1"), ("a", "r1")]), &[taken], gang("train", 2, 2, spec));
    assert!(d.admitted);
    let mut used = nodes_of(&d);
    used.sort();
    assert_eq!(used, vec!["n1", "n2"]);
}

#[test]
fn interchangeable_pods_keep_capacity_arithmetic() {
    let leaf = gang("train", 2, 2, json!({}));
    let (snap, tree) = (Snapshot::new(nodes(&[("a", "r1")])), GroupTree::new("ns", leaf));
    assert!(!pods::Facts::new(&snap, &tree).per_pod, "no rule about other pods: nodes filled by arithmetic");
    let ruled = gang("train", 2, 2, json!({"affinity": anti(HOSTNAME_LABEL, "train")}));
    let tree = GroupTree::new("ns", ruled);
    assert!(pods::Facts::new(&snap, &tree).per_pod);
}

fn volumes(claims: Value, pvs: Value, classes: Value) -> Volumes {
    let claims: Vec<PersistentVolumeClaim> = serde_json::from_value(claims).expect("claims");
    let pvs: Vec<PersistentVolume> = serde_json::from_value(pvs).expect("volumes");
    let classes: Vec<StorageClass> = serde_json::from_value(classes).expect("classes");
    Volumes::from_cluster(&claims, &pvs, &classes)
}

#[test]
fn claims_restrict_nodes_or_keep_the_gang_waiting() {
    let v = volumes(
        json!([
            {"metadata": {"name": "local", "namespace": "ns"}, "spec": {"volumeName": "pv-n1"}},
            {"metadata": {"name": "later", "namespace": "ns"}, "spec": {"storageClassName": "wffc"}}
        ]),
        json!([{"metadata": {"name": "pv-n1"}, "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": ["n1"]}]}]}}}}]),
        json!([{"metadata": {"name": "wffc"}, "provisioner": "x", "volumeBindingMode": "WaitForFirstConsumer"}]),
    );
    let with_claim =
        |claim: &str| json!({"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]});
    let run = |claim: &str| {
        let mut snapshot = Snapshot::new(nodes(&[("a", "r1"), ("a", "r1"), ("a", "r1")]));
        snapshot.set_volumes(v.clone());
        let tree = GroupTree::new("ns", gang("train", 1, 1, with_claim(claim)));
        place(&snapshot, &tree, &PlaceOptions::default(), &LowestFreeIndices)
    };
    assert_eq!(nodes_of(&run("local")), vec!["n1"], "the volume lives on n1");
    assert!(run("later").admitted, "WaitForFirstConsumer restricts nothing");
    let shared = |pods: usize| {
        let mut snapshot = Snapshot::new(nodes(&[("a", "r1"), ("a", "r1")]));
        snapshot.set_volumes(v.clone());
        let mut spec = with_claim("later");
        spec["containers"] = json!([{"name": "c", "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "8"}}}]);
        let tree = GroupTree::new("ns", gang("train", 2, pods, spec));
        place(&snapshot, &tree, &PlaceOptions::default(), &LowestFreeIndices)
    };
    let d = shared(2);
    assert!(!d.admitted, "pods sharing an unprovisioned claim follow the first one; one 8-GPU pod per node");
    assert!(reasons(&d).contains("volume node affinity conflict"), "{}", reasons(&d));
    let missing = run("gone");
    assert!(!missing.admitted);
    assert!(reasons(&missing).contains("persistentvolumeclaim \"gone\" not found"), "{}", reasons(&missing));
}

#[test]
fn nodes_refused_earlier_are_avoided() {
    let mut tree = GroupTree::new("ns", gang("train", 2, 2, json!({})));
    tree.avoid_nodes.insert("n0".into());
    let d =
        place(&Snapshot::new(nodes(&[("a", "r1"), ("a", "r1")])), &tree, &PlaceOptions::default(), &LowestFreeIndices);
    assert!(d.admitted);
    assert_eq!(nodes_of(&d), vec!["n1", "n1"]);
    tree.avoid_nodes.insert("n1".into());
    let d =
        place(&Snapshot::new(nodes(&[("a", "r1"), ("a", "r1")])), &tree, &PlaceOptions::default(), &LowestFreeIndices);
    assert!(!d.admitted);
    assert!(reasons(&d).contains("refused this gang's pods in an earlier attempt"), "{}", reasons(&d));
}

#[test]
fn a_gang_that_fits_only_one_way_is_found_by_search() {
    // Zone a: n0, busy, with room for one more pod (BinPack's first choice); zone b: n1, n2.
    // Co-located pods that start on n0 cannot all follow it; starting in zone b they fit.
    let layout = [("a", "r1"), ("b", "r2"), ("b", "r2")];
    let all = nodes(&layout);
    let load = running(
        "load",
        "other",
        "n0",
        json!({"containers": [{"name": "c", "resources": {"requests": {"cpu": "11"}}}]}),
    );
    let spec = json!({"affinity": affinity(ZONE, "train"),
                      "containers": [{"name": "c", "resources": {"requests": {"cpu": "4", "nvidia.com/gpu": "1"}}}]});
    let d = decide_on(nodes(&layout), &[load], gang("train", 3, 3, spec));
    assert!(d.admitted, "{}", reasons(&d));
    assert!(nodes_of(&d).iter().all(|n| domain_of(&all, n, ZONE) == "b"), "{:?}", nodes_of(&d));
}

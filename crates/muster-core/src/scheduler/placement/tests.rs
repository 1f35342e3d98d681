//! Table tests for placement, one per rule.

use std::collections::BTreeMap;

use super::*;
use crate::devices::GpuSet;
use crate::scheduler::explain::{Explanation, ExplanationKind, FilterReason, ReasonCount};
use crate::scheduler::gpu::{GpuChoice, GpuChooser, LowestFreeIndices};
use crate::scheduler::resources::{CPU, MEMORY, PODS, Resources};
use crate::scheduler::shape::{PodShape, Taint, TaintEffect, Toleration, UNSCHEDULABLE_TAINT_KEY};
use crate::scheduler::snapshot::{NodeInfo, Snapshot};
use crate::scheduler::tree::{CompositeGroup, CompositePolicy, Group, GroupTree, LeafGroup, LeafPolicy, PodState};
use muster_api::GPU_RESOURCE;
use muster_api::scheduling::PlannedPod;

const GIB: i64 = 1 << 30;
const RACK: &str = "topology.muster.dev/rack";

fn node(name: &str, gpus: i64) -> NodeInfo {
    NodeInfo::new(
        name,
        Resources::new().with(CPU, 128_000).with(MEMORY, 1024 * GIB).with(PODS, 110).with(GPU_RESOURCE, gpus),
    )
}

fn cpu_node(name: &str, cores: i64) -> NodeInfo {
    NodeInfo::new(name, Resources::new().with(CPU, cores * 1000).with(MEMORY, 64 * GIB).with(PODS, 110))
}

fn shape(cpu_milli: i64, gpus: i64) -> PodShape {
    PodShape::new(Resources::new().with(CPU, cpu_milli).with(MEMORY, GIB).with(PODS, 1).with(GPU_RESOURCE, gpus))
}

fn leaf(name: &str, policy: LeafPolicy, pods: usize, shape: &PodShape) -> LeafGroup {
    let mut l = LeafGroup::new(name, policy);
    for i in 0..pods {
        l.add_gated(&format!("{name}-{i}"), &format!("uid-{name}-{i}"), shape.clone());
    }
    l
}

fn gang(name: &str, min_count: u32, pods: usize, shape: &PodShape) -> LeafGroup {
    leaf(name, LeafPolicy::Gang { min_count }, pods, shape)
}

fn basic(name: &str, pods: usize, shape: &PodShape) -> LeafGroup {
    leaf(name, LeafPolicy::Basic, pods, shape)
}

fn run_with(nodes: Vec<NodeInfo>, root: impl Into<Group>, options: PlaceOptions, gpus: &dyn GpuChooser) -> Decision {
    place(&Snapshot::new(nodes), &GroupTree::new("ns", root), &options, gpus)
}

fn run(nodes: Vec<NodeInfo>, root: impl Into<Group>) -> Decision {
    run_with(nodes, root, PlaceOptions::default(), &LowestFreeIndices)
}

/// Pods per node in the plan, by node name.
fn per_node(d: &Decision) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for p in &d.plan {
        *out.entry(p.node.clone()).or_default() += 1;
    }
    out
}

fn counts(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|(n, c)| (n.to_string(), *c)).collect()
}

#[test]
fn placement_feasible_matches_upstream() {
    assert_eq!(placement_feasible(4, 1, 2), Feasibility::Unschedulable, "1 scheduled + 2 remaining < 4");
    assert_eq!(placement_feasible(4, 1, 3), Feasibility::Wait);
    assert_eq!(placement_feasible(4, 4, 0), Feasibility::Success);
    assert_eq!(placement_feasible(1, 0, 0), Feasibility::Unschedulable, "a basic group with nothing to place");
}

#[test]
fn a_gang_that_fits_is_placed_whole_with_gpu_indices() {
    let nodes = (0..4).map(|i| node(&format!("n{i}"), 8)).collect();
    let d = run(nodes, gang("train", 4, 4, &shape(1000, 8)));
    assert!(d.admitted);
    assert_eq!(d.explanation, None);
    assert_eq!(d.plan.len(), 4);
    assert_eq!(per_node(&d).len(), 4, "8 GPUs per pod: one pod per node");
    assert!(d.plan.iter().all(|p| p.gpu_indices_annotation().as_deref() == Some("0,1,2,3,4,5,6,7")));
    assert_eq!(d.message(), "placed 4 pod(s) of group \"train\"");
}

#[test]
fn a_gang_that_does_not_fit_places_nothing_and_says_why_per_node() {
    let mut nodes: Vec<NodeInfo> =
        (0..32).map(|i| node(&format!("full-{i:02}"), 8).with_gpu_used(GpuSet::from_bits(0xff))).collect();
    for n in &mut nodes {
        n.requested = Resources::new().with(GPU_RESOURCE, 8);
    }
    nodes.extend(
        (0..8).map(|i| {
            node(&format!("infra-{i}"), 8).with_taint(Taint::new("dedicated", "infra", TaintEffect::NoSchedule))
        }),
    );
    let d = run(nodes, gang("train", 8, 8, &shape(1000, 4)));
    assert!(!d.admitted);
    assert!(d.plan.is_empty());
    assert_eq!(
        d.message(),
        "0/40 nodes fit 8 pods of group \"train\": 32 Insufficient nvidia.com/gpu, \
         8 node(s) had untolerated taint {dedicated: infra}"
    );
    let Some(Explanation { kind: ExplanationKind::Pods(p), .. }) = &d.explanation else { panic!("pods explanation") };
    assert_eq!(p.reasons[0], ReasonCount { reason: FilterReason::Insufficient(GPU_RESOURCE.into()), nodes: 32 });
}

#[test]
fn identical_pods_fill_the_fullest_nodes_first_with_bin_packing() {
    let nodes = vec![
        node("a-empty", 8),
        node("b-half", 8).with_requested(Resources::new().with(GPU_RESOURCE, 4)).with_gpu_used(GpuSet::from_bits(0x0f)),
        node("c-empty", 8),
    ];
    let d = run(nodes, gang("train", 6, 6, &shape(1000, 2)));
    assert!(d.admitted);
    assert_eq!(per_node(&d), counts(&[("a-empty", 4), ("b-half", 2)]), "fullest first, then name order");
    let on_half: Vec<String> = d.plan.iter().filter(|p| p.node == "b-half").map(|p| p.gpus.to_string()).collect();
    assert_eq!(on_half, vec!["4,5", "6,7"], "used indices are skipped, none given twice");
}

#[test]
fn spread_deals_one_pod_per_node_emptiest_first() {
    let nodes =
        vec![cpu_node("a", 16).with_requested(Resources::new().with(CPU, 8000)), cpu_node("b", 16), cpu_node("c", 16)];
    let options = PlaceOptions { scoring: Scoring::Spread, ..Default::default() };
    let d = run_with(nodes, gang("web", 4, 4, &shape(1000, 0)), options, &LowestFreeIndices);
    assert!(d.admitted);
    assert_eq!(per_node(&d), counts(&[("a", 1), ("b", 2), ("c", 1)]));
    assert_eq!(d.plan[0].node, "b", "the emptiest node gets the first pod");
}

#[test]
fn resource_filters_count_every_resource_and_the_pod_limit() {
    let cases: &[(&str, NodeInfo, &str)] = &[
        ("cpu", cpu_node("n", 1), "Insufficient cpu"),
        (
            "memory",
            NodeInfo::new("n", Resources::new().with(CPU, 8000).with(MEMORY, GIB / 2).with(PODS, 10)),
            "Insufficient memory",
        ),
        (
            "pods_per_node",
            NodeInfo::new("n", Resources::new().with(CPU, 8000).with(MEMORY, 8 * GIB).with(PODS, 1))
                .with_requested(Resources::new().with(PODS, 1)),
            "Too many pods",
        ),
        ("extended_resource_absent", cpu_node("n", 8), "Insufficient nvidia.com/gpu"),
    ];
    for (rule, n, reason) in cases {
        let gpus = if *rule == "extended_resource_absent" { 1 } else { 0 };
        let d = run(vec![n.clone()], gang("g", 1, 1, &shape(2000, gpus)));
        assert!(!d.admitted, "{rule}");
        assert_eq!(d.message(), format!("0/1 nodes fit 1 pod of group \"g\": 1 {reason}"), "{rule}");
    }
}

#[test]
fn existing_usage_counts_against_allocatable() {
    let n = cpu_node("n", 4).with_requested(Resources::new().with(CPU, 2500));
    let d = run(vec![n], basic("web", 3, &shape(1000, 0)));
    assert!(d.admitted);
    assert_eq!(d.plan.len(), 1, "1.5 cores left: one pod of 1 core");
}

#[test]
fn node_filters() {
    let tolerate_unschedulable = Toleration { key: UNSCHEDULABLE_TAINT_KEY.into(), exists: true, ..Default::default() };
    let mut cordoned = cpu_node("n", 8);
    cordoned.unschedulable = true;
    let tainted = |effect| cpu_node("n", 8).with_taint(Taint::new("dedicated", "infra", effect));
    let selecting = PodShape { node_selector: vec![("pool".into(), "gpu".into())], ..shape(1000, 0) };
    let cases: Vec<(&str, NodeInfo, PodShape, Option<&str>)> = vec![
        ("unschedulable_node_is_filtered", cordoned.clone(), shape(1000, 0), Some("node(s) were unschedulable")),
        (
            "unschedulable_node_admits_a_tolerating_pod",
            cordoned,
            PodShape { tolerations: vec![tolerate_unschedulable], ..shape(1000, 0) },
            None,
        ),
        (
            "no_execute_taint_is_filtered",
            tainted(TaintEffect::NoExecute),
            shape(1000, 0),
            Some("node(s) had untolerated taint {dedicated: infra}"),
        ),
        ("prefer_no_schedule_is_ignored", tainted(TaintEffect::PreferNoSchedule), shape(1000, 0), None),
        (
            "node_selector_must_match",
            cpu_node("n", 8),
            selecting.clone(),
            Some("node(s) didn't match Pod's node affinity/selector"),
        ),
        ("node_selector_matching_label", cpu_node("n", 8).with_label("pool", "gpu"), selecting, None),
    ];
    for (rule, n, s, reason) in cases {
        let d = run(vec![n], gang("g", 1, 1, &s));
        match reason {
            None => assert!(d.admitted, "{rule}: {}", d.message()),
            Some(reason) => {
                assert!(!d.admitted, "{rule}");
                assert_eq!(d.message(), format!("0/1 nodes fit 1 pod of group \"g\": 1 {reason}"), "{rule}");
            }
        }
    }
}

#[test]
fn nodes_that_cannot_be_pinned_are_never_offered() {
    let mut unlabelled = cpu_node("n", 8);
    unlabelled.labels = Default::default();
    let d = run(vec![unlabelled], basic("g", 1, &shape(1000, 0)));
    assert_eq!(d.message(), "0/1 nodes fit 1 pod of group \"g\": 1 node(s) had no kubernetes.io/hostname label");
}

#[test]
fn the_plan_pins_by_hostname_label_not_node_name() {
    let n = cpu_node("ip-10-0-0-1.ec2.internal", 8).with_label(muster_api::HOSTNAME_LABEL, "ip-10-0-0-1");
    let d = run(vec![n], basic("g", 1, &shape(1000, 0)));
    assert_eq!((d.plan[0].node.as_str(), d.plan[0].hostname.as_str()), ("ip-10-0-0-1.ec2.internal", "ip-10-0-0-1"));
    let planned = PlannedPod::from(&d.plan[0]);
    assert_eq!((planned.name.as_str(), planned.uid.as_str(), planned.gpu_indices), ("g-0", "uid-g-0", None));
}

#[test]
fn too_few_pods_stop_before_any_node_is_tried() {
    let d = run(vec![node("n", 8)], gang("train", 3, 2, &shape(1000, 1)));
    assert!(!d.admitted);
    assert_eq!(d.message(), "group \"train\" has 2 pods to place, fewer than minCount 3");
}

#[test]
fn early_stop_once_min_count_is_out_of_reach() {
    // Big pods first: the one 8-GPU pod fails, and 0 placed + 3 remaining < minCount 4 stops
    // the cycle before the small pods are tried.
    let mut l = gang("train", 4, 3, &shape(1000, 1));
    l.add_gated("train-big", "", shape(1000, 8));
    let d = run(vec![node("n", 4)], l);
    assert!(!d.admitted && d.plan.is_empty());
    assert_eq!(d.message(), "0/1 nodes fit 4 pods of group \"train\": 1 Insufficient nvidia.com/gpu");
}

#[test]
fn a_gang_places_more_than_min_count_when_it_can_and_says_what_is_left() {
    let d = run(vec![node("n", 8)], gang("train", 2, 5, &shape(1000, 2)));
    assert!(d.admitted);
    assert_eq!(d.plan.len(), 4);
    assert_eq!(
        d.message(),
        "placed 4 pod(s) of group \"train\"; 1/1 nodes fit 5 pods of group \"train\" (only 4 placeable, minCount 2)"
    );
}

#[test]
fn pods_admitted_before_count_towards_min_count() {
    let mut l = gang("train", 4, 2, &shape(1000, 8));
    l.push("train-old-0", "", PodState::Bound { node: "n0".into() });
    l.push("train-old-1", "", PodState::Admitted { hostname: "n1".into() });
    let nodes = vec![
        node("n0", 8).with_gpu_used(GpuSet::from_bits(0xff)).with_requested(Resources::new().with(GPU_RESOURCE, 8)),
        node("n1", 8).with_gpu_used(GpuSet::from_bits(0xff)).with_requested(Resources::new().with(GPU_RESOURCE, 8)),
        node("n2", 8),
        node("n3", 8),
    ];
    let d = run(nodes.clone(), l.clone());
    assert!(d.admitted, "{}", d.message());
    assert_eq!(per_node(&d), counts(&[("n2", 1), ("n3", 1)]));
    let d = run(nodes[..3].to_vec(), l);
    assert!(!d.admitted);
    assert_eq!(
        d.message(),
        "1/3 nodes fit 2 pods of group \"train\" (only 1 placeable plus 2 admitted before, minCount 4): \
         2 Insufficient nvidia.com/gpu"
    );
}

#[test]
fn a_basic_group_places_what_fits() {
    let d = run(vec![cpu_node("n", 3)], basic("web", 5, &shape(1000, 0)));
    assert!(d.admitted);
    assert_eq!(d.plan.iter().map(|p| p.pod.as_str()).collect::<Vec<_>>(), vec!["web-0", "web-1", "web-2"]);
    assert_eq!(
        d.message(),
        "placed 3 pod(s) of group \"web\"; 1/1 nodes fit 5 pods of group \"web\" (only 3 placeable)"
    );
}

fn racks(spec: &[(&str, &str, i64)]) -> Vec<NodeInfo> {
    spec.iter()
        .map(|(name, rack, gpus)| node(name, 8).with_label(RACK, rack).with_gpu_used(GpuSet::from_bits(!0u64 << gpus)))
        .collect()
}

#[test]
fn topology_puts_the_group_in_the_tightest_domain_that_fits() {
    // rack-a has room for exactly 4 pods of 4 GPUs, rack-b for 6, rack-c for 2.
    let nodes = racks(&[
        ("a1", "rack-a", 8),
        ("a2", "rack-a", 8),
        ("b1", "rack-b", 8),
        ("b2", "rack-b", 8),
        ("b3", "rack-b", 8),
        ("c1", "rack-c", 8),
    ]);
    let d = run(nodes, gang("train", 4, 4, &shape(1000, 4)).with_topology(RACK));
    assert!(d.admitted, "{}", d.message());
    assert_eq!(per_node(&d), counts(&[("a1", 2), ("a2", 2)]));
}

#[test]
fn topology_explains_the_best_domain_when_none_fits() {
    let mut nodes = racks(&[("a1", "rack-a", 8), ("a2", "rack-a", 8), ("b1", "rack-b", 8)]);
    nodes.push(node("loose", 8));
    let d = run(nodes, gang("train", 9, 9, &shape(1000, 2)).with_topology(RACK));
    assert!(!d.admitted && d.plan.is_empty());
    assert_eq!(
        d.message(),
        "no domain of topology.muster.dev/rack fits all 9 pods of group \"train\": best domain \"rack-a\" fits 8 \
         (1 node without the label); 2/2 nodes in topology.muster.dev/rack=rack-a fit 9 pods of group \"train\" \
         (only 8 placeable, minCount 9)"
    );
}

#[test]
fn pods_admitted_before_fix_the_domain() {
    let nodes = racks(&[("a1", "rack-a", 2), ("b1", "rack-b", 8)]);
    let mut l = gang("train", 3, 2, &shape(1000, 2)).with_topology(RACK);
    l.push("train-old", "", PodState::Bound { node: "a1".into() });
    let d = run(nodes.clone(), l.clone());
    assert!(!d.admitted, "rack-b has room, but the group already lives in rack-a");
    assert!(
        d.message().starts_with(
            "no domain of topology.muster.dev/rack fits all 3 pods of group \"train\": best domain \"rack-a\" fits 2"
        ),
        "{}",
        d.message()
    );

    l.push("train-stray", "", PodState::Bound { node: "b1".into() });
    let d = run(nodes, l);
    assert_eq!(
        d.message(),
        "group \"train\" already has pods in more than one domain of topology.muster.dev/rack (rack-a, rack-b), \
         so no single domain can hold it"
    );
}

#[test]
fn a_composite_topology_holds_every_descendant_in_one_domain() {
    let nodes = racks(&[("a1", "rack-a", 8), ("b1", "rack-b", 8), ("b2", "rack-b", 8)]);
    let root = CompositeGroup::new("job", CompositePolicy::Gang { min_group_count: 2 })
        .with_topology(RACK)
        .with_child(gang("driver", 1, 1, &shape(1000, 4)))
        .with_child(gang("workers", 2, 2, &shape(1000, 4)));
    let d = run(nodes, root);
    assert!(d.admitted, "{}", d.message());
    assert!(d.plan.iter().all(|p| p.node.starts_with('b')), "only rack-b holds 3 pods of 4 GPUs: {:?}", d.plan);
}

#[test]
fn a_gang_composite_is_all_or_nothing() {
    let root = CompositeGroup::new("job", CompositePolicy::Gang { min_group_count: 2 })
        .with_child(gang("ps", 1, 1, &shape(1000, 0)))
        .with_child(gang("workers", 4, 4, &shape(1000, 8)));
    let d = run(vec![node("n0", 8), node("n1", 8)], root);
    assert!(!d.admitted);
    assert!(d.plan.is_empty(), "ps fit, but the composite needs both children");
    assert_eq!(
        d.message(),
        "composite group \"job\": 1 of 2 child groups fit, minGroupCount 2; \
         2/2 nodes fit 4 pods of group \"workers\" (only 2 placeable, minCount 4)"
    );
}

#[test]
fn a_gang_composite_succeeds_with_min_group_count_children() {
    let root = CompositeGroup::new("job", CompositePolicy::Gang { min_group_count: 1 })
        .with_child(gang("big", 4, 4, &shape(1000, 8)))
        .with_child(gang("small", 2, 2, &shape(1000, 4)));
    let d = run(vec![node("n0", 8)], root);
    assert!(d.admitted);
    assert_eq!(d.plan.iter().map(|p| p.pod_group.as_str()).collect::<Vec<_>>(), vec!["small", "small"]);
    assert_eq!(
        d.message(),
        "placed 2 pod(s) of group \"job\"; composite group \"job\": 1 of 2 child groups fit, minGroupCount 1; \
         1/1 nodes fit 4 pods of group \"big\" (only 1 placeable, minCount 4)"
    );
}

#[test]
fn a_failed_gang_releases_its_room_to_basic_groups() {
    // The gang is tried first and takes n0 tentatively, fails on the missing second node, and
    // gives n0 back: the basic group then gets it.
    let root = CompositeGroup::new("mixed", CompositePolicy::Basic)
        .with_child(basic("a-web", 1, &shape(1000, 8)))
        .with_child(gang("z-train", 2, 2, &shape(1000, 8)));
    let d = run(vec![node("n0", 8)], root);
    assert!(d.admitted);
    assert_eq!(d.plan.iter().map(|p| p.pod.as_str()).collect::<Vec<_>>(), vec!["a-web-0"]);
    assert!(d.message().contains("group \"z-train\" (only 1 placeable, minCount 2)"), "{}", d.message());
}

#[test]
fn gang_children_go_before_basic_ones() {
    let root = CompositeGroup::new("mixed", CompositePolicy::Basic)
        .with_child(basic("a-web", 1, &shape(1000, 8)))
        .with_child(gang("z-train", 1, 1, &shape(1000, 8)));
    let d = run(vec![node("n0", 8)], root);
    assert_eq!(d.plan.iter().map(|p| p.pod_group.as_str()).collect::<Vec<_>>(), vec!["z-train"]);
}

/// A chooser that prefers a node by name and otherwise defers to the lowest indices.
struct Prefer(&'static str);

impl GpuChooser for Prefer {
    fn choose(&self, node: &NodeInfo, count: u32, used: GpuSet) -> Option<GpuChoice> {
        let choice = LowestFreeIndices.choose(node, count, used)?;
        Some(GpuChoice { score: if node.name == self.0 { 100 } else { 0 }, ..choice })
    }
}

/// A broken chooser that hands out index 0 whether it is free or not.
struct AlwaysZero;

impl GpuChooser for AlwaysZero {
    fn choose(&self, _: &NodeInfo, _: u32, _: GpuSet) -> Option<GpuChoice> {
        Some(GpuChoice { gpus: GpuSet::first(1), score: 100 })
    }
}

#[test]
fn the_gpu_locality_score_steers_placement() {
    let nodes = vec![
        node("a", 8).with_gpu_used(GpuSet::from_bits(0x0f)).with_requested(Resources::new().with(GPU_RESOURCE, 4)),
        node("b", 8),
    ];
    let d = run_with(nodes.clone(), gang("g", 1, 1, &shape(1000, 2)), PlaceOptions::default(), &LowestFreeIndices);
    assert_eq!(d.plan[0].node, "a", "bin packing alone picks the fuller node");
    let d = run_with(nodes, gang("g", 1, 1, &shape(1000, 2)), PlaceOptions::default(), &Prefer("b"));
    assert_eq!(d.plan[0].node, "b", "the chooser's locality score outweighs it");
}

#[test]
fn a_chooser_answer_that_reuses_an_index_is_refused() {
    let d = run_with(vec![node("n", 8)], gang("g", 2, 2, &shape(1000, 1)), PlaceOptions::default(), &AlwaysZero);
    assert!(!d.admitted, "the second pod would get index 0 again");
    assert!(d.plan.is_empty());
    let d = run_with(vec![node("n", 8)], gang("g", 1, 1, &shape(1000, 2)), PlaceOptions::default(), &AlwaysZero);
    assert_eq!(d.message(), "0/1 nodes fit 1 pod of group \"g\": 1 node(s) had no free GPU indices");
}

#[test]
fn unreadable_pods_stay_gated_and_are_named() {
    let mut l = basic("web", 1, &shape(1000, 0));
    l.push("web-bad", "", PodState::Invalid { error: crate::scheduler::shape::ShapeError::NoSpec });
    let d = run(vec![cpu_node("n", 4)], l);
    assert!(d.admitted);
    assert_eq!(d.plan.len(), 1);
    assert_eq!(
        d.message(),
        "placed 1 pod(s) of group \"web\"; group \"web\": 1 unreadable pod left gated (pod web-bad: pod has no spec)"
    );
}

#[test]
fn decide_runs_quorum_first() {
    let snapshot = Snapshot::new(vec![node("n", 8)]);
    let options = PlaceOptions::default();
    let waiting = GroupTree::new("ns", gang("g", 3, 2, &shape(1000, 1)));
    assert!(matches!(decide(&snapshot, &waiting, &options, &LowestFreeIndices), Admission::Waiting(_)));
    let mut done = LeafGroup::new("g", LeafPolicy::Gang { min_count: 1 });
    done.push("p", "", PodState::Bound { node: "n".into() });
    let done = GroupTree::new("ns", done);
    assert_eq!(decide(&snapshot, &done, &options, &LowestFreeIndices), Admission::NothingGated);
    let ready = GroupTree::new("ns", gang("g", 2, 2, &shape(1000, 1)));
    let Admission::Decided(d) = decide(&snapshot, &ready, &options, &LowestFreeIndices) else { panic!("decided") };
    assert!(d.admitted);
    assert_eq!(d.plan.iter().map(|p| p.gpus.iter().collect()).collect::<Vec<Vec<_>>>(), vec![vec![0], vec![1]]);
}

#[test]
fn a_gang_composite_stops_once_min_group_count_is_out_of_reach() {
    let root = CompositeGroup::new("job", CompositePolicy::Gang { min_group_count: 3 })
        .with_child(gang("a", 1, 1, &shape(1000, 16)))
        .with_child(gang("b", 1, 1, &shape(1000, 1)))
        .with_child(gang("c", 1, 1, &shape(1000, 1)));
    let d = run(vec![node("n", 8)], root);
    assert!(!d.admitted && d.plan.is_empty());
    assert_eq!(
        d.message(),
        "composite group \"job\": 0 of 3 child groups fit, minGroupCount 3 (2 not tried); \
         0/1 nodes fit 1 pod of group \"a\": 1 Insufficient nvidia.com/gpu"
    );
}

#[test]
fn from_cluster_lists_to_a_plan() {
    use k8s_openapi::api::core::v1::{
        Container, Node, NodeStatus, Pod, PodSchedulingGate, PodSpec, ResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use muster_api::blocks::PodGroupSchedulingPolicy;
    use muster_api::scheduling::PodGroupSpec;
    use muster_api::{ADMISSION_GATE, POD_GROUP_LABEL, PodGroup};

    let quantities = |pairs: &[(&str, &str)]| -> BTreeMap<String, Quantity> {
        pairs.iter().map(|(k, v)| (k.to_string(), Quantity(v.to_string()))).collect()
    };
    let k8s_node = |name: &str| Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some([(muster_api::HOSTNAME_LABEL.to_string(), name.to_string())].into()),
            ..Default::default()
        },
        spec: None,
        status: Some(NodeStatus {
            allocatable: Some(quantities(&[
                ("cpu", "128"),
                ("memory", "1Ti"),
                ("pods", "110"),
                ("nvidia.com/gpu", "8"),
            ])),
            ..Default::default()
        }),
    };
    let pod = |name: &str, gated: bool, node: Option<&str>| Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ml".into()),
            uid: Some(format!("uid-{name}")),
            labels: Some([(POD_GROUP_LABEL.to_string(), "train".to_string())].into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                resources: Some(ResourceRequirements {
                    requests: Some(quantities(&[("cpu", "16"), ("memory", "64Gi"), ("nvidia.com/gpu", "4")])),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            scheduling_gates: gated.then(|| vec![PodSchedulingGate { name: ADMISSION_GATE.into() }]),
            node_name: node.map(String::from),
            ..Default::default()
        }),
        ..Default::default()
    };
    let group = PodGroup {
        metadata: ObjectMeta { name: Some("train".into()), namespace: Some("ml".into()), ..Default::default() },
        spec: PodGroupSpec { scheduling_policy: PodGroupSchedulingPolicy::gang(Some(3)), ..Default::default() },
        status: None,
    };
    let pods = vec![pod("w0", false, Some("a")), pod("w1", true, None), pod("w2", true, None)];
    let mut snapshot = Snapshot::from_cluster(&[k8s_node("a"), k8s_node("b")], &pods);
    assert!(snapshot.set_gpu_used("a", GpuSet::first(4)));
    let forest = crate::scheduler::build_forest(&[group], &[], &pods);
    let [tree] = forest.trees.as_slice() else { panic!("one root") };
    let Admission::Decided(d) = decide(&snapshot, tree, &PlaceOptions::default(), &LowestFreeIndices) else {
        panic!("quorate")
    };
    assert!(d.admitted, "{}", d.message());
    let planned: Vec<(String, String, Option<String>)> =
        d.plan.iter().map(|p| (p.pod.clone(), p.node.clone(), p.gpu_indices_annotation())).collect();
    assert_eq!(
        planned,
        vec![
            ("w1".to_string(), "a".to_string(), Some("4,5,6,7".to_string())),
            ("w2".to_string(), "b".to_string(), Some("0,1,2,3".to_string())),
        ],
        "the half-full node first, then the next; the bound pod counts towards minCount 3"
    );
}

#[test]
fn extreme_amounts_neither_overflow_nor_overcommit() {
    let huge = NodeInfo::new("huge", Resources::new().with(CPU, i64::MAX).with(MEMORY, i64::MAX).with(PODS, 110))
        .with_requested(Resources::new().with(CPU, i64::MAX - 10).with(MEMORY, 1));
    let big_pod = PodShape::new(Resources::new().with(CPU, 5).with(MEMORY, i64::MAX / 2).with(PODS, 1));
    let d = run(vec![huge], gang("g", 3, 3, &big_pod));
    assert!(!d.admitted, "room for two pods only, by cpu and by memory");
    assert_eq!(d.message(), "1/1 nodes fit 3 pods of group \"g\" (only 2 placeable, minCount 3)");
}

//! The incrementally kept [`ClusterState`] against a full rebuild ([`Snapshot::from_cluster`])
//! after any sequence of watch events.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Container, Node, NodeSpec, NodeStatus, Pod, PodAffinityTerm, PodAntiAffinity, PodSchedulingGate, PodSpec,
    PodStatus, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};
use proptest::prelude::*;

use super::{Change, ClusterState};
use crate::scheduler::Snapshot;
use muster_api::{ADMISSION_GATE, GPU_RESOURCE, HOSTNAME_LABEL, POD_GROUP_LABEL};

/// What a snapshot holds, in an order that does not depend on the order pods were counted.
fn digest(s: &Snapshot) -> (Vec<String>, Vec<String>, Vec<String>) {
    let nodes = s.nodes().iter().map(|n| format!("{n:?}")).collect();
    let mut pods: Vec<String> = s
        .node_pods()
        .iter()
        .map(|p| {
            let node = &s.nodes()[p.node as usize].name;
            format!("{node} {} {:?} {:?} {:?} {}", p.namespace, p.labels, p.anti_affinity, p.host_ports, p.terminating)
        })
        .collect();
    pods.sort();
    let mut problems: Vec<String> = s.problems().iter().map(ToString::to_string).collect();
    problems.sort();
    (nodes, pods, problems)
}

fn node(i: u8, variant: u8) -> Node {
    let name = format!("n{i}");
    // Variants: hostname = name, a hostname shared with n0, no hostname; allocatable valid or not.
    let hostname = match variant % 4 {
        0 | 1 => Some(name.clone()),
        2 => Some("n0".to_string()),
        _ => None,
    };
    let cpu = if variant % 7 == 6 { "lots".to_string() } else { format!("{}", 4 + variant % 3) };
    Node {
        metadata: ObjectMeta {
            name: Some(name),
            labels: Some(hostname.map(|h| (HOSTNAME_LABEL.to_string(), h)).into_iter().collect()),
            ..Default::default()
        },
        spec: Some(NodeSpec { unschedulable: Some(variant % 5 == 4), ..Default::default() }),
        status: Some(NodeStatus {
            allocatable: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity(cpu)),
                ("memory".to_string(), Quantity("64Gi".into())),
                ("pods".to_string(), Quantity("110".into())),
                (GPU_RESOURCE.to_string(), Quantity(format!("{}", variant % 3 * 4))),
            ])),
            ..Default::default()
        }),
    }
}

fn pod(j: u8, node: u8, variant: u8) -> Pod {
    let ns = if j.is_multiple_of(2) { "a" } else { "b" };
    let mut labels = BTreeMap::from([("app".to_string(), format!("app{}", variant % 3))]);
    if variant % 4 != 3 {
        labels.insert(POD_GROUP_LABEL.to_string(), "g".into());
    }
    let cpu = if variant % 11 == 10 { "bad".to_string() } else { format!("{}m", 100 * (1 + u32::from(variant % 4))) };
    let mut spec = PodSpec {
        containers: vec![Container {
            name: "c".into(),
            resources: Some(ResourceRequirements {
                requests: Some(BTreeMap::from([
                    ("cpu".to_string(), Quantity(cpu)),
                    (GPU_RESOURCE.to_string(), Quantity(format!("{}", variant % 2))),
                ])),
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    };
    // Placement variants: gated, admitted (pinned by hostname), bound, unpinned.
    match variant % 5 {
        0 => spec.scheduling_gates = Some(vec![PodSchedulingGate { name: ADMISSION_GATE.into() }]),
        1 => spec.node_selector = Some(BTreeMap::from([(HOSTNAME_LABEL.to_string(), format!("n{node}"))])),
        2 | 3 => spec.node_name = Some(format!("n{node}")),
        _ => {}
    }
    if variant % 6 == 5 {
        let key = if variant % 12 == 11 { "" } else { HOSTNAME_LABEL };
        spec.affinity = Some(Affinity {
            pod_anti_affinity: Some(PodAntiAffinity {
                required_during_scheduling_ignored_during_execution: Some(vec![PodAffinityTerm {
                    topology_key: key.into(),
                    label_selector: Some(LabelSelector {
                        match_labels: Some(BTreeMap::from([("app".to_string(), "app0".to_string())])),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    let phase = match variant % 9 {
        7 => "Succeeded",
        8 => "Running",
        _ => "Pending",
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(format!("p{j}")),
            namespace: Some(ns.into()),
            labels: Some(labels),
            deletion_timestamp: (variant % 13 == 12).then_some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
            ..Default::default()
        },
        spec: Some(spec),
        status: Some(PodStatus { phase: Some(phase.into()), ..Default::default() }),
    }
}

/// One watch event over a small universe of nodes and pods; a relist lists the objects given
/// (the rest are gone).
#[derive(Clone, Debug)]
enum Ev {
    ApplyNode(u8, u8),
    DeleteNode(u8),
    ApplyPod(u8, u8, u8),
    DeletePod(u8),
    RelistNodes(Vec<(u8, u8)>),
    RelistPods(Vec<(u8, u8, u8)>),
}

fn event() -> impl Strategy<Value = Ev> {
    prop_oneof![
        3 => (0u8..5, any::<u8>()).prop_map(|(i, v)| Ev::ApplyNode(i, v)),
        1 => (0u8..5).prop_map(Ev::DeleteNode),
        6 => (0u8..12, 0u8..6, any::<u8>()).prop_map(|(j, n, v)| Ev::ApplyPod(j, n, v)),
        2 => (0u8..12).prop_map(Ev::DeletePod),
        1 => proptest::collection::vec((0u8..5, any::<u8>()), 0..5).prop_map(Ev::RelistNodes),
        1 => proptest::collection::vec((0u8..12, 0u8..6, any::<u8>()), 0..12).prop_map(Ev::RelistPods),
    ]
}

/// A relist as the watch delivers it: start, each object, done.
fn relist<K>(objects: &[K], mut on: impl FnMut(Change<'_, K>) -> bool) -> bool {
    let mut changed = on(Change::RelistStarted);
    for o in objects {
        changed |= on(Change::Relisted(o));
    }
    on(Change::RelistDone) | changed
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// After every event, relists included, the kept state's snapshot equals a rebuild from
    /// the objects as the watches last showed them; a change reported as none leaves the
    /// generation as it was.
    #[test]
    fn kept_state_equals_rebuild(events in proptest::collection::vec(event(), 1..60)) {
        let mut state = ClusterState::default();
        let mut nodes: BTreeMap<u8, Node> = BTreeMap::new();
        let mut pods: BTreeMap<u8, Pod> = BTreeMap::new();
        for ev in events {
            let before = state.generation();
            let changed = match ev {
                Ev::ApplyNode(i, v) => {
                    let n = node(i, v);
                    nodes.insert(i, n.clone());
                    state.apply_node(&n)
                }
                Ev::DeleteNode(i) => match nodes.remove(&i) {
                    Some(n) => state.node_changed(Change::Deleted(&n)),
                    None => state.node_changed(Change::Deleted(&node(i, 0))),
                },
                Ev::ApplyPod(j, n, v) => {
                    let p = pod(j, n, v);
                    pods.insert(j, p.clone());
                    state.apply_pod(&p)
                }
                Ev::DeletePod(j) => {
                    let p = pods.remove(&j);
                    let gone = state.pod_changed(Change::Deleted(&p.clone().unwrap_or_else(|| pod(j, 0, 0))));
                    prop_assert!(!gone || p.is_some());
                    gone
                }
                Ev::RelistNodes(list) => {
                    nodes = list.into_iter().map(|(i, v)| (i, node(i, v))).collect();
                    let listed: Vec<Node> = nodes.values().cloned().collect();
                    relist(&listed, |c| state.node_changed(c))
                }
                Ev::RelistPods(list) => {
                    pods = list.into_iter().map(|(j, n, v)| (j, pod(j, n, v))).collect();
                    let listed: Vec<Pod> = pods.values().cloned().collect();
                    relist(&listed, |c| state.pod_changed(c))
                }
            };
            prop_assert_eq!(state.generation() != before, changed);
            let nodes: Vec<Node> = nodes.values().cloned().collect();
            let pods: Vec<Pod> = pods.values().cloned().collect();
            prop_assert_eq!(digest(&state.snapshot()), digest(&Snapshot::from_cluster(&nodes, &pods)));
            prop_assert_eq!(
                digest(&ClusterState::from_lists(&nodes, &pods).snapshot()),
                digest(&Snapshot::from_cluster(&nodes, &pods))
            );
            // What the GPU pass reads: each placed, unfinished pod as it was seen last.
            let mut rebuilt: Vec<(String, crate::pods::GpuPod)> = pods
                .iter()
                .filter_map(|p| crate::pods::GpuPod::of(p).map(|g| (super::pod_key(p), g)))
                .collect();
            rebuilt.sort_by(|a, b| a.0.cmp(&b.0));
            let kept: Vec<crate::pods::GpuPod> = state.gpu_pods().iter().map(|g| (**g).clone()).collect();
            prop_assert_eq!(kept, rebuilt.into_iter().map(|(_, g)| g).collect::<Vec<_>>());
            // What the GPU model reads: each node as it was seen last.
            let kept_nodes: Vec<(String, crate::devices::chooser::GpuNode)> =
                state.gpu_nodes().into_iter().map(|(name, g)| (name, (*g).clone())).collect();
            let mut rebuilt_nodes: Vec<(String, crate::devices::chooser::GpuNode)> = nodes
                .iter()
                .map(|n| (n.metadata.name.clone().unwrap_or_default(), crate::devices::chooser::GpuNode::of(n)))
                .collect();
            rebuilt_nodes.sort_by(|a, b| a.0.cmp(&b.0));
            prop_assert_eq!(kept_nodes, rebuilt_nodes);
        }
    }
}

#[test]
fn unchanged_objects_are_not_changes() {
    let mut state = ClusterState::default();
    assert!(state.apply_node(&node(1, 0)));
    assert!(!state.apply_node(&node(1, 0)));
    // Bound: counted once; the same pod again (a status update kwok makes) changes nothing.
    assert!(state.apply_pod(&pod(0, 1, 2)));
    assert!(!state.apply_pod(&pod(0, 1, 2)));
    assert_eq!(state.len(), (1, 1));
    // Gated pods use nothing: the gated version of the pod removes its usage.
    assert!(state.apply_pod(&pod(0, 1, 0)));
    assert_eq!(state.len(), (1, 0));
    assert!(!state.pod_changed(Change::Deleted(&pod(0, 1, 0))));
    let snapshot = state.snapshot();
    assert_eq!(snapshot.nodes().len(), 1);
    assert!(snapshot.node_pods().is_empty());
}

#[test]
fn a_relist_drops_what_it_did_not_list() {
    let mut state = ClusterState::from_lists(&[node(1, 0), node(2, 0)], &[pod(0, 1, 2), pod(1, 2, 2)]);
    assert_eq!(state.len(), (2, 2));
    let g = state.generation();
    assert!(!relist(&[node(1, 0), node(2, 0)], |c| state.node_changed(c)), "the same nodes again");
    assert!(relist(&[node(1, 0)], |c| state.node_changed(c)));
    assert!(relist(&[pod(0, 1, 2)], |c| state.pod_changed(c)));
    assert_eq!(state.len(), (1, 1));
    assert_eq!(state.generation(), g + 2);
    assert_eq!(digest(&state.snapshot()), digest(&Snapshot::from_cluster(&[node(1, 0)], &[pod(0, 1, 2)])));
}

#[test]
fn a_cycle_is_quiet_only_without_events_changes_or_timers_due() {
    use super::Quiet;
    use std::time::{Duration, Instant};
    let now = Instant::now();
    let mut quiet = Quiet::default();
    assert!(!quiet.nothing_to_do(0, 0, now), "the first cycle always runs");
    quiet.cycled(3, 9, Some(now + Duration::from_secs(1)));
    assert!(quiet.nothing_to_do(3, 9, now));
    assert!(!quiet.nothing_to_do(4, 9, now), "an event woke it");
    assert!(!quiet.nothing_to_do(3, 10, now), "the kept state changed");
    assert!(!quiet.nothing_to_do(3, 9, now + Duration::from_secs(1)), "a timer is due");
    quiet.cycled(3, 9, None);
    assert!(quiet.nothing_to_do(3, 9, now + Duration::from_secs(3600)));
    assert_eq!(quiet.wake(), None);
}

//! The kept ledger equals a rebuild, and builds only what changed.

use super::*;
use crate::devices::gpuset::GpuSet;
use crate::devices::ledger::format_indices;
use crate::devices::ledger::test_support::{PODS, created, record, set};
use proptest::prelude::*;

/// One pod's record in the kept-ledger property test, owned so a sequence can change it.
#[derive(Clone, Debug)]
struct Pod {
    node: usize,
    created: i64,
    indices: Option<String>,
    phase: PodPhase,
    bound: bool,
    terminating: bool,
    node_gpus: usize,
    confirmed: bool,
}

/// What a watch event can change of the pods the ledger is built from.
#[derive(Clone, Debug)]
enum Event {
    /// A pod appears (or is replaced) with this state.
    Put(usize, Pod),
    /// A pod is deleted.
    Delete(usize),
    /// A pod's annotation is written (or removed), in any spelling, valid or not.
    Annotate(usize, Option<String>),
    /// A pod's phase moves.
    Phase(usize, PodPhase),
    /// A pod is bound, starts terminating, or its GPUs are confirmed by its node.
    Flags(usize, bool, bool, bool),
    /// Every pod on a node sees the node's GPU count change.
    NodeGpus(usize, usize),
}

fn annotation() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        2 => Just(None),
        6 => any::<u8>().prop_map(|bits| Some(format_indices(GpuSet::from_bits(u64::from(bits))))),
        1 => prop::sample::select(vec!["", " 1, 0", "0,,1", "x", "9", "63"]).prop_map(|v| Some(v.to_string())),
    ]
}

fn phase() -> impl Strategy<Value = PodPhase> {
    prop::sample::select(vec![
        PodPhase::Pending,
        PodPhase::Running,
        PodPhase::Succeeded,
        PodPhase::Failed,
        PodPhase::Unknown,
    ])
}

fn pod_state() -> impl Strategy<Value = Pod> {
    (0usize..4, 0i64..5, annotation(), phase(), any::<(bool, bool, bool)>(), prop::sample::select(vec![4usize, 8]))
        .prop_map(|(node, created, indices, phase, (bound, terminating, confirmed), node_gpus)| Pod {
            node,
            created,
            indices,
            phase,
            bound,
            terminating,
            node_gpus,
            confirmed,
        })
}

fn events() -> impl Strategy<Value = Vec<Event>> {
    let event = prop_oneof![
        4 => (0usize..10, pod_state()).prop_map(|(p, s)| Event::Put(p, s)),
        1 => (0usize..10).prop_map(Event::Delete),
        3 => (0usize..10, annotation()).prop_map(|(p, a)| Event::Annotate(p, a)),
        2 => (0usize..10, phase()).prop_map(|(p, ph)| Event::Phase(p, ph)),
        2 => (0usize..10, any::<(bool, bool, bool)>()).prop_map(|(p, (b, t, c))| Event::Flags(p, b, t, c)),
        1 => (0usize..4, prop::sample::select(vec![2usize, 4, 8])).prop_map(|(n, g)| Event::NodeGpus(n, g)),
    ];
    prop::collection::vec(event, 0..60)
}

/// Node 3 stands for "no node" (a pod with indices but nowhere to hold them).
const KEPT_NODES: [&str; 4] = ["n0", "n1", "n2", ""];

fn records_of(pods: &std::collections::BTreeMap<usize, Pod>) -> Vec<PodRecord<'_>> {
    pods.iter()
        .map(|(uid, p)| PodRecord {
            node: KEPT_NODES[p.node],
            uid: PODS[*uid],
            created: Timestamp::from_second(p.created).ok(),
            indices: p.indices.as_deref(),
            phase: p.phase,
            bound: p.bound,
            terminating: p.terminating,
            node_gpus: p.node_gpus,
            confirmed: p.confirmed,
        })
        .collect()
}

fn sorted_problems<'a>(problems: impl IntoIterator<Item = &'a LedgerProblem>) -> Vec<String> {
    let mut out: Vec<String> = problems.into_iter().map(|p| format!("{p:?}")).collect();
    out.sort();
    out
}

proptest! {
    #[test]
    fn the_kept_ledger_equals_a_rebuild_after_any_sequence_of_pod_events(events in events()) {
        let mut pods: std::collections::BTreeMap<usize, Pod> = std::collections::BTreeMap::new();
        let mut kept = KeptLedger::default();
        for event in events {
            match event {
                Event::Put(p, state) => {
                    pods.insert(p, state);
                }
                Event::Delete(p) => {
                    pods.remove(&p);
                }
                Event::Annotate(p, a) => {
                    if let Some(pod) = pods.get_mut(&p) {
                        pod.indices = a;
                    }
                }
                Event::Phase(p, ph) => {
                    if let Some(pod) = pods.get_mut(&p) {
                        pod.phase = ph;
                    }
                }
                Event::Flags(p, bound, terminating, confirmed) => {
                    if let Some(pod) = pods.get_mut(&p) {
                        (pod.bound, pod.terminating, pod.confirmed) = (bound, terminating, confirmed);
                    }
                }
                Event::NodeGpus(n, gpus) => {
                    for pod in pods.values_mut().filter(|pod| pod.node == n) {
                        pod.node_gpus = gpus;
                    }
                }
            }
            let records = records_of(&pods);
            // Records come in any order: the kept ledger and a rebuild sort them alike.
            let mut shuffled = records.clone();
            shuffled.reverse();
            kept.update(shuffled);
            let (rebuilt, problems) = Ledger::rebuild(records.clone());
            prop_assert_eq!(kept.ledger(), &rebuilt);
            prop_assert_eq!(sorted_problems(kept.problems()), sorted_problems(&problems));
            // Nothing changed: nothing is built again, and the ledger stands.
            prop_assert_eq!(kept.update(records), 0);
            prop_assert_eq!(kept.ledger(), &rebuilt);
        }
    }
}

#[test]
fn the_kept_ledger_builds_only_the_nodes_whose_pods_changed() {
    let mut kept = KeptLedger::default();
    let pods = |a: &'static str| {
        vec![
            created(record("n1", "a", Some(a), PodPhase::Running), 1),
            created(record("n2", "b", Some("0,1"), PodPhase::Running), 2),
            created(record("n3", "c", Some("1"), PodPhase::Running), 3),
        ]
    };
    assert_eq!(kept.update(pods("0")), 3, "all three nodes at first");
    assert_eq!(kept.update(pods("0")), 0, "nothing changed");
    assert_eq!(kept.update(pods("2,3")), 1, "one annotation: one node");
    assert_eq!(kept.ledger().used_mask("n1"), set(&[2, 3]));
    assert_eq!(kept.ledger().used_mask("n2"), set(&[0, 1]));
    // A pod gone frees its GPUs; its node is built again (with nothing on it).
    let fewer = pods("2,3").into_iter().filter(|r| r.uid != "c").collect::<Vec<_>>();
    assert_eq!(kept.update(fewer.clone()), 0, "no records left on n3: nothing to build");
    assert_eq!(kept.ledger().used_mask("n3"), GpuSet::EMPTY);
    assert_eq!(kept.ledger(), &Ledger::rebuild(fewer).0);
    // A pod moved to another node claims there.
    let moved = vec![
        created(record("n1", "a", Some("2,3"), PodPhase::Running), 1),
        created(record("n1", "b", Some("0,1"), PodPhase::Running), 2),
    ];
    assert_eq!(kept.update(moved.clone()), 1, "n1 built again, n2 left empty");
    assert_eq!(kept.ledger().used_mask("n1"), set(&[0, 1, 2, 3]));
    assert_eq!(kept.ledger(), &Ledger::rebuild(moved).0);
}

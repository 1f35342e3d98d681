//! The ledger's bookkeeping and its rebuild from pod records.

use super::*;
use crate::devices::ledger::test_support::{PODS, created, record, set};
use crate::devices::ledger::{PodPhase, format_indices};
use proptest::prelude::*;

#[test]
fn assign_records_and_release_frees() {
    let mut l = Ledger::new();
    assert_eq!(l.assign("n1", "a", set(&[0, 1])), Ok(()));
    assert_eq!(l.used_mask("n1"), set(&[0, 1]));
    assert_eq!(l.holder("n1", 1), Some("a"));
    assert_eq!(l.used_mask("n2"), GpuSet::EMPTY);
    assert_eq!(l.release("a"), Some(Claim { node: "n1".into(), gpus: set(&[0, 1]) }));
    assert_eq!(l, Ledger::new());
    assert_eq!(l.release("a"), None);
}

#[test]
fn second_pod_on_a_held_index_is_a_conflict_and_changes_nothing() {
    let mut l = Ledger::new();
    assert_eq!(l.assign("n1", "a", set(&[0, 1])), Ok(()));
    let before = l.clone();
    let err = l.assign("n1", "b", set(&[1, 2]));
    assert_eq!(
        err,
        Err(Conflict::IndexHeld {
            node: "n1".into(),
            pod_uid: "b".into(),
            wanted: set(&[1, 2]),
            held: vec![(1, "a".into())]
        })
    );
    assert!(err.is_err_and(|e| e.to_string().contains("GPU 1 is held by pod a")));
    assert_eq!(l, before);
    // The same indices on another node are someone else's GPUs.
    assert_eq!(l.assign("n2", "b", set(&[1, 2])), Ok(()));
}

#[test]
fn reassigning_the_same_claim_is_idempotent_but_a_pod_never_moves() {
    let mut l = Ledger::new();
    assert_eq!(l.assign("n1", "a", set(&[3])), Ok(()));
    assert_eq!(l.assign("n1", "a", set(&[3])), Ok(()));
    assert!(matches!(l.assign("n1", "a", set(&[4])), Err(Conflict::AlreadyAssigned { .. })));
    assert!(matches!(l.assign("n2", "a", set(&[3])), Err(Conflict::AlreadyAssigned { .. })));
    assert_eq!(l.used_mask("n1"), set(&[3]));
}

#[test]
fn finished_pods_free_their_gpus() {
    let mut l = Ledger::new();
    assert_eq!(l.observe(record("n1", "a", Some("0,1"), PodPhase::Running)), vec![]);
    assert_eq!(l.observe(record("n1", "a", Some("0,1"), PodPhase::Succeeded)), vec![]);
    assert_eq!(l.used_mask("n1"), GpuSet::EMPTY);
    assert_eq!(l.observe(record("n1", "b", Some("0"), PodPhase::Running)), vec![]);
    assert_eq!(l.observe(record("n1", "b", Some("0"), PodPhase::Failed)), vec![]);
    assert_eq!(l, Ledger::new());
}

#[test]
fn live_pod_without_annotation_keeps_an_admission_claim() {
    let mut l = Ledger::new();
    assert_eq!(l.assign("n1", "a", set(&[2])), Ok(()));
    assert_eq!(l.observe(record("n1", "a", None, PodPhase::Pending)), vec![]);
    assert_eq!(l.used_mask("n1"), set(&[2]));
}

#[test]
fn rebuild_reports_conflicts_and_bad_annotations() {
    let pods = [
        created(record("n1", "a", Some("0,1"), PodPhase::Running), 1),
        created(record("n1", "b", Some("1,2"), PodPhase::Running), 2),
        created(record("n1", "c", Some("1,x"), PodPhase::Pending), 3),
        created(record("", "d", Some("3"), PodPhase::Pending), 4),
        created(record("n1", "e", Some("1"), PodPhase::Succeeded), 5),
        created(record("n1", "f", None, PodPhase::Running), 6),
        created(record("n1", "g", Some("5"), PodPhase::from_status(Some("Weird"))), 7),
    ];
    let (ledger, problems) = Ledger::rebuild(pods);
    assert_eq!(ledger.used_mask("n1"), set(&[0, 1, 2, 5]));
    assert_eq!(ledger.holder("n1", 1), Some("a"));
    assert_eq!(ledger.holder("n1", 2), Some("b"), "the later pod keeps the GPU nobody else holds");
    assert_eq!(problems.len(), 3, "{problems:?}");
    assert!(matches!(&problems[0], LedgerProblem::Conflict(Conflict::IndexHeld { pod_uid, .. }) if pod_uid == "b"));
    assert!(matches!(&problems[1], LedgerProblem::BadAnnotation { uid, .. } if uid == "c"));
    assert!(matches!(&problems[2], LedgerProblem::NoNode { uid } if uid == "d"));
    assert_eq!(problems.iter().map(LedgerProblem::pod_uid).collect::<Vec<_>>(), ["b", "c", "d"]);
}

#[test]
fn a_claim_spelled_with_spaces_is_held() {
    let (ledger, problems) = Ledger::rebuild([record("n1", "a", Some("0, 1"), PodPhase::Running)]);
    assert_eq!(problems, vec![]);
    assert_eq!(ledger.used_mask("n1"), set(&[0, 1]));
}

#[test]
fn conflicts_go_to_the_older_pod_whatever_the_order() {
    let old = created(record("n1", "z-old", Some("0"), PodPhase::Running), 100);
    let new = created(record("n1", "a-new", Some("0"), PodPhase::Running), 200);
    for pods in [[old, new], [new, old]] {
        let (ledger, problems) = Ledger::rebuild(pods);
        assert_eq!(ledger.holder("n1", 0), Some("z-old"));
        assert!(
            matches!(&problems[..], [LedgerProblem::Conflict(Conflict::IndexHeld { pod_uid, .. })] if pod_uid == "a-new")
        );
    }
    // Created in the same second: the lower uid wins; without a creation time, last.
    let twin = created(record("n1", "b", Some("0"), PodPhase::Running), 100);
    let unknown = PodRecord { created: None, ..record("n1", "0", Some("0"), PodPhase::Running) };
    for pods in [[twin, old, unknown], [unknown, twin, old], [old, unknown, twin]] {
        assert_eq!(Ledger::rebuild(pods).0.holder("n1", 0), Some("b"));
    }
}

#[test]
fn what_a_node_confirmed_outranks_an_older_plan() {
    // The older pod's plan names GPU 0, but kubelet gave GPU 0 to the younger one.
    let planned = created(record("n1", "old", Some("0,1"), PodPhase::Pending), 100);
    let given = PodRecord { confirmed: true, ..created(record("n1", "young", Some("0,2"), PodPhase::Running), 200) };
    for pods in [[planned, given], [given, planned]] {
        let (ledger, problems) = Ledger::rebuild(pods);
        assert_eq!(ledger.holder("n1", 0), Some("young"));
        assert_eq!(ledger.claim("old").map(|c| c.gpus), Some(set(&[1])));
        assert!(
            matches!(&problems[..], [LedgerProblem::Conflict(Conflict::IndexHeld { pod_uid, .. })] if pod_uid == "old")
        );
    }
}

#[test]
fn indices_beyond_the_node_stay_held_and_are_reported() {
    // The node had 8 GPUs and has 4 now; the pod holding GPU 6 still runs.
    let pod = PodRecord { node_gpus: 4, ..record("n1", "a", Some("1,6"), PodPhase::Running) };
    let (ledger, problems) = Ledger::rebuild([pod]);
    assert_eq!(ledger.used_mask("n1"), set(&[1, 6]));
    assert_eq!(
        problems,
        vec![LedgerProblem::BeyondNode { uid: "a".into(), node: "n1".into(), beyond: set(&[6]), count: 4 }]
    );
    // Nobody else is given GPU 6 when it comes back.
    let back = created(record("n1", "b", Some("6"), PodPhase::Running), 10);
    let (ledger, problems) = Ledger::rebuild([pod, back]);
    assert_eq!(ledger.holder("n1", 6), Some("a"));
    assert!(matches!(&problems[1], LedgerProblem::Conflict(Conflict::IndexHeld { pod_uid, .. }) if pod_uid == "b"));
    // A node without GPUs at all: still held.
    let gone = PodRecord { node_gpus: 0, ..pod };
    assert_eq!(Ledger::rebuild([gone]).0.used_mask("n1"), set(&[1, 6]));
}

#[test]
fn a_terminating_pod_keeps_its_gpus_until_it_is_finished() {
    let running = record("n1", "a", Some("0,1"), PodPhase::Running);
    let terminating = PodRecord { terminating: true, ..running };
    let (ledger, problems) = Ledger::rebuild([terminating]);
    assert_eq!(problems, vec![]);
    assert_eq!(ledger.used_mask("n1"), set(&[0, 1]), "in its grace period, the pod still runs");
    let done = PodRecord { phase: PodPhase::Succeeded, ..terminating };
    assert_eq!(Ledger::rebuild([done]).0, Ledger::new());
    // Pinned by admission but deleted before it was bound: it never starts.
    let pinned = PodRecord { bound: false, phase: PodPhase::Pending, ..terminating };
    assert_eq!(Ledger::rebuild([pinned]).0, Ledger::new());
    assert_eq!(Ledger::rebuild([PodRecord { terminating: false, ..pinned }]).0.used_mask("n1"), set(&[0, 1]));
}

#[derive(Clone, Debug)]
enum Op {
    Assign { node: usize, pod: usize, gpus: u8 },
    Release { pod: usize },
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        3 => (0usize..3, 0usize..12, any::<u8>())
            .prop_map(|(node, pod, gpus)| Op::Assign { node, pod, gpus }),
        1 => (0usize..12).prop_map(|pod| Op::Release { pod }),
    ];
    prop::collection::vec(op, 0..80)
}

const NODES: [&str; 3] = ["n0", "n1", "n2"];

fn run(ops: &[Op]) -> Result<Ledger, TestCaseError> {
    let mut l = Ledger::new();
    for op in ops {
        let before = l.clone();
        match *op {
            Op::Assign { node, pod, gpus } => {
                let gpus = GpuSet::from_bits(u64::from(gpus));
                match l.assign(NODES[node], PODS[pod], gpus) {
                    Ok(()) if gpus.is_empty() => prop_assert_eq!(&l, &before),
                    Ok(()) => prop_assert_eq!(l.claim(PODS[pod]), Some(&Claim { node: NODES[node].into(), gpus })),
                    Err(_) => prop_assert_eq!(&l, &before),
                }
            }
            Op::Release { pod } => {
                let freed = l.release(PODS[pod]);
                prop_assert_eq!(freed.is_some(), before.claim(PODS[pod]).is_some());
            }
        }
        // No GPU is ever held twice, and the per-node masks agree with the claims.
        for node in NODES {
            let mut union = GpuSet::EMPTY;
            for (_, c) in l.claims().filter(|(_, c)| c.node == node) {
                prop_assert!(union.is_disjoint(c.gpus), "GPU handed out twice on {}", node);
                union = union.union(c.gpus);
            }
            prop_assert_eq!(l.used_mask(node), union);
        }
    }
    Ok(l)
}

proptest! {
    #[test]
    fn no_index_is_ever_handed_out_twice(ops in ops()) {
        run(&ops)?;
    }

    #[test]
    fn ledger_rebuilt_from_annotations_equals_the_ledger_before_restart(
        ops in ops(), finished in prop::collection::vec((0usize..3, any::<u8>(), any::<bool>()), 0..6),
    ) {
        let ledger = run(&ops)?;
        let annotations: Vec<(String, String, String)> = ledger
            .claims()
            .map(|(uid, c)| (c.node.clone(), uid.to_string(), format_indices(c.gpus)))
            .collect();
        let done: Vec<(String, String, String, PodPhase)> = finished
            .iter()
            .enumerate()
            .filter(|(_, (_, gpus, _))| *gpus != 0)
            .map(|(i, (node, gpus, ok))| {
                let phase = if *ok { PodPhase::Succeeded } else { PodPhase::Failed };
                let gpus = format_indices(GpuSet::from_bits(u64::from(*gpus)));
                (NODES[*node].to_string(), format!("done{i}"), gpus, phase)
            })
            .collect();
        // Finished pods still carry annotations that overlap live ones: they must not count.
        let records = done
            .iter()
            .map(|(n, u, a, p)| record(n, u, Some(a), *p))
            .chain(annotations.iter().map(|(n, u, a)| record(n, u, Some(a), PodPhase::Running)))
            .chain([record("n0", "no-gpus", None, PodPhase::Running)]);
        let (rebuilt, problems) = Ledger::rebuild(records);
        prop_assert_eq!(problems, vec![]);
        prop_assert_eq!(rebuilt, ledger);
    }

    /// The ledger does not depend on the order the API lists pods in.
    #[test]
    fn rebuild_is_the_same_in_any_order(
        pods in prop::collection::vec((0usize..2, any::<u8>(), 0i64..4, any::<bool>()), 1..10),
        seed in any::<u64>(),
    ) {
        let uids: Vec<String> = (0..pods.len()).map(|i| format!("p{i}")).collect();
        let values: Vec<String> = pods.iter().map(|(_, gpus, _, _)| format_indices(GpuSet::from_bits(u64::from(*gpus) | 1))).collect();
        let records: Vec<PodRecord<'_>> = pods
            .iter()
            .enumerate()
            .map(|(i, (node, _, secs, terminating))| PodRecord {
                terminating: *terminating,
                ..created(record(NODES[*node], &uids[i], Some(&values[i]), PodPhase::Running), *secs)
            })
            .collect();
        let mut shuffled = records.clone();
        let mut state = seed | 1;
        for i in (1..shuffled.len()).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            shuffled.swap(i, (state % (i as u64 + 1)) as usize);
        }
        let (a, pa) = Ledger::rebuild(records);
        let (b, pb) = Ledger::rebuild(shuffled);
        prop_assert_eq!(a, b);
        prop_assert_eq!(pa, pb);
    }
}

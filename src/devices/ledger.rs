//! The GPU ledger: which GPU index on which node belongs to which pod, and the
//! `gpu.muster.dev/indices` annotation it is rebuilt from. Plain data in, conflicts out as
//! values; watching pods and writing annotations is the device reconciler's job.

use std::collections::BTreeMap;

use super::gpuset::{GpuSet, MAX_GPUS};

/// A pod's phase, as far as GPU ownership cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodPhase {
    /// Not yet running (includes gated and unbound pods).
    Pending,
    /// Running.
    Running,
    /// All containers ended successfully: its GPUs are free.
    Succeeded,
    /// All containers ended, one failed: its GPUs are free.
    Failed,
    /// The kubelet cannot be reached; the pod may still use its GPUs.
    Unknown,
}

impl PodPhase {
    /// The phase from `status.phase`; absent (a pod just created) is `Pending`, anything
    /// unrecognised is `Unknown`, which keeps GPUs held rather than risk a double assignment.
    pub fn from_status(phase: Option<&str>) -> Self {
        match phase {
            None | Some("Pending") => PodPhase::Pending,
            Some("Running") => PodPhase::Running,
            Some("Succeeded") => PodPhase::Succeeded,
            Some("Failed") => PodPhase::Failed,
            Some(_) => PodPhase::Unknown,
        }
    }

    /// Whether the pod has finished and no longer holds GPUs.
    pub fn is_terminal(self) -> bool {
        matches!(self, PodPhase::Succeeded | PodPhase::Failed)
    }
}

/// Why a `gpu.muster.dev/indices` value is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IndicesError {
    /// The value is empty.
    #[error("no GPU indices")]
    Empty,
    /// An element that is not a plain decimal number (signs, spaces, leading zeros refused).
    #[error("{0:?} is not a GPU index")]
    BadIndex(String),
    /// The same index twice.
    #[error("GPU index {0} listed twice")]
    Duplicate(usize),
    /// Indices not in ascending order.
    #[error("GPU index {next} follows {prev}: indices must be ascending")]
    NotAscending {
        /// The earlier index.
        prev: usize,
        /// The index after it.
        next: usize,
    },
    /// An index the node does not have.
    #[error("GPU index {index} out of range: the node has {count} GPUs")]
    OutOfRange {
        /// The index.
        index: usize,
        /// GPUs on the node.
        count: usize,
    },
}

/// Parses an annotation value such as `0,1,4,5` for a node with `gpu_count` GPUs.
///
/// Strict, so that exactly one spelling exists for each set: `format_indices(parse(s)) == s`.
pub fn parse_indices(value: &str, gpu_count: usize) -> Result<GpuSet, IndicesError> {
    if value.is_empty() {
        return Err(IndicesError::Empty);
    }
    let count = gpu_count.min(MAX_GPUS);
    let mut set = GpuSet::EMPTY;
    let mut prev: Option<usize> = None;
    for token in value.split(',') {
        let canonical =
            !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit()) && (token == "0" || !token.starts_with('0'));
        let index = canonical
            .then(|| token.parse::<usize>().ok())
            .flatten()
            .ok_or_else(|| IndicesError::BadIndex(token.to_string()))?;
        match prev {
            Some(p) if p == index => return Err(IndicesError::Duplicate(index)),
            Some(p) if p > index => {
                return Err(IndicesError::NotAscending { prev: p, next: index });
            }
            _ => {}
        }
        if index >= count {
            return Err(IndicesError::OutOfRange { index, count: gpu_count });
        }
        set = set.with(index).ok_or(IndicesError::OutOfRange { index, count: gpu_count })?;
        prev = Some(index);
    }
    Ok(set)
}

/// The annotation value for `set`: ascending, comma separated.
pub fn format_indices(set: GpuSet) -> String {
    set.to_string()
}

/// GPUs held by one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// The node the GPUs are on.
    pub node: String,
    /// The GPU indices.
    pub gpus: GpuSet,
}

/// An assignment the ledger refused; nothing was recorded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Conflict {
    /// Some of the GPUs belong to other live pods.
    #[error("pod {pod_uid} claims GPUs {wanted} on node {node}, but {}", describe_held(held))]
    IndexHeld {
        /// The node.
        node: String,
        /// The pod that asked.
        pod_uid: String,
        /// What it asked for.
        wanted: GpuSet,
        /// Each contested index with the pod holding it.
        held: Vec<(usize, String)>,
    },
    /// The pod already holds a different set of GPUs (a pod's GPUs never move).
    #[error(
        "pod {pod_uid} claims GPUs {wanted} on node {node} but already holds {} on node {}",
        held.gpus,
        held.node
    )]
    AlreadyAssigned {
        /// The node asked for.
        node: String,
        /// The pod.
        pod_uid: String,
        /// What it asked for.
        wanted: GpuSet,
        /// What it holds.
        held: Claim,
    },
}

fn describe_held(held: &[(usize, String)]) -> String {
    let parts: Vec<String> = held.iter().map(|(i, uid)| format!("GPU {i} is held by pod {uid}")).collect();
    parts.join(", ")
}

/// One pod as the ledger sees it when (re)built from the API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodRecord<'a> {
    /// The node the pod is bound or pinned to.
    pub node: &'a str,
    /// `metadata.uid`.
    pub uid: &'a str,
    /// The `gpu.muster.dev/indices` annotation, if set.
    pub indices: Option<&'a str>,
    /// `status.phase`.
    pub phase: PodPhase,
    /// GPUs on the node, for the range check of `indices`.
    pub node_gpus: usize,
}

/// What the ledger could not accept from a pod record.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LedgerProblem {
    /// Two live pods claim the same GPU (or one pod two sets); the later record lost.
    #[error(transparent)]
    Conflict(#[from] Conflict),
    /// The annotation does not parse; the pod holds nothing in the ledger.
    #[error("pod {uid} on node {node}: gpu.muster.dev/indices: {error}")]
    BadAnnotation {
        /// The pod.
        uid: String,
        /// Its node.
        node: String,
        /// Why the value was refused.
        error: IndicesError,
    },
    /// A pod with GPU indices but no node.
    #[error("pod {uid} has gpu.muster.dev/indices but no node")]
    NoNode {
        /// The pod.
        uid: String,
    },
}

/// Which GPUs each live pod holds, per node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    claims: BTreeMap<String, Claim>,
    /// node -> GPU index -> pod uid; the inverse of `claims`, kept for conflict lookups.
    owners: BTreeMap<String, BTreeMap<usize, String>>,
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Self {
        Ledger::default()
    }

    /// Records that `pod_uid` holds `gpus` on `node`, unless another pod holds one of them or
    /// the pod already holds a different set. Repeating an assignment is harmless.
    pub fn assign(&mut self, node: &str, pod_uid: &str, gpus: GpuSet) -> Result<(), Conflict> {
        if let Some(held) = self.claims.get(pod_uid) {
            if held.node == node && held.gpus == gpus {
                return Ok(());
            }
            return Err(Conflict::AlreadyAssigned {
                node: node.to_string(),
                pod_uid: pod_uid.to_string(),
                wanted: gpus,
                held: held.clone(),
            });
        }
        if gpus.is_empty() {
            return Ok(());
        }
        let owners = self.owners.get(node);
        let held: Vec<(usize, String)> =
            gpus.iter().filter_map(|i| owners.and_then(|o| o.get(&i)).map(|uid| (i, uid.clone()))).collect();
        if !held.is_empty() {
            return Err(Conflict::IndexHeld {
                node: node.to_string(),
                pod_uid: pod_uid.to_string(),
                wanted: gpus,
                held,
            });
        }
        let owners = self.owners.entry(node.to_string()).or_default();
        for i in gpus {
            owners.insert(i, pod_uid.to_string());
        }
        self.claims.insert(pod_uid.to_string(), Claim { node: node.to_string(), gpus });
        Ok(())
    }

    /// Frees the GPUs of `pod_uid` (finished or deleted) and returns what it held.
    pub fn release(&mut self, pod_uid: &str) -> Option<Claim> {
        let claim = self.claims.remove(pod_uid)?;
        if let Some(owners) = self.owners.get_mut(&claim.node) {
            for i in claim.gpus {
                owners.remove(&i);
            }
            if owners.is_empty() {
                self.owners.remove(&claim.node);
            }
        }
        Some(claim)
    }

    /// GPUs of `node` held by some pod.
    pub fn used_mask(&self, node: &str) -> GpuSet {
        self.owners
            .get(node)
            .map_or(GpuSet::EMPTY, |o| o.keys().fold(GpuSet::EMPTY, |set, &i| set.with(i).unwrap_or(set)))
    }

    /// What `pod_uid` holds.
    pub fn claim(&self, pod_uid: &str) -> Option<&Claim> {
        self.claims.get(pod_uid)
    }

    /// The pod holding GPU `index` of `node`.
    pub fn holder(&self, node: &str, index: usize) -> Option<&str> {
        self.owners.get(node).and_then(|o| o.get(&index)).map(String::as_str)
    }

    /// Every claim, by pod uid.
    pub fn claims(&self) -> impl Iterator<Item = (&str, &Claim)> {
        self.claims.iter().map(|(uid, c)| (uid.as_str(), c))
    }

    /// Applies what one pod's current state says: a finished pod frees its GPUs, a live pod
    /// with an annotation claims them. A live pod without the annotation changes nothing, so a
    /// claim made at admission survives until its patch shows up.
    pub fn observe(&mut self, pod: PodRecord<'_>) -> Result<(), LedgerProblem> {
        if pod.phase.is_terminal() {
            self.release(pod.uid);
            return Ok(());
        }
        let Some(value) = pod.indices else {
            return Ok(());
        };
        if pod.node.is_empty() {
            return Err(LedgerProblem::NoNode { uid: pod.uid.to_string() });
        }
        let gpus = parse_indices(value, pod.node_gpus).map_err(|error| LedgerProblem::BadAnnotation {
            uid: pod.uid.to_string(),
            node: pod.node.to_string(),
            error,
        })?;
        Ok(self.assign(pod.node, pod.uid, gpus)?)
    }

    /// The ledger of the given pods (the live ones of the API), and every problem met.
    /// On a conflict the earlier record keeps the GPUs: pass pods oldest first.
    pub fn rebuild<'a>(pods: impl IntoIterator<Item = PodRecord<'a>>) -> (Ledger, Vec<LedgerProblem>) {
        let mut ledger = Ledger::new();
        let problems = pods.into_iter().filter_map(|p| ledger.observe(p).err()).collect();
        (ledger, problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn set(indices: &[usize]) -> GpuSet {
        GpuSet::from_indices(indices.iter().copied()).unwrap_or_default()
    }

    fn record<'a>(node: &'a str, uid: &'a str, indices: Option<&'a str>, phase: PodPhase) -> PodRecord<'a> {
        PodRecord { node, uid, indices, phase, node_gpus: 8 }
    }

    #[test]
    fn annotation_rules() {
        let cases: &[(&str, &str, Result<GpuSet, IndicesError>)] = &[
            ("ascending list", "0,1,4,5", Ok(set(&[0, 1, 4, 5]))),
            ("single index", "7", Ok(set(&[7]))),
            ("empty value", "", Err(IndicesError::Empty)),
            ("empty element", "0,,1", Err(IndicesError::BadIndex(String::new()))),
            ("trailing comma", "0,", Err(IndicesError::BadIndex(String::new()))),
            ("space", "0, 1", Err(IndicesError::BadIndex(" 1".into()))),
            ("sign", "+1", Err(IndicesError::BadIndex("+1".into()))),
            ("leading zero", "01", Err(IndicesError::BadIndex("01".into()))),
            ("not a number", "a", Err(IndicesError::BadIndex("a".into()))),
            ("overflow", "99999999999999999999999", Err(IndicesError::BadIndex("99999999999999999999999".into()))),
            ("duplicate", "1,1", Err(IndicesError::Duplicate(1))),
            ("descending", "4,1", Err(IndicesError::NotAscending { prev: 4, next: 1 })),
            ("out of range", "0,8", Err(IndicesError::OutOfRange { index: 8, count: 8 })),
        ];
        for (rule, value, want) in cases {
            assert_eq!(&parse_indices(value, 8), want, "{rule}");
        }
        assert_eq!(parse_indices("70", 100), Err(IndicesError::OutOfRange { index: 70, count: 100 }));
        assert_eq!(format_indices(set(&[5, 0, 1, 4])), "0,1,4,5");
    }

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
        assert_eq!(l.observe(record("n1", "a", Some("0,1"), PodPhase::Running)), Ok(()));
        assert_eq!(l.observe(record("n1", "a", Some("0,1"), PodPhase::Succeeded)), Ok(()));
        assert_eq!(l.used_mask("n1"), GpuSet::EMPTY);
        assert_eq!(l.observe(record("n1", "b", Some("0"), PodPhase::Running)), Ok(()));
        assert_eq!(l.observe(record("n1", "b", Some("0"), PodPhase::Failed)), Ok(()));
        assert_eq!(l, Ledger::new());
    }

    #[test]
    fn live_pod_without_annotation_keeps_an_admission_claim() {
        let mut l = Ledger::new();
        assert_eq!(l.assign("n1", "a", set(&[2])), Ok(()));
        assert_eq!(l.observe(record("n1", "a", None, PodPhase::Pending)), Ok(()));
        assert_eq!(l.used_mask("n1"), set(&[2]));
    }

    #[test]
    fn rebuild_reports_conflicts_and_bad_annotations() {
        let pods = [
            record("n1", "a", Some("0,1"), PodPhase::Running),
            record("n1", "b", Some("1,2"), PodPhase::Running),
            record("n1", "c", Some("1,0"), PodPhase::Pending),
            record("", "d", Some("3"), PodPhase::Pending),
            record("n1", "e", Some("1"), PodPhase::Succeeded),
            record("n1", "f", None, PodPhase::Running),
            record("n1", "g", Some("5"), PodPhase::from_status(Some("Weird"))),
        ];
        let (ledger, problems) = Ledger::rebuild(pods);
        assert_eq!(ledger.used_mask("n1"), set(&[0, 1, 5]));
        assert_eq!(ledger.holder("n1", 1), Some("a"));
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(matches!(&problems[0], LedgerProblem::Conflict(Conflict::IndexHeld { pod_uid, .. }) if pod_uid == "b"));
        assert!(matches!(&problems[1], LedgerProblem::BadAnnotation { uid, .. } if uid == "c"));
        assert!(matches!(&problems[2], LedgerProblem::NoNode { uid } if uid == "d"));
    }

    #[test]
    fn phases_from_status() {
        assert_eq!(PodPhase::from_status(None), PodPhase::Pending);
        assert_eq!(PodPhase::from_status(Some("Running")), PodPhase::Running);
        assert!(PodPhase::from_status(Some("Succeeded")).is_terminal());
        assert!(PodPhase::from_status(Some("Failed")).is_terminal());
        assert!(!PodPhase::from_status(Some("Unknown")).is_terminal());
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
    const PODS: [&str; 12] = ["p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7", "p8", "p9", "p10", "p11"];

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

        #[test]
        fn indices_round_trip_and_never_panic(bits in 1u64.., junk in ".*") {
            let set = GpuSet::from_bits(bits);
            prop_assert_eq!(parse_indices(&format_indices(set), 64), Ok(set));
            let _ = parse_indices(&junk, 64);
        }
    }
}

//! The GPU ledger: which GPU index on which node belongs to which pod, and the
//! `gpu.muster.dev/indices` annotation it is rebuilt from. Plain data in, problems out as
//! values; watching pods and writing annotations is the device reconciler's job.
//!
//! The ledger errs on the side of holding: a live pod keeps every GPU its annotation names
//! unless an older live pod holds it, even when the node no longer has that index, so a GPU
//! is never offered to a second pod while the first may still use it.

use std::collections::HashMap;

use k8s_openapi::jiff::Timestamp;

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

impl From<crate::pods::Lifecycle> for PodPhase {
    fn from(l: crate::pods::Lifecycle) -> Self {
        use crate::pods::Lifecycle;
        match l {
            Lifecycle::Pending => PodPhase::Pending,
            Lifecycle::Running => PodPhase::Running,
            Lifecycle::Succeeded => PodPhase::Succeeded,
            Lifecycle::Failed => PodPhase::Failed,
            Lifecycle::Unknown => PodPhase::Unknown,
        }
    }
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

/// Why a `gpu.muster.dev/indices` value cannot be read at all.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IndicesError {
    /// The value is empty or only whitespace.
    #[error("no GPU indices")]
    Empty,
    /// An element that is not a decimal number: empty (`0,,1`, `0,`), signed, or not digits.
    #[error("{0:?} is not a GPU index")]
    BadIndex(String),
    /// A number no node can have as a GPU index (64 or more).
    #[error("GPU index {0} is beyond the {MAX_GPUS} GPUs a node may have")]
    TooLarge(String),
}

/// Reads a `gpu.muster.dev/indices` value such as `0,1,4,5`: the one parser of the annotation,
/// for the ledger, admission and the tools alike.
///
/// The value names a set of GPU indices. Muster always writes the canonical spelling
/// ([`format_indices`]: ascending, comma separated, no spaces, no repeats), but a value read
/// from a live pod may have been written by hand or by another tool, and a pod must not lose
/// its claim over spelling. So, besides the canonical form, this accepts:
/// - ASCII whitespace around the value and around each element (`" 0, 1 "` is `0,1`);
/// - leading zeros (`01` is `1`);
/// - any order and repeats (`4,1,1` is `1,4`).
///
/// Refused, because nothing sure can be read from them: an empty value, an empty element
/// (`0,,1`, `0,`), anything but decimal digits in an element (`+1`, `0x1`, `a`), and indices of
/// 64 or more. Whether the node has the indices is not checked here (see [`Ledger::observe`]).
pub fn parse_indices(value: &str) -> Result<GpuSet, IndicesError> {
    let value = value.trim_ascii();
    if value.is_empty() {
        return Err(IndicesError::Empty);
    }
    let mut set = GpuSet::EMPTY;
    for element in value.split(',') {
        let token = element.trim_ascii();
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_digit()) {
            return Err(IndicesError::BadIndex(element.to_string()));
        }
        let digits = token.trim_start_matches('0');
        let index = if digits.is_empty() { Some(0) } else { digits.parse::<usize>().ok() };
        set = index
            .and_then(|i| set.with(i))
            .ok_or_else(|| IndicesError::TooLarge(if digits.is_empty() { "0" } else { digits }.to_string()))?;
    }
    Ok(set)
}

/// The annotation value for `set`: ascending, comma separated (the canonical spelling).
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
    /// `metadata.creationTimestamp`: of two live pods claiming one GPU, the older keeps it.
    pub created: Option<Timestamp>,
    /// The `gpu.muster.dev/indices` annotation, if set.
    pub indices: Option<&'a str>,
    /// `status.phase`.
    pub phase: PodPhase,
    /// Bound to `node` (`spec.nodeName`), not only pinned there by admission.
    pub bound: bool,
    /// `metadata.deletionTimestamp` is set: the pod is in its grace period.
    pub terminating: bool,
    /// GPUs on the node, for the range check of `indices`.
    pub node_gpus: usize,
    /// `indices` are what the node gave the pod (kubelet's PodResources read back, or an
    /// allocated DRA claim), not a plan: in a conflict they outrank every plan, whatever the
    /// pods' ages, because the containers hold those GPUs.
    pub confirmed: bool,
}

impl PodRecord<'_> {
    /// Whether the pod holds GPUs: it is not finished, and it runs or may still run. A pod in
    /// its grace period still runs (preStop hooks, checkpoint flushes) until it is gone or
    /// finished; one deleted before it was bound never starts (kube-scheduler skips it).
    pub fn holds_gpus(&self) -> bool {
        !self.phase.is_terminal() && (self.bound || !self.terminating)
    }

    /// The order conflicts are resolved in: what a node confirmed first, then older pods,
    /// then by uid; a pod without a creation time (never one from the API) last.
    fn seniority(&self) -> (bool, bool, Option<Timestamp>, &str) {
        (!self.confirmed, self.created.is_none(), self.created, self.uid)
    }
}

/// What the ledger could not take as it stands from a pod record.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LedgerProblem {
    /// Two live pods claim the same GPU: the older keeps it, the later pod keeps only the GPUs
    /// nobody else holds.
    #[error(transparent)]
    Conflict(#[from] Conflict),
    /// The annotation cannot be read at all; the pod holds nothing in the ledger.
    #[error("pod {uid} on node {node}: gpu.muster.dev/indices: {error}")]
    BadAnnotation {
        /// The pod.
        uid: String,
        /// Its node.
        node: String,
        /// Why the value was refused.
        error: IndicesError,
    },
    /// The annotation names GPUs the node does not have (now): they stay held by the pod, so
    /// nothing else is given them should they come back.
    #[error("pod {uid} holds GPU indices {beyond} on node {node}, which has {count} GPUs now; they stay held")]
    BeyondNode {
        /// The pod.
        uid: String,
        /// Its node.
        node: String,
        /// The indices the node does not have.
        beyond: GpuSet,
        /// GPUs on the node.
        count: usize,
    },
    /// A pod with GPU indices but no node.
    #[error("pod {uid} has gpu.muster.dev/indices but no node")]
    NoNode {
        /// The pod.
        uid: String,
    },
}

impl LedgerProblem {
    /// The pod the problem is about.
    pub fn pod_uid(&self) -> &str {
        match self {
            LedgerProblem::Conflict(
                Conflict::IndexHeld { pod_uid, .. } | Conflict::AlreadyAssigned { pod_uid, .. },
            ) => pod_uid,
            LedgerProblem::BadAnnotation { uid, .. }
            | LedgerProblem::BeyondNode { uid, .. }
            | LedgerProblem::NoNode { uid } => uid,
        }
    }
}

/// Which GPUs each live pod holds, per node.
///
/// Hash maps, not ordered ones: the GPU pass rebuilds the ledger of every GPU pod of the
/// cluster each admission cycle (10,000 pods at 5,000 nodes), and ordered maps keyed by UIDs
/// and node names spent most of that comparing strings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    claims: HashMap<String, Claim>,
    /// node -> who holds which of its GPUs; the inverse of `claims`, kept for conflict lookups.
    owners: HashMap<String, Holders>,
}

/// The holders of one node's GPUs: the union of their indices, and each index with its pod,
/// ascending by index (so equal ledgers compare equal whatever order they were built in).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Holders {
    used: GpuSet,
    by_index: Vec<(usize, String)>,
}

impl Holders {
    fn holder(&self, index: usize) -> Option<&str> {
        if !self.used.contains(index) {
            return None;
        }
        self.by_index.iter().find(|(i, _)| *i == index).map(|(_, uid)| uid.as_str())
    }

    fn hold(&mut self, gpus: GpuSet, uid: &str) {
        self.used = self.used.union(gpus);
        for i in gpus {
            let at = self.by_index.partition_point(|(j, _)| *j < i);
            self.by_index.insert(at, (i, uid.to_string()));
        }
    }

    fn free(&mut self, gpus: GpuSet) {
        self.used = self.used.difference(gpus);
        self.by_index.retain(|(i, _)| !gpus.contains(*i));
    }
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
        if let Some(owners) = owners.filter(|o| !o.used.is_disjoint(gpus)) {
            let held: Vec<(usize, String)> =
                gpus.iter().filter_map(|i| owners.holder(i).map(|uid| (i, uid.to_string()))).collect();
            return Err(Conflict::IndexHeld {
                node: node.to_string(),
                pod_uid: pod_uid.to_string(),
                wanted: gpus,
                held,
            });
        }
        match self.owners.get_mut(node) {
            Some(owners) => owners.hold(gpus, pod_uid),
            None => {
                let mut owners = Holders::default();
                owners.hold(gpus, pod_uid);
                self.owners.insert(node.to_string(), owners);
            }
        }
        self.claims.insert(pod_uid.to_string(), Claim { node: node.to_string(), gpus });
        Ok(())
    }

    /// Frees the GPUs of `pod_uid` (finished or deleted) and returns what it held.
    pub fn release(&mut self, pod_uid: &str) -> Option<Claim> {
        let claim = self.claims.remove(pod_uid)?;
        if let Some(owners) = self.owners.get_mut(&claim.node) {
            owners.free(claim.gpus);
            if owners.by_index.is_empty() {
                self.owners.remove(&claim.node);
            }
        }
        Some(claim)
    }

    /// GPUs of `node` held by some pod.
    pub fn used_mask(&self, node: &str) -> GpuSet {
        self.owners.get(node).map_or(GpuSet::EMPTY, |o| o.used)
    }

    /// What `pod_uid` holds.
    pub fn claim(&self, pod_uid: &str) -> Option<&Claim> {
        self.claims.get(pod_uid)
    }

    /// The pod holding GPU `index` of `node`.
    pub fn holder(&self, node: &str, index: usize) -> Option<&str> {
        self.owners.get(node).and_then(|o| o.holder(index))
    }

    /// Every claim, by pod uid (in no particular order).
    pub fn claims(&self) -> impl Iterator<Item = (&str, &Claim)> {
        self.claims.iter().map(|(uid, c)| (uid.as_str(), c))
    }

    /// Applies what one pod's current state says: a pod that no longer holds GPUs (finished,
    /// or deleted before it was bound) frees them; a live pod with an annotation claims every
    /// GPU it names that no other pod holds. A live pod without the annotation changes
    /// nothing, so a claim made at admission survives until its patch shows up. Returns what
    /// is wrong with the record; a problem never costs the pod a GPU it could keep.
    pub fn observe(&mut self, pod: PodRecord<'_>) -> Vec<LedgerProblem> {
        if !pod.holds_gpus() {
            self.release(pod.uid);
            return Vec::new();
        }
        let Some(value) = pod.indices else {
            return Vec::new();
        };
        if pod.node.is_empty() {
            return vec![LedgerProblem::NoNode { uid: pod.uid.to_string() }];
        }
        let gpus = match parse_indices(value) {
            Ok(gpus) => gpus,
            Err(error) => {
                let (uid, node) = (pod.uid.to_string(), pod.node.to_string());
                return vec![LedgerProblem::BadAnnotation { uid, node, error }];
            }
        };
        let mut problems = Vec::new();
        let count = pod.node_gpus.min(MAX_GPUS);
        let beyond = gpus.difference(GpuSet::first(count));
        if !beyond.is_empty() {
            let (uid, node) = (pod.uid.to_string(), pod.node.to_string());
            problems.push(LedgerProblem::BeyondNode { uid, node, beyond, count: pod.node_gpus });
        }
        match self.assign(pod.node, pod.uid, gpus) {
            Ok(()) => {}
            Err(conflict) => {
                if let Conflict::IndexHeld { held, .. } = &conflict {
                    let contested = GpuSet::from_indices(held.iter().map(|(i, _)| *i)).unwrap_or(gpus);
                    // Disjoint from every other claim by construction, so this cannot fail.
                    let _ = self.assign(pod.node, pod.uid, gpus.difference(contested));
                }
                problems.push(conflict.into());
            }
        }
        problems
    }

    /// The ledger of the given pods (the live ones of the API), and every problem met.
    /// Records are taken oldest first whatever order they come in, so the same pods always
    /// give the same ledger: on a conflict the older pod keeps the GPU, then the lower uid.
    pub fn rebuild<'a>(pods: impl IntoIterator<Item = PodRecord<'a>>) -> (Ledger, Vec<LedgerProblem>) {
        let mut pods: Vec<PodRecord<'a>> = pods.into_iter().collect();
        pods.sort_by(|a, b| a.seniority().cmp(&b.seniority()));
        let mut ledger =
            Ledger { claims: HashMap::with_capacity(pods.len()), owners: HashMap::with_capacity(pods.len()) };
        let problems = pods.into_iter().flat_map(|p| ledger.observe(p)).collect();
        (ledger, problems)
    }
}

/// The ledger kept across passes: each node's part is built again only when the records of
/// the pods on it changed (a pod came, went, or its annotation, phase, binding, termination,
/// confirmation or its node's GPU count moved), so a pass over 10,000 GPU pods of which a
/// handful changed claims the GPUs of a handful of nodes, not of all.
///
/// Always equal to [`Ledger::rebuild`] of the same records (a property test checks it): the
/// claims of the pods on one node never touch another node's, and a node's records are
/// observed in the rebuild's order (oldest first, see `PodRecord::seniority`). Each record is a
/// different pod (UIDs are unique, as the API's are).
#[derive(Clone, Debug, Default)]
pub struct KeptLedger {
    ledger: Ledger,
    /// Per node (`""` for records without one): its pods' records as last observed, by UID,
    /// and the problems met then.
    nodes: HashMap<String, NodePart>,
}

#[derive(Clone, Debug, Default)]
struct NodePart {
    records: Vec<KeptRecord>,
    problems: Vec<LedgerProblem>,
}

/// A [`PodRecord`] kept between passes (its node is the part's).
#[derive(Clone, Debug, PartialEq, Eq)]
struct KeptRecord {
    uid: String,
    created: Option<Timestamp>,
    indices: Option<String>,
    phase: PodPhase,
    bound: bool,
    terminating: bool,
    node_gpus: usize,
    confirmed: bool,
}

impl KeptRecord {
    fn of(r: &PodRecord<'_>) -> Self {
        KeptRecord {
            uid: r.uid.to_string(),
            created: r.created,
            indices: r.indices.map(str::to_string),
            phase: r.phase,
            bound: r.bound,
            terminating: r.terminating,
            node_gpus: r.node_gpus,
            confirmed: r.confirmed,
        }
    }

    fn is(&self, r: &PodRecord<'_>) -> bool {
        self.uid == r.uid
            && self.created == r.created
            && self.indices.as_deref() == r.indices
            && self.phase == r.phase
            && self.bound == r.bound
            && self.terminating == r.terminating
            && self.node_gpus == r.node_gpus
            && self.confirmed == r.confirmed
    }
}

impl KeptLedger {
    /// Takes the records of every live pod now (as [`Ledger::rebuild`] would) and brings the
    /// ledger up to date with them: the nodes whose records changed since the last update are
    /// built again, the others kept. Returns how many nodes were built again.
    pub fn update<'a>(&mut self, pods: impl IntoIterator<Item = PodRecord<'a>>) -> usize {
        let mut by_node: HashMap<&'a str, Vec<PodRecord<'a>>> = HashMap::with_capacity(self.nodes.len());
        for pod in pods {
            by_node.entry(pod.node).or_default().push(pod);
        }
        for records in by_node.values_mut() {
            records.sort_unstable_by(|a, b| a.uid.cmp(b.uid));
        }
        let same = |part: &NodePart, now: &[PodRecord<'_>]| {
            part.records.len() == now.len() && part.records.iter().zip(now).all(|(kept, r)| kept.is(r))
        };
        let stale: Vec<String> = self
            .nodes
            .iter()
            .filter(|(node, part)| by_node.get(node.as_str()).is_none_or(|now| !same(part, now)))
            .map(|(node, _)| node.clone())
            .collect();
        // Every claim of the stale parts goes first: a pod that moved to another node claims
        // there only once it no longer holds GPUs here.
        for node in &stale {
            if let Some(part) = self.nodes.remove(node) {
                for kept in &part.records {
                    self.ledger.release(&kept.uid);
                }
            }
        }
        let mut built = 0;
        for (node, mut records) in by_node {
            if self.nodes.contains_key(node) {
                continue;
            }
            built += 1;
            let kept = records.iter().map(KeptRecord::of).collect();
            records.sort_by(|a, b| a.seniority().cmp(&b.seniority()));
            let problems = records.into_iter().flat_map(|p| self.ledger.observe(p)).collect();
            self.nodes.insert(node.to_string(), NodePart { records: kept, problems });
        }
        built
    }

    /// The ledger as of the last update.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Every problem met by the records of the last update (in no particular order).
    pub fn problems(&self) -> impl Iterator<Item = &LedgerProblem> {
        self.nodes.values().flat_map(|part| part.problems.iter())
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
        PodRecord {
            node,
            uid,
            created: Some(Timestamp::UNIX_EPOCH),
            indices,
            phase,
            bound: !node.is_empty(),
            terminating: false,
            node_gpus: 8,
            confirmed: false,
        }
    }

    fn created(record: PodRecord<'_>, secs: i64) -> PodRecord<'_> {
        PodRecord { created: Timestamp::from_second(secs).ok(), ..record }
    }

    #[test]
    fn annotation_spellings() {
        let cases: &[(&str, &str, Result<GpuSet, IndicesError>)] = &[
            ("canonical list", "0,1,4,5", Ok(set(&[0, 1, 4, 5]))),
            ("single index", "7", Ok(set(&[7]))),
            ("highest index", "63", Ok(set(&[63]))),
            ("space after a comma", "0, 1", Ok(set(&[0, 1]))),
            ("spaces and tabs everywhere", " 0 ,\t1 , 4 ", Ok(set(&[0, 1, 4]))),
            ("leading zero", "01", Ok(set(&[1]))),
            ("zero spelled long", "000", Ok(set(&[0]))),
            ("descending", "4,1", Ok(set(&[1, 4]))),
            ("repeated", "1,1", Ok(set(&[1]))),
            ("empty value", "", Err(IndicesError::Empty)),
            ("only whitespace", "  ", Err(IndicesError::Empty)),
            ("empty element", "0,,1", Err(IndicesError::BadIndex(String::new()))),
            ("trailing comma", "0,", Err(IndicesError::BadIndex(String::new()))),
            ("blank element", "0, ,1", Err(IndicesError::BadIndex(" ".into()))),
            ("sign", "+1", Err(IndicesError::BadIndex("+1".into()))),
            ("space inside a number", "1 2", Err(IndicesError::BadIndex("1 2".into()))),
            ("hex", "0x1", Err(IndicesError::BadIndex("0x1".into()))),
            ("not a number", "a", Err(IndicesError::BadIndex("a".into()))),
            ("non-ASCII digit", "\u{0661}", Err(IndicesError::BadIndex("\u{0661}".into()))),
            ("64 is beyond any node", "0,64", Err(IndicesError::TooLarge("64".into()))),
            ("overflow", "99999999999999999999999", Err(IndicesError::TooLarge("99999999999999999999999".into()))),
            ("overflow after zeros", "00070", Err(IndicesError::TooLarge("70".into()))),
        ];
        for (rule, value, want) in cases {
            assert_eq!(&parse_indices(value), want, "{rule}");
        }
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
        let given =
            PodRecord { confirmed: true, ..created(record("n1", "young", Some("0,2"), PodPhase::Running), 200) };
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
            prop_assert_eq!(parse_indices(&format_indices(set)), Ok(set));
            let _ = parse_indices(&junk);
        }

        /// Any spelling of a set (order, repeats, whitespace, leading zeros) reads as that set.
        #[test]
        fn every_spelling_of_a_set_reads_as_the_set(
            indices in prop::collection::vec((0usize..64, 0usize..3, prop::sample::select(vec!["", " ", "\t", "  "])), 1..12),
            ordered in any::<bool>(),
        ) {
            let mut indices = indices;
            if ordered {
                indices.sort();
            }
            let want = GpuSet::from_indices(indices.iter().map(|(i, _, _)| *i));
            let value: Vec<String> = indices.iter().map(|(i, zeros, pad)| format!("{pad}{}{i}{pad}", "0".repeat(*zeros))).collect();
            prop_assert_eq!(parse_indices(&value.join(",")).ok(), want);
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
}

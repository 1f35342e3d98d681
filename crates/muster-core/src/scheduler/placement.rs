//! Gang placement: one decision places a whole root on a snapshot (upstream's pod group
//! scheduling cycle with PlacementFeasible), all-or-nothing per gang, and returns a plan or an
//! explanation. Identical pods are placed by capacity arithmetic (how many fit on each node,
//! then fill nodes in score order), not by one search per pod. The snapshot is never changed:
//! tentative usage lives in an overlay with an undo log, so a failed gang releases what it took.
//!
//! What a decision guarantees (property-tested in `properties.rs`):
//! - no partial gang: a gang PodGroup in the plan has at least `minCount` pods placed or
//!   admitted before, a gang CompositePodGroup at least `minGroupCount` such children;
//! - no node over its allocatable in any resource, counting what it already runs, and no GPU
//!   index given twice or given while in use;
//! - a gang that fails leaves no trace: the plan is exactly the plan of the same root without
//!   that gang. Within a composite, gang children are tried before basic ones, so a basic
//!   group is only ever limited by gangs that succeed and by its own ancestors (a basic
//!   PodGroup under a gang composite that fails is rolled back with it).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::dra::SharedChoice;
use super::explain::{
    ChildrenUnplaced, DomainConflict, Explanation, ExplanationKind, FilterReason, PodsUnplaced, ReasonCount,
    TooFewPods, TopologyUnplaced,
};
use super::gpu::{GpuChoice, GpuChooser};
use super::quorum::{Quorum, QuorumShortfall, quorum};
use super::resources::{CPU, EPHEMERAL_STORAGE, MEMORY, Resources};
use super::shape::PodShape;
use super::snapshot::{NodeInfo, Snapshot, Unusable};
use super::tree::{CompositeGroup, CompositePolicy, Group, GroupTree, LeafGroup, LeafPolicy, PodState};
use pods::{Facts, PodLevel};

mod pods;
use muster_api::GPU_RESOURCE;
use muster_api::scheduling::PlannedPod;
use crate::devices::{GpuSet, format_indices};

/// How nodes that fit are ranked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Scoring {
    /// Fullest nodes first, keeping large holes for large gangs (kube's MostAllocated).
    #[default]
    BinPack,
    /// Emptiest nodes first, one pod per node before any node gets a second (LeastAllocated).
    Spread,
}

/// Knobs of a placement decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlaceOptions {
    /// Node ranking.
    pub scoring: Scoring,
    /// Weight of the resource score (0..=100 per node).
    pub resource_weight: u32,
    /// Weight of the GPU locality score the [`GpuChooser`] gives (0..=100 per node).
    pub gpu_weight: u32,
}

impl Default for PlaceOptions {
    fn default() -> Self {
        Self { scoring: Scoring::BinPack, resource_weight: 1, gpu_weight: 1 }
    }
}

/// Upstream PlacementFeasible's answer for a group with `min` = minCount (or minGroupCount).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feasibility {
    /// `scheduled + remaining < min`: the group can no longer succeed; stop early.
    Unschedulable,
    /// `scheduled < min`: keep going.
    Wait,
    /// `scheduled >= min`.
    Success,
}

/// PlacementFeasible: compares what is scheduled (including earlier cycles) and what remains
/// to be tried with the group's minimum.
pub fn placement_feasible(min: u32, scheduled: u32, remaining: u32) -> Feasibility {
    if scheduled.saturating_add(remaining) < min {
        Feasibility::Unschedulable
    } else if scheduled < min {
        Feasibility::Wait
    } else {
        Feasibility::Success
    }
}

/// One pod of the plan: where it goes and which GPUs it gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacedPod {
    /// Pod name.
    pub pod: String,
    /// Pod UID.
    pub uid: String,
    /// The pod's PodGroup.
    pub pod_group: String,
    /// Node name.
    pub node: String,
    /// The node's `kubernetes.io/hostname` label value, which the pin selects on.
    pub hostname: String,
    /// The GPU indices the pod gets.
    pub gpus: GpuSet,
}

impl PlacedPod {
    /// The `gpu.muster.dev/indices` annotation value, for GPU pods.
    pub fn gpu_indices_annotation(&self) -> Option<String> {
        (!self.gpus.is_empty()).then(|| format_indices(self.gpus))
    }
}

impl From<&PlacedPod> for PlannedPod {
    fn from(p: &PlacedPod) -> Self {
        PlannedPod {
            name: p.pod.clone(),
            uid: p.uid.clone(),
            pod_group: p.pod_group.clone(),
            node: p.node.clone(),
            hostname: if p.hostname == p.node { String::new() } else { p.hostname.clone() },
            gpu_indices: p.gpu_indices_annotation(),
            claims: Vec::new(),
        }
    }
}

/// The outcome of placing one root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The root group's name.
    pub root: String,
    /// True when the root's policy is satisfied: commit the plan.
    pub admitted: bool,
    /// Pods to admit (empty unless `admitted`), in placement order.
    pub plan: Vec<PlacedPod>,
    /// Why the root, or some of its groups or pods, were not placed.
    pub explanation: Option<Explanation>,
    /// Named DRA claims the plan's pods use that muster is to allocate, with their devices.
    pub shared_claims: Vec<Arc<SharedChoice>>,
}

impl Decision {
    /// One line for the root's status.
    pub fn message(&self) -> String {
        let placed = format!("placed {} pod(s) of group \"{}\"", self.plan.len(), self.root);
        match (&self.explanation, self.admitted) {
            (None, true) => placed,
            (Some(e), true) => format!("{placed}; {e}"),
            (Some(e), false) => e.to_string(),
            (None, false) => format!("group \"{}\" did not fit", self.root),
        }
    }
}

/// What the admission reconciler does with a root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Not quorate: keep waiting for pods or groups.
    Waiting(QuorumShortfall),
    /// Quorate, with no gated pod left to place.
    NothingGated,
    /// Placement ran: commit the plan if admitted, otherwise report the explanation.
    Decided(Decision),
}

/// Quorum (PreEnqueue), then placement for a quorate root with gated pods.
pub fn decide(snapshot: &Snapshot, tree: &GroupTree, options: &PlaceOptions, gpus: &dyn GpuChooser) -> Admission {
    match quorum(tree) {
        Quorum::Waiting(shortfall) => Admission::Waiting(shortfall),
        Quorum::NothingGated => Admission::NothingGated,
        Quorum::Ready => Admission::Decided(place(snapshot, tree, options, gpus)),
    }
}

/// Places every gated pod of the root in one decision. A gang PodGroup gets at least
/// `minCount` placed pods (counting those admitted or bound before) or none; a gang
/// CompositePodGroup gets at least `minGroupCount` placed children or none; basic groups get
/// what fits. Gang children are tried before basic ones, so basic pods never take room a gang
/// of the same composite needs, and a failed gang's room goes to the groups after it.
pub fn place(snapshot: &Snapshot, tree: &GroupTree, options: &PlaceOptions, gpus: &dyn GpuChooser) -> Decision {
    let all: Vec<u32> = (0..u32::try_from(snapshot.nodes().len()).unwrap_or(u32::MAX)).collect();
    let facts = Facts::new(snapshot, tree);
    let mut engine = Engine::new(snapshot, options, gpus, &facts);
    engine.namespace = &tree.namespace;
    for name in &tree.reserved_nodes {
        if let Some(i) = snapshot.index_of(name) {
            engine.avoided[i as usize] = Avoid::Reserved;
        }
    }
    for name in &tree.avoid_nodes {
        if let Some(i) = snapshot.index_of(name) {
            engine.avoided[i as usize] = Avoid::Refused;
        }
    }
    let attempt = engine.place_group(&tree.root, &all, None);
    let plan = engine.plan.iter().map(|t| t.placed(snapshot)).collect();
    let shared_claims = facts.shared_claims.values().filter(|c| c.allocate).cloned().collect();
    Decision {
        root: tree.root.name().to_string(),
        admitted: attempt.success,
        plan,
        explanation: attempt.explanation,
        shared_claims,
    }
}

/// Why a root does not use a node it could otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Avoid {
    No,
    /// kube-scheduler refused a pin of the root's pods there recently.
    Refused,
    /// A root of higher priority waits for it (its reservation or preemption nomination).
    Reserved,
}

/// No overlay slot yet for this node.
const NO_SLOT: u32 = u32::MAX;

/// What this decision has added to one node.
struct Delta {
    requested: Resources,
    gpu_used: GpuSet,
}

/// One pod placed so far in the decision; also the undo log entry.
struct Tentative<'a> {
    leaf: &'a LeafGroup,
    pod: usize,
    node: u32,
    shape: &'a PodShape,
    gpus: GpuSet,
}

impl Tentative<'_> {
    fn placed(&self, snapshot: &Snapshot) -> PlacedPod {
        let pod = &self.leaf.pods[self.pod];
        let node = &snapshot.nodes()[self.node as usize];
        PlacedPod {
            pod: pod.name.clone(),
            uid: pod.uid.clone(),
            pod_group: self.leaf.name.clone(),
            node: node.name.clone(),
            hostname: node.hostname().unwrap_or(&node.name).to_string(),
            gpus: self.gpus,
        }
    }
}

/// A filter reason while counting, borrowing names to stay allocation-free per node.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ReasonKey<'a> {
    Unusable(Unusable),
    Unschedulable,
    NodeAffinity,
    Taint(&'a str, &'a str),
    Insufficient(&'a str),
    TooManyPods,
    GpuIndices,
    RefusedEarlier,
    Reserved,
    HostPorts,
    Volume(&'a str),
    Claim(&'a str),
    ClaimReach,
    ClaimDevices,
    VolumeNodeAffinity,
    VolumeZone,
    SpreadLabel,
    Spread,
    SpreadPinned,
    PodAffinity,
    PodAntiAffinity,
    ExistingAntiAffinity,
}

impl ReasonKey<'_> {
    fn owned(self) -> FilterReason {
        match self {
            ReasonKey::Unusable(u) => FilterReason::Unusable(u),
            ReasonKey::Unschedulable => FilterReason::Unschedulable,
            ReasonKey::NodeAffinity => FilterReason::NodeAffinity,
            ReasonKey::Taint(key, value) => FilterReason::UntoleratedTaint { key: key.into(), value: value.into() },
            ReasonKey::Insufficient(resource) => FilterReason::Insufficient(resource.into()),
            ReasonKey::TooManyPods => FilterReason::TooManyPods,
            ReasonKey::GpuIndices => FilterReason::GpuIndices,
            ReasonKey::RefusedEarlier => FilterReason::RefusedEarlier,
            ReasonKey::Reserved => FilterReason::Reserved,
            ReasonKey::HostPorts => FilterReason::HostPorts,
            ReasonKey::Volume(why) => FilterReason::Volume(why.into()),
            ReasonKey::Claim(why) => FilterReason::Claim(why.into()),
            ReasonKey::ClaimReach => FilterReason::ClaimReach,
            ReasonKey::ClaimDevices => FilterReason::ClaimDevices,
            ReasonKey::VolumeNodeAffinity => FilterReason::VolumeNodeAffinity,
            ReasonKey::VolumeZone => FilterReason::VolumeZone,
            ReasonKey::SpreadLabel => FilterReason::SpreadLabel,
            ReasonKey::Spread => FilterReason::Spread,
            ReasonKey::SpreadPinned => FilterReason::SpreadPinned,
            ReasonKey::PodAffinity => FilterReason::PodAffinity,
            ReasonKey::PodAntiAffinity => FilterReason::PodAntiAffinity,
            ReasonKey::ExistingAntiAffinity => FilterReason::ExistingAntiAffinity,
        }
    }
}

#[derive(Default)]
struct Tally<'a>(Vec<(ReasonKey<'a>, u32)>);

impl<'a> Tally<'a> {
    fn add(&mut self, key: ReasonKey<'a>) {
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some((_, n)) => *n += 1,
            None => self.0.push((key, 1)),
        }
    }

    fn counts(&self) -> Vec<ReasonCount> {
        let mut out: Vec<ReasonCount> =
            self.0.iter().map(|(k, n)| ReasonCount { reason: k.owned(), nodes: *n }).collect();
        out.sort_by(|a, b| b.nodes.cmp(&a.nodes).then_with(|| a.reason.cmp(&b.reason)));
        out
    }
}

/// A node that can take at least one pod of a shape.
#[derive(Clone, Copy)]
struct Candidate {
    node: u32,
    fit: u32,
    score: u32,
    /// Raw inter-pod preferences for one pod (preferred terms, `ScheduleAnyway` spread),
    /// normalised over the candidates before they are ranked; 0 for interchangeable pods.
    preference: i64,
}

fn by_score(a: &Candidate, b: &Candidate) -> Ordering {
    b.score.cmp(&a.score).then(a.node.cmp(&b.node))
}

/// Which nodes can take pods of one shape, and why the others cannot.
struct Scan<'a> {
    candidates: Vec<Candidate>,
    tally: Tally<'a>,
    nodes: u32,
}

/// The result of trying one group.
struct Attempt {
    /// The group's policy is satisfied.
    success: bool,
    /// Pods of the subtree now in the plan.
    placed: u32,
    /// Pods of the subtree that fit before any rollback, plus those admitted before.
    reached: u32,
    /// Why it failed, or what it left behind.
    explanation: Option<Explanation>,
    /// For a one-shape PodGroup: more pods of its shape the nodes could still take.
    slots_left: Option<u64>,
}

impl Attempt {
    fn failed(reached: u32, explanation: Explanation) -> Self {
        Self { success: false, placed: 0, reached, explanation: Some(explanation), slots_left: None }
    }
}

/// Reads one inline amount of a [`Resources`].
type Amount = fn(&Resources) -> i64;

/// Pods per node of `request` given `allocatable` and `used`; `u64::MAX` when not requested.
fn per_node(allocatable: i64, used: i64, request: i64) -> u64 {
    if request <= 0 {
        return u64::MAX;
    }
    let free = allocatable.saturating_sub(used);
    if free < request { 0 } else { u64::try_from(free / request).unwrap_or(0) }
}

struct Engine<'a> {
    snapshot: &'a Snapshot,
    options: &'a PlaceOptions,
    gpus: &'a dyn GpuChooser,
    /// What the root's shapes need that does not change within the decision.
    facts: &'a Facts<'a>,
    /// The root's namespace.
    namespace: &'a str,
    /// Per node: index into `deltas`, or `NO_SLOT`.
    slot: Vec<u32>,
    deltas: Vec<Delta>,
    plan: Vec<Tentative<'a>>,
    /// Per node: whether the root avoids it, and why.
    avoided: Vec<Avoid>,
    /// Where the next one-pod scan starts.
    rotation: std::cell::Cell<usize>,
}

/// How many feasible nodes a one-pod scan looks for before it stops: every node of a cluster
/// under 100 nodes, else kube-scheduler's adaptive share (50% less 1% per 125 nodes, at least
/// 5%), at least 100.
fn feasible_nodes_to_find(nodes: usize) -> usize {
    if nodes < 100 {
        return nodes;
    }
    let percent = 50usize.saturating_sub(nodes / 125).max(5);
    (nodes * percent / 100).max(100)
}

impl<'a> Engine<'a> {
    fn new(snapshot: &'a Snapshot, options: &'a PlaceOptions, gpus: &'a dyn GpuChooser, facts: &'a Facts<'a>) -> Self {
        Self {
            snapshot,
            options,
            gpus,
            facts,
            namespace: "",
            slot: vec![NO_SLOT; snapshot.nodes().len()],
            deltas: Vec::new(),
            plan: Vec::new(),
            avoided: vec![Avoid::No; snapshot.nodes().len()],
            rotation: std::cell::Cell::new(0),
        }
    }

    fn node(&self, i: u32) -> &'a NodeInfo {
        &self.snapshot.nodes()[i as usize]
    }

    fn delta(&self, node: u32) -> Option<&Delta> {
        match self.slot[node as usize] {
            NO_SLOT => None,
            s => self.deltas.get(s as usize),
        }
    }

    fn gpu_used(&self, node: u32) -> GpuSet {
        self.node(node).gpu_used.union(self.delta(node).map_or(GpuSet::EMPTY, |d| d.gpu_used))
    }

    fn apply(&mut self, t: Tentative<'a>) {
        let slot = &mut self.slot[t.node as usize];
        if *slot == NO_SLOT {
            *slot = u32::try_from(self.deltas.len()).unwrap_or(NO_SLOT);
            self.deltas.push(Delta { requested: Resources::new(), gpu_used: GpuSet::EMPTY });
        }
        let delta = &mut self.deltas[*slot as usize];
        delta.requested.add(&t.shape.requests);
        delta.gpu_used = delta.gpu_used.union(t.gpus);
        self.plan.push(t);
    }

    /// Undoes every placement after `checkpoint`.
    fn rollback(&mut self, checkpoint: usize) {
        while self.plan.len() > checkpoint {
            let Some(t) = self.plan.pop() else { break };
            if let Some(delta) = self.deltas.get_mut(self.slot[t.node as usize] as usize) {
                delta.requested.sub(&t.shape.requests);
                delta.gpu_used = delta.gpu_used.difference(t.gpus);
            }
        }
    }

    /// How many more pods with these requests fit on the node, by resources alone.
    fn resource_fit(&self, node: u32, req: &Resources) -> u64 {
        let n = self.node(node);
        let d = self.delta(node).map(|d| &d.requested);
        let used = |f: Amount| f(&n.requested).saturating_add(d.map_or(0, f));
        let a = &n.allocatable;
        let mut fit = per_node(a.cpu_milli, used(|r| r.cpu_milli), req.cpu_milli)
            .min(per_node(a.memory, used(|r| r.memory), req.memory))
            .min(per_node(a.ephemeral_storage, used(|r| r.ephemeral_storage), req.ephemeral_storage))
            .min(per_node(a.pods, used(|r| r.pods), req.pods.max(1)))
            .min(per_node(a.gpus, used(|r| r.gpus), req.gpus));
        for (name, amount) in req.extended() {
            if fit == 0 {
                break;
            }
            let used = n.requested.extended_amount(name).saturating_add(d.map_or(0, |d| d.extended_amount(name)));
            fit = fit.min(per_node(a.extended_amount(name), used, amount));
        }
        fit
    }

    /// Counts each resource that keeps even one pod off the node.
    fn tally_insufficient(&self, node: u32, req: &'a Resources, tally: &mut Tally<'a>) {
        let n = self.node(node);
        let d = self.delta(node).map(|d| &d.requested);
        let short = |f: Amount, request: i64| {
            per_node(f(&n.allocatable), f(&n.requested).saturating_add(d.map_or(0, f)), request) == 0
        };
        let inline: [(Amount, i64, ReasonKey<'a>); 5] = [
            (|r| r.cpu_milli, req.cpu_milli, ReasonKey::Insufficient(CPU)),
            (|r| r.memory, req.memory, ReasonKey::Insufficient(MEMORY)),
            (|r| r.ephemeral_storage, req.ephemeral_storage, ReasonKey::Insufficient(EPHEMERAL_STORAGE)),
            (|r| r.pods, req.pods.max(1), ReasonKey::TooManyPods),
            (|r| r.gpus, req.gpus, ReasonKey::Insufficient(GPU_RESOURCE)),
        ];
        for (f, request, reason) in inline {
            if short(f, request) {
                tally.add(reason);
            }
        }
        for (name, amount) in req.extended() {
            let used = n.requested.extended_amount(name).saturating_add(d.map_or(0, |d| d.extended_amount(name)));
            if per_node(n.allocatable.extended_amount(name), used, amount) == 0 {
                tally.add(ReasonKey::Insufficient(name));
            }
        }
    }

    /// Resource score after one more pod: mean utilisation of cpu, memory and each extended
    /// resource the pod requests, GPUs of its DRA claim (`claim_gpus`) counted like
    /// `nvidia.com/gpu` (BinPack), or its complement (Spread).
    fn resource_score(&self, node: u32, req: &Resources, claim_gpus: u32) -> u32 {
        let n = self.node(node);
        let d = self.delta(node).map(|d| &d.requested);
        let (mut sum, mut count) = (0u64, 0u64);
        let mut add = |allocatable: i64, used: i64, request: i64| {
            if allocatable > 0 {
                let after = used.saturating_add(request).clamp(0, allocatable);
                // Percent of allocatable; the fallback only matters beyond 2^63 / 100 units.
                let percent = match after.checked_mul(100) {
                    Some(scaled) => scaled / allocatable,
                    None => after / (allocatable / 100),
                };
                sum += percent.unsigned_abs();
                count += 1;
            }
        };
        let used = |f: Amount| f(&n.requested).saturating_add(d.map_or(0, f));
        add(n.allocatable.cpu_milli, used(|r| r.cpu_milli), req.cpu_milli);
        add(n.allocatable.memory, used(|r| r.memory), req.memory);
        if req.gpus > 0 {
            add(n.allocatable.gpus, used(|r| r.gpus), req.gpus);
        }
        if claim_gpus > 0 {
            let all = n.gpus();
            let taken = self.gpu_used(node).intersection(all).len();
            add(all.len() as i64, taken as i64, i64::from(claim_gpus));
        }
        for (name, amount) in req.extended() {
            let used = n.requested.extended_amount(name).saturating_add(d.map_or(0, |d| d.extended_amount(name)));
            add(n.allocatable.extended_amount(name), used, amount);
        }
        let utilisation = sum.checked_div(count).map_or(0, |mean| u32::try_from(mean).unwrap_or(100));
        match self.options.scoring {
            Scoring::BinPack => utilisation,
            Scoring::Spread => 100 - utilisation.min(100),
        }
    }

    /// A shape's size for ordering shapes largest first: its GPUs (`nvidia.com/gpu`, or what
    /// its own DRA claim asks for), then cpu, then memory. A DRA pod requests no
    /// `nvidia.com/gpu`, so [`PodShape::size_key`] alone would rank it as a CPU pod.
    fn size_key(&self, shape: &PodShape) -> (u32, i64, i64) {
        let (gpus, cpu, memory) = shape.size_key();
        let claimed = self.facts.of(shape).and_then(|f| f.resource_claims.as_ref().ok()).map_or(0, |c| c.gpus());
        (gpus.max(claimed), cpu, memory)
    }

    /// What a shape asks of GPUs on node `i`: how many, and which indices may be given (all
    /// the node's for `nvidia.com/gpu`, those its own DRA claim allows otherwise); `None`
    /// when it asks for none.
    fn gpu_need(&self, shape: &PodShape, i: u32) -> Option<(u32, GpuSet)> {
        if shape.gpus > 0 {
            return Some((shape.gpus, self.node(i).gpus()));
        }
        let facts = self.facts.of(shape)?;
        let count = facts.resource_claims.as_ref().ok().map_or(0, |c| c.gpus());
        (count > 0).then(|| (count, self.facts.offered(facts, i)))
    }

    /// The chooser's answer, if it is one placement may use: `count` free indices out of
    /// `offered`.
    fn choose_gpus(&self, node: u32, count: u32, offered: GpuSet) -> Option<GpuChoice> {
        let n = self.node(node);
        let used = self.gpu_used(node).union(n.gpus().difference(offered));
        let choice = self.gpus.choose(n, count, used)?;
        let valid =
            choice.gpus.len() == count as usize && choice.gpus.is_disjoint(used) && choice.gpus.is_subset(n.gpus());
        valid.then_some(GpuChoice { gpus: choice.gpus, score: choice.score.min(100) })
    }

    /// Filters every node for one shape (kube's order: unschedulable, taints, affinity,
    /// host ports, resources, volumes, topology spread, inter-pod affinity, then GPU
    /// indices) and scores those that fit. With `pod`, the rules relating that one pod to
    /// others are checked too (each candidate then takes one pod).
    fn scan(&self, shape: &'a PodShape, nodes: &[u32], pod: Option<&PodLevel<'a>>) -> Scan<'a> {
        let tolerates_unschedulable = shape.tolerates_unschedulable();
        let mut scan = Scan { candidates: Vec::new(), tally: Tally::default(), nodes: 0 };
        let facts = self.facts.of(shape);
        // A claim (volume or DRA) that keeps the pod off every node: every node fails for it.
        let off_everywhere = |mut scan: Scan<'a>, reason: ReasonKey<'a>| {
            scan.nodes = u32::try_from(nodes.len()).unwrap_or(u32::MAX);
            for _ in nodes {
                scan.tally.add(reason);
            }
            scan
        };
        let volumes = match facts.map(|f| &f.volumes) {
            Some(Err(why)) => return off_everywhere(scan, ReasonKey::Volume(why)),
            Some(Ok(v)) => v.as_slice(),
            None => &[],
        };
        let resource_claims = match facts.map(|f| &f.resource_claims) {
            Some(Err(why)) => return off_everywhere(scan, ReasonKey::Claim(why)),
            Some(Ok(c)) => Some(c),
            None => None,
        };
        // One pod at a time, like kube-scheduler: stop once enough feasible nodes are found,
        // and start where the last pod's scan stopped (kube's numFeasibleNodesToFind and
        // nextStartNodeIndex), so a gang of many pods costs what kube-scheduler's cycles do.
        let (start, enough) = match pod {
            Some(_) if !nodes.is_empty() => (self.rotation.get() % nodes.len(), feasible_nodes_to_find(nodes.len())),
            _ => (0, usize::MAX),
        };
        for &i in nodes[start..].iter().chain(&nodes[..start]) {
            if scan.candidates.len() >= enough {
                break;
            }
            scan.nodes += 1;
            let node = self.node(i);
            if let Some(u) = node.unusable {
                scan.tally.add(ReasonKey::Unusable(u));
                continue;
            }
            match self.avoided[i as usize] {
                Avoid::No => {}
                Avoid::Refused => {
                    scan.tally.add(ReasonKey::RefusedEarlier);
                    continue;
                }
                Avoid::Reserved => {
                    scan.tally.add(ReasonKey::Reserved);
                    continue;
                }
            }
            if node.unschedulable && !tolerates_unschedulable {
                scan.tally.add(ReasonKey::Unschedulable);
                continue;
            }
            if let Some(t) = shape.untolerated_taint(node) {
                scan.tally.add(ReasonKey::Taint(&t.key, &t.value));
                continue;
            }
            if !shape.matches_node(node) {
                scan.tally.add(ReasonKey::NodeAffinity);
                continue;
            }
            if pod.is_some_and(|p| !p.ports_free(self, i)) {
                scan.tally.add(ReasonKey::HostPorts);
                continue;
            }
            let mut fit = self.resource_fit(i, &shape.requests);
            if fit == 0 {
                self.tally_insufficient(i, &shape.requests, &mut scan.tally);
                continue;
            }
            if let Some(conflict) = volumes.iter().find_map(|v| v.check(node).err()) {
                scan.tally.add(match conflict {
                    super::volumes::VolumeConflict::NodeAffinity => ReasonKey::VolumeNodeAffinity,
                    super::volumes::VolumeConflict::Zone => ReasonKey::VolumeZone,
                });
                continue;
            }
            if resource_claims.is_some_and(|c| !c.reaches(node)) {
                scan.tally.add(ReasonKey::ClaimReach);
                continue;
            }
            let mut preference = 0;
            if let Some(pod) = pod {
                if let Err(reason) = pod.check(node, i) {
                    scan.tally.add(reason);
                    continue;
                }
                fit = 1;
                preference = pod.preference(node);
            }
            let mut gpu_score = 0;
            // GPUs of a DRA claim count in the utilisation like `nvidia.com/gpu` does.
            let mut claim_gpus = 0;
            if let Some((count, offered)) = self.gpu_need(shape, i) {
                if shape.gpus == 0 {
                    claim_gpus = count;
                }
                let gpu_fit = offered.difference(self.gpu_used(i)).len() as u32 / count;
                fit = fit.min(u64::from(gpu_fit));
                match self.choose_gpus(i, count, offered) {
                    Some(choice) if fit > 0 => gpu_score = u32::from(choice.score),
                    _ => {
                        let dra = shape.gpus == 0;
                        scan.tally.add(if dra { ReasonKey::ClaimDevices } else { ReasonKey::GpuIndices });
                        continue;
                    }
                }
            }
            let score = self.resource_score(i, &shape.requests, claim_gpus) * self.options.resource_weight
                + gpu_score * self.options.gpu_weight;
            scan.candidates.push(Candidate { node: i, fit: u32::try_from(fit).unwrap_or(u32::MAX), score, preference });
        }
        if pod.is_some() && !nodes.is_empty() {
            self.rotation.set((start + scan.nodes as usize) % nodes.len());
        }
        scan
    }

    /// Places one pod on a node that has room for it; false when the GPU chooser refuses.
    fn place_one(&mut self, leaf: &'a LeafGroup, shape: &'a PodShape, pod: usize, node: u32) -> bool {
        let mut gpus = GpuSet::EMPTY;
        if let Some((count, offered)) = self.gpu_need(shape, node) {
            match self.choose_gpus(node, count, offered) {
                Some(choice) => gpus = choice.gpus,
                None => return false,
            }
        }
        self.apply(Tentative { leaf, pod, node, shape, gpus });
        true
    }

    /// Capacity arithmetic: fills the best nodes with as many of `pods` as each fits
    /// (BinPack), or deals them one per node in turn (Spread). Returns how many were placed.
    fn fill(
        &mut self,
        leaf: &'a LeafGroup,
        shape: &'a PodShape,
        pods: &[usize],
        mut candidates: Vec<Candidate>,
    ) -> u32 {
        let want = pods.len();
        // Every candidate takes at least one pod, so the best `want` nodes are enough unless
        // the GPU chooser refuses some; only then is the rest sorted.
        let top = want.min(candidates.len());
        if top == 0 {
            return 0;
        }
        if top < candidates.len() {
            candidates.select_nth_unstable_by(top - 1, by_score);
        }
        candidates[..top].sort_unstable_by(by_score);
        let mut placed = 0;
        match self.options.scoring {
            Scoring::BinPack => {
                for i in 0..candidates.len() {
                    if placed == want {
                        break;
                    }
                    if i == top {
                        candidates[top..].sort_unstable_by(by_score);
                    }
                    let c = candidates[i];
                    for _ in 0..c.fit {
                        if placed == want || !self.place_one(leaf, shape, pods[placed], c.node) {
                            break;
                        }
                        placed += 1;
                    }
                }
            }
            Scoring::Spread => {
                candidates[top..].sort_unstable_by(by_score);
                let mut left: Vec<u32> = candidates.iter().map(|c| c.fit).collect();
                let mut progress = true;
                while placed < want && progress {
                    progress = false;
                    for (c, left) in candidates.iter().zip(left.iter_mut()) {
                        if placed == want {
                            break;
                        }
                        if *left == 0 {
                            continue;
                        }
                        if self.place_one(leaf, shape, pods[placed], c.node) {
                            *left -= 1;
                            placed += 1;
                            progress = true;
                        } else {
                            *left = 0;
                        }
                    }
                }
            }
        }
        u32::try_from(placed).unwrap_or(u32::MAX)
    }

    /// Pods of `shape` the nodes could still take (for choosing the tightest domain).
    fn free_slots(&self, shape: &'a PodShape, nodes: &[u32]) -> u64 {
        self.scan(shape, nodes, None).candidates.iter().map(|c| u64::from(c.fit)).sum()
    }

    fn place_group(&mut self, group: &'a Group, nodes: &[u32], domain: Option<(&'a str, &'a str)>) -> Attempt {
        match group.topology_key() {
            Some(key) => self.place_in_domains(group, key, nodes),
            None => self.place_here(group, nodes, domain),
        }
    }

    fn place_here(&mut self, group: &'a Group, nodes: &[u32], domain: Option<(&'a str, &'a str)>) -> Attempt {
        match group {
            Group::Leaf(leaf) => self.place_leaf(leaf, nodes, domain),
            Group::Composite(composite) => self.place_composite(composite, nodes, domain),
        }
    }

    fn place_leaf(&mut self, leaf: &'a LeafGroup, nodes: &[u32], domain: Option<(&'a str, &'a str)>) -> Attempt {
        let existing = leaf.placed_pods();
        let mut by_shape: Vec<Vec<usize>> = vec![Vec::new(); leaf.shapes.len()];
        let mut invalid = Vec::new();
        for (i, pod) in leaf.pods.iter().enumerate() {
            match &pod.state {
                PodState::Gated { shape } => match by_shape.get_mut(*shape) {
                    Some(pods) => pods.push(i),
                    None => invalid.push((pod.name.clone(), format!("shape {shape} is not in the group"))),
                },
                PodState::Invalid { error } => invalid.push((pod.name.clone(), error.to_string())),
                _ => {}
            }
        }
        for pods in &mut by_shape {
            pods.sort_by(|&a, &b| leaf.pods[a].name.cmp(&leaf.pods[b].name));
        }
        // Largest shapes first: big pods are the hardest to fit.
        let mut order: Vec<usize> = (0..by_shape.len()).filter(|&s| !by_shape[s].is_empty()).collect();
        order.sort_by(|&a, &b| self.size_key(&leaf.shapes[b]).cmp(&self.size_key(&leaf.shapes[a])).then(a.cmp(&b)));
        let gated = by_shape.iter().map(|p| u32::try_from(p.len()).unwrap_or(u32::MAX)).fold(0, u32::saturating_add);
        let min_count = leaf.min_count();
        let gang = matches!(leaf.policy, LeafPolicy::Gang { .. });
        let invalid_count = u32::try_from(invalid.len()).unwrap_or(u32::MAX);
        if placement_feasible(min_count, existing, gated) == Feasibility::Unschedulable {
            return Attempt::failed(
                existing,
                Explanation {
                    group: leaf.name.clone(),
                    kind: ExplanationKind::TooFewPods(TooFewPods {
                        existing,
                        gated,
                        invalid: invalid_count,
                        min_count,
                    }),
                },
            );
        }

        let checkpoint = self.plan.len();
        let (mut placed, mut remaining) = (0u32, gated);
        let mut shortfall: Option<(u32, u32, Vec<ReasonCount>)> = None;
        let mut slots_left = None;
        for &s in &order {
            let (shape, pods) = (&leaf.shapes[s], &by_shape[s]);
            let (fitted, scanned, nodes_fit, tally) = if self.facts.per_pod {
                let (fitted, scan) = self.fill_each(leaf, shape, pods, nodes);
                let nodes_fit = u32::try_from(scan.candidates.len()).unwrap_or(u32::MAX);
                (fitted, scan.nodes, nodes_fit, scan.tally)
            } else {
                let scan = self.scan(shape, nodes, None);
                let nodes_fit = u32::try_from(scan.candidates.len()).unwrap_or(u32::MAX);
                let capacity: u64 = scan.candidates.iter().map(|c| u64::from(c.fit)).sum();
                let (scanned, tally) = (scan.nodes, scan.tally);
                let fitted = self.fill(leaf, shape, pods, scan.candidates);
                // Each pod placed takes exactly one slot of its own shape; the chooser may
                // refuse a few more, so this is an upper bound.
                slots_left = Some(capacity.saturating_sub(u64::from(fitted)));
                (fitted, scanned, nodes_fit, tally)
            };
            placed += fitted;
            remaining -= u32::try_from(pods.len()).unwrap_or(u32::MAX);
            if (fitted as usize) < pods.len() {
                shortfall = Some((scanned, nodes_fit, tally.counts()));
            }
            if placement_feasible(min_count, existing + placed, remaining) == Feasibility::Unschedulable {
                break;
            }
        }
        if gang && self.facts.per_pod && existing + placed < min_count {
            // One pod at a time, the first choices can block later pods (co-location that
            // picked the small zone, spread that filled the wrong domain): search the
            // choices, within a budget, before giving up.
            let sequence: Vec<(&'a PodShape, usize)> =
                order.iter().flat_map(|&s| by_shape[s].iter().map(move |&p| (&leaf.shapes[s], p))).collect();
            if let Some(found) = self.search(leaf, &sequence, nodes, checkpoint, min_count - existing) {
                placed = found;
            }
        }
        let success = existing + placed >= min_count;
        let explanation = (shortfall.is_some() || !invalid.is_empty()).then(|| {
            let (nodes, nodes_fit, reasons) = shortfall.unwrap_or_default();
            Explanation {
                group: leaf.name.clone(),
                kind: ExplanationKind::Pods(PodsUnplaced {
                    pods: gated,
                    placed,
                    existing,
                    min_count,
                    gang,
                    nodes,
                    nodes_fit,
                    reasons,
                    invalid,
                    domain: domain.map(|(k, v)| (k.to_string(), v.to_string())),
                }),
            }
        });
        let reached = existing + placed;
        if !success {
            self.rollback(checkpoint);
            placed = 0;
        }
        let slots_left = slots_left.filter(|_| leaf.shapes.len() == 1);
        Attempt { success, placed, reached, explanation, slots_left }
    }

    fn place_composite(
        &mut self,
        composite: &'a CompositeGroup,
        nodes: &[u32],
        domain: Option<(&'a str, &'a str)>,
    ) -> Attempt {
        let min_group_count = composite.policy.min_group_count();
        let gang = matches!(composite.policy, CompositePolicy::Gang { .. });
        let mut children: Vec<&'a Group> = composite.children.iter().collect();
        children.sort_by_key(|g| !g.is_gang());
        let total = u32::try_from(children.len()).unwrap_or(u32::MAX);
        let checkpoint = self.plan.len();
        let (mut admitted, mut placed, mut reached, mut evaluated) = (0u32, 0u32, 0u32, 0u32);
        let mut details = Vec::new();
        if placement_feasible(min_group_count, 0, total) != Feasibility::Unschedulable {
            for child in children {
                let attempt = self.place_group(child, nodes, domain);
                evaluated += 1;
                reached += attempt.reached;
                if attempt.success {
                    admitted += 1;
                    placed += attempt.placed;
                }
                details.extend(attempt.explanation);
                if placement_feasible(min_group_count, admitted, total - evaluated) == Feasibility::Unschedulable {
                    break;
                }
            }
        }
        let success = admitted >= min_group_count;
        if !success {
            self.rollback(checkpoint);
            placed = 0;
        }
        let explanation = (!success || !details.is_empty()).then(|| Explanation {
            group: composite.name.clone(),
            kind: ExplanationKind::Children(ChildrenUnplaced {
                children: total,
                placed: admitted,
                min_group_count,
                gang,
                not_tried: total - evaluated,
                failed: details,
            }),
        });
        Attempt { success, placed, reached, explanation, slots_left: None }
    }

    /// Tries the group in each domain of `key` (only the one its admitted pods occupy, if
    /// any) and keeps the best that succeeds: most pods placed, then the tightest fit (fewest
    /// slots left for its largest pod; the loosest with Spread), then the domain name.
    fn place_in_domains(&mut self, group: &'a Group, key: &'a str, nodes: &[u32]) -> Attempt {
        let leaves = group.leaves();
        let pods = leaves.iter().map(|l| l.placed_pods().saturating_add(l.gated_pods())).fold(0, u32::saturating_add);

        let occupied = self.occupied_domains(&leaves, key);
        if occupied.len() > 1 || occupied.contains(&None) {
            let occupied = occupied.iter().map(|d| d.unwrap_or("(no label)").to_string()).collect();
            let kind = ExplanationKind::DomainConflict(DomainConflict { key: key.into(), occupied });
            return Attempt::failed(0, Explanation { group: group.name().to_string(), kind });
        }
        let mut domains: BTreeMap<&'a str, Vec<u32>> = BTreeMap::new();
        let mut nodes_without_label = 0;
        // Neighbouring nodes (by name) usually share a domain: try the last one first.
        let mut last: Option<(&'a str, &mut Vec<u32>)> = None;
        for &i in nodes {
            let Some(value) = self.node(i).labels.get(key) else {
                nodes_without_label += 1;
                continue;
            };
            match last {
                Some((v, ref mut members)) if v == value => members.push(i),
                _ => {
                    let members = domains.entry(value).or_default();
                    members.push(i);
                    last = Some((value, members));
                }
            }
        }
        if let Some(Some(only)) = occupied.first() {
            domains.retain(|value, _| value == only);
        }

        let largest =
            leaves.iter().flat_map(|l| l.shapes.iter()).max_by(|a, b| self.size_key(a).cmp(&self.size_key(b)));
        let mut best: Option<(&'a str, u32, u64)> = None;
        let mut best_failure: Option<(&'a str, u32, Option<Explanation>)> = None;
        for (&value, members) in &domains {
            let checkpoint = self.plan.len();
            let attempt = self.place_here(group, members, Some((key, value)));
            if attempt.success {
                let left = match attempt.slots_left {
                    Some(left) => left,
                    None => largest.map_or(0, |shape| self.free_slots(shape, members)),
                };
                let better = best.is_none_or(|(_, placed, best_left)| {
                    let tighter = match self.options.scoring {
                        Scoring::BinPack => left < best_left,
                        Scoring::Spread => left > best_left,
                    };
                    attempt.placed > placed || (attempt.placed == placed && tighter)
                });
                if better {
                    best = Some((value, attempt.placed, left));
                }
            } else if best_failure.as_ref().is_none_or(|(_, reached, _)| attempt.reached > *reached) {
                best_failure = Some((value, attempt.reached, attempt.explanation));
            }
            self.rollback(checkpoint);
        }
        if let Some((value, _, _)) = best {
            let members = domains.remove(value).unwrap_or_default();
            return self.place_here(group, &members, Some((key, value)));
        }
        let (best, in_best, reached) = match best_failure {
            Some((value, reached, explanation)) => {
                (Some((value.to_string(), reached)), explanation.map(Box::new), reached)
            }
            None => (None, None, 0),
        };
        let kind = TopologyUnplaced {
            key: key.into(),
            pods,
            domains: u32::try_from(domains.len()).unwrap_or(u32::MAX),
            nodes_without_label,
            best,
            in_best,
        };
        Attempt::failed(reached, Explanation { group: group.name().to_string(), kind: ExplanationKind::Topology(kind) })
    }

    /// Label values of `key` on the nodes the leaves' admitted or bound pods are on (`None`
    /// for such a node without the label). Pods on nodes the snapshot lacks are ignored.
    fn occupied_domains(&self, leaves: &[&'a LeafGroup], key: &str) -> Vec<Option<&'a str>> {
        let mut out = BTreeSet::new();
        for pod in leaves.iter().flat_map(|l| l.pods.iter()) {
            let node = match &pod.state {
                PodState::Admitted { hostname } => self.snapshot.index_by_hostname(hostname),
                PodState::Bound { node } => self.snapshot.index_of(node),
                _ => None,
            };
            if let Some(i) = node {
                out.insert(self.node(i).labels.get(key));
            }
        }
        out.into_iter().collect()
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod interpod_tests;

#[cfg(test)]
mod dra_tests;

//! Placement of pods whose rules relate them to other pods (inter-pod affinity and
//! anti-affinity, topology spread, host ports): one pod at a time, as kube-scheduler's
//! scheduling cycle does, each against the pods already on the nodes and the pods this
//! decision placed before it. Pods without such rules keep the capacity arithmetic of
//! [`Engine::fill`].
//!
//! kube-scheduler binds the pins, so its view after the pin is what counts: a pinned pod's
//! nodeSelector names one node, and a spread constraint with `nodeAffinityPolicy: Honor`
//! then counts that node alone. With `minDomains` above 1 that view has fewer domains than
//! required, the global minimum is 0, and the pod fits only while the pinned node holds fewer
//! than `maxSkew` matching pods. Placement enforces that view too ([`FilterReason::SpreadPinned`]).
//!
//! [`FilterReason::SpreadPinned`]: crate::scheduler::FilterReason::SpreadPinned

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use super::{Candidate, Engine, ReasonKey, Scan, by_score};
use crate::devices::GpuSet;
use crate::devices::dra::{ClaimKey, DeviceId};
use crate::scheduler::dra::{ClaimSource, ShapeClaims, SharedChoice};
use crate::scheduler::interpod::{PodRules, PodTerm, SpreadConstraint};
use crate::scheduler::shape::PodShape;
use crate::scheduler::snapshot::{NodeInfo, NodePod, Snapshot};
use crate::scheduler::tree::{GroupTree, LeafGroup, PodState};
use crate::scheduler::volumes::VolumeNodes;

/// Pods per topology domain (label value).
type Counts<'a> = HashMap<&'a str, u32>;

/// What one shape of the root needs, computed once per decision from the snapshot.
pub(super) struct ShapeFacts<'a> {
    /// The bound volumes its claims allow nodes by, or why no node can take it.
    pub(super) volumes: Result<Vec<&'a VolumeNodes>, String>,
    /// Its DRA claims (own GPU claim, shared claims), or why no node can take it.
    pub(super) resource_claims: Result<ShapeClaims, String>,
    /// Per node index: the GPU indices its own GPU claim may get there (computed when asked).
    offered: RefCell<HashMap<u32, GpuSet>>,
    /// Per required affinity term: pods on the nodes matching every affinity term.
    affinity: Vec<Counts<'a>>,
    /// Per required anti-affinity term: pods on the nodes it selects.
    anti: Vec<Counts<'a>>,
    /// Per preferred term: pods on the nodes it selects.
    preferred: Vec<Counts<'a>>,
    /// Per spread constraint.
    spread: Vec<SpreadFacts<'a>>,
}

/// One spread constraint over the nodes it counts.
struct SpreadFacts<'a> {
    /// Per node: counted (has every constraint's key and passes the inclusion policies).
    eligible: Vec<bool>,
    /// Matching pods per domain, every domain of a counted node present (0 included).
    counts: Counts<'a>,
    /// Matching pods per counted node (nodes with none left out).
    per_node: HashMap<u32, u32>,
}

/// Per-decision facts of every shape of a root.
pub(super) struct Facts<'a> {
    by_shape: HashMap<usize, ShapeFacts<'a>>,
    /// The named DRA claims the root's pods use, one choice each.
    pub(super) shared_claims: BTreeMap<ClaimKey, Arc<SharedChoice>>,
    /// Devices those claims take.
    taken: HashSet<DeviceId>,
    snapshot: &'a Snapshot,
    /// Place pods one at a time: some shape has inter-pod rules, or a pod already running
    /// has anti-affinity against one of the root's pods.
    pub(super) per_pod: bool,
}

fn key(shape: &PodShape) -> usize {
    std::ptr::from_ref(shape) as usize
}

fn bump<'a>(counts: &mut Counts<'a>, node: &'a NodeInfo, topology_key: &str) {
    if let Some(value) = node.labels.get(topology_key) {
        *counts.entry(value).or_default() += 1;
    }
}

impl<'a> Facts<'a> {
    pub(super) fn new(snapshot: &'a Snapshot, tree: &'a GroupTree) -> Self {
        let ns = tree.namespace.as_str();
        let leaves = tree.root.leaves();
        let mut by_shape = HashMap::new();
        let mut per_pod = false;
        let (mut shared_claims, mut taken) = (BTreeMap::new(), HashSet::new());
        // How many gated pods of the root use each named claim: a claim serves at most
        // MAX_RESERVED_FOR pods in muster's own mode.
        let mut users: BTreeMap<&str, usize> = BTreeMap::new();
        for leaf in &leaves {
            for pod in &leaf.pods {
                let PodState::Gated { shape } = pod.state else { continue };
                for c in leaf.shapes.get(shape).into_iter().flat_map(|s| s.resource_claims.iter()) {
                    if let ClaimSource::Claim(name) = &c.source {
                        *users.entry(name.as_str()).or_default() += 1;
                    }
                }
            }
        }
        let over: BTreeMap<&str, String> = users
            .iter()
            .filter_map(|(name, n)| snapshot.dra().reservation_problem(ns, name, *n).map(|why| (*name, why)))
            .collect();
        for shape in leaves.iter().flat_map(|l| l.shapes.iter()) {
            per_pod |= !shape.is_independent();
            let mut facts = ShapeFacts::new(snapshot, ns, shape);
            let too_many = shape.resource_claims.iter().find_map(|c| match &c.source {
                ClaimSource::Claim(name) => over.get(name.as_str()),
                ClaimSource::Template(_) => None,
            });
            facts.resource_claims = match too_many {
                Some(why) => Err(why.clone()),
                None => snapshot.dra().resolve(ns, &shape.resource_claims, &mut shared_claims, &mut taken),
            };
            by_shape.insert(key(shape), facts);
        }
        if !per_pod {
            let namespace_labels = snapshot.namespace_labels(ns);
            per_pod = snapshot.anti_affinity_pods().any(|p| {
                p.anti_affinity.iter().any(|t| {
                    leaves.iter().flat_map(|l| l.pods.iter()).any(|pod| {
                        matches!(pod.state, PodState::Gated { .. }) && t.matches(ns, &pod.labels, namespace_labels)
                    })
                })
            });
        }
        Self { by_shape, per_pod, shared_claims, taken, snapshot }
    }

    pub(super) fn of(&self, shape: &PodShape) -> Option<&ShapeFacts<'a>> {
        self.by_shape.get(&key(shape))
    }

    /// The GPU indices on node `i` a shape's own GPU claim may be given (cached per shape and
    /// node for the decision).
    pub(super) fn offered(&self, facts: &ShapeFacts<'_>, i: u32) -> GpuSet {
        let Ok(claims) = &facts.resource_claims else { return GpuSet::EMPTY };
        *facts.offered.borrow_mut().entry(i).or_insert_with(|| {
            let node = &self.snapshot.nodes()[i as usize];
            self.snapshot.dra().offered(claims, &node.name, &self.taken)
        })
    }
}

impl<'a> ShapeFacts<'a> {
    fn new(snapshot: &'a Snapshot, ns: &str, shape: &'a PodShape) -> Self {
        let volumes = snapshot.volumes().resolve(ns, &shape.claims);
        let rules = &shape.rules;
        let nodes = snapshot.nodes();
        let per_term = |terms: &[&PodTerm], all: bool| -> Vec<Counts<'a>> {
            let mut out = vec![Counts::new(); terms.len()];
            if terms.is_empty() {
                return out;
            }
            // Terms that name their namespaces (no namespace selector) only look there.
            let mut named: Option<Vec<&str>> = terms
                .iter()
                .all(|t| t.namespace_selector.is_none())
                .then(|| terms.iter().flat_map(|t| t.namespaces.iter().map(String::as_str)).collect());
            if let Some(n) = named.as_mut() {
                n.sort_unstable();
                n.dedup();
            }
            let candidates: Box<dyn Iterator<Item = &NodePod>> = match named {
                Some(namespaces) => Box::new(namespaces.into_iter().flat_map(|ns| snapshot.pods_in(ns))),
                None => Box::new(snapshot.node_pods().iter()),
            };
            for pod in candidates {
                let namespace_labels = snapshot.namespace_labels(&pod.namespace);
                let node = &nodes[pod.node as usize];
                if all {
                    if rules.matches_all_affinity(&pod.namespace, &pod.labels, namespace_labels) {
                        for (counts, t) in out.iter_mut().zip(terms) {
                            bump(counts, node, &t.topology_key);
                        }
                    }
                } else {
                    for (counts, t) in out.iter_mut().zip(terms) {
                        if t.matches(&pod.namespace, &pod.labels, namespace_labels) {
                            bump(counts, node, &t.topology_key);
                        }
                    }
                }
            }
            out
        };
        let affinity = per_term(&rules.affinity.iter().collect::<Vec<_>>(), true);
        let anti = per_term(&rules.anti_affinity.iter().collect::<Vec<_>>(), false);
        let preferred = per_term(&rules.preferred.iter().map(|w| &w.term).collect::<Vec<_>>(), false);
        let spread = rules.spread.iter().map(|c| SpreadFacts::new(snapshot, ns, shape, c)).collect();
        Self {
            volumes,
            resource_claims: Ok(ShapeClaims::default()),
            offered: RefCell::default(),
            affinity,
            anti,
            preferred,
            spread,
        }
    }
}

impl<'a> SpreadFacts<'a> {
    fn new(snapshot: &'a Snapshot, ns: &str, shape: &PodShape, c: &SpreadConstraint) -> Self {
        let nodes = snapshot.nodes();
        let mut eligible = vec![false; nodes.len()];
        let (mut counts, mut per_node) = (Counts::new(), HashMap::new());
        for (i, node) in nodes.iter().enumerate() {
            let has_keys = shape.rules.spread.iter().all(|c| node.labels.get(&c.topology_key).is_some());
            if !has_keys
                || (c.honor_node_affinity && !shape.matches_node(node))
                || (c.honor_taints && shape.untolerated_taint(node).is_some())
            {
                continue;
            }
            eligible[i] = true;
            if let Some(value) = node.labels.get(&c.topology_key) {
                counts.entry(value).or_insert(0);
            }
        }
        // Only pods of the pod's own namespace count.
        for p in snapshot.pods_in(ns) {
            let counted = eligible.get(p.node as usize).copied().unwrap_or(false)
                && c.counts(ns, &p.namespace, &p.labels, p.terminating);
            if let Some(value) = nodes[p.node as usize].labels.get(&c.topology_key).filter(|_| counted) {
                *counts.entry(value).or_default() += 1;
                *per_node.entry(p.node).or_default() += 1;
            }
        }
        Self { eligible, counts, per_node }
    }
}

/// One spread constraint as the pod being placed sees it.
struct SpreadLevel<'a> {
    constraint: &'a SpreadConstraint,
    counts: Counts<'a>,
    per_node: HashMap<u32, u32>,
    /// The global minimum (0 when fewer domains than `minDomains`).
    min: u32,
    self_match: u32,
}

/// The rules of one pod about other pods, evaluated against the snapshot and the plan so far.
pub(super) struct PodLevel<'a> {
    rules: &'a PodRules,
    affinity: Vec<Counts<'a>>,
    /// Some pod anywhere matches every affinity term (kube's non-empty affinity counts).
    affinity_any: bool,
    /// The pod matches its own affinity terms (it may be the first of a co-located group).
    self_affinity: bool,
    anti: Vec<Counts<'a>>,
    /// Domains (key, value) where a pod's anti-affinity selects this pod.
    forbidden: HashMap<&'a str, std::collections::HashSet<&'a str>>,
    preferred: Vec<Counts<'a>>,
    spread: Vec<SpreadLevel<'a>>,
    /// The pod binds host ports.
    ports: bool,
    /// A pod of this decision that shares an unbound WaitForFirstConsumer claim with this one
    /// went to this node: the claim's volume will be provisioned for it, so this pod follows.
    claim_node: Option<u32>,
    shape: &'a PodShape,
}

impl<'a> PodLevel<'a> {
    /// Whether every host port of the pod is free on node `i` (pods there and pods this
    /// decision placed there).
    pub(super) fn ports_free(&self, engine: &Engine<'a>, i: u32) -> bool {
        if !self.ports {
            return true;
        }
        let wanted = &self.shape.rules.host_ports;
        let taken = |ports: &[crate::scheduler::interpod::HostPort]| {
            wanted.iter().any(|w| ports.iter().any(|u| w.conflicts(u)))
        };
        !engine.snapshot.pods_on(i).any(|p| taken(&p.host_ports))
            && !engine.plan.iter().any(|t| t.node == i && taken(&t.shape.rules.host_ports))
    }

    /// InterPodAffinity and PodTopologySpread on node `i`: `Err` with the first rule it breaks.
    pub(super) fn check(&self, node: &'a NodeInfo, i: u32) -> Result<(), ReasonKey<'a>> {
        if self.claim_node.is_some_and(|n| n != i) {
            return Err(ReasonKey::VolumeNodeAffinity);
        }
        for s in self.spread.iter().filter(|s| s.constraint.hard) {
            let c = s.constraint;
            let Some(value) = node.labels.get(&c.topology_key) else { return Err(ReasonKey::SpreadLabel) };
            let skew =
                i64::from(s.counts.get(value).copied().unwrap_or(0)) + i64::from(s.self_match) - i64::from(s.min);
            if skew > i64::from(c.max_skew) {
                return Err(ReasonKey::Spread);
            }
            if c.honor_node_affinity
                && c.min_domains > 1
                && i64::from(s.per_node.get(&i).copied().unwrap_or(0)) + i64::from(s.self_match) > i64::from(c.max_skew)
            {
                return Err(ReasonKey::SpreadPinned);
            }
        }
        if !self.rules.affinity.is_empty() {
            let mut pods_exist = true;
            for (t, counts) in self.rules.affinity.iter().zip(&self.affinity) {
                let Some(value) = node.labels.get(&t.topology_key) else { return Err(ReasonKey::PodAffinity) };
                if counts.get(value).copied().unwrap_or(0) == 0 {
                    pods_exist = false;
                }
            }
            if !pods_exist && (self.affinity_any || !self.self_affinity) {
                return Err(ReasonKey::PodAffinity);
            }
        }
        for (t, counts) in self.rules.anti_affinity.iter().zip(&self.anti) {
            if let Some(value) = node.labels.get(&t.topology_key)
                && counts.get(value).copied().unwrap_or(0) > 0
            {
                return Err(ReasonKey::PodAntiAffinity);
            }
        }
        if self.forbidden.iter().any(|(k, values)| node.labels.get(k).is_some_and(|v| values.contains(v))) {
            return Err(ReasonKey::ExistingAntiAffinity);
        }
        Ok(())
    }

    /// Raw preference for the node: preferred affinity terms add their weight per matching
    /// pod in the node's domain, anti-affinity terms subtract it; each `ScheduleAnyway`
    /// constraint subtracts the matching pods already in the node's domain.
    pub(super) fn preference(&self, node: &NodeInfo) -> i64 {
        let mut raw = 0i64;
        for (w, counts) in self.rules.preferred.iter().zip(&self.preferred) {
            if let Some(value) = node.labels.get(&w.term.topology_key) {
                let n = i64::from(counts.get(value).copied().unwrap_or(0));
                raw += if w.anti { -n } else { n } * i64::from(w.weight);
            }
        }
        for s in self.spread.iter().filter(|s| !s.constraint.hard) {
            if let Some(value) = node.labels.get(&s.constraint.topology_key) {
                raw -= i64::from(s.counts.get(value).copied().unwrap_or(0));
            }
        }
        raw
    }
}

impl<'a> Engine<'a> {
    /// The rules of pod `pod` of `leaf` (shape `shape`) against the snapshot and the plan.
    fn pod_level(&self, leaf: &'a LeafGroup, shape: &'a PodShape, pod: usize) -> PodLevel<'a> {
        let rules = &shape.rules;
        let labels = &leaf.pods[pod].labels;
        let ns = self.namespace;
        let namespace_labels = self.snapshot.namespace_labels(ns);
        let nodes = self.snapshot.nodes();
        let facts = self.facts.of(shape);
        let clone = |f: Option<&Vec<Counts<'a>>>, n: usize| f.cloned().unwrap_or_else(|| vec![Counts::new(); n]);
        let mut affinity = clone(facts.map(|f| &f.affinity), rules.affinity.len());
        let mut anti = clone(facts.map(|f| &f.anti), rules.anti_affinity.len());
        let mut preferred = clone(facts.map(|f| &f.preferred), rules.preferred.len());
        let mut forbidden: HashMap<&'a str, std::collections::HashSet<&'a str>> = HashMap::new();
        for p in self.snapshot.anti_affinity_pods() {
            for t in p.anti_affinity.iter().filter(|t| t.matches(ns, labels, namespace_labels)) {
                if let Some(value) = nodes[p.node as usize].labels.get(&t.topology_key) {
                    forbidden.entry(t.topology_key.as_str()).or_default().insert(value);
                }
            }
        }
        let mut spread: Vec<SpreadLevel<'a>> = rules
            .spread
            .iter()
            .enumerate()
            .map(|(k, constraint)| {
                let f = facts.and_then(|f| f.spread.get(k));
                SpreadLevel {
                    constraint,
                    counts: f.map(|f| f.counts.clone()).unwrap_or_default(),
                    per_node: f.map(|f| f.per_node.clone()).unwrap_or_default(),
                    min: 0,
                    self_match: u32::from(constraint.matches_self(labels)),
                }
            })
            .collect();
        let volumes = self.snapshot.volumes();
        let waiting: Vec<&str> =
            shape.claims.iter().map(String::as_str).filter(|c| volumes.waits_for_consumer(ns, c)).collect();
        let mut claim_node = None;
        // The pods this decision placed count like pods already there.
        for t in &self.plan {
            if claim_node.is_none() && t.shape.claims.iter().any(|c| waiting.contains(&c.as_str())) {
                claim_node = Some(t.node);
            }
            let node = &nodes[t.node as usize];
            let other = &t.leaf.pods[t.pod].labels;
            if rules.matches_all_affinity(ns, other, namespace_labels) {
                for (counts, term) in affinity.iter_mut().zip(&rules.affinity) {
                    bump(counts, node, &term.topology_key);
                }
            }
            for (counts, term) in anti.iter_mut().zip(&rules.anti_affinity) {
                if term.matches(ns, other, namespace_labels) {
                    bump(counts, node, &term.topology_key);
                }
            }
            for (counts, w) in preferred.iter_mut().zip(&rules.preferred) {
                if w.term.matches(ns, other, namespace_labels) {
                    bump(counts, node, &w.term.topology_key);
                }
            }
            for term in t.shape.rules.anti_affinity.iter().filter(|term| term.matches(ns, labels, namespace_labels)) {
                if let Some(value) = node.labels.get(&term.topology_key) {
                    forbidden.entry(term.topology_key.as_str()).or_default().insert(value);
                }
            }
            for (k, s) in spread.iter_mut().enumerate() {
                let counted = facts.and_then(|f| f.spread.get(k)).is_some_and(|f| f.eligible[t.node as usize]);
                if counted && s.constraint.counts(ns, ns, other, false) {
                    bump(&mut s.counts, node, &s.constraint.topology_key);
                    *s.per_node.entry(t.node).or_default() += 1;
                }
            }
        }
        for s in &mut spread {
            let domains = s.counts.len();
            s.min = if domains < usize::try_from(s.constraint.min_domains.max(0)).unwrap_or(usize::MAX) {
                0
            } else {
                s.counts.values().copied().min().unwrap_or(0)
            };
        }
        PodLevel {
            rules,
            affinity_any: affinity.iter().any(|c| !c.is_empty()),
            self_affinity: rules.matches_all_affinity(ns, labels, namespace_labels),
            affinity,
            anti,
            forbidden,
            preferred,
            spread,
            ports: !rules.host_ports.is_empty(),
            claim_node,
            shape,
        }
    }

    /// Places `pods` (of `leaf`, all of `shape`) one at a time, each on the best node that
    /// passes every filter given the pods placed before it. Returns how many were placed and
    /// the scan of the last pod that found no node (or of the last pod).
    pub(super) fn fill_each(
        &mut self,
        leaf: &'a LeafGroup,
        shape: &'a PodShape,
        pods: &[usize],
        nodes: &[u32],
    ) -> (u32, Scan<'a>) {
        let mut placed = 0u32;
        let mut report = Scan { candidates: Vec::new(), tally: super::Tally::default(), nodes: 0 };
        let mut failed = false;
        for &pod in pods {
            let level = self.pod_level(leaf, shape, pod);
            let mut scan = self.scan(shape, nodes, Some(&level));
            normalise_preferences(&mut scan.candidates);
            scan.candidates.sort_unstable_by(by_score);
            let chosen = scan.candidates.iter().position(|c| self.place_one(leaf, shape, pod, c.node));
            match chosen {
                Some(_) => {
                    placed += 1;
                    if !failed {
                        report = scan;
                    }
                }
                None => {
                    failed = true;
                    scan.candidates.clear();
                    report = scan;
                }
            }
        }
        (placed, report)
    }
}

/// How many node evaluations a search for one gang may spend beyond the first attempt:
/// thousands of tries on a small cluster, a few dozen on 5,000 nodes.
const SEARCH_BUDGET: u64 = 200_000;

/// What one search looks through: the leaf, its gated pods in order, the nodes, the budget.
struct Search<'s, 'a> {
    leaf: &'a LeafGroup,
    sequence: &'s [(&'a PodShape, usize)],
    nodes: &'s [u32],
    budget: u64,
}

impl<'a> Engine<'a> {
    /// After the one-at-a-time attempt (everything since `checkpoint`) placed fewer than
    /// `need` pods: undoes it and searches the choices depth first (best-scored node first,
    /// a pod may be left out while enough others can still be placed), within
    /// [`SEARCH_BUDGET`]. On success the plan holds the found placement plus whatever of the
    /// left-out pods still fits, and the count is returned; otherwise the first attempt is
    /// redone and `None` returned.
    pub(super) fn search(
        &mut self,
        leaf: &'a LeafGroup,
        sequence: &[(&'a PodShape, usize)],
        nodes: &[u32],
        checkpoint: usize,
        need: u32,
    ) -> Option<u32> {
        let mut search = Search { leaf, sequence, nodes, budget: SEARCH_BUDGET };
        let first_attempt: Vec<(usize, u32)> = self.plan[checkpoint..].iter().map(|t| (t.pod, t.node)).collect();
        self.rollback(checkpoint);
        let skips = u32::try_from(sequence.len()).unwrap_or(u32::MAX).saturating_sub(need);
        if self.search_from(&mut search, 0, need, skips) {
            let taken: Vec<usize> = self.plan[checkpoint..].iter().map(|t| t.pod).collect();
            for &(shape, pod) in sequence.iter().filter(|(_, p)| !taken.contains(p)) {
                let level = self.pod_level(leaf, shape, pod);
                let mut scan = self.scan(shape, nodes, Some(&level));
                scan.candidates.sort_unstable_by(by_score);
                let _ = scan.candidates.iter().any(|c| self.place_one(leaf, shape, pod, c.node));
            }
            return u32::try_from(self.plan.len() - checkpoint).ok();
        }
        self.rollback(checkpoint);
        for (pod, node) in first_attempt {
            if let Some(&(shape, _)) = sequence.iter().find(|(_, p)| *p == pod) {
                self.place_one(leaf, shape, pod, node);
            }
        }
        None
    }

    fn search_from(&mut self, search: &mut Search<'_, 'a>, at: usize, need: u32, skips: u32) -> bool {
        if need == 0 {
            return true;
        }
        let Some(&(shape, pod)) = search.sequence.get(at) else { return false };
        let (leaf, nodes) = (search.leaf, search.nodes);
        let cost = nodes.len() as u64;
        if search.budget < cost {
            return false;
        }
        search.budget -= cost;
        let level = self.pod_level(leaf, shape, pod);
        let mut scan = self.scan(shape, nodes, Some(&level));
        normalise_preferences(&mut scan.candidates);
        scan.candidates.sort_unstable_by(by_score);
        for c in &scan.candidates {
            let mark = self.plan.len();
            if self.place_one(leaf, shape, pod, c.node) {
                if self.search_from(search, at + 1, need - 1, skips) {
                    return true;
                }
                self.rollback(mark);
            }
            if search.budget < cost {
                return false;
            }
        }
        skips > 0 && self.search_from(search, at + 1, need, skips - 1)
    }
}

/// Folds each candidate's raw inter-pod preference into its score: 0..=100 across the
/// candidates (kube normalises InterPodAffinity and PodTopologySpread scores the same way),
/// weighted 2 like those plugins in the default profile.
fn normalise_preferences(candidates: &mut [Candidate]) {
    let (Some(lo), Some(hi)) =
        (candidates.iter().map(|c| c.preference).min(), candidates.iter().map(|c| c.preference).max())
    else {
        return;
    };
    if hi == lo {
        return;
    }
    for c in candidates {
        let scaled = (c.preference - lo) * 100 / (hi - lo);
        c.score = c.score.saturating_add(u32::try_from(scaled * 2).unwrap_or(0));
    }
}

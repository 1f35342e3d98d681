//! PURE: gang-aware preemption and the reservation that keeps a waiting gang from starving.
//!
//! A quorate root that does not fit may preempt (its `preemptionPolicy` allows it): muster looks
//! for the cheapest set of running victims of strictly lower priority whose removal makes the
//! whole root fit, topology constraint and all. A victim group with disruption mode `all` goes
//! whole or not at all; a `single` group's pods go one by one, as do pods muster does not
//! manage. The cost, compared in order: fewer victim pods, a lower highest victim priority, a
//! lower sum of victim priorities, fewer GPUs freed beyond the preemptor's need. Up to
//! [`EXACT_UNITS`] candidate units every subset is weighed (the cheapest set is found); past
//! that, every candidate is removed and then given back from the most expensive down while the
//! root still fits (no victim of the result can be spared alone), as kube-scheduler does.
//!
//! The reservation: a quorate root that cannot be placed now keeps the nodes it would take if
//! every pod of lower priority were gone ([`reservation`]); roots of lower priority are placed
//! around them (backfill), so capacity freeing up goes to the waiting root first.

use std::collections::BTreeSet;

use super::gpu::GpuChooser;
use super::placement::{Decision, PlaceOptions, place};
use super::resources::Resources;
use super::snapshot::Snapshot;
use super::tree::{GroupTree, LeafGroup, PodState};
use crate::devices::GpuSet;
use muster_api::GPU_RESOURCE;
use muster_api::blocks::DisruptionModeKind;

/// Candidate units weighed exactly (every subset: `2^EXACT_UNITS` placements at most); past
/// this, the greedy search.
pub const EXACT_UNITS: usize = 10;

/// One running pod that could be preempted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VictimPod {
    /// `namespace/name`, as the snapshot knows the pod.
    pub key: String,
    /// The node it runs on.
    pub node: String,
    /// Its requests.
    pub requests: Resources,
    /// The GPU indices it holds.
    pub gpus: GpuSet,
}

/// How a victim group may be disrupted: its disruption mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VictimMode {
    /// `single`: its pods may go one by one (pods muster does not manage too).
    Single,
    /// `all`: the group goes whole, or not at all.
    All,
}

/// Running pods that belong together: a PodGroup (muster's or a bring-your-own one), or one
/// pod muster does not manage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VictimGroup {
    /// What events and status name it by (`namespace/name` of the group, or of the pod).
    pub name: String,
    /// Its priority (the group's, or the pod's).
    pub priority: i32,
    /// Its disruption mode.
    pub mode: VictimMode,
    /// Its running pods.
    pub pods: Vec<VictimPod>,
}

/// What may be preempted as one: a whole `all` group, or one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VictimUnit {
    /// Index into the groups given.
    pub group: usize,
    /// The pods that go together.
    pub pods: Vec<VictimPod>,
    /// The group's priority.
    pub priority: i32,
}

/// A preemption decided: the victims, and the plan the root gets once they are gone.
#[derive(Clone, Debug, PartialEq)]
pub struct Preemption {
    /// The units to preempt (every pod of each).
    pub victims: Vec<VictimUnit>,
    /// The root's placement on the snapshot without them (its nodes are the nomination).
    pub decision: Decision,
}

impl Preemption {
    /// Every victim pod.
    pub fn pods(&self) -> impl Iterator<Item = &VictimPod> {
        self.victims.iter().flat_map(|u| u.pods.iter())
    }

    /// The nodes the root is placed on once the victims are gone.
    pub fn nominated_nodes(&self) -> BTreeSet<String> {
        self.decision.plan.iter().map(|p| p.node.clone()).collect()
    }
}

/// Why no preemption was decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NoPreemption {
    /// The root's `preemptionPolicy` is `Never`.
    Never,
    /// No running pod has a lower priority than the root.
    NoCandidates,
    /// Even with every pod of lower priority gone, the root does not fit.
    DoesNotHelp,
    /// The root fits as the cluster is: nothing to preempt.
    NotNeeded,
}

impl std::fmt::Display for NoPreemption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NoPreemption::Never => "preemptionPolicy is Never",
            NoPreemption::NoCandidates => "no running pod has a lower priority",
            NoPreemption::DoesNotHelp => "preempting every pod of lower priority would not make it fit",
            NoPreemption::NotNeeded => "it fits without preempting",
        })
    }
}

/// PURE: the units `groups` may be preempted in by a root of priority `priority`: only groups
/// of strictly lower priority; an `all` group as one unit, a `single` group pod by pod.
pub fn units(groups: &[VictimGroup], priority: i32) -> Vec<VictimUnit> {
    let mut out = Vec::new();
    for (i, g) in groups.iter().enumerate().filter(|(_, g)| g.priority < priority && !g.pods.is_empty()) {
        match g.mode {
            VictimMode::All => out.push(VictimUnit { group: i, pods: g.pods.clone(), priority: g.priority }),
            VictimMode::Single => {
                out.extend(g.pods.iter().map(|p| VictimUnit { group: i, pods: vec![p.clone()], priority: g.priority }))
            }
        }
    }
    out
}

/// The cost of a victim set, compared in order: victim pods, the highest victim priority, the
/// sum of victim priorities, GPUs freed.
pub fn cost<'a>(victims: impl IntoIterator<Item = &'a VictimUnit>) -> (usize, i64, i64, i64) {
    let (mut pods, mut max, mut sum, mut gpus) = (0usize, i64::MIN, 0i64, 0i64);
    for u in victims {
        pods += u.pods.len();
        max = max.max(i64::from(u.priority));
        let pods_in = i64::try_from(u.pods.len()).unwrap_or(i64::MAX);
        sum = sum.saturating_add(i64::from(u.priority).saturating_mul(pods_in));
        gpus = u.pods.iter().map(|p| p.requests.get(GPU_RESOURCE)).fold(gpus, i64::saturating_add);
    }
    (pods, if pods == 0 { i64::MIN } else { max }, sum, gpus)
}

/// The snapshot with `units` gone.
fn without<'a>(snapshot: &Snapshot, units: impl IntoIterator<Item = &'a VictimUnit>) -> Snapshot {
    let mut s = snapshot.clone();
    let pods: Vec<&VictimPod> = units.into_iter().flat_map(|u| u.pods.iter()).collect();
    s.remove_pods(pods.iter().map(|p| (p.key.as_str(), p.node.as_str(), &p.requests, p.gpus)));
    s
}

fn fits(snapshot: &Snapshot, tree: &GroupTree, options: &PlaceOptions, gpus: &dyn GpuChooser) -> Option<Decision> {
    let decision = place(snapshot, tree, options, gpus);
    (decision.admitted && !decision.plan.is_empty()).then_some(decision)
}

/// PURE: the cheapest preemption that makes `tree` fit on `snapshot`, or why there is none.
/// `groups` are the running pods that may be victims (the shell leaves out those a
/// PodDisruptionBudget protects); `preempts` is the root's preemption policy.
pub fn preempt(
    snapshot: &Snapshot,
    tree: &GroupTree,
    preempts: bool,
    groups: &[VictimGroup],
    options: &PlaceOptions,
    gpus: &dyn GpuChooser,
) -> Result<Preemption, NoPreemption> {
    if !preempts {
        return Err(NoPreemption::Never);
    }
    let candidates = units(groups, tree.priority);
    if candidates.is_empty() {
        return Err(NoPreemption::NoCandidates);
    }
    if fits(snapshot, tree, options, gpus).is_some() {
        return Err(NoPreemption::NotNeeded);
    }
    if fits(&without(snapshot, &candidates), tree, options, gpus).is_none() {
        return Err(NoPreemption::DoesNotHelp);
    }
    if candidates.len() <= EXACT_UNITS {
        return exact(snapshot, tree, &candidates, options, gpus).ok_or(NoPreemption::DoesNotHelp);
    }
    greedy(snapshot, tree, candidates, options, gpus).ok_or(NoPreemption::DoesNotHelp)
}

/// Every subset, cheapest first: the first that fits.
fn exact(
    snapshot: &Snapshot,
    tree: &GroupTree,
    candidates: &[VictimUnit],
    options: &PlaceOptions,
    gpus: &dyn GpuChooser,
) -> Option<Preemption> {
    let n = candidates.len();
    let mut subsets: Vec<u32> = (1..(1u32 << n)).collect();
    let pick = |mask: u32| candidates.iter().enumerate().filter(move |(i, _)| mask & (1 << i) != 0).map(|(_, u)| u);
    subsets.sort_by_key(|&mask| (cost(pick(mask)), mask));
    subsets.into_iter().find_map(|mask| {
        let decision = fits(&without(snapshot, pick(mask)), tree, options, gpus)?;
        Some(Preemption { victims: pick(mask).cloned().collect(), decision })
    })
}

/// All candidates gone, then each given back, the most expensive first, while the root fits.
pub(super) fn greedy(
    snapshot: &Snapshot,
    tree: &GroupTree,
    mut candidates: Vec<VictimUnit>,
    options: &PlaceOptions,
    gpus: &dyn GpuChooser,
) -> Option<Preemption> {
    let mut decision = fits(&without(snapshot, &candidates), tree, options, gpus)?;
    // At scale most candidates run far from where the root lands: give back every unit with
    // no pod on the nodes of that placement at once, when the root still fits without them
    // (it does unless inter-pod rules tie them in), and weigh only the others one by one.
    let nodes: BTreeSet<&str> = decision.plan.iter().map(|p| p.node.as_str()).collect();
    let (near, far): (Vec<VictimUnit>, Vec<VictimUnit>) =
        candidates.into_iter().partition(|u| u.pods.iter().any(|p| nodes.contains(p.node.as_str())));
    if far.is_empty() {
        candidates = near;
    } else if let Some(d) = fits(&without(snapshot, &near), tree, options, gpus) {
        (candidates, decision) = (near, d);
    } else {
        candidates = near.into_iter().chain(far).collect();
    }
    // Most expensive to lose first: higher priority, then more pods, then more GPUs.
    candidates.sort_by_key(|u| std::cmp::Reverse(cost([u])));
    let mut victims: Vec<bool> = vec![true; candidates.len()];
    for i in 0..candidates.len() {
        victims[i] = false;
        let trial = candidates.iter().zip(&victims).filter(|(_, v)| **v).map(|(u, _)| u);
        match fits(&without(snapshot, trial), tree, options, gpus) {
            Some(d) => decision = d,
            None => victims[i] = true,
        }
    }
    let victims = candidates.into_iter().zip(victims).filter(|(_, v)| *v).map(|(u, _)| u).collect();
    Some(Preemption { victims, decision })
}

/// PURE: the nodes `tree` keeps while it waits: where it would be placed were every pod of
/// lower priority gone (`lower`: those pods, as victim groups of any mode). `None` when it
/// would not fit even then (it holds nothing back).
pub fn reservation(
    snapshot: &Snapshot,
    tree: &GroupTree,
    lower: &[VictimGroup],
    options: &PlaceOptions,
    gpus: &dyn GpuChooser,
) -> Option<BTreeSet<String>> {
    let gone: Vec<VictimUnit> = units(lower, tree.priority);
    let decision = fits(&without(snapshot, &gone), tree, options, gpus)?;
    Some(decision.plan.iter().map(|p| p.node.clone()).collect())
}

/// PURE: the nodes kept from `tree` because a waiting pod of its priority or higher, not its
/// own, is nominated to them (`status.nominatedNodeName`, written by muster for a preemptor
/// whose victims terminate, or by kube-scheduler for a pod it preempted for). kube-scheduler
/// counts such a pod on its node when it binds a pod of `tree`'s priority or lower, so a pin
/// there might not bind; a whole node is kept, as muster's reservations are.
pub fn nominated_against(snapshot: &Snapshot, tree: &GroupTree) -> BTreeSet<String> {
    if snapshot.nominations().next().is_none() {
        return BTreeSet::new();
    }
    let own: std::collections::HashSet<&str> =
        tree.root.leaves().into_iter().flat_map(|l| l.pods.iter().map(|p| p.name.as_str())).collect();
    snapshot.nominated_nodes(tree.priority, |key| {
        key.split_once('/').is_some_and(|(ns, name)| ns == tree.namespace && own.contains(name))
    })
}

/// The running pods of `tree` as victim groups, each of the group's priority: the whole root as
/// one group when its disruption mode is `all`; otherwise one group per PodGroup of it, of
/// that PodGroup's own mode (`leaf_mode`), so a gang of mode `all` inside a `single` composite
/// still goes whole or not at all. Each pod as the snapshot counts it (admission's store keeps
/// a bound pod without its containers).
pub fn victim_groups(
    tree: &GroupTree,
    root_mode: DisruptionModeKind,
    leaf_mode: impl Fn(&str) -> DisruptionModeKind,
    snapshot: &Snapshot,
) -> Vec<VictimGroup> {
    let leaves = tree.root.leaves();
    let running = |leaf: &LeafGroup| -> Vec<VictimPod> {
        let mut pods = Vec::new();
        for p in &leaf.pods {
            let node = match &p.state {
                PodState::Bound { node } => node.clone(),
                PodState::Admitted { hostname } => match snapshot.node_by_hostname(hostname) {
                    Some(n) => n.name.clone(),
                    None => continue,
                },
                _ => continue,
            };
            let key = format!("{}/{}", tree.namespace, p.name);
            let Some(counted) = snapshot.node_pod(&node, &key) else { continue };
            pods.push(VictimPod { key, node, requests: counted.requests.clone(), gpus: counted.victim.gpus });
        }
        pods
    };
    let mode = |m: DisruptionModeKind| if m == DisruptionModeKind::All { VictimMode::All } else { VictimMode::Single };
    let group = |name: &str, mode, pods: Vec<VictimPod>| VictimGroup {
        name: format!("{}/{name}", tree.namespace),
        priority: tree.priority,
        mode,
        pods,
    };
    let out: Vec<VictimGroup> = if root_mode == DisruptionModeKind::All {
        vec![group(tree.root.name(), VictimMode::All, leaves.iter().flat_map(|l| running(l)).collect())]
    } else {
        leaves.iter().map(|l| group(&l.name, mode(leaf_mode(&l.name)), running(l))).collect()
    };
    out.into_iter().filter(|g| !g.pods.is_empty()).collect()
}

/// Pods muster does not manage, of priority below `below`, as victim groups: the pods of one
/// native PodGroup together (their disruption mode is not muster's to know: they go whole or
/// not at all), any other pod alone. Terminating pods and those in `excluded` namespaces are
/// left out.
pub fn unmanaged_victims(
    snapshot: &Snapshot,
    below: i32,
    excluded: &std::collections::HashSet<String>,
) -> Vec<VictimGroup> {
    let mut groups: std::collections::BTreeMap<String, VictimGroup> = std::collections::BTreeMap::new();
    for p in snapshot.node_pods() {
        let v = &p.victim;
        if v.managed || p.terminating || v.priority >= below || excluded.contains(&*p.namespace) {
            continue;
        }
        let Some(node) = snapshot.nodes().get(p.node as usize) else { continue };
        let pod =
            VictimPod { key: p.key.to_string(), node: node.name.clone(), requests: p.requests.clone(), gpus: v.gpus };
        let (name, mode) = match &v.native_group {
            Some(g) => (format!("{}/{g}", p.namespace), VictimMode::All),
            None => (p.key.to_string(), VictimMode::Single),
        };
        let group = groups.entry(name.clone()).or_insert_with(|| VictimGroup {
            name,
            priority: v.priority,
            mode,
            pods: Vec::new(),
        });
        group.priority = group.priority.max(v.priority);
        group.pods.push(pod);
    }
    groups.into_values().collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::scheduler::{
        CPU, CompositeGroup, CompositePolicy, Group, LeafGroup, LeafPolicy, LowestFreeIndices, NodeInfo, PODS,
        PodShape, PodUsage,
    };

    const RACK: &str = "topology.muster.dev/rack";

    /// A cluster: `nodes` of `gpus` GPUs (rack `i % 2`), running `groups` (each pod:
    /// (node, GPUs)); the snapshot counts them all.
    /// A running group: (priority, mode, its pods as (node, GPUs)).
    type Running = (i32, VictimMode, Vec<(usize, i64)>);

    fn cluster(nodes: usize, gpus: i64, groups: &[Running]) -> (Snapshot, Vec<VictimGroup>) {
        let infos: Vec<NodeInfo> = (0..nodes)
            .map(|i| {
                let name = format!("n{i}");
                NodeInfo::new(&name, Resources::new().with(CPU, 64_000).with(PODS, 110).with(GPU_RESOURCE, gpus))
                    .with_label(muster_api::HOSTNAME_LABEL, &name)
                    .with_label(RACK, &format!("r{}", i % 2))
            })
            .collect();
        let mut snapshot = Snapshot::new(infos);
        let mut used = vec![GpuSet::EMPTY; nodes];
        let mut out = Vec::new();
        for (g, (priority, mode, pods)) in groups.iter().enumerate() {
            let mut victims = Vec::new();
            for (p, (node, count)) in pods.iter().enumerate() {
                let free = GpuSet::first(gpus as usize).difference(used[*node]);
                let Some(mine) = free.lowest_n(*count as usize) else { continue };
                used[*node] = used[*node].union(mine);
                let key = format!("ns/g{g}-{p}");
                let requests = Resources::new().with(CPU, 100).with(PODS, 1).with(GPU_RESOURCE, *count);
                assert!(snapshot.add_usage(&PodUsage::bound(
                    &key,
                    &format!("n{node}"),
                    requests.clone(),
                    Default::default()
                )));
                victims.push(VictimPod { key, node: format!("n{node}"), requests, gpus: mine });
            }
            out.push(VictimGroup { name: format!("ns/g{g}"), priority: *priority, mode: *mode, pods: victims });
        }
        for (i, u) in used.iter().enumerate() {
            snapshot.set_gpu_used(&format!("n{i}"), *u);
        }
        (snapshot, out)
    }

    /// A gang of `pods` pods of `gpus` GPUs at `priority`, in one rack when `rack`.
    fn gang(pods: usize, gpus: i64, priority: i32, rack: bool) -> GroupTree {
        let mut leaf = LeafGroup::new("preemptor", LeafPolicy::Gang { min_count: pods as u32 });
        if rack {
            leaf.topology_key = Some(RACK.into());
        }
        let shape = PodShape::new(Resources::new().with(CPU, 100).with(PODS, 1).with(GPU_RESOURCE, gpus));
        for i in 0..pods {
            leaf.add_gated(&format!("p-{i}"), &format!("uid-{i}"), shape.clone());
        }
        let mut tree = GroupTree::new("ns", Group::Leaf(leaf));
        tree.priority = priority;
        tree
    }

    /// A waiting pod `key` of `priority` nominated to `node`.
    fn nominated(key: &str, node: &str, priority: i32) -> PodUsage {
        let victim = crate::scheduler::VictimInfo { priority, ..Default::default() };
        let mut usage = PodUsage::bound(key, node, Resources::new().with(GPU_RESOURCE, 8), victim);
        usage.target = crate::scheduler::Target::Nominated(node.into());
        usage
    }

    #[test]
    fn nominated_nodes_are_kept_from_roots_of_the_nominee_priority_or_lower_but_its_own() {
        // (case, nominations as (pod, node, priority), the root's priority, nodes kept from it)
        type Nominations<'a> = Vec<(&'a str, &'a str, i32)>;
        let cases: Vec<(&str, Nominations, i32, Vec<&str>)> = vec![
            ("none", vec![], 2, vec![]),
            ("higher priority", vec![("other/a", "n0", 3)], 2, vec!["n0"]),
            ("equal priority", vec![("other/a", "n1", 2)], 2, vec!["n1"]),
            ("lower priority: kube-scheduler ignores it too", vec![("other/a", "n0", 1)], 2, vec![]),
            ("the root's own pod", vec![("ns/p-0", "n0", 2)], 2, vec![]),
            ("a pod of that name in another namespace", vec![("other/p-0", "n0", 2)], 2, vec!["n0"]),
            ("several", vec![("ns/p-1", "n0", 5), ("x/a", "n1", 9), ("x/b", "n2", 0)], 2, vec!["n1"]),
            ("a node not in the snapshot", vec![("x/a", "gone", 9)], 2, vec![]),
        ];
        for (case, nominations, priority, want) in cases {
            let (mut snapshot, _) = cluster(3, 8, &[]);
            for (key, node, p) in &nominations {
                let counted = snapshot.add_usage(&nominated(key, node, *p));
                assert_eq!(counted, *node != "gone", "{case}");
            }
            // A nomination uses nothing: every GPU is still free.
            assert!(snapshot.nodes().iter().all(|n| n.requested.get(GPU_RESOURCE) == 0), "{case}");
            let tree = gang(2, 8, priority, false);
            let got = nominated_against(&snapshot, &tree);
            assert_eq!(got, want.into_iter().map(String::from).collect::<BTreeSet<_>>(), "{case}");
        }
    }

    fn fits_without(snapshot: &Snapshot, tree: &GroupTree, victims: &[&VictimUnit]) -> bool {
        fits(&without(snapshot, victims.iter().copied()), tree, &PlaceOptions::default(), &LowestFreeIndices).is_some()
    }

    fn arb_mode() -> impl Strategy<Value = VictimMode> {
        prop_oneof![Just(VictimMode::Single), Just(VictimMode::All)]
    }

    /// Small clusters: 1 to 3 nodes of 4 or 8 GPUs, 1 to 5 groups of 1 or 2 pods.
    /// (nodes, GPUs per node, running groups, preemptor pods, GPUs per preemptor pod, one rack)
    type Case = (usize, i64, Vec<Running>, usize, i64, bool);

    fn arb_case() -> impl Strategy<Value = Case> {
        (1..=3usize, prop_oneof![Just(4i64), Just(8i64)]).prop_flat_map(|(nodes, gpus)| {
            let pod = (0..nodes, 1..=gpus.min(4));
            // Priorities 0 to 2 against the preemptor's 2: mostly candidates, some equal.
            let group = (prop_oneof![3 => 0..=1i32, 1 => Just(2)], arb_mode(), prop::collection::vec(pod, 1..=2));
            (
                Just(nodes),
                Just(gpus),
                prop::collection::vec(group, 1..=5),
                1..=3usize,
                1..=gpus,
                prop::bool::weighted(0.3),
            )
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Never a partial `all` group, never a victim of equal or higher priority, the
        /// preemptor fits once the victims are gone, and no cheaper set of candidates would do
        /// (every subset weighed by brute force).
        #[test]
        fn the_cheapest_whole_unit_victim_set_of_lower_priority(
            (nodes, gpus, groups, pods, each, rack) in arb_case()
        ) {
            let (snapshot, groups) = cluster(nodes, gpus, &groups);
            let tree = gang(pods, each, 2, rack);
            let options = PlaceOptions::default();
            let already = fits(&snapshot, &tree, &options, &LowestFreeIndices).is_some();
            let candidates = units(&groups, tree.priority);
            let result = preempt(&snapshot, &tree, true, &groups, &options, &LowestFreeIndices);
            // Brute force: the cheapest subset of candidates that makes it fit.
            let n = candidates.len();
            prop_assert!(n <= EXACT_UNITS);
            let mut best: Option<(usize, i64, i64, i64)> = None;
            for mask in 1u32..(1 << n) {
                let set: Vec<&VictimUnit> = (0..n).filter(|i| mask & (1 << i) != 0).map(|i| &candidates[i]).collect();
                if fits_without(&snapshot, &tree, &set) {
                    let c = cost(set.iter().copied());
                    best = Some(best.map_or(c, |b| b.min(c)));
                }
            }
            match result {
                Ok(p) => {
                    prop_assert!(!already, "preempted for a root that fits");
                    prop_assert!(!p.victims.is_empty());
                    for u in &p.victims {
                        prop_assert!(u.priority < tree.priority, "victim {} of priority {}", groups[u.group].name, u.priority);
                    }
                    for (g, group) in groups.iter().enumerate().filter(|(_, g)| g.mode == VictimMode::All) {
                        let taken = p.pods().filter(|v| group.pods.iter().any(|q| q.key == v.key)).count();
                        prop_assert!(taken == 0 || taken == group.pods.len(), "group {g}: {taken} of {}", group.pods.len());
                    }
                    let victims: Vec<&VictimUnit> = p.victims.iter().collect();
                    prop_assert!(fits_without(&snapshot, &tree, &victims), "does not fit once the victims are gone");
                    prop_assert!(p.decision.admitted);
                    prop_assert_eq!(Some(cost(p.victims.iter())), best, "not the cheapest set");
                }
                Err(NoPreemption::NoCandidates) => prop_assert!(candidates.is_empty()),
                Err(NoPreemption::DoesNotHelp) => prop_assert!(best.is_none() && !already),
                Err(NoPreemption::NotNeeded) => prop_assert!(already),
                Err(NoPreemption::Never) => prop_assert!(false, "preempts was true"),
            }
        }

        /// Past [`EXACT_UNITS`]: the greedy search still returns whole units of lower priority
        /// after which the preemptor fits, and no victim of it could be spared alone.
        #[test]
        fn the_greedy_set_spares_no_victim_it_could(
            (nodes, gpus, groups, pods, each, rack) in arb_case()
        ) {
            let (snapshot, groups) = cluster(nodes, gpus, &groups);
            let tree = gang(pods, each, 2, rack);
            let options = PlaceOptions::default();
            let candidates = units(&groups, tree.priority);
            if let Some(p) = greedy(&snapshot, &tree, candidates, &options, &LowestFreeIndices) {
                let victims: Vec<&VictimUnit> = p.victims.iter().collect();
                prop_assert!(fits_without(&snapshot, &tree, &victims));
                for i in 0..victims.len() {
                    let mut fewer = victims.clone();
                    fewer.remove(i);
                    prop_assert!(!fits_without(&snapshot, &tree, &fewer), "victim {i} could be spared");
                }
                prop_assert!(p.victims.iter().all(|u| u.priority < tree.priority));
            }
        }
    }

    #[test]
    fn an_eight_gpu_gang_preempts_two_four_gpu_gangs_wholly_and_never_an_equal_one() {
        // One 8-GPU node: two mode-all gangs of 2 x 2 GPUs at priority 0.
        let groups = [(0, VictimMode::All, vec![(0, 2), (0, 2)]), (0, VictimMode::All, vec![(0, 2), (0, 2)])];
        let (snapshot, groups) = cluster(1, 8, &groups);
        let tree = gang(1, 8, 1000, false);
        let options = PlaceOptions::default();
        let p = preempt(&snapshot, &tree, true, &groups, &options, &LowestFreeIndices).expect("a preemption");
        assert_eq!(p.pods().count(), 4);
        assert_eq!(p.nominated_nodes().into_iter().collect::<Vec<_>>(), ["n0"]);
        assert_eq!(preempt(&snapshot, &tree, false, &groups, &options, &LowestFreeIndices), Err(NoPreemption::Never));
        let equal = gang(1, 8, 0, false);
        assert_eq!(
            preempt(&snapshot, &equal, true, &groups, &options, &LowestFreeIndices),
            Err(NoPreemption::NoCandidates)
        );
        // A 4-GPU preemptor takes one whole gang, not a pod of each.
        let half = gang(1, 4, 1000, false);
        let p = preempt(&snapshot, &half, true, &groups, &options, &LowestFreeIndices).expect("a preemption");
        assert_eq!(p.victims.len(), 1);
        assert_eq!(p.pods().count(), 2);
        // Single-mode pods go one by one: the cheapest is two pods, not four.
        let singles = [(0, VictimMode::Single, vec![(0, 2), (0, 2), (0, 2), (0, 2)])];
        let (snapshot, groups) = cluster(1, 8, &singles);
        let p = preempt(&snapshot, &half, true, &groups, &options, &LowestFreeIndices).expect("a preemption");
        assert_eq!(p.pods().count(), 2);
        // Lower priority goes first when the counts tie.
        let mixed = [(5, VictimMode::All, vec![(0, 4)]), (1, VictimMode::All, vec![(0, 4)])];
        let (snapshot, groups) = cluster(1, 8, &mixed);
        let p = preempt(&snapshot, &half, true, &groups, &options, &LowestFreeIndices).expect("a preemption");
        assert_eq!(groups[p.victims[0].group].name, "ns/g1");
    }

    #[test]
    fn a_waiting_gang_reserves_the_nodes_it_would_take() {
        // Two 8-GPU nodes, one half used by a priority-0 pod: an 8-GPU gang of 2 waits; it
        // reserves both nodes (the used one once the lower pod goes).
        let (snapshot, groups) = cluster(2, 8, &[(0, VictimMode::Single, vec![(1, 4)])]);
        let tree = gang(2, 8, 10, false);
        let options = PlaceOptions::default();
        assert!(fits(&snapshot, &tree, &options, &LowestFreeIndices).is_none());
        let kept = reservation(&snapshot, &tree, &groups, &options, &LowestFreeIndices).expect("a reservation");
        assert_eq!(kept.into_iter().collect::<Vec<_>>(), ["n0", "n1"]);
        // A gang that cannot fit even then reserves nothing.
        assert_eq!(reservation(&snapshot, &gang(3, 8, 10, false), &groups, &options, &LowestFreeIndices), None);
    }

    #[test]
    fn removed_pods_free_their_requests_gpus_and_inter_pod_presence() {
        let (snapshot, groups) = cluster(1, 8, &[(0, VictimMode::All, vec![(0, 4), (0, 2)])]);
        let node = |s: &Snapshot| s.node("n0").cloned().expect("node");
        assert_eq!(node(&snapshot).requested.get(GPU_RESOURCE), 6);
        assert_eq!(snapshot.pods_on(0).count(), 2);
        let gone = without(&snapshot, units(&groups, 1).iter());
        assert_eq!(node(&gone).requested.get(GPU_RESOURCE), 0);
        assert_eq!(node(&gone).gpu_used, GpuSet::EMPTY);
        assert_eq!(gone.pods_on(0).count(), 0);
        assert_eq!(gone.pods_in("ns").count(), 0);
        // A pod the snapshot does not have frees nothing.
        let mut other = snapshot.clone();
        let stranger = Resources::new().with(GPU_RESOURCE, 4);
        other.remove_pods([("ns/nobody", "n0", &stranger, GpuSet::first(4))]);
        assert_eq!(node(&other).requested.get(GPU_RESOURCE), 6);
    }

    #[test]
    fn a_gang_of_mode_all_goes_whole_even_inside_a_single_composite() {
        let mut snapshot = Snapshot::new(vec![
            NodeInfo::new("n0", Resources::new().with(GPU_RESOURCE, 8)).with_label(muster_api::HOSTNAME_LABEL, "n0"),
        ]);
        let mut composite = CompositeGroup::new("set", CompositePolicy::Basic);
        for (leaf, pods) in [("set-gang", 2), ("set-loose", 2)] {
            let mut g = LeafGroup::new(leaf, LeafPolicy::Gang { min_count: 2 });
            for i in 0..pods {
                let name = format!("{leaf}-{i}");
                let one = Resources::new().with(GPU_RESOURCE, 1);
                assert!(snapshot.add_usage(&PodUsage::bound(&format!("ns/{name}"), "n0", one, Default::default())));
                g.push(&name, &format!("uid-{name}"), PodState::Bound { node: "n0".into() });
            }
            composite.children.push(g.into());
        }
        // A pod never counted (gated) is not a victim.
        if let Group::Leaf(l) = &mut composite.children[1] {
            l.push("set-loose-gated", "uid-gated", PodState::Unmanaged);
        }
        let tree = GroupTree::new("ns", composite);
        let leaf_mode =
            |name: &str| if name == "set-gang" { DisruptionModeKind::All } else { DisruptionModeKind::Single };
        let groups = victim_groups(&tree, DisruptionModeKind::Single, leaf_mode, &snapshot);
        let shown: Vec<(String, VictimMode, usize)> =
            groups.iter().map(|g| (g.name.clone(), g.mode, g.pods.len())).collect();
        assert_eq!(
            shown,
            [("ns/set-gang".to_string(), VictimMode::All, 2), ("ns/set-loose".to_string(), VictimMode::Single, 2)]
        );
        // A root of mode all: the whole tree is one victim.
        let whole = victim_groups(&tree, DisruptionModeKind::All, leaf_mode, &snapshot);
        assert_eq!(whole.len(), 1);
        assert_eq!((whole[0].name.as_str(), whole[0].mode, whole[0].pods.len()), ("ns/set", VictimMode::All, 4));
        assert!(whole[0].pods.iter().all(|p| p.requests.get(GPU_RESOURCE) == 1 && p.node == "n0"));
    }

    #[test]
    fn pods_muster_does_not_manage_go_alone_or_with_their_native_group() {
        let mut snapshot = Snapshot::new(vec![
            NodeInfo::new("n0", Resources::new().with(GPU_RESOURCE, 8)).with_label(muster_api::HOSTNAME_LABEL, "n0"),
        ]);
        let mut add = |key: &str, priority: i32, managed: bool, group: Option<&str>| {
            let victim = crate::scheduler::VictimInfo {
                priority,
                managed,
                native_group: group.map(Into::into),
                ..Default::default()
            };
            let one = Resources::new().with(GPU_RESOURCE, 1);
            assert!(snapshot.add_usage(&PodUsage::bound(key, "n0", one, victim)));
        };
        add("ns/plain", 0, false, None);
        add("ns/w-0", 0, false, Some("w"));
        add("ns/w-1", 0, false, Some("w"));
        add("ns/mine", 0, true, None);
        add("ns/important", 5, false, None);
        add("kube-system/dns", 0, false, None);
        let excluded = std::collections::HashSet::from(["kube-system".to_string()]);
        let groups = unmanaged_victims(&snapshot, 5, &excluded);
        let shown: Vec<(String, VictimMode, usize)> =
            groups.iter().map(|g| (g.name.clone(), g.mode, g.pods.len())).collect();
        assert_eq!(shown, [("ns/plain".to_string(), VictimMode::Single, 1), ("ns/w".to_string(), VictimMode::All, 2)]);
    }
}

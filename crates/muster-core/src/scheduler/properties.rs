//! Property tests over random clusters and group trees: the invariants every decision keeps,
//! checked against the plan by code independent of the placement engine.

use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;

use super::*;
use crate::devices::GpuSet;
use muster_api::GPU_RESOURCE;

const GIB: i64 = 1 << 30;
const RACK: &str = "topology.muster.dev/rack";

/// Random node: cores, GiB, pod slots, GPUs, rack, pool label, taint kind, cordoned, usage.
fn arb_node() -> impl Strategy<Value = NodeInfo> {
    (
        (1..=16i64, 1..=64i64, 1..=8i64, 0..=8i64),
        (prop::option::of(0..3u8), any::<bool>(), 0..4u8, prop::bool::weighted(0.1)),
        (0..=100i64, 0..=100i64, 0..=100i64, any::<u64>()),
    )
        .prop_map(
            |((cores, gib, pods, gpus), (rack, gpu_pool, taint, cordoned), (cpu_pct, mem_pct, pod_pct, used))| {
                let allocatable = Resources::new()
                    .with(CPU, cores * 1000)
                    .with(MEMORY, gib * GIB)
                    .with(PODS, pods)
                    .with(GPU_RESOURCE, gpus);
                let mut node = NodeInfo::new("", allocatable);
                let gpu_used = GpuSet::from_bits(used).intersection(node.gpus());
                node.requested = Resources::new()
                    .with(CPU, cores * 10 * cpu_pct)
                    .with(MEMORY, gib * GIB / 100 * mem_pct)
                    .with(PODS, pods * pod_pct / 100)
                    .with(GPU_RESOURCE, gpu_used.len() as i64);
                node.gpu_used = gpu_used;
                if let Some(r) = rack {
                    node.labels.insert(RACK, &format!("rack-{r}"));
                }
                node.labels.insert("pool", if gpu_pool { "gpu" } else { "cpu" });
                let effect = [
                    None,
                    Some(TaintEffect::NoSchedule),
                    Some(TaintEffect::NoExecute),
                    Some(TaintEffect::PreferNoSchedule),
                ];
                if let Some(effect) = effect[usize::from(taint)] {
                    node.taints.push(Taint::new("dedicated", "infra", effect));
                }
                node.unschedulable = cordoned;
                node
            },
        )
}

fn arb_nodes() -> impl Strategy<Value = Vec<NodeInfo>> {
    prop::collection::vec(arb_node(), 1..10).prop_map(|mut nodes| {
        for (i, n) in nodes.iter_mut().enumerate() {
            n.name = format!("n{i}");
            n.labels.insert(muster_api::HOSTNAME_LABEL, &n.name.clone());
        }
        nodes
    })
}

fn arb_shape() -> impl Strategy<Value = PodShape> {
    (0..=4000i64, 0..=4i64, 0..=4i64, any::<bool>(), prop::option::of(any::<bool>())).prop_map(
        |(cpu, gib, gpus, tolerate, pool)| {
            let mut shape = PodShape::new(
                Resources::new().with(CPU, cpu).with(MEMORY, gib * GIB).with(PODS, 1).with(GPU_RESOURCE, gpus),
            );
            if tolerate {
                shape.tolerations.push(Toleration { key: "dedicated".into(), exists: true, ..Default::default() });
            }
            if let Some(gpu) = pool {
                shape.node_selector.push(("pool".into(), if gpu { "gpu" } else { "cpu" }.into()));
            }
            shape
        },
    )
}

/// A leaf without a name: policy, topology, (shape, gated pods) pairs, pods bound before.
#[derive(Clone, Debug)]
struct LeafSpec {
    min_count: Option<u32>,
    topology: bool,
    shapes: Vec<(PodShape, usize)>,
    bound: Vec<usize>,
}

fn arb_leaf() -> impl Strategy<Value = LeafSpec> {
    (
        prop::option::of(1..=5u32),
        prop::bool::weighted(0.3),
        prop::collection::vec((arb_shape(), 0..=4usize), 1..=2),
        prop::collection::vec(0..10usize, 0..=2),
    )
        .prop_map(|(min_count, topology, shapes, bound)| LeafSpec { min_count, topology, shapes, bound })
}

impl LeafSpec {
    fn build(&self, name: &str) -> LeafGroup {
        let policy = match self.min_count {
            Some(min_count) => LeafPolicy::Gang { min_count },
            None => LeafPolicy::Basic,
        };
        let mut leaf = LeafGroup::new(name, policy);
        if self.topology {
            leaf.topology_key = Some(RACK.into());
        }
        for (s, (shape, n)) in self.shapes.iter().enumerate() {
            for i in 0..*n {
                leaf.add_gated(&format!("{name}-s{s}-{i}"), "", shape.clone());
            }
        }
        for (i, node) in self.bound.iter().enumerate() {
            leaf.push(&format!("{name}-old-{i}"), "", PodState::Bound { node: format!("n{node}") });
        }
        leaf
    }
}

/// A composite without names: policy, topology, leaf children, an optional nested composite.
#[derive(Clone, Debug)]
struct TreeSpec {
    root_leaf: Option<LeafSpec>,
    min_group_count: Option<u32>,
    topology: bool,
    leaves: Vec<LeafSpec>,
    nested: Option<(Option<u32>, Vec<LeafSpec>)>,
}

fn arb_tree() -> impl Strategy<Value = TreeSpec> {
    (
        prop::option::weighted(0.3, arb_leaf()),
        prop::option::of(1..=3u32),
        prop::bool::weighted(0.3),
        prop::collection::vec(arb_leaf(), 1..=3),
        prop::option::weighted(0.3, (prop::option::of(1..=2u32), prop::collection::vec(arb_leaf(), 1..=2))),
    )
        .prop_map(|(root_leaf, min_group_count, topology, leaves, nested)| TreeSpec {
            root_leaf,
            min_group_count,
            topology,
            leaves,
            nested,
        })
}

fn composite_policy(min: Option<u32>) -> CompositePolicy {
    match min {
        Some(min_group_count) => CompositePolicy::Gang { min_group_count },
        None => CompositePolicy::Basic,
    }
}

impl TreeSpec {
    fn build(&self) -> GroupTree {
        if let Some(leaf) = &self.root_leaf {
            return GroupTree::new("ns", leaf.build("root"));
        }
        let mut root = CompositeGroup::new("root", composite_policy(self.min_group_count));
        if self.topology {
            root.topology_key = Some(RACK.into());
        }
        for (i, leaf) in self.leaves.iter().enumerate() {
            root.children.push(Group::Leaf(leaf.build(&format!("l{i}"))));
        }
        if let Some((min, leaves)) = &self.nested {
            let mut nested = CompositeGroup::new("nested", composite_policy(*min));
            for (i, leaf) in leaves.iter().enumerate() {
                nested.children.push(Group::Leaf(leaf.build(&format!("nested-l{i}"))));
            }
            root.children.push(Group::Composite(nested));
        }
        GroupTree::new("ns", root)
    }
}

fn planned_per_leaf(d: &Decision) -> HashMap<&str, u32> {
    let mut out = HashMap::new();
    for p in &d.plan {
        *out.entry(p.pod_group.as_str()).or_default() += 1;
    }
    out
}

/// Whether a group's policy is met by what existed plus what the plan adds.
fn satisfied(group: &Group, planned: &HashMap<&str, u32>) -> bool {
    match group {
        Group::Leaf(l) => l.placed_pods() + planned.get(l.name.as_str()).copied().unwrap_or(0) >= l.min_count(),
        Group::Composite(c) => {
            let ok = c.children.iter().filter(|g| satisfied(g, planned)).count();
            u32::try_from(ok).unwrap_or(u32::MAX) >= c.policy.min_group_count()
        }
    }
}

fn planned_in(group: &Group, planned: &HashMap<&str, u32>) -> u32 {
    group.leaves().iter().map(|l| planned.get(l.name.as_str()).copied().unwrap_or(0)).sum()
}

fn check_no_partial_gang(group: &Group, planned: &HashMap<&str, u32>) -> Result<(), TestCaseError> {
    if planned_in(group, planned) > 0 {
        prop_assert!(
            satisfied(group, planned),
            "group {} has pods in the plan but its policy is not met",
            group.name()
        );
    }
    if let Group::Composite(c) = group {
        for child in &c.children {
            check_no_partial_gang(child, planned)?;
        }
    }
    Ok(())
}

fn check_topology(snapshot: &Snapshot, group: &Group, d: &Decision) -> Result<(), TestCaseError> {
    if let Some(key) = group.topology_key() {
        let leaves: Vec<&str> = group.leaves().iter().map(|l| l.name.as_str()).collect();
        let mut domains: Vec<Option<&str>> = d
            .plan
            .iter()
            .filter(|p| leaves.contains(&p.pod_group.as_str()))
            .map(|p| snapshot.node(&p.node).and_then(|n| n.labels.get(key)))
            .collect();
        for leaf in group.leaves() {
            for pod in &leaf.pods {
                if let PodState::Bound { node } = &pod.state
                    && !domains.is_empty()
                    && let Some(n) = snapshot.node(node)
                {
                    domains.push(n.labels.get(key));
                }
            }
        }
        domains.dedup();
        prop_assert!(domains.len() <= 1 && !domains.contains(&None), "group {} spans {domains:?}", group.name());
    }
    if let Group::Composite(c) = group {
        for child in &c.children {
            check_topology(snapshot, child, d)?;
        }
    }
    Ok(())
}

/// Every invariant a decision must keep, checked from the plan alone.
fn check_decision(snapshot: &Snapshot, tree: &GroupTree, d: &Decision) -> Result<(), TestCaseError> {
    let planned = planned_per_leaf(d);
    prop_assert!(!d.admitted || satisfied(&tree.root, &planned), "an admitted root meets its policy");
    if !d.admitted {
        prop_assert!(d.plan.is_empty(), "a root that is not admitted has an empty plan");
    }
    check_no_partial_gang(&tree.root, &planned)?;
    check_topology(snapshot, &tree.root, d)?;

    let leaves: HashMap<&str, &LeafGroup> = tree.root.leaves().into_iter().map(|l| (l.name.as_str(), l)).collect();
    let mut added: BTreeMap<&str, (Resources, GpuSet)> = BTreeMap::new();
    let mut seen_pods = std::collections::HashSet::new();
    for p in &d.plan {
        prop_assert!(seen_pods.insert((&p.pod_group, &p.pod)), "pod {} placed twice", p.pod);
        let leaf = leaves[p.pod_group.as_str()];
        let pod = leaf.pods.iter().find(|x| x.name == p.pod).ok_or_else(|| TestCaseError::fail("unknown pod"))?;
        let PodState::Gated { shape } = pod.state else {
            return Err(TestCaseError::fail("placed a pod that is not gated"));
        };
        let shape = &leaf.shapes[shape];
        let node = snapshot.node(&p.node).ok_or_else(|| TestCaseError::fail("unknown node"))?;
        prop_assert_eq!(Some(p.hostname.as_str()), node.hostname());
        prop_assert!(node.unusable.is_none());
        prop_assert!(!node.unschedulable || shape.tolerates_unschedulable(), "cordoned node {}", node.name);
        prop_assert!(shape.untolerated_taint(node).is_none(), "untolerated taint on {}", node.name);
        prop_assert!(shape.matches_node(node), "selector mismatch on {}", node.name);
        prop_assert_eq!(p.gpus.len(), shape.gpus as usize, "GPU indices for {}", &p.pod);
        let (resources, gpus) = added.entry(p.node.as_str()).or_default();
        prop_assert!(gpus.is_disjoint(p.gpus), "a GPU index given twice on {}", &p.node);
        prop_assert!(node.gpu_used.is_disjoint(p.gpus), "a used GPU index given on {}", &p.node);
        prop_assert!(p.gpus.is_subset(node.gpus()), "an index beyond the node's GPUs on {}", &p.node);
        *gpus = gpus.union(p.gpus);
        resources.add(&shape.requests);
    }
    for (name, (resources, _)) in &added {
        let node = snapshot.node(name).ok_or_else(|| TestCaseError::fail("unknown node"))?;
        for (resource, amount) in resources.iter() {
            let total = node.requested.get(resource) + amount;
            prop_assert!(
                amount <= 0 || total <= node.allocatable.get(resource),
                "node {name} over its allocatable {resource}: {total} > {}",
                node.allocatable.get(resource)
            );
        }
    }
    Ok(())
}

/// Pods of `shape` a node takes, counted one by one the slow way.
fn naive_fit(node: &NodeInfo, shape: &PodShape) -> u32 {
    if node.unusable.is_some()
        || (node.unschedulable && !shape.tolerates_unschedulable())
        || shape.untolerated_taint(node).is_some()
        || !shape.matches_node(node)
    {
        return 0;
    }
    let mut used = node.requested.clone();
    let mut free_gpus = node.gpus().difference(node.gpu_used).len() as u32;
    let mut n = 0;
    loop {
        let mut after = used.clone();
        after.add(&shape.requests);
        let fits = after.iter().all(|(r, v)| shape.requests.get(r) <= 0 || v <= node.allocatable.get(r));
        if !fits || free_gpus < shape.gpus || n >= 64 {
            return n;
        }
        used = after;
        free_gpus -= shape.gpus;
        n += 1;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn every_decision_keeps_the_invariants(nodes in arb_nodes(), spec in arb_tree(), spread in any::<bool>()) {
        let snapshot = Snapshot::new(nodes);
        let tree = spec.build();
        let options = PlaceOptions { scoring: if spread { Scoring::Spread } else { Scoring::BinPack }, ..Default::default() };
        let d = place(&snapshot, &tree, &options, &LowestFreeIndices);
        check_decision(&snapshot, &tree, &d)?;
        prop_assert_eq!(&d, &place(&snapshot, &tree, &options, &LowestFreeIndices), "decisions are deterministic");
    }

    #[test]
    fn a_single_shape_gang_fits_exactly_when_capacity_adds_up(
        nodes in arb_nodes(),
        shape in arb_shape(),
        pods in 1..12usize,
        min_count in 1..12u32,
    ) {
        let snapshot = Snapshot::new(nodes);
        let mut leaf = LeafGroup::new("g", LeafPolicy::Gang { min_count });
        for i in 0..pods {
            leaf.add_gated(&format!("p{i}"), "", shape.clone());
        }
        let capacity: u32 = snapshot.nodes().iter().map(|n| naive_fit(n, &shape)).sum();
        let d = place(&snapshot, &GroupTree::new("ns", leaf), &PlaceOptions::default(), &LowestFreeIndices);
        let expected = u32::try_from(pods).unwrap_or(u32::MAX).min(capacity);
        prop_assert_eq!(d.admitted, expected >= min_count, "capacity {} for {} pods, minCount {}", capacity, pods, min_count);
        prop_assert_eq!(d.plan.len() as u32, if d.admitted { expected } else { 0 });
    }

    #[test]
    fn a_failed_gang_never_changes_what_basic_groups_get(
        nodes in arb_nodes(),
        leaves in prop::collection::vec(arb_leaf(), 2..=4),
    ) {
        let snapshot = Snapshot::new(nodes);
        let mut root = CompositeGroup::new("root", CompositePolicy::Basic);
        for (i, leaf) in leaves.iter().enumerate() {
            root.children.push(Group::Leaf(leaf.build(&format!("l{i}"))));
        }
        let tree = GroupTree::new("ns", root.clone());
        let d = place(&snapshot, &tree, &PlaceOptions::default(), &LowestFreeIndices);
        let planned = planned_per_leaf(&d);
        let failed_gangs: Vec<String> = root
            .children
            .iter()
            .filter(|g| g.is_gang() && !satisfied(g, &planned))
            .map(|g| g.name().to_string())
            .collect();
        root.children.retain(|g| !failed_gangs.iter().any(|f| f == g.name()));
        let without = place(&snapshot, &GroupTree::new("ns", root), &PlaceOptions::default(), &LowestFreeIndices);
        prop_assert_eq!(&d.plan, &without.plan, "failed gangs {:?} left a trace", failed_gangs);
    }

    #[test]
    fn quorum_is_monotone_in_pod_count(spec in arb_tree(), which in any::<prop::sample::Index>()) {
        let tree = spec.build();
        let before = is_quorate(&tree.root);
        let mut grown = tree.clone();
        let leaves = grown.root.leaves().len();
        let target = which.index(leaves);
        add_pod_to_leaf(&mut grown.root, &mut { target });
        prop_assert!(!before || is_quorate(&grown.root), "adding a pod broke quorum");
        prop_assert!(grown.root.active_pods() == tree.root.active_pods() + 1);
    }
}

/// Adds one gated pod to the `target`-th leaf (depth first).
fn add_pod_to_leaf(group: &mut Group, target: &mut usize) -> bool {
    match group {
        Group::Leaf(l) if *target == 0 => {
            l.add_gated("extra", "", PodShape::new(Resources::new()));
            true
        }
        Group::Leaf(_) => {
            *target -= 1;
            false
        }
        Group::Composite(c) => c.children.iter_mut().any(|child| add_pod_to_leaf(child, target)),
    }
}

//! The group tree of one admission root: leaves (PodGroups) hold their pods, composites
//! (CompositePodGroups) hold their children. Built from PodGroup, CompositePodGroup and Pod
//! lists; also orders roots for admission. Quorum and placement read it; nothing here decides.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use super::shape::{PodShape, ShapeError};
use super::snapshot::Labels;
use crate::pods::{Placement, PodClass};
use muster_api::blocks::SchedulingConstraints;
use muster_api::scheduling::MAX_DEPTH;
use muster_api::{CompositePodGroup, POD_GROUP_LABEL, PodGroup};

/// Scheduling policy of a PodGroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeafPolicy {
    /// Each pod starts as soon as it fits.
    Basic,
    /// No pod starts until `min_count` of them can.
    Gang {
        /// Pods that must exist (quorum) and be placed together.
        min_count: u32,
    },
}

/// Scheduling policy of a CompositePodGroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompositePolicy {
    /// Children are admitted independently.
    Basic,
    /// No child starts until `min_group_count` children can.
    Gang {
        /// Child groups that must be quorate and placed together.
        min_group_count: u32,
    },
}

/// Where one pod of a group stands.
#[derive(Clone, Debug, PartialEq)]
pub enum PodState {
    /// Held by the admission gate; placed with shape `shape` of its group.
    Gated {
        /// Index into the group's `shapes`.
        shape: usize,
    },
    /// Held by the gate, but its spec cannot be read, so it is never placed.
    Invalid {
        /// Why.
        error: ShapeError,
    },
    /// Admitted earlier (pinned to this hostname), not yet bound.
    Admitted {
        /// The hostname label value it is pinned to.
        hostname: String,
    },
    /// Bound to this node.
    Bound {
        /// Node name.
        node: String,
    },
    /// Not gated, not pinned, not bound: kube-scheduler's to place. Counts for quorum only.
    Unmanaged,
}

/// One existing (not finished, not terminating) pod of a group.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupPod {
    /// Pod name.
    pub name: String,
    /// Pod UID.
    pub uid: String,
    /// Where it stands.
    pub state: PodState,
    /// Its labels (what other pods' affinity, anti-affinity and spread rules select on).
    pub labels: Labels,
    /// Its `spec.priority`, as the API server's Priority admission plugin resolved it from the
    /// pod's PriorityClass (0 when unset): what its root ranks at.
    pub priority: i32,
}

/// A PodGroup and its pods.
#[derive(Clone, Debug, PartialEq)]
pub struct LeafGroup {
    /// PodGroup name.
    pub name: String,
    /// Basic or gang.
    pub policy: LeafPolicy,
    /// Node label key all its pods must share a value of.
    pub topology_key: Option<String>,
    /// Distinct shapes of its gated pods.
    pub shapes: Vec<PodShape>,
    /// Its existing pods.
    pub pods: Vec<GroupPod>,
}

/// A CompositePodGroup and its child groups.
#[derive(Clone, Debug, PartialEq)]
pub struct CompositeGroup {
    /// CompositePodGroup name.
    pub name: String,
    /// Basic or gang.
    pub policy: CompositePolicy,
    /// Node label key all pods of all descendants must share a value of.
    pub topology_key: Option<String>,
    /// Child groups that exist.
    pub children: Vec<Group>,
}

/// A PodGroup or a CompositePodGroup.
#[derive(Clone, Debug, PartialEq)]
pub enum Group {
    /// A PodGroup.
    Leaf(LeafGroup),
    /// A CompositePodGroup.
    Composite(CompositeGroup),
}

/// One admission root with what orders it among others.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupTree {
    /// Namespace of every group in the tree.
    pub namespace: String,
    /// The root group.
    pub root: Group,
    /// What the root ranks at: the highest priority the API server resolved for its live pods
    /// (0 without any), never a number or class its groups or templates name (a tenant could
    /// name any class there without running a pod under it; see [`Group::pods_priority`]).
    pub priority: i32,
    /// The root's creation time.
    pub created: Option<Timestamp>,
    /// Node names placement must not use for this root: kube-scheduler refused a pin of the
    /// root's pods there in a recent attempt (set by the shell from the root's rollbacks).
    pub avoid_nodes: BTreeSet<String>,
    /// Node names placement must not use for this root because a root of higher priority
    /// waits for them (its reservation, or its preemption's nomination; set by the shell).
    pub reserved_nodes: BTreeSet<String>,
}

impl LeafPolicy {
    /// `minCount`; 1 for basic.
    pub fn min_count(self) -> u32 {
        match self {
            LeafPolicy::Basic => 1,
            LeafPolicy::Gang { min_count } => min_count,
        }
    }
}

impl CompositePolicy {
    /// `minGroupCount`; 1 for basic.
    pub fn min_group_count(self) -> u32 {
        match self {
            CompositePolicy::Basic => 1,
            CompositePolicy::Gang { min_group_count } => min_group_count,
        }
    }
}

impl LeafGroup {
    /// An empty group.
    pub fn new(name: &str, policy: LeafPolicy) -> Self {
        Self { name: name.into(), policy, topology_key: None, shapes: Vec::new(), pods: Vec::new() }
    }

    /// Builder: all pods in one domain of this node label key.
    pub fn with_topology(mut self, key: &str) -> Self {
        self.topology_key = Some(key.into());
        self
    }

    /// Adds a gated pod, sharing a shape with identical pods already added.
    pub fn add_gated(&mut self, name: &str, uid: &str, shape: PodShape) {
        let index = match self.shapes.iter().position(|s| *s == shape) {
            Some(i) => i,
            None => {
                self.shapes.push(shape);
                self.shapes.len() - 1
            }
        };
        self.push(name, uid, PodState::Gated { shape: index });
    }

    /// Adds a pod in any other state.
    pub fn push(&mut self, name: &str, uid: &str, state: PodState) {
        self.pods.push(GroupPod { name: name.into(), uid: uid.into(), state, labels: Labels::default(), priority: 0 });
    }

    /// Adds a pod from the cluster; returns false when it does not count (finished or
    /// terminating), as upstream counts only active pods.
    pub fn add_pod(&mut self, pod: &Pod) -> bool {
        let class = PodClass::of(pod);
        if !class.live() {
            return false;
        }
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        match class.placement {
            Placement::Gated => match PodShape::from_pod(pod) {
                Ok(shape) => self.add_gated(name, uid, shape),
                Err(error) => self.push(name, uid, PodState::Invalid { error }),
            },
            Placement::Bound(node) => self.push(name, uid, PodState::Bound { node }),
            Placement::Admitted(hostname) => self.push(name, uid, PodState::Admitted { hostname }),
            Placement::Unpinned => self.push(name, uid, PodState::Unmanaged),
        }
        if let Some(last) = self.pods.last_mut() {
            last.labels = pod.metadata.labels.iter().flatten().collect();
            last.priority = pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
        }
        true
    }

    /// `minCount` in force (1 for basic).
    pub fn min_count(&self) -> u32 {
        self.policy.min_count()
    }

    /// Pods that exist (what quorum counts).
    pub fn active_pods(&self) -> u32 {
        count(self.pods.len())
    }

    /// Pods held by the gate (including unreadable ones).
    pub fn gated_pods(&self) -> u32 {
        count(self.pods.iter().filter(|p| matches!(p.state, PodState::Gated { .. } | PodState::Invalid { .. })).count())
    }

    /// Pods already admitted or bound (what placement counts as scheduled).
    pub fn placed_pods(&self) -> u32 {
        count(self.placed().count())
    }

    /// The pods admitted or bound (started), as `(name, UID)`.
    pub fn placed_names(&self) -> Vec<(String, String)> {
        self.placed().map(|p| (p.name.clone(), p.uid.clone())).collect()
    }

    fn placed(&self) -> impl Iterator<Item = &GroupPod> {
        self.pods.iter().filter(|p| matches!(p.state, PodState::Admitted { .. } | PodState::Bound { .. }))
    }
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl CompositeGroup {
    /// A composite with no children yet.
    pub fn new(name: &str, policy: CompositePolicy) -> Self {
        Self { name: name.into(), policy, topology_key: None, children: Vec::new() }
    }

    /// Builder: all pods of all descendants in one domain of this node label key.
    pub fn with_topology(mut self, key: &str) -> Self {
        self.topology_key = Some(key.into());
        self
    }

    /// Builder: adds a child group.
    pub fn with_child(mut self, child: impl Into<Group>) -> Self {
        self.children.push(child.into());
        self
    }
}

impl From<LeafGroup> for Group {
    fn from(leaf: LeafGroup) -> Self {
        Group::Leaf(leaf)
    }
}

impl From<CompositeGroup> for Group {
    fn from(composite: CompositeGroup) -> Self {
        Group::Composite(composite)
    }
}

impl Group {
    /// The group's name.
    pub fn name(&self) -> &str {
        match self {
            Group::Leaf(l) => &l.name,
            Group::Composite(c) => &c.name,
        }
    }

    /// The group's topology key, if it has a constraint.
    pub fn topology_key(&self) -> Option<&str> {
        match self {
            Group::Leaf(l) => l.topology_key.as_deref(),
            Group::Composite(c) => c.topology_key.as_deref(),
        }
    }

    /// True for a gang PodGroup or CompositePodGroup.
    pub fn is_gang(&self) -> bool {
        match self {
            Group::Leaf(l) => matches!(l.policy, LeafPolicy::Gang { .. }),
            Group::Composite(c) => matches!(c.policy, CompositePolicy::Gang { .. }),
        }
    }

    /// Every PodGroup in the subtree, depth first.
    pub fn leaves(&self) -> Vec<&LeafGroup> {
        let mut out = Vec::new();
        self.collect_leaves(&mut out);
        out
    }

    fn collect_leaves<'t>(&'t self, out: &mut Vec<&'t LeafGroup>) {
        match self {
            Group::Leaf(l) => out.push(l),
            Group::Composite(c) => c.children.iter().for_each(|child| child.collect_leaves(out)),
        }
    }

    /// The highest `spec.priority` among the subtree's live pods (0 without any): the API
    /// server resolved it from each pod's PriorityClass under the namespace's ResourceQuota
    /// rules, so a root cannot rank at a class none of its pods may run under.
    pub fn pods_priority(&self) -> i32 {
        self.leaves().iter().flat_map(|l| l.pods.iter()).map(|p| p.priority).max().unwrap_or(0)
    }

    /// Pods in the subtree that exist.
    pub fn active_pods(&self) -> u32 {
        self.leaves().iter().map(|l| l.active_pods()).fold(0, u32::saturating_add)
    }

    /// Gated pods in the subtree.
    pub fn gated_pods(&self) -> u32 {
        self.leaves().iter().map(|l| l.gated_pods()).fold(0, u32::saturating_add)
    }

    /// Depth of the subtree (a leaf is 1).
    pub fn depth(&self) -> usize {
        match self {
            Group::Leaf(_) => 1,
            Group::Composite(c) => 1 + c.children.iter().map(Group::depth).max().unwrap_or(0),
        }
    }
}

impl GroupTree {
    /// A tree with priority 0 and no creation time.
    pub fn new(namespace: &str, root: impl Into<Group>) -> Self {
        Self {
            namespace: namespace.into(),
            root: root.into(),
            priority: 0,
            created: None,
            avoid_nodes: BTreeSet::new(),
            reserved_nodes: BTreeSet::new(),
        }
    }

    /// The order key among roots: priority descending, then creation ascending (unknown last),
    /// then namespace and name.
    pub fn admission_key(&self) -> (std::cmp::Reverse<i32>, bool, Option<Timestamp>, &str, &str) {
        (std::cmp::Reverse(self.priority), self.created.is_none(), self.created, &self.namespace, self.root.name())
    }
}

/// Orders candidate roots for admission: priority descending, creation ascending, then name.
pub fn sort_for_admission(trees: &mut [GroupTree]) {
    trees.sort_by(|a, b| a.admission_key().cmp(&b.admission_key()));
}

/// Why a group, or pods, could not be placed in any tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UnresolvedReason {
    /// Pods name a PodGroup that does not exist (upstream keeps them unschedulable).
    PodGroupMissing {
        /// How many active pods wait for it.
        pods: u32,
    },
    /// The group's parent CompositePodGroup does not exist.
    ParentMissing {
        /// The missing parent.
        parent: String,
    },
    /// The group's parents form a cycle, so there is no root.
    Cycle,
    /// The tree under this root is deeper than four levels.
    TooDeep,
}

/// A group (or pods' group) left out of the forest, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unresolved {
    /// Namespace.
    pub namespace: String,
    /// The group's name.
    pub name: String,
    /// Why.
    pub reason: UnresolvedReason,
}

impl fmt::Display for Unresolved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (ns, name) = (&self.namespace, &self.name);
        match &self.reason {
            UnresolvedReason::PodGroupMissing { pods } => {
                write!(f, "{pods} pod(s) wait for pod group \"{ns}/{name}\", which does not exist")
            }
            UnresolvedReason::ParentMissing { parent } => {
                write!(f, "group \"{ns}/{name}\" waits for its composite pod group \"{parent}\", which does not exist")
            }
            UnresolvedReason::Cycle => write!(f, "group \"{ns}/{name}\" has parents in a cycle"),
            UnresolvedReason::TooDeep => {
                write!(f, "composite pod group \"{ns}/{name}\" is the root of a tree deeper than {MAX_DEPTH} levels")
            }
        }
    }
}

/// Every admission root in the lists, and what could not be placed in a tree.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Forest {
    /// Roots, in the lists' order of namespace and name.
    pub trees: Vec<GroupTree>,
    /// Groups and pods with no root.
    pub unresolved: Vec<Unresolved>,
}

/// Builds every group tree from the cluster's lists. A child joins its parent through
/// `spec.parentCompositePodGroupName`, so a missing child is simply absent (as upstream's
/// hierarchy tracker counts it: not ready); a missing parent leaves its subtree unresolved.
/// Children are sorted by name. Pods join through the `scheduling.muster.dev/pod-group` label.
pub fn build_forest<'g, P: std::borrow::Borrow<Pod>>(
    pod_groups: impl IntoIterator<Item = &'g PodGroup>,
    composites: impl IntoIterator<Item = &'g CompositePodGroup>,
    pods: &[P],
) -> Forest {
    let mut pods_by_group: HashMap<(String, String), Vec<&Pod>> = HashMap::new();
    for pod in pods.iter().map(std::borrow::Borrow::borrow) {
        let Some(group) = pod.metadata.labels.as_ref().and_then(|l| l.get(POD_GROUP_LABEL)) else { continue };
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        pods_by_group.entry((namespace, group.clone())).or_default().push(pod);
    }
    let leaves: Vec<GroupObject<'_, PodGroup>> =
        pod_groups.into_iter().filter_map(|pg| GroupObject::new(pg, &pg.metadata)).collect();
    let composites: Vec<GroupObject<'_, CompositePodGroup>> =
        composites.into_iter().filter_map(|c| GroupObject::new(c, &c.metadata)).collect();
    let composite_index: HashMap<(String, String), usize> =
        composites.iter().enumerate().map(|(i, c)| (c.key.clone(), i)).collect();

    let mut builder = ForestBuilder {
        leaves: &leaves,
        composites: &composites,
        pods_by_group: &pods_by_group,
        leaf_children: vec![Vec::new(); composites.len()],
        composite_children: vec![Vec::new(); composites.len()],
        reached_leaves: vec![false; leaves.len()],
        reached_composites: vec![false; composites.len()],
    };
    let mut unresolved = Vec::new();
    let mut parent_missing = HashSet::new();
    let mut link = |key: &(String, String), parent: Option<&str>| -> Option<Option<usize>> {
        let parent = parent?;
        let found = composite_index.get(&(key.0.clone(), parent.to_string())).copied();
        if found.is_none() {
            parent_missing.insert(key.clone());
            unresolved.push(Unresolved {
                namespace: key.0.clone(),
                name: key.1.clone(),
                reason: UnresolvedReason::ParentMissing { parent: parent.to_string() },
            });
        }
        Some(found)
    };
    let mut roots = Vec::new();
    for (i, leaf) in leaves.iter().enumerate() {
        match link(&leaf.key, leaf.object.spec.parent_composite_pod_group_name.as_deref()) {
            None => roots.push(Root::Leaf(i)),
            Some(Some(parent)) => builder.leaf_children[parent].push(i),
            Some(None) => {}
        }
    }
    for (i, composite) in composites.iter().enumerate() {
        match link(&composite.key, composite.object.spec.parent_composite_pod_group_name.as_deref()) {
            None => roots.push(Root::Composite(i)),
            Some(Some(parent)) => builder.composite_children[parent].push(i),
            Some(None) => {}
        }
    }

    let mut trees = Vec::new();
    for root in roots {
        let (key, created, group) = match root {
            Root::Leaf(i) => {
                builder.reached_leaves[i] = true;
                let n = &leaves[i];
                (&n.key, &n.object.metadata.creation_timestamp, Some(builder.leaf(i)))
            }
            Root::Composite(i) => {
                let n = &composites[i];
                (&n.key, &n.object.metadata.creation_timestamp, builder.composite(i, 1))
            }
        };
        match group {
            Some(root) => trees.push(GroupTree {
                namespace: key.0.clone(),
                priority: root.pods_priority(),
                root,
                created: created.as_ref().map(|t| t.0),
                avoid_nodes: BTreeSet::new(),
                reserved_nodes: BTreeSet::new(),
            }),
            None => unresolved.push(Unresolved {
                namespace: key.0.clone(),
                name: key.1.clone(),
                reason: UnresolvedReason::TooDeep,
            }),
        }
    }
    // A group with an existing parent that no root reaches has parents in a cycle.
    let leaf_state = leaves
        .iter()
        .zip(&builder.reached_leaves)
        .map(|(n, r)| (&n.key, *r || n.object.spec.parent_composite_pod_group_name.is_none()));
    let composite_state = composites
        .iter()
        .zip(&builder.reached_composites)
        .map(|(n, r)| (&n.key, *r || n.object.spec.parent_composite_pod_group_name.is_none()));
    for (key, reached) in leaf_state.chain(composite_state) {
        if !reached && !parent_missing.contains(key) {
            unresolved.push(Unresolved {
                namespace: key.0.clone(),
                name: key.1.clone(),
                reason: UnresolvedReason::Cycle,
            });
        }
    }
    let known: HashSet<&(String, String)> = leaves.iter().map(|n| &n.key).collect();
    let mut orphans: Vec<_> = pods_by_group.iter().filter(|(key, _)| !known.contains(key)).collect();
    orphans.sort_by(|a, b| a.0.cmp(b.0));
    for (key, group_pods) in orphans {
        let active = group_pods.iter().filter(|p| PodClass::of(p).live()).count();
        if active > 0 {
            unresolved.push(Unresolved {
                namespace: key.0.clone(),
                name: key.1.clone(),
                reason: UnresolvedReason::PodGroupMissing { pods: count(active) },
            });
        }
    }
    trees.sort_by(|a, b| (&a.namespace, a.root.name()).cmp(&(&b.namespace, b.root.name())));
    Forest { trees, unresolved }
}

/// A group object with its namespace/name key.
struct GroupObject<'a, T> {
    key: (String, String),
    object: &'a T,
}

impl<'a, T> GroupObject<'a, T> {
    fn new(object: &'a T, meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<Self> {
        Some(Self { key: (meta.namespace.clone().unwrap_or_default(), meta.name.clone()?), object })
    }
}

enum Root {
    Leaf(usize),
    Composite(usize),
}

struct ForestBuilder<'a> {
    leaves: &'a [GroupObject<'a, PodGroup>],
    composites: &'a [GroupObject<'a, CompositePodGroup>],
    pods_by_group: &'a HashMap<(String, String), Vec<&'a Pod>>,
    leaf_children: Vec<Vec<usize>>,
    composite_children: Vec<Vec<usize>>,
    reached_leaves: Vec<bool>,
    reached_composites: Vec<bool>,
}

fn topology_key(constraints: Option<&SchedulingConstraints>) -> Option<String> {
    constraints.and_then(|c| c.topology.as_ref()).and_then(|t| t.first()).map(|t| t.key.clone())
}

/// A policy count from the API; upstream defaults an unknown count to 1, never below.
fn at_least_one(n: Option<i32>) -> u32 {
    u32::try_from(n.unwrap_or(1)).unwrap_or(1).max(1)
}

impl ForestBuilder<'_> {
    fn leaf(&self, i: usize) -> Group {
        let node = &self.leaves[i];
        let spec = &node.object.spec;
        let policy = match &spec.scheduling_policy.gang {
            Some(gang) => LeafPolicy::Gang { min_count: at_least_one(gang.min_count) },
            None => LeafPolicy::Basic,
        };
        let mut leaf = LeafGroup::new(&node.key.1, policy);
        leaf.topology_key = topology_key(spec.scheduling_constraints.as_ref());
        let mut pods = self.pods_by_group.get(&node.key).cloned().unwrap_or_default();
        pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        for pod in pods {
            leaf.add_pod(pod);
        }
        Group::Leaf(leaf)
    }

    /// The composite at `level` (root = 1) with its subtree; `None` when the subtree is deeper
    /// than `MAX_DEPTH` levels.
    fn composite(&mut self, i: usize, level: usize) -> Option<Group> {
        if level > MAX_DEPTH {
            self.mark_reached(i);
            return None;
        }
        self.reached_composites[i] = true;
        let node = &self.composites[i];
        let spec = &node.object.spec;
        let policy = match &spec.scheduling_policy.gang {
            Some(gang) => CompositePolicy::Gang { min_group_count: at_least_one(gang.min_group_count) },
            None => CompositePolicy::Basic,
        };
        let mut group = CompositeGroup::new(&node.key.1, policy);
        group.topology_key = topology_key(spec.scheduling_constraints.as_ref());
        let mut too_deep = level + 1 > MAX_DEPTH && !self.leaf_children[i].is_empty();
        for leaf in self.leaf_children[i].clone() {
            self.reached_leaves[leaf] = true;
            group.children.push(self.leaf(leaf));
        }
        for child in self.composite_children[i].clone() {
            match self.composite(child, level + 1) {
                Some(g) => group.children.push(g),
                None => too_deep = true,
            }
        }
        group.children.sort_by(|a, b| a.name().cmp(b.name()));
        (!too_deep).then_some(Group::Composite(group))
    }

    /// Marks a subtree below the depth limit as reached, without recursion.
    fn mark_reached(&mut self, i: usize) {
        let mut stack = vec![i];
        while let Some(c) = stack.pop() {
            if std::mem::replace(&mut self.reached_composites[c], true) {
                continue;
            }
            for &leaf in &self.leaf_children[c] {
                self.reached_leaves[leaf] = true;
            }
            stack.extend(self.composite_children[c].iter().copied());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSchedulingGate, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use muster_api::blocks::{CompositePodGroupSchedulingPolicy, PodGroupSchedulingPolicy, TopologyConstraint};
    use muster_api::scheduling::{CompositePodGroupSpec, PodGroupSpec};
    use muster_api::{ADMISSION_GATE, HOSTNAME_LABEL};

    fn meta(name: &str) -> ObjectMeta {
        ObjectMeta { name: Some(name.into()), namespace: Some("ns".into()), ..Default::default() }
    }

    fn pod_group(name: &str, policy: PodGroupSchedulingPolicy, parent: Option<&str>) -> PodGroup {
        PodGroup {
            metadata: meta(name),
            spec: PodGroupSpec {
                scheduling_policy: policy,
                parent_composite_pod_group_name: parent.map(String::from),
                ..Default::default()
            },
            status: None,
        }
    }

    fn composite(name: &str, policy: CompositePodGroupSchedulingPolicy, parent: Option<&str>) -> CompositePodGroup {
        CompositePodGroup {
            metadata: meta(name),
            spec: CompositePodGroupSpec {
                scheduling_policy: policy,
                parent_composite_pod_group_name: parent.map(String::from),
                ..Default::default()
            },
            status: None,
        }
    }

    fn pod(name: &str, group: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                labels: Some([(POD_GROUP_LABEL.to_string(), group.to_string())].into()),
                uid: Some(format!("uid-{name}")),
                ..meta(name)
            },
            spec: Some(PodSpec {
                containers: vec![Default::default()],
                scheduling_gates: Some(vec![PodSchedulingGate { name: ADMISSION_GATE.into() }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn pods_join_their_leaf_in_their_state() {
        let mut admitted = pod("b", "g");
        let spec = admitted.spec.as_mut().unwrap();
        spec.scheduling_gates = None;
        spec.node_selector = Some([(HOSTNAME_LABEL.to_string(), "h1".to_string())].into());
        let mut done = pod("c", "g");
        done.status = Some(PodStatus { phase: Some("Succeeded".into()), ..Default::default() });
        let mut leaving = pod("d", "g");
        leaving.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        let mut bound = pod("e", "g");
        bound.spec.as_mut().unwrap().node_name = Some("n1".into());
        let forest = build_forest(
            &[pod_group("g", PodGroupSchedulingPolicy::gang(Some(2)), None)],
            &[],
            &[pod("a", "g"), admitted, done, leaving, bound, pod("x", "other")],
        );
        let [tree] = forest.trees.as_slice() else { panic!("one tree: {forest:?}") };
        let Group::Leaf(leaf) = &tree.root else { panic!("a leaf root") };
        assert_eq!(leaf.policy, LeafPolicy::Gang { min_count: 2 });
        let states: Vec<_> = leaf.pods.iter().map(|p| (p.name.as_str(), &p.state)).collect();
        assert_eq!(
            states,
            vec![
                ("a", &PodState::Gated { shape: 0 }),
                ("b", &PodState::Admitted { hostname: "h1".into() }),
                ("e", &PodState::Bound { node: "n1".into() }),
            ]
        );
        assert_eq!(
            forest.unresolved,
            vec![Unresolved {
                namespace: "ns".into(),
                name: "other".into(),
                reason: UnresolvedReason::PodGroupMissing { pods: 1 }
            }]
        );
    }

    #[test]
    fn a_root_ranks_at_its_pods_resolved_priority_never_at_a_named_class() {
        // The forged set of issue 38: the composite and the pod-less leaf say 1,000,000 (a
        // replicas: 0 replicatedJob naming a class the tenant may not run pods under); the one
        // leaf with pods runs at what the API server resolved for them.
        let mut root = composite("set", CompositePodGroupSchedulingPolicy::basic(), None);
        root.spec.priority = Some(1_000_000);
        let mut forged = pod_group("set-forged", PodGroupSchedulingPolicy::basic(), Some("set"));
        forged.spec.priority = Some(1_000_000);
        let real = pod_group("set-real", PodGroupSchedulingPolicy::gang(Some(2)), Some("set"));
        let with_priority = |name: &str, priority: Option<i32>| {
            let mut p = pod(name, "set-real");
            p.spec.as_mut().unwrap().priority = priority;
            p
        };
        let cases: [(&str, Vec<Pod>, i32); 4] = [
            ("no pods yet", vec![], 0),
            ("pods without a priority", vec![with_priority("a", None), with_priority("b", None)], 0),
            ("pods at 100", vec![with_priority("a", Some(100)), with_priority("b", Some(100))], 100),
            ("the highest pod", vec![with_priority("a", Some(5)), with_priority("b", Some(7))], 7),
        ];
        for (what, pods, want) in cases {
            let forest = build_forest(&[forged.clone(), real.clone()], std::slice::from_ref(&root), &pods);
            let [tree] = forest.trees.as_slice() else { panic!("{what}: one tree: {forest:?}") };
            assert_eq!(tree.priority, want, "{what}");
        }
        // A hand-made PodGroup's own number counts for nothing either.
        let mut alone = pod_group("g", PodGroupSchedulingPolicy::basic(), None);
        alone.spec.priority = Some(2_000_000_000);
        let forest = build_forest(&[alone], &[], &[pod("a", "g")]);
        assert_eq!(forest.trees[0].priority, 0);
    }

    #[test]
    fn composites_gather_their_children_sorted_with_topology() {
        let mut root = composite("root", CompositePodGroupSchedulingPolicy::gang(Some(2)), None);
        root.spec.scheduling_constraints =
            Some(SchedulingConstraints { topology: Some(vec![TopologyConstraint { key: "rack".into() }]) });
        let forest = build_forest(
            &[
                pod_group("w2", PodGroupSchedulingPolicy::gang(Some(1)), Some("mid")),
                pod_group("w1", PodGroupSchedulingPolicy::basic(), Some("root")),
            ],
            &[root, composite("mid", CompositePodGroupSchedulingPolicy::basic(), Some("root"))],
            &[pod("p", "w2")],
        );
        assert!(forest.unresolved.is_empty(), "{:?}", forest.unresolved);
        let [tree] = forest.trees.as_slice() else { panic!("one tree") };
        let Group::Composite(root) = &tree.root else { panic!("a composite root") };
        assert_eq!(root.topology_key.as_deref(), Some("rack"));
        assert_eq!(root.policy, CompositePolicy::Gang { min_group_count: 2 });
        let names: Vec<_> = root.children.iter().map(Group::name).collect();
        assert_eq!(names, vec!["mid", "w1"]);
        assert_eq!(tree.root.active_pods(), 1);
        assert_eq!(tree.root.depth(), 3);
    }

    #[test]
    fn missing_parents_and_cycles_are_unresolved() {
        let forest = build_forest::<Pod>(
            &[pod_group("orphan", PodGroupSchedulingPolicy::basic(), Some("gone"))],
            &[
                composite("a", CompositePodGroupSchedulingPolicy::basic(), Some("b")),
                composite("b", CompositePodGroupSchedulingPolicy::basic(), Some("a")),
            ],
            &[],
        );
        assert!(forest.trees.is_empty());
        let reasons: Vec<String> = forest.unresolved.iter().map(ToString::to_string).collect();
        assert_eq!(
            reasons,
            vec![
                "group \"ns/orphan\" waits for its composite pod group \"gone\", which does not exist",
                "group \"ns/a\" has parents in a cycle",
                "group \"ns/b\" has parents in a cycle",
            ]
        );
    }

    #[test]
    fn trees_deeper_than_four_levels_are_refused() {
        let forest = build_forest::<Pod>(
            &[pod_group("leaf", PodGroupSchedulingPolicy::basic(), Some("c4"))],
            &[
                composite("c1", CompositePodGroupSchedulingPolicy::basic(), None),
                composite("c2", CompositePodGroupSchedulingPolicy::basic(), Some("c1")),
                composite("c3", CompositePodGroupSchedulingPolicy::basic(), Some("c2")),
                composite("c4", CompositePodGroupSchedulingPolicy::basic(), Some("c3")),
            ],
            &[],
        );
        assert!(forest.trees.is_empty());
        assert_eq!(forest.unresolved[0].reason, UnresolvedReason::TooDeep);
    }

    #[test]
    fn roots_are_ordered_by_priority_then_age_then_name() {
        let at = |s: i64| Some(Timestamp::from_second(s).unwrap());
        let tree = |name: &str, priority: i32, created| GroupTree {
            priority,
            created,
            ..GroupTree::new("ns", LeafGroup::new(name, LeafPolicy::Basic))
        };
        let mut trees = vec![
            tree("young", 0, at(20)),
            tree("unknown-age", 0, None),
            tree("urgent", 100, at(30)),
            tree("old-b", 0, at(10)),
            tree("old-a", 0, at(10)),
        ];
        sort_for_admission(&mut trees);
        let names: Vec<_> = trees.iter().map(|t| t.root.name()).collect();
        assert_eq!(names, vec!["urgent", "old-a", "old-b", "young", "unknown-age"]);
    }

    #[test]
    fn identical_pods_share_one_shape() {
        let mut leaf = LeafGroup::new("g", LeafPolicy::Gang { min_count: 3 });
        for name in ["a", "b", "c"] {
            assert!(leaf.add_pod(&pod(name, "g")));
        }
        assert_eq!(leaf.shapes.len(), 1);
        assert_eq!((leaf.active_pods(), leaf.gated_pods(), leaf.placed_pods()), (3, 3, 0));
    }
}

//! The builder's input: a tree of items, each with a default config, the user's blocks (with
//! their field paths) and callbacks; and the merge that resolves an item's config.

use std::fmt;
use std::sync::Arc;

use muster_api::blocks::{
    CompositePodGroupSchedulingPolicy, DisruptionMode, PodGroupResourceClaim, PodGroupSchedulingPolicy,
    SchedulingConstraints,
};

use super::field::FieldPath;

/// The resolved scheduling configuration of one item (upstream `SchedulingConfig`).
/// A composite's `minGroupCount` travels in `policy.gang.minCount`, as upstream does.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SchedulingConfig {
    /// `basic` or `gang`; `None` compiles to `basic`.
    pub policy: Option<PodGroupSchedulingPolicy>,
    /// Topology constraint, if any.
    pub constraints: Option<SchedulingConstraints>,
    /// Disruption mode; `None` means the PodGroup default (`single`).
    pub disruption_mode: Option<DisruptionMode>,
    /// Shared claims (leaf only).
    pub resource_claims: Vec<PodGroupResourceClaim>,
    /// PriorityClass, from defaults or callbacks only.
    pub priority_class_name: Option<String>,
}

/// A callback run on an item's config after the merge (e.g. to default `minCount`).
pub type Callback = Arc<dyn Fn(&mut SchedulingConfig) + Send + Sync>;

/// The user's policy block: leaf or composite shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicyInput {
    /// A PodGroup policy (`gang.minCount`).
    PodGroup(PodGroupSchedulingPolicy),
    /// A CompositePodGroup policy (`gang.minGroupCount`).
    Composite(CompositePodGroupSchedulingPolicy),
}

impl PolicyInput {
    /// The policy in the builder's common form (minGroupCount carried as minCount).
    pub fn to_config(&self) -> PodGroupSchedulingPolicy {
        match self {
            PolicyInput::PodGroup(p) => p.clone(),
            PolicyInput::Composite(c) => PodGroupSchedulingPolicy {
                basic: c.basic.clone(),
                gang: c
                    .gang
                    .as_ref()
                    .map(|g| muster_api::blocks::GangSchedulingPolicy { min_count: g.min_group_count }),
            },
        }
    }
    /// True when neither `basic` nor `gang` is set.
    pub fn is_empty(&self) -> bool {
        match self {
            PolicyInput::PodGroup(p) => p.is_empty(),
            PolicyInput::Composite(c) => c.is_empty(),
        }
    }
    /// The name of the count field of the gang variant.
    pub fn count_field(&self) -> &'static str {
        match self {
            PolicyInput::PodGroup(_) => "minCount",
            PolicyInput::Composite(_) => "minGroupCount",
        }
    }
}

/// One user block and the field path it was read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block<T> {
    /// The block as the user wrote it.
    pub data: T,
    /// Where it was written (e.g. `spec.scheduling.schedulingPolicy`).
    pub path: FieldPath,
}

impl<T> Block<T> {
    /// A block read from `path`.
    pub fn new(data: T, path: FieldPath) -> Self {
        Self { data, path }
    }
}

/// The user's blocks for one item; absent blocks fall back to the item's defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkloadInput {
    /// `schedulingPolicy`.
    pub policy: Option<Block<PolicyInput>>,
    /// `schedulingConstraints`.
    pub constraints: Option<Block<SchedulingConstraints>>,
    /// `disruptionMode`.
    pub disruption_mode: Option<Block<DisruptionMode>>,
    /// `resourceClaims` (leaf only).
    pub resource_claims: Option<Block<Vec<PodGroupResourceClaim>>>,
}

/// One node of the workload tree: no children makes a PodGroupTemplate, children make a
/// CompositePodGroupTemplate.
#[derive(Clone, Default)]
pub struct WorkloadItem {
    /// Template name (a DNS label), unique across the tree.
    pub name: String,
    /// Base path of this item's blocks (e.g. `spec.scheduling`); used for defaults' errors.
    pub path: FieldPath,
    /// Config used where the user wrote nothing.
    pub default_config: SchedulingConfig,
    /// What the user wrote.
    pub input: WorkloadInput,
    /// Run in order after the merge.
    pub callbacks: Vec<Callback>,
    /// Child templates.
    pub children: Vec<WorkloadItem>,
    /// Runtime groups made from this template (muster: a replicatedJob's replicas). Default 1.
    pub replicas: i32,
    /// Pods in each group made from this leaf template (muster: parallelism), when known.
    pub pod_count: Option<i32>,
}

impl fmt::Debug for WorkloadItem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkloadItem")
            .field("name", &self.name)
            .field("path", &self.path)
            .field("default_config", &self.default_config)
            .field("input", &self.input)
            .field("callbacks", &self.callbacks.len())
            .field("children", &self.children)
            .field("replicas", &self.replicas)
            .field("pod_count", &self.pod_count)
            .finish()
    }
}

impl WorkloadItem {
    /// A leaf item with no input and no defaults.
    pub fn new(name: impl Into<String>, path: FieldPath) -> Self {
        Self { name: name.into(), path, replicas: 1, ..Default::default() }
    }
    /// True when this item compiles to a CompositePodGroupTemplate.
    pub fn is_composite(&self) -> bool {
        !self.children.is_empty()
    }
    /// Runtime child groups of a composite item: the sum of its children's replicas.
    pub fn child_group_count(&self) -> i32 {
        self.children.iter().map(|c| c.replicas.max(0)).fold(0, i32::saturating_add)
    }
    /// The path of the policy block (the user's, or where it would be).
    pub fn policy_path(&self) -> FieldPath {
        self.input.policy.as_ref().map(|b| b.path.clone()).unwrap_or_else(|| self.path.child("schedulingPolicy"))
    }
    /// The path of the disruption mode block.
    pub fn disruption_mode_path(&self) -> FieldPath {
        self.input.disruption_mode.as_ref().map(|b| b.path.clone()).unwrap_or_else(|| self.path.child("disruptionMode"))
    }
    /// The path of the constraints block.
    pub fn constraints_path(&self) -> FieldPath {
        self.input
            .constraints
            .as_ref()
            .map(|b| b.path.clone())
            .unwrap_or_else(|| self.path.child("schedulingConstraints"))
    }
    /// The path of the claims list.
    pub fn resource_claims_path(&self) -> FieldPath {
        self.input.resource_claims.as_ref().map(|b| b.path.clone()).unwrap_or_else(|| self.path.child("resourceClaims"))
    }
    /// The name of the gang count field for this item's shape.
    pub fn count_field(&self) -> &'static str {
        if self.is_composite() { "minGroupCount" } else { "minCount" }
    }

    /// Resolves this item's config: defaults, then each non-empty user block replaces the
    /// default block whole, then callbacks in order.
    pub fn resolve(&self) -> SchedulingConfig {
        let mut config = self.default_config.clone();
        if let Some(b) = &self.input.policy
            && !b.data.is_empty()
        {
            config.policy = Some(b.data.to_config());
        }
        if let Some(b) = &self.input.constraints
            && !b.data.is_empty()
        {
            config.constraints = Some(b.data.clone());
        }
        if let Some(b) = &self.input.disruption_mode
            && !b.data.is_empty()
        {
            config.disruption_mode = Some(b.data.clone());
        }
        if let Some(b) = &self.input.resource_claims
            && !b.data.is_empty()
        {
            config.resource_claims = b.data.clone();
        }
        for callback in &self.callbacks {
            callback(&mut config);
        }
        config
    }

    /// Visits this item and its descendants depth first, with each item's depth (root = 1).
    pub fn walk<'a>(&'a self, depth: usize, visit: &mut impl FnMut(&'a WorkloadItem, usize)) {
        visit(self, depth);
        for child in &self.children {
            child.walk(depth + 1, visit);
        }
    }
}

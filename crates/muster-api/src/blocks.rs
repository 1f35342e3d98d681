//! The scheduling building blocks, leaf and composite, mirroring upstream
//! `scheduling.k8s.io/v1alpha3` field for field (JSON names, unions, limits).
//! Shapes and schema rules only; the meaning lives in `workloadbuilder`.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// Most resource claims a PodGroup (or its template) may list.
pub const MAX_RESOURCE_CLAIMS: usize = 4;
/// Most topology constraints a group may carry.
pub const MAX_TOPOLOGY_CONSTRAINTS: usize = 1;

/// Regular expression for a Kubernetes label key (optional DNS-subdomain prefix, then a name).
pub const LABEL_KEY_PATTERN: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$";
/// Regular expression for a DNS-1123 label.
pub const DNS_LABEL_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// The rule on an immutable field itself: a change is refused. The API server evaluates it only
/// when the old and the new object both have the field, and it selects nothing from the object
/// around it; setting or clearing the field is refused by a rule on that object
/// (`has(self.x) == has(oldSelf.x)`).
pub(crate) fn immutable() -> kube::core::Rule {
    kube::core::Rule::new("self == oldSelf").message("field is immutable")
}
/// Regular expression for a DNS-1123 subdomain.
pub const DNS_SUBDOMAIN_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/// The empty member of a union (`basic: {}`, `single: {}`, `all: {}`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
pub struct Empty {}

/// How the pods of a PodGroup are scheduled: exactly one of `basic` or `gang`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[x_kube(validation = Rule::new("has(self.basic) != has(self.gang)").message(Message::Expression("has(self.basic) ? 'must specify exactly one of: `basic`, `gang`' : 'must specify one of: `basic`, `gang`'".into())))]
pub struct PodGroupSchedulingPolicy {
    /// Each pod is scheduled on its own, as soon as it fits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic: Option<Empty>,
    /// All-or-nothing: no pod starts until at least `minCount` of them can start together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang: Option<GangSchedulingPolicy>,
}

/// Gang policy of a PodGroup.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct GangSchedulingPolicy {
    /// Pods that must exist and fit before any of them starts. Mutable. When unset, the
    /// controller supplies a default (muster: max(1, parallelism)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub min_count: Option<i32>,
}

/// How a CompositePodGroup is scheduled: exactly one of `basic` or `gang`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[x_kube(validation = Rule::new("has(self.basic) != has(self.gang)").message(Message::Expression("has(self.basic) ? 'must specify exactly one of: `basic`, `gang`' : 'must specify one of: `basic`, `gang`'".into())))]
pub struct CompositePodGroupSchedulingPolicy {
    /// Child groups are scheduled independently.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic: Option<Empty>,
    /// No child group starts until at least `minGroupCount` children can start together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang: Option<CompositeGangSchedulingPolicy>,
}

/// Gang policy of a CompositePodGroup.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompositeGangSchedulingPolicy {
    /// Child groups that must be quorate and fit before any of them starts. When unset, the
    /// controller supplies a default (muster: the number of child groups).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub min_group_count: Option<i32>,
}

/// Placement constraints of a group.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
pub struct SchedulingConstraints {
    /// At most one topology constraint: every pod of the group lands in one domain of its key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1), extend("x-kubernetes-list-type" = "atomic"))]
    pub topology: Option<Vec<TopologyConstraint>>,
}

/// Every pod of the group lands on nodes sharing one value of the node label `key`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
pub struct TopologyConstraint {
    /// A node label key, e.g. `topology.kubernetes.io/zone` or `example.com/rack`.
    #[schemars(length(min = 1, max = 317), regex(pattern = LABEL_KEY_PATTERN))]
    pub key: String,
}

/// What happens to the group when one of its pods is disrupted: exactly one of `single`
/// (only that pod) or `all` (the whole group is restarted).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[x_kube(validation = Rule::new("has(self.single) != has(self.all)").message(Message::Expression("has(self.single) ? 'must specify exactly one of: `single`, `all`' : 'must specify one of: `single`, `all`'".into())))]
pub struct DisruptionMode {
    /// Only the disrupted pod is affected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub single: Option<Empty>,
    /// The whole group is disrupted together (and replaced together).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all: Option<Empty>,
}

/// A ResourceClaim shared by every pod of the group: exactly one of `resourceClaimName`
/// (an existing claim) or `resourceClaimTemplateName` (one claim per group from a template).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.resourceClaimName) != has(self.resourceClaimTemplateName)").message(Message::Expression("has(self.resourceClaimName) ? 'must specify exactly one of: `resourceClaimName`, `resourceClaimTemplateName`' : 'must specify one of: `resourceClaimName`, `resourceClaimTemplateName`'".into())))]
pub struct PodGroupResourceClaim {
    /// Name of the claim within the group (a DNS label), unique in the list.
    #[schemars(length(min = 1, max = 63), regex(pattern = DNS_LABEL_PATTERN))]
    pub name: String,
    /// Name of an existing ResourceClaim in the group's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub resource_claim_name: Option<String>,
    /// Name of a ResourceClaimTemplate from which one claim per group is made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN_PATTERN))]
    pub resource_claim_template_name: Option<String>,
}

/// Which policy variant a block resolves to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PolicyKind {
    /// `basic: {}`
    Basic,
    /// `gang: {...}`
    Gang,
}

/// Which disruption mode a block resolves to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DisruptionModeKind {
    /// `single: {}`
    Single,
    /// `all: {}`
    All,
}

impl PodGroupSchedulingPolicy {
    /// `basic: {}`.
    pub fn basic() -> Self {
        Self { basic: Some(Empty {}), gang: None }
    }
    /// `gang: {minCount}`.
    pub fn gang(min_count: Option<i32>) -> Self {
        Self { basic: None, gang: Some(GangSchedulingPolicy { min_count }) }
    }
    /// The variant, when exactly one member is set.
    pub fn kind(&self) -> Option<PolicyKind> {
        match (&self.basic, &self.gang) {
            (Some(_), None) => Some(PolicyKind::Basic),
            (None, Some(_)) => Some(PolicyKind::Gang),
            _ => None,
        }
    }
    /// True when neither member is set (such a block does not override a default).
    pub fn is_empty(&self) -> bool {
        self.basic.is_none() && self.gang.is_none()
    }
    /// `gang.minCount`, when set.
    pub fn min_count(&self) -> Option<i32> {
        self.gang.as_ref().and_then(|g| g.min_count)
    }
}

impl CompositePodGroupSchedulingPolicy {
    /// `basic: {}`.
    pub fn basic() -> Self {
        Self { basic: Some(Empty {}), gang: None }
    }
    /// `gang: {minGroupCount}`.
    pub fn gang(min_group_count: Option<i32>) -> Self {
        Self { basic: None, gang: Some(CompositeGangSchedulingPolicy { min_group_count }) }
    }
    /// The variant, when exactly one member is set.
    pub fn kind(&self) -> Option<PolicyKind> {
        match (&self.basic, &self.gang) {
            (Some(_), None) => Some(PolicyKind::Basic),
            (None, Some(_)) => Some(PolicyKind::Gang),
            _ => None,
        }
    }
    /// True when neither member is set.
    pub fn is_empty(&self) -> bool {
        self.basic.is_none() && self.gang.is_none()
    }
    /// `gang.minGroupCount`, when set.
    pub fn min_group_count(&self) -> Option<i32> {
        self.gang.as_ref().and_then(|g| g.min_group_count)
    }
}

impl DisruptionMode {
    /// `single: {}`.
    pub fn single() -> Self {
        Self { single: Some(Empty {}), all: None }
    }
    /// `all: {}`.
    pub fn all() -> Self {
        Self { single: None, all: Some(Empty {}) }
    }
    /// The variant, when exactly one member is set.
    pub fn kind(&self) -> Option<DisruptionModeKind> {
        match (&self.single, &self.all) {
            (Some(_), None) => Some(DisruptionModeKind::Single),
            (None, Some(_)) => Some(DisruptionModeKind::All),
            _ => None,
        }
    }
    /// True when neither member is set.
    pub fn is_empty(&self) -> bool {
        self.single.is_none() && self.all.is_none()
    }
}

impl SchedulingConstraints {
    /// A constraint keeping the group inside one domain of `key`.
    pub fn topology(key: impl Into<String>) -> Self {
        Self { topology: Some(vec![TopologyConstraint { key: key.into() }]) }
    }
    /// True when no constraint is listed.
    pub fn is_empty(&self) -> bool {
        self.topology.as_ref().is_none_or(|t| t.is_empty())
    }
    /// The topology key, when one is set.
    pub fn topology_key(&self) -> Option<&str> {
        self.topology.as_ref().and_then(|t| t.first()).map(|t| t.key.as_str())
    }
}

/// The leaf blocks a MusterJob embeds in `spec.scheduling` (upstream `JobSpec.scheduling`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodGroupScheduling {
    /// `basic` (default) or `gang`. The variant is frozen; only `gang.minCount` may change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling_policy: Option<PodGroupSchedulingPolicy>,
    /// Topology constraint of the gang. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling_constraints: Option<SchedulingConstraints>,
    /// `single` (default) or `all`. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disruption_mode: Option<DisruptionMode>,
    /// ResourceClaims shared by the whole group, at most 4, keyed by name. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub resource_claims: Option<Vec<PodGroupResourceClaim>>,
}

/// The composite blocks a MusterJobSet embeds in `spec.scheduling` (no claims).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompositePodGroupScheduling {
    /// `basic` (default) or `gang`. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling_policy: Option<CompositePodGroupSchedulingPolicy>,
    /// Topology constraint for all child groups together. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling_constraints: Option<SchedulingConstraints>,
    /// `single` (default) or `all`. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disruption_mode: Option<DisruptionMode>,
}

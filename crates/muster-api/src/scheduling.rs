//! `scheduling.muster.dev/v1alpha1`: Workload, PodGroup and CompositePodGroup, mirroring the
//! spec shapes of upstream `scheduling.k8s.io` v1beta1/v1alpha3, plus muster's status.

use std::cell::Cell;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use super::blocks::{
    CompositePodGroupSchedulingPolicy, DNS_LABEL_PATTERN, DisruptionMode, PodGroupResourceClaim,
    PodGroupSchedulingPolicy, SchedulingConstraints,
};

/// API group of the scheduling objects.
pub const GROUP: &str = "scheduling.muster.dev";
/// API version of the scheduling objects.
pub const VERSION: &str = "v1alpha1";
/// Most templates of one kind under one parent.
pub const MAX_TEMPLATES: usize = 8;
/// Deepest template tree a Workload may hold (root = depth 1).
pub const MAX_DEPTH: usize = 4;

/// Which object a Workload was made for (information only).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadControllerRef {
    /// API group of the controller object, empty for the core group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_group: Option<String>,
    /// Kind of the controller object.
    pub kind: String,
    /// Name of the controller object.
    pub name: String,
}

/// The scheduling intent of a workload: a tree of group templates.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[kube(
    group = "scheduling.muster.dev",
    version = "v1alpha1",
    kind = "Workload",
    namespaced,
    derive = "PartialEq",
    shortname = "mwl",
    category = "muster",
    status = "WorkloadStatus",
    doc = "The compiled scheduling intent of a MusterJob or MusterJobSet: a tree of PodGroup and CompositePodGroup templates (mirrors scheduling.k8s.io Workload).",
    printcolumn(name = "Controller", type_ = "string", json_path = ".spec.controllerRef.name"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("(has(self.podGroupTemplates) && size(self.podGroupTemplates) > 0) != (has(self.compositePodGroupTemplates) && size(self.compositePodGroupTemplates) > 0)").message("must specify exactly one of: `podGroupTemplates`, `compositePodGroupTemplates`"),
    validation = Rule::new("has(self.podGroupTemplates) == has(oldSelf.podGroupTemplates) && has(self.compositePodGroupTemplates) == has(oldSelf.compositePodGroupTemplates)").message("templates may not be added or removed"),
    validation = Rule::new("has(self.controllerRef) == has(oldSelf.controllerRef) && (!has(self.controllerRef) || self.controllerRef == oldSelf.controllerRef)").message("field is immutable").field_path(".controllerRef"),
    validation = Rule::new("has(self.compositePodGroupTemplates) == has(oldSelf.compositePodGroupTemplates) && (!has(self.compositePodGroupTemplates) || (size(self.compositePodGroupTemplates) == size(oldSelf.compositePodGroupTemplates) && self.compositePodGroupTemplates.all(t, oldSelf.compositePodGroupTemplates.exists(o, o.name == t.name))))").message("templates may not be added or removed").field_path(".compositePodGroupTemplates")
)]
pub struct WorkloadSpec {
    /// The object this Workload was compiled from. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller_ref: Option<WorkloadControllerRef>,
    /// Leaf templates (exactly one of the two lists is non-empty), at most 8, keyed by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 8), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    #[x_kube(validation = Rule::new("size(self) == size(oldSelf) && self.all(t, oldSelf.exists(o, o.name == t.name))").message("templates may not be added or removed"))]
    pub pod_group_templates: Option<Vec<PodGroupTemplate>>,
    /// Composite templates (exactly one of the two lists is non-empty), at most 8, keyed by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "composite_templates_schema")]
    pub composite_pod_group_templates: Option<Vec<CompositePodGroupTemplate>>,
}

/// Status of a Workload.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadStatus {
    /// Generation of the spec the status was written for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions of the Workload.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// A template from which PodGroups are made. Everything except `schedulingPolicy.gang.minCount`
/// is immutable.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.schedulingPolicy.gang) || has(self.schedulingPolicy.gang.minCount)").message("required in a compiled template").field_path(".schedulingPolicy.gang.minCount").reason(Reason::FieldValueRequired),
    validation = Rule::new("has(self.schedulingPolicy.gang) == has(oldSelf.schedulingPolicy.gang)").message("field is immutable: the policy may not change between `basic` and `gang`").field_path(".schedulingPolicy"),
    validation = Rule::new("has(self.schedulingConstraints) == has(oldSelf.schedulingConstraints) && (!has(self.schedulingConstraints) || self.schedulingConstraints == oldSelf.schedulingConstraints)").message("field is immutable").field_path(".schedulingConstraints"),
    validation = Rule::new("has(self.resourceClaims) == has(oldSelf.resourceClaims) && (!has(self.resourceClaims) || self.resourceClaims == oldSelf.resourceClaims)").message("field is immutable").field_path(".resourceClaims"),
    validation = Rule::new("has(self.disruptionMode) == has(oldSelf.disruptionMode) && (!has(self.disruptionMode) || self.disruptionMode == oldSelf.disruptionMode)").message("field is immutable").field_path(".disruptionMode"),
    validation = Rule::new("has(self.priorityClassName) == has(oldSelf.priorityClassName) && (!has(self.priorityClassName) || self.priorityClassName == oldSelf.priorityClassName)").message("field is immutable").field_path(".priorityClassName"),
    validation = Rule::new("has(self.priority) == has(oldSelf.priority) && (!has(self.priority) || self.priority == oldSelf.priority)").message("field is immutable").field_path(".priority"),
    validation = Rule::new("has(self.preemptionPolicy) == has(oldSelf.preemptionPolicy) && (!has(self.preemptionPolicy) || self.preemptionPolicy == oldSelf.preemptionPolicy)").message("field is immutable").field_path(".preemptionPolicy")
)]
pub struct PodGroupTemplate {
    /// Name of the template (a DNS label), unique across the whole tree.
    #[schemars(length(min = 1, max = 63), regex(pattern = DNS_LABEL_PATTERN))]
    pub name: String,
    /// `basic` or `gang` (with `minCount` required here).
    pub scheduling_policy: PodGroupSchedulingPolicy,
    /// Topology constraint of each PodGroup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling_constraints: Option<SchedulingConstraints>,
    /// ResourceClaims shared by each PodGroup, at most 4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub resource_claims: Option<Vec<PodGroupResourceClaim>>,
    /// `single` or `all`; a PodGroup without one defaults to `single`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disruption_mode: Option<DisruptionMode>,
    /// PriorityClass of the groups made from this template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub priority_class_name: Option<String>,
    /// Priority of the groups (resolved from the class).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 1_000_000_000))]
    pub priority: Option<i32>,
    /// `PreemptLowerPriority` or `Never`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemption_policy: Option<PreemptionPolicy>,
}

/// Whether a group may preempt lower-priority ones.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum PreemptionPolicy {
    /// May preempt groups of lower priority.
    PreemptLowerPriority,
    /// Never preempts.
    Never,
}

/// A template from which CompositePodGroups are made; its children are templates too.
/// Everything but the children's own mutable fields is immutable.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.schedulingPolicy.gang) || has(self.schedulingPolicy.gang.minGroupCount)").message("required in a compiled template").field_path(".schedulingPolicy.gang.minGroupCount").reason(Reason::FieldValueRequired),
    validation = Rule::new("(has(self.podGroupTemplates) && size(self.podGroupTemplates) > 0) || (has(self.compositePodGroupTemplates) && size(self.compositePodGroupTemplates) > 0)").message("must have at least one child template"),
    validation = Rule::new("self.schedulingPolicy == oldSelf.schedulingPolicy").message("field is immutable").field_path(".schedulingPolicy"),
    validation = Rule::new("has(self.schedulingConstraints) == has(oldSelf.schedulingConstraints) && (!has(self.schedulingConstraints) || self.schedulingConstraints == oldSelf.schedulingConstraints)").message("field is immutable").field_path(".schedulingConstraints"),
    validation = Rule::new("has(self.disruptionMode) == has(oldSelf.disruptionMode) && (!has(self.disruptionMode) || self.disruptionMode == oldSelf.disruptionMode)").message("field is immutable").field_path(".disruptionMode"),
    validation = Rule::new("has(self.priorityClassName) == has(oldSelf.priorityClassName) && (!has(self.priorityClassName) || self.priorityClassName == oldSelf.priorityClassName)").message("field is immutable").field_path(".priorityClassName"),
    validation = Rule::new("has(self.priority) == has(oldSelf.priority) && (!has(self.priority) || self.priority == oldSelf.priority)").message("field is immutable").field_path(".priority"),
    validation = Rule::new("has(self.preemptionPolicy) == has(oldSelf.preemptionPolicy) && (!has(self.preemptionPolicy) || self.preemptionPolicy == oldSelf.preemptionPolicy)").message("field is immutable").field_path(".preemptionPolicy"),
    validation = Rule::new("has(self.podGroupTemplates) == has(oldSelf.podGroupTemplates) && (!has(self.podGroupTemplates) || (size(self.podGroupTemplates) == size(oldSelf.podGroupTemplates) && self.podGroupTemplates.all(t, oldSelf.podGroupTemplates.exists(o, o.name == t.name))))").message("templates may not be added or removed").field_path(".podGroupTemplates"),
    validation = Rule::new("has(self.compositePodGroupTemplates) == has(oldSelf.compositePodGroupTemplates) && (!has(self.compositePodGroupTemplates) || (size(self.compositePodGroupTemplates) == size(oldSelf.compositePodGroupTemplates) && self.compositePodGroupTemplates.all(t, oldSelf.compositePodGroupTemplates.exists(o, o.name == t.name))))").message("templates may not be added or removed").field_path(".compositePodGroupTemplates")
)]
pub struct CompositePodGroupTemplate {
    /// Name of the template (a DNS label), unique across the whole tree.
    #[schemars(length(min = 1, max = 63), regex(pattern = DNS_LABEL_PATTERN))]
    pub name: String,
    /// `basic` or `gang` (with `minGroupCount` required here).
    pub scheduling_policy: CompositePodGroupSchedulingPolicy,
    /// Topology constraint for all child groups together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling_constraints: Option<SchedulingConstraints>,
    /// `single` or `all`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disruption_mode: Option<DisruptionMode>,
    /// PriorityClass of the groups made from this template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub priority_class_name: Option<String>,
    /// Priority of the groups (resolved from the class).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 1_000_000_000))]
    pub priority: Option<i32>,
    /// `PreemptLowerPriority` or `Never`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemption_policy: Option<PreemptionPolicy>,
    /// Leaf child templates, at most 8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 8), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub pod_group_templates: Option<Vec<PodGroupTemplate>>,
    /// Composite child templates, at most 8, to a depth of 4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "composite_templates_schema")]
    pub composite_pod_group_templates: Option<Vec<CompositePodGroupTemplate>>,
}

thread_local! {
    /// Depth of the composite template whose schema is being generated (0 = none yet).
    static SCHEMA_DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// The schema of a list of composite templates, unrolled to `MAX_DEPTH` levels: a CRD schema
/// may not be recursive, and the apiserver must still refuse a fifth level.
fn composite_templates_schema(generator: &mut SchemaGenerator) -> Schema {
    let depth = SCHEMA_DEPTH.get() + 1;
    if depth > MAX_DEPTH {
        return json_schema!({
            "type": "array",
            "maxItems": 0,
            "description": "The template tree may be at most 4 levels deep.",
            // `name` only so that the parent's rules over its children's names compile.
            "items": {"type": "object", "properties": {"name": {"type": "string"}}},
        });
    }
    SCHEMA_DEPTH.set(depth);
    let item = CompositePodGroupTemplate::json_schema(generator);
    SCHEMA_DEPTH.set(depth - 1);
    json_schema!({
        "type": "array",
        "maxItems": MAX_TEMPLATES,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["name"],
        "items": item,
    })
}

/// Where a group's template lives.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadReference {
    /// Name of the Workload in the group's namespace.
    #[schemars(length(min = 1, max = 253))]
    pub workload_name: String,
    /// Name of the template inside that Workload.
    #[schemars(length(min = 1, max = 63))]
    pub template_name: String,
}

/// Lifecycle of a group as muster sees it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum GroupPhase {
    /// Waiting for quorum, or for the admission cycle.
    #[default]
    Pending,
    /// Quorate but does not fit; the message says why.
    Unschedulable,
    /// Admitted: pods pinned to nodes and ungated.
    Admitted,
    /// Admitted pods are running.
    Running,
    /// Every pod of the group succeeded.
    Succeeded,
    /// The group failed (bind timeout, or pods failed).
    Failed,
}

/// Step of the admission commit protocol.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum PlanState {
    /// Recorded; no pod touched yet.
    Planned,
    /// Pods are being pinned and ungated.
    Committing,
    /// Every pod of the plan was ungated.
    Admitted,
}

/// One pod's place in an admission plan.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlannedPod {
    /// Pod name.
    pub name: String,
    /// Pod UID (a recreated pod with the same name is not the planned one).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// PodGroup of the pod.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod_group: String,
    /// Node name.
    pub node: String,
    /// The node's `kubernetes.io/hostname` label, which the pin selects on; empty when it is
    /// the node's name (the usual case, kept out of the plan to keep large plans small).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hostname: String,
    /// GPU indices given to the pod, as in `gpu.muster.dev/indices`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_indices: Option<String>,
    /// The pod's own DRA ResourceClaims the commit allocates (their devices are the GPUs of
    /// `gpuIndices` on `node`), written before the pod is ungated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claims: Vec<String>,
}

impl PlannedPod {
    /// The `kubernetes.io/hostname` value the pod is pinned to.
    pub fn pin_hostname(&self) -> &str {
        if self.hostname.is_empty() { &self.node } else { &self.hostname }
    }
}

/// The record of one admission decision (the commit protocol's log).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionPlan {
    /// Unique id of the decision.
    pub id: String,
    /// Step of the commit protocol.
    pub state: PlanState,
    /// When the plan was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<Time>,
    /// When the last pod was ungated (the commit finished, or was resumed after a restart):
    /// the bind timeout counts from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admitted_at: Option<Time>,
    /// Where each admitted pod goes.
    #[serde(default)]
    pub pods: Vec<PlannedPod>,
    /// Named DRA ResourceClaims shared by the plan's pods that the commit allocates, before
    /// the first pod is ungated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_claims: Vec<String>,
}

/// A node the next plans of a root avoid: kube-scheduler refused (or lost) a pin there.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct AvoidedNode {
    /// Node name.
    pub node: String,
    /// Until when placement avoids it.
    pub until: Time,
}

/// A PodGroup: one gang (or basic group) of pods, made from a template.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[kube(
    group = "scheduling.muster.dev",
    version = "v1alpha1",
    kind = "PodGroup",
    plural = "podgroups",
    namespaced,
    derive = "PartialEq",
    shortname = "mpg",
    category = "muster",
    status = "PodGroupStatus",
    doc = "A group of pods admitted together (mirrors scheduling.k8s.io PodGroup). Pods join with the label scheduling.muster.dev/pod-group.",
    printcolumn(
        name = "Min",
        type_ = "integer",
        json_path = ".status.minCount",
        description = "pods needed before any starts"
    ),
    printcolumn(name = "Pods", type_ = "integer", json_path = ".status.pods"),
    printcolumn(name = "Admitted", type_ = "integer", json_path = ".status.admitted"),
    printcolumn(name = "Running", type_ = "integer", json_path = ".status.running"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    // Admission's short reason (`WaitingForQuorum`, `Insufficient nvidia.com/gpu`,
    // `BindTimeout`, ...), so `kubectl get mpg` says why without `-o wide`; the Message column
    // has the words.
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.reason",
        description = "why, in a word, the group waits or failed"
    ),
    printcolumn(name = "Parent", type_ = "string", json_path = ".spec.parentCompositePodGroupName", priority = 1),
    printcolumn(name = "Message", type_ = "string", json_path = ".status.message", priority = 1),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct PodGroupSpec {
    /// The CompositePodGroup this group belongs to; unset for a root group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub parent_composite_pod_group_name: Option<String>,
    /// The Workload template this group was made from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_ref: Option<WorkloadReference>,
    /// `basic` or `gang` (with `minCount` required). Only `gang.minCount` may change.
    pub scheduling_policy: PodGroupSchedulingPolicy,
    /// Topology constraint: every pod lands in one domain of the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling_constraints: Option<SchedulingConstraints>,
    /// ResourceClaims shared by the whole group, at most 4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub resource_claims: Option<Vec<PodGroupResourceClaim>>,
    /// `single` (default) or `all`.
    #[serde(default = "default_disruption_mode")]
    #[schemars(extend("default" = {"single": {}}))]
    pub disruption_mode: DisruptionMode,
    /// PriorityClass of the group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub priority_class_name: Option<String>,
    /// Priority of the group; higher is admitted first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 1_000_000_000))]
    pub priority: Option<i32>,
    /// `PreemptLowerPriority` or `Never`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemption_policy: Option<PreemptionPolicy>,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

fn default_disruption_mode() -> DisruptionMode {
    DisruptionMode::single()
}

/// Observed state of a PodGroup.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodGroupStatus {
    /// Where the group stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<GroupPhase>,
    /// Why, in a word, while it waits or after it failed (e.g. `WaitingForQuorum`,
    /// `Insufficient nvidia.com/gpu`, `BindTimeout`); the message has the whole story.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The quorum in force: `gang.minCount`, or 1 for a basic group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_count: Option<i32>,
    /// Pods of the group that exist and are not terminating.
    #[serde(default)]
    pub pods: i32,
    /// Pods still held by the admission gate.
    #[serde(default)]
    pub gated: i32,
    /// Pods admitted by muster (ungated), bound or not.
    #[serde(default)]
    pub admitted: i32,
    /// Pods bound to a node.
    #[serde(default)]
    pub scheduled: i32,
    /// Pods running.
    #[serde(default)]
    pub running: i32,
    /// Pods that succeeded.
    #[serde(default)]
    pub succeeded: i32,
    /// Pods that failed.
    #[serde(default)]
    pub failed: i32,
    /// Upstream conditions (`PodGroupInitiallyScheduled`, `DisruptionTarget`) and muster's own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Why the group is where it is, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The admission plan covering this group, when this group is the root of the decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<AdmissionPlan>,
    /// Attempts of this root rolled back after a failed pin (their pods deleted and recreated
    /// gated): the `scheduling.muster.dev/gang-attempt` of pods created after them.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rollbacks: i32,
    /// Rollbacks in the current streak (each soon after the one before); a long streak makes
    /// the gang unschedulable for a while.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub recent_rollbacks: i32,
    /// When the last rollback happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_rollback_time: Option<Time>,
    /// Nodes the next plans of this root avoid, each until its expiry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub avoid_nodes: Vec<AvoidedNode>,
    /// The ResourceClaim behind each entry of `spec.resourceClaims` whose claim exists
    /// (upstream's field), written by the job controller alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub resource_claim_statuses: Vec<PodGroupResourceClaimStatus>,
    /// Generation of the spec this status was written for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The claim made for (or named by) one entry of a PodGroup's `spec.resourceClaims`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodGroupResourceClaimStatus {
    /// The entry's name (`spec.resourceClaims[].name`).
    #[schemars(length(min = 1, max = 63), regex(pattern = DNS_LABEL_PATTERN))]
    pub name: String,
    /// The ResourceClaim in the group's namespace the group's pods share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub resource_claim_name: Option<String>,
}

/// A CompositePodGroup: a group of groups admitted together.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[kube(
    group = "scheduling.muster.dev",
    version = "v1alpha1",
    kind = "CompositePodGroup",
    plural = "compositepodgroups",
    namespaced,
    derive = "PartialEq",
    shortname = "mcpg",
    category = "muster",
    status = "CompositePodGroupStatus",
    doc = "A group of PodGroups (and CompositePodGroups) admitted together (mirrors scheduling.k8s.io CompositePodGroup).",
    printcolumn(
        name = "Min",
        type_ = "integer",
        json_path = ".status.minGroupCount",
        description = "child groups needed before any starts"
    ),
    printcolumn(name = "Children", type_ = "integer", json_path = ".status.children"),
    printcolumn(name = "Quorate", type_ = "integer", json_path = ".status.quorateChildren"),
    printcolumn(name = "Admitted", type_ = "integer", json_path = ".status.admittedChildren"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.reason",
        description = "why, in a word, the set waits or failed"
    ),
    printcolumn(name = "Message", type_ = "string", json_path = ".status.message", priority = 1),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct CompositePodGroupSpec {
    /// The parent CompositePodGroup; unset for the root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub parent_composite_pod_group_name: Option<String>,
    /// The Workload template this group was made from.
    pub workload_ref: WorkloadReference,
    /// `basic` or `gang` (with `minGroupCount` required).
    pub scheduling_policy: CompositePodGroupSchedulingPolicy,
    /// Topology constraint for every pod of every child group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling_constraints: Option<SchedulingConstraints>,
    /// `single` (default) or `all`.
    #[serde(default = "default_disruption_mode")]
    #[schemars(extend("default" = {"single": {}}))]
    pub disruption_mode: DisruptionMode,
    /// PriorityClass of the group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub priority_class_name: Option<String>,
    /// Priority of the group; higher is admitted first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 1_000_000_000))]
    pub priority: Option<i32>,
    /// `PreemptLowerPriority` or `Never`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemption_policy: Option<PreemptionPolicy>,
}

/// Observed state of a CompositePodGroup.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompositePodGroupStatus {
    /// Where the group stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<GroupPhase>,
    /// Why, in a word, while it waits or after it failed; the message has the whole story.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The quorum in force: `gang.minGroupCount`, or 1 for a basic group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_group_count: Option<i32>,
    /// Child groups that exist.
    #[serde(default)]
    pub children: i32,
    /// Child groups that are quorate.
    #[serde(default)]
    pub quorate_children: i32,
    /// Child groups admitted.
    #[serde(default)]
    pub admitted_children: i32,
    /// Upstream conditions (`CompositePodGroupInitiallyScheduled`, `DisruptionTarget`) and muster's own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Why the group is where it is, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The admission plan covering this group and its descendants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<AdmissionPlan>,
    /// Attempts of this root rolled back after a failed pin (their pods deleted and recreated
    /// gated): the `scheduling.muster.dev/gang-attempt` of pods created after them.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rollbacks: i32,
    /// Rollbacks in the current streak (each soon after the one before); a long streak makes
    /// the gang unschedulable for a while.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub recent_rollbacks: i32,
    /// When the last rollback happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_rollback_time: Option<Time>,
    /// Nodes the next plans of this root avoid, each until its expiry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub avoid_nodes: Vec<AvoidedNode>,
    /// Generation of the spec this status was written for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

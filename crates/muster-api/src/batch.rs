//! `batch.muster.dev/v1alpha1`: MusterJob (Job-style) and MusterJobSet (JobSet-style), whose
//! `spec.scheduling` embeds the upstream building blocks.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::blocks::{CompositePodGroupScheduling, DNS_LABEL_PATTERN, PodGroupScheduling};

/// API group of the batch objects.
pub const GROUP: &str = "batch.muster.dev";
/// API version of the batch objects.
pub const VERSION: &str = "v1alpha1";
/// Most replicatedJobs a MusterJobSet with `spec.scheduling` may have (one template each).
pub const MAX_SCHEDULED_REPLICATED_JOBS: usize = 8;
/// Most replicatedJobs a MusterJobSet may have at all.
pub const MAX_REPLICATED_JOBS: usize = 32;

/// How pods of a MusterJob are told apart.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum CompletionMode {
    /// Pods are interchangeable; the job completes after `completions` successes.
    #[default]
    NonIndexed,
    /// Each pod gets an index 0..completions-1 (annotation, `JOB_COMPLETION_INDEX`, hostname).
    Indexed,
}

/// A batch job whose pods start together (Job fields plus `scheduling`).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[kube(
    group = "batch.muster.dev",
    version = "v1alpha1",
    kind = "MusterJob",
    plural = "musterjobs",
    namespaced,
    derive = "PartialEq",
    shortname = "mjob",
    category = "muster",
    status = "MusterJobStatus",
    doc = "A batch job whose pods are admitted as a gang: the familiar batch/v1 Job fields plus spec.scheduling with the upstream scheduling building blocks.",
    printcolumn(name = "Completions", type_ = "string", json_path = ".status.progress"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "PodGroup", type_ = "string", json_path = ".status.podGroupName", priority = 1),
    // Upstream mode: kube-scheduler's reason for the job's native PodGroup (`Scheduled`,
    // `Unschedulable`), mirrored from its PodGroupInitiallyScheduled condition.
    printcolumn(name = "Scheduling", type_ = "string", json_path = ".status.conditions[?(@.type==\"PodGroupInitiallyScheduled\")].reason", priority = 1),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
// Update rules report at the field that changed (as upstream's Job validation does); the block
// rules stay quiet while `scheduling` itself is being set or cleared, which is reported alone.
#[x_kube(
    validation = Rule::new("!has(self.scheduling) || !has(self.scheduling.schedulingPolicy) || !has(self.scheduling.schedulingPolicy.gang) || !has(self.scheduling.schedulingPolicy.gang.minCount) || self.scheduling.schedulingPolicy.gang.minCount <= self.parallelism").message("must be less than or equal to parallelism").field_path(".scheduling.schedulingPolicy.gang.minCount"),
    validation = Rule::new("has(self.scheduling) == has(oldSelf.scheduling)").message(Message::Expression("has(self.scheduling) ? 'field cannot be set once created' : 'field cannot be cleared once set'".into())).field_path(".scheduling"),
    validation = Rule::new("!has(self.scheduling) || !has(oldSelf.scheduling) || has(self.scheduling.schedulingPolicy) == has(oldSelf.scheduling.schedulingPolicy)").message(Message::Expression("has(self.scheduling.schedulingPolicy) ? 'field cannot be set once created' : 'field cannot be cleared once set'".into())).field_path(".scheduling.schedulingPolicy"),
    validation = Rule::new("!has(self.scheduling) || !has(oldSelf.scheduling) || !has(self.scheduling.schedulingPolicy) || !has(oldSelf.scheduling.schedulingPolicy) || has(self.scheduling.schedulingPolicy.gang) == has(oldSelf.scheduling.schedulingPolicy.gang)").message("field is immutable: the policy may not change between `basic` and `gang`; only gang.minCount may change").field_path(".scheduling.schedulingPolicy"),
    validation = Rule::new("!has(self.scheduling) || !has(oldSelf.scheduling) || (has(self.scheduling.schedulingConstraints) == has(oldSelf.scheduling.schedulingConstraints) && (!has(self.scheduling.schedulingConstraints) || self.scheduling.schedulingConstraints == oldSelf.scheduling.schedulingConstraints))").message("field is immutable").field_path(".scheduling.schedulingConstraints"),
    validation = Rule::new("!has(self.scheduling) || !has(oldSelf.scheduling) || (has(self.scheduling.disruptionMode) == has(oldSelf.scheduling.disruptionMode) && (!has(self.scheduling.disruptionMode) || self.scheduling.disruptionMode == oldSelf.scheduling.disruptionMode))").message("field is immutable").field_path(".scheduling.disruptionMode"),
    validation = Rule::new("!has(self.scheduling) || !has(oldSelf.scheduling) || (has(self.scheduling.resourceClaims) == has(oldSelf.scheduling.resourceClaims) && (!has(self.scheduling.resourceClaims) || self.scheduling.resourceClaims == oldSelf.scheduling.resourceClaims))").message("field is immutable").field_path(".scheduling.resourceClaims"),
    validation = Rule::new("has(self.completions) == has(oldSelf.completions) && (!has(self.completions) || self.completions == oldSelf.completions)").message("field is immutable").field_path(".completions"),
    validation = Rule::new("self.completionMode == oldSelf.completionMode").message("field is immutable").field_path(".completionMode")
)]
pub struct MusterJobSpec {
    /// Pods running at once. Mutable.
    #[serde(default = "one")]
    #[schemars(range(min = 0), extend("default" = 1))]
    pub parallelism: i32,
    /// Successful pods needed to complete (default: parallelism). Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub completions: Option<i32>,
    /// `NonIndexed` (default) or `Indexed`. Immutable.
    #[serde(default)]
    #[schemars(extend("default" = "NonIndexed"))]
    pub completion_mode: CompletionMode,
    /// Pod failures tolerated before the job fails (default 6).
    #[serde(default = "six")]
    #[schemars(range(min = 0), extend("default" = 6))]
    pub backoff_limit: i32,
    /// Seconds the job may be active before it fails with reason DeadlineExceeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub active_deadline_seconds: Option<i64>,
    /// When true, active pods are deleted and none are created; the Workload stays.
    #[serde(default)]
    #[schemars(extend("default" = false))]
    pub suspend: bool,
    /// Seconds after the job finishes before it is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ttl_seconds_after_finished: Option<i32>,
    /// The pods to run. `restartPolicy` must be `Never` or `OnFailure`.
    pub template: PodTemplateSpec,
    /// Gang policy, topology constraint, disruption mode and shared claims of the job's PodGroup.
    /// Only `schedulingPolicy.gang.minCount` may change after creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling: Option<PodGroupScheduling>,
    /// Opt-in: the containers' `nvidia.com/gpu` requests become a DRA ResourceClaim per pod
    /// (from the ResourceClaimTemplate `<job>-gpus` muster makes). Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_claims: Option<GpuClaims>,
}

/// How a MusterJob's GPUs are claimed through DRA (`resource.k8s.io/v1`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuClaims {
    /// DeviceClass of the GPUs (a DNS subdomain); default: the controller's
    /// `--dra-gpu-device-class` (`gpu.nvidia.com`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub device_class_name: Option<String>,
}

fn one() -> i32 {
    1
}
fn six() -> i32 {
    6
}

/// Where a MusterJob stands, in one word.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum JobPhase {
    /// Pods created or being created; not all admitted.
    #[default]
    Pending,
    /// Pods are running.
    Running,
    /// `completions` pods succeeded.
    Complete,
    /// Backoff limit or deadline reached.
    Failed,
    /// `spec.suspend` is true.
    Suspended,
    /// `spec.scheduling` is invalid; nothing was created.
    Invalid,
}

/// Observed state of a MusterJob.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct MusterJobStatus {
    /// Where the job stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<JobPhase>,
    /// Succeeded/completions, e.g. `3/4`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    /// Pods pending or running.
    #[serde(default)]
    pub active: i32,
    /// Pods ready.
    #[serde(default)]
    pub ready: i32,
    /// Pods succeeded.
    #[serde(default)]
    pub succeeded: i32,
    /// Pods failed.
    #[serde(default)]
    pub failed: i32,
    /// Indexes completed, for Indexed jobs (e.g. `0-2,5`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_indexes: Option<String>,
    /// `Complete`, `Failed`, `Suspended`, `Invalid`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// When the job first became active.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the job completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// The Workload the job compiled (or its parent's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_name: Option<String>,
    /// The job's PodGroup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_group_name: Option<String>,
    /// Generation of the spec this status was written for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Labels and annotations given to each child MusterJob of a replicatedJob.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
pub struct ChildMetadata {
    /// Labels of the child MusterJobs.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations of the child MusterJobs.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// The MusterJob made for each replica of a replicatedJob.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
pub struct MusterJobTemplate {
    /// Labels and annotations of the child MusterJobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ChildMetadata>,
    /// Spec of the child MusterJobs.
    pub spec: MusterJobSpec,
}

/// `replicas` identical MusterJobs named `<set>-<name>-<i>`; one PodGroupTemplate.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
pub struct ReplicatedJob {
    /// Name (a DNS label), unique in the set; also the name of its PodGroupTemplate.
    #[schemars(length(min = 1, max = 63), regex(pattern = DNS_LABEL_PATTERN))]
    pub name: String,
    /// How many child MusterJobs (each one PodGroup).
    #[serde(default = "one")]
    #[schemars(range(min = 0), extend("default" = 1))]
    pub replicas: i32,
    /// The child MusterJob.
    pub template: MusterJobTemplate,
}

/// When the set succeeds.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum SuccessOperator {
    /// Every targeted child job completes.
    #[default]
    All,
    /// Any targeted child job completes.
    Any,
}

/// When the set succeeds (JobSet spirit).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SuccessPolicy {
    /// `All` (default) or `Any`.
    #[serde(default)]
    pub operator: SuccessOperator,
    /// replicatedJobs whose children count; empty means all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub target_replicated_jobs: Vec<String>,
}

/// What happens when a child job fails.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailurePolicy {
    /// Times every child is recreated after a child fails before the set fails (default 0).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub max_restarts: i32,
}

/// A set of MusterJobs admitted together under one CompositePodGroup.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[kube(
    group = "batch.muster.dev",
    version = "v1alpha1",
    kind = "MusterJobSet",
    plural = "musterjobsets",
    namespaced,
    derive = "PartialEq",
    shortname = "mjobset",
    category = "muster",
    status = "MusterJobSetStatus",
    doc = "A set of MusterJobs (JobSet-style) whose PodGroups form one CompositePodGroup, so driver and workers start together.",
    printcolumn(name = "Completed", type_ = "string", json_path = ".status.progress"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Restarts", type_ = "integer", json_path = ".status.restarts"),
    // Upstream mode: where kube-scheduler has the set's native CompositePodGroup (`Scheduled`,
    // `Unschedulable`).
    printcolumn(name = "Scheduling", type_ = "string", json_path = ".status.conditions[?(@.type==\"CompositePodGroupInitiallyScheduled\")].reason", priority = 1),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.scheduling) || size(self.replicatedJobs) <= 8").message("must have at most 8 items when scheduling is set").field_path(".replicatedJobs"),
    validation = Rule::new("has(self.scheduling) == has(oldSelf.scheduling) && (!has(self.scheduling) || self.scheduling == oldSelf.scheduling)").message("field is immutable").field_path(".scheduling"),
    validation = Rule::new("self.replicatedJobs.map(r, r.name) == oldSelf.replicatedJobs.map(r, r.name) && self.replicatedJobs.all(r, oldSelf.replicatedJobs.exists(o, o.name == r.name && o.replicas == r.replicas))").message("replicatedJobs may not be added, removed, renamed or resized").field_path(".replicatedJobs")
)]
pub struct MusterJobSetSpec {
    /// Gang policy, topology constraint and disruption mode of the set's CompositePodGroup.
    /// Immutable. Without it, children are independent MusterJobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling: Option<CompositePodGroupScheduling>,
    /// Groups of identical child MusterJobs, keyed by name.
    #[schemars(length(min = 1, max = 32), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub replicated_jobs: Vec<ReplicatedJob>,
    /// When the set succeeds (default: every child completes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success_policy: Option<SuccessPolicy>,
    /// What a child failure does (default: the set fails).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_policy: Option<FailurePolicy>,
    /// When true, children are suspended.
    #[serde(default)]
    pub suspend: bool,
}

/// Where a MusterJobSet stands, in one word.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum JobSetPhase {
    /// Children created; not all running.
    #[default]
    Pending,
    /// Children are running.
    Running,
    /// The success policy is met.
    Completed,
    /// A child failed after `maxRestarts` restarts.
    Failed,
    /// `spec.suspend` is true.
    Suspended,
    /// The spec is invalid; nothing was created.
    Invalid,
}

/// Counts of one replicatedJob's children.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
pub struct ReplicatedJobStatus {
    /// Name of the replicatedJob.
    pub name: String,
    /// Children whose pods are all ready.
    #[serde(default)]
    pub ready: i32,
    /// Children complete.
    #[serde(default)]
    pub succeeded: i32,
    /// Children failed.
    #[serde(default)]
    pub failed: i32,
    /// Children active.
    #[serde(default)]
    pub active: i32,
    /// Children suspended.
    #[serde(default)]
    pub suspended: i32,
}

/// Observed state of a MusterJobSet.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct MusterJobSetStatus {
    /// Where the set stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<JobSetPhase>,
    /// Completed children / children, e.g. `3/5`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    /// Times all children were recreated after a failure.
    #[serde(default)]
    pub restarts: i32,
    /// Per replicatedJob counts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub replicated_jobs_status: Vec<ReplicatedJobStatus>,
    /// `Completed`, `Failed`, `Suspended`, `Invalid`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The Workload the set compiled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_name: Option<String>,
    /// The root CompositePodGroup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub composite_pod_group_name: Option<String>,
    /// Generation of the spec this status was written for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

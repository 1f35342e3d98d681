//! `batch.muster.dev/v1alpha1`: MusterJob (Job-style) and MusterJobSet (JobSet-style), whose
//! `spec.scheduling` embeds the upstream building blocks.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::blocks::{CompositePodGroupScheduling, DNS_LABEL_PATTERN, PodGroupScheduling, immutable};

/// API group of the batch objects.
pub const GROUP: &str = "batch.muster.dev";
/// API version of the batch objects.
pub const VERSION: &str = "v1alpha1";
/// Most replicatedJobs a MusterJobSet with `spec.scheduling` may have (one template each).
pub const MAX_SCHEDULED_REPLICATED_JOBS: usize = 8;
/// Most replicatedJobs a MusterJobSet may have at all.
pub const MAX_REPLICATED_JOBS: usize = 32;

pub use k8s_openapi::api::batch::v1::{
    PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement, PodFailurePolicyOnPodConditionsPattern,
    PodFailurePolicyRule, SuccessPolicy as JobSuccessPolicy, SuccessPolicyRule as JobSuccessPolicyRule,
};

/// The `managedBy` value of a MusterJob muster's own job controller reconciles (also when the
/// field is unset); a job naming another controller is left to it.
pub const JOB_CONTROLLER_NAME: &str = "batch.muster.dev/job-controller";
/// The `managedBy` value of a MusterJobSet muster's set controller reconciles.
pub const JOBSET_CONTROLLER_NAME: &str = "batch.muster.dev/jobset-controller";
/// A `managedBy` value: a domain-prefixed path (an RFC 1123 subdomain, `/`, RFC 3986 path
/// characters), as batch/v1 and JobSet require it.
const MANAGED_BY_PATTERN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9/\-._~%!$&'()*+,;=:]+$";
/// `backoffLimit` when unset: 6, or the largest int32 when `backoffLimitPerIndex` is set (as
/// batch/v1 defaults it).
pub const DEFAULT_BACKOFF_LIMIT: i32 = 6;

/// How pods of a MusterJob are told apart.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum CompletionMode {
    /// Pods are interchangeable; the job completes after `completions` successes.
    #[default]
    NonIndexed,
    /// Each pod gets an index 0..completions-1 (annotation, `JOB_COMPLETION_INDEX`, hostname).
    Indexed,
}

/// When a MusterJob creates a replacement for a pod (batch/v1 `podReplacementPolicy`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum PodReplacementPolicy {
    /// As soon as the pod is terminating or failed (the default without `podFailurePolicy`).
    TerminatingOrFailed,
    /// Only once the pod is fully terminated, in phase Failed (the only value with
    /// `podFailurePolicy`, and its default).
    Failed,
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
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    // batch/v1's rules that depend on the completion mode: a MusterJob's unset mode is
    // NonIndexed, a set's template's is Indexed (those are on ReplicatedJob).
    validation = Rule::new("!has(self.spec.backoffLimitPerIndex) || (has(self.spec.completionMode) && self.spec.completionMode == 'Indexed')").message("requires indexed completion mode").field_path(".spec.backoffLimitPerIndex"),
    validation = Rule::new("!has(self.spec.maxFailedIndexes) || (has(self.spec.completionMode) && self.spec.completionMode == 'Indexed')").message("requires indexed completion mode").field_path(".spec.maxFailedIndexes"),
    validation = Rule::new("!has(self.spec.successPolicy) || (has(self.spec.completionMode) && self.spec.completionMode == 'Indexed')").message("requires indexed completion mode").field_path(".spec.successPolicy"),
    validation = Rule::new("!has(self.spec.maxFailedIndexes) || !has(self.spec.completions) || !has(self.spec.completionMode) || self.spec.completionMode != 'Indexed' || self.spec.maxFailedIndexes <= self.spec.completions").message("must be less than or equal to completions").field_path(".spec.maxFailedIndexes")
)]
#[serde(rename_all = "camelCase")]
// Update rules report at the field that changed (as upstream's Job validation does); the block
// rules stay quiet while `scheduling` itself is being set or cleared, which is reported alone.
#[x_kube(
    validation = Rule::new("!has(self.scheduling) || !has(self.scheduling.schedulingPolicy) || !has(self.scheduling.schedulingPolicy.gang) || !has(self.scheduling.schedulingPolicy.gang.minCount) || self.scheduling.schedulingPolicy.gang.minCount <= self.parallelism").message("must be less than or equal to parallelism").field_path(".scheduling.schedulingPolicy.gang.minCount"),
    validation = Rule::new("has(self.scheduling) == has(oldSelf.scheduling)").message(Message::Expression("has(self.scheduling) ? 'field cannot be set once created' : 'field cannot be cleared once set'".into())).field_path(".scheduling"),
    // Elastic Indexed jobs: completions may change together with parallelism (equal to it).
    validation = Rule::new("(has(self.completions) == has(oldSelf.completions) && (!has(self.completions) || self.completions == oldSelf.completions)) || (has(self.completionMode) && self.completionMode == 'Indexed' && (!has(self.completions) || self.completions == self.parallelism))").message(Message::Expression("has(self.completionMode) && self.completionMode == 'Indexed' ? 'can only be modified in tandem with spec.parallelism' : 'field is immutable'".into())).field_path(".completions"),
    validation = Rule::new("(has(self.completionMode) ? self.completionMode : 'NonIndexed') == (has(oldSelf.completionMode) ? oldSelf.completionMode : 'NonIndexed')").message("field is immutable").field_path(".completionMode"),
    // batch/v1's rules that do not depend on the completion mode, and the fields it freezes.
    validation = Rule::new("!has(self.maxFailedIndexes) || has(self.backoffLimitPerIndex)").message("when maxFailedIndexes is specified").reason(Reason::FieldValueRequired).field_path(".backoffLimitPerIndex"),
    validation = Rule::new("!has(self.podFailurePolicy) || !has(self.podReplacementPolicy) || self.podReplacementPolicy == 'Failed'").message("supported values: \"Failed\" (with podFailurePolicy)").field_path(".podReplacementPolicy"),
    validation = Rule::new("!has(self.podFailurePolicy) || !has(self.template.spec) || !has(self.template.spec.restartPolicy) || self.template.spec.restartPolicy != 'OnFailure'").message("only \"Never\" is supported when podFailurePolicy is specified").field_path(".template.spec.restartPolicy"),
    validation = Rule::new("!has(self.podFailurePolicy) || size(self.podFailurePolicy.rules) <= 20").message("must have at most 20 items").field_path(".podFailurePolicy.rules"),
    // An immutable field: this rule refuses setting or clearing it, the field's own
    // `immutable()` a change. Each field a rule selects from the spec copies the schemas of all
    // the spec's fields, on every write of the object, status writes too.
    validation = Rule::new("has(self.podFailurePolicy) == has(oldSelf.podFailurePolicy)").message("field is immutable").field_path(".podFailurePolicy"),
    validation = Rule::new("has(self.successPolicy) == has(oldSelf.successPolicy)").message("field is immutable").field_path(".successPolicy"),
    validation = Rule::new("has(self.backoffLimitPerIndex) == has(oldSelf.backoffLimitPerIndex)").message("field is immutable").field_path(".backoffLimitPerIndex"),
    validation = Rule::new("has(self.managedBy) == has(oldSelf.managedBy)").message("field is immutable").field_path(".managedBy"),
    validation = Rule::new("has(self.selector) == has(oldSelf.selector)").message("field is immutable").field_path(".selector")
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
    /// `NonIndexed` (default) or `Indexed`. Immutable. A MusterJobSet's children default to
    /// `Indexed`, as JobSet's Jobs do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_mode: Option<CompletionMode>,
    /// Pod failures tolerated before the job fails (default 6; the largest int32 when
    /// `backoffLimitPerIndex` is set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub backoff_limit: Option<i32>,
    /// Indexed jobs: failures tolerated per index before that index is marked failed.
    /// Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    #[x_kube(validation = immutable())]
    pub backoff_limit_per_index: Option<i32>,
    /// With `backoffLimitPerIndex`: failed indexes tolerated before the job fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100_000))]
    pub max_failed_indexes: Option<i32>,
    /// How pod failures are handled beyond counting them (exit codes, pod conditions), as
    /// batch/v1 `podFailurePolicy`. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = immutable())]
    pub pod_failure_policy: Option<PodFailurePolicy>,
    /// Indexed jobs: when the job is declared succeeded before every index succeeds
    /// (batch/v1 `successPolicy`). Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = immutable())]
    pub success_policy: Option<JobSuccessPolicy>,
    /// When a replacement pod is created: `TerminatingOrFailed` or `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_replacement_policy: Option<PodReplacementPolicy>,
    /// The controller that reconciles the job: unset or `batch.muster.dev/job-controller` for
    /// muster; any other value leaves the job to that controller. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63), regex(pattern = MANAGED_BY_PATTERN))]
    #[x_kube(validation = immutable())]
    pub managed_by: Option<String>,
    /// The pods' selector, as batch/v1 allows it: generated unless `manualSelector` is true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = immutable())]
    pub selector: Option<LabelSelector>,
    /// True when `selector` is written by the user (batch/v1 `manualSelector`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manual_selector: Option<bool>,
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
    // Transition rules on the field itself: the API server evaluates them only when the old and
    // the new job both have `scheduling` (setting or clearing it is the spec's rule), and each
    // selects fields of `scheduling`, not of the spec: every field access of a rule copies the
    // schemas of all fields of the object it selects from (see docs/src/benchmarks.md, "What
    // one write costs").
    #[x_kube(
        validation = Rule::new("has(self.schedulingPolicy) == has(oldSelf.schedulingPolicy)").message(Message::Expression("has(self.schedulingPolicy) ? 'field cannot be set once created' : 'field cannot be cleared once set'".into())).field_path(".schedulingPolicy"),
        validation = Rule::new("!has(self.schedulingPolicy) || !has(oldSelf.schedulingPolicy) || has(self.schedulingPolicy.gang) == has(oldSelf.schedulingPolicy.gang)").message("field is immutable: the policy may not change between `basic` and `gang`; only gang.minCount may change").field_path(".schedulingPolicy"),
        validation = Rule::new("has(self.schedulingConstraints) == has(oldSelf.schedulingConstraints) && (!has(self.schedulingConstraints) || self.schedulingConstraints == oldSelf.schedulingConstraints)").message("field is immutable").field_path(".schedulingConstraints"),
        validation = Rule::new("has(self.disruptionMode) == has(oldSelf.disruptionMode) && (!has(self.disruptionMode) || self.disruptionMode == oldSelf.disruptionMode)").message("field is immutable").field_path(".disruptionMode"),
        validation = Rule::new("has(self.resourceClaims) == has(oldSelf.resourceClaims) && (!has(self.resourceClaims) || self.resourceClaims == oldSelf.resourceClaims)").message("field is immutable").field_path(".resourceClaims")
    )]
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

impl MusterJobSpec {
    /// `completionMode`, `NonIndexed` when unset.
    pub fn completion_mode(&self) -> CompletionMode {
        self.completion_mode.unwrap_or_default()
    }
    /// Whether the job is `Indexed`.
    pub fn indexed(&self) -> bool {
        self.completion_mode() == CompletionMode::Indexed
    }
    /// `backoffLimit` as batch/v1 defaults it: 6, or the largest int32 with
    /// `backoffLimitPerIndex`.
    pub fn backoff_limit(&self) -> i32 {
        self.backoff_limit.unwrap_or(if self.backoff_limit_per_index.is_some() {
            i32::MAX
        } else {
            DEFAULT_BACKOFF_LIMIT
        })
    }
    /// `podReplacementPolicy` as batch/v1 defaults it: `Failed` with a `podFailurePolicy`,
    /// else `TerminatingOrFailed`.
    pub fn pod_replacement_policy(&self) -> PodReplacementPolicy {
        self.pod_replacement_policy.unwrap_or(if self.pod_failure_policy.is_some() {
            PodReplacementPolicy::Failed
        } else {
            PodReplacementPolicy::TerminatingOrFailed
        })
    }
    /// Whether muster's job controller reconciles the job (`managedBy` unset or muster's).
    pub fn managed_by_muster(&self) -> bool {
        self.managed_by.as_deref().is_none_or(|m| m == JOB_CONTROLLER_NAME)
    }
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
    /// Pods terminating (being deleted, not yet in a terminal phase).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminating: Option<i32>,
    /// Indexes completed, for Indexed jobs (e.g. `0-2,5`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_indexes: Option<String>,
    /// Indexes failed, for jobs with `backoffLimitPerIndex` (e.g. `1,3-4`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_indexes: Option<String>,
    /// `FailureTarget`, `SuccessCriteriaMet`, `Complete`, `Failed`, `Suspended` with
    /// batch/v1's reasons; muster's `Invalid`, `ClaimsReady` and, in upstream mode, the
    /// conditions of the native PodGroup.
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
// batch/v1's rules that depend on the completion mode, for children that are Indexed unless
// the template says NonIndexed (as JobSet defaults its Jobs), with completions defaulting to
// parallelism.
#[x_kube(
    validation = Rule::new("!has(self.template.spec.backoffLimitPerIndex) || !has(self.template.spec.completionMode) || self.template.spec.completionMode == 'Indexed'").message("requires indexed completion mode").field_path(".template.spec.backoffLimitPerIndex"),
    validation = Rule::new("!has(self.template.spec.maxFailedIndexes) || !has(self.template.spec.completionMode) || self.template.spec.completionMode == 'Indexed'").message("requires indexed completion mode").field_path(".template.spec.maxFailedIndexes"),
    validation = Rule::new("!has(self.template.spec.successPolicy) || !has(self.template.spec.completionMode) || self.template.spec.completionMode == 'Indexed'").message("requires indexed completion mode").field_path(".template.spec.successPolicy"),
    validation = Rule::new("!has(self.template.spec.maxFailedIndexes) || (has(self.template.spec.completionMode) && self.template.spec.completionMode != 'Indexed') || (has(self.template.spec.completions) ? self.template.spec.maxFailedIndexes <= self.template.spec.completions : (has(self.template.spec.completionMode) || self.template.spec.maxFailedIndexes <= self.template.spec.parallelism))").message("must be less than or equal to completions").field_path(".template.spec.maxFailedIndexes")
)]
#[serde(rename_all = "camelCase")]
pub struct ReplicatedJob {
    /// Name (a DNS label), unique in the set; also the name of its PodGroupTemplate.
    #[schemars(length(min = 1, max = 63), regex(pattern = DNS_LABEL_PATTERN))]
    pub name: String,
    /// The group this replicatedJob belongs to (JobSet's `groupName`, default `default`):
    /// its children and their pods carry it with their index in the group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"))]
    pub group_name: Option<String>,
    /// How many child MusterJobs (each one PodGroup).
    #[serde(default = "one")]
    #[schemars(range(min = 0), extend("default" = 1))]
    pub replicas: i32,
    /// The child MusterJob.
    pub template: MusterJobTemplate,
    /// The earlier replicatedJob this one waits for (JobSet's `dependsOn`: at most one; not on
    /// the first replicatedJob). Immutable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("Value is immutable"))]
    pub depends_on: Vec<DependsOn>,
}

/// What a replicatedJob waits for in an earlier one.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum DependsOnStatus {
    /// Every child of the earlier replicatedJob is ready, succeeded or failed.
    Ready,
    /// Every child of the earlier replicatedJob succeeded.
    Complete,
}

/// A dependency on an earlier replicatedJob.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
pub struct DependsOn {
    /// Name of the earlier replicatedJob.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// `Ready` or `Complete`.
    pub status: DependsOnStatus,
}

/// The set's network: a headless Service giving its pods DNS names (JobSet's `network`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Network {
    /// Pods are reachable as `<set>-<rjob>-<i>-<index>.<subdomain>` (default true).
    #[serde(rename = "enableDNSHostnames", default, skip_serializing_if = "Option::is_none")]
    pub enable_dns_hostnames: Option<bool>,
    /// The headless Service's name (default: the set's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63), regex(pattern = r"^([a-z]([-a-z0-9]*[a-z0-9])?)?$"))]
    pub subdomain: Option<String>,
    /// Publish DNS records of pods before they are ready (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publish_not_ready_addresses: Option<bool>,
}

/// The order replicatedJobs start in.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum StartupPolicyOrder {
    /// All at once.
    #[default]
    AnyOrder,
    /// As listed: a replicatedJob is created once every child of the one before is ready.
    InOrder,
}

/// JobSet's `startupPolicy`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct StartupPolicy {
    /// `AnyOrder` or `InOrder`.
    pub startup_policy_order: StartupPolicyOrder,
}

/// The pod other pods reach first (JobSet's `coordinator`): its stable DNS name is written on
/// every child and pod as `jobset.sigs.k8s.io/coordinator`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Coordinator {
    /// The replicatedJob holding the coordinator.
    #[schemars(length(min = 1, max = 63))]
    pub replicated_job: String,
    /// The child's index in that replicatedJob.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub job_index: i32,
    /// The pod's completion index in that child.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub pod_index: i32,
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

/// How a set restarts.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RestartStrategy {
    /// Each child is recreated as soon as its previous one is gone.
    #[default]
    Recreate,
    /// Every child of the previous attempt (and its pods) is gone before any is recreated.
    BlockingRecreate,
}

/// What a failure rule does.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum FailurePolicyAction {
    /// Fail the set at once.
    FailJobSet,
    /// Recreate every child if `restartsCountTowardsMax < maxRestarts`, else fail the set.
    RestartJobSet,
    /// Recreate every child without counting toward `maxRestarts`.
    RestartJobSetAndIgnoreMaxRestarts,
}

/// A rule for a failed child: the first whose requirements all match decides.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailurePolicyRule {
    /// Name of the rule (`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`), unique in the policy.
    #[schemars(length(min = 1, max = 128), regex(pattern = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"))]
    pub name: String,
    /// What to do.
    pub action: FailurePolicyAction,
    /// The child's `Failed` reasons the rule matches (e.g. `PodFailurePolicy`,
    /// `BackoffLimitExceeded`); empty matches any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 16),
        inner(regex(
            pattern = r"^(BackoffLimitExceeded|DeadlineExceeded|FailedIndexes|MaxFailedIndexesExceeded|PodFailurePolicy)$"
        ))
    )]
    pub on_job_failure_reasons: Vec<String>,
    /// Regular expressions (RE2) one of which the child's `Failed` message must match; empty
    /// matches any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub on_job_failure_message_patterns: Vec<String>,
    /// replicatedJobs whose children the rule applies to; empty means all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub target_replicated_jobs: Vec<String>,
}

/// What happens when a child job fails (JobSet's `failurePolicy`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.rules) || self.rules.all(r, size(self.rules.filter(o, o.name == r.name)) == 1)").message("rule names are not unique").field_path(".rules")
)]
pub struct FailurePolicy {
    /// Restarts that count toward the limit before the set fails (default 0).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub max_restarts: i32,
    /// `Recreate` (default) or `BlockingRecreate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_strategy: Option<RestartStrategy>,
    /// Evaluated in order for a failed child; none matching means `RestartJobSet`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub rules: Vec<FailurePolicyRule>,
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
    validation = Rule::new("self.replicatedJobs.map(r, r.name) == oldSelf.replicatedJobs.map(r, r.name) && self.replicatedJobs.all(r, oldSelf.replicatedJobs.exists(o, o.name == r.name && o.replicas == r.replicas))").message("replicatedJobs may not be added, removed, renamed or resized").field_path(".replicatedJobs"),
    // JobSet's rules: startupPolicy InOrder and dependsOn exclude each other; the fields it
    // freezes.
    validation = Rule::new("!(has(self.startupPolicy) && self.startupPolicy.startupPolicyOrder == 'InOrder' && self.replicatedJobs.exists(x, has(x.dependsOn) && size(x.dependsOn) > 0))").message("StartupPolicy and DependsOn APIs are mutually exclusive"),
    validation = Rule::new("has(self.network) == has(oldSelf.network) && (!has(self.network) || self.network == oldSelf.network)").message("Value is immutable").field_path(".network"),
    validation = Rule::new("has(self.successPolicy) == has(oldSelf.successPolicy) && (!has(self.successPolicy) || self.successPolicy == oldSelf.successPolicy)").message("Value is immutable").field_path(".successPolicy"),
    validation = Rule::new("has(self.failurePolicy) == has(oldSelf.failurePolicy) && (!has(self.failurePolicy) || self.failurePolicy == oldSelf.failurePolicy)").message("Value is immutable").field_path(".failurePolicy"),
    validation = Rule::new("has(self.startupPolicy) == has(oldSelf.startupPolicy) && (!has(self.startupPolicy) || self.startupPolicy == oldSelf.startupPolicy)").message("Value is immutable").field_path(".startupPolicy"),
    validation = Rule::new("has(self.managedBy) == has(oldSelf.managedBy) && (!has(self.managedBy) || self.managedBy == oldSelf.managedBy)").message("field is immutable").field_path(".managedBy")
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
    /// The headless Service and pod DNS names (default: enabled, named after the set).
    /// Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<Network>,
    /// The order replicatedJobs start in. Immutable; not with `dependsOn`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_policy: Option<StartupPolicy>,
    /// The pod whose DNS name every child and pod is told.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coordinator: Option<Coordinator>,
    /// The controller that reconciles the set: unset or `batch.muster.dev/jobset-controller`
    /// for muster. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63), regex(pattern = MANAGED_BY_PATTERN))]
    pub managed_by: Option<String>,
    /// Seconds after the set finishes before it is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ttl_seconds_after_finished: Option<i32>,
}

impl MusterJobSetSpec {
    /// Whether muster's set controller reconciles the set (`managedBy` unset or muster's).
    pub fn managed_by_muster(&self) -> bool {
        self.managed_by.as_deref().is_none_or(|m| m == JOBSET_CONTROLLER_NAME)
    }
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
    /// The restarts that count toward `failurePolicy.maxRestarts` (not those of
    /// `RestartJobSetAndIgnoreMaxRestarts`).
    #[serde(default)]
    pub restarts_count_towards_max: i32,
    /// `Completed` or `Failed` once the set finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminal_state: Option<String>,
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

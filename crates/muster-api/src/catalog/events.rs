//! Every event reason muster publishes (`Context::event` in `src/controllers/context.rs`, the
//! one place muster publishes events; reporting controller `muster`).

/// The event's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum EventType {
    /// Something went as it should.
    Normal,
    /// Something needs a look.
    Warning,
    /// Either, depending on the change told (a mirrored condition).
    NormalOrWarning,
}

impl EventType {
    /// As the page shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
            EventType::NormalOrWarning => "Normal or Warning",
        }
    }
}

/// One event reason on one kind of object. A reason published on several objects or with
/// several actions has one entry each.
#[derive(Clone, Copy, Debug)]
pub struct EventEntry {
    /// The event's `reason`, exactly; for a dynamic entry, a description in angle brackets.
    pub reason: &'static str,
    /// Normal or Warning.
    pub type_: EventType,
    /// The object the event is on (`regarding`).
    pub on: &'static str,
    /// The event's `action`.
    pub action: &'static str,
    /// When it is published.
    pub when: &'static str,
    /// The reason is not a fixed string of muster's (copied from kube-scheduler, or built from
    /// a user's rule name): no source holds it, and the staleness check leaves it out.
    pub dynamic: bool,
}

const fn ev(
    reason: &'static str,
    type_: EventType,
    on: &'static str,
    action: &'static str,
    when: &'static str,
) -> EventEntry {
    EventEntry { reason, type_, on, action, when, dynamic: false }
}

const fn dynamic(
    reason: &'static str,
    type_: EventType,
    on: &'static str,
    action: &'static str,
    when: &'static str,
) -> EventEntry {
    EventEntry { reason, type_, on, action, when, dynamic: true }
}

use EventType::{Normal, NormalOrWarning, Warning};

/// The root group of a gang and its controller owner: admission publishes the same event on
/// both.
const ROOT: &str = "PodGroup or CompositePodGroup (the gang's root), and its MusterJob or MusterJobSet";
const JOB: &str = "MusterJob";
const SET: &str = "MusterJobSet";
const JOB_OR_SET: &str = "MusterJob, MusterJobSet";

/// Every event reason muster publishes. The page sorts them by reason, then object.
pub static EVENTS: &[EventEntry] = &[
    // The job controller.
    ev(
        "SuccessfulCreate",
        Normal,
        JOB,
        "CreatePods",
        "The job controller created gated pods in the job's PodGroup (the note names them).",
    ),
    ev(
        "FailedCreate",
        Warning,
        JOB,
        "CreatePods",
        "The API server refused or failed a pod the job controller created.",
    ),
    ev(
        "SuccessfulDelete",
        Normal,
        JOB,
        "DeletePods",
        "The job controller deleted pods (the note says why: a gang restart, a finished or suspended job, too many active pods).",
    ),
    ev(
        "SuccessfulCreate",
        Normal,
        JOB,
        "CreateClaims",
        "The job controller created the ResourceClaimTemplate for the job's `spec.gpuClaims`, or the ResourceClaims its PodGroup's pods share.",
    ),
    ev(
        "FailedCreate",
        Warning,
        JOB,
        "CreateClaims",
        "The API server refused or failed the job's GPU ResourceClaimTemplate.",
    ),
    ev(
        "ClaimNameConflict",
        Warning,
        JOB,
        "CreateClaims",
        "A ResourceClaim the PodGroup's pods share already exists and is not controlled by the PodGroup (condition `ClaimsReady` False).",
    ),
    ev(
        "ResourceClaimTemplateNotFound",
        Warning,
        JOB,
        "CreateClaims",
        "The ResourceClaimTemplate a `resourceClaims` entry names does not exist yet; the pods wait (condition `ClaimsReady` False).",
    ),
    ev(
        "ClaimNotCreated",
        Warning,
        JOB,
        "CreateClaims",
        "Creating a shared ResourceClaim failed (condition `ClaimsReady` False).",
    ),
    ev("Completed", Normal, JOB, "Finish", "The job completed (condition `Complete`)."),
    ev(
        "BackoffLimitExceeded",
        Warning,
        JOB,
        "Finish",
        "The job failed: more pods failed than `backoffLimit` allows (the reason of its `Failed` condition).",
    ),
    ev("DeadlineExceeded", Warning, JOB, "Finish", "The job failed: it ran longer than `activeDeadlineSeconds`."),
    ev(
        "MaxFailedIndexesExceeded",
        Warning,
        JOB,
        "Finish",
        "The job failed: more indexes failed than `maxFailedIndexes` allows.",
    ),
    ev(
        "FailedIndexes",
        Warning,
        JOB,
        "Finish",
        "The job failed: every index finished and some failed (`backoffLimitPerIndex`).",
    ),
    ev(
        "PodFailurePolicy",
        Warning,
        JOB,
        "Finish",
        "The job failed: a `podFailurePolicy` rule with action `FailJob` matched (the note names the pod).",
    ),
    ev(
        "Suspended",
        Normal,
        JOB,
        "Suspend",
        "The job was suspended (`spec.suspend: true`); its active pods are deleted.",
    ),
    ev("Resumed", Normal, JOB, "Suspend", "The job was resumed (`spec.suspend: false`)."),
    ev(
        "ServiceConflict",
        Warning,
        JOB_OR_SET,
        "ApplyService",
        "The headless Service giving the pods DNS names exists and is not muster's to change; the note says what is in the way.",
    ),
    ev(
        "SchedulingAPI",
        Normal,
        JOB_OR_SET,
        "Compile",
        "The controller recorded a scheduling API other than the one asked for (annotation `batch.muster.dev/scheduling-api`); the note says why.",
    ),
    ev(
        "NamespaceExcluded",
        Warning,
        JOB_OR_SET,
        "Validate",
        "The object is in a namespace muster's webhooks skip (muster's own, `kube-system`): it is not acted on (condition `Invalid`).",
    ),
    ev(
        "InvalidSpec",
        Warning,
        JOB_OR_SET,
        "Validate",
        "The spec fails muster's validation (it got past the webhook, or was made while the webhook was down).",
    ),
    ev(
        "PodLimitExceeded",
        Warning,
        JOB_OR_SET,
        "Validate",
        "The object asks for more pods than `--max-job-pods` allows.",
    ),
    ev(
        "DRANotServed",
        Warning,
        JOB,
        "Validate",
        "The job uses DRA (`spec.gpuClaims`, `resourceClaims`) and the API server does not serve `resource.k8s.io`.",
    ),
    ev(
        "SchedulingAPIChanged",
        Warning,
        JOB_OR_SET,
        "Validate",
        "`batch.muster.dev/scheduling-api` was changed after the groups were made in the other API; muster does not move an object between APIs.",
    ),
    ev(
        "UpstreamNotServed",
        Warning,
        JOB_OR_SET,
        "Validate",
        "Upstream mode, and the API server does not serve the `scheduling.k8s.io` kinds it needs (or muster does not watch them).",
    ),
    ev(
        "UpstreamDropsFields",
        Warning,
        JOB_OR_SET,
        "Validate",
        "Upstream mode, and the spec uses fields the `scheduling.k8s.io` kinds have no room for.",
    ),
    ev(
        "NameConflict",
        Warning,
        JOB_OR_SET,
        "Validate",
        "An object muster would make (Workload, PodGroup, CompositePodGroup, ResourceClaimTemplate) already exists and is not controlled by this object. Looked at again every 5 s for a minute, then every minute (an earlier object of the same name may still be going).",
    ),
    ev(
        "InvalidCompiledObject",
        Warning,
        JOB_OR_SET,
        "Validate",
        "A Workload, PodGroup or CompositePodGroup muster compiled for the object fails muster's own check of its writes (the webhook skips muster's requests, and the groups' CRDs carry no rules); nothing is written.",
    ),
    ev(
        "FrozenFieldChanged",
        Warning,
        JOB,
        "Validate",
        "A field frozen after creation changed (it got past the webhook).",
    ),
    ev(
        "NotInSet",
        Warning,
        JOB,
        "Validate",
        "The job names a parent CompositePodGroup (`scheduling.muster.dev/parent-composite-podgroup`) not controlled by the MusterJobSet that controls the job.",
    ),
    ev(
        "GpuClaimTemplateMismatch",
        Warning,
        JOB,
        "Validate",
        "The job's GPU ResourceClaimTemplate does not match `spec.gpuClaims` and the GPU limits; muster does not change it and creates no pods.",
    ),
    dynamic(
        "<kube-scheduler's reason>",
        NormalOrWarning,
        JOB,
        "Schedule",
        "Upstream mode: a condition kube-scheduler keeps on the job's `scheduling.k8s.io` PodGroup (`PodGroupInitiallyScheduled`, `DisruptionTarget`) changed status or reason. The event carries that condition's own reason; Warning when the group is not scheduled or is disrupted.",
    ),
    ev(
        "DecodeFailed",
        Warning,
        "any object muster watches",
        "Decode",
        "An object does not decode as its kind's schema; muster leaves it alone.",
    ),
    // The jobset controller: every change of a condition the set logic keeps is an event.
    ev(
        "SuccessfulCreate",
        Normal,
        SET,
        "CreateJobs",
        "The jobset controller created child MusterJobs (the note names them).",
    ),
    ev("AllJobsCompleted", Normal, SET, "Sync", "The success policy is met (condition `Completed`)."),
    ev("JobSetCompleted", Normal, SET, "Sync", "`RestartingJobSet` turned False because the set completed."),
    ev("FailedJobs", Warning, SET, "Sync", "A child failed and the set has no failure policy: the set failed."),
    ev(
        "ReachedMaxRestarts",
        Warning,
        SET,
        "Sync",
        "A child failed and the restarts reached `maxRestarts`: the set failed.",
    ),
    ev(
        "FailJobSetFailurePolicyAction",
        Warning,
        SET,
        "Sync",
        "A failure policy rule with action `FailJobSet` matched: the set failed.",
    ),
    ev("JobSetFailed", Normal, SET, "Sync", "`RestartingJobSet` turned False because the set failed."),
    ev(
        "RestartJobSetFailurePolicyAction",
        Warning,
        SET,
        "Sync",
        "The failure policy restarts the set (action `RestartJobSet`, counted toward `maxRestarts`).",
    ),
    ev(
        "RestartJobSetAndIgnoreMaxRestartsFailurePolicyAction",
        Warning,
        SET,
        "Sync",
        "The failure policy restarts the set without counting toward `maxRestarts`.",
    ),
    ev(
        "DefaultFailurePolicy",
        Warning,
        SET,
        "Sync",
        "`RestartingJobSet` True: a restart no failure policy rule matched.",
    ),
    dynamic(
        "FailurePolicy_<rule>",
        Warning,
        SET,
        "Sync",
        "`RestartingJobSet` True: a restart by the failure policy rule named `<rule>`.",
    ),
    ev("JobsReady", Normal, SET, "Sync", "`RestartingJobSet` turned False: every child of the restarted set is ready."),
    ev("SuspendedJobs", Normal, SET, "Sync", "The set was suspended (condition `Suspended` True)."),
    ev("JobSetSuspended", Normal, SET, "Sync", "`RestartingJobSet` turned False because the set is suspended."),
    ev("ResumeJobs", Normal, SET, "Sync", "The set was resumed (condition `Suspended` False)."),
    ev(
        "InOrderStartupPolicyInProgress",
        Normal,
        SET,
        "Sync",
        "`startupPolicy: InOrder` is starting replicatedJobs one after another.",
    ),
    ev(
        "InOrderStartupPolicyCompleted",
        Normal,
        SET,
        "Sync",
        "`startupPolicy: InOrder` has started every replicatedJob.",
    ),
    dynamic(
        "<kube-scheduler's reason>",
        NormalOrWarning,
        SET,
        "Schedule",
        "Upstream mode: the set's `scheduling.k8s.io` CompositePodGroup (`CompositePodGroupInitiallyScheduled`, `DisruptionTarget`, from the group or its child PodGroups) changed status or reason. The event carries that condition's own reason; Warning when not scheduled.",
    ),
    // Admission.
    ev(
        "Admitted",
        Normal,
        ROOT,
        "Admit",
        "Admission pinned and ungated the gang's pods in one decision (the note gives the count and the nodes).",
    ),
    ev(
        "Unschedulable",
        Warning,
        ROOT,
        "Admit",
        "The gang does not fit now, or only part of its gated pods do; published once per distinct message. `kubectl muster why` explains it.",
    ),
    ev(
        "BindFailed",
        Warning,
        ROOT,
        "Admit",
        "A pin failed (a pinned pod could not be bound) with fewer than the quorum of the attempt running: the attempt is rolled back, its pods deleted and made again gated.",
    ),
    ev("BindTimeout", Warning, ROOT, "Admit", "A pinned pod of a gang that had started was not bound in time."),
    ev(
        "GangDisrupted",
        Warning,
        ROOT,
        "Admit",
        "A gang lost pods it needs after it started: its pods are deleted so it restarts whole.",
    ),
    ev(
        "AdmissionError",
        Warning,
        ROOT,
        "Admit",
        "Admission met an API error on the gang (a refused or failed write); it backs the gang off alone and retries. Once per distinct error.",
    ),
    ev("StatusWriteFailed", Warning, ROOT, "Admit", "Admission could not write the group's status."),
    ev(
        "NamespaceExcluded",
        Warning,
        ROOT,
        "Admit",
        "The group is in a namespace muster's webhooks skip: it is not admitted.",
    ),
    ev(
        "Preempting",
        Normal,
        ROOT,
        "Admit",
        "Admission evicts lower-priority pods to make room for the gang (the note names the victim groups and nodes).",
    ),
    ev(
        "Preempted",
        Warning,
        ROOT,
        "Admit",
        "The gang's pods are evicted to make room for a gang of higher priority (published on the victim).",
    ),
    ev("RollbackFailed", Warning, "Pod", "Admit", "Admission could not delete a pod of a rolled-back attempt."),
    ev(
        "PodTooLarge",
        Warning,
        "Pod",
        "Admit",
        "The pod is too large for admission to keep in memory; it keeps a minimal record, and a gated pod so kept is never placed.",
    ),
    ev(
        "GPUProblems",
        Warning,
        "Node",
        "Schedule",
        "The node's GPU topology or metrics are missing or unreadable (the note lists the problems).",
    ),
    ev("GPUProblemsCleared", Normal, "Node", "Schedule", "The node's GPU topology and metrics are usable again."),
    // The GPU device pass.
    ev(
        "GPUsAssigned",
        Normal,
        "Pod",
        "AssignGPUs",
        "muster wrote the pod's `gpu.muster.dev/indices` (chosen by muster, or as kubelet or the pod's claims gave them).",
    ),
    ev(
        "GPUIndicesCorrected",
        Normal,
        "Pod",
        "AssignGPUs",
        "kubelet gave the pod other GPUs than muster planned: `gpu.muster.dev/indices` now says what its containers hold.",
    ),
    ev(
        "GPUIndicesNotWritten",
        Warning,
        "Pod",
        "AssignGPUs",
        "Writing the pod's `gpu.muster.dev/indices` failed; muster keeps the GPUs held for the pod and retries.",
    ),
    ev(
        "GPUConflict",
        Warning,
        "Pod",
        "AssignGPUs",
        "Two pods hold the same GPU, or no free GPUs are left on the node for the pod.",
    ),
    ev(
        "GPUIndicesBeyondNode",
        Warning,
        "Pod",
        "AssignGPUs",
        "The pod's `gpu.muster.dev/indices` name GPUs its node does not have.",
    ),
    ev(
        "BadGPUIndices",
        Warning,
        "Pod",
        "AssignGPUs",
        "The pod's `gpu.muster.dev/indices` do not parse, or the pod has indices and no node.",
    ),
    ev(
        "UnknownGPUDevice",
        Warning,
        "Pod",
        "AssignGPUs",
        "kubelet gave the pod a GPU device the node's topology does not know; its indices are not corrected.",
    ),
    ev(
        "UntrustedGPUIndices",
        Warning,
        "Pod",
        "AssignGPUs",
        "The pod's `gpu.muster.dev/indices` were written by someone other than muster or its node and nothing vouches for them; the ledger does not take them.",
    ),
];

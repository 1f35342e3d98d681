//! Every status condition muster sets on its kinds (and on the pods it preempts), with the
//! reasons each can carry.

/// The condition status a reason comes with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    /// `True`.
    True,
    /// `False`.
    False,
    /// Either (a mirrored condition carries whatever its source says).
    Either,
}

impl Status {
    /// As the page shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Either => "True or False",
        }
    }
}

/// One reason a condition can carry.
#[derive(Clone, Copy, Debug)]
pub struct ReasonEntry {
    /// The condition's `reason`, exactly; for a dynamic entry, a description in angle brackets
    /// or a pattern such as `FailurePolicy_<rule>`.
    pub reason: &'static str,
    /// The status it comes with.
    pub status: Status,
    /// What it means.
    pub meaning: &'static str,
    /// Not a fixed string of muster's (kube-scheduler's own reasons, a user's rule name): no
    /// source holds it, and the staleness check leaves it out.
    pub dynamic: bool,
}

/// One condition type on one kind.
#[derive(Clone, Copy, Debug)]
pub struct ConditionEntry {
    /// The kind that carries it in `status.conditions`.
    pub kind: &'static str,
    /// The condition's `type`.
    pub type_: &'static str,
    /// What it says.
    pub meaning: &'static str,
    /// The reasons it can carry.
    pub reasons: &'static [ReasonEntry],
}

const fn r(reason: &'static str, status: Status, meaning: &'static str) -> ReasonEntry {
    ReasonEntry { reason, status, meaning, dynamic: false }
}

const fn dynamic(reason: &'static str, status: Status, meaning: &'static str) -> ReasonEntry {
    ReasonEntry { reason, status, meaning, dynamic: true }
}

const fn c(
    kind: &'static str,
    type_: &'static str,
    meaning: &'static str,
    reasons: &'static [ReasonEntry],
) -> ConditionEntry {
    ConditionEntry { kind, type_, meaning, reasons }
}

use Status::{Either, False, True};

/// The failure reasons of a MusterJob, batch/v1's.
const JOB_FAILURES: &[ReasonEntry] = &[
    r("BackoffLimitExceeded", True, "More pods failed than `backoffLimit` allows."),
    r("DeadlineExceeded", True, "The job ran longer than `activeDeadlineSeconds`."),
    r("MaxFailedIndexesExceeded", True, "More indexes failed than `maxFailedIndexes` allows."),
    r("FailedIndexes", True, "Every index finished and some failed (`backoffLimitPerIndex`)."),
    r("PodFailurePolicy", True, "A `podFailurePolicy` rule with action `FailJob` matched (the message names the pod)."),
];

/// The success reasons of a MusterJob, batch/v1's.
const JOB_SUCCESSES: &[ReasonEntry] = &[
    r("CompletionsReached", True, "`completions` pods (or indexes) succeeded."),
    r("SuccessPolicy", True, "A `successPolicy` rule matched (the message names it)."),
];

/// The reasons of `Invalid` shared by MusterJob and MusterJobSet.
const INVALID_COMMON: [ReasonEntry; 9] = [
    r("Valid", False, "The spec is valid and acted on."),
    r("NamespaceExcluded", True, "The object is in a namespace muster's webhooks skip (muster's own, `kube-system`)."),
    r(
        "InvalidSpec",
        True,
        "The spec fails muster's validation (it got past the webhook, or was made while it was down).",
    ),
    r("PodLimitExceeded", True, "The object asks for more pods than `--max-job-pods` allows."),
    r(
        "SchedulingAPIChanged",
        True,
        "`batch.muster.dev/scheduling-api` changed after the groups were made in the other API.",
    ),
    r(
        "UpstreamNotServed",
        True,
        "Upstream mode, and the API server does not serve (or muster does not watch) the `scheduling.k8s.io` kinds it needs.",
    ),
    r(
        "UpstreamDropsFields",
        True,
        "Upstream mode, and the spec uses fields the `scheduling.k8s.io` kinds have no room for.",
    ),
    r(
        "NameConflict",
        True,
        "An object muster would make already exists and is not controlled by this object. Looked at again every 5 s for a minute, then every minute (an earlier object of the same name may still be going).",
    ),
    r(
        "InvalidCompiledObject",
        True,
        "A Workload, PodGroup or CompositePodGroup muster compiled for the object fails muster's own check of its writes (the webhook skips muster's requests, and the groups' CRDs carry no rules); nothing is written.",
    ),
];

const JOB_INVALID: &[ReasonEntry] = &[
    INVALID_COMMON[0],
    INVALID_COMMON[1],
    INVALID_COMMON[2],
    INVALID_COMMON[3],
    r("DRANotServed", True, "The job uses DRA and the API server does not serve `resource.k8s.io`."),
    INVALID_COMMON[4],
    INVALID_COMMON[5],
    INVALID_COMMON[6],
    INVALID_COMMON[7],
    INVALID_COMMON[8],
    r("FrozenFieldChanged", True, "A field frozen after creation changed (it got past the webhook)."),
    r(
        "NotInSet",
        True,
        "The parent CompositePodGroup the job names is not controlled by the MusterJobSet that controls the job.",
    ),
    r(
        "GpuClaimTemplateMismatch",
        True,
        "The job's GPU ResourceClaimTemplate does not match `spec.gpuClaims` and the GPU limits; no pods are made.",
    ),
];

/// The reasons of `Admitted`, `BindFailed` and `AdmissionError`, on both group kinds.
const ADMITTED: &[ReasonEntry] = &[
    r("Admitted", True, "Admission pinned and ungated the gang's pods in one decision."),
    r(
        "PartlyAdmitted",
        True,
        "The gang was admitted; some gated pods of it (beyond its quorum) do not fit now and wait.",
    ),
    r("Unschedulable", False, "The gang does not fit now (the message says why; `kubectl muster why` explains)."),
    r("WaitingForQuorum", False, "Fewer pods than the gang's quorum exist yet."),
    r("BindTimeout", False, "A pinned pod of the started gang was not bound in time."),
    r("BindFailed", False, "A pin failed before the gang started; the attempt was rolled back."),
    r("NamespaceExcluded", False, "The group is in a namespace muster's webhooks skip; it is never admitted."),
];
const BIND_FAILED: &[ReasonEntry] = &[
    r("Bound", False, "The last admitted attempt had no pin fail."),
    r("BindTimeout", True, "A pinned pod of the started gang was not bound in time."),
    r("BindFailed", True, "A pin failed before the gang started; the attempt was rolled back."),
];
const ADMISSION_ERROR: &[ReasonEntry] = &[
    r("APIError", True, "The last attempt met an API error (the message); the gang is backed off alone and retried."),
    r("Recovered", False, "An attempt went through after an error."),
];
const INITIALLY_SCHEDULED: &[ReasonEntry] = &[
    r("Scheduled", True, "The quorum was bound to nodes once; the condition stays True after."),
    r("Unschedulable", False, "Not bound yet, and the gang does not fit now."),
    r("Pending", False, "Not bound yet."),
];
const MIRRORED: &[ReasonEntry] = &[dynamic(
    "<kube-scheduler's reason>",
    Either,
    "Copied as kube-scheduler wrote it on the `scheduling.k8s.io` group (or, for `DisruptionTarget`, on a preempted pod).",
)];

/// Every condition muster sets, by kind. The page keeps this order of kinds and sorts the
/// types of a kind.
pub static CONDITIONS: &[ConditionEntry] = &[
    // MusterJob: batch/v1's conditions, and muster's own.
    c("MusterJob", "Complete", "The job succeeded and its last pods are gone.", JOB_SUCCESSES),
    c(
        "MusterJob",
        "SuccessCriteriaMet",
        "The job will complete once its pods are gone (same reason and message as `Complete`).",
        JOB_SUCCESSES,
    ),
    c("MusterJob", "Failed", "The job failed and its last pods are gone.", JOB_FAILURES),
    c(
        "MusterJob",
        "FailureTarget",
        "The job will fail once its pods are gone (same reason and message as `Failed`).",
        JOB_FAILURES,
    ),
    c(
        "MusterJob",
        "Suspended",
        "`spec.suspend` is true.",
        &[
            r("JobSuspended", True, "The job is suspended; its active pods are deleted."),
            r("JobResumed", False, "The job was resumed."),
        ],
    ),
    c(
        "MusterJob",
        "Invalid",
        "muster does not act on the job. Always present once the job was looked at.",
        JOB_INVALID,
    ),
    c(
        "MusterJob",
        "ClaimsReady",
        "The ResourceClaims the job's pods share (its PodGroup's `resourceClaims`) exist. Only on jobs with claims (`resourceClaims` or `spec.gpuClaims`).",
        &[
            r("ClaimsCreated", True, "Every claim exists."),
            r("ClaimNameConflict", False, "A claim's name is taken by one the PodGroup does not control."),
            r(
                "ResourceClaimTemplateNotFound",
                False,
                "The ResourceClaimTemplate an entry names does not exist yet; the pods wait.",
            ),
            r("ClaimNotCreated", False, "Creating a claim failed (the message has the error)."),
        ],
    ),
    c(
        "MusterJob",
        "PodGroupInitiallyScheduled",
        "Upstream mode: copied from the job's `scheduling.k8s.io` PodGroup, where kube-scheduler keeps it.",
        MIRRORED,
    ),
    c(
        "MusterJob",
        "DisruptionTarget",
        "Upstream mode: copied from the job's `scheduling.k8s.io` PodGroup, or from the first of its pods kube-scheduler preempts.",
        MIRRORED,
    ),
    // MusterJobSet: JobSet's conditions, and muster's own.
    c(
        "MusterJobSet",
        "Completed",
        "The success policy is met.",
        &[r("AllJobsCompleted", True, "The success policy is met.")],
    ),
    c(
        "MusterJobSet",
        "Failed",
        "The set failed.",
        &[
            r("FailedJobs", True, "A child failed and the set has no failure policy."),
            r("ReachedMaxRestarts", True, "A child failed and the restarts counted reached `maxRestarts`."),
            r("FailJobSetFailurePolicyAction", True, "A failure policy rule with action `FailJobSet` matched."),
        ],
    ),
    c(
        "MusterJobSet",
        "Suspended",
        "`spec.suspend` is true.",
        &[
            r("SuspendedJobs", True, "The set and its unfinished children are suspended."),
            r("ResumeJobs", False, "The set was resumed."),
        ],
    ),
    c(
        "MusterJobSet",
        "RestartingJobSet",
        "The failure policy restarted the set; False again once every child is ready, or the set finished or is suspended.",
        &[
            r("DefaultFailurePolicy", True, "A restart no failure policy rule matched."),
            dynamic("FailurePolicy_<rule>", True, "A restart by the failure policy rule named `<rule>`."),
            r("JobsReady", False, "Every child of the restarted set is ready."),
            r("JobSetFailed", False, "The set failed."),
            r("JobSetCompleted", False, "The set completed."),
            r("JobSetSuspended", False, "The set is suspended."),
        ],
    ),
    c(
        "MusterJobSet",
        "StartupPolicyInProgress",
        "`startupPolicy: InOrder` is creating (or resuming) replicatedJobs one after another. Turns False when `StartupPolicyCompleted` turns True.",
        &[r("InOrderStartupPolicyInProgress", True, "A replicatedJob is being started; the next waits for it.")],
    ),
    c(
        "MusterJobSet",
        "StartupPolicyCompleted",
        "`startupPolicy: InOrder` has every replicatedJob started.",
        &[r("InOrderStartupPolicyCompleted", True, "Every replicatedJob is started.")],
    ),
    c(
        "MusterJobSet",
        "Invalid",
        "muster does not act on the set. Always present once the set was looked at.",
        &INVALID_COMMON,
    ),
    c(
        "MusterJobSet",
        "CompositePodGroupInitiallyScheduled",
        "Upstream mode: whether kube-scheduler placed the set's `scheduling.k8s.io` CompositePodGroup (its own condition, or what its child PodGroups say, named in the message).",
        MIRRORED,
    ),
    c(
        "MusterJobSet",
        "DisruptionTarget",
        "Upstream mode: kube-scheduler disrupts the set's groups (from the CompositePodGroup or a child PodGroup).",
        MIRRORED,
    ),
    // PodGroup: written by admission.
    c("PodGroup", "Admitted", "The gang was admitted: pinned and ungated in one decision.", ADMITTED),
    c("PodGroup", "BindFailed", "A committed pod was not bound.", BIND_FAILED),
    c(
        "PodGroup",
        "AdmissionError",
        "The last attempt on the gang's root met an API error. Absent on a group that never had one.",
        ADMISSION_ERROR,
    ),
    c(
        "PodGroup",
        "AllOrNothing",
        "Whether placement models every rule of the group's pods, so an all-or-nothing start is guaranteed.",
        &[
            r("Modelled", True, "Placement models every rule of these pods."),
            r("NotModelled", False, "The pods use fields placement does not model (the message names each)."),
        ],
    ),
    c(
        "PodGroup",
        "PodGroupInitiallyScheduled",
        "The group reached its quorum of bound pods once (as upstream's condition of that name).",
        INITIALLY_SCHEDULED,
    ),
    // CompositePodGroup: written by admission.
    c("CompositePodGroup", "Admitted", "The gang was admitted: pinned and ungated in one decision.", ADMITTED),
    c("CompositePodGroup", "BindFailed", "A committed pod was not bound.", BIND_FAILED),
    c(
        "CompositePodGroup",
        "AdmissionError",
        "The last attempt on the gang's root met an API error. Absent on a group that never had one.",
        ADMISSION_ERROR,
    ),
    c(
        "CompositePodGroup",
        "CompositePodGroupInitiallyScheduled",
        "`minGroupCount` child groups were scheduled once (as upstream's condition of that name).",
        INITIALLY_SCHEDULED,
    ),
    // Pods muster preempts.
    c(
        "Pod",
        "DisruptionTarget",
        "Set by admission on each pod it evicts to make room for a gang of higher priority, as kube-scheduler does on its victims.",
        &[r(
            "PreemptionByMuster",
            True,
            "muster preempted the pod (the message names the preemptor and its priority).",
        )],
    ),
];

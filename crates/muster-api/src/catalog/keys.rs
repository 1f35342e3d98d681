//! Every label, annotation, scheduling gate and finalizer muster writes or reads.

use crate::{
    ADMISSION_ATTEMPT_ANNOTATION, ADMISSION_GATE, COMPLETION_INDEX_ANNOTATION, CRD_VERSION_ANNOTATION,
    GPU_ASSIGNED_ANNOTATION, GPU_HEALTH_ANNOTATION, GPU_INDICES_ANNOTATION, GPU_TOPOLOGY_ANNOTATION,
    GROUP_CLAIM_ANNOTATION, GROUP_TEMPLATE_ANNOTATION, HOSTNAME_LABEL, JOB_NAME_LABEL, JOBSET_NAME_LABEL,
    PARENT_COMPOSITE_ANNOTATION, POD_GROUP_LABEL, REPLICATED_JOB_LABEL, ROLLED_BACK_ANNOTATION,
    SCHEDULING_API_ANNOTATION,
};

/// What a key is in an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum KeyKind {
    /// `metadata.labels`.
    Label,
    /// `metadata.annotations`.
    Annotation,
    /// Both, with the same value (batch/v1 does this with the completion index).
    LabelAndAnnotation,
    /// `spec.schedulingGates[].name` of a pod.
    SchedulingGate,
    /// `metadata.finalizers`.
    Finalizer,
}

impl KeyKind {
    /// As the page shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyKind::Label => "label",
            KeyKind::Annotation => "annotation",
            KeyKind::LabelAndAnnotation => "label and annotation",
            KeyKind::SchedulingGate => "scheduling gate",
            KeyKind::Finalizer => "finalizer",
        }
    }
}

/// Whose key it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Origin {
    /// muster's own (`*.muster.dev/*`).
    Muster,
    /// Kubernetes' (`kubernetes.io/*`, `*.kubernetes.io/*`, batch/v1's job labels).
    Kubernetes,
    /// JobSet's (`jobset.sigs.k8s.io/*`), which muster writes as JobSet does.
    JobSet,
    /// Written only by the test tools (`muster dev ...`) on the clusters they make.
    DevTools,
}

/// One key.
#[derive(Clone, Copy, Debug)]
pub struct KeyEntry {
    /// The key, exactly as written on objects.
    pub key: &'static str,
    /// Label, annotation, gate or finalizer.
    pub kind: KeyKind,
    /// Whose key it is.
    pub origin: Origin,
    /// The objects that carry it.
    pub on: &'static str,
    /// Who writes it.
    pub written_by: &'static str,
    /// Who reads it, and what for.
    pub read_by: &'static str,
    /// What it means, in a sentence or two.
    pub meaning: &'static str,
}

const fn key(
    key: &'static str,
    kind: KeyKind,
    origin: Origin,
    on: &'static str,
    written_by: &'static str,
    read_by: &'static str,
    meaning: &'static str,
) -> KeyEntry {
    KeyEntry { key, kind, origin, on, written_by, read_by, meaning }
}

use KeyKind::{Annotation, Finalizer, Label, LabelAndAnnotation, SchedulingGate};
use Origin::{DevTools, JobSet, Kubernetes, Muster};

/// Every label, annotation, scheduling gate and finalizer muster writes or reads, muster's own
/// first, then those of Kubernetes and JobSet, then the test tools'. The page sorts each group
/// by key.
pub static KEYS: &[KeyEntry] = &[
    // muster's own keys on pods.
    key(
        POD_GROUP_LABEL,
        Label,
        Muster,
        "Pod",
        "the job controller on the pods of a MusterJob; the user on any other pod (a StatefulSet's, for example), at creation",
        "the webhook (adds the admission gate); admission (the pod's gang)",
        "The PodGroup, in the pod's namespace, the pod belongs to (value: the PodGroup's name). The chart's tenant policy refuses adding, changing or removing it after the pod is created.",
    ),
    key(
        ADMISSION_GATE,
        SchedulingGate,
        Muster,
        "Pod",
        "the job controller on the pods it creates; the webhook on any pod created with the pod-group label",
        "admission, which alone removes it",
        "Holds the pod back from kube-scheduler until its whole gang is admitted: admission pins every pod of the gang to a node and removes the gate in one decision.",
    ),
    key(
        GPU_INDICES_ANNOTATION,
        Annotation,
        Muster,
        "Pod",
        "muster (admission and the GPU device pass)",
        "muster's GPU ledger; the pod's containers through the `MUSTER_GPU_INDICES` environment variable",
        "The GPU indices on its node the pod holds, ascending, comma separated (`0,1,4,5`). Corrected to what kubelet gave when the node agent reports otherwise.",
    ),
    key(
        ADMISSION_ATTEMPT_ANNOTATION,
        Annotation,
        Muster,
        "Pod (of a MusterJob)",
        "the job controller, when it creates the pod",
        "admission (rollback of a failed attempt)",
        "The admission attempt of the pod's root gang it was created in (the root's `status.rollbacks` then). A failed pin rolls the attempt back: its pods are deleted and made again, gated, with the next number.",
    ),
    key(
        ROLLED_BACK_ANNOTATION,
        Annotation,
        Muster,
        "Pod",
        "admission, just before it deletes a pod of a rolled-back attempt",
        "the job controller and the group status (the pod's end counts as nothing)",
        "The id of the admission plan that was rolled back. The pod's end is not a failure and never counts toward `backoffLimit`.",
    ),
    key(
        COMPLETION_INDEX_ANNOTATION,
        LabelAndAnnotation,
        Muster,
        "Pod (of an Indexed MusterJob)",
        "the job controller",
        "the job controller; the pod's containers through `JOB_COMPLETION_INDEX`; selectors",
        "The pod's completion index, as batch/v1's `batch.kubernetes.io/job-completion-index`.",
    ),
    key(
        JOB_NAME_LABEL,
        Label,
        Muster,
        "Pod; the headless Service of an Indexed MusterJob (selector)",
        "the job controller",
        "the job controller (its pods); the Service",
        "The name of the MusterJob that owns the pod.",
    ),
    key(
        "batch.muster.dev/gang-attempt",
        Annotation,
        Muster,
        "Pod (of a MusterJob)",
        "the job controller, when it creates the pod",
        "the job controller",
        "The gang attempt the pod belongs to: with disruption mode `all`, a pod failure restarts every pod of its attempt and the next pods get the next number. Not `scheduling.muster.dev/gang-attempt`, which numbers admission rollbacks.",
    ),
    key(
        "batch.muster.dev/gang-restarted",
        Annotation,
        Muster,
        "Pod (of a MusterJob)",
        "the job controller (value `true`), before it deletes the pod",
        "the job controller",
        "muster deleted the pod because another pod of its gang attempt failed (disruption mode `all`): the pod did not fail and counts toward no limit.",
    ),
    key(
        "batch.muster.dev/job-index-failure-count",
        Annotation,
        Muster,
        "Pod (of an Indexed MusterJob with `backoffLimitPerIndex`)",
        "the job controller, when it creates the pod",
        "the job controller",
        "Failures of the pod's index counted before the pod was made, as batch/v1's `batch.kubernetes.io/job-index-failure-count`.",
    ),
    key(
        "batch.muster.dev/job-index-ignored-failure-count",
        Annotation,
        Muster,
        "Pod (of an Indexed MusterJob with `backoffLimitPerIndex`)",
        "the job controller, when it creates the pod",
        "the job controller",
        "Failures of the pod's index that a `podFailurePolicy` rule with action `Ignore` left uncounted.",
    ),
    key(
        "batch.muster.dev/job-tracking",
        Finalizer,
        Muster,
        "Pod (of a MusterJob)",
        "the job controller adds it when it creates the pod and removes it",
        "the job controller",
        "The pod's end is not yet counted in its job's status (batch/v1's `batch.kubernetes.io/job-tracking`). Removed once the status counts the pod, or the job is finished or gone.",
    ),
    // muster's own keys on jobs and sets.
    key(
        SCHEDULING_API_ANNOTATION,
        Annotation,
        Muster,
        "MusterJob, MusterJobSet",
        "muster's mutating webhook at creation where `--scheduling-api` is `muster`, else the job and jobset controllers on the first sync; the user, at creation, to choose",
        "the job and jobset controllers",
        "The scheduling API the object's groups are compiled to: `muster` or `upstream` (kube-scheduler's `scheduling.k8s.io`). Recorded once and never changed: the object keeps the API it started with whatever `--scheduling-api` says later.",
    ),
    key(
        JOBSET_NAME_LABEL,
        Label,
        Muster,
        "child MusterJob of a MusterJobSet, and its pods; the set's headless Service (selector)",
        "the jobset controller (child), the job controller (pods)",
        "the jobset controller (lists its children); the Service",
        "The name of the MusterJobSet that owns the child MusterJob.",
    ),
    key(
        REPLICATED_JOB_LABEL,
        Label,
        Muster,
        "child MusterJob of a MusterJobSet, and its pods",
        "the jobset controller (child), the job controller (pods)",
        "the jobset controller",
        "The replicatedJob of the set the child MusterJob was made from.",
    ),
    key(
        "batch.muster.dev/restart-attempt",
        Annotation,
        Muster,
        "child MusterJob of a MusterJobSet",
        "the jobset controller, when it creates the child",
        "the jobset controller (children of an older attempt are deleted)",
        "The set's `status.restarts` when the child was made.",
    ),
    key(
        GROUP_TEMPLATE_ANNOTATION,
        Annotation,
        Muster,
        "child MusterJob of a MusterJobSet with `spec.scheduling`",
        "the jobset controller",
        "the job controller",
        "The PodGroupTemplate of the set's Workload the child's PodGroup is built from.",
    ),
    key(
        PARENT_COMPOSITE_ANNOTATION,
        Annotation,
        Muster,
        "child MusterJob of a MusterJobSet with `spec.scheduling`",
        "the jobset controller",
        "the job controller",
        "The CompositePodGroup the child's PodGroup belongs to; it must be controlled by the set that controls the child.",
    ),
    // muster's own keys on the objects its controllers make.
    key(
        "batch.muster.dev/applied",
        Annotation,
        Muster,
        "Workload, PodGroup, CompositePodGroup (muster's and `scheduling.k8s.io`'s) made by the job and jobset controllers",
        "the job and jobset controllers",
        "the job and jobset controllers",
        "A hash of what was applied last: an object whose hash matches is not applied again.",
    ),
    key(
        "batch.muster.dev/frozen-fields",
        Annotation,
        Muster,
        "PodGroup made by the job controller",
        "the job controller",
        "the job controller",
        "Hashes of the job fields frozen after creation (`part=hash` pairs), so a change that got past the webhook makes the job `Invalid` (`FrozenFieldChanged`).",
    ),
    key(
        GROUP_CLAIM_ANNOTATION,
        Annotation,
        Muster,
        "ResourceClaim shared by a PodGroup's pods",
        "the job controller, when it creates the claim",
        "the job controller",
        "The entry of the PodGroup's `spec.resourceClaims` the claim was made for. The claim is owned by the PodGroup and shared by all its pods.",
    ),
    // muster's own keys on nodes.
    key(
        GPU_TOPOLOGY_ANNOTATION,
        Annotation,
        Muster,
        "Node",
        "`muster node-agent` (its own node only); a cluster admin, by hand",
        "admission (GPU placement and links)",
        "The node's GPUs (index, UUID, NUMA node, memory) and the links between them, as JSON. Without it every link is taken as `SYS`.",
    ),
    key(
        GPU_ASSIGNED_ANNOTATION,
        Annotation,
        Muster,
        "Node",
        "node agents of older muster versions; the current agent only removes it (it writes `spec.assigned` of the node's NodeGPUReport)",
        "muster's GPU model of the node (the device pass corrects a pod's indices by it), when the node has no NodeGPUReport",
        "Per pod (`namespace/name`), the `nvidia.com/gpu` device IDs kubelet gave it (kubelet's PodResources API).",
    ),
    key(
        GPU_HEALTH_ANNOTATION,
        Annotation,
        Muster,
        "Node",
        "node agents of older muster versions; the current agent only removes it (it writes `spec.health` of the node's NodeGPUReport)",
        "muster's GPU model of the node (admission leaves unhealthy GPUs out), when the node has no NodeGPUReport",
        "Per GPU: temperature, free memory and utilization (NVML), with the time they were measured.",
    ),
    // muster's own keys on cluster objects.
    key(
        CRD_VERSION_ANNOTATION,
        Annotation,
        Muster,
        "CustomResourceDefinition of each muster kind",
        "`muster crds`; `muster run --install-crds`",
        "`muster run --install-crds`",
        "The muster version whose schema the CRD holds, so an older muster (a rollback, an old replica during an upgrade) never puts back an older schema.",
    ),
    key(
        "muster.dev/cert-not-after",
        Annotation,
        Muster,
        "Secret of the webhook's serving certificate",
        "`muster run` (the webhook's certificate manager)",
        "`muster run` (renewal)",
        "When the serving certificate expires (RFC 3339).",
    ),
    key(
        "muster.dev/ca-not-after",
        Annotation,
        Muster,
        "Secret of the webhook's serving certificate",
        "`muster run` (the webhook's certificate manager)",
        "`muster run` (renewal)",
        "When the certificate authority expires (RFC 3339).",
    ),
    key(
        "muster.dev/sans",
        Annotation,
        Muster,
        "Secret of the webhook's serving certificate",
        "`muster run` (the webhook's certificate manager)",
        "`muster run` (a changed name list makes a new certificate)",
        "The names the serving certificate is valid for.",
    ),
    key(
        "muster.dev/judges-muster",
        Label,
        Muster,
        "ValidatingAdmissionPolicy",
        "the chart's tenant policies; cluster admins",
        "admission (a policy so labelled does not make it dry-run a pin first)",
        "Value `false`: the policy's match conditions leave muster's own requests out, so it never judges a pin and admission skips the dry run for it.",
    ),
    // Kubernetes' keys.
    key(
        HOSTNAME_LABEL,
        Label,
        Kubernetes,
        "Node",
        "kubelet",
        "admission (a pod is pinned with a `nodeSelector` on it)",
        "The node's hostname. A node without it, or sharing its value with another node, is never chosen: the pin would be ambiguous.",
    ),
    key(
        "kubernetes.io/metadata.name",
        Label,
        Kubernetes,
        "Namespace",
        "the API server",
        "muster's webhook configurations (`namespaceSelector`)",
        "The namespace's name. muster's webhooks skip muster's own namespace and `kube-system` by it.",
    ),
    key(
        "topology.kubernetes.io/zone",
        Label,
        Kubernetes,
        "Node, PersistentVolume",
        "the cloud provider; volume provisioners; `muster dev` on its fake nodes (`--zones`)",
        "admission (a pod's bound volumes restrict it to their zone, as kube-scheduler's VolumeZone)",
        "The zone of the node or volume.",
    ),
    key(
        "topology.kubernetes.io/region",
        Label,
        Kubernetes,
        "Node, PersistentVolume",
        "the cloud provider; volume provisioners",
        "admission (as kube-scheduler's VolumeZone)",
        "The region of the node or volume.",
    ),
    key(
        "failure-domain.beta.kubernetes.io/zone",
        Label,
        Kubernetes,
        "Node, PersistentVolume",
        "older cloud providers and provisioners",
        "admission (as kube-scheduler's VolumeZone)",
        "The deprecated form of `topology.kubernetes.io/zone`.",
    ),
    key(
        "failure-domain.beta.kubernetes.io/region",
        Label,
        Kubernetes,
        "Node, PersistentVolume",
        "older cloud providers and provisioners",
        "admission (as kube-scheduler's VolumeZone)",
        "The deprecated form of `topology.kubernetes.io/region`.",
    ),
    key(
        "batch.kubernetes.io/controller-uid",
        Label,
        Kubernetes,
        "(the pod template of a MusterJob, as validated)",
        "nobody: muster's pods carry `batch.muster.dev/job-name` instead",
        "the webhook and `muster validate`: without `manualSelector`, `spec.selector` must match the labels batch/v1 generates",
        "batch/v1's generated label with the job's uid, taken into account so a selector written for a batch/v1 Job is judged as batch/v1 judges it.",
    ),
    key(
        "batch.kubernetes.io/job-name",
        Label,
        Kubernetes,
        "(the pod template of a MusterJob, as validated)",
        "nobody: muster's pods carry `batch.muster.dev/job-name` instead",
        "the webhook and `muster validate` (as `batch.kubernetes.io/controller-uid`)",
        "batch/v1's generated label with the job's name.",
    ),
    key(
        "resource.kubernetes.io/delete-protection",
        Finalizer,
        Kubernetes,
        "ResourceClaim that admission allocates",
        "admission adds it with the allocation and removes it when it frees one",
        "Kubernetes (an allocated claim is not removed until muster frees it)",
        "kube-scheduler puts it on the claims it allocates; muster does the same.",
    ),
    // JobSet's keys.
    key(
        "jobset.sigs.k8s.io/jobset-name",
        LabelAndAnnotation,
        JobSet,
        "child MusterJob of a MusterJobSet, its pod template and pods",
        "the jobset controller, as JobSet writes it on its Jobs",
        "the user's selectors and tools written for JobSet",
        "The set's name.",
    ),
    key(
        "jobset.sigs.k8s.io/jobset-uid",
        LabelAndAnnotation,
        JobSet,
        "child MusterJob of a MusterJobSet, its pod template and pods",
        "the jobset controller, as JobSet writes it",
        "the user's selectors and tools written for JobSet",
        "The set's uid.",
    ),
    key(
        "jobset.sigs.k8s.io/replicatedjob-name",
        LabelAndAnnotation,
        JobSet,
        "child MusterJob of a MusterJobSet, its pod template and pods",
        "the jobset controller, as JobSet writes it",
        "the user's selectors and tools written for JobSet",
        "The child's replicatedJob.",
    ),
    key(
        "jobset.sigs.k8s.io/replicatedjob-replicas",
        LabelAndAnnotation,
        JobSet,
        "child MusterJob of a MusterJobSet, its pod template and pods",
        "the jobset controller, as JobSet writes it",
        "the user's selectors and tools written for JobSet",
        "`replicas` of the child's replicatedJob.",
    ),
    key(
        "jobset.sigs.k8s.io/global-replicas",
        LabelAndAnnotation,
        JobSet,
        "child MusterJob of a MusterJobSet, its pod template and pods",
        "the jobset controller, as JobSet writes it",
        "the user's selectors and tools written for JobSet",
        "The number of children of the whole set.",
    ),
    key(
        "jobset.sigs.k8s.io/job-index",
        LabelAndAnnotation,
        JobSet,
        "child MusterJob of a MusterJobSet, its pod template and pods",
        "the jobset controller, as JobSet writes it",
        "the user's selectors and tools written for JobSet",
        "The child's index in its replicatedJob.",
    ),
    key(
        "jobset.sigs.k8s.io/job-global-index",
        LabelAndAnnotation,
        JobSet,
        "child MusterJob of a MusterJobSet, its pod template and pods",
        "the jobset controller, as JobSet writes it",
        "the user's selectors and tools written for JobSet",
        "The child's index in the whole set (replicatedJobs in list order).",
    ),
    key(
        "jobset.sigs.k8s.io/restart-attempt",
        LabelAndAnnotation,
        JobSet,
        "child MusterJob of a MusterJobSet, its pod template and pods",
        "the jobset controller, as JobSet writes it",
        "the user's selectors and tools written for JobSet",
        "The set's `status.restarts` when the child was made.",
    ),
    key(
        "jobset.sigs.k8s.io/group-name",
        LabelAndAnnotation,
        JobSet,
        "child MusterJob of a MusterJobSet, its pod template and pods",
        "the jobset controller, as JobSet writes it",
        "the user's selectors and tools written for JobSet",
        "The replicatedJob's `groupName` (`default` when it names none).",
    ),
    key(
        "jobset.sigs.k8s.io/group-replicas",
        LabelAndAnnotation,
        JobSet,
        "child MusterJob of a MusterJobSet, its pod template and pods",
        "the jobset controller, as JobSet writes it",
        "the user's selectors and tools written for JobSet",
        "The number of children of the replicatedJobs of that group.",
    ),
    key(
        "jobset.sigs.k8s.io/job-group-index",
        LabelAndAnnotation,
        JobSet,
        "child MusterJob of a MusterJobSet, its pod template and pods",
        "the jobset controller, as JobSet writes it",
        "the user's selectors and tools written for JobSet",
        "The child's index in its group.",
    ),
    key(
        "jobset.sigs.k8s.io/coordinator",
        LabelAndAnnotation,
        JobSet,
        "child MusterJob of a MusterJobSet with `spec.coordinator`, its pod template and pods",
        "the jobset controller, as JobSet writes it",
        "the workload (to find its coordinator)",
        "The stable DNS name of the coordinator pod.",
    ),
    // The test tools' keys.
    key(
        "topology.muster.dev/rack",
        Label,
        DevTools,
        "Node (fake nodes of `muster dev` and the benchmarks)",
        "`muster dev` (`--racks`)",
        "topology constraints of the examples and benchmarks; muster gives it no meaning of its own",
        "The rack of a fake node: an example topology key, as `topology.kubernetes.io/zone` is a real one.",
    ),
    key(
        "sim.muster.dev/succeed-after",
        Annotation,
        DevTools,
        "Pod (template) on the simulated nodes of `make demo` and the e2e tests",
        "the user (the examples carry it)",
        "the simulated kubelet of the test clusters (KWOK stages, `hack/kwok/stages.yaml`)",
        "A duration (`5s`): the running pod succeeds (exit code 0) that long after it started.",
    ),
    key(
        "sim.muster.dev/fail-after",
        Annotation,
        DevTools,
        "Pod (template) on the simulated nodes of `make demo` and the e2e tests",
        "the user",
        "the simulated kubelet of the test clusters (KWOK stages, `hack/kwok/stages.yaml`)",
        "A duration: the running pod fails that long after it started; wins over `sim.muster.dev/succeed-after`.",
    ),
    key(
        "sim.muster.dev/exit-code",
        Annotation,
        DevTools,
        "Pod (template) on the simulated nodes of `make demo` and the e2e tests",
        "the user",
        "the simulated kubelet of the test clusters (KWOK stages, `hack/kwok/stages.yaml`)",
        "The exit code of the containers of a pod failed by `sim.muster.dev/fail-after` (default 1).",
    ),
    key(
        "app.kubernetes.io/managed-by",
        Label,
        DevTools,
        "ResourceSlice, DeviceClass published by `muster dev dra-slices`",
        "`muster dev dra-slices` (value `muster-dev`)",
        "`muster dev dra-slices --delete` (what it removes)",
        "Marks the fake DRA objects of the test tools; muster itself does not read it.",
    ),
];

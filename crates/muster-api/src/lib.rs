//! API types only (serde + schemars + CEL), no logic: the building blocks, the batch kinds
//! users write, and the scheduling kinds muster compiles them into.

// The derive macros take many `printcolumn(..)`/`validation = ..` arguments of one name.
#![allow(clippy::duplicated_attributes)]

pub mod batch;
pub mod blocks;
pub mod catalog;
pub mod gpu;
pub mod scheduling;

pub use batch::{MusterJob, MusterJobSet, MusterJobSetSpec, MusterJobSpec};
pub use blocks::*;
pub use gpu::{NodeGPUReport, NodeGPUReportSpec};
pub use scheduling::{
    CompositePodGroup, CompositePodGroupSpec, CompositePodGroupTemplate, PodGroup, PodGroupSpec, PodGroupTemplate,
    Workload, WorkloadSpec,
};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// Label linking a pod to its PodGroup (value: the PodGroup's name, same namespace).
pub const POD_GROUP_LABEL: &str = "scheduling.muster.dev/pod-group";
/// Scheduling gate holding a pod until its gang is admitted.
pub const ADMISSION_GATE: &str = "scheduling.muster.dev/admission";
/// Pod annotation with the GPU indices muster assigned, ascending, comma separated.
pub const GPU_INDICES_ANNOTATION: &str = "gpu.muster.dev/indices";
/// Node annotation describing the node's GPUs and their links.
pub const GPU_TOPOLOGY_ANNOTATION: &str = "gpu.muster.dev/topology";
/// Node annotation the node agent writes: per pod `namespace/name`, the `nvidia.com/gpu` device IDs kubelet
/// gave it (kubelet's PodResources API).
pub const GPU_ASSIGNED_ANNOTATION: &str = "gpu.muster.dev/assigned";
/// Node annotation the node agent writes: per GPU, temperature, free memory and utilization
/// (NVML), with the time they were measured.
pub const GPU_HEALTH_ANNOTATION: &str = "gpu.muster.dev/health";
/// Child MusterJob annotation: the PodGroupTemplate of the parent's Workload it builds from.
pub const GROUP_TEMPLATE_ANNOTATION: &str = "scheduling.muster.dev/group-template-name";
/// Child MusterJob annotation: the CompositePodGroup its PodGroup belongs to.
pub const PARENT_COMPOSITE_ANNOTATION: &str = "scheduling.muster.dev/parent-composite-podgroup";
/// Pod annotation: the admission attempt of the pod's root gang it was created in (the root's
/// `status.rollbacks` then). A failed pin with fewer than minCount pods of the attempt running
/// rolls the attempt back: every pod is deleted and recreated gated with the next number.
/// Not `batch.muster.dev/gang-attempt`, which numbers restarts after pod failures.
pub const ADMISSION_ATTEMPT_ANNOTATION: &str = "scheduling.muster.dev/gang-attempt";
/// Pod annotation set (value: the plan id) on each pod of a rolled-back attempt just before it
/// is deleted: its end is not a pod failure and never counts toward `backoffLimit`.
pub const ROLLED_BACK_ANNOTATION: &str = "scheduling.muster.dev/rolled-back";
/// Pod annotation with the completion index of an Indexed MusterJob.
pub const COMPLETION_INDEX_ANNOTATION: &str = "batch.muster.dev/job-completion-index";
/// MusterJob annotation: the scheduling API its groups are compiled to, `muster` or
/// `upstream` (see `--scheduling-api`). Set at creation by muster's mutating webhook where the
/// flag is `muster`, else by the job controller when it first syncs the job (or by the user at
/// creation, to choose for that job), and never changed after: a job keeps the API it started
/// with whatever the flag says later (an update dropping it gets it back from the webhook).
pub const SCHEDULING_API_ANNOTATION: &str = "batch.muster.dev/scheduling-api";
/// Label with the name of the MusterJob owning a pod.
pub const JOB_NAME_LABEL: &str = "batch.muster.dev/job-name";
/// Label with the name of the MusterJobSet owning a child MusterJob (and its pods).
pub const JOBSET_NAME_LABEL: &str = "batch.muster.dev/jobset-name";
/// Label with the replicatedJob of a child MusterJob.
pub const REPLICATED_JOB_LABEL: &str = "batch.muster.dev/replicatedjob-name";
/// ResourceClaim annotation: the entry of its PodGroup's `spec.resourceClaims` muster made it
/// for (the claim is owned by the PodGroup and shared by all its pods).
pub const GROUP_CLAIM_ANNOTATION: &str = "scheduling.muster.dev/pod-group-claim";
/// Pod-level claim entry (and container claim) through which a MusterJob with
/// `spec.gpuClaims` gets its GPUs.
pub const GPU_CLAIM_NAME: &str = "muster-gpus";
/// Resource name of NVIDIA GPUs.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// Hostname label a pod is pinned with.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// CRD annotation: the muster version whose schema the CRD holds, so `--install-crds` never
/// puts back an older schema (a rollback, or an old replica restarting during an upgrade).
pub const CRD_VERSION_ANNOTATION: &str = "muster.dev/version";

/// Every CRD muster serves, in a stable order, annotated with this muster's version.
///
/// The groups (PodGroup, CompositePodGroup), which only muster writes (a tenant may read them,
/// not write them) and whose status muster writes twice a gang or more, carry no CEL rules: the
/// API server evaluates every rule of an object again on each of its status writes, where the
/// rules cost about a fifth of the write (`make bench-writes`). Their rules are muster's own
/// checks instead (`workloadbuilder::objects`), run by its validating webhook on everyone else's
/// writes and by muster itself before each of its own (see `controllers::job::groups`). The
/// Workload keeps its rules (muster never writes its status), and so do the kinds tenants write
/// (MusterJob, MusterJobSet): the webhook does not reach every namespace.
pub fn all() -> Vec<CustomResourceDefinition> {
    let mut crds = vec![
        MusterJob::crd(),
        MusterJobSet::crd(),
        Workload::crd(),
        without_rules(PodGroup::crd()),
        without_rules(CompositePodGroup::crd()),
        NodeGPUReport::crd(),
    ];
    for crd in &mut crds {
        crd.metadata
            .annotations
            .get_or_insert_default()
            .insert(CRD_VERSION_ANNOTATION.to_string(), env!("CARGO_PKG_VERSION").to_string());
    }
    crds
}

/// `crd` without any `x-kubernetes-validations` rule: the rules of the building blocks a kind
/// shares with MusterJob's `spec.scheduling` (see [`all`]).
fn without_rules(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    fn strip(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(map) => {
                map.remove("x-kubernetes-validations");
                map.values_mut().for_each(strip);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let Ok(mut value) = serde_json::to_value(&crd) else { return crd };
    strip(&mut value);
    serde_json::from_value(value).unwrap_or(crd)
}

/// All CRDs as one multi-document YAML stream.
pub fn all_yaml() -> Result<String, serde_saphyr::SerializeError> {
    // Text of several lines as a literal block, the rest on one line each (no folding), so a
    // diff of two versions reads well.
    let mut options = serde_saphyr::SerializerOptions::default();
    options.folded_wrap_chars = usize::MAX;
    let mut out = String::new();
    for crd in all() {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string_with_options(&crd, options.clone())?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_the_groups_carry_no_cel_rules() {
        for crd in super::all() {
            let rules = serde_json::to_string(&crd.spec).expect("json").matches("x-kubernetes-validations").count();
            let name = crd.metadata.name.clone().unwrap_or_default();
            match crd.spec.group.as_str() {
                _ if name.starts_with("workloads.") => assert!(rules > 3, "{name} lost its rules: {rules} left"),
                "scheduling.muster.dev" => assert_eq!(rules, 0, "{name} carries rules"),
                "batch.muster.dev" => assert!(rules > 10, "{name} lost its rules: {rules} left"),
                _ => {}
            }
        }
    }

    #[test]
    fn the_crd_yaml_reads_back_as_the_crds() {
        let yaml = super::all_yaml().expect("yaml");
        let read: Vec<serde_json::Value> = serde_saphyr::from_multiple(&yaml).expect("parse");
        let want: Vec<serde_json::Value> =
            super::all().iter().map(|c| serde_json::to_value(c).expect("json")).collect();
        assert_eq!(read.len(), want.len());
        for (r, w) in read.iter().zip(&want) {
            assert_eq!(r, w, "{}", w["metadata"]["name"]);
        }
    }
}

//! muster's embedding of the builder: the item trees of MusterJob and MusterJobSet, their
//! defaults (basic when unset; gang `minCount` = max(1, parallelism); composite
//! `minGroupCount` = number of child groups), and the job-level rules around them. The webhook,
//! the controllers and `muster validate` all call these, so they agree.

use std::sync::Arc;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use muster_api::batch::{MAX_SCHEDULED_REPLICATED_JOBS, MusterJob, MusterJobSet, MusterJobSetSpec, MusterJobSpec};
use muster_api::blocks::{CompositePodGroupScheduling, PodGroupScheduling, PodGroupSchedulingPolicy};
use muster_api::{ADMISSION_GATE, GPU_CLAIM_NAME, GPU_RESOURCE};

use super::field::{ErrorList, FieldError, FieldPath, dns_label_errors, dns_subdomain_errors, is_muster_key, quote};
use super::item::{Block, PolicyInput, SchedulingConfig, WorkloadInput, WorkloadItem};
use super::{BuildOptions, Builder};

pub mod batchv1;
pub mod jobset;
#[cfg(test)]
mod test_support;

/// Template name of a plain MusterJob's single PodGroupTemplate.
pub const JOB_TEMPLATE_NAME: &str = "main";
/// Longest MusterJob name: room is left for `-<index>-<attempt>` in pod names and hostnames.
pub const MAX_JOB_NAME_LENGTH: usize = 52;
/// The most pods a MusterJob may ask for (`parallelism`, `completions`) and a MusterJobSet may
/// plan (each replicatedJob's `replicas` × `parallelism`, summed), and the most child
/// MusterJobs of a set: batch/v1's bound on an Indexed Job's parallelism. muster plans a pod for
/// each, and keeps each job's pods in memory. A cluster may set a lower bound
/// (`muster run --max-job-pods`), never a higher one.
pub const MAX_JOB_PODS: u32 = 100_000;

/// The resolved gang quorum of a job: `minCount`, defaulting to max(1, parallelism).
pub fn default_min_count(parallelism: i32) -> i32 {
    parallelism.max(1)
}

/// The leaf item for a MusterJob spec (or a replicatedJob's template spec) found at `spec_path`.
pub fn job_item(spec: &MusterJobSpec, template_name: &str, spec_path: &FieldPath) -> WorkloadItem {
    let path = spec_path.child("scheduling");
    let parallelism = spec.parallelism;
    let mut item = WorkloadItem::new(template_name, path.clone());
    item.default_config = SchedulingConfig {
        policy: Some(PodGroupSchedulingPolicy::basic()),
        priority_class_name: spec.template.spec.as_ref().and_then(|s| s.priority_class_name.clone()),
        ..Default::default()
    };
    item.input = leaf_input(spec.scheduling.as_ref(), &path);
    item.callbacks.push(Arc::new(move |c: &mut SchedulingConfig| {
        if let Some(gang) = c.policy.as_mut().and_then(|p| p.gang.as_mut())
            && gang.min_count.is_none()
        {
            gang.min_count = Some(default_min_count(parallelism));
        }
    }));
    item.pod_count = Some(parallelism);
    item
}

fn leaf_input(scheduling: Option<&PodGroupScheduling>, path: &FieldPath) -> WorkloadInput {
    let Some(s) = scheduling else { return WorkloadInput::default() };
    WorkloadInput {
        policy: s
            .scheduling_policy
            .clone()
            .map(|p| Block::new(PolicyInput::PodGroup(p), path.child("schedulingPolicy"))),
        constraints: s.scheduling_constraints.clone().map(|c| Block::new(c, path.child("schedulingConstraints"))),
        disruption_mode: s.disruption_mode.clone().map(|m| Block::new(m, path.child("disruptionMode"))),
        resource_claims: s.resource_claims.clone().map(|c| Block::new(c, path.child("resourceClaims"))),
    }
}

fn composite_input(scheduling: &CompositePodGroupScheduling, path: &FieldPath) -> WorkloadInput {
    WorkloadInput {
        policy: scheduling
            .scheduling_policy
            .clone()
            .map(|p| Block::new(PolicyInput::Composite(p), path.child("schedulingPolicy"))),
        constraints: scheduling
            .scheduling_constraints
            .clone()
            .map(|c| Block::new(c, path.child("schedulingConstraints"))),
        disruption_mode: scheduling.disruption_mode.clone().map(|m| Block::new(m, path.child("disruptionMode"))),
        resource_claims: None,
    }
}

/// Name of a MusterJobSet's root CompositePodGroupTemplate: `jobset`, unless a
/// replicatedJob already has that name (template names are unique across the tree).
pub fn root_template_name(spec: &MusterJobSetSpec) -> String {
    let taken = |n: &str| spec.replicated_jobs.iter().any(|r| r.name == n);
    std::iter::once("jobset".to_string())
        .chain((0..).map(|i| format!("jobset-{i}")))
        .find(|n| !taken(n))
        .unwrap_or_default()
}

/// The composite item tree of a MusterJobSet with `spec.scheduling`: the set's composite blocks
/// at the root, one leaf per replicatedJob (`replicas` groups each). `None` without scheduling:
/// then every child MusterJob is an independent job.
pub fn jobset_item(spec: &MusterJobSetSpec) -> Option<WorkloadItem> {
    let scheduling = spec.scheduling.as_ref()?;
    let spec_path = FieldPath::new("spec");
    let path = spec_path.child("scheduling");
    let mut root = WorkloadItem::new(root_template_name(spec), path.clone());
    root.default_config.policy = Some(PodGroupSchedulingPolicy::basic());
    root.input = composite_input(scheduling, &path);
    for (i, rjob) in spec.replicated_jobs.iter().enumerate() {
        let child_path = spec_path.child("replicatedJobs").index(i).child("template").child("spec");
        let mut child = job_item(&rjob.template.spec, &rjob.name, &child_path);
        child.replicas = rjob.replicas;
        root.children.push(child);
    }
    let groups = root.child_group_count();
    root.callbacks.push(Arc::new(move |c: &mut SchedulingConfig| {
        if let Some(gang) = c.policy.as_mut().and_then(|p| p.gang.as_mut())
            && gang.min_count.is_none()
        {
            gang.min_count = Some(groups.max(1));
        }
    }));
    Some(root)
}

/// Builder options for a muster controller: basic+gang and single+all allowed.
pub fn build_options(name: &str, namespace: &str, owner: Option<OwnerReference>) -> BuildOptions {
    BuildOptions::all_allowed(name, namespace, owner)
}

fn name_errors(name: Option<&str>) -> ErrorList {
    let mut errs = Vec::new();
    let Some(name) = name.filter(|n| !n.is_empty()) else { return errs };
    let path = FieldPath::new("metadata").child("name");
    for msg in dns_label_errors(name) {
        errs.push(FieldError::invalid(&path, quote(name), msg));
    }
    if name.len() > MAX_JOB_NAME_LENGTH {
        errs.push(FieldError::invalid(
            &path,
            quote(name),
            format!("must be no more than {MAX_JOB_NAME_LENGTH} characters"),
        ));
    }
    errs
}

fn non_negative(errs: &mut ErrorList, path: FieldPath, value: i64) {
    if value < 0 {
        errs.push(FieldError::invalid(&path, value, "must be greater than or equal to 0"));
    }
}

fn template_errors(template: &PodTemplateSpec, path: &FieldPath) -> ErrorList {
    let mut errs = Vec::new();
    let spec_path = path.child("spec");
    let Some(spec) = &template.spec else {
        errs.push(FieldError::required(&spec_path, ""));
        return errs;
    };
    if let Some(policy) = spec.restart_policy.as_deref()
        && !matches!(policy, "Never" | "OnFailure")
    {
        errs.push(FieldError::not_supported(&spec_path.child("restartPolicy"), quote(policy), &["Never", "OnFailure"]));
    }
    if spec.containers.is_empty() {
        errs.push(FieldError::required(&spec_path.child("containers"), ""));
    }
    if spec.node_name.as_deref().is_some_and(|n| !n.is_empty()) {
        errs.push(FieldError::forbidden(
            &spec_path.child("nodeName"),
            "may not be set: muster pins each pod to a node when its gang is admitted",
        ));
    }
    if spec.scheduling_gates.iter().flatten().any(|g| g.name == ADMISSION_GATE) {
        errs.push(FieldError::forbidden(
            &spec_path.child("schedulingGates"),
            format!("{ADMISSION_GATE} is added by muster"),
        ));
    }
    if let Some(meta) = &template.metadata {
        let meta_path = path.child("metadata");
        errs.extend(muster_key_errors(meta.labels.iter().flatten().map(|(k, _)| k), &meta_path.child("labels")));
        errs.extend(muster_key_errors(
            meta.annotations.iter().flatten().map(|(k, _)| k),
            &meta_path.child("annotations"),
        ));
    }
    errs
}

/// The keys among `keys` (labels or annotations at `path`) that are muster's own
/// ([`is_muster_key`]): muster sets them on what it makes, and reads them back as its own.
fn muster_key_errors<'a>(keys: impl Iterator<Item = &'a String>, path: &FieldPath) -> ErrorList {
    keys.filter(|k| is_muster_key(k))
        .map(|k| {
            FieldError::forbidden(
                &path.key(k),
                "muster's own key; muster sets the *.muster.dev/ keys of the pods and jobs it makes, and reads them as its own",
            )
        })
        .collect()
}

/// Whether `max` is a cluster's own bound (`--max-job-pods`), lower than [`MAX_JOB_PODS`].
fn cluster_bound(max: u32) -> bool {
    max < MAX_JOB_PODS
}

/// What a size over `max` is told: batch/v1's message for Indexed jobs, why muster bounds the
/// others, and where a lower bound comes from.
fn over_detail(max: u32, indexed: bool) -> String {
    let mode = if indexed { " when completion mode is Indexed" } else { "" };
    let why = if cluster_bound(max) {
        " (the limit of this cluster: muster run --max-job-pods)"
    } else if indexed {
        ""
    } else {
        " (muster plans a pod for each)"
    };
    format!("must be less than or equal to {max}{mode}{why}")
}

/// PURE: the sizes of a MusterJob spec at `path` over `max` pods: `parallelism`, and
/// `completions` (muster plans a pod per completion, Indexed or not). [`validate_job`] checks
/// them against [`MAX_JOB_PODS`]; the job controller and the webhook also against the cluster's
/// `--max-job-pods`.
pub fn job_size_errors(spec: &MusterJobSpec, path: &FieldPath, max: u32) -> ErrorList {
    let indexed = spec.indexed();
    let over = |v: i32| u32::try_from(v).is_ok_and(|v| v > max);
    let mut errs = Vec::new();
    if over(spec.parallelism) {
        errs.push(FieldError::invalid(&path.child("parallelism"), spec.parallelism, over_detail(max, indexed)));
    }
    if let Some(c) = spec.completions.filter(|c| over(*c)) {
        errs.push(FieldError::invalid(&path.child("completions"), c, over_detail(max, indexed)));
    }
    errs
}

/// The PriorityClass each replicatedJob that makes pods (`replicas` above 0) names in its pod
/// template (`None`: the cluster's default), in order: what a set's CompositePodGroup may state.
/// A replicatedJob of no replicas names a class no pod of the set runs under, so it counts for
/// nothing (a tenant could name any class there).
pub fn pod_making_classes(spec: &MusterJobSetSpec) -> impl Iterator<Item = Option<&str>> {
    spec.replicated_jobs
        .iter()
        .filter(|r| r.replicas > 0)
        .map(|r| r.template.spec.template.spec.as_ref().and_then(|s| s.priority_class_name.as_deref()))
}

/// PURE: a MusterJobSet over `max`: each replicatedJob's template over it
/// ([`job_size_errors`]), and the set's own counts ([`set_size_errors`]).
pub fn jobset_size_errors(spec: &MusterJobSetSpec, max: u32) -> ErrorList {
    let rjobs_path = FieldPath::new("spec").child("replicatedJobs");
    let mut errs: ErrorList = spec
        .replicated_jobs
        .iter()
        .enumerate()
        .flat_map(|(i, r)| job_size_errors(&r.template.spec, &rjobs_path.index(i).child("template").child("spec"), max))
        .collect();
    errs.extend(set_size_errors(spec, max.into()));
    errs
}

/// The counts of a MusterJobSet over `max`, each at the `replicas` of the replicatedJob that
/// passes it: that replicatedJob's pods (`replicas` × its template's `parallelism`), or its child
/// MusterJobs (`replicas`); else the set's pods, or children, summed up to it. All in u64 with
/// checked arithmetic: a sum that overflows is over any bound. A template whose own
/// `parallelism` is over the bound is told at that field ([`job_size_errors`]), not again here.
fn set_size_errors(spec: &MusterJobSetSpec, max: u64) -> ErrorList {
    let rjobs_path = FieldPath::new("spec").child("replicatedJobs");
    let whose = if max < u64::from(MAX_JOB_PODS) {
        "the limit of this cluster: muster run --max-job-pods".to_string()
    } else {
        format!("at most {max} per MusterJobSet: muster plans a pod for each")
    };
    let shown = |n: Option<u64>| n.map_or_else(|| format!("more than {}", u64::MAX), |n| n.to_string());
    let mut errs = Vec::new();
    let (mut pods, mut children) = (Some(0u64), Some(0u64));
    let mut told = false;
    for (i, rjob) in spec.replicated_jobs.iter().enumerate() {
        let path = rjobs_path.index(i).child("replicas");
        let replicas = u64::try_from(rjob.replicas).unwrap_or(0);
        let parallelism = u64::try_from(rjob.template.spec.parallelism).unwrap_or(0);
        let product = replicas.checked_mul(parallelism);
        pods = pods.zip(product).and_then(|(sum, p)| sum.checked_add(p));
        children = children.and_then(|sum| sum.checked_add(replicas));
        if told || parallelism > max {
            told = true;
            continue;
        }
        let message = if product.is_none_or(|p| p > max) {
            Some(format!(
                "replicas × parallelism = {replicas} × {parallelism} = {} pods, more than {max} ({whose})",
                shown(product)
            ))
        } else if replicas > max {
            Some(format!("{replicas} child MusterJobs, more than {max} ({whose})"))
        } else if pods.is_none_or(|p| p > max) {
            Some(format!(
                "replicatedJobs[0..={i}] make {} pods (replicas × parallelism, summed), more than {max} ({whose})",
                shown(pods)
            ))
        } else if children.is_none_or(|c| c > max) {
            Some(format!(
                "replicatedJobs[0..={i}] make {} child MusterJobs (replicas, summed), more than {max} ({whose})",
                shown(children)
            ))
        } else {
            None
        };
        if let Some(message) = message {
            errs.push(FieldError::invalid(&path, rjob.replicas, message));
            told = true;
        }
    }
    errs
}

/// Job-level rules of a MusterJob spec at `path` (not the scheduling blocks): counts, the pod
/// template, batch/v1's rules, and on update the fields batch/v1 freezes. `owner` is the
/// MusterJob the spec is of; `None` for a replicatedJob's template.
fn job_spec_errors(
    spec: &MusterJobSpec,
    old: Option<&MusterJobSpec>,
    path: &FieldPath,
    owner: Option<batchv1::Owner<'_>>,
) -> ErrorList {
    let mut errs = Vec::new();
    non_negative(&mut errs, path.child("parallelism"), spec.parallelism.into());
    if let Some(c) = spec.completions {
        non_negative(&mut errs, path.child("completions"), c.into());
    }
    if let Some(b) = spec.backoff_limit {
        non_negative(&mut errs, path.child("backoffLimit"), b.into());
    }
    if let Some(d) = spec.active_deadline_seconds {
        non_negative(&mut errs, path.child("activeDeadlineSeconds"), d);
    }
    if let Some(t) = spec.ttl_seconds_after_finished {
        non_negative(&mut errs, path.child("ttlSecondsAfterFinished"), t.into());
    }
    if spec.indexed() && spec.completions.is_none() {
        errs.push(FieldError::required(&path.child("completions"), "when completion mode is Indexed"));
    }
    errs.extend(job_size_errors(spec, path, MAX_JOB_PODS));
    // A replicatedJob's template (no owner) is checked as its children run: Indexed by default.
    let child = |s| if owner.is_some() { std::borrow::Cow::Borrowed(s) } else { jobset::child_spec(s) };
    errs.extend(batchv1::spec_errors(&child(spec), path, owner));
    errs.extend(template_errors(&spec.template, &path.child("template")));
    errs.extend(claim_errors(spec, path));
    if let Some(old) = old {
        if spec.gpu_claims != old.gpu_claims {
            errs.push(FieldError::invalid(&path.child("gpuClaims"), "{...}", "field is immutable"));
        }
        let scheduling_path = path.child("scheduling");
        set_once(&mut errs, &scheduling_path, spec.scheduling.is_some(), old.scheduling.is_some());
        if let (Some(new_s), Some(old_s)) = (&spec.scheduling, &old.scheduling) {
            set_once(
                &mut errs,
                &scheduling_path.child("schedulingPolicy"),
                new_s.scheduling_policy.is_some(),
                old_s.scheduling_policy.is_some(),
            );
        }
        // batch/v1 lets a suspended Job that has not started change its pods' scheduling
        // directives; muster records the template on the job's PodGroup and keeps it frozen.
        if spec.template != old.template {
            errs.push(FieldError::invalid(&path.child("template"), "{...}", "field is immutable"));
        }
        // Elastic Indexed jobs: as written (the CRD's rule cannot tell a set's template from a
        // job, so an unset mode stays NonIndexed here, and completions immutable).
        errs.extend(batchv1::update_errors(spec, old, path));
        if spec.completion_mode() != old.completion_mode() {
            errs.push(FieldError::invalid(
                &path.child("completionMode"),
                quote(&format!("{:?}", spec.completion_mode())),
                "field is immutable",
            ));
        }
    }
    errs
}

/// The claim names a job's pods get must not clash: the pod template's own `resourceClaims`,
/// the PodGroup's shared claims, and with `gpuClaims` the GPU claim; with `gpuClaims`, GPU
/// counts are whole numbers (each becomes a DRA request) and the device class a DNS subdomain.
fn claim_errors(spec: &MusterJobSpec, path: &FieldPath) -> ErrorList {
    let mut errs = Vec::new();
    let pod = spec.template.spec.as_ref();
    let pod_path = path.child("template").child("spec");
    let own: Vec<&str> =
        pod.and_then(|p| p.resource_claims.as_ref()).into_iter().flatten().map(|c| c.name.as_str()).collect();
    if let Some(entries) = spec.scheduling.as_ref().and_then(|s| s.resource_claims.as_ref()) {
        let entries_path = path.child("scheduling").child("resourceClaims");
        for (i, e) in entries.iter().enumerate() {
            let name_path = entries_path.index(i).child("name");
            if own.contains(&e.name.as_str()) {
                errs.push(FieldError::invalid(
                    &name_path,
                    quote(&e.name),
                    "the pod template already has a resourceClaims entry of this name (each pod gets one per shared claim)",
                ));
            } else if spec.gpu_claims.is_some() && e.name == GPU_CLAIM_NAME {
                errs.push(FieldError::invalid(
                    &name_path,
                    quote(&e.name),
                    format!("{GPU_CLAIM_NAME} is the pods' GPU claim when gpuClaims is set"),
                ));
            }
        }
    }
    let Some(gpu) = &spec.gpu_claims else { return errs };
    if let Some(class) = &gpu.device_class_name {
        let class_path = path.child("gpuClaims").child("deviceClassName");
        for msg in dns_subdomain_errors(class) {
            errs.push(FieldError::invalid(&class_path, quote(class), format!("must be a DeviceClass name: {msg}")));
        }
    }
    if let Some(i) = own.iter().position(|n| *n == GPU_CLAIM_NAME) {
        errs.push(FieldError::forbidden(
            &pod_path.child("resourceClaims").index(i).child("name"),
            format!("{GPU_CLAIM_NAME} is added by muster when gpuClaims is set"),
        ));
    }
    let Some(pod) = pod else { return errs };
    let containers = [
        ("containers", pod.containers.as_slice()),
        ("initContainers", pod.init_containers.as_deref().unwrap_or_default()),
    ];
    for (field, list) in containers {
        for (i, c) in list.iter().enumerate() {
            let Some(r) = &c.resources else { continue };
            let rpath = pod_path.child(field).index(i).child("resources");
            for (kind, map) in [("limits", &r.limits), ("requests", &r.requests)] {
                if let Some(q) = map.as_ref().and_then(|m| m.get(GPU_RESOURCE))
                    && q.0.trim().parse::<u32>().is_err()
                {
                    errs.push(FieldError::invalid(
                        &rpath.child(kind).key(GPU_RESOURCE),
                        quote(&q.0),
                        "must be a whole number of GPUs when gpuClaims is set (each becomes a DRA request)",
                    ));
                }
            }
            if r.claims.iter().flatten().any(|x| x.name == GPU_CLAIM_NAME) {
                errs.push(FieldError::forbidden(
                    &rpath.child("claims"),
                    format!("{GPU_CLAIM_NAME} is added by muster when gpuClaims is set"),
                ));
            }
        }
    }
    errs
}

/// batch/v1 freezes the presence of `scheduling` and `schedulingPolicy` (NoSet/NoUnset): the
/// builder alone would see `unset` and `basic` as the same policy, while the controller treats
/// any change of `scheduling` as a frozen field changed.
fn set_once(errs: &mut ErrorList, path: &FieldPath, now: bool, before: bool) {
    match (before, now) {
        (false, true) => errs.push(FieldError::invalid(path, "null", "field cannot be set once created")),
        (true, false) => errs.push(FieldError::invalid(path, "null", "field cannot be cleared once set")),
        _ => {}
    }
}

/// Which of `scheduling` and `scheduling.schedulingPolicy` a spec sets.
fn scheduling_presence(spec: &MusterJobSpec) -> (bool, bool) {
    (spec.scheduling.is_some(), spec.scheduling.as_ref().is_some_and(|s| s.scheduling_policy.is_some()))
}

/// Every rule for a MusterJob spec at `path`: job-level rules, then the builder's validation
/// of its scheduling blocks (with update rules when `old` is given; a `scheduling` set or
/// cleared is reported once, by the job-level rules).
pub fn validate_job_spec(spec: &MusterJobSpec, old: Option<&MusterJobSpec>, path: &FieldPath) -> ErrorList {
    validate_owned_job_spec(spec, old, path, Some(batchv1::Owner::default()))
}

/// [`validate_job_spec`] for the spec of the job `owner` (its name and uid decide which
/// selector counts as generated).
fn validate_owned_job_spec(
    spec: &MusterJobSpec,
    old: Option<&MusterJobSpec>,
    path: &FieldPath,
    owner: Option<batchv1::Owner<'_>>,
) -> ErrorList {
    let mut errs = job_spec_errors(spec, old, path, owner);
    let item = job_item(spec, JOB_TEMPLATE_NAME, path);
    let old_item = old
        .filter(|o| scheduling_presence(o) == scheduling_presence(spec))
        .map(|o| job_item(o, JOB_TEMPLATE_NAME, path));
    errs.extend(Builder::new(item, build_options("", "", None)).validate(old_item.as_ref()));
    errs
}

/// Every rule for a MusterJob: its name, its spec, and on update the frozen fields.
pub fn validate_job(job: &MusterJob, old: Option<&MusterJob>) -> ErrorList {
    let mut errs = name_errors(job.metadata.name.as_deref());
    errs.extend(scheduling_api_errors(&job.metadata, old.map(|o| &o.metadata)));
    let owner = batchv1::Owner {
        name: job.metadata.name.as_deref().unwrap_or_default(),
        uid: job.metadata.uid.as_deref().unwrap_or_default(),
    };
    errs.extend(validate_owned_job_spec(&job.spec, old.map(|o| &o.spec), &FieldPath::new("spec"), Some(owner)));
    errs
}

/// The `batch.muster.dev/scheduling-api` annotation of a MusterJob or MusterJobSet: `muster` or
/// `upstream`, and once set never changed nor removed (the groups live in that API).
fn scheduling_api_errors(meta: &ObjectMeta, old: Option<&ObjectMeta>) -> ErrorList {
    use crate::workloadbuilder::native::SchedulingApi;
    use muster_api::SCHEDULING_API_ANNOTATION;
    let of = |m: &ObjectMeta| m.annotations.as_ref().and_then(|a| a.get(SCHEDULING_API_ANNOTATION)).cloned();
    let path = FieldPath::new("metadata").child("annotations").key(SCHEDULING_API_ANNOTATION);
    let (now, before) = (of(meta), old.and_then(of));
    let mut errs = Vec::new();
    if let Some(v) = now.as_deref().filter(|v| SchedulingApi::parse(v).is_none()) {
        errs.push(FieldError::not_supported(&path, quote(v), &["muster", "upstream"]));
    }
    if let Some(before) = before
        && now.as_ref() != Some(&before)
    {
        errs.push(FieldError::invalid(&path, quote(now.as_deref().unwrap_or_default()), "field is immutable"));
    }
    errs
}

/// Every rule for a MusterJobSet: names, each replicatedJob's template, the composite tree, and
/// on update the frozen fields.
/// PURE: the fields of a MusterJob that need DRA (`resource.k8s.io/v1`, Kubernetes 1.34+), as
/// errors for an API server that does not serve it: `spec.gpuClaims`, the group's shared
/// `spec.scheduling.resourceClaims`, the pods' own `spec.template.spec.resourceClaims`.
pub fn needs_dra(spec: &MusterJobSpec) -> ErrorList {
    let why = "needs DRA (resource.k8s.io/v1, Kubernetes 1.34+), which this API server does not serve";
    let mut errs = Vec::new();
    if spec.gpu_claims.is_some() {
        errs.push(FieldError::forbidden(&FieldPath::new("spec.gpuClaims"), why));
    }
    if spec.scheduling.as_ref().and_then(|s| s.resource_claims.as_ref()).is_some_and(|c| !c.is_empty()) {
        errs.push(FieldError::forbidden(&FieldPath::new("spec.scheduling.resourceClaims"), why));
    }
    let pod_claims = spec.template.spec.as_ref().and_then(|s| s.resource_claims.as_ref());
    if pod_claims.is_some_and(|c| !c.is_empty()) {
        errs.push(FieldError::forbidden(&FieldPath::new("spec.template.spec.resourceClaims"), why));
    }
    errs
}

pub fn validate_jobset(set: &MusterJobSet, old: Option<&MusterJobSet>) -> ErrorList {
    let spec = &set.spec;
    let spec_path = FieldPath::new("spec");
    let rjobs_path = spec_path.child("replicatedJobs");
    let mut errs = Vec::new();
    let set_name = set.metadata.name.as_deref().unwrap_or_default();
    if !set_name.is_empty() {
        for msg in dns_label_errors(set_name) {
            errs.push(FieldError::invalid(&FieldPath::new("metadata").child("name"), quote(set_name), msg));
        }
    }
    errs.extend(scheduling_api_errors(&set.metadata, old.map(|o| &o.metadata)));
    if spec.replicated_jobs.is_empty() {
        errs.push(FieldError::required(&rjobs_path, ""));
        return errs;
    }
    if spec.scheduling.is_some() && spec.replicated_jobs.len() > MAX_SCHEDULED_REPLICATED_JOBS {
        errs.push(FieldError::too_many(&rjobs_path, spec.replicated_jobs.len(), MAX_SCHEDULED_REPLICATED_JOBS));
        return errs;
    }
    if spec.replicated_jobs.len() > muster_api::batch::MAX_REPLICATED_JOBS {
        errs.push(FieldError::too_many(
            &rjobs_path,
            spec.replicated_jobs.len(),
            muster_api::batch::MAX_REPLICATED_JOBS,
        ));
        return errs;
    }
    let mut names = std::collections::BTreeSet::new();
    let mut shape_ok = true;
    for (i, rjob) in spec.replicated_jobs.iter().enumerate() {
        let rpath = rjobs_path.index(i);
        let npath = rpath.child("name");
        let name_msgs = dns_label_errors(&rjob.name);
        if rjob.name.is_empty() {
            errs.push(FieldError::required(&npath, ""));
            shape_ok = false;
        } else if !name_msgs.is_empty() {
            errs.extend(name_msgs.into_iter().map(|m| FieldError::invalid(&npath, quote(&rjob.name), m)));
            shape_ok = false;
        } else if !names.insert(rjob.name.as_str()) {
            errs.push(FieldError::duplicate(&npath, quote(&rjob.name)));
            shape_ok = false;
        }
        non_negative(&mut errs, rpath.child("replicas"), rjob.replicas.into());
        if !set_name.is_empty() && rjob.replicas > 0 {
            let child = child_job_name(set_name, &rjob.name, rjob.replicas - 1);
            if child.len() > MAX_JOB_NAME_LENGTH {
                errs.push(FieldError::invalid(
                    &npath,
                    quote(&rjob.name),
                    format!("child MusterJob name {child:?} must be no more than {MAX_JOB_NAME_LENGTH} characters"),
                ));
            }
        }
        if let Some(meta) = &rjob.template.metadata {
            let meta_path = rpath.child("template").child("metadata");
            errs.extend(muster_key_errors(meta.labels.keys(), &meta_path.child("labels")));
            errs.extend(muster_key_errors(meta.annotations.keys(), &meta_path.child("annotations")));
        }
        let tpath = rpath.child("template").child("spec");
        let old_rjob = old.and_then(|o| o.spec.replicated_jobs.iter().find(|r| r.name == rjob.name));
        errs.extend(job_spec_errors(&rjob.template.spec, old_rjob.map(|r| &r.template.spec), &tpath, None));
        if spec.scheduling.is_none() {
            // Independent children: each is its own leaf tree.
            let item = job_item(&rjob.template.spec, JOB_TEMPLATE_NAME, &tpath);
            let old_item = old_rjob
                .filter(|r| scheduling_presence(&r.template.spec) == scheduling_presence(&rjob.template.spec))
                .map(|r| job_item(&r.template.spec, JOB_TEMPLATE_NAME, &tpath));
            errs.extend(Builder::new(item, build_options("", "", None)).validate(old_item.as_ref()));
        }
    }
    if let Some(success) = &spec.success_policy {
        for (j, target) in success.target_replicated_jobs.iter().enumerate() {
            if !spec.replicated_jobs.iter().any(|r| &r.name == target) {
                errs.push(FieldError::invalid(
                    &spec_path.child("successPolicy").child("targetReplicatedJobs").index(j),
                    quote(target),
                    "must name a replicatedJob of this set",
                ));
            }
        }
    }
    errs.extend(set_size_errors(spec, MAX_JOB_PODS.into()));
    errs.extend(jobset::set_errors(set));
    if let Some(old) = old {
        errs.extend(jobset::set_update_errors(spec, &old.spec));
    }
    if let Some(failure) = &spec.failure_policy {
        non_negative(&mut errs, spec_path.child("failurePolicy").child("maxRestarts"), failure.max_restarts.into());
    }
    if let Some(old) = old {
        let shape =
            |s: &MusterJobSetSpec| s.replicated_jobs.iter().map(|r| (r.name.clone(), r.replicas)).collect::<Vec<_>>();
        if shape(spec) != shape(&old.spec) {
            errs.push(FieldError::forbidden(
                &rjobs_path,
                "replicatedJobs may not be added, removed, renamed or resized",
            ));
            shape_ok = false;
        }
        if spec.scheduling.is_some() != old.spec.scheduling.is_some() {
            errs.push(FieldError::forbidden(&spec_path.child("scheduling"), "may not be added or removed"));
            shape_ok = false;
        }
    }
    if shape_ok && let Some(item) = jobset_item(spec) {
        let old_item = old.and_then(|o| jobset_item(&o.spec));
        errs.extend(Builder::new(item, build_options("", "", None)).validate(old_item.as_ref()));
    }
    errs
}

/// Name of the `i`th child MusterJob of a replicatedJob: `<set>-<rjob>-<i>`.
pub fn child_job_name(set: &str, rjob: &str, i: i32) -> String {
    format!("{set}-{rjob}-{i}")
}

#[cfg(test)]
mod tests;

//! PURE: the admission decisions. Validation of muster's kinds with the workloadbuilder's rules
//! (every error with its field path), the pod mutation that adds the admission gate to pods
//! joining a PodGroup, and the job mutation that records the scheduling API a MusterJob or
//! MusterJobSet compiles to. AdmissionRequest in, AdmissionResponse out.

use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use kube::core::response::{Status, StatusCause, StatusDetails};
use serde::de::DeserializeOwned;

use crate::crds::{ADMISSION_GATE, CompositePodGroup, MusterJob, MusterJobSet, POD_GROUP_LABEL, PodGroup, Workload};
use crate::scheduler::unmodelled;
use crate::workloadbuilder::field::{ErrorList, FieldPath, is_dns_subdomain};
use crate::workloadbuilder::job::{MAX_JOB_PODS, job_size_errors, jobset_size_errors, validate_job, validate_jobset};
use crate::workloadbuilder::native::{SchedulingApi, api_to_record};
use crate::workloadbuilder::objects::{
    validate_composite_pod_group, validate_pod_group, validate_priority, validate_workload,
};

/// What a handler decided, for metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted unchanged.
    Allowed,
    /// Refused.
    Denied,
    /// Admitted with a patch.
    Patched,
}

fn decode<T: DeserializeOwned>(obj: &DynamicObject) -> Result<T, String> {
    let value = serde_json::to_value(obj).map_err(|e| e.to_string())?;
    serde_path_to_error::deserialize(value).map_err(|e| format!("{}: {}", e.path(), e.inner()))
}

fn deny_invalid(req: &AdmissionRequest<DynamicObject>, errors: &ErrorList) -> AdmissionResponse {
    let kind = &req.kind;
    let name = if req.name.is_empty() {
        req.object.as_ref().and_then(|o| o.metadata.generate_name.clone()).unwrap_or_default()
    } else {
        req.name.clone()
    };
    let list: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    let joined = if list.len() == 1 { list[0].clone() } else { format!("[{}]", list.join(", ")) };
    let qualified = if kind.group.is_empty() { kind.kind.clone() } else { format!("{}.{}", kind.kind, kind.group) };
    let message = format!("{qualified} {name:?} is invalid: {joined}");
    let causes = errors
        .iter()
        .map(|e| StatusCause { reason: format!("Field{:?}", e.kind), message: e.body(), field: e.path.to_string() })
        .collect();
    let mut resp = AdmissionResponse::from(req).deny(&message);
    resp.result = Status::failure(&message, "Invalid").with_code(422).with_details(StatusDetails {
        name,
        group: kind.group.clone(),
        kind: kind.kind.clone(),
        causes,
        uid: String::new(),
        retry_after_seconds: 0,
    });
    resp
}

fn check<T: DeserializeOwned + PartialEq>(
    req: &AdmissionRequest<DynamicObject>,
    spec_of: impl Fn(&T) -> serde_json::Value,
    rules: impl Fn(&T, Option<&T>) -> ErrorList,
) -> (AdmissionResponse, Outcome) {
    let Some(obj) = req.object.as_ref() else { return (AdmissionResponse::from(req), Outcome::Allowed) };
    let new: T = match decode(obj) {
        Ok(v) => v,
        Err(e) => {
            return (AdmissionResponse::from(req).deny(format!("cannot decode the object: {e}")), Outcome::Denied);
        }
    };
    let old: Option<T> = match (&req.operation, req.old_object.as_ref()) {
        (Operation::Update, Some(o)) => match decode(o) {
            Ok(v) => Some(v),
            Err(e) => {
                return (
                    AdmissionResponse::from(req).deny(format!("cannot decode the old object: {e}")),
                    Outcome::Denied,
                );
            }
        },
        _ => None,
    };
    // Metadata-only updates (labels, finalizers, deletion) never fail on what was there before.
    if let Some(o) = &old
        && (spec_of(o) == spec_of(&new) || obj.metadata.deletion_timestamp.is_some())
    {
        return (AdmissionResponse::from(req), Outcome::Allowed);
    }
    let errors = rules(&new, old.as_ref());
    if errors.is_empty() {
        (AdmissionResponse::from(req), Outcome::Allowed)
    } else {
        (deny_invalid(req, &errors), Outcome::Denied)
    }
}

fn spec_json<T: serde::Serialize>(spec: &T) -> serde_json::Value {
    serde_json::to_value(spec).unwrap_or_default()
}

/// A spec with the scheduling API it was recorded with (both frozen).
fn spec_and_api<T: serde::Serialize>(
    spec: &T,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> serde_json::Value {
    let api = meta.annotations.as_ref().and_then(|a| a.get(crate::crds::SCHEDULING_API_ANNOTATION));
    serde_json::json!([spec_json(spec), api])
}

/// What placement does not model in the pod templates of a MusterJob or MusterJobSet, as
/// admission warnings with the full field path (see [`unmodelled`]).
fn template_warnings(req: &AdmissionRequest<DynamicObject>) -> Vec<String> {
    let Some(obj) = req.object.as_ref() else { return Vec::new() };
    let mut out = Vec::new();
    match (req.kind.group.as_str(), req.kind.kind.as_str()) {
        ("batch.muster.dev", "MusterJob") => {
            if let Ok(job) = decode::<MusterJob>(obj) {
                if let Some(spec) = &job.spec.template.spec {
                    out.extend(unmodelled(spec).iter().map(|u| format!("spec.template.spec.{u}")));
                }
                let api = job.metadata.annotations.as_ref().and_then(|a| a.get(crate::crds::SCHEDULING_API_ANNOTATION));
                let group = job.spec.scheduling.as_ref().and_then(|s| s.resource_claims.as_deref()).unwrap_or_default();
                let pods = job.spec.parallelism;
                let shared = crate::scheduler::shared_claim_warnings(
                    job.spec.template.spec.as_ref(),
                    group,
                    pods,
                    api.map(String::as_str),
                );
                out.extend(shared.into_iter().map(|w| format!("spec.{w}")));
            }
        }
        ("batch.muster.dev", "MusterJobSet") => {
            if let Ok(set) = decode::<MusterJobSet>(obj) {
                for (i, r) in set.spec.replicated_jobs.iter().enumerate() {
                    if let Some(spec) = &r.template.spec.template.spec {
                        out.extend(
                            unmodelled(spec)
                                .iter()
                                .map(|u| format!("spec.replicatedJobs[{i}].template.spec.template.spec.{u}")),
                        );
                    }
                }
            }
        }
        _ => {}
    }
    out
}

/// `/validate`: every rule of the workloadbuilder for muster's kinds, on create and update;
/// an admitted job whose pods ask for what placement does not model gets a warning per field.
/// Sizes are bounded by [`MAX_JOB_PODS`].
pub fn validate(req: &AdmissionRequest<DynamicObject>) -> (AdmissionResponse, Outcome) {
    validate_within(req, MAX_JOB_PODS)
}

/// [`validate`], with the sizes of MusterJobs and MusterJobSets also bounded by the cluster's
/// `max_job_pods` (`muster run --max-job-pods`; never above [`MAX_JOB_PODS`]).
pub fn validate_within(req: &AdmissionRequest<DynamicObject>, max_job_pods: u32) -> (AdmissionResponse, Outcome) {
    let (mut resp, outcome) = validate_rules(req, max_job_pods.min(MAX_JOB_PODS));
    if outcome == Outcome::Allowed && matches!(req.operation, Operation::Create | Operation::Update) {
        let warnings = template_warnings(req);
        if !warnings.is_empty() {
            resp.warnings = Some(warnings);
        }
    }
    (resp, outcome)
}

/// A group's `spec.priority` and `spec.priorityClassName`, where a PodGroup or
/// CompositePodGroup is created, or updated with a changed spec, with `spec.priority` set: what
/// [`validate_checked`] checks against the class's value.
pub fn group_priority(req: &AdmissionRequest<DynamicObject>) -> Option<(i32, Option<String>)> {
    if req.kind.group != "scheduling.muster.dev" || !matches!(req.kind.kind.as_str(), "PodGroup" | "CompositePodGroup")
    {
        return None;
    }
    let spec = |o: Option<&DynamicObject>| o.and_then(|o| o.data.get("spec")).cloned();
    let new = spec(req.object.as_ref())?;
    match req.operation {
        Operation::Create => {}
        Operation::Update if spec(req.old_object.as_ref()).as_ref() != Some(&new) => {}
        _ => return None,
    }
    let priority = i32::try_from(new.get("priority")?.as_i64()?).ok()?;
    let class = new.get("priorityClassName").and_then(|c| c.as_str()).map(String::from);
    Some((priority, class))
}

/// [`validate_within`], and a group's priority against its class: `class_value` is the value
/// of the class [`group_priority`] named (or the cluster's default where it names none; `None`
/// where the named class does not exist). A group that passes the other rules but names
/// another number than its class gives is refused with the field path.
pub fn validate_checked(
    req: &AdmissionRequest<DynamicObject>,
    max_job_pods: u32,
    class_value: Option<Option<i32>>,
) -> (AdmissionResponse, Outcome) {
    let (resp, outcome) = validate_within(req, max_job_pods);
    if outcome != Outcome::Allowed {
        return (resp, outcome);
    }
    let (Some((priority, class)), Some(value)) = (group_priority(req), class_value) else { return (resp, outcome) };
    let errors = validate_priority(Some(priority), class.as_deref(), value);
    if errors.is_empty() { (resp, outcome) } else { (deny_invalid(req, &errors), Outcome::Denied) }
}

fn validate_rules(req: &AdmissionRequest<DynamicObject>, max_job_pods: u32) -> (AdmissionResponse, Outcome) {
    if !matches!(req.operation, Operation::Create | Operation::Update) {
        return (AdmissionResponse::from(req), Outcome::Allowed);
    }
    // The cluster's bound is told once the rules pass (the hard bound is one of them).
    let or_sizes = |errs: ErrorList, sizes: &dyn Fn() -> ErrorList| if errs.is_empty() { sizes() } else { errs };
    match (req.kind.group.as_str(), req.kind.kind.as_str()) {
        // The scheduling API a job or set was recorded with is checked like its spec (frozen).
        ("batch.muster.dev", "MusterJob") => check::<MusterJob>(
            req,
            |j| spec_and_api(&j.spec, &j.metadata),
            |j, old| {
                or_sizes(validate_job(j, old), &|| job_size_errors(&j.spec, &FieldPath::new("spec"), max_job_pods))
            },
        ),
        ("batch.muster.dev", "MusterJobSet") => check::<MusterJobSet>(
            req,
            |s| spec_and_api(&s.spec, &s.metadata),
            |s, old| or_sizes(validate_jobset(s, old), &|| jobset_size_errors(&s.spec, max_job_pods)),
        ),
        ("scheduling.muster.dev", "Workload") => check::<Workload>(req, |w| spec_json(&w.spec), validate_workload),
        ("scheduling.muster.dev", "PodGroup") => check::<PodGroup>(req, |g| spec_json(&g.spec), validate_pod_group),
        ("scheduling.muster.dev", "CompositePodGroup") => {
            check::<CompositePodGroup>(req, |g| spec_json(&g.spec), validate_composite_pod_group)
        }
        _ => (AdmissionResponse::from(req), Outcome::Allowed),
    }
}

/// `/mutate`: [`mutate`] for pods, [`record_scheduling_api`] for MusterJobs and MusterJobSets
/// (`default_api`: `--scheduling-api`, `None` for `auto`).
pub fn mutate_within(
    req: &AdmissionRequest<DynamicObject>,
    default_api: Option<SchedulingApi>,
) -> (AdmissionResponse, Outcome) {
    match (req.kind.group.as_str(), req.kind.kind.as_str()) {
        ("batch.muster.dev", "MusterJob" | "MusterJobSet") => record_scheduling_api(req, default_api),
        _ => mutate(req),
    }
}

/// A MusterJob or MusterJobSet gets the scheduling API it compiles to recorded in its
/// annotation `batch.muster.dev/scheduling-api` where that needs nothing but the flag, and keeps
/// a recorded one an update drops ([`api_to_record`]); anything else is admitted unchanged and
/// left to the validating webhook and the controller.
pub fn record_scheduling_api(
    req: &AdmissionRequest<DynamicObject>,
    default_api: Option<SchedulingApi>,
) -> (AdmissionResponse, Outcome) {
    let resp = AdmissionResponse::from(req);
    if !matches!(req.operation, Operation::Create | Operation::Update) {
        return (resp, Outcome::Allowed);
    }
    let Some(obj) = req.object.as_ref() else { return (resp, Outcome::Allowed) };
    let api_of = |o: &DynamicObject| {
        o.metadata.annotations.as_ref().and_then(|a| a.get(crate::crds::SCHEDULING_API_ANNOTATION)).cloned()
    };
    let old = match req.operation {
        Operation::Update => req.old_object.as_ref().and_then(api_of),
        _ => None,
    };
    let Some(value) = api_to_record(old.as_deref(), api_of(obj).as_deref(), default_api) else {
        return (resp, Outcome::Allowed);
    };
    // `/` in a key is `~1` in a JSON pointer.
    let key = crate::crds::SCHEDULING_API_ANNOTATION.replace('~', "~0").replace('/', "~1");
    let op = match obj.metadata.annotations {
        Some(_) => serde_json::json!({"op": "add", "path": format!("/metadata/annotations/{key}"), "value": value}),
        None => serde_json::json!({"op": "add", "path": "/metadata/annotations",
                                   "value": {crate::crds::SCHEDULING_API_ANNOTATION: value}}),
    };
    patched(req, resp, op)
}

/// `resp` with the JSON patch of the one operation `op`.
fn patched(
    req: &AdmissionRequest<DynamicObject>,
    resp: AdmissionResponse,
    op: serde_json::Value,
) -> (AdmissionResponse, Outcome) {
    let patch: json_patch::Patch = match serde_json::from_value(serde_json::json!([op])) {
        Ok(p) => p,
        Err(e) => return (resp.deny(format!("internal error building the patch: {e}")), Outcome::Denied),
    };
    match resp.with_patch(patch) {
        Ok(r) => (r, Outcome::Patched),
        Err(e) => (AdmissionResponse::from(req).deny(format!("internal error: {e}")), Outcome::Denied),
    }
}

/// `/mutate`: a pod created with the PodGroup label gets the admission gate (if missing); a
/// malformed label value is refused with a clear message.
pub fn mutate(req: &AdmissionRequest<DynamicObject>) -> (AdmissionResponse, Outcome) {
    let resp = AdmissionResponse::from(req);
    if req.operation != Operation::Create || req.kind.kind != "Pod" || !req.kind.group.is_empty() {
        return (resp, Outcome::Allowed);
    }
    let Some(pod) = req.object.as_ref() else { return (resp, Outcome::Allowed) };
    let Some(group) = pod.metadata.labels.as_ref().and_then(|l| l.get(POD_GROUP_LABEL)) else {
        return (resp, Outcome::Allowed);
    };
    if let Some((ns, _)) = group.split_once('/') {
        let message = format!(
            "label {POD_GROUP_LABEL}={group:?} names a PodGroup in namespace {ns:?}: a pod can only join a PodGroup in its own namespace; use the PodGroup's name alone"
        );
        return (resp.deny(message), Outcome::Denied);
    }
    if !is_dns_subdomain(group) || group.len() > 63 {
        let message = format!(
            "label {POD_GROUP_LABEL}={group:?} is not a PodGroup name: it must be a lowercase RFC 1123 subdomain of at most 63 characters"
        );
        return (resp.deny(message), Outcome::Denied);
    }
    let spec = pod.data.get("spec");
    if spec.and_then(|s| s.get("nodeName")).and_then(|n| n.as_str()).is_some_and(|n| !n.is_empty()) {
        let message = format!(
            "a pod with spec.nodeName bypasses scheduling and cannot join PodGroup {group:?}: remove spec.nodeName or the {POD_GROUP_LABEL} label"
        );
        return (resp.deny(message), Outcome::Denied);
    }
    // What placement does not model in this pod: said to whoever creates it.
    let warnings: Vec<String> = spec
        .and_then(|s| serde_json::from_value::<k8s_openapi::api::core::v1::PodSpec>(s.clone()).ok())
        .map(|s| unmodelled(&s).iter().map(|u| format!("spec.{u}")).collect())
        .unwrap_or_default();
    let mut resp = resp;
    if !warnings.is_empty() {
        resp.warnings = Some(warnings);
    }
    let gates = spec.and_then(|s| s.get("schedulingGates")).and_then(|g| g.as_array());
    if gates.is_some_and(|g| g.iter().any(|g| g.get("name").and_then(|n| n.as_str()) == Some(ADMISSION_GATE))) {
        return (resp, Outcome::Allowed);
    }
    let gate = serde_json::json!({"name": ADMISSION_GATE});
    let op = match gates {
        Some(_) => serde_json::json!({"op": "add", "path": "/spec/schedulingGates/-", "value": gate}),
        None => serde_json::json!({"op": "add", "path": "/spec/schedulingGates", "value": [gate]}),
    };
    patched(req, resp, op)
}

#[cfg(test)]
mod tests;

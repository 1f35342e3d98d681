//! PURE: the DRA (`resource.k8s.io/v1`) side of a MusterJob's pods. GPU claims
//! (`spec.gpuClaims`): the containers' `nvidia.com/gpu` become one ResourceClaimTemplate per
//! job and a claim per pod. Group claims (the PodGroup's `spec.resourceClaims`): one claim per
//! group, shared by all its pods. Plain data in, plain objects out; no client.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, PodResourceClaim, PodSpec, ResourceClaim as ContainerClaim};
use k8s_openapi::api::resource::v1::{
    DeviceClaim, DeviceRequest, ExactDeviceRequest, ResourceClaim, ResourceClaimSpec, ResourceClaimTemplate,
    ResourceClaimTemplateSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use sha2::{Digest, Sha256};

use muster_api::blocks::PodGroupResourceClaim;
use muster_api::scheduling::PodGroupResourceClaimStatus;
use muster_api::{GPU_RESOURCE, GROUP_CLAIM_ANNOTATION, POD_GROUP_LABEL};

pub use muster_api::GPU_CLAIM_NAME;
/// The one request of a GPU claim when only init containers ask for GPUs.
pub const INIT_ONLY_REQUEST: &str = "gpus";
/// DRA allocation mode muster asks for: a fixed number of devices.
pub const EXACT_COUNT: &str = "ExactCount";
/// Longest object name (a DNS subdomain).
const MAX_NAME_LENGTH: usize = 253;

/// Name of the ResourceClaimTemplate of job `job`'s GPU claims.
pub fn gpu_template_name(job: &str) -> String {
    format!("{job}-gpus")
}

/// One request of a GPU claim: `count` devices, named after the container that uses them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuRequest {
    /// Request name (the container's name, or [`INIT_ONLY_REQUEST`]).
    pub name: String,
    /// Devices wanted.
    pub count: i64,
}

/// The GPUs a container asks for: its `nvidia.com/gpu` limit, else its request. `None` when
/// it asks for none (absent, zero, or not a whole number; validation reports the latter).
pub fn gpu_count(c: &Container) -> Option<i64> {
    let r = c.resources.as_ref()?;
    let quantity = [r.limits.as_ref(), r.requests.as_ref()].into_iter().flatten().find_map(|m| m.get(GPU_RESOURCE))?;
    quantity.0.trim().parse::<i64>().ok().filter(|n| *n > 0)
}

/// The requests of a pod's GPU claim: one per container asking for GPUs; when only init
/// containers do, one [`INIT_ONLY_REQUEST`] of the largest init count (init containers run
/// one after the other, and each reference the whole claim).
pub fn gpu_requests(spec: &PodSpec) -> Vec<GpuRequest> {
    let main: Vec<GpuRequest> = spec
        .containers
        .iter()
        .filter_map(|c| gpu_count(c).map(|count| GpuRequest { name: c.name.clone(), count }))
        .collect();
    if !main.is_empty() {
        return main;
    }
    spec.init_containers
        .iter()
        .flatten()
        .filter_map(gpu_count)
        .max()
        .map(|count| vec![GpuRequest { name: INIT_ONLY_REQUEST.into(), count }])
        .unwrap_or_default()
}

/// The spec of a job's GPU ResourceClaimTemplate: each request exactly `count` devices of
/// `device_class`; `labels` go on every claim made from it. `None` when no container asks
/// for GPUs (the job then needs no template).
pub fn gpu_template_spec(
    spec: &PodSpec,
    device_class: &str,
    labels: &BTreeMap<String, String>,
) -> Option<ResourceClaimTemplateSpec> {
    let requests = gpu_requests(spec);
    if requests.is_empty() {
        return None;
    }
    let requests = requests
        .into_iter()
        .map(|r| DeviceRequest {
            name: r.name,
            exactly: Some(ExactDeviceRequest {
                device_class_name: device_class.to_string(),
                allocation_mode: Some(EXACT_COUNT.into()),
                count: Some(r.count),
                ..Default::default()
            }),
            first_available: None,
        })
        .collect();
    Some(ResourceClaimTemplateSpec {
        metadata: Some(ObjectMeta { labels: Some(labels.clone()), ..Default::default() }),
        spec: Some(ResourceClaimSpec { devices: Some(DeviceClaim { requests: Some(requests), ..Default::default() }) }),
    })
}

/// The GPU ResourceClaimTemplate object.
pub fn gpu_template(
    name: &str,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    owner: OwnerReference,
    spec: ResourceClaimTemplateSpec,
) -> ResourceClaimTemplate {
    ResourceClaimTemplate {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(labels.clone()),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: Some(spec),
    }
}

/// The requests of a template as `name: count x class (mode)`, for comparing and for messages.
fn describe_requests(spec: Option<&ResourceClaimSpec>) -> Vec<String> {
    let requests = spec.and_then(|s| s.devices.as_ref()).and_then(|d| d.requests.as_ref());
    requests
        .into_iter()
        .flatten()
        .map(|r| match &r.exactly {
            Some(e) if r.first_available.is_none() => format!(
                "{}: {} x {} ({})",
                r.name,
                e.count.unwrap_or(1),
                e.device_class_name,
                e.allocation_mode.as_deref().unwrap_or(EXACT_COUNT)
            ),
            _ => format!("{}: (not an exact request)", r.name),
        })
        .collect()
}

/// Why an existing template does not give what the job needs, or `None` when it does. Only
/// the requests count: the API server may default other fields.
pub fn template_mismatch(existing: &ResourceClaimTemplate, want: &ResourceClaimTemplateSpec) -> Option<String> {
    let have = describe_requests(existing.spec.as_ref().and_then(|s| s.spec.as_ref()));
    let need = describe_requests(want.spec.as_ref());
    (have != need).then(|| format!("it requests [{}], the job needs [{}]", have.join(", "), need.join(", ")))
}

/// Rewrites a pod spec to take its GPUs from the claim made from `template`: a pod-level
/// entry [`GPU_CLAIM_NAME`], each GPU container references its request and each GPU init
/// container the whole claim, and `nvidia.com/gpu` is removed from their limits and requests.
/// Does nothing when no container asks for GPUs.
pub fn use_gpu_claim(spec: &mut PodSpec, template: &str) {
    let requests = gpu_requests(spec);
    if requests.is_empty() {
        return;
    }
    let main: BTreeSet<&str> = requests.iter().map(|r| r.name.as_str()).collect();
    for c in spec.containers.iter_mut() {
        if main.contains(c.name.as_str()) && gpu_count(c).is_some() {
            move_to_claim(c, Some(c.name.clone()));
        }
    }
    for c in spec.init_containers.iter_mut().flatten() {
        if gpu_count(c).is_some() {
            move_to_claim(c, None);
        }
    }
    let claims = spec.resource_claims.get_or_insert_with(Vec::new);
    if !claims.iter().any(|c| c.name == GPU_CLAIM_NAME) {
        claims.push(PodResourceClaim {
            name: GPU_CLAIM_NAME.into(),
            resource_claim_template_name: Some(template.to_string()),
            resource_claim_name: None,
        });
    }
}

fn move_to_claim(c: &mut Container, request: Option<String>) {
    let r = c.resources.get_or_insert_with(Default::default);
    for map in [&mut r.limits, &mut r.requests] {
        if let Some(m) = map {
            m.remove(GPU_RESOURCE);
            if m.is_empty() {
                *map = None;
            }
        }
    }
    let claims = r.claims.get_or_insert_with(Vec::new);
    if !claims.iter().any(|x| x.name == GPU_CLAIM_NAME) {
        claims.push(ContainerClaim { name: GPU_CLAIM_NAME.into(), request });
    }
}

/// Name of the claim made for entry `entry` of PodGroup `pod_group`: `<podgroup>-<entry>`,
/// cut to 253 characters with a hash of the whole name when longer.
pub fn group_claim_name(pod_group: &str, entry: &str) -> String {
    let full = format!("{pod_group}-{entry}");
    if full.len() <= MAX_NAME_LENGTH {
        return full;
    }
    let hash = hex::encode(Sha256::digest(full.as_bytes()));
    let hash = &hash[..10];
    let mut cut = MAX_NAME_LENGTH - hash.len() - 1;
    while !full.is_char_boundary(cut) {
        cut -= 1;
    }
    let prefix = full[..cut].trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    format!("{prefix}-{hash}")
}

/// One entry of a PodGroup's `spec.resourceClaims`, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupClaim {
    /// The entry's name: the pods' claim entry name.
    pub entry: String,
    /// The ResourceClaim the pods reference.
    pub claim_name: String,
    /// The template muster makes the claim from; `None` for a claim named by the user, which
    /// muster never creates or deletes.
    pub template: Option<String>,
}

/// The claims of a PodGroup named `pod_group` with `spec.resourceClaims` = `entries`.
pub fn group_claims(pod_group: &str, entries: &[PodGroupResourceClaim]) -> Vec<GroupClaim> {
    entries
        .iter()
        .filter_map(|e| match (&e.resource_claim_name, &e.resource_claim_template_name) {
            (Some(name), _) => Some(GroupClaim { entry: e.name.clone(), claim_name: name.clone(), template: None }),
            (None, Some(t)) => Some(GroupClaim {
                entry: e.name.clone(),
                claim_name: group_claim_name(pod_group, &e.name),
                template: Some(t.clone()),
            }),
            (None, None) => None,
        })
        .collect()
}

/// The ResourceClaim for `claim` made from `template`: its spec and its claim metadata's
/// labels and annotations, owned by the PodGroup (`owner`), annotated with the entry name.
pub fn group_resource_claim(
    claim: &GroupClaim,
    namespace: &str,
    pod_group: &str,
    template: &ResourceClaimTemplate,
    owner: OwnerReference,
) -> ResourceClaim {
    let tspec = template.spec.clone().unwrap_or_default();
    let tmeta = tspec.metadata.unwrap_or_default();
    let mut labels = tmeta.labels.unwrap_or_default();
    labels.insert(POD_GROUP_LABEL.into(), pod_group.to_string());
    let mut annotations = tmeta.annotations.unwrap_or_default();
    annotations.insert(GROUP_CLAIM_ANNOTATION.into(), claim.entry.clone());
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(claim.claim_name.clone()),
            namespace: Some(namespace.to_string()),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: tspec.spec,
        status: None,
    }
}

/// Adds pod-level claim entries, each unless an entry of its name is there already (a list is
/// made only when there is something to add).
fn add_pod_claims(spec: &mut PodSpec, entries: impl IntoIterator<Item = PodResourceClaim>) {
    let mut entries = entries.into_iter().peekable();
    if entries.peek().is_none() {
        return;
    }
    let list = spec.resource_claims.get_or_insert_with(Vec::new);
    for e in entries {
        if !list.iter().any(|x| x.name == e.name) {
            list.push(e);
        }
    }
}

/// Adds a pod-level entry `{name: entry, resourceClaimName: claim}` per group claim (an
/// entry of that name already there is left alone).
pub fn add_group_claims(spec: &mut PodSpec, claims: &[GroupClaim]) {
    add_pod_claims(
        spec,
        claims.iter().map(|c| PodResourceClaim {
            name: c.entry.clone(),
            resource_claim_name: Some(c.claim_name.clone()),
            resource_claim_template_name: None,
        }),
    );
}

/// Upstream mode: adds to a pod the native PodGroup's claim entries as they are (name, claim
/// or template name). kube-controller-manager resolves a pod entry equal to its PodGroup's
/// entry in every field to the one claim made (or named) for the group, reserved for the
/// group (`DRAWorkloadResourceClaims`); an entry of that name already there is left alone.
pub fn add_native_group_claims(spec: &mut PodSpec, entries: &[PodGroupResourceClaim]) {
    add_pod_claims(
        spec,
        entries.iter().map(|e| PodResourceClaim {
            name: e.name.clone(),
            resource_claim_name: e.resource_claim_name.clone(),
            resource_claim_template_name: e.resource_claim_template_name.clone(),
        }),
    );
}

/// The PodGroup's `status.resourceClaimStatuses`: the entries whose claim exists (`made`
/// holds those whose claim muster made or found), with the claim's name; a claim named by the
/// user is listed as is. An entry whose claim is not made yet is left out: upstream reads an
/// entry without a claim name as "no claim needed".
pub fn claim_statuses(claims: &[GroupClaim], made: &BTreeSet<String>) -> Vec<PodGroupResourceClaimStatus> {
    claims
        .iter()
        .filter(|c| c.template.is_none() || made.contains(&c.entry))
        .map(|c| PodGroupResourceClaimStatus { name: c.entry.clone(), resource_claim_name: Some(c.claim_name.clone()) })
        .collect()
}

#[cfg(test)]
mod tests;

//! PURE: the DRA claims of pods, as one admission decision sees them. A pod asks for devices
//! through pod-level `resourceClaims` entries: a ResourceClaimTemplate (a claim of its own,
//! created by kube-controller-manager's resource-claim controller) or a named ResourceClaim
//! (shared: a group claim, or one the user made).
//!
//! muster allocates these claims itself, so the node's driver prepares exactly the devices it
//! chose and kube-scheduler (which honours an allocated claim) is bound by the decision:
//! - a pod's own GPU claim (one per pod, devices of the GPU driver): its devices are GPU
//!   indices on the pod's node, chosen by the topology chooser like count-based GPUs, among
//!   the devices its class and selectors allow ([`ShapeClaims::offered`]);
//! - a named claim: already allocated, its allocation's node selector says which nodes can
//!   reach it; not allocated, muster chooses its devices before placement (the widest reach
//!   first) and every pod of the gang must be on a node they all reach.
//!
//! Anything else (a claim of a driver muster does not allocate per pod, a request outside
//! the supported subset, a template or claim that does not exist) keeps the pod off every
//! node with a message naming it, never silently left to chance.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaim, ResourceClaimSpec, ResourceClaimTemplate};

use super::placement::Decision;
use super::snapshot::NodeInfo;
use crate::devices::GpuSet;
use crate::devices::dra::{ClaimKey, DeviceId, DeviceRequestSet, Inventory, SharedReach, allocated_devices};
use crate::devices::parse_indices;
use muster_api::scheduling::PlannedPod;

/// Where a pod-level claim entry takes its claim from.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ClaimSource {
    /// `resourceClaimTemplateName`: a claim of the pod's own, made from the template.
    Template(String),
    /// `resourceClaimName`: an existing claim, possibly shared.
    Claim(String),
}

/// One pod-level `resourceClaims` entry.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodClaim {
    /// The entry's name (containers refer to it).
    pub name: String,
    /// Its claim.
    pub source: ClaimSource,
}

/// The pod-level claim entries of a pod spec, in order (entries naming neither source are
/// left out: the API server refuses them).
pub fn pod_claims(spec: &PodSpec) -> Vec<PodClaim> {
    spec.resource_claims
        .iter()
        .flatten()
        .filter_map(|c| {
            let source = match (&c.resource_claim_name, &c.resource_claim_template_name) {
                (Some(n), _) => ClaimSource::Claim(n.clone()),
                (None, Some(t)) => ClaimSource::Template(t.clone()),
                (None, None) => return None,
            };
            Some(PodClaim { name: c.name.clone(), source })
        })
        .collect()
}

/// A claim as admission reads it.
#[derive(Clone, Debug)]
pub struct ClaimInfo {
    /// Its spec.
    pub spec: ResourceClaimSpec,
    /// `status.allocation`.
    pub allocation: Option<AllocationResult>,
    /// UIDs of the pods in `status.reservedFor`.
    pub reserved_for: Vec<String>,
}

/// A named claim's devices and where they reach, as this decision has them.
#[derive(Clone, Debug)]
pub struct SharedChoice {
    /// The claim.
    pub claim: ClaimKey,
    /// Its devices: the allocation's, or the ones muster will allocate.
    pub devices: Vec<DeviceId>,
    /// The nodes that reach every one of them.
    pub reach: SharedReach,
    /// Whether muster is to write the allocation (the claim is not allocated yet).
    pub allocate: bool,
}

impl PartialEq for SharedChoice {
    fn eq(&self, other: &Self) -> bool {
        (&self.claim, &self.devices, self.allocate) == (&other.claim, &other.devices, other.allocate)
    }
}

impl Eq for SharedChoice {}

/// What the claims of one shape need in one decision.
#[derive(Clone, Debug, Default)]
pub struct ShapeClaims {
    /// The pod's own GPU claim (from its template), if it has one.
    pub gpu: Option<Arc<DeviceRequestSet>>,
    /// The named claims the pod uses, with their devices and reach.
    pub shared: Vec<Arc<SharedChoice>>,
    /// GPU indices per node (node name) the pod's own claim may be given: matching, free,
    /// and not taken by a shared claim of this decision. Filled lazily by [`Dra::offered`].
    pub offered: HashMap<String, GpuSet>,
}

impl ShapeClaims {
    /// Whether every named claim's devices reach the node.
    pub fn reaches(&self, node: &NodeInfo) -> bool {
        self.shared.iter().all(|s| s.reach.reaches(&node.name, &node.labels))
    }

    /// How many GPUs the pod's own claim asks for (0 without one).
    pub fn gpus(&self) -> u32 {
        self.gpu.as_ref().map_or(0, |g| g.total())
    }
}

/// The cluster's DRA objects: devices and who holds them, templates and claims by name.
#[derive(Default)]
pub struct Dra {
    inventory: Option<Inventory>,
    templates: HashMap<(String, String), ResourceClaimSpec>,
    claims: HashMap<(String, String), ClaimInfo>,
}

impl std::fmt::Debug for Dra {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dra").field("templates", &self.templates.len()).field("claims", &self.claims.len()).finish()
    }
}

fn key_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> (String, String) {
    (meta.namespace.clone().unwrap_or_default(), meta.name.clone().unwrap_or_default())
}

impl Dra {
    /// The DRA state of the cluster: the inventory (slices, classes, allocated claims) and the
    /// templates and claims pods name.
    pub fn new(inventory: Inventory, templates: &[ResourceClaimTemplate], claims: &[ResourceClaim]) -> Self {
        let templates = templates
            .iter()
            .map(|t| (key_of(&t.metadata), t.spec.as_ref().and_then(|s| s.spec.clone()).unwrap_or_default()))
            .collect();
        let claims = claims
            .iter()
            .map(|c| {
                let status = c.status.as_ref();
                let reserved_for = status
                    .and_then(|s| s.reserved_for.as_ref())
                    .into_iter()
                    .flatten()
                    .filter(|r| r.resource == "pods")
                    .map(|r| r.uid.clone())
                    .collect();
                let info = ClaimInfo {
                    spec: c.spec.clone().unwrap_or_default(),
                    allocation: status.and_then(|s| s.allocation.clone()),
                    reserved_for,
                };
                (key_of(&c.metadata), info)
            })
            .collect();
        Self { inventory: Some(inventory), templates, claims }
    }

    /// The device inventory, when the cluster serves DRA.
    pub fn inventory(&self) -> Option<&Inventory> {
        self.inventory.as_ref()
    }

    /// A claim by namespace and name.
    pub fn claim(&self, ns: &str, name: &str) -> Option<&ClaimInfo> {
        self.claims.get(&(ns.to_string(), name.to_string()))
    }

    /// A template's claim spec by namespace and name.
    pub fn template(&self, ns: &str, name: &str) -> Option<&ResourceClaimSpec> {
        self.templates.get(&(ns.to_string(), name.to_string()))
    }

    /// Resolves the claims of one shape. `shared` holds the named claims this decision has
    /// resolved already (one choice per claim, whichever shapes use it) and `taken` the devices
    /// chosen for them, so two shared claims never get the same device.
    pub fn resolve(
        &self,
        ns: &str,
        claims: &[PodClaim],
        shared: &mut BTreeMap<ClaimKey, Arc<SharedChoice>>,
        taken: &mut HashSet<DeviceId>,
    ) -> Result<ShapeClaims, String> {
        let mut out = ShapeClaims::default();
        if claims.is_empty() {
            return Ok(out);
        }
        let Some(inventory) = self.inventory.as_ref() else {
            return Err("the pod uses DRA resourceClaims, but the cluster serves no resource.k8s.io/v1".into());
        };
        for (i, c) in claims.iter().enumerate() {
            let field = format!("resourceClaims[{i}] ({:?})", c.name);
            match &c.source {
                ClaimSource::Template(t) => {
                    let Some(spec) = self.template(ns, t) else {
                        return Err(format!("ResourceClaimTemplate {ns}/{t} named by {field} does not exist"));
                    };
                    let req = inventory
                        .request_of(spec)
                        .map_err(|e| format!("ResourceClaimTemplate {ns}/{t} named by {field}: {e}"))?;
                    if !inventory.is_gpu_request(&req) {
                        if let Some(part) = inventory.partition_asked(&req) {
                            return Err(format!(
                                "ResourceClaimTemplate {ns}/{t} named by {field} asks for {part} (class {:?}): {LEFT_TO_KUBE_SCHEDULER}",
                                req.class()
                            ));
                        }
                        return Err(format!(
                            "ResourceClaimTemplate {ns}/{t} named by {field} asks for devices of class {:?}, which are not \
                             GPUs muster allocates; muster allocates a pod's own claims only for GPUs (shared claims may be of any class)",
                            req.class()
                        ));
                    }
                    if out.gpu.is_some() {
                        return Err(format!(
                            "{field}: the pod has a second GPU claim of its own; muster allocates one per pod (put several requests in one template)"
                        ));
                    }
                    out.gpu = Some(Arc::new(req));
                }
                ClaimSource::Claim(name) => {
                    let key = ClaimKey { namespace: ns.to_string(), name: name.clone() };
                    if let Some(choice) = shared.get(&key) {
                        out.shared.push(choice.clone());
                        continue;
                    }
                    let Some(claim) = self.claim(ns, name) else {
                        return Err(format!("ResourceClaim {ns}/{name} named by {field} does not exist"));
                    };
                    let choice = match &claim.allocation {
                        Some(a) => {
                            let devices = allocated_devices(a);
                            if let Some((device, other)) =
                                devices.iter().find_map(|d| inventory.rivals(d, &key).next().map(|o| (d, o)))
                            {
                                return Err(format!(
                                    "ResourceClaim {ns}/{name} named by {field}: its device {device} is also allocated to \
                                     ResourceClaim {other} (two allocators wrote it at once); waiting until one of them is freed"
                                ));
                            }
                            SharedChoice {
                                claim: key.clone(),
                                devices,
                                reach: SharedReach::of_allocation(a).map_err(|e| {
                                    format!("ResourceClaim {ns}/{name} named by {field}: allocation {e}")
                                })?,
                                allocate: false,
                            }
                        }
                        None => {
                            let req = inventory
                                .request_of(&claim.spec)
                                .map_err(|e| format!("ResourceClaim {ns}/{name} named by {field}: {e}"))?;
                            let chosen = inventory.choose_shared(&req, taken);
                            if chosen.is_none()
                                && let Some(part) = inventory.partition_asked(&req)
                            {
                                return Err(format!(
                                    "ResourceClaim {ns}/{name} named by {field} asks for {part} (class {:?}): {LEFT_TO_KUBE_SCHEDULER}",
                                    req.class()
                                ));
                            }
                            let Some((devices, reach)) = chosen else {
                                return Err(format!(
                                    "ResourceClaim {ns}/{name} named by {field}: no {} free device(s) of class {:?} match it",
                                    req.total(),
                                    req.class()
                                ));
                            };
                            SharedChoice { claim: key.clone(), devices, reach, allocate: true }
                        }
                    };
                    taken.extend(choice.devices.iter().cloned());
                    let choice = Arc::new(choice);
                    shared.insert(key, choice.clone());
                    out.shared.push(choice);
                }
            }
        }
        Ok(out)
    }

    /// The GPU indices on `node` the pod's own claim may be given: matching its class and
    /// selectors, not allocated, and not a device a shared claim of the decision takes.
    pub fn offered(&self, claims: &ShapeClaims, node: &str, taken: &HashSet<DeviceId>) -> GpuSet {
        let (Some(inventory), Some(req)) = (self.inventory.as_ref(), claims.gpu.as_ref()) else {
            return GpuSet::EMPTY;
        };
        let offered = inventory.offered_gpus(req, node);
        if taken.is_empty() {
            return offered;
        }
        let shared = offered.iter().filter(|&i| inventory.gpu_device(node, i).is_some_and(|d| taken.contains(d)));
        offered.difference(GpuSet::from_indices(shared).unwrap_or_default())
    }
}

/// A pod's own claims (entries made from templates) and the claim each got, from
/// `status.resourceClaimStatuses` (`None` until the resource-claim controller made it).
pub fn own_claims(pod: &Pod) -> Vec<(String, Option<String>)> {
    let Some(spec) = pod.spec.as_ref() else { return Vec::new() };
    let statuses = pod.status.as_ref().and_then(|s| s.resource_claim_statuses.as_ref());
    pod_claims(spec)
        .into_iter()
        .filter(|c| matches!(c.source, ClaimSource::Template(_)))
        .map(|c| {
            let made =
                statuses.into_iter().flatten().find(|s| s.name == c.name).and_then(|s| s.resource_claim_name.clone());
            (c.name, made)
        })
        .collect()
}

impl Dra {
    /// The node and GPU indices of the GPU-driver devices a claim is allocated.
    pub fn claim_gpus(&self, ns: &str, name: &str) -> Option<(String, GpuSet)> {
        let inventory = self.inventory.as_ref()?;
        let allocation = self.claim(ns, name)?.allocation.as_ref()?;
        let mut out: Option<(String, GpuSet)> = None;
        for id in allocated_devices(allocation) {
            let Some((node, index)) = inventory.gpu_index(&id) else { continue };
            let entry = out.get_or_insert_with(|| (node.clone(), GpuSet::EMPTY));
            if entry.0 == node {
                entry.1 = entry.1.with(index).unwrap_or(entry.1);
            }
        }
        out
    }

    /// The node and GPU indices a pod's own allocated claims give it: what the node's driver
    /// prepares for it, so what `gpu.muster.dev/indices` must say.
    pub fn pod_gpus(&self, pod: &Pod) -> Option<(String, GpuSet)> {
        self.claims_gpus(pod.metadata.namespace.as_deref().unwrap_or_default(), &own_claims(pod))
    }

    /// [`Self::pod_gpus`] of a pod in `ns` with these own claims ([`own_claims`]).
    pub fn claims_gpus(&self, ns: &str, claims: &[(String, Option<String>)]) -> Option<(String, GpuSet)> {
        let mut out: Option<(String, GpuSet)> = None;
        for (_, claim) in claims {
            let Some((node, gpus)) = claim.as_ref().and_then(|c| self.claim_gpus(ns, c)) else { continue };
            let entry = out.get_or_insert_with(|| (node.clone(), GpuSet::EMPTY));
            if entry.0 == node {
                entry.1 = entry.1.union(gpus);
            }
        }
        out
    }
}

/// One claim write of a commit: the allocation to write (none when the claim is allocated
/// already and only pods are to be added to `reservedFor`) and the pods it is reserved for.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimWrite {
    /// The claim's name.
    pub name: String,
    /// The allocation to write.
    pub allocation: Option<AllocationResult>,
    /// Its devices (the allocation's, or the claim's own when only pods are added).
    pub devices: Vec<DeviceId>,
    /// (name, uid) of the pods it is for.
    pub pods: Vec<(String, String)>,
}

/// The claim writes a pod's own GPU claims need before the pod is ungated as `planned` says:
/// the devices of its planned GPU indices. Empty when the claims are allocated that way already;
/// an error (the gang waits or the plan is re-checked) when a claim is missing, not made yet or
/// allocated otherwise.
pub fn own_writes(ns: &str, planned: &PlannedPod, dra: &Dra) -> std::result::Result<Vec<ClaimWrite>, String> {
    let Some(inventory) = dra.inventory() else { return Ok(Vec::new()) };
    let gpus = planned.gpu_indices.as_deref().and_then(|v| parse_indices(v).ok()).unwrap_or_default();
    let mut out = Vec::new();
    for name in &planned.claims {
        let Some(claim) = dra.claim(ns, name) else {
            return Err(format!("ResourceClaim {ns}/{name} of pod {} is not in the cache yet", planned.name));
        };
        // Allocated already (by this plan, before a restart): only the same devices will do.
        if let Some(a) = &claim.allocation {
            let mut planned_devices: Vec<DeviceId> =
                gpus.iter().filter_map(|i| inventory.gpu_device(&planned.node, i).cloned()).collect();
            let mut now = allocated_devices(a);
            planned_devices.sort();
            now.sort();
            if now != planned_devices || planned_devices.len() != gpus.len() {
                return Err(format!(
                    "ResourceClaim {ns}/{name} of pod {} is allocated other devices than planned",
                    planned.name
                ));
            }
            if !claim.reserved_for.contains(&planned.uid) {
                out.push(ClaimWrite {
                    name: name.clone(),
                    allocation: None,
                    devices: allocated_devices(a),
                    pods: vec![(planned.name.clone(), planned.uid.clone())],
                });
            }
            continue;
        }
        let request = inventory.request_of(&claim.spec).map_err(|e| format!("ResourceClaim {ns}/{name}: {e}"))?;
        let allocation = inventory
            .gpu_allocation(&request, &planned.node, gpus)
            .map_err(|e| format!("ResourceClaim {ns}/{name} of pod {}: {e}", planned.name))?;
        let devices = allocated_devices(&allocation);
        let allocation = Some(allocation);
        out.push(ClaimWrite {
            name: name.clone(),
            allocation,
            devices,
            pods: vec![(planned.name.clone(), planned.uid.clone())],
        });
    }
    Ok(out)
}

/// The names of the claims a pod's own GPU claim entries got (in `status.resourceClaimStatuses`),
/// for the plan; an error while the resource-claim controller has not made one yet.
pub fn own_claim_names(pod: &Pod, dra: &Dra) -> std::result::Result<Vec<String>, String> {
    let (Some(inventory), Some(spec)) = (dra.inventory(), pod.spec.as_ref()) else { return Ok(Vec::new()) };
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    let mut out = Vec::new();
    let statuses = pod.status.as_ref().and_then(|s| s.resource_claim_statuses.as_ref());
    for entry in pod_claims(spec) {
        let ClaimSource::Template(template) = &entry.source else { continue };
        let gpu = dra
            .template(ns, template)
            .and_then(|t| inventory.request_of(t).ok())
            .is_some_and(|r| inventory.is_gpu_request(&r));
        if !gpu {
            continue;
        }
        let made =
            statuses.into_iter().flatten().find(|s| s.name == entry.name).and_then(|s| s.resource_claim_name.clone());
        match made {
            Some(name) if dra.claim(ns, &name).is_some() => out.push(name),
            _ => {
                return Err(format!(
                    "waiting for kube-controller-manager's resource-claim controller to create the ResourceClaim of pod {pod_name} \
                     (resourceClaims entry {:?}, template {template})",
                    entry.name
                ));
            }
        }
    }
    Ok(out)
}

/// The writes of the named claims a decision allocates, each reserved for the planned pods
/// that use it; and, for named claims allocated already, the planned pods to add to
/// `reservedFor`.
pub fn shared_writes(
    ns: &str,
    decision: &Decision,
    planned: &[(&PlannedPod, &Pod)],
    dra: &Dra,
) -> std::result::Result<Vec<ClaimWrite>, String> {
    let Some(inventory) = dra.inventory() else { return Ok(Vec::new()) };
    let mut users: HashMap<String, Vec<(String, String)>> = HashMap::new();
    for (p, pod) in planned {
        for entry in pod.spec.as_ref().map(pod_claims).unwrap_or_default() {
            if let ClaimSource::Claim(name) = entry.source {
                users.entry(name).or_default().push((p.name.clone(), p.uid.clone()));
            }
        }
    }
    let mut out = Vec::new();
    let mut names: Vec<&String> = users.keys().collect();
    names.sort();
    for name in names {
        let pods = &users[name];
        let Some(claim) = dra.claim(ns, name) else {
            return Err(format!("ResourceClaim {ns}/{name} does not exist"));
        };
        if claim.reserved_for.len() + pods.len() > MAX_RESERVED_FOR {
            return Err(format!(
                "ResourceClaim {ns}/{name} would be reserved for {} pods, more than the {MAX_RESERVED_FOR} a claim may serve",
                claim.reserved_for.len() + pods.len()
            ));
        }
        let choice = decision.shared_claims.iter().find(|c| c.claim.name == *name && c.claim.namespace == ns);
        let (allocation, devices) = match (&claim.allocation, choice) {
            (Some(a), _) => (None, allocated_devices(a)),
            (None, Some(c)) => {
                let request =
                    inventory.request_of(&claim.spec).map_err(|e| format!("ResourceClaim {ns}/{name}: {e}"))?;
                (Some(inventory.shared_allocation(&request, &c.devices, &c.reach)), c.devices.clone())
            }
            (None, None) => return Err(format!("ResourceClaim {ns}/{name} has no devices chosen")),
        };
        let missing: Vec<(String, String)> =
            pods.iter().filter(|(_, uid)| !claim.reserved_for.contains(uid)).cloned().collect();
        if allocation.is_none() && missing.is_empty() {
            continue;
        }
        out.push(ClaimWrite { name: name.clone(), allocation, devices, pods: missing });
    }
    Ok(out)
}

/// The most consumers one claim may list in `status.reservedFor` (the API's limit).
pub const MAX_RESERVED_FOR: usize = 256;

/// Why muster does not allocate a claim for parts of GPUs or ComputeDomain channels.
const LEFT_TO_KUBE_SCHEDULER: &str = "muster allocates whole GPUs only and never hands out a part of a GPU or a \
     ComputeDomain channel, which need their driver's own placement rules; kube-scheduler allocates such a claim: run the \
     job in upstream mode (annotation batch.muster.dev/scheduling-api: upstream) or as pods muster does not gang";

/// A device of a plan's claim that another claim holds too: the plan lost it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceLoss {
    /// The plan's claim.
    pub claim: ClaimKey,
    /// The device both claims name.
    pub device: DeviceId,
    /// The other claim.
    pub other: ClaimKey,
}

impl std::fmt::Display for DeviceLoss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "device {} of ResourceClaim {} is also allocated to ResourceClaim {} (another allocator wrote it at the same moment); this attempt lost it",
            self.device, self.claim, self.other
        )
    }
}

impl Dra {
    /// The first device of the claims `names` (in `ns`, a plan's own and shared claims) that a
    /// claim outside them is allocated too, if any: muster and kube-scheduler wrote the same
    /// device into two claims at the same moment, and the plan is the side that lost.
    pub fn lost_device<'a>(&self, ns: &str, names: impl IntoIterator<Item = &'a String>) -> Option<DeviceLoss> {
        let inventory = self.inventory.as_ref().filter(|i| i.any_contested())?;
        let names: Vec<&String> = names.into_iter().collect();
        let ours = |c: &ClaimKey| c.namespace == ns && names.iter().any(|n| **n == c.name);
        names.iter().find_map(|name| {
            let claim = ClaimKey { namespace: ns.to_string(), name: (*name).clone() };
            let allocation = self.claim(ns, name)?.allocation.as_ref()?;
            allocated_devices(allocation).into_iter().find_map(|device| {
                let other = inventory.rivals(&device, &claim).find(|o| !ours(o))?.clone();
                Some(DeviceLoss { claim: claim.clone(), device, other })
            })
        })
    }

    /// Why a named claim cannot also serve `new_pods` more pods in muster's own mode, if it
    /// cannot: every pod is listed in `status.reservedFor`, which holds at most
    /// [`MAX_RESERVED_FOR`] consumers, and kube-scheduler and kubelet accept a reservation for
    /// a whole PodGroup only from a `scheduling.k8s.io` PodGroup the pods name (upstream mode).
    pub fn reservation_problem(&self, ns: &str, name: &str, new_pods: usize) -> Option<String> {
        let reserved = self.claim(ns, name).map_or(0, |c| c.reserved_for.len());
        (reserved + new_pods > MAX_RESERVED_FOR).then(|| {
            format!(
                "ResourceClaim {ns}/{name} would serve {} pods ({new_pods} of this gang, {reserved} reserved already), \
                 more than the {MAX_RESERVED_FOR} consumers status.reservedFor may list; in muster's own mode each pod is \
                 reserved on its own. Run the job in upstream mode (annotation batch.muster.dev/scheduling-api: upstream), \
                 where kube-scheduler reserves the claim for the PodGroup, or split the claim",
                reserved + new_pods
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::dra::fixtures::Shape;
    use crate::devices::dra::{NVIDIA_GPU_DRIVER, fixtures, nvidia};
    use serde_json::json;

    fn claim(name: &str, devices: &[&str], reserved: &[&str]) -> ResourceClaim {
        let results: Vec<serde_json::Value> = devices
            .iter()
            .map(|d| json!({"request": "gpus", "driver": "gpu.nvidia.com", "pool": "n1", "device": d}))
            .collect();
        let reserved: Vec<serde_json::Value> =
            reserved.iter().map(|u| json!({"resource": "pods", "name": u, "uid": u})).collect();
        let mut c = json!({
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}]}},
        });
        if !devices.is_empty() {
            c["status"] = json!({"allocation": {"devices": {"results": results}}, "reservedFor": reserved});
        }
        serde_json::from_value(c).unwrap()
    }

    fn dra(claims: &[ResourceClaim]) -> Dra {
        let gpus: Vec<(usize, String)> = (0..4).map(|i| (i, format!("GPU-{i}"))).collect();
        let gpus: Vec<(usize, &str)> = gpus.iter().map(|(i, u)| (*i, u.as_str())).collect();
        let slice = fixtures::nvidia_slice("n1", &gpus, 1);
        let inventory =
            Inventory::new(&[slice], &[fixtures::nvidia_device_class()], claims, NVIDIA_GPU_DRIVER, &HashMap::new());
        Dra::new(inventory, &[], claims)
    }

    fn planned(claim: &str, indices: &str) -> PlannedPod {
        PlannedPod {
            name: "p".into(),
            uid: "p".into(),
            node: "n1".into(),
            gpu_indices: Some(indices.into()),
            claims: vec![claim.into()],
            ..Default::default()
        }
    }

    #[test]
    fn own_claim_writes_allocate_once_and_never_over_other_devices() {
        // Not allocated: the planned indices' devices, reserved for the pod.
        let fresh = dra(&[claim("c", &[], &[])]);
        let writes = own_writes("ns", &planned("c", "1,3"), &fresh).unwrap();
        assert_eq!(writes.len(), 1);
        let names: Vec<&str> = writes[0].devices.iter().map(|d| d.device.as_str()).collect();
        assert_eq!(names, ["gpu-1", "gpu-3"]);
        assert!(writes[0].allocation.is_some());
        assert_eq!(writes[0].pods, [("p".to_string(), "p".to_string())]);

        // Allocated as planned before a restart: nothing to write; not reserved yet: reserve only.
        let done = dra(&[claim("c", &["gpu-3", "gpu-1"], &["p"])]);
        assert_eq!(own_writes("ns", &planned("c", "1,3"), &done).unwrap(), vec![]);
        let unreserved = dra(&[claim("c", &["gpu-1", "gpu-3"], &[])]);
        let writes = own_writes("ns", &planned("c", "1,3"), &unreserved).unwrap();
        assert_eq!((writes.len(), writes[0].allocation.is_none()), (1, true));

        // Allocated other devices: never written over.
        let other = dra(&[claim("c", &["gpu-0", "gpu-1"], &["p"])]);
        let err = own_writes("ns", &planned("c", "1,3"), &other).unwrap_err();
        assert!(err.contains("allocated other devices than planned"), "{err}");
        // Gone: the plan cannot go on.
        let err = own_writes("ns", &planned("gone", "1,3"), &fresh).unwrap_err();
        assert!(err.contains("ResourceClaim ns/gone"), "{err}");
    }

    // === MIG, ComputeDomain, contested devices, reservedFor limit (both driver shapes) ===

    /// A claim `name` of `class`, allocated the `devices` of pool `n1` when any.
    fn class_claim(name: &str, class: &str, devices: &[&str]) -> ResourceClaim {
        let results: Vec<serde_json::Value> = devices
            .iter()
            .map(|d| json!({"request": "r", "driver": NVIDIA_GPU_DRIVER, "pool": "n1", "device": d}))
            .collect();
        let mut c = json!({
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": class, "count": 1}}]}},
        });
        if !devices.is_empty() {
            c["status"] = json!({"allocation": {"devices": {"results": results}}});
        }
        serde_json::from_value(c).unwrap()
    }

    fn class_template(name: &str, class: &str) -> ResourceClaimTemplate {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": class, "count": 1}}]}}},
        }))
        .unwrap()
    }

    /// Node n1 in `shape`: GPUs 0-3, GPU 1 in MIG mode (one `1g.10gb` device), and the
    /// ComputeDomain plugin's slice; the GPU, MIG and ComputeDomain channel classes.
    fn partitioned(shape: Shape, templates: &[ResourceClaimTemplate], claims: &[ResourceClaim]) -> Dra {
        let gpus: Vec<(usize, String)> = (0..4).map(|i| (i, format!("GPU-{i}"))).collect();
        let gpus: Vec<(usize, &str)> = gpus.iter().map(|(i, u)| (*i, u.as_str())).collect();
        let slices =
            [fixtures::nvidia_slice_with_mig("n1", &gpus, &[1], 1, shape), fixtures::compute_domain_slice("n1")];
        let classes =
            [fixtures::nvidia_device_class(), nvidia::mig_device_class(), nvidia::compute_domain_channel_class()];
        let inventory = Inventory::new(&slices, &classes, claims, NVIDIA_GPU_DRIVER, &HashMap::new());
        Dra::new(inventory, templates, claims)
    }

    fn resolve_one(dra: &Dra, source: ClaimSource) -> Result<ShapeClaims, String> {
        let claims = [PodClaim { name: "c".into(), source }];
        dra.resolve("ns", &claims, &mut BTreeMap::new(), &mut HashSet::new())
    }

    #[test]
    fn claims_for_mig_or_compute_domain_devices_are_refused_with_a_reason() {
        let table: &[(&str, &str)] =
            &[(nvidia::MIG_DEVICE_CLASS, "MIG devices"), (nvidia::COMPUTE_DOMAIN_CHANNEL_CLASS, "ComputeDomain")];
        for shape in Shape::ALL {
            for (class, what) in table {
                let dra = partitioned(shape, &[class_template("t", class)], &[class_claim("shared", class, &[])]);
                for (source, object) in [
                    (ClaimSource::Template("t".into()), "ResourceClaimTemplate ns/t"),
                    (ClaimSource::Claim("shared".into()), "ResourceClaim ns/shared"),
                ] {
                    let why = match resolve_one(&dra, source.clone()) {
                        Err(why) => why,
                        Ok(c) => panic!("{shape}: {class} {source:?} resolved: {:?} {:?}", c.gpu, c.shared),
                    };
                    assert!(why.starts_with(object), "{shape}: {class}: {why}");
                    assert!(why.contains(&format!("asks for {what}")), "{shape}: {class}: {why}");
                    assert!(why.contains(&format!("(class {class:?})")), "{shape}: {class}: {why}");
                    assert!(why.contains("whole GPUs only") && why.contains("upstream mode"), "{shape}: {why}");
                }
            }
            // The GPU class on the same node still resolves, to whole GPUs only.
            let dra = partitioned(shape, &[class_template("t", NVIDIA_GPU_DRIVER)], &[]);
            let claims = resolve_one(&dra, ClaimSource::Template("t".into()))
                .unwrap_or_else(|e| panic!("{shape}: GPU template refused: {e}"));
            let offered = dra.offered(&claims, "n1", &HashSet::new());
            assert_eq!(offered.iter().collect::<Vec<_>>(), vec![0, 2, 3], "{shape}: the MIG parent is not a GPU");
        }
    }

    #[test]
    fn an_allocated_shared_claim_with_a_contested_device_waits() {
        for shape in Shape::ALL {
            let ours = class_claim("shared", NVIDIA_GPU_DRIVER, &["gpu-2"]);
            let theirs = class_claim("theirs", NVIDIA_GPU_DRIVER, &["gpu-2"]);
            let dra = partitioned(shape, &[], &[ours.clone(), theirs]);
            let why = resolve_one(&dra, ClaimSource::Claim("shared".into()))
                .err()
                .unwrap_or_else(|| panic!("{shape}: a contested claim resolved"));
            assert!(
                why.contains("gpu.nvidia.com/n1/gpu-2 is also allocated to ResourceClaim ns/theirs"),
                "{shape}: {why}"
            );
            assert!(why.contains("waiting"), "{shape}: {why}");
            // Alone, the same claim resolves to its allocation.
            let dra = partitioned(shape, &[], &[ours]);
            let claims = resolve_one(&dra, ClaimSource::Claim("shared".into()))
                .unwrap_or_else(|e| panic!("{shape}: uncontested claim refused: {e}"));
            assert_eq!(claims.shared.len(), 1, "{shape}");
            assert!(!claims.shared[0].allocate, "{shape}: allocated already");
        }
    }

    #[test]
    fn lost_device_names_the_other_claim_only_outside_the_plan() {
        for shape in Shape::ALL {
            let a = class_claim("a", NVIDIA_GPU_DRIVER, &["gpu-0", "gpu-2"]);
            let b = class_claim("b", NVIDIA_GPU_DRIVER, &["gpu-2"]);
            let c = class_claim("c", NVIDIA_GPU_DRIVER, &["gpu-3"]);
            let dra = partitioned(shape, &[], &[a, b, c]);
            let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<String>>();
            let key = |n: &str| ClaimKey { namespace: "ns".into(), name: n.into() };
            let gpu2 = DeviceId { driver: NVIDIA_GPU_DRIVER.into(), pool: "n1".into(), device: "gpu-2".into() };
            // (rule, the plan's claims, the loss).
            let table: Vec<(&str, Vec<String>, Option<DeviceLoss>)> = vec![
                (
                    "the plan holds a: b took gpu-2 too",
                    names(&["a"]),
                    Some(DeviceLoss { claim: key("a"), device: gpu2.clone(), other: key("b") }),
                ),
                (
                    "the plan holds b: a took gpu-2 too",
                    names(&["c", "b"]),
                    Some(DeviceLoss { claim: key("b"), device: gpu2.clone(), other: key("a") }),
                ),
                ("both claims are the plan's: nothing lost to another allocator", names(&["a", "b"]), None),
                ("an uncontested claim", names(&["c"]), None),
                ("a claim that does not exist", names(&["gone"]), None),
            ];
            for (rule, plan, want) in table {
                let got = dra.lost_device("ns", plan.iter());
                assert_eq!(got, want, "{shape}: {rule}");
                if let Some(loss) = got {
                    let text = loss.to_string();
                    assert!(text.contains("also allocated to ResourceClaim ns/") && text.contains("lost"), "{text}");
                }
            }
            assert_eq!(dra.lost_device("other", names(&["a"]).iter()), None, "{shape}: another namespace");
            // Nothing contested anywhere: never a loss.
            let quiet = partitioned(shape, &[], &[class_claim("a", NVIDIA_GPU_DRIVER, &["gpu-0"])]);
            assert_eq!(quiet.lost_device("ns", names(&["a"]).iter()), None, "{shape}");
        }
    }

    #[test]
    fn reservation_problem_at_the_256_boundaries() {
        let reserved: Vec<String> = (0..200).map(|i| format!("u{i}")).collect();
        let reserved: Vec<&str> = reserved.iter().map(String::as_str).collect();
        // (rule, reserved already, new pods, refused).
        let table: &[(&str, usize, usize, bool)] = &[
            ("256 new, none reserved", 0, 256, false),
            ("257 new, none reserved", 0, 257, true),
            ("255 new + 1 reserved", 1, 255, false),
            ("256 new + 1 reserved", 1, 256, true),
            ("56 new + 200 reserved", 200, 56, false),
            ("57 new + 200 reserved", 200, 57, true),
            ("300 new", 0, 300, true),
        ];
        for (rule, held, new_pods, refused) in table {
            let dra = dra(&[claim("c", &["gpu-0"], &reserved[..*held])]);
            let got = dra.reservation_problem("ns", "c", *new_pods);
            assert_eq!(got.is_some(), *refused, "{rule}: {got:?}");
            if let Some(why) = got {
                let serve =
                    format!("would serve {} pods ({new_pods} of this gang, {held} reserved already)", new_pods + held);
                assert!(why.starts_with("ResourceClaim ns/c ") && why.contains(&serve), "{rule}: {why}");
                assert!(why.contains("256") && why.contains("upstream mode"), "{rule}: {why}");
            }
        }
        // A claim that does not exist has nobody reserved yet.
        assert_eq!(dra(&[]).reservation_problem("ns", "nope", 256), None);
        assert!(dra(&[]).reservation_problem("ns", "nope", 257).is_some());
    }
}

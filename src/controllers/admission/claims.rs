//! DRA claims at admission: the inventory a cycle decides on, and the claim writes of a commit.
//! A claim is allocated (its finalizer, then `status.allocation` and `status.reservedFor` in one
//! status write, as kube-scheduler does) before its pod is ungated, so kube-scheduler honours
//! the allocation and the node's driver prepares exactly the devices muster chose; the claims
//! of a plan dropped before any pod started are freed again. Once pods run, freeing is
//! kube-controller-manager's resource-claim controller's: it drops finished and deleted pods
//! from `reservedFor`, clears the allocation of a claim no pod uses (the finalizer marks it
//! as allocated the structured way) and deletes claims made for a pod that is gone.

use std::collections::{HashMap, HashSet};
use std::time::{Instant, SystemTime};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaim};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::commit::Patched;
use super::{Admitter, World, state};
use crate::controllers::context::{Error, Result, bounded};
use crate::crds::scheduling::{AdmissionPlan, PlannedPod};
use crate::devices::chooser::NodeGpus;
use crate::devices::dra::{DELETE_PROTECTION_FINALIZER, DeviceId, Inventory, NVIDIA_GPU_DRIVER, allocated_devices};
use crate::devices::{GpuTopology, healthy_mask, parse_indices};
use crate::scheduler::{ClaimSource, Decision, Dra, pod_claims};

/// One claim write of a commit: the allocation to write (none when the claim is allocated
/// already and only pods are to be added to `reservedFor`) and the pods it is reserved for.
#[derive(Clone, Debug)]
pub(super) struct ClaimWrite {
    pub name: String,
    pub allocation: Option<AllocationResult>,
    pub devices: Vec<DeviceId>,
    /// (name, uid) of the pods it is for.
    pub pods: Vec<(String, String)>,
}

/// The claim writes a pod's own GPU claims need before the pod is ungated as `planned` says:
/// the devices of its planned GPU indices. Empty when the claims are allocated that way already;
/// an error (the gang waits or the plan is re-checked) when a claim is missing, not made yet or
/// allocated otherwise.
pub(super) fn own_writes(ns: &str, planned: &PlannedPod, dra: &Dra) -> std::result::Result<Vec<ClaimWrite>, String> {
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
pub(super) fn own_claim_names(pod: &Pod, dra: &Dra) -> std::result::Result<Vec<String>, String> {
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
pub(super) fn shared_writes(
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
pub(super) const MAX_RESERVED_FOR: usize = 256;

fn consumers(pods: &[(String, String)]) -> Vec<serde_json::Value> {
    pods.iter().map(|(name, uid)| json!({"resource": "pods", "name": name, "uid": uid})).collect()
}

impl Admitter {
    /// The cluster's DRA state for this cycle, from the caches. GPU nodes known only from their
    /// slices (no `nvidia.com/gpu`, no topology annotation) get an unknown topology of as many
    /// GPUs as their highest device index says, with health from the metrics.
    pub(super) fn dra_state(&mut self, nodes: &[Node], gpus: &mut HashMap<String, NodeGpus>) -> Dra {
        let Some(caches) = &self.caches.dra else { return Dra::default() };
        let slices = state(&caches.slices);
        let classes = state(&caches.device_classes);
        let claims = state(&caches.claims);
        let templates = state(&caches.templates);
        let uuid_index: HashMap<String, HashMap<String, usize>> = gpus
            .iter()
            .map(|(node, g)| {
                let by_uuid = g
                    .topology
                    .gpus()
                    .iter()
                    .enumerate()
                    .filter_map(|(i, gpu)| gpu.uuid.clone().map(|u| (u, i)))
                    .collect();
                (node.clone(), by_uuid)
            })
            .collect();
        let inventory = Inventory::new(&slices, &classes, &claims, NVIDIA_GPU_DRIVER, &uuid_index);
        let thresholds = self.thresholds();
        let now = SystemTime::now();
        for node in nodes {
            let Some(name) = node.metadata.name.as_deref() else { continue };
            let count = inventory.node_gpus(name).iter().max().map_or(0, |i| i + 1);
            if count == 0 || gpus.get(name).is_some_and(|g| g.topology.len() >= count) {
                continue;
            }
            let topology = GpuTopology::unknown(count);
            let health = healthy_mask(&topology, self.gpu_metrics.node(name), &thresholds, now);
            gpus.insert(name.to_string(), NodeGpus { topology, topology_problem: None, health });
        }
        let problems: Vec<String> = inventory.problems().iter().map(ToString::to_string).collect();
        if problems != self.dra_problems {
            for p in problems.iter().filter(|p| !self.dra_problems.contains(p)) {
                tracing::warn!(problem = %p, "DRA device not offered");
            }
            self.dra_problems = problems;
        }
        Dra::new(inventory, &templates, &claims)
    }

    /// Allocates (or reserves) one claim: its finalizer, then allocation and `reservedFor` in
    /// one status write, each fenced by the claim's resourceVersion. A claim allocated
    /// meanwhile with other devices, changed or gone is stale: the caller decides again.
    pub(super) async fn write_claim(&mut self, ns: &str, w: &ClaimWrite) -> Result<Patched> {
        let api = Api::<ResourceClaim>::namespaced(self.ctx.client.clone(), ns);
        let claim = match bounded(api.get(&w.name)).await {
            Ok(c) => c,
            Err(Error::Kube(kube::Error::Api(e))) if e.code == 404 => return Ok(Patched::Stale),
            Err(e) => return Err(e),
        };
        let status = claim.status.clone().unwrap_or_default();
        match (&status.allocation, &w.allocation) {
            (Some(now), _) if allocated_devices(now) != w.devices => return Ok(Patched::Stale),
            (None, None) => return Ok(Patched::Stale),
            _ => {}
        }
        let mut version = claim.metadata.resource_version.clone();
        let mut finalizers = claim.metadata.finalizers.clone().unwrap_or_default();
        if !finalizers.iter().any(|f| f == DELETE_PROTECTION_FINALIZER) {
            finalizers.push(DELETE_PROTECTION_FINALIZER.to_string());
            let patch = json!({"metadata": {"resourceVersion": version, "finalizers": finalizers}});
            match bounded(api.patch(&w.name, &PatchParams::default(), &Patch::Merge(&patch))).await {
                Ok(c) => version = c.metadata.resource_version,
                Err(e) => return super::commit::patched(Err(e)),
            }
        }
        let mut reserved: Vec<serde_json::Value> =
            status.reserved_for.iter().flatten().map(|r| serde_json::to_value(r).unwrap_or_default()).collect();
        let known: HashSet<&str> = status.reserved_for.iter().flatten().map(|r| r.uid.as_str()).collect();
        let new: Vec<(String, String)> =
            w.pods.iter().filter(|(_, uid)| !known.contains(uid.as_str())).cloned().collect();
        reserved.extend(consumers(&new));
        let mut body = json!({"metadata": {"resourceVersion": version}, "status": {"reservedFor": reserved}});
        if status.allocation.is_none()
            && let Some(a) = &w.allocation
        {
            body["status"]["allocation"] = serde_json::to_value(a).unwrap_or_default();
        }
        let result = bounded(api.patch_status(&w.name, &PatchParams::default(), &Patch::Merge(&body))).await;
        let outcome = super::commit::patched(result.map(|_| ()))?;
        if matches!(outcome, Patched::Ok) {
            self.unseen.claims.insert((ns.to_string(), w.name.clone()), (true, Instant::now()));
            tracing::info!(namespace = %ns, claim = %w.name, devices = w.devices.len(), pods = w.pods.len(), "claim allocated");
            self.count_write();
        }
        Ok(outcome)
    }

    /// Frees the claims a plan allocated whose pods never started (the plan is dropped): the
    /// allocation and `reservedFor` cleared, then the finalizer removed. A claim some pod
    /// outside the plan (or an ungated one) is reserved for is left alone.
    pub(super) async fn free_claims(&mut self, ns: &str, plan: &AdmissionPlan, world: &World<'_>) -> Result<()> {
        let planned: HashSet<&str> = plan.pods.iter().map(|p| p.uid.as_str()).collect();
        let gated = |uid: &str| world.pods_by_uid.get(uid).is_none_or(|p| super::is_gated(p));
        let names = plan.pods.iter().flat_map(|p| p.claims.iter()).chain(plan.shared_claims.iter());
        let api = Api::<ResourceClaim>::namespaced(self.ctx.client.clone(), ns);
        for name in names {
            let claim = match bounded(api.get(name)).await {
                Ok(c) => c,
                Err(Error::Kube(kube::Error::Api(e))) if e.code == 404 => continue,
                Err(e) => return Err(e),
            };
            let status = claim.status.clone().unwrap_or_default();
            let reserved: Vec<&str> = status.reserved_for.iter().flatten().map(|r| r.uid.as_str()).collect();
            if status.allocation.is_none() || !reserved.iter().all(|u| planned.contains(u) && gated(u)) {
                continue;
            }
            let body = json!({"metadata": {"resourceVersion": claim.metadata.resource_version},
                              "status": {"allocation": null, "reservedFor": null}});
            let result = bounded(api.patch_status(name, &PatchParams::default(), &Patch::Merge(&body))).await;
            let Ok(freed) = result else {
                match super::commit::patched(result.map(|_| ()))? {
                    Patched::Ok | Patched::Stale => continue,
                    Patched::Refused(m) => {
                        tracing::warn!(namespace = %ns, claim = %name, error = %m, "could not free a claim of a dropped plan");
                        continue;
                    }
                }
            };
            self.unseen.claims.insert((ns.to_string(), name.clone()), (false, Instant::now()));
            let finalizers: Vec<String> = freed
                .metadata
                .finalizers
                .clone()
                .unwrap_or_default()
                .into_iter()
                .filter(|f| f != DELETE_PROTECTION_FINALIZER)
                .collect();
            let patch =
                json!({"metadata": {"resourceVersion": freed.metadata.resource_version, "finalizers": finalizers}});
            let result = bounded(api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))).await;
            super::commit::patched(result.map(|_| ()))?;
            tracing::info!(namespace = %ns, claim = %name, "freed the claim of a dropped plan");
        }
        Ok(())
    }
}

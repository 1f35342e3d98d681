//! DRA claims at admission: the inventory a cycle decides on, and the claim writes of a commit.
//! A claim is allocated (its finalizer, then `status.allocation` and `status.reservedFor` in one
//! status write, as kube-scheduler does) before its pod is ungated, so kube-scheduler honours
//! the allocation and the node's driver prepares exactly the devices muster chose; the claims
//! of a plan dropped before any pod started are freed again. Once pods run, freeing is
//! kube-controller-manager's resource-claim controller's: it drops finished and deleted pods
//! from `reservedFor`, clears the allocation of a claim no pod uses (the finalizer marks it
//! as allocated the structured way) and deletes claims made for a pod that is gone.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Instant, SystemTime};

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::{Admitter, DraState, Patched, World, Writer, patched, state};
use crate::controllers::context::{Error, Result, bounded};
use crate::controllers::lean_writes;
use crate::crds::scheduling::AdmissionPlan;
use crate::devices::chooser::{GpuNode, NodeGpus};
use crate::devices::dra::{DELETE_PROTECTION_FINALIZER, Inventory, NVIDIA_GPU_DRIVER, allocated_devices};
use crate::devices::{GpuTopology, healthy_mask};
use crate::scheduler::{ClaimWrite, Dra};

fn consumers(pods: &[(String, String)]) -> Vec<serde_json::Value> {
    pods.iter().map(|(name, uid)| json!({"resource": "pods", "name": name, "uid": uid})).collect()
}

impl Admitter {
    /// The cluster's DRA state for this cycle, from the caches. A device is joined to its GPU
    /// by `uuid` where the node's model is its topology annotation (the node agent's), else by
    /// its slot (the driver's index, else its device minor; the model is then the driver's
    /// locality, see `devices::dra::PublishedGpus`). A node whose model has fewer GPUs than its
    /// devices name (the slices changed since the models were built) gets an unknown topology
    /// of as many GPUs until the next cycle, with health from the metrics.
    pub(super) fn dra_state(&mut self, nodes: &[(String, Arc<GpuNode>)]) -> Arc<Dra> {
        let Some(caches) = &self.caches.dra else { return Arc::default() };
        // Only nodes that publish devices are joined by UUID: building (and comparing) the
        // index of every GPU node each cycle was a large share of a cycle at 5,000 nodes.
        let sliced: HashSet<String> = caches.slices.state().iter().filter_map(|s| s.spec.node_name.clone()).collect();
        let gpus = self.gpu_models.shared();
        let uuid_index: HashMap<String, HashMap<String, usize>> = sliced
            .iter()
            .filter_map(|node| gpus.get(node).map(|(_, g)| (node, g)))
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
        // Read before the stores: an event after this rebuilds the state next cycle.
        let changes = caches.changes.load(Ordering::Relaxed);
        let dra = match &self.dra_cache {
            // Nothing DRA changed and the GPU models join the same: the state (and the CEL
            // results it has worked out) serves this cycle too.
            Some(c) if c.changes == changes && c.uuid_index == uuid_index => c.dra.clone(),
            _ => {
                let slices = state(&caches.slices);
                let classes = state(&caches.device_classes);
                let claims = state(&caches.claims);
                let templates = state(&caches.templates);
                let inventory = Inventory::new(&slices, &classes, &claims, NVIDIA_GPU_DRIVER, &uuid_index);
                let problems: Vec<String> = inventory.problems().iter().map(ToString::to_string).collect();
                if problems != self.dra_problems {
                    for p in problems.iter().filter(|p| !self.dra_problems.contains(p)) {
                        tracing::warn!(problem = %p, "DRA device not offered");
                    }
                    self.dra_problems = problems;
                }
                let dra = Arc::new(Dra::new(inventory, &templates, &claims));
                self.dra_cache = Some(DraState { changes, uuid_index, dra: dra.clone() });
                dra
            }
        };
        let thresholds = self.thresholds();
        let now = SystemTime::now();
        let mut replaced = Vec::new();
        if let Some(inventory) = dra.inventory() {
            for (name, _) in nodes {
                let name = name.as_str();
                let count = inventory.node_gpus(name).iter().max().map_or(0, |i| i + 1);
                if count == 0 || gpus.get(name).is_some_and(|(_, g)| g.topology.len() >= count) {
                    continue;
                }
                let topology = GpuTopology::unknown(count);
                let health = healthy_mask(&topology, self.gpu_metrics.node(name), &thresholds, now);
                replaced.push((name, NodeGpus::from_model(topology, None, health)));
            }
        }
        drop(gpus);
        for (name, model) in replaced {
            self.gpu_models.replace(name, model, &self.fits);
        }
        dra
    }
}

impl Writer {
    /// Allocates (or reserves) one claim: its finalizer, then allocation and `reservedFor` in
    /// one status write, each fenced by the claim's resourceVersion. A claim allocated
    /// meanwhile with other devices, changed or gone is stale: the caller decides again.
    pub(super) async fn write_claim(&self, ns: &str, w: &ClaimWrite) -> Result<Patched> {
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
            match bounded(api.patch_metadata(&w.name, &PatchParams::default(), &Patch::Merge(&patch))).await {
                Ok(c) => version = c.metadata.resource_version,
                Err(e) => return patched(Err(e)),
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
        let result =
            bounded(lean_writes::patch_status(&api, &w.name, &PatchParams::default(), &Patch::Merge(&body))).await;
        let outcome = patched(result.map(|_| ()))?;
        if matches!(outcome, Patched::Ok) {
            self.unseen().claims.insert((ns.to_string(), w.name.clone()), (true, Instant::now()));
            tracing::info!(namespace = %ns, claim = %w.name, devices = w.devices.len(), pods = w.pods.len(), "claim allocated");
            self.count_write();
        }
        Ok(outcome)
    }
}

impl Admitter {
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
            let result =
                bounded(lean_writes::patch_status(&api, name, &PatchParams::default(), &Patch::Merge(&body))).await;
            let Ok(freed) = result else {
                match patched(result.map(|_| ()))? {
                    Patched::Ok | Patched::Stale => continue,
                    Patched::Refused(m) => {
                        tracing::warn!(namespace = %ns, claim = %name, error = %m, "could not free a claim of a dropped plan");
                        continue;
                    }
                }
            };
            self.writer.unseen().claims.insert((ns.to_string(), name.clone()), (false, Instant::now()));
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
            let result = bounded(api.patch_metadata(name, &PatchParams::default(), &Patch::Merge(&patch))).await;
            patched(result.map(|_| ()))?;
            tracing::info!(namespace = %ns, claim = %name, "freed the claim of a dropped plan");
        }
        Ok(())
    }
}

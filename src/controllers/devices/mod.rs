//! The device-annotation reconciler: keeps the GPU ledger true. It gives concrete indices to
//! GPU pods that were bound without muster's admission, forgets the indices of finished and
//! deleted pods at once (the ledger is rebuilt from live pods), reports a GPU claimed by two
//! live pods as a conflict (event + `muster_gpu_conflicts`), and exports per-node GPU gauges.
//! It runs on the leader, right after each admission cycle, on the same watch caches.

pub mod prometheus;

use std::collections::{HashMap, HashSet};

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::context::{Context, Result};
use super::metrics::NodeLabels;
use crate::crds::{GPU_INDICES_ANNOTATION, GPU_RESOURCE};
use crate::devices::chooser::NodeGpus;
use crate::devices::{GpuSet, Ledger, LedgerProblem, PodRecord, SelectOptions, format_indices, select};
use crate::pods::{Placement, PodClass};
use crate::scheduler::Snapshot;

/// GPUs a pod asks for: the largest of its containers' requests/limits sum, as kubelet counts.
pub fn gpus_wanted(pod: &Pod) -> u64 {
    let Some(spec) = pod.spec.as_ref() else { return 0 };
    let of = |c: &k8s_openapi::api::core::v1::Container| {
        let r = c.resources.as_ref();
        let get = |m: Option<
            &std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
        >| {
            m.and_then(|m| m.get(GPU_RESOURCE)).and_then(|q| q.0.trim().parse::<u64>().ok()).unwrap_or(0)
        };
        get(r.and_then(|r| r.limits.as_ref())).max(get(r.and_then(|r| r.requests.as_ref())))
    };
    let containers: u64 = spec.containers.iter().map(of).sum();
    let init = spec.init_containers.iter().flatten().map(of).max().unwrap_or(0);
    containers.max(init)
}

/// The node a pod holds GPUs on: where it is bound, or where admission pinned it.
fn node_of(pod: &Pod, snapshot: &Snapshot) -> Option<String> {
    let class = PodClass::of(pod);
    match class.placement {
        _ if class.finished() => None,
        Placement::Bound(node) => Some(node),
        Placement::Admitted(host) => snapshot.node_by_hostname(&host).map(|n| n.name.clone()),
        Placement::Gated | Placement::Unpinned => None,
    }
}

/// State kept between passes: which problems were already reported.
#[derive(Default)]
pub struct DeviceReconciler {
    reported: HashSet<String>,
}

fn pod_ref(pod: &Pod) -> ObjectReference {
    pod.object_ref(&())
}

impl DeviceReconciler {
    /// One pass over every pod. Returns the GPU indices held per node afterwards (including
    /// what this pass assigned), for admission to plan around.
    pub async fn pass(
        &mut self,
        ctx: &Context,
        pods: &[Pod],
        snapshot: &Snapshot,
        gpus: &HashMap<String, NodeGpus>,
    ) -> Result<HashMap<String, GpuSet>> {
        let located: Vec<(&Pod, String)> = pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| node_of(p, snapshot).map(|n| (p, n)))
            .collect();
        let records = located.iter().map(|(p, node)| PodRecord {
            node,
            uid: p.metadata.uid.as_deref().unwrap_or_default(),
            indices: p.annotations().get(GPU_INDICES_ANNOTATION).map(String::as_str),
            phase: crate::devices::PodPhase::from_status(p.status.as_ref().and_then(|s| s.phase.as_deref())),
            node_gpus: gpus.get(node).map(|g| g.topology.len()).unwrap_or(crate::devices::MAX_GPUS),
        });
        let (mut ledger, problems) = Ledger::rebuild(records);
        let by_uid: HashMap<&str, &Pod> =
            pods.iter().filter_map(|p| p.metadata.uid.as_deref().map(|u| (u, p))).collect();
        let mut still = HashSet::new();
        for problem in problems {
            let key = problem.to_string();
            still.insert(key.clone());
            if !self.reported.insert(key.clone()) {
                continue;
            }
            let (uid, conflict) = match &problem {
                LedgerProblem::Conflict(c) => (
                    match c {
                        crate::devices::Conflict::IndexHeld { pod_uid, .. }
                        | crate::devices::Conflict::AlreadyAssigned { pod_uid, .. } => pod_uid.clone(),
                    },
                    true,
                ),
                LedgerProblem::BadAnnotation { uid, .. } | LedgerProblem::NoNode { uid } => (uid.clone(), false),
            };
            if conflict {
                ctx.metrics.gpu_conflicts.inc();
            }
            tracing::warn!(problem = %key, "GPU ledger");
            if let Some(pod) = by_uid.get(uid.as_str()) {
                let reason = if conflict { "GPUConflict" } else { "BadGPUIndices" };
                ctx.event(&pod_ref(pod), true, reason, "AssignGPUs", key).await;
            }
        }
        self.reported.retain(|k| still.contains(k));

        // GPU pods kube-scheduler bound without muster: give them indices right after binding.
        for (pod, node) in &located {
            let live = !matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"));
            let bound = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty());
            let wanted = gpus_wanted(pod) as usize;
            if !live || !bound || wanted == 0 || pod.annotations().contains_key(GPU_INDICES_ANNOTATION) {
                continue;
            }
            let Some(node_gpus) = gpus.get(node) else { continue };
            let used = ledger.used_mask(node);
            let free = node_gpus.topology.all().difference(used);
            // Prefer healthy GPUs; the pod is bound already, so fall back to any free one.
            let choice = select(
                &node_gpus.topology,
                crate::devices::available(&node_gpus.health, used),
                wanted,
                SelectOptions::default(),
            )
            .or_else(|| select(&node_gpus.topology, free, wanted, SelectOptions::default()));
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let Some(choice) = choice else {
                let msg = format!(
                    "no {wanted} free GPU indices on node {node} for pod {}: the ledger holds {}",
                    pod.name_any(),
                    format_indices(used)
                );
                if self.reported.insert(format!("nofree/{uid}")) {
                    ctx.metrics.gpu_conflicts.inc();
                    ctx.event(&pod_ref(pod), true, "GPUConflict", "AssignGPUs", msg).await;
                }
                continue;
            };
            if ledger.assign(node, &uid, choice.gpus).is_err() {
                continue;
            }
            let indices = format_indices(choice.gpus);
            let patch = json!({"metadata": {"uid": uid, "annotations": {GPU_INDICES_ANNOTATION: indices}}});
            let api = Api::<Pod>::namespaced(ctx.client.clone(), &pod.namespace().unwrap_or_default());
            match api.patch(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => {
                    tracing::info!(pod = %pod.name_any(), node, indices, "assigned GPU indices to a pod bound without muster");
                    ctx.event(
                        &pod_ref(pod),
                        false,
                        "GPUsAssigned",
                        "AssignGPUs",
                        format!("GPU indices {indices} on node {node}"),
                    )
                    .await;
                }
                Err(kube::Error::Api(e)) if matches!(e.code, 404 | 409 | 422) => {}
                Err(e) => return Err(e.into()),
            }
        }

        let mut held = HashMap::new();
        for (node, g) in gpus {
            let labels = NodeLabels { node: node.clone() };
            let used: GpuSet = ledger.used_mask(node);
            ctx.metrics.gpus_total.get_or_create(&labels).set(g.topology.len() as i64);
            ctx.metrics.gpus_allocated.get_or_create(&labels).set(used.len() as i64);
            ctx.metrics.gpus_unhealthy.get_or_create(&labels).set(g.unhealthy().len() as i64);
            held.insert(node.clone(), used);
        }
        Ok(held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpus_wanted_counts_like_kubelet() {
        let pod: Pod = serde_json::from_value(json!({"spec": {
            "containers": [
                {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "2"}}},
                {"name": "b", "resources": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}}],
            "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}))
        .expect("pod");
        assert_eq!(gpus_wanted(&pod), 4);
        let none: Pod = serde_json::from_value(json!({"spec": {"containers": [{"name": "a"}]}})).expect("pod");
        assert_eq!(gpus_wanted(&none), 0);
    }
}

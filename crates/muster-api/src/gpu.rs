//! `gpu.muster.dev/v1alpha1`: NodeGPUReport, what `muster node-agent` measures on its node and
//! only muster reads (GPU health, what kubelet gave each pod). One per GPU node, named after
//! the node and owned by it (deleted with it). Kept off the Node object: health changes every
//! 30 s, and each Node write goes to every Node watcher of the cluster.
//!
//! `spec.health` and `spec.assigned` hold the versioned shapes the agent once wrote as the node
//! annotations `gpu.muster.dev/health` and `gpu.muster.dev/assigned`, as JSON objects (one
//! parser reads both places: `muster_core::devices::report`).

use kube::{CustomResource, KubeSchema};
use schemars::{Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// API group of the GPU report.
pub const GROUP: &str = "gpu.muster.dev";
/// API version of the GPU report.
pub const VERSION: &str = "v1alpha1";
/// Most GPUs one report samples.
pub const MAX_GPUS: usize = 64;
/// Most pods one report lists (kubelet's default is 110 pods a node).
pub const MAX_PODS: usize = 1024;

/// What the node agent reports of its node's GPUs.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[kube(
    group = "gpu.muster.dev",
    version = "v1alpha1",
    kind = "NodeGPUReport",
    plural = "nodegpureports",
    derive = "PartialEq",
    shortname = "ngr",
    category = "muster",
    doc = "What muster's node agent measures on one node (named after it, owned by it): per-GPU health and the GPUs kubelet gave each pod. Written only by the agent on that node; read only by muster.",
    printcolumn(name = "GPUs", type_ = "integer", json_path = ".spec.gpus", description = "GPUs sampled"),
    printcolumn(name = "Pods", type_ = "integer", json_path = ".spec.pods", description = "pods holding GPUs"),
    printcolumn(
        name = "Observed",
        type_ = "date",
        json_path = ".spec.health.observedAt",
        description = "when health was sampled"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct NodeGPUReportSpec {
    /// GPUs in the health sample (for `kubectl get`; muster reads `health`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 64))]
    pub gpus: Option<u32>,
    /// Pods holding GPUs in `assigned` (for `kubectl get`; muster reads `assigned`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 1024))]
    pub pods: Option<u32>,
    /// Per-GPU health from NVML: the shape of the `gpu.muster.dev/health` annotation
    /// (`{"version":1,"observedAt":..,"gpus":[{"index":0,"temperatureC":..,..}]}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "health_schema")]
    pub health: Option<serde_json::Value>,
    /// What kubelet gave each pod: the shape of the `gpu.muster.dev/assigned` annotation
    /// (`{"version":2,"resource":"nvidia.com/gpu","pods":{"ns/name":{"devices":[..]}}}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "assigned_schema")]
    pub assigned: Option<serde_json::Value>,
}

fn health_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "description": "Per-GPU health (the gpu.muster.dev/health shape).",
        "required": ["version"],
        "properties": {
            "version": {"type": "integer", "minimum": 0, "maximum": 1000},
            "observedAt": {"type": "string", "maxLength": 64},
            "gpus": {
                "type": "array",
                "maxItems": MAX_GPUS,
                "items": {
                    "type": "object",
                    "x-kubernetes-preserve-unknown-fields": true,
                    "properties": {
                        "index": {"type": "integer", "minimum": 0, "maximum": 1024},
                        "temperatureC": {"type": "number"},
                        "memoryFreeFraction": {"type": "number"},
                        "utilization": {"type": "number"},
                    },
                },
            },
        },
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

fn assigned_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "description": "Per pod, the devices kubelet gave it (the gpu.muster.dev/assigned shape).",
        "required": ["version"],
        "properties": {
            "version": {"type": "integer", "minimum": 0, "maximum": 1000},
            "resource": {"type": "string", "maxLength": 253},
            "pods": {
                "type": "object",
                // Server-side apply of an empty map over one with entries leaves null
                // (kube-apiserver 1.37.2): the agent's report of a node whose GPU pods all ended.
                "nullable": true,
                "maxProperties": MAX_PODS,
                "additionalProperties": {
                    "type": "object",
                    "x-kubernetes-preserve-unknown-fields": true,
                    "properties": {
                        "devices": {
                            "type": "array",
                            "maxItems": MAX_GPUS * 8,
                            "items": {"type": "string", "maxLength": 256},
                        },
                    },
                },
            },
        },
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt;

    #[test]
    fn the_report_is_cluster_scoped_and_bounded() {
        let crd = serde_json::to_value(super::NodeGPUReport::crd()).unwrap_or_default();
        assert_eq!(crd["spec"]["scope"], "Cluster");
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
        assert_eq!(spec["health"]["properties"]["gpus"]["maxItems"], 64);
        assert_eq!(spec["health"]["properties"]["observedAt"]["maxLength"], 64);
        assert_eq!(spec["assigned"]["properties"]["pods"]["maxProperties"], 1024);
        let devices = &spec["assigned"]["properties"]["pods"]["additionalProperties"]["properties"]["devices"];
        assert_eq!(devices["maxItems"], 512);
        assert_eq!(devices["items"]["maxLength"], 256);
        assert_eq!(spec["assigned"]["properties"]["resource"]["maxLength"], 253);
    }
}

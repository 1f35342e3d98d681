//! What `muster node-agent` publishes on its Node and muster reads back: the GPUs kubelet
//! really gave each pod (`gpu.muster.dev/assigned`, from kubelet's PodResources API) and each
//! GPU's health (`gpu.muster.dev/health`, from NVML). Both are plain JSON annotations of a
//! versioned shape; this module builds, parses and interprets them. No I/O here.
//!
//! On a device-plugin node kubelet picks a container's GPUs itself (with the plugin's
//! preferred allocation), so muster's plan is a wish; the assignment read back is the truth.
//! [`kubelet_indices`] turns the device IDs kubelet names into GPU indices through the node's
//! topology model, so the ledger can be corrected to what the containers hold.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::time::{Duration, SystemTime};

use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::gpuset::GpuSet;
use super::health::{GpuMetrics, NodeMetrics};
use super::topology::GpuTopology;

/// The version of both annotation shapes.
pub const REPORT_VERSION: u32 = 1;

/// Devices of one extended resource kubelet gave a container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceDevices {
    /// The resource name, e.g. `nvidia.com/gpu`.
    pub resource: String,
    /// The device IDs the device plugin advertised (GPU UUIDs for NVIDIA's plugin).
    pub ids: Vec<String>,
}

/// What kubelet's PodResources API says one container holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerDevices {
    /// The container name.
    pub name: String,
    /// Its devices, per resource.
    pub devices: Vec<ResourceDevices>,
}

/// What kubelet's PodResources API says one pod holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodDevices {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// Its containers.
    pub containers: Vec<ContainerDevices>,
}

impl PodDevices {
    /// Every device ID of `resource` any container of the pod holds, sorted, each once.
    pub fn ids_of(&self, resource: &str) -> Vec<String> {
        let ids: BTreeSet<&str> = self
            .containers
            .iter()
            .flat_map(|c| &c.devices)
            .filter(|d| d.resource == resource)
            .flat_map(|d| d.ids.iter().map(String::as_str))
            .collect();
        ids.into_iter().map(str::to_string).collect()
    }
}

/// One pod's devices in the `gpu.muster.dev/assigned` annotation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AssignedPod {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The device IDs kubelet gave it (sorted, each once).
    pub devices: Vec<String>,
}

/// The node annotation `gpu.muster.dev/assigned`: per pod uid, the devices of one resource
/// (`nvidia.com/gpu`) kubelet gave the pods running on the node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AssignedAnnotation {
    /// Always [`REPORT_VERSION`].
    pub version: u32,
    /// The resource the devices are of.
    pub resource: String,
    /// Pods by uid.
    pub pods: BTreeMap<String, AssignedPod>,
}

/// Why an annotation the agent wrote cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    /// Not JSON of the expected shape.
    #[error("{annotation} is not valid: {reason}")]
    Malformed {
        /// The annotation key.
        annotation: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A version this muster does not know.
    #[error("{annotation} has version {found}; this muster reads version {REPORT_VERSION}")]
    Version {
        /// The annotation key.
        annotation: &'static str,
        /// The version found.
        found: u32,
    },
}

impl AssignedAnnotation {
    /// What kubelet says the pods of a node hold of `resource`; `uids` maps `(namespace, name)`
    /// to the uid of the pod the API has on this node. A pod kubelet lists but the API does not
    /// (deleted, or not yet seen) is left out, as is a pod without devices of `resource`.
    pub fn from_pods(pods: &[PodDevices], uids: &HashMap<(String, String), String>, resource: &str) -> Self {
        let mut out = BTreeMap::new();
        for pod in pods {
            let devices = pod.ids_of(resource);
            if devices.is_empty() {
                continue;
            }
            let Some(uid) = uids.get(&(pod.namespace.clone(), pod.name.clone())) else { continue };
            out.insert(uid.clone(), AssignedPod { namespace: pod.namespace.clone(), name: pod.name.clone(), devices });
        }
        AssignedAnnotation { version: REPORT_VERSION, resource: resource.to_string(), pods: out }
    }

    /// The annotation value.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses an annotation value.
    pub fn parse(value: &str) -> Result<Self, ReportError> {
        let annotation = crate::crds::GPU_ASSIGNED_ANNOTATION;
        let v: Self =
            serde_json::from_str(value).map_err(|e| ReportError::Malformed { annotation, reason: e.to_string() })?;
        if v.version != REPORT_VERSION {
            return Err(ReportError::Version { annotation, found: v.version });
        }
        Ok(v)
    }
}

/// A device ID kubelet named that the node's GPU model does not have.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("device {id} is not a GPU of the node's topology model (by uuid or index)")]
pub struct UnknownDevice {
    /// The device ID.
    pub id: String,
}

/// The GPU indices behind device IDs kubelet gave a pod: a GPU UUID (`GPU-…`) is looked up in
/// the topology model; a plain number (the device plugin's `index` ID strategy) is the index.
/// A time-slicing replica (`<id>::<n>`) stands for its GPU.
pub fn kubelet_indices(ids: &[String], topology: &GpuTopology) -> Result<GpuSet, UnknownDevice> {
    let by_uuid: HashMap<&str, usize> =
        topology.gpus().iter().enumerate().filter_map(|(i, g)| g.uuid.as_deref().map(|u| (u, i))).collect();
    let mut set = GpuSet::EMPTY;
    for id in ids {
        let base = id.split_once("::").map_or(id.as_str(), |(b, _)| b);
        let index = by_uuid
            .get(base)
            .copied()
            .or_else(|| base.parse::<usize>().ok().filter(|&i| i < topology.len()))
            .ok_or_else(|| UnknownDevice { id: id.clone() })?;
        set = set.union(GpuSet::single(index).ok_or_else(|| UnknownDevice { id: id.clone() })?);
    }
    Ok(set)
}

/// One GPU's sample in the `gpu.muster.dev/health` annotation.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthSample {
    /// GPU index.
    pub index: u32,
    /// Temperature in °C.
    pub temperature_c: f64,
    /// Free memory over total memory, 0..=1.
    pub memory_free_fraction: f64,
    /// Utilization, 0..=1.
    pub utilization: f64,
}

/// The node annotation `gpu.muster.dev/health`: one sample per GPU, taken at `observedAt`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthAnnotation {
    /// Always [`REPORT_VERSION`].
    pub version: u32,
    /// When the samples were taken (RFC 3339).
    pub observed_at: String,
    /// The samples, by GPU index.
    pub gpus: Vec<HealthSample>,
}

impl HealthAnnotation {
    /// The annotation for `metrics` (their oldest sample time stands for all).
    pub fn from_metrics(metrics: &NodeMetrics) -> Self {
        let at = metrics.gpus.values().map(|m| m.observed_at).min().unwrap_or(SystemTime::UNIX_EPOCH);
        let gpus = metrics
            .gpus
            .iter()
            .map(|(&index, m)| HealthSample {
                index,
                temperature_c: m.temperature_c,
                memory_free_fraction: m.memory_free_fraction,
                utilization: m.utilization,
            })
            .collect();
        HealthAnnotation { version: REPORT_VERSION, observed_at: rfc3339(at), gpus }
    }

    /// The annotation value.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses an annotation value into the metrics it carries.
    pub fn parse(value: &str) -> Result<NodeMetrics, ReportError> {
        let annotation = crate::crds::GPU_HEALTH_ANNOTATION;
        let malformed = |reason: String| ReportError::Malformed { annotation, reason };
        let v: Self = serde_json::from_str(value).map_err(|e| malformed(e.to_string()))?;
        if v.version != REPORT_VERSION {
            return Err(ReportError::Version { annotation, found: v.version });
        }
        let at: Timestamp =
            v.observed_at.parse().map_err(|e| malformed(format!("observedAt {:?}: {e}", v.observed_at)))?;
        let observed_at = SystemTime::from(at);
        let gpus = v
            .gpus
            .iter()
            .map(|s| {
                let m = GpuMetrics {
                    temperature_c: s.temperature_c,
                    memory_free_fraction: s.memory_free_fraction,
                    utilization: s.utilization,
                    observed_at,
                };
                (s.index, m)
            })
            .collect();
        Ok(NodeMetrics { gpus })
    }

    /// Whether this sample says something `last` (the one published before) does not, enough
    /// to write it again: a GPU added or gone, a temperature 2 °C or more away, free memory or
    /// utilization 5 points or more away, or `last` older than `refresh` at `now` (so readers
    /// never see it go stale while the agent runs).
    pub fn worth_publishing(
        &self,
        last: Option<&(HealthAnnotation, SystemTime)>,
        now: SystemTime,
        refresh: Duration,
    ) -> bool {
        let Some((last, written)) = last else { return true };
        if now.duration_since(*written).map_or(true, |age| age >= refresh) {
            return true;
        }
        if self.gpus.len() != last.gpus.len() {
            return true;
        }
        self.gpus.iter().zip(&last.gpus).any(|(a, b)| {
            a.index != b.index
                || (a.temperature_c - b.temperature_c).abs() >= 2.0
                || (a.memory_free_fraction - b.memory_free_fraction).abs() >= 0.05
                || (a.utilization - b.utilization).abs() >= 0.05
        })
    }
}

fn rfc3339(t: SystemTime) -> String {
    Timestamp::try_from(t)
        .ok()
        .and_then(|t| Timestamp::from_second(t.as_second()).ok())
        .map_or_else(|| "1970-01-01T00:00:00Z".to_string(), |t| t.to_string())
}

/// Per GPU, the newer of two samples: the agent's annotation and a Prometheus snapshot can both
/// know a node, and whichever measured last is believed.
pub fn newest(a: Option<&NodeMetrics>, b: Option<&NodeMetrics>) -> Option<NodeMetrics> {
    match (a, b) {
        (None, None) => None,
        (Some(x), None) | (None, Some(x)) => Some(x.clone()),
        (Some(a), Some(b)) => {
            let mut gpus = a.gpus.clone();
            for (&i, m) in &b.gpus {
                gpus.entry(i)
                    .and_modify(|old| {
                        if m.observed_at > old.observed_at {
                            *old = *m;
                        }
                    })
                    .or_insert(*m);
            }
            Some(NodeMetrics { gpus })
        }
    }
}

impl fmt::Display for AssignedPod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}: {}", self.namespace, self.name, self.devices.join(","))
    }
}

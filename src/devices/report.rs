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
        versioned(value, crate::crds::GPU_ASSIGNED_ANNOTATION)
    }
}

/// An annotation of a known version, parsed: the version is read first, so an annotation of
/// a later shape says so rather than failing on a field this muster does not know.
fn versioned<T: serde::de::DeserializeOwned>(value: &str, annotation: &'static str) -> Result<T, ReportError> {
    let malformed = |reason: String| ReportError::Malformed { annotation, reason };
    let v: serde_json::Value = serde_json::from_str(value).map_err(|e| malformed(e.to_string()))?;
    match v.get("version").and_then(serde_json::Value::as_u64) {
        Some(found) if found == u64::from(REPORT_VERSION) => {}
        Some(found) => {
            return Err(ReportError::Version { annotation, found: u32::try_from(found).unwrap_or(u32::MAX) });
        }
        None => return Err(malformed("no version".into())),
    }
    serde_json::from_value(v).map_err(|e| malformed(e.to_string()))
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
        let v: Self = versioned(value, annotation)?;
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
        // A hair under the step, so decimal inputs that differ by exactly one step count.
        let moved = |a: f64, b: f64, step: f64| (a - b).abs() >= step - 1e-9;
        self.gpus.iter().zip(&last.gpus).any(|(a, b)| {
            a.index != b.index
                || moved(a.temperature_c, b.temperature_c, 2.0)
                || moved(a.memory_free_fraction, b.memory_free_fraction, 0.05)
                || moved(a.utilization, b.utilization, 0.05)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::topology::GpuTopology;

    fn devices(resource: &str, ids: &[&str]) -> ResourceDevices {
        ResourceDevices { resource: resource.into(), ids: ids.iter().map(|s| (*s).to_string()).collect() }
    }

    fn pod(ns: &str, name: &str, containers: Vec<Vec<ResourceDevices>>) -> PodDevices {
        let containers = containers
            .into_iter()
            .enumerate()
            .map(|(i, devices)| ContainerDevices { name: format!("c{i}"), devices })
            .collect();
        PodDevices { namespace: ns.into(), name: name.into(), containers }
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn the_assigned_annotation_keeps_gpu_pods_the_api_knows() {
        let pods = [
            // Two containers share the pod's GPUs; another resource is left out.
            pod(
                "ns",
                "a",
                vec![
                    vec![devices("nvidia.com/gpu", &["GPU-2", "GPU-1"]), devices("example.com/nic", &["nic0"])],
                    vec![devices("nvidia.com/gpu", &["GPU-1"])],
                ],
            ),
            pod("ns", "cpu-only", vec![vec![devices("example.com/nic", &["nic1"])]]),
            pod("ns", "deleted", vec![vec![devices("nvidia.com/gpu", &["GPU-3"])]]),
        ];
        let uids: HashMap<(String, String), String> = [
            (("ns".to_string(), "a".to_string()), "uid-a".to_string()),
            (("ns".to_string(), "cpu-only".to_string()), "uid-c".to_string()),
        ]
        .into();
        let report = AssignedAnnotation::from_pods(&pods, &uids, "nvidia.com/gpu");
        assert_eq!(report.pods.keys().collect::<Vec<_>>(), ["uid-a"]);
        assert_eq!(report.pods["uid-a"].devices, ["GPU-1", "GPU-2"]);
        assert_eq!(AssignedAnnotation::parse(&report.to_json()), Ok(report));
    }

    #[test]
    fn annotations_of_another_version_or_shape_are_refused_with_the_key() {
        let cases = [
            (r#"{"version": 2, "resource": "x", "pods": {}, "new": 1}"#, "gpu.muster.dev/assigned has version 2"),
            (r#"{"resource": "x", "pods": {}}"#, "gpu.muster.dev/assigned is not valid: no version"),
            (r#"{"version": 1, "pods": {}}"#, "gpu.muster.dev/assigned is not valid: missing field `resource`"),
            ("[]", "gpu.muster.dev/assigned is not valid"),
        ];
        for (value, want) in cases {
            let got = AssignedAnnotation::parse(value).map(|_| ()).map_err(|e| e.to_string());
            assert!(got.as_ref().is_err_and(|e| e.starts_with(want)), "{value}: {got:?}");
        }
        let bad_time = r#"{"version": 1, "observedAt": "yesterday", "gpus": []}"#;
        let got = HealthAnnotation::parse(bad_time).map_err(|e| e.to_string());
        assert!(got.as_ref().is_err_and(|e| e.contains("observedAt \"yesterday\"")), "{got:?}");
    }

    #[test]
    fn device_ids_map_to_indices_by_uuid_or_number() {
        let value = serde_json::json!({"version": 1,
            "gpus": [{"index": 0, "uuid": "GPU-a"}, {"index": 1, "uuid": "GPU-b"}, {"index": 2}],
            "links": [["X", "NV1", "SYS"], ["NV1", "X", "SYS"], ["SYS", "SYS", "X"]]});
        let (topology, problem) = GpuTopology::from_node(Some(&value.to_string()), 3);
        assert_eq!(problem, None);
        let ids = |v: &[&str]| v.iter().map(|s| (*s).to_string()).collect::<Vec<_>>();
        let set = |v: &[usize]| GpuSet::from_indices(v.iter().copied());
        assert_eq!(kubelet_indices(&ids(&["GPU-b", "GPU-a"]), &topology).ok(), set(&[0, 1]));
        assert_eq!(kubelet_indices(&ids(&["2", "GPU-a::3"]), &topology).ok(), set(&[0, 2]));
        assert_eq!(kubelet_indices(&[], &topology).ok(), set(&[]));
        for bad in [&["GPU-z"][..], &["3"], &["-1"], &["MIG-1"]] {
            let err = kubelet_indices(&ids(bad), &topology);
            assert_eq!(err, Err(UnknownDevice { id: bad[0].to_string() }));
        }
    }

    #[test]
    fn health_round_trips_through_the_annotation() {
        let sample = |t: f64, free: f64| GpuMetrics {
            temperature_c: t,
            memory_free_fraction: free,
            utilization: 0.5,
            observed_at: at(1_700_000_000),
        };
        let metrics = NodeMetrics { gpus: [(0, sample(40.0, 0.9)), (1, sample(85.5, 0.1))].into() };
        let annotation = HealthAnnotation::from_metrics(&metrics);
        assert_eq!(annotation.observed_at, "2023-11-14T22:13:20Z");
        assert_eq!(HealthAnnotation::parse(&annotation.to_json()), Ok(metrics));
    }

    #[test]
    fn health_is_written_again_on_real_change_or_before_it_goes_stale() {
        let sample = |t: f64, free: f64, util: f64| HealthSample {
            index: 0,
            temperature_c: t,
            memory_free_fraction: free,
            utilization: util,
        };
        let annotation = |s: Vec<HealthSample>| HealthAnnotation { version: 1, observed_at: String::new(), gpus: s };
        let last = (annotation(vec![sample(50.0, 0.5, 0.5)]), at(100));
        let refresh = Duration::from_secs(30);
        let cases = [
            ("nothing published yet", None, vec![sample(50.0, 0.5, 0.5)], 101, true),
            ("same values", Some(&last), vec![sample(51.0, 0.52, 0.53)], 101, false),
            ("2 C warmer", Some(&last), vec![sample(52.0, 0.5, 0.5)], 101, true),
            ("memory 5 points less", Some(&last), vec![sample(50.0, 0.45, 0.5)], 101, true),
            ("utilization 5 points up", Some(&last), vec![sample(50.0, 0.5, 0.55)], 101, true),
            (
                "a GPU more",
                Some(&last),
                vec![sample(50.0, 0.5, 0.5), HealthSample { index: 1, ..sample(50.0, 0.5, 0.5) }],
                101,
                true,
            ),
            ("refresh due", Some(&last), vec![sample(50.0, 0.5, 0.5)], 130, true),
            ("clock went back", Some(&last), vec![sample(50.0, 0.5, 0.5)], 99, true),
        ];
        for (case, last, gpus, now, want) in cases {
            assert_eq!(annotation(gpus).worth_publishing(last, at(now), refresh), want, "{case}");
        }
    }

    #[test]
    fn of_two_sources_the_newer_sample_of_each_gpu_wins() {
        let m = |t: f64, secs: u64| GpuMetrics {
            temperature_c: t,
            memory_free_fraction: 1.0,
            utilization: 0.0,
            observed_at: at(secs),
        };
        let agent = NodeMetrics { gpus: [(0, m(90.0, 20)), (1, m(40.0, 10))].into() };
        let prometheus = NodeMetrics { gpus: [(0, m(50.0, 15)), (1, m(45.0, 15)), (2, m(30.0, 1))].into() };
        let merged = newest(Some(&agent), Some(&prometheus)).map(|n| n.gpus);
        assert_eq!(merged, Some([(0, m(90.0, 20)), (1, m(45.0, 15)), (2, m(30.0, 1))].into()));
        assert_eq!(newest(None, Some(&agent)), Some(agent.clone()));
        assert_eq!(newest(None, None), None);
    }
}

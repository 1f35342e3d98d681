//! What `muster node-agent` publishes on its Node and muster reads back: the GPUs kubelet
//! really gave each pod (`gpu.muster.dev/assigned`, from kubelet's PodResources API, keyed by
//! `namespace/name` as kubelet names pods) and each GPU's health (`gpu.muster.dev/health`, from
//! NVML). Both are plain JSON annotations of a versioned shape; this module builds, parses and
//! interprets them. No I/O here.
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

/// The version of the `gpu.muster.dev/assigned` shape the agent writes: pods keyed by
/// `namespace/name`, as kubelet's PodResources API names them (the agent reads no pod of the
/// API).
pub const ASSIGNED_VERSION: u32 = 2;
/// The first `gpu.muster.dev/assigned` shape: pods keyed by uid (its agent listed the API's pods
/// on its node to join names to uids). Still read, so a muster upgraded before its agents keeps
/// correcting GPU indices while old agents run.
pub const ASSIGNED_BY_UID_VERSION: u32 = 1;
/// The versions of `gpu.muster.dev/assigned` muster reads.
const ASSIGNED_VERSIONS: &[u32] = &[ASSIGNED_BY_UID_VERSION, ASSIGNED_VERSION];
/// The version of the `gpu.muster.dev/health` shape.
pub const HEALTH_VERSION: u32 = 1;

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

/// One pod's devices in the `gpu.muster.dev/assigned` annotation. (Version 1 entries also
/// carried the pod's `namespace` and `name`; they are read and not needed.)
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AssignedPod {
    /// The device IDs kubelet gave it (sorted, each once).
    pub devices: Vec<String>,
}

/// The node annotation `gpu.muster.dev/assigned`: per pod, the devices of one resource
/// (`nvidia.com/gpu`) kubelet gave the pods running on the node. The agent writes version
/// [`ASSIGNED_VERSION`], pods keyed by `namespace/name`:
///
/// ```json
/// {"version":2,"resource":"nvidia.com/gpu","pods":{"team-a/train-0":{"devices":["GPU-1","GPU-2"]}}}
/// ```
///
/// Version [`ASSIGNED_BY_UID_VERSION`] (an older agent) keys them by pod uid; see
/// [`AssignedAnnotation::given`] for how an entry is matched to a pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AssignedAnnotation {
    /// [`ASSIGNED_VERSION`], or [`ASSIGNED_BY_UID_VERSION`] as read from an older agent.
    pub version: u32,
    /// The resource the devices are of.
    pub resource: String,
    /// Pods by `namespace/name` ([`pod_key`]); by uid in version [`ASSIGNED_BY_UID_VERSION`].
    /// `null` reads as none: server-side apply of an empty map over one that had entries
    /// leaves `null` in a NodeGPUReport (kube-apiserver 1.37.2).
    #[serde(default, deserialize_with = "null_as_empty")]
    pub pods: BTreeMap<String, AssignedPod>,
}

/// A map that may be `null`, read as empty.
fn null_as_empty<'de, D, V>(d: D) -> Result<BTreeMap<String, V>, D::Error>
where
    D: serde::Deserializer<'de>,
    V: Deserialize<'de>,
{
    Ok(Option::<BTreeMap<String, V>>::deserialize(d)?.unwrap_or_default())
}

/// The key of a pod in a version [`ASSIGNED_VERSION`] annotation: `namespace/name` (neither may
/// contain a `/`, so the key names one pod name).
pub fn pod_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// A pod as muster asks the annotation about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AskingPod<'a> {
    /// `metadata.uid`.
    pub uid: &'a str,
    /// `metadata.namespace`.
    pub namespace: &'a str,
    /// `metadata.name`.
    pub name: &'a str,
    /// The node it is bound to (`spec.nodeName`), none while it is not bound.
    pub bound_to: Option<&'a str>,
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
    #[error("{annotation} has version {found}; this muster reads {}", versions(.reads))]
    Version {
        /// The annotation key.
        annotation: &'static str,
        /// The version found.
        found: u32,
        /// The versions this muster reads of it.
        reads: &'static [u32],
    },
}

/// `version 1`, `versions 1 and 2`.
fn versions(reads: &[u32]) -> String {
    match reads {
        [one] => format!("version {one}"),
        [first @ .., last] => {
            let first: Vec<String> = first.iter().map(u32::to_string).collect();
            format!("versions {} and {last}", first.join(", "))
        }
        [] => "no version".to_string(),
    }
}

impl AssignedAnnotation {
    /// What kubelet says the pods of its node hold of `resource`, keyed by `namespace/name`. A
    /// pod without devices of `resource` is left out; a name kubelet lists twice (a pod deleted
    /// by force whose containers still run, and its successor) holds the devices of both, so
    /// none of them looks free.
    pub fn from_pods(pods: &[PodDevices], resource: &str) -> Self {
        let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for pod in pods {
            let devices = pod.ids_of(resource);
            if devices.is_empty() {
                continue;
            }
            out.entry(pod_key(&pod.namespace, &pod.name)).or_default().extend(devices);
        }
        let pods =
            out.into_iter().map(|(key, ids)| (key, AssignedPod { devices: ids.into_iter().collect() })).collect();
        AssignedAnnotation { version: ASSIGNED_VERSION, resource: resource.to_string(), pods }
    }

    /// What kubelet on `node` (the node this annotation is on) gave `pod`. How an entry is
    /// matched:
    ///
    /// - version [`ASSIGNED_VERSION`]: by `namespace/name`, and only for a pod bound to `node`.
    ///   kubelet lists only the pods it runs, so an entry is about a pod bound there; a pod of
    ///   that name that is not (admitted and pinned but not bound yet, or recreated under the
    ///   name and bound elsewhere) is another pod and inherits nothing. A pod recreated under the
    ///   name on the same node can see its predecessor's entry until the agent's next round
    ///   lists it (the next device pass then follows the new entry).
    /// - version [`ASSIGNED_BY_UID_VERSION`] (an agent from before): by the pod's uid, which
    ///   names one pod for ever; nothing else is checked.
    ///
    /// Any other version matches nothing ([`Self::parse`] refuses it).
    pub fn given(&self, node: &str, pod: AskingPod<'_>) -> Option<&AssignedPod> {
        match self.version {
            ASSIGNED_VERSION if pod.bound_to == Some(node) => self.pods.get(&pod_key(pod.namespace, pod.name)),
            ASSIGNED_BY_UID_VERSION => self.pods.get(pod.uid),
            _ => None,
        }
    }

    /// The annotation value.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The value as JSON (a NodeGPUReport's `spec.assigned`).
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }

    /// Parses an annotation value of version [`ASSIGNED_VERSION`] or
    /// [`ASSIGNED_BY_UID_VERSION`] (both have the same fields; the version says what keys the
    /// pods).
    pub fn parse(value: &str) -> Result<Self, ReportError> {
        versioned(value, muster_api::GPU_ASSIGNED_ANNOTATION, ASSIGNED_VERSIONS)
    }

    /// [`Self::parse`] of the same shape held as JSON in a NodeGPUReport (`spec.assigned`);
    /// errors name `place`.
    pub fn parse_value(value: &serde_json::Value, place: &'static str) -> Result<Self, ReportError> {
        versioned_value(value.clone(), place, ASSIGNED_VERSIONS)
    }
}

/// An annotation of a known version, parsed: the version is read first, so an annotation of
/// a later shape says so rather than failing on a field this muster does not know.
fn versioned<T: serde::de::DeserializeOwned>(
    value: &str,
    annotation: &'static str,
    reads: &'static [u32],
) -> Result<T, ReportError> {
    let malformed = |reason: String| ReportError::Malformed { annotation, reason };
    let v: serde_json::Value = serde_json::from_str(value).map_err(|e| malformed(e.to_string()))?;
    versioned_value(v, annotation, reads)
}

/// [`versioned`] of a value already read as JSON (a NodeGPUReport's field).
fn versioned_value<T: serde::de::DeserializeOwned>(
    v: serde_json::Value,
    annotation: &'static str,
    reads: &'static [u32],
) -> Result<T, ReportError> {
    let malformed = |reason: String| ReportError::Malformed { annotation, reason };
    match v.get("version").and_then(serde_json::Value::as_u64) {
        Some(found) if reads.iter().any(|&r| u64::from(r) == found) => {}
        Some(found) => {
            let found = u32::try_from(found).unwrap_or(u32::MAX);
            return Err(ReportError::Version { annotation, found, reads });
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
    /// Always [`HEALTH_VERSION`].
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
        HealthAnnotation { version: HEALTH_VERSION, observed_at: rfc3339(at), gpus }
    }

    /// The annotation value.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses an annotation value into the metrics it carries.
    pub fn parse(value: &str) -> Result<NodeMetrics, ReportError> {
        let annotation = muster_api::GPU_HEALTH_ANNOTATION;
        Self::metrics(versioned(value, annotation, &[HEALTH_VERSION])?, annotation)
    }

    /// [`Self::parse`] of the same shape held as JSON in a NodeGPUReport (`spec.health`);
    /// errors name `place`.
    pub fn parse_value(value: &serde_json::Value, place: &'static str) -> Result<NodeMetrics, ReportError> {
        Self::metrics(versioned_value(value.clone(), place, &[HEALTH_VERSION])?, place)
    }

    /// The value as JSON (a NodeGPUReport's `spec.health`).
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }

    fn metrics(v: Self, annotation: &'static str) -> Result<NodeMetrics, ReportError> {
        let malformed = |reason: String| ReportError::Malformed { annotation, reason };
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
    fn assigned_pods_that_are_null_or_absent_read_as_none() {
        // What server-side apply leaves in a NodeGPUReport once every GPU pod of the node ended.
        for value in [
            serde_json::json!({"version": 2, "resource": "nvidia.com/gpu", "pods": null}),
            serde_json::json!({"version": 2, "resource": "nvidia.com/gpu"}),
            serde_json::json!({"version": 2, "resource": "nvidia.com/gpu", "pods": {}}),
        ] {
            let read = AssignedAnnotation::parse_value(&value, "NodeGPUReport spec.assigned");
            assert_eq!(read.map(|a| a.pods.len()), Ok(0), "{value}");
        }
        let wrong = serde_json::json!({"version": 2, "resource": "nvidia.com/gpu", "pods": []});
        assert!(AssignedAnnotation::parse_value(&wrong, "NodeGPUReport spec.assigned").is_err());
    }

    #[test]
    fn the_assigned_annotation_keys_gpu_pods_by_namespace_and_name() {
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
            pod("other", "a", vec![vec![devices("nvidia.com/gpu", &["GPU-3"])]]),
        ];
        let report = AssignedAnnotation::from_pods(&pods, "nvidia.com/gpu");
        assert_eq!(report.version, ASSIGNED_VERSION);
        assert_eq!(report.pods.keys().collect::<Vec<_>>(), ["ns/a", "other/a"]);
        assert_eq!(report.pods["ns/a"].devices, ["GPU-1", "GPU-2"]);
        assert_eq!(report.pods["other/a"].devices, ["GPU-3"]);
        // The value as muster reads it back, and as it is documented.
        let json = report.to_json();
        assert_eq!(
            json,
            r#"{"version":2,"resource":"nvidia.com/gpu","pods":{"ns/a":{"devices":["GPU-1","GPU-2"]},"other/a":{"devices":["GPU-3"]}}}"#
        );
        assert_eq!(AssignedAnnotation::parse(&json), Ok(report));
        // Nothing with GPUs: an empty report, still of the new version.
        let empty = AssignedAnnotation::from_pods(&pods[1..2], "nvidia.com/gpu");
        assert_eq!(empty.to_json(), r#"{"version":2,"resource":"nvidia.com/gpu","pods":{}}"#);
    }

    #[test]
    fn a_name_kubelet_lists_twice_holds_the_devices_of_both() {
        let pods = [
            pod("ns", "a", vec![vec![devices("nvidia.com/gpu", &["GPU-3"])]]),
            pod("ns", "a", vec![vec![devices("nvidia.com/gpu", &["GPU-1", "GPU-3"])]]),
        ];
        let report = AssignedAnnotation::from_pods(&pods, "nvidia.com/gpu");
        assert_eq!(report.pods["ns/a"].devices, ["GPU-1", "GPU-3"]);
    }

    fn asking<'a>(uid: &'a str, namespace: &'a str, name: &'a str, bound_to: Option<&'a str>) -> AskingPod<'a> {
        AskingPod { uid, namespace, name, bound_to }
    }

    #[test]
    fn an_entry_by_name_is_given_only_to_a_pod_of_that_name_bound_to_the_node() {
        let value = r#"{"version":2,"resource":"nvidia.com/gpu","pods":{"ns/a":{"devices":["GPU-1"]}}}"#;
        let report = AssignedAnnotation::parse(value).unwrap_or_else(|e| panic!("{e}"));
        let given = |pod: AskingPod<'_>| report.given("n1", pod).map(|p| p.devices.clone());
        let cases = [
            ("bound to the node", asking("uid-a", "ns", "a", Some("n1")), true),
            ("a new uid under the name, bound to the node", asking("uid-new", "ns", "a", Some("n1")), true),
            ("recreated under the name on another node", asking("uid-new", "ns", "a", Some("n2")), false),
            ("pinned by admission, not bound yet", asking("uid-new", "ns", "a", None), false),
            ("the name in another namespace", asking("uid-b", "other", "a", Some("n1")), false),
            ("another name", asking("uid-b", "ns", "b", Some("n1")), false),
            ("asked by the entry's key as uid", asking("ns/a", "ns", "x", Some("n1")), false),
        ];
        for (case, pod, held) in cases {
            assert_eq!(given(pod), held.then(|| vec!["GPU-1".to_string()]), "{case}");
        }
        // The annotation of another node says nothing about a pod bound to n1.
        assert_eq!(report.given("n2", asking("uid-a", "ns", "a", Some("n1"))), None);
    }

    #[test]
    fn the_uid_keyed_version_of_an_older_agent_is_still_read() {
        let value = r#"{"version":1,"resource":"nvidia.com/gpu",
            "pods":{"uid-a":{"namespace":"ns","name":"a","devices":["GPU-2","GPU-5"]}}}"#;
        let report = AssignedAnnotation::parse(value).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(report.version, ASSIGNED_BY_UID_VERSION);
        let held = |pod: AskingPod<'_>| report.given("n1", pod).map(|p| p.devices.clone());
        let want = Some(vec!["GPU-2".to_string(), "GPU-5".to_string()]);
        // Matched by uid alone: the pod of that uid, bound or not yet seen bound.
        assert_eq!(held(asking("uid-a", "ns", "a", Some("n1"))), want);
        assert_eq!(held(asking("uid-a", "ns", "a", None)), want);
        // A pod recreated under the name has another uid: nothing.
        assert_eq!(held(asking("uid-new", "ns", "a", Some("n1"))), None);
        // Nor does a version 1 report match by name.
        assert_eq!(held(asking("uid-b", "ns", "uid-a", Some("n1"))), None);
    }

    #[test]
    fn annotations_of_another_version_or_shape_are_refused_with_the_key() {
        let cases = [
            (
                r#"{"version": 3, "resource": "x", "pods": {}, "new": 1}"#,
                "gpu.muster.dev/assigned has version 3; this muster reads versions 1 and 2",
            ),
            (r#"{"version": 0, "resource": "x", "pods": {}}"#, "gpu.muster.dev/assigned has version 0"),
            (r#"{"resource": "x", "pods": {}}"#, "gpu.muster.dev/assigned is not valid: no version"),
            (r#"{"version": 2, "pods": {}}"#, "gpu.muster.dev/assigned is not valid: missing field `resource`"),
            (r#"{"version": 2, "resource": "x", "pods": {"ns/a": {}}}"#, "gpu.muster.dev/assigned is not valid"),
            ("[]", "gpu.muster.dev/assigned is not valid"),
        ];
        for (value, want) in cases {
            let got = AssignedAnnotation::parse(value).map(|_| ()).map_err(|e| e.to_string());
            assert!(got.as_ref().is_err_and(|e| e.starts_with(want)), "{value}: {got:?}");
        }
        let health = HealthAnnotation::parse(r#"{"version": 2, "observedAt": "x", "gpus": []}"#);
        let got = health.map_err(|e| e.to_string());
        assert_eq!(got, Err("gpu.muster.dev/health has version 2; this muster reads version 1".to_string()));
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

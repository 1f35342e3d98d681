//! Resource amounts as kube-scheduler counts them: cpu in millicores, memory and
//! ephemeral-storage in bytes, a pod count, and every extended resource (`nvidia.com/gpu`,
//! hugepages, ...) by name; plus a pod's effective requests. Arithmetic only, no filters.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::quantity::{QuantityError, parse_milli_value, parse_value};
use muster_api::GPU_RESOURCE;

/// Name of the cpu resource.
pub const CPU: &str = "cpu";
/// Name of the memory resource.
pub const MEMORY: &str = "memory";
/// Name of the ephemeral-storage resource.
pub const EPHEMERAL_STORAGE: &str = "ephemeral-storage";
/// Name of the pod-count resource.
pub const PODS: &str = "pods";

/// A resource amount that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("resource {resource}: {source}")]
pub struct ResourceError {
    /// The resource name.
    pub resource: String,
    /// What was wrong with its quantity.
    #[source]
    pub source: QuantityError,
}

/// Amounts of every resource: the well-known ones and `nvidia.com/gpu` inline, other extended
/// ones in a short sorted list (usually empty, so this stays small across 5,000 nodes and
/// lookups on the hot path never compare strings).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Resources {
    /// cpu, in millicores.
    pub cpu_milli: i64,
    /// memory, in bytes.
    pub memory: i64,
    /// ephemeral-storage, in bytes.
    pub ephemeral_storage: i64,
    /// Number of pods.
    pub pods: i64,
    /// `nvidia.com/gpu`, in whole GPUs.
    pub gpus: i64,
    /// Other extended resources, sorted by name, never zero.
    extended: Vec<(Box<str>, i64)>,
}

impl Resources {
    /// Nothing of anything.
    pub fn new() -> Self {
        Self::default()
    }

    /// The amount of one resource by its Kubernetes name (0 when absent).
    pub fn get(&self, name: &str) -> i64 {
        match name {
            CPU => self.cpu_milli,
            MEMORY => self.memory,
            EPHEMERAL_STORAGE => self.ephemeral_storage,
            PODS => self.pods,
            GPU_RESOURCE => self.gpus,
            _ => self.extended_amount(name),
        }
    }

    /// Sets one resource by its Kubernetes name (cpu in millicores).
    pub fn set(&mut self, name: &str, amount: i64) {
        match name {
            CPU => self.cpu_milli = amount,
            MEMORY => self.memory = amount,
            EPHEMERAL_STORAGE => self.ephemeral_storage = amount,
            PODS => self.pods = amount,
            GPU_RESOURCE => self.gpus = amount,
            _ => match self.extended.binary_search_by(|(n, _)| n.as_ref().cmp(name)) {
                Ok(i) if amount == 0 => {
                    self.extended.remove(i);
                }
                Ok(i) => self.extended[i].1 = amount,
                Err(_) if amount == 0 => {}
                Err(i) => self.extended.insert(i, (name.into(), amount)),
            },
        }
    }

    /// Builder form of [`Resources::set`].
    pub fn with(mut self, name: &str, amount: i64) -> Self {
        self.set(name, amount);
        self
    }

    /// The amount of an extended resource other than `nvidia.com/gpu` (0 when absent).
    pub fn extended_amount(&self, name: &str) -> i64 {
        self.extended.iter().find(|(n, _)| n.as_ref() == name).map_or(0, |(_, v)| *v)
    }

    /// Extended resources other than `nvidia.com/gpu`, with their amounts, by name.
    pub fn extended(&self) -> impl Iterator<Item = (&str, i64)> {
        self.extended.iter().map(|(n, v)| (n.as_ref(), *v))
    }

    /// Every non-zero resource with its amount: the inline ones, then other extended ones.
    pub fn iter(&self) -> impl Iterator<Item = (&str, i64)> {
        [
            (CPU, self.cpu_milli),
            (MEMORY, self.memory),
            (EPHEMERAL_STORAGE, self.ephemeral_storage),
            (PODS, self.pods),
            (GPU_RESOURCE, self.gpus),
        ]
        .into_iter()
        .chain(self.extended())
        .filter(|(_, v)| *v != 0)
    }

    /// True when every amount is zero.
    pub fn is_zero(&self) -> bool {
        self.iter().next().is_none()
    }

    /// Adds `other` to `self`, resource by resource (saturating).
    pub fn add(&mut self, other: &Resources) {
        self.combine(other, i64::saturating_add);
    }

    /// Subtracts `other` from `self`, resource by resource (saturating).
    pub fn sub(&mut self, other: &Resources) {
        self.combine(other, i64::saturating_sub);
    }

    /// Raises each amount of `self` to at least that of `other`.
    pub fn max_with(&mut self, other: &Resources) {
        self.combine(other, i64::max);
    }

    fn combine(&mut self, other: &Resources, f: impl Fn(i64, i64) -> i64) {
        self.cpu_milli = f(self.cpu_milli, other.cpu_milli);
        self.memory = f(self.memory, other.memory);
        self.ephemeral_storage = f(self.ephemeral_storage, other.ephemeral_storage);
        self.pods = f(self.pods, other.pods);
        self.gpus = f(self.gpus, other.gpus);
        for (name, amount) in &other.extended {
            let mine = self.extended_amount(name);
            self.set(name, f(mine, *amount));
        }
    }

    /// Reads a `requests`/`allocatable` map: cpu as millicores, everything else rounded up to
    /// whole units, as kube-scheduler does.
    pub fn from_quantities(map: &BTreeMap<String, Quantity>) -> Result<Self, ResourceError> {
        let mut out = Resources::new();
        for (name, quantity) in map {
            let parsed = if name == CPU { parse_milli_value(&quantity.0) } else { parse_value(&quantity.0) };
            let amount = parsed.map_err(|source| ResourceError { resource: name.clone(), source })?;
            out.set(name, amount);
        }
        Ok(out)
    }
}

/// What a pod asks of a node, as kube-scheduler computes it: the larger of the app containers
/// (with restartable init containers, "sidecars", running beside them) and the peak of the init
/// phase, then pod-level requests where set, plus overhead; always one pod.
pub fn pod_requests(spec: &PodSpec) -> Result<Resources, ResourceError> {
    let mut requests = Resources::new();
    for container in &spec.containers {
        requests.add(&container_requests(container)?);
    }
    let mut sidecars = Resources::new();
    let mut init_peak = Resources::new();
    for container in spec.init_containers.iter().flatten() {
        let own = container_requests(container)?;
        let during = if container.restart_policy.as_deref() == Some("Always") {
            requests.add(&own);
            sidecars.add(&own);
            sidecars.clone()
        } else {
            let mut during = sidecars.clone();
            during.add(&own);
            during
        };
        init_peak.max_with(&during);
    }
    requests.max_with(&init_peak);
    if let Some(pod_level) = spec.resources.as_ref().and_then(|r| r.requests.as_ref()) {
        for (name, amount) in Resources::from_quantities(pod_level)?.iter() {
            requests.set(name, amount);
        }
    }
    if let Some(overhead) = &spec.overhead {
        requests.add(&Resources::from_quantities(overhead)?);
    }
    requests.pods = 1;
    Ok(requests)
}

fn container_requests(container: &Container) -> Result<Resources, ResourceError> {
    match container.resources.as_ref().and_then(|r| r.requests.as_ref()) {
        Some(map) => Resources::from_quantities(map),
        None => Ok(Resources::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ResourceRequirements;

    fn quantities(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
        pairs.iter().map(|(k, v)| (k.to_string(), Quantity(v.to_string()))).collect()
    }

    fn container(name: &str, requests: &[(&str, &str)], restart_policy: Option<&str>) -> Container {
        Container {
            name: name.into(),
            resources: Some(ResourceRequirements { requests: Some(quantities(requests)), ..Default::default() }),
            restart_policy: restart_policy.map(String::from),
            ..Default::default()
        }
    }

    #[test]
    fn reads_well_known_and_extended_resources() {
        let r = Resources::from_quantities(&quantities(&[
            ("cpu", "1500m"),
            ("memory", "2Gi"),
            ("ephemeral-storage", "10G"),
            ("pods", "110"),
            ("nvidia.com/gpu", "8"),
            ("hugepages-2Mi", "0"),
        ]))
        .unwrap();
        assert_eq!(r.cpu_milli, 1500);
        assert_eq!(r.memory, 2 << 30);
        assert_eq!(r.ephemeral_storage, 10_000_000_000);
        assert_eq!(r.pods, 110);
        assert_eq!((r.get("nvidia.com/gpu"), r.gpus), (8, 8));
        assert_eq!(r.extended().count(), 0, "GPUs are inline and zero amounts are not stored");
        assert_eq!(
            r.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            vec!["cpu", "memory", "ephemeral-storage", "pods", "nvidia.com/gpu"]
        );
    }

    #[test]
    fn a_bad_quantity_names_its_resource() {
        let err = Resources::from_quantities(&quantities(&[("memory", "lots")])).unwrap_err();
        assert_eq!(err.resource, "memory");
        assert_eq!(err.to_string(), "resource memory: quantity \"lots\" is not a number with an optional suffix");
    }

    #[test]
    fn arithmetic_keeps_extended_resources_sorted_and_drops_zeros() {
        let mut a = Resources::new().with("b.io/x", 2).with("a.io/y", 1).with(CPU, 100);
        let b = Resources::new().with("b.io/x", 2).with("c.io/z", 5);
        a.sub(&b);
        assert_eq!(a.extended().collect::<Vec<_>>(), vec![("a.io/y", 1), ("c.io/z", -5)]);
        a.add(&b);
        assert_eq!(a.extended().collect::<Vec<_>>(), vec![("a.io/y", 1), ("b.io/x", 2)]);
        assert_eq!(a, Resources::new().with(CPU, 100).with("a.io/y", 1).with("b.io/x", 2));
    }

    #[test]
    fn pod_requests_sum_containers_and_count_one_pod() {
        let spec = PodSpec {
            containers: vec![
                container("a", &[("cpu", "500m"), ("memory", "1Gi")], None),
                container("b", &[("cpu", "250m"), ("nvidia.com/gpu", "2")], None),
            ],
            ..Default::default()
        };
        let r = pod_requests(&spec).unwrap();
        assert_eq!((r.cpu_milli, r.memory, r.pods, r.get("nvidia.com/gpu")), (750, 1 << 30, 1, 2));
    }

    #[test]
    fn pod_requests_take_the_larger_init_container_peak() {
        let spec = PodSpec {
            containers: vec![container("app", &[("cpu", "1"), ("memory", "1Gi")], None)],
            init_containers: Some(vec![
                container("init-a", &[("cpu", "2")], None),
                container("init-b", &[("memory", "3Gi")], None),
            ]),
            ..Default::default()
        };
        let r = pod_requests(&spec).unwrap();
        assert_eq!((r.cpu_milli, r.memory), (2000, 3 << 30));
    }

    #[test]
    fn sidecars_run_beside_later_init_containers_and_the_app() {
        let spec = PodSpec {
            containers: vec![container("app", &[("cpu", "1")], None)],
            init_containers: Some(vec![
                container("sidecar", &[("cpu", "500m")], Some("Always")),
                container("init", &[("cpu", "2")], None),
            ]),
            ..Default::default()
        };
        // Init phase peak: sidecar 0.5 + init 2 = 2.5; steady state: app 1 + sidecar 0.5 = 1.5.
        assert_eq!(pod_requests(&spec).unwrap().cpu_milli, 2500);
    }

    #[test]
    fn pod_level_requests_replace_and_overhead_adds() {
        let spec = PodSpec {
            containers: vec![container("app", &[("cpu", "1"), ("memory", "1Gi")], None)],
            resources: Some(ResourceRequirements { requests: Some(quantities(&[("cpu", "4")])), ..Default::default() }),
            overhead: Some(quantities(&[("cpu", "100m"), ("memory", "64Mi")])),
            ..Default::default()
        };
        let r = pod_requests(&spec).unwrap();
        assert_eq!((r.cpu_milli, r.memory), (4100, (1 << 30) + (64 << 20)));
    }
}

//! PURE DRA (`resource.k8s.io/v1`) allocation model: ResourceSlices, DeviceClasses and
//! ResourceClaims in, the devices a claim may get and the `status.allocation` kube-scheduler
//! would write for them out. No client, no clock, no randomness; a malformed object becomes a
//! [`DraProblem`] or a [`ClaimError`] naming it, never a panic.
//!
//! The rules follow kube-scheduler's structured allocator
//! (`k8s.io/dynamic-resource-allocation/structured/internal/stable/pools_stable.go` and
//! `allocator_stable.go`), so an allocation muster writes is one kube-scheduler would accept.

mod cel;
mod inventory;
pub mod nvidia;
mod request;

/// Slices and classes shaped like NVIDIA's DRA driver publishes them, for tests, the e2e fake
/// driver and benchmarks (not part of muster's API).
#[doc(hidden)]
pub mod fixtures;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod quality_tests;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::NodeSelector as K8sNodeSelector;
use k8s_openapi::api::resource::v1::{AllocationResult, ResourceSlice};

use crate::devices::MAX_GPUS;
use crate::devices::topology::{Gpu, GpuTopology, Link, TopologyError, TopologyProblem};
use crate::scheduler::{Labels, NodeSelectorTerm};

pub use inventory::{DraProblem, Inventory, Partition};
pub use request::{ClaimError, DeviceRequestSet};

/// The driver name of NVIDIA's DRA driver for GPUs.
pub const NVIDIA_GPU_DRIVER: &str = "gpu.nvidia.com";
/// Finalizer kube-scheduler puts on claims it allocates; muster does the same.
pub const DELETE_PROTECTION_FINALIZER: &str = "resource.kubernetes.io/delete-protection";
/// `allocationMode` of a request for a fixed number of devices (the default).
pub const ALLOCATION_MODE_EXACT_COUNT: &str = "ExactCount";
/// `source` of an allocation config copied from the DeviceClass.
pub const CONFIG_SOURCE_CLASS: &str = "FromClass";
/// `source` of an allocation config copied from the claim.
pub const CONFIG_SOURCE_CLAIM: &str = "FromClaim";

/// One device: the `(driver, pool, device)` triple an allocation result names.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId {
    /// The driver that publishes the device.
    pub driver: String,
    /// The pool within the driver.
    pub pool: String,
    /// The device name, unique within the pool.
    pub device: String,
}

impl std::fmt::Display for DeviceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.driver, self.pool, self.device)
    }
}

/// Where a device can be used from: its slice's nodeName, nodeSelector, allNodes (or the
/// device's own when perDeviceNodeSelection).
#[derive(Clone, Debug, PartialEq)]
pub enum Reach {
    /// Only on this node.
    Node(String),
    /// On nodes matching one of the terms.
    Selector(Vec<NodeSelectorTerm>),
    /// On every node.
    AllNodes,
}

impl Reach {
    /// Whether a pod on this node can use the device.
    pub fn reaches(&self, node_name: &str, labels: &Labels) -> bool {
        match self {
            Reach::Node(n) => n == node_name,
            Reach::Selector(terms) => terms.iter().any(|t| t.matches(node_name, labels)),
            Reach::AllNodes => true,
        }
    }

    /// How wide the reach is, widest first (for [`Inventory::choose_shared`]).
    fn rank(&self) -> u8 {
        match self {
            Reach::AllNodes => 0,
            Reach::Selector(_) => 1,
            Reach::Node(_) => 2,
        }
    }
}

/// The claim holding a device.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClaimKey {
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name.
    pub name: String,
}

impl std::fmt::Display for ClaimKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The reach of an allocation: the node selector an allocation carries (None = everywhere),
/// as kube-scheduler reads it back from `status.allocation.nodeSelector`.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct SharedReach {
    selector: Option<K8sNodeSelector>,
    terms: Vec<NodeSelectorTerm>,
}

impl SharedReach {
    /// Usable from every node.
    pub fn everywhere() -> Self {
        SharedReach::default()
    }

    /// Usable from one node only, written as the allocator writes a node-local allocation.
    pub fn node(node: &str) -> Self {
        let selector = node_name_selector(node);
        let terms = terms_from_k8s(&selector).unwrap_or_default();
        SharedReach { selector: Some(selector), terms }
    }

    /// The reach of an existing allocation; Err when its node selector cannot be parsed.
    pub fn of_allocation(a: &AllocationResult) -> Result<Self, String> {
        match &a.node_selector {
            None => Ok(SharedReach::everywhere()),
            Some(s) => Self::of_selector(s),
        }
    }

    fn of_selector(s: &K8sNodeSelector) -> Result<Self, String> {
        let terms = terms_from_k8s(s).map_err(|e| format!("status.allocation.nodeSelector: {e}"))?;
        Ok(SharedReach { selector: Some(s.clone()), terms })
    }

    /// Whether pods on this node can use the allocation (kube's node selector semantics: some
    /// term matches; an empty selector matches nothing).
    pub fn reaches(&self, node_name: &str, labels: &Labels) -> bool {
        match &self.selector {
            None => true,
            Some(_) => self.terms.iter().any(|t| t.matches(node_name, labels)),
        }
    }

    /// The node selector to write into `status.allocation.nodeSelector`.
    pub fn node_selector(&self) -> Option<&K8sNodeSelector> {
        self.selector.as_ref()
    }
}

/// The node selector kube-scheduler's allocator writes when a device is local to one node:
/// one term, `matchFields: metadata.name In [node]`.
pub fn node_name_selector(node: &str) -> K8sNodeSelector {
    use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm as K8sTerm};
    K8sNodeSelector {
        node_selector_terms: vec![K8sTerm {
            match_fields: Some(vec![NodeSelectorRequirement {
                key: "metadata.name".to_string(),
                operator: "In".to_string(),
                values: Some(vec![node.to_string()]),
            }]),
            match_expressions: None,
        }],
    }
}

/// Node selector terms of a Kubernetes selector (an unknown operator is an error).
pub(crate) fn terms_from_k8s(s: &K8sNodeSelector) -> Result<Vec<NodeSelectorTerm>, String> {
    crate::scheduler::terms_from_k8s(s).map_err(|e| e.to_string())
}

/// The whole GPUs each node's GPU driver publishes ([`published_gpus`]), by node name.
pub type Published = HashMap<String, Arc<PublishedGpus>>;

/// One whole GPU a node's GPU driver publishes, as the GPU model reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PublishedGpu {
    /// Its `uuid` attribute.
    pub uuid: Option<String>,
    /// Its `resource.kubernetes.io/pcieRoot` attribute.
    pub pcie_root: Option<String>,
    /// Its `resource.kubernetes.io/numaNode` attribute (an int, or the first of a list).
    pub numa: Option<u32>,
}

/// The whole GPUs a node's GPU driver publishes (the newest generation of each of the node's
/// pools; devices whose `type` is absent or `gpu`), by GPU slot ([`device_slot`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PublishedGpus {
    /// Slot -> the GPU.
    pub gpus: BTreeMap<usize, PublishedGpu>,
}

impl PublishedGpus {
    /// How many whole GPUs are published.
    pub fn len(&self) -> usize {
        self.gpus.len()
    }

    /// Whether none are.
    pub fn is_empty(&self) -> bool {
        self.gpus.is_empty()
    }

    /// The GPU count a model of them needs: the highest slot plus one (slots may have gaps:
    /// a GPU the driver does not publish, e.g. one in MIG mode).
    pub fn slots(&self) -> u64 {
        self.gpus.keys().next_back().map_or(0, |s| *s as u64 + 1)
    }

    /// The topology the driver's attributes give, without the node agent: GPUs behind one PCIe
    /// root complex are `PXB`, GPUs of one NUMA node `NODE`, GPUs of different NUMA nodes (or
    /// of unknown NUMA behind different roots) `SYS`. Known when every GPU has a pcieRoot or a
    /// NUMA node; a slot without a published GPU is a GPU of unknown place. Shared between
    /// nodes of the same layout (no UUIDs in it: a device is joined by its slot).
    pub fn topology(&self) -> Arc<GpuTopology> {
        let n = usize::try_from(self.slots()).unwrap_or(MAX_GPUS).min(MAX_GPUS);
        let place: Vec<Option<&PublishedGpu>> = (0..n).map(|i| self.gpus.get(&i)).collect();
        let known = place.iter().all(|g| g.is_some_and(|g| g.pcie_root.is_some() || g.numa.is_some()));
        let gpus: Vec<Gpu> =
            place.iter().map(|g| Gpu { uuid: None, numa: g.and_then(|g| g.numa), memory_mib: None }).collect();
        let link = |i: usize, j: usize| {
            let (Some(a), Some(b)) = (place[i], place[j]) else { return Link::Sys };
            if a.pcie_root.is_some() && a.pcie_root == b.pcie_root {
                Link::Pxb
            } else if a.numa.is_some() && a.numa == b.numa {
                Link::Node
            } else {
                Link::Sys
            }
        };
        let topology = GpuTopology::from_links(gpus, link, known);
        intern(topology)
    }

    /// The model of a node whose driver publishes these GPUs: its topology annotation
    /// (`annotation`, as parsed) when it names exactly the published GPUs by UUID (then a
    /// device is joined to its GPU by `uuid`), else [`Self::topology`]; with why the
    /// annotation was not used, when there is one.
    pub fn checked(
        &self,
        annotation: Option<&Result<Arc<GpuTopology>, TopologyError>>,
    ) -> (Arc<GpuTopology>, Option<TopologyProblem>) {
        let published = self.slots();
        let problem = |error: TopologyError| Some(TopologyProblem { error: Some(error), allocatable: published });
        match annotation {
            None => (self.topology(), None),
            Some(Err(e)) => (self.topology(), problem(e.clone())),
            Some(Ok(model)) => {
                let annotated: HashSet<&str> = model.gpus().iter().filter_map(|g| g.uuid.as_deref()).collect();
                let unknown: Vec<String> = self
                    .gpus
                    .values()
                    .map(|g| g.uuid.as_deref().unwrap_or("(no uuid)"))
                    .filter(|u| !annotated.contains(u))
                    .take(3)
                    .map(str::to_string)
                    .collect();
                if unknown.is_empty() && model.len() == self.len() {
                    return (model.clone(), None);
                }
                let error = TopologyError::DevicesDisagree { annotated: model.len(), published: self.len(), unknown };
                (self.topology(), problem(error))
            }
        }
    }
}

/// One shared copy per layout: every node of a kind (5,000 of them) holds the same model.
fn intern(topology: GpuTopology) -> Arc<GpuTopology> {
    type Shared = HashMap<Arc<crate::devices::topology::SelectionKey>, Arc<GpuTopology>>;
    static SHARED: std::sync::LazyLock<Mutex<Shared>> = std::sync::LazyLock::new(Default::default);
    // A poisoned lock (a panic elsewhere), or a map grown past any real cluster's layouts:
    // a copy of its own.
    let Ok(mut shared) = SHARED.lock() else { return Arc::new(topology) };
    if let Some(t) = shared.get(&topology.selection_key()) {
        return t.clone();
    }
    let t = Arc::new(topology);
    if shared.len() < 4096 {
        shared.insert(t.selection_key(), t.clone());
    }
    t
}

/// The attribute `name` of a device of `driver`, unqualified or qualified with the driver.
pub(crate) fn attribute<'d>(
    device: &'d k8s_openapi::api::resource::v1::Device,
    driver: &str,
    name: &str,
) -> Option<&'d k8s_openapi::api::resource::v1::DeviceAttribute> {
    let attrs = device.attributes.as_ref()?;
    attrs.get(name).or_else(|| attrs.get(&format!("{driver}/{name}")))
}

/// Whether a device of the GPU driver is a whole GPU: its `type` is absent or `gpu` (MIG
/// devices are `mig`, passthrough `vfio`).
pub fn is_whole_gpu(device: &k8s_openapi::api::resource::v1::Device, gpu_driver: &str) -> bool {
    attribute(device, gpu_driver, "type").and_then(|a| a.string.as_deref()).is_none_or(|k| k == "gpu")
}

/// The GPU slot of a whole GPU without the node agent: the int `index` attribute (the driver
/// until 2025), else its `minor` int attribute, else the minor in its name `gpu-<minor>`
/// (today's driver publishes neither attribute; the name is the device minor, `/dev/nvidia<minor>`).
pub fn device_slot(device: &k8s_openapi::api::resource::v1::Device, gpu_driver: &str) -> Option<usize> {
    let int =
        |name: &str| attribute(device, gpu_driver, name).and_then(|a| a.int).and_then(|i| usize::try_from(i).ok());
    int("index").or_else(|| int("minor")).or_else(|| {
        let digits = device.name.strip_prefix("gpu-")?;
        if digits.is_empty() || digits.len() > 4 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok()
    })
}

/// The NUMA node a device's `resource.kubernetes.io/numaNode` attribute names (an int, or the
/// first of a list of ints).
fn numa_of(device: &k8s_openapi::api::resource::v1::Device, driver: &str) -> Option<u32> {
    let a = attribute(device, driver, nvidia::NUMA_NODE_ATTRIBUTE)?;
    let n = a.int.or_else(|| a.ints.as_ref().and_then(|v| v.first().copied()))?;
    u32::try_from(n).ok()
}

/// The whole GPUs of `gpu_driver` each node's slices publish (the newest generation of each
/// pool), by slot, before anything else is checked: what a node's GPU model is built from
/// without the node agent, and what its topology annotation is compared with. A GPU without a
/// slot is left out here (the inventory reports it).
pub fn published_gpus(slices: &[ResourceSlice], gpu_driver: &str) -> Published {
    let mut newest: HashMap<(&str, &str), i64> = HashMap::new();
    for s in slices.iter().filter(|s| s.spec.driver == gpu_driver) {
        let g = newest.entry((s.spec.driver.as_str(), s.spec.pool.name.as_str())).or_insert(s.spec.pool.generation);
        *g = (*g).max(s.spec.pool.generation);
    }
    let mut out: HashMap<String, PublishedGpus> = HashMap::new();
    for s in slices.iter().filter(|s| s.spec.driver == gpu_driver) {
        let current = newest.get(&(s.spec.driver.as_str(), s.spec.pool.name.as_str())) == Some(&s.spec.pool.generation);
        let Some(node) = s.spec.node_name.as_deref().filter(|_| current) else { continue };
        let node_gpus = out.entry(node.to_string()).or_default();
        for d in s.spec.devices.iter().flatten().filter(|d| is_whole_gpu(d, gpu_driver)) {
            let Some(slot) = device_slot(d, gpu_driver).filter(|s| *s < MAX_GPUS) else { continue };
            let text = |name: &str| attribute(d, gpu_driver, name).and_then(|a| a.string.clone());
            node_gpus.gpus.entry(slot).or_insert(PublishedGpu {
                uuid: text("uuid"),
                pcie_root: text(nvidia::PCIE_ROOT_ATTRIBUTE),
                numa: numa_of(d, gpu_driver),
            });
        }
    }
    out.into_iter().map(|(n, g)| (n, Arc::new(g))).collect()
}

/// Devices named by an allocation, in result order.
pub fn allocated_devices(a: &AllocationResult) -> Vec<DeviceId> {
    a.devices
        .iter()
        .flat_map(|d| d.results.iter().flatten())
        .map(|r| DeviceId { driver: r.driver.clone(), pool: r.pool.clone(), device: r.device.clone() })
        .collect()
}

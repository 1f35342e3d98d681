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

use std::collections::HashMap;

use k8s_openapi::api::core::v1::NodeSelector as K8sNodeSelector;
use k8s_openapi::api::resource::v1::{AllocationResult, ResourceSlice};

use crate::scheduler::{Labels, NodeSelectorTerm};

pub use inventory::{DraProblem, Inventory};
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

/// How many whole GPUs of `gpu_driver` each node's slices publish (the newest generation of
/// each pool; devices whose `type` attribute is absent or `gpu`), before anything else is
/// checked: what a node's topology annotation is compared with.
pub fn published_gpus(slices: &[ResourceSlice], gpu_driver: &str) -> HashMap<String, u64> {
    let mut newest: HashMap<(&str, &str), i64> = HashMap::new();
    for s in slices.iter().filter(|s| s.spec.driver == gpu_driver) {
        let g = newest.entry((s.spec.driver.as_str(), s.spec.pool.name.as_str())).or_insert(s.spec.pool.generation);
        *g = (*g).max(s.spec.pool.generation);
    }
    let mut out: HashMap<String, u64> = HashMap::new();
    for s in slices.iter().filter(|s| s.spec.driver == gpu_driver) {
        let current = newest.get(&(s.spec.driver.as_str(), s.spec.pool.name.as_str())) == Some(&s.spec.pool.generation);
        let Some(node) = s.spec.node_name.as_deref().filter(|_| current) else { continue };
        let whole = s.spec.devices.iter().flatten().filter(|d| {
            let kind = d.attributes.as_ref().and_then(|a| {
                a.get("type").or_else(|| a.get(&format!("{gpu_driver}/type"))).and_then(|v| v.string.as_deref())
            });
            kind.is_none_or(|k| k == "gpu")
        });
        *out.entry(node.to_string()).or_default() += whole.count() as u64;
    }
    out
}

/// Devices named by an allocation, in result order.
pub fn allocated_devices(a: &AllocationResult) -> Vec<DeviceId> {
    a.devices
        .iter()
        .flat_map(|d| d.results.iter().flatten())
        .map(|r| DeviceId { driver: r.driver.clone(), pool: r.pool.clone(), device: r.device.clone() })
        .collect()
}

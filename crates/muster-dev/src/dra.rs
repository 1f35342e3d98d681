//! `muster dev dra-slices`: a fake DRA driver for kwok GPU nodes. It publishes what NVIDIA's DRA
//! driver (`gpu.nvidia.com`, its GPU kubelet plugin) publishes on a real GPU node: one
//! ResourceSlice per node (`spec.nodeName` = the node, pool = the node, generation 1, owned by
//! the Node) with a device `gpu-<index>` per GPU, and the DeviceClass `gpu.nvidia.com` that
//! selects them. No kubelet plugin runs, so nothing is ever prepared: this is for kube-scheduler,
//! kube-controller-manager and muster's allocator only.
//!
//! The objects are built here and only here: the CLI and the e2e harness
//! (`tests/e2e/harness/dra.rs`) both call [`publish`] / [`unpublish`]. The shapes are pure
//! ([`nvidia_gpu_slice`], [`slice_for_node`], [`device_class`]); GPU UUIDs are those of the
//! node's `gpu.muster.dev/topology` annotation when it has one, so a DRA device and the GPU
//! muster's topology knows are one and the same.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};

use super::topology::gpu_uuid;
use super::{Error, FIELD_MANAGER, GPU_PRODUCT_LABEL, GPU_RESOURCE, KWOK_NODE, defaults};
use muster_api::GPU_TOPOLOGY_ANNOTATION;
use muster_core::devices::TopologyAnnotation;
/// The shapes NVIDIA's driver publishes, defined in the core (`devices::dra::nvidia`).
pub use muster_core::devices::dra::nvidia::{
    CUDA_DRIVER_VERSION, DEVICE_CLASS, DEVICE_CLASS_SELECTOR, DRIVER, DRIVER_VERSION, GpuModel, NvidiaGpu,
    PCIE_ROOT_ATTRIBUTE, nvidia_gpu_device, nvidia_gpu_slice, slice_name,
};

/// PURE: the model of a GPU from its product label (`nvidia.com/gpu.product`); `None`: the
/// product `muster dev add-nodes` gives a node by default.
pub fn gpu_model(product_label: Option<&str>) -> GpuModel {
    muster_core::devices::dra::nvidia::gpu_model(product_label.unwrap_or(defaults::GPU_PRODUCT))
}

/// Label on every object `muster dev dra-slices` publishes (what `--delete` removes).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";

/// `meta` labelled as published by `muster dev` (what [`unpublish`] and `--delete` find).
fn labelled(meta: &mut ObjectMeta) {
    meta.labels.get_or_insert_default().insert(MANAGED_BY_LABEL.to_string(), FIELD_MANAGER.to_string());
}

/// PURE: the DeviceClass `gpu.nvidia.com`, labelled as published by `muster dev`.
pub fn device_class() -> DeviceClass {
    let mut class = muster_core::devices::dra::nvidia::device_class();
    labelled(&mut class.metadata);
    class
}

/// The PCIe bus of GPU `index` (0x18, 0x28, ...; as spread out as on an 8-GPU HGX board).
fn pcie_bus(index: u32) -> u32 {
    (0x18 + 0x10 * index) % 0x100
}

/// PURE: the GPUs of `node`: from its `gpu.muster.dev/topology` annotation (UUIDs, memory, and
/// the links: GPUs linked `PIX`, `PXB` or `PHB` share a PCIe root complex), else `nvidia.com/gpu`
/// allocatable GPUs with the UUIDs `muster dev add-nodes` gives a node without topology (default
/// seed) and the default memory. Empty for a node without GPUs.
pub fn node_gpus(node: &Node) -> Vec<NvidiaGpu> {
    let name = node.name_any();
    let annotation = node
        .annotations()
        .get(GPU_TOPOLOGY_ANNOTATION)
        .and_then(|json| serde_json::from_str::<TopologyAnnotation>(json).ok())
        .filter(|t| !t.gpus.is_empty());
    let mut gpus: Vec<(u32, String, u64)> = match &annotation {
        Some(t) => t
            .gpus
            .iter()
            .map(|g| {
                (
                    g.index,
                    g.uuid.clone().unwrap_or_else(|| gpu_uuid(defaults::UUID_SEED, &name, g.index)),
                    g.memory_mib.unwrap_or(defaults::GPU_MEMORY_MIB),
                )
            })
            .collect(),
        None => {
            let count = node
                .status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref())
                .and_then(|a| a.get(GPU_RESOURCE))
                .and_then(|q| q.0.parse::<u32>().ok())
                .unwrap_or(0);
            (0..count).map(|i| (i, gpu_uuid(defaults::UUID_SEED, &name, i), defaults::GPU_MEMORY_MIB)).collect()
        }
    };
    gpus.sort_by_key(|g| g.0);
    let same_root = |i: u32, j: u32| -> bool {
        let Some(t) = &annotation else { return false };
        let link = t.links.get(i as usize).and_then(|row| row.get(j as usize));
        matches!(link.map(String::as_str), Some("PIX" | "PXB" | "PHB"))
    };
    gpus.iter()
        .map(|(index, uuid, memory_mib)| {
            // The root complex of the lowest-numbered GPU sharing it.
            let leader = gpus.iter().map(|g| g.0).find(|&j| j == *index || same_root(*index, j)).unwrap_or(*index);
            NvidiaGpu {
                index: *index,
                uuid: uuid.clone(),
                memory_mib: *memory_mib,
                pcie_bus_id: format!("0000:{:02x}:00.0", pcie_bus(*index)),
                pcie_root: format!("pci0000:{:02x}", pcie_bus(leader) - 3),
            }
        })
        .collect()
}

/// PURE: the ResourceSlice of `node` (generation 1), owned by the Node as the driver's slices
/// are (the garbage collector removes it with the node); `None` for a node without GPUs.
pub fn slice_for_node(node: &Node) -> Option<ResourceSlice> {
    let gpus = node_gpus(node);
    if gpus.is_empty() {
        return None;
    }
    let name = node.name_any();
    let model = gpu_model(node.labels().get(GPU_PRODUCT_LABEL).map(String::as_str));
    let mut slice = nvidia_gpu_slice(&name, &model, &gpus, 1);
    labelled(&mut slice.metadata);
    if let Some(uid) = node.uid() {
        slice.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name,
            uid,
            ..Default::default()
        }]);
    }
    Some(slice)
}

/// Whether kwok manages `node` (a fake node: `muster dev` never publishes slices for a real one,
/// whose driver does).
pub fn is_fake_node(node: &Node) -> bool {
    node.annotations().get(KWOK_NODE).map(String::as_str) == Some("fake")
}

/// The fake nodes with GPUs (`--all-gpu-nodes`), by name.
pub async fn fake_gpu_nodes(client: &Client) -> Result<Vec<String>, Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut names: Vec<String> = nodes
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|n| is_fake_node(n) && !node_gpus(n).is_empty())
        .map(ResourceExt::name_any)
        .collect();
    names.sort();
    Ok(names)
}

/// Applies the DeviceClass and the ResourceSlice of each of `nodes` (server-side apply:
/// idempotent). Refuses a node that does not exist, is not a kwok node, or has no GPUs, before
/// writing anything. Returns the slice names, in the order of `nodes`.
pub async fn publish(client: &Client, nodes: &[String]) -> Result<Vec<String>, Error> {
    let node_api: Api<Node> = Api::all(client.clone());
    let mut slices = Vec::new();
    for name in nodes {
        let node = node_api.get_opt(name).await?.ok_or_else(|| Error::Dra(format!("node {name} not found")))?;
        if !is_fake_node(&node) {
            return Err(Error::Dra(format!(
                "node {name} is not a kwok node ({KWOK_NODE}=fake): its own driver publishes"
            )));
        }
        slices.push(slice_for_node(&node).ok_or_else(|| Error::Dra(format!("node {name} has no GPUs")))?);
    }
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let classes: Api<DeviceClass> = Api::all(client.clone());
    classes.patch(DEVICE_CLASS, &params, &Patch::Apply(&device_class())).await?;
    let slice_api: Api<ResourceSlice> = Api::all(client.clone());
    let mut names = Vec::new();
    for slice in slices {
        let name = slice.name_any();
        slice_api.patch(&name, &params, &Patch::Apply(&slice)).await?;
        names.push(name);
    }
    Ok(names)
}

/// Deletes the slices [`publish`] made for `nodes` (those with [`MANAGED_BY_LABEL`] and driver
/// `gpu.nvidia.com` on these nodes; any other slice stays). Returns the names deleted.
pub async fn unpublish(client: &Client, nodes: &[String]) -> Result<Vec<String>, Error> {
    let slice_api: Api<ResourceSlice> = Api::all(client.clone());
    let lp = ListParams::default().labels(&format!("{MANAGED_BY_LABEL}={FIELD_MANAGER}"));
    let mut deleted = Vec::new();
    for slice in slice_api.list(&lp).await?.items {
        let on = slice.spec.node_name.as_deref().unwrap_or_default();
        if slice.spec.driver == DRIVER && nodes.iter().any(|n| n == on) {
            let name = slice.name_any();
            match slice_api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => deleted.push(name),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    deleted.sort();
    Ok(deleted)
}

/// Deletes the DeviceClass when [`publish`] made it (it carries [`MANAGED_BY_LABEL`]); whether
/// it was deleted.
pub async fn delete_device_class(client: &Client) -> Result<bool, Error> {
    let classes: Api<DeviceClass> = Api::all(client.clone());
    let Some(class) = classes.get_opt(DEVICE_CLASS).await? else { return Ok(false) };
    if class.labels().get(MANAGED_BY_LABEL).map(String::as_str) != Some(FIELD_MANAGER) {
        return Ok(false);
    }
    match classes.delete(DEVICE_CLASS, &DeleteParams::default()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FakeGpuNodes, TopologyKind, fake_node};
    use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, ResourcePool};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn attr<'a>(d: &'a Device, name: &str) -> &'a DeviceAttribute {
        &d.attributes.as_ref().unwrap()[name]
    }

    #[test]
    fn slice_is_shaped_like_nvidias_and_uuids_are_the_topology_uuids() {
        let node = fake_node(&FakeGpuNodes::default(), 2).unwrap();
        let topology: TopologyAnnotation = serde_json::from_str(&node.annotations()[GPU_TOPOLOGY_ANNOTATION]).unwrap();
        let slice = slice_for_node(&node).unwrap();
        assert_eq!(slice.metadata.name.as_deref(), Some("kwok-gpu-2-gpu.nvidia.com"));
        assert_eq!(slice.spec.driver, "gpu.nvidia.com");
        assert_eq!(slice.spec.node_name.as_deref(), Some("kwok-gpu-2"));
        assert_eq!(slice.spec.pool, ResourcePool { name: "kwok-gpu-2".into(), generation: 1, resource_slice_count: 1 });
        let devices = slice.spec.devices.as_ref().unwrap();
        assert_eq!(devices.len(), 8);
        for (i, d) in devices.iter().enumerate() {
            assert_eq!(d.name, format!("gpu-{i}"));
            assert_eq!(attr(d, "type").string.as_deref(), Some("gpu"));
            assert_eq!(attr(d, "uuid").string, topology.gpus[i].uuid);
            assert_eq!(attr(d, "index").int, Some(i as i64));
            assert_eq!(attr(d, "minor").int, Some(i as i64));
            assert_eq!(attr(d, "productName").string.as_deref(), Some("NVIDIA H100 80GB HBM3"));
            assert_eq!(attr(d, "architecture").string.as_deref(), Some("Hopper"));
            assert_eq!(attr(d, "cudaComputeCapability").version.as_deref(), Some("9.0.0"));
            assert_eq!(attr(d, "driverVersion").version.as_deref(), Some(DRIVER_VERSION));
            assert!(attr(d, "pcieBusID").string.as_deref().unwrap().starts_with("0000:"));
            assert!(attr(d, PCIE_ROOT_ATTRIBUTE).string.as_deref().unwrap().starts_with("pci0000:"));
            assert_eq!(d.capacity.as_ref().unwrap()["memory"].value, Quantity("81920Mi".into()));
        }
        // NVSwitch: every GPU behind its own root complex.
        let roots: std::collections::BTreeSet<_> =
            devices.iter().map(|d| attr(d, PCIE_ROOT_ATTRIBUTE).string.clone()).collect();
        assert_eq!(roots.len(), 8);
    }

    #[test]
    fn pcie_pairs_share_a_root_and_no_topology_falls_back_to_allocatable() {
        let pcie = fake_node(&FakeGpuNodes { topology: TopologyKind::Pcie, ..FakeGpuNodes::default() }, 0).unwrap();
        let gpus = node_gpus(&pcie);
        assert_eq!(gpus[0].pcie_root, gpus[1].pcie_root);
        assert_ne!(gpus[1].pcie_root, gpus[2].pcie_root);

        let spec = FakeGpuNodes { topology: TopologyKind::None, gpus: 4, ..FakeGpuNodes::default() };
        let bare = fake_node(&spec, 1).unwrap();
        let gpus = node_gpus(&bare);
        assert_eq!(gpus.len(), 4);
        assert_eq!(gpus[3].uuid, gpu_uuid(defaults::UUID_SEED, "kwok-gpu-1", 3));
        assert!(slice_for_node(&fake_node(&FakeGpuNodes { gpus: 0, ..FakeGpuNodes::default() }, 0).unwrap()).is_none());
    }

    #[test]
    fn device_class_selects_whole_gpus_of_the_driver() {
        let class = device_class();
        assert_eq!(class.metadata.name.as_deref(), Some("gpu.nvidia.com"));
        let selectors = class.spec.unwrap().selectors.unwrap();
        assert_eq!(
            selectors[0].cel.as_ref().unwrap().expression,
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
        );
    }

    #[test]
    fn models_follow_the_product() {
        assert_eq!(gpu_model(Some("NVIDIA-A100-SXM4-80GB")).architecture, "Ampere");
        assert_eq!(gpu_model(Some("NVIDIA-B200")).compute_capability, "10.0.0");
        assert_eq!(gpu_model(Some("NVIDIA-L40S")).architecture, "Ada Lovelace");
        assert_eq!(gpu_model(None).product_name, "NVIDIA H100 80GB HBM3");
    }
}

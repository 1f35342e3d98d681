//! `muster dev dra-slices`: a fake DRA driver for kwok GPU nodes. It publishes what NVIDIA's DRA
//! driver (`gpu.nvidia.com`, its GPU kubelet plugin) publishes on a real GPU node: one
//! ResourceSlice per node (`spec.nodeName` = the node, pool = the node, generation 1, owned by
//! the Node) with a device `gpu-<minor>` per GPU, and the DeviceClass `gpu.nvidia.com` that
//! selects them. By default the devices have today's shape ([`Shape::Current`]: no `index` or
//! `minor` attribute); [`PublishOptions`] asks for the shape the driver had until 2025
//! ([`Shape::Legacy`]), for MIG devices beside some GPUs (and the DeviceClass `mig.nvidia.com`),
//! and for the ComputeDomain plugin's slice (driver `compute-domain.nvidia.com`: `channel-0` and
//! the `daemon`, and the DeviceClass `compute-domain-default-channel.nvidia.com`). No kubelet
//! plugin runs, so nothing is ever prepared: this is for kube-scheduler,
//! kube-controller-manager and muster's allocator only.
//!
//! The objects are built here and only here: the CLI and the e2e harness
//! (`tests/e2e/harness/dra.rs`) both call [`publish_with`] / [`unpublish`]. The shapes are pure
//! ([`slice_for_node`], [`compute_domain_slice_for_node`], [`device_classes`]; the devices
//! themselves are defined once in the core, `muster_core::devices::dra::nvidia`); GPU UUIDs are
//! those of the node's `gpu.muster.dev/topology` annotation when it has one, so a DRA device and
//! the GPU muster's topology knows are one and the same.

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
    ADDRESSING_MODE, COMPUTE_DOMAIN_CHANNEL_CLASS, COMPUTE_DOMAIN_DRIVER, CUDA_DRIVER_VERSION, DEVICE_CLASS,
    DEVICE_CLASS_SELECTOR, DRIVER, DRIVER_VERSION, GpuModel, MIG_DEVICE_CLASS, MigProfile, NUMA_NODE_ATTRIBUTE,
    NvidiaGpu, PCI_BUS_ID_ATTRIBUTE, PCIE_ROOT_ATTRIBUTE, Shape, compute_domain_slice_name, nvidia_gpu_device,
    nvidia_gpu_slice, slice_name,
};
use muster_core::devices::dra::nvidia::{compute_domain_slice, nvidia_gpu_slice_shaped, nvidia_mig_device};

/// PURE: the model of a GPU from its product label (`nvidia.com/gpu.product`); `None`: the
/// product `muster dev add-nodes` gives a node by default.
pub fn gpu_model(product_label: Option<&str>) -> GpuModel {
    muster_core::devices::dra::nvidia::gpu_model(product_label.unwrap_or(defaults::GPU_PRODUCT))
}

/// Label on every object `muster dev dra-slices` publishes (what `--delete` removes).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";

/// The IMEX channels the fake ComputeDomain plugin publishes per node (`channel-0`, the one the
/// default-channel DeviceClass selects).
pub const COMPUTE_DOMAIN_CHANNELS: u32 = 1;

/// The memory slice the one MIG device of a GPU starts at (its placement).
pub const MIG_PLACEMENT: u32 = 0;

/// What [`publish_with`] publishes. The default is what NVIDIA's driver publishes today on a
/// node without MIG or ComputeDomains: whole GPUs in [`Shape::Current`], nothing beside them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PublishOptions {
    /// The shape of the whole-GPU devices.
    pub shape: Shape,
    /// GPU indices (device minors) that also get one `1g.10gb` MIG device (placement
    /// [`MIG_PLACEMENT`]) published beside them in the same slice; the GPU stays published
    /// whole too (static MIG, as the core's fixtures do). Every node published must have them.
    pub mig_parents: Vec<u32>,
    /// Also publish the ComputeDomain kubelet plugin's slice of each node
    /// ([`compute_domain_slice_for_node`]).
    pub compute_domain: bool,
}

impl PublishOptions {
    /// Whether MIG devices are published (and so the DeviceClass `mig.nvidia.com`).
    pub fn publishes_mig(&self) -> bool {
        !self.mig_parents.is_empty()
    }
}

/// What [`publish_with`] applied.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Published {
    /// The DeviceClasses, `gpu.nvidia.com` first.
    pub classes: Vec<String>,
    /// The ResourceSlices: per node, in the order of the nodes, the GPU driver's slice and then
    /// (with [`PublishOptions::compute_domain`]) the ComputeDomain plugin's.
    pub slices: Vec<String>,
}

/// `meta` labelled as published by `muster dev` (what [`unpublish`] and `--delete` find).
fn labelled(meta: &mut ObjectMeta) {
    meta.labels.get_or_insert_default().insert(MANAGED_BY_LABEL.to_string(), FIELD_MANAGER.to_string());
}

fn is_labelled(meta: &ObjectMeta) -> bool {
    meta.labels.as_ref().and_then(|l| l.get(MANAGED_BY_LABEL)).map(String::as_str) == Some(FIELD_MANAGER)
}

fn labelled_class(mut class: DeviceClass) -> DeviceClass {
    labelled(&mut class.metadata);
    class
}

/// PURE: the DeviceClass `gpu.nvidia.com`, labelled as published by `muster dev`.
pub fn device_class() -> DeviceClass {
    labelled_class(muster_core::devices::dra::nvidia::device_class())
}

/// PURE: the DeviceClass `mig.nvidia.com`, labelled as published by `muster dev`.
pub fn mig_device_class() -> DeviceClass {
    labelled_class(muster_core::devices::dra::nvidia::mig_device_class())
}

/// PURE: the DeviceClass `compute-domain-default-channel.nvidia.com`, labelled as published by
/// `muster dev`.
pub fn compute_domain_channel_class() -> DeviceClass {
    labelled_class(muster_core::devices::dra::nvidia::compute_domain_channel_class())
}

/// PURE: the DeviceClasses [`publish_with`] applies for `opts`: `gpu.nvidia.com` always,
/// `mig.nvidia.com` when MIG devices are published, the ComputeDomain default channel's when
/// ComputeDomain slices are.
pub fn device_classes(opts: &PublishOptions) -> Vec<DeviceClass> {
    let mut classes = vec![device_class()];
    if opts.publishes_mig() {
        classes.push(mig_device_class());
    }
    if opts.compute_domain {
        classes.push(compute_domain_channel_class());
    }
    classes
}

/// The names of every DeviceClass `muster dev` may publish (what `--delete` considers).
pub const ALL_DEVICE_CLASSES: [&str; 3] = [DEVICE_CLASS, MIG_DEVICE_CLASS, COMPUTE_DOMAIN_CHANNEL_CLASS];

/// PURE: the UUID of the MIG device of `parent` with `profile` at `placement`: `MIG-` and a
/// UUID derived from the parent's (stable: the same parent always gives the same MIG UUID).
pub fn mig_uuid(parent: &NvidiaGpu, profile: &MigProfile, placement: u32) -> String {
    let derived = gpu_uuid(&format!("mig/{}", profile.id), &parent.uuid, placement);
    let hex = derived.strip_prefix("GPU-").unwrap_or(&derived);
    format!("MIG-{hex}")
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
    let mut gpus: Vec<(u32, String, u64, Option<i64>)> = match &annotation {
        Some(t) => t
            .gpus
            .iter()
            .map(|g| {
                (
                    g.index,
                    g.uuid.clone().unwrap_or_else(|| gpu_uuid(defaults::UUID_SEED, &name, g.index)),
                    g.memory_mib.unwrap_or(defaults::GPU_MEMORY_MIB),
                    g.numa.map(i64::from),
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
            (0..count).map(|i| (i, gpu_uuid(defaults::UUID_SEED, &name, i), defaults::GPU_MEMORY_MIB, None)).collect()
        }
    };
    gpus.sort_by_key(|g| g.0);
    let same_root = |i: u32, j: u32| -> bool {
        let Some(t) = &annotation else { return false };
        let link = t.links.get(i as usize).and_then(|row| row.get(j as usize));
        matches!(link.map(String::as_str), Some("PIX" | "PXB" | "PHB"))
    };
    gpus.iter()
        .map(|(index, uuid, memory_mib, numa_node)| {
            // The root complex of the lowest-numbered GPU sharing it.
            let leader = gpus.iter().map(|g| g.0).find(|&j| j == *index || same_root(*index, j)).unwrap_or(*index);
            NvidiaGpu {
                index: *index,
                uuid: uuid.clone(),
                memory_mib: *memory_mib,
                pcie_bus_id: format!("0000:{:02x}:00.0", pcie_bus(*index)),
                pcie_root: format!("pci0000:{:02x}", pcie_bus(leader) - 3),
                numa_node: *numa_node,
            }
        })
        .collect()
}

/// PURE: the GPU driver's ResourceSlice of `node` (generation 1): its GPUs in `opts.shape`,
/// except that each GPU of `opts.mig_parents` the node has is in static MIG mode, published as
/// one `1g.10gb` MIG device instead of a whole GPU (as the driver does: a GPU in MIG mode is
/// published only as its MIG devices), after the whole GPUs; labelled and
/// owned by the Node as the driver's slices are (the garbage collector removes it with the
/// node). `None` for a node without GPUs. MIG parents the node lacks are skipped here
/// ([`slices_for_node`] refuses them).
pub fn slice_for_node(node: &Node, opts: &PublishOptions) -> Option<ResourceSlice> {
    let gpus = node_gpus(node);
    if gpus.is_empty() {
        return None;
    }
    let name = node.name_any();
    let model = gpu_model(node.labels().get(GPU_PRODUCT_LABEL).map(String::as_str));
    let mut slice = nvidia_gpu_slice_shaped(&name, &model, &gpus, 1, opts.shape);
    if opts.publishes_mig() {
        let profile = MigProfile::h100_1g_10gb();
        let migs: Vec<_> = gpus
            .iter()
            .filter(|g| opts.mig_parents.contains(&g.index))
            .map(|g| nvidia_mig_device(&model, g, &profile, MIG_PLACEMENT, &mig_uuid(g, &profile, MIG_PLACEMENT)))
            .collect();
        let devices = slice.spec.devices.get_or_insert_default();
        let in_mig_mode =
            |d: &k8s_openapi::api::resource::v1::Device| opts.mig_parents.iter().any(|i| d.name == format!("gpu-{i}"));
        devices.retain(|d| !in_mig_mode(d));
        devices.extend(migs);
    }
    Some(owned_by(slice, node))
}

/// PURE: the ComputeDomain kubelet plugin's ResourceSlice of `node` (driver
/// `compute-domain.nvidia.com`, pool = the node, generation 1: `channel-0` and the `daemon`),
/// labelled and owned by the Node like the GPU slice. `None` for a node without GPUs.
pub fn compute_domain_slice_for_node(node: &Node) -> Option<ResourceSlice> {
    if node_gpus(node).is_empty() {
        return None;
    }
    Some(owned_by(compute_domain_slice(&node.name_any(), COMPUTE_DOMAIN_CHANNELS, 1), node))
}

/// PURE: every slice [`publish_with`] applies for `node`: the GPU driver's, then (with
/// `opts.compute_domain`) the ComputeDomain plugin's. Refuses a node without GPUs and one
/// lacking a GPU of `opts.mig_parents`.
pub fn slices_for_node(node: &Node, opts: &PublishOptions) -> Result<Vec<ResourceSlice>, Error> {
    let name = node.name_any();
    let gpus = node_gpus(node);
    if let Some(missing) = opts.mig_parents.iter().find(|i| !gpus.iter().any(|g| g.index == **i)) {
        return Err(Error::Dra(format!("node {name} has no GPU {missing} to publish a MIG device of")));
    }
    let gpu = slice_for_node(node, opts).ok_or_else(|| Error::Dra(format!("node {name} has no GPUs")))?;
    let mut slices = vec![gpu];
    if opts.compute_domain {
        slices.extend(compute_domain_slice_for_node(node));
    }
    Ok(slices)
}

/// `slice` labelled as `muster dev`'s and owned by `node` (when the node has a UID).
fn owned_by(mut slice: ResourceSlice, node: &Node) -> ResourceSlice {
    labelled(&mut slice.metadata);
    if let Some(uid) = node.uid() {
        slice.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: node.name_any(),
            uid,
            ..Default::default()
        }]);
    }
    slice
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

/// [`publish_with`] with the defaults: today's shape, no MIG devices, no ComputeDomain slices.
/// Returns the slice names, in the order of `nodes`.
pub async fn publish(client: &Client, nodes: &[String]) -> Result<Vec<String>, Error> {
    Ok(publish_with(client, nodes, &PublishOptions::default()).await?.slices)
}

/// Applies the DeviceClasses of `opts` ([`device_classes`]) and the slices of each of `nodes`
/// ([`slices_for_node`]) with server-side apply (idempotent). Refuses a node that does not
/// exist, is not a kwok node, has no GPUs or lacks a MIG parent, before writing anything.
pub async fn publish_with(client: &Client, nodes: &[String], opts: &PublishOptions) -> Result<Published, Error> {
    let node_api: Api<Node> = Api::all(client.clone());
    let mut slices = Vec::new();
    for name in nodes {
        let node = node_api.get_opt(name).await?.ok_or_else(|| Error::Dra(format!("node {name} not found")))?;
        if !is_fake_node(&node) {
            return Err(Error::Dra(format!(
                "node {name} is not a kwok node ({KWOK_NODE}=fake): its own driver publishes"
            )));
        }
        slices.extend(slices_for_node(&node, opts)?);
    }
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let class_api: Api<DeviceClass> = Api::all(client.clone());
    let mut published = Published::default();
    for class in device_classes(opts) {
        let name = class.name_any();
        class_api.patch(&name, &params, &Patch::Apply(&class)).await?;
        published.classes.push(name);
    }
    let slice_api: Api<ResourceSlice> = Api::all(client.clone());
    for slice in slices {
        let name = slice.name_any();
        slice_api.patch(&name, &params, &Patch::Apply(&slice)).await?;
        published.slices.push(name);
    }
    Ok(published)
}

/// Deletes the slices [`publish_with`] made for `nodes`: those with [`MANAGED_BY_LABEL`] of
/// driver `gpu.nvidia.com` or `compute-domain.nvidia.com` on these nodes (any other slice
/// stays). Returns the names deleted, sorted.
pub async fn unpublish(client: &Client, nodes: &[String]) -> Result<Vec<String>, Error> {
    let slice_api: Api<ResourceSlice> = Api::all(client.clone());
    let lp = ListParams::default().labels(&format!("{MANAGED_BY_LABEL}={FIELD_MANAGER}"));
    let mut deleted = Vec::new();
    for slice in slice_api.list(&lp).await?.items {
        let on = slice.spec.node_name.as_deref().unwrap_or_default();
        let ours = [DRIVER, COMPUTE_DOMAIN_DRIVER].contains(&slice.spec.driver.as_str());
        if ours && nodes.iter().any(|n| n == on) {
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

/// Deletes each of the DeviceClasses `muster dev` publishes ([`ALL_DEVICE_CLASSES`]) that it
/// made (it carries [`MANAGED_BY_LABEL`]; one installed by NVIDIA's chart stays). Returns the
/// names deleted.
pub async fn delete_device_class(client: &Client) -> Result<Vec<String>, Error> {
    let classes: Api<DeviceClass> = Api::all(client.clone());
    let mut deleted = Vec::new();
    for name in ALL_DEVICE_CLASSES {
        let Some(class) = classes.get_opt(name).await? else { continue };
        if !is_labelled(&class.metadata) {
            continue;
        }
        match classes.delete(name, &DeleteParams::default()).await {
            Ok(_) => deleted.push(name.to_string()),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FakeGpuNodes, TopologyKind, fake_node};
    use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, ResourcePool};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use std::collections::BTreeSet;

    fn attr<'a>(d: &'a Device, name: &str) -> &'a DeviceAttribute {
        d.attributes.as_ref().unwrap().get(name).unwrap_or_else(|| panic!("{}: no attribute {name}", d.name))
    }

    fn attribute_names(d: &Device) -> BTreeSet<&str> {
        d.attributes.as_ref().unwrap().keys().map(String::as_str).collect()
    }

    fn string(s: &str) -> DeviceAttribute {
        DeviceAttribute { string: Some(s.into()), ..DeviceAttribute::default() }
    }

    fn version(v: &str) -> DeviceAttribute {
        DeviceAttribute { version: Some(v.into()), ..DeviceAttribute::default() }
    }

    fn int(i: i64) -> DeviceAttribute {
        DeviceAttribute { int: Some(i), ..DeviceAttribute::default() }
    }

    fn devices_of(slice: &ResourceSlice) -> &[Device] {
        slice.spec.devices.as_deref().unwrap()
    }

    fn is_owned_and_labelled(slice: &ResourceSlice, node: &Node) {
        assert_eq!(slice.metadata.labels.as_ref().unwrap()[MANAGED_BY_LABEL], FIELD_MANAGER);
        let owners = slice.metadata.owner_references.as_ref().unwrap();
        assert_eq!(owners.len(), 1);
        assert_eq!((owners[0].kind.as_str(), owners[0].name.as_str()), ("Node", node.name_any().as_str()));
        assert_eq!(Some(&owners[0].uid), node.metadata.uid.as_ref());
    }

    /// A fake node with a UID, as the API server returns it.
    fn node_with_uid(spec: &FakeGpuNodes, index: u32) -> Node {
        let mut node = fake_node(spec, index).unwrap();
        node.metadata.uid = Some(format!("uid-{index}"));
        node
    }

    #[test]
    fn default_slice_is_todays_shape_field_for_field_with_the_topology_uuids() {
        let node = node_with_uid(&FakeGpuNodes::default(), 2);
        let topology: TopologyAnnotation = serde_json::from_str(&node.annotations()[GPU_TOPOLOGY_ANNOTATION]).unwrap();
        let slice = slice_for_node(&node, &PublishOptions::default()).unwrap();
        assert_eq!(slice.metadata.name.as_deref(), Some("kwok-gpu-2-gpu.nvidia.com"));
        assert_eq!(slice.spec.driver, "gpu.nvidia.com");
        assert_eq!(slice.spec.node_name.as_deref(), Some("kwok-gpu-2"));
        assert_eq!(slice.spec.pool, ResourcePool { name: "kwok-gpu-2".into(), generation: 1, resource_slice_count: 1 });
        is_owned_and_labelled(&slice, &node);
        let devices = devices_of(&slice);
        assert_eq!(devices.len(), 8);
        let expected_names: BTreeSet<&str> = [
            "type",
            "uuid",
            "productName",
            "brand",
            "architecture",
            "cudaComputeCapability",
            "driverVersion",
            "cudaDriverVersion",
            "resource.kubernetes.io/pciBusID",
            "resource.kubernetes.io/pcieRoot",
            "addressingMode",
            "resource.kubernetes.io/numaNode",
        ]
        .into();
        for (i, d) in devices.iter().enumerate() {
            assert_eq!(d.name, format!("gpu-{i}"));
            // Exactly these: in particular no `index`, `minor` or `pcieBusID`.
            assert_eq!(attribute_names(d), expected_names, "{}", d.name);
            assert_eq!(*attr(d, "type"), string("gpu"));
            assert_eq!(attr(d, "uuid").string, topology.gpus[i].uuid);
            assert_eq!(*attr(d, "productName"), string("NVIDIA H100 80GB HBM3"));
            assert_eq!(*attr(d, "brand"), string("Nvidia"));
            assert_eq!(*attr(d, "architecture"), string("Hopper"));
            assert_eq!(*attr(d, "cudaComputeCapability"), version("9.0.0"));
            assert_eq!(*attr(d, "driverVersion"), version("580.65.6"));
            assert_eq!(*attr(d, "cudaDriverVersion"), version("13.0.0"));
            let bus = 0x18 + 0x10 * i;
            assert_eq!(*attr(d, "resource.kubernetes.io/pciBusID"), string(&format!("0000:{bus:02x}:00.0")));
            // NVSwitch: every GPU behind its own root complex.
            assert_eq!(*attr(d, "resource.kubernetes.io/pcieRoot"), string(&format!("pci0000:{:02x}", bus - 3)));
            assert_eq!(*attr(d, "addressingMode"), string("HMM"));
            let numa = topology.gpus[i].numa.map(i64::from).unwrap();
            assert_eq!(numa, if i < 4 { 0 } else { 1 });
            assert_eq!(*attr(d, "resource.kubernetes.io/numaNode"), int(numa));
            let capacity = d.capacity.as_ref().unwrap();
            assert_eq!(capacity.keys().collect::<Vec<_>>(), ["memory"]);
            assert_eq!(capacity["memory"].value, Quantity("81920Mi".into()));
        }
        // Without a topology annotation sysfs knows no NUMA node: no numaNode attribute.
        let bare = node_with_uid(&FakeGpuNodes { topology: TopologyKind::None, gpus: 2, ..FakeGpuNodes::default() }, 0);
        for d in devices_of(&slice_for_node(&bare, &PublishOptions::default()).unwrap()) {
            let mut without_numa = expected_names.clone();
            without_numa.remove("resource.kubernetes.io/numaNode");
            assert_eq!(attribute_names(d), without_numa, "{}", d.name);
        }
        // The default options publish exactly this slice and only the GPU class.
        assert_eq!(slices_for_node(&node, &PublishOptions::default()).unwrap(), vec![slice]);
        let classes: Vec<_> = device_classes(&PublishOptions::default()).iter().map(ResourceExt::name_any).collect();
        assert_eq!(classes, ["gpu.nvidia.com"]);
    }

    #[test]
    fn legacy_slice_has_index_minor_and_the_unqualified_bus_id() {
        let node = node_with_uid(&FakeGpuNodes::default(), 1);
        let opts = PublishOptions { shape: Shape::Legacy, ..PublishOptions::default() };
        let slice = slice_for_node(&node, &opts).unwrap();
        is_owned_and_labelled(&slice, &node);
        let expected_names: BTreeSet<&str> = [
            "type",
            "uuid",
            "productName",
            "brand",
            "architecture",
            "cudaComputeCapability",
            "driverVersion",
            "cudaDriverVersion",
            "resource.kubernetes.io/pcieRoot",
            "index",
            "minor",
            "pcieBusID",
        ]
        .into();
        let current = slice_for_node(&node, &PublishOptions::default()).unwrap();
        for (i, (d, now)) in devices_of(&slice).iter().zip(devices_of(&current)).enumerate() {
            assert_eq!(d.name, format!("gpu-{i}"));
            assert_eq!(attribute_names(d), expected_names, "{}", d.name);
            assert_eq!(*attr(d, "index"), int(i as i64));
            assert_eq!(*attr(d, "minor"), int(i as i64));
            assert_eq!(attr(d, "pcieBusID"), attr(now, PCI_BUS_ID_ATTRIBUTE));
            assert_eq!(attr(d, "uuid"), attr(now, "uuid"));
            assert_eq!(d.capacity, now.capacity);
        }
        assert_eq!(devices_of(&slice).len(), 8);
    }

    #[test]
    fn gpus_in_mig_mode_are_published_as_their_mig_devices_with_the_mig_class() {
        let node = node_with_uid(&FakeGpuNodes::default(), 0);
        let opts = PublishOptions { mig_parents: vec![2, 5], ..PublishOptions::default() };
        let slice = slice_for_node(&node, &opts).unwrap();
        let devices = devices_of(&slice);
        // GPUs 2 and 5 are in MIG mode: 6 whole GPUs, then their MIG devices.
        assert_eq!(devices.len(), 8);
        assert!(devices[..6].iter().all(|d| *attr(d, "type") == string("gpu")));
        let whole: Vec<&str> = devices[..6].iter().map(|d| d.name.as_str()).collect();
        assert_eq!(whole, ["gpu-0", "gpu-1", "gpu-3", "gpu-4", "gpu-6", "gpu-7"]);
        let migs = &devices[6..];
        let plain = slice_for_node(&node, &PublishOptions::default()).unwrap();
        let parents = devices_of(&plain);
        assert_eq!(
            migs.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(),
            ["gpu-2-mig-1g10gb-19-0", "gpu-5-mig-1g10gb-19-0"]
        );
        for (mig, parent) in migs.iter().zip([2, 5]) {
            let parent = &parents[parent];
            assert_eq!(*attr(mig, "type"), string("mig"));
            assert_eq!(*attr(mig, "profile"), string("1g.10gb"));
            assert_eq!(attr(mig, "parentUUID").string, attr(parent, "uuid").string);
            let uuid = attr(mig, "uuid").string.clone().unwrap();
            assert!(uuid.starts_with("MIG-"), "{uuid}");
            assert_ne!(Some(&uuid), attr(parent, "uuid").string.as_ref());
            assert_eq!(attr(mig, PCIE_ROOT_ATTRIBUTE), attr(parent, PCIE_ROOT_ATTRIBUTE));
            let capacity = mig.capacity.as_ref().unwrap();
            assert_eq!(capacity["memory"].value, Quantity("9856Mi".into()));
            assert_eq!(capacity["memorySlice0"].value, Quantity("1".into()));
        }
        // MIG UUIDs are stable and distinct per parent.
        assert_eq!(slice_for_node(&node, &opts).unwrap(), slice);
        assert_ne!(attr(&migs[0], "uuid"), attr(&migs[1], "uuid"));
        // The MIG class comes with them; the legacy shape keeps the MIG devices.
        let classes: Vec<_> = device_classes(&opts).iter().map(ResourceExt::name_any).collect();
        assert_eq!(classes, ["gpu.nvidia.com", "mig.nvidia.com"]);
        let legacy = PublishOptions { shape: Shape::Legacy, ..opts.clone() };
        let legacy_slice = slice_for_node(&node, &legacy).unwrap();
        assert_eq!(devices_of(&legacy_slice)[6..], *migs);
        // A GPU the node lacks is refused, not skipped silently.
        let missing = PublishOptions { mig_parents: vec![8], ..PublishOptions::default() };
        let err = slices_for_node(&node, &missing).unwrap_err().to_string();
        assert!(err.contains("no GPU 8"), "{err}");
    }

    #[test]
    fn compute_domain_slice_is_published_beside_the_gpu_slice_with_its_class() {
        let node = node_with_uid(&FakeGpuNodes::default(), 3);
        let opts = PublishOptions { compute_domain: true, ..PublishOptions::default() };
        let slices = slices_for_node(&node, &opts).unwrap();
        assert_eq!(slices.len(), 2);
        assert_eq!(slices[0], slice_for_node(&node, &PublishOptions::default()).unwrap());
        let cd = &slices[1];
        assert_eq!(cd.metadata.name.as_deref(), Some("kwok-gpu-3-compute-domain.nvidia.com"));
        assert_eq!(cd.spec.driver, "compute-domain.nvidia.com");
        assert_eq!(cd.spec.node_name.as_deref(), Some("kwok-gpu-3"));
        assert_eq!(cd.spec.pool, ResourcePool { name: "kwok-gpu-3".into(), generation: 1, resource_slice_count: 1 });
        is_owned_and_labelled(cd, &node);
        let devices = devices_of(cd);
        assert_eq!(devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), ["channel-0", "daemon"]);
        assert_eq!((attr(&devices[0], "type"), attr(&devices[0], "id")), (&string("channel"), &int(0)));
        assert_eq!(*attr(&devices[1], "type"), string("daemon"));
        let classes = device_classes(&opts);
        assert_eq!(
            classes.iter().map(ResourceExt::name_any).collect::<Vec<_>>(),
            ["gpu.nvidia.com", "compute-domain-default-channel.nvidia.com"]
        );
        assert!(classes.iter().all(|c| is_labelled(&c.metadata)));
        let cel = classes[1].spec.as_ref().unwrap().selectors.as_ref().unwrap()[0].cel.as_ref().unwrap();
        assert!(cel.expression.contains("'compute-domain.nvidia.com'"), "{}", cel.expression);
        // All three classes with MIG and ComputeDomain together.
        let both = PublishOptions { mig_parents: vec![0], compute_domain: true, ..PublishOptions::default() };
        let names: Vec<_> = device_classes(&both).iter().map(ResourceExt::name_any).collect();
        assert_eq!(names, ALL_DEVICE_CLASSES);
        // No GPUs: nothing of either driver.
        let cpu = node_with_uid(&FakeGpuNodes { gpus: 0, ..FakeGpuNodes::default() }, 0);
        assert!(compute_domain_slice_for_node(&cpu).is_none());
        assert!(slices_for_node(&cpu, &opts).is_err());
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
        assert!(gpus.iter().all(|g| g.numa_node.is_none()));
        let cpu = fake_node(&FakeGpuNodes { gpus: 0, ..FakeGpuNodes::default() }, 0).unwrap();
        assert!(slice_for_node(&cpu, &PublishOptions::default()).is_none());
    }

    #[test]
    fn device_classes_select_what_nvidias_chart_selects() {
        let class = device_class();
        assert_eq!(class.metadata.name.as_deref(), Some("gpu.nvidia.com"));
        let selectors = class.spec.unwrap().selectors.unwrap();
        assert_eq!(
            selectors[0].cel.as_ref().unwrap().expression,
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
        );
        let mig = mig_device_class();
        assert_eq!(mig.metadata.name.as_deref(), Some("mig.nvidia.com"));
        assert_eq!(
            mig.spec.unwrap().selectors.unwrap()[0].cel.as_ref().unwrap().expression,
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"
        );
        assert!(is_labelled(&mig_device_class().metadata) && is_labelled(&device_class().metadata));
    }

    #[test]
    fn models_follow_the_product() {
        assert_eq!(gpu_model(Some("NVIDIA-A100-SXM4-80GB")).architecture, "Ampere");
        assert_eq!(gpu_model(Some("NVIDIA-B200")).compute_capability, "10.0.0");
        assert_eq!(gpu_model(Some("NVIDIA-L40S")).architecture, "Ada Lovelace");
        assert_eq!(gpu_model(None).product_name, "NVIDIA H100 80GB HBM3");
    }
}

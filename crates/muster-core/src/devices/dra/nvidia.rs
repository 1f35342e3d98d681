//! PURE: what NVIDIA's DRA driver (`gpu.nvidia.com`, its GPU kubelet plugin, now
//! kubernetes-sigs/dra-driver-nvidia-gpu) publishes on a GPU node: one ResourceSlice per node
//! (`spec.nodeName` = the node, pool = the node) with a device per whole GPU carrying the
//! driver's attributes and `memory` capacity, MIG devices beside them, and the DeviceClasses
//! that select them; and what its ComputeDomain kubelet plugin (`compute-domain.nvidia.com`)
//! publishes (IMEX channels and the daemon). The allocator reads these shapes; the fake driver
//! (`muster dev dra-slices`) and the fixtures build them here, so what muster is tested
//! against and what it reads are one definition.
//!
//! Two shapes of the whole-GPU device are kept ([`Shape`]): today's (`cmd/gpu-kubelet-plugin/
//! deviceinfo.go`: device `gpu-<minor>`, no `index` or `minor` attribute, the standard
//! `resource.kubernetes.io/pciBusID`, `pcieRoot` and, where sysfs knows it, `numaNode`
//! attributes, `addressingMode`) and the one it published until 2025 (`index` and `minor`
//! int attributes, an unqualified `pcieBusID`).

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, Device, DeviceAttribute, DeviceCapacity, DeviceClass, DeviceClassSpec, DeviceSelector,
    ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// An H100 80GB as GPU feature discovery labels its product (`nvidia.com/gpu.product`): the
/// product of muster's fake GPU nodes and of the DRA fixtures.
pub const H100_PRODUCT: &str = "NVIDIA-H100-80GB-HBM3";
/// The driver name of NVIDIA's DRA driver for GPUs (also its attribute domain).
pub const DRIVER: &str = "gpu.nvidia.com";
/// The DeviceClass NVIDIA's driver installs for whole GPUs.
pub const DEVICE_CLASS: &str = "gpu.nvidia.com";
/// The CEL selector of [`DEVICE_CLASS`], as NVIDIA's chart writes it.
pub const DEVICE_CLASS_SELECTOR: &str =
    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'";
/// The standard attribute naming a device's PCIe root complex.
pub const PCIE_ROOT_ATTRIBUTE: &str = "resource.kubernetes.io/pcieRoot";
/// The standard attribute with a device's PCI address (today's driver).
pub const PCI_BUS_ID_ATTRIBUTE: &str = "resource.kubernetes.io/pciBusID";
/// The standard attribute with the NUMA node of a device's memory controller (today's driver,
/// where sysfs gives one).
pub const NUMA_NODE_ATTRIBUTE: &str = "resource.kubernetes.io/numaNode";
/// The `addressingMode` the fakes' GPUs report (NVML's HMM on an x86 host).
pub const ADDRESSING_MODE: &str = "HMM";
/// The DeviceClass NVIDIA's chart installs for MIG devices.
pub const MIG_DEVICE_CLASS: &str = "mig.nvidia.com";
/// The CEL selector of [`MIG_DEVICE_CLASS`].
pub const MIG_DEVICE_CLASS_SELECTOR: &str =
    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'";
/// The driver name of NVIDIA's ComputeDomain kubelet plugin (IMEX channels for multi-node
/// NVLink).
pub const COMPUTE_DOMAIN_DRIVER: &str = "compute-domain.nvidia.com";
/// The DeviceClass of a ComputeDomain's default IMEX channel, as NVIDIA's chart installs it.
pub const COMPUTE_DOMAIN_CHANNEL_CLASS: &str = "compute-domain-default-channel.nvidia.com";
/// The CEL selector of [`COMPUTE_DOMAIN_CHANNEL_CLASS`].
pub const COMPUTE_DOMAIN_CHANNEL_SELECTOR: &str = "device.driver == 'compute-domain.nvidia.com' && device.attributes['compute-domain.nvidia.com'].type == 'channel' && device.attributes['compute-domain.nvidia.com'].id == 0";
/// The driver version the devices report (attribute `driverVersion`).
pub const DRIVER_VERSION: &str = "580.65.6";
/// The CUDA driver version the devices report (attribute `cudaDriverVersion`).
pub const CUDA_DRIVER_VERSION: &str = "13.0.0";

/// One GPU as the driver discovers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvidiaGpu {
    /// The GPU's device minor (`/dev/nvidia<minor>`, device `gpu-<minor>`); the fakes give a
    /// GPU the same minor as its nvidia-smi index.
    pub index: u32,
    /// `GPU-...` UUID.
    pub uuid: String,
    /// Total memory in MiB (capacity `memory`).
    pub memory_mib: u64,
    /// `0000:<bus>:00.0`.
    pub pcie_bus_id: String,
    /// `pci0000:<bus>`: GPUs behind one root complex share it.
    pub pcie_root: String,
    /// The NUMA node sysfs gives the GPU's PCI device, when it has one (published as
    /// `resource.kubernetes.io/numaNode`).
    pub numa_node: Option<i64>,
}

/// Which shape of whole-GPU device the driver publishes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Shape {
    /// Today's driver: no `index`/`minor` attributes, standard `resource.kubernetes.io/`
    /// PCI attributes, `numaNode` where known, `addressingMode`.
    #[default]
    Current,
    /// The driver until 2025: `index` and `minor` int attributes, unqualified `pcieBusID`.
    Legacy,
}

impl Shape {
    /// Both shapes, today's first (for tests that run on each).
    pub const ALL: [Shape; 2] = [Shape::Current, Shape::Legacy];
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Shape::Current => "current",
            Shape::Legacy => "legacy",
        })
    }
}

impl std::str::FromStr for Shape {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "current" => Ok(Shape::Current),
            "legacy" => Ok(Shape::Legacy),
            other => Err(format!("unknown driver shape {other:?} (expected current or legacy)")),
        }
    }
}

/// What NVML reports for a GPU model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuModel {
    /// `productName`, e.g. `NVIDIA H100 80GB HBM3`.
    pub product_name: String,
    /// `brand`.
    pub brand: String,
    /// `architecture`, e.g. `Hopper`.
    pub architecture: String,
    /// `cudaComputeCapability` as a semantic version, e.g. `9.0.0`.
    pub compute_capability: String,
}

/// PURE: the model of a GPU from its product name as GPU feature discovery labels it
/// (`nvidia.com/gpu.product`, spaces turned into dashes).
pub fn gpu_model(product_label: &str) -> GpuModel {
    let product_name = product_label.replace('-', " ");
    let upper = product_name.to_ascii_uppercase();
    let has = |s: &str| upper.split([' ', '-']).any(|w| w.starts_with(s));
    let (architecture, cc) = if has("B200") || has("B100") || has("GB200") {
        ("Blackwell", "10.0.0")
    } else if has("A100") || has("A30") {
        ("Ampere", "8.0.0")
    } else if has("A10") || has("A40") || has("A16") {
        ("Ampere", "8.6.0")
    } else if has("L4") || has("L40") {
        ("Ada Lovelace", "8.9.0")
    } else if has("V100") {
        ("Volta", "7.0.0")
    } else if has("T4") {
        ("Turing", "7.5.0")
    } else {
        // H100, H200, GH200 and anything unknown.
        ("Hopper", "9.0.0")
    };
    GpuModel { product_name, brand: "Nvidia".into(), architecture: architecture.into(), compute_capability: cc.into() }
}

/// The name of the ResourceSlice of `node` (NVIDIA's driver lets the API server generate one
/// from `<node>-gpu.nvidia.com-`; a fixed name makes publishing idempotent).
pub fn slice_name(node: &str) -> String {
    format!("{node}-{DRIVER}")
}

fn string(s: &str) -> DeviceAttribute {
    DeviceAttribute { string: Some(s.to_string()), ..DeviceAttribute::default() }
}

fn int(i: i64) -> DeviceAttribute {
    DeviceAttribute { int: Some(i), ..DeviceAttribute::default() }
}

fn version(v: &str) -> DeviceAttribute {
    DeviceAttribute { version: Some(v.to_string()), ..DeviceAttribute::default() }
}

/// PURE: the device today's driver publishes for one whole GPU ([`Shape::Current`]).
pub fn nvidia_gpu_device(model: &GpuModel, gpu: &NvidiaGpu) -> Device {
    nvidia_gpu_device_shaped(model, gpu, Shape::Current)
}

fn memory(mib: u64) -> DeviceCapacity {
    DeviceCapacity { value: Quantity(format!("{mib}Mi")), ..DeviceCapacity::default() }
}

fn count(n: u64) -> DeviceCapacity {
    DeviceCapacity { value: Quantity(n.to_string()), ..DeviceCapacity::default() }
}

/// Attributes a whole GPU and its MIG devices share (the model's and the driver's).
fn model_attributes(model: &GpuModel) -> Vec<(&'static str, DeviceAttribute)> {
    vec![
        ("productName", string(&model.product_name)),
        ("brand", string(&model.brand)),
        ("architecture", string(&model.architecture)),
        ("cudaComputeCapability", version(&model.compute_capability)),
        ("driverVersion", version(DRIVER_VERSION)),
        ("cudaDriverVersion", version(CUDA_DRIVER_VERSION)),
    ]
}

/// PURE: the device NVIDIA's driver publishes for one whole GPU, in `shape`.
pub fn nvidia_gpu_device_shaped(model: &GpuModel, gpu: &NvidiaGpu, shape: Shape) -> Device {
    let mut attributes: Vec<(&str, DeviceAttribute)> = vec![("type", string("gpu")), ("uuid", string(&gpu.uuid))];
    attributes.extend(model_attributes(model));
    attributes.push((PCIE_ROOT_ATTRIBUTE, string(&gpu.pcie_root)));
    match shape {
        Shape::Current => {
            attributes.push((PCI_BUS_ID_ATTRIBUTE, string(&gpu.pcie_bus_id)));
            attributes.push(("addressingMode", string(ADDRESSING_MODE)));
            if let Some(numa) = gpu.numa_node {
                attributes.push((NUMA_NODE_ATTRIBUTE, int(numa)));
            }
        }
        Shape::Legacy => {
            attributes.push(("index", int(gpu.index.into())));
            attributes.push(("minor", int(gpu.index.into())));
            attributes.push(("pcieBusID", string(&gpu.pcie_bus_id)));
        }
    }
    let attributes: BTreeMap<String, DeviceAttribute> =
        attributes.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    let capacity = BTreeMap::from([("memory".to_string(), memory(gpu.memory_mib))]);
    Device {
        name: format!("gpu-{}", gpu.index),
        attributes: Some(attributes),
        capacity: Some(capacity),
        ..Device::default()
    }
}

/// A MIG profile as NVML describes it (the parts the driver publishes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigProfile {
    /// nvidia-smi's name, e.g. `1g.10gb`.
    pub name: String,
    /// NVML's GPU instance profile id.
    pub id: u32,
    /// Memory slices the instance spans.
    pub slices: u32,
    /// Its memory in MiB.
    pub memory_mib: u64,
    /// Its streaming multiprocessors.
    pub multiprocessors: u64,
}

impl MigProfile {
    /// The H100 80GB's smallest profile, `1g.10gb` (profile id 19).
    pub fn h100_1g_10gb() -> Self {
        MigProfile { name: "1g.10gb".into(), id: 19, slices: 1, memory_mib: 9_856, multiprocessors: 16 }
    }
}

/// PURE: the device today's driver publishes for a MIG device of `parent` with `profile` at
/// memory slice `placement` (static MIG: created by the admin, published beside the GPUs):
/// named `gpu-<minor>-mig-<profile without dots>-<profile id>-<placement>`, `type` `mig`.
pub fn nvidia_mig_device(
    model: &GpuModel,
    parent: &NvidiaGpu,
    profile: &MigProfile,
    placement: u32,
    uuid: &str,
) -> Device {
    let mut attributes: Vec<(&str, DeviceAttribute)> = vec![
        ("type", string("mig")),
        ("uuid", string(uuid)),
        ("parentUUID", string(&parent.uuid)),
        ("profile", string(&profile.name)),
    ];
    attributes.extend(model_attributes(model));
    attributes.push((PCI_BUS_ID_ATTRIBUTE, string(&parent.pcie_bus_id)));
    attributes.push((PCIE_ROOT_ATTRIBUTE, string(&parent.pcie_root)));
    attributes.push(("addressingMode", string(ADDRESSING_MODE)));
    let attributes: BTreeMap<String, DeviceAttribute> =
        attributes.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    let mut capacity = BTreeMap::from([
        ("memory".to_string(), memory(profile.memory_mib)),
        ("multiprocessors".to_string(), count(profile.multiprocessors)),
        ("copyEngines".to_string(), count(1)),
        ("decoders".to_string(), count(1)),
        ("encoders".to_string(), count(0)),
        ("jpegEngines".to_string(), count(1)),
        ("ofaEngines".to_string(), count(0)),
    ]);
    for slice in placement..placement + profile.slices {
        capacity.insert(format!("memorySlice{slice}"), count(1));
    }
    Device {
        name: format!("gpu-{}-mig-{}-{}-{placement}", parent.index, profile.name.replace('.', ""), profile.id),
        attributes: Some(attributes),
        capacity: Some(capacity),
        ..Device::default()
    }
}

/// PURE: the ResourceSlice of `node` with `gpus` in today's shape: driver `gpu.nvidia.com`,
/// `spec.nodeName` and pool name = `node`, one slice in the pool, at `generation`. No owner and
/// no labels (the publisher adds its own).
pub fn nvidia_gpu_slice(node: &str, model: &GpuModel, gpus: &[NvidiaGpu], generation: i64) -> ResourceSlice {
    nvidia_gpu_slice_shaped(node, model, gpus, generation, Shape::Current)
}

/// PURE: [`nvidia_gpu_slice`] with the GPUs in `shape`.
pub fn nvidia_gpu_slice_shaped(
    node: &str,
    model: &GpuModel,
    gpus: &[NvidiaGpu],
    generation: i64,
    shape: Shape,
) -> ResourceSlice {
    let devices = gpus.iter().map(|g| nvidia_gpu_device_shaped(model, g, shape)).collect();
    node_slice(&slice_name(node), DRIVER, node, devices, generation)
}

fn node_slice(name: &str, driver: &str, node: &str, devices: Vec<Device>, generation: i64) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta { name: Some(name.into()), ..ObjectMeta::default() },
        spec: ResourceSliceSpec {
            driver: driver.into(),
            node_name: Some(node.into()),
            pool: ResourcePool { name: node.into(), generation, resource_slice_count: 1 },
            devices: Some(devices),
            ..ResourceSliceSpec::default()
        },
    }
}

/// The name of the ComputeDomain slice of `node`.
pub fn compute_domain_slice_name(node: &str) -> String {
    format!("{node}-{COMPUTE_DOMAIN_DRIVER}")
}

/// PURE: what the ComputeDomain kubelet plugin publishes on `node`: `channels` IMEX channel
/// devices `channel-<id>` (`type` `channel`, `id`) and the `daemon` device (`type` `daemon`).
pub fn compute_domain_slice(node: &str, channels: u32, generation: i64) -> ResourceSlice {
    let device = |name: String, kind: &str, id: u32| Device {
        name,
        attributes: Some(BTreeMap::from([("type".to_string(), string(kind)), ("id".to_string(), int(id.into()))])),
        ..Device::default()
    };
    let mut devices: Vec<Device> = (0..channels).map(|i| device(format!("channel-{i}"), "channel", i)).collect();
    devices.push(device("daemon".into(), "daemon", 0));
    node_slice(&compute_domain_slice_name(node), COMPUTE_DOMAIN_DRIVER, node, devices, generation)
}

/// PURE: the DeviceClass `gpu.nvidia.com`, as NVIDIA's chart installs it (no labels: the
/// publisher adds its own).
pub fn device_class() -> DeviceClass {
    class(DEVICE_CLASS, DEVICE_CLASS_SELECTOR)
}

/// PURE: the DeviceClass `mig.nvidia.com`, as NVIDIA's chart installs it.
pub fn mig_device_class() -> DeviceClass {
    class(MIG_DEVICE_CLASS, MIG_DEVICE_CLASS_SELECTOR)
}

/// PURE: the DeviceClass of a ComputeDomain's default channel, as NVIDIA's chart installs it.
pub fn compute_domain_channel_class() -> DeviceClass {
    class(COMPUTE_DOMAIN_CHANNEL_CLASS, COMPUTE_DOMAIN_CHANNEL_SELECTOR)
}

fn class(name: &str, expression: &str) -> DeviceClass {
    DeviceClass {
        metadata: ObjectMeta { name: Some(name.into()), ..ObjectMeta::default() },
        spec: Some(DeviceClassSpec {
            selectors: Some(vec![DeviceSelector { cel: Some(CELDeviceSelector { expression: expression.into() }) }]),
            ..DeviceClassSpec::default()
        }),
    }
}

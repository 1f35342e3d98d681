//! PURE: what NVIDIA's DRA driver (`gpu.nvidia.com`, its GPU kubelet plugin) publishes on a GPU
//! node: one ResourceSlice per node (`spec.nodeName` = the node, pool = the node) with a device
//! `gpu-<index>` per whole GPU carrying the driver's attributes and `memory` capacity, and the
//! DeviceClass `gpu.nvidia.com` that selects them. The allocator reads these shapes; the fake
//! driver (`muster dev dra-slices`) and the fixtures build them here, so what muster is tested
//! against and what it reads are one definition.

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
/// The driver version the devices report (attribute `driverVersion`).
pub const DRIVER_VERSION: &str = "580.65.6";
/// The CUDA driver version the devices report (attribute `cudaDriverVersion`).
pub const CUDA_DRIVER_VERSION: &str = "13.0.0";

/// One GPU as the driver discovers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvidiaGpu {
    /// nvidia-smi's index (device `gpu-<index>`).
    pub index: u32,
    /// `GPU-...` UUID.
    pub uuid: String,
    /// Total memory in MiB (capacity `memory`).
    pub memory_mib: u64,
    /// `0000:<bus>:00.0`.
    pub pcie_bus_id: String,
    /// `pci0000:<bus>`: GPUs behind one root complex share it.
    pub pcie_root: String,
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

/// PURE: the device NVIDIA's driver publishes for one whole GPU.
pub fn nvidia_gpu_device(model: &GpuModel, gpu: &NvidiaGpu) -> Device {
    let attributes: BTreeMap<String, DeviceAttribute> = [
        ("type", string("gpu")),
        ("uuid", string(&gpu.uuid)),
        ("index", int(gpu.index.into())),
        ("minor", int(gpu.index.into())),
        ("productName", string(&model.product_name)),
        ("brand", string(&model.brand)),
        ("architecture", string(&model.architecture)),
        ("cudaComputeCapability", version(&model.compute_capability)),
        ("driverVersion", version(DRIVER_VERSION)),
        ("cudaDriverVersion", version(CUDA_DRIVER_VERSION)),
        ("pcieBusID", string(&gpu.pcie_bus_id)),
        (PCIE_ROOT_ATTRIBUTE, string(&gpu.pcie_root)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let capacity = BTreeMap::from([(
        "memory".to_string(),
        DeviceCapacity { value: Quantity(format!("{}Mi", gpu.memory_mib)), ..DeviceCapacity::default() },
    )]);
    Device {
        name: format!("gpu-{}", gpu.index),
        attributes: Some(attributes),
        capacity: Some(capacity),
        ..Device::default()
    }
}

/// PURE: the ResourceSlice of `node` with `gpus`: driver `gpu.nvidia.com`, `spec.nodeName` and
/// pool name = `node`, one slice in the pool, at `generation`. No owner and no labels (the publisher adds its own).
pub fn nvidia_gpu_slice(node: &str, model: &GpuModel, gpus: &[NvidiaGpu], generation: i64) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta { name: Some(slice_name(node)), ..ObjectMeta::default() },
        spec: ResourceSliceSpec {
            driver: DRIVER.into(),
            node_name: Some(node.into()),
            pool: ResourcePool { name: node.into(), generation, resource_slice_count: 1 },
            devices: Some(gpus.iter().map(|g| nvidia_gpu_device(model, g)).collect()),
            ..ResourceSliceSpec::default()
        },
    }
}

/// PURE: the DeviceClass `gpu.nvidia.com`, as NVIDIA's chart installs it (no labels: the
/// publisher adds its own).
pub fn device_class() -> DeviceClass {
    DeviceClass {
        metadata: ObjectMeta { name: Some(DEVICE_CLASS.into()), ..ObjectMeta::default() },
        spec: Some(DeviceClassSpec {
            selectors: Some(vec![DeviceSelector {
                cel: Some(CELDeviceSelector { expression: DEVICE_CLASS_SELECTOR.into() }),
            }]),
            ..DeviceClassSpec::default()
        }),
    }
}

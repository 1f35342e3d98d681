//! ResourceSlices and the DeviceClass as NVIDIA's DRA driver (`gpu.nvidia.com`) publishes them:
//! one node-local slice per node, pool named after the node, devices `gpu-<index>` with the
//! driver's attributes and `memory` capacity.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, Device, DeviceAttribute, DeviceCapacity, DeviceClass, DeviceClassSpec, DeviceSelector,
    ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::NVIDIA_GPU_DRIVER;

/// The selector of NVIDIA's `gpu.nvidia.com` DeviceClass: whole GPUs of the driver.
pub const NVIDIA_GPU_SELECTOR: &str =
    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'";

fn string(s: &str) -> DeviceAttribute {
    DeviceAttribute { string: Some(s.to_string()), ..Default::default() }
}

fn int(i: i64) -> DeviceAttribute {
    DeviceAttribute { int: Some(i), ..Default::default() }
}

fn version(v: &str) -> DeviceAttribute {
    DeviceAttribute { version: Some(v.to_string()), ..Default::default() }
}

/// One GPU device as the driver publishes it (an H100 80GB on PCIe root `pci0000:<index>`).
pub fn nvidia_gpu(index: usize, uuid: &str) -> Device {
    let i = i64::try_from(index).unwrap_or(i64::MAX);
    let attributes = BTreeMap::from([
        ("type".to_string(), string("gpu")),
        ("uuid".to_string(), string(uuid)),
        ("index".to_string(), int(i)),
        ("minor".to_string(), int(i)),
        ("productName".to_string(), string("NVIDIA H100 80GB HBM3")),
        ("brand".to_string(), string("Nvidia")),
        ("architecture".to_string(), string("Hopper")),
        ("cudaComputeCapability".to_string(), version("9.0.0")),
        ("driverVersion".to_string(), version("570.124.6")),
        ("cudaDriverVersion".to_string(), version("12.8.0")),
        ("pcieBusID".to_string(), string(&format!("0000:{:02x}:00.0", 0x18 + index))),
        ("resource.kubernetes.io/pcieRoot".to_string(), string(&format!("pci0000:{:02x}", index))),
    ]);
    let capacity = BTreeMap::from([(
        "memory".to_string(),
        DeviceCapacity { value: Quantity("81559Mi".to_string()), ..Default::default() },
    )]);
    Device {
        name: format!("gpu-{index}"),
        attributes: Some(attributes),
        capacity: Some(capacity),
        ..Default::default()
    }
}

/// The driver's slice for `node`: pool `node`, one slice, the given `(index, uuid)` GPUs.
pub fn nvidia_slice(node: &str, gpus: &[(usize, &str)], pool_generation: i64) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta { name: Some(format!("{node}-{NVIDIA_GPU_DRIVER}-gpus")), ..Default::default() },
        spec: ResourceSliceSpec {
            driver: NVIDIA_GPU_DRIVER.to_string(),
            node_name: Some(node.to_string()),
            pool: ResourcePool { name: node.to_string(), generation: pool_generation, resource_slice_count: 1 },
            devices: Some(gpus.iter().map(|(i, uuid)| nvidia_gpu(*i, uuid)).collect()),
            ..Default::default()
        },
    }
}

/// A DeviceClass with one CEL selector.
pub fn device_class(name: &str, expression: &str) -> DeviceClass {
    DeviceClass {
        metadata: ObjectMeta { name: Some(name.to_string()), ..Default::default() },
        spec: Some(DeviceClassSpec {
            selectors: Some(vec![DeviceSelector {
                cel: Some(CELDeviceSelector { expression: expression.to_string() }),
            }]),
            ..Default::default()
        }),
    }
}

/// The driver's `gpu.nvidia.com` DeviceClass.
pub fn nvidia_device_class() -> DeviceClass {
    device_class(NVIDIA_GPU_DRIVER, NVIDIA_GPU_SELECTOR)
}

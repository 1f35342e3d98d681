//! ResourceSlices and the DeviceClass as NVIDIA's DRA driver (`gpu.nvidia.com`) publishes them:
//! one node-local slice per node, pool named after the node, devices `gpu-<index>` with the
//! driver's attributes and `memory` capacity.

use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, Device, DeviceClass, DeviceClassSpec, DeviceSelector, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The selector of NVIDIA's `gpu.nvidia.com` DeviceClass: whole GPUs of the driver.
pub const NVIDIA_GPU_SELECTOR: &str = super::nvidia::DEVICE_CLASS_SELECTOR;

/// One GPU device as the driver publishes it (an H100 80GB on PCIe root `pci0000:<index>`),
/// built by the one definition of the driver's shapes ([`super::nvidia`]).
pub fn nvidia_gpu(index: usize, uuid: &str) -> Device {
    super::nvidia::nvidia_gpu_device(&h100(), &fake_gpu(index, uuid))
}

/// The fixtures' GPU model.
fn h100() -> super::nvidia::GpuModel {
    super::nvidia::gpu_model(super::nvidia::H100_PRODUCT)
}

fn fake_gpu(index: usize, uuid: &str) -> super::nvidia::NvidiaGpu {
    super::nvidia::NvidiaGpu {
        index: u32::try_from(index).unwrap_or(u32::MAX),
        uuid: uuid.to_string(),
        memory_mib: 81_559,
        pcie_bus_id: format!("0000:{:02x}:00.0", 0x18 + index),
        pcie_root: format!("pci0000:{index:02x}"),
    }
}

/// The driver's slice for `node`: pool `node`, one slice, the given `(index, uuid)` GPUs.
pub fn nvidia_slice(node: &str, gpus: &[(usize, &str)], pool_generation: i64) -> ResourceSlice {
    let gpus: Vec<_> = gpus.iter().map(|(i, uuid)| fake_gpu(*i, uuid)).collect();
    super::nvidia::nvidia_gpu_slice(node, &h100(), &gpus, pool_generation)
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
    super::nvidia::device_class()
}

//! ResourceSlices and the DeviceClass as NVIDIA's DRA driver (`gpu.nvidia.com`) publishes them:
//! one node-local slice per node, pool named after the node, devices `gpu-<index>` with the
//! driver's attributes and `memory` capacity.

use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, Device, DeviceClass, DeviceClassSpec, DeviceSelector, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

pub use super::nvidia::Shape;

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
        numa_node: Some(i64::try_from(index / 4).unwrap_or(0)),
    }
}

/// The driver's slice for `node` as today's driver publishes it: pool `node`, one slice, the
/// given `(minor, uuid)` GPUs (each on a PCIe root of its own, GPUs 0-3 on NUMA node 0, 4-7 on 1).
pub fn nvidia_slice(node: &str, gpus: &[(usize, &str)], pool_generation: i64) -> ResourceSlice {
    nvidia_slice_shaped(node, gpus, pool_generation, Shape::Current)
}

/// [`nvidia_slice`] in either shape of the driver.
pub fn nvidia_slice_shaped(node: &str, gpus: &[(usize, &str)], pool_generation: i64, shape: Shape) -> ResourceSlice {
    let gpus: Vec<_> = gpus.iter().map(|(i, uuid)| fake_gpu(*i, uuid)).collect();
    super::nvidia::nvidia_gpu_slice_shaped(node, &h100(), &gpus, pool_generation, shape)
}

/// [`nvidia_slice_shaped`] with each GPU of `mig_parents` in static MIG mode: published as one
/// `1g.10gb` MIG device (placement 0) instead of a whole GPU, after the whole GPUs (a GPU in
/// MIG mode is published only as its MIG devices).
pub fn nvidia_slice_with_mig(
    node: &str,
    gpus: &[(usize, &str)],
    mig_parents: &[usize],
    pool_generation: i64,
    shape: Shape,
) -> ResourceSlice {
    let whole: Vec<(usize, &str)> = gpus.iter().filter(|(i, _)| !mig_parents.contains(i)).copied().collect();
    let mut slice = nvidia_slice_shaped(node, &whole, pool_generation, shape);
    let profile = super::nvidia::MigProfile::h100_1g_10gb();
    let migs = gpus.iter().filter(|(i, _)| mig_parents.contains(i)).map(|(i, uuid)| {
        super::nvidia::nvidia_mig_device(&h100(), &fake_gpu(*i, uuid), &profile, 0, &format!("MIG-{uuid}"))
    });
    slice.spec.devices.get_or_insert_default().extend(migs);
    slice
}

/// The ComputeDomain plugin's slice for `node`: `channel-0` and the daemon.
pub fn compute_domain_slice(node: &str) -> ResourceSlice {
    super::nvidia::compute_domain_slice(node, 1, 1)
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

/// Tests that run once per driver shape: the shape the running test's fixtures publish.
#[cfg(test)]
pub(crate) mod each_shape {
    use super::Shape;

    thread_local! {
        /// The driver shape the running test's fixtures publish ([`on_each_shape`]).
        static SHAPE: std::cell::Cell<Shape> = const { std::cell::Cell::new(Shape::Current) };
    }

    /// The shape the running test's fixtures publish.
    pub(crate) fn shape() -> Shape {
        SHAPE.with(std::cell::Cell::get)
    }

    /// Sets the shape the running test's fixtures publish (for property tests, whose bodies
    /// return their failures instead of panicking: they loop over [`Shape::ALL`] themselves).
    pub(crate) fn set_shape(shape: Shape) {
        SHAPE.with(|s| s.set(shape));
    }

    /// Runs `body` once per driver shape ([`Shape::ALL`]), with [`shape`] giving it; a failure
    /// names the shape it failed on.
    pub(crate) fn on_each_shape(body: impl Fn()) {
        for shape in Shape::ALL {
            set_shape(shape);
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&body));
            set_shape(Shape::Current);
            if let Err(e) = result {
                let why = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panic!("driver shape {shape}: {why}");
            }
        }
    }
}

//! A fake DRA driver for the tests: NVIDIA-shaped ResourceSlices (`gpu.nvidia.com`) for kwok GPU
//! nodes and the DeviceClass `gpu.nvidia.com`, built and applied by the library
//! (`muster_dev::dra`, the same code as `muster dev dra-slices`): by default in the shape NVIDIA's
//! driver publishes today, on request ([`PublishOptions`]) in the shape it had until 2025, with
//! MIG devices beside some GPUs (and the DeviceClass `mig.nvidia.com`) and with the
//! ComputeDomain plugin's slices (and the DeviceClass
//! `compute-domain-default-channel.nvidia.com`). A slice's device UUIDs are the node's
//! `gpu.muster.dev/topology` UUIDs.

use std::time::Duration;

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use kube::api::Api;
use muster_dev::dra;

use super::{client, wait_for};

pub use muster_dev::dra::PublishOptions;

/// The slices of some nodes (of both drivers), removed when dropped (also when the test
/// panics). The DeviceClasses are shared by every test (server-side apply makes publishing them
/// again harmless) and stay: removing one would break a test running beside this one.
#[derive(Debug)]
pub struct DraSlices {
    /// The nodes.
    pub nodes: Vec<String>,
    /// The slices as the API server holds them: per node, in the order of `nodes`, the GPU
    /// driver's slice, then (with [`PublishOptions::compute_domain`]) the ComputeDomain
    /// plugin's.
    pub slices: Vec<ResourceSlice>,
}

impl DraSlices {
    /// Publishes the DeviceClass and one slice for each of `nodes` (kwok GPU nodes) in today's
    /// shape, and waits until the API server serves them all.
    pub async fn publish(nodes: &[String]) -> Self {
        Self::publish_with(nodes, &PublishOptions::default()).await
    }

    /// Publishes what `options` asks for on each of `nodes` (kwok GPU nodes): the DeviceClasses
    /// and the slices of both drivers; waits until the API server serves every one of them.
    pub async fn publish_with(nodes: &[String], options: &PublishOptions) -> Self {
        let client = client().await;
        let published = dra::publish_with(&client, nodes, options)
            .await
            .unwrap_or_else(|e| panic!("publish DRA slices of {nodes:?} ({options:?}): {e}"));
        let api: Api<ResourceSlice> = Api::all(client.clone());
        let class_api: Api<DeviceClass> = Api::all(client);
        for name in &published.classes {
            wait_for(&format!("the DeviceClass {name}"), Duration::from_secs(10), || async {
                class_api.get_opt(name).await.ok().flatten()
            })
            .await;
        }
        let mut slices = Vec::new();
        for name in &published.slices {
            slices.push(
                wait_for(&format!("ResourceSlice {name}"), Duration::from_secs(10), || async {
                    api.get_opt(name).await.ok().flatten()
                })
                .await,
            );
        }
        Self { nodes: nodes.to_vec(), slices }
    }

    /// The slice of `node` of `driver` (`dra::DRIVER`, `dra::COMPUTE_DOMAIN_DRIVER`).
    pub fn of_driver(&self, node: &str, driver: &str) -> &ResourceSlice {
        self.slices
            .iter()
            .find(|s| s.spec.node_name.as_deref() == Some(node) && s.spec.driver == driver)
            .unwrap_or_else(|| panic!("no {driver} slice of {node}"))
    }

    /// The GPU driver's (`gpu.nvidia.com`) slice of `node`.
    pub fn of(&self, node: &str) -> &ResourceSlice {
        self.of_driver(node, dra::DRIVER)
    }

    /// The device names of `node`'s GPU driver slice (whole GPUs, then MIG devices).
    pub fn devices(&self, node: &str) -> Vec<String> {
        self.of(node).spec.devices.iter().flatten().map(|d| d.name.clone()).collect()
    }

    /// Removes the slices of both drivers now; returns the names deleted.
    pub async fn remove(&self) -> Vec<String> {
        dra::unpublish(&client().await, &self.nodes).await.unwrap_or_else(|e| panic!("remove DRA slices: {e}"))
    }
}

impl Drop for DraSlices {
    fn drop(&mut self) {
        // The drop may run inside a test's runtime: remove on a thread of its own.
        let nodes = self.nodes.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            rt.block_on(async {
                let kubeconfig = &super::CLUSTER.get()?.as_ref().ok()?.kubeconfig;
                let client = muster_dev::client(Some(kubeconfig)).await.ok()?;
                dra::unpublish(&client, &nodes).await.ok()
            })
        })
        .join();
    }
}

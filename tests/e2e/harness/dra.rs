//! A fake DRA driver for the tests: NVIDIA-shaped ResourceSlices (`gpu.nvidia.com`) for kwok GPU
//! nodes and the DeviceClass `gpu.nvidia.com`, built and applied by the library
//! (`muster_dev::dra`, the same code as `muster dev dra-slices`). A slice's device UUIDs
//! are the node's `gpu.muster.dev/topology` UUIDs.

use std::time::Duration;

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use kube::api::Api;
use muster_dev::dra;

use super::{client, wait_for};

use muster_dev::dra::DEVICE_CLASS;

/// The slices of some nodes, removed when dropped (also when the test panics). The DeviceClass
/// is shared by every test and stays.
#[derive(Debug)]
pub struct DraSlices {
    /// The nodes.
    pub nodes: Vec<String>,
    /// The slices as the API server holds them, in the order of `nodes`.
    pub slices: Vec<ResourceSlice>,
}

impl DraSlices {
    /// Publishes the DeviceClass and one slice for each of `nodes` (kwok GPU nodes), and waits
    /// until the API server serves them all.
    pub async fn publish(nodes: &[String]) -> Self {
        let client = client().await;
        let names =
            dra::publish(&client, nodes).await.unwrap_or_else(|e| panic!("publish DRA slices of {nodes:?}: {e}"));
        let api: Api<ResourceSlice> = Api::all(client.clone());
        let classes: Api<DeviceClass> = Api::all(client);
        wait_for("the DeviceClass gpu.nvidia.com", Duration::from_secs(10), || async {
            classes.get_opt(DEVICE_CLASS).await.ok().flatten()
        })
        .await;
        let mut slices = Vec::new();
        for name in &names {
            slices.push(
                wait_for(&format!("ResourceSlice {name}"), Duration::from_secs(10), || async {
                    api.get_opt(name).await.ok().flatten()
                })
                .await,
            );
        }
        Self { nodes: nodes.to_vec(), slices }
    }

    /// The slice of `node`.
    pub fn of(&self, node: &str) -> &ResourceSlice {
        self.slices
            .iter()
            .find(|s| s.spec.node_name.as_deref() == Some(node))
            .unwrap_or_else(|| panic!("no slice of {node}"))
    }

    /// The device names of `node`'s slice.
    pub fn devices(&self, node: &str) -> Vec<String> {
        self.of(node).spec.devices.iter().flatten().map(|d| d.name.clone()).collect()
    }

    /// Removes the slices now; returns the names deleted.
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

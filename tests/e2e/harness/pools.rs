//! Node pools of their own for tests that compare placements: kwok GPU nodes carrying a
//! pool-specific taint and label (and pool-specific rack and zone values), so that no other
//! test's pod can land on them and two pools never share a topology domain. The nodes are
//! deleted when their [`NodePool`] is dropped.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Api, Patch, PatchParams};
use muster_dev::{FIELD_MANAGER, FakeGpuNodes, KWOK_NODE, RACK_LABEL, ZONE_LABEL, fake_node};
use serde_json::{Value, json};

use super::{client, kubectl};

/// Label and taint key that tie a node to its pool; the value is the pool's name.
pub const POOL_LABEL: &str = "e2e.muster.dev/pool";

/// One pool: `<name>-<i>`, tainted `e2e.muster.dev/pool=<name>:NoSchedule` (and kwok's taint),
/// labelled `e2e.muster.dev/pool=<name>`, racks `<name>-rack-<r>`, zones `<name>-zone-<z>`.
#[derive(Debug)]
pub struct NodePool {
    /// The pool's name (label and taint value).
    pub name: String,
    /// Node names, in index order.
    pub nodes: Vec<String>,
}

impl NodePool {
    /// Creates the nodes of `shape` (its prefix, taint and labels are replaced) as pool `name`
    /// and waits until kwok has them Ready.
    pub async fn add(name: &str, shape: &FakeGpuNodes) -> Self {
        let spec = FakeGpuNodes { prefix: format!("{name}-"), taint: true, ..shape.clone() };
        let api: Api<Node> = Api::all(client().await);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let mut nodes = Vec::new();
        for index in spec.start_index..spec.start_index + spec.count {
            let node = fake_node(&spec, index).unwrap_or_else(|e| panic!("pool {name}: node {index}: {e}"));
            let node_name = node.metadata.name.clone().unwrap_or_default();
            let mut metadata = node.metadata.clone();
            let labels: &mut BTreeMap<String, String> = metadata.labels.get_or_insert_with(BTreeMap::new);
            for key in [RACK_LABEL, ZONE_LABEL] {
                if let Some(v) = labels.get(key).cloned() {
                    labels.insert(key.to_string(), format!("{name}-{v}"));
                }
            }
            labels.insert(POOL_LABEL.to_string(), name.to_string());
            let mut node_spec = node.spec.clone().unwrap_or_default();
            node_spec.taints.get_or_insert_with(Vec::new).push(Taint {
                key: POOL_LABEL.into(),
                value: Some(name.into()),
                effect: "NoSchedule".into(),
                ..Taint::default()
            });
            let body = json!({"apiVersion": "v1", "kind": "Node", "metadata": metadata, "spec": node_spec});
            api.patch(&node_name, &params, &Patch::Apply(&body))
                .await
                .unwrap_or_else(|e| panic!("pool {name}: apply node {node_name}: {e}"));
            let status = json!({"apiVersion": "v1", "kind": "Node", "status": node.status.unwrap_or_default()});
            api.patch_status(&node_name, &params, &Patch::Apply(&status))
                .await
                .unwrap_or_else(|e| panic!("pool {name}: node {node_name} status: {e}"));
            nodes.push(node_name);
        }
        for n in &nodes {
            let n = format!("node/{n}");
            tokio::task::spawn_blocking(move || kubectl(&["wait", "--for=condition=Ready", "--timeout=60s", &n]))
                .await
                .expect("kubectl wait");
        }
        Self { name: name.to_string(), nodes }
    }

    /// The pod spec fields that put a pod on this pool only (and let it tolerate the pool).
    pub fn placement(&self) -> Value {
        json!({
            "nodeSelector": {POOL_LABEL: self.name},
            "tolerations": [
                {"key": KWOK_NODE, "operator": "Exists", "effect": "NoSchedule"},
                {"key": POOL_LABEL, "operator": "Equal", "value": self.name, "effect": "NoSchedule"},
            ],
        })
    }
}

impl Drop for NodePool {
    /// Deletes the pool's nodes (without waiting; errors ignored: this is cleanup).
    fn drop(&mut self) {
        if self.nodes.is_empty() {
            return;
        }
        let mut args = vec!["delete", "node", "--wait=false", "--ignore-not-found"];
        args.extend(self.nodes.iter().map(String::as_str));
        let _ = super::cluster().kubectl(&args);
    }
}

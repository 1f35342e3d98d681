//! PURE glue between GPU topology and gang placement: each node's GPU model and health, and
//! the [`GpuChooser`] the scheduler asks for concrete indices (minimum-cost set, node score).

use std::collections::HashMap;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::Node;

use super::{GpuSet, GpuTopology, HealthThresholds, MetricsCache, NodeHealth, SelectOptions, healthy_mask, node_score};
use crate::crds::{GPU_RESOURCE, GPU_TOPOLOGY_ANNOTATION};
use crate::scheduler::{GpuChoice, GpuChooser, NodeInfo};

/// One node's GPUs as admission sees them.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeGpus {
    /// The topology (unknown topology when the annotation is missing or malformed).
    pub topology: GpuTopology,
    /// Why the annotation was not used, if it was not.
    pub topology_problem: Option<String>,
    /// Which GPUs are healthy enough to offer, and why others are not.
    pub health: NodeHealth,
}

impl NodeGpus {
    /// GPUs not offered because of health.
    pub fn unhealthy(&self) -> GpuSet {
        self.topology.all().difference(self.health.healthy)
    }
}

fn allocatable_gpus(node: &Node) -> u64 {
    node.status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .and_then(|a| a.get(GPU_RESOURCE))
        .and_then(|q| q.0.trim().parse::<u64>().ok())
        .unwrap_or(0)
}

/// The GPU model and health of every node with GPUs.
pub fn node_gpus(
    nodes: &[Node],
    metrics: &MetricsCache,
    thresholds: &HealthThresholds,
    now: SystemTime,
) -> HashMap<String, NodeGpus> {
    let mut out = HashMap::new();
    for node in nodes {
        let gpus = allocatable_gpus(node);
        let annotation =
            node.metadata.annotations.as_ref().and_then(|a| a.get(GPU_TOPOLOGY_ANNOTATION)).map(String::as_str);
        if gpus == 0 && annotation.is_none() {
            continue;
        }
        let name = node.metadata.name.clone().unwrap_or_default();
        let (topology, topology_problem) = GpuTopology::from_node(annotation, gpus);
        let health = healthy_mask(&topology, metrics.node(&name), thresholds, now);
        out.insert(name, NodeGpus { topology, topology_problem, health });
    }
    out
}

/// Chooses GPU indices by topology and health: the minimum-cost free, healthy set, and a node
/// score (link cost, fragmentation left behind, load) for ranking nodes.
pub struct TopologyChooser {
    nodes: HashMap<String, NodeGpus>,
    options: SelectOptions,
}

impl TopologyChooser {
    /// A chooser over `nodes`.
    pub fn new(nodes: HashMap<String, NodeGpus>, options: SelectOptions) -> Self {
        Self { nodes, options }
    }
}

impl GpuChooser for TopologyChooser {
    fn choose(&self, node: &NodeInfo, count: u32, used: u64) -> Option<GpuChoice> {
        let gpus = self.nodes.get(&node.name)?;
        let available = super::available(&gpus.health, GpuSet::from_bits(used));
        let score = node_score(&gpus.topology, available, count as usize, &gpus.health.utilization, self.options)?;
        Some(GpuChoice { mask: score.selection.gpus.bits(), score: score.score })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::{GpuMetrics, NodeMetrics};
    use crate::scheduler::Resources;
    use serde_json::json;

    fn node(name: &str, annotation: Option<&str>, gpus: u32) -> Node {
        let mut n: Node = serde_json::from_value(json!({
            "metadata": {"name": name},
            "status": {"allocatable": {"nvidia.com/gpu": gpus.to_string()}}
        }))
        .expect("node");
        if let Some(a) = annotation {
            n.metadata.annotations = Some([(GPU_TOPOLOGY_ANNOTATION.to_string(), a.to_string())].into());
        }
        n
    }

    fn pcie() -> String {
        let links: Vec<Vec<&str>> = (0..8)
            .map(|i| {
                (0..8)
                    .map(|j| {
                        if i == j {
                            "X"
                        } else if i / 2 == j / 2 {
                            "PIX"
                        } else if i / 4 == j / 4 {
                            "NODE"
                        } else {
                            "SYS"
                        }
                    })
                    .collect()
            })
            .collect();
        let gpus: Vec<serde_json::Value> = (0..8).map(|i| json!({"index": i, "numa": i / 4})).collect();
        json!({"version": 1, "gpus": gpus, "links": links}).to_string()
    }

    #[test]
    fn picks_a_pcie_switch_pair_and_skips_hot_gpus() {
        let now = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000);
        let mut metrics = MetricsCache::default();
        let hot = GpuMetrics { temperature_c: 90.0, memory_free_fraction: 0.9, utilization: 0.0, observed_at: now };
        let cool = GpuMetrics { temperature_c: 40.0, ..hot };
        let mut gpus = std::collections::BTreeMap::new();
        for i in 0..8 {
            gpus.insert(i, if i == 0 { hot } else { cool });
        }
        metrics.store(Ok([("n1".to_string(), NodeMetrics { gpus })].into()), now);
        let map = node_gpus(
            &[node("n1", Some(&pcie()), 8), node("cpu", None, 0)],
            &metrics,
            &HealthThresholds::default(),
            now,
        );
        assert!(!map.contains_key("cpu"), "nodes without GPUs are left out");
        assert_eq!(map["n1"].unhealthy(), GpuSet::from_bits(1));
        let chooser = TopologyChooser::new(map, SelectOptions::default());
        let info = NodeInfo::new("n1", Resources::new());
        let pair = chooser.choose(&info, 2, 0).expect("a pair");
        // GPU 0 is hot, so 0-1 is out; the best pair on one PCIe switch is 2-3.
        assert_eq!(pair.mask, 0b1100);
        // With 2 and 3 taken, the next pair is 4-5 (6-7 ties on cost; fragmentation decides).
        let next = chooser.choose(&info, 2, 0b1100).expect("another pair");
        assert!(next.mask == 0b11_0000 || next.mask == 0b1100_0000, "{:b}", next.mask);
        assert!(chooser.choose(&info, 8, 0).is_none(), "only 7 healthy GPUs");
    }

    #[test]
    fn unknown_nodes_get_no_choice() {
        let chooser = TopologyChooser::new(HashMap::new(), SelectOptions::default());
        assert!(chooser.choose(&NodeInfo::new("x", Resources::new()), 1, 0).is_none());
    }
}

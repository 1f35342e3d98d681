//! PURE glue between GPU topology and gang placement: each node's GPU model and health, and
//! the [`GpuChooser`] the scheduler asks for concrete indices (minimum-cost set, node score).

use std::borrow::Borrow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::SystemTime;

use k8s_openapi::api::core::v1::Node;

use super::problem::GpuProblemKind;
use super::report::{self, AssignedAnnotation, HealthAnnotation};
use super::{
    Fit, GpuProblem, GpuSet, GpuTopology, HealthThresholds, MetricsCache, NodeHealth, NodeMetrics, SelectOptions,
    SelectionKey, TopologyProblem, fit, healthy_mask,
};
use crate::devices::TopologyError;
use crate::devices::dra::{Published, PublishedGpus};
use crate::scheduler::{GpuChoice, GpuChooser, NodeInfo};
use muster_api::{GPU_ASSIGNED_ANNOTATION, GPU_HEALTH_ANNOTATION, GPU_RESOURCE, GPU_TOPOLOGY_ANNOTATION};

/// One node's GPUs as admission sees them.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeGpus {
    /// The topology (unknown topology when the annotation is missing or malformed), shared
    /// with the parse kept between cycles: a cycle's 5,000 nodes copy no topology.
    pub topology: Arc<GpuTopology>,
    /// Why the annotation was not used, if it was not.
    pub topology_problem: Option<TopologyProblem>,
    /// Which GPUs are healthy enough to offer, and why others are not.
    pub health: NodeHealth,
    /// What the node agent says kubelet gave the pods here (`gpu.muster.dev/assigned`).
    pub assigned: Option<Arc<AssignedAnnotation>>,
    /// The node agent's annotations that could not be used, as an operator should read it.
    pub report_problems: Vec<String>,
    /// Whether the node agent publishes health for this node (then missing samples are a
    /// problem worth hearing about, Prometheus or not).
    pub agent_health: bool,
}

impl NodeGpus {
    /// GPUs not offered because of health.
    pub fn unhealthy(&self) -> GpuSet {
        self.topology.all().difference(self.health.healthy)
    }

    /// What an operator should hear about this node's GPUs (see [`NodeHealth::problems`]),
    /// the topology annotation first; at most one problem of each kind.
    pub fn problems(&self, metrics_expected: bool) -> Vec<GpuProblem> {
        let topology = self.topology_problem.iter().map(TopologyProblem::problem);
        let agent = (!self.report_problems.is_empty())
            .then(|| GpuProblem { kind: GpuProblemKind::AgentReportInvalid, message: self.report_problems.join("; ") });
        topology.chain(self.health.problems(metrics_expected || self.agent_health)).chain(agent).collect()
    }

    /// A node's GPUs known only from its model: no agent report.
    pub fn from_model(topology: GpuTopology, topology_problem: Option<TopologyProblem>, health: NodeHealth) -> Self {
        NodeGpus {
            topology: Arc::new(topology),
            topology_problem,
            health,
            assigned: None,
            report_problems: Vec::new(),
            agent_health: false,
        }
    }
}

/// Each node's GPU model and its kind ([`FitCache::kind_of`]), by node name: what the chooser
/// reads.
pub type ChooserNodes = HashMap<String, (usize, NodeGpus), foldhash::fast::RandomState>;

/// Each node's GPU model by node name, however it is held: a map built for one pass, or the
/// models kept between cycles.
pub trait NodeModels {
    /// The model of `node`, if it has GPUs.
    fn model(&self, node: &str) -> Option<&NodeGpus>;
    /// Every node with a model.
    fn models(&self) -> impl Iterator<Item = (&String, &NodeGpus)>;
    /// How many nodes have one.
    fn count(&self) -> usize;
}

impl NodeModels for HashMap<String, NodeGpus> {
    fn model(&self, node: &str) -> Option<&NodeGpus> {
        self.get(node)
    }
    fn models(&self) -> impl Iterator<Item = (&String, &NodeGpus)> {
        self.iter()
    }
    fn count(&self) -> usize {
        self.len()
    }
}

impl NodeModels for ChooserNodes {
    fn model(&self, node: &str) -> Option<&NodeGpus> {
        self.get(node).map(|(_, g)| g)
    }
    fn models(&self) -> impl Iterator<Item = (&String, &NodeGpus)> {
        self.iter().map(|(n, (_, g))| (n, g))
    }
    fn count(&self) -> usize {
        self.len()
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

fn node_annotation<'n>(node: &'n Node, key: &str) -> Option<&'n str> {
    node.metadata.annotations.as_ref().and_then(|a| a.get(key)).map(String::as_str)
}

/// The GPU model and health of every node with GPUs.
pub fn node_gpus<N: Borrow<Node>>(
    nodes: &[N],
    metrics: &MetricsCache,
    thresholds: &HealthThresholds,
    now: SystemTime,
) -> HashMap<String, NodeGpus> {
    node_gpus_with(nodes, &Published::new(), metrics, thresholds, now)
}

/// [`node_gpus`], counting as a node's GPUs the larger of its `nvidia.com/gpu` allocatable and
/// `published[node]`: the GPUs its DRA driver publishes as devices (a DRA node advertises no
/// `nvidia.com/gpu`, and its topology annotation is checked against the devices instead).
pub fn node_gpus_with<N: Borrow<Node>>(
    nodes: &[N],
    published: &Published,
    metrics: &MetricsCache,
    thresholds: &HealthThresholds,
    now: SystemTime,
) -> HashMap<String, NodeGpus> {
    let kept: Vec<(&str, GpuNode)> = nodes
        .iter()
        .map(Borrow::borrow)
        .map(|n| (n.metadata.name.as_deref().unwrap_or_default(), GpuNode::of(n)))
        .collect();
    node_gpus_of(kept.iter().map(|(name, g)| (*name, g)), published, metrics, thresholds, now)
}

/// [`node_gpus_with`] of nodes as kept ([`GpuNode`], by name): nothing is parsed, and each
/// sound topology is shared with the kept node. Health is worked out afresh (it depends on
/// the metrics and the clock).
pub fn node_gpus_of<'a>(
    nodes: impl IntoIterator<Item = (&'a str, &'a GpuNode)>,
    published: &Published,
    metrics: &MetricsCache,
    thresholds: &HealthThresholds,
    now: SystemTime,
) -> HashMap<String, NodeGpus> {
    let mut out = HashMap::new();
    for (name, node) in nodes {
        let samples = node.samples(metrics.node(name));
        if let Some((model, _)) = node_model(node, published.get(name).map(|p| &**p), samples.as_ref(), thresholds, now)
        {
            out.insert(name.to_string(), model);
        }
    }
    out
}

/// PURE: one node's GPU model from the node as kept, the whole GPUs its DRA driver publishes
/// (if any) and its health samples ([`GpuNode::samples`]), with when a sample it read goes
/// stale (`None`: the model holds until an input changes). `None` for a node without GPUs and
/// without a topology annotation.
///
/// A node whose driver publishes GPUs is modelled from them ([`PublishedGpus::checked`]): its
/// topology annotation when it names exactly the published GPUs, else the driver's pcieRoot /
/// numaNode locality (a disagreeing annotation is the node's problem, reported with the
/// others). Any other node: its annotation checked against its `nvidia.com/gpu` allocatable.
pub fn node_model(
    node: &GpuNode,
    published: Option<&PublishedGpus>,
    samples: Option<&NodeMetrics>,
    thresholds: &HealthThresholds,
    now: SystemTime,
) -> Option<(NodeGpus, Option<SystemTime>)> {
    let published = published.filter(|p| !p.is_empty());
    let count = node.gpus_with(published.map_or(0, PublishedGpus::slots));
    if count == 0 && node.topology.is_none() {
        return None;
    }
    let (topology, topology_problem) = match published {
        Some(p) => p.checked(node.topology.as_ref()),
        None => GpuTopology::checked(node.topology.as_ref(), count),
    };
    let health = healthy_mask(&topology, samples, thresholds, now);
    let valid_until = samples.and_then(|s| super::health::fresh_until(&topology, s, thresholds, now));
    let model = NodeGpus {
        topology,
        topology_problem,
        health,
        assigned: node.assigned.clone(),
        report_problems: node.report_problems.clone(),
        agent_health: node.agent.is_some(),
    };
    Some((model, valid_until))
}

/// PURE: what the GPU model reads of a node, parsed once, when its watch event arrives: its
/// `nvidia.com/gpu` allocatable, its topology annotation (checked against its GPU count each
/// cycle, which DRA slices may raise), the node agent's health and assignments. Admission
/// keeps this per node instead of the node (a trimmed `Node` was still over 3 KiB).
#[derive(Clone, Debug, PartialEq)]
pub struct GpuNode {
    uid: String,
    allocatable: u64,
    /// The topology annotation as parsed; `None` without one.
    topology: Option<Result<Arc<GpuTopology>, TopologyError>>,
    agent: Option<crate::devices::NodeMetrics>,
    assigned: Option<Arc<AssignedAnnotation>>,
    report_problems: Vec<String>,
}

impl GpuNode {
    /// What the GPU model reads of `node`.
    pub fn of(node: &Node) -> Self {
        let mut report_problems = Vec::new();
        let agent = node_annotation(node, GPU_HEALTH_ANNOTATION)
            .and_then(|v| HealthAnnotation::parse(v).map_err(|e| report_problems.push(e.to_string())).ok());
        let assigned = node_annotation(node, GPU_ASSIGNED_ANNOTATION)
            .and_then(|v| AssignedAnnotation::parse(v).map_err(|e| report_problems.push(e.to_string())).ok());
        GpuNode {
            uid: node.metadata.uid.clone().unwrap_or_default(),
            allocatable: allocatable_gpus(node),
            topology: node_annotation(node, GPU_TOPOLOGY_ANNOTATION).map(|v| GpuTopology::parse(v).map(Arc::new)),
            agent,
            assigned: assigned.map(Arc::new),
            report_problems,
        }
    }

    /// The node's `metadata.uid`.
    pub fn uid(&self) -> &str {
        &self.uid
    }

    /// The node with the agent's health and assignments taken from its NodeGPUReport instead
    /// of its annotations (an agent that writes the report writes no annotation; one from
    /// before writes only those), when `report` is the report of this very node: owned by a
    /// Node of its uid (a report left by a deleted node of the same name is not). Otherwise the
    /// node as it is.
    pub fn with_report(self: &Arc<Self>, report: Option<&GpuReport>) -> Arc<Self> {
        match report {
            Some(r) if r.owner_uid == self.uid => Arc::new(GpuNode {
                agent: r.agent.clone(),
                assigned: r.assigned.clone(),
                report_problems: r.report_problems.clone(),
                ..GpuNode::clone(self)
            }),
            _ => self.clone(),
        }
    }

    /// Its GPU count: the larger of its `nvidia.com/gpu` allocatable and the GPUs its DRA
    /// driver publishes (a DRA node advertises no `nvidia.com/gpu`).
    pub fn gpus_with(&self, published: u64) -> u64 {
        self.allocatable.max(published)
    }

    /// Its health samples: the node agent's merged with the metrics source's (the newest per
    /// GPU).
    pub fn samples(&self, metrics: Option<&NodeMetrics>) -> Option<NodeMetrics> {
        report::newest(self.agent.as_ref(), metrics)
    }
}

/// What a malformed `spec.health` of a NodeGPUReport is reported as.
pub const REPORT_HEALTH: &str = "NodeGPUReport spec.health";
/// What a malformed `spec.assigned` of a NodeGPUReport is reported as.
pub const REPORT_ASSIGNED: &str = "NodeGPUReport spec.assigned";

/// PURE: what the GPU model reads of a node's NodeGPUReport (the node agent's health samples
/// and kubelet's assignments), parsed once, when its watch event arrives, with the same parser
/// as the annotations it replaces. Joined to its node by [`GpuNode::with_report`].
#[derive(Clone, Debug, PartialEq)]
pub struct GpuReport {
    /// The uid of the Node its ownerReference names (empty without one).
    owner_uid: String,
    agent: Option<NodeMetrics>,
    assigned: Option<Arc<AssignedAnnotation>>,
    report_problems: Vec<String>,
}

impl GpuReport {
    /// What the GPU model reads of `report`; a field that does not parse is the node's problem
    /// (as a malformed annotation is), the other field still read.
    pub fn of(report: &muster_api::NodeGPUReport) -> Self {
        let mut problems = Vec::new();
        let agent = report.spec.health.as_ref().and_then(|v| {
            HealthAnnotation::parse_value(v, REPORT_HEALTH).map_err(|e| problems.push(e.to_string())).ok()
        });
        let assigned = report.spec.assigned.as_ref().and_then(|v| {
            AssignedAnnotation::parse_value(v, REPORT_ASSIGNED).map_err(|e| problems.push(e.to_string())).ok()
        });
        let owner_uid = report
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.kind == "Node" && o.api_version == "v1")
            .map(|o| o.uid.clone())
            .unwrap_or_default();
        GpuReport { owner_uid, agent, assigned: assigned.map(Arc::new), report_problems: problems }
    }
}

/// The load-independent part of GPU choices ([`Fit`]), shared by every admission cycle: it
/// depends only on the node's kind ([`SelectionKey`]), its free healthy GPUs, the count and
/// the options, so one answer serves every node of that kind and occupancy, now and later.
///
/// Kinds get ids that are never reused; past [`FitCache::LIMIT`] answers (or as many kinds)
/// everything is forgotten at once, so memory stays bounded and an old id never names a new
/// kind.
#[derive(Debug, Default)]
pub struct FitCache {
    inner: Mutex<FitCacheInner>,
}

#[derive(Debug, Default)]
struct FitCacheInner {
    kinds: HashMap<Arc<SelectionKey>, usize>,
    /// Kinds by the address of a key looked up before: a kept node's topology, and so its
    /// key, is the same `Arc` cycle after cycle, so its kind is found without hashing or
    /// comparing the key (5,000 nodes a cycle). The `Weak` keeps the address from being
    /// reused while the entry lives; entries of keys no node holds any more are dropped now
    /// and then ([`FitCache::PRUNE_EVERY`]).
    by_address: HashMap<usize, (Weak<SelectionKey>, usize), foldhash::fast::RandomState>,
    lookups: usize,
    next_kind: usize,
    fits: HashMap<(usize, GpuSet, u32, SelectOptions), Option<Fit>, foldhash::fast::RandomState>,
}

impl FitCache {
    /// Most answers (and kinds) kept before the cache starts over.
    pub const LIMIT: usize = 1 << 18;

    /// Lookups the address memo missed between two sweeps of it.
    const PRUNE_EVERY: usize = 1 << 16;

    /// The id of the kind of `model`'s node.
    pub fn kind_of(&self, model: &NodeGpus) -> usize {
        self.kind(model.topology.selection_key())
    }

    /// The id of a node kind.
    fn kind(&self, key: Arc<SelectionKey>) -> usize {
        let Ok(mut inner) = self.inner.lock() else {
            return usize::MAX;
        };
        let address = Arc::as_ptr(&key) as usize;
        if let Some((_, id)) = inner.by_address.get(&address).filter(|(w, _)| w.strong_count() > 0) {
            return *id;
        }
        inner.lookups += 1;
        if inner.lookups >= Self::PRUNE_EVERY {
            inner.lookups = 0;
            inner.by_address.retain(|_, (w, _)| w.strong_count() > 0);
        }
        let id = match inner.kinds.get(&key) {
            Some(&id) => id,
            None => {
                if inner.kinds.len() >= Self::LIMIT {
                    inner.kinds.clear();
                    inner.by_address.clear();
                    inner.fits.clear();
                }
                let id = inner.next_kind;
                inner.next_kind += 1;
                inner.kinds.insert(key.clone(), id);
                id
            }
        };
        inner.by_address.insert(address, (Arc::downgrade(&key), id));
        id
    }

    /// The cached answer, or `compute`'s (then kept).
    fn fit(&self, key: (usize, GpuSet, u32, SelectOptions), compute: impl FnOnce() -> Option<Fit>) -> Option<Fit> {
        // A poisoned lock (a panic elsewhere) or an unnamed kind: compute without the cache.
        let Ok(mut inner) = self.inner.lock() else {
            return compute();
        };
        if key.0 == usize::MAX {
            return compute();
        }
        if let Some(fit) = inner.fits.get(&key) {
            return *fit;
        }
        if inner.fits.len() >= Self::LIMIT {
            inner.fits.clear();
        }
        let fit = compute();
        inner.fits.insert(key, fit);
        fit
    }

    /// How many answers are kept.
    pub fn len(&self) -> usize {
        self.inner.lock().map(|i| i.fits.len()).unwrap_or(0)
    }

    /// Whether no answer is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Chooses GPU indices by topology and health: the minimum-cost free, healthy set, and a node
/// score (link cost, fragmentation left behind, load) for ranking nodes.
///
/// Placement asks every node that passes the filters, thousands per decision; the exact
/// selection behind each answer comes from a [`FitCache`], and each node's load is added on
/// top.
pub struct TopologyChooser {
    nodes: Arc<ChooserNodes>,
    options: SelectOptions,
    cache: Arc<FitCache>,
}

impl TopologyChooser {
    /// A chooser over `nodes` with a cache of its own.
    pub fn new(nodes: HashMap<String, NodeGpus>, options: SelectOptions) -> Self {
        Self::with_cache(nodes, options, Arc::default())
    }

    /// A chooser over `nodes` sharing `cache` with earlier and later choosers.
    pub fn with_cache(nodes: HashMap<String, NodeGpus>, options: SelectOptions, cache: Arc<FitCache>) -> Self {
        let nodes = nodes.into_iter().map(|(name, gpus)| (name, (cache.kind_of(&gpus), gpus))).collect();
        Self::shared(Arc::new(nodes), options, cache)
    }

    /// A chooser over models kept between cycles ([`super::models::GpuModels::shared`]),
    /// their kinds named by `cache`.
    pub fn shared(nodes: Arc<ChooserNodes>, options: SelectOptions, cache: Arc<FitCache>) -> Self {
        Self { nodes, options, cache }
    }
}

impl GpuChooser for TopologyChooser {
    fn choose(&self, node: &NodeInfo, count: u32, used: GpuSet) -> Option<GpuChoice> {
        let (kind, gpus) = self.nodes.get(&node.name)?;
        let available = super::available(&gpus.health, used);
        let key = (*kind, available, count, self.options);
        let fit = self.cache.fit(key, || fit(&gpus.topology, available, count as usize, self.options))?;
        let score = fit.with_load(&gpus.health.utilization);
        Some(GpuChoice { gpus: score.selection.gpus, score: score.score })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::devices::{GpuMetrics, NodeMetrics, fixtures};
    use crate::scheduler::Resources;
    use serde_json::json;
    use std::collections::BTreeMap;

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

    /// What a driver publishing `n` whole GPUs `GPU-<i>` (no locality attributes) gives.
    pub(crate) fn published_of(n: usize) -> Arc<crate::devices::dra::PublishedGpus> {
        let gpus = (0..n)
            .map(|i| (i, crate::devices::dra::PublishedGpu { uuid: Some(format!("GPU-{i}")), ..Default::default() }))
            .collect();
        Arc::new(crate::devices::dra::PublishedGpus { gpus })
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
        let gpus: Vec<serde_json::Value> =
            (0..8).map(|i| json!({"index": i, "numa": i / 4, "uuid": format!("GPU-{i}")})).collect();
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
        let pair = chooser.choose(&info, 2, GpuSet::EMPTY).expect("a pair");
        // GPU 0 is hot, so 0-1 is out; the best pair on one PCIe switch is 2-3.
        assert_eq!(pair.gpus, GpuSet::from_bits(0b1100));
        // With 2 and 3 taken, the next pair is 4-5 (6-7 ties on cost; fragmentation decides).
        let next = chooser.choose(&info, 2, GpuSet::from_bits(0b1100)).expect("another pair");
        assert!(next.gpus.bits() == 0b11_0000 || next.gpus.bits() == 0b1100_0000, "{}", next.gpus);
        assert!(chooser.choose(&info, 8, GpuSet::EMPTY).is_none(), "only 7 healthy GPUs");
    }

    #[test]
    fn the_agents_health_annotation_keeps_a_hot_gpu_off_offer_without_prometheus() {
        use crate::devices::report::HealthAnnotation;
        let now = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000);
        let sample = |t: f64, free: f64, secs: u64| GpuMetrics {
            temperature_c: t,
            memory_free_fraction: free,
            utilization: 0.0,
            observed_at: SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs),
        };
        let with_health = |n: Node, metrics: &NodeMetrics| {
            let mut n = n;
            let value = HealthAnnotation::from_metrics(metrics).to_json();
            n.metadata.annotations.get_or_insert_default().insert(GPU_HEALTH_ANNOTATION.into(), value);
            n
        };
        // GPU 1 is hot, GPU 2 short of memory; the rest are fine. The samples are fresh.
        let fresh = NodeMetrics {
            gpus: (0..8)
                .map(|i| (i, sample(if i == 1 { 91.0 } else { 40.0 }, if i == 2 { 0.1 } else { 0.9 }, 990)))
                .collect(),
        };
        // The same samples 100 s old are stale and ignored.
        let old = NodeMetrics {
            gpus: fresh
                .gpus
                .iter()
                .map(|(&i, m)| {
                    (i, GpuMetrics { observed_at: SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(900), ..*m })
                })
                .collect(),
        };
        let nodes =
            [with_health(node("n1", Some(&pcie()), 8), &fresh), with_health(node("n2", Some(&pcie()), 8), &old)];
        let map = node_gpus(&nodes, &MetricsCache::default(), &HealthThresholds::default(), now);
        assert_eq!(map["n1"].unhealthy(), GpuSet::from_bits(0b110));
        assert!(map["n1"].agent_health && map["n1"].report_problems.is_empty());
        assert_eq!(map["n2"].unhealthy(), GpuSet::EMPTY);
        let kinds: Vec<GpuProblemKind> = map["n2"].problems(false).iter().map(|p| p.kind).collect();
        assert_eq!(kinds, [GpuProblemKind::MetricsStale], "stale agent samples are worth hearing about");
        // A fresher Prometheus sample of GPU 1 (cooled down) wins over the agent's.
        let mut metrics = MetricsCache::default();
        metrics.store(Ok([("n1".to_string(), NodeMetrics { gpus: [(1, sample(50.0, 0.9, 995))].into() })].into()), now);
        let map = node_gpus(&nodes[..1], &metrics, &HealthThresholds::default(), now);
        assert_eq!(map["n1"].unhealthy(), GpuSet::from_bits(0b100));
    }

    #[test]
    fn a_dra_node_keeps_its_topology_annotation_when_its_slices_publish_as_many_gpus() {
        use crate::devices::dra::{NVIDIA_GPU_DRIVER, fixtures, published_gpus};
        let now = SystemTime::UNIX_EPOCH;
        // No nvidia.com/gpu: the GPUs are published as DRA devices only.
        let nodes = [node("dra", Some(&pcie()), 0), node("stale", Some(&pcie()), 0)];
        let uuids: Vec<String> = (0..8).map(|i| format!("GPU-{i}")).collect();
        let gpus: Vec<(usize, &str)> = uuids.iter().enumerate().map(|(i, u)| (i, u.as_str())).collect();
        let old = fixtures::nvidia_slice("dra", &gpus[..4], 1);
        let slices = [old, fixtures::nvidia_slice("dra", &gpus, 2), fixtures::nvidia_slice("stale", &gpus[..4], 1)];
        let published = published_gpus(&slices, NVIDIA_GPU_DRIVER);
        let counts: BTreeMap<&str, usize> = published.iter().map(|(n, p)| (n.as_str(), p.len())).collect();
        assert_eq!(counts, BTreeMap::from([("dra", 8), ("stale", 4)]), "newest generation only");
        let map = node_gpus_with(&nodes, &published, &MetricsCache::default(), &HealthThresholds::default(), now);
        assert!(map["dra"].topology.is_known() && map["dra"].topology_problem.is_none());
        assert_eq!(map["dra"].topology.len(), 8);
        assert_eq!(map["dra"].topology.link(0, 1), crate::devices::topology::Link::Pix, "the annotation's links");
        // 8 annotated, 4 published: the annotation is not trusted; the driver's 4 GPUs are the
        // model (each behind a root of its own, GPUs 0-3 on NUMA node 0), and the node says so.
        let stale = &map["stale"];
        assert_eq!(stale.topology.len(), 4);
        assert_eq!(stale.topology.link(0, 1), crate::devices::topology::Link::Node);
        let problem = stale.topology_problem.as_ref().map(TopologyProblem::problem).expect("a problem");
        assert_eq!(problem.kind, GpuProblemKind::TopologyMismatch);
        assert!(problem.message.contains("publishes 4 whole GPUs"), "{}", problem.message);
        let without = node_gpus(&nodes, &MetricsCache::default(), &HealthThresholds::default(), now);
        assert!(!without["dra"].topology.is_known(), "counted by nvidia.com/gpu alone the annotation looks stale");
    }

    #[test]
    fn a_dra_node_without_the_node_agent_is_modelled_from_its_devices_locality() {
        use crate::devices::dra::{NVIDIA_GPU_DRIVER, fixtures, published_gpus};
        use crate::devices::topology::Link;
        let now = SystemTime::UNIX_EPOCH;
        let uuids: Vec<String> = (0..8).map(|i| format!("GPU-{i}")).collect();
        let gpus: Vec<(usize, &str)> = uuids.iter().enumerate().map(|(i, u)| (i, u.as_str())).collect();
        let other: Vec<String> = (0..8).map(|i| format!("GPU-other-{i}")).collect();
        let others: Vec<(usize, &str)> = other.iter().enumerate().map(|(i, u)| (i, u.as_str())).collect();
        for shape in fixtures::Shape::ALL {
            // No annotation (no node agent), and an annotation naming other GPUs (a stale one).
            let nodes = [node("bare", None, 0), node("swapped", Some(&pcie()), 0)];
            let slices = [
                fixtures::nvidia_slice_shaped("bare", &gpus, 1, shape),
                fixtures::nvidia_slice_shaped("swapped", &others, 1, shape),
            ];
            let published = published_gpus(&slices, NVIDIA_GPU_DRIVER);
            let map = node_gpus_with(&nodes, &published, &MetricsCache::default(), &HealthThresholds::default(), now);
            let bare = &map["bare"];
            assert_eq!(bare.topology.len(), 8, "{shape}");
            assert!(bare.topology_problem.is_none(), "{shape}: no node agent is no problem");
            let swapped = &map["swapped"];
            let problem = swapped.topology_problem.as_ref().map(TopologyProblem::problem).expect("a problem");
            assert_eq!(problem.kind, GpuProblemKind::TopologyMismatch, "{shape}");
            assert!(problem.message.contains("GPU-other-0"), "{shape}: {}", problem.message);
            match shape {
                // Today's driver publishes numaNode: GPUs 0-3 share one, 4-7 the other.
                fixtures::Shape::Current => {
                    assert!(bare.topology.is_known());
                    assert_eq!(bare.topology.link(0, 3), Link::Node);
                    assert_eq!(bare.topology.link(3, 4), Link::Sys);
                    assert_eq!(bare.topology.numa_groups().len(), 2);
                }
                // The old shape has a pcieRoot per GPU and no NUMA node: all SYS, still known.
                fixtures::Shape::Legacy => {
                    assert!(bare.topology.is_known());
                    assert_eq!(bare.topology.link(0, 3), Link::Sys);
                    assert!(bare.topology.numa_groups().is_empty());
                }
            }
            assert_eq!(swapped.topology, bare.topology, "{shape}: the driver's locality, shared");
        }
    }

    proptest::proptest! {
        /// The shared cache never changes an answer: every node, whatever its kind, health,
        /// load and used GPUs, gets exactly what scoring it alone gives.
        #[test]
        fn cached_choices_equal_scoring_each_node_alone(
            nodes in proptest::collection::vec((0usize..4, 0u64..256, 0u64..256, proptest::option::of(0u8..=100)), 1..24),
            count in 1u32..=8,
        ) {
            let kinds = [fixtures::dgx_h100(), fixtures::pcie(), fixtures::dgx1(), GpuTopology::unknown(8)];
            let cache = Arc::new(FitCache::default());
            // Two admission cycles sharing one cache; in the second, each name holds the
            // next node's GPUs, so a cached answer reaching the wrong node would show.
            for shift in 0..2 {
                let mut map = HashMap::new();
                let mut expected = Vec::new();
                for i in 0..nodes.len() {
                    let (kind, healthy, used, load) = nodes[(i + shift) % nodes.len()];
                    let health = NodeHealth {
                        healthy: GpuSet::from_bits(healthy),
                        reasons: vec![],
                        utilization: vec![load.map(|l| f64::from(l) / 100.0); 8],
                    };
                    let available = crate::devices::available(&health, GpuSet::from_bits(used));
                    let alone = crate::devices::node_score(
                        &kinds[kind], available, count as usize, &health.utilization, SelectOptions::default(),
                    )
                    .map(|s| GpuChoice { gpus: s.selection.gpus, score: s.score });
                    let name = format!("n{i}");
                    map.insert(name.clone(), NodeGpus::from_model(kinds[kind].clone(), None, health));
                    expected.push((name, GpuSet::from_bits(used), alone));
                }
                let chooser = TopologyChooser::with_cache(map, SelectOptions::default(), cache.clone());
                // Twice: the second round answers from the cache.
                for _ in 0..2 {
                    for (name, used, alone) in &expected {
                        let got = chooser.choose(&NodeInfo::new(name, Resources::new()), count, *used);
                        proptest::prop_assert_eq!(got, *alone, "node {}", name);
                    }
                }
            }
            proptest::prop_assert!(!cache.is_empty());
        }
    }

    /// A NodeGPUReport for `node` (owned by a Node of `owner_uid`, none when empty).
    fn report(
        node: &str,
        owner_uid: &str,
        health: Option<serde_json::Value>,
        assigned: Option<serde_json::Value>,
    ) -> muster_api::NodeGPUReport {
        let mut r = muster_api::NodeGPUReport::new(
            node,
            muster_api::NodeGPUReportSpec { gpus: None, pods: None, health, assigned },
        );
        if !owner_uid.is_empty() {
            r.metadata.owner_references = Some(vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.into(),
                uid: owner_uid.into(),
                ..Default::default()
            }]);
        }
        r
    }

    /// The GPUs of node `name` as the cluster state's joined nodes give them.
    fn joined(state: &crate::scheduler::ClusterState, name: &str, now: SystemTime) -> Option<NodeGpus> {
        let kept = state.gpu_nodes();
        let mut map = node_gpus_of(
            kept.iter().map(|(n, g)| (n.as_str(), &**g)),
            &Published::new(),
            &MetricsCache::default(),
            &HealthThresholds::default(),
            now,
        );
        map.remove(name)
    }

    #[test]
    fn a_nodes_gpu_report_overrides_its_annotations_and_a_deleted_one_falls_back() {
        use crate::devices::report::HealthAnnotation;
        use crate::scheduler::{Change, ClusterState};
        let now = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000);
        let hot = |hot: &[u32]| NodeMetrics {
            gpus: (0..8)
                .map(|i| {
                    let t = if hot.contains(&i) { 95.0 } else { 40.0 };
                    (i, GpuMetrics { temperature_c: t, memory_free_fraction: 0.9, utilization: 0.0, observed_at: now })
                })
                .collect(),
        };
        // The node's (older agent's) annotation says GPU 0 is hot; the report says GPU 3.
        let mut n = node("n1", Some(&pcie()), 8);
        n.metadata.uid = Some("uid-1".into());
        n.metadata
            .annotations
            .get_or_insert_default()
            .insert(GPU_HEALTH_ANNOTATION.into(), HealthAnnotation::from_metrics(&hot(&[0])).to_json());
        let assigned = json!({"version": 2, "resource": "nvidia.com/gpu", "pods": {"ns/a": {"devices": ["GPU-5"]}}});
        let ours = report("n1", "uid-1", Some(HealthAnnotation::from_metrics(&hot(&[3])).to_value()), Some(assigned));
        let mut state = ClusterState::default();
        state.apply_node(&n);
        let unhealthy = |s: &ClusterState| joined(s, "n1", now).map(|g| g.unhealthy());
        assert_eq!(unhealthy(&state), Some(GpuSet::from_bits(0b1)), "the annotation, without a report");
        assert!(state.report_changed(Change::Applied(&ours)));
        assert_eq!(unhealthy(&state), Some(GpuSet::from_bits(0b1000)), "the report overrides the annotation");
        let g = joined(&state, "n1", now).expect("n1");
        assert_eq!(g.assigned.map(|a| a.pods["ns/a"].devices.clone()), Some(vec!["GPU-5".to_string()]));
        assert!(!state.report_changed(Change::Applied(&ours)), "the same report again changes nothing");
        // A node event keeps the report joined.
        state.apply_node(&n);
        assert_eq!(unhealthy(&state), Some(GpuSet::from_bits(0b1000)));
        // Deleted: back to the annotation.
        assert!(state.report_changed(Change::Deleted(&ours)));
        assert_eq!(unhealthy(&state), Some(GpuSet::from_bits(0b1)), "a deleted report falls back");
        // A relist that no longer lists it drops it too.
        state.report_changed(Change::Applied(&ours));
        state.report_changed(Change::RelistStarted);
        assert!(state.report_changed(Change::RelistDone));
        assert_eq!(unhealthy(&state), Some(GpuSet::from_bits(0b1)));
    }

    #[test]
    fn a_report_of_an_unknown_node_or_of_another_owner_does_nothing() {
        use crate::devices::report::HealthAnnotation;
        use crate::scheduler::{Change, ClusterState};
        let now = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000);
        let all_hot = NodeMetrics {
            gpus: (0..8)
                .map(|i| {
                    (
                        i,
                        GpuMetrics {
                            temperature_c: 99.0,
                            memory_free_fraction: 0.9,
                            utilization: 0.0,
                            observed_at: now,
                        },
                    )
                })
                .collect(),
        };
        let health = Some(HealthAnnotation::from_metrics(&all_hot).to_value());
        let mut state = ClusterState::default();
        // No node n2: nothing to join, no node appears.
        assert!(!state.report_changed(Change::Applied(&report("n2", "uid-2", health.clone(), None))));
        assert!(state.gpu_nodes().is_empty());
        // The node comes: then its report counts.
        let mut n2 = node("n2", Some(&pcie()), 8);
        n2.metadata.uid = Some("uid-2".into());
        state.apply_node(&n2);
        assert_eq!(joined(&state, "n2", now).map(|g| g.unhealthy().len()), Some(8));
        // A report owned by another Node of the name (one deleted before), or by none, is not
        // this node's.
        let mut n1 = node("n1", Some(&pcie()), 8);
        n1.metadata.uid = Some("uid-1".into());
        state.apply_node(&n1);
        for stale in [report("n1", "uid-old", health.clone(), None), report("n1", "", health.clone(), None)] {
            assert!(!state.report_changed(Change::Applied(&stale)));
            let g = joined(&state, "n1", now).expect("n1");
            assert!(g.unhealthy().is_empty() && !g.agent_health);
        }
    }

    #[test]
    fn a_malformed_report_is_the_nodes_problem_and_its_sound_field_is_still_read() {
        use crate::scheduler::{Change, ClusterState};
        let now = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000);
        let mut n = node("n1", Some(&pcie()), 8);
        n.metadata.uid = Some("uid-1".into());
        let mut state = ClusterState::default();
        state.apply_node(&n);
        let assigned = json!({"version": 2, "resource": "nvidia.com/gpu", "pods": {}});
        let bad = report("n1", "uid-1", Some(json!({"version": 9})), Some(assigned));
        state.report_changed(Change::Applied(&bad));
        let g = joined(&state, "n1", now).expect("n1");
        assert_eq!(g.report_problems, ["NodeGPUReport spec.health has version 9; this muster reads version 1"]);
        assert!(g.assigned.is_some(), "the sound field is read");
        let kinds: Vec<GpuProblemKind> = g.problems(false).iter().map(|p| p.kind).collect();
        assert!(kinds.contains(&GpuProblemKind::AgentReportInvalid), "{kinds:?}");
        let broken = report("n1", "uid-1", None, Some(json!({"version": 2, "pods": []})));
        state.report_changed(Change::Applied(&broken));
        let g = joined(&state, "n1", now).expect("n1");
        assert!(
            g.report_problems.len() == 1
                && g.report_problems[0].starts_with("NodeGPUReport spec.assigned is not valid")
        );
    }

    proptest::proptest! {
        /// Joining each node to its report as events come equals joining the last node and
        /// report seen of each name afresh, whatever the order of node and report events
        /// (applied, deleted, relisted), owners right or stale, reports good or malformed.
        #[test]
        fn nodes_joined_as_events_come_equal_a_fresh_join(
            steps in proptest::collection::vec((0usize..3, 0usize..6, 0usize..4), 1..40),
        ) {
            use crate::scheduler::{Change, ClusterState};
            let names = ["a", "b", "c"];
            let hot = json!({"version": 1, "observedAt": "2026-01-01T00:00:00Z",
                "gpus": [{"index": 0, "temperatureC": 99.0, "memoryFreeFraction": 0.9, "utilization": 0.0}]});
            let mut state = ClusterState::default();
            let mut nodes: [Option<Node>; 3] = [None, None, None];
            let mut reports: [Option<muster_api::NodeGPUReport>; 3] = [None, None, None];
            for (i, what, variant) in steps {
                let name = names[i];
                match what {
                    0 => {
                        let mut n = node(name, Some(&pcie()), 8);
                        n.metadata.uid = Some(format!("uid-{name}-{}", variant % 2));
                        state.node_changed(Change::Applied(&n));
                        nodes[i] = Some(n);
                    }
                    1 => {
                        if let Some(n) = nodes[i].take() {
                            state.node_changed(Change::Deleted(&n));
                        }
                    }
                    2 | 3 => {
                        let health = [Some(hot.clone()), Some(json!({"version": 7})), None, Some(hot.clone())][variant].clone();
                        let r = report(name, &format!("uid-{name}-{}", what % 2), health, None);
                        state.report_changed(Change::Applied(&r));
                        reports[i] = Some(r);
                    }
                    4 => {
                        if let Some(r) = reports[i].take() {
                            state.report_changed(Change::Deleted(&r));
                        }
                    }
                    _ => {
                        // A relist of the reports that lists all but this one.
                        state.report_changed(Change::RelistStarted);
                        for (j, r) in reports.iter().enumerate() {
                            if let Some(r) = r.as_ref().filter(|_| j != i) {
                                state.report_changed(Change::Relisted(r));
                            }
                        }
                        state.report_changed(Change::RelistDone);
                        reports[i] = None;
                    }
                }
                let got: Vec<(String, GpuNode)> =
                    state.gpu_nodes().into_iter().map(|(n, g)| (n, GpuNode::clone(&g))).collect();
                let want: Vec<(String, GpuNode)> = nodes
                    .iter()
                    .zip(&reports)
                    .filter_map(|(n, r)| {
                        let n = n.as_ref()?;
                        let g = Arc::new(GpuNode::of(n));
                        let joined = g.with_report(r.as_ref().map(GpuReport::of).as_ref());
                        Some((n.metadata.name.clone().unwrap_or_default(), GpuNode::clone(&joined)))
                    })
                    .collect();
                proptest::prop_assert_eq!(got, want);
            }
        }
    }

    #[test]
    fn unknown_nodes_get_no_choice() {
        let chooser = TopologyChooser::new(HashMap::new(), SelectOptions::default());
        assert!(chooser.choose(&NodeInfo::new("x", Resources::new()), 1, GpuSet::EMPTY).is_none());
    }

    proptest::proptest! {
        /// Parsing each node once when it changes never changes an answer: after any
        /// sequence of node changes (GPU count, topology, health and assignment annotations,
        /// good or malformed, nodes gone and back) and DRA-published GPU counts, the nodes as
        /// kept give what reading each node's annotations afresh against its count gives.
        #[test]
        fn kept_nodes_give_what_reading_each_node_afresh_gives(
            steps in proptest::collection::vec(
                (0usize..3, proptest::option::of((0usize..3, 0usize..3, 0usize..3, 0usize..3)), 0usize..3),
                1..30,
            ),
        ) {
            let topologies = [None, Some(pcie()), Some("{not json".to_string())];
            let health = [None, Some("{}".to_string()), Some("[broken".to_string())];
            let assigned = [None, Some("{}".to_string()), Some("[broken".to_string())];
            let names = ["a", "b", "c"];
            let mut nodes: Vec<Option<Node>> = vec![None, None, None];
            let mut kept: std::collections::BTreeMap<&str, GpuNode> = std::collections::BTreeMap::new();
            let metrics = MetricsCache::default();
            let thresholds = HealthThresholds::default();
            for (i, change, dra) in steps {
                nodes[i] = change.map(|(gpus, t, h, a)| {
                    let mut n = node(names[i], topologies[t].as_deref(), [0, 4, 8][gpus]);
                    let annotations = n.metadata.annotations.get_or_insert_with(Default::default);
                    for (key, value) in [(GPU_HEALTH_ANNOTATION, &health[h]), (GPU_ASSIGNED_ANNOTATION, &assigned[a])] {
                        if let Some(v) = value {
                            annotations.insert(key.to_string(), v.clone());
                        }
                    }
                    n
                });
                match &nodes[i] {
                    Some(n) => kept.insert(names[i], GpuNode::of(n)),
                    None => kept.remove(names[i]),
                };
                let published: crate::devices::dra::Published =
                    [("a".to_string(), published_of([0, 4, 8][dra]))].into();
                let got = node_gpus_of(kept.iter().map(|(n, g)| (*n, g)), &published, &metrics, &thresholds, SystemTime::UNIX_EPOCH);
                // Each node read afresh: its annotations parsed against the count it has now.
                let mut want = HashMap::new();
                for n in nodes.iter().flatten() {
                    let name = n.metadata.name.clone().unwrap_or_default();
                    let publishes = published.get(&name).filter(|p| !p.is_empty());
                    let gpus = allocatable_gpus(n).max(publishes.map_or(0, |p| p.slots()));
                    let topology_annotation = node_annotation(n, GPU_TOPOLOGY_ANNOTATION);
                    if gpus == 0 && topology_annotation.is_none() {
                        continue;
                    }
                    let (topology, topology_problem) = match publishes {
                        Some(p) => {
                            let parsed = topology_annotation.map(|j| GpuTopology::parse(j).map(Arc::new));
                            let (t, problem) = p.checked(parsed.as_ref());
                            (Arc::unwrap_or_clone(t), problem)
                        }
                        None => GpuTopology::from_node(topology_annotation, gpus),
                    };
                    let mut report_problems = Vec::new();
                    let agent = node_annotation(n, GPU_HEALTH_ANNOTATION)
                        .and_then(|v| HealthAnnotation::parse(v).map_err(|e| report_problems.push(e.to_string())).ok());
                    let assigned = node_annotation(n, GPU_ASSIGNED_ANNOTATION)
                        .and_then(|v| AssignedAnnotation::parse(v).map_err(|e| report_problems.push(e.to_string())).ok());
                    let merged = report::newest(agent.as_ref(), metrics.node(&name));
                    let health = healthy_mask(&topology, merged.as_ref(), &thresholds, SystemTime::UNIX_EPOCH);
                    want.insert(name, NodeGpus {
                        topology: Arc::new(topology),
                        topology_problem,
                        health,
                        assigned: assigned.map(Arc::new),
                        report_problems,
                        agent_health: agent.is_some(),
                    });
                }
                proptest::prop_assert_eq!(got, want);
            }
        }
    }
}

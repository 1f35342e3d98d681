//! PURE: each node's GPU model kept between admission cycles, worked out again only for the
//! nodes whose inputs changed: the node as kept ([`GpuNode`], the same `Arc` until its watch
//! event changes it), the GPUs its DRA driver publishes, its health samples and the health
//! thresholds. Health read from samples also changes with the clock (a sample goes stale), so
//! a model built from samples is kept only until its first sample would go stale.
//!
//! A cycle at 5,000 nodes used to build every node's model afresh (a map of 5,000 names and
//! models, and each node's kind for the GPU chooser); with the models kept it looks at each
//! node's inputs and shares the map with the cycle's chooser ([`TopologyChooser::shared`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use super::chooser::{ChooserNodes, FitCache, GpuNode, NodeGpus, node_model};
use super::dra::{Published, PublishedGpus};
use super::{HealthThresholds, MetricsCache, NodeMetrics};

/// What one node's kept model was built from.
#[derive(Debug)]
struct Inputs {
    node: Arc<GpuNode>,
    published: Option<Arc<PublishedGpus>>,
    samples: Option<NodeMetrics>,
    thresholds: HealthThresholds,
    /// When a sample it was built from goes stale (`None`: never).
    valid_until: Option<SystemTime>,
    /// Replaced by a model of the node's DRA devices ([`GpuModels::replace`]): built again
    /// next time.
    replaced: bool,
    /// The last update that saw the node.
    seen: u64,
}

/// Every node's GPU model, with its kind for the chooser, kept between cycles.
#[derive(Debug, Default)]
pub struct GpuModels {
    nodes: Arc<ChooserNodes>,
    inputs: HashMap<String, Inputs, foldhash::fast::RandomState>,
    /// Updates so far.
    updates: u64,
}

impl GpuModels {
    /// Brings the models up to date with `nodes` (every node, by name); returns whether any
    /// model (or the set of nodes with one) changed. A node without GPUs and without a
    /// topology annotation has no model, as with [`super::chooser::node_gpus_of`].
    pub fn update<'a>(
        &mut self,
        nodes: impl IntoIterator<Item = (&'a str, &'a Arc<GpuNode>)>,
        published: &Published,
        metrics: &MetricsCache,
        thresholds: &HealthThresholds,
        now: SystemTime,
        kinds: &FitCache,
    ) -> bool {
        // The previous cycle's chooser is gone by now: the map is changed in place.
        let models = Arc::make_mut(&mut self.nodes);
        self.updates += 1;
        let seen = self.updates;
        let (mut changed, mut visited) = (false, 0);
        for (name, node) in nodes {
            let publishes = published.get(name);
            let samples = node.samples(metrics.node(name));
            if let Some(i) = self.inputs.get_mut(name)
                && !i.replaced
                && Arc::ptr_eq(&i.node, node)
                && i.published.as_deref() == publishes.map(|p| &**p)
                && i.samples == samples
                && i.thresholds == *thresholds
                && i.valid_until.is_none_or(|t| now < t)
            {
                i.seen = seen;
                visited += 1;
                continue;
            }
            let Some((model, valid_until)) =
                node_model(node, publishes.map(|p| &**p), samples.as_ref(), thresholds, now)
            else {
                changed |= models.remove(name).is_some();
                self.inputs.remove(name);
                continue;
            };
            visited += 1;
            let kind = kinds.kind_of(&model);
            if models.get(name).is_none_or(|(k, m)| (*k, m) != (kind, &model)) {
                models.insert(name.to_string(), (kind, model));
                changed = true;
            }
            let thresholds = *thresholds;
            let inputs = Inputs {
                node: node.clone(),
                published: publishes.cloned(),
                samples,
                thresholds,
                valid_until,
                replaced: false,
                seen,
            };
            self.inputs.insert(name.to_string(), inputs);
        }
        // Models of nodes not seen (gone, or kept only by a replacement): only then look.
        if models.len() > visited || self.inputs.len() > visited {
            self.inputs.retain(|_, i| i.seen == seen);
            let inputs = &self.inputs;
            let before = models.len();
            models.retain(|name, _| inputs.contains_key(name));
            changed |= models.len() != before;
        }
        changed
    }

    /// Replaces a node's model with `model` (a DRA node's devices) until the next
    /// [`GpuModels::update`] builds it again.
    pub fn replace(&mut self, name: &str, model: NodeGpus, kinds: &FitCache) {
        let kind = kinds.kind_of(&model);
        Arc::make_mut(&mut self.nodes).insert(name.to_string(), (kind, model));
        if let Some(i) = self.inputs.get_mut(name) {
            i.replaced = true;
        }
    }

    /// The models, by node name, shared (a chooser holds them for a cycle).
    pub fn shared(&self) -> Arc<ChooserNodes> {
        self.nodes.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::api::core::v1::Node;
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;
    use crate::devices::chooser::node_gpus_of;
    use crate::devices::report::HealthAnnotation;
    use crate::devices::{GpuMetrics, fixtures};
    use muster_api::{GPU_HEALTH_ANNOTATION, GPU_TOPOLOGY_ANNOTATION};

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    /// Samples of 8 GPUs taken at `secs`, GPU 1 hot.
    fn samples(secs: u64) -> NodeMetrics {
        let sample = |i: u32| GpuMetrics {
            temperature_c: if i == 1 { 95.0 } else { 40.0 },
            memory_free_fraction: 0.9,
            utilization: 0.5,
            observed_at: at(secs),
        };
        NodeMetrics { gpus: (0..8).map(|i| (i, sample(i))).collect() }
    }

    /// A node: its `nvidia.com/gpu`, topology annotation (none, an 8-GPU PCIe box, malformed)
    /// and the node agent's health samples (none, or taken at that second).
    fn node(name: &str, gpus: u64, topology: usize, health: Option<u64>) -> Node {
        let mut annotations = serde_json::Map::new();
        match topology {
            1 => {
                annotations.insert(GPU_TOPOLOGY_ANNOTATION.into(), fixtures::pcie().to_annotation().to_json().into());
            }
            2 => {
                annotations.insert(GPU_TOPOLOGY_ANNOTATION.into(), "{broken".into());
            }
            _ => {}
        }
        if let Some(secs) = health {
            let value = HealthAnnotation::from_metrics(&samples(secs)).to_json();
            annotations.insert(GPU_HEALTH_ANNOTATION.into(), value.into());
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "uid": format!("uid-{name}"), "annotations": annotations},
            "status": {"allocatable": {"nvidia.com/gpu": gpus.to_string()}}
        }))
        .expect("node")
    }

    /// One step: node i replaced (or gone), DRA-published counts, the metrics source's samples
    /// for node "b" (none, or taken at that second), and seconds passing.
    #[derive(Clone, Debug)]
    struct Step {
        node: usize,
        change: Option<(u64, usize, Option<u64>)>,
        published: u64,
        metrics: Option<u64>,
        passing: u64,
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        let change = proptest::option::of((
            prop_oneof![Just(0u64), Just(4), Just(8)],
            0usize..3,
            proptest::option::of(0u64..200),
        ));
        let step = (0usize..3, change, prop_oneof![Just(0u64), Just(8)], proptest::option::of(0u64..200), 0u64..40)
            .prop_map(|(node, change, published, metrics, passing)| Step { node, change, published, metrics, passing });
        proptest::collection::vec(step, 1..40)
    }

    proptest! {
        /// Keeping the models never changes an answer: after any sequence of node changes,
        /// nodes gone and back, DRA-published counts, metrics and the clock moving on (samples
        /// going stale), the kept models, with their kinds, are what building every node's
        /// model afresh gives; and an update that says nothing changed left them as they were.
        #[test]
        fn kept_models_equal_a_rebuild_after_any_sequence_of_changes(steps in steps()) {
            let names = ["a", "b", "c"];
            let mut kept: [Option<Arc<GpuNode>>; 3] = [None, None, None];
            let mut models = GpuModels::default();
            let kinds = FitCache::default();
            let thresholds = HealthThresholds::default();
            let mut metrics = MetricsCache::default();
            let mut now = 100;
            for step in steps {
                // A change is a new `Arc`, as a watch event makes one; an event that changes
                // nothing the model reads is a new `Arc` too.
                kept[step.node] = step.change.map(|(gpus, t, h)| Arc::new(GpuNode::of(&node(names[step.node], gpus, t, h))));
                let published: Published =
                    [("a".to_string(), crate::devices::chooser::tests::published_of(step.published as usize))].into();
                let source: crate::devices::ClusterMetrics = step.metrics.map(|s| ("b".to_string(), samples(s))).into_iter().collect();
                metrics.store(Ok(source), at(now));
                now += step.passing;
                let nodes: Vec<(&str, &Arc<GpuNode>)> =
                    names.iter().zip(&kept).filter_map(|(n, g)| g.as_ref().map(|g| (*n, g))).collect();
                let before = models.shared();
                let changed = models.update(nodes.iter().copied(), &published, &metrics, &thresholds, at(now), &kinds);
                let got = models.shared();
                let want = node_gpus_of(nodes.iter().map(|(n, g)| (*n, &***g)), &published, &metrics, &thresholds, at(now));
                prop_assert_eq!(got.len(), want.len());
                for (name, model) in &want {
                    let (kind, kept_model) = got.get(name).expect("a kept model");
                    prop_assert_eq!(kept_model, model, "node {}", name);
                    prop_assert_eq!(*kind, kinds.kind_of(model), "node {}", name);
                }
                if !changed {
                    prop_assert_eq!(&*before, &*got);
                }
            }
        }
    }

    #[test]
    fn a_model_from_samples_is_built_again_when_a_sample_goes_stale_and_not_before() {
        let node = Arc::new(GpuNode::of(&node("a", 8, 1, Some(100))));
        let (mut models, kinds, thresholds) = (GpuModels::default(), FitCache::default(), HealthThresholds::default());
        let metrics = MetricsCache::default();
        let mut update = |secs: u64| {
            models.update([("a", &node)], &HashMap::new(), &metrics, &thresholds, at(secs), &kinds);
            models.shared()["a"].1.health.healthy
        };
        // GPU 1 is hot while its sample is fresh (60 s), offered once it is stale.
        assert_eq!(update(120).len(), 7);
        assert_eq!(update(160).len(), 7);
        assert_eq!(update(161).len(), 8);
    }

    #[test]
    fn a_node_gone_loses_its_model_and_a_replacement_lasts_one_update() {
        let (a, b) = (Arc::new(GpuNode::of(&node("a", 8, 1, None))), Arc::new(GpuNode::of(&node("b", 4, 0, None))));
        let (mut models, kinds, thresholds) = (GpuModels::default(), FitCache::default(), HealthThresholds::default());
        let metrics = MetricsCache::default();
        assert!(models.update([("a", &a), ("b", &b)], &HashMap::new(), &metrics, &thresholds, at(0), &kinds));
        assert!(!models.update([("a", &a), ("b", &b)], &HashMap::new(), &metrics, &thresholds, at(1), &kinds));
        let topology = crate::devices::GpuTopology::unknown(6);
        let health = crate::devices::healthy_mask(&topology, None, &thresholds, at(2));
        let dra = NodeGpus::from_model(topology, None, health);
        models.replace("b", dra.clone(), &kinds);
        assert_eq!(models.shared()["b"].1, dra);
        assert!(models.update([("a", &a), ("b", &b)], &HashMap::new(), &metrics, &thresholds, at(2), &kinds));
        assert_eq!(models.shared()["b"].1.topology.len(), 4, "built from the node again");
        assert!(models.update([("a", &a)], &HashMap::new(), &metrics, &thresholds, at(3), &kinds));
        assert_eq!(models.shared().keys().collect::<Vec<_>>(), ["a"]);
    }
}

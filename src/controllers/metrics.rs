//! Prometheus metrics of the controller manager (`/metrics`, OpenMetrics text). One registry;
//! each reconciler records runs, errors by reason and duration through a drop-guard timer.

use std::sync::Arc;
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::devices::GpuProblemKind;

/// Labels naming a controller.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    /// `job`, `jobset`, `admission`, `devices`.
    pub controller: String,
}

/// Labels of a reconcile error.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// The controller.
    pub controller: String,
    /// `Error::metric_label()`.
    pub reason: String,
}

/// Labels of an unschedulable admission attempt.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// Why the gang did not fit (e.g. `Insufficient nvidia.com/gpu`).
    pub reason: String,
}

/// Labels of an error met on one object by admission (the cycle went on with the others).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ObjectErrorLabels {
    /// The kind of object: `Pod`, `PodGroup` or `CompositePodGroup`.
    pub kind: String,
    /// What went wrong: [`crate::controllers::context::api_error_reason`] (`forbidden`,
    /// `invalid`, `conflict`, `server_error`, `too_large`, ...), or `refused`.
    pub reason: String,
}

/// Labels of a node's GPU gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabels {
    /// Node name.
    pub node: String,
}

/// Labels of one kind of GPU problem on one node.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GpuProblemLabels {
    /// Node name.
    pub node: String,
    /// [`GpuProblemKind::label`] (e.g. `too_hot`, `topology_missing`).
    pub kind: String,
}

fn histogram_seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 18))
}

/// Every metric muster exports.
pub struct Metrics {
    registry: Registry,
    /// Reconciles run, per controller.
    pub reconciles: Family<ControllerLabels, Counter>,
    /// Reconcile errors, per controller and reason.
    pub reconcile_errors: Family<ErrorLabels, Counter>,
    /// Reconcile duration, per controller.
    pub reconcile_duration: Family<ControllerLabels, Histogram, fn() -> Histogram>,
    /// Gangs (roots) quorate and waiting for admission.
    pub gangs_pending: Gauge,
    /// Gangs admitted since start.
    pub gangs_admitted: Counter,
    /// Admission wake-ups with nothing to do (no event changed anything, no timer due).
    pub idle_cycles: Counter,
    /// Seconds from quorum to the last pod ungated.
    pub admission_latency: Histogram,
    /// Seconds one placement decision took.
    pub placement_duration: Histogram,
    /// Unschedulable admission attempts, by reason.
    pub unschedulable_attempts: Family<ReasonLabels, Counter>,
    /// Pins not bound within the bind timeout (the attempt rolled back, or the gang failed).
    pub bind_timeouts: Counter,
    /// Preemptions started for a gang (its victims evicted).
    pub preemptions: Counter,
    /// Pods evicted as preemption victims.
    pub preemption_victims: Counter,
    /// Gang attempts rolled back after a failed pin (every pod deleted, recreated gated).
    pub gang_rollbacks: Counter,
    /// Errors met on one object (a refused pod patch, a failed status write), by kind and reason.
    pub object_errors: Family<ObjectErrorLabels, Counter>,
    /// GPU index conflicts seen (two live pods claiming one GPU).
    pub gpu_conflicts: Counter,
    /// Pods whose GPU indices were corrected to what kubelet gave them (read back by the node
    /// agent), muster having planned others.
    pub gpu_index_corrections: Counter,
    /// GPUs allocated per node.
    pub gpus_allocated: Family<NodeLabels, Gauge>,
    /// GPUs per node.
    pub gpus_total: Family<NodeLabels, Gauge>,
    /// GPUs not offered per node (unhealthy).
    pub gpus_unhealthy: Family<NodeLabels, Gauge>,
    /// GPU problems per node and kind (topology annotation, metrics, health): 1 while the
    /// problem lasts; the series goes when it clears or the node does.
    pub gpu_node_problems: Family<GpuProblemLabels, Gauge>,
    /// Patches of `gpu.muster.dev/indices` onto pods that the API refused or failed, by reason.
    pub device_patch_errors: Family<ReasonLabels, Counter>,
    /// Webhook requests, by path and outcome.
    pub webhook_requests: Family<WebhookLabels, Counter>,
    /// Webhook request duration, by path.
    pub webhook_duration: Family<PathLabels, Histogram, fn() -> Histogram>,
    /// The allocator's figures (jemalloc), bytes, read at each scrape: `allocated` (live
    /// objects), `active` (the pages they are on), `resident` (the heap's share of RSS, its
    /// metadata and dirty pages not yet purged included), `retained` (unmapped lazily, not in
    /// RSS) and `metadata`. How much of RSS is live data, and how much the allocator holds.
    pub heap_bytes: Family<HeapLabels, Gauge>,
    /// 1 for the scheduling API new MusterJobs compile to (`--scheduling-api`, resolved).
    pub scheduling_api: Family<SchedulingApiLabels, Gauge>,
}

/// Labels of the scheduling API in use.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SchedulingApiLabels {
    /// `muster` or `upstream`: what new jobs compile to.
    pub api: String,
    /// The flag: `auto`, `muster` or `upstream`.
    pub requested: String,
}

/// Labels of an allocator figure.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HeapLabels {
    /// `allocated`, `active`, `resident`, `retained` or `metadata`.
    pub kind: String,
}

/// Labels of a webhook request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WebhookLabels {
    /// `/validate` or `/mutate`.
    pub path: String,
    /// `allowed`, `denied`, `patched` or `error`.
    pub outcome: String,
}

/// Labels naming a webhook path.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PathLabels {
    /// `/validate` or `/mutate`.
    pub path: String,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("muster");
        let m = Self {
            reconciles: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_duration: Family::new_with_constructor(histogram_seconds),
            gangs_pending: Gauge::default(),
            gangs_admitted: Counter::default(),
            idle_cycles: Counter::default(),
            admission_latency: histogram_seconds(),
            placement_duration: histogram_seconds(),
            unschedulable_attempts: Family::default(),
            bind_timeouts: Counter::default(),
            preemptions: Counter::default(),
            preemption_victims: Counter::default(),
            gang_rollbacks: Counter::default(),
            object_errors: Family::default(),
            gpu_conflicts: Counter::default(),
            gpu_index_corrections: Counter::default(),
            gpus_allocated: Family::default(),
            gpus_total: Family::default(),
            gpus_unhealthy: Family::default(),
            gpu_node_problems: Family::default(),
            device_patch_errors: Family::default(),
            webhook_requests: Family::default(),
            webhook_duration: Family::new_with_constructor(histogram_seconds),
            heap_bytes: Family::default(),
            scheduling_api: Family::default(),
            registry: Registry::default(),
        };
        registry.register("reconciles", "Reconciles run", m.reconciles.clone());
        registry.register(
            "scheduling_api",
            "1 for the scheduling API new MusterJobs compile to (muster or upstream) and the flag asked for",
            m.scheduling_api.clone(),
        );
        registry.register("reconcile_errors", "Reconcile errors by reason", m.reconcile_errors.clone());
        registry.register("reconcile_duration_seconds", "Reconcile duration", m.reconcile_duration.clone());
        registry.register("gangs_pending", "Quorate gangs waiting for admission", m.gangs_pending.clone());
        registry.register("gangs_admitted", "Gangs admitted", m.gangs_admitted.clone());
        registry.register(
            "admission_idle_wakeups",
            "Admission wake-ups skipped: no event changed anything and no timer was due",
            m.idle_cycles.clone(),
        );
        registry.register(
            "admission_latency_seconds",
            "Seconds from quorum to the whole gang ungated",
            m.admission_latency.clone(),
        );
        registry.register("placement_duration_seconds", "Seconds per placement decision", m.placement_duration.clone());
        registry.register(
            "unschedulable_attempts",
            "Admission attempts that did not fit, by reason",
            m.unschedulable_attempts.clone(),
        );
        registry.register(
            "bind_timeouts",
            "Pins not bound within the bind timeout (the attempt rolled back, or a started gang failed)",
            m.bind_timeouts.clone(),
        );
        registry.register(
            "preemptions",
            "Preemptions started for a gang that did not fit (its victims, of lower priority, evicted)",
            m.preemptions.clone(),
        );
        registry.register(
            "preemption_victims",
            "Pods evicted as preemption victims (whole groups of disruption mode all, else pod by pod)",
            m.preemption_victims.clone(),
        );
        registry.register(
            "gang_rollbacks",
            "Gang attempts rolled back (every pod deleted and recreated gated) after a pin failed",
            m.gang_rollbacks.clone(),
        );
        registry.register(
            "admission_object_errors",
            "Errors admission met on one object (it is backed off alone; the others go on), by kind and reason",
            m.object_errors.clone(),
        );
        // Not prefixed twice: the GPU conflict metric is named as the GPU issue asks.
        registry.register("gpu_conflicts", "GPU indices claimed by two live pods", m.gpu_conflicts.clone());
        registry.register(
            "gpu_index_corrections",
            "Pods whose gpu.muster.dev/indices were corrected to the GPUs kubelet gave them",
            m.gpu_index_corrections.clone(),
        );
        registry.register("gpus_allocated", "GPUs allocated per node", m.gpus_allocated.clone());
        registry.register("gpus", "GPUs per node", m.gpus_total.clone());
        registry.register("gpus_unhealthy", "GPUs not offered because of health, per node", m.gpus_unhealthy.clone());
        registry.register(
            "gpu_node_problems",
            "GPU problems per node and kind (topology annotation, metrics, health), 1 while present; see the node's events",
            m.gpu_node_problems.clone(),
        );
        registry.register(
            "device_patch_errors",
            "GPU index annotations the API refused or failed to write onto a pod, by reason",
            m.device_patch_errors.clone(),
        );
        registry.register("webhook_requests", "Admission webhook requests", m.webhook_requests.clone());
        registry.register("webhook_duration_seconds", "Admission webhook request duration", m.webhook_duration.clone());
        registry.register("heap_bytes", "The allocator's figures (jemalloc), bytes", m.heap_bytes.clone());
        Self { registry, ..m }
    }
}

impl Metrics {
    /// The registry as OpenMetrics text.
    pub fn encode(&self) -> String {
        self.read_heap();
        let mut out = String::new();
        // Encoding into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Reads the allocator's figures into [`Self::heap_bytes`] (nothing when jemalloc cannot
    /// say, e.g. in a binary with another allocator: its figures would be of no heap in use).
    fn read_heap(&self) {
        use tikv_jemalloc_ctl::{epoch, stats};
        if epoch::advance().is_err() {
            return;
        }
        let figures = [
            ("allocated", stats::allocated::read()),
            ("active", stats::active::read()),
            ("resident", stats::resident::read()),
            ("retained", stats::retained::read()),
            ("metadata", stats::metadata::read()),
        ];
        for (kind, bytes) in figures {
            if let Ok(bytes) = bytes {
                let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
                self.heap_bytes.get_or_create(&HeapLabels { kind: kind.to_string() }).set(bytes);
            }
        }
    }

    /// Counts a reconcile of `controller` and times it until the guard drops.
    pub fn reconcile(self: &Arc<Self>, controller: &str) -> ReconcileTimer {
        let labels = ControllerLabels { controller: controller.to_string() };
        self.reconciles.get_or_create(&labels).inc();
        ReconcileTimer { metrics: self.clone(), labels, start: Instant::now() }
    }

    /// Sets the GPU problem series of `node` to `kinds`: 1 for each kind present, and no
    /// series for the others (pass none when the node is gone).
    pub fn set_gpu_node_problems(&self, node: &str, kinds: &[GpuProblemKind]) {
        for kind in GpuProblemKind::ALL {
            let labels = GpuProblemLabels { node: node.to_string(), kind: kind.label().to_string() };
            if kinds.contains(&kind) {
                self.gpu_node_problems.get_or_create(&labels).set(1);
            } else {
                self.gpu_node_problems.remove(&labels);
            }
        }
    }

    /// Drops the GPU gauges of a node that is gone (or no longer has GPUs).
    pub fn remove_node_gpus(&self, node: &str) {
        let labels = NodeLabels { node: node.to_string() };
        self.gpus_total.remove(&labels);
        self.gpus_allocated.remove(&labels);
        self.gpus_unhealthy.remove(&labels);
    }

    /// Counts a reconcile error.
    pub fn reconcile_error(&self, controller: &str, reason: &str) {
        self.reconcile_errors
            .get_or_create(&ErrorLabels { controller: controller.into(), reason: reason.into() })
            .inc();
    }
}

/// Records a reconcile's duration when dropped.
pub struct ReconcileTimer {
    metrics: Arc<Metrics>,
    labels: ControllerLabels,
    start: Instant,
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        self.metrics.reconcile_duration.get_or_create(&self.labels).observe(self.start.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scrape_reads_the_allocators_figures() {
        let m = Metrics::default();
        let text = m.encode();
        for kind in ["allocated", "active", "resident", "retained", "metadata"] {
            assert!(text.contains(&format!("muster_heap_bytes{{kind=\"{kind}\"}}")), "{kind}: {text}");
        }
    }

    #[test]
    fn encodes_reconcile_metrics() {
        let m = Arc::new(Metrics::default());
        drop(m.reconcile("job"));
        m.reconcile_error("job", "kube");
        let text = m.encode();
        assert!(text.contains("muster_reconciles_total{controller=\"job\"} 1"), "{text}");
        assert!(text.contains("muster_reconcile_errors_total{controller=\"job\",reason=\"kube\"} 1"), "{text}");
        assert!(text.contains("muster_reconcile_duration_seconds_count{controller=\"job\"} 1"), "{text}");
    }

    #[test]
    fn gpu_problem_series_follow_the_kinds_present() {
        let m = Metrics::default();
        m.set_gpu_node_problems("n1", &[GpuProblemKind::TooHot, GpuProblemKind::TopologyMissing]);
        m.set_gpu_node_problems("n2", &[GpuProblemKind::MemoryFull]);
        let text = m.encode();
        assert!(text.contains("muster_gpu_node_problems{node=\"n1\",kind=\"too_hot\"} 1"), "{text}");
        assert!(text.contains("muster_gpu_node_problems{node=\"n1\",kind=\"topology_missing\"} 1"), "{text}");
        // The GPU cooled down: its series goes, the other stays.
        m.set_gpu_node_problems("n1", &[GpuProblemKind::TopologyMissing]);
        let text = m.encode();
        assert!(!text.contains("kind=\"too_hot\""), "{text}");
        assert!(text.contains("muster_gpu_node_problems{node=\"n1\",kind=\"topology_missing\"} 1"), "{text}");
        // The node is gone.
        m.set_gpu_node_problems("n1", &[]);
        let text = m.encode();
        assert!(!text.contains("node=\"n1\""), "{text}");
        assert!(text.contains("muster_gpu_node_problems{node=\"n2\",kind=\"memory_full\"} 1"), "{text}");
    }

    #[test]
    fn gone_nodes_lose_their_gpu_gauges() {
        let m = Metrics::default();
        for node in ["n1", "n2"] {
            let labels = NodeLabels { node: node.into() };
            m.gpus_total.get_or_create(&labels).set(8);
            m.gpus_allocated.get_or_create(&labels).set(2);
            m.gpus_unhealthy.get_or_create(&labels).set(0);
        }
        m.remove_node_gpus("n1");
        let text = m.encode();
        assert!(!text.contains("node=\"n1\""), "{text}");
        assert!(text.contains("muster_gpus{node=\"n2\"} 8"), "{text}");
        assert!(text.contains("muster_gpus_allocated{node=\"n2\"} 2"), "{text}");
    }
}

//! Prometheus metrics of the controller manager (`/metrics`, OpenMetrics text). One registry;
//! each reconciler records runs, errors by reason and duration through a drop-guard timer.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::crds::GPU_RESOURCE;
use crate::devices::GpuProblemKind;

/// Resources whose `Insufficient <resource>` reason keeps its own label value; any other
/// resource (a pod can request any name, e.g. `example.com/anything`) is counted as
/// [`INSUFFICIENT_OTHER`], so tenants cannot make series without end.
pub const KNOWN_RESOURCES: &[&str] = &["cpu", "memory", "ephemeral-storage", "pods", GPU_RESOURCE];
/// The reason of an `Insufficient` resource outside [`KNOWN_RESOURCES`].
pub const INSUFFICIENT_OTHER: &str = "Insufficient other";
/// The reason label of a reason that is not muster's own word, or one past [`MAX_REASONS`].
pub const OTHER_REASON: &str = "Other";
/// The most distinct reason label values one reason family takes; later new ones are
/// [`OTHER_REASON`] (muster names ~25 reasons).
pub const MAX_REASONS: usize = 64;
/// The longest reason label value muster makes itself.
const MAX_REASON_BYTES: usize = 40;

/// The label value for an unschedulable reason: muster's own reason words as they are,
/// `Insufficient <resource>` for a resource of [`KNOWN_RESOURCES`], [`INSUFFICIENT_OTHER`] for
/// another resource, [`OTHER_REASON`] for anything else (text that could come from a tenant).
pub fn reason_label(reason: &str) -> &str {
    if let Some(resource) = reason.strip_prefix("Insufficient ") {
        return if KNOWN_RESOURCES.contains(&resource) { reason } else { INSUFFICIENT_OTHER };
    }
    let word =
        !reason.is_empty() && reason.len() <= MAX_REASON_BYTES && reason.bytes().all(|b| b.is_ascii_alphabetic());
    if word { reason } else { OTHER_REASON }
}

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

/// Buckets for waits that include waiting for capacity: 5 ms doubling to 2.9 h (10,486 s).
fn histogram_wait_seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 22))
}

/// How an admission attempt ended (kube-scheduler's `scheduler_podgroup_schedule_attempts_total`
/// counts `scheduled`, `unschedulable` and `error` the same way).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum AttemptResult {
    /// The gang was committed whole (pinned and ungated).
    Admitted,
    /// It did not fit (or could not be placed now): it waits.
    Unschedulable,
    /// An API error or a refused write stopped the attempt.
    Error,
}

impl AttemptResult {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            AttemptResult::Admitted => "admitted",
            AttemptResult::Unschedulable => "unschedulable",
            AttemptResult::Error => "error",
        }
    }
}

/// Labels of an admission attempt.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AttemptLabels {
    /// `admitted`, `unschedulable` or `error`.
    pub result: String,
}

/// Labels naming a namespace.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NamespaceLabels {
    /// The namespace.
    pub namespace: String,
}

/// Labels of the build.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    /// muster's version.
    pub version: String,
}

/// The prefix of every metric name.
const PREFIX: &str = "muster";

/// Registers `metric` and records its family (name, type, help), so a scrape lists every
/// family muster exports, also one with no series yet (see [`Metrics::encode`]).
fn register<M>(registry: &mut Registry, families: &mut Vec<Described>, name: &str, help: &str, metric: M)
where
    M: prometheus_client::registry::Metric + prometheus_client::metrics::TypedMetric,
{
    families.push(Described {
        name: format!("{PREFIX}_{name}"),
        kind: M::TYPE.as_str().to_string(),
        help: help.into(),
    });
    registry.register(name, help, metric);
}

/// A metric family as registered.
#[derive(Clone, Debug)]
struct Described {
    name: String,
    kind: String,
    help: String,
}

/// Every metric muster exports.
pub struct Metrics {
    registry: Registry,
    families: Vec<Described>,
    /// Reconciles run, per controller.
    pub reconciles: Family<ControllerLabels, Counter>,
    /// Reconcile errors, per controller and reason.
    pub reconcile_errors: Family<ErrorLabels, Counter>,
    /// Reconcile duration, per controller.
    pub reconcile_duration: Family<ControllerLabels, Histogram, fn() -> Histogram>,
    /// Gangs (roots) quorate and waiting for admission.
    pub gangs_pending: Gauge,
    /// The same, per namespace (namespaces with none have no series).
    pub gangs_waiting: Family<NamespaceLabels, Gauge>,
    /// Admission attempts, by result.
    pub admission_attempts: Family<AttemptLabels, Counter>,
    /// 1, labelled with muster's version.
    pub build_info: Family<BuildLabels, Gauge>,
    /// Gangs admitted since start.
    pub gangs_admitted: Counter,
    /// Admission wake-ups with nothing to do (no event changed anything, no timer due).
    pub idle_cycles: Counter,
    /// Seconds from the start of a gang's wait (read from the cluster) to the last pod ungated.
    pub admission_latency: Histogram,
    /// Seconds one placement decision took.
    pub placement_duration: Histogram,
    /// Unschedulable admission attempts, by reason.
    pub unschedulable_attempts: Family<ReasonLabels, Counter>,
    /// Pins not bound within the bind timeout (the attempt rolled back, or the gang failed).
    pub bind_timeouts: Counter,
    /// Started gangs that lost pods and were restarted whole (disruption mode `all`).
    pub gang_disruptions: Counter,
    /// Preemptions started for a gang (its victims evicted).
    pub preemptions: Counter,
    /// Pods evicted as preemption victims.
    pub preemption_victims: Counter,
    /// Gang attempts rolled back after a failed pin (every pod deleted, recreated gated).
    pub gang_rollbacks: Counter,
    /// Of those, attempts rolled back because a device of their DRA claims was also allocated
    /// to another claim (muster and kube-scheduler wrote it at the same moment).
    pub dra_devices_lost: Counter,
    /// Errors met on one object (a refused pod patch, a failed status write), by kind and reason.
    pub object_errors: Family<ObjectErrorLabels, Counter>,
    /// GPU index conflicts seen (two live pods claiming one GPU).
    pub gpu_conflicts: Counter,
    /// Pods whose GPU indices were corrected to what kubelet gave them (read back by the node
    /// agent), muster having planned others.
    pub gpu_index_corrections: Counter,
    /// Events dropped because their writer's queue was full.
    pub events_dropped: Counter,
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
    /// Pods too large to keep whole once trimmed, kept by admission as a minimal record (each
    /// counted once, when first seen).
    pub pods_kept_minimal: Counter,
    /// The reason label values [`Self::unschedulable_attempts`] has (at most [`MAX_REASONS`]).
    reasons: Mutex<BTreeSet<String>>,
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
        let mut registry = Registry::with_prefix(PREFIX);
        let mut families = Vec::new();
        let m = Self {
            reconciles: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_duration: Family::new_with_constructor(histogram_seconds),
            gangs_pending: Gauge::default(),
            gangs_waiting: Family::default(),
            admission_attempts: Family::default(),
            build_info: Family::default(),
            gangs_admitted: Counter::default(),
            idle_cycles: Counter::default(),
            admission_latency: histogram_wait_seconds(),
            placement_duration: histogram_seconds(),
            unschedulable_attempts: Family::default(),
            bind_timeouts: Counter::default(),
            gang_disruptions: Counter::default(),
            preemptions: Counter::default(),
            preemption_victims: Counter::default(),
            gang_rollbacks: Counter::default(),
            dra_devices_lost: Counter::default(),
            object_errors: Family::default(),
            gpu_conflicts: Counter::default(),
            gpu_index_corrections: Counter::default(),
            events_dropped: Counter::default(),
            gpus_allocated: Family::default(),
            gpus_total: Family::default(),
            gpus_unhealthy: Family::default(),
            gpu_node_problems: Family::default(),
            device_patch_errors: Family::default(),
            webhook_requests: Family::default(),
            webhook_duration: Family::new_with_constructor(histogram_seconds),
            heap_bytes: Family::default(),
            scheduling_api: Family::default(),
            pods_kept_minimal: Counter::default(),
            reasons: Mutex::new(BTreeSet::new()),
            registry: Registry::default(),
            families: Vec::new(),
        };
        register(&mut registry, &mut families, "reconciles", "Reconciles run", m.reconciles.clone());
        register(
            &mut registry,
            &mut families,
            "scheduling_api",
            "1 for the scheduling API new MusterJobs compile to (muster or upstream) and the flag asked for",
            m.scheduling_api.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "reconcile_errors",
            "Reconcile errors by reason",
            m.reconcile_errors.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "reconcile_duration_seconds",
            "Reconcile duration",
            m.reconcile_duration.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "gangs_pending",
            "Quorate gangs waiting for admission",
            m.gangs_pending.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "gangs_waiting",
            "Quorate gangs waiting for admission, per namespace",
            m.gangs_waiting.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "admission_attempts",
            "Admission attempts of a quorate gang, by result (admitted, unschedulable, error)",
            m.admission_attempts.clone(),
        );
        register(&mut registry, &mut families, "build_info", "1, labelled with muster's version", m.build_info.clone());
        m.build_info.get_or_create(&BuildLabels { version: env!("CARGO_PKG_VERSION").to_string() }).set(1);
        register(&mut registry, &mut families, "gangs_admitted", "Gangs admitted", m.gangs_admitted.clone());
        register(
            &mut registry,
            &mut families,
            "admission_idle_wakeups",
            "Admission wake-ups skipped: no event changed anything and no timer was due",
            m.idle_cycles.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "admission_latency_seconds",
            "Seconds from the start of a gang's wait (its newest pod's creation, or its Admitted condition turning False, whichever is later) to the whole gang ungated",
            m.admission_latency.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "placement_duration_seconds",
            "Seconds per placement decision",
            m.placement_duration.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "unschedulable_attempts",
            "Admission attempts that did not fit, by reason",
            m.unschedulable_attempts.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "bind_timeouts",
            "Pins not bound within the bind timeout (the attempt rolled back, or a started gang failed)",
            m.bind_timeouts.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "gang_disruptions",
            "Started gangs that lost pods and were restarted whole (disruption mode all; event GangDisrupted)",
            m.gang_disruptions.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "preemptions",
            "Preemptions started for a gang that did not fit (its victims, of lower priority, evicted)",
            m.preemptions.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "preemption_victims",
            "Pods evicted as preemption victims (whole groups of disruption mode all, else pod by pod)",
            m.preemption_victims.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "gang_rollbacks",
            "Gang attempts rolled back (every pod deleted and recreated gated) after a pin failed",
            m.gang_rollbacks.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "dra_devices_lost",
            "Gang attempts rolled back because a device of their DRA claims was also allocated to another claim at the same moment",
            m.dra_devices_lost.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "admission_object_errors",
            "Errors admission met on one object (it is backed off alone; the others go on), by kind and reason",
            m.object_errors.clone(),
        );
        // Not prefixed twice: the GPU conflict metric is named as the GPU issue asks.
        register(
            &mut registry,
            &mut families,
            "gpu_conflicts",
            "GPU indices claimed by two live pods",
            m.gpu_conflicts.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "gpu_index_corrections",
            "Pods whose gpu.muster.dev/indices were corrected to the GPUs kubelet gave them",
            m.gpu_index_corrections.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "events_dropped",
            "Events not sent: muster reported them faster than its event writers could send them and their queue was full",
            m.events_dropped.clone(),
        );
        register(&mut registry, &mut families, "gpus_allocated", "GPUs allocated per node", m.gpus_allocated.clone());
        register(&mut registry, &mut families, "gpus", "GPUs per node", m.gpus_total.clone());
        register(
            &mut registry,
            &mut families,
            "gpus_unhealthy",
            "GPUs not offered because of health, per node",
            m.gpus_unhealthy.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "gpu_node_problems",
            "GPU problems per node and kind (topology annotation, metrics, health), 1 while present; see the node's events",
            m.gpu_node_problems.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "device_patch_errors",
            "GPU index annotations the API refused or failed to write onto a pod, by reason",
            m.device_patch_errors.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "webhook_requests",
            "Admission webhook requests",
            m.webhook_requests.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "webhook_duration_seconds",
            "Admission webhook request duration",
            m.webhook_duration.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "pods_kept_minimal",
            "Pods too large to keep whole once trimmed (over 64 KiB), kept by admission as a minimal record; see their PodTooLarge events",
            m.pods_kept_minimal.clone(),
        );
        register(
            &mut registry,
            &mut families,
            "heap_bytes",
            "The allocator's figures (jemalloc), bytes",
            m.heap_bytes.clone(),
        );
        Self { registry, families, ..m }
    }
}

impl Metrics {
    /// Every family registered, as (name, type, help): `muster_reconciles`, `counter`,
    /// `Reconciles run` (the reference of `muster docs reference` is made from it).
    pub fn families(&self) -> impl Iterator<Item = (&str, &str, &str)> {
        self.families.iter().map(|f| (f.name.as_str(), f.kind.as_str(), f.help.as_str()))
    }

    /// The registry as OpenMetrics text. A labelled family with no series yet (no GPU node
    /// seen, no webhook request refused) is listed all the same, by its `# HELP` and `# TYPE`
    /// lines (OpenMetrics allows a family of no metrics), so dashboards and alert rules can be
    /// checked against a scrape of any muster.
    pub fn encode(&self) -> String {
        self.read_heap();
        let mut out = String::new();
        // Encoding into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        let empty: String = self
            .families
            .iter()
            .filter(|f| !out.contains(&format!("# TYPE {} ", f.name)))
            .map(|f| format!("# HELP {} {}.\n# TYPE {} {}\n", f.name, f.help, f.name, f.kind))
            .collect();
        if !empty.is_empty() {
            match out.rfind("# EOF") {
                Some(at) => out.insert_str(at, &empty),
                None => out.push_str(&empty),
            }
        }
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

    /// Counts an unschedulable admission attempt under its reason's label value
    /// ([`reason_label`]); once the family has [`MAX_REASONS`] values, a new one counts as
    /// [`OTHER_REASON`].
    pub fn unschedulable(&self, reason: &str) {
        let mut label = reason_label(reason);
        {
            let mut seen = match self.reasons.lock() {
                Ok(guard) => guard,
                Err(poisoned) => poisoned.into_inner(),
            };
            if !seen.contains(label) {
                if seen.len() >= MAX_REASONS - 1 && label != OTHER_REASON {
                    label = OTHER_REASON;
                }
                seen.insert(label.to_string());
            }
        }
        self.unschedulable_attempts.get_or_create(&ReasonLabels { reason: label.to_string() }).inc();
    }

    /// Counts an admission attempt.
    pub fn attempt(&self, result: AttemptResult) {
        self.admission_attempts.get_or_create(&AttemptLabels { result: result.label().to_string() }).inc();
    }

    /// Sets the waiting gangs: the total and, per namespace, those given (a namespace left out
    /// loses its series).
    pub fn set_gangs_waiting(&self, by_namespace: &std::collections::BTreeMap<String, i64>) {
        self.gangs_pending.set(by_namespace.values().sum());
        self.gangs_waiting.clear();
        for (namespace, n) in by_namespace {
            self.gangs_waiting.get_or_create(&NamespaceLabels { namespace: namespace.clone() }).set(*n);
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
    fn a_scrape_lists_every_family_also_one_with_no_series_yet() {
        let m = Metrics::default();
        let text = m.encode();
        for family in [
            "# TYPE muster_gpus_allocated gauge",
            "# TYPE muster_admission_attempts counter",
            "# TYPE muster_unschedulable_attempts counter",
            "# TYPE muster_webhook_duration_seconds histogram",
            "# TYPE muster_gangs_waiting gauge",
        ] {
            assert_eq!(text.matches(family).count(), 1, "{family}: {text}");
        }
        assert!(text.contains("# HELP muster_gpus_allocated GPUs allocated per node."), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
        // Once a series exists, the family is listed once, by the encoder.
        m.gpus_allocated.get_or_create(&NodeLabels { node: "n1".into() }).set(3);
        let text = m.encode();
        assert_eq!(text.matches("# TYPE muster_gpus_allocated gauge").count(), 1, "{text}");
        assert!(text.contains("muster_gpus_allocated{node=\"n1\"} 3"), "{text}");
    }

    #[test]
    fn attempts_waits_and_the_build_are_exported_like_kube_schedulers() {
        let m = Metrics::default();
        m.attempt(AttemptResult::Admitted);
        m.attempt(AttemptResult::Unschedulable);
        m.attempt(AttemptResult::Unschedulable);
        m.set_gangs_waiting(&[("a".to_string(), 2), ("b".to_string(), 1)].into());
        m.set_gangs_waiting(&[("b".to_string(), 3)].into());
        m.admission_latency.observe(2.5 * 3600.0);
        let text = m.encode();
        assert!(text.contains("muster_admission_attempts_total{result=\"admitted\"} 1"), "{text}");
        assert!(text.contains("muster_admission_attempts_total{result=\"unschedulable\"} 2"), "{text}");
        assert!(!text.contains("result=\"error\""), "no error yet: {text}");
        assert!(text.contains("muster_gangs_pending 3"), "{text}");
        assert!(text.contains("muster_gangs_waiting{namespace=\"b\"} 3"), "{text}");
        assert!(!text.contains("namespace=\"a\""), "a namespace with none waiting has no series: {text}");
        let version = env!("CARGO_PKG_VERSION");
        assert!(text.contains(&format!("muster_build_info{{version=\"{version}\"}} 1")), "{text}");
        // A wait of 2.5 h lands in a bucket, not in +Inf.
        let finite = text
            .lines()
            .filter(|l| l.starts_with("muster_admission_latency_seconds_bucket") && !l.contains("+Inf"))
            .filter(|l| l.ends_with(" 1"))
            .count();
        assert!(finite >= 1, "{text}");
    }

    #[test]
    fn unschedulable_reasons_a_tenant_makes_stay_a_bounded_set_of_series() {
        let m = Metrics::default();
        // muster's own reasons and the known resources keep their label values.
        for reason in ["Insufficient nvidia.com/gpu", "Insufficient cpu", "TooFewPods", "PlanTooLarge", "NodeAffinity"]
        {
            m.unschedulable(reason);
        }
        // A tenant's pods request resources of any name, 10,000 of them.
        for i in 0..10_000 {
            m.unschedulable(&format!("Insufficient example.com/tenant-{i}"));
        }
        // Free text (none is made today) is never a label value.
        for i in 0..10_000 {
            m.unschedulable(&format!("pod {i} said: no"));
        }
        let text = m.encode();
        let series: Vec<&str> =
            text.lines().filter(|l| l.starts_with("muster_unschedulable_attempts_total{")).collect();
        assert_eq!(series.len(), 7, "{series:?}");
        for (reason, n) in [
            ("Insufficient nvidia.com/gpu", 1),
            ("Insufficient cpu", 1),
            ("TooFewPods", 1),
            ("PlanTooLarge", 1),
            ("NodeAffinity", 1),
            (INSUFFICIENT_OTHER, 10_000),
            (OTHER_REASON, 10_000),
        ] {
            let line = format!("muster_unschedulable_attempts_total{{reason=\"{reason}\"}} {n}");
            assert!(series.contains(&line.as_str()), "{line}: {series:?}");
        }
        assert!(!text.contains("example.com"), "{text}");
    }

    #[test]
    fn reason_words_past_the_cap_count_as_other() {
        let m = Metrics::default();
        let letters: Vec<char> = ('A'..='Z').collect();
        let words: Vec<String> =
            letters.iter().flat_map(|a| letters.iter().map(move |b| format!("Reason{a}{b}"))).take(200).collect();
        for w in &words {
            m.unschedulable(w);
        }
        // Again: a value already counted keeps its own series.
        m.unschedulable(&words[0]);
        let text = m.encode();
        let series = text.lines().filter(|l| l.starts_with("muster_unschedulable_attempts_total{")).count();
        assert_eq!(series, MAX_REASONS, "{text}");
        let first = format!("muster_unschedulable_attempts_total{{reason=\"{}\"}} 2", words[0]);
        assert!(text.contains(&first), "{text}");
        assert!(text.contains("muster_unschedulable_attempts_total{reason=\"Other\"}"), "{text}");
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

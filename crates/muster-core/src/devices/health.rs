//! Live GPU health: per-GPU metrics, the thresholds that keep a hot or memory-starved GPU from
//! being offered, and a TTL cache in front of a [`MetricsSource`]. Evaluation is pure (time is
//! a parameter); fetching (Prometheus over DCGM exporter) is the shell's, behind the trait.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::time::{Duration, SystemTime};

use super::gpuset::GpuSet;
use super::problem::{GpuProblem, GpuProblemKind};
use super::topology::GpuTopology;

/// One GPU's metrics at one instant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuMetrics {
    /// Temperature in °C (`DCGM_FI_DEV_GPU_TEMP`).
    pub temperature_c: f64,
    /// Free memory over total memory, 0..=1 (`FB_FREE / (FB_FREE + FB_USED)`).
    pub memory_free_fraction: f64,
    /// Utilization, 0..=1 (`DCGM_FI_DEV_GPU_UTIL / 100`).
    pub utilization: f64,
    /// When the sample was taken.
    pub observed_at: SystemTime,
}

/// Metrics of the GPUs of one node, by GPU index.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeMetrics {
    /// Samples by GPU index; GPUs without a sample are simply absent.
    pub gpus: BTreeMap<u32, GpuMetrics>,
}

/// Metrics of every node a source knows, by node name.
pub type ClusterMetrics = BTreeMap<String, NodeMetrics>;

/// When a GPU is too unhealthy to offer, and when a sample is too old to believe.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HealthThresholds {
    /// A GPU hotter than this (°C) is not offered.
    pub max_temperature_c: f64,
    /// A GPU with less free memory than this fraction is not offered.
    pub min_free_memory_fraction: f64,
    /// A sample older than this is stale: reported and ignored.
    pub max_age: Duration,
}

impl Default for HealthThresholds {
    fn default() -> Self {
        HealthThresholds { max_temperature_c: 80.0, min_free_memory_fraction: 0.3, max_age: Duration::from_secs(60) }
    }
}

/// Something health evaluation noticed about a node's GPUs.
#[derive(Clone, Debug, PartialEq)]
pub enum HealthReason {
    /// No metrics for the node at all; every GPU is offered.
    NoMetrics,
    /// No sample for this GPU; it is offered.
    Missing {
        /// GPU index.
        index: usize,
    },
    /// The sample is older than `max_age`; it is ignored and the GPU offered.
    Stale {
        /// GPU index.
        index: usize,
        /// How old the sample is.
        age: Duration,
    },
    /// The sample has non-finite or out-of-range values; it is ignored and the GPU offered.
    Invalid {
        /// GPU index.
        index: usize,
    },
    /// A sample for a GPU the node's model does not have.
    UnknownGpu {
        /// GPU index in the metrics.
        index: u32,
    },
    /// Hotter than allowed: not offered.
    Hot {
        /// GPU index.
        index: usize,
        /// Measured temperature (°C).
        temperature_c: f64,
        /// The threshold (°C).
        max: f64,
    },
    /// Less free memory than allowed: not offered.
    LowFreeMemory {
        /// GPU index.
        index: usize,
        /// Measured free fraction.
        fraction: f64,
        /// The threshold.
        min: f64,
    },
}

impl HealthReason {
    /// Whether this reason keeps a GPU from being offered (the others are informational).
    pub fn excludes_gpu(&self) -> bool {
        matches!(self, HealthReason::Hot { .. } | HealthReason::LowFreeMemory { .. })
    }
}

impl fmt::Display for HealthReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HealthReason::NoMetrics => {
                write!(f, "no GPU metrics for this node; health not checked")
            }
            HealthReason::Missing { index } => {
                write!(f, "GPU {index}: no metrics; health not checked")
            }
            HealthReason::Stale { index, age } => {
                write!(f, "GPU {index}: metrics {}s old, ignored", age.as_secs())
            }
            HealthReason::Invalid { index } => {
                write!(f, "GPU {index}: metrics out of range, ignored")
            }
            HealthReason::UnknownGpu { index } => {
                write!(f, "metrics for GPU {index}, which the node does not have")
            }
            HealthReason::Hot { index, temperature_c, max } => {
                write!(f, "GPU {index}: {temperature_c:.1} C exceeds {max:.1} C, not offered")
            }
            HealthReason::LowFreeMemory { index, fraction, min } => {
                write!(f, "GPU {index}: {:.0}% memory free, below {:.0}%, not offered", fraction * 100.0, min * 100.0)
            }
        }
    }
}

/// The health verdict for one node's GPUs.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeHealth {
    /// GPUs that may be offered (every GPU of the model minus the hot and memory-starved).
    pub healthy: GpuSet,
    /// Everything noticed, excluding and informational alike.
    pub reasons: Vec<HealthReason>,
    /// Utilization (0..=1) of each GPU by index, where a fresh valid sample exists.
    pub utilization: Vec<Option<f64>>,
}

fn valid(m: &GpuMetrics) -> bool {
    let unit = |x: f64| (0.0..=1.0).contains(&x);
    m.temperature_c.is_finite() && unit(m.memory_free_fraction) && unit(m.utilization)
}

/// PURE: until when [`healthy_mask`] of `model` over `samples` stays what it is at `now`: the
/// soonest a fresh sample goes stale; `now` itself when a sample is stale already (its reason
/// states its age, which grows); `None` when no sample can change it.
pub fn fresh_until(
    model: &GpuTopology,
    samples: &NodeMetrics,
    thresholds: &HealthThresholds,
    now: SystemTime,
) -> Option<SystemTime> {
    (0..model.len())
        .filter_map(|i| samples.gpus.get(&u32::try_from(i).ok()?))
        .map(|m| m.observed_at.checked_add(thresholds.max_age).map_or(now, |t| t.max(now)))
        .min()
}

/// Which GPUs of `model` are healthy enough to offer at `now`, and why the others are not.
///
/// Missing, stale or invalid samples never exclude a GPU: they are reported and ignored, so a
/// metrics outage degrades to topology-only scheduling instead of stopping it. A sample from
/// the future (clock skew) counts as fresh.
pub fn healthy_mask(
    model: &GpuTopology,
    metrics: Option<&NodeMetrics>,
    thresholds: &HealthThresholds,
    now: SystemTime,
) -> NodeHealth {
    let n = model.len();
    let mut health = NodeHealth { healthy: model.all(), reasons: Vec::new(), utilization: vec![None; n] };
    let Some(metrics) = metrics else {
        if n > 0 {
            health.reasons.push(HealthReason::NoMetrics);
        }
        return health;
    };
    for index in 0..n {
        let Some(m) = u32::try_from(index).ok().and_then(|i| metrics.gpus.get(&i)) else {
            health.reasons.push(HealthReason::Missing { index });
            continue;
        };
        let age = now.duration_since(m.observed_at).unwrap_or(Duration::ZERO);
        if age > thresholds.max_age {
            health.reasons.push(HealthReason::Stale { index, age });
            continue;
        }
        if !valid(m) {
            health.reasons.push(HealthReason::Invalid { index });
            continue;
        }
        health.utilization[index] = Some(m.utilization);
        let mut exclude = false;
        if m.temperature_c > thresholds.max_temperature_c {
            health.reasons.push(HealthReason::Hot {
                index,
                temperature_c: m.temperature_c,
                max: thresholds.max_temperature_c,
            });
            exclude = true;
        }
        if m.memory_free_fraction < thresholds.min_free_memory_fraction {
            health.reasons.push(HealthReason::LowFreeMemory {
                index,
                fraction: m.memory_free_fraction,
                min: thresholds.min_free_memory_fraction,
            });
            exclude = true;
        }
        if exclude && let Some(bit) = GpuSet::single(index) {
            health.healthy = health.healthy.difference(bit);
        }
    }
    for &index in metrics.gpus.keys().filter(|&&i| i as usize >= n) {
        health.reasons.push(HealthReason::UnknownGpu { index });
    }
    health
}

impl NodeHealth {
    /// What is worth telling an operator, one problem per kind with the GPUs it concerns:
    /// stable while the situation is (no measured values, no ages), so a report can be made
    /// when it changes rather than every cycle. Without `metrics_expected` (no metrics source
    /// configured), missing metrics are not a problem.
    pub fn problems(&self, metrics_expected: bool) -> Vec<GpuProblem> {
        let mut by_kind: BTreeMap<GpuProblemKind, (&str, Vec<String>)> = BTreeMap::new();
        for reason in &self.reasons {
            let (kind, line, index) = match reason {
                HealthReason::NoMetrics if metrics_expected => {
                    (GpuProblemKind::MetricsMissing, "no GPU metrics for this node; health not checked", None)
                }
                HealthReason::Missing { index } if metrics_expected => {
                    (GpuProblemKind::MetricsMissing, "no metrics, health not checked, for GPU", Some(*index as u64))
                }
                HealthReason::NoMetrics | HealthReason::Missing { .. } => continue,
                HealthReason::Stale { index, .. } => {
                    (GpuProblemKind::MetricsStale, "stale metrics ignored for GPU", Some(*index as u64))
                }
                HealthReason::Invalid { index } => {
                    (GpuProblemKind::MetricsInvalid, "out-of-range metrics ignored for GPU", Some(*index as u64))
                }
                HealthReason::UnknownGpu { index } => (
                    GpuProblemKind::MetricsUnknownGpu,
                    "metrics for GPUs the node does not have:",
                    Some(u64::from(*index)),
                ),
                HealthReason::Hot { index, .. } => {
                    (GpuProblemKind::TooHot, "too hot, not offered: GPU", Some(*index as u64))
                }
                HealthReason::LowFreeMemory { index, .. } => {
                    (GpuProblemKind::MemoryFull, "too little free memory, not offered: GPU", Some(*index as u64))
                }
            };
            let (_, gpus) = by_kind.entry(kind).or_insert((line, Vec::new()));
            if let Some(i) = index {
                gpus.push(i.to_string());
            }
        }
        by_kind
            .into_iter()
            .map(|(kind, (line, gpus))| GpuProblem {
                kind,
                message: if gpus.is_empty() { line.to_string() } else { format!("{line} {}", gpus.join(",")) },
            })
            .collect()
    }
}

/// A metrics query that failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("GPU metrics query failed: {0}")]
pub struct MetricsError(pub String);

/// Where GPU metrics come from (Prometheus scraping DCGM exporter, or a fake in tests).
pub trait MetricsSource {
    /// Metrics of every node the source knows, as of now.
    fn snapshot(&self) -> impl Future<Output = Result<ClusterMetrics, MetricsError>> + Send;
}

/// The last snapshot of a [`MetricsSource`], refreshed at most once per TTL.
#[derive(Clone, Debug)]
pub struct MetricsCache {
    ttl: Duration,
    fetched_at: Option<SystemTime>,
    snapshot: ClusterMetrics,
    last_error: Option<MetricsError>,
}

impl Default for MetricsCache {
    fn default() -> Self {
        MetricsCache::new(MetricsCache::DEFAULT_TTL)
    }
}

impl MetricsCache {
    /// How long a snapshot is used before the source is asked again.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(10);

    /// An empty cache with the given TTL.
    pub fn new(ttl: Duration) -> Self {
        MetricsCache { ttl, fetched_at: None, snapshot: ClusterMetrics::new(), last_error: None }
    }

    /// Whether the last fetch (successful or not) is younger than the TTL at `now`.
    /// A fetch time after `now` means the clock went back: refetch rather than trust it.
    pub fn is_fresh(&self, now: SystemTime) -> bool {
        self.fetched_at.and_then(|t| now.duration_since(t).ok()).is_some_and(|age| age < self.ttl)
    }

    /// Records the result of a fetch made at `now`.
    ///
    /// A failure keeps the previous snapshot (its samples age out through `max_age`) and still
    /// counts as a fetch, so a broken source is asked at most once per TTL.
    pub fn store(&mut self, result: Result<ClusterMetrics, MetricsError>, now: SystemTime) {
        self.fetched_at = Some(now);
        match result {
            Ok(snapshot) => {
                self.snapshot = snapshot;
                self.last_error = None;
            }
            Err(e) => self.last_error = Some(e),
        }
    }

    /// Asks `source` for a new snapshot unless the cache is fresh; returns whether it asked.
    pub async fn refresh<S: MetricsSource>(&mut self, source: &S, now: SystemTime) -> bool {
        if self.is_fresh(now) {
            return false;
        }
        let result = source.snapshot().await;
        self.store(result, now);
        true
    }

    /// The cached metrics of `node`, if the last snapshot had any.
    pub fn node(&self, node: &str) -> Option<&NodeMetrics> {
        self.snapshot.get(node)
    }

    /// The error of the last fetch, if it failed.
    pub fn last_error(&self) -> Option<&MetricsError> {
        self.last_error.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const T0: Duration = Duration::from_secs(1_700_000_000);

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + T0 + Duration::from_secs(secs)
    }

    fn sample(temperature_c: f64, memory_free_fraction: f64, observed: u64) -> GpuMetrics {
        GpuMetrics { temperature_c, memory_free_fraction, utilization: 0.25, observed_at: at(observed) }
    }

    fn node(samples: &[(u32, GpuMetrics)]) -> NodeMetrics {
        NodeMetrics { gpus: samples.iter().copied().collect() }
    }

    fn check(model: &GpuTopology, metrics: Option<&NodeMetrics>, now: u64) -> NodeHealth {
        healthy_mask(model, metrics, &HealthThresholds::default(), at(now))
    }

    #[test]
    fn problems_are_grouped_by_kind_and_stable_while_the_situation_is() {
        let model = GpuTopology::unknown(4);
        let m = node(&[
            (0, sample(95.0, 0.9, 100)),
            (1, sample(60.0, 0.1, 100)),
            (2, sample(60.0, 0.9, 10)),
            (7, sample(60.0, 0.9, 100)),
        ]);
        let later = check(&model, Some(&m), 120).problems(true);
        let shown: Vec<(GpuProblemKind, &str)> = later.iter().map(|p| (p.kind, p.message.as_str())).collect();
        assert_eq!(
            shown,
            [
                (GpuProblemKind::MetricsMissing, "no metrics, health not checked, for GPU 3"),
                (GpuProblemKind::MetricsStale, "stale metrics ignored for GPU 2"),
                (GpuProblemKind::MetricsUnknownGpu, "metrics for GPUs the node does not have: 7"),
                (GpuProblemKind::TooHot, "too hot, not offered: GPU 0"),
                (GpuProblemKind::MemoryFull, "too little free memory, not offered: GPU 1"),
            ]
        );
        // Ten seconds on, the stale sample is older but the report is the same.
        assert_eq!(check(&model, Some(&m), 130).problems(true), later);
        // Without a metrics source, absent metrics are expected.
        assert!(check(&model, None, 120).problems(false).is_empty());
        let none = check(&model, None, 120).problems(true);
        assert_eq!(
            none,
            [GpuProblem {
                kind: GpuProblemKind::MetricsMissing,
                message: "no GPU metrics for this node; health not checked".into()
            }]
        );
    }

    #[test]
    fn healthy_gpus_are_all_offered() {
        let model = GpuTopology::unknown(2);
        let m = node(&[(0, sample(60.0, 0.9, 100)), (1, sample(80.0, 0.3, 100))]);
        let h = check(&model, Some(&m), 105);
        assert_eq!(h.healthy, GpuSet::first(2), "80 C and 30% are on the allowed side");
        assert!(h.reasons.is_empty(), "{:?}", h.reasons);
        assert_eq!(h.utilization, vec![Some(0.25), Some(0.25)]);
    }

    #[test]
    fn hot_gpu_is_not_offered_but_the_rest_are() {
        let model = GpuTopology::unknown(3);
        let m = node(&[(0, sample(60.0, 0.9, 100)), (1, sample(85.5, 0.9, 100)), (2, sample(60.0, 0.9, 100))]);
        let h = check(&model, Some(&m), 100);
        assert_eq!(h.healthy, GpuSet::from_bits(0b101));
        assert!(matches!(h.reasons[..], [HealthReason::Hot { index: 1, .. }]));
        assert!(h.reasons[0].excludes_gpu());
        assert!(h.reasons[0].to_string().contains("85.5 C exceeds 80.0 C"));
    }

    #[test]
    fn gpu_with_little_free_memory_is_not_offered() {
        let model = GpuTopology::unknown(2);
        let m = node(&[(0, sample(40.0, 0.29, 100)), (1, sample(40.0, 0.9, 100))]);
        let h = check(&model, Some(&m), 100);
        assert_eq!(h.healthy, GpuSet::from_bits(0b10));
        assert!(matches!(h.reasons[..], [HealthReason::LowFreeMemory { index: 0, .. }]));
    }

    #[test]
    fn stale_metrics_are_reported_and_ignored() {
        let model = GpuTopology::unknown(1);
        let m = node(&[(0, sample(99.0, 0.0, 100))]);
        let h = check(&model, Some(&m), 161);
        assert_eq!(h.healthy, GpuSet::first(1));
        assert!(matches!(h.reasons[..], [HealthReason::Stale { index: 0, .. }]));
        assert!(!h.reasons[0].excludes_gpu());
        assert_eq!(h.utilization, vec![None]);
        // Exactly max_age old still counts.
        assert_eq!(check(&model, Some(&m), 160).healthy, GpuSet::EMPTY);
    }

    #[test]
    fn missing_metrics_never_block() {
        let model = GpuTopology::unknown(2);
        let h = check(&model, None, 0);
        assert_eq!((h.healthy, h.reasons), (GpuSet::first(2), vec![HealthReason::NoMetrics]));
        let partial = node(&[(1, sample(50.0, 0.9, 0))]);
        let h = check(&model, Some(&partial), 0);
        assert_eq!((h.healthy, h.reasons), (GpuSet::first(2), vec![HealthReason::Missing { index: 0 }]));
    }

    #[test]
    fn invalid_samples_are_ignored_and_unknown_gpus_reported() {
        let model = GpuTopology::unknown(2);
        let m = node(&[(0, sample(f64::NAN, 0.1, 0)), (1, sample(50.0, 1.5, 0)), (7, sample(99.0, 0.0, 0))]);
        let h = check(&model, Some(&m), 0);
        assert_eq!(h.healthy, GpuSet::first(2));
        assert_eq!(
            h.reasons,
            vec![
                HealthReason::Invalid { index: 0 },
                HealthReason::Invalid { index: 1 },
                HealthReason::UnknownGpu { index: 7 }
            ]
        );
    }

    #[test]
    fn samples_from_the_future_count_as_fresh() {
        let model = GpuTopology::unknown(1);
        let m = node(&[(0, sample(95.0, 0.9, 500))]);
        assert_eq!(check(&model, Some(&m), 100).healthy, GpuSet::EMPTY);
    }

    struct Fake {
        calls: AtomicUsize,
        fail: bool,
    }

    impl MetricsSource for Fake {
        fn snapshot(&self) -> impl Future<Output = Result<ClusterMetrics, MetricsError>> + Send {
            let call = self.calls.fetch_add(1, Ordering::SeqCst);
            let fail = self.fail;
            async move {
                if fail {
                    return Err(MetricsError("connection refused".into()));
                }
                let mut all = ClusterMetrics::new();
                all.insert("n1".into(), node(&[(0, sample(50.0 + call as f64, 0.9, 0))]));
                Ok(all)
            }
        }
    }

    #[test]
    fn cache_asks_the_source_once_per_ttl() {
        let source = Fake { calls: AtomicUsize::new(0), fail: false };
        let mut cache = MetricsCache::default();
        assert!(futures::executor::block_on(cache.refresh(&source, at(0))));
        assert!(!futures::executor::block_on(cache.refresh(&source, at(9))));
        assert_eq!(cache.node("n1").and_then(|m| m.gpus.get(&0)).map(|g| g.temperature_c), Some(50.0));
        assert!(futures::executor::block_on(cache.refresh(&source, at(10))));
        assert_eq!(cache.node("n1").and_then(|m| m.gpus.get(&0)).map(|g| g.temperature_c), Some(51.0));
        assert_eq!(source.calls.load(Ordering::SeqCst), 2);
        // The clock went back: refetch.
        assert!(futures::executor::block_on(cache.refresh(&source, at(5))));
    }

    #[test]
    fn failed_fetch_keeps_the_old_snapshot_and_waits_a_ttl() {
        let mut cache = MetricsCache::new(Duration::from_secs(10));
        let good = Fake { calls: AtomicUsize::new(0), fail: false };
        let bad = Fake { calls: AtomicUsize::new(0), fail: true };
        futures::executor::block_on(cache.refresh(&good, at(0)));
        assert!(futures::executor::block_on(cache.refresh(&bad, at(10))));
        assert!(cache.last_error().is_some());
        assert!(cache.node("n1").is_some());
        assert!(!futures::executor::block_on(cache.refresh(&bad, at(15))));
        assert_eq!(bad.calls.load(Ordering::SeqCst), 1);
    }
}

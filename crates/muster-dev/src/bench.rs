//! `muster dev bench`: the side-by-side scale harness of `make bench-e2e` (hack/bench-e2e.sh).
//! On one cluster with kwok GPU nodes it creates the same gangs three ways (plain batch/v1 Jobs,
//! Jobs with upstream gang scheduling, MusterJobs), one path after the other, and measures from
//! the client side, with one pod watch per namespace, when each pod was first seen, ungated and
//! bound. The arithmetic (rates, percentiles, per-gang admission latency, the table, the /proc
//! and /metrics parsers) is pure and sits above the shell that talks to the cluster.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde::Serialize;
use serde_json::{Value, json};

use super::{FakeGpuNodes, add_nodes, client};
use muster_api::{ADMISSION_GATE, GPU_RESOURCE, MusterJob};

/// Label on every node the bench creates (the Ready wait lists by it).
pub const BENCH_NODE_LABEL: &str = "bench.muster.dev/node";
/// Label on every pod template the bench creates.
pub const BENCH_POD_LABEL: &str = "bench.muster.dev/pod";
/// The admission controller's series of `muster_reconciles_total`: one per admission cycle.
const CYCLES_METRIC: &str = "muster_reconciles_total";
const CYCLES_LABEL: &str = "controller=\"admission\"";
const HEAP_METRIC: &str = "muster_heap_bytes";
/// USER_HZ: the unit of utime/stime in /proc/<pid>/stat (100 on every Linux muster targets).
const CLOCK_TICKS_PER_S: f64 = 100.0;
const RSS_SAMPLE_EVERY: Duration = Duration::from_millis(200);
const GPUS_PER_NODE: u32 = 8;

/// Arguments of `muster dev bench`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Kubeconfig to use (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// kwok GPU nodes to create (8 GPUs each) before the paths run.
    #[arg(long, default_value_t = 1000)]
    nodes: u32,
    /// Gangs per path.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
    gangs: u32,
    /// Pods per gang (one GPU each); parallelism = completions = minCount.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    size: u32,
    /// Paths to run, in this order (comma separated): plain, gang, muster.
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["plain", "gang", "muster", "muster-upstream"])]
    paths: Vec<BenchPath>,
    /// muster's pid: peak RSS and CPU seconds during the muster path (from /proc).
    #[arg(long)]
    muster_pid: Option<u32>,
    /// muster's metrics URL (`http://host:port/metrics`): admission cycles during the muster path.
    #[arg(long)]
    muster_metrics_url: Option<String>,
    /// Creates (and node creates) in flight at once.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    concurrency: u32,
    /// Gangs created per second in each path (0: as fast as --concurrency allows). A low rate
    /// measures admission latency on a cluster that is not saturated.
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Seconds a path (and the wait for Ready nodes) may take before it counts as timed out.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// Write every number as JSON to this file.
    #[arg(long)]
    json_out: Option<PathBuf>,
    /// Name prefix of the nodes the bench creates.
    #[arg(long, default_value = "bench-gpu-")]
    node_prefix: String,
}

/// How a path's gangs are created.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum BenchPath {
    /// batch/v1 Jobs, no gang: kube-scheduler alone.
    Plain,
    /// batch/v1 Jobs with `spec.scheduling.schedulingPolicy.gang` (upstream gang scheduling).
    Gang,
    /// MusterJobs with a gang of minCount = size.
    Muster,
    /// The same MusterJobs in upstream mode (`batch.muster.dev/scheduling-api: upstream`): muster
    /// compiles the native Workload and PodGroup, kube-scheduler admits the gang.
    #[value(name = "muster-upstream")]
    #[serde(rename = "muster-upstream")]
    MusterUpstream,
}

impl BenchPath {
    /// The path's name, as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            BenchPath::Plain => "plain",
            BenchPath::Gang => "gang",
            BenchPath::Muster => "muster",
            BenchPath::MusterUpstream => "muster-upstream",
        }
    }

    /// The namespace the path's objects live in.
    pub fn namespace(self) -> String {
        format!("bench-{}", self.name())
    }
}

// === The pure part ===

/// What the pod watch saw of one pod, in seconds since its path started.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PodTimes {
    /// The gang (the name of the pod's controlling Job or MusterJob).
    pub gang: String,
    /// First seen by the watch.
    pub first_seen: f64,
    /// First seen without muster's admission gate (at first sight for pods never gated).
    pub ungated: Option<f64>,
    /// First seen with `spec.nodeName` set.
    pub bound: Option<f64>,
}

/// PURE: the nearest-rank `p`-th percentile (0 < p <= 100) of `values`, in any order: the
/// smallest value that at least p% of the values do not exceed. None when there are none.
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// PURE: per gang that has `size` pods and all of them ungated, the admission latency: from
/// the time its last pod was first seen (the gang became complete) to the time its last pod
/// was seen ungated. Gangs still incomplete or gated are left out. In gang-name order.
pub fn gang_admission_latencies(pods: &[PodTimes], size: usize) -> Vec<f64> {
    let mut gangs: BTreeMap<&str, Vec<&PodTimes>> = BTreeMap::new();
    for p in pods {
        gangs.entry(p.gang.as_str()).or_default().push(p);
    }
    gangs
        .values()
        .filter(|members| members.len() >= size && members.iter().all(|p| p.ungated.is_some()))
        .map(|members| {
            let complete = members.iter().map(|p| p.first_seen).fold(f64::NEG_INFINITY, f64::max);
            let admitted = members.iter().filter_map(|p| p.ungated).fold(f64::NEG_INFINITY, f64::max);
            admitted - complete
        })
        .collect()
}

/// How fast a path's pods were bound.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Throughput {
    /// Pods seen bound.
    pub pods_bound: usize,
    /// The first bind, in seconds since the path started.
    pub first_bind_s: Option<f64>,
    /// The last bind, in seconds since the path started.
    pub last_bind_s: Option<f64>,
    /// Pods bound / (last bind - first create).
    pub bound_per_s: Option<f64>,
    /// Seconds from the last create to the last bind.
    pub last_create_to_last_bind_s: Option<f64>,
}

/// PURE: the throughput of `pods`, whose path made its first create at `first_create` and its
/// last at `last_create` (seconds since the path started).
pub fn throughput(pods: &[PodTimes], first_create: f64, last_create: Option<f64>) -> Throughput {
    let binds: Vec<f64> = pods.iter().filter_map(|p| p.bound).collect();
    let first_bind_s = binds.iter().copied().reduce(f64::min);
    let last_bind_s = binds.iter().copied().reduce(f64::max);
    let bound_per_s =
        last_bind_s.map(|last| last - first_create).filter(|span| *span > 0.0).map(|span| binds.len() as f64 / span);
    let last_create_to_last_bind_s = last_bind_s.zip(last_create).map(|(bind, create)| bind - create);
    Throughput { pods_bound: binds.len(), first_bind_s, last_bind_s, bound_per_s, last_create_to_last_bind_s }
}

/// PURE: one line per path whose `rows` are not empty, after a blank line: `<path> path:
/// <head of the rows' total>: <the first 8 rows>` (the rows come largest first).
fn top_lines<T>(
    out: &mut String,
    report: &Report,
    rows: impl Fn(&PathReport) -> &[T],
    value: impl Fn(&T) -> f64,
    item: impl Fn(&PathReport, &T) -> String,
    head: impl Fn(&PathReport, f64) -> String,
) {
    for p in report.paths.iter().filter(|p| !rows(p).is_empty()) {
        let total: f64 = rows(p).iter().map(&value).sum();
        let top: Vec<String> = rows(p).iter().take(8).map(|r| item(p, r)).collect();
        let path = p.path.map_or("?", BenchPath::name);
        out.push_str(&format!("\n{path} path: {}: {}", head(p, total), top.join(", ")));
    }
}

/// PURE: `rate` as a multiple of the plain path's rate.
pub fn ratio(rate: Option<f64>, plain: Option<f64>) -> Option<f64> {
    rate.zip(plain.filter(|p| *p > 0.0)).map(|(r, p)| r / p)
}

/// PURE: a `kB` field (`VmRSS`, `VmHWM`) of /proc/<pid>/status, in KiB.
pub fn status_kib(status: &str, field: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// PURE: utime + stime (clock ticks) from /proc/<pid>/stat. The command name in parentheses
/// may hold spaces, so the fields are counted after its closing parenthesis.
pub fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // Fields 3.. of proc(5) follow; utime and stime are fields 14 and 15.
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// PURE: the command name of a /proc/<pid>/stat line (between the first `(` and the last `)`).
pub fn stat_command(stat: &str) -> Option<&str> {
    stat.get(stat.find('(')? + 1..stat.rfind(')')?)
}

/// PURE: CPU seconds per command during a path, from `(command, ticks)` of every process
/// before and after it (a process gone by the end is left out; one started during the path
/// counts from zero). Largest first; commands under 0.05 s are left out.
pub fn cpu_by_command(before: &HashMap<u32, (String, u64)>, after: &HashMap<u32, (String, u64)>) -> Vec<(String, f64)> {
    let mut by: BTreeMap<&str, u64> = BTreeMap::new();
    for (pid, (command, ticks)) in after {
        // A pid reused by another command counts from zero too.
        let earlier = before.get(pid).filter(|(c, _)| c == command).map_or(0, |(_, t)| *t);
        *by.entry(command.as_str()).or_default() += ticks.saturating_sub(earlier);
    }
    let mut out: Vec<(String, f64)> = by
        .into_iter()
        .map(|(c, t)| (c.to_string(), t as f64 / CLOCK_TICKS_PER_S))
        .filter(|(_, s)| *s >= 0.05)
        .collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

/// `(command, CPU ticks)` of every process this user can read, by pid; this process is named
/// `bench` (it is a `muster` too).
fn process_ticks() -> HashMap<u32, (String, u64)> {
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else { return HashMap::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = read_proc(pid, "stat")?;
            let command = if pid == me { "bench" } else { stat_command(&stat)? };
            Some((pid, (command.to_string(), stat_cpu_ticks(&stat)?)))
        })
        .collect()
}

/// PURE: the value of the series `name{...}` whose labels include `label` in a Prometheus or
/// OpenMetrics text exposition.
pub fn counter_value(text: &str, name: &str, label: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|line| {
        let labels_and_value = line.strip_prefix(name)?.strip_prefix('{')?;
        let (labels, value) = labels_and_value.split_once('}')?;
        labels.split(',').any(|l| l.trim() == label).then_some(())?;
        value.split_whitespace().next()?.parse().ok()
    })
}

/// PURE: the API server's requests by kind, from its `apiserver_request_total` series (summed
/// over codes and scopes): `"VERB resource[/subresource][ (dry run)]"` -> count.
pub fn request_counts(text: &str) -> BTreeMap<String, f64> {
    request_series(text, "apiserver_request_total", None)
}

/// PURE: the requests the API server answered `409 Conflict`, by kind as [`request_counts`]
/// keys them: writes fenced by a resourceVersion that had moved on (or creates of names taken),
/// each a round trip spent for nothing.
pub fn request_conflicts(text: &str) -> BTreeMap<String, f64> {
    request_series(text, "apiserver_request_total", Some("409"))
}

/// PURE: the seconds the API server spent on its requests, by kind as [`request_counts`] keys
/// them (`apiserver_request_duration_seconds_sum`, long-running watches not included).
pub fn request_seconds(text: &str) -> BTreeMap<String, f64> {
    request_series(text, "apiserver_request_duration_seconds_sum", None)
}

/// The series `name` summed by request kind; with `code`, only the series answered with it.
fn request_series(text: &str, name: &str, code: Option<&str>) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name).and_then(|r| r.strip_prefix('{')) else { continue };
        let Some((labels, value)) = rest.split_once('}') else { continue };
        let Some(value) = value.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()) else { continue };
        let label = |name: &str| {
            labels.split(',').find_map(|l| l.trim().strip_prefix(name)?.strip_prefix("=\"")?.strip_suffix('"'))
        };
        if code.is_some_and(|c| label("code") != Some(c)) {
            continue;
        }
        let (verb, resource) = (label("verb").unwrap_or("?"), label("resource").unwrap_or("?"));
        let mut key = format!("{verb} {resource}");
        if let Some(sub) = label("subresource").filter(|s| !s.is_empty()) {
            key = format!("{key}/{sub}");
        }
        if label("dry_run").is_some_and(|d| !d.is_empty()) {
            key.push_str(" (dry run)");
        }
        *out.entry(key).or_insert(0.0) += value;
    }
    out
}

/// PURE: what `after` counts more than `before`, largest first (reads and watches left out:
/// they are served from the watch cache).
pub fn request_delta(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> Vec<(String, f64)> {
    let reads = ["GET ", "LIST ", "WATCH "];
    let mut delta: Vec<(String, f64)> = after
        .iter()
        .filter(|(k, _)| !reads.iter().any(|r| k.starts_with(r)))
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect();
    delta.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    delta
}

/// PURE: the request kinds the API server spent most time on during a path, reads (GET, LIST)
/// included, watches not (they are long-running): `(kind, seconds, seconds per request)`,
/// largest first, from the [`request_seconds`] and [`request_counts`] before and after it.
pub fn request_time(
    seconds: (&BTreeMap<String, f64>, &BTreeMap<String, f64>),
    counts: (&BTreeMap<String, f64>, &BTreeMap<String, f64>),
) -> Vec<(String, f64, f64)> {
    let delta = |before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>| {
        let mut d: Vec<(String, f64)> = after
            .iter()
            .filter(|(k, _)| !k.starts_with("WATCH "))
            .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
            .filter(|(_, d)| *d > 0.0)
            .collect();
        d.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        d
    };
    let served = delta(counts.0, counts.1);
    delta(seconds.0, seconds.1)
        .into_iter()
        .filter_map(|(kind, secs)| {
            let n = served.iter().find(|(k, _)| *k == kind).map(|(_, n)| *n)?;
            Some((kind, secs, secs / n))
        })
        .collect()
}

/// PURE: `count` nodes split into at most `parts` runs of consecutive indices, as
/// `(start_index, count)`, the first runs one longer when it does not divide evenly.
pub fn node_chunks(count: u32, parts: u32) -> Vec<(u32, u32)> {
    let parts = parts.clamp(1, count.max(1));
    let (base, extra) = (count / parts, count % parts);
    let mut start = 0;
    (0..parts)
        .map(|i| {
            let n = base + u32::from(i < extra);
            let chunk = (start, n);
            start += n;
            chunk
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// The pod template of every path: one container, one GPU, restartPolicy Never.
pub fn pod_template() -> Value {
    let resources = json!({GPU_RESOURCE: "1", "cpu": "100m", "memory": "128Mi"});
    json!({
        "metadata": {"labels": {BENCH_POD_LABEL: "true"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "worker",
                // kwok runs no container: the image is never pulled.
                "image": "muster-bench",
                "resources": {"requests": resources, "limits": resources},
            }],
        },
    })
}

/// PURE: gang `name` of `path` with `size` pods, as the manifest to create.
pub fn gang_manifest(path: BenchPath, name: &str, size: u32) -> Value {
    let gang = json!({"schedulingPolicy": {"gang": {"minCount": size}}});
    let mut spec = json!({"parallelism": size, "completions": size, "template": pod_template()});
    match path {
        BenchPath::Plain => {}
        BenchPath::Gang | BenchPath::Muster | BenchPath::MusterUpstream => spec["scheduling"] = gang,
    }
    let (api_version, kind) = match path {
        BenchPath::Plain | BenchPath::Gang => ("batch/v1", "Job"),
        BenchPath::Muster | BenchPath::MusterUpstream => ("batch.muster.dev/v1alpha1", "MusterJob"),
    };
    let mut metadata = json!({"name": name});
    if path == BenchPath::MusterUpstream {
        metadata["annotations"] = json!({muster_api::SCHEDULING_API_ANNOTATION: "upstream"});
    }
    json!({"apiVersion": api_version, "kind": kind, "metadata": metadata, "spec": spec})
}

/// muster's own cost during a path.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct MusterNumbers {
    /// The largest VmRSS sampled during the path (every 200 ms), MiB.
    pub rss_peak_mib: Option<f64>,
    /// VmHWM at the path's end (peak RSS since muster started), MiB.
    pub vm_hwm_mib: Option<f64>,
    /// utime + stime used during the path, seconds.
    pub cpu_s: Option<f64>,
    /// Admission latency over the gangs, median, seconds.
    pub admission_p50_s: Option<f64>,
    /// Admission latency over the gangs, 99th percentile, seconds.
    pub admission_p99_s: Option<f64>,
    /// Gangs whose admission latency was measured (complete and ungated).
    pub gangs_admitted: usize,
    /// Admission cycles run during the path (delta of muster_reconciles_total{controller="admission"}).
    pub cycles: Option<f64>,
    /// Webhook reviews muster answered during the path (each MusterJob create is one
    /// validation and one mutation), and their mean duration, ms.
    pub webhook_reviews: Option<f64>,
    pub webhook_mean_ms: Option<f64>,
    /// The allocator's live bytes at the path's end, MiB (`muster_heap_bytes{kind="allocated"}`),
    /// and its resident bytes: what of RSS is data, and what the allocator holds.
    pub heap_allocated_mib: Option<f64>,
    pub heap_resident_mib: Option<f64>,
}

/// Every number of one path.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PathReport {
    /// The path.
    pub path: Option<BenchPath>,
    /// Its namespace.
    pub namespace: String,
    /// gangs x size.
    pub pods_expected: usize,
    /// Pods the watch saw.
    pub pods_seen: usize,
    /// Pods seen without muster's admission gate.
    pub pods_ungated: usize,
    /// Pods whose `spec.schedulingGroup` was set (upstream workload scheduling).
    pub pods_with_scheduling_group: usize,
    /// Gang path only: the apiserver dropped the Jobs' `spec.scheduling`.
    pub scheduling_dropped: bool,
    /// Creates that failed after retries.
    pub create_errors: usize,
    /// Not every pod was bound within the timeout.
    pub timed_out: bool,
    /// The last successful create, seconds since the path started (the first create).
    pub last_create_s: Option<f64>,
    /// Binds.
    #[serde(flatten)]
    pub throughput: Throughput,
    /// bound_per_s / the plain path's.
    pub ratio_to_plain: Option<f64>,
    /// Write requests the API server served during the path, by kind, largest first (every
    /// client's: the path's controllers, kube-scheduler, kwok, muster).
    pub api_writes: Vec<(String, f64)>,
    /// The API server's time on requests during the path (reads included, watches not), by
    /// kind: `(kind, seconds, seconds per request)`, largest first: where a saturated API
    /// server's time went.
    pub api_time: Vec<(String, f64, f64)>,
    /// Write requests answered `409 Conflict` during the path, by kind, largest first.
    #[serde(default)]
    pub api_conflicts: Vec<(String, f64)>,
    /// CPU seconds per process command during the path (the API server, etcd, kube-scheduler,
    /// kwok, the controllers, muster, the bench itself), largest first: where the machine's
    /// CPU went.
    #[serde(default)]
    pub cpu_s_by_process: Vec<(String, f64)>,
    /// muster path only.
    pub muster: Option<MusterNumbers>,
}

impl PathReport {
    /// Whether the path measured what it claims: all bound, nothing dropped or failed.
    pub fn ok(&self) -> bool {
        !self.timed_out && !self.scheduling_dropped && self.create_errors == 0 && !self.gang_not_honoured()
    }

    /// Upstream gang paths only: some of its pods carry no `spec.schedulingGroup`.
    pub fn gang_not_honoured(&self) -> bool {
        matches!(self.path, Some(BenchPath::Gang | BenchPath::MusterUpstream))
            && (self.scheduling_dropped || self.pods_with_scheduling_group < self.pods_seen)
    }
}

/// The whole run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Report {
    /// Nodes the bench made.
    pub nodes: u32,
    /// Gangs per path.
    pub gangs: u32,
    /// Pods per gang.
    pub size: u32,
    /// Creates in flight.
    pub concurrency: u32,
    /// Gangs created per second per path (0: as fast as the creates in flight allow).
    pub rate: f64,
    /// Path timeout, seconds.
    pub timeout_s: u64,
    /// Seconds creating the nodes took.
    pub nodes_create_s: f64,
    /// Seconds from the first node create until kwok reported them all Ready.
    pub nodes_ready_s: f64,
    /// The paths, in the order they ran.
    pub paths: Vec<PathReport>,
    /// Pods in the cluster at the end.
    pub cluster_pods: Option<usize>,
    /// Nodes in the cluster at the end.
    pub cluster_nodes: Option<usize>,
}

fn opt(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "-".to_string(), |v| format!("{v:.decimals$}"))
}

/// PURE: the human summary of `report`.
pub fn format_table(report: &Report) -> String {
    let paced = if report.rate > 0.0 { format!(", created at {} gangs/s", report.rate) } else { String::new() };
    let mut out = format!(
        "bench: {} nodes ({} GPUs each; created in {:.1} s, all Ready after {:.1} s), {} gangs x {} pods per path{paced}\n\n",
        report.nodes, GPUS_PER_NODE, report.nodes_create_s, report.nodes_ready_s, report.gangs, report.size
    );
    out.push_str(&format!(
        "{:<8} {:>11} {:>10} {:>9} {:>22} {:>16}  {}\n",
        "path", "pods bound", "bound/s", "vs plain", "last create->last bind", "schedulingGroup", "status"
    ));
    for p in &report.paths {
        let status = if p.ok() {
            "ok".to_string()
        } else {
            let mut why = Vec::new();
            if p.timed_out {
                why.push("TIMED OUT".to_string());
            }
            if p.scheduling_dropped {
                why.push("spec.scheduling DROPPED by the API".to_string());
            } else if p.gang_not_honoured() {
                why.push("pods WITHOUT schedulingGroup".to_string());
            }
            if p.create_errors > 0 {
                why.push(format!("{} create errors", p.create_errors));
            }
            why.join(", ")
        };
        out.push_str(&format!(
            "{:<8} {:>11} {:>10} {:>9} {:>22} {:>16}  {}\n",
            p.path.map_or("?", BenchPath::name),
            format!("{}/{}", p.throughput.pods_bound, p.pods_expected),
            opt(p.throughput.bound_per_s, 1),
            p.ratio_to_plain.map_or_else(|| "-".to_string(), |r| format!("{r:.2}x")),
            format!("{} s", opt(p.throughput.last_create_to_last_bind_s, 2)),
            format!("{}/{}", p.pods_with_scheduling_group, p.pods_seen),
            status
        ));
    }
    top_lines(
        &mut out,
        report,
        |p| &p.api_writes,
        |(_, n)| *n,
        |p, (k, n)| format!("{k} {:.2}", n / p.pods_expected.max(1) as f64),
        |p, total| format!("{total:.0} API writes, {:.2} per pod", total / p.pods_expected.max(1) as f64),
    );
    top_lines(
        &mut out,
        report,
        |p| &p.api_conflicts,
        |(_, n)| *n,
        |_, (k, n)| format!("{k} {n:.0}"),
        |_, total| format!("{total:.0} writes refused as conflicts (409)"),
    );
    top_lines(
        &mut out,
        report,
        |p| &p.cpu_s_by_process,
        |(_, s)| *s,
        |_, (c, s)| format!("{c} {s:.1}"),
        |p, total| {
            format!("CPU seconds {total:.1} ({:.2} per pod bound)", total / p.throughput.pods_bound.max(1) as f64)
        },
    );
    top_lines(
        &mut out,
        report,
        |p| &p.api_time,
        |(_, s, _)| *s,
        |_, (k, s, each)| format!("{k} {s:.0} s ({:.0} ms each)", each * 1000.0),
        |_, total| format!("the API server's time on requests {total:.0} s"),
    );
    if report.paths.iter().any(|p| !p.api_writes.is_empty()) {
        out.push('\n');
    }
    for p in &report.paths {
        if let Some(m) = &p.muster {
            out.push_str(&format!(
                "\nmuster during the {} path: peak RSS {} MiB (VmHWM {} MiB, since start), CPU {} s\n",
                p.path.map_or("?", BenchPath::name),
                opt(m.rss_peak_mib, 1),
                opt(m.vm_hwm_mib, 1),
                opt(m.cpu_s, 2)
            ));
            out.push_str(&format!(
                "  admission latency over {} gangs: p50 {} s, p99 {} s; admission cycles {}\n",
                m.gangs_admitted,
                opt(m.admission_p50_s, 3),
                opt(m.admission_p99_s, 3),
                opt(m.cycles, 0)
            ));
            out.push_str(&format!(
                "  heap at the end: {} MiB allocated, {} MiB resident; webhook: {} reviews, mean {} ms\n",
                opt(m.heap_allocated_mib, 1),
                opt(m.heap_resident_mib, 1),
                opt(m.webhook_reviews, 0),
                opt(m.webhook_mean_ms, 1)
            ));
        }
    }
    out.push_str(&format!(
        "\ncluster at the end: {} pods, {} nodes\n",
        report.cluster_pods.map_or_else(|| "?".to_string(), |n| n.to_string()),
        report.cluster_nodes.map_or_else(|| "?".to_string(), |n| n.to_string())
    ));
    out
}

// === The shell ===

#[derive(Debug, thiserror::Error)]
enum BenchError {
    #[error(transparent)]
    Dev(#[from] super::Error),
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("manifest: {0}")]
    Manifest(#[from] serde_json::Error),
    #[error("{0}")]
    Setup(String),
}

/// What the watch recorded of one pod.
struct PodRecord {
    gang: String,
    first_seen: Instant,
    ungated: Option<Instant>,
    bound: Option<Instant>,
    scheduling_group: bool,
}

type PodLog = Arc<Mutex<HashMap<String, PodRecord>>>;

fn lock(log: &PodLog) -> std::sync::MutexGuard<'_, HashMap<String, PodRecord>> {
    // A panic elsewhere poisons nothing we cannot still read.
    log.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn record(log: &PodLog, pod: &Pod, now: Instant) {
    let Some(name) = pod.metadata.name.clone() else { return };
    let gang = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| o.name.clone())
        .unwrap_or_default();
    let spec = pod.spec.as_ref();
    let gated =
        spec.and_then(|s| s.scheduling_gates.as_ref()).is_some_and(|g| g.iter().any(|g| g.name == ADMISSION_GATE));
    let bound = spec.and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty());
    let scheduling_group = spec.is_some_and(|s| s.scheduling_group.is_some());
    let mut pods = lock(log);
    let r = pods.entry(name).or_insert(PodRecord {
        gang,
        first_seen: now,
        ungated: None,
        bound: None,
        scheduling_group: false,
    });
    if !gated && r.ungated.is_none() {
        r.ungated = Some(now);
    }
    if bound && r.bound.is_none() {
        r.bound = Some(now);
    }
    r.scheduling_group |= scheduling_group;
}

/// Watches the pods of `api` into `log`; says on `ready` when the initial list is done.
async fn watch_pods(api: Api<Pod>, log: PodLog, ready: tokio::sync::oneshot::Sender<()>) {
    let mut ready = Some(ready);
    let mut events = watcher(api, watcher::Config::default()).default_backoff().boxed();
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => record(&log, &pod, Instant::now()),
            Ok(watcher::Event::InitDone) => {
                if let Some(tx) = ready.take() {
                    let _ = tx.send(());
                }
            }
            Ok(_) => {}
            Err(e) => eprintln!("bench: pod watch: {e}"),
        }
    }
}

fn since(t0: Instant, t: Instant) -> f64 {
    t.saturating_duration_since(t0).as_secs_f64()
}

fn pod_times(log: &PodLog, t0: Instant) -> (Vec<PodTimes>, usize) {
    let pods = lock(log);
    let with_group = pods.values().filter(|r| r.scheduling_group).count();
    let times = pods
        .values()
        .map(|r| PodTimes {
            gang: r.gang.clone(),
            first_seen: since(t0, r.first_seen),
            ungated: r.ungated.map(|t| since(t0, t)),
            bound: r.bound.map(|t| since(t0, t)),
        })
        .collect();
    (times, with_group)
}

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Creates the bench's nodes, `concurrency` runs of them at once, and waits until kwok
/// reports them all Ready. Returns (seconds creating, seconds until all Ready).
async fn make_nodes(client: &Client, args: &Args) -> Result<(f64, f64), BenchError> {
    let t0 = Instant::now();
    let creates = node_chunks(args.nodes, args.concurrency).into_iter().map(|(start_index, count)| {
        let spec = FakeGpuNodes {
            count,
            start_index,
            prefix: args.node_prefix.clone(),
            gpus: GPUS_PER_NODE,
            labels: vec![(BENCH_NODE_LABEL.to_string(), "true".to_string())],
            ..FakeGpuNodes::default()
        };
        async move { add_nodes(client, &spec).await }
    });
    futures::future::try_join_all(creates).await?;
    let created = t0.elapsed().as_secs_f64();
    eprintln!("bench: {} nodes created in {created:.1} s; waiting for Ready", args.nodes);
    let nodes: Api<Node> = Api::all(client.clone());
    let lp = ListParams::default().labels(&format!("{BENCH_NODE_LABEL}=true"));
    let deadline = t0 + Duration::from_secs(args.timeout);
    loop {
        let ready = nodes
            .list(&lp)
            .await?
            .items
            .iter()
            .filter(|n| n.metadata.name.as_deref().is_some_and(|m| m.starts_with(&args.node_prefix)) && node_ready(n))
            .count();
        if ready >= args.nodes as usize {
            return Ok((created, t0.elapsed().as_secs_f64()));
        }
        if Instant::now() >= deadline {
            return Err(BenchError::Setup(format!(
                "only {ready}/{} nodes Ready after {} s (is kwok running?)",
                args.nodes, args.timeout
            )));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Makes the path's namespace (refusing one that already holds pods: its numbers would mix
/// with an earlier run's) and waits for its default ServiceAccount, without which the
/// ServiceAccount admission plugin refuses the pods.
async fn prepare_namespace(client: &Client, ns: &str) -> Result<(), BenchError> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let body: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
    match namespaces.create(&PostParams::default(), &body).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let pods = Api::<Pod>::namespaced(client.clone(), ns).list_metadata(&ListParams::default()).await?;
            if !pods.items.is_empty() {
                return Err(BenchError::Setup(format!(
                    "namespace {ns} already holds {} pods: run the bench on a fresh cluster",
                    pods.items.len()
                )));
            }
        }
        Err(e) => return Err(e.into()),
    }
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    for _ in 0..300 {
        if accounts.get_opt("default").await?.is_some() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(BenchError::Setup(format!("no default ServiceAccount in {ns} after 60 s")))
}

/// Creates one gang, retrying transient failures; Ok(false) when a gang Job came back
/// without `spec.scheduling` (the API dropped it).
async fn create_gang(client: &Client, path: BenchPath, ns: &str, name: &str, size: u32) -> Result<bool, BenchError> {
    let manifest = gang_manifest(path, name, size);
    let pp = PostParams::default();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let result = match path {
            BenchPath::Plain | BenchPath::Gang => {
                let job: Job = serde_json::from_value(manifest.clone())?;
                Api::<Job>::namespaced(client.clone(), ns)
                    .create(&pp, &job)
                    .await
                    .map(|j| path != BenchPath::Gang || j.spec.is_some_and(|s| s.scheduling.is_some()))
            }
            BenchPath::Muster | BenchPath::MusterUpstream => {
                let job: MusterJob = serde_json::from_value(manifest.clone())?;
                Api::<MusterJob>::namespaced(client.clone(), ns).create(&pp, &job).await.map(|_| true)
            }
        };
        match result {
            Ok(kept) => return Ok(kept),
            // An earlier attempt went through after all.
            Err(kube::Error::Api(e)) if e.code == 409 && attempt > 1 => return Ok(true),
            Err(e) if attempt >= 5 => return Err(e.into()),
            Err(e) => {
                eprintln!("bench: creating {ns}/{name} (attempt {attempt}): {e}");
                tokio::time::sleep(Duration::from_millis(200 * attempt)).await;
            }
        }
    }
}

async fn fetch_metrics(http: &reqwest::Client, url: &str) -> Option<MusterMetrics> {
    let text = match http.get(url).send().await.and_then(reqwest::Response::error_for_status) {
        Ok(r) => r.text().await.ok()?,
        Err(e) => {
            eprintln!("bench: {url}: {e}");
            return None;
        }
    };
    Some(MusterMetrics::read(&text))
}

/// What the bench reads of muster's /metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MusterMetrics {
    /// Admission cycles run (the series appears with the first).
    pub cycles: f64,
    /// Webhook reviews answered, and the seconds they took in all.
    pub webhook_reviews: f64,
    pub webhook_seconds: f64,
    /// The allocator's live bytes and its resident bytes.
    pub heap_allocated: Option<f64>,
    pub heap_resident: Option<f64>,
}

impl MusterMetrics {
    /// PURE: reads them from muster's /metrics text.
    pub fn read(text: &str) -> Self {
        let sum = |name: &str| {
            ["path=\"/validate\"", "path=\"/mutate\""].iter().filter_map(|l| counter_value(text, name, l)).sum()
        };
        let heap = |kind: &str| counter_value(text, HEAP_METRIC, &format!("kind=\"{kind}\""));
        MusterMetrics {
            cycles: counter_value(text, CYCLES_METRIC, CYCLES_LABEL).unwrap_or(0.0),
            webhook_reviews: sum("muster_webhook_duration_seconds_count"),
            webhook_seconds: sum("muster_webhook_duration_seconds_sum"),
            heap_allocated: heap("allocated"),
            heap_resident: heap("resident"),
        }
    }
}

/// The API server's request counts, seconds and conflicts by kind now, from its `/metrics`
/// (`None` when it cannot be read).
async fn api_requests(client: &Client) -> Option<ApiRequests> {
    let request = axum::http::Request::get("/metrics").body(Vec::new()).ok()?;
    match client.request_text(request).await {
        Ok(text) => Some(ApiRequests {
            counts: request_counts(&text),
            seconds: request_seconds(&text),
            conflicts: request_conflicts(&text),
        }),
        Err(e) => {
            eprintln!("bench: WARNING: the API server's /metrics: {e}");
            None
        }
    }
}

/// What the API server's `/metrics` said of its requests at one moment.
struct ApiRequests {
    counts: BTreeMap<String, f64>,
    seconds: BTreeMap<String, f64>,
    conflicts: BTreeMap<String, f64>,
}

fn read_proc(pid: u32, file: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/{file}")).ok()
}

/// Samples VmRSS of `pid` until `stop`; returns the largest, KiB.
async fn sample_rss(pid: u32, stop: Arc<AtomicBool>) -> Option<u64> {
    let mut peak = None;
    while !stop.load(Ordering::Relaxed) {
        if let Some(kib) = read_proc(pid, "status").and_then(|s| status_kib(&s, "VmRSS")) {
            peak = peak.max(Some(kib));
        }
        tokio::time::sleep(RSS_SAMPLE_EVERY).await;
    }
    peak
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

async fn run_path(
    client: &Client,
    args: &Args,
    path: BenchPath,
    http: &reqwest::Client,
) -> Result<PathReport, BenchError> {
    let ns = path.namespace();
    let expected = (args.gangs * args.size) as usize;
    let log: PodLog = Arc::default();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let watch = tokio::spawn(watch_pods(Api::namespaced(client.clone(), &ns), log.clone(), ready_tx));
    if tokio::time::timeout(Duration::from_secs(60), ready_rx).await.is_err() {
        watch.abort();
        return Err(BenchError::Setup(format!("the pod watch of {ns} did not start")));
    }

    let is_muster = matches!(path, BenchPath::Muster | BenchPath::MusterUpstream);
    let muster_pid = args.muster_pid.filter(|_| is_muster);
    let metrics_before = match (&args.muster_metrics_url, is_muster) {
        (Some(url), true) => fetch_metrics(http, url).await,
        _ => None,
    };
    let requests_before = api_requests(client).await;
    let processes_before = process_ticks();
    let ticks_before = muster_pid.and_then(|pid| read_proc(pid, "stat")).and_then(|s| stat_cpu_ticks(&s));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = muster_pid.map(|pid| tokio::spawn(sample_rss(pid, stop.clone())));

    eprintln!("bench: {}: creating {} gangs of {} in {ns}", path.name(), args.gangs, args.size);
    let t0 = Instant::now();
    let results: Vec<(Result<bool, BenchError>, Instant)> = futures::stream::iter(0..args.gangs)
        .map(|i| {
            let ns = &ns;
            // Paced: gang i is created no sooner than i / rate seconds after the first.
            let at = (args.rate > 0.0).then(|| t0 + Duration::from_secs_f64(f64::from(i) / args.rate));
            async move {
                if let Some(at) = at {
                    tokio::time::sleep_until(at.into()).await;
                }
                let name = format!("{}-{i:05}", path.name());
                let r = create_gang(client, path, ns, &name, args.size).await;
                (r, Instant::now())
            }
        })
        .buffer_unordered(args.concurrency as usize)
        .collect()
        .await;
    let last_create = results.iter().filter(|(r, _)| r.is_ok()).map(|(_, t)| since(t0, *t)).reduce(f64::max);
    let mut create_errors = 0;
    let mut scheduling_dropped = false;
    for (r, _) in &results {
        match r {
            Ok(kept) => scheduling_dropped |= !kept,
            Err(e) => {
                create_errors += 1;
                if create_errors <= 3 {
                    eprintln!("bench: {}: create failed: {e}", path.name());
                }
            }
        }
    }
    if scheduling_dropped {
        eprintln!(
            "bench: WARNING: the API dropped spec.scheduling of the gang path's Jobs (gate WorkloadWithJob off?): \
             they ran as plain Jobs"
        );
    }
    eprintln!(
        "bench: {}: {} creates in {} s; waiting for {expected} binds",
        path.name(),
        args.gangs as usize - create_errors,
        opt(last_create, 2)
    );

    let deadline = t0 + Duration::from_secs(args.timeout);
    let mut next_progress = t0 + Duration::from_secs(10);
    let timed_out = loop {
        let bound = lock(&log).values().filter(|r| r.bound.is_some()).count();
        if bound >= expected {
            break false;
        }
        let now = Instant::now();
        if now >= deadline {
            break true;
        }
        if now >= next_progress {
            let seen = lock(&log).len();
            eprintln!("bench: {}: {bound}/{expected} bound, {seen} seen ({:.0} s)", path.name(), since(t0, now));
            next_progress = now + Duration::from_secs(10);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    stop.store(true, Ordering::Relaxed);
    let cpu_s_by_process = cpu_by_command(&processes_before, &process_ticks());
    let ticks_after = muster_pid.and_then(|pid| read_proc(pid, "stat")).and_then(|s| stat_cpu_ticks(&s));
    let hwm = muster_pid.and_then(|pid| read_proc(pid, "status")).and_then(|s| status_kib(&s, "VmHWM"));
    let metrics_after = match (&args.muster_metrics_url, is_muster) {
        (Some(url), true) => fetch_metrics(http, url).await,
        _ => None,
    };
    let (api_writes, api_time, api_conflicts) = match (requests_before, api_requests(client).await) {
        (Some(before), Some(after)) => (
            request_delta(&before.counts, &after.counts),
            request_time((&before.seconds, &after.seconds), (&before.counts, &after.counts)),
            request_delta(&before.conflicts, &after.conflicts),
        ),
        _ => (Vec::new(), Vec::new(), Vec::new()),
    };
    let rss_peak = match sampler {
        Some(s) => s.await.ok().flatten(),
        None => None,
    };
    watch.abort();

    let (pods, pods_with_scheduling_group) = pod_times(&log, t0);
    let muster = is_muster.then(|| {
        let latencies = gang_admission_latencies(&pods, args.size as usize);
        MusterNumbers {
            rss_peak_mib: rss_peak.map(mib),
            vm_hwm_mib: hwm.map(mib),
            cpu_s: ticks_before.zip(ticks_after).map(|(b, a)| a.saturating_sub(b) as f64 / CLOCK_TICKS_PER_S),
            admission_p50_s: percentile(&latencies, 50.0),
            admission_p99_s: percentile(&latencies, 99.0),
            gangs_admitted: latencies.len(),
            cycles: metrics_before.zip(metrics_after).map(|(b, a)| a.cycles - b.cycles),
            webhook_reviews: metrics_before.zip(metrics_after).map(|(b, a)| a.webhook_reviews - b.webhook_reviews),
            webhook_mean_ms: metrics_before.zip(metrics_after).and_then(|(b, a)| {
                let n = a.webhook_reviews - b.webhook_reviews;
                (n > 0.0).then(|| 1000.0 * (a.webhook_seconds - b.webhook_seconds) / n)
            }),
            heap_allocated_mib: metrics_after.and_then(|a| a.heap_allocated).map(|b| b / 1048576.0),
            heap_resident_mib: metrics_after.and_then(|a| a.heap_resident).map(|b| b / 1048576.0),
        }
    });
    Ok(PathReport {
        path: Some(path),
        namespace: ns,
        pods_expected: expected,
        pods_seen: pods.len(),
        pods_ungated: pods.iter().filter(|p| p.ungated.is_some()).count(),
        pods_with_scheduling_group,
        scheduling_dropped,
        create_errors,
        timed_out,
        last_create_s: last_create,
        throughput: throughput(&pods, 0.0, last_create),
        ratio_to_plain: None,
        api_writes,
        api_time,
        api_conflicts,
        cpu_s_by_process,
        muster,
    })
}

async fn bench(args: &Args) -> Result<Report, BenchError> {
    let client = client(args.kubeconfig.as_deref()).await?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| BenchError::Setup(format!("http client: {e}")))?;
    let pods_needed = u64::from(args.gangs) * u64::from(args.size) * args.paths.len() as u64;
    if pods_needed > u64::from(args.nodes) * u64::from(GPUS_PER_NODE) {
        eprintln!(
            "bench: WARNING: {pods_needed} one-GPU pods over all paths, {} GPUs: the later paths cannot all bind",
            u64::from(args.nodes) * u64::from(GPUS_PER_NODE)
        );
    }
    for path in &args.paths {
        prepare_namespace(&client, &path.namespace()).await?;
    }
    let (nodes_create_s, nodes_ready_s) = make_nodes(&client, args).await?;
    eprintln!("bench: all {} nodes Ready after {nodes_ready_s:.1} s", args.nodes);

    let mut report = Report {
        nodes: args.nodes,
        gangs: args.gangs,
        size: args.size,
        concurrency: args.concurrency,
        rate: args.rate,
        timeout_s: args.timeout,
        nodes_create_s,
        nodes_ready_s,
        ..Report::default()
    };
    for &path in &args.paths {
        let r = run_path(&client, args, path, &http).await?;
        eprintln!(
            "bench: {}: {}/{} bound, {} pods/s{}",
            path.name(),
            r.throughput.pods_bound,
            r.pods_expected,
            opt(r.throughput.bound_per_s, 1),
            if r.timed_out { " (TIMED OUT)" } else { "" }
        );
        report.paths.push(r);
    }
    let plain = report.paths.iter().find(|p| p.path == Some(BenchPath::Plain)).and_then(|p| p.throughput.bound_per_s);
    for p in &mut report.paths {
        p.ratio_to_plain = ratio(p.throughput.bound_per_s, plain);
    }
    let lp = ListParams::default();
    report.cluster_pods = Api::<Pod>::all(client.clone()).list_metadata(&lp).await.ok().map(|l| l.items.len());
    report.cluster_nodes = Api::<Node>::all(client).list_metadata(&lp).await.ok().map(|l| l.items.len());
    Ok(report)
}

/// Runs `muster dev bench`: exit 0 only when every path bound all its pods and measured what
/// it claims.
pub fn run(args: Args) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: tokio runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let report = match runtime.block_on(bench(&args)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    print!("{}", format_table(&report));
    if let Some(path) = &args.json_out {
        let written = serde_json::to_string_pretty(&report)
            .map_err(std::io::Error::other)
            .and_then(|text| std::fs::write(path, text + "\n"));
        if let Err(e) = written {
            eprintln!("error: writing {}: {e}", path.display());
            return ExitCode::from(2);
        }
        println!("numbers written to {}", path.display());
    }
    if report.paths.iter().all(PathReport::ok) { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn musters_figures_are_read_from_its_metrics() {
        let text = "# TYPE muster_heap_bytes gauge\n\
            muster_reconciles_total{controller=\"job\"} 3\n\
            muster_reconciles_total{controller=\"admission\"} 12\n\
            muster_webhook_duration_seconds_sum{path=\"/validate\"} 0.5\n\
            muster_webhook_duration_seconds_count{path=\"/validate\"} 10\n\
            muster_webhook_duration_seconds_bucket{le=\"0.001\",path=\"/mutate\"} 4\n\
            muster_webhook_duration_seconds_sum{path=\"/mutate\"} 0.25\n\
            muster_webhook_duration_seconds_count{path=\"/mutate\"} 10\n\
            muster_heap_bytes{kind=\"allocated\"} 1048576\n\
            muster_heap_bytes{kind=\"resident\"} 2097152\n";
        let m = MusterMetrics::read(text);
        assert_eq!(
            m,
            MusterMetrics {
                cycles: 12.0,
                webhook_reviews: 20.0,
                webhook_seconds: 0.75,
                heap_allocated: Some(1048576.0),
                heap_resident: Some(2097152.0),
            }
        );
        assert_eq!(MusterMetrics::read("").heap_allocated, None, "no allocator figures: none shown");
    }

    fn pod(gang: &str, first_seen: f64, ungated: Option<f64>, bound: Option<f64>) -> PodTimes {
        PodTimes { gang: gang.into(), first_seen, ungated, bound }
    }

    #[test]
    fn percentile_is_nearest_rank() {
        let ten: Vec<f64> = (1..=10).rev().map(f64::from).collect();
        let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        let cases: Vec<(&str, Vec<f64>, f64, Option<f64>)> = vec![
            ("none gives none", vec![], 50.0, None),
            ("one value is every percentile", vec![7.0], 99.0, Some(7.0)),
            ("median of two is the lower", vec![2.0, 1.0], 50.0, Some(1.0)),
            ("median of three is the middle", vec![3.0, 1.0, 2.0], 50.0, Some(2.0)),
            ("p50 of 10..1 is 5 (rank 5)", ten.clone(), 50.0, Some(5.0)),
            ("p99 of 10..1 is the max (rank ceil(9.9) = 10)", ten.clone(), 99.0, Some(10.0)),
            ("p90 of 10..1 is 9", ten, 90.0, Some(9.0)),
            ("p99 of 1..100 is 99", hundred.clone(), 99.0, Some(99.0)),
            ("p100 is the max", hundred.clone(), 100.0, Some(100.0)),
            ("a tiny p is the min", hundred, 0.1, Some(1.0)),
        ];
        for (name, values, p, want) in cases {
            assert_eq!(percentile(&values, p), want, "{name}");
        }
    }

    #[test]
    fn admission_latency_runs_from_the_last_pod_seen_to_the_last_pod_ungated() {
        let cases: Vec<(&str, Vec<PodTimes>, usize, Vec<f64>)> = vec![
            (
                "one gang: last seen 1.5, last ungated 2.25",
                vec![pod("a", 1.0, Some(2.0), None), pod("a", 1.5, Some(2.25), None), pod("a", 0.5, Some(2.0), None)],
                3,
                vec![0.75],
            ),
            (
                "gangs in name order, each its own latency",
                vec![
                    pod("b", 3.0, Some(4.0), None),
                    pod("b", 3.5, Some(3.75), None),
                    pod("a", 0.0, Some(0.5), None),
                    pod("a", 0.25, Some(1.0), None),
                ],
                2,
                vec![0.75, 0.5],
            ),
            (
                "a gang with a pod still gated is left out",
                vec![pod("a", 1.0, Some(2.0), None), pod("a", 1.0, None, None)],
                2,
                vec![],
            ),
            ("a gang with too few pods is left out", vec![pod("a", 1.0, Some(2.0), None)], 2, vec![]),
            (
                "pods never gated: ungated at first sight",
                vec![pod("a", 1.0, Some(1.0), None), pod("a", 2.0, Some(2.0), None)],
                2,
                vec![0.0],
            ),
        ];
        for (name, pods, size, want) in cases {
            assert_eq!(gang_admission_latencies(&pods, size), want, "{name}");
        }
    }

    #[test]
    fn throughput_counts_binds_over_first_create_to_last_bind() {
        let pods = [
            pod("a", 0.5, Some(0.5), Some(1.0)),
            pod("a", 0.5, Some(0.5), Some(4.0)),
            pod("b", 1.0, Some(1.0), Some(2.0)),
            pod("b", 1.0, Some(1.0), None),
        ];
        let t = throughput(&pods, 0.0, Some(1.5));
        assert_eq!(t.pods_bound, 3);
        assert_eq!(t.first_bind_s, Some(1.0));
        assert_eq!(t.last_bind_s, Some(4.0));
        assert_eq!(t.bound_per_s, Some(0.75));
        assert_eq!(t.last_create_to_last_bind_s, Some(2.5));

        let none = throughput(&[pod("a", 0.5, None, None)], 0.0, Some(1.0));
        assert_eq!((none.pods_bound, none.bound_per_s, none.last_create_to_last_bind_s), (0, None, None));
        assert_eq!(ratio(Some(30.0), Some(20.0)), Some(1.5));
        assert_eq!(ratio(Some(30.0), None), None);
        assert_eq!(ratio(Some(30.0), Some(0.0)), None);
    }

    #[test]
    fn cpu_per_command_over_a_path() {
        let at = |rows: &[(u32, &str, u64)]| -> HashMap<u32, (String, u64)> {
            rows.iter().map(|(pid, c, t)| (*pid, (c.to_string(), *t))).collect()
        };
        let before =
            at(&[(1, "kube-apiserver", 1000), (2, "etcd", 500), (3, "muster", 10), (4, "gone", 7), (6, "old", 900)]);
        let after = at(&[
            (1, "kube-apiserver", 9000),
            (2, "etcd", 700),
            (3, "muster", 3010),
            // Started during the path: counted from zero.
            (5, "kube-apiserver", 1000),
            // pid 6 reused by another command: from zero too.
            (6, "kwok", 300),
            // Idle: left out.
            (7, "sleep", 2),
        ]);
        assert_eq!(
            cpu_by_command(&before, &after),
            vec![
                ("kube-apiserver".to_string(), 90.0),
                ("muster".into(), 30.0),
                ("kwok".into(), 3.0),
                ("etcd".into(), 2.0)
            ]
        );
    }

    #[test]
    fn proc_and_metrics_parsers() {
        let status = "Name:\tmuster\nVmPeak:\t 999 kB\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n";
        assert_eq!(status_kib(status, "VmRSS"), Some(102400));
        assert_eq!(status_kib(status, "VmHWM"), Some(204800));
        assert_eq!(status_kib(status, "VmSwap"), None);
        // A command name with spaces and a parenthesis; utime 250, stime 50.
        let stat = "4242 (mus ter) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 1000 0 0";
        assert_eq!(stat_cpu_ticks(stat), Some(300));
        assert_eq!(stat_command(stat), Some("mus ter) x"));
        assert_eq!(stat_command("4242 no command"), None);
        assert_eq!(stat_cpu_ticks("4242 (muster) S 1"), None);
        let metrics = "# TYPE muster_reconciles counter\n\
            muster_reconciles_total{controller=\"job\"} 5\n\
            muster_reconciles_total{controller=\"admission\"} 42\n\
            muster_reconciles_total_other{controller=\"admission\"} 7\n# EOF\n";
        assert_eq!(counter_value(metrics, CYCLES_METRIC, CYCLES_LABEL), Some(42.0));
        assert_eq!(counter_value(metrics, CYCLES_METRIC, "controller=\"devices\""), None);
    }

    #[test]
    fn the_api_servers_time_is_told_per_write_kind_with_its_mean() {
        let text = |posts: u32, post_s: f64, patch_s: f64| {
            format!(
                "apiserver_request_total{{code=\"201\",dry_run=\"\",resource=\"musterjobs\",subresource=\"\",verb=\"POST\"}} {posts}\n\
                 apiserver_request_total{{code=\"200\",dry_run=\"\",resource=\"pods\",subresource=\"\",verb=\"PATCH\"}} 10\n\
                 apiserver_request_duration_seconds_sum{{component=\"apiserver\",dry_run=\"\",group=\"batch.muster.dev\",resource=\"musterjobs\",scope=\"resource\",subresource=\"\",verb=\"POST\",version=\"v1alpha1\"}} {post_s}\n\
                 apiserver_request_duration_seconds_count{{dry_run=\"\",resource=\"musterjobs\",subresource=\"\",verb=\"POST\"}} {posts}\n\
                 apiserver_request_duration_seconds_sum{{dry_run=\"\",resource=\"pods\",subresource=\"\",verb=\"PATCH\"}} {patch_s}\n\
                 apiserver_request_duration_seconds_sum{{dry_run=\"\",resource=\"nodes\",subresource=\"\",verb=\"WATCH\"}} 99\n"
            )
        };
        let (before, after) = (text(10, 1.0, 0.5), text(110, 51.0, 0.5));
        assert_eq!(request_seconds(&after).get("POST musterjobs"), Some(&51.0));
        let time = request_time(
            (&request_seconds(&before), &request_seconds(&after)),
            (&request_counts(&before), &request_counts(&after)),
        );
        assert_eq!(time, vec![("POST musterjobs".to_string(), 50.0, 0.5)], "no time spent: left out");
    }

    #[test]
    fn api_writes_are_counted_by_kind_and_reads_left_out() {
        let before = request_counts(
            "# HELP apiserver_request_total x\n\
             apiserver_request_total{code=\"201\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"pods\",scope=\"resource\",subresource=\"binding\",verb=\"POST\",version=\"v1\"} 10\n\
             apiserver_request_total{code=\"200\",dry_run=\"\",resource=\"pods\",subresource=\"\",verb=\"PATCH\"} 4\n\
             apiserver_request_total{code=\"200\",dry_run=\"\",resource=\"nodes\",subresource=\"\",verb=\"LIST\"} 7\n",
        );
        let after = request_counts(
            "apiserver_request_total{code=\"201\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"pods\",scope=\"resource\",subresource=\"binding\",verb=\"POST\",version=\"v1\"} 16\n\
             apiserver_request_total{code=\"200\",dry_run=\"\",resource=\"pods\",subresource=\"\",verb=\"PATCH\"} 5\n\
             apiserver_request_total{code=\"409\",dry_run=\"\",resource=\"pods\",subresource=\"\",verb=\"PATCH\"} 2\n\
             apiserver_request_total{code=\"200\",dry_run=\"All\",resource=\"pods\",subresource=\"\",verb=\"PATCH\"} 3\n\
             apiserver_request_total{code=\"200\",dry_run=\"\",resource=\"nodes\",subresource=\"\",verb=\"LIST\"} 9\n",
        );
        assert_eq!(after.get("PATCH pods"), Some(&7.0), "codes are summed: {after:?}");
        assert_eq!(
            request_delta(&before, &after),
            vec![
                ("POST pods/binding".to_string(), 6.0),
                ("PATCH pods".to_string(), 3.0),
                ("PATCH pods (dry run)".to_string(), 3.0)
            ]
        );
        let conflicts = request_conflicts(
            "apiserver_request_total{code=\"409\",dry_run=\"\",resource=\"podgroups\",subresource=\"status\",verb=\"PATCH\"} 4\n\
             apiserver_request_total{code=\"200\",dry_run=\"\",resource=\"podgroups\",subresource=\"status\",verb=\"PATCH\"} 9\n\
             apiserver_request_total{code=\"409\",dry_run=\"\",resource=\"pods\",subresource=\"\",verb=\"PATCH\"} 2\n",
        );
        let want: BTreeMap<String, f64> =
            [("PATCH podgroups/status".to_string(), 4.0), ("PATCH pods".to_string(), 2.0)].into();
        assert_eq!(conflicts, want, "only the 409 answers");
    }

    #[test]
    fn node_chunks_cover_every_index_once() {
        assert_eq!(node_chunks(10, 3), vec![(0, 4), (4, 3), (7, 3)]);
        assert_eq!(node_chunks(2, 16), vec![(0, 1), (1, 1)]);
        assert_eq!(node_chunks(0, 4), Vec::<(u32, u32)>::new());
        assert_eq!(node_chunks(5, 0), vec![(0, 5)]);
        let chunks = node_chunks(5000, 16);
        assert_eq!(chunks.len(), 16);
        assert_eq!(chunks.iter().map(|c| c.1).sum::<u32>(), 5000);
        assert!(chunks.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0));
    }

    #[test]
    fn the_paths_share_one_pod_template() {
        let plain = gang_manifest(BenchPath::Plain, "plain-00000", 3);
        let gang = gang_manifest(BenchPath::Gang, "gang-00000", 3);
        let muster = gang_manifest(BenchPath::Muster, "muster-00000", 3);
        let upstream = gang_manifest(BenchPath::MusterUpstream, "muster-upstream-00000", 3);
        // The upstream-mode MusterJob is the muster one, recorded as upstream.
        let mut recorded = muster.clone();
        recorded["metadata"] = json!({"name": "muster-upstream-00000",
            "annotations": {muster_api::SCHEDULING_API_ANNOTATION: "upstream"}});
        assert_eq!(upstream, recorded);
        assert!(muster["metadata"].get("annotations").is_none(), "the muster path takes muster's default");
        assert_eq!(serde_json::to_value(BenchPath::MusterUpstream).expect("json"), "muster-upstream");
        for m in [&plain, &gang, &muster] {
            assert_eq!(m["spec"]["template"], pod_template());
            assert_eq!((m["spec"]["parallelism"].as_u64(), m["spec"]["completions"].as_u64()), (Some(3), Some(3)));
        }
        assert!(plain["spec"].get("scheduling").is_none());
        assert_eq!(gang["spec"]["scheduling"]["schedulingPolicy"]["gang"]["minCount"], 3);
        assert_eq!(muster["spec"]["scheduling"]["schedulingPolicy"]["gang"]["minCount"], 3);
        assert_eq!((gang["kind"].as_str(), muster["kind"].as_str()), (Some("Job"), Some("MusterJob")));
        let c = &pod_template()["spec"]["containers"][0]["resources"];
        assert_eq!(c["limits"], json!({"nvidia.com/gpu": "1", "cpu": "100m", "memory": "128Mi"}));
        assert_eq!(c["requests"], c["limits"]);
        // The typed Job and MusterJob keep what the manifest says.
        let job: Job = serde_json::from_value(gang).expect("job");
        assert!(job.spec.and_then(|s| s.scheduling).is_some());
        let mj: MusterJob = serde_json::from_value(muster).expect("musterjob");
        assert_eq!(mj.spec.parallelism, 3);
    }

    #[test]
    fn the_table_says_what_failed() {
        let report = Report {
            nodes: 100,
            gangs: 2,
            size: 3,
            paths: vec![
                PathReport {
                    path: Some(BenchPath::Plain),
                    pods_expected: 6,
                    pods_seen: 6,
                    throughput: Throughput { pods_bound: 6, bound_per_s: Some(12.0), ..Throughput::default() },
                    ratio_to_plain: Some(1.0),
                    ..PathReport::default()
                },
                PathReport {
                    path: Some(BenchPath::Gang),
                    pods_expected: 6,
                    pods_seen: 6,
                    pods_with_scheduling_group: 0,
                    throughput: Throughput { pods_bound: 6, ..Throughput::default() },
                    ..PathReport::default()
                },
                PathReport {
                    path: Some(BenchPath::Muster),
                    pods_expected: 6,
                    pods_seen: 6,
                    timed_out: true,
                    throughput: Throughput { pods_bound: 3, ..Throughput::default() },
                    muster: Some(MusterNumbers {
                        rss_peak_mib: Some(50.0),
                        cycles: Some(4.0),
                        heap_allocated_mib: Some(20.0),
                        webhook_mean_ms: Some(3.5),
                        ..MusterNumbers::default()
                    }),
                    ..PathReport::default()
                },
            ],
            cluster_pods: Some(15),
            cluster_nodes: Some(100),
            ..Report::default()
        };
        let table = format_table(&report);
        let line = |p: &str| table.lines().find(|l| l.starts_with(p)).unwrap_or_default().to_string();
        assert!(
            line("plain ").contains("6/6") && line("plain ").contains("12.0") && line("plain ").ends_with("ok"),
            "{table}"
        );
        assert!(line("gang ").contains("pods WITHOUT schedulingGroup"), "{table}");
        assert!(line("muster ").contains("3/6") && line("muster ").contains("TIMED OUT"), "{table}");
        assert!(table.contains("peak RSS 50.0 MiB") && table.contains("admission cycles 4"), "{table}");
        assert!(table.contains("20.0 MiB allocated") && table.contains("mean 3.5 ms"), "{table}");
        assert!(table.contains("15 pods, 100 nodes"), "{table}");
        assert!(report.paths[0].ok() && !report.paths[1].ok() && !report.paths[2].ok());
    }
}

//! Every number a run measured, per path and in all (what `--json-out` writes): throughput,
//! the API server's and the machine's work, muster's own cost, and whether a path is ok.

use serde::{Deserialize, Serialize};

use super::BenchPath;
use super::stats::{IndexTimes, Throughput, UserLatency, ratio};

/// muster's own cost during a path.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MusterNumbers {
    /// The largest VmRSS sampled during the path (every 200 ms), MiB.
    pub rss_peak_mib: Option<f64>,
    /// The peak sample's anonymous memory (heap, stacks) and file pages (the binary's code and
    /// data as the kernel mapped them in), MiB: RssAnon and RssFile of the same sample.
    pub rss_anon_mib: Option<f64>,
    pub rss_file_mib: Option<f64>,
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
    /// MusterJob reconciles run during the path (delta of
    /// muster_reconciles_total{controller="job"}).
    pub job_reconciles: Option<f64>,
    /// Webhook reviews muster answered during the path (each MusterJob create is one
    /// validation and one mutation), and their mean duration, ms.
    pub webhook_reviews: Option<f64>,
    pub webhook_mean_ms: Option<f64>,
    /// The allocator's live bytes at the path's end, MiB (`muster_heap_bytes{kind="allocated"}`),
    /// and its resident bytes: what of RSS is data, and what the allocator holds.
    pub heap_allocated_mib: Option<f64>,
    pub heap_resident_mib: Option<f64>,
    /// Events muster dropped during the path (its event writers' queues were full).
    pub events_dropped: Option<f64>,
}

/// Every number of one path.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
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
    /// Seconds from the path's last bind until the API server was quiet (its writes, a cluster
    /// at rest's left out, under `QUIET_WRITES_PER_S` over a window; at most `--settle-timeout`):
    /// the next path starts then, so it does not pay for this one's tail. None: not waited for.
    #[serde(default)]
    pub settle_s: Option<f64>,
    /// The writes the API server served in that time, by kind, largest first (pods turning
    /// ready, the statuses that follow them): what the path costs after its last bind.
    #[serde(default)]
    pub tail_writes: Vec<(String, f64)>,
    /// When the bound pods got their GPU indices, against their bind (the pod watch runs
    /// until the path's tail is over, so indices written after the last bind are seen).
    #[serde(default)]
    pub gpu_indices: Option<IndexTimes>,
    /// muster path only.
    pub muster: Option<MusterNumbers>,
    /// The ordinary user's ConfigMap creates during the path (None without `--user-kubeconfig`).
    pub user: Option<UserLatency>,
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
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
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
    /// Who the ordinary user was (`system:serviceaccount:<ns>:<name>`), when there was one.
    pub user_identity: Option<String>,
    /// Milliseconds between the user's creates (`--user-interval-ms`; None in reports written
    /// before it could be set, when it was a second).
    pub user_interval_ms: Option<u64>,
}

/// Milliseconds between the ordinary user's requests unless `--user-interval-ms` says otherwise
/// (one a second, as the throughput goal counts them).
pub const DEFAULT_USER_INTERVAL_MS: u64 = 1000;

impl Report {
    /// Milliseconds between the user's requests in this run (a report without the number was
    /// written when they came once a second).
    pub fn user_every_ms(&self) -> u64 {
        self.user_interval_ms.unwrap_or(DEFAULT_USER_INTERVAL_MS)
    }

    /// Relates every path to the plain path of the same report: its pods bound per second and
    /// its user's p99, each as a ratio (None without a plain path, or for a path without that
    /// number).
    pub fn relate_to_plain(&mut self) {
        let plain = self.paths.iter().find(|p| p.path == Some(BenchPath::Plain));
        let pace = plain.and_then(|p| p.throughput.bound_per_s);
        let user_p99 = plain.and_then(|p| p.user.as_ref()).and_then(|u| u.p99_s);
        for p in &mut self.paths {
            p.ratio_to_plain = ratio(p.throughput.bound_per_s, pace);
            if let Some(u) = &mut p.user {
                u.p99_vs_plain = ratio(u.p99_s, user_p99);
            }
        }
    }
}

/// PURE: one report of the paths of `parts`, in their order (`BENCH_FRESH=1`: each path ran
/// alone, on a control plane of its own), related to the plain path among them. The run's own
/// numbers (nodes, gangs, the node creates) are the first part's; the pods and nodes left at the
/// end are the last part's. Parts of different sizes (nodes, gangs, pods per gang) cannot be
/// related: that is an error, as is a path that two parts both ran.
pub fn merge(parts: Vec<Report>) -> Result<Report, String> {
    let mut parts = parts.into_iter();
    let mut merged = parts.next().ok_or("no report to merge")?;
    for part in parts {
        let (have, got) = ((merged.nodes, merged.gangs, merged.size), (part.nodes, part.gangs, part.size));
        if have != got {
            return Err(format!(
                "a report of {} nodes, {} gangs of {} cannot be related to one of {} nodes, {} gangs of {}",
                got.0, got.1, got.2, have.0, have.1, have.2
            ));
        }
        if part.user_every_ms() != merged.user_every_ms() {
            // A p99 over more samples is another measure: the users' tails cannot be related.
            return Err(format!(
                "a report whose user made a request every {} ms cannot be related to one with every {} ms",
                part.user_every_ms(),
                merged.user_every_ms()
            ));
        }
        for p in part.paths {
            if merged.paths.iter().any(|m| m.path == p.path) {
                return Err(format!("path {} is in two of the reports", p.path.map_or("?", BenchPath::name)));
            }
            merged.paths.push(p);
        }
        (merged.cluster_pods, merged.cluster_nodes) = (part.cluster_pods, part.cluster_nodes);
    }
    merged.relate_to_plain();
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(which: BenchPath, pods_per_s: f64, user_p99_s: f64) -> PathReport {
        PathReport {
            path: Some(which),
            throughput: Throughput { bound_per_s: Some(pods_per_s), ..Throughput::default() },
            user: Some(UserLatency { p99_s: Some(user_p99_s), ..UserLatency::default() }),
            ..PathReport::default()
        }
    }

    fn report(paths: Vec<PathReport>, pods_left: usize) -> Report {
        Report { nodes: 5000, gangs: 1000, size: 3, paths, cluster_pods: Some(pods_left), ..Report::default() }
    }

    #[test]
    fn parts_run_apart_are_related_to_the_plain_path_of_another_part() {
        let parts = vec![
            report(vec![path(BenchPath::Muster, 60.0, 0.2)], 3000),
            report(vec![path(BenchPath::Plain, 75.0, 0.1)], 3000),
            report(vec![path(BenchPath::Gang, 50.0, 0.25)], 3000),
        ];
        let merged = merge(parts).expect("merged");
        let order: Vec<_> = merged.paths.iter().map(|p| p.path).collect();
        assert_eq!(order, [Some(BenchPath::Muster), Some(BenchPath::Plain), Some(BenchPath::Gang)]);
        let ratios: Vec<_> = merged.paths.iter().map(|p| p.ratio_to_plain).collect();
        assert_eq!(ratios, [Some(0.8), Some(1.0), Some(50.0 / 75.0)]);
        let user: Vec<_> = merged.paths.iter().map(|p| p.user.as_ref().and_then(|u| u.p99_vs_plain)).collect();
        assert_eq!(user, [Some(2.0), Some(1.0), Some(2.5)]);
        assert_eq!(merged.cluster_pods, Some(3000));
    }

    #[test]
    fn without_a_plain_path_nothing_is_related() {
        let merged = merge(vec![report(vec![path(BenchPath::Muster, 60.0, 0.2)], 0)]).expect("merged");
        assert_eq!(merged.paths[0].ratio_to_plain, None);
        assert_eq!(merged.paths[0].user.as_ref().and_then(|u| u.p99_vs_plain), None);
    }

    #[test]
    fn parts_of_other_sizes_or_the_same_path_twice_are_refused() {
        let mut small = report(vec![path(BenchPath::Plain, 75.0, 0.1)], 0);
        small.nodes = 100;
        let err = merge(vec![report(vec![path(BenchPath::Muster, 60.0, 0.2)], 0), small]).unwrap_err();
        assert!(err.contains("100 nodes") && err.contains("5000 nodes"), "{err}");
        let twice = vec![
            report(vec![path(BenchPath::Plain, 75.0, 0.1)], 0),
            report(vec![path(BenchPath::Plain, 70.0, 0.1)], 0),
        ];
        assert!(merge(twice).unwrap_err().contains("path plain is in two"));
        assert!(merge(Vec::new()).is_err());
    }

    #[test]
    fn parts_whose_user_asked_at_other_rates_are_refused() {
        let with_interval = |ms: Option<u64>, which: BenchPath| {
            let mut r = report(vec![path(which, 60.0, 0.2)], 0);
            r.user_interval_ms = ms;
            r
        };
        let err = merge(vec![with_interval(Some(200), BenchPath::Muster), with_interval(Some(1000), BenchPath::Plain)])
            .unwrap_err();
        assert!(err.contains("every 1000 ms") && err.contains("every 200 ms"), "{err}");
        // A report written before the interval could be set asked once a second.
        let merged = merge(vec![with_interval(None, BenchPath::Muster), with_interval(Some(1000), BenchPath::Plain)])
            .expect("one a second both");
        assert_eq!(merged.paths.len(), 2);
        let old = r#"{"nodes":5,"gangs":1,"size":3,"concurrency":1,"rate":0.0,"timeout_s":1,"nodes_create_s":0.0,
            "nodes_ready_s":0.0,"paths":[],"cluster_pods":null,"cluster_nodes":null,"user_identity":null}"#;
        let read: Report = serde_json::from_str(old).expect("a report without the interval reads");
        assert_eq!(read.user_interval_ms, None);
    }

    #[test]
    fn a_report_reads_back_what_it_wrote() {
        let mut written =
            report(vec![path(BenchPath::Plain, 75.0, 0.1), path(BenchPath::MusterUpstream, 50.0, 0.3)], 6000);
        written.relate_to_plain();
        let text = serde_json::to_string(&written).expect("json");
        let read: Report = serde_json::from_str(&text).expect("read back");
        assert_eq!(read, written);
    }
}

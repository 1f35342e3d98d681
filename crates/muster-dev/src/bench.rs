//! `muster dev bench`: the side-by-side scale harness of `make bench-e2e` (hack/bench-e2e.sh).
//! On one cluster with kwok GPU nodes it creates the same gangs three ways (plain batch/v1 Jobs,
//! Jobs with upstream gang scheduling, MusterJobs), one path after the other, and measures from
//! the client side, with one pod watch per namespace, when each pod was first seen, ungated and
//! bound. The arithmetic (rates, percentiles, per-gang admission latency, the table, the /proc
//! and /metrics parsers) is pure and sits apart from the shell that talks to the cluster:
//!
//! - pure: [`stats`] (percentiles, admission latency, throughput), [`manifests`] (what a path
//!   creates), [`report`] (every number, related to the plain path; reports of paths run apart
//!   joined: `--merge`) and [`table`] (its human summary);
//! - measuring: [`watch`] (the pod watch), [`procfs`] (CPU and memory from /proc),
//!   [`muster_metrics`] and [`apiserver`] (the /metrics of muster and of the API server), [`user`]
//!   (an ordinary user's ConfigMap create every second by default, timed: what the path costs
//!   other clients);
//! - driving: [`setup`] (nodes and namespaces), [`path`] (one path) and [`command`] (the run).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

mod apiserver;
mod command;
mod manifests;
mod muster_metrics;
mod path;
mod procfs;
mod report;
mod setup;
mod stats;
mod table;
mod user;
mod watch;

pub use command::run;

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
    /// After a path's last bind, wait up to this many seconds for the API server to be quiet
    /// (the path's pods turning ready and the statuses that follow, written) before the next
    /// path starts; those writes are reported as the path's tail. 0: start the next at once.
    #[arg(long, default_value_t = 120)]
    settle_timeout: u64,
    /// After each path (its tail settled), delete its jobs, then its namespace once no pod is
    /// left, and wait until it is gone and the API server is quiet again, so every path starts
    /// on a cluster that holds only the nodes: the later paths then pay no more for the earlier paths' pods (kube-scheduler,
    /// kwok, the API server's caches and muster all cost more per event with more pods). The
    /// default keeps them, as a cluster filling up.
    #[arg(long)]
    clean_between: bool,
    /// Write every number as JSON to this file.
    #[arg(long)]
    json_out: Option<PathBuf>,
    /// Kubeconfig of an ordinary user (not exempt from API Priority and Fairness, not muster):
    /// during each path it creates a ConfigMap every --user-interval-ms in --user-namespace,
    /// and the latency of those requests is reported per path.
    #[arg(long)]
    user_kubeconfig: Option<PathBuf>,
    /// Milliseconds between the user's creates (1000: one a second, as the throughput goal
    /// counts them). Shorter gives more samples per path, so its p99 is more than its slowest
    /// one or two requests (a 45 s path at one a second has 45).
    #[arg(long, default_value_t = report::DEFAULT_USER_INTERVAL_MS, value_parser = clap::value_parser!(u64).range(50..=60_000))]
    user_interval_ms: u64,
    /// The namespace the user's ConfigMaps are created in (it may create there).
    #[arg(long, default_value = "bench-user")]
    user_namespace: String,
    /// Relate paths that ran apart instead of running any: read these reports (each written
    /// by --json-out, e.g. one per path, each on a control plane of its own: `BENCH_FRESH=1`),
    /// join their paths in the order given, relate them to the plain path among them, print the
    /// table and write --json-out. No cluster is touched.
    #[arg(long, num_args = 1..)]
    merge: Vec<PathBuf>,
    /// Name prefix of the nodes the bench creates.
    #[arg(long, default_value = "bench-gpu-")]
    node_prefix: String,
}

/// How a path's gangs are created.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
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

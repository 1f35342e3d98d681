//! `muster dev agent-load`: what N node agents writing GPU health cost the cluster's watchers.
//! On a control plane with N kwok GPU nodes (made as `muster dev bench` makes them), it plays N
//! agents each writing a health sample every P seconds for D seconds, either as the old merge
//! patch of the `gpu.muster.dev/health` annotation on the Node (`--target node`) or as the
//! server-side apply of the node's NodeGPUReport (`--target report`), and reads the API
//! server's `/metrics` before and after: per resource, the watch events it sent
//! (`apiserver_watch_events_total`) and their bytes (`apiserver_watch_events_sizes` sum), per
//! second. Every write goes to every watcher of its resource: Node writes reach kube-scheduler,
//! kube-controller-manager's informers, kwok and (in a real cluster) kube-proxy, CNI agents,
//! monitoring...; a report reaches muster alone, which this command stands for with one watch
//! of the reports of its own.
//!
//! The parser of `/metrics` ([`watch_traffic`]) is pure; the rest talks to the cluster.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use muster_api::{GPU_HEALTH_ANNOTATION, NodeGPUReport};
use serde_json::json;

use crate::{FakeGpuNodes, add_nodes, client};

/// Label on every node this command makes.
const LOAD_NODE_LABEL: &str = "agent-load.muster.dev/node";
/// Field manager of the simulated agents (the real agent's).
const AGENT_MANAGER: &str = "muster-node-agent";

/// Where the simulated agents write health.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Target {
    /// The old way: a merge patch of the Node's `gpu.muster.dev/health` annotation.
    Node,
    /// The new way: server-side apply of the node's NodeGPUReport.
    Report,
}

/// Arguments of `muster dev agent-load`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Kubeconfig to use (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// How many kwok GPU nodes (and simulated agents).
    #[arg(long, default_value_t = 1000)]
    nodes: u32,
    /// Node name prefix.
    #[arg(long, default_value = "agent-load-")]
    node_prefix: String,
    /// Seconds between two health writes of one agent (the agent's --health-refresh).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    period: u64,
    /// Seconds each target is run.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    duration: u64,
    /// Where to write, one run each, in this order.
    #[arg(long, value_enum, num_args = 1.., value_delimiter = ',', default_values_t = [Target::Node, Target::Report])]
    target: Vec<Target>,
    /// Writes in flight at most.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
}

/// What `/metrics` said of one resource's watch traffic: events sent and their bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Traffic {
    /// `apiserver_watch_events_total`, summed.
    pub events: f64,
    /// `apiserver_watch_events_sizes_sum`, summed.
    pub bytes: f64,
}

/// PURE: per resource (its `resource` label, or `kind` in API servers that label by kind), the
/// watch events the API server sent and their bytes, from its `/metrics` text.
pub fn watch_traffic(text: &str) -> BTreeMap<String, Traffic> {
    let mut out: BTreeMap<String, Traffic> = BTreeMap::new();
    for sample in crate::exposition::samples(text) {
        let events = match sample.name {
            "apiserver_watch_events_total" => true,
            "apiserver_watch_events_sizes_sum" => false,
            _ => continue,
        };
        let Some(resource) = sample.label("resource").or_else(|| sample.label("kind")) else { continue };
        let t = out.entry(resource.to_lowercase()).or_default();
        if events {
            t.events += sample.value;
        } else {
            t.bytes += sample.value;
        }
    }
    out
}

/// PURE: per resource, what `after` counts more than `before`, per second over `seconds`.
pub fn traffic_rate(
    before: &BTreeMap<String, Traffic>,
    after: &BTreeMap<String, Traffic>,
    seconds: f64,
) -> BTreeMap<String, Traffic> {
    after
        .iter()
        .map(|(k, a)| {
            let b = before.get(k).copied().unwrap_or_default();
            (k.clone(), Traffic { events: (a.events - b.events) / seconds, bytes: (a.bytes - b.bytes) / seconds })
        })
        .collect()
}

/// PURE: a health sample of 8 GPUs as the agent writes it (`gpu.muster.dev/health` version 1),
/// varied by `round` so that each write changes the object.
pub fn health_sample(round: u64, observed_at: &str) -> serde_json::Value {
    let gpus: Vec<serde_json::Value> = (0..8u64)
        .map(|i| {
            json!({"index": i, "temperatureC": 40 + (round + i) % 30, "memoryFreeFraction": 0.5,
                "utilization": ((round + i) % 100) as f64 / 100.0})
        })
        .collect();
    json!({"version": 1, "observedAt": observed_at, "gpus": gpus})
}

/// Runs `muster dev agent-load`.
pub fn run(args: Args) -> ExitCode {
    crate::block_on(async move {
        match run_async(args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("agent-load: error: {e:#}");
                ExitCode::from(1)
            }
        }
    })
}

async fn run_async(args: Args) -> anyhow::Result<()> {
    let client = client(args.kubeconfig.as_deref()).await?;
    let t0 = Instant::now();
    // 16 runs of consecutive indices made at once, as `muster dev bench` makes its nodes.
    let per = args.nodes.div_ceil(16).max(1);
    let chunks = (0..args.nodes).step_by(per as usize).map(|start| (start, per.min(args.nodes - start)));
    let creates = chunks.map(|(start_index, count)| {
        let spec = FakeGpuNodes {
            count,
            start_index,
            prefix: args.node_prefix.clone(),
            gpus: 8,
            labels: vec![(LOAD_NODE_LABEL.to_string(), "true".to_string())],
            ..FakeGpuNodes::default()
        };
        let client = client.clone();
        async move { add_nodes(&client, &spec).await }
    });
    futures::future::try_join_all(creates).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let listed = nodes.list(&ListParams::default().labels(&format!("{LOAD_NODE_LABEL}=true"))).await?;
    let targets: Vec<(String, String)> = listed
        .items
        .iter()
        .filter_map(|n| Some((n.metadata.name.clone()?, n.metadata.uid.clone()?)))
        .filter(|(name, _)| name.starts_with(&args.node_prefix))
        .collect();
    eprintln!("agent-load: {} nodes in {:.1} s", targets.len(), t0.elapsed().as_secs_f64());
    // muster's watch of the reports (the reports' only reader), kept open for the whole run.
    let reports: Api<NodeGPUReport> = Api::all(client.clone());
    let seen = Arc::new(AtomicU64::new(0));
    let watch = {
        let (reports, seen) = (reports.clone(), seen.clone());
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(watcher::watcher(reports, watcher::Config::default()));
            while let Some(ev) = stream.next().await {
                if ev.is_ok() {
                    seen.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;

    let mut results = Vec::new();
    for &target in &args.target {
        let before = watch_traffic(&metrics(&client).await?);
        let started = Instant::now();
        let (writes, errors) = play(&client, &args, &targets, target).await;
        // Let the last events reach the watchers.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let seconds = started.elapsed().as_secs_f64();
        let after = watch_traffic(&metrics(&client).await?);
        let rate = traffic_rate(&before, &after, seconds);
        eprintln!("agent-load: --target {target:?}: {writes} writes ({errors} failed) in {seconds:.1} s");
        results.push((target, writes, errors, seconds, rate));
    }
    watch.abort();

    println!(
        "agent-load: {} nodes, a health write per node every {} s, {} s per target",
        targets.len(),
        args.period,
        args.duration
    );
    println!(
        "{:<8} {:>10} {:>8} | {:>14} {:>14} | {:>14} {:>14}",
        "target", "writes/s", "failed", "nodes ev/s", "nodes KiB/s", "reports ev/s", "reports KiB/s"
    );
    for (target, writes, errors, seconds, rate) in &results {
        let of = |r: &str| rate.get(r).copied().unwrap_or_default();
        let (n, r) = (of("nodes"), of("nodegpureports"));
        println!(
            "{:<8} {:>10.1} {:>8} | {:>14.1} {:>14.1} | {:>14.1} {:>14.1}",
            format!("{target:?}").to_lowercase(),
            *writes as f64 / seconds,
            errors,
            n.events,
            n.bytes / 1024.0,
            r.events,
            r.bytes / 1024.0
        );
    }
    Ok(())
}

/// The API server's `/metrics` text.
async fn metrics(client: &Client) -> anyhow::Result<String> {
    let request = axum::http::Request::get("/metrics").body(Vec::new())?;
    Ok(client.request_text(request).await?)
}

/// N agents writing every `period`, spread evenly over it, for `duration`: (writes, failures).
async fn play(client: &Client, args: &Args, targets: &[(String, String)], target: Target) -> (u64, u64) {
    if targets.is_empty() {
        return (0, 0);
    }
    let step = Duration::from_secs_f64(args.period as f64 / targets.len() as f64);
    let start = tokio::time::Instant::now();
    let end = start + Duration::from_secs(args.duration);
    let limit = Arc::new(tokio::sync::Semaphore::new(args.concurrency.max(1)));
    let (writes, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut tasks = tokio::task::JoinSet::new();
    for k in 0u64.. {
        let at = start + step.mul_f64(k as f64);
        if at >= end {
            break;
        }
        tokio::time::sleep_until(at).await;
        let Ok(permit) = limit.clone().acquire_owned().await else { break };
        let (name, uid) = targets[(k % targets.len() as u64) as usize].clone();
        let round = k / targets.len() as u64;
        let (client, writes, errors) = (client.clone(), writes.clone(), errors.clone());
        tasks.spawn(async move {
            let observed = k8s_openapi::jiff::Timestamp::now().to_string();
            let health = health_sample(round, &observed);
            let result = match target {
                Target::Node => {
                    let nodes: Api<Node> = Api::all(client);
                    let body = json!({"metadata": {"annotations": {GPU_HEALTH_ANNOTATION: health.to_string()}}});
                    let params = PatchParams { field_manager: Some(AGENT_MANAGER.into()), ..PatchParams::default() };
                    nodes.patch(&name, &params, &Patch::Merge(&body)).await.map(|_| ())
                }
                Target::Report => {
                    let reports: Api<NodeGPUReport> = Api::all(client);
                    let body = json!({
                        "apiVersion": "gpu.muster.dev/v1alpha1",
                        "kind": "NodeGPUReport",
                        "metadata": {"name": name,
                            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid}]},
                        "spec": {"gpus": 8, "pods": 0, "health": health,
                            "assigned": {"version": 2, "resource": "nvidia.com/gpu", "pods": {}}},
                    });
                    let params = PatchParams::apply(AGENT_MANAGER).force();
                    reports.patch(&name, &params, &Patch::Apply(&body)).await.map(|_| ())
                }
            };
            match result {
                Ok(()) => writes.fetch_add(1, Ordering::Relaxed),
                Err(e) => {
                    if errors.fetch_add(1, Ordering::Relaxed) == 0 {
                        eprintln!("agent-load: first failed write ({name}): {e}");
                    }
                    0
                }
            };
            drop(permit);
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    (writes.load(Ordering::Relaxed), errors.load(Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_traffic_sums_events_and_bytes_per_resource() {
        let text = r#"# HELP apiserver_watch_events_total x
apiserver_watch_events_total{component="apiserver",group="",resource="nodes",version="v1"} 100
apiserver_watch_events_total{component="apiserver",group="gpu.muster.dev",resource="nodegpureports",version="v1alpha1"} 7
apiserver_watch_events_sizes_bucket{group="",resource="nodes",version="v1",le="1024"} 3
apiserver_watch_events_sizes_sum{group="",resource="nodes",version="v1"} 4.5e+06
apiserver_watch_events_sizes_count{group="",resource="nodes",version="v1"} 100
apiserver_watch_events_total{group="",kind="Pod",version="v1"} 5
apiserver_request_total{resource="nodes",verb="PATCH"} 9
"#;
        let t = watch_traffic(text);
        assert_eq!(t["nodes"], Traffic { events: 100.0, bytes: 4.5e6 });
        assert_eq!(t["nodegpureports"], Traffic { events: 7.0, bytes: 0.0 });
        assert_eq!(t["pod"].events, 5.0, "an API server labelling by kind");
        let later = watch_traffic(&text.replace("} 100\n", "} 300\n"));
        let rate = traffic_rate(&t, &later, 10.0);
        assert_eq!(rate["nodes"].events, 20.0);
        assert_eq!(rate["nodegpureports"].events, 0.0);
    }

    #[test]
    fn a_health_sample_is_the_agents_shape_and_changes_every_round() {
        let a = health_sample(0, "2026-01-01T00:00:00Z");
        let b = health_sample(1, "2026-01-01T00:00:00Z");
        assert_ne!(a, b);
        let parsed = muster_core::devices::report::HealthAnnotation::parse_value(&a, "health");
        assert_eq!(parsed.map(|m| m.gpus.len()), Ok(8));
    }
}

//! What the bench makes before any path runs: its kwok GPU nodes (created in runs, then waited
//! on until Ready) and each path's fresh namespace.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

use super::{Args, BenchError};
use crate::{FakeGpuNodes, add_nodes};

/// Label on every node the bench creates (the Ready wait lists by it).
pub const BENCH_NODE_LABEL: &str = "bench.muster.dev/node";

pub(super) const GPUS_PER_NODE: u32 = 8;

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

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Creates the bench's nodes, `concurrency` runs of them at once, and waits until kwok
/// reports them all Ready. Returns (seconds creating, seconds until all Ready).
pub(super) async fn make_nodes(client: &Client, args: &Args) -> Result<(f64, f64), BenchError> {
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
pub(super) async fn prepare_namespace(client: &Client, ns: &str) -> Result<(), BenchError> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}

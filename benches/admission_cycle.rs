//! What an admission cycle costs on 5,000 GPU nodes running 10,000 pods (2 per node, a third
//! of them muster's, the rest another workload's), the cluster state kept from watch events
//! against the full rebuild every cycle did before:
//! - the rebuild (`Snapshot::from_cluster`: every node and pod read again);
//! - one pod event (a pod bound, then unbound again: two changes per iteration, halved) and
//!   one node event applied to the kept state (a heartbeat that changes nothing, a relabel);
//! - the snapshot assembled from the kept state (a cycle with decisions to make);
//! - a cycle with nothing to do: no event changed anything and no timer is due;
//! - the GPU part of a cycle with decisions to make, every node carrying an 8-GPU H100
//!   topology annotation and every pod one GPU with its indices: each node's GPU model
//!   (`node_gpus_of` over the kept `GpuNode`s, as every cycle did before; `GpuModels::update`
//!   with no node changed, as a cycle does now, and with every node changed, as after a
//!   relist) and the device pass's plan over the kept `GpuPod`s, nothing to assign: the
//!   ledger rebuilt (as every cycle did before) and kept (`plan_kept` with no pod changed, as
//!   a cycle does now).
//!
//! Node names share a long prefix and UIDs are UUID-shaped, as in a cluster: with short
//! names, maps ordered by them look cheaper than they are.
//!
//! `cargo bench --bench admission_cycle` prints the time of each.

use std::collections::{BTreeMap, HashMap};
use std::hint::black_box;
use std::time::{Duration, Instant, SystemTime};

use criterion::{Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::{
    Container, Node, NodeSpec, NodeStatus, Pod, PodSpec, PodStatus, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use muster::crds::{GPU_INDICES_ANNOTATION, GPU_RESOURCE, GPU_TOPOLOGY_ANNOTATION, HOSTNAME_LABEL, POD_GROUP_LABEL};
use muster::devices::chooser::{FitCache, node_gpus_of};
use muster::devices::models::GpuModels;
use muster::devices::{HealthThresholds, MetricsCache};
use muster::scheduler::{ClusterState, Quiet, Snapshot};

const NODES: usize = 5_000;
const PODS_PER_NODE: usize = 2;

fn quantities(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
    pairs.iter().map(|(k, v)| (k.to_string(), Quantity(v.to_string()))).collect()
}

fn node(i: usize, rack: usize) -> Node {
    let name = node_name(i);
    Node {
        metadata: ObjectMeta {
            annotations: Some([(GPU_TOPOLOGY_ANNOTATION.to_string(), topology_annotation())].into()),
            labels: Some(
                [
                    (HOSTNAME_LABEL.to_string(), name.clone()),
                    ("topology.muster.dev/rack".to_string(), format!("rack-{rack:03}")),
                    ("topology.kubernetes.io/zone".to_string(), format!("zone-{}", i % 5)),
                ]
                .into(),
            ),
            name: Some(name),
            ..Default::default()
        },
        spec: Some(NodeSpec::default()),
        status: Some(NodeStatus {
            allocatable: Some(quantities(&[("cpu", "128"), ("memory", "1Ti"), ("pods", "110"), (GPU_RESOURCE, "8")])),
            ..Default::default()
        }),
    }
}

/// Named like the bench's kwok nodes: a long prefix every name shares.
fn node_name(i: usize) -> String {
    format!("kwok-gpu-{i:05}")
}

/// A UID shaped like the API server's (a random UUID), drawn from the pod's place.
fn uid(i: usize, p: usize) -> String {
    let mut z = ((i * PODS_PER_NODE + p) as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    let (a, b) = (z ^ (z >> 31), z.rotate_left(17));
    format!("{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}", a >> 32, a & 0xffff, b & 0xfff, (b >> 12) & 0xfff, b >> 16)
}

fn topology_annotation() -> String {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| muster::devices::fixtures::dgx_h100().to_annotation().to_json()).clone()
}

fn pod(i: usize, p: usize, bound: bool) -> Pod {
    let ours = (i + p).is_multiple_of(3);
    let mut labels = BTreeMap::from([("app".to_string(), format!("job-{}", i / 3))]);
    if ours {
        labels.insert(POD_GROUP_LABEL.to_string(), format!("job-{}", i / 3));
    }
    Pod {
        metadata: ObjectMeta {
            name: Some(format!("job-{i}-{p}")),
            namespace: Some(if ours { "train" } else { "other" }.into()),
            labels: Some(labels),
            annotations: Some([(GPU_INDICES_ANNOTATION.to_string(), p.to_string())].into()),
            uid: Some(uid(i, p)),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: bound.then(|| node_name(i)),
            containers: vec![Container {
                name: "main".into(),
                resources: Some(ResourceRequirements {
                    requests: Some(quantities(&[("cpu", "12"), ("memory", "96Gi"), (GPU_RESOURCE, "1")])),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: Some(PodStatus { phase: Some("Running".into()), ..Default::default() }),
    }
}

fn bench(c: &mut Criterion) {
    let nodes: Vec<Node> = (0..NODES).map(|i| node(i, i / 40)).collect();
    let pods: Vec<Pod> = (0..NODES).flat_map(|i| (0..PODS_PER_NODE).map(move |p| pod(i, p, true))).collect();
    let mut state = ClusterState::from_lists(&nodes, &pods);
    assert_eq!(state.len(), (NODES, NODES * PODS_PER_NODE));

    c.bench_function("rebuild: snapshot from 5,000 nodes and 10,000 pods (every cycle before)", |b| {
        b.iter(|| black_box(Snapshot::from_cluster(&nodes, &pods)))
    });
    c.bench_function("kept state: snapshot assembled (a cycle with decisions to make)", |b| {
        b.iter(|| black_box(state.snapshot()))
    });
    let (bound, pending) = (pod(2_500, 0, true), pod(2_500, 0, false));
    c.bench_function("kept state: one pod event (bound or unbound)", |b| {
        b.iter(|| {
            assert!(state.apply_pod(black_box(&pending)));
            assert!(state.apply_pod(black_box(&bound)));
        })
    });
    let (same, relabelled) = (node(2_500, 62), node(2_500, 63));
    c.bench_function("kept state: one node event, nothing placement reads changed (a heartbeat)", |b| {
        b.iter(|| assert!(!state.apply_node(black_box(&same))))
    });
    c.bench_function("kept state: one node event, relabelled (twice per iteration)", |b| {
        b.iter(|| {
            assert!(state.apply_node(black_box(&relabelled)));
            assert!(state.apply_node(black_box(&same)));
        })
    });
    let (gpu_nodes, gpu_pods) = (state.gpu_nodes(), state.gpu_pods());
    assert_eq!((gpu_nodes.len(), gpu_pods.len()), (NODES, NODES * PODS_PER_NODE));
    let (published, metrics) = (HashMap::new(), MetricsCache::new(Duration::from_secs(30)));
    let (thresholds, now) = (HealthThresholds::default(), SystemTime::now());
    let gpus_of = || {
        let kept = gpu_nodes.iter().map(|(name, g)| (name.as_str(), &**g));
        node_gpus_of(kept, &published, &metrics, &thresholds, now)
    };
    let gpus = gpus_of();
    assert!(gpus.values().all(|g| g.topology_problem.is_none()), "every topology read");
    c.bench_function("GPU state: 5,000 nodes' GPU models from the kept nodes (each cycle before)", |b| {
        b.iter(|| black_box(gpus_of()))
    });
    let (mut models, kinds) = (GpuModels::default(), FitCache::default());
    let kept = || gpu_nodes.iter().map(|(name, g)| (name.as_str(), g));
    assert!(models.update(kept(), &published, &metrics, &thresholds, now, &kinds));
    c.bench_function("GPU state: 5,000 nodes' GPU models kept, no node changed (each cycle)", |b| {
        b.iter(|| assert!(!models.update(kept(), &published, &metrics, &thresholds, now, &kinds)))
    });
    let changed = state.gpu_nodes();
    c.bench_function("GPU state: 5,000 nodes' GPU models kept, every node changed (a relist)", |b| {
        b.iter(|| {
            // Every node a new `Arc` (as a relist makes), the model the same: each is built
            // again and compared.
            let fresh: Vec<(String, std::sync::Arc<muster::devices::chooser::GpuNode>)> =
                changed.iter().map(|(n, g)| (n.clone(), std::sync::Arc::new((**g).clone()))).collect();
            black_box(models.update(
                fresh.iter().map(|(n, g)| (n.as_str(), g)),
                &published,
                &metrics,
                &thresholds,
                now,
                &kinds,
            ))
        })
    });
    let snapshot = state.snapshot();
    let plan = muster::controllers::devices::plan(&gpu_pods, &snapshot, &gpus);
    assert!(plan.assignments.is_empty() && plan.reports.is_empty(), "every pod has its GPUs, no conflict");
    c.bench_function("GPU state: device pass plan over 10,000 GPU pods, ledger rebuilt (each cycle before)", |b| {
        b.iter(|| black_box(muster::controllers::devices::plan(&gpu_pods, &snapshot, &gpus).assignments.len()))
    });
    let mut kept = muster::devices::KeptLedger::default();
    let chosen = HashMap::new();
    let first = muster::controllers::devices::plan_kept(&gpu_pods, &snapshot, &gpus, &chosen, &mut kept);
    assert_eq!(first.ledger, plan.ledger, "the kept ledger is the rebuilt one");
    c.bench_function(
        "GPU state: device pass plan over 10,000 GPU pods, ledger kept, no pod changed (each cycle)",
        |b| {
            b.iter(|| {
                let plan = muster::controllers::devices::plan_kept(&gpu_pods, &snapshot, &gpus, &chosen, &mut kept);
                black_box(plan.assignments.len())
            })
        },
    );
    let mut quiet = Quiet::default();
    let now = Instant::now();
    quiet.cycled(7, state.generation(), None);
    c.bench_function("a cycle with nothing to do (no change, no timer due)", |b| {
        b.iter(|| assert!(quiet.nothing_to_do(black_box(7), black_box(state.generation()), black_box(now))))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! What an admission cycle costs on 5,000 GPU nodes running 10,000 pods (2 per node, a third
//! of them muster's, the rest another workload's), the cluster state kept from watch events
//! against the full rebuild every cycle did before:
//! - the rebuild (`Snapshot::from_cluster`: every node and pod read again);
//! - one pod event (a pod bound, then unbound again: two changes per iteration, halved) and
//!   one node event applied to the kept state (a heartbeat that changes nothing, a relabel);
//! - the snapshot assembled from the kept state (a cycle with decisions to make);
//! - a cycle with nothing to do: no event changed anything and no timer is due.
//!
//! `cargo bench --bench admission_cycle` prints the time of each.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Instant;

use criterion::{Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::{
    Container, Node, NodeSpec, NodeStatus, Pod, PodSpec, PodStatus, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use muster::crds::{GPU_RESOURCE, HOSTNAME_LABEL, POD_GROUP_LABEL};
use muster::scheduler::{ClusterState, Quiet, Snapshot};

const NODES: usize = 5_000;
const PODS_PER_NODE: usize = 2;

fn quantities(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
    pairs.iter().map(|(k, v)| (k.to_string(), Quantity(v.to_string()))).collect()
}

fn node(i: usize, rack: usize) -> Node {
    let name = format!("gpu-{i:05}");
    Node {
        metadata: ObjectMeta {
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
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: bound.then(|| format!("gpu-{i:05}")),
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
    let mut quiet = Quiet::default();
    let now = Instant::now();
    quiet.cycled(7, state.generation(), None);
    c.bench_function("a cycle with nothing to do (no change, no timer due)", |b| {
        b.iter(|| assert!(quiet.nothing_to_do(black_box(7), black_box(state.generation()), black_box(now))))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! Admission placement on a 5,000-node GPU cluster (8 GPUs, 128 cores, 1 TiB per node, about
//! half used): (a) a 3-pod gang, (b) a 1,000-pod gang, each also with a topology constraint
//! (125 racks, 5 zones).
//! The snapshot is built outside the measured loops; its build from Node/Pod objects is
//! measured on its own. Each case runs three times: with the lowest free GPU indices, and
//! with the chooser admission really uses (GPU topology from the node annotation, a third
//! each of NVSwitch, two-socket PCIe and DGX-1 cube-mesh nodes; exact minimum-cost sets and
//! node scores), once with its cache of GPU choices empty (the first decision after muster
//! starts) and once warm (every later decision: the cache outlives admission cycles).
//! Two more gangs have pod rules as distributed training writes them: one pod per node
//! (required anti-affinity on `kubernetes.io/hostname`) and an even spread over the zones
//! (`maxSkew: 1`, DoNotSchedule), so each of their pods is placed one at a time against the
//! others, as kube-scheduler does.
//! `cargo bench --bench placement` prints the time per decision.

mod common;
use common::Sequence;

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::SystemTime;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::{Container, Node, NodeSpec, NodeStatus, Pod, PodSpec, ResourceRequirements, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use muster_api::{ADMISSION_GATE, GPU_RESOURCE, GPU_TOPOLOGY_ANNOTATION, HOSTNAME_LABEL, POD_GROUP_LABEL};
use muster_core::devices::chooser::{TopologyChooser, node_gpus};
use muster_core::devices::{GpuSet, HealthThresholds, MetricsCache, SelectOptions, fixtures};
use muster_core::scheduler::{
    CPU, GroupTree, LeafGroup, LeafPolicy, LowestFreeIndices, MEMORY, PODS, PlaceOptions, PodShape, Resources,
    Snapshot, place,
};

const NODES: usize = 5_000;
const RACK: &str = "topology.muster.dev/rack";
const ZONE: &str = "topology.kubernetes.io/zone";

fn quantities(pairs: &[(&str, String)]) -> BTreeMap<String, Quantity> {
    pairs.iter().map(|(k, v)| (k.to_string(), Quantity(v.clone()))).collect()
}

/// 5,000 nodes in 125 racks of 40 and 5 zones; 1 in 50 tainted for infra. Each node runs
/// 0 to 8 one-GPU pods (4 on average) with 12 cores and 96 GiB each.
fn cluster() -> (Vec<Node>, Vec<Pod>, BTreeMap<String, GpuSet>) {
    let mut seq = Sequence(0x9e37_79b9_7f4a_7c15);
    let mut nodes = Vec::with_capacity(NODES);
    let mut pods = Vec::new();
    let mut gpu_used = BTreeMap::new();
    let topologies: Vec<String> = fixtures::named().iter().map(|(_, _, t)| t.to_annotation().to_json()).collect();
    for i in 0..NODES {
        let name = format!("gpu-{i:05}");
        let labels = [
            (HOSTNAME_LABEL.to_string(), name.clone()),
            (RACK.to_string(), format!("rack-{:03}", i / 40)),
            (ZONE.to_string(), format!("zone-{}", i % 5)),
        ];
        let taints = (i % 50 == 49).then(|| {
            vec![Taint {
                key: "dedicated".into(),
                value: Some("infra".into()),
                effect: "NoSchedule".into(),
                ..Default::default()
            }]
        });
        nodes.push(Node {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(labels.into()),
                annotations: Some(
                    [(GPU_TOPOLOGY_ANNOTATION.to_string(), topologies[i % topologies.len()].clone())].into(),
                ),
                ..Default::default()
            },
            spec: Some(NodeSpec { taints, ..Default::default() }),
            status: Some(NodeStatus {
                allocatable: Some(quantities(&[
                    ("cpu", "128".into()),
                    ("memory", "1Ti".into()),
                    ("pods", "110".into()),
                    (GPU_RESOURCE, "8".into()),
                ])),
                ..Default::default()
            }),
        });
        let running = seq.below(9);
        for p in 0..running {
            pods.push(Pod {
                metadata: ObjectMeta {
                    name: Some(format!("{name}-run-{p}")),
                    namespace: Some("other".into()),
                    labels: Some([(POD_GROUP_LABEL.to_string(), "other".to_string())].into()),
                    ..Default::default()
                },
                spec: Some(PodSpec {
                    node_name: Some(name.clone()),
                    containers: vec![Container {
                        name: "main".into(),
                        resources: Some(ResourceRequirements {
                            requests: Some(quantities(&[
                                ("cpu", "12".into()),
                                ("memory", "96Gi".into()),
                                (GPU_RESOURCE, "1".into()),
                            ])),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
        // The ledger's view: the running pods hold scattered indices.
        let mut used = GpuSet::EMPTY;
        while (used.len() as u64) < running {
            used = used.with(seq.below(8) as usize).unwrap_or(used);
        }
        gpu_used.insert(name, used);
    }
    (nodes, pods, gpu_used)
}

fn snapshot(nodes: &[Node], pods: &[Pod], gpu_used: &BTreeMap<String, GpuSet>) -> Snapshot {
    let mut s = Snapshot::from_cluster(nodes, pods);
    for (node, used) in gpu_used {
        s.set_gpu_used(node, *used);
    }
    s
}

/// A gang of `pods` identical pods, each with `gpus` GPUs and 8 cores and 64 GiB per GPU.
fn gang(pods: usize, gpus: i64, topology: Option<&str>) -> GroupTree {
    let requests = Resources::new().with(CPU, gpus * 8_000).with(MEMORY, gpus * (64 << 30)).with(PODS, 1);
    let shape = PodShape::new(requests.with(GPU_RESOURCE, gpus));
    let mut leaf = LeafGroup::new("train", LeafPolicy::Gang { min_count: u32::try_from(pods).unwrap_or(u32::MAX) });
    leaf.topology_key = topology.map(String::from);
    for i in 0..pods {
        leaf.add_gated(&format!("train-{i:04}"), "", shape.clone());
    }
    GroupTree::new("ml", leaf)
}

/// A gang of `pods` pods with 1 GPU each, one per node and spread evenly over the zones.
fn ruled_gang(pods: usize) -> GroupTree {
    let mut leaf = LeafGroup::new("train", LeafPolicy::Gang { min_count: u32::try_from(pods).unwrap_or(u32::MAX) });
    for i in 0..pods {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("train-{i:04}"), "namespace": "ml", "uid": format!("u{i}"),
                         "labels": {"app": "train", POD_GROUP_LABEL: "train"}},
            "spec": {
                "schedulingGates": [{"name": ADMISSION_GATE}],
                "containers": [{"name": "main", "resources": {"requests": {"cpu": "8", "memory": "64Gi", GPU_RESOURCE: "1"}}}],
                "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": HOSTNAME_LABEL, "labelSelector": {"matchLabels": {"app": "train"}}}]}},
                "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule",
                                               "labelSelector": {"matchLabels": {"app": "train"}}}]
            }
        }))
        .expect("pod");
        leaf.add_pod(&pod);
    }
    GroupTree::new("ml", leaf)
}

fn bench(c: &mut Criterion) {
    let (nodes, pods, gpu_used) = cluster();
    let snap = snapshot(&nodes, &pods, &gpu_used);
    let free: usize = snap.nodes().iter().map(|n| n.gpus().difference(n.gpu_used).len()).sum();
    println!("cluster: {} nodes, {} running pods, {free} of {} GPUs free", snap.nodes().len(), pods.len(), NODES * 8);

    c.bench_function("snapshot: 5,000 nodes + pods from the API lists (outside the decisions)", |b| {
        b.iter(|| black_box(snapshot(black_box(&nodes), &pods, &gpu_used)))
    });

    let gpus = node_gpus(&nodes, &MetricsCache::default(), &HealthThresholds::default(), SystemTime::now());
    let chooser = || TopologyChooser::new(gpus.clone(), SelectOptions::default());
    // One chooser for every warm run: its cache fills during criterion's warm-up.
    let warm = chooser();
    c.bench_function("chooser: GPU models of 5,000 nodes (once per admission cycle)", |b| {
        b.iter(|| black_box(chooser()))
    });

    let options = PlaceOptions::default();
    let cases = [
        ("3-pod gang (4 GPUs each) on 5,000 nodes", gang(3, 4, None)),
        ("3-pod gang (4 GPUs each) on 5,000 nodes, one rack of 125", gang(3, 4, Some(RACK))),
        ("1,000-pod gang (4 GPUs each) on 5,000 nodes", gang(1_000, 4, None)),
        ("1,000-pod gang (2 GPUs each) on 5,000 nodes, one zone of 5", gang(1_000, 2, Some(ZONE))),
    ];
    for (name, tree) in &cases {
        let d = place(&snap, tree, &options, &LowestFreeIndices);
        assert!(d.admitted, "{name}: {}", d.message());
        let nodes_used = d.plan.iter().map(|p| p.node.as_str()).collect::<std::collections::BTreeSet<_>>().len();
        println!("{name}: {} pods on {nodes_used} nodes (lowest free indices)", d.plan.len());
        c.bench_function(&format!("place, lowest free indices: {name}"), |b| {
            b.iter(|| black_box(place(&snap, black_box(tree), &options, &LowestFreeIndices)))
        });

        let d = place(&snap, tree, &options, &chooser());
        assert!(d.admitted, "{name}: {}", d.message());
        let nodes_used = d.plan.iter().map(|p| p.node.as_str()).collect::<std::collections::BTreeSet<_>>().len();
        println!("{name}: {} pods on {nodes_used} nodes (GPU topology)", d.plan.len());
        c.bench_function(&format!("place, GPU topology, cache empty: {name}"), |b| {
            // By reference: the chooser is built and dropped outside the measurement.
            b.iter_batched_ref(
                chooser,
                |gpus| black_box(place(&snap, black_box(tree), &options, gpus)),
                BatchSize::LargeInput,
            )
        });
        c.bench_function(&format!("place, GPU topology, cache warm: {name}"), |b| {
            b.iter(|| black_box(place(&snap, black_box(tree), &options, &warm)))
        });
    }
}

fn bench_rules(c: &mut Criterion) {
    let (nodes, pods, gpu_used) = cluster();
    let snap = snapshot(&nodes, &pods, &gpu_used);
    let options = PlaceOptions::default();
    let gpus = node_gpus(&nodes, &MetricsCache::default(), &HealthThresholds::default(), SystemTime::now());
    let warm = TopologyChooser::new(gpus, SelectOptions::default());
    let mut group = c.benchmark_group("pod rules");
    group.sample_size(10);
    for (name, tree) in [
        ("3-pod gang, anti-affinity + zone spread, 5,000 nodes", ruled_gang(3)),
        ("1,000-pod gang, anti-affinity + zone spread, 5,000 nodes", ruled_gang(1_000)),
    ] {
        let d = place(&snap, &tree, &options, &LowestFreeIndices);
        assert!(d.admitted, "{name}: {}", d.message());
        let nodes_used = d.plan.iter().map(|p| p.node.as_str()).collect::<std::collections::BTreeSet<_>>().len();
        assert_eq!(nodes_used, d.plan.len(), "{name}: one pod per node");
        println!("{name}: {} pods on {nodes_used} nodes", d.plan.len());
        group.bench_function(format!("place, lowest free indices: {name}"), |b| {
            b.iter(|| black_box(place(&snap, black_box(&tree), &options, &LowestFreeIndices)))
        });
        group.bench_function(format!("place, GPU topology, cache warm: {name}"), |b| {
            b.iter(|| black_box(place(&snap, black_box(&tree), &options, &warm)))
        });
    }
    group.finish();
}

criterion_group!(benches, bench, bench_rules);
criterion_main!(benches);

//! Admission with DRA GPU claims against count-based GPUs, on 1,000 nodes of 8 GPUs (the
//! three fixture topologies in turn, about half of the GPUs used by running pods), built two
//! ways:
//! (a) count-based: `nvidia.com/gpu: 8` allocatable, running pods request `nvidia.com/gpu: 1`
//!     and the ledger's used indices are set with `set_gpu_used`;
//! (b) DRA: no `nvidia.com/gpu`; one NVIDIA driver ResourceSlice per node (uuids from the
//!     topology annotation), the running pods' GPUs as allocated ResourceClaims, the
//!     `gpu.nvidia.com` DeviceClass and a ResourceClaimTemplate of 4 GPUs.
//!
//! Measured: the admission decision (`decide`, topology chooser with a warm cache, as
//! admission uses it) for a 3-pod gang of 4 GPUs each on (a) and on (b); and for (b) the DRA
//! state admission builds once per cycle from the object lists (`Inventory::new`,
//! `Dra::new`, `Snapshot::set_dra`), the whole GPUs each node publishes (`published_gpus`) and
//! one node's locality model without the node agent (`PublishedGpus::topology`).
//! `cargo bench --bench dra_admission` prints the times.

mod common;
use common::Sequence;

use std::collections::{BTreeMap, HashMap};
use std::hint::black_box;
use std::time::SystemTime;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice};
use muster_api::{ADMISSION_GATE, GPU_RESOURCE, GPU_TOPOLOGY_ANNOTATION, HOSTNAME_LABEL, POD_GROUP_LABEL};
use muster_core::devices::chooser::{NodeGpus, TopologyChooser, node_gpus};
use muster_core::devices::dra::fixtures::{nvidia_device_class, nvidia_slice};
use muster_core::devices::dra::{Inventory, NVIDIA_GPU_DRIVER, published_gpus};
use muster_core::devices::{GpuSet, HealthThresholds, MetricsCache, SelectOptions, fixtures};
use muster_core::scheduler::{
    Admission, CPU, Decision, Dra, GroupTree, LeafGroup, LeafPolicy, MEMORY, PODS, PlaceOptions, PodShape, Resources,
    Snapshot, decide,
};
use serde_json::{Value, json};

const NODES: usize = 1_000;
const GPUS: usize = 8;

fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("bench object")
}

/// Both clusters' objects: the same nodes, running pods and used GPU indices.
struct Cluster {
    count_nodes: Vec<Node>,
    count_pods: Vec<Pod>,
    dra_nodes: Vec<Node>,
    dra_pods: Vec<Pod>,
    gpu_used: BTreeMap<String, GpuSet>,
    slices: Vec<ResourceSlice>,
    classes: Vec<DeviceClass>,
    claims: Vec<ResourceClaim>,
    templates: Vec<ResourceClaimTemplate>,
}

fn node(name: &str, annotation: &str, gpus: bool) -> Node {
    let mut allocatable = json!({"cpu": "128", "memory": "1Ti", "pods": "110"});
    if gpus {
        allocatable[GPU_RESOURCE] = json!(GPUS.to_string());
    }
    from(json!({
        "metadata": {"name": name, "labels": {HOSTNAME_LABEL: name},
                     "annotations": {GPU_TOPOLOGY_ANNOTATION: annotation}},
        "status": {"allocatable": allocatable}
    }))
}

/// A running pod on `node` with 12 cores and 96 GiB and one GPU: `nvidia.com/gpu: 1`, or a
/// claim made from the template (named in `status.resourceClaimStatuses`).
fn running(name: &str, node: &str, claim: Option<&str>) -> Pod {
    let mut requests = json!({"cpu": "12", "memory": "96Gi"});
    let mut spec = json!({"nodeName": node, "containers": [{"name": "main"}]});
    let mut status = json!({"phase": "Running"});
    match claim {
        None => requests[GPU_RESOURCE] = json!("1"),
        Some(c) => {
            spec["resourceClaims"] = json!([{"name": "gpu", "resourceClaimTemplateName": "gpu1"}]);
            status["resourceClaimStatuses"] = json!([{"name": "gpu", "resourceClaimName": c}]);
        }
    }
    spec["containers"][0]["resources"] = json!({"requests": requests});
    from(json!({
        "metadata": {"name": name, "namespace": "other", "uid": format!("uid-{name}"),
                     "labels": {POD_GROUP_LABEL: "other"}},
        "spec": spec,
        "status": status
    }))
}

/// The claim of a running pod: GPU `index` of `node`, allocated as kube-scheduler writes it.
fn allocated(name: &str, pod: &str, node: &str, index: usize) -> ResourceClaim {
    from(json!({
        "metadata": {"namespace": "other", "name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": NVIDIA_GPU_DRIVER}}]}},
        "status": {
            "allocation": {
                "devices": {"results": [{"request": "gpu", "driver": NVIDIA_GPU_DRIVER, "pool": node,
                                          "device": format!("gpu-{index}")}]},
                "nodeSelector": {"nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}
            },
            "reservedFor": [{"resource": "pods", "name": pod, "uid": format!("uid-{pod}")}]
        }
    }))
}

fn template(name: &str, count: usize) -> ResourceClaimTemplate {
    from(json!({
        "metadata": {"namespace": "ml", "name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": NVIDIA_GPU_DRIVER, "count": count}}]}}}
    }))
}

fn cluster() -> Cluster {
    let mut seq = Sequence(0x9e37_79b9_7f4a_7c15);
    let topologies: Vec<_> = fixtures::named().into_iter().map(|(_, _, t)| t).collect();
    let annotations: Vec<String> = topologies.iter().map(|t| t.to_annotation().to_json()).collect();
    let mut c = Cluster {
        count_nodes: Vec::new(),
        count_pods: Vec::new(),
        dra_nodes: Vec::new(),
        dra_pods: Vec::new(),
        gpu_used: BTreeMap::new(),
        slices: Vec::new(),
        classes: vec![nvidia_device_class()],
        claims: Vec::new(),
        templates: vec![template("gpu4", 4), template("gpu1", 1)],
    };
    for i in 0..NODES {
        let name = format!("gpu-{i:04}");
        let k = i % topologies.len();
        c.count_nodes.push(node(&name, &annotations[k], true));
        c.dra_nodes.push(node(&name, &annotations[k], false));
        let uuids: Vec<String> = topologies[k]
            .gpus()
            .iter()
            .enumerate()
            .map(|(g, gpu)| gpu.uuid.clone().unwrap_or_else(|| format!("GPU-{name}-{g}")))
            .collect();
        let devices: Vec<(usize, &str)> = uuids.iter().enumerate().map(|(g, u)| (g, u.as_str())).collect();
        c.slices.push(nvidia_slice(&name, &devices, 1));
        // 0 to 8 running one-GPU pods (4 on average) on scattered indices.
        let running_pods = seq.below(GPUS as u64 + 1) as usize;
        let mut used = GpuSet::EMPTY;
        while used.len() < running_pods {
            used = used.with(seq.below(GPUS as u64) as usize).unwrap_or(used);
        }
        for (p, index) in used.iter().enumerate() {
            let pod = format!("{name}-run-{p}");
            let claim = format!("{pod}-gpu");
            c.count_pods.push(running(&pod, &name, None));
            c.dra_pods.push(running(&pod, &name, Some(&claim)));
            c.claims.push(allocated(&claim, &pod, &name, index));
        }
        c.gpu_used.insert(name, used);
    }
    c
}

/// The uuid index admission builds from the node topologies (`dra_state`).
fn uuid_index(gpus: &HashMap<String, NodeGpus>) -> HashMap<String, HashMap<String, usize>> {
    gpus.iter()
        .map(|(node, g)| {
            let by_uuid =
                g.topology.gpus().iter().enumerate().filter_map(|(i, gpu)| gpu.uuid.clone().map(|u| (u, i))).collect();
            (node.clone(), by_uuid)
        })
        .collect()
}

fn dra_state(c: &Cluster, index: &HashMap<String, HashMap<String, usize>>) -> Dra {
    let inventory = Inventory::new(&c.slices, &c.classes, &c.claims, NVIDIA_GPU_DRIVER, index);
    Dra::new(inventory, &c.templates, &c.claims)
}

/// 3 pods of 4 GPUs, 32 cores and 256 GiB each.
fn count_gang() -> GroupTree {
    let requests = Resources::new().with(CPU, 32_000).with(MEMORY, 256 << 30).with(PODS, 1).with(GPU_RESOURCE, 4);
    let shape = PodShape::new(requests);
    let mut leaf = LeafGroup::new("train", LeafPolicy::Gang { min_count: 3 });
    for i in 0..3 {
        leaf.add_gated(&format!("train-{i}"), &format!("u{i}"), shape.clone());
    }
    GroupTree::new("ml", leaf)
}

/// The same gang, each pod's GPUs from the 4-GPU template.
fn dra_gang() -> GroupTree {
    let mut leaf = LeafGroup::new("train", LeafPolicy::Gang { min_count: 3 });
    for i in 0..3 {
        let pod: Pod = from(json!({
            "metadata": {"name": format!("train-{i}"), "namespace": "ml", "uid": format!("u{i}"),
                         "labels": {POD_GROUP_LABEL: "train"}},
            "spec": {
                "schedulingGates": [{"name": ADMISSION_GATE}],
                "containers": [{"name": "main", "resources": {"requests": {"cpu": "32", "memory": "256Gi"}}}],
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu4"}]
            }
        }));
        assert!(leaf.add_pod(&pod));
    }
    GroupTree::new("ml", leaf)
}

fn decided(a: Admission) -> Decision {
    match a {
        Admission::Decided(d) => d,
        other => panic!("not decided: {other:?}"),
    }
}

fn free_gpus(s: &Snapshot) -> usize {
    s.nodes().iter().map(|n| n.gpus().difference(n.gpu_used).len()).sum()
}

fn bench(c: &mut Criterion) {
    let cluster = cluster();
    let now = SystemTime::now();
    // The GPU models of the nodes (from the annotation and nvidia.com/gpu). A DRA node has no
    // nvidia.com/gpu, so admission's node_gpus would find a count mismatch on it and fall back
    // to an unknown topology; both cases use the annotated models here, so the two decisions
    // differ only in where the GPUs come from.
    let gpus = node_gpus(&cluster.count_nodes, &MetricsCache::default(), &HealthThresholds::default(), now);
    let index = uuid_index(&gpus);

    let mut count = Snapshot::from_cluster(&cluster.count_nodes, &cluster.count_pods);
    for (node, used) in &cluster.gpu_used {
        count.set_gpu_used(node, *used);
    }
    let bare = Snapshot::from_cluster(&cluster.dra_nodes, &cluster.dra_pods);
    let mut dra = bare.clone();
    dra.set_dra(dra_state(&cluster, &index));
    let nodes: Vec<String> = dra.nodes().iter().map(|n| n.name.clone()).collect();
    for node in &nodes {
        let allocated = dra.dra().inventory().map_or(GpuSet::EMPTY, |i| i.allocated_gpus(node));
        dra.set_gpu_used(node, allocated);
    }
    let problems = dra.dra().inventory().map_or(0, |i| i.problems().len());
    assert_eq!(problems, 0, "DRA objects have problems");
    println!(
        "cluster: {NODES} nodes x {GPUS} GPUs, {} running pods; free GPUs: {} count-based, {} DRA ({} slices, {} allocated claims)",
        cluster.count_pods.len(),
        free_gpus(&count),
        free_gpus(&dra),
        cluster.slices.len(),
        cluster.claims.len()
    );

    let options = PlaceOptions::default();
    let warm = TopologyChooser::new(gpus.clone(), SelectOptions::default());
    let (count_tree, dra_tree) = (count_gang(), dra_gang());
    for (name, snapshot, tree) in [("count-based", &count, &count_tree), ("DRA", &dra, &dra_tree)] {
        let d = decided(decide(snapshot, tree, &options, &warm));
        assert!(d.admitted, "{name}: {}", d.message());
        let placed: Vec<String> = d.plan.iter().map(|p| format!("{}:[{}]", p.node, p.gpus)).collect();
        println!("{name}: 3-pod gang placed on {}", placed.join(" "));
    }

    c.bench_function("decide, count-based: 3-pod gang (4 GPUs each) on 1,000 nodes, GPU topology warm", |b| {
        b.iter(|| black_box(decide(&count, black_box(&count_tree), &options, &warm)))
    });
    c.bench_function("decide, DRA claims: 3-pod gang (4 GPUs each) on 1,000 nodes, GPU topology warm", |b| {
        b.iter(|| black_box(decide(&dra, black_box(&dra_tree), &options, &warm)))
    });
    c.bench_function("DRA state: Inventory::new + Dra::new + set_dra, 1,000 slices (once per cycle)", |b| {
        b.iter_batched(
            || bare.clone(),
            |mut s| {
                s.set_dra(dra_state(black_box(&cluster), &index));
                black_box(s)
            },
            BatchSize::LargeInput,
        )
    });
    // What the GPU model reads of the slices each cycle: the whole GPUs each node publishes
    // (today's driver shape: slots from the device names, pcieRoot, numaNode), and the model of
    // a node without the node agent built from them.
    c.bench_function("published_gpus: the whole GPUs of 1,000 slices, by node (once per cycle)", |b| {
        b.iter(|| black_box(published_gpus(black_box(&cluster.slices), NVIDIA_GPU_DRIVER)))
    });
    let published = published_gpus(&cluster.slices, NVIDIA_GPU_DRIVER);
    let one = published.values().next().cloned().unwrap_or_default();
    c.bench_function("PublishedGpus::topology: one node's locality model without the agent (interned)", |b| {
        b.iter(|| black_box(black_box(&one).topology()))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);

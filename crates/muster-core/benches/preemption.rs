//! A gang preemption decision on a 5,000-node GPU cluster with no free GPU: 8 GPUs per node,
//! 125 racks of 40, every node running two 4-GPU pods of lower priority (priorities 0 to 2),
//! grouped 4 pods over 2 nodes, half the groups disruption mode `all`, half `single`. The
//! preemptor: a priority-1000 gang of 8 pods of 8 GPUs in one rack, so it needs 8 whole
//! nodes freed. Measured: `preempt` from the snapshot and the candidate groups to the victim
//! set and the plan (the greedy search: 10,000 candidate units), and `reservation` (the nodes a
//! waiting gang keeps). `cargo bench --bench preemption` prints the time per decision.

mod common;
use common::Sequence;

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use muster_api::{GPU_RESOURCE, HOSTNAME_LABEL};
use muster_core::devices::GpuSet;
use muster_core::scheduler::{
    CPU, GroupTree, LeafGroup, LeafPolicy, LowestFreeIndices, PODS, PlaceOptions, PodShape, PodUsage, Resources,
    Snapshot, VictimGroup, VictimMode, VictimPod, preempt, reservation,
};

const NODES: usize = 5_000;
const RACK: &str = "topology.muster.dev/rack";

fn cluster() -> (Snapshot, Vec<VictimGroup>) {
    let mut seq = Sequence(0x2545_f491_4f6c_dd1d);
    let infos = (0..NODES)
        .map(|i| {
            let name = format!("gpu-{i:05}");
            muster_core::scheduler::NodeInfo::new(
                &name,
                Resources::new().with(CPU, 128_000).with(PODS, 110).with(GPU_RESOURCE, 8),
            )
            .with_label(HOSTNAME_LABEL, &name)
            .with_label(RACK, &format!("rack-{:03}", i / 40))
        })
        .collect();
    let mut snapshot = Snapshot::new(infos);
    let mut groups = Vec::new();
    for g in 0..NODES / 2 {
        let mut pods = Vec::new();
        for p in 0..4 {
            let node = format!("gpu-{:05}", g * 2 + p / 2);
            let gpus = if p % 2 == 0 { GpuSet::first(4) } else { GpuSet::first(8).difference(GpuSet::first(4)) };
            let key = format!("batch/g{g}-{p}");
            let requests = Resources::new().with(CPU, 12_000).with(PODS, 1).with(GPU_RESOURCE, 4);
            snapshot.add_usage(&PodUsage::bound(&key, &node, requests.clone(), Default::default()));
            pods.push(VictimPod { key, node, requests, gpus });
        }
        let mode = if g % 2 == 0 { VictimMode::All } else { VictimMode::Single };
        groups.push(VictimGroup { name: format!("batch/g{g}"), priority: seq.below(3) as i32, mode, pods });
    }
    for i in 0..NODES {
        snapshot.set_gpu_used(&format!("gpu-{i:05}"), GpuSet::first(8));
    }
    (snapshot, groups)
}

fn preemptor() -> GroupTree {
    let mut leaf = LeafGroup::new("big", LeafPolicy::Gang { min_count: 8 });
    leaf.topology_key = Some(RACK.into());
    let shape = PodShape::new(Resources::new().with(CPU, 1_000).with(PODS, 1).with(GPU_RESOURCE, 8));
    for i in 0..8 {
        leaf.add_gated(&format!("big-{i}"), &format!("uid-{i}"), shape.clone());
    }
    let mut tree = GroupTree::new("train", leaf);
    tree.priority = 1000;
    tree
}

fn bench(c: &mut Criterion) {
    let (snapshot, groups) = cluster();
    let tree = preemptor();
    let options = PlaceOptions::default();
    let found = preempt(&snapshot, &tree, true, &groups, &options, &LowestFreeIndices).expect("a preemption");
    println!(
        "preemption at {NODES} nodes: {} victim pod(s) in {} unit(s), on {} node(s)",
        found.pods().count(),
        found.victims.len(),
        found.nominated_nodes().len()
    );
    let mut group = c.benchmark_group("preemption");
    group.sample_size(10);
    group.bench_function("preempt: 8 x 8-GPU gang in one rack, 5,000 full nodes, 10,000 candidate units", |b| {
        b.iter(|| black_box(preempt(&snapshot, &tree, true, &groups, &options, &LowestFreeIndices)))
    });
    group.bench_function("reservation: the same gang, 5,000 full nodes", |b| {
        b.iter(|| black_box(reservation(&snapshot, &tree, &groups, &options, &LowestFreeIndices)))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

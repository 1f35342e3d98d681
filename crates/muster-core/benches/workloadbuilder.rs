//! Compile + validate cost of the workloadbuilder: (a) a single-leaf Job tree, (b) the largest
//! tree upstream allows (8 wide, 4 deep). `cargo bench --bench workloadbuilder` prints ns/call.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use muster_api::batch::MusterJobSpec;
use muster_api::blocks::{
    CompositePodGroupSchedulingPolicy, DisruptionMode, PodGroupScheduling, PodGroupSchedulingPolicy,
    SchedulingConstraints,
};
use muster_core::workloadbuilder::job::job_item;
use muster_core::workloadbuilder::{
    Block, BuildOptions, Builder, FieldPath, PolicyInput, SchedulingConfig, WorkloadItem,
};

fn opts() -> BuildOptions {
    let owner = OwnerReference {
        api_version: "batch.muster.dev/v1alpha1".into(),
        kind: "MusterJob".into(),
        name: "bench".into(),
        uid: "uid".into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    BuildOptions::all_allowed("bench", "default", Some(owner))
}

fn job_spec() -> MusterJobSpec {
    let mut spec: MusterJobSpec = serde_json::from_value(serde_json::json!({
        "parallelism": 8,
        "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}},
    }))
    .expect("fixture");
    spec.scheduling = Some(PodGroupScheduling {
        scheduling_policy: Some(PodGroupSchedulingPolicy::gang(Some(8))),
        scheduling_constraints: Some(SchedulingConstraints::topology("topology.muster.dev/rack")),
        disruption_mode: Some(DisruptionMode::all()),
        resource_claims: None,
    });
    spec
}

/// A full tree: every composite has 8 leaves, and composites above the third level 8
/// composite children, so leaves reach the fourth level.
fn widest_deepest(spec: &MusterJobSpec, depth: usize, counter: &mut usize) -> WorkloadItem {
    *counter += 1;
    let name = format!("t{counter}");
    let mut item = WorkloadItem::new(name.clone(), FieldPath::new(&name));
    item.input.policy = Some(Block::new(
        PolicyInput::Composite(CompositePodGroupSchedulingPolicy::gang(None)),
        item.path.child("schedulingPolicy"),
    ));
    for _ in 0..8 {
        *counter += 1;
        let leaf = format!("t{counter}");
        item.children.push(job_item(spec, &leaf, &FieldPath::new(&leaf)));
    }
    if depth < 3 {
        for _ in 0..8 {
            item.children.push(widest_deepest(spec, depth + 1, counter));
        }
    }
    let groups = item.child_group_count();
    item.callbacks.push(Arc::new(move |c: &mut SchedulingConfig| {
        if let Some(g) = c.policy.as_mut().and_then(|p| p.gang.as_mut())
            && g.min_count.is_none()
        {
            g.min_count = Some(groups);
        }
    }));
    item
}

fn bench(c: &mut Criterion) {
    let spec = job_spec();
    let leaf = job_item(&spec, "main", &FieldPath::new("spec"));
    c.bench_function("validate+build single-leaf job", |b| {
        b.iter(|| {
            let builder = Builder::new(black_box(leaf.clone()), opts());
            assert!(builder.validate(None).is_empty());
            black_box(builder.build_workload().is_ok())
        })
    });
    let mut counter = 0;
    let big = widest_deepest(&spec, 1, &mut counter);
    let mut templates = 0;
    big.walk(1, &mut |_, _| templates += 1);
    println!("largest tree: {templates} templates, 8 wide, 4 deep");
    c.bench_function("validate+build 8-wide 4-deep tree", |b| {
        b.iter(|| {
            let builder = Builder::new(black_box(big.clone()), opts());
            assert!(builder.validate(None).is_empty());
            black_box(builder.build_workload().is_ok())
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);

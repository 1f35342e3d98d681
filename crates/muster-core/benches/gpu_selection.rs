//! Criterion benchmarks of GPU selection: exact search on the 8-GPU fixtures and a 16-GPU
//! node, the greedy path on 64 GPUs, node scoring, and the brute-force oracle for scale.
//! `cargo bench --bench gpu_selection`; the placement quality report is `--bench gpu_report`.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use muster_core::devices::{GpuSet, SelectOptions, fixtures, node_score, select, select_brute_force};

fn exact_on_fixtures(c: &mut Criterion) {
    let mut group = c.benchmark_group("select/8-gpu");
    // All free, and a fragmented node with GPUs 2 and 5 taken.
    let masks = [("free", GpuSet::first(8)), ("fragmented", GpuSet::from_bits(0b1101_1011))];
    for (name, _, topology) in fixtures::named() {
        for (state, free) in masks {
            for k in [1usize, 2, 4, 8].into_iter().filter(|&k| k <= free.len()) {
                let id = BenchmarkId::new(format!("{name}/{state}"), k);
                group.bench_with_input(id, &k, |b, &k| {
                    b.iter(|| select(black_box(&topology), black_box(free), k, SelectOptions::default()))
                });
            }
        }
    }
    group.finish();
}

fn exact_on_sixteen(c: &mut Criterion) {
    let topology = fixtures::dgx1_blocks(16);
    let mut group = c.benchmark_group("select/16-gpu");
    for k in [1usize, 2, 4, 8] {
        group.bench_with_input(BenchmarkId::from_parameter(k), &k, |b, &k| {
            b.iter(|| select(black_box(&topology), black_box(topology.all()), k, SelectOptions::default()))
        });
    }
    group.finish();
}

fn greedy_on_sixty_four(c: &mut Criterion) {
    let topology = fixtures::dgx1_blocks(64);
    let mut group = c.benchmark_group("select/64-gpu-greedy");
    for k in [2usize, 8, 32] {
        group.bench_with_input(BenchmarkId::from_parameter(k), &k, |b, &k| {
            b.iter(|| select(black_box(&topology), black_box(topology.all()), k, SelectOptions::default()))
        });
    }
    group.finish();
}

fn scoring_and_oracle(c: &mut Criterion) {
    let fixtures = fixtures::named();
    let topology = &fixtures[0].2;
    c.bench_function("node_score/dgx-h100/k=2", |b| {
        b.iter(|| node_score(black_box(topology), black_box(GpuSet::first(8)), 2, &[], SelectOptions::default()))
    });
    let sixteen = fixtures::dgx1_blocks(16);
    c.bench_function("brute_force/16-gpu/k=8", |b| {
        b.iter(|| select_brute_force(black_box(&sixteen), black_box(sixteen.all()), 8, SelectOptions::default()))
    });
}

criterion_group!(benches, exact_on_fixtures, exact_on_sixteen, greedy_on_sixty_four, scoring_and_oracle);
criterion_main!(benches);

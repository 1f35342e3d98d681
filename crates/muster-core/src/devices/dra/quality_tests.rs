//! Placement quality without the node agent: on each nvidia-smi fixture, what NVIDIA's DRA
//! driver would publish for that machine (one `pcieRoot` per PCIe root complex, `numaNode`
//! from the fixture in today's shape, none in the legacy shape), and the GPUs the real chooser
//! picks WITH the node agent (the fixture topology) and WITHOUT it
//! ([`PublishedGpus::topology`]), both scored on the TRUE fixture topology.
//!
//! `cargo test -p muster-core --lib quality_tests -- --nocapture` prints the table.

use super::fixtures::Shape;
use super::*;
use crate::devices::topology::Link;
use crate::devices::{GpuSet, SelectOptions, select, set_cost};

/// The PCIe root complex of each GPU of `topology`: GPUs whose link is `PIX`, `PXB` or `PHB`
/// share one (transitively); an NVLink, `NODE` or `SYS` link says nothing shared, so each such
/// GPU gets a root of its own (what the GPU matrix of `nvidia-smi topo -m` can tell).
fn roots(topology: &GpuTopology) -> Vec<usize> {
    let n = topology.len();
    let mut root: Vec<usize> = (0..n).collect();
    fn find(root: &mut [usize], i: usize) -> usize {
        let mut i = i;
        while root[i] != i {
            i = root[i];
        }
        i
    }
    for i in 0..n {
        for j in (i + 1)..n {
            if matches!(topology.link(i, j), Link::Pix | Link::Pxb | Link::Phb) {
                let (a, b) = (find(&mut root, i), find(&mut root, j));
                root[a.max(b)] = a.min(b);
            }
        }
    }
    (0..n).map(|i| find(&mut root, i)).collect()
}

/// The slice the driver publishes for a machine of `topology`, in `shape`, read back as the GPU
/// model reads it ([`published_gpus`]).
fn published(topology: &GpuTopology, shape: Shape) -> Arc<PublishedGpus> {
    let roots = roots(topology);
    let gpus: Vec<nvidia::NvidiaGpu> = (0..topology.len())
        .map(|i| nvidia::NvidiaGpu {
            index: u32::try_from(i).unwrap_or(u32::MAX),
            uuid: format!("GPU-{i:08}-0000-0000-0000-000000000000"),
            memory_mib: 81_559,
            pcie_bus_id: format!("0000:{:02x}:00.0", 0x18 + i),
            pcie_root: format!("pci0000:{:02x}", roots[i]),
            numa_node: topology.numa(i).map(i64::from),
        })
        .collect();
    let model = nvidia::gpu_model(nvidia::H100_PRODUCT);
    let slice = nvidia::nvidia_gpu_slice_shaped("n1", &model, &gpus, 1, shape);
    let all = published_gpus(&[slice], NVIDIA_GPU_DRIVER);
    all.get("n1").cloned().unwrap_or_else(|| panic!("{shape}: nothing published"))
}

/// One row of the table.
struct Row {
    fixture: &'static str,
    shape: Shape,
    taken: GpuSet,
    k: usize,
    with: GpuSet,
    without: GpuSet,
    cost_with: u64,
    cost_without: u64,
    numa_with: usize,
    numa_without: usize,
    root_without: bool,
}

fn one_root(roots: &[usize], set: GpuSet) -> bool {
    let mut r = set.iter().map(|i| roots[i]);
    let first = r.next();
    r.all(|x| Some(x) == first)
}

fn yn(b: bool) -> &'static str {
    if b { "y" } else { "n" }
}

fn rows() -> Vec<Row> {
    let taken_cases: [&[usize]; 3] = [&[], &[0], &[0, 5]];
    let mut out = Vec::new();
    for (fixture, _, truth) in crate::devices::fixtures::named() {
        for shape in Shape::ALL {
            let without_agent = published(&truth, shape).topology();
            assert_eq!(without_agent.len(), truth.len(), "{fixture} {shape}: slots");
            let roots = roots(&truth);
            for taken in taken_cases {
                let taken = GpuSet::from_indices(taken.iter().copied()).unwrap_or_default();
                let free = truth.all().difference(taken);
                for k in [2, 4] {
                    let pick = |t: &GpuTopology| {
                        select(t, free, k, SelectOptions::default())
                            .unwrap_or_else(|| panic!("{fixture} {shape}: no {k} of {free}"))
                            .gpus
                    };
                    let (with, without) = (pick(&truth), pick(&without_agent));
                    out.push(Row {
                        fixture,
                        shape,
                        taken,
                        k,
                        with,
                        without,
                        cost_with: set_cost(&truth, with),
                        cost_without: set_cost(&truth, without),
                        numa_with: truth.numa_span(with),
                        numa_without: truth.numa_span(without),
                        root_without: one_root(&roots, without),
                    });
                }
            }
        }
    }
    out
}

#[test]
fn the_published_model_groups_gpus_by_pcie_root_and_numa_node() {
    let truth = crate::devices::fixtures::pcie();
    // PIX pairs (0,1) (2,3) (4,5) (6,7) are four roots; NUMA 0 holds GPUs 0-3.
    assert_eq!(roots(&truth), vec![0, 0, 2, 2, 4, 4, 6, 6]);
    let current = published(&truth, Shape::Current).topology();
    assert_eq!(current.link(0, 1), Link::Pxb, "one root");
    assert_eq!(current.link(0, 2), Link::Node, "one NUMA node, two roots");
    assert_eq!(current.link(0, 4), Link::Sys, "two NUMA nodes");
    assert!(current.is_known());
    let legacy = published(&truth, Shape::Legacy).topology();
    assert_eq!(legacy.link(0, 1), Link::Pxb, "legacy: one root");
    assert_eq!(legacy.link(0, 2), Link::Sys, "legacy: no numaNode, so every other root is SYS");
    assert_eq!(legacy.numa(0), None);
}

fn find_row<'r>(rows: &'r [Row], fixture: &str, shape: Shape, taken: GpuSet, k: usize) -> &'r Row {
    rows.iter()
        .find(|r| r.fixture == fixture && r.shape == shape && r.taken == taken && r.k == k)
        .unwrap_or_else(|| panic!("{fixture} {shape} {taken} {k}: no row"))
}

#[test]
fn placement_quality_without_the_node_agent() {
    let rows = rows();
    println!();
    println!(
        "| fixture | shape | taken | GPUs | chosen with agent | chosen without | cost with | cost without | NUMA nodes with/without | one NUMA without | one PCIe root without |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {{{}}} | {} | {{{}}} | {{{}}} | {} | {} | {}/{} | {} | {} |",
            r.fixture,
            r.shape,
            r.taken,
            r.k,
            r.with,
            r.without,
            r.cost_with,
            r.cost_without,
            r.numa_with,
            r.numa_without,
            yn(r.numa_without == 1),
            yn(r.root_without),
        );
    }
    for r in &rows {
        let at = format!("{} {} taken {{{}}} k={}", r.fixture, r.shape, r.taken, r.k);
        // The agent's choice is the exact minimum on the true topology: never beaten.
        assert!(r.cost_with <= r.cost_without, "{at}: without the agent cheaper?");
        match r.shape {
            // Today's driver publishes numaNode: the choice spans no more NUMA nodes than the
            // agent's (one wherever one NUMA node has the GPUs free), on every fixture.
            Shape::Current => {
                assert_eq!(r.numa_without, r.numa_with, "{at}: numaNode published, yet more NUMA nodes spanned")
            }
            // The legacy shape has only pcieRoot: where GPUs share no root, nothing is known.
            Shape::Legacy => {}
        }
        if r.shape == Shape::Current && r.k == 2 {
            assert_eq!(r.numa_without, 1, "{at}: a 2-GPU claim leaves its NUMA node");
        }
    }
    // Legacy shape, no numaNode: a 4-GPU claim beside one taken GPU spans both NUMA nodes on
    // the DGX H100 (every GPU its own root, so all look SYS apart; the lowest indices win).
    let r = find_row(&rows, "dgx-h100", Shape::Legacy, GpuSet::from_bits(1), 4);
    assert_eq!((r.numa_with, r.numa_without), (1, 2), "legacy dgx-h100 {} vs {}", r.with, r.without);
    let find = |fixture: &str, shape: Shape, taken: GpuSet, k: usize| find_row(&rows, fixture, shape, taken, k);
    let empty = GpuSet::EMPTY;
    for shape in Shape::ALL {
        // PCIe box: a pair behind one PCIe switch is one root: optimal in either shape.
        let r = find("pcie-2socket", shape, empty, 2);
        assert!(r.root_without && r.cost_without == r.cost_with, "{shape}: pcie pair {}", r.without);
        // DGX H100: every pair is NV18 on the NVSwitch; with numaNode nothing is lost.
        if shape == Shape::Current {
            for k in [2, 4] {
                for taken in [&[][..], &[0], &[0, 5]] {
                    let taken = GpuSet::from_indices(taken.iter().copied()).unwrap_or_default();
                    let r = find("dgx-h100", shape, taken, k);
                    assert_eq!(r.cost_without, r.cost_with, "dgx-h100 {taken} k={k}");
                }
            }
            let r = find("pcie-2socket", shape, empty, 4);
            assert_eq!(r.cost_without, r.cost_with, "pcie 4 GPUs: one socket, two PIX pairs");
        }
    }
    // DGX-1: the NV2 pairs (0,3), (1,2), (4,7), (5,6) are invisible without the agent: the
    // published model sees four equal GPUs per NUMA node and picks the lowest indices (0,1:
    // NV1), so the NVLink-optimal pair is lost while the NUMA node is kept.
    let r = find("dgx1-v100", Shape::Current, empty, 2);
    assert!(r.cost_without > r.cost_with, "dgx1: NV2 pair {} vs {}", r.with, r.without);
    assert_eq!(r.numa_without, 1);
}

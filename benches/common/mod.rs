//! Topologies shared by the GPU benchmarks: the nvidia-smi fixtures, parsed as `muster
//! node-agent` parses them, and larger synthetic nodes built from the DGX-1 mesh.
// Each bench target compiles this module and uses only part of it.
#![allow(dead_code)]

use muster::devices::GpuTopology;
use muster::devices::nvidia_smi::{build_annotation, parse_query, parse_topo};
use muster::devices::topology::{GpuEntry, TopologyAnnotation};

/// Name, one-line description and text of each nvidia-smi fixture pair.
const FIXTURES: [(&str, &str, &str, &str); 3] = [
    (
        "dgx-h100",
        "8x H100, NVSwitch (all NV18), 2 NUMA nodes",
        include_str!("../../tests/fixtures/nvidia-smi/dgx-h100-topo.txt"),
        include_str!("../../tests/fixtures/nvidia-smi/dgx-h100-query.csv"),
    ),
    (
        "pcie-2socket",
        "8x L40S on PCIe switches (PIX pairs, NODE, SYS), 2 NUMA nodes",
        include_str!("../../tests/fixtures/nvidia-smi/pcie-2socket-topo.txt"),
        include_str!("../../tests/fixtures/nvidia-smi/pcie-2socket-query.csv"),
    ),
    (
        "dgx1-v100",
        "8x V100, hybrid cube-mesh NVLink (NV1/NV2), 2 NUMA nodes",
        include_str!("../../tests/fixtures/nvidia-smi/dgx1-v100-topo.txt"),
        include_str!("../../tests/fixtures/nvidia-smi/dgx1-v100-query.csv"),
    ),
];

fn load(topo: &str, query: &str) -> GpuTopology {
    let annotation = parse_topo(topo)
        .and_then(|t| build_annotation(&t, &parse_query(query)?))
        .unwrap_or_else(|e| panic!("fixture does not parse: {e}"));
    GpuTopology::from_annotation(&annotation).unwrap_or_else(|e| panic!("fixture annotation: {e}"))
}

/// The three fixture topologies with their names and descriptions.
pub fn fixtures() -> Vec<(&'static str, &'static str, GpuTopology)> {
    FIXTURES.iter().map(|(name, about, topo, query)| (*name, *about, load(topo, query))).collect()
}

/// `n` GPUs (a multiple of 8) as DGX-1 meshes side by side, four GPUs per NUMA node.
pub fn dgx1_blocks(n: usize) -> GpuTopology {
    let block = load(FIXTURES[2].2, FIXTURES[2].3);
    let gpus = (0..n)
        .map(|i| GpuEntry { index: i as u32, uuid: None, numa: Some((i / 4) as u32), memory_mib: None })
        .collect();
    let links = (0..n)
        .map(|i| {
            (0..n)
                .map(|j| if i / 8 == j / 8 { block.link(i % 8, j % 8).to_string() } else { "SYS".to_string() })
                .collect()
        })
        .collect();
    GpuTopology::from_annotation(&TopologyAnnotation { version: 1, gpus, links })
        .unwrap_or_else(|e| panic!("synthetic topology: {e}"))
}

//! Test topologies: the nvidia-smi fixtures under `tests/fixtures/nvidia-smi/`, parsed the way
//! `muster node-agent` parses them, and synthetic large nodes for the greedy path.

use super::nvidia_smi::{build_annotation, parse_query, parse_topo};
use super::topology::{GpuEntry, GpuTopology, TopologyAnnotation};

pub const DGX_H100_TOPO: &str = include_str!("../../../../tests/fixtures/nvidia-smi/dgx-h100-topo.txt");
pub const DGX_H100_QUERY: &str = include_str!("../../../../tests/fixtures/nvidia-smi/dgx-h100-query.csv");
pub const PCIE_TOPO: &str = include_str!("../../../../tests/fixtures/nvidia-smi/pcie-2socket-topo.txt");
pub const PCIE_QUERY: &str = include_str!("../../../../tests/fixtures/nvidia-smi/pcie-2socket-query.csv");
pub const DGX1_TOPO: &str = include_str!("../../../../tests/fixtures/nvidia-smi/dgx1-v100-topo.txt");
pub const DGX1_QUERY: &str = include_str!("../../../../tests/fixtures/nvidia-smi/dgx1-v100-query.csv");

fn load(topo: &str, query: &str) -> GpuTopology {
    let annotation = parse_topo(topo)
        .and_then(|t| build_annotation(&t, &parse_query(query)?))
        .unwrap_or_else(|e| panic!("fixture does not parse: {e}"));
    GpuTopology::from_annotation(&annotation).unwrap_or_else(|e| panic!("fixture annotation: {e}"))
}

/// DGX H100: eight NV18 GPUs on an NVSwitch, NUMA 0 (GPU0-3) and 1 (GPU4-7).
pub fn dgx_h100() -> GpuTopology {
    load(DGX_H100_TOPO, DGX_H100_QUERY)
}

/// Two-socket PCIe box: PIX pairs, NODE within a socket, SYS across.
pub fn pcie() -> GpuTopology {
    load(PCIE_TOPO, PCIE_QUERY)
}

/// DGX-1 (V100): NV1/NV2 hybrid cube mesh.
pub fn dgx1() -> GpuTopology {
    load(DGX1_TOPO, DGX1_QUERY)
}

/// The three fixture topologies.
pub fn all() -> Vec<GpuTopology> {
    vec![dgx_h100(), pcie(), dgx1()]
}

/// The three fixture topologies with a name and a one-line description each.
pub fn named() -> Vec<(&'static str, &'static str, GpuTopology)> {
    vec![
        ("dgx-h100", "8x H100, NVSwitch (all NV18), 2 NUMA nodes", dgx_h100()),
        ("pcie-2socket", "8x L40S on PCIe switches (PIX pairs, NODE, SYS), 2 NUMA nodes", pcie()),
        ("dgx1-v100", "8x V100, hybrid cube-mesh NVLink (NV1/NV2), 2 NUMA nodes", dgx1()),
    ]
}

/// `n` GPUs (a multiple of 8) as DGX-1 cube meshes side by side, four GPUs per NUMA node,
/// `SYS` between blocks.
pub fn dgx1_blocks(n: usize) -> GpuTopology {
    let block = dgx1();
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

//! PURE: the `gpu.muster.dev/topology` node annotation for fake GPU nodes, for a few well-known
//! machine shapes. The annotation and link types are the core's ([`TopologyAnnotation`],
//! [`Link`]), so what a fake node carries is what the scheduler parses.
//! No client, no clock, no randomness: GPU UUIDs come in from the caller.

use std::fmt;

use sha2::{Digest, Sha256};

use muster_core::devices::topology::{GpuEntry, TOPOLOGY_VERSION};
use muster_core::devices::{Link, TopologyAnnotation};

/// A machine shape a fake node can have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TopologyKind {
    /// Every pair of GPUs on one NVSwitch fabric (`NV18`, as on an HGX H100).
    Nvswitch,
    /// A two-socket PCIe box: pairs behind one PCIe switch are `PIX`, same socket `NODE`, else `SYS`.
    Pcie,
    /// The DGX-1V hybrid cube-mesh: `NV1`/`NV2` links between some pairs, `SYS` between the rest. 8 GPUs.
    CubeMesh,
    /// No annotation at all (a node of unknown topology).
    None,
}

impl fmt::Display for TopologyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Nvswitch => "nvswitch",
            Self::Pcie => "pcie",
            Self::CubeMesh => "cube-mesh",
            Self::None => "none",
        })
    }
}

/// A machine shape that cannot be made for the requested GPU count.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ShapeError {
    /// The shape is defined for one GPU count only.
    #[error("topology {kind} needs exactly {needs} GPUs per node, not {got}")]
    GpuCount {
        /// The requested shape.
        kind: TopologyKind,
        /// The count the shape needs.
        needs: usize,
        /// The count asked for.
        got: usize,
    },
}

/// DGX-1V hybrid cube-mesh: bonded NVLinks between GPU i and j (0 = none, then PCIe/SMP).
/// Two quads (0-3, 4-7), fully linked inside, and each GPU linked to its twin i+4 in the
/// other quad; every V100 uses all six of its links.
const CUBE_MESH_NVLINKS: [[u8; 8]; 8] = [
    [0, 1, 1, 2, 2, 0, 0, 0],
    [1, 0, 2, 1, 0, 2, 0, 0],
    [1, 2, 0, 2, 0, 0, 1, 0],
    [2, 1, 2, 0, 0, 0, 0, 1],
    [2, 0, 0, 0, 0, 1, 1, 2],
    [0, 2, 0, 0, 1, 0, 2, 1],
    [0, 0, 1, 0, 1, 2, 0, 2],
    [0, 0, 0, 1, 2, 1, 2, 0],
];

/// NUMA node of GPU `i` of `n` on a two-socket box: the first half on socket 0.
fn numa(i: usize, n: usize) -> u32 {
    if i < n.div_ceil(2) { 0 } else { 1 }
}

/// The link matrix of a shape for `n` GPUs; `None` for [`TopologyKind::None`].
pub fn links(kind: TopologyKind, n: usize) -> Result<Option<Vec<Vec<Link>>>, ShapeError> {
    if kind == TopologyKind::CubeMesh && n != CUBE_MESH_NVLINKS.len() {
        return Err(ShapeError::GpuCount { kind, needs: CUBE_MESH_NVLINKS.len(), got: n });
    }
    let between = |i: usize, j: usize| -> Link {
        let same_socket = numa(i, n) == numa(j, n);
        let socket_link = if same_socket { Link::Node } else { Link::Sys };
        match kind {
            TopologyKind::Nvswitch => Link::NvLink(18),
            TopologyKind::Pcie if i / 2 == j / 2 && same_socket => Link::Pix,
            TopologyKind::CubeMesh if CUBE_MESH_NVLINKS[i][j] > 0 => Link::NvLink(CUBE_MESH_NVLINKS[i][j]),
            _ => socket_link,
        }
    };
    Ok(match kind {
        TopologyKind::None => None,
        _ => Some(
            (0..n).map(|i| (0..n).map(|j| if i == j { Link::SelfLink } else { between(i, j) }).collect()).collect(),
        ),
    })
}

/// The annotation for a node whose GPUs have these UUIDs; `None` when the shape has none.
pub fn gpu_topology(
    kind: TopologyKind,
    uuids: &[String],
    memory_mib: u64,
) -> Result<Option<TopologyAnnotation>, ShapeError> {
    let n = uuids.len();
    let Some(matrix) = links(kind, n)? else {
        return Ok(None);
    };
    let gpus = uuids
        .iter()
        .enumerate()
        .map(|(i, uuid)| GpuEntry {
            index: i as u32,
            uuid: Some(uuid.clone()),
            numa: Some(numa(i, n)),
            memory_mib: Some(memory_mib),
        })
        .collect();
    let links = matrix.iter().map(|row| row.iter().map(Link::to_string).collect()).collect();
    Ok(Some(TopologyAnnotation { version: TOPOLOGY_VERSION, gpus, links }))
}

/// A stable GPU UUID for GPU `index` of `node`: the same inputs always give the same UUID.
pub fn gpu_uuid(seed: &str, node: &str, index: u32) -> String {
    let digest = Sha256::digest(format!("{seed}/{node}/{index}").as_bytes());
    let h = hex::encode(&digest[..16]);
    format!("GPU-{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHAPES: [TopologyKind; 3] = [TopologyKind::Nvswitch, TopologyKind::Pcie, TopologyKind::CubeMesh];

    fn uuids(n: u32) -> Vec<String> {
        (0..n).map(|i| gpu_uuid("test", "node-0", i)).collect()
    }

    fn matrix(kind: TopologyKind) -> Vec<Vec<String>> {
        gpu_topology(kind, &uuids(8), 81920).unwrap().unwrap().links
    }

    #[test]
    fn every_shape_is_square_symmetric_with_x_on_the_diagonal() {
        for kind in SHAPES {
            let m = links(kind, 8).unwrap().unwrap();
            assert_eq!(m.len(), 8, "{kind}");
            for (i, row) in m.iter().enumerate() {
                assert_eq!(row.len(), 8, "{kind} row {i}");
                for (j, link) in row.iter().enumerate() {
                    assert_eq!(*link == Link::SelfLink, i == j, "{kind} [{i}][{j}] = {link}");
                    assert_eq!(*link, m[j][i], "{kind} not symmetric at [{i}][{j}]");
                }
            }
        }
    }

    #[test]
    fn sizes_match_the_gpu_count() {
        for n in [1, 2, 4, 6, 8, 16] {
            for kind in [TopologyKind::Nvswitch, TopologyKind::Pcie] {
                let t = gpu_topology(kind, &uuids(n), 40960).unwrap().unwrap();
                assert_eq!(t.gpus.len(), n as usize);
                assert_eq!(t.links.len(), n as usize);
                assert!(t.links.iter().all(|r| r.len() == n as usize));
                assert!(t.gpus.iter().enumerate().all(|(i, g)| g.index == i as u32 && g.memory_mib == Some(40960)));
            }
        }
    }

    #[test]
    fn nvswitch_links_every_pair_with_nv18() {
        let m = matrix(TopologyKind::Nvswitch);
        assert!(m.iter().enumerate().all(|(i, r)| r.iter().enumerate().all(|(j, l)| (i == j) || l == "NV18")));
    }

    #[test]
    fn pcie_pairs_share_a_switch_sockets_split_in_halves() {
        let m = matrix(TopologyKind::Pcie);
        for (a, b) in [(0, 1), (2, 3), (4, 5), (6, 7)] {
            assert_eq!(m[a][b], "PIX");
        }
        assert_eq!(m[0][2], "NODE");
        assert_eq!(m[1][3], "NODE");
        assert_eq!(m[4][7], "NODE");
        assert_eq!(m[3][4], "SYS");
        assert_eq!(m[0][7], "SYS");
        let t = gpu_topology(TopologyKind::Pcie, &uuids(8), 81920).unwrap().unwrap();
        let numas: Vec<Option<u32>> = t.gpus.iter().map(|g| g.numa).collect();
        assert_eq!(numas, [0, 0, 0, 0, 1, 1, 1, 1].map(Some));
    }

    #[test]
    fn cube_mesh_matches_dgx1v() {
        let m = matrix(TopologyKind::CubeMesh);
        let row0: Vec<&str> = m[0].iter().map(String::as_str).collect();
        assert_eq!(row0, ["X", "NV1", "NV1", "NV2", "NV2", "SYS", "SYS", "SYS"]);
        let row6: Vec<&str> = m[6].iter().map(String::as_str).collect();
        assert_eq!(row6, ["SYS", "SYS", "NV1", "SYS", "NV1", "NV2", "X", "NV2"]);
        // Every V100 has six NVLinks, all in use.
        for row in &CUBE_MESH_NVLINKS {
            assert_eq!(row.iter().map(|&n| u32::from(n)).sum::<u32>(), 6);
        }
    }

    #[test]
    fn cube_mesh_needs_eight_gpus() {
        assert_eq!(
            gpu_topology(TopologyKind::CubeMesh, &uuids(4), 1),
            Err(ShapeError::GpuCount { kind: TopologyKind::CubeMesh, needs: 8, got: 4 })
        );
    }

    #[test]
    fn none_has_no_annotation() {
        assert_eq!(gpu_topology(TopologyKind::None, &uuids(8), 1), Ok(None));
    }

    #[test]
    fn uuids_are_deterministic_and_distinct() {
        assert_eq!(gpu_uuid("s", "n", 0), gpu_uuid("s", "n", 0));
        assert_ne!(gpu_uuid("s", "n", 0), gpu_uuid("s", "n", 1));
        assert_ne!(gpu_uuid("s", "n", 0), gpu_uuid("s", "m", 0));
        let u = gpu_uuid("s", "n", 0);
        assert_eq!(u.len(), "GPU-".len() + 36);
        assert_eq!(u.matches('-').count(), 5);
    }

    #[test]
    fn the_wire_format_is_unchanged() {
        let uuids = ["GPU-a".to_string(), "GPU-b".to_string()];
        let t = gpu_topology(TopologyKind::Pcie, &uuids, 81920).unwrap().unwrap();
        assert_eq!(
            t.to_json(),
            r#"{"version":1,"gpus":[{"index":0,"uuid":"GPU-a","numa":0,"memoryMiB":81920},{"index":1,"uuid":"GPU-b","numa":1,"memoryMiB":81920}],"links":[["X","SYS"],["SYS","X"]]}"#
        );
    }

    #[test]
    fn the_scheduler_reads_every_shape_as_written() {
        for (kind, n) in
            [(TopologyKind::Nvswitch, 8), (TopologyKind::Pcie, 8), (TopologyKind::Pcie, 6), (TopologyKind::CubeMesh, 8)]
        {
            let t = gpu_topology(kind, &uuids(n), 81920).unwrap().unwrap();
            let (model, problem) = muster_core::devices::GpuTopology::from_node(Some(&t.to_json()), u64::from(n));
            assert_eq!(problem, None, "{kind}");
            assert!(model.is_known());
            let m = links(kind, n as usize).unwrap().unwrap();
            for (i, row) in m.iter().enumerate() {
                assert_eq!(model.numa(i), Some(numa(i, n as usize)), "{kind} GPU {i}");
                for (j, link) in row.iter().enumerate() {
                    assert_eq!(model.link(i, j), *link, "{kind} [{i}][{j}]");
                }
            }
        }
    }

    #[test]
    fn json_has_the_documented_shape() {
        let t = gpu_topology(TopologyKind::Pcie, &uuids(2), 81920).unwrap().unwrap();
        let v: serde_json::Value = serde_json::from_str(&t.to_json()).unwrap();
        assert_eq!(v["version"], 1);
        assert_eq!(v["gpus"][1]["index"], 1);
        assert_eq!(v["gpus"][1]["numa"], 1);
        assert_eq!(v["gpus"][0]["memoryMiB"], 81920);
        assert!(v["gpus"][0]["uuid"].as_str().unwrap().starts_with("GPU-"));
        assert_eq!(v["links"], serde_json::json!([["X", "SYS"], ["SYS", "X"]]));
    }
}

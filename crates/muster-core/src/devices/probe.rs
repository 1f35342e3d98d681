//! What a node's driver says about its GPUs (a [`Probe`]: identity, memory, live readings and
//! the link between every pair), and the two things the node agent publishes from it: the
//! `gpu.muster.dev/topology` annotation and health samples. PURE: asking the driver is the
//! shell's (`agent::nvml`), behind [`GpuProbe`].

use std::time::SystemTime;

use super::health::{GpuMetrics, NodeMetrics};
use super::topology::{GpuEntry, GpuTopology, Link, TOPOLOGY_VERSION, TopologyAnnotation, TopologyError};

/// One GPU as the driver describes it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProbedGpu {
    /// Device index, as nvidia-smi and the device plugin number it.
    pub index: u32,
    /// `GPU-...` UUID.
    pub uuid: String,
    /// NUMA node the GPU is attached to, when known.
    pub numa: Option<u32>,
    /// Total memory in MiB; 0 when the driver did not say.
    pub memory_total_mib: u64,
    /// Free memory in MiB, when known.
    pub memory_free_mib: Option<u64>,
    /// Die temperature in °C, when known.
    pub temperature_c: Option<f64>,
    /// Utilization over the driver's last sample period, 0..=1, when known.
    pub utilization: Option<f64>,
}

/// A node's GPUs and the link between every pair: `links[i][j]` is how `gpus[i]` reaches
/// `gpus[j]`, in nvidia-smi terms, with [`Link::SelfLink`] on the diagonal. Serialized (JSON,
/// links as nvidia-smi spells them) it is a recorded probe `muster node-agent --probe-file`
/// replays.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Probe {
    /// The GPUs, in any order.
    pub gpus: Vec<ProbedGpu>,
    /// The link matrix, by position in `gpus`.
    pub links: Vec<Vec<Link>>,
}

/// Why a node's GPUs could not be probed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    /// The library is not there: use another source.
    #[error("GPU driver library unavailable: {0}")]
    Unavailable(String),
    /// It is there and failed.
    #[error("GPU probe failed: {0}")]
    Failed(String),
}

/// Where a node's GPU facts come from (NVML, or a fake in tests).
pub trait GpuProbe {
    /// Asks for every GPU of the node and how they connect.
    fn probe(&self) -> Result<Probe, ProbeError>;
}

/// The `gpu.muster.dev/topology` annotation of a probe (same shape and checks as
/// [`nvidia_smi::build_annotation`](super::nvidia_smi::build_annotation)).
///
/// GPUs are listed in index order whatever order the probe has them in; an empty UUID and a
/// total memory of 0 mean unknown and are left out. The result passes the parser the
/// scheduler uses, or the error says which rule it breaks.
pub fn topology_annotation(probe: &Probe) -> Result<TopologyAnnotation, TopologyError> {
    let n = probe.gpus.len();
    if probe.links.len() != n {
        return Err(TopologyError::LinkRows { rows: probe.links.len(), gpus: n });
    }
    if let Some((row, cells)) = probe.links.iter().enumerate().find(|(_, r)| r.len() != n) {
        return Err(TopologyError::LinkCells { row, cells: cells.len(), gpus: n });
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&p| probe.gpus[p].index);
    let gpus = order.iter().map(|&p| entry(&probe.gpus[p])).collect();
    let links = order.iter().map(|&i| order.iter().map(|&j| probe.links[i][j].to_string()).collect()).collect();
    let annotation = TopologyAnnotation { version: TOPOLOGY_VERSION, gpus, links };
    GpuTopology::from_annotation(&annotation)?;
    Ok(annotation)
}

fn entry(gpu: &ProbedGpu) -> GpuEntry {
    GpuEntry {
        index: gpu.index,
        uuid: Some(gpu.uuid.clone()).filter(|u| !u.is_empty()),
        numa: gpu.numa,
        memory_mib: Some(gpu.memory_total_mib).filter(|&m| m > 0),
    }
}

/// Health samples at `now` for GPUs whose temperature and free memory are known
/// (utilization 0 when unknown); the free fraction is free over total memory.
pub fn node_metrics(probe: &Probe, now: SystemTime) -> NodeMetrics {
    let gpus = probe.gpus.iter().filter_map(|g| sample(g, now).map(|m| (g.index, m))).collect();
    NodeMetrics { gpus }
}

fn sample(gpu: &ProbedGpu, now: SystemTime) -> Option<GpuMetrics> {
    let temperature_c = gpu.temperature_c?;
    let free = gpu.memory_free_mib?;
    if gpu.memory_total_mib == 0 {
        return None;
    }
    Some(GpuMetrics {
        temperature_c,
        memory_free_fraction: free as f64 / gpu.memory_total_mib as f64,
        utilization: gpu.utilization.unwrap_or(0.0),
        observed_at: now,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::fixtures;
    use crate::devices::nvidia_smi::{build_annotation, parse_query, parse_topo};
    use proptest::prelude::*;
    use std::time::Duration;

    /// DGX-1 V100 as nvidia-smi prints it (tests/fixtures/nvidia-smi/dgx1-v100-topo.txt).
    const DGX1_LINKS: [[&str; 8]; 8] = [
        ["X", "NV1", "NV1", "NV2", "NV2", "SYS", "SYS", "SYS"],
        ["NV1", "X", "NV2", "NV1", "SYS", "NV2", "SYS", "SYS"],
        ["NV1", "NV2", "X", "NV2", "SYS", "SYS", "NV1", "SYS"],
        ["NV2", "NV1", "NV2", "X", "SYS", "SYS", "SYS", "NV1"],
        ["NV2", "SYS", "SYS", "SYS", "X", "NV1", "NV1", "NV2"],
        ["SYS", "NV2", "SYS", "SYS", "NV1", "X", "NV2", "NV1"],
        ["SYS", "SYS", "NV1", "SYS", "NV1", "NV2", "X", "NV2"],
        ["SYS", "SYS", "SYS", "NV1", "NV2", "NV1", "NV2", "X"],
    ];

    const DGX1_UUIDS: [&str; 8] = [
        "GPU-f1f836f9-9eee-3692-f09e-2e8c662248b4",
        "GPU-83b7ffc0-50fe-c94d-bca3-a0aac36098b2",
        "GPU-cc2bd818-3194-78da-6bd0-c621de49f145",
        "GPU-fda9988c-79fc-3552-6f7e-aed46725a2a7",
        "GPU-b860dcd6-c8a1-f8b4-6287-cced9041dff0",
        "GPU-2cee7374-43e2-1047-1948-d33296c87009",
        "GPU-e8a7f770-d910-6fd2-87db-7f1adbc60926",
        "GPU-f6967e78-93f5-7fd1-4c16-04d115cea325",
    ];

    fn gpu(index: u32) -> ProbedGpu {
        ProbedGpu {
            index,
            uuid: format!("GPU-{index}"),
            numa: None,
            memory_total_mib: 1000,
            memory_free_mib: None,
            temperature_c: None,
            utilization: None,
        }
    }

    /// The DGX-1 facts the fixture holds, listed in `order`.
    fn dgx1_probe(order: &[usize]) -> Probe {
        let link = |i: usize, j: usize| DGX1_LINKS[i][j].parse::<Link>().unwrap_or(Link::Sys);
        let gpus = order
            .iter()
            .map(|&i| ProbedGpu {
                uuid: DGX1_UUIDS[i].to_string(),
                numa: Some((i / 4) as u32),
                memory_total_mib: 32768,
                ..gpu(i as u32)
            })
            .collect();
        let links = order.iter().map(|&i| order.iter().map(|&j| link(i, j)).collect()).collect();
        Probe { gpus, links }
    }

    fn from_nvidia_smi() -> Option<TopologyAnnotation> {
        let topo = parse_topo(fixtures::DGX1_TOPO).ok()?;
        build_annotation(&topo, &parse_query(fixtures::DGX1_QUERY).ok()?).ok()
    }

    #[test]
    fn dgx1_probe_gives_the_nvidia_smi_annotation_in_any_gpu_order() {
        let want = from_nvidia_smi();
        assert!(want.is_some());
        // (case, order the driver lists the GPUs in)
        let cases: [(&str, Vec<usize>); 2] =
            [("index order", (0..8).collect()), ("shuffled", vec![5, 2, 7, 0, 3, 6, 1, 4])];
        for (case, order) in cases {
            assert_eq!(topology_annotation(&dgx1_probe(&order)).ok(), want, "{case}");
        }
    }

    #[test]
    fn broken_probes_are_errors_naming_the_rule() {
        type Case = (&'static str, Probe, fn(&TopologyError) -> bool);
        let two = || Probe {
            gpus: vec![gpu(0), gpu(1)],
            links: vec![vec![Link::SelfLink, Link::Pix], vec![Link::Pix, Link::SelfLink]],
        };
        let cases: Vec<Case> = vec![
            ("too few rows", Probe { links: vec![vec![Link::SelfLink, Link::Pix]], ..two() }, |e| {
                matches!(e, TopologyError::LinkRows { rows: 1, gpus: 2 })
            }),
            ("no matrix", Probe { links: vec![], ..two() }, |e| matches!(e, TopologyError::LinkRows { rows: 0, .. })),
            ("short row", Probe { links: vec![vec![Link::SelfLink, Link::Pix], vec![Link::Pix]], ..two() }, |e| {
                matches!(e, TopologyError::LinkCells { row: 1, cells: 1, gpus: 2 })
            }),
            (
                "asymmetric",
                Probe { links: vec![vec![Link::SelfLink, Link::Pix], vec![Link::Sys, Link::SelfLink]], ..two() },
                |e| matches!(e, TopologyError::Asymmetric { .. }),
            ),
            ("self link off the diagonal", Probe { links: vec![vec![Link::SelfLink; 2]; 2], ..two() }, |e| {
                matches!(e, TopologyError::Diagonal { row: 0, col: 1, .. })
            }),
            ("duplicate index", Probe { gpus: vec![gpu(1), gpu(1)], ..two() }, |e| {
                matches!(e, TopologyError::DuplicateIndex(1))
            }),
            ("index gap", Probe { gpus: vec![gpu(0), gpu(2)], ..two() }, |e| {
                matches!(e, TopologyError::IndexOutOfRange { index: 2, count: 2 })
            }),
        ];
        for (rule, probe, expected) in cases {
            match topology_annotation(&probe) {
                Ok(a) => panic!("{rule}: accepted {a:?}"),
                Err(e) => assert!(expected(&e), "{rule}: got {e}"),
            }
        }
    }

    #[test]
    fn unknown_uuid_and_memory_are_left_out_of_the_annotation() {
        let probe = Probe {
            gpus: vec![ProbedGpu { uuid: String::new(), memory_total_mib: 0, numa: Some(1), ..gpu(0) }],
            links: vec![vec![Link::SelfLink]],
        };
        let a = topology_annotation(&probe);
        let entry = a.as_ref().ok().and_then(|a| a.gpus.first());
        assert_eq!(entry, Some(&GpuEntry { index: 0, uuid: None, numa: Some(1), memory_mib: None }));
        assert_eq!(topology_annotation(&Probe { gpus: vec![], links: vec![] }).map(|a| a.gpus.len()), Ok(0));
    }

    #[test]
    fn node_metrics_needs_temperature_and_free_memory() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        /// (temperature, free fraction, utilization)
        type Sample = (f64, f64, f64);
        // (case, gpu, expected sample)
        let cases: Vec<(&str, ProbedGpu, Option<Sample>)> = vec![
            (
                "all known",
                ProbedGpu { memory_free_mib: Some(250), temperature_c: Some(61.0), utilization: Some(0.5), ..gpu(0) },
                Some((61.0, 0.25, 0.5)),
            ),
            (
                "utilization unknown counts as idle",
                ProbedGpu { memory_free_mib: Some(1000), temperature_c: Some(40.0), ..gpu(1) },
                Some((40.0, 1.0, 0.0)),
            ),
            ("no temperature", ProbedGpu { memory_free_mib: Some(1000), ..gpu(2) }, None),
            ("no free memory", ProbedGpu { temperature_c: Some(40.0), ..gpu(3) }, None),
            (
                "total memory unknown",
                ProbedGpu { memory_total_mib: 0, memory_free_mib: Some(5), temperature_c: Some(40.0), ..gpu(4) },
                None,
            ),
        ];
        let probe = Probe { gpus: cases.iter().map(|(_, g, _)| g.clone()).collect(), links: vec![] };
        let metrics = node_metrics(&probe, now);
        for (case, g, want) in &cases {
            let got = metrics.gpus.get(&g.index).map(|m| (m.temperature_c, m.memory_free_fraction, m.utilization));
            assert_eq!(got, *want, "{case}");
            if let Some(m) = metrics.gpus.get(&g.index) {
                assert_eq!(m.observed_at, now, "{case}");
            }
        }
    }

    proptest! {
        #[test]
        fn annotation_never_panics_and_round_trips_when_accepted(
            n in 0usize..6,
            cells in prop::collection::vec(
                prop::sample::select(vec![Link::SelfLink, Link::NvLink(2), Link::Pix, Link::Node, Link::Sys]), 0..40),
            rows in 0usize..7,
        ) {
            let gpus: Vec<ProbedGpu> = (0..n as u32).map(gpu).collect();
            let links: Vec<Vec<Link>> = cells.chunks(n.max(1)).take(rows).map(<[Link]>::to_vec).collect();
            if let Ok(a) = topology_annotation(&Probe { gpus, links }) {
                let model = GpuTopology::parse(&a.to_json());
                prop_assert_eq!(model.map(|m| m.to_annotation()), Ok(a));
            }
        }
    }
}

//! Pure parsers for `nvidia-smi topo -m` and `nvidia-smi --query-gpu=index,uuid,memory.total
//! --format=csv`, and the topology annotation built from both. Running nvidia-smi and talking
//! to the API server belong to `muster node-agent`, not here.

use super::topology::{GpuEntry, GpuTopology, Link, TOPOLOGY_VERSION, TopologyAnnotation, TopologyError};

/// Why nvidia-smi output could not be turned into an annotation.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NvidiaSmiError {
    /// No `GPU0 ...` header line in the `topo -m` output.
    #[error("no GPU matrix header (a line of GPU0 GPU1 ... columns) in `nvidia-smi topo -m` output")]
    NoHeader,
    /// A row of the `topo -m` matrix that does not fit the header.
    #[error("`nvidia-smi topo -m` line {line}: {reason}")]
    TopoRow {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// A line of the `--query-gpu` CSV that does not parse.
    #[error("`nvidia-smi --query-gpu` line {line}: {reason}")]
    QueryRow {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// The two outputs describe different GPUs.
    #[error("`topo -m` lists GPUs {topo:?} but `--query-gpu` lists {query:?}")]
    Mismatch {
        /// Indices in the matrix.
        topo: Vec<u32>,
        /// Indices in the CSV.
        query: Vec<u32>,
    },
    /// The result would not pass the annotation parser.
    #[error("inconsistent topology: {0}")]
    Topology(#[from] TopologyError),
}

/// One GPU row of the `topo -m` matrix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopoGpu {
    /// The index from the row label (`GPU3` -> 3).
    pub index: u32,
    /// `links[j]`: the link to the GPU in the matrix's j-th GPU column.
    pub links: Vec<Link>,
    /// The `NUMA Affinity` column, when present and not `N/A`.
    pub numa: Option<u32>,
}

/// The GPU part of a `topo -m` matrix (NIC rows and columns are dropped).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopoMatrix {
    /// GPU indices of the matrix's GPU columns, in column order.
    pub columns: Vec<u32>,
    /// The GPU rows, in row order.
    pub gpus: Vec<TopoGpu>,
}

/// One row of `nvidia-smi --query-gpu=index,uuid,memory.total --format=csv`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuQueryRow {
    /// Device index.
    pub index: u32,
    /// `GPU-...` UUID, unless nvidia-smi printed `[N/A]`.
    pub uuid: Option<String>,
    /// Total memory in MiB, unless `[N/A]`.
    pub memory_mib: Option<u64>,
}

/// Drops ANSI escape sequences: some nvidia-smi versions underline the header even when piped.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        if chars.peek() == Some(&'[') {
            chars.next();
            // Parameters and intermediates, then one final byte in '@'..='~'.
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        }
    }
    out
}

fn gpu_label(token: &str) -> Option<u32> {
    token.strip_prefix("GPU").filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))?.parse().ok()
}

/// Parses `nvidia-smi topo -m` output.
///
/// Cells are split on any whitespace, so tabs turned into spaces by a copy and paste still
/// parse. Device columns are the header words before `CPU Affinity`; `NUMA Affinity`, when the
/// driver prints it, gives each GPU's NUMA node. The matrix ends at the first blank line or the
/// `Legend:` line.
pub fn parse_topo(text: &str) -> Result<TopoMatrix, NvidiaSmiError> {
    let text = strip_ansi(text);
    let mut lines = text.lines().enumerate().map(|(n, l)| (n + 1, l));
    // The header is the first line starting GPU0 without an `X`: every GPU row has one.
    let header: Vec<&str> = lines
        .by_ref()
        .map(|(_, l)| l.split_whitespace().collect::<Vec<_>>())
        .find(|t| t.first() == Some(&"GPU0") && !t.contains(&"X"))
        .ok_or(NvidiaSmiError::NoHeader)?;
    let devices = header.windows(2).position(|w| w == ["CPU", "Affinity"]).unwrap_or(header.len());
    let trailing = header[devices..].join(" ");
    // Affinity cells follow the device cells: CPU Affinity, then NUMA Affinity if printed.
    let numa_cell = trailing.contains("NUMA Affinity").then_some(1);
    let columns: Vec<Option<u32>> = header[..devices].iter().map(|t| gpu_label(t)).collect();
    let gpu_columns: Vec<u32> = columns.iter().flatten().copied().collect();

    let mut gpus = Vec::new();
    for (line, raw) in lines {
        let cells: Vec<&str> = raw.split_whitespace().collect();
        let Some(label) = cells.first() else { break };
        if label.starts_with("Legend") {
            break;
        }
        let Some(index) = gpu_label(label) else {
            continue;
        };
        let row_err = |reason: String| NvidiaSmiError::TopoRow { line, reason };
        if cells.len() < 1 + devices {
            return Err(row_err(format!("{label} has {} cells for {devices} columns", cells.len() - 1)));
        }
        let mut links = Vec::with_capacity(gpu_columns.len());
        for (cell, column) in cells[1..=devices].iter().zip(&columns) {
            if column.is_none() {
                continue;
            }
            links.push(cell.parse::<Link>().map_err(|e| row_err(format!("{label}: {e}")))?);
        }
        let extra = &cells[1 + devices..];
        let numa = numa_cell.and_then(|i| extra.get(i)).and_then(|c| c.parse::<u32>().ok());
        gpus.push(TopoGpu { index, links, numa });
    }
    Ok(TopoMatrix { columns: gpu_columns, gpus })
}

/// Parses `nvidia-smi --query-gpu=index,uuid,memory.total --format=csv` output (with or
/// without header and units; columns found by header name when there is a header).
pub fn parse_query(text: &str) -> Result<Vec<GpuQueryRow>, NvidiaSmiError> {
    let mut rows = Vec::new();
    let mut positions = [0usize, 1, 2];
    for (n, raw) in text.lines().enumerate() {
        let line = n + 1;
        let fields: Vec<&str> = raw.split(',').map(str::trim).collect();
        if raw.trim().is_empty() {
            continue;
        }
        if fields.iter().any(|f| f.eq_ignore_ascii_case("index")) {
            let find = |want: &str| fields.iter().position(|f| f.to_ascii_lowercase().starts_with(want));
            let err = |what: &str| NvidiaSmiError::QueryRow { line, reason: format!("header has no {what} column") };
            positions = [
                find("index").ok_or_else(|| err("index"))?,
                find("uuid").ok_or_else(|| err("uuid"))?,
                find("memory.total").ok_or_else(|| err("memory.total"))?,
            ];
            continue;
        }
        let err = |reason: String| NvidiaSmiError::QueryRow { line, reason };
        let field =
            |i: usize| fields.get(positions[i]).copied().ok_or_else(|| err(format!("missing column {}", i + 1)));
        let index = field(0)?;
        let index: u32 = index.parse().map_err(|_| err(format!("index {index:?} is not a number")))?;
        let uuid = Some(field(1)?).filter(|u| !u.is_empty() && !is_na(u)).map(str::to_string);
        let memory = field(2)?;
        let memory_mib = if is_na(memory) {
            None
        } else {
            let digits = memory.strip_suffix("MiB").unwrap_or(memory).trim();
            Some(digits.parse::<u64>().map_err(|_| err(format!("memory.total {memory:?} is not MiB")))?)
        };
        rows.push(GpuQueryRow { index, uuid, memory_mib });
    }
    Ok(rows)
}

fn is_na(field: &str) -> bool {
    matches!(field, "[N/A]" | "N/A" | "[Not Supported]")
}

/// The `gpu.muster.dev/topology` annotation for a node, from both nvidia-smi outputs.
///
/// Both must list the same GPU indices; the result is checked with the same parser the
/// scheduler uses, so an annotation this returns is one the cluster will accept.
pub fn build_annotation(topo: &TopoMatrix, query: &[GpuQueryRow]) -> Result<TopologyAnnotation, NvidiaSmiError> {
    let mut topo_indices: Vec<u32> = topo.gpus.iter().map(|g| g.index).collect();
    let mut query_indices: Vec<u32> = query.iter().map(|q| q.index).collect();
    topo_indices.sort_unstable();
    query_indices.sort_unstable();
    let mut columns = topo.columns.clone();
    columns.sort_unstable();
    if topo_indices != query_indices || columns != topo_indices {
        return Err(NvidiaSmiError::Mismatch { topo: topo_indices, query: query_indices });
    }
    let n = topo.gpus.len();
    // Rows and columns in index order, whatever order nvidia-smi printed them in.
    let column_of = |index: u32| topo.columns.iter().position(|&c| c == index);
    let mut rows: Vec<&TopoGpu> = topo.gpus.iter().collect();
    rows.sort_by_key(|g| g.index);
    let mut links = Vec::with_capacity(n);
    for row in &rows {
        let mut cells = Vec::with_capacity(n);
        for j in 0..n as u32 {
            let link = column_of(j).and_then(|c| row.links.get(c)).copied().unwrap_or(Link::Sys);
            cells.push(link.to_string());
        }
        links.push(cells);
    }
    let gpus = rows
        .iter()
        .map(|row| {
            let q = query.iter().find(|q| q.index == row.index);
            GpuEntry {
                index: row.index,
                uuid: q.and_then(|q| q.uuid.clone()),
                numa: row.numa,
                memory_mib: q.and_then(|q| q.memory_mib),
            }
        })
        .collect();
    let annotation = TopologyAnnotation { version: TOPOLOGY_VERSION, gpus, links };
    GpuTopology::from_annotation(&annotation)?;
    Ok(annotation)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::fixtures;
    use proptest::prelude::*;

    fn model(topo: &str, query: &str) -> Result<GpuTopology, NvidiaSmiError> {
        let a = build_annotation(&parse_topo(topo)?, &parse_query(query)?)?;
        Ok(GpuTopology::parse(&a.to_json())?)
    }

    #[test]
    fn dgx_h100_is_all_nv18_with_nics_dropped() {
        let t = model(fixtures::DGX_H100_TOPO, fixtures::DGX_H100_QUERY);
        let t = t.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.len(), 8);
        for i in 0..8 {
            for j in (0..8).filter(|&j| j != i) {
                assert_eq!(t.link(i, j), Link::NvLink(18), "{i}-{j}");
            }
        }
        assert_eq!((t.numa(0), t.numa(3), t.numa(4), t.numa(7)), (Some(0), Some(0), Some(1), Some(1)));
        assert_eq!(t.gpus()[0].memory_mib, Some(81559));
        assert!(t.gpus()[7].uuid.as_deref().is_some_and(|u| u.starts_with("GPU-")));
    }

    #[test]
    fn pcie_box_has_pix_pairs_node_within_and_sys_across_sockets() {
        let t = model(fixtures::PCIE_TOPO, fixtures::PCIE_QUERY).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.link(0, 1), Link::Pix);
        assert_eq!(t.link(0, 2), Link::Node);
        assert_eq!(t.link(3, 4), Link::Sys);
        assert_eq!(t.link(6, 7), Link::Pix);
        assert_eq!(t.numa_groups().len(), 2);
        assert_eq!(t.gpus()[5].memory_mib, Some(46068));
    }

    #[test]
    fn dgx1_hybrid_cube_mesh_has_six_links_per_gpu() {
        let t = model(fixtures::DGX1_TOPO, fixtures::DGX1_QUERY).unwrap_or_else(|e| panic!("{e}"));
        for i in 0..8 {
            let links: u32 = (0..8)
                .map(|j| match t.link(i, j) {
                    Link::NvLink(n) => u32::from(n),
                    _ => 0,
                })
                .sum();
            assert_eq!(links, 6, "GPU{i}");
        }
        assert_eq!(t.link(0, 3), Link::NvLink(2));
        assert_eq!(t.link(0, 1), Link::NvLink(1));
        assert_eq!(t.link(0, 5), Link::Sys);
        assert_eq!(t.numa(6), Some(1));
    }

    #[test]
    fn header_without_numa_affinity_leaves_numa_unknown() {
        // Drivers before NUMA Affinity existed print only CPU Affinity.
        let text = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tPHB\t0-11\nGPU1\tPHB\t X \t0-11\n\nLegend:\n";
        let m = parse_topo(text);
        assert_eq!(m.as_ref().map(|m| m.gpus.iter().map(|g| g.numa).collect::<Vec<_>>()), Ok(vec![None, None]));
    }

    #[test]
    fn spaces_instead_of_tabs_still_parse() {
        let text = "        GPU0    GPU1    CPU Affinity    NUMA Affinity\n\
                    GPU0     X      NV4     0-7     0\n\
                    GPU1    NV4      X      0-7     N/A\n";
        let m = parse_topo(text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(m.gpus[0].links, vec![Link::SelfLink, Link::NvLink(4)]);
        assert_eq!((m.gpus[0].numa, m.gpus[1].numa), (Some(0), None));
    }

    #[test]
    fn topo_errors_name_the_line() {
        assert_eq!(parse_topo("nvidia-smi: command not found\n"), Err(NvidiaSmiError::NoHeader));
        let short = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \n";
        assert!(matches!(parse_topo(short), Err(NvidiaSmiError::TopoRow { line: 2, .. })));
        let token = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNVX\t0\nGPU1\tNVX\t X \t0\n";
        assert!(matches!(parse_topo(token), Err(NvidiaSmiError::TopoRow { line: 2, .. })));
    }

    #[test]
    fn query_parses_with_and_without_header_and_units() {
        let with = "index, uuid, memory.total [MiB]\n0, GPU-a, 81920 MiB\n1, GPU-b, [N/A]\n";
        let without = "0, GPU-a, 81920\n1, GPU-b, [N/A]\n";
        let want = vec![
            GpuQueryRow { index: 0, uuid: Some("GPU-a".into()), memory_mib: Some(81920) },
            GpuQueryRow { index: 1, uuid: Some("GPU-b".into()), memory_mib: None },
        ];
        assert_eq!(parse_query(with), Ok(want.clone()));
        assert_eq!(parse_query(without), Ok(want));
        // Columns in another order are found by name.
        let reordered = "uuid, memory.total [MiB], index\nGPU-z, 10 MiB, 3\n";
        assert_eq!(
            parse_query(reordered),
            Ok(vec![GpuQueryRow { index: 3, uuid: Some("GPU-z".into()), memory_mib: Some(10) }])
        );
    }

    #[test]
    fn query_errors_name_the_line() {
        assert!(matches!(parse_query("index, uuid\n"), Err(NvidiaSmiError::QueryRow { line: 1, .. })));
        assert!(matches!(parse_query("x, GPU-a, 1 MiB\n"), Err(NvidiaSmiError::QueryRow { line: 1, .. })));
        assert!(matches!(parse_query("0, GPU-a, lots\n"), Err(NvidiaSmiError::QueryRow { line: 1, .. })));
        assert!(matches!(parse_query("0\n"), Err(NvidiaSmiError::QueryRow { line: 1, .. })));
    }

    #[test]
    fn outputs_describing_different_gpus_are_refused() {
        let topo = parse_topo(fixtures::DGX1_TOPO).unwrap_or_else(|e| panic!("{e}"));
        let mut query = parse_query(fixtures::DGX1_QUERY).unwrap_or_default();
        query.pop();
        assert!(matches!(build_annotation(&topo, &query), Err(NvidiaSmiError::Mismatch { .. })));
    }

    #[test]
    fn asymmetric_matrix_is_refused_by_the_annotation_parser() {
        let topo = parse_topo("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV2\t0\nGPU1\tNV1\t X \t0\n");
        let query = parse_query("0, GPU-a, 1 MiB\n1, GPU-b, 1 MiB\n").unwrap_or_default();
        let built = topo.map(|t| build_annotation(&t, &query));
        assert!(matches!(built, Ok(Err(NvidiaSmiError::Topology(TopologyError::Asymmetric { .. })))));
    }

    proptest! {
        #[test]
        fn parsers_never_panic(s in ".*", lines in prop::collection::vec(
            prop::sample::select(vec![
                "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity", "GPU0\t X \tNV2\t0-3\t0", "GPU1\tNV2\t X ",
                "GPU1", "NIC0\tPIX", "", "Legend:", "\u{1b}[4m", "0, GPU-a, 5 MiB", "index, uuid",
            ]),
            0..8,
        )) {
            let _ = parse_topo(&s);
            let _ = parse_query(&s);
            let text = lines.join("\n");
            if let (Ok(t), Ok(q)) = (parse_topo(&text), parse_query(&text)) {
                let _ = build_annotation(&t, &q);
            }
        }
    }
}

//! The GPU model of one node: the `gpu.muster.dev/topology` annotation, its strict parser,
//! link kinds and their costs. Parsing never panics and never fails the caller: a node whose
//! annotation is missing or malformed becomes "N GPUs of unknown topology" plus a reason.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::gpuset::{GpuSet, MAX_GPUS};
use super::problem::{GpuProblem, GpuProblemKind};

/// The only annotation version this parser understands.
pub const TOPOLOGY_VERSION: u32 = 1;

/// How two GPUs are connected, as `nvidia-smi topo -m` prints it (and serialized so).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum Link {
    /// `X`: the GPU itself (the diagonal of the matrix).
    SelfLink,
    /// `NV<n>`: a bonded set of `n` NVLinks (n >= 1).
    NvLink(u8),
    /// `PIX`: at most one PCIe bridge.
    Pix,
    /// `PXB`: several PCIe bridges, no host bridge.
    Pxb,
    /// `PHB`: through a PCIe host bridge (typically the CPU).
    Phb,
    /// `NODE`: between host bridges within one NUMA node.
    Node,
    /// `SYS`: across the SMP interconnect between NUMA nodes (QPI/UPI).
    Sys,
}

/// Cost of a `PIX` link; NVLink of any width costs less, every other PCIe path more.
const PIX_COST: u32 = 3000;

impl Link {
    /// Relative cost of moving data over this link: lower is better, `SelfLink` is 0.
    ///
    /// NVLink costs `100 + 2400 / n`, so more bonded links are cheaper (NV18 233, NV12 300,
    /// NV2 1300, NV1 2500) and even one link beats PCIe. The PCIe tiers follow nvidia-smi's
    /// own ordering, spaced so that crossing a socket (`SYS`) is clearly the worst.
    pub const fn cost(self) -> u32 {
        match self {
            Link::SelfLink => 0,
            Link::NvLink(n) => {
                let n = if n == 0 { 1 } else { n as u32 };
                100 + 2400 / n
            }
            Link::Pix => PIX_COST,
            Link::Pxb => 3500,
            Link::Phb => 4500,
            Link::Node => 6000,
            Link::Sys => 9000,
        }
    }

    /// Whether this is a direct NVLink connection.
    pub const fn is_nvlink(self) -> bool {
        matches!(self, Link::NvLink(_))
    }
}

/// A link token that is not one nvidia-smi prints.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown link {0:?} (expected X, NV<n>, PIX, PXB, PHB, NODE or SYS)")]
pub struct UnknownLink(pub String);

impl FromStr for Link {
    type Err = UnknownLink;

    fn from_str(s: &str) -> Result<Self, UnknownLink> {
        let link = match s {
            "X" => Link::SelfLink,
            "PIX" => Link::Pix,
            "PXB" => Link::Pxb,
            "PHB" => Link::Phb,
            "NODE" => Link::Node,
            // Drivers before 2017 printed SOC for what is now SYS.
            "SYS" | "SOC" => Link::Sys,
            _ => {
                let n = s
                    .strip_prefix("NV")
                    .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|d| d.parse::<u8>().ok())
                    .filter(|&n| n > 0);
                match n {
                    Some(n) => Link::NvLink(n),
                    None => return Err(UnknownLink(s.to_string())),
                }
            }
        };
        Ok(link)
    }
}

impl TryFrom<String> for Link {
    type Error = UnknownLink;

    fn try_from(s: String) -> Result<Self, UnknownLink> {
        s.parse()
    }
}

impl From<Link> for String {
    fn from(link: Link) -> String {
        link.to_string()
    }
}

impl fmt::Display for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Link::SelfLink => f.write_str("X"),
            Link::NvLink(n) => write!(f, "NV{n}"),
            Link::Pix => f.write_str("PIX"),
            Link::Pxb => f.write_str("PXB"),
            Link::Phb => f.write_str("PHB"),
            Link::Node => f.write_str("NODE"),
            Link::Sys => f.write_str("SYS"),
        }
    }
}

/// The `gpu.muster.dev/topology` annotation exactly as serialized.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopologyAnnotation {
    /// Format version; only [`TOPOLOGY_VERSION`] is understood.
    pub version: u32,
    /// One entry per GPU; indices must be exactly `0..gpus.len()`, in any order.
    pub gpus: Vec<GpuEntry>,
    /// `links[i][j]`: how GPU `i` reaches GPU `j`, as nvidia-smi prints it.
    pub links: Vec<Vec<String>>,
}

/// One GPU of the annotation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GpuEntry {
    /// Device index as nvidia-smi and the device plugin number it.
    pub index: u32,
    /// `GPU-...` UUID, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// NUMA node the GPU is attached to; absent or null when unknown.
    #[serde(default)]
    pub numa: Option<u32>,
    /// Total memory in MiB, when known.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "memoryMiB")]
    pub memory_mib: Option<u64>,
}

impl TopologyAnnotation {
    /// The annotation value (compact JSON).
    pub fn to_json(&self) -> String {
        // Serializing plain strings and integers cannot fail; fall back to an empty object
        // rather than panic should serde ever disagree.
        serde_json::to_string(self).unwrap_or_else(|_| String::from("{}"))
    }
}

/// Why a topology annotation was not used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    /// The annotation is not the expected JSON shape.
    #[error("not valid topology JSON: {0}")]
    Json(String),
    /// A version this parser does not know.
    #[error("unsupported version {0} (expected {TOPOLOGY_VERSION})")]
    Version(u32),
    /// More GPUs than one node may have.
    #[error("{0} GPUs listed, at most {MAX_GPUS} are supported")]
    TooManyGpus(usize),
    /// Two entries with the same index.
    #[error("GPU index {0} listed twice")]
    DuplicateIndex(u32),
    /// An index outside `0..gpus.len()`.
    #[error("GPU index {index} out of range for {count} GPUs")]
    IndexOutOfRange {
        /// The offending index.
        index: u32,
        /// How many GPUs are listed.
        count: usize,
    },
    /// The matrix does not have one row per GPU.
    #[error("links has {rows} rows for {gpus} GPUs")]
    LinkRows {
        /// Rows found.
        rows: usize,
        /// GPUs listed.
        gpus: usize,
    },
    /// A matrix row does not have one cell per GPU.
    #[error("links[{row}] has {cells} cells for {gpus} GPUs")]
    LinkCells {
        /// The row.
        row: usize,
        /// Cells found.
        cells: usize,
        /// GPUs listed.
        gpus: usize,
    },
    /// A cell that is not an nvidia-smi link token.
    #[error("links[{row}][{col}]: {source}")]
    UnknownLink {
        /// The row.
        row: usize,
        /// The column.
        col: usize,
        /// The token.
        source: UnknownLink,
    },
    /// `X` off the diagonal, or something else on it.
    #[error("links[{row}][{col}] is {link}: X belongs exactly on the diagonal")]
    Diagonal {
        /// The row.
        row: usize,
        /// The column.
        col: usize,
        /// What was found.
        link: String,
    },
    /// `links[i][j]` differs from `links[j][i]`.
    #[error("links[{row}][{col}] is {a} but links[{col}][{row}] is {b}")]
    Asymmetric {
        /// The row.
        row: usize,
        /// The column.
        col: usize,
        /// `links[row][col]`.
        a: Link,
        /// `links[col][row]`.
        b: Link,
    },
    /// The annotation and the whole GPUs the node's DRA driver publishes disagree (count or
    /// UUIDs).
    #[error(
        "annotation describes {annotated} GPUs but the DRA driver publishes {published} whole GPUs{}; \
         GPUs are chosen by the driver's pcieRoot/numaNode attributes and named by device minor",
        if unknown.is_empty() { String::new() } else { format!(" (not in the annotation: {})", unknown.join(", ")) }
    )]
    DevicesDisagree {
        /// GPUs in the annotation.
        annotated: usize,
        /// Whole GPUs published.
        published: usize,
        /// Published UUIDs the annotation does not name (at most 3).
        unknown: Vec<String>,
    },
    /// The annotation and the node's allocatable GPUs disagree.
    #[error("annotation describes {annotated} GPUs but the node allocates {allocatable} nvidia.com/gpu")]
    CountMismatch {
        /// GPUs in the annotation.
        annotated: usize,
        /// The node's allocatable `nvidia.com/gpu`.
        allocatable: u64,
    },
}

/// Why a node's topology annotation was not used (the node is then `allocatable` GPUs of
/// unknown topology, at most [`MAX_GPUS`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopologyProblem {
    /// What is wrong with the annotation; `None` when there is none.
    pub error: Option<TopologyError>,
    /// The node's allocatable `nvidia.com/gpu`.
    pub allocatable: u64,
}

impl TopologyProblem {
    /// The problem as an operator hears it, typed by kind.
    pub fn problem(&self) -> GpuProblem {
        let kind = match self.error {
            None => GpuProblemKind::TopologyMissing,
            Some(TopologyError::CountMismatch { .. } | TopologyError::DevicesDisagree { .. }) => {
                GpuProblemKind::TopologyMismatch
            }
            Some(_) => GpuProblemKind::TopologyMalformed,
        };
        GpuProblem { kind, message: format!("GPU topology: {self}") }
    }
}

impl fmt::Display for TopologyProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.error {
            None => f.write_str("no gpu.muster.dev/topology annotation: all GPU links treated as SYS")?,
            Some(e) => write!(f, "gpu.muster.dev/topology ignored: {e}")?,
        }
        if self.allocatable > MAX_GPUS as u64 {
            write!(f, "; only the first {MAX_GPUS} of {} GPUs are used", self.allocatable)?;
        }
        Ok(())
    }
}

/// One GPU of the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    /// `GPU-...` UUID, when known.
    pub uuid: Option<String>,
    /// NUMA node, when known.
    pub numa: Option<u32>,
    /// Total memory in MiB, when known.
    pub memory_mib: Option<u64>,
}

/// The parts of a [`GpuTopology`] that GPU choice depends on, to share one answer between
/// nodes of the same kind (see [`GpuTopology::selection_key`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelectionKey {
    links: Vec<Link>,
    numa: Vec<Option<u32>>,
    known: bool,
    /// A hash of the fields above, computed once: a cycle looks up the kind of every node
    /// (5,000), and hashing the whole link matrix each time was a measurable part of it.
    fingerprint: u64,
}

impl SelectionKey {
    fn new(links: Vec<Link>, numa: Vec<Option<u32>>, known: bool) -> Self {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::hash::DefaultHasher::new();
        (&links, &numa, known).hash(&mut hasher);
        SelectionKey { links, numa, known, fingerprint: hasher.finish() }
    }
}

impl std::hash::Hash for SelectionKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // Equal keys have equal fingerprints; the map compares the fields on a match.
        state.write_u64(self.fingerprint);
    }
}

/// The GPUs of one node and how they connect; GPU `i` is the one with device index `i`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuTopology {
    /// The node's own: UUIDs and memory.
    gpus: Vec<Gpu>,
    /// How they connect, shared by every node of the same shape ([`Shape::shared`]).
    shape: Arc<Shape>,
}

/// What a topology holds beyond its GPUs' identities: links, costs and NUMA placement. Nodes of
/// one model have the same (5,000 nodes of 8 GPUs held 5,000 equal copies, about 3 MiB), so
/// they share one.
#[derive(Debug, PartialEq, Eq)]
struct Shape {
    /// Row-major `n * n` link matrix.
    links: Vec<Link>,
    /// `links` turned into costs once, because selection reads it in its innermost loop.
    costs: Vec<u32>,
    /// Each known NUMA node with its GPUs, ascending by NUMA id.
    numa_groups: Vec<(u32, GpuSet)>,
    /// Per GPU: one bit for its position in `numa_groups` (0 when unknown), so a search can
    /// carry the NUMA nodes of a partial set as one word.
    numa_bits: Vec<u64>,
    known: bool,
    /// What selection reads of it ([`GpuTopology::selection_key`]), built once.
    key: Arc<SelectionKey>,
}

/// Past this many shapes kept (or twice those in use at the last pruning, if more), those no
/// topology uses any more are forgotten.
const SHAPES_KEPT: usize = 256;

/// The shapes in use, by fingerprint, as weak references: a shape no topology uses any more is
/// dropped, and its entry goes at the next pruning ([`SHAPES_KEPT`]).
#[derive(Debug)]
struct Shapes {
    by_fingerprint: std::collections::HashMap<u64, Vec<std::sync::Weak<Shape>>>,
    /// Entries, live or not.
    kept: usize,
    /// Pruned when `kept` reaches it.
    prune_at: usize,
}

impl Default for Shapes {
    fn default() -> Self {
        Shapes { by_fingerprint: Default::default(), kept: 0, prune_at: SHAPES_KEPT }
    }
}

impl Shapes {
    /// The shape equal to `shape` in use, or `shape` itself, kept for the next one.
    fn share(&mut self, shape: Shape) -> Arc<Shape> {
        let fingerprint = shape.key.fingerprint;
        if let Some(found) = self
            .by_fingerprint
            .get(&fingerprint)
            .into_iter()
            .flatten()
            .filter_map(std::sync::Weak::upgrade)
            .find(|s| **s == shape)
        {
            return found;
        }
        if self.kept >= self.prune_at {
            self.by_fingerprint.retain(|_, shapes| {
                shapes.retain(|s| s.strong_count() > 0);
                !shapes.is_empty()
            });
            self.kept = self.by_fingerprint.values().map(Vec::len).sum();
            self.prune_at = (2 * self.kept).max(SHAPES_KEPT);
        }
        let shape = Arc::new(shape);
        self.by_fingerprint.entry(fingerprint).or_default().push(Arc::downgrade(&shape));
        self.kept += 1;
        shape
    }
}

impl Shape {
    /// The shape of `gpus` (their NUMA nodes) linked by `links`.
    fn of(gpus: &[Gpu], links: Vec<Link>, known: bool) -> Shape {
        let costs = links.iter().map(|l| l.cost()).collect();
        let mut numa_groups: Vec<(u32, GpuSet)> = Vec::new();
        for (i, gpu) in gpus.iter().enumerate() {
            let Some(numa) = gpu.numa else { continue };
            let bit = GpuSet::single(i).unwrap_or_default();
            match numa_groups.iter_mut().find(|(id, _)| *id == numa) {
                Some((_, set)) => *set = set.union(bit),
                None => numa_groups.push((numa, bit)),
            }
        }
        numa_groups.sort_by_key(|(id, _)| *id);
        // At most 64 GPUs, so at most 64 groups: every group gets its own bit.
        let numa_bits = (0..gpus.len())
            .map(|i| numa_groups.iter().position(|(_, g)| g.contains(i)).map_or(0, |p| 1u64 << (p % 64)))
            .collect();
        let key = Arc::new(SelectionKey::new(links.clone(), gpus.iter().map(|g| g.numa).collect(), known));
        Shape { links, costs, numa_groups, numa_bits, known, key }
    }

    /// The one shape equal to `shape` in use anywhere in the process, or `shape` itself, which
    /// others then share ([`Shapes`]).
    fn shared(shape: Shape) -> Arc<Shape> {
        static SHAPES: std::sync::LazyLock<std::sync::Mutex<Shapes>> = std::sync::LazyLock::new(Default::default);
        // A poisoned lock (a panic elsewhere): a shape of its own, as before.
        match SHAPES.lock() {
            Ok(mut shapes) => shapes.share(shape),
            Err(_) => Arc::new(shape),
        }
    }
}

impl GpuTopology {
    /// `n` GPUs (at most 64) of unknown topology: every pair `SYS`, no NUMA information.
    pub fn unknown(n: usize) -> Self {
        let n = n.min(MAX_GPUS);
        let gpus = vec![Gpu { uuid: None, numa: None, memory_mib: None }; n];
        let links = (0..n * n).map(|c| if c / n == c % n { Link::SelfLink } else { Link::Sys }).collect();
        Self::assemble(gpus, links, false)
    }

    /// [`Self::unknown`], one `Arc` per GPU count for the whole process: every node without a
    /// usable topology annotation and with as many GPUs shares it (5,000 such nodes held 5,000
    /// copies, each with its link and cost matrices), and so shares its chooser kind.
    pub fn unknown_shared(n: usize) -> Arc<Self> {
        static UNKNOWN: std::sync::LazyLock<std::sync::Mutex<std::collections::HashMap<usize, Arc<GpuTopology>>>> =
            std::sync::LazyLock::new(Default::default);
        let n = n.min(MAX_GPUS);
        // A poisoned lock (a panic elsewhere): a copy of its own, as before.
        let Ok(mut shared) = UNKNOWN.lock() else { return Arc::new(Self::unknown(n)) };
        shared.entry(n).or_insert_with(|| Arc::new(Self::unknown(n))).clone()
    }

    /// Parses an annotation value; errors say what is wrong, nothing panics.
    pub fn parse(json: &str) -> Result<Self, TopologyError> {
        let annotation: TopologyAnnotation =
            serde_json::from_str(json).map_err(|e| TopologyError::Json(e.to_string()))?;
        Self::from_annotation(&annotation)
    }

    /// Checks a deserialized annotation and builds the model from it.
    pub fn from_annotation(a: &TopologyAnnotation) -> Result<Self, TopologyError> {
        if a.version != TOPOLOGY_VERSION {
            return Err(TopologyError::Version(a.version));
        }
        let n = a.gpus.len();
        if n > MAX_GPUS {
            return Err(TopologyError::TooManyGpus(n));
        }
        let mut slots: Vec<Option<Gpu>> = vec![None; n];
        for entry in &a.gpus {
            let slot = usize::try_from(entry.index)
                .ok()
                .and_then(|i| slots.get_mut(i))
                .ok_or(TopologyError::IndexOutOfRange { index: entry.index, count: n })?;
            if slot.is_some() {
                return Err(TopologyError::DuplicateIndex(entry.index));
            }
            *slot = Some(Gpu { uuid: entry.uuid.clone(), numa: entry.numa, memory_mib: entry.memory_mib });
        }
        // n entries, no duplicates, all in range: every slot is filled.
        let gpus: Vec<Gpu> = slots.into_iter().flatten().collect();

        if a.links.len() != n {
            return Err(TopologyError::LinkRows { rows: a.links.len(), gpus: n });
        }
        let mut links = Vec::with_capacity(n * n);
        for (row, cells) in a.links.iter().enumerate() {
            if cells.len() != n {
                return Err(TopologyError::LinkCells { row, cells: cells.len(), gpus: n });
            }
            for (col, token) in cells.iter().enumerate() {
                let link: Link =
                    token.trim().parse().map_err(|source| TopologyError::UnknownLink { row, col, source })?;
                if (row == col) != (link == Link::SelfLink) {
                    return Err(TopologyError::Diagonal { row, col, link: token.clone() });
                }
                links.push(link);
            }
        }
        for row in 0..n {
            for col in row + 1..n {
                let (a, b) = (links[row * n + col], links[col * n + row]);
                if a != b {
                    return Err(TopologyError::Asymmetric { row, col, a, b });
                }
            }
        }
        Ok(Self::assemble(gpus, links, true))
    }

    /// The model for a node: its topology annotation if present and sound, else
    /// `allocatable` GPUs of unknown topology together with the reason why.
    ///
    /// An annotation whose GPU count differs from `allocatable` is not trusted either: the
    /// device plugin decides how many GPUs exist, and a stale annotation could name indices
    /// the node does not have.
    pub fn from_node(annotation: Option<&str>, allocatable: u64) -> (Self, Option<TopologyProblem>) {
        let parsed = annotation.map(|json| Self::parse(json).map(Arc::new));
        let (model, problem) = Self::checked(parsed.as_ref(), allocatable);
        (Arc::unwrap_or_clone(model), problem)
    }

    /// [`Self::from_node`] of an annotation parsed before (`None`: no annotation), so a node's
    /// annotation is parsed once and checked against whatever count its GPUs have now; a
    /// sound annotation's model is shared, not copied.
    pub fn checked(
        parsed: Option<&Result<Arc<Self>, TopologyError>>,
        allocatable: u64,
    ) -> (Arc<Self>, Option<TopologyProblem>) {
        let unknown = |error: Option<TopologyError>| {
            let fallback = usize::try_from(allocatable).unwrap_or(usize::MAX);
            (Self::unknown_shared(fallback), Some(TopologyProblem { error, allocatable }))
        };
        match parsed {
            None if allocatable == 0 => (Self::unknown_shared(0), None),
            None => unknown(None),
            Some(Ok(model)) if model.len() as u64 == allocatable => (model.clone(), None),
            Some(Ok(model)) => unknown(Some(TopologyError::CountMismatch { annotated: model.len(), allocatable })),
            Some(Err(e)) => unknown(Some(e.clone())),
        }
    }

    /// A topology of `gpus` linked as `link(i, j)` says (asked for `i < j` only; the matrix is
    /// made symmetric with `X` on the diagonal), at most [`MAX_GPUS`] (the rest are dropped).
    /// `known`: whether the links come from something that knows them (not all assumed).
    pub fn from_links(mut gpus: Vec<Gpu>, link: impl Fn(usize, usize) -> Link, known: bool) -> Self {
        gpus.truncate(MAX_GPUS);
        let n = gpus.len();
        let mut links = vec![Link::SelfLink; n * n];
        for i in 0..n {
            for j in i + 1..n {
                let l = link(i, j);
                let l = if l == Link::SelfLink { Link::Sys } else { l };
                links[i * n + j] = l;
                links[j * n + i] = l;
            }
        }
        Self::assemble(gpus, links, known)
    }

    fn assemble(gpus: Vec<Gpu>, links: Vec<Link>, known: bool) -> Self {
        let shape = Shape::shared(Shape::of(&gpus, links, known));
        GpuTopology { gpus, shape }
    }

    /// What selection and scoring read of this topology (links, NUMA placement, whether it is
    /// known; not UUIDs or memory): nodes with equal keys get the same GPU choices.
    pub fn selection_key(&self) -> Arc<SelectionKey> {
        self.shape.key.clone()
    }

    /// Number of GPUs.
    pub fn len(&self) -> usize {
        self.gpus.len()
    }

    /// Whether the node has no GPUs.
    pub fn is_empty(&self) -> bool {
        self.gpus.is_empty()
    }

    /// Whether the links came from an annotation (false: all assumed `SYS`).
    pub fn is_known(&self) -> bool {
        self.shape.known
    }

    /// Every GPU of the node.
    pub fn all(&self) -> GpuSet {
        GpuSet::first(self.len())
    }

    /// The GPUs, by index.
    pub fn gpus(&self) -> &[Gpu] {
        &self.gpus
    }

    /// NUMA node of GPU `i`, when known.
    pub fn numa(&self, i: usize) -> Option<u32> {
        self.gpus.get(i).and_then(|g| g.numa)
    }

    /// Each known NUMA node with its GPUs, ascending by NUMA id.
    pub fn numa_groups(&self) -> &[(u32, GpuSet)] {
        &self.shape.numa_groups
    }

    /// How GPU `i` reaches GPU `j` (`SYS` for indices outside the node).
    pub fn link(&self, i: usize, j: usize) -> Link {
        let n = self.len();
        if i < n && j < n { self.shape.links[i * n + j] } else { Link::Sys }
    }

    /// Cost of the link between GPU `i` and GPU `j`.
    #[inline]
    pub fn link_cost(&self, i: usize, j: usize) -> u32 {
        let n = self.len();
        if i < n && j < n { self.shape.costs[i * n + j] } else { Link::Sys.cost() }
    }

    /// The NUMA node of GPU `i` as one bit (its position among [`Self::numa_groups`]); 0 when
    /// unknown. `numa_bit(a) | numa_bit(b)` has as many bits as NUMA nodes `a` and `b` span.
    #[inline]
    pub fn numa_bit(&self, i: usize) -> u64 {
        self.shape.numa_bits.get(i).copied().unwrap_or(0)
    }

    /// How many distinct known NUMA nodes the GPUs of `set` sit on (unknown ones count none).
    pub fn numa_span(&self, set: GpuSet) -> usize {
        self.shape.numa_groups.iter().filter(|(_, g)| !g.is_disjoint(set)).count()
    }

    /// Whether every GPU of `set` has a known NUMA node and it is the same one.
    pub fn single_numa(&self, set: GpuSet) -> bool {
        self.shape.numa_groups.iter().any(|(_, g)| set.is_subset(*g))
    }

    /// Whether every pair of `set` is joined by a direct NVLink (one NVLink domain).
    pub fn all_nvlinked(&self, set: GpuSet) -> bool {
        set.iter().all(|i| set.iter().all(|j| i == j || self.link(i, j).is_nvlink()))
    }

    /// The model as an annotation (what `muster node-agent` writes).
    pub fn to_annotation(&self) -> TopologyAnnotation {
        let n = self.len();
        TopologyAnnotation {
            version: TOPOLOGY_VERSION,
            gpus: self
                .gpus
                .iter()
                .enumerate()
                .map(|(i, g)| GpuEntry {
                    index: i as u32,
                    uuid: g.uuid.clone(),
                    numa: g.numa,
                    memory_mib: g.memory_mib,
                })
                .collect(),
            links: (0..n).map(|i| (0..n).map(|j| self.link(i, j).to_string()).collect()).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    fn annotation(gpus: Value, links: Value) -> String {
        json!({"version": 1, "gpus": gpus, "links": links}).to_string()
    }

    fn two_gpus(links: Value) -> String {
        annotation(
            json!([{"index": 0, "uuid": "GPU-a", "numa": 0, "memoryMiB": 81920},
                   {"index": 1, "uuid": "GPU-b", "numa": 1, "memoryMiB": 81920}]),
            links,
        )
    }

    #[test]
    fn nvlink_with_more_links_costs_less_and_beats_pcie() {
        let order = ["NV18", "NV12", "NV4", "NV2", "NV1", "PIX", "PXB", "PHB", "NODE", "SYS"];
        let costs: Vec<u32> = order.iter().map(|t| t.parse::<Link>().map(Link::cost).unwrap_or(0)).collect();
        assert!(costs.windows(2).all(|w| w[0] < w[1]), "{costs:?}");
        assert_eq!(Link::SelfLink.cost(), 0);
    }

    #[test]
    fn link_tokens_round_trip_and_soc_means_sys() {
        for t in ["X", "NV1", "NV18", "PIX", "PXB", "PHB", "NODE", "SYS"] {
            assert_eq!(t.parse::<Link>().map(|l| l.to_string()), Ok(t.to_string()));
        }
        assert_eq!("SOC".parse::<Link>(), Ok(Link::Sys));
    }

    #[test]
    fn unknown_link_tokens_are_refused() {
        for t in ["", "NV", "NV0", "NV-1", "NV+1", "NV256", "nv2", "PCI", "x", " X"] {
            assert!(t.parse::<Link>().is_err(), "{t:?} parsed");
        }
    }

    #[test]
    fn well_formed_annotation_parses_with_indices_in_any_order() {
        let json = annotation(
            json!([{"index": 1, "numa": 1}, {"index": 0, "uuid": "GPU-0", "numa": 0, "memoryMiB": 1}]),
            json!([["X", "NV2"], ["NV2", " X "]]),
        );
        let t = GpuTopology::parse(&json);
        assert!(t.is_ok(), "{t:?}");
        let t = t.unwrap_or_else(|_| GpuTopology::unknown(0));
        assert_eq!(t.len(), 2);
        assert!(t.is_known());
        assert_eq!(t.gpus()[0].uuid.as_deref(), Some("GPU-0"));
        assert_eq!(t.numa(1), Some(1));
        assert_eq!(t.link(0, 1), Link::NvLink(2));
        assert_eq!(t.numa_groups().len(), 2);
    }

    #[test]
    fn malformed_annotations_name_the_rule_they_break() {
        // (rule, annotation, expected error)
        type Case = (&'static str, String, fn(&TopologyError) -> bool);
        let cases: Vec<Case> = vec![
            ("bad json", "{".into(), |e| matches!(e, TopologyError::Json(_))),
            ("unknown field", r#"{"version":1,"gpus":[],"links":[],"extra":1}"#.into(), |e| {
                matches!(e, TopologyError::Json(_))
            }),
            ("version", r#"{"version":2,"gpus":[],"links":[]}"#.into(), |e| matches!(e, TopologyError::Version(2))),
            ("negative numa", annotation(json!([{"index": 0, "numa": -1}]), json!([["X"]])), |e| {
                matches!(e, TopologyError::Json(_))
            }),
            (
                "duplicate index",
                annotation(json!([{"index": 0}, {"index": 0}]), json!([["X", "SYS"], ["SYS", "X"]])),
                |e| matches!(e, TopologyError::DuplicateIndex(0)),
            ),
            (
                "index out of range",
                annotation(json!([{"index": 0}, {"index": 2}]), json!([["X", "SYS"], ["SYS", "X"]])),
                |e| matches!(e, TopologyError::IndexOutOfRange { index: 2, count: 2 }),
            ),
            ("too few rows", two_gpus(json!([["X", "SYS"]])), |e| {
                matches!(e, TopologyError::LinkRows { rows: 1, gpus: 2 })
            }),
            ("short row", two_gpus(json!([["X", "SYS"], ["SYS"]])), |e| {
                matches!(e, TopologyError::LinkCells { row: 1, cells: 1, gpus: 2 })
            }),
            ("unknown token", two_gpus(json!([["X", "NVX"], ["NVX", "X"]])), |e| {
                matches!(e, TopologyError::UnknownLink { row: 0, col: 1, .. })
            }),
            ("X off the diagonal", two_gpus(json!([["X", "X"], ["X", "X"]])), |e| {
                matches!(e, TopologyError::Diagonal { row: 0, col: 1, .. })
            }),
            ("diagonal not X", two_gpus(json!([["SYS", "SYS"], ["SYS", "X"]])), |e| {
                matches!(e, TopologyError::Diagonal { row: 0, col: 0, .. })
            }),
            ("asymmetric", two_gpus(json!([["X", "NV2"], ["NV1", "X"]])), |e| {
                matches!(e, TopologyError::Asymmetric { row: 0, col: 1, .. })
            }),
            (
                "more than 64 GPUs",
                annotation(Value::Array((0..65).map(|i| json!({"index": i})).collect()), json!([])),
                |e| matches!(e, TopologyError::TooManyGpus(65)),
            ),
        ];
        for (rule, json, expected) in cases {
            match GpuTopology::parse(&json) {
                Ok(_) => panic!("{rule}: parsed"),
                Err(e) => assert!(expected(&e), "{rule}: got {e}"),
            }
        }
    }

    #[test]
    fn missing_annotation_means_allocatable_gpus_all_sys() {
        let (model, reason) = GpuTopology::from_node(None, 4);
        assert_eq!(model.len(), 4);
        assert!(!model.is_known());
        assert_eq!(model.link(0, 3), Link::Sys);
        assert_eq!(model.link(2, 2), Link::SelfLink);
        assert!(model.numa_groups().is_empty());
        let problem = reason.map(|r| r.problem());
        assert_eq!(problem.as_ref().map(|p| p.kind), Some(GpuProblemKind::TopologyMissing));
        assert!(problem.is_some_and(|p| p.message.contains("GPU topology: no gpu.muster.dev/topology")));
    }

    #[test]
    fn node_without_gpus_needs_no_reason() {
        let (model, reason) = GpuTopology::from_node(None, 0);
        assert!(model.is_empty());
        assert_eq!(reason, None);
    }

    #[test]
    fn malformed_annotation_falls_back_with_reason() {
        let (model, reason) = GpuTopology::from_node(Some("not json"), 8);
        assert_eq!(model.len(), 8);
        assert!(!model.is_known());
        let problem = reason.map(|r| r.problem());
        assert_eq!(problem.as_ref().map(|p| p.kind), Some(GpuProblemKind::TopologyMalformed));
        assert!(problem.is_some_and(|p| p.message.contains("not valid topology JSON")));
    }

    #[test]
    fn nodes_of_one_model_share_their_shape_but_keep_their_own_gpus() {
        // 5 GPUs, all NV2: a shape no other test makes (the table is the process's).
        let annotation = |uuid: &str, numa_split: u32| {
            let gpus: Vec<_> = (0..5)
                .map(|i| serde_json::json!({"index": i, "numa": i / numa_split, "uuid": format!("GPU-{uuid}-{i}")}))
                .collect();
            let links: Vec<Vec<&str>> =
                (0..5).map(|i| (0..5).map(|j| if i == j { "X" } else { "NV2" }).collect()).collect();
            serde_json::json!({"version": TOPOLOGY_VERSION, "gpus": gpus, "links": links}).to_string()
        };
        let a = GpuTopology::parse(&annotation("a", 2)).expect("parses");
        let b = GpuTopology::parse(&annotation("b", 2)).expect("parses");
        assert!(Arc::ptr_eq(&a.shape, &b.shape), "one shape for both nodes");
        assert_ne!(a, b, "each keeps its own UUIDs");
        assert_eq!(a.gpus[0].uuid.as_deref(), Some("GPU-a-0"));
        assert_eq!(b.gpus[0].uuid.as_deref(), Some("GPU-b-0"));
        // Another NUMA layout is another shape, with its own groups.
        let c = GpuTopology::parse(&annotation("c", 5)).expect("parses");
        assert!(!Arc::ptr_eq(&a.shape, &c.shape));
        assert_eq!((a.numa_groups().len(), c.numa_groups().len()), (3, 1));
        assert_ne!(a.selection_key(), c.selection_key());
        // A shape no node uses any more is dropped; a later node of it gets an equal one.
        let weak = Arc::downgrade(&c.shape);
        drop(c);
        assert!(weak.upgrade().is_none(), "the table holds no strong reference");
        let again = GpuTopology::parse(&annotation("d", 5)).expect("parses");
        assert_eq!(again.numa_groups().len(), 1);
    }

    #[test]
    fn the_shape_table_forgets_shapes_no_longer_used_and_keeps_those_in_use() {
        let one = |numa: u32| {
            let gpu = Gpu { uuid: None, numa: Some(numa), memory_mib: None };
            Shape::of(&[gpu], vec![Link::SelfLink], true)
        };
        let mut table = Shapes::default();
        // 10 shapes stay in use, 290 others are dropped as soon as made.
        let live: Vec<Arc<Shape>> = (0..10).map(|n| table.share(one(n))).collect();
        for n in 10..300 {
            drop(table.share(one(n)));
        }
        assert!(table.kept < SHAPES_KEPT, "pruned once it held {SHAPES_KEPT}: {}", table.kept);
        for (n, shape) in (0..10).zip(&live) {
            assert!(Arc::ptr_eq(&table.share(one(n)), shape), "a shape in use is still shared");
        }
        // More shapes in use than SHAPES_KEPT: every one is kept, and pruning waits until the
        // table holds twice those, so it is not redone on every new shape.
        let many: Vec<Arc<Shape>> = (1_000..1_600).map(|n| table.share(one(n))).collect();
        assert!(table.kept >= 610 && table.prune_at > table.kept, "{} {}", table.kept, table.prune_at);
        assert!(Arc::ptr_eq(&table.share(one(1_000)), &many[0]));
    }

    #[test]
    fn unknown_topologies_of_one_count_are_one_shared_model() {
        let (a, b) = (GpuTopology::unknown_shared(8), GpuTopology::unknown_shared(8));
        assert!(Arc::ptr_eq(&a, &b), "one model per count");
        assert_eq!(*a, GpuTopology::unknown(8));
        assert_eq!(*GpuTopology::unknown_shared(4), GpuTopology::unknown(4));
        assert!(!Arc::ptr_eq(&a, &GpuTopology::unknown_shared(4)));
        // Counts past MAX_GPUS are capped as `unknown` caps them.
        assert_eq!(*GpuTopology::unknown_shared(MAX_GPUS + 5), GpuTopology::unknown(MAX_GPUS + 5));
        let (missing, _) = GpuTopology::checked(None, 8);
        let (mismatched, _) = GpuTopology::checked(Some(&Err(TopologyError::Json("x".into()))), 8);
        assert!(
            Arc::ptr_eq(&missing, &a) && Arc::ptr_eq(&mismatched, &a),
            "nodes without a usable annotation share it"
        );
    }

    #[test]
    fn annotation_disagreeing_with_allocatable_is_not_trusted() {
        let json = two_gpus(json!([["X", "NV2"], ["NV2", "X"]]));
        let (model, reason) = GpuTopology::from_node(Some(&json), 4);
        assert_eq!(model.len(), 4);
        assert!(!model.is_known());
        let problem = reason.map(|r| r.problem());
        assert_eq!(problem.as_ref().map(|p| p.kind), Some(GpuProblemKind::TopologyMismatch));
        assert!(problem.is_some_and(|p| p.message.contains("describes 2 GPUs")));
        let (model, reason) = GpuTopology::from_node(Some(&json), 2);
        assert!(model.is_known());
        assert_eq!(reason, None);
    }

    #[test]
    fn allocatable_above_64_is_clamped_and_said() {
        let (model, reason) = GpuTopology::from_node(None, 100);
        assert_eq!(model.len(), 64);
        assert!(reason.is_some_and(|r| r.to_string().contains("first 64 of 100")));
        assert_eq!(GpuTopology::from_node(None, u64::MAX).0.len(), 64);
    }

    #[test]
    fn model_round_trips_through_its_annotation() {
        let json = two_gpus(json!([["X", "NV12"], ["NV12", "X"]]));
        let model = GpuTopology::parse(&json).unwrap_or_else(|_| GpuTopology::unknown(0));
        let again = GpuTopology::parse(&model.to_annotation().to_json());
        assert_eq!(again.as_ref(), Ok(&model));
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            (0u32..70).prop_map(|n| json!(n)),
            any::<f64>().prop_map(|f| json!(f)),
            prop::sample::select(vec!["X", "NV1", "NV18", "PIX", "SYS", "NODE", "NV0", "junk", "", "GPU-x"])
                .prop_map(|s| json!(s)),
            ".*".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 64, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
                prop::collection::vec(
                    (
                        prop::sample::select(vec![
                            "version",
                            "gpus",
                            "links",
                            "index",
                            "uuid",
                            "numa",
                            "memoryMiB",
                            "x"
                        ]),
                        inner
                    ),
                    0..6
                )
                .prop_map(|kv| Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())),
            ]
        })
    }

    /// A sound annotation of up to 6 GPUs (indices shuffled), and a mutation breaking one rule.
    fn annotation_and_mutation() -> impl Strategy<Value = (TopologyAnnotation, usize)> {
        (0usize..=6).prop_flat_map(|n| {
            let tokens = prop::sample::select(vec!["NV1", "NV2", "NV12", "NV18", "PIX", "PXB", "PHB", "NODE", "SYS"]);
            (
                prop::collection::vec(tokens, n * n),
                Just((0..n as u32).collect::<Vec<_>>()).prop_shuffle(),
                prop::collection::vec(prop::option::of(0u32..2), n),
                0usize..6,
            )
                .prop_map(move |(cells, order, numa, mutation)| {
                    let links =
                        (0..n)
                            .map(|i| {
                                (0..n)
                                    .map(|j| {
                                        if i == j {
                                            "X".to_string()
                                        } else {
                                            cells[i.min(j) * n + i.max(j)].to_string()
                                        }
                                    })
                                    .collect()
                            })
                            .collect();
                    let gpus = order
                        .iter()
                        .map(|&i| GpuEntry { index: i, uuid: None, numa: numa[i as usize], memory_mib: Some(1) })
                        .collect();
                    (TopologyAnnotation { version: 1, gpus, links }, mutation)
                })
        })
    }

    /// Breaks one rule of `a` (0: none); returns whether it did.
    fn mutate(a: &mut TopologyAnnotation, mutation: usize) -> bool {
        let n = a.gpus.len();
        match mutation {
            1 if n >= 2 => {
                let other = if a.links[0][1] == "SYS" { "PIX" } else { "SYS" };
                a.links[0][1] = other.to_string();
            }
            2 if n >= 1 => a.links[n - 1][n - 1] = "NODE".to_string(),
            3 if n >= 2 => a.gpus[1].index = a.gpus[0].index,
            4 if n >= 1 => drop(a.links.pop()),
            5 if n >= 2 => a.links[1][0] = "NV0".to_string(),
            _ => return false,
        }
        true
    }

    proptest! {
        #[test]
        fn parse_never_panics_on_arbitrary_strings(s in ".*") {
            let _ = GpuTopology::parse(&s);
            let (model, _) = GpuTopology::from_node(Some(&s), 8);
            prop_assert!(model.len() == 8);
        }

        #[test]
        fn parse_never_panics_on_arbitrary_json(v in json_value(), alloc in 0u64..80) {
            let text = v.to_string();
            let (model, reason) = GpuTopology::from_node(Some(&text), alloc);
            prop_assert_eq!(model.len() as u64, alloc.min(64));
            prop_assert!(model.is_known() || reason.is_some());
        }

        #[test]
        fn sound_annotations_parse_and_broken_ones_do_not((mut a, mutation) in annotation_and_mutation()) {
            let broken = mutate(&mut a, mutation);
            let parsed = GpuTopology::parse(&serde_json::to_string(&a).unwrap_or_default());
            prop_assert_eq!(parsed.is_err(), broken, "{:?}", parsed);
            if let Ok(model) = parsed {
                let n = model.len();
                for i in 0..n {
                    prop_assert_eq!(model.link(i, i), Link::SelfLink);
                    for j in 0..n {
                        prop_assert_eq!(model.link(i, j), model.link(j, i));
                    }
                }
                prop_assert_eq!(GpuTopology::parse(&model.to_annotation().to_json()), Ok(model));
            }
        }
    }
}

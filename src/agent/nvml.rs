//! NVML from the host's driver, as a [`GpuProbe`]: where the library and nvidia-smi sit under
//! a driver root, loading NVML at run time, and the questions the agent asks it. The answers
//! pass through a small trait (`NvmlDevices`) so the one function that turns them into a
//! [`Probe`] is tested with a fake; what is published from a probe is `devices::probe`'s.

use std::cmp::Ordering;
use std::fmt;
use std::path::{Component, Path, PathBuf};

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{TemperatureSensor, TopologyLevel};
use nvml_wrapper::error::NvmlError;

use crate::devices::Link;
use crate::devices::probe::{GpuProbe, Probe, ProbeError, ProbedGpu};

/// The NVML library's file name (the soname every driver installs).
const LIBRARY: &str = "libnvidia-ml.so.1";

/// Where drivers put their libraries, relative to the driver root, most specific first.
const LIB_DIRS: [&str; 11] = [
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "usr/lib",
    "lib",
    // GKE and the GPU operator's driver containers.
    "usr/local/nvidia/lib64",
    "home/kubernetes/bin/nvidia/lib64",
    "usr/lib/wsl/lib",
];

/// Where nvidia-smi is installed, relative to the driver root.
const BIN_DIRS: [&str; 7] =
    ["usr/bin", "bin", "usr/local/bin", "usr/sbin", "sbin", "usr/local/nvidia/bin", "home/kubernetes/bin/nvidia/bin"];

/// Links NVML numbers per GPU (`NVML_NVLINK_MAX_LINKS`).
const NVLINK_MAX_LINKS: u32 = 18;

/// `NVML_AFFINITY_SCOPE_NODE`: memory affinity by NUMA node.
const AFFINITY_SCOPE_NODE: u32 = 0;

/// Symbolic links followed before giving up on a path (a loop, or a very deep chain).
const MAX_SYMLINKS: usize = 16;

const MIB: u64 = 1024 * 1024;

/// The NVML library under a driver root (the host's driver mounted into the agent's
/// container, e.g. `/driver-root`; `/` on the host): `libnvidia-ml.so.1` in the usual lib
/// dirs. Symbolic links are followed inside the root, so a link to an absolute path on the
/// host still resolves in the container.
pub fn find_library(driver_root: &Path) -> Option<PathBuf> {
    LIB_DIRS.iter().find_map(|dir| resolve_under(driver_root, &Path::new(dir).join(LIBRARY)).filter(|p| p.is_file()))
}

/// nvidia-smi under a driver root, and the lib dir to run it with (`LD_LIBRARY_PATH`) when
/// the root is not `/` (there the host's loader paths do not apply).
pub fn find_nvidia_smi(driver_root: &Path) -> Option<(PathBuf, Option<PathBuf>)> {
    let binary = BIN_DIRS
        .iter()
        .find_map(|dir| resolve_under(driver_root, &Path::new(dir).join("nvidia-smi")).filter(|p| is_executable(p)))?;
    let lib_dir = if driver_root == Path::new("/") {
        None
    } else {
        find_library(driver_root).and_then(|lib| lib.parent().map(Path::to_path_buf))
    };
    Some((binary, lib_dir))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `relative` under `root`, following symbolic links as if `root` were `/`: an absolute
/// target restarts at `root`, and `..` never climbs above it. `None` when a part is missing
/// or the links go on too long.
fn resolve_under(root: &Path, relative: &Path) -> Option<PathBuf> {
    let mut pending: Vec<PathBuf> = vec![relative.to_path_buf()];
    let mut resolved = PathBuf::new();
    let mut followed = 0;
    while let Some(path) = pending.pop() {
        let mut parts = path.components();
        let Some(part) = parts.next() else { continue };
        let rest = parts.as_path().to_path_buf();
        if !rest.as_os_str().is_empty() {
            pending.push(rest);
        }
        match part {
            Component::RootDir => resolved = PathBuf::new(),
            Component::ParentDir => {
                resolved.pop();
            }
            Component::Normal(name) => {
                resolved.push(name);
                let here = root.join(&resolved);
                let Ok(meta) = here.symlink_metadata() else { return None };
                if meta.file_type().is_symlink() {
                    followed += 1;
                    if followed > MAX_SYMLINKS {
                        return None;
                    }
                    resolved.pop();
                    pending.push(here.read_link().ok()?);
                }
            }
            Component::CurDir | Component::Prefix(_) => {}
        }
    }
    Some(root.join(resolved))
}

/// Where two GPUs' paths meet in the PCIe tree (NVML's topology levels).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ancestor {
    /// On one board (e.g. the two GPUs of a K80).
    Internal,
    /// Behind one PCIe switch.
    Single,
    /// Behind several switches, without a host bridge.
    Multiple,
    /// Under one host bridge.
    HostBridge,
    /// Under host bridges of one NUMA node.
    Node,
    /// Across NUMA nodes.
    System,
}

impl Ancestor {
    /// The link as `nvidia-smi topo -m` prints it.
    fn link(self) -> Link {
        match self {
            Ancestor::Internal | Ancestor::Single => Link::Pix,
            Ancestor::Multiple => Link::Pxb,
            Ancestor::HostBridge => Link::Phb,
            Ancestor::Node => Link::Node,
            Ancestor::System => Link::Sys,
        }
    }
}

impl From<TopologyLevel> for Ancestor {
    fn from(level: TopologyLevel) -> Self {
        match level {
            TopologyLevel::Internal => Ancestor::Internal,
            TopologyLevel::Single => Ancestor::Single,
            TopologyLevel::Multiple => Ancestor::Multiple,
            TopologyLevel::HostBridge => Ancestor::HostBridge,
            TopologyLevel::Node => Ancestor::Node,
            TopologyLevel::System => Ancestor::System,
        }
    }
}

/// Total and free memory of a GPU, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Memory {
    total: u64,
    free: u64,
}

/// The questions the probe asks per GPU (by NVML index). Only `count` and `uuid` may fail the
/// probe; every other answer is optional, so one unsupported query costs one field.
trait NvmlDevices {
    fn count(&self) -> Result<u32, String>;
    fn uuid(&self, i: u32) -> Result<String, String>;
    fn numa(&self, i: u32) -> Option<u32>;
    fn memory(&self, i: u32) -> Option<Memory>;
    fn temperature(&self, i: u32) -> Option<u32>;
    /// Percent of the last sample period a kernel ran.
    fn utilization(&self, i: u32) -> Option<u32>;
    fn pci_bus_id(&self, i: u32) -> Option<String>;
    fn common_ancestor(&self, i: u32, j: u32) -> Option<Ancestor>;
    /// PCI bus ids at the far end of each active NVLink (repeated per link).
    fn nvlink_remotes(&self, i: u32) -> Vec<String>;
}

/// A PCI address in the form sysfs names devices (`0000:07:00.0`), from NVML's
/// `00000000:07:00.0` or any case or domain width.
fn pci_address(bus_id: &str) -> Option<String> {
    let (domain, rest) = bus_id.trim().trim_end_matches('\0').split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (device, function) = rest.split_once('.')?;
    let hex = |s: &str| u32::from_str_radix(s, 16).ok();
    Some(format!("{:04x}:{:02x}:{:02x}.{:x}", hex(domain)?, hex(bus)?, hex(device)?, hex(function)?))
}

/// The one NUMA node set in an affinity mask (64 nodes per word); `None` for none or several.
fn only_node(words: &[u64]) -> Option<u32> {
    let mut nodes = words.iter().enumerate().flat_map(|(w, &bits)| {
        (0..u64::BITS).filter(move |b| bits >> b & 1 == 1).map(move |b| w as u32 * u64::BITS + b)
    });
    let first = nodes.next()?;
    nodes.next().is_none().then_some(first)
}

/// Every GPU's facts and the link matrix, from the driver's answers.
fn probe_devices(devices: &impl NvmlDevices) -> Result<Probe, ProbeError> {
    let n = devices.count().map_err(|e| ProbeError::Failed(format!("counting GPUs: {e}")))?;
    let mut gpus = Vec::new();
    for i in 0..n {
        let uuid = devices.uuid(i).map_err(|e| ProbeError::Failed(format!("GPU {i}: UUID: {e}")))?;
        let memory = devices.memory(i);
        gpus.push(ProbedGpu {
            index: i,
            uuid,
            numa: devices.numa(i),
            memory_total_mib: memory.map_or(0, |m| m.total / MIB),
            memory_free_mib: memory.map(|m| m.free / MIB),
            temperature_c: devices.temperature(i).map(f64::from),
            utilization: devices.utilization(i).map(|p| f64::from(p.min(100)) / 100.0),
        });
    }
    let buses: Vec<Option<String>> = (0..n).map(|i| devices.pci_bus_id(i).and_then(|b| pci_address(&b))).collect();
    let remotes: Vec<Vec<String>> =
        (0..n).map(|i| devices.nvlink_remotes(i).iter().filter_map(|b| pci_address(b)).collect()).collect();
    let nvlinks = NvLinks::count(&buses, &remotes);
    Ok(Probe { gpus, links: link_matrix(devices, &nvlinks, n as usize) })
}

/// `links[i][j]` for `n` GPUs: NVLink where there is one, else where their PCIe paths meet.
/// Each pair is asked once and both cells get the answer, so the matrix is symmetric; a pair
/// the driver cannot place is `SYS`, the worst.
fn link_matrix(devices: &impl NvmlDevices, nvlinks: &NvLinks, n: usize) -> Vec<Vec<Link>> {
    let pair = |i: usize, j: usize| {
        nvlinks
            .link(i, j)
            .unwrap_or_else(|| devices.common_ancestor(i as u32, j as u32).map_or(Link::Sys, Ancestor::link))
    };
    // upper[i][d]: GPU i and GPU i + 1 + d.
    let upper: Vec<Vec<Link>> = (0..n).map(|i| (i + 1..n).map(|j| pair(i, j)).collect()).collect();
    (0..n)
        .map(|i| {
            (0..n)
                .map(|j| match i.cmp(&j) {
                    Ordering::Equal => Link::SelfLink,
                    Ordering::Less => upper[i][j - i - 1],
                    Ordering::Greater => upper[j][i - j - 1],
                })
                .collect()
        })
        .collect()
}

/// NVLinks between the GPUs of a node, counted from each GPU's active links.
struct NvLinks {
    /// `direct[i][j]`: links of GPU `i` whose far end is GPU `j`.
    direct: Vec<Vec<usize>>,
    /// Per GPU, the far ends that are not GPUs of this node (NVSwitches), one entry per link.
    switched: Vec<Vec<String>>,
}

impl NvLinks {
    fn count(buses: &[Option<String>], remotes: &[Vec<String>]) -> Self {
        let n = buses.len();
        let gpu_at = |addr: &str| buses.iter().position(|b| b.as_deref() == Some(addr));
        let mut direct = vec![vec![0; n]; n];
        let mut switched = vec![Vec::new(); n];
        for (i, far_ends) in remotes.iter().enumerate() {
            for addr in far_ends {
                match gpu_at(addr) {
                    Some(j) if j == i => {}
                    Some(j) => direct[i][j] += 1,
                    None => switched[i].push(addr.clone()),
                }
            }
        }
        NvLinks { direct, switched }
    }

    /// `NV<n>` between GPUs `i` and `j`, or `None` without NVLink.
    ///
    /// Direct links count as both ends see them (the fewer, so the matrix is symmetric).
    /// Two GPUs that reach a common NVSwitch are joined through the switch fabric by as many
    /// links as the one with fewer switch links has, which is what nvidia-smi prints on
    /// NVSwitch systems (NV18 on a DGX H100, NV12 on a DGX A100).
    fn link(&self, i: usize, j: usize) -> Option<Link> {
        let direct = self.direct[i][j].min(self.direct[j][i]);
        let (a, b) = (&self.switched[i], &self.switched[j]);
        let via_switch = if a.iter().any(|s| b.contains(s)) { a.len().min(b.len()) } else { 0 };
        let n = direct + via_switch;
        (n > 0).then(|| Link::NvLink(u8::try_from(n).unwrap_or(u8::MAX)))
    }
}

/// NVML loaded from a driver root, asked afresh on every [`GpuProbe::probe`].
pub struct NvmlProbe {
    nvml: Nvml,
    library: PathBuf,
}

impl fmt::Debug for NvmlProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NvmlProbe").field("library", &self.library).finish_non_exhaustive()
    }
}

impl NvmlProbe {
    /// Loads NVML from `driver_root` ([`ProbeError::Unavailable`] when the library is absent or
    /// cannot be loaded, e.g. from a static binary, or no driver is running; never a panic).
    pub fn load(driver_root: &Path) -> Result<NvmlProbe, ProbeError> {
        let library = find_library(driver_root)
            .ok_or_else(|| ProbeError::Unavailable(format!("no {LIBRARY} under {}", driver_root.display())))?;
        let nvml = Nvml::builder().lib_path(library.as_os_str()).init().map_err(|e| load_error(&library, e))?;
        Ok(NvmlProbe { nvml, library })
    }

    /// The library this probe loaded.
    pub fn library(&self) -> &Path {
        &self.library
    }
}

fn load_error(library: &Path, e: NvmlError) -> ProbeError {
    let message = format!("{}: {e}", library.display());
    match e {
        NvmlError::LibloadingError(_)
        | NvmlError::LibraryNotFound
        | NvmlError::FailedToLoadSymbol(_)
        | NvmlError::DriverNotLoaded => ProbeError::Unavailable(message),
        _ => ProbeError::Failed(message),
    }
}

impl GpuProbe for NvmlProbe {
    fn probe(&self) -> Result<Probe, ProbeError> {
        probe_devices(&Live { nvml: &self.nvml, sysfs: Path::new("/sys") })
    }
}

/// NVML's answers, with the container's sysfs for NUMA where NVML has none.
struct Live<'a> {
    nvml: &'a Nvml,
    sysfs: &'a Path,
}

impl Live<'_> {
    /// The NUMA node in sysfs's `numa_node` for the device (`-1`: none).
    fn sysfs_numa(&self, i: u32) -> Option<u32> {
        let address = self.pci_bus_id(i).and_then(|b| pci_address(&b))?;
        let path = self.sysfs.join("bus/pci/devices").join(address).join("numa_node");
        std::fs::read_to_string(path).ok()?.trim().parse::<i64>().ok().and_then(|n| u32::try_from(n).ok())
    }
}

impl NvmlDevices for Live<'_> {
    fn count(&self) -> Result<u32, String> {
        self.nvml.device_count().map_err(|e| e.to_string())
    }

    fn uuid(&self, i: u32) -> Result<String, String> {
        self.nvml.device_by_index(i).and_then(|d| d.uuid()).map_err(|e| e.to_string())
    }

    fn numa(&self, i: u32) -> Option<u32> {
        // The NUMA nodes whose memory is closest; one node is an answer, several are not.
        let mask = self.nvml.device_by_index(i).and_then(|d| d.memory_affinity(1, AFFINITY_SCOPE_NODE)).ok();
        mask.and_then(|words| only_node(&words)).or_else(|| self.sysfs_numa(i))
    }

    fn memory(&self, i: u32) -> Option<Memory> {
        let info = self.nvml.device_by_index(i).and_then(|d| d.memory_info()).ok()?;
        Some(Memory { total: info.total, free: info.free })
    }

    fn temperature(&self, i: u32) -> Option<u32> {
        self.nvml.device_by_index(i).and_then(|d| d.temperature(TemperatureSensor::Gpu)).ok()
    }

    fn utilization(&self, i: u32) -> Option<u32> {
        self.nvml.device_by_index(i).and_then(|d| d.utilization_rates()).map(|u| u.gpu).ok()
    }

    fn pci_bus_id(&self, i: u32) -> Option<String> {
        self.nvml.device_by_index(i).and_then(|d| d.pci_info()).map(|p| p.bus_id).ok()
    }

    fn common_ancestor(&self, i: u32, j: u32) -> Option<Ancestor> {
        let (a, b) = (self.nvml.device_by_index(i).ok()?, self.nvml.device_by_index(j).ok()?);
        a.topology_common_ancestor(b).map(Ancestor::from).ok()
    }

    fn nvlink_remotes(&self, i: u32) -> Vec<String> {
        let Ok(device) = self.nvml.device_by_index(i) else { return Vec::new() };
        (0..NVLINK_MAX_LINKS)
            .filter_map(|l| {
                let link = device.link_wrapper_for(l);
                // Links a GPU does not have answer NotSupported or InvalidArg: no link.
                match link.is_active() {
                    Ok(true) => link.remote_pci_info().map(|p| p.bus_id).ok(),
                    _ => None,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::probe::topology_annotation;
    use crate::devices::{GpuTopology, fixtures};
    use std::collections::BTreeMap;
    use std::time::{Duration, Instant};

    /// A driver that answers from tables; a missing entry is a failed query.
    #[derive(Default)]
    struct Fake {
        count: Option<u32>,
        uuids: BTreeMap<u32, String>,
        numa: BTreeMap<u32, u32>,
        memory: BTreeMap<u32, Memory>,
        temperature: BTreeMap<u32, u32>,
        utilization: BTreeMap<u32, u32>,
        buses: BTreeMap<u32, String>,
        ancestors: BTreeMap<(u32, u32), Ancestor>,
        remotes: BTreeMap<u32, Vec<String>>,
    }

    impl NvmlDevices for Fake {
        fn count(&self) -> Result<u32, String> {
            self.count.ok_or_else(|| "Unknown".to_string())
        }
        fn uuid(&self, i: u32) -> Result<String, String> {
            self.uuids.get(&i).cloned().ok_or_else(|| "GpuLost".to_string())
        }
        fn numa(&self, i: u32) -> Option<u32> {
            self.numa.get(&i).copied()
        }
        fn memory(&self, i: u32) -> Option<Memory> {
            self.memory.get(&i).copied()
        }
        fn temperature(&self, i: u32) -> Option<u32> {
            self.temperature.get(&i).copied()
        }
        fn utilization(&self, i: u32) -> Option<u32> {
            self.utilization.get(&i).copied()
        }
        fn pci_bus_id(&self, i: u32) -> Option<String> {
            self.buses.get(&i).cloned()
        }
        fn common_ancestor(&self, i: u32, j: u32) -> Option<Ancestor> {
            self.ancestors.get(&(i, j)).copied()
        }
        fn nvlink_remotes(&self, i: u32) -> Vec<String> {
            self.remotes.get(&i).cloned().unwrap_or_default()
        }
    }

    fn bus(i: u32) -> String {
        format!("00000000:{:02X}:00.0", 0x07 + i * 0x10)
    }

    /// `n` GPUs with everything known, no NVLink, and `ancestor` between every pair.
    fn fake(n: u32, ancestor: impl Fn(u32, u32) -> Ancestor) -> Fake {
        let mut f = Fake { count: Some(n), ..Fake::default() };
        for i in 0..n {
            f.uuids.insert(i, format!("GPU-{i}"));
            f.numa.insert(i, i * 2 / n.max(1));
            f.memory.insert(i, Memory { total: 32768 * MIB, free: 30000 * MIB });
            f.temperature.insert(i, 40 + i);
            f.utilization.insert(i, 10 * i);
            f.buses.insert(i, bus(i));
            for j in i + 1..n {
                f.ancestors.insert((i, j), ancestor(i, j));
            }
        }
        f
    }

    /// Adds `links` NVLinks between GPUs `i` and `j`, seen from both ends.
    fn nvlink(f: &mut Fake, i: u32, j: u32, links: usize) {
        f.remotes.entry(i).or_default().extend(std::iter::repeat_n(bus(j), links));
        f.remotes.entry(j).or_default().extend(std::iter::repeat_n(bus(i), links));
    }

    fn model(f: &Fake) -> GpuTopology {
        let probe = probe_devices(f).unwrap_or_else(|e| panic!("{e}"));
        let a = topology_annotation(&probe).unwrap_or_else(|e| panic!("{e}"));
        GpuTopology::from_annotation(&a).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The driver's view of a fixture: its UUIDs, memory and NUMA nodes, `SYS` across NUMA
    /// nodes and `NODE` within, for pairs without NVLink.
    fn fake_of(t: &GpuTopology) -> Fake {
        let numa = |i: u32| t.numa(i as usize);
        let mut f = fake(t.len() as u32, |i, j| if numa(i) == numa(j) { Ancestor::Node } else { Ancestor::System });
        for (i, g) in t.gpus().iter().enumerate() {
            let i = i as u32;
            f.uuids.insert(i, g.uuid.clone().unwrap_or_default());
            f.memory.insert(i, Memory { total: g.memory_mib.unwrap_or(0) * MIB, free: 0 });
            match g.numa {
                Some(n) => f.numa.insert(i, n),
                None => f.numa.remove(&i),
            };
        }
        f
    }

    #[test]
    fn dgx1_nvlinks_counted_per_pair_give_the_nvidia_smi_topology() {
        let want = fixtures::dgx1();
        let mut f = fake_of(&want);
        for i in 0..8 {
            for j in i + 1..8 {
                if let Link::NvLink(n) = want.link(i, j) {
                    nvlink(&mut f, i as u32, j as u32, usize::from(n));
                }
            }
        }
        assert_eq!(model(&f), want);
    }

    #[test]
    fn gpus_sharing_nvswitches_are_joined_by_their_switch_links() {
        // DGX H100: each GPU's 18 links go to four NVSwitches, 5 + 4 + 4 + 5.
        let want = fixtures::dgx_h100();
        let mut f = fake_of(&want);
        let switches = ["0000:a5:00.0", "0000:a6:00.0", "0000:a7:00.0", "0000:a8:00.0"];
        for i in 0..8 {
            let remotes = switches.iter().zip([5, 4, 4, 5]).flat_map(|(s, n)| std::iter::repeat_n(s.to_string(), n));
            f.remotes.insert(i, remotes.collect());
        }
        assert_eq!(model(&f), want);
    }

    #[test]
    fn common_ancestors_map_to_what_nvidia_smi_prints() {
        // (ancestor, link)
        let cases = [
            (Some(Ancestor::Internal), Link::Pix),
            (Some(Ancestor::Single), Link::Pix),
            (Some(Ancestor::Multiple), Link::Pxb),
            (Some(Ancestor::HostBridge), Link::Phb),
            (Some(Ancestor::Node), Link::Node),
            (Some(Ancestor::System), Link::Sys),
            (None, Link::Sys),
        ];
        for (ancestor, want) in cases {
            let mut f = fake(2, |_, _| Ancestor::System);
            match ancestor {
                Some(a) => f.ancestors.insert((0, 1), a),
                None => f.ancestors.remove(&(0, 1)),
            };
            let t = model(&f);
            assert_eq!((t.link(0, 1), t.link(1, 0)), (want, want), "{ancestor:?}");
        }
    }

    #[test]
    fn nvlink_counts_agree_from_both_ends_and_ignore_lone_far_ends() {
        let mut f = fake(4, |_, _| Ancestor::Node);
        nvlink(&mut f, 0, 1, 2);
        // GPU 2 sees three links to GPU 3, GPU 3 sees one of them up: count what both see.
        f.remotes.insert(2, vec![bus(3); 3]);
        f.remotes.insert(3, vec![bus(2)]);
        // A link to something only GPU 0 reaches (a CPU's NPU, say) joins no GPUs.
        f.remotes.entry(0).or_default().push("0000:ff:00.0".into());
        // Remote ids in another case and domain width still match.
        f.remotes.entry(1).or_default().push("0:37:0.0".into());
        f.remotes.entry(3).or_default().push("00000000:17:00.0".to_lowercase());
        let t = model(&f);
        assert_eq!(t.link(0, 1), Link::NvLink(2));
        assert_eq!(t.link(2, 3), Link::NvLink(1));
        assert_eq!(t.link(1, 3), Link::NvLink(1), "0:37:0.0 is GPU 3 and 00000000:17:00.0 is GPU 1");
        assert_eq!(t.link(0, 2), Link::Node);
    }

    #[test]
    fn a_failing_query_costs_its_field_not_the_probe() {
        let mut f = fake(2, |_, _| Ancestor::Single);
        f.temperature.remove(&1);
        f.utilization.remove(&0);
        f.memory.remove(&0);
        f.numa.remove(&1);
        f.buses.remove(&1);
        let probe = probe_devices(&f).unwrap_or_else(|e| panic!("{e}"));
        let (a, b) = (&probe.gpus[0], &probe.gpus[1]);
        assert_eq!((a.temperature_c, b.temperature_c), (Some(40.0), None));
        assert_eq!((a.utilization, b.utilization), (None, Some(0.1)));
        assert_eq!((a.memory_total_mib, a.memory_free_mib), (0, None));
        assert_eq!((b.memory_total_mib, b.memory_free_mib), (32768, Some(30000)));
        assert_eq!((a.numa, b.numa), (Some(0), None));
        assert_eq!(probe.links[0][1], Link::Pix);
    }

    #[test]
    fn failing_to_count_or_name_a_gpu_fails_the_probe() {
        let no_count = Fake { count: None, ..fake(2, |_, _| Ancestor::Node) };
        assert!(matches!(probe_devices(&no_count), Err(ProbeError::Failed(m)) if m.contains("counting")));
        let mut no_uuid = fake(2, |_, _| Ancestor::Node);
        no_uuid.uuids.remove(&1);
        assert!(matches!(probe_devices(&no_uuid), Err(ProbeError::Failed(m)) if m.contains("GPU 1")));
        let none = Fake { count: Some(0), ..Fake::default() };
        assert_eq!(probe_devices(&none), Ok(Probe { gpus: vec![], links: vec![] }));
    }

    #[test]
    fn pci_addresses_are_written_the_sysfs_way() {
        let cases = [
            ("00000000:07:00.0", Some("0000:07:00.0")),
            ("00000000:B1:00.0", Some("0000:b1:00.0")),
            ("0001:3:1.2", Some("0001:03:01.2")),
            ("00000000:07:00.0\0", Some("0000:07:00.0")),
            ("07:00.0", None),
            ("zz:07:00.0", None),
            ("", None),
        ];
        for (input, want) in cases {
            assert_eq!(pci_address(input).as_deref(), want, "{input:?}");
        }
    }

    #[test]
    fn only_a_single_numa_node_in_the_affinity_mask_counts() {
        let cases: [(&[u64], Option<u32>); 5] =
            [(&[0b1], Some(0)), (&[0b100], Some(2)), (&[0, 1], Some(64)), (&[0b11], None), (&[0], None)];
        for (mask, want) in cases {
            assert_eq!(only_node(mask), want, "{mask:?}");
        }
    }

    fn touch(root: &Path, relative: &str, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        let path = root.join(relative);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{e}"));
        }
        std::fs::write(&path, b"not a library").unwrap_or_else(|e| panic!("{e}"));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap_or_else(|e| panic!("{e}"));
    }

    fn link(root: &Path, relative: &str, target: &str) {
        let path = root.join(relative);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{e}"));
        }
        std::os::unix::fs::symlink(target, path).unwrap_or_else(|e| panic!("{e}"));
    }

    fn tempdir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn the_library_is_found_in_the_usual_dirs_following_links_inside_the_root() {
        let empty = tempdir();
        assert_eq!(find_library(empty.path()), None);

        let debian = tempdir();
        touch(debian.path(), "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15", 0o644);
        link(debian.path(), "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "libnvidia-ml.so.550.54.15");
        touch(debian.path(), "usr/lib/libnvidia-ml.so.1", 0o644);
        let found = find_library(debian.path());
        assert_eq!(found, Some(debian.path().join("usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15")));

        // An absolute link target is the host's path: it resolves under the root.
        let rhel = tempdir();
        touch(rhel.path(), "opt/driver/libnvidia-ml.so.1", 0o644);
        link(rhel.path(), "usr/lib64/libnvidia-ml.so.1", "/opt/driver/../driver/libnvidia-ml.so.1");
        assert_eq!(find_library(rhel.path()), Some(rhel.path().join("opt/driver/libnvidia-ml.so.1")));

        // A dangling link or a loop is not a library; the next dir is tried.
        let broken = tempdir();
        link(broken.path(), "usr/lib64/libnvidia-ml.so.1", "/nowhere");
        link(broken.path(), "lib64/libnvidia-ml.so.1", "libnvidia-ml.so.1");
        touch(broken.path(), "usr/lib/libnvidia-ml.so.1", 0o644);
        assert_eq!(find_library(broken.path()), Some(broken.path().join("usr/lib/libnvidia-ml.so.1")));
    }

    #[test]
    fn nvidia_smi_is_found_with_the_lib_dir_to_run_it_with() {
        let root = tempdir();
        assert_eq!(find_nvidia_smi(root.path()), None);
        touch(root.path(), "usr/bin/nvidia-smi", 0o644);
        assert_eq!(find_nvidia_smi(root.path()), None, "not executable");
        touch(root.path(), "usr/local/bin/nvidia-smi", 0o755);
        assert_eq!(find_nvidia_smi(root.path()), Some((root.path().join("usr/local/bin/nvidia-smi"), None)));
        touch(root.path(), "usr/lib64/libnvidia-ml.so.1", 0o644);
        assert_eq!(
            find_nvidia_smi(root.path()),
            Some((root.path().join("usr/local/bin/nvidia-smi"), Some(root.path().join("usr/lib64"))))
        );
    }

    #[test]
    fn loading_without_a_usable_library_is_unavailable_and_quick() {
        let started = Instant::now();
        let empty = tempdir();
        assert!(matches!(NvmlProbe::load(empty.path()), Err(ProbeError::Unavailable(m)) if m.contains("no libnvidia")));
        // A file by the right name that is no library cannot be loaded.
        let junk = tempdir();
        touch(junk.path(), "usr/lib64/libnvidia-ml.so.1", 0o755);
        assert!(matches!(NvmlProbe::load(junk.path()), Err(ProbeError::Unavailable(_))));
        // This machine's own root: no driver here, but a machine with one may load it.
        let host = NvmlProbe::load(Path::new("/"));
        if find_library(Path::new("/")).is_none() {
            assert!(matches!(host, Err(ProbeError::Unavailable(_))));
        }
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    }
}

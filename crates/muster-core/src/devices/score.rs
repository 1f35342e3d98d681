//! How good a node is for one GPU pod, 0-100, for gang placement to rank nodes: the cost of
//! the GPUs it would get, the fragmentation left behind, and how busy those GPUs are.
//! Which node wins, and filtering, are the scheduler's; this only scores one node.

use super::gpuset::GpuSet;
use super::select::{NUMA_SPAN_PENALTY, SelectOptions, Selection, select};
use super::topology::{GpuTopology, Link};

/// Weight of the link quality of the chosen GPUs.
const TOPOLOGY_WEIGHT: f64 = 0.5;
/// Weight of what the placement leaves behind.
const FRAGMENTATION_WEIGHT: f64 = 0.35;
/// Weight of the chosen GPUs being idle.
const IDLE_WEIGHT: f64 = 0.15;

/// A node's score for one pod, with the GPUs the score assumes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NodeScore {
    /// 0-100, higher is better.
    pub score: u8,
    /// The GPUs [`select`] would give the pod on this node.
    pub selection: Selection,
    /// 0..=1: how close the set is to all-NVLink on as few NUMA nodes as possible.
    pub topology: f64,
    /// 0..=1: how full the node is after the placement and how together its free GPUs stay.
    pub fragmentation: f64,
    /// 0..=1: one minus the mean utilization of the chosen GPUs (1 without metrics).
    pub idle: f64,
}

/// The part of a node's score that depends only on its topology and free GPUs, not on load:
/// what gang placement may compute once for every node of the same kind and occupancy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fit {
    /// The GPUs [`select`] would give the pod on this node.
    pub selection: Selection,
    /// 0..=1: see [`NodeScore::topology`].
    pub topology: f64,
    /// 0..=1: see [`NodeScore::fragmentation`].
    pub fragmentation: f64,
}

/// The load-independent part of [`node_score`], or `None` when `available` cannot hold `k`.
pub fn fit(topology: &GpuTopology, available: GpuSet, k: usize, options: SelectOptions) -> Option<Fit> {
    let available = available.intersection(topology.all());
    let selection = select(topology, available, k, options)?;
    let topo = 0.5 * link_quality(selection.cost, k) + 0.5 * numa_quality(topology, selection.gpus, k);
    let rest = available.difference(selection.gpus);
    let n = topology.len().max(1) as f64;
    let fill = (n - rest.len() as f64) / n;
    let fragmentation = 0.5 * fill + 0.5 * cohesion(topology, rest);
    Some(Fit { selection, topology: topo, fragmentation })
}

impl Fit {
    /// The node's score with the load of the chosen GPUs (`utilization` by GPU index).
    pub fn with_load(self, utilization: &[Option<f64>]) -> NodeScore {
        let (sum, n) = (self.selection.gpus.iter().filter_map(|i| utilization.get(i).copied().flatten()))
            .fold((0.0, 0usize), |(sum, n), u| (sum + u, n + 1));
        let idle = if n == 0 { 1.0 } else { 1.0 - sum / n as f64 };
        let idle = idle.clamp(0.0, 1.0);
        let total = TOPOLOGY_WEIGHT * self.topology + FRAGMENTATION_WEIGHT * self.fragmentation + IDLE_WEIGHT * idle;
        let score = (total * 100.0).round().clamp(0.0, 100.0) as u8;
        NodeScore { score, selection: self.selection, topology: self.topology, fragmentation: self.fragmentation, idle }
    }
}

/// Scores placing a pod of `k` GPUs on a node, or `None` when `available` cannot hold it.
///
/// * topology: the mean of link quality, `1 - (cost - ideal) / (worst - ideal)` where ideal
///   is every pair on the widest NVLink and worst every pair `SYS` with each GPU on its own
///   NUMA node (absolute, so node kinds compare: an NV18 pair near 1, a PIX pair about 0.78),
///   and NUMA quality, which halves for each NUMA node spanned beyond what `k` needs. Without
///   the NUMA half, best fit would pick a full node whose free GPUs straddle sockets over a
///   node that keeps the pod on one.
/// * fragmentation: half best fit (share of the node busy afterwards, which keeps whole nodes
///   free for large gangs), half cohesion (share of the GPUs left free that sit on the NUMA
///   node with the most of them; 1 when none are left or NUMA is unknown).
/// * idle: from `utilization` (by GPU index, as [`super::health::NodeHealth`] gives it).
pub fn node_score(
    topology: &GpuTopology,
    available: GpuSet,
    k: usize,
    utilization: &[Option<f64>],
    options: SelectOptions,
) -> Option<NodeScore> {
    fit(topology, available, k, options).map(|f| f.with_load(utilization))
}

/// 1 when the set spans no more NUMA nodes than `k` GPUs need on this node, halving with each
/// extra one; 1 without NUMA information.
fn numa_quality(topology: &GpuTopology, gpus: GpuSet, k: usize) -> f64 {
    let largest = topology.numa_groups().iter().map(|(_, g)| g.len()).max().unwrap_or(0);
    if largest == 0 || k == 0 {
        return 1.0;
    }
    let needed = k.div_ceil(largest);
    let extra = topology.numa_span(gpus).saturating_sub(needed);
    0.5f64.powi(extra.min(64) as i32)
}

fn link_quality(cost: u64, k: usize) -> f64 {
    if k < 2 {
        return 1.0;
    }
    let pairs = (k * (k - 1) / 2) as f64;
    let ideal = pairs * f64::from(Link::NvLink(u8::MAX).cost());
    let worst = pairs * f64::from(Link::Sys.cost()) + (k - 1) as f64 * NUMA_SPAN_PENALTY as f64;
    (1.0 - (cost as f64 - ideal) / (worst - ideal)).clamp(0.0, 1.0)
}

fn cohesion(topology: &GpuTopology, rest: GpuSet) -> f64 {
    if rest.is_empty() || topology.numa_groups().is_empty() {
        return 1.0;
    }
    let largest = topology.numa_groups().iter().map(|(_, g)| g.intersection(rest).len()).max().unwrap_or(0);
    largest as f64 / rest.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::fixtures;

    fn set(indices: &[usize]) -> GpuSet {
        GpuSet::from_indices(indices.iter().copied()).unwrap_or_default()
    }

    fn score(t: &GpuTopology, free: &[usize], k: usize) -> Option<u8> {
        node_score(t, set(free), k, &[], SelectOptions::default()).map(|s| s.score)
    }

    #[test]
    fn no_room_means_no_score() {
        assert_eq!(score(&fixtures::dgx_h100(), &[0], 2), None);
    }

    #[test]
    fn scores_stay_within_0_and_100() {
        for t in fixtures::all().iter().chain([&GpuTopology::unknown(8)]) {
            for k in 0..=8 {
                for free in [0xffu64, 0x0f, 0xf0, 0x55, 0x81] {
                    if let Some(s) =
                        node_score(t, GpuSet::from_bits(free), k, &[Some(2.0); 8], SelectOptions::default())
                    {
                        assert!(s.score <= 100);
                        assert!((0.0..=1.0).contains(&s.idle));
                    }
                }
            }
        }
    }

    #[test]
    fn better_links_score_higher() {
        let nvlink = score(&fixtures::dgx_h100(), &[0, 1, 2, 3, 4, 5, 6, 7], 4);
        let pcie = score(&fixtures::pcie(), &[0, 1, 2, 3, 4, 5, 6, 7], 4);
        let unknown = score(&GpuTopology::unknown(8), &[0, 1, 2, 3, 4, 5, 6, 7], 4);
        assert!(nvlink > pcie && pcie > unknown, "{nvlink:?} {pcie:?} {unknown:?}");
    }

    #[test]
    fn best_fit_scores_fuller_nodes_higher() {
        let t = fixtures::dgx_h100();
        // Same NUMA-local pair either way; the node with fewer free GPUs keeps more nodes whole.
        assert!(score(&t, &[0, 1], 2) > score(&t, &[0, 1, 2, 3, 4, 5, 6, 7], 2));
    }

    #[test]
    fn leaving_free_gpus_together_scores_higher() {
        let t = fixtures::dgx_h100();
        // One GPU from {0, 4,5,6}: the pick leaves 4,5,6 together; from {0,1, 4,5} it leaves
        // three GPUs split 1 + 2 over NUMA nodes.
        assert!(score(&t, &[0, 4, 5, 6], 1) > score(&t, &[0, 1, 4, 5], 1));
    }

    #[test]
    fn keeping_a_pod_on_one_numa_node_beats_best_fit() {
        let t = fixtures::dgx_h100();
        // Exactly four free but split 2 + 2, against four free on NUMA 1 plus two more.
        let split = score(&t, &[2, 3, 4, 5], 4);
        let local = score(&t, &[2, 3, 4, 5, 6, 7], 4);
        assert!(local > split, "{local:?} {split:?}");
        // An 8-GPU pod must span both NUMA nodes here: no penalty for what cannot be avoided.
        let whole = node_score(&t, t.all(), 8, &[], SelectOptions::default());
        assert!(whole.is_some_and(|s| s.topology > 0.9), "{whole:?}");
    }

    #[test]
    fn busy_gpus_score_lower() {
        let t = fixtures::dgx_h100();
        let idle = node_score(&t, set(&[0]), 1, &[Some(0.0)], SelectOptions::default());
        let busy = node_score(&t, set(&[0]), 1, &[Some(0.9)], SelectOptions::default());
        assert!(idle.map(|s| s.score) > busy.map(|s| s.score));
        assert!(busy.is_some_and(|s| (s.idle - 0.1).abs() < 1e-9));
    }

    #[test]
    fn single_numa_requirement_is_passed_to_selection() {
        let t = fixtures::dgx_h100();
        let opts = SelectOptions { require_single_numa: true };
        assert_eq!(node_score(&t, set(&[2, 3, 4, 5]), 4, &[], opts), None);
    }
}

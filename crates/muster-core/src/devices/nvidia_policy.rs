//! NVIDIA's best-effort GPU choice, restated on muster's [`Link`] model so benchmarks can set
//! it beside [`select`](super::select()). This is the policy of NVIDIA's go-gpuallocator
//! (`bestEffortPolicy`), which the NVIDIA device plugin answers kubelet's
//! `GetPreferredAllocation` with: what a node's GPUs go to when kubelet, not muster, picks
//! them. A baseline, not muster's policy; written from the public description and source.
//!
//! The policy: a pair of GPUs scores by its link ([`pair_score`]), a set by the sum over its
//! pairs, a partition of the free GPUs into sets of the requested size by the sum over its
//! sets. The best partition wins (the first found among equals), and the request gets that
//! partition's best set.

use super::gpuset::GpuSet;
use super::topology::{GpuTopology, Link};

/// Score of one NVLink between two GPUs; a bond of `n` links scores `n` times this.
pub const NVLINK_SCORE: u32 = 100;

/// Most partitions [`best_effort`] enumerates; pools with more are searched greedily.
///
/// Every request on up to 12 free GPUs stays under it (the most on 8 is 280 partitions, 3 of
/// 8; on 12, 15,400, 3 of 12). Sixteen free GPUs split into pairs would already be two million.
pub const PARTITION_LIMIT: u128 = 50_000;

/// How much the policy likes a pair of GPUs joined by `link` (higher is better).
///
/// `NV<n>` scores `n` × [`NVLINK_SCORE`]; the PCIe levels score `PIX` 50, `PXB` 40, `PHB` 30,
/// `NODE` 20, `SYS` 10, and the diagonal 0. NVIDIA's source scores a pair by every link NVML
/// reports between them, so an NVLinked pair there also gets its PCIe level on top (10 to 60).
/// nvidia-smi's matrix, and so muster's annotation, shows only the NVLink and hides the PCIe
/// level behind it, so that part is not added here. NVML's "same board" level (60 there) is
/// printed as `PIX` and scores as `PIX`.
pub const fn pair_score(link: Link) -> u32 {
    match link {
        Link::SelfLink => 0,
        Link::NvLink(n) => n as u32 * NVLINK_SCORE,
        Link::Pix => 50,
        Link::Pxb => 40,
        Link::Phb => 30,
        Link::Node => 20,
        Link::Sys => 10,
    }
}

/// The policy's score of a set: the sum of [`pair_score`] over its pairs.
pub fn set_score(topology: &GpuTopology, set: GpuSet) -> u64 {
    let mut score = 0u64;
    for i in set {
        for j in set.iter().filter(|&j| j > i) {
            score += u64::from(pair_score(topology.link(i, j)));
        }
    }
    score
}

/// The `size` GPUs of `free` NVIDIA's best-effort policy gives a pod, or `None` when `free`
/// has fewer than `size`.
///
/// With at most [`PARTITION_LIMIT`] partitions (every request on 8 GPUs) this is the policy
/// exactly, ties resolved as its source resolves them when the GPUs are listed by index: see
/// [`best_partition`]. One difference: where the pool does not divide evenly, the source pads
/// it with empty slots and may return the padded set, which has fewer than `size` GPUs; here
/// the best full set of the best partition is returned instead ([`best_effort_as_written`]
/// returns what the source would). Above the limit the source would still enumerate every
/// partition; this returns the best set grown greedily from each free GPU (each step adds the
/// GPU that adds the most score), which is what the best partition's best set tends to be.
pub fn best_effort(topology: &GpuTopology, free: GpuSet, size: usize) -> Option<GpuSet> {
    let free = free.intersection(topology.all());
    if size == 0 {
        return Some(GpuSet::EMPTY);
    }
    if free.len() < size {
        return None;
    }
    if partition_count(free.len(), size) > PARTITION_LIMIT {
        return greedy(topology, free, size);
    }
    let partition = best_partition(topology, free, size)?;
    first_best(topology, partition.iter().filter(|s| !s.padded).map(|s| s.gpus))
}

/// What NVIDIA's source returns for the same request: like [`best_effort`], except that the
/// padded set of the best partition may win and then has fewer than `size` GPUs (the source
/// returns its empty slots as nil devices). `None` above [`PARTITION_LIMIT`].
pub fn best_effort_as_written(topology: &GpuTopology, free: GpuSet, size: usize) -> Option<GpuSet> {
    let free = free.intersection(topology.all());
    if size == 0 || free.len() < size || partition_count(free.len(), size) > PARTITION_LIMIT {
        return None;
    }
    let partition = best_partition(topology, free, size)?;
    first_best(topology, partition.iter().map(|s| s.gpus))
}

/// The first set with the highest [`set_score`].
fn first_best(topology: &GpuTopology, sets: impl Iterator<Item = GpuSet>) -> Option<GpuSet> {
    let mut best: Option<(u64, GpuSet)> = None;
    for set in sets {
        let score = set_score(topology, set);
        if best.is_none_or(|(b, _)| score > b) {
            best = Some((score, set));
        }
    }
    best.map(|(_, set)| set)
}

/// One set of a partition; `padded` when it holds the empty slots that make the pool divide
/// evenly (so it has fewer GPUs than the others).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartSet {
    /// The GPUs of the set.
    pub gpus: GpuSet,
    /// Whether the set holds the padding.
    pub padded: bool,
}

/// The highest-scoring partition of `free` into sets of `size`, the first found among equals,
/// in the source's order: the pool is padded with `(size - |free| % size) % size` empty slots
/// listed after every GPU; each set starts with the lowest GPU not yet taken and takes the
/// rest in lexicographic order, empty slots sorting last; a set holds all the padding or none.
/// `None` when `size` is 0 or exceeds `|free|`. No bound: callers check [`partition_count`].
pub fn best_partition(topology: &GpuTopology, free: GpuSet, size: usize) -> Option<Vec<PartSet>> {
    let free = free.intersection(topology.all());
    if size == 0 || free.len() < size {
        return None;
    }
    if size == 1 {
        // Every single GPU scores 0: the first partition, the first GPU, wins.
        return Some(free.iter().filter_map(GpuSet::single).map(|gpus| PartSet { gpus, padded: false }).collect());
    }
    let padding = (size - free.len() % size) % size;
    let mut search = PartitionSearch { topology, size, padding, stack: Vec::new(), best: None, visited: 0 };
    search.partitions(free, padding, 0);
    search.best.map(|(_, sets)| sets)
}

struct PartitionSearch<'a> {
    topology: &'a GpuTopology,
    size: usize,
    /// Empty slots in the whole pool.
    padding: usize,
    stack: Vec<PartSet>,
    best: Option<(u64, Vec<PartSet>)>,
    /// Partitions scored so far.
    visited: u128,
}

impl PartitionSearch<'_> {
    /// Every partition of `rest` GPUs plus `pads` empty slots, with `score` already scored by
    /// the sets on the stack.
    fn partitions(&mut self, rest: GpuSet, pads: usize, score: u64) {
        if rest.len() + pads == self.size {
            let last = PartSet { gpus: rest, padded: pads > 0 };
            self.stack.push(last);
            self.leaf(score + set_score(self.topology, rest));
            self.stack.pop();
            return;
        }
        // Fewer empty slots than `size`, so the first item of what is left is a GPU.
        let Some(first) = rest.lowest() else { return };
        let others: Vec<usize> = rest.iter().skip(1).collect();
        let head = GpuSet::single(first).unwrap_or_default();
        self.members(rest, pads, score, &others, 0, head);
    }

    /// Completes the set `chosen` (which starts with the lowest GPU left) from `others[from..]`
    /// in the source's order: at each prefix, longer completions first, then the prefix
    /// followed by all the padding.
    fn members(&mut self, rest: GpuSet, pads: usize, score: u64, others: &[usize], from: usize, chosen: GpuSet) {
        let full = self.size;
        if chosen.len() == full {
            self.take(rest, pads, score, PartSet { gpus: chosen, padded: false });
            return;
        }
        // Padded completions need exactly this many GPUs; only while the padding is unused.
        let padded_len = (pads > 0).then(|| full - self.padding);
        for k in from..others.len() {
            let after = others.len() - k - 1;
            let reaches_full = chosen.len() + 1 + after >= full;
            let reaches_padded = padded_len.is_some_and(|p| chosen.len() < p && chosen.len() + 1 + after >= p);
            if !reaches_full && !reaches_padded {
                break;
            }
            if let Some(next) = chosen.with(others[k]) {
                self.members(rest, pads, score, others, k + 1, next);
            }
        }
        if padded_len == Some(chosen.len()) {
            self.take(rest, 0, score, PartSet { gpus: chosen, padded: true });
        }
    }

    /// Puts `set` on the stack and partitions what is left (`pads_left` empty slots).
    fn take(&mut self, rest: GpuSet, pads_left: usize, score: u64, set: PartSet) {
        // The pool divides evenly, so what is left is empty or at least one more set.
        let left = rest.difference(set.gpus);
        let score = score + set_score(self.topology, set.gpus);
        self.stack.push(set);
        if left.is_empty() && pads_left == 0 {
            self.leaf(score);
        } else {
            self.partitions(left, pads_left, score);
        }
        self.stack.pop();
    }

    /// The stack is a whole partition scoring `score`: keep it if it beats the best so far.
    fn leaf(&mut self, score: u64) {
        self.visited += 1;
        if self.best.as_ref().is_none_or(|(b, _)| score > *b) {
            self.best = Some((score, self.stack.clone()));
        }
    }
}

/// How many partitions the source enumerates for `free` GPUs and sets of `size` (saturating).
pub fn partition_count(free: usize, size: usize) -> u128 {
    if size == 0 || free < size {
        return 0;
    }
    if size == 1 {
        return free as u128;
    }
    let padding = (size - free % size) % size;
    count(free, padding, size, padding)
}

fn count(rest: usize, pads: usize, size: usize, padding: usize) -> u128 {
    if rest + pads == size {
        return 1;
    }
    if rest == 0 {
        return 0;
    }
    let mut total = 0u128;
    if rest >= size {
        total =
            total.saturating_add(binomial(rest - 1, size - 1).saturating_mul(count(rest - size, pads, size, padding)));
    }
    if pads > 0 && rest >= size - padding {
        let ways = binomial(rest - 1, size - 1 - padding);
        total = total.saturating_add(ways.saturating_mul(count(rest - (size - padding), 0, size, padding)));
    }
    total
}

fn binomial(n: usize, k: usize) -> u128 {
    if k > n {
        return 0;
    }
    let k = k.min(n - k);
    let mut c = 1u128;
    for i in 0..k {
        // Exact at each step: c * (n - i) is divisible by i + 1.
        c = c.saturating_mul((n - i) as u128) / (i as u128 + 1);
    }
    c
}

/// The best set grown greedily from each GPU of `free`: each step adds the GPU that adds the
/// most pair score (the lowest index among equals); the first of equal sets wins.
fn greedy(topology: &GpuTopology, free: GpuSet, size: usize) -> Option<GpuSet> {
    let grown = free.iter().filter_map(|seed| grow(topology, free, seed, size));
    first_best(topology, grown)
}

fn grow(topology: &GpuTopology, free: GpuSet, seed: usize, size: usize) -> Option<GpuSet> {
    let mut set = GpuSet::single(seed)?;
    while set.len() < size {
        let gain = |g: usize| set.iter().map(|s| u64::from(pair_score(topology.link(s, g)))).sum::<u64>();
        let mut best: Option<(u64, usize)> = None;
        for g in free.difference(set) {
            let score = gain(g);
            if best.is_none_or(|(b, _)| score > b) {
                best = Some((score, g));
            }
        }
        set = set.with(best?.1)?;
    }
    Some(set)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::fixtures;
    use crate::devices::topology::{GpuEntry, TopologyAnnotation};
    use proptest::prelude::*;

    fn set(indices: &[usize]) -> GpuSet {
        GpuSet::from_indices(indices.iter().copied()).unwrap_or_default()
    }

    #[test]
    fn pair_scores_follow_the_link_ladder() {
        let order = ["NV18", "NV2", "NV1", "PIX", "PXB", "PHB", "NODE", "SYS"];
        let scores: Vec<u32> = order.iter().map(|t| t.parse::<Link>().map(pair_score).unwrap_or(0)).collect();
        assert_eq!(scores, vec![1800, 200, 100, 50, 40, 30, 20, 10]);
        assert_eq!(pair_score(Link::SelfLink), 0);
    }

    #[test]
    fn best_effort_on_fixture_topologies() {
        let (h100, pcie, dgx1) = (fixtures::dgx_h100(), fixtures::pcie(), fixtures::dgx1());
        // (rule, topology, free, size, expected)
        let cases: Vec<(&str, &GpuTopology, GpuSet, usize, Option<GpuSet>)> = vec![
            ("dgx1: 2 GPUs take an NV2 pair", &dgx1, dgx1.all(), 2, Some(set(&[0, 3]))),
            ("dgx1: 4 GPUs take a fully NVLinked quad", &dgx1, dgx1.all(), 4, Some(set(&[0, 1, 2, 3]))),
            ("dgx1: NV2 across sockets beats NV1 within", &dgx1, set(&[0, 1, 4]), 2, Some(set(&[0, 4]))),
            ("dgx1: NV1 beats SYS", &dgx1, set(&[0, 2, 5]), 2, Some(set(&[0, 2]))),
            ("dgx1: all 8", &dgx1, dgx1.all(), 8, Some(dgx1.all())),
            ("pcie: 2 GPUs take a PIX pair", &pcie, set(&[0, 2, 3, 4]), 2, Some(set(&[2, 3]))),
            ("pcie: 4 GPUs stay on one socket", &pcie, set(&[0, 1, 4, 5, 6, 7]), 4, Some(set(&[4, 5, 6, 7]))),
            ("h100: every pair is equal, the first wins", &h100, h100.all(), 2, Some(set(&[0, 1]))),
            ("1 GPU is the lowest free", &dgx1, set(&[3, 5]), 1, Some(set(&[3]))),
            ("nothing asked, nothing given", &dgx1, dgx1.all(), 0, Some(GpuSet::EMPTY)),
            ("free set smaller than size", &dgx1, set(&[0, 1, 2]), 4, None),
            ("GPUs the node does not have are ignored", &dgx1, set(&[6, 7, 40, 41]), 4, None),
        ];
        for (rule, t, free, size, want) in cases {
            assert_eq!(best_effort(t, free, size), want, "{rule}");
        }
    }

    #[test]
    fn the_best_partition_keeps_the_best_sets_whole() {
        // dgx1 pairs: one NV2 pair per GPU. The best split into pairs is the four NV2 pairs.
        let t = fixtures::dgx1();
        let p = best_partition(&t, t.all(), 2).unwrap_or_default();
        let mut sets: Vec<GpuSet> = p.iter().map(|s| s.gpus).collect();
        sets.sort_by_key(|s| s.bits());
        let nv2 = sets.iter().all(|s| s.len() == 2 && set_score(&t, *s) == 200);
        assert!(nv2, "{sets:?}");
        assert_eq!(sets.len(), 4);
    }

    /// Six GPUs: 0-1 bridged by NV4 on one socket, 2-5 on the other (PIX pairs 2-3 and 4-5,
    /// NODE between).
    fn bridged_pair() -> GpuTopology {
        let link = |i: usize, j: usize| match (i.min(j), i.max(j)) {
            _ if i == j => "X",
            (0, 1) => "NV4",
            (0 | 1, _) => "SYS",
            (2, 3) | (4, 5) => "PIX",
            _ => "NODE",
        };
        let gpus = (0..6)
            .map(|i| GpuEntry { index: i, uuid: None, numa: Some(u32::from(i >= 2)), memory_mib: None })
            .collect();
        let links = (0..6).map(|i| (0..6).map(|j| link(i, j).to_string()).collect()).collect();
        GpuTopology::from_annotation(&TopologyAnnotation { version: 1, gpus, links }).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn the_source_can_answer_with_its_padded_set() {
        // Six free GPUs in sets of 4: padded to 8, two sets of 4, one of them two GPUs and two
        // empty slots. Keeping the NV4 pair apart scores best (400 + 180 against 400 + 140 for
        // {0,1,2,3} + {4,5}), and the pair then outscores the full set.
        let t = bridged_pair();
        let p = best_partition(&t, t.all(), 4).unwrap_or_default();
        assert_eq!(
            p,
            vec![PartSet { gpus: set(&[0, 1]), padded: true }, PartSet { gpus: set(&[2, 3, 4, 5]), padded: false }]
        );
        assert_eq!(best_effort_as_written(&t, t.all(), 4), Some(set(&[0, 1])));
        assert_eq!(best_effort(&t, t.all(), 4), Some(set(&[2, 3, 4, 5])));
        // With a pool that divides evenly there is no padding to win.
        assert_eq!(best_effort_as_written(&t, set(&[0, 1, 2, 3]), 4), Some(set(&[0, 1, 2, 3])));
    }

    #[test]
    fn partition_counts_match_the_enumeration_and_keep_eight_gpus_exact() {
        let t = fixtures::dgx1();
        for n in 2..=8usize {
            for size in 2..=n {
                let padding = (size - n % size) % size;
                let mut search =
                    PartitionSearch { topology: &t, size, padding, stack: Vec::new(), best: None, visited: 0 };
                search.partitions(GpuSet::first(n), padding, 0);
                assert_eq!(partition_count(n, size), search.visited, "{n} GPUs, sets of {size}");
                assert!(search.visited <= PARTITION_LIMIT);
            }
        }
        assert_eq!((partition_count(8, 1), partition_count(8, 2), partition_count(8, 4)), (8, 105, 35));
        assert_eq!(partition_count(3, 4), 0);
        assert!(partition_count(16, 2) > PARTITION_LIMIT);
        assert_eq!(partition_count(64, 2), u128::MAX);
    }

    #[test]
    fn large_pools_are_searched_greedily_and_stay_whole_blocks() {
        let t = fixtures::dgx1_blocks(32);
        let free = t.all().difference(set(&[0, 1, 2]));
        let got = best_effort(&t, free, 4);
        assert_eq!(got.map(GpuSet::len), Some(4));
        assert!(got.is_some_and(|g| g.is_subset(free) && t.all_nvlinked(g)), "{got:?}");
    }

    proptest! {
        #[test]
        fn result_is_size_gpus_of_free(bits in any::<u64>(), size in 0usize..10, which in 0usize..3) {
            let t = fixtures::all().swap_remove(which);
            let free = GpuSet::from_bits(bits).intersection(t.all());
            match best_effort(&t, free, size) {
                Some(got) => {
                    prop_assert!(got.is_subset(free));
                    prop_assert_eq!(got.len(), size);
                }
                None => prop_assert!(free.len() < size),
            }
        }

        #[test]
        fn the_choice_is_a_full_set_of_the_best_partition(
            bits in any::<u8>(), size in 2usize..5,
        ) {
            let t = fixtures::dgx1();
            let free = GpuSet::from_bits(u64::from(bits));
            if let (Some(p), Some(got)) = (best_partition(&t, free, size), best_effort(&t, free, size)) {
                let union = p.iter().fold(GpuSet::EMPTY, |u, s| u.union(s.gpus));
                prop_assert_eq!(union, free);
                prop_assert!(p.iter().any(|s| s.gpus == got && !s.padded));
            }
        }
    }
}

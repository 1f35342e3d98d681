//! Which k GPUs of a node a pod gets: the set cost, an exact branch-and-bound search for up to
//! 16 available GPUs, a greedy heuristic above that, and a brute-force oracle for tests and
//! benchmarks. Pure functions of a [`GpuTopology`] and a mask; who holds which GPU is the ledger's.

use super::gpuset::GpuSet;
use super::topology::GpuTopology;

/// Cost added for each NUMA node a set spans beyond the first: host memory and CPU traffic of
/// a multi-GPU pod then crosses the socket interconnect even where the GPUs talk over NVLink.
pub const NUMA_SPAN_PENALTY: u64 = 4000;

/// Largest number of available GPUs searched exactly; above it [`select`] is greedy.
pub const EXACT_LIMIT: usize = 16;

/// Tied optimal sets compared by what they leave behind; more ties are resolved by index.
/// Bounds the tie-break on uniform topologies, where thousands of sets cost the same.
const TIE_CANDIDATES: usize = 32;

/// Pools larger than this start the exact search from a greedy incumbent.
const SEED_GREEDY_ABOVE: usize = 10;

/// The cost of giving a pod the GPUs of `set` (lower is better).
///
/// The sum of the link costs over every pair (so one bad link among good ones still counts,
/// and all-to-all collectives pay for every pair), plus [`NUMA_SPAN_PENALTY`] for each NUMA
/// node spanned beyond the first. A single GPU costs 0.
pub fn set_cost(topology: &GpuTopology, set: GpuSet) -> u64 {
    let mut pairs = 0u64;
    for i in set {
        for j in set.iter().filter(|&j| j > i) {
            pairs += u64::from(topology.link_cost(i, j));
        }
    }
    pairs + numa_penalty(topology, set)
}

fn numa_penalty(topology: &GpuTopology, set: GpuSet) -> u64 {
    span_penalty(topology.numa_span(set))
}

/// The penalty for a set on `span` NUMA nodes.
#[inline]
fn span_penalty(span: usize) -> u64 {
    span.saturating_sub(1) as u64 * NUMA_SPAN_PENALTY
}

/// How a pod wants its GPUs chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SelectOptions {
    /// A pod of two or more GPUs must get them all from one (known) NUMA node.
    pub require_single_numa: bool,
}

/// The GPUs chosen for a pod and what they cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Selection {
    /// The chosen GPUs.
    pub gpus: GpuSet,
    /// Their [`set_cost`].
    pub cost: u64,
}

/// The `k` GPUs of `available` a pod should get, or `None` when it cannot get `k`.
///
/// With at most [`EXACT_LIMIT`] GPUs available the result has the minimum [`set_cost`].
/// Among sets of equal cost it picks the one whose remaining free GPUs can best serve the next
/// requests: compared on the best cost of 16, 8, 4, 2 (and `k`) GPUs from the remainder,
/// largest first, so the biggest well-connected block stays intact, then on the cost of the
/// whole remainder. Remaining ties go to the lowest indices.
/// Above [`EXACT_LIMIT`] see [`select_greedy`].
pub fn select(topology: &GpuTopology, available: GpuSet, k: usize, options: SelectOptions) -> Option<Selection> {
    let available = available.intersection(topology.all());
    if k == 0 {
        return Some(Selection { gpus: GpuSet::EMPTY, cost: 0 });
    }
    if available.len() < k {
        return None;
    }
    if available.len() > EXACT_LIMIT {
        return select_greedy(topology, available, k, options);
    }
    let single_numa = options.require_single_numa && k > 1;
    let bounds = LinkBounds::new(topology, available);
    let (cost, ties) = exact(topology, &bounds, available, k, single_numa, u64::MAX, TIE_CANDIDATES)?;
    let ladder = remainder_ladder(k, available.len() - k);
    let gpus = break_ties(topology, &bounds, available, ties, &ladder)?;
    Some(Selection { gpus, cost })
}

/// Request sizes the remainder is judged on, largest first.
fn remainder_ladder(k: usize, remaining: usize) -> Vec<usize> {
    let mut sizes: Vec<usize> = [16, 8, 4, 2, k].into_iter().filter(|&r| r >= 2 && r <= remaining).collect();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    sizes.dedup();
    sizes
}

/// The tie whose remainder is best: lowest best cost for each ladder size in turn, then the
/// lowest cost of the whole remainder (free GPUs that stay close together); the first of equals
/// (lowest indices) otherwise.
///
/// No remainder can beat the best set of the same size in all of `available`, so a tie that
/// leaves that set untouched reaches the floor without a search, and the other ties are only
/// searched for sets no worse than the best value so far.
fn break_ties(
    topology: &GpuTopology,
    bounds: &LinkBounds,
    available: GpuSet,
    mut alive: Vec<GpuSet>,
    ladder: &[usize],
) -> Option<GpuSet> {
    for &r in ladder {
        if alive.len() <= 1 {
            break;
        }
        let Some((floor, floor_sets)) = exact(topology, bounds, available, r, false, u64::MAX, 1) else {
            continue;
        };
        let floor_set = floor_sets.first().copied().unwrap_or_default();
        let mut best = if alive.iter().any(|t| t.is_disjoint(floor_set)) { floor } else { u64::MAX };
        let costs: Vec<Option<u64>> = alive
            .iter()
            .map(|tie| {
                let cost = if tie.is_disjoint(floor_set) {
                    Some(floor)
                } else {
                    let rest = available.difference(*tie);
                    exact(topology, bounds, rest, r, false, best, 1).map(|(cost, _)| cost)
                };
                if let Some(c) = cost {
                    best = best.min(c);
                }
                cost
            })
            .collect();
        alive = alive.into_iter().zip(costs).filter(|(_, cost)| *cost == Some(best)).map(|(tie, _)| tie).collect();
    }
    alive.into_iter().min_by_key(|tie| set_cost(topology, available.difference(*tie)))
}

/// Greedy choice for nodes with more than [`EXACT_LIMIT`] available GPUs.
///
/// From every available GPU as a seed, grow a set by repeatedly adding the GPU that adds the
/// least cost (its links to the set so far, plus [`NUMA_SPAN_PENALTY`] when it opens a new
/// NUMA node; lowest index on ties) and keep the cheapest of those sets. O(n² k), no optimality
/// guarantee; with `require_single_numa` the growth stays inside the seed's NUMA node.
pub fn select_greedy(topology: &GpuTopology, available: GpuSet, k: usize, options: SelectOptions) -> Option<Selection> {
    let available = available.intersection(topology.all());
    if k == 0 {
        return Some(Selection { gpus: GpuSet::EMPTY, cost: 0 });
    }
    let single_numa = options.require_single_numa && k > 1;
    let mut best: Option<Selection> = None;
    for seed in available {
        let pool = if single_numa {
            match topology.numa_groups().iter().find(|(_, g)| g.contains(seed)) {
                Some((_, g)) => available.intersection(*g),
                None => continue,
            }
        } else {
            available
        };
        if pool.len() < k {
            continue;
        }
        let Some(set) = grow(topology, pool, seed, k) else {
            continue;
        };
        let cost = set_cost(topology, set);
        if best.is_none_or(|b| cost < b.cost) {
            best = Some(Selection { gpus: set, cost });
        }
    }
    best
}

fn grow(topology: &GpuTopology, pool: GpuSet, seed: usize, k: usize) -> Option<GpuSet> {
    let mut set = GpuSet::single(seed)?;
    let mut numa = topology.numa_bit(seed);
    // added[j]: summed link cost from j to the set so far.
    let mut added = [0u64; 64];
    for j in pool {
        added[j] = u64::from(topology.link_cost(seed, j));
    }
    while set.len() < k {
        let next = pool.difference(set).iter().min_by_key(|&j| {
            let opens_numa = topology.numa_bit(j) & !numa != 0;
            added[j] + if opens_numa { NUMA_SPAN_PENALTY } else { 0 }
        })?;
        set = set.with(next)?;
        numa |= topology.numa_bit(next);
        for j in pool {
            added[j] += u64::from(topology.link_cost(next, j));
        }
    }
    Some(set)
}

/// The minimum [`set_cost`] over every `k`-subset of `available`, by plain enumeration.
///
/// The reference [`select`] is tested and benchmarked against. Exponential: keep it to nodes
/// of about 16 GPUs. Returns the first minimal set in ascending index order.
pub fn select_brute_force(
    topology: &GpuTopology,
    available: GpuSet,
    k: usize,
    options: SelectOptions,
) -> Option<Selection> {
    let cands: Vec<usize> = available.intersection(topology.all()).iter().collect();
    if k > cands.len() {
        return None;
    }
    let single_numa = options.require_single_numa && k > 1;
    let mut best: Option<Selection> = None;
    // Index combinations in lexicographic order.
    let mut pick: Vec<usize> = (0..k).collect();
    loop {
        let set = GpuSet::from_indices(pick.iter().map(|&p| cands[p])).unwrap_or_default();
        if !single_numa || topology.single_numa(set) {
            let cost = set_cost(topology, set);
            if best.is_none_or(|b| cost < b.cost) {
                best = Some(Selection { gpus: set, cost });
            }
        }
        let Some(i) = (0..k).rev().find(|&i| pick[i] < cands.len() - k + i) else {
            break;
        };
        pick[i] += 1;
        for j in i + 1..k {
            pick[j] = pick[j - 1] + 1;
        }
    }
    best
}

/// Exact branch and bound: the minimum cost of a `k`-subset of `available` and up to `tie_cap`
/// (at least one) subsets reaching it, in ascending index order.
///
/// Only sets costing at most `limit` are looked for (`u64::MAX`: any); `None` when there is
/// none.
fn exact(
    topology: &GpuTopology,
    bounds: &LinkBounds,
    available: GpuSet,
    k: usize,
    single_numa: bool,
    limit: u64,
    tie_cap: usize,
) -> Option<(u64, Vec<GpuSet>)> {
    let groups = topology.numa_groups();
    let pools = (0..if single_numa { groups.len() } else { 1 })
        .map(|g| match groups.get(g) {
            Some((_, numa)) if single_numa => available.intersection(*numa),
            _ => available,
        })
        .filter(|pool| pool.len() >= k);
    let mut search = Exact {
        topology,
        k,
        cands: [0; 64],
        n: 0,
        chosen: 0,
        to_chosen: [0; 64],
        bounds,
        best: limit,
        ties: Vec::new(),
        tie_cap: tie_cap.max(1),
    };
    // A greedy set first: a good incumbent lets the bound prune from the first branch on.
    // Small pools are cheaper to search than to seed.
    for pool in pools.clone().filter(|p| p.len() > SEED_GREEDY_ABOVE) {
        // Grown from one seed only, the best connected GPU, to keep the seeding cheap.
        let seed = pool.iter().min_by_key(|&i| bounds.cheapest(i, k.saturating_sub(1)));
        if let Some(set) = seed.and_then(|seed| grow(topology, pool, seed, k)) {
            search.best = search.best.min(set_cost(topology, set));
        }
    }
    for pool in pools {
        search.run(pool);
    }
    if search.ties.is_empty() {
        return None;
    }
    // Pools are searched one after another, so sort to keep "ascending index order" true.
    // Reversed bits put the lowest index highest, so descending order is ascending index order.
    search.ties.sort_by_key(|s| std::cmp::Reverse(s.bits().reverse_bits()));
    Some((search.best, search.ties))
}

/// Per GPU of a base set of at most [`EXACT_LIMIT`]: the sums of its cheapest links to the
/// others. Built once per [`select`] call; every search in it runs on a subset of the base, and
/// links to a superset can only be cheaper, so the sums stay lower bounds there.
struct LinkBounds {
    /// GPU index -> row of `cheap`.
    row: [u8; 64],
    /// `cheap[row][m]`: the sum of the `m` cheapest links from that GPU to the rest of the base.
    cheap: [[u64; EXACT_LIMIT]; EXACT_LIMIT],
}

impl LinkBounds {
    fn new(topology: &GpuTopology, base: GpuSet) -> Self {
        let mut bounds = LinkBounds { row: [0; 64], cheap: [[0; EXACT_LIMIT]; EXACT_LIMIT] };
        for (r, i) in base.iter().take(EXACT_LIMIT).enumerate() {
            bounds.row[i] = r as u8;
            let mut links = [u64::MAX; EXACT_LIMIT];
            for (slot, j) in links.iter_mut().zip(base.iter().filter(|&j| j != i)) {
                *slot = u64::from(topology.link_cost(i, j));
            }
            links.sort_unstable();
            for m in 1..EXACT_LIMIT {
                bounds.cheap[r][m] = bounds.cheap[r][m - 1].saturating_add(links[m - 1]);
            }
        }
        bounds
    }

    /// The sum of the `m` cheapest links from GPU `i` to the rest of the base.
    #[inline]
    fn cheapest(&self, i: usize, m: usize) -> u64 {
        self.cheap[usize::from(self.row[i % 64])][m.min(EXACT_LIMIT - 1)]
    }
}

/// Search state, on the stack: the search runs thousands of times per placement decision.
struct Exact<'a> {
    topology: &'a GpuTopology,
    k: usize,
    /// Candidate GPU indices, ascending; `n` of them.
    cands: [usize; 64],
    n: usize,
    /// How many candidates the current branch has taken.
    chosen: usize,
    /// For each candidate position: summed link cost to the GPUs taken so far.
    to_chosen: [u64; 64],
    /// Bounds the links among GPUs not yet chosen.
    bounds: &'a LinkBounds,
    best: u64,
    ties: Vec<GpuSet>,
    tie_cap: usize,
}

impl Exact<'_> {
    fn run(&mut self, pool: GpuSet) {
        self.n = 0;
        for (slot, i) in self.cands.iter_mut().zip(pool) {
            *slot = i;
            self.n += 1;
        }
        self.chosen = 0;
        self.to_chosen = [0; 64];
        self.dfs(0, GpuSet::EMPTY, 0, 0);
    }

    /// `numa`: the NUMA bits of `set` (see [`GpuTopology::numa_bit`]).
    fn dfs(&mut self, pos: usize, set: GpuSet, pairs: u64, numa: u64) {
        let missing = self.k - self.chosen;
        let penalty = span_penalty(numa.count_ones() as usize);
        if missing == 0 {
            self.offer(pairs + penalty, set);
            return;
        }
        if self.n - pos < missing {
            return;
        }
        // The NUMA penalty never shrinks as GPUs are added, so it bounds the final penalty too.
        let bound = pairs + penalty + self.extension_bound(pos, missing);
        if bound > self.best || (bound == self.best && self.ties.len() >= self.tie_cap) {
            return;
        }
        let j = self.cands[pos];
        let add = self.to_chosen[pos];
        self.shift(pos, j, true);
        self.chosen += 1;
        let with_j = set.with(j).unwrap_or(set);
        self.dfs(pos + 1, with_j, pairs + add, numa | self.topology.numa_bit(j));
        self.chosen -= 1;
        self.shift(pos, j, false);
        self.dfs(pos + 1, set, pairs, numa);
    }

    /// Adds (or takes back) the links from GPU `j` to every later candidate.
    fn shift(&mut self, pos: usize, j: usize, add: bool) {
        for q in pos + 1..self.n {
            let cost = u64::from(self.topology.link_cost(j, self.cands[q]));
            if add {
                self.to_chosen[q] += cost;
            } else {
                self.to_chosen[q] -= cost;
            }
        }
    }

    /// A lower bound on the cost `missing` more candidates from `pos` on would add.
    ///
    /// Each new GPU q adds its links to the GPUs already taken plus half of its links to the
    /// other new ones (each pair is shared by two), and the latter are at least its `missing - 1`
    /// cheapest links; the `missing` smallest such sums bound any completion. Doubled to stay
    /// in integers, halved at the end (rounding down keeps it a lower bound).
    fn extension_bound(&self, pos: usize, missing: usize) -> u64 {
        let mut doubled = [0u64; 64];
        let rest = &mut doubled[..self.n - pos];
        for (slot, q) in rest.iter_mut().zip(pos..self.n) {
            *slot = 2 * self.to_chosen[q] + self.bounds.cheapest(self.cands[q], missing - 1);
        }
        if missing == 1 {
            return rest.iter().copied().min().unwrap_or(0) / 2;
        }
        rest.select_nth_unstable(missing - 1);
        rest[..missing].iter().sum::<u64>() / 2
    }

    fn offer(&mut self, cost: u64, set: GpuSet) {
        if cost < self.best {
            self.best = cost;
            self.ties.clear();
            self.ties.push(set);
        } else if cost == self.best && self.ties.len() < self.tie_cap {
            self.ties.push(set);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::fixtures;
    use proptest::prelude::*;

    fn set(indices: &[usize]) -> GpuSet {
        GpuSet::from_indices(indices.iter().copied()).unwrap_or_default()
    }

    fn pick(t: &GpuTopology, free: &[usize], k: usize) -> Option<Vec<usize>> {
        select(t, set(free), k, SelectOptions::default()).map(|s| s.gpus.iter().collect())
    }

    fn single_numa() -> SelectOptions {
        SelectOptions { require_single_numa: true }
    }

    #[test]
    fn set_cost_sums_pairs_and_penalizes_numa_span() {
        let t = fixtures::pcie();
        // GPU0-1 PIX, both NUMA 0.
        assert_eq!(set_cost(&t, set(&[0, 1])), 3000);
        // GPU0-4 SYS across sockets: link plus one NUMA penalty.
        assert_eq!(set_cost(&t, set(&[0, 4])), 9000 + NUMA_SPAN_PENALTY);
        assert_eq!(set_cost(&t, set(&[3])), 0);
        assert_eq!(set_cost(&t, GpuSet::EMPTY), 0);
    }

    #[test]
    fn pairs_prefer_the_widest_nvlink() {
        let t = fixtures::dgx1();
        // On the hybrid cube mesh GPU0 reaches 3 and 4 over NV2 and 1, 2 over NV1; 4 is the
        // other socket, so with 0,1,2,3,4 free the pair is 0-3 or 1-2 or 2-3 (all NV2, same NUMA).
        let chosen = pick(&t, &[0, 1, 2, 3, 4], 2).unwrap_or_default();
        assert_eq!(set_cost(&t, set(&chosen)), Link::NvLink(2).cost() as u64);
        assert!(t.single_numa(set(&chosen)));
        // NV1 beats crossing to the other socket.
        assert_eq!(pick(&t, &[0, 1, 5], 2), Some(vec![0, 1]));
    }

    use crate::devices::topology::Link;

    #[test]
    fn multi_gpu_pods_stay_in_one_numa_node_when_they_can() {
        let t = fixtures::dgx_h100();
        // All links NV18: only the NUMA penalty tells sets apart.
        let chosen = pick(&t, &[2, 3, 4, 5, 6, 7], 4).unwrap_or_default();
        assert_eq!(chosen, vec![4, 5, 6, 7]);
    }

    #[test]
    fn single_gpu_goes_where_it_breaks_the_least() {
        let t = fixtures::dgx_h100();
        // NUMA 0 has 3 free, NUMA 1 all 4: taking from NUMA 0 keeps a whole 4-GPU block.
        assert_eq!(pick(&t, &[1, 2, 3, 4, 5, 6, 7], 1), Some(vec![1]));
        assert_eq!(pick(&t, &[0, 1, 2, 3, 5, 6, 7], 1), Some(vec![5]));
        let pcie = fixtures::pcie();
        // PIX pairs (0,1) (2,3): with 0,2,3 free the lone GPU0 goes, the PIX pair stays.
        assert_eq!(pick(&pcie, &[0, 2, 3], 1), Some(vec![0]));
        assert_eq!(pick(&pcie, &[0, 1, 2], 1), Some(vec![2]));
    }

    #[test]
    fn equal_pairs_leave_the_better_connected_remainder() {
        let t = fixtures::dgx1();
        // 0-3 and 4-7 are both NV2 inside one NUMA node; taking 4-7 leaves 0,1,2,3 (a whole
        // NVLinked NUMA node) while taking 0-3 leaves 1,2,4,7, which spans sockets.
        assert_eq!(pick(&t, &[0, 1, 2, 3, 4, 7], 2), Some(vec![4, 7]));
    }

    #[test]
    fn not_enough_gpus_is_none_and_zero_gpus_is_empty() {
        let t = fixtures::dgx_h100();
        assert_eq!(pick(&t, &[0, 1], 3), None);
        assert_eq!(pick(&t, &[], 0), Some(vec![]));
        // Bits beyond the node are ignored.
        assert_eq!(select(&t, GpuSet::from_bits(0xff00), 1, SelectOptions::default()), None);
    }

    #[test]
    fn require_single_numa_refuses_to_span() {
        let t = fixtures::dgx_h100();
        let free = set(&[2, 3, 4, 5]);
        assert_eq!(select(&t, free, 4, single_numa()), None);
        assert!(select(&t, free, 4, SelectOptions::default()).is_some());
        assert_eq!(select(&t, free, 2, single_numa()).map(|s| s.gpus), Some(set(&[2, 3])));
        // One GPU never spans anything.
        assert!(select(&t, set(&[7]), 1, single_numa()).is_some());
        // Unknown topology has no NUMA information, so it cannot promise one NUMA node.
        assert_eq!(select(&GpuTopology::unknown(8), GpuSet::first(8), 2, single_numa()), None);
    }

    #[test]
    fn unknown_topology_takes_the_lowest_indices() {
        let t = GpuTopology::unknown(8);
        assert_eq!(pick(&t, &[1, 3, 5, 7], 2), Some(vec![1, 3]));
    }

    #[test]
    fn more_than_sixteen_available_uses_the_greedy_heuristic() {
        let t = fixtures::dgx1_blocks(32);
        let s = select(&t, t.all(), 4, SelectOptions::default());
        let g = select_greedy(&t, t.all(), 4, SelectOptions::default());
        assert_eq!(s, g);
        let s = s.unwrap_or(Selection { gpus: GpuSet::EMPTY, cost: 0 });
        assert_eq!(s.gpus.len(), 4);
        assert!(t.single_numa(s.gpus) && t.all_nvlinked(s.gpus), "{:?}", s.gpus);
        let numa = select(&t, GpuSet::from_bits(0x3f3f_3f3f), 4, single_numa());
        assert!(numa.is_some_and(|s| t.single_numa(s.gpus)));
    }

    #[test]
    fn greedy_never_beats_the_exact_search() {
        for t in fixtures::all() {
            for k in 1..=t.len() {
                let exact = select(&t, t.all(), k, SelectOptions::default()).map(|s| s.cost);
                let greedy = select_greedy(&t, t.all(), k, SelectOptions::default()).map(|s| s.cost);
                assert!(exact <= greedy, "k={k}: exact {exact:?} greedy {greedy:?}");
            }
        }
    }

    /// A random symmetric topology of `n` GPUs on up to three NUMA nodes.
    fn random_topology(max: usize) -> impl Strategy<Value = GpuTopology> {
        (2..=max).prop_flat_map(|n| {
            let tokens =
                prop::sample::select(vec!["NV1", "NV2", "NV4", "NV12", "NV18", "PIX", "PXB", "PHB", "NODE", "SYS"]);
            (prop::collection::vec(tokens, n * n), prop::collection::vec(prop::option::weighted(0.9, 0u32..3), n))
                .prop_map(move |(cells, numa)| {
                    let links: Vec<Vec<String>> = (0..n)
                        .map(|i| {
                            (0..n)
                                .map(|j| if i == j { "X".into() } else { cells[i.min(j) * n + i.max(j)].to_string() })
                                .collect()
                        })
                        .collect();
                    let gpus = (0..n)
                        .map(|i| crate::devices::topology::GpuEntry {
                            index: i as u32,
                            uuid: None,
                            numa: numa[i],
                            memory_mib: None,
                        })
                        .collect();
                    let a = crate::devices::topology::TopologyAnnotation { version: 1, gpus, links };
                    GpuTopology::from_annotation(&a).unwrap_or_else(|_| GpuTopology::unknown(n))
                })
        })
    }

    proptest! {
        #[test]
        fn selection_equals_brute_force_on_every_fixture(
            which in 0usize..3, free in any::<u8>(), k in 0usize..=8, numa in any::<bool>(),
        ) {
            let t = &fixtures::all()[which];
            let opts = SelectOptions { require_single_numa: numa };
            let got = select(t, GpuSet::from_bits(u64::from(free)), k, opts);
            let want = select_brute_force(t, GpuSet::from_bits(u64::from(free)), k, opts);
            prop_assert_eq!(got.map(|s| s.cost), want.map(|s| s.cost));
            if let Some(s) = got {
                prop_assert_eq!(s.gpus.len(), k);
                prop_assert!(s.gpus.is_subset(GpuSet::from_bits(u64::from(free))));
                prop_assert_eq!(s.cost, set_cost(t, s.gpus));
                prop_assert!(!(numa && k > 1) || t.single_numa(s.gpus));
            }
        }

        #[test]
        fn selection_equals_brute_force_on_random_topologies(
            t in random_topology(12), free in any::<u16>(), k in 0usize..=12, numa in any::<bool>(),
        ) {
            let opts = SelectOptions { require_single_numa: numa };
            let free = GpuSet::from_bits(u64::from(free));
            let got = select(&t, free, k, opts);
            let want = select_brute_force(&t, free, k, opts);
            prop_assert_eq!(got.map(|s| s.cost), want.map(|s| s.cost));
            if let Some(s) = got {
                prop_assert_eq!(s.cost, set_cost(&t, s.gpus));
                prop_assert!(s.gpus.is_subset(free));
            }
        }

        #[test]
        fn selection_is_exact_on_sixteen_gpus(free in any::<u16>(), k in 1usize..=8) {
            let t = fixtures::dgx1_blocks(16);
            let free = GpuSet::from_bits(u64::from(free));
            let got = select(&t, free, k, SelectOptions::default()).map(|s| s.cost);
            let want = select_brute_force(&t, free, k, SelectOptions::default()).map(|s| s.cost);
            prop_assert_eq!(got, want);
        }

    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn greedy_returns_valid_sets(free in any::<u64>(), k in 0usize..=40, numa in any::<bool>()) {
            let t = fixtures::dgx1_blocks(64);
            let free = GpuSet::from_bits(free);
            let opts = SelectOptions { require_single_numa: numa };
            if let Some(s) = select(&t, free, k, opts) {
                prop_assert_eq!(s.gpus.len(), k);
                prop_assert!(s.gpus.is_subset(free));
                prop_assert_eq!(s.cost, set_cost(&t, s.gpus));
                prop_assert!(!(numa && k > 1) || t.single_numa(s.gpus));
            } else {
                prop_assert!(free.len() < k || numa);
            }
        }
    }
}

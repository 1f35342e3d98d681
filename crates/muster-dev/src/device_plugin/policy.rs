//! PURE: the devices NVIDIA's device plugin prefers when kubelet asks `GetPreferredAllocation`
//! for whole GPUs: go-gpuallocator's best-effort policy (`NewBestEffortPolicy`), restated for
//! a link matrix of muster's [`Link`]s. Written for muster from that policy's public source.
//!
//! The policy: a pair of GPUs scores by its link ([`pair_score`]: 100 per NVLink, then the
//! PCIe levels `PIX` 50, `PXB` 40, `PHB` 30, `NODE` 20, `SYS` 10), a set by the sum over its
//! pairs. The available GPUs, padded with empty slots to a multiple of the request, are split
//! into sets of the requested size every possible way; a split counts only if one of its sets
//! holds every must-include GPU and no empty slot. The highest-scoring split wins (the first
//! found among equals), and the answer is its highest-scoring set holding every must-include
//! GPU (again the first among equals). Looking at whole splits rather than the single best set
//! keeps the GPUs left over well connected for the next request.
//!
//! "First found" follows the enumeration order of the source: the pool in the order given,
//! padding last; each set starts with the first GPU not yet taken and completes it with the
//! others in lexicographic order of their positions; a set holds all the padding or none.

use std::ops::ControlFlow;

use muster_core::devices::Link;
use muster_core::devices::nvidia_policy::pair_score;

/// Most splits scored exactly; larger pools (16 GPUs in pairs is two million splits) are
/// answered greedily ([`greedy`]). Every request on up to 12 GPUs stays under it.
pub const SPLIT_BUDGET: usize = 200_000;

/// One slot of the padded pool: a GPU (its position in the link matrix) or padding.
type Slot = Option<usize>;

/// The `size` GPUs of `available` the best-effort policy prefers, always including `required`,
/// in the order of `available`; empty when there is no such choice (`size` 0, fewer than
/// `size` available, more than `size` required, or a required GPU not available), which is
/// what the source answers then too.
///
/// GPUs are positions in `links` (`links[i][j]` is how GPU `i` reaches GPU `j`); a pair
/// outside the matrix scores 0. Ties break by the order of `available`: callers that want a
/// stable answer pass it sorted. Duplicates are ignored.
pub fn best_effort(links: &[Vec<Link>], available: &[usize], required: &[usize], size: usize) -> Vec<usize> {
    let available = dedup(available);
    let required = dedup(required);
    if size == 0 || available.len() < size || required.len() > size {
        return Vec::new();
    }
    if !required.iter().all(|r| available.contains(r)) {
        return Vec::new();
    }
    let padding = (size - available.len() % size) % size;
    let mut pool: Vec<Slot> = available.iter().copied().map(Some).collect();
    pool.extend(std::iter::repeat_n(None, padding));
    let mut search =
        Search { links, size, padding, required: &required, budget: SPLIT_BUDGET, stack: Vec::new(), best: None };
    if search.split(pool).is_break() {
        return greedy(links, &available, &required, size);
    }
    let Some((_, split)) = search.best else { return Vec::new() };
    // The source would also consider the set holding the padding (and answer its empty slots
    // as devices); only full sets are answers here.
    let mut best: Option<(u64, &Vec<Slot>)> = None;
    for set in split.iter().filter(|s| is_full(s) && holds_all(s, &required)) {
        let score = set_score(links, set.iter().flatten().copied());
        if best.is_none_or(|(b, _)| score > b) {
            best = Some((score, set));
        }
    }
    best.map(|(_, set)| set.iter().flatten().copied().collect()).unwrap_or_default()
}

/// The policy's score of the pair `i`, `j` (0 for a GPU with itself or outside `links`).
pub fn link_score(links: &[Vec<Link>], i: usize, j: usize) -> u64 {
    if i == j {
        return 0;
    }
    links.get(i).and_then(|row| row.get(j)).map_or(0, |&link| u64::from(pair_score(link)))
}

/// The sum of [`link_score`] over every pair of `gpus`.
pub fn set_score(links: &[Vec<Link>], gpus: impl IntoIterator<Item = usize>) -> u64 {
    let gpus: Vec<usize> = gpus.into_iter().collect();
    let mut score = 0;
    for (k, &i) in gpus.iter().enumerate() {
        for &j in &gpus[k + 1..] {
            score += link_score(links, i, j);
        }
    }
    score
}

/// The items of `list` in order, each once.
fn dedup(list: &[usize]) -> Vec<usize> {
    let mut out: Vec<usize> = Vec::with_capacity(list.len());
    for &g in list {
        if !out.contains(&g) {
            out.push(g);
        }
    }
    out
}

fn is_full(set: &[Slot]) -> bool {
    set.iter().all(Option::is_some)
}

fn holds_all(set: &[Slot], required: &[usize]) -> bool {
    required.iter().all(|r| set.contains(&Some(*r)))
}

/// The exhaustive search over the splits of the padded pool.
struct Search<'a> {
    links: &'a [Vec<Link>],
    size: usize,
    /// Empty slots in the whole pool.
    padding: usize,
    required: &'a [usize],
    /// Splits left to score before giving up.
    budget: usize,
    /// The sets of the split being built.
    stack: Vec<Vec<Slot>>,
    best: Option<(u64, Vec<Vec<Slot>>)>,
}

impl Search<'_> {
    /// Every split of `rest` (whose length is a multiple of `size`), after the sets on the
    /// stack; breaks when the budget is spent.
    fn split(&mut self, rest: Vec<Slot>) -> ControlFlow<()> {
        if rest.len() <= self.size {
            self.stack.push(rest);
            let flow = self.leaf();
            self.stack.pop();
            return flow;
        }
        let first = rest[0];
        let others = &rest[1..];
        let mut picks: Vec<usize> = (0..self.size - 1).collect();
        loop {
            let mut set = Vec::with_capacity(self.size);
            set.push(first);
            set.extend(picks.iter().map(|&k| others[k]));
            let pads = set.iter().filter(|s| s.is_none()).count();
            if pads == 0 || pads == self.padding {
                let left = others.iter().enumerate().filter(|(k, _)| !picks.contains(k)).map(|(_, s)| *s).collect();
                self.stack.push(set);
                let flow = self.split(left);
                self.stack.pop();
                flow?;
            }
            if !next_combination(&mut picks, others.len()) {
                return ControlFlow::Continue(());
            }
        }
    }

    /// The stack is a whole split: keep it if it counts and beats the best so far.
    fn leaf(&mut self) -> ControlFlow<()> {
        if self.budget == 0 {
            return ControlFlow::Break(());
        }
        self.budget -= 1;
        if !self.stack.iter().any(|s| is_full(s) && holds_all(s, self.required)) {
            return ControlFlow::Continue(());
        }
        let score = self.stack.iter().map(|s| set_score(self.links, s.iter().flatten().copied())).sum::<u64>();
        if self.best.as_ref().is_none_or(|(b, _)| score > *b) {
            self.best = Some((score, self.stack.clone()));
        }
        ControlFlow::Continue(())
    }
}

/// Advances `picks` (increasing positions below `n`) to the next combination in lexicographic
/// order; false after the last one (at once for an empty combination).
fn next_combination(picks: &mut [usize], n: usize) -> bool {
    let k = picks.len();
    for i in (0..k).rev() {
        if picks[i] < n - k + i {
            picks[i] += 1;
            for j in i + 1..k {
                picks[j] = picks[j - 1] + 1;
            }
            return true;
        }
    }
    false
}

/// Past [`SPLIT_BUDGET`]: grows a set from `required` (or, with none, from each available GPU
/// in turn, keeping the first best), each step adding the GPU that adds the most score (the
/// first among equals); in the order of `available`.
fn greedy(links: &[Vec<Link>], available: &[usize], required: &[usize], size: usize) -> Vec<usize> {
    let grow = |seed: Vec<usize>| {
        let mut set = seed;
        while set.len() < size {
            let mut best: Option<(u64, usize)> = None;
            for &g in available.iter().filter(|g| !set.contains(g)) {
                let gain = set.iter().map(|&s| link_score(links, s, g)).sum::<u64>();
                if best.is_none_or(|(b, _)| gain > b) {
                    best = Some((gain, g));
                }
            }
            match best {
                Some((_, g)) => set.push(g),
                None => break,
            }
        }
        set
    };
    let seeds: Vec<Vec<usize>> =
        if required.is_empty() { available.iter().map(|&g| vec![g]).collect() } else { vec![required.to_vec()] };
    let mut best: Option<(u64, Vec<usize>)> = None;
    for set in seeds.into_iter().map(grow) {
        let score = set_score(links, set.iter().copied());
        if best.as_ref().is_none_or(|(b, _)| score > *b) {
            best = Some((score, set));
        }
    }
    let chosen = best.map(|(_, s)| s).unwrap_or_default();
    available.iter().copied().filter(|g| chosen.contains(g)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use muster_core::devices::nvidia_policy;
    use muster_core::devices::{GpuSet, GpuTopology, fixtures};

    fn parse(rows: &[&[&str]]) -> Vec<Vec<Link>> {
        rows.iter().map(|r| r.iter().map(|t| t.parse::<Link>().unwrap_or_else(|e| panic!("{e}"))).collect()).collect()
    }

    /// Eight GPUs in NVLink pairs (0-1, 2-3, 4-5, 6-7: NV2); two pairs behind one PCIe switch
    /// tree per socket (PXB between 0/1 and 2/3, and between 4/5 and 6/7); SYS across sockets.
    fn pairs() -> Vec<Vec<Link>> {
        let link = |i: usize, j: usize| match () {
            _ if i == j => "X",
            _ if i / 2 == j / 2 => "NV2",
            _ if i / 4 == j / 4 => "PXB",
            _ => "SYS",
        };
        (0..8).map(|i| (0..8).map(|j| link(i, j).parse::<Link>().unwrap_or(Link::Sys)).collect()).collect()
    }

    fn links_of(t: &GpuTopology) -> Vec<Vec<Link>> {
        (0..t.len()).map(|i| (0..t.len()).map(|j| t.link(i, j)).collect()).collect()
    }

    #[test]
    fn pair_scores_follow_nvidias_ladder() {
        let links = parse(&[
            &["X", "NV12", "NV1", "PIX", "PXB", "PHB", "NODE", "SYS"],
            &["NV12", "X", "SYS", "SYS", "SYS", "SYS", "SYS", "SYS"],
        ]);
        let scores: Vec<u64> = (0..8).map(|j| link_score(&links, 0, j)).collect();
        assert_eq!(scores, [0, 1200, 100, 50, 40, 30, 20, 10]);
        assert_eq!(link_score(&links, 0, 9), 0, "outside the matrix");
        assert_eq!(set_score(&links, [0, 1, 2]), 1200 + 100 + 10);
    }

    #[test]
    fn nvlink_pair_layout() {
        let links = pairs();
        let all: Vec<usize> = (0..8).collect();
        // (rule, available, must include, size, answer)
        type Case = (&'static str, Vec<usize>, Vec<usize>, usize, Vec<usize>);
        let cases: Vec<Case> = vec![
            ("2 of 8: the first NVLink pair", all.clone(), vec![], 2, vec![0, 1]),
            ("4 of 8: two pairs behind one switch", all.clone(), vec![], 4, vec![0, 1, 2, 3]),
            ("8 of 8: all of them", all.clone(), vec![], 8, all.clone()),
            ("1 of 8: the first", all.clone(), vec![], 1, vec![0]),
            ("1, fragmented: the first available", vec![3, 5], vec![], 1, vec![3]),
            ("1, must include: that one", all.clone(), vec![6], 1, vec![6]),
            ("fragmented: a whole pair, not the broken ones", vec![1, 2, 3, 5, 6, 7], vec![], 2, vec![2, 3]),
            ("fragmented: broken pairs go together on one switch", vec![1, 3, 4, 6], vec![], 2, vec![1, 3]),
            ("must include 5: its NVLink partner", all.clone(), vec![5], 2, vec![4, 5]),
            (
                "must include 1, partner taken: the switch neighbour first",
                vec![1, 2, 3, 4, 5, 6, 7],
                vec![1],
                2,
                vec![1, 2],
            ),
            ("must include two across sockets", all.clone(), vec![0, 7], 2, vec![0, 7]),
            ("must include one of 4: its socket", all.clone(), vec![6], 4, vec![4, 5, 6, 7]),
            ("3 of 8: a pair and its switch neighbour", all.clone(), vec![], 3, vec![0, 1, 2]),
            ("ties follow the order given", vec![6, 7, 0, 1], vec![], 2, vec![6, 7]),
            ("duplicates count once", vec![0, 0, 1, 1], vec![], 2, vec![0, 1]),
            ("nothing asked", all.clone(), vec![], 0, vec![]),
            ("fewer available than asked", vec![0, 1, 2], vec![], 4, vec![]),
            ("more required than asked", all.clone(), vec![0, 1, 2], 2, vec![]),
            ("required but not available", vec![0, 1, 2, 3], vec![4], 2, vec![]),
        ];
        for (rule, available, required, size, want) in cases {
            assert_eq!(best_effort(&links, &available, &required, size), want, "{rule}");
        }
    }

    #[test]
    fn link_types_rank_nvlink_then_switch_levels_then_sys() {
        // GPU 0 reaches 1 by NV1, 2 by PIX, 3 by PXB, 4 by PHB, 5 by NODE, 6 by SYS; the
        // others reach each other only by SYS.
        let row = ["X", "NV1", "PIX", "PXB", "PHB", "NODE", "SYS"];
        let links: Vec<Vec<Link>> = (0..7)
            .map(|i| {
                (0..7)
                    .map(|j| match (i, j) {
                        _ if i == j => Link::SelfLink,
                        (0, k) | (k, 0) => row[k].parse().unwrap_or(Link::Sys),
                        _ => Link::Sys,
                    })
                    .collect()
            })
            .collect();
        for (partner, link) in row.iter().enumerate().skip(1) {
            let available: Vec<usize> = (partner..7).collect();
            assert_eq!(best_effort(&links, &available, &[0], 2), Vec::<usize>::new(), "0 is not available");
            let mut available = vec![0];
            available.extend(partner..7);
            assert_eq!(best_effort(&links, &available, &[0], 2), vec![0, partner], "0 with {link}");
        }
        // More NVLinks beat fewer.
        let links = parse(&[&["X", "NV1", "NV4"], &["NV1", "X", "SYS"], &["NV4", "SYS", "X"]]);
        assert_eq!(best_effort(&links, &[0, 1, 2], &[0], 2), vec![0, 2]);
    }

    #[test]
    fn the_whole_split_matters_not_just_the_best_set() {
        // 0-1 NV4, 2-3 NV4, 0-2 NV6, everything else SYS. The best single pair is 0-2, but
        // taking it leaves 1-3 on SYS: {0,1} + {2,3} (800) beats {0,2} + {1,3} (610).
        let links = parse(&[
            &["X", "NV4", "NV6", "SYS"],
            &["NV4", "X", "SYS", "SYS"],
            &["NV6", "SYS", "X", "NV4"],
            &["SYS", "SYS", "NV4", "X"],
        ]);
        assert_eq!(best_effort(&links, &[0, 1, 2, 3], &[], 2), vec![0, 1]);
        // Must include 2: the split {0,1} + {2,3} still wins, and its set holding 2 answers.
        assert_eq!(best_effort(&links, &[0, 1, 2, 3], &[2], 2), vec![2, 3]);
    }

    #[test]
    fn the_padded_set_is_never_the_answer() {
        // muster-core's case: six GPUs in sets of 4; the best split keeps the NV4 pair 0-1
        // with the padding. The source would answer that set (two GPUs and two empty slots).
        let link = |i: usize, j: usize| match (i.min(j), i.max(j)) {
            _ if i == j => Link::SelfLink,
            (0, 1) => Link::NvLink(4),
            (0 | 1, _) => Link::Sys,
            (2, 3) | (4, 5) => Link::Pix,
            _ => Link::Node,
        };
        let links: Vec<Vec<Link>> = (0..6).map(|i| (0..6).map(|j| link(i, j)).collect()).collect();
        assert_eq!(best_effort(&links, &[0, 1, 2, 3, 4, 5], &[], 4), vec![2, 3, 4, 5]);
    }

    #[test]
    fn matches_muster_cores_restatement_on_every_subset_of_the_fixtures() {
        // muster-core's nvidia_policy restates the same policy on GPU sets (no must-include,
        // GPUs in index order): an independent implementation to agree with.
        for t in fixtures::all() {
            let links = links_of(&t);
            for bits in 0u64..(1 << t.len()) {
                let free = GpuSet::from_bits(bits);
                let available: Vec<usize> = free.iter().collect();
                for size in 1..=t.len() {
                    let want: Vec<usize> =
                        nvidia_policy::best_effort(&t, free, size).map(|s| s.iter().collect()).unwrap_or_default();
                    assert_eq!(best_effort(&links, &available, &[], size), want, "{available:?} size {size}");
                }
            }
        }
    }

    #[test]
    fn must_include_on_dgx1() {
        let links = links_of(&fixtures::dgx1());
        let all: Vec<usize> = (0..8).collect();
        // GPU 0's NV2 partner is 3; with 3 taken, its NV2 partner across sockets is 4.
        assert_eq!(best_effort(&links, &all, &[0], 2), vec![0, 3]);
        assert_eq!(best_effort(&links, &[0, 1, 2, 4, 5, 6, 7], &[0], 2), vec![0, 4]);
        // Must include 0 and 5 (SYS between them), 4 GPUs: the best split is {0,1,2,5} +
        // {3,4,6,7} (620 + 620: each holds two NV2 pairs, two NV1 and two SYS links).
        assert_eq!(best_effort(&links, &all, &[0, 5], 4), vec![0, 1, 2, 5]);
        assert_eq!(set_score(&links, [0, 1, 2, 5]), 620);
        assert_eq!(set_score(&links, [3, 4, 6, 7]), 620);
    }

    #[test]
    fn answers_are_size_gpus_of_available_holding_required() {
        let links = pairs();
        for bits in 0u32..256 {
            let available: Vec<usize> = (0..8).filter(|g| bits & (1 << g) != 0).collect();
            for size in 1..=available.len() {
                for required in [vec![], vec![available[0]], vec![available[available.len() - 1]]] {
                    let got = best_effort(&links, &available, &required, size);
                    assert_eq!(got.len(), size, "{available:?} {required:?} {size}");
                    assert!(got.iter().all(|g| available.contains(g)));
                    assert!(required.iter().all(|r| got.contains(r)));
                }
            }
        }
    }

    #[test]
    fn large_pools_are_answered_greedily() {
        // 16 GPUs in NV2 pairs: two million splits into pairs, past the budget.
        let links: Vec<Vec<Link>> = (0..16)
            .map(|i| {
                (0..16)
                    .map(|j| match () {
                        _ if i == j => Link::SelfLink,
                        _ if i / 2 == j / 2 => Link::NvLink(2),
                        _ => Link::Sys,
                    })
                    .collect()
            })
            .collect();
        let all: Vec<usize> = (0..16).collect();
        assert_eq!(best_effort(&links, &all, &[], 2), vec![0, 1]);
        assert_eq!(best_effort(&links, &all, &[9], 2), vec![8, 9]);
        assert_eq!(best_effort(&links, &all, &[], 4).len(), 4);
    }

    #[test]
    fn combinations_run_in_lexicographic_order() {
        let mut picks = vec![0, 1];
        let mut seen = vec![picks.clone()];
        while next_combination(&mut picks, 4) {
            seen.push(picks.clone());
        }
        assert_eq!(seen, [[0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3]]);
        assert!(!next_combination(&mut [], 3));
    }
}

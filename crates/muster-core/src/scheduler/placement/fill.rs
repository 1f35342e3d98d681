//! Capacity arithmetic for interchangeable pods: the best nodes filled with as many pods as
//! each fits (BinPack), or dealt one per node in turn (Spread), instead of one search per pod.

use super::{Candidate, Engine, Scoring, Tentative, by_score};
use crate::devices::GpuSet;
use crate::scheduler::shape::PodShape;
use crate::scheduler::tree::LeafGroup;

impl<'a> Engine<'a> {
    /// Places one pod on a node that has room for it; false when the GPU chooser refuses.
    pub(super) fn place_one(&mut self, leaf: &'a LeafGroup, shape: &'a PodShape, pod: usize, node: u32) -> bool {
        let mut gpus = GpuSet::EMPTY;
        if let Some((count, offered)) = self.gpu_need(shape, node) {
            match self.choose_gpus(node, count, offered) {
                Some(choice) => gpus = choice.gpus,
                None => return false,
            }
        }
        self.apply(Tentative { leaf, pod, node, shape, gpus });
        true
    }

    /// Capacity arithmetic: fills the best nodes with as many of `pods` as each fits
    /// (BinPack), or deals them one per node in turn (Spread). Returns how many were placed.
    pub(super) fn fill(
        &mut self,
        leaf: &'a LeafGroup,
        shape: &'a PodShape,
        pods: &[usize],
        mut candidates: Vec<Candidate>,
    ) -> u32 {
        let want = pods.len();
        // Every candidate takes at least one pod, so the best `want` nodes are enough unless
        // the GPU chooser refuses some; only then is the rest sorted.
        let top = want.min(candidates.len());
        if top == 0 {
            return 0;
        }
        if top < candidates.len() {
            candidates.select_nth_unstable_by(top - 1, by_score);
        }
        candidates[..top].sort_unstable_by(by_score);
        let mut placed = 0;
        match self.options.scoring {
            Scoring::BinPack => {
                for i in 0..candidates.len() {
                    if placed == want {
                        break;
                    }
                    if i == top {
                        candidates[top..].sort_unstable_by(by_score);
                    }
                    let c = candidates[i];
                    for _ in 0..c.fit {
                        if placed == want || !self.place_one(leaf, shape, pods[placed], c.node) {
                            break;
                        }
                        placed += 1;
                    }
                }
            }
            Scoring::Spread => {
                candidates[top..].sort_unstable_by(by_score);
                let mut left: Vec<u32> = candidates.iter().map(|c| c.fit).collect();
                let mut progress = true;
                while placed < want && progress {
                    progress = false;
                    for (c, left) in candidates.iter().zip(left.iter_mut()) {
                        if placed == want {
                            break;
                        }
                        if *left == 0 {
                            continue;
                        }
                        if self.place_one(leaf, shape, pods[placed], c.node) {
                            *left -= 1;
                            placed += 1;
                            progress = true;
                        } else {
                            *left = 0;
                        }
                    }
                }
            }
        }
        u32::try_from(placed).unwrap_or(u32::MAX)
    }
}

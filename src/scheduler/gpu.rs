//! Which GPU indices a pod gets on a node: the [`GpuChooser`] seam placement calls, and the
//! default [`LowestFreeIndices`]. Topology-aware choice lives in `devices` and plugs in here.

use super::snapshot::NodeInfo;

/// GPU indices for one pod on one node, and how good a fit they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuChoice {
    /// Bit `i` set: GPU index `i` goes to the pod.
    pub mask: u64,
    /// Locality of the choice, 0 (no opinion) to 100 (best); added to the node's score.
    pub score: u8,
}

/// Chooses `count` free GPU indices on a node, or refuses.
pub trait GpuChooser {
    /// `used` has the indices already taken, including by earlier pods of this decision.
    /// The answer must hold exactly `count` indices below `node.gpu_count`, none in `used`;
    /// placement ignores any other answer.
    fn choose(&self, node: &NodeInfo, count: u32, used: u64) -> Option<GpuChoice>;
}

/// The lowest free indices, with no locality opinion (score 0).
#[derive(Clone, Copy, Debug, Default)]
pub struct LowestFreeIndices;

impl GpuChooser for LowestFreeIndices {
    fn choose(&self, node: &NodeInfo, count: u32, used: u64) -> Option<GpuChoice> {
        let mut free = node.gpu_mask() & !used;
        if free.count_ones() < count {
            return None;
        }
        let mut mask = 0;
        for _ in 0..count {
            let lowest = free & free.wrapping_neg();
            mask |= lowest;
            free &= !lowest;
        }
        Some(GpuChoice { mask, score: 0 })
    }
}

/// The indices in a mask, ascending.
pub fn gpu_indices(mask: u64) -> Vec<u32> {
    (0..64).filter(|i| mask & (1u64 << i) != 0).collect()
}

/// A mask as the `gpu.muster.dev/indices` annotation writes it: `"0,1,4,5"`.
pub fn format_gpu_indices(mask: u64) -> String {
    gpu_indices(mask).iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crds::GPU_RESOURCE;
    use crate::scheduler::resources::Resources;

    #[test]
    fn lowest_free_indices_skip_used_ones() {
        let node = NodeInfo::new("n", Resources::new().with(GPU_RESOURCE, 8));
        let choice = LowestFreeIndices.choose(&node, 3, 0b0000_1011).unwrap();
        assert_eq!(format_gpu_indices(choice.mask), "2,4,5");
        assert_eq!(choice.score, 0);
        assert_eq!(LowestFreeIndices.choose(&node, 6, 0b0000_1011), None, "only 5 free");
        assert_eq!(LowestFreeIndices.choose(&node, 0, 0).map(|c| c.mask), Some(0));
    }

    #[test]
    fn indices_beyond_the_node_count_are_never_offered() {
        let node = NodeInfo::new("n", Resources::new().with(GPU_RESOURCE, 2));
        assert_eq!(LowestFreeIndices.choose(&node, 3, 0), None);
        let all = NodeInfo::new("n", Resources::new().with(GPU_RESOURCE, 64));
        assert_eq!(LowestFreeIndices.choose(&all, 64, 0).map(|c| c.mask), Some(u64::MAX));
        assert_eq!(gpu_indices(1 << 63 | 1), vec![0, 63]);
    }
}

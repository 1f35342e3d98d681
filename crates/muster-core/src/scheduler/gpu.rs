//! Which GPU indices a pod gets on a node: the [`GpuChooser`] seam placement calls, and the
//! default [`LowestFreeIndices`]. Topology-aware choice lives in `devices` and plugs in here.

use super::snapshot::NodeInfo;
use crate::devices::GpuSet;

/// GPU indices for one pod on one node, and how good a fit they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuChoice {
    /// The GPU indices that go to the pod.
    pub gpus: GpuSet,
    /// Locality of the choice, 0 (no opinion) to 100 (best); added to the node's score.
    pub score: u8,
}

/// Chooses `count` free GPU indices on a node, or refuses.
pub trait GpuChooser {
    /// `used` has the indices already taken, including by earlier pods of this decision.
    /// The answer must hold exactly `count` indices below `node.gpu_count`, none in `used`;
    /// placement ignores any other answer.
    fn choose(&self, node: &NodeInfo, count: u32, used: GpuSet) -> Option<GpuChoice>;
}

/// The lowest free indices, with no locality opinion (score 0).
#[derive(Clone, Copy, Debug, Default)]
pub struct LowestFreeIndices;

impl GpuChooser for LowestFreeIndices {
    fn choose(&self, node: &NodeInfo, count: u32, used: GpuSet) -> Option<GpuChoice> {
        let gpus = node.gpus().difference(used).lowest_n(count as usize)?;
        Some(GpuChoice { gpus, score: 0 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::resources::Resources;
    use muster_api::GPU_RESOURCE;

    #[test]
    fn lowest_free_indices_skip_used_ones() {
        let node = NodeInfo::new("n", Resources::new().with(GPU_RESOURCE, 8));
        let used = GpuSet::from_bits(0b0000_1011);
        let choice = LowestFreeIndices.choose(&node, 3, used).unwrap();
        assert_eq!(choice.gpus.to_string(), "2,4,5");
        assert_eq!(choice.score, 0);
        assert_eq!(LowestFreeIndices.choose(&node, 6, used), None, "only 5 free");
        assert_eq!(LowestFreeIndices.choose(&node, 0, GpuSet::EMPTY).map(|c| c.gpus), Some(GpuSet::EMPTY));
    }

    #[test]
    fn indices_beyond_the_node_count_are_never_offered() {
        let node = NodeInfo::new("n", Resources::new().with(GPU_RESOURCE, 2));
        assert_eq!(LowestFreeIndices.choose(&node, 3, GpuSet::EMPTY), None);
        let all = NodeInfo::new("n", Resources::new().with(GPU_RESOURCE, 64));
        assert_eq!(LowestFreeIndices.choose(&all, 64, GpuSet::EMPTY).map(|c| c.gpus), Some(GpuSet::first(64)));
    }
}

//! GPU indices: what a shape asks of a node's GPUs (`nvidia.com/gpu` or its own DRA claim),
//! and the [`GpuChooser`]'s answer, checked before placement uses it.
//!
//! [`GpuChooser`]: crate::scheduler::GpuChooser

use super::Engine;
use crate::devices::GpuSet;
use crate::scheduler::gpu::GpuChoice;
use crate::scheduler::shape::PodShape;

impl<'a> Engine<'a> {
    /// What a shape asks of GPUs on node `i`: how many, and which indices may be given (all
    /// the node's for `nvidia.com/gpu`, those its own DRA claim allows otherwise); `None`
    /// when it asks for none.
    pub(super) fn gpu_need(&self, shape: &PodShape, i: u32) -> Option<(u32, GpuSet)> {
        if shape.gpus > 0 {
            return Some((shape.gpus, self.node(i).gpus()));
        }
        let facts = self.facts.of(shape)?;
        let count = facts.resource_claims.as_ref().ok().map_or(0, |c| c.gpus());
        (count > 0).then(|| (count, self.facts.offered(facts, i)))
    }

    /// The chooser's answer, if it is one placement may use: `count` free indices out of
    /// `offered`.
    pub(super) fn choose_gpus(&self, node: u32, count: u32, offered: GpuSet) -> Option<GpuChoice> {
        let n = self.node(node);
        let used = self.gpu_used(node).union(n.gpus().difference(offered));
        let choice = self.gpus.choose(n, count, used)?;
        let valid =
            choice.gpus.len() == count as usize && choice.gpus.is_disjoint(used) && choice.gpus.is_subset(n.gpus());
        valid.then_some(GpuChoice { gpus: choice.gpus, score: choice.score.min(100) })
    }
}

//! Room by resources: how many more pods of some requests fit on a node, which resources
//! keep even one off it, and the resource score of a node after one more pod.

use super::{Engine, ReasonKey, Scoring, Tally};
use crate::scheduler::resources::{CPU, EPHEMERAL_STORAGE, MEMORY, Resources};
use muster_api::GPU_RESOURCE;

/// Reads one inline amount of a [`Resources`].
type Amount = fn(&Resources) -> i64;

/// Pods per node of `request` given `allocatable` and `used`; `u64::MAX` when not requested.
fn per_node(allocatable: i64, used: i64, request: i64) -> u64 {
    if request <= 0 {
        return u64::MAX;
    }
    let free = allocatable.saturating_sub(used);
    if free < request { 0 } else { u64::try_from(free / request).unwrap_or(0) }
}

impl<'a> Engine<'a> {
    /// How many more pods with these requests fit on the node, by resources alone.
    pub(super) fn resource_fit(&self, node: u32, req: &Resources) -> u64 {
        let n = self.node(node);
        let d = self.delta(node).map(|d| &d.requested);
        let used = |f: Amount| f(&n.requested).saturating_add(d.map_or(0, f));
        let a = &n.allocatable;
        let mut fit = per_node(a.cpu_milli, used(|r| r.cpu_milli), req.cpu_milli)
            .min(per_node(a.memory, used(|r| r.memory), req.memory))
            .min(per_node(a.ephemeral_storage, used(|r| r.ephemeral_storage), req.ephemeral_storage))
            .min(per_node(a.pods, used(|r| r.pods), req.pods.max(1)))
            .min(per_node(a.gpus, used(|r| r.gpus), req.gpus));
        for (name, amount) in req.extended() {
            if fit == 0 {
                break;
            }
            let used = n.requested.extended_amount(name).saturating_add(d.map_or(0, |d| d.extended_amount(name)));
            fit = fit.min(per_node(a.extended_amount(name), used, amount));
        }
        fit
    }

    /// Counts each resource that keeps even one pod off the node.
    pub(super) fn tally_insufficient(&self, node: u32, req: &'a Resources, tally: &mut Tally<'a>) {
        let n = self.node(node);
        let d = self.delta(node).map(|d| &d.requested);
        let short = |f: Amount, request: i64| {
            per_node(f(&n.allocatable), f(&n.requested).saturating_add(d.map_or(0, f)), request) == 0
        };
        let inline: [(Amount, i64, ReasonKey<'a>); 5] = [
            (|r| r.cpu_milli, req.cpu_milli, ReasonKey::Insufficient(CPU)),
            (|r| r.memory, req.memory, ReasonKey::Insufficient(MEMORY)),
            (|r| r.ephemeral_storage, req.ephemeral_storage, ReasonKey::Insufficient(EPHEMERAL_STORAGE)),
            (|r| r.pods, req.pods.max(1), ReasonKey::TooManyPods),
            (|r| r.gpus, req.gpus, ReasonKey::Insufficient(GPU_RESOURCE)),
        ];
        for (f, request, reason) in inline {
            if short(f, request) {
                tally.add(reason);
            }
        }
        for (name, amount) in req.extended() {
            let used = n.requested.extended_amount(name).saturating_add(d.map_or(0, |d| d.extended_amount(name)));
            if per_node(n.allocatable.extended_amount(name), used, amount) == 0 {
                tally.add(ReasonKey::Insufficient(name));
            }
        }
    }

    /// Resource score after one more pod: mean utilisation of cpu, memory and each extended
    /// resource the pod requests, GPUs of its DRA claim (`claim_gpus`) counted like
    /// `nvidia.com/gpu` (BinPack), or its complement (Spread).
    pub(super) fn resource_score(&self, node: u32, req: &Resources, claim_gpus: u32) -> u32 {
        let n = self.node(node);
        let d = self.delta(node).map(|d| &d.requested);
        let (mut sum, mut count) = (0u64, 0u64);
        let mut add = |allocatable: i64, used: i64, request: i64| {
            if allocatable > 0 {
                let after = used.saturating_add(request).clamp(0, allocatable);
                // Percent of allocatable; the fallback only matters beyond 2^63 / 100 units.
                let percent = match after.checked_mul(100) {
                    Some(scaled) => scaled / allocatable,
                    None => after / (allocatable / 100),
                };
                sum += percent.unsigned_abs();
                count += 1;
            }
        };
        let used = |f: Amount| f(&n.requested).saturating_add(d.map_or(0, f));
        add(n.allocatable.cpu_milli, used(|r| r.cpu_milli), req.cpu_milli);
        add(n.allocatable.memory, used(|r| r.memory), req.memory);
        if req.gpus > 0 {
            add(n.allocatable.gpus, used(|r| r.gpus), req.gpus);
        }
        if claim_gpus > 0 {
            let all = n.gpus();
            let taken = self.gpu_used(node).intersection(all).len();
            add(all.len() as i64, taken as i64, i64::from(claim_gpus));
        }
        for (name, amount) in req.extended() {
            let used = n.requested.extended_amount(name).saturating_add(d.map_or(0, |d| d.extended_amount(name)));
            add(n.allocatable.extended_amount(name), used, amount);
        }
        let utilisation = sum.checked_div(count).map_or(0, |mean| u32::try_from(mean).unwrap_or(100));
        match self.options.scoring {
            Scoring::BinPack => utilisation,
            Scoring::Spread => 100 - utilisation.min(100),
        }
    }
}

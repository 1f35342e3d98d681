//! Why nodes were filtered out: reasons counted per node while scanning ([`Tally`]), and
//! their owned form ([`FilterReason`]) for the explanation.

use crate::scheduler::explain::{FilterReason, ReasonCount};
use crate::scheduler::snapshot::Unusable;

/// A filter reason while counting, borrowing names to stay allocation-free per node.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum ReasonKey<'a> {
    Unusable(Unusable),
    Unschedulable,
    NodeAffinity,
    Taint(&'a str, &'a str),
    Insufficient(&'a str),
    TooManyPods,
    GpuIndices,
    RefusedEarlier,
    Reserved,
    HostPorts,
    Volume(&'a str),
    Claim(&'a str),
    ClaimReach,
    ClaimDevices,
    VolumeNodeAffinity,
    VolumeZone,
    SpreadLabel,
    Spread,
    SpreadPinned,
    PodAffinity,
    PodAntiAffinity,
    ExistingAntiAffinity,
}

impl ReasonKey<'_> {
    fn owned(self) -> FilterReason {
        match self {
            ReasonKey::Unusable(u) => FilterReason::Unusable(u),
            ReasonKey::Unschedulable => FilterReason::Unschedulable,
            ReasonKey::NodeAffinity => FilterReason::NodeAffinity,
            ReasonKey::Taint(key, value) => FilterReason::UntoleratedTaint { key: key.into(), value: value.into() },
            ReasonKey::Insufficient(resource) => FilterReason::Insufficient(resource.into()),
            ReasonKey::TooManyPods => FilterReason::TooManyPods,
            ReasonKey::GpuIndices => FilterReason::GpuIndices,
            ReasonKey::RefusedEarlier => FilterReason::RefusedEarlier,
            ReasonKey::Reserved => FilterReason::Reserved,
            ReasonKey::HostPorts => FilterReason::HostPorts,
            ReasonKey::Volume(why) => FilterReason::Volume(why.into()),
            ReasonKey::Claim(why) => FilterReason::Claim(why.into()),
            ReasonKey::ClaimReach => FilterReason::ClaimReach,
            ReasonKey::ClaimDevices => FilterReason::ClaimDevices,
            ReasonKey::VolumeNodeAffinity => FilterReason::VolumeNodeAffinity,
            ReasonKey::VolumeZone => FilterReason::VolumeZone,
            ReasonKey::SpreadLabel => FilterReason::SpreadLabel,
            ReasonKey::Spread => FilterReason::Spread,
            ReasonKey::SpreadPinned => FilterReason::SpreadPinned,
            ReasonKey::PodAffinity => FilterReason::PodAffinity,
            ReasonKey::PodAntiAffinity => FilterReason::PodAntiAffinity,
            ReasonKey::ExistingAntiAffinity => FilterReason::ExistingAntiAffinity,
        }
    }
}

#[derive(Default)]
pub(super) struct Tally<'a>(Vec<(ReasonKey<'a>, u32)>);

impl<'a> Tally<'a> {
    pub(super) fn add(&mut self, key: ReasonKey<'a>) {
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some((_, n)) => *n += 1,
            None => self.0.push((key, 1)),
        }
    }

    pub(super) fn counts(&self) -> Vec<ReasonCount> {
        let mut out: Vec<ReasonCount> =
            self.0.iter().map(|(k, n)| ReasonCount { reason: k.owned(), nodes: *n }).collect();
        out.sort_by(|a, b| b.nodes.cmp(&a.nodes).then_with(|| a.reason.cmp(&b.reason)));
        out
    }
}

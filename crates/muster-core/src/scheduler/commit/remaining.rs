//! The re-check of a plan cut short: whether what is left of it still fits the cluster as
//! rebuilt ([`remaining_fits`]).

use std::collections::BTreeMap;

use crate::devices::GpuSet;
use crate::scheduler::resources::Resources;
use crate::scheduler::snapshot::Snapshot;

/// Whether what is left of a plan cut short still fits the cluster as rebuilt: see
/// [`remaining_fits`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RemainingFits {
    /// It fits.
    Yes,
    /// It does not, and why.
    No(String),
}

/// A still-gated pod of a plan cut short, as [`remaining_fits`] checks it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatedPin {
    /// Pod name.
    pub name: String,
    /// The planned node.
    pub node: String,
    /// The pod's requests (as kube-scheduler's NodeResourcesFit counts them).
    pub requests: Resources,
    /// The GPU indices planned for it.
    pub gpus: GpuSet,
    /// Of those, the ones its own DRA claims hold already (allocated by this plan before the
    /// commit was cut short): the snapshot counts them used, but not against the pin itself.
    pub own_gpus: GpuSet,
}

/// Pods of one planned PodGroup that can count toward its minCount when a plan cut short is
/// resumed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupCount {
    /// Existing pods of the group: the plan's live ones and those started before it.
    pub existing: u32,
    /// The group's minCount (1 for a basic group).
    pub min_count: u32,
}

/// Re-checks what is left of a plan cut short (muster stopped between two patches) against
/// the cluster as rebuilt: each PodGroup of the plan still has `minCount` pods (pods deleted
/// meanwhile), and each still-gated pod still fits its planned node, in plan order, with the
/// requests and GPU indices of the pods already counted on it (bound or admitted while muster
/// was down, and the plan's pods checked before it). `snapshot` counts every pod bound or
/// admitted, and the GPU indices of the ledger; the gated pods of the plan are not in it.
pub fn remaining_fits(snapshot: &Snapshot, pins: &[GatedPin], groups: &BTreeMap<String, GroupCount>) -> RemainingFits {
    if let Some((group, c)) = groups.iter().find(|(_, c)| c.existing < c.min_count.max(1)) {
        return RemainingFits::No(format!(
            "group \"{group}\" has {} pod(s) left, fewer than its minCount {}",
            c.existing, c.min_count
        ));
    }
    let mut taken: BTreeMap<&str, (Resources, GpuSet)> = BTreeMap::new();
    for pin in pins {
        // A node that is gone is the state machine's own case (NodeGone).
        let Some(node) = snapshot.node(&pin.node) else { continue };
        if let Some(why) = &node.unusable {
            return RemainingFits::No(format!("node {} is unusable ({why:?})", node.name));
        }
        let (requested, gpus) =
            taken.entry(pin.node.as_str()).or_insert_with(|| (node.requested.clone(), node.gpu_used));
        for (resource, amount) in pin.requests.iter().filter(|(_, a)| *a > 0) {
            let free = node.allocatable.get(resource) - requested.get(resource);
            if amount > free {
                return RemainingFits::No(format!(
                    "pod {} needs {amount} {resource} on node {}, {free} left",
                    pin.name, node.name
                ));
            }
        }
        let held = pin.gpus.intersection(gpus.difference(pin.own_gpus));
        let missing = pin.gpus.difference(node.gpus());
        if !held.is_empty() || !missing.is_empty() {
            let what = if held.is_empty() { "no longer on the node" } else { "now held by another pod or unhealthy" };
            return RemainingFits::No(format!(
                "GPU indices {} planned for pod {} on node {} are {what}",
                held.union(missing),
                pin.name,
                node.name
            ));
        }
        requested.add(&pin.requests);
        *gpus = gpus.union(pin.gpus);
    }
    RemainingFits::Yes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_left_of_a_plan_is_checked_against_the_rebuilt_cluster() {
        use crate::scheduler::snapshot::NodeInfo;
        let node = |name: &str, used: u64| {
            NodeInfo::new(name, Resources::new().with("cpu", 8000).with("nvidia.com/gpu", 8))
                .with_requested(Resources::new().with("cpu", 2000))
                .with_gpu_used(GpuSet::from_bits(used))
        };
        let snapshot = Snapshot::new(vec![node("n1", 0b0000_0011), node("n2", 0)]);
        let pin = |name: &str, node: &str, cpu: i64, gpus: u64| GatedPin {
            name: name.into(),
            node: node.into(),
            requests: Resources::new().with("cpu", cpu).with("nvidia.com/gpu", i64::from(gpus.count_ones())),
            gpus: GpuSet::from_bits(gpus),
            own_gpus: GpuSet::EMPTY,
        };
        let own = |mut pin: GatedPin, bits: u64| {
            pin.own_gpus = GpuSet::from_bits(bits);
            pin
        };
        let quorate = BTreeMap::from([("g".to_string(), GroupCount { existing: 2, min_count: 2 })]);
        type Case<'a> = (&'a str, Vec<GatedPin>, BTreeMap<String, GroupCount>, Option<&'a str>);
        let cases: Vec<Case<'_>> = vec![
            (
                "free GPUs and cpu: fits",
                vec![pin("a", "n1", 1000, 0b1100), pin("b", "n2", 6000, 0b1)],
                quorate.clone(),
                None,
            ),
            (
                "an index taken while muster was down",
                vec![pin("a", "n1", 1000, 0b0110)],
                quorate.clone(),
                Some("GPU indices 1 planned for pod a on node n1 are now held by another pod or unhealthy"),
            ),
            (
                "cpu taken meanwhile",
                vec![pin("a", "n1", 7000, 0)],
                quorate.clone(),
                Some("pod a needs 7000 cpu on node n1, 6000 left"),
            ),
            (
                "two planned pods count against each other",
                vec![pin("a", "n2", 5000, 0), pin("b", "n2", 5000, 0)],
                quorate.clone(),
                Some("pod b needs 5000 cpu on node n2, 1000 left"),
            ),
            (
                "an index past the node's GPUs",
                vec![pin("a", "n2", 0, 1 << 9)],
                quorate.clone(),
                Some("GPU indices 9 planned for pod a on node n2 are no longer on the node"),
            ),
            (
                "planned pods deleted below minCount",
                vec![pin("a", "n2", 0, 0)],
                BTreeMap::from([("g".to_string(), GroupCount { existing: 1, min_count: 2 })]),
                Some("group \"g\" has 1 pod(s) left, fewer than its minCount 2"),
            ),
            (
                "GPUs its own DRA claim holds do not count against the pin",
                vec![own(pin("a", "n1", 1000, 0b0011), 0b0011)],
                quorate.clone(),
                None,
            ),
            (
                "GPUs held by its own claim and another pod's",
                vec![own(pin("a", "n1", 1000, 0b0011), 0b0001)],
                quorate.clone(),
                Some("GPU indices 1 planned for pod a on node n1 are now held by another pod or unhealthy"),
            ),
            ("a node that is gone is not this check's", vec![pin("a", "n9", 1, 1)], quorate, None),
        ];
        for (name, pins, groups, want) in cases {
            let got = remaining_fits(&snapshot, &pins, &groups);
            let want = want.map_or(RemainingFits::Yes, |w| RemainingFits::No(w.to_string()));
            assert_eq!(got, want, "{name}");
        }
    }
}

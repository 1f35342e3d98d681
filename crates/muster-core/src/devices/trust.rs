//! PURE: whether the ledger may take a pod's `gpu.muster.dev/indices` as it stands.
//!
//! Any tenant may write any annotation on its own pods. So a value the node did not confirm
//! (kubelet's assignment read back by the node agent, an allocated DRA claim) is only believed
//! where something other than the pod's author vouches for it:
//! - muster placed the pod there with exactly those GPUs (its admission plan, recorded in the
//!   status of the pod's group, which only muster writes), or
//! - the pod is bound and asks for exactly that many `nvidia.com/gpu`: kubelet gives it that
//!   many devices whatever the annotation says, so holding that many is no squatting, and the
//!   node agent corrects which ones.
//!
//! Anything else holds nothing and is reported once: indices on a pod that asks for no GPU,
//! on a pod not bound that muster did not place, or naming another count than the pod asks.

use std::collections::HashMap;

use super::{GpuSet, parse_indices};
use muster_api::scheduling::PlannedPod;

/// Where muster's admission plan put a pod (the plan recorded in its group's status).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placed {
    /// The node's name.
    pub node: String,
    /// The GPU indices the plan gave it, if any.
    pub gpus: Option<GpuSet>,
}

/// Where the pods of admission plans go, by pod UID: a plan's pod without a UID (from before
/// plans named them) vouches for nothing, nor do indices that cannot be read; of two plans
/// naming one pod, the later wins.
pub fn placed_by_plans<'p>(plans: impl IntoIterator<Item = &'p PlannedPod>) -> HashMap<String, Placed> {
    plans
        .into_iter()
        .filter(|p| !p.uid.is_empty())
        .map(|p| {
            let gpus = p.gpu_indices.as_deref().and_then(|v| parse_indices(v).ok());
            (p.uid.clone(), Placed { node: p.node.clone(), gpus })
        })
        .collect()
}

/// Why a pod's indices hold nothing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Untrusted {
    /// The pod asks for no GPU and muster placed it with none.
    #[error("the pod asks for no nvidia.com/gpu and muster placed it with no GPUs")]
    AsksNoGpu,
    /// The pod is not bound and muster did not place it there with those GPUs.
    #[error("the pod is not bound and muster's admission did not place it on node {node} with GPUs {named}")]
    NotPlaced {
        /// The node the pod is pinned to.
        node: String,
        /// What the annotation names.
        named: GpuSet,
    },
    /// The pod is bound, but the annotation names another number of GPUs than it asks for.
    #[error("the annotation names {named} GPUs, but the pod asks for {wanted} nvidia.com/gpu")]
    CountMismatch {
        /// GPUs the pod asks for.
        wanted: u64,
        /// GPUs the annotation names.
        named: usize,
    },
}

/// Whether the indices `named` of a pod on `node` (bound there, or pinned), which asks for
/// `wanted` GPUs, may be held for it; `placed` is where muster's plan put it.
pub fn vouch(named: GpuSet, wanted: u64, bound: bool, node: &str, placed: Option<&Placed>) -> Result<(), Untrusted> {
    if placed.is_some_and(|p| p.node == node && p.gpus == Some(named)) {
        return Ok(());
    }
    if wanted == 0 {
        return Err(Untrusted::AsksNoGpu);
    }
    if !bound {
        return Err(Untrusted::NotPlaced { node: node.to_string(), named });
    }
    if u64::try_from(named.len()).ok() != Some(wanted) {
        return Err(Untrusted::CountMismatch { wanted, named: named.len() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn set(indices: &[usize]) -> GpuSet {
        GpuSet::from_indices(indices.iter().copied()).unwrap_or_default()
    }

    fn placed(node: &str, gpus: &[usize]) -> Placed {
        Placed { node: node.into(), gpus: Some(set(gpus)) }
    }

    #[test]
    fn only_a_plan_or_a_bound_pod_of_that_many_gpus_vouches() {
        let four = set(&[0, 1, 2, 3]);
        /// (what, named, wanted, bound, placed, verdict)
        type Case = (&'static str, GpuSet, u64, bool, Option<Placed>, Result<(), Untrusted>);
        let cases: [Case; 10] = [
            ("squatter: no GPU asked, pinned, not placed", four, 0, false, None, Err(Untrusted::AsksNoGpu)),
            ("no GPU asked, bound", four, 0, true, None, Err(Untrusted::AsksNoGpu)),
            (
                "asks 1, never bound, not placed",
                four,
                1,
                false,
                None,
                Err(Untrusted::NotPlaced { node: "n".into(), named: four }),
            ),
            ("muster's plan, not bound yet", set(&[2, 3]), 2, false, Some(placed("n", &[2, 3])), Ok(())),
            (
                "a plan on another node",
                set(&[2, 3]),
                2,
                false,
                Some(placed("m", &[2, 3])),
                Err(Untrusted::NotPlaced { node: "n".into(), named: set(&[2, 3]) }),
            ),
            (
                "a plan with other GPUs",
                four,
                2,
                false,
                Some(placed("n", &[2, 3])),
                Err(Untrusted::NotPlaced { node: "n".into(), named: four }),
            ),
            ("a DRA pod muster placed (no nvidia.com/gpu)", set(&[5]), 0, false, Some(placed("n", &[5])), Ok(())),
            ("bound, asks as many as named", set(&[1, 6]), 2, true, None, Ok(())),
            (
                "bound, names more than it asks",
                four,
                1,
                true,
                None,
                Err(Untrusted::CountMismatch { wanted: 1, named: 4 }),
            ),
            ("bound, placed with other GPUs, kubelet's count", set(&[0]), 1, true, Some(placed("n", &[4])), Ok(())),
        ];
        for (what, named, wanted, bound, placed, want) in cases {
            assert_eq!(vouch(named, wanted, bound, "n", placed.as_ref()), want, "{what}");
        }
    }

    #[test]
    fn plans_place_pods_by_uid() {
        let planned = |name: &str, uid: &str, node: &str, gpus: Option<&str>| PlannedPod {
            name: name.into(),
            uid: uid.into(),
            node: node.into(),
            gpu_indices: gpus.map(String::from),
            ..Default::default()
        };
        let plans = [
            planned("a", "ua", "n1", Some("0,1")),
            planned("old", "", "n1", Some("2")),
            planned("b", "ub", "n2", Some("x")),
            planned("c", "uc", "n1", None),
            planned("a", "ua", "n3", Some("3")),
        ];
        let placed = placed_by_plans(&plans);
        assert_eq!(placed.len(), 3, "{placed:?}");
        assert_eq!(placed["ua"], Placed { node: "n3".into(), gpus: Some(set(&[3])) }, "the later plan wins");
        assert_eq!(placed["ub"], Placed { node: "n2".into(), gpus: None }, "unreadable indices vouch for none");
        assert_eq!(placed["uc"], Placed { node: "n1".into(), gpus: None });
    }

    proptest! {
        /// Whatever a pod's author writes, a pod muster did not place never holds more GPUs
        /// than it asks for, and holds none unless it is bound.
        #[test]
        fn an_unplaced_pod_holds_at_most_what_it_asks_and_only_once_bound(
            bits in any::<u64>(), wanted in 0u64..80, bound in any::<bool>(),
        ) {
            let named = GpuSet::from_bits(bits);
            if vouch(named, wanted, bound, "n", None).is_ok() {
                prop_assert!(bound);
                prop_assert_eq!(named.len() as u64, wanted);
                prop_assert!(wanted > 0);
            }
        }
    }
}

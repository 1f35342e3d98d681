//! Where each pod of a recorded plan stands now ([`PinState`], [`PlannedPodNow`]), and how
//! many of them must start for the gang to count as started ([`StartRequirement`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use muster_api::scheduling::{AdmissionPlan, PodGroup};

use crate::pods::{Placement, PodClass};

/// Where one planned pod stands now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PinState {
    /// No pod with the planned UID exists.
    Gone,
    /// Being deleted.
    Terminating,
    /// Still held by the admission gate (not patched yet).
    Gated,
    /// Ungated (pinned) but not bound; `refusal` is kube-scheduler's word on it, if any.
    Unbound {
        /// The pod's `PodScheduled=False` condition.
        refusal: Option<Refusal>,
    },
    /// Bound to this node.
    Bound {
        /// Node name.
        node: String,
    },
    /// Succeeded or failed.
    Finished,
}

/// kube-scheduler's `PodScheduled=False` condition of a pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Refusal {
    /// The condition's reason (`Unschedulable`, `SchedulerError`).
    pub reason: String,
    /// The condition's message ("0/3 nodes are available: ...").
    pub message: String,
}

/// One pod of the plan as it is now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedPodNow {
    /// Pod name.
    pub name: String,
    /// Pod UID, as planned.
    pub uid: String,
    /// The PodGroup the pod belongs to.
    pub pod_group: String,
    /// The node it was planned on.
    pub node: String,
    /// Whether that node still exists.
    pub node_exists: bool,
    /// Where the pod stands.
    pub state: PinState,
}

impl PlannedPodNow {
    pub(super) fn exists(&self) -> bool {
        !matches!(self.state, PinState::Gone | PinState::Terminating)
    }

    /// Bound or finished: kube-scheduler placed it, so it counts as started.
    pub(super) fn started(&self) -> bool {
        matches!(self.state, PinState::Bound { .. } | PinState::Finished)
    }

    /// Existing, ungated or not, and not placed by kube-scheduler yet.
    pub(super) fn unbound(&self) -> bool {
        matches!(self.state, PinState::Gated | PinState::Unbound { .. })
    }
}

/// How many pods of an attempt must run for the gang to count as started: the `minCount` of
/// each PodGroup with pods in the plan (a PodGroup root: its own; a composite root: each
/// leaf's). A group without an entry needs 1. A plan that only adds pods to a gang already
/// running (fewer than minCount) thus rolls back just those pods when one fails.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StartRequirement {
    /// PodGroup name -> minCount (1 for a basic group).
    pub min_count: BTreeMap<String, u32>,
}

impl StartRequirement {
    /// A requirement for one PodGroup.
    pub fn leaf(name: &str, min_count: u32) -> Self {
        Self { min_count: BTreeMap::from([(name.to_string(), min_count)]) }
    }

    /// Whether some group has fewer started pods than required.
    pub(super) fn unmet(&self, pods: &[&PlannedPodNow]) -> bool {
        let mut planned: BTreeMap<&str, u32> = BTreeMap::new();
        for p in pods {
            *planned.entry(p.pod_group.as_str()).or_default() += u32::from(p.started());
        }
        planned.into_iter().any(|(group, started)| started < self.min_count.get(group).copied().unwrap_or(1).max(1))
    }
}

impl PinState {
    /// Where a planned pod stands, read from the pod.
    pub fn of(pod: &Pod) -> Self {
        let class = PodClass::of(pod);
        match class.placement {
            _ if class.terminating => PinState::Terminating,
            _ if class.finished() => PinState::Finished,
            Placement::Bound(node) => PinState::Bound { node },
            Placement::Gated => PinState::Gated,
            Placement::Admitted(_) | Placement::Unpinned => PinState::Unbound { refusal: Refusal::of(pod) },
        }
    }
}

impl Refusal {
    /// kube-scheduler's `PodScheduled=False` condition of `pod`, if it has one.
    pub fn of(pod: &Pod) -> Option<Self> {
        let conditions = pod.status.as_ref()?.conditions.as_ref()?;
        let c = conditions.iter().find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
        Some(Refusal { reason: c.reason.clone().unwrap_or_default(), message: c.message.clone().unwrap_or_default() })
    }
}

impl StartRequirement {
    /// The minCount of every PodGroup with pods in `plan` of root `root` (1 for basic groups,
    /// and for groups `pod_group` does not find: it finds a PodGroup of the root's namespace by
    /// name).
    pub fn of<'a>(plan: &AdmissionPlan, root: &str, pod_group: impl Fn(&str) -> Option<&'a PodGroup>) -> Self {
        let mut min_count = BTreeMap::new();
        for planned in &plan.pods {
            let group = if planned.pod_group.is_empty() { root } else { planned.pod_group.as_str() };
            if min_count.contains_key(group) {
                continue;
            }
            let min = pod_group(group)
                .and_then(|pg| pg.spec.scheduling_policy.min_count())
                .map_or(1, |m| u32::try_from(m).unwrap_or(1));
            min_count.insert(group.to_string(), min);
        }
        StartRequirement { min_count }
    }
}

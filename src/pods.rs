//! PURE: the one classification of a pod that every part of muster reads (admission, the
//! scheduler snapshot and group trees, the GPU ledger, the job controllers, status): where its
//! lifecycle is (`status.phase`), where admission stands with it (gated, pinned, bound), and
//! whether it is being deleted.

use k8s_openapi::api::core::v1::Pod;

use crate::crds::{ADMISSION_GATE, HOSTNAME_LABEL};

/// A pod's lifecycle, from `status.phase`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifecycle {
    /// Not yet running (gated, unbound, starting); also a pod with no phase yet.
    Pending,
    /// Running.
    Running,
    /// Every container ended successfully: it uses nothing any more.
    Succeeded,
    /// Every container ended, one failed: it uses nothing any more.
    Failed,
    /// Any other phase (`Unknown`: its node cannot be reached). It may still be running, so it
    /// keeps what it holds (GPUs) rather than risk handing them out twice.
    Unknown,
}

impl Lifecycle {
    /// The lifecycle from `status.phase`; absent is `Pending`, anything unrecognised `Unknown`.
    pub fn from_status(phase: Option<&str>) -> Self {
        match phase {
            None | Some("Pending") => Lifecycle::Pending,
            Some("Running") => Lifecycle::Running,
            Some("Succeeded") => Lifecycle::Succeeded,
            Some("Failed") => Lifecycle::Failed,
            Some(_) => Lifecycle::Unknown,
        }
    }

    /// The lifecycle of a pod.
    pub fn of(pod: &Pod) -> Self {
        Self::from_status(pod.status.as_ref().and_then(|s| s.phase.as_deref()))
    }

    /// Succeeded or failed: the pod holds nothing and never runs again.
    pub fn is_terminal(self) -> bool {
        matches!(self, Lifecycle::Succeeded | Lifecycle::Failed)
    }
}

/// Where admission stands with a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Held by muster's admission gate.
    Gated,
    /// Admitted by muster (gate removed, pinned to this `kubernetes.io/hostname`), not bound yet.
    Admitted(String),
    /// Bound to this node (`spec.nodeName`).
    Bound(String),
    /// Neither gated, pinned nor bound: kube-scheduler's to place, not muster's.
    Unpinned,
}

impl Placement {
    /// Where a pod stands: bound first, then gated, then pinned.
    pub fn of(pod: &Pod) -> Self {
        let Some(spec) = pod.spec.as_ref() else { return Placement::Unpinned };
        if let Some(node) = spec.node_name.as_ref().filter(|n| !n.is_empty()) {
            return Placement::Bound(node.clone());
        }
        if spec.scheduling_gates.iter().flatten().any(|g| g.name == ADMISSION_GATE) {
            return Placement::Gated;
        }
        match spec.node_selector.as_ref().and_then(|s| s.get(HOSTNAME_LABEL)) {
            Some(hostname) => Placement::Admitted(hostname.clone()),
            None => Placement::Unpinned,
        }
    }
}

/// A pod, classified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodClass {
    /// Its lifecycle.
    pub lifecycle: Lifecycle,
    /// Where admission stands with it.
    pub placement: Placement,
    /// It has a deletionTimestamp (in its grace period, it may still run and hold GPUs).
    pub terminating: bool,
}

impl PodClass {
    /// Classifies a pod.
    pub fn of(pod: &Pod) -> Self {
        Self {
            lifecycle: Lifecycle::of(pod),
            placement: Placement::of(pod),
            terminating: pod.metadata.deletion_timestamp.is_some(),
        }
    }

    /// Succeeded or failed.
    pub fn finished(&self) -> bool {
        self.lifecycle.is_terminal()
    }

    /// Held by muster's admission gate.
    pub fn gated(&self) -> bool {
        self.placement == Placement::Gated
    }

    /// The node it is bound to.
    pub fn bound_node(&self) -> Option<&str> {
        match &self.placement {
            Placement::Bound(node) => Some(node),
            _ => None,
        }
    }

    /// Not finished and not being deleted: it counts toward its group.
    pub fn live(&self) -> bool {
        !self.finished() && !self.terminating
    }
}

/// Held by muster's admission gate.
pub fn is_gated(pod: &Pod) -> bool {
    Placement::of(pod) == Placement::Gated
}

/// Bound to a node.
pub fn is_bound(pod: &Pod) -> bool {
    matches!(Placement::of(pod), Placement::Bound(_))
}

/// Succeeded or failed.
pub fn is_finished(pod: &Pod) -> bool {
    Lifecycle::of(pod).is_terminal()
}

/// Being deleted.
pub fn is_terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value, status: serde_json::Value, deleting: bool) -> Pod {
        let mut meta = json!({"name": "p"});
        if deleting {
            meta["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        serde_json::from_value(json!({"metadata": meta, "spec": spec, "status": status})).expect("pod")
    }

    #[test]
    fn pods_are_classified_once_for_everyone() {
        let gate = json!([{"name": ADMISSION_GATE}]);
        let c = |extra: serde_json::Value| {
            let mut spec = json!({"containers": [{"name": "c"}]});
            if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
                s.extend(e.clone());
            }
            spec
        };
        let cases = [
            (
                "gated",
                pod(c(json!({"schedulingGates": gate})), json!({}), false),
                Lifecycle::Pending,
                Placement::Gated,
                false,
            ),
            (
                "another gate only",
                pod(c(json!({"schedulingGates": [{"name": "x"}]})), json!({}), false),
                Lifecycle::Pending,
                Placement::Unpinned,
                false,
            ),
            (
                "pinned",
                pod(c(json!({"nodeSelector": {HOSTNAME_LABEL: "h1"}})), json!({"phase": "Pending"}), false),
                Lifecycle::Pending,
                Placement::Admitted("h1".into()),
                false,
            ),
            (
                "bound beats pinned",
                pod(
                    c(json!({"nodeName": "n1", "nodeSelector": {HOSTNAME_LABEL: "h1"}})),
                    json!({"phase": "Running"}),
                    false,
                ),
                Lifecycle::Running,
                Placement::Bound("n1".into()),
                false,
            ),
            (
                "terminating, still running",
                pod(c(json!({"nodeName": "n1"})), json!({"phase": "Running"}), true),
                Lifecycle::Running,
                Placement::Bound("n1".into()),
                true,
            ),
            (
                "finished",
                pod(c(json!({"nodeName": "n1"})), json!({"phase": "Failed"}), false),
                Lifecycle::Failed,
                Placement::Bound("n1".into()),
                false,
            ),
            (
                "node lost",
                pod(c(json!({"nodeName": "n1"})), json!({"phase": "Unknown"}), false),
                Lifecycle::Unknown,
                Placement::Bound("n1".into()),
                false,
            ),
            (
                "no spec",
                serde_json::from_value(json!({"metadata": {"name": "p"}})).expect("pod"),
                Lifecycle::Pending,
                Placement::Unpinned,
                false,
            ),
        ];
        for (name, pod, lifecycle, placement, terminating) in cases {
            let class = PodClass::of(&pod);
            assert_eq!(class, PodClass { lifecycle, placement: placement.clone(), terminating }, "{name}");
            assert_eq!(is_gated(&pod), placement == Placement::Gated, "{name}");
            assert_eq!(is_bound(&pod), matches!(placement, Placement::Bound(_)), "{name}");
            assert_eq!(is_finished(&pod), lifecycle.is_terminal(), "{name}");
            assert_eq!(class.live(), !lifecycle.is_terminal() && !terminating, "{name}");
        }
        assert!(!Lifecycle::Unknown.is_terminal(), "a pod on a lost node keeps what it holds");
    }
}

//! `muster dev demo-check`: what `make demo` waits for and `make demo-check` asserts. The
//! expected gangs are admitted (or already done), the oversize one is Unschedulable with a
//! reason, and no GPU index is held twice on a node. The check is pure ([`check`]); the
//! command only lists the objects.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use crate::crds::scheduling::GroupPhase;
use crate::crds::{CompositePodGroup, GPU_INDICES_ANNOTATION, PodGroup};

/// What the demo expects.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct Expectations {
    /// Namespace of the demo objects.
    #[arg(long, default_value = "default")]
    pub namespace: String,
    /// PodGroups that must be admitted (or running, or done).
    #[arg(long, value_delimiter = ',')]
    pub admitted: Vec<String>,
    /// CompositePodGroups that must be admitted (or running, or done).
    #[arg(long, value_delimiter = ',')]
    pub admitted_composite: Vec<String>,
    /// PodGroups that must stay Unschedulable with a reason.
    #[arg(long, value_delimiter = ',')]
    pub unschedulable: Vec<String>,
}

/// One verdict of the check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// Whether it holds.
    pub ok: bool,
    /// What was checked, and what was seen.
    pub what: String,
}

fn admitted(phase: Option<GroupPhase>) -> bool {
    matches!(phase, Some(GroupPhase::Admitted | GroupPhase::Running | GroupPhase::Succeeded))
}

/// A phase as `kubectl get` prints it: its API value (the variant's name), `<none>` when unset.
fn shown(phase: Option<GroupPhase>) -> String {
    phase.map_or_else(|| "<none>".to_string(), |p| format!("{p:?}"))
}

/// Checks the demo's expectations against the cluster's objects.
pub fn check(expect: &Expectations, pgs: &[PodGroup], cpgs: &[CompositePodGroup], pods: &[Pod]) -> Vec<Finding> {
    let mut out = Vec::new();
    let pg = |name: &str| pgs.iter().find(|g| g.metadata.name.as_deref() == Some(name));
    for name in &expect.admitted {
        let phase = pg(name).and_then(|g| g.status.as_ref()).and_then(|s| s.phase);
        out.push(Finding { ok: admitted(phase), what: format!("PodGroup {name} admitted (phase {})", shown(phase)) });
    }
    for name in &expect.admitted_composite {
        let phase = cpgs
            .iter()
            .find(|g| g.metadata.name.as_deref() == Some(name.as_str()))
            .and_then(|g| g.status.as_ref())
            .and_then(|s| s.phase);
        out.push(Finding {
            ok: admitted(phase),
            what: format!("CompositePodGroup {name} admitted (phase {})", shown(phase)),
        });
    }
    for name in &expect.unschedulable {
        let status = pg(name).and_then(|g| g.status.as_ref());
        let phase = status.and_then(|s| s.phase);
        let message = status.and_then(|s| s.message.clone()).unwrap_or_default();
        let started = status.map(|s| s.admitted + s.running).unwrap_or(0);
        out.push(Finding {
            ok: phase == Some(GroupPhase::Unschedulable) && !message.is_empty() && started == 0,
            what: format!(
                "PodGroup {name} Unschedulable with a reason, no pod started (phase {}: {message:?})",
                shown(phase)
            ),
        });
    }
    // No GPU index held twice on a node by live pods.
    let mut held: BTreeMap<(String, usize), Vec<String>> = BTreeMap::new();
    for pod in pods {
        let live = !matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"));
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        let indices = pod.metadata.annotations.as_ref().and_then(|a| a.get(GPU_INDICES_ANNOTATION));
        if let (true, Some(node), Some(indices)) = (live, node, indices) {
            for i in crate::devices::parse_indices(indices).unwrap_or_default() {
                held.entry((node.clone(), i)).or_default().push(pod.metadata.name.clone().unwrap_or_default());
            }
        }
    }
    let twice: Vec<String> =
        held.iter().filter(|(_, p)| p.len() > 1).map(|((n, i), p)| format!("{n} GPU {i}: {}", p.join(", "))).collect();
    let gpu_pods = held.values().flatten().collect::<std::collections::BTreeSet<_>>().len();
    out.push(Finding {
        ok: twice.is_empty() && gpu_pods > 0,
        what: if twice.is_empty() {
            format!("GPU indices disjoint per node ({gpu_pods} pods hold GPU indices)")
        } else {
            format!("GPU indices held twice: {}", twice.join("; "))
        },
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crds::PodGroupSpec;
    use crate::crds::blocks::{DisruptionMode, PodGroupSchedulingPolicy};
    use crate::crds::scheduling::PodGroupStatus;
    use serde_json::json;

    fn group(name: &str, phase: GroupPhase, message: &str) -> PodGroup {
        let mut g = PodGroup::new(
            name,
            PodGroupSpec {
                scheduling_policy: PodGroupSchedulingPolicy::gang(Some(1)),
                disruption_mode: DisruptionMode::single(),
                ..Default::default()
            },
        );
        g.status = Some(PodGroupStatus { phase: Some(phase), message: Some(message.into()), ..Default::default() });
        g
    }

    fn pod(name: &str, node: &str, indices: &str) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name, "annotations": {GPU_INDICES_ANNOTATION: indices}},
            "spec": {"nodeName": node, "containers": []}, "status": {"phase": "Running"}}))
        .expect("pod")
    }

    #[test]
    fn passes_when_every_expectation_holds() {
        let expect =
            Expectations { admitted: vec!["a".into()], unschedulable: vec!["big".into()], ..Default::default() };
        let pgs = [group("a", GroupPhase::Running, ""), group("big", GroupPhase::Unschedulable, "0/16 nodes fit")];
        let pods = [pod("p1", "n1", "0,1"), pod("p2", "n1", "2,3"), pod("p3", "n2", "0,1")];
        assert!(check(&expect, &pgs, &[], &pods).iter().all(|f| f.ok));
    }

    #[test]
    fn fails_on_a_shared_gpu_a_pending_gang_or_a_silent_oversize_gang() {
        let expect =
            Expectations { admitted: vec!["a".into()], unschedulable: vec!["big".into()], ..Default::default() };
        let pgs = [group("a", GroupPhase::Pending, ""), group("big", GroupPhase::Unschedulable, "")];
        let pods = [pod("p1", "n1", "0,1"), pod("p2", "n1", "1")];
        let findings = check(&expect, &pgs, &[], &pods);
        assert_eq!(findings.iter().filter(|f| !f.ok).count(), 3, "{findings:?}");
        assert!(findings.iter().any(|f| f.what.contains("n1 GPU 1: p1, p2")));
    }

    #[test]
    fn findings_print_phases_as_kubectl_does() {
        let expect = Expectations {
            admitted: vec!["a".into(), "missing".into()],
            admitted_composite: vec!["c".into()],
            unschedulable: vec!["big".into()],
            ..Default::default()
        };
        let pgs = [group("a", GroupPhase::Running, ""), group("big", GroupPhase::Unschedulable, "0/16 nodes fit")];
        let whats: Vec<String> = check(&expect, &pgs, &[], &[]).into_iter().map(|f| f.what).collect();
        assert_eq!(
            whats[..4],
            [
                "PodGroup a admitted (phase Running)",
                "PodGroup missing admitted (phase <none>)",
                "CompositePodGroup c admitted (phase <none>)",
                "PodGroup big Unschedulable with a reason, no pod started (phase Unschedulable: \"0/16 nodes fit\")",
            ]
        );
    }
}

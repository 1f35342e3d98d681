//! `muster dev demo-check`: what `make demo` waits for and `make demo-check` asserts. The
//! expected gangs are admitted (or already done), the oversize one is Unschedulable with a
//! reason, and no GPU index is held twice on a node. In upstream mode (`--api upstream`) the
//! same promises are read from kube-scheduler's verdicts on the native `scheduling.k8s.io`
//! groups. The checks are pure ([`check`], [`check_native`]); the command only lists the
//! objects.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::scheduling::{v1alpha3, v1beta1};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use muster_api::scheduling::GroupPhase;
use muster_api::{CompositePodGroup, GPU_INDICES_ANNOTATION, PodGroup};

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
    /// Whose groups to read: `muster` (muster's PodGroups and CompositePodGroups) or `upstream`
    /// (the native scheduling.k8s.io ones, as kube-scheduler left them).
    #[arg(long, default_value = "muster", value_parser = ["muster", "upstream"])]
    pub api: String,
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
    out.push(gpus_disjoint(pods));
    out
}

/// No GPU index held twice on a node by live pods, and some pod holds indices.
fn gpus_disjoint(pods: &[Pod]) -> Finding {
    let mut held: BTreeMap<(String, usize), Vec<String>> = BTreeMap::new();
    for pod in pods {
        let live = !matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"));
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        let indices = pod.metadata.annotations.as_ref().and_then(|a| a.get(GPU_INDICES_ANNOTATION));
        if let (true, Some(node), Some(indices)) = (live, node, indices) {
            for i in muster_core::devices::parse_indices(indices).unwrap_or_default() {
                held.entry((node.clone(), i)).or_default().push(pod.metadata.name.clone().unwrap_or_default());
            }
        }
    }
    let twice: Vec<String> =
        held.iter().filter(|(_, p)| p.len() > 1).map(|((n, i), p)| format!("{n} GPU {i}: {}", p.join(", "))).collect();
    let gpu_pods = held.values().flatten().collect::<std::collections::BTreeSet<_>>().len();
    Finding {
        ok: twice.is_empty() && gpu_pods > 0,
        what: if twice.is_empty() {
            format!("GPU indices disjoint per node ({gpu_pods} pods hold GPU indices)")
        } else {
            format!("GPU indices held twice: {}", twice.join("; "))
        },
    }
}

/// kube-scheduler's verdict on a native group: its `PodGroupInitiallyScheduled` (or
/// `CompositePodGroupInitiallyScheduled`) condition.
fn verdict<'a>(conditions: Option<&'a Vec<Condition>>, type_: &str) -> Option<&'a Condition> {
    conditions.into_iter().flatten().find(|c| c.type_ == type_)
}

fn conditions(g: &v1beta1::PodGroup) -> Option<&Vec<Condition>> {
    g.status.as_ref().and_then(|s| s.conditions.as_ref())
}

/// A verdict as the findings print it.
fn said(c: Option<&Condition>) -> String {
    c.map_or_else(|| "no verdict yet".into(), |c| format!("{}={} {:?}", c.reason, c.status, c.message))
}

/// Upstream mode: checks the demo's expectations against the native groups kube-scheduler
/// judged. A PodGroup is admitted once its `PodGroupInitiallyScheduled` is True (terminal, so a
/// finished gang stays admitted); a CompositePodGroup once its own condition is, or, where
/// kube-scheduler writes none on it (1.37), once every child PodGroup naming it as parent is;
/// the oversize gang is `Unschedulable` with kube-scheduler's message and none of its pods bound.
pub fn check_native(
    expect: &Expectations,
    pgs: &[v1beta1::PodGroup],
    cpgs: &[v1alpha3::CompositePodGroup],
    pods: &[Pod],
) -> Vec<Finding> {
    const SCHEDULED: &str = "PodGroupInitiallyScheduled";
    let mut out = Vec::new();
    let pg = |name: &str| pgs.iter().find(|g| g.metadata.name.as_deref() == Some(name));
    for name in &expect.admitted {
        let c = pg(name).and_then(|g| verdict(conditions(g), SCHEDULED));
        out.push(Finding {
            ok: c.is_some_and(|c| c.status == "True"),
            what: format!("PodGroup {name} (scheduling.k8s.io) scheduled by kube-scheduler ({})", said(c)),
        });
    }
    for name in &expect.admitted_composite {
        let cpg = cpgs.iter().find(|g| g.metadata.name.as_deref() == Some(name.as_str()));
        let own = cpg.and_then(|g| {
            verdict(g.status.as_ref().and_then(|s| s.conditions.as_ref()), "CompositePodGroupInitiallyScheduled")
        });
        let children: Vec<&v1beta1::PodGroup> =
            pgs.iter().filter(|g| g.spec.parent_composite_pod_group_name.as_deref() == Some(name.as_str())).collect();
        let scheduled =
            children.iter().filter(|g| verdict(conditions(g), SCHEDULED).is_some_and(|c| c.status == "True"));
        let (ok, seen) = match own {
            Some(c) => (c.status == "True", said(Some(c))),
            None => (
                cpg.is_some() && !children.is_empty() && scheduled.count() == children.len(),
                format!(
                    "{}: child PodGroups {}",
                    if cpg.is_some() { "exists" } else { "missing" },
                    children
                        .iter()
                        .map(|g| format!(
                            "{} {}",
                            g.metadata.name.as_deref().unwrap_or_default(),
                            said(verdict(conditions(g), SCHEDULED))
                        ))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ),
        };
        out.push(Finding {
            ok,
            what: format!("CompositePodGroup {name} (scheduling.k8s.io) scheduled whole ({seen})"),
        });
    }
    for name in &expect.unschedulable {
        let c = pg(name).and_then(|g| verdict(conditions(g), SCHEDULED));
        let bound = pods
            .iter()
            .filter(|p| {
                let spec = p.spec.as_ref();
                spec.and_then(|s| s.scheduling_group.as_ref()).and_then(|g| g.pod_group_name.as_deref())
                    == Some(name.as_str())
                    && spec.and_then(|s| s.node_name.as_ref()).is_some()
            })
            .count();
        out.push(Finding {
            ok: c.is_some_and(|c| c.status == "False" && c.reason == "Unschedulable" && !c.message.is_empty())
                && bound == 0,
            what: format!(
                "PodGroup {name} (scheduling.k8s.io) Unschedulable with kube-scheduler's reason, no pod bound ({}; {bound} bound)",
                said(c)
            ),
        });
    }
    out.push(gpus_disjoint(pods));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use muster_api::PodGroupSpec;
    use muster_api::blocks::{DisruptionMode, PodGroupSchedulingPolicy};
    use muster_api::scheduling::PodGroupStatus;
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

    fn native(name: &str, parent: Option<&str>, verdict: Option<(&str, &str, &str)>) -> v1beta1::PodGroup {
        let conditions: Vec<serde_json::Value> = verdict
            .map(|(status, reason, message)| {
                json!({"type": "PodGroupInitiallyScheduled", "status": status, "reason": reason, "message": message,
                       "lastTransitionTime": "2026-01-01T00:00:00Z"})
            })
            .into_iter()
            .collect();
        serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"schedulingPolicy": {"gang": {"minCount": 1}}, "parentCompositePodGroupName": parent},
            "status": {"conditions": conditions}}))
        .expect("native PodGroup")
    }

    fn composite(name: &str) -> v1alpha3::CompositePodGroup {
        serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"workloadRef": {"workloadName": name, "templateName": "jobset"},
                     "schedulingPolicy": {"gang": {"minGroupCount": 2}}}}))
        .expect("native CompositePodGroup")
    }

    fn member(name: &str, group: &str, node: Option<&str>, indices: &str) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name, "annotations": {GPU_INDICES_ANNOTATION: indices}},
            "spec": {"nodeName": node, "schedulingGroup": {"podGroupName": group}, "containers": []},
            "status": {"phase": if node.is_some() { "Running" } else { "Pending" }}}))
        .expect("pod")
    }

    #[test]
    fn upstream_mode_reads_kube_schedulers_verdicts_on_the_native_groups() {
        let expect = Expectations {
            admitted: vec!["a".into()],
            admitted_composite: vec!["set".into()],
            unschedulable: vec!["big".into()],
            api: "upstream".into(),
            ..Default::default()
        };
        let scheduled = Some(("True", "Scheduled", ""));
        let too_big = Some(("False", "Unschedulable", "minCount (17) cannot be satisfied"));
        let good = vec![
            native("a", None, scheduled),
            native("set-d-0", Some("set"), scheduled),
            native("set-w-0", Some("set"), scheduled),
            native("big", None, too_big),
        ];
        let pods = vec![member("a-0", "a", Some("n1"), "0,1"), member("big-0", "big", None, "")];
        let cpgs = [composite("set")];
        let ok = |pgs: &[v1beta1::PodGroup], cpgs: &[v1alpha3::CompositePodGroup], pods: &[Pod]| {
            check_native(&expect, pgs, cpgs, pods).into_iter().filter(|f| !f.ok).map(|f| f.what).collect::<Vec<_>>()
        };
        assert_eq!(ok(&good, &cpgs, &pods), Vec::<String>::new());
        // Each promise broken alone fails its finding, and only it.
        let mut pending = good.clone();
        pending[0] = native("a", None, None);
        let mut child_out = good.clone();
        child_out[2] = native("set-w-0", Some("set"), Some(("False", "Unschedulable", "no rack fits")));
        let mut silent = good.clone();
        silent[3] = native("big", None, Some(("False", "Unschedulable", "")));
        let mut bound = pods.clone();
        bound.push(member("big-1", "big", Some("n2"), "3"));
        let mut twice = pods.clone();
        twice.push(member("a-1", "a", Some("n1"), "1"));
        type Case<'a> = (&'a [v1beta1::PodGroup], &'a [v1alpha3::CompositePodGroup], &'a [Pod], &'a str);
        let cases: [Case; 6] = [
            (&pending, &cpgs, &pods, "PodGroup a (scheduling.k8s.io) scheduled by kube-scheduler (no verdict yet)"),
            (&child_out, &cpgs, &pods, "CompositePodGroup set"),
            (&good, &[], &pods, "CompositePodGroup set (scheduling.k8s.io) scheduled whole (missing"),
            (&silent, &cpgs, &pods, "PodGroup big"),
            (
                &good,
                &cpgs,
                &bound,
                "PodGroup big (scheduling.k8s.io) Unschedulable with kube-scheduler's reason, no pod bound (Unschedulable=False \"minCount (17) cannot be satisfied\"; 1 bound)",
            ),
            (&good, &cpgs, &twice, "GPU indices held twice: n1 GPU 1: a-0, a-1"),
        ];
        for (pgs, cpgs, pods, want) in cases {
            let failed = ok(pgs, cpgs, pods);
            assert_eq!(failed.len(), 1, "{want}: {failed:?}");
            assert!(failed[0].starts_with(want), "{want}: {failed:?}");
        }
    }
}

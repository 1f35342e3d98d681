//! `muster dev demo-check`: what `make demo` waits for and `make demo-check` asserts. The
//! expected gangs are admitted (or already done), the oversize one is Unschedulable with a
//! reason, and no GPU index is held twice on a node. In upstream mode (`--api upstream`) the
//! same promises are read from kube-scheduler's verdicts on the native `scheduling.k8s.io`
//! groups. The brought Job and JobSet (`--complete`, `--completed-sets`) finish as batch/v1 and
//! JobSet report it, in both modes; a set's headless Service and coordinator label are checked
//! on the objects muster made. The checks are pure ([`check`], [`check_native`],
//! [`check_finished`]); [`observe`] only lists the objects.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::scheduling::{v1alpha3, v1beta1};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use kube::api::{Api, ListParams};

use muster_api::scheduling::GroupPhase;
use muster_api::{CompositePodGroup, GPU_INDICES_ANNOTATION, MusterJob, MusterJobSet, PodGroup};

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
    /// MusterJobs that must finish as batch/v1 Jobs do: condition `Complete=True`, no
    /// `Failed=True`, `succeeded` at `completions`.
    #[arg(long, value_delimiter = ',')]
    pub complete: Vec<String>,
    /// MusterJobSets that must finish as JobSets do: condition `Completed=True`,
    /// `terminalState: Completed`; with DNS hostnames, their headless Service selects their
    /// pods; with a coordinator, every child and pod carries its DNS name, and the pod named by
    /// it answers to it.
    #[arg(long, value_delimiter = ',')]
    pub completed_sets: Vec<String>,
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

/// The label (and annotation) JobSet writes on every Job and pod of a set with a
/// `coordinator`: the coordinator pod's stable DNS name.
pub const COORDINATOR_LABEL: &str = "jobset.sigs.k8s.io/coordinator";

/// Lists what the demo expects from the cluster and checks it: the groups (muster's, or with
/// `--api upstream` the native ones), the pods and, when jobs or sets must have finished, the
/// MusterJobs, MusterJobSets and Services of the namespace.
pub async fn observe(kubeconfig: Option<&Path>, expect: &Expectations) -> Result<Vec<Finding>, crate::Error> {
    let client = crate::client(kubeconfig).await?;
    let ns = expect.namespace.as_str();
    let lp = ListParams::default();
    let pods = Api::<Pod>::all(client.clone()).list(&lp).await?.items;
    let mut out = if expect.api == "upstream" {
        let pgs = Api::<v1beta1::PodGroup>::namespaced(client.clone(), ns).list(&lp).await?.items;
        let cpgs = Api::<v1alpha3::CompositePodGroup>::namespaced(client.clone(), ns).list(&lp).await?.items;
        check_native(expect, &pgs, &cpgs, &pods)
    } else {
        let pgs = Api::<PodGroup>::namespaced(client.clone(), ns).list(&lp).await?.items;
        let cpgs = Api::<CompositePodGroup>::namespaced(client.clone(), ns).list(&lp).await?.items;
        check(expect, &pgs, &cpgs, &pods)
    };
    if !expect.complete.is_empty() || !expect.completed_sets.is_empty() {
        let jobs = Api::<MusterJob>::namespaced(client.clone(), ns).list(&lp).await?.items;
        let sets = Api::<MusterJobSet>::namespaced(client.clone(), ns).list(&lp).await?.items;
        let services = Api::<Service>::namespaced(client, ns).list(&lp).await?.items;
        out.extend(check_finished(expect, &jobs, &sets, &services, &pods));
    }
    Ok(out)
}

/// Whether `conditions` hold `type_` with status True.
fn holds(conditions: &[Condition], type_: &str) -> bool {
    conditions.iter().any(|c| c.type_ == type_ && c.status == "True")
}

/// Conditions as the findings print them: `Complete=True CompletionsReached, ...`.
fn listed(conditions: &[Condition]) -> String {
    if conditions.is_empty() {
        return "no conditions".into();
    }
    conditions.iter().map(|c| format!("{}={} {}", c.type_, c.status, c.reason)).collect::<Vec<_>>().join(", ")
}

/// The uid of the object's controller (its ownerReference with `controller: true`).
fn controller(meta: &ObjectMeta) -> Option<&str> {
    meta.owner_references.iter().flatten().find(|o| o.controller == Some(true)).map(|o| o.uid.as_str())
}

/// Checks that the MusterJobs and MusterJobSets the demo names finished as batch/v1 and JobSet
/// report it, and (for a set) its network and coordinator, read from the objects muster made:
/// the headless Service, the child MusterJobs (controlled by the set) and their pods.
pub fn check_finished(
    expect: &Expectations,
    jobs: &[MusterJob],
    sets: &[MusterJobSet],
    services: &[Service],
    pods: &[Pod],
) -> Vec<Finding> {
    let mut out = Vec::new();
    for name in &expect.complete {
        out.push(job_complete(name, jobs.iter().find(|j| j.metadata.name.as_deref() == Some(name.as_str()))));
    }
    for name in &expect.completed_sets {
        match sets.iter().find(|s| s.metadata.name.as_deref() == Some(name.as_str())) {
            Some(set) => out.extend(set_finished(set, jobs, services, pods)),
            None => out.push(Finding { ok: false, what: format!("MusterJobSet {name} Completed (not found)") }),
        }
    }
    out
}

/// A MusterJob finished as a batch/v1 Job does: `Complete=True`, never `Failed=True`, and
/// `succeeded` at `completions` (at least one success without `completions`). No demo pod
/// fails, so `failed` must be 0: a pod counted failed there is a bug.
fn job_complete(name: &str, job: Option<&MusterJob>) -> Finding {
    let Some(job) = job else {
        return Finding { ok: false, what: format!("MusterJob {name} Complete (not found)") };
    };
    let status = job.status.clone().unwrap_or_default();
    let completions = job.spec.completions;
    let counted = completions.map_or(status.succeeded >= 1, |c| status.succeeded == c);
    Finding {
        ok: holds(&status.conditions, "Complete")
            && !holds(&status.conditions, "Failed")
            && counted
            && status.failed == 0,
        what: format!(
            "MusterJob {name} Complete ({}; succeeded {}/{}, failed {})",
            listed(&status.conditions),
            status.succeeded,
            completions.map_or_else(|| "-".to_string(), |c| c.to_string()),
            status.failed
        ),
    }
}

/// A MusterJobSet finished as a JobSet does (without a restart: no demo pod fails), with its
/// headless Service and coordinator.
fn set_finished(set: &MusterJobSet, jobs: &[MusterJob], services: &[Service], pods: &[Pod]) -> Vec<Finding> {
    let name = set.metadata.name.as_deref().unwrap_or_default();
    let uid = set.metadata.uid.as_deref();
    let status = set.status.clone().unwrap_or_default();
    let conditions = &status.conditions;
    let mut out = vec![Finding {
        ok: holds(conditions, "Completed")
            && !holds(conditions, "Failed")
            && status.terminal_state.as_deref() == Some("Completed")
            && status.restarts == 0,
        what: format!(
            "MusterJobSet {name} Completed ({}; terminalState {}; restarts {})",
            listed(conditions),
            status.terminal_state.as_deref().unwrap_or("<none>"),
            status.restarts
        ),
    }];
    // The set's children, and their pods, by controller reference.
    let children: Vec<&MusterJob> = jobs.iter().filter(|j| uid.is_some() && controller(&j.metadata) == uid).collect();
    let child_uids: Vec<&str> = children.iter().filter_map(|j| j.metadata.uid.as_deref()).collect();
    let set_pods: Vec<&Pod> = pods
        .iter()
        .filter(|p| {
            p.metadata.namespace == set.metadata.namespace
                && controller(&p.metadata).is_some_and(|owner| child_uids.contains(&owner))
        })
        .collect();
    let network = set.spec.network.clone().unwrap_or_default();
    let subdomain = network.subdomain.clone().filter(|s| !s.is_empty()).unwrap_or_else(|| name.to_string());
    if network.enable_dns_hostnames != Some(false) {
        out.push(headless_service(name, uid, &subdomain, network.publish_not_ready_addresses, services, &set_pods));
    }
    if let Some(c) = &set.spec.coordinator {
        let host = format!("{name}-{}-{}-{}", c.replicated_job, c.job_index, c.pod_index);
        let endpoint = format!("{host}.{subdomain}");
        let mut wrong = Vec::new();
        let label = |meta: &ObjectMeta| meta.labels.as_ref().and_then(|l| l.get(COORDINATOR_LABEL)).cloned();
        for child in &children {
            if label(&child.metadata).as_deref() != Some(endpoint.as_str()) {
                wrong.push(format!(
                    "child {} has {:?}",
                    child.metadata.name.as_deref().unwrap_or_default(),
                    label(&child.metadata)
                ));
            }
        }
        let unlabelled = set_pods.iter().filter(|p| label(&p.metadata).as_deref() != Some(endpoint.as_str())).count();
        if unlabelled > 0 {
            wrong.push(format!("{unlabelled} of {} pods lack it", set_pods.len()));
        }
        let answers = set_pods.iter().any(|p| {
            let spec = p.spec.as_ref();
            spec.and_then(|s| s.hostname.as_deref()) == Some(host.as_str())
                && spec.and_then(|s| s.subdomain.as_deref()) == Some(subdomain.as_str())
        });
        if !answers {
            wrong.push(format!("no pod of the set is {endpoint}"));
        }
        if children.is_empty() || set_pods.is_empty() {
            wrong.push(format!("{} children, {} pods", children.len(), set_pods.len()));
        }
        out.push(Finding {
            ok: wrong.is_empty(),
            what: format!(
                "MusterJobSet {name} coordinator {endpoint}: label on its {} children and {} pods, the pod answering to it exists{}",
                children.len(),
                set_pods.len(),
                if wrong.is_empty() { String::new() } else { format!(" ({})", wrong.join("; ")) }
            ),
        });
    }
    out
}

/// The set's headless Service: named after the subdomain, `clusterIP: None`, controlled by the
/// set, publishing not-ready addresses as the spec says (default true), and selecting every pod
/// of the set, each of which names the subdomain.
fn headless_service(
    set: &str,
    uid: Option<&str>,
    subdomain: &str,
    publish_not_ready: Option<bool>,
    services: &[Service],
    set_pods: &[&Pod],
) -> Finding {
    let mut wrong = Vec::new();
    match services.iter().find(|s| s.metadata.name.as_deref() == Some(subdomain)) {
        None => wrong.push("missing".to_string()),
        Some(svc) => {
            let spec = svc.spec.clone().unwrap_or_default();
            if spec.cluster_ip.as_deref() != Some("None") {
                wrong.push(format!("clusterIP {:?}", spec.cluster_ip));
            }
            if uid.is_none() || controller(&svc.metadata) != uid {
                wrong.push("not controlled by the set".into());
            }
            let publish = publish_not_ready.unwrap_or(true);
            if spec.publish_not_ready_addresses.unwrap_or(false) != publish {
                wrong.push(format!("publishNotReadyAddresses {:?}, want {publish}", spec.publish_not_ready_addresses));
            }
            let selector = spec.selector.unwrap_or_default();
            let selected = |p: &&&Pod| {
                let labels = p.metadata.labels.as_ref();
                selector.iter().all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
            };
            let missed = set_pods.iter().filter(|p| !selected(p)).count();
            if selector.is_empty() || missed > 0 {
                wrong.push(format!("selector {selector:?} misses {missed} of {} pods", set_pods.len()));
            }
        }
    }
    let elsewhere =
        set_pods.iter().filter(|p| p.spec.as_ref().and_then(|s| s.subdomain.as_deref()) != Some(subdomain)).count();
    if elsewhere > 0 {
        wrong.push(format!("{elsewhere} pods name another subdomain"));
    }
    if set_pods.is_empty() {
        wrong.push("the set has no pods".into());
    }
    Finding {
        ok: wrong.is_empty(),
        what: format!(
            "MusterJobSet {set} headless Service {subdomain} selects its {} pods{}",
            set_pods.len(),
            if wrong.is_empty() { String::new() } else { format!(" ({})", wrong.join("; ")) }
        ),
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

    /// A cluster after the brought Job and JobSet finished, as JSON so each case can break one
    /// thing: the MusterJob `train` (4/4), the set `ddp` (leader 1 pod, workers 2 pods, a
    /// coordinator, DNS hostnames), its children, pods and headless Service, and a pod of
    /// another owner that the set's checks must ignore.
    struct Finished {
        jobs: Vec<serde_json::Value>,
        sets: Vec<serde_json::Value>,
        services: Vec<serde_json::Value>,
        pods: Vec<serde_json::Value>,
    }

    const ENDPOINT: &str = "ddp-leader-0-0.ddp";

    fn condition(type_: &str, status: &str, reason: &str) -> serde_json::Value {
        json!({"type": type_, "status": status, "reason": reason, "message": "",
               "lastTransitionTime": "2026-01-01T00:00:00Z"})
    }

    fn controlled_by(kind: &str, uid: &str) -> serde_json::Value {
        json!([{"apiVersion": "batch.muster.dev/v1alpha1", "kind": kind, "name": "owner", "uid": uid, "controller": true}])
    }

    fn template() -> serde_json::Value {
        json!({"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}})
    }

    fn child(name: &str, pods: i32) -> serde_json::Value {
        json!({"metadata": {"name": name, "namespace": "default", "uid": format!("{name}-uid"),
                            "labels": {COORDINATOR_LABEL: ENDPOINT}, "ownerReferences": controlled_by("MusterJobSet", "ddp-uid")},
               "spec": {"parallelism": pods, "completions": pods, "completionMode": "Indexed", "template": template()},
               "status": {"succeeded": pods, "conditions": [condition("Complete", "True", "CompletionsReached")]}})
    }

    fn set_pod(child: &str, index: i32) -> serde_json::Value {
        json!({"metadata": {"name": format!("{child}-{index}-x"), "namespace": "default",
                            "labels": {COORDINATOR_LABEL: ENDPOINT, "batch.muster.dev/jobset-name": "ddp"},
                            "ownerReferences": controlled_by("MusterJob", &format!("{child}-uid"))},
               "spec": {"hostname": format!("{child}-{index}"), "subdomain": "ddp", "containers": []},
               "status": {"phase": "Succeeded"}})
    }

    fn finished() -> Finished {
        let train = json!({"metadata": {"name": "train", "namespace": "default", "uid": "train-uid"},
            "spec": {"parallelism": 4, "completions": 4, "completionMode": "Indexed", "template": template()},
            "status": {"succeeded": 4, "conditions": [condition("SuccessCriteriaMet", "True", "CompletionsReached"),
                                                        condition("Complete", "True", "CompletionsReached")]}});
        let set = json!({"metadata": {"name": "ddp", "namespace": "default", "uid": "ddp-uid"},
            "spec": {"network": {"enableDNSHostnames": true}, "coordinator": {"replicatedJob": "leader"},
                     "replicatedJobs": [{"name": "leader", "template": {"spec": {"template": template()}}},
                                        {"name": "workers", "template": {"spec": {"parallelism": 2, "template": template()}}}]},
            "status": {"terminalState": "Completed", "conditions": [condition("Completed", "True", "AllJobsCompleted")]}});
        let service = json!({"metadata": {"name": "ddp", "namespace": "default", "ownerReferences": controlled_by("MusterJobSet", "ddp-uid")},
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": true, "selector": {"batch.muster.dev/jobset-name": "ddp"}}});
        let stranger = json!({"metadata": {"name": "other-0", "namespace": "default", "ownerReferences": controlled_by("MusterJob", "other-uid")},
            "spec": {"containers": []}});
        Finished {
            jobs: vec![train, child("ddp-leader-0", 1), child("ddp-workers-0", 2)],
            sets: vec![set],
            services: vec![service],
            pods: vec![set_pod("ddp-leader-0", 0), set_pod("ddp-workers-0", 0), set_pod("ddp-workers-0", 1), stranger],
        }
    }

    /// What fails when the demo expects `train` Complete and `ddp` Completed.
    fn failing(world: &Finished) -> Vec<String> {
        fn all<T: serde::de::DeserializeOwned>(values: &[serde_json::Value]) -> Vec<T> {
            values.iter().map(|v| serde_json::from_value(v.clone()).expect("fixture")).collect()
        }
        let expect =
            Expectations { complete: vec!["train".into()], completed_sets: vec!["ddp".into()], ..Default::default() };
        let (jobs, sets, services, pods) = (all(&world.jobs), all(&world.sets), all(&world.services), all(&world.pods));
        check_finished(&expect, &jobs, &sets, &services, &pods).into_iter().filter(|f| !f.ok).map(|f| f.what).collect()
    }

    #[test]
    fn finished_job_and_set_hold_when_batch_and_jobset_would_say_so() {
        let expect =
            Expectations { complete: vec!["train".into()], completed_sets: vec!["ddp".into()], ..Default::default() };
        let world = finished();
        assert_eq!(failing(&world), Vec::<String>::new());
        let jobs: Vec<MusterJob> = world.jobs.iter().map(|v| serde_json::from_value(v.clone()).unwrap()).collect();
        let sets: Vec<MusterJobSet> = world.sets.iter().map(|v| serde_json::from_value(v.clone()).unwrap()).collect();
        let services: Vec<Service> =
            world.services.iter().map(|v| serde_json::from_value(v.clone()).unwrap()).collect();
        let pods: Vec<Pod> = world.pods.iter().map(|v| serde_json::from_value(v.clone()).unwrap()).collect();
        let whats: Vec<String> =
            check_finished(&expect, &jobs, &sets, &services, &pods).into_iter().map(|f| f.what).collect();
        assert_eq!(
            whats,
            [
                "MusterJob train Complete (SuccessCriteriaMet=True CompletionsReached, Complete=True CompletionsReached; succeeded 4/4, failed 0)",
                "MusterJobSet ddp Completed (Completed=True AllJobsCompleted; terminalState Completed; restarts 0)",
                "MusterJobSet ddp headless Service ddp selects its 3 pods",
                "MusterJobSet ddp coordinator ddp-leader-0-0.ddp: label on its 2 children and 3 pods, the pod answering to it exists",
            ]
        );
    }

    #[test]
    fn each_broken_promise_of_a_finished_job_or_set_fails_its_finding_alone() {
        type Break = fn(&mut Finished);
        let cases: [(&str, Break, &str); 16] = [
            (
                "no Complete yet",
                |w| w.jobs[0]["status"]["conditions"].as_array_mut().unwrap().truncate(1),
                "MusterJob train Complete (SuccessCriteriaMet=True",
            ),
            (
                "Complete short of completions",
                |w| w.jobs[0]["status"]["succeeded"] = json!(3),
                "MusterJob train Complete",
            ),
            (
                "Failed too",
                |w| {
                    w.jobs[0]["status"]["conditions"].as_array_mut().unwrap().push(condition(
                        "Failed",
                        "True",
                        "PodFailurePolicy",
                    ))
                },
                "MusterJob train",
            ),
            (
                "a pod counted failed",
                |w| w.jobs[0]["status"]["failed"] = json!(1),
                "MusterJob train Complete (SuccessCriteriaMet=True CompletionsReached, Complete=True CompletionsReached; succeeded 4/4, failed 1)",
            ),
            (
                "a restart",
                |w| w.sets[0]["status"]["restarts"] = json!(1),
                "MusterJobSet ddp Completed (Completed=True AllJobsCompleted; terminalState Completed; restarts 1)",
            ),
            (
                "job missing",
                |w| w.jobs[0]["metadata"]["name"] = json!("renamed"),
                "MusterJob train Complete (not found)",
            ),
            (
                "set not Completed",
                |w| w.sets[0]["status"]["conditions"] = json!([]),
                "MusterJobSet ddp Completed (no conditions",
            ),
            (
                "no terminalState",
                |w| w.sets[0]["status"]["terminalState"] = json!(null),
                "MusterJobSet ddp Completed (Completed=True AllJobsCompleted; terminalState <none>",
            ),
            ("set missing", |w| w.sets.clear(), "MusterJobSet ddp Completed (not found)"),
            (
                "no Service",
                |w| w.services.clear(),
                "MusterJobSet ddp headless Service ddp selects its 3 pods (missing)",
            ),
            (
                "Service not headless",
                |w| w.services[0]["spec"]["clusterIP"] = json!("10.0.0.7"),
                "MusterJobSet ddp headless Service ddp selects its 3 pods (clusterIP Some(\"10.0.0.7\"))",
            ),
            (
                "Service of another owner",
                |w| w.services[0]["metadata"]["ownerReferences"] = controlled_by("MusterJobSet", "x"),
                "MusterJobSet ddp headless Service ddp selects its 3 pods (not controlled by the set)",
            ),
            (
                "selector misses a worker",
                |w| w.pods[2]["metadata"]["labels"]["batch.muster.dev/jobset-name"] = json!("x"),
                "MusterJobSet ddp headless Service ddp selects its 3 pods (selector",
            ),
            (
                "a pod without the coordinator",
                |w| w.pods[1]["metadata"]["labels"][COORDINATOR_LABEL] = json!("ddp-workers-0-0.ddp"),
                "MusterJobSet ddp coordinator ddp-leader-0-0.ddp: label on its 2 children and 3 pods, the pod answering to it exists (1 of 3 pods lack it)",
            ),
            (
                "a child without the coordinator",
                |w| w.jobs[2]["metadata"]["labels"] = json!({}),
                "MusterJobSet ddp coordinator ddp-leader-0-0.ddp: label on its 2 children and 3 pods, the pod answering to it exists (child ddp-workers-0 has None)",
            ),
            (
                "no pod answers to the coordinator",
                |w| w.pods[0]["spec"]["hostname"] = json!("ddp-leader-0-1"),
                "MusterJobSet ddp coordinator ddp-leader-0-0.ddp: label on its 2 children and 3 pods, the pod answering to it exists (no pod of the set is ddp-leader-0-0.ddp)",
            ),
        ];
        for (name, broken, want) in cases {
            let mut world = finished();
            broken(&mut world);
            let failed = failing(&world);
            assert_eq!(failed.len(), 1, "{name}: {failed:?}");
            assert!(failed[0].starts_with(want), "{name}: want {want:?}, got {failed:?}");
        }
    }

    #[test]
    fn a_set_without_dns_hostnames_or_coordinator_is_only_checked_for_completion() {
        let mut world = finished();
        world.sets[0]["spec"]["network"]["enableDNSHostnames"] = json!(false);
        world.sets[0]["spec"]["coordinator"] = json!(null);
        world.services.clear();
        let expect = Expectations { completed_sets: vec!["ddp".into()], ..Default::default() };
        let sets: Vec<MusterJobSet> = world.sets.iter().map(|v| serde_json::from_value(v.clone()).unwrap()).collect();
        let findings = check_finished(&expect, &[], &sets, &[], &[]);
        assert_eq!(findings.len(), 1, "{findings:?}");
        assert!(findings[0].ok, "{findings:?}");
    }
}

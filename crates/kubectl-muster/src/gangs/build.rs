//! The objects `kubectl muster` listed, reduced to one [`Gang`] per root group (muster's and
//! the native ones), each with its owning job, its pod counts and its child groups.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::scheduling::{v1alpha3, v1beta1};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};

use super::gang::{Gang, GangKind, GroupCounts, PodCounts};
use super::owner::owner_of;
use muster_api::{CompositePodGroup, MusterJob, MusterJobSet, PodGroup};
use muster_core::pods::{Lifecycle, PodClass};

/// muster's verdict condition on its groups (admission's).
pub const ADMITTED: &str = "Admitted";
/// kube-scheduler's verdict condition on a native PodGroup (upstream mode).
pub const POD_GROUP_SCHEDULED: &str = "PodGroupInitiallyScheduled";
/// kube-scheduler's verdict condition on a native CompositePodGroup.
pub const COMPOSITE_SCHEDULED: &str = "CompositePodGroupInitiallyScheduled";

/// The objects `list` and `why` read, as listed (a kind the cluster does not serve is empty).
#[derive(Clone, Debug, Default)]
pub struct Objects {
    /// muster's PodGroups.
    pub pod_groups: Vec<PodGroup>,
    /// muster's CompositePodGroups.
    pub composites: Vec<CompositePodGroup>,
    /// `scheduling.k8s.io/v1beta1` PodGroups.
    pub native_groups: Vec<v1beta1::PodGroup>,
    /// `scheduling.k8s.io/v1alpha3` CompositePodGroups.
    pub native_composites: Vec<v1alpha3::CompositePodGroup>,
    /// MusterJobs.
    pub jobs: Vec<MusterJob>,
    /// MusterJobSets.
    pub sets: Vec<MusterJobSet>,
    /// Pods that join a native PodGroup (`spec.schedulingGroup`); muster's groups count their
    /// own pods in their status.
    pub pods: Vec<Pod>,
}

pub(super) fn name_of(meta: &ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

pub(super) fn namespace_of(meta: &ObjectMeta) -> String {
    meta.namespace.clone().unwrap_or_default()
}

pub(super) fn condition(conditions: &[Condition], type_: &str) -> Option<Condition> {
    conditions.iter().find(|c| c.type_ == type_).cloned()
}

fn muster_leaf(pg: &PodGroup, objects: &Objects) -> Gang {
    let status = pg.status.clone().unwrap_or_default();
    let min = status.min_count.or(pg.spec.scheduling_policy.min_count()).unwrap_or(1);
    Gang {
        kind: GangKind::PodGroup,
        namespace: namespace_of(&pg.metadata),
        name: name_of(&pg.metadata),
        owner: owner_of(&pg.metadata, objects),
        created: pg.metadata.creation_timestamp.as_ref().map(|t| t.0),
        group_phase: status.phase,
        group_reason: status.reason.clone(),
        verdict: condition(&status.conditions, ADMITTED),
        message: status.message.unwrap_or_default(),
        pods: PodCounts {
            live: status.pods,
            gated: status.gated,
            bound: status.scheduled + status.succeeded,
            running: status.running,
            succeeded: status.succeeded,
            failed: status.failed,
            min,
        },
        groups: None,
        children: Vec::new(),
    }
}

fn muster_composite(cpg: &CompositePodGroup, objects: &Objects) -> Gang {
    let (ns, name) = (namespace_of(&cpg.metadata), name_of(&cpg.metadata));
    let under = |m: &ObjectMeta, parent: Option<&String>| namespace_of(m) == ns && parent == Some(&name);
    let mut children: Vec<Gang> = objects
        .composites
        .iter()
        .filter(|c| under(&c.metadata, c.spec.parent_composite_pod_group_name.as_ref()))
        .map(|c| muster_composite(c, objects))
        .collect();
    children.extend(
        objects
            .pod_groups
            .iter()
            .filter(|g| under(&g.metadata, g.spec.parent_composite_pod_group_name.as_ref()))
            .map(|g| muster_leaf(g, objects)),
    );
    children.sort_by(|a, b| a.name.cmp(&b.name));
    let status = cpg.status.clone().unwrap_or_default();
    Gang {
        kind: GangKind::CompositePodGroup,
        namespace: ns,
        name: name.clone(),
        owner: owner_of(&cpg.metadata, objects),
        created: cpg.metadata.creation_timestamp.as_ref().map(|t| t.0),
        group_phase: status.phase,
        group_reason: status.reason.clone(),
        verdict: condition(&status.conditions, ADMITTED),
        message: status.message.unwrap_or_default(),
        pods: summed(&children),
        groups: Some(GroupCounts {
            children: status.children,
            quorate: status.quorate_children,
            min: status.min_group_count.or(cpg.spec.scheduling_policy.min_group_count()).unwrap_or(1),
        }),
        children,
    }
}

fn summed(children: &[Gang]) -> PodCounts {
    let mut total = PodCounts::default();
    for c in children {
        total += c.pods;
    }
    total
}

/// Counts the pods that join native PodGroup `name` in `ns`.
fn native_pods(pods: &[Pod], ns: &str, name: &str, min: i32) -> PodCounts {
    let mut c = PodCounts { min, ..PodCounts::default() };
    let joins = |p: &&Pod| {
        namespace_of(&p.metadata) == ns
            && p.spec.as_ref().and_then(|s| s.scheduling_group.as_ref()).and_then(|g| g.pod_group_name.as_deref())
                == Some(name)
    };
    for pod in pods.iter().filter(joins) {
        let class = PodClass::of(pod);
        let gated = pod.spec.as_ref().and_then(|s| s.scheduling_gates.as_ref()).is_some_and(|g| !g.is_empty());
        match class.lifecycle {
            Lifecycle::Succeeded => {
                c.succeeded += 1;
                c.bound += 1;
            }
            Lifecycle::Failed => c.failed += 1,
            _ if class.terminating => {}
            lifecycle => {
                c.live += 1;
                c.gated += i32::from(gated);
                c.bound += i32::from(class.bound_node().is_some());
                c.running += i32::from(lifecycle == Lifecycle::Running);
            }
        }
    }
    c
}

fn native_leaf(pg: &v1beta1::PodGroup, objects: &Objects) -> Gang {
    let (ns, name) = (namespace_of(&pg.metadata), name_of(&pg.metadata));
    let min = pg.spec.scheduling_policy.gang.as_ref().map_or(1, |g| g.min_count);
    let verdict =
        pg.status.as_ref().and_then(|s| s.conditions.as_deref()).and_then(|c| condition(c, POD_GROUP_SCHEDULED));
    Gang {
        kind: GangKind::NativePodGroup,
        pods: native_pods(&objects.pods, &ns, &name, min),
        owner: owner_of(&pg.metadata, objects),
        created: pg.metadata.creation_timestamp.as_ref().map(|t| t.0),
        group_phase: None,
        group_reason: None,
        message: verdict.as_ref().map(|c| c.message.clone()).unwrap_or_default(),
        verdict,
        groups: None,
        children: Vec::new(),
        namespace: ns,
        name,
    }
}

fn native_composite(cpg: &v1alpha3::CompositePodGroup, objects: &Objects) -> Gang {
    let (ns, name) = (namespace_of(&cpg.metadata), name_of(&cpg.metadata));
    let under = |m: &ObjectMeta, parent: Option<&String>| namespace_of(m) == ns && parent == Some(&name);
    let mut children: Vec<Gang> = objects
        .native_composites
        .iter()
        .filter(|c| under(&c.metadata, c.spec.parent_composite_pod_group_name.as_ref()))
        .map(|c| native_composite(c, objects))
        .collect();
    children.extend(
        objects
            .native_groups
            .iter()
            .filter(|g| under(&g.metadata, g.spec.parent_composite_pod_group_name.as_ref()))
            .map(|g| native_leaf(g, objects)),
    );
    children.sort_by(|a, b| a.name.cmp(&b.name));
    let verdict =
        cpg.status.as_ref().and_then(|s| s.conditions.as_deref()).and_then(|c| condition(c, COMPOSITE_SCHEDULED));
    let min = cpg.spec.scheduling_policy.gang.as_ref().map_or(1, |g| g.min_group_count);
    Gang {
        kind: GangKind::NativeCompositePodGroup,
        owner: owner_of(&cpg.metadata, objects),
        created: cpg.metadata.creation_timestamp.as_ref().map(|t| t.0),
        group_phase: None,
        group_reason: None,
        message: verdict.as_ref().map(|c| c.message.clone()).unwrap_or_default(),
        verdict,
        pods: summed(&children),
        groups: Some(GroupCounts { children: children.len() as i32, quorate: 0, min }),
        children,
        namespace: ns,
        name,
    }
}

/// Every gang in `objects`: one per root group (muster's, then the native ones), each with
/// its owning job and its child groups, ordered by namespace and name.
pub fn gangs(objects: &Objects) -> Vec<Gang> {
    let mut out: Vec<Gang> = Vec::new();
    out.extend(
        objects
            .composites
            .iter()
            .filter(|c| c.spec.parent_composite_pod_group_name.is_none())
            .map(|c| muster_composite(c, objects)),
    );
    out.extend(
        objects
            .pod_groups
            .iter()
            .filter(|g| g.spec.parent_composite_pod_group_name.is_none())
            .map(|g| muster_leaf(g, objects)),
    );
    out.extend(
        objects
            .native_composites
            .iter()
            .filter(|c| c.spec.parent_composite_pod_group_name.is_none())
            .map(|c| native_composite(c, objects)),
    );
    out.extend(
        objects
            .native_groups
            .iter()
            .filter(|g| g.spec.parent_composite_pod_group_name.is_none())
            .map(|g| native_leaf(g, objects)),
    );
    out.sort_by(|a, b| (&a.namespace, &a.name, a.kind.upstream()).cmp(&(&b.namespace, &b.name, b.kind.upstream())));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gangs::fixtures::{at, cond, group, owned_by, status};
    use crate::gangs::{Row, Target, find};
    use muster_api::blocks::DisruptionMode;
    use muster_api::scheduling::{CompositePodGroupStatus, GroupPhase};
    use serde_json::json;

    #[test]
    fn a_composite_is_one_gang_with_its_groups_and_the_set_as_its_job() {
        let mut cpg = CompositePodGroup::new(
            "ray",
            muster_api::CompositePodGroupSpec {
                scheduling_policy: muster_api::blocks::CompositePodGroupSchedulingPolicy::gang(Some(2)),
                disruption_mode: DisruptionMode::single(),
                ..Default::default()
            },
        );
        cpg.metadata.namespace = Some("ns".into());
        cpg.metadata.owner_references = Some(owned_by("MusterJobSet", "ray"));
        cpg.status = Some(CompositePodGroupStatus {
            phase: Some(GroupPhase::Running),
            children: 2,
            quorate_children: 2,
            min_group_count: Some(2),
            conditions: vec![cond(ADMITTED, "True", "Admitted", "placed", 0)],
            ..Default::default()
        });
        let child = |name: &str, min: i32, pods: i32| {
            let mut g = group(
                name,
                min,
                status(GroupPhase::Running, cond(ADMITTED, "True", "Admitted", "", 0), "", (pods, pods, pods)),
            );
            g.spec.parent_composite_pod_group_name = Some("ray".into());
            g
        };
        let objects = Objects {
            composites: vec![cpg],
            pod_groups: vec![child("ray-driver-0", 1, 1), child("ray-workers-0", 4, 4)],
            ..Default::default()
        };
        let gangs = gangs(&objects);
        assert_eq!(gangs.len(), 1, "children are not gangs of their own");
        let row = gangs[0].row(at(0));
        assert_eq!((row.job.as_str(), row.phase.as_str(), row.pods.as_str()), ("MusterJobSet/ray", "Running", "5/5"));
        assert_eq!(gangs[0].children.len(), 2);
        assert_eq!(find(&gangs, Target::Any, "ray-workers-0").map(|g| g.name.as_str()), Some("ray"), "a child's root");
        assert_eq!(find(&gangs, Target::JobSet, "ray").map(|g| g.name.as_str()), Some("ray"));
        assert!(find(&gangs, Target::JobSet, "ray-workers-0").is_none());
    }

    fn native(name: &str, min: i32, verdict: Option<Condition>) -> v1beta1::PodGroup {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "creationTimestamp": "2027-01-15T08:00:00Z"},
            "spec": {"schedulingPolicy": {"gang": {"minCount": min}}},
            "status": {"conditions": verdict.into_iter().collect::<Vec<_>>()},
        }))
        .expect("native PodGroup")
    }

    fn native_pod(name: &str, group: &str, node: Option<&str>, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"containers": [], "nodeName": node, "schedulingGroup": {"podGroupName": group}},
            "status": {"phase": phase},
        }))
        .expect("pod")
    }

    #[test]
    fn native_groups_read_kube_schedulers_verdict_and_their_pods() {
        let unschedulable =
            "0/6 nodes are available: 2 Insufficient nvidia.com/gpu, 4 node(s) had untolerated taint {a: b}.";
        let objects = Objects {
            native_groups: vec![
                native("kv", 3, Some(cond(POD_GROUP_SCHEDULED, "True", "Scheduled", "", 0))),
                native("big", 3, Some(cond(POD_GROUP_SCHEDULED, "False", "Unschedulable", unschedulable, 0))),
                native("fresh", 2, None),
            ],
            pods: vec![
                native_pod("kv-0", "kv", Some("n1"), "Running"),
                native_pod("kv-1", "kv", Some("n1"), "Running"),
                native_pod("kv-2", "kv", Some("n2"), "Pending"),
                native_pod("big-0", "big", None, "Pending"),
            ],
            ..Default::default()
        };
        let rows: Vec<Row> = gangs(&objects).iter().map(|g| g.row(at(60))).collect();
        let by = |n: &str| rows.iter().find(|r| r.name == n).cloned().expect("row");
        assert_eq!(
            (by("kv").phase.as_str(), by("kv").pods.as_str(), by("kv").reason.as_str()),
            ("Running", "3/3", "-")
        );
        assert_eq!(
            (by("big").phase.as_str(), by("big").pods.as_str(), by("big").waiting.as_str(), by("big").reason.as_str()),
            ("Unschedulable", "0/3", "1m0s", "Insufficient nvidia.com/gpu")
        );
        assert_eq!((by("fresh").phase.as_str(), by("fresh").job.as_str()), ("Waiting", "-"));
    }
}

//! Gang admission against kube-scheduler and kwok nodes: a gang is admitted whole or not at
//! all, says why it waits, follows topology and composite constraints, survives a crash in the
//! middle of its commit, and fails cleanly when a pinned pod cannot bind. Each test has its own
//! tainted nodes, so tests running side by side never share capacity.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use muster::controllers::admission::FAULT_EXIT_ENV;
use muster::crds::scheduling::{GroupPhase, PlanState};
use muster::crds::{CompositePodGroup, HOSTNAME_LABEL, PodGroup};
use muster_dev::RACK_LABEL;
use serde_json::json;

use crate::gangs::{
    LONG, TestNodes, all_bound, apply, condition, events_of, gang, gated, gpu_job, group_pods, group_until,
    indices_by_node, indices_of, job_pods, merge, node_of, pin_of,
};
use crate::harness::extra::extra_muster;
use crate::harness::manager::muster;
use crate::harness::{client, kubectl, metric, namespace, wait_for};

fn group_phase(g: &PodGroup) -> Option<GroupPhase> {
    g.status.as_ref()?.phase
}

#[tokio::test]
async fn a_gang_that_fits_is_admitted_whole_and_every_pod_binds_where_it_was_pinned() {
    let _muster = muster().await;
    let ns = namespace("adm-fits");
    let nodes = TestNodes::add(&ns.name, 2, 4, 1).await;
    apply(&ns.name, &gpu_job("train", 8, 1, &nodes, gang(8), json!({})));

    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    let bound = all_bound(&pods, "train", 8).await;
    for p in &bound {
        assert!(!gated(p), "pod {} is bound, so ungated", p.name_any());
        assert_eq!(pin_of(p), node_of(p), "pod {} bound where admission pinned it", p.name_any());
        // The pin's node-name affinity, what kube-scheduler's PreFilter narrows to one node.
        let terms = serde_json::to_value(muster::pods::required_node_terms(p)).expect("terms");
        let want = json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_of(p)]}]}]);
        assert_eq!(terms, want, "pod {} pinned by node name too", p.name_any());
    }
    let by_node = indices_by_node(&bound);
    let want: BTreeMap<String, Vec<u32>> = nodes.names.iter().map(|n| (n.clone(), vec![0, 1, 2, 3])).collect();
    assert_eq!(by_node, want, "each GPU of both nodes given to exactly one pod");

    let groups: Api<PodGroup> = Api::namespaced(client().await, &ns.name);
    let running = group_until(&groups, "train", "Running with 8 pods", |g| {
        g.status.as_ref().is_some_and(|s| s.phase == Some(GroupPhase::Running) && s.running == 8)
    })
    .await;
    let admitted = condition(&running, "Admitted").expect("Admitted condition");
    assert_eq!((admitted.status.as_str(), admitted.reason.as_str()), ("True", "Admitted"));
    // The event is sent in the background when the commit is booked: it may come after the
    // status, so wait for it.
    wait_for("a Normal Admitted event for the 8 pods", LONG, || async {
        let events = events_of(&ns.name, "train").await;
        events.iter().any(|(t, r, m)| t == "Normal" && r == "Admitted" && m.contains("admitted 8 pod(s)")).then_some(())
    })
    .await;

    // `kubectl get podgroups` would show the upstream kind here (GenericWorkload is on).
    for resource in ["mpg", "podgroups.scheduling.muster.dev"] {
        let table = kubectl(&["-n", &ns.name, "get", resource]);
        let mut lines = table.lines();
        let header: Vec<&str> = lines.next().unwrap_or_default().split_whitespace().collect();
        assert_eq!(header, ["NAME", "MIN", "PODS", "ADMITTED", "RUNNING", "PHASE", "REASON", "AGE"], "{table}");
        let row: Vec<&str> = lines.next().unwrap_or_default().split_whitespace().collect();
        assert_eq!(row[..6], ["train", "8", "8", "8", "8", "Running"], "{table}");
    }

    // muster names itself (its User-Agent): the API server makes it the field manager of its
    // writes that name none, the group's plan and status and the pods it made.
    let group = groups.get("train").await.expect("group");
    let managers = managers_of(&group.metadata);
    assert!(managers.contains(&"muster/status".to_string()), "{managers:?}");
    assert!(managers.iter().all(|m| !m.starts_with("unknown/")), "{managers:?}");
    for p in &bound {
        let pod = pods.get(&p.name_any()).await.expect("pod");
        let managers = managers_of(&pod.metadata);
        assert!(managers.contains(&"muster/".to_string()), "pod {}: {managers:?}", p.name_any());
        assert!(managers.iter().all(|m| !m.starts_with("unknown/")), "pod {}: {managers:?}", p.name_any());
    }
}

/// The field managers of an object's `managedFields`, each as `manager/subresource`.
fn managers_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Vec<String> {
    meta.managed_fields
        .iter()
        .flatten()
        .map(|e| {
            format!("{}/{}", e.manager.as_deref().unwrap_or_default(), e.subresource.as_deref().unwrap_or_default())
        })
        .collect()
}

#[tokio::test]
async fn a_gang_too_big_binds_nothing_says_why_and_is_admitted_once_a_node_is_added() {
    let muster = muster().await;
    let ns = namespace("adm-too-big");
    let mut nodes = TestNodes::add(&ns.name, 2, 4, 1).await;
    apply(&ns.name, &gpu_job("wide", 9, 1, &nodes, gang(9), json!({})));

    let groups: Api<PodGroup> = Api::namespaced(client().await, &ns.name);
    let waiting =
        group_until(&groups, "wide", "Unschedulable", |g| group_phase(g) == Some(GroupPhase::Unschedulable)).await;
    let status = waiting.status.clone().unwrap();
    let message = status.message.clone().unwrap_or_default();
    assert!(message.contains("group \"wide\" (only 8 placeable, minCount 9)"), "{message}");
    // Its 2 nodes fit 8 pods; every other node is excluded by its selector: not enough capacity.
    let text = muster.metrics().await;
    let attempts = metric(&text, "muster_unschedulable_attempts_total", &[("reason", "InsufficientCapacity")]);
    assert!(attempts >= 1.0, "unschedulable attempts by reason: {text}");
    let admitted = condition(&waiting, "Admitted").expect("Admitted condition");
    assert_eq!(
        (admitted.status.as_str(), admitted.reason.as_str(), admitted.message.as_str()),
        ("False", "Unschedulable", message.as_str())
    );
    assert_eq!((status.pods, status.gated, status.admitted, status.scheduled), (9, 9, 0, 0));
    // The short reason, `kubectl get mpg`'s REASON column.
    assert_eq!(status.reason.as_deref(), Some("InsufficientCapacity"));
    let table = kubectl(&["-n", &ns.name, "get", "mpg", "wide"]);
    assert!(table.lines().nth(1).is_some_and(|row| row.contains("Unschedulable   InsufficientCapacity")), "{table}");
    // Nodes other tests add change the node count in the message; each change is a new event,
    // written just after the status, so wait for the one that matches.
    wait_for("an Unschedulable event with the status message", LONG, || async {
        let current = groups.get("wide").await.ok()?.status?.message?;
        let events = events_of(&ns.name, "wide").await;
        events.iter().any(|(t, r, m)| t == "Warning" && r == "Unschedulable" && *m == current).then_some(())
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    let held = job_pods(&pods, "wide").await;
    assert_eq!(held.len(), 9);
    for p in &held {
        assert!(gated(p) && pin_of(p).is_none() && node_of(p).is_none(), "pod {} was let go", p.name_any());
    }

    let added = nodes.add_more(1).await;
    let bound = all_bound(&pods, "wide", 9).await;
    let used: BTreeSet<&str> = bound.iter().filter_map(node_of).collect();
    assert!(used.contains(added[0].as_str()), "the new node took the ninth pod: {used:?}");
    group_until(&groups, "wide", "Admitted=True", |g| condition(g, "Admitted").is_some_and(|c| c.status == "True"))
        .await;
}

#[tokio::test]
async fn a_rack_constrained_gang_lands_in_one_rack_or_waits() {
    let _muster = muster().await;
    let ns = namespace("adm-rack");
    // Nodes 0 and 2 in rack-0, 1 and 3 in rack-1: 8 GPUs per rack, 16 in all.
    let nodes = TestNodes::add(&ns.name, 4, 4, 2).await;
    let rack = json!({"schedulingConstraints": {"topology": [{"key": RACK_LABEL}]}});
    let mut nine = gang(9);
    merge(&mut nine, rack.clone());
    apply(&ns.name, &gpu_job("nine", 9, 1, &nodes, nine, json!({})));
    let groups: Api<PodGroup> = Api::namespaced(client().await, &ns.name);
    let waiting =
        group_until(&groups, "nine", "Unschedulable", |g| group_phase(g) == Some(GroupPhase::Unschedulable)).await;
    let message = waiting.status.and_then(|s| s.message).unwrap_or_default();
    assert!(message.contains(RACK_LABEL), "16 GPUs are free, but no rack has 9: {message}");

    let mut eight = gang(8);
    merge(&mut eight, rack);
    apply(&ns.name, &gpu_job("eight", 8, 1, &nodes, eight, json!({})));
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    let bound = all_bound(&pods, "eight", 8).await;
    let all_nodes: BTreeMap<String, Node> = {
        let api: Api<Node> = Api::all(client().await);
        let mut m = BTreeMap::new();
        for n in &nodes.names {
            m.insert(n.clone(), api.get(n).await.unwrap());
        }
        m
    };
    let racks: BTreeSet<&str> =
        bound.iter().map(|p| all_nodes[node_of(p).unwrap()].labels()[RACK_LABEL].as_str()).collect();
    assert_eq!(racks.len(), 1, "the gang spans racks {racks:?}");
    let used: BTreeSet<&str> = bound.iter().filter_map(node_of).collect();
    assert_eq!(used.len(), 2, "8 one-GPU pods on 4-GPU nodes need both nodes of the rack: {used:?}");
    assert!(job_pods(&pods, "nine").await.iter().all(gated), "the 9-pod gang still waits");
}

#[tokio::test]
async fn a_composite_gang_is_admitted_only_when_every_child_fits() {
    let _muster = muster().await;
    let ns = namespace("adm-composite");
    let mut nodes = TestNodes::add(&ns.name, 1, 4, 1).await;
    let pod = |gpus: u32| {
        let mut spec = json!({
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "registry.invalid/none",
                "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}],
        });
        merge(&mut spec, nodes.placement());
        json!({"spec": spec})
    };
    // The workers alone would fit the node's 4 GPUs; with the driver they need 5.
    let set = json!({
        "apiVersion": "batch.muster.dev/v1alpha1",
        "kind": "MusterJobSet",
        "metadata": {"name": "pair"},
        "spec": {
            "scheduling": {"schedulingPolicy": {"gang": {}}},
            "replicatedJobs": [
                {"name": "driver", "template": {"spec": {"template": pod(1)}}},
                {"name": "workers", "template": {"spec": {
                    "parallelism": 4, "completions": 4, "completionMode": "Indexed",
                    "scheduling": {"schedulingPolicy": {"gang": {}}},
                    "template": pod(1)}}},
            ],
        },
    });
    apply(&ns.name, &set);

    let composites: Api<CompositePodGroup> = Api::namespaced(client().await, &ns.name);
    let waiting = wait_for("CompositePodGroup pair Unschedulable", LONG, || async {
        let c = composites.get_opt("pair").await.ok().flatten()?;
        (c.status.as_ref()?.phase == Some(GroupPhase::Unschedulable)).then_some(c)
    })
    .await;
    let status = waiting.status.unwrap();
    assert_eq!((status.children, status.quorate_children, status.admitted_children), (2, 2, 0));
    let message = status.message.unwrap_or_default();
    assert!(message.contains("composite group \"pair\""), "{message}");
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    let mut all = group_pods(&pods, "pair-driver-0").await;
    all.extend(group_pods(&pods, "pair-workers-0").await);
    assert_eq!(all.len(), 5);
    assert!(all.iter().all(gated), "no child is admitted alone");

    nodes.add_more(1).await;
    let bound = wait_for("all 5 pods of the set bound", LONG, || async {
        let mut all = group_pods(&pods, "pair-driver-0").await;
        all.extend(group_pods(&pods, "pair-workers-0").await);
        (all.len() == 5 && all.iter().all(|p| node_of(p).is_some())).then_some(all)
    })
    .await;
    let gpus: usize = indices_by_node(&bound).values().map(Vec::len).sum();
    assert_eq!(gpus, 5);
    wait_for("CompositePodGroup pair with both children admitted", LONG, || async {
        let s = composites.get_opt("pair").await.ok().flatten()?.status?;
        (s.admitted_children == 2).then_some(())
    })
    .await;
}

/// The commit protocol: muster exits (test hook) after 3 of 8 pod patches; the plan on the
/// PodGroup says what was decided, and the restarted muster finishes that very plan.
/// muster stays down longer than the restarted one's bind timeout, and a second gate of the
/// test's keeps the pods from binding for a while after it resumes: the pods it ungates then
/// still get the whole timeout to bind, counted from the resume, not from the plan.
#[tokio::test]
async fn a_crash_between_pod_patches_ends_with_the_whole_gang_admitted_as_planned() {
    let mut extra = extra_muster(&[], &[(FAULT_EXIT_ENV, "3")]).await;
    let ns = namespace("adm-crash");
    let nodes = TestNodes::add(&ns.name, 2, 4, 1).await;
    let mut job = gpu_job("crash", 8, 1, &nodes, gang(8), json!({}));
    merge(&mut job, json!({"spec": {"template": {"spec": {"schedulingGates": [{"name": "e2e.muster.dev/hold"}]}}}}));
    apply(&ns.name, &job);
    let status = extra.exited(LONG).await;
    assert_eq!(status.code(), Some(3), "muster exits through the test hook");

    let groups: Api<PodGroup> = Api::namespaced(client().await, &ns.name);
    let plan = groups.get("crash").await.unwrap().status.and_then(|s| s.plan).expect("a plan on the PodGroup");
    assert_eq!(plan.state, PlanState::Committing);
    assert_eq!(plan.pods.len(), 8);
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    let half = job_pods(&pods, "crash").await;
    let planned: BTreeMap<&str, _> = plan.pods.iter().map(|p| (p.uid.as_str(), p)).collect();
    let ungated: Vec<&Pod> = half.iter().filter(|p| !gated(p)).collect();
    assert_eq!(ungated.len(), 3, "exactly the patched pods are ungated");
    for p in &ungated {
        let want = planned[p.uid().unwrap().as_str()];
        assert_eq!((pin_of(p), indices_of(p)), (Some(want.pin_hostname()), want.gpu_indices.as_deref()));
    }

    tokio::time::sleep(Duration::from_secs(10)).await;
    extra.start(&["--bind-timeout", "8"], &[]).await;
    let resumed = wait_for("all 8 pods ungated by the restarted muster", LONG, || async {
        let live = job_pods(&pods, "crash").await;
        (live.len() == 8 && !live.iter().any(gated)).then_some(live)
    })
    .await;
    // The plan is 10 s old, beyond the bind timeout; the resume was just now.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let plan = groups.get("crash").await.unwrap().status.and_then(|s| s.plan);
    assert_eq!(plan.map(|p| p.state), Some(PlanState::Admitted), "the watchdog must wait for the resumed pods");
    for p in &resumed {
        let patch = json!([{"op": "remove", "path": "/spec/schedulingGates/0"}]);
        let patch: json_patch::Patch = serde_json::from_value(patch).unwrap();
        pods.patch(&p.name_any(), &PatchParams::default(), &Patch::<()>::Json(patch)).await.unwrap();
    }
    let bound = all_bound(&pods, "crash", 8).await;
    for p in &bound {
        let want = planned
            .get(p.uid().unwrap().as_str())
            .unwrap_or_else(|| panic!("pod {} is not one of the plan", p.name_any()));
        assert_eq!(node_of(p), Some(want.node.as_str()), "pod {}", p.name_any());
        assert_eq!(indices_of(p), want.gpu_indices.as_deref(), "pod {}", p.name_any());
    }
    assert_eq!(indices_by_node(&bound).values().map(Vec::len).sum::<usize>(), 8);
    let done = group_until(&groups, "crash", "Admitted=True", |g| {
        condition(g, "Admitted").is_some_and(|c| c.status == "True")
    })
    .await;
    let admitted = condition(&done, "Admitted").unwrap();
    assert!(admitted.message.contains("commit resumed"), "resumed, not planned afresh: {}", admitted.message);
}

/// A commit resumed after a crash counts the pods it pins before anything else is planned in
/// the same cycle: a gang that fits only in the space of the resumed pods must keep waiting.
#[tokio::test]
async fn a_resumed_commit_counts_its_pods_before_another_gang_is_planned() {
    let mut extra = extra_muster(&[], &[(FAULT_EXIT_ENV, "2")]).await;
    let ns = namespace("adm-resume");
    let nodes = TestNodes::add(&ns.name, 1, 4, 1).await;
    let node = nodes.names[0].clone();
    // "late" selects a label the node gets only while muster is down: until then it cannot fit.
    let mut late = gpu_job("late", 2, 1, &nodes, gang(2), json!({}));
    merge(&mut late, json!({"spec": {"template": {"spec": {"nodeSelector": {"e2e.muster.dev/late": "yes"}}}}}));
    apply(&ns.name, &late);
    let groups: Api<PodGroup> = Api::namespaced(client().await, &ns.name);
    group_until(&groups, "late", "Unschedulable", |g| group_phase(g) == Some(GroupPhase::Unschedulable)).await;

    apply(&ns.name, &gpu_job("first", 4, 1, &nodes, gang(4), json!({})));
    assert_eq!(extra.exited(LONG).await.code(), Some(3), "muster exits after 2 of first's 4 pod patches");
    kubectl(&["label", "node", &node, "e2e.muster.dev/late=yes"]);

    extra.start(&[], &[]).await;
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    let first = all_bound(&pods, "first", 4).await;
    assert_eq!(indices_by_node(&first)[&node], [0, 1, 2, 3]);
    // With first's pods counted, nothing is left for late: it stays gated, whatever the restart
    // decided in its first cycle.
    for p in job_pods(&pods, "late").await {
        let (pin, indices) = (pin_of(&p), indices_of(&p));
        assert!(gated(&p) && pin.is_none(), "late was admitted into first's GPUs: {pin:?} {indices:?}");
    }
    group_until(&groups, "late", "Unschedulable, said by the restarted muster", |g| {
        group_phase(g) == Some(GroupPhase::Unschedulable)
            && g.status.as_ref().and_then(|s| s.message.as_deref()).is_some_and(|m| m.contains("Insufficient"))
    })
    .await;
}

/// The bind watchdog. The gang's pods carry a second gate of the test's, so the test can let a
/// plain pod take one node's GPUs between admission and binding (the race the watchdog exists
/// for) before kube-scheduler sees them: one pod binds, the other cannot, and the gang fails
/// whole; with disruptionMode all its pods are replaced and wait, gated, again.
#[tokio::test]
async fn a_pinned_pod_that_cannot_bind_rolls_the_attempt_back_and_it_is_recreated_gated() {
    let extra = extra_muster(&["--bind-timeout", "10"], &[]).await;
    let ns = namespace("adm-bind");
    let nodes = TestNodes::add(&ns.name, 2, 4, 1).await;
    let mut scheduling = gang(2);
    merge(&mut scheduling, json!({"disruptionMode": {"all": {}}}));
    let mut job = gpu_job("stuck", 2, 4, &nodes, scheduling, json!({}));
    merge(&mut job, json!({"spec": {"template": {"spec": {"schedulingGates": [{"name": "e2e.muster.dev/hold"}]}}}}));
    apply(&ns.name, &job);

    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    let admitted = wait_for("both pods admitted (muster's gate gone, pinned)", LONG, || async {
        let live = job_pods(&pods, "stuck").await;
        (live.len() == 2 && live.iter().all(|p| !gated(p) && pin_of(p).is_some())).then_some(live)
    })
    .await;
    let original: BTreeSet<String> = admitted.iter().filter_map(|p| p.uid()).collect();
    let taken = pin_of(&admitted[1]).unwrap().to_string();

    let mut squatter: Pod = serde_json::from_value(json!({
        "metadata": {"name": "squatter"},
        "spec": {"restartPolicy": "Never", "nodeSelector": {HOSTNAME_LABEL: taken},
            "containers": [{"name": "main", "image": "registry.invalid/none",
                "resources": {"limits": {"nvidia.com/gpu": "4"}}}]},
    }))
    .unwrap();
    let placement: Pod = serde_json::from_value(json!({"spec": nodes.placement()})).unwrap();
    squatter.spec.as_mut().unwrap().tolerations = placement.spec.unwrap().tolerations;
    pods.create(&PostParams::default(), &squatter).await.unwrap();
    wait_for("the plain pod bound", LONG, || async { node_of(&pods.get("squatter").await.ok()?).map(|_| ()) }).await;
    for p in &admitted {
        let patch = json!([{"op": "remove", "path": "/spec/schedulingGates/0"}]);
        let patch: json_patch::Patch = serde_json::from_value(patch).unwrap();
        pods.patch(&p.name_any(), &PatchParams::default(), &Patch::<()>::Json(patch)).await.unwrap();
    }
    wait_for("the other pod bound (half the gang started)", LONG, || async {
        node_of(&pods.get(&admitted[0].name_any()).await.ok()?).map(|_| ())
    })
    .await;

    let groups: Api<PodGroup> = Api::namespaced(client().await, &ns.name);
    let failed = group_until(&groups, "stuck", "BindFailed=True", |g| {
        condition(g, "BindFailed").is_some_and(|c| c.status == "True")
    })
    .await;
    let bind_failed = condition(&failed, "BindFailed").unwrap();
    // Half the gang ran, below minCount: the attempt is rolled back, whatever the mode.
    assert_eq!(bind_failed.reason, "BindFailed");
    let message = &bind_failed.message;
    assert!(message.contains(&format!("was not bound to node {taken} within 10s")), "{message}");
    assert!(message.contains("Insufficient nvidia.com/gpu"), "kube-scheduler's reason: {message}");
    assert!(message.contains("rolled back"), "{message}");
    let status = failed.status.as_ref().unwrap();
    assert_eq!(status.rollbacks, 1, "{status:?}");
    assert!(status.avoid_nodes.iter().any(|a| a.node == taken), "the refusing node is avoided: {status:?}");
    let events = events_of(&ns.name, "stuck").await;
    assert!(events.iter().any(|(t, r, _)| t == "Warning" && r == "BindFailed"), "{events:?}");

    let replaced = wait_for("two new pods, held by muster's gate", LONG, || async {
        let live = job_pods(&pods, "stuck").await;
        let new = live.iter().all(|p| p.uid().is_some_and(|u| !original.contains(&u)));
        (live.len() == 2 && new && live.iter().all(gated)).then_some(live)
    })
    .await;
    assert!(replaced.iter().all(|p| node_of(p).is_none()), "the running half was not kept");
    assert!(
        replaced
            .iter()
            .all(|p| p.annotations().get("scheduling.muster.dev/gang-attempt").map(String::as_str) == Some("1")),
        "recreated pods carry the new attempt"
    );
    // Only one node has 4 free GPUs now: the new gang waits instead of starting half.
    group_until(&groups, "stuck", "Unschedulable", |g| group_phase(g) == Some(GroupPhase::Unschedulable)).await;
    // The plain pod gets the GPUs the failed gang held (a conflict while both claimed them).
    let squatter = wait_for("GPU indices on the plain pod", LONG, || async {
        let p = pods.get("squatter").await.ok()?;
        indices_of(&p).is_some().then_some(p)
    })
    .await;
    assert_eq!(indices_of(&squatter), Some("0,1,2,3"));
    let events = events_of(&ns.name, "squatter").await;
    assert!(events.iter().any(|(t, r, _)| t == "Warning" && r == "GPUConflict"), "{events:?}");
    let metrics = extra.metrics().await;
    assert_eq!(metric(&metrics, "muster_bind_timeouts_total", &[]), 1.0, "{metrics}");
    assert_eq!(metric(&metrics, "muster_gang_rollbacks_total", &[]), 1.0, "{metrics}");
    assert!(metric(&metrics, "muster_gpu_conflicts_total", &[]) >= 1.0, "{metrics}");
}

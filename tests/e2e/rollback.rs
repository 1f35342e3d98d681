//! A pin that kube-scheduler refuses rolls the whole attempt back (issue 14), one test per cause
//! and disruption mode. The expected behaviour: when a pinned pod does not bind within the bind
//! timeout and fewer than minCount pods of the attempt run, every pod of the attempt (the bound
//! ones too) is deleted and recreated gated, marked with the annotation
//! `scheduling.muster.dev/gang-attempt`; the PodGroup gets a `BindFailed` event carrying
//! kube-scheduler's message; the next plan avoids the node that refused. The gang then ends
//! fully bound elsewhere, or fully gated and `Unschedulable` with kube-scheduler's reason, never
//! partly bound, in `single` as in `all` mode.
//!
//! The causes:
//! - the pinned node is deleted after the pin and before the bind;
//! - a plain pod takes the pinned node's GPUs between the pin and the bind;
//! - a constraint placement does not model: the CSI volume limit of a node (kube-scheduler's
//!   NodeVolumeLimits plugin, in the default profile, reads `CSINode.spec.drivers[].allocatable.count`).
//!   Issue 14 extends placement to inter-pod rules, spread, ports, overhead and volume node
//!   affinity, but not to per-node attach limits, and this control plane enforces them for any
//!   PV with a `csi` source, with no driver running.
//!
//! For the first two the window between pin and bind is made reliable by a second scheduling
//! gate of the test's own on the pod template: muster removes its gate and pins, the test
//! changes the world, then removes its gate. The pods a rollback recreates carry that gate too
//! (it is in the template); the test lets those go as soon as muster has admitted them.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use muster::crds::scheduling::{GroupPhase, PodGroupStatus};
use muster::crds::{MusterJob, PodGroup};
use muster_dev::FakeGpuNodes;
use serde_json::{Value, json};

use crate::gangs::{LONG, apply, events_of, gated, job_pods, merge, node_of, pin_of};
use crate::harness::extra::extra_muster;
use crate::harness::pools::{NodePool, POOL_LABEL};
use crate::harness::{TestNamespace, client, cluster, kubectl, namespace, wait_for};

/// The test's own scheduling gate.
const HOLD: &str = "e2e.muster.dev/hold";
/// The annotation a rolled-back attempt's recreated pods carry.
const ATTEMPT_ANNOTATION: &str = "scheduling.muster.dev/gang-attempt";
/// muster's bind timeout in these tests (seconds).
const BIND_TIMEOUT: u64 = 10;
/// How long the rollback may take to reach its end state (bind timeout, rollback, a new plan,
/// maybe a repeated refusal with backoff).
const SETTLED: Duration = Duration::from_secs(180);
const CSI_DRIVER: &str = "csi.e2e.muster.dev";
const JOB: &str = "train";
const PODS: usize = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cause {
    NodeDeleted,
    CapacityTaken,
    VolumeLimit,
}

impl Cause {
    fn short(self) -> &'static str {
        match self {
            Cause::NodeDeleted => "node-deleted",
            Cause::CapacityTaken => "capacity-taken",
            Cause::VolumeLimit => "volume-limit",
        }
    }

    /// What kube-scheduler says about the refused pod (and muster must pass on).
    /// What muster's BindFailed event says: kube-scheduler's refusal, or for a deleted node
    /// muster's own finding (it rolls back as soon as the node is gone, before any refusal).
    fn muster_words(self) -> &'static str {
        match self {
            Cause::NodeDeleted => "which no longer exists",
            other => other.scheduler_reason(),
        }
    }

    fn scheduler_reason(self) -> &'static str {
        match self {
            Cause::NodeDeleted => "didn't match Pod's node affinity/selector",
            Cause::CapacityTaken => "Insufficient nvidia.com/gpu",
            Cause::VolumeLimit => "exceed max volume count",
        }
    }
}

/// Volume objects of one test, deleted (protection finalizers first: no controller here
/// removes them) when dropped: `(namespace or "", kind/name)`.
struct VolumeObjects(Vec<(String, String)>);

impl Drop for VolumeObjects {
    fn drop(&mut self) {
        const NO_FINALIZERS: &str = r#"{"metadata":{"finalizers":null}}"#;
        for (ns, o) in &self.0 {
            let mut at: Vec<&str> = if ns.is_empty() { vec![] } else { vec!["-n", ns] };
            at.extend(["patch", o, "--type=merge", "-p", NO_FINALIZERS]);
            let _ = cluster().kubectl(&at);
            if ns.is_empty() {
                let _ = cluster().kubectl(&["delete", o, "--wait=false", "--ignore-not-found"]);
            }
        }
    }
}

/// A bound PVC `data` in `ns` on a CSI PV, and a CSINode allowing no volume of that driver on
/// `limited`. Returns what to clean up.
fn volume_limit(ns: &TestNamespace, limited: &str) -> VolumeObjects {
    let pv = format!("{}-data", ns.name);
    let objects = [
        json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": pv, "labels": {POOL_LABEL: ns.name}},
            "spec": {"capacity": {"storage": "100Gi"}, "accessModes": ["ReadWriteMany"],
                "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                "csi": {"driver": CSI_DRIVER, "volumeHandle": format!("vol-{}", ns.name)},
                "claimRef": {"namespace": ns.name, "name": "data"}}}),
        // Bound as the PV controller (not running here) would leave it.
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data", "namespace": ns.name,
                "annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
            "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": pv,
                "resources": {"requests": {"storage": "100Gi"}}}}),
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {"name": limited},
            "spec": {"drivers": [{"name": CSI_DRIVER, "nodeID": limited, "allocatable": {"count": 0}}]}}),
    ];
    for o in objects {
        cluster().kubectl_stdin(&["create", "-f", "-"], Some(&o.to_string())).unwrap_or_else(|e| panic!("{e}"));
    }
    VolumeObjects(vec![
        (ns.name.clone(), "pvc/data".into()),
        (String::new(), format!("csinode/{limited}")),
        (String::new(), format!("pv/{pv}")),
    ])
}

/// The gang: 2 pods of 8 GPUs on `pool`, minCount 2, disruption mode `mode`.
fn gang_job(pool: &NodePool, mode: &str, hold: bool, volume: bool) -> Value {
    let mut spec = json!({
        "restartPolicy": "Never",
        "containers": [{"name": "trainer", "image": "registry.invalid/trainer:1",
            "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
    });
    merge(&mut spec, pool.placement());
    if hold {
        merge(&mut spec, json!({"schedulingGates": [{"name": HOLD}]}));
    }
    if volume {
        merge(&mut spec, json!({"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}));
    }
    json!({
        "apiVersion": "batch.muster.dev/v1alpha1",
        "kind": "MusterJob",
        "metadata": {"name": JOB},
        "spec": {
            "parallelism": PODS, "completions": PODS, "completionMode": "Indexed",
            "scheduling": {"schedulingPolicy": {"gang": {"minCount": PODS}}, "disruptionMode": {mode: {}}},
            "template": {"spec": spec},
        },
    })
}

fn held(p: &Pod) -> Option<usize> {
    p.spec.as_ref()?.scheduling_gates.as_ref()?.iter().position(|g| g.name == HOLD)
}

/// Removes the test's gate from every pod muster has admitted (its own gate gone).
async fn release_admitted(pods: &Api<Pod>) {
    for p in job_pods(pods, JOB).await {
        if let (false, Some(i)) = (gated(&p), held(&p)) {
            let patch = json!([
                {"op": "test", "path": format!("/spec/schedulingGates/{i}/name"), "value": HOLD},
                {"op": "remove", "path": format!("/spec/schedulingGates/{i}")},
            ]);
            let patch: json_patch::Patch = serde_json::from_value(patch).expect("json patch");
            let _ = pods.patch(&p.name_any(), &PatchParams::default(), &Patch::<()>::Json(patch)).await;
        }
    }
}

/// kube-scheduler's `PodScheduled=False` message on a pod.
/// kube-scheduler's refusal of a pod; a `SchedulingGated` condition left from the test's own
/// gate is none (kube-scheduler has not tried the pod yet).
fn refusal(p: &Pod) -> Option<String> {
    let c = p.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "PodScheduled")?;
    (c.status == "False" && c.reason.as_deref() != Some("SchedulingGated"))
        .then(|| c.message.clone().unwrap_or_default())
}

/// How the gang ended.
#[derive(Debug)]
enum End {
    /// Every pod of a new attempt bound.
    Bound(Vec<Pod>),
    /// Every pod of a new attempt gated by muster, the PodGroup Unschedulable with this message.
    Unschedulable(Vec<Pod>, String),
}

/// The end state, if the gang is in one: `PODS` pods, none of the first attempt, all bound or
/// all gated with the PodGroup Unschedulable.
fn settled(live: Vec<Pod>, original: &BTreeSet<String>, status: Option<&PodGroupStatus>) -> Option<End> {
    if live.len() != PODS || live.iter().any(|p| p.uid().is_some_and(|u| original.contains(&u))) {
        return None;
    }
    if live.iter().all(|p| node_of(p).is_some()) {
        return Some(End::Bound(live));
    }
    let status = status?;
    let waiting =
        status.phase == Some(GroupPhase::Unschedulable) && live.iter().all(|p| gated(p) && node_of(p).is_none());
    waiting.then(|| End::Unschedulable(live, status.message.clone().unwrap_or_default()))
}

/// Where the gang's pods and its PodGroup stand, for a failure message.
fn describe(live: &[Pod], original: &BTreeSet<String>, status: Option<&PodGroupStatus>) -> String {
    let pods: Vec<String> = live
        .iter()
        .map(|p| {
            let first = p.uid().is_some_and(|u| original.contains(&u));
            format!(
                "{} ({}, bound {:?}, pinned {:?}, gated {}, {ATTEMPT_ANNOTATION} {:?})",
                p.name_any(),
                if first { "first attempt" } else { "new" },
                node_of(p),
                pin_of(p),
                gated(p),
                p.annotations().get(ATTEMPT_ANNOTATION)
            )
        })
        .collect();
    let group = status.map(|s| format!("{:?}: {}", s.phase, s.message.clone().unwrap_or_default()));
    format!("pods [{}]; PodGroup {group:?}", pods.join(", "))
}

async fn rollback(cause: Cause, mode: &str) {
    let extra = extra_muster(&["--bind-timeout", &BIND_TIMEOUT.to_string()], &[]).await;
    let ns = namespace(&format!("rb-{}-{mode}", cause.short()));
    let what = format!("rollback after {} ({mode})", cause.short());
    // Volume limit: two nodes, so the first plan must use the limited one; else a spare node.
    let count = if cause == Cause::VolumeLimit { 2 } else { 3 };
    let shape = FakeGpuNodes { count, gpus: 8, racks: 1, zones: 1, ..FakeGpuNodes::default() };
    let pool = NodePool::add(&ns.name, &shape).await;
    let _objects = if cause == Cause::VolumeLimit { Some(volume_limit(&ns, &pool.nodes[0])) } else { None };
    let hold = cause != Cause::VolumeLimit;
    apply(&ns.name, &gang_job(&pool, mode, hold, cause == Cause::VolumeLimit));

    let c = client().await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), &ns.name);
    let groups: Api<PodGroup> = Api::namespaced(c.clone(), &ns.name);
    let jobs: Api<MusterJob> = Api::namespaced(c.clone(), &ns.name);
    let first = wait_for(&format!("{what}: both pods admitted and pinned"), LONG, || async {
        let live = job_pods(&pods, JOB).await;
        (live.len() == PODS && live.iter().all(|p| !gated(p) && pin_of(p).is_some())).then_some(live)
    })
    .await;
    let original: BTreeSet<String> = first.iter().filter_map(|p| p.uid()).collect();
    let pins: Vec<String> = first.iter().map(|p| pin_of(p).unwrap_or_default().to_string()).collect();
    assert_ne!(pins[0], pins[1], "{what}: two 8-GPU pods pinned to one 8-GPU node: {pins:?}");

    // The node that will refuse, and the pod pinned there.
    let (refusing, refused_pod, other_pod) = match cause {
        Cause::VolumeLimit => {
            let i = pins.iter().position(|p| *p == pool.nodes[0]).expect("a pod pinned to the limited node");
            (pool.nodes[0].clone(), first[i].name_any(), first[1 - i].name_any())
        }
        _ => (pins[1].clone(), first[1].name_any(), first[0].name_any()),
    };
    match cause {
        Cause::NodeDeleted => {
            kubectl(&["delete", "node", &refusing, "--wait=true", "--timeout=30s"]);
        }
        Cause::CapacityTaken => {
            let mut spec = json!({"restartPolicy": "Never", "nodeName": refusing,
                "containers": [{"name": "main", "image": "registry.invalid/none",
                    "resources": {"limits": {"nvidia.com/gpu": "8"}}}]});
            merge(&mut spec, json!({"tolerations": pool.placement()["tolerations"].clone()}));
            let squatter: Pod =
                serde_json::from_value(json!({"metadata": {"name": "squatter"}, "spec": spec})).unwrap();
            pods.create(&PostParams::default(), &squatter).await.unwrap_or_else(|e| panic!("{what}: squatter: {e}"));
            wait_for(&format!("{what}: the plain pod running on {refusing}"), LONG, || async {
                let p = pods.get("squatter").await.ok()?;
                (p.status?.phase.as_deref() == Some("Running")).then_some(())
            })
            .await;
        }
        Cause::VolumeLimit => {}
    }
    if hold {
        release_admitted(&pods).await;
    }
    // The setup itself: the attempt is half started, and kube-scheduler refuses the other pod.
    // A deleted node needs no refusal: muster sees the pin can never bind and rolls back at
    // once, often before kube-scheduler has tried (or the other pod bound), so that setup is
    // checked by the end state alone.
    if cause != Cause::NodeDeleted {
        check_setup(&pods, &what, &other_pod, &refused_pod, &refusing, cause).await;
    }

    // The rollback: no pod of the first attempt survives, and the new attempt ends whole.
    let deadline = Instant::now() + SETTLED;
    let end = loop {
        if hold {
            release_admitted(&pods).await;
        }
        let live = job_pods(&pods, JOB).await;
        let status = groups.get_opt(JOB).await.ok().flatten().and_then(|g| g.status);
        if let Some(end) = settled(live.clone(), &original, status.as_ref()) {
            break end;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: no whole end state (a new attempt fully bound, or fully gated and Unschedulable) within \
             {SETTLED:?}; now: {} (log {})",
            describe(&live, &original, status.as_ref()),
            extra.log.display()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let new = match &end {
        End::Bound(p) | End::Unschedulable(p, _) => p,
    };
    for p in new {
        assert!(
            p.annotations().contains_key(ATTEMPT_ANNOTATION),
            "{what}: recreated pod {} lacks {ATTEMPT_ANNOTATION}: {:?}",
            p.name_any(),
            p.annotations()
        );
    }
    match (&end, cause) {
        (End::Bound(bound), Cause::NodeDeleted | Cause::CapacityTaken) => {
            let used: BTreeSet<&str> = bound.iter().filter_map(node_of).collect();
            assert!(!used.contains(refusing.as_str()), "{what}: the new attempt went back to {refusing}: {used:?}");
            assert_eq!(used.len(), PODS, "{what}: one 8-GPU pod per node: {used:?}");
        }
        (End::Unschedulable(_, message), Cause::VolumeLimit) => {
            // Only the limited node and one other: the gang cannot start, and says why: its
            // message names the avoided node's refusal, its BindFailed condition quotes it.
            let group = groups.get(JOB).await.expect("PodGroup");
            let bind_failed = group
                .status
                .as_ref()
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == "BindFailed" && c.status == "True"))
                .map(|c| c.message.clone())
                .unwrap_or_default();
            assert!(
                message.contains("refused this gang's pods in an earlier attempt")
                    && (bind_failed.contains(cause.scheduler_reason()) || bind_failed.contains(&refusing)),
                "{what}: the PodGroup should carry kube-scheduler's reason or name {refusing}: {message}; BindFailed: {bind_failed}"
            );
        }
        (End::Bound(bound), Cause::VolumeLimit) => {
            let used: Vec<Option<&str>> = bound.iter().map(node_of).collect();
            panic!("{what}: bound although only {} can take a pod: {used:?}", pool.nodes[1])
        }
        (End::Unschedulable(_, message), _) => {
            panic!("{what}: a spare node was left, yet the gang waits: {message}")
        }
    }

    // The PodGroup says what failed, with kube-scheduler's words.
    let events = events_of(&ns.name, JOB).await;
    assert!(
        events.iter().any(|(t, r, m)| t == "Warning" && r == "BindFailed" && m.contains(cause.muster_words())),
        "{what}: a Warning BindFailed event on PodGroup {JOB} with kube-scheduler's message {:?}; events: {events:?}",
        cause.scheduler_reason()
    );
    // A rollback is not a pod failure.
    let job = jobs.get(JOB).await.unwrap_or_else(|e| panic!("{what}: MusterJob: {e}"));
    let failed = job.status.as_ref().map_or(0, |s| s.failed);
    assert_eq!(failed, 0, "{what}: the rolled-back pods were counted as failed: {:?}", job.status);

    // And it stays whole.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let live = job_pods(&pods, JOB).await;
    let bound = live.iter().filter(|p| node_of(p).is_some()).count();
    let want = if matches!(end, End::Bound(_)) { PODS } else { 0 };
    assert_eq!(bound, want, "{what}: {bound} of {} pods bound 5 s later (log {})", live.len(), extra.log.display());
}

#[tokio::test]
async fn node_deleted_after_pinning_rolls_back_single() {
    rollback(Cause::NodeDeleted, "single").await;
}

#[tokio::test]
async fn node_deleted_after_pinning_rolls_back_all() {
    rollback(Cause::NodeDeleted, "all").await;
}

#[tokio::test]
async fn capacity_taken_before_binding_rolls_back_single() {
    rollback(Cause::CapacityTaken, "single").await;
}

#[tokio::test]
async fn capacity_taken_before_binding_rolls_back_all() {
    rollback(Cause::CapacityTaken, "all").await;
}

#[tokio::test]
async fn unmodelled_volume_limit_rolls_back_and_waits_single() {
    rollback(Cause::VolumeLimit, "single").await;
}

#[tokio::test]
async fn unmodelled_volume_limit_rolls_back_and_waits_all() {
    rollback(Cause::VolumeLimit, "all").await;
}

/// The attempt is half started and kube-scheduler refuses the pod pinned to `refusing` with
/// `cause`'s reason.
async fn check_setup(pods: &Api<Pod>, what: &str, other_pod: &str, refused_pod: &str, refusing: &str, cause: Cause) {
    wait_for(&format!("{what}: pod {other_pod} bound (half the gang started)"), LONG, || async {
        node_of(&pods.get(other_pod).await.ok()?).map(|_| ())
    })
    .await;
    let message = wait_for(&format!("{what}: kube-scheduler refusing pod {refused_pod}"), LONG, || async {
        let p = pods.get(refused_pod).await.ok()?;
        if node_of(&p).is_some() {
            panic!("{what}: pod {refused_pod} bound to {:?}: the setup did not make {refusing} refuse it", node_of(&p));
        }
        refusal(&p)
    })
    .await;
    assert!(
        message.contains(cause.scheduler_reason()),
        "{what}: kube-scheduler's refusal of {refused_pod} should say {:?}: {message}",
        cause.scheduler_reason()
    );
}

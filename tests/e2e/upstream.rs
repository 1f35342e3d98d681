//! Upstream mode: a MusterJob recorded as `batch.muster.dev/scheduling-api: upstream` compiles
//! to the native `scheduling.k8s.io/v1beta1` Workload and PodGroup, its pods join the PodGroup
//! through `spec.schedulingGroup` without muster's gate, kube-scheduler's GangScheduling admits
//! the gang, and the MusterJob shows the group's conditions. The control plane serves the
//! native kinds (`GenericWorkload` on); the muster under test runs with the default
//! `--scheduling-api=muster`, so a job without the annotation gets muster's API recorded.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, GroupVersionKind};
use kube::discovery::ApiResource;
use muster::crds::{ADMISSION_GATE, MusterJob, POD_GROUP_LABEL, SCHEDULING_API_ANNOTATION};
use serde_json::{Value, json};

use crate::gangs::{LONG, TestNodes, all_bound, apply, events_of, gang, gpu_job, indices_by_node, job_pods, node_of};
use crate::harness::manager::muster;
use crate::harness::{client, cluster, namespace, wait_for};

fn api_of(group: &str, version: &str, kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
}

fn upstream(mut job: Value) -> Value {
    job["metadata"]["annotations"] = json!({SCHEDULING_API_ANNOTATION: "upstream"});
    job
}

/// The condition `type_` of a MusterJob's status, as `(status, reason, message)`.
fn job_condition(job: &MusterJob, type_: &str) -> Option<(String, String, String)> {
    let c = job.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[tokio::test]
async fn an_upstream_musterjob_is_gang_scheduled_by_kube_scheduler_and_a_too_big_one_says_why() {
    let _muster = muster().await;
    let ns = namespace("upstream-mode");
    let nodes = TestNodes::add(&ns.name, 2, 4, 1).await;
    let c = client().await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), &ns.name);
    let jobs: Api<MusterJob> = Api::namespaced(c.clone(), &ns.name);
    let native_wl: Api<DynamicObject> =
        Api::namespaced_with(c.clone(), &ns.name, &api_of("scheduling.k8s.io", "v1beta1", "Workload"));
    let native_pg: Api<DynamicObject> =
        Api::namespaced_with(c.clone(), &ns.name, &api_of("scheduling.k8s.io", "v1beta1", "PodGroup"));
    let muster_pg: Api<DynamicObject> =
        Api::namespaced_with(c.clone(), &ns.name, &api_of("scheduling.muster.dev", "v1alpha1", "PodGroup"));

    // A gang that fits: 3 pods of 2 GPUs on two 4-GPU nodes.
    apply(&ns.name, &upstream(gpu_job("fits", 3, 2, &nodes, gang(3), json!({}))));
    let bound = all_bound(&pods, "fits", 3).await;
    let job = jobs.get("fits").await.expect("job");
    let uid = job.uid().expect("uid");
    for pod in &bound {
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.scheduling_group.as_ref().and_then(|g| g.pod_group_name.as_deref()), Some("fits"));
        assert!(!spec.scheduling_gates.iter().flatten().any(|g| g.name == ADMISSION_GATE), "no muster gate");
        assert!(!pod.labels().contains_key(POD_GROUP_LABEL), "not muster's to admit");
    }
    // The native objects, owned like muster's; none of muster's own.
    let wl = native_wl.get("fits").await.expect("native Workload");
    let pg = native_pg.get("fits").await.expect("native PodGroup");
    assert_eq!(pg.data["spec"]["schedulingPolicy"]["gang"]["minCount"], json!(3));
    assert_eq!(pg.data["spec"]["workloadRef"]["workloadName"], json!("fits"));
    let owners: Vec<(String, String)> =
        pg.metadata.owner_references.iter().flatten().map(|o| (o.kind.clone(), o.uid.clone())).collect();
    assert!(owners.contains(&("MusterJob".into(), uid.clone())), "{owners:?}");
    assert!(owners.contains(&("Workload".into(), wl.uid().expect("uid"))), "{owners:?}");
    assert!(muster_pg.get_opt("fits").await.expect("get").is_none(), "no muster PodGroup in upstream mode");
    assert_eq!(job.annotations().get(SCHEDULING_API_ANNOTATION).map(String::as_str), Some("upstream"));
    // kube-scheduler's condition shows on the job; GPU indices follow the binds, disjoint per node.
    wait_for("PodGroupInitiallyScheduled=True on the MusterJob", LONG, || async {
        let job = jobs.get("fits").await.ok()?;
        (job_condition(&job, "PodGroupInitiallyScheduled")?.0 == "True").then_some(())
    })
    .await;
    let with_indices = wait_for("GPU indices on every pod", LONG, || async {
        let live = job_pods(&pods, "fits").await;
        live.iter().all(|p| p.annotations().contains_key(muster::crds::GPU_INDICES_ANNOTATION)).then_some(live)
    })
    .await;
    for (node, indices) in indices_by_node(&with_indices) {
        let mut unique = indices.clone();
        unique.dedup();
        assert_eq!(unique, indices, "GPUs handed out twice on {node}");
        assert!(indices.iter().all(|i| *i < 4), "{node}: {indices:?}");
    }

    // A gang that can never fit (3 pods of 4 GPUs on 8 GPUs): kube-scheduler's reason on the job.
    apply(&ns.name, &upstream(gpu_job("too-big", 3, 4, &nodes, gang(3), json!({}))));
    let (_, reason, message) = wait_for("PodGroupInitiallyScheduled=False on too-big", LONG, || async {
        let job = jobs.get("too-big").await.ok()?;
        job_condition(&job, "PodGroupInitiallyScheduled").filter(|c| c.0 == "False")
    })
    .await;
    assert_eq!(reason, "Unschedulable", "{message}");
    assert!(!message.is_empty());
    wait_for("a Warning event naming the native PodGroup on too-big", LONG, || async {
        let events = events_of(&ns.name, "too-big").await;
        events
            .iter()
            .any(|(t, r, m)| t == "Warning" && r == "Unschedulable" && m.contains("PodGroup too-big"))
            .then_some(())
    })
    .await;
    assert!(job_pods(&pods, "too-big").await.iter().all(|p| node_of(p).is_none()), "nothing of it bound");
    // `kubectl get mjob -o wide` says why, in the Scheduling column.
    let wide = cluster().kubectl(&["-n", &ns.name, "get", "mjob", "-o", "wide"]).expect("kubectl get mjob");
    let row =
        |name: &str| wide.lines().find(|l| l.split_whitespace().next() == Some(name)).unwrap_or_default().to_string();
    assert!(wide.lines().next().is_some_and(|h| h.contains("SCHEDULING")), "{wide}");
    assert!(row("too-big").contains("Unschedulable") && row("fits").contains("Scheduled"), "{wide}");

    // A job without the annotation gets the flag's API (muster here) recorded, and keeps it.
    apply(&ns.name, &gpu_job("default", 1, 1, &nodes, gang(1), json!({})));
    wait_for("the API recorded on default", LONG, || async {
        let job = jobs.get("default").await.ok()?;
        (job.annotations().get(SCHEDULING_API_ANNOTATION)? == "muster").then_some(())
    })
    .await;
    wait_for("muster's PodGroup of default", LONG, || async { muster_pg.get_opt("default").await.ok().flatten() })
        .await;
    let refused = cluster()
        .kubectl(&[
            "-n",
            &ns.name,
            "annotate",
            "--overwrite",
            "musterjob/default",
            &format!("{SCHEDULING_API_ANNOTATION}=upstream"),
        ])
        .expect_err("the recorded API cannot change");
    assert!(refused.contains("field is immutable") && refused.contains(SCHEDULING_API_ANNOTATION), "{refused}");
}

//! Upstream mode: a MusterJob recorded as `batch.muster.dev/scheduling-api: upstream` compiles
//! to the native `scheduling.k8s.io/v1beta1` Workload and PodGroup, its pods join the PodGroup
//! through `spec.schedulingGroup` without muster's gate, kube-scheduler's GangScheduling admits
//! the gang, and the MusterJob shows the group's conditions. The control plane serves the
//! native kinds (`GenericWorkload` on); the muster under test runs with the default
//! `--scheduling-api=muster`, so a job without the annotation gets muster's API recorded.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, GroupVersionKind, PostParams};
use kube::discovery::ApiResource;
use muster::crds::{ADMISSION_GATE, MusterJob, POD_GROUP_LABEL, SCHEDULING_API_ANNOTATION};
use serde_json::{Value, json};

use crate::gangs::{LONG, TestNodes, all_bound, apply, events_of, gang, gpu_job, indices_by_node, job_pods, node_of};
use crate::harness::manager::muster;
use crate::harness::{client, cluster, namespace, wait_for, wait_for_opt};

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

    // The gang's minCount follows the job's (the one field of the native objects that may change).
    cluster()
        .kubectl(&[
            "-n",
            &ns.name,
            "patch",
            "mjob",
            "fits",
            "--type=merge",
            "-p",
            r#"{"spec":{"scheduling":{"schedulingPolicy":{"gang":{"minCount":2}}}}}"#,
        ])
        .expect("patch minCount");
    wait_for("minCount 2 on the native Workload and PodGroup", LONG, || async {
        let wl = native_wl.get("fits").await.ok()?;
        let pg = native_pg.get("fits").await.ok()?;
        (wl.data["spec"]["podGroupTemplates"][0]["schedulingPolicy"]["gang"]["minCount"] == json!(2)
            && pg.data["spec"]["schedulingPolicy"]["gang"]["minCount"] == json!(2))
        .then_some(())
    })
    .await;

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

    // A job without the annotation gets the flag's API (muster here) recorded at its creation,
    // in the API server (the policy muster applies where served, else muster's webhook): the
    // create's own answer carries it. An update that drops it gets it back.
    let default: MusterJob =
        serde_json::from_value(gpu_job("default", 1, 1, &nodes, gang(1), json!({}))).expect("a MusterJob");
    let created = jobs.create(&PostParams::default(), &default).await.expect("create default");
    assert_eq!(created.annotations().get(SCHEDULING_API_ANNOTATION).map(String::as_str), Some("muster"));
    // This control plane serves MutatingAdmissionPolicies: the policy recorded it, and no webhook
    // of muster's was asked to.
    let served = c.list_api_group_resources("admissionregistration.k8s.io/v1").await.expect("discovery");
    if served.resources.iter().any(|r| r.name == "mutatingadmissionpolicies") {
        use k8s_openapi::api::admissionregistration::v1::{MutatingAdmissionPolicy, MutatingWebhookConfiguration};
        use muster::webhook::config::{MUTATING_NAME, RECORD_API, RECORD_API_POLICY};
        let policy = Api::<MutatingAdmissionPolicy>::all(c.clone()).get_opt(RECORD_API_POLICY).await.expect("get");
        assert!(policy.is_some(), "muster applied no {RECORD_API_POLICY} where it is served");
        let mutating = Api::<MutatingWebhookConfiguration>::all(c.clone()).get(MUTATING_NAME).await.expect("get");
        assert!(!mutating.webhooks.iter().flatten().any(|w| w.name == RECORD_API), "{RECORD_API} is still asked");
    }
    let dropped = cluster()
        .kubectl(&["-n", &ns.name, "annotate", "musterjob/default", &format!("{SCHEDULING_API_ANNOTATION}-")])
        .expect("an update dropping the recorded API is admitted");
    assert!(dropped.contains("annotated") || dropped.contains("unchanged"), "{dropped}");
    let kept = jobs.get("default").await.expect("get default");
    assert_eq!(kept.annotations().get(SCHEDULING_API_ANNOTATION).map(String::as_str), Some("muster"), "restored");
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

/// A MusterJobSet of a driver (1 pod, `driver_gpus` GPUs) and workers (2 pods of `worker_gpus`
/// GPUs, a gang) under one composite gang, in upstream mode.
fn upstream_set(name: &str, driver_gpus: u32, worker_gpus: u32, nodes: &TestNodes) -> Value {
    let template = |pods: u32, gpus: u32, scheduling: Value| {
        let job = gpu_job("unused", pods, gpus, nodes, scheduling, json!({}));
        json!({"spec": job["spec"].clone()})
    };
    upstream(json!({
        "apiVersion": "batch.muster.dev/v1alpha1",
        "kind": "MusterJobSet",
        "metadata": {"name": name},
        "spec": {
            "scheduling": {"schedulingPolicy": {"gang": {}},
                           "schedulingConstraints": {"topology": [{"key": "topology.muster.dev/rack"}]}},
            "replicatedJobs": [
                {"name": "driver", "replicas": 1, "template": template(1, driver_gpus, json!({"schedulingPolicy": {"basic": {}}}))},
                {"name": "workers", "replicas": 1, "template": template(2, worker_gpus, gang(2))},
            ],
        },
    }))
}

#[tokio::test]
async fn an_upstream_musterjobset_is_admitted_by_kube_scheduler_only_whole() {
    use muster::crds::{JOBSET_NAME_LABEL, MusterJobSet};
    let _muster = muster().await;
    let ns = namespace("upstream-set");
    // Two 8-GPU nodes in one rack.
    let nodes = TestNodes::add(&ns.name, 2, 8, 1).await;
    let c = client().await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), &ns.name);
    let sets: Api<MusterJobSet> = Api::namespaced(c.clone(), &ns.name);
    let native_cpg: Api<DynamicObject> =
        Api::namespaced_with(c.clone(), &ns.name, &api_of("scheduling.k8s.io", "v1alpha3", "CompositePodGroup"));
    let native_pg: Api<DynamicObject> =
        Api::namespaced_with(c.clone(), &ns.name, &api_of("scheduling.k8s.io", "v1beta1", "PodGroup"));
    let muster_cpg: Api<DynamicObject> =
        Api::namespaced_with(c.clone(), &ns.name, &api_of("scheduling.muster.dev", "v1alpha1", "CompositePodGroup"));
    let set_pods = |set: &'static str| {
        let pods = pods.clone();
        async move {
            let lp = kube::api::ListParams::default().labels(&format!("{JOBSET_NAME_LABEL}={set}"));
            pods.list(&lp).await.map(|l| l.items).unwrap_or_default()
        }
    };
    let set_condition = |set: MusterJobSet| {
        let c = set.status?.conditions.into_iter().find(|c| c.type_ == "CompositePodGroupInitiallyScheduled")?;
        Some((c.status, c.reason, c.message))
    };

    // 4 + 2 x 8 GPUs on 16: the driver alone would fit, the whole set does not. Nothing binds.
    apply(&ns.name, &upstream_set("too-big", 4, 8, &nodes));
    let (_, reason, message) = wait_for("the set's composite condition False", LONG, || async {
        set_condition(sets.get("too-big").await.ok()?).filter(|c| c.0 == "False")
    })
    .await;
    assert_eq!(reason, "Unschedulable", "{message}");
    assert!(message.starts_with("child PodGroup too-big-"), "{message}");
    let waiting = set_pods("too-big").await;
    assert_eq!(waiting.len(), 3, "every pod exists");
    assert!(waiting.iter().all(|p| node_of(p).is_none()), "no pod of a set that does not fit whole is bound");
    let cpg = native_cpg.get("too-big").await.expect("native CompositePodGroup");
    let set_uid = sets.get("too-big").await.expect("set").uid().expect("uid");
    assert!(cpg.owner_references().iter().any(|o| o.kind == "MusterJobSet" && o.uid == set_uid));
    assert_eq!(cpg.data["spec"]["schedulingPolicy"]["gang"]["minGroupCount"], json!(2));
    for child in ["too-big-driver-0", "too-big-workers-0"] {
        let pg = native_pg.get(child).await.expect("the child's native PodGroup");
        assert_eq!(pg.data["spec"]["parentCompositePodGroupName"], json!("too-big"), "{child}");
        assert_eq!(pg.data["spec"]["workloadRef"]["workloadName"], json!("too-big"), "{child}");
    }
    assert!(muster_cpg.get_opt("too-big").await.expect("get").is_none(), "none of muster's");
    wait_for("a Warning event on the set", LONG, || async {
        let events = events_of(&ns.name, "too-big").await;
        events.iter().any(|(t, _, m)| t == "Warning" && m.contains("CompositePodGroup too-big")).then_some(())
    })
    .await;
    sets.delete("too-big", &kube::api::DeleteParams::foreground()).await.expect("delete");

    // 4 + 2 x 4 GPUs: the whole set binds, in one rack, and says so.
    apply(&ns.name, &upstream_set("fits", 4, 4, &nodes));
    let bound = wait_for("every pod of fits bound", LONG, || async {
        let all = set_pods("fits").await;
        (all.len() == 3 && all.iter().all(|p| node_of(p).is_some())).then_some(all)
    })
    .await;
    for pod in &bound {
        let gates = pod.spec.as_ref().and_then(|s| s.scheduling_gates.clone()).unwrap_or_default();
        assert!(!gates.iter().any(|g| g.name == ADMISSION_GATE), "no muster gate");
        assert!(!pod.labels().contains_key(POD_GROUP_LABEL), "not muster's to admit");
    }
    let (status, reason, _) = wait_for("the set's composite condition True", LONG, || async {
        set_condition(sets.get("fits").await.ok()?).filter(|c| c.0 == "True")
    })
    .await;
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Scheduled"));
    let children: Vec<String> = bound
        .iter()
        .map(|p| p.spec.as_ref().and_then(|s| s.scheduling_group.as_ref()).and_then(|g| g.pod_group_name.clone()))
        .map(Option::unwrap_or_default)
        .collect();
    assert!(children.iter().all(|g| g == "fits-driver-0" || g == "fits-workers-0"), "{children:?}");
    let wide = cluster().kubectl(&["-n", &ns.name, "get", "musterjobset", "fits", "-o", "wide"]).expect("kubectl");
    assert!(wide.lines().next().is_some_and(|h| h.contains("SCHEDULING")) && wide.contains("Scheduled"), "{wide}");
    // A replicatedJob's gang minCount reaches the set's native Workload and the child's PodGroup.
    cluster()
        .kubectl(&["-n", &ns.name, "patch", "musterjobset", "fits", "--type=json", "-p",
            r#"[{"op":"replace","path":"/spec/replicatedJobs/1/template/spec/scheduling/schedulingPolicy/gang/minCount","value":1}]"#])
        .expect("patch the workers' minCount");
    let native_wl: Api<DynamicObject> =
        Api::namespaced_with(c.clone(), &ns.name, &api_of("scheduling.k8s.io", "v1beta1", "Workload"));
    wait_for("minCount 1 on the set's Workload and the workers' PodGroup", LONG, || async {
        let wl = native_wl.get("fits").await.ok()?;
        let pg = native_pg.get("fits-workers-0").await.ok()?;
        let workers = wl.data["spec"]["compositePodGroupTemplates"][0]["podGroupTemplates"]
            .as_array()?
            .iter()
            .find(|t| t["name"] == json!("workers"))?
            .clone();
        (workers["schedulingPolicy"]["gang"]["minCount"] == json!(1)
            && pg.data["spec"]["schedulingPolicy"]["gang"]["minCount"] == json!(1))
        .then_some(())
    })
    .await;
    // The set's recorded API is frozen like a job's.
    let refused = cluster()
        .kubectl(&[
            "-n",
            &ns.name,
            "annotate",
            "--overwrite",
            "musterjobset/fits",
            &format!("{SCHEDULING_API_ANNOTATION}=muster"),
        ])
        .expect_err("the recorded API cannot change");
    assert!(refused.contains("field is immutable") && refused.contains(SCHEDULING_API_ANNOTATION), "{refused}");
}

/// DRA in upstream mode, on nodes whose GPUs are DRA devices: kube-scheduler allocates the claims
/// and the allocation is what muster states. A job with `spec.gpuClaims` gets muster's claim
/// template, each pod a claim made from it, allocated by kube-scheduler on the pod's node; the
/// pod's `gpu.muster.dev/indices` are exactly the allocated devices, and no device goes twice. A
/// shared claim (`spec.scheduling.resourceClaims`) goes onto the native PodGroup as it is, every
/// pod carries the same entry, and kube-controller-manager makes ONE claim for the group, which
/// kube-scheduler allocates for the whole gang on the node that reaches its device.
#[tokio::test]
async fn upstream_claims_are_allocated_by_kube_scheduler_and_the_allocation_is_what_muster_states() {
    use std::collections::BTreeSet;

    use k8s_openapi::api::resource::v1::ResourceClaim;

    use crate::dra::allocated;
    use crate::dra_gangs::{check_pod_claim, claim_job, claim_of, template};
    use crate::gangs::indices_of;
    use crate::harness::dra::DraSlices;

    let _muster = muster().await;
    let ns = namespace("upstream-dra");
    let nodes = TestNodes::add(&ns.name, 2, 4, 1).await;
    let _slices = DraSlices::publish(&nodes.names).await;
    let c = client().await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), &ns.name);
    let jobs: Api<MusterJob> = Api::namespaced(c.clone(), &ns.name);
    let claims: Api<ResourceClaim> = Api::namespaced(c.clone(), &ns.name);
    let native_pg: Api<DynamicObject> =
        Api::namespaced_with(c.clone(), &ns.name, &api_of("scheduling.k8s.io", "v1beta1", "PodGroup"));
    let muster_pg: Api<DynamicObject> =
        Api::namespaced_with(c.clone(), &ns.name, &api_of("scheduling.muster.dev", "v1alpha1", "PodGroup"));

    // GPU claims: 3 pods x 2 GPUs, kube-scheduler's to allocate.
    let mut opted = upstream(gpu_job("opted", 3, 2, &nodes, gang(3), json!({})));
    opted["spec"]["gpuClaims"] = json!({});
    apply(&ns.name, &opted);
    let bound = all_bound(&pods, "opted", 3).await;
    let job = jobs.get("opted").await.expect("job");
    assert_eq!(job.annotations().get(SCHEDULING_API_ANNOTATION).map(String::as_str), Some("upstream"));
    assert!(native_pg.get_opt("opted").await.expect("get").is_some(), "the native PodGroup");
    assert!(muster_pg.get_opt("opted").await.expect("get").is_none(), "no muster PodGroup");
    let with_indices = wait_for("GPU indices on every pod of opted", LONG, || async {
        let live = job_pods(&pods, "opted").await;
        live.iter().all(|p| indices_of(p).is_some()).then_some(live)
    })
    .await;
    assert_eq!(with_indices.len(), bound.len());
    let mut seen = BTreeSet::new();
    for pod in &with_indices {
        let spec = pod.spec.as_ref().expect("spec");
        assert!(!spec.scheduling_gates.iter().flatten().any(|g| g.name == ADMISSION_GATE), "no muster gate");
        for d in check_pod_claim(&claims, pod, muster::crds::GPU_CLAIM_NAME).await {
            assert!(seen.insert(d.clone()), "device {d:?} allocated twice");
        }
    }
    assert_eq!(seen.len(), 6, "3 pods x 2 devices: {seen:?}");

    // A shared claim from a template: one claim for the native PodGroup, shared by every pod.
    template(&ns.name, "one-gpu", 1).await;
    let mut shared = upstream(claim_job("shared", 2, "unused", &nodes, json!({})));
    shared["spec"]["template"]["spec"]["resourceClaims"] = json!([]);
    shared["spec"]["template"]["spec"]["containers"][0]["resources"] = json!({"claims": [{"name": "shared"}]});
    let entry = json!({"name": "shared", "resourceClaimTemplateName": "one-gpu"});
    shared["spec"]["scheduling"]["resourceClaims"] = json!([entry]);
    apply(&ns.name, &shared);
    let bound = all_bound(&pods, "shared", 2).await;
    let pg = native_pg.get("shared").await.expect("the native PodGroup");
    assert_eq!(pg.data["spec"]["resourceClaims"], json!([entry]), "the entry as it is on the native PodGroup");
    assert!(muster_pg.get_opt("shared").await.expect("get").is_none(), "no muster PodGroup");
    let mut names = BTreeSet::new();
    for pod in &bound {
        let own = pod.spec.as_ref().and_then(|s| s.resource_claims.clone()).unwrap_or_default();
        assert_eq!(serde_json::to_value(&own).expect("json"), json!([entry]), "pod {}", pod.name_any());
        names.insert(claim_of(pod, "shared").expect("the pod's entry resolved"));
    }
    assert_eq!(names.len(), 1, "one claim for the whole gang: {names:?}");
    let name = names.into_iter().next().expect("claim name");
    let claim = claims.get(&name).await.expect("the group's claim");
    let owner = claim.metadata.owner_references.iter().flatten().find(|o| o.controller == Some(true));
    assert_eq!(owner.map(|o| (o.kind.as_str(), o.name.as_str())), Some(("PodGroup", "shared")), "{owner:?}");
    let devices = allocated(&claim);
    assert_eq!(devices.len(), 1, "{devices:?}");
    for pod in &bound {
        assert_eq!(node_of(pod), Some(devices[0].0.as_str()), "pod {} is where the device is", pod.name_any());
    }
    assert!(!seen.contains(&devices[0]), "the shared device is none of opted's: {devices:?}");
}

/// kube-scheduler preempting an upstream gang (1.37 writes `DisruptionTarget` on the pods it
/// preempts, not on their native PodGroup): the MusterJob shows `DisruptionTarget=True` with the
/// preempted pod's reason and message, and a Warning event says so. The victims carry a
/// finalizer, so they stay (terminating) long enough to be read; the high gang binds once they go.
#[tokio::test]
async fn a_gang_kube_scheduler_preempts_is_a_disruption_target_on_its_musterjob() {
    use crate::preemption::{HOLD, priority_class, with_class};
    let _muster = muster().await;
    let ns = namespace("upstream-preempt");
    let nodes = TestNodes::add(&ns.name, 1, 4, 1).await;
    let c = client().await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), &ns.name);
    let jobs: Api<MusterJob> = Api::namespaced(c.clone(), &ns.name);
    priority_class("muster-e2e-upstream-low", 100, false);
    priority_class("muster-e2e-upstream-high", 1000, false);
    let low = upstream(with_class(gpu_job("low", 2, 2, &nodes, gang(2), json!({})), "muster-e2e-upstream-low"));
    apply(&ns.name, &low);
    // The running pods are held (not their replacements, which must go with the namespace).
    let hold = json!({"metadata": {"finalizers": [HOLD]}});
    for p in all_bound(&pods, "low", 2).await {
        pods.patch(&p.name_any(), &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&hold))
            .await
            .expect("hold");
    }
    let high = upstream(with_class(gpu_job("high", 2, 2, &nodes, gang(2), json!({})), "muster-e2e-upstream-high"));
    apply(&ns.name, &high);
    let seen = wait_for_opt(LONG, || async {
        let job = jobs.get("low").await.ok()?;
        job_condition(&job, "DisruptionTarget").filter(|c| c.0 == "True")
    })
    .await;
    let warned = wait_for_opt(LONG, || async {
        let events = events_of(&ns.name, "low").await;
        events.into_iter().find(|(t, _, m)| t == "Warning" && m.contains("DisruptionTarget=True"))
    })
    .await;
    // The victims go (the finalizer released), whatever was seen: the namespace must be deletable.
    let release = json!({"metadata": {"finalizers": null}});
    for p in pods.list(&Default::default()).await.map(|l| l.items).unwrap_or_default() {
        if p.finalizers().iter().any(|f| f == HOLD) {
            let params = kube::api::PatchParams::default();
            let _ = pods.patch(&p.name_any(), &params, &kube::api::Patch::Merge(&release)).await;
        }
    }
    let (_, reason, message) = seen.expect("DisruptionTarget=True on the MusterJob low");
    assert_eq!(reason, "PreemptionByScheduler", "{message}");
    assert!(message.starts_with("pod low-"), "names the preempted pod: {message}");
    let (_, event_reason, _) = warned.expect("a Warning event");
    assert_eq!(event_reason, "PreemptionByScheduler");
    all_bound(&pods, "high", 2).await;
}

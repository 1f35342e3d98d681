//! The MusterJob and MusterJobSet controllers of a running muster: what they compile, the pods
//! they run, how they follow changes, fail, finish and get collected, what they do when a
//! frozen field changes behind the webhook's back or an object does not decode, and the
//! metrics they export. Each test has its own namespace.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference};
use kube::api::{Api, ListParams};
use kube::{Resource, ResourceExt};
use muster::controllers::job::plan::{COMPLETION_INDEX_ENV, GPU_INDICES_ENV};
use muster::crds::batch::{CompletionMode, JobPhase, JobSetPhase};
use muster::crds::blocks::{DisruptionMode, PodGroupResourceClaim, PodGroupSchedulingPolicy, SchedulingConstraints};
use muster::crds::scheduling::{GroupPhase, WorkloadControllerRef, WorkloadReference};
use muster::crds::{
    ADMISSION_GATE, COMPLETION_INDEX_ANNOTATION, CompositePodGroup, CompositePodGroupSchedulingPolicy,
    GROUP_TEMPLATE_ANNOTATION, JOB_NAME_LABEL, JOBSET_NAME_LABEL, MusterJob, MusterJobSet, PARENT_COMPOSITE_ANNOTATION,
    POD_GROUP_LABEL, PodGroup, REPLICATED_JOB_LABEL, Workload,
};

use crate::harness::manager::{muster, muster_exclusive};
use crate::harness::{client, kubectl, kubectl_apply, metric, namespace, wait_for, wait_for_opt};

const SHORT: Duration = Duration::from_secs(30);
const LONG: Duration = Duration::from_secs(90);
const RACK: &str = "topology.muster.dev/rack";

/// The typed APIs of one namespace.
struct Apis {
    jobs: Api<MusterJob>,
    sets: Api<MusterJobSet>,
    workloads: Api<Workload>,
    groups: Api<PodGroup>,
    composites: Api<CompositePodGroup>,
    pods: Api<Pod>,
    services: Api<Service>,
}

async fn apis(ns: &str) -> Apis {
    let c = client().await;
    Apis {
        jobs: Api::namespaced(c.clone(), ns),
        sets: Api::namespaced(c.clone(), ns),
        workloads: Api::namespaced(c.clone(), ns),
        groups: Api::namespaced(c.clone(), ns),
        composites: Api::namespaced(c.clone(), ns),
        pods: Api::namespaced(c.clone(), ns),
        services: Api::namespaced(c, ns),
    }
}

/// Waits until `name` exists and returns it.
async fn eventually<K>(api: &Api<K>, name: &str) -> K
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let what = format!("{} {name}", K::kind(&()));
    wait_for(&what, SHORT, || async { api.get_opt(name).await.ok().flatten() }).await
}

/// A pod template no node matches: its pods stay gated (admission finds no place for them).
const NOWHERE: &str = "nodeSelector: {muster.dev/e2e: nowhere}";

/// Pods of MusterJob `job`, once there are `n` (not being deleted).
async fn pods_of(pods: &Api<Pod>, job: &str, n: usize) -> Vec<Pod> {
    let lp = ListParams::default().labels(&format!("{JOB_NAME_LABEL}={job}"));
    wait_for(&format!("{n} pods of MusterJob {job}"), SHORT, || async {
        let live: Vec<Pod> =
            pods.list(&lp).await.ok()?.items.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
        (live.len() == n).then_some(live)
    })
    .await
}

fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

fn controller_of(owner: &OwnerReference, kind: &str, name: &str, uid: &str) -> bool {
    owner.kind == kind && owner.name == name && owner.uid == uid && owner.controller == Some(true)
}

fn is_gated(p: &Pod) -> bool {
    p.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| g.iter().any(|g| g.name == ADMISSION_GATE))
}

/// Warning/Normal events about object `name` in `ns`: (type, reason, message).
async fn events_of(ns: &str, name: &str) -> Vec<(String, String, String)> {
    let events: Api<Event> = Api::namespaced(client().await, ns);
    let list = events.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
    list.into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name))
        .map(|e| (e.type_.unwrap_or_default(), e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect()
}

#[tokio::test]
async fn gang_job_compiles_its_workload_podgroup_and_gated_pods() {
    let _muster = muster().await;
    let ns = namespace("job-compile");
    let a = apis(&ns.name).await;
    kubectl_apply(
        &ns.name,
        r#"
apiVersion: batch.muster.dev/v1alpha1
kind: MusterJob
metadata: {name: train}
spec:
  parallelism: 3
  completions: 3
  completionMode: Indexed
  scheduling:
    schedulingPolicy: {gang: {minCount: 2}}
    schedulingConstraints: {topology: [{key: topology.muster.dev/rack}]}
    disruptionMode: {all: {}}
    resourceClaims:
    - {name: shared, resourceClaimTemplateName: gpu-slice}
    - {name: dataset, resourceClaimName: dataset-cache}
  template:
    spec:
      restartPolicy: Never
      nodeSelector: {muster.dev/e2e: nowhere}
      containers:
      - {name: main, image: registry.invalid/none, resources: {limits: {nvidia.com/gpu: "1"}}}
---
apiVersion: batch.muster.dev/v1alpha1
kind: MusterJob
metadata: {name: resolved}
spec:
  parallelism: 4
  scheduling: {schedulingPolicy: {gang: {}}}
  template:
    spec:
      containers: [{name: main, image: registry.invalid/none}]
"#,
    );
    let job = eventually(&a.jobs, "train").await;
    let job_uid = job.uid().unwrap();
    // An API server without DRA (before 1.34): the group's shared claims cannot be, and the
    // job says so at the field, Invalid; nothing is compiled from it.
    if !crate::harness::served("resource.k8s.io/v1", "resourceclaims").await {
        let status = wait_for("train Invalid: DRA not served", SHORT, || async {
            let status = a.jobs.get("train").await.ok()?.status?;
            let invalid = condition(&status.conditions, "Invalid")?;
            (invalid.status == "True").then_some((status.clone(), invalid.clone()))
        })
        .await;
        let (status, invalid) = status;
        assert_eq!(status.phase, Some(JobPhase::Invalid));
        assert_eq!(invalid.reason, "DRANotServed");
        assert!(invalid.message.contains("spec.scheduling.resourceClaims"), "{}", invalid.message);
        assert!(a.workloads.get_opt("train").await.expect("get").is_none());
        return;
    }

    let workload = eventually(&a.workloads, "train").await;
    assert_eq!(
        workload.spec.controller_ref,
        Some(WorkloadControllerRef {
            api_group: Some("batch.muster.dev".into()),
            kind: "MusterJob".into(),
            name: "train".into()
        })
    );
    let owners = workload.metadata.owner_references.clone().unwrap_or_default();
    assert!(owners.len() == 1 && controller_of(&owners[0], "MusterJob", "train", &job_uid), "{owners:?}");
    assert!(workload.spec.composite_pod_group_templates.is_none());
    let templates = workload.spec.pod_group_templates.clone().unwrap();
    assert_eq!(templates.len(), 1);
    let t = &templates[0];
    let claims = vec![
        PodGroupResourceClaim {
            name: "shared".into(),
            resource_claim_template_name: Some("gpu-slice".into()),
            ..Default::default()
        },
        PodGroupResourceClaim {
            name: "dataset".into(),
            resource_claim_name: Some("dataset-cache".into()),
            ..Default::default()
        },
    ];
    assert_eq!(t.name, "main");
    assert_eq!(t.scheduling_policy, PodGroupSchedulingPolicy::gang(Some(2)));
    assert_eq!(t.scheduling_constraints, Some(SchedulingConstraints::topology(RACK)));
    assert_eq!(t.disruption_mode, Some(DisruptionMode::all()));
    assert_eq!(t.resource_claims.as_ref(), Some(&claims));

    let group = eventually(&a.groups, "train").await;
    let s = &group.spec;
    assert_eq!(s.workload_ref, Some(WorkloadReference { workload_name: "train".into(), template_name: "main".into() }));
    assert_eq!(s.parent_composite_pod_group_name, None);
    assert_eq!(s.scheduling_policy, PodGroupSchedulingPolicy::gang(Some(2)));
    assert_eq!(s.scheduling_constraints, Some(SchedulingConstraints::topology(RACK)));
    assert_eq!(s.disruption_mode, DisruptionMode::all());
    assert_eq!(s.resource_claims.as_ref(), Some(&claims));
    let owners = group.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(owners.len(), 2, "{owners:?}");
    assert!(controller_of(&owners[0], "MusterJob", "train", &job_uid), "{owners:?}");
    let wl_ref = &owners[1];
    assert_eq!((wl_ref.kind.as_str(), wl_ref.name.as_str()), ("Workload", "train"));
    assert_eq!(Some(&wl_ref.uid), workload.metadata.uid.as_ref());
    assert_ne!(wl_ref.controller, Some(true), "the Workload co-owns the PodGroup; the job controls it");

    let pods = pods_of(&a.pods, "train", 3).await;
    let mut indexes = BTreeSet::new();
    for p in &pods {
        let name = p.name_any();
        assert_eq!(p.labels().get(POD_GROUP_LABEL).map(String::as_str), Some("train"), "{name}");
        assert!(is_gated(p), "{name} is gated");
        let owners = p.metadata.owner_references.clone().unwrap_or_default();
        assert!(owners.len() == 1 && controller_of(&owners[0], "MusterJob", "train", &job_uid), "{owners:?}");
        let index: i32 = p.annotations()[COMPLETION_INDEX_ANNOTATION].parse().unwrap();
        indexes.insert(index);
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.hostname.as_deref(), Some(format!("train-{index}").as_str()));
        assert_eq!(spec.subdomain.as_deref(), Some("train"));
        assert_eq!(spec.node_name, None, "a gated pod is not bound");
        let env = spec.containers[0].env.clone().unwrap_or_default();
        let from = |n: &str| {
            env.iter()
                .find(|e| e.name == n)
                .and_then(|e| e.value_from.as_ref()?.field_ref.as_ref())
                .map(|f| f.field_path.clone())
        };
        assert_eq!(
            from(COMPLETION_INDEX_ENV),
            Some(format!("metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']")),
            "{name}"
        );
        assert!(from(GPU_INDICES_ENV).is_some(), "{name}: a GPU container gets the indices env");
    }
    assert_eq!(indexes, BTreeSet::from([0, 1, 2]));

    let svc = eventually(&a.services, "train").await;
    let spec = svc.spec.unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
    assert_eq!(spec.selector.unwrap().get(JOB_NAME_LABEL).map(String::as_str), Some("train"));
    let owners = svc.metadata.owner_references.unwrap_or_default();
    assert!(owners.len() == 1 && controller_of(&owners[0], "MusterJob", "train", &job_uid));

    let status = wait_for("status of train", SHORT, || async {
        let s = a.jobs.get("train").await.ok()?.status?;
        (s.active == 3).then_some(s)
    })
    .await;
    assert_eq!(status.phase, Some(JobPhase::Pending), "gated pods are pending");
    assert_eq!((status.workload_name.as_deref(), status.pod_group_name.as_deref()), (Some("train"), Some("train")));
    assert_eq!(status.progress.as_deref(), Some("0/3"));
    let explained = wait_for("admission to explain why train waits", SHORT, || async {
        let s = a.groups.get("train").await.ok()?.status?;
        (s.phase == Some(GroupPhase::Unschedulable) && s.pods == 3).then_some(s)
    })
    .await;
    assert_eq!((explained.gated, explained.admitted), (3, 0));
    assert!(explained.message.is_some_and(|m| !m.is_empty()));

    // Gang without minCount: resolved to parallelism; no mode: single; non-Indexed: no Service.
    let resolved = eventually(&a.groups, "resolved").await;
    assert_eq!(resolved.spec.scheduling_policy, PodGroupSchedulingPolicy::gang(Some(4)));
    assert_eq!(resolved.spec.disruption_mode, DisruptionMode::single());
    let wl = eventually(&a.workloads, "resolved").await;
    assert_eq!(wl.spec.pod_group_templates.unwrap()[0].disruption_mode, None, "the template leaves the default");
    for p in pods_of(&a.pods, "resolved", 4).await {
        let spec = p.spec.unwrap();
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"), "restartPolicy defaults to Never");
        assert_eq!((spec.hostname, spec.subdomain), (None, None));
    }
    assert!(a.services.get_opt("resolved").await.unwrap().is_none());
}

#[tokio::test]
async fn jobset_compiles_a_composite_tree_and_child_jobs() {
    let _muster = muster().await;
    let ns = namespace("jobset-compile");
    let a = apis(&ns.name).await;
    let set = r#"
apiVersion: batch.muster.dev/v1alpha1
kind: MusterJobSet
metadata: {name: ray}
spec:
  scheduling:
    schedulingPolicy: {gang: {}}
    schedulingConstraints: {topology: [{key: topology.muster.dev/rack}]}
  replicatedJobs:
  - name: driver
    template:
      spec:
        completions: 1
        completionMode: Indexed
        template: {spec: {restartPolicy: Never, NOWHERE, containers: [{name: main, image: registry.invalid/none}]}}
  - name: workers
    replicas: 2
    template:
      metadata: {labels: {role: worker}}
      spec:
        parallelism: 2
        completions: 2
        completionMode: Indexed
        scheduling: {schedulingPolicy: {gang: {}}, disruptionMode: {all: {}}}
        template: {spec: {restartPolicy: Never, NOWHERE, containers: [{name: main, image: registry.invalid/none}]}}
"#;
    kubectl_apply(&ns.name, &set.replace("NOWHERE", NOWHERE));
    let set = eventually(&a.sets, "ray").await;
    let set_uid = set.uid().unwrap();

    let workload = eventually(&a.workloads, "ray").await;
    assert_eq!(workload.spec.controller_ref.as_ref().map(|r| r.kind.as_str()), Some("MusterJobSet"));
    assert!(workload.spec.pod_group_templates.is_none());
    let roots = workload.spec.composite_pod_group_templates.clone().unwrap();
    assert_eq!(roots.len(), 1);
    let root = &roots[0];
    assert_eq!(root.name, "jobset");
    assert_eq!(root.scheduling_policy, CompositePodGroupSchedulingPolicy::gang(Some(3)), "one per child job");
    assert_eq!(root.scheduling_constraints, Some(SchedulingConstraints::topology(RACK)));
    assert_eq!(root.composite_pod_group_templates, None);
    let leaves = root.pod_group_templates.clone().unwrap();
    let names: Vec<&str> = leaves.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["driver", "workers"]);
    assert_eq!(leaves[0].scheduling_policy, PodGroupSchedulingPolicy::basic());
    assert_eq!(leaves[1].scheduling_policy, PodGroupSchedulingPolicy::gang(Some(2)));
    assert_eq!(leaves[1].disruption_mode, Some(DisruptionMode::all()));

    let cpg = eventually(&a.composites, "ray").await;
    assert_eq!(cpg.spec.parent_composite_pod_group_name, None, "the set's group is the root");
    assert_eq!(
        cpg.spec.workload_ref,
        WorkloadReference { workload_name: "ray".into(), template_name: "jobset".into() }
    );
    assert_eq!(cpg.spec.scheduling_policy, CompositePodGroupSchedulingPolicy::gang(Some(3)));
    assert_eq!(cpg.spec.scheduling_constraints, Some(SchedulingConstraints::topology(RACK)));
    let owners = cpg.metadata.owner_references.clone().unwrap_or_default();
    assert!(owners.len() == 1 && controller_of(&owners[0], "MusterJobSet", "ray", &set_uid), "{owners:?}");

    for (child, rjob, pods) in
        [("ray-driver-0", "driver", 1), ("ray-workers-0", "workers", 2), ("ray-workers-1", "workers", 2)]
    {
        let job = eventually(&a.jobs, child).await;
        let owners = job.metadata.owner_references.clone().unwrap_or_default();
        assert!(owners.len() == 1 && controller_of(&owners[0], "MusterJobSet", "ray", &set_uid), "{owners:?}");
        assert_eq!(job.annotations().get(GROUP_TEMPLATE_ANNOTATION).map(String::as_str), Some(rjob));
        assert_eq!(job.annotations().get(PARENT_COMPOSITE_ANNOTATION).map(String::as_str), Some("ray"));
        assert_eq!(job.labels().get(JOBSET_NAME_LABEL).map(String::as_str), Some("ray"));
        assert_eq!(job.labels().get(REPLICATED_JOB_LABEL).map(String::as_str), Some(rjob));
        assert_eq!(job.labels().get("role").is_some(), rjob == "workers", "template labels reach the child");
        assert_eq!(job.spec.completion_mode(), CompletionMode::Indexed, "both templates ask for Indexed");

        let group = eventually(&a.groups, child).await;
        assert_eq!(group.spec.parent_composite_pod_group_name.as_deref(), Some("ray"));
        assert_eq!(
            group.spec.workload_ref,
            Some(WorkloadReference { workload_name: "ray".into(), template_name: rjob.into() })
        );
        let want =
            if rjob == "workers" { PodGroupSchedulingPolicy::gang(Some(2)) } else { PodGroupSchedulingPolicy::basic() };
        assert_eq!(group.spec.scheduling_policy, want);
        let owners = group.metadata.owner_references.clone().unwrap_or_default();
        assert!(
            owners.len() == 1 && controller_of(&owners[0], "MusterJob", child, &job.uid().unwrap()),
            "a child's PodGroup is owned by the child only: {owners:?}"
        );
        assert!(a.workloads.get_opt(child).await.unwrap().is_none(), "a child compiles no Workload of its own");
        assert!(a.services.get_opt(child).await.unwrap().is_none(), "children share the set's Service");
        for p in pods_of(&a.pods, child, pods).await {
            assert_eq!(p.labels().get(POD_GROUP_LABEL).map(String::as_str), Some(child));
            assert_eq!(p.labels().get(JOBSET_NAME_LABEL).map(String::as_str), Some("ray"));
            assert!(is_gated(&p));
            // Every pod is addressable as <set>-<rjob>-<i>-<index>.<set> through the set's Service.
            let index = p.annotations().get(COMPLETION_INDEX_ANNOTATION).cloned().expect("a completion index");
            let spec = p.spec.unwrap();
            assert_eq!(spec.subdomain.as_deref(), Some("ray"));
            assert_eq!(spec.hostname, Some(format!("{child}-{index}")));
        }
    }
    let svc = eventually(&a.services, "ray").await;
    let selector = svc.spec.unwrap().selector.unwrap();
    assert_eq!(selector.get(JOBSET_NAME_LABEL).map(String::as_str), Some("ray"));

    let status = wait_for("status of the set", SHORT, || async {
        let s = a.sets.get("ray").await.ok()?.status?;
        (s.replicated_jobs_status.iter().map(|r| r.active).sum::<i32>() == 3).then_some(s)
    })
    .await;
    assert_eq!(status.workload_name.as_deref(), Some("ray"));
    assert_eq!(status.composite_pod_group_name.as_deref(), Some("ray"));
    assert_eq!(status.phase, Some(JobSetPhase::Pending));
    assert_eq!(status.progress.as_deref(), Some("0/3"));
}

/// Reads `(minCount in the Workload, minCount in the PodGroup, live pods)` of job `name`.
async fn counts(a: &Apis, name: &str) -> Option<(Option<i32>, Option<i32>, usize)> {
    let wl = a.workloads.get(name).await.ok()?;
    let pg = a.groups.get(name).await.ok()?;
    let lp = ListParams::default().labels(&format!("{JOB_NAME_LABEL}={name}"));
    let pods = a.pods.list(&lp).await.ok()?.items.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).count();
    let wl_min = wl.spec.pod_group_templates?.first()?.scheduling_policy.min_count();
    Some((wl_min, pg.spec.scheduling_policy.min_count(), pods))
}

async fn wait_counts(a: &Apis, name: &str, want: (i32, i32, usize)) {
    let want = (Some(want.0), Some(want.1), want.2);
    let what = format!("{name}: Workload minCount, PodGroup minCount, pods = {want:?}");
    wait_for(&what, SHORT, || async { (counts(a, name).await? == want).then_some(()) }).await;
}

#[tokio::test]
async fn min_count_and_parallelism_changes_reach_the_workload_and_podgroup() {
    let _muster = muster().await;
    let ns = namespace("job-resize");
    let a = apis(&ns.name).await;
    let job = |name: &str, parallelism: i32, gang: &str| {
        format!(
            "apiVersion: batch.muster.dev/v1alpha1\nkind: MusterJob\nmetadata: {{name: {name}}}\nspec:\n  parallelism: {parallelism}\n  scheduling: {{schedulingPolicy: {{gang: {gang}}}}}\n  template: {{spec: {{containers: [{{name: main, image: registry.invalid/none}}]}}}}\n"
        )
    };
    kubectl_apply(&ns.name, &job("explicit", 2, "{minCount: 2}"));
    kubectl_apply(&ns.name, &job("follows", 2, "{}"));
    wait_counts(&a, "explicit", (2, 2, 2)).await;
    wait_counts(&a, "follows", (2, 2, 2)).await;

    kubectl_apply(&ns.name, &job("explicit", 2, "{minCount: 1}"));
    wait_counts(&a, "explicit", (1, 1, 2)).await;
    kubectl_apply(&ns.name, &job("explicit", 4, "{minCount: 3}"));
    wait_counts(&a, "explicit", (3, 3, 4)).await;

    // Without minCount the quorum follows parallelism, up and down (gated pods go first).
    kubectl_apply(&ns.name, &job("follows", 3, "{}"));
    wait_counts(&a, "follows", (3, 3, 3)).await;
    kubectl_apply(&ns.name, &job("follows", 1, "{}"));
    wait_counts(&a, "follows", (1, 1, 1)).await;
    let status = wait_for("follows status for generation 3", SHORT, || async {
        let j = a.jobs.get("follows").await.ok()?;
        (j.status.as_ref()?.observed_generation == j.metadata.generation).then_some(j.status?)
    })
    .await;
    assert_eq!(status.active, 1);
}

#[tokio::test]
async fn a_jobset_template_resize_reaches_its_children_and_their_podgroups() {
    let _muster = muster().await;
    let ns = namespace("jobset-resize");
    let a = apis(&ns.name).await;
    kubectl_apply(
        &ns.name,
        r#"
apiVersion: batch.muster.dev/v1alpha1
kind: MusterJobSet
metadata: {name: elastic}
spec:
  scheduling: {schedulingPolicy: {gang: {}}}
  replicatedJobs:
  - name: workers
    replicas: 2
    template:
      spec:
        parallelism: 2
        scheduling: {schedulingPolicy: {gang: {minCount: 2}}}
        template: {spec: {containers: [{name: main, image: registry.invalid/none}]}}
"#,
    );
    let state = |child: &'static str| {
        let a = &a;
        async move {
            let wl = a.workloads.get("elastic").await.ok()?;
            let root = wl.spec.composite_pod_group_templates?.into_iter().next()?;
            let template_min = root.pod_group_templates?.first()?.scheduling_policy.min_count();
            let pg_min = a.groups.get(child).await.ok()?.spec.scheduling_policy.min_count();
            let lp = ListParams::default().labels(&format!("{JOB_NAME_LABEL}={child}"));
            let pods = a.pods.list(&lp).await.ok()?.items;
            let live = pods.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).count();
            Some((template_min, pg_min, live))
        }
    };
    for child in ["elastic-workers-0", "elastic-workers-1"] {
        wait_for(&format!("{child} at 2"), SHORT, || async {
            (state(child).await? == (Some(2), Some(2), 2)).then_some(())
        })
        .await;
    }
    let resize = r#"[
        {"op": "replace", "path": "/spec/replicatedJobs/0/template/spec/parallelism", "value": 3},
        {"op": "replace", "path": "/spec/replicatedJobs/0/template/spec/scheduling/schedulingPolicy/gang/minCount", "value": 3}]"#;
    kubectl(&["-n", &ns.name, "patch", "musterjobset", "elastic", "--type=json", "-p", resize]);
    for child in ["elastic-workers-0", "elastic-workers-1"] {
        wait_for(&format!("{child} at 3"), SHORT, || async {
            (state(child).await? == (Some(3), Some(3), 3)).then_some(())
        })
        .await;
        let spec = a.jobs.get(child).await.unwrap().spec;
        assert_eq!(spec.parallelism, 3);
        assert_eq!(spec.scheduling.and_then(|s| s.scheduling_policy).and_then(|p| p.min_count()), Some(3));
    }
}

/// A failed child restarts the whole set (`failurePolicy.maxRestarts`): the children are
/// deleted and made again under the same names, each with a PodGroup of its own; when the last
/// attempt fails too, the set fails.
#[tokio::test]
async fn a_failed_child_restarts_the_set_until_max_restarts() {
    let _muster = muster().await;
    let ns = namespace("jobset-restart");
    let a = apis(&ns.name).await;
    kubectl_apply(
        &ns.name,
        r#"
apiVersion: batch.muster.dev/v1alpha1
kind: MusterJobSet
metadata: {name: retry}
spec:
  scheduling: {schedulingPolicy: {gang: {}}}
  failurePolicy: {maxRestarts: 1}
  replicatedJobs:
  - name: steady
    template:
      spec:
        template: {spec: {containers: [{name: main, image: registry.invalid/none}]}}
  - name: flaky
    template:
      spec:
        backoffLimit: 0
        template:
          metadata: {annotations: {sim.muster.dev/fail-after: "1s"}}
          spec: {containers: [{name: main, image: registry.invalid/none}]}
"#,
    );
    let first = eventually(&a.jobs, "retry-flaky-0").await.uid().unwrap();
    let set = wait_for("the set Failed after one restart", LONG, || async {
        let set = a.sets.get("retry").await.ok()?;
        (set.status.as_ref()?.phase == Some(JobSetPhase::Failed)).then_some(set)
    })
    .await;
    let status = set.status.unwrap();
    assert_eq!(status.restarts, 1);
    let failed = condition(&status.conditions, "Failed").expect("a Failed condition");
    assert_eq!(failed.reason, "ReachedMaxRestarts", "JobSet writes FailedJobs only without a failurePolicy");
    let child = a.jobs.get("retry-flaky-0").await.unwrap();
    assert_ne!(child.uid().unwrap(), first, "the child was made again");
    let child_status = child.status.unwrap();
    assert_eq!(child_status.phase, Some(JobPhase::Failed), "{:?}", child_status.conditions);
    let group = a.groups.get("retry-flaky-0").await.unwrap();
    let owners = group.metadata.owner_references.unwrap_or_default();
    assert!(controller_of(&owners[0], "MusterJob", "retry-flaky-0", &child.metadata.uid.unwrap()), "{owners:?}");
}

#[tokio::test]
async fn deleting_a_jobset_collects_everything_it_made() {
    let _muster = muster().await;
    let ns = namespace("jobset-gc");
    let a = apis(&ns.name).await;
    kubectl_apply(
        &ns.name,
        r#"
apiVersion: batch.muster.dev/v1alpha1
kind: MusterJobSet
metadata: {name: doomed}
spec:
  scheduling: {schedulingPolicy: {gang: {}}}
  replicatedJobs:
  - name: driver
    template: {spec: {template: {spec: {containers: [{name: main, image: registry.invalid/none}]}}}}
  - name: workers
    replicas: 2
    template:
      spec:
        parallelism: 2
        scheduling: {schedulingPolicy: {gang: {}}}
        template: {spec: {containers: [{name: main, image: registry.invalid/none}]}}
"#,
    );
    let all = ListParams::default();
    wait_for("5 pods of the set", SHORT, || async { (a.pods.list(&all).await.ok()?.items.len() == 5).then_some(()) })
        .await;
    // Admitted, bound and running, not only gated.
    wait_for("the set's pods running", LONG, || async {
        let pods = a.pods.list(&all).await.ok()?.items;
        pods.iter().all(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).then_some(())
    })
    .await;
    assert_eq!(a.jobs.list(&all).await.unwrap().items.len(), 3);
    assert_eq!(a.groups.list(&all).await.unwrap().items.len(), 3);

    kubectl(&["-n", &ns.name, "delete", "musterjobset", "doomed", "--wait=false"]);
    let left = || async {
        Some((
            a.sets.list(&all).await.ok()?.items.len(),
            a.jobs.list(&all).await.ok()?.items.len(),
            a.workloads.list(&all).await.ok()?.items.len(),
            a.composites.list(&all).await.ok()?.items.len(),
            a.groups.list(&all).await.ok()?.items.len(),
            a.pods.list(&all).await.ok()?.items.len(),
            a.services.get_opt("doomed").await.ok()?.is_some(),
        ))
    };
    wait_for("sets, jobs, Workloads, CompositePodGroups, PodGroups, pods, Service all gone", LONG, || async {
        (left().await? == (0, 0, 0, 0, 0, 0, false)).then_some(())
    })
    .await;
}

/// A namespace deleted with running MusterJobs in it goes as one with batch/v1 Jobs does. The
/// namespace controller deletes the pods first and waits for them (ordered namespace deletion);
/// every replacement pod the job then plans is refused (the namespace is terminating). The
/// deleted pods must still be counted and their tracking finalizers released, as batch/v1's
/// Job controller does, or the namespace (and the pods' GPUs) stay stuck.
#[tokio::test]
async fn a_namespace_deleted_with_running_jobs_in_it_goes() {
    let _muster = muster().await;
    let ns = namespace("job-ns-delete");
    let a = apis(&ns.name).await;
    let pod = "{spec: {containers: [{name: main, image: registry.invalid/none}]}}";
    kubectl_apply(
        &ns.name,
        &format!(
            r#"
apiVersion: batch.muster.dev/v1alpha1
kind: MusterJob
metadata: {{name: gang}}
spec:
  parallelism: 2
  completions: 2
  scheduling: {{schedulingPolicy: {{gang: {{}}}}}}
  template: {pod}
---
apiVersion: batch.muster.dev/v1alpha1
kind: MusterJob
metadata: {{name: plain}}
spec:
  parallelism: 1
  template: {pod}
---
apiVersion: batch/v1
kind: Job
metadata: {{name: native}}
spec:
  parallelism: 1
  template: {{spec: {{restartPolicy: Never, containers: [{{name: main, image: registry.invalid/none}}]}}}}
"#
        ),
    );
    let all = ListParams::default();
    wait_for("4 pods running", LONG, || async {
        let pods = a.pods.list(&all).await.ok()?.items;
        let running = pods.iter().filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"));
        (running.count() == 4).then_some(())
    })
    .await;
    kubectl(&["delete", "namespace", &ns.name, "--wait=false"]);
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client().await);
    let gone = wait_for_opt(LONG, || async { matches!(namespaces.get_opt(&ns.name).await, Ok(None)).then_some(()) });
    if gone.await.is_none() {
        // What holds it: the pods left and their finalizers.
        let pods = a.pods.list(&all).await.map(|l| l.items).unwrap_or_default();
        let held: Vec<(String, Vec<String>)> =
            pods.iter().map(|p| (p.name_any(), p.metadata.finalizers.clone().unwrap_or_default())).collect();
        panic!("namespace {} still there after {LONG:?}; its pods and their finalizers: {held:?}", ns.name);
    }
}

#[tokio::test]
async fn failed_pods_are_replaced_until_the_backoff_limit_then_the_job_fails() {
    let _muster = muster().await;
    let ns = namespace("job-fail");
    let a = apis(&ns.name).await;
    kubectl_apply(
        &ns.name,
        r#"
apiVersion: batch.muster.dev/v1alpha1
kind: MusterJob
metadata: {name: flaky}
spec:
  parallelism: 1
  backoffLimit: 2
  template:
    metadata: {annotations: {sim.muster.dev/fail-after: "1s"}}
    spec: {restartPolicy: Never, containers: [{name: main, image: registry.invalid/none}]}
"#,
    );
    let job = wait_for("flaky Failed", LONG, || async {
        let job = a.jobs.get("flaky").await.ok()?;
        (job.status.as_ref()?.phase == Some(JobPhase::Failed)).then_some(job)
    })
    .await;
    let status = job.status.unwrap();
    let failed = condition(&status.conditions, "Failed").expect("a Failed condition");
    assert_eq!((failed.status.as_str(), failed.reason.as_str()), ("True", "BackoffLimitExceeded"));
    assert_eq!(status.failed, 3, "backoffLimit 2: the third failure fails the job");
    assert_eq!((status.active, status.succeeded), (0, 0));
    assert!(status.completion_time.is_none(), "batch/v1 sets completionTime only on Complete");
    let pods = a.pods.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(pods.len(), 3, "two replacements, then no more");
    assert!(pods.iter().all(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed")));
    let events = wait_for("a BackoffLimitExceeded warning", SHORT, || async {
        let events = events_of(&ns.name, "flaky").await;
        events.iter().any(|(t, r, _)| t == "Warning" && r == "BackoffLimitExceeded").then_some(events)
    })
    .await;
    assert!(events.iter().any(|(t, r, _)| t == "Normal" && r == "SuccessfulCreate"), "{events:?}");
}

#[tokio::test]
async fn succeeded_pods_complete_the_job_and_kubectl_shows_completions() {
    let _muster = muster().await;
    let ns = namespace("job-complete");
    let a = apis(&ns.name).await;
    kubectl_apply(
        &ns.name,
        r#"
apiVersion: batch.muster.dev/v1alpha1
kind: MusterJob
metadata: {name: quick}
spec:
  parallelism: 2
  completions: 2
  completionMode: Indexed
  scheduling: {schedulingPolicy: {gang: {}}}
  template:
    metadata: {annotations: {sim.muster.dev/succeed-after: "2s"}}
    spec: {restartPolicy: Never, containers: [{name: main, image: registry.invalid/none}]}
"#,
    );
    let job = wait_for("quick Complete", LONG, || async {
        let job = a.jobs.get("quick").await.ok()?;
        (job.status.as_ref()?.phase == Some(JobPhase::Complete)).then_some(job)
    })
    .await;
    let status = job.status.unwrap();
    let complete = condition(&status.conditions, "Complete").expect("a Complete condition");
    assert_eq!((complete.status.as_str(), complete.reason.as_str()), ("True", "CompletionsReached"));
    assert_eq!((status.succeeded, status.failed, status.active), (2, 0, 0));
    assert_eq!(status.completed_indexes.as_deref(), Some("0,1"), "batch/v1 writes two consecutive indexes so");
    assert!(status.start_time.is_some() && status.completion_time.is_some());

    let table = kubectl(&["-n", &ns.name, "get", "musterjobs", "-o", "wide"]);
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(&header[..4], ["NAME", "COMPLETIONS", "PHASE", "PODGROUP"], "{table}");
    assert_eq!(&row[..4], ["quick", "2/2", "Complete", "quick"], "{table}");
    let events = events_of(&ns.name, "quick").await;
    assert!(events.iter().any(|(t, r, _)| t == "Normal" && r == "Completed"), "{events:?}");
}

/// A template change that got past the webhook (its configuration deleted for a moment) makes
/// the job `Invalid` with reason `FrozenFieldChanged`; it then ignores even allowed changes
/// until the frozen fields are back as they were.
#[tokio::test]
async fn frozen_field_changed_behind_the_webhook_marks_the_job_invalid_until_reverted() {
    let muster = muster_exclusive().await;
    let ns = namespace("job-frozen");
    let a = apis(&ns.name).await;
    kubectl_apply(
        &ns.name,
        r#"
apiVersion: batch.muster.dev/v1alpha1
kind: MusterJob
metadata: {name: frozen}
spec:
  parallelism: 2
  scheduling: {schedulingPolicy: {gang: {}}}
  template:
    metadata: {labels: {app: frozen}}
    spec: {containers: [{name: main, image: registry.invalid/none}]}
"#,
    );
    wait_counts(&a, "frozen", (2, 2, 2)).await;
    let generation = |j: &MusterJob| j.metadata.generation;
    let patch = |p: &'static str| ["-n", ns.name.as_str(), "patch", "musterjob", "frozen", "--type=merge", "-p", p];

    let webhook_away = muster.without_validating_webhook().await;
    let args = patch(r#"{"spec":{"template":{"metadata":{"labels":{"version":"2"}}}}}"#);
    webhook_away.write(&args, None).await;
    let job = wait_for("frozen Invalid", SHORT, || async {
        let j = a.jobs.get("frozen").await.ok()?;
        let invalid = condition(&j.status.as_ref()?.conditions, "Invalid")?.status == "True";
        (invalid && j.status.as_ref()?.observed_generation == generation(&j)).then_some(j)
    })
    .await;
    let status = job.status.clone().unwrap();
    let invalid = condition(&status.conditions, "Invalid").unwrap();
    assert_eq!(invalid.reason, "FrozenFieldChanged");
    assert!(invalid.message.contains("spec.template"), "{}", invalid.message);
    assert_eq!(status.phase, Some(JobPhase::Invalid));
    let events = wait_for("a FrozenFieldChanged warning", SHORT, || async {
        let events = events_of(&ns.name, "frozen").await;
        events.iter().any(|(t, r, _)| t == "Warning" && r == "FrozenFieldChanged").then_some(events)
    })
    .await;
    assert!(!events.is_empty());

    // An allowed change is seen (observedGeneration moves) but not acted on.
    let args = patch(r#"{"spec":{"parallelism":3}}"#);
    kubectl(&args);
    wait_for("the parallelism change observed", SHORT, || async {
        let j = a.jobs.get("frozen").await.ok()?;
        (j.status.as_ref()?.observed_generation == generation(&j) && generation(&job) < generation(&j)).then_some(())
    })
    .await;
    assert_eq!(counts(&a, "frozen").await, Some((Some(2), Some(2), 2)), "nothing acted on while Invalid");

    // Reverting the frozen field (the webhook would refuse that too) brings the job back.
    let args = patch(r#"{"spec":{"template":{"metadata":{"labels":{"version":null}}}}}"#);
    webhook_away.write(&args, None).await;
    webhook_away.restore().await;
    wait_counts(&a, "frozen", (3, 3, 3)).await;
    // The status is written after the pods, at the end of the same reconcile.
    let status = wait_for("frozen no longer Invalid", SHORT, || async {
        let status = a.jobs.get("frozen").await.ok()?.status?;
        (condition(&status.conditions, "Invalid")?.status == "False").then_some(status)
    })
    .await;
    assert!(matches!(status.phase, Some(JobPhase::Pending | JobPhase::Running)), "{:?}", status.phase);
}

/// `spec.template.metadata.creationTimestamp` with ten fractional digits passes the CRD schema
/// (a `date-time`) but not muster's types (at most nanoseconds). The webhook refuses such a job,
/// so it is created with the webhook away; the controllers skip it and keep serving the others.
#[tokio::test]
async fn a_musterjob_that_does_not_decode_stalls_nothing() {
    let muster = muster_exclusive().await;
    let ns = namespace("job-malformed");
    let a = apis(&ns.name).await;
    let bad = r#"
apiVersion: batch.muster.dev/v1alpha1
kind: MusterJob
metadata: {name: malformed}
spec:
  template:
    metadata: {creationTimestamp: "2024-01-01T00:00:00.1234567891Z"}
    spec: {containers: [{name: main, image: registry.invalid/none}]}
"#;
    let refused = crate::harness::cluster()
        .kubectl_stdin(&["-n", &ns.name, "create", "-f", "-"], Some(bad))
        .expect_err("the webhook refuses a job it cannot decode");
    assert!(refused.contains("cannot decode the object: spec.template.metadata.creationTimestamp"), "{refused}");
    let webhook_away = muster.without_validating_webhook().await;
    webhook_away.write(&["-n", &ns.name, "create", "-f", "-"], Some(bad)).await;
    webhook_away.restore().await;
    drop(muster);
    let _muster = crate::harness::manager::muster().await;

    kubectl_apply(
        &ns.name,
        r#"
apiVersion: batch.muster.dev/v1alpha1
kind: MusterJob
metadata: {name: fine}
spec:
  template: {spec: {containers: [{name: main, image: registry.invalid/none}]}}
---
apiVersion: batch.muster.dev/v1alpha1
kind: MusterJobSet
metadata: {name: fine-set}
spec:
  scheduling: {schedulingPolicy: {gang: {}}}
  replicatedJobs:
  - name: r
    template: {spec: {template: {spec: {containers: [{name: main, image: registry.invalid/none}]}}}}
"#,
    );
    eventually(&a.groups, "fine").await;
    pods_of(&a.pods, "fine", 1).await;
    eventually(&a.groups, "fine-set-r-0").await;
    pods_of(&a.pods, "fine-set-r-0", 1).await;
    assert!(a.groups.get_opt("malformed").await.unwrap().is_none(), "the malformed job is skipped");
    let raw = kubectl(&["-n", &ns.name, "get", "musterjob", "malformed", "-o", "jsonpath={.status}"]);
    assert_eq!(raw, "", "and gets no status");
    let events = wait_for("a DecodeFailed warning on the malformed job", SHORT, || async {
        let events = events_of(&ns.name, "malformed").await;
        events.iter().any(|(t, r, _)| t == "Warning" && r == "DecodeFailed").then_some(events)
    })
    .await;
    assert!(events.iter().any(|(_, _, m)| m.contains("unparsed input")), "{events:?}");
}

#[tokio::test]
async fn metrics_count_reconciles_errors_and_durations() {
    let muster = muster().await;
    let ns = namespace("job-metrics");
    let a = apis(&ns.name).await;
    // A child of a set (a MusterJobSet controls it) whose parent CompositePodGroup does not
    // exist: each reconcile fails.
    kubectl_apply(
        &ns.name,
        r#"
apiVersion: batch.muster.dev/v1alpha1
kind: MusterJobSet
metadata: {name: parent}
spec:
  replicatedJobs:
  - name: workers
    template:
      spec:
        template: {spec: {restartPolicy: Never, containers: [{name: main, image: registry.invalid/none}]}}
"#,
    );
    let set = eventually(&a.sets, "parent").await;
    let set_uid = set.metadata.uid.clone().unwrap_or_default();
    let orphan = child_of_set(
        "orphan",
        "missing",
        ("parent", &set_uid),
        "containers: [{name: main, image: registry.invalid/none}]",
    );
    kubectl_apply(
        &ns.name,
        &format!(
            r#"{orphan}
---
apiVersion: batch.muster.dev/v1alpha1
kind: MusterJob
metadata: {{name: fine}}
spec:
  template: {{spec: {{containers: [{{name: main, image: registry.invalid/none}}]}}}}
"#
        ),
    );
    eventually(&a.groups, "fine").await;
    let text = wait_for("a counted reconcile error", SHORT, || async {
        let text = muster.metrics().await;
        (metric(&text, "muster_reconcile_errors_total", &[("controller", "job"), ("reason", "missing")]) >= 1.0)
            .then_some(text)
    })
    .await;
    assert!(metric(&text, "muster_reconciles_total", &[("controller", "job")]) >= 2.0, "{text}");
    let count = metric(&text, "muster_reconcile_duration_seconds_count", &[("controller", "job")]);
    assert!(count >= 2.0, "{text}");
    let inf = metric(&text, "muster_reconcile_duration_seconds_bucket", &[("controller", "job"), ("le", "+Inf")]);
    assert_eq!(inf, count, "every reconcile lands in a bucket");
    assert!(metric(&text, "muster_reconcile_duration_seconds_sum", &[("controller", "job")]) > 0.0);
    assert!(a.groups.get_opt("orphan").await.unwrap().is_none());
}

/// Issue 38: the delegation annotations a tenant may write on any MusterJob never make it join
/// a set's CompositePodGroup, and a job never rewrites a Service muster does not own.
#[tokio::test]
async fn forged_delegation_joins_no_set_and_a_foreign_service_is_left_alone() {
    let _muster = muster().await;
    let ns = namespace("job-forged");
    let a = apis(&ns.name).await;
    kubectl_apply(
        &ns.name,
        &format!(
            r#"
apiVersion: batch.muster.dev/v1alpha1
kind: MusterJobSet
metadata: {{name: victim}}
spec:
  scheduling: {{schedulingPolicy: {{gang: {{}}}}}}
  replicatedJobs:
  - name: workers
    template:
      spec:
        template: {{spec: {{restartPolicy: Never, {NOWHERE}, containers: [{{name: main, image: registry.invalid/none}}]}}}}
---
apiVersion: v1
kind: Service
metadata: {{name: indexed}}
spec:
  selector: {{app: theirs}}
  ports: [{{port: 80}}]
"#
        ),
    );
    let root = wait_for("the set's CompositePodGroup", SHORT, || async {
        a.composites.get_opt("victim").await.ok().flatten()
    })
    .await;
    // Annotations alone, naming the set's own group and template: a standalone job.
    kubectl_apply(
        &ns.name,
        &format!(
            r#"
apiVersion: batch.muster.dev/v1alpha1
kind: MusterJob
metadata:
  name: forged
  annotations:
    scheduling.muster.dev/group-template-name: workers
    scheduling.muster.dev/parent-composite-podgroup: victim
spec:
  template: {{spec: {{restartPolicy: Never, {NOWHERE}, containers: [{{name: main, image: registry.invalid/none}}]}}}}
---
apiVersion: batch.muster.dev/v1alpha1
kind: MusterJob
metadata: {{name: indexed}}
spec:
  completionMode: Indexed
  completions: 1
  template: {{spec: {{restartPolicy: Never, {NOWHERE}, containers: [{{name: main, image: registry.invalid/none}}]}}}}
"#
        ),
    );
    let group = eventually(&a.groups, "forged").await;
    assert_eq!(group.spec.parent_composite_pod_group_name, None, "{group:?}");
    eventually(&a.workloads, "forged").await;
    // A job owned by a set, naming a CompositePodGroup its set does not control: refused.
    let other_uid = eventually(&a.sets, "victim").await.metadata.uid.unwrap_or_default();
    kubectl_apply(
        &ns.name,
        r#"
apiVersion: batch.muster.dev/v1alpha1
kind: MusterJobSet
metadata: {name: mine}
spec:
  replicatedJobs:
  - name: workers
    replicas: 0
    template:
      spec:
        template: {spec: {restartPolicy: Never, containers: [{name: main, image: registry.invalid/none}]}}
"#,
    );
    let mine_uid = eventually(&a.sets, "mine").await.metadata.uid.unwrap_or_default();
    assert_ne!(mine_uid, other_uid);
    let pod_spec =
        format!("restartPolicy: Never, {NOWHERE}, containers: [{{name: main, image: registry.invalid/none}}]");
    kubectl_apply(&ns.name, &child_of_set("stray", "victim", ("mine", &mine_uid), &pod_spec));
    let refused = wait_for("the stray child refused", SHORT, || async {
        let job = a.jobs.get_opt("stray").await.ok().flatten()?;
        let conditions = job.status?.conditions;
        condition(&conditions, "Invalid").filter(|c| c.reason == "NotInSet").cloned()
    })
    .await;
    assert!(refused.message.contains("CompositePodGroup victim"), "{refused:?}");
    assert!(a.groups.get_opt("stray").await.unwrap().is_none(), "no PodGroup joins the other set's group");
    // The set's own group is as it was: the forged and the stray job added no child to it.
    let after = a.composites.get_opt("victim").await.unwrap().unwrap();
    assert_eq!(after.spec, root.spec);
    // The Indexed job's headless Service would be `indexed`: the user's Service keeps its own.
    wait_for("the ServiceConflict event", SHORT, || async {
        events_of(&ns.name, "indexed").await.into_iter().find(|(_, reason, _)| reason == "ServiceConflict")
    })
    .await;
    let services: Api<Service> = Api::namespaced(client().await, &ns.name);
    let svc = services.get("indexed").await.unwrap();
    let spec = svc.spec.unwrap_or_default();
    assert_eq!(spec.selector, Some([("app".to_string(), "theirs".to_string())].into()));
    assert!(svc.metadata.owner_references.unwrap_or_default().is_empty());
}

/// A MusterJob `name` as a set's child looks: the delegation annotations (template `workers`,
/// CompositePodGroup `parent`) and the set `(name, uid)` as its controller; `pod_spec` is the
/// inside of its pod template's spec.
fn child_of_set(name: &str, parent: &str, (set, uid): (&str, &str), pod_spec: &str) -> String {
    format!(
        r#"
apiVersion: batch.muster.dev/v1alpha1
kind: MusterJob
metadata:
  name: {name}
  annotations:
    scheduling.muster.dev/group-template-name: workers
    scheduling.muster.dev/parent-composite-podgroup: {parent}
  ownerReferences:
  - {{apiVersion: batch.muster.dev/v1alpha1, kind: MusterJobSet, name: {set}, uid: {uid}, controller: true}}
spec:
  template: {{spec: {{{pod_spec}}}}}
"#
    )
}

//! The control plane itself: CRDs, kube-scheduler on kwok GPU nodes, the garbage collector,
//! the kwok simulation annotations, and upstream gang scheduling of a batch/v1 Job.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::api::scheduling::v1beta1::{PodGroup, Workload};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use muster_dev::{FakeGpuNodes, GPU_RESOURCE, TopologyKind};
use serde_json::{Value, json};

use crate::harness::manager::muster;
use crate::harness::{POOL_PREFIX, add_gpu_nodes, client, cluster, kubectl, kubectl_apply, namespace, wait_for};

const SHORT: Duration = Duration::from_secs(30);
const LONG: Duration = Duration::from_secs(90);

fn pod(name: &str, gpus: u32, annotations: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 30,
            "containers": [{"name": "main", "image": "registry.invalid/none",
                "resources": {"limits": {GPU_RESOURCE: gpus.to_string()}}}],
        },
    }))
    .unwrap()
}

fn phase(p: &Pod) -> &str {
    p.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default()
}

fn is_ready(p: &Pod) -> bool {
    let conditions = p.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The Job's pods, once there are `n` of them.
async fn job_pods(pods: &Api<Pod>, job: &str, n: usize) -> Vec<Pod> {
    let lp = ListParams::default().labels(&format!("batch.kubernetes.io/job-name={job}"));
    wait_for(&format!("{n} pods of Job {job}"), SHORT, || async {
        let list = pods.list(&lp).await.ok()?;
        (list.items.len() >= n).then_some(list.items)
    })
    .await
}

#[test]
fn crds_install_and_explain_works() {
    let out = kubectl(&["explain", "musterjob.spec.scheduling"]);
    assert!(out.contains("schedulingPolicy"), "kubectl explain musterjob.spec.scheduling:\n{out}");
    let established = kubectl(&[
        "get",
        "crd",
        "-o",
        "jsonpath={range .items[?(@.spec.group==\"batch.muster.dev\")]}{.metadata.name}={.status.conditions[?(@.type==\"Established\")].status} {end}",
    ]);
    assert!(established.contains("musterjobs.batch.muster.dev=True"), "{established}");
    assert!(established.contains("musterjobsets.batch.muster.dev=True"), "{established}");
}

#[test]
fn apiserver_serves_upstream_scheduling_kinds() {
    let resources = kubectl(&["api-resources", "--api-group=scheduling.k8s.io", "-o", "name"]);
    for kind in ["workloads.scheduling.k8s.io", "podgroups.scheduling.k8s.io", "compositepodgroups.scheduling.k8s.io"] {
        assert!(resources.contains(kind), "{kind} not served:\n{resources}");
    }
    let features = std::fs::read_to_string(cluster().dir.join("features.txt")).unwrap();
    assert!(features.contains("GenericWorkload=true"), "{features}");
}

#[tokio::test]
async fn gpu_pod_is_bound_to_a_kwok_node_and_runs() {
    let ns = namespace("gpu-pod");
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    pods.create(&PostParams::default(), &pod("two-gpus", 2, json!({}))).await.unwrap();
    let running = wait_for("pod two-gpus Running and Ready", LONG, || async {
        let p = pods.get("two-gpus").await.ok()?;
        (phase(&p) == "Running" && is_ready(&p)).then_some(p)
    })
    .await;
    let node_name = running.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap();
    let node = Api::<Node>::all(client().await).get(&node_name).await.unwrap();
    assert_eq!(node.labels().get("type").map(String::as_str), Some("kwok"), "bound to {node_name}");
    assert_eq!(node.annotations().get("kwok.x-k8s.io/node").map(String::as_str), Some("fake"));
    assert!(running.status.unwrap().pod_ip.is_some(), "kwok gives running pods an IP");
}

#[tokio::test]
async fn add_nodes_is_idempotent_and_writes_the_topology() {
    let spec = FakeGpuNodes {
        prefix: "e2e-pcie-".into(),
        count: 2,
        topology: TopologyKind::Pcie,
        taint: true,
        ..FakeGpuNodes::default()
    };
    assert_eq!(add_gpu_nodes(&spec).await, ["e2e-pcie-0", "e2e-pcie-1"]);
    // The CLI does the same; applying again changes nothing.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_muster"))
        .args(["dev", "add-nodes", "--prefix", "e2e-pcie-", "-n", "2", "--topology", "pcie", "--taint", "--kubeconfig"])
        .arg(&cluster().kubeconfig)
        .output()
        .unwrap();
    assert!(out.status.success(), "muster dev add-nodes: {}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("node/e2e-pcie-1 applied"));

    let node = Api::<Node>::all(client().await).get("e2e-pcie-1").await.unwrap();
    let status = node.status.as_ref().unwrap();
    assert_eq!(status.allocatable.as_ref().unwrap()[GPU_RESOURCE].0, "8");
    assert_eq!(status.capacity.as_ref().unwrap()[GPU_RESOURCE].0, "8");
    let ready = status.conditions.as_ref().unwrap().iter().any(|c| c.type_ == "Ready" && c.status == "True");
    assert!(ready, "kwok made the node Ready");
    let topology: Value = serde_json::from_str(&node.annotations()["gpu.muster.dev/topology"]).unwrap();
    assert_eq!(topology["version"], 1);
    assert_eq!(topology["gpus"].as_array().unwrap().len(), 8);
    assert_eq!(topology["links"][0][1], "PIX");
    assert_eq!(topology["links"][0][4], "SYS");
    let taints = node.spec.as_ref().unwrap().taints.clone().unwrap();
    assert!(taints.iter().any(|t| t.key == "kwok.x-k8s.io/node" && t.effect == "NoSchedule"));
    assert_eq!(node.labels()["topology.muster.dev/rack"], "rack-1");
}

#[tokio::test]
async fn garbage_collector_deletes_owned_objects() {
    // The MusterJob below passes muster's validating webhook.
    let _muster = muster().await;
    let ns = namespace("gc");
    let client = client().await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let owner = maps
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "owner"}})).unwrap())
        .await
        .unwrap();
    let child = |name: &str, owner_ref: Value| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name, "ownerReferences": [owner_ref]}})).unwrap()
    };
    let cm_ref = json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.uid().unwrap()});
    maps.create(&PostParams::default(), &child("child-of-configmap", cm_ref)).await.unwrap();

    // A MusterJob owner: the garbage collector must know muster's CRDs too.
    kubectl_apply(
        &ns.name,
        r#"
apiVersion: batch.muster.dev/v1alpha1
kind: MusterJob
metadata: {name: owner}
spec:
  parallelism: 1
  template:
    spec:
      restartPolicy: Never
      containers: [{name: main, image: registry.invalid/none}]
"#,
    );
    let uid = kubectl(&["-n", &ns.name, "get", "musterjob", "owner", "-o", "jsonpath={.metadata.uid}"]);
    let mj_ref = json!({"apiVersion": "batch.muster.dev/v1alpha1", "kind": "MusterJob", "name": "owner", "uid": uid});
    maps.create(&PostParams::default(), &child("child-of-musterjob", mj_ref)).await.unwrap();

    maps.delete("owner", &DeleteParams::background()).await.unwrap();
    kubectl(&["-n", &ns.name, "delete", "musterjob", "owner", "--wait=false"]);
    for name in ["child-of-configmap", "child-of-musterjob"] {
        wait_for(&format!("{name} garbage-collected"), LONG, || async {
            maps.get_opt(name).await.ok().and_then(|c| c.is_none().then_some(()))
        })
        .await;
    }
}

#[tokio::test]
async fn kwok_simulates_success_failure_and_graceful_deletion() {
    let ns = namespace("sim");
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    let pp = PostParams::default();
    pods.create(&pp, &pod("succeeds", 0, json!({"sim.muster.dev/succeed-after": "1s"}))).await.unwrap();
    pods.create(&pp, &pod("fails", 0, json!({"sim.muster.dev/fail-after": "1s", "sim.muster.dev/exit-code": "3"})))
        .await
        .unwrap();
    pods.create(&pp, &pod("runs", 0, json!({}))).await.unwrap();

    wait_for("pod succeeds Succeeded", LONG, || async {
        (phase(&pods.get("succeeds").await.ok()?) == "Succeeded").then_some(())
    })
    .await;
    let failed = wait_for("pod fails Failed", LONG, || async {
        let p = pods.get("fails").await.ok()?;
        (phase(&p) == "Failed").then_some(p)
    })
    .await;
    let statuses = failed.status.unwrap().container_statuses.unwrap();
    assert_eq!(statuses[0].state.as_ref().unwrap().terminated.as_ref().unwrap().exit_code, 3);

    wait_for("pod runs Running", LONG, || async { (phase(&pods.get("runs").await.ok()?) == "Running").then_some(()) })
        .await;
    // A graceful delete (30 s grace) completes without a kubelet.
    pods.delete("runs", &DeleteParams::default()).await.unwrap();
    wait_for("pod runs deleted", SHORT, || async {
        pods.get_opt("runs").await.ok().and_then(|p| p.is_none().then_some(()))
    })
    .await;
}

#[tokio::test]
async fn job_pods_keep_running_without_a_simulation_annotation() {
    let ns = namespace("job-runs");
    let jobs: Api<Job> = Api::namespaced(client().await, &ns.name);
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": "steady"},
        "spec": {"template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "main", "image": "registry.invalid/none"}]}}},
    }))
    .unwrap();
    jobs.create(&PostParams::default(), &job).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    let name = job_pods(&pods, "steady", 1).await[0].name_any();
    wait_for("Job pod Running", LONG, || async { (phase(&pods.get(&name).await.ok()?) == "Running").then_some(()) })
        .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(phase(&pods.get(&name).await.unwrap()), "Running", "no stock stage completes Job pods");
}

/// A batch/v1 Job with `spec.scheduling.schedulingPolicy.gang`: the upstream Job controller
/// (gate WorkloadWithJob) makes a Workload and a PodGroup, the pods join the group through
/// `spec.schedulingGroup`, kube-scheduler's GangScheduling admits them together, and the
/// sim annotation lets the Job complete.
#[tokio::test]
async fn job_with_gang_policy_gets_an_upstream_workload_and_podgroup() {
    let ns = namespace("job-gang");
    let client = client().await;
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": "trainer"},
        "spec": {
            "parallelism": 2, "completions": 2, "completionMode": "Indexed",
            "scheduling": {"schedulingPolicy": {"gang": {"minCount": 2}}},
            "template": {
                "metadata": {"annotations": {"sim.muster.dev/succeed-after": "2s"}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "registry.invalid/none",
                    "resources": {"limits": {GPU_RESOURCE: "1"}}}]},
            },
        },
    }))
    .unwrap();
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns.name);
    let job = jobs.create(&PostParams::default(), &job).await.unwrap();
    let gang = job.spec.as_ref().and_then(|s| s.scheduling.as_ref()).and_then(|s| s.scheduling_policy.as_ref());
    assert_eq!(
        gang.and_then(|p| p.gang.as_ref()).and_then(|g| g.min_count),
        Some(2),
        "the apiserver kept spec.scheduling"
    );

    let workloads: Api<Workload> = Api::namespaced(client.clone(), &ns.name);
    let workload = wait_for("a Workload for Job trainer", SHORT, || async {
        workloads.list(&ListParams::default()).await.ok()?.items.into_iter().next()
    })
    .await;
    let controller = workload.spec.controller_ref.as_ref().unwrap();
    assert_eq!((controller.kind.as_str(), controller.name.as_str()), ("Job", "trainer"));
    let groups: Api<PodGroup> = Api::namespaced(client.clone(), &ns.name);
    let group = wait_for("a PodGroup for Job trainer", SHORT, || async {
        groups.list(&ListParams::default()).await.ok()?.items.into_iter().next()
    })
    .await;
    assert_eq!(group.spec.workload_ref.as_ref().unwrap().workload_name, workload.name_any());
    assert_eq!(group.spec.scheduling_policy.gang.as_ref().map(|g| g.min_count), Some(2));

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    for p in job_pods(&pods, "trainer", 2).await {
        let joined = p.spec.as_ref().and_then(|s| s.scheduling_group.as_ref()).and_then(|g| g.pod_group_name.clone());
        assert_eq!(joined, Some(group.name_any()), "pod {} joins the PodGroup", p.name_any());
    }
    wait_for("PodGroupInitiallyScheduled=True", LONG, || async {
        let g = groups.get(&group.name_any()).await.ok()?;
        let conditions = g.status?.conditions?;
        conditions.iter().any(|c| c.type_ == "PodGroupInitiallyScheduled" && c.status == "True").then_some(())
    })
    .await;
    wait_for("Job trainer Complete", LONG, || async {
        let conditions = jobs.get("trainer").await.ok()?.status?.conditions?;
        conditions.iter().any(|c| c.type_ == "Complete" && c.status == "True").then_some(())
    })
    .await;
}

/// All or nothing: a gang of three 8-GPU pods on two free 8-GPU nodes binds no pod at all;
/// a third node lets the whole gang start.
#[tokio::test]
async fn upstream_gang_binds_nothing_until_the_whole_gang_fits() {
    let ns = namespace("gang-fit");
    let prefix = format!("{}-", ns.name);
    let mut nodes = FakeGpuNodes {
        prefix: prefix.clone(),
        count: 2,
        taint: true,
        labels: vec![("muster.dev/e2e".into(), ns.name.clone())],
        ..FakeGpuNodes::default()
    };
    add_gpu_nodes(&nodes).await;
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": "wide"},
        "spec": {
            "parallelism": 3, "completions": 3, "completionMode": "Indexed",
            "scheduling": {"schedulingPolicy": {"gang": {"minCount": 3}}},
            "template": {"spec": {
                "restartPolicy": "Never",
                "nodeSelector": {"muster.dev/e2e": ns.name},
                "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [{"name": "main", "image": "registry.invalid/none", "resources": {"limits": {GPU_RESOURCE: "8"}}}],
            }},
        },
    }))
    .unwrap();
    let client = client().await;
    Api::<Job>::namespaced(client.clone(), &ns.name).create(&PostParams::default(), &job).await.unwrap();
    let groups: Api<PodGroup> = Api::namespaced(client.clone(), &ns.name);
    let unschedulable = wait_for("the PodGroup reported Unschedulable", LONG, || async {
        let g = groups.list(&ListParams::default()).await.ok()?.items.into_iter().next()?;
        let conditions = g.status?.conditions?;
        conditions
            .into_iter()
            .find(|c| c.type_ == "PodGroupInitiallyScheduled" && c.status == "False" && c.reason == "Unschedulable")
    })
    .await;
    assert!(unschedulable.message.contains("minCount (3)"), "{}", unschedulable.message);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    for p in job_pods(&pods, "wide", 3).await {
        assert_eq!(p.spec.and_then(|s| s.node_name), None, "no pod of a gang that does not fit is bound");
    }

    nodes.start_index = 2;
    nodes.count = 1;
    add_gpu_nodes(&nodes).await;
    let bound = wait_for("all three pods Running", LONG, || async {
        let list = pods.list(&ListParams::default()).await.ok()?.items;
        (list.len() == 3 && list.iter().all(|p| phase(p) == "Running")).then_some(list)
    })
    .await;
    let mut hosts: Vec<String> = bound.iter().filter_map(|p| p.spec.as_ref()?.node_name.clone()).collect();
    hosts.sort();
    assert_eq!(hosts, [format!("{prefix}0"), format!("{prefix}1"), format!("{prefix}2")]);
    assert!(!hosts.iter().any(|h| h.starts_with(POOL_PREFIX)));
}

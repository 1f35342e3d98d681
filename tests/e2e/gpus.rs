//! GPU indices end to end: disjoint sets for gangs admitted together, indices freed by a
//! finished pod going to the next one, indices for GPU pods kube-scheduler bound without
//! muster, the GPU gauges and conflict counter, and a hot GPU (fake DCGM exporter -> real
//! Prometheus -> `muster run --prometheus-url`) left out and reported on the Node.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use muster::crds::scheduling::GroupPhase;
use muster::crds::{GPU_INDICES_ANNOTATION, PodGroup};
use serde_json::json;

use crate::gangs::{
    LONG, TestNodes, all_bound, apply, events_of, gang, gated, gpu_job, indices_by_node, indices_of, job_pods, node_of,
    phase, plain_pod,
};
use crate::harness::dcgm::gpu_metrics;
use crate::harness::extra::extra_muster;
use crate::harness::manager::muster;
use crate::harness::{client, metric, namespace, wait_for};

/// A pod without a PodGroup (so muster does not admit it) with `gpus` GPUs on `nodes`.
async fn group_phase(groups: &Api<PodGroup>, name: &str) -> Option<GroupPhase> {
    groups.get_opt(name).await.ok().flatten()?.status?.phase
}

#[tokio::test]
async fn gangs_admitted_together_get_disjoint_gpu_indices() {
    let _muster = muster().await;
    let ns = namespace("gpu-disjoint");
    let nodes = TestNodes::add(&ns.name, 2, 4, 1).await;
    // 4 x 1 + 2 x 2 GPUs: exactly the 8 GPUs of the two nodes.
    apply(&ns.name, &gpu_job("ones", 4, 1, &nodes, gang(4), json!({})));
    apply(&ns.name, &gpu_job("twos", 2, 2, &nodes, gang(2), json!({})));
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    let mut bound = all_bound(&pods, "ones", 4).await;
    bound.extend(all_bound(&pods, "twos", 2).await);
    let want: BTreeMap<String, Vec<u32>> = nodes.names.iter().map(|n| (n.clone(), vec![0, 1, 2, 3])).collect();
    assert_eq!(indices_by_node(&bound), want, "no GPU given twice, none left over");
    for p in job_pods(&pods, "twos").await {
        assert_eq!(indices_of(&p).map(|i| i.split(',').count()), Some(2), "pod {}", p.name_any());
    }
}

#[tokio::test]
async fn a_finished_pod_frees_its_gpus_for_the_next_pod() {
    let _muster = muster().await;
    let ns = namespace("gpu-free");
    let nodes = TestNodes::add(&ns.name, 1, 4, 1).await;
    apply(&ns.name, &gpu_job("first", 1, 2, &nodes, gang(1), json!({})));
    apply(&ns.name, &gpu_job("steady", 1, 2, &nodes, gang(1), json!({})));
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    let first = all_bound(&pods, "first", 1).await.remove(0);
    let steady = all_bound(&pods, "steady", 1).await.remove(0);
    let first_indices = indices_of(&first).unwrap().to_string();
    assert_ne!(Some(first_indices.as_str()), indices_of(&steady));

    apply(&ns.name, &gpu_job("next", 1, 2, &nodes, gang(1), json!({})));
    let groups: Api<PodGroup> = Api::namespaced(client().await, &ns.name);
    wait_for("next to wait for GPUs", LONG, || async {
        (group_phase(&groups, "next").await == Some(GroupPhase::Unschedulable)).then_some(())
    })
    .await;
    assert!(job_pods(&pods, "next").await.iter().all(gated), "next waits while first holds the GPUs");

    // kwok ends the pod now (the delay counts from its start).
    let finish = json!({"metadata": {"annotations": {"sim.muster.dev/succeed-after": "0s"}}});
    pods.patch(&first.name_any(), &PatchParams::default(), &Patch::Merge(&finish)).await.unwrap();
    let next = all_bound(&pods, "next", 1).await.remove(0);
    assert_eq!(phase(&pods.get(&first.name_any()).await.unwrap()), "Succeeded");
    assert_eq!(indices_of(&next), Some(first_indices.as_str()), "next got the GPUs first gave back");
}

#[tokio::test]
async fn a_gpu_pod_bound_without_muster_still_gets_free_indices() {
    let _muster = muster().await;
    let ns = namespace("gpu-plain");
    let nodes = TestNodes::add(&ns.name, 1, 4, 1).await;
    apply(&ns.name, &gpu_job("managed", 1, 2, &nodes, gang(1), json!({})));
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    let managed = all_bound(&pods, "managed", 1).await.remove(0);

    pods.create(&PostParams::default(), &plain_pod("plain", 2, &nodes, json!({}))).await.unwrap();
    let plain = wait_for("GPU indices on the plain pod", LONG, || async {
        let p = pods.get("plain").await.ok()?;
        indices_of(&p).is_some().then_some(p)
    })
    .await;
    assert_eq!(node_of(&plain), Some(nodes.names[0].as_str()), "kube-scheduler bound it");
    let by_node = indices_by_node(&[managed, plain]);
    assert_eq!(by_node[&nodes.names[0]], [0, 1, 2, 3], "the plain pod got the two GPUs the managed one does not hold");
    // The event is posted after the patch, which the watch may show first: await it.
    wait_for("a GPUsAssigned event on the plain pod", LONG, || async {
        let events = events_of(&ns.name, "plain").await;
        events.iter().any(|(t, r, _)| t == "Normal" && r == "GPUsAssigned").then_some(())
    })
    .await;
}

#[tokio::test]
async fn gpu_gauges_and_conflicts_are_on_metrics() {
    let muster = muster().await;
    let ns = namespace("gpu-metrics");
    let nodes = TestNodes::add(&ns.name, 1, 4, 1).await;
    let node = nodes.names[0].as_str();
    let conflicts = |text: &str| metric(text, "muster_gpu_conflicts_total", &[]);
    let before = conflicts(&muster.metrics().await);
    // Two pods claim GPU 0 by hand: the ledger keeps one claim and reports the other.
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    for name in ["claim-a", "claim-b"] {
        let pod = plain_pod(name, 1, &nodes, json!({GPU_INDICES_ANNOTATION: "0"}));
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    let text = wait_for("the conflict counted and the node's gauges", LONG, || async {
        let text = muster.metrics().await;
        let labels = [("node", node)];
        let ready = conflicts(&text) > before
            && metric(&text, "muster_gpus", &labels) == 4.0
            && metric(&text, "muster_gpus_allocated", &labels) == 1.0;
        ready.then_some(text)
    })
    .await;
    assert_eq!(metric(&text, "muster_gpus_unhealthy", &[("node", node)]), 0.0, "{text}");
    // The conflict is counted before its event is posted: wait for the event, then check that
    // only one of the two claims was reported.
    let warned_of = || async {
        let mut warned = BTreeSet::new();
        for name in ["claim-a", "claim-b"] {
            let events = events_of(&ns.name, name).await;
            if events.iter().any(|(t, r, m)| t == "Warning" && r == "GPUConflict" && m.contains("GPU 0")) {
                warned.insert(name);
            }
        }
        warned
    };
    wait_for("a GPUConflict event on one of the claims", LONG, || async {
        (!warned_of().await.is_empty()).then_some(())
    })
    .await;
    let warned = warned_of().await;
    assert_eq!(warned.len(), 1, "one of the two claims is reported: {warned:?}");
}

/// The note of the Warning `GPUProblems` event on `node` that names a GPU too hot (events of
/// cluster-scoped objects live in `default`), once there is one.
pub async fn too_hot_warning(node: &str) -> String {
    wait_for("a GPUProblems event on the node", LONG, || async {
        let events = events_of("default", node).await;
        events.into_iter().find(|(t, r, m)| t == "Warning" && r == "GPUProblems" && m.contains("too hot")).map(|e| e.2)
    })
    .await
}

/// GPU 1 is hot and GPU 2 short of memory (as DCGM reports them through Prometheus): a gang
/// gets GPUs 0 and 3; a third pod waits until GPU 1 cools down, then gets it.
#[tokio::test]
async fn hot_and_memory_starved_gpus_are_not_offered() {
    let gm = gpu_metrics();
    let ns = namespace("gpu-health");
    let nodes = TestNodes::add(&ns.name, 1, 4, 1).await;
    let node = nodes.names[0].as_str();
    for index in 0..4 {
        gm.set(node, index, json!({"temperature": 40, "fbFree": 80000, "fbUsed": 1920})).await;
    }
    gm.set(node, 1, json!({"temperature": 90})).await;
    gm.set(node, 2, json!({"fbFree": 2000, "fbUsed": 79920})).await;
    gm.wait_scraped(node, 1, 90.0).await;
    let free = gm.query(&format!("DCGM_FI_DEV_FB_FREE{{Hostname=\"{node}\",gpu=\"2\"}}")).await;
    assert_eq!(free.iter().map(|(_, v)| *v).collect::<Vec<_>>(), [2000.0], "Prometheus has GPU 2's free memory");

    let extra = extra_muster(&["--prometheus-url", &gm.prometheus, "--gpu-metrics-ttl", "1"], &[]).await;
    wait_for("muster to count 2 unhealthy GPUs on the node", LONG, || async {
        (metric(&extra.metrics().await, "muster_gpus_unhealthy", &[("node", node)]) == 2.0).then_some(())
    })
    .await;
    // Operators hear why, on the Node.
    let warned = too_hot_warning(node).await;
    assert!(warned.contains("too hot, not offered: GPU 1"), "{warned}");
    assert!(warned.contains("too little free memory, not offered: GPU 2"), "{warned}");
    assert!(metric(&extra.metrics().await, "muster_gpu_node_problems", &[("node", node)]) >= 2.0);

    apply(&ns.name, &gpu_job("pair", 2, 1, &nodes, gang(2), json!({})));
    let pods: Api<Pod> = Api::namespaced(client().await, &ns.name);
    let pair = all_bound(&pods, "pair", 2).await;
    assert_eq!(indices_by_node(&pair)[node], [0, 3], "GPUs 1 (90 C) and 2 (2% free) are not offered");

    apply(&ns.name, &gpu_job("third", 1, 1, &nodes, gang(1), json!({})));
    let groups: Api<PodGroup> = Api::namespaced(client().await, &ns.name);
    wait_for("third to wait: the free GPUs are unhealthy", LONG, || async {
        (group_phase(&groups, "third").await == Some(GroupPhase::Unschedulable)).then_some(())
    })
    .await;
    gm.set(node, 1, json!({"temperature": 45})).await;
    let third = all_bound(&pods, "third", 1).await.remove(0);
    assert_eq!(indices_of(&third), Some("1"), "GPU 1 is offered once it cooled down");
}

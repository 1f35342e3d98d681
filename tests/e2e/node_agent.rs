//! The node agent end to end: `muster node-agent` (the real binary) reads a fake kubelet that
//! serves the real PodResources gRPC service on a unix socket and publishes in its node's
//! NodeGPUReport (the Node keeps only the topology annotation) what kubelet gave each pod, by
//! `namespace/name`; muster reads the report back, joins the
//! names to its pods bound to that node, corrects a pod's `gpu.muster.dev/indices` and its ledger
//! to what kubelet gave it (event, metric), and plans the next gang around those GPUs; and
//! health the agent measures (NVML answers replayed) keeps hot GPUs off offer without Prometheus.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::Api;
use muster::crds::{GPU_ASSIGNED_ANNOTATION, GPU_HEALTH_ANNOTATION, GPU_TOPOLOGY_ANNOTATION, NodeGPUReport};
use muster::devices::report::{AssignedAnnotation, ContainerDevices, PodDevices, ResourceDevices, pod_key};
use muster_dev::kubelet::FakeKubelet;
use serde_json::json;

use crate::gangs::{LONG, TestNodes, all_bound, apply, events_of, gang, gpu_job, indices_of};
use crate::harness::manager::muster;
use crate::harness::{client, cluster, metric, namespace, wait_for};

/// `nvidia-smi topo -m` and `--query-gpu` text for a node's GPUs (as its topology annotation
/// names them): pairs 0-1 and 2-3 on NVLink, the rest across the host bridge.
fn nvidia_smi_text(uuids: &[String]) -> (String, String) {
    let n = uuids.len();
    let header: Vec<String> = (0..n).map(|i| format!("GPU{i}")).collect();
    let mut topo = format!("\t{}\tCPU Affinity\tNUMA Affinity\n", header.join("\t"));
    for i in 0..n {
        let cells: Vec<&str> = (0..n)
            .map(|j| {
                if i == j {
                    " X "
                } else if i / 2 == j / 2 {
                    "NV2"
                } else {
                    "PHB"
                }
            })
            .collect();
        topo.push_str(&format!("GPU{i}\t{}\t0-15\t0\n", cells.join("\t")));
    }
    topo.push_str("\nLegend:\n\n  X    = Self\n");
    let mut query = "index, uuid, memory.total [MiB]\n".to_string();
    for (i, u) in uuids.iter().enumerate() {
        query.push_str(&format!("{i}, {u}, 81920 MiB\n"));
    }
    (topo, query)
}

fn uuids_of(node: &Node) -> Vec<String> {
    let value = node.annotations().get(GPU_TOPOLOGY_ANNOTATION).cloned().unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&value).unwrap_or_else(|e| panic!("topology: {e}"));
    let gpus = v["gpus"].as_array().cloned().unwrap_or_default();
    gpus.iter().map(|g| g["uuid"].as_str().unwrap_or_default().to_string()).collect()
}

fn gpu_pod(pod: &Pod, ids: &[&str]) -> PodDevices {
    PodDevices {
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
        containers: vec![ContainerDevices {
            name: "main".into(),
            devices: vec![ResourceDevices {
                resource: "nvidia.com/gpu".into(),
                ids: ids.iter().map(|s| (*s).to_string()).collect(),
            }],
        }],
    }
}

/// The agent as the DaemonSet runs it (every second), reading its GPUs from `source` (recorded
/// nvidia-smi text or NVML answers) with `more` flags; its log in `dir`.
fn start_agent(node: &str, dir: &Path, source: &[String], more: &[&str]) -> tokio::process::Child {
    let log = std::fs::File::create(dir.join("agent.log")).unwrap_or_else(|e| panic!("agent log: {e}"));
    tokio::process::Command::new(env!("CARGO_BIN_EXE_muster"))
        .args(["node-agent", "--node-name", node, "--interval", "1s"])
        .args(source)
        .args(more)
        .env("KUBECONFIG", &cluster().kubeconfig)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start the node agent: {e}"))
}

/// One fresh kwok GPU node of a test, its GPUs' uuids, and a folder for the agent's files.
struct AgentNode {
    ns: crate::harness::TestNamespace,
    nodes: TestNodes,
    name: String,
    api: Api<Node>,
    uuids: Vec<String>,
    dir: tempfile::TempDir,
}

impl Drop for AgentNode {
    /// A failed test shows what the agent said.
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default();
            eprintln!("--- node agent log ({}):\n{log}", self.name);
        }
    }
}

impl AgentNode {
    async fn add(prefix: &str, gpus: u32) -> Self {
        let ns = namespace(prefix);
        let nodes = TestNodes::add(&ns.name, 1, gpus, 1).await;
        let name = nodes.names[0].clone();
        let api: Api<Node> = Api::all(client().await);
        let uuids = uuids_of(&api.get(&name).await.unwrap_or_else(|e| panic!("node: {e}")));
        assert_eq!(uuids.len(), gpus as usize);
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        AgentNode { ns, nodes, name, api, uuids, dir }
    }

    /// The agent flags reading the nvidia-smi text of [`AgentNode::write_nvidia_smi`].
    fn nvidia_smi_flags(&self) -> Vec<String> {
        let topo = self.dir.path().join("topo.txt").display().to_string();
        let query = self.dir.path().join("query.csv").display().to_string();
        ["--topo-file", &topo, "--query-file", &query, "--nvml", "off"].map(String::from).to_vec()
    }

    /// Writes `file` in the agent's folder.
    fn write(&self, file: &str, text: &str) {
        std::fs::write(self.dir.path().join(file), text).unwrap_or_else(|e| panic!("{file}: {e}"));
    }

    /// Writes the nvidia-smi text files for GPUs with these uuids.
    fn write_nvidia_smi(&self, uuids: &[String]) {
        let (topo, query) = nvidia_smi_text(uuids);
        self.write("topo.txt", &topo);
        self.write("query.csv", &query);
    }

    /// The node's annotation `key`, parsed by `parse`, once `ready` holds for it.
    async fn annotation<T>(
        &self,
        what: &str,
        key: &str,
        parse: impl Fn(&str) -> Option<T>,
        ready: impl Fn(&T) -> bool,
    ) -> T {
        wait_for(what, LONG, || async {
            let node = self.api.get(&self.name).await.ok()?;
            parse(node.annotations().get(key)?).filter(|v| ready(v))
        })
        .await
    }

    /// The node's NodeGPUReport field `spec.<field>`, parsed by `parse`, once `ready` holds for
    /// it; the report is owned by the Node.
    async fn report<T>(
        &self,
        what: &str,
        field: &str,
        parse: impl Fn(&serde_json::Value) -> Option<T>,
        ready: impl Fn(&T) -> bool,
    ) -> T {
        let reports: Api<NodeGPUReport> = Api::all(client().await);
        let uid = self.api.get(&self.name).await.ok().and_then(|n| n.metadata.uid);
        wait_for(what, LONG, || async {
            let report = reports.get(&self.name).await.ok()?;
            let owner = report.metadata.owner_references.iter().flatten().find(|o| o.kind == "Node")?;
            assert_eq!(Some(&owner.uid), uid.as_ref(), "the report is owned by its Node");
            let value = serde_json::to_value(&report.spec).ok()?;
            parse(value.get(field)?).filter(|v| ready(v))
        })
        .await
    }

    /// The node keeps only the topology annotation of the agent's: health and assignments are
    /// in the report.
    async fn only_topology_on_the_node(&self) {
        let node = self.api.get(&self.name).await.unwrap_or_else(|e| panic!("{e}"));
        for key in [GPU_HEALTH_ANNOTATION, GPU_ASSIGNED_ANNOTATION] {
            assert!(!node.annotations().contains_key(key), "{key} on Node {}", self.name);
        }
        assert!(node.annotations().contains_key(GPU_TOPOLOGY_ANNOTATION));
    }
}

fn assigned(v: &serde_json::Value) -> Option<AssignedAnnotation> {
    AssignedAnnotation::parse_value(v, "spec.assigned").ok()
}

#[tokio::test]
async fn indices_follow_what_kubelet_gave_and_the_next_gang_avoids_those_gpus() {
    let muster = muster().await;
    let node = AgentNode::add("node-agent", 4).await;
    let (ns, nodes, uuids) = (&node.ns.name, &node.nodes, &node.uuids);
    node.write_nvidia_smi(uuids);
    let socket = node.dir.path().join("pod-resources/kubelet.sock");
    let kubelet = FakeKubelet::start(&socket).await.unwrap_or_else(|e| panic!("fake kubelet: {e:#}"));
    let socket_flag = socket.display().to_string();
    let more = ["--no-health", "--pod-resources-socket", socket_flag.as_str()];
    let _agent = start_agent(&node.name, node.dir.path(), &node.nvidia_smi_flags(), &more);

    // muster plans the first pod onto two of the idle node's four GPUs.
    apply(ns, &gpu_job("first", 1, 2, nodes, gang(1), json!({})));
    let pods: Api<Pod> = Api::namespaced(client().await, ns);
    let first = all_bound(&pods, "first", 1).await.remove(0);
    let planned = indices_of(&first).map(str::to_string).unwrap_or_default();
    let planned_set: Vec<usize> = planned.split(',').filter_map(|i| i.parse().ok()).collect();
    assert_eq!(planned_set.len(), 2, "{planned}");
    // kubelet (with the device plugin's own preference) gave it the other two.
    let other: Vec<usize> = (0..4).filter(|i| !planned_set.contains(i)).collect();
    let given = format!("{},{}", other[0], other[1]);
    let (given, free) = (given.as_str(), planned.as_str());
    let given_ids: Vec<&str> = other.iter().map(|&i| uuids[i].as_str()).collect();
    kubelet.set_pods(vec![gpu_pod(&first, &given_ids)]);

    // The agent reports it in the node's NodeGPUReport, keyed by the pod's namespace/name (as
    // kubelet names it); nothing on the Node but the topology.
    let key = pod_key(ns, &first.name_any());
    let report =
        node.report("the agent to report what kubelet gave", "assigned", assigned, |r| r.pods.contains_key(&key)).await;
    node.only_topology_on_the_node().await;
    let mut want_ids: Vec<String> = given_ids.iter().map(|s| (*s).to_string()).collect();
    want_ids.sort();
    assert_eq!(report.version, 2, "the agent writes the namespace/name version");
    assert_eq!(report.pods.keys().collect::<Vec<_>>(), [&key]);
    assert_eq!(report.pods[&key].devices, want_ids);

    // muster corrects the pod's indices, says so on the pod and counts it.
    let name = first.name_any();
    wait_for("the indices to be corrected", LONG, || async {
        let pod = pods.get(&name).await.ok()?;
        (indices_of(&pod) == Some(given)).then_some(())
    })
    .await;
    // The event is posted after the patch that corrects the indices: wait for it too.
    let (_, _, message) = wait_for("the GPUIndicesCorrected event", LONG, || async {
        events_of(ns, &name).await.into_iter().find(|(_, reason, _)| reason == "GPUIndicesCorrected")
    })
    .await;
    assert!(message.contains(&format!("not the {planned} muster planned")), "{message}");
    let corrections = metric(&muster.metrics().await, "muster_gpu_index_corrections_total", &[]);
    assert!(corrections >= 1.0, "muster_gpu_index_corrections_total = {corrections}");

    // The next gang is planned around the GPUs the container really holds.
    apply(ns, &gpu_job("second", 1, 2, nodes, gang(1), json!({})));
    let second = all_bound(&pods, "second", 1).await.remove(0);
    assert_eq!(indices_of(&second), Some(free), "the GPUs kubelet did not give");
    // And it agrees with kubelet's view once both run: no correction for the second pod.
    let free_ids: Vec<&str> = free.split(',').map(|i| uuids[i.parse::<usize>().unwrap_or(0)].as_str()).collect();
    kubelet.set_pods(vec![gpu_pod(&first, &given_ids), gpu_pod(&second, &free_ids)]);
    let second_key = pod_key(ns, &second.name_any());
    node.report("the agent to report the second pod", "assigned", assigned, |r| r.pods.contains_key(&second_key)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let second_events = events_of(ns, &second.name_any()).await;
    assert!(!second_events.iter().any(|(_, r, _)| r == "GPUIndicesCorrected"), "{second_events:?}");
    assert!(kubelet.calls().list >= 2, "the agent lists every round");
}

/// During an upgrade muster can be newer than a node's agent: the uid-keyed version 1 report
/// an older agent wrote still corrects a pod's indices.
#[tokio::test]
async fn an_older_agents_report_by_uid_is_still_followed() {
    let _muster = muster().await;
    let node = AgentNode::add("node-agent-v1", 4).await;
    let (ns, nodes, uuids) = (&node.ns.name, &node.nodes, &node.uuids);
    apply(ns, &gpu_job("old", 1, 2, nodes, gang(1), json!({})));
    let pods: Api<Pod> = Api::namespaced(client().await, ns);
    let pod = all_bound(&pods, "old", 1).await.remove(0);
    let planned: Vec<usize> = indices_of(&pod).unwrap_or_default().split(',').filter_map(|i| i.parse().ok()).collect();
    let other: Vec<usize> = (0..4).filter(|i| !planned.contains(i)).collect();
    assert_eq!((planned.len(), other.len()), (2, 2), "{planned:?}");
    let ids: Vec<&str> = other.iter().map(|&i| uuids[i].as_str()).collect();
    let uid = pod.uid().unwrap_or_default();
    let report = json!({"version": 1, "resource": "nvidia.com/gpu",
        "pods": {uid: {"namespace": ns, "name": pod.name_any(), "devices": ids}}});
    let patch = json!({"metadata": {"annotations": {GPU_ASSIGNED_ANNOTATION: report.to_string()}}});
    let params = kube::api::PatchParams::default();
    node.api.patch(&node.name, &params, &kube::api::Patch::Merge(&patch)).await.unwrap_or_else(|e| panic!("{e}"));
    let want = format!("{},{}", other[0], other[1]);
    let name = pod.name_any();
    wait_for("the indices to follow the version 1 report", LONG, || async {
        let pod = pods.get(&name).await.ok()?;
        (indices_of(&pod) == Some(want.as_str())).then_some(())
    })
    .await;
}

#[tokio::test]
async fn the_agent_keeps_publishing_the_topology_while_kubelet_is_down() {
    let _muster = muster().await;
    let node = AgentNode::add("node-agent-down", 2).await;
    // The agent's text names other uuids: seeing them on the Node proves it wrote.
    let other: Vec<String> = node.uuids.iter().map(|u| format!("{u}-agent")).collect();
    node.write_nvidia_smi(&other);
    // No kubelet at this socket until later.
    let socket = node.dir.path().join("pod-resources/kubelet.sock");
    let socket_flag = socket.display().to_string();
    let more = ["--no-health", "--pod-resources-socket", socket_flag.as_str()];
    let _agent = start_agent(&node.name, node.dir.path(), &node.nvidia_smi_flags(), &more);
    let topology = |v: &str| Some(v.to_string());
    node.annotation("the topology from the agent", GPU_TOPOLOGY_ANNOTATION, topology, |v| v.contains(&other[0])).await;
    let now = node.api.get(&node.name).await.unwrap_or_else(|e| panic!("{e}"));
    assert!(!now.annotations().contains_key(GPU_ASSIGNED_ANNOTATION), "nothing from a kubelet that is not there");
    let reports: Api<NodeGPUReport> = Api::all(client().await);
    assert!(reports.get_opt(&node.name).await.ok().flatten().is_none(), "no report from a kubelet that is not there");
    // kubelet comes up: the agent connects on a later round.
    let _kubelet = FakeKubelet::start(&socket).await.unwrap_or_else(|e| panic!("fake kubelet: {e:#}"));
    node.report("an (empty) report once kubelet answers", "assigned", assigned, |r| r.pods.is_empty()).await;
    node.only_topology_on_the_node().await;
}

/// NVML's answers for a node's GPUs, as `muster node-agent --probe-file` replays them: all on
/// NVLink, 80 GiB each, with these temperatures and free MiB.
fn recorded_probe(uuids: &[String], readings: &[(f64, u64)]) -> String {
    let n = uuids.len();
    let gpus: Vec<serde_json::Value> = uuids
        .iter()
        .zip(readings)
        .enumerate()
        .map(|(i, (uuid, (temperature, free)))| {
            json!({"index": i, "uuid": uuid, "numa": 0, "memoryTotalMib": 81920, "memoryFreeMib": free,
                "temperatureC": temperature, "utilization": 0.0})
        })
        .collect();
    let links: Vec<Vec<&str>> = (0..n).map(|i| (0..n).map(|j| if i == j { "X" } else { "NV4" }).collect()).collect();
    json!({"gpus": gpus, "links": links}).to_string()
}

/// GPU 1 hot and GPU 2 short of memory as the node agent measures them (NVML, replayed), no
/// Prometheus anywhere: a gang gets GPUs 0 and 3; a third pod waits until GPU 1 cools down.
#[tokio::test]
async fn health_from_the_node_agent_keeps_hot_gpus_off_offer_without_prometheus() {
    let muster = muster().await;
    let node = AgentNode::add("node-agent-health", 4).await;
    let (ns, nodes, node_name) = (&node.ns.name, &node.nodes, &node.name);
    let write = |readings: &[(f64, u64)]| node.write("probe.json", &recorded_probe(&node.uuids, readings));
    write(&[(40.0, 80000), (90.0, 80000), (40.0, 2000), (40.0, 80000)]);
    // An agent from before left health on the Node (every GPU cool): the new agent removes it,
    // and its report (GPU 1 hot) is what muster reads.
    let old = json!({"version": 1, "observedAt": "2020-01-01T00:00:00Z", "gpus": []}).to_string();
    let patch = json!({"metadata": {"annotations": {GPU_HEALTH_ANNOTATION: old, GPU_ASSIGNED_ANNOTATION: "{}"}}});
    let params = kube::api::PatchParams::default();
    node.api.patch(node_name, &params, &kube::api::Patch::Merge(&patch)).await.unwrap_or_else(|e| panic!("{e}"));
    let probe = ["--probe-file".to_string(), node.dir.path().join("probe.json").display().to_string()];
    let _agent = start_agent(node_name, node.dir.path(), &probe, &["--no-pod-resources"]);
    let sampled = |v: &serde_json::Value| muster::devices::report::HealthAnnotation::parse_value(v, "spec.health").ok();
    node.report("the agent's health in its report", "health", sampled, |m| m.gpus.len() == 4).await;
    node.only_topology_on_the_node().await;
    // Operators hear why: on the Node (cluster-scoped objects' events live in `default`), as a
    // new event although the node had a GPUProblems event already (its topology arrived before
    // its allocatable), and in muster_gpu_node_problems.
    let warned = crate::gpus::too_hot_warning(node_name).await;
    assert!(warned.contains("too hot, not offered: GPU 1"), "{warned}");
    assert!(warned.contains("too little free memory, not offered: GPU 2"), "{warned}");
    for kind in ["too_hot", "memory_full"] {
        wait_for(&format!("muster_gpu_node_problems{{kind={kind}}}"), LONG, || async {
            let labels = [("node", node_name.as_str()), ("kind", kind)];
            (metric(&muster.metrics().await, "muster_gpu_node_problems", &labels) == 1.0).then_some(())
        })
        .await;
    }

    apply(ns, &gpu_job("pair", 2, 1, nodes, gang(2), json!({})));
    let pods: Api<Pod> = Api::namespaced(client().await, ns);
    let pair = all_bound(&pods, "pair", 2).await;
    let mut taken: Vec<&str> = pair.iter().filter_map(indices_of).collect();
    taken.sort();
    assert_eq!(taken, ["0", "3"], "GPUs 1 (90 C) and 2 (2000 of 81920 MiB free) are not offered");

    apply(ns, &gpu_job("third", 1, 1, nodes, gang(1), json!({})));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(all_gated(&pods, "third").await, "third waits: the free GPUs are unhealthy");
    // GPU 1 cools down: the agent publishes it, muster polls it and admits the third pod there.
    write(&[(40.0, 80000), (45.0, 80000), (40.0, 2000), (40.0, 80000)]);
    let third = all_bound(&pods, "third", 1).await.remove(0);
    assert_eq!(indices_of(&third), Some("1"));
}

async fn all_gated(pods: &Api<Pod>, job: &str) -> bool {
    let live = crate::gangs::job_pods(pods, job).await;
    !live.is_empty() && live.iter().all(crate::gangs::gated)
}

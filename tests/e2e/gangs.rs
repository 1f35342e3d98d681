//! What the admission and GPU tests share: kwok GPU nodes of one test (tainted, labelled with
//! the test's namespace, so that only that test's pods can land there), MusterJobs of GPU pods
//! aimed at them, and readers of what admission wrote on pods and groups.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use muster::crds::{ADMISSION_GATE, GPU_INDICES_ANNOTATION, HOSTNAME_LABEL, JOB_NAME_LABEL, POD_GROUP_LABEL, PodGroup};
use muster_dev::{FakeGpuNodes, KWOK_NODE};
use serde_json::{Value, json};

use crate::harness::{add_gpu_nodes, client, kubectl_apply, wait_for};

/// Most waits: admission and binding take well under a second each when the machine is idle.
pub const LONG: Duration = Duration::from_secs(90);
/// The node label a test's pods select their nodes by.
pub const NODE_LABEL: &str = "muster.dev/e2e";

/// The GPU nodes of one test: `<namespace>-<i>`, tainted, labelled `muster.dev/e2e=<namespace>`.
pub struct TestNodes {
    spec: FakeGpuNodes,
    /// Node names, in index order.
    pub names: Vec<String>,
}

impl TestNodes {
    /// Adds `count` nodes with `gpus` GPUs each (`racks` racks, see `muster dev add-nodes`).
    pub async fn add(namespace: &str, count: u32, gpus: u32, racks: u32) -> Self {
        let spec = FakeGpuNodes {
            prefix: format!("{namespace}-"),
            count,
            gpus,
            racks,
            taint: true,
            labels: vec![(NODE_LABEL.into(), namespace.into())],
            ..FakeGpuNodes::default()
        };
        let names = add_gpu_nodes(&spec).await;
        Self { spec, names }
    }

    /// Adds `count` nodes like [`TestNodes::add`] (one rack), changed by `change` (e.g. DRA only,
    /// another topology).
    pub async fn add_with(namespace: &str, count: u32, gpus: u32, change: impl FnOnce(&mut FakeGpuNodes)) -> Self {
        let mut spec = FakeGpuNodes {
            prefix: format!("{namespace}-"),
            count,
            gpus,
            racks: 1,
            taint: true,
            labels: vec![(NODE_LABEL.into(), namespace.into())],
            ..FakeGpuNodes::default()
        };
        change(&mut spec);
        let names = add_gpu_nodes(&spec).await;
        Self { spec, names }
    }

    /// Adds `count` more nodes like the first ones; returns their names.
    pub async fn add_more(&mut self, count: u32) -> Vec<String> {
        let spec = FakeGpuNodes { start_index: self.names.len() as u32, count, ..self.spec.clone() };
        let added = add_gpu_nodes(&spec).await;
        self.names.extend(added.iter().cloned());
        added
    }

    /// The pod spec fields that put a pod on these nodes only.
    pub fn placement(&self) -> Value {
        let label = self.spec.labels[0].1.clone();
        json!({
            "nodeSelector": {NODE_LABEL: label},
            "tolerations": [{"key": KWOK_NODE, "operator": "Exists", "effect": "NoSchedule"}],
        })
    }
}

/// A MusterJob of `pods` pods with `gpus` GPUs each on `nodes`; `scheduling` is its
/// `spec.scheduling` (e.g. `{"schedulingPolicy": {"gang": {"minCount": 8}}}`), `annotations` go on
/// the pods (e.g. `sim.muster.dev/succeed-after`).
pub fn gpu_job(name: &str, pods: u32, gpus: u32, nodes: &TestNodes, scheduling: Value, annotations: Value) -> Value {
    let mut spec = json!({
        "restartPolicy": "Never",
        "containers": [{"name": "main", "image": "registry.invalid/none",
            "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}],
    });
    merge(&mut spec, nodes.placement());
    json!({
        "apiVersion": "batch.muster.dev/v1alpha1",
        "kind": "MusterJob",
        "metadata": {"name": name},
        "spec": {
            "parallelism": pods,
            "completions": pods,
            "completionMode": "Indexed",
            "scheduling": scheduling,
            "template": {"metadata": {"annotations": annotations}, "spec": spec},
        },
    })
}

/// The usual gang: every pod needed (`minCount` = pods).
pub fn gang(min_count: u32) -> Value {
    json!({"schedulingPolicy": {"gang": {"minCount": min_count}}})
}

/// RFC 7386 merge of `patch` into `target`.
pub fn merge(target: &mut Value, patch: Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(&k);
                } else {
                    merge(t.entry(k).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p,
    }
}

/// Applies an object (JSON is YAML) in `namespace`.
pub fn apply(namespace: &str, object: &Value) {
    kubectl_apply(namespace, &object.to_string());
}

/// The node a pod is bound to.
pub fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref().filter(|n| !n.is_empty())
}

/// The hostname admission pinned a pod to.
pub fn pin_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_selector.as_ref()?.get(HOSTNAME_LABEL).map(String::as_str)
}

/// The GPU indices written on a pod.
pub fn indices_of(pod: &Pod) -> Option<&str> {
    pod.annotations().get(GPU_INDICES_ANNOTATION).map(String::as_str)
}

/// Whether muster's admission gate still holds a pod.
pub fn gated(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| g.iter().any(|g| g.name == ADMISSION_GATE))
}

/// `status.phase`.
pub fn phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default()
}

/// Live (not terminating) pods of MusterJob `job`.
pub async fn job_pods(pods: &Api<Pod>, job: &str) -> Vec<Pod> {
    let lp = ListParams::default().labels(&format!("{JOB_NAME_LABEL}={job}"));
    let list = pods.list(&lp).await.map(|l| l.items).unwrap_or_default();
    list.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect()
}

/// Live pods of PodGroup `group`.
pub async fn group_pods(pods: &Api<Pod>, group: &str) -> Vec<Pod> {
    let lp = ListParams::default().labels(&format!("{POD_GROUP_LABEL}={group}"));
    let list = pods.list(&lp).await.map(|l| l.items).unwrap_or_default();
    list.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect()
}

/// Waits until MusterJob `job` has `n` live pods, all bound, and returns them.
pub async fn all_bound(pods: &Api<Pod>, job: &str, n: usize) -> Vec<Pod> {
    wait_for(&format!("{n} pods of {job} bound"), LONG, || async {
        let live = job_pods(pods, job).await;
        (live.len() == n && live.iter().all(|p| node_of(p).is_some())).then_some(live)
    })
    .await
}

/// GPU indices per node over `pods` (each pod's indices, parsed); panics on a pod without any.
pub fn indices_by_node(pods: &[Pod]) -> BTreeMap<String, Vec<u32>> {
    let mut out: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for p in pods {
        let node = node_of(p).or(pin_of(p)).unwrap_or_else(|| panic!("pod {} has no node", p.name_any()));
        let indices = indices_of(p).unwrap_or_else(|| panic!("pod {} on {node} has no GPU indices", p.name_any()));
        out.entry(node.to_string()).or_default().extend(indices.split(',').map(|i| i.parse::<u32>().unwrap()));
    }
    for v in out.values_mut() {
        v.sort();
    }
    out
}

/// A condition of a group's status.
pub fn condition<'a>(group: &'a PodGroup, type_: &str) -> Option<&'a Condition> {
    group.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)
}

/// Events about object `name` in `namespace` once `want` holds of them, or as they are after
/// 30 s: muster's events are sent by writers of their own, after the step they report, and on a
/// busy control plane they may land after the binds a test waits for.
pub async fn events_until(
    namespace: &str,
    name: &str,
    want: impl Fn(&[(String, String, String)]) -> bool,
) -> Vec<(String, String, String)> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let events = events_of(namespace, name).await;
        if want(&events) || std::time::Instant::now() >= deadline {
            return events;
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

/// Events about object `name` in `namespace`, as (type, reason, message).
pub async fn events_of(namespace: &str, name: &str) -> Vec<(String, String, String)> {
    let events: Api<Event> = Api::namespaced(client().await, namespace);
    let list = events.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
    list.into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name))
        .map(|e| (e.type_.unwrap_or_default(), e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect()
}

/// A plain pod (no muster label: kube-scheduler places it alone) asking for `gpus` GPUs on
/// `nodes`, with `annotations`.
pub fn plain_pod(name: &str, gpus: u32, nodes: &TestNodes, annotations: Value) -> Pod {
    let mut pod = json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "registry.invalid/none",
            "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}]},
    });
    merge(&mut pod["spec"], nodes.placement());
    serde_json::from_value(pod).expect("a plain pod")
}

/// Waits until PodGroup `name` satisfies `check` and returns it.
pub async fn group_until(
    groups: &Api<PodGroup>,
    name: &str,
    what: &str,
    check: impl Fn(&PodGroup) -> bool,
) -> PodGroup {
    wait_for(&format!("PodGroup {name}: {what}"), LONG, || async {
        groups.get_opt(name).await.ok().flatten().filter(|g| check(g))
    })
    .await
}

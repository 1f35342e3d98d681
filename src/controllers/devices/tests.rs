//! The device pass against a fake API server (every request recorded; pod patches in a
//! namespace `status-<code>` answered with that code, as an admission policy would), and its
//! pure parts on their own.

use crate::devices::chooser::NodeGpus;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use axum::http::{Method, StatusCode, Uri, header};
use k8s_openapi::api::core::v1::Node;

use super::*;
use crate::controllers::context::Config;
use crate::controllers::metrics::Metrics;
use crate::devices::chooser::node_gpus;
use crate::devices::{HealthThresholds, MetricsCache};

type Requests = Arc<Mutex<Vec<(String, String, String)>>>;

struct FakeApi {
    ctx: Arc<Context>,
    requests: Requests,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeApi {
    async fn start() -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let requests: Requests = Arc::default();
        let seen = requests.clone();
        let app = axum::Router::new().fallback(move |method: Method, uri: Uri, body: String| {
            let seen = seen.clone();
            async move {
                let path = uri.path().to_string();
                seen.lock().unwrap().push((method.to_string(), path.clone(), body.clone()));
                if path.starts_with("/api/v1/namespaces/hang/") {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                }
                respond(&method, &path, &body)
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let client = kube::Client::try_from(kube::Config::new(format!("http://{addr}").parse().unwrap())).unwrap();
        FakeApi {
            ctx: Arc::new(Context::new(client, Arc::new(Metrics::default()), Config::default())),
            requests,
            server,
        }
    }

    /// Patches of one pod's annotation so far.
    fn patches(&self, namespace: &str, pod: &str) -> Vec<String> {
        let path = format!("/api/v1/namespaces/{namespace}/pods/{pod}");
        let requests = self.requests.lock().unwrap();
        requests.iter().filter(|(m, p, _)| m == "PATCH" && *p == path).map(|(_, _, b)| b.clone()).collect()
    }

    /// Events (created or counted again) with this reason about this pod, once every event
    /// reported so far is sent (they go out through the context's writers).
    async fn events(&self, reason: &str, pod: &str) -> usize {
        self.ctx.events_sent().await;
        let requests = self.requests.lock().unwrap();
        requests
            .iter()
            .filter(|(_, p, b)| {
                p.starts_with("/apis/events.k8s.io/")
                    && b.contains(&format!("\"reason\":\"{reason}\""))
                    && b.contains(&format!("\"name\":\"{pod}\""))
            })
            .count()
    }
}

fn respond(method: &Method, path: &str, body: &str) -> (StatusCode, [(header::HeaderName, &'static str); 1], String) {
    let json = [(header::CONTENT_TYPE, "application/json")];
    if path.starts_with("/apis/events.k8s.io/") {
        let code = if method == Method::POST { StatusCode::CREATED } else { StatusCode::OK };
        return (code, json, body.to_string());
    }
    let segments: Vec<&str> = path.split('/').collect();
    if let ["", "api", "v1", "namespaces", namespace, "pods", name] = segments[..]
        && method == Method::PATCH
    {
        if let Some(code) = namespace.strip_prefix("status-").and_then(|c| c.parse::<u16>().ok()) {
            let status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": format!("pods {name:?} is refused ({code})"), "reason": "Refused", "code": code});
            return (StatusCode::from_u16(code).unwrap(), json, status.to_string());
        }
        let pod =
            serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}});
        return (StatusCode::OK, json, pod.to_string());
    }
    let status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "not found", "reason": "NotFound", "code": 404});
    (StatusCode::NOT_FOUND, json, status.to_string())
}

fn node(name: &str, gpus: u32) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": gpus.to_string()}}
    }))
    .unwrap()
}

/// A running pod bound to `node`, created `created` seconds into the day, asking for `gpus`.
fn pod(namespace: &str, name: &str, created: u32, node: &str, gpus: u32, indices: Option<&str>) -> Pod {
    let mut pod: Pod = serde_json::from_value(json!({
        "metadata": {"namespace": namespace, "name": name, "uid": format!("uid-{name}"),
            "creationTimestamp": format!("2026-01-01T00:{:02}:{:02}Z", created / 60, created % 60)},
        "spec": {"nodeName": node, "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}]},
        "status": {"phase": "Running"}
    }))
    .unwrap();
    if let Some(v) = indices {
        pod.metadata.annotations = Some([(GPU_INDICES_ANNOTATION.to_string(), v.to_string())].into());
    }
    pod
}

fn terminating(mut pod: Pod) -> Pod {
    pod.metadata.deletion_timestamp = pod.metadata.creation_timestamp.clone();
    pod
}

fn world(nodes: &[Node], pods: &[Pod]) -> (Snapshot, HashMap<String, NodeGpus>) {
    let gpus = node_gpus(nodes, &MetricsCache::default(), &HealthThresholds::default(), SystemTime::UNIX_EPOCH);
    (Snapshot::from_cluster(nodes, pods), gpus)
}

fn set(indices: &[usize]) -> GpuSet {
    GpuSet::from_indices(indices.iter().copied()).unwrap()
}

/// The indices a patch body writes.
fn written(body: &str) -> GpuSet {
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    crate::devices::parse_indices(v["metadata"]["annotations"][GPU_INDICES_ANNOTATION].as_str().unwrap()).unwrap()
}

/// One pass, then its writes awaited and booked (a pass never waits for them).
async fn pass_settled(
    devices: &mut DeviceReconciler,
    ctx: &Arc<Context>,
    pods: &[Pod],
    snapshot: &Snapshot,
    gpus: &HashMap<String, NodeGpus>,
) -> HashMap<String, GpuSet> {
    let held = devices.pass(ctx, pods, snapshot, gpus);
    devices.settle(ctx).await;
    held
}

#[tokio::test]
async fn a_pass_never_waits_for_its_writes_and_sends_each_once() {
    let api = FakeApi::start().await;
    let nodes = [node("n1", 8)];
    // "hang" never answers: its write is in flight until the timeout.
    let pods = [pod("hang", "slow", 1, "n1", 2, None), pod("open", "plain", 2, "n1", 1, None)];
    let (snapshot, gpus) = world(&nodes, &pods);
    let mut devices = DeviceReconciler { patch_timeout: Duration::from_secs(3), ..DeviceReconciler::default() };
    let woken = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counter = woken.clone();
    devices.on_batch_done(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    });
    let started = Instant::now();
    let held = devices.pass(&api.ctx, &pods, &snapshot, &gpus);
    assert!(started.elapsed() < Duration::from_secs(2), "the pass waited for a write: {:?}", started.elapsed());
    assert_eq!(held["n1"].len(), 3, "both pods hold their GPUs while their writes are in flight: {}", held["n1"]);
    // A second pass while the batch is in flight sends nothing again, and holds the same.
    assert_eq!(devices.pass(&api.ctx, &pods, &snapshot, &gpus), held);
    devices.settle(&api.ctx).await;
    assert_eq!(woken.load(std::sync::atomic::Ordering::SeqCst), 1, "one batch, one wake-up");
    assert_eq!(api.patches("open", "plain").len(), 1);
    assert_eq!(api.events("GPUsAssigned", "plain").await, 1);
    let text = api.ctx.metrics.encode();
    assert!(text.contains("muster_device_patch_errors_total{reason=\"timeout\"} 1"), "{text}");
}

#[tokio::test]
async fn a_refused_patch_is_the_pods_own_and_its_gpus_stay_held() {
    let api = FakeApi::start().await;
    let nodes = [node("n1", 4)];
    let pods = [
        pod("open", "holder", 1, "n1", 1, Some("0")),
        // A ValidatingAdmissionPolicy denies pod updates in this namespace.
        pod("status-403", "denied", 2, "n1", 1, None),
        pod("open", "plain", 3, "n1", 1, None),
    ];
    let (snapshot, gpus) = world(&nodes, &pods);
    let mut devices = DeviceReconciler::default();
    let held = pass_settled(&mut devices, &api.ctx, &pods, &snapshot, &gpus).await;

    let denied = plan(&pods, &snapshot, &gpus).assignments[0].gpus;
    let plain = written(&api.patches("open", "plain")[0]);
    assert_eq!(api.patches("status-403", "denied").len(), 1);
    assert_eq!(denied.len(), 1);
    assert!(denied.is_disjoint(plain) && !denied.contains(0) && !plain.contains(0), "{denied} {plain}");
    assert_eq!(held["n1"], set(&[0]).union(denied).union(plain), "the denied pod still holds what it was given");
    assert_eq!(api.events("GPUIndicesNotWritten", "denied").await, 1);
    assert_eq!(api.events("GPUsAssigned", "plain").await, 1);
    let text = api.ctx.metrics.encode();
    assert!(text.contains("muster_device_patch_errors_total{reason=\"forbidden\"} 1"), "{text}");

    // At once again: the denied pod is backed off (no second patch, no second event), and
    // still holds the same GPUs.
    let again = pass_settled(&mut devices, &api.ctx, &pods, &snapshot, &gpus).await;
    assert_eq!(again, held);
    assert_eq!(api.patches("status-403", "denied").len(), 1, "backed off");
    assert_eq!(api.events("GPUIndicesNotWritten", "denied").await, 1);
}

#[tokio::test]
async fn every_kind_of_failed_patch_is_counted_by_reason_and_none_stalls_the_pass() {
    let api = FakeApi::start().await;
    let nodes = [node("n1", 16)];
    // 503 is retried inside the client, "hang" never answers: both end in the timeout.
    let namespaces = ["status-400", "status-422", "status-500", "status-503", "hang", "open"];
    let pods: Vec<Pod> =
        namespaces.iter().enumerate().map(|(i, ns)| pod(ns, &format!("p{i}"), i as u32, "n1", 2, None)).collect();
    let (snapshot, gpus) = world(&nodes, &pods);
    let mut devices = DeviceReconciler { patch_timeout: Duration::from_millis(1500), ..DeviceReconciler::default() };
    let started = Instant::now();
    let held = pass_settled(&mut devices, &api.ctx, &pods, &snapshot, &gpus).await;
    assert!(started.elapsed() < Duration::from_secs(10), "the writes wait together: {:?}", started.elapsed());
    assert_eq!(held["n1"].len(), 12, "every pod holds its two GPUs, written or not: {}", held["n1"]);
    let text = api.ctx.metrics.encode();
    for (reason, n) in [("bad_request", 1), ("invalid", 1), ("server_error", 1), ("timeout", 2)] {
        assert!(text.contains(&format!("muster_device_patch_errors_total{{reason=\"{reason}\"}} {n}")), "{text}");
    }
    assert_eq!(api.events("GPUsAssigned", "p5").await, 1, "the pod that could be written was");
}

#[tokio::test]
async fn a_terminating_pod_keeps_its_gpus_and_is_given_no_new_ones() {
    let api = FakeApi::start().await;
    let nodes = [node("n1", 8)];
    let pods = [
        // Flushing a checkpoint in its grace period: it still uses GPUs 0 and 1.
        terminating(pod("open", "leaving", 1, "n1", 2, Some("0,1"))),
        terminating(pod("open", "leaving-plain", 2, "n1", 1, None)),
        pod("open", "plain", 3, "n1", 2, None),
    ];
    let (snapshot, gpus) = world(&nodes, &pods);
    let held = pass_settled(&mut DeviceReconciler::default(), &api.ctx, &pods, &snapshot, &gpus).await;
    assert!(set(&[0, 1]).is_subset(held["n1"]), "{}", held["n1"]);
    assert!(api.patches("open", "leaving-plain").is_empty(), "nothing new is written onto a terminating pod");
    let plain = written(&api.patches("open", "plain")[0]);
    assert!(plain.is_disjoint(set(&[0, 1])), "{plain}");
    assert_eq!(held["n1"].len(), 5, "the terminating pod without indices still counts for its one GPU");
    // Once it has finished, its GPUs are free.
    let mut done = pods.clone();
    done[0].status = serde_json::from_value(json!({"phase": "Succeeded"})).ok();
    assert_eq!(plan(&done, &snapshot, &gpus).ledger.claim("uid-leaving"), None);
}

#[tokio::test]
async fn problems_are_reported_once_not_every_pass() {
    let api = FakeApi::start().await;
    let nodes = [node("n1", 2)];
    let mut pods = vec![
        pod("open", "first", 1, "n1", 1, Some("0")),
        pod("open", "second", 2, "n1", 1, Some("0")),
        pod("open", "third", 3, "n1", 1, Some("1")),
        pod("open", "no-room", 4, "n1", 1, None),
    ];
    let mut devices = DeviceReconciler::default();
    for round in 0..4 {
        // The API lists pods in any order: the same pod wins every time.
        pods.reverse();
        let (snapshot, gpus) = world(&nodes, &pods);
        let held = pass_settled(&mut devices, &api.ctx, &pods, &snapshot, &gpus).await;
        assert_eq!(held["n1"], GpuSet::first(2), "round {round}");
        assert_eq!(plan(&pods, &snapshot, &gpus).ledger.holder("n1", 0), Some("uid-first"));
    }
    assert_eq!(api.events("GPUConflict", "second").await, 1);
    assert_eq!(api.events("GPUConflict", "first").await, 0);
    assert_eq!(api.events("GPUConflict", "no-room").await, 1);
    let text = api.ctx.metrics.encode();
    assert!(text.contains("muster_gpu_conflicts_total 2"), "{text}");

    // The conflict goes (the later pod ends), then a new one comes: reported again.
    pods.retain(|p| p.metadata.name.as_deref() != Some("second"));
    let (snapshot, gpus) = world(&nodes, &pods);
    pass_settled(&mut devices, &api.ctx, &pods, &snapshot, &gpus).await;
    pods.push(pod("open", "second", 2, "n1", 1, Some("0")));
    let (snapshot, gpus) = world(&nodes, &pods);
    pass_settled(&mut devices, &api.ctx, &pods, &snapshot, &gpus).await;
    assert_eq!(api.events("GPUConflict", "second").await, 2);
}

#[tokio::test]
async fn gauges_of_a_node_that_is_gone_are_removed() {
    let api = FakeApi::start().await;
    let mut devices = DeviceReconciler::default();
    let pods = [pod("open", "a", 1, "n2", 1, Some("3"))];
    let (snapshot, gpus) = world(&[node("n1", 8), node("n2", 4)], &pods);
    pass_settled(&mut devices, &api.ctx, &pods, &snapshot, &gpus).await;
    let text = api.ctx.metrics.encode();
    assert!(text.contains("muster_gpus{node=\"n2\"} 4"), "{text}");
    assert!(text.contains("muster_gpus_allocated{node=\"n2\"} 1"), "{text}");
    let (snapshot, gpus) = world(&[node("n1", 8)], &[]);
    pass_settled(&mut devices, &api.ctx, &[] as &[Pod], &snapshot, &gpus).await;
    let text = api.ctx.metrics.encode();
    assert!(!text.contains("node=\"n2\""), "{text}");
    assert!(text.contains("muster_gpus{node=\"n1\"} 8"), "{text}");
}

#[test]
fn reported_fires_once_per_change_and_again_after_it_clears() {
    let report = |key: &str| Report {
        key: key.into(),
        uid: "u".into(),
        reason: "GPUConflict",
        message: key.into(),
        conflict: true,
    };
    let mut reported = Reported::default();
    let keys = |fresh: Vec<&Report>| fresh.iter().map(|r| r.key.clone()).collect::<Vec<_>>();
    assert_eq!(keys(reported.fresh(&[report("a"), report("a")])), ["a"]);
    assert!(reported.fresh(&[report("a")]).is_empty(), "the same problem next pass");
    assert_eq!(keys(reported.fresh(&[report("a"), report("b")])), ["b"], "a changed problem is a new one");
    assert!(reported.fresh(&[]).is_empty());
    assert_eq!(keys(reported.fresh(&[report("a")])), ["a"], "it came back");
}

#[test]
fn patch_backoff_doubles_per_pod_up_to_the_cap() {
    let t0 = Instant::now();
    let mut backoff = PatchBackoff::default();
    assert!(backoff.ready("a", t0));
    assert_eq!(backoff.failed("a", t0, "forbidden/1"), (Duration::from_secs(1), true));
    assert!(!backoff.ready("a", t0));
    assert!(backoff.ready("b", t0), "other pods are not held back");
    assert!(backoff.ready("a", t0 + Duration::from_secs(1)));
    assert_eq!(backoff.failed("a", t0, "forbidden/1"), (Duration::from_secs(2), false), "same failure: no new event");
    assert_eq!(backoff.failed("a", t0, "server_error/1"), (Duration::from_secs(4), true));
    for _ in 0..20 {
        backoff.failed("a", t0, "server_error/1");
    }
    assert_eq!(backoff.failed("a", t0, "server_error/1").0, PATCH_BACKOFF_MAX);
    backoff.retain(&HashSet::from(["b"]));
    assert!(backoff.ready("a", t0), "a pod gone is forgotten");
    backoff.failed("b", t0, "x");
    backoff.forget("b");
    assert!(backoff.ready("b", t0));
}

#[test]
fn patch_errors_are_labelled_by_status() {
    let api = |code: u16| {
        kube::Error::Api(
            serde_json::from_value(json!({"status": "Failure", "message": "m", "reason": "R", "code": code})).unwrap(),
        )
    };
    let labels: Vec<&str> =
        [400, 403, 422, 429, 500, 504, 418].into_iter().map(|c| patch_error_reason(&api(c))).collect();
    assert_eq!(
        labels,
        ["bad_request", "forbidden", "invalid", "too_many_requests", "server_error", "server_error", "api_other"]
    );
}

#[test]
fn gpus_wanted_counts_like_kubelet() {
    let pod: Pod = serde_json::from_value(json!({"spec": {
        "containers": [
            {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "2"}}},
            {"name": "b", "resources": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}}],
        "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}))
    .expect("pod");
    assert_eq!(gpus_wanted(&pod), 4);
    let none: Pod = serde_json::from_value(json!({"spec": {"containers": [{"name": "a"}]}})).expect("pod");
    assert_eq!(gpus_wanted(&none), 0);
}

#[test]
fn a_pod_with_an_allocated_claim_holds_what_the_claim_names_and_its_annotation_is_corrected() {
    use crate::devices::dra::{Inventory, NVIDIA_GPU_DRIVER, fixtures};
    use k8s_openapi::api::resource::v1::ResourceClaim;
    let nodes = [node("n1", 4)];
    // The annotation says 0,1 (written by hand, or before the claim was allocated); the claim
    // made from the pod's template holds gpu-2 and gpu-3 of n1.
    let mut claimed = pod("ns", "claimed", 1, "n1", 0, Some("0,1"));
    let spec = claimed.spec.as_mut().unwrap();
    spec.resource_claims = Some(vec![
        serde_json::from_value(serde_json::json!({"name": "gpus", "resourceClaimTemplateName": "t"})).unwrap(),
    ]);
    claimed.status.get_or_insert_default().resource_claim_statuses = Some(vec![
        serde_json::from_value(serde_json::json!({"name": "gpus", "resourceClaimName": "claimed-gpus-x"})).unwrap(),
    ]);
    let counted = pod("ns", "counted", 2, "n1", 2, None);
    let pods = [claimed, counted];
    let claim: ResourceClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "claimed-gpus-x", "namespace": "ns"},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpus", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-2"},
            {"request": "gpus", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-3"}]}},
            "reservedFor": [{"resource": "pods", "name": "claimed", "uid": "claimed"}]}
    }))
    .unwrap();
    let (mut snapshot, gpus) = world(&nodes, &pods);
    let slice = fixtures::nvidia_slice("n1", &[(0, "GPU-0"), (1, "GPU-1"), (2, "GPU-2"), (3, "GPU-3")], 1);
    let inventory = Inventory::new(
        &[slice],
        &[fixtures::nvidia_device_class()],
        std::slice::from_ref(&claim),
        NVIDIA_GPU_DRIVER,
        &HashMap::new(),
    );
    snapshot.set_dra(crate::scheduler::Dra::new(inventory, &[], &[claim]));
    let plan = plan(&pods, &snapshot, &gpus);
    assert_eq!(plan.ledger.used_mask("n1"), set(&[0, 1, 2, 3]), "2,3 by the claim, two more for the counted pod");
    let by_pod: Vec<(String, GpuSet)> = plan.assignments.iter().map(|a| (a.pod.name().to_string(), a.gpus)).collect();
    assert_eq!(
        by_pod,
        vec![("claimed".to_string(), set(&[2, 3])), ("counted".to_string(), set(&[0, 1]))],
        "the annotation states what the claim allocated; the counted pod gets the GPUs the claim left"
    );
    assert!(plan.reports.is_empty(), "{:?}", plan.reports);
}

/// A node with a topology naming GPU uuids `GPU-<node>-<i>`, and the agent's report of what
/// kubelet gave each `(pod uid, device IDs)`.
fn reported_node(name: &str, gpus: u32, assigned: &[(&str, &[&str])]) -> Node {
    let mut n = node(name, gpus);
    let entries: Vec<serde_json::Value> = (0..gpus)
        .map(|i| json!({"index": i, "uuid": format!("GPU-{name}-{i}"), "numa": 0, "memoryMiB": 81920}))
        .collect();
    let links: Vec<Vec<&str>> =
        (0..gpus).map(|i| (0..gpus).map(|j| if i == j { "X" } else { "NV1" }).collect()).collect();
    let topology = json!({"version": 1, "gpus": entries, "links": links}).to_string();
    let pods: serde_json::Map<String, serde_json::Value> = assigned
        .iter()
        .map(|(uid, ids)| ((*uid).to_string(), json!({"namespace": "ns", "name": uid, "devices": ids})))
        .collect();
    let report = json!({"version": 1, "resource": "nvidia.com/gpu", "pods": pods}).to_string();
    n.metadata.annotations = Some(
        [
            (crate::crds::GPU_TOPOLOGY_ANNOTATION.to_string(), topology),
            (crate::crds::GPU_ASSIGNED_ANNOTATION.to_string(), report),
        ]
        .into(),
    );
    n
}

#[test]
fn what_kubelet_gave_is_the_ledger_and_the_annotation_is_corrected() {
    // muster planned 0,1 for `a`; kubelet gave it GPUs 2 and 3.
    let nodes = [reported_node("n1", 4, &[("uid-a", &["GPU-n1-3", "GPU-n1-2"])])];
    let pods = [pod("ns", "a", 1, "n1", 2, Some("0,1"))];
    let (snapshot, gpus) = world(&nodes, &pods);
    let plan = plan(&pods, &snapshot, &gpus);
    assert_eq!(plan.ledger.used_mask("n1"), set(&[2, 3]));
    assert!(plan.reports.is_empty(), "{:?}", plan.reports);
    let [a] = &plan.assignments[..] else { panic!("{:?}", plan.assignments) };
    assert_eq!((a.gpus, a.write, a.is_correction()), (set(&[2, 3]), true, true));
    assert!(matches!(&a.source, Source::Kubelet { planned: Some(p), .. } if *p == set(&[0, 1])));
}

#[test]
fn kubelet_reports_table() {
    // (case, node GPUs, report, pod annotation, ledger after, assignment written, correction)
    type Case<'a> = (&'a str, &'a [(&'a str, &'a [&'a str])], Option<&'a str>, &'a [usize], Option<&'a [usize]>, bool);
    let cases: &[Case<'_>] = &[
        ("agrees with the plan", &[("uid-a", &["GPU-n1-0", "GPU-n1-1"])], Some("0,1"), &[0, 1], None, false),
        ("bound without muster", &[("uid-a", &["GPU-n1-1", "GPU-n1-2"])], None, &[1, 2], Some(&[1, 2]), false),
        ("index ID strategy", &[("uid-a", &["3", "0"])], Some("0,1"), &[0, 3], Some(&[0, 3]), true),
        ("time-slicing replica", &[("uid-a", &["GPU-n1-2::1"])], Some("0"), &[2], Some(&[2]), true),
        ("no report for the pod", &[("uid-other", &["GPU-n1-3"])], Some("0,1"), &[0, 1], None, false),
        ("unknown device: the plan stays", &[("uid-a", &["GPU-elsewhere"])], Some("0,1"), &[0, 1], None, false),
    ];
    for &(case, report, annotation, ledger, written, correction) in cases {
        let nodes = [reported_node("n1", 4, report)];
        let wanted = annotation.map_or(2, |a| a.split(',').count() as u32);
        let pods = [pod("ns", "a", 1, "n1", wanted, annotation)];
        let (snapshot, gpus) = world(&nodes, &pods);
        let decided = plan(&pods, &snapshot, &gpus);
        assert_eq!(decided.ledger.used_mask("n1"), set(ledger), "{case}");
        let got: Vec<(GpuSet, bool)> = decided.assignments.iter().map(|a| (a.gpus, a.is_correction())).collect();
        let want: Vec<(GpuSet, bool)> = written.iter().map(|w| (set(w), correction)).collect();
        assert_eq!(got, want, "{case}");
        let unknown = decided.reports.iter().any(|r| r.reason == "UnknownGPUDevice");
        assert_eq!(unknown, case.starts_with("unknown device"), "{case}: {:?}", decided.reports);
    }
}

#[test]
fn the_next_pod_avoids_what_kubelet_really_gave() {
    // `old` was planned onto 0,1 but kubelet gave it 0,2; `young` (planned 2,3 on the stale
    // ledger) now conflicts on GPU 2: the truth keeps it, and the ledger says so.
    let nodes = [reported_node("n1", 4, &[("uid-old", &["GPU-n1-0", "GPU-n1-2"])])];
    let pods = [pod("ns", "old", 1, "n1", 2, Some("0,1")), pod("ns", "young", 2, "n1", 2, Some("2,3"))];
    let (snapshot, gpus) = world(&nodes, &pods);
    let first = plan(&pods, &snapshot, &gpus);
    assert_eq!(first.ledger.holder("n1", 2), Some("uid-old"));
    assert_eq!(first.ledger.claim("uid-young").map(|c| c.gpus), Some(set(&[3])));
    assert!(first.reports.iter().any(|r| r.reason == "GPUConflict" && r.uid == "uid-young"), "{:?}", first.reports);
    // A bound pod without indices is given GPUs around the truth: only GPU 1 and 3 are free.
    let pods = [pod("ns", "old", 1, "n1", 2, Some("0,1")), pod("ns", "plain", 2, "n1", 2, None)];
    let (snapshot, gpus) = world(&nodes, &pods);
    let second = plan(&pods, &snapshot, &gpus);
    let chosen: Vec<GpuSet> =
        second.assignments.iter().filter(|a| a.source == Source::Chosen).map(|a| a.gpus).collect();
    assert_eq!(chosen, vec![set(&[1, 3])]);
}

#[test]
fn a_malformed_report_is_a_node_problem_not_a_failure() {
    let mut n = node("n1", 4);
    n.metadata.annotations = Some(
        [
            (crate::crds::GPU_ASSIGNED_ANNOTATION.to_string(), "{not json".to_string()),
            (crate::crds::GPU_HEALTH_ANNOTATION.to_string(), json!({"version": 9}).to_string()),
        ]
        .into(),
    );
    let pods = [pod("ns", "a", 1, "n1", 2, Some("0,1"))];
    let (snapshot, gpus) = world(&[n], &pods);
    let plan = plan(&pods, &snapshot, &gpus);
    assert_eq!(plan.ledger.used_mask("n1"), set(&[0, 1]));
    let problems = gpus["n1"].problems(false);
    let agent: Vec<&crate::devices::GpuProblem> =
        problems.iter().filter(|p| p.kind == crate::devices::GpuProblemKind::AgentReportInvalid).collect();
    let [p] = &agent[..] else { panic!("{problems:?}") };
    assert!(p.message.contains("gpu.muster.dev/assigned is not valid"), "{}", p.message);
    assert!(p.message.contains("gpu.muster.dev/health has version 9"), "{}", p.message);
}

#[tokio::test]
async fn a_correction_is_written_with_an_event_and_counted() {
    let api = FakeApi::start().await;
    let nodes = [reported_node("n1", 4, &[("uid-a", &["GPU-n1-2", "GPU-n1-3"])])];
    let pods = [pod("ns", "a", 1, "n1", 2, Some("0,1"))];
    let (snapshot, gpus) = world(&nodes, &pods);
    let mut devices = DeviceReconciler::default();
    let held = pass_settled(&mut devices, &api.ctx, &pods, &snapshot, &gpus).await;
    assert_eq!(held.get("n1"), Some(&set(&[2, 3])));
    let patches = api.patches("ns", "a");
    assert_eq!(patches.iter().map(|b| written(b)).collect::<Vec<_>>(), vec![set(&[2, 3])]);
    assert_eq!(api.events("GPUIndicesCorrected", "a").await, 1);
    assert_eq!(api.ctx.metrics.gpu_index_corrections.get(), 1);
}

#[tokio::test]
async fn a_repeated_event_keeps_its_series_until_its_note_changes() {
    let api = FakeApi::start().await;
    let pod = pod("ns", "a", 1, "n1", 1, None);
    for note in ["one", "one", "two", "two"] {
        api.ctx.event(&pod.reference(), true, "GPUConflict", "AssignGPUs", note);
    }
    api.ctx.events_sent().await;
    let requests = api.requests.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let events: Vec<(&str, bool)> = requests
        .iter()
        .filter(|(_, p, _)| p.starts_with("/apis/events.k8s.io/"))
        .map(|(m, _, b)| (m.as_str(), b.contains("\"note\":\"two\"")))
        .collect();
    // kube-rs's recorder alone would PATCH the first event for all three repeats, note "one".
    assert_eq!(events, [("POST", false), ("PATCH", false), ("POST", true), ("PATCH", true)]);
}

#[test]
fn a_pod_keeps_the_gpus_chosen_for_it_until_its_annotation_shows() {
    let nodes = [node("n1", 2)];
    let newer = pod("open", "newer", 20, "n1", 1, None);
    let (snapshot, gpus) = world(&nodes, std::slice::from_ref(&newer));
    let first = plan(std::slice::from_ref(&newer), &snapshot, &gpus).assignments[0].gpus;
    // An older pod shows up while the newer one's annotation is still on its way: oldest
    // first alone would give it the GPU just written for the newer one.
    let pods = [newer.clone(), pod("open", "older", 10, "n1", 1, None)];
    let (snapshot, gpus) = world(&nodes, &pods);
    let afresh = plan(&pods, &snapshot, &gpus);
    let older_afresh = afresh.assignments.iter().find(|a| a.pod.name() == "older").unwrap().gpus;
    assert_eq!(older_afresh, first, "the hazard this guards against");
    let chosen = HashMap::from([("uid-newer".to_string(), ("n1".to_string(), first))]);
    let kept = plan_with(&pods, &snapshot, &gpus, &chosen);
    let of = |name: &str| kept.assignments.iter().find(|a| a.pod.name() == name).unwrap().gpus;
    assert_eq!(of("newer"), first);
    assert!(of("older").intersection(first).is_empty(), "the older pod gets another GPU");
    assert!(kept.reports.is_empty(), "no conflict: {:?}", kept.reports);
}

#[tokio::test]
async fn a_written_choice_is_neither_given_away_nor_written_again_before_the_cache_shows_it() {
    let api = FakeApi::start().await;
    let nodes = [node("n1", 2)];
    let newer = pod("open", "newer", 20, "n1", 1, None);
    let mut devices = DeviceReconciler::default();
    let (snapshot, gpus) = world(&nodes, std::slice::from_ref(&newer));
    pass_settled(&mut devices, &api.ctx, std::slice::from_ref(&newer), &snapshot, &gpus).await;
    let first = written(&api.patches("open", "newer")[0]);
    // The cache does not show the write yet, and an older pod is bound on the same node.
    let pods = [newer, pod("open", "older", 10, "n1", 1, None)];
    let (snapshot, gpus) = world(&nodes, &pods);
    let held = pass_settled(&mut devices, &api.ctx, &pods, &snapshot, &gpus).await;
    assert_eq!(api.patches("open", "newer").len(), 1, "written once");
    let older = written(&api.patches("open", "older")[0]);
    assert!(older.intersection(first).is_empty(), "older got {older}, newer holds {first}");
    assert_eq!(held["n1"], first.union(older));
}

proptest::proptest! {
    /// The pass reads the same of a pod and of the [`crate::pods::GpuPod`] admission keeps of
    /// it: over any pods (bound or not, any GPUs, valid or bad indices, any phase, deleted or
    /// not) on a node with kubelet's report and one without, the plans agree: ledger, reports,
    /// assignments.
    #[test]
    fn a_plan_over_kept_gpu_pods_equals_one_over_the_pods(
        specs in proptest::collection::vec(
            (0usize..3, 0u32..4, proptest::option::of(0usize..6), 0u32..50, proptest::bool::ANY, 0usize..4),
            0..12,
        )
    ) {
        let nodes = [reported_node("n1", 4, &[("uid-p0", &["GPU-n1-1"]), ("uid-p1", &["GPU-n1-3", "GPU-n1-2"])]), node("n2", 8)];
        let pods: Vec<Pod> = specs
            .iter()
            .enumerate()
            .map(|(i, &(n, gpus, indices, created, deleting, phase))| {
                let indices = indices.map(|k| ["0", "1", "0,1", "2,3", "9", "x"][k]);
                let mut p = pod("ns", &format!("p{i}"), created, ["n1", "n2", ""][n], gpus, indices);
                if n == 2 {
                    p.spec.as_mut().unwrap().node_name = None;
                }
                p.status.as_mut().unwrap().phase = Some(["Running", "Pending", "Succeeded", "Failed"][phase].into());
                if deleting { terminating(p) } else { p }
            })
            .collect();
        let (snapshot, gpus) = world(&nodes, &pods);
        let kept: Vec<Arc<crate::pods::GpuPod>> = pods.iter().filter_map(crate::pods::GpuPod::of).map(Arc::new).collect();
        let (whole, compact) = (plan(&pods, &snapshot, &gpus), plan(&kept, &snapshot, &gpus));
        proptest::prop_assert_eq!(&whole.ledger, &compact.ledger);
        proptest::prop_assert_eq!(&whole.reports, &compact.reports);
        let view = |p: &DevicePlan<'_>| -> Vec<_> {
            p.assignments.iter().map(|a| (a.pod.uid().to_string(), a.node.clone(), a.gpus, a.write, a.source.clone())).collect()
        };
        proptest::prop_assert_eq!(view(&whole), view(&compact));
        let refs = |p: &DevicePlan<'_>| -> Vec<_> {
            p.assignments.iter().map(|a| { let r = a.pod.reference(); (r.kind, r.name, r.namespace, r.uid) }).collect()
        };
        proptest::prop_assert_eq!(refs(&whole), refs(&compact));
    }
}

#[test]
fn a_plan_on_the_kept_ledger_equals_one_on_a_rebuilt_ledger_pass_after_pass() {
    // Each pass changes something: a conflict appears, kubelet's truth arrives, a pod is bound
    // without indices, a pod finishes. The kept ledger follows; the plans agree each time.
    let nodes = [reported_node("n1", 4, &[("uid-old", &["GPU-n1-0", "GPU-n1-2"])]), node("n2", 8)];
    let passes: Vec<Vec<Pod>> = vec![
        vec![pod("ns", "old", 1, "n1", 2, Some("0,1")), pod("ns", "other", 2, "n2", 2, Some("0,1"))],
        vec![
            pod("ns", "old", 1, "n1", 2, Some("0,1")),
            pod("ns", "young", 2, "n1", 2, Some("2,3")),
            pod("ns", "other", 2, "n2", 2, Some("0,1")),
        ],
        vec![pod("ns", "old", 1, "n1", 2, Some("0,2")), pod("ns", "plain", 3, "n2", 2, None)],
        vec![pod("ns", "plain", 3, "n2", 2, None)],
    ];
    let mut kept = crate::devices::KeptLedger::default();
    let chosen = HashMap::new();
    for (i, pods) in passes.iter().enumerate() {
        let (snapshot, gpus) = world(&nodes, pods);
        let rebuilt = plan_with(pods, &snapshot, &gpus, &chosen);
        let on_kept = plan_kept(pods, &snapshot, &gpus, &chosen, &mut kept);
        assert_eq!(on_kept.ledger, rebuilt.ledger, "pass {i}");
        let gpus_of =
            |p: &DevicePlan<'_>| p.assignments.iter().map(|a| (a.pod.uid().to_string(), a.gpus)).collect::<Vec<_>>();
        assert_eq!(gpus_of(&on_kept), gpus_of(&rebuilt), "pass {i}");
        let keys = |p: &DevicePlan<'_>| {
            let mut k: Vec<String> = p.reports.iter().map(|r| r.key.clone()).collect();
            k.sort();
            k
        };
        assert_eq!(keys(&on_kept), keys(&rebuilt), "pass {i}");
        // The passes do what they are for.
        let conflict = rebuilt.reports.iter().any(|r| r.reason == "GPUConflict");
        assert_eq!(conflict, i == 1, "pass {i}: {:?}", rebuilt.reports);
        let plain_given = rebuilt.assignments.iter().any(|a| a.pod.uid() == "uid-plain" && a.source == Source::Chosen);
        assert_eq!(plain_given, i >= 2, "pass {i}");
    }
}

/// A pod pinned to `node` by its own nodeSelector (not bound, not gated), asking for `gpus`:
/// what a tenant writes to squat GPUs it never runs on.
fn pinned(name: &str, node: &str, gpus: u32, indices: &str) -> Pod {
    let mut p = pod("tenant", name, 5, node, gpus, Some(indices));
    let spec = p.spec.as_mut().unwrap();
    spec.node_name = None;
    spec.node_selector = Some(
        [(crate::crds::HOSTNAME_LABEL.to_string(), node.to_string()), ("no-node-has".to_string(), "this".to_string())]
            .into(),
    );
    p.status.as_mut().unwrap().phase = Some("Pending".into());
    p
}

#[tokio::test]
async fn indices_nothing_vouches_for_hold_no_gpu_and_are_reported_once() {
    let api = FakeApi::start().await;
    let nodes = [node("n1", 4)];
    // Issue 38's squatter: no GPU asked, all four named, never bound. Beside it a pod asking
    // for one GPU, never bound, not placed by muster, naming all four too; and a bound pod
    // asking for one and naming four.
    let pods = vec![
        pinned("squat", "n1", 0, "0,1,2,3"),
        pinned("unplaced", "n1", 1, "0,1,2,3"),
        pod("tenant", "greedy", 6, "n1", 1, Some("0,1,2,3")),
    ];
    let mut devices = DeviceReconciler::default();
    for round in 0..3 {
        let (snapshot, gpus) = world(&nodes, &pods);
        let held = pass_settled(&mut devices, &api.ctx, &pods, &snapshot, &gpus).await;
        // Only the bound pod holds anything, and only the one GPU it asks for.
        assert_eq!(held.get("n1").map(|g| g.len()), Some(1), "round {round}: {held:?}");
        let plan = plan(&pods, &snapshot, &gpus);
        assert_eq!(plan.ledger.claim("uid-squat"), None);
        assert_eq!(plan.ledger.claim("uid-unplaced"), None);
        assert_eq!(plan.ledger.claim("uid-greedy").map(|c| c.gpus.len()), Some(1));
    }
    for who in ["squat", "unplaced", "greedy"] {
        assert_eq!(api.events(UNTRUSTED_INDICES, who).await, 1, "{who}: reported once over three passes");
    }
    // The bound pod's annotation is corrected to the one GPU it holds.
    let greedy = api.patches("tenant", "greedy");
    assert_eq!(greedy.len(), 1, "{greedy:?}");
    assert_eq!(written(&greedy[0]).len(), 1);
}

#[test]
fn muster_s_plan_vouches_for_a_pod_not_bound_yet() {
    let nodes = [node("n1", 4)];
    let pods = [pinned("admitted", "n1", 2, "2,3")];
    let (mut snapshot, gpus) = world(&nodes, &pods);
    assert_eq!(plan(&pods, &snapshot, &gpus).ledger.claim("uid-admitted"), None, "no plan: nothing held");
    let placed = |node: &str, gpus: GpuSet| crate::devices::Placed { node: node.into(), gpus: Some(gpus) };
    let cases = [
        ("planned there with those GPUs", placed("n1", set(&[2, 3])), Some(set(&[2, 3]))),
        ("planned with other GPUs", placed("n1", set(&[0, 1])), None),
        ("planned on another node", placed("n2", set(&[2, 3])), None),
    ];
    for (what, where_, holds) in cases {
        snapshot.set_placed([("uid-admitted".to_string(), where_)]);
        let plan = plan(&pods, &snapshot, &gpus);
        assert_eq!(plan.ledger.claim("uid-admitted").map(|c| c.gpus), holds, "{what}");
        let untrusted = plan.reports.iter().any(|r| r.reason == UNTRUSTED_INDICES);
        assert_eq!(untrusted, holds.is_none(), "{what}: {:?}", plan.reports);
    }
}

proptest::proptest! {
    /// Whatever a pod's author writes in `gpu.muster.dev/indices` (any text), on pods bound or
    /// only pinned, asking for any number of GPUs, with no plan of muster's: the pass never
    /// panics, a pod holds GPUs only once bound and never more than it asks for, and no GPU is
    /// held twice.
    #[test]
    fn written_indices_never_hold_more_than_a_bound_pod_asks(
        specs in proptest::collection::vec(
            (proptest::bool::ANY, 0u32..4, proptest::option::of("[0-9, x-]{0,12}"), 0u32..50),
            0..10,
        )
    ) {
        let nodes = [node("n1", 8)];
        let pods: Vec<Pod> = specs
            .iter()
            .enumerate()
            .map(|(i, (bound, gpus, indices, created))| {
                let name = format!("p{i}");
                match (bound, indices) {
                    (false, Some(v)) => pinned(&name, "n1", *gpus, v),
                    _ => pod("tenant", &name, *created, "n1", *gpus, indices.as_deref()),
                }
            })
            .collect();
        let (snapshot, gpus) = world(&nodes, &pods);
        let plan = plan(&pods, &snapshot, &gpus);
        let mut seen = GpuSet::EMPTY;
        for p in &pods {
            let uid = p.metadata.uid.as_deref().unwrap();
            let wanted = gpus_wanted(p);
            let claim = plan.ledger.claim(uid);
            if let Some(claim) = claim {
                proptest::prop_assert!(crate::pods::is_bound(p), "{uid} holds {} unbound", claim.gpus);
                proptest::prop_assert!(claim.gpus.len() as u64 <= wanted, "{uid} holds {} asking {wanted}", claim.gpus);
                proptest::prop_assert!(claim.gpus.is_disjoint(seen), "{} held twice", claim.gpus);
                seen = seen.union(claim.gpus);
            }
        }
    }
}

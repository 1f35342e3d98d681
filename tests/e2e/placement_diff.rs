//! The placement judge: muster against kube-scheduler on the same gangs. Every scenario runs
//! twice at the same time, once as an upstream batch/v1 Job with `spec.scheduling` gang
//! (kube-scheduler's GangScheduling decides), once as a MusterJob with the same pod template and
//! `spec.scheduling` (muster decides and pins, kube-scheduler binds), each side in a namespace of
//! its own on a fresh node pool of its own ([`NodePool`]: pool taint and label, pool-specific
//! rack and zone values), so neither side sees the other's pods and no other test lands there.
//!
//! A side *fits* when every pod of the gang is bound; it *does not fit* when, after a settle
//! time, no pod is bound and the decider said no (upstream: the pods' `PodScheduled=False`
//! `Unschedulable`; muster: its PodGroup `Unschedulable` with every pod still gated). Anything
//! else (some pods bound, or none bound with nobody saying no) is a failure of that side.
//! Each scenario also states what kube-scheduler must decide, so a mis-built scenario fails
//! loudly instead of passing as "does not fit" on both sides.
//!
//! `MUSTER_PD_SCENARIOS=a,b` runs only the scenarios whose names contain one of the words;
//! `MUSTER_PD_CONCURRENCY` (default 10) bounds how many run at once. The report also goes to
//! `target/placement-diff.txt`.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use muster::crds::scheduling::GroupPhase;
use muster::crds::{ADMISSION_GATE, HOSTNAME_LABEL, JOB_NAME_LABEL, PodGroup};
use muster_dev::FakeGpuNodes;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::gangs::merge;
use crate::harness::manager::muster;
use crate::harness::pools::{NodePool, POOL_LABEL};
use crate::harness::{TestNamespace, client, cluster, namespace, wait_for};

/// How long a side's pods may take to be created (longer means a broken manifest).
const CREATED: Duration = Duration::from_secs(40);
/// Nothing bound this long after all pods exist, with a refusal on record: does not fit.
const SETTLE: Duration = Duration::from_secs(15);
/// Neither all bound nor refused this long after all pods exist: the side failed.
const DECIDE: Duration = Duration::from_secs(40);
/// The label every gang pod carries (what affinity and spread terms select).
const GANG_LABEL: &str = "e2e.muster.dev/gang";
/// The gang's name (Job and MusterJob), also the value of [`GANG_LABEL`].
const GANG: &str = "train";
/// The label that tells runs apart (for matchLabelKeys).
const RUN_LABEL: &str = "e2e.muster.dev/run";
const ZONE: &str = "topology.kubernetes.io/zone";
const RACK: &str = "topology.muster.dev/rack";
/// StorageClass with delayed binding, provisioned by the test itself ([`provision`]).
const WFFC_CLASS: &str = "e2e-pd-wait-for-first-consumer";
/// Provisioner name of [`WFFC_CLASS`] (no CSIDriver object: no capacity checks).
const FAKE_PROVISIONER: &str = "e2e.muster.dev/fake-local";
/// RuntimeClass with a pod overhead.
const RUNTIME_CLASS: &str = "e2e-pd-overhead";
const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
const BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";

/// What a side decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// Every pod of the gang bound.
    Fits,
    /// No pod bound, and the decider said so.
    DoesNotFit,
    /// Some pods bound, not all: a half-started gang.
    Partial { bound: usize, of: usize },
    /// No pod bound, and nobody said no (pinned pods kube-scheduler refused, or no decision).
    Stuck,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::Fits => write!(f, "fits"),
            Verdict::DoesNotFit => write!(f, "does-not-fit"),
            Verdict::Partial { bound, of } => write!(f, "PARTLY-BOUND {bound}/{of}"),
            Verdict::Stuck => write!(f, "STUCK (nothing bound, nothing refused)"),
        }
    }
}

/// A volume the gang's pods share (claim `data`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Volume {
    None,
    /// A PVC bound to a PV whose node affinity allows only pool node `node`.
    BoundTo {
        node: usize,
    },
    /// An unbound PVC of a WaitForFirstConsumer class (the test provisions it, on the node
    /// kube-scheduler selects).
    WaitForFirstConsumer,
    /// The pods name a claim that does not exist.
    Missing,
}

/// A plain pod created (and bound) before the gang, on pool node `node`.
#[derive(Clone, Debug)]
struct Plain {
    node: usize,
    gpus: u32,
    labels: Value,
    spec: Value,
    /// In a second namespace of the side (for namespaceSelector terms).
    elsewhere: bool,
}

/// One scenario: the nodes, what runs there already, and the gang.
#[derive(Clone, Debug)]
struct Scenario {
    name: &'static str,
    nodes: FakeGpuNodes,
    pods: u32,
    gpus: u32,
    /// Merge patch onto the pod template (`{"metadata": .., "spec": ..}`).
    pod: Value,
    /// Merge patch onto `spec.scheduling` (the gang policy is always set).
    scheduling: Value,
    plain: Vec<Plain>,
    volume: Volume,
    /// What kube-scheduler must decide (checks the scenario itself).
    expect: Verdict,
}

fn scenario(name: &'static str, expect: Verdict) -> Scenario {
    Scenario {
        name,
        nodes: FakeGpuNodes { count: 2, gpus: 8, racks: 1, zones: 1, ..FakeGpuNodes::default() },
        pods: 2,
        gpus: 4,
        pod: json!({}),
        scheduling: json!({}),
        plain: Vec::new(),
        volume: Volume::None,
        expect,
    }
}

impl Scenario {
    fn nodes(mut self, count: u32, gpus: u32) -> Self {
        self.nodes.count = count;
        self.nodes.gpus = gpus;
        self
    }
    /// Racks (node i in rack i mod racks) and zones (rack r in zone r mod zones).
    fn racks(mut self, racks: u32, zones: u32) -> Self {
        self.nodes.racks = racks;
        self.nodes.zones = zones;
        self
    }
    fn cpu(mut self, cpu: &str, memory: &str) -> Self {
        self.nodes.cpu = cpu.into();
        self.nodes.memory = memory.into();
        self
    }
    /// `pods` pods of `gpus` GPUs each, minCount = pods.
    fn gang(mut self, pods: u32, gpus: u32) -> Self {
        self.pods = pods;
        self.gpus = gpus;
        self
    }
    fn with(mut self, patch: Value) -> Self {
        merge(&mut self.pod, patch);
        self
    }
    fn spec(self, patch: Value) -> Self {
        self.with(json!({"spec": patch}))
    }
    fn scheduling(mut self, patch: Value) -> Self {
        merge(&mut self.scheduling, patch);
        self
    }
    fn plain(mut self, node: usize, gpus: u32) -> Self {
        self.plain.push(Plain { node, gpus, labels: json!({}), spec: json!({}), elsewhere: false });
        self
    }
    fn plain_with(mut self, node: usize, gpus: u32, labels: Value, spec: Value) -> Self {
        self.plain.push(Plain { node, gpus, labels, spec, elsewhere: false });
        self
    }
    fn plain_elsewhere(mut self, node: usize, gpus: u32, labels: Value) -> Self {
        self.plain.push(Plain { node, gpus, labels, spec: json!({}), elsewhere: true });
        self
    }
    fn volume(mut self, volume: Volume) -> Self {
        self.volume = volume;
        self
    }
}

/// A training container with `gpus` GPUs (and a little CPU and memory).
fn trainer(gpus: u32) -> Value {
    json!({"name": "trainer", "image": "registry.invalid/trainer:1",
        "command": ["torchrun", "train.py"],
        "resources": {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"nvidia.com/gpu": gpus.to_string()}}})
}

/// A container with these requests (and `gpus` GPUs).
fn container(name: &str, cpu: &str, memory: &str, gpus: u32) -> Value {
    let mut limits = json!({});
    if gpus > 0 {
        limits = json!({"nvidia.com/gpu": gpus.to_string()});
    }
    json!({"name": name, "image": "registry.invalid/trainer:1",
        "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": limits}})
}

fn gang_selector() -> Value {
    json!({"matchLabels": {GANG_LABEL: GANG}})
}

/// Required anti-affinity against the gang's own pods: one per domain of `key`.
fn one_per(key: &str) -> Value {
    json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": gang_selector(), "topologyKey": key}]}}})
}

/// Required affinity to the gang's own pods: all in one domain of `key`.
fn together_in(key: &str) -> Value {
    json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": gang_selector(), "topologyKey": key}]}}})
}

/// A DoNotSchedule spread of the gang's pods over `key`.
fn spread(key: &str, max_skew: u32, min_domains: Option<u32>) -> Value {
    let mut c = json!({"maxSkew": max_skew, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": gang_selector()});
    if let Some(m) = min_domains {
        c["minDomains"] = json!(m);
    }
    json!({"topologySpreadConstraints": [c]})
}

fn with_host_port(gpus: u32) -> Value {
    let mut c = trainer(gpus);
    c["ports"] = json!([{"name": "rendezvous", "containerPort": 29500, "hostPort": 29500, "protocol": "TCP"}]);
    json!({"containers": [c]})
}

use Verdict::{DoesNotFit, Fits};

/// The scenarios. Nodes have 8 GPUs, 128 CPUs and 1Ti unless said otherwise; pool node names,
/// racks and zones are the pool's own.
fn scenarios() -> Vec<Scenario> {
    vec![
        // --- resources, selectors and the group's topology constraint
        scenario("gpus-fill-every-node", Fits).nodes(4, 8).gang(4, 8),
        scenario("gpus-one-pod-too-many", DoesNotFit).nodes(4, 8).gang(5, 8),
        scenario("cpu-memory-at-the-edge", Fits)
            .cpu("16", "64Gi")
            .gang(4, 2)
            .spec(json!({"containers": [container("trainer", "8", "32Gi", 2)]})),
        scenario("cpu-one-millicore-over", DoesNotFit)
            .cpu("16", "64Gi")
            .gang(4, 2)
            .spec(json!({"containers": [container("trainer", "8001m", "32Gi", 2)]})),
        scenario("next-to-plain-pods", Fits).plain(0, 8).gang(2, 4),
        scenario("next-to-plain-pods-full", DoesNotFit).plain(0, 8).plain(1, 4).gang(2, 4),
        scenario("fits-only-one-way", Fits).nodes(3, 8).plain(0, 4).plain(2, 4).gang(4, 4),
        scenario("node-affinity-gpu-product", Fits).gang(2, 8).spec(json!({"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}]}]}}}})),
        scenario("node-affinity-absent-product", DoesNotFit).gang(2, 8).spec(json!({"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-B200"]}]}]}}}})),
        scenario("rack-constraint-fits", Fits)
            .nodes(4, 8)
            .racks(2, 1)
            .gang(2, 8)
            .scheduling(json!({"schedulingConstraints": {"topology": [{"key": RACK}]}})),
        scenario("rack-constraint-too-big", DoesNotFit)
            .nodes(4, 8)
            .racks(2, 1)
            .gang(3, 8)
            .scheduling(json!({"schedulingConstraints": {"topology": [{"key": RACK}]}})),
        // --- inter-pod anti-affinity and affinity among the gang's own pods
        scenario("anti-affinity-one-per-node", Fits).gang(2, 4).spec(one_per(HOSTNAME_LABEL)),
        scenario("anti-affinity-one-per-node-too-many", DoesNotFit).gang(3, 4).spec(one_per(HOSTNAME_LABEL)),
        scenario("anti-affinity-one-per-rack", Fits).nodes(4, 8).racks(2, 1).gang(2, 4).spec(one_per(RACK)),
        scenario("anti-affinity-one-per-rack-too-many", DoesNotFit)
            .nodes(4, 8)
            .racks(2, 1)
            .gang(3, 4)
            .spec(one_per(RACK)),
        scenario("anti-affinity-fits-only-one-way", Fits)
            .nodes(3, 8)
            .plain(0, 4)
            .gang(3, 4)
            .spec(one_per(HOSTNAME_LABEL)),
        scenario("anti-affinity-in-one-rack", DoesNotFit)
            .nodes(4, 8)
            .racks(2, 1)
            .gang(3, 2)
            .spec(one_per(HOSTNAME_LABEL))
            .scheduling(json!({"schedulingConstraints": {"topology": [{"key": RACK}]}})),
        scenario("affinity-together-in-rack", Fits).nodes(4, 8).racks(2, 1).gang(4, 4).spec(together_in(RACK)),
        scenario("affinity-together-in-rack-too-big", DoesNotFit)
            .nodes(4, 8)
            .racks(2, 1)
            .gang(5, 4)
            .spec(together_in(RACK)),
        scenario("affinity-together-in-zone", Fits).nodes(4, 8).racks(2, 2).gang(4, 4).spec(together_in(ZONE)),
        // --- topology spread
        scenario("spread-zones-max-skew-1", Fits).nodes(4, 8).racks(2, 2).gang(4, 4).spec(spread(ZONE, 1, None)),
        scenario("spread-zones-one-zone-full", DoesNotFit)
            .nodes(4, 8)
            .racks(2, 2)
            .plain(0, 8)
            .plain(2, 8)
            .gang(2, 4)
            .spec(spread(ZONE, 1, None)),
        scenario("spread-min-domains", Fits).nodes(4, 8).racks(2, 2).gang(2, 4).spec(spread(ZONE, 1, Some(3))),
        scenario("spread-min-domains-too-many", DoesNotFit).nodes(4, 8).racks(2, 2).gang(3, 4).spec(spread(
            ZONE,
            1,
            Some(3),
        )),
        scenario("spread-hostname-full-node", DoesNotFit).plain(0, 8).gang(2, 4).spec(spread(HOSTNAME_LABEL, 1, None)),
        scenario("spread-counts-running-pods", Fits)
            .plain_with(0, 8, json!({GANG_LABEL: GANG}), json!({}))
            .gang(2, 4)
            .spec(spread(HOSTNAME_LABEL, 1, None)),
        // --- inter-pod rules against pods already running
        scenario("anti-affinity-against-running", Fits)
            .nodes(3, 8)
            .plain_with(0, 1, json!({GANG_LABEL: GANG}), json!({}))
            .gang(2, 4)
            .spec(one_per(HOSTNAME_LABEL)),
        scenario("anti-affinity-against-running-too-few", DoesNotFit)
            .plain_with(0, 1, json!({GANG_LABEL: GANG}), json!({}))
            .gang(2, 4)
            .spec(one_per(HOSTNAME_LABEL)),
        scenario("symmetric-anti-affinity", DoesNotFit)
            .plain_with(0, 0, json!({"app": "inference"}), one_per_gang_node())
            .gang(2, 8),
        scenario("symmetric-anti-affinity-spare-node", Fits)
            .nodes(3, 8)
            .plain_with(0, 0, json!({"app": "inference"}), one_per_gang_node())
            .gang(2, 8),
        scenario("anti-affinity-namespace-selector", DoesNotFit)
            .plain_elsewhere(0, 0, json!({"app": "noisy"}))
            .gang(2, 8)
            .spec(json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "noisy"}}, "namespaceSelector": {},
                 "topologyKey": HOSTNAME_LABEL}]}}})),
        scenario("anti-affinity-other-namespace-ignored", Fits)
            .plain_elsewhere(0, 0, json!({"app": "noisy"}))
            .gang(2, 8)
            .spec(json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "noisy"}}, "topologyKey": HOSTNAME_LABEL}]}}})),
        scenario("match-label-keys-ignore-previous-run", Fits)
            .plain_with(0, 1, json!({GANG_LABEL: GANG, RUN_LABEL: "r0"}), json!({}))
            .gang(2, 4)
            .with(json!({"metadata": {"labels": {RUN_LABEL: "r1"}}}))
            .spec(json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": gang_selector(), "matchLabelKeys": [RUN_LABEL], "topologyKey": HOSTNAME_LABEL}]}}})),
        // --- host ports
        scenario("host-port-one-per-node", Fits).gang(2, 4).spec(with_host_port(4)),
        scenario("host-port-too-many", DoesNotFit).nodes(2, 8).gang(3, 2).spec(with_host_port(2)),
        scenario("host-port-taken-by-running", DoesNotFit)
            .plain_with(0, 0, json!({}), with_host_port(0))
            .gang(2, 4)
            .spec(with_host_port(4)),
        // --- volumes
        scenario("pv-node-affinity", Fits).gang(2, 4).volume(Volume::BoundTo { node: 1 }),
        scenario("pv-node-affinity-too-big", DoesNotFit).gang(2, 8).volume(Volume::BoundTo { node: 1 }),
        scenario("wffc-claim-not-restricted", Fits).plain(0, 8).gang(2, 4).volume(Volume::WaitForFirstConsumer),
        scenario("wffc-shared-claim-one-node", DoesNotFit).gang(2, 8).volume(Volume::WaitForFirstConsumer),
        scenario("missing-claim", DoesNotFit).gang(2, 4).volume(Volume::Missing),
        // --- init containers, sidecars and overhead at the capacity edge (16-CPU nodes)
        scenario("init-container-at-the-edge", Fits).cpu("16", "64Gi").gang(4, 2).spec(json!({
            "initContainers": [container("stage-data", "8", "1Gi", 0)],
            "containers": [container("trainer", "2", "1Gi", 2)]})),
        scenario("init-container-over", DoesNotFit).cpu("16", "64Gi").gang(3, 2).spec(json!({
            "initContainers": [container("stage-data", "12", "1Gi", 0)],
            "containers": [container("trainer", "2", "1Gi", 2)]})),
        scenario("sidecar-at-the-edge", Fits).cpu("16", "64Gi").gang(4, 2).spec(json!({
            "initContainers": [sidecar("2")],
            "containers": [container("trainer", "6", "1Gi", 2)]})),
        scenario("sidecar-over", DoesNotFit).cpu("16", "64Gi").gang(4, 2).spec(json!({
            "initContainers": [sidecar("3")],
            "containers": [container("trainer", "6", "1Gi", 2)]})),
        scenario("overhead-at-the-edge", Fits).cpu("16", "64Gi").gang(4, 2).spec(json!({
            "runtimeClassName": RUNTIME_CLASS,
            "containers": [container("trainer", "7", "1Gi", 2)]})),
        scenario("overhead-over", DoesNotFit).cpu("16", "64Gi").gang(4, 2).spec(json!({
            "runtimeClassName": RUNTIME_CLASS,
            "containers": [container("trainer", "7500m", "1Gi", 2)]})),
    ]
}

/// A log shipper sidecar (restartable init container) with `cpu` CPUs.
fn sidecar(cpu: &str) -> Value {
    let mut c = container("log-shipper", cpu, "1Gi", 0);
    c["restartPolicy"] = json!("Always");
    c
}

/// A plain pod's required anti-affinity against the gang's pods on its node (the symmetric rule).
fn one_per_gang_node() -> Value {
    one_per(HOSTNAME_LABEL)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Upstream,
    Muster,
}

impl Side {
    fn short(self) -> &'static str {
        match self {
            Side::Upstream => "u",
            Side::Muster => "m",
        }
    }

    /// The label that names the gang's Job on its pods.
    fn job_label(self) -> &'static str {
        match self {
            Side::Upstream => "batch.kubernetes.io/job-name",
            Side::Muster => JOB_NAME_LABEL,
        }
    }
}

/// The Job (upstream) or MusterJob of `s` on `pool`.
fn gang_manifest(s: &Scenario, side: Side, pool: &NodePool) -> Value {
    let mut template = json!({
        "metadata": {"labels": {GANG_LABEL: GANG}},
        "spec": {"restartPolicy": "Never", "containers": [trainer(s.gpus)]},
    });
    if s.volume != Volume::None {
        merge(
            &mut template,
            json!({"spec": {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}}),
        );
    }
    merge(&mut template, s.pod.clone());
    merge(&mut template, json!({"spec": pool.placement()}));
    let mut scheduling = json!({"schedulingPolicy": {"gang": {"minCount": s.pods}}});
    merge(&mut scheduling, s.scheduling.clone());
    let api_version = match side {
        Side::Upstream => "batch/v1",
        Side::Muster => "batch.muster.dev/v1alpha1",
    };
    let kind = match side {
        Side::Upstream => "Job",
        Side::Muster => "MusterJob",
    };
    json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": GANG},
        "spec": {
            "parallelism": s.pods,
            "completions": s.pods,
            "completionMode": "Indexed",
            "scheduling": scheduling,
            "template": template,
        },
    })
}

/// What one side of a scenario ended with.
#[derive(Debug)]
struct Outcome {
    verdict: Verdict,
    /// Why (the refusal, or where the pods went).
    detail: String,
    /// Bound pods of the gang counted again once both sides decided.
    bound_at_end: usize,
}

/// Everything a side made that outlives its namespace guard: nodes (the pool's own guard),
/// PersistentVolumes and protection finalizers. Dropped before the namespaces.
struct SideObjects {
    namespaces: Vec<String>,
    pv_selector: String,
}

impl Drop for SideObjects {
    fn drop(&mut self) {
        let c = cluster();
        for ns in &self.namespaces {
            if let Ok(names) = c.kubectl(&["-n", ns, "get", "pvc", "-o", "name"]) {
                for pvc in names.lines().filter(|l| !l.is_empty()) {
                    let _ = c.kubectl(&[
                        "-n",
                        ns,
                        "patch",
                        pvc,
                        "--type=merge",
                        "-p",
                        r#"{"metadata":{"finalizers":null}}"#,
                    ]);
                }
            }
        }
        if let Ok(names) = c.kubectl(&["get", "pv", "-l", &self.pv_selector, "-o", "name"]) {
            for pv in names.lines().filter(|l| !l.is_empty()) {
                let _ = c.kubectl(&["patch", pv, "--type=merge", "-p", r#"{"metadata":{"finalizers":null}}"#]);
                let _ = c.kubectl(&["delete", pv, "--wait=false", "--ignore-not-found"]);
            }
        }
    }
}

/// A side set up and its gang created: what [`decide`] watches.
/// Dropped in field order: the provisioner stops, finalizers go, namespaces go, then the nodes.
struct Running {
    side: Side,
    provisioner: Option<tokio::task::JoinHandle<()>>,
    _objects: SideObjects,
    ns: TestNamespace,
    _other: Option<TestNamespace>,
    _pool: NodePool,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(p) = self.provisioner.take() {
            p.abort();
        }
    }
}

async fn blocking_namespace(prefix: String) -> TestNamespace {
    tokio::task::spawn_blocking(move || namespace(&prefix)).await.expect("namespace")
}

async fn kubectl_async(args: Vec<String>, input: Option<String>) -> Result<String, String> {
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        cluster().kubectl_stdin(&args, input.as_deref())
    })
    .await
    .expect("kubectl")
}

fn short_name(name: &str) -> String {
    // Namespace prefixes are cut at 40; keep room for the side and the counter.
    name.chars().take(30).collect()
}

/// Sets up one side of `s`: namespace(s), pool, volumes, plain pods (bound), then the gang.
async fn start_side(s: &Scenario, side: Side) -> Running {
    let ns = blocking_namespace(format!("pd-{}-{}", short_name(s.name), side.short())).await;
    let other = if s.plain.iter().any(|p| p.elsewhere) {
        Some(blocking_namespace(format!("pd-{}-{}x", short_name(s.name), side.short())).await)
    } else {
        None
    };
    let mut namespaces = vec![ns.name.clone()];
    namespaces.extend(other.iter().map(|o| o.name.clone()));
    let objects = SideObjects { namespaces, pv_selector: format!("{POOL_LABEL}={}", ns.name) };
    let pool = NodePool::add(&ns.name, &s.nodes).await;
    let c = client().await;
    let what = format!("scenario {} ({:?} side)", s.name, side);

    let provisioner = match s.volume {
        Volume::None | Volume::Missing => None,
        Volume::BoundTo { node } => {
            let pv_name = format!("{}-data", ns.name);
            let pv = json!({"apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": pv_name, "labels": {POOL_LABEL: ns.name}},
                "spec": {"capacity": {"storage": "100Gi"}, "accessModes": ["ReadWriteMany"],
                    "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                    "local": {"path": "/mnt/datasets"},
                    "claimRef": {"namespace": ns.name, "name": "data"},
                    "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": HOSTNAME_LABEL, "operator": "In", "values": [pool.nodes[node]]}]}]}}}});
            // Bound as the PV controller would leave it (no such controller runs here):
            // volumeName plus bind-completed is what kube-scheduler's VolumeBinding reads.
            let pvc = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "data", "namespace": ns.name, "annotations": {BIND_COMPLETED: "yes"}},
                "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": pv_name,
                    "resources": {"requests": {"storage": "100Gi"}}}});
            for o in [pv, pvc] {
                kubectl_async(vec!["create".into(), "-f".into(), "-".into()], Some(o.to_string()))
                    .await
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
            }
            None
        }
        Volume::WaitForFirstConsumer => {
            let pvc = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "data", "namespace": ns.name},
                "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": WFFC_CLASS,
                    "resources": {"requests": {"storage": "100Gi"}}}});
            kubectl_async(vec!["create".into(), "-f".into(), "-".into()], Some(pvc.to_string()))
                .await
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            Some(tokio::spawn(provision(c.clone(), ns.name.clone())))
        }
    };

    for (i, p) in s.plain.iter().enumerate() {
        let target = if p.elsewhere { other.as_ref().map_or(&ns.name, |o| &o.name) } else { &ns.name };
        let mut spec = json!({"restartPolicy": "Never", "containers": [trainer(p.gpus)]});
        if p.gpus == 0 {
            spec = json!({"restartPolicy": "Never", "containers": [container("server", "1", "1Gi", 0)]});
        }
        merge(&mut spec, p.spec.clone());
        if p.gpus == 0 {
            // A plain pod's own port (or affinity) goes on a CPU container.
            if let Some(cs) = spec["containers"].as_array_mut() {
                for c in cs {
                    c["resources"] = json!({"requests": {"cpu": "1", "memory": "1Gi"}});
                }
            }
        }
        merge(&mut spec, pool.placement());
        merge(&mut spec, json!({"nodeSelector": {HOSTNAME_LABEL: pool.nodes[p.node]}}));
        let pod: Pod = serde_json::from_value(
            json!({"metadata": {"name": format!("plain-{i}"), "labels": p.labels}, "spec": spec}),
        )
        .unwrap_or_else(|e| panic!("{what}: plain pod {i}: {e}"));
        let pods: Api<Pod> = Api::namespaced(c.clone(), target);
        pods.create(&PostParams::default(), &pod).await.unwrap_or_else(|e| panic!("{what}: plain pod {i}: {e}"));
        wait_for(&format!("{what}: plain pod {i} bound on {}", pool.nodes[p.node]), CREATED, || async {
            let p = pods.get(&format!("plain-{i}")).await.ok()?;
            p.spec?.node_name.filter(|n| !n.is_empty()).map(|_| ())
        })
        .await;
    }

    let manifest = gang_manifest(s, side, &pool).to_string();
    let args = ["-n", &ns.name, "create", "-f", "-"].map(String::from).to_vec();
    kubectl_async(args, Some(manifest)).await.unwrap_or_else(|e| panic!("{what}: the apiserver refused the gang: {e}"));
    Running { side, provisioner, _objects: objects, ns, _other: other, _pool: pool }
}

/// Plays the provisioner of [`WFFC_CLASS`] in `namespace`: a claim kube-scheduler selected a
/// node for gets a local PV on that node, bound as the PV controller would bind it.
async fn provision(c: kube::Client, namespace: String) {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.clone(), &namespace);
    let pvs: Api<DynamicObject> =
        Api::all_with(c, &ApiResource::from_gvk(&GroupVersionKind::gvk("", "v1", "PersistentVolume")));
    loop {
        for claim in claims.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default() {
            let Some(node) = claim.annotations().get(SELECTED_NODE).cloned() else { continue };
            if claim.spec.as_ref().and_then(|s| s.volume_name.as_ref()).is_some() {
                continue;
            }
            let name = format!("{namespace}-{}", claim.name_any());
            let pv: DynamicObject = serde_json::from_value(json!({"apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": name, "labels": {POOL_LABEL: namespace}},
                "spec": {"capacity": {"storage": "100Gi"}, "accessModes": ["ReadWriteMany"],
                    "persistentVolumeReclaimPolicy": "Delete", "storageClassName": WFFC_CLASS,
                    "local": {"path": "/mnt/scratch"},
                    "claimRef": {"namespace": namespace, "name": claim.name_any(), "uid": claim.uid()},
                    "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": HOSTNAME_LABEL, "operator": "In", "values": [node]}]}]}}}}))
            .expect("pv");
            let _ = pvs.create(&PostParams::default(), &pv).await;
            let patch = json!({"metadata": {"annotations": {BIND_COMPLETED: "yes"}}, "spec": {"volumeName": name}});
            let _ = claims.patch(&claim.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn node_of(p: &Pod) -> Option<&str> {
    p.spec.as_ref()?.node_name.as_deref().filter(|n| !n.is_empty())
}

fn gated_by_muster(p: &Pod) -> bool {
    p.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| g.iter().any(|g| g.name == ADMISSION_GATE))
}

/// kube-scheduler's refusal of a pod: `PodScheduled=False` with reason `Unschedulable`.
fn refusal(p: &Pod) -> Option<String> {
    let c = p.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "PodScheduled")?;
    (c.status == "False" && c.reason.as_deref() == Some("Unschedulable")).then(|| c.message.clone().unwrap_or_default())
}

/// kube-scheduler's refusal where a pod's condition does not carry it (a PreFilter rejection of
/// a gang pod): the native PodGroup's `PodGroupInitiallyScheduled=False` condition, or a
/// `FailedScheduling` event of a gang pod.
async fn upstream_refusal(namespace: &str, group: Option<&str>, pods: &[Pod]) -> Option<String> {
    let c = client().await;
    if let Some(group) = group {
        let api: Api<DynamicObject> = Api::namespaced_with(
            c.clone(),
            namespace,
            &ApiResource::from_gvk(&GroupVersionKind::gvk("scheduling.k8s.io", "v1beta1", "PodGroup")),
        );
        let g = api.get_opt(group).await.ok().flatten();
        let conditions = g.map(|g| g.data["status"]["conditions"].clone()).unwrap_or_default();
        let refused = conditions.as_array().into_iter().flatten().find(|c| {
            c["type"] == "PodGroupInitiallyScheduled" && c["status"] == "False" && c["reason"] == "Unschedulable"
        });
        if let Some(c) = refused {
            return Some(format!("PodGroup {group}: {}", c["message"].as_str().unwrap_or_default()));
        }
    }
    let names: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
    let events: Api<Event> = Api::namespaced(c, namespace);
    let list = events.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
    list.into_iter()
        .find(|e| {
            e.reason.as_deref() == Some("FailedScheduling")
                && e.involved_object.name.as_ref().is_some_and(|n| names.contains(n))
        })
        .map(|e| format!("event FailedScheduling: {}", e.message.unwrap_or_default()))
}

async fn gang_pods(pods: &Api<Pod>, side: Side) -> Vec<Pod> {
    let lp = ListParams::default().labels(&format!("{}={GANG}", side.job_label()));
    let list = pods.list(&lp).await.map(|l| l.items).unwrap_or_default();
    list.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect()
}

/// Checks that the side's decider really governs its pods: upstream, a native PodGroup with
/// the gang's minCount that every pod joins; muster, its PodGroup of the gang.
async fn check_governed(s: &Scenario, r: &Running, pods: &[Pod]) -> Result<String, String> {
    let c = client().await;
    match r.side {
        Side::Upstream => {
            let api: Api<DynamicObject> = Api::namespaced_with(
                c,
                &r.ns.name,
                &ApiResource::from_gvk(&GroupVersionKind::gvk("scheduling.k8s.io", "v1beta1", "PodGroup")),
            );
            let groups = api.list(&ListParams::default()).await.map_err(|e| format!("native PodGroups: {e}"))?.items;
            let [group] = groups.as_slice() else {
                return Err(format!("{} native PodGroup(s) for the Job, expected 1", groups.len()));
            };
            let name = group.name_any();
            let min = &group.data["spec"]["schedulingPolicy"]["gang"]["minCount"];
            if *min != json!(s.pods) {
                return Err(format!("native PodGroup {name} has gang minCount {min}, expected {}", s.pods));
            }
            for p in pods {
                let joined = serde_json::to_value(p)
                    .ok()
                    .and_then(|v| v["spec"]["schedulingGroup"]["podGroupName"].as_str().map(String::from));
                if joined.as_deref() != Some(name.as_str()) {
                    return Err(format!("pod {} joins {joined:?}, not the PodGroup {name}", p.name_any()));
                }
            }
            Ok(name)
        }
        Side::Muster => {
            let api: Api<PodGroup> = Api::namespaced(c, &r.ns.name);
            api.get_opt(GANG).await.map_err(|e| e.to_string())?.ok_or("no muster PodGroup of the gang")?;
            Ok(GANG.to_string())
        }
    }
}

/// Watches a side until it decides (see the module doc).
async fn decide(s: &Scenario, r: &Running) -> Result<(Verdict, String), String> {
    let c = client().await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), &r.ns.name);
    let n = s.pods as usize;
    let created = Instant::now() + CREATED;
    let mut all = gang_pods(&pods, r.side).await;
    while all.len() < n {
        if Instant::now() > created {
            return Err(format!("only {} of {n} pods created within {CREATED:?}: a manifest problem?", all.len()));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        all = gang_pods(&pods, r.side).await;
    }
    let began = Instant::now();
    let groups: Api<PodGroup> = Api::namespaced(c, &r.ns.name);
    let mut governed = None;
    loop {
        let live = gang_pods(&pods, r.side).await;
        if governed.is_none() && live.len() == n {
            // The PodGroup can trail the pods a little.
            match check_governed(s, r, &live).await {
                Ok(g) => governed = Some(g),
                Err(e) if began.elapsed() > SETTLE => return Err(e),
                Err(_) => {}
            }
        }
        let bound: Vec<&str> = live.iter().filter_map(node_of).collect();
        if governed.is_some() && live.len() == n && bound.len() == n {
            let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
            for b in &bound {
                *per_node.entry(b.rsplit('-').next().unwrap_or(b)).or_default() += 1;
            }
            return Ok((Verdict::Fits, format!("pods per node index {per_node:?}")));
        }
        let refused = match r.side {
            Side::Upstream => match live.iter().find_map(refusal) {
                Some(why) => Some(why),
                None => upstream_refusal(&r.ns.name, governed.as_deref(), &live).await,
            },
            Side::Muster => {
                let g = groups.get_opt(GANG).await.ok().flatten();
                let status = g.and_then(|g| g.status);
                status
                    .filter(|st| st.phase == Some(GroupPhase::Unschedulable) && live.iter().all(gated_by_muster))
                    .map(|st| st.message.unwrap_or_default())
            }
        };
        if let (Some(_), true, Some(why)) = (&governed, bound.is_empty() && began.elapsed() >= SETTLE, refused) {
            return Ok((Verdict::DoesNotFit, why));
        }
        if began.elapsed() >= DECIDE {
            let verdict =
                if bound.is_empty() { Verdict::Stuck } else { Verdict::Partial { bound: bound.len(), of: n } };
            let why = live.iter().find_map(refusal).unwrap_or_default();
            return Ok((verdict, format!("kube-scheduler: {why}")));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn bound_now(r: &Running) -> usize {
    let pods: Api<Pod> = Api::namespaced(client().await, &r.ns.name);
    gang_pods(&pods, r.side).await.iter().filter(|p| node_of(p).is_some()).count()
}

/// Runs both sides of `s` at once on their own pools; returns (upstream, muster).
async fn run_scenario(s: Scenario) -> Result<(Outcome, Outcome), String> {
    let (u, m) = tokio::join!(start_side(&s, Side::Upstream), start_side(&s, Side::Muster));
    let (du, dm) = tokio::join!(decide(&s, &u), decide(&s, &m));
    // A moment more, then count again: a late bind would show a half-started gang.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (bu, bm) = tokio::join!(bound_now(&u), bound_now(&m));
    let (vu, wu) = du.map_err(|e| format!("upstream side: {e}"))?;
    let (vm, wm) = dm.map_err(|e| format!("muster side: {e}"))?;
    Ok((Outcome { verdict: vu, detail: wu, bound_at_end: bu }, Outcome { verdict: vm, detail: wm, bound_at_end: bm }))
}

/// Cluster-scoped objects the scenarios share: created once, kept.
fn shared_objects() {
    let objects = [
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": WFFC_CLASS},
            "provisioner": FAKE_PROVISIONER, "volumeBindingMode": "WaitForFirstConsumer"}),
        json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": RUNTIME_CLASS},
            "handler": "kata", "overhead": {"podFixed": {"cpu": "1", "memory": "512Mi"}}}),
    ];
    for o in objects {
        match cluster().kubectl_stdin(&["create", "-f", "-"], Some(&o.to_string())) {
            Ok(_) => {}
            Err(e) if e.contains("AlreadyExists") => {}
            Err(e) => panic!("{e}"),
        }
    }
}

/// Writes past the test harness's capture, so the table shows with passing tests too.
fn report(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

fn panic_text(e: tokio::task::JoinError) -> String {
    match e.try_into_panic() {
        Ok(p) => p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panicked".into()),
        Err(e) => e.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn muster_and_kube_scheduler_agree_on_which_gangs_fit() {
    let _muster = muster().await;
    tokio::task::spawn_blocking(shared_objects).await.expect("shared objects");
    let only: Vec<String> = std::env::var("MUSTER_PD_SCENARIOS")
        .unwrap_or_default()
        .split(',')
        .filter(|w| !w.is_empty())
        .map(String::from)
        .collect();
    let all = scenarios();
    let mut names: Vec<&str> = all.iter().map(|s| s.name).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), all.len(), "scenario names must be unique");
    let chosen: Vec<Scenario> =
        all.into_iter().filter(|s| only.is_empty() || only.iter().any(|w| s.name.contains(w.as_str()))).collect();
    assert!(!chosen.is_empty(), "MUSTER_PD_SCENARIOS={only:?} matches no scenario");
    let concurrency = std::env::var("MUSTER_PD_CONCURRENCY").ok().and_then(|v| v.parse().ok()).unwrap_or(10);
    let limit = Arc::new(Semaphore::new(concurrency));
    let began = Instant::now();
    let mut tasks = Vec::new();
    for s in chosen {
        let limit = limit.clone();
        let (name, expect, pods) = (s.name, s.expect, s.pods as usize);
        tasks.push((
            name,
            expect,
            pods,
            tokio::spawn(async move {
                let _permit = limit.acquire_owned().await.expect("semaphore");
                let started = Instant::now();
                let out = run_scenario(s).await;
                if let Ok((u, m)) = &out {
                    report(&format!(
                        "placement differential: {name:<40} upstream {:<14} muster {:<14} ({:.0}s)",
                        u.verdict.to_string(),
                        m.verdict.to_string(),
                        started.elapsed().as_secs_f64()
                    ));
                }
                out
            }),
        ));
    }
    let total = tasks.len();
    let mut agree = 0;
    let mut problems = Vec::new();
    let mut lines = Vec::new();
    for (name, expect, pods, task) in tasks {
        let out = match task.await {
            Ok(out) => out,
            Err(e) => Err(panic_text(e)),
        };
        let (u, m) = match out {
            Ok(pair) => pair,
            Err(e) => {
                problems.push(format!("{name}: setup failed: {e}"));
                lines.push(format!("{name:<40} ERROR {e}"));
                continue;
            }
        };
        let same = u.verdict == m.verdict;
        lines.push(format!(
            "{name:<40} upstream {:<14} muster {:<14} {}\n    upstream: {}\n    muster:   {}",
            u.verdict.to_string(),
            m.verdict.to_string(),
            if same { "agree" } else { "DISAGREE" },
            u.detail.replace('\n', " "),
            m.detail.replace('\n', " "),
        ));
        if u.verdict != expect {
            problems.push(format!(
                "{name}: kube-scheduler decided {} but the scenario expects {expect}: the scenario is mis-built ({})",
                u.verdict, u.detail
            ));
        }
        if same {
            agree += 1;
        } else {
            problems.push(format!("{name}: upstream {} but muster {} ({})", u.verdict, m.verdict, m.detail));
        }
        for (who, o) in [("upstream", &u), ("muster", &m)] {
            let want = if o.verdict == Verdict::Fits { pods } else { 0 };
            if o.bound_at_end != want {
                problems.push(format!(
                    "{name}: the {who} side ends with {} of {pods} pod(s) bound after deciding {}",
                    o.bound_at_end, o.verdict
                ));
            }
        }
    }
    let summary =
        format!("placement differential: {agree}/{total} scenarios agree ({:.0}s)", began.elapsed().as_secs_f64());
    let text = format!("{}\n{summary}\n", lines.join("\n"));
    let _ = std::fs::write(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/placement-diff.txt"), &text);
    report(&text);
    assert!(problems.is_empty(), "{summary}; {} problem(s):\n{}", problems.len(), problems.join("\n"));
}

//! `muster node-agent`: runs on a GPU node (the chart's DaemonSet) and publishes what only the
//! node knows: the static topology as an annotation on its own Node, and what changes (health,
//! assignments) in the node's NodeGPUReport (`gpu.muster.dev/v1alpha1`, named after the node
//! and owned by it), which only muster reads: a Node write goes to every Node watcher of the
//! cluster, and health is written at least every `--health-refresh`.
//!
//! - `gpu.muster.dev/topology` (Node annotation): the GPUs and their links, from NVML (the host
//!   driver's `libnvidia-ml.so.1` under `--driver-root`) or, without it, from nvidia-smi's text;
//! - `spec.assigned` (report; once the annotation `gpu.muster.dev/assigned`): per pod (`namespace/name`, as kubelet names it), the
//!   `nvidia.com/gpu` devices kubelet really gave it, from kubelet's PodResources API (muster
//!   maps the names to its pods and corrects its ledger and the pod's `gpu.muster.dev/indices`
//!   to them). The agent reads no pod of the API, so its ServiceAccount has no grant on pods;
//! - `spec.health` (report; once the annotation `gpu.muster.dev/health`): per GPU temperature,
//!   free memory and utilization, from NVML, so health rules work without a DCGM exporter and
//!   Prometheus.
//!
//! Each round builds the values (pure: `devices::nvidia_smi`, `devices::probe`,
//! `devices::report`) and writes what changed: the topology by a merge patch of the Node, the
//! report by server-side apply. A source that fails costs only its own value that round; the
//! others are still published. The first round removes the two old annotations from the Node
//! when an agent from before left them.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};

use super::run::{LogFormat, init_tracing};
use crate::agent::kubelet::{POD_RESOURCES_SOCKET, PodResourcesClient};
use crate::agent::nvml::{NvmlProbe, find_nvidia_smi};
use crate::crds::{
    GPU_ASSIGNED_ANNOTATION, GPU_HEALTH_ANNOTATION, GPU_RESOURCE, GPU_TOPOLOGY_ANNOTATION, NodeGPUReport,
};
use crate::devices::nvidia_smi::{build_annotation, parse_query, parse_topo};
use crate::devices::probe::{GpuProbe, Probe, ProbeError, node_metrics, topology_annotation};
use crate::devices::report::{AssignedAnnotation, HealthAnnotation, kubelet_indices};
use crate::devices::{GpuTopology, NodeMetrics, TopologyAnnotation};

/// Field manager of the agent's patches.
const FIELD_MANAGER: &str = "muster-node-agent";
/// How long one kubelet or API call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether to read the GPUs through NVML.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum NvmlMode {
    /// NVML when its library loads, else nvidia-smi.
    Auto,
    /// NVML only: a round fails without it.
    On,
    /// nvidia-smi only (no health published).
    Off,
}

/// Arguments of `muster node-agent`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print the topology annotation value instead of patching the node.
    #[arg(long)]
    print: bool,
    /// Node to annotate (in a DaemonSet, from the downward API).
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// Repeat every INTERVAL (`90`, `90s`, `5m`, `1h`); once when absent.
    #[arg(long, value_parser = parse_interval)]
    interval: Option<Duration>,
    /// Read `nvidia-smi topo -m` output from this file instead of asking the driver.
    #[arg(long)]
    topo_file: Option<PathBuf>,
    /// Read `nvidia-smi --query-gpu=index,uuid,memory.total --format=csv` output from this file.
    #[arg(long)]
    query_file: Option<PathBuf>,
    /// Replay NVML's answers recorded as JSON in this file (a `devices::probe::Probe`, read
    /// again every round) instead of asking the driver: for tests and bug reports.
    #[arg(long, conflicts_with_all = ["topo_file", "query_file"])]
    probe_file: Option<PathBuf>,
    /// The nvidia-smi binary to run (default: the one under --driver-root, else on $PATH).
    #[arg(long)]
    nvidia_smi: Option<PathBuf>,
    /// Where the host's NVIDIA driver is mounted (the chart mounts it at /driver-root); NVML
    /// and nvidia-smi are looked up under it.
    #[arg(long, env = "MUSTER_DRIVER_ROOT", default_value = "/")]
    driver_root: PathBuf,
    /// Whether to use NVML.
    #[arg(long, value_enum, default_value = "auto")]
    nvml: NvmlMode,
    /// kubelet's PodResources socket.
    #[arg(long, default_value = POD_RESOURCES_SOCKET)]
    pod_resources_socket: PathBuf,
    /// Do not read kubelet's PodResources (no `spec.assigned` in the node's NodeGPUReport).
    #[arg(long)]
    no_pod_resources: bool,
    /// Do not publish GPU health (no `spec.health` in the node's NodeGPUReport).
    #[arg(long)]
    no_health: bool,
    /// Write health again at least this often, changed or not (muster ignores samples older
    /// than 60 s).
    #[arg(long, value_parser = parse_interval, default_value = "30s")]
    health_refresh: Duration,
    /// Serve /healthz and /readyz here (off when absent).
    #[arg(long)]
    probe_bind_address: Option<SocketAddr>,
    /// Log level filter (tracing EnvFilter syntax).
    #[arg(long, env = "MUSTER_LOG", default_value = "info")]
    log_level: String,
    /// Log format.
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let (digits, unit) = s.find(|c: char| !c.is_ascii_digit()).map_or((s, ""), |i| s.split_at(i));
    let n: u64 = digits.parse().map_err(|_| format!("{s:?} is not a duration like 90s, 5m or 1h"))?;
    let secs = match unit {
        "" | "s" => Some(n),
        "m" => n.checked_mul(60),
        "h" => n.checked_mul(3600),
        _ => None,
    };
    match secs {
        Some(secs) if secs > 0 => Ok(Duration::from_secs(secs)),
        _ => Err(format!("{s:?} is not a positive duration like 90s, 5m or 1h")),
    }
}

/// Runs the subcommand; exit 1 when the annotations could not be built or written, 2 on bad usage.
pub fn run(args: Args) -> ExitCode {
    if !args.print && args.node_name.is_none() {
        eprintln!("error: --node-name (or $NODE_NAME) is required unless --print is given");
        return ExitCode::from(2);
    }
    super::block_on(run_async(args))
}

async fn run_async(args: Args) -> ExitCode {
    if args.print {
        let mut gpus = Gpus::new(&args);
        return match gpus.read(&args).await {
            Ok(read) => {
                println!("{}", read.topology);
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(1)
            }
        };
    }
    init_tracing(&args.log_level, args.log_format);
    let node = args.node_name.clone().unwrap_or_default();
    let client = match client().await {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "cannot start");
            return ExitCode::from(1);
        }
    };
    let probes = Probes::default();
    if let Some(addr) = args.probe_bind_address {
        let stale_after = args.interval.map_or(Duration::from_secs(60), |i| (i * 3).max(Duration::from_secs(30)));
        if let Err(e) = probes.serve(addr, stale_after).await {
            tracing::error!(error = format!("{e:#}"), %addr, "cannot serve probes");
            return ExitCode::from(1);
        }
    }
    let mut agent = Agent::new(&args, client, node);
    loop {
        let result = agent.round(&args).await;
        probes.record(result.is_ok());
        let Some(interval) = args.interval else {
            return match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = format!("{e:#}"), "round failed");
                    ExitCode::from(1)
                }
            };
        };
        if let Err(e) = result {
            tracing::warn!(error = format!("{e:#}"), retry_in_s = interval.as_secs(), "round failed");
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown() => return ExitCode::SUCCESS,
        }
    }
}

/// SIGTERM (a DaemonSet pod being stopped) or Ctrl-C.
async fn shutdown() {
    #[cfg(unix)]
    {
        if let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

async fn client() -> anyhow::Result<kube::Client> {
    // rustls needs a process-wide crypto provider; an error only means one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = kube::Config::infer().await.context("cannot reach the Kubernetes API")?;
    super::request_defaults::client(config, "node-agent", None).context("cannot reach the Kubernetes API")
}

/// What one read of the GPUs gives.
struct GpuRead {
    /// The topology annotation value.
    topology: String,
    /// Its model, to map kubelet's device IDs to indices.
    model: GpuTopology,
    /// Health samples, when the source measures them (NVML).
    metrics: Option<NodeMetrics>,
}

/// Where GPU facts come from: NVML once loaded, else nvidia-smi (or its captured output).
struct Gpus {
    nvml: Option<Box<dyn GpuProbe>>,
    /// Why NVML is not used (logged once).
    nvml_missing: Option<String>,
}

impl Gpus {
    fn new(args: &Args) -> Self {
        if let Some(path) = &args.probe_file {
            return Gpus { nvml: Some(Box::new(Recorded(path.clone()))), nvml_missing: None };
        }
        let files = args.topo_file.is_some() || args.query_file.is_some();
        if args.nvml == NvmlMode::Off || (files && args.nvml == NvmlMode::Auto) {
            return Gpus { nvml: None, nvml_missing: Some("NVML is off".into()) };
        }
        // The host's driver under --driver-root, else what the NVIDIA container toolkit
        // injected into the container's own root (NVIDIA_DRIVER_CAPABILITIES=utility).
        match NvmlProbe::load(&args.driver_root).or_else(|e| match e {
            ProbeError::Unavailable(_) if args.driver_root != Path::new("/") => {
                NvmlProbe::load(Path::new("/")).map_err(|_| e)
            }
            e => Err(e),
        }) {
            Ok(p) => {
                tracing::info!(library = %p.library().display(), "GPUs are read with NVML");
                Gpus { nvml: Some(Box::new(p)), nvml_missing: None }
            }
            Err(e) => Gpus { nvml: None, nvml_missing: Some(e.to_string()) },
        }
    }

    async fn read(&mut self, args: &Args) -> anyhow::Result<GpuRead> {
        if let Some(nvml) = &self.nvml {
            match nvml.probe() {
                Ok(probe) => return from_probe(&probe),
                Err(ProbeError::Unavailable(e)) if args.nvml == NvmlMode::Auto => {
                    tracing::warn!(error = %e, "NVML unavailable; using nvidia-smi");
                }
                Err(e) => bail!("NVML: {e}"),
            }
        } else if args.nvml == NvmlMode::On {
            bail!("NVML: {}", self.nvml_missing.as_deref().unwrap_or("not loaded"));
        }
        let annotation = from_nvidia_smi(args).await?;
        Ok(GpuRead { model: model_of(&annotation), topology: annotation.to_json(), metrics: None })
    }
}

/// NVML's answers recorded as JSON (a [`Probe`]), read again at every probe.
struct Recorded(PathBuf);

impl GpuProbe for Recorded {
    fn probe(&self) -> Result<Probe, ProbeError> {
        let failed = |e: String| ProbeError::Failed(format!("{}: {e}", self.0.display()));
        let text = std::fs::read_to_string(&self.0).map_err(|e| failed(e.to_string()))?;
        serde_json::from_str(&text).map_err(|e| failed(e.to_string()))
    }
}

fn from_probe(probe: &Probe) -> anyhow::Result<GpuRead> {
    let annotation = topology_annotation(probe).context("NVML's answers do not make a topology")?;
    let metrics = Some(node_metrics(probe, SystemTime::now()));
    Ok(GpuRead { model: model_of(&annotation), topology: annotation.to_json(), metrics })
}

/// The model muster will read from `annotation` (as many GPUs as it describes).
fn model_of(annotation: &TopologyAnnotation) -> GpuTopology {
    GpuTopology::from_node(Some(&annotation.to_json()), annotation.gpus.len() as u64).0
}

/// The topology annotation from nvidia-smi or the given files.
async fn from_nvidia_smi(args: &Args) -> anyhow::Result<TopologyAnnotation> {
    let (bin, libs) = match &args.nvidia_smi {
        Some(bin) => (bin.clone(), None),
        None => find_nvidia_smi(&args.driver_root)
            .or_else(|| find_nvidia_smi(Path::new("/")))
            .unwrap_or_else(|| (PathBuf::from("nvidia-smi"), None)),
    };
    let topo = match &args.topo_file {
        Some(path) => read(path).await?,
        None => nvidia_smi(&bin, libs.as_deref(), &["topo", "-m"]).await?,
    };
    let query = match &args.query_file {
        Some(path) => read(path).await?,
        None => {
            let query = ["--query-gpu=index,uuid,memory.total", "--format=csv"];
            nvidia_smi(&bin, libs.as_deref(), &query).await?
        }
    };
    Ok(build_annotation(&parse_topo(&topo)?, &parse_query(&query)?)?)
}

async fn read(path: &Path) -> anyhow::Result<String> {
    tokio::fs::read_to_string(path).await.with_context(|| format!("cannot read {}", path.display()))
}

async fn nvidia_smi(bin: &Path, libs: Option<&Path>, args: &[&str]) -> anyhow::Result<String> {
    let shown = format!("{} {}", bin.display(), args.join(" "));
    let mut command = tokio::process::Command::new(bin);
    command.args(args);
    if let Some(libs) = libs {
        command.env("LD_LIBRARY_PATH", libs);
    }
    let out = tokio::time::timeout(Duration::from_secs(30), command.output())
        .await
        .with_context(|| format!("{shown} did not finish within 30s"))?
        .with_context(|| format!("cannot run {shown}"))?;
    if !out.status.success() {
        bail!("{shown} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The agent between rounds: its sources, and what it last wrote.
struct Agent {
    node: String,
    nodes: Api<Node>,
    reports: Api<NodeGPUReport>,
    /// The Node's uid (the report's owner), read once.
    node_uid: Option<String>,
    gpus: Gpus,
    kubelet: Option<PodResourcesClient>,
    /// The topology annotation last written.
    topology: Option<String>,
    /// The report's spec last applied.
    report: Option<serde_json::Value>,
    /// The health last published (in the report), and when.
    health: Option<(HealthAnnotation, SystemTime)>,
    /// The assignments last read.
    assigned: Option<AssignedAnnotation>,
}

impl Agent {
    fn new(args: &Args, client: kube::Client, node: String) -> Self {
        let gpus = Gpus::new(args);
        if let Some(why) = &gpus.nvml_missing {
            tracing::info!(reason = %why, "GPUs are read with nvidia-smi; no health is published");
        }
        Agent {
            node,
            nodes: Api::all(client.clone()),
            reports: Api::all(client),
            node_uid: None,
            gpus,
            kubelet: None,
            topology: None,
            report: None,
            health: None,
            assigned: None,
        }
    }

    /// The Node's uid, read once; the first read also removes the annotations an agent from
    /// before wrote (`gpu.muster.dev/{health,assigned}`, now in the report), so an upgrade
    /// leaves no stale values on the Node.
    async fn node_uid(&mut self) -> anyhow::Result<String> {
        if let Some(uid) = &self.node_uid {
            return Ok(uid.clone());
        }
        let node = tokio::time::timeout(CALL_TIMEOUT, self.nodes.get(&self.node))
            .await
            .with_context(|| format!("reading node {} timed out", self.node))?
            .with_context(|| format!("cannot read node {}", self.node))?;
        let Some(uid) = node.metadata.uid.clone() else { bail!("node {} has no uid", self.node) };
        let annotations = node.metadata.annotations.unwrap_or_default();
        let stale: BTreeMap<&str, Option<String>> = [GPU_HEALTH_ANNOTATION, GPU_ASSIGNED_ANNOTATION]
            .into_iter()
            .filter(|k| annotations.contains_key(*k))
            .map(|k| (k, None))
            .collect();
        if !stale.is_empty() {
            self.patch_node(&stale).await?;
            tracing::info!(node = %self.node, annotations = ?stale.keys().collect::<Vec<_>>(), "old annotations removed (now in the NodeGPUReport)");
        }
        if let Some(topology) = annotations.get(GPU_TOPOLOGY_ANNOTATION) {
            self.topology = Some(topology.clone());
        }
        self.node_uid = Some(uid.clone());
        Ok(uid)
    }

    /// One round: read every source, write what changed. Fails when nothing could be read or
    /// the write failed; a source that failed alone is logged and skipped.
    async fn round(&mut self, args: &Args) -> anyhow::Result<()> {
        let uid = self.node_uid().await?;
        let mut failures = Vec::new();
        let gpus = match self.gpus.read(args).await {
            Ok(read) => Some(read),
            Err(e) => {
                failures.push(format!("topology: {e:#}"));
                None
            }
        };
        if let Some(read) = gpus.as_ref().filter(|r| self.topology.as_ref() != Some(&r.topology)) {
            let values = [(GPU_TOPOLOGY_ANNOTATION, Some(read.topology.clone()))].into();
            self.patch_node(&values).await?;
            tracing::info!(node = %self.node, "topology annotated");
            self.topology = Some(read.topology.clone());
        }
        if !args.no_pod_resources {
            match self.assigned(args, gpus.as_ref().map(|g| &g.model)).await {
                Ok(value) => self.assigned = Some(value),
                Err(e) => failures.push(format!("PodResources: {e:#}")),
            }
        }
        let now = SystemTime::now();
        let health = match gpus.as_ref().and_then(|g| g.metrics.as_ref()) {
            Some(metrics) if !args.no_health => {
                let annotation = HealthAnnotation::from_metrics(metrics);
                annotation.worth_publishing(self.health.as_ref(), now, args.health_refresh).then_some(annotation)
            }
            _ => None,
        };
        // The report holds the last health published unless this one is worth writing.
        let published = health.as_ref().or(self.health.as_ref().map(|(h, _)| h));
        let spec = report_spec(published, self.assigned.as_ref());
        if (published.is_some() || self.assigned.is_some()) && self.report.as_ref() != Some(&spec) {
            self.apply_report(&uid, &spec).await?;
            tracing::debug!(node = %self.node, health = health.is_some(), "GPU report written");
            self.report = Some(spec);
        }
        if let Some(h) = health {
            self.health = Some((h, now));
        }
        match (failures.is_empty(), gpus.is_some()) {
            (true, _) => Ok(()),
            (false, true) => {
                tracing::warn!(failures = ?failures, "some sources failed; the others were published");
                Ok(())
            }
            (false, false) => bail!("{}", failures.join("; ")),
        }
    }

    /// The `gpu.muster.dev/assigned` value: what kubelet says the pods here hold, keyed by
    /// `namespace/name` (muster joins them to its pods). A broken connection is dropped and made
    /// again next round.
    async fn assigned(&mut self, args: &Args, model: Option<&GpuTopology>) -> anyhow::Result<AssignedAnnotation> {
        if self.kubelet.is_none() {
            let mut client = PodResourcesClient::connect(&args.pod_resources_socket, CALL_TIMEOUT).await?;
            check_allocatable(&mut client, model).await;
            self.kubelet = Some(client);
        }
        let Some(client) = self.kubelet.as_mut() else { bail!("no PodResources connection") };
        let listed = match client.list().await {
            Ok(pods) => pods,
            Err(e) => {
                self.kubelet = None;
                return Err(e.into());
            }
        };
        Ok(AssignedAnnotation::from_pods(&listed, GPU_RESOURCE))
    }

    /// Server-side applies the node's report: all of `spec`, owned by the Node (garbage
    /// collection deletes it with the node).
    async fn apply_report(&self, uid: &str, spec: &serde_json::Value) -> anyhow::Result<()> {
        let body = report_object(&self.node, uid, spec);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        tokio::time::timeout(CALL_TIMEOUT, self.reports.patch(&self.node, &params, &Patch::Apply(&body)))
            .await
            .with_context(|| format!("writing the NodeGPUReport of {} timed out", self.node))?
            .with_context(|| format!("cannot write the NodeGPUReport of {}", self.node))?;
        Ok(())
    }

    async fn patch_node(&self, values: &BTreeMap<&str, Option<String>>) -> anyhow::Result<()> {
        let body = serde_json::json!({ "metadata": { "annotations": values } });
        let params = PatchParams { field_manager: Some(FIELD_MANAGER.to_string()), ..PatchParams::default() };
        tokio::time::timeout(CALL_TIMEOUT, self.nodes.patch(&self.node, &params, &Patch::Merge(&body)))
            .await
            .with_context(|| format!("annotating node {} timed out", self.node))?
            .with_context(|| format!("cannot annotate node {}", self.node))?;
        Ok(())
    }
}

/// The spec of a node's NodeGPUReport: the health and assignments as the annotations held
/// them, and their counts for `kubectl get`.
fn report_spec(health: Option<&HealthAnnotation>, assigned: Option<&AssignedAnnotation>) -> serde_json::Value {
    let mut spec = serde_json::Map::new();
    if let Some(h) = health {
        spec.insert("gpus".into(), h.gpus.len().into());
        spec.insert("health".into(), h.to_value());
    }
    if let Some(a) = assigned {
        spec.insert("pods".into(), a.pods.len().into());
        spec.insert("assigned".into(), a.to_value());
    }
    serde_json::Value::Object(spec)
}

/// The whole report as the agent applies it.
fn report_object(node: &str, uid: &str, spec: &serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "gpu.muster.dev/v1alpha1",
        "kind": "NodeGPUReport",
        "metadata": {
            "name": node,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}],
        },
        "spec": spec,
    })
}

/// Warns when the device plugin's device IDs are not GPUs of the topology model: then muster
/// cannot map what kubelet assigns to indices (and says so per pod).
async fn check_allocatable(client: &mut PodResourcesClient, model: Option<&GpuTopology>) {
    let Some(model) = model else { return };
    match client.allocatable().await {
        Ok(devices) => {
            let ids: Vec<String> =
                devices.into_iter().filter(|d| d.resource == GPU_RESOURCE).flat_map(|d| d.ids).collect();
            if let Err(e) = kubelet_indices(&ids, model) {
                tracing::warn!(error = %e, "kubelet's allocatable nvidia.com/gpu devices do not match the topology");
            }
        }
        Err(e) => tracing::debug!(error = %e, "GetAllocatableResources failed"),
    }
}

/// What /healthz and /readyz answer from.
#[derive(Clone, Default)]
struct Probes {
    state: Arc<Mutex<ProbeState>>,
}

#[derive(Default)]
struct ProbeState {
    /// When the last round ended, and when one last succeeded.
    last_round: Option<Instant>,
    last_ok: Option<Instant>,
}

impl Probes {
    fn record(&self, ok: bool) {
        let mut s = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        s.last_round = Some(now);
        if ok {
            s.last_ok = Some(now);
        }
    }

    /// (live, ready): live while rounds keep ending (or before the first one ends); ready once
    /// a round succeeded, and while one keeps succeeding within `stale_after`.
    fn status(&self, started: Instant, stale_after: Duration) -> (bool, bool) {
        let s = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let recent = |t: Instant| t.elapsed() <= stale_after;
        let live = s.last_round.map_or_else(|| recent(started), recent);
        (live, s.last_ok.is_some_and(recent))
    }

    async fn serve(&self, addr: SocketAddr, stale_after: Duration) -> anyhow::Result<()> {
        use axum::http::StatusCode;
        let started = Instant::now();
        let answer = |ok: bool| if ok { (StatusCode::OK, "ok") } else { (StatusCode::SERVICE_UNAVAILABLE, "not ok") };
        let (live, ready) = (self.clone(), self.clone());
        let app = axum::Router::new()
            .route("/healthz", axum::routing::get(move || async move { answer(live.status(started, stale_after).0) }))
            .route("/readyz", axum::routing::get(move || async move { answer(ready.status(started, stale_after).1) }));
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("cannot bind {addr}"))?;
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "probe server stopped");
            }
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nvidia-smi").join(name)
    }

    fn args(extra: &[&str]) -> Result<Args, clap::Error> {
        #[derive(Parser)]
        struct Wrapper {
            #[command(flatten)]
            args: Args,
        }
        Wrapper::try_parse_from(["node-agent"].iter().chain(extra)).map(|w| w.args)
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt.block_on(f),
            Err(e) => panic!("runtime: {e}"),
        }
    }

    #[test]
    fn intervals_take_seconds_minutes_and_hours() {
        assert_eq!(parse_interval("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_interval("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_interval("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_interval("1h"), Ok(Duration::from_secs(3600)));
        for bad in ["", "0", "m", "5d", "-1", "1.5m", "99999999999999999999h"] {
            assert!(parse_interval(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn files_produce_an_annotation_the_scheduler_accepts() {
        let a = args(&[
            "--print",
            "--topo-file",
            &fixture("dgx1-v100-topo.txt").to_string_lossy(),
            "--query-file",
            &fixture("dgx1-v100-query.csv").to_string_lossy(),
        ]);
        let a = a.unwrap_or_else(|e| panic!("{e}"));
        let read = block_on(Gpus::new(&a).read(&a)).unwrap_or_else(|e| panic!("{e:#}"));
        let (model, reason) = GpuTopology::from_node(Some(&read.topology), 8);
        assert_eq!(reason, None);
        assert!(model.is_known() && read.model.is_known());
        assert_eq!(read.metrics, None, "nvidia-smi's text gives no health");
    }

    #[test]
    fn a_recorded_probe_gives_topology_and_health() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("probe.json");
        let gpu = |index: u32, temperature: f64| {
            serde_json::json!({"index": index, "uuid": format!("GPU-{index}"), "numa": 0, "memoryTotalMib": 81920,
                "memoryFreeMib": 40960, "temperatureC": temperature, "utilization": 0.25})
        };
        let probe = serde_json::json!({"gpus": [gpu(0, 41.0), gpu(1, 88.0)], "links": [["X", "NV4"], ["NV4", "X"]]});
        std::fs::write(&path, probe.to_string()).unwrap_or_else(|e| panic!("{e}"));
        let a = args(&["--print", "--probe-file", &path.to_string_lossy()]).unwrap_or_else(|e| panic!("{e}"));
        let mut gpus = Gpus::new(&a);
        let read = block_on(gpus.read(&a)).unwrap_or_else(|e| panic!("{e:#}"));
        assert!(read.model.is_known() && read.model.len() == 2);
        let metrics = read.metrics.unwrap_or_else(|| panic!("a probe measures health"));
        let temperatures: Vec<f64> = metrics.gpus.values().map(|m| m.temperature_c).collect();
        assert_eq!(temperatures, [41.0, 88.0]);
        assert!(metrics.gpus.values().all(|m| (m.memory_free_fraction - 0.5).abs() < 1e-9));
        // A broken recording fails the read with the file named, never a panic.
        std::fs::write(&path, "{").unwrap_or_else(|e| panic!("{e}"));
        let err = block_on(gpus.read(&a)).err().map(|e| format!("{e:#}"));
        assert!(err.as_deref().is_some_and(|e| e.contains("probe.json")), "{err:?}");
    }

    #[test]
    fn a_missing_nvidia_smi_is_an_error_not_a_panic() {
        let a = args(&["--print", "--nvml", "off", "--nvidia-smi", "/nonexistent/nvidia-smi"])
            .unwrap_or_else(|e| panic!("{e}"));
        let err = block_on(Gpus::new(&a).read(&a)).err().map(|e| format!("{e:#}"));
        assert!(err.is_some_and(|e| e.contains("cannot run /nonexistent/nvidia-smi topo -m")));
    }

    #[test]
    fn nvml_on_without_the_library_fails_the_read() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let a = args(&["--print", "--nvml", "on", "--driver-root", &dir.path().to_string_lossy()])
            .unwrap_or_else(|e| panic!("{e}"));
        let err = block_on(Gpus::new(&a).read(&a)).err().map(|e| format!("{e:#}"));
        assert!(err.as_deref().is_some_and(|e| e.starts_with("NVML: ")), "{err:?}");
    }

    #[test]
    fn the_report_holds_the_annotations_shapes_owned_by_the_node() {
        let health = HealthAnnotation {
            version: 1,
            observed_at: "2026-01-01T00:00:00Z".into(),
            gpus: vec![crate::devices::report::HealthSample {
                index: 0,
                temperature_c: 40.0,
                memory_free_fraction: 0.5,
                utilization: 0.0,
            }],
        };
        let assigned = AssignedAnnotation::from_pods(&[], GPU_RESOURCE);
        let spec = report_spec(Some(&health), Some(&assigned));
        assert_eq!(spec["gpus"], 1);
        assert_eq!(spec["pods"], 0);
        let metrics = HealthAnnotation::parse_value(&spec["health"], "spec.health").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(metrics.gpus.len(), 1);
        assert_eq!(AssignedAnnotation::parse_value(&spec["assigned"], "spec.assigned"), Ok(assigned));
        assert_eq!(report_spec(None, None), serde_json::json!({}));
        let object = report_object("n1", "uid-1", &spec);
        let report: NodeGPUReport = serde_json::from_value(object).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(report.metadata.name.as_deref(), Some("n1"));
        let owner = &report.metadata.owner_references.unwrap_or_default()[0];
        assert_eq!((owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()), ("Node", "n1", "uid-1"));
    }

    #[test]
    fn patching_needs_a_node_name() {
        let a = args(&["--topo-file", "x"]).unwrap_or_else(|e| panic!("{e}"));
        if std::env::var_os("NODE_NAME").is_none() {
            assert_eq!(run(a), ExitCode::from(2));
        }
    }

    #[test]
    fn probes_are_live_until_rounds_stop_and_ready_after_a_success() {
        let probes = Probes::default();
        let started = Instant::now();
        let window = Duration::from_secs(60);
        assert_eq!(probes.status(started, window), (true, false));
        probes.record(false);
        assert_eq!(probes.status(started, window), (true, false));
        probes.record(true);
        assert_eq!(probes.status(started, window), (true, true));
        std::thread::sleep(Duration::from_millis(5));
        assert!(!probes.status(started, Duration::from_millis(1)).1, "a success older than the window");
    }
}

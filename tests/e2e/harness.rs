//! The e2e harness: one real control plane per test run, shared by every test.
//!
//! The first test that needs it starts the cluster with `hack/cluster-up.sh` into
//! `target/e2e-cluster-<pid>` (which installs `crds/`), and adds a pool of kwok GPU nodes. A watchdog
//! (`hack/cluster-watchdog.sh`, in its own process group) runs `hack/cluster-down.sh` as soon as
//! this test process is gone, whether it exited, a test panicked, or it was killed.
//! Each test takes its own namespace from [`namespace`], deleted when the guard drops.
//! muster itself is started on first use too ([`manager::muster`]), as admin or, with
//! `MUSTER_E2E_RBAC=chart`, as the Helm chart's ServiceAccount ([`rbac`]).
//! A test that needs muster configured otherwise runs [`extra::extra_muster`] in its place; one
//! that kills muster runs replicas of its own ([`replicas::MusterReplicas`]). GPU health comes
//! from a fake DCGM exporter and a real Prometheus ([`dcgm::gpu_metrics`]); DRA devices from a
//! fake NVIDIA driver's ResourceSlices ([`dra::DraSlices`]).
//! A test binary whose cluster needs more before it starts (tests/service: a network namespace
//! and kube-apiserver flags) gets it from [`cluster_with`].

// Spelled out: tests/chart includes this file by path, which would look for them elsewhere.
#[path = "harness/dcgm.rs"]
pub mod dcgm;
#[path = "harness/dra.rs"]
pub mod dra;
#[path = "harness/extra.rs"]
pub mod extra;
#[path = "harness/manager.rs"]
pub mod manager;
#[path = "harness/pools.rs"]
pub mod pools;
#[path = "harness/rbac.rs"]
pub mod rbac;
#[path = "harness/replicas.rs"]
pub mod replicas;

use std::future::Future;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use muster_dev::{FakeGpuNodes, add_nodes};

/// Prefix of the GPU node pool every test may use (untainted, 8 GPUs each, nvswitch).
pub const POOL_PREFIX: &str = "pool-gpu-";
/// Nodes in the pool.
pub const POOL_NODES: u32 = 4;

/// The running control plane.
#[derive(Debug)]
pub struct Cluster {
    /// Folder of the cluster (logs/, pids/, pki/, features.txt).
    pub dir: PathBuf,
    /// Admin kubeconfig (client cert in group system:masters).
    pub kubeconfig: PathBuf,
    /// Folder with kubectl and the control plane binaries.
    pub bin: PathBuf,
}

static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();

/// Runs once in the cluster's folder before hack/cluster-up.sh (after the watchdog started, so
/// whatever it makes is cleaned up with the cluster) and returns more environment for it.
pub type Prepare = fn(&Path) -> Result<Vec<(String, String)>, String>;

static PREPARE: OnceLock<Prepare> = OnceLock::new();

/// The shared cluster, started on first use. Panics (failing the calling test) when it cannot start.
pub fn cluster() -> &'static Cluster {
    match CLUSTER.get_or_init(start) {
        Ok(c) => c,
        Err(e) => panic!("e2e cluster unavailable: {e}"),
    }
}

/// Like [`cluster`], for a test binary whose cluster needs `prepare` (e.g. tests/service: a
/// network namespace and apiserver flags). Every test of that binary must get the cluster from
/// here first: a cluster already started by [`cluster`] is not prepared.
#[allow(dead_code)] // tests/e2e starts its cluster unprepared
pub fn cluster_with(prepare: Prepare) -> &'static Cluster {
    let _ = PREPARE.set(prepare);
    cluster()
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Folder with kubectl, helm and the control plane binaries (`MUSTER_K8S_BIN` or tools/k8s/bindir.sh).
pub fn k8s_bin() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("MUSTER_K8S_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let out = Command::new("bash")
        .arg(repo().join("tools/k8s/bindir.sh"))
        .output()
        .map_err(|e| format!("tools/k8s/bindir.sh: {e}"))?;
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// Runs a command (with `input` on stdin); its stdout on success, else the command, its status,
/// and what it printed (stdout, when any, then stderr). For the test binaries that drive helm
/// and scripts (tests/chart, tests/real).
#[allow(dead_code)] // tests/e2e and tests/service run their commands otherwise
pub fn run_command(cmd: &mut Command, input: Option<&str>) -> Result<String, String> {
    use std::io::Write;
    let shown = format!("{cmd:?}");
    let mut child = cmd
        .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{shown}: {e}"))?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin.write_all(text.as_bytes()).map_err(|e| format!("{shown}: stdin: {e}"))?;
    }
    let out = child.wait_with_output().map_err(|e| format!("{shown}: {e}"))?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).to_string());
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stdout = if stdout.trim().is_empty() { String::new() } else { format!("{}\n", stdout.trim()) };
    Err(format!("{shown}: {}\n{stdout}{}", out.status, String::from_utf8_lossy(&out.stderr).trim()))
}

fn start() -> Result<Cluster, String> {
    let began = Instant::now();
    let bin = k8s_bin()?;
    if !bin.join("kube-apiserver").exists() {
        return Err(format!("no control plane binaries in {}: run `make controlplane`", bin.display()));
    }
    let target = repo().join("target");
    remove_stale_clusters(&target);
    let dir = target.join(format!("e2e-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    // The watchdog goes first, so that even a half-started cluster is stopped.
    let watchdog_log = std::fs::File::create(dir.join("watchdog.log")).map_err(|e| e.to_string())?;
    Command::new("bash")
        .arg(repo().join("hack/cluster-watchdog.sh"))
        .arg(std::process::id().to_string())
        .env("MUSTER_CLUSTER_DIR", &dir)
        .stdin(Stdio::null())
        .stdout(watchdog_log.try_clone().map_err(|e| e.to_string())?)
        .stderr(watchdog_log)
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start hack/cluster-watchdog.sh: {e}"))?;

    let env = match PREPARE.get() {
        Some(prepare) => prepare(&dir)?,
        None => Vec::new(),
    };

    // cluster-up installs crds/ (server-side apply) before the garbage collector starts.
    let crds = repo().join("crds");
    let up = Command::new("bash")
        .arg(repo().join("hack/cluster-up.sh"))
        .envs(env)
        .env("MUSTER_CLUSTER_DIR", &dir)
        .env("MUSTER_CLUSTER_CRDS", &crds)
        .env("MUSTER_K8S_BIN", &bin)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run hack/cluster-up.sh: {e}"))?;
    let up_log = String::from_utf8_lossy(&up.stderr).to_string();
    let _ = std::fs::write(dir.join("cluster-up.log"), &up_log);
    if !up.status.success() {
        return Err(format!("hack/cluster-up.sh failed ({}):\n{up_log}", up.status));
    }
    let cluster = Cluster { kubeconfig: dir.join("kubeconfig"), dir, bin };

    cluster.kubectl(&["wait", "--for=condition=Established", "--timeout=60s", "-f", path_str(&crds)?])?;

    // kube's client lives on a runtime; this thread may already be inside a test's runtime.
    let kubeconfig = cluster.kubeconfig.clone();
    let pool = FakeGpuNodes { prefix: POOL_PREFIX.into(), count: POOL_NODES, ..FakeGpuNodes::default() };
    std::thread::spawn(move || -> Result<Vec<String>, String> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        rt.block_on(async {
            let client = muster_dev::client(Some(&kubeconfig)).await.map_err(|e| e.to_string())?;
            add_nodes(&client, &pool).await.map_err(|e| e.to_string())
        })
    })
    .join()
    .map_err(|_| "adding the node pool panicked".to_string())??;
    for i in 0..POOL_NODES {
        cluster.kubectl(&["wait", "--for=condition=Ready", "--timeout=60s", &format!("node/{POOL_PREFIX}{i}")])?;
    }
    eprintln!(
        "e2e: cluster up in {:.1}s at {} (KUBECONFIG={})",
        began.elapsed().as_secs_f64(),
        cluster.dir.display(),
        cluster.kubeconfig.display()
    );
    Ok(cluster)
}

fn path_str(p: &Path) -> Result<&str, String> {
    p.to_str().ok_or_else(|| format!("{} is not UTF-8", p.display()))
}

/// Stops and removes clusters of earlier runs whose test process is gone (keeps the latest logs
/// of a crashed run only until the next run).
fn remove_stale_clusters(target: &Path) {
    let Ok(entries) = std::fs::read_dir(target) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let Some(pid) = name.strip_prefix("e2e-cluster-") else {
            continue;
        };
        if pid == std::process::id().to_string() || Path::new("/proc").join(pid).exists() {
            continue;
        }
        let down = Command::new("bash")
            .arg(repo().join("hack/cluster-down.sh"))
            .env("MUSTER_CLUSTER_DIR", entry.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if matches!(down, Ok(s) if s.success()) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// What the API server answers a create of muster's kinds while its MutatingAdmissionPolicies
/// cannot type them yet (the first seconds after the CRDs appear; docs/src/operations/failure-modes.md).
#[allow(dead_code)] // tests/chart and tests/real wait on it; tests/e2e's readiness probe waits it out
pub const CRDS_NOT_TYPED: &str = "There can be a delay between when CustomResourceDefinitions are created";

impl Cluster {
    /// What records the scheduling API of new jobs here: the policy muster (or the chart)
    /// applies where the API server serves it, muster's webhook otherwise.
    pub fn api_recorder(&self) -> muster::webhook::config::ApiRecorder {
        use muster::webhook::config::{ApiRecorder, RECORD_API_POLICY};
        match self.kubectl(&["get", "mutatingadmissionpolicy", RECORD_API_POLICY]) {
            Ok(_) => ApiRecorder::Policy,
            Err(_) => ApiRecorder::Webhook,
        }
    }

    /// Runs the cached kubectl against this cluster; stdout on success, stderr on failure.
    pub fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        self.kubectl_stdin(args, None)
    }

    /// Like [`Cluster::kubectl`], feeding `input` on stdin (for `-f -`).
    pub fn kubectl_stdin(&self, args: &[&str], input: Option<&str>) -> Result<String, String> {
        use std::io::Write;
        let mut child = Command::new(self.bin.join("kubectl"))
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("kubectl: {e}"))?;
        if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
            stdin.write_all(text.as_bytes()).map_err(|e| format!("kubectl stdin: {e}"))?;
        }
        let out = child.wait_with_output().map_err(|e| format!("kubectl: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).to_string())
        } else {
            Err(format!("kubectl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
        }
    }
}

/// A kube client for the shared cluster (a new one per call: a client belongs to the runtime
/// it was made on, and every `#[tokio::test]` has its own).
/// Whether the control plane serves `resource` in `group_version` (an older Kubernetes lacks
/// DRA's `resource.k8s.io/v1` and the native `scheduling.k8s.io/v1beta1` kinds).
pub async fn served(group_version: &str, resource: &str) -> bool {
    let list = client().await.list_api_group_resources(group_version).await;
    list.is_ok_and(|l| l.resources.iter().any(|r| r.name == resource))
}

pub async fn client() -> kube::Client {
    let kubeconfig = &cluster().kubeconfig;
    muster_dev::client(Some(kubeconfig))
        .await
        .unwrap_or_else(|e| panic!("kube client from {}: {e}", kubeconfig.display()))
}

/// Runs kubectl against the shared cluster and returns its stdout; panics with stderr on failure.
pub fn kubectl(args: &[&str]) -> String {
    cluster().kubectl(args).unwrap_or_else(|e| panic!("{e}"))
}

/// Applies a YAML manifest (server-side, as the tests' field manager): kubectl's output, or
/// its error (with the API server's refusal).
pub fn try_kubectl_apply(namespace: &str, yaml: &str) -> Result<String, String> {
    cluster().kubectl_stdin(
        &["apply", "--server-side", "--field-manager=muster-e2e", "-n", namespace, "-f", "-"],
        Some(yaml),
    )
}

/// Applies a YAML manifest (server-side) and returns kubectl's output; panics on failure.
pub fn kubectl_apply(namespace: &str, yaml: &str) -> String {
    try_kubectl_apply(namespace, yaml).unwrap_or_else(|e| panic!("{e}"))
}

/// A namespace of one test, deleted (without waiting) when dropped, also when the test panics.
#[derive(Debug)]
pub struct TestNamespace {
    /// The namespace name.
    pub name: String,
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if let Some(Ok(c)) = CLUSTER.get() {
            let _ = c.kubectl(&["delete", "namespace", &self.name, "--wait=false", "--ignore-not-found"]);
        }
    }
}

/// Creates a fresh namespace `e2e-<prefix>-<n>` and waits for its default ServiceAccount (pods
/// are refused until the serviceaccount controller made it).
pub fn namespace(prefix: &str) -> TestNamespace {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let clean: String =
        prefix.to_ascii_lowercase().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).take(40).collect();
    let name = format!("e2e-{clean}-{n}");
    kubectl(&["create", "namespace", &name]);
    let guard = TestNamespace { name };
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster().kubectl(&["-n", &guard.name, "get", "serviceaccount", "default"]).is_err() {
        assert!(Instant::now() < deadline, "no default ServiceAccount in {} after 30s", guard.name);
        std::thread::sleep(Duration::from_millis(100));
    }
    guard
}

/// Polls `check` every 200 ms until it returns `Some`, and returns that; panics naming `what`
/// after `timeout`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let found = wait_for_opt(timeout, check).await;
    found.unwrap_or_else(|| panic!("timed out after {timeout:?} waiting for {what}"))
}

/// Like [`wait_for`], but `None` after `timeout` instead of a panic (for a test that must clean
/// up before it fails).
pub async fn wait_for_opt<T, F, Fut>(timeout: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Adds (or updates) kwok GPU nodes and waits until they are Ready. Give each test its own
/// `prefix` (and a `--taint` plus toleration, or a label and node selector, to keep other
/// tests' pods off them). Nodes live until the cluster stops.
pub async fn add_gpu_nodes(spec: &FakeGpuNodes) -> Vec<String> {
    let names = add_nodes(&client().await, spec).await.unwrap_or_else(|e| panic!("add nodes {spec:?}: {e}"));
    for name in &names {
        kubectl(&["wait", "--for=condition=Ready", "--timeout=60s", &format!("node/{name}")]);
    }
    names
}

/// The sum of the samples of metric `name` (in Prometheus/OpenMetrics text) whose labels
/// include every `(label, value)` of `labels`; 0 when there are none.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| {
            let (metric, rest) = series.split_once('{').unwrap_or((series, "}"));
            metric == name
                && labels.iter().all(|(k, v)| {
                    let pair = format!("{k}=\"{v}\"");
                    rest.starts_with(&pair) || rest.contains(&format!(",{pair}"))
                })
        })
        .filter_map(|(_, value)| value.parse::<f64>().ok())
        .sum()
}

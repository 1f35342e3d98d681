//! What the chart tests share: helm and the chart folder, rendering, releases that uninstall
//! themselves, a lock for tests that change cluster-wide objects, and muster running locally as
//! the chart's ServiceAccount (a TokenRequest token, exactly what its pod would get).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{cluster, k8s_bin, run_command};

/// Release name every cluster test installs (so the names match the defaults of `muster run`).
pub const RELEASE: &str = "muster";
/// The ServiceAccount the chart makes for release [`RELEASE`].
pub const SERVICE_ACCOUNT: &str = "muster";
/// The five CRDs muster serves.
pub const CRD_NAMES: [&str; 6] = [
    "musterjobs.batch.muster.dev",
    "musterjobsets.batch.muster.dev",
    "workloads.scheduling.muster.dev",
    "podgroups.scheduling.muster.dev",
    "compositepodgroups.scheduling.muster.dev",
    "nodegpureports.gpu.muster.dev",
];

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `charts/muster`.
pub fn chart_dir() -> PathBuf {
    repo().join("charts/muster")
}

/// Tests that install a release, delete CRDs or run muster take this lock: the webhook
/// configurations, cluster roles and CRDs are cluster-wide.
pub fn exclusive() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs helm without a cluster (lint, template, package).
pub fn helm(args: &[&str]) -> Result<String, String> {
    let bin = k8s_bin()?.join("helm");
    let mut cmd = Command::new(&bin);
    cmd.args(args)
        .env("HELM_CACHE_HOME", helm_home().join("cache"))
        .env("HELM_CONFIG_HOME", helm_home().join("config"));
    cmd.env("HELM_DATA_HOME", helm_home().join("data"));
    run_command(&mut cmd, None)
}

/// Runs helm against the chart tests' cluster.
pub fn helm_cluster(args: &[&str]) -> Result<String, String> {
    let mut all = vec!["--kubeconfig", path_str(&cluster().kubeconfig)];
    all.extend_from_slice(args);
    helm(&all)
}

fn helm_home() -> PathBuf {
    repo().join("target/chart-test-helm")
}

/// Like [`crate::harness::Cluster::kubectl`] with another kubeconfig.
pub fn kubectl_as(kubeconfig: &Path, args: &[&str]) -> Result<String, String> {
    let mut cmd = Command::new(cluster().bin.join("kubectl"));
    cmd.arg("--kubeconfig").arg(kubeconfig).args(args);
    run_command(&mut cmd, None)
}

/// Like [`kubectl_as`], with `input` on stdin.
pub fn kubectl_as_stdin(kubeconfig: &Path, args: &[&str], input: &str) -> Result<String, String> {
    let mut cmd = Command::new(cluster().bin.join("kubectl"));
    cmd.arg("--kubeconfig").arg(kubeconfig).args(args);
    run_command(&mut cmd, Some(input))
}

/// kubectl (admin) with `input` on stdin.
pub fn kubectl_stdin(args: &[&str], input: &str) -> Result<String, String> {
    cluster().kubectl_stdin(args, Some(input))
}

/// A path as &str (every path here is ours and UTF-8).
pub fn path_str(p: &Path) -> &str {
    p.to_str().unwrap_or_else(|| panic!("{} is not UTF-8", p.display()))
}

/// Parses a multi-document YAML stream into JSON values, skipping empty documents.
pub fn documents(yaml: &str) -> Vec<Value> {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(yaml).unwrap_or_else(|e| panic!("rendered YAML does not parse: {e}\n{yaml}"));
    docs.into_iter().filter(|v| !v.is_null()).collect()
}

/// `helm template` of the working-tree chart as release [`RELEASE`] in `namespace`, with
/// `extra` arguments (`-f file`, `--set k=v`).
pub fn render(namespace: &str, extra: &[&str]) -> Vec<Value> {
    let chart = chart_dir();
    let mut args = vec!["template", RELEASE, path_str(&chart), "--namespace", namespace];
    args.extend_from_slice(extra);
    documents(&helm(&args).unwrap_or_else(|e| panic!("{e}")))
}

/// The objects of `docs` of `kind`.
pub fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

/// The one object of `kind` in `docs`.
pub fn one<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    match of_kind(docs, kind).as_slice() {
        [one] => one,
        other => panic!("expected one {kind}, found {}", other.len()),
    }
}

/// The muster container's arguments in a rendered Deployment.
pub fn container_args(deployment: &Value) -> Vec<String> {
    deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap_or_else(|| panic!("no args in {deployment}"))
        .iter()
        .map(|a| a.as_str().unwrap_or_default().to_string())
        .collect()
}

/// A free port on 127.0.0.1 (free when asked; good enough for one test process).
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("binding 127.0.0.1:0: {e}"));
    listener.local_addr().unwrap_or_else(|e| panic!("{e}")).port()
}

/// Polls `check` every 250 ms until it returns `Some`; panics naming `what` (and showing
/// `context()`) after `timeout`.
pub fn eventually<T>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Option<T>,
    context: impl Fn() -> String,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}\n{}", context());
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A Helm release, uninstalled when dropped (also when the test panics).
#[derive(Debug)]
pub struct Release {
    /// Namespace of the release.
    pub namespace: String,
}

impl Release {
    /// `helm install` of `chart` as [`RELEASE`] into `namespace` (created), with `extra` arguments.
    pub fn install(chart: &Path, namespace: &str, extra: &[&str]) -> Release {
        let mut args = vec!["install", RELEASE, path_str(chart), "--namespace", namespace, "--create-namespace"];
        args.extend_from_slice(extra);
        helm_cluster(&args).unwrap_or_else(|e| panic!("{e}"));
        Release { namespace: namespace.to_string() }
    }

    /// `helm upgrade` to `chart` with `extra` arguments.
    pub fn upgrade(&self, chart: &Path, extra: &[&str]) {
        let mut args = vec!["upgrade", RELEASE, path_str(chart), "--namespace", &self.namespace];
        args.extend_from_slice(extra);
        helm_cluster(&args).unwrap_or_else(|e| panic!("{e}"));
    }

    /// The release's manifests as the cluster has them (`helm get manifest`).
    pub fn manifest(&self) -> Vec<Value> {
        documents(
            &helm_cluster(&["get", "manifest", RELEASE, "--namespace", &self.namespace])
                .unwrap_or_else(|e| panic!("{e}")),
        )
    }

    /// A kubeconfig authenticating as the release's ServiceAccount with a TokenRequest token.
    pub fn service_account_kubeconfig(&self) -> PathBuf {
        let token = cluster()
            .kubectl(&["create", "token", SERVICE_ACCOUNT, "-n", &self.namespace, "--duration=2h"])
            .unwrap_or_else(|e| panic!("{e}"));
        token_kubeconfig(&format!("{}-sa", self.namespace), SERVICE_ACCOUNT, &token)
    }
}

/// A kubeconfig `<name>.kubeconfig` in the cluster's folder that authenticates with `token`
/// (as `user`, a name for humans) against the tests' cluster.
pub fn token_kubeconfig(name: &str, user: &str, token: &str) -> PathBuf {
    let view = |path: &str| {
        cluster()
            .kubectl(&["config", "view", "--raw", "--minify", "-o", &format!("jsonpath={{{path}}}")])
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let server = view(".clusters[0].cluster.server");
    let ca = view(".clusters[0].cluster.certificate-authority-data");
    let kubeconfig = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "muster", "cluster": {"server": server, "certificate-authority-data": ca}}],
        "users": [{"name": user, "user": {"token": token.trim()}}],
        "contexts": [{"name": "sa", "context": {"cluster": "muster", "user": user}}],
        "current-context": "sa",
    });
    let path = cluster().dir.join(format!("{name}.kubeconfig"));
    std::fs::write(&path, kubeconfig.to_string()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    path
}

impl Drop for Release {
    fn drop(&mut self) {
        if let Err(e) = helm_cluster(&["uninstall", RELEASE, "--namespace", &self.namespace, "--wait", "--timeout=60s"])
        {
            eprintln!("uninstalling release {RELEASE} in {}: {e}", self.namespace);
        }
    }
}

/// `muster run` started on this machine with the arguments of the release's Deployment, as its
/// pod would run (ServiceAccount token, POD_NAME/POD_NAMESPACE), listening on 127.0.0.1.
/// Stopped with SIGTERM when dropped; a guard shell stops it when the test process is gone.
pub struct Muster {
    guard: Child,
    /// stdout and stderr of muster.
    pub log: PathBuf,
    /// Address of /metrics, /healthz, /readyz.
    pub metrics: String,
}

impl Muster {
    /// Starts muster with `deployment`'s arguments, binding the webhook server to
    /// `webhook_port` and with `overrides` (`--flag=value`) replacing or adding flags.
    pub fn start(
        deployment: &Value,
        kubeconfig: &Path,
        namespace: &str,
        webhook_port: u16,
        overrides: &[&str],
    ) -> Muster {
        let metrics = format!("127.0.0.1:{}", free_port());
        let mut args = container_args(deployment);
        let mut set = |flag: &str| {
            let name = flag.split('=').next().unwrap_or(flag);
            args.retain(|a| a.split('=').next() != Some(name));
            args.push(flag.to_string());
        };
        set(&format!("--metrics-bind-address={metrics}"));
        set(&format!("--webhook-bind-address=127.0.0.1:{webhook_port}"));
        for o in overrides {
            set(o);
        }
        args.push(format!("--kubeconfig={}", kubeconfig.display()));
        static STARTED: AtomicU32 = AtomicU32::new(0);
        let n = STARTED.fetch_add(1, Ordering::Relaxed);
        let log = cluster().dir.join("logs").join(format!("muster-{namespace}-{n}.log"));
        let file = std::fs::File::create(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        // The shell stops muster when this test process ends, however it ends.
        let script = r#"parent=$1; shift; "$@" & child=$!
            trap 'kill -TERM $child 2>/dev/null; wait $child; exit 0' TERM
            while kill -0 "$parent" 2>/dev/null && kill -0 $child 2>/dev/null; do sleep 0.5; done
            kill -TERM $child 2>/dev/null; wait $child"#;
        let guard = Command::new("bash")
            .arg("-c")
            .arg(script)
            .arg("muster-guard")
            .arg(std::process::id().to_string())
            .arg(env!("CARGO_BIN_EXE_muster"))
            .args(&args)
            .env("POD_NAME", format!("muster-{namespace}"))
            .env("POD_NAMESPACE", namespace)
            .env_remove("KUBECONFIG")
            .env_remove("MUSTER_LOG")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap_or_else(|e| panic!("{e}")))
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("starting muster: {e}"));
        let muster = Muster { guard, log, metrics };
        eventually(
            "muster's /readyz",
            Duration::from_secs(60),
            || http_get(&muster.metrics, "/readyz").filter(|(code, _)| *code == 200),
            || muster.log_text(),
        );
        // For a few seconds after muster's CRDs first appear (a test that removed them, a fresh
        // install), the API server's MutatingAdmissionPolicy cannot type MusterJobs yet (it polls
        // its OpenAPI every 5 s) and answers their creates 503; wait that out, as a user would
        // retry. A dry run answered anything else (admitted, or refused by the webhook) ends it.
        eventually(
            "the API server typing MusterJobs for muster's MutatingAdmissionPolicy",
            Duration::from_secs(60),
            || {
                let probe = r#"{"apiVersion": "batch.muster.dev/v1alpha1", "kind": "MusterJob",
                    "metadata": {"name": "muster-chart-probe", "namespace": "default"},
                    "spec": {"parallelism": 1, "completions": 1, "template": {"spec": {
                        "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}"#;
                match kubectl_stdin(&["create", "--dry-run=server", "-f", "-"], probe) {
                    Err(e) if e.contains(crate::harness::CRDS_NOT_TYPED) => None,
                    _ => Some(()),
                }
            },
            || muster.log_text(),
        );
        muster
    }

    /// What muster logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Log lines reporting a refused request (RBAC or otherwise 403).
    pub fn forbidden_lines(&self) -> Vec<String> {
        // A write into a namespace being deleted (another test's) is refused with 403 too, for
        // that reason, not by RBAC.
        self.log_text()
            .lines()
            .filter(|l| l.to_ascii_lowercase().contains("forbidden") && !l.contains("because it is being terminated"))
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Muster {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg("-TERM").arg(self.guard.id().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.guard.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.guard.kill();
        let _ = self.guard.wait();
    }
}

/// A plain HTTP/1.0 GET on 127.0.0.1: (status, body), `None` when nothing answers.
pub fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let code = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Some((code, body))
}

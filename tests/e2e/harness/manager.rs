//! muster itself, shared by the tests like the cluster: `muster run` from the binary cargo built,
//! started on first use against the shared cluster, its webhooks on 127.0.0.1 registered by
//! itself (`--webhook-manage-configurations=true`), its log in the cluster's `logs/muster.log`.
//!
//! A test that needs muster holds a [`Muster`] for its whole run. A test that stops muster or
//! takes its validating webhook away holds a [`MusterExclusive`] instead: it waits until no other
//! test holds muster, and the others wait until it is dropped. Whoever asks after a stop (or a
//! crash) gets a freshly started muster, so every test finds one running.
//!
//! `MUSTER_E2E_MUSTER_KUBECONFIG` replaces the admin kubeconfig muster itself runs with, e.g. by
//! one that impersonates the Helm chart's ServiceAccount to prove its RBAC; the tests keep using
//! the admin kubeconfig. `MUSTER_E2E_RBAC=chart` does the same with the chart's own objects
//! ([`super::rbac`]). `MUSTER_E2E_MUSTER_ARGS` appends arguments to `muster run`. The process is marked with `MUSTER_CLUSTER_DIR` in its environment, so
//! hack/cluster-down.sh (run by the watchdog when the test process ends) stops it too.

use std::fs::File;
use std::io::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use muster::crds::{ADMISSION_GATE, MusterJob, POD_GROUP_LABEL};
use muster::webhook::config::{MUTATING_NAME, VALIDATING_NAME};
use serde_json::json;
use tokio::sync::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::{client, cluster};

/// muster's own namespace (Lease, certificate Secret; never seen by its webhooks).
pub const NAMESPACE: &str = "muster-system";
/// Environment variable naming the kubeconfig muster runs with (default: the admin one).
pub const KUBECONFIG_ENV: &str = "MUSTER_E2E_MUSTER_KUBECONFIG";
/// Environment variable with more `muster run` arguments (whitespace separated), appended.
pub const ARGS_ENV: &str = "MUSTER_E2E_MUSTER_ARGS";
/// How long a start may take (a killed predecessor's Lease expires after 15 s).
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Where a running muster listens.
#[derive(Clone, Copy, Debug)]
pub struct Endpoints {
    /// `/metrics`, `/healthz`, `/readyz`.
    pub metrics: SocketAddr,
    /// The admission webhooks (HTTPS).
    pub webhook: SocketAddr,
}

impl Endpoints {
    /// The current `/metrics` text.
    pub async fn metrics(&self) -> String {
        let url = format!("http://{}/metrics", self.metrics);
        let response = reqwest::get(&url).await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
        response.text().await.unwrap_or_else(|e| panic!("GET {url}: {e}"))
    }
}

struct Running {
    child: Child,
    endpoints: Endpoints,
}

/// Tests holding muster share this; a test stopping it takes it exclusively.
static USERS: RwLock<()> = RwLock::const_new(());
static PROCESS: Mutex<Option<Running>> = Mutex::const_new(None);
static STARTS: AtomicU32 = AtomicU32::new(0);

/// A running muster, held for the duration of a test.
pub struct Muster {
    _shared: RwLockReadGuard<'static, ()>,
    /// Where it listens.
    pub endpoints: Endpoints,
}

impl Muster {
    /// The current `/metrics` text.
    pub async fn metrics(&self) -> String {
        self.endpoints.metrics().await
    }
}

/// Starts muster if it is not running and holds it (shared with other tests) until dropped.
pub async fn muster() -> Muster {
    let shared = USERS.read().await;
    let endpoints = ensure_running().await;
    Muster { _shared: shared, endpoints }
}

/// muster held by one test alone: it may stop and start it, or take its webhook away.
pub struct MusterExclusive {
    _alone: RwLockWriteGuard<'static, ()>,
}

/// Waits until no other test holds muster, then holds it alone (running) until dropped.
pub async fn muster_exclusive() -> MusterExclusive {
    let alone = USERS.write().await;
    ensure_running().await;
    MusterExclusive { _alone: alone }
}

impl MusterExclusive {
    /// Stops muster (SIGTERM, as a node drain would; SIGKILL after 15 s) and waits until it is gone.
    pub async fn stop(&self) {
        let mut process = PROCESS.lock().await;
        if let Some(mut running) = process.take() {
            terminate(&mut running.child).await;
        }
        let _ = std::fs::remove_file(pid_file());
    }

    /// Starts muster again (or returns the running one).
    pub async fn start(&self) -> Endpoints {
        ensure_running().await
    }

    /// Deletes the ValidatingWebhookConfiguration until [`WebhookAway::restore`] (or the drop
    /// of the returned guard) puts it back; the apiserver then admits muster's kinds unchecked.
    pub async fn without_validating_webhook(&self) -> WebhookAway {
        let api = Api::<ValidatingWebhookConfiguration>::all(client().await);
        let mut saved = api.get(VALIDATING_NAME).await.expect("muster's ValidatingWebhookConfiguration");
        saved.metadata = ObjectMeta { name: saved.metadata.name.clone(), ..Default::default() };
        let away = WebhookAway { saved, restored: false };
        away.delete().await;
        away
    }
}

/// The validating webhook taken away (see [`MusterExclusive::without_validating_webhook`]).
pub struct WebhookAway {
    saved: ValidatingWebhookConfiguration,
    restored: bool,
}

impl WebhookAway {
    async fn delete(&self) {
        let _ = cluster().kubectl(&["delete", "validatingwebhookconfiguration", VALIDATING_NAME, "--ignore-not-found"]);
        super::wait_for("the apiserver to stop calling muster's validating webhook", START_TIMEOUT, || async {
            webhook_only_invalid_job_is_refused().await.is_err().then_some(())
        })
        .await;
    }

    /// Runs a write that the webhook would refuse. muster re-registers its webhooks now and
    /// then (`--webhook-resync`); when that lands in between, the webhook is removed again and
    /// the write retried.
    pub async fn write(&self, args: &[&str], input: Option<&str>) -> String {
        for _ in 0..5 {
            match cluster().kubectl_stdin(args, input) {
                Ok(out) => return out,
                Err(e) if e.contains("admission webhook") => self.delete().await,
                Err(e) => panic!("{e}"),
            }
        }
        panic!("kubectl {}: muster's validating webhook kept coming back", args.join(" "));
    }

    /// Puts the configuration back and waits until the apiserver calls the webhook again.
    pub async fn restore(mut self) {
        self.put_back();
        super::wait_for("the apiserver to call muster's validating webhook again", START_TIMEOUT, || async {
            webhook_only_invalid_job_is_refused().await.ok()
        })
        .await;
        self.restored = true;
    }

    fn put_back(&self) {
        let mut body = serde_json::to_value(&self.saved).expect("serialize");
        body["apiVersion"] = json!("admissionregistration.k8s.io/v1");
        body["kind"] = json!("ValidatingWebhookConfiguration");
        match cluster().kubectl_stdin(&["create", "-f", "-"], Some(&body.to_string())) {
            Ok(_) => {}
            Err(e) if e.contains("AlreadyExists") => {}
            Err(e) => panic!("restoring {VALIDATING_NAME}: {e}"),
        }
    }
}

impl Drop for WebhookAway {
    fn drop(&mut self) {
        if !self.restored {
            self.put_back();
        }
    }
}

/// The path of muster's log.
pub fn log_path() -> PathBuf {
    cluster().dir.join("logs").join("muster.log")
}

fn pid_file() -> PathBuf {
    cluster().dir.join("pids").join("muster.pid")
}

async fn ensure_running() -> Endpoints {
    let mut process = PROCESS.lock().await;
    if let Some(running) = process.as_mut() {
        match running.child.try_wait() {
            Ok(None) => return running.endpoints,
            Ok(Some(status)) => eprintln!("e2e: muster exited ({status}); starting it again"),
            Err(e) => eprintln!("e2e: cannot tell whether muster runs ({e}); starting it again"),
        }
    }
    let mut last = String::new();
    // A free port can be taken between the probe and muster's bind; then try new ports.
    for _ in 0..3 {
        match start().await {
            Ok(running) => {
                let endpoints = running.endpoints;
                *process = Some(running);
                return endpoints;
            }
            Err(e) => last = e,
        }
    }
    panic!("muster did not start: {last}");
}

pub(super) fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local address").port()
}

/// `muster run` as every e2e instance runs it: leader election on `namespace` as `identity`,
/// the given endpoints, output to `log`; `registration` says how the webhooks are registered
/// (default: muster manages its configurations by URL; a `--webhook-url` there replaces
/// `endpoints.webhook` as the URL, for replicas behind a forwarder). Callers add their own
/// arguments.
pub fn muster_command(
    kubeconfig: &Path,
    namespace: &str,
    identity: &str,
    endpoints: &Endpoints,
    registration: Option<&Vec<String>>,
    log: File,
) -> Result<Command, String> {
    let stderr = log.try_clone().map_err(|e| e.to_string())?;
    let url_given = registration.is_some_and(|args| args.iter().any(|a| a.starts_with("--webhook-url")));
    let url = (!url_given).then(|| format!("--webhook-url=https://{}", endpoints.webhook));
    let mut command = Command::new(env!("CARGO_BIN_EXE_muster"));
    command
        .arg("run")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--namespace", namespace, "--leader-elect=true", "--identity", identity])
        .args(["--log-level", "info,muster=debug"])
        .arg(format!("--metrics-bind-address={}", endpoints.metrics))
        .arg(format!("--webhook-bind-address={}", endpoints.webhook))
        .args(url)
        .args(match registration {
            Some(args) => args.clone(),
            None => vec!["--webhook-manage-configurations=true".to_string()],
        })
        .env("MUSTER_CLUSTER_DIR", &cluster().dir)
        .env("NO_COLOR", "1")
        .env_remove("KUBECONFIG")
        .env_remove("MUSTER_LOG")
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(stderr);
    Ok(command)
}

async fn start() -> Result<Running, String> {
    let cluster = cluster();
    let began = Instant::now();
    match cluster.kubectl(&["create", "namespace", NAMESPACE]) {
        Ok(_) => {}
        Err(e) if e.contains("AlreadyExists") => {}
        Err(e) => return Err(e),
    }
    let n = STARTS.fetch_add(1, Ordering::Relaxed);
    let endpoints = Endpoints {
        metrics: SocketAddr::from(([127, 0, 0, 1], free_port())),
        webhook: SocketAddr::from(([127, 0, 0, 1], free_port())),
    };
    // Chart RBAC mode: the chart's objects call this instance; muster runs as its ServiceAccount.
    let chart = if super::rbac::enabled() {
        Some(super::rbac::prepare(cluster, NAMESPACE, &format!("https://{}", endpoints.webhook))?)
    } else {
        None
    };
    let kubeconfig = match &chart {
        Some(chart) => chart.kubeconfig.clone(),
        None => std::env::var_os(KUBECONFIG_ENV).map(PathBuf::from).unwrap_or_else(|| cluster.kubeconfig.clone()),
    };
    let identity = format!("muster-e2e-{}-{n}", std::process::id());
    let log_path = log_path();
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| format!("{}: {e}", log_path.display()))?;
    let _ = writeln!(log, "=== e2e: muster run #{n} ({identity}) with {}", kubeconfig.display());
    let mut child =
        muster_command(&kubeconfig, NAMESPACE, &identity, &endpoints, chart.as_ref().map(|c| &c.args), log)?
            .args(std::env::var(ARGS_ENV).unwrap_or_default().split_whitespace())
            .spawn()
            .map_err(|e| format!("cannot run muster: {e}"))?;
    let _ = std::fs::write(pid_file(), child.id().to_string());
    match wait_ready(&mut child, &endpoints, NAMESPACE, Some(&identity)).await {
        Ok(()) => {
            eprintln!(
                "e2e: muster #{n} ready in {:.1}s (metrics http://{}, webhook https://{}, log {})",
                began.elapsed().as_secs_f64(),
                endpoints.metrics,
                endpoints.webhook,
                log_path.display()
            );
            Ok(Running { child, endpoints })
        }
        Err(e) => {
            terminate(&mut child).await;
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            Err(format!("{e}; last lines of {}:\n{}", log_path.display(), tail.join("\n")))
        }
    }
}

pub(super) async fn terminate(child: &mut Child) {
    let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if !matches!(child.try_wait(), Ok(None)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Ready means: `/readyz` answers, this instance holds the Lease when `leader` names it (so the
/// reconcilers run; `None` for a standby replica), both webhook configurations point at
/// `endpoints.webhook` with a CA bundle, and the apiserver really calls both webhooks (a
/// labelled pod comes back gated, a job only the webhook refuses is refused).
pub(super) async fn wait_ready(
    child: &mut Child,
    endpoints: &Endpoints,
    namespace: &str,
    leader: Option<&str>,
) -> Result<(), String> {
    let deadline = Instant::now() + START_TIMEOUT;
    let client = client().await;
    let url = format!("https://{}", endpoints.webhook);
    let mut waiting_for = "muster to start";
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("muster exited ({status}) while waiting for {waiting_for}"));
        }
        if Instant::now() > deadline {
            return Err(format!("timed out after {START_TIMEOUT:?} waiting for {waiting_for}"));
        }
        match ready_step(&client, endpoints, namespace, leader, &url).await {
            Ok(()) => return Ok(()),
            Err(what) => waiting_for = what,
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn ready_step(
    client: &kube::Client,
    endpoints: &Endpoints,
    namespace: &str,
    leader: Option<&str>,
    url: &str,
) -> Result<(), &'static str> {
    let readyz = reqwest::get(format!("http://{}/readyz", endpoints.metrics)).await;
    if !readyz.is_ok_and(|r| r.status().is_success()) {
        return Err("/readyz");
    }
    if let Some(identity) = leader {
        let lease = Api::<Lease>::namespaced(client.clone(), namespace).get_opt(muster::controllers::LEASE_NAME).await;
        let holder = lease.ok().flatten().and_then(|l| l.spec?.holder_identity);
        if holder.as_deref() != Some(identity) {
            return Err("the leader Lease");
        }
    }
    let validating = Api::<ValidatingWebhookConfiguration>::all(client.clone()).get_opt(VALIDATING_NAME).await;
    let validating = validating.ok().flatten().and_then(|c| c.webhooks).unwrap_or_default();
    let mutating = Api::<MutatingWebhookConfiguration>::all(client.clone()).get_opt(MUTATING_NAME).await;
    let mutating = mutating.ok().flatten().and_then(|c| c.webhooks).unwrap_or_default();
    let configs: Vec<_> =
        validating.iter().map(|w| &w.client_config).chain(mutating.iter().map(|w| &w.client_config)).collect();
    let current = |c: &&k8s_openapi::api::admissionregistration::v1::WebhookClientConfig| {
        c.url.as_deref().is_some_and(|u| u.starts_with(url)) && c.ca_bundle.as_ref().is_some_and(|b| !b.0.is_empty())
    };
    // As many webhooks as muster registers (src/webhook/config.rs).
    let endpoint = muster::webhook::config::Endpoint::Url(url.to_string());
    let count = |w: Option<usize>| w.unwrap_or_default();
    let want_validating = count(
        muster::webhook::config::validating_configuration(&endpoint, None, namespace, None).webhooks.map(|w| w.len()),
    );
    let recorder = cluster().api_recorder();
    let want_mutating = count(
        muster::webhook::config::mutating_configuration(&endpoint, None, namespace, None, recorder)
            .webhooks
            .map(|w| w.len()),
    );
    if validating.len() != want_validating || mutating.len() != want_mutating || !configs.iter().all(current) {
        return Err("webhook configurations pointing at this instance with a caBundle");
    }
    if !labelled_pod_is_gated(client).await {
        return Err("the apiserver to call the mutating webhook");
    }
    if webhook_only_invalid_job_is_refused().await.is_err() {
        return Err("the apiserver to call the validating webhook");
    }
    Ok(())
}

async fn labelled_pod_is_gated(client: &kube::Client) -> bool {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "muster-e2e-probe", "labels": {POD_GROUP_LABEL: "probe"}},
        "spec": {"containers": [{"name": "main", "image": "registry.invalid/none"}]},
    }))
    .expect("probe pod");
    let dry = PostParams { dry_run: true, ..Default::default() };
    match Api::<Pod>::namespaced(client.clone(), "default").create(&dry, &pod).await {
        Ok(p) => p.spec.and_then(|s| s.scheduling_gates).unwrap_or_default().iter().any(|g| g.name == ADMISSION_GATE),
        Err(_) => false,
    }
}

/// A dry-run create of a MusterJob that passes the CRD schema but not muster's webhook
/// (restartPolicy Always): `Ok` when refused by the webhook, `Err` otherwise.
async fn webhook_only_invalid_job_is_refused() -> Result<(), String> {
    let job: MusterJob = serde_json::from_value(json!({
        "apiVersion": "batch.muster.dev/v1alpha1", "kind": "MusterJob",
        "metadata": {"name": "muster-e2e-probe"},
        "spec": {"template": {"spec": {"restartPolicy": "Always",
            "containers": [{"name": "main", "image": "registry.invalid/none"}]}}},
    }))
    .expect("probe job");
    let dry = PostParams { dry_run: true, ..Default::default() };
    match Api::<MusterJob>::namespaced(client().await, "default").create(&dry, &job).await {
        Err(kube::Error::Api(e)) if e.message.contains("restartPolicy") => Ok(()),
        Err(e) => Err(e.to_string()),
        Ok(_) => Err("admitted".into()),
    }
}

/// The process id of the shared muster, while it runs (from `pids/muster.pid`).
#[allow(dead_code)] // tests/chart and tests/service include the harness too
pub fn pid() -> Option<u32> {
    std::fs::read_to_string(pid_file()).ok()?.trim().parse().ok()
}

//! The self-managed webhook certificate with real `muster run` processes: a renewed certificate
//! is served without a restart and stays trusted by the same CA, and replicas sharing one Secret
//! agree on it without fighting.
//!
//! These instances stay out of the shared muster's way: each test gives them a namespace of its
//! own (Lease, Secret) and a ServiceAccount that may touch nothing else, so their attempts to
//! inject their CA into the shared webhook configurations are refused (`could not inject the CA
//! bundle` in their logs, by design), and a placeholder holds their Lease, so they never lead
//! and never reconcile.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use muster::webhook::certs::{CertBundle, from_secret};
use muster::webhook::config::VALIDATING_NAME;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};

use crate::harness::manager::{Endpoints, muster_command};
use crate::harness::rbac::service_account_kubeconfig;
use crate::harness::{TestNamespace, client, cluster, kubectl_apply, namespace, wait_for};

/// The certificate Secret of these instances (in their own namespace).
const SECRET: &str = "muster-e2e-webhook-tls";
/// Holds the instances' Lease so that none of them leads.
const PLACEHOLDER: &str = "e2e-certs-placeholder";
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A ServiceAccount with exactly what the certificate path and a follower need, in one namespace.
fn rbac(secret: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: ServiceAccount
metadata: {{name: muster}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: muster}}
rules:
  - {{apiGroups: [coordination.k8s.io], resources: [leases], verbs: [create]}}
  - {{apiGroups: [coordination.k8s.io], resources: [leases], resourceNames: [{lease}], verbs: [get, patch]}}
  - {{apiGroups: [""], resources: [secrets], verbs: [create]}}
  - {{apiGroups: [""], resources: [secrets], resourceNames: [{secret}], verbs: [get, update]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: muster}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: muster}}
subjects: [{{kind: ServiceAccount, name: muster}}]
"#,
        lease = muster::controllers::LEASE_NAME,
    )
}

/// A namespace with the ServiceAccount, its kubeconfig, and the Lease held by [`PLACEHOLDER`]
/// for an hour.
async fn isolated(prefix: &str) -> (TestNamespace, PathBuf) {
    let ns = namespace(prefix);
    kubectl_apply(&ns.name, &rbac(SECRET));
    let lease = Lease {
        metadata: ObjectMeta { name: Some(muster::controllers::LEASE_NAME.into()), ..Default::default() },
        spec: Some(LeaseSpec {
            holder_identity: Some(PLACEHOLDER.into()),
            lease_duration_seconds: Some(3600),
            renew_time: Some(MicroTime(Timestamp::now())),
            acquire_time: Some(MicroTime(Timestamp::now())),
            ..Default::default()
        }),
    };
    Api::<Lease>::namespaced(client().await, &ns.name)
        .create(&PostParams::default(), &lease)
        .await
        .unwrap_or_else(|e| panic!("placeholder Lease: {e}"));
    let kubeconfig = service_account_kubeconfig(cluster(), &ns.name, "muster").unwrap_or_else(|e| panic!("{e}"));
    (ns, kubeconfig)
}

fn free_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local address")
}

/// One `muster run` of these tests, stopped when dropped (and by hack/cluster-down.sh, through
/// `MUSTER_CLUSTER_DIR`, if this process dies first).
struct Instance {
    child: Child,
    webhook: SocketAddr,
    metrics: SocketAddr,
    log: PathBuf,
    namespace: String,
    kubeconfig: PathBuf,
    identity: String,
    extra: Vec<String>,
}

impl Instance {
    /// Starts `muster run` as `identity` (its log appended to
    /// `logs/muster-<namespace>-<identity>.log`); [`Instance::ready`] waits for it.
    fn start(namespace: &str, kubeconfig: &Path, identity: &str, extra: &[&str]) -> Instance {
        let (webhook, metrics) = (free_addr(), free_addr());
        let log = cluster().dir.join("logs").join(format!("muster-{namespace}-{identity}.log"));
        let child = spawn(namespace, kubeconfig, identity, extra, webhook, metrics, &log);
        Instance {
            child,
            webhook,
            metrics,
            log,
            namespace: namespace.into(),
            kubeconfig: kubeconfig.into(),
            identity: identity.into(),
            extra: extra.iter().map(|a| a.to_string()).collect(),
        }
    }

    /// Waits for `/readyz` (certificate loaded, webhook port bound). A port taken between the
    /// probe and muster's bind leaves it unready; then it is started again on new ports.
    async fn ready(&mut self) {
        let mut last = String::new();
        for _ in 0..3 {
            match self.wait_ready().await {
                Ok(()) => return,
                Err(e) => last = e,
            }
            stop(&mut self.child);
            (self.webhook, self.metrics) = (free_addr(), free_addr());
            let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
            self.child =
                spawn(&self.namespace, &self.kubeconfig, &self.identity, &extra, self.webhook, self.metrics, &self.log);
        }
        panic!("muster {} did not start: {last}\n{}", self.identity, self.log_text());
    }

    async fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("exited ({status})"));
            }
            let readyz = reqwest::get(format!("http://{}/readyz", self.metrics)).await;
            if readyz.is_ok_and(|r| r.status().is_success()) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("not ready after {START_TIMEOUT:?}"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The log of every start.
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The log of the running process.
    fn current_log(&self) -> String {
        let text = self.log_text();
        text.rfind("=== e2e: muster").map(|at| text[at..].to_string()).unwrap_or(text)
    }

    /// The certificate the webhook server presents, after a handshake that trusts only `ca_pem`.
    fn served(&self, ca_pem: &str) -> Result<CertificateDer<'static>, String> {
        served_certificate(self.webhook, ca_pem)
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

fn spawn(
    namespace: &str,
    kubeconfig: &Path,
    identity: &str,
    extra: &[&str],
    webhook: SocketAddr,
    metrics: SocketAddr,
    log: &Path,
) -> Child {
    use std::io::Write as _;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    let _ = writeln!(file, "=== e2e: muster {identity}: webhook {webhook}, metrics {metrics}");
    let endpoints = Endpoints { metrics, webhook };
    let registration = vec!["--webhook-manage-configurations=false".to_string(), format!("--webhook-secret={SECRET}")];
    muster_command(kubeconfig, namespace, identity, &endpoints, Some(&registration), file)
        .unwrap_or_else(|e| panic!("{e}"))
        .args(extra)
        .spawn()
        .unwrap_or_else(|e| panic!("starting muster: {e}"))
}

/// SIGTERM, SIGKILL after 15 s.
fn stop(child: &mut Child) {
    let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
    let deadline = Instant::now() + Duration::from_secs(15);
    while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A TLS handshake with `addr` (by IP, as the apiserver calls `https://127.0.0.1:<port>`),
/// trusting only the CAs in `ca_pem`; the leaf certificate it presented.
fn served_certificate(addr: SocketAddr, ca_pem: &str) -> Result<CertificateDer<'static>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(ca.map_err(|e| format!("CA PEM: {e}"))?).map_err(|e| format!("CA: {e}"))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut tls = rustls::ClientConnection::new(Arc::new(config), ServerName::IpAddress(addr.ip().into()))
        .map_err(|e| e.to_string())?;
    let mut socket = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(|e| format!("{addr}: {e}"))?;
    socket.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
    socket.set_write_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
    while tls.is_handshaking() {
        tls.complete_io(&mut socket).map_err(|e| format!("TLS handshake with {addr}: {e}"))?;
    }
    let leaf = tls.peer_certificates().and_then(|chain| chain.first()).ok_or("no certificate presented")?;
    Ok(leaf.clone().into_owned())
}

fn der(cert_pem: &str) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(cert_pem.as_bytes()).unwrap_or_else(|e| panic!("certificate PEM: {e}"))
}

/// The bundle in the instances' Secret and its resourceVersion; `None` while there is none.
async fn stored(secrets: &Api<Secret>) -> Option<(CertBundle, String)> {
    let secret = secrets.get_opt(SECRET).await.ok()??;
    let version = secret.metadata.resource_version.clone()?;
    Some((from_secret(&secret)?, version))
}

/// POSTs a review of a MusterJob that only muster's webhook refuses (restartPolicy Always) to
/// `/validate`, trusting only `ca_pem`; the response.
async fn validate(addr: SocketAddr, ca_pem: &str) -> Value {
    let ca = reqwest::Certificate::from_pem_bundle(ca_pem.as_bytes()).expect("CA PEM");
    let mut http = reqwest::Client::builder().tls_built_in_root_certs(false).timeout(Duration::from_secs(10));
    for c in ca {
        http = http.add_root_certificate(c);
    }
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "e2e-certs", "operation": "CREATE", "userInfo": {"username": "e2e"},
            "kind": {"group": "batch.muster.dev", "version": "v1alpha1", "kind": "MusterJob"},
            "resource": {"group": "batch.muster.dev", "version": "v1alpha1", "resource": "musterjobs"},
            "name": "probe", "namespace": "default",
            "object": {"apiVersion": "batch.muster.dev/v1alpha1", "kind": "MusterJob",
                "metadata": {"name": "probe", "namespace": "default"},
                "spec": {"template": {"spec": {"restartPolicy": "Always",
                    "containers": [{"name": "main", "image": "example/none"}]}}}},
        },
    });
    let url = format!("https://{addr}/validate");
    let http = http.build().expect("HTTP client");
    let response = http.post(&url).json(&review).send().await.unwrap_or_else(|e| panic!("POST {url}: {e}"));
    assert!(response.status().is_success(), "POST {url}: {}", response.status());
    response.json().await.unwrap_or_else(|e| panic!("POST {url}: {e}"))
}

#[tokio::test]
async fn a_renewed_certificate_is_served_without_a_restart() {
    let (ns, kubeconfig) = isolated("certs-rotation").await;
    let secrets = Api::<Secret>::namespaced(client().await, &ns.name);
    // Valid 20 s, renewed when 12 s are left: a new certificate about every 8 s.
    let lifetimes = ["--webhook-cert-validity=20", "--webhook-cert-rotate-before=12", "--webhook-resync=2"];
    let mut muster = Instance::start(&ns.name, &kubeconfig, "rotation", &lifetimes);
    muster.ready().await;
    let pid = muster.child.id();

    // What it serves is what the Secret holds (read both until they agree: a renewal may fall
    // in between).
    let first = wait_for("muster serving the Secret's certificate", Duration::from_secs(20), || async {
        let (bundle, _) = stored(&secrets).await?;
        (muster.served(&bundle.ca_pem).ok()? == der(&bundle.cert_pem)).then_some(bundle)
    })
    .await;
    let ca = first.ca_pem.clone();

    let renewed = wait_for("a renewed certificate in the Secret", Duration::from_secs(30), || async {
        stored(&secrets).await.map(|(b, _)| b).filter(|b| b.cert_pem != first.cert_pem)
    })
    .await;
    assert_eq!(renewed.ca_pem, first.ca_pem, "renewing the serving certificate keeps the CA");
    assert!(renewed.cert_not_after > first.cert_not_after, "{renewed:?}");

    // The same process serves the Secret's new certificate, still trusted by the first CA.
    wait_for("the renewed certificate served by the same process", Duration::from_secs(10), || async {
        let (current, _) = stored(&secrets).await?;
        let served = muster.served(&ca).ok()?;
        (served != der(&first.cert_pem) && served == der(&current.cert_pem)).then_some(())
    })
    .await;
    assert!(muster.running(), "muster (pid {pid}) exited:\n{}", muster.log_text());
    let log = muster.current_log();
    assert!(log.contains("serving a renewed webhook certificate"), "no reload in the log:\n{log}");
    assert_eq!(log.matches("serving admission webhooks").count(), 1, "the webhook server started again:\n{log}");
}

#[tokio::test]
async fn replicas_share_one_secret_without_fighting() {
    let (ns, kubeconfig) = isolated("certs-replicas").await;
    let secrets = Api::<Secret>::namespaced(client().await, &ns.name);
    // Both look at the Secret every second; at the default lifetimes nothing is due.
    let resync = ["--webhook-resync=1"];
    let mut a = Instance::start(&ns.name, &kubeconfig, "replica-a", &resync);
    let mut b = Instance::start(&ns.name, &kubeconfig, "replica-b", &resync);
    a.ready().await;
    b.ready().await;

    let (bundle, version) = stored(&secrets).await.expect("the certificate Secret once both are ready");
    let ca = bundle.ca_pem.clone();
    let want = der(&bundle.cert_pem);
    wait_for("both replicas serving the Secret's certificate", Duration::from_secs(10), || async {
        (a.served(&ca).ok()? == want && b.served(&ca).ok()? == want).then_some(())
    })
    .await;

    // Ten seconds, ten rounds each: nobody rewrites the Secret.
    let quiet_until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < quiet_until {
        let (now, now_version) = stored(&secrets).await.expect("the certificate Secret");
        assert_eq!(now_version, version, "the Secret was rewritten: {now:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(a.served(&ca), Ok(want.clone()));
    assert_eq!(b.served(&ca), Ok(want));
    let logs = format!("{}{}", a.log_text(), b.log_text());
    assert_eq!(logs.matches("created the webhook certificate").count(), 1, "{logs}");
    assert_eq!(logs.matches("renewed the webhook certificate").count(), 0, "{logs}");

    for replica in [&a, &b] {
        let review = validate(replica.webhook, &ca).await;
        assert_eq!(review["response"]["uid"], "e2e-certs", "{review}");
        assert_eq!(review["response"]["allowed"], false, "{review}");
        let message = review["response"]["status"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("restartPolicy"), "{review}");
    }

    // Their CA never reached the shared configurations (they may not patch them).
    let shared = Api::<ValidatingWebhookConfiguration>::all(client().await).get_opt(VALIDATING_NAME).await;
    let webhooks = shared.ok().flatten().and_then(|c| c.webhooks).unwrap_or_default();
    assert!(
        webhooks.iter().all(|w| w.client_config.ca_bundle.as_ref().is_none_or(|b| b.0 != ca.as_bytes())),
        "an isolated instance injected its CA into {VALIDATING_NAME}"
    );
    assert!(a.running() && b.running());
}

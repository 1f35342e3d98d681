//! Replicas of one muster deployment, for tests that kill them (tests/e2e/chaos.rs): `muster run`
//! processes sharing a namespace of their own (one Lease, one webhook Secret), started, killed
//! with SIGKILL and replaced at will, while the shared muster is stopped ([`MusterExclusive`]).
//!
//! In a cluster the apiserver reaches whichever replica is up through the webhook Service. Here
//! a TCP forwarder on 127.0.0.1 plays that Service: every replica registers the webhook
//! configurations with the forwarder's URL (`--webhook-url`) and serves on a port of its own;
//! the forwarder passes each connection to a live replica, skipping ports that refuse. TLS goes
//! through untouched (the certificate names 127.0.0.1, the same for every replica).
//!
//! Each identity logs to `logs/muster-replica-<identity>.log` in the cluster's folder (a restart
//! under the same identity appends). When dropped, every replica is stopped and the namespace
//! deleted; the next test asking for muster gets the shared one started afresh.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;

use super::manager::{Endpoints, MusterExclusive, free_port, muster_command, muster_exclusive, wait_ready};
use super::{client, cluster};

static SETS: AtomicU32 = AtomicU32::new(0);

/// What [`MusterReplicas::start`] waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Ready, serving the webhooks, and holding the Lease.
    Leader,
    /// Ready and serving the webhooks (a standby, or whoever wins the Lease).
    Serving,
    /// Nothing: the process was started (a crash may come before it is ready).
    Started,
}

/// One running replica.
struct Replica {
    child: Child,
    endpoints: Endpoints,
}

/// The replicas of one muster deployment.
pub struct MusterReplicas {
    _alone: MusterExclusive,
    /// The deployment's namespace (Lease, webhook Secret).
    pub namespace: String,
    args: Vec<String>,
    proxy: WebhookProxy,
    replicas: BTreeMap<String, Replica>,
}

impl MusterReplicas {
    /// Stops the shared muster and prepares a deployment of `muster run <args>` replicas (none
    /// running yet) in a namespace of its own.
    pub async fn new(args: &[&str]) -> Self {
        let alone = muster_exclusive().await;
        alone.stop().await;
        let namespace = format!("muster-replicas-{}", SETS.fetch_add(1, Ordering::Relaxed));
        cluster().kubectl(&["create", "namespace", &namespace]).unwrap_or_else(|e| panic!("{e}"));
        Self {
            _alone: alone,
            namespace,
            args: args.iter().map(|a| a.to_string()).collect(),
            proxy: WebhookProxy::start(),
            replicas: BTreeMap::new(),
        }
    }

    /// Where an identity logs.
    pub fn log_of(identity: &str) -> PathBuf {
        cluster().dir.join("logs").join(format!("muster-replica-{identity}.log"))
    }

    /// Starts a replica as `identity` (which must not be running) and waits for `wait`.
    pub async fn start(&mut self, identity: &str, wait: Wait) -> Result<(), String> {
        assert!(!self.replicas.contains_key(identity), "replica {identity} is running already");
        let began = Instant::now();
        let mut last = String::new();
        // A free port can be taken between the probe and muster's bind; then try new ports.
        for _ in 0..3 {
            let endpoints = Endpoints {
                metrics: SocketAddr::from(([127, 0, 0, 1], free_port())),
                webhook: SocketAddr::from(([127, 0, 0, 1], free_port())),
            };
            let log_path = Self::log_of(identity);
            let mut log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log_path)
                .map_err(|e| format!("{}: {e}", log_path.display()))?;
            let _ =
                writeln!(log, "=== e2e: replica {identity} of {} starts: run {}", self.namespace, self.args.join(" "));
            let registration = vec![
                "--webhook-manage-configurations=true".to_string(),
                format!("--webhook-url=https://{}", self.proxy.addr),
            ];
            let mut child =
                muster_command(&cluster().kubeconfig, &self.namespace, identity, &endpoints, Some(&registration), log)?
                    .args(&self.args)
                    .spawn()
                    .map_err(|e| format!("cannot run muster: {e}"))?;
            self.proxy.set_backends(self.backends_with(endpoints.webhook));
            if wait == Wait::Started {
                self.replicas.insert(identity.to_string(), Replica { child, endpoints });
                return Ok(());
            }
            // The readiness checks look for the forwarder's URL in the configurations.
            let seen = Endpoints { metrics: endpoints.metrics, webhook: self.proxy.addr };
            let leader = (wait == Wait::Leader).then_some(identity);
            match wait_ready(&mut child, &seen, &self.namespace, leader).await {
                Ok(()) => {
                    eprintln!(
                        "e2e: replica {identity} ready ({wait:?}) in {:.1}s (log {})",
                        began.elapsed().as_secs_f64(),
                        log_path.display()
                    );
                    self.replicas.insert(identity.to_string(), Replica { child, endpoints });
                    return Ok(());
                }
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    self.proxy.set_backends(self.backends_with(None));
                    last = format!("{e} (log {})", log_path.display());
                }
            }
        }
        Err(format!("replica {identity} did not start: {last}"))
    }

    fn backends_with(&self, extra: impl Into<Option<SocketAddr>>) -> Vec<SocketAddr> {
        self.replicas.values().map(|r| r.endpoints.webhook).chain(extra.into()).collect()
    }

    /// Kills replica `identity` with SIGKILL and waits until it is gone; false when it was not
    /// running (or had exited already).
    pub fn kill(&mut self, identity: &str) -> bool {
        let Some(mut replica) = self.replicas.remove(identity) else { return false };
        let running = matches!(replica.child.try_wait(), Ok(None));
        let _ = replica.child.kill();
        let _ = replica.child.wait();
        let _ = writeln_log(identity, "=== e2e: replica killed (SIGKILL)");
        self.proxy.set_backends(self.backends_with(None));
        running
    }

    /// The identities of the replicas started and not killed, with any that exited by
    /// themselves (and how) named in the second list.
    pub fn running(&mut self) -> (Vec<String>, Vec<String>) {
        let mut alive = Vec::new();
        let mut exited = Vec::new();
        for (identity, replica) in &mut self.replicas {
            match replica.child.try_wait() {
                Ok(None) => alive.push(identity.clone()),
                Ok(Some(status)) => exited.push(format!("{identity} ({status})")),
                Err(e) => exited.push(format!("{identity} ({e})")),
            }
        }
        (alive, exited)
    }

    /// The holder of the Lease, if it is one of the running replicas.
    pub async fn leader(&mut self) -> Option<String> {
        let lease = Api::<Lease>::namespaced(client().await, &self.namespace)
            .get_opt(muster::controllers::LEASE_NAME)
            .await
            .ok()
            .flatten()?;
        let holder = lease.spec?.holder_identity?;
        let (alive, _) = self.running();
        alive.contains(&holder).then_some(holder)
    }

    /// Waits until a running replica holds the Lease and returns it.
    pub async fn wait_leader(&mut self, timeout: Duration) -> Result<String, String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(leader) = self.leader().await {
                return Ok(leader);
            }
            if Instant::now() > deadline {
                let (alive, exited) = self.running();
                return Err(format!(
                    "no running replica holds the Lease after {timeout:?} (running {alive:?}, exited {exited:?})"
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The `/metrics` text of replica `identity` (None when it does not answer).
    pub async fn metrics_of(&self, identity: &str) -> Option<String> {
        let replica = self.replicas.get(identity)?;
        let url = format!("http://{}/metrics", replica.endpoints.metrics);
        reqwest::get(&url).await.ok()?.text().await.ok()
    }
}

fn writeln_log(identity: &str, line: &str) -> std::io::Result<()> {
    let mut log = std::fs::OpenOptions::new().append(true).open(MusterReplicas::log_of(identity))?;
    writeln!(log, "{line}")
}

impl Drop for MusterReplicas {
    fn drop(&mut self) {
        for (_, mut replica) in std::mem::take(&mut self.replicas) {
            let _ = Command::new("kill").arg("-TERM").arg(replica.child.id().to_string()).status();
            let deadline = Instant::now() + Duration::from_secs(15);
            while matches!(replica.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = replica.child.kill();
            let _ = replica.child.wait();
        }
        let _ = cluster().kubectl(&["delete", "namespace", &self.namespace, "--wait=false", "--ignore-not-found"]);
    }
}

/// The webhook "Service": forwards each TCP connection to a live backend, round robin.
struct WebhookProxy {
    addr: SocketAddr,
    backends: Arc<Mutex<Vec<SocketAddr>>>,
    stop: Arc<AtomicBool>,
}

impl WebhookProxy {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the webhook forwarder");
        let addr = listener.local_addr().expect("forwarder address");
        let backends: Arc<Mutex<Vec<SocketAddr>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (list, stopped) = (backends.clone(), stop.clone());
        std::thread::spawn(move || {
            let next = AtomicUsize::new(0);
            for inbound in listener.incoming() {
                if stopped.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(inbound) = inbound else { continue };
                let targets = list.lock().map(|l| l.clone()).unwrap_or_default();
                let first = next.fetch_add(1, Ordering::Relaxed);
                std::thread::spawn(move || forward(inbound, &targets, first));
            }
        });
        Self { addr, backends, stop }
    }

    fn set_backends(&self, targets: Vec<SocketAddr>) {
        if let Ok(mut list) = self.backends.lock() {
            *list = targets;
        }
    }
}

impl Drop for WebhookProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accepting thread so that it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
    }
}

/// Copies both ways between `inbound` and the first backend (from `first`, round robin) that
/// accepts; drops the connection when none does, as a Service without ready endpoints would.
fn forward(inbound: TcpStream, targets: &[SocketAddr], first: usize) {
    for i in 0..targets.len() {
        let target = targets[(first + i) % targets.len()];
        let Ok(outbound) = TcpStream::connect_timeout(&target, Duration::from_secs(1)) else { continue };
        let (Ok(mut in_read), Ok(mut out_read)) = (inbound.try_clone(), outbound.try_clone()) else { return };
        let (mut in_write, mut out_write) = (inbound, outbound);
        let upstream = std::thread::spawn(move || {
            let _ = std::io::copy(&mut in_read, &mut out_write);
            let _ = out_write.shutdown(std::net::Shutdown::Write);
        });
        let _ = std::io::copy(&mut out_read, &mut in_write);
        let _ = in_write.shutdown(std::net::Shutdown::Write);
        let _ = upstream.join();
        return;
    }
}

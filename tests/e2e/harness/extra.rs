//! A differently configured muster for the few tests that need one (`--prometheus-url`, a short
//! `--bind-timeout`, the crash hook `MUSTER_FAULT_EXIT_AFTER_POD_PATCHES`).
//!
//! Two musters holding different Leases would both admit every pod, so an extra instance runs
//! only while the shared one is stopped: [`extra_muster`] takes muster exclusively
//! ([`MusterExclusive`]), stops the shared instance and starts its own. It has its own namespace
//! (Lease, webhook Secret), ports and log (`logs/muster-extra-<n>.log`), and it registers the
//! webhook configurations for itself, since they fail closed and someone has to answer them.
//! When dropped it is stopped and its namespace deleted; the next test asking for muster gets the
//! shared one started afresh, which takes the webhook configurations back.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::cluster;
use super::manager::{Endpoints, MusterExclusive, free_port, muster_command, muster_exclusive, terminate, wait_ready};

static STARTS: AtomicU32 = AtomicU32::new(0);

/// An extra muster, running alone.
pub struct ExtraMuster {
    _alone: MusterExclusive,
    child: Option<Child>,
    /// Where it listens.
    pub endpoints: Endpoints,
    /// Its own namespace (Lease, webhook Secret).
    pub namespace: String,
    /// Its log.
    pub log: PathBuf,
    namespaces: Vec<String>,
}

/// Stops the shared muster and starts `muster run <args>` with `env` in its place.
pub async fn extra_muster(args: &[&str], env: &[(&str, &str)]) -> ExtraMuster {
    let alone = muster_exclusive().await;
    alone.stop().await;
    let mut extra = ExtraMuster {
        _alone: alone,
        child: None,
        endpoints: Endpoints {
            metrics: SocketAddr::from(([127, 0, 0, 1], 0)),
            webhook: SocketAddr::from(([127, 0, 0, 1], 0)),
        },
        namespace: String::new(),
        log: PathBuf::new(),
        namespaces: Vec::new(),
    };
    extra.start(args, env).await;
    extra
}

impl ExtraMuster {
    /// Starts it again (after it exited, or stops it first) with new arguments, in a new
    /// namespace so that it need not wait for the old Lease to expire.
    pub async fn start(&mut self, args: &[&str], env: &[(&str, &str)]) {
        if let Some(mut child) = self.child.take() {
            terminate(&mut child).await;
        }
        let mut last = String::new();
        // A free port can be taken between the probe and muster's bind; then try new ports.
        for _ in 0..3 {
            match self.try_start(args, env).await {
                Ok(()) => return,
                Err(e) => last = e,
            }
        }
        panic!("extra muster did not start: {last}");
    }

    async fn try_start(&mut self, args: &[&str], env: &[(&str, &str)]) -> Result<(), String> {
        let began = Instant::now();
        let cluster = cluster();
        let n = STARTS.fetch_add(1, Ordering::Relaxed);
        let namespace = format!("muster-extra-{n}");
        cluster.kubectl(&["create", "namespace", &namespace])?;
        self.namespaces.push(namespace.clone());
        let endpoints = Endpoints {
            metrics: SocketAddr::from(([127, 0, 0, 1], free_port())),
            webhook: SocketAddr::from(([127, 0, 0, 1], free_port())),
        };
        // Chart RBAC mode: like the shared muster, as the chart's ServiceAccount (installed in
        // this namespace, calling this instance).
        let chart = if super::rbac::enabled() {
            Some(super::rbac::prepare(cluster, &namespace, &format!("https://{}", endpoints.webhook))?)
        } else {
            None
        };
        let kubeconfig = chart.as_ref().map_or_else(|| cluster.kubeconfig.clone(), |c| c.kubeconfig.clone());
        let identity = format!("muster-extra-{}-{n}", std::process::id());
        let log = cluster.dir.join("logs").join(format!("muster-extra-{n}.log"));
        let mut file = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let _ = writeln!(
            file,
            "=== e2e: extra muster #{n}: run {} (env {env:?}) with {}",
            args.join(" "),
            kubeconfig.display()
        );
        let mut child =
            muster_command(&kubeconfig, &namespace, &identity, &endpoints, chart.as_ref().map(|c| &c.args), file)?
                .args(args)
                .envs(env.iter().copied())
                .spawn()
                .map_err(|e| format!("cannot run muster: {e}"))?;
        if let Err(e) = wait_ready(&mut child, &endpoints, &namespace, Some(&identity)).await {
            terminate(&mut child).await;
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(20).collect::<Vec<_>>().into_iter().rev().collect();
            return Err(format!("{e}; last lines of {}:\n{}", log.display(), tail.join("\n")));
        }
        eprintln!("e2e: extra muster #{n} ready in {:.1}s (log {})", began.elapsed().as_secs_f64(), log.display());
        self.child = Some(child);
        self.endpoints = endpoints;
        self.namespace = namespace;
        self.log = log;
        Ok(())
    }

    /// The current `/metrics` text.
    pub async fn metrics(&self) -> String {
        self.endpoints.metrics().await
    }

    /// Waits until the process exits by itself (the crash hook) and returns how it ended.
    pub async fn exited(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            let child = self.child.as_mut().expect("the extra muster was started");
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the extra muster did not exit within {timeout:?} (log {})",
                self.log.display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for ExtraMuster {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
            let deadline = Instant::now() + Duration::from_secs(15);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        for ns in &self.namespaces {
            let _ = cluster().kubectl(&["delete", "namespace", ns, "--wait=false", "--ignore-not-found"]);
        }
    }
}

//! The test host of these tests: a network namespace with 198.51.100.2, joined by a veth pair to
//! 198.51.100.1 on this machine (hack/testhost.sh). Made before the cluster starts, in its folder
//! (so hack/cluster-down.sh, run by the harness's watchdog when this process ends however it
//! ends, removes it), and the cluster's kube-apiserver listens on 198.51.100.1 with
//! `--enable-aggregator-routing=true`: it then sends a webhook Service's requests to the
//! Service's EndpointSlices instead of its ClusterIP, which nothing here would route. muster runs
//! inside the namespace ([`GuestMuster`]), reaching the apiserver on 198.51.100.1.
//!
//! Needs root and iproute2. Without them the cluster does not start and every test fails with
//! hack/testhost.sh's reason; nothing is skipped.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::{Cluster, cluster_with};

/// kube-apiserver flags of this cluster (hack/cluster-up.sh `MUSTER_APISERVER_EXTRA_ARGS`).
pub const APISERVER_ARGS: &str = "--enable-aggregator-routing=true";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The test host, as hack/testhost.sh recorded it in the cluster's `testhost.env`.
#[derive(Clone, Debug)]
pub struct TestHost {
    /// The network namespace.
    pub netns: String,
    /// This machine's side of the veth pair (kube-apiserver listens here).
    pub host_ip: IpAddr,
    /// The address inside the namespace.
    pub guest_ip: IpAddr,
}

impl TestHost {
    fn read(dir: &Path) -> Result<TestHost, String> {
        let path = dir.join("testhost.env");
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let value = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
                .map(str::to_string)
                .ok_or_else(|| format!("{key} missing in {}", path.display()))
        };
        let ip = |key: &str| value(key)?.parse::<IpAddr>().map_err(|e| format!("{key}: {e}"));
        Ok(TestHost {
            netns: value("TESTHOST_NETNS")?,
            host_ip: ip("TESTHOST_HOST_IP")?,
            guest_ip: ip("TESTHOST_GUEST_IP")?,
        })
    }

    /// `guest_ip:port`.
    pub fn guest(&self, port: u16) -> SocketAddr {
        SocketAddr::new(self.guest_ip, port)
    }
}

/// The harness's [`crate::harness::Prepare`]: makes the test host, then the apiserver settings.
fn prepare(dir: &Path) -> Result<Vec<(String, String)>, String> {
    let out = Command::new("bash")
        .arg(repo().join("hack/testhost.sh"))
        .arg("up")
        .arg(dir)
        .arg(std::process::id().to_string())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run hack/testhost.sh: {e}"))?;
    let log = String::from_utf8_lossy(&out.stderr).to_string();
    let _ = std::fs::write(dir.join("testhost-up.log"), &log);
    if !out.status.success() {
        return Err(format!(
            "cannot make the test host these tests need (hack/testhost.sh up: root and iproute2 required), {}:\n{log}",
            out.status
        ));
    }
    let host = TestHost::read(dir)?;
    Ok(vec![
        ("MUSTER_APISERVER_ADDRESS".into(), host.host_ip.to_string()),
        ("MUSTER_APISERVER_EXTRA_ARGS".into(), APISERVER_ARGS.into()),
    ])
}

/// The cluster of these tests (started on first use, with the test host) and the test host.
pub fn cluster() -> (&'static Cluster, TestHost) {
    let cluster = cluster_with(prepare);
    let host = TestHost::read(&cluster.dir).unwrap_or_else(|e| {
        panic!("the cluster was started without its test host (call testhost::cluster first): {e}")
    });
    (cluster, host)
}

/// `muster <args>` run inside the test host's namespace (`ip netns exec`, which execs muster in
/// place: the child's pid is muster's). One at a time. Stopped when dropped; if this process
/// dies first, hack/cluster-down.sh stops it before the control plane (its pid is in
/// `pids/muster.pid`, and it is marked with `MUSTER_CLUSTER_DIR`), and hack/testhost.sh stops
/// whatever is left in the namespace.
pub struct GuestMuster {
    child: Child,
    pid_file: PathBuf,
    /// Its log (stdout and stderr).
    pub log: PathBuf,
    /// Where `/metrics` and `/readyz` answer.
    pub metrics: SocketAddr,
}

impl GuestMuster {
    /// Starts it; `name` names the log (`logs/muster-<name>.log`).
    pub fn start(
        cluster: &Cluster,
        host: &TestHost,
        name: &str,
        args: &[String],
        env: &[(&str, &str)],
        metrics: SocketAddr,
    ) -> GuestMuster {
        use std::io::Write as _;
        let log = cluster.dir.join("logs").join(format!("muster-{name}.log"));
        let mut file = std::fs::File::create(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        let _ = writeln!(file, "=== e2e: ip netns exec {} muster {}", host.netns, args.join(" "));
        let child = Command::new("ip")
            .args(["netns", "exec", &host.netns])
            .arg(env!("CARGO_BIN_EXE_muster"))
            .args(args)
            .envs(env.iter().copied())
            .env("MUSTER_CLUSTER_DIR", &cluster.dir)
            .env("NO_COLOR", "1")
            .env_remove("KUBECONFIG")
            .env_remove("MUSTER_LOG")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap_or_else(|e| panic!("{e}")))
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("ip netns exec {} muster: {e}", host.netns));
        let pid_file = cluster.dir.join("pids").join("muster.pid");
        let _ = std::fs::write(&pid_file, child.id().to_string());
        GuestMuster { child, pid_file, log, metrics }
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Its log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `n` lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for GuestMuster {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.pid_file);
    }
}

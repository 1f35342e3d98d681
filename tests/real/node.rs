//! The lane's cluster and real node: the control plane listens on the node's address
//! (hack/real-node.sh address), the images are built by hack/image.sh (the release recipe) and
//! imported into the node's containerd, and the test device plugin (`muster dev device-plugin`
//! from muster's own image) runs as a DaemonSet pod on the real node, as NVIDIA's plugin does.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{Cluster, cluster_with};

/// The real node's name (hack/real-node.sh's default).
pub const NODE: &str = "muster-real-0";
/// The label real-node.sh gives it; the lane's pods select it.
pub const NODE_LABEL: (&str, &str) = ("muster.dev/real-node", "true");
/// Where the chart is installed.
pub const NAMESPACE: &str = "muster-system";
/// The recorded NVML probe the device plugin and the node agent share: a DGX-1 (V100, hybrid
/// cube-mesh NVLink), from tests/fixtures/nvidia-smi.
pub const PROBE: &str = "tests/real/probe-dgx1-v100.json";
/// GPUs in [`PROBE`].
pub const GPUS: u32 = 8;
/// The image tags the lane builds.
pub const MUSTER_TAG: &str = "e2e-real-1";
/// The tag of the rebuilt image `helm upgrade` moves to.
pub const MUSTER_TAG_REBUILT: &str = "e2e-real-2";
/// The busybox image of the job pods.
pub const BUSYBOX: &str = "localhost/busybox:muster";

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The lane's output folder (report, image archives, values).
pub fn out_dir() -> PathBuf {
    repo().join("target/e2e-real")
}

pub use crate::harness::run_command as run;

/// Polls `check` every 500 ms until it gives `Ok(Some(_))`; an `Err` stops at once. After
/// `timeout`, the error names `what` and the last state `check` described.
pub fn wait<T>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Result<Result<T, String>, String>,
) -> Result<T, String> {
    let deadline = Instant::now() + timeout;
    loop {
        let last = match check()? {
            Ok(v) => return Ok(v),
            Err(state) => state,
        };
        if Instant::now() >= deadline {
            return Err(format!("timed out after {timeout:?} waiting for {what}; last: {last}"));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The lane: its cluster, the node and where things are.
pub struct Lane {
    pub cluster: &'static Cluster,
    /// containerd's socket on the real node.
    pub containerd: PathBuf,
    /// The runtime binaries (ctr).
    pub runtime_bin: PathBuf,
    /// What hack/image.sh printed for each image (size, time).
    pub image_lines: Vec<String>,
}

impl Lane {
    /// kubectl (admin) with JSON output parsed.
    pub fn json(&self, args: &[&str]) -> Result<Value, String> {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["-o", "json"]);
        let text = self.cluster.kubectl(&all)?;
        serde_json::from_str(&text).map_err(|e| format!("kubectl {}: {e}", args.join(" ")))
    }

    pub fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        self.cluster.kubectl(args)
    }

    pub fn apply(&self, yaml: &str) -> Result<String, String> {
        self.cluster
            .kubectl_stdin(&["apply", "--server-side", "--field-manager=muster-e2e-real", "-f", "-"], Some(yaml))
    }

    /// helm against the lane's cluster.
    pub fn helm(&self, args: &[&str]) -> Result<String, String> {
        let home = out_dir().join("helm");
        run(
            Command::new(self.cluster.bin.join("helm"))
                .arg("--kubeconfig")
                .arg(&self.cluster.kubeconfig)
                .args(args)
                .env("HELM_CACHE_HOME", home.join("cache"))
                .env("HELM_CONFIG_HOME", home.join("config"))
                .env("HELM_DATA_HOME", home.join("data")),
            None,
        )
    }

    /// ctr on the real node's containerd, in the CRI's namespace.
    pub fn ctr(&self, args: &[&str]) -> Result<String, String> {
        run(
            Command::new(self.runtime_bin.join("ctr"))
                .arg("--address")
                .arg(&self.containerd)
                .args(["-n", "k8s.io"])
                .args(args),
            None,
        )
    }

    /// Builds one image with hack/image.sh into the lane's folder (`epoch`: its
    /// SOURCE_DATE_EPOCH, the files' mtime: another one rebuilds the same files into another
    /// image).
    pub fn build_image(what: &str, extra: &[&str], epoch: u64) -> Result<(PathBuf, String), String> {
        let out = out_dir().join("images").join(format!("{what}-{epoch}.tar"));
        let began = Instant::now();
        let mut cmd = Command::new("bash");
        cmd.arg(repo().join("hack/image.sh")).arg(what).arg("--out").arg(&out).args(extra);
        cmd.env("SOURCE_DATE_EPOCH", epoch.to_string());
        let printed = run(&mut cmd, None)?;
        let last = printed.lines().rfind(|l| !l.trim().is_empty()).unwrap_or_default().to_string();
        Ok((out, format!("{what}: {last} (lane saw {:.1}s)", began.elapsed().as_secs_f64())))
    }
}

/// The release binary the image is built from (`make e2e-real` builds it).
pub fn muster_binary() -> PathBuf {
    std::env::var_os("MUSTER_REAL_BINARY").map(PathBuf::from).unwrap_or_else(|| repo().join("target/release/muster"))
}

fn node_env(dir: &Path, key: &str) -> Result<String, String> {
    let path = dir.join("node/node.env");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .map(str::to_string)
        .ok_or_else(|| format!("{key} missing in {}", path.display()))
}

/// The cluster (its kube-apiserver on the node's address, endpoints for the `kubernetes`
/// Service, webhooks routed to endpoints), the images, the real node Ready with them, and the
/// device plugin's GPUs allocatable on it.
pub fn setup() -> Result<Lane, String> {
    std::fs::create_dir_all(out_dir().join("images")).map_err(|e| e.to_string())?;
    let cluster = cluster_with(|_dir| {
        let address = run(Command::new("bash").arg(repo().join("hack/real-node.sh")).arg("address"), None)?;
        Ok(vec![
            ("MUSTER_APISERVER_ADDRESS".into(), address.trim().to_string()),
            // The `kubernetes` Service gets the apiserver as its endpoint (kube-proxy routes the
            // in-cluster clients' 10.96.0.1 there), webhook calls go to the webhook Service's
            // endpoints (the pods' addresses on the bridge), and logs come from kubelet at the
            // node's address (its name resolves nowhere).
            (
                "MUSTER_APISERVER_EXTRA_ARGS".into(),
                "--endpoint-reconciler-type=lease --enable-aggregator-routing=true --kubelet-preferred-address-types=InternalIP".into(),
            ),
            // Endpoints of Services with pods behind them (the webhook's, for the apiserver and
            // kube-proxy): the short controller list of the kwok lanes has no such controller.
            ("MUSTER_EXTRA_CONTROLLERS".into(), "endpoints-controller,endpointslice-controller".into()),
        ])
    });

    let binary = muster_binary();
    if !binary.exists() {
        return Err(format!("{} missing: `cargo build --release --bin muster` (make e2e-real does)", binary.display()));
    }
    let mut images = Vec::new();
    let mut image_lines = Vec::new();
    let muster_tag = format!("localhost/muster:{MUSTER_TAG}");
    for (what, extra) in [
        ("pause", vec![]),
        ("busybox", vec![]),
        ("muster", vec!["--binary", binary.to_str().ok_or("binary path is not UTF-8")?, "--tag", &muster_tag]),
    ] {
        let (path, line) = Lane::build_image(what, &extra, 0)?;
        images.push(path);
        image_lines.push(line);
    }

    let list: Vec<String> = images.iter().map(|p| p.display().to_string()).collect();
    run(
        Command::new("bash")
            .arg(repo().join("hack/real-node.sh"))
            .arg("up")
            .env("MUSTER_CLUSTER_DIR", &cluster.dir)
            .env("MUSTER_K8S_BIN", &cluster.bin)
            .env("MUSTER_NODE_IMAGES", list.join(" ")),
        None,
    )?;
    let runtime_bin = PathBuf::from(
        run(Command::new("bash").arg(repo().join("tools/k8s/bindir.sh")).arg("node"), None)?.trim().to_string(),
    );
    let lane = Lane {
        cluster,
        containerd: PathBuf::from(node_env(&cluster.dir, "CONTAINERD_SOCKET")?),
        runtime_bin,
        image_lines,
    };
    // The GPU node label the chart's node agent selects (as NVIDIA's GPU operator sets it).
    lane.kubectl(&["label", "node", NODE, "nvidia.com/gpu.present=true", "--overwrite"])?;
    lane.kubectl(&["create", "namespace", NAMESPACE])?;
    device_plugin(&lane)?;
    Ok(lane)
}

/// The probe as a ConfigMap in `namespace` (key probe.json).
pub fn probe_config_map(lane: &Lane, namespace: &str) -> Result<(), String> {
    let probe = repo().join(PROBE);
    lane.kubectl(&[
        "-n",
        namespace,
        "create",
        "configmap",
        "muster-probe",
        &format!("--from-file=probe.json={}", probe.display()),
    ])
    .map(drop)
}

/// `muster dev device-plugin` as a DaemonSet pod on the real node (root, kubelet's
/// device-plugins folder), then waits for kubelet to make its GPUs allocatable.
fn device_plugin(lane: &Lane) -> Result<(), String> {
    probe_config_map(lane, "kube-system")?;
    let (key, value) = NODE_LABEL;
    lane.apply(&format!(
        r#"
apiVersion: apps/v1
kind: DaemonSet
metadata: {{name: muster-test-device-plugin, namespace: kube-system}}
spec:
  selector: {{matchLabels: {{app: muster-test-device-plugin}}}}
  template:
    metadata: {{labels: {{app: muster-test-device-plugin}}}}
    spec:
      nodeSelector: {{"{key}": "{value}"}}
      priorityClassName: system-node-critical
      containers:
        - name: plugin
          image: localhost/muster:{MUSTER_TAG}
          imagePullPolicy: Never
          args: [dev, device-plugin, --probe-file=/probe/probe.json]
          securityContext: {{runAsUser: 0, runAsGroup: 0}}
          volumeMounts:
            - {{name: device-plugins, mountPath: /var/lib/kubelet/device-plugins}}
            - {{name: probe, mountPath: /probe, readOnly: true}}
      volumes:
        - {{name: device-plugins, hostPath: {{path: /var/lib/kubelet/device-plugins, type: Directory}}}}
        - {{name: probe, configMap: {{name: muster-probe}}}}
"#
    ))?;
    wait("kubelet to list the device plugin's GPUs as allocatable", Duration::from_secs(120), || {
        let node = lane.json(&["get", "node", NODE])?;
        let allocatable = node["status"]["allocatable"]["nvidia.com/gpu"].as_str().unwrap_or("0").to_string();
        Ok(if allocatable == GPUS.to_string() {
            Ok(())
        } else {
            Err(format!("allocatable nvidia.com/gpu={allocatable}"))
        })
    })
}

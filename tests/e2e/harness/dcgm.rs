//! GPU health as production gets it: `muster dev fake-dcgm-exporter` serves DCGM series, a real
//! Prometheus (hack/prometheus.sh, the Debian package's binary) scrapes it every second, and a
//! muster started with `--prometheus-url` queries that Prometheus. Both are started once per run,
//! on first use, inside the cluster folder: hack/cluster-down.sh (the watchdog) stops them.
//! Tests set values for their own nodes only, so they do not disturb each other.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;

use super::{cluster, repo, wait_for};

/// The exporter and the Prometheus scraping it.
#[derive(Debug)]
pub struct GpuMetrics {
    /// Base URL of the fake exporter.
    pub exporter: String,
    /// Base URL of Prometheus (what `--prometheus-url` takes).
    pub prometheus: String,
}

static METRICS: OnceLock<Result<GpuMetrics, String>> = OnceLock::new();

/// The shared exporter and Prometheus, started on first use. Panics (failing the calling test)
/// when either cannot start, e.g. when the prometheus package is not installed.
pub fn gpu_metrics() -> &'static GpuMetrics {
    match METRICS.get_or_init(start) {
        Ok(m) => m,
        Err(e) => panic!("GPU metrics pipeline unavailable: {e}"),
    }
}

fn start() -> Result<GpuMetrics, String> {
    let cluster = cluster();
    let log = cluster.dir.join("logs").join("fake-dcgm-exporter.log");
    let log = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    // No --node: each test adds its own GPUs with PUT.
    let mut exporter = Command::new(env!("CARGO_BIN_EXE_muster"))
        .args(["dev", "fake-dcgm-exporter", "--listen", "127.0.0.1:0"])
        .env("MUSTER_CLUSTER_DIR", &cluster.dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("cannot run muster dev fake-dcgm-exporter: {e}"))?;
    let stdout = exporter.stdout.take().ok_or("no stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).map_err(|e| e.to_string())?;
    let exporter_url = line
        .trim()
        .strip_prefix("listening on ")
        .ok_or_else(|| format!("fake-dcgm-exporter said {line:?}, not where it listens"))?
        .to_string();
    let target = exporter_url.trim_start_matches("http://").to_string();
    let out = Command::new("bash")
        .arg(repo().join("hack/prometheus.sh"))
        .arg("start")
        .arg(cluster.dir.join("prometheus"))
        .arg(&target)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run hack/prometheus.sh: {e}"))?;
    if !out.status.success() {
        return Err(format!("hack/prometheus.sh start failed:\n{}", String::from_utf8_lossy(&out.stderr)));
    }
    let prometheus = String::from_utf8_lossy(&out.stdout).trim().to_string();
    eprintln!("e2e: fake DCGM exporter at {exporter_url}, Prometheus at {prometheus}");
    Ok(GpuMetrics { exporter: exporter_url, prometheus })
}

impl GpuMetrics {
    /// Sets values of GPU `index` of `node` (`{"temperature": 90}`, `{"fbFree": 1000, ...}`).
    pub async fn set(&self, node: &str, index: u32, values: Value) {
        let url = format!("{}/gpus/{node}/{index}", self.exporter);
        let response = reqwest::Client::new().put(&url).json(&values).send().await;
        match response {
            Ok(r) if r.status().is_success() => {}
            Ok(r) => panic!("PUT {url}: {}", r.status()),
            Err(e) => panic!("PUT {url}: {e}"),
        }
    }

    /// The instant vector of a PromQL query, as (labels, value) pairs.
    pub async fn query(&self, promql: &str) -> Vec<(Value, f64)> {
        let url = format!("{}/api/v1/query", self.prometheus);
        let body: Value = reqwest::Client::new()
            .get(&url)
            .query(&[("query", promql)])
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {url}: {e}"))
            .json()
            .await
            .unwrap_or_else(|e| panic!("GET {url}: {e}"));
        let result = body["data"]["result"].as_array().cloned().unwrap_or_default();
        result.into_iter().filter_map(|r| Some((r["metric"].clone(), r["value"][1].as_str()?.parse().ok()?))).collect()
    }

    /// Waits until Prometheus has scraped `temperature` for GPU `index` of `node`.
    pub async fn wait_scraped(&self, node: &str, index: u32, temperature: f64) {
        let promql = format!("DCGM_FI_DEV_GPU_TEMP{{Hostname=\"{node}\",gpu=\"{index}\"}}");
        wait_for(&format!("Prometheus to scrape {promql} = {temperature}"), Duration::from_secs(30), || async {
            self.query(&promql).await.iter().any(|(_, v)| *v == temperature).then_some(())
        })
        .await;
    }
}

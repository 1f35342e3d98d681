//! GPU health from a Prometheus that scrapes NVIDIA DCGM exporter: the instant values of
//! `DCGM_FI_DEV_GPU_TEMP`, `DCGM_FI_DEV_FB_FREE`, `DCGM_FI_DEV_FB_USED` and
//! `DCGM_FI_DEV_GPU_UTIL`, matched to nodes by the `Hostname` label and to GPUs by `gpu`.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde::Deserialize;

use crate::devices::{ClusterMetrics, GpuMetrics, MetricsError, MetricsSource};

/// The series muster reads.
pub const SERIES: [&str; 4] =
    ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL"];
/// When each temperature sample was scraped: an instant query's own timestamp is the query
/// time, which would hide a stalled exporter from the staleness check.
pub const SAMPLE_TIME: &str = "timestamp(DCGM_FI_DEV_GPU_TEMP)";

/// Queries Prometheus's HTTP API.
#[derive(Clone, Debug)]
pub struct PrometheusSource {
    client: reqwest::Client,
    base: String,
}

impl PrometheusSource {
    /// A source for the Prometheus at `base` (e.g. `http://prometheus.monitoring:9090`).
    pub fn new(base: &str) -> Result<Self, MetricsError> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| MetricsError(e.to_string()))?;
        Ok(Self { client, base: base.trim_end_matches('/').to_string() })
    }

    async fn query(&self, series: &str) -> Result<Vec<Sample>, MetricsError> {
        let url = format!("{}/api/v1/query", self.base);
        let resp = self
            .client
            .get(&url)
            .query(&[("query", series)])
            .send()
            .await
            .map_err(|e| MetricsError(format!("{url}: {e}")))?;
        let body: QueryResponse = resp.json().await.map_err(|e| MetricsError(format!("{url}: {e}")))?;
        if body.status != "success" {
            return Err(MetricsError(format!("{url}: status {}: {}", body.status, body.error.unwrap_or_default())));
        }
        Ok(body.data.map(|d| d.result).unwrap_or_default())
    }
}

#[derive(Deserialize)]
struct QueryResponse {
    status: String,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    data: Option<QueryData>,
}

#[derive(Deserialize)]
struct QueryData {
    #[serde(default)]
    result: Vec<Sample>,
}

/// One instant-vector sample.
#[derive(Deserialize, Clone, Debug)]
pub struct Sample {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    value: (f64, String),
}

#[derive(Default, Clone, Copy)]
struct Partial {
    temp: Option<f64>,
    free: Option<f64>,
    used: Option<f64>,
    util: Option<f64>,
    at: f64,
    sampled: Option<f64>,
}

/// Combines the four series into per-node, per-GPU metrics. Samples without a `Hostname` or a
/// numeric `gpu` label, or without a temperature or memory figure, are left out (and so
/// count as missing, which never blocks scheduling).
pub fn combine(series: &[(&str, Vec<Sample>)]) -> ClusterMetrics {
    let mut parts: BTreeMap<(String, u32), Partial> = BTreeMap::new();
    for (name, samples) in series {
        for s in samples {
            let (Some(host), Some(gpu)) =
                (s.metric.get("Hostname"), s.metric.get("gpu").and_then(|g| g.parse::<u32>().ok()))
            else {
                continue;
            };
            let Ok(v) = s.value.1.parse::<f64>() else { continue };
            let p = parts.entry((host.clone(), gpu)).or_default();
            p.at = p.at.max(s.value.0);
            match *name {
                "DCGM_FI_DEV_GPU_TEMP" => p.temp = Some(v),
                "DCGM_FI_DEV_FB_FREE" => p.free = Some(v),
                "DCGM_FI_DEV_FB_USED" => p.used = Some(v),
                "DCGM_FI_DEV_GPU_UTIL" => p.util = Some(v),
                SAMPLE_TIME => p.sampled = Some(v),
                _ => {}
            }
        }
    }
    let mut out = ClusterMetrics::new();
    for ((host, gpu), p) in parts {
        let (Some(temp), Some(free), Some(used)) = (p.temp, p.free, p.used) else { continue };
        let total = free + used;
        let observed_at = SystemTime::UNIX_EPOCH + Duration::from_secs_f64(p.sampled.unwrap_or(p.at).max(0.0));
        let m = GpuMetrics {
            temperature_c: temp,
            memory_free_fraction: if total > 0.0 { free / total } else { 0.0 },
            utilization: p.util.unwrap_or(0.0) / 100.0,
            observed_at,
        };
        out.entry(host).or_default().gpus.insert(gpu, m);
    }
    out
}

impl MetricsSource for PrometheusSource {
    async fn snapshot(&self) -> Result<ClusterMetrics, MetricsError> {
        let mut series = Vec::new();
        for name in SERIES.into_iter().chain([SAMPLE_TIME]) {
            series.push((name, self.query(name).await?));
        }
        Ok(combine(&series))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(host: &str, gpu: &str, at: f64, v: &str) -> Sample {
        Sample {
            metric: [("Hostname".to_string(), host.to_string()), ("gpu".to_string(), gpu.to_string())].into(),
            value: (at, v.to_string()),
        }
    }

    #[test]
    fn combines_dcgm_series_per_node_and_gpu() {
        let m = combine(&[
            (
                "DCGM_FI_DEV_GPU_TEMP",
                vec![sample("n1", "0", 100.0, "91"), sample("n1", "1", 100.0, "40"), sample("", "x", 1.0, "1")],
            ),
            ("DCGM_FI_DEV_FB_FREE", vec![sample("n1", "0", 100.0, "60000"), sample("n1", "1", 100.0, "1000")]),
            ("DCGM_FI_DEV_FB_USED", vec![sample("n1", "0", 100.0, "20000"), sample("n1", "1", 100.0, "79000")]),
            ("DCGM_FI_DEV_GPU_UTIL", vec![sample("n1", "0", 100.0, "50")]),
            (SAMPLE_TIME, vec![sample("n1", "1", 100.0, "40")]),
        ]);
        let g0 = m["n1"].gpus[&0];
        assert_eq!(g0.temperature_c, 91.0);
        assert!((g0.memory_free_fraction - 0.75).abs() < 1e-9);
        assert!((g0.utilization - 0.5).abs() < 1e-9);
        assert_eq!(g0.observed_at, SystemTime::UNIX_EPOCH + Duration::from_secs(100));
        assert!((m["n1"].gpus[&1].memory_free_fraction - 0.0125).abs() < 1e-9);
        // A scrape time, when known, wins over the query time.
        assert_eq!(m["n1"].gpus[&1].observed_at, SystemTime::UNIX_EPOCH + Duration::from_secs(40));
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn parses_the_query_api_response() {
        let body = r#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"__name__":"DCGM_FI_DEV_GPU_TEMP","Hostname":"n1","gpu":"3"},"value":[1700000000.5,"72"]}]}}"#;
        let r: QueryResponse = serde_json::from_str(body).expect("parse");
        let samples = r.data.expect("data").result;
        assert_eq!(samples[0].value.1, "72");
        assert_eq!(samples[0].metric["gpu"], "3");
    }
}

//! `muster dev fake-dcgm-exporter`: serves, for fake GPU nodes, the four NVIDIA DCGM exporter
//! series muster reads through Prometheus, so tests can make one GPU hot or short of memory.
//! Values are set at start (flags) and changed at run time with `PUT /gpus/<node>/<index>`.
//! The state and the text format are pure ([`FakeGpus`], [`FakeGpus::render`]); only [`serve`]
//! does I/O.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, put};
use serde::{Deserialize, Serialize};

use super::topology::gpu_uuid;

/// The series served, in the order they are written (the ones `prometheus.rs` queries).
pub const SERIES: [(&str, &str); 4] = [
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
];

/// One GPU's values, in DCGM's units.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuValues {
    /// Degrees Celsius (`DCGM_FI_DEV_GPU_TEMP`).
    pub temperature: f64,
    /// Free framebuffer MiB (`DCGM_FI_DEV_FB_FREE`).
    pub fb_free: f64,
    /// Used framebuffer MiB (`DCGM_FI_DEV_FB_USED`).
    pub fb_used: f64,
    /// Percent (`DCGM_FI_DEV_GPU_UTIL`).
    pub utilization: f64,
}

/// A partial change of [`GpuValues`]: the body of `PUT /gpus/<node>/<index>` and of `--set`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuUpdate {
    /// New temperature.
    pub temperature: Option<f64>,
    /// New free MiB.
    pub fb_free: Option<f64>,
    /// New used MiB.
    pub fb_used: Option<f64>,
    /// New utilization percent.
    pub utilization: Option<f64>,
}

impl GpuValues {
    /// These values with `update` applied.
    pub fn with(self, update: &GpuUpdate) -> Self {
        Self {
            temperature: update.temperature.unwrap_or(self.temperature),
            fb_free: update.fb_free.unwrap_or(self.fb_free),
            fb_used: update.fb_used.unwrap_or(self.fb_used),
            utilization: update.utilization.unwrap_or(self.utilization),
        }
    }
}

/// A value refused by [`FakeGpus::update`] or a flag parser.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// A value that is not a finite number, or a negative one.
    #[error("{0}: must be a finite number >= 0")]
    BadValue(&'static str),
    /// A `--set` that is not `NODE/INDEX:key=value,...`.
    #[error(
        "invalid --set {0:?}: expected NODE/INDEX:key=value[,key=value] (keys temperature, fbFree, fbUsed, utilization)"
    )]
    BadSet(String),
    /// A GPU index above the 64 a node can have.
    #[error("GPU index {0} out of range (0..64)")]
    BadIndex(u32),
}

fn check(update: &GpuUpdate) -> Result<(), Error> {
    let fields = [
        ("temperature", update.temperature),
        ("fbFree", update.fb_free),
        ("fbUsed", update.fb_used),
        ("utilization", update.utilization),
    ];
    for (name, v) in fields {
        if v.is_some_and(|v| !v.is_finite() || v < 0.0) {
            return Err(Error::BadValue(name));
        }
    }
    Ok(())
}

/// Every GPU the exporter reports, and how new ones start.
#[derive(Clone, Debug, PartialEq)]
pub struct FakeGpus {
    /// Values of a GPU first mentioned by a `PUT`.
    pub defaults: GpuValues,
    /// `modelName` label.
    pub model_name: String,
    /// Seed of the `UUID` label (the same as `muster dev add-nodes --uuid-seed` gives equal UUIDs).
    pub uuid_seed: String,
    gpus: BTreeMap<(String, u32), GpuValues>,
}

impl FakeGpus {
    /// No GPUs yet.
    pub fn new(defaults: GpuValues, model_name: &str, uuid_seed: &str) -> Self {
        Self { defaults, model_name: model_name.into(), uuid_seed: uuid_seed.into(), gpus: BTreeMap::new() }
    }

    /// Adds GPUs `0..gpus` of `node` with the default values (keeps existing ones).
    pub fn add_node(&mut self, node: &str, gpus: u32) {
        for index in 0..gpus {
            self.gpus.entry((node.to_string(), index)).or_insert(self.defaults);
        }
    }

    /// Changes one GPU (created from the defaults if new) and returns its values.
    pub fn update(&mut self, node: &str, index: u32, update: &GpuUpdate) -> Result<GpuValues, Error> {
        check(update)?;
        if index >= 64 {
            return Err(Error::BadIndex(index));
        }
        let slot = self.gpus.entry((node.to_string(), index)).or_insert(self.defaults);
        *slot = slot.with(update);
        Ok(*slot)
    }

    /// Stops reporting one GPU; whether it was reported.
    pub fn remove(&mut self, node: &str, index: u32) -> bool {
        self.gpus.remove(&(node.to_string(), index)).is_some()
    }

    /// One GPU's values.
    pub fn get(&self, node: &str, index: u32) -> Option<GpuValues> {
        self.gpus.get(&(node.to_string(), index)).copied()
    }

    /// The `/metrics` body: Prometheus text format 0.0.4, labelled as DCGM exporter labels.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (name, help) in SERIES {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n"));
            for ((node, index), v) in &self.gpus {
                let value = match name {
                    "DCGM_FI_DEV_GPU_TEMP" => v.temperature,
                    "DCGM_FI_DEV_FB_FREE" => v.fb_free,
                    "DCGM_FI_DEV_FB_USED" => v.fb_used,
                    _ => v.utilization,
                };
                out.push_str(&format!(
                    "{name}{{gpu=\"{index}\",UUID=\"{}\",device=\"nvidia{index}\",modelName=\"{}\",Hostname=\"{}\"}} {value}\n",
                    gpu_uuid(&self.uuid_seed, node, *index),
                    escape(&self.model_name),
                    escape(node),
                ));
            }
        }
        out
    }

    /// Every GPU, for `GET /gpus`.
    pub fn list(&self) -> Vec<GpuEntry> {
        self.gpus.iter().map(|((node, index), v)| GpuEntry { node: node.clone(), index: *index, values: *v }).collect()
    }
}

/// One GPU in `GET /gpus`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuEntry {
    /// Node name (the `Hostname` label).
    pub node: String,
    /// GPU index (the `gpu` label).
    pub index: u32,
    /// Its values.
    #[serde(flatten)]
    pub values: GpuValues,
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Parses `--set NODE/INDEX:key=value[,key=value]`.
pub fn parse_set(s: &str) -> Result<(String, u32, GpuUpdate), Error> {
    let bad = || Error::BadSet(s.to_string());
    let (gpu, values) = s.split_once(':').ok_or_else(bad)?;
    let (node, index) = gpu.rsplit_once('/').ok_or_else(bad)?;
    let index: u32 = index.parse().map_err(|_| bad())?;
    if node.is_empty() {
        return Err(bad());
    }
    let mut update = GpuUpdate::default();
    for pair in values.split(',') {
        let (key, value) = pair.split_once('=').ok_or_else(bad)?;
        let value: f64 = value.trim().parse().map_err(|_| bad())?;
        let slot = match key.trim() {
            "temperature" => &mut update.temperature,
            "fbFree" => &mut update.fb_free,
            "fbUsed" => &mut update.fb_used,
            "utilization" => &mut update.utilization,
            _ => return Err(bad()),
        };
        *slot = Some(value);
    }
    check(&update)?;
    Ok((node.to_string(), index, update))
}

/// Arguments of `muster dev fake-dcgm-exporter`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Address to listen on; port 0 picks a free port. The first line on stdout names the address.
    #[arg(long, default_value = "127.0.0.1:9400")]
    listen: SocketAddr,
    /// A node whose GPUs are reported from the start (repeatable); `PUT` adds more at run time.
    #[arg(long = "node", value_name = "NAME")]
    nodes: Vec<String>,
    /// GPUs of each `--node`.
    #[arg(long, default_value_t = 8)]
    gpus: u32,
    /// Temperature (C) of every GPU unless set otherwise.
    #[arg(long, default_value_t = 40.0)]
    temperature: f64,
    /// Framebuffer memory of each GPU in MiB (free + used).
    #[arg(long, default_value_t = 81920.0)]
    gpu_memory_mib: f64,
    /// Used framebuffer MiB of every GPU unless set otherwise.
    #[arg(long, default_value_t = 0.0)]
    fb_used_mib: f64,
    /// Utilization (%) of every GPU unless set otherwise.
    #[arg(long, default_value_t = 0.0)]
    utilization: f64,
    /// Values of one GPU, `NODE/INDEX:key=value[,key=value]` with keys temperature, fbFree,
    /// fbUsed, utilization (repeatable), e.g. `kwok-gpu-0/3:temperature=90`.
    #[arg(long = "set", value_name = "GPU:VALUES", value_parser = parse_set)]
    sets: Vec<(String, u32, GpuUpdate)>,
    /// `modelName` label.
    #[arg(long, default_value = "NVIDIA H100 80GB HBM3")]
    model_name: String,
    /// Seed of the GPU UUIDs (as `muster dev add-nodes --uuid-seed`).
    #[arg(long, default_value = "muster")]
    uuid_seed: String,
}

impl Args {
    fn state(&self) -> Result<FakeGpus, Error> {
        let defaults = GpuValues {
            temperature: self.temperature,
            fb_free: (self.gpu_memory_mib - self.fb_used_mib).max(0.0),
            fb_used: self.fb_used_mib,
            utilization: self.utilization,
        };
        check(&GpuUpdate {
            temperature: Some(defaults.temperature),
            fb_free: Some(defaults.fb_free),
            fb_used: Some(defaults.fb_used),
            utilization: Some(defaults.utilization),
        })?;
        let mut gpus = FakeGpus::new(defaults, &self.model_name, &self.uuid_seed);
        for node in &self.nodes {
            gpus.add_node(node, self.gpus);
        }
        for (node, index, update) in &self.sets {
            gpus.update(node, *index, update)?;
        }
        Ok(gpus)
    }
}

type Shared = Arc<Mutex<FakeGpus>>;

fn lock(state: &Shared) -> std::sync::MutexGuard<'_, FakeGpus> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The exporter's routes: `GET /metrics`, `GET /gpus`, `PUT` and `DELETE /gpus/<node>/<index>`.
pub fn router(state: Shared) -> axum::Router {
    axum::Router::new()
        .route(
            "/metrics",
            get(|State(s): State<Shared>| async move {
                ([("content-type", "text/plain; version=0.0.4; charset=utf-8")], lock(&s).render())
            }),
        )
        .route("/gpus", get(|State(s): State<Shared>| async move { Json(lock(&s).list()) }))
        .route(
            "/gpus/{node}/{index}",
            put(|State(s): State<Shared>, Path((node, index)): Path<(String, u32)>, Json(update): Json<GpuUpdate>| async move {
                match lock(&s).update(&node, index, &update) {
                    Ok(v) => (StatusCode::OK, Json(v)).into_response(),
                    Err(e) => (StatusCode::UNPROCESSABLE_ENTITY, e.to_string()).into_response(),
                }
            })
            .delete(|State(s): State<Shared>, Path((node, index)): Path<(String, u32)>| async move {
                if lock(&s).remove(&node, index) { StatusCode::NO_CONTENT } else { StatusCode::NOT_FOUND }
            }),
        )
        .with_state(state)
}

/// Serves `state` on `listener` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, state: FakeGpus) -> std::io::Result<()> {
    axum::serve(listener, router(Arc::new(Mutex::new(state)))).await
}

/// Runs `muster dev fake-dcgm-exporter` until `shutdown` resolves.
pub fn run(args: Args, shutdown: impl Future<Output = ()> + Send + 'static) -> ExitCode {
    let state = match args.state() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    super::block_on(serve_until_stopped(args.listen, state, shutdown))
}

async fn serve_until_stopped(
    listen: std::net::SocketAddr,
    state: FakeGpus,
    shutdown: impl Future<Output = ()>,
) -> ExitCode {
    let result: std::io::Result<()> = async {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        // Tests read this line to learn the port.
        let mut stdout = std::io::stdout();
        writeln!(stdout, "listening on http://{addr}")?;
        stdout.flush()?;
        tokio::select! {
            r = serve(listener, state) => r,
            _ = shutdown => Ok(()),
        }
    }
    .await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus() -> FakeGpus {
        let defaults = GpuValues { temperature: 40.0, fb_free: 81920.0, fb_used: 0.0, utilization: 0.0 };
        let mut g = FakeGpus::new(defaults, "NVIDIA H100 80GB HBM3", "seed");
        g.add_node("n1", 2);
        g
    }

    #[test]
    fn renders_the_four_series_with_dcgm_labels() {
        let mut g = gpus();
        g.update("n1", 1, &GpuUpdate { temperature: Some(90.0), ..Default::default() }).unwrap();
        let text = g.render();
        assert!(text.contains("# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n"), "{text}");
        let uuid = gpu_uuid("seed", "n1", 1);
        let line = format!(
            "DCGM_FI_DEV_GPU_TEMP{{gpu=\"1\",UUID=\"{uuid}\",device=\"nvidia1\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"n1\"}} 90\n"
        );
        assert!(text.contains(&line), "{text}");
        for (name, _) in SERIES {
            assert_eq!(text.lines().filter(|l| l.starts_with(&format!("{name}{{"))).count(), 2, "{name}: {text}");
        }
        assert!(text.contains("DCGM_FI_DEV_FB_FREE{gpu=\"0\""), "{text}");
    }

    #[test]
    fn updates_are_partial_and_create_gpus() {
        let mut g = gpus();
        let v = g.update("n2", 5, &GpuUpdate { fb_free: Some(100.0), ..Default::default() }).unwrap();
        assert_eq!(v, GpuValues { fb_free: 100.0, ..g.defaults });
        assert_eq!(g.get("n1", 0), Some(g.defaults));
        assert!(g.remove("n2", 5));
        assert!(!g.remove("n2", 5));
        assert_eq!(
            g.update("n1", 0, &GpuUpdate { temperature: Some(f64::NAN), ..Default::default() }),
            Err(Error::BadValue("temperature"))
        );
        assert_eq!(g.update("n1", 64, &GpuUpdate::default()), Err(Error::BadIndex(64)));
    }

    #[test]
    fn set_flags_parse() {
        let (node, index, u) = parse_set("kwok-gpu-0/3:temperature=90,fbUsed=80000").unwrap();
        assert_eq!((node.as_str(), index), ("kwok-gpu-0", 3));
        assert_eq!(u, GpuUpdate { temperature: Some(90.0), fb_used: Some(80000.0), ..Default::default() });
        for bad in
            ["n/1", "n:temperature=1", "/1:temperature=1", "n/x:temperature=1", "n/1:hot=1", "n/1:temperature=-1"]
        {
            assert!(parse_set(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn put_bodies_refuse_unknown_fields() {
        assert!(serde_json::from_str::<GpuUpdate>(r#"{"temp": 1}"#).is_err());
        let u: GpuUpdate = serde_json::from_str(r#"{"temperature": 91}"#).unwrap();
        assert_eq!(u.temperature, Some(91.0));
    }

    #[tokio::test]
    async fn serves_metrics_and_takes_puts() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(serve(listener, gpus()));
        let http = reqwest::Client::new();
        let put = http
            .put(format!("{base}/gpus/n1/0"))
            .json(&serde_json::json!({"temperature": 90, "fbFree": 1000, "fbUsed": 80920}))
            .send()
            .await
            .unwrap();
        assert_eq!(put.status(), reqwest::StatusCode::OK);
        let metrics = http.get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
        let temp = metrics.lines().find(|l| l.starts_with("DCGM_FI_DEV_GPU_TEMP{gpu=\"0\"")).unwrap();
        assert!(temp.ends_with(" 90"), "{temp}");
        let bad =
            http.put(format!("{base}/gpus/n1/0")).json(&serde_json::json!({"temperature": -5})).send().await.unwrap();
        assert_eq!(bad.status(), reqwest::StatusCode::UNPROCESSABLE_ENTITY);
        let unknown =
            http.put(format!("{base}/gpus/n1/0")).json(&serde_json::json!({"hot": true})).send().await.unwrap();
        assert!(unknown.status().is_client_error());
        assert_eq!(
            http.delete(format!("{base}/gpus/n1/1")).send().await.unwrap().status(),
            reqwest::StatusCode::NO_CONTENT
        );
        let list: serde_json::Value = http.get(format!("{base}/gpus")).send().await.unwrap().json().await.unwrap();
        assert_eq!(
            list,
            serde_json::json!([{"node": "n1", "index": 0, "temperature": 90.0, "fbFree": 1000.0, "fbUsed": 80920.0, "utilization": 0.0}])
        );
    }
}

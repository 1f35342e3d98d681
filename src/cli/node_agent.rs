//! `muster node-agent`: runs nvidia-smi (or reads its captured output), builds the node's
//! `gpu.muster.dev/topology` annotation, and prints it or merge-patches it onto the node.
//! Parsing lives in `devices::nvidia_smi`; this file only runs commands and talks to the API.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};

use crate::crds::GPU_TOPOLOGY_ANNOTATION;
use crate::devices::nvidia_smi::{build_annotation, parse_query, parse_topo};

/// Field manager of the agent's patches.
const FIELD_MANAGER: &str = "muster-node-agent";

/// Arguments of `muster node-agent`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print the annotation value instead of patching the node.
    #[arg(long)]
    print: bool,
    /// Node to annotate (in a DaemonSet, from the downward API).
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// Repeat every INTERVAL (`90`, `90s`, `5m`, `1h`); once when absent.
    #[arg(long, value_parser = parse_interval)]
    interval: Option<Duration>,
    /// Read `nvidia-smi topo -m` output from this file instead of running nvidia-smi.
    #[arg(long)]
    topo_file: Option<PathBuf>,
    /// Read `nvidia-smi --query-gpu=index,uuid,memory.total --format=csv` output from this file.
    #[arg(long)]
    query_file: Option<PathBuf>,
    /// The nvidia-smi binary to run.
    #[arg(long, default_value = "nvidia-smi")]
    nvidia_smi: PathBuf,
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let (digits, unit) = s.find(|c: char| !c.is_ascii_digit()).map_or((s, ""), |i| s.split_at(i));
    let n: u64 = digits.parse().map_err(|_| format!("{s:?} is not a duration like 90s, 5m or 1h"))?;
    let secs = match unit {
        "" | "s" => Some(n),
        "m" => n.checked_mul(60),
        "h" => n.checked_mul(3600),
        _ => None,
    };
    match secs {
        Some(secs) if secs > 0 => Ok(Duration::from_secs(secs)),
        _ => Err(format!("{s:?} is not a positive duration like 90s, 5m or 1h")),
    }
}

/// Runs the subcommand; exit 1 when the annotation could not be built or written, 2 on bad usage.
pub fn run(args: Args) -> ExitCode {
    if !args.print && args.node_name.is_none() {
        eprintln!("error: --node-name (or $NODE_NAME) is required unless --print is given");
        return ExitCode::from(2);
    }
    super::block_on(run_async(args))
}

async fn run_async(args: Args) -> ExitCode {
    let target = match (&args.node_name, args.print) {
        (Some(node), false) => match client().await {
            Ok(client) => Some((Api::<Node>::all(client), node.clone())),
            Err(e) => {
                eprintln!("error: {e:#}");
                return ExitCode::from(1);
            }
        },
        _ => None,
    };
    // Patch only when the value changes, so a long-running agent does not write every interval.
    let mut written: Option<String> = None;
    loop {
        let result = match produce(&args).await {
            Ok(value) => match &target {
                None => {
                    println!("{value}");
                    Ok(())
                }
                Some(_) if written.as_deref() == Some(value.as_str()) => Ok(()),
                Some((api, node)) => patch(api, node, &value).await.map(|()| {
                    eprintln!("annotated node {node} with {GPU_TOPOLOGY_ANNOTATION}");
                    written = Some(value);
                }),
            },
            Err(e) => Err(e),
        };
        let Some(interval) = args.interval else {
            return match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::from(1)
                }
            };
        };
        if let Err(e) = result {
            eprintln!("error (retrying in {}s): {e:#}", interval.as_secs());
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = tokio::signal::ctrl_c() => return ExitCode::SUCCESS,
        }
    }
}

async fn client() -> anyhow::Result<kube::Client> {
    // rustls needs a process-wide crypto provider; an error only means one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    kube::Client::try_default().await.context("cannot reach the Kubernetes API")
}

/// The annotation value from nvidia-smi or the given files.
async fn produce(args: &Args) -> anyhow::Result<String> {
    let topo = match &args.topo_file {
        Some(path) => read(path).await?,
        None => nvidia_smi(&args.nvidia_smi, &["topo", "-m"]).await?,
    };
    let query = match &args.query_file {
        Some(path) => read(path).await?,
        None => nvidia_smi(&args.nvidia_smi, &["--query-gpu=index,uuid,memory.total", "--format=csv"]).await?,
    };
    let annotation = build_annotation(&parse_topo(&topo)?, &parse_query(&query)?)?;
    Ok(annotation.to_json())
}

async fn read(path: &Path) -> anyhow::Result<String> {
    tokio::fs::read_to_string(path).await.with_context(|| format!("cannot read {}", path.display()))
}

async fn nvidia_smi(bin: &Path, args: &[&str]) -> anyhow::Result<String> {
    let shown = format!("{} {}", bin.display(), args.join(" "));
    let out =
        tokio::process::Command::new(bin).args(args).output().await.with_context(|| format!("cannot run {shown}"))?;
    if !out.status.success() {
        bail!("{shown} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

async fn patch(api: &Api<Node>, node: &str, value: &str) -> anyhow::Result<()> {
    let body = serde_json::json!({ "metadata": { "annotations": { GPU_TOPOLOGY_ANNOTATION: value } } });
    let params = PatchParams { field_manager: Some(FIELD_MANAGER.to_string()), ..PatchParams::default() };
    api.patch(node, &params, &Patch::Merge(&body)).await.with_context(|| format!("cannot annotate node {node}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::GpuTopology;
    use clap::Parser;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nvidia-smi").join(name)
    }

    fn args(extra: &[&str]) -> Result<Args, clap::Error> {
        #[derive(Parser)]
        struct Wrapper {
            #[command(flatten)]
            args: Args,
        }
        Wrapper::try_parse_from(["node-agent"].iter().chain(extra)).map(|w| w.args)
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt.block_on(f),
            Err(e) => panic!("runtime: {e}"),
        }
    }

    #[test]
    fn intervals_take_seconds_minutes_and_hours() {
        assert_eq!(parse_interval("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_interval("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_interval("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_interval("1h"), Ok(Duration::from_secs(3600)));
        for bad in ["", "0", "m", "5d", "-1", "1.5m", "99999999999999999999h"] {
            assert!(parse_interval(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn files_produce_an_annotation_the_scheduler_accepts() {
        let a = args(&[
            "--print",
            "--topo-file",
            &fixture("dgx1-v100-topo.txt").to_string_lossy(),
            "--query-file",
            &fixture("dgx1-v100-query.csv").to_string_lossy(),
        ]);
        let a = a.unwrap_or_else(|e| panic!("{e}"));
        let value = block_on(produce(&a)).unwrap_or_else(|e| panic!("{e:#}"));
        let (model, reason) = GpuTopology::from_node(Some(&value), 8);
        assert_eq!(reason, None);
        assert!(model.is_known());
    }

    #[test]
    fn a_missing_nvidia_smi_is_an_error_not_a_panic() {
        let a = args(&["--print", "--nvidia-smi", "/nonexistent/nvidia-smi"]).unwrap_or_else(|e| panic!("{e}"));
        let err = block_on(produce(&a)).err().map(|e| format!("{e:#}"));
        assert!(err.is_some_and(|e| e.contains("cannot run /nonexistent/nvidia-smi topo -m")));
    }

    #[test]
    fn patching_needs_a_node_name() {
        let a = args(&["--topo-file", "x"]).unwrap_or_else(|e| panic!("{e}"));
        if std::env::var_os("NODE_NAME").is_none() {
            assert_eq!(run(a), ExitCode::from(2));
        }
    }
}

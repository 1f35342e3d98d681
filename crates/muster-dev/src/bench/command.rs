//! The `muster dev bench` command: set up the cluster, run the paths in order, relate them to
//! the plain path, print the table and write the JSON; the exit code says whether all held.

use std::process::ExitCode;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};

use super::path::run_path;
use super::report::{PathReport, Report};
use super::setup::{GPUS_PER_NODE, make_nodes, prepare_namespace};
use super::table::{format_table, opt};
use super::user::User;
use super::{Args, BenchError, BenchPath};
use crate::client;

async fn bench(args: &Args) -> Result<Report, BenchError> {
    let client = client(args.kubeconfig.as_deref()).await?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| BenchError::Setup(format!("http client: {e}")))?;
    let pods_needed = u64::from(args.gangs) * u64::from(args.size) * args.paths.len() as u64;
    if pods_needed > u64::from(args.nodes) * u64::from(GPUS_PER_NODE) {
        eprintln!(
            "bench: WARNING: {pods_needed} one-GPU pods over all paths, {} GPUs: the later paths cannot all bind",
            u64::from(args.nodes) * u64::from(GPUS_PER_NODE)
        );
    }
    for path in &args.paths {
        prepare_namespace(&client, &path.namespace()).await?;
    }
    let user = match &args.user_kubeconfig {
        Some(path) => {
            let user = User {
                client: crate::client(Some(path)).await?,
                namespace: args.user_namespace.clone(),
                interval: Duration::from_millis(args.user_interval_ms),
            };
            let identity = whoami(&user.client).await;
            eprintln!("bench: the ordinary user is {}", identity.as_deref().unwrap_or("?"));
            Some((user, identity))
        }
        None => None,
    };
    let (nodes_create_s, nodes_ready_s) = make_nodes(&client, args).await?;
    eprintln!("bench: all {} nodes Ready after {nodes_ready_s:.1} s", args.nodes);

    let mut report = Report {
        nodes: args.nodes,
        gangs: args.gangs,
        size: args.size,
        concurrency: args.concurrency,
        rate: args.rate,
        timeout_s: args.timeout,
        nodes_create_s,
        nodes_ready_s,
        user_identity: user.as_ref().and_then(|(_, id)| id.clone()),
        user_interval_ms: user.as_ref().map(|_| args.user_interval_ms),
        ..Report::default()
    };
    for (i, &path) in args.paths.iter().enumerate() {
        if args.clean_between && i > 0 {
            clean(&client, args.paths[i - 1], Duration::from_secs(args.timeout), args.settle_timeout).await?;
        }
        let r = run_path(&client, args, path, &http, user.as_ref().map(|(u, _)| u)).await?;
        eprintln!(
            "bench: {}: {}/{} bound, {} pods/s{}",
            path.name(),
            r.throughput.pods_bound,
            r.pods_expected,
            opt(r.throughput.bound_per_s, 1),
            if r.timed_out { " (TIMED OUT)" } else { "" }
        );
        report.paths.push(r);
    }
    report.relate_to_plain();
    let lp = ListParams::default();
    report.cluster_pods = Api::<Pod>::all(client.clone()).list_metadata(&lp).await.ok().map(|l| l.items.len());
    report.cluster_nodes = Api::<Node>::all(client).list_metadata(&lp).await.ok().map(|l| l.items.len());
    Ok(report)
}

/// Deletes the jobs of a path that ended (their pods and groups go with them), waits until its
/// namespace holds no pod, deletes the namespace and waits until it is gone, at most `limit`
/// in all, then until the API server is quiet again (at most `settle_s` more), so the next path
/// starts on a cluster that holds only the nodes. The jobs go first, one delete each: in a
/// 100-node trial a namespace deleted with its MusterJobs in it kept them (its content
/// deletion answered 200) and their pods stayed terminating.
async fn clean(client: &kube::Client, path: BenchPath, limit: Duration, settle_s: u64) -> Result<(), BenchError> {
    use k8s_openapi::api::batch::v1::Job;
    use k8s_openapi::api::core::v1::Namespace;
    use muster_api::MusterJob;
    let ns = path.namespace();
    let t0 = std::time::Instant::now();
    let lp = ListParams::default();
    let dp = kube::api::DeleteParams::background();
    match path {
        BenchPath::Plain | BenchPath::Gang => delete_each(Api::<Job>::namespaced(client.clone(), &ns)).await?,
        BenchPath::Muster | BenchPath::MusterUpstream => {
            delete_each(Api::<MusterJob>::namespaced(client.clone(), &ns)).await?
        }
    }
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut deleted = false;
    loop {
        if !deleted && pods.list_metadata(&lp.clone().limit(1)).await?.items.is_empty() {
            gone(namespaces.delete(&ns, &dp).await)?;
            deleted = true;
        }
        if deleted && namespaces.get_opt(&ns).await?.is_none() {
            break;
        }
        if t0.elapsed() >= limit {
            return Err(BenchError::Setup(format!(
                "the jobs and namespace {ns} not gone {} s after their deletion",
                limit.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let gone_s = t0.elapsed().as_secs_f64();
    let (quiet_s, _) = super::path::settle(client, Duration::from_secs(settle_s)).await;
    eprintln!(
        "bench: {}: jobs, pods and namespace {ns} deleted in {gone_s:.1} s, the API server quiet {} s later",
        path.name(),
        opt(quiet_s, 1)
    );
    Ok(())
}

/// Deletes every object of `api`, one delete each (background propagation); one gone
/// meanwhile is no error.
async fn delete_each<K>(api: Api<K>) -> kube::Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let dp = kube::api::DeleteParams::background();
    for object in api.list_metadata(&ListParams::default()).await?.items {
        gone(api.delete(object.metadata.name.as_deref().unwrap_or_default(), &dp).await)?;
    }
    Ok(())
}

/// A delete's result, an object gone already (404) counted as deleted.
fn gone<T>(result: kube::Result<T>) -> kube::Result<()> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Who `client` authenticates as (a SelfSubjectReview), None when the API server does not say.
async fn whoami(client: &kube::Client) -> Option<String> {
    let review = serde_json::json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"});
    let body = serde_json::to_vec(&review).ok()?;
    let request = axum::http::Request::post("/apis/authentication.k8s.io/v1/selfsubjectreviews")
        .header("content-type", "application/json")
        .body(body)
        .ok()?;
    let answer: serde_json::Value = client.request(request).await.ok()?;
    answer["status"]["userInfo"]["username"].as_str().map(str::to_string)
}

/// The reports in `files` (each written by `--json-out`), as one related to its plain path.
fn merged(files: &[std::path::PathBuf]) -> Result<Report, String> {
    let parts = files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f).map_err(|e| format!("reading {}: {e}", f.display()))?;
            serde_json::from_str(&text).map_err(|e| format!("{}: not a bench report: {e}", f.display()))
        })
        .collect::<Result<Vec<Report>, String>>()?;
    super::report::merge(parts)
}

/// Runs `muster dev bench`: exit 0 only when every path bound all its pods and measured what
/// it claims.
pub fn run(args: Args) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: tokio runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let report = if args.merge.is_empty() {
        runtime.block_on(bench(&args)).map_err(|e| e.to_string())
    } else {
        merged(&args.merge)
    };
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    print!("{}", format_table(&report));
    if let Some(path) = &args.json_out {
        let written = serde_json::to_string_pretty(&report)
            .map_err(std::io::Error::other)
            .and_then(|text| std::fs::write(path, text + "\n"));
        if let Err(e) = written {
            eprintln!("error: writing {}: {e}", path.display());
            return ExitCode::from(2);
        }
        println!("numbers written to {}", path.display());
    }
    if report.paths.iter().all(PathReport::ok) { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

//! One path, start to end: watch its namespace, create its gangs (paced, retried), wait for
//! every bind, and gather its numbers from the watch, /proc and the /metrics of muster and the
//! API server.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use kube::Client;
use kube::api::{Api, PostParams};
use muster_api::MusterJob;

use super::apiserver::{api_requests, busy_writes, request_delta, request_time};
use super::manifests::gang_manifest;
use super::muster_metrics::fetch_metrics;
use super::procfs::{
    CLOCK_TICKS_PER_S, cpu_by_command, mib, process_ticks, read_proc, sample_rss, stat_cpu_ticks, status_kib,
};
use super::report::{MusterNumbers, PathReport};
use super::stats::{gang_admission_latencies, index_times, percentile, throughput, user_latency};
use super::table::opt;
use super::user::{Probe, User, clean};
use super::watch::{PodLog, lock, pod_times, since, watch_pods};
use super::{Args, BenchError, BenchPath};

/// Creates one gang, retrying transient failures; Ok(false) when a gang Job came back
/// without `spec.scheduling` (the API dropped it).
async fn create_gang(client: &Client, path: BenchPath, ns: &str, name: &str, size: u32) -> Result<bool, BenchError> {
    let manifest = gang_manifest(path, name, size);
    let pp = PostParams::default();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let result = match path {
            BenchPath::Plain | BenchPath::Gang => {
                let job: Job = serde_json::from_value(manifest.clone())?;
                Api::<Job>::namespaced(client.clone(), ns)
                    .create(&pp, &job)
                    .await
                    .map(|j| path != BenchPath::Gang || j.spec.is_some_and(|s| s.scheduling.is_some()))
            }
            BenchPath::Muster | BenchPath::MusterUpstream => {
                let job: MusterJob = serde_json::from_value(manifest.clone())?;
                Api::<MusterJob>::namespaced(client.clone(), ns).create(&pp, &job).await.map(|_| true)
            }
        };
        match result {
            Ok(kept) => return Ok(kept),
            // An earlier attempt went through after all.
            Err(kube::Error::Api(e)) if e.code == 409 && attempt > 1 => return Ok(true),
            Err(e) if attempt >= 5 => return Err(e.into()),
            Err(e) => {
                eprintln!("bench: creating {ns}/{name} (attempt {attempt}): {e}");
                tokio::time::sleep(Duration::from_millis(200 * attempt)).await;
            }
        }
    }
}

/// The window over which the API server's writes are counted while a path's tail settles.
const SETTLE_WINDOW: Duration = Duration::from_secs(3);
/// The write rate (a cluster at rest's writes left out) under which a path's tail is over.
const QUIET_WRITES_PER_S: f64 = 5.0;

/// Waits after a path's last bind until the API server's writes, a cluster at rest's left out
/// ([`busy_writes`]), stay under [`QUIET_WRITES_PER_S`] for one [`SETTLE_WINDOW`], or `limit`
/// passed: returns the seconds that took and every write meanwhile (`None` and nothing when
/// the API server's /metrics could not be read).
pub(super) async fn settle(client: &Client, limit: Duration) -> (Option<f64>, Vec<(String, f64)>) {
    let t0 = Instant::now();
    let Some(first) = api_requests(client).await else { return (None, Vec::new()) };
    let mut last = first.counts.clone();
    loop {
        tokio::time::sleep(SETTLE_WINDOW).await;
        let Some(now) = api_requests(client).await else { break };
        let busy = busy_writes(&request_delta(&last, &now.counts));
        last = now.counts;
        if busy < QUIET_WRITES_PER_S * SETTLE_WINDOW.as_secs_f64() || t0.elapsed() >= limit {
            break;
        }
    }
    (Some(t0.elapsed().as_secs_f64()), request_delta(&first.counts, &last))
}

pub(super) async fn run_path(
    client: &Client,
    args: &Args,
    path: BenchPath,
    http: &reqwest::Client,
    user: Option<&User>,
) -> Result<PathReport, BenchError> {
    let ns = path.namespace();
    let expected = (args.gangs * args.size) as usize;
    let log: PodLog = Arc::default();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let watch = tokio::spawn(watch_pods(Api::namespaced(client.clone(), &ns), log.clone(), ready_tx));
    if tokio::time::timeout(Duration::from_secs(60), ready_rx).await.is_err() {
        watch.abort();
        return Err(BenchError::Setup(format!("the pod watch of {ns} did not start")));
    }

    let is_muster = matches!(path, BenchPath::Muster | BenchPath::MusterUpstream);
    let muster_pid = args.muster_pid.filter(|_| is_muster);
    let metrics_before = match (&args.muster_metrics_url, is_muster) {
        (Some(url), true) => fetch_metrics(http, url).await,
        _ => None,
    };
    let requests_before = api_requests(client).await;
    let processes_before = process_ticks();
    let ticks_before = muster_pid.and_then(|pid| read_proc(pid, "stat")).and_then(|s| stat_cpu_ticks(&s));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = muster_pid.map(|pid| tokio::spawn(sample_rss(pid, stop.clone())));

    eprintln!("bench: {}: creating {} gangs of {} in {ns}", path.name(), args.gangs, args.size);
    let t0 = Instant::now();
    let probe = user.map(|u| Probe::start(u, path.name(), t0));
    let results: Vec<(Result<bool, BenchError>, Instant)> = futures::stream::iter(0..args.gangs)
        .map(|i| {
            let ns = &ns;
            // Paced: gang i is created no sooner than i / rate seconds after the first.
            let at = (args.rate > 0.0).then(|| t0 + Duration::from_secs_f64(f64::from(i) / args.rate));
            async move {
                if let Some(at) = at {
                    tokio::time::sleep_until(at.into()).await;
                }
                let name = format!("{}-{i:05}", path.name());
                let r = create_gang(client, path, ns, &name, args.size).await;
                (r, Instant::now())
            }
        })
        .buffer_unordered(args.concurrency as usize)
        .collect()
        .await;
    let last_create = results.iter().filter(|(r, _)| r.is_ok()).map(|(_, t)| since(t0, *t)).reduce(f64::max);
    let mut create_errors = 0;
    let mut scheduling_dropped = false;
    for (r, _) in &results {
        match r {
            Ok(kept) => scheduling_dropped |= !kept,
            Err(e) => {
                create_errors += 1;
                if create_errors <= 3 {
                    eprintln!("bench: {}: create failed: {e}", path.name());
                }
            }
        }
    }
    if scheduling_dropped {
        eprintln!(
            "bench: WARNING: the API dropped spec.scheduling of the gang path's Jobs (gate WorkloadWithJob off?): \
             they ran as plain Jobs"
        );
    }
    eprintln!(
        "bench: {}: {} creates in {} s; waiting for {expected} binds",
        path.name(),
        args.gangs as usize - create_errors,
        opt(last_create, 2)
    );

    let deadline = t0 + Duration::from_secs(args.timeout);
    let mut next_progress = t0 + Duration::from_secs(10);
    let timed_out = loop {
        let bound = lock(&log).values().filter(|r| r.bound.is_some()).count();
        if bound >= expected {
            break false;
        }
        let now = Instant::now();
        if now >= deadline {
            break true;
        }
        if now >= next_progress {
            let seen = lock(&log).len();
            eprintln!("bench: {}: {bound}/{expected} bound, {seen} seen ({:.0} s)", path.name(), since(t0, now));
            next_progress = now + Duration::from_secs(10);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    stop.store(true, Ordering::Relaxed);
    let user_samples = match probe {
        Some(p) => Some(p.finish().await),
        None => None,
    };
    if let Some(u) = user {
        clean(client, &u.namespace).await;
    }
    let cpu_s_by_process = cpu_by_command(&processes_before, &process_ticks());
    let ticks_after = muster_pid.and_then(|pid| read_proc(pid, "stat")).and_then(|s| stat_cpu_ticks(&s));
    let hwm = muster_pid.and_then(|pid| read_proc(pid, "status")).and_then(|s| status_kib(&s, "VmHWM"));
    let metrics_after = match (&args.muster_metrics_url, is_muster) {
        (Some(url), true) => fetch_metrics(http, url).await,
        _ => None,
    };
    let (api_writes, api_time, api_conflicts) = match (requests_before, api_requests(client).await) {
        (Some(before), Some(after)) => (
            request_delta(&before.counts, &after.counts),
            request_time((&before.seconds, &after.seconds), (&before.counts, &after.counts)),
            request_delta(&before.conflicts, &after.conflicts),
        ),
        _ => (Vec::new(), Vec::new(), Vec::new()),
    };
    let rss_peak = match sampler {
        Some(s) => s.await.ok().flatten(),
        None => None,
    };
    let (settle_s, tail_writes) = if args.settle_timeout > 0 && !timed_out {
        settle(client, Duration::from_secs(args.settle_timeout)).await
    } else {
        (None, Vec::new())
    };
    // Watched through the tail too: GPU indices written after the last bind are seen.
    watch.abort();

    let (pods, pods_with_scheduling_group) = pod_times(&log, t0);
    let muster = is_muster.then(|| {
        let latencies = gang_admission_latencies(&pods, args.size as usize);
        MusterNumbers {
            rss_peak_mib: rss_peak.map(|r| mib(r.total)),
            rss_anon_mib: rss_peak.map(|r| mib(r.anon)),
            rss_file_mib: rss_peak.map(|r| mib(r.file)),
            vm_hwm_mib: hwm.map(mib),
            cpu_s: ticks_before.zip(ticks_after).map(|(b, a)| a.saturating_sub(b) as f64 / CLOCK_TICKS_PER_S),
            admission_p50_s: percentile(&latencies, 50.0),
            admission_p99_s: percentile(&latencies, 99.0),
            gangs_admitted: latencies.len(),
            cycles: metrics_before.zip(metrics_after).map(|(b, a)| a.cycles - b.cycles),
            job_reconciles: metrics_before.zip(metrics_after).map(|(b, a)| a.job_reconciles - b.job_reconciles),
            webhook_reviews: metrics_before.zip(metrics_after).map(|(b, a)| a.webhook_reviews - b.webhook_reviews),
            webhook_mean_ms: metrics_before.zip(metrics_after).and_then(|(b, a)| {
                let n = a.webhook_reviews - b.webhook_reviews;
                (n > 0.0).then(|| 1000.0 * (a.webhook_seconds - b.webhook_seconds) / n)
            }),
            heap_allocated_mib: metrics_after.and_then(|a| a.heap_allocated).map(|b| b / 1048576.0),
            heap_resident_mib: metrics_after.and_then(|a| a.heap_resident).map(|b| b / 1048576.0),
            events_dropped: metrics_before.zip(metrics_after).map(|(b, a)| a.events_dropped - b.events_dropped),
        }
    });
    Ok(PathReport {
        path: Some(path),
        namespace: ns,
        pods_expected: expected,
        pods_seen: pods.len(),
        pods_ungated: pods.iter().filter(|p| p.ungated.is_some()).count(),
        pods_with_scheduling_group,
        scheduling_dropped,
        create_errors,
        timed_out,
        last_create_s: last_create,
        throughput: throughput(&pods, 0.0, last_create),
        ratio_to_plain: None,
        api_writes,
        api_time,
        api_conflicts,
        cpu_s_by_process,
        settle_s,
        tail_writes,
        gpu_indices: Some(index_times(&pods)),
        muster,
        user: user_samples.as_deref().map(|s| user_latency(s, last_create)),
    })
}

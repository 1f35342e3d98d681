//! The pod driver of one side: it watches the pods of the side's namespace and gives each new
//! pod the outcome the scenario's script assigns to its completion index and attempt (or, for
//! NonIndexed jobs, to its order of creation): kwok's `sim.muster.dev/*` annotations for exit
//! codes, or, once the pod runs, what a kubelet, a preemption, an eviction or a user would
//! leave on it (status patches, a deletion, an eviction).
//!
//! A deleted or evicted pod is held by a finalizer of the driver's own while it "terminates"
//! (kwok removes a deleted pod at once, as if its grace period were over), then it is given a
//! terminal phase, as a kubelet would after killing its containers, and released.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use tokio::task::JoinSet;

/// The finalizer that holds a deleted pod in "terminating" until the driver releases it.
pub const HOLD: &str = "e2e.muster.dev/terminating";
const INDEX_ANNOTATIONS: [&str; 2] =
    ["batch.kubernetes.io/job-completion-index", "batch.muster.dev/job-completion-index"];

/// Which pod of the script a pod is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key {
    /// Completion index (Indexed jobs); `None` for NonIndexed.
    pub index: Option<i32>,
    /// Indexed: how many pods of this index came before it. NonIndexed: how many pods of the
    /// job came before it.
    pub attempt: u32,
}

/// What happens to a pod.
#[derive(Clone, Debug)]
pub enum Outcome {
    /// It keeps running (until its job deletes it).
    Run,
    /// Succeeded (exit code 0) this long after it started (`sim.muster.dev/succeed-after`).
    Succeed(&'static str),
    /// Failed with exit `code` this long after it started (`sim.muster.dev/fail-after`).
    Fail(i32, &'static str),
    /// Once running: Failed, each named container terminated with its exit code (the others 0).
    Exit(&'static [(&'static str, i32)]),
    /// Once running: what the kubelet leaves on a pod it preempts or evicts: `DisruptionTarget`
    /// True (`TerminationByKubelet`), phase Failed, containers killed (137).
    Disrupt,
    /// Once running: deleted (`kubectl delete pod`); terminating for this many seconds, then
    /// Failed with its containers killed (137).
    Delete(u64),
    /// Once running: evicted through the Eviction API (which adds `DisruptionTarget`
    /// `EvictionByEvictionAPI` and deletes it); terminating for this many seconds, then Failed.
    Evict(u64),
    /// Once running: its containers restarted this many times (restartPolicy OnFailure).
    Restarts(i32),
}

/// A scenario's pod outcomes.
pub type Script = Arc<dyn Fn(Key) -> Outcome + Send + Sync>;

/// Every pod gets the same outcome.
pub fn every(outcome: Outcome) -> Script {
    Arc::new(move |_| outcome.clone())
}

/// The outcome of each pod from `f`.
pub fn script(f: impl Fn(Key) -> Outcome + Send + Sync + 'static) -> Script {
    Arc::new(f)
}

/// A running driver.
pub struct Driver {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
    pods: Api<Pod>,
}

#[derive(Default)]
struct Seen {
    uids: BTreeSet<String>,
    names: Vec<String>,
    per_index: BTreeMap<Option<i32>, u32>,
    errors: Vec<String>,
}

impl Driver {
    /// Starts driving the pods of `pods` (one job's namespace) by `script`.
    pub fn start(pods: Api<Pod>, script: Script) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let task = tokio::spawn(drive(pods.clone(), script, stop.clone(), seen.clone()));
        Self { stop, seen, task, pods }
    }

    /// The names of every pod seen so far, in the order seen.
    pub fn names(&self) -> Vec<String> {
        self.seen.lock().expect("driver state").names.clone()
    }

    /// Stops driving, releases every pod still held, and returns the pod names seen and what
    /// went wrong on the way.
    pub async fn stop(self) -> (Vec<String>, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        release_all(&self.pods).await;
        let seen = self.seen.lock().expect("driver state");
        (seen.names.clone(), seen.errors.clone())
    }
}

fn index_of(pod: &Pod) -> Option<i32> {
    let annotations = pod.annotations();
    INDEX_ANNOTATIONS.iter().find_map(|k| annotations.get(*k)).and_then(|v| v.parse().ok())
}

async fn drive(pods: Api<Pod>, script: Script, stop: Arc<AtomicBool>, seen: Arc<Mutex<Seen>>) {
    let mut tasks = JoinSet::new();
    while !stop.load(Ordering::Relaxed) {
        if let Ok(list) = pods.list(&ListParams::default()).await {
            let mut fresh: Vec<Pod> = {
                let state = seen.lock().expect("driver state");
                list.items.into_iter().filter(|p| !state.uids.contains(&p.uid().unwrap_or_default())).collect()
            };
            fresh.sort_by_key(|p| (p.creation_timestamp().map(|t| t.0), p.name_any()));
            for pod in fresh {
                let key = {
                    let mut state = seen.lock().expect("driver state");
                    state.uids.insert(pod.uid().unwrap_or_default());
                    state.names.push(pod.name_any());
                    let index = index_of(&pod);
                    let n = state.per_index.entry(index).or_insert(0);
                    let key = Key { index, attempt: *n };
                    *n += 1;
                    key
                };
                let outcome = script(key);
                let (pods, stop, seen) = (pods.clone(), stop.clone(), seen.clone());
                tasks.spawn(async move {
                    let name = pod.name_any();
                    if let Err(e) = apply(&pods, &pod, outcome.clone(), &stop).await {
                        seen.lock().expect("driver state").errors.push(format!("pod {name} ({outcome:?}): {e}"));
                    }
                });
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Holds end by themselves (they are short); wait for them, bounded.
    let _ = tokio::time::timeout(Duration::from_secs(30), async { while tasks.join_next().await.is_some() {} }).await;
}

fn now() -> String {
    Timestamp::now().to_string()
}

async fn annotate(pods: &Api<Pod>, name: &str, annotations: Value) -> Result<(), String> {
    let patch = json!({"metadata": {"annotations": annotations}});
    pods.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.map(|_| ()).map_err(|e| e.to_string())
}

/// Waits until the pod runs (not being deleted); false when it is gone, ended, or the driver stops.
async fn running(pods: &Api<Pod>, name: &str, stop: &AtomicBool) -> Result<Option<Pod>, String> {
    let deadline = Instant::now() + Duration::from_secs(150);
    while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
        match pods.get_opt(name).await {
            Ok(None) => return Ok(None),
            Ok(Some(p)) => {
                if p.metadata.deletion_timestamp.is_some() {
                    return Ok(None);
                }
                match p.status.as_ref().and_then(|s| s.phase.as_deref()) {
                    Some("Running") => return Ok(Some(p)),
                    Some("Succeeded" | "Failed") => return Ok(None),
                    _ => {}
                }
            }
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(None)
}

/// Container statuses of `pod`, every container terminated with its code in `codes` (0 when
/// not named).
fn terminated(pod: &Pod, codes: &dyn Fn(&str) -> i32) -> Value {
    let now = now();
    let containers = pod.spec.as_ref().map(|s| s.containers.clone()).unwrap_or_default();
    let statuses: Vec<Value> = containers
        .iter()
        .map(|c| {
            let code = codes(&c.name);
            json!({
                "name": c.name, "image": c.image.clone().unwrap_or_default(), "ready": false, "started": false,
                "restartCount": 0,
                "state": {"terminated": {
                    "exitCode": code, "reason": if code == 0 { "Completed" } else { "Error" },
                    "startedAt": now, "finishedAt": now,
                }},
            })
        })
        .collect();
    Value::Array(statuses)
}

fn failed_status(pod: &Pod, codes: &dyn Fn(&str) -> i32, extra_conditions: Vec<Value>) -> Value {
    let now = now();
    let mut conditions = vec![
        json!({"type": "Ready", "status": "False", "reason": "PodFailed", "lastTransitionTime": now}),
        json!({"type": "ContainersReady", "status": "False", "reason": "PodFailed", "lastTransitionTime": now}),
    ];
    conditions.extend(extra_conditions);
    json!({"status": {"phase": "Failed", "conditions": conditions, "containerStatuses": terminated(pod, codes)}})
}

async fn patch_status(pods: &Api<Pod>, name: &str, patch: &Value) -> Result<(), String> {
    pods.patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .map(|_| ())
        .map_err(|e| format!("status patch: {e}"))
}

async fn hold(pods: &Api<Pod>, name: &str) -> Result<(), String> {
    let patch = json!({"metadata": {"finalizers": [HOLD]}});
    pods.patch(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .map(|_| ())
        .map_err(|e| format!("hold: {e}"))
}

/// Removes the driver's finalizer from `name` (optimistically: retried on conflict).
async fn release(pods: &Api<Pod>, name: &str) -> Result<(), String> {
    for _ in 0..10 {
        let Some(p) = pods.get_opt(name).await.map_err(|e| e.to_string())? else {
            return Ok(());
        };
        let finalizers = p.finalizers().to_vec();
        if !finalizers.iter().any(|f| f == HOLD) {
            return Ok(());
        }
        let kept: Vec<&String> = finalizers.iter().filter(|f| *f != HOLD).collect();
        let patch = json!({"metadata": {"finalizers": kept, "resourceVersion": p.resource_version()}});
        match pods.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
            Err(e) => return Err(format!("release: {e}")),
        }
    }
    Err("release: conflicts".into())
}

/// Releases every pod of the namespace the driver still holds (cleanup).
async fn release_all(pods: &Api<Pod>) {
    if let Ok(list) = pods.list(&ListParams::default()).await {
        for p in list.items.iter().filter(|p| p.finalizers().iter().any(|f| f == HOLD)) {
            let _ = release(pods, &p.name_any()).await;
        }
    }
}

/// Terminating for `secs`, then Failed (containers killed), then released.
async fn terminate_after(pods: &Api<Pod>, name: &str, secs: u64) -> Result<(), String> {
    tokio::time::sleep(Duration::from_secs(secs)).await;
    if let Some(p) = pods.get_opt(name).await.map_err(|e| e.to_string())? {
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default();
        if phase != "Failed" && phase != "Succeeded" {
            patch_status(pods, name, &failed_status(&p, &|_| 137, Vec::new())).await?;
        }
    }
    release(pods, name).await
}

async fn apply(pods: &Api<Pod>, pod: &Pod, outcome: Outcome, stop: &AtomicBool) -> Result<(), String> {
    let name = pod.name_any();
    let name = name.as_str();
    match outcome {
        Outcome::Run => return Ok(()),
        Outcome::Succeed(after) => return annotate(pods, name, json!({"sim.muster.dev/succeed-after": after})).await,
        Outcome::Fail(code, after) => {
            let annotations = json!({"sim.muster.dev/fail-after": after, "sim.muster.dev/exit-code": code.to_string()});
            return annotate(pods, name, annotations).await;
        }
        _ => {}
    }
    let Some(running) = running(pods, name, stop).await? else {
        return Ok(());
    };
    match outcome {
        Outcome::Exit(codes) => {
            let code = |c: &str| codes.iter().find(|(n, _)| *n == c).map_or(0, |(_, code)| *code);
            patch_status(pods, name, &failed_status(&running, &code, Vec::new())).await
        }
        Outcome::Disrupt => {
            let disrupted = json!({
                "type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
                "message": "Pod was terminated in response to imminent node shutdown.", "lastTransitionTime": now(),
            });
            patch_status(pods, name, &failed_status(&running, &|_| 137, vec![disrupted])).await
        }
        Outcome::Restarts(n) => {
            let now = now();
            let containers = running.spec.as_ref().map(|s| s.containers.clone()).unwrap_or_default();
            let statuses: Vec<Value> = containers
                .iter()
                .map(|c| {
                    json!({
                        "name": c.name, "image": c.image.clone().unwrap_or_default(), "ready": true, "started": true,
                        "restartCount": n,
                        "state": {"running": {"startedAt": now}},
                        "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": now, "finishedAt": now}},
                    })
                })
                .collect();
            patch_status(pods, name, &json!({"status": {"containerStatuses": statuses}})).await
        }
        Outcome::Delete(secs) => {
            hold(pods, name).await?;
            pods.delete(name, &DeleteParams::default()).await.map_err(|e| format!("delete: {e}"))?;
            terminate_after(pods, name, secs).await
        }
        Outcome::Evict(secs) => {
            hold(pods, name).await?;
            pods.evict(name, &EvictParams::default()).await.map_err(|e| format!("evict: {e}"))?;
            terminate_after(pods, name, secs).await
        }
        Outcome::Run | Outcome::Succeed(_) | Outcome::Fail(..) => Ok(()),
    }
}

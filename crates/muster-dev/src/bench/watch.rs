//! The pod watch of one path's namespace: when each pod was first seen, ungated, bound and
//! seen with its GPU indices, turned into [`PodTimes`] since the path started.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use muster_api::{ADMISSION_GATE, GPU_INDICES_ANNOTATION};

use super::stats::PodTimes;

/// What the watch recorded of one pod.
pub(super) struct PodRecord {
    gang: String,
    first_seen: Instant,
    ungated: Option<Instant>,
    pub(super) bound: Option<Instant>,
    indexed: Option<Instant>,
    scheduling_group: bool,
}

pub(super) type PodLog = Arc<Mutex<HashMap<String, PodRecord>>>;

pub(super) fn lock(log: &PodLog) -> std::sync::MutexGuard<'_, HashMap<String, PodRecord>> {
    // A panic elsewhere poisons nothing we cannot still read.
    log.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn record(log: &PodLog, pod: &Pod, now: Instant) {
    let Some(name) = pod.metadata.name.clone() else { return };
    let gang = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| o.name.clone())
        .unwrap_or_default();
    let spec = pod.spec.as_ref();
    let gated =
        spec.and_then(|s| s.scheduling_gates.as_ref()).is_some_and(|g| g.iter().any(|g| g.name == ADMISSION_GATE));
    let bound = spec.and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty());
    let scheduling_group = spec.is_some_and(|s| s.scheduling_group.is_some());
    let indexed = pod.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(GPU_INDICES_ANNOTATION));
    let mut pods = lock(log);
    let r = pods.entry(name).or_insert(PodRecord {
        gang,
        first_seen: now,
        ungated: None,
        bound: None,
        indexed: None,
        scheduling_group: false,
    });
    if !gated && r.ungated.is_none() {
        r.ungated = Some(now);
    }
    if bound && r.bound.is_none() {
        r.bound = Some(now);
    }
    if indexed && r.indexed.is_none() {
        r.indexed = Some(now);
    }
    r.scheduling_group |= scheduling_group;
}

/// Watches the pods of `api` into `log`; says on `ready` when the initial list is done.
pub(super) async fn watch_pods(api: Api<Pod>, log: PodLog, ready: tokio::sync::oneshot::Sender<()>) {
    let mut ready = Some(ready);
    let mut events = watcher(api, watcher::Config::default()).default_backoff().boxed();
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => record(&log, &pod, Instant::now()),
            Ok(watcher::Event::InitDone) => {
                if let Some(tx) = ready.take() {
                    let _ = tx.send(());
                }
            }
            Ok(_) => {}
            Err(e) => eprintln!("bench: pod watch: {e}"),
        }
    }
}

pub(super) fn since(t0: Instant, t: Instant) -> f64 {
    t.saturating_duration_since(t0).as_secs_f64()
}

pub(super) fn pod_times(log: &PodLog, t0: Instant) -> (Vec<PodTimes>, usize) {
    let pods = lock(log);
    let with_group = pods.values().filter(|r| r.scheduling_group).count();
    let times = pods
        .values()
        .map(|r| PodTimes {
            gang: r.gang.clone(),
            first_seen: since(t0, r.first_seen),
            ungated: r.ungated.map(|t| since(t0, t)),
            bound: r.bound.map(|t| since(t0, t)),
            indexed: r.indexed.map(|t| since(t0, t)),
        })
        .collect();
    (times, with_group)
}

//! An ordinary user beside the paths: every second (or every `--user-interval-ms`), a ConfigMap
//! create (a POST, as `kubectl create configmap` makes) by an identity API Priority and Fairness
//! does not exempt and that is not muster's, timed from request to response. A path that is
//! fast by starving the other clients of the API server shows it in these latencies. The
//! ConfigMaps carry a label and are deleted after each path.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};

use super::stats::UserSample;

/// The label on every ConfigMap the user makes.
const PROBE_LABEL: &str = "bench.muster.dev/user-probe";

/// The user: its client, the namespace it may create ConfigMaps in, and how often it does.
#[derive(Clone)]
pub(super) struct User {
    pub client: Client,
    pub namespace: String,
    pub interval: Duration,
}

/// A running probe: one create every [`User::interval`] until [`Probe::finish`].
pub(super) struct Probe {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<Vec<UserSample>>,
}

impl Probe {
    /// Starts the creates of `user`, their names after `path`; each sample's time is counted
    /// from `t0`, when the path started (the origin of its other times).
    pub fn start(user: &User, path: &str, t0: Instant) -> Probe {
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let api: Api<ConfigMap> = Api::namespaced(user.client.clone(), &user.namespace);
        let prefix = format!("{path}-");
        let interval = user.interval;
        let task = tokio::spawn(async move {
            let samples: Arc<Mutex<Vec<UserSample>>> = Arc::default();
            let mut inflight = tokio::task::JoinSet::new();
            let mut tick = tokio::time::interval(interval);
            // A slow create does not hold the next one back: each runs on its own.
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stopped.changed() => break,
                }
                let (api, samples, prefix) = (api.clone(), samples.clone(), prefix.clone());
                inflight.spawn(async move {
                    let cm = ConfigMap {
                        metadata: ObjectMeta {
                            generate_name: Some(prefix),
                            labels: Some(BTreeMap::from([(PROBE_LABEL.to_string(), "true".to_string())])),
                            ..ObjectMeta::default()
                        },
                        data: Some(BTreeMap::from([("k".to_string(), "v".to_string())])),
                        ..ConfigMap::default()
                    };
                    let t = Instant::now();
                    let at_s = t.saturating_duration_since(t0).as_secs_f64();
                    let r =
                        tokio::time::timeout(Duration::from_secs(60), api.create(&PostParams::default(), &cm)).await;
                    let seconds = t.elapsed().as_secs_f64();
                    let ok = match r {
                        Ok(Ok(_)) => true,
                        Ok(Err(e)) => {
                            eprintln!("bench: the user's ConfigMap create failed after {seconds:.3} s: {e}");
                            false
                        }
                        Err(_) => {
                            eprintln!("bench: the user's ConfigMap create timed out (60 s)");
                            false
                        }
                    };
                    samples.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(UserSample {
                        at_s,
                        seconds,
                        ok,
                    });
                });
            }
            while inflight.join_next().await.is_some() {}
            std::mem::take(&mut *samples.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
        });
        Probe { stop, task }
    }

    /// Stops the creates, waits for those in flight and returns every sample.
    pub async fn finish(self) -> Vec<UserSample> {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

/// Deletes the user's ConfigMaps (with `client`, so they do not pile up over the paths).
pub(super) async fn clean(client: &Client, namespace: &str) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    if let Err(e) = api.delete_collection(&DeleteParams::default(), &ListParams::default().labels(PROBE_LABEL)).await {
        eprintln!("bench: deleting the user's ConfigMaps in {namespace}: {e}");
    }
}

//! The pods' tracking finalizer ([`TRACKING_FINALIZER`]), as batch/v1's Job controller keeps
//! `batch.kubernetes.io/job-tracking`: every pod is made with it, so a pod that finishes (or is
//! deleted) stays visible until the job's status counts it; the controller then removes it.
//!
//! - [`Released`]: the pods whose finalizer this controller removed that the watch cache still
//!   shows with it (the cache lags): they are counted already and must not be counted again;
//! - [`Written`]: the counts this controller last wrote to a job's status, until the job's
//!   watch cache shows them (a status read from a stale cache would count a released pod as
//!   never counted, and lower the counts);
//! - [`release`] and [`release_before_delete`]: the patches;
//! - [`sweep`]: the finalizers of pods whose job is gone, being deleted, finished or not
//!   muster's, removed, so that no pod (and no namespace) is ever stuck on it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::core::DeserializeGuard;
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::json;

use super::JobContext;
use super::plan::{GANG_RESTARTED_ANNOTATION, TRACKING_FINALIZER, condition};
use super::record::CachedPod;
use crate::controllers::conditions;
use crate::controllers::context::Result;
use crate::controllers::own_writes::OwnWrites;
use crate::crds::batch::{MusterJob, MusterJobStatus};

/// How long an expectation is kept at most (a pod or status event that never comes).
const EXPECTATION_TIMEOUT: Duration = Duration::from_secs(30);

/// Per job UID: the pods whose finalizer was removed and the cache may still show with it.
#[derive(Debug, Default)]
pub struct Released(Mutex<HashMap<String, (HashSet<String>, Instant)>>);

impl Released {
    /// Records the pods released for a job.
    pub fn released(&self, job: &str, pods: impl IntoIterator<Item = String>, now: Instant) {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = map.entry(job.to_string()).or_insert_with(|| (HashSet::new(), now));
        entry.0.extend(pods);
        entry.1 = now;
        if entry.0.is_empty() {
            map.remove(job);
        }
    }

    /// Whether `pod` (still `tracked` in the cache) was released: forgets the pods the cache
    /// shows released or no longer shows (`cached`: the job's pods and whether each is tracked
    /// there).
    pub fn apply(&self, job: &str, cached: &HashMap<&str, bool>, now: Instant) -> HashSet<String> {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let Some((pods, at)) = map.get_mut(job) else { return HashSet::new() };
        pods.retain(|p| cached.get(p.as_str()).copied().unwrap_or(false));
        if pods.is_empty() || now.duration_since(*at) >= EXPECTATION_TIMEOUT {
            map.remove(job);
            return HashSet::new();
        }
        pods.clone()
    }

    /// Forgets a job (deleted).
    pub fn forget(&self, job: &str) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).remove(job);
    }
}

/// What of a status must never go back: the counts and the index lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counts {
    failed: i32,
    succeeded: i32,
    completed_indexes: Option<String>,
    failed_indexes: Option<String>,
    terminal: usize,
}

impl Counts {
    /// The counts of `status`.
    pub fn of(status: &MusterJobStatus) -> Self {
        let terminal =
            [condition::FAILURE_TARGET, condition::SUCCESS_CRITERIA_MET, condition::FAILED, condition::COMPLETE]
                .into_iter()
                .filter(|t| conditions::is_true(&status.conditions, t))
                .count();
        Counts {
            failed: status.failed,
            succeeded: status.succeeded,
            completed_indexes: status.completed_indexes.clone().filter(|s| !s.is_empty()),
            failed_indexes: status.failed_indexes.clone(),
            terminal,
        }
    }
}

/// Per job UID: the counts last written and when, and the version the last status write made
/// (with its counts).
#[derive(Debug, Default)]
pub struct Written(Mutex<HashMap<String, (Counts, Instant)>>, OwnWrites<Counts>);

impl Written {
    /// Records a status just written for a job; `version`: the job's resourceVersion after it.
    pub fn wrote(&self, job: &str, status: &MusterJobStatus, version: Option<&str>, now: Instant) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).insert(job.to_string(), (Counts::of(status), now));
        self.1.wrote(job, Counts::of(status), version, now);
    }

    /// Whether `status` may wait for the cache: the cache still shows the job at a version
    /// older than the one this controller's last status write made (`cached`,
    /// [`OwnWrites::lagging`]), and `status` records no count that write did not (a finished
    /// pod counted now must be written before it is released, so such a status never waits). A
    /// status computed from that older job would undo the write's times (two passes each
    /// writing the first status, each stamping its own `startTime` and condition times, were
    /// about half of all first writes at 1,000 gangs); the write's own event syncs the job
    /// again.
    pub fn behind_own_write(&self, job: &str, status: &MusterJobStatus, cached: Option<&str>, now: Instant) -> bool {
        self.1.lagging(job, cached, now).is_some_and(|counts| counts == Counts::of(status))
    }

    /// Whether the cache shows the job at a version older than the one this controller's last
    /// status write made (see [`OwnWrites::lagging`]).
    pub fn lagging(&self, job: &str, cached: Option<&str>, now: Instant) -> bool {
        self.1.lagging(job, cached, now).is_some()
    }

    /// Whether the job's status as read (`status`) shows what was last written (or that was
    /// long enough ago); forgets the record once it does.
    pub fn caught_up(&self, job: &str, status: &MusterJobStatus, now: Instant) -> bool {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let Some((counts, at)) = map.get(job) else { return true };
        if *counts == Counts::of(status) || now.duration_since(*at) >= EXPECTATION_TIMEOUT {
            map.remove(job);
            return true;
        }
        false
    }

    /// Forgets a job (deleted).
    pub fn forget(&self, job: &str) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).remove(job);
        self.1.forget(job);
    }
}

/// Removes the tracking finalizer of `pod` (a pod already gone is fine).
pub async fn release(api: &Api<Pod>, pod: &str) -> Result<()> {
    let patch = json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [TRACKING_FINALIZER]}});
    match api.patch_metadata(pod, &PatchParams::default(), &Patch::Strategic(&patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Before muster deletes a pod whose end counts for nothing (a gang restart's victim, a pod of
/// a suspended or scaled-down job): removes its tracking finalizer, and marks a gang restart's
/// victim as such, in one patch.
pub async fn release_before_delete(api: &Api<Pod>, pod: &str, gang_restart: bool) -> Result<()> {
    let mut metadata = json!({"$deleteFromPrimitiveList/finalizers": [TRACKING_FINALIZER]});
    if gang_restart {
        metadata["annotations"] = json!({ GANG_RESTARTED_ANNOTATION: "true" });
    }
    match api.patch_metadata(pod, &PatchParams::default(), &Patch::Strategic(&json!({ "metadata": metadata }))).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// How often [`sweep`] looks for pods whose finalizer nobody else will remove.
const SWEEP_EVERY: Duration = Duration::from_secs(3);

/// Whether a tracked pod's finalizer may go whatever its job's status says, its job as
/// read (`None`: gone): the job is gone, another of that name, being deleted, finished, or
/// reconciled by another controller. An undecodable job keeps it (it may be fixed).
fn orphaned(pod: &CachedPod, job: Option<&DeserializeGuard<MusterJob>>) -> bool {
    let Some(job) = job else { return true };
    let job = match &job.0 {
        Ok(job) => job,
        Err(_) => return false,
    };
    let finished = job.status.as_ref().is_some_and(|s| {
        conditions::is_true(&s.conditions, condition::COMPLETE) || conditions::is_true(&s.conditions, condition::FAILED)
    });
    pod.controller_uid.is_none()
        || pod.controller_uid.as_deref() != job.metadata.uid.as_deref()
        || job.metadata.deletion_timestamp.is_some()
        || finished
        || !job.spec.managed_by_muster()
}

/// Removes, every few seconds, the tracking finalizer of the pods [`orphaned`] says nobody else
/// will release (a job deleted with its pods, a namespace deleted), once the pod cache listed.
/// A job the jobs' cache does not show (gone, or not listed yet) is asked of the API server,
/// for the pods being deleted or without a controller only. The jobs' cache is never waited
/// for: its readiness wakes one waiter, the controller's.
pub async fn sweep(jc: Arc<JobContext>, jobs: Store<DeserializeGuard<MusterJob>>) {
    if jc.pods_ready.wait().await.is_err() {
        return;
    }
    let client = jc.ctx.client.clone();
    loop {
        for pod in jc.pods.state().into_iter().filter(|p| p.observed.tracked) {
            let key = pod.job.as_deref().map(|name| ObjectRef::new(name).within(&pod.namespace));
            let cached = key.as_ref().and_then(|k| jobs.get(k));
            let release_it = match (&cached, pod.job.as_deref()) {
                (Some(job), _) => orphaned(&pod, Some(job)),
                (None, Some(name)) if pod.observed.terminating || pod.controller_uid.is_none() => {
                    let api = Api::<DeserializeGuard<MusterJob>>::namespaced(client.clone(), &pod.namespace);
                    match api.get_opt(name).await {
                        Ok(job) => orphaned(&pod, job.as_ref()),
                        Err(e) => {
                            tracing::debug!(job = name, error = %e, "reading the job of a pod being deleted");
                            false
                        }
                    }
                }
                (None, None) => true,
                (None, Some(_)) => false,
            };
            if release_it {
                let api = Api::<Pod>::namespaced(client.clone(), &pod.namespace);
                if let Err(e) = release(&api, &pod.observed.name).await {
                    tracing::debug!(pod = %pod.observed.name, namespace = %pod.namespace, error = %e, "releasing an orphan pod");
                }
            }
        }
        tokio::time::sleep(SWEEP_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crds::batch::JobPhase;

    #[test]
    fn a_released_pod_stays_counted_until_the_cache_shows_its_release() {
        let t0 = Instant::now();
        let released = Released::default();
        released.released("j", ["a".to_string(), "b".to_string()], t0);
        // The cache still shows both tracked: both are counted already.
        let cached = HashMap::from([("a", true), ("b", true), ("c", true)]);
        let untracked = released.apply("j", &cached, t0);
        assert_eq!(untracked, HashSet::from(["a".to_string(), "b".to_string()]));
        assert!(released.apply("other", &cached, t0).is_empty(), "other jobs are not touched");
        // a's release shows; b is gone: both forgotten.
        let cached = HashMap::from([("a", false), ("c", true)]);
        assert!(released.apply("j", &cached, t0).is_empty());
        assert!(released.apply("j", &HashMap::from([("a", true)]), t0).is_empty(), "forgotten for good");
        // Never shown: forgotten after the timeout.
        released.released("j", ["d".to_string()], t0);
        let cached = HashMap::from([("d", true)]);
        assert_eq!(released.apply("j", &cached, t0 + EXPECTATION_TIMEOUT / 2).len(), 1);
        assert!(released.apply("j", &cached, t0 + EXPECTATION_TIMEOUT).is_empty());
    }

    #[test]
    fn a_status_read_before_the_last_write_shows_is_stale() {
        let t0 = Instant::now();
        let written = Written::default();
        let old = MusterJobStatus { failed: 1, ..Default::default() };
        let new = MusterJobStatus { failed: 3, terminating: Some(2), ..Default::default() };
        assert!(written.caught_up("j", &old, t0), "nothing written");
        written.wrote("j", &new, Some("8"), t0);
        assert!(!written.caught_up("j", &old, t0));
        assert!(written.caught_up("other", &old, t0));
        // The live counts are no part of it.
        assert!(written.caught_up("j", &MusterJobStatus { terminating: Some(0), ..new.clone() }, t0));
        assert!(written.caught_up("j", &old, t0), "forgotten once seen");
        written.wrote("j", &new, Some("8"), t0);
        assert!(written.caught_up("j", &old, t0 + EXPECTATION_TIMEOUT), "not waited for forever");
    }

    #[test]
    fn no_status_is_written_from_a_cache_older_than_the_last_write() {
        let t0 = Instant::now();
        let written = Written::default();
        let pending = MusterJobStatus { phase: Some(JobPhase::Pending), active: 3, ..Default::default() };
        let running = MusterJobStatus { phase: Some(JobPhase::Running), ready: 3, ..pending.clone() };
        assert!(!written.behind_own_write("j", &running, Some("7"), t0), "nothing written");
        written.wrote("j", &running, Some("12"), t0);
        // The counts are the same: the counts' record is satisfied, the version's is not.
        assert!(written.caught_up("j", &pending, t0));
        for older in ["7", "9", "11"] {
            assert!(written.behind_own_write("j", &running, Some(older), t0), "the cache at {older} lags");
        }
        assert!(!written.behind_own_write("other", &running, Some("7"), t0));
        // Another live count waits too; a count the write did not record never does.
        let ready_2 = MusterJobStatus { ready: 2, ..running.clone() };
        assert!(written.behind_own_write("j", &ready_2, Some("7"), t0), "only the live counts moved");
        let failed = MusterJobStatus { failed: 1, ..running.clone() };
        assert!(!written.behind_own_write("j", &failed, Some("7"), t0), "a failure is written at once");
        written.wrote("j", &running, Some("12"), t0);
        assert!(written.behind_own_write("j", &running, Some("7"), t0 + EXPECTATION_TIMEOUT / 2));
        assert!(!written.behind_own_write("j", &running, Some("7"), t0 + EXPECTATION_TIMEOUT), "not trusted forever");
        // At or past the write's version the cache is the truth again; so without numbers.
        for (cached, made) in [
            (Some("12"), Some("12")),
            (Some("13"), Some("12")),
            (Some("x"), Some("12")),
            (None, Some("12")),
            (Some("7"), None),
            (Some("7"), Some("v2")),
        ] {
            written.wrote("j", &running, made, t0);
            assert!(!written.behind_own_write("j", &running, cached, t0), "{cached:?} after {made:?}");
            assert!(!written.behind_own_write("j", &running, Some("1"), t0), "forgotten");
        }
        written.wrote("j", &running, Some("12"), t0);
        written.forget("j");
        assert!(!written.behind_own_write("j", &running, Some("7"), t0));
    }
}

//! PURE (no client): the pods a job's reconcile created that the pod cache does not show yet
//! (kube's Job controller calls them expectations). The reconcile reads a job's pods from the
//! controller's watch cache, not the API server; until the cache shows every pod it created,
//! a job is not synced again, so a stale cache never makes it create a pod twice.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a created pod is waited for in the cache before the job is synced anyway (a pod
/// deleted right after its create never shows).
pub const EXPECTATION_TIMEOUT: Duration = Duration::from_secs(30);

/// Per job UID: the pods created for it and not seen yet, and when they were created.
#[derive(Debug, Default)]
pub struct Expected(Mutex<HashMap<String, (HashSet<String>, Instant)>>);

impl Expected {
    /// Records the pods just created for a job.
    pub fn created(&self, job: &str, pods: impl IntoIterator<Item = String>, now: Instant) {
        let mut map = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let entry = map.entry(job.to_string()).or_insert_with(|| (HashSet::new(), now));
        entry.0.extend(pods);
        entry.1 = now;
        if entry.0.is_empty() {
            map.remove(job);
        }
    }

    /// Whether the job may be synced: the cache (`cached`, the names of the job's pods it
    /// shows) shows every pod created for it, or they were waited for long enough. Forgets
    /// what it shows.
    pub fn satisfied(&self, job: &str, cached: &HashSet<&str>, now: Instant) -> bool {
        let mut map = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some((pods, at)) = map.get_mut(job) else { return true };
        pods.retain(|p| !cached.contains(p.as_str()));
        if pods.is_empty() || now.duration_since(*at) >= EXPECTATION_TIMEOUT {
            map.remove(job);
            return true;
        }
        false
    }

    /// Forgets a job (deleted).
    pub fn forget(&self, job: &str) {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(job);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_waits_until_the_cache_shows_every_pod_it_created() {
        let t0 = Instant::now();
        let expected = Expected::default();
        assert!(expected.satisfied("j", &HashSet::new(), t0), "nothing created: free to sync");
        expected.created("j", ["a".to_string(), "b".to_string()], t0);
        assert!(!expected.satisfied("j", &HashSet::from(["a"]), t0), "b not seen yet");
        assert!(expected.satisfied("other", &HashSet::new(), t0), "other jobs are not held back");
        assert!(expected.satisfied("j", &HashSet::from(["b"]), t0), "a was seen before, b now");
        assert!(expected.satisfied("j", &HashSet::new(), t0), "forgotten once seen");
    }

    #[test]
    fn a_pod_never_seen_is_waited_for_at_most_the_timeout() {
        let t0 = Instant::now();
        let expected = Expected::default();
        expected.created("j", ["a".to_string()], t0);
        assert!(!expected.satisfied("j", &HashSet::new(), t0 + EXPECTATION_TIMEOUT / 2));
        assert!(expected.satisfied("j", &HashSet::new(), t0 + EXPECTATION_TIMEOUT));
        expected.created("j", ["b".to_string()], t0);
        expected.forget("j");
        assert!(expected.satisfied("j", &HashSet::new(), t0));
    }
}

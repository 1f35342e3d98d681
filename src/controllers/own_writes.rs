//! The version of an object each reconciler's last write made, until its watch cache shows it.
//!
//! A reconcile reads its object from the watch cache; after a write, an event of another object
//! (a child, a pod) may run the next reconcile before the cache shows the write. A decision
//! made from that older object undoes the write: a MusterJobSet whose restart is not cached yet
//! counts it again or makes its old attempt's children again; a MusterJob's first status is
//! stamped twice. [`OwnWrites::lagging`] tells the reconcile to wait for its own write (its
//! watch event runs the object again).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long a write is waited for at most (a watch event that never comes).
pub const OWN_WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Per object (its UID): what the last write recorded (`T`), the version it made, and when.
#[derive(Debug)]
pub struct OwnWrites<T = ()>(Mutex<HashMap<String, Sent<T>>>);

impl<T> Default for OwnWrites<T> {
    fn default() -> Self {
        OwnWrites(Mutex::new(HashMap::new()))
    }
}

#[derive(Debug)]
struct Sent<T> {
    what: T,
    version: Option<u64>,
    at: Instant,
}

impl<T: Clone> OwnWrites<T> {
    /// Records a write to object `uid`: `what` it wrote and the object's `version`
    /// (resourceVersion) after it.
    pub fn wrote(&self, uid: &str, what: T, version: Option<&str>, now: Instant) {
        let sent = Sent { what, version: version.and_then(|v| v.parse().ok()), at: now };
        self.0.lock().unwrap_or_else(PoisonError::into_inner).insert(uid.to_string(), sent);
    }

    /// What the last write recorded while the cache shows the object at a version older than
    /// the one that write made (`cached`). Versions are compared as the numbers the API server
    /// makes them; one that is not a number, a cache at or past the write, or
    /// [`OWN_WRITE_TIMEOUT`] forgets the record: the cache is the truth again.
    pub fn lagging(&self, uid: &str, cached: Option<&str>, now: Instant) -> Option<T> {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let sent = map.get(uid)?;
        let cached = cached.and_then(|v| v.parse::<u64>().ok());
        let lags = matches!((cached, sent.version), (Some(c), Some(w)) if c < w);
        if !lags || now.duration_since(sent.at) >= OWN_WRITE_TIMEOUT {
            map.remove(uid);
            return None;
        }
        Some(sent.what.clone())
    }

    /// Forgets an object (deleted).
    pub fn forget(&self, uid: &str) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cache_older_than_the_last_write_lags_until_it_shows_it_or_the_wait_runs_out() {
        let t0 = Instant::now();
        let writes = OwnWrites::<&str>::default();
        assert_eq!(writes.lagging("a", Some("7"), t0), None, "nothing written");
        writes.wrote("a", "restarts 1", Some("12"), t0);
        for older in ["7", "9", "11"] {
            assert_eq!(writes.lagging("a", Some(older), t0), Some("restarts 1"), "the cache at {older} lags");
        }
        assert_eq!(writes.lagging("b", Some("7"), t0), None, "other objects are not touched");
        assert_eq!(writes.lagging("a", Some("12"), t0), None, "the cache shows the write");
        assert_eq!(writes.lagging("a", Some("7"), t0), None, "forgotten once shown");
        writes.wrote("a", "restarts 1", Some("12"), t0);
        assert!(writes.lagging("a", Some("7"), t0 + OWN_WRITE_TIMEOUT / 2).is_some());
        assert_eq!(writes.lagging("a", Some("7"), t0 + OWN_WRITE_TIMEOUT), None, "not waited for forever");
        // Past the write, or versions that are not numbers: the cache is the truth.
        for (cached, made) in [
            (Some("13"), Some("12")),
            (Some("x"), Some("12")),
            (None, Some("12")),
            (Some("7"), None),
            (Some("7"), Some("v2")),
        ] {
            writes.wrote("a", "w", made, t0);
            assert_eq!(writes.lagging("a", cached, t0), None, "{cached:?} after {made:?}");
            assert_eq!(writes.lagging("a", Some("1"), t0), None, "forgotten");
        }
        writes.wrote("a", "w", Some("12"), t0);
        writes.forget("a");
        assert_eq!(writes.lagging("a", Some("7"), t0), None);
    }
}

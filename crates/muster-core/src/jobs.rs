//! PURE: what muster's job controllers decide, from a job's spec, its status and what exists:
//! - [`job`]: for a MusterJob, the pods to create and delete and the status it reports;
//! - [`set`]: for a MusterJobSet, the child MusterJobs to create and delete and its status;
//! - [`claims`]: the ResourceClaimTemplates and group ResourceClaims a job's pods use.
//!
//! The controllers (`muster::controllers::{job, jobset}`) read the caches, call these, and
//! write what they return.

pub mod claims;
pub mod job;
pub mod set;

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;

/// How often an object refused for a name another owner's object holds (`NameConflict`) is
/// looked at again in the refusal's first [`NAME_CONFLICT_SOON`]. The holder is often an
/// earlier object of the same name, deleted and made again, whose garbage collection removes
/// it within seconds (a pass of the old object read before its deletion showed can even make
/// its group again after the collector removed it): the new object must not wait for an event
/// that never comes. Each look reads the holder again (from a cache, or with a GET); the
/// refusal's status is written once.
pub const NAME_CONFLICT_RETRY: Duration = Duration::from_secs(5);
/// How long a `NameConflict` is looked at every [`NAME_CONFLICT_RETRY`]; after it, every
/// [`NAME_CONFLICT_LATER`] (a name a tenant's own object holds for good costs a read a minute).
pub const NAME_CONFLICT_SOON: Duration = Duration::from_secs(60);
/// How often an older `NameConflict` is looked at again.
pub const NAME_CONFLICT_LATER: Duration = Duration::from_secs(60);

/// PURE: when a job or set refused for `reason`, its `conditions` as written with the refusal,
/// is looked at again by itself: a `NameConflict` every [`NAME_CONFLICT_RETRY`] for
/// [`NAME_CONFLICT_SOON`] after its `Invalid` condition turned true, then every
/// [`NAME_CONFLICT_LATER`]; other refusals wait for a change of the object (`None`).
pub fn refusal_retry(reason: &str, conditions: &[Condition], now: Timestamp) -> Option<Duration> {
    if reason != "NameConflict" {
        return None;
    }
    // A MusterJob's `Invalid` condition, and a MusterJobSet's of the same name.
    let since = crate::conditions::get(conditions, job::condition::INVALID).map_or(now, |c| c.last_transition_time.0);
    // A transition ahead of this clock (clocks apart) counts as a refusal just made.
    let age = if since > now { Duration::ZERO } else { now.duration_since(since).unsigned_abs() };
    Some(if age < NAME_CONFLICT_SOON { NAME_CONFLICT_RETRY } else { NAME_CONFLICT_LATER })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn a_name_conflict_is_looked_at_again_soon_then_seldom_and_other_refusals_wait_for_a_change() {
        let t0 = Timestamp::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let after = |d: Duration| t0 + d;
        let invalid = |since: Timestamp| {
            vec![Condition {
                type_: job::condition::INVALID.into(),
                status: "True".into(),
                reason: "NameConflict".into(),
                message: String::new(),
                last_transition_time: Time(since),
                observed_generation: None,
            }]
        };
        assert_eq!(job::condition::INVALID, set::condition::INVALID, "one condition for both kinds");
        let cases = [
            ("NameConflict", t0, Some(NAME_CONFLICT_RETRY)),
            ("NameConflict", after(NAME_CONFLICT_SOON / 2), Some(NAME_CONFLICT_RETRY)),
            ("NameConflict", after(NAME_CONFLICT_SOON), Some(NAME_CONFLICT_LATER)),
            ("NameConflict", after(NAME_CONFLICT_SOON * 60), Some(NAME_CONFLICT_LATER)),
            ("InvalidSpec", t0, None),
            ("FrozenFieldChanged", after(NAME_CONFLICT_SOON * 2), None),
        ];
        for (reason, now, want) in cases {
            assert_eq!(refusal_retry(reason, &invalid(t0), now), want, "{reason} at {now}");
        }
        // A transition in the future (clocks apart), or no condition, counts as a young refusal.
        assert_eq!(
            refusal_retry("NameConflict", &invalid(after(NAME_CONFLICT_SOON * 2)), t0),
            Some(NAME_CONFLICT_RETRY)
        );
        assert_eq!(refusal_retry("NameConflict", &[], after(NAME_CONFLICT_SOON * 2)), Some(NAME_CONFLICT_RETRY));
    }
}

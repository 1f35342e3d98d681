//! Status conditions, kept the Kubernetes way: one per type, `lastTransitionTime` moves only
//! when the status does. Pure: the caller passes `now`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// Sets condition `type_` to `status` with `reason` and `message`, keeping the transition
/// time when the status is unchanged. Returns true when anything changed.
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: Timestamp,
) -> bool {
    let status = if status { "True" } else { "False" };
    let reason = if reason.is_empty() { "Unknown" } else { reason };
    if let Some(c) = conditions.iter_mut().find(|c| c.type_ == type_) {
        let changed =
            c.status != status || c.reason != reason || c.message != message || c.observed_generation != generation;
        if c.status != status {
            c.last_transition_time = Time(now);
        }
        c.status = status.to_string();
        c.reason = reason.to_string();
        c.message = message.to_string();
        c.observed_generation = generation;
        return changed;
    }
    conditions.push(Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message: message.to_string(),
        observed_generation: generation,
        last_transition_time: Time(now),
    });
    true
}

/// PURE: copies the conditions of `types` from `source` (a native group's, kube-scheduler's)
/// into `conditions` (a type `source` no longer has goes), and returns those whose status or
/// reason changed from `before` (for events).
pub fn mirror(
    conditions: &mut Vec<Condition>,
    source: &[Condition],
    before: &[Condition],
    types: &[&str],
) -> Vec<Condition> {
    conditions.retain(|c| !types.contains(&c.type_.as_str()));
    let mut changed = Vec::new();
    for c in source.iter().filter(|c| types.contains(&c.type_.as_str())) {
        conditions.push(c.clone());
        let old = before.iter().find(|b| b.type_ == c.type_);
        if old.is_none_or(|o| (&o.status, &o.reason) != (&c.status, &c.reason)) {
            changed.push(c.clone());
        }
    }
    changed
}

/// True when condition `type_` is present with status True.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    conditions.iter().any(|c| c.type_ == type_ && c.status == "True")
}

/// The condition of `type_`, if present.
pub fn get<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_moves_only_with_status() {
        let t0 = Timestamp::from_second(100).expect("ts");
        let t1 = Timestamp::from_second(200).expect("ts");
        let mut c = Vec::new();
        assert!(set(&mut c, "Ready", false, "Wait", "waiting", None, t0));
        assert!(set(&mut c, "Ready", false, "Wait", "still waiting", None, t1));
        assert_eq!(c[0].last_transition_time, Time(t0));
        assert!(set(&mut c, "Ready", true, "Done", "", None, t1));
        assert_eq!(c[0].last_transition_time, Time(t1));
        assert!(!set(&mut c, "Ready", true, "Done", "", None, t1));
        assert!(is_true(&c, "Ready"));
        assert_eq!(c.len(), 1);
        assert_eq!(get(&c, "Ready").map(|c| c.reason.as_str()), Some("Done"));
    }
}

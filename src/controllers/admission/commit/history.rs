//! A root's rollback history, kept in its status: read back for the next plans (which nodes
//! they avoid, when the gang backs off) and written as a merge patch when an attempt rolls back.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;

use crate::controllers::admission::GroupRef;
use crate::crds::scheduling::AvoidedNode;
use crate::scheduler::{RollbackHistory, RollbackPolicy};

/// How rollbacks pace roots (see [`RollbackPolicy::DEFAULT`]).
pub(in crate::controllers::admission) const ROLLBACK_POLICY: RollbackPolicy = RollbackPolicy::DEFAULT;

/// A root's rollback history, read from its status fields.
fn history_of(rollbacks: i32, recent: i32, last: Option<&Time>, avoid: &[AvoidedNode]) -> RollbackHistory {
    RollbackHistory {
        count: u32::try_from(rollbacks).unwrap_or(0),
        recent: u32::try_from(recent).unwrap_or(0),
        last: last.map(|t| t.0),
        avoid: avoid.iter().map(|a| (a.node.clone(), a.until.0)).collect(),
    }
}

/// The status fields (a merge patch) that record a root's rollback history.
pub(super) fn history_status(h: &RollbackHistory) -> serde_json::Value {
    let avoid: Vec<AvoidedNode> =
        h.avoid.iter().map(|(node, until)| AvoidedNode { node: node.clone(), until: Time(*until) }).collect();
    json!({
        "rollbacks": i32::try_from(h.count).unwrap_or(i32::MAX),
        "recentRollbacks": i32::try_from(h.recent).unwrap_or(i32::MAX),
        "lastRollbackTime": h.last.map(Time),
        "avoidNodes": avoid,
    })
}

impl GroupRef<'_> {
    /// What the root's status remembers of its rollbacks.
    pub(in crate::controllers::admission) fn history(&self) -> RollbackHistory {
        match self {
            GroupRef::Leaf(pg) => pg
                .status
                .as_ref()
                .map(|s| history_of(s.rollbacks, s.recent_rollbacks, s.last_rollback_time.as_ref(), &s.avoid_nodes)),
            GroupRef::Composite(c) => c
                .status
                .as_ref()
                .map(|s| history_of(s.rollbacks, s.recent_rollbacks, s.last_rollback_time.as_ref(), &s.avoid_nodes)),
        }
        .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    #[test]
    fn the_rollback_history_round_trips_through_the_status() {
        let mut h = RollbackHistory::default();
        let t = Timestamp::from_second(1_000_000).expect("ts");
        h.record(&["n1".to_string()].into(), t, &ROLLBACK_POLICY);
        let patch = history_status(&h);
        let status: crate::crds::scheduling::PodGroupStatus = serde_json::from_value(patch).expect("status");
        assert_eq!((status.rollbacks, status.recent_rollbacks), (1, 1));
        let back = history_of(
            status.rollbacks,
            status.recent_rollbacks,
            status.last_rollback_time.as_ref(),
            &status.avoid_nodes,
        );
        assert_eq!(back, h);
    }
}

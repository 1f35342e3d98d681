//! The rollback memory of a root: which nodes the next plans avoid and until when
//! ([`RollbackHistory`]), and when repeated rollbacks make the gang unschedulable
//! ([`RollbackPolicy`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::plus;

/// How rollbacks pace a root: how long failed nodes are avoided, and when repeated rollbacks
/// make the gang unschedulable for a while.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RollbackPolicy {
    /// How long the first rollback avoids its nodes; doubled for each recent one after.
    pub avoid_for: Duration,
    /// The longest a node is avoided.
    pub max_avoid: Duration,
    /// Rollbacks less than this apart count as recent (one streak).
    pub window: Duration,
    /// Recent rollbacks after which the gang is unschedulable until [`RollbackHistory::retry_at`].
    pub unschedulable_after: u32,
    /// The first wait once unschedulable; doubled for each recent rollback after.
    pub retry_backoff: Duration,
}

impl RollbackPolicy {
    /// Avoid for 5 minutes, doubled per recent rollback up to an hour; 3 rollbacks less than
    /// 10 minutes apart make the gang unschedulable for a minute, doubled per rollback after.
    pub const DEFAULT: Self = Self {
        avoid_for: Duration::from_secs(5 * 60),
        max_avoid: Duration::from_secs(60 * 60),
        window: Duration::from_secs(10 * 60),
        unschedulable_after: 3,
        retry_backoff: Duration::from_secs(60),
    };
}

impl Default for RollbackPolicy {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// What a root remembers of its rollbacks (the shell keeps it on the root's status, so a
/// restart or a new leader keeps avoiding the same nodes).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RollbackHistory {
    /// Rollbacks of the root so far: the gang attempt number of pods created after them.
    pub count: u32,
    /// Rollbacks in the current streak (each less than `window` after the one before).
    pub recent: u32,
    /// When the last one happened.
    pub last: Option<Timestamp>,
    /// Node name -> until when placement avoids it.
    pub avoid: BTreeMap<String, Timestamp>,
}

/// `base * 2^exp`, at most `max`.
fn doubled(base: Duration, exp: u32, max: Duration) -> Duration {
    base.saturating_mul(1u32 << exp.min(20)).min(max)
}

impl RollbackHistory {
    /// Records a rollback at `now` whose pins failed on `nodes`; forgets expired avoidances.
    pub fn record(&mut self, nodes: &BTreeSet<String>, now: Timestamp, policy: &RollbackPolicy) {
        let in_streak = self.last.is_some_and(|last| now < plus(last, policy.window));
        self.recent = if in_streak { self.recent.saturating_add(1) } else { 1 };
        self.count = self.count.saturating_add(1);
        self.last = Some(now);
        let until = plus(now, doubled(policy.avoid_for, self.recent - 1, policy.max_avoid));
        for node in nodes {
            let entry = self.avoid.entry(node.clone()).or_insert(until);
            *entry = (*entry).max(until);
        }
        self.avoid.retain(|_, until| *until > now);
    }

    /// The nodes placement avoids at `now`.
    pub fn avoided(&self, now: Timestamp) -> BTreeSet<String> {
        self.avoid.iter().filter(|(_, until)| **until > now).map(|(n, _)| n.clone()).collect()
    }

    /// When a gang with too many recent rollbacks may be planned again; `None` while the streak
    /// is short of [`RollbackPolicy::unschedulable_after`].
    pub fn retry_at(&self, policy: &RollbackPolicy) -> Option<Timestamp> {
        let last = self.last?;
        let over = self.recent.checked_sub(policy.unschedulable_after.max(1))?;
        Some(plus(last, doubled(policy.retry_backoff, over, policy.max_avoid)))
    }

    /// True when rollbacks came so often that the gang waits, unschedulable, until `retry_at`.
    pub fn unschedulable(&self, now: Timestamp, policy: &RollbackPolicy) -> bool {
        self.retry_at(policy).is_some_and(|at| now < at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::commit::fixtures::{at, nodes};

    #[test]
    fn rollbacks_avoid_nodes_with_backoff_and_then_make_the_gang_unschedulable() {
        let policy = RollbackPolicy::default();
        let mut h = RollbackHistory::default();
        struct Round {
            name: &'static str,
            at: i64,
            nodes: &'static [&'static str],
            recent: u32,
            avoided_until: &'static [(&'static str, i64)],
            retry_at: Option<i64>,
        }
        let steps = [
            Round {
                name: "first rollback avoids its node for 5 minutes",
                at: 0,
                nodes: &["n1"],
                recent: 1,
                avoided_until: &[("n1", 300)],
                retry_at: None,
            },
            Round {
                name: "a second within the window doubles it",
                at: 100,
                nodes: &["n2"],
                recent: 2,
                avoided_until: &[("n1", 300), ("n2", 700)],
                retry_at: None,
            },
            Round {
                name: "a third makes the gang unschedulable for the retry backoff",
                at: 200,
                nodes: &["n1"],
                recent: 3,
                avoided_until: &[("n1", 1400), ("n2", 700)],
                retry_at: Some(260),
            },
            Round {
                name: "a fourth doubles the retry backoff; expired avoidances are forgotten",
                at: 790,
                nodes: &["n3"],
                recent: 4,
                avoided_until: &[("n1", 1400), ("n3", 790 + 2400)],
                retry_at: Some(910),
            },
            Round {
                name: "after a quiet window the streak starts again",
                at: 790 + 600,
                nodes: &["n4"],
                recent: 1,
                avoided_until: &[("n1", 1400), ("n3", 3190), ("n4", 1390 + 300)],
                retry_at: None,
            },
        ];
        for (i, s) in steps.iter().enumerate() {
            h.record(&nodes(s.nodes), at(s.at), &policy);
            assert_eq!(h.count, i as u32 + 1, "{}", s.name);
            assert_eq!(h.recent, s.recent, "{}", s.name);
            let want: BTreeMap<String, Timestamp> =
                s.avoided_until.iter().map(|(n, t)| (n.to_string(), at(*t))).collect();
            assert_eq!(h.avoid, want, "{}", s.name);
            assert_eq!(h.retry_at(&policy), s.retry_at.map(at), "{}", s.name);
            assert_eq!(h.unschedulable(at(s.at), &policy), s.retry_at.is_some(), "{}", s.name);
        }
        assert_eq!(h.avoided(at(1500)), nodes(&["n3", "n4"]));
        assert_eq!(h.avoided(at(3189)), nodes(&["n3"]));
    }
}

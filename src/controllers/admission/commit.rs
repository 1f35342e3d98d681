//! The commit protocol, carried out: record a plan, patch each pod once (pin, GPU indices,
//! gate removal), then follow the recorded plan. What to do with a recorded plan (resume, wait
//! for binds, roll a failed attempt back, fail a gang that started) is the core's
//! [`scheduler::next_step`]; this module gathers its inputs and carries the step out.
//!
//! - `job`: a decision carried out (the commit job, its dry run, claim writes and pod patches,
//!   the resume of a commit cut short, the booking of one that went through);
//! - `follow`: a recorded plan followed across cycles (its pods as they are now, the next step);
//! - `failure`: a failed attempt rolled back, a started gang failed or disrupted;
//! - `plan`: the plan record in the group's status (written, cleared, cleared in batches);
//! - `history`: the rollback history in the group's status.
//!
//! Calls go one way: `follow` calls `job`, `failure` and `plan`; `failure` calls `plan` and
//! `history`; `job` calls `plan`; `plan` and `history` call none of the others. What the
//! protocol reads of a root group (its resourceVersion, disruption mode and preemption policy)
//! is `GroupRef`'s, in the admission root.
//!
//! [`scheduler::next_step`]: crate::scheduler::next_step

mod failure;
mod follow;
mod history;
mod job;
mod plan;

#[cfg(test)]
mod fixtures;

pub(super) use history::ROLLBACK_POLICY;
pub(super) use job::{CommitJob, Committed, admitted_status, prepare_commit, reserve};
pub(super) use plan::Cached;

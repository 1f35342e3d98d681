//! PURE: the commit protocol's decisions. From a recorded [`AdmissionPlan`], the plan's pods as
//! they are now, `now` and the bind timeout, [`next_step`] says what the shell does next:
//! resume the patches, wait, clear the plan, roll the attempt back, or fail a gang that did
//! start. Also the rollback memory of a root ([`RollbackHistory`]): which nodes the next plans
//! avoid, until when, and when repeated rollbacks make the gang unschedulable.
//! No client, no clock: the shell reads the pods and carries the step out.
//!
//! [`AdmissionPlan`]: muster_api::scheduling::AdmissionPlan

mod disruption;
mod failure;
mod pins;
mod remaining;
mod rollbacks;
mod step;

#[cfg(test)]
mod fixtures;

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

pub use disruption::{Disrupted, disrupted};
pub use failure::{FailureCause, PinFailure};
pub use pins::{PinState, PlannedPodNow, Refusal, StartRequirement};
pub use remaining::{GatedPin, GroupCount, RemainingFits, remaining_fits};
pub use rollbacks::{RollbackHistory, RollbackPolicy};
pub use step::{CommitInput, PatchRefused, RollBack, Step, next_step};

/// `t + d`, or the latest timestamp when that overflows (shared by the bind deadline and the
/// rollback memory).
fn plus(t: Timestamp, d: Duration) -> Timestamp {
    SignedDuration::try_from(d).ok().and_then(|d| t.checked_add(d).ok()).unwrap_or(Timestamp::MAX)
}

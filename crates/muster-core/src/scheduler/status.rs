//! PURE: what a gang's PodGroup and CompositePodGroup statuses say, decided from the cycle's
//! outcome for its root ([`Outcome`]), its pods and its children; and when and how a changed
//! status is written. The admission controller only writes what this decides.
//!
//! - [`outcome`](Outcome): what the cycle concluded about a root;
//! - `group`: the status of a PodGroup ([`pod_group_status`]) and of a CompositePodGroup
//!   ([`composite_status`]);
//! - `write`: the pace of status writes and the patch that clears a plan with the status.

mod group;
mod outcome;
mod write;

#[cfg(test)]
mod tests;

pub use group::*;
pub use outcome::*;
pub use write::*;

//! PURE: gangs as `kubectl muster` shows them. muster's root PodGroups and CompositePodGroups,
//! the native `scheduling.k8s.io` ones (upstream mode), and the jobs that own them, reduced to
//! one [`Gang`] each; a gang's phase, wait and short reason; the `list` table. No client and no
//! clock: the shell passes the objects it listed and `now`.
//!
//! One concern per file:
//! - `gang`: what a gang is: its kind, its pods, its child groups;
//! - `owner`: the job owning a gang, and what it says of itself;
//! - `build`: the listed objects reduced to gangs;
//! - `phase`: where a gang stands: its phase, its wait, its reason;
//! - `table`: the `list` rows and their table;
//! - `find`: the gang a name on the command line stands for.

mod build;
mod find;
#[cfg(test)]
mod fixtures;
mod gang;
mod owner;
mod phase;
mod table;

pub use build::{ADMITTED, COMPOSITE_SCHEDULED, Objects, POD_GROUP_SCHEDULED, gangs};
pub use find::{Target, find};
pub use gang::{Gang, GangKind, GroupCounts, Phase, PodCounts};
pub use owner::{JobSays, Owner, job_says, set_says};
pub use table::{Row, human, rows, table};

//! Gang placement: one decision places a whole root on a snapshot (upstream's pod group
//! scheduling cycle with PlacementFeasible), all-or-nothing per gang, and returns a plan or an
//! explanation. Identical pods are placed by capacity arithmetic (how many fit on each node,
//! then fill nodes in score order), not by one search per pod. The snapshot is never changed:
//! tentative usage lives in an overlay with an undo log, so a failed gang releases what it took.
//!
//! What a decision guarantees (property-tested in `properties.rs`):
//! - no partial gang: a gang PodGroup in the plan has at least `minCount` pods placed or
//!   admitted before, a gang CompositePodGroup at least `minGroupCount` such children;
//! - no node over its allocatable in any resource, counting what it already runs, and no GPU
//!   index given twice or given while in use;
//! - a gang that fails leaves no trace: the plan is exactly the plan of the same root without
//!   that gang. Within a composite, gang children are tried before basic ones, so a basic
//!   group is only ever limited by gangs that succeed and by its own ancestors (a basic
//!   PodGroup under a gang composite that fails is rolled back with it).

mod capacity;
mod decision;
mod domains;
mod fill;
mod gpus;
mod groups;
mod overlay;
mod pods;
mod reasons;
mod scan;

pub use decision::{Admission, Decision, PlaceOptions, PlacedPod, Scoring, decide, place};
pub use groups::{Feasibility, placement_feasible};

// The engine's vocabulary, which the job files share.
use groups::Attempt;
use overlay::{Avoid, Engine, Tentative};
use pods::{Facts, PodLevel};
use reasons::{ReasonKey, Tally};
use scan::{Candidate, Scan, by_score};

#[cfg(test)]
mod tests;

#[cfg(test)]
mod interpod_tests;

#[cfg(test)]
mod dra_tests;

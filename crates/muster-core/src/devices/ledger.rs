//! The GPU ledger: which GPU index on which node belongs to which pod, and the
//! `gpu.muster.dev/indices` annotation it is rebuilt from. Plain data in, problems out as
//! values; watching pods and writing annotations is the device reconciler's job.
//!
//! The ledger errs on the side of holding: a live pod keeps every GPU its annotation names
//! unless an older live pod holds it, even when the node no longer has that index, so a GPU
//! is never offered to a second pod while the first may still use it.
//!
//! Its parts: the annotation's spelling (`annotation`), what the ledger reads of a pod (`pod`),
//! the ledger itself and how pod records become its claims (`claims`), what it refuses or
//! reports (`problems`), and the ledger kept across passes (`kept`).

mod annotation;
mod claims;
mod kept;
mod pod;
mod problems;
#[cfg(test)]
mod test_support;

pub use annotation::{IndicesError, format_indices, parse_indices};
pub use claims::{Claim, Ledger};
pub use kept::KeptLedger;
pub use pod::{PodPhase, PodRecord};
pub use problems::{Conflict, LedgerProblem};

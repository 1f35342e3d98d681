//! What the ledger refuses (a [`Conflict`] on assignment) and what it reports of a pod record
//! it cannot take as it stands ([`LedgerProblem`]).

use super::{Claim, IndicesError};
use crate::devices::gpuset::GpuSet;

/// An assignment the ledger refused; nothing was recorded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Conflict {
    /// Some of the GPUs belong to other live pods.
    #[error("pod {pod_uid} claims GPUs {wanted} on node {node}, but {}", describe_held(held))]
    IndexHeld {
        /// The node.
        node: String,
        /// The pod that asked.
        pod_uid: String,
        /// What it asked for.
        wanted: GpuSet,
        /// Each contested index with the pod holding it.
        held: Vec<(usize, String)>,
    },
    /// The pod already holds a different set of GPUs (a pod's GPUs never move).
    #[error(
        "pod {pod_uid} claims GPUs {wanted} on node {node} but already holds {} on node {}",
        held.gpus,
        held.node
    )]
    AlreadyAssigned {
        /// The node asked for.
        node: String,
        /// The pod.
        pod_uid: String,
        /// What it asked for.
        wanted: GpuSet,
        /// What it holds.
        held: Claim,
    },
}

fn describe_held(held: &[(usize, String)]) -> String {
    let parts: Vec<String> = held.iter().map(|(i, uid)| format!("GPU {i} is held by pod {uid}")).collect();
    parts.join(", ")
}

/// What the ledger could not take as it stands from a pod record.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LedgerProblem {
    /// Two live pods claim the same GPU: the older keeps it, the later pod keeps only the GPUs
    /// nobody else holds.
    #[error(transparent)]
    Conflict(#[from] Conflict),
    /// The annotation cannot be read at all; the pod holds nothing in the ledger.
    #[error("pod {uid} on node {node}: gpu.muster.dev/indices: {error}")]
    BadAnnotation {
        /// The pod.
        uid: String,
        /// Its node.
        node: String,
        /// Why the value was refused.
        error: IndicesError,
    },
    /// The annotation names GPUs the node does not have (now): they stay held by the pod, so
    /// nothing else is given them should they come back.
    #[error("pod {uid} holds GPU indices {beyond} on node {node}, which has {count} GPUs now; they stay held")]
    BeyondNode {
        /// The pod.
        uid: String,
        /// Its node.
        node: String,
        /// The indices the node does not have.
        beyond: GpuSet,
        /// GPUs on the node.
        count: usize,
    },
    /// A pod with GPU indices but no node.
    #[error("pod {uid} has gpu.muster.dev/indices but no node")]
    NoNode {
        /// The pod.
        uid: String,
    },
}

impl LedgerProblem {
    /// The pod the problem is about.
    pub fn pod_uid(&self) -> &str {
        match self {
            LedgerProblem::Conflict(
                Conflict::IndexHeld { pod_uid, .. } | Conflict::AlreadyAssigned { pod_uid, .. },
            ) => pod_uid,
            LedgerProblem::BadAnnotation { uid, .. }
            | LedgerProblem::BeyondNode { uid, .. }
            | LedgerProblem::NoNode { uid } => uid,
        }
    }
}

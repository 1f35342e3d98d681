//! Pod records and GPU sets for the ledger's tests.

use k8s_openapi::jiff::Timestamp;

use super::{PodPhase, PodRecord};
use crate::devices::gpuset::GpuSet;

pub(super) fn set(indices: &[usize]) -> GpuSet {
    GpuSet::from_indices(indices.iter().copied()).unwrap_or_default()
}

pub(super) fn record<'a>(node: &'a str, uid: &'a str, indices: Option<&'a str>, phase: PodPhase) -> PodRecord<'a> {
    PodRecord {
        node,
        uid,
        created: Some(Timestamp::UNIX_EPOCH),
        indices,
        phase,
        bound: !node.is_empty(),
        terminating: false,
        node_gpus: 8,
        confirmed: false,
    }
}

pub(super) fn created(record: PodRecord<'_>, secs: i64) -> PodRecord<'_> {
    PodRecord { created: Timestamp::from_second(secs).ok(), ..record }
}

pub(super) const PODS: [&str; 12] = ["p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7", "p8", "p9", "p10", "p11"];

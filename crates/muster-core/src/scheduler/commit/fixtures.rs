//! Test helpers the commit protocol's job files share: times, node sets, pin failures.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::failure::{FailureCause, PinFailure};

pub(super) const TIMEOUT: Duration = Duration::from_secs(60);

pub(super) fn at(s: i64) -> Timestamp {
    Timestamp::from_second(1_000_000 + s).expect("timestamp")
}

pub(super) fn nodes(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| n.to_string()).collect()
}

pub(super) fn failure(pod: &str, node: &str, cause: FailureCause, unbound: usize, planned: usize) -> PinFailure {
    PinFailure { pod: pod.into(), node: node.into(), cause, scheduler_message: None, unbound, planned }
}

//! Test helpers the commit protocol's job files share: a planned pod.

use crate::crds::scheduling::PlannedPod;

pub(super) fn planned(uid: &str, group: &str, node: &str) -> PlannedPod {
    PlannedPod { name: uid.into(), uid: uid.into(), pod_group: group.into(), node: node.into(), ..Default::default() }
}

//! Where a gang stands: its phase (the job's word first, then the group's), how long it has
//! waited, and why, in a word or two.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::gang::{Gang, GangKind, Phase};
use crate::why::top_reason;
use muster_api::scheduling::GroupPhase;

impl Gang {
    /// Where the gang stands: the job's word first (suspended, invalid, done), then the
    /// group's own phase (muster's) or kube-scheduler's verdict (native).
    pub fn phase(&self) -> Phase {
        if let Some(says) = self.owner.as_ref().and_then(|o| o.says.as_ref()) {
            return says.phase;
        }
        match self.kind {
            GangKind::PodGroup | GangKind::CompositePodGroup => match self.group_phase {
                None | Some(GroupPhase::Pending) => Phase::Waiting,
                Some(GroupPhase::Unschedulable) => Phase::Unschedulable,
                Some(GroupPhase::Admitted) => Phase::Admitted,
                Some(GroupPhase::Running) => Phase::Running,
                Some(GroupPhase::Succeeded) => Phase::Finished,
                Some(GroupPhase::Failed) => Phase::Failed,
            },
            GangKind::NativePodGroup | GangKind::NativeCompositePodGroup => self.native_phase(),
        }
    }

    fn native_phase(&self) -> Phase {
        let p = &self.pods;
        match &self.verdict {
            Some(c) if c.status == "True" => {
                if p.running > 0 {
                    Phase::Running
                } else if p.live == 0 && p.succeeded >= p.min.max(1) {
                    Phase::Finished
                } else {
                    Phase::Admitted
                }
            }
            Some(c) if c.reason == "Unschedulable" => Phase::Unschedulable,
            Some(_) => Phase::Waiting,
            // kube-scheduler may write no verdict on a composite: its children's say.
            None if !self.children.is_empty() => {
                let phases: Vec<Phase> = self.children.iter().map(Gang::phase).collect();
                let started = |ph: &Phase| matches!(ph, Phase::Admitted | Phase::Running | Phase::Finished);
                if phases.contains(&Phase::Unschedulable) {
                    Phase::Unschedulable
                } else if !phases.iter().all(started) {
                    Phase::Waiting
                } else if phases.contains(&Phase::Running) {
                    Phase::Running
                } else if phases.iter().all(|ph| *ph == Phase::Finished) {
                    Phase::Finished
                } else {
                    Phase::Admitted
                }
            }
            None => Phase::Waiting,
        }
    }

    /// Why, in a word or two: for a gang that does not fit, the per-node reason that kept it
    /// out (`Insufficient nvidia.com/gpu`); otherwise the reason of the job's or the group's
    /// verdict (`WaitingForQuorum`, `JobSuspended`, `BindTimeout`); `-` for a gang that is fine.
    pub fn reason(&self) -> String {
        if let Some(says) = self.owner.as_ref().and_then(|o| o.says.as_ref()) {
            return says.reason.clone();
        }
        let phase = self.phase();
        if matches!(phase, Phase::Unschedulable | Phase::Waiting | Phase::Failed) {
            // muster's own word first; a native group's is read from kube-scheduler's message.
            if let Some(reason) = self.group_reason.as_ref().filter(|r| !r.is_empty()) {
                return reason.clone();
            }
            if let Some(top) = top_reason(&self.message) {
                return top;
            }
        }
        if matches!(phase, Phase::Unschedulable) {
            for child in &self.children {
                if let Some(top) = top_reason(&child.message) {
                    return top;
                }
            }
        }
        let verdict = self.verdict.as_ref().map(|c| c.reason.as_str()).filter(|r| !r.is_empty());
        match (phase, verdict) {
            // The usual verdicts of a gang that started say nothing the phase does not.
            (Phase::Admitted | Phase::Running | Phase::Finished, Some("Admitted" | "Scheduled")) => "-".into(),
            (_, Some(reason)) => reason.into(),
            (Phase::Waiting, None) if self.pods.live < self.pods.min => "WaitingForQuorum".into(),
            _ => "-".into(),
        }
    }

    /// How long the gang has waited, while it waits (Waiting, Unschedulable): since its
    /// verdict turned False (so a gang that started and fell back counts from then), or since
    /// the group was made.
    pub fn waiting(&self, now: Timestamp) -> Option<Duration> {
        if !matches!(self.phase(), Phase::Waiting | Phase::Unschedulable) {
            return None;
        }
        let since = match &self.verdict {
            Some(c) if c.status == "False" => Some(c.last_transition_time.0),
            _ => self.created,
        }?;
        Some(now.duration_since(since).try_into().unwrap_or(Duration::ZERO))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gangs::fixtures::{at, cond, group, job, status};
    use crate::gangs::{ADMITTED, Objects, gangs};
    use muster_api::batch::JobPhase;
    use muster_api::scheduling::PodGroupStatus;

    const TOO_BIG: &str = "4/40 nodes fit 17 pods of group \"too-big\" (only 4 placeable, minCount 17): \
                           36 node(s) didn't match Pod's node affinity/selector, 4 Insufficient nvidia.com/gpu";

    #[test]
    fn phases_and_reasons_come_from_the_job_first_then_the_group() {
        let now = at(192);
        let cases = [
            (
                "a gang that does not fit names the per-node reason, not the node selector",
                group(
                    "too-big",
                    17,
                    status(
                        GroupPhase::Unschedulable,
                        cond(ADMITTED, "False", "Unschedulable", TOO_BIG, 0),
                        TOO_BIG,
                        (17, 0, 0),
                    ),
                ),
                vec![],
                ("Unschedulable", "0/17", "3m12s", "Insufficient nvidia.com/gpu"),
            ),
            (
                "a gang that does not fit, with admission's own word for why",
                group(
                    "wide",
                    9,
                    PodGroupStatus {
                        reason: Some("InsufficientCapacity".into()),
                        ..status(
                            GroupPhase::Unschedulable,
                            cond(ADMITTED, "False", "Unschedulable", TOO_BIG, 0),
                            TOO_BIG,
                            (9, 0, 0),
                        )
                    },
                ),
                vec![],
                ("Unschedulable", "0/9", "3m12s", "InsufficientCapacity"),
            ),
            (
                "a gang short of its quorum waits for it",
                group(
                    "short",
                    3,
                    status(
                        GroupPhase::Pending,
                        cond(ADMITTED, "False", "WaitingForQuorum", "waiting for quorum", 60),
                        "waiting for quorum: group \"short\" has 1 pod(s), needs 3",
                        (1, 0, 0),
                    ),
                ),
                vec![],
                ("Waiting", "0/3", "2m12s", "WaitingForQuorum"),
            ),
            (
                "a running gang has nothing to say",
                group(
                    "train",
                    2,
                    status(GroupPhase::Running, cond(ADMITTED, "True", "Admitted", "placed", 5), "placed", (2, 2, 2)),
                ),
                vec![],
                ("Running", "2/2", "-", "-"),
            ),
            (
                "an admitted gang that lost its binds says so",
                group(
                    "lost",
                    2,
                    status(
                        GroupPhase::Failed,
                        cond(ADMITTED, "False", "BindTimeout", "pod lost-0 was not bound", 5),
                        "pod lost-0 was not bound to node n within 30s; 1 of 2 planned pod(s) unbound",
                        (2, 1, 0),
                    ),
                ),
                vec![],
                ("Failed", "1/2", "-", "BindTimeout"),
            ),
            (
                "a suspended job's gang is suspended, whatever the group says",
                group(
                    "paused",
                    2,
                    status(GroupPhase::Pending, cond(ADMITTED, "False", "WaitingForQuorum", "", 5), "", (0, 0, 0)),
                ),
                vec![job("paused", JobPhase::Suspended, vec![cond("Suspended", "True", "JobSuspended", "", 9)])],
                ("Suspended", "0/2", "-", "JobSuspended"),
            ),
            (
                "a completed job's gang is finished",
                group(
                    "done",
                    1,
                    PodGroupStatus { phase: Some(GroupPhase::Succeeded), succeeded: 2, ..Default::default() },
                ),
                vec![job("done", JobPhase::Complete, vec![cond("Complete", "True", "Completed", "2/2", 9)])],
                ("Finished", "2/1", "-", "Completed"),
            ),
            (
                "a group without status yet waits since it was made",
                group("new", 2, PodGroupStatus::default()),
                vec![],
                ("Waiting", "0/2", "3m12s", "WaitingForQuorum"),
            ),
        ];
        for (case, pg, jobs, (phase, pods, waiting, reason)) in cases {
            let objects = Objects { pod_groups: vec![pg], jobs, ..Default::default() };
            let gangs = gangs(&objects);
            assert_eq!(gangs.len(), 1, "{case}");
            let row = gangs[0].row(now);
            assert_eq!(
                (row.phase.as_str(), row.pods.as_str(), row.waiting.as_str(), row.reason.as_str()),
                (phase, pods, waiting, reason),
                "{case}"
            );
        }
    }
}

//! What a gang is: a root group with its kind, its owning job, its pods and its child groups,
//! as one record ([`Gang`]).

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;

use super::Owner;
use muster_api::scheduling::GroupPhase;

/// What a gang is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GangKind {
    /// muster's PodGroup.
    PodGroup,
    /// muster's CompositePodGroup.
    CompositePodGroup,
    /// A `scheduling.k8s.io` PodGroup, admitted by kube-scheduler.
    NativePodGroup,
    /// A `scheduling.k8s.io` CompositePodGroup, admitted by kube-scheduler.
    NativeCompositePodGroup,
}

impl GangKind {
    /// Admitted by kube-scheduler (upstream mode) rather than by muster.
    pub fn upstream(self) -> bool {
        matches!(self, GangKind::NativePodGroup | GangKind::NativeCompositePodGroup)
    }

    /// The kind as `kubectl get` spells it unambiguously.
    pub fn resource(self) -> &'static str {
        match self {
            GangKind::PodGroup => "podgroup.scheduling.muster.dev",
            GangKind::CompositePodGroup => "compositepodgroup.scheduling.muster.dev",
            GangKind::NativePodGroup => "podgroup.scheduling.k8s.io",
            GangKind::NativeCompositePodGroup => "compositepodgroup.scheduling.k8s.io",
        }
    }
}

/// Where a gang stands, in one word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for quorum or for its admission decision.
    Waiting,
    /// Quorate, but does not fit.
    Unschedulable,
    /// Admitted (muster pinned and ungated it, or kube-scheduler scheduled it), not running yet.
    Admitted,
    /// Its pods run.
    Running,
    /// Done: its job completed, or every pod succeeded.
    Finished,
    /// Its job failed, or the gang failed (bind timeout, pods failed).
    Failed,
    /// Its job is suspended (`spec.suspend`).
    Suspended,
    /// Its job's spec is invalid; nothing runs.
    Invalid,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Counts of a gang's pods (for a composite, over all its PodGroups).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodCounts {
    /// Pods that exist and have not finished.
    pub live: i32,
    /// Of those, pods still gated.
    pub gated: i32,
    /// Pods that got a node: bound and live, or succeeded.
    pub bound: i32,
    /// Pods running.
    pub running: i32,
    /// Pods that succeeded.
    pub succeeded: i32,
    /// Pods that failed.
    pub failed: i32,
    /// Pods needed before any starts: `minCount` (1 for a basic group; summed over a
    /// composite's PodGroups).
    pub min: i32,
}

impl std::ops::AddAssign for PodCounts {
    fn add_assign(&mut self, o: Self) {
        self.live += o.live;
        self.gated += o.gated;
        self.bound += o.bound;
        self.running += o.running;
        self.succeeded += o.succeeded;
        self.failed += o.failed;
        self.min += o.min;
    }
}

/// A composite's quorum: child groups that exist, that are quorate, and how many it needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupCounts {
    /// Child groups that exist.
    pub children: i32,
    /// Child groups that are quorate (muster's count; native: unknown, 0).
    pub quorate: i32,
    /// `minGroupCount` (1 for basic).
    pub min: i32,
}

/// One gang: a root group, its owning job and its child groups.
#[derive(Clone, Debug, PartialEq)]
pub struct Gang {
    /// What it is.
    pub kind: GangKind,
    /// Namespace.
    pub namespace: String,
    /// Name of the group.
    pub name: String,
    /// The MusterJob or MusterJobSet it belongs to (none for a bring-your-own group).
    pub owner: Option<Owner>,
    /// When the group was made.
    pub created: Option<Timestamp>,
    /// muster's `status.phase` (none for native groups, and before the first status).
    pub group_phase: Option<GroupPhase>,
    /// muster's `status.reason`, the word admission gives for why it waits or failed (none
    /// for native groups, and once all is well).
    pub group_reason: Option<String>,
    /// The verdict: muster's `Admitted` condition, kube-scheduler's `*InitiallyScheduled`.
    pub verdict: Option<Condition>,
    /// Why it is where it is: muster's `status.message`, or the verdict's message.
    pub message: String,
    /// Its pods.
    pub pods: PodCounts,
    /// A composite's quorum.
    pub groups: Option<GroupCounts>,
    /// Its child groups, for `why`.
    pub children: Vec<Gang>,
}

pub(super) fn holds(gang: &Gang, test: &dyn Fn(&&Gang) -> bool) -> bool {
    test(&gang) || gang.children.iter().any(|c| holds(c, test))
}

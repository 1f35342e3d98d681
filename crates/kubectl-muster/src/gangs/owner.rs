//! The MusterJob or MusterJobSet owning a gang, and what it says of itself where that decides
//! the gang's phase (suspended, invalid, finished, failed).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};

use super::Phase;
use super::build::{Objects, condition, namespace_of};
use muster_api::batch::{JobPhase, JobSetPhase};
use muster_api::{MusterJob, MusterJobSet};

/// What the owning job says of itself where that decides the gang's phase (suspended,
/// invalid, finished, failed): the phase, and the job condition's reason and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobSays {
    /// The gang's phase because of it.
    pub phase: Phase,
    /// The job condition's reason (`JobSuspended`, `BackoffLimitExceeded`, ...).
    pub reason: String,
    /// The job condition's message.
    pub message: String,
}

/// The MusterJob or MusterJobSet owning a gang.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// `MusterJob` or `MusterJobSet`.
    pub kind: String,
    /// Its name.
    pub name: String,
    /// What it says of itself, when that decides the phase.
    pub says: Option<JobSays>,
}

fn said(phase: Phase, conditions: &[Condition], type_: &str, fallback: &str) -> Option<JobSays> {
    let c = condition(conditions, type_).filter(|c| c.status == "True");
    Some(JobSays {
        phase,
        reason: c.as_ref().map(|c| c.reason.clone()).filter(|r| !r.is_empty()).unwrap_or_else(|| fallback.into()),
        message: c.map(|c| c.message).unwrap_or_default(),
    })
}

/// What a MusterJob says of itself, where that decides its gang's phase.
pub fn job_says(job: &MusterJob) -> Option<JobSays> {
    let status = job.status.as_ref()?;
    let c = &status.conditions;
    match status.phase? {
        JobPhase::Suspended => said(Phase::Suspended, c, "Suspended", "JobSuspended"),
        JobPhase::Invalid => said(Phase::Invalid, c, "Invalid", "Invalid"),
        JobPhase::Complete => said(Phase::Finished, c, "Complete", "Completed"),
        JobPhase::Failed => said(Phase::Failed, c, "Failed", "Failed"),
        JobPhase::Pending | JobPhase::Running => None,
    }
}

/// What a MusterJobSet says of itself, where that decides its gang's phase.
pub fn set_says(set: &MusterJobSet) -> Option<JobSays> {
    let status = set.status.as_ref()?;
    let c = &status.conditions;
    match status.phase? {
        JobSetPhase::Suspended => said(Phase::Suspended, c, "Suspended", "JobSetSuspended"),
        JobSetPhase::Invalid => said(Phase::Invalid, c, "Invalid", "Invalid"),
        JobSetPhase::Completed => said(Phase::Finished, c, "Completed", "Completed"),
        JobSetPhase::Failed => said(Phase::Failed, c, "Failed", "Failed"),
        JobSetPhase::Pending | JobSetPhase::Running => None,
    }
}

/// The MusterJob or MusterJobSet among a group's owners (its controller first).
pub(super) fn owner_of(meta: &ObjectMeta, objects: &Objects) -> Option<Owner> {
    let ns = namespace_of(meta);
    let mut refs: Vec<_> = meta.owner_references.iter().flatten().collect();
    refs.sort_by_key(|r| r.controller != Some(true));
    let owner = refs.into_iter().find(|r| matches!(r.kind.as_str(), "MusterJob" | "MusterJobSet"))?;
    let same = |m: &ObjectMeta| m.name.as_deref() == Some(owner.name.as_str()) && namespace_of(m) == ns;
    let says = match owner.kind.as_str() {
        "MusterJob" => objects.jobs.iter().find(|j| same(&j.metadata)).and_then(job_says),
        _ => objects.sets.iter().find(|s| same(&s.metadata)).and_then(set_says),
    };
    Some(Owner { kind: owner.kind.clone(), name: owner.name.clone(), says })
}

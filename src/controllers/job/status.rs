//! The job's status writes: a change of the live counts alone paced, any other written at once,
//! and a job marked Invalid.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::plan::condition;
use super::{FIELD_MANAGER, JobContext, plan};
use crate::controllers::conditions;
use crate::controllers::context::{Context, Result};
use crate::controllers::lean_writes;
use crate::crds::batch::{JobPhase, MusterJob, MusterJobStatus};
use crate::workloadbuilder::native::SchedulingApi;

use self::plan::STATUS_PACE;

/// A job's status change waiting for its paced write: since when, and for a job without a status
/// yet the start time its first pass decided, which later passes keep ([`first_start`]) so the
/// write records when the job started, not when it was written.
#[derive(Clone, Debug)]
pub(super) struct Paced {
    since: std::time::Instant,
    start_time: Option<Time>,
}

/// The start time decided for a job whose first status waits for its paced write.
pub(super) fn first_start(jc: &JobContext, uid: &str) -> Option<Time> {
    jc.paced.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(uid).and_then(|p| p.start_time.clone())
}

/// Writes the job's status when it changed. A change of the live counts alone, or a first
/// status that only says the job is live, waits up to [`plan::status_pace`] from when it was
/// first seen, so several fold into one write; returns when to look again for such a change (or
/// for a write the cache does not show yet).
pub(super) async fn write_status(
    job: &MusterJob,
    jc: &JobContext,
    status: &MusterJobStatus,
    api: SchedulingApi,
) -> Result<Option<Duration>> {
    let uid = job.uid().unwrap_or_default();
    let lock = || jc.paced.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if job.status.as_ref() == Some(status) {
        lock().remove(&uid);
        return Ok(None);
    }
    if jc.written.behind_own_write(&uid, status, job.metadata.resource_version.as_deref(), std::time::Instant::now()) {
        // The cache does not show this controller's last status write yet, and this status
        // records no new count: computed from that older job, it would undo the write's times.
        // That write's own event syncs the job again (told as a wait, so nothing is told twice).
        return Ok(Some(STATUS_PACE));
    }
    if let Some(pace) = plan::status_pace(job.status.as_ref(), status, api) {
        let now = std::time::Instant::now();
        let first = job.status.is_none().then(|| status.start_time.clone()).flatten();
        let since = lock().entry(uid.clone()).or_insert(Paced { since: now, start_time: first }).since;
        let due = since + pace;
        if now < due {
            return Ok(Some(due - now));
        }
    }
    // The job as cached is the one the status is written over unless the cache lags behind
    // this controller's last write: then the status goes as an apply, not an update fenced by
    // an old version.
    let current = !jc.written.lagging(&uid, job.metadata.resource_version.as_deref(), std::time::Instant::now());
    let version = write_status_now(job, &jc.ctx, status, current).await?;
    jc.written.wrote(&uid, status, version.as_deref(), std::time::Instant::now());
    lock().remove(&uid);
    Ok(None)
}

/// Writes the status; returns the job's resourceVersion after the write. `current`: `job` is
/// taken to be the stored object, and the status goes as an update of the whole job fenced by
/// its resourceVersion (see [`replace_status`]); else, or when the job changed since, as a
/// server-side apply.
async fn write_status_now(
    job: &MusterJob,
    ctx: &Context,
    status: &MusterJobStatus,
    current: bool,
) -> Result<Option<String>> {
    tracing::debug!(
        job = %job.name_any(),
        first = job.status.is_none(),
        from = ?job.status.as_ref().and_then(|s| s.phase),
        to = ?status.phase,
        active = status.active,
        ready = status.ready,
        conditions = status.conditions.len(),
        "job status written"
    );
    let api = Api::<MusterJob>::namespaced(ctx.client.clone(), &job.namespace().unwrap_or_default());
    if current && let Some(version) = replace_status(&api, job, status, &ctx.status_updates_forbidden).await? {
        return Ok(version);
    }
    let body = json!({"apiVersion": "batch.muster.dev/v1alpha1", "kind": "MusterJob", "status": status});
    let written = lean_writes::patch_status(
        &api,
        &job.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(written.metadata.resource_version)
}

/// Replaces the job's status with `status` by an update of the whole job as cached, fenced by its
/// resourceVersion. A custom resource's update costs the API server less than a patch or an
/// apply of its status, which it applies to the stored object first; the status written is the
/// same, as this controller alone writes a job's status. `Some(version)`: written, the job's
/// resourceVersion after it; `None`: the job changed since it was cached (409), is not cached
/// whole, or RBAC lets muster patch statuses only, and the status is to be applied.
async fn replace_status(
    api: &Api<MusterJob>,
    job: &MusterJob,
    status: &MusterJobStatus,
    forbidden: &std::sync::atomic::AtomicBool,
) -> Result<Option<Option<String>>> {
    let whole = serde_json::to_value(job)
        .ok()
        .zip(serde_json::to_value(status).ok())
        .and_then(|(job, status)| muster_core::scheduler::status::status_update(&job, status));
    let Some(whole) = whole.filter(|_| job.metadata.resource_version.is_some()) else { return Ok(None) };
    match lean_writes::replace_status(api, &job.name_any(), &whole, forbidden).await {
        Ok(written) => Ok(written.map(|w| w.metadata.resource_version)),
        Err(kube::Error::Api(e)) if e.code == 409 => {
            tracing::debug!(job = %job.name_any(), "the job changed since it was cached; applying its status");
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// Marks the job Invalid. `retry`: look again after that long (the cause is outside the job,
/// e.g. an object in the way), instead of waiting for the job to change.
pub(super) async fn set_invalid(
    job: &MusterJob,
    ctx: &Context,
    reason: &str,
    message: &str,
    now: Timestamp,
    retry: Option<Duration>,
) -> Result<Action> {
    tracing::debug!(job = %job.name_any(), reason, message, "job invalid");
    let mut status = job.status.clone().unwrap_or_default();
    let changed = conditions::set(
        &mut status.conditions,
        condition::INVALID,
        true,
        reason,
        message,
        job.metadata.generation,
        now,
    );
    status.phase = Some(JobPhase::Invalid);
    status.observed_generation = job.metadata.generation;
    if changed {
        ctx.event(&job.object_ref(&()), true, reason, "Validate", message);
    }
    if job.status.as_ref() != Some(&status) {
        write_status_now(job, ctx, &status, false).await?;
    }
    // A refusal that can clear by itself (a name an earlier object of the same name holds) is
    // looked at again without an event.
    let retry = muster_core::jobs::refusal_retry(reason, &status.conditions, now).or(retry);
    Ok(retry.map_or_else(Action::await_change, Action::requeue))
}

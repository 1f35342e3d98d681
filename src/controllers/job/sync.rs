//! A job's plan carried out: its pods deleted and created, events told, its status written, and
//! when to look at it again.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};

use super::claim_writes::{CLAIM_RETRY, PodClaims, report_claims};
use super::create_pods::create_pods;
use super::gang_attempt::admission_attempt;
use super::groups::Groups;
use super::plan::{JobPod, ObservedPod, condition};
use super::status::write_status;
use super::{JobContext, claims, plan, tracking};
use crate::controllers::context::Result;
use crate::crds::batch::{JobPhase, MusterJob};
use crate::workloadbuilder::native::SchedulingApi;

/// How soon a job that made one batch of pods ([`plan::CREATE_PER_PASS`]) of more it needs is
/// looked at again, at the latest.
const NEXT_BATCH: Duration = Duration::from_secs(1);

pub(super) async fn sync_pods(
    job: &MusterJob,
    jc: &JobContext,
    groups: &Groups,
    pod_claims: &PodClaims,
    now: Timestamp,
) -> Result<Action> {
    let ctx = &*jc.ctx;
    let ns = job.namespace().unwrap_or_default();
    let name = job.name_any();
    let uid = job.uid().unwrap_or_default();
    let pods_api = Api::<Pod>::namespaced(ctx.client.clone(), &ns);
    // The job's pods as the watch cache shows them, once it has listed them all.
    jc.pods_ready.wait().await?;
    let cached = jc.job_pods.of_job(&ns, &name, &uid);
    let pods: Vec<&JobPod> = cached.iter().map(|p| &p.0).collect();
    let names: std::collections::HashSet<&str> = pods.iter().map(|p| p.observed.name.as_str()).collect();
    if !jc.expected.satisfied(&uid, &names, std::time::Instant::now()) {
        // Pods it created are not in the cache yet: their events sync the job again.
        tracing::debug!(job = %name, namespace = %ns, cached = names.len(), "pods created are not cached yet");
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let mut prev = job.status.clone().unwrap_or_default();
    if job.status.is_none() {
        // A first status waiting for its paced write keeps the start time first decided.
        prev.start_time = super::status::first_start(jc, &uid);
    }
    let instant = std::time::Instant::now();
    if !jc.written.caught_up(&uid, &prev, instant) {
        // The cache shows an older status than this controller wrote: its counts would miss
        // the pods released since. The write's own event syncs the job again.
        tracing::debug!(job = %name, namespace = %ns, "the job's status written is not cached yet");
        return Ok(Action::requeue(Duration::from_millis(200)));
    }
    // Pods released whose release the cache does not show yet are counted already.
    let tracked_in_cache: std::collections::HashMap<&str, bool> =
        pods.iter().map(|p| (p.observed.name.as_str(), p.observed.tracked)).collect();
    let released = jc.released.apply(&uid, &tracked_in_cache, instant);
    let observed: Vec<ObservedPod> = pods
        .iter()
        .map(|p| {
            let mut o = p.observed.clone();
            o.tracked &= !released.contains(&o.name);
            o
        })
        .collect();
    let mut decision = plan::plan(&ns, &job.spec, job.metadata.generation, &prev, &observed, groups.gang, now);
    decision.status.workload_name = Some(groups.workload.clone());
    decision.status.pod_group_name = Some(groups.pod_group.clone());
    let mirrored = match groups.api {
        SchedulingApi::Upstream => {
            let group = plan::group_conditions_with_pods(&groups.native_conditions, &observed);
            plan::mirror_group_conditions(&mut decision.status.conditions, &group, &prev.conditions)
        }
        SchedulingApi::Muster => Vec::new(),
    };
    tracing::debug!(
        job = %name,
        namespace = %ns,
        pods = observed.len(),
        active = decision.status.active,
        create = decision.create.len(),
        delete = decision.delete.len(),
        "job synced"
    );
    let reference = job.object_ref(&());

    let still_tracked: std::collections::HashSet<&str> =
        observed.iter().filter(|o| o.tracked).map(|o| o.name.as_str()).collect();
    for (pod, why) in &decision.delete {
        // A pod whose end counts for nothing loses its tracking finalizer first; one whose end
        // counts as a failure keeps it until the status counting it is written.
        let gang_restart = *why == "GangRestart";
        if !decision.deletes_counted && (still_tracked.contains(pod.as_str()) || gang_restart) {
            // Counted for nothing from now on, whatever the cache shows.
            jc.released.released(&uid, [pod.clone()], std::time::Instant::now());
            tracking::release_before_delete(&pods_api, pod, gang_restart).await?;
        }
        match pods_api.delete(pod, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        tracing::debug!(job = %name, pod, why, "deleted pod");
    }
    if !decision.delete.is_empty() {
        let why = decision.delete[0].1;
        ctx.event(
            &reference,
            false,
            "SuccessfulDelete",
            "DeletePods",
            format!("Deleted {} pod(s): {why}", decision.delete.len()),
        );
    }
    let subdomain = plan::pod_subdomain(job);
    let attempt = if decision.create.is_empty() { 0 } else { admission_attempt(ctx, &ns, groups).await? };
    let new_pods: Vec<Pod> = decision
        .create
        .iter()
        .map(|new| {
            let mut pod = plan::new_pod(job, new, &groups.pod_group, subdomain.as_deref(), attempt);
            if groups.api == SchedulingApi::Upstream {
                plan::native_pod(&mut pod, &groups.pod_group);
            }
            if let Some(spec) = pod.spec.as_mut() {
                if let Some(template) = &pod_claims.gpu_template {
                    claims::use_gpu_claim(spec, template);
                }
                match groups.api {
                    SchedulingApi::Muster => claims::add_group_claims(spec, &pod_claims.group.claims),
                    SchedulingApi::Upstream => claims::add_native_group_claims(spec, &groups.resource_claims),
                }
            }
            pod
        })
        .collect();
    let (created, failed) = create_pods(&pods_api, new_pods).await;
    // Every pod made is expected, also when another failed: the next sync must not make it again.
    jc.expected.created(&uid, created.iter().cloned(), std::time::Instant::now());
    if let Some(e) = failed.map(crate::controllers::context::Error::from) {
        // A create refused: nothing is written or released until the pods are made (the plan
        // counts a replacement as made: a failed pod's index hands its failure count on to it).
        if !e.namespace_terminating() {
            ctx.event(&reference, true, "FailedCreate", "CreatePods", format!("Error creating pod: {e}"));
            return Err(e);
        }
        // Except in a namespace being deleted: it refuses every create and deletes the pods
        // first, waiting for them to go. Nothing can be made there again and the counts are
        // read by no one: the pods not made are left out of `active`, and the status is written
        // and the pods released below, or they would wait for a pass that never ends.
        let not_made = decision.create.len().saturating_sub(created.len()) as i32;
        decision.status.active = decision.status.active.saturating_sub(not_made).max(0);
    }
    if !created.is_empty() {
        ctx.event(
            &reference,
            false,
            "SuccessfulCreate",
            "CreatePods",
            format!("Created {} gated pod(s) in PodGroup {}: {}", created.len(), groups.pod_group, created.join(", ")),
        );
    }
    if let Some(f) = &decision.finished {
        // As batch/v1 tells it: `Completed` for a job complete, the reason for one failed.
        if f.condition == condition::FAILED {
            ctx.event(&reference, true, f.reason, "Finish", f.message.clone());
        } else {
            ctx.event(&reference, false, "Completed", "Finish", "Job completed");
        }
    }
    let was_suspended = prev.phase == Some(JobPhase::Suspended);
    let is_suspended = decision.status.phase == Some(JobPhase::Suspended);
    if was_suspended != is_suspended {
        let (reason, note) = if is_suspended { ("Suspended", "Job suspended") } else { ("Resumed", "Job resumed") };
        ctx.event(&reference, false, reason, "Suspend", note);
    }
    let claims_pending = report_claims(job, ctx, pod_claims, &mut decision.status, now).await;
    // A status written is recorded (`Written`): the counts for the cache to show before the
    // next pass counts, and the version it made, so a pass that runs before the cache shows it
    // writes nothing unless it counts something new.
    let paced = write_status(job, jc, &decision.status, groups.api).await?;
    // The status counts them now (or counted them before, when only the live counts wait).
    // Recorded from now on (never counted again, whatever the cache shows), then released; a
    // release that failed is tried again on the next pass.
    let releasing: Vec<String> = decision
        .release
        .iter()
        .filter(|p| still_tracked.contains(p.as_str()))
        .cloned()
        .chain(released.iter().cloned())
        .collect();
    jc.released.released(&uid, releasing.iter().cloned(), std::time::Instant::now());
    let mut release_error = None;
    for pod in &releasing {
        if let Err(e) = tracking::release(&pods_api, pod).await {
            tracing::debug!(job = %name, pod, error = %e, "releasing a pod");
            release_error = release_error.or(Some(e));
        }
    }
    if let Some(e) = release_error {
        return Err(e);
    }
    // A mirrored condition's change is told once, with the write that records it (a paced write
    // comes back here, its change still new against the job's status).
    if paced.is_none() {
        for c in &mirrored {
            let warning = plan::mirrored_change_is_warning(c);
            let note =
                format!("PodGroup {} (scheduling.k8s.io): {}={}: {}", groups.pod_group, c.type_, c.status, c.message);
            ctx.event(&reference, warning, &c.reason, "Schedule", note);
        }
    }
    if decision.delete_job {
        let api = Api::<MusterJob>::namespaced(ctx.client.clone(), &ns);
        match api.delete(&name, &DeleteParams::background()).await {
            Ok(_) => tracing::info!(job = %name, "deleted after ttlSecondsAfterFinished"),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        return Ok(Action::await_change());
    }
    let requeue = decision.requeue_after.map(|s| Duration::from_secs(s.max(1) as u64));
    // More pods than one batch were missing: the pods just made trigger the next pass, and this
    // makes sure of it.
    let requeue =
        if decision.more_to_create { Some(requeue.map_or(NEXT_BATCH, |r| r.min(NEXT_BATCH))) } else { requeue };
    let finished = matches!(decision.status.phase, Some(JobPhase::Complete | JobPhase::Failed));
    let requeue =
        if claims_pending && !finished { Some(requeue.map_or(CLAIM_RETRY, |r| r.min(CLAIM_RETRY))) } else { requeue };
    let requeue = match (requeue, paced) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    Ok(match requeue {
        Some(after) => Action::requeue(after),
        None => Action::await_change(),
    })
}

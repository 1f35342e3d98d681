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
use super::{JobContext, claims, plan};
use crate::controllers::context::Result;
use crate::crds::JOBSET_NAME_LABEL;
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
    let cached = jc.pods.state();
    let pods: Vec<&JobPod> = cached.iter().map(|p| &p.0).filter(|p| p.of_job(&ns, &name, &uid)).collect();
    let names: std::collections::HashSet<&str> = pods.iter().map(|p| p.observed.name.as_str()).collect();
    if !jc.expected.satisfied(&uid, &names, std::time::Instant::now()) {
        // Pods it created are not in the cache yet: their events sync the job again.
        tracing::debug!(job = %name, namespace = %ns, cached = names.len(), "pods created are not cached yet");
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let observed: Vec<ObservedPod> = pods.iter().map(|p| p.observed.clone()).collect();
    let prev = job.status.clone().unwrap_or_default();
    let mut decision = plan::plan(&job.spec, job.metadata.generation, &prev, &observed, groups.gang_all, now);
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

    for (pod, why) in &decision.delete {
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
        )
        .await;
    }
    // A set's Service names its children's pods; the set label counts only on a set's child.
    let subdomain =
        plan::job_labels(job).remove(JOBSET_NAME_LABEL).or_else(|| (job.spec.indexed()).then(|| name.clone()));
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
    if let Some(e) = failed {
        ctx.event(&reference, true, "FailedCreate", "CreatePods", format!("Error creating pod: {e}")).await;
        return Err(e.into());
    }
    if !created.is_empty() {
        ctx.event(
            &reference,
            false,
            "SuccessfulCreate",
            "CreatePods",
            format!("Created {} gated pod(s) in PodGroup {}: {}", created.len(), groups.pod_group, created.join(", ")),
        )
        .await;
    }
    if let Some(f) = &decision.finished {
        let warning = f.condition == condition::FAILED;
        ctx.event(&reference, warning, f.reason, "Finish", f.message.clone()).await;
    }
    let was_suspended = prev.phase == Some(JobPhase::Suspended);
    let is_suspended = decision.status.phase == Some(JobPhase::Suspended);
    if was_suspended != is_suspended {
        let (reason, note) = if is_suspended { ("Suspended", "Job suspended") } else { ("Resumed", "Job resumed") };
        ctx.event(&reference, false, reason, "Suspend", note).await;
    }
    let claims_pending = report_claims(job, ctx, pod_claims, &mut decision.status, now).await;
    let paced = write_status(job, jc, &decision.status).await?;
    // A mirrored condition's change is told once, with the write that records it (a paced write
    // comes back here, its change still new against the job's status).
    if paced.is_none() {
        for c in &mirrored {
            let warning = plan::mirrored_change_is_warning(c);
            let note =
                format!("PodGroup {} (scheduling.k8s.io): {}={}: {}", groups.pod_group, c.type_, c.status, c.message);
            ctx.event(&reference, warning, &c.reason, "Schedule", note).await;
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

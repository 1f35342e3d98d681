//! One reconcile of a MusterJob, step by step: validate it, choose its scheduling API, compile
//! its groups, make its claims and its headless Service, then sync its pods.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};

use super::claim_writes::{CLAIM_RETRY, GroupClaims, PodClaims, ensure_gpu_template, ensure_group_claims};
use super::groups::{ensure_groups, is_child};
use super::native_groups::ensure_native_groups;
use super::scheduling_api::scheduling_api;
use super::status::set_invalid;
use super::sync::sync_pods;
use super::{CONTROLLER, FIELD_MANAGER, JobContext};
use crate::controllers::context::{Error, Result};
use crate::crds::JOB_NAME_LABEL;
use crate::crds::batch::MusterJob;
use crate::workloadbuilder::FieldPath;
use crate::workloadbuilder::job::validate_job;
use crate::workloadbuilder::native::SchedulingApi;

pub(super) async fn reconcile(guard: Arc<DeserializeGuard<MusterJob>>, jc: Arc<JobContext>) -> Result<Action> {
    let ctx = &*jc.ctx;
    let _timer = ctx.metrics.reconcile(CONTROLLER);
    let job = match &guard.0 {
        Ok(job) => job,
        Err(invalid) => {
            crate::controllers::report_undecodable::<MusterJob>(ctx, invalid);
            return Ok(Action::await_change());
        }
    };
    if job.metadata.deletion_timestamp.is_some() {
        let uid = job.uid().unwrap_or_default();
        jc.expected.forget(&uid);
        jc.released.forget(&uid);
        jc.written.forget(&uid);
        jc.paced.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&uid);
        // Its pods go with it: none may be stuck on its tracking finalizer.
        release_all(job, &jc).await?;
        return Ok(Action::await_change());
    }
    // A job another controller reconciles (`managedBy`) is left to it entirely.
    if !job.spec.managed_by_muster() {
        return Ok(Action::await_change());
    }
    let now = Timestamp::now();
    let namespace = job.namespace().unwrap_or_default();
    if let Some(message) = crate::webhook::config::excluded_namespace(&namespace, &ctx.config.namespace) {
        return set_invalid(job, ctx, "NamespaceExcluded", &message, now, None).await;
    }
    let errors = validate_job(job, None);
    if !errors.is_empty() {
        let message = crate::workloadbuilder::field::joined(&errors);
        return set_invalid(job, ctx, "InvalidSpec", &message, now, None).await;
    }
    // The cluster's own bound (`--max-job-pods`): a job over it (made while muster was down, or
    // before the bound was lowered) is not planned.
    let errors =
        crate::workloadbuilder::job::job_size_errors(&job.spec, &FieldPath::new("spec"), ctx.config.max_job_pods);
    if !errors.is_empty() {
        let message = crate::workloadbuilder::field::joined(&errors);
        return set_invalid(job, ctx, "PodLimitExceeded", &message, now, None).await;
    }
    if !ctx.config.dra_served {
        let errors = crate::workloadbuilder::job::needs_dra(&job.spec);
        if !errors.is_empty() {
            let message = crate::workloadbuilder::field::joined(&errors);
            return set_invalid(job, ctx, "DRANotServed", &message, now, None).await;
        }
    }
    let api = match scheduling_api(job, &jc).await? {
        Ok(api) => api,
        Err((reason, message)) => return set_invalid(job, ctx, reason, &message, now, None).await,
    };
    let groups = match api {
        SchedulingApi::Muster => ensure_groups(job, &jc).await?,
        SchedulingApi::Upstream => ensure_native_groups(job, &jc).await?,
    };
    let group = match groups {
        Ok(group) => group,
        Err((reason, message)) => return set_invalid(job, ctx, reason, &message, now, None).await,
    };
    // The GPU template comes before the pods that claim from it. Group claims: muster makes
    // them for its own PodGroup; a native PodGroup's are kube-controller-manager's to make.
    let gpu_template = match ensure_gpu_template(job, ctx).await? {
        Ok(template) => template,
        Err((reason, message)) => {
            return set_invalid(job, ctx, reason, &message, now, Some(CLAIM_RETRY)).await;
        }
    };
    let group_claims = match api {
        SchedulingApi::Muster => ensure_group_claims(job, ctx, &group).await?,
        SchedulingApi::Upstream => GroupClaims { claims: Vec::new(), problems: Vec::new() },
    };
    let standalone = !is_child(job);
    if standalone && job.spec.indexed() {
        let name = job.name_any();
        let refused = crate::controllers::apply_headless_service(
            &ctx.client,
            &job.namespace().unwrap_or_default(),
            &name,
            JOB_NAME_LABEL,
            owner_ref(job)?,
            FIELD_MANAGER,
        )
        .await?;
        if let Some(note) = refused {
            ctx.event(&job.object_ref(&()), true, "ServiceConflict", "ApplyService", note);
        }
    }
    sync_pods(job, &jc, &group, &PodClaims { gpu_template, group: group_claims }, now).await
}

/// Removes the tracking finalizer of every pod of `job` the cache shows with it.
async fn release_all(job: &MusterJob, jc: &JobContext) -> Result<()> {
    let (ns, name, uid) = (job.namespace().unwrap_or_default(), job.name_any(), job.uid().unwrap_or_default());
    let api = kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(jc.ctx.client.clone(), &ns);
    let tracked: Vec<String> = jc
        .job_pods
        .of_job(&ns, &name, &uid)
        .iter()
        .filter(|p| p.observed.tracked)
        .map(|p| p.observed.name.clone())
        .collect();
    for pod in tracked {
        super::tracking::release(&api, &pod).await?;
    }
    Ok(())
}

pub(super) fn owner_ref(job: &MusterJob) -> Result<OwnerReference> {
    crate::controllers::controller_ref(job).ok_or_else(|| Error::Missing("the MusterJob has no uid yet".into()))
}

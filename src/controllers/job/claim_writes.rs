//! The shell of [`claims`]: writes the job's GPU ResourceClaimTemplate and its PodGroup's shared
//! ResourceClaims, and reports on the job (`ClaimsReady`) the claims it could not make.

use std::time::Duration;

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::claims::GroupClaim;
use super::groups::Groups;
use super::plan::condition;
use super::reconcile::owner_ref;
use super::{FIELD_MANAGER, claims, plan};
use crate::controllers::conditions;
use crate::controllers::context::{Context, Error, Result};
use crate::controllers::controller_uid;
use crate::crds::batch::{MusterJob, MusterJobStatus};
use crate::crds::scheduling::PodGroup;

/// How soon a job whose claims could not be made (a template missing, a name taken) is
/// looked at again: nothing muster watches changes when the template appears.
pub(super) const CLAIM_RETRY: Duration = Duration::from_secs(15);

/// The claims a job's new pods reference.
pub(super) struct PodClaims {
    /// The job's GPU ResourceClaimTemplate (`spec.gpuClaims` with GPU containers).
    pub(super) gpu_template: Option<String>,
    /// The PodGroup's claims, and what kept some from being made.
    pub(super) group: GroupClaims,
}

/// The claims of a PodGroup and the reasons some are not made yet.
pub(super) struct GroupClaims {
    pub(super) claims: Vec<GroupClaim>,
    /// `(reason, message)` per claim that could not be made.
    pub(super) problems: Vec<(&'static str, String)>,
}

/// Creates the job's GPU ResourceClaimTemplate `<job>-gpus` when `spec.gpuClaims` is set and a
/// container asks for GPUs, and returns its name. `Ok(Err(..))`: a template of that name is
/// someone else's, or asks for other devices than the job needs (a template's spec cannot
/// change, so muster never edits it); no pod may claim from it.
pub(super) async fn ensure_gpu_template(
    job: &MusterJob,
    ctx: &Context,
) -> Result<std::result::Result<Option<String>, (&'static str, String)>> {
    let (Some(gpu), Some(pod_spec)) = (&job.spec.gpu_claims, job.spec.template.spec.as_ref()) else {
        return Ok(Ok(None));
    };
    let class = gpu.device_class_name.as_deref().unwrap_or(&ctx.config.dra_gpu_device_class);
    let labels = plan::job_labels(job);
    let Some(want) = claims::gpu_template_spec(pod_spec, class, &labels) else { return Ok(Ok(None)) };
    let ns = job.namespace().unwrap_or_default();
    let name = claims::gpu_template_name(&job.name_any());
    let owner = owner_ref(job)?;
    let api = Api::<ResourceClaimTemplate>::namespaced(ctx.client.clone(), &ns);
    let existing = match api.get_opt(&name).await? {
        Some(t) => t,
        None => {
            let template = claims::gpu_template(&name, &ns, &labels, owner.clone(), want.clone());
            match api.create(&PostParams::default(), &template).await {
                Ok(_) => {
                    let note = format!("Created ResourceClaimTemplate {name} for the GPUs of the job's pods");
                    ctx.event(&job.object_ref(&()), false, "SuccessfulCreate", "CreateClaims", note);
                    return Ok(Ok(Some(name)));
                }
                Err(kube::Error::Api(e)) if e.code == 409 => api.get(&name).await?,
                Err(e) => {
                    let note = format!("Error creating ResourceClaimTemplate {name}: {e}");
                    ctx.event(&job.object_ref(&()), true, "FailedCreate", "CreateClaims", note);
                    return Err(e.into());
                }
            }
        }
    };
    if controller_uid(&existing.metadata) != Some(owner.uid.as_str()) {
        return Ok(Err((
            "NameConflict",
            format!("ResourceClaimTemplate {name} already exists and is not controlled by this MusterJob"),
        )));
    }
    if let Some(why) = claims::template_mismatch(&existing, &want) {
        return Ok(Err((
            "GpuClaimTemplateMismatch",
            format!(
                "ResourceClaimTemplate {name} does not match spec.gpuClaims and the GPU limits of spec.template: {why}; muster does not change a template (its spec is immutable) and creates no pods from it: delete it to have it made again"
            ),
        )));
    }
    Ok(Ok(Some(name)))
}

/// Creates the ResourceClaim of each `resourceClaimTemplateName` entry of the job's PodGroup
/// (one per group, owned by it), and records in the PodGroup's `status.resourceClaimStatuses`
/// the claims that exist. A claim that cannot be made yet is a problem to report, not an
/// error: the pods are still created, referencing it, and wait for it.
pub(super) async fn ensure_group_claims(job: &MusterJob, ctx: &Context, groups: &Groups) -> Result<GroupClaims> {
    let ns = job.namespace().unwrap_or_default();
    let all = claims::group_claims(&groups.pod_group, &groups.resource_claims);
    let claim_api = Api::<ResourceClaim>::namespaced(ctx.client.clone(), &ns);
    let template_api = Api::<ResourceClaimTemplate>::namespaced(ctx.client.clone(), &ns);
    let group_uid = groups.pod_group_owner.as_ref().map(|o| o.uid.clone()).unwrap_or_default();
    let (mut made, mut created, mut problems) = (std::collections::BTreeSet::new(), Vec::new(), Vec::new());
    for claim in &all {
        let Some(template) = &claim.template else { continue };
        let (entry, claim_name) = (&claim.entry, &claim.claim_name);
        if let Some(existing) = claim_api.get_opt(claim_name).await? {
            if controller_uid(&existing.metadata) == Some(group_uid.as_str()) {
                made.insert(entry.clone());
            } else {
                problems.push((
                    "ClaimNameConflict",
                    format!(
                        "ResourceClaim {claim_name} (resourceClaims entry {entry}) already exists and is not controlled by PodGroup {}",
                        groups.pod_group
                    ),
                ));
            }
            continue;
        }
        let Some(source) = template_api.get_opt(template).await? else {
            problems.push((
                "ResourceClaimTemplateNotFound",
                format!(
                    "ResourceClaimTemplate {template} (resourceClaims entry {entry}) not found in namespace {ns}: ResourceClaim {claim_name} cannot be created yet; the pods reference it and wait"
                ),
            ));
            continue;
        };
        let Some(owner) = groups.pod_group_owner.clone() else {
            return Err(Error::Missing(format!("PodGroup {} has no uid yet", groups.pod_group)));
        };
        let object = claims::group_resource_claim(claim, &ns, &groups.pod_group, &source, owner);
        match claim_api.create(&PostParams::default(), &object).await {
            Ok(_) => {
                made.insert(entry.clone());
                created.push(claim_name.clone());
            }
            // Made meanwhile (another replica, a retry): checked on the next pass.
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => problems.push((
                "ClaimNotCreated",
                format!("Error creating ResourceClaim {claim_name} from ResourceClaimTemplate {template}: {e}"),
            )),
        }
    }
    if !created.is_empty() {
        let note = format!("Created ResourceClaim(s) shared by PodGroup {}: {}", groups.pod_group, created.join(", "));
        ctx.event(&job.object_ref(&()), false, "SuccessfulCreate", "CreateClaims", note);
    }
    let statuses = claims::claim_statuses(&all, &made);
    if statuses != groups.claim_statuses {
        // A merge patch of this one field: admission applies the rest of the status.
        let value = if statuses.is_empty() { serde_json::Value::Null } else { serde_json::to_value(&statuses)? };
        let body = json!({"apiVersion": "scheduling.muster.dev/v1alpha1", "kind": "PodGroup",
            "status": {"resourceClaimStatuses": value}});
        let params = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
        Api::<PodGroup>::namespaced(ctx.client.clone(), &ns)
            .patch_status(&groups.pod_group, &params, &Patch::Merge(&body))
            .await?;
    }
    Ok(GroupClaims { claims: all, problems })
}

/// Sets the job's `ClaimsReady` condition (when it has claims at all) and warns when claims
/// could not be made. Returns true while some are missing.
pub(super) async fn report_claims(
    job: &MusterJob,
    ctx: &Context,
    pod_claims: &PodClaims,
    status: &mut MusterJobStatus,
    now: Timestamp,
) -> bool {
    if pod_claims.gpu_template.is_none() && pod_claims.group.claims.is_empty() {
        return false;
    }
    let problems = &pod_claims.group.problems;
    let (ready, reason, message) = match problems.first() {
        None => (true, "ClaimsCreated", String::new()),
        Some((reason, _)) => (false, *reason, problems.iter().map(|(_, m)| m.as_str()).collect::<Vec<_>>().join("; ")),
    };
    let changed = conditions::set(
        &mut status.conditions,
        condition::CLAIMS_READY,
        ready,
        reason,
        &message,
        job.metadata.generation,
        now,
    );
    if changed && !ready {
        ctx.event(&job.object_ref(&()), true, reason, "CreateClaims", message);
    }
    !ready
}

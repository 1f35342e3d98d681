//! The groups a job's pods join, and muster's own Workload and PodGroup of a job, applied (for a
//! MusterJobSet's child, only the PodGroup, from its set's Workload).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, PatchParams};
use kube::{Resource, ResourceExt};

use super::frozen::{FROZEN_HASH_ANNOTATION, changed_frozen_parts, frozen_hashes};
use super::reconcile::owner_ref;
use super::watches::{cached, in_cache};
use super::{FIELD_MANAGER, JobContext, plan};
use crate::controllers::context::{Error, Result};
use crate::controllers::{Made, controller_uid, create_if_absent};
use crate::crds::batch::MusterJob;
use crate::crds::blocks::{DisruptionModeKind, PodGroupResourceClaim};
use crate::crds::scheduling::{CompositePodGroup, PodGroup, PodGroupResourceClaimStatus, Workload};
use crate::crds::{GROUP_TEMPLATE_ANNOTATION, PARENT_COMPOSITE_ANNOTATION};
use crate::workloadbuilder::job::{JOB_TEMPLATE_NAME, build_options, job_item};
use crate::workloadbuilder::native::SchedulingApi;
use crate::workloadbuilder::objects::refuse_own_write;
use crate::workloadbuilder::{Builder, FieldPath};

/// The groups a job's pods join.
pub(super) struct Groups {
    pub(super) workload: String,
    pub(super) pod_group: String,
    /// How the pods are admitted: one by one, or as a gang (disruption mode `single` or `all`).
    pub(super) gang: plan::Gang,
    /// The parent CompositePodGroup of a MusterJobSet's child.
    pub(super) parent: Option<String>,
    /// A controller reference to the PodGroup (the owner of the claims made for it).
    pub(super) pod_group_owner: Option<OwnerReference>,
    /// The PodGroup's `spec.resourceClaims`.
    pub(super) resource_claims: Vec<PodGroupResourceClaim>,
    /// The PodGroup's `status.resourceClaimStatuses` as read.
    pub(super) claim_statuses: Vec<PodGroupResourceClaimStatus>,
    /// The PodGroup's `status.rollbacks` when this reconcile created it: the API server's
    /// answer, as fresh as a read ([`admission_attempt`](super::gang_attempt::admission_attempt)
    /// asks again otherwise).
    pub(super) created_rollbacks: Option<i32>,
    /// The API the groups are in.
    pub(super) api: SchedulingApi,
    /// The native PodGroup's conditions (upstream API), as cached.
    pub(super) native_conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
}

/// A child of a set: it carries the delegation annotations AND a MusterJobSet controls it
/// (its controller ownerReference). The annotations alone, which anyone who may write the job
/// may set, never make a job join a set's CompositePodGroup.
pub(super) fn is_child(job: &MusterJob) -> bool {
    let a = job.annotations();
    a.contains_key(GROUP_TEMPLATE_ANNOTATION)
        && a.contains_key(PARENT_COMPOSITE_ANNOTATION)
        && plan::owning_set(job).is_some()
}

/// The refusal for a child whose parent group `kind` `name` is not controlled by the set that
/// controls the child.
pub(super) fn not_the_sets(kind: &str, name: &str) -> (&'static str, String) {
    (
        "NotInSet",
        format!(
            "{kind} {name} named by annotation {PARENT_COMPOSITE_ANNOTATION} is not controlled by the MusterJobSet that controls this MusterJob"
        ),
    )
}

/// Applies the Workload (standalone jobs) and the PodGroup. `Ok(Err(..))` means the job must
/// not be acted on (a name taken by another owner, or a frozen field changed).
pub(super) async fn ensure_groups(
    job: &MusterJob,
    jc: &JobContext,
) -> Result<std::result::Result<Groups, (&'static str, String)>> {
    let ctx = &*jc.ctx;
    let ns = job.namespace().unwrap_or_default();
    let name = job.name_any();
    let owner = owner_ref(job)?;
    let uid = owner.uid.clone();
    let pgs = Api::<PodGroup>::namespaced(ctx.client.clone(), &ns);
    let hashes = frozen_hashes(job)?;
    // Why the job's PodGroup `existing` is not acted on, if it is not.
    let refusal = |existing: &PodGroup| -> Option<(&'static str, String)> {
        if controller_uid(&existing.metadata) != Some(uid.as_str()) {
            return Some((
                "NameConflict",
                format!("PodGroup {name} already exists and is not controlled by this MusterJob"),
            ));
        }
        let old = existing.annotations().get(FROZEN_HASH_ANNOTATION)?;
        let changed = changed_frozen_parts(job, old, &hashes);
        (!changed.is_empty()).then(|| {
            (
                "FrozenFieldChanged",
                format!(
                    "{} changed after creation; muster does not act on changes to frozen fields (only scheduling.schedulingPolicy.gang.minCount and parallelism may change)",
                    changed.join(", ")
                ),
            )
        })
    };
    // Not cached: made below with one create, which finds it if the cache only lags.
    let existing = in_cache(&jc.groups, &ns, &name);
    if let Some(refused) = existing.as_ref().and_then(refusal) {
        return Ok(Err(refused));
    }
    let existing_priority = existing.as_ref().map(|e| e.spec.priority);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let (builder, workload_name, template, parent, workload_owner) = if is_child(job) {
        let a = job.annotations();
        let template = a.get(GROUP_TEMPLATE_ANNOTATION).cloned().unwrap_or_default();
        let parent = a.get(PARENT_COMPOSITE_ANNOTATION).cloned().unwrap_or_default();
        let cpgs = Api::<CompositePodGroup>::namespaced(ctx.client.clone(), &ns);
        let cpg = cached(&jc.composites, &cpgs, &ns, &parent)
            .await?
            .ok_or_else(|| Error::Missing(format!("parent CompositePodGroup {parent} not found yet")))?;
        if controller_uid(&cpg.metadata) != plan::owning_set(job) {
            return Ok(Err(not_the_sets("CompositePodGroup", &parent)));
        }
        let wl_name = cpg.spec.workload_ref.workload_name.clone();
        let wls = Api::<Workload>::namespaced(ctx.client.clone(), &ns);
        let workload = cached(&jc.workloads, &wls, &ns, &wl_name)
            .await?
            .ok_or_else(|| Error::Missing(format!("parent Workload {wl_name} not found yet")))?;
        let builder = Builder::from_existing_workload(workload, build_options(&wl_name, &ns, Some(owner.clone())));
        (builder, wl_name, template, Some(parent), None)
    } else {
        let item = job_item(&job.spec, JOB_TEMPLATE_NAME, &FieldPath::new("spec"));
        let builder = Builder::new(item, build_options(&name, &ns, Some(owner.clone())));
        let workload = builder.build_workload()?.clone();
        let wls = Api::<Workload>::namespaced(ctx.client.clone(), &ns);
        let existing_workload = match in_cache(&jc.workloads, &ns, &name) {
            Some(w) => Some(w),
            None => {
                if let Some(refused) = refuse_own_write(&workload, None) {
                    return Ok(Err(refused));
                }
                match create_if_absent(&wls, &name, FIELD_MANAGER, workload.clone()).await? {
                    // Created now, it holds what was asked: the apply below writes nothing.
                    Made::Created(w) | Made::Exists(w) => Some(w),
                }
            }
        };
        if let Some(existing) = &existing_workload
            && controller_uid(&existing.metadata) != Some(uid.as_str())
        {
            return Ok(Err((
                "NameConflict",
                format!("Workload {name} already exists and is not controlled by this MusterJob"),
            )));
        }
        if let Some(refused) = refuse_own_write(&workload, existing_workload.as_ref()) {
            return Ok(Err(refused));
        }
        let applied = crate::controllers::apply_if_changed(&wls, &name, &params, workload, existing_workload).await?;
        let workload_owner = applied.controller_owner_ref(&()).map(|o| plan::plain_owner_ref(&o));
        (builder, name.clone(), JOB_TEMPLATE_NAME.to_string(), None, workload_owner)
    };
    let mut pg = builder.new_pod_group(&name, &template)?;
    pg.spec.priority = match existing_priority {
        Some(p) => p,
        None => Some(ctx.priorities.resolve(&ctx.client, pg.spec.priority_class_name.as_deref()).await?),
    };
    pg.spec.parent_composite_pod_group_name = parent.clone();
    // A root job's PodGroup is also owned by its Workload (as upstream's Job controller does).
    pg.metadata.owner_references.get_or_insert_with(Vec::new).extend(workload_owner);
    pg.metadata.annotations = Some(BTreeMap::from([(FROZEN_HASH_ANNOTATION.to_string(), hashes.clone())]));
    if existing.is_none()
        && let Some(refused) = refuse_own_write(&pg, None)
    {
        return Ok(Err(refused));
    }
    let gang = match (pg.spec.scheduling_policy.gang.is_some(), pg.spec.disruption_mode.kind()) {
        (_, Some(DisruptionModeKind::All)) => plan::Gang::All,
        (true, _) => plan::Gang::Single,
        (false, _) => plan::Gang::None,
    };
    let (created, existing) = match existing {
        Some(existing) => (false, existing),
        None => match create_if_absent(&pgs, &name, FIELD_MANAGER, pg.clone()).await? {
            Made::Created(g) => (true, g),
            Made::Exists(g) => {
                if let Some(refused) = refusal(&g) {
                    return Ok(Err(refused));
                }
                // Its priority was resolved when it was made, and stays.
                pg.spec.priority = g.spec.priority;
                (false, g)
            }
        },
    };
    if let Some(refused) = refuse_own_write(&pg, Some(&existing)) {
        return Ok(Err(refused));
    }
    let applied = crate::controllers::apply_if_changed(&pgs, &name, &params, pg, Some(existing)).await?;
    let status = applied.status.clone().unwrap_or_default();
    Ok(Ok(Groups {
        workload: workload_name,
        pod_group: name,
        gang,
        parent,
        pod_group_owner: crate::controllers::controller_ref(&applied),
        resource_claims: applied.spec.resource_claims.clone().unwrap_or_default(),
        created_rollbacks: created.then_some(status.rollbacks),
        claim_statuses: status.resource_claim_statuses,
        api: SchedulingApi::Muster,
        native_conditions: Vec::new(),
    }))
}

//! Upstream mode: the native (`scheduling.k8s.io`) Workload and PodGroup of a job, made once and
//! owned like muster's, for kube-scheduler to admit the gang from.

use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::groups::{Groups, is_child, not_the_sets};
use super::reconcile::owner_ref;
use super::watches::{cached, in_cache};
use super::{FIELD_MANAGER, JobContext, plan};
use crate::controllers::context::{Error, Result};
use crate::controllers::{Made, controller_uid, create_if_absent};
use crate::crds::batch::MusterJob;
use crate::crds::{GROUP_TEMPLATE_ANNOTATION, PARENT_COMPOSITE_ANNOTATION};
use crate::workloadbuilder::job::{JOB_TEMPLATE_NAME, build_options, job_item};
use crate::workloadbuilder::native::{self, SchedulingApi};
use crate::workloadbuilder::{Builder, FieldPath};

/// The native Workload and PodGroup of a job in upstream mode, created once (upstream's
/// objects are immutable where it matters; kube-scheduler admits the gang from them), owned
/// like muster's: a standalone job's PodGroup by the job and by its Workload; a MusterJobSet
/// child's by the job only, made from its set's native Workload and joined to the set's
/// CompositePodGroup (`parentCompositePodGroupName`), so kube-scheduler admits the set whole.
pub(super) async fn ensure_native_groups(
    job: &MusterJob,
    jc: &JobContext,
) -> Result<std::result::Result<Groups, (&'static str, String)>> {
    use k8s_openapi::api::scheduling::{v1alpha3, v1beta1};
    let ctx = &*jc.ctx;
    let (ns, name) = (job.namespace().unwrap_or_default(), job.name_any());
    let owner = owner_ref(job)?;
    let uid = owner.uid.clone();
    let (Some(workloads), Some(groups)) = (&jc.native_workloads, &jc.native_groups) else {
        return Ok(Err(("UpstreamNotServed", "the native scheduling kinds are not watched".into())));
    };
    let wl_api = Api::<v1beta1::Workload>::namespaced(ctx.client.clone(), &ns);
    let pg_api = Api::<v1beta1::PodGroup>::namespaced(ctx.client.clone(), &ns);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let not_ours = |kind: &str| {
        (
            "NameConflict",
            format!("{kind} {name} (scheduling.k8s.io) already exists and is not controlled by this MusterJob"),
        )
    };
    // A standalone job's Workload is its own; a child's is its set's.
    enum Source {
        Standalone(Box<(Builder, v1beta1::Workload)>),
        Child { template: String, parent: String },
    }
    let source = if is_child(job) {
        let a = job.annotations();
        let get = |k: &str| a.get(k).cloned().unwrap_or_default();
        Source::Child { template: get(GROUP_TEMPLATE_ANNOTATION), parent: get(PARENT_COMPOSITE_ANNOTATION) }
    } else {
        let item = job_item(&job.spec, JOB_TEMPLATE_NAME, &FieldPath::new("spec"));
        let builder = Builder::new(item, build_options(&name, &ns, Some(owner.clone())));
        let desired = native::workload(builder.build_workload()?)?;
        // Not cached: made with one create, which finds it if the cache only lags.
        let (found, fresh) = match in_cache(workloads, &ns, &name) {
            Some(w) => (w, false),
            None => match create_if_absent(&wl_api, &name, FIELD_MANAGER, desired.clone()).await? {
                Made::Created(w) => (w, true),
                Made::Exists(w) => (w, false),
            },
        };
        let workload = match found {
            w if controller_uid(&w.metadata) != Some(uid.as_str()) => return Ok(Err(not_ours("Workload"))),
            // The gang's minCount follows the job's, as the Job controller syncs it.
            w if !fresh && native::workload_min_counts_changed(&w, &desired) => {
                wl_api.patch(&name, &params, &Patch::Apply(&desired)).await?
            }
            w => w,
        };
        Source::Standalone(Box::new((builder, workload)))
    };
    let group = match in_cache(groups, &ns, &name) {
        Some(g) if controller_uid(&g.metadata) != Some(uid.as_str()) => return Ok(Err(not_ours("PodGroup"))),
        Some(g) => {
            // The one field of a PodGroup that may change: the gang's minCount, as the job's
            // (a child's: as its set resized it) resolves it now.
            let template = match &source {
                Source::Standalone(_) => JOB_TEMPLATE_NAME.to_string(),
                Source::Child { template, .. } => template.clone(),
            };
            let item = job_item(&job.spec, &template, &FieldPath::new("spec"));
            let own =
                Builder::new(item, build_options(&name, &ns, Some(owner.clone()))).new_pod_group(&name, &template)?;
            let want = own.spec.scheduling_policy.gang.as_ref().and_then(|g| g.min_count);
            let have = g.spec.scheduling_policy.gang.as_ref().map(|g| g.min_count);
            match (want, have) {
                (Some(want), Some(have)) if want != have => {
                    let patch = json!({"spec": {"schedulingPolicy": {"gang": {"minCount": want}}}});
                    pg_api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?
                }
                _ => g,
            }
        }
        None => {
            let compiled = match source {
                Source::Standalone(standalone) => {
                    let (builder, workload) = *standalone;
                    let mut compiled = builder.new_pod_group(&name, JOB_TEMPLATE_NAME)?;
                    let workload_owner = workload.controller_owner_ref(&()).map(|o| plan::plain_owner_ref(&o));
                    compiled.metadata.owner_references.get_or_insert_with(Vec::new).extend(workload_owner);
                    compiled
                }
                Source::Child { template, parent } => {
                    let cpgs = Api::<v1alpha3::CompositePodGroup>::namespaced(ctx.client.clone(), &ns);
                    let cpg = cpgs.get_opt(&parent).await?.ok_or_else(|| {
                        Error::Missing(format!("parent CompositePodGroup {parent} (scheduling.k8s.io) not found yet"))
                    })?;
                    if controller_uid(&cpg.metadata) != plan::owning_set(job) {
                        return Ok(Err(not_the_sets("CompositePodGroup (scheduling.k8s.io)", &parent)));
                    }
                    let wl_name = cpg.spec.workload_ref.workload_name;
                    let workload = cached(workloads, &wl_api, &ns, &wl_name).await?.ok_or_else(|| {
                        Error::Missing(format!("parent Workload {wl_name} (scheduling.k8s.io) not found yet"))
                    })?;
                    let builder = Builder::from_existing_workload(
                        native::from_native_workload(&workload)?,
                        build_options(&wl_name, &ns, Some(owner.clone())),
                    );
                    let mut compiled = builder.new_pod_group(&name, &template)?;
                    compiled.spec.parent_composite_pod_group_name = Some(parent);
                    compiled
                }
            };
            match create_if_absent(&pg_api, &name, FIELD_MANAGER, native::pod_group(&compiled)?).await? {
                Made::Created(g) => g,
                // Made by an earlier pass the cache does not show yet (the next pass syncs its
                // minCount), or by someone else.
                Made::Exists(g) if controller_uid(&g.metadata) != Some(uid.as_str()) => {
                    return Ok(Err(not_ours("PodGroup")));
                }
                Made::Exists(g) => g,
            }
        }
    };
    let gang = if group.spec.disruption_mode.as_ref().is_some_and(|m| m.all.is_some()) {
        plan::Gang::All
    } else if group.spec.scheduling_policy.gang.is_some() {
        plan::Gang::Single
    } else {
        plan::Gang::None
    };
    let workload = group.spec.workload_ref.as_ref().map_or_else(|| name.clone(), |r| r.workload_name.clone());
    Ok(Ok(Groups {
        workload,
        pod_group: name,
        gang,
        parent: group.spec.parent_composite_pod_group_name.clone(),
        pod_group_owner: crate::controllers::controller_ref(&group),
        resource_claims: native::group_claims(&group.spec),
        claim_statuses: Vec::new(),
        created_rollbacks: None,
        api: SchedulingApi::Upstream,
        native_conditions: group.status.and_then(|s| s.conditions).unwrap_or_default(),
    }))
}

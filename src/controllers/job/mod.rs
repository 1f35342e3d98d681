//! The MusterJob reconciler: validate, compile the Workload and PodGroup (or, for a
//! MusterJobSet's child, only the PodGroup from the parent's Workload), run gated pods with
//! batch/v1 semantics, and report status and events. With DRA, it also makes the GPU
//! ResourceClaimTemplate of a job with `spec.gpuClaims` and the shared claims of its PodGroup.
//! The decisions live in `plan` and `claims` (pure).

pub mod claims;
pub mod expected;
pub mod plan;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{Future, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::core::DeserializeGuard;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde_json::json;
use sha2::{Digest, Sha256};

use super::context::{Context, Error, Result, StoreReady};
use super::{conditions, controller_uid};
use crate::crds::batch::{CompletionMode, JobPhase, MusterJob, MusterJobStatus};
use crate::crds::blocks::DisruptionModeKind;
use crate::crds::blocks::PodGroupResourceClaim;
use crate::crds::scheduling::{CompositePodGroup, MAX_DEPTH, PodGroup, PodGroupResourceClaimStatus, Workload};
use crate::crds::{
    GROUP_TEMPLATE_ANNOTATION, JOB_NAME_LABEL, JOBSET_NAME_LABEL, PARENT_COMPOSITE_ANNOTATION,
    SCHEDULING_API_ANNOTATION,
};
use crate::workloadbuilder::job::{JOB_TEMPLATE_NAME, build_options, job_item, validate_job};
use crate::workloadbuilder::native::{self, SchedulingApi};
use crate::workloadbuilder::{Builder, FieldPath};
use claims::GroupClaim;
use plan::{JobPod, ObservedPod, condition};

/// Name of this controller in metrics and logs.
pub const CONTROLLER: &str = "job";
/// Server-side apply field manager of this controller.
pub const FIELD_MANAGER: &str = "muster-job-controller";
/// PodGroup annotation: hashes of the job fields frozen after creation, to notice changes
/// that got past the webhook.
pub const FROZEN_HASH_ANNOTATION: &str = "batch.muster.dev/frozen-fields";
/// How soon a job whose claims could not be made (a template missing, a name taken) is
/// looked at again: nothing muster watches changes when the template appears.
const CLAIM_RETRY: Duration = Duration::from_secs(15);

/// What the reconciles share: the context, the watch cache of the jobs' pods (a reconcile
/// reads its pods there, never with a LIST: a thousand jobs listing their pods on every pod
/// event was what saturated the API server and etcd at 5,000 nodes), the pods created that
/// the cache does not show yet, and the watch caches of the groups and Workloads a job
/// compiles to (a reconcile, one per pod event, read them with two GETs before).
pub struct JobContext {
    ctx: Arc<Context>,
    pods: Store<JobPod>,
    /// Whether `pods` has its first list (awaited by many reconciles at once).
    pods_ready: StoreReady,
    expected: expected::Expected,
    groups: Store<PodGroup>,
    composites: Store<CompositePodGroup>,
    workloads: Store<Workload>,
    /// The native PodGroups and Workloads (jobs in upstream mode), where they are served.
    native_groups: Option<Store<k8s_openapi::api::scheduling::v1beta1::PodGroup>>,
    native_workloads: Option<Store<k8s_openapi::api::scheduling::v1beta1::Workload>>,
    /// Jobs (by UID) whose count-only status change waits since then ([`STATUS_PACE`]).
    paced: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
}

/// How long a status change of `active`/`ready` alone may wait: the counts of a gang's pods
/// starting one by one go out in one write (upstream's Job controller batches pod updates for
/// 1 s too).
const STATUS_PACE: Duration = Duration::from_secs(1);

/// A watch cache of every `K`, managed fields dropped; it triggers no reconcile.
fn cache<K>(client: &kube::Client) -> Store<K>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (store, writer) = reflector::store();
    let stream = watcher::watcher(Api::<K>::all(client.clone()), watcher::Config::default().any_semantic())
        .default_backoff()
        .modify(|o: &mut K| o.meta_mut().managed_fields = None)
        .reflect(writer);
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            if let Err(e) = ev {
                tracing::warn!(error = %e, kind = %K::kind(&Default::default()), "job controller watch");
            }
        }
    });
    store
}

/// `name` in `ns` as `store` shows it, or as the API server has it when the cache does not
/// show it (not listed yet, or just created): the cache may lag, but only behind writes that
/// the next event reconciles again.
async fn cached<K>(store: &Store<K>, api: &Api<K>, ns: &str, name: &str) -> Result<Option<K>>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    match store.get(&reflector::ObjectRef::new(name).within(ns)) {
        Some(o) => Ok(Some((*o).clone())),
        None => Ok(api.get_opt(name).await?),
    }
}

/// Runs the controller until `shutdown` resolves.
pub async fn run(ctx: Arc<Context>, shutdown: impl Future<Output = ()> + Send + Sync + 'static) {
    let jobs = Api::<DeserializeGuard<MusterJob>>::all(ctx.client.clone());
    let pods = Api::<Pod>::all(ctx.client.clone());
    // The cache keeps a record of what a reconcile reads of each pod (`plan::JobPod`), written
    // before the pod's event triggers its job, as kube's `reflect` does.
    let (store, mut writer) = reflector::store();
    let pod_events = watcher::watcher(pods, watcher::Config::default().labels(JOB_NAME_LABEL).any_semantic())
        .default_backoff()
        .inspect_ok(move |ev| writer.apply_watcher_event(&super::map_event(ev, JobPod::of)))
        .touched_objects();
    // Jobs in upstream mode follow their native PodGroups (kube-scheduler's conditions): the
    // groups' events trigger their jobs, through the cache the reconciles read.
    let native = ctx.config.native_scheduling_served;
    let (native_groups, native_group_events) = if native {
        let (store, writer) = reflector::store();
        let events = watcher::watcher(
            Api::<k8s_openapi::api::scheduling::v1beta1::PodGroup>::all(ctx.client.clone()),
            watcher::Config::default().any_semantic(),
        )
        .default_backoff()
        .modify(|g| g.metadata.managed_fields = None)
        .reflect(writer)
        .touched_objects();
        (Some(store), Some(events))
    } else {
        (None, None)
    };
    let context = Arc::new(JobContext {
        groups: cache(&ctx.client),
        composites: cache(&ctx.client),
        workloads: cache(&ctx.client),
        native_groups,
        native_workloads: native.then(|| cache(&ctx.client)),
        ctx,
        pods_ready: StoreReady::of(store.clone()),
        pods: store,
        expected: expected::Expected::default(),
        paced: Default::default(),
    });
    let (jobs_store, jobs_writer) = reflector::store();
    let mut controller = Controller::for_stream(super::trimmed_objects(jobs, jobs_writer), jobs_store)
        .with_config(controller::Config::default().concurrency(super::RECONCILE_CONCURRENCY))
        .owns_stream(pod_events);
    if let Some(events) = native_group_events {
        controller = controller.owns_stream(events);
    }
    controller
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, context)
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "job reconcile");
            }
        })
        .await;
}

fn error_policy(_job: Arc<DeserializeGuard<MusterJob>>, err: &Error, jc: Arc<JobContext>) -> Action {
    super::retry_after_error(CONTROLLER, err, &jc.ctx)
}

async fn reconcile(guard: Arc<DeserializeGuard<MusterJob>>, jc: Arc<JobContext>) -> Result<Action> {
    let ctx = &*jc.ctx;
    let _timer = ctx.metrics.reconcile(CONTROLLER);
    let job = match &guard.0 {
        Ok(job) => job,
        Err(invalid) => {
            super::report_undecodable::<MusterJob>(ctx, invalid).await;
            return Ok(Action::await_change());
        }
    };
    if job.metadata.deletion_timestamp.is_some() {
        jc.expected.forget(&job.uid().unwrap_or_default());
        jc.paced.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&job.uid().unwrap_or_default());
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
    if standalone && job.spec.completion_mode == CompletionMode::Indexed {
        let name = job.name_any();
        let refused = super::apply_headless_service(
            &ctx.client,
            &job.namespace().unwrap_or_default(),
            &name,
            JOB_NAME_LABEL,
            owner_ref(job)?,
            FIELD_MANAGER,
        )
        .await?;
        if let Some(note) = refused {
            ctx.event(&job.object_ref(&()), true, "ServiceConflict", "ApplyService", note).await;
        }
    }
    sync_pods(job, &jc, &group, &PodClaims { gpu_template, group: group_claims }, now).await
}

/// The groups a job's pods join.
struct Groups {
    workload: String,
    pod_group: String,
    gang_all: bool,
    /// The parent CompositePodGroup of a MusterJobSet's child.
    parent: Option<String>,
    /// A controller reference to the PodGroup (the owner of the claims made for it).
    pod_group_owner: Option<OwnerReference>,
    /// The PodGroup's `spec.resourceClaims`.
    resource_claims: Vec<PodGroupResourceClaim>,
    /// The PodGroup's `status.resourceClaimStatuses` as read.
    claim_statuses: Vec<PodGroupResourceClaimStatus>,
    /// The PodGroup's `status.rollbacks` when this reconcile created it: the API server's
    /// answer, as fresh as a read ([`admission_attempt`] asks again otherwise).
    created_rollbacks: Option<i32>,
    /// The API the groups are in.
    api: SchedulingApi,
    /// The native PodGroup's conditions (upstream API), as cached.
    native_conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
}

/// The claims a job's new pods reference.
struct PodClaims {
    /// The job's GPU ResourceClaimTemplate (`spec.gpuClaims` with GPU containers).
    gpu_template: Option<String>,
    /// The PodGroup's claims, and what kept some from being made.
    group: GroupClaims,
}

/// The claims of a PodGroup and the reasons some are not made yet.
struct GroupClaims {
    claims: Vec<GroupClaim>,
    /// `(reason, message)` per claim that could not be made.
    problems: Vec<(&'static str, String)>,
}

/// A child of a set: it carries the delegation annotations AND a MusterJobSet controls it
/// (its controller ownerReference). The annotations alone, which anyone who may write the job
/// may set, never make a job join a set's CompositePodGroup.
fn is_child(job: &MusterJob) -> bool {
    let a = job.annotations();
    a.contains_key(GROUP_TEMPLATE_ANNOTATION)
        && a.contains_key(PARENT_COMPOSITE_ANNOTATION)
        && plan::owning_set(job).is_some()
}

/// The refusal for a child whose parent group `kind` `name` is not controlled by the set that
/// controls the child.
fn not_the_sets(kind: &str, name: &str) -> (&'static str, String) {
    (
        "NotInSet",
        format!(
            "{kind} {name} named by annotation {PARENT_COMPOSITE_ANNOTATION} is not controlled by the MusterJobSet that controls this MusterJob"
        ),
    )
}

fn owner_ref(job: &MusterJob) -> Result<OwnerReference> {
    super::controller_ref(job).ok_or_else(|| Error::Missing("the MusterJob has no uid yet".into()))
}

/// Hashes of the fields frozen after creation, as `part=hash` pairs.
fn frozen_hashes(job: &MusterJob) -> Result<String> {
    let mut scheduling = serde_json::to_value(&job.spec.scheduling)?;
    if let Some(gang) = scheduling.pointer_mut("/schedulingPolicy/gang").and_then(|g| g.as_object_mut()) {
        gang.remove("minCount");
    }
    let parts = [
        ("template", serde_json::to_value(&job.spec.template)?),
        ("completions", json!([job.spec.completions, job.spec.completion_mode])),
        ("scheduling", scheduling),
        ("gpuClaims", serde_json::to_value(&job.spec.gpu_claims)?),
    ];
    Ok(parts
        .iter()
        .map(|(name, v)| {
            let digest = Sha256::digest(v.to_string().as_bytes());
            format!("{name}={}", &hex::encode(digest)[..12])
        })
        .collect::<Vec<_>>()
        .join(","))
}

fn changed_parts(old: &str, new: &str) -> Vec<String> {
    let parse = |s: &str| -> BTreeMap<String, String> {
        s.split(',').filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
    };
    let (o, n) = (parse(old), parse(new));
    n.iter().filter(|(k, v)| o.get(*k).is_some_and(|ov| ov != *v)).map(|(k, _)| format!("spec.{k}")).collect()
}

/// Applies the Workload (standalone jobs) and the PodGroup. `Ok(Err(..))` means the job must
/// not be acted on (a name taken by another owner, or a frozen field changed).
async fn ensure_groups(
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
    let existing = cached(&jc.groups, &pgs, &ns, &name).await?;
    let existing_priority = existing.as_ref().map(|e| e.spec.priority);
    if let Some(existing) = &existing {
        if controller_uid(&existing.metadata) != Some(uid.as_str()) {
            return Ok(Err((
                "NameConflict",
                format!("PodGroup {name} already exists and is not controlled by this MusterJob"),
            )));
        }
        if let Some(old) = existing.annotations().get(FROZEN_HASH_ANNOTATION) {
            let changed = changed_parts(old, &hashes);
            if !changed.is_empty() {
                return Ok(Err((
                    "FrozenFieldChanged",
                    format!(
                        "{} changed after creation; muster does not act on changes to frozen fields (only scheduling.schedulingPolicy.gang.minCount and parallelism may change)",
                        changed.join(", ")
                    ),
                )));
            }
        }
    }
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
        let existing_workload = cached(&jc.workloads, &wls, &ns, &name).await?;
        if let Some(existing) = &existing_workload
            && controller_uid(&existing.metadata) != Some(uid.as_str())
        {
            return Ok(Err((
                "NameConflict",
                format!("Workload {name} already exists and is not controlled by this MusterJob"),
            )));
        }
        let applied = super::apply_if_changed(&wls, &name, &params, workload, existing_workload).await?;
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
    pg.metadata.annotations = Some(BTreeMap::from([(FROZEN_HASH_ANNOTATION.to_string(), hashes)]));
    let gang_all = pg.spec.disruption_mode.kind() == Some(DisruptionModeKind::All);
    let created = existing.is_none();
    let applied = super::apply_if_changed(&pgs, &name, &params, pg, existing).await?;
    let status = applied.status.clone().unwrap_or_default();
    Ok(Ok(Groups {
        workload: workload_name,
        pod_group: name,
        gang_all,
        parent,
        pod_group_owner: super::controller_ref(&applied),
        resource_claims: applied.spec.resource_claims.clone().unwrap_or_default(),
        created_rollbacks: created.then_some(status.rollbacks),
        claim_statuses: status.resource_claim_statuses,
        api: SchedulingApi::Muster,
        native_conditions: Vec::new(),
    }))
}

/// The scheduling API of `job`: the one recorded on it (`batch.muster.dev/scheduling-api`),
/// or, on its first sync, the one chosen now ([`native::first_scheduling_api`]), recorded before
/// anything is compiled, so the job keeps it whatever `--scheduling-api` says later.
async fn scheduling_api(
    job: &MusterJob,
    jc: &JobContext,
) -> Result<std::result::Result<SchedulingApi, (&'static str, String)>> {
    let ctx = &*jc.ctx;
    let (ns, name, uid) = (job.namespace().unwrap_or_default(), job.name_any(), job.uid());
    let mine = |owner: Option<&str>| owner == uid.as_deref();
    let muster_group =
        jc.groups.get(&reflector::ObjectRef::new(&name).within(&ns)).is_some_and(|g| mine(controller_uid(&g.metadata)));
    if let Some(recorded) = job.annotations().get(SCHEDULING_API_ANNOTATION) {
        let native_group = jc
            .native_groups
            .as_ref()
            .and_then(|s| s.get(&reflector::ObjectRef::new(&name).within(&ns)))
            .is_some_and(|g| mine(controller_uid(&g.metadata)));
        let served = ctx.config.native_scheduling_served && (!is_child(job) || ctx.config.native_composite_served);
        let dropped = ctx.config.native_fields.dropped_by_job(&job.spec, "spec.scheduling");
        return Ok(native::recorded_scheduling_api(recorded, muster_group, native_group, served, &dropped));
    }
    let dropped = ctx.config.native_fields.dropped_by_job(&job.spec, "spec.scheduling");
    let (api, why) = native::first_scheduling_api(is_child(job), ctx.config.scheduling_api, muster_group, &dropped);
    super::record_scheduling_api(ctx, job, api, why).await?;
    Ok(Ok(api))
}

/// The native Workload and PodGroup of a job in upstream mode, created once (upstream's
/// objects are immutable where it matters; kube-scheduler admits the gang from them), owned
/// like muster's: a standalone job's PodGroup by the job and by its Workload; a MusterJobSet
/// child's by the job only, made from its set's native Workload and joined to the set's
/// CompositePodGroup (`parentCompositePodGroupName`), so kube-scheduler admits the set whole.
async fn ensure_native_groups(
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
        let workload = match cached(workloads, &wl_api, &ns, &name).await? {
            Some(w) if controller_uid(&w.metadata) != Some(uid.as_str()) => return Ok(Err(not_ours("Workload"))),
            // The gang's minCount follows the job's, as the Job controller syncs it.
            Some(w) if native::workload_min_counts_changed(&w, &desired) => {
                wl_api.patch(&name, &params, &Patch::Apply(&desired)).await?
            }
            Some(w) => w,
            None => wl_api.patch(&name, &params, &Patch::Apply(&desired)).await?,
        };
        Source::Standalone(Box::new((builder, workload)))
    };
    let group = match cached(groups, &pg_api, &ns, &name).await? {
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
            pg_api.patch(&name, &params, &Patch::Apply(&native::pod_group(&compiled)?)).await?
        }
    };
    let gang_all = group.spec.disruption_mode.as_ref().is_some_and(|m| m.all.is_some());
    let workload = group.spec.workload_ref.as_ref().map_or_else(|| name.clone(), |r| r.workload_name.clone());
    Ok(Ok(Groups {
        workload,
        pod_group: name,
        gang_all,
        parent: group.spec.parent_composite_pod_group_name.clone(),
        pod_group_owner: super::controller_ref(&group),
        resource_claims: native::group_claims(&group.spec),
        claim_statuses: Vec::new(),
        created_rollbacks: None,
        api: SchedulingApi::Upstream,
        native_conditions: group.status.and_then(|s| s.conditions).unwrap_or_default(),
    }))
}

/// Rollbacks of the job's root gang so far (its `status.rollbacks`), read from the API server,
/// not a cache: new pods carry it as their `scheduling.muster.dev/gang-attempt`, and a cache
/// could still show the count before the rollback whose deleted pods they replace. Read only
/// when pods are created, unless this reconcile created the group (its answer says). A
/// standalone job's PodGroup is its root; a child's root is the top CompositePodGroup.
async fn admission_attempt(ctx: &Context, ns: &str, groups: &Groups) -> Result<i32> {
    if groups.api == SchedulingApi::Upstream {
        // kube-scheduler admits the gang; muster never rolls it back.
        return Ok(0);
    }
    match (&groups.parent, groups.created_rollbacks) {
        (None, Some(rollbacks)) => Ok(rollbacks),
        (None, None) => {
            let pg = Api::<PodGroup>::namespaced(ctx.client.clone(), ns).get_opt(&groups.pod_group).await?;
            Ok(pg.and_then(|g| g.status).map_or(0, |s| s.rollbacks))
        }
        (Some(parent), _) => {
            let cpg = Api::<CompositePodGroup>::namespaced(ctx.client.clone(), ns)
                .get_opt(parent)
                .await?
                .ok_or_else(|| Error::Missing(format!("parent CompositePodGroup {parent} not found yet")))?;
            root_rollbacks(ctx, ns, cpg).await
        }
    }
}

/// The rollbacks recorded on the root of the CompositePodGroup tree `cpg` belongs to.
async fn root_rollbacks(ctx: &Context, ns: &str, mut cpg: CompositePodGroup) -> Result<i32> {
    let api = Api::<CompositePodGroup>::namespaced(ctx.client.clone(), ns);
    for _ in 0..MAX_DEPTH {
        let Some(parent) = cpg.spec.parent_composite_pod_group_name.clone() else { break };
        match api.get_opt(&parent).await? {
            Some(p) => cpg = p,
            None => break,
        }
    }
    Ok(cpg.status.as_ref().map_or(0, |s| s.rollbacks))
}

async fn sync_pods(
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
    let pods: Vec<&JobPod> = cached.iter().map(|p| &**p).filter(|p| p.of_job(&ns, &name, &uid)).collect();
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
    let subdomain = plan::job_labels(job)
        .remove(JOBSET_NAME_LABEL)
        .or_else(|| (job.spec.completion_mode == CompletionMode::Indexed).then(|| name.clone()));
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

/// The most pod creates of one job in flight at once.
const CREATE_BATCH_MAX: usize = 16;
/// How soon a job that made one batch of pods ([`plan::CREATE_PER_PASS`]) of more it needs is
/// looked at again, at the latest.
const NEXT_BATCH: Duration = Duration::from_secs(1);

/// Creates `pods` in batches of 1, 2, 4, ... up to [`CREATE_BATCH_MAX`] pods, each batch's
/// creates at once, as upstream's Job controller does ("slow start"): a gang's pods are made
/// in a few round trips, not one each, and a create that fails (a quota, a webhook refusing)
/// costs one call, not one per pod. Stops after the batch in which a create failed. Returns
/// the names made and the first error (a name taken already, 409, is not one).
async fn create_pods(api: &Api<Pod>, pods: Vec<Pod>) -> (Vec<String>, Option<kube::Error>) {
    let mut created = Vec::new();
    let mut pods = pods.into_iter().peekable();
    let mut batch = 1;
    while pods.peek().is_some() {
        let creates =
            pods.by_ref().take(batch).map(|pod| async move { api.create(&PostParams::default(), &pod).await });
        let mut failed = None;
        for result in futures::future::join_all(creates).await {
            match result {
                Ok(p) => created.push(p.name_any()),
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        if failed.is_some() {
            return (created, failed);
        }
        batch = (batch * 2).min(CREATE_BATCH_MAX);
    }
    (created, None)
}

/// Creates the job's GPU ResourceClaimTemplate `<job>-gpus` when `spec.gpuClaims` is set and a
/// container asks for GPUs, and returns its name. `Ok(Err(..))`: a template of that name is
/// someone else's, or asks for other devices than the job needs (a template's spec cannot
/// change, so muster never edits it); no pod may claim from it.
async fn ensure_gpu_template(
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
                    ctx.event(&job.object_ref(&()), false, "SuccessfulCreate", "CreateClaims", note).await;
                    return Ok(Ok(Some(name)));
                }
                Err(kube::Error::Api(e)) if e.code == 409 => api.get(&name).await?,
                Err(e) => {
                    let note = format!("Error creating ResourceClaimTemplate {name}: {e}");
                    ctx.event(&job.object_ref(&()), true, "FailedCreate", "CreateClaims", note).await;
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
async fn ensure_group_claims(job: &MusterJob, ctx: &Context, groups: &Groups) -> Result<GroupClaims> {
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
        ctx.event(&job.object_ref(&()), false, "SuccessfulCreate", "CreateClaims", note).await;
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
async fn report_claims(
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
        ctx.event(&job.object_ref(&()), true, reason, "CreateClaims", message).await;
    }
    !ready
}

/// Writes the job's status when it changed. A change of the live counts alone
/// ([`plan::status_may_wait`]) waits up to [`STATUS_PACE`] from when it was first seen, so
/// several fold into one write; returns when to look again for such a change.
async fn write_status(job: &MusterJob, jc: &JobContext, status: &MusterJobStatus) -> Result<Option<Duration>> {
    let uid = job.uid().unwrap_or_default();
    let lock = || jc.paced.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if job.status.as_ref() == Some(status) {
        lock().remove(&uid);
        return Ok(None);
    }
    if plan::status_may_wait(job.status.as_ref(), status) {
        let now = std::time::Instant::now();
        let since = *lock().entry(uid.clone()).or_insert(now);
        let due = since + STATUS_PACE;
        if now < due {
            return Ok(Some(due - now));
        }
    }
    write_status_now(job, &jc.ctx, status).await?;
    lock().remove(&uid);
    Ok(None)
}

async fn write_status_now(job: &MusterJob, ctx: &Context, status: &MusterJobStatus) -> Result<()> {
    let api = Api::<MusterJob>::namespaced(ctx.client.clone(), &job.namespace().unwrap_or_default());
    let body = json!({"apiVersion": "batch.muster.dev/v1alpha1", "kind": "MusterJob", "status": status});
    api.patch_status(&job.name_any(), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body)).await?;
    Ok(())
}

/// Marks the job Invalid. `retry`: look again after that long (the cause is outside the job,
/// e.g. an object in the way), instead of waiting for the job to change.
async fn set_invalid(
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
        ctx.event(&job.object_ref(&()), true, reason, "Validate", message).await;
    }
    if job.status.as_ref() != Some(&status) {
        write_status_now(job, ctx, &status).await?;
    }
    Ok(retry.map_or_else(Action::await_change, Action::requeue))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frozen_hashes_ignore_min_count_and_parallelism() {
        let mut job: MusterJob = serde_json::from_value(json!({
            "apiVersion": "batch.muster.dev/v1alpha1", "kind": "MusterJob",
            "metadata": {"name": "j"},
            "spec": {"parallelism": 2, "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}},
                     "scheduling": {"schedulingPolicy": {"gang": {"minCount": 2}}}},
        }))
        .expect("fixture");
        let before = frozen_hashes(&job).expect("hash");
        job.spec.parallelism = 4;
        if let Some(g) =
            job.spec.scheduling.as_mut().and_then(|s| s.scheduling_policy.as_mut()).and_then(|p| p.gang.as_mut())
        {
            g.min_count = Some(4);
        }
        assert!(changed_parts(&before, &frozen_hashes(&job).expect("hash")).is_empty());
        job.spec.scheduling = None;
        job.spec.completions = Some(9);
        assert_eq!(
            changed_parts(&before, &frozen_hashes(&job).expect("hash")),
            vec!["spec.completions", "spec.scheduling"]
        );
    }

    /// A fake API server that creates pods (a name per request, in order), refuses the pods
    /// named `refused-*` (403) and finds `taken-*` taken (409); each create takes 30 ms, and the
    /// most creates in flight at once is kept.
    async fn fake_pods_api() -> (Api<Pod>, Arc<std::sync::Mutex<Vec<String>>>, Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let _ = rustls::crypto::ring::default_provider().install_default();
        let names: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
        let (in_flight, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (seen, most) = (names.clone(), peak.clone());
        let app = axum::Router::new().fallback(move |body: String| {
            let (seen, in_flight, most) = (seen.clone(), in_flight.clone(), most.clone());
            async move {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(30)).await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                let pod: Pod = serde_json::from_str(&body).expect("a pod");
                let name = pod.metadata.name.clone().unwrap_or_default();
                seen.lock().unwrap().push(name.clone());
                let status = |code: u16, reason: &str| {
                    let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
                                      "reason": reason, "message": format!("{name}: {reason}")});
                    (axum::http::StatusCode::from_u16(code).expect("code"), body.to_string())
                };
                if name.starts_with("refused-") {
                    status(403, "Forbidden")
                } else if name.starts_with("taken-") {
                    status(409, "AlreadyExists")
                } else {
                    (axum::http::StatusCode::CREATED, body)
                }
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let client =
            kube::Client::try_from(kube::Config::new(format!("http://{addr}").parse().expect("url"))).expect("client");
        (Api::namespaced(client, "ns"), names, peak)
    }

    fn pods(names: &[&str]) -> Vec<Pod> {
        names
            .iter()
            .map(|n| Pod {
                metadata: kube::api::ObjectMeta { name: Some(n.to_string()), ..Default::default() },
                ..Default::default()
            })
            .collect()
    }

    #[tokio::test]
    async fn pods_are_created_in_doubling_batches_and_a_failed_batch_is_the_last() {
        let (api, seen, peak) = fake_pods_api().await;
        let names: Vec<String> = (0..10).map(|i| format!("p{i}")).collect();
        let (created, failed) = create_pods(&api, pods(&names.iter().map(String::as_str).collect::<Vec<_>>())).await;
        assert!(failed.is_none(), "{failed:?}");
        assert_eq!(created, names, "every pod, in order");
        // Batches of 1, 2, 4 and the last 3: never more than 4 in flight, and more than one.
        let peak = peak.load(std::sync::atomic::Ordering::SeqCst);
        assert!((2..=4).contains(&peak), "peak in flight: {peak}");
        assert_eq!(seen.lock().unwrap().len(), 10);

        // The second batch has a refusal: its other pod is made, and nothing after it is tried.
        let (api, seen, _) = fake_pods_api().await;
        let (created, failed) = create_pods(&api, pods(&["a", "refused-b", "c", "d", "e"])).await;
        assert_eq!(created, vec!["a", "c"]);
        assert!(matches!(failed, Some(kube::Error::Api(ref e)) if e.code == 403), "{failed:?}");
        let mut tried = seen.lock().unwrap().clone();
        tried.sort();
        assert_eq!(tried, vec!["a", "c", "refused-b"]);

        // A name taken already is no failure and nothing made.
        let (api, _, _) = fake_pods_api().await;
        let (created, failed) = create_pods(&api, pods(&["taken-a", "b", "c"])).await;
        assert_eq!((created, failed.is_none()), (vec!["b".to_string(), "c".to_string()], true));
    }
}

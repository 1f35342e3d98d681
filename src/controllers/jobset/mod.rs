//! The MusterJobSet reconciler: validate, compile the Workload and the root
//! CompositePodGroup, keep `replicas` child MusterJobs per replicatedJob (annotated so each
//! builds only its PodGroup from the set's Workload), the set's headless Service (`network`),
//! and JobSet v1alpha2's semantics: failure policy and restarts, success policy, startup order
//! and `dependsOn`, suspend and resume, TTL after finishing, `managedBy`. The decisions live
//! in `plan` (pure); this shell only reads and writes.

mod network;

/// What the controller decides for a MusterJobSet (pure, in the core).
pub use muster_core::jobs::set as plan;

use std::sync::Arc;

use futures::{Future, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::core::DeserializeGuard;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::context::{Context, Error, Result};
use super::lean_writes;
use super::own_writes::OwnWrites;
use super::{conditions, controller_uid};
use crate::crds::batch::{JobSetPhase, MusterJob, MusterJobSet, MusterJobSetStatus};
use crate::crds::scheduling::{CompositePodGroup, Workload};
use crate::crds::{JOBSET_NAME_LABEL, SCHEDULING_API_ANNOTATION};
use crate::workloadbuilder::Builder;
use crate::workloadbuilder::job::{
    build_options, jobset_item, jobset_size_errors, pod_making_classes, root_template_name, validate_jobset,
};
use crate::workloadbuilder::native::{self, SchedulingApi};
use crate::workloadbuilder::objects::refuse_own_write;
use plan::{ObservedChild, condition};

/// Name of this controller in metrics and logs.
pub const CONTROLLER: &str = "jobset";
/// Server-side apply field manager of this controller.
pub const FIELD_MANAGER: &str = "muster-jobset-controller";
/// Children listed per request.
const LIST_PAGE: u32 = 500;
/// How soon a set that made one batch of children ([`plan::CREATE_PER_PASS`]) of more it needs
/// is looked at again, at the latest.
const NEXT_BATCH: std::time::Duration = std::time::Duration::from_secs(1);

/// How soon a set whose cached object is older than this controller's last write to it is
/// looked at again (the write's own watch event comes sooner, normally).
const OWN_WRITE_RETRY: std::time::Duration = std::time::Duration::from_millis(200);

/// The controller's context: the manager's, and the version of each set its last status
/// write made ([`OwnWrites`]): a set read older than that is not planned (its restarts and
/// conditions would undo the write).
struct SetContext {
    ctx: Arc<Context>,
    written: OwnWrites,
}

/// Runs the controller until `shutdown` resolves.
pub async fn run(ctx: Arc<Context>, shutdown: impl Future<Output = ()> + Send + Sync + 'static) {
    let sets = Api::<DeserializeGuard<MusterJobSet>>::all(ctx.client.clone());
    let jobs = Api::<DeserializeGuard<MusterJob>>::all(ctx.client.clone());
    let (store, writer) = kube::runtime::reflector::store();
    let mut controller = Controller::for_stream(super::trimmed_objects(sets, writer), store)
        .with_config(controller::Config::default().concurrency(super::RECONCILE_CONCURRENCY))
        .owns(jobs, watcher::Config::default().labels(JOBSET_NAME_LABEL).any_semantic());
    // Upstream mode: a set follows its native CompositePodGroup's conditions, where served.
    if ctx.config.native_composite_served {
        let cpgs = Api::<k8s_openapi::api::scheduling::v1alpha3::CompositePodGroup>::all(ctx.client.clone());
        controller = controller.owns(cpgs, watcher::Config::default().any_semantic());
    }
    controller
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, Arc::new(SetContext { ctx, written: OwnWrites::default() }))
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "jobset reconcile");
            }
        })
        .await;
}

fn error_policy(_set: Arc<DeserializeGuard<MusterJobSet>>, err: &Error, sc: Arc<SetContext>) -> Action {
    super::retry_after_error(CONTROLLER, err, &sc.ctx)
}

async fn reconcile(guard: Arc<DeserializeGuard<MusterJobSet>>, sc: Arc<SetContext>) -> Result<Action> {
    let ctx = &sc.ctx;
    let _timer = ctx.metrics.reconcile(CONTROLLER);
    let set = match &guard.0 {
        Ok(set) => set,
        Err(invalid) => {
            super::report_undecodable::<MusterJobSet>(ctx, invalid);
            return Ok(Action::await_change());
        }
    };
    let uid = set.uid().unwrap_or_default();
    if set.metadata.deletion_timestamp.is_some() {
        sc.written.forget(&uid);
        return Ok(Action::await_change());
    }
    // The cache does not show this controller's last status write yet (another object's event
    // ran the set first): its restarts, conditions and attempt would be those before the write.
    if sc.written.lagging(&uid, set.metadata.resource_version.as_deref(), std::time::Instant::now()).is_some() {
        tracing::debug!(set = %set.name_any(), "the set's status written is not cached yet");
        return Ok(Action::requeue(OWN_WRITE_RETRY));
    }
    // A set another controller manages (JobSet's `managedBy`, e.g. MultiKueue) is left alone:
    // no child, no status.
    if !set.spec.managed_by_muster() {
        return Ok(Action::await_change());
    }
    let now = Timestamp::now();
    let namespace = set.namespace().unwrap_or_default();
    if let Some(message) = crate::webhook::config::excluded_namespace(&namespace, &ctx.config.namespace) {
        return set_invalid(set, &sc, "NamespaceExcluded", &message, now).await;
    }
    let errors = validate_jobset(set, None);
    if !errors.is_empty() {
        let message = crate::workloadbuilder::field::joined(&errors);
        return set_invalid(set, &sc, "InvalidSpec", &message, now).await;
    }
    // The cluster's own bound (`--max-job-pods`): a set over it makes no children.
    let errors = jobset_size_errors(&set.spec, ctx.config.max_job_pods);
    if !errors.is_empty() {
        let message = crate::workloadbuilder::field::joined(&errors);
        return set_invalid(set, &sc, "PodLimitExceeded", &message, now).await;
    }
    let ns = set.namespace().unwrap_or_default();
    let name = set.name_any();
    let owner = super::controller_ref(set).ok_or_else(|| Error::Missing("the MusterJobSet has no uid yet".into()))?;
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let api = match scheduling_api(set, ctx).await? {
        Ok(api) => api,
        Err((reason, message)) => return set_invalid(set, &sc, reason, &message, now).await,
    };
    let roots = match api {
        SchedulingApi::Muster => ensure_roots(set, ctx, &owner).await?,
        SchedulingApi::Upstream => ensure_native_roots(set, ctx, &owner).await?,
    };
    let Roots { name: root_name, composite_conditions } = match roots {
        Ok(roots) => roots,
        Err((reason, message)) => return set_invalid(set, &sc, reason, &message, now).await,
    };
    if let Some(note) = network::apply(&ctx.client, set, owner.clone(), FIELD_MANAGER).await? {
        ctx.event(&set.object_ref(&()), true, "ServiceConflict", "ApplyService", note);
    }

    let jobs = Api::<MusterJob>::namespaced(ctx.client.clone(), &ns);
    // The children, a page at a time, kept as what the set logic reads of each.
    let mut observed: Vec<ObservedChild> = Vec::new();
    let mut list = ListParams::default().labels(&format!("{JOBSET_NAME_LABEL}={name}")).limit(LIST_PAGE);
    loop {
        let page = jobs.list(&list).await?;
        observed.extend(
            page.items
                .iter()
                .filter(|j| controller_uid(&j.metadata) == Some(uid.as_str()))
                .map(ObservedChild::from_job),
        );
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => list = list.continue_token(&token),
            None => break,
        }
    }
    let mut decision = plan::plan(set, &observed, now);
    decision.status.workload_name = root_name.clone();
    decision.status.composite_pod_group_name = root_name;
    // Upstream mode: where kube-scheduler has the set's CompositePodGroup, told once per change
    // (with the write that records it, below).
    let mirrored = match api {
        SchedulingApi::Upstream => {
            let prev = set.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
            let derived = plan::composite_conditions(&composite_conditions, &observed, decision.status.restarts);
            conditions::mirror(&mut decision.status.conditions, &derived, &prev, &plan::SET_MIRRORED_CONDITIONS)
        }
        SchedulingApi::Muster => Vec::new(),
    };
    let reference = set.object_ref(&());

    for (child, why) in &decision.delete {
        // Foreground: the name is free again only once the child's pods and groups are gone.
        match jobs.delete(child, &DeleteParams::foreground()).await {
            Ok(_) => tracing::info!(set = %name, child, why, "deleted child"),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    let mut created = Vec::new();
    for (r, i) in &decision.create {
        if let Some(child) = plan::child_job(set, *r, *i, decision.status.restarts, api) {
            let child_name = child.name_any();
            jobs.patch(&child_name, &params, &Patch::Apply(&child)).await?;
            created.push(child_name);
        }
    }
    if !created.is_empty() {
        ctx.event(
            &reference,
            false,
            "SuccessfulCreate",
            "CreateJobs",
            format!("Created child MusterJob(s): {}", created.join(", ")),
        );
    }
    for r in &decision.resize {
        let mut patch = json!({"spec": {"parallelism": r.parallelism}});
        if let Some(completions) = r.completions {
            patch["spec"]["completions"] = json!(completions);
        }
        if r.gang {
            patch["spec"]["scheduling"] = json!({"schedulingPolicy": {"gang": {"minCount": r.min_count}}});
        }
        jobs.patch(&r.child, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    }
    for (child, suspend) in &decision.suspend {
        let patch = json!({"spec": {"suspend": suspend}});
        jobs.patch(child, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    }
    for (warning, reason, message) in &decision.events {
        ctx.event(&reference, *warning, reason, "Sync", message.clone());
    }
    write_status(set, &sc, &decision.status).await?;
    // `ttlSecondsAfterFinished` ran out: the set goes, and with it (foreground) all it made.
    if decision.delete_set {
        let sets = Api::<MusterJobSet>::namespaced(ctx.client.clone(), &ns);
        match sets.delete(&name, &DeleteParams::foreground()).await {
            Ok(_) => tracing::info!(set = %name, "deleted finished set (ttlSecondsAfterFinished)"),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        return Ok(Action::await_change());
    }
    for c in &mirrored {
        let warning = c.status == "False" && c.type_ == condition::COMPOSITE_SCHEDULED;
        let note = format!("CompositePodGroup {name} (scheduling.k8s.io): {}={}: {}", c.type_, c.status, c.message);
        ctx.event(&reference, warning, &c.reason, "Schedule", note);
    }
    // More children than one batch were missing: the children made trigger the next pass, and
    // this makes sure of it.
    Ok(match decision.requeue_after {
        _ if decision.more_to_create => Action::requeue(NEXT_BATCH),
        Some(after) => Action::requeue(after),
        None => Action::await_change(),
    })
}

/// The set's root objects: the name of its Workload and CompositePodGroup (`None` without
/// `spec.scheduling`) and, in upstream mode, the native CompositePodGroup's conditions.
struct Roots {
    name: Option<String>,
    composite_conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
}

/// Why the set must not be acted on: a reason and a message.
type Refusal = (&'static str, String);

/// muster's Workload and root CompositePodGroup of a set with `spec.scheduling`.
async fn ensure_roots(
    set: &MusterJobSet,
    ctx: &Context,
    owner: &OwnerReference,
) -> Result<std::result::Result<Roots, Refusal>> {
    let (ns, name) = (set.namespace().unwrap_or_default(), set.name_any());
    let Some(item) = jobset_item(&set.spec) else {
        return Ok(Ok(Roots { name: None, composite_conditions: Vec::new() }));
    };
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let builder = Builder::new(item, build_options(&name, &ns, Some(owner.clone())));
    let workload = builder.build_workload()?.clone();
    let mut cpg = builder.new_composite_pod_group(&name, &root_template_name(&set.spec))?;
    let wls = Api::<Workload>::namespaced(ctx.client.clone(), &ns);
    let cpgs = Api::<CompositePodGroup>::namespaced(ctx.client.clone(), &ns);
    let existing_cpg = cpgs.get_opt(&name).await?;
    // The CompositePodGroup states the highest class among the replicatedJobs that make pods,
    // with that class's value (the webhook checks the two agree), fixed when it is made (the
    // fields are immutable); only replicatedJobs that make pods count ([`pod_making_classes`]).
    // Admission ranks the set at its pods' resolved priority anyway.
    (cpg.spec.priority, cpg.spec.priority_class_name) = match &existing_cpg {
        Some(c) => (c.spec.priority, c.spec.priority_class_name.clone()),
        None => {
            let mut best: Option<(i32, Option<String>)> = None;
            for class in pod_making_classes(&set.spec) {
                // A class that does not exist is the pods' to fail on (the API server refuses
                // them, naming it): the group names none of it.
                let Some(value) = ctx.priorities.value_of(&ctx.client, class).await? else { continue };
                if best.as_ref().is_none_or(|(v, _)| value > *v) {
                    best = Some((value, class.map(String::from)));
                }
            }
            best.map_or((None, None), |(v, class)| (Some(v), class))
        }
    };
    let existing_workload = wls.get_opt(&name).await?;
    let metas = [
        ("Workload", existing_workload.as_ref().map(|w| &w.metadata)),
        ("CompositePodGroup", existing_cpg.as_ref().map(|c| &c.metadata)),
    ];
    if let Some(conflict) = name_conflict(&name, &owner.uid, "", &metas) {
        return Ok(Err(conflict));
    }
    let refused = refuse_own_write(&workload, existing_workload.as_ref())
        .or_else(|| refuse_own_write(&cpg, existing_cpg.as_ref()));
    if let Some(refused) = refused {
        return Ok(Err(refused));
    }
    super::apply_if_changed(&wls, &name, &params, workload, existing_workload).await?;
    super::apply_if_changed(&cpgs, &name, &params, cpg, existing_cpg).await?;
    Ok(Ok(Roots { name: Some(name), composite_conditions: Vec::new() }))
}

/// A `NameConflict` refusal when one of the objects named `name` exists and is not controlled
/// by the set `uid`. `api` goes after the kind in the message (the native group, or nothing).
fn name_conflict(name: &str, uid: &str, api: &str, metas: &[(&str, Option<&ObjectMeta>)]) -> Option<Refusal> {
    metas.iter().find(|(_, meta)| meta.is_some_and(|m| controller_uid(m) != Some(uid))).map(|(kind, _)| {
        ("NameConflict", format!("{kind} {name}{api} already exists and is not controlled by this MusterJobSet"))
    })
}

/// The native Workload (`v1beta1`) and root CompositePodGroup (`v1alpha3`) of a set in
/// upstream mode, created once (their specs are immutable; kube-scheduler admits the tree from
/// them): each child's PodGroup joins the root through `parentCompositePodGroupName`.
async fn ensure_native_roots(
    set: &MusterJobSet,
    ctx: &Context,
    owner: &OwnerReference,
) -> Result<std::result::Result<Roots, Refusal>> {
    use k8s_openapi::api::scheduling::{v1alpha3, v1beta1};
    let (ns, name) = (set.namespace().unwrap_or_default(), set.name_any());
    let Some(item) = jobset_item(&set.spec) else {
        return Ok(Ok(Roots { name: None, composite_conditions: Vec::new() }));
    };
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let builder = Builder::new(item, build_options(&name, &ns, Some(owner.clone())));
    let wls = Api::<v1beta1::Workload>::namespaced(ctx.client.clone(), &ns);
    let cpgs = Api::<v1alpha3::CompositePodGroup>::namespaced(ctx.client.clone(), &ns);
    let (workload, cpg) = (wls.get_opt(&name).await?, cpgs.get_opt(&name).await?);
    let metas = [
        ("Workload", workload.as_ref().map(|w| &w.metadata)),
        ("CompositePodGroup", cpg.as_ref().map(|c| &c.metadata)),
    ];
    if let Some(conflict) = name_conflict(&name, &owner.uid, " (scheduling.k8s.io)", &metas) {
        return Ok(Err(conflict));
    }
    // Made once; applied again only when a template's gang minCount changed (a replicatedJob
    // resized), the one field of it that may change.
    let desired = native::workload(builder.build_workload()?)?;
    if workload.is_none_or(|w| native::workload_min_counts_changed(&w, &desired)) {
        wls.patch(&name, &params, &Patch::Apply(&desired)).await?;
    }
    let cpg = match cpg {
        Some(cpg) => cpg,
        None => {
            let compiled = builder.new_composite_pod_group(&name, &root_template_name(&set.spec))?;
            cpgs.patch(&name, &params, &Patch::Apply(&native::composite_pod_group(&compiled)?)).await?
        }
    };
    let composite_conditions = cpg.status.and_then(|s| s.conditions).unwrap_or_default();
    Ok(Ok(Roots { name: Some(name), composite_conditions }))
}

/// The scheduling API of `set`: the one recorded on it (`batch.muster.dev/scheduling-api`), or,
/// on its first sync, the one chosen now ([`native::first_set_scheduling_api`]), recorded before
/// anything is compiled. Its children are created with it.
async fn scheduling_api(set: &MusterJobSet, ctx: &Context) -> Result<std::result::Result<SchedulingApi, Refusal>> {
    use k8s_openapi::api::scheduling::v1beta1;
    let (ns, name, uid) = (set.namespace().unwrap_or_default(), set.name_any(), set.uid());
    let mine = |meta: Option<ObjectMeta>| meta.is_some_and(|m| controller_uid(&m) == uid.as_deref());
    let with_scheduling = set.spec.scheduling.is_some();
    let muster_root = with_scheduling
        && mine(
            Api::<Workload>::namespaced(ctx.client.clone(), &ns).get_metadata_opt(&name).await?.map(|m| m.metadata),
        );
    let config = &ctx.config;
    if let Some(recorded) = set.annotations().get(SCHEDULING_API_ANNOTATION) {
        let native_root = with_scheduling
            && config.native_scheduling_served
            && mine(
                Api::<v1beta1::Workload>::namespaced(ctx.client.clone(), &ns)
                    .get_metadata_opt(&name)
                    .await?
                    .map(|m| m.metadata),
            );
        let served = config.native_scheduling_served && (!with_scheduling || config.native_composite_served);
        // Without spec.scheduling the children are standalone: each answers for its own fields.
        let dropped = if with_scheduling { config.native_fields.dropped_by_set(&set.spec) } else { Vec::new() };
        return Ok(native::recorded_scheduling_api(recorded, muster_root, native_root, served, &dropped));
    }
    let dropped = config.native_fields.dropped_by_set(&set.spec);
    let (api, why) = native::first_set_scheduling_api(
        &set.spec,
        config.scheduling_api,
        muster_root,
        config.native_composite_served,
        &dropped,
    );
    super::record_scheduling_api(ctx, set, api, why).await?;
    Ok(Ok(api))
}

/// Writes the set's status when it changed, and records the version the write made.
async fn write_status(set: &MusterJobSet, sc: &SetContext, status: &MusterJobSetStatus) -> Result<()> {
    if set.status.as_ref() == Some(status) {
        return Ok(());
    }
    let api = Api::<MusterJobSet>::namespaced(sc.ctx.client.clone(), &set.namespace().unwrap_or_default());
    let body = json!({"apiVersion": "batch.muster.dev/v1alpha1", "kind": "MusterJobSet", "status": status});
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let written = lean_writes::patch_status(&api, &set.name_any(), &params, &Patch::Apply(&body)).await?;
    let uid = set.uid().unwrap_or_default();
    sc.written.wrote(&uid, (), written.metadata.resource_version.as_deref(), std::time::Instant::now());
    Ok(())
}

async fn set_invalid(
    set: &MusterJobSet,
    sc: &SetContext,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> Result<Action> {
    let ctx = &sc.ctx;
    let mut status = set.status.clone().unwrap_or_default();
    let changed = conditions::set(
        &mut status.conditions,
        condition::INVALID,
        true,
        reason,
        message,
        set.metadata.generation,
        now,
    );
    status.phase = Some(JobSetPhase::Invalid);
    status.observed_generation = set.metadata.generation;
    if changed {
        ctx.event(&set.object_ref(&()), true, reason, "Validate", message);
    }
    write_status(set, sc, &status).await?;
    // A refusal that can clear by itself (a name an earlier object of the same name holds) is
    // looked at again without an event.
    let retry = muster_core::jobs::refusal_retry(reason, &status.conditions, now);
    Ok(retry.map_or_else(Action::await_change, Action::requeue))
}

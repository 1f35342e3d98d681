//! What the reconciles share and where it comes from: the watch caches of the jobs' pods, groups
//! and Workloads ([`JobContext`]), the reads through them, and [`run`], which starts the watches
//! and the controller loop.

use std::sync::Arc;

use futures::{Future, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::Resource;
use kube::api::Api;
use kube::core::DeserializeGuard;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};

use super::CONTROLLER;
use super::expected;
use super::plan::JobPod;
use super::reconcile::reconcile;
use super::record::{CachedPod, JobPods};
use crate::controllers::context::{Context, Error, Result, StoreReady};
use crate::crds::JOB_NAME_LABEL;
use crate::crds::batch::MusterJob;
use crate::crds::scheduling::{CompositePodGroup, PodGroup, Workload};

/// What the reconciles share: the context, the watch cache of the jobs' pods (a reconcile
/// reads its pods there, never with a LIST: a thousand jobs listing their pods on every pod
/// event was what saturated the API server and etcd at 5,000 nodes), the pods created that
/// the cache does not show yet, and the watch caches of the groups and Workloads a job
/// compiles to (a reconcile, one per pod event, read them with two GETs before).
pub struct JobContext {
    pub(super) ctx: Arc<Context>,
    pub(super) pods: Store<CachedPod>,
    /// The cached pods by job ([`JobPods`]), kept from the same events as `pods`.
    pub(super) job_pods: Arc<JobPods>,
    /// Whether `pods` has its first list (awaited by many reconciles at once).
    pub(super) pods_ready: StoreReady,
    pub(super) expected: expected::Expected,
    /// Pods whose tracking finalizer was removed that the cache may still show with it.
    pub(super) released: super::tracking::Released,
    /// The counts last written to a job's status, until its cache shows them.
    pub(super) written: super::tracking::Written,
    pub(super) groups: Store<PodGroup>,
    pub(super) composites: Store<CompositePodGroup>,
    pub(super) workloads: Store<Workload>,
    /// The native PodGroups and Workloads (jobs in upstream mode), where they are served.
    pub(super) native_groups: Option<Store<k8s_openapi::api::scheduling::v1beta1::PodGroup>>,
    pub(super) native_workloads: Option<Store<k8s_openapi::api::scheduling::v1beta1::Workload>>,
    /// Jobs (by UID) whose status change waits for its paced write ([`Paced`](super::status::Paced)).
    pub(super) paced: std::sync::Mutex<std::collections::HashMap<String, super::status::Paced>>,
}

/// A watch cache of every `K` that `keep` keeps, managed fields dropped; it triggers no
/// reconcile.
fn cache<K>(client: &kube::Client, keep: fn(&K) -> bool) -> Store<K>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (store, writer) = reflector::store();
    let stream = kept_watch(client, keep, writer);
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

/// The watch of every `K` that `keep` keeps, managed fields dropped, kept in `writer`'s store.
fn kept_watch<K>(
    client: &kube::Client,
    keep: fn(&K) -> bool,
    writer: reflector::store::Writer<K>,
) -> impl futures::Stream<Item = std::result::Result<watcher::Event<K>, watcher::Error>> + Send + 'static
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    watcher::watcher(Api::<K>::all(client.clone()), watcher::Config::default().any_semantic())
        .default_backoff()
        .try_filter_map(move |ev| std::future::ready(Ok(kept(ev, keep))))
        .modify(|o: &mut K| o.meta_mut().managed_fields = None)
        .reflect(writer)
}

/// PURE: the watch event a cache applies for `ev`, keeping only the objects `keep` keeps: an
/// object it does not keep is never listed into the cache, and an update that makes it one it
/// does not keep takes it out (a delete of an object the cache lacks changes nothing).
fn kept<K>(ev: watcher::Event<K>, keep: fn(&K) -> bool) -> Option<watcher::Event<K>> {
    match ev {
        watcher::Event::Apply(o) if !keep(&o) => Some(watcher::Event::Delete(o)),
        watcher::Event::InitApply(o) if !keep(&o) => None,
        ev => Some(ev),
    }
}

/// Every object of muster's own kinds (only muster makes them).
fn all<K>(_: &K) -> bool {
    true
}

/// The native (`scheduling.k8s.io`) groups a MusterJob or MusterJobSet controls: the only ones
/// the job controller reads. The Job controller makes a Workload and a PodGroup for every
/// batch/v1 Job too, and anyone may make more: cached whole, those grew muster's memory with
/// every Job in the cluster (4,000 of the 6,000 at the end of a 5,000-node bench). A lookup
/// that misses one (a name taken by an object muster does not control) asks the API server,
/// which tells it apart.
fn muster_controlled<K: Resource>(o: &K) -> bool {
    muster_core::owners::controlled_by_group(o.meta(), crate::crds::batch::GROUP)
}

/// `name` in `ns` as `store` shows it, without asking the API server: for an object this
/// controller makes when it is missing ([`create_if_absent`](crate::controllers::create_if_absent)
/// tells a lagging cache from an object that is not there).
pub(super) fn in_cache<K>(store: &Store<K>, ns: &str, name: &str) -> Option<K>
where
    K: Resource + Clone,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    store.get(&reflector::ObjectRef::new(name).within(ns)).map(|o| (*o).clone())
}

/// `name` in `ns` as `store` shows it, or as the API server has it when the cache does not
/// show it (not listed yet, or just created): the cache may lag, but only behind writes that
/// the next event reconciles again.
pub(super) async fn cached<K>(store: &Store<K>, api: &Api<K>, ns: &str, name: &str) -> Result<Option<K>>
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
    // before the pod's event triggers its job, as kube's `reflect` does. An event that leaves
    // the record as it was triggers nothing (most of a pod's updates as it starts: kube-
    // scheduler's conditions, its bind, its GPU indices).
    let (store, mut writer) = reflector::store();
    let job_pods = Arc::new(JobPods::new(store.clone()));
    let index = job_pods.clone();
    let pod_events = watcher::watcher(pods, watcher::Config::default().labels(JOB_NAME_LABEL).any_semantic())
        .default_backoff()
        .try_filter_map(move |ev| {
            let record = crate::controllers::map_event(&ev, |p| CachedPod(JobPod::of(p)));
            let news = index.is_news(&record);
            index.before(&record);
            writer.apply_watcher_event(&record);
            index.after(&record);
            std::future::ready(Ok(news.then_some(ev)))
        })
        .touched_objects();
    // Jobs in upstream mode follow their native PodGroups (kube-scheduler's conditions): the
    // groups' events trigger their jobs, through the cache the reconciles read.
    let native = ctx.config.native_scheduling_served;
    let (native_groups, native_group_events) = if native {
        let (store, writer) = reflector::store::<k8s_openapi::api::scheduling::v1beta1::PodGroup>();
        let events = kept_watch(&ctx.client, muster_controlled, writer).touched_objects();
        (Some(store), Some(events))
    } else {
        (None, None)
    };
    let context = Arc::new(JobContext {
        groups: cache(&ctx.client, all),
        composites: cache(&ctx.client, all),
        workloads: cache(&ctx.client, all),
        native_groups,
        native_workloads: native.then(|| cache(&ctx.client, muster_controlled)),
        ctx,
        pods_ready: StoreReady::of(store.clone()),
        pods: store,
        job_pods,
        expected: expected::Expected::default(),
        released: Default::default(),
        written: Default::default(),
        paced: Default::default(),
    });
    let (jobs_store, jobs_writer) = reflector::store();
    // Pods whose job is gone, deleted, finished or not muster's lose their tracking finalizer.
    tokio::spawn(super::tracking::sweep(context.clone(), jobs_store.clone()));
    let mut controller = Controller::for_stream(crate::controllers::trimmed_objects(jobs, jobs_writer), jobs_store)
        .with_config(controller::Config::default().concurrency(crate::controllers::RECONCILE_CONCURRENCY))
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
    crate::controllers::retry_after_error(CONTROLLER, err, &jc.ctx)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::scheduling::v1beta1::PodGroup as NativeGroup;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::runtime::reflector::ObjectRef;
    use kube::runtime::watcher::Event;

    use super::*;

    fn group(name: &str, controller_api: &str) -> NativeGroup {
        let mut g = NativeGroup::default();
        g.metadata.name = Some(name.into());
        g.metadata.namespace = Some("ns".into());
        g.metadata.owner_references = Some(vec![OwnerReference {
            api_version: controller_api.into(),
            kind: "K".into(),
            name: name.into(),
            uid: format!("{name}-owner"),
            controller: Some(true),
            ..Default::default()
        }]);
        g
    }

    /// Applies `events` as the native caches do; returns the names the store then holds.
    fn cached(events: Vec<Event<NativeGroup>>) -> Vec<String> {
        let (store, mut writer) = reflector::store::<NativeGroup>();
        for ev in events.into_iter().filter_map(|ev| kept(ev, muster_controlled)) {
            writer.apply_watcher_event(&ev);
        }
        let mut names: Vec<String> = store.state().iter().filter_map(|g| g.metadata.name.clone()).collect();
        names.sort();
        names
    }

    #[test]
    fn the_native_caches_keep_only_the_groups_muster_controls() {
        let ours = group("mine", "batch.muster.dev/v1alpha1");
        let jobs = group("jobs", "batch/v1");
        // Listed: the Job controller's group is never kept.
        let listed = vec![Event::Init, Event::InitApply(ours.clone()), Event::InitApply(jobs.clone()), Event::InitDone];
        assert_eq!(cached(listed.clone()), ["mine"]);
        // Watched: the same, and an update that leaves muster's control takes the group out.
        let mut taken = ours.clone();
        taken.metadata.owner_references = jobs.metadata.owner_references.clone();
        let mut events = listed;
        events.extend([Event::Apply(jobs.clone()), Event::Apply(group("other", "batch.muster.dev/v1alpha1"))]);
        assert_eq!(cached(events.clone()), ["mine", "other"]);
        events.push(Event::Apply(taken));
        assert_eq!(cached(events.clone()), ["other"]);
        // Deletes pass through, whatever the object's owner.
        events.push(Event::Delete(group("other", "batch/v1")));
        assert_eq!(cached(events), Vec::<String>::new());
        // The muster kinds' caches keep everything.
        assert!(kept(Event::Apply(jobs.clone()), all).is_some_and(|ev| matches!(ev, Event::Apply(_))));
        let (store, mut writer) = reflector::store::<NativeGroup>();
        if let Some(ev) = kept(Event::Apply(jobs), all) {
            writer.apply_watcher_event(&ev);
        }
        assert!(store.get(&ObjectRef::new("jobs").within("ns")).is_some());
    }
}

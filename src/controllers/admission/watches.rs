//! What admission watches and what wakes a cycle: one watch per kind (trimmed to what
//! placement and status read; every pod and node is read once per event into the cluster
//! state, and the stores keep only muster's pods and no nodes), a notification on every
//! event, a capacity counter bumped by events that can free room (so roots in backoff are
//! retried), and the roots whose own writes the caches do not show yet (a cycle leaves them
//! alone).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingAdmissionPolicy, MutatingWebhookConfiguration, ValidatingAdmissionPolicy, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::Notify;

use super::{Admitter, Caches, DraCaches, GroupRef, RootKey, Unseen, is_gated, trim};
use crate::controllers::context::Context;
use crate::crds::NodeGPUReport;
use crate::crds::scheduling::{CompositePodGroup, PlanState, PlannedPod, PodGroup};
use crate::scheduler::{Change, ClusterState};

/// How long to wait for the caches to show a plan or claim write before deciding anyway (another
/// writer may have changed it since). A pod ungated is waited for until the cache shows it: a
/// gate removed is never added back, so the cache always shows it in the end.
pub(super) const CACHE_SYNC_TIMEOUT: Duration = Duration::from_secs(10);

fn spawn_watch<K>(
    api: Api<K>,
    config: watcher::Config,
    trim: fn(&mut K),
    notify: Arc<Signal>,
    capacity: Arc<AtomicU64>,
    seen: impl FnMut(&Event<K>) -> Wake + Send + 'static,
) -> Store<K>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    spawn_watch_keeping(api, config, trim, |_| true, None, notify, capacity, seen)
}

/// [`spawn_watch`], its store keeping only the objects `keep` accepts, each trimmed further by
/// `slim`: `seen` still sees every event whole (the cluster state reads every pod), the store
/// holds only what the cycle reads (muster's pods, a bound one without its shape).
#[allow(clippy::too_many_arguments)]
fn spawn_watch_keeping<K>(
    api: Api<K>,
    config: watcher::Config,
    trim: fn(&mut K),
    keep: fn(&K) -> bool,
    slim: Option<fn(&mut K)>,
    notify: Arc<Signal>,
    capacity: Arc<AtomicU64>,
    mut seen: impl FnMut(&Event<K>) -> Wake + Send + 'static,
) -> Store<K>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (store, mut writer) = reflector::store();
    let reader = store.clone();
    let stream = watcher::watcher(api, config).default_backoff().modify(trim);
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(ev) => {
                    // The store first, as kube's `reflect` does: what wakes a cycle is in it.
                    let held = |o: &K| reader.get(&reflector::ObjectRef::from_obj(o)).is_some();
                    match stored(&ev, keep, held) {
                        Stored::Whole => match slim {
                            Some(slim) => writer.apply_watcher_event(&slimmed(&ev, slim)),
                            None => writer.apply_watcher_event(&ev),
                        },
                        Stored::Dropped(o) => writer.apply_watcher_event(&Event::Delete(o)),
                        Stored::Nothing => {}
                    }
                    wake(seen(&ev), &notify, &capacity);
                }
                Err(e) => tracing::warn!(error = %e, "admission watch"),
            }
        }
    });
    store
}

/// `ev` with its object trimmed by `slim`.
fn slimmed<K: Clone>(ev: &Event<K>, slim: fn(&mut K)) -> Event<K> {
    crate::controllers::map_event(ev, |o| {
        let mut o = o.clone();
        slim(&mut o);
        o
    })
}

/// What a store keeping only some objects does with one event.
#[derive(Debug, PartialEq)]
enum Stored<K> {
    /// Applies it as it is.
    Whole,
    /// Removes this object: it is held, and no longer kept.
    Dropped(K),
    /// Nothing: an object neither kept nor held.
    Nothing,
}

/// PURE: what a store keeping the objects `keep` accepts does with `ev`, `held` telling the
/// objects it holds now. A relist's objects not kept are left out of the relist (which drops
/// whatever it does not list); a deletion is always applied.
fn stored<K: Clone>(ev: &Event<K>, keep: fn(&K) -> bool, held: impl Fn(&K) -> bool) -> Stored<K> {
    match ev {
        Event::Apply(o) | Event::InitApply(o) if keep(o) => Stored::Whole,
        Event::Apply(o) if held(o) => Stored::Dropped(o.clone()),
        Event::Apply(_) | Event::InitApply(_) => Stored::Nothing,
        Event::Delete(_) | Event::Init | Event::InitDone => Stored::Whole,
    }
}

fn wake(wake: Wake, notify: &Signal, capacity: &AtomicU64) {
    match wake {
        Wake::No => {}
        Wake::Usage { frees } => {
            if frees {
                capacity.fetch_add(1, Ordering::Relaxed);
            }
            notify.usage_changed();
        }
        Wake::Cycle => notify.wake(),
        Wake::Frees => {
            capacity.fetch_add(1, Ordering::Relaxed);
            notify.wake();
        }
    }
}

/// How the watches wake admission: a notification, a count of the events that woke it (equal
/// counts across two cycles: no event in between asked for one), and a count of those that
/// bring admission work of its own (all but [`Wake::Usage`]).
#[derive(Default)]
pub(super) struct Signal {
    pub notify: Notify,
    pub events: AtomicU64,
    pub work: AtomicU64,
}

impl Signal {
    /// An event that asks for a cycle soon.
    pub fn wake(&self) {
        self.work.fetch_add(1, Ordering::SeqCst);
        self.usage_changed();
    }

    /// An event that changed only what other workloads use ([`Wake::Usage`]).
    pub fn usage_changed(&self) {
        self.events.fetch_add(1, Ordering::SeqCst);
        self.notify.notify_one();
    }

    /// The events that woke admission so far.
    pub fn events(&self) -> u64 {
        self.events.load(Ordering::SeqCst)
    }

    /// The events so far that brought admission work of its own.
    pub fn work(&self) -> u64 {
        self.work.load(Ordering::SeqCst)
    }
}

/// What a watch event asks of admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Wake {
    /// Nothing a decision or a status reads changed (a node heartbeat, a plain pod's status).
    No,
    /// Another workload's pod was bound, finished or went (`frees`: finished or went): the
    /// usage counts changed. A cycle, which may wait while admission has nothing to decide.
    Usage { frees: bool },
    /// A cycle.
    Cycle,
    /// A cycle, and roots waiting in backoff are retried: capacity may have freed.
    Frees,
}

impl Wake {
    fn from_frees(frees: bool) -> Self {
        if frees { Wake::Frees } else { Wake::Cycle }
    }
}

/// A pod event wakes admission when the pod is muster's (its group's status reads it), or
/// when what it uses changed (a pod bound, finished, deleted): a status update of another
/// workload's running pod changes nothing admission reads, and a change of its usage only
/// counts ([`Wake::Usage`]).
fn pod_wakes(ev: &Event<Pod>, usage_changed: bool) -> Wake {
    match ev {
        Event::Apply(p) if !usage_changed && !ours(p) => Wake::No,
        Event::InitApply(_) => Wake::No,
        Event::Apply(p) | Event::Delete(p) if !ours(p) => Wake::Usage { frees: pod_frees(ev) },
        _ => Wake::from_frees(pod_frees(ev)),
    }
}

/// The pods the watch keeps as a minimal record ([`trim::minimal_pod`]), each reported once
/// when first seen so ([`report_too_large`]): the uids of such pods while they exist (a relist
/// forgets those it no longer lists).
#[derive(Debug, Default)]
struct TooLarge {
    reported: HashSet<String>,
    /// The uids the relist in progress listed.
    listed: Option<HashSet<String>>,
}

impl TooLarge {
    /// The pod of `ev` and why it was kept minimal, when this is the first time it is seen so.
    fn first_seen<'e>(&mut self, ev: &'e Event<Pod>) -> Option<(&'e Pod, &'e str)> {
        match ev {
            Event::Init => self.listed = Some(HashSet::new()),
            Event::InitDone => {
                let listed = self.listed.take().unwrap_or_default();
                self.reported.retain(|uid| listed.contains(uid));
            }
            Event::Delete(p) => {
                self.reported.remove(p.metadata.uid.as_deref().unwrap_or_default());
            }
            Event::Apply(p) | Event::InitApply(p) => {
                let uid = p.metadata.uid.clone().unwrap_or_default();
                let Some(why) = p.annotations().get(trim::KEPT_MINIMAL_ANNOTATION) else {
                    self.reported.remove(&uid);
                    return None;
                };
                if let Some(listed) = self.listed.as_mut() {
                    listed.insert(uid.clone());
                }
                return self.reported.insert(uid).then_some((p, why.as_str()));
            }
        }
        None
    }
}

/// Reports a pod kept as a minimal record: a log line,
/// [`crate::controllers::metrics::Metrics::pods_kept_minimal`] and a `PodTooLarge` Warning
/// event on the pod (sent in the background).
fn report_too_large(ctx: &Arc<Context>, p: &Pod, why: &str) {
    let gated = matches!(crate::pods::Placement::of(p), crate::pods::Placement::Gated);
    tracing::warn!(
        pod = %p.name_any(), namespace = p.namespace().unwrap_or_default(), why, gated,
        "pod too large to keep whole: admission keeps a minimal record of it"
    );
    ctx.metrics.pods_kept_minimal.inc();
    let note = format!(
        "The pod is too large for muster's admission to keep ({why}): it keeps only what the pod uses on its \
         node (its requests summed, muster's labels){}. Make the pod smaller: fewer or shorter labels, \
         annotations, tolerations, affinity terms or containers.",
        if gated { ", so it leaves the pod gated and never places it" } else { "" }
    );
    ctx.event(&p.object_ref(&()), true, "PodTooLarge", "Admit", note);
}

/// muster's pods: those in a PodGroup of its (the webhook labels them).
fn ours(p: &Pod) -> bool {
    p.labels().contains_key(crate::crds::POD_GROUP_LABEL)
}

fn pod_frees(ev: &Event<Pod>) -> bool {
    match ev {
        Event::Delete(_) => true,
        Event::Apply(p) => matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed")),
        _ => false,
    }
}

/// Locks the kept cluster state (a panic elsewhere while holding it leaves a state that is
/// still whole: every change is one map write).
pub(super) fn lock(cluster: &Mutex<ClusterState>) -> MutexGuard<'_, ClusterState> {
    cluster.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Keeps the cluster state up to date from one watch's events, each object read once
/// (`on`: [`ClusterState::node_changed`] or [`ClusterState::pod_changed`]); returns whether
/// what the state holds changed.
fn feed<K: 'static>(
    cluster: Arc<Mutex<ClusterState>>,
    on: fn(&mut ClusterState, Change<'_, K>) -> bool,
) -> impl FnMut(&Event<K>) -> bool + Send + 'static {
    move |ev| {
        let change = match ev {
            Event::Apply(o) => Change::Applied(o),
            Event::Delete(o) => Change::Deleted(o),
            Event::Init => Change::RelistStarted,
            Event::InitApply(o) => Change::Relisted(o),
            Event::InitDone => Change::RelistDone,
        };
        on(&mut lock(&cluster), change)
    }
}

/// A hash of what a NodeGPUReport says kubelet gave (its `spec.assigned`).
fn assigned_hash(report: &NodeGPUReport) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    report.spec.assigned.as_ref().map(ToString::to_string).hash(&mut h);
    h.finish()
}

/// A namespace, claim, volume or class added, changed or removed can change what fits (a
/// claim created or bound, a label a namespace selector reads).
fn changed<K>(ev: &Event<K>) -> Wake {
    Wake::from_frees(matches!(ev, Event::Apply(_) | Event::Delete(_) | Event::InitDone))
}

/// Any event of a group wakes a cycle (a group's own changes never free capacity).
fn wakes<K>(_: &Event<K>) -> Wake {
    Wake::Cycle
}

/// Whether the cluster serves `resource.k8s.io/v1` (DRA, GA in 1.34): without it the
/// count-based GPU path stays.
pub(super) async fn dra_served(client: &Client) -> bool {
    crate::controllers::served(
        client,
        "resource.k8s.io/v1",
        &["resourceslices"],
        "DRA claims are not allocated by muster",
    )
    .await
}

/// Whether the cluster serves MutatingAdmissionPolicies (a cluster without the API has none).
pub(super) async fn mutating_policies_served(client: &Client) -> bool {
    let unserved = "MutatingAdmissionPolicies are not watched";
    crate::controllers::served(client, "admissionregistration.k8s.io/v1", &["mutatingadmissionpolicies"], unserved)
        .await
}

/// The admission configurations that may refuse a pin, kept by watches (their events wake
/// nothing): pins are dry-run first only while one of them matches a pod UPDATE
/// ([`crate::scheduler::pod_update_judges`]), and always while a watch has not listed yet
/// (or cannot: no RBAC), since what it would show is unknown.
#[derive(Clone)]
pub(super) struct Judges {
    validating: Store<ValidatingWebhookConfiguration>,
    mutating: Store<MutatingWebhookConfiguration>,
    validating_policies: Store<ValidatingAdmissionPolicy>,
    mutating_policies: Option<Store<MutatingAdmissionPolicy>>,
    /// The answer last logged.
    logged: Arc<Mutex<Option<Vec<String>>>>,
}

impl Judges {
    fn watch(client: &Client, notify: &Arc<Signal>, capacity: &Arc<AtomicU64>, mutating_policies: bool) -> Self {
        fn store<K>(client: &Client, notify: &Arc<Signal>, capacity: &Arc<AtomicU64>) -> Store<K>
        where
            K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
            K::DynamicType: Default + Eq + std::hash::Hash + Clone,
        {
            let api = Api::<K>::all(client.clone());
            let cfg = watcher::Config::default().any_semantic();
            spawn_watch(api, cfg, trim::managed_fields::<K>, notify.clone(), capacity.clone(), |_| Wake::No)
        }
        Judges {
            validating: store(client, notify, capacity),
            mutating: store(client, notify, capacity),
            validating_policies: store(client, notify, capacity),
            mutating_policies: mutating_policies.then(|| store(client, notify, capacity)),
            logged: Arc::default(),
        }
    }

    /// Whether a pin may be refused by a webhook or policy, so pins are dry-run first.
    pub(super) fn pins_judged(&self) -> bool {
        use futures::FutureExt;
        fn listed<K: kube::Resource + Clone>(s: &Store<K>) -> bool
        where
            K::DynamicType: Eq + std::hash::Hash + Clone,
        {
            s.wait_until_ready().now_or_never().is_some_and(|r| r.is_ok())
        }
        let all_listed = listed(&self.validating)
            && listed(&self.mutating)
            && listed(&self.validating_policies)
            && self.mutating_policies.as_ref().is_none_or(listed);
        if !all_listed {
            return true;
        }
        let (v, m, vp) = (self.validating.state(), self.mutating.state(), self.validating_policies.state());
        let mp = self.mutating_policies.as_ref().map(Store::state).unwrap_or_default();
        let judges = crate::scheduler::pod_update_judges(
            v.iter().map(|o| &**o),
            m.iter().map(|o| &**o),
            vp.iter().map(|o| &**o),
            mp.iter().map(|o| &**o),
        );
        let judged = !judges.is_empty();
        let mut logged = self.logged.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if logged.as_ref() != Some(&judges) {
            if judged {
                tracing::info!(judges = %judges.join(", "), "pins are dry-run before a gang's first pod is ungated: these may refuse a pod update");
            } else {
                tracing::info!("no admission webhook or policy matches a pod update: pins are not dry-run");
            }
            *logged = Some(judges);
        }
        judged
    }
}

/// [`changed`], counting every event in `changes` too.
fn counted<K>(changes: &Arc<AtomicU64>) -> impl FnMut(&Event<K>) -> Wake + Send + 'static {
    let changes = changes.clone();
    move |ev| {
        changes.fetch_add(1, Ordering::Relaxed);
        changed(ev)
    }
}

/// Starts the watches of DRA objects: any change can change what fits (a slice published, a
/// claim created, allocated or freed).
fn watch_dra(client: &Client, notify: &Arc<Signal>, capacity: &Arc<AtomicU64>) -> DraCaches {
    let cfg = || watcher::Config::default().any_semantic();
    let changes = Arc::new(AtomicU64::new(0));
    let slice_changes = Arc::new(AtomicU64::new(0));
    let mut slice_event = counted::<ResourceSlice>(&changes);
    let slices_seen = slice_changes.clone();
    DraCaches {
        slices: spawn_watch(
            Api::<ResourceSlice>::all(client.clone()),
            cfg(),
            trim::managed_fields::<ResourceSlice>,
            notify.clone(),
            capacity.clone(),
            move |ev| {
                slices_seen.fetch_add(1, Ordering::Relaxed);
                slice_event(ev)
            },
        ),
        device_classes: spawn_watch(
            Api::<DeviceClass>::all(client.clone()),
            cfg(),
            trim::managed_fields::<DeviceClass>,
            notify.clone(),
            capacity.clone(),
            counted::<DeviceClass>(&changes),
        ),
        claims: spawn_watch(
            Api::<ResourceClaim>::all(client.clone()),
            cfg(),
            trim::managed_fields::<ResourceClaim>,
            notify.clone(),
            capacity.clone(),
            counted::<ResourceClaim>(&changes),
        ),
        templates: spawn_watch(
            Api::<ResourceClaimTemplate>::all(client.clone()),
            cfg(),
            trim::managed_fields::<ResourceClaimTemplate>,
            notify.clone(),
            capacity.clone(),
            counted::<ResourceClaimTemplate>(&changes),
        ),
        changes,
        slice_changes,
    }
}

/// Starts the watches admission decides on; each event wakes `notify`, and the events that can
/// free capacity bump `capacity`.
pub(super) fn watch_caches(
    client: &Client,
    ctx: &Arc<Context>,
    notify: &Arc<Signal>,
    capacity: &Arc<AtomicU64>,
    dra: bool,
    mutating_policies: bool,
) -> Caches {
    let cfg = || watcher::Config::default().any_semantic();
    let cluster = Arc::new(Mutex::new(ClusterState::default()));
    // The node agents' NodeGPUReports (GPU health, what kubelet gave each pod), read once per
    // event into the cluster state, where each overrides its node's annotations of the same;
    // no store is kept, and no cycle waits for them (a node without a report is read from its
    // annotations, as with an older agent). A change of what kubelet gave wakes a cycle as one
    // that may free GPUs; health alone wakes nothing, as on the Node (`trim::NodeFingerprints`
    // leaves it out): the next cycle reads it (at 5,000 nodes, a refresh every 30 s each is
    // 170 events a second).
    let _reports = spawn_watch_keeping(
        Api::<NodeGPUReport>::all(client.clone()),
        cfg(),
        trim::managed_fields::<NodeGPUReport>,
        |_| false,
        None,
        notify.clone(),
        capacity.clone(),
        {
            let mut feed = feed(cluster.clone(), ClusterState::report_changed);
            let mut assigned: HashMap<String, u64> = HashMap::new();
            move |ev: &Event<NodeGPUReport>| {
                let changed = feed(ev);
                let moved = match ev {
                    Event::Apply(r) | Event::InitApply(r) => {
                        let h = assigned_hash(r);
                        assigned.insert(r.name_any(), h) != Some(h)
                    }
                    Event::Delete(r) => assigned.remove(&r.name_any()).is_some(),
                    Event::Init => {
                        assigned.clear();
                        false
                    }
                    Event::InitDone => true,
                };
                if changed && moved { Wake::Frees } else { Wake::No }
            }
        },
    );
    Caches {
        cluster: cluster.clone(),
        judges: Judges::watch(client, notify, capacity, mutating_policies),
        dra: dra.then(|| watch_dra(client, notify, capacity)),
        pod_groups: spawn_watch(
            Api::<PodGroup>::all(client.clone()),
            cfg(),
            trim::managed_fields::<PodGroup>,
            notify.clone(),
            capacity.clone(),
            wakes::<PodGroup>,
        ),
        composites: spawn_watch(
            Api::<CompositePodGroup>::all(client.clone()),
            cfg(),
            trim::managed_fields::<CompositePodGroup>,
            notify.clone(),
            capacity.clone(),
            wakes::<CompositePodGroup>,
        ),
        // Every pod: usage counts pods of all workloads, not only muster's, and the GPU pass
        // reads every GPU pod (both kept compactly in the cluster state); the store keeps
        // muster's pods only, which the cycle reads whole.
        pods: spawn_watch_keeping(
            Api::<Pod>::all(client.clone()),
            cfg(),
            trim::pod,
            ours,
            Some(trim::bound_pod),
            notify.clone(),
            capacity.clone(),
            {
                let mut feed = feed(cluster.clone(), ClusterState::pod_changed);
                let (ctx, mut too_large) = (ctx.clone(), TooLarge::default());
                move |ev: &Event<Pod>| {
                    if let Some((pod, why)) = too_large.first_seen(ev) {
                        report_too_large(&ctx, pod, why);
                    }
                    let usage_changed = feed(ev);
                    pod_wakes(ev, usage_changed)
                }
            },
        ),
        // Every node, read once per event into the cluster state (placement's NodeInfo, the
        // GPU model's GpuNode); the store keeps none, it only tells when the first list is in.
        nodes: spawn_watch_keeping(
            Api::<Node>::all(client.clone()),
            cfg(),
            trim::node,
            |_| false,
            None,
            notify.clone(),
            capacity.clone(),
            {
                let mut seen = trim::NodeFingerprints::default();
                let mut feed = feed(cluster, ClusterState::node_changed);
                move |ev: &Event<Node>| {
                    feed(ev);
                    // A node event that changes nothing placement reads (a heartbeat) wakes nothing.
                    if seen.changed(ev) { Wake::Frees } else { Wake::No }
                }
            },
        ),
        // What placement models beside nodes and pods: namespace labels (namespace selectors
        // of pod affinity terms), and claims, volumes and classes (VolumeBinding, VolumeZone).
        namespaces: spawn_watch(
            Api::<Namespace>::all(client.clone()),
            cfg(),
            trim::namespace,
            notify.clone(),
            capacity.clone(),
            changed::<Namespace>,
        ),
        claims: spawn_watch(
            Api::<PersistentVolumeClaim>::all(client.clone()),
            cfg(),
            trim::claim,
            notify.clone(),
            capacity.clone(),
            changed::<PersistentVolumeClaim>,
        ),
        volumes: spawn_watch(
            Api::<PersistentVolume>::all(client.clone()),
            cfg(),
            trim::volume,
            notify.clone(),
            capacity.clone(),
            changed::<PersistentVolume>,
        ),
        classes: spawn_watch(
            Api::<StorageClass>::all(client.clone()),
            cfg(),
            trim::storage_class,
            notify.clone(),
            capacity.clone(),
            changed::<StorageClass>,
        ),
    }
}

/// Resolves once every cache has its first full list.
pub(super) async fn ready(caches: &Caches) {
    let _ = tokio::join!(
        caches.pod_groups.wait_until_ready(),
        caches.composites.wait_until_ready(),
        caches.pods.wait_until_ready(),
        caches.nodes.wait_until_ready(),
        caches.namespaces.wait_until_ready(),
        caches.claims.wait_until_ready(),
        caches.volumes.wait_until_ready(),
        caches.classes.wait_until_ready()
    );
    if let Some(dra) = &caches.dra {
        let _ = tokio::join!(
            dra.slices.wait_until_ready(),
            dra.device_classes.wait_until_ready(),
            dra.claims.wait_until_ready(),
            dra.templates.wait_until_ready()
        );
    }
}

/// The roots a cycle leaves alone, and the pins it counts for them: writes of ours the caches
/// do not show yet, and commits in flight. A decision on such a root could plan its gang twice
/// or drop the plan just written, and the capacity its pods take must stay counted while the
/// cache still shows them gated.
#[derive(Default)]
pub(super) struct Settling {
    /// Roots with a commit in flight or a write not yet seen: neither followed, decided nor
    /// given a status this cycle.
    pub roots: HashSet<RootKey>,
    /// Pods those roots pin (UID -> pin), counted in the snapshot as pinned unless it counts
    /// them already.
    pub pins: HashMap<String, PlannedPod>,
}

impl Admitter {
    /// What this cycle leaves alone ([`Settling`]): the writes the caches do not show yet
    /// (see [`Unseen::settle`]) and the commits in flight. `None` while a claim write of ours
    /// is unseen: the cycle waits then.
    pub(super) fn settling(
        &mut self,
        pgs: &[Arc<PodGroup>],
        cpgs: &[Arc<CompositePodGroup>],
        pods: &[Arc<Pod>],
    ) -> Option<Settling> {
        let plans: HashMap<RootKey, CachedGroup> = pgs
            .iter()
            .map(GroupRef::Leaf)
            .chain(cpgs.iter().map(GroupRef::Composite))
            .map(|g| (g.key(), (g.plan().map(|p| (p.id.clone(), p.state)), g.version())))
            .collect();
        let gated: HashSet<&str> =
            pods.iter().filter(|p| is_gated(p)).filter_map(|p| p.metadata.uid.as_deref()).collect();
        let claims: Option<HashMap<(String, String), bool>> = self.caches.dra.as_ref().map(|dra| {
            dra.claims
                .state()
                .iter()
                .map(|c| {
                    let key = (c.namespace().unwrap_or_default(), c.name_any());
                    (key, c.status.as_ref().is_some_and(|s| s.allocation.is_some()))
                })
                .collect()
        });
        let mut settling = self.writer.unseen().settle(&plans, &gated, claims.as_ref(), Instant::now())?;
        for (key, flight) in &self.in_flight {
            settling.roots.insert(key.clone());
            for planned in flight.job.planned() {
                settling.pins.entry(planned.uid.clone()).or_insert_with(|| planned.clone());
            }
        }
        Some(settling)
    }
}

/// What [`Unseen::settle`] reads of a cached group: its plan (id, state) and resourceVersion.
pub(super) type CachedGroup = (Option<(String, PlanState)>, Option<String>);

impl Unseen {
    /// PURE: the resourceVersion a write on `key` is fenced by, `cached` being the cached one:
    /// the version a status write of ours made when the cache still shows the version before
    /// it (the group changed since only by that write), else the cached one.
    pub(super) fn fence(&self, key: &RootKey, cached: Option<String>) -> Option<String> {
        match self.statuses.get(key) {
            Some((before, after, _)) if cached.as_deref() == Some(before.as_str()) => Some(after.clone()),
            _ => cached,
        }
    }

    /// PURE: forgets the writes the caches show now (or that waited [`CACHE_SYNC_TIMEOUT`])
    /// and says which roots the rest hold back and which pins they count. `plans`: each group's
    /// cached plan (id, state); `gated`: the UIDs of the pods cached gated; `claims`: each
    /// cached claim's allocation (`None` without DRA). `None` while a claim write is unseen: a
    /// decision on such a cache could give the claim's devices again.
    pub(super) fn settle(
        &mut self,
        plans: &HashMap<RootKey, CachedGroup>,
        gated: &HashSet<&str>,
        claims: Option<&HashMap<(String, String), bool>>,
        now: Instant,
    ) -> Option<Settling> {
        let fresh = |at: &Instant| now.duration_since(*at) < CACHE_SYNC_TIMEOUT;
        // A plan write is seen once the cached plan is the one written (or the group is gone).
        self.plans.retain(|key, (want, at)| fresh(at) && plans.get(key).is_some_and(|(cached, _)| cached != want));
        // No time limit here: at 5,000 nodes the pod watch lagged more than 10 s behind the
        // pins, and a pin forgotten then was neither counted (its GPUs were given again) nor
        // followed (its plan looked unseen by every pod and was dropped, the pods left pinned
        // to a full node with no bind watch).
        self.ungated.retain(|uid, _| gated.contains(uid.as_str()));
        match claims {
            Some(cached) => {
                self.claims.retain(|key, (allocated, at)| fresh(at) && cached.get(key).is_some_and(|c| c != allocated))
            }
            None => self.claims.clear(),
        }
        if !self.claims.is_empty() {
            return None;
        }
        // A status write is seen once the cache shows another version than it was made on.
        self.statuses.retain(|key, (before, _, at)| {
            fresh(at) && plans.get(key).is_some_and(|(_, cached)| cached.as_deref() == Some(before.as_str()))
        });
        // A status write in flight moves the version a plan write would be fenced by.
        self.status_writes.retain(|_, at| fresh(at));
        let mut settling = Settling::default();
        settling.roots.extend(self.plans.keys().cloned());
        settling.roots.extend(self.status_writes.keys().cloned());
        for (uid, (key, planned, _)) in &self.ungated {
            settling.roots.insert(key.clone());
            settling.pins.insert(uid.clone(), planned.clone());
        }
        Some(settling)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labelled(name: &str, ours: bool) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.namespace = Some("ns".into());
        if ours {
            p.metadata.labels = Some([(crate::crds::POD_GROUP_LABEL.to_string(), "g".to_string())].into());
        }
        p
    }

    #[test]
    fn the_pod_store_keeps_musters_pods_and_drops_one_that_stops_being_ours() {
        let (mine, other) = (labelled("a", true), labelled("b", false));
        let never = |_: &Pod| false;
        let always = |_: &Pod| true;
        let cases: [(&str, Event<Pod>, bool, Stored<Pod>); 9] = [
            ("ours applied", Event::Apply(mine.clone()), false, Stored::Whole),
            ("ours relisted", Event::InitApply(mine.clone()), false, Stored::Whole),
            ("other applied, not held", Event::Apply(other.clone()), false, Stored::Nothing),
            ("other applied, held: its label went", Event::Apply(other.clone()), true, Stored::Dropped(other.clone())),
            ("other relisted: left out of the relist", Event::InitApply(other.clone()), true, Stored::Nothing),
            ("other deleted", Event::Delete(other.clone()), false, Stored::Whole),
            ("ours deleted", Event::Delete(mine.clone()), true, Stored::Whole),
            ("relist starts", Event::Init, false, Stored::Whole),
            ("relist ends", Event::InitDone, false, Stored::Whole),
        ];
        for (case, ev, held, want) in cases {
            let got = if held { stored(&ev, ours, always) } else { stored(&ev, ours, never) };
            assert_eq!(got, want, "{case}");
        }
    }

    #[test]
    fn another_workloads_pod_only_counts_its_usage_and_musters_own_pods_bring_work() {
        let (mine, other) = (labelled("a", true), labelled("b", false));
        let mut done = other.clone();
        done.status =
            Some(k8s_openapi::api::core::v1::PodStatus { phase: Some("Succeeded".into()), ..Default::default() });
        let cases: [(&str, Event<Pod>, bool, Wake); 9] = [
            ("ours changed", Event::Apply(mine.clone()), false, Wake::Cycle),
            ("ours bound", Event::Apply(mine.clone()), true, Wake::Cycle),
            ("ours deleted", Event::Delete(mine.clone()), true, Wake::Frees),
            ("other's status, usage unchanged", Event::Apply(other.clone()), false, Wake::No),
            ("other bound", Event::Apply(other.clone()), true, Wake::Usage { frees: false }),
            ("other finished", Event::Apply(done), true, Wake::Usage { frees: true }),
            ("other deleted", Event::Delete(other.clone()), true, Wake::Usage { frees: true }),
            ("relisted", Event::InitApply(mine.clone()), true, Wake::No),
            ("relist done", Event::InitDone, false, Wake::Cycle),
        ];
        for (case, ev, usage_changed, want) in cases {
            assert_eq!(pod_wakes(&ev, usage_changed), want, "{case}");
        }
        // Usage alone counts as an event, not as work.
        let (signal, capacity) = (Signal::default(), AtomicU64::new(0));
        wake(Wake::Usage { frees: true }, &signal, &capacity);
        assert_eq!((signal.events(), signal.work(), capacity.load(Ordering::Relaxed)), (1, 0, 1));
        wake(Wake::Cycle, &signal, &capacity);
        assert_eq!((signal.events(), signal.work(), capacity.load(Ordering::Relaxed)), (2, 1, 1));
    }

    #[test]
    fn a_pod_kept_minimal_is_reported_once_while_it_exists() {
        let huge = |uid: &str| {
            let mut p = labelled(uid, true);
            p.metadata.uid = Some(uid.into());
            let big = (0..3000).map(|i| (format!("tenant.example.com/label-{i}"), "x".repeat(60))).collect();
            p.metadata.labels = Some(big);
            trim::pod(&mut p);
            p
        };
        let (a, b) = (huge("a"), huge("b"));
        assert!(a.annotations().contains_key(trim::KEPT_MINIMAL_ANNOTATION), "{a:?}");
        let mut small = labelled("a", true);
        small.metadata.uid = Some("a".into());
        trim::pod(&mut small);
        let mut seen = TooLarge::default();
        let mut reported =
            |ev: Event<Pod>| seen.first_seen(&ev).map(|(p, _)| p.metadata.uid.clone().unwrap_or_default());
        assert_eq!(reported(Event::Apply(a.clone())), Some("a".into()));
        assert_eq!(reported(Event::Apply(a.clone())), None, "once");
        assert_eq!(reported(Event::Apply(small.clone())), None, "an ordinary pod is not reported");
        assert_eq!(reported(Event::Apply(a.clone())), Some("a".into()), "too large again, after it was not");
        // A relist that no longer lists `a` forgets it; `b` is reported once.
        assert_eq!(reported(Event::Init), None);
        assert_eq!(reported(Event::InitApply(b.clone())), Some("b".into()));
        assert_eq!(reported(Event::InitDone), None);
        assert_eq!(reported(Event::Apply(b.clone())), None);
        assert_eq!(reported(Event::Apply(a.clone())), Some("a".into()));
        assert_eq!(reported(Event::Delete(b.clone())), None);
        assert_eq!(reported(Event::Apply(b)), Some("b".into()), "a pod deleted and made again");
        assert_eq!(seen.reported.len(), 2);
    }

    fn pin(uid: &str, node: &str) -> PlannedPod {
        PlannedPod { name: format!("pod-{uid}"), uid: uid.into(), node: node.into(), ..PlannedPod::default() }
    }

    #[test]
    fn writes_hold_their_roots_back_until_the_caches_show_them() {
        let t0 = Instant::now();
        let (a, b) = (RootKey::leaf("ns", "a"), RootKey::composite("ns", "b"));
        let committing = Some(("a-1".to_string(), PlanState::Committing));
        let mut unseen = Unseen::default();
        unseen.plans.insert(a.clone(), (committing.clone(), t0));
        unseen.ungated.insert("u1".into(), (b.clone(), pin("u1", "n1"), t0));
        unseen.ungated.insert("u2".into(), (b.clone(), pin("u2", "n2"), t0));

        // Nothing seen yet: both roots wait, both pins of b are counted.
        let plans = HashMap::from([(a.clone(), (None, None)), (b.clone(), (None, None))]);
        let gated = HashSet::from(["u1", "u2"]);
        let s = unseen.settle(&plans, &gated, None, t0).expect("no claim write pending");
        assert_eq!(s.roots, HashSet::from([a.clone(), b.clone()]));
        assert_eq!(s.pins.len(), 2);
        assert_eq!(s.pins["u2"].node, "n2");

        // a's plan and u1's patch show: only u2 holds b back.
        let plans = HashMap::from([(a.clone(), (committing.clone(), None)), (b.clone(), (None, None))]);
        let gated = HashSet::from(["u2"]);
        let s = unseen.settle(&plans, &gated, None, t0).expect("no claim write pending");
        assert_eq!(s.roots, HashSet::from([b.clone()]));
        assert_eq!(s.pins.keys().collect::<Vec<_>>(), vec!["u2"]);

        // A plan write never seen is let go after the sync timeout; a pod ungated is waited for
        // however long the cache lags (and its pin stays counted).
        let later = t0 + CACHE_SYNC_TIMEOUT * 6;
        unseen.plans.insert(a.clone(), (committing.clone(), t0));
        let plans = HashMap::from([(a.clone(), (None, None)), (b.clone(), (None, None))]);
        let s = unseen.settle(&plans, &gated, None, later).expect("no claim write pending");
        assert!(unseen.plans.is_empty());
        assert_eq!(s.roots, HashSet::from([b.clone()]));
        assert_eq!(s.pins.keys().collect::<Vec<_>>(), vec!["u2"]);
        // Once the cache shows it ungated (or gone), it is forgotten.
        let s = unseen.settle(&plans, &HashSet::new(), None, later).expect("no claim write pending");
        assert!(s.roots.is_empty() && s.pins.is_empty() && unseen.ungated.is_empty());
    }

    #[test]
    fn a_status_write_holds_its_root_back_while_in_flight_then_fences_by_the_version_it_made() {
        let t0 = Instant::now();
        let (a, b) = (RootKey::leaf("ns", "a"), RootKey::leaf("ns", "b"));
        let mut unseen = Unseen::default();
        unseen.statuses.insert(a.clone(), ("7".to_string(), "8".to_string(), t0));
        unseen.statuses.insert(b.clone(), ("9".to_string(), "12".to_string(), t0));
        let v = |s: &str| Some(s.to_string());
        let cached = |va: &str, vb: &str| HashMap::from([(a.clone(), (None, v(va))), (b.clone(), (None, v(vb)))]);
        // The cache still shows the versions the writes were made on: fenced by what they made.
        let s = unseen.settle(&cached("7", "9"), &HashSet::new(), None, t0).expect("no claim write pending");
        assert!(s.roots.is_empty() && s.pins.is_empty(), "a status write that ended holds no root back");
        assert_eq!((unseen.fence(&a, v("7")), unseen.fence(&b, v("9"))), (v("8"), v("12")));
        // Another version cached than the one before the write: the cached one.
        assert_eq!(unseen.fence(&a, v("10")), v("10"));
        assert_eq!(unseen.fence(&RootKey::leaf("ns", "c"), v("3")), v("3"), "no write of ours");
        // a's write shows: a is forgotten, b still fenced by what its write made.
        unseen.settle(&cached("8", "9"), &HashSet::new(), None, t0).expect("no claim write pending");
        assert_eq!((unseen.fence(&a, v("7")), unseen.fence(&b, v("9"))), (v("7"), v("12")));
        // A write in flight holds its root back, for the sync timeout at most.
        unseen.status_writes.insert(a.clone(), t0);
        let s = unseen.settle(&cached("8", "9"), &HashSet::new(), None, t0).expect("no claim write pending");
        assert_eq!(s.roots, HashSet::from([a.clone()]));
        // A write never seen is forgotten after the sync timeout, and so is one on a group gone.
        let later = t0 + CACHE_SYNC_TIMEOUT;
        let s = unseen.settle(&cached("8", "9"), &HashSet::new(), None, later).expect("no claim write pending");
        assert!(s.roots.is_empty() && unseen.statuses.is_empty() && unseen.status_writes.is_empty());
        unseen.statuses.insert(a.clone(), ("8".to_string(), "9".to_string(), t0));
        unseen.settle(&HashMap::new(), &HashSet::new(), None, t0).expect("no claim write pending");
        assert!(unseen.statuses.is_empty());
    }

    #[test]
    fn a_plan_write_to_a_group_that_is_gone_is_seen() {
        let t0 = Instant::now();
        let a = RootKey::leaf("ns", "a");
        let mut unseen = Unseen::default();
        unseen.plans.insert(a, (None, t0));
        let s = unseen.settle(&HashMap::new(), &HashSet::new(), None, t0).expect("no claim write pending");
        assert!(s.roots.is_empty());
    }

    #[test]
    fn an_unseen_claim_write_makes_the_cycle_wait() {
        let t0 = Instant::now();
        let claim = ("ns".to_string(), "c".to_string());
        let mut unseen = Unseen::default();
        unseen.claims.insert(claim.clone(), (true, t0));
        let not_yet = HashMap::from([(claim.clone(), false)]);
        assert!(unseen.settle(&HashMap::new(), &HashSet::new(), Some(&not_yet), t0).is_none());
        let allocated = HashMap::from([(claim, true)]);
        assert!(unseen.settle(&HashMap::new(), &HashSet::new(), Some(&allocated), t0).is_some());
        assert!(unseen.claims.is_empty());
    }
}

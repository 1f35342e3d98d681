//! No DRA device given out twice, and shared claims past `reservedFor`'s limit (issue 42):
//! - muster writes a gang's claim allocations itself, and kube-scheduler may write the same
//!   device into another claim at the same moment. The test first plays the other allocator by
//!   hand (deterministic): as soon as muster has allocated one claim of a gang, it writes the
//!   same devices into a claim of its own. muster must roll the attempt back as one that lost
//!   (`BindFailed`, "also allocated to ResourceClaim <ns>/<other>",
//!   `muster_dra_devices_lost_total`), re-admit the gang whole on other devices, and no device
//!   may end in two claims. Once more with the commit cut short (muster exits after its first
//!   claim write, the devices are taken while it is down): the next muster rolls back before
//!   any pod of that attempt is ungated;
//! - then the real race, repeated (`MUSTER_E2E_RACE_ROUNDS`, default 3): a plain pod whose
//!   1-GPU claim kube-scheduler allocates, created at the same instant as a gang needing every
//!   GPU of the node. Whoever wins, a device is in two allocated claims at most briefly (while
//!   muster rolls back), the gang is never left half started, and once the plain pod goes the
//!   gang is admitted whole;
//! - a claim shared by 300 pods: in muster's own mode each pod would be listed in
//!   `status.reservedFor` (at most 256), so the gang waits, none of it admitted, saying why; in
//!   upstream mode kube-scheduler reserves the claim for the native PodGroup and all 300 bind.
//!
//! Sampling: every ~200 ms the tests look at the namespace's pods and claims. Two things may be
//! seen for a moment but must never last ([`Watch`]): a device in two allocated claims (the
//! race itself, until muster's rollback frees its claims) and a half-started gang (some pods of
//! the newest attempt bound, others not; or a pod of a rolled-back attempt still bound): binds
//! of one attempt land a few milliseconds apart, and a rollback records itself before it
//! deletes, so each is allowed for a grace period ([`OVERLAP_GRACE`], [`HALF_GRACE`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;

use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use muster::controllers::admission::FAULT_EXIT_ENV;
use muster::crds::{ADMISSION_ATTEMPT_ANNOTATION, MusterJob, PodGroup, SCHEDULING_API_ANNOTATION};
use muster_dev::dra::DRIVER;
use serde_json::{Value, json};

use crate::dra::{allocated, claim_spec};
use crate::dra_gangs::{claim_job, claim_of, template};
use crate::gangs::{LONG, TestNodes, apply, gated, job_pods, merge, node_of};
use crate::harness::dra::DraSlices;
use crate::harness::extra::extra_muster;
use crate::harness::manager::muster;
use crate::harness::{client, metric, namespace, wait_for};

/// muster's counter of attempts rolled back because a device of their claims was taken.
const LOST_METRIC: &str = "muster_dra_devices_lost_total";
/// What muster's rollback says about the other claim (followed by `<ns>/<name>`).
const LOST_WORDS: &str = "also allocated to ResourceClaim";
/// How long one device may be seen in two allocated claims: muster notices the other
/// allocation, rolls back, and the resource-claim controller deletes the rolled-back pods' claims.
const OVERLAP_GRACE: Duration = Duration::from_secs(15);
/// How long a gang may be seen half started: the binds of one attempt, the deletes of a rollback.
const HALF_GRACE: Duration = Duration::from_secs(5);
/// How long a state must hold to count as settled: longer than muster follows a plan with
/// claims after its creation (5 s), so a late rollback would still be seen.
const STABLE: Duration = Duration::from_secs(7);
/// How often the tests look.
const TICK: Duration = Duration::from_millis(200);

/// The admission attempt a pod belongs to (0 for the first; rolled-back attempts' pods are
/// recreated with the next number).
fn attempt_of(pod: &Pod) -> u32 {
    pod.annotations().get(ADMISSION_ATTEMPT_ANNOTATION).and_then(|a| a.parse().ok()).unwrap_or(0)
}

/// The live pods of the newest attempt among `pods`.
fn newest(pods: &[Pod]) -> Vec<&Pod> {
    let last = pods.iter().map(attempt_of).max().unwrap_or(0);
    pods.iter().filter(|p| attempt_of(p) == last).collect()
}

/// Allocated devices, each with the claims holding it.
fn holders(claims: &[ResourceClaim]) -> BTreeMap<(String, String), Vec<String>> {
    let mut out: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for c in claims {
        for d in allocated(c) {
            out.entry(d).or_default().push(c.name_any());
        }
    }
    out
}

/// The claims of the namespace, those being deleted too: a claim holds its devices until its
/// allocation is cleared.
async fn all_claims(claims: &Api<ResourceClaim>) -> Vec<ResourceClaim> {
    claims.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default()
}

/// A short description of pods and claims, for failure messages.
fn describe(pods: &[Pod], claims: &[ResourceClaim]) -> String {
    let pods: Vec<String> = pods
        .iter()
        .map(|p| format!("{} (attempt {}, gated {}, node {:?})", p.name_any(), attempt_of(p), gated(p), node_of(p)))
        .collect();
    let claims: Vec<String> = claims.iter().map(|c| format!("{}: {:?}", c.name_any(), allocated(c))).collect();
    format!("pods [{}]; claims [{}]", pods.join(", "), claims.join(", "))
}

/// What must never last, checked on every sample.
#[derive(Debug, Default)]
struct Watch {
    /// Pods of the gang.
    gang: usize,
    samples: usize,
    /// Samples that saw a device in two claims.
    overlap_samples: usize,
    /// Each device seen in two claims, since when (cleared when it is in one again).
    overlap_since: BTreeMap<(String, String), Instant>,
    longest_overlap: Duration,
    /// Samples that saw the gang half started.
    half_samples: usize,
    half_since: Option<Instant>,
    longest_half: Duration,
    /// Rollbacks the PodGroup recorded, as last seen.
    rollbacks: i32,
    /// Messages of the PodGroup that named a lost device.
    lost_messages: BTreeSet<String>,
}

impl Watch {
    fn new(gang: usize) -> Self {
        Self { gang, ..Self::default() }
    }

    /// Looks at one sample: the gang's live pods, the namespace's claims, the gang's PodGroup.
    /// Panics when a device has been in two claims, or the gang half started, for too long.
    fn observe(&mut self, pods: &[Pod], claims: &[ResourceClaim], group: Option<&PodGroup>) {
        let now = Instant::now();
        self.samples += 1;
        if let Some(status) = group.and_then(|g| g.status.as_ref()) {
            self.rollbacks = self.rollbacks.max(status.rollbacks);
            let messages = status.conditions.iter().map(|c| c.message.as_str()).chain(status.message.as_deref());
            self.lost_messages.extend(messages.filter(|m| m.contains(LOST_WORDS)).map(str::to_string));
        }

        let shared: BTreeMap<(String, String), Vec<String>> =
            holders(claims).into_iter().filter(|(_, c)| c.len() > 1).collect();
        self.overlap_samples += usize::from(!shared.is_empty());
        self.overlap_since.retain(|d, _| shared.contains_key(d));
        for (device, names) in &shared {
            let since = *self.overlap_since.entry(device.clone()).or_insert(now);
            self.longest_overlap = self.longest_overlap.max(now - since);
            assert!(
                now - since <= OVERLAP_GRACE,
                "device {device:?} has been allocated to {names:?} for {:.1}s; {}",
                (now - since).as_secs_f64(),
                describe(pods, claims)
            );
        }

        // Half started: some pods of the newest attempt bound and some not, or a pod of an
        // attempt already rolled back still bound.
        let last = newest(pods);
        let bound = last.iter().filter(|p| node_of(p).is_some()).count();
        let partial = bound > 0 && (bound < self.gang || last.len() < self.gang);
        let stale = pods.iter().any(|p| node_of(p).is_some() && (attempt_of(p) as i32) < self.rollbacks);
        if partial || stale {
            self.half_samples += 1;
            let since = *self.half_since.get_or_insert(now);
            self.longest_half = self.longest_half.max(now - since);
            assert!(
                now - since <= HALF_GRACE,
                "the gang has been half started for {:.1}s ({bound} of {} pods of attempt {} bound, {} \
                 rollbacks recorded); {}",
                (now - since).as_secs_f64(),
                self.gang,
                last.first().map_or(0, |p| attempt_of(p)),
                self.rollbacks,
                describe(pods, claims)
            );
        } else {
            self.half_since = None;
        }
    }

    fn summary(&self) -> String {
        format!(
            "{} samples: a device in two claims in {} (longest {:.2}s), the gang half started in {} (longest {:.2}s)",
            self.samples,
            self.overlap_samples,
            self.longest_overlap.as_secs_f64(),
            self.half_samples,
            self.longest_half.as_secs_f64()
        )
    }
}

/// What a watch of one kind in a namespace has folded up so far, in the background (every
/// version, including those that last less than a sample apart).
struct Folded<T> {
    seen: Arc<Mutex<T>>,
    task: tokio::task::JoinHandle<()>,
}

impl<T: Clone + Default + Send + 'static> Folded<T> {
    async fn watch<K>(ns: &str, mut fold: impl FnMut(&mut T, K) + Send + 'static) -> Self
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + std::fmt::Debug
            + serde::de::DeserializeOwned
            + Send
            + 'static,
    {
        let seen = Arc::new(Mutex::new(T::default()));
        let api: Api<K> = Api::namespaced(client().await, ns);
        let into = seen.clone();
        let task = tokio::spawn(async move {
            let mut versions = std::pin::pin!(watcher(api, watcher::Config::default()).applied_objects());
            while let Some(object) = versions.next().await {
                let Ok(object) = object else { continue };
                if let Ok(mut seen) = into.lock() {
                    fold(&mut seen, object);
                }
            }
        });
        Self { seen, task }
    }

    fn seen(&self) -> T {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl<T> Drop for Folded<T> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Every message naming a lost device that any version of the namespace's PodGroups carried: a
/// rollback's message lasts only until the next admission, often less than a sample apart.
async fn lost_messages(ns: &str) -> Folded<BTreeSet<String>> {
    Folded::watch(ns, |seen: &mut BTreeSet<String>, group: PodGroup| {
        let Some(status) = group.status else { return };
        let messages = status.conditions.iter().map(|c| c.message.clone()).chain(status.message);
        seen.extend(messages.filter(|m| m.contains(LOST_WORDS)));
    })
    .await
}

/// Per claim owner: when its claim was first seen, and first seen allocated.
type Seen = BTreeMap<String, (Instant, Option<Instant>)>;

/// When each claim of a namespace was first seen and first seen allocated, by the pod owning
/// it: how close the two sides of a race came.
async fn claim_times(ns: &str) -> Folded<Seen> {
    Folded::watch(ns, |seen: &mut Seen, c: ResourceClaim| {
        let now = Instant::now();
        let owner = c.owner_references().first().map_or_else(|| c.name_any(), |o| o.name.clone());
        let entry = seen.entry(owner).or_insert((now, None));
        if !allocated(&c).is_empty() && entry.1.is_none() {
            entry.1 = Some(now);
        }
    })
    .await
}

/// `owner: +made/+allocated ms` of each claim, relative to `began`.
fn claim_report(seen: &Seen, began: Instant) -> String {
    let ms = |t: Instant| t.saturating_duration_since(began).as_millis();
    let parts: Vec<String> = seen
        .iter()
        .map(|(owner, (made, alloc))| match alloc {
            Some(a) => format!("{owner} +{}/+{} ms", ms(*made), ms(*a)),
            None => format!("{owner} +{}/- ms", ms(*made)),
        })
        .collect();
    parts.join(", ")
}

/// Typed APIs of one namespace.
struct Apis {
    pods: Api<Pod>,
    claims: Api<ResourceClaim>,
    groups: Api<PodGroup>,
    jobs: Api<MusterJob>,
}

async fn apis(ns: &str) -> Apis {
    let c = client().await;
    Apis {
        pods: Api::namespaced(c.clone(), ns),
        claims: Api::namespaced(c.clone(), ns),
        groups: Api::namespaced(c.clone(), ns),
        jobs: Api::namespaced(c, ns),
    }
}

impl Apis {
    /// One sample: the job's live pods, the namespace's claims, the job's PodGroup.
    async fn sample(&self, job: &str) -> (Vec<Pod>, Vec<ResourceClaim>, Option<PodGroup>) {
        let pods = job_pods(&self.pods, job).await;
        let claims = all_claims(&self.claims).await;
        let group = self.groups.get_opt(job).await.ok().flatten();
        (pods, claims, group)
    }
}

/// Warning `BindFailed` events about PodGroup `group` that name a lost device (muster repeats
/// them on the MusterJob of the same name, not counted here), each with its count.
async fn lost_events(ns: &str, group: &str) -> Vec<(String, i32)> {
    let events: Api<Event> = Api::namespaced(client().await, ns);
    let list = events.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
    list.into_iter()
        .filter(|e| {
            e.involved_object.kind.as_deref() == Some("PodGroup") && e.involved_object.name.as_deref() == Some(group)
        })
        .filter(|e| e.type_.as_deref() == Some("Warning") && e.reason.as_deref() == Some("BindFailed"))
        .filter_map(|e| Some((e.message.filter(|m| m.contains(LOST_WORDS))?, e.count.unwrap_or(1))))
        .collect()
}

/// Writes `devices` (as `(pool, device)`) into claim `name`'s allocation, with `node_selector`,
/// as another allocator would (no consumer reserved: nothing will ever free it).
async fn allocate_by_hand(
    claims: &Api<ResourceClaim>,
    name: &str,
    devices: &[(String, String)],
    node_selector: &Value,
) {
    let results: Vec<Value> = devices
        .iter()
        .map(|(pool, device)| json!({"request": "gpus", "driver": DRIVER, "pool": pool, "device": device}))
        .collect();
    let status = json!({"status": {"allocation": {"devices": {"results": results}, "nodeSelector": node_selector}}});
    claims
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap_or_else(|e| panic!("allocate claim {name} by hand: {e}"));
}

#[tokio::test]
async fn a_claim_allocated_twice_rolls_the_gang_back_and_every_device_ends_in_one_claim() {
    const JOB: &str = "race";
    const PODS: usize = 2;
    let muster = muster().await;
    let ns = namespace("dra-steal");
    // Two 4-GPU nodes; the gang takes 2 x 2 GPUs, the thief 2: room for the gang after the theft.
    let nodes = TestNodes::add(&ns.name, 2, 4, 1).await;
    let _slices = DraSlices::publish(&nodes.names).await;
    template(&ns.name, "two-gpus", 2).await;
    let a = apis(&ns.name).await;
    let thief: ResourceClaim =
        serde_json::from_value(json!({"metadata": {"name": "thief"}, "spec": claim_spec(2)})).expect("claim");
    a.claims.create(&PostParams::default(), &thief).await.expect("create the thief's claim");
    let lost_before = metric(&muster.metrics().await, LOST_METRIC, &[]);
    let messages = lost_messages(&ns.name).await;

    let began = Instant::now();
    apply(&ns.name, &claim_job(JOB, PODS as u32, "two-gpus", &nodes, json!({})));

    // The other allocator: as soon as muster has allocated a claim of the gang, the same
    // devices go into the thief's claim.
    let mut versions = std::pin::pin!(watcher(a.claims.clone(), watcher::Config::default()).applied_objects());
    let first_allocation = async {
        while let Some(claim) = versions.next().await {
            let Ok(c) = claim else { continue };
            let allocation = c.status.as_ref().and_then(|s| s.allocation.as_ref());
            let selector = allocation.and_then(|a| serde_json::to_value(a.node_selector.as_ref()?).ok());
            let devices = allocated(&c);
            if let Some(selector) = selector.filter(|_| c.name_any() != "thief" && !devices.is_empty()) {
                return Some((c.name_any(), devices, selector));
            }
        }
        None
    };
    let (victim, stolen, selector) = tokio::time::timeout(LONG, first_allocation)
        .await
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("no claim of the gang allocated within {LONG:?}"));
    let seen_after = began.elapsed();
    allocate_by_hand(&a.claims, "thief", &stolen, &selector).await;
    let stolen_after = began.elapsed();
    // Until the gang is admitted again whole, and stays so: never half started, the devices
    // in two claims only until the rollback frees the gang's.
    let mut watch = Watch::new(PODS);
    let (pods, claims, group) = a.sample(JOB).await;
    watch.observe(&pods, &claims, group.as_ref());
    let first: BTreeSet<String> = pods.iter().filter_map(|p| p.uid()).collect();
    let plan_state = group.and_then(|g| g.status?.plan.map(|p| p.state));
    eprintln!(
        "dra steal: muster allocated {victim} ({stolen:?}) {:.2}s after the job; the same devices written into \
         thief at {:.2}s, when the plan was {plan_state:?} and {} of {} pods bound",
        seen_after.as_secs_f64(),
        stolen_after.as_secs_f64(),
        pods.iter().filter(|p| node_of(p).is_some()).count(),
        pods.len()
    );

    let deadline = Instant::now() + Duration::from_secs(120);
    let mut whole_since: Option<Instant> = None;
    let (pods, claims) = loop {
        let (pods, claims, group) = a.sample(JOB).await;
        watch.observe(&pods, &claims, group.as_ref());
        let rolled_back = pods.iter().all(|p| attempt_of(p) >= 1 && !first.contains(&p.uid().unwrap_or_default()));
        let whole = pods.len() == PODS && rolled_back && pods.iter().all(|p| node_of(p).is_some());
        let single = holders(&claims).values().all(|c| c.len() == 1);
        if whole && single {
            let since = *whole_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= STABLE {
                break (pods, claims);
            }
        } else {
            whole_since = None;
        }
        assert!(
            Instant::now() < deadline,
            "no rollback and whole re-admission within 120s ({} rollbacks recorded); {}",
            watch.rollbacks,
            describe(&pods, &claims)
        );
        tokio::time::sleep(TICK).await;
    };
    let settled_after = began.elapsed();

    // The new attempt's claims: none of the stolen devices, each device once.
    let by_device = holders(&claims);
    for d in &stolen {
        assert_eq!(by_device.get(d), Some(&vec!["thief".to_string()]), "stolen device {d:?}");
    }
    let mut gang_devices = BTreeSet::new();
    for pod in &pods {
        let name = claim_of(pod, "gpus").unwrap_or_else(|| panic!("pod {} names no claim", pod.name_any()));
        let claim = claims.iter().find(|c| c.name_any() == name).unwrap_or_else(|| panic!("claim {name}"));
        let devices = allocated(claim);
        assert_eq!(devices.len(), 2, "claim {name}: {devices:?}");
        for d in devices {
            assert_eq!(Some(d.0.as_str()), node_of(pod), "claim {name} on the pod's node");
            assert!(!stolen.contains(&d), "claim {name} got stolen device {d:?}");
            assert!(gang_devices.insert(d.clone()), "device {d:?} twice in the gang");
        }
    }
    // The rolled-back attempt's claims are gone (their pods went), the victim with them.
    let names: BTreeSet<String> = claims.iter().map(ResourceClaim::name_any).collect();
    assert!(!names.contains(&victim), "the rolled-back claim {victim} is still there: {names:?}");
    assert_eq!(names.len(), PODS + 1, "the thief's and the new attempt's claims only: {names:?}");

    // muster says why, on the PodGroup, in an event and in its metrics.
    let other = format!("{LOST_WORDS} {}/thief", ns.name);
    // One rollback: the next plan steered clear of the stolen devices.
    assert_eq!(watch.rollbacks, 1, "rollbacks recorded on the PodGroup");
    let events = lost_events(&ns.name, JOB).await;
    assert!(events.iter().any(|(m, _)| m.contains(&other)), "a Warning BindFailed event naming {other:?}: {events:?}");
    assert_eq!(events.iter().map(|(_, n)| n).sum::<i32>(), 1, "one lost-device rollback: {events:?}");
    let lost_after = metric(&muster.metrics().await, LOST_METRIC, &[]);
    assert!(lost_after >= lost_before + 1.0, "{LOST_METRIC}: {lost_before} before, {lost_after} after");
    eprintln!(
        "dra steal: rolled back ({} rollbacks, {LOST_METRIC} {lost_before} -> {lost_after}), re-admitted whole on \
         {gang_devices:?} and settled {:.2}s after the job; {}; event: {}",
        watch.rollbacks,
        settled_after.as_secs_f64(),
        watch.summary(),
        events.first().map(|(m, _)| m.as_str()).unwrap_or_default()
    );
    // The status moves on to the next attempt at once (here re-admitted in the same cycle
    // round), so the lasting record is the event above and `status.rollbacks`; a status that
    // caught the rollback between cycles names the claim too.
    let mut said = messages.seen();
    said.extend(watch.lost_messages.iter().cloned());
    assert!(said.iter().all(|m| m.contains(&other)), "a lost-device status names {other:?}: {said:?}");
    let job = a.jobs.get(JOB).await.expect("the job");
    assert_eq!(job.status.as_ref().map_or(0, |s| s.failed), 0, "a rollback is no pod failure: {:?}", job.status);
}

/// The loss found while a commit is cut short: muster exits right after allocating the
/// gang's first claim (the test hook), that claim's devices go to another claim, and the
/// muster started next must roll the attempt back before any of its pods is ungated, then
/// admit the gang whole elsewhere.
#[tokio::test]
async fn a_claim_taken_while_a_commit_is_cut_short_rolls_back_before_any_pod_starts() {
    const JOB: &str = "cut";
    const PODS: usize = 2;
    // Writes: claim 1 -> exit.
    let mut extra = extra_muster(&[], &[(FAULT_EXIT_ENV, "1")]).await;
    let ns = namespace("dra-steal-cut");
    let nodes = TestNodes::add(&ns.name, 2, 4, 1).await;
    let _slices = DraSlices::publish(&nodes.names).await;
    template(&ns.name, "two-gpus", 2).await;
    let a = apis(&ns.name).await;
    let thief: ResourceClaim =
        serde_json::from_value(json!({"metadata": {"name": "thief"}, "spec": claim_spec(2)})).expect("claim");
    a.claims.create(&PostParams::default(), &thief).await.expect("create the thief's claim");
    apply(&ns.name, &claim_job(JOB, PODS as u32, "two-gpus", &nodes, json!({})));
    assert_eq!(extra.exited(LONG).await.code(), Some(3), "muster exits through the test hook");

    let claims = all_claims(&a.claims).await;
    let held: Vec<&ResourceClaim> = claims.iter().filter(|c| !allocated(c).is_empty()).collect();
    assert_eq!(held.len(), 1, "one claim allocated before the exit: {}", describe(&[], &claims));
    let (victim, stolen) = (held[0].name_any(), allocated(held[0]));
    let allocation = held[0].status.as_ref().and_then(|s| s.allocation.as_ref());
    let selector = allocation.and_then(|a| serde_json::to_value(a.node_selector.as_ref()?).ok()).expect("a selector");
    let first = job_pods(&a.pods, JOB).await;
    assert!(first.iter().all(gated), "no pod ungated yet: {}", describe(&first, &claims));
    let first: BTreeSet<String> = first.iter().filter_map(|p| p.uid()).collect();
    allocate_by_hand(&a.claims, "thief", &stolen, &selector).await;

    extra.start(&[], &[]).await;
    let began = Instant::now();
    let mut watch = Watch::new(PODS);
    let deadline = began + Duration::from_secs(120);
    let mut whole_since: Option<Instant> = None;
    let pods = loop {
        let (pods, claims, group) = a.sample(JOB).await;
        watch.observe(&pods, &claims, group.as_ref());
        // Strict: no pod of the cut-short attempt ever starts.
        let started: Vec<&Pod> =
            pods.iter().filter(|p| first.contains(&p.uid().unwrap_or_default()) && !gated(p)).collect();
        assert!(
            started.is_empty(),
            "a pod of the attempt that lost its device was ungated; {}",
            describe(&pods, &claims)
        );
        let whole = pods.len() == PODS
            && pods.iter().all(|p| attempt_of(p) == 1 && node_of(p).is_some())
            && holders(&claims).values().all(|c| c.len() == 1);
        if whole {
            let since = *whole_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= STABLE {
                break pods;
            }
        } else {
            whole_since = None;
        }
        assert!(
            Instant::now() < deadline,
            "no rollback and whole re-admission within 120s of the restart ({} rollbacks); {}",
            watch.rollbacks,
            describe(&pods, &claims)
        );
        tokio::time::sleep(TICK).await;
    };
    let claims = all_claims(&a.claims).await;
    assert!(claims.iter().all(|c| c.name_any() != victim), "the lost attempt's claim {victim} is gone");
    for pod in &pods {
        let name = claim_of(pod, "gpus").unwrap_or_else(|| panic!("pod {} names no claim", pod.name_any()));
        let claim = claims.iter().find(|c| c.name_any() == name).unwrap_or_else(|| panic!("claim {name}"));
        assert!(allocated(claim).iter().all(|d| !stolen.contains(d)), "claim {name} got a stolen device");
    }
    assert_eq!(watch.rollbacks, 1, "rollbacks recorded on the PodGroup");
    let other = format!("{LOST_WORDS} {}/thief", ns.name);
    let events = lost_events(&ns.name, JOB).await;
    assert!(events.iter().any(|(m, _)| m.contains(&other)), "a Warning BindFailed event naming {other:?}: {events:?}");
    let lost = metric(&extra.metrics().await, LOST_METRIC, &[]);
    assert_eq!(lost, 1.0, "{LOST_METRIC} of the restarted muster");
    eprintln!(
        "dra steal mid-commit: {victim} ({stolen:?}) taken while muster was down; after the restart rolled back \
         (no pod of it ungated) and re-admitted whole, settled {:.2}s after the restart; {}; event: {}",
        began.elapsed().as_secs_f64(),
        watch.summary(),
        events.first().map(|(m, _)| m.as_str()).unwrap_or_default()
    );
}

/// Who won a round of the race.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Winner {
    /// The gang bound whole, the plain pod pending.
    Gang,
    /// The plain pod bound, the gang waiting (gated).
    Plain,
}

/// Env var: rounds of the race (default 3).
const ROUNDS_ENV: &str = "MUSTER_E2E_RACE_ROUNDS";
/// Env var: the latest the plain pod is created after the gang's job, in milliseconds
/// (default 600). Round 0 creates both at once; each later round bisects between the latest
/// delay at which the plain pod won and the earliest at which the gang won, so the rounds home
/// in on the moment both sides allocate together, wherever it lies on the machine at hand.
const MAX_DELAY_ENV: &str = "MUSTER_E2E_RACE_MAX_DELAY_MS";

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The plain pod: a 1-GPU claim from template `one-gpu`, no gate, no PodGroup.
fn plain_pod(nodes: &TestNodes) -> Pod {
    let container =
        json!({"name": "main", "image": "registry.invalid/none", "resources": {"claims": [{"name": "gpus"}]}});
    let mut pod = json!({
        "metadata": {"name": "plain"},
        "spec": {"restartPolicy": "Never",
                 "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "one-gpu"}],
                 "containers": [container]},
    });
    merge(&mut pod["spec"], nodes.placement());
    serde_json::from_value(pod).expect("the plain pod")
}

/// What one round saw.
struct Round {
    winner: Winner,
    /// Rollbacks that named a lost device (events in the round's namespace).
    conflicts: i32,
    overlap_samples: usize,
}

/// One round: a 4-GPU node, a gang of 2 pods x 2 GPUs and a plain pod of 1 GPU created at once
/// (the plain one `delay` later).
async fn race_round(round: u64, delay: Duration) -> Round {
    const JOB: &str = "gang";
    const PODS: usize = 2;
    let ns = namespace(&format!("dra-race-{round}"));
    let nodes = TestNodes::add(&ns.name, 1, 4, 1).await;
    let slices = DraSlices::publish(&nodes.names).await;
    let all_devices: BTreeSet<(String, String)> =
        slices.devices(&nodes.names[0]).into_iter().map(|d| (nodes.names[0].clone(), d)).collect();
    assert_eq!(all_devices.len(), 4, "{all_devices:?}");
    template(&ns.name, "two-gpus", 2).await;
    template(&ns.name, "one-gpu", 1).await;
    let a = apis(&ns.name).await;
    let job: MusterJob =
        serde_json::from_value(claim_job(JOB, PODS as u32, "two-gpus", &nodes, json!({}))).expect("the job");
    let plain = plain_pod(&nodes);
    let params = PostParams::default();
    let times = claim_times(&ns.name).await;
    let began = Instant::now();
    let (made_job, made_pod) = tokio::join!(a.jobs.create(&params, &job), async {
        tokio::time::sleep(delay).await;
        a.pods.create(&params, &plain).await
    });
    made_job.expect("create the gang's job");
    made_pod.expect("create the plain pod");

    // Until one side has won and it holds.
    let mut watch = Watch::new(PODS);
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut held: Option<(Winner, Instant)> = None;
    let mut plain_claim = None;
    let winner = loop {
        let (pods, claims, group) = a.sample(JOB).await;
        watch.observe(&pods, &claims, group.as_ref());
        let p = a.pods.get_opt("plain").await.ok().flatten();
        plain_claim = plain_claim.or_else(|| p.as_ref().and_then(|p| claim_of(p, "gpus")));
        let plain_bound = p.as_ref().is_some_and(|p| node_of(p).is_some());
        let last = newest(&pods);
        let gang_whole = last.len() == PODS && last.iter().all(|p| node_of(p).is_some());
        let gang_waiting = pods.len() == PODS && pods.iter().all(|p| gated(p) && node_of(p).is_none());
        let now = match (gang_whole, plain_bound, gang_waiting) {
            (true, false, _) => Some(Winner::Gang),
            (false, true, true) => Some(Winner::Plain),
            _ => None,
        };
        match (now, held) {
            (Some(w), Some((h, since))) if w == h => {
                if since.elapsed() >= STABLE {
                    break w;
                }
            }
            (Some(w), _) => held = Some((w, Instant::now())),
            (None, _) => held = None,
        }
        assert!(
            Instant::now() < deadline,
            "round {round}: neither side settled within 120s; plain bound {plain_bound}; {}",
            describe(&pods, &claims)
        );
        tokio::time::sleep(TICK).await;
    };
    let settled_after = began.elapsed();
    let raced = claim_report(&times.seen(), began);

    // The plain pod goes; its claim with it; the gang must end admitted whole on all 4 GPUs.
    a.pods.delete("plain", &DeleteParams::default()).await.expect("delete the plain pod");
    let deleted = Instant::now();
    let deadline = deleted + Duration::from_secs(120);
    let mut whole_since: Option<Instant> = None;
    let (pods, claims) = loop {
        let (pods, claims, group) = a.sample(JOB).await;
        watch.observe(&pods, &claims, group.as_ref());
        let last = newest(&pods);
        let whole = pods.len() == PODS && last.len() == PODS && last.iter().all(|p| node_of(p).is_some());
        let plain_gone = plain_claim.as_ref().is_none_or(|n| claims.iter().all(|c| c.name_any() != *n));
        if whole && plain_gone {
            let since = *whole_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= Duration::from_secs(2) {
                break (pods, claims);
            }
        } else {
            whole_since = None;
        }
        assert!(
            Instant::now() < deadline,
            "round {round}: the gang not admitted whole within 120s of the plain pod's deletion; {}",
            describe(&pods, &claims)
        );
        tokio::time::sleep(TICK).await;
    };
    let admitted_after = deleted.elapsed();

    let by_device = holders(&claims);
    assert!(by_device.values().all(|c| c.len() == 1), "round {round}: a device in two claims: {by_device:?}");
    let mut gang_devices = BTreeSet::new();
    for pod in &pods {
        let name =
            claim_of(pod, "gpus").unwrap_or_else(|| panic!("round {round}: pod {} names no claim", pod.name_any()));
        let claim = claims.iter().find(|c| c.name_any() == name).unwrap_or_else(|| panic!("claim {name}"));
        for d in allocated(claim) {
            assert!(gang_devices.insert(d.clone()), "round {round}: device {d:?} twice in the gang");
        }
    }
    assert_eq!(gang_devices, all_devices, "round {round}: the gang holds every GPU of the node");

    let conflicts: i32 = lost_events(&ns.name, JOB).await.iter().map(|(_, n)| n).sum();
    eprintln!(
        "dra race round {round}: {winner:?} first (plain pod {} ms after the job), settled {:.2}s after the creates; \
         gang admitted whole {:.2}s after the plain pod's deletion; rollbacks {}, conflicts detected (events) \
         {conflicts}; {}; claims made/allocated until settled: {raced}",
        delay.as_millis(),
        settled_after.as_secs_f64(),
        admitted_after.as_secs_f64(),
        watch.rollbacks,
        watch.summary()
    );
    // Every rollback of the round was one that lost a device, and a device seen in two claims
    // was one muster noticed.
    assert_eq!(watch.rollbacks, conflicts, "round {round}: rollbacks vs lost-device events; {}", watch.summary());
    assert!(
        watch.overlap_samples == 0 || conflicts > 0,
        "round {round}: a device was seen in two claims, yet muster rolled nothing back; {}",
        watch.summary()
    );
    Round { winner, conflicts, overlap_samples: watch.overlap_samples }
}

#[tokio::test]
async fn a_plain_pod_racing_a_gang_for_the_same_gpus_never_shares_a_device() {
    let muster = muster().await;
    let rounds = env_u64(ROUNDS_ENV, 3).max(1);
    let (mut plain_at, mut gang_at) = (0, env_u64(MAX_DELAY_ENV, 600));
    let lost_before = metric(&muster.metrics().await, LOST_METRIC, &[]);
    let began = Instant::now();
    let mut seen = Vec::new();
    for round in 0..rounds {
        if gang_at.saturating_sub(plain_at) < 10 {
            (plain_at, gang_at) = (plain_at.saturating_sub(50), gang_at + 50);
        }
        let delay = if round == 0 { 0 } else { (plain_at + gang_at) / 2 };
        let r = race_round(round, Duration::from_millis(delay)).await;
        match r.winner {
            Winner::Plain => plain_at = plain_at.max(delay),
            Winner::Gang => gang_at = gang_at.min(delay),
        }
        seen.push(r);
    }
    let lost = metric(&muster.metrics().await, LOST_METRIC, &[]) - lost_before;
    let count = |w: Winner| seen.iter().filter(|r| r.winner == w).count();
    eprintln!(
        "dra race: rounds={rounds} gang_first={} plain_first={} conflicts_detected={lost} (metric; muster-wide: \
         counts other tests running at the same time too) lost_device_rollbacks_in_these_rounds={} \
         rounds_with_a_shared_device_seen={} in {:.1}s",
        count(Winner::Gang),
        count(Winner::Plain),
        seen.iter().map(|r| r.conflicts).sum::<i32>(),
        seen.iter().filter(|r| r.overlap_samples > 0).count(),
        began.elapsed().as_secs_f64()
    );
}

/// A MusterJob of `pods` cheap pods sharing one claim made from template `one-gpu` (the group
/// entry `shared` of `spec.scheduling.resourceClaims`).
fn shared_job(name: &str, pods: u32, nodes: &TestNodes) -> Value {
    let mut job = claim_job(name, pods, "unused", nodes, json!({}));
    let spec = &mut job["spec"]["template"]["spec"];
    spec["resourceClaims"] = json!([]);
    spec["containers"][0]["resources"] = json!({"claims": [{"name": "shared"}], "requests": {"cpu": "10m"}});
    job["spec"]["scheduling"]["resourceClaims"] = json!([{"name": "shared", "resourceClaimTemplateName": "one-gpu"}]);
    job
}

/// Applies `object` in `ns` like [`apply`] and returns what kubectl printed on stderr (the
/// admission warnings).
fn apply_with_warnings(ns: &str, object: &Value) -> String {
    use std::io::Write as _;
    let cluster = crate::harness::cluster();
    let mut child = std::process::Command::new(cluster.bin.join("kubectl"))
        .arg("--kubeconfig")
        .arg(&cluster.kubeconfig)
        .args(["apply", "--server-side", "--field-manager=muster-e2e", "-n", ns, "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run kubectl");
    child.stdin.take().expect("stdin").write_all(object.to_string().as_bytes()).expect("write the object");
    let out = child.wait_with_output().expect("kubectl apply");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "kubectl apply: {stderr}");
    stderr
}

#[tokio::test]
async fn a_shared_claim_for_300_pods_waits_in_muster_mode_and_is_reserved_for_the_podgroup_upstream() {
    const PODS: usize = 300;
    let _muster = muster().await;
    let ns = namespace("dra-shared-300");
    // One node that takes every pod (and then some).
    let nodes = TestNodes::add_with(&ns.name, 1, 8, |s| s.pods = "400".into()).await;
    let _slices = DraSlices::publish(&nodes.names).await;
    template(&ns.name, "one-gpu", 1).await;
    let a = apis(&ns.name).await;

    // muster's own mode: the gang waits, whole, and says why.
    let began = Instant::now();
    let warnings = apply_with_warnings(&ns.name, &shared_job("own", PODS as u32, &nodes));
    assert!(
        warnings.contains("spec.scheduling.resourceClaims[0]: shared by 300 pods")
            && warnings.contains("256")
            && warnings.contains("upstream"),
        "the API server passes on muster's admission warning: {warnings}"
    );
    let claim = format!("{}/own-shared", ns.name);
    let (message, made_after) =
        wait_for("the gang waiting on reservedFor's limit", Duration::from_secs(180), || async {
            let pods = job_pods(&a.pods, "own").await;
            let status = a.groups.get_opt("own").await.ok().flatten()?.status?;
            let mut messages = status.conditions.iter().map(|c| c.message.clone()).chain(status.message.clone());
            let why = messages.find(|m| m.contains("256") && m.contains("reservedFor"))?;
            (pods.len() == PODS).then(|| (why, began.elapsed()))
        })
        .await;
    assert!(message.contains(&claim), "the reason names the claim {claim}: {message}");
    assert!(message.contains("upstream"), "the reason suggests upstream mode: {message}");
    // And it holds: no pod ungated, none bound, the claim not allocated.
    let watch_until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < watch_until {
        let pods = job_pods(&a.pods, "own").await;
        let started = pods.iter().filter(|p| !gated(p) || node_of(p).is_some()).count();
        assert_eq!(started, 0, "{started} of {} pods of the waiting gang ungated or bound", pods.len());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let own_claim = a.claims.get("own-shared").await.expect("the group's claim");
    assert!(allocated(&own_claim).is_empty(), "the claim of a waiting gang is not allocated: {:?}", own_claim.status);
    let own_secs = began.elapsed().as_secs_f64();
    eprintln!(
        "dra shared 300, muster mode: {PODS} pods made and the reason given {:.1}s after the job, held 5 s more \
         (half: {own_secs:.1}s): {message}",
        made_after.as_secs_f64()
    );
    a.jobs.delete("own", &DeleteParams::background()).await.expect("delete own");
    wait_for("the own-mode pods gone", Duration::from_secs(120), || async {
        job_pods(&a.pods, "own").await.is_empty().then_some(())
    })
    .await;

    // Upstream mode: kube-scheduler reserves the claim for the native PodGroup; all 300 bind.
    let began = Instant::now();
    let mut job = shared_job("up", PODS as u32, &nodes);
    job["metadata"]["annotations"] = json!({SCHEDULING_API_ANNOTATION: "upstream"});
    apply(&ns.name, &job);
    let bound = wait_for("300 upstream pods bound", Duration::from_secs(300), || async {
        let pods = job_pods(&a.pods, "up").await;
        (pods.len() == PODS && pods.iter().all(|p| node_of(p).is_some())).then_some(pods)
    })
    .await;
    let bound_after = began.elapsed();
    let names: BTreeSet<String> = bound.iter().filter_map(|p| claim_of(p, "shared")).collect();
    assert_eq!(names.len(), 1, "one claim for the whole gang: {names:?}");
    let name = names.into_iter().next().expect("claim name");
    let claim = a.claims.get(&name).await.expect("the PodGroup's claim");
    let devices = allocated(&claim);
    assert_eq!(devices.len(), 1, "{devices:?}");
    assert_eq!(devices[0].0, nodes.names[0]);
    let reserved: Vec<(Option<String>, String, String)> = claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|r| (r.api_group, r.resource, r.name))
        .collect();
    assert_eq!(
        reserved,
        [(Some("scheduling.k8s.io".to_string()), "podgroups".to_string(), "up".to_string())],
        "claim {name} reserved for the native PodGroup alone"
    );
    let up_secs = began.elapsed().as_secs_f64();
    eprintln!(
        "dra shared 300, upstream mode: {PODS} pods bound {:.1}s after the job (half: {up_secs:.1}s); claim {name} \
         on {devices:?} reserved for {reserved:?}",
        bound_after.as_secs_f64()
    );
}

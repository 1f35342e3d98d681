//! The device-annotation reconciler: keeps the GPU ledger true. It states on each pod what its
//! node gave it (allocated DRA claims; kubelet's assignment as the node agent reads it back,
//! correcting muster's plan where kubelet chose otherwise), gives concrete indices to
//! GPU pods that were bound without muster's admission, forgets the indices of finished and
//! deleted pods at once (the ledger is kept from the live pods, each node's part built again
//! when its pods change), reports a GPU claimed by two
//! live pods as a conflict (event + `muster_gpu_conflicts`), and exports per-node GPU gauges.
//! It runs on the leader, right after each admission cycle, on the same watch caches.
//!
//! What it decides is plain data ([`plan`]); [`DeviceReconciler::pass`] only reports, patches
//! and exports. An error on one pod is that pod's: it is reported on the pod, retried with a
//! backoff of its own, and never stops the pass (or the admission cycle) for the others.

pub mod prometheus;

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::context::{Context, Detached, at_most};
use super::metrics::{NodeLabels, ReasonLabels};
use crate::crds::GPU_INDICES_ANNOTATION;
use crate::devices::chooser::NodeModels;
use crate::devices::report::{AskingPod, kubelet_indices};
use crate::devices::{
    GpuSet, KeptLedger, Ledger, LedgerProblem, PodRecord, SelectOptions, format_indices, parse_indices, select,
};
use crate::pods::{DevicePod, Placement, PodClass};
use crate::scheduler::Snapshot;

pub use crate::pods::gpus_wanted;

/// The node a pod holds GPUs on: where it is bound, or where admission pinned it. Borrowed
/// where the pod's class is (the kept `GpuPod`s): a pass over 10,000 pods copies no node name.
fn node_of<'a>(pod: &'a dyn DevicePod, snapshot: &'a Snapshot) -> Option<Cow<'a, str>> {
    match pod.class() {
        Cow::Borrowed(class) => node_in(class, snapshot).map(Cow::Borrowed),
        Cow::Owned(class) => node_in(&class, snapshot).map(|n| Cow::Owned(n.to_string())),
    }
}

fn node_in<'a>(class: &'a PodClass, snapshot: &'a Snapshot) -> Option<&'a str> {
    match &class.placement {
        _ if class.finished() => None,
        Placement::Bound(node) => Some(node),
        Placement::Admitted(host) => snapshot.node_by_hostname(host).map(|n| n.name.as_str()),
        Placement::Gated | Placement::Unpinned => None,
    }
}

fn is_bound(pod: &dyn DevicePod) -> bool {
    matches!(pod.class().placement, Placement::Bound(_))
}

fn is_finished(pod: &dyn DevicePod) -> bool {
    pod.class().finished()
}

fn is_terminating(pod: &dyn DevicePod) -> bool {
    pod.class().terminating
}

fn phase_of(pod: &dyn DevicePod) -> crate::devices::PodPhase {
    crate::devices::PodPhase::from(pod.class().lifecycle)
}

/// The event reason for indices that hold nothing: written on a pod by someone other than
/// muster or its node, with nothing to vouch for them ([`crate::devices::trust`]).
pub const UNTRUSTED_INDICES: &str = "UntrustedGPUIndices";

/// Something wrong with one pod's GPUs, to report once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// What identifies the problem across passes: the same problem keeps its key, a changed
    /// one gets another.
    pub key: String,
    /// The pod it is about.
    pub uid: String,
    /// The event reason.
    pub reason: &'static str,
    /// The event note and log line.
    pub message: String,
    /// Whether it counts in `muster_gpu_conflicts`.
    pub conflict: bool,
}

impl Report {
    fn from_ledger(problem: &LedgerProblem) -> Self {
        let conflict = matches!(problem, LedgerProblem::Conflict(_));
        let reason = match problem {
            LedgerProblem::Conflict(_) => "GPUConflict",
            LedgerProblem::BeyondNode { .. } => "GPUIndicesBeyondNode",
            LedgerProblem::BadAnnotation { .. } | LedgerProblem::NoNode { .. } => "BadGPUIndices",
        };
        // The text names the pods and GPUs involved: it changes exactly when the problem does.
        let message = problem.to_string();
        Report { key: message.clone(), uid: problem.pod_uid().to_string(), reason, message, conflict }
    }
}

/// Where the indices of an [`Assignment`] come from.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    /// Chosen by this pass for a GPU pod bound without muster.
    Chosen,
    /// What the pod's allocated DRA claims name (the driver prepares exactly those).
    Claim,
    /// What kubelet gave the pod, read back by the node agent from PodResources.
    Kubelet {
        /// The indices the pod carried before (muster's plan), if any.
        planned: Option<GpuSet>,
        /// The device IDs kubelet named.
        devices: Vec<String>,
    },
}

/// Indices for a GPU pod whose annotation is missing or says otherwise than its node; written
/// onto the pod unless it is terminating.
#[derive(Clone, Debug)]
pub struct Assignment<'a> {
    /// The pod.
    pub pod: &'a dyn DevicePod,
    /// Its node.
    pub node: String,
    /// The GPUs, held in the plan's ledger whether or not the write succeeds.
    pub gpus: GpuSet,
    /// Whether to write them onto the pod (not for a terminating pod).
    pub write: bool,
    /// Where they come from.
    pub source: Source,
}

impl Assignment<'_> {
    /// Whether writing this corrects indices muster had planned (kubelet chose otherwise).
    pub fn is_correction(&self) -> bool {
        matches!(&self.source, Source::Kubelet { planned: Some(p), .. } if *p != self.gpus)
    }
}

/// What a pod's node says it holds: the truth, which outranks any plan.
struct Held {
    gpus: GpuSet,
    source: Source,
}

/// What `pod`'s node gave it: its allocated own DRA claims, else what the node agent read from
/// kubelet (its entry of `pod`'s name, only while `pod` is bound to `node`, or of its uid in
/// an older agent's report: [`crate::devices::report::AssignedAnnotation::given`]). A device
/// kubelet names that the node's model lacks is reported, and the pod keeps its annotation.
fn held_by_node(
    pod: &dyn DevicePod,
    node: &str,
    snapshot: &Snapshot,
    gpus: &impl NodeModels,
    reports: &mut Vec<Report>,
) -> Option<Held> {
    if let Some((_, g)) = snapshot.dra().claims_gpus(pod.namespace(), &pod.own_claims()).filter(|(n, _)| n == node) {
        return Some(Held { gpus: g, source: Source::Claim });
    }
    let node_gpus = gpus.model(node)?;
    let assigned = node_gpus.assigned.as_ref()?;
    let class = pod.class();
    let asking =
        AskingPod { uid: pod.uid(), namespace: pod.namespace(), name: pod.name(), bound_to: class.bound_node() };
    let given = assigned.given(node, asking)?;
    match kubelet_indices(&given.devices, &node_gpus.topology) {
        Ok(set) if !set.is_empty() => {
            let planned = pod.gpu_indices().and_then(|v| parse_indices(v).ok());
            Some(Held { gpus: set, source: Source::Kubelet { planned, devices: given.devices.clone() } })
        }
        Ok(_) => None,
        Err(e) => {
            let uid = pod.uid();
            reports.push(Report {
                key: format!("unknown-device/{uid}/{node}/{}", e.id),
                uid: uid.to_string(),
                reason: "UnknownGPUDevice",
                message: format!(
                    "kubelet gave pod {} {e} on node {node}; its GPU indices are not corrected",
                    pod.name()
                ),
                conflict: false,
            });
            None
        }
    }
}

/// What one pass decides, before any API call.
#[derive(Debug)]
pub struct DevicePlan<'a> {
    /// Every live pod's GPUs: what the nodes confirmed, the annotations, and the choices of
    /// [`Self::assignments`].
    pub ledger: PlanLedger<'a>,
    /// Problems present now, each once.
    pub reports: Vec<Report>,
    /// Annotations to write: what nodes confirmed where the pod says otherwise, then GPU pods
    /// bound without indices, in the order they were given GPUs (oldest first).
    pub assignments: Vec<Assignment<'a>>,
}

/// The ledger a pass plans on: every live pod's GPUs as the pods state them (what the nodes
/// confirmed, the annotations), kept across passes or built for this one, and the GPUs this
/// pass chose for pods without indices.
#[derive(Debug, PartialEq)]
pub struct PlanLedger<'a> {
    stated: Cow<'a, Ledger>,
    chosen: Ledger,
}

impl PlanLedger<'_> {
    /// GPUs of `node` held by some pod.
    pub fn used_mask(&self, node: &str) -> GpuSet {
        self.stated.used_mask(node).union(self.chosen.used_mask(node))
    }

    /// What `pod_uid` holds.
    pub fn claim(&self, pod_uid: &str) -> Option<&crate::devices::Claim> {
        self.stated.claim(pod_uid).or_else(|| self.chosen.claim(pod_uid))
    }

    /// The pod holding GPU `index` of `node`.
    pub fn holder(&self, node: &str, index: usize) -> Option<&str> {
        self.stated.holder(node, index).or_else(|| self.chosen.holder(node, index))
    }
}

/// The ledger of `pods`, and indices for every bound GPU pod whose annotation is missing or
/// differs from what its node gave it.
///
/// What a node confirmed is the truth: an allocated DRA claim, or the devices kubelet gave the
/// pod as the node agent read them from PodResources (on a device-plugin node kubelet picks
/// the GPUs, so muster's plan is a wish until it is read back). The ledger holds those, and
/// in a conflict they outrank any plan; the pod's annotation is corrected to them.
///
/// The rule that keeps admission safe: a bound, live GPU pod always holds GPUs in the
/// ledger. It runs on its node and kubelet gives it devices whatever muster writes, so the
/// GPUs chosen for it here stay held for it even when writing them fails, is backed off, or
/// is not tried (a terminating pod is given nothing new on the pod itself); otherwise the
/// next admission would plan another pod onto them. Choices are made oldest pod first on the
/// ledger of the annotations, so a pod whose write keeps failing gets the same GPUs each pass
/// while nothing else changes.
pub fn plan<'a, P: DevicePod>(pods: &'a [P], snapshot: &Snapshot, gpus: &impl NodeModels) -> DevicePlan<'a> {
    plan_with(pods, snapshot, gpus, &HashMap::new())
}

/// [`plan`], where `chosen` (pod UID -> node and GPUs) holds what earlier passes chose for
/// pods whose annotation the cache does not show yet (written, or being written): those pods
/// get the same GPUs again, before any other pod is given GPUs, so no pass hands them to
/// another pod while the write is on its way to the cache. The ledger of what the pods state
/// is built afresh ([`Ledger::rebuild`]).
pub fn plan_with<'a, P: DevicePod>(
    pods: &'a [P],
    snapshot: &Snapshot,
    gpus: &impl NodeModels,
    chosen: &HashMap<String, (String, GpuSet)>,
) -> DevicePlan<'a> {
    let inputs = Inputs::of(pods, snapshot, gpus);
    let (ledger, problems) = Ledger::rebuild(inputs.records(snapshot));
    inputs.plan(Cow::Owned(ledger), problems.iter(), gpus, chosen)
}

/// [`plan_with`] on the ledger `kept` across passes: only the nodes whose pods' records
/// changed are built again ([`KeptLedger::update`]; always equal to a rebuild).
pub fn plan_kept<'a, P: DevicePod>(
    pods: &'a [P],
    snapshot: &Snapshot,
    gpus: &impl NodeModels,
    chosen: &HashMap<String, (String, GpuSet)>,
    kept: &'a mut KeptLedger,
) -> DevicePlan<'a> {
    let inputs = Inputs::of(pods, snapshot, gpus);
    kept.update(inputs.records(snapshot));
    let kept: &'a KeptLedger = kept;
    inputs.plan(Cow::Borrowed(kept.ledger()), kept.problems(), gpus, chosen)
}

/// What a pass reads of its pods before it plans: the located ones (terminating pods stay: in
/// their grace period they still run on their GPUs), what each one's node gave it, and the
/// problems met reading that.
struct Inputs<'a, 's> {
    located: Vec<(&'a dyn DevicePod, Cow<'s, str>)>,
    held: Vec<Option<Held>>,
    /// `held` as annotation values, what the ledger records read.
    held_text: Vec<Option<String>>,
    /// Each pod's own annotation, where the ledger may read it ([`stated`]).
    stated: Vec<Option<&'a str>>,
    reports: Vec<Report>,
}

/// The `gpu.muster.dev/indices` of `pod` on `node` as the ledger may read it: the value when
/// something vouches for it (muster's plan, or a bound pod asking for that many GPUs, see
/// [`crate::devices::trust`]); an unreadable value too (the ledger reports it and holds
/// nothing). A value nothing vouches for holds nothing and is reported.
fn stated<'a>(pod: &'a dyn DevicePod, node: &str, snapshot: &Snapshot, reports: &mut Vec<Report>) -> Option<&'a str> {
    let value = pod.gpu_indices()?;
    let Ok(named) = parse_indices(value) else { return Some(value) };
    let bound = is_bound(pod);
    match crate::devices::vouch(named, pod.gpus_wanted(), bound, node, snapshot.placed(pod.uid())) {
        Ok(()) => Some(value),
        Err(why) => {
            let uid = pod.uid();
            reports.push(Report {
                key: format!("untrusted/{uid}/{node}/{named}/{bound}"),
                uid: uid.to_string(),
                reason: UNTRUSTED_INDICES,
                message: format!(
                    "{GPU_INDICES_ANNOTATION}={value:?} on pod {}/{} holds no GPU on node {node}: {why}",
                    pod.namespace(),
                    pod.name()
                ),
                conflict: false,
            });
            None
        }
    }
}

impl<'a: 's, 's> Inputs<'a, 's> {
    fn of<P: DevicePod>(pods: &'a [P], snapshot: &'s Snapshot, gpus: &impl NodeModels) -> Self {
        let located: Vec<(&dyn DevicePod, Cow<'_, str>)> =
            pods.iter().map(|p| p as &dyn DevicePod).filter_map(|p| node_of(p, snapshot).map(|n| (p, n))).collect();
        let mut reports = Vec::new();
        let held: Vec<Option<Held>> =
            located.iter().map(|(p, node)| held_by_node(*p, node, snapshot, gpus, &mut reports)).collect();
        let held_text: Vec<Option<String>> = held.iter().map(|h| h.as_ref().map(|h| format_indices(h.gpus))).collect();
        let stated = located
            .iter()
            .zip(&held_text)
            .map(|((p, node), truth)| match truth {
                Some(_) => None,
                None => stated(*p, node, snapshot, &mut reports),
            })
            .collect();
        Inputs { located, held, held_text, stated, reports }
    }

    /// The ledger's record of each located pod.
    fn records<'r>(&'r self, snapshot: &'r Snapshot) -> impl Iterator<Item = PodRecord<'r>> {
        self.located.iter().zip(self.held_text.iter().zip(&self.stated)).map(|((p, node), (truth, stated))| PodRecord {
            node,
            uid: p.uid(),
            created: p.created(),
            indices: truth.as_deref().or(*stated),
            phase: phase_of(*p),
            bound: is_bound(*p),
            terminating: is_terminating(*p),
            node_gpus: snapshot.node(node).map_or(0, |n| n.gpu_count as usize),
            confirmed: truth.is_some(),
        })
    }

    /// The plan on `stated` (the ledger of these pods' records) and its `problems`.
    fn plan<'p>(
        self,
        stated: Cow<'a, Ledger>,
        problems: impl Iterator<Item = &'p LedgerProblem>,
        gpus: &impl NodeModels,
        chosen: &HashMap<String, (String, GpuSet)>,
    ) -> DevicePlan<'a> {
        let Inputs { located, held, held_text, stated: own, mut reports } = self;
        reports.extend(problems.map(Report::from_ledger));
        // `gpu.muster.dev/indices` states what the node gave the pod.
        let mut assignments: Vec<Assignment<'a>> = located
            .iter()
            .zip(held)
            .filter_map(|((pod, node), held)| {
                let held = held?;
                let written = pod.gpu_indices().and_then(|v| parse_indices(v).ok());
                (written != Some(held.gpus) && !is_finished(*pod)).then(|| Assignment {
                    pod: *pod,
                    node: node.to_string(),
                    gpus: held.gpus,
                    write: !is_terminating(*pod),
                    source: held.source,
                })
            })
            .collect();
        // GPU pods kube-scheduler bound without muster (and not read back yet): give them
        // indices right after binding.
        // A pod whose own indices nothing vouches for counts as one without any.
        let mut unassigned: Vec<&(&dyn DevicePod, Cow<'_, str>)> = located
            .iter()
            .zip(held_text.iter().zip(&own))
            .filter(|(_, (confirmed, own))| confirmed.is_none() && own.is_none())
            .map(|(located, _)| located)
            .filter(|(p, _)| !phase_of(*p).is_terminal() && is_bound(*p) && p.gpus_wanted() > 0)
            .collect();
        // Pods chosen for before come first, then the oldest.
        let earlier = |p: &dyn DevicePod, node: &str| chosen.get(p.uid()).filter(|(n, _)| n == node).map(|(_, g)| *g);
        unassigned.sort_by(|(a, na), (b, nb)| {
            let age = |p: &dyn DevicePod| {
                let created = p.created();
                (created.is_none(), created)
            };
            let fresh = |p: &dyn DevicePod, n: &str| earlier(p, n).is_none();
            fresh(*a, na).cmp(&fresh(*b, nb)).then_with(|| age(*a).cmp(&age(*b))).then_with(|| a.uid().cmp(b.uid()))
        });
        let mut ledger = PlanLedger { stated, chosen: Ledger::new() };
        for (pod, node) in unassigned {
            let Some(node_gpus) = gpus.model(node.as_ref()) else { continue };
            let wanted = usize::try_from(pod.gpus_wanted()).unwrap_or(usize::MAX);
            let terminating = is_terminating(*pod);
            let used = ledger.used_mask(node);
            let free = node_gpus.topology.all().difference(used);
            // What an earlier pass chose, while those GPUs are still free; else prefer healthy
            // GPUs (the pod is bound already, so fall back to any free one).
            let again = earlier(*pod, node)
                .filter(|g| {
                    g.len() == wanted
                        && g.intersection(used).is_empty()
                        && g.difference(node_gpus.topology.all()).is_empty()
                })
                .map(|gpus| crate::devices::select::Selection { gpus, cost: 0 });
            let choice = again
                .or_else(|| {
                    select(
                        &node_gpus.topology,
                        crate::devices::available(&node_gpus.health, used),
                        wanted,
                        SelectOptions::default(),
                    )
                })
                .or_else(|| select(&node_gpus.topology, free, wanted, SelectOptions::default()));
            let uid = pod.uid();
            let Some(choice) = choice else {
                if !terminating {
                    reports.push(Report {
                        key: format!("no-free-gpus/{uid}/{node}/{wanted}"),
                        uid: uid.to_string(),
                        reason: "GPUConflict",
                        message: format!(
                            "no {wanted} free GPU indices on node {node} for pod {}: the ledger holds {}",
                            pod.name(),
                            format_indices(used)
                        ),
                        conflict: true,
                    });
                }
                continue;
            };
            // Chosen on what is free of both parts, for a pod the stated part has no claim of.
            if ledger.stated.claim(uid).is_none() && ledger.chosen.assign(node, uid, choice.gpus).is_ok() {
                assignments.push(Assignment {
                    pod: *pod,
                    node: node.to_string(),
                    gpus: choice.gpus,
                    write: !terminating,
                    source: Source::Chosen,
                });
            }
        }
        DevicePlan { ledger, reports, assignments }
    }
}

/// The GPU gauges of one node, as last set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct NodeGauges {
    total: i64,
    allocated: i64,
    unhealthy: i64,
}

impl NodeGauges {
    fn set(self, ctx: &Context, node: &str) {
        let labels = NodeLabels { node: node.to_string() };
        ctx.metrics.gpus_total.get_or_create(&labels).set(self.total);
        ctx.metrics.gpus_allocated.get_or_create(&labels).set(self.allocated);
        ctx.metrics.gpus_unhealthy.get_or_create(&labels).set(self.unhealthy);
    }
}

/// The problems already reported, so each is reported once per change.
#[derive(Debug, Default)]
pub struct Reported(HashSet<String>);

impl Reported {
    /// Of the problems present now, those not present at the last pass; forgets those gone, so
    /// a problem that clears and comes back is reported again.
    pub fn fresh<'r>(&mut self, now: &'r [Report]) -> Vec<&'r Report> {
        let mut seen = HashSet::new();
        let fresh = now.iter().filter(|r| !self.0.contains(&r.key) && seen.insert(r.key.as_str())).collect();
        self.0 = now.iter().map(|r| r.key.clone()).collect();
        fresh
    }
}

/// Shortest wait after a pod's first failed write.
pub const PATCH_BACKOFF_MIN: Duration = Duration::from_secs(1);
/// Longest wait between two writes to one pod.
pub const PATCH_BACKOFF_MAX: Duration = Duration::from_secs(300);

/// Failed writes to one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Failures {
    count: u32,
    retry_at: Instant,
    /// What the last event said (reason and indices), so a changed failure is reported anew.
    reported: String,
}

/// Per pod, when its annotation may be written again after failures (exponential backoff).
#[derive(Debug, Default)]
pub struct PatchBackoff(HashMap<String, Failures>);

impl PatchBackoff {
    /// Whether a write to `uid` may be tried at `now`.
    pub fn ready(&self, uid: &str, now: Instant) -> bool {
        self.0.get(uid).is_none_or(|f| now >= f.retry_at)
    }

    /// Records a failed write; returns how long to wait, and whether `what` differs from what
    /// the last failure of this pod said (then it is worth an event).
    pub fn failed(&mut self, uid: &str, now: Instant, what: &str) -> (Duration, bool) {
        let entry =
            self.0.entry(uid.to_string()).or_insert(Failures { count: 0, retry_at: now, reported: String::new() });
        entry.count = entry.count.saturating_add(1);
        let delay = PATCH_BACKOFF_MIN.saturating_mul(1 << (entry.count - 1).min(16)).min(PATCH_BACKOFF_MAX);
        entry.retry_at = now + delay;
        let changed = entry.reported != what;
        entry.reported = what.to_string();
        (delay, changed)
    }

    /// Forgets the failures of a pod written at last, or gone.
    pub fn forget(&mut self, uid: &str) {
        self.0.remove(uid);
    }

    /// Keeps only the pods in `live`.
    pub fn retain(&mut self, live: &HashSet<&str>) {
        self.0.retain(|uid, _| live.contains(uid.as_str()));
    }
}

/// The reason label of a failed write, for `muster_device_patch_errors_total`.
pub use crate::controllers::context::api_error_reason as patch_error_reason;

/// How long one annotation write may take, retries of the client included: a pod the API
/// keeps answering 503 (or never answers) costs the pass this much at most, once.
pub const PATCH_TIMEOUT: Duration = Duration::from_secs(5);
/// How many GPU-index writes (and events) of one pass are in flight at once.
pub const WRITE_CONCURRENCY: usize = 16;

/// An event a pass sends on a pod once its writes are done.
struct PodEvent {
    pod: ObjectReference,
    warning: bool,
    reason: &'static str,
    note: String,
}

/// How writing one pod's indices ended.
enum Written {
    Done,
    /// The pod is gone, or another pod has its name now: nothing to write to.
    Gone(String),
    Failed {
        reason: &'static str,
        error: String,
    },
}

/// A GPU-index write sent in the background, and what to say once it is done.
struct Sent {
    uid: String,
    pod: ObjectReference,
    name: String,
    node: String,
    indices: String,
    /// The event reason and note of a write that went through.
    done: (&'static str, String),
    /// Whether it corrects indices muster had planned (kubelet chose otherwise).
    correction: bool,
}

impl Sent {
    fn of(a: &Assignment<'_>) -> Self {
        let (node, indices) = (a.node.clone(), format_indices(a.gpus));
        let done = match &a.source {
            Source::Kubelet { planned: Some(planned), devices } if a.is_correction() => (
                "GPUIndicesCorrected",
                format!(
                    "kubelet gave this pod GPUs {indices} ({}) on node {node}, not the {} muster planned: \
                     {GPU_INDICES_ANNOTATION} now says what its containers hold",
                    devices.join(","),
                    format_indices(*planned)
                ),
            ),
            Source::Kubelet { .. } => {
                ("GPUsAssigned", format!("GPU indices {indices} on node {node}, as kubelet gave them"))
            }
            Source::Claim => {
                ("GPUsAssigned", format!("GPU indices {indices} on node {node}, as its claims allocate them"))
            }
            Source::Chosen => ("GPUsAssigned", format!("GPU indices {indices} on node {node}")),
        };
        Sent {
            uid: a.pod.uid().to_string(),
            pod: a.pod.reference(),
            name: a.pod.name().to_string(),
            node,
            indices,
            done,
            correction: a.is_correction(),
        }
    }
}

/// Writes already done, waiting to be booked by the next pass.
type Results = Arc<std::sync::Mutex<Vec<(Sent, Written)>>>;

/// State kept between passes: which problems were already reported, which pods' writes are
/// backed off or in flight, and which nodes have GPU gauges.
pub struct DeviceReconciler {
    reported: Reported,
    backoff: PatchBackoff,
    gauged: HashMap<String, NodeGauges>,
    patch_timeout: Duration,
    /// The batch of writes in flight (one at a time), and what it has done so far.
    batch: Option<Detached<()>>,
    results: Results,
    /// Called when a batch ends, so the next pass books it (admission wakes a cycle).
    on_batch_done: Option<Arc<dyn Fn() + Send + Sync>>,
    /// GPUs this reconciler chose for pods bound without muster, until the cache shows their
    /// annotation: pod UID -> node, GPUs, whether the write went through. Later passes give
    /// those pods the same GPUs (see [`plan_with`]) and do not write them twice.
    chosen: HashMap<String, (String, GpuSet, bool)>,
    /// The ledger of what the pods state, kept across passes (see [`plan_kept`]).
    kept: KeptLedger,
}

impl Default for DeviceReconciler {
    fn default() -> Self {
        Self {
            reported: Reported::default(),
            backoff: PatchBackoff::default(),
            gauged: HashMap::new(),
            patch_timeout: PATCH_TIMEOUT,
            batch: None,
            results: Results::default(),
            on_batch_done: None,
            chosen: HashMap::new(),
            kept: KeptLedger::default(),
        }
    }
}

/// Merge-patches a pod's indices (only if it is still the pod with that uid).
async fn write(client: kube::Client, sent: &Sent, timeout: Duration) -> Written {
    let patch = json!({"metadata": {"uid": sent.uid, "annotations": {GPU_INDICES_ANNOTATION: sent.indices}}});
    let api = Api::<Pod>::namespaced(client, sent.pod.namespace.as_deref().unwrap_or_default());
    let (params, patch) = (PatchParams::default(), Patch::Merge(&patch));
    match tokio::time::timeout(timeout, api.patch_metadata(&sent.name, &params, &patch)).await {
        Ok(Ok(_)) => Written::Done,
        Ok(Err(kube::Error::Api(e))) if matches!(e.code, 404 | 409) => Written::Gone(e.message),
        Ok(Err(e)) => Written::Failed { reason: patch_error_reason(&e), error: e.to_string() },
        Err(_) => Written::Failed { reason: "timeout", error: format!("no answer within {}s", timeout.as_secs_f64()) },
    }
}

/// Sends a batch of writes, [`WRITE_CONCURRENCY`] at a time; a write that went through is
/// logged and its event sent at once, the rest is booked by the next pass.
async fn send_batch(ctx: Arc<Context>, batch: Vec<Sent>, timeout: Duration, results: Results) {
    let ctx = &ctx;
    let results = &results;
    let sends: Vec<_> = batch
        .into_iter()
        .map(|sent| async move {
            let outcome = write(ctx.client.clone(), &sent, timeout).await;
            if matches!(outcome, Written::Done) {
                if sent.correction {
                    ctx.metrics.gpu_index_corrections.inc();
                }
                let (reason, note) = &sent.done;
                tracing::info!(pod = %sent.name, node = %sent.node, indices = %sent.indices, reason, "{note}");
                ctx.event(&sent.pod, false, reason, "AssignGPUs", note.clone());
            }
            results.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((sent, outcome));
        })
        .collect();
    at_most(WRITE_CONCURRENCY, sends).await;
}

impl DeviceReconciler {
    /// Calls `f` each time a batch of writes ends.
    pub fn on_batch_done(&mut self, f: impl Fn() + Send + Sync + 'static) {
        self.on_batch_done = Some(Arc::new(f));
    }

    /// One pass over every pod. Returns the GPU indices held per node afterwards, on the nodes
    /// where some are (including what this pass chose, written or not), for admission to plan
    /// around. Errors are per pod and never fail the pass. The pass never waits for its
    /// writes: they go out in the background, one batch at a time, [`WRITE_CONCURRENCY`] at a
    /// time within it (a thousand pods bound at once by kube-scheduler never flood the API
    /// server, nor hold up the admission cycle); the next pass books how they ended. A pod
    /// whose write is in flight or backed off holds its GPUs all the same.
    pub fn pass(
        &mut self,
        ctx: &Arc<Context>,
        pods: &[impl DevicePod],
        snapshot: &Snapshot,
        gpus: &impl NodeModels,
    ) -> HashMap<String, GpuSet> {
        self.book(ctx);
        let by_uid: HashMap<&str, &dyn DevicePod> = pods.iter().map(|p| (p.uid(), p as &dyn DevicePod)).collect();
        // A choice is kept until the cache shows the pod's annotation (or the pod is gone).
        // (An annotation other than the choice, one nothing vouches for, keeps it too.)
        self.chosen.retain(|uid, (_, gpus, _)| {
            by_uid.get(uid.as_str()).is_some_and(|p| p.gpu_indices().is_none_or(|v| parse_indices(v) != Ok(*gpus)))
        });
        let earlier: HashMap<String, (String, GpuSet)> =
            self.chosen.iter().map(|(uid, (node, gpus, _))| (uid.clone(), (node.clone(), *gpus))).collect();
        let plan = plan_kept(pods, snapshot, gpus, &earlier, &mut self.kept);
        for a in plan.assignments.iter().filter(|a| a.source == Source::Chosen) {
            let entry = self.chosen.entry(a.pod.uid().to_string()).or_insert((a.node.clone(), a.gpus, false));
            if (entry.0.as_str(), entry.1) != (a.node.as_str(), a.gpus) {
                *entry = (a.node.clone(), a.gpus, false);
            }
        }
        for report in self.reported.fresh(&plan.reports) {
            if report.conflict {
                ctx.metrics.gpu_conflicts.inc();
            }
            tracing::warn!(problem = %report.message, "GPU ledger");
            if let Some(pod) = by_uid.get(report.uid.as_str()) {
                ctx.event(&pod.reference(), true, report.reason, "AssignGPUs", report.message.clone());
            }
        }

        self.backoff.retain(&by_uid.keys().copied().collect());
        let now = Instant::now();
        if self.batch.is_none() {
            let due: Vec<Sent> = plan
                .assignments
                .iter()
                .filter(|a| a.write && self.backoff.ready(a.pod.uid(), now))
                // Written already, not in the cache yet: not written again.
                .filter(|a| !self.chosen.get(a.pod.uid()).is_some_and(|(_, g, written)| *written && *g == a.gpus))
                .map(Sent::of)
                .collect();
            if !due.is_empty() {
                let (ctx, results, done) = (ctx.clone(), self.results.clone(), self.on_batch_done.clone());
                let timeout = self.patch_timeout;
                self.batch = Some(Detached::spawn(async move {
                    send_batch(ctx, due, timeout, results).await;
                    if let Some(done) = done {
                        done();
                    }
                }));
            }
        }

        // Each node's gauges are set when their values change (three labelled series per
        // node, 5,000 nodes: setting them all every cycle was a measurable part of it).
        let mut held = HashMap::new();
        let (before, mut kept) = (self.gauged.len(), 0);
        for (node, g) in gpus.models() {
            let used = plan.ledger.used_mask(node);
            let values = NodeGauges {
                total: g.topology.len() as i64,
                allocated: used.intersection(g.topology.all()).len() as i64,
                unhealthy: g.unhealthy().len() as i64,
            };
            match self.gauged.get_mut(node) {
                Some(set) => {
                    kept += 1;
                    if *set != values {
                        values.set(ctx, node);
                        *set = values;
                    }
                }
                None => {
                    values.set(ctx, node);
                    self.gauged.insert(node.clone(), values);
                }
            }
            if !used.is_empty() {
                held.insert(node.clone(), used);
            }
        }
        // Nodes gauged before and not seen now are gone: only then look for them.
        if kept < before {
            self.gauged.retain(|node, _| {
                let live = gpus.model(node).is_some();
                if !live {
                    ctx.metrics.remove_node_gpus(node);
                }
                live
            });
        }
        held
    }

    /// Waits for the writes in flight and books them.
    pub async fn settle(&mut self, ctx: &Context) {
        if let Some(batch) = self.batch.as_mut()
            && let Err(e) = batch.join().await
        {
            tracing::warn!(error = %e, "a batch of GPU-index writes failed");
        }
        self.book(ctx);
    }

    /// Books the writes done since the last pass (backoff, failure metrics and events); once
    /// the batch has ended, the next may go.
    fn book(&mut self, ctx: &Context) {
        let finished = self.batch.as_ref().is_none_or(Detached::is_finished);
        let done = std::mem::take(&mut *self.results.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        let now = Instant::now();
        let events: Vec<PodEvent> =
            done.into_iter().filter_map(|(sent, outcome)| self.written(ctx, sent, outcome, now)).collect();
        if finished {
            self.batch = None;
        }
        for e in events {
            ctx.event(&e.pod, e.warning, e.reason, "AssignGPUs", e.note);
        }
    }

    /// Books how a write ended; a failure is reported on the pod (once per change), counted
    /// and backed off. The GPUs stay held either way (see [`plan`]). Returns the event to send
    /// on the pod, if any.
    fn written(&mut self, ctx: &Context, sent: Sent, outcome: Written, now: Instant) -> Option<PodEvent> {
        let Sent { uid, pod, name, node, indices, .. } = sent;
        match outcome {
            Written::Done => {
                self.backoff.forget(&uid);
                if let Some(entry) = self.chosen.get_mut(&uid)
                    && format_indices(entry.1) == indices
                {
                    entry.2 = true;
                }
                None
            }
            Written::Gone(message) => {
                self.backoff.forget(&uid);
                self.chosen.remove(&uid);
                tracing::debug!(pod = %name, error = %message, "pod changed or gone; GPU indices not written");
                None
            }
            Written::Failed { reason, error } => {
                ctx.metrics.device_patch_errors.get_or_create(&ReasonLabels { reason: reason.into() }).inc();
                let (delay, changed) = self.backoff.failed(&uid, now, &format!("{reason}/{indices}"));
                tracing::warn!(
                    pod = %name, namespace = ?pod.namespace, node, indices, reason, error = %error,
                    retry_in_s = delay.as_secs(), "could not write GPU indices; they stay held for the pod"
                );
                changed.then(|| PodEvent {
                    pod,
                    warning: true,
                    reason: "GPUIndicesNotWritten",
                    note: format!(
                        "could not write {GPU_INDICES_ANNOTATION}={indices} (node {node}): {error}; \
                         muster keeps those GPUs held for this pod and retries"
                    ),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests;

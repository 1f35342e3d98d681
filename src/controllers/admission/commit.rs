//! The commit protocol, carried out: record a plan, patch each pod once (pin, GPU indices,
//! gate removal), then follow the recorded plan. What to do with a recorded plan (resume, wait
//! for binds, roll a failed attempt back, fail a gang that started) is the core's
//! [`scheduler::next_step`]; this file gathers its inputs and carries the step out.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event as CoreEvent, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::{
    Admitter, GroupRef, MIN_BACKOFF, Patched, PlanClear, RootKey, World, Writer, error_backoff, is_gated, patched,
};
use crate::controllers::context::{Detached, Error, Result, at_most, bounded};
use super::nominations::write_nominations;
use super::report::object_labels;
use crate::crds::blocks::DisruptionModeKind;
use crate::crds::scheduling::{AdmissionPlan, AvoidedNode, CompositePodGroup, PlanState, PlannedPod, PodGroup};
use crate::crds::{ADMISSION_GATE, GPU_INDICES_ANNOTATION, HOSTNAME_LABEL, ROLLED_BACK_ANNOTATION};
use crate::devices::parse_indices;
use crate::pods::{Placement, PodClass};
use crate::scheduler::status::{Outcome, PLAN_STATUS_HOLD, StatusPacing, wait_started};
use crate::scheduler::{
    self, ClaimWrite, CommitInput, Decision, Disrupted, Dra, FailureCause, GatedPin, GroupCount, PatchRefused,
    PinFailure, PinState, PlannedPodNow, Refusal, RemainingFits, RollBack, RollbackHistory, RollbackPolicy, Snapshot,
    StartRequirement, Step,
};

/// Counts a pod just pinned by `planned` in the snapshot (resources and GPU indices), so the
/// roots planned later in the same cycle see the capacity taken.
pub(super) fn reserve(snapshot: &mut Snapshot, pod: &Pod, planned: &PlannedPod) {
    let mut admitted = pod.clone();
    if let Some(spec) = admitted.spec.as_mut() {
        spec.node_selector
            .get_or_insert_with(BTreeMap::new)
            .insert(HOSTNAME_LABEL.into(), planned.pin_hostname().into());
        spec.scheduling_gates = None;
    }
    snapshot.add_pod(&admitted);
    if let Some(gpus) = planned.gpu_indices.as_deref().and_then(|v| parse_indices(v).ok())
        && let Some(node) = snapshot.node(&planned.node)
    {
        let used = node.gpu_used.union(gpus);
        snapshot.set_gpu_used(&planned.node, used);
    }
}

/// How rollbacks pace roots (see [`RollbackPolicy::DEFAULT`]).
pub(super) const ROLLBACK_POLICY: RollbackPolicy = RollbackPolicy::DEFAULT;

/// Each planned pod as it is now, for the commit state machine.
fn pods_now(plan: &AdmissionPlan, root: &str, world: &World<'_>) -> Vec<PlannedPodNow> {
    plan.pods
        .iter()
        .map(|planned| {
            let pod = world.pods_by_uid.get(planned.uid.as_str()).copied();
            PlannedPodNow {
                name: planned.name.clone(),
                uid: planned.uid.clone(),
                pod_group: if planned.pod_group.is_empty() { root.to_string() } else { planned.pod_group.clone() },
                node: planned.node.clone(),
                node_exists: world.nodes.contains(planned.node.as_str()),
                state: pod.map_or(PinState::Gone, pin_state),
            }
        })
        .collect()
}

/// Where a planned pod stands, read from the pod.
fn pin_state(pod: &Pod) -> PinState {
    let class = PodClass::of(pod);
    match class.placement {
        _ if class.terminating => PinState::Terminating,
        _ if class.finished() => PinState::Finished,
        Placement::Bound(node) => PinState::Bound { node },
        Placement::Gated => PinState::Gated,
        Placement::Admitted(_) | Placement::Unpinned => PinState::Unbound { refusal: refusal(pod) },
    }
}

/// kube-scheduler's `PodScheduled=False` condition (the pod cache keeps it).
fn refusal(pod: &Pod) -> Option<Refusal> {
    let c =
        pod.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
    Some(Refusal { reason: c.reason.clone().unwrap_or_default(), message: c.message.clone().unwrap_or_default() })
}

/// The minCount of every PodGroup with pods in the plan (1 for basic groups, and for groups
/// not in the cache).
fn start_requirement(plan: &AdmissionPlan, ns: &str, root: &str, pod_groups: &[Arc<PodGroup>]) -> StartRequirement {
    let mut min_count = BTreeMap::new();
    for planned in &plan.pods {
        let group = if planned.pod_group.is_empty() { root } else { planned.pod_group.as_str() };
        let min = pod_groups
            .iter()
            .find(|pg| pg.metadata.namespace.as_deref() == Some(ns) && pg.metadata.name.as_deref() == Some(group))
            .and_then(|pg| pg.spec.scheduling_policy.min_count())
            .map_or(1, |m| u32::try_from(m).unwrap_or(1));
        min_count.insert(group.to_string(), min);
    }
    StartRequirement { min_count }
}

/// A root's rollback history, read from its status fields.
fn history_of(rollbacks: i32, recent: i32, last: Option<&Time>, avoid: &[AvoidedNode]) -> RollbackHistory {
    RollbackHistory {
        count: u32::try_from(rollbacks).unwrap_or(0),
        recent: u32::try_from(recent).unwrap_or(0),
        last: last.map(|t| t.0),
        avoid: avoid.iter().map(|a| (a.node.clone(), a.until.0)).collect(),
    }
}

/// The status fields (a merge patch) that record a root's rollback history.
fn history_status(h: &RollbackHistory) -> serde_json::Value {
    let avoid: Vec<AvoidedNode> =
        h.avoid.iter().map(|(node, until)| AvoidedNode { node: node.clone(), until: Time(*until) }).collect();
    json!({
        "rollbacks": i32::try_from(h.count).unwrap_or(i32::MAX),
        "recentRollbacks": i32::try_from(h.recent).unwrap_or(i32::MAX),
        "lastRollbackTime": h.last.map(Time),
        "avoidNodes": avoid,
    })
}

impl GroupRef<'_> {
    /// The group's resourceVersion as cached: what a decision on it was made on.
    pub(super) fn version(&self) -> Option<String> {
        match self {
            GroupRef::Leaf(pg) => pg.resource_version(),
            GroupRef::Composite(c) => c.resource_version(),
        }
    }

    /// The root's disruption mode (`single` unless `all` is set).
    pub(super) fn disruption(&self) -> DisruptionModeKind {
        let mode = match self {
            GroupRef::Leaf(pg) => &pg.spec.disruption_mode,
            GroupRef::Composite(c) => &c.spec.disruption_mode,
        };
        mode.kind().unwrap_or(DisruptionModeKind::Single)
    }

    /// The root's `preemptionPolicy` (unset: `PreemptLowerPriority`, as upstream).
    pub(super) fn preemption_policy(&self) -> Option<crate::crds::scheduling::PreemptionPolicy> {
        match self {
            GroupRef::Leaf(pg) => pg.spec.preemption_policy,
            GroupRef::Composite(c) => c.spec.preemption_policy,
        }
    }

    /// What the root's status remembers of its rollbacks.
    pub(super) fn history(&self) -> RollbackHistory {
        match self {
            GroupRef::Leaf(pg) => pg
                .status
                .as_ref()
                .map(|s| history_of(s.rollbacks, s.recent_rollbacks, s.last_rollback_time.as_ref(), &s.avoid_nodes)),
            GroupRef::Composite(c) => c
                .status
                .as_ref()
                .map(|s| history_of(s.rollbacks, s.recent_rollbacks, s.last_rollback_time.as_ref(), &s.avoid_nodes)),
        }
        .unwrap_or_default()
    }
}

/// How one commit (or resume) ended, short of an error worth a backoff.
#[derive(Debug)]
pub(super) enum Committed {
    /// Every pod patched (or the group was gone).
    Done,
    /// The group or a pod changed since the decision (a write was refused as stale): decide
    /// again on fresher caches, next cycle.
    Stale,
    /// The API server refused a pod's patch (a webhook, a policy, validation).
    Refused(PatchRefused),
    /// The plan is too large for one status write.
    TooLarge(String),
    /// DRA claims of the plan are not ready to allocate (not made yet by the resource-claim
    /// controller, missing, or taken meanwhile): nothing was written; decide again later.
    NotReady(String),
}

/// The largest plan one status write may carry: the API server refuses requests over 3 MiB and
/// etcd values over 1.5 MiB; the rest of the status needs room too.
pub(super) const MAX_PLAN_BYTES: usize = 1024 * 1024;

/// Why a plan cannot be recorded in one status write, if it cannot.
fn too_large(plan: &AdmissionPlan) -> Option<String> {
    let size = serde_json::to_vec(plan).map_or(usize::MAX, |v| v.len());
    (size > MAX_PLAN_BYTES).then(|| {
        format!(
            "the plan of {} pods takes {} KiB, more than the {} KiB one status write of the group may carry; \
             split the gang into smaller PodGroups under a CompositePodGroup",
            plan.pods.len(),
            size / 1024,
            MAX_PLAN_BYTES / 1024
        )
    })
}

/// Why a plan cut short cannot go on: a shared claim it was to allocate before the first pod
/// is not allocated (the commit stopped before it), or is gone.
fn unallocated_shared(plan: &AdmissionPlan, ns: &str, dra: &Dra) -> Option<String> {
    plan.shared_claims.iter().find_map(|name| match dra.claim(ns, name) {
        None => Some(format!("shared ResourceClaim {ns}/{name} of the plan is gone")),
        Some(c) if c.allocation.is_none() => {
            Some(format!("shared ResourceClaim {ns}/{name} of the plan is not allocated"))
        }
        Some(_) => None,
    })
}

/// The still-gated pods of a plan and its groups' pod counts, for [`scheduler::remaining_fits`].
fn remaining_of(
    plan: &AdmissionPlan,
    now: &[PlannedPodNow],
    requirement: &StartRequirement,
    ns: &str,
    world: &World<'_>,
    dra: &Dra,
) -> (Vec<GatedPin>, BTreeMap<String, GroupCount>) {
    let mut pins = Vec::new();
    let mut groups: BTreeMap<String, GroupCount> = BTreeMap::new();
    let planned: HashSet<&str> = plan.pods.iter().map(|p| p.uid.as_str()).collect();
    for (planned_pod, pod_now) in plan.pods.iter().zip(now) {
        let count = groups.entry(pod_now.pod_group.clone()).or_default();
        count.min_count = requirement.min_count.get(&pod_now.pod_group).copied().unwrap_or(1);
        if !matches!(pod_now.state, PinState::Gone | PinState::Terminating) {
            count.existing += 1;
        }
        if pod_now.state != PinState::Gated {
            continue;
        }
        let Some(pod) = world.pods_by_uid.get(planned_pod.uid.as_str()) else { continue };
        pins.push(GatedPin {
            name: planned_pod.name.clone(),
            node: planned_pod.node.clone(),
            requests: pod.spec.as_ref().and_then(|s| scheduler::pod_requests(s).ok()).unwrap_or_default(),
            gpus: planned_pod.gpu_indices.as_deref().and_then(|v| parse_indices(v).ok()).unwrap_or_default(),
            own_gpus: dra
                .pod_gpus(pod)
                .filter(|(node, _)| *node == planned_pod.node)
                .map(|(_, g)| g)
                .unwrap_or_default(),
        });
    }
    // Pods of the planned groups started before this plan count toward their minCount too.
    for (group, count) in &mut groups {
        let others = world.by_group.get(&RootKey::leaf(ns, group)).into_iter().flatten().filter(|p| {
            let uid = p.metadata.uid.as_deref().unwrap_or_default();
            let class = PodClass::of(p);
            !planned.contains(uid) && !class.gated() && class.live()
        });
        count.existing += u32::try_from(others.count()).unwrap_or(u32::MAX);
    }
    (pins, groups)
}

/// A decided commit, ready to go out on a task of its own: everything it writes, owned.
pub(super) struct CommitJob {
    pub key: RootKey,
    /// The root's resourceVersion the decision was made on (fences the plan write).
    version: Option<String>,
    plan: AdmissionPlan,
    /// The planned pods as decided on, in plan order.
    pods: Vec<Arc<Pod>>,
    /// Shared claims to allocate before the first pod.
    shared: Vec<ClaimWrite>,
    /// Per planned pod, its own claims to allocate before its patch.
    own: Vec<Vec<ClaimWrite>>,
    /// The decision's message, for the status and the `Admitted` event.
    pub message: String,
}

impl CommitJob {
    /// The pods it pins, in plan order.
    pub(super) fn planned(&self) -> &[PlannedPod] {
        &self.plan.pods
    }
}

/// Gets a decided commit ready: the plan, the claims it names and every claim write are worked
/// out, then its pods are counted in the snapshot (resources and GPU indices), so the roots
/// decided after it in the same cycle see the capacity taken while its writes are in flight.
/// `Err` says why it cannot go out; nothing was written or counted then.
pub(super) fn prepare_commit(
    key: &RootKey,
    version: Option<String>,
    decision: &Decision,
    snapshot: &mut Snapshot,
    by_uid: &HashMap<&str, &Arc<Pod>>,
) -> std::result::Result<CommitJob, Committed> {
    let now = Timestamp::now();
    let mut plan = AdmissionPlan {
        id: format!("{}-{}", key.name, now.as_millisecond()),
        state: PlanState::Planned,
        created_at: Some(Time(now)),
        admitted_at: None,
        pods: decision.plan.iter().map(PlannedPod::from).collect(),
        shared_claims: Vec::new(),
    };
    let mut pods = Vec::with_capacity(plan.pods.len());
    // The pods' own GPU claims (made by the resource-claim controller) and the shared claims
    // to allocate are named in the plan, so a restart finds them.
    for p in &mut plan.pods {
        let Some(pod) = by_uid.get(p.uid.as_str()) else { return Err(Committed::Stale) };
        if p.gpu_indices.is_some() {
            p.claims = scheduler::own_claim_names(pod, snapshot.dra()).map_err(Committed::NotReady)?;
        }
        pods.push(Arc::clone(pod));
    }
    plan.shared_claims = decision.shared_claims.iter().map(|c| c.claim.name.clone()).collect();
    if let Some(why) = too_large(&plan) {
        return Err(Committed::TooLarge(why));
    }
    // Every claim write is worked out before anything is written.
    let planned: Vec<(&PlannedPod, &Pod)> = plan.pods.iter().zip(pods.iter().map(|p| &**p)).collect();
    let shared = scheduler::shared_writes(&key.ns, decision, &planned, snapshot.dra()).map_err(Committed::NotReady)?;
    let own = planned
        .iter()
        .map(|(p, _)| scheduler::own_writes(&key.ns, p, snapshot.dra()))
        .collect::<std::result::Result<Vec<_>, String>>()
        .map_err(Committed::NotReady)?;
    for (p, pod) in &planned {
        reserve(snapshot, pod, p);
    }
    Ok(CommitJob { key: key.clone(), version, plan, pods, shared, own, message: decision.message() })
}

impl Writer {
    /// The commit protocol: check every patch (dry run) and record the plan `Committing`, then
    /// pin/annotate/ungate each pod once. Every write is fenced: the plan writes by the
    /// group's resourceVersion the decision was made on, each pod patch by the pod's, so a
    /// stale cache or a second leader never writes over a newer state. It borrows nothing of
    /// the cycle: the commits of one cycle go out concurrently.
    pub(super) async fn commit(&self, job: &CommitJob) -> Result<Committed> {
        let key = &job.key;
        let mut plan = job.plan.clone();
        let planned: Vec<(&PlannedPod, &Pod)> = job.plan.pods.iter().zip(job.pods.iter().map(|p| &**p)).collect();
        // Every patch is tried first as a dry run (webhooks and policies judge it, nothing is
        // stored), so a refusal stops the gang before any of its pods is ungated. The plan is
        // recorded `Committing` at the same time, in one write (`Planned` and `Committing` are
        // resumed alike, see `scheduler::next_step`): a commit costs one round trip less, and a
        // refusal clears the plan again before anything else is written.
        let api = Api::<Pod>::namespaced(self.ctx.client.clone(), &key.ns);
        let requests: Vec<(String, String, serde_json::Value)> =
            planned.iter().map(|(p, pod)| (p.uid.clone(), p.name.clone(), pod_patch(pod, p))).collect();
        // No webhook or policy that could refuse a pin: the dry run is skipped (a pin refused
        // anyway rolls the attempt back, see `scheduler::pod_update_judges`).
        let requests = if self.judges.pins_judged() { requests } else { Vec::new() };
        let checks = futures::stream::iter(requests.into_iter().map(move |(uid, name, patch)| {
            let api = api.clone();
            async move {
                let params = PatchParams { dry_run: true, ..PatchParams::default() };
                (uid, bounded(api.patch(&name, &params, &Patch::Merge(&patch))).await.map(|_| ()))
            }
        }))
        .buffer_unordered(DRY_RUN_CONCURRENCY)
        .collect::<Vec<_>>();
        plan.state = PlanState::Committing;
        let (checks, recorded) = futures::join!(checks, self.write_plan(key, job.version.clone(), &plan));
        let mut refused = None;
        for (uid, result) in checks {
            match patched(result)? {
                Patched::Ok => {}
                Patched::Stale => refused = Some(Committed::Stale),
                Patched::Refused(message) => {
                    refused = Some(Committed::Refused(PatchRefused { uid, message }));
                    break;
                }
            }
        }
        let Some(version) = recorded? else { return Ok(refused.unwrap_or(Committed::Stale)) };
        if let Some(stop) = refused {
            // Nothing was ungated: the plan goes, the root is decided again (or backs off).
            self.clear_plan(key, Some(version), None).await?;
            return Ok(stop);
        }
        // Shared claims first (every pod needs them), then per pod its own claims and its
        // patch: a pod is ungated only once its devices are allocated to it. Pods without
        // claims of their own are patched concurrently (any subset of them patched is a plan
        // cut short, which the next cycle resumes), one at a time under the crash test hook,
        // so it stops after exactly its count.
        // A preemptor's pods were nominated to the nodes its preemption freed; one placed
        // elsewhere now is nominated to its new node first, so kube-scheduler does not count it
        // on the old one against a gang-mate's bind there.
        let moved: Vec<(String, Option<String>)> = planned
            .iter()
            .filter(|(p, pod)| {
                let nominated = pod.status.as_ref().and_then(|s| s.nominated_node_name.as_deref());
                nominated.is_some_and(|n| !n.is_empty() && n != p.node)
            })
            .map(|(p, _)| (p.name.clone(), Some(p.node.clone())))
            .collect();
        if !moved.is_empty() {
            write_nominations(&self.ctx.client, &key.ns, moved).await;
        }
        let first = planned.first().map(|(p, _)| p.uid.clone()).unwrap_or_default();
        if let Some(stopped) = self.write_claims(&key.ns, &job.shared, &first).await? {
            return Ok(stopped);
        }
        let (with_claims, without): (Vec<_>, Vec<_>) =
            planned.iter().zip(&job.own).partition(|(_, writes)| !writes.is_empty());
        for ((planned, pod), writes) in with_claims {
            if let Some(stopped) = self.write_claims(&key.ns, writes, &planned.uid).await? {
                return Ok(stopped);
            }
            if let Some(stopped) = stopped(planned, self.patch_pod(key, pod, planned).await)? {
                return Ok(stopped);
            }
        }
        let api = Api::<Pod>::namespaced(self.ctx.client.clone(), &key.ns);
        let pins: Vec<&PlannedPod> = without.into_iter().map(|((planned, _), _)| *planned).collect();
        // Owned requests: the stream's futures borrow nothing of the job.
        let requests: Vec<(usize, Option<(String, serde_json::Value)>)> = without_requests(&planned, &job.own);
        let mut results = futures::stream::iter(requests.into_iter().map(|(i, request)| {
            let api = api.clone();
            async move { (i, send_pod_patch(&api, request).await) }
        }))
        .buffer_unordered(self.concurrency(POD_PATCH_CONCURRENCY));
        let mut first_stop = None;
        while let Some((i, result)) = results.next().await {
            let planned = pins[i];
            // The first refusal (or stale pod) ends the commit; patches in flight finish.
            if let Some(s) = stopped(planned, self.pod_patch_done(key, planned, result))? {
                first_stop.get_or_insert(s);
            }
        }
        if let Some(stopped) = first_stop {
            return Ok(stopped);
        }
        // Not recorded `Admitted`: a `Committing` plan whose pods are all ungated went through
        // whole, and its binds are watched from its creation (`scheduler::next_step`).
        Ok(Committed::Done)
    }

    /// How many writes go out at once: `wanted`, or one under the crash test hook (so it
    /// exits after exactly its count).
    pub(super) fn concurrency(&self, wanted: usize) -> usize {
        if self.fault_exit_after.is_some() { 1 } else { wanted }
    }

    /// Carries out claim writes in order; `Some` ends the commit: a claim changed meanwhile
    /// (stale), or the API server refused a write (blamed on pod `uid`).
    async fn write_claims(&self, ns: &str, writes: &[ClaimWrite], uid: &str) -> Result<Option<Committed>> {
        for w in writes {
            match self.write_claim(ns, w).await? {
                Patched::Ok => {}
                Patched::Stale => return Ok(Some(Committed::Stale)),
                Patched::Refused(message) => {
                    let message = format!("ResourceClaim {}: {message}", w.name);
                    return Ok(Some(Committed::Refused(PatchRefused { uid: uid.to_string(), message })));
                }
            }
        }
        Ok(None)
    }

    /// Pins, annotates and ungates one pod in a single fenced patch.
    async fn patch_pod(&self, key: &RootKey, pod: &Pod, planned: &PlannedPod) -> Result<Patched> {
        let api = Api::<Pod>::namespaced(self.ctx.client.clone(), &key.ns);
        let request = is_gated(pod).then(|| (planned.name.clone(), pod_patch(pod, planned)));
        let result = send_pod_patch(&api, request).await;
        self.pod_patch_done(key, planned, result)
    }

    /// Books a planned pod's patch sent by [`send_pod_patch`]: the pod awaited in the cache,
    /// refusals logged and counted, the write counted for the crash test hook.
    fn pod_patch_done(&self, key: &RootKey, planned: &PlannedPod, result: Option<Result<()>>) -> Result<Patched> {
        let Some(result) = result else { return Ok(Patched::Stale) };
        let outcome = patched(result);
        match &outcome {
            Ok(Patched::Ok) => {
                self.unseen().ungated.insert(planned.uid.clone(), (key.clone(), planned.clone(), Instant::now()));
            }
            Ok(Patched::Stale) => {
                tracing::info!(pod = %planned.name, "planned pod changed or is gone since the decision");
            }
            Ok(Patched::Refused(m)) => {
                tracing::warn!(pod = %planned.name, error = %m, "the API server refused a planned pod's patch");
                self.ctx.metrics.object_errors.get_or_create(&object_labels("Pod", "refused")).inc();
            }
            Err(_) => {}
        }
        self.count_write();
        outcome
    }

    /// Writes a root's plan, fenced by the group's resourceVersion when given. Returns the
    /// group's new resourceVersion, `None` when the group is gone or changed since.
    pub(super) async fn write_plan(
        &self,
        key: &RootKey,
        version: Option<String>,
        plan: &AdmissionPlan,
    ) -> Result<Option<String>> {
        // A merge patch of status.plan alone: the rest of the status is written on its own.
        self.plan_patch(key, version, Some(plan), json!({"plan": plan})).await
    }

    /// Clears a root's plan, fenced like [`Self::write_plan`], with the root's status in the
    /// same patch when it changed too (`status`, see `scheduler::status::fold_body`).
    pub(super) async fn clear_plan(
        &self,
        key: &RootKey,
        version: Option<String>,
        status: Option<serde_json::Value>,
    ) -> Result<Option<String>> {
        let body = status.unwrap_or_else(|| json!({"plan": null}));
        self.plan_patch(key, version, None, body).await
    }

    /// Sends `body` as a merge patch of the root's status, recording the plan it leaves.
    async fn plan_patch(
        &self,
        key: &RootKey,
        version: Option<String>,
        plan: Option<&AdmissionPlan>,
        body: serde_json::Value,
    ) -> Result<Option<String>> {
        match self.merge_group_status(key, version, body).await? {
            Some(v) => {
                let want = plan.map(|p| (p.id.clone(), p.state));
                self.unseen().plans.insert(key.clone(), (want, Instant::now()));
                Ok(Some(v))
            }
            None => Ok(None),
        }
    }

    /// One merge patch of a root group's status subresource, fenced by `version` (the group's
    /// resourceVersion the decision was made on) when given. Returns the group's new
    /// resourceVersion, or `None` when it is gone (404) or changed since `version` (409).
    async fn merge_group_status(
        &self,
        key: &RootKey,
        version: Option<String>,
        status: serde_json::Value,
    ) -> Result<Option<String>> {
        let kind = if key.composite { "CompositePodGroup" } else { "PodGroup" };
        let mut body = json!({"apiVersion": "scheduling.muster.dev/v1alpha1", "kind": kind, "status": status});
        if let Some(v) = version {
            body["metadata"] = json!({"resourceVersion": v});
        }
        let params = PatchParams::default();
        let result = if key.composite {
            let api = Api::<CompositePodGroup>::namespaced(self.ctx.client.clone(), &key.ns);
            bounded(api.patch_status(&key.name, &params, &Patch::Merge(&body))).await.map(|g| g.resource_version())
        } else {
            let api = Api::<PodGroup>::namespaced(self.ctx.client.clone(), &key.ns);
            bounded(api.patch_status(&key.name, &params, &Patch::Merge(&body))).await.map(|g| g.resource_version())
        };
        match result {
            Ok(v) => Ok(Some(v.unwrap_or_default())),
            Err(Error::Kube(kube::Error::Api(e))) if e.code == 404 || e.code == 409 => {
                tracing::debug!(group = %key, error = %e.message, "group gone or changed since the decision");
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

/// The requests for the planned pods without claims of their own, by index among them: name
/// and patch, `None` for a pod no longer gated.
fn without_requests(
    planned: &[(&PlannedPod, &Pod)],
    own: &[Vec<ClaimWrite>],
) -> Vec<(usize, Option<(String, serde_json::Value)>)> {
    planned
        .iter()
        .zip(own)
        .filter(|(_, writes)| writes.is_empty())
        .enumerate()
        .map(|(i, ((planned, pod), _))| (i, is_gated(pod).then(|| (planned.name.clone(), pod_patch(pod, planned)))))
        .collect()
}

/// The patch that pins, annotates and ungates one pod: a merge patch fenced by the pod's UID
/// and resourceVersion as cached, so it applies only to the pod as decided on (still gated,
/// its GPU annotation not given meanwhile).
fn pod_patch(pod: &Pod, planned: &PlannedPod) -> serde_json::Value {
    let remaining: Vec<serde_json::Value> = pod
        .spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .map(|g| g.iter().filter(|g| g.name != ADMISSION_GATE).map(|g| json!({"name": g.name})).collect())
        .unwrap_or_default();
    // The hostname selector is the pin muster reads back; the node-name affinity beside it
    // lets kube-scheduler filter only that node (see `pods::node_name_pin`).
    let terms = crate::pods::node_name_pin(pod, &planned.node);
    let mut patch = json!({
        "metadata": {"uid": planned.uid, "resourceVersion": pod.metadata.resource_version},
        "spec": {
            "nodeSelector": {HOSTNAME_LABEL: planned.pin_hostname()},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}},
            "schedulingGates": remaining,
        },
    });
    if let Some(indices) = &planned.gpu_indices {
        patch["metadata"]["annotations"] = json!({GPU_INDICES_ANNOTATION: indices});
    }
    patch
}

/// What a planned pod's patch came to, for the commit: `Some` when it ends the commit.
fn stopped(planned: &PlannedPod, outcome: Result<Patched>) -> Result<Option<Committed>> {
    Ok(match outcome? {
        Patched::Ok => None,
        // The plan stays `Committing`: the next cycle resumes it, re-checked.
        Patched::Stale => Some(Committed::Stale),
        Patched::Refused(message) => Some(Committed::Refused(PatchRefused { uid: planned.uid.clone(), message })),
    })
}

impl Admitter {
    /// Books a commit that went through: the root's memory, the metrics, the `Admitted` event
    /// (sent in the background).
    pub(super) fn admitted(&mut self, job: &CommitJob) {
        let key = &job.key;
        // Its status waits for the binds: the plan's clear writes it then (see
        // `scheduler::status::PLAN_STATUS_HOLD`).
        let now = Instant::now();
        let pacing = self.status_pacing.entry(key.clone()).or_default();
        (pacing.written, pacing.hold) = (Some(now), Some(now + PLAN_STATUS_HOLD));
        let memory = self.roots.entry(key.clone()).or_default();
        memory.failures = 0;
        memory.next_attempt = None;
        memory.outcome = Some(Outcome::Admitted(job.message.clone()));
        memory.last_event = None;
        let conditions = if key.composite {
            let cpg = self.caches.composites.get(&kube::runtime::reflector::ObjectRef::new(&key.name).within(&key.ns));
            cpg.and_then(|g| g.status.as_ref().map(|s| s.conditions.clone())).unwrap_or_default()
        } else {
            let pg = self.caches.pod_groups.get(&kube::runtime::reflector::ObjectRef::new(&key.name).within(&key.ns));
            pg.and_then(|g| g.status.as_ref().map(|s| s.conditions.clone())).unwrap_or_default()
        };
        let created = job.pods.iter().filter_map(|p| p.metadata.creation_timestamp.as_ref().map(|t| t.0));
        if let Some(since) = wait_started(created, &conditions) {
            let waited = Timestamp::now().duration_since(since).as_secs_f64();
            self.ctx.metrics.admission_latency.observe(waited.max(0.0));
        }
        self.ctx.metrics.attempt(crate::controllers::metrics::AttemptResult::Admitted);
        self.ctx.metrics.gangs_admitted.inc();
        tracing::info!(namespace = %key.ns, root = %key.name, pods = job.plan.pods.len(), "admitted");
        let note = format!("admitted {} pod(s): {}", job.plan.pods.len(), job.message);
        self.root_event_detached(key, false, "Admitted", note);
    }

    /// Follows a recorded plan: gathers the plan's pods as they are now, asks the core's commit
    /// state machine for the next step and carries it out. Returns when to look again. A plan
    /// that has served its purpose is not cleared here but added to `done` (root, version), for
    /// [`Self::clear_plans`] to clear with the others at the end of the cycle, each with its
    /// status.
    pub(super) async fn follow_plan(
        &mut self,
        key: &RootKey,
        group: GroupRef<'_>,
        plan: &AdmissionPlan,
        world: &World<'_>,
        snapshot: &mut Snapshot,
        done: &mut Vec<(RootKey, Option<String>)>,
    ) -> Result<Option<Instant>> {
        let (ns, root) = (&key.ns, &key.name);
        let pods = pods_now(plan, root, world);
        let requirement = start_requirement(plan, ns, root, world.pod_groups);
        let cut_short = plan.state != PlanState::Admitted;
        let remaining_fits = if cut_short {
            let (pins, groups) = remaining_of(plan, &pods, &requirement, ns, world, snapshot.dra());
            match unallocated_shared(plan, ns, snapshot.dra()) {
                Some(why) => RemainingFits::No(why),
                None => scheduler::remaining_fits(snapshot, &pins, &groups),
            }
        } else {
            RemainingFits::Yes
        };
        let refused = self.roots.get(key).and_then(|m| m.refused.as_ref()).filter(|(id, _)| *id == plan.id);
        let refused = refused.map(|(_, r)| r.clone());
        let input = CommitInput {
            plan,
            pods: &pods,
            now: Timestamp::now(),
            bind_timeout: self.ctx.config.bind_timeout,
            requirement: &requirement,
            disruption: group.disruption(),
            remaining_fits,
            refused: refused.as_ref(),
        };
        let version = self.writer.unseen().fence(key, group.version());
        match scheduler::next_step(&input) {
            Step::Drop => {
                tracing::info!(namespace = %ns, root = %root, "dropping a plan no pod saw; planning afresh");
                // Its claims first: devices held for pods that did not start are freed.
                self.free_claims(ns, plan, world).await?;
                self.writer.clear_plan(key, version, None).await?;
                Ok(Some(Instant::now()))
            }
            Step::Patch(uids) => {
                match self.resume(key, version, plan, &uids, world, snapshot).await? {
                    Committed::Refused(r) => {
                        let memory = self.roots.entry(key.clone()).or_default();
                        memory.refused = Some((plan.id.clone(), r));
                    }
                    Committed::Done | Committed::Stale | Committed::TooLarge(_) | Committed::NotReady(_) => {}
                }
                Ok(Some(Instant::now()))
            }
            Step::WaitUntil(at) => {
                let left = at.duration_since(input.now).unsigned_abs();
                Ok(Some(Instant::now() + left + Duration::from_millis(200)))
            }
            Step::Done => {
                // Every pod bound (or gone): the plan has served its purpose.
                done.push((key.clone(), version));
                Ok(None)
            }
            Step::RollBack(rollback) => Ok(Some(self.roll_back(key, group, plan, rollback, world).await?)),
            Step::GangFailed { delete, failure } => {
                self.gang_failed(key, version, &delete, &failure, world).await?;
                Ok(Some(Instant::now()))
            }
        }
    }

    /// Clears the plans of roots whose pods are all bound (or gone), [`PLAN_CLEAR_CONCURRENCY`]
    /// at a time: a cycle after a burst of binds clears hundreds. Each clear writes its root's
    /// status too when that changed (one patch, see `scheduler::status::fold_body`). An error is that
    /// root's.
    pub(super) async fn clear_plans(&mut self, done: Vec<PlanClear>) -> Option<Instant> {
        let retry = self.book_clears().await;
        if done.is_empty() || self.clears.is_some() {
            // Roots cleared now are followed again (and cleared) once the batch in flight ends.
            return retry;
        }
        let (writer, signal) = (self.writer.clone(), self.signal.clone());
        let keys: HashSet<RootKey> = done.iter().map(|(key, _, _)| key.clone()).collect();
        // A status of theirs queued in a batch is not sent now (`Unseen::clearing`): it must
        // not count as sent.
        for key in &keys {
            self.status_sent.remove(key);
        }
        writer.unseen().clearing.extend(keys.iter().cloned());
        let task = Detached::spawn(async move {
            let clears: Vec<_> = done
                .into_iter()
                .map(|(key, version, status)| {
                    let writer = writer.clone();
                    async move {
                        let result = writer.clear_plan(&key, version, status).await;
                        writer.unseen().clearing.remove(&key);
                        (key, result.map(|_| ()))
                    }
                })
                .collect();
            let results = at_most(PLAN_CLEAR_CONCURRENCY, clears).await;
            signal.wake();
            results
        });
        self.clears = Some(super::Clears { keys, task });
        retry
    }

    /// Books the batch of plan clears that ended, if one did: a clear that failed is its root's
    /// error. Returns when to retry those.
    pub(super) async fn book_clears(&mut self) -> Option<Instant> {
        let mut batch = self.clears.take_if(|b| b.task.is_finished())?;
        // Each clear marks its root done on its own; a batch that ended without an answer
        // must not leave its roots marked.
        self.writer.unseen().clearing.retain(|k| !batch.keys.contains(k));
        let results = match batch.task.join().await {
            Ok(results) => results,
            Err(e) => {
                tracing::warn!(error = %e, "the plan clears ended without an answer");
                return None;
            }
        };
        let mut retry: Option<Instant> = None;
        for (key, result) in results {
            match result {
                // A clear is a write of the group's status: the status pace counts it.
                Ok(()) => {
                    // The hold ends: the clear wrote the status.
                    self.status_pacing.insert(key, StatusPacing { written: Some(Instant::now()), hold: None });
                }
                Err(e) => {
                    let at = self.root_error(&key, "clear its plan", &e).await;
                    retry = Some(retry.map_or(at, |r| r.min(at)));
                }
            }
        }
        retry
    }

    /// Resumes a commit cut short: patches the still-gated pods, then records the plan admitted.
    async fn resume(
        &mut self,
        key: &RootKey,
        version: Option<String>,
        plan: &AdmissionPlan,
        uids: &[String],
        world: &World<'_>,
        snapshot: &mut Snapshot,
    ) -> Result<Committed> {
        let (ns, root) = (&key.ns, &key.name);
        tracing::info!(namespace = %ns, root = %root, patches = uids.len(), total = plan.pods.len(), "resuming a commit cut short");
        for planned in plan.pods.iter().filter(|p| uids.contains(&p.uid)) {
            let Some(pod) = world.pods_by_uid.get(planned.uid.as_str()) else { continue };
            // Its own claims as planned (allocated already when the commit got that far).
            let writes = match scheduler::own_writes(ns, planned, snapshot.dra()) {
                Ok(w) => w,
                Err(message) => return Ok(Committed::Refused(PatchRefused { uid: planned.uid.clone(), message })),
            };
            if let Some(stopped) = self.writer.write_claims(ns, &writes, &planned.uid).await? {
                return Ok(stopped);
            }
            match self.writer.patch_pod(key, pod, planned).await? {
                // The snapshot saw it gated: count it before other roots are planned.
                Patched::Ok => reserve(snapshot, pod, planned),
                Patched::Stale => return Ok(Committed::Stale),
                Patched::Refused(message) => {
                    return Ok(Committed::Refused(PatchRefused { uid: planned.uid.clone(), message }));
                }
            }
        }
        let mut done = plan.clone();
        done.state = PlanState::Admitted;
        // The pods just ungated get the whole bind timeout, however long muster was down.
        done.admitted_at = Some(Time(Timestamp::now()));
        if self.writer.write_plan(key, version, &done).await?.is_none() {
            return Ok(Committed::Stale);
        }
        self.roots.entry(key.clone()).or_default().outcome =
            Some(Outcome::Admitted(format!("admitted {} pod(s) (commit resumed)", plan.pods.len())));
        Ok(Committed::Done)
    }

    /// Rolls a failed attempt back: records the rollback on the root (so the next plans avoid
    /// the nodes that failed), deletes every pod of the attempt (their controller recreates
    /// them gated; a rolled-back pod never counts as a failure), then clears the plan. Returns
    /// when to look again.
    async fn roll_back(
        &mut self,
        key: &RootKey,
        group: GroupRef<'_>,
        plan: &AdmissionPlan,
        rollback: RollBack,
        world: &World<'_>,
    ) -> Result<Instant> {
        let (ns, root) = (&key.ns, &key.name);
        let fallback = match rollback.failure.scheduler_message {
            Some(_) => None,
            None => self.scheduler_reason(ns, &rollback.failure.pod).await,
        };
        let failure = rollback.failure.message(fallback.as_deref());
        // The rollback is recorded first, so the pods' controller, woken by their deletion,
        // already sees the next attempt number; a plan is rolled back once, so a rollback
        // recorded since it was admitted is this one (a retry after a failed delete or a crash).
        let mut history = group.history();
        let since = plan.admitted_at.as_ref().or(plan.created_at.as_ref()).map(|t| t.0);
        let recorded = history.last.zip(since).is_some_and(|(last, since)| last >= since);
        let mut version = self.writer.unseen().fence(key, group.version());
        if !recorded {
            history.record(&rollback.avoid_nodes, Timestamp::now(), &ROLLBACK_POLICY);
            match self.writer.merge_group_status(key, version, history_status(&history)).await? {
                Some(v) => version = Some(v),
                // Changed since (or gone): decide again on the fresh state.
                None => return Ok(Instant::now() + Duration::from_millis(100)),
            }
            self.ctx.metrics.gang_rollbacks.inc();
            if matches!(rollback.failure.cause, FailureCause::BindTimeout(_)) {
                self.ctx.metrics.bind_timeouts.inc();
            }
        }
        // Then every pod of the attempt. A pod that could not be deleted keeps the plan, so the
        // next cycle rolls back what is left; only then is the plan cleared.
        let mut all_deleted = true;
        for uid in &rollback.delete {
            if let Some(pod) = world.pods_by_uid.get(uid.as_str()) {
                all_deleted &= self.delete_rolled_back(pod, &plan.id).await;
            }
        }
        if !all_deleted {
            return Ok(Instant::now() + MIN_BACKOFF);
        }
        self.writer.clear_plan(key, version, None).await?;
        let avoided = rollback.avoid_nodes.iter().cloned().collect::<Vec<_>>().join(", ");
        let avoid = if avoided.is_empty() { String::new() } else { format!("; the next plans avoid {avoided}") };
        let message = format!(
            "attempt {} rolled back, its {} pod(s) deleted to be recreated gated: {failure}{avoid}",
            history.count,
            rollback.delete.len()
        );
        tracing::warn!(namespace = %ns, root = %root, %message, "pin failed; rolling the attempt back");
        let memory = self.roots.entry(key.clone()).or_default();
        memory.refused = None;
        memory.outcome = Some(match history.retry_at(&ROLLBACK_POLICY) {
            Some(at) => Outcome::Unschedulable(
                format!("{} attempts rolled back in a row; retrying after {at}: {failure}", history.recent),
                "RollbackBackoff".into(),
            ),
            None => Outcome::RolledBack(message.clone()),
        });
        memory.last_event = None;
        if matches!(rollback.failure.cause, FailureCause::PatchRefused(_)) {
            // A refusal repeats until the policy or the pods change: back off like an error.
            memory.errors = memory.errors.saturating_add(1);
            memory.error_until = Some(Instant::now() + error_backoff(memory.errors));
        }
        self.root_event(key, true, "BindFailed", &message).await;
        Ok(Instant::now())
    }

    /// Marks a pod of a rolled-back attempt as such, then deletes it (both conditional on its
    /// UID). Returns false when it could not: the error is reported on the pod, and the rollback
    /// of the others goes on.
    async fn delete_rolled_back(&self, pod: &Pod, plan_id: &str) -> bool {
        let (Some(ns), Some(uid)) = (pod.namespace(), pod.metadata.uid.clone()) else { return true };
        let name = pod.name_any();
        let api = Api::<Pod>::namespaced(self.ctx.client.clone(), &ns);
        let mark = json!({"metadata": {"uid": uid, "annotations": {ROLLED_BACK_ANNOTATION: plan_id}}});
        let result = match api.patch(&name, &PatchParams::default(), &Patch::Merge(&mark)).await {
            Ok(_) => {
                let params = DeleteParams {
                    preconditions: Some(Preconditions { uid: Some(uid), resource_version: None }),
                    ..DeleteParams::background()
                };
                api.delete(&name, &params).await.map(|_| ())
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => true,
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {
                tracing::info!(pod = %name, error = %e.message, "rolled-back pod already gone or replaced");
                true
            }
            Err(e) => {
                let e = Error::from(e);
                tracing::warn!(pod = %name, error = %e, "could not delete a pod of a rolled-back attempt");
                self.ctx.metrics.object_errors.get_or_create(&object_labels("Pod", e.reason())).inc();
                let note = format!("muster could not delete this pod of a rolled-back gang attempt: {e}");
                self.ctx.event(&pod.object_ref(&()), true, "RollbackFailed", "Admit", note).await;
                false
            }
        }
    }

    /// A pin failed after the gang started whole: the bind watchdog's verdict, with disruption
    /// mode `all` replacing the gang (its controller recreates the pods, gated again).
    async fn gang_failed(
        &mut self,
        key: &RootKey,
        version: Option<String>,
        delete: &[String],
        failure: &PinFailure,
        world: &World<'_>,
    ) -> Result<()> {
        let (ns, root) = (&key.ns, &key.name);
        let why = match failure.scheduler_message {
            Some(_) => None,
            None => self.scheduler_reason(ns, &failure.pod).await,
        };
        let message = failure.message(why.as_deref());
        tracing::warn!(namespace = %ns, root = %root, %message, "bind timeout");
        self.ctx.metrics.bind_timeouts.inc();
        let api = Api::<Pod>::namespaced(self.ctx.client.clone(), ns);
        for pod in delete.iter().filter_map(|uid| world.pods_by_uid.get(uid.as_str())) {
            match api.delete(&pod.name_any(), &DeleteParams::background()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) => {
                    tracing::info!(pod = %pod.name_any(), error = %e.message, "could not delete a pod of a failed gang");
                }
                Err(e) => return Err(e.into()),
            }
        }
        self.writer.clear_plan(key, version, None).await?;
        let outcome_msg = if delete.is_empty() {
            message
        } else {
            format!("{message}; the gang's pods were deleted to be recreated together (disruptionMode all)")
        };
        self.roots.entry(key.clone()).or_default().outcome = Some(Outcome::BindFailed(outcome_msg.clone()));
        self.root_event(key, true, "BindTimeout", &outcome_msg).await;
        Ok(())
    }

    /// Gangs of a root in disruption mode `all` that lost pods after they started: their
    /// started pods are deleted (conditional on their UIDs) so the gang restarts whole, gated,
    /// instead of running (or waiting) partly started.
    pub(super) async fn disrupt(&mut self, key: &RootKey, gangs: &[Disrupted]) {
        let api = Api::<Pod>::namespaced(self.ctx.client.clone(), &key.ns);
        for gang in gangs {
            for (name, uid) in &gang.delete {
                let params = DeleteParams {
                    preconditions: Some(Preconditions { uid: Some(uid.clone()), resource_version: None }),
                    ..DeleteParams::background()
                };
                match api.delete(name, &params).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                    Err(e) => {
                        let e = Error::from(e);
                        tracing::warn!(pod = %name, error = %e, "could not delete a pod of a disrupted gang");
                        self.ctx.metrics.object_errors.get_or_create(&object_labels("Pod", e.reason())).inc();
                    }
                }
            }
            let message = match &gang.with {
                None => format!(
                    "gang {} lost pods after it started: {} of minCount {} left; disruptionMode all: its {} started \
                     pod(s) were deleted so the gang restarts whole",
                    gang.group,
                    gang.started,
                    gang.min_count,
                    gang.delete.len()
                ),
                Some(cause) => format!(
                    "group {} of the same set as gang {} (admitted as one); disruptionMode all: its {} started \
                     pod(s) were deleted so the set restarts whole",
                    gang.group,
                    cause,
                    gang.delete.len()
                ),
            };
            tracing::warn!(group = %key, %message, "gang disrupted");
            self.ctx.metrics.bind_timeouts.inc();
            self.roots.entry(key.clone()).or_default().outcome = Some(Outcome::BindFailed(message.clone()));
            self.root_event(key, true, "GangDisrupted", &message).await;
        }
    }

    /// The newest scheduler event explaining why a pod is not bound.
    async fn scheduler_reason(&self, ns: &str, pod: &str) -> Option<String> {
        let api = Api::<CoreEvent>::namespaced(self.ctx.client.clone(), ns);
        let lp = ListParams::default().fields(&format!("involvedObject.kind=Pod,involvedObject.name={pod}"));
        let events = api.list(&lp).await.ok()?;
        events
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("FailedScheduling"))
            .max_by_key(|e| e.last_timestamp.as_ref().map(|t| t.0.as_second()).unwrap_or(0))
            .and_then(|e| e.message)
    }
}

/// Dry runs in flight at once for one commit.
const DRY_RUN_CONCURRENCY: usize = 16;
/// How many plans of roots done are cleared at once.
const PLAN_CLEAR_CONCURRENCY: usize = 16;
/// How many pod patches of one commit are in flight at once.
const POD_PATCH_CONCURRENCY: usize = 16;

/// Sends a planned pod's patch (pin, GPU indices, gate removal): its name and body, `None`
/// when the pod is no longer gated (ungated by someone else since: its pin and GPU indices are
/// never overwritten), which comes back as `None`.
async fn send_pod_patch(api: &Api<Pod>, request: Option<(String, serde_json::Value)>) -> Option<Result<()>> {
    let (name, patch) = request?;
    Some(bounded(api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))).await.map(|_| ()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn pod(uid: &str, spec: serde_json::Value, status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": uid, "uid": uid}, "spec": spec, "status": status}))
            .expect("pod")
    }

    fn planned(uid: &str, group: &str, node: &str) -> PlannedPod {
        PlannedPod {
            name: uid.into(),
            uid: uid.into(),
            pod_group: group.into(),
            node: node.into(),
            ..Default::default()
        }
    }

    #[test]
    fn planned_pods_are_read_into_pin_states() {
        let c = |extra: serde_json::Value| {
            let mut spec = json!({"containers": [{"name": "c"}]});
            if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
                s.extend(e.clone());
            }
            spec
        };
        let refused = json!({"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "1 node(s) didn't match pod anti-affinity rules"}]});
        let pods = [
            pod("gated", c(json!({"schedulingGates": [{"name": ADMISSION_GATE}]})), json!({})),
            pod("refused", c(json!({})), refused),
            pod("bound", c(json!({"nodeName": "n2"})), json!({"phase": "Running"})),
            pod("done", c(json!({"nodeName": "n2"})), json!({"phase": "Succeeded"})),
        ];
        let world = World {
            pods_by_uid: pods.iter().map(|p| (p.metadata.uid.as_deref().unwrap_or_default(), p)).collect(),
            pod_groups: &[],
            by_group: &HashMap::new(),
            nodes: HashSet::from(["n1", "n2"]),
        };
        let plan = AdmissionPlan {
            id: "p".into(),
            state: PlanState::Admitted,
            created_at: None,
            admitted_at: None,
            pods: ["gated", "refused", "bound", "done", "gone"].iter().map(|u| planned(u, "", "n1")).collect(),
            shared_claims: Vec::new(),
        };
        let mut plan_on_lost_node = plan.clone();
        plan_on_lost_node.pods[0].node = "n9".into();
        let now = pods_now(&plan_on_lost_node, "root", &world);
        let states: Vec<&PinState> = now.iter().map(|p| &p.state).collect();
        let refusal = Refusal {
            reason: "Unschedulable".into(),
            message: "1 node(s) didn't match pod anti-affinity rules".into(),
        };
        assert_eq!(
            states,
            [
                &PinState::Gated,
                &PinState::Unbound { refusal: Some(refusal) },
                &PinState::Bound { node: "n2".into() },
                &PinState::Finished,
                &PinState::Gone,
            ]
        );
        assert!(now.iter().all(|p| p.pod_group == "root"), "a plan without group names is the root's");
        assert_eq!(now.iter().map(|p| p.node_exists).collect::<Vec<_>>(), [false, true, true, true, true]);
    }

    #[test]
    fn a_pod_patch_is_fenced_by_the_pod_as_decided_on() {
        let gated = serde_json::from_value::<Pod>(json!({
            "metadata": {"name": "p", "uid": "u1", "resourceVersion": "42"},
            "spec": {"containers": [{"name": "c"}], "schedulingGates": [{"name": ADMISSION_GATE}, {"name": "other"}]},
        }))
        .expect("pod");
        let planned = PlannedPod { gpu_indices: Some("2,3".into()), ..planned("u1", "g", "n1") };
        let patch = pod_patch(&gated, &planned);
        assert_eq!(patch["metadata"]["resourceVersion"], "42", "stale caches get a 409, not a write");
        assert_eq!(patch["metadata"]["uid"], "u1");
        assert_eq!(patch["spec"]["schedulingGates"], json!([{"name": "other"}]), "other gates stay");
        assert_eq!(patch["spec"]["nodeSelector"][HOSTNAME_LABEL], "n1", "an empty hostname is the node's name");
        assert_eq!(
            patch["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"],
            json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]),
            "kube-scheduler filters the pinned node alone"
        );
        assert_eq!(patch["metadata"]["annotations"][GPU_INDICES_ANNOTATION], "2,3");
    }

    #[test]
    fn a_plan_too_large_for_one_status_write_is_refused_before_any_write() {
        let pods = |n: usize| -> Vec<PlannedPod> {
            (0..n)
                .map(|i| PlannedPod {
                    name: format!("train-{i}-abcde"),
                    uid: format!("0b8f6a2e-3d1c-4f7a-9b2e-{i:012}"),
                    pod_group: "train".into(),
                    node: format!("gpu-node-{:04}", i / 8),
                    hostname: String::new(),
                    gpu_indices: Some((i % 8).to_string()),
                    claims: Vec::new(),
                })
                .collect()
        };
        let plan = |n| AdmissionPlan {
            id: "train-1".into(),
            state: PlanState::Planned,
            created_at: None,
            admitted_at: None,
            pods: pods(n),
            shared_claims: Vec::new(),
        };
        assert_eq!(too_large(&plan(4_000)), None, "4,000 pods fit one write");
        let why = too_large(&plan(20_000)).expect("20,000 pods do not");
        assert!(why.contains("the plan of 20000 pods takes") && why.contains("split the gang"), "{why}");
    }

    #[test]
    fn patch_answers_are_read_as_stale_retry_or_refusal() {
        let api = |code: u16| {
            Err(kube::Error::Api(
                kube::core::Status::failure(&format!("answer {code}"), "Reason").with_code(code).boxed(),
            ))
        };
        let read = |r: kube::Result<()>| match patched(r.map_err(Error::Kube)) {
            Ok(Patched::Ok) => "ok".to_string(),
            Ok(Patched::Stale) => "stale".to_string(),
            Ok(Patched::Refused(m)) => format!("refused: {m}"),
            Err(e) => format!("retry: {}", e.reason()),
        };
        assert_eq!(read(Ok(())), "ok");
        assert_eq!(read(api(404)), "stale");
        assert_eq!(read(api(409)), "stale");
        assert_eq!(read(api(403)), "refused: answer 403");
        assert_eq!(read(api(400)), "refused: answer 400");
        assert_eq!(read(api(422)), "refused: answer 422");
        assert_eq!(read(api(500)), "retry: server_error");
        assert_eq!(read(api(429)), "retry: too_many_requests");
    }

    #[test]
    fn the_start_requirement_is_each_planned_groups_min_count() {
        let pg = |name: &str, min: Option<i32>| -> PodGroup {
            let policy = match min {
                Some(m) => json!({"gang": {"minCount": m}}),
                None => json!({"basic": {}}),
            };
            serde_json::from_value(json!({
                "apiVersion": "scheduling.muster.dev/v1alpha1", "kind": "PodGroup",
                "metadata": {"name": name, "namespace": "ns"},
                "spec": {"schedulingPolicy": policy},
            }))
            .expect("pod group")
        };
        let groups = [pg("a", Some(3)), pg("b", None)].map(Arc::new);
        let plan = AdmissionPlan {
            id: "p".into(),
            state: PlanState::Admitted,
            created_at: None,
            admitted_at: None,
            pods: vec![planned("1", "a", "n"), planned("2", "b", "n"), planned("3", "unknown", "n")],
            shared_claims: Vec::new(),
        };
        let r = start_requirement(&plan, "ns", "root", &groups);
        let want = BTreeMap::from([("a".to_string(), 3), ("b".to_string(), 1), ("unknown".to_string(), 1)]);
        assert_eq!(r.min_count, want);
        assert_eq!(start_requirement(&plan, "other", "root", &groups).min_count.get("a"), Some(&1));
    }

    #[test]
    fn the_rollback_history_round_trips_through_the_status() {
        let mut h = RollbackHistory::default();
        let t = Timestamp::from_second(1_000_000).expect("ts");
        h.record(&["n1".to_string()].into(), t, &ROLLBACK_POLICY);
        let patch = history_status(&h);
        let status: crate::crds::scheduling::PodGroupStatus = serde_json::from_value(patch).expect("status");
        assert_eq!((status.rollbacks, status.recent_rollbacks), (1, 1));
        let back = history_of(
            status.rollbacks,
            status.recent_rollbacks,
            status.last_rollback_time.as_ref(),
            &status.avoid_nodes,
        );
        assert_eq!(back, h);
    }
}

//! The commit protocol, carried out: record a plan, patch each pod once (pin, GPU indices,
//! gate removal), then follow the recorded plan. What to do with a recorded plan (resume, wait
//! for binds, roll a failed attempt back, fail a gang that started) is the core's
//! [`scheduler::next_step`]; this file gathers its inputs and carries the step out.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event as CoreEvent, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::status::Outcome;
use super::{Admitter, FAULT_EXIT_ENV, GroupRef, MIN_BACKOFF, RootKey, World, bound, finished, is_gated, key_of};
use crate::controllers::context::Result;
use crate::crds::blocks::DisruptionModeKind;
use crate::crds::scheduling::{AdmissionPlan, AvoidedNode, CompositePodGroup, PlanState, PlannedPod, PodGroup};
use crate::crds::{ADMISSION_GATE, GPU_INDICES_ANNOTATION, HOSTNAME_LABEL, ROLLED_BACK_ANNOTATION};
use crate::devices::parse_indices;
use crate::scheduler::{
    self, CommitInput, Decision, FailureCause, Group, GroupTree, PinFailure, PinState, PlannedPodNow, Refusal,
    RemainingFits, RollBack, RollbackHistory, RollbackPolicy, Snapshot, StartRequirement, Step,
};

/// Counts a pod just pinned by `planned` in the snapshot (resources and GPU indices), so the
/// roots planned later in the same cycle see the capacity taken.
fn reserve(snapshot: &mut Snapshot, pod: &Pod, planned: &PlannedPod) {
    let mut admitted = pod.clone();
    if let Some(spec) = admitted.spec.as_mut() {
        spec.node_selector.get_or_insert_with(BTreeMap::new).insert(HOSTNAME_LABEL.into(), planned.hostname.clone());
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
    if pod.metadata.deletion_timestamp.is_some() {
        PinState::Terminating
    } else if finished(pod) {
        PinState::Finished
    } else if bound(pod) {
        PinState::Bound { node: pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default() }
    } else if is_gated(pod) {
        PinState::Gated
    } else {
        PinState::Unbound { refusal: refusal(pod) }
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
fn start_requirement(plan: &AdmissionPlan, ns: &str, root: &str, pod_groups: &[PodGroup]) -> StartRequirement {
    let mut min_count = BTreeMap::new();
    for planned in &plan.pods {
        let group = if planned.pod_group.is_empty() { root } else { planned.pod_group.as_str() };
        let min = pod_groups
            .iter()
            .find(|pg| pg.namespace().as_deref() == Some(ns) && pg.name_any() == group)
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
    pub(super) fn is_composite(&self) -> bool {
        matches!(self, GroupRef::Composite(_))
    }

    /// The root's disruption mode (`single` unless `all` is set).
    fn disruption(&self) -> DisruptionModeKind {
        let mode = match self {
            GroupRef::Leaf(pg) => &pg.spec.disruption_mode,
            GroupRef::Composite(c) => &c.spec.disruption_mode,
        };
        mode.kind().unwrap_or(DisruptionModeKind::Single)
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

impl Admitter {
    /// The commit protocol: record the plan, pin/annotate/ungate each pod once, mark admitted.
    pub(super) async fn commit(
        &mut self,
        tree: &GroupTree,
        decision: &Decision,
        snapshot: &mut Snapshot,
        pods: &[Pod],
    ) -> Result<()> {
        let ns = tree.namespace.clone();
        let composite = matches!(tree.root, Group::Composite(_));
        let root = tree.root.name().to_string();
        let now = Timestamp::now();
        let mut plan = AdmissionPlan {
            id: format!("{root}-{}", now.as_millisecond()),
            state: PlanState::Planned,
            created_at: Some(Time(now)),
            admitted_at: None,
            pods: decision.plan.iter().map(PlannedPod::from).collect(),
        };
        if !self.write_plan(&ns, &root, composite, Some(&plan)).await? {
            return Ok(()); // the group was deleted meanwhile: nothing to admit
        }
        plan.state = PlanState::Committing;
        self.write_plan(&ns, &root, composite, Some(&plan)).await?;
        let by_uid: HashMap<&str, &Pod> =
            pods.iter().filter_map(|p| p.metadata.uid.as_deref().map(|u| (u, p))).collect();
        for planned in &plan.pods {
            let Some(pod) = by_uid.get(planned.uid.as_str()) else { continue };
            self.patch_pod(&ns, pod, planned).await?;
            reserve(snapshot, pod, planned);
        }
        plan.state = PlanState::Admitted;
        plan.admitted_at = Some(Time(Timestamp::now()));
        self.write_plan(&ns, &root, composite, Some(&plan)).await?;
        let message = decision.message();
        let key = key_of(&ns, &root);
        let memory = self.roots.entry(key).or_default();
        memory.failures = 0;
        memory.next_attempt = None;
        memory.outcome = Some(Outcome::Admitted(message.clone()));
        memory.last_event = None;
        if let Some(since) = memory.quorate_since.take() {
            self.ctx.metrics.admission_latency.observe(since.elapsed().as_secs_f64());
        }
        self.ctx.metrics.gangs_admitted.inc();
        tracing::info!(namespace = %ns, root = %root, pods = plan.pods.len(), "admitted");
        self.group_event(tree, false, "Admitted", &format!("admitted {} pod(s): {message}", plan.pods.len())).await;
        Ok(())
    }

    /// Pins, annotates and ungates one pod in a single idempotent patch.
    async fn patch_pod(&mut self, ns: &str, pod: &Pod, planned: &PlannedPod) -> Result<()> {
        let remaining: Vec<serde_json::Value> = pod
            .spec
            .as_ref()
            .and_then(|s| s.scheduling_gates.as_ref())
            .map(|g| g.iter().filter(|g| g.name != ADMISSION_GATE).map(|g| json!({"name": g.name})).collect())
            .unwrap_or_default();
        let mut patch = json!({
            "metadata": {"uid": planned.uid},
            "spec": {"nodeSelector": {HOSTNAME_LABEL: planned.hostname}, "schedulingGates": remaining},
        });
        if let Some(indices) = &planned.gpu_indices {
            patch["metadata"]["annotations"] = json!({GPU_INDICES_ANNOTATION: indices});
        }
        let api = Api::<Pod>::namespaced(self.ctx.client.clone(), ns);
        match api.patch(&planned.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {
                self.unseen.ungated.insert(planned.uid.clone(), Instant::now());
            }
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 || e.code == 422 => {
                tracing::info!(pod = %planned.name, error = %e.message, "planned pod changed or is gone; skipped");
            }
            Err(e) => return Err(e.into()),
        }
        self.patches += 1;
        if self.fault_exit_after.is_some_and(|n| self.patches >= n) {
            tracing::error!(patches = self.patches, "{FAULT_EXIT_ENV} reached: exiting now (test hook)");
            std::process::exit(3);
        }
        Ok(())
    }

    /// Writes (or clears) a root's plan. Returns false when the group is gone.
    async fn write_plan(
        &mut self,
        ns: &str,
        name: &str,
        composite: bool,
        plan: Option<&AdmissionPlan>,
    ) -> Result<bool> {
        // A merge patch of status.plan alone: the rest of the status is written on its own.
        let result = self.merge_group_status(ns, name, composite, json!({"plan": plan})).await;
        match result {
            Ok(()) => {
                let want = plan.map(|p| (p.id.clone(), p.state));
                self.unseen.plans.insert(key_of(ns, name), (want, Instant::now()));
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Follows a recorded plan: gathers the plan's pods as they are now, asks the core's commit
    /// state machine for the next step and carries it out. Returns when to look again.
    pub(super) async fn follow_plan(
        &mut self,
        key: &RootKey,
        group: GroupRef<'_>,
        plan: &AdmissionPlan,
        world: &World<'_>,
        snapshot: &mut Snapshot,
    ) -> Result<Option<Instant>> {
        let (ns, root) = (&key.0, &key.1);
        let pods = pods_now(plan, root, world);
        let requirement = start_requirement(plan, ns, root, world.pod_groups);
        let input = CommitInput {
            plan,
            pods: &pods,
            now: Timestamp::now(),
            bind_timeout: self.ctx.config.bind_timeout,
            requirement: &requirement,
            disruption: group.disruption(),
            // Re-validating what is left of a plan against the rebuilt ledger is issue 15.
            remaining_fits: RemainingFits::Yes,
        };
        match scheduler::next_step(&input) {
            Step::Drop => {
                tracing::info!(namespace = %ns, root = %root, "dropping a plan no pod saw; planning afresh");
                self.write_plan(ns, root, group.is_composite(), None).await?;
                Ok(Some(Instant::now()))
            }
            Step::Patch(uids) => {
                self.resume(key, group, plan, &uids, world, snapshot).await?;
                Ok(Some(Instant::now()))
            }
            Step::WaitUntil(at) => {
                let left = at.duration_since(input.now).unsigned_abs();
                Ok(Some(Instant::now() + left + Duration::from_millis(200)))
            }
            Step::Done => {
                // Every pod bound (or gone): the plan has served its purpose.
                self.write_plan(ns, root, group.is_composite(), None).await?;
                Ok(None)
            }
            Step::RollBack(rollback) => Ok(Some(self.roll_back(key, group, plan, rollback, world).await?)),
            Step::GangFailed { delete, failure } => {
                self.gang_failed(key, group, &delete, &failure, world).await?;
                Ok(Some(Instant::now()))
            }
        }
    }

    /// Resumes a commit cut short: patches the still-gated pods, then records the plan admitted.
    async fn resume(
        &mut self,
        key: &RootKey,
        group: GroupRef<'_>,
        plan: &AdmissionPlan,
        uids: &[String],
        world: &World<'_>,
        snapshot: &mut Snapshot,
    ) -> Result<()> {
        let (ns, root) = (&key.0, &key.1);
        tracing::info!(namespace = %ns, root = %root, patches = uids.len(), total = plan.pods.len(), "resuming a commit cut short");
        for planned in plan.pods.iter().filter(|p| uids.contains(&p.uid)) {
            let Some(pod) = world.pods_by_uid.get(planned.uid.as_str()) else { continue };
            self.patch_pod(ns, pod, planned).await?;
            // The snapshot saw it gated: count it before other roots are planned.
            reserve(snapshot, pod, planned);
        }
        let mut done = plan.clone();
        done.state = PlanState::Admitted;
        // The pods just ungated get the whole bind timeout, however long muster was down.
        done.admitted_at = Some(Time(Timestamp::now()));
        self.write_plan(ns, root, group.is_composite(), Some(&done)).await?;
        self.roots.entry(key.clone()).or_default().outcome =
            Some(Outcome::Admitted(format!("admitted {} pod(s) (commit resumed)", plan.pods.len())));
        Ok(())
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
        let (ns, root) = (&key.0, &key.1);
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
        if !recorded {
            history.record(&rollback.avoid_nodes, Timestamp::now(), &ROLLBACK_POLICY);
            self.patch_group_status(ns, root, group.is_composite(), history_status(&history)).await?;
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
        self.write_plan(ns, root, group.is_composite(), None).await?;
        let avoided = rollback.avoid_nodes.iter().cloned().collect::<Vec<_>>().join(", ");
        let message = format!(
            "attempt {} rolled back, its {} pod(s) deleted to be recreated gated: {failure}; the next plans avoid {avoided}",
            history.count,
            rollback.delete.len()
        );
        tracing::warn!(namespace = %ns, root = %root, %message, "pin failed; rolling the attempt back");
        let memory = self.roots.entry(key.clone()).or_default();
        memory.outcome = Some(match history.retry_at(&ROLLBACK_POLICY) {
            Some(at) => Outcome::Unschedulable(format!(
                "{} attempts rolled back in a row; retrying after {at}: {failure}",
                history.recent
            )),
            None => Outcome::RolledBack(message.clone()),
        });
        memory.last_event = None;
        for r in self.root_refs(ns, root, group.is_composite()) {
            self.ctx.event(&r, true, "BindFailed", "Admit", message.clone()).await;
        }
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
                tracing::warn!(pod = %name, error = %e, "could not delete a pod of a rolled-back attempt");
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
        group: GroupRef<'_>,
        delete: &[String],
        failure: &PinFailure,
        world: &World<'_>,
    ) -> Result<()> {
        let (ns, root) = (&key.0, &key.1);
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
        self.write_plan(ns, root, group.is_composite(), None).await?;
        let outcome_msg = if delete.is_empty() {
            message
        } else {
            format!("{message}; the gang's pods were deleted to be recreated together (disruptionMode all)")
        };
        self.roots.entry(key.clone()).or_default().outcome = Some(Outcome::BindFailed(outcome_msg.clone()));
        for r in self.root_refs(ns, root, group.is_composite()) {
            self.ctx.event(&r, true, "BindTimeout", "Admit", outcome_msg.clone()).await;
        }
        Ok(())
    }

    /// A merge patch of the given status fields of a root group (404: the group is gone).
    async fn patch_group_status(&self, ns: &str, name: &str, composite: bool, status: serde_json::Value) -> Result<()> {
        let result = self.merge_group_status(ns, name, composite, status).await;
        match result {
            Ok(()) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// One merge patch of a root group's status subresource, as the apiserver answered it.
    async fn merge_group_status(
        &self,
        ns: &str,
        name: &str,
        composite: bool,
        status: serde_json::Value,
    ) -> kube::Result<()> {
        let kind = if composite { "CompositePodGroup" } else { "PodGroup" };
        let body = json!({"apiVersion": "scheduling.muster.dev/v1alpha1", "kind": kind, "status": status});
        let params = PatchParams::default();
        if composite {
            Api::<CompositePodGroup>::namespaced(self.ctx.client.clone(), ns)
                .patch_status(name, &params, &Patch::Merge(&body))
                .await
                .map(|_| ())
        } else {
            Api::<PodGroup>::namespaced(self.ctx.client.clone(), ns)
                .patch_status(name, &params, &Patch::Merge(&body))
                .await
                .map(|_| ())
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
            nodes: HashSet::from(["n1", "n2"]),
        };
        let plan = AdmissionPlan {
            id: "p".into(),
            state: PlanState::Admitted,
            created_at: None,
            admitted_at: None,
            pods: ["gated", "refused", "bound", "done", "gone"].iter().map(|u| planned(u, "", "n1")).collect(),
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
        let groups = [pg("a", Some(3)), pg("b", None)];
        let plan = AdmissionPlan {
            id: "p".into(),
            state: PlanState::Admitted,
            created_at: None,
            admitted_at: None,
            pods: vec![planned("1", "a", "n"), planned("2", "b", "n"), planned("3", "unknown", "n")],
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

//! What a failed pin comes to: a failed attempt rolled back (recorded, its pods deleted to be
//! recreated gated), a gang that started failed at its bind timeout, and a gang in disruption
//! mode `all` that lost pods restarted whole.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event as CoreEvent, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::history::{ROLLBACK_POLICY, history_status};
use crate::controllers::admission::report::object_labels;
use crate::controllers::admission::{Admitter, GroupRef, MIN_BACKOFF, RootKey, World, error_backoff};
use crate::controllers::context::{Error, Result};
use crate::crds::ROLLED_BACK_ANNOTATION;
use crate::crds::scheduling::AdmissionPlan;
use crate::scheduler::status::Outcome;
use crate::scheduler::status::reason;
use crate::scheduler::{Disrupted, FailureCause, PinFailure, RollBack};

impl Admitter {
    /// Rolls a failed attempt back: records the rollback on the root (so the next plans avoid
    /// the nodes that failed), deletes every pod of the attempt (their controller recreates
    /// them gated; a rolled-back pod never counts as a failure), then clears the plan. Returns
    /// when to look again.
    pub(super) async fn roll_back(
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
            match self.writer.merge_group_status(key, version, history_status(&history), None).await? {
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
        self.writer.clear_plan(key, version, None, None).await?;
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
        self.root_event(key, true, reason::BIND_FAILED, &message);
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
        let result = match api.patch_metadata(&name, &PatchParams::default(), &Patch::Merge(&mark)).await {
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
                self.ctx.event(&pod.object_ref(&()), true, "RollbackFailed", "Admit", note);
                false
            }
        }
    }

    /// A pin failed after the gang started whole: the bind watchdog's verdict, with disruption
    /// mode `all` replacing the gang (its controller recreates the pods, gated again).
    pub(super) async fn gang_failed(
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
        self.writer.clear_plan(key, version, None, None).await?;
        let outcome_msg = if delete.is_empty() {
            message
        } else {
            format!("{message}; the gang's pods were deleted to be recreated together (disruptionMode all)")
        };
        self.roots.entry(key.clone()).or_default().outcome = Some(Outcome::BindFailed(outcome_msg.clone()));
        self.root_event(key, true, reason::BIND_TIMEOUT, &outcome_msg);
        Ok(())
    }

    /// Gangs of a root in disruption mode `all` that lost pods after they started: their
    /// started pods are deleted (conditional on their UIDs) so the gang restarts whole, gated,
    /// instead of running (or waiting) partly started.
    pub(in crate::controllers::admission) async fn disrupt(&mut self, key: &RootKey, gangs: &[Disrupted]) {
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
            self.ctx.metrics.gang_disruptions.inc();
            self.roots.entry(key.clone()).or_default().outcome = Some(Outcome::BindFailed(message.clone()));
            self.root_event(key, true, "GangDisrupted", &message);
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

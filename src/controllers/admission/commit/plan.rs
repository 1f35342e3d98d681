//! The plan record in a root group's status: writing and clearing it (fenced by the group's
//! resourceVersion), the size one status write may carry, and the batched clears of the plans
//! of roots whose pods are all bound.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::controllers::admission::{Admitter, Clears, PlanClear, RootKey, Writer};
use crate::controllers::context::{Detached, Error, Result, at_most, bounded};
use crate::controllers::lean_writes;
use crate::crds::scheduling::{AdmissionPlan, CompositePodGroup, PodGroup, PodGroupStatus};
use crate::scheduler::status::{StatusPacing, plan_body, status_replacement};

/// A leaf root's status as cached, and as computed with its plan in flight (admitted).
pub(in crate::controllers::admission) type AdmittedStatus = (Option<PodGroupStatus>, PodGroupStatus);

/// A root group as cached (its `managedFields` dropped). A status write fenced by the version it
/// is cached at replaces the status with an update of the whole object instead of a merge patch
/// (see `scheduler::status::status_replacement`): the same status, at less cost to the API server.
#[derive(Clone, Debug)]
pub(in crate::controllers::admission) enum Cached {
    Leaf(Arc<PodGroup>),
    Composite(Arc<CompositePodGroup>),
}

impl Cached {
    /// The whole object to send in place of `patch` (a merge patch of its status) fenced by
    /// `version`, when it is cached at that version.
    fn replacement(&self, version: Option<&str>, patch: &serde_json::Value) -> Option<serde_json::Value> {
        let (cached, whole) = match self {
            Cached::Leaf(g) => (g.resource_version(), serde_json::to_value(&**g)),
            Cached::Composite(g) => (g.resource_version(), serde_json::to_value(&**g)),
        };
        // Serialized only when the write can use it.
        if version.is_none() || cached.as_deref() != version {
            return None;
        }
        status_replacement(&whole.ok()?, version, patch)
    }
}

/// The largest plan one status write may carry: the API server refuses requests over 3 MiB and
/// etcd values over 1.5 MiB; the rest of the status needs room too.
const MAX_PLAN_BYTES: usize = 1024 * 1024;

/// Why a plan cannot be recorded in one status write, if it cannot.
pub(super) fn too_large(plan: &AdmissionPlan) -> Option<String> {
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

/// Writes a group's status: `whole` replacing it when given (and RBAC lets muster update
/// statuses), else `patch` as a merge patch. Returns the group's new resourceVersion.
async fn write_status<K>(
    api: &Api<K>,
    name: &str,
    patch: &serde_json::Value,
    whole: Option<&serde_json::Value>,
    forbidden: &std::sync::atomic::AtomicBool,
) -> Result<Option<String>>
where
    K: kube::Resource + serde::de::DeserializeOwned + Clone + std::fmt::Debug,
{
    if let Some(whole) = whole
        && let Some(written) = bounded(lean_writes::replace_status(api, name, whole, forbidden)).await?
    {
        return Ok(written.resource_version());
    }
    let written = bounded(lean_writes::patch_status(api, name, &PatchParams::default(), &Patch::Merge(patch))).await?;
    Ok(written.resource_version())
}

/// How many plans of roots done are cleared at once.
const PLAN_CLEAR_CONCURRENCY: usize = 16;

impl Writer {
    /// Writes a root's plan, fenced by the group's resourceVersion when given. Returns the
    /// group's new resourceVersion, `None` when the group is gone or changed since.
    /// `admitted`: the root's status as cached and as computed with this plan in flight,
    /// written in the same patch (see `scheduler::status::plan_body`); `None`: status.plan
    /// alone, the rest of the status is written on its own. `cached`: the group as cached, for
    /// a write that replaces the status (see [`Cached`]).
    pub(super) async fn write_plan(
        &self,
        key: &RootKey,
        version: Option<String>,
        plan: &AdmissionPlan,
        admitted: Option<&AdmittedStatus>,
        cached: Option<&Cached>,
    ) -> Result<Option<String>> {
        let body = match admitted {
            Some((old, new)) => plan_body(old.as_ref(), new, plan),
            None => json!({"plan": plan}),
        };
        self.plan_patch(key, version, Some(plan), body, cached).await
    }

    /// Clears a root's plan, fenced like [`Self::write_plan`], with the root's status in the
    /// same patch when it changed too (`status`, see `scheduler::status::fold_body`).
    pub(super) async fn clear_plan(
        &self,
        key: &RootKey,
        version: Option<String>,
        status: Option<serde_json::Value>,
        cached: Option<&Cached>,
    ) -> Result<Option<String>> {
        let body = status.unwrap_or_else(|| json!({"plan": null}));
        self.plan_patch(key, version, None, body, cached).await
    }

    /// Sends `body` as a merge patch of the root's status, recording the plan it leaves.
    async fn plan_patch(
        &self,
        key: &RootKey,
        version: Option<String>,
        plan: Option<&AdmissionPlan>,
        body: serde_json::Value,
        cached: Option<&Cached>,
    ) -> Result<Option<String>> {
        match self.merge_group_status(key, version, body, cached).await? {
            Some(v) => {
                let want = plan.map(|p| (p.id.clone(), p.state));
                self.unseen().plans.insert(key.clone(), (want, Instant::now()));
                Ok(Some(v))
            }
            None => Ok(None),
        }
    }

    /// One merge patch of a root group's status subresource, fenced by `version` (the group's
    /// resourceVersion the decision was made on) when given, or the same status written as an
    /// update of the whole group when `cached` is at `version` (see [`Cached`]). Returns the
    /// group's new resourceVersion, or `None` when it is gone (404) or changed since `version`
    /// (409).
    pub(super) async fn merge_group_status(
        &self,
        key: &RootKey,
        version: Option<String>,
        status: serde_json::Value,
        cached: Option<&Cached>,
    ) -> Result<Option<String>> {
        let kind = if key.composite { "CompositePodGroup" } else { "PodGroup" };
        let replacement = cached.and_then(|c| c.replacement(version.as_deref(), &status));
        let mut body = json!({"apiVersion": "scheduling.muster.dev/v1alpha1", "kind": kind, "status": status});
        if let Some(v) = version {
            body["metadata"] = json!({"resourceVersion": v});
        }
        let result = if key.composite {
            let api = Api::<CompositePodGroup>::namespaced(self.ctx.client.clone(), &key.ns);
            write_status(&api, &key.name, &body, replacement.as_ref(), &self.ctx.status_updates_forbidden).await
        } else {
            let api = Api::<PodGroup>::namespaced(self.ctx.client.clone(), &key.ns);
            write_status(&api, &key.name, &body, replacement.as_ref(), &self.ctx.status_updates_forbidden).await
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

impl Admitter {
    /// Clears the plans of roots whose pods are all bound (or gone), [`PLAN_CLEAR_CONCURRENCY`]
    /// at a time: a cycle after a burst of binds clears hundreds. Each clear writes its root's
    /// status too when that changed (one patch, see `scheduler::status::fold_body`). An error is that
    /// root's.
    pub(in crate::controllers::admission) async fn clear_plans(&mut self, done: Vec<PlanClear>) -> Option<Instant> {
        let retry = self.book_clears().await;
        if done.is_empty() || self.clears.is_some() {
            // Roots cleared now are followed again (and cleared) once the batch in flight ends.
            return retry;
        }
        let (writer, signal) = (self.writer.clone(), self.signal.clone());
        let keys: HashSet<RootKey> = done.iter().map(|(key, ..)| key.clone()).collect();
        // A status of theirs queued in a batch is not sent now (`Unseen::clearing`): it must
        // not count as sent.
        for key in &keys {
            self.status_sent.remove(key);
        }
        writer.unseen().clearing.extend(keys.iter().cloned());
        let task = Detached::spawn(async move {
            let clears: Vec<_> = done
                .into_iter()
                .map(|(key, version, status, cached)| {
                    let writer = writer.clone();
                    async move {
                        let result = writer.clear_plan(&key, version, status, cached.as_ref()).await;
                        writer.unseen().clearing.remove(&key);
                        (key, result.map(|_| ()))
                    }
                })
                .collect();
            let results = at_most(PLAN_CLEAR_CONCURRENCY, clears).await;
            signal.wake();
            results
        });
        self.clears = Some(Clears { keys, task });
        retry
    }

    /// Books the batch of plan clears that ended, if one did: a clear that failed is its root's
    /// error. Returns when to retry those.
    pub(in crate::controllers::admission) async fn book_clears(&mut self) -> Option<Instant> {
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
                    let at = self.root_error(&key, "clear its plan", &e);
                    retry = Some(retry.map_or(at, |r| r.min(at)));
                }
            }
        }
        retry
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crds::scheduling::{PlanState, PlannedPod};

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
}

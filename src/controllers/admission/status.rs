//! Writing group statuses, and nothing else: each cycle computes every group's status with
//! the core (`scheduler::status`: what a status says and when it is written), applies the ones
//! that changed (server-side apply, paced per group by its last write), hands the ones whose
//! root's plan is cleared to that clear's patch (`commit`), and books what each write did.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::report::object_labels;
use super::{Admitter, CONTROLLER, FIELD_MANAGER, PlanClear, RootKey, error_backoff, group_pods, visit};
use crate::controllers::context::{Context, Detached, Error, Result, at_most, bounded};
use crate::controllers::lean_writes;
use crate::crds::scheduling::{CompositePodGroup, PodGroup};
use crate::scheduler::status::{
    COMMIT_FIELDS, ChildSummary, Disposition, Outcome, Pace, SentStatus, composite_status, disposition, due_at,
    error_condition, pod_group_status, same_status, status_inputs,
};
use crate::scheduler::{self, GroupTree};

impl Admitter {
    /// Writes every group's status that changed (server-side apply, this reconciler's manager).
    /// A write that fails is that group's alone: reported, retried after a backoff, and the
    /// other groups are written. Returns when to retry the failed ones, and the plans to clear
    /// (`done`: root and the version its clear is fenced by), each with its root's status when
    /// that changed too: one patch clears the plan and writes the status (see
    /// [`Self::clear_plans`]), where two writes, one racing the other, went before.
    pub(super) async fn write_statuses(
        &mut self,
        groups: Groups<'_>,
        by_group: &HashMap<RootKey, Vec<&Pod>>,
        settling: &HashSet<RootKey>,
        unmanaged: Vec<(RootKey, serde_json::Value)>,
        done: Vec<(RootKey, Option<String>)>,
    ) -> (Option<Instant>, Vec<PlanClear>) {
        let Groups { pgs, cpgs, trees } = groups;
        // The batch that ended is booked first: the pace below counts its writes.
        let booked = self.book_statuses().await;
        let now = Timestamp::now();
        let clearing: HashSet<&RootKey> = done.iter().map(|(key, _)| key).collect();
        let mut folded: HashMap<RootKey, serde_json::Value> = HashMap::new();
        // The outcome of a root applies to every group under it.
        let mut outcome_of: HashMap<RootKey, Option<Outcome>> = HashMap::new();
        let mut quorate_of: HashMap<RootKey, bool> = HashMap::new();
        // The groups under a root settling keep their status this cycle.
        let mut keep: HashSet<RootKey> = HashSet::new();
        for tree in trees {
            let root = RootKey::of(&tree.namespace, &tree.root);
            let outcome = self.roots.get(&root).and_then(|m| m.outcome.clone());
            let settles = settling.contains(&root);
            visit(&tree.root, &mut |g| {
                let key = RootKey::of(&tree.namespace, g);
                if settles {
                    keep.insert(key.clone());
                }
                outcome_of.insert(key.clone(), outcome.clone());
                quorate_of.insert(key, scheduler::is_quorate(g));
            });
        }
        let empty = Vec::new();
        let mut writes: Vec<(RootKey, Pace, Option<String>, serde_json::Value)> = Vec::new();
        let mut leaf_status: HashMap<RootKey, crate::crds::scheduling::PodGroupStatus> = HashMap::new();
        let mut settled = HashMap::with_capacity(self.status_settled.len());
        for pg in pgs {
            let key = RootKey::leaf(&pg.namespace().unwrap_or_default(), &pg.name_any());
            let pods = by_group.get(&key).unwrap_or(&empty);
            let outcome = outcome_of.get(&key).and_then(Option::as_ref);
            let error = self.roots.get(&key).and_then(|m| m.error.as_deref());
            let inputs = status_inputs(pg, pods, outcome, error);
            let clears = clearing.contains(&key);
            if !clears && self.status_settled.get(&key) == Some(&inputs) {
                // Computed from the same inputs before, and it was the status cached then.
                if pg.spec.parent_composite_pod_group_name.is_some() {
                    leaf_status.insert(key.clone(), pg.status.clone().unwrap_or_default());
                }
                settled.insert(key, inputs);
                continue;
            }
            // A root whose plan this cycle clears: its status as it stands without that plan
            // (the phase counts a plan in flight as admitted; its pods may be gone).
            let without_plan;
            let pg_now: &PodGroup = if clears && pg.status.as_ref().is_some_and(|s| s.plan.is_some()) {
                let mut g = (**pg).clone();
                if let Some(s) = g.status.as_mut() {
                    s.plan = None;
                }
                without_plan = g;
                &without_plan
            } else {
                pg
            };
            let mut status = pod_group_status(pg_now, pods, outcome, now);
            error_condition(&mut status.conditions, error, pg.metadata.generation, now);
            let created = pg.metadata.creation_timestamp.as_ref();
            match disposition(pg.status.as_ref(), &status, created, clears, keep.contains(&key), now) {
                Disposition::Same => {
                    settled.insert(key.clone(), inputs);
                }
                Disposition::Fold(body) => {
                    folded.insert(key.clone(), body);
                }
                Disposition::Kept => {}
                Disposition::Write(pace) => {
                    let version = pg.metadata.resource_version.clone();
                    writes.push((key.clone(), pace, version, serde_json::to_value(&status).unwrap_or_default()));
                }
            }
            leaf_status.insert(key, status);
        }
        self.status_settled = settled;
        for cpg in cpgs {
            let ns = cpg.namespace().unwrap_or_default();
            let name = cpg.name_any();
            let key = RootKey::composite(&ns, &name);
            let mut children = Vec::new();
            for pg in pgs.iter().filter(|p| {
                p.metadata.namespace.as_deref() == Some(ns.as_str())
                    && p.spec.parent_composite_pod_group_name.as_deref() == Some(name.as_str())
            }) {
                let k = RootKey::leaf(&ns, &pg.name_any());
                let quorate = quorate_of.get(&k).copied().unwrap_or(false);
                children.push(ChildSummary::of_pod_group(leaf_status.get(&k), quorate));
            }
            for child in cpgs.iter().filter(|c| {
                c.metadata.namespace.as_deref() == Some(ns.as_str())
                    && c.spec.parent_composite_pod_group_name.as_deref() == Some(name.as_str())
            }) {
                let k = RootKey::composite(&ns, &child.name_any());
                let quorate = quorate_of.get(&k).copied().unwrap_or(false);
                children.push(ChildSummary::of_composite(child.status.as_ref(), quorate));
            }
            let outcome = outcome_of.get(&key).and_then(Option::as_ref);
            let mut status = composite_status(cpg, &children, outcome, now);
            let error = self.roots.get(&key).and_then(|m| m.error.as_deref());
            error_condition(&mut status.conditions, error, cpg.metadata.generation, now);
            let (created, clears, settles) =
                (cpg.metadata.creation_timestamp.as_ref(), clearing.contains(&key), keep.contains(&key));
            match disposition(cpg.status.as_ref(), &status, created, clears, settles, now) {
                Disposition::Same | Disposition::Kept => {}
                Disposition::Fold(body) => {
                    folded.insert(key, body);
                }
                Disposition::Write(pace) => {
                    let version = cpg.metadata.resource_version.clone();
                    writes.push((key, pace, version, serde_json::to_value(&status).unwrap_or_default()));
                }
            }
        }
        // A group's status is paced by its last write (its plan writes count).
        let at = Instant::now();
        self.status_pacing.retain(|_, p| p.live(at));
        // What was sent for a group matters only while it has a write to make.
        let pending: HashSet<&RootKey> = writes.iter().map(|(key, ..)| key).collect();
        self.status_sent.retain(|key, _| pending.contains(key));
        let mut wait: Option<Instant> = None;
        let mut due: Vec<StatusWrite> = writes
            .into_iter()
            .filter(|(key, _, version, status)| !self.status_sent.get(key).is_some_and(|sent| sent.is(version, status)))
            .filter_map(|(key, pace, version, status)| {
                let next = due_at(pace, self.status_pacing.get(&key).copied().unwrap_or_default(), at);
                match next {
                    Some(next) => {
                        wait = Some(wait.map_or(next, |w| w.min(next)));
                        None
                    }
                    None => Some((key, version, status)),
                }
            })
            .collect();
        due.extend(unmanaged.into_iter().map(|(key, status)| (key, None, status)));
        let retry = [booked, self.apply_statuses(due).await, wait].into_iter().flatten().min();
        // Each clear with its root as cached: a clear fenced by that version replaces the
        // status (see `commit::Cached`).
        let roots = if done.is_empty() { HashMap::new() } else { super::cycle::roots_by_key(pgs, cpgs) };
        let clears = done
            .into_iter()
            .map(|(key, version)| {
                let status = folded.remove(&key);
                let group = roots.get(&key).map(|g| g.cached());
                (key, version, status, group)
            })
            .collect();
        (retry, clears)
    }

    /// Sends the statuses due, [`STATUS_CONCURRENCY`] at a time, on a task of its own: a cycle
    /// never waits for its status writes (at 1,000 pending gangs, waiting for them was most of
    /// a cycle, and decisions and commits waited with it). One batch is in flight at a time;
    /// the next cycle after it ends (its end wakes one) books it, and writes what is still due
    /// then. Groups backing off after a failed write are skipped. Returns when the first of
    /// those may be tried again.
    async fn apply_statuses(&mut self, writes: Vec<StatusWrite>) -> Option<Instant> {
        // Booked at the start of the cycle; one that ended since is booked now, not dropped.
        let mut retry = self.book_statuses().await;
        if self.status_batch.as_ref().is_some_and(|b| !b.is_finished()) {
            return retry;
        }
        let now = Instant::now();
        let mut due = Vec::with_capacity(writes.len());
        for (key, version, status) in writes {
            if let Some((_, until, _)) = self.status_errors.get(&key).filter(|(_, until, _)| *until > now) {
                retry = Some(retry.map_or(*until, |r| r.min(*until)));
                continue;
            }
            if version.is_some() {
                self.status_sent.insert(key.clone(), SentStatus::of(&version, &status));
            }
            due.push((key, version, status));
        }
        if due.is_empty() {
            return retry;
        }
        let (ctx, writer, signal) = (self.ctx.clone(), self.writer.clone(), self.signal.clone());
        self.status_batch = Some(Detached::spawn(async move {
            let sends: Vec<_> = due
                .into_iter()
                .map(|(key, before, status)| {
                    let (ctx, writer) = (ctx.clone(), writer.clone());
                    async move {
                        // A write waits for its turn in the batch; when it comes, the root
                        // may have a commit in flight (the status is stale then: skipped).
                        // Otherwise the root is held back while the write is in flight.
                        {
                            let mut unseen = writer.unseen();
                            // Being cleared too: the clear's patch carries a newer status.
                            if unseen.committing.contains(&key) || unseen.clearing.contains(&key) {
                                return (key, Ok(()));
                            }
                            if before.is_some() {
                                unseen.status_writes.insert(key.clone(), Instant::now());
                            }
                        }
                        let result = if key.composite {
                            apply_status::<CompositePodGroup>(&ctx, &key, "CompositePodGroup", status).await
                        } else {
                            apply_status::<PodGroup>(&ctx, &key, "PodGroup", status).await
                        };
                        // The root may be decided again; until the cache shows this write, a
                        // plan write on it is fenced by the version it made (`Unseen::fence`).
                        let mut unseen = writer.unseen();
                        unseen.status_writes.remove(&key);
                        if let (Some(before), Ok(Some(after))) = (before, &result) {
                            unseen.statuses.insert(key.clone(), (before, after.clone(), Instant::now()));
                        }
                        (key, result.map(|_| ()))
                    }
                })
                .collect();
            let results = at_most(STATUS_CONCURRENCY, sends).await;
            signal.wake();
            results
        }));
        retry
    }

    /// Books the status batch that ended, if one did: a write that went through starts its
    /// group's pace, a failed one is reported and backed off. Returns when the first of those
    /// may be tried again.
    pub(super) async fn book_statuses(&mut self) -> Option<Instant> {
        let mut batch = self.status_batch.take_if(|b| b.is_finished())?;
        let results = match batch.join().await {
            Ok(results) => results,
            Err(e) => {
                tracing::warn!(error = %e, "the group status writes ended without an answer");
                // Which of them went out is unknown: none counts as sent.
                self.status_sent.clear();
                return None;
            }
        };
        let mut retry: Option<Instant> = None;
        for (key, result) in results {
            match result {
                Ok(()) => {
                    self.status_errors.remove(&key);
                    self.status_pacing.entry(key).or_default().written = Some(Instant::now());
                }
                Err(e) => {
                    self.status_sent.remove(&key);
                    let kind = if key.composite { "CompositePodGroup" } else { "PodGroup" };
                    self.ctx.metrics.reconcile_error(CONTROLLER, e.metric_label());
                    self.ctx.metrics.object_errors.get_or_create(&object_labels(kind, e.reason())).inc();
                    let (errors, last) = self.status_errors.remove(&key).map(|(n, _, m)| (n, m)).unwrap_or_default();
                    let errors = errors.saturating_add(1);
                    let until = Instant::now() + error_backoff(errors);
                    let note = format!("admission could not write the status: {e}");
                    tracing::warn!(group = %key, error = %e, errors, "admission could not write a group status");
                    if last != note {
                        self.root_event(&key, true, "StatusWriteFailed", &note);
                    }
                    self.status_errors.insert(key, (errors, until, note));
                    retry = Some(retry.map_or(until, |r| r.min(until)));
                }
            }
        }
        retry
    }

    /// Groups in the namespaces muster's webhooks skip: their pods are never gated, so muster
    /// does not admit them (it would count pods kube-scheduler places alone). Says so in one
    /// Warning event per group, and returns the status writes that say it on each group.
    pub(super) fn report_unmanaged(
        &mut self,
        pgs: &[Arc<PodGroup>],
        cpgs: &[Arc<CompositePodGroup>],
        pods: &[Arc<Pod>],
    ) -> Vec<(RootKey, serde_json::Value)> {
        if pgs.is_empty() && cpgs.is_empty() {
            self.excluded_reported.clear();
            return Vec::new();
        }
        let now = Timestamp::now();
        let by_group = group_pods(pods);
        let empty = Vec::new();
        let mut writes = Vec::new();
        let mut seen = HashSet::new();
        let keys = pgs
            .iter()
            .map(|g| (RootKey::leaf(&g.namespace().unwrap_or_default(), &g.name_any()), Some(g), None))
            .chain(
                cpgs.iter()
                    .map(|c| (RootKey::composite(&c.namespace().unwrap_or_default(), &c.name_any()), None, Some(c))),
            );
        for (key, pg, cpg) in keys {
            let message = format!(
                "not admitted by muster: namespace {} is one its webhooks skip (muster's own and kube-system), \
                 so these pods are never gated and kube-scheduler places each alone; run gangs in another namespace",
                key.ns
            );
            let outcome = Outcome::Excluded(message.clone());
            let status = match (pg, cpg) {
                (Some(pg), _) => {
                    let s = pod_group_status(pg, by_group.get(&key).unwrap_or(&empty), Some(&outcome), now);
                    (!same_status(pg.status.as_ref(), &s)).then(|| serde_json::to_value(&s).unwrap_or_default())
                }
                (_, Some(cpg)) => {
                    let s = composite_status(cpg, &[], Some(&outcome), now);
                    (!same_status(cpg.status.as_ref(), &s)).then(|| serde_json::to_value(&s).unwrap_or_default())
                }
                _ => None,
            };
            if let Some(status) = status {
                writes.push((key.clone(), status));
            }
            if self.excluded_reported.insert(key.clone()) {
                tracing::warn!(group = %key, "group in a namespace muster's webhooks skip: not admitted");
                self.root_event(&key, true, "NamespaceExcluded", &message);
            }
            seen.insert(key);
        }
        self.excluded_reported.retain(|k| seen.contains(k));
        writes
    }
}

/// Applies one group's status (server-side apply, this reconciler's manager), without the
/// fields the commit protocol writes. Returns the group's resourceVersion after it; a group
/// gone meanwhile is no error (`None`).
async fn apply_status<K>(
    ctx: &Context,
    key: &RootKey,
    kind: &str,
    mut status: serde_json::Value,
) -> Result<Option<String>>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    if let Some(map) = status.as_object_mut() {
        for field in COMMIT_FIELDS {
            map.remove(field);
        }
    }
    let text = |field: &str| status.get(field).and_then(serde_json::Value::as_str).unwrap_or_default().to_string();
    tracing::debug!(group = %key, phase = %text("phase"), reason = %text("reason"), "group status applied");
    let body = json!({"apiVersion": "scheduling.muster.dev/v1alpha1", "kind": kind, "status": status});
    let api = Api::<K>::namespaced(ctx.client.clone(), &key.ns);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    match bounded(lean_writes::patch_status(&api, &key.name, &params, &Patch::Apply(&body))).await {
        Ok(group) => Ok(group.resource_version()),
        Err(Error::Kube(kube::Error::Api(e))) if e.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

/// How many group status writes of a cycle are in flight at once.
const STATUS_CONCURRENCY: usize = 16;

/// The groups a cycle writes statuses for, as the caches show them, and the roots' trees.
#[derive(Clone, Copy)]
pub(super) struct Groups<'a> {
    pub pgs: &'a [Arc<PodGroup>],
    pub cpgs: &'a [Arc<CompositePodGroup>],
    pub trees: &'a [GroupTree],
}

/// A group status to write: the group, the resourceVersion it was computed on, the status.
type StatusWrite = (RootKey, Option<String>, serde_json::Value);

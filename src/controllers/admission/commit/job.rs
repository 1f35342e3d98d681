//! A decision carried out: the commit job prepared from it, its writes (dry run and plan
//! recorded `Committing`, then the claims and one fenced patch per pod), the resume of a commit
//! cut short, and the booking of a commit that went through.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::plan::{AdmittedStatus, too_large};
use crate::controllers::admission::nominations::write_nominations;
use crate::controllers::admission::report::object_labels;
use crate::controllers::admission::{Admitter, Patched, RootKey, World, Writer, is_gated, patched};
use crate::controllers::context::{Result, bounded};
use crate::crds::scheduling::{AdmissionPlan, PlanState, PlannedPod, PodGroup};
use crate::crds::{ADMISSION_GATE, GPU_INDICES_ANNOTATION, HOSTNAME_LABEL};
use crate::devices::parse_indices;
use crate::scheduler::status::{Outcome, status_hold, wait_started};
use crate::scheduler::{self, ClaimWrite, Decision, PatchRefused, Snapshot};

/// Counts a pod just pinned by `planned` in the snapshot (resources and GPU indices), so the
/// roots planned later in the same cycle see the capacity taken.
pub(in crate::controllers::admission) fn reserve(snapshot: &mut Snapshot, pod: &Pod, planned: &PlannedPod) {
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

/// How one commit (or resume) ended, short of an error worth a backoff.
#[derive(Debug)]
pub(in crate::controllers::admission) enum Committed {
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

/// A decided commit, ready to go out on a task of its own: everything it writes, owned.
pub(in crate::controllers::admission) struct CommitJob {
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
    /// A leaf root's status, as cached and as admitted: the plan's record writes the latter.
    pub admitted: Option<super::plan::AdmittedStatus>,
    /// The root as cached: the plan's record replaces its status when the decision was made on
    /// it.
    pub cached: Option<super::plan::Cached>,
}

impl CommitJob {
    /// The pods it pins, in plan order.
    pub(in crate::controllers::admission) fn planned(&self) -> &[PlannedPod] {
        &self.plan.pods
    }
}

/// Gets a decided commit ready: the plan, the claims it names and every claim write are worked
/// out, then its pods are counted in the snapshot (resources and GPU indices), so the roots
/// decided after it in the same cycle see the capacity taken while its writes are in flight.
/// `Err` says why it cannot go out; nothing was written or counted then.
pub(in crate::controllers::admission) fn prepare_commit(
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
    Ok(CommitJob {
        key: key.clone(),
        version,
        plan,
        pods,
        shared,
        own,
        message: decision.message(),
        admitted: None,
        cached: None,
    })
}

/// A leaf root's status as cached, and as `scheduler::status::admitted_status` says it reads
/// once `job`'s plan is recorded.
pub(in crate::controllers::admission) fn admitted_status(
    pg: &PodGroup,
    pods: &[&Pod],
    job: &CommitJob,
    error: Option<&str>,
) -> AdmittedStatus {
    let status = scheduler::status::admitted_status(pg, pods, &job.plan, &job.message, error, Timestamp::now());
    (pg.status.clone(), status)
}

impl Writer {
    /// The commit protocol: check every patch (dry run) and record the plan `Committing`, then
    /// pin/annotate/ungate each pod once. Every write is fenced: the plan writes by the
    /// group's resourceVersion the decision was made on, each pod patch by the pod's, so a
    /// stale cache or a second leader never writes over a newer state. It borrows nothing of
    /// the cycle: the commits of one cycle go out concurrently.
    pub(in crate::controllers::admission) async fn commit(&self, job: &CommitJob) -> Result<Committed> {
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
                (uid, bounded(api.patch_metadata(&name, &params, &Patch::Merge(&patch))).await.map(|_| ()))
            }
        }))
        .buffer_unordered(DRY_RUN_CONCURRENCY)
        .collect::<Vec<_>>();
        plan.state = PlanState::Committing;
        let (checks, recorded) = futures::join!(
            checks,
            self.write_plan(key, job.version.clone(), &plan, job.admitted.as_ref(), job.cached.as_ref())
        );
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
            self.clear_plan(key, Some(version), None, None).await?;
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
    pub(in crate::controllers::admission) fn concurrency(&self, wanted: usize) -> usize {
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

/// Dry runs in flight at once for one commit.
const DRY_RUN_CONCURRENCY: usize = 16;

/// How many pod patches of one commit are in flight at once.
const POD_PATCH_CONCURRENCY: usize = 16;

/// Sends a planned pod's patch (pin, GPU indices, gate removal): its name and body, `None`
/// when the pod is no longer gated (ungated by someone else since: its pin and GPU indices are
/// never overwritten), which comes back as `None`.
async fn send_pod_patch(api: &Api<Pod>, request: Option<(String, serde_json::Value)>) -> Option<Result<()>> {
    let (name, patch) = request?;
    Some(bounded(api.patch_metadata(&name, &PatchParams::default(), &Patch::Merge(&patch))).await.map(|_| ()))
}

impl Admitter {
    /// Books a commit that went through: the root's memory, the metrics, the `Admitted` event
    /// (sent in the background).
    pub(in crate::controllers::admission) fn admitted(&mut self, job: &CommitJob) {
        let key = &job.key;
        // Its status waits for the binds (and a leaf's for its pods to start): the plan's
        // clear writes it then (see `scheduler::status::status_hold`).
        let now = Instant::now();
        let pacing = self.status_pacing.entry(key.clone()).or_default();
        (pacing.written, pacing.hold) = (Some(now), Some(now + status_hold(key.composite)));
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
        self.root_event(key, false, "Admitted", &note);
    }

    /// Resumes a commit cut short: patches the still-gated pods, then records the plan admitted.
    pub(super) async fn resume(
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
        if self.writer.write_plan(key, version, &done, None, None).await?.is_none() {
            return Ok(Committed::Stale);
        }
        self.roots.entry(key.clone()).or_default().outcome =
            Some(Outcome::Admitted(format!("admitted {} pod(s) (commit resumed)", plan.pods.len())));
        Ok(Committed::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::fixtures::planned;
    use crate::controllers::context::Error;

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
}

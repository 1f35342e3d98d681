//! PURE: how a group's changed status is written: at what pace after the group's last write
//! ([`Pace`], [`due_at`]), what the commit protocol writes instead ([`COMMIT_FIELDS`]), the
//! merge patch that clears a plan and writes the status at once ([`fold_body`]), and the
//! fingerprints that keep a status from being computed or sent again for nothing. Times are
//! passed in.

use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use muster_api::scheduling::{AdmissionPlan, CompositePodGroupStatus, GroupPhase, PodGroup, PodGroupStatus};

use super::outcome::Outcome;

/// The least time between a group's last write (its status, its plan, its plan's clear) and a
/// write of a new phase or condition: a gang created, admitted, bound and started within a
/// second or two makes one or two status writes, not one per step (as kube's Job controller
/// batches its status updates). In a saturated run the API server spent more on muster's
/// group status writes than on any other write of muster's; a status a second late costs a
/// user nothing.
pub const STATUS_PACE: std::time::Duration = std::time::Duration::from_secs(1);
/// The least time between a group's last write and a write of its counts and messages only
/// (its phase and conditions standing): pods started one by one, seconds apart on a busy
/// cluster, make one write, not one each.
pub const COUNT_PACE: std::time::Duration = std::time::Duration::from_secs(5);
/// How long after its creation a leaf root's plan, every pod bound, is still followed while
/// its pods start (`CommitInput::start_settle`): the plan's record already says the group is
/// admitted (see [`plan_body`]), and its clear then writes the status with the pods bound and
/// running, one write where two went before. A gang slower to start than this is cleared
/// with its pods bound, and says `Running` in a write of its own, as before. In a saturated
/// burst at 5,000 nodes the pods ran 4 to 24 s after their plan (median 12 s; 5 s folded
/// almost none of them).
pub const START_SETTLE: std::time::Duration = std::time::Duration::from_secs(30);
/// How long a composite root's status waits after its commit went through: kube-scheduler
/// binds its pods meanwhile, and the plan's clear then writes the status (admitted and
/// scheduled at once) in the same patch. A gang whose binds take longer gets its admitted
/// status then.
pub const PLAN_STATUS_HOLD: std::time::Duration = std::time::Duration::from_secs(5);

/// PURE: how long after its creation a root's plan, every pod bound, is followed while its
/// pods start: [`START_SETTLE`] for a leaf root (its plan record says it is admitted, see
/// [`admitted_status`]); none for a composite root, whose plan records no status and is
/// cleared at the last bind.
pub fn start_settle(composite: bool) -> std::time::Duration {
    if composite { std::time::Duration::ZERO } else { START_SETTLE }
}

/// PURE: how long a root's status waits after its commit went through: a leaf root's plan
/// record says it is admitted already, and its clear writes the status once its pods are bound
/// and started, within [`start_settle`] (a second more, so the clear comes first); a
/// composite root's, [`PLAN_STATUS_HOLD`].
pub fn status_hold(composite: bool) -> std::time::Duration {
    if composite { PLAN_STATUS_HOLD } else { start_settle(false) + std::time::Duration::from_secs(1) }
}

/// PURE: a leaf root's status as it reads once `plan` is recorded `Committing` (its pods not
/// patched yet): admitted, with the decision's `message` and the root's last `error`. The
/// plan's write carries it (see [`plan_body`]), so the group never shows its phase from before
/// the commit while the plan is followed.
pub fn admitted_status(
    pg: &PodGroup,
    pods: &[&Pod],
    plan: &AdmissionPlan,
    message: &str,
    error: Option<&str>,
    now: Timestamp,
) -> PodGroupStatus {
    let mut with_plan = pg.clone();
    let mut plan = plan.clone();
    plan.state = muster_api::scheduling::PlanState::Committing;
    with_plan.status.get_or_insert_with(Default::default).plan = Some(plan);
    let mut status = super::pod_group_status(&with_plan, pods, Some(&Outcome::Admitted(message.to_string())), now);
    super::error_condition(&mut status.conditions, error, pg.metadata.generation, now);
    status
}

/// Status fields written by the commit protocol with their own merge patches (the plan, and
/// the rollback record beside it); the server-side apply of the rest leaves them alone, so a
/// stale cache never writes an old value back.
pub const COMMIT_FIELDS: [&str; 5] = ["plan", "rollbacks", "recentRollbacks", "lastRollbackTime", "avoidNodes"];

/// A group status part of which is written by the commit protocol.
pub trait CommitRecord: Clone + PartialEq {
    /// The status without what the commit protocol writes (see [`COMMIT_FIELDS`]).
    fn without_commit_record(&self) -> Self;
    /// The phase and each condition's type, status and reason: a change of that is written
    /// at [`STATUS_PACE`], of counts and messages only at [`COUNT_PACE`].
    fn standing(&self) -> (Option<GroupPhase>, Vec<(&str, &str, &str)>);
}

fn condition_keys(conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]) -> Vec<(&str, &str, &str)> {
    conditions.iter().map(|c| (c.type_.as_str(), c.status.as_str(), c.reason.as_str())).collect()
}

/// The same record for both group kinds: their statuses share the commit protocol's fields.
macro_rules! commit_record {
    ($($status:ty),*) => {$(
        impl CommitRecord for $status {
            fn without_commit_record(&self) -> Self {
                Self {
                    plan: None,
                    rollbacks: 0,
                    recent_rollbacks: 0,
                    last_rollback_time: None,
                    avoid_nodes: Vec::new(),
                    ..self.clone()
                }
            }

            fn standing(&self) -> (Option<GroupPhase>, Vec<(&str, &str, &str)>) {
                (self.phase, condition_keys(&self.conditions))
            }
        }
    )*};
}

commit_record!(PodGroupStatus, CompositePodGroupStatus);

/// How old a group must be before its first status (a pending one) is written: a gang admitted
/// younger than this gets no pending status before its admitted one. In a burst of 1,000 gangs
/// at 5,000 nodes, admission took 2.6 s at the median and 5.6 s at the 99th percentile; with
/// 2 s after its creation stamp, 676 of the 1,000 groups were written `Pending` first (one
/// status write in four of the path's PodGroup status writes), each a write of a custom
/// resource's status, costlier for the API server than a built-in one. On a cluster that is
/// not busy a gang is admitted within a second and never waits this long; one that cannot be
/// admitted says why in its status 5 to 6 s after it was made (an `Unschedulable` event at once).
pub const FIRST_STATUS_AGE: std::time::Duration = std::time::Duration::from_secs(5);

/// PURE: how long the first status of a group created at `created` may still wait at `now`:
/// until it is at least [`FIRST_STATUS_AGE`] old. `creationTimestamp` has whole seconds (the
/// group may be up to a second younger than it says), so that is [`FIRST_STATUS_AGE`] and a
/// second after the stamp. `None`: write it now (older, or a creation time ahead of this clock).
pub(super) fn first_status_wait(created: Option<&Time>, now: Timestamp) -> Option<std::time::Duration> {
    let age = std::time::Duration::try_from(now.duration_since(created?.0)).ok()?;
    (FIRST_STATUS_AGE + std::time::Duration::from_secs(1)).checked_sub(age).filter(|left| !left.is_zero())
}

/// Status equality that ignores what the commit protocol writes.
pub fn same_status<S: CommitRecord>(old: Option<&S>, new: &S) -> bool {
    old.is_some_and(|old| old.without_commit_record() == new.without_commit_record())
}

/// PURE: a fingerprint of what a PodGroup's status is computed from: the group as cached (its
/// resourceVersion), its pods as cached (each UID and resourceVersion), its root's outcome
/// and last error. Equal fingerprints, equal statuses (the clock only stamps transitions).
pub fn status_inputs(pg: &PodGroup, pods: &[&Pod], outcome: Option<&Outcome>, error: Option<&str>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    pg.metadata.uid.hash(&mut h);
    pg.metadata.resource_version.hash(&mut h);
    for pod in pods {
        pod.metadata.uid.hash(&mut h);
        pod.metadata.resource_version.hash(&mut h);
    }
    outcome.map(|o| (std::mem::discriminant(o), o.message())).hash(&mut h);
    error.hash(&mut h);
    h.finish()
}

/// When a group's changed status is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pace {
    /// Its phase or a condition moved: [`STATUS_PACE`] after the group's last write.
    Standing,
    /// Counts and messages only (its pods created, bound, started one by one):
    /// [`COUNT_PACE`] after the group's last write.
    Counts,
    /// Its first status, the group young: after this much more (see [`first_status_wait`]),
    /// and [`STATUS_PACE`] after the group's last write (its plan's).
    Young(std::time::Duration),
}

/// PURE: how a group's status, changed from `old` (the one cached) to `new`, is paced at
/// `now`. A status with no phase and no condition yet counts as none: the job controller may
/// have written the group's claim statuses (`resourceClaimStatuses`) before admission's first.
pub(super) fn pace_of<S: CommitRecord>(old: Option<&S>, new: &S, created: Option<&Time>, now: Timestamp) -> Pace {
    let first = old.is_none_or(|old| old.standing() == (None, Vec::new()));
    match (old, first_status_wait(created, now)) {
        (_, Some(left)) if first => Pace::Young(left),
        (Some(old), _) if old.standing() == new.standing() => Pace::Counts,
        _ => Pace::Standing,
    }
}

/// What paces a group's next status write: when the group was last written (its status, its
/// plan, its plan's clear), and until when its status waits for its plan's binds
/// ([`PLAN_STATUS_HOLD`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatusPacing {
    pub written: Option<Instant>,
    pub hold: Option<Instant>,
}

impl StatusPacing {
    /// Whether it still paces anything after `at`.
    pub fn live(&self, at: Instant) -> bool {
        self.written.is_some_and(|w| w + COUNT_PACE > at) || self.hold.is_some_and(|h| h > at)
    }
}

/// PURE: when a status write paced `pace` may go at `at`: `None` now.
pub fn due_at(pace: Pace, pacing: StatusPacing, at: Instant) -> Option<Instant> {
    let after = |d: std::time::Duration| pacing.written.map(|w| w + d);
    let due = match pace {
        Pace::Standing => after(STATUS_PACE),
        Pace::Counts => after(COUNT_PACE),
        Pace::Young(left) => Some(after(STATUS_PACE).map_or(at + left, |d| d.max(at + left))),
    };
    [due, pacing.hold].into_iter().flatten().max().filter(|due| *due > at)
}

/// PURE: the merge patch of a root's status that clears its plan and writes `new`, the status
/// computed from `old` (the one cached): every field admission computes, a field it no longer
/// sets as `null` (a merge patch removes only what it names), `plan` as `null`, and nothing
/// of the rollback record or the job controller's claim statuses, which have writers of their
/// own.
pub fn fold_body<S: serde::Serialize>(old: Option<&S>, new: &S) -> serde_json::Value {
    let fields = |s: Option<&S>| match s.map(serde_json::to_value) {
        Some(Ok(serde_json::Value::Object(map))) => map,
        _ => serde_json::Map::new(),
    };
    let not_ours = |field: &str| COMMIT_FIELDS.contains(&field) || field == "resourceClaimStatuses";
    let mut body = fields(Some(new));
    body.retain(|field, _| !not_ours(field));
    for field in fields(old).keys().filter(|f| !not_ours(f)) {
        body.entry(field.clone()).or_insert(serde_json::Value::Null);
    }
    body.insert("plan".into(), serde_json::Value::Null);
    serde_json::Value::Object(body)
}

/// PURE: the merge patch of a root's status that records `plan` and writes `new`, the status
/// computed with that plan in flight (so the group says it is admitted from the plan's write
/// on, not from its clear): every field admission computes, a field it no longer sets as
/// `null`, like [`fold_body`].
pub fn plan_body<S: serde::Serialize>(old: Option<&S>, new: &S, plan: &AdmissionPlan) -> serde_json::Value {
    let mut body = fold_body(old, new);
    body["plan"] = serde_json::to_value(plan).unwrap_or_default();
    body
}

/// PURE: the whole group to send as an update of its status (a PUT of the status subresource)
/// in place of `patch`, a merge patch of its status ([`fold_body`], [`plan_body`]): `cached`, the
/// group as cached, with `patch` merged into its status and its `managedFields` left out (the
/// API server then keeps the stored ones), when `cached` is at `fence`, the resourceVersion
/// the write is fenced by. `None` otherwise (the cache has not seen muster's last write of
/// the group yet, or the write is not fenced): the write goes as the merge patch.
///
/// It writes the status the patch would have: the API server keeps everything of the stored
/// object but the status, and refuses the update (409) unless the object is still at `fence`,
/// so the status it replaces is the cached one. What it saves the API server is the patch:
/// encoding the stored object, merging the patch into it and decoding the result (a profile
/// at 5,000 nodes put that at about a quarter of a custom resource's status write).
pub fn status_replacement(
    cached: &serde_json::Value,
    fence: Option<&str>,
    patch: &serde_json::Value,
) -> Option<serde_json::Value> {
    let at = cached.pointer("/metadata/resourceVersion").and_then(serde_json::Value::as_str);
    if fence.is_none() || at != fence {
        return None;
    }
    let mut status = cached.get("status").cloned().unwrap_or(serde_json::Value::Null);
    json_patch::merge(&mut status, patch);
    status_update(cached, status)
}

/// PURE: `cached`, an object as cached, to send as an update of its status subresource with
/// `status` as its whole status, its `managedFields` left out (the API server then keeps the
/// stored ones; it keeps everything else of the stored object but the status too). `None` when
/// `cached` is not an object. The update is fenced by `cached`'s resourceVersion.
pub fn status_update(cached: &serde_json::Value, status: serde_json::Value) -> Option<serde_json::Value> {
    let mut whole = cached.clone();
    let object = whole.as_object_mut()?;
    if let Some(meta) = object.get_mut("metadata").and_then(serde_json::Value::as_object_mut) {
        meta.remove("managedFields");
    }
    object.insert("status".into(), status);
    Some(whole)
}

/// A status sent for a group: the group's resourceVersion it was computed on, and the
/// status without its conditions' transition times. While the cache still shows that version
/// (it lags behind the write, seconds on a busy API server), the status computed again is the
/// one sent: it is not sent again (on a busy cluster a tenth of the group status writes were
/// such repeats). A status computed on another version, or another status, is sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentStatus {
    version: Option<String>,
    status: u64,
}

impl SentStatus {
    pub fn of(version: &Option<String>, status: &serde_json::Value) -> Self {
        SentStatus { version: version.clone(), status: without_transition_times(status) }
    }

    pub fn is(&self, version: &Option<String>, status: &serde_json::Value) -> bool {
        self.version == *version && self.status == without_transition_times(status)
    }
}

/// PURE: a fingerprint of a status without its conditions' transition times (computed again on
/// a stale cache, a transition is stamped again).
fn without_transition_times(status: &serde_json::Value) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut status = status.clone();
    if let Some(conditions) = status.get_mut("conditions").and_then(serde_json::Value::as_array_mut) {
        for c in conditions.iter_mut().filter_map(serde_json::Value::as_object_mut) {
            c.remove("lastTransitionTime");
        }
    }
    let mut h = std::hash::DefaultHasher::new();
    status.to_string().hash(&mut h);
    h.finish()
}

/// What becomes of a group's status computed in a cycle.
#[derive(Clone, Debug, PartialEq)]
pub enum Disposition {
    /// The status cached says the same (what the commit protocol writes aside): nothing to write.
    Same,
    /// The root's plan is cleared this cycle: the status goes into the clear's merge patch
    /// ([`fold_body`]), one write instead of two racing.
    Fold(serde_json::Value),
    /// The root settles (its writes are not in the caches yet): the status is kept this cycle.
    Kept,
    /// Written on its own, at this pace after the group's last write.
    Write(Pace),
}

/// PURE: what becomes of `new`, a group's status computed at `now` from `old` (the one
/// cached), for a group created at `created`, whose root's plan `clears` this cycle or whose
/// root `settles`.
pub fn disposition<S: CommitRecord + serde::Serialize>(
    old: Option<&S>,
    new: &S,
    created: Option<&Time>,
    clears: bool,
    settles: bool,
    now: Timestamp,
) -> Disposition {
    if same_status(old, new) {
        Disposition::Same
    } else if clears {
        Disposition::Fold(fold_body(old, new))
    } else if settles {
        Disposition::Kept
    } else {
        Disposition::Write(pace_of(old, new, created, now))
    }
}

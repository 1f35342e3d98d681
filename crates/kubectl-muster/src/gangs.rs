//! PURE: gangs as `kubectl muster` shows them. muster's root PodGroups and CompositePodGroups,
//! the native `scheduling.k8s.io` ones (upstream mode), and the jobs that own them, reduced to
//! one [`Gang`] each; a gang's phase, wait and short reason; the `list` table. No client and no
//! clock: the shell passes the objects it listed and `now`.

use std::fmt;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::scheduling::{v1alpha3, v1beta1};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use k8s_openapi::jiff::Timestamp;

use super::why::top_reason;
use muster_api::batch::{JobPhase, JobSetPhase};
use muster_api::scheduling::GroupPhase;
use muster_api::{CompositePodGroup, JOBSET_NAME_LABEL, MusterJob, MusterJobSet, PodGroup};
use muster_core::pods::{Lifecycle, PodClass};

/// muster's verdict condition on its groups (admission's).
pub const ADMITTED: &str = "Admitted";
/// kube-scheduler's verdict condition on a native PodGroup (upstream mode).
pub const POD_GROUP_SCHEDULED: &str = "PodGroupInitiallyScheduled";
/// kube-scheduler's verdict condition on a native CompositePodGroup.
pub const COMPOSITE_SCHEDULED: &str = "CompositePodGroupInitiallyScheduled";

/// The objects `list` and `why` read, as listed (a kind the cluster does not serve is empty).
#[derive(Clone, Debug, Default)]
pub struct Objects {
    /// muster's PodGroups.
    pub pod_groups: Vec<PodGroup>,
    /// muster's CompositePodGroups.
    pub composites: Vec<CompositePodGroup>,
    /// `scheduling.k8s.io/v1beta1` PodGroups.
    pub native_groups: Vec<v1beta1::PodGroup>,
    /// `scheduling.k8s.io/v1alpha3` CompositePodGroups.
    pub native_composites: Vec<v1alpha3::CompositePodGroup>,
    /// MusterJobs.
    pub jobs: Vec<MusterJob>,
    /// MusterJobSets.
    pub sets: Vec<MusterJobSet>,
    /// Pods that join a native PodGroup (`spec.schedulingGroup`); muster's groups count their
    /// own pods in their status.
    pub pods: Vec<Pod>,
}

/// What a gang is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GangKind {
    /// muster's PodGroup.
    PodGroup,
    /// muster's CompositePodGroup.
    CompositePodGroup,
    /// A `scheduling.k8s.io` PodGroup, admitted by kube-scheduler.
    NativePodGroup,
    /// A `scheduling.k8s.io` CompositePodGroup, admitted by kube-scheduler.
    NativeCompositePodGroup,
}

impl GangKind {
    /// Admitted by kube-scheduler (upstream mode) rather than by muster.
    pub fn upstream(self) -> bool {
        matches!(self, GangKind::NativePodGroup | GangKind::NativeCompositePodGroup)
    }

    /// The kind as `kubectl get` spells it unambiguously.
    pub fn resource(self) -> &'static str {
        match self {
            GangKind::PodGroup => "podgroup.scheduling.muster.dev",
            GangKind::CompositePodGroup => "compositepodgroup.scheduling.muster.dev",
            GangKind::NativePodGroup => "podgroup.scheduling.k8s.io",
            GangKind::NativeCompositePodGroup => "compositepodgroup.scheduling.k8s.io",
        }
    }
}

/// Where a gang stands, in one word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for quorum or for its admission decision.
    Waiting,
    /// Quorate, but does not fit.
    Unschedulable,
    /// Admitted (muster pinned and ungated it, or kube-scheduler scheduled it), not running yet.
    Admitted,
    /// Its pods run.
    Running,
    /// Done: its job completed, or every pod succeeded.
    Finished,
    /// Its job failed, or the gang failed (bind timeout, pods failed).
    Failed,
    /// Its job is suspended (`spec.suspend`).
    Suspended,
    /// Its job's spec is invalid; nothing runs.
    Invalid,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// What the owning job says of itself where that decides the gang's phase (suspended,
/// invalid, finished, failed): the phase, and the job condition's reason and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobSays {
    /// The gang's phase because of it.
    pub phase: Phase,
    /// The job condition's reason (`JobSuspended`, `BackoffLimitExceeded`, ...).
    pub reason: String,
    /// The job condition's message.
    pub message: String,
}

/// The MusterJob or MusterJobSet owning a gang.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// `MusterJob` or `MusterJobSet`.
    pub kind: String,
    /// Its name.
    pub name: String,
    /// What it says of itself, when that decides the phase.
    pub says: Option<JobSays>,
}

/// Counts of a gang's pods (for a composite, over all its PodGroups).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodCounts {
    /// Pods that exist and have not finished.
    pub live: i32,
    /// Of those, pods still gated.
    pub gated: i32,
    /// Pods that got a node: bound and live, or succeeded.
    pub bound: i32,
    /// Pods running.
    pub running: i32,
    /// Pods that succeeded.
    pub succeeded: i32,
    /// Pods that failed.
    pub failed: i32,
    /// Pods needed before any starts: `minCount` (1 for a basic group; summed over a
    /// composite's PodGroups).
    pub min: i32,
}

impl std::ops::AddAssign for PodCounts {
    fn add_assign(&mut self, o: Self) {
        self.live += o.live;
        self.gated += o.gated;
        self.bound += o.bound;
        self.running += o.running;
        self.succeeded += o.succeeded;
        self.failed += o.failed;
        self.min += o.min;
    }
}

/// A composite's quorum: child groups that exist, that are quorate, and how many it needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupCounts {
    /// Child groups that exist.
    pub children: i32,
    /// Child groups that are quorate (muster's count; native: unknown, 0).
    pub quorate: i32,
    /// `minGroupCount` (1 for basic).
    pub min: i32,
}

/// One gang: a root group, its owning job and its child groups.
#[derive(Clone, Debug, PartialEq)]
pub struct Gang {
    /// What it is.
    pub kind: GangKind,
    /// Namespace.
    pub namespace: String,
    /// Name of the group.
    pub name: String,
    /// The MusterJob or MusterJobSet it belongs to (none for a bring-your-own group).
    pub owner: Option<Owner>,
    /// When the group was made.
    pub created: Option<Timestamp>,
    /// muster's `status.phase` (none for native groups, and before the first status).
    pub group_phase: Option<GroupPhase>,
    /// muster's `status.reason`, the word admission gives for why it waits or failed (none
    /// for native groups, and once all is well).
    pub group_reason: Option<String>,
    /// The verdict: muster's `Admitted` condition, kube-scheduler's `*InitiallyScheduled`.
    pub verdict: Option<Condition>,
    /// Why it is where it is: muster's `status.message`, or the verdict's message.
    pub message: String,
    /// Its pods.
    pub pods: PodCounts,
    /// A composite's quorum.
    pub groups: Option<GroupCounts>,
    /// Its child groups, for `why`.
    pub children: Vec<Gang>,
}

impl Gang {
    /// Where the gang stands: the job's word first (suspended, invalid, done), then the
    /// group's own phase (muster's) or kube-scheduler's verdict (native).
    pub fn phase(&self) -> Phase {
        if let Some(says) = self.owner.as_ref().and_then(|o| o.says.as_ref()) {
            return says.phase;
        }
        match self.kind {
            GangKind::PodGroup | GangKind::CompositePodGroup => match self.group_phase {
                None | Some(GroupPhase::Pending) => Phase::Waiting,
                Some(GroupPhase::Unschedulable) => Phase::Unschedulable,
                Some(GroupPhase::Admitted) => Phase::Admitted,
                Some(GroupPhase::Running) => Phase::Running,
                Some(GroupPhase::Succeeded) => Phase::Finished,
                Some(GroupPhase::Failed) => Phase::Failed,
            },
            GangKind::NativePodGroup | GangKind::NativeCompositePodGroup => self.native_phase(),
        }
    }

    fn native_phase(&self) -> Phase {
        let p = &self.pods;
        match &self.verdict {
            Some(c) if c.status == "True" => {
                if p.running > 0 {
                    Phase::Running
                } else if p.live == 0 && p.succeeded >= p.min.max(1) {
                    Phase::Finished
                } else {
                    Phase::Admitted
                }
            }
            Some(c) if c.reason == "Unschedulable" => Phase::Unschedulable,
            Some(_) => Phase::Waiting,
            // kube-scheduler may write no verdict on a composite: its children's say.
            None if !self.children.is_empty() => {
                let phases: Vec<Phase> = self.children.iter().map(Gang::phase).collect();
                let started = |ph: &Phase| matches!(ph, Phase::Admitted | Phase::Running | Phase::Finished);
                if phases.contains(&Phase::Unschedulable) {
                    Phase::Unschedulable
                } else if !phases.iter().all(started) {
                    Phase::Waiting
                } else if phases.contains(&Phase::Running) {
                    Phase::Running
                } else if phases.iter().all(|ph| *ph == Phase::Finished) {
                    Phase::Finished
                } else {
                    Phase::Admitted
                }
            }
            None => Phase::Waiting,
        }
    }

    /// Why, in a word or two: for a gang that does not fit, the per-node reason that kept it
    /// out (`Insufficient nvidia.com/gpu`); otherwise the reason of the job's or the group's
    /// verdict (`WaitingForQuorum`, `JobSuspended`, `BindTimeout`); `-` for a gang that is fine.
    pub fn reason(&self) -> String {
        if let Some(says) = self.owner.as_ref().and_then(|o| o.says.as_ref()) {
            return says.reason.clone();
        }
        let phase = self.phase();
        if matches!(phase, Phase::Unschedulable | Phase::Waiting | Phase::Failed) {
            // muster's own word first; a native group's is read from kube-scheduler's message.
            if let Some(reason) = self.group_reason.as_ref().filter(|r| !r.is_empty()) {
                return reason.clone();
            }
            if let Some(top) = top_reason(&self.message) {
                return top;
            }
        }
        if matches!(phase, Phase::Unschedulable) {
            for child in &self.children {
                if let Some(top) = top_reason(&child.message) {
                    return top;
                }
            }
        }
        let verdict = self.verdict.as_ref().map(|c| c.reason.as_str()).filter(|r| !r.is_empty());
        match (phase, verdict) {
            // The usual verdicts of a gang that started say nothing the phase does not.
            (Phase::Admitted | Phase::Running | Phase::Finished, Some("Admitted" | "Scheduled")) => "-".into(),
            (_, Some(reason)) => reason.into(),
            (Phase::Waiting, None) if self.pods.live < self.pods.min => "WaitingForQuorum".into(),
            _ => "-".into(),
        }
    }

    /// How long the gang has waited, while it waits (Waiting, Unschedulable): since its
    /// verdict turned False (so a gang that started and fell back counts from then), or since
    /// the group was made.
    pub fn waiting(&self, now: Timestamp) -> Option<Duration> {
        if !matches!(self.phase(), Phase::Waiting | Phase::Unschedulable) {
            return None;
        }
        let since = match &self.verdict {
            Some(c) if c.status == "False" => Some(c.last_transition_time.0),
            _ => self.created,
        }?;
        Some(now.duration_since(since).try_into().unwrap_or(Duration::ZERO))
    }

    /// The row `list` prints.
    pub fn row(&self, now: Timestamp) -> Row {
        Row {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            job: self.owner.as_ref().map_or_else(|| "-".into(), |o| format!("{}/{}", o.kind, o.name)),
            phase: self.phase().to_string(),
            pods: format!("{}/{}", self.pods.bound, self.pods.min),
            waiting: self.waiting(now).map_or_else(|| "-".into(), human),
            reason: shorten(&self.reason(), REASON_WIDTH),
        }
    }
}

/// The widest REASON `list` prints (longer ones end in `...`; `why` has them whole).
const REASON_WIDTH: usize = 60;

fn shorten(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_string();
    }
    let cut: String = s.chars().take(width.saturating_sub(3)).collect();
    format!("{cut}...")
}

/// A duration as `kubectl` shows ages, to the two largest units: `45s`, `3m12s`, `2h5m`, `3d4h`.
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    let (days, hours, minutes, seconds) = (s / 86_400, s / 3_600 % 24, s / 60 % 60, s % 60);
    match () {
        _ if days > 0 => format!("{days}d{hours}h"),
        _ if s >= 3_600 => format!("{}h{minutes}m", s / 3_600),
        _ if s >= 60 => format!("{}m{seconds}s", s / 60),
        _ => format!("{s}s"),
    }
}

/// One line of `list`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// NAMESPACE.
    pub namespace: String,
    /// NAME: the root group.
    pub name: String,
    /// KIND/JOB: the owning MusterJob or MusterJobSet, `-` for none.
    pub job: String,
    /// PHASE.
    pub phase: String,
    /// PODS: bound/min.
    pub pods: String,
    /// WAITING.
    pub waiting: String,
    /// REASON.
    pub reason: String,
}

/// The rows as a fixed-width table, `kubectl get`'s way: upper-case headers, columns three
/// spaces apart, NAMESPACE only when listing every namespace.
pub fn table(rows: &[Row], all_namespaces: bool) -> String {
    let mut lines: Vec<Vec<&str>> = vec![vec!["NAMESPACE", "NAME", "KIND/JOB", "PHASE", "PODS", "WAITING", "REASON"]];
    for r in rows {
        lines.push(vec![&r.namespace, &r.name, &r.job, &r.phase, &r.pods, &r.waiting, &r.reason]);
    }
    if !all_namespaces {
        for line in &mut lines {
            line.remove(0);
        }
    }
    let columns = lines[0].len();
    let widths: Vec<usize> =
        (0..columns).map(|i| lines.iter().map(|l| l[i].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for line in &lines {
        let mut text = String::new();
        for (i, cell) in line.iter().enumerate() {
            text.push_str(cell);
            if i + 1 < columns {
                text.push_str(&" ".repeat(widths[i] - cell.chars().count() + 3));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    }
    out
}

// === building gangs from objects ===

fn name_of(meta: &ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

fn namespace_of(meta: &ObjectMeta) -> String {
    meta.namespace.clone().unwrap_or_default()
}

fn condition(conditions: &[Condition], type_: &str) -> Option<Condition> {
    conditions.iter().find(|c| c.type_ == type_).cloned()
}

fn said(phase: Phase, conditions: &[Condition], type_: &str, fallback: &str) -> Option<JobSays> {
    let c = condition(conditions, type_).filter(|c| c.status == "True");
    Some(JobSays {
        phase,
        reason: c.as_ref().map(|c| c.reason.clone()).filter(|r| !r.is_empty()).unwrap_or_else(|| fallback.into()),
        message: c.map(|c| c.message).unwrap_or_default(),
    })
}

/// What a MusterJob says of itself, where that decides its gang's phase.
pub fn job_says(job: &MusterJob) -> Option<JobSays> {
    let status = job.status.as_ref()?;
    let c = &status.conditions;
    match status.phase? {
        JobPhase::Suspended => said(Phase::Suspended, c, "Suspended", "JobSuspended"),
        JobPhase::Invalid => said(Phase::Invalid, c, "Invalid", "Invalid"),
        JobPhase::Complete => said(Phase::Finished, c, "Complete", "Completed"),
        JobPhase::Failed => said(Phase::Failed, c, "Failed", "Failed"),
        JobPhase::Pending | JobPhase::Running => None,
    }
}

/// What a MusterJobSet says of itself, where that decides its gang's phase.
pub fn set_says(set: &MusterJobSet) -> Option<JobSays> {
    let status = set.status.as_ref()?;
    let c = &status.conditions;
    match status.phase? {
        JobSetPhase::Suspended => said(Phase::Suspended, c, "Suspended", "JobSetSuspended"),
        JobSetPhase::Invalid => said(Phase::Invalid, c, "Invalid", "Invalid"),
        JobSetPhase::Completed => said(Phase::Finished, c, "Completed", "Completed"),
        JobSetPhase::Failed => said(Phase::Failed, c, "Failed", "Failed"),
        JobSetPhase::Pending | JobSetPhase::Running => None,
    }
}

/// The MusterJob or MusterJobSet among a group's owners (its controller first).
fn owner_of(meta: &ObjectMeta, objects: &Objects) -> Option<Owner> {
    let ns = namespace_of(meta);
    let mut refs: Vec<_> = meta.owner_references.iter().flatten().collect();
    refs.sort_by_key(|r| r.controller != Some(true));
    let owner = refs.into_iter().find(|r| matches!(r.kind.as_str(), "MusterJob" | "MusterJobSet"))?;
    let same = |m: &ObjectMeta| m.name.as_deref() == Some(owner.name.as_str()) && namespace_of(m) == ns;
    let says = match owner.kind.as_str() {
        "MusterJob" => objects.jobs.iter().find(|j| same(&j.metadata)).and_then(job_says),
        _ => objects.sets.iter().find(|s| same(&s.metadata)).and_then(set_says),
    };
    Some(Owner { kind: owner.kind.clone(), name: owner.name.clone(), says })
}

fn muster_leaf(pg: &PodGroup, objects: &Objects) -> Gang {
    let status = pg.status.clone().unwrap_or_default();
    let min = status.min_count.or(pg.spec.scheduling_policy.min_count()).unwrap_or(1);
    Gang {
        kind: GangKind::PodGroup,
        namespace: namespace_of(&pg.metadata),
        name: name_of(&pg.metadata),
        owner: owner_of(&pg.metadata, objects),
        created: pg.metadata.creation_timestamp.as_ref().map(|t| t.0),
        group_phase: status.phase,
        group_reason: status.reason.clone(),
        verdict: condition(&status.conditions, ADMITTED),
        message: status.message.unwrap_or_default(),
        pods: PodCounts {
            live: status.pods,
            gated: status.gated,
            bound: status.scheduled + status.succeeded,
            running: status.running,
            succeeded: status.succeeded,
            failed: status.failed,
            min,
        },
        groups: None,
        children: Vec::new(),
    }
}

fn muster_composite(cpg: &CompositePodGroup, objects: &Objects) -> Gang {
    let (ns, name) = (namespace_of(&cpg.metadata), name_of(&cpg.metadata));
    let under = |m: &ObjectMeta, parent: Option<&String>| namespace_of(m) == ns && parent == Some(&name);
    let mut children: Vec<Gang> = objects
        .composites
        .iter()
        .filter(|c| under(&c.metadata, c.spec.parent_composite_pod_group_name.as_ref()))
        .map(|c| muster_composite(c, objects))
        .collect();
    children.extend(
        objects
            .pod_groups
            .iter()
            .filter(|g| under(&g.metadata, g.spec.parent_composite_pod_group_name.as_ref()))
            .map(|g| muster_leaf(g, objects)),
    );
    children.sort_by(|a, b| a.name.cmp(&b.name));
    let status = cpg.status.clone().unwrap_or_default();
    Gang {
        kind: GangKind::CompositePodGroup,
        namespace: ns,
        name: name.clone(),
        owner: owner_of(&cpg.metadata, objects),
        created: cpg.metadata.creation_timestamp.as_ref().map(|t| t.0),
        group_phase: status.phase,
        group_reason: status.reason.clone(),
        verdict: condition(&status.conditions, ADMITTED),
        message: status.message.unwrap_or_default(),
        pods: summed(&children),
        groups: Some(GroupCounts {
            children: status.children,
            quorate: status.quorate_children,
            min: status.min_group_count.or(cpg.spec.scheduling_policy.min_group_count()).unwrap_or(1),
        }),
        children,
    }
}

fn summed(children: &[Gang]) -> PodCounts {
    let mut total = PodCounts::default();
    for c in children {
        total += c.pods;
    }
    total
}

/// Counts the pods that join native PodGroup `name` in `ns`.
fn native_pods(pods: &[Pod], ns: &str, name: &str, min: i32) -> PodCounts {
    let mut c = PodCounts { min, ..PodCounts::default() };
    let joins = |p: &&Pod| {
        namespace_of(&p.metadata) == ns
            && p.spec.as_ref().and_then(|s| s.scheduling_group.as_ref()).and_then(|g| g.pod_group_name.as_deref())
                == Some(name)
    };
    for pod in pods.iter().filter(joins) {
        let class = PodClass::of(pod);
        let gated = pod.spec.as_ref().and_then(|s| s.scheduling_gates.as_ref()).is_some_and(|g| !g.is_empty());
        match class.lifecycle {
            Lifecycle::Succeeded => {
                c.succeeded += 1;
                c.bound += 1;
            }
            Lifecycle::Failed => c.failed += 1,
            _ if class.terminating => {}
            lifecycle => {
                c.live += 1;
                c.gated += i32::from(gated);
                c.bound += i32::from(class.bound_node().is_some());
                c.running += i32::from(lifecycle == Lifecycle::Running);
            }
        }
    }
    c
}

fn native_leaf(pg: &v1beta1::PodGroup, objects: &Objects) -> Gang {
    let (ns, name) = (namespace_of(&pg.metadata), name_of(&pg.metadata));
    let min = pg.spec.scheduling_policy.gang.as_ref().map_or(1, |g| g.min_count);
    let verdict =
        pg.status.as_ref().and_then(|s| s.conditions.as_deref()).and_then(|c| condition(c, POD_GROUP_SCHEDULED));
    Gang {
        kind: GangKind::NativePodGroup,
        pods: native_pods(&objects.pods, &ns, &name, min),
        owner: owner_of(&pg.metadata, objects),
        created: pg.metadata.creation_timestamp.as_ref().map(|t| t.0),
        group_phase: None,
        group_reason: None,
        message: verdict.as_ref().map(|c| c.message.clone()).unwrap_or_default(),
        verdict,
        groups: None,
        children: Vec::new(),
        namespace: ns,
        name,
    }
}

fn native_composite(cpg: &v1alpha3::CompositePodGroup, objects: &Objects) -> Gang {
    let (ns, name) = (namespace_of(&cpg.metadata), name_of(&cpg.metadata));
    let under = |m: &ObjectMeta, parent: Option<&String>| namespace_of(m) == ns && parent == Some(&name);
    let mut children: Vec<Gang> = objects
        .native_composites
        .iter()
        .filter(|c| under(&c.metadata, c.spec.parent_composite_pod_group_name.as_ref()))
        .map(|c| native_composite(c, objects))
        .collect();
    children.extend(
        objects
            .native_groups
            .iter()
            .filter(|g| under(&g.metadata, g.spec.parent_composite_pod_group_name.as_ref()))
            .map(|g| native_leaf(g, objects)),
    );
    children.sort_by(|a, b| a.name.cmp(&b.name));
    let verdict =
        cpg.status.as_ref().and_then(|s| s.conditions.as_deref()).and_then(|c| condition(c, COMPOSITE_SCHEDULED));
    let min = cpg.spec.scheduling_policy.gang.as_ref().map_or(1, |g| g.min_group_count);
    Gang {
        kind: GangKind::NativeCompositePodGroup,
        owner: owner_of(&cpg.metadata, objects),
        created: cpg.metadata.creation_timestamp.as_ref().map(|t| t.0),
        group_phase: None,
        group_reason: None,
        message: verdict.as_ref().map(|c| c.message.clone()).unwrap_or_default(),
        verdict,
        pods: summed(&children),
        groups: Some(GroupCounts { children: children.len() as i32, quorate: 0, min }),
        children,
        namespace: ns,
        name,
    }
}

/// Every gang in `objects`: one per root group (muster's, then the native ones), each with
/// its owning job and its child groups, ordered by namespace and name.
pub fn gangs(objects: &Objects) -> Vec<Gang> {
    let mut out: Vec<Gang> = Vec::new();
    out.extend(
        objects
            .composites
            .iter()
            .filter(|c| c.spec.parent_composite_pod_group_name.is_none())
            .map(|c| muster_composite(c, objects)),
    );
    out.extend(
        objects
            .pod_groups
            .iter()
            .filter(|g| g.spec.parent_composite_pod_group_name.is_none())
            .map(|g| muster_leaf(g, objects)),
    );
    out.extend(
        objects
            .native_composites
            .iter()
            .filter(|c| c.spec.parent_composite_pod_group_name.is_none())
            .map(|c| native_composite(c, objects)),
    );
    out.extend(
        objects
            .native_groups
            .iter()
            .filter(|g| g.spec.parent_composite_pod_group_name.is_none())
            .map(|g| native_leaf(g, objects)),
    );
    out.sort_by(|a, b| (&a.namespace, &a.name, a.kind.upstream()).cmp(&(&b.namespace, &b.name, b.kind.upstream())));
    out
}

/// The `list` rows: one per gang, then one per MusterJob or MusterJobSet with no group of its
/// own (an invalid spec, a job just made), ordered by namespace and name. A MusterJobSet's
/// child jobs are in their set's gang.
pub fn rows(objects: &Objects, gangs: &[Gang], now: Timestamp) -> Vec<Row> {
    let has_gang = |kind: &str, meta: &ObjectMeta| {
        let (ns, name) = (namespace_of(meta), name_of(meta));
        let owns = |g: &&Gang| g.owner.as_ref().is_some_and(|o| o.kind == kind && o.name == name);
        gangs.iter().any(|g| g.namespace == ns && holds(g, &owns))
    };
    let mut rows: Vec<Row> = gangs.iter().map(|g| g.row(now)).collect();
    for job in &objects.jobs {
        let child = job.metadata.labels.as_ref().is_some_and(|l| l.contains_key(JOBSET_NAME_LABEL));
        if !child && !has_gang("MusterJob", &job.metadata) {
            rows.push(lone_row("MusterJob", &job.metadata, job_says(job), now));
        }
    }
    for set in objects.sets.iter().filter(|s| !has_gang("MusterJobSet", &s.metadata)) {
        rows.push(lone_row("MusterJobSet", &set.metadata, set_says(set), now));
    }
    rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    rows
}

/// The row of a job without a group: its own verdict, or waiting for muster to compile it.
fn lone_row(kind: &str, meta: &ObjectMeta, says: Option<JobSays>, now: Timestamp) -> Row {
    let (phase, reason) = says.map_or((Phase::Waiting, "NotCompiledYet".to_string()), |s| (s.phase, s.reason));
    let created = meta.creation_timestamp.as_ref().map(|t| t.0).filter(|_| phase == Phase::Waiting);
    Row {
        namespace: namespace_of(meta),
        name: name_of(meta),
        job: format!("{kind}/{}", name_of(meta)),
        phase: phase.to_string(),
        pods: "-".into(),
        waiting: created.and_then(|t| now.duration_since(t).try_into().ok()).map_or_else(|| "-".into(), human),
        reason,
    }
}

/// The gang a name given to `why` stands for, found in `gangs` (in one namespace): the gang of
/// the MusterJob or MusterJobSet of that name, else the root group of that name, else the root
/// whose tree holds a group of that name (a MusterJobSet's child). `kind` narrows the search
/// to jobs, sets or groups.
pub fn find<'a>(gangs: &'a [Gang], kind: Target, name: &str) -> Option<&'a Gang> {
    let owned = |g: &&Gang| {
        g.owner.as_ref().is_some_and(|o| {
            o.name == name
                && match kind {
                    Target::Any => true,
                    Target::Job => o.kind == "MusterJob",
                    Target::JobSet => o.kind == "MusterJobSet",
                    Target::Group => false,
                }
        })
    };
    let by_job =
        gangs.iter().find(owned).or_else(|| gangs.iter().find(|g| g.children.iter().any(|c| holds(c, &owned))));
    if by_job.is_some() || matches!(kind, Target::Job | Target::JobSet) {
        return by_job;
    }
    gangs.iter().find(|g| g.name == name).or_else(|| gangs.iter().find(|g| holds(g, &|c: &&Gang| c.name == name)))
}

fn holds(gang: &Gang, test: &dyn Fn(&&Gang) -> bool) -> bool {
    test(&gang) || gang.children.iter().any(|c| holds(c, test))
}

/// What a name given on the command line names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Whatever has that name: a job, a set, a group.
    Any,
    /// A MusterJob.
    Job,
    /// A MusterJobSet.
    JobSet,
    /// A PodGroup or CompositePodGroup (muster's or native).
    Group,
}

impl Target {
    /// Splits `kind/name` (`mjob/train`, `musterjobset/ray`, `mpg/kv-cache`) as kubectl takes it;
    /// a bare name is [`Target::Any`]. `None` for a kind the plugin does not know.
    pub fn parse(arg: &str) -> Option<(Target, &str)> {
        let Some((kind, name)) = arg.split_once('/') else { return Some((Target::Any, arg)) };
        let kind = kind.split('.').next().unwrap_or_default().to_ascii_lowercase();
        let target = match kind.as_str() {
            "musterjob" | "musterjobs" | "mjob" => Target::Job,
            "musterjobset" | "musterjobsets" | "mjobset" => Target::JobSet,
            "podgroup" | "podgroups" | "mpg" | "compositepodgroup" | "compositepodgroups" | "mcpg" => Target::Group,
            _ => return None,
        };
        Some((target, name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use muster_api::PodGroupSpec;
    use muster_api::blocks::{DisruptionMode, PodGroupSchedulingPolicy};
    use muster_api::scheduling::{CompositePodGroupStatus, PodGroupStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
    use serde_json::json;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).expect("ts")
    }

    fn cond(type_: &str, status: &str, reason: &str, message: &str, secs: i64) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: Time(at(secs)),
            observed_generation: None,
        }
    }

    fn owned_by(kind: &str, name: &str) -> Vec<OwnerReference> {
        vec![OwnerReference {
            api_version: "batch.muster.dev/v1alpha1".into(),
            kind: kind.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            controller: Some(true),
            ..Default::default()
        }]
    }

    fn group(name: &str, min: i32, status: PodGroupStatus) -> PodGroup {
        let mut g = PodGroup::new(
            name,
            PodGroupSpec {
                scheduling_policy: PodGroupSchedulingPolicy::gang(Some(min)),
                disruption_mode: DisruptionMode::single(),
                ..Default::default()
            },
        );
        g.metadata.namespace = Some("ns".into());
        g.metadata.creation_timestamp = Some(Time(at(0)));
        g.metadata.owner_references = Some(owned_by("MusterJob", name));
        g.status = Some(status);
        g
    }

    fn status(phase: GroupPhase, admitted: Condition, message: &str, pods: (i32, i32, i32)) -> PodGroupStatus {
        let (live, scheduled, running) = pods;
        PodGroupStatus {
            phase: Some(phase),
            pods: live,
            gated: live - scheduled,
            scheduled,
            running,
            conditions: vec![admitted],
            message: Some(message.into()),
            ..Default::default()
        }
    }

    fn job(name: &str, phase: JobPhase, conditions: Vec<Condition>) -> MusterJob {
        let mut j: MusterJob = serde_json::from_value(json!({
            "apiVersion": "batch.muster.dev/v1alpha1", "kind": "MusterJob",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"template": {"spec": {"containers": []}}},
        }))
        .expect("job");
        j.status = Some(muster_api::batch::MusterJobStatus { phase: Some(phase), conditions, ..Default::default() });
        j
    }

    const TOO_BIG: &str = "4/40 nodes fit 17 pods of group \"too-big\" (only 4 placeable, minCount 17): \
                           36 node(s) didn't match Pod's node affinity/selector, 4 Insufficient nvidia.com/gpu";

    #[test]
    fn phases_and_reasons_come_from_the_job_first_then_the_group() {
        let now = at(192);
        let cases = [
            (
                "a gang that does not fit names the per-node reason, not the node selector",
                group(
                    "too-big",
                    17,
                    status(
                        GroupPhase::Unschedulable,
                        cond(ADMITTED, "False", "Unschedulable", TOO_BIG, 0),
                        TOO_BIG,
                        (17, 0, 0),
                    ),
                ),
                vec![],
                ("Unschedulable", "0/17", "3m12s", "Insufficient nvidia.com/gpu"),
            ),
            (
                "a gang that does not fit, with admission's own word for why",
                group(
                    "wide",
                    9,
                    PodGroupStatus {
                        reason: Some("InsufficientCapacity".into()),
                        ..status(
                            GroupPhase::Unschedulable,
                            cond(ADMITTED, "False", "Unschedulable", TOO_BIG, 0),
                            TOO_BIG,
                            (9, 0, 0),
                        )
                    },
                ),
                vec![],
                ("Unschedulable", "0/9", "3m12s", "InsufficientCapacity"),
            ),
            (
                "a gang short of its quorum waits for it",
                group(
                    "short",
                    3,
                    status(
                        GroupPhase::Pending,
                        cond(ADMITTED, "False", "WaitingForQuorum", "waiting for quorum", 60),
                        "waiting for quorum: group \"short\" has 1 pod(s), needs 3",
                        (1, 0, 0),
                    ),
                ),
                vec![],
                ("Waiting", "0/3", "2m12s", "WaitingForQuorum"),
            ),
            (
                "a running gang has nothing to say",
                group(
                    "train",
                    2,
                    status(GroupPhase::Running, cond(ADMITTED, "True", "Admitted", "placed", 5), "placed", (2, 2, 2)),
                ),
                vec![],
                ("Running", "2/2", "-", "-"),
            ),
            (
                "an admitted gang that lost its binds says so",
                group(
                    "lost",
                    2,
                    status(
                        GroupPhase::Failed,
                        cond(ADMITTED, "False", "BindTimeout", "pod lost-0 was not bound", 5),
                        "pod lost-0 was not bound to node n within 30s; 1 of 2 planned pod(s) unbound",
                        (2, 1, 0),
                    ),
                ),
                vec![],
                ("Failed", "1/2", "-", "BindTimeout"),
            ),
            (
                "a suspended job's gang is suspended, whatever the group says",
                group(
                    "paused",
                    2,
                    status(GroupPhase::Pending, cond(ADMITTED, "False", "WaitingForQuorum", "", 5), "", (0, 0, 0)),
                ),
                vec![job("paused", JobPhase::Suspended, vec![cond("Suspended", "True", "JobSuspended", "", 9)])],
                ("Suspended", "0/2", "-", "JobSuspended"),
            ),
            (
                "a completed job's gang is finished",
                group(
                    "done",
                    1,
                    PodGroupStatus { phase: Some(GroupPhase::Succeeded), succeeded: 2, ..Default::default() },
                ),
                vec![job("done", JobPhase::Complete, vec![cond("Complete", "True", "Completed", "2/2", 9)])],
                ("Finished", "2/1", "-", "Completed"),
            ),
            (
                "a group without status yet waits since it was made",
                group("new", 2, PodGroupStatus::default()),
                vec![],
                ("Waiting", "0/2", "3m12s", "WaitingForQuorum"),
            ),
        ];
        for (case, pg, jobs, (phase, pods, waiting, reason)) in cases {
            let objects = Objects { pod_groups: vec![pg], jobs, ..Default::default() };
            let gangs = gangs(&objects);
            assert_eq!(gangs.len(), 1, "{case}");
            let row = gangs[0].row(now);
            assert_eq!(
                (row.phase.as_str(), row.pods.as_str(), row.waiting.as_str(), row.reason.as_str()),
                (phase, pods, waiting, reason),
                "{case}"
            );
        }
    }

    #[test]
    fn a_composite_is_one_gang_with_its_groups_and_the_set_as_its_job() {
        let mut cpg = CompositePodGroup::new(
            "ray",
            muster_api::CompositePodGroupSpec {
                scheduling_policy: muster_api::blocks::CompositePodGroupSchedulingPolicy::gang(Some(2)),
                disruption_mode: DisruptionMode::single(),
                ..Default::default()
            },
        );
        cpg.metadata.namespace = Some("ns".into());
        cpg.metadata.owner_references = Some(owned_by("MusterJobSet", "ray"));
        cpg.status = Some(CompositePodGroupStatus {
            phase: Some(GroupPhase::Running),
            children: 2,
            quorate_children: 2,
            min_group_count: Some(2),
            conditions: vec![cond(ADMITTED, "True", "Admitted", "placed", 0)],
            ..Default::default()
        });
        let child = |name: &str, min: i32, pods: i32| {
            let mut g = group(
                name,
                min,
                status(GroupPhase::Running, cond(ADMITTED, "True", "Admitted", "", 0), "", (pods, pods, pods)),
            );
            g.spec.parent_composite_pod_group_name = Some("ray".into());
            g
        };
        let objects = Objects {
            composites: vec![cpg],
            pod_groups: vec![child("ray-driver-0", 1, 1), child("ray-workers-0", 4, 4)],
            ..Default::default()
        };
        let gangs = gangs(&objects);
        assert_eq!(gangs.len(), 1, "children are not gangs of their own");
        let row = gangs[0].row(at(0));
        assert_eq!((row.job.as_str(), row.phase.as_str(), row.pods.as_str()), ("MusterJobSet/ray", "Running", "5/5"));
        assert_eq!(gangs[0].children.len(), 2);
        assert_eq!(find(&gangs, Target::Any, "ray-workers-0").map(|g| g.name.as_str()), Some("ray"), "a child's root");
        assert_eq!(find(&gangs, Target::JobSet, "ray").map(|g| g.name.as_str()), Some("ray"));
        assert!(find(&gangs, Target::JobSet, "ray-workers-0").is_none());
    }

    fn native(name: &str, min: i32, verdict: Option<Condition>) -> v1beta1::PodGroup {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "creationTimestamp": "2027-01-15T08:00:00Z"},
            "spec": {"schedulingPolicy": {"gang": {"minCount": min}}},
            "status": {"conditions": verdict.into_iter().collect::<Vec<_>>()},
        }))
        .expect("native PodGroup")
    }

    fn native_pod(name: &str, group: &str, node: Option<&str>, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"containers": [], "nodeName": node, "schedulingGroup": {"podGroupName": group}},
            "status": {"phase": phase},
        }))
        .expect("pod")
    }

    #[test]
    fn native_groups_read_kube_schedulers_verdict_and_their_pods() {
        let unschedulable =
            "0/6 nodes are available: 2 Insufficient nvidia.com/gpu, 4 node(s) had untolerated taint {a: b}.";
        let objects = Objects {
            native_groups: vec![
                native("kv", 3, Some(cond(POD_GROUP_SCHEDULED, "True", "Scheduled", "", 0))),
                native("big", 3, Some(cond(POD_GROUP_SCHEDULED, "False", "Unschedulable", unschedulable, 0))),
                native("fresh", 2, None),
            ],
            pods: vec![
                native_pod("kv-0", "kv", Some("n1"), "Running"),
                native_pod("kv-1", "kv", Some("n1"), "Running"),
                native_pod("kv-2", "kv", Some("n2"), "Pending"),
                native_pod("big-0", "big", None, "Pending"),
            ],
            ..Default::default()
        };
        let rows: Vec<Row> = gangs(&objects).iter().map(|g| g.row(at(60))).collect();
        let by = |n: &str| rows.iter().find(|r| r.name == n).cloned().expect("row");
        assert_eq!(
            (by("kv").phase.as_str(), by("kv").pods.as_str(), by("kv").reason.as_str()),
            ("Running", "3/3", "-")
        );
        assert_eq!(
            (by("big").phase.as_str(), by("big").pods.as_str(), by("big").waiting.as_str(), by("big").reason.as_str()),
            ("Unschedulable", "0/3", "1m0s", "Insufficient nvidia.com/gpu")
        );
        assert_eq!((by("fresh").phase.as_str(), by("fresh").job.as_str()), ("Waiting", "-"));
    }

    #[test]
    fn a_job_without_a_group_has_a_row_of_its_own_but_a_sets_child_does_not() {
        let mut invalid = job("bad", JobPhase::Invalid, vec![cond("Invalid", "True", "InvalidScheduling", "bad", 0)]);
        invalid.metadata.creation_timestamp = Some(Time(at(0)));
        let mut fresh = job("fresh", JobPhase::Pending, vec![]);
        fresh.metadata.creation_timestamp = Some(Time(at(0)));
        let mut child = job("ray-workers-0", JobPhase::Pending, vec![]);
        child.metadata.labels = Some([(JOBSET_NAME_LABEL.to_string(), "ray".to_string())].into());
        let with_group = job("train", JobPhase::Running, vec![]);
        let objects = Objects {
            jobs: vec![invalid, fresh, child, with_group],
            pod_groups: vec![group("train", 1, PodGroupStatus::default())],
            ..Default::default()
        };
        let rows = rows(&objects, &gangs(&objects), at(5));
        let seen: Vec<(&str, &str, &str, &str)> =
            rows.iter().map(|r| (r.name.as_str(), r.phase.as_str(), r.waiting.as_str(), r.reason.as_str())).collect();
        assert_eq!(
            seen,
            [
                ("bad", "Invalid", "-", "InvalidScheduling"),
                ("fresh", "Waiting", "5s", "NotCompiledYet"),
                ("train", "Waiting", "5s", "WaitingForQuorum"),
            ]
        );
    }

    #[test]
    fn durations_read_like_kubectl_ages() {
        let cases =
            [(0, "0s"), (45, "45s"), (60, "1m0s"), (192, "3m12s"), (3_600, "1h0m"), (7_500, "2h5m"), (273_600, "3d4h")];
        for (secs, want) in cases {
            assert_eq!(human(Duration::from_secs(secs)), want, "{secs}s");
        }
    }

    #[test]
    fn the_table_aligns_columns_and_shows_namespaces_only_for_all() {
        let row = |ns: &str, name: &str, reason: &str| Row {
            namespace: ns.into(),
            name: name.into(),
            job: format!("MusterJob/{name}"),
            phase: "Waiting".into(),
            pods: "0/2".into(),
            waiting: "5s".into(),
            reason: reason.into(),
        };
        let rows = [row("a", "train", "-"), row("bb", "too-big", "Insufficient nvidia.com/gpu")];
        assert_eq!(
            table(&rows, false),
            "NAME      KIND/JOB            PHASE     PODS   WAITING   REASON\n\
             train     MusterJob/train     Waiting   0/2    5s        -\n\
             too-big   MusterJob/too-big   Waiting   0/2    5s        Insufficient nvidia.com/gpu\n"
        );
        assert!(table(&rows, true).starts_with("NAMESPACE   NAME      KIND/JOB"));
        assert_eq!(shorten(&"x".repeat(70), 60).len(), 60);
    }

    #[test]
    fn names_take_kubectls_kind_prefixes() {
        assert_eq!(Target::parse("train"), Some((Target::Any, "train")));
        assert_eq!(Target::parse("mjob/train"), Some((Target::Job, "train")));
        assert_eq!(Target::parse("musterjobsets.batch.muster.dev/ray"), Some((Target::JobSet, "ray")));
        assert_eq!(Target::parse("mpg/kv"), Some((Target::Group, "kv")));
        assert_eq!(Target::parse("deployment/x"), None);
    }
}

//! The `list` table: a row per gang and per job without a group, its durations as `kubectl`
//! shows ages, and the rows rendered `kubectl get`'s way.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;

use super::build::{Objects, name_of, namespace_of};
use super::gang::{Gang, Phase, holds};
use super::owner::{JobSays, job_says, set_says};
use muster_api::JOBSET_NAME_LABEL;

impl Gang {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gangs::fixtures::{at, cond, group, job};
    use crate::gangs::gangs;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use muster_api::batch::JobPhase;
    use muster_api::scheduling::PodGroupStatus;

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
}

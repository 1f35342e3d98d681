//! PURE: why a gang is where it is, in words: its verdict, the quorum shortfall, or the
//! placement tally (how many nodes failed for each reason) read back from the message
//! admission wrote (`0/40 nodes fit 8 pods of group "train": 32 Insufficient nvidia.com/gpu, ...`,
//! see `scheduler::explain`) or kube-scheduler's (`0/6 nodes are available: ...`), and the
//! recent Warning events. No client and no clock.

use std::fmt::Write as _;

use k8s_openapi::jiff::Timestamp;

use super::gangs::{Gang, Owner, Phase, human};

/// kube-scheduler's words (and muster's) for nodes a pod's selector or required affinity
/// excludes: they say where the gang may not go, not why it does not fit where it may.
const NODE_AFFINITY: &str = "node(s) didn't match Pod's node affinity/selector";

/// One placement tally: `<fit>/<nodes> nodes ...: <n> <reason>, <n> <reason>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tally {
    /// Nodes that could take a pod.
    pub fit: u32,
    /// Nodes considered.
    pub nodes: u32,
    /// The words before the reasons (`4/40 nodes fit 17 pods of group "too-big" (...)`).
    pub head: String,
    /// Nodes per reason, as written (muster's: most common first).
    pub reasons: Vec<(u32, String)>,
}

/// A part of a message: a tally, or other words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Part {
    /// A placement tally.
    Tally(Tally),
    /// Anything else (a quorum shortfall, a topology verdict, a note).
    Text(String),
}

/// A message cut into its parts: muster's are joined by `; `, kube-scheduler's sentences end
/// with `. `.
pub fn parts(message: &str) -> Vec<Part> {
    let mut out = Vec::new();
    for piece in message.split("; ").map(str::trim).filter(|p| !p.is_empty()) {
        let mut rest = piece;
        while !rest.is_empty() {
            match tally(rest) {
                Some((t, after)) => {
                    out.push(Part::Tally(t));
                    rest = after;
                }
                None => {
                    out.push(Part::Text(rest.to_string()));
                    rest = "";
                }
            }
        }
    }
    out
}

/// Reads a tally at the start of `text`; returns it and the words after it.
fn tally(text: &str) -> Option<(Tally, &str)> {
    let (count, rest) = text.split_once(' ')?;
    let (fit, nodes) = count.split_once('/')?;
    let (fit, nodes) = (fit.parse().ok()?, nodes.parse().ok()?);
    if !rest.starts_with("nodes") {
        return None;
    }
    let Some((head, tail)) = text.split_once(": ") else {
        return Some((Tally { fit, nodes, head: text.trim_end_matches('.').to_string(), reasons: Vec::new() }, ""));
    };
    let (list, after) = match tail.find(". ") {
        Some(i) => (&tail[..i], tail[i + 2..].trim()),
        None => (tail.trim_end_matches('.'), ""),
    };
    let reasons = reasons(list)?;
    Some((Tally { fit, nodes, head: head.to_string(), reasons }, after))
}

/// `4 Insufficient nvidia.com/gpu, 36 node(s) didn't match ...`; a reason holding `, ` stays
/// whole (the next reason starts with its count).
fn reasons(list: &str) -> Option<Vec<(u32, String)>> {
    let mut out: Vec<(u32, String)> = Vec::new();
    for item in list.split(", ") {
        let counted = item.split_once(' ').and_then(|(n, r)| Some((n.parse::<u32>().ok()?, r)));
        match (counted, out.last_mut()) {
            (Some((n, reason)), _) => out.push((n, reason.to_string())),
            (None, Some((_, reason))) => {
                reason.push_str(", ");
                reason.push_str(item);
            }
            (None, None) => return None,
        }
    }
    Some(out)
}

/// The per-node reason that kept a gang out, from the first tally of its message with any:
/// the most common one that is not the node selector (`Insufficient nvidia.com/gpu`); with
/// only the selector left, `InsufficientCapacity` when some nodes fit pods (just not all of
/// them), the selector's words when none did. `None` without a tally.
pub fn top_reason(message: &str) -> Option<String> {
    parts(message).into_iter().find_map(|p| match p {
        Part::Tally(t) if !t.reasons.is_empty() => Some(match t.reasons.iter().find(|(_, r)| r != NODE_AFFINITY) {
            Some((_, r)) => r.clone(),
            None if t.fit > 0 => "InsufficientCapacity".into(),
            None => t.reasons[0].1.clone(),
        }),
        _ => None,
    })
}

/// A recent event, as `why` prints it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// `Warning` or `Normal`.
    pub type_: String,
    /// Its reason.
    pub reason: String,
    /// `Kind/name` of the object it is about.
    pub object: String,
    /// Its message.
    pub message: String,
    /// When it last happened.
    pub at: Option<Timestamp>,
}

/// How many events `why` prints (the most recent).
const EVENTS: usize = 10;

/// Why the gang is where it is: what it is and whose, its phase and for how long, its pods
/// (and child groups), the verdict with each tally's per-node reasons on lines of their own,
/// its child groups, and the most recent Warning events.
pub fn explain(gang: &Gang, events: &[Event], now: Timestamp) -> String {
    let mut out = String::new();
    let phase = gang.phase();
    let whose = gang.owner.as_ref().map(|o| format!(", of {} {}", o.kind, o.name)).unwrap_or_default();
    let admitter = if gang.kind.upstream() { "kube-scheduler" } else { "muster" };
    let _ = writeln!(
        out,
        "Gang:      {} {}{whose} (namespace {}, admitted by {admitter})",
        gang.kind.resource(),
        gang.name,
        gang.namespace
    );
    let waited = gang.waiting(now).map(|d| format!(" for {}", human(d))).unwrap_or_default();
    let verdict =
        gang.verdict.as_ref().map(|c| format!(" ({}={} {})", c.type_, c.status, c.reason)).unwrap_or_default();
    let _ = writeln!(out, "Phase:     {phase}{waited}{verdict}");
    let p = &gang.pods;
    let _ = writeln!(
        out,
        "Pods:      {} bound of {} needed; {} exist, {} gated, {} running, {} succeeded, {} failed",
        p.bound, p.min, p.live, p.gated, p.running, p.succeeded, p.failed
    );
    if let Some(g) = &gang.groups {
        let quorate = if gang.kind.upstream() { String::new() } else { format!(", {} quorate", g.quorate) };
        let _ = writeln!(out, "Groups:    {} child group(s){quorate}, needs {}", g.children, g.min);
    }
    let says = gang.owner.as_ref().and_then(|o| o.says.as_ref());
    match says {
        Some(s) => why_job(&mut out, gang.owner.as_ref(), s.phase, &s.reason, &s.message),
        None if phase == Phase::Waiting && gang.message.is_empty() && p.live < p.min => {
            let _ = writeln!(out, "Why:       waiting for quorum: {} of {} pod(s) exist", p.live, p.min);
        }
        None if gang.message.is_empty() => {
            let _ = writeln!(out, "Why:       {}", if phase == Phase::Waiting { "no verdict yet" } else { "-" });
        }
        None => why_message(&mut out, &gang.message),
    }
    if !gang.children.is_empty() {
        let _ = writeln!(out, "Groups of the gang:");
        let rows: Vec<_> = gang.children.iter().map(|c| c.row(now)).collect();
        for line in super::gangs::table(&rows, false).lines() {
            let _ = writeln!(out, "  {line}");
        }
        // A child's own tally, where the root's message does not already hold it.
        for child in gang.children.iter().filter(|c| !c.message.is_empty() && !gang.message.contains(&c.message)) {
            if matches!(child.phase(), Phase::Unschedulable | Phase::Waiting) {
                let _ = writeln!(out, "Group {}:", child.name);
                why_message(&mut out, &child.message);
            }
        }
    }
    out.push_str(&warnings(events, now));
    out
}

/// The most recent Warning events, oldest first, one a line; the same reason and message about
/// several objects (a PodGroup and its MusterJob, a gang's pods) once, at its latest, with the
/// count of the other objects.
fn warnings(events: &[Event], now: Timestamp) -> String {
    let mut sorted: Vec<&Event> = events.iter().filter(|e| e.type_ == "Warning").collect();
    sorted.sort_by_key(|e| e.at);
    let mut merged: Vec<(Event, usize)> = Vec::new();
    for e in sorted {
        match merged.iter().position(|(m, _)| m.reason == e.reason && m.message == e.message) {
            Some(i) => {
                let (mut same, others) = merged.remove(i);
                let more = if same.object == e.object { others } else { others + 1 };
                same.object.clone_from(&e.object);
                same.at = e.at;
                merged.push((same, more));
            }
            None => merged.push((e.clone(), 0)),
        }
    }
    let recent = &merged[merged.len().saturating_sub(EVENTS)..];
    if recent.is_empty() {
        return "Events:    no recent Warning events\n".into();
    }
    let ago = |(e, _): &(Event, usize)| {
        e.at.and_then(|t| now.duration_since(t).try_into().ok())
            .map_or_else(|| "?".into(), |d| format!("{} ago", human(d)))
    };
    let object = |(e, more): &(Event, usize)| {
        if *more > 0 { format!("{} (+{more})", e.object) } else { e.object.clone() }
    };
    let width = |f: &dyn Fn(&(Event, usize)) -> String| recent.iter().map(|e| f(e).chars().count()).max().unwrap_or(0);
    let (wa, wo, wr) = (width(&ago), width(&object), width(&|(e, _)| e.reason.clone()));
    let mut out = String::from("Warning events (oldest first):\n");
    for line in recent {
        let _ =
            writeln!(out, "  {:wa$}   {:wo$}   {:wr$}   {}", ago(line), object(line), line.0.reason, line.0.message);
    }
    out
}

/// A job's own verdict (suspended, invalid, finished, failed) and what to do about it.
fn why_job(out: &mut String, owner: Option<&Owner>, phase: Phase, reason: &str, message: &str) {
    let job = owner.map(|o| format!("{} {}", o.kind, o.name)).unwrap_or_default();
    let message = if message.is_empty() { String::new() } else { format!(": {message}") };
    let _ = writeln!(out, "Why:       {job} is {}, reason {reason}{message}", phase.to_string().to_lowercase());
    if phase == Phase::Suspended
        && let Some(o) = owner
    {
        let _ = writeln!(out, "           (spec.suspend is true; `kubectl muster resume {}` starts it again)", o.name);
    }
}

/// A verdict's message: each tally's head, then one line per reason with its node count; the
/// other parts as written.
fn why_message(out: &mut String, message: &str) {
    let mut first = true;
    for part in parts(message) {
        let label = if first { "Why:       " } else { "           " };
        first = false;
        match part {
            Part::Text(t) => {
                let _ = writeln!(out, "{label}{t}");
            }
            Part::Tally(t) => {
                let colon = if t.reasons.is_empty() { "" } else { ", per node:" };
                let _ = writeln!(out, "{label}{}{colon}", t.head);
                let width = t.reasons.iter().map(|(n, _)| n.to_string().len()).max().unwrap_or(0);
                for (n, reason) in &t.reasons {
                    let _ = writeln!(out, "             {n:>width$}  {reason}");
                }
            }
        }
    }
}

/// `why` for a MusterJob or MusterJobSet that has no group (yet): an invalid spec, a job just
/// made, or a MusterJob without the API's objects.
pub fn explain_job(owner: &Owner, namespace: &str, events: &[Event], now: Timestamp) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Job:       {} {} (namespace {namespace}) has no PodGroup or CompositePodGroup yet",
        owner.kind, owner.name
    );
    match &owner.says {
        Some(s) => why_job(&mut out, Some(owner), s.phase, &s.reason, &s.message),
        None => {
            let _ = writeln!(out, "Why:       not compiled yet (is muster running?)");
        }
    }
    out.push_str(&warnings(events, now));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gangs::{ADMITTED, GangKind, GroupCounts, JobSays, PodCounts};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use muster_api::scheduling::GroupPhase;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).expect("ts")
    }

    #[test]
    fn tallies_are_read_from_muster_and_kube_scheduler_messages() {
        let cases: [(&str, &str, Vec<Part>); 5] = [
            (
                "muster's tally, most common reason first",
                "4/40 nodes fit 17 pods of group \"too-big\" (only 4 placeable, minCount 17): 36 node(s) didn't match \
                 Pod's node affinity/selector, 4 Insufficient nvidia.com/gpu",
                vec![Part::Tally(Tally {
                    fit: 4,
                    nodes: 40,
                    head: "4/40 nodes fit 17 pods of group \"too-big\" (only 4 placeable, minCount 17)".into(),
                    reasons: vec![(36, NODE_AFFINITY.into()), (4, "Insufficient nvidia.com/gpu".into())],
                })],
            ),
            (
                "a composite's verdict, then its child's tally; a taint's words keep their colon",
                "composite group \"ray\": 1 of 2 child groups fit, minGroupCount 2; 0/4 nodes fit 4 pods of group \
                 \"ray-workers-0\": 4 node(s) had untolerated taint {dedicated: infra}",
                vec![
                    Part::Text("composite group \"ray\": 1 of 2 child groups fit, minGroupCount 2".into()),
                    Part::Tally(Tally {
                        fit: 0,
                        nodes: 4,
                        head: "0/4 nodes fit 4 pods of group \"ray-workers-0\"".into(),
                        reasons: vec![(4, "node(s) had untolerated taint {dedicated: infra}".into())],
                    }),
                ],
            ),
            (
                "kube-scheduler's sentences",
                "0/6 nodes are available: 2 Insufficient nvidia.com/gpu, 4 node(s) didn't match Pod's node \
                 affinity/selector. preemption: not helpful.",
                vec![
                    Part::Tally(Tally {
                        fit: 0,
                        nodes: 6,
                        head: "0/6 nodes are available".into(),
                        reasons: vec![(2, "Insufficient nvidia.com/gpu".into()), (4, NODE_AFFINITY.into())],
                    }),
                    Part::Text("preemption: not helpful.".into()),
                ],
            ),
            (
                "a reason holding a comma stays whole",
                "0/2 nodes fit 1 pod of group \"g\": 2 claim \"a\" has no device, nor a template",
                vec![Part::Tally(Tally {
                    fit: 0,
                    nodes: 2,
                    head: "0/2 nodes fit 1 pod of group \"g\"".into(),
                    reasons: vec![(2, "claim \"a\" has no device, nor a template".into())],
                })],
            ),
            (
                "a quorum shortfall is no tally",
                "waiting for quorum: group \"g\" has 1 pod(s), needs 3",
                vec![Part::Text("waiting for quorum: group \"g\" has 1 pod(s), needs 3".into())],
            ),
        ];
        for (case, message, want) in cases {
            assert_eq!(parts(message), want, "{case}");
        }
    }

    #[test]
    fn the_top_reason_skips_the_node_selector() {
        let cases = [
            (
                "4/40 nodes fit 17 pods of group \"g\": 36 node(s) didn't match Pod's node affinity/selector, 4 Insufficient nvidia.com/gpu",
                Some("Insufficient nvidia.com/gpu"),
            ),
            (
                "2/40 nodes fit 8 pods of group \"g\" (only 2 placeable, minCount 8): 38 node(s) didn't match Pod's node affinity/selector",
                Some("InsufficientCapacity"),
            ),
            (
                "0/40 nodes fit 8 pods of group \"g\": 40 node(s) didn't match Pod's node affinity/selector",
                Some(NODE_AFFINITY),
            ),
            (
                "composite group \"c\": 0 of 2 child groups fit; 0/4 nodes fit 2 pods of group \"a\": 4 Too many pods",
                Some("Too many pods"),
            ),
            ("waiting for quorum: group \"g\" has 1 pod(s), needs 3", None),
            ("", None),
        ];
        for (message, want) in cases {
            assert_eq!(top_reason(message).as_deref(), want, "{message}");
        }
    }

    fn gang(message: &str, phase: GroupPhase) -> Gang {
        Gang {
            kind: GangKind::PodGroup,
            namespace: "ns".into(),
            name: "too-big".into(),
            owner: Some(Owner { kind: "MusterJob".into(), name: "too-big".into(), says: None }),
            created: Some(at(0)),
            group_phase: Some(phase),
            group_reason: None,
            verdict: Some(Condition {
                type_: ADMITTED.into(),
                status: "False".into(),
                reason: "Unschedulable".into(),
                message: message.into(),
                last_transition_time: Time(at(0)),
                observed_generation: None,
            }),
            message: message.into(),
            pods: PodCounts { live: 17, gated: 17, min: 17, ..Default::default() },
            groups: None,
            children: Vec::new(),
        }
    }

    #[test]
    fn why_names_each_per_node_reason_and_the_recent_warnings() {
        let message = "4/40 nodes fit 17 pods of group \"too-big\" (only 4 placeable, minCount 17): 36 node(s) didn't \
                       match Pod's node affinity/selector, 4 Insufficient nvidia.com/gpu";
        let events = [
            Event {
                type_: "Normal".into(),
                reason: "SuccessfulCreate".into(),
                object: "MusterJob/too-big".into(),
                message: "created pod".into(),
                at: Some(at(1)),
            },
            Event {
                type_: "Warning".into(),
                reason: "Unschedulable".into(),
                object: "MusterJob/too-big".into(),
                message: message.into(),
                at: Some(at(1)),
            },
            Event {
                type_: "Warning".into(),
                reason: "Unschedulable".into(),
                object: "PodGroup/too-big".into(),
                message: message.into(),
                at: Some(at(2)),
            },
        ];
        let text = explain(&gang(message, GroupPhase::Unschedulable), &events, at(192));
        let want = "\
Gang:      podgroup.scheduling.muster.dev too-big, of MusterJob too-big (namespace ns, admitted by muster)
Phase:     Unschedulable for 3m12s (Admitted=False Unschedulable)
Pods:      0 bound of 17 needed; 17 exist, 17 gated, 0 running, 0 succeeded, 0 failed
Why:       4/40 nodes fit 17 pods of group \"too-big\" (only 4 placeable, minCount 17), per node:
             36  node(s) didn't match Pod's node affinity/selector
              4  Insufficient nvidia.com/gpu
Warning events (oldest first):
  3m10s ago   PodGroup/too-big (+1)   Unschedulable   4/40 nodes fit 17 pods";
        assert!(text.starts_with(want), "{text}");
        assert!(!text.contains("SuccessfulCreate"), "only warnings: {text}");
    }

    #[test]
    fn why_says_what_the_job_says_and_a_quorum_shortfall() {
        let mut g = gang("", GroupPhase::Pending);
        g.verdict = None;
        g.pods = PodCounts { live: 1, gated: 1, min: 3, ..Default::default() };
        let text = explain(&g, &[], at(10));
        assert!(text.contains("Why:       waiting for quorum: 1 of 3 pod(s) exist"), "{text}");
        assert!(text.contains("Events:    no recent Warning events"), "{text}");

        g.owner = Some(Owner {
            kind: "MusterJob".into(),
            name: "too-big".into(),
            says: Some(JobSays {
                phase: Phase::Suspended,
                reason: "JobSuspended".into(),
                message: "the job is suspended".into(),
            }),
        });
        let text = explain(&g, &[], at(10));
        assert!(text.contains("Phase:     Suspended\n"), "{text}");
        assert!(text.contains("MusterJob too-big is suspended, reason JobSuspended: the job is suspended"), "{text}");
        assert!(text.contains("kubectl muster resume too-big"), "{text}");

        let owner = Owner {
            kind: "MusterJob".into(),
            name: "bad".into(),
            says: Some(JobSays {
                phase: Phase::Invalid,
                reason: "InvalidScheduling".into(),
                message: "spec.scheduling: bad".into(),
            }),
        };
        let text = explain_job(&owner, "ns", &[], at(0));
        assert!(text.contains("MusterJob bad is invalid, reason InvalidScheduling: spec.scheduling: bad"), "{text}");
        assert!(text.ends_with("Events:    no recent Warning events\n"), "{text}");
    }

    #[test]
    fn why_lists_a_composites_groups() {
        let mut root =
            gang("composite group \"ray\": 1 of 2 child groups fit, minGroupCount 2", GroupPhase::Unschedulable);
        root.kind = GangKind::CompositePodGroup;
        root.name = "ray".into();
        root.groups = Some(GroupCounts { children: 2, quorate: 2, min: 2 });
        let child = |name: &str, message: &str, phase| Gang {
            name: name.into(),
            children: Vec::new(),
            groups: None,
            ..gang(message, phase)
        };
        root.children = vec![
            child("ray-driver-0", "", GroupPhase::Pending),
            child(
                "ray-workers-0",
                "0/4 nodes fit 4 pods of group \"ray-workers-0\": 4 Insufficient nvidia.com/gpu",
                GroupPhase::Unschedulable,
            ),
        ];
        let text = explain(&root, &[], at(5));
        assert!(text.contains("Groups:    2 child group(s), 2 quorate, needs 2"), "{text}");
        assert!(text.contains("Groups of the gang:\n  NAME "), "{text}");
        assert!(text.contains("Group ray-workers-0:\nWhy:       0/4 nodes fit 4 pods"), "{text}");
        assert!(text.contains("\n             4  Insufficient nvidia.com/gpu\n"), "{text}");
    }
}

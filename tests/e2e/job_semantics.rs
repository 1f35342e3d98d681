//! Job semantics, side by side: the same manifest as a batch/v1 Job and as a MusterJob.
//!
//! Each scenario ([`scenarios::all`]) is one JobSpec, run at the same time as a batch/v1 Job
//! (kube-controller-manager's Job controller) and as a MusterJob (muster's job controller),
//! each in a namespace of its own, on kwok nodes. The pods of both get the same scripted
//! outcomes ([`driver`]): exit codes, `DisruptionTarget` conditions, deletions, evictions,
//! container restarts, node loss. Steps (spec patches, waits on the job's own status,
//! snapshots) run on each side at its own pace; node changes wait for both sides and happen
//! once. When both jobs have finished (or, for scenarios that observe, after
//! a while), their statuses are compared field by field: succeeded, failed, active, ready,
//! terminating, completedIndexes, failedIndexes, and the Job conditions (type, status, reason,
//! message with pod names and namespaces blanked out). The batch/v1 Job is the reference; each
//! scenario also says how the Job must end, so a scenario that no longer proves what it claims
//! fails too.
//!
//! The table goes to stderr and to `target/job-differential.txt`; a longer report with the
//! batch/v1 values (the reference) to `target/job-differential.md`. The test fails when a
//! scenario differs and is not listed in [`KNOWN_DIFFERENCES`].
//! `MUSTER_JOB_DIFF=a,b` runs only the scenarios whose names contain one of the words;
//! `MUSTER_JOB_DIFF_CONCURRENCY` (default 16) bounds how many run at once.

mod driver;
mod scenarios;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use muster::crds::MusterJob;
use muster_dev::FakeGpuNodes;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::harness::manager::muster;
use crate::harness::{TestNamespace, add_gpu_nodes, client, cluster, namespace};
use driver::Driver;
use scenarios::{End, Scenario, Step};

/// Scenarios whose difference is understood and accepted, with the reason. Keep it empty.
const KNOWN_DIFFERENCES: &[(&str, &str)] = &[];

/// The label that pins a scenario's pods to its own nodes (value: the scenario's name).
const NODE_LABEL: &str = "e2e.muster.dev/job-diff";
/// How long a job may take to finish.
const FINISH: Duration = Duration::from_secs(180);
/// How long the MusterJob may take to finish after the Job did.
const AFTER_REFERENCE: Duration = Duration::from_secs(60);
/// How long a step may wait for pods.
const STEP: Duration = Duration::from_secs(90);
/// The Job condition types compared (muster's own conditions are not).
const JOB_CONDITIONS: [&str; 5] = ["FailureTarget", "SuccessCriteriaMet", "Complete", "Failed", "Suspended"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Job,
    MusterJob,
}

/// One side of a scenario.
struct Side {
    kind: Kind,
    ns: TestNamespace,
    jobs: Api<DynamicObject>,
    pods: Api<Pod>,
    /// Compared values, by field (`snapshot <label> <field>` for snapshots).
    values: BTreeMap<String, String>,
    /// What went wrong on this side's way (a refused create or patch, a step timing out).
    notes: Vec<String>,
}

/// The job's name on both sides.
const NAME: &str = "diff";

fn manifest(kind: Kind, s: &Scenario) -> Value {
    let mut spec = s.spec.clone();
    if s.pinned {
        let pin = json!({"template": {"spec": {
            "nodeSelector": {NODE_LABEL: s.name},
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
        }}});
        crate::gangs::merge(&mut spec, pin);
    }
    match kind {
        Kind::Job => json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": NAME}, "spec": spec}),
        Kind::MusterJob => {
            if s.gang {
                crate::gangs::merge(&mut spec, json!({"scheduling": {"schedulingPolicy": {"gang": {}}}}));
            }
            json!({"apiVersion": "batch.muster.dev/v1alpha1", "kind": "MusterJob", "metadata": {"name": NAME}, "spec": spec})
        }
    }
}

async fn new_side(kind: Kind, s: &Scenario) -> Side {
    let prefix = format!("jd-{}-{}", s.name, if kind == Kind::Job { "j" } else { "m" });
    let ns = tokio::task::spawn_blocking(move || namespace(&prefix)).await.expect("namespace");
    let c = client().await;
    let resource = match kind {
        Kind::Job => ApiResource::erase::<Job>(&()),
        Kind::MusterJob => ApiResource::erase::<MusterJob>(&()),
    };
    Side {
        kind,
        jobs: Api::namespaced_with(c.clone(), &ns.name, &resource),
        pods: Api::namespaced(c, &ns.name),
        ns,
        values: BTreeMap::new(),
        notes: Vec::new(),
    }
}

fn status_of(obj: &DynamicObject) -> Value {
    obj.data.get("status").cloned().unwrap_or(Value::Null)
}

fn count(status: &Value, field: &str) -> String {
    status.get(field).and_then(Value::as_i64).unwrap_or(0).to_string()
}

fn text(status: &Value, field: &str) -> String {
    match status.get(field).and_then(Value::as_str) {
        None | Some("") => "-".into(),
        Some(s) => s.to_string(),
    }
}

/// `message` with the side's pod names and namespace blanked out.
fn blank(message: &str, ns: &str, pods: &[String]) -> String {
    let mut out = message.replace(ns, "<ns>");
    let mut names: Vec<&String> = pods.iter().collect();
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    for n in names {
        out = out.replace(n.as_str(), "<pod>");
    }
    out
}

/// The Job conditions of `status`, each `Type=Status reason "message"`, in a fixed order.
fn conditions(status: &Value, ns: &str, pods: &[String]) -> String {
    let list = status.get("conditions").and_then(Value::as_array).cloned().unwrap_or_default();
    let mut out: Vec<String> = list
        .iter()
        .filter(|c| c["type"].as_str().is_some_and(|t| JOB_CONDITIONS.contains(&t)))
        .map(|c| {
            let message = blank(c["message"].as_str().unwrap_or_default(), ns, pods);
            format!(
                "{}={} {} {:?}",
                c["type"].as_str().unwrap_or_default(),
                c["status"].as_str().unwrap_or_default(),
                c["reason"].as_str().unwrap_or_default(),
                message
            )
        })
        .collect();
    out.sort_by_key(|c| JOB_CONDITIONS.iter().position(|t| c.starts_with(&format!("{t}="))));
    if out.is_empty() { "-".into() } else { out.join(", ") }
}

/// How the job ended: `Complete`, `Failed reason`, or `running`.
fn ending(status: &Value) -> String {
    let list = status.get("conditions").and_then(Value::as_array).cloned().unwrap_or_default();
    let done = |t: &str| list.iter().find(|c| c["type"] == t && c["status"] == "True");
    if let Some(c) = done("Complete") {
        return format!("Complete {}", c["reason"].as_str().unwrap_or_default());
    }
    if let Some(c) = done("Failed") {
        return format!("Failed {}", c["reason"].as_str().unwrap_or_default());
    }
    "running".into()
}

/// The compared fields of `status`.
fn summary(status: &Value, ns: &str, pods: &[String]) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    m.insert("ending".into(), ending(status));
    for f in ["succeeded", "failed", "active", "ready", "terminating"] {
        m.insert(f.into(), count(status, f));
    }
    for f in ["completedIndexes", "failedIndexes"] {
        m.insert(f.into(), text(status, f));
    }
    m.insert("conditions".into(), conditions(status, ns, pods));
    m
}

async fn get_status(side: &Side) -> Option<Value> {
    side.jobs.get_opt(NAME).await.ok().flatten().map(|o| status_of(&o))
}

async fn wait_pods(side: &Side, n: usize) -> bool {
    let deadline = Instant::now() + STEP;
    while Instant::now() < deadline {
        if let Ok(list) = side.pods.list(&Default::default()).await {
            let running = list
                .items
                .iter()
                .filter(|p| {
                    p.metadata.deletion_timestamp.is_none()
                        && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                })
                .count();
            if running >= n {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    false
}

/// When the reference (the Job) was seen finished.
type Finished = std::sync::Mutex<Option<Instant>>;

/// Waits until the job finished and its last counts landed; its status then. Gives up after
/// `timeout`, or [`AFTER_REFERENCE`] after `reference` was seen finished; records in `mine`
/// when it saw this job finished.
async fn wait_finished(side: &Side, timeout: Duration, mine: &Finished, reference: &Finished) -> Option<Value> {
    let deadline = Instant::now() + timeout;
    let given_up = || {
        let seen = *reference.lock().expect("finished");
        Instant::now() >= deadline || seen.is_some_and(|t| t.elapsed() >= AFTER_REFERENCE)
    };
    while !given_up() {
        if let Some(status) = get_status(side).await
            && ending(&status) != "running"
        {
            *mine.lock().expect("finished") = Some(Instant::now());
            // Let the last counts land (pods terminated by the ending).
            let mut last = status;
            let settle = Instant::now() + Duration::from_secs(15);
            while Instant::now() < settle {
                let Some(s) = get_status(side).await else { break };
                last = s;
                if ["active", "terminating", "ready"].iter().all(|f| count(&last, f) == "0") {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            return Some(get_status(side).await.unwrap_or(last));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    None
}

fn node_spec(s: &Scenario, suffix: &str) -> FakeGpuNodes {
    FakeGpuNodes {
        prefix: format!("jd-{}-{suffix}-", s.name),
        count: 1,
        taint: true,
        labels: vec![(NODE_LABEL.into(), s.name.into())],
        ..FakeGpuNodes::default()
    }
}

fn node_name(s: &Scenario, suffix: &str) -> String {
    format!("jd-{}-{suffix}-0", s.name)
}

fn delete_node(name: String) {
    let _ = cluster().kubectl(&["delete", "node", &name, "--wait=false", "--ignore-not-found"]);
}

/// Runs one step on one side.
async fn step_on(side: &mut Side, step: &Step, pods: &[String]) {
    match step {
        Step::WaitRunning(n) => {
            if !wait_pods(side, *n).await {
                side.notes.push(format!("{n} pods not running within {STEP:?}"));
            }
        }
        Step::Sleep(secs) => tokio::time::sleep(Duration::from_secs(*secs)).await,
        Step::Until(what, check) => {
            let deadline = Instant::now() + STEP;
            loop {
                if get_status(side).await.is_some_and(|s| check(&s)) {
                    break;
                }
                if Instant::now() >= deadline {
                    side.notes.push(format!("status never {what} within {STEP:?}"));
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Step::Snapshot(label) => {
            let status = get_status(side).await.unwrap_or(Value::Null);
            for (k, v) in summary(&status, &side.ns.name, pods) {
                side.values.insert(format!("{label}: {k}"), v);
            }
        }
        Step::Patch(patch) => {
            let patch = json!({"spec": patch});
            if let Err(e) = side.jobs.patch(NAME, &PatchParams::default(), &Patch::Merge(&patch)).await {
                side.notes.push(format!("patch {patch} refused: {e}"));
            }
        }
        Step::AddNode(_) | Step::DeleteNode(_) => {}
    }
}

async fn steps_on(side: &mut Side, steps: &[Step], driver: &Driver) {
    for step in steps {
        step_on(side, step, &driver.names()).await;
    }
}

/// The result of one scenario.
struct Outcome {
    name: &'static str,
    covers: &'static str,
    /// Fields that differ: (field, job, musterjob).
    differences: Vec<(String, String, String)>,
    /// The batch/v1 Job's values (the reference).
    reference: BTreeMap<String, String>,
    /// The Job did not end as the scenario says it must.
    bad_reference: Option<String>,
    notes: Vec<String>,
    seconds: f64,
}

async fn run(s: Scenario) -> Outcome {
    let began = Instant::now();
    let (mut job, mut mj) = tokio::join!(new_side(Kind::Job, &s), new_side(Kind::MusterJob, &s));
    for node in &s.nodes {
        add_gpu_nodes(&node_spec(&s, node)).await;
    }
    for side in [&mut job, &mut mj] {
        let body: DynamicObject = serde_json::from_value(manifest(side.kind, &s)).expect("manifest");
        if let Err(e) = side.jobs.create(&PostParams::default(), &body).await {
            side.notes.push(format!("create refused: {e}"));
        }
    }
    let drivers = [Driver::start(job.pods.clone(), s.script.clone()), Driver::start(mj.pods.clone(), s.script.clone())];

    // Each side runs its steps at its own pace; node changes (shared) wait for both sides.
    for segment in s.steps.split_inclusive(|st| matches!(st, Step::AddNode(_) | Step::DeleteNode(_))) {
        let (own, shared) = match segment.split_last() {
            Some((last @ (Step::AddNode(_) | Step::DeleteNode(_)), rest)) => (rest, Some(last)),
            _ => (segment, None),
        };
        tokio::join!(steps_on(&mut job, own, &drivers[0]), steps_on(&mut mj, own, &drivers[1]));
        match shared {
            Some(Step::AddNode(suffix)) => {
                add_gpu_nodes(&node_spec(&s, suffix)).await;
            }
            Some(Step::DeleteNode(suffix)) => {
                let name = node_name(&s, suffix);
                tokio::task::spawn_blocking(move || delete_node(name)).await.expect("delete node");
            }
            _ => {}
        }
    }

    let mut finals = [None, None];
    match s.end {
        End::Finish | End::Deleted => {
            // The MusterJob gets at most a minute more than the reference.
            let (job_done, mj_done, never) = (Finished::default(), Finished::default(), Finished::default());
            let (a, b) = tokio::join!(
                wait_finished(&job, FINISH, &job_done, &never),
                wait_finished(&mj, FINISH, &mj_done, &job_done)
            );
            for (side, status) in [(&mut job, &a), (&mut mj, &b)] {
                if status.is_none() {
                    side.notes.push(format!("not finished within {FINISH:?} nor {AFTER_REFERENCE:?} after the Job"));
                }
            }
            finals = [a, b];
        }
        End::Observe(secs) => tokio::time::sleep(Duration::from_secs(secs)).await,
    }
    let [dj, dm] = drivers;
    let (job_pods, job_errors) = dj.stop().await;
    let (mj_pods, mj_errors) = dm.stop().await;
    job.notes.extend(job_errors);
    mj.notes.extend(mj_errors);
    let [job_final, mj_final] = finals;
    for (side, pods, last) in [(&mut job, &job_pods, job_final), (&mut mj, &mj_pods, mj_final)] {
        let status = match last {
            Some(s) => Some(s),
            None => get_status(side).await,
        };
        let status_text = status.as_ref().map(|s| summary(s, &side.ns.name, pods));
        if let Some(fields) = status_text {
            side.values.extend(fields);
        }
        if matches!(s.end, End::Observe(_)) {
            side.values.insert("pods created".into(), pods.len().to_string());
            let empty = status.as_ref().is_none_or(|s| s.is_null() || s.as_object().is_some_and(|o| o.is_empty()));
            side.values.insert("status written".into(), (!empty).to_string());
        }
    }
    if s.end == End::Deleted {
        let deadline = Instant::now() + Duration::from_secs(30);
        let (mut job_gone, mut mj_gone) = (false, false);
        while Instant::now() < deadline && !(job_gone && mj_gone) {
            job_gone = job.jobs.get_opt(NAME).await.is_ok_and(|o| o.is_none());
            mj_gone = mj.jobs.get_opt(NAME).await.is_ok_and(|o| o.is_none());
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        job.values.insert("deleted after ttl".into(), job_gone.to_string());
        mj.values.insert("deleted after ttl".into(), mj_gone.to_string());
    }
    for suffix in &s.nodes {
        let name = node_name(&s, suffix);
        tokio::task::spawn_blocking(move || delete_node(name)).await.expect("delete node");
    }
    for step in &s.steps {
        if let Step::AddNode(suffix) = step {
            let name = node_name(&s, suffix);
            tokio::task::spawn_blocking(move || delete_node(name)).await.expect("delete node");
        }
    }

    let keys: BTreeSet<&String> = job.values.keys().chain(mj.values.keys()).collect();
    let missing = "(none)".to_string();
    let mut differences: Vec<(String, String, String)> = keys
        .into_iter()
        .filter_map(|k| {
            let (a, b) = (job.values.get(k).unwrap_or(&missing), mj.values.get(k).unwrap_or(&missing));
            (a != b).then(|| (k.clone(), a.clone(), b.clone()))
        })
        .collect();
    // A side that could not do what the scenario asks differs too.
    if !job.notes.is_empty() || !mj.notes.is_empty() {
        differences.push(("notes".into(), job.notes.join("; "), mj.notes.join("; ")));
    }
    let ending = job.values.get("ending").cloned().unwrap_or_default();
    let bad_reference = (!ending.starts_with(s.job_ends) || !job.notes.is_empty()).then(|| {
        format!("the batch/v1 Job ended {ending:?} (notes: {:?}), the scenario expects {:?}", job.notes, s.job_ends)
    });
    let mut notes = Vec::new();
    notes.extend(job.notes.iter().map(|n| format!("job: {n}")));
    notes.extend(mj.notes.iter().map(|n| format!("musterjob: {n}")));
    Outcome {
        name: s.name,
        covers: s.covers,
        differences,
        reference: job.values,
        bad_reference,
        notes,
        seconds: began.elapsed().as_secs_f64(),
    }
}

fn write_report(outcomes: &[Outcome]) -> (String, String) {
    let agree = outcomes.iter().filter(|o| o.differences.is_empty()).count();
    let mut table = String::new();
    let width = outcomes.iter().map(|o| o.name.len()).max().unwrap_or(10);
    for o in outcomes {
        if o.differences.is_empty() {
            let _ = writeln!(table, "{:<width$}  agree", o.name);
        } else {
            let diffs: Vec<String> =
                o.differences.iter().map(|(f, a, b)| format!("{f} job={a} musterjob={b}")).collect();
            let _ = writeln!(table, "{:<width$}  DIFFER: {}", o.name, diffs.join(" | "));
        }
    }
    let _ = writeln!(table, "job differential: {agree}/{} scenarios agree", outcomes.len());

    let mut md = String::new();
    let _ = writeln!(md, "# Job differential: batch/v1 Job vs MusterJob\n");
    let _ = writeln!(md, "**{agree}/{} scenarios agree.**\n", outcomes.len());
    let _ = writeln!(md, "| scenario | covers | result |\n|---|---|---|");
    for o in outcomes {
        let result =
            if o.differences.is_empty() { "agree".to_string() } else { format!("DIFFER ({})", o.differences.len()) };
        let _ = writeln!(md, "| {} | {} | {} |", o.name, o.covers, result);
    }
    for o in outcomes {
        let _ = writeln!(md, "\n## {} ({:.0}s)\n\ncovers: {}\n", o.name, o.seconds, o.covers);
        if let Some(bad) = &o.bad_reference {
            let _ = writeln!(md, "**scenario broken**: {bad}\n");
        }
        if o.differences.is_empty() {
            let _ = writeln!(md, "agree\n");
        } else {
            let _ = writeln!(md, "| field | batch/v1 Job | MusterJob |\n|---|---|---|");
            for (f, a, b) in &o.differences {
                let _ = writeln!(md, "| {f} | `{a}` | `{b}` |");
            }
            let _ = writeln!(md);
        }
        let _ = writeln!(md, "batch/v1 Job (reference):\n");
        for (k, v) in &o.reference {
            let _ = writeln!(md, "- {k}: `{v}`");
        }
        for n in &o.notes {
            let _ = writeln!(md, "- note: {n}");
        }
    }
    (table, md)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn job_and_musterjob_end_in_the_same_status() {
    let _muster = muster().await;
    let only: Option<Vec<String>> =
        std::env::var("MUSTER_JOB_DIFF").ok().map(|s| s.split(',').map(|w| w.trim().to_string()).collect());
    let selected: Vec<Scenario> = scenarios::all()
        .into_iter()
        .filter(|s| only.as_ref().is_none_or(|words| words.iter().any(|w| s.name.contains(w.as_str()))))
        .collect();
    assert!(!selected.is_empty(), "no scenario matches MUSTER_JOB_DIFF={only:?}");
    let order: Vec<&'static str> = selected.iter().map(|s| s.name).collect();
    // The slow ones (node loss: pod GC waits 40 s) first; a bounded number at once, so that the
    // control plane (and kwok) keep up on a small machine.
    let mut selected = selected;
    selected.sort_by_key(|s| !s.pinned);
    let concurrency = std::env::var("MUSTER_JOB_DIFF_CONCURRENCY").ok().and_then(|v| v.parse().ok()).unwrap_or(16);
    let limit = Arc::new(Semaphore::new(concurrency));
    let began = Instant::now();
    let outcomes = futures::future::join_all(selected.into_iter().map(|s| {
        let limit = limit.clone();
        async move {
            let _permit = limit.acquire_owned().await.expect("semaphore");
            run(s).await
        }
    }))
    .await;
    let mut outcomes = outcomes;
    outcomes.sort_by_key(|o| order.iter().position(|n| *n == o.name));
    let (table, md) = write_report(&outcomes);
    eprintln!("{table}(in {:.0}s)", began.elapsed().as_secs_f64());
    let target = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
    let _ = std::fs::write(target.join("job-differential.txt"), &table);
    let _ = std::fs::write(target.join("job-differential.md"), &md);

    let broken: Vec<String> =
        outcomes.iter().filter_map(|o| o.bad_reference.as_ref().map(|b| format!("{}: {b}", o.name))).collect();
    assert!(broken.is_empty(), "scenarios that no longer prove what they claim:\n{}", broken.join("\n"));
    let unexplained: Vec<&str> = outcomes
        .iter()
        .filter(|o| !o.differences.is_empty() && !KNOWN_DIFFERENCES.iter().any(|(n, _)| *n == o.name))
        .map(|o| o.name)
        .collect();
    assert!(unexplained.is_empty(), "MusterJob differs from batch/v1 Job in {unexplained:?}:\n{table}");
}

/// The scenarios are well formed and, together, set every field of batch/v1 JobSpec.
#[test]
fn scenarios_cover_every_jobspec_field() {
    let all = scenarios::all();
    assert!(all.len() >= 25, "{} scenarios", all.len());
    let names: BTreeSet<&str> = all.iter().map(|s| s.name).collect();
    assert_eq!(names.len(), all.len(), "scenario names are unique");
    let mut used = BTreeSet::new();
    for s in &all {
        assert!(s.name.len() <= 30 && s.name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'));
        // Every key is a JobSpec field (no typo silently ignored by a test).
        let spec: JobSpec = serde_json::from_value(s.spec.clone()).unwrap_or_else(|e| panic!("{}: {e}", s.name));
        let back = serde_json::to_value(&spec).expect("JobSpec");
        for key in s.spec.as_object().expect("spec object").keys() {
            assert!(back.get(key).is_some(), "{}: spec.{key} is no JobSpec field", s.name);
            used.insert(key.clone());
        }
        for step in &s.steps {
            if let Step::Patch(p) = step {
                used.extend(p.as_object().expect("patch object").keys().cloned());
            }
        }
    }
    let every = [
        "activeDeadlineSeconds",
        "backoffLimit",
        "backoffLimitPerIndex",
        "completionMode",
        "completions",
        "managedBy",
        "manualSelector",
        "maxFailedIndexes",
        "parallelism",
        "podFailurePolicy",
        "podReplacementPolicy",
        "selector",
        "successPolicy",
        "suspend",
        "template",
        "ttlSecondsAfterFinished",
    ];
    let missing: Vec<&str> = every.iter().copied().filter(|f| !used.contains(*f)).collect();
    assert!(missing.is_empty(), "JobSpec fields no scenario sets: {missing:?}");
}

//! The scenarios: one JobSpec each (the MusterJob gets the same, plus a gang for `gang-*`),
//! the pods' scripted outcomes, steps run in lockstep on both sides, and how the batch/v1 Job
//! must end (so that a scenario which stops proving what it says fails).
//!
//! Timing: the Job controller waits 10 s, 20 s, ... before it replaces a failed pod, so
//! scenarios that fail pods keep the number of failures small.

use serde_json::{Value, json};

use super::driver::{Key, Outcome, Script, every, script};

/// A step. Each side runs its steps at its own pace; a node step waits for both sides and
/// runs once for the scenario.
#[derive(Clone)]
pub enum Step {
    /// Wait until the job's status satisfies the check (named by the text).
    Until(&'static str, fn(&Value) -> bool),
    /// Wait until this many pods run (not being deleted).
    WaitRunning(usize),
    /// Wait this many seconds.
    Sleep(u64),
    /// Record the status now, under this label.
    Snapshot(&'static str),
    /// Merge-patch the spec.
    Patch(Value),
    /// Add the scenario's node with this suffix (label `e2e.muster.dev/job-diff=<scenario>`).
    AddNode(&'static str),
    /// Delete the scenario's node with this suffix.
    DeleteNode(&'static str),
}

/// When a scenario's statuses are compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// Once both jobs finished (Complete or Failed).
    Finish,
    /// After this many seconds (jobs no controller runs).
    Observe(u64),
    /// Once both finished; then both must be deleted (ttlSecondsAfterFinished).
    Deleted,
}

pub struct Scenario {
    pub name: &'static str,
    /// The fields and behaviours it proves.
    pub covers: &'static str,
    /// The JobSpec (template included).
    pub spec: Value,
    pub script: Script,
    pub steps: Vec<Step>,
    pub end: End,
    /// The MusterJob gets `scheduling: {schedulingPolicy: {gang: {}}}`.
    pub gang: bool,
    /// Pods are pinned to the scenario's own nodes.
    pub pinned: bool,
    /// The scenario's nodes made before the jobs.
    pub nodes: Vec<&'static str>,
    /// How the batch/v1 Job ends (a prefix of `Complete <reason>`, `Failed <reason>`, `running`).
    pub job_ends: &'static str,
}

fn scenario(
    name: &'static str,
    covers: &'static str,
    fields: Value,
    script: Script,
    job_ends: &'static str,
) -> Scenario {
    let mut spec = json!({"template": {"spec": {
        "restartPolicy": "Never",
        "containers": [{"name": "main", "image": "registry.invalid/none"}],
    }}});
    crate::gangs::merge(&mut spec, fields);
    Scenario {
        name,
        covers,
        spec,
        script,
        steps: Vec::new(),
        end: End::Finish,
        gang: false,
        pinned: false,
        nodes: Vec::new(),
        job_ends,
    }
}

impl Scenario {
    fn steps(mut self, steps: Vec<Step>) -> Self {
        self.steps = steps;
        self
    }

    fn gang(mut self) -> Self {
        self.gang = true;
        self
    }

    fn end(mut self, end: End) -> Self {
        self.end = end;
        self
    }

    fn pinned(mut self, nodes: Vec<&'static str>) -> Self {
        self.pinned = true;
        self.nodes = nodes;
        self
    }
}

/// A count of a status (0 when unset).
fn n(status: &Value, field: &str) -> i64 {
    status.get(field).and_then(Value::as_i64).unwrap_or(0)
}

/// Whether the status has condition `type_` True.
fn has(status: &Value, type_: &str) -> bool {
    let list = status.get("conditions").and_then(Value::as_array);
    list.is_some_and(|l| l.iter().any(|c| c["type"] == type_ && c["status"] == "True"))
}

/// NonIndexed: the `n`-th pod created (0-based).
fn nth(k: Key) -> u32 {
    k.attempt
}

fn ignore_disruption() -> Value {
    json!({"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]})
}

fn on_exit(action: &str, operator: &str, values: &[i32]) -> Value {
    json!({"action": action, "onExitCodes": {"operator": operator, "values": values}})
}

/// Every scenario.
pub fn all() -> Vec<Scenario> {
    use Outcome::{Delete, Disrupt, Evict, Exit, Fail, Restarts, Run, Succeed};
    use Step::{AddNode, DeleteNode, Patch, Sleep, Snapshot, Until, WaitRunning};
    let indexed = |completions: i32, parallelism: i32| json!({"completionMode": "Indexed", "completions": completions, "parallelism": parallelism});
    let with = |mut base: Value, more: Value| {
        crate::gangs::merge(&mut base, more);
        base
    };
    vec![
        // --- Completions, parallelism, completion modes.
        scenario(
            "nonindexed-success",
            "completions, parallelism, completionMode NonIndexed (default), succeeded, CompletionsReached",
            json!({"completions": 3, "parallelism": 2}),
            every(Succeed("1s")),
            "Complete CompletionsReached",
        ),
        scenario(
            "indexed-success",
            "completionMode Indexed, completedIndexes, active and ready while running",
            indexed(4, 4),
            every(Succeed("10s")),
            "Complete CompletionsReached",
        )
        .steps(vec![Until("4 active and ready", |s| n(s, "active") == 4 && n(s, "ready") == 4), Snapshot("running")]),
        scenario(
            "parallelism-over-completions",
            "parallelism above completions: only as many pods as completions remain",
            json!({"completions": 2, "parallelism": 4}),
            // Long enough for the snapshot to come before the first success on a loaded machine.
            every(Succeed("12s")),
            "Complete CompletionsReached",
        )
        .steps(vec![
            Until("2 active and ready", |s| n(s, "active") == 2 && n(s, "ready") == 2),
            Sleep(1),
            Snapshot("running"),
        ]),
        scenario(
            "workqueue-success",
            "parallelism without completions (work queue: the first success completes the job)",
            json!({"parallelism": 2}),
            script(|k| if nth(k) == 0 { Succeed("1s") } else { Succeed("3s") }),
            "Complete CompletionsReached",
        ),
        // --- backoffLimit.
        scenario(
            "backoff-limit-exceeded",
            "backoffLimit, failed, BackoffLimitExceeded",
            json!({"backoffLimit": 1}),
            every(Fail(1, "1s")),
            "Failed BackoffLimitExceeded",
        ),
        scenario(
            "backoff-limit-zero",
            "backoffLimit 0: the first failure fails the job, the other active pod is terminated",
            json!({"backoffLimit": 0, "completions": 2, "parallelism": 2}),
            script(|k| if nth(k) == 0 { Fail(3, "1s") } else { Run }),
            "Failed BackoffLimitExceeded",
        ),
        scenario(
            "retry-then-success",
            "backoffLimit not reached: a failure is retried, the replacement succeeds",
            json!({"backoffLimit": 2}),
            script(|k| if nth(k) == 0 { Fail(1, "1s") } else { Succeed("1s") }),
            "Complete CompletionsReached",
        ),
        scenario(
            "failure-backoff",
            "the replacement of a failed pod waits for the pod failure backoff (10 s after one failure)",
            json!({"backoffLimit": 2}),
            script(|k| if nth(k) == 0 { Fail(1, "1s") } else { Succeed("1s") }),
            "Complete CompletionsReached",
        )
        .steps(vec![Until("1 failed", |s| n(s, "failed") == 1), Sleep(2), Snapshot("backoff")]),
        // --- activeDeadlineSeconds, suspend.
        scenario(
            "active-deadline",
            "activeDeadlineSeconds, DeadlineExceeded, active pods terminated",
            json!({"activeDeadlineSeconds": 5, "completions": 2, "parallelism": 2}),
            every(Run),
            "Failed DeadlineExceeded",
        ),
        scenario(
            "suspend-at-create",
            "suspend true at create (Suspended JobSuspended, no pods), then resumed (JobResumed)",
            json!({"suspend": true, "completions": 2, "parallelism": 2}),
            every(Succeed("2s")),
            "Complete CompletionsReached",
        )
        .steps(vec![
            Until("Suspended", |s| has(s, "Suspended")),
            Sleep(1),
            Snapshot("suspended"),
            Patch(json!({"suspend": false})),
        ]),
        scenario(
            "suspend-while-running",
            "suspend while running: pods deleted (not failures), resumed, completes",
            json!({"completions": 2, "parallelism": 2}),
            script(|k| if nth(k) < 2 { Run } else { Succeed("1s") }),
            "Complete CompletionsReached",
        )
        .steps(vec![
            WaitRunning(2),
            Patch(json!({"suspend": true})),
            // Settled: the Job's deleted pods stay terminating while its finalizer is removed.
            Until("Suspended, no pod left", |s| has(s, "Suspended") && n(s, "active") == 0 && n(s, "terminating") == 0),
            Snapshot("suspended"),
            Patch(json!({"suspend": false})),
        ]),
        // --- podFailurePolicy.
        scenario(
            "pfp-failjob-exit-code",
            "podFailurePolicy onExitCodes In, action FailJob, reason PodFailurePolicy and its message",
            json!({"backoffLimit": 6, "podFailurePolicy": {"rules": [on_exit("FailJob", "In", &[42])]}}),
            every(Fail(42, "1s")),
            "Failed PodFailurePolicy",
        ),
        scenario(
            "pfp-ignore-disruption",
            "podFailurePolicy onPodConditions DisruptionTarget, action Ignore (not counted)",
            json!({"backoffLimit": 0, "podFailurePolicy": ignore_disruption()}),
            script(|k| if nth(k) == 0 { Disrupt } else { Succeed("1s") }),
            "Complete CompletionsReached",
        ),
        scenario(
            "pfp-count",
            "podFailurePolicy action Count (counted toward backoffLimit), non-matching Ignore rule",
            json!({"backoffLimit": 1, "podFailurePolicy": {"rules": [
                on_exit("Count", "In", &[5]), on_exit("Ignore", "In", &[6]),
            ]}}),
            every(Fail(5, "1s")),
            "Failed BackoffLimitExceeded",
        ),
        scenario(
            "pfp-notin",
            "podFailurePolicy onExitCodes NotIn: 2 is counted, 7 fails the job",
            json!({"backoffLimit": 6, "podFailurePolicy": {"rules": [on_exit("FailJob", "NotIn", &[1, 2])]}}),
            script(|k| if nth(k) == 0 { Fail(2, "1s") } else { Fail(7, "1s") }),
            "Failed PodFailurePolicy",
        ),
        scenario(
            "pfp-container-name",
            "podFailurePolicy onExitCodes containerName (only the named container's code matches)",
            json!({
                "backoffLimit": 0,
                "podFailurePolicy": {"rules": [
                    {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [42]}},
                    {"action": "Ignore", "onExitCodes": {"containerName": "side", "operator": "In", "values": [42]}},
                ]},
                "template": {"spec": {"containers": [
                    {"name": "main", "image": "registry.invalid/none"},
                    {"name": "side", "image": "registry.invalid/none"},
                ]}},
            }),
            script(|k| if nth(k) == 0 { Exit(&[("main", 1), ("side", 42)]) } else { Succeed("1s") }),
            "Complete CompletionsReached",
        ),
        scenario(
            "pfp-rule-order",
            "podFailurePolicy rules in order, the first match wins (42 ignored, 43 fails at rule 1)",
            json!({"backoffLimit": 6, "podFailurePolicy": {"rules": [
                on_exit("Ignore", "In", &[42]), on_exit("FailJob", "In", &[42, 43]),
            ]}}),
            script(|k| if nth(k) == 0 { Fail(42, "1s") } else { Fail(43, "1s") }),
            "Failed PodFailurePolicy",
        ),
        scenario(
            "pfp-failjob-on-condition",
            "podFailurePolicy onPodConditions DisruptionTarget, action FailJob, and its message",
            json!({"backoffLimit": 6, "podFailurePolicy": {"rules": [
                {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            ]}}),
            every(Disrupt),
            "Failed PodFailurePolicy",
        ),
        scenario(
            "pfp-condition-status",
            "podFailurePolicy onPodConditions with status (False does not match a True condition)",
            json!({"backoffLimit": 0, "podFailurePolicy": {"rules": [
                {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "False"}]},
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            ]}}),
            script(|k| if nth(k) == 0 { Disrupt } else { Succeed("1s") }),
            "Complete CompletionsReached",
        ),
        scenario(
            "evicted-pod-ignored",
            "Eviction API (DisruptionTarget EvictionByEvictionAPI) with podFailurePolicy Ignore; terminating",
            json!({"backoffLimit": 0, "podFailurePolicy": ignore_disruption()}),
            script(|k| if nth(k) == 0 { Evict(3) } else { Succeed("1s") }),
            "Complete CompletionsReached",
        ),
        // --- backoffLimitPerIndex, maxFailedIndexes, FailIndex.
        scenario(
            "pfp-failindex",
            "podFailurePolicy action FailIndex with backoffLimitPerIndex, failedIndexes, FailedIndexes",
            with(
                indexed(3, 3),
                json!({"backoffLimitPerIndex": 1, "podFailurePolicy": {"rules": [on_exit("FailIndex", "In", &[42])]}}),
            ),
            script(|k| if k.index == Some(1) { Fail(42, "1s") } else { Succeed("2s") }),
            "Failed FailedIndexes",
        ),
        scenario(
            "backoff-limit-per-index",
            "backoffLimitPerIndex: index 0 fails twice (failed), index 1 once then succeeds",
            with(indexed(3, 3), json!({"backoffLimitPerIndex": 1})),
            script(|k| match (k.index, k.attempt) {
                (Some(0), _) | (Some(1), 0) => Fail(1, "1s"),
                _ => Succeed("1s"),
            }),
            "Failed FailedIndexes",
        ),
        scenario(
            "max-failed-indexes",
            "maxFailedIndexes exceeded: MaxFailedIndexesExceeded, the other indexes terminated",
            with(indexed(4, 4), json!({"backoffLimitPerIndex": 0, "maxFailedIndexes": 1})),
            script(|k| if matches!(k.index, Some(0 | 1)) { Fail(1, "1s") } else { Run }),
            "Failed MaxFailedIndexesExceeded",
        ),
        scenario(
            "max-failed-indexes-within",
            "maxFailedIndexes not exceeded: the other indexes run to the end, then FailedIndexes",
            with(indexed(3, 3), json!({"backoffLimitPerIndex": 0, "maxFailedIndexes": 1})),
            script(|k| if k.index == Some(0) { Fail(1, "1s") } else { Succeed("3s") }),
            "Failed FailedIndexes",
        ),
        // --- successPolicy.
        scenario(
            "success-policy-indexes",
            "successPolicy succeededIndexes: SuccessCriteriaMet and Complete with reason SuccessPolicy",
            with(indexed(3, 3), json!({"successPolicy": {"rules": [{"succeededIndexes": "0"}]}})),
            script(|k| if k.index == Some(0) { Succeed("1s") } else { Run }),
            "Complete SuccessPolicy",
        ),
        scenario(
            "success-policy-count",
            "successPolicy succeededCount",
            with(indexed(4, 4), json!({"successPolicy": {"rules": [{"succeededCount": 2}]}})),
            script(|k| if matches!(k.index, Some(1 | 3)) { Succeed("1s") } else { Run }),
            "Complete SuccessPolicy",
        ),
        scenario(
            "success-policy-indexes-count",
            "successPolicy succeededIndexes with succeededCount (a success outside the range does not count)",
            with(
                indexed(4, 4),
                json!({"successPolicy": {"rules": [{"succeededIndexes": "0-2", "succeededCount": 1}]}}),
            ),
            script(|k| match k.index {
                Some(3) => Succeed("1s"),
                Some(1) => Succeed("5s"),
                _ => Run,
            }),
            "Complete SuccessPolicy",
        ),
        // --- podReplacementPolicy, deletions.
        scenario(
            "replacement-failed",
            "podReplacementPolicy Failed: no replacement while the deleted pod terminates; terminating",
            json!({"podReplacementPolicy": "Failed", "backoffLimit": 2}),
            script(|k| if nth(k) == 0 { Delete(6) } else { Succeed("2s") }),
            "Complete CompletionsReached",
        )
        .steps(vec![Until("1 terminating", |s| n(s, "terminating") == 1), Sleep(1), Snapshot("terminating")]),
        scenario(
            "replacement-terminating",
            "podReplacementPolicy TerminatingOrFailed: the deleted pod counts at once; terminating",
            json!({"podReplacementPolicy": "TerminatingOrFailed", "backoffLimit": 2}),
            script(|k| if nth(k) == 0 { Delete(6) } else { Succeed("2s") }),
            "Complete CompletionsReached",
        )
        .steps(vec![Until("1 terminating", |s| n(s, "terminating") == 1), Sleep(1), Snapshot("terminating")]),
        scenario(
            "pod-deletion-counted",
            "a deleted pod counts as failed (no podFailurePolicy), replaced",
            json!({"backoffLimit": 3}),
            script(|k| if nth(k) == 0 { Delete(1) } else { Succeed("1s") }),
            "Complete CompletionsReached",
        ),
        // --- Elastic Indexed jobs.
        scenario(
            "elastic-scale-up",
            "elastic Indexed job: completions and parallelism raised together while running",
            indexed(2, 2),
            every(Succeed("8s")),
            "Complete CompletionsReached",
        )
        .steps(vec![WaitRunning(2), Patch(json!({"completions": 4, "parallelism": 4}))]),
        scenario(
            "elastic-scale-down",
            "elastic Indexed job: completions and parallelism lowered together while running",
            indexed(4, 4),
            every(Succeed("15s")),
            "Complete CompletionsReached",
        )
        .steps(vec![
            WaitRunning(4),
            Patch(json!({"completions": 2, "parallelism": 2})),
            // kwok removes a deleted pod at once; muster may report it terminating a moment longer.
            Until("2 active, none terminating", |s| n(s, "active") == 2 && n(s, "terminating") == 0),
            Sleep(1),
            Snapshot("scaled"),
        ]),
        // --- managedBy, selectors, ttl.
        scenario(
            "managed-by-other",
            "managedBy another controller: no pods, no status",
            json!({"managedBy": "example.com/other-controller", "completions": 1}),
            every(Succeed("1s")),
            "running",
        )
        .end(End::Observe(8)),
        scenario(
            "manual-selector",
            "manualSelector with selector",
            json!({
                "manualSelector": true,
                "selector": {"matchLabels": {"e2e-app": "picked"}},
                "completions": 2, "parallelism": 2,
                "template": {"metadata": {"labels": {"e2e-app": "picked"}}},
            }),
            every(Succeed("1s")),
            "Complete CompletionsReached",
        ),
        scenario(
            "ttl-after-finished",
            "ttlSecondsAfterFinished: the finished job is deleted",
            json!({"ttlSecondsAfterFinished": 3}),
            every(Succeed("1s")),
            "Complete CompletionsReached",
        )
        .end(End::Deleted),
        // --- Node loss.
        scenario(
            "node-loss",
            "node deleted: pod GC fails its pods (DisruptionTarget DeletionByPodGC), counted, replaced",
            json!({"completions": 2, "parallelism": 2, "backoffLimit": 4}),
            script(|k| if nth(k) < 2 { Run } else { Succeed("1s") }),
            "Complete CompletionsReached",
        )
        .pinned(vec!["a"])
        .steps(vec![WaitRunning(2), AddNode("b"), DeleteNode("a")]),
        scenario(
            "node-loss-ignored",
            "node deleted with podFailurePolicy Ignore on DisruptionTarget: not counted",
            json!({"completions": 2, "parallelism": 2, "backoffLimit": 0, "podFailurePolicy": ignore_disruption()}),
            script(|k| if nth(k) < 2 { Run } else { Succeed("1s") }),
            "Complete CompletionsReached",
        )
        .pinned(vec!["a"])
        .steps(vec![WaitRunning(2), AddNode("b"), DeleteNode("a")]),
        // --- restartPolicy OnFailure.
        scenario(
            "restart-on-failure",
            "template restartPolicy OnFailure, success",
            json!({"completions": 2, "parallelism": 2, "template": {"spec": {"restartPolicy": "OnFailure"}}}),
            every(Succeed("1s")),
            "Complete CompletionsReached",
        ),
        scenario(
            "restart-on-failure-backoff",
            "restartPolicy OnFailure: container restarts count toward backoffLimit",
            json!({"backoffLimit": 1, "template": {"spec": {"restartPolicy": "OnFailure"}}}),
            every(Restarts(2)),
            "Failed BackoffLimitExceeded",
        ),
        // --- Gangs: the same outcomes with a gang MusterJob.
        scenario(
            "gang-indexed-success",
            "gang MusterJob, Indexed success",
            indexed(3, 3),
            every(Succeed("2s")),
            "Complete CompletionsReached",
        )
        .gang(),
        scenario(
            "gang-ignore-disruption",
            "gang MusterJob, a disrupted pod ignored by podFailurePolicy (gang restart not counted)",
            with(indexed(3, 3), json!({"backoffLimit": 0, "podFailurePolicy": ignore_disruption()})),
            script(|k| if (k.index, k.attempt) == (Some(1), 0) { Disrupt } else { Succeed("4s") }),
            "Complete CompletionsReached",
        )
        .gang(),
        scenario(
            "gang-backoff-per-index",
            "gang MusterJob with backoffLimitPerIndex: one failure counted on its index only",
            with(indexed(3, 3), json!({"backoffLimitPerIndex": 1})),
            script(|k| if (k.index, k.attempt) == (Some(0), 0) { Fail(1, "1s") } else { Succeed("4s") }),
            "Complete CompletionsReached",
        )
        .gang(),
        scenario(
            "gang-node-loss-ignored",
            "gang MusterJob whose node is lost, podFailurePolicy Ignore on DisruptionTarget: not counted",
            with(indexed(2, 2), json!({"backoffLimit": 0, "podFailurePolicy": ignore_disruption()})),
            script(|k| if k.attempt == 0 { Run } else { Succeed("1s") }),
            "Complete CompletionsReached",
        )
        .gang()
        .pinned(vec!["a"])
        .steps(vec![WaitRunning(2), AddNode("b"), DeleteNode("a")]),
        scenario(
            "gang-failjob",
            "gang MusterJob, podFailurePolicy FailJob",
            with(indexed(2, 2), json!({"podFailurePolicy": {"rules": [on_exit("FailJob", "In", &[42])]}})),
            script(|k| if k.index == Some(0) { Fail(42, "1s") } else { Run }),
            "Failed PodFailurePolicy",
        )
        .gang(),
    ]
}

//! MusterJobSet semantics as JobSet documents them (kubernetes-sigs/jobset v1alpha2): failure
//! rules and restarts, success policy, startup order and `dependsOn`, DNS hostnames and the
//! coordinator, suspend and resume, TTL after finishing, `managedBy`. Pod outcomes are scripted
//! on kwok nodes by annotation; each scenario asserts on the children and the set's status.
//! Each test has its own namespace.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use muster::crds::batch::{JobPhase, JobSetPhase, MusterJobSetStatus};
use muster::crds::{JOB_NAME_LABEL, JOBSET_NAME_LABEL, MusterJob, MusterJobSet};

use crate::harness::manager::muster;
use crate::harness::{client, kubectl, kubectl_apply, namespace, wait_for};

const SHORT: Duration = Duration::from_secs(30);
const LONG: Duration = Duration::from_secs(90);

/// A pod template that runs until the test ends.
const RUNS: &str = "{spec: {containers: [{name: main, image: registry.invalid/none}]}}";
/// A pod template whose pods fail one second after starting.
const FAILS: &str = r#"{metadata: {annotations: {sim.muster.dev/fail-after: "1s"}}, spec: {containers: [{name: main, image: registry.invalid/none}]}}"#;
/// A pod template whose pods succeed two seconds after starting.
const SUCCEEDS: &str = r#"{metadata: {annotations: {sim.muster.dev/succeed-after: "2s"}}, spec: {containers: [{name: main, image: registry.invalid/none}]}}"#;
/// A pod template whose pods succeed six seconds after starting: long enough for a test to see
/// its job Running first (a job's Pending to Running is paced, and under a loaded control plane
/// a 2 s pod can go from Pending to Complete between two polls).
const SUCCEEDS_LATER: &str = r#"{metadata: {annotations: {sim.muster.dev/succeed-after: "6s"}}, spec: {containers: [{name: main, image: registry.invalid/none}]}}"#;
/// A pod template no node matches: its pods stay gated, never ready.
const NOWHERE: &str =
    "{spec: {nodeSelector: {muster.dev/e2e: nowhere}, containers: [{name: main, image: registry.invalid/none}]}}";

struct Apis {
    jobs: Api<MusterJob>,
    sets: Api<MusterJobSet>,
    pods: Api<Pod>,
    services: Api<Service>,
}

async fn apis(ns: &str) -> Apis {
    let c = client().await;
    Apis {
        jobs: Api::namespaced(c.clone(), ns),
        sets: Api::namespaced(c.clone(), ns),
        pods: Api::namespaced(c.clone(), ns),
        services: Api::namespaced(c, ns),
    }
}

fn condition<'a>(status: &'a MusterJobSetStatus, type_: &str) -> Option<&'a Condition> {
    status.conditions.iter().find(|c| c.type_ == type_)
}

/// (status, reason, message) of a condition.
fn shown(c: Option<&Condition>) -> Option<(String, String, String)> {
    c.map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn row(status: &str, reason: &str, message: &str) -> Option<(String, String, String)> {
    Some((status.into(), reason.into(), message.into()))
}

/// The set's status once `done` says so.
async fn status_when(
    a: &Apis,
    set: &str,
    what: &str,
    timeout: Duration,
    done: impl Fn(&MusterJobSetStatus) -> bool,
) -> MusterJobSetStatus {
    wait_for(&format!("set {set}: {what}"), timeout, || async {
        let s = a.sets.get(set).await.ok()?.status?;
        done(&s).then_some(s)
    })
    .await
}

fn phase_is(phase: JobSetPhase) -> impl Fn(&MusterJobSetStatus) -> bool {
    move |s| s.phase == Some(phase)
}

/// A set's manifest: `name`, extra spec lines (indented two spaces), replicatedJobs as
/// `(name, replicas, extra lines of the template spec, pod template)`.
fn manifest(name: &str, spec: &str, rjobs: &[(&str, i32, &str, &str)]) -> String {
    let mut out =
        format!("apiVersion: batch.muster.dev/v1alpha1\nkind: MusterJobSet\nmetadata: {{name: {name}}}\nspec:\n");
    for line in spec.lines().filter(|l| !l.trim().is_empty()) {
        out.push_str(&format!("  {line}\n"));
    }
    out.push_str("  replicatedJobs:\n");
    for (rjob, replicas, extra, pod) in rjobs {
        out.push_str(&format!("  - name: {rjob}\n    replicas: {replicas}\n"));
        if let Some(deps) = extra.strip_prefix("dependsOn:") {
            out.push_str(&format!("    dependsOn: {deps}\n"));
            out.push_str(&format!("    template:\n      spec:\n        backoffLimit: 0\n        template: {pod}\n"));
        } else {
            out.push_str("    template:\n      spec:\n        backoffLimit: 0\n");
            for line in extra.lines().filter(|l| !l.trim().is_empty()) {
                out.push_str(&format!("        {line}\n"));
            }
            out.push_str(&format!("        template: {pod}\n"));
        }
    }
    out
}

/// Live pods of child `job`.
async fn pods_of(a: &Apis, job: &str) -> Vec<Pod> {
    let lp = ListParams::default().labels(&format!("{JOB_NAME_LABEL}={job}"));
    a.pods
        .list(&lp)
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

/// A `FailJobSet` rule on the children's `Failed` reason fails the set at once: no restart,
/// JobSet's reason and message naming the failed child, `terminalState: Failed`, and the
/// other (active) children deleted.
#[tokio::test]
async fn a_fail_jobset_rule_on_a_reason_fails_the_set_at_once() {
    let _muster = muster().await;
    let ns = namespace("jss-failrule");
    let a = apis(&ns.name).await;
    let spec = r#"
failurePolicy:
  maxRestarts: 3
  rules:
  - {name: fatal, action: FailJobSet, onJobFailureReasons: [BackoffLimitExceeded]}
"#;
    kubectl_apply(&ns.name, &manifest("fr", spec, &[("steady", 1, "", RUNS), ("flaky", 1, "", FAILS)]));
    let status = status_when(&a, "fr", "Failed", LONG, phase_is(JobSetPhase::Failed)).await;
    assert_eq!(
        shown(condition(&status, "Failed")),
        row(
            "True",
            "FailJobSetFailurePolicyAction",
            "applying FailJobSet failure policy action (first failed job: fr-flaky-0)"
        )
    );
    assert_eq!((status.restarts, status.restarts_count_towards_max), (0, 0));
    assert_eq!(status.terminal_state.as_deref(), Some("Failed"));
    let flaky = status.replicated_jobs_status.iter().find(|r| r.name == "flaky").expect("flaky status");
    assert_eq!(flaky.failed, 1);
    wait_for("the active child deleted", SHORT, || async {
        a.jobs.get_opt("fr-steady-0").await.ok()?.is_none_or(|j| j.metadata.deletion_timestamp.is_some()).then_some(())
    })
    .await;
    let child = a.jobs.get("fr-flaky-0").await.expect("the failed child stays");
    let failed = child.status.expect("status").conditions.into_iter().find(|c| c.type_ == "Failed").expect("Failed");
    assert_eq!(failed.reason, "BackoffLimitExceeded");
}

/// `RestartJobSet` (no rule matching) recreates every child until `maxRestarts` restarts
/// counted, then the set fails with `ReachedMaxRestarts`; each attempt's children carry its
/// number.
#[tokio::test]
async fn restart_jobset_recreates_every_child_until_max_restarts() {
    let _muster = muster().await;
    let ns = namespace("jss-restart");
    let a = apis(&ns.name).await;
    kubectl_apply(
        &ns.name,
        &manifest("rs", "failurePolicy: {maxRestarts: 2}", &[("steady", 1, "", RUNS), ("flaky", 1, "", FAILS)]),
    );
    let first = wait_for("the first steady child", SHORT, || async { a.jobs.get_opt("rs-steady-0").await.ok()? }).await;
    assert_eq!(first.labels().get("jobset.sigs.k8s.io/restart-attempt").map(String::as_str), Some("0"));
    let status = status_when(&a, "rs", "Failed", LONG, phase_is(JobSetPhase::Failed)).await;
    assert_eq!((status.restarts, status.restarts_count_towards_max), (2, 2));
    assert_eq!(
        shown(condition(&status, "Failed")),
        row(
            "True",
            "ReachedMaxRestarts",
            "jobset failed due to reaching max number of restarts (first failed job: rs-flaky-0)"
        )
    );
    let restarting = condition(&status, "RestartingJobSet").expect("RestartingJobSet");
    assert_eq!((restarting.status.as_str(), restarting.reason.as_str()), ("False", "JobSetFailed"));
    let flaky = a.jobs.get("rs-flaky-0").await.expect("last attempt's child");
    assert_eq!(flaky.labels().get("jobset.sigs.k8s.io/restart-attempt").map(String::as_str), Some("2"));
    assert_eq!(flaky.status.and_then(|s| s.phase), Some(JobPhase::Failed));
    // The steady child was made again too (a new object), then deleted as the set failed.
    wait_for("the steady child of the last attempt gone", SHORT, || async {
        let j = a.jobs.get_opt("rs-steady-0").await.ok()?;
        j.is_none_or(|j| j.uid() != first.uid() && j.metadata.deletion_timestamp.is_some()).then_some(())
    })
    .await;
}

/// `RestartJobSetAndIgnoreMaxRestarts` restarts the set without counting toward
/// `maxRestarts` (here 0): `restarts` grows, `restartsCountTowardsMax` stays 0, the set never
/// fails, and `RestartingJobSet` names the rule.
#[tokio::test]
async fn restarts_ignoring_max_restarts_are_not_counted() {
    let _muster = muster().await;
    let ns = namespace("jss-ignore");
    let a = apis(&ns.name).await;
    let spec = r#"
failurePolicy:
  maxRestarts: 0
  rules:
  - {name: preempted, action: RestartJobSetAndIgnoreMaxRestarts, onJobFailureReasons: [BackoffLimitExceeded], onJobFailureMessagePatterns: ["backoff limit$"]}
"#;
    kubectl_apply(&ns.name, &manifest("ig", spec, &[("flaky", 1, "", FAILS)]));
    let status = status_when(&a, "ig", "two restarts", LONG, |s| s.restarts >= 2).await;
    assert_eq!(status.restarts_count_towards_max, 0);
    assert_ne!(status.phase, Some(JobSetPhase::Failed));
    assert!(condition(&status, "Failed").is_none());
    let restarting = condition(&status, "RestartingJobSet").expect("RestartingJobSet");
    assert_eq!(restarting.reason, "FailurePolicy_preempted");
    assert!(
        restarting.message.starts_with(
            "applying RestartJobSetAndIgnoreMaxRestarts failure policy action (first failed job: ig-flaky-0)"
        ),
        "{restarting:?}"
    );
    kubectl(&["-n", &ns.name, "delete", "musterjobset", "ig", "--wait=false"]);
}

/// A rule with `targetReplicatedJobs` applies to the children of those replicatedJobs only: a
/// worker failure falls through to the default (a counted restart, then `ReachedMaxRestarts`),
/// a leader failure fails the set at once.
#[tokio::test]
async fn a_rule_applies_to_its_target_replicated_jobs_only() {
    let _muster = muster().await;
    let ns = namespace("jss-target");
    let a = apis(&ns.name).await;
    let spec = r#"
failurePolicy:
  maxRestarts: 1
  rules:
  - {name: leaderDown, action: FailJobSet, targetReplicatedJobs: [leader]}
"#;
    kubectl_apply(&ns.name, &manifest("workersfail", spec, &[("leader", 1, "", RUNS), ("workers", 1, "", FAILS)]));
    kubectl_apply(&ns.name, &manifest("leaderfails", spec, &[("leader", 1, "", FAILS), ("workers", 1, "", RUNS)]));
    let workers = status_when(&a, "workersfail", "Failed", LONG, phase_is(JobSetPhase::Failed)).await;
    assert_eq!((workers.restarts, workers.restarts_count_towards_max), (1, 1));
    assert_eq!(condition(&workers, "Failed").map(|c| c.reason.as_str()), Some("ReachedMaxRestarts"));
    let leader = status_when(&a, "leaderfails", "Failed", LONG, phase_is(JobSetPhase::Failed)).await;
    assert_eq!(leader.restarts, 0);
    assert_eq!(
        shown(condition(&leader, "Failed")),
        row(
            "True",
            "FailJobSetFailurePolicyAction",
            "applying FailJobSet failure policy action (first failed job: leaderfails-leader-0)"
        )
    );
}

/// `successPolicy: {operator: Any, targetReplicatedJobs: [leader]}`: the leader's success
/// completes the set while the workers still run; the workers are deleted.
#[tokio::test]
async fn success_policy_any_on_one_replicated_job_completes_the_set() {
    let _muster = muster().await;
    let ns = namespace("jss-success");
    let a = apis(&ns.name).await;
    kubectl_apply(
        &ns.name,
        &manifest(
            "sp",
            "successPolicy: {operator: Any, targetReplicatedJobs: [leader]}",
            &[("leader", 1, "", SUCCEEDS), ("workers", 2, "", RUNS)],
        ),
    );
    let status = status_when(&a, "sp", "Completed", LONG, phase_is(JobSetPhase::Completed)).await;
    assert_eq!(
        shown(condition(&status, "Completed")),
        row("True", "AllJobsCompleted", "jobset completed successfully")
    );
    assert_eq!(status.terminal_state.as_deref(), Some("Completed"));
    let leader = status.replicated_jobs_status.iter().find(|r| r.name == "leader").expect("leader status");
    assert_eq!(leader.succeeded, 1);
    for worker in ["sp-workers-0", "sp-workers-1"] {
        wait_for(&format!("{worker} deleted"), SHORT, || async {
            a.jobs.get_opt(worker).await.ok()?.is_none_or(|j| j.metadata.deletion_timestamp.is_some()).then_some(())
        })
        .await;
    }
}

/// `startupPolicy: InOrder`: the workers' children are created only once every leader child
/// is ready (ready pods reach parallelism); a leader that never gets ready keeps them from
/// ever being created. The conditions go InProgress, then Completed.
#[tokio::test]
async fn in_order_startup_creates_workers_after_the_leader_is_ready() {
    let _muster = muster().await;
    let ns = namespace("jss-inorder");
    let a = apis(&ns.name).await;
    let spec = "startupPolicy: {startupPolicyOrder: InOrder}";
    kubectl_apply(&ns.name, &manifest("io", spec, &[("leader", 1, "parallelism: 2", RUNS), ("workers", 2, "", RUNS)]));
    kubectl_apply(&ns.name, &manifest("stuck", spec, &[("leader", 1, "", NOWHERE), ("workers", 1, "", RUNS)]));
    let status = status_when(&a, "io", "StartupPolicyCompleted", LONG, |s| {
        condition(s, "StartupPolicyCompleted").is_some_and(|c| c.status == "True")
    })
    .await;
    assert_eq!(
        shown(condition(&status, "StartupPolicyCompleted")),
        row("True", "InOrderStartupPolicyCompleted", "in order startup policy has completed")
    );
    assert_eq!(condition(&status, "StartupPolicyInProgress").map(|c| c.status.as_str()), Some("False"));
    // Each worker child was created no earlier than the last leader pod became ready.
    let ready_at = pods_of(&a, "io-leader-0")
        .await
        .iter()
        .filter_map(|p| {
            p.status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .find(|c| c.type_ == "Ready" && c.status == "True")?
                .last_transition_time
                .clone()
        })
        .map(|t| t.0)
        .max()
        .expect("the leader's pods are ready");
    for worker in ["io-workers-0", "io-workers-1"] {
        let created = a.jobs.get(worker).await.expect("worker child").metadata.creation_timestamp.expect("created").0;
        assert!(created >= ready_at, "{worker} created at {created}, the leader ready at {ready_at}");
    }
    // The leader that never gets ready: still in progress, no worker child.
    let stuck = status_when(&a, "stuck", "StartupPolicyInProgress", SHORT, |s| {
        condition(s, "StartupPolicyInProgress").is_some_and(|c| c.status == "True")
    })
    .await;
    assert_eq!(
        shown(condition(&stuck, "StartupPolicyInProgress")),
        row("True", "InOrderStartupPolicyInProgress", "in order startup policy is in progress")
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(a.jobs.get_opt("stuck-leader-0").await.unwrap().is_some());
    assert!(a.jobs.get_opt("stuck-workers-0").await.unwrap().is_none(), "no worker before the leader is ready");
}

/// `dependsOn: [{name: leader, status: Complete}]`: the workers are created once every leader
/// child succeeded, not before.
#[tokio::test]
async fn depends_on_complete_creates_workers_after_the_leader_succeeded() {
    let _muster = muster().await;
    let ns = namespace("jss-depends");
    let a = apis(&ns.name).await;
    kubectl_apply(
        &ns.name,
        &manifest(
            "dep",
            "",
            &[("leader", 1, "", SUCCEEDS_LATER), ("workers", 1, "dependsOn:[{name: leader, status: Complete}]", RUNS)],
        ),
    );
    let leader = wait_for("the leader child running", SHORT, || async {
        let j = a.jobs.get_opt("dep-leader-0").await.ok()??;
        (j.status.as_ref()?.phase == Some(JobPhase::Running)).then_some(j)
    })
    .await;
    assert!(leader.status.is_some());
    assert!(a.jobs.get_opt("dep-workers-0").await.unwrap().is_none(), "no worker while the leader runs");
    let worker = wait_for("the worker child", LONG, || async { a.jobs.get_opt("dep-workers-0").await.ok()? }).await;
    let leader = a.jobs.get("dep-leader-0").await.expect("leader");
    let complete =
        leader.status.expect("status").conditions.into_iter().find(|c| c.type_ == "Complete" && c.status == "True");
    let complete = complete.expect("the leader completed before the worker was made").last_transition_time.0;
    let created = worker.metadata.creation_timestamp.expect("created").0;
    assert!(created >= complete, "worker created at {created}, leader complete at {complete}");
}

/// `network` and `coordinator`: the headless Service named after the subdomain (the set's
/// name by default, `network.subdomain` when given), with `publishNotReadyAddresses` as asked;
/// Indexed children by default, their pods addressable as `<child>-<index>.<subdomain>`;
/// JobSet's labels and the coordinator's name on children and pods. With
/// `enableDNSHostnames: false`, no Service and no subdomain.
#[tokio::test]
async fn dns_hostnames_give_pods_stable_names_and_everyone_the_coordinator() {
    let _muster = muster().await;
    let ns = namespace("jss-dns");
    let a = apis(&ns.name).await;
    let spec = r#"
network: {publishNotReadyAddresses: false}
coordinator: {replicatedJob: leader, jobIndex: 0, podIndex: 0}
"#;
    kubectl_apply(&ns.name, &manifest("dns", spec, &[("leader", 1, "", RUNS), ("workers", 2, "parallelism: 2", RUNS)]));
    kubectl_apply(&ns.name, &manifest("custom", "network: {subdomain: net}", &[("w", 1, "", RUNS)]));
    kubectl_apply(&ns.name, &manifest("nodns", "network: {enableDNSHostnames: false}", &[("w", 1, "", RUNS)]));
    let svc = wait_for("Service dns", SHORT, || async { a.services.get_opt("dns").await.ok()? }).await;
    let svc_spec = svc.spec.expect("spec");
    assert_eq!(svc_spec.cluster_ip.as_deref(), Some("None"));
    // A Go bool with omitempty: false reads back unset.
    assert!(!svc_spec.publish_not_ready_addresses.unwrap_or(false));
    assert_eq!(svc_spec.selector.expect("selector").get(JOBSET_NAME_LABEL).map(String::as_str), Some("dns"));
    for (child, rjob, index, global, pods) in
        [("dns-leader-0", "leader", "0", "0", 1), ("dns-workers-1", "workers", "1", "2", 2)]
    {
        let job = wait_for(child, SHORT, || async { a.jobs.get_opt(child).await.ok()? }).await;
        assert!(job.spec.indexed(), "children are Indexed by default");
        let labels = job.labels();
        for (k, v) in [
            ("jobset.sigs.k8s.io/jobset-name", "dns"),
            ("jobset.sigs.k8s.io/replicatedjob-name", rjob),
            ("jobset.sigs.k8s.io/job-index", index),
            ("jobset.sigs.k8s.io/job-global-index", global),
            ("jobset.sigs.k8s.io/group-name", "default"),
            ("jobset.sigs.k8s.io/coordinator", "dns-leader-0-0.dns"),
        ] {
            assert_eq!(labels.get(k).map(String::as_str), Some(v), "{child} label {k}");
            assert_eq!(job.annotations().get(k).map(String::as_str), Some(v), "{child} annotation {k}");
        }
        let live = wait_for(&format!("{pods} pods of {child}"), SHORT, || async {
            let p = pods_of(&a, child).await;
            (p.len() == pods).then_some(p)
        })
        .await;
        for p in live {
            assert_eq!(
                p.labels().get("jobset.sigs.k8s.io/coordinator").map(String::as_str),
                Some("dns-leader-0-0.dns")
            );
            assert_eq!(p.labels().get("jobset.sigs.k8s.io/job-global-index").map(String::as_str), Some(global));
            let index = completion_index(&p);
            let spec = p.spec.expect("spec");
            assert_eq!(spec.hostname, Some(format!("{child}-{index}")));
            assert_eq!(spec.subdomain.as_deref(), Some("dns"), "{child}'s pods are <hostname>.dns");
        }
    }
    // A subdomain of its own: the Service takes its name, the children's pod template too.
    let svc = wait_for("Service net", SHORT, || async { a.services.get_opt("net").await.ok()? }).await;
    assert_eq!(svc.spec.and_then(|s| s.publish_not_ready_addresses), Some(true), "published by default");
    let w = wait_for("custom-w-0", SHORT, || async { a.jobs.get_opt("custom-w-0").await.ok()? }).await;
    assert_eq!(w.spec.template.spec.as_ref().and_then(|s| s.subdomain.as_deref()), Some("net"));
    let w = wait_for("nodns-w-0", SHORT, || async { a.jobs.get_opt("nodns-w-0").await.ok()? }).await;
    assert!(w.spec.template.spec.as_ref().and_then(|s| s.subdomain.clone()).is_none());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(a.services.get_opt("custom").await.unwrap().is_none(), "named after the subdomain, not the set");
    assert!(a.services.get_opt("nodns").await.unwrap().is_none(), "no DNS hostnames: no Service");
}

/// The pods of a set with `network.subdomain` are `<hostname>.<subdomain>`, and those of a set
/// without DNS hostnames have no subdomain: the job controller gives a set's child's pods the
/// subdomain of the child's pod template (which the set writes), not the set's name.
#[tokio::test]
async fn pods_follow_a_custom_subdomain() {
    let _muster = muster().await;
    let ns = namespace("jss-subdomain");
    let a = apis(&ns.name).await;
    kubectl_apply(&ns.name, &manifest("custom", "network: {subdomain: net}", &[("w", 1, "", RUNS)]));
    kubectl_apply(&ns.name, &manifest("nodns", "network: {enableDNSHostnames: false}", &[("w", 1, "", RUNS)]));
    for (child, want) in [("custom-w-0", Some("net")), ("nodns-w-0", None)] {
        let pod =
            wait_for(&format!("a pod of {child}"), SHORT, || async { pods_of(&a, child).await.into_iter().next() })
                .await;
        let spec = pod.spec.expect("spec");
        assert_eq!(spec.subdomain.as_deref(), want, "{child}");
    }
}

/// The completion index of a set's child's pod.
fn completion_index(p: &Pod) -> String {
    ["batch.kubernetes.io/job-completion-index", "batch.muster.dev/job-completion-index"]
        .iter()
        .find_map(|k| p.annotations().get(*k).cloned())
        .expect("a completion index")
}

/// `suspend: true`: the children are created suspended (no pods) and the set says
/// `Suspended` (`SuspendedJobs`); resumed, the children run and `Suspended` turns false
/// (`ResumeJobs`).
#[tokio::test]
async fn a_suspended_set_resumes_its_children() {
    let _muster = muster().await;
    let ns = namespace("jss-suspend");
    let a = apis(&ns.name).await;
    kubectl_apply(&ns.name, &manifest("sus", "suspend: true", &[("leader", 1, "", RUNS), ("workers", 2, "", RUNS)]));
    let status = status_when(&a, "sus", "Suspended with 3 suspended children", SHORT, |s| {
        s.replicated_jobs_status.iter().map(|r| r.suspended).sum::<i32>() == 3
    })
    .await;
    assert_eq!(shown(condition(&status, "Suspended")), row("True", "SuspendedJobs", "jobset is suspended"));
    assert_eq!(status.phase, Some(JobSetPhase::Suspended));
    for child in ["sus-leader-0", "sus-workers-0", "sus-workers-1"] {
        assert!(a.jobs.get(child).await.expect("child").spec.suspend, "{child} suspended");
        assert!(pods_of(&a, child).await.is_empty(), "{child} has no pods");
    }
    kubectl(&["-n", &ns.name, "patch", "musterjobset", "sus", "--type=merge", "-p", r#"{"spec":{"suspend":false}}"#]);
    let status =
        status_when(&a, "sus", "resumed", SHORT, |s| condition(s, "Suspended").is_some_and(|c| c.status == "False"))
            .await;
    assert_eq!(shown(condition(&status, "Suspended")), row("False", "ResumeJobs", "jobset is resumed"));
    for child in ["sus-leader-0", "sus-workers-0", "sus-workers-1"] {
        wait_for(&format!("{child} running"), SHORT, || async {
            let j = a.jobs.get(child).await.ok()?;
            (!j.spec.suspend && pods_of(&a, child).await.len() == 1).then_some(())
        })
        .await;
    }
}

/// `ttlSecondsAfterFinished`: the set is deleted that long after it finished, and all it made
/// with it.
#[tokio::test]
async fn a_finished_set_is_deleted_after_its_ttl() {
    let _muster = muster().await;
    let ns = namespace("jss-ttl");
    let a = apis(&ns.name).await;
    kubectl_apply(&ns.name, &manifest("ttl", "ttlSecondsAfterFinished: 4", &[("w", 1, "", SUCCEEDS)]));
    let status = status_when(&a, "ttl", "Completed", LONG, phase_is(JobSetPhase::Completed)).await;
    let finished = condition(&status, "Completed").expect("Completed").last_transition_time.0;
    wait_for("the set deleted", SHORT, || async { a.sets.get_opt("ttl").await.ok()?.is_none().then_some(()) }).await;
    let gone = k8s_openapi::jiff::Timestamp::now();
    assert!(
        gone.as_second() - finished.as_second() >= 4,
        "deleted {}s after it finished",
        gone.as_second() - finished.as_second()
    );
    wait_for("its child gone", SHORT, || async { a.jobs.get_opt("ttl-w-0").await.ok()?.is_none().then_some(()) }).await;
}

/// `managedBy` naming another controller: muster leaves the set alone (no child, no status).
#[tokio::test]
async fn a_set_managed_by_another_controller_is_left_alone() {
    let _muster = muster().await;
    let ns = namespace("jss-managed");
    let a = apis(&ns.name).await;
    kubectl_apply(&ns.name, &manifest("theirs", "managedBy: example.com/multikueue", &[("w", 1, "", RUNS)]));
    kubectl_apply(&ns.name, &manifest("ours", "", &[("w", 1, "", RUNS)]));
    wait_for("our set's child", SHORT, || async { a.jobs.get_opt("ours-w-0").await.ok()? }).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(a.jobs.get_opt("theirs-w-0").await.unwrap().is_none());
    assert!(a.sets.get("theirs").await.unwrap().status.is_none());
}

/// A rule on the `PodFailurePolicy` reason (the child's own `podFailurePolicy` failed it on an
/// exit code): the set fails at once, while another exit code (the child failing with
/// `BackoffLimitExceeded`) restarts the set as the default does.
#[tokio::test]
async fn a_rule_on_the_pod_failure_policy_reason_fails_the_set() {
    let _muster = muster().await;
    let ns = namespace("jss-pfp");
    let a = apis(&ns.name).await;
    let spec = r#"
failurePolicy:
  maxRestarts: 1
  rules:
  - {name: fatalExit, action: FailJobSet, onJobFailureReasons: [PodFailurePolicy]}
"#;
    let pod = |code: u8| {
        format!(
            r#"{{metadata: {{annotations: {{sim.muster.dev/fail-after: "1s", sim.muster.dev/exit-code: "{code}"}}}}, spec: {{restartPolicy: Never, containers: [{{name: main, image: registry.invalid/none}}]}}}}"#
        )
    };
    let rule = "podFailurePolicy: {rules: [{action: FailJob, onExitCodes: {operator: In, values: [42]}}]}";
    let (fatal, other) = (pod(42), pod(1));
    kubectl_apply(&ns.name, &manifest("fatal", spec, &[("trainer", 1, rule, &fatal)]));
    kubectl_apply(&ns.name, &manifest("other", spec, &[("trainer", 1, rule, &other)]));
    let status = status_when(&a, "fatal", "Failed", LONG, phase_is(JobSetPhase::Failed)).await;
    assert_eq!(status.restarts, 0);
    assert_eq!(
        shown(condition(&status, "Failed")),
        row(
            "True",
            "FailJobSetFailurePolicyAction",
            "applying FailJobSet failure policy action (first failed job: fatal-trainer-0)"
        )
    );
    let child = a.jobs.get("fatal-trainer-0").await.expect("child");
    let failed = child.status.expect("status").conditions.into_iter().find(|c| c.type_ == "Failed").expect("Failed");
    assert_eq!(failed.reason, "PodFailurePolicy");
    let status = status_when(&a, "other", "Failed", LONG, phase_is(JobSetPhase::Failed)).await;
    assert_eq!((status.restarts, status.restarts_count_towards_max), (1, 1));
    assert_eq!(condition(&status, "Failed").map(|c| c.reason.as_str()), Some("ReachedMaxRestarts"));
}

/// With a gang `spec.scheduling` the set's CompositePodGroup admits all its children together,
/// so an ordered start (`InOrder`, `dependsOn`) could never begin: the webhook refuses the set
/// at the field (a set that got past it is Invalid, reason `InvalidSpec`, with no child: the set
/// controller runs the same validation). With a `basic` composite policy the order works.
#[tokio::test]
async fn an_ordered_start_under_a_composite_gang_is_refused() {
    let _muster = muster().await;
    let ns = namespace("jss-gangorder");
    let a = apis(&ns.name).await;
    let gang = "scheduling: {schedulingPolicy: {gang: {}}}\nstartupPolicy: {startupPolicyOrder: InOrder}";
    let basic = "scheduling: {schedulingPolicy: {basic: {}}}\nstartupPolicy: {startupPolicyOrder: InOrder}";
    // The webhook refuses the gang one at the field, and nothing of it is made.
    let refused = crate::harness::try_kubectl_apply(
        &ns.name,
        &manifest("gang", gang, &[("leader", 1, "", RUNS), ("workers", 1, "", RUNS)]),
    )
    .expect_err("the webhook refuses an ordered start under a gang");
    assert!(
        refused.contains("spec.startupPolicy.startupPolicyOrder")
            && refused.contains("may not be combined with spec.scheduling.schedulingPolicy.gang"),
        "{refused}"
    );
    kubectl_apply(&ns.name, &manifest("basic", basic, &[("leader", 1, "", RUNS), ("workers", 1, "", RUNS)]));
    assert!(a.sets.get_opt("gang").await.expect("get").is_none(), "the refused set was not created");
    let status = status_when(&a, "basic", "StartupPolicyCompleted", LONG, |s| {
        condition(s, "StartupPolicyCompleted").is_some_and(|c| c.status == "True")
    })
    .await;
    assert_eq!(status.replicated_jobs_status.iter().map(|r| r.ready).sum::<i32>(), 2);
    assert!(
        a.jobs.list(&ListParams::default()).await.unwrap().items.iter().all(|j| !j.name_any().starts_with("gang-"))
    );
}

/// `restartStrategy`: with `Recreate` a restarted set's child is made again as soon as its own
/// old one is gone; with `BlockingRecreate` no child of the new attempt exists until every
/// child of the old one is gone. The old `steady` child is held (its pod has a finalizer) while
/// the `flaky` one is gone: only the Recreate set makes its new `flaky` child meanwhile.
#[tokio::test]
async fn blocking_recreate_waits_for_every_old_child() {
    let _muster = muster().await;
    let ns = namespace("jss-blocking");
    let a = apis(&ns.name).await;
    let held = r#"{metadata: {finalizers: [example.com/hold]}, spec: {containers: [{name: main, image: registry.invalid/none}]}}"#;
    for (set, strategy) in [("rec", "Recreate"), ("blk", "BlockingRecreate")] {
        let spec = format!("failurePolicy: {{maxRestarts: 1, restartStrategy: {strategy}}}");
        kubectl_apply(&ns.name, &manifest(set, &spec, &[("steady", 1, "", held), ("flaky", 1, "", FAILS)]));
    }
    let attempt = |j: &MusterJob| j.labels().get("jobset.sigs.k8s.io/restart-attempt").cloned();
    for set in ["rec", "blk"] {
        status_when(&a, set, "restarted", LONG, |s| s.restarts == 1).await;
    }
    // Recreate: the new flaky child comes while the old steady one is held.
    let rec = wait_for("rec's new flaky child", SHORT, || async {
        let j = a.jobs.get_opt("rec-flaky-0").await.ok()??;
        (attempt(&j).as_deref() == Some("1")).then_some(j)
    })
    .await;
    // BlockingRecreate: nothing of attempt 1 while the old steady child is held.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let held_old = a.jobs.get_opt("blk-steady-0").await.unwrap().filter(|j| j.metadata.deletion_timestamp.is_some());
    // The old flaky child (attempt 0) may still be going away; only one of attempt 1 is wrong.
    let blk_flaky = a.jobs.get_opt("blk-flaky-0").await.unwrap().filter(|j| attempt(j).as_deref() != Some("0"));
    // Release the held pods (before asserting, so the namespace can go whatever happens).
    release(&a, &ns.name).await;
    assert!(rec.metadata.creation_timestamp.is_some());
    assert!(held_old.is_some(), "blk's old steady child is still held");
    assert!(
        blk_flaky.is_none(),
        "no child of the new attempt while an old one exists: {:?}",
        blk_flaky.map(|j| attempt(&j))
    );
    // Released: the blocking set makes its new attempt.
    wait_for("blk's new children", LONG, || async {
        let steady = a.jobs.get_opt("blk-steady-0").await.ok()??;
        let flaky = a.jobs.get_opt("blk-flaky-0").await.ok()??;
        (attempt(&steady).as_deref() == Some("1") && attempt(&flaky).as_deref() == Some("1")).then_some(())
    })
    .await;
    // Both sets fail in their last attempt; their pods are released for the namespace to go.
    for set in ["rec", "blk"] {
        status_when(&a, set, "Failed", LONG, phase_is(JobSetPhase::Failed)).await;
    }
    release(&a, &ns.name).await;
}

/// Removes the finalizers of every pod in `ns`.
async fn release(a: &Apis, ns: &str) {
    for pod in a.pods.list(&ListParams::default()).await.unwrap().items {
        if pod.metadata.finalizers.as_ref().is_some_and(|f| !f.is_empty()) {
            let remove = r#"[{"op":"remove","path":"/metadata/finalizers"}]"#;
            let _ = crate::harness::cluster().kubectl(&[
                "-n",
                ns,
                "patch",
                "pod",
                &pod.name_any(),
                "--type=json",
                "-p",
                remove,
            ]);
        }
    }
}

//! Table tests for [`next_step`]: plans resumed, dropped, watched, rolled back, failed.

use std::collections::BTreeMap;

use super::*;
use crate::scheduler::commit::fixtures::{TIMEOUT, at, failure, nodes};
use crate::scheduler::commit::pins::Refusal;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// A pod `name` of group `group`, planned on node `node`.
fn pod(name: &str, group: &str, node: &str, state: PinState) -> PlannedPodNow {
    PlannedPodNow {
        name: name.into(),
        uid: format!("uid-{name}"),
        pod_group: group.into(),
        node: node.into(),
        node_exists: true,
        state,
    }
}

fn gated(name: &str) -> PlannedPodNow {
    pod(name, "g", "n1", PinState::Gated)
}

fn unbound(name: &str) -> PlannedPodNow {
    pod(name, "g", "n1", PinState::Unbound { refusal: None })
}

fn refused(name: &str, message: &str) -> PlannedPodNow {
    let refusal = Refusal { reason: "Unschedulable".into(), message: message.into() };
    pod(name, "g", "n1", PinState::Unbound { refusal: Some(refusal) })
}

fn bound(name: &str) -> PlannedPodNow {
    pod(name, "g", "n1", PinState::Bound { node: "n1".into() })
}

fn node_gone(mut p: PlannedPodNow) -> PlannedPodNow {
    p.node_exists = false;
    p
}

fn on(mut p: PlannedPodNow, node: &str) -> PlannedPodNow {
    p.node = node.into();
    if let PinState::Bound { node: n } = &mut p.state {
        *n = node.into();
    }
    p
}

fn in_group(mut p: PlannedPodNow, group: &str) -> PlannedPodNow {
    p.pod_group = group.into();
    p
}

/// A plan in `state`, admitted (or created) at time 0.
fn plan(state: PlanState) -> AdmissionPlan {
    AdmissionPlan {
        id: "p-1".into(),
        state,
        created_at: Some(Time(at(0))),
        admitted_at: (state == PlanState::Admitted).then(|| Time(at(0))),
        pods: vec![],
        shared_claims: vec![],
    }
}

fn uids(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| format!("uid-{n}")).collect()
}

struct Case {
    name: &'static str,
    state: PlanState,
    pods: Vec<PlannedPodNow>,
    now: i64,
    requirement: StartRequirement,
    disruption: DisruptionModeKind,
    fits: RemainingFits,
    refused: Option<PatchRefused>,
    /// A device of the plan's claims another claim holds too.
    lost: Option<DeviceLoss>,
    /// The plan allocated a (shared) claim.
    claims: bool,
    claim_settle: Duration,
    /// A bound pod of the plan is not running yet.
    starting: bool,
    /// A pod of the root outside the plan waits gated.
    waiting: bool,
    start_settle: Duration,
    want: Step,
}

impl Default for Case {
    fn default() -> Self {
        Self {
            name: "",
            state: PlanState::Admitted,
            pods: vec![],
            now: 0,
            requirement: StartRequirement::leaf("g", 2),
            disruption: DisruptionModeKind::Single,
            fits: RemainingFits::Yes,
            refused: None,
            lost: None,
            claims: false,
            claim_settle: Duration::ZERO,
            starting: false,
            waiting: false,
            start_settle: Duration::ZERO,
            want: Step::Done,
        }
    }
}

fn run(cases: Vec<Case>) {
    for case in cases {
        let mut plan = plan(case.state);
        if case.claims {
            plan.shared_claims = vec!["shared".into()];
        }
        let input = CommitInput {
            plan: &plan,
            pods: &case.pods,
            now: at(case.now),
            bind_timeout: TIMEOUT,
            requirement: &case.requirement,
            disruption: case.disruption,
            remaining_fits: case.fits.clone(),
            refused: case.refused.as_ref(),
            lost: case.lost.as_ref(),
            claim_settle: case.claim_settle,
            starting: case.starting,
            waiting: case.waiting,
            start_settle: case.start_settle,
        };
        assert_eq!(next_step(&input), case.want, "case: {}", case.name);
    }
}

#[test]
fn a_refused_patch_rolls_the_attempt_back_and_an_untouched_plan_is_dropped() {
    let refusal = PatchRefused { uid: "uid-b".into(), message: "denied by policy".into() };
    let cause = FailureCause::PatchRefused("denied by policy".into());
    run(vec![
        Case {
            name: "one pod ungated, the next refused: roll back both",
            state: PlanState::Committing,
            pods: vec![unbound("a"), gated("b")],
            refused: Some(refusal.clone()),
            want: Step::RollBack(RollBack {
                delete: uids(&["a", "b"]),
                avoid_nodes: BTreeSet::new(),
                failure: failure("b", "n1", cause, 2, 2),
            }),
            ..Case::default()
        },
        Case {
            name: "the first pod refused: nothing ungated, drop the plan",
            state: PlanState::Committing,
            pods: vec![gated("a"), gated("b")],
            refused: Some(refusal.clone()),
            want: Step::Drop,
            ..Case::default()
        },
        Case {
            name: "a refusal of a pod no longer in the plan changes nothing",
            state: PlanState::Committing,
            pods: vec![unbound("a"), gated("c")],
            refused: Some(refusal),
            want: Step::Patch(uids(&["c"])),
            ..Case::default()
        },
    ]);
}

#[test]
fn a_plan_cut_short_is_resumed_or_dropped() {
    run(vec![
        Case {
            name: "planned, no pod ungated: drop and plan afresh",
            state: PlanState::Planned,
            pods: vec![gated("a"), gated("b")],
            want: Step::Drop,
            ..Case::default()
        },
        Case {
            name: "committing, every planned pod gone: drop",
            state: PlanState::Committing,
            pods: vec![pod("a", "g", "n1", PinState::Gone), pod("b", "g", "n1", PinState::Terminating)],
            want: Step::Drop,
            ..Case::default()
        },
        Case {
            name: "committing, some ungated: patch the gated rest",
            state: PlanState::Committing,
            pods: vec![unbound("a"), gated("b"), gated("c")],
            want: Step::Patch(uids(&["b", "c"])),
            ..Case::default()
        },
        Case {
            name: "committing, gone pods are not patched",
            state: PlanState::Committing,
            pods: vec![bound("a"), pod("b", "g", "n1", PinState::Gone), gated("c")],
            want: Step::Patch(uids(&["c"])),
            ..Case::default()
        },
        Case {
            name: "committing, every pod ungated: the commit went through, binds are watched from its creation",
            state: PlanState::Committing,
            pods: vec![unbound("a"), bound("b")],
            now: 30,
            want: Step::WaitUntil(at(60)),
            ..Case::default()
        },
        Case {
            name: "committing, every pod ungated, all bound: done",
            state: PlanState::Committing,
            pods: vec![bound("a"), bound("b")],
            want: Step::Done,
            ..Case::default()
        },
        Case {
            name: "committing, every pod ungated, one unbound past the timeout since creation: roll back",
            state: PlanState::Committing,
            pods: vec![bound("a"), unbound("b")],
            now: 61,
            want: Step::RollBack(RollBack {
                delete: uids(&["a", "b"]),
                avoid_nodes: nodes(&["n1"]),
                failure: failure("b", "n1", FailureCause::BindTimeout(TIMEOUT), 1, 2),
            }),
            ..Case::default()
        },
        Case {
            name: "resuming ignores the bind timeout (the pods just ungated get it whole)",
            state: PlanState::Committing,
            pods: vec![unbound("a"), gated("b")],
            now: 3_600,
            want: Step::Patch(uids(&["b"])),
            ..Case::default()
        },
    ]);
}

#[test]
fn a_plan_cut_short_that_no_longer_fits_is_dropped_or_rolled_back() {
    run(vec![
        Case {
            name: "does not fit, nothing ungated: drop",
            state: PlanState::Committing,
            pods: vec![gated("a"), gated("b")],
            fits: RemainingFits::No("node n1 is full".into()),
            want: Step::Drop,
            ..Case::default()
        },
        Case {
            name: "planned node gone, nothing ungated: drop",
            state: PlanState::Planned,
            pods: vec![node_gone(gated("a")), gated("b")],
            want: Step::Drop,
            ..Case::default()
        },
        Case {
            name: "does not fit, some ungated: roll the attempt back",
            state: PlanState::Committing,
            pods: vec![on(unbound("a"), "n2"), gated("b")],
            fits: RemainingFits::No("node n1 is full".into()),
            want: Step::RollBack(RollBack {
                delete: uids(&["a", "b"]),
                avoid_nodes: nodes(&[]),
                failure: failure("b", "n1", FailureCause::NoLongerFits("node n1 is full".into()), 2, 2),
            }),
            ..Case::default()
        },
        Case {
            name: "does not fit, but every pod already ungated: nothing left to fit, binds are watched",
            state: PlanState::Committing,
            pods: vec![unbound("a"), bound("b")],
            fits: RemainingFits::No("node n1 is full".into()),
            want: Step::WaitUntil(at(60)),
            ..Case::default()
        },
        Case {
            name: "a gated pod's node gone, some ungated: roll back, avoid that node",
            state: PlanState::Committing,
            pods: vec![on(bound("a"), "n2"), node_gone(on(gated("b"), "n3"))],
            want: Step::RollBack(RollBack {
                delete: uids(&["a", "b"]),
                avoid_nodes: nodes(&["n3"]),
                failure: failure("b", "n3", FailureCause::NodeGone, 1, 2),
            }),
            ..Case::default()
        },
    ]);
}

#[test]
fn an_admitted_plan_waits_for_binds_and_ends_when_all_bound() {
    run(vec![
        Case { name: "every pod bound: done", pods: vec![bound("a"), bound("b")], want: Step::Done, ..Case::default() },
        Case {
            name: "bound, finished or gone all count as done",
            pods: vec![bound("a"), pod("b", "g", "n1", PinState::Finished), pod("c", "g", "n1", PinState::Gone)],
            want: Step::Done,
            ..Case::default()
        },
        Case {
            name: "unbound before the deadline: wait until it",
            pods: vec![bound("a"), unbound("b")],
            now: 30,
            want: Step::WaitUntil(at(60)),
            ..Case::default()
        },
        Case {
            name: "a still-gated pod of an admitted plan waits like an unbound one",
            pods: vec![bound("a"), gated("b")],
            now: 59,
            want: Step::WaitUntil(at(60)),
            ..Case::default()
        },
    ]);
}

#[test]
fn a_failed_pin_before_the_gang_started_rolls_the_attempt_back() {
    run(vec![
        Case {
            name: "bind timeout, 1 of minCount 2 bound: delete every pod, avoid the refusing node",
            pods: vec![on(bound("a"), "n2"), refused("b", "1 node(s) didn't match pod anti-affinity rules")],
            now: 60,
            want: Step::RollBack(RollBack {
                delete: uids(&["a", "b"]),
                avoid_nodes: nodes(&["n1"]),
                failure: PinFailure {
                    scheduler_message: Some("1 node(s) didn't match pod anti-affinity rules".into()),
                    ..failure("b", "n1", FailureCause::BindTimeout(TIMEOUT), 1, 2)
                },
            }),
            ..Case::default()
        },
        Case {
            name: "the same with disruption mode all",
            pods: vec![on(bound("a"), "n2"), unbound("b")],
            now: 61,
            disruption: DisruptionModeKind::All,
            want: Step::RollBack(RollBack {
                delete: uids(&["a", "b"]),
                avoid_nodes: nodes(&["n1"]),
                failure: failure("b", "n1", FailureCause::BindTimeout(TIMEOUT), 1, 2),
            }),
            ..Case::default()
        },
        Case {
            name: "node deleted after pinning: roll back before the deadline",
            pods: vec![on(bound("a"), "n2"), node_gone(on(unbound("b"), "n3"))],
            now: 5,
            want: Step::RollBack(RollBack {
                delete: uids(&["a", "b"]),
                avoid_nodes: nodes(&["n3"]),
                failure: failure("b", "n3", FailureCause::NodeGone, 1, 2),
            }),
            ..Case::default()
        },
        Case {
            name: "timeout avoids every node whose pin failed; finished pods are kept",
            pods: vec![pod("a", "g", "n0", PinState::Finished), on(unbound("b"), "n1"), on(unbound("c"), "n2")],
            requirement: StartRequirement::leaf("g", 3),
            now: 60,
            want: Step::RollBack(RollBack {
                delete: uids(&["b", "c"]),
                avoid_nodes: nodes(&["n1", "n2"]),
                failure: failure("b", "n1", FailureCause::BindTimeout(TIMEOUT), 2, 3),
            }),
            ..Case::default()
        },
        Case {
            name: "composite: one leaf short of its minCount rolls back the whole attempt",
            pods: vec![
                in_group(bound("a1"), "leaf-a"),
                in_group(bound("a2"), "leaf-a"),
                in_group(bound("b1"), "leaf-b"),
                in_group(unbound("b2"), "leaf-b"),
            ],
            requirement: StartRequirement { min_count: BTreeMap::from([("leaf-a".into(), 2), ("leaf-b".into(), 2)]) },
            now: 60,
            want: Step::RollBack(RollBack {
                delete: uids(&["a1", "a2", "b1", "b2"]),
                avoid_nodes: nodes(&["n1"]),
                failure: failure("b2", "n1", FailureCause::BindTimeout(TIMEOUT), 1, 4),
            }),
            ..Case::default()
        },
        Case {
            name: "a plan adding one pod to a running gang rolls back just that pod",
            pods: vec![unbound("c")],
            requirement: StartRequirement::leaf("g", 2),
            now: 60,
            want: Step::RollBack(RollBack {
                delete: uids(&["c"]),
                avoid_nodes: nodes(&["n1"]),
                failure: failure("c", "n1", FailureCause::BindTimeout(TIMEOUT), 1, 1),
            }),
            ..Case::default()
        },
    ]);
}

#[test]
fn a_failed_pin_after_the_gang_started_keeps_the_disruption_mode() {
    let started = || vec![on(bound("a"), "n2"), on(bound("b"), "n3"), unbound("c")];
    run(vec![
        Case {
            name: "single: minCount 2 of 3 bound, the third times out: the gang failed, nothing deleted",
            pods: started(),
            now: 60,
            want: Step::GangFailed {
                delete: vec![],
                failure: failure("c", "n1", FailureCause::BindTimeout(TIMEOUT), 1, 3),
            },
            ..Case::default()
        },
        Case {
            name: "all: the same replaces the whole gang",
            pods: started(),
            now: 60,
            disruption: DisruptionModeKind::All,
            want: Step::GangFailed {
                delete: uids(&["a", "b", "c"]),
                failure: failure("c", "n1", FailureCause::BindTimeout(TIMEOUT), 1, 3),
            },
            ..Case::default()
        },
        Case {
            name: "all: finished pods are not deleted",
            pods: vec![on(pod("a", "g", "n2", PinState::Finished), "n2"), on(bound("b"), "n3"), unbound("c")],
            now: 60,
            disruption: DisruptionModeKind::All,
            want: Step::GangFailed {
                delete: uids(&["b", "c"]),
                failure: failure("c", "n1", FailureCause::BindTimeout(TIMEOUT), 1, 3),
            },
            ..Case::default()
        },
        Case {
            name: "single: the node of an unbound pod is gone after the gang started",
            pods: vec![on(bound("a"), "n2"), on(bound("b"), "n3"), node_gone(unbound("c"))],
            now: 1,
            want: Step::GangFailed { delete: vec![], failure: failure("c", "n1", FailureCause::NodeGone, 1, 3) },
            ..Case::default()
        },
    ]);
}

#[test]
fn a_plan_without_times_counts_the_timeout_from_now() {
    let plan = AdmissionPlan { created_at: None, admitted_at: None, ..plan(PlanState::Admitted) };
    let pods = [unbound("a")];
    let requirement = StartRequirement::leaf("g", 1);
    let input = CommitInput {
        plan: &plan,
        pods: &pods,
        now: at(500),
        bind_timeout: TIMEOUT,
        requirement: &requirement,
        disruption: DisruptionModeKind::Single,
        remaining_fits: RemainingFits::Yes,
        refused: None,
        lost: None,
        claim_settle: Duration::ZERO,
        starting: false,
        waiting: false,
        start_settle: Duration::ZERO,
    };
    assert_eq!(next_step(&input), Step::WaitUntil(at(560)));
}

/// A device of one of the plan's claims held by another claim too.
fn loss() -> DeviceLoss {
    use crate::devices::dra::{ClaimKey, DeviceId};
    DeviceLoss {
        claim: ClaimKey { namespace: "ns".into(), name: "a-gpu".into() },
        device: DeviceId { driver: "gpu.nvidia.com".into(), pool: "n1".into(), device: "gpu-3".into() },
        other: ClaimKey { namespace: "ns".into(), name: "plain".into() },
    }
}

#[test]
fn a_device_another_claim_holds_too_rolls_the_attempt_back_in_every_state() {
    let cause = FailureCause::DeviceTaken(loss().to_string());
    let rollback = |first: &str, unbound, planned, deleted: &[&str]| {
        Step::RollBack(RollBack {
            delete: uids(deleted),
            avoid_nodes: BTreeSet::new(),
            failure: failure(first, "n1", cause.clone(), unbound, planned),
        })
    };
    run(vec![
        Case {
            name: "cut short: one pod ungated, one still gated",
            state: PlanState::Committing,
            pods: vec![unbound("a"), gated("b")],
            now: 1,
            lost: Some(loss()),
            want: rollback("a", 2, 2, &["a", "b"]),
            ..Case::default()
        },
        Case {
            name: "every pod bound, the gang started whole: it still goes, devices and all",
            pods: vec![bound("a"), bound("b")],
            now: 1,
            lost: Some(loss()),
            want: rollback("a", 0, 2, &["a", "b"]),
            ..Case::default()
        },
        Case {
            name: "a finished pod of the attempt is left alone",
            pods: vec![pod("a", "g", "n1", PinState::Finished), bound("b")],
            now: 1,
            lost: Some(loss()),
            want: rollback("b", 0, 2, &["b"]),
            ..Case::default()
        },
    ]);
    let message = failure("a", "n1", cause.clone(), 1, 2).message(None);
    assert!(message.contains("also allocated to ResourceClaim ns/plain"), "{message}");
    assert!(message.contains("device gpu.nvidia.com/n1/gpu-3 of ResourceClaim ns/a-gpu"), "{message}");
}

#[test]
fn a_plan_with_claims_is_followed_until_it_settles_after_every_bind() {
    let settled = |name, state, now, claims, want| Case {
        name,
        state,
        pods: vec![bound("a"), bound("b")],
        now,
        claims,
        claim_settle: Duration::from_secs(5),
        want,
        ..Case::default()
    };
    run(vec![
        settled("claims, 2 s after the plan", PlanState::Admitted, 2, true, Step::WaitUntil(at(5))),
        settled("claims, 5 s after the plan", PlanState::Admitted, 5, true, Step::Done),
        settled("claims, committing, 1 s after", PlanState::Committing, 1, true, Step::WaitUntil(at(5))),
        settled("no claims: done at the last bind", PlanState::Admitted, 2, false, Step::Done),
    ]);
}

#[test]
fn a_plan_whose_pods_are_bound_is_followed_while_they_start_until_it_settles() {
    let case = |name, now, starting, claims, want| Case {
        name,
        pods: vec![bound("a"), bound("b")],
        now,
        starting,
        claims,
        claim_settle: Duration::from_secs(5),
        start_settle: Duration::from_secs(10),
        want,
        ..Case::default()
    };
    run(vec![
        case("starting, 2 s after the plan", 2, true, false, Step::WaitUntil(at(10))),
        case("starting, 10 s after the plan: done, running or not", 10, true, false, Step::Done),
        case("every pod running: done at once", 2, false, false, Step::Done),
        case("running, with claims: the claims' settle still holds", 2, false, true, Step::WaitUntil(at(5))),
        case("starting, with claims: the longer settle", 6, true, true, Step::WaitUntil(at(10))),
    ]);
    // Another pod of the root waits gated: the root must be decided again, so no wait.
    run(vec![Case {
        name: "starting, a pod of the root waits gated",
        pods: vec![bound("a"), bound("b")],
        now: 2,
        starting: true,
        waiting: true,
        start_settle: Duration::from_secs(10),
        want: Step::Done,
        ..Case::default()
    }]);
    // A pod not bound yet is waited for by its bind deadline, whatever the start settle.
    run(vec![Case {
        name: "one pod unbound",
        pods: vec![bound("a"), pod("b", "g", "n1", PinState::Unbound { refusal: None })],
        now: 2,
        starting: true,
        start_settle: Duration::from_secs(10),
        want: Step::WaitUntil(at(60)),
        ..Case::default()
    }]);
}

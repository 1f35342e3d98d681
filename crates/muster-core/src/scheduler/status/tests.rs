//! The status module's tables: what a group's status says, and when it is written.

use super::*;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use muster_api::scheduling::{
    AdmissionPlan, CompositePodGroup, CompositePodGroupStatus, GroupPhase, PodGroup, PodGroupStatus,
};
use std::time::Instant;

use crate::conditions;
use muster_api::ROLLED_BACK_ANNOTATION;

mod error_condition {
    use super::*;

    #[test]
    fn an_error_is_a_condition_until_an_attempt_goes_through() {
        let now = Timestamp::from_second(1_000).expect("ts");
        let mut conds = Vec::new();
        error_condition(&mut conds, None, Some(1), now);
        assert!(conds.is_empty(), "no error ever: no condition");
        error_condition(&mut conds, Some("admission could not commit its plan: forbidden"), Some(1), now);
        assert_eq!((conds[0].status.as_str(), conds[0].reason.as_str()), ("True", "APIError"));
        error_condition(&mut conds, None, Some(1), now);
        assert_eq!((conds[0].status.as_str(), conds[0].reason.as_str()), ("False", "Recovered"));
    }
}

mod group {
    use super::*;
    use muster_api::PodGroupSpec;
    use muster_api::blocks::{DisruptionMode, PodGroupSchedulingPolicy};
    use serde_json::json;

    fn pod(phase: &str, gated: bool, node: Option<&str>) -> Pod {
        let mut spec = json!({"containers": [{"name": "c"}]});
        if gated {
            spec["schedulingGates"] = json!([{"name": muster_api::ADMISSION_GATE}]);
        }
        if let Some(n) = node {
            spec["nodeName"] = json!(n);
        }
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec, "status": {"phase": phase}}))
            .expect("pod")
    }

    fn group(min: i32) -> PodGroup {
        PodGroup::new(
            "g",
            PodGroupSpec {
                scheduling_policy: PodGroupSchedulingPolicy::gang(Some(min)),
                disruption_mode: DisruptionMode::single(),
                ..Default::default()
            },
        )
    }

    #[test]
    fn the_short_reason_says_why_a_group_waits_or_failed_and_nothing_once_it_runs() {
        let unfit = Outcome::Unschedulable("0/2 nodes fit".into(), "Insufficient nvidia.com/gpu".into());
        let waiting = Outcome::Waiting("waiting for quorum".into());
        let cases = [
            (GroupPhase::Pending, Some(&waiting), Some("WaitingForQuorum")),
            (GroupPhase::Unschedulable, Some(&unfit), Some("Insufficient nvidia.com/gpu")),
            (GroupPhase::Failed, Some(&Outcome::BindFailed("x".into())), Some("BindTimeout")),
            (GroupPhase::Pending, Some(&Outcome::RolledBack("x".into())), Some("BindFailed")),
            (GroupPhase::Pending, Some(&Outcome::Excluded("x".into())), Some("NamespaceExcluded")),
            // Admitted, running or done: no reason, whatever admission last said.
            (GroupPhase::Running, Some(&unfit), None),
            (GroupPhase::Succeeded, Some(&waiting), None),
            (GroupPhase::Admitted, Some(&Outcome::Admitted("x".into())), None),
            // Failed with every pod gone, not quorate any more: the phase says it all.
            (GroupPhase::Failed, Some(&waiting), None),
            (GroupPhase::Pending, None, None),
        ];
        for (phase, outcome, want) in cases {
            assert_eq!(short_reason(phase, outcome).as_deref(), want, "{phase:?} {outcome:?}");
        }
    }

    #[test]
    fn a_wait_starts_at_the_newest_pod_or_when_an_attempt_was_rolled_back() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
        let at = |s: i64| Timestamp::from_second(s).expect("ts");
        let condition = |type_: &str, status: &str, reason: &str, since: i64| Condition {
            type_: type_.into(),
            status: status.into(),
            last_transition_time: Time(at(since)),
            message: String::new(),
            reason: reason.into(),
            observed_generation: None,
        };
        let admitted = |status: &str, reason: &str, since: i64| condition(condition::ADMITTED, status, reason, since);
        let other = condition("Other", "False", "BindFailed", 900);
        let cases = [
            ("pods only: the newest", vec![100, 300, 200], vec![], Some(300)),
            ("rolled back later: a new wait", vec![100, 200], vec![admitted("False", "BindFailed", 500)], Some(500)),
            ("timed out later: a new wait", vec![100, 200], vec![admitted("False", "BindTimeout", 500)], Some(500)),
            ("rolled back before the last pod", vec![100, 700], vec![admitted("False", "BindFailed", 500)], Some(700)),
            // A first status, written seconds after the gang was complete, moves nothing.
            ("a first unschedulable", vec![100, 200], vec![admitted("False", "Unschedulable", 206)], Some(200)),
            ("a first wait for quorum", vec![100], vec![admitted("False", "WaitingForQuorum", 106)], Some(100)),
            ("admitted true is no wait start", vec![100], vec![admitted("True", "Admitted", 800)], Some(100)),
            ("other conditions do not count", vec![100], vec![other.clone()], Some(100)),
            ("nothing known", vec![], vec![other], None),
        ];
        for (case, created, conditions, want) in cases {
            let got = wait_started(created.into_iter().map(at), &conditions);
            assert_eq!(got, want.map(at), "{case}");
        }
    }

    fn now() -> Timestamp {
        Timestamp::from_second(1_000).expect("ts")
    }

    #[test]
    fn a_status_is_computed_again_when_what_it_is_computed_from_changes() {
        let mut g = group(2);
        g.metadata.resource_version = Some("5".into());
        let (a, b) = (pod("Pending", true, None), pod("Pending", true, None));
        let pods: Vec<&Pod> = vec![&a, &b];
        let waiting = Outcome::Waiting("waiting for quorum".into());
        let base = status_inputs(&g, &pods, Some(&waiting), None);
        assert_eq!(base, status_inputs(&g, &pods, Some(&waiting), None), "same inputs, same fingerprint");
        let mut moved = b.clone();
        moved.metadata.resource_version = Some("9".into());
        let changed: [(&str, u64); 5] = [
            ("a pod changed", status_inputs(&g, &[&a, &moved], Some(&waiting), None)),
            ("a pod less", status_inputs(&g, &[&a], Some(&waiting), None)),
            ("another outcome", status_inputs(&g, &pods, Some(&Outcome::Admitted("x".into())), None)),
            ("an error", status_inputs(&g, &pods, Some(&waiting), Some("forbidden"))),
            ("the group changed", {
                let mut g2 = g.clone();
                g2.metadata.resource_version = Some("6".into());
                status_inputs(&g2, &pods, Some(&waiting), None)
            }),
        ];
        for (case, fingerprint) in changed {
            assert_ne!(fingerprint, base, "{case}");
        }
    }

    #[test]
    fn a_young_groups_first_status_waits_until_the_group_is_old_enough() {
        use std::time::Duration;
        let created = Time(Timestamp::from_second(1_000).expect("ts"));
        let at = |ms: i64| Timestamp::from_millisecond(1_000_000 + ms).expect("ts");
        // The stamp has whole seconds: a group stamped 1,000 s was made before 1,001 s.
        assert_eq!(first_status_wait(Some(&created), at(200)), Some(Duration::from_millis(5_800)));
        assert_eq!(first_status_wait(Some(&created), at(2_000)), Some(Duration::from_millis(4_000)));
        assert_eq!(first_status_wait(Some(&created), at(5_500)), Some(Duration::from_millis(500)));
        assert_eq!(first_status_wait(Some(&created), at(6_000)), None);
        assert_eq!(first_status_wait(Some(&created), at(60_000)), None);
        assert_eq!(first_status_wait(Some(&created), at(-500)), None, "created ahead of this clock: now");
        assert_eq!(first_status_wait(None, at(0)), None);

        let pods = [pod("Pending", true, None)];
        let refs: Vec<&Pod> = pods.iter().collect();
        let first = pod_group_status(&group(2), &refs, None, now());
        assert_eq!(pace_of(None, &first, Some(&created), at(200)), Pace::Young(Duration::from_millis(5_800)));
        assert_eq!(pace_of(None, &first, Some(&created), at(6_000)), Pace::Standing);
        // Claim statuses written by the job controller first: still the group's first status.
        let claims_only = PodGroupStatus {
            resource_claim_statuses: vec![muster_api::scheduling::PodGroupResourceClaimStatus {
                name: "shared".into(),
                resource_claim_name: Some("train-shared".into()),
            }],
            ..PodGroupStatus::default()
        };
        assert_eq!(claims_only.standing(), (None, Vec::new()));
        assert_eq!(
            pace_of(Some(&claims_only), &first, Some(&created), at(200)),
            Pace::Young(Duration::from_millis(5_800))
        );
        assert_eq!(pace_of(Some(&claims_only), &first, Some(&created), at(6_000)), Pace::Standing);
        let counted = PodGroupStatus { pods: first.pods + 1, ..first.clone() };
        assert_eq!(pace_of(Some(&first), &counted, Some(&created), at(200)), Pace::Counts);
        let admitted = PodGroupStatus { phase: Some(GroupPhase::Admitted), ..first.clone() };
        assert_eq!(pace_of(Some(&first), &admitted, Some(&created), at(200)), Pace::Standing);
    }

    #[test]
    fn counts_pods_by_state() {
        let pods = [
            pod("Pending", true, None),
            pod("Pending", false, None),
            pod("Running", false, Some("n")),
            pod("Succeeded", false, Some("n")),
            pod("Failed", false, Some("n")),
        ];
        let refs: Vec<&Pod> = pods.iter().collect();
        let c = count(&refs);
        assert_eq!((c.pods, c.gated, c.admitted, c.scheduled, c.running, c.succeeded, c.failed), (3, 1, 2, 1, 1, 1, 1));
    }

    #[test]
    fn pods_of_a_rolled_back_attempt_are_not_counted() {
        let mut rolled = pod("Failed", false, Some("n"));
        rolled.metadata.annotations = Some([(ROLLED_BACK_ANNOTATION.to_string(), "plan-1".to_string())].into());
        let pods = [rolled, pod("Pending", true, None)];
        let refs: Vec<&Pod> = pods.iter().collect();
        let c = count(&refs);
        assert_eq!((c.pods, c.gated, c.failed), (1, 1, 0));
    }

    #[test]
    fn a_rolled_back_attempt_leaves_the_group_pending_with_bind_failed() {
        let pods = [pod("Pending", true, None)];
        let refs: Vec<&Pod> = pods.iter().collect();
        let outcome = Outcome::RolledBack("attempt 1 rolled back".into());
        let s = pod_group_status(&group(1), &refs, Some(&outcome), now());
        assert_eq!(s.phase, Some(GroupPhase::Pending), "retried, not failed");
        let c = conditions::get(&s.conditions, condition::BIND_FAILED).expect("condition");
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "BindFailed"));
        let c = conditions::get(&s.conditions, condition::ADMITTED).expect("condition");
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "BindFailed"));
        assert_eq!(s.message.as_deref(), Some("attempt 1 rolled back"));
    }

    #[test]
    fn the_group_says_whether_all_or_nothing_is_guaranteed() {
        let plain = [pod("Pending", true, None)];
        let s = pod_group_status(&group(1), &plain.iter().collect::<Vec<_>>(), None, now());
        let c = conditions::get(&s.conditions, condition::ALL_OR_NOTHING).expect("condition");
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "Modelled"));
        let mut other = pod("Pending", true, None);
        if let Some(spec) = other.spec.as_mut() {
            spec.scheduler_name = Some("volcano".into());
        }
        let pods = [other, pod("Pending", true, None)];
        let s = pod_group_status(&group(1), &pods.iter().collect::<Vec<_>>(), None, now());
        let c = conditions::get(&s.conditions, condition::ALL_OR_NOTHING).expect("condition");
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "NotModelled"));
        assert!(c.message.contains("schedulerName: \"volcano\""), "{}", c.message);
    }

    #[test]
    fn waiting_gang_is_pending_with_the_shortfall() {
        let pods = [pod("Pending", true, None)];
        let refs: Vec<&Pod> = pods.iter().collect();
        let s = pod_group_status(&group(2), &refs, Some(&Outcome::Waiting("waiting for quorum".into())), now());
        assert_eq!(s.phase, Some(GroupPhase::Pending));
        assert_eq!(s.min_count, Some(2));
        assert_eq!(s.message.as_deref(), Some("waiting for quorum"));
        assert!(!conditions::is_true(&s.conditions, condition::POD_GROUP_INITIALLY_SCHEDULED));
    }

    #[test]
    fn unschedulable_gang_says_why() {
        let pods = [pod("Pending", true, None), pod("Pending", true, None)];
        let refs: Vec<&Pod> = pods.iter().collect();
        let s = pod_group_status(
            &group(2),
            &refs,
            Some(&Outcome::Unschedulable("0/2 nodes fit".into(), "Insufficient nvidia.com/gpu".into())),
            now(),
        );
        assert_eq!(s.phase, Some(GroupPhase::Unschedulable));
        assert_eq!(s.reason.as_deref(), Some("Insufficient nvidia.com/gpu"));
        let c = conditions::get(&s.conditions, condition::ADMITTED).expect("condition");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            ("False", "Unschedulable", "0/2 nodes fit")
        );
    }

    #[test]
    fn initially_scheduled_is_terminal() {
        let bound = [pod("Running", false, Some("n")), pod("Running", false, Some("n"))];
        let refs: Vec<&Pod> = bound.iter().collect();
        let mut g = group(2);
        let s = pod_group_status(&g, &refs, Some(&Outcome::Admitted("admitted".into())), now());
        assert!(conditions::is_true(&s.conditions, condition::POD_GROUP_INITIALLY_SCHEDULED));
        assert_eq!(s.phase, Some(GroupPhase::Running));
        g.status = Some(s);
        let lost = [pod("Pending", true, None)];
        let refs: Vec<&Pod> = lost.iter().collect();
        let s = pod_group_status(&g, &refs, None, now());
        assert!(conditions::is_true(&s.conditions, condition::POD_GROUP_INITIALLY_SCHEDULED));
    }

    #[test]
    fn bind_failure_fails_the_group() {
        let pods = [pod("Pending", false, None)];
        let refs: Vec<&Pod> = pods.iter().collect();
        let s = pod_group_status(&group(1), &refs, Some(&Outcome::BindFailed("pod p not bound".into())), now());
        assert_eq!(s.phase, Some(GroupPhase::Failed));
        assert!(conditions::is_true(&s.conditions, condition::BIND_FAILED));
    }

    #[test]
    fn all_succeeded_is_succeeded() {
        let pods = [pod("Succeeded", false, Some("n")), pod("Succeeded", false, Some("n"))];
        let refs: Vec<&Pod> = pods.iter().collect();
        assert_eq!(pod_group_status(&group(2), &refs, None, now()).phase, Some(GroupPhase::Succeeded));
    }

    #[test]
    fn composite_counts_children() {
        let cpg = CompositePodGroup::new(
            "c",
            muster_api::CompositePodGroupSpec {
                scheduling_policy: muster_api::blocks::CompositePodGroupSchedulingPolicy::gang(Some(2)),
                disruption_mode: DisruptionMode::single(),
                ..Default::default()
            },
        );
        let kids = [
            ChildSummary { quorate: true, admitted: true, phase: GroupPhase::Running },
            ChildSummary { quorate: true, admitted: false, phase: GroupPhase::Pending },
        ];
        let s = composite_status(&cpg, &kids, None, now());
        assert_eq!((s.children, s.quorate_children, s.admitted_children, s.min_group_count), (2, 2, 1, Some(2)));
        assert_eq!(s.phase, Some(GroupPhase::Pending));
        let kids = [ChildSummary { quorate: true, admitted: true, phase: GroupPhase::Running }; 2];
        let s = composite_status(&cpg, &kids, None, now());
        assert_eq!(s.phase, Some(GroupPhase::Running));
        assert!(conditions::is_true(&s.conditions, condition::COMPOSITE_INITIALLY_SCHEDULED));
    }
}

mod pace {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    fn status(phase: GroupPhase, pods: i32, admitted: (&str, &str, &str)) -> PodGroupStatus {
        let (status, reason, message) = admitted;
        PodGroupStatus {
            phase: Some(phase),
            pods,
            conditions: vec![Condition {
                type_: "Admitted".into(),
                status: status.into(),
                reason: reason.into(),
                message: message.into(),
                last_transition_time: Time(Timestamp::UNIX_EPOCH),
                observed_generation: None,
            }],
            ..PodGroupStatus::default()
        }
    }

    #[test]
    fn a_write_waits_for_its_pace_after_the_groups_last_write_and_for_a_plans_hold() {
        use std::time::Duration;
        let t0 = Instant::now();
        let s = |ms: u64| t0 + Duration::from_millis(ms);
        let written = |ms| StatusPacing { written: Some(s(ms)), hold: None };
        let held = |w, h| StatusPacing { written: Some(s(w)), hold: Some(s(h)) };
        let cases = [
            ("never written: now", Pace::Standing, StatusPacing::default(), 0, None),
            ("counts, never written: now", Pace::Counts, StatusPacing::default(), 0, None),
            ("a phase 0.3 s after a write: at 1 s", Pace::Standing, written(0), 300, Some(s(1_000))),
            ("a phase 1 s after a write: now", Pace::Standing, written(0), 1_000, None),
            ("counts 1 s after a write: at 5 s", Pace::Counts, written(0), 1_000, Some(s(5_000))),
            ("counts 5 s after a write: now", Pace::Counts, written(0), 5_000, None),
            (
                "a phase while a plan's binds are held: at the hold's end",
                Pace::Standing,
                held(0, 5_000),
                1_200,
                Some(s(5_000)),
            ),
            ("counts past the hold: their own pace", Pace::Counts, held(4_000, 4_500), 4_600, Some(s(9_000))),
            (
                "a young group, never written: when old enough",
                Pace::Young(Duration::from_millis(700)),
                StatusPacing::default(),
                0,
                Some(s(700)),
            ),
            (
                "a young group just committed: its plan's pace",
                Pace::Young(Duration::from_millis(200)),
                written(100),
                100,
                Some(s(1_100)),
            ),
        ];
        for (case, pace, pacing, at, want) in cases {
            assert_eq!(due_at(pace, pacing, s(at)), want, "{case}");
        }
        assert!(written(0).live(s(4_999)) && !written(0).live(s(5_000)), "kept while a count pace can wait on it");
        assert!(held(0, 6_000).live(s(5_500)));
    }

    #[test]
    fn a_status_sent_is_not_sent_again_while_the_cache_shows_the_version_it_was_computed_on() {
        let stamped = |secs: i64, running: i32| {
            let mut s = status(GroupPhase::Admitted, 3, ("True", "Admitted", "fits"));
            s.running = running;
            s.conditions[0].last_transition_time = Time(Timestamp::from_second(secs).expect("ts"));
            serde_json::to_value(&s).expect("json")
        };
        let v7 = Some("7".to_string());
        let sent = SentStatus::of(&v7, &stamped(10, 1));
        assert!(sent.is(&v7, &stamped(10, 1)), "the same status on the same version");
        assert!(sent.is(&v7, &stamped(12, 1)), "stamped again on the stale cache: still the same");
        assert!(!sent.is(&v7, &stamped(10, 2)), "another status: sent");
        assert!(!sent.is(&Some("9".to_string()), &stamped(10, 1)), "computed on another version: sent");
    }

    #[test]
    fn the_plan_clear_carries_the_status_fields_admission_computes() {
        let waiting = status(GroupPhase::Pending, 1, ("False", "Waiting", "1 of 3 pods exist"));
        let old = PodGroupStatus {
            message: Some("waiting".into()),
            observed_generation: Some(1),
            rollbacks: 2,
            resource_claim_statuses: vec![muster_api::scheduling::PodGroupResourceClaimStatus {
                name: "shared".into(),
                resource_claim_name: Some("c".into()),
            }],
            ..waiting
        };
        let new = PodGroupStatus {
            message: None,
            observed_generation: Some(2),
            ..status(GroupPhase::Admitted, 3, ("True", "Admitted", "fits"))
        };
        let body = fold_body(Some(&old), &new);
        let map = body.as_object().expect("an object");
        assert_eq!(map["plan"], serde_json::Value::Null, "the plan is cleared");
        assert_eq!(map["phase"], "Admitted");
        assert_eq!(map["pods"], 3);
        assert_eq!(map["observedGeneration"], 2);
        assert_eq!(map["conditions"][0]["reason"], "Admitted", "the conditions as computed");
        assert_eq!(map["message"], serde_json::Value::Null, "a field no longer set is removed");
        for theirs in ["rollbacks", "recentRollbacks", "lastRollbackTime", "avoidNodes", "resourceClaimStatuses"] {
            assert!(!map.contains_key(theirs), "{theirs} has a writer of its own");
        }
        // Nothing cached before: the computed fields and the plan's null only.
        let first = fold_body::<PodGroupStatus>(None, &new);
        assert_eq!(first["plan"], serde_json::Value::Null);
        assert!(!first.as_object().expect("an object").contains_key("message"));
    }

    #[test]
    fn a_leaf_roots_status_waits_for_its_pods_to_start_a_composites_for_its_binds() {
        assert!(status_hold(false) > START_SETTLE, "a leaf's plan clear, at START_SETTLE at the latest, comes first");
        assert_eq!(status_hold(true), PLAN_STATUS_HOLD, "a composite's plan records no status: cleared at the binds");
        assert!(PLAN_STATUS_HOLD < START_SETTLE);
    }

    /// A plan of no pods, recorded `Committing`.
    fn committing_plan(id: &str) -> AdmissionPlan {
        AdmissionPlan {
            id: id.into(),
            state: muster_api::scheduling::PlanState::Committing,
            created_at: None,
            admitted_at: None,
            pods: Vec::new(),
            shared_claims: Vec::new(),
        }
    }

    #[test]
    fn the_plan_record_carries_the_plan_and_the_status_computed_with_it() {
        let old = PodGroupStatus {
            message: Some("waiting".into()),
            rollbacks: 1,
            ..status(GroupPhase::Pending, 3, ("False", "Waiting", "3 of 3 pods exist"))
        };
        let new = status(GroupPhase::Admitted, 3, ("True", "Admitted", "fits"));
        let plan = committing_plan("g-1");
        let body = plan_body(Some(&old), &new, &plan);
        let map = body.as_object().expect("an object");
        assert_eq!(map["plan"]["id"], "g-1", "the plan is recorded");
        assert_eq!(map["plan"]["state"], "Committing");
        assert_eq!(map["phase"], "Admitted", "the group says it is admitted from the plan's write on");
        assert_eq!(map["conditions"][0]["reason"], "Admitted");
        assert_eq!(map["message"], serde_json::Value::Null, "a field no longer set is removed");
        assert!(!map.contains_key("rollbacks"), "the rollback record has a writer of its own");
    }

    /// A PodGroup as cached at resourceVersion `version`, with a status of its own.
    fn cached(version: &str, status: &PodGroupStatus) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "scheduling.muster.dev/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": "g", "namespace": "ns", "resourceVersion": version, "labels": {"app": "x"},
                         "managedFields": [{"manager": "muster", "operation": "Update"}]},
            "spec": {"schedulingPolicy": {"gang": {"minCount": 3}}},
            "status": serde_json::to_value(status).expect("status"),
        })
    }

    #[test]
    fn a_status_write_fenced_at_the_cached_version_replaces_the_whole_status_as_the_patch_would() {
        let old = PodGroupStatus {
            message: Some("waiting".into()),
            rollbacks: 2,
            resource_claim_statuses: vec![muster_api::scheduling::PodGroupResourceClaimStatus {
                name: "shared".into(),
                resource_claim_name: Some("c".into()),
            }],
            ..status(GroupPhase::Pending, 3, ("False", "Waiting", "3 of 3 pods exist"))
        };
        let new = status(GroupPhase::Admitted, 3, ("True", "Admitted", "fits"));
        let plan = committing_plan("g-1");
        let group = cached("7", &old);
        let patch = plan_body(Some(&old), &new, &plan);
        let whole = status_replacement(&group, Some("7"), &patch).expect("the cache is at the fence");
        // The status the merge patch makes of the cached one.
        let mut want = group["status"].clone();
        json_patch::merge(&mut want, &patch);
        assert_eq!(whole["status"], want);
        let written: PodGroupStatus = serde_json::from_value(whole["status"].clone()).expect("a status");
        assert_eq!(written.phase, Some(GroupPhase::Admitted));
        assert_eq!(written.plan.as_ref().map(|p| p.id.as_str()), Some("g-1"));
        assert_eq!(written.message, None, "a field the patch removes is gone");
        assert_eq!(
            (written.rollbacks, written.resource_claim_statuses.len()),
            (2, 1),
            "what other writers keep in the status goes back as cached"
        );
        assert_eq!(whole["metadata"]["resourceVersion"], "7", "the fence");
        assert!(whole["metadata"].get("managedFields").is_none(), "the API server keeps its own");
        assert_eq!((&whole["spec"], &whole["metadata"]["labels"]), (&group["spec"], &group["metadata"]["labels"]));
        // The plan's clear, from the status just written.
        let cleared = status_replacement(&whole, Some("7"), &fold_body(Some(&written), &new)).expect("at the fence");
        assert!(cleared["status"].get("plan").is_none(), "the clear removes the plan");
        // A group cached without a status.
        let mut bare = cached("3", &old);
        bare.as_object_mut().expect("an object").remove("status");
        let first = status_replacement(&bare, Some("3"), &patch).expect("at the fence");
        assert_eq!(first["status"]["phase"], "Admitted");
        assert!(first["status"].get("message").is_none(), "a null of the patch sets nothing");
    }

    #[test]
    fn a_status_write_not_fenced_at_the_cached_version_stays_a_patch() {
        let old = status(GroupPhase::Pending, 3, ("False", "Waiting", "3 of 3 pods exist"));
        let patch = fold_body(Some(&old), &status(GroupPhase::Running, 3, ("True", "Admitted", "fits")));
        let group = cached("7", &old);
        assert_eq!(status_replacement(&group, Some("8"), &patch), None, "the cache has not seen muster's last write");
        assert_eq!(status_replacement(&group, None, &patch), None, "an unfenced write");
        let mut unversioned = group.clone();
        unversioned["metadata"].as_object_mut().expect("metadata").remove("resourceVersion");
        assert_eq!(status_replacement(&unversioned, Some("7"), &patch), None, "a cache without a version");
    }
}

mod disposition {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    fn status(phase: GroupPhase, pods: i32) -> PodGroupStatus {
        PodGroupStatus {
            phase: Some(phase),
            pods,
            conditions: vec![Condition {
                type_: "Admitted".into(),
                status: "False".into(),
                reason: "WaitingForQuorum".into(),
                message: "1 of 3".into(),
                last_transition_time: Time(Timestamp::UNIX_EPOCH),
                observed_generation: None,
            }],
            ..PodGroupStatus::default()
        }
    }

    #[test]
    fn a_computed_status_is_left_alone_folded_into_a_clear_kept_or_written_at_its_pace() {
        let now = Timestamp::from_second(1_000).expect("ts");
        let old_enough = Time(Timestamp::from_second(900).expect("ts"));
        let pending = status(GroupPhase::Pending, 1);
        let admitted = status(GroupPhase::Admitted, 3);
        let counted = status(GroupPhase::Pending, 2);
        // Only the commit protocol's record differs: the same status.
        let planned = PodGroupStatus { rollbacks: 4, ..pending.clone() };
        // (case, cached, computed, the plan clears, the root settles, what becomes of it)
        type Case<'a> = (&'a str, Option<&'a PodGroupStatus>, &'a PodGroupStatus, bool, bool, &'a str);
        let cases: [Case<'_>; 8] = [
            ("unchanged", Some(&pending), &pending, false, false, "same"),
            ("unchanged but for the commit record", Some(&planned), &pending, false, false, "same"),
            ("unchanged, the plan clears: nothing to fold", Some(&pending), &pending, true, false, "same"),
            ("a new phase, the plan clears", Some(&pending), &admitted, true, false, "fold"),
            (
                "a new phase, the plan clears while settling: the clear carries it",
                Some(&pending),
                &admitted,
                true,
                true,
                "fold",
            ),
            ("a new phase while the root settles", Some(&pending), &admitted, false, true, "kept"),
            ("a new phase", Some(&pending), &admitted, false, false, "standing"),
            ("counts only", Some(&pending), &counted, false, false, "counts"),
        ];
        for (case, old, new, clears, settles, want) in cases {
            let got = match disposition(old, new, Some(&old_enough), clears, settles, now) {
                Disposition::Same => "same",
                Disposition::Fold(body) => {
                    assert_eq!(body, fold_body(old, new), "{case}: the clear's body");
                    "fold"
                }
                Disposition::Kept => "kept",
                Disposition::Write(Pace::Standing) => "standing",
                Disposition::Write(Pace::Counts) => "counts",
                Disposition::Write(Pace::Young(_)) => "young",
            };
            assert_eq!(got, want, "{case}");
        }
        let young = Time(Timestamp::from_second(1_000).expect("ts"));
        assert!(
            matches!(disposition(None, &pending, Some(&young), false, false, now), Disposition::Write(Pace::Young(_))),
            "a young group's first status waits"
        );
    }

    #[test]
    fn a_child_counts_as_admitted_once_its_quorum_is() {
        let leaf = |min: Option<i32>, admitted: i32, succeeded: i32, failed: i32, phase: Option<GroupPhase>| {
            PodGroupStatus { min_count: min, admitted, succeeded, failed, phase, ..PodGroupStatus::default() }
        };
        let cases = [
            (
                "no status yet",
                None,
                false,
                ChildSummary { quorate: false, admitted: false, phase: GroupPhase::Pending },
            ),
            (
                "short of its minCount",
                Some(leaf(Some(3), 2, 0, 0, Some(GroupPhase::Pending))),
                true,
                ChildSummary { quorate: true, admitted: false, phase: GroupPhase::Pending },
            ),
            (
                "admitted, finished pods count",
                Some(leaf(Some(3), 1, 1, 1, Some(GroupPhase::Running))),
                true,
                ChildSummary { quorate: true, admitted: true, phase: GroupPhase::Running },
            ),
            (
                "no minCount: one pod",
                Some(leaf(None, 1, 0, 0, None)),
                false,
                ChildSummary { quorate: false, admitted: true, phase: GroupPhase::Pending },
            ),
        ];
        for (case, status, quorate, want) in cases {
            assert_eq!(ChildSummary::of_pod_group(status.as_ref(), quorate), want, "{case}");
        }
        let composite = |min: Option<i32>, admitted: i32| CompositePodGroupStatus {
            min_group_count: min,
            admitted_children: admitted,
            phase: Some(GroupPhase::Admitted),
            ..CompositePodGroupStatus::default()
        };
        assert!(!ChildSummary::of_composite(None, true).admitted);
        assert!(!ChildSummary::of_composite(Some(&composite(Some(2), 1)), true).admitted);
        assert!(ChildSummary::of_composite(Some(&composite(Some(2), 2)), true).admitted);
        assert!(ChildSummary::of_composite(Some(&composite(None, 1)), true).admitted);
        assert_eq!(ChildSummary::of_composite(Some(&composite(None, 1)), false).phase, GroupPhase::Admitted);
    }
}

//! Following a recorded plan across cycles (the bind watch): its pods read as they are now, what
//! is left of a plan cut short, and the core's next step ([`scheduler::next_step`]) carried out.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;

use super::job::Committed;
use crate::controllers::admission::{Admitter, GroupRef, RootKey, World};
use crate::controllers::context::Result;
use crate::crds::scheduling::{AdmissionPlan, PlanState};
use crate::devices::parse_indices;
use crate::pods::{Lifecycle, PodClass};
use crate::scheduler::status::start_settle;
use crate::scheduler::{
    self, CommitInput, Dra, FailureCause, GatedPin, GroupCount, PinState, PlannedPodNow, RemainingFits, Snapshot,
    StartRequirement, Step,
};

/// How long a plan that allocated DRA claims is followed after its creation, every pod bound
/// or not: another allocator's write of one of its devices lands within this (see
/// `CommitInput::claim_settle`).
const CLAIM_SETTLE: Duration = Duration::from_secs(5);

/// Each planned pod as it is now, for the commit state machine.
fn pods_now(plan: &AdmissionPlan, root: &str, world: &World<'_>) -> Vec<PlannedPodNow> {
    plan.pods
        .iter()
        .map(|planned| {
            let pod = world.pods_by_uid.get(planned.uid.as_str()).copied();
            PlannedPodNow {
                name: planned.name.clone(),
                uid: planned.uid.clone(),
                pod_group: if planned.pod_group.is_empty() { root.to_string() } else { planned.pod_group.clone() },
                node: planned.node.clone(),
                node_exists: world.nodes.contains(planned.node.as_str()),
                state: pod.map_or(PinState::Gone, PinState::of),
            }
        })
        .collect()
}

/// Whether a pod of the plan is bound but not running yet.
fn starting(plan: &AdmissionPlan, world: &World<'_>) -> bool {
    plan.pods.iter().filter_map(|p| world.pods_by_uid.get(p.uid.as_str())).any(|pod| {
        let class = PodClass::of(pod);
        class.bound_node().is_some() && class.lifecycle == Lifecycle::Pending && !class.terminating
    })
}

/// Whether a live pod of the root's group outside the plan waits gated for a decision.
fn waiting(plan: &AdmissionPlan, key: &RootKey, world: &World<'_>) -> bool {
    let planned: HashSet<&str> = plan.pods.iter().map(|p| p.uid.as_str()).collect();
    world.by_group.get(key).into_iter().flatten().any(|pod| {
        let class = PodClass::of(pod);
        class.gated() && class.live() && !planned.contains(pod.metadata.uid.as_deref().unwrap_or_default())
    })
}

/// Why a plan cut short cannot go on: a shared claim it was to allocate before the first pod
/// is not allocated (the commit stopped before it), or is gone.
fn unallocated_shared(plan: &AdmissionPlan, ns: &str, dra: &Dra) -> Option<String> {
    plan.shared_claims.iter().find_map(|name| match dra.claim(ns, name) {
        None => Some(format!("shared ResourceClaim {ns}/{name} of the plan is gone")),
        Some(c) if c.allocation.is_none() => {
            Some(format!("shared ResourceClaim {ns}/{name} of the plan is not allocated"))
        }
        Some(_) => None,
    })
}

/// The still-gated pods of a plan and its groups' pod counts, for [`scheduler::remaining_fits`].
fn remaining_of(
    plan: &AdmissionPlan,
    now: &[PlannedPodNow],
    requirement: &StartRequirement,
    ns: &str,
    world: &World<'_>,
    dra: &Dra,
) -> (Vec<GatedPin>, BTreeMap<String, GroupCount>) {
    let mut pins = Vec::new();
    let mut groups: BTreeMap<String, GroupCount> = BTreeMap::new();
    let planned: HashSet<&str> = plan.pods.iter().map(|p| p.uid.as_str()).collect();
    for (planned_pod, pod_now) in plan.pods.iter().zip(now) {
        let count = groups.entry(pod_now.pod_group.clone()).or_default();
        count.min_count = requirement.min_count.get(&pod_now.pod_group).copied().unwrap_or(1);
        if !matches!(pod_now.state, PinState::Gone | PinState::Terminating) {
            count.existing += 1;
        }
        if pod_now.state != PinState::Gated {
            continue;
        }
        let Some(pod) = world.pods_by_uid.get(planned_pod.uid.as_str()) else { continue };
        pins.push(GatedPin {
            name: planned_pod.name.clone(),
            node: planned_pod.node.clone(),
            requests: pod.spec.as_ref().and_then(|s| scheduler::pod_requests(s).ok()).unwrap_or_default(),
            gpus: planned_pod.gpu_indices.as_deref().and_then(|v| parse_indices(v).ok()).unwrap_or_default(),
            own_gpus: dra
                .pod_gpus(pod)
                .filter(|(node, _)| *node == planned_pod.node)
                .map(|(_, g)| g)
                .unwrap_or_default(),
        });
    }
    // Pods of the planned groups started before this plan count toward their minCount too.
    for (group, count) in &mut groups {
        let others = world.by_group.get(&RootKey::leaf(ns, group)).into_iter().flatten().filter(|p| {
            let uid = p.metadata.uid.as_deref().unwrap_or_default();
            let class = PodClass::of(p);
            !planned.contains(uid) && !class.gated() && class.live()
        });
        count.existing += u32::try_from(others.count()).unwrap_or(u32::MAX);
    }
    (pins, groups)
}

impl Admitter {
    /// Follows a recorded plan: gathers the plan's pods as they are now, asks the core's commit
    /// state machine for the next step and carries it out. Returns when to look again. A plan
    /// that has served its purpose is not cleared here but added to `done` (root, version), for
    /// [`Self::clear_plans`] to clear with the others at the end of the cycle, each with its
    /// status.
    pub(in crate::controllers::admission) async fn follow_plan(
        &mut self,
        key: &RootKey,
        group: GroupRef<'_>,
        plan: &AdmissionPlan,
        world: &World<'_>,
        snapshot: &mut Snapshot,
        done: &mut Vec<(RootKey, Option<String>)>,
    ) -> Result<Option<Instant>> {
        let (ns, root) = (&key.ns, &key.name);
        let pods = pods_now(plan, root, world);
        let requirement = StartRequirement::of(plan, root, |name| world.pod_groups.get(&(ns.as_str(), name)).copied());
        let cut_short = plan.state != PlanState::Admitted;
        let remaining_fits = if cut_short {
            let (pins, groups) = remaining_of(plan, &pods, &requirement, ns, world, snapshot.dra());
            match unallocated_shared(plan, ns, snapshot.dra()) {
                Some(why) => RemainingFits::No(why),
                None => scheduler::remaining_fits(snapshot, &pins, &groups),
            }
        } else {
            RemainingFits::Yes
        };
        let refused = self.roots.get(key).and_then(|m| m.refused.as_ref()).filter(|(id, _)| *id == plan.id);
        let refused = refused.map(|(_, r)| r.clone());
        let claims = plan.pods.iter().flat_map(|p| p.claims.iter()).chain(plan.shared_claims.iter());
        let lost = snapshot.dra().lost_device(ns, claims);
        let input = CommitInput {
            plan,
            pods: &pods,
            now: Timestamp::now(),
            bind_timeout: self.ctx.config.bind_timeout,
            requirement: &requirement,
            disruption: group.disruption(),
            remaining_fits,
            refused: refused.as_ref(),
            lost: lost.as_ref(),
            claim_settle: CLAIM_SETTLE,
            starting: starting(plan, world),
            waiting: waiting(plan, key, world),
            start_settle: start_settle(key.composite),
        };
        let version = self.writer.unseen().fence(key, group.version());
        let step = scheduler::next_step(&input);
        if matches!(step, Step::Drop | Step::RollBack(_) | Step::GangFailed { .. }) {
            // The plan ends otherwise than admitted: what the group says of that (the
            // rollback, the failed bind) is written at once, not held for binds that will not
            // come (a later cycle's outcome would replace it unwritten).
            if let Some(pacing) = self.status_pacing.get_mut(key) {
                pacing.hold = None;
            }
        }
        match step {
            Step::Drop => {
                tracing::info!(namespace = %ns, root = %root, "dropping a plan no pod saw; planning afresh");
                // Its claims first: devices held for pods that did not start are freed.
                self.free_claims(ns, plan, world).await?;
                self.writer.clear_plan(key, version, None, None).await?;
                Ok(Some(Instant::now()))
            }
            Step::Patch(uids) => {
                match self.resume(key, version, plan, &uids, world, snapshot).await? {
                    Committed::Refused(r) => {
                        let memory = self.roots.entry(key.clone()).or_default();
                        memory.refused = Some((plan.id.clone(), r));
                    }
                    Committed::Done | Committed::Stale | Committed::TooLarge(_) | Committed::NotReady(_) => {}
                }
                Ok(Some(Instant::now()))
            }
            Step::WaitUntil(at) => {
                let left = at.duration_since(input.now).unsigned_abs();
                Ok(Some(Instant::now() + left + Duration::from_millis(200)))
            }
            Step::Done => {
                // Every pod bound (or gone), and started or settled: the plan has served its
                // purpose.
                let age = plan.created_at.as_ref().map(|t| input.now.duration_since(t.0).as_millis());
                tracing::debug!(group = %key, age_ms = ?age, starting = input.starting, "plan done");
                done.push((key.clone(), version));
                Ok(None)
            }
            Step::RollBack(rollback) => {
                if matches!(rollback.failure.cause, FailureCause::DeviceTaken(_)) {
                    tracing::warn!(namespace = %ns, root = %root, loss = %lost.as_ref().map(ToString::to_string).unwrap_or_default(),
                        "a device of the plan's claims is also allocated to another claim; rolling the attempt back");
                    self.ctx.metrics.dra_devices_lost.inc();
                }
                Ok(Some(self.roll_back(key, group, plan, rollback, world).await?))
            }
            Step::GangFailed { delete, failure } => {
                self.gang_failed(key, version, &delete, &failure, world).await?;
                Ok(Some(Instant::now()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    use serde_json::json;

    use super::super::fixtures::planned;
    use crate::crds::ADMISSION_GATE;
    use crate::crds::scheduling::PodGroup;
    use crate::scheduler::Refusal;
    use k8s_openapi::api::core::v1::Pod;
    use std::sync::Arc;

    fn pod(uid: &str, spec: serde_json::Value, status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": uid, "uid": uid}, "spec": spec, "status": status}))
            .expect("pod")
    }

    #[test]
    fn planned_pods_are_read_into_pin_states() {
        let c = |extra: serde_json::Value| {
            let mut spec = json!({"containers": [{"name": "c"}]});
            if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
                s.extend(e.clone());
            }
            spec
        };
        let refused = json!({"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "1 node(s) didn't match pod anti-affinity rules"}]});
        let pods = [
            pod("gated", c(json!({"schedulingGates": [{"name": ADMISSION_GATE}]})), json!({})),
            pod("refused", c(json!({})), refused),
            pod("bound", c(json!({"nodeName": "n2"})), json!({"phase": "Running"})),
            pod("done", c(json!({"nodeName": "n2"})), json!({"phase": "Succeeded"})),
        ];
        let world = World {
            pods_by_uid: pods.iter().map(|p| (p.metadata.uid.as_deref().unwrap_or_default(), p)).collect(),
            pod_groups: HashMap::new(),
            by_group: &HashMap::new(),
            nodes: HashSet::from(["n1", "n2"]),
        };
        let plan = AdmissionPlan {
            id: "p".into(),
            state: PlanState::Admitted,
            created_at: None,
            admitted_at: None,
            pods: ["gated", "refused", "bound", "done", "gone"].iter().map(|u| planned(u, "", "n1")).collect(),
            shared_claims: Vec::new(),
        };
        let mut plan_on_lost_node = plan.clone();
        plan_on_lost_node.pods[0].node = "n9".into();
        let now = pods_now(&plan_on_lost_node, "root", &world);
        let states: Vec<&PinState> = now.iter().map(|p| &p.state).collect();
        let refusal = Refusal {
            reason: "Unschedulable".into(),
            message: "1 node(s) didn't match pod anti-affinity rules".into(),
        };
        assert_eq!(
            states,
            [
                &PinState::Gated,
                &PinState::Unbound { refusal: Some(refusal) },
                &PinState::Bound { node: "n2".into() },
                &PinState::Finished,
                &PinState::Gone,
            ]
        );
        assert!(now.iter().all(|p| p.pod_group == "root"), "a plan without group names is the root's");
        assert_eq!(now.iter().map(|p| p.node_exists).collect::<Vec<_>>(), [false, true, true, true, true]);
    }

    #[test]
    fn the_start_requirement_is_each_planned_groups_min_count() {
        let pg = |name: &str, min: Option<i32>| -> PodGroup {
            let policy = match min {
                Some(m) => json!({"gang": {"minCount": m}}),
                None => json!({"basic": {}}),
            };
            serde_json::from_value(json!({
                "apiVersion": "scheduling.muster.dev/v1alpha1", "kind": "PodGroup",
                "metadata": {"name": name, "namespace": "ns"},
                "spec": {"schedulingPolicy": policy},
            }))
            .expect("pod group")
        };
        let groups = [pg("a", Some(3)), pg("b", None)].map(Arc::new);
        let plan = AdmissionPlan {
            id: "p".into(),
            state: PlanState::Admitted,
            created_at: None,
            admitted_at: None,
            pods: vec![planned("1", "a", "n"), planned("2", "b", "n"), planned("3", "unknown", "n")],
            shared_claims: Vec::new(),
        };
        let by_name: HashMap<(&str, &str), &PodGroup> = groups
            .iter()
            .map(|g| {
                (
                    (
                        g.metadata.namespace.as_deref().unwrap_or_default(),
                        g.metadata.name.as_deref().unwrap_or_default(),
                    ),
                    &**g,
                )
            })
            .collect();
        let requirement = |ns: &str| StartRequirement::of(&plan, "root", |name| by_name.get(&(ns, name)).copied());
        let want = BTreeMap::from([("a".to_string(), 3), ("b".to_string(), 1), ("unknown".to_string(), 1)]);
        assert_eq!(requirement("ns").min_count, want);
        assert_eq!(requirement("other").min_count.get("a"), Some(&1), "a group of another namespace is not the plan's");
    }
}

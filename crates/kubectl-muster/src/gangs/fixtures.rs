//! Test fixtures of the gangs' tests: groups, their statuses and conditions, jobs, and times.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use muster_api::batch::JobPhase;
use muster_api::blocks::{DisruptionMode, PodGroupSchedulingPolicy};
use muster_api::scheduling::{GroupPhase, PodGroupStatus};
use muster_api::{MusterJob, PodGroup, PodGroupSpec};
use serde_json::json;

pub(super) fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).expect("ts")
}

pub(super) fn cond(type_: &str, status: &str, reason: &str, message: &str, secs: i64) -> Condition {
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: Time(at(secs)),
        observed_generation: None,
    }
}

pub(super) fn owned_by(kind: &str, name: &str) -> Vec<OwnerReference> {
    vec![OwnerReference {
        api_version: "batch.muster.dev/v1alpha1".into(),
        kind: kind.into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        controller: Some(true),
        ..Default::default()
    }]
}

pub(super) fn group(name: &str, min: i32, status: PodGroupStatus) -> PodGroup {
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

pub(super) fn status(phase: GroupPhase, admitted: Condition, message: &str, pods: (i32, i32, i32)) -> PodGroupStatus {
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

pub(super) fn job(name: &str, phase: JobPhase, conditions: Vec<Condition>) -> MusterJob {
    let mut j: MusterJob = serde_json::from_value(json!({
        "apiVersion": "batch.muster.dev/v1alpha1", "kind": "MusterJob",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"template": {"spec": {"containers": []}}},
    }))
    .expect("job");
    j.status = Some(muster_api::batch::MusterJobStatus { phase: Some(phase), conditions, ..Default::default() });
    j
}

//! PURE: what a pod spec asks of kube-scheduler that placement does not model, so an
//! all-or-nothing start cannot be promised for it. Never silent: the webhook returns each as
//! an admission warning naming the field, and admission puts them on the PodGroup as a
//! condition. Everything kube-scheduler's default profile filters on and is not listed here
//! is modelled by placement (see `placement` and `interpod`).

use k8s_openapi::api::core::v1::PodSpec;

/// kube-scheduler's name; an unset `schedulerName` means it too.
pub const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// One thing placement does not model, with the field (relative to the pod spec) that asks
/// for it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Unmodelled {
    /// Field path under the pod spec, e.g. `schedulerName`.
    pub field: String,
    /// What is not modelled and what follows.
    pub why: String,
}

impl std::fmt::Display for Unmodelled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.why)
    }
}

/// What of `spec` placement does not model, in field order.
pub fn unmodelled(spec: &PodSpec) -> Vec<Unmodelled> {
    let mut out = Vec::new();
    let mut add = |field: String, why: &str| out.push(Unmodelled { field, why: why.to_string() });
    if let Some(name) = spec.scheduler_name.as_deref().filter(|n| !n.is_empty() && *n != DEFAULT_SCHEDULER) {
        add(
            "schedulerName".into(),
            &format!(
                "{name:?} is not kube-scheduler's default profile, whose filters muster models; all-or-nothing is not guaranteed"
            ),
        );
    }
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        if v.ephemeral.is_some() {
            add(
                format!("volumes[{i}].ephemeral"),
                "where a generic ephemeral volume can be provisioned is not modelled; all-or-nothing is not guaranteed",
            );
        } else if v.persistent_volume_claim.is_some() || v.csi.is_some() {
            add(
                format!("volumes[{i}]"),
                "per-node volume attach limits (NodeVolumeLimits) are not modelled; a pin they refuse is rolled back",
            );
        }
    }
    out
}

/// A job's claims shared by more pods than muster's own mode can reserve them for, as
/// admission warnings naming the field (relative to the job's `spec`): in muster's own mode
/// every pod is listed in a shared claim's `status.reservedFor`, which holds at most
/// [`super::MAX_RESERVED_FOR`] consumers, so such a gang waits (upstream mode reserves the
/// claim for the PodGroup instead). `group_claims`: `spec.scheduling.resourceClaims`; `pod`:
/// the pod template's spec; `pods`: how many pods the job runs at once; `api`: the job's
/// recorded scheduling API (its annotation; nothing to say for `upstream`).
pub fn shared_claim_warnings(
    pod: Option<&PodSpec>,
    group_claims: &[muster_api::blocks::PodGroupResourceClaim],
    pods: i32,
    api: Option<&str>,
) -> Vec<String> {
    use crate::workloadbuilder::native::SchedulingApi;
    let limit = super::MAX_RESERVED_FOR;
    if usize::try_from(pods).unwrap_or(0) <= limit
        || api.and_then(SchedulingApi::parse) == Some(SchedulingApi::Upstream)
    {
        return Vec::new();
    }
    let why = format!(
        "shared by {pods} pods, more than the {limit} consumers a claim's status.reservedFor lists in muster's own mode: \
         the gang will wait; in upstream mode (batch.muster.dev/scheduling-api: upstream) kube-scheduler reserves the claim \
         for the PodGroup"
    );
    let group = (0..group_claims.len()).map(|i| format!("scheduling.resourceClaims[{i}]: {why}"));
    let named = pod
        .and_then(|p| p.resource_claims.as_ref())
        .into_iter()
        .flatten()
        .enumerate()
        .filter(|(_, c)| c.resource_claim_name.is_some())
        .map(|(i, _)| format!("template.spec.resourceClaims[{i}]: {why}"));
    group.chain(named).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_each_field_placement_cannot_model() {
        let cases: &[(&str, serde_json::Value, &[&str])] = &[
            ("plain_pod", json!({"containers": []}), &[]),
            ("default_scheduler_by_name", json!({"containers": [], "schedulerName": "default-scheduler"}), &[]),
            ("another_scheduler", json!({"containers": [], "schedulerName": "volcano"}), &["schedulerName"]),
            (
                "dra_claims_muster_allocates_or_refuses",
                json!({"containers": [], "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]}),
                &[],
            ),
            (
                "claims_and_ephemeral_volumes",
                json!({"containers": [], "volumes": [{"name": "a", "persistentVolumeClaim": {"claimName": "c"}},
                                                   {"name": "b", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]}),
                &["volumes[0]", "volumes[1].ephemeral"],
            ),
        ];
        for (name, spec, want) in cases {
            let spec: PodSpec = serde_json::from_value(spec.clone()).expect("spec");
            let got: Vec<String> = unmodelled(&spec).into_iter().map(|u| u.field).collect();
            assert_eq!(got, *want, "{name}");
        }
        let spec: PodSpec = serde_json::from_value(json!({"containers": [], "schedulerName": "volcano"})).unwrap();
        assert!(unmodelled(&spec)[0].to_string().starts_with("schedulerName: \"volcano\" is not"));
    }
}

#[cfg(test)]
mod shared_claim_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn claims_shared_by_more_pods_than_reservedfor_holds_are_warned_about() {
        let pod: PodSpec = serde_json::from_value(json!({"containers": [], "resourceClaims": [
            {"name": "own", "resourceClaimTemplateName": "t"},
            {"name": "data", "resourceClaimName": "dataset"}]}))
        .expect("pod spec");
        let group: Vec<muster_api::blocks::PodGroupResourceClaim> =
            serde_json::from_value(json!([{"name": "g", "resourceClaimTemplateName": "g"}])).expect("claims");
        for (pods, want) in [(256, 0), (257, 2), (300, 2)] {
            let got = shared_claim_warnings(Some(&pod), &group, pods, None);
            assert_eq!(got, shared_claim_warnings(Some(&pod), &group, pods, Some("muster")));
            assert!(shared_claim_warnings(Some(&pod), &group, pods, Some("upstream")).is_empty(), "upstream");
            assert_eq!(got.len(), want, "{pods} pods: {got:?}");
            if want > 0 {
                assert!(got[0].starts_with("scheduling.resourceClaims[0]: shared by"), "{got:?}");
                // The template entry is each pod's own claim: only the named one is shared.
                assert!(got[1].starts_with("template.spec.resourceClaims[1]: "), "{got:?}");
                assert!(got.iter().all(|w| w.contains("256") && w.contains("upstream")), "{got:?}");
            }
        }
        assert!(shared_claim_warnings(None, &[], 1000, None).is_empty(), "nothing shared, nothing to say");
    }
}

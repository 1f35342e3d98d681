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

//! `muster run --install-crds`: applies muster's own CRDs at start with server-side apply, then
//! waits until the apiserver serves them. Helm installs a chart's `crds/` once and never
//! upgrades them, so the binary brings the schema it was built with.

use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};

use super::context::{Error, Result};
use crate::crds::CRD_VERSION_ANNOTATION;

/// Server-side apply field manager of the CRDs.
pub const FIELD_MANAGER: &str = "muster-crds";
/// How long to wait for the CRDs to be Established.
const ESTABLISH_TIMEOUT: Duration = Duration::from_secs(60);

fn established(crd: &CustomResourceDefinition) -> bool {
    let conditions = crd.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|cs| cs.iter().any(|c| c.type_ == "Established" && c.status == "True"))
}

/// `a.b.c` as numbers (a pre-release or build suffix is ignored); `None` when it is not one.
fn version(v: &str) -> Option<(u64, u64, u64)> {
    let core = v.trim().trim_start_matches('v').split(['-', '+']).next()?;
    let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
    let out = (parts.next()??, parts.next()??, parts.next()??);
    parts.next().is_none().then_some(out)
}

/// Why `existing` must not be replaced by this muster's CRD: it holds the schema of a newer
/// muster. A CRD without the annotation (or with one that does not parse) is replaced.
fn newer_in_cluster(existing: &CustomResourceDefinition, ours: &str) -> Option<String> {
    let theirs = existing.annotations().get(CRD_VERSION_ANNOTATION)?;
    (version(theirs)? > version(ours)?).then(|| format!("it holds muster {theirs}'s schema, newer than {ours}"))
}

/// Applies every CRD of [`crate::crds::all`] (taking over fields another manager such as Helm
/// set) and waits until each is Established. A CRD that a newer muster wrote is left as it is.
pub async fn install_crds(client: &Client) -> Result<()> {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let crds = crate::crds::all();
    let ours = env!("CARGO_PKG_VERSION");
    let mut applied = 0;
    for crd in &crds {
        let name = crd.name_any();
        if let Some(why) = api.get_opt(&name).await?.as_ref().and_then(|e| newer_in_cluster(e, ours)) {
            tracing::warn!(crd = %name, "not applying the CRD: {why}");
            continue;
        }
        api.patch(&name, &params, &Patch::Apply(crd)).await?;
        applied += 1;
    }
    let deadline = Instant::now() + ESTABLISH_TIMEOUT;
    for crd in &crds {
        let name = crd.name_any();
        while !established(&api.get(&name).await?) {
            if Instant::now() > deadline {
                return Err(Error::Missing(format!("CRD {name} not Established after {ESTABLISH_TIMEOUT:?}")));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    tracing::info!(applied, kept = crds.len() - applied, field_manager = FIELD_MANAGER, "muster's CRDs in place");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        CustomResourceDefinitionCondition, CustomResourceDefinitionStatus,
    };

    fn with_condition(type_: &str, status: &str) -> CustomResourceDefinition {
        CustomResourceDefinition {
            status: Some(CustomResourceDefinitionStatus {
                conditions: Some(vec![CustomResourceDefinitionCondition {
                    type_: type_.into(),
                    status: status.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn annotated(version: Option<&str>) -> CustomResourceDefinition {
        let mut crd = CustomResourceDefinition::default();
        if let Some(v) = version {
            crd.metadata.annotations = Some([(CRD_VERSION_ANNOTATION.to_string(), v.to_string())].into());
        }
        crd
    }

    #[test]
    fn only_a_crd_of_a_newer_muster_is_left_alone() {
        let cases = [
            (None, false),
            (Some("0.1.0"), false),
            (Some("0.0.9"), false),
            (Some("0.1.1"), true),
            (Some("0.10.0"), true),
            (Some("1.0.0-rc.1"), true),
            (Some("v0.2.0"), true),
            (Some("garbage"), false),
            (Some("0.2"), false),
            (Some("0.2.0.1"), false),
        ];
        for (theirs, kept) in cases {
            let why = newer_in_cluster(&annotated(theirs), "0.1.0");
            assert_eq!(why.is_some(), kept, "{theirs:?}: {why:?}");
        }
        assert!(newer_in_cluster(&annotated(Some("0.2.0")), "not-a-version").is_none());
    }

    #[test]
    fn every_crd_carries_this_muster_version() {
        for crd in crate::crds::all() {
            assert_eq!(
                crd.annotations().get(CRD_VERSION_ANNOTATION).map(String::as_str),
                Some(env!("CARGO_PKG_VERSION")),
                "{}",
                crd.name_any()
            );
        }
    }

    #[test]
    fn established_needs_the_established_condition_true() {
        assert!(established(&with_condition("Established", "True")));
        assert!(!established(&with_condition("Established", "False")));
        assert!(!established(&with_condition("NamesAccepted", "True")));
        assert!(!established(&CustomResourceDefinition::default()));
    }

    #[test]
    fn applied_crds_carry_api_version_and_kind() {
        // Server-side apply refuses a body without them.
        for crd in crate::crds::all() {
            let body = serde_json::to_value(&crd).expect("serialize");
            assert_eq!(body["apiVersion"], "apiextensions.k8s.io/v1");
            assert_eq!(body["kind"], "CustomResourceDefinition");
        }
    }
}

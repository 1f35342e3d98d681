//! `muster run --install-crds`: applies muster's own CRDs at start with server-side apply, then
//! waits until the apiserver serves them. Helm installs a chart's `crds/` once and never
//! upgrades them, so the binary brings the schema it was built with.

use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};

use super::context::{Error, Result};

/// Server-side apply field manager of the CRDs.
pub const FIELD_MANAGER: &str = "muster-crds";
/// How long to wait for the CRDs to be Established.
const ESTABLISH_TIMEOUT: Duration = Duration::from_secs(60);

fn established(crd: &CustomResourceDefinition) -> bool {
    let conditions = crd.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|cs| cs.iter().any(|c| c.type_ == "Established" && c.status == "True"))
}

/// Applies every CRD of [`crate::crds::all`] (taking over fields another manager such as Helm
/// set) and waits until each is Established.
pub async fn install_crds(client: &Client) -> Result<()> {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let crds = crate::crds::all();
    for crd in &crds {
        api.patch(&crd.name_any(), &params, &Patch::Apply(crd)).await?;
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
    tracing::info!(count = crds.len(), field_manager = FIELD_MANAGER, "applied muster's CRDs");
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

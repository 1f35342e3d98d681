//! The set's headless Service (JobSet's `network`): named after the set's subdomain, selecting
//! the set's pods, publishing not-ready addresses as `publishNotReadyAddresses` says. Made only
//! with `enableDNSHostnames` (the default).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};

use super::super::context::Result;
use super::super::controller_uid;
use crate::crds::JOBSET_NAME_LABEL;
use crate::crds::batch::MusterJobSet;

/// The Service the set wants, `None` without DNS hostnames.
pub fn desired(set: &MusterJobSet, owner: OwnerReference) -> Option<Service> {
    if !super::plan::dns_hostnames(&set.spec) {
        return None;
    }
    let name = super::plan::subdomain(set);
    Some(Service {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: set.metadata.namespace.clone(),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            selector: Some(BTreeMap::from([(
                JOBSET_NAME_LABEL.to_string(),
                set.metadata.name.clone().unwrap_or_default(),
            )])),
            publish_not_ready_addresses: Some(super::plan::publish_not_ready_addresses(&set.spec)),
            ..Default::default()
        }),
        status: None,
    })
}

/// Applies the set's Service (when it wants one) unless a Service of that name exists and is
/// not the set's: then it is left alone, and the note returned says so. An existing Service of
/// the set that already says what is wanted is not written again.
pub async fn apply(
    client: &Client,
    set: &MusterJobSet,
    owner: OwnerReference,
    field_manager: &str,
) -> Result<Option<String>> {
    let uid = owner.uid.clone();
    let Some(svc) = desired(set, owner) else { return Ok(None) };
    let name = svc.metadata.name.clone().unwrap_or_default();
    let api = Api::<Service>::namespaced(client.clone(), set.metadata.namespace.as_deref().unwrap_or_default());
    if let Some(existing) = api.get_opt(&name).await? {
        if controller_uid(&existing.metadata) != Some(uid.as_str()) {
            return Ok(Some(format!(
                "Service {name} exists and is not controlled by this MusterJobSet: muster leaves it as it is, so the pods get no stable DNS names through it"
            )));
        }
        let (have, want) = (existing.spec.unwrap_or_default(), svc.spec.clone().unwrap_or_default());
        if have.selector == want.selector
            // Go's `bool` with omitempty: false reads back as unset.
            && have.publish_not_ready_addresses.unwrap_or(false) == want.publish_not_ready_addresses.unwrap_or(false)
            && have.cluster_ip.as_deref() == Some("None")
        {
            return Ok(None);
        }
    }
    // k8s-openapi's structs carry no apiVersion/kind; server-side apply needs them.
    let mut body = serde_json::to_value(&svc)?;
    body["apiVersion"] = "v1".into();
    body["kind"] = "Service".into();
    api.patch(&name, &PatchParams::apply(field_manager).force(), &Patch::Apply(&body)).await?;
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(network: serde_json::Value) -> MusterJobSet {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "batch.muster.dev/v1alpha1", "kind": "MusterJobSet",
            "metadata": {"name": "s", "namespace": "ns", "uid": "u1"},
            "spec": {"network": network, "replicatedJobs": [{"name": "a", "template": {"spec": {"template": {}}}}]}
        }))
        .expect("set")
    }

    #[test]
    fn the_service_follows_the_sets_network() {
        let owner = OwnerReference { uid: "u1".into(), ..Default::default() };
        let shown = |network| {
            desired(&set(network), owner.clone()).map(|svc| {
                let spec = svc.spec.unwrap_or_default();
                let selector = spec.selector.unwrap_or_default().get(JOBSET_NAME_LABEL).cloned();
                (svc.metadata.name, spec.cluster_ip, spec.publish_not_ready_addresses, selector)
            })
        };
        let row =
            |name: &str, publish: bool| Some((Some(name.into()), Some("None".into()), Some(publish), Some("s".into())));
        assert_eq!(shown(serde_json::json!(null)), row("s", true), "defaults: named after the set, published");
        assert_eq!(
            shown(serde_json::json!({"subdomain": "net", "publishNotReadyAddresses": false})),
            row("net", false)
        );
        assert_eq!(shown(serde_json::json!({"enableDNSHostnames": false, "subdomain": "net"})), None);
    }
}

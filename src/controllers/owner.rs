//! What muster creates at run time in its own namespace (the leader Lease, the self-managed
//! webhook certificate Secret) is owned by the ServiceAccount muster runs as, read from the
//! bound token kubelet mounts into its pod (`muster_core::owners::service_account_owner`). So
//! deleting the install (`helm uninstall` deletes the ServiceAccount) lets the garbage collector
//! take them, and nothing of muster's is left but the CRDs. Outside a pod (no token file) there
//! is no owner and nothing changes.

use std::sync::OnceLock;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use muster_core::owners::{service_account_owner, with_owner};

/// Where kubelet mounts the pod's ServiceAccount token.
pub const TOKEN_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// The ServiceAccount owner of this process's run-time objects, read once; `None` outside a pod
/// or with a token that names no ServiceAccount (logged).
pub fn install_owner() -> Option<&'static OwnerReference> {
    static OWNER: OnceLock<Option<OwnerReference>> = OnceLock::new();
    OWNER
        .get_or_init(|| {
            let token = std::fs::read_to_string(TOKEN_PATH).ok()?;
            match service_account_owner(&token) {
                Ok(owner) => {
                    tracing::info!(service_account = %owner.name, uid = %owner.uid, "run-time objects are owned by this ServiceAccount");
                    Some(owner)
                }
                Err(e) => {
                    tracing::warn!(error = %e, path = TOKEN_PATH, "no owner for run-time objects: they outlive the install");
                    None
                }
            }
        })
        .as_ref()
}

/// Makes the leader Lease exist with `owner` among its owners, before the lease manager uses it
/// (it creates a missing Lease without owners). A failure is logged, never fatal: leadership
/// does not depend on it.
pub async fn own_lease(client: &Client, namespace: &str, name: &str, owner: &OwnerReference) {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let result = async {
        let existing = match api.get_opt(name).await? {
            Some(lease) => lease,
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(name.into()),
                        owner_references: Some(vec![owner.clone()]),
                        ..Default::default()
                    },
                    spec: None,
                };
                match api.create(&PostParams::default(), &lease).await {
                    Ok(_) => return Ok(()),
                    // Another replica made it: add the owner to theirs.
                    Err(kube::Error::Api(e)) if e.code == 409 => api.get(name).await?,
                    Err(e) => return Err(e),
                }
            }
        };
        if let Some(refs) = with_owner(&existing.metadata, owner) {
            let patch = serde_json::json!({"metadata": {"ownerReferences": refs}});
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        }
        Ok::<(), kube::Error>(())
    }
    .await;
    if let Err(e) = result {
        tracing::warn!(error = %e, lease = name, "could not set the leader Lease's owner: it will outlive the install");
    }
}

//! The nominated node of pods (`status.nominatedNodeName`): the one write both preemption (a
//! preemptor's pods nominated to the nodes its victims free) and commit (a pod placed elsewhere
//! nominated to its new node first) make. It calls nothing else of admission.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::controllers::lean_writes;

/// Writes (`Some`) or clears (`None`) the nominated node of each pod; a pod gone meanwhile
/// is skipped, other errors are logged (the next decision writes again).
pub(super) async fn write_nominations(client: &kube::Client, ns: &str, writes: Vec<(String, Option<String>)>) {
    let api = Api::<Pod>::namespaced(client.clone(), ns);
    futures::stream::iter(writes.into_iter().map(|(name, node)| {
        let api = api.clone();
        async move {
            let body = json!({"status": {"nominatedNodeName": node}});
            match lean_writes::patch_status(&api, &name, &PatchParams::default(), &Patch::Merge(&body)).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => tracing::warn!(pod = %name, namespace = %ns, error = %e, "could not write a nomination"),
            }
        }
    }))
    .buffer_unordered(16)
    .collect::<Vec<()>>()
    .await;
}

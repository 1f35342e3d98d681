//! Writes whose answer muster reads for its metadata only (a name, a resourceVersion, or
//! nothing): they ask the API server to send back the object's metadata
//! (`as=PartialObjectMetadata`), not the whole object. The server then encodes, and muster
//! decodes, the object's metadata instead of the whole object (a pod's spec and status, a
//! group's status with its plan). The writes muster makes per pod or per gang and reads no more
//! of than metadata go this way: pod creates, pins, GPU indices and finalizer releases, plan
//! records, the status writes of groups and jobs (thousands each in a burst of gangs), rollback
//! marks, nominations, preemption conditions and claim reservations. Applies made once per
//! object (a job's children, the CRDs) keep kube's whole answer.
//!
//! A merge patch of the object itself is kube's [`Api::patch_metadata`] (which writes any field
//! the patch names, despite its name); creates and writes of the status subresource are here.

use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, Ordering};

use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::core::{PartialObjectMeta, Request};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The media type that asks for an answer of the object's metadata only.
const METADATA_ONLY: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";

/// Creates `object`; the answer carries the new object's metadata (its name, uid and
/// resourceVersion), not the object.
pub async fn create<K>(api: &Api<K>, pp: &PostParams, object: &K) -> kube::Result<PartialObjectMeta<K>>
where
    K: kube::Resource + Serialize + DeserializeOwned + Clone + Debug,
{
    let body = serde_json::to_vec(object).map_err(kube::Error::SerdeError)?;
    let request = Request::new(api.resource_url()).create(pp, body).map_err(kube::Error::BuildRequest)?;
    send(api, request, "create").await
}

/// Patches the status subresource of `name`; the answer carries the object's metadata.
pub async fn patch_status<K, P>(
    api: &Api<K>,
    name: &str,
    pp: &PatchParams,
    patch: &Patch<P>,
) -> kube::Result<PartialObjectMeta<K>>
where
    K: kube::Resource + DeserializeOwned + Clone + Debug,
    P: Serialize + Debug,
{
    let request = Request::new(api.resource_url())
        .patch_subresource("status", name, pp, patch)
        .map_err(kube::Error::BuildRequest)?;
    send(api, request, "patch_status").await
}

/// Replaces the status of `name` with `object`'s (an update of the status subresource: the API
/// server keeps everything of the stored object but the status, and refuses the write with 409
/// unless `object`'s resourceVersion is the stored one); the answer carries the object's
/// metadata. Where the whole object is at hand at the version the write is fenced by, this
/// costs the API server less than a patch, which it applies to the stored object first.
/// `Ok(None)`: RBAC does not let muster update statuses (`forbidden`, set the first time, when
/// it is logged: its role grants `patch` of statuses only, as the chart's did before muster
/// sent updates); the caller patches instead.
pub async fn replace_status<K>(
    api: &Api<K>,
    name: &str,
    object: &serde_json::Value,
    forbidden: &AtomicBool,
) -> kube::Result<Option<PartialObjectMeta<K>>>
where
    K: kube::Resource + DeserializeOwned + Clone + Debug,
{
    if forbidden.load(Ordering::Relaxed) {
        return Ok(None);
    }
    let body = serde_json::to_vec(object).map_err(kube::Error::SerdeError)?;
    let request = Request::new(api.resource_url())
        .replace_subresource("status", name, &PostParams::default(), body)
        .map_err(kube::Error::BuildRequest)?;
    match send(api, request, "replace_status").await {
        // RBAC's refusal says which verb it refused; a webhook's or a policy's does not.
        Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains("cannot update resource") => {
            if !forbidden.swap(true, Ordering::Relaxed) {
                tracing::warn!(error = %e.message,
                    "an update of a status was forbidden; statuses go as patches from now on (grant update on the status subresources, as the chart does)");
            }
            Ok(None)
        }
        written => written.map(Some),
    }
}

/// Sends `request` asking for the metadata only. `verb` names the request in kube's traces.
async fn send<K>(
    api: &Api<K>,
    mut request: axum::http::Request<Vec<u8>>,
    verb: &'static str,
) -> kube::Result<PartialObjectMeta<K>>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug,
{
    request.headers_mut().insert(axum::http::header::ACCEPT, axum::http::HeaderValue::from_static(METADATA_ONLY));
    request.extensions_mut().insert(verb);
    api.clone().into_client().request::<PartialObjectMeta<K>>(request).await
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use k8s_openapi::api::core::v1::Pod;
    use kube::ResourceExt;
    use serde_json::json;

    use super::*;

    /// What a fake API server saw of one request: method, path and query, Accept header, body.
    type Seen = Arc<Mutex<Vec<(String, String, String, String)>>>;

    /// A fake API server that answers every request with a PartialObjectMetadata of a pod
    /// named `p` at resourceVersion 7, and keeps what it saw.
    async fn fake() -> (Api<Pod>, Seen) {
        fake_answering(None).await
    }

    /// The same, answering every request with `refusal` (a Status of code 403) when given.
    async fn fake_answering(refusal: Option<&'static str>) -> (Api<Pod>, Seen) {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let seen: Seen = Arc::default();
        let kept = seen.clone();
        let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
            let kept = kept.clone();
            async move {
                let (parts, body) = request.into_parts();
                let body = axum::body::to_bytes(body, 1 << 20).await.map(|b| b.to_vec()).unwrap_or_default();
                let accept = parts.headers.get("accept").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
                kept.lock().unwrap_or_else(|e| e.into_inner()).push((
                    parts.method.to_string(),
                    parts.uri.to_string(),
                    accept,
                    String::from_utf8_lossy(&body).into_owned(),
                ));
                if let Some(message) = refusal {
                    let status = json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                        "message": message, "reason": "Forbidden", "code": 403});
                    return (axum::http::StatusCode::FORBIDDEN, axum::Json(status));
                }
                let meta = json!({
                    "apiVersion": "meta.k8s.io/v1",
                    "kind": "PartialObjectMetadata",
                    "metadata": {"name": "p", "namespace": "ns", "resourceVersion": "7"}
                });
                (axum::http::StatusCode::OK, axum::Json(meta))
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("bind: {e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("addr: {e}"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        let config = kube::Config::new(format!("http://{addr}").parse().unwrap_or_else(|e| panic!("uri: {e}")));
        let client = kube::Client::try_from(config).unwrap_or_else(|e| panic!("client: {e}"));
        (Api::namespaced(client, "ns"), seen)
    }

    #[tokio::test]
    async fn a_create_asks_for_the_metadata_only_and_sends_the_whole_object() {
        let (api, seen) = fake().await;
        let pod: Pod =
            serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}))
                .unwrap_or_else(|e| panic!("pod: {e}"));
        let made = create(&api, &PostParams::default(), &pod).await.unwrap_or_else(|e| panic!("create: {e}"));
        assert_eq!((made.name_any(), made.resource_version()), ("p".to_string(), Some("7".to_string())));
        let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
        assert_eq!(seen.len(), 1);
        let (method, uri, accept, body) = &seen[0];
        assert_eq!(
            (method.as_str(), uri.as_str(), accept.as_str()),
            ("POST", "/api/v1/namespaces/ns/pods?", METADATA_ONLY)
        );
        let sent: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("body: {e}"));
        assert_eq!(sent["spec"]["containers"][0]["name"], "c", "the object goes whole: {body}");
    }

    #[tokio::test]
    async fn a_status_patch_goes_to_the_status_subresource_and_asks_for_the_metadata_only() {
        let (api, seen) = fake().await;
        let patch = json!({"status": {"phase": "Running"}});
        let params = PatchParams { dry_run: true, ..PatchParams::default() };
        let written =
            patch_status(&api, "p", &params, &Patch::Merge(&patch)).await.unwrap_or_else(|e| panic!("patch: {e}"));
        assert_eq!(written.resource_version().as_deref(), Some("7"));
        let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let (method, uri, accept, body) = &seen[0];
        assert_eq!(method, "PATCH");
        assert!(uri.starts_with("/api/v1/namespaces/ns/pods/p/status?"), "{uri}");
        assert!(uri.contains("dryRun=All"), "the parameters go too: {uri}");
        assert_eq!(accept, METADATA_ONLY);
        assert_eq!(body, &patch.to_string());
    }

    #[tokio::test]
    async fn a_status_replace_puts_the_whole_object_to_the_status_subresource_and_asks_for_the_metadata_only() {
        let (api, seen) = fake().await;
        let object = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "resourceVersion": "6"},
            "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Running"}});
        let forbidden = AtomicBool::new(false);
        let written = replace_status(&api, "p", &object, &forbidden)
            .await
            .unwrap_or_else(|e| panic!("replace: {e}"))
            .unwrap_or_else(|| panic!("updates are allowed"));
        assert_eq!(written.resource_version().as_deref(), Some("7"));
        let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let (method, uri, accept, body) = &seen[0];
        assert_eq!((method.as_str(), accept.as_str()), ("PUT", METADATA_ONLY));
        assert!(uri.starts_with("/api/v1/namespaces/ns/pods/p/status"), "{uri}");
        let sent: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("body: {e}"));
        assert_eq!(sent, object, "the object goes whole, its resourceVersion the fence");
    }

    #[tokio::test]
    async fn a_status_replace_that_rbac_refuses_is_left_to_a_patch_and_not_tried_again() {
        let object = json!({"metadata": {"name": "p", "resourceVersion": "6"}, "status": {"phase": "Running"}});
        let rbac = r#"pods "p" is forbidden: User "system:serviceaccount:muster-system:muster" cannot update resource "pods/status" in API group "" in the namespace "ns""#;
        let (api, seen) = fake_answering(Some(rbac)).await;
        let forbidden = AtomicBool::new(false);
        let first = replace_status(&api, "p", &object, &forbidden).await.unwrap_or_else(|e| panic!("replace: {e}"));
        assert!(first.is_none() && forbidden.load(Ordering::Relaxed), "refused by RBAC: the caller patches");
        let again = replace_status(&api, "p", &object, &forbidden).await.unwrap_or_else(|e| panic!("replace: {e}"));
        assert!(again.is_none());
        assert_eq!(seen.lock().unwrap_or_else(|e| e.into_inner()).len(), 1, "no update is sent once refused");
        // A refusal of another kind (a webhook's) is the write's error, and updates go on.
        let (api, _) = fake_answering(Some("admission webhook \"x\" denied the request")).await;
        let fresh = AtomicBool::new(false);
        let denied = replace_status(&api, "p", &object, &fresh).await;
        assert!(matches!(denied, Err(kube::Error::Api(ref e)) if e.code == 403), "{denied:?}");
        assert!(!fresh.load(Ordering::Relaxed));
    }
}

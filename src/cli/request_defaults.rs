//! What every request of muster's clients says of itself, beside what each call sets.
//!
//! - **`User-Agent: muster/<version> (<component>)`** (`controller` or `node-agent`). The API
//!   server names the field manager of a write that names none after the agent (the part before
//!   the `/`), and its audit log records the whole agent. Without one, kube sends no agent, and
//!   every such write of muster's (pod creates, PodGroup plans and statuses) was owned by
//!   `unknown` in the objects' `managedFields`.
//! - **`fieldValidation=Ignore` on writes** (creates, updates, patches and applies) that do not
//!   ask for another directive. The API server's default, `Warn`, decodes every written object
//!   the strict way, which also looks for unknown and duplicate fields so as to warn of them (and
//!   for a custom resource collects the path of every field pruning dropped). The
//!   objects muster writes are its own typed values, serialized by serde: they hold no duplicate
//!   field, and a field the server does not know is dropped under `Ignore` as under `Warn` (kube
//!   reads no warning header either way). A profile of kube-apiserver at 5,000 nodes put the
//!   strict decodes at 2% of its CPU on the muster path (see the benchmarks' chapter).

use axum::http::header::{HeaderName, HeaderValue, USER_AGENT};
use axum::http::{Method, Request, Uri};
use kube::client::{Body, ClientBuilder};

use super::api_limit::InFlightLimit;

/// A client of `config` for `component` (`controller`, `node-agent`): every request carries
/// its [`headers`], every write ignores field validation ([`ignore_field_validation`]), and
/// `limit`, when given, bounds the requests in flight (shared by the clients built with clones
/// of one bound).
pub fn client(
    mut config: kube::Config,
    component: &'static str,
    limit: Option<InFlightLimit<Body>>,
) -> kube::Result<kube::Client> {
    config.headers.extend(headers(component));
    let defaults = tower::util::MapRequestLayer::new(ignore_field_validation);
    let limit = tower::util::option_layer(limit);
    Ok(ClientBuilder::try_from(config)?.with_layer(&defaults).with_layer(&limit).build())
}

/// The headers every request of `component` carries (kube's `Config::headers`).
fn headers(component: &'static str) -> Vec<(HeaderName, HeaderValue)> {
    let agent = format!("muster/{} ({component})", env!("CARGO_PKG_VERSION"));
    HeaderValue::from_str(&agent).map(|v| vec![(USER_AGENT, v)]).unwrap_or_default()
}

/// PURE: `uri` with `fieldValidation=Ignore` added when `method` writes an object (POST, PUT,
/// PATCH) and the query names no directive of its own; `None`: the request stays as it is.
fn ignoring_field_validation(method: &Method, uri: &Uri) -> Option<Uri> {
    if ![Method::POST, Method::PUT, Method::PATCH].contains(method) {
        return None;
    }
    let query = uri.query().unwrap_or_default();
    if query.split('&').any(|kv| kv.split('=').next() == Some("fieldValidation")) {
        return None;
    }
    let path = uri.path();
    let path_and_query = if query.is_empty() {
        format!("{path}?fieldValidation=Ignore")
    } else {
        format!("{path}?{query}&fieldValidation=Ignore")
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(path_and_query.parse().ok()?);
    Uri::from_parts(parts).ok()
}

/// Adds `fieldValidation=Ignore` to a write that names no directive ([`ignoring_field_validation`]).
fn ignore_field_validation<B>(mut request: Request<B>) -> Request<B> {
    if let Some(uri) = ignoring_field_validation(request.method(), request.uri()) {
        *request.uri_mut() = uri;
    }
    request
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_that_name_no_directive_ignore_field_validation() {
        let cases = [
            (Method::POST, "/api/v1/namespaces/a/pods", Some("/api/v1/namespaces/a/pods?fieldValidation=Ignore")),
            (
                Method::PATCH,
                "/apis/scheduling.muster.dev/v1alpha1/namespaces/a/podgroups/g/status?fieldManager=muster&force=true",
                Some(
                    "/apis/scheduling.muster.dev/v1alpha1/namespaces/a/podgroups/g/status?fieldManager=muster&force=true&fieldValidation=Ignore",
                ),
            ),
            (
                Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/a/leases/l",
                Some("/apis/coordination.k8s.io/v1/namespaces/a/leases/l?fieldValidation=Ignore"),
            ),
            (Method::PATCH, "/api/v1/namespaces/a/pods/p?fieldValidation=Strict", None),
            (Method::PATCH, "/api/v1/namespaces/a/pods/p?dryRun=All&fieldValidation=Warn", None),
            (Method::GET, "/api/v1/namespaces/a/pods/p", None),
            (Method::GET, "/api/v1/pods?watch=true&resourceVersion=1", None),
            (Method::DELETE, "/api/v1/namespaces/a/pods/p", None),
        ];
        for (method, uri, want) in cases {
            let got = ignoring_field_validation(&method, &uri.parse().expect("uri"));
            assert_eq!(got.as_ref().map(ToString::to_string).as_deref(), want, "{method} {uri}");
        }
        // A full URI keeps its scheme and authority.
        let full: Uri = "https://10.0.0.1:6443/api/v1/namespaces/a/pods?dryRun=All".parse().expect("uri");
        let got = ignoring_field_validation(&Method::POST, &full).expect("a write");
        assert_eq!(got.to_string(), "https://10.0.0.1:6443/api/v1/namespaces/a/pods?dryRun=All&fieldValidation=Ignore");
        // A query parameter that only ends in the name is not the directive.
        let other: Uri = "/api/v1/namespaces/a/pods?xfieldValidation=Strict".parse().expect("uri");
        let got = ignoring_field_validation(&Method::POST, &other).expect("a write");
        assert_eq!(got.query(), Some("xfieldValidation=Strict&fieldValidation=Ignore"));
    }

    #[test]
    fn a_request_gets_the_directive_in_place() {
        let request =
            Request::builder().method(Method::PATCH).uri("/api/v1/namespaces/a/pods/p").body(()).expect("request");
        assert_eq!(ignore_field_validation(request).uri().query(), Some("fieldValidation=Ignore"));
        let request =
            Request::builder().method(Method::GET).uri("/api/v1/namespaces/a/pods/p").body(()).expect("request");
        assert_eq!(ignore_field_validation(request).uri().query(), None);
    }

    #[test]
    fn the_agent_names_muster_its_version_and_the_component() {
        let headers = headers("node-agent");
        assert_eq!(headers.len(), 1);
        assert_eq!(headers[0].0, USER_AGENT);
        let agent = headers[0].1.to_str().expect("ascii");
        assert_eq!(agent.split('/').next(), Some("muster"), "the API server names the field manager after this");
        assert_eq!(agent, format!("muster/{} (node-agent)", env!("CARGO_PKG_VERSION")));
    }
}

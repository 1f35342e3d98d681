//! `/metrics` over HTTPS for authenticated, authorised scrapers only (`--metrics-secure-bind-address`),
//! the way kube-rbac-proxy and controller-runtime's filter do it: the bearer token is checked by a
//! TokenReview, then the user it names by a SubjectAccessReview for the non-resource URL
//! `/metrics`, verb `get` (grant it with a ClusterRole of `nonResourceURLs: ["/metrics"]`).
//! Answers: 401 without a valid token, 403 when the user may not, 503 when the API server
//! cannot say. Verdicts are cached for a minute per token (a scrape every 15 s then costs the
//! API server two reviews a minute, not eight).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum_server::tls_rustls::RustlsConfig;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec, SubjectAccessReviewStatus,
};
use kube::Client;
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};

use super::metrics::Metrics;

/// The path and verb a scraper must be allowed.
pub const METRICS_PATH: &str = "/metrics";
/// How long a verdict on a token is kept.
const VERDICT_TTL: Duration = Duration::from_secs(60);
/// Tokens remembered at most (the cache is emptied when full).
const VERDICT_CACHE: usize = 1024;

/// Where the secure endpoint listens and the certificate it serves.
#[derive(Clone, Debug)]
pub struct SecureMetrics {
    /// Address of the HTTPS listener.
    pub addr: SocketAddr,
    /// `tls.crt` and `tls.key` in this folder; a self-signed certificate made at start when
    /// `None`.
    pub cert_dir: Option<PathBuf>,
}

/// A scrape's verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Served.
    Allowed,
    /// 401: no token, or one the API server does not know.
    Unauthenticated(String),
    /// 403: the user may not read `/metrics`.
    Forbidden(String),
}

/// PURE: the verdict from a TokenReview's status and, when it authenticated, the
/// SubjectAccessReview's.
pub fn verdict(token: &TokenReviewStatus, access: Option<&SubjectAccessReviewStatus>) -> Verdict {
    if token.authenticated != Some(true) {
        let why = token.error.clone().filter(|e| !e.is_empty()).unwrap_or_else(|| "token not authenticated".into());
        return Verdict::Unauthenticated(why);
    }
    let user = token.user.as_ref().and_then(|u| u.username.clone()).unwrap_or_default();
    match access {
        Some(a) if a.allowed && a.denied != Some(true) => Verdict::Allowed,
        Some(a) => {
            let why = a.reason.clone().filter(|r| !r.is_empty()).map(|r| format!(": {r}")).unwrap_or_default();
            Verdict::Forbidden(format!("user \"{user}\" may not get {METRICS_PATH}{why}"))
        }
        None => Verdict::Forbidden(format!("user \"{user}\" may not get {METRICS_PATH}")),
    }
}

/// PURE: the bearer token of a request, if it has one.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// sha256 of a token -> (verdict, when).
type Verdicts = HashMap<[u8; 32], (Verdict, Instant)>;

#[derive(Clone)]
struct SecureState {
    metrics: Arc<Metrics>,
    client: Client,
    verdicts: Arc<Mutex<Verdicts>>,
}

impl SecureState {
    async fn review(&self, token: &str) -> anyhow::Result<Verdict> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some((v, at)) = self.cache().get(&key)
            && at.elapsed() < VERDICT_TTL
        {
            return Ok(v.clone());
        }
        let review = TokenReview {
            spec: TokenReviewSpec { token: token.to_string(), ..Default::default() },
            ..Default::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .context("TokenReview")?
            .status
            .unwrap_or_default();
        let access = match reviewed.user.as_ref().filter(|_| reviewed.authenticated == Some(true)) {
            Some(user) => {
                let sar = SubjectAccessReview {
                    spec: SubjectAccessReviewSpec {
                        user: user.username.clone(),
                        uid: user.uid.clone(),
                        groups: user.groups.clone(),
                        extra: user.extra.clone(),
                        non_resource_attributes: Some(NonResourceAttributes {
                            path: Some(METRICS_PATH.into()),
                            verb: Some("get".into()),
                        }),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                let status = Api::<SubjectAccessReview>::all(self.client.clone())
                    .create(&PostParams::default(), &sar)
                    .await
                    .context("SubjectAccessReview")?
                    .status;
                Some(status.unwrap_or_default())
            }
            None => None,
        };
        let v = verdict(&reviewed, access.as_ref());
        let mut cache = self.cache();
        if cache.len() >= VERDICT_CACHE {
            cache.clear();
        }
        cache.insert(key, (v.clone(), Instant::now()));
        Ok(v)
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Verdicts> {
        self.verdicts.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

async fn scrape(State(state): State<SecureState>, headers: HeaderMap) -> Response {
    let Some(token) = bearer(&headers) else {
        return (StatusCode::UNAUTHORIZED, "a bearer token is required\n").into_response();
    };
    match state.review(token).await {
        Ok(Verdict::Allowed) => (
            [(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
            state.metrics.encode(),
        )
            .into_response(),
        Ok(Verdict::Unauthenticated(why)) => {
            tracing::debug!(%why, "metrics scrape refused: not authenticated");
            (StatusCode::UNAUTHORIZED, format!("{why}\n")).into_response()
        }
        Ok(Verdict::Forbidden(why)) => {
            tracing::debug!(%why, "metrics scrape refused: not authorised");
            (StatusCode::FORBIDDEN, format!("{why}\n")).into_response()
        }
        Err(e) => {
            tracing::warn!(error = format!("{e:#}"), "cannot review a metrics scrape");
            (StatusCode::SERVICE_UNAVAILABLE, "cannot review the token now\n").into_response()
        }
    }
}

/// The certificate and key to serve: from `cert_dir`, or a new self-signed one.
async fn certificate(cert_dir: Option<&PathBuf>) -> anyhow::Result<(String, String)> {
    match cert_dir {
        Some(dir) => {
            let cert = tokio::fs::read_to_string(dir.join("tls.crt"))
                .await
                .with_context(|| format!("reading {}", dir.join("tls.crt").display()))?;
            let key = tokio::fs::read_to_string(dir.join("tls.key"))
                .await
                .with_context(|| format!("reading {}", dir.join("tls.key").display()))?;
            Ok((cert, key))
        }
        None => {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string());
            let mut sans = vec!["localhost".to_string(), "127.0.0.1".to_string()];
            sans.extend(host.ok().filter(|h| !h.is_empty()));
            let now = k8s_openapi::jiff::Timestamp::now();
            let bundle = crate::webhook::certs::generate(&sans, now, &crate::webhook::certs::Lifetimes::default())
                .context("making a self-signed metrics certificate")?;
            Ok((bundle.cert_pem, bundle.key_pem))
        }
    }
}

/// Binds the secure listener (so a taken port stops muster at once) and returns the server.
pub async fn bind(
    opts: &SecureMetrics,
    client: Client,
    metrics: Arc<Metrics>,
) -> anyhow::Result<impl std::future::Future<Output = anyhow::Result<()>> + use<>> {
    let listener = std::net::TcpListener::bind(opts.addr).with_context(|| format!("binding {}", opts.addr))?;
    listener.set_nonblocking(true).with_context(|| format!("binding {}", opts.addr))?;
    let (cert, key) = certificate(opts.cert_dir.as_ref()).await?;
    let tls =
        RustlsConfig::from_pem(cert.into_bytes(), key.into_bytes()).await.context("loading the metrics certificate")?;
    let state = SecureState { metrics, client, verdicts: Arc::default() };
    let app = axum::Router::new().route(METRICS_PATH, get(scrape)).with_state(state);
    let server = axum_server::from_tcp_rustls(listener, tls).with_context(|| format!("serving on {}", opts.addr))?;
    tracing::info!(addr = %opts.addr, "serving /metrics over HTTPS to authorised scrapers (TokenReview, SubjectAccessReview)");
    Ok(async move { server.serve(app.into_make_service()).await.context("secure metrics server") })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::authentication::v1::UserInfo;

    fn token(authenticated: Option<bool>, user: &str, error: Option<&str>) -> TokenReviewStatus {
        TokenReviewStatus {
            authenticated,
            user: Some(UserInfo { username: Some(user.into()), ..Default::default() }),
            error: error.map(Into::into),
            ..Default::default()
        }
    }

    fn access(allowed: bool, denied: Option<bool>, reason: &str) -> SubjectAccessReviewStatus {
        SubjectAccessReviewStatus { allowed, denied, reason: Some(reason.into()), ..Default::default() }
    }

    #[test]
    fn a_scrape_is_served_only_to_an_authenticated_user_allowed_to_get_metrics() {
        let sa = "system:serviceaccount:mon:prometheus";
        let cases = [
            ("authenticated and allowed", token(Some(true), sa, None), Some(access(true, None, "")), Verdict::Allowed),
            (
                "unknown token",
                token(Some(false), "", Some("invalid bearer token")),
                None,
                Verdict::Unauthenticated("invalid bearer token".into()),
            ),
            (
                "no verdict at all",
                token(None, "", None),
                None,
                Verdict::Unauthenticated("token not authenticated".into()),
            ),
            (
                "authenticated, not allowed",
                token(Some(true), sa, None),
                Some(access(false, None, "no RBAC policy matched")),
                Verdict::Forbidden(format!("user \"{sa}\" may not get /metrics: no RBAC policy matched")),
            ),
            (
                "allowed by one authorizer, denied by another",
                token(Some(true), sa, None),
                Some(access(true, Some(true), "")),
                Verdict::Forbidden(format!("user \"{sa}\" may not get /metrics")),
            ),
            (
                "authenticated, no access review",
                token(Some(true), sa, None),
                None,
                Verdict::Forbidden(format!("user \"{sa}\" may not get /metrics")),
            ),
        ];
        for (case, t, a, want) in cases {
            assert_eq!(verdict(&t, a.as_ref()), want, "{case}");
        }
    }

    #[test]
    fn the_bearer_token_is_read_from_the_authorization_header() {
        let cases = [
            (Some("Bearer abc.def"), Some("abc.def")),
            (Some("bearer   xyz "), Some("xyz")),
            (Some("Basic dXNlcjpwYXNz"), None),
            (Some("Bearer "), None),
            (Some("Bearer"), None),
            (None, None),
        ];
        for (value, want) in cases {
            let mut headers = HeaderMap::new();
            if let Some(v) = value {
                headers.insert(header::AUTHORIZATION, v.parse().expect("header"));
            }
            assert_eq!(bearer(&headers), want, "{value:?}");
        }
    }
}

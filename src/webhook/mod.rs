//! The HTTPS admission server (axum + rustls) that runs on every replica: `/validate`,
//! `/mutate`, `/healthz`, `/readyz`. Decisions are in `review` (pure); this module serves them,
//! keeps the serving certificate fresh (self-managed in a Secret, or files from cert-manager)
//! and keeps the webhook configurations pointing at it.

pub mod certs;
pub mod config;
pub mod review;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use axum_server::tls_rustls::RustlsConfig;
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use serde_json::json;

use crate::controllers::metrics::{Metrics, PathLabels, WebhookLabels};
use config::Endpoint;
use review::Outcome;

/// Field manager for the webhook configurations.
pub const FIELD_MANAGER: &str = "muster-webhook";

/// Where the serving certificate comes from.
#[derive(Clone, Debug)]
pub enum CertSource {
    /// muster makes and rotates its own CA and certificate, kept in this Secret.
    SelfManaged {
        /// Secret name in muster's namespace.
        secret: String,
        /// Validity and renewal.
        lifetimes: certs::Lifetimes,
    },
    /// `tls.crt`/`tls.key` in this folder (e.g. mounted from a cert-manager Secret), reloaded
    /// when they change; the CA bundle is injected by cert-manager.
    Files(PathBuf),
}

/// Settings of the webhook server.
#[derive(Clone, Debug)]
pub struct WebhookOptions {
    /// Address to listen on.
    pub bind: SocketAddr,
    /// How the apiserver reaches us.
    pub endpoint: Endpoint,
    /// Certificate source.
    pub certs: CertSource,
    /// Apply the whole webhook configurations (local runs); otherwise only their CA bundle is
    /// kept current (the chart owns them).
    pub manage_configurations: bool,
    /// muster's namespace.
    pub namespace: String,
    /// How often certificates are checked.
    pub resync: Duration,
}

impl WebhookOptions {
    /// The names the serving certificate must cover.
    pub fn sans(&self) -> Vec<String> {
        match &self.endpoint {
            Endpoint::Url(url) => {
                let host = url.trim_start_matches("https://").split(['/', ':']).next().unwrap_or("127.0.0.1");
                vec![host.to_string()]
            }
            Endpoint::Service { namespace, name, .. } => {
                vec![
                    format!("{name}.{namespace}.svc"),
                    format!("{name}.{namespace}.svc.cluster.local"),
                    format!("{name}.{namespace}"),
                ]
            }
        }
    }
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
}

async fn handle(
    state: &AppState,
    path: &str,
    review: AdmissionReview<DynamicObject>,
    decide: fn(&AdmissionRequest<DynamicObject>) -> (AdmissionResponse, Outcome),
) -> Json<AdmissionReview<DynamicObject>> {
    let start = Instant::now();
    let request: Result<AdmissionRequest<DynamicObject>, _> = review.try_into();
    let (response, outcome) = match request {
        Ok(req) => {
            let (resp, outcome) = decide(&req);
            if outcome == Outcome::Denied {
                tracing::info!(path, kind = %req.kind.kind, name = %req.name, namespace = ?req.namespace, message = %resp.result.message, "denied");
            }
            tracing::debug!(path, uid = %req.uid, operation = ?req.operation, kind = %req.kind.kind, namespace = req.namespace.as_deref().unwrap_or_default(), name = %req.name, outcome = ?outcome, "admission review");
            (resp, Some(outcome))
        }
        Err(e) => (AdmissionResponse::invalid(e.to_string()), None),
    };
    let outcome = match outcome {
        Some(Outcome::Allowed) => "allowed",
        Some(Outcome::Denied) => "denied",
        Some(Outcome::Patched) => "patched",
        None => "error",
    };
    state.metrics.webhook_requests.get_or_create(&WebhookLabels { path: path.into(), outcome: outcome.into() }).inc();
    state
        .metrics
        .webhook_duration
        .get_or_create(&PathLabels { path: path.into() })
        .observe(start.elapsed().as_secs_f64());
    Json(response.into_review())
}

fn router(state: AppState) -> Router {
    Router::new()
        .route(
            "/validate",
            post(|State(s): State<AppState>, Json(r): Json<AdmissionReview<DynamicObject>>| async move {
                handle(&s, "/validate", r, review::validate).await
            }),
        )
        .route(
            "/mutate",
            post(|State(s): State<AppState>, Json(r): Json<AdmissionReview<DynamicObject>>| async move {
                handle(&s, "/mutate", r, review::mutate).await
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(s): State<AppState>| async move {
                if s.ready.load(Ordering::Relaxed) {
                    (StatusCode::OK, "ok")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "no certificate yet")
                }
            }),
        )
        .with_state(state)
}

/// Current serving material: (CA bundle if we know it, certificate, key).
async fn load(client: &Client, opts: &WebhookOptions) -> anyhow::Result<(Option<String>, String, String)> {
    match &opts.certs {
        CertSource::SelfManaged { secret, lifetimes } => {
            let b = certs::ensure(client, &opts.namespace, secret, &opts.sans(), lifetimes).await?;
            Ok((Some(b.ca_pem), b.cert_pem, b.key_pem))
        }
        CertSource::Files(dir) => {
            let cert = tokio::fs::read_to_string(dir.join("tls.crt"))
                .await
                .with_context(|| format!("reading {}/tls.crt", dir.display()))?;
            let key = tokio::fs::read_to_string(dir.join("tls.key"))
                .await
                .with_context(|| format!("reading {}/tls.key", dir.display()))?;
            let ca = tokio::fs::read_to_string(dir.join("ca.crt")).await.ok();
            Ok((ca, cert, key))
        }
    }
}

/// Makes the webhook configurations point at us with `ca`: the whole objects when muster
/// manages them, otherwise only each webhook's `clientConfig.caBundle`.
async fn register(client: &Client, opts: &WebhookOptions, ca: Option<&str>) -> anyhow::Result<()> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let vapi = Api::<ValidatingWebhookConfiguration>::all(client.clone());
    let mapi = Api::<MutatingWebhookConfiguration>::all(client.clone());
    let validating = config::validating_configuration(&opts.endpoint, ca, &opts.namespace);
    let mutating = config::mutating_configuration(&opts.endpoint, ca, &opts.namespace);
    let with_kind = |mut v: serde_json::Value, kind: &str| {
        v["apiVersion"] = json!("admissionregistration.k8s.io/v1");
        v["kind"] = json!(kind);
        v
    };
    if opts.manage_configurations {
        vapi.patch(
            config::VALIDATING_NAME,
            &params,
            &Patch::Apply(with_kind(serde_json::to_value(&validating)?, "ValidatingWebhookConfiguration")),
        )
        .await?;
        mapi.patch(
            config::MUTATING_NAME,
            &params,
            &Patch::Apply(with_kind(serde_json::to_value(&mutating)?, "MutatingWebhookConfiguration")),
        )
        .await?;
        return Ok(());
    }
    let Some(ca) = ca else { return Ok(()) };
    // A strategic merge patch (webhooks merge by name), not an apply: an apply creates a missing
    // configuration, which here is only ever refused (invalid, or forbidden by the chart's RBAC)
    // and hid the "not found" below.
    let params = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
    let bundle = k8s_openapi::ByteString(ca.as_bytes().to_vec());
    let ca_only = |webhooks: Vec<String>| {
        let items: Vec<serde_json::Value> =
            webhooks.iter().map(|w| json!({"name": w, "clientConfig": {"caBundle": bundle}})).collect();
        json!({"webhooks": items})
    };
    let vnames = validating.webhooks.iter().flatten().map(|w| w.name.clone()).collect();
    let mnames = mutating.webhooks.iter().flatten().map(|w| w.name.clone()).collect();
    for (name, body, validating_kind) in
        [(config::VALIDATING_NAME, ca_only(vnames), true), (config::MUTATING_NAME, ca_only(mnames), false)]
    {
        let result = if validating_kind {
            vapi.patch(name, &params, &Patch::Strategic(&body)).await.map(|_| ())
        } else {
            mapi.patch(name, &params, &Patch::Strategic(&body)).await.map(|_| ())
        };
        match result {
            Ok(()) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {
                tracing::warn!(name, "webhook configuration not found (is the chart installed?)")
            }
            Err(e) => tracing::warn!(name, error = %e, "could not inject the CA bundle"),
        }
    }
    Ok(())
}

/// Serves the webhooks until `shutdown` resolves, renewing and reloading the certificate
/// without a restart.
pub async fn serve(
    client: Client,
    opts: WebhookOptions,
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    // Bound before anything else: a replica whose port is taken must never report ready.
    let listener = std::net::TcpListener::bind(opts.bind).with_context(|| format!("binding {}", opts.bind))?;
    listener.set_nonblocking(true).with_context(|| format!("binding {}", opts.bind))?;
    let (mut ca, mut cert, mut key) = load(&client, &opts).await.context("loading the webhook certificate")?;
    let tls = RustlsConfig::from_pem(cert.clone().into_bytes(), key.clone().into_bytes())
        .await
        .context("loading the webhook certificate")?;
    register(&client, &opts, ca.as_deref()).await.context("registering the webhooks")?;
    let handle = axum_server::Handle::new();
    let server = axum_server::from_tcp_rustls(listener, tls.clone())
        .with_context(|| format!("serving on {}", opts.bind))?
        .handle(handle.clone())
        .serve(router(AppState { metrics, ready: ready.clone() }).into_make_service());
    ready.store(true, Ordering::Relaxed);
    tracing::info!(addr = %opts.bind, endpoint = ?opts.endpoint, "serving admission webhooks");
    let refresher = async {
        let mut tick = tokio::time::interval(opts.resync);
        tick.tick().await;
        loop {
            tick.tick().await;
            match load(&client, &opts).await {
                Ok((new_ca, new_cert, new_key)) => {
                    if new_cert != cert || new_key != key {
                        match tls.reload_from_pem(new_cert.clone().into_bytes(), new_key.clone().into_bytes()).await {
                            Ok(()) => tracing::info!("serving a renewed webhook certificate"),
                            Err(e) => tracing::warn!(error = %e, "could not load the renewed certificate"),
                        }
                        cert = new_cert;
                        key = new_key;
                    }
                    // Re-applied each round: a chart upgrade may have reset the CA bundle.
                    ca = new_ca;
                    if let Err(e) = register(&client, &opts, ca.as_deref()).await {
                        tracing::warn!(error = %e, "could not update the webhook configurations");
                    }
                }
                Err(e) => tracing::warn!(error = format!("{e:#}"), "could not refresh the webhook certificate"),
            }
        }
    };
    tokio::select! {
        r = server => r.context("webhook server")?,
        _ = refresher => {}
        _ = shutdown => handle.graceful_shutdown(Some(Duration::from_secs(5))),
    }
    Ok(())
}

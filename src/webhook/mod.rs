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
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use axum_server::tls_rustls::RustlsConfig;
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use serde_json::json;

use crate::controllers::metrics::{Metrics, PathLabels, WebhookLabels};
use crate::workloadbuilder::native::SchedulingApi;
use config::Endpoint;
use review::Outcome;

/// Field manager for the webhook configurations.
pub const FIELD_MANAGER: &str = "muster-webhook";
/// The largest AdmissionReview accepted: an UPDATE carries the object and the old object, each
/// up to etcd's 1.5 MiB, in JSON (axum's default, 2 MB, refused such reviews with 413).
pub const MAX_REVIEW_BYTES: usize = 4 * 1024 * 1024;
/// Admission reviews handled at once; more wait their turn, their bodies not yet read (each
/// holds up to two objects of its kind in memory, several times their size once decoded).
pub const MAX_IN_FLIGHT: usize = 32;

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
    /// The cluster's bound on the pods of a MusterJob or MusterJobSet (`--max-job-pods`).
    pub max_job_pods: u32,
    /// The most admission reviews handled at once ([`MAX_IN_FLIGHT`]).
    pub max_in_flight: usize,
    /// The scheduling API new MusterJobs compile to (`--scheduling-api`; `None`: `auto`), which
    /// `/mutate` records on a new job where the flag alone decides it.
    pub scheduling_api: Option<SchedulingApi>,
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
    /// The cluster's bound on a job's pods, for `/validate`.
    max_job_pods: u32,
    /// The most reviews handled at once.
    max_in_flight: usize,
    /// `--scheduling-api`, for `/mutate`.
    scheduling_api: Option<SchedulingApi>,
    /// The PriorityClasses a group's `spec.priority` is checked against (none in unit tests).
    priorities: Option<Arc<(Client, crate::controllers::context::Priorities)>>,
}

async fn handle(
    state: &AppState,
    path: &str,
    review: AdmissionReview<DynamicObject>,
    decide: impl Fn(&AdmissionRequest<DynamicObject>) -> (AdmissionResponse, Outcome),
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

/// `router` with at most `max` requests in its handlers at once, all routes together (tower's
/// global limit: one semaphore, however often axum clones the routes; the per-service
/// `ConcurrencyLimitLayer` let all of them through): the others wait for a permit before their
/// body is read, so the reviews in memory are bounded (the API server times out a webhook call
/// after its `timeoutSeconds` and applies the failure policy).
fn in_flight_limited<S: Clone + Send + Sync + 'static>(router: Router<S>, max: usize) -> Router<S> {
    router.layer(tower::limit::GlobalConcurrencyLimitLayer::new(max.max(1)))
}

fn router(state: AppState) -> Router {
    let reviews = Router::new()
        .route(
            "/validate",
            post(|State(s): State<AppState>, Json(r): Json<AdmissionReview<DynamicObject>>| async move {
                let max_job_pods = s.max_job_pods;
                // A group's priority is checked against its class's value, read here (async).
                let class_value = match (r.request.as_ref().and_then(review::group_priority), &s.priorities) {
                    (Some((_, class)), Some(lookup)) => match lookup.1.value_of(&lookup.0, class.as_deref()).await {
                        Ok(value) => Some(value),
                        Err(e) => {
                            tracing::warn!(error = %e, class = ?class, "cannot read the PriorityClass; the group's priority is not checked");
                            None
                        }
                    },
                    _ => None,
                };
                handle(&s, "/validate", r, |req| review::validate_checked(req, max_job_pods, class_value)).await
            }),
        )
        .route(
            "/mutate",
            post(|State(s): State<AppState>, Json(r): Json<AdmissionReview<DynamicObject>>| async move {
                let api = s.scheduling_api;
                handle(&s, "/mutate", r, |req| review::mutate_within(req, api)).await
            }),
        )
        .layer(DefaultBodyLimit::max(MAX_REVIEW_BYTES));
    // Probes never wait behind reviews.
    in_flight_limited(reviews, state.max_in_flight)
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
            let owner = crate::controllers::owner::install_owner();
            let b = certs::ensure(client, &opts.namespace, secret, &opts.sans(), lifetimes, owner).await?;
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

/// muster's own user name, as the API server authenticates it (a SelfSubjectReview, which every
/// authenticated identity may create); `None`, logged, when it cannot be learnt: then every
/// request of muster's is reviewed, as any other.
async fn whoami(client: &Client) -> Option<String> {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let api = Api::<SelfSubjectReview>::all(client.clone());
    match api.create(&kube::api::PostParams::default(), &SelfSubjectReview::default()).await {
        Ok(review) => review.status.and_then(|s| s.user_info).and_then(|u| u.username),
        Err(e) => {
            tracing::warn!(error = %e, "cannot learn muster's own identity; its own writes go through its webhooks too");
            None
        }
    }
}

/// What records the scheduling API of new jobs: the MutatingAdmissionPolicy where the API
/// server serves it and muster may apply it (both applied here, SSA, muster's field manager),
/// muster's webhook otherwise.
async fn api_recorder(client: &Client, opts: &WebhookOptions, own_user: Option<&str>) -> config::ApiRecorder {
    use k8s_openapi::api::admissionregistration::v1::{MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding};
    let resources = ["mutatingadmissionpolicies", "mutatingadmissionpolicybindings"];
    let unserved = "the scheduling API of new jobs is recorded by muster's webhook";
    if !crate::controllers::served(client, "admissionregistration.k8s.io/v1", &resources, unserved).await {
        return config::ApiRecorder::Webhook;
    }
    let (policy, binding) = config::record_api_policy(opts.scheduling_api, &opts.namespace, own_user);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let applied = async {
        let policy = with_kind(serde_json::to_value(&policy)?, "MutatingAdmissionPolicy");
        let binding = with_kind(serde_json::to_value(&binding)?, "MutatingAdmissionPolicyBinding");
        Api::<MutatingAdmissionPolicy>::all(client.clone())
            .patch(config::RECORD_API_POLICY, &params, &Patch::Apply(policy))
            .await?;
        Api::<MutatingAdmissionPolicyBinding>::all(client.clone())
            .patch(config::RECORD_API_POLICY, &params, &Patch::Apply(binding))
            .await?;
        anyhow::Ok(())
    };
    match applied.await {
        Ok(()) => config::ApiRecorder::Policy,
        Err(e) => {
            tracing::warn!(error = %e, "cannot apply the MutatingAdmissionPolicy {}; {unserved}", config::RECORD_API_POLICY);
            config::ApiRecorder::Webhook
        }
    }
}

/// `v` with the apiVersion and kind of an `admissionregistration.k8s.io/v1` object.
fn with_kind(mut v: serde_json::Value, kind: &str) -> serde_json::Value {
    v["apiVersion"] = json!("admissionregistration.k8s.io/v1");
    v["kind"] = json!(kind);
    v
}

/// Makes the webhook configurations point at us with `ca`: the whole objects when muster
/// manages them (with the policy that records the scheduling API, where served: see
/// [`api_recorder`]), otherwise only the `clientConfig.caBundle` of each of muster's webhooks
/// the configurations hold (the chart owns them, and leaves the API record out where the API
/// server serves the policy).
async fn register(
    client: &Client,
    opts: &WebhookOptions,
    ca: Option<&str>,
    own_user: Option<&str>,
) -> anyhow::Result<()> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let vapi = Api::<ValidatingWebhookConfiguration>::all(client.clone());
    let mapi = Api::<MutatingWebhookConfiguration>::all(client.clone());
    if opts.manage_configurations {
        let recorder = api_recorder(client, opts, own_user).await;
        let validating = config::validating_configuration(&opts.endpoint, ca, &opts.namespace, own_user);
        let mutating = config::mutating_configuration(&opts.endpoint, ca, &opts.namespace, own_user, recorder);
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
    let bundle = k8s_openapi::ByteString(ca.as_bytes().to_vec());
    // Every webhook of muster's, the API record included (the chart leaves it out where the
    // policy records the API).
    let (endpoint, ns, recorder) = (&opts.endpoint, &opts.namespace, config::ApiRecorder::Webhook);
    let validating = config::validating_configuration(endpoint, None, ns, own_user).webhooks.into_iter().flatten();
    let validating: Vec<String> = validating.map(|w| w.name).collect();
    let mutating =
        config::mutating_configuration(endpoint, None, ns, own_user, recorder).webhooks.into_iter().flatten();
    let mutating: Vec<String> = mutating.map(|w| w.name).collect();
    let results = [
        (
            config::VALIDATING_NAME,
            inject_ca(&vapi, config::VALIDATING_NAME, &validating, &bundle, |c| {
                c.webhooks.into_iter().flatten().map(|w| w.name).collect()
            })
            .await,
        ),
        (
            config::MUTATING_NAME,
            inject_ca(&mapi, config::MUTATING_NAME, &mutating, &bundle, |c| {
                c.webhooks.into_iter().flatten().map(|w| w.name).collect()
            })
            .await,
        ),
    ];
    for (name, result) in results {
        match result {
            Ok(true) => {}
            Ok(false) => tracing::warn!(name, "webhook configuration not found (is the chart installed?)"),
            Err(e) => tracing::warn!(name, error = %e, "could not inject the CA bundle"),
        }
    }
    Ok(())
}

/// Puts `bundle` in the `clientConfig.caBundle` of each webhook of configuration `name` that is
/// one of `ours`; `false` when there is no such configuration. The configuration is read with
/// a list by name (muster lists and watches them anyway, for its pins' judges, so this needs no
/// right of its own), then patched: a strategic merge patch (webhooks merge by name), not an
/// apply, since an apply creates a missing configuration, which here is only ever refused
/// (invalid, or forbidden by the chart's RBAC). Only webhooks the configuration holds are named:
/// a name it lacks would be added with nothing but a caBundle, and refused.
async fn inject_ca<K>(
    api: &Api<K>,
    name: &str,
    ours: &[String],
    bundle: &k8s_openapi::ByteString,
    webhooks_of: impl Fn(K) -> Vec<String>,
) -> kube::Result<bool>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let listed = api.list(&ListParams::default().fields(&format!("metadata.name={name}"))).await?;
    let Some(config) = listed.items.into_iter().next() else { return Ok(false) };
    let items: Vec<serde_json::Value> = webhooks_of(config)
        .into_iter()
        .filter(|w| ours.contains(w))
        .map(|w| json!({"name": w, "clientConfig": {"caBundle": bundle}}))
        .collect();
    let params = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
    match api.patch(name, &params, &Patch::Strategic(&json!({"webhooks": items}))).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
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
    // Only configurations muster applies whole carry it; the chart's name the ServiceAccount.
    let own_user = if opts.manage_configurations { whoami(&client).await } else { None };
    register(&client, &opts, ca.as_deref(), own_user.as_deref()).await.context("registering the webhooks")?;
    let handle = axum_server::Handle::new();
    let server = axum_server::from_tcp_rustls(listener, tls.clone())
        .with_context(|| format!("serving on {}", opts.bind))?
        .handle(handle.clone())
        .serve(
            router(AppState {
                metrics,
                ready: ready.clone(),
                max_job_pods: opts.max_job_pods,
                max_in_flight: opts.max_in_flight,
                scheduling_api: opts.scheduling_api,
                priorities: Some(Arc::new((client.clone(), Default::default()))),
            })
            .into_make_service(),
        );
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
                    if let Err(e) = register(&client, &opts, ca.as_deref(), own_user.as_deref()).await {
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use axum::body::Body;
    use axum::extract::Request;
    use serde_json::Value;
    use tower::ServiceExt;

    use super::*;
    use crate::workloadbuilder::job::MAX_JOB_PODS;

    fn app(max_job_pods: u32, max_in_flight: usize) -> Router {
        router(AppState {
            metrics: Arc::new(Metrics::default()),
            ready: Arc::new(AtomicBool::new(true)),
            max_job_pods,
            max_in_flight,
            scheduling_api: Some(SchedulingApi::Muster),
            priorities: None,
        })
    }

    fn job(parallelism: i32, note: &str) -> Value {
        json!({
            "apiVersion": "batch.muster.dev/v1alpha1", "kind": "MusterJob",
            "metadata": {"name": "big", "namespace": "team-a", "annotations": {"note": note}},
            "spec": {"parallelism": parallelism,
                     "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}},
        })
    }

    fn review(op: &str, object: Value, old: Option<Value>) -> String {
        json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u-1",
                "kind": {"group": "batch.muster.dev", "version": "v1alpha1", "kind": "MusterJob"},
                "resource": {"group": "batch.muster.dev", "version": "v1alpha1", "resource": "musterjobs"},
                "name": "big", "namespace": "team-a", "operation": op, "userInfo": {"username": "alice"},
                "object": object, "oldObject": old, "dryRun": false,
            }
        })
        .to_string()
    }

    async fn post_review(app: Router, body: String) -> (StatusCode, Value) {
        let request = Request::builder()
            .method("POST")
            .uri("/validate")
            .header("content-type", "application/json")
            .body(Body::from(body))
            .expect("request");
        let response = app.oneshot(request).await.expect("response");
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.expect("body");
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    #[tokio::test]
    async fn an_update_review_of_two_large_objects_is_decided() {
        // Two objects of 1.25 MiB each: 2.5 MiB, more than axum's default limit of 2 MB.
        let note = "x".repeat(1_310_720);
        let body = review("UPDATE", job(2, &note), Some(job(1, &note)));
        assert!(body.len() > 2_621_440 && body.len() < MAX_REVIEW_BYTES, "{}", body.len());
        let (status, answer) = post_review(app(MAX_JOB_PODS, 4), body).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(answer["response"]["allowed"], json!(true), "{}", answer["response"]);

        let over = review("CREATE", job(1, &"x".repeat(MAX_REVIEW_BYTES)), None);
        let (status, _) = post_review(app(MAX_JOB_PODS, 4), over).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[tokio::test]
    async fn validate_applies_the_clusters_bound() {
        let (_, answer) = post_review(app(10, 4), review("CREATE", job(11, ""), None)).await;
        assert_eq!(answer["response"]["allowed"], json!(false));
        let message = answer["response"]["status"]["message"].as_str().unwrap_or_default().to_string();
        assert!(
            message.contains(
                "spec.parallelism: Invalid value: 11: must be less than or equal to 10 (the limit of this cluster: muster run --max-job-pods)"
            ),
            "{message}"
        );
        let (_, answer) = post_review(app(10, 4), review("CREATE", job(10, ""), None)).await;
        assert_eq!(answer["response"]["allowed"], json!(true), "{}", answer["response"]);
        // Above the hard bound, the hard bound holds.
        let (_, answer) = post_review(app(u32::MAX, 4), review("CREATE", job(100_001, ""), None)).await;
        assert_eq!(answer["response"]["allowed"], json!(false));
    }

    #[tokio::test]
    async fn reviews_in_flight_are_bounded_and_probes_do_not_wait() {
        let (now, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (n, p) = (now.clone(), peak.clone());
        let slow = Router::new().route(
            "/slow",
            post(move || {
                let (n, p) = (n.clone(), p.clone());
                async move {
                    p.fetch_max(n.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(40)).await;
                    n.fetch_sub(1, Ordering::SeqCst);
                    "done"
                }
            }),
        );
        let app = in_flight_limited(slow, 3).route("/healthz", get(|| async { "ok" }));
        let call = |uri: &'static str, app: Router| async move {
            let request = Request::builder().method(if uri == "/slow" { "POST" } else { "GET" }).uri(uri);
            app.oneshot(request.body(Body::empty()).expect("request")).await.expect("response").status()
        };
        let calls: Vec<_> = (0..12).map(|_| tokio::spawn(call("/slow", app.clone()))).collect();
        tokio::time::sleep(Duration::from_millis(10)).await;
        // A probe answers while reviews wait for a permit.
        let probe = tokio::time::timeout(Duration::from_millis(30), call("/healthz", app.clone())).await;
        assert_eq!(probe.ok(), Some(StatusCode::OK));
        for c in calls {
            assert_eq!(c.await.expect("join"), StatusCode::OK);
        }
        assert_eq!(peak.load(Ordering::SeqCst), 3, "at most 3 at once, and 3 did run together");
    }
}

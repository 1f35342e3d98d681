//! The Service path, both ways muster is deployed: with the chart's own objects (its Service, its
//! webhook configurations without a caBundle, its ServiceAccount, muster run with its Deployment's
//! arguments and only the caBundle injected by muster), and with muster applying the
//! configurations itself in Service mode (`--webhook-manage-configurations=true`, no
//! `--webhook-url`). Either way: a MusterJob breaking a rule is refused at its field path by the
//! validating webhook, a labelled pod comes back gated by the mutating one, muster's log has the
//! requests, and the caBundle is muster's own CA, written by muster alone.

use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use kube::api::{Api, PostParams};
use muster::crds::{ADMISSION_GATE, MusterJob, POD_GROUP_LABEL};
use muster::webhook::FIELD_MANAGER;
use muster::webhook::certs::from_secret;
use muster::webhook::config::{
    ApiRecorder, MUTATE_PODS, MUTATING_NAME, RECORD_API, RECORD_API_POLICY, VALIDATE_BATCH, VALIDATE_SCHEDULING,
    VALIDATING_NAME,
};
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::harness::rbac::service_account_kubeconfig;
use crate::harness::{Cluster, client, cluster, k8s_bin, metric, namespace};
use crate::testhost::{self, GuestMuster, TestHost};

/// The webhook configurations are cluster-wide and both tests listen on the same guest ports.
static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());
const TIMEOUT: Duration = Duration::from_secs(60);
/// Field manager of what these tests apply.
const APPLIER: &str = "muster-e2e-service";

/// A webhook Service as the configurations name it.
#[derive(Clone, Debug, PartialEq)]
struct ServiceRef {
    namespace: String,
    name: String,
    port: i32,
}

fn apply(cluster: &Cluster, objects: &[Value]) {
    let docs: Vec<String> = objects.iter().map(Value::to_string).collect();
    cluster
        .kubectl_stdin(
            &["apply", "--server-side", "--force-conflicts", &format!("--field-manager={APPLIER}"), "-f", "-"],
            Some(&docs.join("\n---\n")),
        )
        .unwrap_or_else(|e| panic!("{e}"));
}

fn create_namespace(cluster: &Cluster, name: &str) {
    match cluster.kubectl(&["create", "namespace", name]) {
        Ok(_) => {}
        Err(e) if e.contains("AlreadyExists") => {}
        Err(e) => panic!("{e}"),
    }
}

/// The EndpointSlice of Service `service`: one ready endpoint, the guest, at `port` (the port the
/// Service's `port_name` port targets), as the endpointslice controller would write it for a pod.
fn endpoint_slice(service: &ServiceRef, port_name: &str, port: u16, host: &TestHost) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{}-testhost", service.name), "namespace": service.namespace,
            "labels": {"kubernetes.io/service-name": service.name}},
        "addressType": "IPv4",
        "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
        "endpoints": [{"addresses": [host.guest_ip.to_string()], "conditions": {"ready": true}}],
    })
}

/// Deletes muster's webhook configurations when dropped (they fail closed; nobody answers them
/// once the test's muster is gone). Declared before the muster, so that it is stopped first.
struct DeleteConfigurations(&'static Cluster);

impl Drop for DeleteConfigurations {
    fn drop(&mut self) {
        let _ = self.0.kubectl(&[
            "delete",
            &format!("validatingwebhookconfiguration/{VALIDATING_NAME}"),
            &format!("mutatingwebhookconfiguration/{MUTATING_NAME}"),
            "--ignore-not-found",
        ]);
        // Where served, the policy that records the scheduling API, and its binding.
        let _ = self.0.kubectl(&[
            "delete",
            &format!("mutatingadmissionpolicy/{RECORD_API_POLICY}"),
            &format!("mutatingadmissionpolicybinding/{RECORD_API_POLICY}"),
            "--ignore-not-found",
        ]);
    }
}

/// The names of muster's webhooks, sorted: without the one that records the scheduling API
/// where muster applied its policy in its place.
async fn webhooks() -> Vec<&'static str> {
    match cluster().api_recorder() {
        ApiRecorder::Policy => vec![MUTATE_PODS, VALIDATE_BATCH, VALIDATE_SCHEDULING],
        ApiRecorder::Webhook => vec![RECORD_API, MUTATE_PODS, VALIDATE_BATCH, VALIDATE_SCHEDULING],
    }
}

/// Every clientConfig of muster's two configurations, with the webhook's name and the path it
/// must call; `None` while either is missing.
async fn client_configs() -> Option<Vec<(String, &'static str, WebhookClientConfig)>> {
    let c = client().await;
    let validating = Api::<ValidatingWebhookConfiguration>::all(c.clone()).get_opt(VALIDATING_NAME).await.ok()??;
    let mutating = Api::<MutatingWebhookConfiguration>::all(c).get_opt(MUTATING_NAME).await.ok()??;
    let mut all: Vec<_> = validating.webhooks?.into_iter().map(|w| (w.name, "/validate", w.client_config)).collect();
    all.extend(mutating.webhooks?.into_iter().map(|w| (w.name, "/mutate", w.client_config)));
    Some(all)
}

fn names_service(config: &WebhookClientConfig, service: &ServiceRef, path: &str) -> bool {
    config.url.is_none()
        && config.service.as_ref().is_some_and(|s| {
            s.namespace == service.namespace
                && s.name == service.name
                && s.port == Some(service.port)
                && s.path.as_deref() == Some(path)
        })
}

/// Waits until muster is ready, its Secret holds a CA, both configurations name `service` with
/// that CA as caBundle, and the apiserver really calls the mutating webhook (a dry-run pod comes
/// back gated); returns the CA. Fails at once when muster exits.
async fn wait_until_served(muster: &mut GuestMuster, service: &ServiceRef, secret: &str) -> String {
    let secrets = Api::<Secret>::namespaced(client().await, &service.namespace);
    let deadline = Instant::now() + TIMEOUT;
    let mut waiting_for = "/readyz".to_string();
    loop {
        assert!(muster.running(), "muster exited while waiting for {waiting_for}:\n{}", muster.log_tail(30));
        assert!(
            Instant::now() < deadline,
            "timed out after {TIMEOUT:?} waiting for {waiting_for}; muster's log:\n{}",
            muster.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        let readyz = reqwest::get(format!("http://{}/readyz", muster.metrics)).await;
        if !readyz.is_ok_and(|r| r.status().is_success()) {
            continue;
        }
        waiting_for = "the certificate Secret".into();
        let Some(bundle) = secrets.get_opt(secret).await.ok().flatten().as_ref().and_then(from_secret) else {
            continue;
        };
        waiting_for = "both configurations naming the Service, with muster's CA".into();
        let Some(configs) = client_configs().await else { continue };
        let current = configs.len() == webhooks().await.len()
            && configs.iter().all(|(_, path, c)| {
                names_service(c, service, path) && c.ca_bundle.as_ref().is_some_and(|b| b.0 == bundle.ca_pem.as_bytes())
            });
        if !current {
            continue;
        }
        match dry_run_pod_is_gated().await {
            Ok(()) => return bundle.ca_pem,
            Err(e) => waiting_for = format!("the apiserver to call the mutating webhook (last: {e})"),
        }
    }
}

fn labelled_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {POD_GROUP_LABEL: "service-path"}},
        "spec": {"containers": [{"name": "main", "image": "example/none"}]},
    }))
    .expect("pod")
}

/// A dry-run create of a labelled pod: `Ok` when it comes back gated.
async fn dry_run_pod_is_gated() -> Result<(), String> {
    let dry = PostParams { dry_run: true, ..Default::default() };
    let pod = Api::<Pod>::namespaced(client().await, "default")
        .create(&dry, &labelled_pod("service-probe"))
        .await
        .map_err(|e| e.to_string())?;
    let gates = pod.spec.and_then(|s| s.scheduling_gates).unwrap_or_default();
    if gates.iter().any(|g| g.name == ADMISSION_GATE) { Ok(()) } else { Err(format!("not gated: {gates:?}")) }
}

fn job(name: &str, restart_policy: &str) -> MusterJob {
    serde_json::from_value(json!({
        "apiVersion": "batch.muster.dev/v1alpha1", "kind": "MusterJob",
        "metadata": {"name": name},
        "spec": {"template": {"spec": {"restartPolicy": restart_policy,
            "containers": [{"name": "main", "image": "example/none"}]}}},
    }))
    .expect("job")
}

/// Creates a MusterJob with `restartPolicy: Always` (the CRD schema allows it, muster's rules
/// do not); the apiserver's error.
async fn create_invalid_job(ns: &str, name: &str) -> Result<MusterJob, kube::Error> {
    Api::<MusterJob>::namespaced(client().await, ns).create(&PostParams::default(), &job(name, "Always")).await
}

/// The fields managers own in `entries` that mention `field` (e.g. `f:caBundle`).
fn owners_of(entries: &[ManagedFieldsEntry], field: &str) -> Vec<String> {
    let mut owners: Vec<String> = entries
        .iter()
        .filter(|e| e.fields_v1.as_ref().is_some_and(|f| f.0.to_string().contains(field)))
        .map(|e| format!("{}/{}", e.manager.as_deref().unwrap_or("?"), e.operation.as_deref().unwrap_or("?")))
        .collect();
    owners.sort();
    owners.dedup();
    owners
}

/// The clientConfig of every webhook names `service` (no URL) and carries `ca` as caBundle,
/// written by muster's field manager and nobody else.
async fn assert_configurations(service: &ServiceRef, ca: &str) {
    let configs = client_configs().await.expect("muster's webhook configurations");
    let mut names: Vec<&str> = configs.iter().map(|(n, _, _)| n.as_str()).collect();
    names.sort();
    assert_eq!(names, webhooks().await);
    for (name, path, config) in &configs {
        assert!(names_service(config, service, path), "{name}: {config:?} does not call {service:?}{path}");
        assert_eq!(config.ca_bundle.as_ref().map(|b| b.0.as_slice()), Some(ca.as_bytes()), "{name}: caBundle");
    }
    let c = client().await;
    let validating = Api::<ValidatingWebhookConfiguration>::all(c.clone()).get(VALIDATING_NAME).await.expect("get");
    let mutating = Api::<MutatingWebhookConfiguration>::all(c).get(MUTATING_NAME).await.expect("get");
    for (kind, entries) in [
        ("validating", validating.metadata.managed_fields.unwrap_or_default()),
        ("mutating", mutating.metadata.managed_fields.unwrap_or_default()),
    ] {
        let owners = owners_of(&entries, "f:caBundle");
        assert!(
            owners.len() == 1 && owners[0].starts_with(&format!("{FIELD_MANAGER}/")),
            "the {kind} configuration's caBundle is owned by {owners:?}, not muster ({FIELD_MANAGER}) alone"
        );
    }
}

/// The `fields` of muster's JSON log lines with message `message`.
fn log_events(log: &str, message: &str) -> Vec<Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["fields"]["message"] == message)
        .map(|l| l["fields"].clone())
        .collect()
}

/// What the apiserver does with muster's kinds and opted-in pods through the Service, and what
/// muster saw of it.
async fn assert_admission(muster: &GuestMuster, prefix: &str) {
    let ns = namespace(prefix);

    let refused = create_invalid_job(&ns.name, "always-restarts").await;
    let Err(kube::Error::Api(e)) = &refused else { panic!("an invalid MusterJob was not refused: {refused:?}") };
    assert_eq!(e.code, 422, "{e:?}");
    assert!(e.message.contains(&format!("admission webhook \"{VALIDATE_BATCH}\" denied the request")), "{e:?}");
    assert!(e.message.contains("spec.template.spec.restartPolicy: Unsupported value: \"Always\""), "{e:?}");
    let fields: Vec<&str> = e.details.iter().flat_map(|d| &d.causes).map(|c| c.field.as_str()).collect();
    assert_eq!(fields, ["spec.template.spec.restartPolicy"], "{e:?}");
    Api::<MusterJob>::namespaced(client().await, &ns.name)
        .create(&PostParams::default(), &job("never-restarts", "Never"))
        .await
        .unwrap_or_else(|e| panic!("a valid MusterJob was refused: {e}"));

    let pods = Api::<Pod>::namespaced(client().await, &ns.name);
    let pod = pods.create(&PostParams::default(), &labelled_pod("joins-a-group")).await.expect("labelled pod");
    let gates: Vec<String> =
        pod.spec.and_then(|s| s.scheduling_gates).unwrap_or_default().into_iter().map(|g| g.name).collect();
    assert_eq!(gates, [ADMISSION_GATE], "the labelled pod was not gated");
    let plain: Pod = serde_json::from_value(
        json!({"metadata": {"name": "plain"}, "spec": {"containers": [{"name": "main", "image": "example/none"}]}}),
    )
    .expect("pod");
    let plain = pods.create(&PostParams::default(), &plain).await.expect("unlabelled pod");
    assert!(plain.spec.and_then(|s| s.scheduling_gates).is_none_or(|g| g.is_empty()), "an unlabelled pod was gated");

    // muster's side: the reviews the apiserver sent through the Service.
    let metrics = reqwest::get(format!("http://{}/metrics", muster.metrics)).await.expect("GET /metrics");
    let metrics = metrics.text().await.expect("/metrics text");
    let requests =
        |path, outcome| metric(&metrics, "muster_webhook_requests_total", &[("path", path), ("outcome", outcome)]);
    assert!(requests("/validate", "denied") >= 1.0 && requests("/validate", "allowed") >= 1.0, "{metrics}");
    assert!(requests("/mutate", "patched") >= 1.0, "{metrics}");
    let log = muster.log_text();
    let reviews = log_events(&log, "admission review");
    let seen = |path: &str, name: &str, outcome: &str| {
        reviews.iter().any(|f| {
            f["path"] == path && f["name"] == name && f["namespace"] == ns.name.as_str() && f["outcome"] == outcome
        })
    };
    assert!(seen("/validate", "always-restarts", "Denied"), "no denied review in muster's log:\n{log}");
    assert!(seen("/validate", "never-restarts", "Allowed"), "no allowed review in muster's log:\n{log}");
    assert!(seen("/mutate", "joins-a-group", "Patched"), "no pod review in muster's log:\n{log}");
    assert!(!reviews.iter().any(|f| f["name"] == "plain"), "the unlabelled pod reached muster:\n{log}");
}

/// `--flag=value` or `--flag value` in `args`.
fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    let prefix = format!("{name}=");
    args.iter().enumerate().find_map(|(i, a)| {
        a.strip_prefix(&prefix).or_else(|| (a == name).then(|| args.get(i + 1).map(String::as_str)).flatten())
    })
}

/// `helm template` of the working tree's chart as release `muster` in `namespace`.
fn helm_template(cluster: &Cluster, namespace: &str, set: &[&str]) -> Vec<Value> {
    let home = cluster.dir.join("helm");
    let mut cmd = std::process::Command::new(k8s_bin().unwrap_or_else(|e| panic!("{e}")).join("helm"));
    cmd.args(["template", "muster"])
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/muster"))
        .args(["--namespace", namespace])
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"));
    for s in set {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().unwrap_or_else(|e| panic!("helm: {e}"));
    assert!(out.status.success(), "helm template: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("helm template output: {e}"));
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().into_iter().flatten().filter_map(|s| s.as_str().map(String::from)).collect()
}

#[tokio::test]
async fn the_charts_webhooks_reach_muster_through_its_service() {
    let (cluster, host) = testhost::cluster();
    let _alone = ONE_AT_A_TIME.lock().await;
    let ns = "muster-system";
    create_namespace(cluster, ns);
    let rendered = helm_template(cluster, ns, &["logLevel=info\\,muster=debug", "replicaCount=1"]);
    let one = |kind: &str, name: Option<&str>| -> Value {
        let found: Vec<&Value> =
            rendered.iter().filter(|d| d["kind"] == kind && name.is_none_or(|n| d["metadata"]["name"] == n)).collect();
        assert_eq!(found.len(), 1, "the chart rendered {} {kind} {name:?}", found.len());
        found[0].clone()
    };

    // The Deployment's muster: Service mode, configurations left to the chart.
    let deployment = one("Deployment", None);
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args = strings(&container["args"]);
    assert_eq!(args.first().map(String::as_str), Some("run"), "{args:?}");
    assert_eq!(flag(&args, "--webhook-url"), None, "{args:?}");
    assert_eq!(flag(&args, "--webhook-manage-configurations"), Some("false"), "{args:?}");
    let service_name = flag(&args, "--webhook-service").expect("--webhook-service").to_string();
    let secret = flag(&args, "--webhook-secret").expect("--webhook-secret").to_string();
    let port_of = |name: &str| -> u16 {
        let ports = container["ports"].as_array().expect("container ports");
        let port = ports.iter().find(|p| p["name"] == name).unwrap_or_else(|| panic!("no container port {name}"));
        port["containerPort"].as_u64().and_then(|p| u16::try_from(p).ok()).expect("containerPort")
    };
    let env_names: Vec<&str> =
        container["env"].as_array().into_iter().flatten().filter_map(|e| e["name"].as_str()).collect();
    assert_eq!(env_names, ["POD_NAME", "POD_NAMESPACE"], "the Deployment's environment changed: adapt this test");

    // The chart's Service and configurations, as rendered: the Service, no caBundle.
    let service = one("Service", Some(&service_name));
    let service_port = &service["spec"]["ports"][0];
    let port_name = service_port["name"].as_str().expect("Service port name");
    let target = port_of(service_port["targetPort"].as_str().expect("targetPort names the container port"));
    let service_ref = ServiceRef {
        namespace: ns.into(),
        name: service_name.clone(),
        port: service_port["port"].as_i64().and_then(|p| i32::try_from(p).ok()).expect("Service port"),
    };
    let mut objects = vec![service.clone()];
    for kind in ["ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"] {
        let config = one(kind, None);
        for w in config["webhooks"].as_array().expect("webhooks") {
            let cc = &w["clientConfig"];
            assert!(cc.get("caBundle").is_none() && cc.get("url").is_none(), "{kind} rendered {cc}");
            assert_eq!(cc["service"]["name"], service_name.as_str(), "{kind} {cc}");
        }
        objects.push(config);
    }
    for kind in ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"] {
        objects.extend(rendered.iter().filter(|d| d["kind"] == kind).cloned());
    }
    let _configs = DeleteConfigurations(cluster);
    apply(cluster, &objects);
    apply(cluster, &[endpoint_slice(&service_ref, port_name, target, &host)]);

    // The pod's muster, in the test host: the Deployment's arguments verbatim (listening on
    // 0.0.0.0 there), its ServiceAccount's token, the downward API's environment.
    let account = pod["serviceAccountName"].as_str().expect("serviceAccountName");
    let kubeconfig = service_account_kubeconfig(cluster, ns, account).unwrap_or_else(|e| panic!("{e}"));
    let mut run = args.clone();
    run.push(format!("--kubeconfig={}", kubeconfig.display()));
    let mut muster = GuestMuster::start(
        cluster,
        &host,
        "chart",
        &run,
        &[("POD_NAME", "muster-testhost-0"), ("POD_NAMESPACE", ns)],
        host.guest(port_of("metrics")),
    );
    let ca = wait_until_served(&mut muster, &service_ref, &secret).await;
    assert_configurations(&service_ref, &ca).await;
    assert_admission(&muster, "service-chart").await;
    assert!(muster.running(), "muster exited:\n{}", muster.log_tail(30));
}

#[tokio::test]
async fn configurations_muster_applies_call_its_service() {
    let (cluster, host) = testhost::cluster();
    let _alone = ONE_AT_A_TIME.lock().await;
    // Not the defaults, to see --namespace, --webhook-service and --webhook-service-port reach
    // the configurations; a Service without a selector, its EndpointSlice written here.
    let service = ServiceRef { namespace: "muster-service".into(), name: "muster-admission".into(), port: 8443 };
    let (webhook_port, metrics_port) = (9443, 8080);
    create_namespace(cluster, &service.namespace);
    apply(
        cluster,
        &[json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": service.name, "namespace": service.namespace},
            "spec": {"ports": [{"name": "https", "port": service.port, "targetPort": webhook_port, "protocol": "TCP"}]},
        })],
    );
    let slice = endpoint_slice(&service, "https", webhook_port, &host);
    apply(cluster, std::slice::from_ref(&slice));

    let _configs = DeleteConfigurations(cluster);
    let kubeconfig = cluster.kubeconfig.display().to_string();
    let run: Vec<String> = [
        "run",
        "--kubeconfig",
        &kubeconfig,
        "--namespace",
        &service.namespace,
        "--identity",
        "muster-testhost",
        "--log-level=info,muster=debug",
        "--log-format=json",
        &format!("--metrics-bind-address={}", host.guest(metrics_port)),
        &format!("--webhook-bind-address={}", host.guest(webhook_port)),
        &format!("--webhook-service={}", service.name),
        &format!("--webhook-service-port={}", service.port),
        "--webhook-manage-configurations=true",
    ]
    .map(String::from)
    .to_vec();
    let mut muster = GuestMuster::start(cluster, &host, "managed", &run, &[], host.guest(metrics_port));
    let ca = wait_until_served(&mut muster, &service, "muster-webhook-tls").await;
    assert_configurations(&service, &ca).await;
    assert_admission(&muster, "service-managed").await;

    // The apiserver finds muster through the EndpointSlice and nothing else: without it, the
    // call fails (fail closed) naming the Service; with it back, muster answers again.
    let ns = namespace("service-endpoints");
    cluster
        .kubectl(&[
            "-n",
            &service.namespace,
            "delete",
            "endpointslice",
            slice["metadata"]["name"].as_str().expect("name"),
        ])
        .unwrap_or_else(|e| panic!("{e}"));
    let deadline = Instant::now() + TIMEOUT;
    let unreachable = format!("no endpoints available for service \"{}\"", service.name);
    loop {
        match create_invalid_job(&ns.name, "no-endpoints").await {
            Err(kube::Error::Api(e)) if e.message.contains(&unreachable) => {
                assert!(e.message.contains(&format!("failed calling webhook \"{VALIDATE_BATCH}\"")), "{e:?}");
                break;
            }
            other => assert!(Instant::now() < deadline, "still reaching muster without an EndpointSlice: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    apply(cluster, &[slice]);
    loop {
        match create_invalid_job(&ns.name, "endpoints-back").await {
            Err(kube::Error::Api(e)) if e.message.contains("spec.template.spec.restartPolicy") => break,
            other => assert!(Instant::now() < deadline, "muster not reached with the EndpointSlice back: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(muster.running(), "muster exited:\n{}", muster.log_tail(30));
}

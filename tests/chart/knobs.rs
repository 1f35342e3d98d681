//! The chart's operating knobs: `commonLabels`, `image.digest`, `extraArgs`, `extraEnv`,
//! `hostNetwork` and `dnsPolicy`, the Lease timings, the webhooks' selector extensions, the
//! ClusterRoles aggregated into `admin`, `edit` and `view`, and `/metrics` over HTTPS
//! (`metrics.secure`). Rendered without a cluster; then all of them installed together on the
//! tests' control plane, where they must take effect: users bound to `edit` or `view` get
//! exactly muster's kinds, the selectors decide which requests reach the webhooks, and muster,
//! run with the release's arguments and ServiceAccount, serves `/metrics` over HTTPS only to a
//! token allowed to read it.

use std::collections::BTreeSet;
use std::time::Duration;

use clap::Parser;
use muster::webhook::config as webhooks;
use serde_json::{Value, json};

use crate::harness::{cluster, kubectl, namespace};
use crate::support::{
    CRD_NAMES, Muster, Release, chart_dir, container_args, eventually, exclusive, free_port, helm, helm_cluster,
    http_get, kubectl_stdin, of_kind, one, path_str, render, repo,
};

const NS: &str = "muster-system";
const TIMEOUT: Duration = Duration::from_secs(60);
const DIGEST: &str = "sha256:4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945";

fn set_json(extra: &[(&str, Value)]) -> Vec<String> {
    extra.iter().flat_map(|(k, v)| ["--set-json".to_string(), format!("{k}={v}")]).collect()
}

fn render_json(extra: &[(&str, Value)]) -> Vec<Value> {
    let args = set_json(extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    render(NS, &args)
}

fn pod_spec(workload: &Value) -> &Value {
    &workload["spec"]["template"]["spec"]
}

fn env_names(container: &Value) -> Vec<&str> {
    container["env"].as_array().into_iter().flatten().filter_map(|e| e["name"].as_str()).collect()
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array().into_iter().flatten().filter_map(Value::as_str).collect()
}

/// Whether `muster run` accepts the Deployment's arguments.
fn parses(deployment: &Value) -> Result<(), String> {
    let mut argv = vec!["muster".to_string()];
    argv.extend(container_args(deployment));
    muster::cli::Cli::try_parse_from(&argv).map(|_| ()).map_err(|e| format!("{argv:?}: {e}"))
}

#[test]
fn common_labels_are_on_every_object_and_pod_and_never_replace_the_charts() {
    let common = json!({"team": "platform", "example.com/cost-center": "gpu", "app.kubernetes.io/name": "hijacked"});
    let everything = [
        ("commonLabels", common.clone()),
        ("nodeAgent.enabled", json!(true)),
        ("dashboards.enabled", json!(true)),
        ("prometheusRule.enabled", json!(true)),
        ("metrics.serviceMonitor.enabled", json!(true)),
        ("metrics.secure.enabled", json!(true)),
        ("metrics.secure.readers", json!([{"kind": "ServiceAccount", "name": "prom", "namespace": "monitoring"}])),
        ("networkPolicy.enabled", json!(true)),
        ("webhook.certificate.mode", json!("cert-manager")),
    ];
    let docs = render_json(&everything);
    let plain = render_json(&[("nodeAgent.enabled", json!(true))]);
    assert!(docs.len() >= 20, "{} objects", docs.len());
    for doc in &docs {
        let labels = &doc["metadata"]["labels"];
        let what = format!("{} {}", doc["kind"], doc["metadata"]["name"]);
        assert_eq!(labels["team"], "platform", "{what}: {labels}");
        assert_eq!(labels["example.com/cost-center"], "gpu", "{what}: {labels}");
        // The chart's own labels win: selectors keep working.
        assert!(labels["app.kubernetes.io/name"].as_str().is_some_and(|n| n.starts_with("muster")), "{what}: {labels}");
        assert_eq!(labels["app.kubernetes.io/managed-by"], "Helm", "{what}");
    }
    for kind in ["Deployment", "DaemonSet"] {
        let w = one(&docs, kind);
        let pod = &w["spec"]["template"]["metadata"]["labels"];
        assert_eq!(pod["team"], "platform", "{kind} pods: {pod}");
        // The selectors are unchanged, and still select the pods.
        assert_eq!(w["spec"]["selector"], one(&plain, kind)["spec"]["selector"], "{kind}");
        for (k, v) in w["spec"]["selector"]["matchLabels"].as_object().expect("matchLabels") {
            assert_eq!(&pod[k], v, "{kind}: pod label {k}");
        }
    }
    // podLabels win over commonLabels on the pods.
    let docs = render_json(&[("commonLabels", json!({"team": "a"})), ("podLabels", json!({"team": "b"}))]);
    assert_eq!(one(&docs, "Deployment")["spec"]["template"]["metadata"]["labels"]["team"], "b");
}

#[test]
fn image_digest_takes_precedence_over_the_tag() {
    let docs = render_json(&[("nodeAgent.enabled", json!(true))]);
    assert!(
        one(&docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
            .as_str()
            .is_some_and(|i| i.starts_with("muster/muster:"))
    );
    let docs = render_json(&[
        ("image.digest", json!(DIGEST)),
        ("image.tag", json!("9.9.9")),
        ("nodeAgent.enabled", json!(true)),
    ]);
    for kind in ["Deployment", "DaemonSet"] {
        assert_eq!(pod_spec(one(&docs, kind))["containers"][0]["image"], format!("muster/muster@{DIGEST}"), "{kind}");
    }
}

#[test]
fn extra_args_add_or_replace_flags_and_extra_env_is_added() {
    let docs = render_json(&[
        ("extraArgs", json!(["--bind-timeout=90", "--require-single-numa", "--log-level=info,muster=debug"])),
        (
            "extraEnv",
            json!([{"name": "RUST_BACKTRACE", "value": "1"}, {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}]),
        ),
    ]);
    let d = one(&docs, "Deployment");
    let args = container_args(d);
    let named = |flag: &str| args.iter().filter(|a| a.split('=').next() == Some(flag)).cloned().collect::<Vec<_>>();
    // Replaced: once, with the extra value; added: once.
    assert_eq!(named("--bind-timeout"), ["--bind-timeout=90"], "{args:?}");
    assert_eq!(named("--log-level"), ["--log-level=info,muster=debug"], "{args:?}");
    assert_eq!(named("--require-single-numa"), ["--require-single-numa"], "{args:?}");
    // The chart's flags first, then the extras in their order.
    assert_eq!(
        &args[args.len() - 3..],
        ["--bind-timeout=90", "--require-single-numa", "--log-level=info,muster=debug"]
    );
    assert_eq!(args[0], "run");
    parses(d).unwrap_or_else(|e| panic!("{e}"));
    let c = &pod_spec(d)["containers"][0];
    assert_eq!(env_names(c), ["POD_NAME", "POD_NAMESPACE", "RUST_BACKTRACE", "NODE_IP"]);
    assert_eq!(c["env"][3]["valueFrom"]["fieldRef"]["fieldPath"], "status.hostIP");
    // Nothing extra by default.
    let default = render(NS, &[]);
    assert_eq!(env_names(&pod_spec(one(&default, "Deployment"))["containers"][0]), ["POD_NAME", "POD_NAMESPACE"]);
}

#[test]
fn host_network_switches_the_dns_policy_unless_one_is_set() {
    let default = render_json(&[("nodeAgent.enabled", json!(true))]);
    let spec = pod_spec(one(&default, "Deployment"));
    assert!(spec.get("hostNetwork").is_none(), "{spec}");
    assert_eq!(spec["dnsPolicy"], "ClusterFirst");
    let host = render_json(&[("hostNetwork", json!(true)), ("nodeAgent.enabled", json!(true))]);
    let spec = pod_spec(one(&host, "Deployment"));
    assert_eq!((&spec["hostNetwork"], &spec["dnsPolicy"]), (&json!(true), &json!("ClusterFirstWithHostNet")));
    // The node agent is not the controller manager: it stays as it was.
    assert_eq!(pod_spec(one(&host, "DaemonSet")), pod_spec(one(&default, "DaemonSet")));
    let set = render_json(&[("hostNetwork", json!(true)), ("dnsPolicy", json!("Default"))]);
    assert_eq!(pod_spec(one(&set, "Deployment"))["dnsPolicy"], "Default");
    let none = render_json(&[("dnsPolicy", json!("None"))]);
    assert_eq!(pod_spec(one(&none, "Deployment"))["dnsPolicy"], "None");
}

#[test]
fn lease_timings_are_flags_and_the_grace_must_be_shorter() {
    let args = container_args(one(&render(NS, &[]), "Deployment"));
    for flag in ["--leader-elect-lease-duration=15", "--leader-elect-renew-grace=5"] {
        assert!(args.iter().any(|a| a == flag), "{flag}: {args:?}");
    }
    let d = render_json(&[
        ("leaderElection.leaseDurationSeconds", json!(40)),
        ("leaderElection.renewGraceSeconds", json!(12)),
    ]);
    let args = container_args(one(&d, "Deployment"));
    for flag in ["--leader-elect-lease-duration=40", "--leader-elect-renew-grace=12"] {
        assert!(args.iter().any(|a| a == flag), "{flag}: {args:?}");
    }
    parses(one(&d, "Deployment")).unwrap_or_else(|e| panic!("{e}"));
    let chart = chart_dir();
    let err = helm(&["template", "muster", path_str(&chart), "--set", "leaderElection.renewGraceSeconds=15"])
        .expect_err("grace = duration");
    assert!(err.contains("renewGraceSeconds must be less than"), "{err}");
}

#[test]
fn webhook_selector_extensions_are_added_to_the_charts() {
    let extra_ns = json!([{"key": "muster.dev/webhooks", "operator": "NotIn", "values": ["off"]}]);
    let extra_obj = json!([{"key": "muster.dev/skip-gating", "operator": "DoesNotExist"}]);
    let docs = render_json(&[
        ("webhook.namespaceSelector.matchExpressions", extra_ns.clone()),
        ("webhook.namespaceSelector.matchLabels", json!({"muster.dev/gangs": "on"})),
        ("webhook.objectSelector.matchExpressions", extra_obj.clone()),
        ("webhook.objectSelector.matchLabels", json!({"team": "ml"})),
    ]);
    let own_ns = serde_json::to_value(webhooks::namespace_selector(NS)).expect("selector");
    let mut webhook_count = 0;
    for kind in ["ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"] {
        for w in one(&docs, kind)["webhooks"].as_array().expect("webhooks") {
            webhook_count += 1;
            let sel = &w["namespaceSelector"];
            let exprs = sel["matchExpressions"].as_array().expect("matchExpressions");
            // muster's own exclusion first, unchanged; the extension after it (ANDed).
            assert_eq!(exprs[0], own_ns["matchExpressions"][0], "{}", w["name"]);
            assert_eq!(Value::from(exprs[1..].to_vec()), extra_ns, "{}", w["name"]);
            assert_eq!(sel["matchLabels"], json!({"muster.dev/gangs": "on"}), "{}", w["name"]);
            // The pod gate's objectSelector is extended; the scheduling-API record (muster's
            // job kinds) has none.
            if w["name"] == webhooks::MUTATE_PODS {
                let obj = &w["objectSelector"];
                assert_eq!(
                    obj["matchExpressions"],
                    json!([{"key": muster::crds::POD_GROUP_LABEL, "operator": "Exists"}, extra_obj[0]]),
                    "{}",
                    w["name"]
                );
                assert_eq!(obj["matchLabels"], json!({"team": "ml"}));
            } else {
                assert!(w.get("objectSelector").is_none(), "{}: {w}", w["name"]);
            }
        }
    }
    assert_eq!(webhook_count, 4, "two validating webhooks, the pod gate and the scheduling-API record");
}

#[test]
fn aggregated_roles_give_users_muster_kinds_and_only_read_its_groups() {
    let docs = render(NS, &[]);
    let role = |name: &str| {
        of_kind(&docs, "ClusterRole")
            .into_iter()
            .find(|r| r["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {name}"))
            .clone()
    };
    let edit = role("muster-edit");
    let view = role("muster-view");
    let label = |r: &Value, k: &str| r["metadata"]["labels"][format!("rbac.authorization.k8s.io/{k}")].clone();
    assert_eq!((label(&edit, "aggregate-to-edit"), label(&edit, "aggregate-to-admin")), (json!("true"), json!("true")));
    assert_eq!(label(&edit, "aggregate-to-view"), Value::Null);
    assert_eq!(label(&view, "aggregate-to-view"), json!("true"));
    assert_eq!((label(&view, "aggregate-to-edit"), label(&view, "aggregate-to-admin")), (Value::Null, Value::Null));
    // Every resource named is one of muster's CRDs (or its status), in its group.
    let crds: BTreeSet<String> = CRD_NAMES.iter().map(|n| n.to_string()).collect();
    for r in [&edit, &view] {
        for rule in r["rules"].as_array().expect("rules") {
            let group = strings(&rule["apiGroups"]);
            assert_eq!(group.len(), 1, "{rule}");
            for res in strings(&rule["resources"]) {
                let plural = res.trim_end_matches("/status");
                assert!(crds.contains(&format!("{plural}.{}", group[0])), "{res}.{} is not a muster CRD", group[0]);
            }
            assert!(rule.get("nonResourceURLs").is_none() && !strings(&rule["verbs"]).contains(&"*"), "{rule}");
        }
    }
    let edit_rules = edit["rules"].as_array().expect("rules");
    assert_eq!(edit_rules.len(), 1);
    assert_eq!(strings(&edit_rules[0]["apiGroups"]), ["batch.muster.dev"]);
    assert_eq!(strings(&edit_rules[0]["resources"]), ["musterjobs", "musterjobsets"]);
    let verbs: BTreeSet<&str> = strings(&edit_rules[0]["verbs"]).into_iter().collect();
    assert_eq!(
        verbs,
        BTreeSet::from(["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"])
    );
    for rule in view["rules"].as_array().expect("rules") {
        assert_eq!(strings(&rule["verbs"]), ["get", "list", "watch"], "view is read only: {rule}");
    }
    let viewed: BTreeSet<&str> =
        view["rules"].as_array().into_iter().flatten().flat_map(|r| strings(&r["resources"])).collect();
    for res in ["musterjobs", "musterjobsets", "podgroups", "compositepodgroups", "workloads"] {
        assert!(viewed.contains(res), "view cannot read {res}");
    }
    let off = render(NS, &["--set", "rbac.aggregateToDefaultRoles=false"]);
    let names: Vec<&str> =
        of_kind(&off, "ClusterRole").into_iter().filter_map(|r| r["metadata"]["name"].as_str()).collect();
    assert_eq!(names, ["muster-controller"]);
}

#[test]
fn secure_metrics_switch_port_service_monitor_policy_and_rbac() {
    let base = [("metrics.serviceMonitor.enabled", json!(true)), ("networkPolicy.enabled", json!(true))];
    // Off: plain /metrics everywhere, no review rights, no reader role.
    let docs = render_json(&base);
    let d = one(&docs, "Deployment");
    assert!(!container_args(d).iter().any(|a| a.starts_with("--metrics-secure") || a.starts_with("--metrics-cert")));
    let controller = of_kind(&docs, "ClusterRole")
        .into_iter()
        .find(|r| r["metadata"]["name"] == "muster-controller")
        .expect("role")
        .clone();
    let resources = |role: &Value| -> Vec<String> {
        role["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|r| strings(&r["resources"]))
            .map(str::to_string)
            .collect()
    };
    assert!(!resources(&controller).iter().any(|r| r == "tokenreviews" || r == "subjectaccessreviews"));
    let sm = one(&docs, "ServiceMonitor");
    assert_eq!(
        sm["spec"]["endpoints"],
        json!([{"port": "metrics", "path": "/metrics", "interval": "30s", "scrapeTimeout": "10s", "honorLabels": true}])
    );

    let mut on = base.to_vec();
    on.push(("metrics.secure.enabled", json!(true)));
    let docs = render_json(&on);
    let d = one(&docs, "Deployment");
    let args = container_args(d);
    assert!(args.contains(&"--metrics-secure-bind-address=0.0.0.0:8443".to_string()), "{args:?}");
    assert!(args.contains(&"--metrics-bind-address=0.0.0.0:8080".to_string()), "health stays plain: {args:?}");
    assert!(!args.iter().any(|a| a.starts_with("--metrics-cert-dir")), "self-signed without certSecret: {args:?}");
    parses(d).unwrap_or_else(|e| panic!("{e}"));
    let c = &pod_spec(d)["containers"][0];
    assert_eq!(c["ports"][1], json!({"name": "metrics-https", "containerPort": 8443, "protocol": "TCP"}));
    assert_eq!(c["readinessProbe"]["httpGet"]["port"], "metrics", "probes stay on the plain port");
    let svc = of_kind(&docs, "Service")
        .into_iter()
        .find(|s| s["metadata"]["name"] == "muster-metrics")
        .expect("metrics Service");
    assert_eq!(
        svc["spec"]["ports"],
        json!([{"name": "https", "port": 8443, "targetPort": "metrics-https", "protocol": "TCP"}])
    );
    let sm = one(&docs, "ServiceMonitor");
    assert_eq!(
        sm["spec"]["endpoints"],
        json!([{
            "port": "https", "scheme": "https", "path": "/metrics", "interval": "30s", "scrapeTimeout": "10s",
            "honorLabels": true,
            "bearerTokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token",
            "tlsConfig": {"insecureSkipVerify": true},
        }])
    );
    let policy = one(&docs, "NetworkPolicy");
    let ports: Vec<&Value> =
        policy["spec"]["ingress"].as_array().into_iter().flatten().map(|r| &r["ports"][0]["port"]).collect();
    assert_eq!(ports, [&json!("webhook"), &json!("metrics-https")]);
    let roles = of_kind(&docs, "ClusterRole");
    let controller = roles.iter().find(|r| r["metadata"]["name"] == "muster-controller").expect("role");
    for (group, resource) in
        [("authentication.k8s.io", "tokenreviews"), ("authorization.k8s.io", "subjectaccessreviews")]
    {
        let rule =
            controller["rules"].as_array().into_iter().flatten().find(|r| strings(&r["resources"]) == [resource]);
        let rule = rule.unwrap_or_else(|| panic!("no {resource} rule"));
        assert_eq!((strings(&rule["apiGroups"]), strings(&rule["verbs"])), (vec![group], vec!["create"]), "{rule}");
    }
    let reader = roles.iter().find(|r| r["metadata"]["name"] == "muster-metrics-reader").expect("metrics-reader");
    assert_eq!(reader["rules"], json!([{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]));
    assert!(
        of_kind(&docs, "ClusterRoleBinding").iter().all(|b| b["metadata"]["name"] != "muster-metrics-reader"),
        "no readers, no binding"
    );

    // A CA, a token Secret, a certificate Secret and readers.
    on.extend([
        ("metrics.serviceMonitor.tlsConfig", json!({"ca": {"secret": {"name": "ca", "key": "ca.crt"}}, "serverName": "muster-metrics.muster-system.svc"})),
        ("metrics.serviceMonitor.bearerTokenSecret", json!({"name": "scrape", "key": "token"})),
        ("metrics.secure.certSecret", json!("metrics-tls")),
        ("metrics.secure.port", json!(9444)),
        ("metrics.secure.readers", json!([{"kind": "ServiceAccount", "name": "prom", "namespace": "monitoring"}])),
    ]);
    let docs = render_json(&on);
    let d = one(&docs, "Deployment");
    let args = container_args(d);
    assert!(args.contains(&"--metrics-secure-bind-address=0.0.0.0:9444".to_string()), "{args:?}");
    assert!(args.contains(&"--metrics-cert-dir=/etc/muster/metrics-certs".to_string()), "{args:?}");
    parses(d).unwrap_or_else(|e| panic!("{e}"));
    let spec = pod_spec(d);
    assert_eq!(spec["volumes"], json!([{"name": "metrics-certs", "secret": {"secretName": "metrics-tls"}}]));
    assert_eq!(
        spec["containers"][0]["volumeMounts"],
        json!([{"name": "metrics-certs", "mountPath": "/etc/muster/metrics-certs", "readOnly": true}])
    );
    let endpoint = &one(&docs, "ServiceMonitor")["spec"]["endpoints"][0];
    assert_eq!(
        endpoint["tlsConfig"],
        json!({"ca": {"secret": {"name": "ca", "key": "ca.crt"}}, "serverName": "muster-metrics.muster-system.svc"}),
        "a CA: verified"
    );
    assert_eq!(endpoint["authorization"], json!({"type": "Bearer", "credentials": {"name": "scrape", "key": "token"}}));
    assert!(endpoint.get("bearerTokenFile").is_none());
    let binding = of_kind(&docs, "ClusterRoleBinding")
        .into_iter()
        .find(|b| b["metadata"]["name"] == "muster-metrics-reader")
        .expect("binding");
    assert_eq!(binding["roleRef"]["name"], "muster-metrics-reader");
    assert_eq!(binding["subjects"], json!([{"kind": "ServiceAccount", "name": "prom", "namespace": "monitoring"}]));

    // One listener per port.
    let chart = chart_dir();
    for clash in ["metrics.secure.port=8080", "metrics.secure.port=9443"] {
        let err =
            helm(&["template", "muster", path_str(&chart), "--set", "metrics.secure.enabled=true", "--set", clash])
                .expect_err(clash);
        assert!(err.contains("metrics.secure.port must differ"), "{clash}: {err}");
    }
}

#[test]
fn schema_rejects_bad_knob_values() {
    let chart = chart_dir();
    let cases: &[(&str, &str, &str)] = &[
        ("--set", "image.digest=latest", "does not match pattern"),
        ("--set", "dnsPolicy=ClusterFirstWithHost", "value must be one of"),
        ("--set", "hostNetwork=yes", "hostNetwork"),
        ("--set-json", r#"extraArgs=["bind-timeout=3"]"#, "does not match pattern"),
        ("--set-json", r#"extraEnv=[{"value":"x"}]"#, "missing property 'name'"),
        ("--set-json", r#"commonLabels={"team":1}"#, "commonLabels"),
        (
            "--set-json",
            r#"webhook.namespaceSelector.matchExpressions=[{"key":"a","operator":"Equals"}]"#,
            "value must be one of",
        ),
        (
            "--set-json",
            r#"webhook.objectSelector.matchLables={"a":"b"}"#,
            "additional properties 'matchLables' not allowed",
        ),
        ("--set", "metrics.secure.port=0", "minimum"),
        ("--set", "metrics.secure.enable=true", "additional properties 'enable' not allowed"),
        ("--set-json", r#"metrics.secure.readers=[{"kind":"Robot","name":"x"}]"#, "value must be one of"),
        ("--set", "metrics.serviceMonitor.bearerTokenSecret.nme=x", "additional properties 'nme' not allowed"),
        ("--set", "leaderElection.leaseDurationSeconds=1", "minimum"),
        ("--set", "dashboards.labelValue=1", "dashboards"),
        ("--set", "prometheusRule.alerts.down.for=5 minutes", "does not match pattern"),
        ("--set", "prometheusRule.alerts.webhookErrors.ratio=5", "maximum"),
        ("--set", "prometheusRule.alerts.gangsPending.treshold=1", "additional properties 'treshold' not allowed"),
        ("--set", "rbac.aggregate=true", "additional properties 'aggregate' not allowed"),
    ];
    for (how, set, expected) in cases {
        let err = helm(&["template", "muster", path_str(&chart), how, set]).expect_err(set);
        assert!(err.contains(expected), "{how} {set}: expected {expected:?} in:\n{err}");
    }
}

/// A MusterJob nobody runs (no muster in this test): only its creation matters.
const JOB: &str = r#"
apiVersion: batch.muster.dev/v1alpha1
kind: MusterJob
metadata:
  name: by-a-user
spec:
  parallelism: 1
  completions: 1
  scheduling:
    schedulingPolicy:
      gang:
        minCount: 1
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: main
          image: example/none
"#;

fn pod(name: &str, labels: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels: {labels}\nspec:\n  restartPolicy: Never\n  containers:\n    - name: main\n      image: example/none\n"
    )
}

/// `kubectl auth can-i` as `who` (a user or `system:serviceaccount:...`): `yes` or `no`.
fn can(who: &str, args: &[&str]) -> bool {
    let as_ = format!("--as={who}");
    let mut all = vec!["auth", "can-i", as_.as_str()];
    all.extend_from_slice(args);
    cluster().kubectl(&all).is_ok_and(|out| out.trim() == "yes")
}

/// A GET over HTTPS (the certificate checked against `ca_pem`), with `token` as bearer.
fn https_get(addr: &str, path: &str, ca_pem: &str, token: Option<&str>) -> Result<(u16, String), String> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let ca = reqwest::Certificate::from_pem(ca_pem.as_bytes()).map_err(|e| e.to_string())?;
        let client = reqwest::Client::builder()
            .add_root_certificate(ca)
            .tls_built_in_root_certs(false)
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| e.to_string())?;
        let mut request = client.get(format!("https://{addr}{path}"));
        if let Some(t) = token {
            request = request.bearer_auth(t.trim());
        }
        let response = request.send().await.map_err(|e| format!("{e:?}"))?;
        let code = response.status().as_u16();
        Ok((code, response.text().await.map_err(|e| e.to_string())?))
    })
}

/// kube-controller-manager running only the clusterrole-aggregation controller (the one that
/// copies the rules of labelled ClusterRoles into `admin`, `edit` and `view`), which the tests'
/// control plane does not run. Stopped when dropped; a guard shell stops it when the test
/// process is gone.
struct Aggregation(std::process::Child);

impl Aggregation {
    fn start() -> Aggregation {
        let log = cluster().dir.join("logs/clusterrole-aggregation.log");
        let file = std::fs::File::create(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        let script = r#"parent=$1; shift; "$@" & child=$!
            trap 'kill -TERM $child 2>/dev/null; wait $child; exit 0' TERM
            while kill -0 "$parent" 2>/dev/null && kill -0 $child 2>/dev/null; do sleep 0.5; done
            kill -TERM $child 2>/dev/null; wait $child"#;
        let child = std::process::Command::new("bash")
            .arg("-c")
            .arg(script)
            .arg("aggregation-guard")
            .arg(std::process::id().to_string())
            .arg(cluster().bin.join("kube-controller-manager"))
            .arg(format!("--kubeconfig={}", cluster().kubeconfig.display()))
            .args(["--controllers=clusterrole-aggregation-controller", "--leader-elect=false", "--secure-port=0"])
            .stdin(std::process::Stdio::null())
            .stdout(file.try_clone().unwrap_or_else(|e| panic!("{e}")))
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("starting kube-controller-manager: {e}"));
        Aggregation(child)
    }
}

impl Drop for Aggregation {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill").arg("-TERM").arg(self.0.id().to_string()).status();
        let _ = self.0.wait();
    }
}

#[test]
fn every_knob_installs_and_takes_effect() {
    let _lock = exclusive();
    let stubs = repo().join("tests/chart/fixtures/stub-crds.yaml");
    kubectl(&["apply", "--server-side", "-f", path_str(&stubs)]);
    kubectl(&["wait", "--for=condition=Established", "--timeout=60s", "-f", path_str(&stubs)]);
    let ns = "muster-knobs";
    let webhook_port = free_port();
    let secure_port = free_port();
    // The certificate of the HTTPS /metrics (metrics.secure.certSecret), for 127.0.0.1.
    let bundle = muster::webhook::certs::generate(
        &["127.0.0.1".to_string()],
        k8s_openapi::jiff::Timestamp::now(),
        &muster::webhook::certs::Lifetimes::default(),
    )
    .expect("certificate");
    let values = json!({
        "commonLabels": {"muster.dev/test": "knobs", "team": "platform"},
        "image": {"digest": DIGEST},
        "extraArgs": ["--bind-timeout=45", "--require-single-numa"],
        "extraEnv": [{"name": "MUSTER_TEST", "value": "knobs"}],
        "hostNetwork": true,
        "leaderElection": {"leaseDurationSeconds": 20, "renewGraceSeconds": 4},
        "metrics": {
            "secure": {
                "enabled": true,
                "certSecret": "muster-metrics-tls",
                "readers": [{"kind": "ServiceAccount", "name": "scraper", "namespace": ns}],
            },
            "serviceMonitor": {"enabled": true},
        },
        "webhook": {
            "namespaceSelector": {"matchExpressions": [{"key": "muster.dev/skip-webhooks", "operator": "DoesNotExist"}]},
            "objectSelector": {"matchExpressions": [{"key": "muster.dev/skip-gating", "operator": "DoesNotExist"}]},
        },
        "networkPolicy": {"enabled": true},
        "dashboards": {"enabled": true},
        "prometheusRule": {"enabled": true},
    });
    let values_file = cluster().dir.join("knobs-values.yaml");
    std::fs::write(&values_file, serde_saphyr::to_string(&values).expect("yaml")).expect("values file");
    let release = Release::install(&chart_dir(), ns, &["-f", path_str(&values_file)]);
    let manifest = release.manifest();
    let status = helm_cluster(&["status", "muster", "-n", ns]).unwrap_or_else(|e| panic!("{e}"));
    assert!(status.contains("/metrics is served over HTTPS (port 8443)"), "NOTES.txt:\n{status}");
    assert!(!status.contains("kubectl create clusterrolebinding"), "readers are bound already:\n{status}");

    // commonLabels on every live object.
    let kinds: BTreeSet<&str> = manifest.iter().filter_map(|d| d["kind"].as_str()).collect();
    for kind in ["ConfigMap", "PrometheusRule", "ServiceMonitor", "NetworkPolicy", "ClusterRole", "ClusterRoleBinding"]
    {
        assert!(kinds.contains(kind), "no {kind} installed: {kinds:?}");
    }
    for doc in &manifest {
        let kind = doc["kind"].as_str().unwrap_or_default();
        let name = doc["metadata"]["name"].as_str().unwrap_or_default();
        let mut args = vec!["get", kind, name, "-o", "json"];
        if doc["metadata"]["namespace"].is_string() {
            args.extend(["-n", ns]);
        }
        let live: Value = serde_json::from_str(&kubectl(&args)).expect("json");
        assert_eq!(live["metadata"]["labels"]["muster.dev/test"], "knobs", "{kind} {name}");
        assert_eq!(live["metadata"]["labels"]["team"], "platform", "{kind} {name}");
    }

    // The Deployment as the apiserver keeps it, and its pods.
    let d: Value =
        serde_json::from_str(&kubectl(&["get", "deployment", "muster", "-n", ns, "-o", "json"])).expect("json");
    let spec = pod_spec(&d);
    let c = &spec["containers"][0];
    assert_eq!(c["image"], format!("muster/muster@{DIGEST}"));
    assert_eq!((&spec["hostNetwork"], &spec["dnsPolicy"]), (&json!(true), &json!("ClusterFirstWithHostNet")));
    assert!(env_names(c).contains(&"MUSTER_TEST"));
    let args = container_args(&d);
    for flag in [
        "--bind-timeout=45",
        "--require-single-numa",
        "--leader-elect-lease-duration=20",
        "--leader-elect-renew-grace=4",
        "--metrics-secure-bind-address=0.0.0.0:8443",
        "--metrics-cert-dir=/etc/muster/metrics-certs",
    ] {
        assert!(args.iter().any(|a| a == flag), "{flag} not in {args:?}");
    }
    assert!(!args.iter().any(|a| a == "--bind-timeout=60"), "{args:?}");
    eventually(
        "the 2 host-network pods Running, with the common labels",
        TIMEOUT,
        || {
            let out = cluster()
                .kubectl(&[
                    "get",
                    "pods",
                    "-n",
                    ns,
                    "-l",
                    "muster.dev/test=knobs,app.kubernetes.io/component=controller-manager",
                    "-o",
                    "json",
                ])
                .ok()?;
            let pods: Value = serde_json::from_str(&out).ok()?;
            let pods = pods["items"].as_array()?.clone();
            let ok =
                pods.iter().filter(|p| p["status"]["phase"] == "Running" && p["spec"]["hostNetwork"] == true).count();
            (ok == 2).then_some(())
        },
        || kubectl(&["get", "pods", "-n", ns, "-o", "wide"]),
    );

    // Aggregation: kube-controller-manager copies the rules into the built-in roles.
    let _aggregation = Aggregation::start();
    for (role, resource) in [("edit", "musterjobsets"), ("admin", "musterjobs"), ("view", "compositepodgroups")] {
        eventually(
            &format!("{resource} aggregated into the ClusterRole {role}"),
            TIMEOUT,
            || {
                let r: Value =
                    serde_json::from_str(&cluster().kubectl(&["get", "clusterrole", role, "-o", "json"]).ok()?).ok()?;
                let rules = r["rules"].as_array()?.clone();
                rules.iter().any(|rule| strings(&rule["resources"]).contains(&resource)).then_some(())
            },
            String::new,
        );
    }
    let open = namespace("knobs-skip");
    kubectl(&["label", "namespace", &open.name, "muster.dev/skip-webhooks=true"]);
    let guarded = namespace("knobs-guarded");
    for (user, role, namespace) in
        [("alice", "edit", &open.name), ("alice", "edit", &guarded.name), ("bob", "view", &open.name)]
    {
        kubectl(&[
            "create",
            "rolebinding",
            &format!("{user}-{role}"),
            &format!("--clusterrole={role}"),
            &format!("--user={user}"),
            "-n",
            namespace,
        ]);
    }
    let o = open.name.as_str();
    let expectations: &[(&str, &[&str], bool)] = &[
        ("alice", &["create", "musterjobs.batch.muster.dev", "-n", o], true),
        ("alice", &["update", "musterjobs.batch.muster.dev", "-n", o], true),
        ("alice", &["deletecollection", "musterjobsets.batch.muster.dev", "-n", o], true),
        ("alice", &["get", "podgroups.scheduling.muster.dev", "-n", o], true),
        ("alice", &["watch", "compositepodgroups.scheduling.muster.dev", "-n", o], true),
        ("alice", &["list", "workloads.scheduling.muster.dev", "-n", o], true),
        ("alice", &["create", "podgroups.scheduling.muster.dev", "-n", o], false),
        ("alice", &["delete", "compositepodgroups.scheduling.muster.dev", "-n", o], false),
        ("alice", &["patch", "podgroups.scheduling.muster.dev", "--subresource=status", "-n", o], false),
        ("alice", &["patch", "musterjobs.batch.muster.dev", "--subresource=status", "-n", o], false),
        ("alice", &["create", "musterjobs.batch.muster.dev", "-n", "default"], false),
        ("bob", &["list", "musterjobs.batch.muster.dev", "-n", o], true),
        ("bob", &["get", "musterjobsets.batch.muster.dev", "-n", o], true),
        ("bob", &["get", "podgroups.scheduling.muster.dev", "-n", o], true),
        ("bob", &["get", "compositepodgroups.scheduling.muster.dev", "-n", o], true),
        ("bob", &["create", "musterjobs.batch.muster.dev", "-n", o], false),
        ("bob", &["delete", "musterjobsets.batch.muster.dev", "-n", o], false),
        ("carol", &["get", "musterjobs.batch.muster.dev", "-n", o], false),
    ];
    for (user, args, want) in expectations {
        eventually(
            &format!("{user} can-i {args:?} = {want}"),
            TIMEOUT,
            || (can(user, args) == *want).then_some(()),
            String::new,
        );
    }
    // For real: alice creates a MusterJob where the webhooks are skipped (namespaceSelector);
    // bob may not. In a namespace the webhooks do see, the (unreachable) webhook refuses it.
    kubectl_stdin(&["create", "--as=alice", "-n", o, "-f", "-"], JOB).unwrap_or_else(|e| panic!("alice, edit: {e}"));
    kubectl(&["get", "musterjob", "by-a-user", "-n", o]);
    let err = kubectl_stdin(&["create", "--as=bob", "-n", o, "-f", "-"], JOB).expect_err("bob, view");
    assert!(err.contains("forbidden"), "{err}");
    let err =
        kubectl_stdin(&["create", "--as=alice", "-n", &guarded.name, "-f", "-"], JOB).expect_err("through the webhook");
    assert!(err.contains("validate.batch.muster.dev"), "the validating webhook was not called: {err}");
    // The pod webhook: a pod that joins a group is gated (here: refused, muster is not running)
    // unless the objectSelector extension leaves it out.
    let group = muster::crds::POD_GROUP_LABEL;
    kubectl_stdin(
        &["create", "-n", &guarded.name, "-f", "-"],
        &pod("skipped", &format!("{{{group}: g, muster.dev/skip-gating: \"true\"}}")),
    )
    .unwrap_or_else(|e| panic!("a pod the objectSelector leaves out: {e}"));
    let err = kubectl_stdin(&["create", "-n", &guarded.name, "-f", "-"], &pod("gated", &format!("{{{group}: g}}")))
        .expect_err("gated pod");
    assert!(err.contains("gate.pods.muster.dev"), "the mutating webhook was not called: {err}");

    // Secure metrics: RBAC for muster's reviews and for readers.
    let sa = format!("system:serviceaccount:{ns}:muster");
    assert!(can(&sa, &["create", "tokenreviews.authentication.k8s.io"]));
    assert!(can(&sa, &["create", "subjectaccessreviews.authorization.k8s.io"]));
    assert!(!can(&sa, &["get", "/metrics"]), "muster's own account does not read metrics");
    assert!(can(&format!("system:serviceaccount:{ns}:scraper"), &["get", "/metrics"]));
    assert!(!can(&format!("system:serviceaccount:{ns}:stranger"), &["get", "/metrics"]));
    let svc: Value =
        serde_json::from_str(&kubectl(&["get", "service", "muster-metrics", "-n", ns, "-o", "json"])).expect("json");
    assert_eq!(svc["spec"]["ports"][0]["name"], "https");
    let sm: Value =
        serde_json::from_str(&kubectl(&["get", "servicemonitor", "muster", "-n", ns, "-o", "json"])).expect("json");
    assert_eq!(sm["spec"]["endpoints"][0]["scheme"], "https");

    // muster with the release's arguments and ServiceAccount, its HTTPS /metrics on 127.0.0.1
    // with the certificate of the (mounted, here local) Secret.
    let tls = json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "muster-metrics-tls", "namespace": ns},
        "stringData": {"tls.crt": bundle.cert_pem, "tls.key": bundle.key_pem}});
    kubectl_stdin(&["apply", "-f", "-"], &tls.to_string()).unwrap_or_else(|e| panic!("{e}"));
    let cert_dir = cluster().dir.join("knobs-metrics-certs");
    std::fs::create_dir_all(&cert_dir).expect("cert dir");
    std::fs::write(cert_dir.join("tls.crt"), &bundle.cert_pem).expect("tls.crt");
    std::fs::write(cert_dir.join("tls.key"), &bundle.key_pem).expect("tls.key");
    for account in ["scraper", "stranger"] {
        kubectl(&["create", "serviceaccount", account, "-n", ns]);
    }
    let token = |account: &str| kubectl(&["create", "token", account, "-n", ns, "--duration=1h"]);
    let (scraper, stranger) = (token("scraper"), token("stranger"));
    let kubeconfig = release.service_account_kubeconfig();
    let secure = format!("127.0.0.1:{secure_port}");
    let muster = Muster::start(
        &d,
        &kubeconfig,
        ns,
        webhook_port,
        &[&format!("--metrics-secure-bind-address={secure}"), &format!("--metrics-cert-dir={}", cert_dir.display())],
    );
    let log = || muster.log_text();
    let get = |token: Option<&str>| {
        eventually(
            "an answer on the HTTPS /metrics",
            Duration::from_secs(30),
            || https_get(&secure, "/metrics", &bundle.ca_pem, token).inspect_err(|e| eprintln!("{e}")).ok(),
            log,
        )
    };
    let (code, body) = get(Some(&scraper));
    assert_eq!(code, 200, "the reader's scrape: {body}\n{}", log());
    assert!(body.contains("# TYPE muster_gangs_pending gauge"), "{body}");
    assert_eq!(get(None).0, 401, "no token");
    assert_eq!(get(Some("not-a-token")).0, 401, "a token nobody issued");
    assert_eq!(get(Some(&stranger)).0, 403, "a token that may not get /metrics");
    let plain = http_get(&muster.metrics, "/metrics").map(|(code, _)| code);
    assert_ne!(plain, Some(200), "the plain port still serves /metrics");
    assert_eq!(http_get(&muster.metrics, "/readyz").map(|(code, _)| code), Some(200));
    let forbidden = muster.forbidden_lines();
    assert!(forbidden.is_empty(), "muster was refused with the chart's RBAC:\n{}", forbidden.join("\n"));
    drop(muster);
    drop(release);
}

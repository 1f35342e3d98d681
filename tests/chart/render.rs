//! The chart without a cluster: lint, the schema, and the rendered objects against what the
//! muster binary expects (its flags, its webhook configurations, its names, its CRDs).

use std::collections::BTreeSet;

use clap::{CommandFactory, Parser};
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use muster::webhook::config::{self as webhooks, Endpoint};
use serde_json::Value;

use crate::support::{CRD_NAMES, RELEASE, chart_dir, container_args, documents, helm, of_kind, one, path_str, render};

const NS: &str = "muster-system";

fn full_values() -> String {
    chart_dir().join("ci/full-values.yaml").display().to_string()
}

/// The renderings that together reach every template branch.
fn renderings() -> Vec<(&'static str, Vec<Value>)> {
    let full = full_values();
    vec![
        ("default", render(NS, &[])),
        ("full-values", render(NS, &["-f", &full])),
        ("webhook url", render(NS, &["--set", "webhook.url=https://127.0.0.1:9443"])),
        ("webhook off", render(NS, &["--set", "webhook.enabled=false", "--set", "replicaCount=1"])),
        ("node agent", render(NS, &["--set", "nodeAgent.enabled=true"])),
        (
            "secure metrics",
            render(NS, &["--set", "metrics.secure.enabled=true", "--set", "metrics.secure.certSecret=metrics-tls"]),
        ),
        (
            "knobs",
            render(
                NS,
                &[
                    "--set",
                    "hostNetwork=true",
                    "--set-json",
                    r#"extraArgs=["--bind-timeout=30","--webhook-cert-validity=86400"]"#,
                    "--set-json",
                    r#"commonLabels={"team":"platform"}"#,
                    "--set",
                    "image.digest=sha256:4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945",
                ],
            ),
        ),
    ]
}

#[test]
fn lint_passes_with_default_and_full_values() {
    let chart = chart_dir();
    let out = helm(&["lint", "--strict", path_str(&chart)]).unwrap_or_else(|e| panic!("{e}"));
    assert!(out.contains("0 chart(s) failed"), "{out}");
    let out = helm(&["lint", "--strict", path_str(&chart), "-f", &full_values()]).unwrap_or_else(|e| panic!("{e}"));
    assert!(out.contains("0 chart(s) failed"), "{out}");
}

#[test]
fn schema_rejects_typos_and_wrong_types() {
    let chart = chart_dir();
    let cases = [
        ("webhok.enabled=false", "additional properties 'webhok' not allowed"),
        ("image.tagg=1", "additional properties 'tagg' not allowed"),
        ("controller.gpu.maxTemp=90", "additional properties 'maxTemp' not allowed"),
        ("logFormat=yaml", "value must be one of"),
        ("controller.placementStrategy=random", "value must be one of"),
        ("controller.schedulingApi=kube", "value must be one of"),
        ("webhook.certificate.mode=vault", "value must be one of"),
        ("controller.gpu.minFreeMemory=3", "maximum"),
        ("webhook.url=http://127.0.0.1:9443", "does not match pattern"),
        ("resources.requsts.cpu=1", "additional properties 'requsts' not allowed"),
        ("securityContext.runAsNonroot=true", "additional properties 'runAsNonroot' not allowed"),
        ("podSecurityContext.fsgroup=10001", "additional properties 'fsgroup' not allowed"),
        ("nodeAgent.enable=true", "additional properties 'enable' not allowed"),
        ("nodeAgent.health.refresh=5", "additional properties 'refresh' not allowed"),
        ("nodeAgent.driverRoot=run/nvidia/driver", "does not match pattern"),
        ("nodeAgent.updateStrategy.type=Recreate", "value must be one of"),
        ("nodeAgent.probePort=0", "minimum"),
    ];
    for (set, expected) in cases {
        let err = helm(&["template", RELEASE, path_str(&chart), "--set", set]).expect_err(set);
        assert!(err.contains(expected), "--set {set}: expected {expected:?} in:\n{err}");
    }
    let err = helm(&["template", RELEASE, path_str(&chart), "--set-string", "replicaCount=two"]).expect_err("string");
    assert!(err.contains("replicaCount"), "{err}");
    // What the schema cannot say, the templates refuse.
    let err = helm(&[
        "template",
        RELEASE,
        path_str(&chart),
        "--set",
        "webhook.url=https://127.0.0.1:9443",
        "--set",
        "webhook.certificate.mode=cert-manager",
    ])
    .expect_err("url with cert-manager");
    assert!(err.contains("needs webhook.certificate.mode=self-managed"), "{err}");
    let err = helm(&["template", RELEASE, path_str(&chart), "--set", "leaderElection.enabled=false"])
        .expect_err("2 replicas without leader election");
    assert!(err.contains("needs leaderElection.enabled"), "{err}");
}

/// muster's user name in a rendered chart: its Deployment's ServiceAccount.
fn controller_user(docs: &[Value]) -> String {
    let sa =
        one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"].as_str().expect("serviceAccountName");
    format!("system:serviceaccount:{NS}:{sa}")
}

/// The webhooks of a rendered configuration, as muster's own types.
fn rendered_webhooks(docs: &[Value]) -> (ValidatingWebhookConfiguration, MutatingWebhookConfiguration) {
    let v: ValidatingWebhookConfiguration =
        serde_json::from_value(one(docs, "ValidatingWebhookConfiguration").clone()).expect("validating");
    let m: MutatingWebhookConfiguration =
        serde_json::from_value(one(docs, "MutatingWebhookConfiguration").clone()).expect("mutating");
    (v, m)
}

#[test]
fn webhook_configurations_are_the_ones_muster_applies() {
    let service = Endpoint::Service { namespace: NS.into(), name: "muster-webhook".into(), port: 443 };
    let url = Endpoint::Url("https://127.0.0.1:9443".into());
    for (endpoint, extra) in [(service, vec![]), (url, vec!["--set", "webhook.url=https://127.0.0.1:9443/"])] {
        let docs = render(NS, &extra);
        let user = controller_user(&docs);
        let (v, m) = rendered_webhooks(&docs);
        let want_v = webhooks::validating_configuration(&endpoint, None, NS, Some(&user));
        let want_m = webhooks::mutating_configuration(&endpoint, None, NS, Some(&user), webhooks::ApiRecorder::Webhook);
        assert!(want_m.webhooks.iter().flatten().all(|w| w.match_conditions.is_some()), "muster's own pods skip");
        assert_eq!(v.metadata.name, want_v.metadata.name);
        assert_eq!(m.metadata.name, want_m.metadata.name);
        assert_eq!(v.webhooks, want_v.webhooks, "ValidatingWebhookConfiguration differs from src/webhook/config.rs");
        assert_eq!(m.webhooks, want_m.webhooks, "MutatingWebhookConfiguration differs from src/webhook/config.rs");
    }
    // cert-manager: same webhooks, CA injected by cert-manager from the chart's Certificate.
    let docs = render(NS, &["-f", &full_values()]);
    let user = controller_user(&docs);
    let (v, m) = rendered_webhooks(&docs);
    let cert = one(&docs, "Certificate");
    let inject = format!("{NS}/{}", cert["metadata"]["name"].as_str().expect("certificate name"));
    for annotations in [v.metadata.annotations, m.metadata.annotations] {
        assert_eq!(annotations.and_then(|a| a.get("cert-manager.io/inject-ca-from").cloned()), Some(inject.clone()));
    }
    let svc = webhooks::validating_configuration(
        &Endpoint::Service { namespace: NS.into(), name: "muster-full-webhook".into(), port: 8443 },
        None,
        NS,
        Some(&user),
    );
    // Same, but for the selector extensions of ci/full-values.yaml (knobs.rs checks them):
    // muster's own exclusion comes first and stays.
    let mut v_webhooks = v.webhooks.expect("webhooks");
    for w in &mut v_webhooks {
        let sel = w.namespace_selector.as_mut().expect("namespaceSelector");
        let exprs = sel.match_expressions.as_mut().expect("matchExpressions");
        assert!(exprs.len() > 1 && sel.match_labels.is_some(), "ci/full-values.yaml extends the selector: {sel:?}");
        assert_eq!(exprs[0], webhooks::namespace_selector(NS).match_expressions.expect("muster's")[0]);
        *sel = webhooks::namespace_selector(NS);
    }
    assert_eq!(Some(v_webhooks), svc.webhooks);
}

/// Where the API server serves MutatingAdmissionPolicies, the chart records the scheduling API
/// of new jobs with the policy muster would apply (and its binding), for each
/// `controller.schedulingApi`, and leaves the webhook that records it out; where it does not
/// (the other test), the webhook and no policy.
#[test]
fn the_scheduling_api_policy_is_the_one_muster_applies() {
    use k8s_openapi::api::admissionregistration::v1::{MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding};
    use muster::workloadbuilder::native::SchedulingApi;
    let endpoint = Endpoint::Service { namespace: NS.into(), name: "muster-webhook".into(), port: 443 };
    let served = ["--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"];
    let served =
        [served, ["--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicyBinding"]].concat();
    for (value, api) in
        [("muster", Some(SchedulingApi::Muster)), ("upstream", Some(SchedulingApi::Upstream)), ("auto", None)]
    {
        let set = format!("controller.schedulingApi={value}");
        let docs = render(NS, &[served.clone(), vec!["--set", &set]].concat());
        let user = controller_user(&docs);
        let (policy, binding) = webhooks::record_api_policy(api, NS, Some(&user));
        let p: MutatingAdmissionPolicy =
            serde_json::from_value(one(&docs, "MutatingAdmissionPolicy").clone()).expect("policy");
        let b: MutatingAdmissionPolicyBinding =
            serde_json::from_value(one(&docs, "MutatingAdmissionPolicyBinding").clone()).expect("binding");
        assert_eq!(p.metadata.name, policy.metadata.name);
        assert_eq!(p.spec, policy.spec, "{value}: the policy differs from src/webhook/config.rs");
        assert_eq!((b.metadata.name, b.spec), (binding.metadata.name, binding.spec), "{value}: the binding");
        let (_, m) = rendered_webhooks(&docs);
        let want = webhooks::mutating_configuration(&endpoint, None, NS, Some(&user), webhooks::ApiRecorder::Policy);
        assert_eq!(m.webhooks, want.webhooks, "{value}: no webhook records the API");
    }
    let docs = render(NS, &[]);
    assert!(of_kind(&docs, "MutatingAdmissionPolicy").is_empty(), "no policy where none is served");
}

/// `muster run`'s long flags and whether each takes a value.
fn run_flags() -> Vec<(String, bool)> {
    let cli = muster::cli::Cli::command();
    let run = cli.find_subcommand("run").expect("muster run");
    run.get_arguments()
        .filter_map(|a| a.get_long().map(|l| (l.to_string(), a.get_action().takes_values())))
        .filter(|(l, _)| l != "help")
        .collect()
}

#[test]
fn every_run_flag_is_a_value_and_every_rendering_parses() {
    // Set from the pod itself: the in-cluster ServiceAccount, and the downward API
    // (POD_NAMESPACE, POD_NAME; the test below checks the env).
    let from_the_pod = ["kubeconfig", "namespace", "identity"];
    let mut rendered = BTreeSet::new();
    for (name, docs) in renderings() {
        let deployment = one(&docs, "Deployment");
        let args = container_args(deployment);
        let mut argv = vec!["muster".to_string()];
        argv.extend(args.iter().cloned());
        if let Err(e) = muster::cli::Cli::try_parse_from(&argv) {
            panic!("{name}: muster does not accept the chart's arguments {args:?}:\n{e}");
        }
        rendered.extend(
            args.iter().filter_map(|a| a.strip_prefix("--")).map(|a| a.split('=').next().unwrap_or(a).to_string()),
        );
        let env = &deployment["spec"]["template"]["spec"]["containers"][0]["env"];
        for (var, field) in [("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace")] {
            let found = env.as_array().into_iter().flatten().find(|e| e["name"] == var);
            assert_eq!(
                found.map(|e| &e["valueFrom"]["fieldRef"]["fieldPath"]),
                Some(&Value::from(field)),
                "{name}: {var}"
            );
        }
    }
    for (flag, _) in run_flags() {
        if from_the_pod.contains(&flag.as_str()) {
            continue;
        }
        assert!(rendered.contains(&flag), "`muster run --{flag}` is not reachable from any chart value");
    }
}

#[test]
fn deployment_is_hardened_and_highly_available() {
    let docs = render(NS, &[]);
    let d = one(&docs, "Deployment");
    let spec = &d["spec"]["template"]["spec"];
    let c = &spec["containers"][0];
    assert_eq!(d["spec"]["replicas"], 2);
    let app_version = helm(&["show", "chart", path_str(&chart_dir())]).expect("show chart");
    let app_version = app_version.lines().find_map(|l| l.strip_prefix("appVersion: ")).expect("appVersion");
    assert_eq!(c["image"], format!("muster/muster:{}", app_version.trim_matches('"')));
    assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
    assert_eq!(spec["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
    let sc = &c["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(c["livenessProbe"]["httpGet"], serde_json::json!({"path": "/healthz", "port": "metrics"}));
    assert_eq!(c["readinessProbe"]["httpGet"], serde_json::json!({"path": "/readyz", "port": "metrics"}));
    assert!(c["resources"]["requests"]["cpu"].is_string() && c["resources"]["limits"]["memory"].is_string());
    let anti = &spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0];
    assert_eq!(anti["podAffinityTerm"]["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(anti["podAffinityTerm"]["labelSelector"]["matchLabels"], d["spec"]["selector"]["matchLabels"]);
    let pdb = one(&docs, "PodDisruptionBudget");
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    assert_eq!(pdb["spec"]["selector"], d["spec"]["selector"]);
    let webhook_svc = of_kind(&docs, "Service").into_iter().find(|s| s["metadata"]["name"] == "muster-webhook");
    let port = &webhook_svc.expect("webhook Service")["spec"]["ports"][0];
    assert_eq!((port["port"].clone(), port["targetPort"].clone()), (Value::from(443), Value::from("webhook")));
    // One replica: no PodDisruptionBudget that would block every node drain.
    let single = render(NS, &["--set", "replicaCount=1"]);
    assert!(of_kind(&single, "PodDisruptionBudget").is_empty());
}

/// Every rule of every (Cluster)Role in `docs`.
fn rules(docs: &[Value], kind: &str) -> Vec<Value> {
    of_kind(docs, kind).into_iter().flat_map(|r| r["rules"].as_array().cloned().unwrap_or_default()).collect()
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array().into_iter().flatten().filter_map(Value::as_str).collect()
}

#[test]
fn rbac_has_no_wildcards_and_names_what_is_musters_alone() {
    for (name, docs) in renderings() {
        // The controller manager's ClusterRole; the node agent's has a test of its own.
        let cluster_rules: Vec<Value> = of_kind(&docs, "ClusterRole")
            .into_iter()
            .filter(|r| r["metadata"]["name"].as_str().is_some_and(|n| n.ends_with("-controller")))
            .flat_map(|r| r["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        // muster's own accounts' roles; the users' ones (aggregated into edit and view, the
        // metrics reader) are checked in knobs.rs.
        let own_roles: Vec<Value> = of_kind(&docs, "ClusterRole")
            .into_iter()
            .filter(|r| {
                r["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| !n.ends_with("-edit") && !n.ends_with("-view") && !n.ends_with("-metrics-reader"))
            })
            .flat_map(|r| r["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        let role_rules = rules(&docs, "Role");
        for rule in own_roles.iter().chain(&role_rules) {
            for field in ["apiGroups", "resources", "verbs", "resourceNames"] {
                assert!(!strings(&rule[field]).contains(&"*"), "{name}: wildcard in {rule}");
            }
            for verb in ["escalate", "bind", "impersonate", "deletecollection"] {
                assert!(!strings(&rule["verbs"]).contains(&verb), "{name}: {verb} in {rule}");
            }
            assert!(rule.get("nonResourceURLs").is_none(), "{name}: {rule}");
        }
        let named = |rules: &[Value], resource: &str| -> Vec<Value> {
            rules.iter().filter(|r| strings(&r["resources"]).contains(&resource)).cloned().collect()
        };
        // No Secret access cluster-wide; in muster's namespace only its own by name, plus create.
        assert!(named(&cluster_rules, "secrets").is_empty(), "{name}: secrets in the ClusterRole");
        for rule in named(&role_rules, "secrets") {
            let names = strings(&rule["resourceNames"]);
            if names.is_empty() {
                assert_eq!(strings(&rule["verbs"]), ["create"], "{name}: {rule}");
            } else {
                assert_eq!(names, ["muster-webhook-tls"], "{name}: {rule}");
            }
        }
        for rule in named(&role_rules, "leases") {
            let names = strings(&rule["resourceNames"]);
            if names.is_empty() {
                assert_eq!(strings(&rule["verbs"]), ["create"], "{name}: {rule}");
            } else {
                assert_eq!(names, [muster::controllers::LEASE_NAME], "{name}: {rule}");
            }
        }
        for rule in named(&cluster_rules, "customresourcedefinitions") {
            assert_eq!(strings(&rule["resourceNames"]), CRD_NAMES, "{name}: {rule}");
        }
        for (resource, wanted) in [
            ("validatingwebhookconfigurations", webhooks::VALIDATING_NAME),
            ("mutatingwebhookconfigurations", webhooks::MUTATING_NAME),
        ] {
            for rule in named(&cluster_rules, resource) {
                // Every configuration is read (pins are dry-run only while one may judge a pod
                // update); only muster's own may be written.
                if strings(&rule["verbs"]) == ["list", "watch"] {
                    continue;
                }
                assert_eq!(strings(&rule["resourceNames"]), [wanted], "{name}: {rule}");
            }
        }
        for resource in ["validatingadmissionpolicies", "mutatingadmissionpolicies"] {
            for rule in named(&cluster_rules, resource) {
                assert_eq!(strings(&rule["verbs"]), ["list", "watch"], "{name}: {resource} read only: {rule}");
            }
        }
        for rule in named(&cluster_rules, "nodes") {
            assert_eq!(strings(&rule["verbs"]), ["get", "list", "watch"], "{name}: nodes are read only: {rule}");
        }
        // DRA: what drivers publish is read only; claims and their templates are muster's to
        // write, their status with update or patch only.
        for resource in ["resourceslices", "deviceclasses"] {
            let rules = named(&cluster_rules, resource);
            assert!(!rules.is_empty(), "{name}: no rule for {resource}");
            for rule in rules {
                assert_eq!(strings(&rule["verbs"]), ["get", "list", "watch"], "{name}: {resource} read only: {rule}");
            }
        }
        for resource in ["resourceclaims", "resourceclaimtemplates"] {
            let rules = named(&cluster_rules, resource);
            let verbs: Vec<&str> = rules.iter().flat_map(|r| strings(&r["verbs"])).collect();
            for verb in ["get", "list", "watch", "create", "update", "patch", "delete"] {
                assert!(verbs.contains(&verb), "{name}: {resource} lacks {verb}: {verbs:?}");
            }
        }
        let status_rules = named(&cluster_rules, "resourceclaims/status");
        let status: Vec<&str> = status_rules.iter().flat_map(|r| strings(&r["verbs"])).collect();
        assert_eq!(status, ["update", "patch"], "{name}: resourceclaims/status");
    }
    // cert-manager mounts the Secret: muster gets no Secret access at all.
    let docs = render(NS, &["-f", &full_values()]);
    assert!(!rules(&docs, "Role").iter().any(|r| strings(&r["resources"]).contains(&"secrets")));
    assert!(
        !rules(&docs, "ClusterRole").iter().any(|r| strings(&r["resources"]).contains(&"customresourcedefinitions"))
    );
}

#[test]
fn chart_crds_are_the_generated_crds() {
    let generated = muster::crds::all_yaml().expect("crds");
    let chart = std::fs::read_to_string(chart_dir().join("crds/muster.yaml")).expect("charts/muster/crds/muster.yaml");
    assert!(chart == generated, "charts/muster/crds/ is stale: run `make crds`");
    let names: Vec<String> =
        documents(&generated).iter().map(|d| d["metadata"]["name"].as_str().unwrap_or_default().to_string()).collect();
    assert_eq!(names, CRD_NAMES);
}

/// Dotted paths of the values: the schema's leaves, and objects whose default is `{}` (such as
/// `issuerRef`, whose keys only exist when set).
fn schema_leaves(schema: &Value, defaults: &Value, prefix: &str, out: &mut Vec<String>) {
    let empty_default = value_at(defaults, prefix).is_some_and(|v| v.as_object().is_some_and(|m| m.is_empty()));
    let Some(props) = schema["properties"].as_object().filter(|_| !empty_default) else {
        out.push(prefix.to_string());
        return;
    };
    for (key, sub) in props {
        if key == "global" {
            continue;
        }
        let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
        schema_leaves(sub, defaults, &path, out);
    }
}

fn value_at<'a>(values: &'a Value, path: &str) -> Option<&'a Value> {
    if path.is_empty() {
        return Some(values);
    }
    path.split('.').try_fold(values, |v, k| v.get(k))
}

/// The chart's defaults (values.yaml), every value path the schema names, and its README.
fn chart_values() -> (Value, Vec<String>, String) {
    let dir = chart_dir();
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("values.schema.json")).expect("schema")).expect("json");
    let defaults: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(dir.join("values.yaml")).expect("values")).expect("yaml");
    let mut leaves = Vec::new();
    schema_leaves(&schema, &defaults, "", &mut leaves);
    let readme = std::fs::read_to_string(dir.join("README.md")).expect("charts/muster/README.md");
    (defaults, leaves, readme)
}

#[test]
fn readme_and_full_values_cover_every_value() {
    let dir = chart_dir();
    let (defaults, leaves, readme) = chart_values();
    let full: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(dir.join("ci/full-values.yaml")).expect("full")).expect("yaml");
    for leaf in &leaves {
        assert!(readme.contains(&format!("`{leaf}`")), "charts/muster/README.md does not list `{leaf}`");
        assert!(value_at(&defaults, leaf).is_some(), "values.yaml has no default for {leaf}");
        assert!(value_at(&full, leaf).is_some(), "ci/full-values.yaml does not set {leaf}");
    }
    // And nothing in values.yaml escapes the schema (helm checks types, this checks the list).
    let mut documented = Vec::new();
    fn leaves_of(v: &Value, prefix: &str, schema_leaves: &[String], out: &mut Vec<String>) {
        if schema_leaves.iter().any(|l| l == prefix) {
            out.push(prefix.to_string());
            return;
        }
        if let Some(map) = v.as_object() {
            for (k, sub) in map {
                let path = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                leaves_of(sub, &path, schema_leaves, out);
            }
        } else {
            out.push(prefix.to_string());
        }
    }
    leaves_of(&defaults, "", &leaves, &mut documented);
    for path in documented {
        assert!(leaves.contains(&path), "values.yaml `{path}` is not in values.schema.json");
    }
}

/// How the Values table of charts/muster/README.md writes a default: YAML flow style, with
/// strings bare unless YAML would read them as something else (`""`, `"1"`, `"true"`).
fn table_default(v: &Value) -> String {
    match v {
        Value::String(s) => {
            let plain = !s.is_empty()
                && serde_saphyr::from_str::<Value>(s).ok().as_ref() == Some(v)
                && !s.contains([',', '{', '}', '[', ']']);
            if plain { s.clone() } else { format!("{s:?}") }
        }
        Value::Array(items) => format!("[{}]", items.iter().map(table_default).collect::<Vec<_>>().join(", ")),
        Value::Object(map) => {
            let entries: Vec<String> = map.iter().map(|(k, v)| format!("{k}: {}", table_default(v))).collect();
            format!("{{{}}}", entries.join(", "))
        }
        other => other.to_string(),
    }
}

/// The rows of the README's `## Values` table: (value path, default as written).
fn values_table(readme: &str) -> Vec<(String, String)> {
    let section = readme.split_once("\n## Values\n").map(|(_, rest)| rest).unwrap_or_default();
    let section = section.split("\n## ").next().unwrap_or_default();
    section
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.strip_prefix("| `")?.splitn(3, " | ").collect();
            let key = cells.first()?.strip_suffix('`')?;
            let default = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            Some((key.to_string(), default.to_string()))
        })
        .collect()
}

/// The chart README's Values table is checked against values.yaml and the schema: one row per
/// value, no row for a value that does not exist, and each row's default as values.yaml has it.
#[test]
fn readme_values_table_matches_values_yaml() {
    let (defaults, leaves, readme) = chart_values();
    let rows = values_table(&readme);
    let mut problems = Vec::new();
    for (key, written) in &rows {
        if !leaves.contains(key) {
            problems.push(format!("row `{key}` names no value of values.schema.json"));
            continue;
        }
        let Some(default) = value_at(&defaults, key) else {
            problems.push(format!("row `{key}` has no default in values.yaml"));
            continue;
        };
        let want = table_default(default);
        if *written != want {
            problems.push(format!("row `{key}` says the default is `{written}`, values.yaml has `{want}`"));
        }
    }
    for leaf in &leaves {
        match rows.iter().filter(|(k, _)| k == leaf).count() {
            0 => problems.push(format!("the Values table has no row for `{leaf}`")),
            1 => {}
            n => problems.push(format!("the Values table has {n} rows for `{leaf}`")),
        }
    }
    assert!(problems.is_empty(), "charts/muster/README.md, Values:\n  {}", problems.join("\n  "));
}

#[test]
fn values_table_reader_finds_rows_and_a_wrong_default() {
    let readme = "# x\n## Values\n\n| value | default | d |\n| --- | --- | --- |\n| `a.b` | `3` | the b |\n| `c` | `\"\"` | c |\n## Next\n| `z` | `1` | not in the section |\n";
    let rows = values_table(readme);
    assert_eq!(rows, vec![("a.b".to_string(), "3".to_string()), ("c".to_string(), "\"\"".to_string())]);
    assert_eq!(table_default(&serde_json::json!(4)), "4");
    assert_ne!(table_default(&serde_json::json!(4)), rows[0].1);
    assert_eq!(table_default(&serde_json::json!("")), "\"\"");
    assert_eq!(table_default(&serde_json::json!([])), "[]");
    assert_eq!(table_default(&serde_json::json!("1")), "\"1\"");
    assert_eq!(table_default(&serde_json::json!("30s")), "30s");
    assert_eq!(
        table_default(&serde_json::json!({"limits": {"memory": "64Mi"}, "drop": ["ALL"]})),
        "{drop: [ALL], limits: {memory: 64Mi}}"
    );
}

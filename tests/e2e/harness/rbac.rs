//! Chart RBAC mode (`MUSTER_E2E_RBAC=chart`, `make e2e-rbac`): the shared muster runs as the
//! Helm chart's ServiceAccount, to prove that the chart's RBAC is enough for everything the suite
//! makes muster do. Before each start the chart is rendered (`helm template`, release `muster` in
//! muster's namespace, `webhook.url` at the shared muster's 127.0.0.1 port) and its
//! ServiceAccount, RBAC and webhook configurations are applied as admin; muster gets a kubeconfig
//! with a TokenRequest token of that ServiceAccount (what its pod would mount) and, like the
//! chart's Deployment, only injects the caBundle and applies its CRDs; it re-injects every 2 s
//! (the chart's default is 60 s), so that this happens many times during the suite, also while a
//! test has taken the validating configuration away. The tests keep the admin kubeconfig.
//!
//! Also here: [`service_account_kubeconfig`], for tests that run muster with other rights.

use std::path::PathBuf;
use std::process::Command;

use serde_json::{Value, json};

use super::{Cluster, k8s_bin, repo};

/// Environment variable switching the mode on (`chart`; unset or empty: off).
pub const MODE_ENV: &str = "MUSTER_E2E_RBAC";
/// The release name, and so the ServiceAccount's name (the names `muster run` defaults to).
pub const RELEASE: &str = "muster";
/// Kinds applied from the rendering; the Deployment, Services and the rest are the pod's, and
/// muster runs on this machine instead.
const KINDS: [&str; 9] = [
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
];
/// Kinds applied from the rendering where the API server serves them (the chart renders them
/// only then): the policy that records a new job's scheduling API, and its binding.
const SERVED_KINDS: [&str; 2] = ["MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"];

/// What the shared muster runs with in chart mode.
#[derive(Clone, Debug)]
pub struct ChartMuster {
    /// Kubeconfig of the chart's ServiceAccount.
    pub kubeconfig: PathBuf,
    /// `muster run` arguments the chart's Deployment passes and the harness does not.
    pub args: Vec<String>,
}

/// Whether chart RBAC mode is on; panics on a value it does not know.
pub fn enabled() -> bool {
    match std::env::var(MODE_ENV).unwrap_or_default().as_str() {
        "" => false,
        "chart" => true,
        other => panic!("{MODE_ENV}={other}: the only mode is `chart`"),
    }
}

/// Applies the chart's ServiceAccount, RBAC and webhook configurations (calling `webhook_url`)
/// as release [`RELEASE`] in `namespace` as admin, and returns how muster runs as that
/// ServiceAccount. Run before every start: each start listens on a new port. An extra muster
/// ([`super::extra`]) runs alone in a namespace of its own, so the chart is installed there for
/// it; the cluster-wide objects then name its ServiceAccount until the shared muster's next start
/// takes them back.
pub fn prepare(cluster: &Cluster, namespace: &str, webhook_url: &str) -> Result<ChartMuster, String> {
    let rendered = helm_template(cluster, namespace, &[&format!("webhook.url={webhook_url}"), "replicaCount=0"])?;
    let objects: Vec<String> = rendered
        .iter()
        .filter(|d| KINDS.iter().chain(&SERVED_KINDS).any(|k| d["kind"] == *k))
        .map(Value::to_string)
        .collect();
    // Each kind at least once (the chart also renders ClusterRoles for users and scrapers).
    let missing: Vec<&str> = KINDS.iter().copied().filter(|k| !rendered.iter().any(|d| d["kind"] == *k)).collect();
    if !missing.is_empty() {
        return Err(format!("the chart rendered no {missing:?}"));
    }
    // Forced: a test that takes the validating webhook away puts it back with `kubectl create`,
    // which then owns the URL.
    cluster.kubectl_stdin(
        &["apply", "--server-side", "--force-conflicts", "--field-manager=muster-e2e-chart", "-f", "-"],
        Some(&objects.join("\n---\n")),
    )?;
    Ok(ChartMuster {
        kubeconfig: service_account_kubeconfig(cluster, namespace, RELEASE)?,
        args: ["--webhook-manage-configurations=false", "--install-crds=true", "--webhook-resync=2"]
            .map(String::from)
            .to_vec(),
    })
}

/// `helm template` of the working tree's chart as release [`RELEASE`] in `namespace`, with
/// `--set` values and, as `helm install` would see them, the admission kinds the API server
/// serves that the chart asks about; the documents parsed.
fn helm_template(cluster: &Cluster, namespace: &str, set: &[&str]) -> Result<Vec<Value>, String> {
    let served = cluster.kubectl(&["api-resources", "--api-group=admissionregistration.k8s.io", "-o", "name"])?;
    let served: Vec<&str> = served.lines().map(str::trim).collect();
    let home = cluster.dir.join("helm");
    let mut cmd = Command::new(k8s_bin()?.join("helm"));
    cmd.args(["template", RELEASE])
        .arg(repo().join("charts/muster"))
        .args(["--namespace", namespace])
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"));
    for s in set {
        cmd.args(["--set", s]);
    }
    for (resource, kind) in [
        ("mutatingadmissionpolicies", "MutatingAdmissionPolicy"),
        ("mutatingadmissionpolicybindings", "MutatingAdmissionPolicyBinding"),
    ] {
        if served.contains(&format!("{resource}.admissionregistration.k8s.io").as_str()) {
            cmd.args(["--api-versions", &format!("admissionregistration.k8s.io/v1/{kind}")]);
        }
    }
    let out = cmd.output().map_err(|e| format!("helm: {e}"))?;
    if !out.status.success() {
        return Err(format!("helm template: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).map_err(|e| format!("helm template output: {e}"))?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// A kubeconfig (in the cluster's folder) that authenticates as ServiceAccount `name` in
/// `namespace` with a TokenRequest token: the admin kubeconfig's server and CA, the token as user.
pub fn service_account_kubeconfig(cluster: &Cluster, namespace: &str, name: &str) -> Result<PathBuf, String> {
    let token = cluster.kubectl(&["create", "token", name, "-n", namespace, "--duration=4h"])?;
    let admin =
        std::fs::read_to_string(&cluster.kubeconfig).map_err(|e| format!("{}: {e}", cluster.kubeconfig.display()))?;
    let mut config: Value =
        serde_saphyr::from_str(&admin).map_err(|e| format!("{}: {e}", cluster.kubeconfig.display()))?;
    let user = format!("system:serviceaccount:{namespace}:{name}");
    config["users"] = json!([{"name": user, "user": {"token": token.trim()}}]);
    for context in config["contexts"].as_array_mut().into_iter().flatten() {
        context["context"]["user"] = json!(user);
    }
    let path = cluster.dir.join(format!("{namespace}-{name}.kubeconfig"));
    std::fs::write(&path, config.to_string()).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// The ServiceAccount a [`tenant_client`] acts as.
pub const TENANT: &str = "tenant";

/// A kube client acting as a tenant of `namespace`: ServiceAccount [`TENANT`] there, with the
/// built-in `edit` ClusterRole bound by a RoleBinding in `namespace` only, authenticating with a
/// TokenRequest token (what a tenant's pod or CI would use). Waits until the apiserver
/// authorizes it.
///
/// The e2e control plane runs no clusterrole-aggregation controller, so `edit` has no rules of
/// its own there; the roles that controller would aggregate into it (those labelled
/// `aggregate-to-edit` or `aggregate-to-view`, the chart's `muster-edit` and `muster-view`
/// among them when the chart is applied) are bound in `namespace` as well. Where none grants
/// muster's kinds (the chart is not applied), a Role there grants what `muster-edit` would.
#[allow(dead_code)] // tests/chart and tests/service include the harness too
pub async fn tenant_client(namespace: &str) -> kube::Client {
    let cluster = super::cluster();
    let sa = format!("system:serviceaccount:{namespace}:{TENANT}");
    let subjects = json!([{"kind": "ServiceAccount", "name": TENANT, "namespace": namespace}]);
    let binding = |name: &str, kind: &str, role: &str| {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
            "subjects": subjects})
    };
    let mut items = vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": TENANT, "namespace": namespace}}),
        binding("tenant-edit", "ClusterRole", "edit"),
    ];
    let mut aggregated = Vec::new();
    for label in
        ["rbac.authorization.k8s.io/aggregate-to-edit=true", "rbac.authorization.k8s.io/aggregate-to-view=true"]
    {
        let list =
            cluster.kubectl(&["get", "clusterroles", "-l", label, "-o", "json"]).unwrap_or_else(|e| panic!("{e}"));
        let list: Value = serde_json::from_str(&list).unwrap_or_else(|e| panic!("clusterroles: {e}"));
        for role in list["items"].as_array().into_iter().flatten() {
            // `view` is itself aggregated (into `edit`): the roles aggregated into it are listed.
            if role.get("aggregationRule").is_none() {
                aggregated.push(role["metadata"]["name"].as_str().unwrap_or_default().to_string());
            }
        }
    }
    let grants_muster = |role: &str| role.starts_with(RELEASE) && role.ends_with("-edit");
    let muster_roles = aggregated.iter().any(|r| grants_muster(r));
    for (i, role) in aggregated.iter().enumerate() {
        items.push(binding(&format!("tenant-aggregated-{i}"), "ClusterRole", role));
    }
    if !muster_roles {
        items.push(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "tenant-muster", "namespace": namespace},
            "rules": [{"apiGroups": ["batch.muster.dev"], "resources": ["musterjobs", "musterjobsets"],
                "verbs": ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]}]}));
        items.push(binding("tenant-muster", "Role", "tenant-muster"));
    }
    let objects = json!({"apiVersion": "v1", "kind": "List", "items": items});
    cluster
        .kubectl_stdin(&["apply", "--server-side", "--field-manager=muster-e2e", "-f", "-"], Some(&objects.to_string()))
        .unwrap_or_else(|e| panic!("tenant of {namespace}: {e}"));
    eprintln!(
        "tenant {sa}: edit, with {aggregated:?} aggregated by hand, muster's kinds from the chart: {muster_roles}"
    );
    let can = |verb: &str, resource: &str, ns: &str| {
        cluster.kubectl(&["auth", "can-i", verb, resource, "-n", ns, "--as", &sa]).is_ok_and(|o| o.trim() == "yes")
    };
    super::wait_for("the tenant's RoleBindings in effect", std::time::Duration::from_secs(30), || async {
        let needed = ["pods", "musterjobs.batch.muster.dev", "musterjobsets.batch.muster.dev"];
        needed.iter().all(|r| can("create", r, namespace) && can("patch", r, namespace)).then_some(())
    })
    .await;
    // A tenant, not an admin: nothing outside its namespace, no writes to muster's status.
    assert!(!can("create", "pods", "default"), "{sa} may create pods in default");
    let status = cluster.kubectl(&[
        "auth",
        "can-i",
        "patch",
        "musterjobs.batch.muster.dev",
        "--subresource=status",
        "-n",
        namespace,
        "--as",
        &sa,
    ]);
    assert!(!status.is_ok_and(|o| o.trim() == "yes"), "{sa} may write muster's job status");
    let kubeconfig = service_account_kubeconfig(cluster, namespace, TENANT).unwrap_or_else(|e| panic!("{e}"));
    muster_dev::client(Some(&kubeconfig))
        .await
        .unwrap_or_else(|e| panic!("tenant client from {}: {e}", kubeconfig.display()))
}

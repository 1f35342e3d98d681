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
const KINDS: [&str; 7] = [
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
];

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
    let objects: Vec<String> =
        rendered.iter().filter(|d| KINDS.iter().any(|k| d["kind"] == *k)).map(Value::to_string).collect();
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
/// `--set` values; the documents parsed.
fn helm_template(cluster: &Cluster, namespace: &str, set: &[&str]) -> Result<Vec<Value>, String> {
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

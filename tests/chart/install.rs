//! The rendered chart against a real apiserver: server-side dry-run of every object, then a real
//! `helm install` that creates every object and an uninstall that removes them (but keeps the
//! CRDs, and so every MusterJob, as Helm does for `crds/`).

use std::time::Duration;

use serde_json::Value;

use crate::harness::{cluster, kubectl};
use crate::support::{
    CRD_NAMES, RELEASE, Release, chart_dir, eventually, exclusive, helm, helm_cluster, kubectl_stdin, path_str,
};

/// `kind.version.group` (or `kind` for the core group), which kubectl resolves without guessing.
fn resource_of(doc: &Value) -> String {
    let kind = doc["kind"].as_str().unwrap_or_default();
    match doc["apiVersion"].as_str().unwrap_or_default().split_once('/') {
        Some((group, version)) => format!("{kind}.{version}.{group}"),
        None => kind.to_string(),
    }
}

fn get(doc: &Value, namespace: &str) -> Result<String, String> {
    let resource = resource_of(doc);
    let name = doc["metadata"]["name"].as_str().unwrap_or_default();
    let mut args = vec!["get", resource.as_str(), name, "-o", "json"];
    if doc["metadata"]["namespace"].is_string() {
        args.extend(["-n", namespace]);
    }
    cluster().kubectl(&args)
}

#[test]
fn rendered_manifests_pass_a_server_side_dry_run() {
    // With no release installed, every object is checked as a create.
    let _lock = exclusive();
    let stubs = crate::support::repo().join("tests/chart/fixtures/stub-crds.yaml");
    kubectl(&["apply", "--server-side", "-f", path_str(&stubs)]);
    kubectl(&["wait", "--for=condition=Established", "--timeout=60s", "-f", path_str(&stubs)]);
    let ns = "muster-dry-run";
    let _ = cluster().kubectl(&["create", "namespace", ns]);
    // ci/full-values.yaml puts the dashboard ConfigMap there.
    let _ = cluster().kubectl(&["create", "namespace", "monitoring"]);
    let chart = chart_dir();
    let full = chart.join("ci/full-values.yaml");
    for extra in [
        vec![],
        vec!["-f", path_str(&full)],
        vec!["--set", "webhook.url=https://127.0.0.1:9443"],
        vec!["--set", "nodeAgent.enabled=true"],
        vec![
            "--set",
            "metrics.secure.enabled=true",
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set",
            "dashboards.enabled=true",
            "--set",
            "prometheusRule.enabled=true",
            "--set",
            "hostNetwork=true",
            "--set",
            "networkPolicy.enabled=true",
        ],
    ] {
        let mut args = vec!["template", RELEASE, path_str(&chart), "--namespace", ns];
        args.extend_from_slice(&extra);
        let rendered = helm(&args).unwrap_or_else(|e| panic!("{e}"));
        // Each object in its own namespace (the dashboard ConfigMap may be elsewhere).
        let out = kubectl_stdin(&["apply", "--dry-run=server", "-f", "-"], &rendered)
            .unwrap_or_else(|e| panic!("values {extra:?}: the apiserver refused the rendered chart:\n{e}"));
        let objects = crate::support::documents(&rendered).len();
        assert_eq!(out.lines().filter(|l| l.contains("(server dry run)")).count(), objects, "{extra:?}:\n{out}");
    }
}

#[test]
fn install_creates_every_object_and_uninstall_removes_them() {
    let _lock = exclusive();
    let ns = "muster-install";
    let release = Release::install(&chart_dir(), ns, &[]);
    let manifest = release.manifest();
    let kinds: Vec<&str> = manifest.iter().filter_map(|d| d["kind"].as_str()).collect();
    for kind in [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Service",
        "Deployment",
        "PodDisruptionBudget",
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
    ] {
        assert!(kinds.contains(&kind), "the default install has no {kind}: {kinds:?}");
    }
    for doc in &manifest {
        let live: Value = serde_json::from_str(&get(doc, ns).unwrap_or_else(|e| panic!("{e}"))).expect("json");
        assert_eq!(live["metadata"]["annotations"]["meta.helm.sh/release-name"], RELEASE, "{}", resource_of(doc));
        assert_eq!(live["metadata"]["labels"]["app.kubernetes.io/managed-by"], "Helm");
    }
    for crd in CRD_NAMES {
        kubectl(&["wait", "--for=condition=Established", "--timeout=30s", &format!("crd/{crd}")]);
    }
    let status = helm_cluster(&["status", RELEASE, "-n", ns]).unwrap_or_else(|e| panic!("{e}"));
    assert!(status.contains("STATUS: deployed"), "{status}");
    assert!(
        status.contains("kubectl get podgroups -A") && status.contains("kubectl get mpg -A"),
        "NOTES.txt:\n{status}"
    );
    // The pod template is a valid pod: kube-controller-manager makes the two replicas, on
    // different nodes (kwok simulates them: Running, but no process runs).
    let pods = eventually(
        "the Deployment's 2 pods Running",
        Duration::from_secs(60),
        || {
            let out = cluster()
                .kubectl(&[
                    "get",
                    "pods",
                    "-n",
                    ns,
                    "-l",
                    "app.kubernetes.io/instance=muster",
                    "-o",
                    "jsonpath={range .items[*]}{.spec.nodeName} {.status.phase}{\"\\n\"}{end}",
                ])
                .ok()?;
            let running: Vec<String> = out.lines().filter(|l| l.ends_with(" Running")).map(|l| l.to_string()).collect();
            (running.len() == 2).then_some(running)
        },
        || kubectl(&["get", "pods,replicasets", "-n", ns, "-o", "wide"]),
    );
    assert_ne!(pods[0], pods[1], "both replicas on one node despite the anti-affinity");

    drop(release);
    for doc in &manifest {
        eventually(
            &format!("{} {} gone after uninstall", resource_of(doc), doc["metadata"]["name"]),
            Duration::from_secs(30),
            || get(doc, ns).err().filter(|e| e.contains("NotFound")),
            String::new,
        );
    }
    for crd in CRD_NAMES {
        kubectl(&["get", "crd", crd]);
    }
}

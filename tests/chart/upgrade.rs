//! Upgrades. Helm installs `crds/` once and never upgrades them, so a new CRD reaches the
//! cluster by muster applying its own at start (`crds.install`, the default) or by the
//! documented `muster crds | kubectl apply --server-side --force-conflicts -f -`. Each test
//! installs a previous chart version (0.0.1, whose PodGroup CRD lacks `status.message` and the
//! Message column), creates MusterJobs with it, upgrades to the working-tree chart and checks
//! that the objects are untouched, the new CRD is served and muster works on the old objects.
//! The previous muster is played by this binary with `--install-crds=false` (the previous
//! chart's setting).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

use crate::harness::{cluster, kubectl, kubectl_apply, namespace};

/// Any endpoint: only how many webhooks muster registers is read from its configurations.
fn endpoint() -> muster::webhook::config::Endpoint {
    muster::webhook::config::Endpoint::Url("https://127.0.0.1:9443".into())
}
use crate::support::{
    CRD_NAMES, Muster, Release, chart_dir, eventually, exclusive, free_port, helm_cluster, kubectl_stdin, one,
};

const TIMEOUT: Duration = Duration::from_secs(60);
const PREVIOUS_VERSION: &str = "0.0.1";

fn job(name: &str) -> String {
    format!(
        r#"
apiVersion: batch.muster.dev/v1alpha1
kind: MusterJob
metadata:
  name: {name}
spec:
  parallelism: 2
  completions: 2
  scheduling:
    schedulingPolicy:
      gang:
        minCount: 2
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: main
          image: example/none
"#
    )
}

/// muster's CRDs as the previous release had them: the PodGroup without `status.message` and
/// its Message column.
fn previous_crds() -> Vec<CustomResourceDefinition> {
    let mut crds = muster::crds::all();
    for crd in crds.iter_mut().filter(|c| c.spec.names.plural == "podgroups") {
        for version in &mut crd.spec.versions {
            if let Some(columns) = version.additional_printer_columns.as_mut() {
                columns.retain(|c| c.name != "Message");
            }
            let status = version
                .schema
                .as_mut()
                .and_then(|s| s.open_api_v3_schema.as_mut())
                .and_then(|s| s.properties.as_mut())
                .and_then(|p| p.get_mut("status"))
                .and_then(|s| s.properties.as_mut());
            status.expect("the PodGroup CRD has status properties").remove("message").expect("status.message");
        }
    }
    crds
}

fn yaml_stream(crds: &[CustomResourceDefinition]) -> String {
    crds.iter().map(|c| format!("---\n{}", serde_saphyr::to_string(c).expect("yaml"))).collect()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap_or_else(|e| panic!("{}: {e}", to.display()));
    for entry in std::fs::read_dir(from).unwrap_or_else(|e| panic!("{}: {e}", from.display())).flatten() {
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap_or_else(|e| panic!("{}: {e}", target.display()));
        }
    }
}

/// The previous chart: this chart at version 0.0.1 with the previous CRDs.
fn previous_chart(name: &str) -> PathBuf {
    let dir = cluster().dir.join(format!("previous-chart-{name}/muster"));
    let _ = std::fs::remove_dir_all(&dir);
    copy_dir(&chart_dir(), &dir);
    let chart_yaml = std::fs::read_to_string(dir.join("Chart.yaml")).expect("Chart.yaml");
    let chart_yaml: String = chart_yaml
        .lines()
        .map(|l| match l.split_once(':').map(|(k, _)| k) {
            Some("version") => format!("version: {PREVIOUS_VERSION}"),
            Some("appVersion") => format!("appVersion: \"{PREVIOUS_VERSION}\""),
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(dir.join("Chart.yaml"), chart_yaml).expect("Chart.yaml");
    std::fs::write(dir.join("crds/muster.yaml"), yaml_stream(&previous_crds())).expect("crds");
    dir
}

/// Deletes muster's CRDs (and so every muster object in this cluster), as on a cluster that
/// never had muster.
fn remove_crds() {
    let present: Vec<&str> = CRD_NAMES.into_iter().filter(|n| cluster().kubectl(&["get", "crd", n]).is_ok()).collect();
    // A CRD deleted while its storage is still (re)initializing (just created or changed) can
    // stay Terminating until the CRD changes again: wait until its objects can be listed.
    for name in &present {
        eventually(&format!("{name} listable"), TIMEOUT, || cluster().kubectl(&["get", name, "-A"]).ok(), String::new);
    }
    if present.is_empty() {
        return;
    }
    let mut args = vec!["delete", "crd", "--ignore-not-found", "--wait=false"];
    args.extend(&present);
    kubectl(&args);
    let mut nudges = 0;
    eventually(
        "muster's CRDs deleted",
        Duration::from_secs(120),
        || {
            let left: Vec<&str> =
                present.iter().copied().filter(|n| cluster().kubectl(&["get", "crd", n]).is_ok()).collect();
            if left.is_empty() {
                return Some(());
            }
            // Any change makes the apiserver's CRD finalizer look at a Terminating CRD again.
            nudges += 1;
            if nudges % 20 == 0 {
                for name in left {
                    let _ = cluster().kubectl(&[
                        "annotate",
                        "crd",
                        name,
                        "--overwrite",
                        &format!("muster.dev/e2e-nudge={nudges}"),
                    ]);
                }
            }
            None
        },
        String::new,
    );
}

fn crd(name: &str) -> Value {
    serde_json::from_str(&kubectl(&["get", "crd", name, "-o", "json"])).expect("json")
}

fn printer_columns(crd: &Value) -> Vec<String> {
    crd["spec"]["versions"][0]["additionalPrinterColumns"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str().map(str::to_string))
        .collect()
}

fn serves_message(crd: &Value) -> bool {
    let status = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"];
    status.get("message").is_some() && printer_columns(crd).iter().any(|c| c == "Message")
}

/// uid of each object, by `kind/name`.
fn uids(ns: &str) -> Vec<(String, String)> {
    let out = kubectl(&[
        "get",
        "musterjobs,workloads.scheduling.muster.dev,podgroups.scheduling.muster.dev,pods",
        "-n",
        ns,
        "-o",
        "jsonpath={range .items[*]}{.kind}/{.metadata.name}={.metadata.uid}{\"\\n\"}{end}",
    ]);
    let mut uids: Vec<(String, String)> =
        out.lines().filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_string(), v.to_string()))).collect();
    uids.sort();
    uids
}

/// How the new CRDs reach the cluster.
#[derive(Clone, Copy, Debug, PartialEq)]
enum CrdUpgrade {
    /// muster applies them at start (`crds.install: true`, `--install-crds`).
    Muster,
    /// `muster crds | kubectl apply --server-side --force-conflicts -f -` (README).
    Kubectl,
}

fn upgrade_keeps_objects_and_serves_new_crds(how: CrdUpgrade, release_ns: &str) {
    let _lock = exclusive();
    remove_crds();
    let port = free_port();
    let url = format!("webhook.url=https://127.0.0.1:{port}");
    // The previous release did not manage CRDs: Helm installed them from its crds/.
    let previous = previous_chart(release_ns);
    let release = Release::install(&previous, release_ns, &["--set", &url, "--set", "crds.install=false"]);
    assert!(!serves_message(&crd("podgroups.scheduling.muster.dev")), "the previous CRD is served");
    let kubeconfig = release.service_account_kubeconfig();

    let ns = namespace("chart-upgrade");
    let before = {
        let old = Muster::start(one(&release.manifest(), "Deployment"), &kubeconfig, release_ns, port, &[]);
        kubectl_apply(&ns.name, &job("before"));
        eventually(
            "the PodGroup and 2 pods of `before`",
            TIMEOUT,
            || {
                let uids = uids(&ns.name);
                let pods = uids.iter().filter(|(k, _)| k.starts_with("Pod/")).count();
                (pods == 2 && uids.iter().any(|(k, _)| k == "PodGroup/before")).then_some(uids)
            },
            || old.log_text(),
        )
    };

    let mut upgrade_args = vec!["--set", url.as_str()];
    if how == CrdUpgrade::Kubectl {
        upgrade_args.extend(["--set", "crds.install=false"]);
    }
    let ca_bundles = || {
        kubectl(&[
            "get",
            "validatingwebhookconfiguration/muster-validating",
            "mutatingwebhookconfiguration/muster-mutating",
            "-o",
            "jsonpath={.items[*].webhooks[*].clientConfig.caBundle}",
        ])
    };
    let injected = ca_bundles();
    // The chart records the scheduling API with a MutatingAdmissionPolicy where the API server
    // serves one, and leaves that webhook out.
    let recorder = cluster().api_recorder();
    let webhooks = muster::webhook::config::validating_configuration(&endpoint(), None, "muster-system", None)
        .webhooks
        .unwrap_or_default()
        .len()
        + muster::webhook::config::mutating_configuration(&endpoint(), None, "muster-system", None, recorder)
            .webhooks
            .unwrap_or_default()
            .len();
    assert_eq!(injected.split_whitespace().count(), webhooks, "the previous muster injected no CA bundle");
    release.upgrade(&chart_dir(), &upgrade_args);
    // The upgrade kept the CA bundles muster injected (webhooks keep working before the new
    // muster starts) and left the CRDs alone.
    assert_eq!(ca_bundles(), injected, "helm upgrade reset the webhooks' CA bundles");
    assert!(!serves_message(&crd("podgroups.scheduling.muster.dev")), "helm upgrade changed a CRD in crds/");
    if how == CrdUpgrade::Kubectl {
        let crds = Command::new(env!("CARGO_BIN_EXE_muster"))
            .arg("crds")
            .stderr(Stdio::inherit())
            .output()
            .expect("muster crds");
        assert!(crds.status.success());
        kubectl_stdin(
            &["apply", "--server-side", "--force-conflicts", "-f", "-"],
            &String::from_utf8_lossy(&crds.stdout),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    }
    let manifest = release.manifest();
    let deployment = one(&manifest, "Deployment");
    let new = Muster::start(deployment, &kubeconfig, release_ns, port, &[]);

    let served = crd("podgroups.scheduling.muster.dev");
    assert!(
        serves_message(&served),
        "the new PodGroup CRD is not served after the upgrade: {:?}",
        printer_columns(&served)
    );
    for generated in muster::crds::all() {
        let name = generated.metadata.name.clone().unwrap_or_default();
        let want: Vec<String> =
            generated.spec.versions[0].additional_printer_columns.iter().flatten().map(|c| c.name.clone()).collect();
        assert_eq!(printer_columns(&crd(&name)), want, "{name}");
    }
    if how == CrdUpgrade::Muster {
        let managers = kubectl(&[
            "get",
            "crd",
            "podgroups.scheduling.muster.dev",
            "--show-managed-fields",
            "-o",
            "jsonpath={.metadata.managedFields[*].manager}",
        ]);
        assert!(managers.contains(muster::controllers::install::FIELD_MANAGER), "{managers}");
    }
    assert_eq!(uids(&ns.name), before, "objects changed across the upgrade");
    let wide = kubectl(&["get", "podgroups.scheduling.muster.dev", "-n", &ns.name, "-o", "wide"]);
    assert!(wide.lines().next().is_some_and(|h| h.contains("MESSAGE")), "{wide}");

    // The upgraded muster works on the objects made before: `before` is admitted now (the
    // stand-in for the previous muster is this binary, whose PodGroup status has fields the
    // previous CRD does not declare, so its status writes were refused until the upgrade).
    eventually(
        "`before` admitted after the upgrade",
        TIMEOUT,
        || {
            let group: Value = serde_json::from_str(&kubectl(&[
                "get",
                "podgroups.scheduling.muster.dev",
                "before",
                "-n",
                &ns.name,
                "-o",
                "json",
            ]))
            .ok()?;
            (group["status"]["admitted"] == 2).then_some(())
        },
        || new.log_text(),
    );
    // And on new ones.
    kubectl_apply(&ns.name, &job("after"));
    eventually(
        "the PodGroup of `after`",
        TIMEOUT,
        || kubectl(&["get", "podgroups.scheduling.muster.dev", "-n", &ns.name]).contains("after").then_some(()),
        || new.log_text(),
    );
    let history = helm_cluster(&["history", "muster", "-n", release_ns]).unwrap_or_else(|e| panic!("{e}"));
    assert!(history.contains(&format!("muster-{PREVIOUS_VERSION}")), "{history}");
    assert!(history.lines().last().is_some_and(|l| l.contains("deployed")), "{history}");
    let forbidden = new.forbidden_lines();
    assert!(forbidden.is_empty(), "muster was refused after the upgrade:\n{}", forbidden.join("\n"));
}

#[test]
fn upgrade_with_muster_applying_its_crds_keeps_objects() {
    upgrade_keeps_objects_and_serves_new_crds(CrdUpgrade::Muster, "muster-upgrade");
}

#[test]
fn upgrade_with_the_documented_kubectl_apply_keeps_objects() {
    upgrade_keeps_objects_and_serves_new_crds(CrdUpgrade::Kubectl, "muster-upgrade-kubectl");
}

/// With `--skip-crds`, muster creates its CRDs itself: a create through server-side apply is
/// authorized with the object's name, so the chart's `create` limited by resourceNames suffices.
#[test]
fn muster_creates_missing_crds_within_the_named_rule() {
    let _lock = exclusive();
    remove_crds();
    let port = free_port();
    let release = Release::install(
        &chart_dir(),
        "muster-skip-crds",
        &["--skip-crds", "--set", &format!("webhook.url=https://127.0.0.1:{port}")],
    );
    for name in CRD_NAMES {
        assert!(cluster().kubectl(&["get", "crd", name]).is_err(), "{name} exists before muster ran");
    }
    let kubeconfig = release.service_account_kubeconfig();
    let muster = Muster::start(one(&release.manifest(), "Deployment"), &kubeconfig, &release.namespace, port, &[]);
    for name in CRD_NAMES {
        kubectl(&["wait", "--for=condition=Established", "--timeout=30s", &format!("crd/{name}")]);
    }
    let forbidden = muster.forbidden_lines();
    assert!(forbidden.is_empty(), "{}", forbidden.join("\n"));
}

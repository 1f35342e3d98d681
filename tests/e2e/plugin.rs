//! `kubectl muster` (the `kubectl-muster` binary) against the demo examples: every gang listed
//! with its job, phase, pods and reason, the too-big one Unschedulable with the per-node reason,
//! `why too-big` naming it, `suspend` / `resume` changing the job, the PodGroup's REASON column;
//! and in upstream mode the native groups with kube-scheduler's verdict. The examples run on
//! the test's own nodes (their pods get the test's node selector and toleration), never on the
//! shared pool.

use std::path::{Path, PathBuf};
use std::process::Command;

use kube::api::Api;
use muster::crds::{MusterJob, SCHEDULING_API_ANNOTATION};
use serde_json::{Value, json};

use crate::gangs::{LONG, TestNodes, apply, merge};
use crate::harness::manager::muster;
use crate::harness::{client, cluster, kubectl, namespace, wait_for};

/// The plugin's binary. It is a crate of its own (`crates/kubectl-muster`), built into the
/// folder of the `muster` binary under test: `make e2e` builds it before the tests
/// (`cargo build --bins`).
fn plugin_bin() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_muster")).with_file_name("kubectl-muster");
    assert!(bin.exists(), "{} is not built: run `cargo build --bins` first (make e2e does)", bin.display());
    bin
}

/// Runs the plugin in `ns` with the cluster's kubeconfig; (exit ok, stdout, stderr).
fn plugin(ns: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(plugin_bin())
        .args(args)
        .args(["-n", ns, "--kubeconfig"])
        .arg(&cluster().kubeconfig)
        .env_remove("KUBECONFIG")
        .output()
        .unwrap_or_else(|e| panic!("kubectl-muster {args:?}: {e}"));
    let text = |b: &[u8]| String::from_utf8_lossy(b).to_string();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// The plugin's stdout; panics with its stderr when it fails.
fn plugin_ok(ns: &str, args: &[&str]) -> String {
    let (ok, out, err) = plugin(ns, args);
    assert!(ok, "kubectl-muster {args:?} failed: {err}");
    out
}

/// The cells of the `list` row of gang `name` (no NAMESPACE column: one namespace), split on
/// runs of 3+ spaces (a REASON holds single spaces).
fn row(table: &str, name: &str) -> Option<Vec<String>> {
    let line = table.lines().find(|l| l.split_whitespace().next() == Some(name))?;
    Some(line.split("   ").map(str::trim).filter(|c| !c.is_empty()).map(str::to_string).collect())
}

/// The example manifests of `files` (examples/, or examples/upstream/), every pod template given
/// `placement` (the test's nodes), each object changed by `change`.
fn examples(files: &[&str], placement: &Value, change: impl Fn(&mut Value)) -> Vec<Value> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
        for mut object in docs.into_iter().filter(|d| !d.is_null()) {
            let templates: Vec<&mut Value> = match object["kind"].as_str() {
                Some("MusterJob" | "StatefulSet") => vec![&mut object["spec"]["template"]["spec"]],
                Some("MusterJobSet") => object["spec"]["replicatedJobs"]
                    .as_array_mut()
                    .into_iter()
                    .flatten()
                    .map(|r| &mut r["template"]["spec"]["template"]["spec"])
                    .collect(),
                _ => Vec::new(),
            };
            for spec in templates {
                merge(spec, placement.clone());
            }
            change(&mut object);
            out.push(object);
        }
    }
    out
}

#[tokio::test]
async fn lists_explains_suspends_and_resumes_the_demo_gangs() {
    let _muster = muster().await;
    let ns = namespace("plugin");
    // 40 GPUs for the 22 the fitting examples take; too-big wants 136.
    let nodes = TestNodes::add(&ns.name, 5, 8, 1).await;
    let files = [
        "basic-job.yaml",
        "byo-statefulset.yaml",
        "gang-training-job.yaml",
        "inference-basic.yaml",
        "jobset-driver-workers.yaml",
        "too-large-gang.yaml",
    ];
    for object in examples(&files, &nodes.placement(), |_| {}) {
        apply(&ns.name, &object);
    }

    // Every gang on one screen: the fitting ones started, too-big out for want of GPUs.
    let started = ["Admitted", "Running", "Finished"];
    let table = wait_for("every demo gang listed as it should be", LONG, || async {
        let table = plugin_ok(&ns.name, &["list"]);
        let ok = [
            ("hello", "MusterJob/hello"),
            ("inference", "MusterJob/inference"),
            ("kv-cache", "-"),
            ("ray-train", "MusterJobSet/ray-train"),
            ("train-2x4", "MusterJob/train-2x4"),
        ]
        .iter()
        .all(|(name, job)| row(&table, name).is_some_and(|r| r[1] == *job && started.contains(&r[2].as_str())))
            && row(&table, "too-big").is_some_and(|r| {
                r.len() == 6
                    && [&r[1], &r[2], &r[3], &r[5]]
                        == ["MusterJob/too-big", "Unschedulable", "0/17", "Insufficient nvidia.com/gpu"]
            });
        ok.then_some(table)
    })
    .await;
    let header: Vec<&str> = table.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["NAME", "KIND/JOB", "PHASE", "PODS", "WAITING", "REASON"], "{table}");
    let train = row(&table, "train-2x4").unwrap_or_default();
    assert_eq!(train[3], "2/2", "{table}");
    let waited = row(&table, "too-big").unwrap_or_default()[4].clone();
    assert!(waited.ends_with('s') && waited != "-", "too-big waits, for {waited}: {table}");
    // `kubectl muster` is kubectl's: the plugin found on PATH.
    let bin = plugin_bin();
    let bin_dir = bin.parent().expect("the binary's folder");
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let via_kubectl = Command::new(cluster().bin.join("kubectl"))
        // kubectl hands a plugin the arguments after its name (flags before it are kubectl's).
        .args(["muster", "list", "-n", &ns.name, "--kubeconfig", cluster().kubeconfig.to_str().expect("utf-8")])
        .env("PATH", path)
        .output()
        .expect("kubectl muster");
    let via_kubectl_out = String::from_utf8_lossy(&via_kubectl.stdout);
    assert!(
        via_kubectl.status.success() && via_kubectl_out.contains("Insufficient nvidia.com/gpu"),
        "kubectl muster list: {via_kubectl_out} {}",
        String::from_utf8_lossy(&via_kubectl.stderr)
    );

    // Why too-big waits: its verdict and the per-node reasons, and the Warning event.
    let why = wait_for("the Unschedulable event in `why too-big`", LONG, || async {
        let why = plugin_ok(&ns.name, &["why", "too-big"]);
        why.contains("Warning events").then_some(why)
    })
    .await;
    for want in [
        "podgroup.scheduling.muster.dev too-big, of MusterJob too-big",
        "Phase:     Unschedulable for ",
        "(Admitted=False Unschedulable)",
        "0 bound of 17 needed; 17 exist, 17 gated",
        "nodes fit 17 pods of group \"too-big\"",
        ", per node:\n",
        "  Insufficient nvidia.com/gpu\n",
        "Unschedulable",
    ] {
        assert!(why.contains(want), "`why too-big` lacks {want:?}:\n{why}");
    }
    // A set by its name, or by a child job's: the composite and both its groups.
    let why_set = plugin_ok(&ns.name, &["why", "ray-train-workers-0"]);
    for want in ["compositepodgroup.scheduling.muster.dev ray-train, of MusterJobSet ray-train", "ray-train-driver-0"] {
        assert!(why_set.contains(want), "`why ray-train-workers-0` lacks {want:?}:\n{why_set}");
    }
    let (ok, _, err) = plugin(&ns.name, &["why", "no-such-job"]);
    assert!(
        !ok && err.contains("no MusterJob, MusterJobSet, PodGroup or CompositePodGroup named no-such-job"),
        "{err}"
    );

    // `kubectl get mpg` says why without -o wide.
    let mpg = kubectl(&["-n", &ns.name, "get", "mpg"]);
    let mpg_header: Vec<&str> = mpg.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(mpg_header, ["NAME", "MIN", "PODS", "ADMITTED", "RUNNING", "PHASE", "REASON", "AGE"], "{mpg}");
    let mpg_row = |name: &str| -> Vec<String> {
        let line = mpg.lines().find(|l| l.split_whitespace().next() == Some(name)).unwrap_or_default();
        line.split_whitespace().map(str::to_string).collect()
    };
    assert_eq!(mpg_row("too-big")[5..8], ["Unschedulable", "Insufficient", "nvidia.com/gpu"], "{mpg}");
    assert_eq!(mpg_row("too-big").len(), 9, "{mpg}");
    // Admitted or running: no reason (the column is empty).
    assert_eq!(mpg_row("train-2x4").len(), 7, "{mpg}");
    assert!(["Admitted", "Running"].contains(&mpg_row("train-2x4")[5].as_str()), "{mpg}");

    // suspend / resume: the job's spec.suspend, then its gang, follow.
    let jobs: Api<MusterJob> = Api::namespaced(client().await, &ns.name);
    let (ok, _, err) = plugin(&ns.name, &["suspend", "ray-train-workers-0"]);
    assert!(!ok && err.contains("belongs to MusterJobSet ray-train"), "a set's child is its set's to suspend: {err}");
    assert_eq!(plugin_ok(&ns.name, &["suspend", "train-2x4"]), "musterjob.batch.muster.dev/train-2x4 suspended\n");
    assert!(jobs.get("train-2x4").await.expect("train-2x4").spec.suspend);
    wait_for("train-2x4 listed Suspended", LONG, || async {
        let table = plugin_ok(&ns.name, &["list"]);
        row(&table, "train-2x4").filter(|r| r[2] == "Suspended" && r[5] == "JobSuspended")
    })
    .await;
    // Suspending ends the gang: every pod goes, and that is no disruption (no GangDisrupted,
    // the group not Failed), however the deletions and admission's cycles interleave.
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client().await, &ns.name);
    wait_for("train-2x4's pods gone", LONG, || async {
        crate::gangs::job_pods(&pods, "train-2x4").await.is_empty().then_some(())
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let events = crate::gangs::events_of(&ns.name, "train-2x4").await;
    assert!(!events.iter().any(|(_, r, _)| r == "GangDisrupted"), "{events:?}");
    let groups: Api<muster::crds::PodGroup> = Api::namespaced(client().await, &ns.name);
    let group = groups.get("train-2x4").await.expect("train-2x4's PodGroup");
    let status = group.status.unwrap_or_default();
    assert_ne!(status.phase, Some(muster::crds::scheduling::GroupPhase::Failed), "{:?}", status.message);
    let why_suspended = plugin_ok(&ns.name, &["why", "mjob/train-2x4"]);
    assert!(why_suspended.contains("kubectl muster resume train-2x4"), "{why_suspended}");
    assert_eq!(
        plugin_ok(&ns.name, &["suspend", "train-2x4"]),
        "musterjob.batch.muster.dev/train-2x4 already suspended\n"
    );
    assert_eq!(plugin_ok(&ns.name, &["resume", "train-2x4"]), "musterjob.batch.muster.dev/train-2x4 resumed\n");
    assert!(!jobs.get("train-2x4").await.expect("train-2x4").spec.suspend);
    wait_for("train-2x4 started again", LONG, || async {
        let table = plugin_ok(&ns.name, &["list"]);
        row(&table, "train-2x4").filter(|r| matches!(r[2].as_str(), "Admitted" | "Running") && r[3] == "2/2")
    })
    .await;
}

#[tokio::test]
async fn upstream_gangs_are_listed_and_explained_from_kube_schedulers_verdict() {
    let _muster = muster().await;
    let ns = namespace("plugin-upstream");
    let nodes = TestNodes::add(&ns.name, 2, 4, 1).await;
    // The bring-your-own example in its native form, and too-big compiled to the native kinds.
    let upstream = |object: &mut Value| {
        if object["kind"] == "MusterJob" {
            object["metadata"]["annotations"] = json!({SCHEDULING_API_ANNOTATION: "upstream"});
        }
    };
    let mut objects = examples(&["upstream/byo-statefulset.yaml"], &nodes.placement(), upstream);
    objects.extend(examples(&["too-large-gang.yaml"], &nodes.placement(), upstream));
    for object in &objects {
        apply(&ns.name, object);
    }

    let table = wait_for("the native gangs listed with kube-scheduler's verdict", LONG, || async {
        let table = plugin_ok(&ns.name, &["list"]);
        let kv = row(&table, "kv-cache").is_some_and(|r| r[1] == "-" && r[2] == "Running" && r[3] == "3/3");
        let big = row(&table, "too-big").is_some_and(|r| r[1] == "MusterJob/too-big" && r[2] == "Unschedulable");
        (kv && big).then_some(table)
    })
    .await;
    assert_ne!(row(&table, "too-big").unwrap_or_default()[5], "-", "a reason: {table}");

    let why = plugin_ok(&ns.name, &["why", "too-big"]);
    for want in [
        "podgroup.scheduling.k8s.io too-big, of MusterJob too-big",
        "admitted by kube-scheduler",
        "(PodGroupInitiallyScheduled=False Unschedulable)",
        "0 bound of 17 needed",
    ] {
        assert!(why.contains(want), "`why too-big` lacks {want:?}:\n{why}");
    }
}

//! API Priority and Fairness: the chart's FlowSchema puts muster's ServiceAccount at a
//! controller's priority level (`workload-high` by default, as kube-controller-manager), its
//! values are checked by the schema, and the real API server classifies a request made with a
//! token of muster's ServiceAccount under that very FlowSchema (the response header
//! `X-Kubernetes-PF-FlowSchema-UID`), while another ServiceAccount stays under the built-in ones.

use std::process::Command;

use crate::harness::cluster;
use crate::support::{RELEASE, Release, SERVICE_ACCOUNT, chart_dir, exclusive, helm, of_kind, one, path_str, render};

#[test]
fn the_flowschema_matches_musters_service_account_at_a_controllers_level() {
    let docs = render("muster-system", &[]);
    let fs = one(&docs, "FlowSchema");
    assert_eq!(fs["apiVersion"], "flowcontrol.apiserver.k8s.io/v1", "{fs}");
    assert_eq!(fs["metadata"]["name"], RELEASE, "{fs}");
    assert_eq!(fs["spec"]["priorityLevelConfiguration"]["name"], "workload-high", "{fs}");
    let precedence = fs["spec"]["matchingPrecedence"].as_u64().unwrap_or_default();
    assert!((1..9000).contains(&precedence), "must match before service-accounts (9000): {fs}");
    assert_eq!(fs["spec"]["distinguisherMethod"]["type"], "ByUser", "{fs}");
    let rules = fs["spec"]["rules"].as_array().unwrap_or_else(|| panic!("no rules: {fs}"));
    assert_eq!(rules.len(), 1, "{fs}");
    let subjects = rules[0]["subjects"].as_array().unwrap_or_else(|| panic!("no subjects: {fs}"));
    assert_eq!(subjects.len(), 1, "only muster's ServiceAccount: {fs}");
    assert_eq!(subjects[0]["kind"], "ServiceAccount", "{fs}");
    assert_eq!(subjects[0]["serviceAccount"]["name"], SERVICE_ACCOUNT, "{fs}");
    assert_eq!(subjects[0]["serviceAccount"]["namespace"], "muster-system", "{fs}");

    // The ServiceAccount's own name and the values follow.
    let named = render(
        "ops",
        &[
            "--set",
            "serviceAccount.name=ctl",
            "--set",
            "apf.priorityLevel=leader-election",
            "--set",
            "apf.matchingPrecedence=500",
        ],
    );
    let fs = one(&named, "FlowSchema");
    assert_eq!(fs["spec"]["rules"][0]["subjects"][0]["serviceAccount"]["name"], "ctl", "{fs}");
    assert_eq!(fs["spec"]["rules"][0]["subjects"][0]["serviceAccount"]["namespace"], "ops", "{fs}");
    assert_eq!(fs["spec"]["priorityLevelConfiguration"]["name"], "leader-election", "{fs}");
    assert_eq!(fs["spec"]["matchingPrecedence"], 500, "{fs}");

    assert!(of_kind(&render("muster-system", &["--set", "apf.enabled=false"]), "FlowSchema").is_empty());
    let chart = chart_dir();
    for bad in ["apf.matchingPrecedence=0", "apf.matchingPrecedence=10001", "apf.priorityLevel=", "apf.nope=1"] {
        let out = helm(&["template", RELEASE, path_str(&chart), "--set", bad]);
        assert!(out.is_err(), "the schema took {bad}");
    }
}

/// The FlowSchema the API server classified a request with `token` under: the response header
/// `X-Kubernetes-PF-FlowSchema-UID`, as its name in `uids` (Some(None) when it names none of
/// them); None when the answer has no such header (API Priority and Fairness is off).
fn flow_schema_of(token: &str, uids: &[(String, String)]) -> Option<Option<String>> {
    let server = cluster()
        .kubectl(&["config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}"])
        .unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new("curl")
        .args(["-sk", "-o", "/dev/null", "-D", "-", "-H"])
        .arg(format!("Authorization: Bearer {}", token.trim()))
        .arg(format!("{}/version", server.trim()))
        .output()
        .unwrap_or_else(|e| panic!("curl: {e}"));
    let headers = String::from_utf8_lossy(&out.stdout).to_lowercase();
    let uid = headers.lines().find_map(|l| l.strip_prefix("x-kubernetes-pf-flowschema-uid:"))?.trim().to_string();
    Some(uids.iter().find(|(_, u)| u.to_lowercase() == uid).map(|(name, _)| name.clone()))
}

#[test]
fn the_api_server_classifies_musters_requests_under_the_charts_flowschema() {
    let _lock = exclusive();
    let ns = "muster-apf";
    let release = Release::install(&chart_dir(), ns, &["--set", "replicaCount=0"]);
    let schemas = cluster()
        .kubectl(&[
            "get",
            "flowschemas",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}={.metadata.uid}{\"\\n\"}{end}",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
    let uids: Vec<(String, String)> =
        schemas.lines().filter_map(|l| l.split_once('=')).map(|(n, u)| (n.to_string(), u.to_string())).collect();
    assert!(uids.iter().any(|(n, _)| n == RELEASE), "the chart's FlowSchema is not in the cluster:\n{schemas}");
    let status = cluster()
        .kubectl(&["get", "flowschema", RELEASE, "-o", "jsonpath={.status.conditions[?(@.type==\"Dangling\")].status}"])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_ne!(status.trim(), "True", "the FlowSchema's priority level does not exist");

    let token = |sa: &str| {
        cluster().kubectl(&["create", "token", sa, "-n", ns, "--duration=1h"]).unwrap_or_else(|e| panic!("{e}"))
    };
    let Some(classified) = flow_schema_of(&token(SERVICE_ACCOUNT), &uids) else {
        // hack/cluster-up.sh starts kube-apiserver with --enable-priority-and-fairness=false;
        // `make chart-test` turns it on, and then an answer without APF's headers is a failure.
        let asked = std::env::var("MUSTER_APISERVER_EXTRA_ARGS").unwrap_or_default();
        assert!(
            !asked.contains("--enable-priority-and-fairness=true"),
            "APF was turned on (MUSTER_APISERVER_EXTRA_ARGS={asked}) but the API server answered without its headers"
        );
        eprintln!(
            "apf: API Priority and Fairness is off in this control plane: the FlowSchema was applied, its \
             classification not checked (MUSTER_APISERVER_EXTRA_ARGS='--enable-priority-and-fairness=true \
             --max-requests-inflight=400 --max-mutating-requests-inflight=200' checks it)"
        );
        return;
    };
    assert_eq!(
        classified.as_deref(),
        Some(RELEASE),
        "a request with muster's ServiceAccount token was not classified under the chart's FlowSchema"
    );

    // Another ServiceAccount of the same namespace is not muster: the built-in schemas take it.
    cluster().kubectl(&["create", "serviceaccount", "apf-other", "-n", ns]).unwrap_or_else(|e| panic!("{e}"));
    let classified = flow_schema_of(&token("apf-other"), &uids).flatten();
    assert_eq!(classified.as_deref(), Some("service-accounts"), "another ServiceAccount");
    drop(release);
}

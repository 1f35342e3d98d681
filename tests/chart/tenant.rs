//! The tenant policy of the chart (`tenantPolicy.enabled`, issue 38): ValidatingAdmissionPolicies
//! that keep muster's marks muster's. Rendered, then installed with muster running as the chart's
//! ServiceAccount: a tenant (a ServiceAccount with `edit` in its namespace only, acting with a
//! TokenRequest token) may not set muster's labels and annotations on pods, MusterJobs and
//! MusterJobSets, remove the admission gate or change the pin of a gated pod, and someone with
//! Node rights may not touch the node agent's annotations; what tenants ordinarily do still
//! passes, and muster itself, cluster admins and the StatefulSet controller's pod-group pods are
//! not refused.

use std::path::PathBuf;
use std::time::Duration;

use muster::crds::{
    ADMISSION_ATTEMPT_ANNOTATION, ADMISSION_GATE, COMPLETION_INDEX_ANNOTATION, GPU_ASSIGNED_ANNOTATION,
    GPU_HEALTH_ANNOTATION, GPU_INDICES_ANNOTATION, GPU_TOPOLOGY_ANNOTATION, GROUP_CLAIM_ANNOTATION,
    GROUP_TEMPLATE_ANNOTATION, HOSTNAME_LABEL, JOB_NAME_LABEL, JOBSET_NAME_LABEL, PARENT_COMPOSITE_ANNOTATION,
    POD_GROUP_LABEL, REPLICATED_JOB_LABEL, ROLLED_BACK_ANNOTATION, SCHEDULING_API_ANNOTATION,
};
use serde_json::{Value, json};

use crate::harness::{cluster, kubectl, namespace};
use crate::support::{
    Muster, Release, SERVICE_ACCOUNT, chart_dir, eventually, exclusive, free_port, kubectl_as, kubectl_as_stdin,
    of_kind, one, render, token_kubeconfig,
};

const NS: &str = "muster-system";
const TIMEOUT: Duration = Duration::from_secs(60);
/// The three policies (and bindings) for release `muster`.
const PODS: &str = "muster-tenant-pods";
const JOBS: &str = "muster-tenant-jobs";
const NODES: &str = "muster-tenant-nodes";
/// A node label no node has: the tests' pods stay Pending.
const NOWHERE: &str = "e2e.muster.dev/nowhere";

/// What a refused tenant is told about muster's keys, after the key.
const ON_A_POD: &str = " on a pod: muster's marks (gpu.muster.dev/*, scheduling.muster.dev/*, batch.muster.dev/* \
                        except the pod-group label) are written only by muster";
const OF_A_POD: &str = ": muster's marks (gpu.muster.dev/*, scheduling.muster.dev/*, batch.muster.dev/*, the \
                        pod-group label included) are written only by muster";
const JOB_MARKS: &str = "muster's marks (gpu.muster.dev/*, scheduling.muster.dev/*, batch.muster.dev/* except the \
                         annotation batch.muster.dev/scheduling-api) are written only by muster";

fn policy<'a>(docs: &'a [Value], name: &str) -> &'a Value {
    of_kind(docs, "ValidatingAdmissionPolicy")
        .into_iter()
        .find(|p| p["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no ValidatingAdmissionPolicy {name}"))
}

fn conditions(policy: &Value) -> Vec<String> {
    let list = policy["spec"]["matchConditions"].as_array().cloned().unwrap_or_default();
    list.iter().filter_map(|c| c["expression"].as_str().map(str::to_string)).collect()
}

fn variable<'a>(policy: &'a Value, name: &str) -> &'a str {
    let list = policy["spec"]["variables"].as_array().expect("variables");
    let v = list.iter().find(|v| v["name"] == name).unwrap_or_else(|| panic!("no variable {name} in {policy}"));
    v["expression"].as_str().expect("expression")
}

/// `['a', 'b']` as CEL writes a list of strings.
fn cel_list(items: &[&str]) -> String {
    format!("[{}]", items.iter().map(|i| format!("'{i}'")).collect::<Vec<_>>().join(", "))
}

#[test]
fn tenant_policies_render_with_musters_identity_and_keys() {
    let docs = render(NS, &[]);
    let muster = format!("request.userInfo.username != 'system:serviceaccount:{NS}:{SERVICE_ACCOUNT}'");
    let agent = format!("request.userInfo.username != 'system:serviceaccount:{NS}:muster-node-agent'");
    let admin = "!('system:masters' in request.userInfo.groups)";
    for (name, resources, operations) in [
        (
            PODS,
            json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["pods"]}]),
            2,
        ),
        (
            JOBS,
            json!([{"apiGroups": ["batch.muster.dev"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
                "resources": ["musterjobs", "musterjobsets"]}]),
            2,
        ),
        (
            NODES,
            json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes"]}]),
            1,
        ),
    ] {
        let p = policy(&docs, name);
        assert_eq!(p["spec"]["failurePolicy"], "Fail", "{name}");
        assert_eq!(p["spec"]["matchConstraints"]["resourceRules"], resources, "{name}");
        assert_eq!(resources[0]["operations"].as_array().map(Vec::len), Some(operations));
        let conditions = conditions(p);
        assert!(conditions.contains(&muster) && conditions.contains(&admin.to_string()), "{name}: {conditions:?}");
        assert_eq!(conditions.contains(&agent), name == NODES, "{name}: {conditions:?}");
        let validations = p["spec"]["validations"].as_array().expect("validations");
        assert!(validations.iter().all(|v| v["reason"] == "Forbidden" && v["messageExpression"].is_string()));
        let binding = of_kind(&docs, "ValidatingAdmissionPolicyBinding")
            .into_iter()
            .find(|b| b["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no binding {name}"));
        assert_eq!(binding["spec"], json!({"policyName": name, "validationActions": ["Deny"]}));
    }

    // Every key muster writes on pods and jobs is under one of the prefixes the policies refuse;
    // the exceptions and the node annotations are muster's own names.
    let marks = variable(policy(&docs, PODS), "marks");
    assert_eq!(marks, variable(policy(&docs, JOBS), "marks"));
    let prefixes = ["gpu.muster.dev/", "scheduling.muster.dev/", "batch.muster.dev/"];
    assert_eq!(marks, cel_list(&prefixes));
    for key in [
        GPU_INDICES_ANNOTATION,
        POD_GROUP_LABEL,
        ADMISSION_ATTEMPT_ANNOTATION,
        ROLLED_BACK_ANNOTATION,
        COMPLETION_INDEX_ANNOTATION,
        SCHEDULING_API_ANNOTATION,
        JOB_NAME_LABEL,
        JOBSET_NAME_LABEL,
        REPLICATED_JOB_LABEL,
        GROUP_TEMPLATE_ANNOTATION,
        PARENT_COMPOSITE_ANNOTATION,
        GROUP_CLAIM_ANNOTATION,
        muster::controllers::APPLIED_HASH_ANNOTATION,
        muster::controllers::job::FROZEN_HASH_ANNOTATION,
        muster::controllers::job::plan::GANG_ATTEMPT_ANNOTATION,
        muster::controllers::jobset::plan::RESTART_ATTEMPT_ANNOTATION,
    ] {
        assert!(prefixes.iter().any(|p| key.starts_with(p)), "{key} is under none of {prefixes:?}");
    }
    let pods = serde_json::to_string(policy(&docs, PODS)).expect("json");
    for name in [POD_GROUP_LABEL, ADMISSION_GATE] {
        assert!(pods.contains(&format!("'{name}'")), "{PODS} does not name {name}");
    }
    let jobs = serde_json::to_string(policy(&docs, JOBS)).expect("json");
    assert!(
        jobs.contains(&format!("'{SCHEDULING_API_ANNOTATION}'")),
        "{JOBS} does not name {SCHEDULING_API_ANNOTATION}"
    );
    assert_eq!(
        variable(policy(&docs, NODES), "keys"),
        cel_list(&[GPU_TOPOLOGY_ANNOTATION, GPU_ASSIGNED_ANNOTATION, GPU_HEALTH_ANNOTATION])
    );

    // muster's identity follows the ServiceAccount values.
    for (set, user) in
        [("serviceAccount.name=platform-muster", "platform-muster"), ("serviceAccount.create=false", "default")]
    {
        let docs = render("ops", &["--set", set]);
        let wanted = format!("request.userInfo.username != 'system:serviceaccount:ops:{user}'");
        for name in [PODS, JOBS, NODES] {
            assert!(conditions(policy(&docs, name)).contains(&wanted), "--set {set}: {name}");
        }
    }
    // Off: none of them (the node agent's is off by default too).
    let off = render(NS, &["--set", "tenantPolicy.enabled=false"]);
    assert!(of_kind(&off, "ValidatingAdmissionPolicy").is_empty());
    assert!(of_kind(&off, "ValidatingAdmissionPolicyBinding").is_empty());
}

/// A ServiceAccount `name` of `ns` with the built-in `edit` bound in `ns`, and a kubeconfig with
/// a TokenRequest token of it. The tests' control plane runs no clusterrole-aggregation
/// controller, so `edit` has no rules there: the roles it would aggregate (labelled
/// `aggregate-to-edit` or `aggregate-to-view`, the chart's `muster-edit` among them) are bound
/// in `ns` too.
fn editor(ns: &str, name: &str) -> PathBuf {
    let mut roles = vec!["edit".to_string()];
    for label in
        ["rbac.authorization.k8s.io/aggregate-to-edit=true", "rbac.authorization.k8s.io/aggregate-to-view=true"]
    {
        let list: Value = serde_json::from_str(&kubectl(&["get", "clusterroles", "-l", label, "-o", "json"]))
            .unwrap_or_else(|e| panic!("clusterroles: {e}"));
        for role in list["items"].as_array().into_iter().flatten() {
            if role.get("aggregationRule").is_none() {
                roles.push(role["metadata"]["name"].as_str().unwrap_or_default().to_string());
            }
        }
    }
    assert!(roles.iter().any(|r| r == "muster-edit"), "the chart's muster-edit is not aggregated into edit: {roles:?}");
    let mut items =
        vec![json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}})];
    for (i, role) in roles.iter().enumerate() {
        items.push(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": format!("{name}-{i}"), "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]}));
    }
    cluster()
        .kubectl_stdin(
            &["apply", "-f", "-"],
            Some(&json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let who = format!("--as=system:serviceaccount:{ns}:{name}");
    let can = |verb: &str, resource: &str, namespace: &str| {
        cluster().kubectl(&["auth", "can-i", &who, verb, resource, "-n", namespace]).is_ok_and(|o| o.trim() == "yes")
    };
    eventually(
        "the tenant's bindings in effect",
        TIMEOUT,
        || {
            ["pods", "musterjobs.batch.muster.dev", "musterjobsets.batch.muster.dev"]
                .iter()
                .all(|r| can("create", r, ns) && can("patch", r, ns))
                .then_some(())
        },
        String::new,
    );
    // A tenant: nothing outside its namespace, no Nodes.
    assert!(!can("create", "pods", "default") && !can("patch", "nodes", ""), "{who} is more than a tenant");
    let token = kubectl(&["create", "token", name, "-n", ns, "--duration=1h"]);
    token_kubeconfig(&format!("{ns}-{name}"), name, &token)
}

fn pod(name: &str, metadata: Value) -> String {
    let mut meta = metadata;
    meta["name"] = json!(name);
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {"restartPolicy": "Never", "nodeSelector": {NOWHERE: "true"},
            "containers": [{"name": "main", "image": "registry.invalid/none"}]}})
    .to_string()
}

fn job(kind: &str, name: &str, metadata: Value) -> String {
    let mut meta = metadata;
    meta["name"] = json!(name);
    let template = json!({"spec": {"restartPolicy": "Never", "nodeSelector": {NOWHERE: "true"},
        "containers": [{"name": "main", "image": "registry.invalid/none"}]}});
    let spec = match kind {
        "MusterJob" => json!({"parallelism": 1, "completions": 1, "template": template}),
        _ => json!({"replicatedJobs": [{"name": "workers", "replicas": 1,
            "template": {"spec": {"parallelism": 2, "completions": 2, "template": template}}}]}),
    };
    json!({"apiVersion": "batch.muster.dev/v1alpha1", "kind": kind, "metadata": meta, "spec": spec}).to_string()
}

fn json_of(out: &str) -> Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn gated(pod: &Value) -> bool {
    let gates = pod["spec"]["schedulingGates"].as_array().cloned().unwrap_or_default();
    gates.iter().any(|g| g["name"] == ADMISSION_GATE)
}

/// The message of policy `policy`'s refusal in `result` (what follows the API server's prefix,
/// to the end of its line); the refusal is printed.
fn refusal(what: &str, result: Result<String, String>, policy: &str) -> String {
    let err = result.expect_err(&format!("{what}: not refused"));
    eprintln!("{what}: {err}");
    let prefix = format!("ValidatingAdmissionPolicy '{policy}' with binding '{policy}' denied request: ");
    let (_, message) = err.split_once(&prefix).unwrap_or_else(|| panic!("{what}: not refused by {policy}: {err}"));
    message.lines().next().unwrap_or_default().trim().to_string()
}

fn refused_with(what: &str, result: Result<String, String>, policy: &str, message: &str) {
    assert_eq!(refusal(what, result, policy), message, "{what}");
}

fn allowed(what: &str, result: Result<String, String>) {
    if let Err(e) = result {
        panic!("{what}: refused: {e}");
    }
}

/// The ClusterRole, its binding and the Node of the node test, deleted when dropped.
struct NodeRights(String);

impl Drop for NodeRights {
    fn drop(&mut self) {
        for kind in ["clusterrolebinding", "clusterrole", "node"] {
            let _ = cluster().kubectl(&["delete", kind, &self.0, "--ignore-not-found", "--wait=false"]);
        }
    }
}

#[test]
fn a_tenant_cannot_write_musters_marks() {
    let _lock = exclusive();
    let port = free_port();
    let release =
        Release::install(&chart_dir(), "muster-tenant", &["--set", &format!("webhook.url=https://127.0.0.1:{port}")]);
    let rns = release.namespace.clone();
    let muster_kubeconfig = release.service_account_kubeconfig();
    let deployment = one(&release.manifest(), "Deployment").clone();
    let muster = Muster::start(&deployment, &muster_kubeconfig, &rns, port, &[]);

    // The policies type-check without warnings.
    for name in [PODS, JOBS, NODES] {
        let checked = eventually(
            &format!("the type checking of {name}"),
            TIMEOUT,
            || {
                let p = json_of(&cluster().kubectl(&["get", "validatingadmissionpolicy", name, "-o", "json"]).ok()?);
                (p["status"]["observedGeneration"] == p["metadata"]["generation"]).then_some(p)
            },
            String::new,
        );
        let warnings = &checked["status"]["typeChecking"]["expressionWarnings"];
        assert!(warnings.as_array().is_none_or(|w| w.is_empty()), "{name}: CEL type warnings: {warnings}");
    }

    let test_ns = namespace("tenant");
    let ns = test_ns.name.as_str();
    let tenant = editor(ns, "ci");
    let user = format!("system:serviceaccount:{ns}:ci");
    let refused = format!("refused: {user} may not ");
    let as_tenant = |args: &[&str]| {
        let mut all = vec!["-n", ns];
        all.extend_from_slice(args);
        kubectl_as(&tenant, &all)
    };
    let create =
        |kubeconfig: &PathBuf, yaml: &str| kubectl_as_stdin(kubeconfig, &["create", "-n", ns, "-f", "-"], yaml);

    // (a) A new pod naming GPU indices. The API server enforces a new binding a moment after it
    // is created: the first refusal is waited for (a pod let through meanwhile is deleted).
    let forged = pod("forged-indices", json!({"annotations": {GPU_INDICES_ANNOTATION: "0,1,2,3"}}));
    let first = eventually(
        "the tenant policy in force",
        TIMEOUT,
        || match create(&tenant, &forged) {
            Ok(_) => {
                let _ = cluster().kubectl(&["delete", "pod", "forged-indices", "-n", ns, "--wait=false"]);
                None
            }
            Err(e) if e.contains("AlreadyExists") => None,
            Err(e) => Some(e),
        },
        || "the tenant could still create a pod with GPU indices".into(),
    );
    refused_with(
        "(a) a pod with GPU indices",
        Err(first),
        PODS,
        &format!("{refused}set annotation {GPU_INDICES_ANNOTATION}{ON_A_POD}"),
    );
    // (b) A new pod claiming to be a MusterJob's, and one with several of muster's keys.
    refused_with(
        "(b) a pod with muster's job label",
        create(&tenant, &pod("forged-job", json!({"labels": {JOB_NAME_LABEL: "train"}}))),
        PODS,
        &format!("{refused}set label {JOB_NAME_LABEL}{ON_A_POD}"),
    );
    // Several keys are named together (in no particular order: the map's).
    let two = refusal(
        "(b) a pod with two of muster's annotations",
        create(
            &tenant,
            &pod(
                "forged-two",
                json!({"labels": {POD_GROUP_LABEL: "nobody"},
                    "annotations": {ADMISSION_ATTEMPT_ANNOTATION: "7", COMPLETION_INDEX_ANNOTATION: "0"}}),
            ),
        ),
        PODS,
    );
    let either = [
        format!("{refused}set annotations {COMPLETION_INDEX_ANNOTATION}, {ADMISSION_ATTEMPT_ANNOTATION}{ON_A_POD}"),
        format!("{refused}set annotations {ADMISSION_ATTEMPT_ANNOTATION}, {COMPLETION_INDEX_ANNOTATION}{ON_A_POD}"),
    ];
    assert!(either.contains(&two), "{two}");

    // (c) A pod asking to join a PodGroup is the tenant's to make; the webhook gates it.
    allowed(
        "(c) a pod joining a PodGroup",
        create(&tenant, &pod("joins", json!({"labels": {POD_GROUP_LABEL: "nobody"}}))),
    );
    let joined = json_of(&kubectl(&["get", "pod", "joins", "-n", ns, "-o", "json"]));
    assert!(gated(&joined), "the mutating webhook did not gate the pod: {joined}");
    // So is a plain pod.
    allowed("a plain pod", create(&tenant, &pod("plain", json!({"labels": {"app": "web"}}))));

    // (h) Ordinary updates: an unrelated label or annotation, on a plain pod and on a gated one.
    allowed("(h) a label of a plain pod", as_tenant(&["label", "pod", "plain", "team=a"]));
    allowed("(h) an annotation of a plain pod", as_tenant(&["annotate", "pod", "plain", "example.com/note=x"]));
    allowed("(h) a label of a gated pod", as_tenant(&["label", "pod", "joins", "team=a"]));

    // (d) Muster's keys on an existing pod: added, or the pod-group label removed.
    refused_with(
        "(d) GPU indices added to a pod",
        as_tenant(&["annotate", "pod", "plain", &format!("{GPU_INDICES_ANNOTATION}=0,1")]),
        PODS,
        &format!("{refused}add, change or remove annotation {GPU_INDICES_ANNOTATION} of pod plain{OF_A_POD}"),
    );
    refused_with(
        "(d) the pod-group label removed",
        as_tenant(&["label", "pod", "joins", &format!("{POD_GROUP_LABEL}-")]),
        PODS,
        &format!("{refused}add, change or remove label {POD_GROUP_LABEL} of pod joins{OF_A_POD}"),
    );

    // (f) The pin of a gated pod: its hostname selector, its node-name affinity.
    let while_gated = format!(
        " of pod joins while it carries the scheduling gate {ADMISSION_GATE}: muster pins a gated pod to its node \
         there (spec.nodeSelector kubernetes.io/hostname, spec.affinity metadata.name), and only muster writes them"
    );
    let pin = json!({"spec": {"nodeSelector": {HOSTNAME_LABEL: "pool-gpu-0"}}}).to_string();
    refused_with(
        "(f) the node selector of a gated pod",
        as_tenant(&["patch", "pod", "joins", "--type=merge", "-p", &pin]),
        PODS,
        &format!("{refused}change spec.nodeSelector {HOSTNAME_LABEL}{while_gated}"),
    );
    let affinity = json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
        {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["pool-gpu-0"]}]}]}}}}})
    .to_string();
    refused_with(
        "(f) the node affinity of a gated pod",
        as_tenant(&["patch", "pod", "joins", "--type=merge", "-p", &affinity]),
        PODS,
        &format!("{refused}change spec.affinity{while_gated}"),
    );
    // (e) The admission gate removed.
    let gates = joined["spec"]["schedulingGates"].as_array().cloned().unwrap_or_default();
    let at = gates.iter().position(|g| g["name"] == ADMISSION_GATE).expect("muster's gate");
    let ungate = json!([
        {"op": "test", "path": format!("/spec/schedulingGates/{at}/name"), "value": ADMISSION_GATE},
        {"op": "remove", "path": format!("/spec/schedulingGates/{at}")},
    ])
    .to_string();
    refused_with(
        "(e) the admission gate removed",
        as_tenant(&["patch", "pod", "joins", "--type=json", "-p", &ungate]),
        PODS,
        &format!(
            "{refused}remove the scheduling gate {ADMISSION_GATE} of pod joins: only muster removes it, when it \
             admits the gang of the pod"
        ),
    );
    let still = json_of(&kubectl(&["get", "pod", "joins", "-n", ns, "-o", "json"]));
    assert!(gated(&still) && still["spec"]["nodeSelector"].get(HOSTNAME_LABEL).is_none(), "{still}");

    // The StatefulSet controller's identity (what it creates pods as with
    // --use-service-account-credentials; here kube-controller-manager runs as admin): its
    // pod-group pods pass, a template with GPU indices does not.
    let sts = "system:serviceaccount:kube-system:statefulset-controller";
    let as_sts = |yaml: &str| cluster().kubectl_stdin(&["create", "-n", ns, "--as", sts, "-f", "-"], Some(yaml));
    allowed(
        "the StatefulSet controller's pod-group pod",
        as_sts(&pod("kv-0", json!({"labels": {POD_GROUP_LABEL: "kv"}}))),
    );
    refused_with(
        "the StatefulSet controller's pod with GPU indices",
        as_sts(&pod("kv-1", json!({"labels": {POD_GROUP_LABEL: "kv"}, "annotations": {GPU_INDICES_ANNOTATION: "0"}}))),
        PODS,
        &format!("refused: {sts} may not set annotation {GPU_INDICES_ANNOTATION}{ON_A_POD}"),
    );

    // (g) MusterJobs and MusterJobSets: muster's delegation annotations and labels are refused, the
    // choice of scheduling API is not.
    refused_with(
        "(g) a MusterJob with a parent CompositePodGroup",
        create(&tenant, &job("MusterJob", "forged", json!({"annotations": {PARENT_COMPOSITE_ANNOTATION: "other"}}))),
        JOBS,
        &format!("{refused}set annotation {PARENT_COMPOSITE_ANNOTATION} on a MusterJob: {JOB_MARKS}"),
    );
    refused_with(
        "(g) a MusterJobSet with the pod-group label",
        create(&tenant, &job("MusterJobSet", "forged", json!({"labels": {POD_GROUP_LABEL: "other"}}))),
        JOBS,
        &format!("{refused}set label {POD_GROUP_LABEL} on a MusterJobSet: {JOB_MARKS}"),
    );
    allowed(
        "(g) a MusterJob choosing its scheduling API",
        create(&tenant, &job("MusterJob", "train", json!({"annotations": {SCHEDULING_API_ANNOTATION: "upstream"}}))),
    );
    allowed("a MusterJobSet", create(&tenant, &job("MusterJobSet", "sweep", json!({}))));
    // A job carrying muster's marks (as a set's children do; an admin may write them): the
    // tenant may label it, not change what muster wrote.
    let marked = job(
        "MusterJob",
        "child",
        json!({"labels": {JOBSET_NAME_LABEL: "sweep"},
            "annotations": {PARENT_COMPOSITE_ANNOTATION: "sweep", GROUP_TEMPLATE_ANNOTATION: "workers"}}),
    );
    cluster().kubectl_stdin(&["create", "-n", ns, "-f", "-"], Some(&marked)).unwrap_or_else(|e| panic!("{e}"));
    allowed("a label of a job with muster's marks", as_tenant(&["label", "musterjob", "child", "team=a"]));
    allowed("a label of a MusterJob", as_tenant(&["label", "musterjob", "train", "team=a"]));
    refused_with(
        "a job's parent CompositePodGroup changed",
        as_tenant(&["annotate", "musterjob", "child", &format!("{PARENT_COMPOSITE_ANNOTATION}=other"), "--overwrite"]),
        JOBS,
        &format!(
            "{refused}add, change or remove annotation {PARENT_COMPOSITE_ANNOTATION} of MusterJob child: {JOB_MARKS}"
        ),
    );
    refused_with(
        "a job's set label removed",
        as_tenant(&["label", "musterjob", "child", &format!("{JOBSET_NAME_LABEL}-")]),
        JOBS,
        &format!("{refused}add, change or remove label {JOBSET_NAME_LABEL} of MusterJob child: {JOB_MARKS}"),
    );

    // (i) muster itself does both (a) and (e).
    allowed(
        "(i) muster creating a pod with GPU indices",
        create(&muster_kubeconfig, &pod("placed", json!({"annotations": {GPU_INDICES_ANNOTATION: "0,1"}}))),
    );
    allowed(
        "(i) muster removing the admission gate",
        kubectl_as(&muster_kubeconfig, &["patch", "pod", "joins", "-n", ns, "--type=json", "-p", &ungate]),
    );
    assert!(!gated(&json_of(&kubectl(&["get", "pod", "joins", "-n", ns, "-o", "json"]))));

    // Nodes: someone allowed to patch Nodes who is neither the node agent, muster nor an admin
    // may not touch the agent's annotations; an admin may (the demo writes topology by hand).
    let node = format!("{ns}-node");
    let rights = NodeRights(node.clone());
    kubectl(&["create", "clusterrole", &rights.0, "--verb=get,patch", "--resource=nodes"]);
    kubectl(&[
        "create",
        "clusterrolebinding",
        &rights.0,
        &format!("--clusterrole={}", rights.0),
        &format!("--serviceaccount={ns}:labeller"),
    ]);
    kubectl(&["create", "serviceaccount", "labeller", "-n", ns]);
    let node_yaml = json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node, "annotations": {GPU_TOPOLOGY_ANNOTATION: "{\"version\":1,\"gpus\":[]}"}}});
    cluster().kubectl_stdin(&["create", "-f", "-"], Some(&node_yaml.to_string())).unwrap_or_else(|e| panic!("{e}"));
    let labeller =
        token_kubeconfig(&format!("{ns}-labeller"), "labeller", &kubectl(&["create", "token", "labeller", "-n", ns]));
    let labeller_user = format!("system:serviceaccount:{ns}:labeller");
    eventually(
        "the labeller's ClusterRoleBinding in effect",
        TIMEOUT,
        || kubectl_as(&labeller, &["annotate", "node", &node, "example.com/rack=r1", "--overwrite"]).ok(),
        String::new,
    );
    let only_agent = format!(
        " of Node {node}: the node annotations {GPU_TOPOLOGY_ANNOTATION}, {GPU_ASSIGNED_ANNOTATION}, \
         {GPU_HEALTH_ANNOTATION} are written only by muster's node agent, on its own Node"
    );
    refused_with(
        "a Node's GPU topology changed",
        kubectl_as(&labeller, &["annotate", "node", &node, &format!("{GPU_TOPOLOGY_ANNOTATION}={{}}"), "--overwrite"]),
        NODES,
        &format!(
            "refused: {labeller_user} may not add, change or remove annotation {GPU_TOPOLOGY_ANNOTATION}{only_agent}"
        ),
    );
    refused_with(
        "a Node's GPU topology removed and health added",
        kubectl_as(
            &labeller,
            &[
                "annotate",
                "node",
                &node,
                &format!("{GPU_TOPOLOGY_ANNOTATION}-"),
                &format!("{GPU_HEALTH_ANNOTATION}={{}}"),
            ],
        ),
        NODES,
        &format!(
            "refused: {labeller_user} may not add, change or remove annotations {GPU_TOPOLOGY_ANNOTATION}, \
             {GPU_HEALTH_ANNOTATION}{only_agent}"
        ),
    );
    kubectl(&["annotate", "node", &node, &format!("{GPU_TOPOLOGY_ANNOTATION}={{}}"), "--overwrite"]);

    // None of muster's own writes met the policies (its RBAC is tests/chart/rbac.rs's to check).
    let refused: Vec<String> =
        muster.forbidden_lines().into_iter().filter(|l| l.contains("ValidatingAdmissionPolicy")).collect();
    assert!(refused.is_empty(), "the tenant policies refused muster:\n{}", refused.join("\n"));
    drop(rights);
    drop(muster);
    drop(release);
}

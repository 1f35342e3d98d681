//! The node agent of the chart (`nodeAgent.enabled`): its DaemonSet, ServiceAccount, RBAC and
//! ValidatingAdmissionPolicy as rendered, then installed on the tests' control plane: one pod per
//! selected kwok GPU node and none elsewhere, and a token of its ServiceAccount bound to such a
//! pod (what the pod's projected token is) that may patch the three `gpu.muster.dev/`
//! annotations of that pod's Node and nothing else: it reads no pod (kubelet names the pods it
//! reports, muster joins the names to its pods), and the real agent publishes with it.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use muster::crds::{GPU_ASSIGNED_ANNOTATION, GPU_HEALTH_ANNOTATION, GPU_TOPOLOGY_ANNOTATION};
use muster::devices::report::{AssignedAnnotation, ContainerDevices, PodDevices, ResourceDevices, pod_key};
use muster_dev::FakeGpuNodes;
use muster_dev::kubelet::FakeKubelet;
use serde_json::{Value, json};

use crate::harness::{add_gpu_nodes, cluster, kubectl};
use crate::support::{
    Release, chart_dir, container_args, eventually, exclusive, helm_cluster, kubectl_as, kubectl_as_stdin, of_kind,
    one, render, repo, token_kubeconfig,
};

const NS: &str = "muster-system";
/// The agent's ServiceAccount (and DaemonSet, ClusterRole, policy) for release `muster`.
const AGENT: &str = "muster-node-agent";
const TIMEOUT: Duration = Duration::from_secs(60);

fn agent_render(extra: &[&str]) -> Vec<Value> {
    let mut args = vec!["--set", "nodeAgent.enabled=true"];
    args.extend_from_slice(extra);
    render(NS, &args)
}

fn container(daemonset: &Value) -> &Value {
    &daemonset["spec"]["template"]["spec"]["containers"][0]
}

fn named<'a>(list: &'a Value, name: &str) -> &'a Value {
    list.as_array().into_iter().flatten().find(|v| v["name"] == name).unwrap_or_else(|| panic!("no {name:?} in {list}"))
}

/// The agent's objects of `kind` (the chart's tenant policies are of the same kinds).
fn agent_policies<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    of_kind(docs, kind).into_iter().filter(|d| d["metadata"]["name"] == AGENT).collect()
}

/// The NodeGPUReport write policy's name.
const REPORT_POLICY: &str = "muster-node-agent-report";

fn report_policies<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    of_kind(docs, kind).into_iter().filter(|d| d["metadata"]["name"] == REPORT_POLICY).collect()
}

fn one_of(found: Vec<&Value>) -> &Value {
    match found.as_slice() {
        [one] => one,
        other => panic!("expected one of the agent's, found {}", other.len()),
    }
}

/// Whether a selector (`matchLabels`, or a Service's plain map) selects `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let wanted = selector.get("matchLabels").unwrap_or(selector);
    wanted.as_object().is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

#[test]
fn node_agent_is_off_by_default() {
    let docs = render(NS, &[]);
    assert!(of_kind(&docs, "DaemonSet").is_empty());
    assert!(agent_policies(&docs, "ValidatingAdmissionPolicy").is_empty());
    assert!(agent_policies(&docs, "ValidatingAdmissionPolicyBinding").is_empty());
    let names: Vec<&str> = docs.iter().filter_map(|d| d["metadata"]["name"].as_str()).collect();
    assert!(!names.contains(&AGENT), "{names:?}");
}

#[test]
fn node_agent_daemonset_has_its_arguments_mounts_probes_and_account() {
    let docs = agent_render(&[]);
    let ds = one(&docs, "DaemonSet");
    assert_eq!(ds["metadata"]["name"], AGENT);
    let spec = &ds["spec"]["template"]["spec"];
    let c = container(ds);
    assert_eq!(spec["serviceAccountName"], AGENT);
    assert_eq!(spec["automountServiceAccountToken"], true);
    let sa = of_kind(&docs, "ServiceAccount").into_iter().find(|s| s["metadata"]["name"] == AGENT);
    assert_eq!(sa.expect("the agent's ServiceAccount")["metadata"]["namespace"], NS);
    // The manager's image, the agent's subcommand.
    assert_eq!(c["image"], container(one(&docs, "Deployment"))["image"]);
    assert_eq!(
        container_args(ds),
        [
            "node-agent",
            "--node-name=$(NODE_NAME)",
            "--interval=10s",
            "--driver-root=/driver-root",
            "--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock",
            "--health-refresh=30s",
            "--probe-bind-address=0.0.0.0:8081",
            "--log-level=info",
            "--log-format=json",
        ]
    );
    assert_eq!(named(&c["env"], "NODE_NAME")["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
    assert_eq!(named(&c["env"], "NVIDIA_VISIBLE_DEVICES")["value"], "all");
    assert_eq!(named(&c["env"], "NVIDIA_DRIVER_CAPABILITIES")["value"], "utility");
    // The host driver root read-only at /driver-root; kubelet's PodResources folder at its path.
    let mount = named(&c["volumeMounts"], "driver-root");
    assert_eq!(
        (&mount["mountPath"], &mount["readOnly"], &mount["mountPropagation"]),
        (&json!("/driver-root"), &json!(true), &json!("HostToContainer"))
    );
    assert_eq!(named(&spec["volumes"], "driver-root")["hostPath"], json!({"path": "/", "type": "Directory"}));
    let mount = named(&c["volumeMounts"], "pod-resources");
    assert_eq!((&mount["mountPath"], &mount["readOnly"]), (&json!("/var/lib/kubelet/pod-resources"), &json!(true)));
    assert_eq!(
        named(&spec["volumes"], "pod-resources")["hostPath"],
        json!({"path": "/var/lib/kubelet/pod-resources", "type": "Directory"})
    );
    // Probes on the probe port.
    assert_eq!(named(&c["ports"], "probe")["containerPort"], 8081);
    assert_eq!(c["livenessProbe"]["httpGet"], json!({"path": "/healthz", "port": "probe"}));
    assert_eq!(c["readinessProbe"]["httpGet"], json!({"path": "/readyz", "port": "probe"}));
    // Root for kubelet's socket, nothing more.
    let sc = &c["securityContext"];
    assert_eq!((&sc["runAsUser"], &sc["runAsNonRoot"]), (&json!(0), &json!(false)));
    assert_eq!((&sc["privileged"], &sc["allowPrivilegeEscalation"]), (&json!(false), &json!(false)));
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(c["resources"]["requests"], json!({"cpu": "10m", "memory": "32Mi"}));
    assert_eq!(c["resources"]["limits"], json!({"memory": "64Mi"}));
    // GPU nodes only, tolerating their usual taint, critical, rolled one node at a time.
    assert_eq!(spec["priorityClassName"], "system-node-critical");
    assert!(spec.get("runtimeClassName").is_none());
    assert!(spec.get("nodeSelector").is_none());
    assert_eq!(spec["tolerations"], json!([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]));
    let terms =
        &spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
    let keys: Vec<&str> = terms
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| t["matchExpressions"][0]["key"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(keys, ["feature.node.kubernetes.io/pci-10de.present", "nvidia.com/gpu.present", "nvidia.com/gpu.count"]);
    assert_eq!(ds["spec"]["updateStrategy"], json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}));
}

#[test]
fn node_agent_values_switch_flags_mounts_and_privilege() {
    let docs = agent_render(&[
        "--set",
        "nodeAgent.podResources.enabled=false",
        "--set",
        "nodeAgent.health.enabled=false",
        "--set",
        "nodeAgent.privileged=true",
        "--set",
        "nodeAgent.runtimeClassName=nvidia",
        "--set",
        "nodeAgent.updateStrategy.type=OnDelete",
        "--set",
        "nodeAgent.intervalSeconds=45",
        "--set",
        "nodeAgent.probePort=9100",
        "--set",
        "nodeAgent.driverRoot=/run/nvidia/driver",
        "--set",
        "nodeAgent.priorityClassName=",
        "--set-json",
        r#"nodeAgent.nodeSelector={"pool":"gpu"}"#,
        "--set-json",
        r#"nodeAgent.affinity={"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"x","operator":"Exists"}]}]}}}"#,
    ]);
    let ds = one(&docs, "DaemonSet");
    let spec = &ds["spec"]["template"]["spec"];
    let args = container_args(ds);
    for flag in ["--no-pod-resources", "--no-health", "--interval=45s", "--probe-bind-address=0.0.0.0:9100"] {
        assert!(args.iter().any(|a| a == flag), "{flag} missing: {args:?}");
    }
    assert!(!args.iter().any(|a| a.starts_with("--pod-resources-socket") || a.starts_with("--health-refresh")));
    let mounts: Vec<&str> =
        container(ds)["volumeMounts"].as_array().into_iter().flatten().filter_map(|m| m["name"].as_str()).collect();
    assert_eq!(mounts, ["driver-root"]);
    assert_eq!(named(&spec["volumes"], "driver-root")["hostPath"]["path"], "/run/nvidia/driver");
    let sc = &container(ds)["securityContext"];
    assert_eq!(sc["privileged"], true);
    assert!(sc.get("allowPrivilegeEscalation").is_none(), "privileged refuses allowPrivilegeEscalation=false: {sc}");
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(spec["runtimeClassName"], "nvidia");
    assert!(spec.get("priorityClassName").is_none());
    assert_eq!(spec["nodeSelector"], json!({"pool": "gpu"}));
    assert_eq!(
        spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"]
            [0]["key"],
        "x"
    );
    assert_eq!(ds["spec"]["updateStrategy"], json!({"type": "OnDelete"}));
}

#[test]
fn node_agent_extra_args_and_volumes_come_after_the_charts() {
    // As `make e2e-real` installs it on a node without GPUs: the agent replays a recorded probe.
    let docs = agent_render(&[
        "--set-json",
        r#"nodeAgent.extraArgs=["--probe-file=/probe/probe.json"]"#,
        "--set-json",
        r#"nodeAgent.extraVolumes=[{"name":"probe-file","configMap":{"name":"muster-probe"}}]"#,
        "--set-json",
        r#"nodeAgent.extraVolumeMounts=[{"name":"probe-file","mountPath":"/probe","readOnly":true}]"#,
    ]);
    let ds = one(&docs, "DaemonSet");
    let args = container_args(ds);
    assert_eq!(args.last().map(String::as_str), Some("--probe-file=/probe/probe.json"), "{args:?}");
    assert!(args.iter().any(|a| a.starts_with("--pod-resources-socket=")), "the chart's flags stay: {args:?}");
    let mounts: Vec<&str> =
        container(ds)["volumeMounts"].as_array().into_iter().flatten().filter_map(|m| m["name"].as_str()).collect();
    assert_eq!(mounts, ["driver-root", "pod-resources", "probe-file"]);
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(named(&spec["volumes"], "probe-file")["configMap"]["name"], "muster-probe");
    // The schema refuses an argument that is not a flag.
    let refused = crate::support::helm(&[
        "template",
        "muster",
        crate::support::path_str(&crate::support::chart_dir()),
        "--set",
        "nodeAgent.enabled=true",
        "--set-json",
        r#"nodeAgent.extraArgs=["probe-file"]"#,
    ]);
    assert!(refused.is_err_and(|e| e.contains("extraArgs")), "a non-flag extraArgs item must be refused");
}

#[test]
fn nothing_of_the_controller_manager_selects_the_agents_pods() {
    // The Deployment, its PodDisruptionBudget, Services, NetworkPolicy and anti-affinity all
    // select the manager's pods; none may count or route to the agent's.
    let docs = agent_render(&["--set", "networkPolicy.enabled=true"]);
    let ds = one(&docs, "DaemonSet");
    let agent_pods = &ds["spec"]["template"]["metadata"]["labels"];
    let deployment = one(&docs, "Deployment");
    let manager_pods = &deployment["spec"]["template"]["metadata"]["labels"];
    assert!(selects(&ds["spec"]["selector"], agent_pods));
    assert!(!selects(&ds["spec"]["selector"], manager_pods), "the DaemonSet selects the manager's pods");
    let mut selectors = vec![
        ("Deployment", deployment["spec"]["selector"].clone()),
        ("PodDisruptionBudget", one(&docs, "PodDisruptionBudget")["spec"]["selector"].clone()),
        ("NetworkPolicy", one(&docs, "NetworkPolicy")["spec"]["podSelector"].clone()),
        (
            "anti-affinity",
            deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
                ["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]["labelSelector"]
                .clone(),
        ),
    ];
    for svc in of_kind(&docs, "Service") {
        selectors.push(("Service", svc["spec"]["selector"].clone()));
    }
    for (what, selector) in selectors {
        assert!(selects(&selector, manager_pods), "{what} {selector} does not select the manager's pods");
        assert!(!selects(&selector, agent_pods), "{what} {selector} selects the node agent's pods");
    }
}

#[test]
fn node_agent_rbac_and_admission_policy() {
    let docs = agent_render(&[]);
    let role = of_kind(&docs, "ClusterRole").into_iter().find(|r| r["metadata"]["name"] == AGENT).expect("ClusterRole");
    assert_eq!(
        role["rules"],
        json!([
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
            {"apiGroups": ["gpu.muster.dev"], "resources": ["nodegpureports"], "verbs": ["get", "create", "patch"]},
        ]),
        "its Node only: no pods, so a stolen agent token reads no pod of the cluster"
    );
    let binding =
        of_kind(&docs, "ClusterRoleBinding").into_iter().find(|r| r["metadata"]["name"] == AGENT).expect("binding");
    assert_eq!(binding["roleRef"]["name"], AGENT);
    assert_eq!(binding["subjects"], json!([{"kind": "ServiceAccount", "name": AGENT, "namespace": NS}]));

    let policy = one_of(agent_policies(&docs, "ValidatingAdmissionPolicy"));
    assert_eq!(policy["apiVersion"], "admissionregistration.k8s.io/v1");
    assert_eq!(policy["spec"]["failurePolicy"], "Fail");
    assert_eq!(
        policy["spec"]["matchConstraints"]["resourceRules"],
        json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes"]}])
    );
    assert_eq!(
        policy["spec"]["matchConditions"][0]["expression"],
        format!("request.userInfo.username == 'system:serviceaccount:{NS}:{AGENT}'")
    );
    // The annotation it lets through is the one muster reads on Nodes; the two an older agent
    // wrote (now in the NodeGPUReport) it may only remove.
    let listed = |name: &str| -> BTreeSet<String> {
        let expr = named(&policy["spec"]["variables"], name)["expression"].as_str().expect("expression");
        expr.trim_matches(|c| c == '[' || c == ']').split(", ").map(str::to_string).collect()
    };
    let quoted = |keys: &[&str]| -> BTreeSet<String> { keys.iter().map(|a| format!("'{a}'")).collect() };
    assert_eq!(listed("allowed"), quoted(&[GPU_TOPOLOGY_ANNOTATION]));
    assert_eq!(listed("removable"), quoted(&[GPU_ASSIGNED_ANNOTATION, GPU_HEALTH_ANNOTATION]));
    // Node binding, spec, labels, other annotations, finalizers and owner references (what each
    // refuses is checked on the cluster below); every refusal a 403 with its own message.
    let validations = policy["spec"]["validations"].as_array().expect("validations");
    assert_eq!(validations.len(), 5, "{validations:?}");
    assert!(validations.iter().all(|v| v["reason"] == "Forbidden" && v["messageExpression"].is_string()));
    let vap_binding = one_of(agent_policies(&docs, "ValidatingAdmissionPolicyBinding"));
    assert_eq!(vap_binding["spec"], json!({"policyName": AGENT, "validationActions": ["Deny"]}));
    // The report's policy: its own node's report, owned by that Node.
    let report_policy = one_of(report_policies(&docs, "ValidatingAdmissionPolicy"));
    assert_eq!(
        report_policy["spec"]["matchConstraints"]["resourceRules"],
        json!([{"apiGroups": ["gpu.muster.dev"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
            "resources": ["nodegpureports"]}])
    );
    assert_eq!(report_policy["spec"]["matchConditions"], policy["spec"]["matchConditions"]);
    let validations = report_policy["spec"]["validations"].as_array().expect("validations");
    assert_eq!(validations.len(), 2, "{validations:?}");
    let report_binding = one_of(report_policies(&docs, "ValidatingAdmissionPolicyBinding"));
    assert_eq!(report_binding["spec"], json!({"policyName": REPORT_POLICY, "validationActions": ["Deny"]}));

    // Off: no policy. rbac.create=false: no ClusterRole, but still the policy.
    let off = agent_render(&["--set", "nodeAgent.admissionPolicy.enabled=false"]);
    assert!(agent_policies(&off, "ValidatingAdmissionPolicy").is_empty());
    assert!(agent_policies(&off, "ValidatingAdmissionPolicyBinding").is_empty());
    assert!(report_policies(&off, "ValidatingAdmissionPolicy").is_empty());
    let no_rbac = agent_render(&["--set", "rbac.create=false"]);
    assert!(of_kind(&no_rbac, "ClusterRole").is_empty());
    assert_eq!(agent_policies(&no_rbac, "ValidatingAdmissionPolicy").len(), 1);
    assert_eq!(report_policies(&no_rbac, "ValidatingAdmissionPolicy").len(), 1);
}

/// Every rendering of the DaemonSet's arguments parses with `muster node-agent`'s command line.
#[test]
fn node_agent_arguments_parse_with_musters_command_line() {
    use clap::Parser;
    let full = chart_dir().join("ci/full-values.yaml").display().to_string();
    for docs in [agent_render(&[]), render(NS, &["-f", &full])] {
        let mut argv = vec!["muster".to_string()];
        argv.extend(container_args(one(&docs, "DaemonSet")).into_iter().map(|a| a.replace("$(NODE_NAME)", "gpu-0")));
        if let Err(e) = muster::cli::Cli::try_parse_from(&argv) {
            panic!("muster does not accept the DaemonSet's arguments {argv:?}:\n{e}");
        }
    }
}

/// Label of the kwok nodes of this test (its release's nodeSelector).
const NODE_LABEL: &str = "e2e.muster.dev/node-agent";

/// Deletes the test's nodes when dropped.
struct Nodes(Vec<String>);

impl Drop for Nodes {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = cluster().kubectl(&["delete", "node", n, "--wait=false", "--ignore-not-found"]);
        }
    }
}

fn add_nodes(specs: &[FakeGpuNodes]) -> Nodes {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let mut names = Vec::new();
    for spec in specs {
        names.extend(rt.block_on(add_gpu_nodes(spec)));
    }
    for n in &names {
        // GPU pools' usual taint: no other test's pod lands here; the agent tolerates it.
        kubectl(&["taint", "node", n, "nvidia.com/gpu=present:NoSchedule", "--overwrite"]);
    }
    Nodes(names)
}

fn json_of(out: String) -> Value {
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn annotation(node: &str, key: &str) -> Option<String> {
    let node = json_of(kubectl(&["get", "node", node, "-o", "json"]));
    node["metadata"]["annotations"][key].as_str().map(str::to_string)
}

/// A token of the agent's ServiceAccount bound to `pod` (name, uid), in a kubeconfig of its own.
fn bound_kubeconfig(ns: &str, pod: &str, uid: &str) -> std::path::PathBuf {
    let token = kubectl(&[
        "create",
        "token",
        AGENT,
        "-n",
        ns,
        "--bound-object-kind=Pod",
        &format!("--bound-object-name={pod}"),
        &format!("--bound-object-uid={uid}"),
        "--duration=1h",
    ]);
    token_kubeconfig(&format!("{ns}-{pod}"), AGENT, &token)
}

/// The uuid of the first GPU of a topology annotation value.
fn first_uuid(topology: &str) -> String {
    let v: Value = serde_json::from_str(topology.trim()).unwrap_or_else(|e| panic!("{e}: {topology}"));
    v["gpus"][0]["uuid"].as_str().unwrap_or_else(|| panic!("no uuid in {topology}")).to_string()
}

/// `muster node-agent` (this build) with `kubeconfig` and `args`: (success, stdout, stderr).
fn agent(kubeconfig: Option<&Path>, args: &[&str]) -> (bool, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_muster"));
    cmd.arg("node-agent").args(args).env_remove("NODE_NAME").env_remove("MUSTER_LOG");
    match kubeconfig {
        Some(k) => cmd.env("KUBECONFIG", k),
        None => cmd.env_remove("KUBECONFIG"),
    };
    let out = cmd.output().unwrap_or_else(|e| panic!("muster node-agent: {e}"));
    let text = |b: &[u8]| String::from_utf8_lossy(b).to_string();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

#[test]
fn node_agent_runs_on_gpu_nodes_and_may_change_only_its_own_node() {
    let _lock = exclusive();
    let label = vec![(NODE_LABEL.to_string(), "on".to_string())];
    let gpu = FakeGpuNodes { prefix: "na-gpu-".into(), count: 2, labels: label.clone(), ..FakeGpuNodes::default() };
    // Selected by the release's nodeSelector but without a GPU: the chart's affinity keeps it out.
    let cpu = FakeGpuNodes { prefix: "na-cpu-".into(), count: 1, gpus: 0, labels: label, ..FakeGpuNodes::default() };
    let nodes = add_nodes(&[gpu, cpu]);
    let (own, other, cpu_node) = (nodes.0[0].as_str(), nodes.0[1].as_str(), nodes.0[2].as_str());

    let ns = "muster-node-agent";
    let selector = format!(r#"nodeAgent.nodeSelector={{"{NODE_LABEL}":"on"}}"#);
    let release = Release::install(&chart_dir(), ns, &["--set", "nodeAgent.enabled=true", "--set-json", &selector]);
    let status = helm_cluster(&["status", "muster", "-n", ns]).unwrap_or_else(|e| panic!("{e}"));
    assert!(status.contains(&format!("get daemonset {AGENT}")), "NOTES.txt:\n{status}");

    // One Running pod on each GPU node of the selector, none on the CPU node or the pool.
    let pods = eventually(
        "the node agent's pods Running on the 2 GPU nodes",
        TIMEOUT,
        || {
            let list = json_of(
                cluster()
                    .kubectl(&["get", "pods", "-n", ns, "-l", "app.kubernetes.io/component=node-agent", "-o", "json"])
                    .ok()?,
            );
            let pods = list["items"].as_array()?.clone();
            let running = pods.iter().filter(|p| p["status"]["phase"] == "Running").count();
            (pods.len() == 2 && running == 2).then_some(pods)
        },
        || kubectl(&["get", "pods,daemonsets", "-n", ns, "-o", "wide"]),
    );
    let on: BTreeSet<&str> = pods.iter().filter_map(|p| p["spec"]["nodeName"].as_str()).collect();
    assert_eq!(on, BTreeSet::from([own, other]), "not one pod per GPU node");
    let ds = json_of(kubectl(&["get", "daemonset", AGENT, "-n", ns, "-o", "json"]));
    assert_eq!(ds["status"]["desiredNumberScheduled"], 2, "the DaemonSet wants a pod on {cpu_node} or elsewhere");
    let pod = pods.iter().find(|p| p["spec"]["nodeName"] == own).expect("pod on the first node");
    let pod_name = pod["metadata"]["name"].as_str().expect("name");
    let pod_uid = pod["metadata"]["uid"].as_str().expect("uid");

    // The policy type-checks (validatingadmissionpolicy-status-controller runs in the cluster).
    let checked = eventually(
        "the admission policy's type checking",
        TIMEOUT,
        || {
            let p = json_of(cluster().kubectl(&["get", "validatingadmissionpolicy", AGENT, "-o", "json"]).ok()?);
            (p["status"]["observedGeneration"] == p["metadata"]["generation"]).then_some(p)
        },
        String::new,
    );
    let warnings = &checked["status"]["typeChecking"]["expressionWarnings"];
    assert!(warnings.as_array().is_none_or(|w| w.is_empty()), "CEL type warnings: {warnings}");

    // A token bound to the pod carries the node's name, as the pod's projected token does.
    let kubeconfig = bound_kubeconfig(ns, pod_name, pod_uid);
    let whoami = json_of(kubectl_as(&kubeconfig, &["auth", "whoami", "-o", "json"]).unwrap_or_else(|e| panic!("{e}")));
    let user = &whoami["status"]["userInfo"];
    eprintln!("node agent token bound to pod {pod_name}: userInfo {user}");
    assert_eq!(user["username"], format!("system:serviceaccount:{ns}:{AGENT}"));
    assert_eq!(user["extra"]["authentication.kubernetes.io/node-name"], json!([own]), "{user}");
    assert_eq!(user["extra"]["authentication.kubernetes.io/pod-name"], json!([pod_name]), "{user}");
    assert_eq!(user["extra"]["authentication.kubernetes.io/pod-uid"], json!([pod_uid]), "{user}");

    let as_agent = |args: &[&str]| kubectl_as(&kubeconfig, args);
    let merge = |node: &str, patch: Value| as_agent(&["patch", "node", node, "--type=merge", "-p", &patch.to_string()]);
    let refused = |what: &str, result: Result<String, String>, expected: &[&str]| {
        let err = result.expect_err(&format!("{what}: not refused"));
        for e in expected {
            assert!(err.contains(e), "{what}: {e:?} not in:\n{err}");
        }
    };
    // Its own Node: the topology annotation; the two an older agent wrote it may remove.
    merge(own, json!({"metadata": {"annotations": {GPU_TOPOLOGY_ANNOTATION: "{\"v\":1}"}}}))
        .unwrap_or_else(|e| panic!("patching its own node's {GPU_TOPOLOGY_ANNOTATION}: {e}"));
    assert_eq!(annotation(own, GPU_TOPOLOGY_ANNOTATION).as_deref(), Some("{\"v\":1}"));
    kubectl(&[
        "annotate",
        "node",
        own,
        &format!("{GPU_HEALTH_ANNOTATION}={{}}"),
        &format!("{GPU_ASSIGNED_ANNOTATION}={{}}"),
        "--overwrite",
    ]);
    merge(own, json!({"metadata": {"annotations": {GPU_HEALTH_ANNOTATION: null, GPU_ASSIGNED_ANNOTATION: null}}}))
        .unwrap_or_else(|e| panic!("removing the old annotations from its own node: {e}"));
    assert_eq!(annotation(own, GPU_ASSIGNED_ANNOTATION), None);
    assert_eq!(annotation(own, GPU_HEALTH_ANNOTATION), None);

    // The admission policy: another Node; labels, other annotations, spec of its own. The API
    // server starts enforcing a new policy binding a moment after the policy type-checks (its
    // admission plugin syncs them from an informer), so the first refusal is waited for.
    let policy = format!("ValidatingAdmissionPolicy '{AGENT}'");
    let first = eventually(
        "the admission policy in force",
        TIMEOUT,
        || merge(other, json!({"metadata": {"annotations": {GPU_ASSIGNED_ANNOTATION: "{}"}}})).err(),
        || format!("{AGENT} could still patch Node {other}"),
    );
    refused(
        "another node",
        Err(first),
        &[&policy, &format!("may not change Node {other}"), &format!("bound to a pod on node {own}")],
    );
    refused(
        "a label",
        as_agent(&["label", "node", own, "gpu.muster.dev/bad=1"]),
        &[&policy, "may not change the labels gpu.muster.dev/bad", GPU_TOPOLOGY_ANNOTATION],
    );
    refused(
        "removing a label",
        as_agent(&["label", "node", own, &format!("{NODE_LABEL}-")]),
        &[&policy, &format!("the labels {NODE_LABEL}")],
    );
    refused(
        "another annotation",
        as_agent(&["annotate", "node", own, "example.com/other=1"]),
        &[&policy, "may not change the annotations example.com/other"],
    );
    refused(
        "removing kwok's annotation",
        as_agent(&["annotate", "node", own, "kwok.x-k8s.io/node-"]),
        &[&policy, "annotations kwok.x-k8s.io/node"],
    );
    refused(
        "writing an old annotation",
        merge(own, json!({"metadata": {"annotations": {GPU_HEALTH_ANNOTATION: "{}"}}})),
        &[&policy, &format!("may not change the annotations {GPU_HEALTH_ANNOTATION}")],
    );
    refused("cordoning", merge(own, json!({"spec": {"unschedulable": true}})), &[&policy, "the spec of Node"]);
    refused("removing the taint", as_agent(&["taint", "node", own, "nvidia.com/gpu-"]), &[&policy, "the spec of Node"]);
    refused(
        "a finalizer",
        merge(own, json!({"metadata": {"finalizers": ["example.com/keep"]}})),
        &[&policy, "finalizers"],
    );
    // Its NodeGPUReport: its own node's, owned by that Node; not another node's, not one
    // without its owner.
    let report_policy = format!("ValidatingAdmissionPolicy '{REPORT_POLICY}'");
    let uid_of = |node: &str| kubectl(&["get", "node", node, "-o", "jsonpath={.metadata.uid}"]);
    let report = |node: &str, owner: Option<&str>| {
        let owners: Vec<Value> = owner
            .map(|o| json!({"apiVersion": "v1", "kind": "Node", "name": o, "uid": uid_of(o).trim()}))
            .into_iter()
            .collect();
        json!({"apiVersion": "gpu.muster.dev/v1alpha1", "kind": "NodeGPUReport",
            "metadata": {"name": node, "ownerReferences": owners},
            "spec": {"assigned": {"version": 2, "resource": "nvidia.com/gpu", "pods": {}}}})
        .to_string()
    };
    let apply = |body: String| {
        kubectl_as_stdin(
            &kubeconfig,
            &["apply", "--server-side", "--field-manager=muster-node-agent", "-f", "-"],
            &body,
        )
    };
    let first = eventually(
        "the report policy in force",
        TIMEOUT,
        || apply(report(other, Some(other))).err(),
        || format!("{AGENT} could still write the NodeGPUReport of {other}"),
    );
    refused(
        "another node's report",
        Err(first),
        &[&report_policy, &format!("may not write NodeGPUReport {other}"), &format!("bound to a pod on node {own}")],
    );
    refused(
        "its report without the owner",
        apply(report(own, None)),
        &[&report_policy, &format!("must be owned by Node {own}")],
    );
    refused(
        "its report owned by another node",
        apply(report(own, Some(other))),
        &[&report_policy, &format!("must be owned by Node {own}")],
    );
    apply(report(own, Some(own))).unwrap_or_else(|e| panic!("writing its own node's report: {e}"));
    apply(report(own, Some(own))).unwrap_or_else(|e| panic!("writing its own node's report again: {e}"));
    refused("deleting its report", as_agent(&["delete", "nodegpureport", own, "--dry-run=server"]), &["Forbidden"]);

    // A token of the same ServiceAccount that is not bound to a pod may change no Node.
    let unbound = token_kubeconfig(
        &format!("{ns}-unbound"),
        AGENT,
        &kubectl(&["create", "token", AGENT, "-n", ns, "--duration=1h"]),
    );
    refused(
        "an unbound token",
        kubectl_as(&unbound, &["annotate", "node", own, &format!("{GPU_ASSIGNED_ANNOTATION}=1"), "--overwrite"]),
        &[&policy, "not bound to a pod on a node"],
    );

    // Its Node it may read. RBAC refuses the rest, pods included: not even those of its node
    // (what kubelet reports names them; muster joins the names to its pods), nor its own.
    as_agent(&["get", "node", own]).unwrap_or_else(|e| panic!("{e}"));
    let rbac = |what: &str, result: Result<String, String>| {
        refused(what, result, &["Forbidden", &format!("system:serviceaccount:{ns}:{AGENT}\" cannot")]);
    };
    rbac("listing every pod", as_agent(&["get", "pods", "-A"]));
    rbac(
        "listing the pods of its node",
        as_agent(&["get", "pods", "-A", "--field-selector", &format!("spec.nodeName={own}"), "-o", "name"]),
    );
    rbac("reading its own pod", as_agent(&["get", "pod", pod_name, "-n", ns]));
    let who = format!("--as=system:serviceaccount:{ns}:{AGENT}");
    let can_i = |verb: &str, resource: &str| cluster().kubectl(&["auth", "can-i", &who, verb, resource, "-A"]);
    // `kubectl auth can-i` answers yes with status 0 and no with status 1: the question is asked
    // right (patch nodes: yes), and list pods is a no, for the ServiceAccount and its token.
    assert_eq!(can_i("patch", "nodes").map(|a| a.trim().to_string()), Ok("yes".to_string()));
    assert!(can_i("list", "pods").is_err(), "kubectl auth can-i list pods {who}: yes");
    assert!(can_i("get", "pods").is_err(), "kubectl auth can-i get pods {who}: yes");
    let asked = as_agent(&["auth", "can-i", "list", "pods", "-A"]);
    assert!(asked.is_err(), "the agent's bound token may list pods: {asked:?}");
    rbac("patching a pod", as_agent(&["annotate", "pod", pod_name, "-n", ns, "x=y"]));
    rbac("reading secrets", as_agent(&["get", "secrets", "-n", ns]));
    rbac("reading secrets anywhere", as_agent(&["get", "secrets", "-A"]));
    rbac("listing nodes", as_agent(&["get", "nodes"]));
    rbac("deleting its node", as_agent(&["delete", "node", own, "--dry-run=server"]));
    rbac(
        "creating a node",
        kubectl_as_stdin(
            &kubeconfig,
            &["create", "--dry-run=server", "-f", "-"],
            r#"{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "na-evil"}}"#,
        ),
    );
    rbac(
        "patching its node's status",
        as_agent(&[
            "patch",
            "node",
            own,
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"capacity":{"nvidia.com/gpu":"16"}}}"#,
        ]),
    );
    for (verb, resource) in
        [("watch", "pods"), ("create", "pods"), ("delete", "pods"), ("update", "nodes"), ("watch", "nodes")]
    {
        assert!(can_i(verb, resource).is_err(), "the node agent may {verb} {resource}");
    }

    // The real agent with that token publishes the topology of its node, and nothing of another.
    let fixtures = repo().join("tests/fixtures/nvidia-smi");
    let topo = fixtures.join("dgx1-v100-topo.txt").display().to_string();
    let query = fixtures.join("dgx1-v100-query.csv").display().to_string();
    // No kubelet and no NVML here: the agent reads the nvidia-smi text only.
    let files = vec![
        "--topo-file",
        topo.as_str(),
        "--query-file",
        query.as_str(),
        "--no-pod-resources",
        "--no-health",
        "--nvml",
        "off",
    ];
    let mut print = vec!["--print"];
    print.extend_from_slice(&files);
    let (ok, expected, err) = agent(None, &print);
    assert!(ok, "muster node-agent --print: {err}");
    // On its own node it also reads a (fake) kubelet that gave its pod a GPU, and reports that
    // by the pod's namespace/name, with no grant on pods.
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("kubelet.sock");
    let kubelet = rt.block_on(FakeKubelet::start(&socket)).unwrap_or_else(|e| panic!("fake kubelet: {e:#}"));
    let gpu = ResourceDevices { resource: "nvidia.com/gpu".into(), ids: vec![first_uuid(&expected)] };
    let container = ContainerDevices { name: "main".into(), devices: vec![gpu.clone()] };
    let given = PodDevices { namespace: ns.into(), name: pod_name.into(), containers: vec![container] };
    kubelet.set_pods(vec![given]);
    let socket_flag = socket.display().to_string();
    let mut on_own = vec!["--node-name", own, "--pod-resources-socket", &socket_flag];
    on_own.extend(files.iter().copied().filter(|f| *f != "--no-pod-resources"));
    let (ok, _, err) = agent(Some(&kubeconfig), &on_own);
    assert!(ok, "muster node-agent with the bound token on {own}: {err}");
    assert!(!err.contains("PodResources"), "the agent's PodResources report failed: {err}");
    assert_eq!(kubelet.calls().list, 1, "the agent asked kubelet once");
    drop(kubelet);
    assert_eq!(annotation(own, GPU_TOPOLOGY_ANNOTATION).as_deref(), Some(expected.trim()));
    assert_eq!(annotation(own, GPU_ASSIGNED_ANNOTATION), None, "assignments go to the NodeGPUReport");
    let written = json_of(kubectl(&["get", "nodegpureport", own, "-o", "json"]));
    assert_eq!(written["metadata"]["ownerReferences"][0]["uid"].as_str(), Some(uid_of(own).trim()));
    let assigned = written["spec"]["assigned"].clone();
    let report =
        AssignedAnnotation::parse_value(&assigned, "spec.assigned").unwrap_or_else(|e| panic!("{e}: {assigned}"));
    let key = pod_key(ns, pod_name);
    assert_eq!(report.pods.keys().collect::<Vec<_>>(), [&key], "{assigned}");
    assert_eq!(report.pods[&key].devices, gpu.ids, "{assigned}");
    let mut on_other = vec!["--node-name", other];
    on_other.extend_from_slice(&files);
    let before = annotation(other, GPU_TOPOLOGY_ANNOTATION);
    let (ok, _, err) = agent(Some(&kubeconfig), &on_other);
    assert!(!ok && err.contains(&format!("bound to a pod on node {own}")), "the agent annotated {other}: {err}");
    eprintln!("muster node-agent --node-name {other} with the token of {own}'s pod: {}", err.trim());
    assert_eq!(annotation(other, GPU_TOPOLOGY_ANNOTATION), before);

    drop(release);
    drop(nodes);
}

//! The lane's stages. Each returns its figures (one line each) or why it failed.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use muster::scheduler::{parse_milli_value, parse_value};
use serde_json::{Value, json};

use crate::node::{
    BUSYBOX, GPUS, Lane, MUSTER_TAG, MUSTER_TAG_REBUILT, NAMESPACE, NODE, NODE_LABEL, PROBE, out_dir, probe_config_map,
    repo, wait,
};

const RELEASE: &str = "muster";
const LEASE: &str = "muster-controller-manager";
const ADMISSION_GATE: &str = "scheduling.muster.dev/admission";
const INDICES: &str = "gpu.muster.dev/indices";
/// The node agent's report of what kubelet gave each pod: `spec.assigned` of its node's
/// NodeGPUReport (the Node's `gpu.muster.dev/assigned` annotation before).
const ASSIGNED: &str = "NodeGPUReport spec.assigned";
const TOPOLOGY: &str = "gpu.muster.dev/topology";
/// Namespaces of the lane's jobs.
const JOBS_NS: &str = "real-jobs";
const EXAMPLES_NS: &str = "real-examples";
const FAILOVER_NS: &str = "real-failover";

fn items(v: &Value) -> Vec<Value> {
    v["items"].as_array().cloned().unwrap_or_default()
}

fn name(v: &Value) -> String {
    v["metadata"]["name"].as_str().unwrap_or_default().to_string()
}

/// The probe's UUID of each GPU index.
fn probe_uuids() -> Result<BTreeMap<String, u32>, String> {
    let text = std::fs::read_to_string(repo().join(PROBE)).map_err(|e| format!("{PROBE}: {e}"))?;
    let probe: Value = serde_json::from_str(&text).map_err(|e| format!("{PROBE}: {e}"))?;
    Ok(probe["gpus"]
        .as_array()
        .map(|gpus| {
            gpus.iter()
                .filter_map(|g| Some((g["uuid"].as_str()?.to_string(), u32::try_from(g["index"].as_u64()?).ok()?)))
                .collect()
        })
        .unwrap_or_default())
}

/// The controller manager's pods (owned by a ReplicaSet) and the node agent's (a DaemonSet).
fn muster_pods(lane: &Lane) -> Result<(Vec<Value>, Vec<Value>), String> {
    let pods = items(&lane.json(&["-n", NAMESPACE, "get", "pods"])?);
    let owned_by = |p: &Value, kind: &str| {
        p["metadata"]["ownerReferences"].as_array().is_some_and(|o| o.iter().any(|r| r["kind"] == kind))
    };
    let managers = pods.iter().filter(|p| owned_by(p, "ReplicaSet")).cloned().collect();
    let agents = pods.iter().filter(|p| owned_by(p, "DaemonSet")).cloned().collect();
    Ok((managers, agents))
}

fn ready(pod: &Value) -> bool {
    pod["metadata"]["deletionTimestamp"].is_null()
        && pod["status"]["conditions"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

fn lease_holder(lane: &Lane) -> Result<Option<String>, String> {
    match lane.json(&["-n", NAMESPACE, "get", "lease", LEASE]) {
        Ok(l) => Ok(l["spec"]["holderIdentity"].as_str().filter(|h| !h.is_empty()).map(str::to_string)),
        Err(e) if e.contains("NotFound") || e.contains("not found") => Ok(None),
        Err(e) => Err(e),
    }
}

fn values_file() -> Result<std::path::PathBuf, String> {
    let (key, value) = NODE_LABEL;
    let path = out_dir().join("values.yaml");
    // As a user with a local image and one real GPU node would write it; the node agent
    // replays the recorded probe (no GPU driver on this machine) and reads the real kubelet.
    let text = format!(
        r#"image:
  repository: localhost/muster
  tag: {MUSTER_TAG}
  pullPolicy: Never
replicaCount: 2
nodeSelector:
  {key}: "{value}"
nodeAgent:
  enabled: true
  intervalSeconds: 2
  # The kwok GPU nodes beside it are fakes: no kubelet to read.
  nodeSelector:
    {key}: "{value}"
  extraArgs: [--probe-file=/probe/probe.json]
  extraVolumes:
    - name: probe-file
      configMap: {{name: muster-probe}}
  extraVolumeMounts:
    - {{name: probe-file, mountPath: /probe, readOnly: true}}
"#
    );
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// `helm install` as a user runs it; then both replicas Ready on the real node, one of them
/// leader, the webhook configurations with the caBundle muster injected, the node agent Ready.
pub fn install(lane: &Lane) -> Result<String, String> {
    probe_config_map(lane, NAMESPACE)?;
    let values = values_file()?;
    let chart = repo().join("charts/muster");
    let began = Instant::now();
    lane.helm(&[
        "install",
        RELEASE,
        chart.to_str().ok_or("chart path")?,
        "-n",
        NAMESPACE,
        "-f",
        values.to_str().ok_or("values path")?,
        "--wait",
        "--timeout",
        "240s",
    ])?;
    let installed = began.elapsed().as_secs_f64();
    let (managers, agents) = wait("2 muster replicas and the node agent Ready", Duration::from_secs(120), || {
        let (m, a) = muster_pods(lane)?;
        let ok = m.iter().filter(|p| ready(p)).count() == 2 && a.iter().filter(|p| ready(p)).count() == 1;
        Ok(if ok { Ok((m, a)) } else { Err(format!("{} managers, {} agents", m.len(), a.len())) })
    })?;
    for p in managers.iter().chain(&agents) {
        if p["spec"]["nodeName"] != NODE {
            return Err(format!("pod {} runs on {}, not the real node", name(p), p["spec"]["nodeName"]));
        }
    }
    let names: Vec<String> = managers.iter().map(name).collect();
    let leader = wait("a leader among the replicas", Duration::from_secs(60), || {
        let holder = lease_holder(lane)?;
        Ok(match holder {
            Some(h) if names.iter().any(|n| h.contains(n.as_str())) => Ok(h),
            other => Err(format!("holder {other:?}")),
        })
    })?;
    let validating = lane.json(&["get", "validatingwebhookconfiguration", "muster-validating"])?;
    let injected = validating["webhooks"].as_array().is_some_and(|w| {
        !w.is_empty() && w.iter().all(|w| w["clientConfig"]["caBundle"].as_str().is_some_and(|c| !c.is_empty()))
    });
    if !injected {
        return Err("muster-validating has a webhook without a caBundle".into());
    }
    let image_id = managers[0]["status"]["containerStatuses"][0]["imageID"].as_str().unwrap_or_default().to_string();
    Ok(format!(
        "helm install --wait: {installed:.1}s; replicas {} on {NODE}; leader {leader}; node agent {}; image {image_id}",
        names.join(", "),
        agents.iter().map(name).collect::<Vec<_>>().join(", ")
    ))
}

/// A MusterJob as the lane writes them: on the real node, busybox printing what it was given.
fn job(name: &str, pods: u32, gpus: u32, exit: i32, sleep_s: u32, extra_spec: Value) -> Value {
    let (key, value) = NODE_LABEL;
    let script = format!(
        "echo MUSTER_GPU_INDICES=$MUSTER_GPU_INDICES; echo NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES; sleep {sleep_s}; exit {exit}"
    );
    let mut spec = json!({
        "parallelism": pods,
        "completions": pods,
        "backoffLimit": 0,
        "template": {"spec": {
            "restartPolicy": "Never",
            "nodeSelector": {key: value},
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "work",
                "image": BUSYBOX,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"nvidia.com/gpu": gpus}},
            }],
        }},
        "scheduling": {"schedulingPolicy": {"gang": {"minCount": pods}}},
    });
    if let (Some(s), Some(extra)) = (spec.as_object_mut(), extra_spec.as_object()) {
        for (k, v) in extra {
            s.insert(k.clone(), v.clone());
        }
    }
    json!({"apiVersion": "batch.muster.dev/v1alpha1", "kind": "MusterJob", "metadata": {"name": name}, "spec": spec})
}

/// Applies `objects`; retried for up to 30 s while the API server answers 503 because its
/// MutatingAdmissionPolicy cannot type muster's kinds yet (the first seconds after the CRDs
/// appear; docs/src/operations/failure-modes.md), as a user would retry.
fn apply_in(lane: &Lane, namespace: &str, objects: &[Value]) -> Result<String, String> {
    let text: Vec<String> = objects.iter().map(|o| serde_json::to_string(o).unwrap_or_default()).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let result = lane.cluster.kubectl_stdin(
            &["apply", "--server-side", "--field-manager=muster-e2e-real", "-n", namespace, "-f", "-"],
            Some(&text.join("\n")),
        );
        match result {
            Err(e) if e.contains(crate::harness::CRDS_NOT_TYPED) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_secs(1))
            }
            other => return other,
        }
    }
}

fn ensure_namespace(lane: &Lane, namespace: &str) -> Result<(), String> {
    if lane.kubectl(&["get", "namespace", namespace]).is_err() {
        lane.kubectl(&["create", "namespace", namespace])?;
    }
    wait("the namespace's default ServiceAccount", Duration::from_secs(30), || {
        Ok(lane.kubectl(&["-n", namespace, "get", "serviceaccount", "default"]).map(drop))
    })
}

/// The webhooks as the apiserver calls them: through their Service (endpoints on the bridge)
/// with the chart's certificate. The validating one refuses what only it checks (the reserved
/// admission gate in a template) at its field and lets a good gang through; the mutating one
/// gates a pod that joins a PodGroup by its label.
pub fn webhooks(lane: &Lane) -> Result<String, String> {
    ensure_namespace(lane, JOBS_NS)?;
    let mut bad = job("bad-gang", 2, 1, 0, 0, json!({}));
    bad["spec"]["template"]["spec"]["schedulingGates"] = json!([{"name": ADMISSION_GATE}]);
    let refused = match apply_in(lane, JOBS_NS, &[bad]) {
        Ok(out) => return Err(format!("a template with muster's admission gate was accepted: {out}")),
        Err(e) => e,
    };
    let field = "spec.template.spec.schedulingGates";
    // muster's webhook answers with a structured Invalid status (the field and its message,
    // not the webhook's name); only muster's validation says this (the CRD schema cannot).
    if !(refused.contains(field) && refused.contains(&format!("{ADMISSION_GATE} is added by muster"))) {
        return Err(format!("the refusal is not the validating webhook's at {field}: {refused}"));
    }
    let good = job("good-gang", 2, 1, 0, 0, json!({}));
    lane.cluster.kubectl_stdin(
        &["apply", "--dry-run=server", "-n", JOBS_NS, "-f", "-"],
        Some(&serde_json::to_string(&good).map_err(|e| e.to_string())?),
    )?;
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "joins-a-group", "labels": {"scheduling.muster.dev/pod-group": "by-hand"}},
        "spec": {"containers": [{"name": "c", "image": BUSYBOX, "imagePullPolicy": "Never"}]}});
    let created: Value = serde_json::from_str(&lane.cluster.kubectl_stdin(
        &["create", "--dry-run=server", "-o", "json", "-n", JOBS_NS, "-f", "-"],
        Some(&pod.to_string()),
    )?)
    .map_err(|e| e.to_string())?;
    let gates: Vec<&str> = created["spec"]["schedulingGates"]
        .as_array()
        .map(|g| g.iter().filter_map(|g| g["name"].as_str()).collect())
        .unwrap_or_default();
    if gates != [ADMISSION_GATE] {
        return Err(format!(
            "a pod labelled with a PodGroup got gates {gates:?} from the mutating webhook, want [{ADMISSION_GATE}]"
        ));
    }
    let endpoints =
        lane.json(&["-n", NAMESPACE, "get", "endpointslices", "-l", "kubernetes.io/service-name=muster-webhook"])?;
    let addresses: Vec<String> = items(&endpoints)
        .iter()
        .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
        .flat_map(|e| e["addresses"].as_array().cloned().unwrap_or_default())
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect();
    let line = refused.lines().find(|l| l.contains(field)).unwrap_or(&refused).trim().to_string();
    Ok(format!("webhook Service endpoints {addresses:?}; refused: {line}; a labelled pod was gated {gates:?}"))
}

/// The node agent's topology (from the probe) on the real Node.
pub fn node_agent(lane: &Lane) -> Result<String, String> {
    let uuids = probe_uuids()?;
    wait("the node agent's topology annotation", Duration::from_secs(60), || {
        let node = lane.json(&["get", "node", NODE])?;
        let Some(text) = node["metadata"]["annotations"][TOPOLOGY].as_str() else {
            return Ok(Err("no topology annotation".into()));
        };
        let topology: Value = serde_json::from_str(text).map_err(|e| format!("{TOPOLOGY}: {e}"))?;
        let got: BTreeSet<String> = topology["gpus"]
            .as_array()
            .map(|g| g.iter().filter_map(|g| g["uuid"].as_str().map(str::to_string)).collect())
            .unwrap_or_default();
        let want: BTreeSet<String> = uuids.keys().cloned().collect();
        Ok(if got == want { Ok(()) } else { Err(format!("topology GPUs {got:?}")) })
    })?;
    let node = lane.json(&["get", "node", NODE])?;
    Ok(format!(
        "{NODE}: {GPUS} GPUs in {TOPOLOGY}; allocatable nvidia.com/gpu {} (device plugin)",
        node["status"]["allocatable"]["nvidia.com/gpu"]
    ))
}

/// What one pod of a finished job showed.
struct PodTruth {
    pod: String,
    exit: i64,
    /// MUSTER_GPU_INDICES as the container saw it at start (muster's choice).
    env_indices: BTreeSet<u32>,
    /// NVIDIA_VISIBLE_DEVICES from the device plugin's Allocate: what kubelet chose.
    kubelet: BTreeSet<u32>,
    /// What the node agent read from kubelet's PodResources.
    agent: Option<BTreeSet<u32>>,
    /// The pod's gpu.muster.dev/indices at the end (muster's ledger after the agent's report).
    annotation: BTreeSet<u32>,
}

fn parse_indices(s: &str) -> BTreeSet<u32> {
    s.split(',').filter_map(|i| i.trim().parse().ok()).collect()
}

fn condition(obj: &Value, kind: &str) -> bool {
    obj["status"]["conditions"].as_array().is_some_and(|c| c.iter().any(|c| c["type"] == kind && c["status"] == "True"))
}

/// Gangs on the real node: one whose pods exit 0 (the MusterJob completes), one whose pods
/// exit 3 (it fails, backoffLimit 0); what kubelet gave each container against muster's indices.
pub fn gang_jobs(lane: &Lane) -> Result<String, String> {
    ensure_namespace(lane, JOBS_NS)?;
    let uuids = probe_uuids()?;
    apply_in(lane, JOBS_NS, &[job("gang-ok", 2, 2, 0, 15, json!({})), job("gang-fail", 2, 1, 3, 15, json!({}))])?;
    // While they run: the node agent's report of kubelet's PodResources.
    let mut agent: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
    let to_indices = |devices: &Value| -> BTreeSet<u32> {
        devices
            .as_array()
            .map(|d| d.iter().filter_map(|u| uuids.get(u.as_str()?).copied()).collect())
            .unwrap_or_default()
    };
    wait("both jobs to finish", Duration::from_secs(180), || {
        // The report appears with the agent's first round; until then there is nothing to read.
        if let Ok(report) = lane.json(&["get", "nodegpureports.gpu.muster.dev", NODE]) {
            let assigned = &report["spec"]["assigned"];
            if !assigned.is_null() && !assigned.is_object() {
                return Err(format!("{ASSIGNED} is not an object: {assigned}"));
            }
            if let Some(pods) = assigned["pods"].as_object() {
                for (key, entry) in pods {
                    if let Some(pod) = key.strip_prefix(&format!("{JOBS_NS}/")) {
                        agent.insert(pod.to_string(), to_indices(&entry["devices"]));
                    }
                }
            }
        }
        let ok = lane.json(&["-n", JOBS_NS, "get", "musterjob", "gang-ok"])?;
        let failed = lane.json(&["-n", JOBS_NS, "get", "musterjob", "gang-fail"])?;
        let done = condition(&ok, "Complete") && condition(&failed, "Failed");
        Ok(if done { Ok(()) } else { Err(format!("gang-ok {}, gang-fail {}", ok["status"], failed["status"])) })
    })?;
    let pods = items(&lane.json(&["-n", JOBS_NS, "get", "pods"])?);
    let mut truths = Vec::new();
    for p in &pods {
        let pod = name(p);
        // gang-fail's failure deletes its other pod (below): one listed while being deleted
        // may be gone before its log is read, and was stopped, not ended by its script.
        let deleting = pod.starts_with("gang-fail") && !p["metadata"]["deletionTimestamp"].is_null();
        let exit = p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"].as_i64().unwrap_or(-1);
        let log = match lane.kubectl(&["-n", JOBS_NS, "logs", &pod]) {
            Ok(log) if !deleting => log,
            Ok(_) => continue,
            Err(e) if pod.starts_with("gang-fail") && e.contains("NotFound") => continue,
            Err(e) => return Err(e),
        };
        let value =
            |key: &str| log.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix('=')).unwrap_or("").to_string();
        let kubelet: BTreeSet<u32> = value("NVIDIA_VISIBLE_DEVICES")
            .split(',')
            .filter(|u| !u.is_empty())
            .map(|u| uuids.get(u).copied().ok_or_else(|| format!("{pod}: device {u} is not in the probe")))
            .collect::<Result<_, _>>()?;
        truths.push(PodTruth {
            env_indices: parse_indices(&value("MUSTER_GPU_INDICES")),
            kubelet,
            agent: agent.get(&pod).cloned(),
            annotation: parse_indices(p["metadata"]["annotations"][INDICES].as_str().unwrap_or("")),
            exit,
            pod,
        });
    }
    let mut lines = Vec::new();
    let mut errors = Vec::new();
    let mut given: BTreeMap<u32, String> = BTreeMap::new();
    for t in &truths {
        let want_exit = if t.pod.starts_with("gang-ok") { 0 } else { 3 };
        if t.exit != want_exit {
            errors.push(format!("{} exited {} (its script exits {want_exit})", t.pod, t.exit));
        }
        if t.agent.as_ref() != Some(&t.kubelet) {
            errors.push(format!(
                "{}: the node agent read {:?} from PodResources, the container got {:?}",
                t.pod, t.agent, t.kubelet
            ));
        }
        if t.annotation != t.kubelet {
            errors.push(format!("{}: {INDICES} is {:?} at the end, kubelet gave {:?}", t.pod, t.annotation, t.kubelet));
        }
        for i in &t.kubelet {
            if let Some(other) = given.insert(*i, t.pod.clone()) {
                errors.push(format!("GPU {i} given to {other} and {}", t.pod));
            }
        }
        lines.push(format!(
            "{}: exit {}, muster chose {:?} (MUSTER_GPU_INDICES), kubelet gave {:?}, agent read {:?}, final {INDICES} {:?}{}",
            t.pod,
            t.exit,
            t.env_indices,
            t.kubelet,
            t.agent,
            t.annotation,
            if t.env_indices == t.kubelet { "" } else { " (MUSTER_GPU_INDICES differs from kubelet's choice)" }
        ));
    }
    // gang-fail's first failure fails the job (backoffLimit 0), which may delete its other pod
    // before that one exits: at least one of its pods is left, both of gang-ok's.
    let ok_pods = truths.iter().filter(|t| t.pod.starts_with("gang-ok")).count();
    let fail_pods = truths.iter().filter(|t| t.pod.starts_with("gang-fail")).count();
    if ok_pods != 2 || fail_pods == 0 {
        errors.push(format!("{ok_pods} pods of gang-ok (want 2), {fail_pods} of gang-fail (want 1 or 2)"));
    }
    let agree = truths.iter().filter(|t| t.env_indices == t.kubelet).count();
    lines.push(format!("muster's choice = kubelet's for {agree} of {} pods", truths.len()));
    if errors.is_empty() { Ok(lines.join("\n")) } else { Err(format!("{}\n{}", errors.join("\n"), lines.join("\n"))) }
}

/// Requests of one container list (cpu millicores, memory bytes, GPUs).
fn requests(containers: &Value) -> (i64, i64, i64) {
    let mut total = (0, 0, 0);
    for c in containers.as_array().cloned().unwrap_or_default() {
        let r = &c["resources"];
        let get = |k: &str| r["requests"][k].as_str().or(r["limits"][k].as_str()).map(str::to_string);
        total.0 += get("cpu").map(|q| quantity(&q, true)).unwrap_or(0);
        total.1 += get("memory").map(|q| quantity(&q, false)).unwrap_or(0);
        total.2 += r["limits"]["nvidia.com/gpu"]
            .as_i64()
            .or_else(|| r["limits"]["nvidia.com/gpu"].as_str().and_then(|s| s.parse().ok()))
            .unwrap_or(0);
    }
    total
}

/// A Kubernetes quantity: cpu in millicores, memory in bytes (muster's own parser; 0 when it
/// does not parse).
fn quantity(q: &str, cpu: bool) -> i64 {
    let parsed = if cpu { parse_milli_value(q) } else { parse_value(q) };
    parsed.unwrap_or(0)
}

/// The pod specs of an example (path in the object, pods of that spec).
fn pod_specs(obj: &Value) -> Vec<(Vec<String>, i64)> {
    match obj["kind"].as_str() {
        Some("MusterJob") => vec![(
            vec!["spec".into(), "template".into(), "spec".into()],
            obj["spec"]["parallelism"].as_i64().unwrap_or(1),
        )],
        Some("MusterJobSet") => obj["spec"]["replicatedJobs"]
            .as_array()
            .map(|jobs| {
                jobs.iter()
                    .enumerate()
                    .map(|(i, j)| {
                        let pods = j["replicas"].as_i64().unwrap_or(1)
                            * j["template"]["spec"]["parallelism"].as_i64().unwrap_or(1);
                        let path = ["spec", "replicatedJobs", &i.to_string(), "template", "spec", "template", "spec"]
                            .map(str::to_string)
                            .to_vec();
                        (path, pods)
                    })
                    .collect()
            })
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

fn at<'a>(v: &'a mut Value, path: &[String]) -> &'a mut Value {
    path.iter().fold(v, |v, k| match k.parse::<usize>() {
        Ok(i) if v.is_array() => &mut v[i],
        _ => &mut v[k.as_str()],
    })
}

/// The node's free cpu (millicores), memory and GPUs: allocatable less the requests of its
/// pods that have not finished.
fn free_on_node(lane: &Lane) -> Result<(i64, i64, i64), String> {
    let node = lane.json(&["get", "node", NODE])?;
    let a = &node["status"]["allocatable"];
    let mut free = (
        quantity(a["cpu"].as_str().unwrap_or("0"), true),
        quantity(a["memory"].as_str().unwrap_or("0"), false),
        a["nvidia.com/gpu"].as_str().and_then(|s| s.parse().ok()).unwrap_or(0),
    );
    let pods = items(&lane.json(&["get", "pods", "-A", "--field-selector", &format!("spec.nodeName={NODE}")])?);
    for p in pods {
        if matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed")) {
            continue;
        }
        let (c, m, g) = requests(&p["spec"]["containers"]);
        free = (free.0 - c, free.1 - m, free.2 - g);
    }
    Ok(free)
}

/// Every MusterJob and MusterJobSet of examples/ whose pods fit the real node's free capacity,
/// with busybox for its image and a script that prints its GPU indices, placed there and run
/// to completion; the others are named with what they need.
pub fn examples(lane: &Lane) -> Result<String, String> {
    ensure_namespace(lane, EXAMPLES_NS)?;
    let (key, value) = NODE_LABEL;
    let node = lane.json(&["get", "node", NODE])?;
    let mut entries: Vec<_> = std::fs::read_dir(repo().join("examples"))
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    entries.sort();
    let mut placed = Vec::new();
    let mut lines = Vec::new();
    for path in entries {
        let file = path.file_name().map(|f| f.to_string_lossy().to_string()).unwrap_or_default();
        let text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text).map_err(|e| format!("{file}: {e}"))?;
        for mut obj in docs.into_iter().filter(|d| matches!(d["kind"].as_str(), Some("MusterJob" | "MusterJobSet"))) {
            let specs = pod_specs(&obj);
            let mut need = (0, 0, 0);
            for (path, pods) in &specs {
                let (c, m, g) = requests(&at(&mut obj, path)["containers"]);
                need = (need.0 + c * pods, need.1 + m * pods, need.2 + g * pods);
            }
            let free = free_on_node(lane)?;
            let labels_missing: Vec<String> = obj["spec"]["scheduling"]["schedulingConstraints"]["topology"]
                .as_array()
                .map(|t| {
                    t.iter()
                        .filter_map(|c| c["key"].as_str())
                        .filter(|k| node["metadata"]["labels"][*k].is_null())
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            let what = format!("{file} {} {}", obj["kind"].as_str().unwrap_or(""), name(&obj));
            if need.0 > free.0 || need.1 > free.1 || need.2 > free.2 || !labels_missing.is_empty() {
                lines.push(format!(
                    "{what}: not placed (needs {}m cpu, {} MiB, {} GPUs{}; the node has {}m, {} MiB, {} GPUs free)",
                    need.0,
                    need.1 >> 20,
                    need.2,
                    if labels_missing.is_empty() { String::new() } else { format!(", node labels {labels_missing:?}") },
                    free.0,
                    free.1 >> 20,
                    free.2
                ));
                continue;
            }
            for (path, _) in &specs {
                let spec = at(&mut obj, path);
                spec["nodeSelector"] = json!({key: value});
                spec["terminationGracePeriodSeconds"] = json!(1);
                if let Some(containers) = spec["containers"].as_array_mut() {
                    for c in containers {
                        c["image"] = json!(BUSYBOX);
                        c["imagePullPolicy"] = json!("Never");
                        c["command"] = json!([
                            "sh",
                            "-c",
                            "echo $HOSTNAME MUSTER_GPU_INDICES=$MUSTER_GPU_INDICES NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES; sleep 2"
                        ]);
                        if let Some(c) = c.as_object_mut() {
                            c.remove("args");
                        }
                    }
                }
            }
            apply_in(lane, EXAMPLES_NS, &[obj.clone()])?;
            placed.push((what, obj["kind"].as_str().unwrap_or("").to_string(), name(&obj)));
        }
    }
    if placed.is_empty() {
        return Err(format!("no example fits the real node:\n{}", lines.join("\n")));
    }
    for (what, kind, obj_name) in &placed {
        let began = Instant::now();
        let resource = if kind == "MusterJob" { "musterjob" } else { "musterjobset" };
        wait(&format!("{what} to complete"), Duration::from_secs(180), || {
            let o = lane.json(&["-n", EXAMPLES_NS, "get", resource, obj_name])?;
            if condition(&o, "Failed") {
                return Err(format!("{what} failed: {}", o["status"]));
            }
            Ok(if condition(&o, "Complete") || condition(&o, "Completed") {
                Ok(())
            } else {
                Err(o["status"].to_string())
            })
        })?;
        lines.push(format!("{what}: completed on {NODE} ({:.1}s after the previous)", began.elapsed().as_secs_f64()));
    }
    Ok(lines.join("\n"))
}

/// Per gang (MusterJob) in `namespace`: (pods, gated, bound).
fn gang_states(lane: &Lane, namespace: &str) -> Result<BTreeMap<String, (usize, usize, usize)>, String> {
    let pods = items(&lane.json(&["-n", namespace, "get", "pods"])?);
    let mut gangs: BTreeMap<String, (usize, usize, usize)> = BTreeMap::new();
    for p in pods {
        let Some(owner) = p["metadata"]["ownerReferences"]
            .as_array()
            .and_then(|o| o.iter().find(|r| r["kind"] == "MusterJob"))
            .and_then(|r| r["name"].as_str())
        else {
            continue;
        };
        let e = gangs.entry(owner.to_string()).or_default();
        e.0 += 1;
        let gated =
            p["spec"]["schedulingGates"].as_array().is_some_and(|g| g.iter().any(|g| g["name"] == ADMISSION_GATE));
        if gated {
            e.1 += 1;
        }
        if p["spec"]["nodeName"].as_str().is_some_and(|n| !n.is_empty()) {
            e.2 += 1;
        }
    }
    Ok(gangs)
}

/// The leader's container killed (SIGKILL through containerd) while it admits gangs: the other
/// replica takes the Lease, and no gang is left partly admitted.
pub fn failover(lane: &Lane) -> Result<String, String> {
    ensure_namespace(lane, FAILOVER_NS)?;
    let (managers, _) = muster_pods(lane)?;
    let leader = lease_holder(lane)?.ok_or("no leader")?;
    let leader_pod = managers
        .iter()
        .find(|p| leader.contains(name(p).as_str()))
        .ok_or_else(|| format!("the leader {leader} is none of the replicas"))?
        .clone();
    let container = leader_pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .and_then(|c| c.strip_prefix("containerd://"))
        .ok_or("the leader has no containerd container ID")?
        .to_string();
    // 10 gangs of 3 one-GPU pods on the kwok pool (30 of its 4 x 8 GPUs), 2 gangs of 2 on the
    // real node.
    let (key, _) = NODE_LABEL;
    let mut jobs = Vec::new();
    for i in 0..10 {
        let mut j = job(&format!("pool-{i}"), 3, 1, 0, 0, json!({}));
        let spec = &mut j["spec"]["template"]["spec"];
        if let Some(s) = spec.as_object_mut() {
            s.remove("nodeSelector");
        }
        spec["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": key, "operator": "DoesNotExist"}]}]}}});
        jobs.push(j);
    }
    for i in 0..2 {
        jobs.push(job(&format!("real-{i}"), 2, 1, 0, 5, json!({})));
    }
    let total = jobs.len();
    apply_in(lane, FAILOVER_NS, &jobs)?;
    // Kill at the first pod muster ungated: mid-admission.
    let at_kill = wait("muster to start admitting", Duration::from_secs(60), || {
        let gangs = gang_states(lane, FAILOVER_NS)?;
        let started = gangs.values().any(|(pods, gated, _)| gated < pods);
        Ok(if started { Ok(gangs) } else { Err(format!("{} gangs with pods", gangs.len())) })
    })?;
    let killed_at = Instant::now();
    lane.ctr(&["tasks", "kill", "-s", "SIGKILL", &container])?;
    // And its pod gone for good (as when its node dies), so that another replica, not the same
    // pod restarted, must take the Lease over: it waits out the Lease (15 s).
    lane.kubectl(&[
        "-n",
        NAMESPACE,
        "delete",
        "pod",
        &name(&leader_pod),
        "--grace-period=0",
        "--force",
        "--wait=false",
    ])?;
    let admitted_at_kill = at_kill.values().filter(|(pods, gated, _)| *gated == 0 && *pods > 0).count();
    let partial_at_kill = at_kill.values().filter(|(pods, gated, _)| *gated > 0 && gated < pods).count();
    // Another replica takes the Lease (after it expires), then every gang is admitted whole,
    // none partly.
    let mut max_partial = 0;
    let new_leader = wait("another replica to take the Lease", Duration::from_secs(60), || {
        let gangs = gang_states(lane, FAILOVER_NS)?;
        max_partial = max_partial.max(gangs.values().filter(|(pods, gated, _)| *gated > 0 && gated < pods).count());
        Ok(match lease_holder(lane)? {
            Some(h) if h != leader => Ok(h),
            other => Err(format!("holder {other:?}")),
        })
    })?;
    let takeover = killed_at.elapsed().as_secs_f64();
    let settled = wait("every gang admitted after the failover", Duration::from_secs(120), || {
        let gangs = gang_states(lane, FAILOVER_NS)?;
        let partial = gangs.values().filter(|(pods, gated, _)| *gated > 0 && gated < pods).count();
        max_partial = max_partial.max(partial);
        let whole = gangs.values().filter(|(pods, gated, _)| *gated == 0 && *pods > 0).count();
        Ok(if whole == total && partial == 0 {
            Ok(gangs)
        } else {
            Err(format!("{whole} of {total} admitted, {partial} partly"))
        })
    })?;
    let took = killed_at.elapsed().as_secs_f64();
    // The Deployment replaces the deleted pod; both replicas Ready again.
    wait("2 muster replicas Ready again", Duration::from_secs(120), || {
        let (m, _) = muster_pods(lane)?;
        let n = m.iter().filter(|p| ready(p)).count();
        Ok(if n == 2 { Ok(()) } else { Err(format!("{n} Ready")) })
    })?;
    let unbound: Vec<String> = settled
        .iter()
        .filter(|(_, (pods, _, bound))| bound < pods)
        .map(|(g, (p, _, b))| format!("{g} {b}/{p} bound"))
        .collect();
    Ok(format!(
        "killed {leader} (SIGKILL to container {}, pod force-deleted) with {admitted_at_kill} of {total} gangs admitted and \
         {partial_at_kill} partly; {new_leader} took the Lease {takeover:.1}s after the kill; all {total} admitted whole \
         {took:.1}s after it; partly \
         admitted gangs seen after the kill (transient, mid-commit) at most {max_partial}; not yet bound: {unbound:?}",
        &container[..12.min(container.len())]
    ))
}

/// `helm upgrade` to a rebuilt image: the pods roll to it, a leader holds the Lease, and a gang
/// still runs on the real node.
pub fn upgrade(lane: &Lane) -> Result<String, String> {
    let binary = crate::node::muster_binary();
    let tag = format!("localhost/muster:{MUSTER_TAG_REBUILT}");
    // The same binary rebuilt with other file times: another image (another digest).
    let (archive, line) =
        Lane::build_image("muster", &["--binary", binary.to_str().ok_or("binary path")?, "--tag", &tag], 1)?;
    lane.ctr(&["images", "import", archive.to_str().ok_or("archive path")?])?;
    let chart = repo().join("charts/muster");
    let began = Instant::now();
    lane.helm(&[
        "upgrade",
        RELEASE,
        chart.to_str().ok_or("chart path")?,
        "-n",
        NAMESPACE,
        "--reuse-values",
        "--set",
        &format!("image.tag={MUSTER_TAG_REBUILT}"),
        "--wait",
        "--timeout",
        "240s",
    ])?;
    let upgraded = began.elapsed().as_secs_f64();
    let (managers, agents) = wait("every muster pod on the rebuilt image", Duration::from_secs(120), || {
        let (m, a) = muster_pods(lane)?;
        let on_new = |p: &Value| p["spec"]["containers"][0]["image"].as_str() == Some(tag.as_str()) && ready(p);
        let ok = m.len() == 2 && m.iter().all(on_new) && a.len() == 1 && a.iter().all(on_new);
        Ok(if ok { Ok((m, a)) } else { Err(format!("{} managers, {} agents", m.len(), a.len())) })
    })?;
    let names: Vec<String> = managers.iter().map(name).collect();
    let leader = wait("a leader among the upgraded replicas", Duration::from_secs(60), || {
        Ok(match lease_holder(lane)? {
            Some(h) if names.iter().any(|n| h.contains(n.as_str())) => Ok(h),
            other => Err(format!("holder {other:?}")),
        })
    })?;
    ensure_namespace(lane, JOBS_NS)?;
    apply_in(lane, JOBS_NS, &[job("after-upgrade", 2, 1, 0, 1, json!({}))])?;
    wait("a gang after the upgrade to complete", Duration::from_secs(120), || {
        let j = lane.json(&["-n", JOBS_NS, "get", "musterjob", "after-upgrade"])?;
        Ok(if condition(&j, "Complete") { Ok(()) } else { Err(j["status"].to_string()) })
    })?;
    let image_id = managers[0]["status"]["containerStatuses"][0]["imageID"].as_str().unwrap_or_default().to_string();
    Ok(format!(
        "{line}\nhelm upgrade --wait: {upgraded:.1}s; replicas {} and agent {} on {tag} ({image_id}); leader {leader}; a gang completed after it",
        names.join(", "),
        agents.iter().map(name).collect::<Vec<_>>().join(", ")
    ))
}

/// `helm uninstall` (after the user's jobs are gone): nothing of the release is left but the
/// CRDs.
pub fn uninstall(lane: &Lane) -> Result<String, String> {
    for ns in [JOBS_NS, EXAMPLES_NS, FAILOVER_NS] {
        lane.kubectl(&["delete", "namespace", ns, "--ignore-not-found", "--wait=true", "--timeout=120s"])?;
    }
    lane.kubectl(&["-n", NAMESPACE, "delete", "configmap", "muster-probe", "--ignore-not-found"])?;
    let began = Instant::now();
    lane.helm(&["uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "120s"])?;
    let took = began.elapsed().as_secs_f64();
    // Pods go with their controllers; wait for them before listing.
    wait("the release's pods to go", Duration::from_secs(60), || {
        let (m, a) = muster_pods(lane)?;
        Ok(if m.is_empty() && a.is_empty() { Ok(()) } else { Err(format!("{} pods left", m.len() + a.len())) })
    })?;
    // What muster made at run time (its Lease, its certificate Secret) is owned by its
    // ServiceAccount: the garbage collector takes it shortly after.
    let left_over = || -> Result<Vec<String>, String> {
        let mut left = Vec::new();
        let kinds = lane.kubectl(&["api-resources", "--verbs=list", "--namespaced", "-o", "name"])?;
        for kind in kinds.lines().filter(|k| !k.is_empty() && !k.starts_with("events")) {
            for o in items(&lane.json(&["-n", NAMESPACE, "get", kind])?) {
                let n = name(&o);
                // What every namespace has.
                if (kind == "configmaps" && n == "kube-root-ca.crt") || (kind == "serviceaccounts" && n == "default") {
                    continue;
                }
                left.push(format!("{kind} {NAMESPACE}/{n}"));
            }
        }
        let cluster_kinds = lane.kubectl(&["api-resources", "--verbs=list", "--namespaced=false", "-o", "name"])?;
        for kind in cluster_kinds.lines().filter(|k| !k.is_empty()) {
            // The Node and its CSINode are the real node's; the APIServices of muster's groups
            // are the CRDs' (the apiserver keeps one per served group version); the node's
            // NodeGPUReport is the Node's (owned by it, like the topology annotation), reported
            // below.
            if matches!(
                kind,
                "nodes"
                    | "nodegpureports.gpu.muster.dev"
                    | "namespaces"
                    | "componentstatuses"
                    | "csinodes.storage.k8s.io"
                    | "customresourcedefinitions.apiextensions.k8s.io"
                    | "apiservices.apiregistration.k8s.io"
            ) {
                continue;
            }
            let Ok(list) = lane.json(&["get", kind]) else { continue };
            for o in items(&list) {
                let n = name(&o);
                let release = o["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
                    || o["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE;
                if release || n.contains("muster") {
                    left.push(format!("{kind} {n}"));
                }
            }
        }
        Ok(left)
    };
    let mut gone_after = 0.0;
    let settled = wait("the release's objects to go", Duration::from_secs(60), || {
        let left = left_over()?;
        gone_after = began.elapsed().as_secs_f64();
        Ok(if left.is_empty() { Ok(()) } else { Err(format!("left behind after helm uninstall: {left:?}")) })
    });
    settled?;
    let crds: Vec<String> = items(&lane.json(&["get", "customresourcedefinitions"])?)
        .iter()
        .map(name)
        .filter(|n| n.contains("muster.dev"))
        .collect();
    let node = lane.json(&["get", "node", NODE])?;
    let annotations: Vec<String> = node["metadata"]["annotations"]
        .as_object()
        .map(|a| a.keys().filter(|k| k.starts_with("gpu.muster.dev/")).cloned().collect())
        .unwrap_or_default();
    if crds.len() != muster::crds::all().len() {
        return Err(format!("the CRDs should stay (helm keeps crds/): {crds:?}"));
    }
    let reports: Vec<String> = items(&lane.json(&["get", "nodegpureports.gpu.muster.dev"])?).iter().map(name).collect();
    Ok(format!(
        "helm uninstall --wait: {took:.1}s; nothing of the release left {gone_after:.1}s after it began but the {} CRDs; node annotations the agent wrote: {annotations:?}; NodeGPUReports left with their nodes: {reports:?}",
        crds.len()
    ))
}

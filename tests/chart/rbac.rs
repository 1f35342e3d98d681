//! The chart's RBAC is enough and no more: muster runs on this machine with the chart's
//! ServiceAccount token and the arguments of the chart's Deployment, and does its real work
//! (webhook certificate and CA injection, the Lease, MusterJob and MusterJobSet reconciling with
//! pods, Services, status and events, gang admission with GPU indices) without one refused
//! request; requests outside the rules
//! are refused, asked with `kubectl auth can-i --as` and made for real with the token.

use std::time::Duration;

use serde_json::Value;

use crate::harness::{cluster, kubectl, kubectl_apply, namespace};
use crate::support::{
    Muster, Release, SERVICE_ACCOUNT, chart_dir, eventually, exclusive, free_port, kubectl_as, kubectl_stdin, one,
};

const TIMEOUT: Duration = Duration::from_secs(60);

const JOB: &str = r#"
apiVersion: batch.muster.dev/v1alpha1
kind: MusterJob
metadata:
  name: train
spec:
  parallelism: 2
  completions: 2
  completionMode: Indexed
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
          resources:
            requests: {cpu: 100m}
            limits: {nvidia.com/gpu: 1}
"#;

const JOBSET: &str = r#"
apiVersion: batch.muster.dev/v1alpha1
kind: MusterJobSet
metadata:
  name: sweep
spec:
  scheduling:
    schedulingPolicy:
      gang: {}
  replicatedJobs:
    - name: driver
      replicas: 1
      template:
        spec:
          template:
            spec:
              restartPolicy: Never
              containers:
                - name: driver
                  image: example/none
    - name: workers
      replicas: 1
      template:
        spec:
          parallelism: 2
          completions: 2
          completionMode: Indexed
          template:
            spec:
              restartPolicy: Never
              containers:
                - name: worker
                  image: example/none
"#;

/// A labelled pod muster does not own: the mutating webhook must gate it.
const FOREIGN_POD: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: joins-a-group
  labels:
    scheduling.muster.dev/pod-group: somebody-elses
spec:
  restartPolicy: Never
  containers:
    - name: main
      image: example/none
"#;

fn json(out: String) -> Value {
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// `kubectl get` (admin) as JSON, `None` while it fails.
fn get(args: &[&str]) -> Option<Value> {
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    all.extend(["-o", "json"]);
    cluster().kubectl(&all).ok().map(json)
}

fn items(list: &Value) -> Vec<Value> {
    list["items"].as_array().cloned().unwrap_or_default()
}

fn gated(pod: &Value) -> bool {
    let gates = pod["spec"]["schedulingGates"].as_array().cloned().unwrap_or_default();
    gates.iter().any(|g| g["name"] == muster::crds::ADMISSION_GATE)
}

#[test]
fn muster_runs_with_only_the_chart_rbac() {
    let _lock = exclusive();
    let port = free_port();
    let url = format!("https://127.0.0.1:{port}");
    let release = Release::install(&chart_dir(), "muster-rbac", &["--set", &format!("webhook.url={url}")]);
    let rns = release.namespace.clone();
    let kubeconfig = release.service_account_kubeconfig();
    let deployment = one(&release.manifest(), "Deployment").clone();
    let muster = Muster::start(&deployment, &kubeconfig, &rns, port, &[]);
    let log = || muster.log_text();

    // Self-managed certificate in its Secret, its CA injected into the chart's configurations.
    let secret = eventually("the webhook Secret", TIMEOUT, || get(&["secret", "muster-webhook-tls", "-n", &rns]), log);
    let ca = secret["data"]["ca.crt"].as_str().expect("ca.crt").to_string();
    for kind in ["validatingwebhookconfiguration/muster-validating", "mutatingwebhookconfiguration/muster-mutating"] {
        eventually(
            &format!("the CA bundle in {kind}"),
            TIMEOUT,
            || {
                let config = get(&[kind])?;
                let webhooks = config["webhooks"].as_array()?.clone();
                webhooks.iter().all(|w| w["clientConfig"]["caBundle"] == ca.as_str()).then_some(())
            },
            log,
        );
    }
    // Leader election in its namespace.
    eventually(
        "muster holding the Lease",
        TIMEOUT,
        || {
            let lease = get(&["lease", muster::controllers::LEASE_NAME, "-n", &rns])?;
            (lease["spec"]["holderIdentity"] == format!("muster-{rns}")).then_some(())
        },
        log,
    );

    let ns = namespace("chart-rbac");
    // This API server serves MutatingAdmissionPolicies, so the chart records a new job's
    // scheduling API with its policy, in the API server: a server-side dry run of the create
    // comes back with it.
    assert!(get(&["mutatingadmissionpolicy", muster::webhook::config::RECORD_API_POLICY]).is_some());
    let dry = kubectl_stdin(&["create", "--dry-run=server", "-n", &ns.name, "-o", "json", "-f", "-"], JOB)
        .expect("a server-side dry run of the job");
    let dry: Value = serde_json::from_str(&dry).expect("the dry run's object");
    assert_eq!(dry["metadata"]["annotations"][muster::crds::SCHEDULING_API_ANNOTATION], "muster", "{dry}");
    // Through the validating webhook (muster at `url`), then the MusterJob reconciler.
    kubectl_apply(&ns.name, JOB);
    for kind in ["workload.scheduling.muster.dev", "podgroup.scheduling.muster.dev", "service"] {
        eventually(&format!("{kind} train"), TIMEOUT, || get(&[kind, "train", "-n", &ns.name]), log);
    }
    // Admission: the gang is placed at once (pods patched: node pin, GPU indices, gate removed),
    // its PodGroup status written, and kube-scheduler binds the pods.
    let pods = eventually(
        "2 admitted and bound pods of train with GPU indices",
        TIMEOUT,
        || {
            let pods = items(&get(&["pods", "-n", &ns.name, "-l", "batch.muster.dev/job-name=train"])?);
            let admitted = |p: &Value| {
                !gated(p)
                    && p["spec"]["nodeSelector"][muster::crds::HOSTNAME_LABEL].is_string()
                    && p["spec"]["nodeName"].is_string()
                    && p["metadata"]["annotations"][muster::crds::GPU_INDICES_ANNOTATION].is_string()
            };
            (pods.len() == 2 && pods.iter().all(admitted)).then_some(pods)
        },
        log,
    );
    assert!(pods.iter().all(|p| p["metadata"]["ownerReferences"][0]["kind"] == "MusterJob"));
    eventually(
        "train's PodGroup status: 2 admitted",
        TIMEOUT,
        || {
            let group = get(&["podgroup.scheduling.muster.dev", "train", "-n", &ns.name])?;
            (group["status"]["admitted"] == 2).then_some(())
        },
        log,
    );
    eventually(
        "train's status",
        TIMEOUT,
        || {
            let job = get(&["musterjob", "train", "-n", &ns.name])?;
            (job["status"]["podGroupName"] == "train").then_some(())
        },
        log,
    );
    eventually(
        "a SuccessfulCreate event from muster",
        TIMEOUT,
        || {
            let events = items(&get(&["events.events.k8s.io", "-n", &ns.name])?);
            events
                .iter()
                .any(|e| e["reason"] == "SuccessfulCreate" && e["reportingController"] == "muster")
                .then_some(())
        },
        log,
    );

    // The MusterJobSet reconciler: Workload, root CompositePodGroup, child MusterJobs, Service.
    kubectl_apply(&ns.name, JOBSET);
    for kind in ["workload.scheduling.muster.dev", "compositepodgroup.scheduling.muster.dev", "service"] {
        eventually(&format!("{kind} sweep"), TIMEOUT, || get(&[kind, "sweep", "-n", &ns.name]), log);
    }
    eventually(
        "sweep's child MusterJobs and their PodGroups",
        TIMEOUT,
        || {
            let jobs = items(&get(&["musterjobs", "-n", &ns.name, "-l", "batch.muster.dev/jobset-name=sweep"])?);
            let groups = items(&get(&["podgroups.scheduling.muster.dev", "-n", &ns.name])?);
            (jobs.len() == 2 && groups.len() == 3).then_some(())
        },
        log,
    );

    // The mutating webhook gates a pod that joins a group (one that does not exist: it stays gated).
    kubectl_apply(&ns.name, FOREIGN_POD);
    let pod = get(&["pod", "joins-a-group", "-n", &ns.name]).expect("pod");
    assert!(gated(&pod), "the mutating webhook did not gate the pod: {pod}");

    // Suspending deletes the pods (delete), and the job says so (status).
    kubectl(&["patch", "musterjob", "train", "-n", &ns.name, "--type=merge", "-p", r#"{"spec":{"suspend":true}}"#]);
    eventually(
        "train's pods deleted on suspend",
        TIMEOUT,
        || {
            let pods = items(&get(&["pods", "-n", &ns.name, "-l", "batch.muster.dev/job-name=train"])?);
            pods.is_empty().then_some(())
        },
        log,
    );

    let forbidden = muster.forbidden_lines();
    assert!(forbidden.is_empty(), "muster was refused with the chart's RBAC:\n{}", forbidden.join("\n"));
    drop(muster);
    drop(release);
}

/// `kubectl auth can-i --as` the chart's ServiceAccount: `yes` or `no`.
fn can_i(release_ns: &str, args: &[&str]) -> bool {
    let who = format!("--as=system:serviceaccount:{release_ns}:{SERVICE_ACCOUNT}");
    let mut all = vec!["auth", "can-i", who.as_str()];
    all.extend_from_slice(args);
    match cluster().kubectl(&all) {
        Ok(out) => out.trim() == "yes",
        // can-i exits 1 with "no" on stdout; kubectl's error wrapper shows only stderr.
        Err(_) => false,
    }
}

#[test]
fn service_account_is_refused_outside_its_rules() {
    let _lock = exclusive();
    let release = Release::install(&chart_dir(), "muster-refuse", &[]);
    let ns = release.namespace.clone();
    let allowed: &[&[&str]] = &[
        &["get", "secret/muster-webhook-tls", "-n", &ns],
        &["update", "secret/muster-webhook-tls", "-n", &ns],
        &["create", "secrets", "-n", &ns],
        &["create", "leases.coordination.k8s.io", "-n", &ns],
        &["patch", "leases.coordination.k8s.io/muster-controller-manager", "-n", &ns],
        &["list", "pods", "-A"],
        &["watch", "pods", "-A"],
        &["patch", "pods", "-n", "default"],
        &["delete", "pods", "-n", "default"],
        &["list", "nodes"],
        &["list", "events", "-n", "default"],
        &["create", "events.events.k8s.io", "-n", "default"],
        &["patch", "podgroups.scheduling.muster.dev", "--subresource=status", "-n", "default"],
        &["patch", "musterjobs.batch.muster.dev", "--subresource=status", "-n", "default"],
        &["patch", "customresourcedefinitions/podgroups.scheduling.muster.dev"],
        &["create", "customresourcedefinitions/podgroups.scheduling.muster.dev"],
        &["patch", "validatingwebhookconfigurations/muster-validating"],
        &["patch", "mutatingwebhookconfigurations/muster-mutating"],
        &["watch", "validatingwebhookconfigurations"],
        &["list", "mutatingwebhookconfigurations"],
        &["watch", "validatingadmissionpolicies"],
        &["list", "mutatingadmissionpolicies.admissionregistration.k8s.io"],
        &["watch", "workloads.scheduling.muster.dev", "-A"],
        &["list", "resourceslices.resource.k8s.io"],
        &["watch", "deviceclasses.resource.k8s.io"],
        &["list", "resourceclaimtemplates.resource.k8s.io", "-A"],
        &["create", "resourceclaimtemplates.resource.k8s.io", "-n", "default"],
        &["delete", "resourceclaimtemplates.resource.k8s.io", "-n", "default"],
        &["watch", "resourceclaims.resource.k8s.io", "-A"],
        &["create", "resourceclaims.resource.k8s.io", "-n", "default"],
        &["update", "resourceclaims.resource.k8s.io", "-n", "default"],
        &["delete", "resourceclaims.resource.k8s.io", "-n", "default"],
        &["update", "resourceclaims.resource.k8s.io", "--subresource=status", "-n", "default"],
        &["patch", "resourceclaims.resource.k8s.io", "--subresource=status", "-n", "default"],
        &["update", "podgroups.scheduling.muster.dev", "--subresource=finalizers", "-n", "default"],
        // Gang preemption: evictions, and the victims' DisruptionTarget condition.
        &["create", "pods", "--subresource=eviction", "-n", "default"],
        &["patch", "pods", "--subresource=status", "-n", "default"],
        // The scheduling API a job or set compiles to is recorded on it (annotation).
        &["patch", "musterjobsets.batch.muster.dev", "-n", "default"],
        // Upstream mode: the native objects, applied and watched.
        &["patch", "workloads.scheduling.k8s.io", "-n", "default"],
        &["patch", "compositepodgroups.scheduling.k8s.io", "-n", "default"],
        &["watch", "compositepodgroups.scheduling.k8s.io", "-A"],
    ];
    // kubectl cannot ask about a resource the API server does not serve (an older Kubernetes:
    // DRA before 1.34, the native scheduling kinds before 1.37, MutatingAdmissionPolicy v1):
    // such a question is left out.
    // On the newest control plane every kind is served: nothing may be left out there (a
    // misspelt resource would otherwise pass unasked).
    let served = cluster().kubectl(&["api-resources", "-o", "name"]).unwrap_or_default();
    let version = cluster().kubectl(&["version", "-o", "json"]).unwrap_or_default();
    let minor: u32 = serde_json::from_str::<serde_json::Value>(&version)
        .ok()
        .and_then(|v| v["serverVersion"]["minor"].as_str().and_then(|m| m.trim_end_matches('+').parse().ok()))
        .unwrap_or(u32::MAX);
    for args in allowed {
        let resource = args[1].split('/').next().unwrap_or_default();
        if resource.contains('.') && !served.lines().any(|l| l.trim() == resource) {
            assert!(minor < 37, "{resource} is not served by Kubernetes 1.{minor}: {args:?}");
            eprintln!("not served by Kubernetes 1.{minor}, not asked: {args:?}");
            continue;
        }
        assert!(can_i(&ns, args), "the chart's ServiceAccount should be allowed: {args:?}");
    }
    let refused: &[&[&str]] = &[
        &["list", "secrets", "-A"],
        &["list", "secrets", "-n", &ns],
        &["get", "secrets", "-n", "kube-system"],
        &["get", "secret/other", "-n", &ns],
        &["update", "secret/other", "-n", &ns],
        &["delete", "secret/muster-webhook-tls", "-n", &ns],
        &["create", "secrets", "-n", "default"],
        &["delete", "nodes"],
        &["patch", "nodes"],
        &["create", "clusterrolebindings"],
        &["patch", "clusterroles"],
        &["bind", "clusterroles"],
        &["escalate", "clusterroles"],
        &["impersonate", "users"],
        &["create", "serviceaccounts", "--subresource=token", "-n", &ns],
        &["create", "pods", "--subresource=exec", "-n", "default"],
        &["get", "pods", "--subresource=log", "-n", "default"],
        &["list", "events.events.k8s.io", "-n", "default"],
        &["delete", "events", "-n", "default"],
        &["get", "configmaps", "-n", "kube-system"],
        &["create", "deployments.apps", "-n", &ns],
        &["patch", "leases.coordination.k8s.io/kube-scheduler", "-n", "kube-system"],
        &["patch", "leases.coordination.k8s.io/other", "-n", &ns],
        &["patch", "customresourcedefinitions/jobs.other.example.com"],
        &["create", "customresourcedefinitions/jobs.other.example.com"],
        &["delete", "customresourcedefinitions/podgroups.scheduling.muster.dev"],
        &["patch", "validatingwebhookconfigurations/other"],
        &["delete", "validatingwebhookconfigurations/muster-validating"],
        &["create", "validatingadmissionpolicies"],
        &["patch", "mutatingadmissionpolicies.admissionregistration.k8s.io"],
        &["update", "pods", "-n", "default"],
        &["delete", "podgroups.scheduling.muster.dev", "-n", "default"],
        &["delete", "musterjobsets.batch.muster.dev", "-n", "default"],
        &["update", "pods", "--subresource=status", "-n", "default"],
        &["delete", "compositepodgroups.scheduling.k8s.io", "-n", "default"],
        &["patch", "compositepodgroups.scheduling.k8s.io", "--subresource=status", "-n", "default"],
        &["create", "resourceslices.resource.k8s.io"],
        &["patch", "resourceslices.resource.k8s.io"],
        &["delete", "resourceslices.resource.k8s.io"],
        &["create", "deviceclasses.resource.k8s.io"],
        &["update", "deviceclasses.resource.k8s.io"],
        &["deletecollection", "resourceclaims.resource.k8s.io", "-n", "default"],
        &["create", "devicetaintrules.resource.k8s.io"],
        &["update", "resourceclaimtemplates.resource.k8s.io", "--subresource=status", "-n", "default"],
        &["*", "*"],
    ];
    for args in refused {
        assert!(!can_i(&ns, args), "the chart's ServiceAccount must be refused: {args:?}");
    }

    // The same with real requests and the ServiceAccount's own token.
    let kubeconfig = release.service_account_kubeconfig();
    let forbidden = |args: &[&str]| {
        let err = kubectl_as(&kubeconfig, args).expect_err(&format!("{args:?} succeeded"));
        assert!(err.contains("Forbidden") || err.contains("forbidden"), "{args:?}: {err}");
    };
    forbidden(&["get", "secrets", "-A"]);
    forbidden(&["get", "secrets", "-n", "kube-system"]);
    forbidden(&["get", "secrets", "-n", &ns]);
    forbidden(&["get", "configmaps", "-n", "kube-system"]);
    forbidden(&["delete", "node", &format!("{}0", crate::harness::POOL_PREFIX), "--dry-run=server"]);
    forbidden(&["label", "node", &format!("{}0", crate::harness::POOL_PREFIX), "x=y", "--dry-run=server"]);
    forbidden(&[
        "create",
        "clusterrolebinding",
        "muster-takeover",
        "--clusterrole=cluster-admin",
        &format!("--serviceaccount={ns}:{SERVICE_ACCOUNT}"),
        "--dry-run=server",
    ]);
    forbidden(&["delete", "validatingwebhookconfiguration", "muster-validating", "--dry-run=server"]);
    // Allowed by name: the Secret is only missing (muster is not running here), not forbidden.
    let err = kubectl_as(&kubeconfig, &["get", "secret", "muster-webhook-tls", "-n", &ns]).expect_err("no Secret yet");
    assert!(err.contains("NotFound") || err.contains("not found"), "{err}");
    kubectl_as(&kubeconfig, &["get", "nodes"]).unwrap_or_else(|e| panic!("{e}"));
    kubectl_as(&kubeconfig, &["get", "pods", "-A"]).unwrap_or_else(|e| panic!("{e}"));
}

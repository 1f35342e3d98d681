//! muster against upstream. The 1.37 control plane runs the Job controller with
//! `WorkloadWithJob`: a batch/v1 Job gets a `scheduling.k8s.io` Workload (`<job>-<hash>`) and
//! PodGroup compiled by upstream's workloadbuilder. The same `spec.scheduling` in a MusterJob
//! must compile to the same content, and the same mistakes must be refused at the same field
//! paths. Where muster differs on purpose, the case says so by name.

use std::collections::BTreeSet;
use std::time::Duration;

use kube::api::{Api, DynamicObject, GroupVersionKind, ListParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};

use crate::cases::{create_cases, error_paths, job_manifest, path_set, update_bases, update_cases};
use crate::harness::manager::muster;
use crate::harness::{client, cluster, namespace, wait_for};

const TIMEOUT: Duration = Duration::from_secs(30);

fn native(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("scheduling.k8s.io", "v1beta1", kind))
}

fn muster_kind(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("scheduling.muster.dev", "v1alpha1", kind))
}

/// Removes `null` members (upstream writes some optional blocks out as null).
fn drop_nulls(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, x| !x.is_null());
            m.values_mut().for_each(drop_nulls);
        }
        Value::Array(a) => a.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

/// A Workload's spec without what differs by name or API group: the controllerRef and the
/// template names.
fn workload_content(w: &DynamicObject) -> Value {
    let mut spec = w.data["spec"].clone();
    drop_nulls(&mut spec);
    if let Some(m) = spec.as_object_mut() {
        m.remove("controllerRef");
    }
    for list in ["podGroupTemplates", "compositePodGroupTemplates"] {
        for t in spec.get_mut(list).and_then(Value::as_array_mut).into_iter().flatten() {
            t["name"] = json!("<template>");
        }
    }
    spec
}

/// A PodGroup's spec without its workloadRef (names). The priority stays: upstream's Priority
/// admission plugin resolves it from the class (0 without one), and muster's job controller
/// resolves it the same way when it creates the PodGroup.
fn pod_group_content(g: &DynamicObject) -> Value {
    let mut spec = g.data["spec"].clone();
    drop_nulls(&mut spec);
    if let Some(m) = spec.as_object_mut() {
        m.remove("workloadRef");
    }
    spec
}

/// Creates PriorityClass `name` (value 1000) unless it exists: two tests may race to make it.
fn priority_class_1000(name: &str) {
    match cluster().kubectl(&["create", "priorityclass", name, "--value=1000"]) {
        Ok(_) => {}
        Err(e) if e.contains("AlreadyExists") || e.contains("already exists") => {}
        Err(e) => panic!("{e}"),
    }
}

/// The native Workload that a `kind` named `name` controls in `namespace` (the Job
/// controller's `<job>-<hash>`, or muster's in upstream mode), and its PodGroup, once both exist.
async fn native_objects(namespace: &str, kind: &str, name: &str) -> Option<(DynamicObject, DynamicObject)> {
    let c = client().await;
    let wls = Api::<DynamicObject>::namespaced_with(c.clone(), namespace, &native("Workload"));
    let pgs = Api::<DynamicObject>::namespaced_with(c, namespace, &native("PodGroup"));
    let wl = wls.list(&ListParams::default()).await.ok()?.items.into_iter().find(|w| {
        let owner = &w.data["spec"]["controllerRef"];
        owner["name"] == name && owner["kind"] == kind
    })?;
    let wl_name = wl.metadata.name.clone()?;
    let pg = pgs
        .list(&ListParams::default())
        .await
        .ok()?
        .items
        .into_iter()
        .find(|g| g.data["spec"]["workloadRef"]["workloadName"] == wl_name.as_str())?;
    Some((wl, pg))
}

/// The differences of the Workload and PodGroup contents of `name` between two compilations,
/// each labelled.
fn differences_of(
    name: &str,
    (a, a_wl, a_pg): (&str, &DynamicObject, &DynamicObject),
    (b, b_wl, b_pg): (&str, &DynamicObject, &DynamicObject),
) -> Vec<String> {
    let mut out = Vec::new();
    let (u, m) = (workload_content(a_wl), workload_content(b_wl));
    if u != m {
        out.push(format!("{name}: Workload spec\n  {a:<9} {u}\n  {b:<9} {m}"));
    }
    let (u, m) = (pod_group_content(a_pg), pod_group_content(b_pg));
    if u != m {
        out.push(format!("{name}: PodGroup spec\n  {a:<9} {u}\n  {b:<9} {m}"));
    }
    out
}

/// The scheduling variants compared; each becomes a Job and a MusterJob of the same name.
fn variants(priority_class: &str) -> Vec<(&'static str, Value)> {
    let sched = |s: Value| json!({"scheduling": s});
    vec![
        ("no-scheduling", json!({})),
        ("empty-scheduling", sched(json!({}))),
        ("basic", sched(json!({"schedulingPolicy": {"basic": {}}}))),
        ("basic-single", sched(json!({"schedulingPolicy": {"basic": {}}, "disruptionMode": {"single": {}}}))),
        ("gang-min-count", json!({"parallelism": 3, "scheduling": {"schedulingPolicy": {"gang": {"minCount": 2}}}})),
        ("gang-default-min-count", json!({"parallelism": 3, "scheduling": {"schedulingPolicy": {"gang": {}}}})),
        ("gang-zero-parallelism", json!({"parallelism": 0, "scheduling": {"schedulingPolicy": {"gang": {}}}})),
        (
            "topology",
            sched(json!({"schedulingPolicy": {"gang": {}},
                "schedulingConstraints": {"topology": [{"key": "topology.muster.dev/rack"}]}})),
        ),
        ("empty-topology", sched(json!({"schedulingPolicy": {"gang": {}}, "schedulingConstraints": {"topology": []}}))),
        ("disruption-all", sched(json!({"schedulingPolicy": {"gang": {}}, "disruptionMode": {"all": {}}}))),
        ("claims-by-name", sched(json!({"resourceClaims": [{"name": "shared", "resourceClaimName": "dataset"}]}))),
        (
            "claims-by-template",
            sched(json!({"schedulingPolicy": {"gang": {}}, "resourceClaims": [
                {"name": "slice", "resourceClaimTemplateName": "gpu-slice"},
                {"name": "shared", "resourceClaimName": "dataset"}]})),
        ),
        (
            "priority-class",
            json!({"scheduling": {"schedulingPolicy": {"gang": {}}},
                "template": {"spec": {"priorityClassName": priority_class}}}),
        ),
    ]
}

#[tokio::test]
async fn jobs_and_musterjobs_compile_to_the_same_workload_and_podgroup() {
    let _muster = muster().await;
    let ns = namespace("diff-compile");
    let priority_class = "muster-e2e-diff";
    priority_class_1000(priority_class);
    let c = client().await;
    let muster_wl: Api<DynamicObject> = Api::namespaced_with(c.clone(), &ns.name, &muster_kind("Workload"));
    let muster_pg: Api<DynamicObject> = Api::namespaced_with(c.clone(), &ns.name, &muster_kind("PodGroup"));

    let variants = variants(priority_class);
    for (name, spec) in &variants {
        for kind in ["Job", "MusterJob"] {
            let manifest = job_manifest(kind, name, spec).to_string();
            cluster().kubectl_stdin(&["-n", &ns.name, "create", "-f", "-"], Some(&manifest)).unwrap();
        }
    }
    let mut differences = Vec::new();
    for (name, _) in &variants {
        let name = *name;
        let (uwl, upg) = wait_for(&format!("upstream Workload and PodGroup of Job {name}"), TIMEOUT, || {
            native_objects(&ns.name, "Job", name)
        })
        .await;
        let mwl = wait_for(&format!("muster's Workload {name}"), TIMEOUT, || async {
            muster_wl.get_opt(name).await.ok().flatten()
        })
        .await;
        let mpg = wait_for(&format!("muster's PodGroup {name}"), TIMEOUT, || async {
            muster_pg.get_opt(name).await.ok().flatten()
        })
        .await;
        assert_eq!(uwl.data["spec"]["controllerRef"], json!({"apiGroup": "batch", "kind": "Job", "name": name}));
        assert_eq!(
            mwl.data["spec"]["controllerRef"],
            json!({"apiGroup": "batch.muster.dev", "kind": "MusterJob", "name": name})
        );
        differences.extend(differences_of(name, ("upstream", &uwl, &upg), ("muster", &mwl, &mpg)));
        let want = if name == "priority-class" { 1000 } else { 0 };
        assert_eq!(upg.data["spec"]["priority"], json!(want), "upstream priority: {name}");
        assert_eq!(mpg.data["spec"]["priority"], json!(want), "muster priority: {name}");
    }
    assert!(differences.is_empty(), "{} difference(s):\n{}", differences.len(), differences.join("\n"));
}

/// Upstream mode: a MusterJob recorded as `upstream` makes the native Workload and PodGroup
/// itself; for every variant, the shared claims and the topology constraint too (the test
/// control plane keeps both: `DRAWorkloadResourceClaims` and `TopologyAwareWorkloadScheduling`
/// on), they hold what the Job controller makes of the same `spec.scheduling`.
#[tokio::test]
async fn jobs_and_upstream_musterjobs_compile_to_the_same_native_objects() {
    let _muster = muster().await;
    let ns = namespace("diff-native");
    let priority_class = "muster-e2e-diff";
    priority_class_1000(priority_class);
    let variants = variants(priority_class);
    for (name, spec) in &variants {
        let job = job_manifest("Job", name, spec).to_string();
        cluster().kubectl_stdin(&["-n", &ns.name, "create", "-f", "-"], Some(&job)).unwrap();
        let mut musterjob = job_manifest("MusterJob", name, spec);
        musterjob["metadata"]["annotations"] = json!({muster::crds::SCHEDULING_API_ANNOTATION: "upstream"});
        cluster().kubectl_stdin(&["-n", &ns.name, "create", "-f", "-"], Some(&musterjob.to_string())).unwrap();
    }
    let mut differences = Vec::new();
    for (name, _) in &variants {
        let name = *name;
        let (uwl, upg) = wait_for(&format!("the Job controller's objects of {name}"), TIMEOUT, || {
            native_objects(&ns.name, "Job", name)
        })
        .await;
        let (mwl, mpg) = wait_for(&format!("muster's native objects of {name}"), TIMEOUT, || {
            native_objects(&ns.name, "MusterJob", name)
        })
        .await;
        assert_eq!(mwl.metadata.name.as_deref(), Some(name));
        differences.extend(differences_of(name, ("Job", &uwl, &upg), ("MusterJob", &mwl, &mpg)));
    }
    assert_eq!(variants.len(), 13, "every variant compared");
    assert!(differences.is_empty(), "{} difference(s):\n{}", differences.len(), differences.join("\n"));
}

/// Both answers to a case, side by side (shown with `--nocapture`): the messages are compared
/// by eye, the paths by [`compare`].
fn show(case: &str, upstream: &Result<String, String>, muster: &Result<String, String>) {
    let text = |r: &Result<String, String>| match r {
        Ok(_) => "admitted".to_string(),
        Err(e) => e.trim().replace('\n', " "),
    };
    eprintln!("{case}\n  Job:       {}\n  MusterJob: {}", text(upstream), text(muster));
}

/// `Ok(paths)`: the paths of the refusal (empty when admitted).
fn outcome(result: Result<String, String>) -> Result<BTreeSet<String>, String> {
    match result {
        Ok(_) => Ok(BTreeSet::new()),
        Err(e) => {
            let paths = error_paths(&e);
            if paths.is_empty() { Err(e) } else { Ok(paths) }
        }
    }
}

fn compare(
    case: &str,
    upstream: Result<BTreeSet<String>, String>,
    muster: Result<BTreeSet<String>, String>,
    want: &[&str],
    differs: Option<(&[&str], &str)>,
) -> Option<String> {
    let (upstream, muster) = match (upstream, muster) {
        (Ok(u), Ok(m)) => (u, m),
        (u, m) => return Some(format!("{case}: refused without a field path: upstream {u:?}, muster {m:?}")),
    };
    let want_upstream = differs.map(|(p, _)| path_set(p)).unwrap_or_else(|| path_set(want));
    let mut problems = Vec::new();
    if muster != path_set(want) {
        problems.push(format!("muster {muster:?}, expected {want:?}"));
    }
    if upstream != want_upstream {
        problems.push(format!("upstream {upstream:?}, expected {want_upstream:?}"));
    }
    (!problems.is_empty()).then(|| format!("{case}: {}", problems.join("; ")))
}

#[tokio::test]
async fn jobs_and_musterjobs_are_refused_alike() {
    let _muster = muster().await;
    let ns = namespace("diff-validate");
    let create = |manifest: &Value| {
        cluster().kubectl_stdin(&["-n", &ns.name, "create", "--dry-run=server", "-f", "-"], Some(&manifest.to_string()))
    };
    let mut report = Vec::new();
    for case in create_cases() {
        let name = case.object_name.clone().unwrap_or_else(|| case.name.replace('_', "-"));
        let (u, m) =
            (create(&job_manifest("Job", &name, &case.spec)), create(&job_manifest("MusterJob", &name, &case.spec)));
        show(case.name, &u, &m);
        let (upstream, muster) = (outcome(u), outcome(m));
        report.extend(compare(case.name, upstream, muster, case.paths, case.upstream));
    }

    for (base, spec) in update_bases() {
        for kind in ["Job", "MusterJob"] {
            let manifest = job_manifest(kind, base, &spec).to_string();
            cluster().kubectl_stdin(&["-n", &ns.name, "create", "-f", "-"], Some(&manifest)).unwrap();
        }
    }
    for case in update_cases() {
        let patch = case.patch.to_string();
        let run = |resource: &str| {
            cluster().kubectl(&[
                "-n",
                &ns.name,
                "patch",
                resource,
                case.base,
                "--type=merge",
                "--dry-run=server",
                "-p",
                &patch,
            ])
        };
        let (u, m) = (run("job"), run("musterjob"));
        show(case.name, &u, &m);
        report.extend(compare(case.name, outcome(u), outcome(m), case.paths, case.upstream));
    }
    let total = create_cases().len() + update_cases().len();
    let differ: Vec<String> = create_cases()
        .iter()
        .filter_map(|c| c.upstream.map(|(_, why)| format!("{}: {why}", c.name)))
        .chain(update_cases().iter().filter_map(|c| c.upstream.map(|(_, why)| format!("{}: {why}", c.name))))
        .collect();
    eprintln!(
        "validation: {} of {total} cases as batch/v1 decides them (same outcome, same field paths); {} differ on purpose:\n  {}",
        total - differ.len() - report.len(),
        differ.len(),
        differ.join("\n  ")
    );
    assert!(report.is_empty(), "{} case(s) where muster and batch/v1 disagree:\n{}", report.len(), report.join("\n"));
}

//! The DRA objects the MusterJob controller makes: one shared ResourceClaim per PodGroup for a
//! `resourceClaimTemplateName` entry (owned by the PodGroup, referenced by every pod, listed in
//! its status, collected with the job), and with `spec.gpuClaims` the job's GPU
//! ResourceClaimTemplate and the pods that claim from it. Admission is not DRA-aware yet, so
//! the pods stay gated (no node matches them) and only the controller's part is checked.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use muster::controllers::job::plan::{GPU_INDICES_ENV, condition};
use muster::crds::scheduling::PodGroupResourceClaimStatus;
use muster::crds::{GPU_CLAIM_NAME, GPU_RESOURCE, GROUP_CLAIM_ANNOTATION, JOB_NAME_LABEL, MusterJob, PodGroup};

use crate::harness::manager::muster;
use crate::harness::{client, cluster, kubectl, kubectl_apply, namespace, wait_for};

const SHORT: Duration = Duration::from_secs(25);

/// Typed APIs of one namespace.
struct Apis {
    jobs: Api<MusterJob>,
    groups: Api<PodGroup>,
    pods: Api<Pod>,
    claims: Api<ResourceClaim>,
    templates: Api<ResourceClaimTemplate>,
}

async fn apis(ns: &str) -> Apis {
    let c = client().await;
    Apis {
        jobs: Api::namespaced(c.clone(), ns),
        groups: Api::namespaced(c.clone(), ns),
        pods: Api::namespaced(c.clone(), ns),
        claims: Api::namespaced(c.clone(), ns),
        templates: Api::namespaced(c, ns),
    }
}

/// A DeviceClass of one test (cluster-scoped), deleted when dropped.
struct DeviceClass(String);

impl DeviceClass {
    fn create(ns: &str) -> Self {
        let name = format!("{ns}-class");
        kubectl_apply(
            ns,
            &format!("apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {{name: {name}}}\nspec: {{}}\n"),
        );
        Self(name)
    }
}

impl Drop for DeviceClass {
    fn drop(&mut self) {
        let _ = cluster().kubectl(&["delete", "deviceclass", &self.0, "--wait=false", "--ignore-not-found"]);
    }
}

/// A ResourceClaimTemplate `name` asking for one device of `class`, whose claims get label
/// `team: e2e` and annotation `note: shared`.
fn template(ns: &str, name: &str, class: &str) {
    kubectl_apply(
        ns,
        &format!(
            r#"
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{name: {name}}}
spec:
  metadata: {{labels: {{team: e2e}}, annotations: {{note: shared}}}}
  spec:
    devices:
      requests:
      - {{name: dev, exactly: {{deviceClassName: {class}, count: 1}}}}
"#
        ),
    );
}

/// A MusterJob of `pods` gated pods (no node matches them) with `extra` spec fields (YAML,
/// indented for `spec:`) and a container of `gpus` GPUs (none when 0).
fn job(ns: &str, name: &str, pods: u32, gpus: u32, extra: &str) {
    let gpu = if gpus > 0 { format!("nvidia.com/gpu: \"{gpus}\", ") } else { String::new() };
    kubectl_apply(
        ns,
        &format!(
            r#"
apiVersion: batch.muster.dev/v1alpha1
kind: MusterJob
metadata: {{name: {name}}}
spec:
  parallelism: {pods}
  completions: {pods}
  completionMode: Indexed
{extra}
  template:
    spec:
      restartPolicy: Never
      nodeSelector: {{muster.dev/e2e: nowhere}}
      containers:
      - {{name: main, image: none, resources: {{limits: {{{gpu}cpu: "1"}}}}}}
"#
        ),
    );
}

/// Live pods of MusterJob `job`, once there are `n`.
async fn pods_of(pods: &Api<Pod>, job: &str, n: usize) -> Vec<Pod> {
    let lp = ListParams::default().labels(&format!("{JOB_NAME_LABEL}={job}"));
    wait_for(&format!("{n} pods of MusterJob {job}"), SHORT, || async {
        let live: Vec<Pod> =
            pods.list(&lp).await.ok()?.items.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
        (live.len() == n).then_some(live)
    })
    .await
}

fn controlled_by(owners: &[OwnerReference], kind: &str, name: &str, uid: &str) -> bool {
    owners.len() == 1
        && owners[0].kind == kind
        && owners[0].name == name
        && owners[0].uid == uid
        && owners[0].controller == Some(true)
        && owners[0].block_owner_deletion == Some(true)
}

/// The pod-level claim entries of a pod as (name, claim name, template name).
fn pod_claims(p: &Pod) -> Vec<(String, Option<String>, Option<String>)> {
    let claims = p.spec.as_ref().and_then(|s| s.resource_claims.clone()).unwrap_or_default();
    claims.into_iter().map(|c| (c.name, c.resource_claim_name, c.resource_claim_template_name)).collect()
}

/// The job's `ClaimsReady` condition as (status, reason), once it is `want`.
async fn claims_ready(jobs: &Api<MusterJob>, job: &str, want: &str) -> (String, String, String) {
    wait_for(&format!("ClaimsReady={want} on MusterJob {job}"), SHORT, || async {
        let j = jobs.get_opt(job).await.ok()??;
        let c = j.status?.conditions.into_iter().find(|c| c.type_ == condition::CLAIMS_READY)?;
        (c.status == want).then_some((c.status, c.reason, c.message))
    })
    .await
}

#[tokio::test]
async fn a_group_claim_is_made_once_shared_by_every_pod_and_collected_with_the_job() {
    let _muster = muster().await;
    let ns = namespace("claims-group");
    let a = apis(&ns.name).await;
    let class = DeviceClass::create(&ns.name);
    template(&ns.name, "t", &class.0);
    job(
        &ns.name,
        "train",
        3,
        0,
        "  scheduling:\n    schedulingPolicy: {gang: {minCount: 3}}\n    resourceClaims:\n    - {name: shared, resourceClaimTemplateName: t}",
    );

    let pods = pods_of(&a.pods, "train", 3).await;
    let group = a.groups.get("train").await.unwrap();
    let group_uid = group.uid().unwrap();
    let claim =
        wait_for("the group's ResourceClaim", SHORT, || async { a.claims.get_opt("train-shared").await.ok()? }).await;
    let all = a.claims.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(
        all.len(),
        1,
        "exactly one claim for the group: {:?}",
        all.iter().map(|c| c.name_any()).collect::<Vec<_>>()
    );
    let owners = claim.metadata.owner_references.clone().unwrap_or_default();
    assert!(controlled_by(&owners, "PodGroup", "train", &group_uid), "{owners:?}");
    assert_eq!(claim.annotations().get(GROUP_CLAIM_ANNOTATION).map(String::as_str), Some("shared"));
    assert_eq!(claim.annotations().get("note").map(String::as_str), Some("shared"), "template annotations copied");
    assert_eq!(claim.labels().get("team").map(String::as_str), Some("e2e"), "template labels copied");
    let source = a.templates.get("t").await.unwrap();
    assert_eq!(claim.spec, source.spec.and_then(|s| s.spec), "the claim's spec is the template's");

    for p in &pods {
        assert_eq!(
            pod_claims(p),
            vec![("shared".to_string(), Some("train-shared".to_string()), None)],
            "{} references the group's claim by the entry name",
            p.name_any()
        );
    }
    // The status field is the job controller's; admission's own status writes keep it.
    let want =
        vec![PodGroupResourceClaimStatus { name: "shared".into(), resource_claim_name: Some("train-shared".into()) }];
    wait_for("PodGroup status lists the claim next to admission's counts", SHORT, || async {
        let s = a.groups.get("train").await.ok()?.status?;
        (s.resource_claim_statuses == want && s.pods == 3).then_some(())
    })
    .await;
    claims_ready(&a.jobs, "train", "True").await;

    a.jobs.delete("train", &DeleteParams::background()).await.unwrap();
    wait_for("the group's claim collected after the job is deleted", SHORT, || async {
        a.claims.get_opt("train-shared").await.ok()?.is_none().then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_missing_template_is_reported_and_the_claim_made_once_it_appears() {
    let _muster = muster().await;
    let ns = namespace("claims-missing");
    let a = apis(&ns.name).await;
    let class = DeviceClass::create(&ns.name);
    job(
        &ns.name,
        "late",
        2,
        0,
        "  scheduling:\n    resourceClaims:\n    - {name: data, resourceClaimTemplateName: later}\n    - {name: own, resourceClaimName: users-claim}",
    );
    let pods = pods_of(&a.pods, "late", 2).await;
    for p in &pods {
        assert_eq!(
            pod_claims(p),
            vec![
                ("data".to_string(), Some("late-data".to_string()), None),
                ("own".to_string(), Some("users-claim".to_string()), None)
            ],
            "pods are created, gated, referencing the claim that is not there yet"
        );
    }
    let (_, reason, message) = claims_ready(&a.jobs, "late", "False").await;
    assert_eq!(reason, "ResourceClaimTemplateNotFound");
    assert!(message.contains("later") && message.contains("late-data"), "{message}");
    let want_named =
        vec![PodGroupResourceClaimStatus { name: "own".into(), resource_claim_name: Some("users-claim".into()) }];
    let status = wait_for("the named claim listed", SHORT, || async {
        let s = a.groups.get("late").await.ok()?.status?;
        (!s.resource_claim_statuses.is_empty()).then_some(s.resource_claim_statuses)
    })
    .await;
    assert_eq!(status, want_named, "only claims that exist are listed");
    assert!(a.claims.get_opt("users-claim").await.unwrap().is_none(), "a named claim is never created by muster");

    template(&ns.name, "later", &class.0);
    let claim =
        wait_for("the claim made on a retry", SHORT, || async { a.claims.get_opt("late-data").await.ok()? }).await;
    assert_eq!(claim.owner_references()[0].kind, "PodGroup");
    claims_ready(&a.jobs, "late", "True").await;
}

#[tokio::test]
async fn gpu_claims_turn_gpu_limits_into_a_claim_template() {
    let _muster = muster().await;
    let ns = namespace("claims-gpus");
    let a = apis(&ns.name).await;
    job(&ns.name, "gpu", 2, 2, "  gpuClaims: {}");
    let pods = pods_of(&a.pods, "gpu", 2).await;
    let job = a.jobs.get("gpu").await.unwrap();

    let template = a.templates.get("gpu-gpus").await.expect("the template exists before the pods");
    let owners = template.metadata.owner_references.clone().unwrap_or_default();
    assert!(controlled_by(&owners, "MusterJob", "gpu", &job.uid().unwrap()), "{owners:?}");
    assert_eq!(template.labels().get(JOB_NAME_LABEL).map(String::as_str), Some("gpu"));
    let requests = template.spec.as_ref().and_then(|s| s.spec.as_ref()).and_then(|s| s.devices.as_ref());
    let requests = requests.and_then(|d| d.requests.clone()).unwrap_or_default();
    let got: Vec<(String, String, Option<String>, Option<i64>)> = requests
        .iter()
        .map(|r| {
            let e = r.exactly.clone().unwrap();
            (r.name.clone(), e.device_class_name, e.allocation_mode, e.count)
        })
        .collect();
    assert_eq!(got, vec![("main".into(), "gpu.nvidia.com".into(), Some("ExactCount".into()), Some(2))]);

    for p in &pods {
        let name = p.name_any();
        assert_eq!(pod_claims(p), vec![(GPU_CLAIM_NAME.to_string(), None, Some("gpu-gpus".to_string()))], "{name}");
        let c = &p.spec.as_ref().unwrap().containers[0];
        let r = c.resources.clone().unwrap_or_default();
        let claims: Vec<(String, Option<String>)> =
            r.claims.clone().unwrap_or_default().into_iter().map(|c| (c.name, c.request)).collect();
        assert_eq!(claims, vec![(GPU_CLAIM_NAME.to_string(), Some("main".to_string()))], "{name}");
        for map in [&r.limits, &r.requests].into_iter().flatten() {
            assert!(!map.contains_key(GPU_RESOURCE), "{name}: no {GPU_RESOURCE} left: {map:?}");
        }
        assert!(r.limits.as_ref().is_some_and(|l| l.contains_key("cpu")), "{name}: other limits stay");
        assert!(c.env.iter().flatten().any(|e| e.name == GPU_INDICES_ENV), "{name}: keeps the indices env");
    }

    // kube-controller-manager's resource-claim controller makes one claim per pod from the
    // template, also for gated pods; only when the control plane runs it.
    let features = std::fs::read_to_string(cluster().dir.join("features.txt")).unwrap_or_default();
    if !features.lines().any(|l| l.starts_with("controllers:") && l.contains("resourceclaim-controller")) {
        eprintln!("resourceclaim-controller not enabled on this control plane: per-pod claims not checked");
        return;
    }
    wait_for("one claim per pod, made from the template", SHORT, || async {
        let claims = a.claims.list(&ListParams::default()).await.ok()?.items;
        let per_pod = pods.iter().all(|p| {
            claims.iter().any(|c| {
                c.owner_references().iter().any(|o| o.uid == p.uid().unwrap_or_default())
                    && c.spec == template.spec.as_ref().and_then(|s| s.spec.clone())
            })
        });
        (claims.len() == pods.len() && per_pod).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_bad_device_class_is_refused_at_its_field() {
    let _muster = muster().await;
    let ns = namespace("claims-invalid");
    let bad_job = r#"
apiVersion: batch.muster.dev/v1alpha1
kind: MusterJob
metadata: {name: bad}
spec:
  gpuClaims: {deviceClassName: GPU_class}
  template: {spec: {restartPolicy: Never, containers: [{name: main, image: none}]}}
"#;
    let err = cluster().kubectl_stdin(&["-n", &ns.name, "create", "-f", "-"], Some(bad_job)).unwrap_err();
    assert!(err.contains("spec.gpuClaims.deviceClassName: Invalid value: \"GPU_class\""), "{err}");
    let bad_set = r#"
apiVersion: batch.muster.dev/v1alpha1
kind: MusterJobSet
metadata: {name: bad}
spec:
  replicatedJobs:
  - name: w
    template:
      spec:
        gpuClaims: {deviceClassName: GPU_class}
        template: {spec: {restartPolicy: Never, containers: [{name: main, image: none}]}}
"#;
    let err = cluster().kubectl_stdin(&["-n", &ns.name, "create", "-f", "-"], Some(bad_set)).unwrap_err();
    assert!(err.contains("spec.replicatedJobs[0].template.spec.gpuClaims.deviceClassName"), "{err}");
    assert!(kubectl(&["-n", &ns.name, "get", "musterjobs,musterjobsets", "-o", "name"]).trim().is_empty());
}

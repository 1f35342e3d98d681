//! What operating muster relies on, against the real control plane: `/metrics` over HTTPS
//! for authorised scrapers only (TokenReview, then SubjectAccessReview for the non-resource URL
//! `/metrics`).

use std::net::TcpListener;

use crate::harness::extra::extra_muster;
use crate::harness::{cluster, namespace, served};

async fn scrape(client: &reqwest::Client, url: &str, token: Option<&str>) -> (u16, String) {
    let mut request = client.get(url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

#[tokio::test]
async fn https_metrics_refuse_an_unauthenticated_scrape_and_serve_an_authorised_service_account() {
    let port = TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let secure = format!("--metrics-secure-bind-address=127.0.0.1:{port}");
    let extra = extra_muster(&[&secure], &[]).await;
    let ns = namespace("secure-metrics");
    let kubectl = |args: &[&str]| cluster().kubectl(args).unwrap_or_else(|e| panic!("kubectl {args:?}: {e}"));
    for sa in ["scraper", "stranger"] {
        kubectl(&["-n", &ns.name, "create", "serviceaccount", sa]);
    }
    // What a monitoring stack binds its scraper to (the chart ships the same ClusterRole).
    let role = format!("{}-metrics-reader", ns.name);
    kubectl(&["create", "clusterrole", &role, "--verb=get", "--non-resource-url=/metrics"]);
    kubectl(&[
        "create",
        "clusterrolebinding",
        &role,
        "--clusterrole",
        &role,
        &format!("--serviceaccount={}:scraper", ns.name),
    ]);
    let token = |sa: &str| kubectl(&["-n", &ns.name, "create", "token", sa]).trim().to_string();
    let (scraper, stranger) = (token("scraper"), token("stranger"));
    let client = reqwest::Client::builder().danger_accept_invalid_certs(true).build().expect("client");
    let url = format!("https://127.0.0.1:{port}/metrics");

    let (status, body) = scrape(&client, &url, None).await;
    assert_eq!(status, 401, "no token: {body}");
    let (status, body) = scrape(&client, &url, Some("not-a-token")).await;
    assert_eq!(status, 401, "a token the API server does not know: {body}");
    let (status, body) = scrape(&client, &url, Some(&stranger)).await;
    assert_eq!(status, 403, "a ServiceAccount not allowed /metrics: {body}");
    assert!(body.contains("stranger") && body.contains("/metrics"), "{body}");
    assert!(!body.contains("muster_"), "{body}");
    // RBAC grants reach the authorizer at once, but give the binding a moment all the same.
    let mut served = scrape(&client, &url, Some(&scraper)).await;
    for _ in 0..10 {
        if served.0 == 200 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        served = scrape(&client, &url, Some(&scraper)).await;
    }
    let (status, body) = served;
    assert_eq!(status, 200, "the authorised ServiceAccount: {body}");
    assert!(body.contains("muster_build_info{version="), "{body}");
    assert!(body.contains("# TYPE muster_admission_attempts counter"), "{body}");
    // The plain port keeps the probes, not the metrics.
    let plain = reqwest::Client::new();
    let (status, _) = scrape(&plain, &format!("http://{}/metrics", extra.endpoints.metrics), None).await;
    assert_eq!(status, 404);
    let (status, _) = scrape(&plain, &format!("http://{}/readyz", extra.endpoints.metrics), None).await;
    assert_eq!(status, 200);
}

/// On whatever control plane it runs (`make e2e-compat` runs it on each version): muster finds
/// what the API server serves, says what it leaves out, and admits a gang on what is left (on an
/// API server without DRA or the native scheduling kinds: muster's own PodGroups, count-based
/// GPUs, indices written on the pods).
#[tokio::test]
async fn muster_says_what_the_api_server_lacks_and_admits_gangs_with_what_it_has() {
    let c = crate::harness::client().await;
    let dra = served("resource.k8s.io/v1", "resourceslices").await;
    let native = served("scheduling.k8s.io/v1beta1", "podgroups").await
        && served("scheduling.k8s.io/v1beta1", "workloads").await;
    let extra = extra_muster(&["--scheduling-api=auto"], &[]).await;
    let ns = namespace("compat");
    let nodes = crate::gangs::TestNodes::add(&ns.name, 2, 8, 1).await;
    let job = crate::gangs::gpu_job("pair", 2, 4, &nodes, crate::gangs::gang(2), serde_json::json!({}));
    crate::gangs::apply(&ns.name, &job);
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(c.clone(), &ns.name);
    let bound = crate::gangs::all_bound(&pods, "pair", 2).await;
    let log = std::fs::read_to_string(&extra.log).expect("muster's log");
    let said = |text: &str| log.lines().any(|l| l.contains(text));
    eprintln!("served: resource.k8s.io/v1 {dra}, scheduling.k8s.io/v1beta1 Workload and PodGroup {native}");
    assert_eq!(said("resource.k8s.io/v1 is not served: DRA claims are not allocated by muster"), !dra, "{log}");
    if native {
        assert!(said("auto: scheduling.k8s.io/v1beta1 Workload and PodGroup are served"), "{log}");
        native_fields_are_probed_and_jobs_stay_where_they_are_honoured(&ns.name, &nodes, &extra.log).await;
    } else {
        assert!(said("auto: scheduling.k8s.io/v1beta1 Workload and PodGroup are not served"), "{log}");
        // muster's own path: its PodGroup admitted the gang whole, and each pod got GPU indices.
        let groups: kube::Api<muster::crds::PodGroup> = kube::Api::namespaced(c.clone(), &ns.name);
        crate::harness::wait_for("muster's PodGroup counting 2 pods bound", crate::gangs::LONG, || async {
            let status = groups.get("pair").await.ok()?.status?;
            (status.scheduled == 2 && status.phase.is_some()).then_some(())
        })
        .await;
        for pod in &bound {
            let indices = crate::gangs::indices_of(pod).unwrap_or_default();
            assert_eq!(indices.split(',').count(), 4, "{:?}", pod.metadata.annotations);
        }
    }
}

/// What the API server would make of `object` created in `ns`, admission included
/// (`kubectl create --dry-run=server`): the object, or kubectl's error.
fn dry_run(ns: &str, object: &serde_json::Value) -> Result<serde_json::Value, String> {
    let out = crate::harness::cluster()
        .kubectl_stdin(&["-n", ns, "create", "--dry-run=server", "-o", "json", "-f", "-"], Some(&object.to_string()))?;
    serde_json::from_str(&out).map_err(|e| format!("{e}: {out}"))
}

/// Which gated fields this API server keeps on a new native PodGroup, asked the way a user
/// would (`kubectl create --dry-run=server`): (schedulingConstraints, resourceClaims).
fn native_fields_kept(ns: &str) -> (bool, bool) {
    let probe = serde_json::json!({
        "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
        "metadata": {"name": "fields-probe", "namespace": ns},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 1}},
                 "schedulingConstraints": {"topology": [{"key": "topology.muster.dev/rack"}]},
                 "resourceClaims": [{"name": "data", "resourceClaimName": "dataset"}]},
    });
    let answer = dry_run(ns, &probe).expect("dry-run a native PodGroup");
    let kept = |field: &str| answer["spec"][field].as_object().map_or(answer["spec"][field].is_array(), |_| true);
    (kept("schedulingConstraints"), kept("resourceClaims"))
}

/// Where the native kinds are served: muster's start-up probe says what a native PodGroup keeps
/// as the API server really does, and a new job using a field it drops stays on muster's API
/// (with an event naming the field), one using a field it keeps goes upstream (`auto`).
async fn native_fields_are_probed_and_jobs_stay_where_they_are_honoured(
    ns: &str,
    nodes: &crate::gangs::TestNodes,
    log: &std::path::Path,
) {
    use kube::ResourceExt;
    use muster::crds::{MusterJob, SCHEDULING_API_ANNOTATION};
    let (constraints, claims) = native_fields_kept(ns);
    eprintln!("a native PodGroup keeps: schedulingConstraints {constraints}, resourceClaims {claims}");
    let jobs: kube::Api<MusterJob> = kube::Api::namespaced(crate::harness::client().await, ns);
    // This muster (auto) replaced the shared one's policy that records a new job's API: in
    // auto mode it records none at a create, the controller does. The API server uses the
    // replacement a moment after it is applied (a busy one took over a second): until then a
    // new job would get the shared muster's `muster`, so wait for what a dry run gets.
    let probe = crate::gangs::gpu_job("api-probe", 1, 1, nodes, crate::gangs::gang(1), serde_json::json!({}));
    crate::harness::wait_for("the API server using this muster's policy", crate::gangs::LONG, || async {
        let answer = dry_run(ns, &probe).ok()?;
        answer["metadata"]["annotations"][SCHEDULING_API_ANNOTATION].is_null().then_some(())
    })
    .await;
    let table = [
        (
            "racked",
            serde_json::json!({"schedulingConstraints": {"topology": [{"key": "topology.muster.dev/rack"}]}}),
            constraints,
            "schedulingConstraints (feature gate TopologyAwareWorkloadScheduling off)",
        ),
        (
            "shared",
            serde_json::json!({"resourceClaims": [{"name": "data", "resourceClaimName": "dataset"}]}),
            claims,
            "resourceClaims (feature gate DRAWorkloadResourceClaims off)",
        ),
    ];
    for (name, extra, kept, field) in table {
        let mut scheduling = crate::gangs::gang(1);
        scheduling.as_object_mut().expect("object").extend(extra.as_object().cloned().unwrap_or_default());
        let job = crate::gangs::gpu_job(name, 1, 1, nodes, scheduling, serde_json::json!({}));
        crate::gangs::apply(ns, &job);
        let recorded = crate::harness::wait_for(&format!("the API recorded on {name}"), crate::gangs::LONG, || async {
            jobs.get(name).await.ok()?.annotations().get(SCHEDULING_API_ANNOTATION).cloned()
        })
        .await;
        assert_eq!(recorded, if kept { "upstream" } else { "muster" }, "{name}: {field} kept {kept}");
        if !kept {
            crate::harness::wait_for(&format!("the SchedulingAPI event on {name}"), crate::gangs::LONG, || async {
                let events = crate::gangs::events_of(ns, name).await;
                events
                    .iter()
                    .any(|(_, r, m)| r == "SchedulingAPI" && m.contains(&format!("spec.scheduling.{field}")))
                    .then_some(())
            })
            .await;
        }
    }
    let log = std::fs::read_to_string(log).expect("muster's log");
    let said = |text: &str| log.lines().any(|l| l.contains(text));
    if constraints && claims {
        assert!(said("native PodGroups keep schedulingConstraints and resourceClaims"), "{log}");
    } else {
        let line = log
            .lines()
            .find(|l| l.contains("the API server drops these native PodGroup fields"))
            .unwrap_or_else(|| panic!("{log}"));
        assert_eq!(line.contains("schedulingConstraints"), !constraints, "{line}");
        assert_eq!(line.contains("resourceClaims"), !claims, "{line}");
    }
}

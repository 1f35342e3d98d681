//! What operating muster relies on, against the real control plane: `/metrics` over HTTPS
//! for authorised scrapers only (TokenReview, then SubjectAccessReview for the non-resource URL
//! `/metrics`).

use std::net::TcpListener;

use crate::harness::extra::extra_muster;
use crate::harness::{cluster, namespace};

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

//! Pod creates in batches of 1, 2, 4, ... ("slow start"), each batch's creates at once.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, PostParams};

use crate::controllers::lean_writes;

/// The most pod creates of one job in flight at once.
const CREATE_BATCH_MAX: usize = 16;

/// Creates `pods` in batches of 1, 2, 4, ... up to [`CREATE_BATCH_MAX`] pods, each batch's
/// creates at once, as upstream's Job controller does ("slow start"): a gang's pods are made
/// in a few round trips, not one each, and a create that fails (a quota, a webhook refusing)
/// costs one call, not one per pod. Stops after the batch in which a create failed. Returns
/// the names made and the first error (a name taken already, 409, is not one).
pub(super) async fn create_pods(api: &Api<Pod>, pods: Vec<Pod>) -> (Vec<String>, Option<kube::Error>) {
    let mut created = Vec::new();
    let mut pods = pods.into_iter().peekable();
    let mut batch = 1;
    while pods.peek().is_some() {
        let creates = pods
            .by_ref()
            .take(batch)
            .map(|pod| async move { lean_writes::create(api, &PostParams::default(), &pod).await });
        let mut failed = None;
        for result in futures::future::join_all(creates).await {
            match result {
                Ok(p) => created.push(p.name_any()),
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        if failed.is_some() {
            return (created, failed);
        }
        batch = (batch * 2).min(CREATE_BATCH_MAX);
    }
    (created, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    use serde_json::json;

    /// A fake API server that creates pods (a name per request, in order), refuses the pods
    /// named `refused-*` (403) and finds `taken-*` taken (409); each create takes 30 ms, and the
    /// most creates in flight at once is kept.
    async fn fake_pods_api() -> (Api<Pod>, Arc<std::sync::Mutex<Vec<String>>>, Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let _ = rustls::crypto::ring::default_provider().install_default();
        let names: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
        let (in_flight, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (seen, most) = (names.clone(), peak.clone());
        let app = axum::Router::new().fallback(move |body: String| {
            let (seen, in_flight, most) = (seen.clone(), in_flight.clone(), most.clone());
            async move {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(30)).await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                let pod: Pod = serde_json::from_str(&body).expect("a pod");
                let name = pod.metadata.name.clone().unwrap_or_default();
                seen.lock().unwrap().push(name.clone());
                let status = |code: u16, reason: &str| {
                    let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
                                      "reason": reason, "message": format!("{name}: {reason}")});
                    (axum::http::StatusCode::from_u16(code).expect("code"), body.to_string())
                };
                if name.starts_with("refused-") {
                    status(403, "Forbidden")
                } else if name.starts_with("taken-") {
                    status(409, "AlreadyExists")
                } else {
                    (axum::http::StatusCode::CREATED, body)
                }
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let client =
            kube::Client::try_from(kube::Config::new(format!("http://{addr}").parse().expect("url"))).expect("client");
        (Api::namespaced(client, "ns"), names, peak)
    }

    fn pods(names: &[&str]) -> Vec<Pod> {
        names
            .iter()
            .map(|n| Pod {
                metadata: kube::api::ObjectMeta { name: Some(n.to_string()), ..Default::default() },
                ..Default::default()
            })
            .collect()
    }

    #[tokio::test]
    async fn pods_are_created_in_doubling_batches_and_a_failed_batch_is_the_last() {
        let (api, seen, peak) = fake_pods_api().await;
        let names: Vec<String> = (0..10).map(|i| format!("p{i}")).collect();
        let (created, failed) = create_pods(&api, pods(&names.iter().map(String::as_str).collect::<Vec<_>>())).await;
        assert!(failed.is_none(), "{failed:?}");
        assert_eq!(created, names, "every pod, in order");
        // Batches of 1, 2, 4 and the last 3: never more than 4 in flight, and more than one.
        let peak = peak.load(std::sync::atomic::Ordering::SeqCst);
        assert!((2..=4).contains(&peak), "peak in flight: {peak}");
        assert_eq!(seen.lock().unwrap().len(), 10);

        // The second batch has a refusal: its other pod is made, and nothing after it is tried.
        let (api, seen, _) = fake_pods_api().await;
        let (created, failed) = create_pods(&api, pods(&["a", "refused-b", "c", "d", "e"])).await;
        assert_eq!(created, vec!["a", "c"]);
        assert!(matches!(failed, Some(kube::Error::Api(ref e)) if e.code == 403), "{failed:?}");
        let mut tried = seen.lock().unwrap().clone();
        tried.sort();
        assert_eq!(tried, vec!["a", "c", "refused-b"]);

        // A name taken already is no failure and nothing made.
        let (api, _, _) = fake_pods_api().await;
        let (created, failed) = create_pods(&api, pods(&["taken-a", "b", "c"])).await;
        assert_eq!((created, failed.is_none()), (vec!["b".to_string(), "c".to_string()], true));
    }
}

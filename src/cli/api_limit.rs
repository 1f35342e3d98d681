//! A bound on the API requests muster has in flight at once (`muster run --kube-api-in-flight`).
//!
//! Without one, muster's reconcilers, commits and status writers together kept over a hundred
//! requests in the API server at once in a 5,000-node burst: every request of every client
//! (kube-scheduler's binds, a user's `kubectl`) then waited behind them, and the server spent its
//! CPU switching between them. kube-controller-manager bounds itself the same way (a few workers
//! per controller and a client-side rate). Watches are exempt: each is one long request that is
//! open for as long as muster runs, not load.
//!
//! Requests that nothing waits on (events, and the status of MusterJobs and MusterJobSets, which
//! people and tools read but no step toward a bind does) go in the background lane: they take at
//! most a quarter of the slots, so under a burst the writes that move pods toward their binds
//! (pod creates, pins, admission's plans) are not queued behind them, and the bound can be lower
//! for the same pace.

use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::http::{Method, Request};
use tokio::sync::Semaphore;
use tower::buffer::Buffer;
use tower::{BoxError, Layer, Service, ServiceExt};

/// PURE: whether `query` (a request URI's query) asks for a watch (`watch=true` or `watch=1`),
/// which holds its request open as long as muster runs and so takes no slot.
pub fn is_watch(query: Option<&str>) -> bool {
    query.is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"))
}

/// Which slots a request may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// Any slot: the request is on the way of a pod to its bind, or something waits on its answer.
    Foreground,
    /// At most the background share of the slots.
    Background,
}

/// PURE: the lane of a request by its method and path. Writes of events (core or
/// `events.k8s.io`) and of the `status` subresource of MusterJobs and MusterJobSets go in the
/// background; reads, and every other write (pods, pins, PodGroups and their plans, Workloads,
/// claims), in the foreground.
pub fn lane(method: &Method, path: &str) -> Lane {
    if *method == Method::GET {
        return Lane::Foreground;
    }
    let segments: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    let Some(at) = segments.iter().position(|s| *s == "namespaces") else { return Lane::Foreground };
    match segments.get(at + 2..).unwrap_or_default() {
        ["events"] | ["events", _] => Lane::Background,
        ["musterjobs" | "musterjobsets", _, "status"] if segments.contains(&"batch.muster.dev") => Lane::Background,
        _ => Lane::Foreground,
    }
}

/// The layer: at most `limit` requests other than watches in flight, of them at most
/// `limit / 4` (at least 1) in the background lane; the rest wait their turn in the order they
/// came (tokio's semaphores are fair). `B` is the request body (kube's).
pub struct InFlightLimit<B> {
    permits: Arc<Semaphore>,
    background: Arc<Semaphore>,
    body: PhantomData<fn(B)>,
}

/// A clone shares the bound: its slots are the same semaphores.
impl<B> Clone for InFlightLimit<B> {
    fn clone(&self) -> Self {
        InFlightLimit { permits: self.permits.clone(), background: self.background.clone(), body: PhantomData }
    }
}

impl<B> InFlightLimit<B> {
    /// At most `limit` (at least 1) requests in flight.
    pub fn new(limit: usize) -> Self {
        let limit = limit.max(1);
        InFlightLimit {
            permits: Arc::new(Semaphore::new(limit)),
            background: Arc::new(Semaphore::new((limit / 4).max(1))),
            body: PhantomData,
        }
    }
}

impl<S, B> Layer<S> for InFlightLimit<B>
where
    S: Service<Request<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + Send + Sync,
    B: Send + 'static,
{
    type Service = Limited<S, B>;

    fn layer(&self, inner: S) -> Self::Service {
        // A buffer makes the inner stack shareable, so a request can wait for its slot without
        // holding the stack.
        Limited { inner: Buffer::new(inner, 1024), permits: self.permits.clone(), background: self.background.clone() }
    }
}

/// The service of [`InFlightLimit`].
pub struct Limited<S, B>
where
    S: Service<Request<B>>,
{
    inner: Buffer<Request<B>, S::Future>,
    permits: Arc<Semaphore>,
    background: Arc<Semaphore>,
}

impl<S, B> Service<Request<B>> for Limited<S, B>
where
    S: Service<Request<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError> + Send + Sync,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Readiness is the buffer's, awaited per request below (after its slot).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        let (permits, background) = if is_watch(request.uri().query()) {
            (None, None)
        } else {
            let background =
                (lane(request.method(), request.uri().path()) == Lane::Background).then(|| self.background.clone());
            (Some(self.permits.clone()), background)
        };
        Box::pin(async move {
            // Held until the response's head arrives: the request is the server's until then. A
            // background request takes its lane's permit first, so at most the lane's share of
            // them ever waits among the foreground requests for a slot.
            let _lane = match background {
                Some(b) => Some(b.acquire_owned().await.map_err(BoxError::from)?),
                None => None,
            };
            let _slot = match permits {
                Some(p) => Some(p.acquire_owned().await.map_err(BoxError::from)?),
                None => None,
            };
            inner.oneshot(request).await
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    #[test]
    fn watches_are_told_from_other_requests_by_their_query() {
        for (query, watch) in [
            (Some("watch=true&resourceVersion=12"), true),
            (Some("labelSelector=a&watch=1"), true),
            (Some("allowWatchBookmarks=true&watch=true"), true),
            (Some("watch=false"), false),
            (Some("limit=500"), false),
            (Some("fieldSelector=watch%3Dtrue"), false),
            (Some("allowWatchBookmarks=true"), false),
            (None, false),
        ] {
            assert_eq!(is_watch(query), watch, "{query:?}");
        }
    }

    /// A service that counts the requests inside it at once and holds each for a while.
    #[derive(Clone)]
    struct Slow {
        inside: Arc<AtomicUsize>,
        most: Arc<AtomicUsize>,
    }

    impl Service<Request<()>> for Slow {
        type Response = ();
        type Error = BoxError;
        type Future = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _request: Request<()>) -> Self::Future {
            let (inside, most) = (self.inside.clone(), self.most.clone());
            Box::pin(async move {
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            })
        }
    }

    fn request(uri: &str) -> Request<()> {
        Request::builder().uri(uri).body(()).unwrap_or_else(|e| panic!("request {uri}: {e}"))
    }

    #[test]
    fn events_and_muster_job_statuses_go_in_the_background_lane() {
        use Lane::{Background, Foreground};
        for (method, path, lane_of) in [
            (Method::POST, "/apis/events.k8s.io/v1/namespaces/a/events", Background),
            (Method::PATCH, "/apis/events.k8s.io/v1/namespaces/a/events/e.1", Background),
            (Method::POST, "/api/v1/namespaces/a/events", Background),
            (Method::PATCH, "/apis/batch.muster.dev/v1alpha1/namespaces/a/musterjobs/j/status", Background),
            (Method::PUT, "/apis/batch.muster.dev/v1alpha1/namespaces/a/musterjobsets/s/status", Background),
            (Method::GET, "/apis/events.k8s.io/v1/namespaces/a/events", Foreground),
            (Method::GET, "/apis/batch.muster.dev/v1alpha1/namespaces/a/musterjobs/j/status", Foreground),
            (Method::PATCH, "/apis/batch.muster.dev/v1alpha1/namespaces/a/musterjobs/j", Foreground),
            (Method::PATCH, "/apis/scheduling.muster.dev/v1alpha1/namespaces/a/podgroups/g/status", Foreground),
            (Method::PATCH, "/apis/other.example/v1/namespaces/a/musterjobs/j/status", Foreground),
            (Method::POST, "/api/v1/namespaces/a/pods", Foreground),
            (Method::PATCH, "/api/v1/namespaces/a/pods/p", Foreground),
            (Method::PATCH, "/api/v1/namespaces/events/pods/p", Foreground),
            (Method::PATCH, "/api/v1/namespaces/events", Foreground),
            (Method::POST, "/api/v1/namespaces/a/pods/p/eviction", Foreground),
            (Method::PATCH, "/api/v1/nodes/n/status", Foreground),
        ] {
            assert_eq!(lane(&method, path), lane_of, "{method} {path}");
        }
    }

    #[tokio::test]
    async fn no_more_than_the_limit_of_requests_are_in_flight_but_watches_pass() {
        let (inside, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let service = InFlightLimit::new(3).layer(Slow { inside: inside.clone(), most: most.clone() });
        let service = Arc::new(tokio::sync::Mutex::new(service));
        let calls = (0..12).map(|i| {
            let service = service.clone();
            async move {
                let future = service.lock().await.call(request(&format!("/api/v1/pods/p{i}")));
                future.await
            }
        });
        let results = futures::future::join_all(calls).await;
        assert!(results.iter().all(Result::is_ok));
        assert_eq!(most.load(Ordering::SeqCst), 3, "12 requests, 3 at a time");

        // Three requests hold every slot; watches still go through at once, beside them.
        most.store(0, Ordering::SeqCst);
        let mut held = Vec::new();
        for i in 0..3 {
            held.push(service.lock().await.call(request(&format!("/api/v1/pods/q{i}"))));
        }
        let watches: Vec<_> = {
            let mut s = service.lock().await;
            (0..4).map(|_| s.call(request("/api/v1/pods?watch=true&resourceVersion=1"))).collect()
        };
        let all = futures::future::join_all(held.into_iter().chain(watches)).await;
        assert!(all.iter().all(Result::is_ok));
        assert_eq!(most.load(Ordering::SeqCst), 7, "3 requests and 4 watches at once");
    }

    #[tokio::test]
    async fn the_background_lane_takes_at_most_its_share_and_foreground_requests_pass_it() {
        let (inside, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let service = InFlightLimit::new(8).layer(Slow { inside: inside.clone(), most: most.clone() });
        let service = Arc::new(tokio::sync::Mutex::new(service));
        let post =
            |uri: &str| Request::builder().method(Method::POST).uri(uri).body(()).unwrap_or_else(|e| panic!("{e}"));

        // 12 events alone: two at a time (a quarter of 8).
        let calls = (0..12).map(|_| {
            let service = service.clone();
            async move {
                let future = service.lock().await.call(post("/api/v1/namespaces/a/events"));
                future.await
            }
        });
        assert!(futures::future::join_all(calls).await.iter().all(Result::is_ok));
        assert_eq!(most.load(Ordering::SeqCst), 2, "12 events, 2 at a time");

        // 12 events queued first, then 6 pod creates: the creates take the other 6 slots at once,
        // beside the lane's 2, and are all done before the last event.
        most.store(0, Ordering::SeqCst);
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut calls = Vec::new();
        for (i, uri) in std::iter::repeat_n("/api/v1/namespaces/a/events", 12)
            .chain(std::iter::repeat_n("/api/v1/namespaces/a/pods", 6))
            .enumerate()
        {
            let future = service.lock().await.call(post(uri));
            let order = order.clone();
            calls.push(async move {
                let result = future.await;
                order.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(i);
                result
            });
        }
        assert!(futures::future::join_all(calls).await.iter().all(Result::is_ok));
        assert_eq!(most.load(Ordering::SeqCst), 8, "2 events and 6 creates at once");
        let order = order.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let last_create = order.iter().position(|i| *i == 17).unwrap_or(usize::MAX);
        let last_event = order.iter().position(|i| *i == 11).unwrap_or(0);
        assert!(last_create < last_event, "the creates finished before the last event: {order:?}");
    }
}

//! A bound on the API requests muster has in flight at once (`muster run --kube-api-in-flight`).
//!
//! Without one, muster's reconcilers, commits and status writers together kept over a hundred
//! requests in the API server at once in a 5,000-node burst: every request of every client
//! (kube-scheduler's binds, a user's `kubectl`) then waited behind them, and the server spent its
//! CPU switching between them. kube-controller-manager bounds itself the same way (a few workers
//! per controller and a client-side rate). Watches are exempt: each is one long request that is
//! open for as long as muster runs, not load.

use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::http::Request;
use tokio::sync::Semaphore;
use tower::buffer::Buffer;
use tower::{BoxError, Layer, Service, ServiceExt};

/// PURE: whether `query` (a request URI's query) asks for a watch (`watch=true` or `watch=1`),
/// which holds its request open as long as muster runs and so takes no slot.
pub fn is_watch(query: Option<&str>) -> bool {
    query.is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"))
}

/// The layer: at most `limit` requests other than watches in flight; the rest wait their turn
/// in the order they came (tokio's semaphore is fair). `B` is the request body (kube's).
pub struct InFlightLimit<B> {
    permits: Arc<Semaphore>,
    body: PhantomData<fn(B)>,
}

impl<B> InFlightLimit<B> {
    /// At most `limit` (at least 1) requests in flight.
    pub fn new(limit: usize) -> Self {
        InFlightLimit { permits: Arc::new(Semaphore::new(limit.max(1))), body: PhantomData }
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
        Limited { inner: Buffer::new(inner, 1024), permits: self.permits.clone() }
    }
}

/// The service of [`InFlightLimit`].
pub struct Limited<S, B>
where
    S: Service<Request<B>>,
{
    inner: Buffer<Request<B>, S::Future>,
    permits: Arc<Semaphore>,
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
        let permits = (!is_watch(request.uri().query())).then(|| self.permits.clone());
        Box::pin(async move {
            // Held until the response's head arrives: the request is the server's until then.
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
}

//! The HTTP middleware: classify, decide, and answer shed requests with `503`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, RETRY_AFTER};
use http::{Request, Response, StatusCode};
use pin_project::pin_project;
use tower_service::Service;

use super::utilization::{InFlight, InFlightGuard, Priority, ShedConfig, UtilizationShedder};
use crate::http::response::own_response;
use crate::http::ResponseBody;
use crate::key::RequestView;

type Classifier = Arc<dyn Fn(&RequestView<'_>) -> Priority + Send + Sync>;

const MESSAGE: &str = "server overloaded: request shed; retry later";

/// Load shedding for HTTP services (axum, tonic, hyper, any `Service<http::Request<B>>`) by a
/// [`UtilizationShedder`]. See the [`shed`](super) module documentation.
///
/// Each request is [classified](Self::classify) (by default, everything is
/// [`Normal`](Priority::Normal)), then the shedder decides. A shed request never reaches the
/// inner service: it is answered `503 Service Unavailable` with `Retry-After` and a short
/// text body, or, for gRPC requests, with a trailers-only `UNAVAILABLE` (`grpc-status: 14`),
/// which gRPC clients treat as retryable.
///
/// Clones share the shedder.
#[derive(Clone)]
pub struct UtilizationShedLayer {
    shedder: Arc<UtilizationShedder>,
    classify: Classifier,
    retry_after: HeaderValue,
}

impl fmt::Debug for UtilizationShedLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UtilizationShedLayer")
            .field("shedder", &self.shedder)
            .field("retry_after", &self.retry_after)
            .finish_non_exhaustive()
    }
}

impl UtilizationShedLayer {
    /// Sheds as `shedder` decides. Pass an `Arc` to share one shedder between several
    /// layers (e.g. an HTTP and a gRPC router in the same process).
    ///
    /// If the shedder was made by [`UtilizationShedder::in_flight`], the layer counts the
    /// requests in flight through it: from the admission of a request until its response
    /// future completes or is dropped. Shed requests are not counted. A streaming response
    /// body is not counted once its headers are out, so long streams make the utilization
    /// look lower than it is.
    pub fn new(shedder: impl Into<Arc<UtilizationShedder>>) -> Self {
        UtilizationShedLayer {
            shedder: shedder.into(),
            classify: Arc::new(|_: &RequestView<'_>| Priority::Normal),
            retry_after: HeaderValue::from(1u64),
        }
    }

    /// Sheds by the requests in flight through this layer (and its clones) out of
    /// `capacity`, with the [default configuration](ShedConfig::default): the
    /// utilization is `in flight / capacity`.
    pub fn in_flight(capacity: usize) -> Self {
        UtilizationShedLayer::new(UtilizationShedder::in_flight(
            ShedConfig::default(),
            capacity,
        ))
    }

    /// How to classify requests (default: everything [`Normal`](Priority::Normal)).
    /// [`Priority::by_method`] puts reads before writes; [`Critical`](Priority::Critical)
    /// requests are never shed.
    pub fn classify<F>(mut self, classify: F) -> Self
    where
        F: Fn(&RequestView<'_>) -> Priority + Send + Sync + 'static,
    {
        self.classify = Arc::new(classify);
        self
    }

    /// The `Retry-After` of shed HTTP requests, in whole seconds rounded up, at least 1
    /// (default 1 s).
    ///
    /// The shedding amount moves over minutes, so the same request soon after is about as
    /// likely to be shed again; but shedding is random, so a retry may get through. Clients
    /// should treat it as a floor and back off exponentially.
    pub fn retry_after(mut self, wait: Duration) -> Self {
        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        self.retry_after = HeaderValue::from(secs.max(1));
        self
    }

    /// The shedder: to read its [amount](UtilizationShedder::amount) (for metrics) or its
    /// [in-flight counter](UtilizationShedder::in_flight_counter).
    pub fn shedder(&self) -> &Arc<UtilizationShedder> {
        &self.shedder
    }
}

impl<S> tower_layer::Layer<S> for UtilizationShedLayer {
    type Service = UtilizationShed<S>;

    fn layer(&self, inner: S) -> UtilizationShed<S> {
        UtilizationShed {
            inner,
            layer: self.clone(),
        }
    }
}

/// An HTTP service wrapped by [`UtilizationShedLayer`].
#[derive(Clone)]
pub struct UtilizationShed<S> {
    inner: S,
    layer: UtilizationShedLayer,
}

impl<S: fmt::Debug> fmt::Debug for UtilizationShed<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UtilizationShed")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

impl<S> UtilizationShed<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for UtilizationShed<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let layer = &self.layer;
        let view = RequestView::of(&req);
        let priority = (layer.classify)(&view);
        if layer.shedder.should_shed(priority) {
            let res = shed_response(view.is_grpc(), &layer.retry_after);
            return ResponseFuture {
                kind: Kind::Shed { res: Some(res) },
                guard: None,
            };
        }
        let guard = layer.shedder.in_flight_counter().map(InFlight::start);
        ResponseFuture {
            kind: Kind::Called {
                fut: self.inner.call(req),
            },
            guard,
        }
    }
}

/// The answer to a shed request: plain text for HTTP; for gRPC a trailers-only response
/// (HTTP 200, `grpc-status` and `grpc-message` in the headers), which is what gRPC clients
/// read.
fn shed_response(grpc: bool, retry_after: &HeaderValue) -> Response<Bytes> {
    let mut res = own_response(StatusCode::SERVICE_UNAVAILABLE, MESSAGE, grpc);
    if !grpc {
        res.headers_mut().insert(RETRY_AFTER, retry_after.clone());
    }
    res
}

/// The future returned by [`UtilizationShed`]: the inner service's response, or the answer
/// to a shed request. It holds the request's place in the in-flight count, if any.
#[pin_project]
pub struct ResponseFuture<F> {
    #[pin]
    kind: Kind<F>,
    guard: Option<InFlightGuard>,
}

#[pin_project(project = KindProj)]
enum Kind<F> {
    Called {
        #[pin]
        fut: F,
    },
    Shed {
        res: Option<Response<Bytes>>,
    },
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Called { .. } => "called",
            Kind::Shed { .. } => "shed",
        };
        f.debug_struct("ResponseFuture")
            .field("kind", &kind)
            .field("in_flight", &self.guard.is_some())
            .finish()
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.kind.project() {
            KindProj::Called { fut } => {
                let out = ready!(fut.poll(cx));
                // The request is done (its body may still stream).
                this.guard.take();
                Poll::Ready(out.map(|res| res.map(ResponseBody::inner)))
            }
            KindProj::Shed { res } => {
                // Polled again after completion: a contract violation by the caller,
                // answered rather than panicked on.
                let res = res.take().unwrap_or_else(|| {
                    let mut res = Response::new(Bytes::from_static(
                        b"load-shedding response future polled after completion\n",
                    ));
                    *res.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                    res
                });
                Poll::Ready(Ok(res.map(ResponseBody::full)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http_body_util::{BodyExt, Full};
    use tower::{service_fn, ServiceExt};

    use super::*;
    use crate::store::{Clock, ManualClock};
    use http::header::CONTENT_TYPE;

    type Res = Response<Full<Bytes>>;

    async fn ok(_req: Request<()>) -> Result<Res, Infallible> {
        Ok(Response::new(Full::new(Bytes::from_static(b"hello"))))
    }

    /// A shedder at full utilization for 150 s: shedding everything but critical traffic.
    fn overloaded() -> UtilizationShedder {
        let clock = ManualClock::new(0);
        let shedder = UtilizationShedder::new(ShedConfig::default(), || 1.0)
            .clock(Clock::Manual(clock.clone()))
            .seed(5);
        for _ in 0..150 {
            shedder.update(1.0);
            clock.advance(Duration::from_secs(1));
        }
        assert_eq!(shedder.amount(), 1.0);
        shedder
    }

    fn critical_path(req: &RequestView<'_>) -> Priority {
        if req.uri.path() == "/charge" {
            Priority::Critical
        } else {
            Priority::by_method(req)
        }
    }

    fn get(path: &str) -> Request<()> {
        Request::get(path).body(()).unwrap()
    }

    #[tokio::test]
    async fn shed_http_request_gets_503_with_retry_after() {
        let layer = UtilizationShedLayer::new(overloaded())
            .classify(critical_path)
            .retry_after(Duration::from_millis(2500));
        let svc = tower_layer::Layer::layer(&layer, service_fn(ok));
        let res = svc.clone().oneshot(get("/list")).await.unwrap();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(res.headers()[RETRY_AFTER], "3");
        assert_eq!(res.headers()[CONTENT_TYPE], "text/plain; charset=utf-8");
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"server overloaded: request shed; retry later\n");

        // Writes too, at amount 1.
        let post = Request::post("/update").body(()).unwrap();
        let res = svc.clone().oneshot(post).await.unwrap();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    }

    #[tokio::test]
    async fn shed_grpc_request_gets_unavailable() {
        let layer = UtilizationShedLayer::new(overloaded());
        let svc = tower_layer::Layer::layer(&layer, service_fn(ok));
        let req = Request::post("/greeter.Greeter/SayHello")
            .header(CONTENT_TYPE, "application/grpc+proto")
            .body(())
            .unwrap();
        let res = svc.oneshot(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["grpc-status"], "14");
        assert_eq!(res.headers()["grpc-message"], MESSAGE);
        assert_eq!(res.headers()[CONTENT_TYPE], "application/grpc");
        assert!(res
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .is_empty());
    }

    #[tokio::test]
    async fn critical_requests_pass() {
        let layer = UtilizationShedLayer::new(overloaded()).classify(critical_path);
        let svc = tower_layer::Layer::layer(&layer, service_fn(ok));
        for _ in 0..200 {
            let res = svc.clone().oneshot(get("/charge")).await.unwrap();
            assert_eq!(res.status(), StatusCode::OK);
            let body = res.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(&body[..], b"hello");
        }
    }

    #[tokio::test]
    async fn nothing_is_shed_at_rest() {
        let layer = UtilizationShedLayer::in_flight(10);
        let svc = tower_layer::Layer::layer(&layer, service_fn(ok));
        for _ in 0..200 {
            let res = svc.clone().oneshot(get("/")).await.unwrap();
            assert_eq!(res.status(), StatusCode::OK);
        }
        assert_eq!(layer.shedder().in_flight_counter().unwrap().current(), 0);
    }

    #[tokio::test]
    async fn in_flight_is_counted_until_the_response_future_ends() {
        let clock = ManualClock::new(0);
        let shedder = UtilizationShedder::in_flight(ShedConfig::default(), 2)
            .clock(Clock::Manual(clock.clone()))
            .seed(9);
        let layer = UtilizationShedLayer::new(shedder).classify(critical_path);
        let counter = layer.shedder().in_flight_counter().unwrap().clone();
        let (release, released) = tokio::sync::watch::channel(false);
        let svc = tower_layer::Layer::layer(
            &layer,
            service_fn(move |req: Request<()>| {
                let mut released = released.clone();
                async move {
                    if req.uri().path() == "/charge" {
                        let _ = released.wait_for(|r| *r).await;
                    }
                    ok(req).await
                }
            }),
        );

        // Two slow critical requests fill the capacity.
        let a = tokio::spawn(svc.clone().oneshot(get("/charge")));
        let b = svc
            .clone()
            .ready_oneshot()
            .await
            .unwrap()
            .call(get("/charge"));
        while counter.current() < 2 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(counter.current(), 2);

        // Full utilization for 150 s: other requests are shed, and not counted.
        let mut shed = 0;
        for _ in 0..150 {
            let res = svc.clone().oneshot(get("/list")).await.unwrap();
            shed += usize::from(res.status() == StatusCode::SERVICE_UNAVAILABLE);
            clock.advance(Duration::from_secs(1));
        }
        assert!((40..=80).contains(&shed), "{shed}");
        assert_eq!(counter.current(), 2);
        let res = svc.clone().oneshot(get("/list")).await.unwrap();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);

        // A dropped response future leaves the count; a completed one too.
        drop(b);
        assert_eq!(counter.current(), 1);
        release.send(true).unwrap();
        let res = a.await.unwrap().unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(counter.current(), 0);
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        let layer = UtilizationShedLayer::in_flight(1);
        assert_eq!(layer.retry_after, "1");
        assert_eq!(layer.clone().retry_after(Duration::ZERO).retry_after, "1");
        assert_eq!(
            layer
                .clone()
                .retry_after(Duration::from_secs(30))
                .retry_after,
            "30"
        );
        assert_eq!(
            layer.retry_after(Duration::from_millis(30_001)).retry_after,
            "31"
        );
    }
}

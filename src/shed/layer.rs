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
use pin_project_lite::pin_project;
use tower_service::Service;

use super::priority::Classifier;
use super::{InFlight, InFlightGuard, Priority, ShedConfig, UtilizationShedder};
use crate::http::response::{grpc_pushback, shed_answer};
use crate::http::ResponseBody;
use crate::key::RequestView;

/// Load shedding for HTTP services (axum, tonic, hyper, any `Service<http::Request<B>>`) by a
/// [`UtilizationShedder`]. See the [`shed`](super) module documentation.
///
/// Each request is [classified](Self::classify) (by default, everything is
/// [`Normal`](Priority::Normal)), then the shedder decides. A shed request never reaches the
/// inner service: it is answered `503 Service Unavailable` with `Retry-After` and a short
/// text body, or, for gRPC requests, with a trailers-only `UNAVAILABLE` (`grpc-status: 14`),
/// which gRPC clients treat as retryable.
///
/// Its readiness is the inner service's: the shedder decides in `call`, once the request is
/// known, so a request waits for an inner service that holds callers back (a tower `Buffer`
/// or `ConcurrencyLimit` under it) before it can be shed. Put such services outside this
/// layer, or add tower's `LoadShed` under it to refuse at once when the inner service is
/// not ready.
///
/// Clones share the shedder.
#[derive(Clone)]
pub struct UtilizationShedLayer {
    shedder: Arc<UtilizationShedder>,
    classify: Classifier,
    retry_after: HeaderValue,
    problem_details: bool,
}

impl fmt::Debug for UtilizationShedLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UtilizationShedLayer")
            .field("shedder", &self.shedder)
            .field("retry_after", &self.retry_after)
            .field("problem_details", &self.problem_details)
            .finish_non_exhaustive()
    }
}

impl UtilizationShedLayer {
    /// Sheds as `shedder` decides. Pass an `Arc` to share one shedder between several
    /// layers (e.g. an HTTP and a gRPC router in the same process).
    ///
    /// If the shedder reads an [`InFlight`] (made by [`UtilizationShedder::in_flight`], or by
    /// [`UtilizationShedder::new`] from one), the layer counts the requests in flight through
    /// it: from the admission of a request until its response body has been sent to the end
    /// (or dropped: the client went away), so a streaming response counts for as long as it
    /// streams, as it does against a concurrency limit. A response future dropped before it
    /// completes leaves the count at once. Shed requests are not counted.
    pub fn new(shedder: impl Into<Arc<UtilizationShedder>>) -> Self {
        crate::observe::describe_metrics();
        UtilizationShedLayer {
            shedder: shedder.into(),
            classify: Arc::new(|_: &RequestView<'_>| Priority::Normal),
            retry_after: HeaderValue::from(1u64),
            problem_details: false,
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
    /// (default 1 s); shed gRPC calls get it as `grpc-retry-pushback-ms`.
    ///
    /// The shedding amount moves over minutes, so the same request soon after is about as
    /// likely to be shed again; but shedding is random, so a retry may get through. Clients
    /// should treat it as a floor and back off exponentially.
    pub fn retry_after(mut self, wait: Duration) -> Self {
        let secs = crate::http::headers::ceil_secs(wait);
        self.retry_after = HeaderValue::from(secs.max(1));
        self
    }

    /// Whether shed HTTP requests are answered with an RFC 9457 `application/problem+json`
    /// body (default: no, a line of text): the problem type `temporary-reduced-capacity` of
    /// draft-ietf-httpapi-ratelimit-headers-11, as a [`RateLimitLayer`](crate::RateLimitLayer)
    /// answering 503 uses. gRPC requests still get `UNAVAILABLE`.
    ///
    /// ```text
    /// HTTP/1.1 503 Service Unavailable
    /// Content-Type: application/problem+json
    /// Retry-After: 1
    ///
    /// {"type":"https://iana.org/assignments/http-problem-types#temporary-reduced-capacity",
    ///  "title":"Temporary Reduced Capacity","status":503,
    ///  "detail":"server overloaded: request shed; retry later"}
    /// ```
    pub fn problem_details(mut self, on: bool) -> Self {
        self.problem_details = on;
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

crate::macros::inner_service_accessors!(UtilizationShed<S>);

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
            layer.shedder.record_shed(priority);
            return ResponseFuture {
                kind: Kind::Shed {
                    grpc: view.grpc_content_type().cloned(),
                    retry_after: layer.retry_after.clone(),
                    problem: layer.problem_details,
                },
            };
        }
        let guard = layer.shedder.in_flight_counter().map(InFlight::start);
        ResponseFuture {
            kind: Kind::Called {
                fut: self.inner.call(req),
                guard,
            },
        }
    }
}

/// The answer to a shed request: plain text (or problem details) for HTTP; for gRPC a
/// trailers-only response (HTTP 200, `grpc-status` and `grpc-message` in the headers), which
/// is what gRPC clients read.
///
/// `grpc` is the request's `content-type` when it is a gRPC call. Its client gets the wait in
/// gRPC's pushback header (`UNAVAILABLE` is a code clients retry, and without it they would
/// retry at once into a server that sheds), an HTTP client in `Retry-After`.
fn shed_response(
    grpc: Option<&HeaderValue>,
    retry_after: &HeaderValue,
    problem: bool,
) -> Response<Bytes> {
    let mut res = shed_answer(StatusCode::SERVICE_UNAVAILABLE, grpc, problem);
    match grpc {
        None => {
            res.headers_mut().insert(RETRY_AFTER, retry_after.clone());
        }
        Some(_) => {
            // (the layer writes its `Retry-After` from whole seconds)
            let secs = retry_after.to_str().ok().and_then(|s| s.parse().ok());
            let wait = Duration::from_secs(secs.unwrap_or(1));
            grpc_pushback(res.headers_mut(), wait);
        }
    }
    res
}

pin_project! {
    /// The future returned by [`UtilizationShed`]: the inner service's response, or the
    /// answer to a shed request.
    ///
    /// The future of an admitted request holds its place in the in-flight count, if the
    /// shedder counts them, and hands it to the response's body, which holds it until it
    /// ends.
    pub struct ResponseFuture<F> {
        #[pin]
        kind: Kind<F>,
    }
}

pin_project! {
    /// An admitted request, or what the answer to a shed one is made of.
    #[project = KindProj]
    enum Kind<F> {
        Called {
            #[pin]
            fut: F,
            // Released with the future, or handed to the response's body.
            guard: Option<InFlightGuard>,
        },
        Shed {
            // the request's `content-type`, when it is a gRPC call
            grpc: Option<HeaderValue>,
            retry_after: HeaderValue,
            problem: bool,
        },
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("ResponseFuture");
        match &self.kind {
            Kind::Called { guard, .. } => d
                .field("kind", &"called")
                .field("in_flight", &guard.is_some()),
            Kind::Shed { grpc, .. } => d.field("kind", &"shed").field("grpc", &grpc.is_some()),
        }
        .finish()
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Called { fut, guard } => {
                let res = ready!(fut.poll(cx))?;
                // the request stays in flight until its body ends
                let guard = guard.take();
                Poll::Ready(Ok(res.map(|b| ResponseBody::inner(b).guarded(guard))))
            }
            KindProj::Shed {
                grpc,
                retry_after,
                problem,
            } => {
                let res = shed_response(grpc.as_ref(), retry_after, *problem);
                Poll::Ready(Ok(res.map(ResponseBody::full)))
            }
        }
    }
}

#[cfg(test)]
mod tests;

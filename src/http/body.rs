//! The response body of the HTTP middlewares.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// The body of a response that went through [`RateLimit`](crate::layer::RateLimit) (or
    /// a load shedder): the inner service's body, or the short text of a response the
    /// middleware produced itself (a rejection).
    ///
    /// It holds the request's concurrency slot, or its place among the requests in flight a
    /// [`UtilizationShedLayer`](crate::shed::UtilizationShedLayer) counts, until the body
    /// has been sent to the end (or dropped: the client went away), so streaming responses
    /// count as in flight.
    #[derive(Debug)]
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
        // Boxed: most responses hold nothing, and the body is moved (and boxed by axum)
        // whole. Unnamed, so that this module knows nothing of who holds what.
        held: Option<Box<dyn Held>>,
    }
}

/// What a body may hold until it ends: a concurrency guard, a shedder's in-flight guard.
pub(crate) trait Held: fmt::Debug + Send + Sync + 'static {}

impl<T: fmt::Debug + Send + Sync + 'static> Held for T {}

pin_project! {
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    /// The inner service's body.
    pub(crate) fn inner(body: B) -> Self {
        ResponseBody {
            kind: Kind::Inner { body },
            held: None,
        }
    }

    /// A body of the middleware's own.
    pub(crate) fn full(data: impl Into<Bytes>) -> Self {
        let data: Bytes = data.into();
        ResponseBody {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
            held: None,
        }
    }

    /// Holds `guard` (a request's slots, its place in a count) until the body ends.
    pub(crate) fn guarded(mut self, guard: Option<impl Held>) -> Self {
        self.held = guard.map(|g| Box::new(g) as Box<dyn Held>);
        self
    }
}

/// An empty body, as middlewares outside the layer build for responses of their own
/// (tower-http's `CorsLayer` answering a preflight, `TimeoutLayer` a request that took too
/// long: both ask for a body type with a default).
impl<B> Default for ResponseBody<B> {
    fn default() -> Self {
        ResponseBody::full(Bytes::new())
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let frame = match this.kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        };
        // The end of the body, or an error that ends it: the request is no longer in flight.
        if matches!(frame, Poll::Ready(None | Some(Err(_)))) {
            this.held.take();
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

//! The response body of the HTTP middlewares.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::ConcurrencyGuard;

pin_project! {
    /// The body of a response that went through [`RateLimit`](crate::layer::RateLimit) (or
    /// a load shedder): the inner service's body, or the short text of a response the
    /// middleware produced itself (a rejection).
    ///
    /// It holds the request's concurrency slot, when there is one, until the body has been
    /// sent to the end (or dropped: the client went away), so streaming responses count as
    /// in flight.
    #[derive(Debug)]
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
        // Boxed: most responses hold none, and the body is moved (and boxed by axum) whole.
        guard: Option<Box<ConcurrencyGuard>>,
    }
}

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
            guard: None,
        }
    }

    /// A body of the middleware's own.
    pub(crate) fn full(data: impl Into<Bytes>) -> Self {
        let data: Bytes = data.into();
        ResponseBody {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
            guard: None,
        }
    }

    /// Holds `guard` until the body ends.
    pub(crate) fn guarded(mut self, guard: Option<ConcurrencyGuard>) -> Self {
        self.guard = guard.map(Box::new);
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
            this.guard.take();
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

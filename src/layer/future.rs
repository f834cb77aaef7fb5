//! The response future of [`RateLimit`](super::RateLimit): `Checking → Calling → done`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use pin_project::pin_project;
use tower_service::Service;

use super::body::ResponseBody;
use super::response::{add_headers, limited_message, own_response};
use super::{Config, OnStoreError};
use crate::decision::Decision;
use crate::key::RequestView;
use crate::limiter::Error;

pub(crate) type CheckFuture = Pin<Box<dyn Future<Output = Result<Decision, Error>> + Send>>;

/// The future returned by [`RateLimit`](super::RateLimit).
#[pin_project]
pub struct ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    #[pin]
    state: State<S, ReqBody>,
    config: Arc<Config>,
    grpc: bool,
}

#[pin_project(project = StateProj)]
enum State<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    Checking {
        check: CheckFuture,
        inner: Option<S>,
        req: Option<Request<ReqBody>>,
    },
    Calling {
        #[pin]
        fut: S::Future,
        decision: Option<Decision>,
    },
    Ready {
        res: Option<Response<Bytes>>,
    },
}

impl<S, ReqBody> std::fmt::Debug for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Checking { .. } => "checking",
            State::Calling { .. } => "calling",
            State::Ready { .. } => "ready",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<S, ReqBody> ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    pub(crate) fn checking(
        check: CheckFuture,
        inner: S,
        req: Request<ReqBody>,
        config: &Arc<Config>,
        grpc: bool,
    ) -> Self {
        ResponseFuture {
            state: State::Checking {
                check,
                inner: Some(inner),
                req: Some(req),
            },
            config: config.clone(),
            grpc,
        }
    }

    pub(crate) fn calling(
        fut: S::Future,
        decision: Option<Decision>,
        config: &Arc<Config>,
    ) -> Self {
        ResponseFuture {
            state: State::Calling { fut, decision },
            config: config.clone(),
            grpc: false,
        }
    }

    pub(crate) fn ready(res: Response<Bytes>, config: &Arc<Config>) -> Self {
        ResponseFuture {
            state: State::Ready { res: Some(res) },
            config: config.clone(),
            grpc: false,
        }
    }
}

/// Polled again after it finished with one of the layer's own responses, or its parts went
/// missing: a contract violation by the caller, answered rather than panicked on. (After the
/// inner service's response, polling again polls the inner future, as tower's own do.)
fn misuse() -> Response<Bytes> {
    own_response(
        StatusCode::INTERNAL_SERVER_ERROR,
        "rate-limit response future polled after completion",
        false,
    )
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Checking { check, inner, req } => {
                    let result = ready!(check.as_mut().poll(cx));
                    let (Some(mut svc), Some(request)) = (inner.take(), req.take()) else {
                        this.state.set(State::Ready {
                            res: Some(misuse()),
                        });
                        continue;
                    };
                    let res = match result {
                        Ok(decision) if decision.is_allowed() => {
                            let fut = svc.call(request);
                            this.state.set(State::Calling {
                                fut,
                                decision: Some(decision),
                            });
                            continue;
                        }
                        Ok(decision) => limited(this.config, &request, &decision, *this.grpc),
                        Err(Error::Store(_)) if this.config.on_error == OnStoreError::Allow => {
                            let fut = svc.call(request);
                            this.state.set(State::Calling {
                                fut,
                                decision: None,
                            });
                            continue;
                        }
                        Err(Error::Store(e)) => {
                            let mut res = own_response(
                                StatusCode::SERVICE_UNAVAILABLE,
                                &format!("rate limiting unavailable: {e}"),
                                *this.grpc,
                            );
                            res.headers_mut()
                                .insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
                            res
                        }
                        Err(e @ Error::Cost { .. }) => {
                            own_response(StatusCode::BAD_REQUEST, &e.to_string(), *this.grpc)
                        }
                        Err(e) => own_response(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            &e.to_string(),
                            *this.grpc,
                        ),
                    };
                    this.state.set(State::Ready { res: Some(res) });
                }
                StateProj::Calling { fut, decision } => {
                    let res = ready!(fut.poll(cx))?;
                    let mut decision = decision.take();
                    let guard = decision.as_mut().and_then(Decision::take_guard);
                    let mut res = res.map(|b| ResponseBody::inner(b).guarded(guard));
                    if let Some(d) = decision {
                        add_headers(res.headers_mut(), &d, this.config.headers);
                    }
                    return Poll::Ready(Ok(res));
                }
                StateProj::Ready { res } => {
                    let res = res.take().unwrap_or_else(misuse);
                    return Poll::Ready(Ok(res.map(ResponseBody::full)));
                }
            }
        }
    }
}

/// The response to a limited request.
fn limited<B>(
    config: &Config,
    req: &Request<B>,
    decision: &Decision,
    grpc: bool,
) -> Response<Bytes> {
    let mut res = match (&config.on_limited, grpc) {
        (Some(handler), false) => handler(&RequestView::of(req), decision),
        _ => own_response(config.limited_status, &limited_message(decision), grpc),
    };
    add_headers(res.headers_mut(), decision, config.headers);
    res
}

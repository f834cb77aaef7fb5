//! [`KeyedResponseFuture`]: the response future of [`KeyedRateLimit`](super::KeyedRateLimit).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use tower_service::Service;

use super::RateLimited;
use crate::limiter::CheckFuture;
use crate::ConcurrencyGuard;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

pin_project! {
    /// The future returned by [`KeyedRateLimit`](super::KeyedRateLimit): the limiter's check
    /// (and, with [`wait_up_to`](super::KeyedRateLimitLayer::wait_up_to), the wait), then
    /// the inner service's response.
    ///
    /// # Panics
    ///
    /// Polling it again after it completed panics, as with most futures.
    pub struct KeyedResponseFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S::Future, Req>,
        // The service that answers the request once the check admits it.
        inner: S,
    }
}

pin_project! {
    #[project = StateProj]
    #[project_replace = StateProjReplace]
    enum State<F, Req> {
        // The limiter decides (and the call may wait for it to admit the request).
        Checking {
            check: CheckFuture<Req>,
            // Whether `inner` is the service `poll_ready` made ready. A call that may wait
            // gives that readiness back and gets ready again after the check.
            is_ready: bool,
        },
        // The request was admitted; the inner service gets ready again.
        Readying {
            req: Req,
            guard: Option<ConcurrencyGuard>,
        },
        // The inner service answers.
        Calling {
            #[pin]
            fut: F,
            // The request's concurrency slot, held until the inner service answers.
            guard: Option<ConcurrencyGuard>,
        },
        Done,
    }
}

impl<S: Service<Req>, Req> fmt::Debug for KeyedResponseFuture<S, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Checking { .. } => "checking",
            State::Readying { .. } => "readying",
            State::Calling { .. } => "calling",
            State::Done => "done",
        };
        f.debug_struct("KeyedResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

impl<S: Service<Req>, Req> KeyedResponseFuture<S, Req> {
    /// Checks the request, then passes it to `inner`, a ready service.
    pub(crate) fn checking(inner: S, check: CheckFuture<Req>) -> Self {
        KeyedResponseFuture {
            state: State::Checking {
                check,
                is_ready: true,
            },
            inner,
        }
    }

    /// The response of `fut`, the call of a request that is not limited, made on a ready
    /// service (`inner` is a clone of it, unused).
    pub(crate) fn calling(inner: S, fut: S::Future) -> Self {
        KeyedResponseFuture {
            state: State::Calling { fut, guard: None },
            inner,
        }
    }

    /// Checks the request, then gets `inner` ready and passes the request to it.
    pub(crate) fn checking_unready(inner: S, check: CheckFuture<Req>) -> Self {
        KeyedResponseFuture {
            state: State::Checking {
                check,
                is_ready: false,
            },
            inner,
        }
    }
}

impl<S, Req> Future for KeyedResponseFuture<S, Req>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Checking { check, is_ready } => {
                    let (outcome, req) = ready!(check.as_mut().poll(cx));
                    let is_ready = *is_ready;
                    let guard = match outcome {
                        Ok(mut decision) if decision.is_allowed() => decision.take_guard(),
                        Ok(decision) => {
                            this.state.set(State::Done);
                            return Poll::Ready(Err(RateLimited::new(decision).into()));
                        }
                        Err(e) => {
                            this.state.set(State::Done);
                            return Poll::Ready(Err(e.into()));
                        }
                    };
                    if is_ready {
                        let fut = this.inner.call(req);
                        this.state.set(State::Calling { fut, guard });
                    } else {
                        this.state.set(State::Readying { req, guard });
                    }
                }
                StateProj::Readying { .. } => {
                    if let Err(e) = ready!(this.inner.poll_ready(cx)) {
                        this.state.set(State::Done);
                        return Poll::Ready(Err(e.into()));
                    }
                    if let StateProjReplace::Readying { req, guard } =
                        this.state.as_mut().project_replace(State::Done)
                    {
                        let fut = this.inner.call(req);
                        this.state.set(State::Calling { fut, guard });
                    }
                }
                StateProj::Calling { fut, .. } => {
                    let out = ready!(fut.poll(cx)).map_err(Into::into);
                    // The inner service answered: its concurrency slot goes back.
                    this.state.set(State::Done);
                    return Poll::Ready(out);
                }
                StateProj::Done => panic!("rate-limit response future polled after completion"),
            }
        }
    }
}

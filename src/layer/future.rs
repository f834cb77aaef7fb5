//! [`ResponseFuture`]: the response future of [`RateLimit`](super::RateLimit).

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

use super::check::{Charge, ChargeFuture, Pending};
use super::config::Config;
use super::upgrade::{self, Offered};
use crate::http::headers::add_headers;
use crate::http::response::{
    error_response, grpc_pushback, grpc_response, own_response, shed_answer, GrpcCode,
    LimitedMessage, SHED_MESSAGE,
};
use crate::http::ResponseBody;
use crate::key::RequestView;
use crate::limiter::CheckFuture;
use crate::{Decision, Error};

pin_project! {
    #[project = FutureProj]
    /// The future returned by [`RateLimit`](super::RateLimit): the limiter's check, then the
    /// inner service's response — or the layer's own answer to a request it refuses.
    ///
    /// # Panics
    ///
    /// Polling it again after it completed panics, as with most futures.
    pub struct ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<S, S::Future, S::Response, ReqBody>,
        // The decision whose headers the response gets: the check's while the inner service
        // answers, the peek's while the response is charged (by response). Kept here rather
        // than in the state: a state that held it beside the inner future was built apart
        // and copied into the future whole.
        decision: Option<Decision>,
        config: Arc<Config>,
        // When the layer charges by response: the charge to make if the response is selected.
        // Boxed: most layers charge by request, and the future is moved whole, several times.
        pending: Option<Box<Pending>>,
        // The partition key of each identifier of the check, for the `pk` parameters.
        pks: Option<Arc<[Vec<u8>]>>,
        // The slots offered to the handler of a request that upgrades its connection: taken
        // back for the response's body if the handler left them.
        upgrade: Option<Offered>,
    }
}

pin_project! {
    #[project = StateProj]
    #[project_replace = StateProjReplace]
    enum State<S, F, Res, ReqBody> {
        // The limiter decides; `inner`, a ready service, answers the request if it admits it.
        Checking {
            check: CheckFuture<Request<ReqBody>>,
            inner: S,
        },
        // The inner service answers; its response gets the headers of the decision, if any.
        Calling {
            #[pin]
            fut: F,
        },
        // The response is charged (by response); it gets the headers of the charge, or
        // those of the peek before the handler (the decision) when nothing was charged.
        Charging {
            charge: ChargeFuture,
            res: Option<Res>,
        },
        // The layer answers by itself.
        Answered { res: Response<Bytes> },
        Done,
    }
}

impl<S, ReqBody> fmt::Debug for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Checking { .. } => "checking",
            State::Calling { .. } => "calling",
            State::Charging { .. } => "charging",
            State::Answered { .. } => "answered",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

impl<S, ReqBody> ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>>,
{
    /// Checks the request, then passes it to `inner`, a ready service.
    /// With `pending`, the check was a peek, and the request is charged if its response is
    /// selected.
    pub(crate) fn checking(
        inner: S,
        check: CheckFuture<Request<ReqBody>>,
        config: Arc<Config>,
        pending: Option<Box<Pending>>,
    ) -> Self {
        ResponseFuture {
            state: State::Checking { check, inner },
            decision: None,
            config,
            pending,
            pks: None,
            upgrade: None,
        }
    }

    /// The request was checked already and admitted (`decision`): passes it to `inner`, the
    /// service that was polled ready. `pks` as for
    /// [`with_partition_keys`](Self::with_partition_keys).
    ///
    /// Built whole where it is returned, from parts all made before: the request moves
    /// straight into the inner service, and its future straight into this one (a state built
    /// first, or a call that could unwind between the moves, would cost a copy of either).
    #[inline]
    pub(crate) fn admitted(
        inner: &mut S,
        mut req: Request<ReqBody>,
        mut decision: Decision,
        config: Arc<Config>,
        pending: Option<Box<Pending>>,
        pks: Option<Arc<[Vec<u8>]>>,
    ) -> Self {
        hand_over(&config, &mut req, &decision);
        let upgrade = upgrade::offer(&mut req, &mut decision);
        ResponseFuture {
            state: State::Calling {
                fut: inner.call(req),
            },
            decision: Some(decision),
            config,
            pending,
            pks,
            upgrade,
        }
    }

    /// The request was checked already and not admitted (`outcome`): the layer answers it.
    pub(crate) fn refused(
        req: &Request<ReqBody>,
        outcome: Result<Decision, Error>,
        config: Arc<Config>,
        pks: Option<Arc<[Vec<u8>]>>,
    ) -> Self {
        let res = refusal(&config, req, outcome, pks.as_deref());
        ResponseFuture::answered(res, config)
    }

    /// Adds `pk` parameters to the `RateLimit` items, from these partition keys (one per
    /// identifier of the check).
    pub(crate) fn with_partition_keys(mut self, pks: Option<Arc<[Vec<u8>]>>) -> Self {
        self.pks = pks;
        self
    }

    /// The response of the inner service's future `fut`, unchecked.
    pub(crate) fn called(fut: S::Future, config: Arc<Config>) -> Self {
        ResponseFuture {
            state: State::Calling { fut },
            decision: None,
            config,
            pending: None,
            pks: None,
            upgrade: None,
        }
    }

    /// Answers with `res`; the inner service is not called.
    pub(crate) fn answered(res: Response<Bytes>, config: Arc<Config>) -> Self {
        ResponseFuture {
            state: State::Answered { res },
            decision: None,
            config,
            pending: None,
            pks: None,
            upgrade: None,
        }
    }
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    // The usual way — the inner service answers, its response gets the decision's headers —
    // polls the inner future from a frame that holds little: every other step is out of
    // line. Inlined, they made this frame about 2 KB (states and responses built before they
    // are moved in place), and the inner service — the application's handler — ran that much
    // deeper in the stack: 17 more lines of stack a request for the data cache to hold
    // (`scripts/hot-data-lines.py`, the layer bench: 123 lines of stack, now 106).
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            if let StateProj::Calling { fut } = this.state.as_mut().project() {
                let res = ready!(fut.poll(cx))?;
                if this.config.charge_if.is_some() && this.pending.is_some() {
                    match charge_by_response(&mut this, res) {
                        Some(res) => return Poll::Ready(Ok(res)),
                        None => continue,
                    }
                }
                return Poll::Ready(Ok(answer(&mut this, res)));
            }
            if let Some(done) = step(&mut this, cx) {
                return done;
            }
        }
    }
}

/// The response of the inner service, as the layer returns it: with the headers of the
/// decision, holding its slots until the body ends.
#[inline(always)]
fn answer<S, ReqBody, ResBody>(
    this: &mut FutureProj<'_, S, ReqBody>,
    res: Response<ResBody>,
) -> Response<ResponseBody<ResBody>>
where
    S: Service<Request<ReqBody>>,
{
    // (the slots offered to an upgrading request's handler, if it left them)
    let guard = match this.upgrade.take() {
        Some(offered) => offered.take_back(),
        None => this.decision.as_mut().and_then(Decision::take_guard),
    };
    let mut res = res.map(|b| ResponseBody::inner(b).guarded(guard));
    if let Some(decision) = this.decision {
        let pks = this.pks.as_deref();
        let config = &**this.config;
        let cache = &config.header_cache;
        add_headers(res.headers_mut(), decision, config.headers, pks, cache);
    }
    this.state.set(State::Done);
    res
}

/// The response of the inner service when the layer charges by response: charged if the
/// layer selects it, with the headers of the charge (or of the peek before the handler when
/// nothing was charged); `None` while the charge runs (the state is `Charging` then).
#[cold]
#[inline(never)]
fn charge_by_response<S, ReqBody, ResBody>(
    this: &mut FutureProj<'_, S, ReqBody>,
    res: Response<ResBody>,
) -> Option<Response<ResponseBody<ResBody>>>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    let (Some(selects), Some(pending)) = (&this.config.charge_if, this.pending.take()) else {
        return Some(answer(this, res));
    };
    let (parts, body) = res.into_parts();
    let selected = selects(&parts);
    let res = Response::from_parts(parts, body);
    let shown = match selected.then(|| (*pending).charge()) {
        Some(Charge::Running(charge)) => {
            let res = Some(res);
            this.state.set(State::Charging { charge, res });
            return None;
        }
        Some(Charge::Made(charged)) => charged.or(this.decision.take()),
        None => this.decision.take(),
    };
    let res = finish(res, shown, this.config, this.pks.as_deref());
    this.state.set(State::Done);
    Some(res)
}

/// What the future resolves to.
type Answer<E, ResBody> = Result<Response<ResponseBody<ResBody>>, E>;

/// Puts a copy of `decision`, without its slots, in `req`'s extensions for the handler, when
/// the layer is set to (`RateLimitLayer::decision_in_extensions`).
#[inline]
fn hand_over<B>(config: &Config, req: &mut Request<B>, decision: &Decision) {
    if config.decision_in_extensions {
        req.extensions_mut().insert(decision.clone());
    }
}

/// A step of the future other than the inner service's answer (see `poll`): the check made
/// in the future, a charge by response, the layer's own answer. `None` to go on to the next.
#[inline(never)]
fn step<S, ReqBody, ResBody>(
    this: &mut FutureProj<'_, S, ReqBody>,
    cx: &mut Context<'_>,
) -> Option<Poll<Answer<S::Error, ResBody>>>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    match this.state.as_mut().project() {
        StateProj::Checking { check, inner } => {
            let (outcome, mut req) = match check.as_mut().poll(cx) {
                Poll::Ready(checked) => checked,
                Poll::Pending => return Some(Poll::Pending),
            };
            *this.decision = match outcome {
                Ok(decision) if decision.is_allowed() => Some(decision),
                refused => {
                    let pks = this.pks.as_deref();
                    let res = refusal(this.config, &req, refused, pks);
                    this.state.set(State::Answered { res });
                    return None;
                }
            };
            if let Some(decision) = this.decision.as_mut() {
                hand_over(this.config, &mut req, decision);
                *this.upgrade = upgrade::offer(&mut req, decision);
            }
            let fut = inner.call(req);
            this.state.set(State::Calling { fut });
            None
        }
        // `poll` answers in this state itself
        StateProj::Calling { .. } => None,
        StateProj::Charging { charge, res } => {
            let charged = match charge.as_mut().poll(cx) {
                Poll::Ready(charged) => charged,
                Poll::Pending => return Some(Poll::Pending),
            };
            let shown = charged.or_else(|| this.decision.take());
            let pks = this.pks.as_deref();
            let res = res.take().map(|res| finish(res, shown, this.config, pks));
            this.state.set(State::Done);
            res.map(|res| Poll::Ready(Ok(res)))
        }
        StateProj::Answered { .. } => match this.state.as_mut().project_replace(State::Done) {
            StateProjReplace::Answered { res } => {
                Some(Poll::Ready(Ok(res.map(ResponseBody::full))))
            }
            _ => None,
        },
        StateProj::Done => panic!("rate-limit response future polled after completion"),
    }
}

/// The response of the inner service, with the headers of `decision` (it holds no slot: the
/// layer charges by response).
fn finish<B>(
    res: Response<B>,
    decision: Option<Decision>,
    config: &Config,
    pks: Option<&[Vec<u8>]>,
) -> Response<ResponseBody<B>> {
    let mut res = res.map(ResponseBody::inner);
    if let Some(decision) = decision {
        add_headers(
            res.headers_mut(),
            &decision,
            config.headers,
            pks,
            &config.header_cache,
        );
    }
    res
}

/// The layer's answer to a request the check did not admit: limited (429 by default), a
/// failed store (503, saying no more than that), or a check that could not be made.
fn refusal<B>(
    config: &Config,
    req: &Request<B>,
    outcome: Result<Decision, Error>,
    pks: Option<&[Vec<u8>]>,
) -> Response<Bytes> {
    let grpc = RequestView::of(req).grpc_content_type();
    match outcome {
        Ok(decision) => limited(config, req, &decision, grpc, pks),
        Err(Error::Store(_)) => {
            // The store's error stays out of the response: it describes the deployment.
            let status = StatusCode::SERVICE_UNAVAILABLE;
            let mut res = match &config.shed {
                None => error_response(
                    status,
                    "rate limiting unavailable",
                    grpc,
                    config.problem_details,
                ),
                // A fleet shedder failing closed sheds: counted as its other refusals are, and
                // answered with their status and message (an `on_limited` handler is not
                // called: there is no decision to hand it).
                Some(record) => {
                    record(&RequestView::of(req));
                    shed_answer(config.limited_status, grpc, config.problem_details)
                }
            };
            res.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from_static("1"));
            if grpc.is_some() {
                grpc_pushback(res.headers_mut(), Duration::from_secs(1));
            }
            res
        }
        Err(e) => {
            let status = match e {
                Error::Cost { .. } => StatusCode::BAD_REQUEST,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            config.unchecked_log.unchecked_answered(status.as_u16(), &e);
            error_response(status, e, grpc, config.problem_details)
        }
    }
}

/// The response to a limited request.
fn limited<B>(
    config: &Config,
    req: &Request<B>,
    decision: &Decision,
    grpc: Option<&HeaderValue>,
    pks: Option<&[Vec<u8>]>,
) -> Response<Bytes> {
    let limited = LimitedMessage(decision);
    let message: &dyn fmt::Display = match &config.shed {
        None => &limited,
        Some(record) => {
            record(&RequestView::of(req));
            &SHED_MESSAGE
        }
    };
    let mut res = match (&config.on_limited, grpc) {
        (_, Some(content_type)) => {
            let code = GrpcCode::for_limit(config.limited_status);
            let mut res = grpc_response(code, message, content_type);
            if let Some(wait) = decision.retry_after() {
                grpc_pushback(res.headers_mut(), wait);
            }
            res
        }
        (Some(handler), None) => handler(&RequestView::of(req), decision),
        (None, None) => own_response(config.limited_status, message, None),
    };
    add_headers(
        res.headers_mut(),
        decision,
        config.headers,
        pks,
        &config.header_cache,
    );
    res
}

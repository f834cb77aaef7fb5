//! [`RateLimit`]: the HTTP rate-limiting service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::config::{Action, Config, MissingKey};
use super::future::ResponseFuture;
use crate::http::response::own_response;
use crate::http::ResponseBody;
use crate::key::{KeyExtractor, PeerIp, RequestView};
use crate::{Decision, Error, Limiter};

/// An HTTP service wrapped by [`RateLimitLayer`](super::RateLimitLayer).
pub struct RateLimit<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> RateLimit<S> {
    pub(crate) fn new(inner: S, config: Arc<Config>) -> Self {
        RateLimit { inner, config }
    }

    /// The ready service answers this request; a clone takes its place for the next one.
    fn take_ready(&mut self) -> S
    where
        S: Clone,
    {
        let clone = self.inner.clone();
        std::mem::replace(&mut self.inner, clone)
    }
}

crate::macros::inner_service_accessors!(RateLimit<S>);

impl<S: Clone> Clone for RateLimit<S> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for RateLimit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("limiter", &self.config.default)
            .finish_non_exhaustive()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    ReqBody: Send + 'static,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let config = self.config.clone();
        let view = RequestView::of(&req);
        let grpc = view.is_grpc();
        let (limiter, also) = match config.rules.iter().find(|r| (r.matches)(&view)) {
            Some(rule) => match &rule.action {
                Action::Bypass => return ResponseFuture::called(self.take_ready(), req, config),
                Action::Replace(limiter) => (limiter.clone(), None),
                Action::Add(limiter) => (limiter.clone(), Some(config.default.clone())),
            },
            None => (config.default.clone(), None),
        };
        let ids: Vec<String> = if config.keys.is_empty() {
            PeerIp::default().extract(&view).into_iter().collect()
        } else {
            config
                .keys
                .iter()
                .filter_map(|k| k.0.extract(&view))
                .collect()
        };
        if ids.is_empty() {
            return match config.missing {
                MissingKey::Allow => ResponseFuture::called(self.take_ready(), req, config),
                MissingKey::Reject(status) => {
                    let res = own_response(status, "no rate-limit key found in the request", grpc);
                    ResponseFuture::answered(self.inner.clone(), res, config)
                }
            };
        }
        let cost = config.cost.as_ref().map_or(1, |f| f(&view));
        let check = Box::pin(async move { (check_both(&limiter, also, &ids, cost).await, req) });
        ResponseFuture::checking(self.take_ready(), check, config, grpc)
    }
}

/// Checks `ids` against `first`, then — if it allowed — against `then`: one decision listing
/// the limits of both, allowed if both allowed, holding the concurrency slots of both.
async fn check_both(
    first: &Limiter,
    then: Option<Limiter>,
    ids: &[String],
    cost: u64,
) -> Result<Decision, Error> {
    let mut decision = first.check_n(ids, cost).await?;
    let Some(then) = then else {
        return Ok(decision);
    };
    if !decision.is_allowed() {
        return Ok(decision);
    }
    // An error or a denial here drops the first decision, and with it any slot it took.
    let mut second = then.check_n(ids, cost).await?;
    let offset = decision
        .statuses
        .iter()
        .map(|s| s.limit_index + 1)
        .max()
        .unwrap_or(0);
    decision.statuses.extend(second.statuses.iter().map(|s| {
        let mut s = *s;
        s.limit_index += offset;
        s
    }));
    decision.allowed = second.is_allowed();
    decision.guard = match (decision.guard.take(), second.take_guard()) {
        _ if !decision.allowed => None,
        (Some(a), Some(b)) => Some(a.join(b)),
        (a, b) => a.or(b),
    };
    Ok(decision)
}

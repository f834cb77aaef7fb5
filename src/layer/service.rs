//! [`RateLimit`]: the HTTP rate-limiting service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::check::{check_both, check_both_now, AtOnce, Pending};
use super::config::{Action, Config, MissingKey};
use super::future::ResponseFuture;
use crate::http::headers::partition_key;
use crate::http::response::own_response;
use crate::http::ResponseBody;
use crate::key::{Identifiers, PeerIp, RequestView};
use crate::limiter::Mode;

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
        let config = &self.config;
        let view = RequestView::of(&req);
        let (limiter, also) = match config.rules.iter().find(|r| (r.matches)(&view)) {
            Some(rule) => match &rule.action {
                Action::Bypass => {
                    return ResponseFuture::called(self.inner.call(req), config.clone())
                }
                Action::Replace(limiter) => (limiter, None),
                Action::Add(limiter) => (limiter, Some(&config.default)),
            },
            None => (&config.default, None),
        };
        let mut ids = Identifiers::default();
        if config.keys.is_empty() {
            if let Some(id) = PeerIp::new().identifier(&view) {
                ids = Identifiers::One(id);
            }
        } else {
            for key in &config.keys {
                ids.extend(key.identifier(&view));
            }
        }
        if ids.is_empty() {
            return match config.missing {
                MissingKey::Allow => ResponseFuture::called(self.inner.call(req), config.clone()),
                MissingKey::Reject(status) => {
                    let grpc = view.is_grpc();
                    let res = own_response(status, "no rate-limit key found in the request", grpc);
                    ResponseFuture::answered(res, config.clone())
                }
            };
        }
        let cost = config.cost.as_ref().map_or(1, |f| f(&view));
        let pks: Option<Arc<[Vec<u8>]>> = config.partition_secret.as_ref().map(|secret| {
            let ids = ids.as_slice().iter();
            ids.map(|id| partition_key(secret, id.as_ref())).collect()
        });
        let shadow = config.shadow;
        // Charged by response: a peek now (counted as the request's decision), the charge
        // once the response says whether it is charged.
        let by_response = config.charge_if.is_some();
        let mode = Mode {
            charge: !by_response,
            ..Mode::CHECK.shadowed(shadow)
        };
        let done = match check_both_now(limiter, also, ids.as_slice(), cost, mode) {
            AtOnce::Decided(Ok(decision)) if decision.is_allowed() => {
                // Not `by_response.then(|| …)`: a closure taking `ids` would copy them in
                // even when it is not called.
                let pending = if by_response {
                    Some(Box::new(Pending {
                        first: limiter.clone(),
                        then: also.cloned(),
                        ids,
                        cost,
                        shadow,
                    }))
                } else {
                    None
                };
                let config = config.clone();
                let inner = &mut self.inner;
                return ResponseFuture::admitted(inner, req, decision, config, pending, pks);
            }
            AtOnce::Decided(refused) => {
                let config = config.clone();
                return ResponseFuture::refused(&req, refused, config, pks);
            }
            AtOnce::Later(done) => done,
        };
        let grpc = view.is_grpc();
        let pending = by_response.then(|| {
            Box::new(Pending {
                first: limiter.clone(),
                then: also.cloned(),
                ids: ids.clone(),
                cost,
                shadow,
            })
        });
        let (limiter, also) = (limiter.clone(), also.cloned());
        let check = Box::pin(async move {
            let ids = ids.as_slice();
            let decision = check_both(&limiter, also.as_ref(), ids, cost, mode, done).await;
            (decision, req)
        });
        let config = config.clone();
        ResponseFuture::checking(self.take_ready(), check, config, grpc, pending)
            .with_partition_keys(pks)
    }
}

//! [`RateLimit`]: the HTTP rate-limiting service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::check::{check_both, Pending};
use super::config::{Action, Config, MissingKey};
use super::future::ResponseFuture;
use crate::http::headers::partition_key;
use crate::http::response::own_response;
use crate::http::ResponseBody;
use crate::key::{KeyExtractor, PeerIp, RequestView};
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
        let pks: Option<Arc<[Vec<u8>]>> = config
            .partition_secret
            .as_ref()
            .map(|secret| ids.iter().map(|id| partition_key(secret, id)).collect());
        let shadow = config.shadow;
        if config.charge_if.is_none() {
            let mode = Mode::CHECK.shadowed(shadow);
            let check = Box::pin(async move {
                let decision = check_both(&limiter, also.as_ref(), &ids, cost, mode).await;
                (decision, req)
            });
            return ResponseFuture::checking(self.take_ready(), check, config, grpc, None)
                .with_partition_keys(pks);
        }
        // Charged by response: a peek now (counted as the request's decision), the charge
        // once the response says whether it is charged.
        let pending = Pending {
            first: limiter.clone(),
            then: also.clone(),
            ids: ids.clone(),
            cost,
            shadow,
        };
        let mode = Mode {
            charge: false,
            ..Mode::CHECK.shadowed(shadow)
        };
        let check = Box::pin(async move {
            let decision = check_both(&limiter, also.as_ref(), &ids, cost, mode).await;
            (decision, req)
        });
        ResponseFuture::checking(self.take_ready(), check, config, grpc, Some(pending))
            .with_partition_keys(pks)
    }
}

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
use crate::{Decision, Limiter};

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
            return self.without_key(req);
        }
        let cost = config.cost.as_ref().map_or(1, |f| f(&view));
        let pks = config
            .partition_secret
            .as_ref()
            .map(|secret| partition_keys(secret, &ids));
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
                    Some(pending(limiter, also, ids, cost, shadow))
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
        let pending = by_response.then(|| pending(limiter, also, ids.clone(), cost, shadow));
        let (limiter, also) = (limiter.clone(), also.cloned());
        let later = Later {
            limiter,
            also,
            ids,
            cost,
            mode,
            done,
        };
        self.checking(req, later, grpc, pending, pks)
    }
}

/// A check a store makes later (a remote store), to be made in the response future.
struct Later {
    limiter: Limiter,
    also: Option<Limiter>,
    ids: Identifiers,
    cost: u64,
    mode: Mode,
    done: Option<Decision>,
}

// The ways of a request other than the usual one (a limiter in process, a key found, charged
// by request) are kept out of `call`: their code would otherwise lie among the usual way's,
// and a request would run through more of the processor's instruction cache.
impl<S> RateLimit<S> {
    /// A request without a key: let through or answered, as the layer is configured.
    #[cold]
    #[inline(never)]
    fn without_key<ReqBody>(&mut self, req: Request<ReqBody>) -> ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        let config = &self.config;
        match config.missing {
            MissingKey::Allow => ResponseFuture::called(self.inner.call(req), config.clone()),
            MissingKey::Reject(status) => {
                let grpc = RequestView::of(&req).is_grpc();
                let res = own_response(status, "no rate-limit key found in the request", grpc);
                ResponseFuture::answered(res, config.clone())
            }
        }
    }

    /// The response future that makes `later`, then passes the request on if it admits it.
    #[inline(never)]
    fn checking<ReqBody>(
        &mut self,
        req: Request<ReqBody>,
        later: Later,
        grpc: bool,
        pending: Option<Box<Pending>>,
        pks: Option<Arc<[Vec<u8>]>>,
    ) -> ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>> + Clone,
        ReqBody: Send + 'static,
    {
        let check = Box::pin(async move {
            let (first, then, ids) = (&later.limiter, later.also.as_ref(), later.ids.as_slice());
            let (cost, mode, done) = (later.cost, later.mode, later.done);
            let decision = check_both(first, then, ids, cost, mode, done).await;
            (decision, req)
        });
        let config = self.config.clone();
        ResponseFuture::checking(self.take_ready(), check, config, grpc, pending)
            .with_partition_keys(pks)
    }
}

/// The partition key of each identifier, for the `pk` parameters.
#[cold]
#[inline(never)]
fn partition_keys(secret: &[u8], ids: &Identifiers) -> Arc<[Vec<u8>]> {
    let ids = ids.as_slice().iter();
    ids.map(|id| partition_key(secret, id.as_ref())).collect()
}

/// The charge to make if the response is selected, for a layer that charges by response.
#[cold]
#[inline(never)]
fn pending(
    limiter: &Limiter,
    also: Option<&Limiter>,
    ids: Identifiers,
    cost: u64,
    shadow: bool,
) -> Box<Pending> {
    Box::new(Pending {
        first: limiter.clone(),
        then: also.cloned(),
        ids,
        cost,
        shadow,
    })
}

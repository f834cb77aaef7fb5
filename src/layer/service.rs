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
use crate::http::response::error_response;
use crate::http::ResponseBody;
use crate::key::{Identifiers, PeerIp, RequestView};
use crate::limiter::Mode;
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

    // In two steps, each a function of its own: the check, from a frame that holds little
    // (what it decided), then the response future, built in a frame of its own that holds
    // far more (the inner service's future, a refusal, a check to make later). In one
    // function of a 1.4 KB frame, the check ran below the lines of stack the rest of the
    // request uses: 4 lines of stack more a request (`scripts/hot-data-lines.py`, the layer
    // bench).
    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let checked = check_request(&self.config, &req);
        self.respond(req, checked)
    }
}

/// What the layer decided of a request before it passes it on.
enum Checked {
    /// Passed on unchecked (a rule bypasses the layer).
    Bypassed,
    /// No key found in the request; `shadow`: every limiter that would have checked it is
    /// in shadow mode (or the layer is); `limiter`: the name of the one that would have
    /// checked it first (a route's, or the default).
    NoKey { shadow: bool, limiter: String },
    /// Admitted at once; with `pending`, the charge to make if the response is selected.
    Admitted {
        decision: Decision,
        pending: Option<Box<Pending>>,
        pks: Option<Arc<[Vec<u8>]>>,
    },
    /// Refused at once, or the check failed at once.
    Refused {
        outcome: Result<Decision, Error>,
        pks: Option<Arc<[Vec<u8>]>>,
    },
    /// To be checked in the response future (a store that must be waited on).
    Later {
        later: Later,
        pending: Option<Box<Pending>>,
        pks: Option<Arc<[Vec<u8>]>>,
    },
}

/// A request the address extractors found no address in (the server recorded no peer), and
/// that the other keys found is checked by them alone: counted and logged, as the limit of
/// the address is lost for it.
#[cold]
#[inline(never)]
fn no_address_checked(config: &Config, limiter: &Limiter) {
    config
        .no_address_log
        .missing_key(&limiter.name(), "partial");
}

/// The check of `req`, made at once when its limiters decide at once (the memory store).
#[inline(never)]
fn check_request<B>(config: &Config, req: &Request<B>) -> Checked {
    let view = RequestView::of(req);
    let (limiter, also) = match config.rules.iter().find(|r| (r.matches)(&view)) {
        Some(rule) => match &rule.action {
            Action::Bypass => return Checked::Bypassed,
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
        let mut no_address = false;
        for key in &config.keys {
            match key.identifier(&view) {
                Some(id) => ids.push(id),
                // (an address extractor finds none only when the server recorded no peer)
                None => no_address |= key.reads_address(),
            }
        }
        if no_address && !ids.is_empty() {
            no_address_checked(config, limiter);
        }
    }
    if ids.is_empty() {
        // in shadow mode when the layer is, or every limiter that would check the request is
        // (`LimiterBuilder::shadow`, `Limiter::set_shadow`)
        let shadow = config.shadow || (limiter.is_shadow() && also.is_none_or(Limiter::is_shadow));
        return Checked::NoKey {
            shadow,
            limiter: limiter.name(),
        };
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
                Some(pending(limiter, also, ids, cost, shadow, config))
            } else {
                None
            };
            return Checked::Admitted {
                decision,
                pending,
                pks,
            };
        }
        AtOnce::Decided(outcome) => return Checked::Refused { outcome, pks },
        AtOnce::Later(done) => done,
    };
    later(
        limiter,
        also,
        ids,
        cost,
        mode,
        done,
        by_response.then_some(config),
        pks,
    )
}

/// [`Checked::Later`]: the check of a store that must be waited on. Out of line: the `Later`
/// it builds would otherwise take room in `check_request`'s frame, above every check made at
/// once.
#[allow(clippy::too_many_arguments)]
#[cold]
#[inline(never)]
fn later(
    limiter: &Limiter,
    also: Option<&Limiter>,
    ids: Identifiers,
    cost: u64,
    mode: Mode,
    done: Option<Decision>,
    // (the layer's configuration when it charges by response)
    by_response: Option<&Config>,
    pks: Option<Arc<[Vec<u8>]>>,
) -> Checked {
    let pending =
        by_response.map(|config| pending(limiter, also, ids.clone(), cost, mode.shadow, config));
    let later = Later {
        limiter: limiter.clone(),
        also: also.cloned(),
        ids,
        cost,
        mode,
        done,
    };
    Checked::Later {
        later,
        pending,
        pks,
    }
}

impl<S> RateLimit<S> {
    /// The response future of a request the layer `checked`.
    #[inline(never)]
    fn respond<ReqBody>(
        &mut self,
        req: Request<ReqBody>,
        checked: Checked,
    ) -> ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>> + Clone,
        ReqBody: Send + 'static,
    {
        match checked {
            Checked::Admitted {
                decision,
                pending,
                pks,
            } => {
                let config = self.config.clone();
                let inner = &mut self.inner;
                ResponseFuture::admitted(inner, req, decision, config, pending, pks)
            }
            Checked::Refused { outcome, pks } => {
                let config = self.config.clone();
                ResponseFuture::refused(&req, outcome, config, pks)
            }
            Checked::Bypassed => ResponseFuture::called(self.inner.call(req), self.config.clone()),
            Checked::NoKey { shadow, limiter } => self.without_key(req, shadow, &limiter),
            Checked::Later {
                later,
                pending,
                pks,
            } => self.checking(req, later, pending, pks),
        }
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
    /// A request without a key: let through or answered, as the layer is configured (let
    /// through in shadow mode, which refuses nothing), and recorded under `limiter`, the
    /// limiter that would have checked it.
    #[cold]
    #[inline(never)]
    fn without_key<ReqBody>(
        &mut self,
        req: Request<ReqBody>,
        shadow: bool,
        limiter: &str,
    ) -> ResponseFuture<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        let config = &self.config;
        let action = match config.missing {
            MissingKey::Allow => "allow",
            MissingKey::Reject(_) if shadow => "shadow",
            MissingKey::Reject(_) => "reject",
        };
        config.missing_log.missing_key(limiter, action);
        match config.missing {
            MissingKey::Reject(status) if !shadow => {
                let grpc = RequestView::of(&req).grpc_content_type();
                let message = "no rate-limit key found in the request";
                let res = error_response(status, message, grpc, config.problem_details);
                ResponseFuture::answered(res, config.clone())
            }
            _ => ResponseFuture::called(self.inner.call(req), config.clone()),
        }
    }

    /// The response future that makes `later`, then passes the request on if it admits it.
    #[inline(never)]
    fn checking<ReqBody>(
        &mut self,
        req: Request<ReqBody>,
        later: Later,
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
        ResponseFuture::checking(self.take_ready(), check, config, pending).with_partition_keys(pks)
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
    config: &Config,
) -> Box<Pending> {
    Box::new(Pending {
        first: limiter.clone(),
        then: also.cloned(),
        ids,
        cost,
        shadow,
        refused: config.refused_charges_log.clone(),
    })
}

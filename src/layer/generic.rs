//! Rate limiting for any service: a closure names the identifiers of a request, and a
//! limited request fails with [`RateLimited`] — or, for outbound calls that may wait, is
//! delayed until the limit admits it.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project::pin_project;
use tower_service::Service;

use super::future::CheckFuture;
use super::OnStoreError;
use crate::decision::Decision;
use crate::limiter::{Error, Limiter};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The identifiers (and cost) of one request, as a [`KeyedRateLimitLayer`] closure returns
/// them. Build one with `.into()` from a `String`, a `Vec<String>`, or `(Vec<String>, cost)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    ids: Vec<String>,
    cost: u64,
}

impl From<String> for Keys {
    fn from(id: String) -> Keys {
        Keys {
            ids: vec![id],
            cost: 1,
        }
    }
}

impl From<&str> for Keys {
    fn from(id: &str) -> Keys {
        Keys::from(id.to_string())
    }
}

impl From<Vec<String>> for Keys {
    fn from(ids: Vec<String>) -> Keys {
        Keys { ids, cost: 1 }
    }
}

impl From<(Vec<String>, u64)> for Keys {
    fn from((ids, cost): (Vec<String>, u64)) -> Keys {
        Keys { ids, cost }
    }
}

/// The request was rate-limited: the error a [`KeyedRateLimit`] service fails with, inside
/// its `BoxError`. Downcast to read when to retry.
#[derive(Debug, Clone)]
pub struct RateLimited {
    decision: Decision,
}

impl RateLimited {
    /// How long until the same request would be admitted.
    pub fn retry_after(&self) -> Duration {
        self.decision.retry_after().unwrap_or_default()
    }

    /// The whole decision.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }
}

impl fmt::Display for RateLimited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.decision.denied_by() {
            Some(s) => write!(
                f,
                "rate limited by {}; retry in {:?}",
                s.limit,
                self.retry_after()
            ),
            None => f.write_str("rate limited"),
        }
    }
}

impl std::error::Error for RateLimited {}

/// Rate limiting for any `tower::Service`: identifiers from a closure, rejections as errors.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{KeyedRateLimitLayer, Limiter, MemoryStore};
///
/// struct Charge { provider: &'static str, cents: u64 }
///
/// // The payment provider allows 100 calls per second to the whole fleet; wait up to 2 s
/// // for a slot rather than fail.
/// let limiter = Limiter::new(MemoryStore::new(), "100/s log".parse().unwrap());
/// let layer = KeyedRateLimitLayer::new(limiter, |c: &Charge| format!("psp:{}", c.provider).into())
///     .wait_up_to(Duration::from_secs(2));
/// # let _ = layer;
/// ```
pub struct KeyedRateLimitLayer<F> {
    limiter: Limiter,
    keys: Arc<F>,
    on_error: OnStoreError,
    max_wait: Duration,
}

impl<F> Clone for KeyedRateLimitLayer<F> {
    fn clone(&self) -> Self {
        KeyedRateLimitLayer {
            limiter: self.limiter.clone(),
            keys: self.keys.clone(),
            on_error: self.on_error,
            max_wait: self.max_wait,
        }
    }
}

impl<F> fmt::Debug for KeyedRateLimitLayer<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedRateLimitLayer")
            .field("limiter", &self.limiter)
            .field("on_error", &self.on_error)
            .field("max_wait", &self.max_wait)
            .finish_non_exhaustive()
    }
}

impl<F> KeyedRateLimitLayer<F> {
    /// Checks each request against `limiter` for the identifiers `keys` returns.
    pub fn new<Req>(limiter: Limiter, keys: F) -> Self
    where
        F: Fn(&Req) -> Keys,
    {
        KeyedRateLimitLayer {
            limiter,
            keys: Arc::new(keys),
            on_error: OnStoreError::Allow,
            max_wait: Duration::ZERO,
        }
    }

    /// What to do when the store fails: let the request through (default) or fail it with
    /// the store's error.
    pub fn on_store_error(mut self, on_error: OnStoreError) -> Self {
        self.on_error = on_error;
        self
    }

    /// Instead of failing at once, wait for the limit to admit the request when that takes
    /// at most `max_wait` (throttling: outbound calls paced to a third party's limit). A
    /// request that would wait longer fails with [`RateLimited`] without waiting. A waiting
    /// call gives the inner service's readiness back and gets ready again after the wait, so
    /// it does not hold a `Buffer` slot or a concurrency permit while it sleeps.
    pub fn wait_up_to(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }
}

impl<S, F> tower_layer::Layer<S> for KeyedRateLimitLayer<F> {
    type Service = KeyedRateLimit<S, F>;

    fn layer(&self, inner: S) -> Self::Service {
        KeyedRateLimit {
            inner,
            layer: self.clone(),
        }
    }
}

/// A service wrapped by [`KeyedRateLimitLayer`].
pub struct KeyedRateLimit<S, F> {
    inner: S,
    layer: KeyedRateLimitLayer<F>,
}

impl<S: Clone, F> Clone for KeyedRateLimit<S, F> {
    fn clone(&self) -> Self {
        KeyedRateLimit {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S: fmt::Debug, F> fmt::Debug for KeyedRateLimit<S, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedRateLimit")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

impl<S, F> KeyedRateLimit<S, F> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, F, Req> Service<Req> for KeyedRateLimit<S, F>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    F: Fn(&Req) -> Keys + Send + Sync + 'static,
    Req: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = KeyedResponseFuture<S, Req>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let Keys { ids, cost } = (self.layer.keys)(&req);
        let limiter = self.layer.limiter.clone();
        let max_wait = self.layer.max_wait;
        let check: CheckFuture = Box::pin(async move {
            let deadline = tokio::time::Instant::now() + max_wait;
            loop {
                let decision = limiter.check_n(&ids, cost).await?;
                match decision.retry_after() {
                    Some(wait) if tokio::time::Instant::now() + wait <= deadline => {
                        tokio::time::sleep(wait).await;
                    }
                    _ => return Ok(decision),
                }
            }
        });
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        // A call that may wait must not sit on the inner service's readiness (a `Buffer` slot,
        // a concurrency permit) meanwhile: give it back and get ready again after the wait.
        let (inner, is_ready) = if max_wait.is_zero() {
            (ready, true)
        } else {
            drop(ready);
            (self.inner.clone(), false)
        };
        KeyedResponseFuture {
            state: KeyedState::Checking {
                check,
                inner: Some(inner),
                is_ready,
                req: Some(req),
            },
            on_error: self.layer.on_error,
        }
    }
}

/// The future returned by [`KeyedRateLimit`].
#[pin_project]
pub struct KeyedResponseFuture<S: Service<Req>, Req> {
    #[pin]
    state: KeyedState<S, Req>,
    on_error: OnStoreError,
}

impl<S: Service<Req>, Req> fmt::Debug for KeyedResponseFuture<S, Req> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedResponseFuture")
            .finish_non_exhaustive()
    }
}

#[pin_project(project = KeyedProj)]
enum KeyedState<S: Service<Req>, Req> {
    Checking {
        check: CheckFuture,
        inner: Option<S>,
        /// Whether `inner` is the service `poll_ready` made ready.
        is_ready: bool,
        req: Option<Req>,
    },
    Readying {
        svc: Option<S>,
        req: Option<Req>,
        guard: Option<crate::ConcurrencyGuard>,
    },
    Calling {
        #[pin]
        fut: S::Future,
        /// The request's concurrency slot, held until the inner service answers.
        guard: Option<crate::ConcurrencyGuard>,
    },
}

/// Polled after completion: reported as an error rather than a panic.
#[derive(Debug)]
struct PolledAfterCompletion;

impl fmt::Display for PolledAfterCompletion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("rate-limit response future polled after completion")
    }
}

impl std::error::Error for PolledAfterCompletion {}

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
                KeyedProj::Checking {
                    check,
                    inner,
                    is_ready,
                    req,
                } => {
                    let result = ready!(check.as_mut().poll(cx));
                    let (Some(mut svc), Some(request)) = (inner.take(), req.take()) else {
                        return Poll::Ready(Err(PolledAfterCompletion.into()));
                    };
                    let guard = match result {
                        Ok(mut d) if d.is_allowed() => d.take_guard(),
                        Ok(decision) => {
                            return Poll::Ready(Err(RateLimited { decision }.into()));
                        }
                        Err(Error::Store(_)) if *this.on_error == OnStoreError::Allow => None,
                        Err(e) => return Poll::Ready(Err(e.into())),
                    };
                    if *is_ready {
                        let fut = svc.call(request);
                        this.state.set(KeyedState::Calling { fut, guard });
                    } else {
                        this.state.set(KeyedState::Readying {
                            svc: Some(svc),
                            req: Some(request),
                            guard,
                        });
                    }
                }
                KeyedProj::Readying { svc, req, guard } => {
                    let Some(s) = svc.as_mut() else {
                        return Poll::Ready(Err(PolledAfterCompletion.into()));
                    };
                    ready!(s.poll_ready(cx)).map_err(Into::into)?;
                    let (Some(mut s), Some(request)) = (svc.take(), req.take()) else {
                        return Poll::Ready(Err(PolledAfterCompletion.into()));
                    };
                    let guard = guard.take();
                    let fut = s.call(request);
                    this.state.set(KeyedState::Calling { fut, guard });
                }
                KeyedProj::Calling { fut, guard } => {
                    let out = ready!(fut.poll(cx)).map_err(Into::into);
                    guard.take();
                    return Poll::Ready(out);
                }
            }
        }
    }
}

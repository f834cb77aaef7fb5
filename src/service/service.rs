//! [`KeyedRateLimit`]: the rate-limiting service for any request type.

use std::fmt;
use std::task::{Context, Poll};
use std::time::Duration;

use tower_service::Service;

use super::future::KeyedResponseFuture;
use super::{Identifiers, KeyedRateLimitLayer};
use crate::limiter::Mode;
use crate::{Decision, Error, Limiter};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A service wrapped by [`KeyedRateLimitLayer`].
///
/// # Errors
///
/// Its calls fail with a `BoxError` holding, for downcasting:
///
/// * [`RateLimited`](crate::RateLimited) when the limit refuses the call (after waiting up to
///   [`wait_up_to`](KeyedRateLimitLayer::wait_up_to), if set);
/// * the limiter's [`Error`](crate::Error) when the check cannot be made: an impossible
///   cost, no identifiers, or a failed store when the limiter fails closed
///   ([`OnStoreError::Closed`](crate::OnStoreError::Closed));
/// * otherwise the inner service's own error, unchanged.
pub struct KeyedRateLimit<S, F> {
    inner: S,
    layer: KeyedRateLimitLayer<F>,
}

impl<S, F> KeyedRateLimit<S, F> {
    pub(crate) fn new(inner: S, layer: KeyedRateLimitLayer<F>) -> Self {
        KeyedRateLimit { inner, layer }
    }
}

crate::macros::inner_service_accessors!(KeyedRateLimit<S, F>);

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

impl<S, F, Req> Service<Req> for KeyedRateLimit<S, F>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    F: Fn(&Req) -> Identifiers + Send + Sync + 'static,
    Req: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = KeyedResponseFuture<S, Req>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let (ids, cost) = (self.layer.identify)(&req).into_parts();
        let limiter = self.layer.limiter.clone();
        let max_wait = self.layer.max_wait;
        let mode = Mode::CHECK.shadowed(self.layer.shadow);
        let check = Box::pin(async move {
            let outcome = check_waiting(&limiter, &ids, cost, max_wait, mode).await;
            (outcome, req)
        });
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        if max_wait.is_zero() {
            KeyedResponseFuture::checking(ready, check)
        } else {
            // A call that may wait must not sit on the inner service's readiness (a `Buffer`
            // slot, a concurrency permit) meanwhile: give it back and get ready again after
            // the wait.
            drop(ready);
            let unready = self.inner.clone();
            KeyedResponseFuture::checking_unready(unready, check)
        }
    }
}

/// Checks (in `mode`) until the limiter admits the request, as long as the wait ends by
/// `max_wait` from now; the decision that admits it, or the one that does not within
/// `max_wait`.
///
/// # Errors
///
/// The limiter's, when a check fails.
async fn check_waiting(
    limiter: &Limiter,
    ids: &[String],
    cost: u64,
    max_wait: Duration,
    mode: Mode,
) -> Result<Decision, Error> {
    let deadline = tokio::time::Instant::now() + max_wait;
    loop {
        let decision = limiter.run(ids, cost, mode).await?;
        match decision.retry_after() {
            Some(wait) if tokio::time::Instant::now() + wait <= deadline => {
                tokio::time::sleep(wait).await;
            }
            _ => return Ok(decision),
        }
    }
}

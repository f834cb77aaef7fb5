//! [`KeyedRateLimit`]: the rate-limiting service for any request type.

use std::fmt;
use std::task::{Context, Poll};
use std::time::Duration;

use tower_service::Service;

use super::future::KeyedResponseFuture;
use super::layer::Gate;
use super::{Identifiers, KeyedRateLimitLayer};
use crate::limiter::{CheckFuture, Mode};
use crate::{Decision, Error, Scheduler};

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
///   cost, no identifiers or too many, several for a [scheduled](KeyedRateLimitLayer::scheduled)
///   layer ([`Error::NotOneIdentifier`](crate::Error::NotOneIdentifier)), or a failed store
///   when the limiter fails closed ([`OnStoreError::Closed`](crate::OnStoreError::Closed)) or
///   its fallback cannot hold the cost (in shadow mode, only the identifier errors);
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
    S: Service<Req> + Clone,
    S::Error: Into<BoxError>,
    F: Fn(&Req) -> Identifiers,
    Req: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = KeyedResponseFuture<S, Req>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let identifiers = (self.layer.identify)(&req);
        if !identifiers.is_limited() {
            // (this is the service `poll_ready` made ready; the future keeps a clone)
            let fut = self.inner.call(req);
            return KeyedResponseFuture::calling(self.inner.clone(), fut);
        }
        let (ids, cost) = identifiers.into_parts();
        let max_wait = self.layer.max_wait;
        let shadow = self.layer.shadow;
        let check: CheckFuture<Req> = match &self.layer.gate {
            Gate::Check(limiter) => {
                let limiter = limiter.clone();
                let mode = Mode::CHECK.shadowed(shadow);
                Box::pin(async move {
                    let outcome = limiter.wait_within(&ids, cost, mode, max_wait).await;
                    (outcome, req)
                })
            }
            Gate::Schedule(scheduler) => {
                let scheduler = scheduler.clone();
                Box::pin(async move {
                    let outcome = wait_for_slot(&scheduler, &ids, cost, max_wait, shadow).await;
                    (outcome, req)
                })
            }
        };
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

/// Waits for the request's slot in `scheduler`'s queue of its one identifier, when it lies at
/// most `max_wait` ahead. In shadow mode the request is placed as when enforcing and goes at
/// once, rejected or not, and a placement the store or the cost would fail lets it go too
/// (see `Scheduler::place`).
///
/// # Errors
///
/// [`Error::NoIdentifiers`], [`Error::NotOneIdentifier`], and the scheduler's own.
async fn wait_for_slot(
    scheduler: &Scheduler,
    ids: &[String],
    cost: u64,
    max_wait: Duration,
    shadow: bool,
) -> Result<Decision, Error> {
    let id = match ids {
        [] => return Err(Error::NoIdentifiers),
        [first, rest @ ..] => match rest.iter().filter(|i| *i != first).count() {
            0 => first,
            // distinct identifiers, the first one included
            _ => {
                let mut distinct: Vec<&String> = ids.iter().collect();
                distinct.sort();
                distinct.dedup();
                return Err(Error::NotOneIdentifier(distinct.len()));
            }
        },
    };
    if !shadow {
        return scheduler.schedule_n(id, cost, max_wait).await;
    }
    let (decision, pending) = scheduler.place(id, cost, max_wait, true).await?;
    if let Some(mut pending) = pending {
        // charged as when enforcing: the slot stays taken
        pending.store = None;
    }
    Ok(decision)
}

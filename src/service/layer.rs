//! [`KeyedRateLimitLayer`] and the [`Identifiers`] its closure returns.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::KeyedRateLimit;
use crate::{Limiter, Scheduler};

/// What a [`KeyedRateLimitLayer`] checks a request for: the identifiers (all-or-nothing, as
/// with [`Limiter::check`]) and the cost (default 1) — or, with [`Identifiers::none`],
/// nothing: the request passes unlimited.
///
/// The layer's closure returns one, usually built with `.into()`:
///
/// ```
/// use tollgate::service::Identifiers;
///
/// let one: Identifiers = "psp:acme".into();                                  // cost 1
/// let both: Identifiers = vec!["psp:acme".to_string(), "merchant:7".to_string()].into();
/// let weighted = Identifiers::new(["psp:acme"], 5);                         // cost 5
/// assert_eq!(weighted.ids(), ["psp:acme"]);
/// assert_eq!(weighted.cost(), 5);
/// let health_check = Identifiers::none();                                   // not limited
/// assert!(!health_check.is_limited());
/// # let _ = (one, both);
/// ```
///
/// An empty list of identifiers is an error ([`Error::NoIdentifiers`](crate::Error)), as
/// with [`Limiter::check`]: a closure that found none by mistake fails loudly, and one that
/// means to let a request through says so with [`Identifiers::none`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identifiers {
    ids: Vec<String>,
    cost: u64,
    /// `false` for [`Identifiers::none`]: the request passes unchecked.
    limited: bool,
}

impl Identifiers {
    /// The identifiers `ids`, checked together for `cost`.
    pub fn new<I>(ids: I, cost: u64) -> Identifiers
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        Identifiers {
            ids: ids.into_iter().map(Into::into).collect(),
            cost,
            limited: true,
        }
    }

    /// No identifiers: the request passes unlimited — unchecked, uncounted, and with no
    /// decision in the metrics (a health check, a caller of the service's own).
    pub fn none() -> Identifiers {
        Identifiers {
            ids: Vec::new(),
            cost: 0,
            limited: false,
        }
    }

    /// Whether the request is checked: `false` for [`Identifiers::none`].
    pub fn is_limited(&self) -> bool {
        self.limited
    }

    /// The identifiers the request is checked for.
    pub fn ids(&self) -> &[String] {
        &self.ids
    }

    /// The cost (weight) of the request.
    pub fn cost(&self) -> u64 {
        self.cost
    }

    pub(crate) fn into_parts(self) -> (Vec<String>, u64) {
        (self.ids, self.cost)
    }
}

impl From<String> for Identifiers {
    /// One identifier, cost 1.
    fn from(id: String) -> Identifiers {
        Identifiers::new([id], 1)
    }
}

impl From<&str> for Identifiers {
    /// One identifier, cost 1.
    fn from(id: &str) -> Identifiers {
        Identifiers::from(id.to_string())
    }
}

impl From<Vec<String>> for Identifiers {
    /// Several identifiers, cost 1.
    fn from(ids: Vec<String>) -> Identifiers {
        Identifiers::new(ids, 1)
    }
}

impl From<(Vec<String>, u64)> for Identifiers {
    /// Several identifiers and the cost.
    fn from((ids, cost): (Vec<String>, u64)) -> Identifiers {
        Identifiers::new(ids, cost)
    }
}

/// What a [`KeyedRateLimitLayer`] asks before a call.
#[derive(Debug, Clone)]
pub(super) enum Gate {
    /// A limiter's check (waiting up to `max_wait` for it to admit).
    Check(Limiter),
    /// A scheduler's slot.
    Schedule(Scheduler),
}

/// Rate limiting for any `tower::Service`: identifiers from a closure, rejections as errors.
/// See the [`service`](super) module documentation.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{KeyedRateLimitLayer, Limiter, MemoryStore};
///
/// struct Charge { provider: &'static str, cents: u64 }
///
/// // The payment provider allows 100 calls per second (with a RedisStore, to the whole
/// // fleet); wait up to 2 s for a slot rather than fail.
/// let limiter = Limiter::new(MemoryStore::new(), "100/s log".parse().unwrap());
/// let layer = KeyedRateLimitLayer::new(limiter, |c: &Charge| format!("psp:{}", c.provider).into())
///     .wait_up_to(Duration::from_secs(2));
/// # let _ = layer;
/// ```
pub struct KeyedRateLimitLayer<F> {
    pub(super) gate: Gate,
    pub(super) identify: Arc<F>,
    pub(super) max_wait: Duration,
    pub(super) shadow: bool,
}

impl<F> Clone for KeyedRateLimitLayer<F> {
    fn clone(&self) -> Self {
        KeyedRateLimitLayer {
            gate: self.gate.clone(),
            identify: self.identify.clone(),
            max_wait: self.max_wait,
            shadow: self.shadow,
        }
    }
}

impl<F> fmt::Debug for KeyedRateLimitLayer<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedRateLimitLayer")
            .field("gate", &self.gate)
            .field("max_wait", &self.max_wait)
            .field("shadow", &self.shadow)
            .finish_non_exhaustive()
    }
}

impl<F> KeyedRateLimitLayer<F> {
    /// Checks each request against `limiter` for the [`Identifiers`] `identify` returns.
    pub fn new<Req>(limiter: Limiter, identify: F) -> Self
    where
        F: Fn(&Req) -> Identifiers,
    {
        KeyedRateLimitLayer {
            gate: Gate::Check(limiter),
            identify: Arc::new(identify),
            max_wait: Duration::ZERO,
            shadow: false,
        }
    }

    /// Paces each request through `scheduler` instead of checking it: the request waits for
    /// the next free slot of the one identifier `identify` returns (its cost in intervals),
    /// then goes to the inner service — calls to a third party spaced at its rate, in order,
    /// across the fleet. A request whose slot lies further ahead than
    /// [`wait_up_to`](Self::wait_up_to) (default: zero, no waiting) fails at once with
    /// [`RateLimited`](crate::RateLimited), taking no slot; a call dropped while it waits
    /// gives its slot back when no one was placed after it (see [`Scheduler`]).
    ///
    /// Requests with no identifier, or more than one, fail with
    /// [`Error::NoIdentifiers`](crate::Error::NoIdentifiers) or
    /// [`Error::NotOneIdentifier`](crate::Error::NotOneIdentifier): a queue is one
    /// identifier's.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{KeyedRateLimitLayer, MemoryStore, Scheduler};
    ///
    /// struct Charge { provider: &'static str }
    ///
    /// // 4 calls a second to each provider, evenly spaced; wait up to 2 s for a slot.
    /// let scheduler = Scheduler::new(MemoryStore::new(), "4/s".parse().unwrap());
    /// let layer = KeyedRateLimitLayer::scheduled(scheduler, |c: &Charge| {
    ///     format!("psp:{}", c.provider).into()
    /// })
    /// .wait_up_to(Duration::from_secs(2));
    /// # let _ = layer;
    /// ```
    pub fn scheduled<Req>(scheduler: Scheduler, identify: F) -> Self
    where
        F: Fn(&Req) -> Identifiers,
    {
        KeyedRateLimitLayer {
            gate: Gate::Schedule(scheduler),
            identify: Arc::new(identify),
            max_wait: Duration::ZERO,
            shadow: false,
        }
    }

    /// Instead of failing at once, wait for the limit to admit the request when that takes
    /// at most `max_wait` (throttling: outbound calls paced to a third party's limit). The
    /// request reserves its time in the same store call that checks it
    /// ([`Limiter::check_n_waiting`]): waiting calls go in the order they came, each at the
    /// earliest time the limits admit it, without checking again (a policy with a concurrency
    /// limit checks again while the wait lasts, as [`Limiter::check_n_waiting`] says). A
    /// request that would wait longer fails with [`RateLimited`](crate::RateLimited) at once.
    /// A call dropped while it waits (a timeout around this layer) keeps its charge. Calls
    /// are paced here: an inner service that then makes them wait again for its readiness
    /// (a full `Buffer`, a `ConcurrencyLimit`) may send them closer together than paced, so
    /// put this layer next to the transport. A waiting call gives the
    /// inner service's readiness back and gets ready again after the wait, so it does not
    /// hold a `Buffer` slot or a concurrency permit while it sleeps. With a
    /// [scheduler](Self::scheduled), the longest wait for a slot.
    pub fn wait_up_to(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }
}

impl<F> KeyedRateLimitLayer<F> {
    /// Shadow mode (default: off): every call goes through, and what the limiter or the
    /// [scheduler](Self::scheduled) decides is recorded, as with
    /// [`LimiterBuilder::shadow`](crate::LimiterBuilder::shadow) — to try a limit before
    /// enforcing it: would-be refusals count as `outcome="shadow_denied"` in
    /// `tollgate_decisions_total` and are logged at most once every 10 s. Calls are charged
    /// (or placed) as when enforcing; none waits, and none fails for a cost the limit never
    /// admits or a store that fails closed.
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }
}

impl<S, F> tower_layer::Layer<S> for KeyedRateLimitLayer<F> {
    type Service = KeyedRateLimit<S, F>;

    fn layer(&self, inner: S) -> Self::Service {
        KeyedRateLimit::new(inner, self.clone())
    }
}

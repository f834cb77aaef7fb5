//! What a limiter does with a check its store could not decide.

/// What a [`Limiter`](crate::Limiter) does with a check its store could not decide: Redis
/// down, too slow, misconfigured, or answering nonsense. Chosen per limiter with
/// [`LimiterBuilder::on_store_error`](crate::LimiterBuilder::on_store_error).
///
/// Whatever the choice, the failure is visible: with the `tracing` feature a warning when the
/// store's circuit breaker opens (three failures in a row) and when it closes again, each
/// failed call at `debug`; with the `metrics` feature every failed call
/// (`tollgate_store_errors_total`) and every answer of the policy
/// (`tollgate_failure_policy_total`) is counted — the README's failures table lists them.
/// While Redis is down the store's circuit breaker answers at once, so a request does not pay
/// the store's timeout for rate limiting.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub enum OnStoreError {
    /// Allow the request (fail open; the default, as Stripe and Envoy do: a rate limiter
    /// should not take a site down with it). The decision is
    /// [`Origin::FailOpen`](crate::Origin::FailOpen), carries no limit figures, and the
    /// HTTP layer sends no rate-limit headers.
    #[default]
    Open,
    /// Refuse the request: the check fails with [`Error::Store`](crate::Error::Store); the
    /// HTTP layer answers `503 Service Unavailable` (gRPC `UNAVAILABLE`), the generic layer
    /// fails the call.
    Closed,
    /// Decide with a limiter in this process, on the same policy scaled to this process's
    /// share of the fleet. Its counts are its own: what was counted in Redis is not known to
    /// it, and what it counts is not written back. They start empty with the limiter and
    /// live until they expire, as any count does (a second outage within an hour of the
    /// first finds the first's counts of an hourly limit). A cost the scaled policy cannot
    /// hold fails as when closed.
    Fallback(Fallback),
}

/// The share of the fleet's limits a process enforces on its own while the store is down:
/// every count and burst of the policy multiplied by it, rounded down, never below 1. A limit
/// held at 1 above its share (`5/min` at a tenth) lets the fleet admit more than the limit
/// while the store fails: a warning says so where the limiter is built (and when its policy
/// changes).
///
/// How to choose it: with `N` processes behind a balancer that spreads clients evenly,
/// `1/N` keeps the fleet within the policy; a little more (say `1.5/N`) tolerates an uneven
/// spread at the cost of admitting up to that much more in total. A limit keyed by something
/// that one process sees alone (a sticky session) can keep the whole policy
/// ([`Fallback::WHOLE`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fallback {
    share: f64,
}

impl Fallback {
    /// The whole policy, in every process.
    pub const WHOLE: Fallback = Fallback { share: 1.0 };

    /// `share` of every limit, for `0 < share <= 1`; `None` otherwise.
    pub fn share(share: f64) -> Option<Fallback> {
        (share > 0.0 && share <= 1.0).then_some(Fallback { share })
    }

    /// The share, in `(0, 1]`.
    pub fn share_of_fleet(&self) -> f64 {
        self.share
    }
}

impl OnStoreError {
    /// [`OnStoreError::Fallback`] with `share` of every limit (`0 < share <= 1`); `None`
    /// otherwise.
    pub fn fallback(share: f64) -> Option<OnStoreError> {
        Fallback::share(share).map(OnStoreError::Fallback)
    }
}

//! Stripe's fleet-usage load shedder: one concurrency budget for the whole fleet, of which a
//! share is kept for critical traffic.
//!
//! Non-critical requests take a slot in one global concurrency limit of
//! `capacity × (1 − reserved)` slots, shared by every process through the store; critical
//! requests never take one and are never shed by it. When non-critical requests in flight fill
//! their share, more are answered `503 Service Unavailable` (gRPC `UNAVAILABLE`), so that the
//! reserved part of the fleet stays free for critical work. It is a [`RateLimitLayer`] with a
//! concurrency policy, a global key, a bypass for critical traffic and a 503 status: the same
//! mechanism as every other limit, all-or-nothing in one script call.

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;

use super::priority::Classifier;
use super::Priority;
use crate::key::RequestView;
use crate::layer::RateLimitLayer;
use crate::limiter::{Limiter, OnStoreError};
use crate::observe::BoundedLog;
use crate::policy::{Limit, Policy, PolicyError, PolicyErrorKind, DEFAULT_LEASE};
use crate::store::{Namespace, Store};

/// The namespace of the fleet's budget on its store.
const NAMESPACE: &str = "shed";

/// How a fleet shedder's layer tells and records the requests it refuses: told that the
/// service is overloaded and nothing more (the denying limit, in the message a rate limit
/// writes, is the fleet's capacity, and would blame the client's own concurrency), and
/// counted and logged as sheds, by the priority the shedder classifies them as.
struct FleetRefusals {
    /// The shedder's name in logs and metrics, as its limiter's (`shed:NAME`).
    name: String,
    classify: Classifier,
    log: BoundedLog,
}

impl FleetRefusals {
    /// Counts and logs the refusal of `req`.
    fn record(&self, req: &RequestView<'_>) {
        let priority = (self.classify)(req);
        self.log.shed(&self.name, priority.label(), || None);
    }
}

/// Builds a fleet-usage load shedder (a [`RateLimitLayer`]). See the module documentation.
///
/// ```
/// use tollgate::shed::{FleetShedder, Priority};
/// use tollgate::MemoryStore;
///
/// // 500 requests in flight (with a RedisStore, across the fleet); 20% of that kept for
/// // critical traffic.
/// let layer = FleetShedder::new(MemoryStore::new(), 500)
///     .reserve_for_critical(0.2)
///     .classify(|req| {
///         if req.uri.path().starts_with("/charges") { Priority::Critical } else { Priority::Normal }
///     })
///     .build()
///     .unwrap();
/// # let _ = layer;
/// ```
#[derive(Clone)]
pub struct FleetShedder {
    store: Store,
    capacity: u64,
    reserved: f64,
    name: String,
    lease: Duration,
    classify: Classifier,
    on_error: OnStoreError,
}

impl std::fmt::Debug for FleetShedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetShedder")
            .field("capacity", &self.capacity)
            .field("reserved", &self.reserved)
            .field("name", &self.name)
            .field("on_store_error", &self.on_error)
            .finish_non_exhaustive()
    }
}

impl FleetShedder {
    /// A shedder for a fleet that can have `capacity` requests in flight, with the default
    /// 20% reserved for critical traffic and every request classified by
    /// [`Priority::by_method`].
    ///
    /// `by_method` calls nothing critical: until [`classify`](Self::classify) names the
    /// critical traffic, the reserved share is kept free for none, and the fleet sheds at
    /// 80% of its capacity (`reserve_for_critical(0.0)` sheds at 100%).
    pub fn new(store: impl Into<Store>, capacity: u64) -> FleetShedder {
        FleetShedder {
            store: store.into(),
            capacity,
            reserved: 0.2,
            name: "fleet".into(),
            lease: DEFAULT_LEASE,
            classify: Arc::new(Priority::by_method),
            on_error: OnStoreError::Open,
        }
    }

    /// The share of the capacity kept for critical traffic, from 0 up to (not including) 1
    /// (default 0.2, i.e. 20%); [`build`](Self::build) refuses any other value.
    pub fn reserve_for_critical(mut self, share: f64) -> Self {
        self.reserved = share;
        self
    }

    /// How requests are classified; only [`Priority::Critical`] is exempt.
    pub fn classify<F>(mut self, classify: F) -> Self
    where
        F: Fn(&RequestView<'_>) -> Priority + Send + Sync + 'static,
    {
        self.classify = Arc::new(classify);
        self
    }

    /// Names the budget (default `fleet`): shedders with different names share nothing.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// What the shedder does while its store cannot answer (default
    /// [`OnStoreError::Open`]: it sheds nothing, so that a Redis outage does not take the
    /// service down with it). With [`OnStoreError::fallback`]`(1.0 / processes)` each process
    /// sheds at its share of the budget on its own meanwhile, which keeps the protection
    /// through an outage; [`OnStoreError::Closed`] sheds every request that is not critical
    /// (answered and counted as any shed).
    /// Answers are counted as any limiter's (`tollgate_failure_policy_total`, under the
    /// shedder's name).
    pub fn on_store_error(mut self, on_error: OnStoreError) -> Self {
        self.on_error = on_error;
        self
    }

    /// How long a slot outlives a process that died holding it (default 15 s).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The number of slots non-critical traffic may hold: `capacity × (1 − reserved)`,
    /// rounded down, at least 1 (a reserved share out of range counts as 0 here, and
    /// [`build`](Self::build) refuses it).
    pub fn share(&self) -> u64 {
        let reserved = if (0.0..1.0).contains(&self.reserved) {
            self.reserved
        } else {
            0.0
        };
        let exact = self.capacity as f64 * (1.0 - reserved);
        // `1.0 - 0.8` is 0.19999999999999996, so 10 × (1 − 0.8) falls just short of 2: a
        // share that is whole on paper is rounded to it before the fraction is dropped (a
        // tolerance of a few units in the last place, far below one slot at any capacity).
        let share = (exact + exact * 8.0 * f64::EPSILON).floor();
        (share as u64).max(1)
    }

    /// The layer: a [`RateLimitLayer`] over one global `N concurrent` limit, bypassed by
    /// critical traffic, answering `503 Service Unavailable` when the share is full. Its
    /// responses carry no rate-limit fields, which would tell every client the fleet's
    /// capacity and load (`.headers(…)` on the layer turns them back on), and its refusals
    /// say that the service is overloaded, as a
    /// [`UtilizationShedLayer`](super::UtilizationShedLayer)'s do, rather than name the
    /// limit (an [`on_limited`](RateLimitLayer::on_limited) handler on the layer still gets
    /// the decision). They are counted in `tollgate_shed_total{shedder="shed:NAME",priority}`
    /// and logged at `info` at most every 10 s, besides the limiter's decisions.
    ///
    /// Every refusal of the layer is answered and counted as a shed, including those of a
    /// limiter added to it with [`route_adding`](RateLimitLayer::route_adding) or
    /// [`route_replacing`](RateLimitLayer::route_replacing): keep other limits in a
    /// [`RateLimitLayer`] of their own, which answers `429` with its fields, and use the
    /// shedder's rules for [`bypass`](RateLimitLayer::bypass) alone.
    ///
    /// # Errors
    ///
    /// [`PolicyErrorKind::ReservedShare`] when the reserved share is not from 0 up to (not
    /// including) 1 (NaN, negative, or a percentage given as 20 rather than 0.2), and
    /// otherwise the [`PolicyError`] the limit's text would give: when the capacity is 0, the
    /// share is above [`MAX_COUNT`](crate::policy::MAX_COUNT), or the lease is not a valid
    /// concurrency lease (shorter than [`MIN_LEASE`](crate::policy::MIN_LEASE), longer than
    /// [`MAX_WINDOW`](crate::policy::MAX_WINDOW), or not a whole number of milliseconds).
    pub fn build(self) -> Result<RateLimitLayer, PolicyError> {
        if !(0.0..1.0).contains(&self.reserved) {
            let part = format!("reserve_for_critical({})", self.reserved);
            return Err(PolicyError::new(PolicyErrorKind::ReservedShare, part));
        }
        if self.capacity == 0 {
            // Report it as the policy text would.
            Limit::new(0, self.lease, crate::Algorithm::Concurrency)?;
        }
        let limit = Limit::new(self.share(), self.lease, crate::Algorithm::Concurrency)?;
        let name = format!("shed:{}", self.name);
        // named as its budget, so that its decisions are counted under the shedder's name
        // rather than the policy's text (which two shedders of one capacity share)
        let mut limiter = Limiter::builder(self.store, Policy::new([limit])?)
            .name(name.clone())
            .on_store_error(self.on_error);
        // In a namespace of its own: the slots of any concurrency limit are shared by
        // identifier, and another limiter keyed on what clients send (a header) could be
        // sent `shed:fleet` and take the fleet's slots. (`shed` is a valid namespace: the
        // error arm is never taken, and `tests/shed.rs` holds it.)
        if let Ok(namespace) = Namespace::new(NAMESPACE) {
            limiter = limiter.namespace(namespace);
        }
        let limiter = limiter.build();
        let refusals = FleetRefusals {
            name: name.clone(),
            classify: self.classify.clone(),
            log: BoundedLog::default(),
        };
        let classify = self.classify;
        Ok(RateLimitLayer::new(limiter)
            .key(move |_: &RequestView<'_>| Some(name.clone()))
            .bypass(move |req| classify(req) == Priority::Critical)
            .limited_status(StatusCode::SERVICE_UNAVAILABLE)
            .headers(crate::layer::HeaderStyle::None)
            .shedding(move |req| refusals.record(req)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;

    fn fleet(capacity: u64, reserved: f64) -> FleetShedder {
        FleetShedder::new(MemoryStore::new(), capacity).reserve_for_critical(reserved)
    }

    /// A share meant as a percentage, negative or NaN is refused, naming the value, rather
    /// than read as "reserve everything" or "reserve nothing".
    #[test]
    fn a_reserved_share_out_of_range_is_refused() {
        for reserved in [20.0, 1.0, -0.1, f64::NAN, f64::INFINITY] {
            let Err(error) = fleet(500, reserved).build() else {
                panic!("{reserved} accepted");
            };
            assert_eq!(error.kind(), &PolicyErrorKind::ReservedShare, "{reserved}");
            assert!(error.part().contains(&reserved.to_string()), "{error}");
            assert!(
                error
                    .to_string()
                    .starts_with("invalid reserve_for_critical("),
                "{error}"
            );
        }
        for reserved in [0.0, 0.2, 0.999] {
            assert!(fleet(500, reserved).build().is_ok(), "{reserved}");
        }
    }

    /// The share is whole where it is on paper, though `1 − reserved` is not exact in binary:
    /// 10 × (1 − 0.8) is 2 slots, not 1.
    #[test]
    fn a_share_whole_on_paper_is_not_rounded_down() {
        assert_eq!(fleet(10, 0.8).share(), 2);
        assert_eq!(fleet(50, 0.8).share(), 10);
        assert_eq!(fleet(100, 0.55).share(), 45);
        for capacity in 1..=1000u64 {
            for percent in 0..100u64 {
                let expected = (capacity * (100 - percent) / 100).max(1);
                let share = fleet(capacity, percent as f64 / 100.0).share();
                assert_eq!(share, expected, "{capacity} at {percent}%");
            }
        }
        // a fraction of a slot is still dropped
        assert_eq!(fleet(10, 0.75).share(), 2);
        assert_eq!(fleet(3, 0.5).share(), 1);
    }
}

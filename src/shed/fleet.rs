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
use crate::limiter::Limiter;
use crate::policy::{Limit, Policy, PolicyError, DEFAULT_LEASE};
use crate::store::Store;

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
}

impl std::fmt::Debug for FleetShedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FleetShedder")
            .field("capacity", &self.capacity)
            .field("reserved", &self.reserved)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl FleetShedder {
    /// A shedder for a fleet that can have `capacity` requests in flight, with the default
    /// 20% reserved for critical traffic and every request classified by
    /// [`Priority::by_method`].
    pub fn new(store: impl Into<Store>, capacity: u64) -> FleetShedder {
        FleetShedder {
            store: store.into(),
            capacity,
            reserved: 0.2,
            name: "fleet".into(),
            lease: DEFAULT_LEASE,
            classify: Arc::new(Priority::by_method),
        }
    }

    /// The share of the capacity kept for critical traffic, between 0 and 1 (default 0.2).
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

    /// How long a slot outlives a process that died holding it (default 15 s).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The number of slots non-critical traffic may hold: `capacity × (1 − reserved)`,
    /// rounded down, at least 1.
    pub fn share(&self) -> u64 {
        let reserved = if self.reserved.is_finite() {
            self.reserved.clamp(0.0, 1.0)
        } else {
            0.0
        };
        ((self.capacity as f64 * (1.0 - reserved)).floor() as u64).max(1)
    }

    /// The layer: a [`RateLimitLayer`] over one global `N concurrent` limit, bypassed by
    /// critical traffic, answering `503 Service Unavailable` when the share is full. Its
    /// responses carry no rate-limit fields, which would tell every client the fleet's
    /// capacity and load (`.headers(…)` on the layer turns them back on).
    ///
    /// # Errors
    ///
    /// The [`PolicyError`] the limit's text would give: when the capacity is 0, the share is
    /// above [`MAX_COUNT`](crate::policy::MAX_COUNT), or the lease is not a valid
    /// concurrency lease (shorter than [`MIN_LEASE`](crate::policy::MIN_LEASE), longer than
    /// [`MAX_WINDOW`](crate::policy::MAX_WINDOW), or not a whole number of milliseconds).
    pub fn build(self) -> Result<RateLimitLayer, PolicyError> {
        if self.capacity == 0 {
            // Report it as the policy text would.
            Limit::new(0, self.lease, crate::Algorithm::Concurrency)?;
        }
        let limit = Limit::new(self.share(), self.lease, crate::Algorithm::Concurrency)?;
        let limiter = Limiter::new(self.store, Policy::new([limit])?);
        let classify = self.classify;
        let name = format!("shed:{}", self.name);
        Ok(RateLimitLayer::new(limiter)
            .key(move |_: &RequestView<'_>| Some(name.clone()))
            .bypass(move |req| classify(req) == Priority::Critical)
            .limited_status(StatusCode::SERVICE_UNAVAILABLE)
            .headers(crate::layer::HeaderStyle::None))
    }
}

//! The limiter: a store and a policy, usable without tower.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::decision::{Decision, LimitStatus, Origin};
use crate::guard::ConcurrencyGuard;
use crate::observe::{self, Action};
use crate::policy::{Limit, Policy};
use crate::store::keyspace;
use crate::store::lease::{lease_id, Lease};
use crate::store::{MemoryStore, Outcome, Plan, Store, StoreError};

mod deny_cache;
mod error;
mod failure;

use deny_cache::DenyCache;

pub use error::Error;
pub use failure::{Fallback, OnStoreError};

/// The most distinct identifiers one check may name.
pub const MAX_IDENTIFIERS: usize = 16;

/// Checks requests against a [`Policy`], with its state in a [`Store`].
///
/// A cheap handle: clones share the store and the policy.
///
/// ```
/// # async fn run() -> Result<(), tollgate::Error> {
/// use tollgate::{Limiter, MemoryStore};
///
/// let limiter = Limiter::new(MemoryStore::new(), "10/s, 120/min, 240/h".parse().unwrap());
/// // The client IP and the user together: allowed only if both are under every limit.
/// let decision = limiter.check(&["ip:203.0.113.9", "user:42"]).await?;
/// assert!(decision.is_allowed());
/// # Ok(()) }
/// # tokio::runtime::Runtime::new().unwrap().block_on(run()).unwrap();
/// ```
#[derive(Clone)]
pub struct Limiter {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    policy: Policy,
    on_error: OnStoreError,
    /// The limiter answering while the store fails, under [`OnStoreError::Fallback`].
    fallback: Option<Limiter>,
    /// The limiter's name in logs and metrics.
    name: Arc<str>,
    /// Identifiers the store denied a moment ago (remote stores on the real clock only).
    deny_cache: Option<DenyCache>,
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("name", &self.inner.name)
            .field("store", &self.inner.store)
            .field("policy", &self.inner.policy.to_string())
            .field("on_store_error", &self.inner.on_error)
            .finish()
    }
}

/// Configures a [`Limiter`]: [`Limiter::builder`].
#[derive(Debug, Clone)]
pub struct LimiterBuilder {
    store: Store,
    policy: Policy,
    on_error: OnStoreError,
    name: Option<String>,
    deny_cache: usize,
}

impl LimiterBuilder {
    /// How many identifiers the deny cache holds at most (default 10,000; 0 turns it off).
    ///
    /// With a Redis store, when Redis denies an identifier by a rate limit until some time,
    /// the limiter answers that identifier's requests (of at least the same cost) in process
    /// until then, without a round trip: a client flooding the fleet is answered without
    /// touching Redis. It never denies a request Redis would allow (others' requests only
    /// use quota; concurrency limits are never cached); what it gives up is that resetting
    /// the identifier in Redis is seen here only when the entry expires. The memory store and
    /// a manual clock never use it.
    pub fn deny_cache(mut self, max_identifiers: usize) -> Self {
        self.deny_cache = max_identifiers;
        self
    }

    /// What to do with a check the store could not decide (default: [`OnStoreError::Open`]).
    pub fn on_store_error(mut self, on_error: OnStoreError) -> Self {
        self.on_error = on_error;
        self
    }

    /// The limiter's name in logs and metric labels (default: the policy's text). Keep the
    /// set of names small: it is a label value.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Builds the limiter.
    pub fn build(self) -> Limiter {
        let fallback = match self.on_error {
            OnStoreError::Fallback(f) => Some(Limiter::new(
                MemoryStore::new(),
                self.policy.scaled(f.share_of_fleet()),
            )),
            _ => None,
        };
        let name = self.name.unwrap_or_else(|| self.policy.to_string());
        let deny_cache = (self.deny_cache > 0 && self.store.is_remote_on_real_clock())
            .then(|| DenyCache::new(self.deny_cache));
        Limiter {
            inner: Arc::new(Inner {
                store: self.store,
                policy: self.policy,
                on_error: self.on_error,
                fallback,
                name: name.into(),
                deny_cache,
            }),
        }
    }
}

impl Limiter {
    /// A limiter applying `policy`, keeping its state in `store`, failing open when the store
    /// fails ([`OnStoreError::Open`]). [`Limiter::builder`] configures the rest.
    pub fn new(store: impl Into<Store>, policy: Policy) -> Limiter {
        Limiter::builder(store, policy).build()
    }

    /// Configures a limiter applying `policy`, keeping its state in `store`.
    pub fn builder(store: impl Into<Store>, policy: Policy) -> LimiterBuilder {
        LimiterBuilder {
            store: store.into(),
            policy,
            on_error: OnStoreError::default(),
            name: None,
            deny_cache: deny_cache::DEFAULT_CAPACITY,
        }
    }

    /// What the limiter does with a check the store could not decide.
    pub fn on_store_error(&self) -> OnStoreError {
        self.inner.on_error
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.inner.policy
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// Checks one request of cost 1 for the given identifiers. See [`Limiter::check_n`].
    ///
    /// # Errors
    ///
    /// As [`Limiter::check_n`].
    pub async fn check<I: AsRef<str>>(&self, identifiers: &[I]) -> Result<Decision, Error> {
        self.check_n(identifiers, 1).await
    }

    /// Checks one request of cost `cost` (its weight) for the given identifiers: allowed
    /// only if every limit admits it for every identifier, and then charged everywhere; when
    /// denied, charged nowhere. On Redis this is one script call.
    ///
    /// Identifiers are free text (`"ip:203.0.113.9"`, `"user:42"`); any bytes are safe, long
    /// ones are hashed. Giving the same identifier twice counts it once.
    ///
    /// When the store cannot decide (Redis down, slow, misconfigured), the limiter's
    /// [`OnStoreError`] answers: an allowed decision ([`Origin::FailOpen`]), the error, or the
    /// fallback limiter's decision ([`Origin::Fallback`]). A check whose answer was lost (a
    /// timeout) is never retried: it may have been charged already.
    ///
    /// # Errors
    ///
    /// [`Error::Cost`] when `cost` is 0 or more than some limit could ever admit
    /// (a request that can never fit is an error, not an eternal denial),
    /// [`Error::NoIdentifiers`] / [`Error::TooManyIdentifiers`], and [`Error::Store`] when
    /// the store could not decide and the limiter fails closed ([`OnStoreError::Closed`]).
    pub async fn check_n<I: AsRef<str>>(
        &self,
        identifiers: &[I],
        cost: u64,
    ) -> Result<Decision, Error> {
        let name = &*self.inner.name;
        let error = match self.decide(identifiers, cost).await {
            Err(Error::Store(e)) => e,
            Ok(decision) => {
                observe::decision(name, &decision);
                return Ok(decision);
            }
            Err(e) => return Err(e),
        };
        match (self.inner.on_error, &self.inner.fallback) {
            (OnStoreError::Fallback(_), Some(fallback)) => {
                observe::failure_answered(name, Action::Fallback, &error);
                match fallback.decide(identifiers, cost).await {
                    Ok(mut decision) => {
                        decision.origin = Origin::Fallback;
                        observe::decision(name, &decision);
                        Ok(decision)
                    }
                    // The scaled policy cannot hold this cost: the store's failure stands.
                    Err(_) => Err(Error::Store(error)),
                }
            }
            (OnStoreError::Closed, _) => {
                observe::failure_answered(name, Action::Closed, &error);
                Err(Error::Store(error))
            }
            _ => {
                observe::failure_answered(name, Action::Open, &error);
                Ok(Decision::unchecked(cost))
            }
        }
    }

    /// The check itself, without the failure policy.
    async fn decide<I: AsRef<str>>(&self, identifiers: &[I], cost: u64) -> Result<Decision, Error> {
        let policy = &self.inner.policy;
        let max = policy.max_cost();
        if cost == 0 || cost > max {
            return Err(Error::Cost { cost, max });
        }
        // Distinct identifiers, each with the index of its first occurrence.
        let mut firsts: Vec<usize> = Vec::with_capacity(identifiers.len());
        for (i, id) in identifiers.iter().enumerate() {
            if !firsts
                .iter()
                .any(|&f| identifiers[f].as_ref() == id.as_ref())
            {
                firsts.push(i);
            }
        }
        if firsts.is_empty() {
            return Err(Error::NoIdentifiers);
        }
        if firsts.len() > MAX_IDENTIFIERS {
            return Err(Error::TooManyIdentifiers(firsts.len()));
        }
        let ids: Vec<String> = firsts
            .iter()
            .map(|&i| keyspace::escape_identifier(identifiers[i].as_ref()))
            .collect();
        let limits = policy.limits();
        if let Some(cache) = &self.inner.deny_cache {
            if let Some(decision) = cache.lookup(&ids, &firsts, cost) {
                observe::deny_cache_hit(&self.inner.name);
                return Ok(decision);
            }
        }
        let sent = std::time::Instant::now();
        let store = self.inner.store.clone();
        let (outcome, guard) = match policy.concurrency() {
            None => {
                let plan = Plan {
                    ids: &ids,
                    limits,
                    cost,
                    lease: "",
                };
                (store.check(&plan).await.map_err(Error::Store)?, None)
            }
            Some(&slot) => {
                // Taking a slot must not be cut short: a caller that gives up (a client
                // that disconnects) while the script runs would leave a slot taken with no
                // guard to give it back. The check therefore runs in a task of its own, which
                // finishes and drops its guard whatever becomes of the caller.
                let task = take_slot(store, ids.clone(), limits.to_vec(), slot, cost);
                match tokio::runtime::Handle::try_current() {
                    Ok(runtime) => match runtime.spawn(task).await {
                        Ok(result) => result?,
                        // A panic in the check is a bug, not a store failure for the failure
                        // policy to paper over: it goes on in the caller.
                        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                        // Cancelled: the runtime is shutting down under the check.
                        Err(e) => return Err(Error::Store(StoreError::Backend(Box::new(e)))),
                    },
                    Err(_) => task.await?,
                }
            }
        };
        if let (Some(cache), false) = (&self.inner.deny_cache, outcome.allowed) {
            cache.record(&ids, limits, &outcome, cost, sent);
        }
        let statuses = outcome
            .entries
            .iter()
            .enumerate()
            .map(|(k, e)| LimitStatus {
                identifier: firsts[k / limits.len()],
                limit_index: k % limits.len(),
                limit: limits[k % limits.len()],
                allowed: e.allowed,
                remaining: e.remaining,
                reset_after: Duration::from_micros(e.reset_after_us),
                retry_after: (!e.allowed).then(|| Duration::from_micros(e.retry_after_us)),
            })
            .collect();
        Ok(Decision {
            allowed: outcome.allowed,
            cost,
            statuses,
            guard,
            origin: Origin::Store,
        })
    }
}

/// Checks a policy with a concurrency limit; when allowed, holds the slot in a guard.
async fn take_slot(
    store: Store,
    ids: Vec<String>,
    limits: Vec<Limit>,
    slot: Limit,
    cost: u64,
) -> Result<(Outcome, Option<ConcurrencyGuard>), Error> {
    let id = lease_id();
    let plan = Plan {
        ids: &ids,
        limits: &limits,
        cost,
        lease: &id,
    };
    let result = store.check(&plan).await;
    let lease = Lease {
        keys: ids.iter().map(|i| store.key(i, &slot)).collect(),
        id,
        lease_us: slot.window_us(),
    };
    match result {
        Ok(outcome) if outcome.allowed => Ok((outcome, Some(ConcurrencyGuard::new(lease, store)))),
        Ok(outcome) => Ok((outcome, None)),
        Err(e) => {
            // The script may have run and taken the slot before the answer was lost (a
            // timeout, a dropped connection): give it back, as a guard dropped at once would.
            drop(ConcurrencyGuard::new(lease, store));
            Err(Error::Store(e))
        }
    }
}

/// A limiter's check of one request. It owns the request while it runs and hands it back
/// with the outcome, so that the request can then be passed on (or answered).
pub(crate) type CheckFuture<R> = Pin<Box<dyn Future<Output = (Result<Decision, Error>, R)> + Send>>;

//! The limiter: a store and a policy, usable without tower.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::decision::{Decision, LimitStatus};
use crate::guard::ConcurrencyGuard;
use crate::policy::{Limit, Policy};
use crate::store::keyspace;
use crate::store::lease::{lease_id, Lease};
use crate::store::{Outcome, Plan, Store, StoreError};

/// What to do when the store fails (Redis down, slow, or answering nonsense). Both
/// [`RateLimitLayer`](crate::RateLimitLayer) and
/// [`KeyedRateLimitLayer`](crate::KeyedRateLimitLayer) take one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnStoreError {
    /// Let the request through, without rate-limit headers (fail open; the default, as a
    /// rate limiter should not take a site down with it).
    Allow,
    /// Refuse the request: the HTTP layer answers `503 Service Unavailable` (gRPC
    /// `UNAVAILABLE`) with `Retry-After: 1`; the generic layer fails the call with the
    /// store's error.
    Deny,
}

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
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("store", &self.inner.store)
            .field("policy", &self.inner.policy.to_string())
            .finish()
    }
}

impl Limiter {
    /// A limiter applying `policy`, keeping its state in `store`.
    pub fn new(store: impl Into<Store>, policy: Policy) -> Limiter {
        Limiter {
            inner: Arc::new(Inner {
                store: store.into(),
                policy,
            }),
        }
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
    /// # Errors
    ///
    /// [`Error::Cost`] when `cost` is 0 or more than some limit could ever admit
    /// (a request that can never fit is an error, not an eternal denial),
    /// [`Error::NoIdentifiers`] / [`Error::TooManyIdentifiers`], and [`Error::Store`] when
    /// the store could not decide.
    pub async fn check_n<I: AsRef<str>>(
        &self,
        identifiers: &[I],
        cost: u64,
    ) -> Result<Decision, Error> {
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

/// A check that could not be decided.
///
/// Being limited is not an error: that is a [`Decision`] that is not allowed. These are the
/// two other outcomes — a request that is impossible as asked, and a store that failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The cost is 0, or more than the policy could ever admit at once.
    Cost {
        /// The cost asked for.
        cost: u64,
        /// The largest cost the policy admits ([`Policy::max_cost`]).
        max: u64,
    },
    /// No identifier was given.
    NoIdentifiers,
    /// More than [`MAX_IDENTIFIERS`] distinct identifiers were given.
    TooManyIdentifiers(usize),
    /// The store could not decide.
    Store(StoreError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Cost { cost, max } => write!(
                f,
                "a request of cost {cost} can never be admitted (costs must be between 1 and {max})"
            ),
            Error::NoIdentifiers => f.write_str("no identifier to rate-limit"),
            Error::TooManyIdentifiers(n) => write!(
                f,
                "{n} identifiers in one check (at most {MAX_IDENTIFIERS})"
            ),
            Error::Store(e) => fmt::Display::fmt(e, f),
        }
    }
}

/// A store failure is shown as itself: its message here, its cause as the source.
impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Store(e) => e.source(),
            _ => None,
        }
    }
}

//! What operators ask of a limiter about one client: its usage per limit, read without
//! charging, and a reset that gives it its whole quota back.

use std::time::Duration;

use super::check::distinct;
use super::{Error, Limiter};
use crate::decision::Usage;
use crate::store::{Namespace, Plan, Store};

impl Limiter {
    /// How much of each limit the given identifiers use now, read without charging
    /// anything: per (identifier, limit) pair, identifier-major and in policy order, what is
    /// used, what remains and when the whole quota is back. A concurrency limit reports the
    /// slots held. Nothing is written (on Redis, the read-only script of
    /// [`peek`](Limiter::peek_n) runs), nothing is counted in the metrics, and no slot is
    /// taken.
    ///
    /// It asks the store itself, whatever the limiter's failure policy, deny cache or shadow
    /// mode: a store that cannot answer is an error, not a guess.
    ///
    /// ```
    /// # async fn run() -> Result<(), tollgate::Error> {
    /// use tollgate::{Limiter, MemoryStore};
    ///
    /// let limiter = Limiter::new(MemoryStore::new(), "10/min, 100/h".parse().unwrap());
    /// for _ in 0..3 {
    ///     let _ = limiter.check(&["user:42"]).await?;
    /// }
    /// let usage = limiter.usage(&["user:42"]).await?;
    /// assert_eq!((usage[0].used, usage[0].remaining), (3, 7)); // 10/min
    /// assert_eq!((usage[1].used, usage[1].remaining), (3, 97)); // 100/h
    /// # Ok(()) }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(run()).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NoIdentifiers`] / [`Error::TooManyIdentifiers`], and [`Error::Store`] when the
    /// store could not answer.
    pub async fn usage<I: AsRef<str>>(&self, identifiers: &[I]) -> Result<Vec<Usage>, Error> {
        let (firsts, ids) = distinct(identifiers)?;
        let version = self.inner.version.load_full();
        let limits = version.policy.limits();
        let plan = Plan {
            ids: &ids,
            namespace: self.namespace().map(Namespace::as_str),
            limits,
            // the figures a peek reports do not depend on its cost, and every policy admits 1
            cost: 1,
            lease: "",
        };
        let outcome = self.inner.store.peek(&plan).await.map_err(Error::Store)?;
        Ok(outcome
            .entries
            .iter()
            .enumerate()
            .map(|(k, e)| {
                let limit = limits[k % limits.len()];
                let quota = if limit.is_concurrency() {
                    limit.count()
                } else {
                    limit.max_cost()
                };
                Usage {
                    identifier: firsts[k / limits.len()],
                    limit_index: k % limits.len(),
                    limit,
                    used: quota.saturating_sub(e.remaining),
                    remaining: e.remaining,
                    reset_after: Duration::from_micros(e.reset_after_us),
                }
            })
            .collect())
    }

    /// Gives the identifiers their whole quota back, for every limit of the policy in force:
    /// what was counted for them is forgotten, and their next request starts afresh. Slots
    /// they hold are freed too (the requests holding them run on, no longer counted; their
    /// next renewal finds the slots gone, and is reported as lost leases, with
    /// `tollgate_leases_lost_total` and a warning, as a slot lost otherwise would be).
    ///
    /// Exactly the state of these identifiers under this policy goes, and nothing else: on
    /// Redis one `DEL` of their keys (the ACL user needs `+del`), in the memory store their
    /// entries. The limiter's fallback store forgets them too, and so does its deny cache
    /// (shared by its clones); any other deny cache (another process's, or another `Limiter`
    /// built on the same store in this one) sees the reset within a second (its entries answer
    /// for a second at most).
    ///
    /// ```
    /// # async fn run() -> Result<(), tollgate::Error> {
    /// use tollgate::{Limiter, MemoryStore};
    ///
    /// let limiter = Limiter::new(MemoryStore::new(), "1/h".parse().unwrap());
    /// assert!(limiter.check(&["user:42"]).await?.is_allowed());
    /// assert!(!limiter.check(&["user:42"]).await?.is_allowed());
    /// limiter.reset(&["user:42"]).await?;
    /// assert!(limiter.check(&["user:42"]).await?.is_allowed());
    /// # Ok(()) }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(run()).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NoIdentifiers`] / [`Error::TooManyIdentifiers`], and [`Error::Store`] when the
    /// store could not delete the state (on Redis, the `DEL` may have run anyway).
    pub async fn reset<I: AsRef<str>>(&self, identifiers: &[I]) -> Result<(), Error> {
        let (_, ids) = distinct(identifiers)?;
        let version = self.inner.version.load_full();
        let plan = |limits| Plan {
            ids: &ids,
            namespace: self.namespace().map(Namespace::as_str),
            limits,
            cost: 1,
            lease: "",
        };
        if let (Some(store), Some((policy, _))) = (&self.inner.fallback_store, &version.fallback) {
            forget(store, &plan(policy.limits())).await?;
        }
        let result = forget(&self.inner.store, &plan(version.policy.limits())).await;
        if let Some(cache) = &self.inner.deny_cache {
            cache.forget(&ids);
        }
        result
    }
}

async fn forget(store: &Store, plan: &Plan<'_>) -> Result<(), Error> {
    store.reset(plan).await.map_err(Error::Store)
}

//! Where the limiters' state lives: in this process ([`MemoryStore`]) or in Redis
//! ([`RedisStore`]). Both run the same algorithms and reach the same decisions.
//!
//! Inside: `keyspace` names the keys, `lease` holds concurrency slots (the keeper task),
//! `memory` and `redis` are the two backends, `script` is the wire protocol of the Lua check
//! script, `error` what a store reports.

use crate::policy::Limit;

#[cfg(feature = "redis")]
mod breaker;
mod error;
pub(crate) mod keyspace;
pub(crate) mod lease;
pub(crate) mod memory;
#[cfg(feature = "redis")]
pub(crate) mod redis;
#[cfg(feature = "redis")]
mod script;

use crate::algorithm::schedule::{Placement, Rate};
pub(crate) use crate::algorithm::Outcome;
#[cfg(feature = "metrics")]
pub(crate) use error::KIND_LABELS;
pub use error::{ConfigError, ConfigErrorKind, Misconfiguration, MisconfigurationKind, StoreError};
pub use keyspace::Namespace;
use lease::{Backend, KeeperSlot, Lease, Renewal};
pub(crate) use memory::OneKey;
pub use memory::{MemoryStore, MemoryStoreBuilder};
#[cfg(feature = "redis")]
pub use redis::{RedisStore, RedisStoreBuilder, StoreHealth};

/// A store for [`Limiter`](crate::Limiter)s: a cheap handle, cloned freely. Several limiters
/// (different policies, different routes) may share one store.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Store {
    /// State in this process.
    Memory(MemoryStore),
    /// State in Redis, shared by every process using the same server and prefix.
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    Redis(RedisStore),
}

impl From<MemoryStore> for Store {
    fn from(store: MemoryStore) -> Store {
        Store::Memory(store)
    }
}

#[cfg(feature = "redis")]
impl From<RedisStore> for Store {
    fn from(store: RedisStore) -> Store {
        Store::Redis(store)
    }
}

/// One check as the stores see it: escaped identifiers, limits, cost.
#[derive(Debug)]
pub(crate) struct Plan<'a> {
    pub(crate) ids: &'a [String],
    /// The limiter's namespace: its keys live there (none: the store's shared space).
    pub(crate) namespace: Option<&'a str>,
    pub(crate) limits: &'a [Limit],
    pub(crate) cost: u64,
    /// The id of the slot a concurrency limit takes (empty when the policy has none).
    pub(crate) lease: &'a str,
}

/// How a held slot ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LetGo {
    /// Give it back now.
    Release,
    /// The slot of a check that failed and may have taken it (a timeout): give it back now,
    /// and again until its lease would have expired, as the check's script may still be on
    /// its way (Redis; in process, the same as `Release`).
    Unsure,
    /// Stop renewing it: it expires after its lease time.
    Expire,
}

impl Store {
    pub(crate) async fn check(&self, plan: &Plan<'_>) -> Result<Outcome, StoreError> {
        self.check_within(plan, 0).await
    }

    /// A check that, when denied now, is admitted as of the earliest time every limit admits
    /// it, if that lies at most `max_wait_us` ahead (`algorithm::reserve`): the outcome's
    /// `wait_us` says how long the caller waits for it. Not for policies with a concurrency
    /// limit.
    pub(crate) async fn check_within(
        &self,
        plan: &Plan<'_>,
        max_wait_us: u64,
    ) -> Result<Outcome, StoreError> {
        match self {
            Store::Memory(m) => Ok(m.check_within(plan, max_wait_us)),
            #[cfg(feature = "redis")]
            Store::Redis(r) => r.check_within(plan, max_wait_us).await,
        }
    }

    /// Places an event of `cost` in the scheduler's queue of `escaped_id` at `rate` in
    /// `namespace`, when its wait is at most `longest_us`; the placement and the queue's key.
    pub(crate) async fn schedule(
        &self,
        escaped_id: &str,
        namespace: Option<&Namespace>,
        rate: &Rate,
        cost: u64,
        longest_us: u64,
    ) -> Result<(Placement, String), StoreError> {
        let namespace = namespace.map(Namespace::as_str);
        match self {
            Store::Memory(m) => {
                let key = keyspace::schedule_key(memory::PREFIX, escaped_id, namespace, rate);
                Ok((m.schedule(&key, rate, cost, longest_us), key))
            }
            #[cfg(feature = "redis")]
            Store::Redis(r) => {
                let key = keyspace::schedule_key(r.prefix(), escaped_id, namespace, rate);
                Ok((r.schedule(&key, rate, cost, longest_us).await?, key))
            }
        }
    }

    /// Gives a slot back without waiting (from `Drop`): in process at once; for Redis in a
    /// task of its own, once, on the current Tokio runtime (without one, the slot stays
    /// used, counted and logged as a give-back that failed). Best effort: a give-back that
    /// fails leaves the slot used, as one that comes after a later placement does; it is
    /// logged and counted.
    pub(crate) fn give_back_soon(&self, key: String, placement: Placement) {
        match self {
            Store::Memory(m) => {
                m.give_back(&key, &placement);
            }
            #[cfg(feature = "redis")]
            Store::Redis(r) => {
                let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                    // (no runtime to send it from: dropped on a thread of its own)
                    r.give_back_failed(&StoreError::Unavailable);
                    return;
                };
                // A task dropped before it is done (its runtime shutting down) sent nothing, or
                // nothing it heard back from: counted and logged as a give-back that failed.
                let mut unsent = Unsent(Some(r.clone()));
                let r = r.clone();
                runtime.spawn(async move {
                    let result = r.give_back(&key, &placement).await;
                    unsent.done();
                    if let Err(e) = result {
                        r.give_back_failed(&e);
                    }
                });
            }
        }
    }

    /// What a check of `plan` would decide now, charging nothing: the check's evaluation
    /// alone (phase 1), with no state written — on Redis no key, value or TTL changes. The
    /// plan's lease is empty: a peek takes no slot.
    pub(crate) async fn peek(&self, plan: &Plan<'_>) -> Result<Outcome, StoreError> {
        match self {
            Store::Memory(m) => Ok(m.peek(plan)),
            #[cfg(feature = "redis")]
            Store::Redis(r) => r.peek(plan).await,
        }
    }

    /// Forgets the state of `plan`'s identifiers for its limits (every key a check of the
    /// plan reads): they start afresh, held concurrency slots included.
    pub(crate) async fn reset(&self, plan: &Plan<'_>) -> Result<(), StoreError> {
        match self {
            Store::Memory(m) => {
                m.reset(plan);
                Ok(())
            }
            #[cfg(feature = "redis")]
            Store::Redis(r) => r.reset(plan).await,
        }
    }

    /// Gives back what an admitted check of `plan` charged; `at_us` is the check's time
    /// ([`Outcome::at_us`]). Each limit gives back at most what the charge still holds in its
    /// state, nothing once its state has moved past it, and a concurrency limit's slot
    /// (`plan.lease`) is released. A missing key is not created.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) async fn refund(&self, plan: &Plan<'_>, at_us: u64) -> Result<(), StoreError> {
        match self {
            Store::Memory(m) => {
                m.refund(plan, at_us);
                Ok(())
            }
            #[cfg(feature = "redis")]
            Store::Redis(r) => r.refund(plan, at_us).await,
        }
    }

    /// The memory store, when this is one.
    pub(crate) fn as_memory(&self) -> Option<&MemoryStore> {
        match self {
            Store::Memory(m) => Some(m),
            #[cfg(feature = "redis")]
            Store::Redis(_) => None,
        }
    }

    /// Whether the store is shared by other processes and reads the real clock: the case
    /// where caching its denials saves round trips and is exact.
    pub(crate) fn is_remote_on_real_clock(&self) -> bool {
        match self {
            Store::Memory(_) => false,
            #[cfg(feature = "redis")]
            Store::Redis(r) => r.clock().manual_now().is_none(),
        }
    }

    /// The store's key for an (escaped identifier, limit) pair in `namespace`.
    pub(crate) fn key(&self, escaped_id: &str, namespace: Option<&str>, limit: &Limit) -> String {
        let prefix = match self {
            Store::Memory(_) => memory::PREFIX,
            #[cfg(feature = "redis")]
            Store::Redis(r) => r.prefix(),
        };
        keyspace::key(prefix, escaped_id, namespace, limit)
    }

    /// Holds a slot the check took: renews its lease until it is let go.
    pub(crate) fn hold(&self, lease: &Lease) {
        self.keeper_slot().hold(|| self.detached(), lease.clone());
    }

    /// Ends a held slot. In process a release happens at once; Redis releases are batched
    /// by the keeper (and retried while they fail), so this never waits on the network.
    /// Without a keeper (no runtime) a Redis release is left to the next keeper started,
    /// and the lease expires by itself if none is.
    pub(crate) fn let_go(&self, lease: Lease, how: LetGo) {
        let slot = self.keeper_slot();
        match (how, self) {
            (LetGo::Release | LetGo::Unsure, Store::Memory(m)) => {
                // The keeper is told first: a renewal that finds the slot released after
                // this then finds the message too, and does not take the slot for lost.
                slot.forget(|| self.detached(), lease.id.clone());
                m.release(std::slice::from_ref(&lease));
            }
            #[cfg(feature = "redis")]
            (LetGo::Release, Store::Redis(_)) => slot.release(|| self.detached(), lease),
            #[cfg(feature = "redis")]
            (LetGo::Unsure, Store::Redis(_)) => {
                slot.release_until_expired(|| self.detached(), lease);
            }
            (LetGo::Expire, _) => slot.forget(|| self.detached(), lease.id),
        }
    }

    /// Where the store keeps its keeper task (one per store and its clones).
    fn keeper_slot(&self) -> &KeeperSlot {
        match self {
            Store::Memory(m) => m.keeper_slot(),
            #[cfg(feature = "redis")]
            Store::Redis(r) => r.keeper_slot(),
        }
    }

    /// The same store without the keeper handle, for the keeper task itself: holding its
    /// own sender would keep it (and the store) alive forever. The task ends once every
    /// handle of the store and every guard is gone, its channel closed.
    fn detached(&self) -> Store {
        match self {
            Store::Memory(m) => Store::Memory(m.detached()),
            #[cfg(feature = "redis")]
            Store::Redis(r) => Store::Redis(r.detached()),
        }
    }
}

impl Backend for Store {
    fn label(&self) -> &str {
        match self {
            Store::Memory(_) => "memory",
            // the name its other logs and metrics give it
            #[cfg(feature = "redis")]
            Store::Redis(r) => r.prefix(),
        }
    }

    async fn renew(&self, leases: &[&Lease]) -> Vec<Renewal> {
        match self {
            Store::Memory(m) => m.renew(leases).into_iter().map(Renewal::of_lost).collect(),
            #[cfg(feature = "redis")]
            Store::Redis(r) => {
                let reached = r.renew(leases).await;
                let renewals = reached.renewals();
                r.reached("renew", reached);
                renewals
            }
        }
    }

    async fn release(&self, leases: &[Lease]) -> Vec<bool> {
        match self {
            Store::Memory(m) => {
                m.release(leases);
                vec![true; leases.len()]
            }
            #[cfg(feature = "redis")]
            Store::Redis(r) => r.reached("release", r.release(leases).await),
        }
    }
}

/// A scheduler's give-back on its way in a task of its own: the store, until it is done. The
/// task dropped before (its runtime shutting down) counts it as failed.
#[cfg(feature = "redis")]
struct Unsent(Option<RedisStore>);

#[cfg(feature = "redis")]
impl Unsent {
    /// The give-back is done (whatever came of it).
    fn done(&mut self) {
        self.0 = None;
    }
}

#[cfg(feature = "redis")]
impl Drop for Unsent {
    fn drop(&mut self) {
        if let Some(r) = self.0.take() {
            r.give_back_failed(&StoreError::Unavailable);
        }
    }
}

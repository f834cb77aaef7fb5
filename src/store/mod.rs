//! Where the limiters' state lives: in this process ([`MemoryStore`]) or in Redis
//! ([`RedisStore`]). Both run the same algorithms and reach the same decisions.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::policy::Limit;

pub(crate) mod memory;
#[cfg(feature = "redis")]
pub(crate) mod redis;

pub use memory::{MemoryStore, MemoryStoreBuilder};
#[cfg(feature = "redis")]
pub use redis::{RedisStore, RedisStoreBuilder};

/// A store for [`Limiter`](crate::Limiter)s: a cheap handle, cloned freely. Several limiters
/// (different policies, different routes) may share one store.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Store {
    /// State in this process.
    Memory(MemoryStore),
    /// State in Redis, shared by every process using the same server and prefix.
    #[cfg(feature = "redis")]
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

/// Where a store (or a [load shedder](crate::shed::UtilizationShedder)) reads the time.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub enum Clock {
    /// The real clock: Redis `TIME` for the Redis store (one clock for the whole fleet), the
    /// system clock for the memory store, a monotonic clock for a load shedder.
    #[default]
    Real,
    /// A clock the caller sets: for tests and replays only.
    Manual(ManualClock),
}

impl Clock {
    /// Microseconds since the Unix epoch, or `None` when the store should read its own.
    pub(crate) fn manual_now(&self) -> Option<u64> {
        match self {
            Clock::Real => None,
            Clock::Manual(m) => Some(m.now_micros()),
        }
    }
}

/// A clock that moves only when told to, shared by its clones.
#[derive(Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock reading `micros` microseconds since the Unix epoch.
    pub fn new(micros: u64) -> ManualClock {
        ManualClock(Arc::new(AtomicU64::new(micros)))
    }

    /// A clock reading the current system time.
    pub fn starting_now() -> ManualClock {
        ManualClock::new(system_micros())
    }

    /// The time, in microseconds since the Unix epoch.
    pub fn now_micros(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    /// Sets the time, in microseconds since the Unix epoch.
    pub fn set_micros(&self, micros: u64) {
        self.0.store(micros, Ordering::SeqCst);
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_micros() as u64, Ordering::SeqCst);
    }
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ManualClock")
            .field(&self.now_micros())
            .finish()
    }
}

pub(crate) fn system_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// A store could not decide: it is unreachable, too slow, or answered nonsense.
///
/// The limiter returns it as is; what to do then (admit, deny, fall back) is the caller's
/// choice.
#[derive(Debug)]
#[non_exhaustive]
pub enum StoreError {
    /// No answer within the store's timeout. The script may still have run: it is never
    /// retried, so a request is charged at most once.
    Timeout(Duration),
    /// The backend failed: connection refused or lost, a server error.
    Backend(Box<dyn std::error::Error + Send + Sync>),
    /// The backend answered something the script never returns.
    UnexpectedReply(String),
    /// The store's configuration is unusable.
    Config(String),
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Timeout(d) => write!(f, "rate-limit store did not answer within {d:?}"),
            StoreError::Backend(e) => write!(f, "rate-limit store failed: {e}"),
            StoreError::UnexpectedReply(what) => {
                write!(f, "rate-limit store answered unexpectedly: {what}")
            }
            StoreError::Config(what) => write!(f, "rate-limit store misconfigured: {what}"),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StoreError::Backend(e) => Some(&**e),
            _ => None,
        }
    }
}

/// One check as the stores see it: escaped identifiers, limits, cost.
#[derive(Debug)]
pub(crate) struct Plan<'a> {
    pub(crate) ids: &'a [String],
    pub(crate) limits: &'a [Limit],
    pub(crate) cost: u64,
    /// The id of the slot a concurrency limit takes (empty when the policy has none).
    pub(crate) lease: &'a str,
}

/// A store's answer, per (identifier, limit) pair, identifier-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub(crate) allowed: bool,
    pub(crate) entries: Vec<Entry>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) admitted: bool,
    pub(crate) remaining: u64,
    pub(crate) reset_after_us: u64,
    pub(crate) retry_after_us: u64,
}

impl Store {
    pub(crate) async fn check(&self, plan: &Plan<'_>) -> Result<Outcome, StoreError> {
        match self {
            Store::Memory(m) => Ok(m.check(plan)),
            #[cfg(feature = "redis")]
            Store::Redis(r) => r.check(plan).await,
        }
    }

    /// The store's key for an (escaped identifier, limit) pair.
    pub(crate) fn key(&self, escaped_id: &str, limit: &Limit) -> String {
        match self {
            Store::Memory(_) => crate::keys::key(memory::PREFIX, escaped_id, limit),
            #[cfg(feature = "redis")]
            Store::Redis(r) => crate::keys::key(r.prefix(), escaped_id, limit),
        }
    }

    /// Extends live leases to their full lease time from now.
    pub(crate) async fn renew(&self, leases: &[&Lease]) -> Result<(), StoreError> {
        match self {
            Store::Memory(m) => {
                m.renew(leases);
                Ok(())
            }
            #[cfg(feature = "redis")]
            Store::Redis(r) => r.renew(leases).await,
        }
    }

    /// Gives slots back (idempotent).
    pub(crate) async fn release(&self, leases: &[Lease]) -> Result<(), StoreError> {
        match self {
            Store::Memory(m) => {
                m.release(leases);
                Ok(())
            }
            #[cfg(feature = "redis")]
            Store::Redis(r) => r.release(leases).await,
        }
    }

    /// This store for its keeper task (see `MemoryStore::detached`).
    pub(crate) fn detached(&self) -> Store {
        match self {
            Store::Memory(m) => Store::Memory(m.detached()),
            #[cfg(feature = "redis")]
            Store::Redis(r) => Store::Redis(r.detached()),
        }
    }

    /// The background task that renews and releases this store's leases.
    pub(crate) fn keeper(&self) -> Option<crate::concurrency::Keeper> {
        let slot = match self {
            Store::Memory(m) => m.keeper_slot(),
            #[cfg(feature = "redis")]
            Store::Redis(r) => r.keeper_slot(),
        };
        crate::concurrency::Keeper::get_or_start(slot, self)
    }
}

/// A concurrency slot held in a store: the key of each identifier's slot set, the lease id,
/// and the lease time.
#[derive(Debug, Clone)]
pub(crate) struct Lease {
    pub(crate) keys: Vec<String>,
    pub(crate) id: String,
    pub(crate) lease_us: u64,
}

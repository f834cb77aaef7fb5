//! The guard of a concurrency slot.

use std::fmt;

use crate::store::lease::Lease;
use crate::store::{LetGo, Store};

/// Holds one concurrency slot per identifier of an admitted request, and gives them back
/// when dropped.
///
/// Returned inside the [`Decision`](crate::Decision) of a policy with a concurrency limit.
/// Like tokio's `OwnedSemaphorePermit` it is a resource, not a value: it is not `Clone`, and
/// dropping it is what releases the slots. While it lives the store renews the slots' lease,
/// so a long request keeps them; if the process dies, they expire after the lease time.
#[must_use = "the concurrency slot is released as soon as the guard is dropped"]
#[clippy::has_significant_drop]
pub struct ConcurrencyGuard {
    /// Boxed, so that a guard — and a decision, which may hold one — stays small to move.
    held: Box<Held>,
    forgotten: bool,
    /// The slots of another check of the same request, given back with these.
    also: Option<Box<ConcurrencyGuard>>,
}

/// The slot a guard holds, and where.
struct Held {
    lease: Lease,
    store: Store,
}

impl fmt::Debug for ConcurrencyGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyGuard")
            .field("lease", &self.held.lease.id)
            .field("keys", &self.held.lease.keys.len())
            .finish()
    }
}

impl ConcurrencyGuard {
    /// Holds the slot `lease` that a check took in `store`.
    pub(crate) fn new(lease: Lease, store: Store) -> ConcurrencyGuard {
        store.hold(&lease);
        ConcurrencyGuard {
            held: Box::new(Held { lease, store }),
            forgotten: false,
            also: None,
        }
    }

    /// One guard holding the slots of both (a request checked by two limiters).
    pub(crate) fn join(mut self, other: ConcurrencyGuard) -> ConcurrencyGuard {
        self.also = Some(Box::new(match self.also.take() {
            Some(also) => also.join(other),
            None => other,
        }));
        self
    }

    /// Keeps the slot after the guard is gone: it is no longer renewed, and expires after the
    /// lease time. For work handed to something that outlives the request.
    pub fn forget(mut self) {
        self.forgotten = true;
        if let Some(also) = self.also.take() {
            also.forget();
        }
    }
}

impl Drop for ConcurrencyGuard {
    fn drop(&mut self) {
        let how = if self.forgotten {
            LetGo::Expire
        } else {
            LetGo::Release
        };
        let held = &mut *self.held;
        held.store.let_go(std::mem::take(&mut held.lease), how);
    }
}

#[cfg(test)]
mod tests {
    use crate::{Limiter, MemoryStore};

    /// The keeper task does not keep a store alive: once its handles and guards are gone, the
    /// task ends and the state is freed.
    #[tokio::test]
    async fn a_dropped_store_is_freed() {
        let store = MemoryStore::new();
        let state = std::sync::Arc::downgrade(&store.inner_for_tests());
        let limiter = Limiter::new(store, "2 concurrent".parse().unwrap());
        let d = limiter.check(&["k"]).await.unwrap();
        assert!(d.guard().is_some());
        drop((d, limiter));
        for _ in 0..100 {
            if state.upgrade().is_none() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("the store's state outlived every handle");
    }
}

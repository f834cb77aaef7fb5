//! Concurrency slots: the guard that holds one, and the background task that renews and
//! releases them.
//!
//! A slot is a lease in the store: a random id with a deadline (the store's time plus the
//! lease). Checking drops expired leases and counts the live ones in the same atomic step that
//! takes a new one. While a guard lives, the keeper renews its lease every third of the lease
//! time, so a long request keeps its slot; when the guard is dropped the lease is released
//! (for Redis, by the keeper, batched, so `Drop` never waits on the network). A process that
//! dies holding slots stops renewing them, and they expire after the lease time; the Redis key
//! itself carries a TTL as the last resort.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::store::{system_micros, Lease, Store};

/// Holds one concurrency slot per identifier of an admitted request, and gives them back
/// when dropped (every clone of it, that is: clones share the slots).
///
/// Returned inside the [`Decision`](crate::Decision) of a policy with a concurrency limit.
#[must_use = "the concurrency slot is released as soon as the guard is dropped"]
#[derive(Clone)]
pub struct ConcurrencyGuard {
    inner: Arc<GuardInner>,
}

struct GuardInner {
    lease: Lease,
    store: Store,
    keeper: Option<Keeper>,
    forgotten: AtomicBool,
}

impl fmt::Debug for ConcurrencyGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyGuard")
            .field("lease", &self.inner.lease.id)
            .field("keys", &self.inner.lease.keys.len())
            .finish()
    }
}

impl ConcurrencyGuard {
    pub(crate) fn new(lease: Lease, store: Store) -> ConcurrencyGuard {
        let keeper = store.keeper();
        if let Some(k) = &keeper {
            k.send(Msg::Hold(lease.clone()));
        }
        ConcurrencyGuard {
            inner: Arc::new(GuardInner {
                lease,
                store,
                keeper,
                forgotten: AtomicBool::new(false),
            }),
        }
    }

    /// Keeps the slot after the guard is gone: it is no longer renewed, and expires after the
    /// lease time. For work handed to something that outlives the request.
    pub fn forget(self) {
        let inner = &self.inner;
        inner.forgotten.store(true, Ordering::SeqCst);
        if let Some(k) = &inner.keeper {
            k.send(Msg::Forget(inner.lease.id.clone()));
        }
    }
}

impl Drop for GuardInner {
    fn drop(&mut self) {
        if self.forgotten.load(Ordering::SeqCst) {
            return;
        }
        match &self.store {
            // In process: give it back now, and tell the keeper to stop renewing it.
            Store::Memory(m) => {
                m.release(std::slice::from_ref(&self.lease));
                if let Some(k) = &self.keeper {
                    k.send(Msg::Forget(self.lease.id.clone()));
                }
            }
            // Elsewhere: the keeper releases it, batched with others; without a keeper (no
            // runtime) the lease expires by itself.
            #[allow(unreachable_patterns)]
            _ => {
                if let Some(k) = &self.keeper {
                    k.send(Msg::Release(self.lease.clone()));
                }
            }
        }
    }
}

/// A random 128-bit lease id, in hex. `RandomState` is seeded from the operating system's
/// randomness once per thread; the counter and the time keep ids apart within a thread.
pub(crate) fn lease_id() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let seed = (
        N.fetch_add(1, Ordering::Relaxed),
        system_micros(),
        std::process::id(),
    );
    let a = RandomState::new().hash_one(seed);
    let b = RandomState::new().hash_one((a, seed));
    format!("{a:016x}{b:016x}")
}

pub(crate) enum Msg {
    /// A slot was taken: renew it until told otherwise.
    Hold(Lease),
    /// A guard was dropped: release the slot.
    Release(Lease),
    /// Stop renewing (the slot was forgotten, or already released).
    Forget(String),
}

/// The handle of a store's keeper task.
#[derive(Clone)]
pub(crate) struct Keeper {
    tx: mpsc::UnboundedSender<Msg>,
}

impl fmt::Debug for Keeper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keeper")
            .field("running", &!self.tx.is_closed())
            .finish()
    }
}

/// Where a store keeps its keeper (started on first use).
pub(crate) type KeeperSlot = Mutex<Option<Keeper>>;

/// How often the keeper looks for leases to renew.
const TICK: Duration = Duration::from_millis(250);

impl Keeper {
    fn send(&self, msg: Msg) {
        // The task is gone only when the runtime is: leases then expire by themselves.
        let _ = self.tx.send(msg);
    }

    /// The store's keeper, started within the current Tokio runtime if not running. `None`
    /// outside a runtime.
    pub(crate) fn get_or_start(slot: &KeeperSlot, store: &Store) -> Option<Keeper> {
        let mut current = slot.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(k) = current.as_ref().filter(|k| !k.tx.is_closed()) {
            return Some(k.clone());
        }
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let (tx, rx) = mpsc::unbounded_channel();
        // The task holds the store without the slot (and so without a sender): once every
        // handle of the store and every guard is gone, its channel closes and it ends.
        runtime.spawn(run(store.detached(), rx));
        let keeper = Keeper { tx };
        *current = Some(keeper.clone());
        Some(keeper)
    }
}

/// The keeper: renews held leases every third of their lease time, releases dropped ones in
/// batches. It ends when the store's handles and guards are all gone.
async fn run(store: Store, mut rx: mpsc::UnboundedReceiver<Msg>) {
    // lease id -> (lease, when last renewed)
    let mut held: HashMap<String, (Lease, tokio::time::Instant)> = HashMap::new();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            msg = rx.recv() => {
                let Some(msg) = msg else { return };
                let mut released = Vec::new();
                apply(msg, &mut held, &mut released);
                while let Ok(msg) = rx.try_recv() {
                    apply(msg, &mut held, &mut released);
                }
                if !released.is_empty() {
                    // A failed release is not retried: the lease expires on its own.
                    let _ = store.release(&released).await;
                }
            }
            _ = tick.tick() => {
                let now = tokio::time::Instant::now();
                let due: Vec<&Lease> = held
                    .values()
                    .filter(|(l, at)| now.duration_since(*at) >= Duration::from_micros(l.lease_us / 3))
                    .map(|(l, _)| l)
                    .collect();
                if due.is_empty() {
                    continue;
                }
                let ids: Vec<String> = due.iter().map(|l| l.id.clone()).collect();
                if store.renew(&due).await.is_ok() {
                    for id in ids {
                        if let Some(entry) = held.get_mut(&id) {
                            entry.1 = now;
                        }
                    }
                }
            }
        }
    }
}

fn apply(
    msg: Msg,
    held: &mut HashMap<String, (Lease, tokio::time::Instant)>,
    released: &mut Vec<Lease>,
) {
    match msg {
        Msg::Hold(lease) => {
            held.insert(lease.id.clone(), (lease, tokio::time::Instant::now()));
        }
        Msg::Release(lease) => {
            held.remove(&lease.id);
            released.push(lease);
        }
        Msg::Forget(id) => {
            held.remove(&id);
        }
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

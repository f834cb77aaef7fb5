//! The in-process store.
//!
//! State lives in a fixed number of shards, each a mutex around a hash map from key to state.
//! A check locks the shards its keys fall in (in index order, so checks never deadlock),
//! decides, and commits only when everything admits — the same all-or-nothing as the Redis
//! script, with the same algorithms (`src/algorithm/`, whose `decide` is the twin of the script).
//!
//! # Memory bound
//!
//! Every state knows when it stops mattering (the same instant the Redis store uses for its
//! TTL). Expired states are swept whenever a shard has doubled since its last sweep, so memory
//! follows the live key count. On top of that the store holds at most `max_keys` states
//! (default 1,000,000, split evenly over the shards). A flood of distinct keys that reaches the
//! bound evicts, among a sample of states of the full shard, the one closest to expiry — the
//! policy Redis calls `volatile-ttl`. An evicted key starts again from an empty state: at the
//! bound the store errs on the side of admitting a client it no longer remembers, rather than
//! refusing clients it has never seen. A sliding-log state holds one `u64` per admitted cost
//! unit, so its size is bounded by the limit's count.

use std::cell::RefCell;
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::keyspace;
use super::lease::{KeeperSlot, Lease};
use super::{Outcome, Plan};
use crate::algorithm::{self, Layout, State};
use crate::clock::{system_micros, Clock};
use crate::policy::Limit;

const SHARDS: usize = 64;
const DEFAULT_MAX_KEYS: usize = 1_000_000;
const MIN_SWEEP: usize = 1024;
const EVICTION_SAMPLE: usize = 16;
/// The memory store's key prefix (it shares nothing, so any constant does).
pub(crate) const PREFIX: &str = "m";

/// State in this process: for single-process applications, tests and local development.
///
/// A cheap handle: clones share the state.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
    /// Kept apart from the state: the keeper task holds the state, not its own handle (see
    /// `detached`).
    keeper: Arc<KeeperSlot>,
}

#[derive(Debug)]
struct Inner {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    clock: Clock,
    max_per_shard: usize,
}

#[derive(Debug, Default)]
struct Shard {
    map: HashMap<String, Stored>,
    next_sweep: usize,
}

#[derive(Debug)]
struct Stored {
    state: State,
    expires_at: u64,
}

/// Configures a [`MemoryStore`].
#[derive(Debug, Clone, Default)]
pub struct MemoryStoreBuilder {
    clock: Clock,
    max_keys: Option<usize>,
}

impl MemoryStoreBuilder {
    /// Reads the time from `clock` instead of the system clock.
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The most states the store keeps (default 1,000,000): per identifier and policy, one
    /// for its window and GCRA limits together and one per sliding log or concurrency limit,
    /// as the Redis store keeps keys. At the bound the states closest to expiry are evicted
    /// first (see the module documentation).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = Some(max_keys);
        self
    }

    /// Builds the store.
    pub fn build(self) -> MemoryStore {
        let max_keys = self.max_keys.unwrap_or(DEFAULT_MAX_KEYS).max(1);
        MemoryStore {
            inner: Arc::new(Inner {
                shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
                hasher: RandomState::new(),
                clock: self.clock,
                max_per_shard: max_keys.div_ceil(SHARDS),
            }),
            keeper: Arc::default(),
        }
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl MemoryStore {
    /// A store with the system clock and the default bound.
    pub fn new() -> MemoryStore {
        MemoryStore::builder().build()
    }

    /// Configures a store.
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder::default()
    }

    /// How many states the store holds now (expired ones not yet swept included).
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| lock(s).map.len()).sum()
    }

    /// Whether the store holds no state.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn check(&self, plan: &Plan<'_>) -> Outcome {
        if let [id] = plan.ids {
            let single = SCRATCH.with(|scratch| {
                // Taken only here, and a check never runs another: a failed borrow is
                // impossible, but the general path would answer it all the same.
                let mut scratch = scratch.try_borrow_mut().ok()?;
                self.check_single(id, plan, &mut scratch)
            });
            if let Some(outcome) = single {
                return outcome;
            }
        }
        self.check_general(plan)
    }

    /// A check of one identifier whose state is one key (a policy of window and GCRA limits,
    /// or of one sorted-set limit): one shard, one lookup, and for a key that exists no
    /// allocation — the key is built in a reused buffer, and the state is decided in place.
    /// `None` when the policy needs more keys.
    fn check_single(&self, id: &str, plan: &Plan<'_>, scratch: &mut Scratch) -> Option<Outcome> {
        let inner = &*self.inner;
        let (layout, key) = scratch.key(id, plan.limits)?;
        let now = self.now();
        let shard_ix = (inner.hasher.hash_one(key) as usize) % SHARDS;
        let mut guard = lock(&inner.shards[shard_ix]);
        let shard = &mut *guard;
        let decide = |slot: &mut [Option<State>; 1]| {
            algorithm::decide(slot, layout, plan.limits, now, plan.cost, plan.lease)
        };
        let Some(stored) = shard.map.get_mut(key) else {
            let mut slot = [None];
            let outcome = decide(&mut slot);
            if let [Some(state)] = slot {
                make_room(shard, now, inner.max_per_shard, |k| k == key);
                let expires_at = algorithm::expires_at(&state, layout, plan.limits, 0);
                shard
                    .map
                    .insert(key.to_owned(), Stored { state, expires_at });
            }
            return Some(outcome);
        };
        // The state leaves its entry for the decision (an expired one is dropped: it decides
        // like none) and goes back with its new expiry; the placeholder does not allocate.
        let taken = std::mem::replace(&mut stored.state, State::Counters(Vec::new()));
        let mut slot = [(stored.expires_at > now).then_some(taken)];
        let outcome = decide(&mut slot);
        match slot {
            [Some(state)] => {
                stored.expires_at = algorithm::expires_at(&state, layout, plan.limits, 0);
                stored.state = state;
            }
            [None] => {
                shard.map.remove(key);
            }
        }
        Some(outcome)
    }

    fn check_general(&self, plan: &Plan<'_>) -> Outcome {
        let inner = &*self.inner;
        let now = self.now();

        // (shard, key) per key of each identifier, identifier-major: the keys the Redis
        // store would use.
        let layout = Layout::of(plan.limits);
        let per_id = layout.keys_per_id();
        let pairs: Vec<(usize, String)> = plan
            .ids
            .iter()
            .flat_map(|id| (0..per_id).map(|k| key_of(id, k, &layout, plan.limits)))
            .map(|k| ((inner.hasher.hash_one(&k) as usize) % SHARDS, k))
            .collect();
        // Lock every shard involved, in index order, so that checks never deadlock.
        let mut shard_ids: Vec<usize> = pairs.iter().map(|(s, _)| *s).collect();
        shard_ids.sort_unstable();
        shard_ids.dedup();
        let mut guards: Vec<MutexGuard<'_, Shard>> =
            shard_ids.iter().map(|&s| lock(&inner.shards[s])).collect();
        let guard_of = |s: usize| shard_ids.binary_search(&s).unwrap_or(0);

        // The states leave their maps for the decision (an expired one is dropped: it decides
        // like none), and those that exist afterwards go back with their new expiry.
        let mut present = Vec::with_capacity(pairs.len());
        let mut states: Vec<Option<State>> = pairs
            .iter()
            .map(|(s, key)| {
                let stored = guards[guard_of(*s)].map.remove(key);
                present.push(stored.is_some());
                stored.filter(|st| st.expires_at > now).map(|st| st.state)
            })
            .collect();
        let outcome = algorithm::decide(
            &mut states,
            &layout,
            plan.limits,
            now,
            plan.cost,
            plan.lease,
        );
        for (k, ((s, key), state)) in pairs.iter().zip(states).enumerate() {
            let Some(state) = state else { continue };
            let shard = &mut *guards[guard_of(*s)];
            if !present[k] {
                make_room(shard, now, inner.max_per_shard, |k| {
                    pairs.iter().any(|(_, p)| p == k)
                });
            }
            let expires_at = algorithm::expires_at(&state, &layout, plan.limits, k % per_id);
            shard.map.insert(key.clone(), Stored { state, expires_at });
        }
        outcome
    }
}

impl MemoryStore {
    fn now(&self) -> u64 {
        self.inner.clock.manual_now().unwrap_or_else(system_micros)
    }

    fn with_state(&self, key: &str, f: impl FnOnce(&mut Stored)) {
        let shard = (self.inner.hasher.hash_one(key) as usize) % SHARDS;
        if let Some(stored) = lock(&self.inner.shards[shard]).map.get_mut(key) {
            f(stored);
        }
    }

    pub(crate) fn renew(&self, leases: &[&Lease]) {
        let now = self.now();
        for lease in leases {
            for key in &lease.keys {
                self.with_state(key, |stored| {
                    if algorithm::renew(&mut stored.state, &lease.id, now, lease.lease_us) {
                        stored.expires_at = stored.expires_at.max(now + lease.lease_us);
                    }
                });
            }
        }
    }

    pub(crate) fn release(&self, leases: &[Lease]) {
        for lease in leases {
            for key in &lease.keys {
                self.with_state(key, |stored| {
                    algorithm::release(&mut stored.state, &lease.id)
                });
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn inner_for_tests(&self) -> Arc<impl Sized> {
        self.inner.clone()
    }

    pub(crate) fn keeper_slot(&self) -> &KeeperSlot {
        &self.keeper
    }

    /// The same state without the keeper handle, for the keeper task itself: holding its own
    /// sender would keep it (and the state) alive forever.
    pub(crate) fn detached(&self) -> MemoryStore {
        MemoryStore {
            inner: self.inner.clone(),
            keeper: Arc::default(),
        }
    }
}

/// The name of key `k` of identifier `id` (escaped).
fn key_of(id: &str, k: usize, layout: &Layout, limits: &[Limit]) -> String {
    if k == 0 && layout.has_packed() {
        keyspace::packed_key(PREFIX, id, layout.limits_of(0).map(|l| &limits[l]))
    } else {
        let l = layout.limits_of(k).next().unwrap_or(0);
        keyspace::key(PREFIX, id, &limits[l])
    }
}

thread_local! {
    /// What a single-key check reuses from one check to the next on this thread.
    static SCRATCH: RefCell<Scratch> = RefCell::default();
}

/// The layout of the last policy checked on this thread and its key's limit part, worked out
/// once per policy rather than per check, and the buffer the key is built in.
#[derive(Default)]
struct Scratch {
    limits: Vec<Limit>,
    /// The layout of `limits`, when an identifier's state is one key.
    layout: Option<Layout>,
    /// The key without its prefix and identifier: `}:` and the limit part.
    suffix: String,
    key: String,
}

impl Scratch {
    /// The layout of `limits` and the key of `id` (escaped) under it, when the state of an
    /// identifier is one key.
    fn key(&mut self, id: &str, limits: &[Limit]) -> Option<(&Layout, &str)> {
        if self.limits != limits {
            let layout = Layout::of(limits);
            self.limits = limits.to_vec();
            self.suffix.clear();
            self.layout = None;
            if layout.keys_per_id() == 1 {
                // the key of an empty identifier is the prefix, `:{`, then the suffix
                let empty = key_of("", 0, &layout, limits);
                self.suffix.push_str(&empty[PREFIX.len() + 2..]);
                self.layout = Some(layout);
            }
        }
        let layout = self.layout.as_ref()?;
        self.key.clear();
        self.key.push_str(PREFIX);
        self.key.push_str(":{");
        self.key.push_str(id);
        self.key.push_str(&self.suffix);
        Some((layout, &self.key))
    }
}

fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // A panic while holding the lock cannot leave a state half-written in a way that matters
    // more than losing it would, so a poisoned shard is used as is.
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Before inserting into `shard`: sweep expired states when the shard has grown enough since
/// the last sweep, and evict one when it is at its bound.
fn make_room(shard: &mut Shard, now: u64, max: usize, protected: impl Fn(&str) -> bool) {
    // Sweeping scans the shard: only when it has doubled since the last sweep, so the cost
    // stays amortised even while a flood keeps the shard at its bound.
    if shard.map.len() >= shard.next_sweep.max(MIN_SWEEP) {
        shard.map.retain(|_, s| s.expires_at > now);
        shard.next_sweep = (shard.map.len() * 2).max(MIN_SWEEP);
    }
    while shard.map.len() >= max {
        let victim = shard
            .map
            .iter()
            .filter(|(k, _)| !protected(k))
            .take(EVICTION_SAMPLE)
            .min_by_key(|(_, s)| s.expires_at)
            .map(|(k, _)| k.clone());
        match victim {
            Some(k) => {
                shard.map.remove(&k);
            }
            None => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::{Limiter, Policy};
    use std::time::Duration;

    fn limiter(store: &MemoryStore, policy: &str) -> Limiter {
        Limiter::new(store.clone(), policy.parse::<Policy>().unwrap())
    }

    #[test]
    fn the_reused_key_is_the_key_of_the_identifier() {
        let mut scratch = Scratch::default();
        for policy in [
            "10/s",
            "10/s, 120/min gcra, 240/h fixed",
            "5/s log",
            "3 concurrent",
        ] {
            let limits = policy.parse::<Policy>().unwrap().limits().to_vec();
            let layout = Layout::of(&limits);
            for id in ["ip:1.2.3.4", "", "%7B"] {
                let (_, key) = scratch.key(id, &limits).unwrap();
                assert_eq!(key, key_of(id, 0, &layout, &limits), "{policy}");
            }
        }
        // a policy whose identifiers have several keys takes the general path
        let limits = "10/s, 5/s log".parse::<Policy>().unwrap().limits().to_vec();
        assert!(scratch.key("a", &limits).is_none());
    }

    #[tokio::test]
    async fn a_flood_of_distinct_keys_stays_within_the_bound() {
        let clock = ManualClock::new(1_000_000_000_000);
        let store = MemoryStore::builder()
            .clock(Clock::Manual(clock.clone()))
            .max_keys(SHARDS * 100)
            .build();
        let l = limiter(&store, "5/min");
        for i in 0..50_000 {
            assert!(l.check(&[format!("flood:{i}")]).await.unwrap().is_allowed());
            assert!(store.len() <= SHARDS * 100);
        }
        // the newest keys survived the evictions and are still limited
        let d = l.check(&["flood:49999"]).await.unwrap();
        assert_eq!(d.statuses()[0].remaining, 3);
    }

    #[tokio::test]
    async fn expired_state_is_swept() {
        let clock = ManualClock::new(1_000_000_000_000);
        let store = MemoryStore::builder()
            .clock(Clock::Manual(clock.clone()))
            .build();
        let l = limiter(&store, "5/s log, 5/s gcra");
        for i in 0..20_000 {
            let _ = l.check(&[format!("k{i}")]).await.unwrap();
            clock.advance(Duration::from_micros(100));
        }
        // at 100 µs a request and 1 s of life, about 10,000 keys per limit are alive at a
        // time; sweeps keep the store within twice that, not the 40,000 ever created
        assert!(
            store.len() <= 2 * 2 * 10_000 + 2 * MIN_SWEEP * SHARDS / 16,
            "{}",
            store.len()
        );
        clock.advance(Duration::from_secs(2));
        for i in 0..(MIN_SWEEP * SHARDS) {
            let _ = l.check(&[format!("later{i}")]).await.unwrap();
        }
        assert!(store.len() < 2 * MIN_SWEEP * SHARDS + 40_000);
    }

    #[test]
    fn many_threads_never_exceed_the_limit() {
        let store = MemoryStore::new();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .build()
            .unwrap();
        for policy in ["100/h log", "100/h", "100/h gcra", "100/d fixed"] {
            let l = limiter(&store, policy);
            let admitted: usize = rt.block_on(async {
                let tasks: Vec<_> = (0..16)
                    .map(|_| {
                        let l = l.clone();
                        tokio::spawn(async move {
                            let mut n = 0;
                            for _ in 0..50 {
                                // two identifiers, one shared by all: lock ordering matters
                                if l.check(&["shared", "other"]).await.unwrap().is_allowed() {
                                    n += 1;
                                }
                            }
                            n
                        })
                    })
                    .collect();
                let mut total = 0;
                for t in tasks {
                    total += t.await.unwrap();
                }
                total
            });
            // the log and GCRA are exact; the window algorithms too, unless the run happens
            // to straddle a window boundary (then a fixed window admits up to twice)
            if policy.contains("log") || policy.contains("gcra") {
                assert_eq!(admitted, 100, "{policy}");
            } else {
                assert!((100..=200).contains(&admitted), "{policy}: {admitted}");
            }
        }
    }
}

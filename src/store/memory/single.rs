//! The short way for a check of one identifier whose state is one key: a policy of window
//! (rolling, sliding, fixed) and GCRA limits, which share the packed key, or of one sorted-set
//! limit. One hash, one shard, one lookup, and for a key that exists no allocation in the
//! store: the key is built in a buffer reused from check to check on the thread, and the state
//! is decided in place.
//!
//! It decides exactly as `MemoryStore::decide_general`: the same key (the one
//! `keyspace::keys_of` names, namespace included), so the same shard, the same decision
//! (`algorithm::decide_within`), the same expiry, and the same eviction when the key is new.
//! Peeks, resets and refunds take the general way.

use std::cell::RefCell;

use super::{lock, make_room, MemoryStore, Stored, PREFIX};
use crate::algorithm::{self, Layout, State};
use crate::policy::Limit;
use crate::store::{keyspace, Outcome, Plan};

thread_local! {
    /// What a single-key check reuses from one check to the next on this thread.
    static SCRATCH: RefCell<Scratch> = RefCell::default();
}

/// A check of `id` (escaped, the plan's only identifier) that may wait up to `max_wait_us`;
/// `None` when the plan's identifiers have more than one key each.
pub(super) fn check(
    store: &MemoryStore,
    id: &str,
    plan: &Plan<'_>,
    max_wait_us: u64,
) -> Option<Outcome> {
    // On a thread being torn down (`try_with` fails), or if the scratch were borrowed (a
    // check never runs another, so it cannot be), the general way answers.
    SCRATCH
        .try_with(|scratch| {
            let mut scratch = scratch.try_borrow_mut().ok()?;
            let (layout, key) = scratch.key(id, plan.namespace, plan.limits)?;
            Some(decide(store, layout, key, plan, max_wait_us))
        })
        .ok()
        .flatten()
}

/// The check of the one key `key`, laid out as `layout`.
fn decide(
    store: &MemoryStore,
    layout: &Layout,
    key: &str,
    plan: &Plan<'_>,
    max_wait_us: u64,
) -> Outcome {
    let inner = &*store.inner;
    let now = store.now();
    let hash = inner.hash(key);
    let mut guard = lock(inner.shard(hash));
    let shard = &mut *guard;
    let decide = |slot: &mut [Option<State>; 1]| {
        algorithm::decide_within(
            slot,
            layout,
            plan.limits,
            now,
            plan.cost,
            plan.lease,
            max_wait_us,
        )
    };
    let Some(stored) = shard.map.get_mut(hash, key) else {
        let mut slot = [None];
        let outcome = decide(&mut slot);
        if let [Some(state)] = slot {
            make_room(shard, now, inner.max_per_shard, |k| k == key);
            let expires_at = algorithm::expires_at(&state, layout, plan.limits, 0);
            shard.map.insert(hash, key, Stored { state, expires_at });
        }
        return outcome;
    };
    // The state leaves its entry for the decision (an expired one is dropped: it decides like
    // none) and goes back with its new expiry; the placeholder does not allocate.
    let taken = std::mem::replace(&mut stored.state, State::Counters(Vec::new()));
    let mut slot = [(stored.expires_at > now).then_some(taken)];
    let outcome = decide(&mut slot);
    match slot {
        [Some(state)] => {
            stored.expires_at = algorithm::expires_at(&state, layout, plan.limits, 0);
            stored.state = state;
        }
        [None] => {
            shard.map.remove(hash, key);
        }
    }
    outcome
}

/// The layout of the last policy and namespace checked on this thread and the part of their
/// key after the identifier, worked out once per policy rather than per check, and the buffer
/// the key is built in.
#[derive(Default)]
struct Scratch {
    limits: Vec<Limit>,
    namespace: Option<String>,
    /// The layout of `limits`, when an identifier's state is one key.
    layout: Option<Layout>,
    /// The key after the identifier: `}:`, the namespace and `:` when there is one, and the
    /// limit part.
    suffix: String,
    key: String,
}

impl Scratch {
    /// The layout of `limits` and the key of `id` (escaped) under it in `namespace`, when the
    /// state of an identifier is one key.
    fn key(
        &mut self,
        id: &str,
        namespace: Option<&str>,
        limits: &[Limit],
    ) -> Option<(&Layout, &str)> {
        if self.limits != limits || self.namespace.as_deref() != namespace {
            self.limits.clear();
            self.limits.extend_from_slice(limits);
            self.namespace = namespace.map(str::to_owned);
            self.suffix.clear();
            self.layout = None;
            let layout = Layout::of(limits);
            if layout.keys_per_id() == 1 {
                // the key of an empty identifier is the prefix, `:{`, then the suffix
                let keys = keyspace::keys_of(PREFIX, "", namespace, limits);
                let suffix = match keys.as_slice() {
                    [key] => key.strip_prefix(PREFIX).and_then(|k| k.strip_prefix(":{")),
                    _ => None,
                };
                if let Some(suffix) = suffix {
                    self.suffix.push_str(suffix);
                    self.layout = Some(layout);
                }
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

#[cfg(test)]
mod tests;

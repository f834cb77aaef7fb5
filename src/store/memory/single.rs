//! The short way for a check of one identifier whose state is one key: a policy of window
//! (rolling, sliding, fixed) and GCRA limits, which share the packed key, or of one sorted-set
//! limit. One hash, one shard, one lookup, and for a key that exists no allocation in the
//! store: the key is built on the stack (or, when it does not fit there or its identifier must
//! be escaped, in a buffer reused from check to check on the thread), and the state is decided
//! in place.
//!
//! The shape of such a key ([`OneKey`]: the layout, and the key after the identifier) is worked
//! out once per policy: a limiter holds it with each version of its policy and hands it to
//! [`MemoryStore::check_one`] with the identifier as the caller gave it, which is escaped
//! straight into the key; a check that comes as a `Plan` (escaped identifiers) finds it in a
//! per-thread memo of the last policy checked on the thread.
//!
//! It decides exactly as `MemoryStore::decide_general`: the same key (the one
//! `keyspace::keys_of` names, namespace included), so the same shard, the same decision
//! (`algorithm::decide_within_into`; for a packed key and a check that does not wait,
//! `algorithm::decide_packed_into`, the same phases on its counters where they lie, or on fresh
//! ones for a key that is new or expired), the same expiry, and the same eviction when the key
//! is new.
//! Peeks, resets and refunds take the general way.

use std::cell::RefCell;

use arrayvec::ArrayString;

use super::{lock, make_room, MemoryStore, Stored, PREFIX};
use crate::algorithm::{self, Counter, Counters, Layout, Sink, State, Summary};
use crate::policy::Limit;
use crate::store::{keyspace, Plan};

thread_local! {
    /// The key buffer and the memo of the last shape, reused from one check to the next on
    /// this thread.
    static SCRATCH: RefCell<Scratch> = RefCell::default();
}

/// How an identifier's state is one key under a policy and a namespace: its layout, and the
/// key after the identifier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OneKey {
    layout: Layout,
    /// The key after the identifier: `}:`, the namespace and `:` when there is one, and the
    /// limit part.
    suffix: String,
}

impl OneKey {
    /// The shape of the keys of `limits` in `namespace`; `None` when an identifier's state
    /// is more than one key (the general way decides).
    pub(crate) fn of(namespace: Option<&str>, limits: &[Limit]) -> Option<OneKey> {
        let layout = Layout::of(limits);
        if layout.keys_per_id() != 1 {
            return None;
        }
        let [suffix] = <[String; 1]>::try_from(keyspace::tails_of(namespace, limits)).ok()?;
        Some(OneKey { layout, suffix })
    }
}

/// What one check of one identifier decides with: its limits, cost, lease and longest wait.
pub(super) struct Ask<'a> {
    pub(super) limits: &'a [Limit],
    pub(super) cost: u64,
    pub(super) lease: &'a str,
    pub(super) max_wait_us: u64,
}

/// A check of `id` (as the caller gave it: escaped here) shaped as `shape`.
pub(super) fn check_one(
    store: &MemoryStore,
    shape: &OneKey,
    id: &str,
    ask: &Ask<'_>,
    sink: &mut impl Sink,
) -> Summary {
    // The usual key, of an identifier written as it is, built on the stack: without the
    // thread's buffer to reach and borrow, and with a copy of each part rather than a push
    // that checks the buffer's room.
    if keyspace::is_plain(id) {
        if let Some(key) = on_stack(id, &shape.suffix) {
            return decide(store, &shape.layout, &key, ask, sink);
        }
    }
    let mut run = |key: &mut String| {
        key.clear();
        key.push_str(PREFIX);
        key.push_str(":{");
        keyspace::push_escaped(key, id);
        key.push_str(&shape.suffix);
        decide(store, &shape.layout, key, ask, sink)
    };
    // `try_with`: on a thread being torn down, a buffer of its own; a scratch already
    // borrowed cannot be (a check never runs another), and would get one too.
    let reused = SCRATCH.try_with(|scratch| {
        let mut scratch = scratch.try_borrow_mut().ok()?;
        Some(run(&mut scratch.key))
    });
    match reused {
        Ok(Some(summary)) => summary,
        _ => run(&mut String::new()),
    }
}

/// The longest key [`check_one`] builds on the stack (an identifier of up to about 80 bytes
/// under a policy of a few limits).
const STACK_KEY: usize = 120;

/// The key of `id` (plain: written as it is) shaped by `suffix`, if it fits on the stack.
#[inline(always)]
fn on_stack(id: &str, suffix: &str) -> Option<ArrayString<STACK_KEY>> {
    let mut key = ArrayString::new();
    key.try_push_str(PREFIX).ok()?;
    key.try_push_str(":{").ok()?;
    key.try_push_str(id).ok()?;
    key.try_push_str(suffix).ok()?;
    Some(key)
}

/// A check of `id` (escaped, the plan's only identifier) that may wait up to `max_wait_us`;
/// `None` when the plan's identifiers have more than one key each.
pub(super) fn check(
    store: &MemoryStore,
    id: &str,
    plan: &Plan<'_>,
    max_wait_us: u64,
    sink: &mut impl Sink,
) -> Option<Summary> {
    let ask = Ask {
        limits: plan.limits,
        cost: plan.cost,
        lease: plan.lease,
        max_wait_us,
    };
    // On a thread being torn down (`try_with` fails), or if the scratch were borrowed (a
    // check never runs another, so it cannot be), the general way answers.
    SCRATCH
        .try_with(|scratch| {
            let mut scratch = scratch.try_borrow_mut().ok()?;
            let (shape, key) = scratch.key(id, plan.namespace, plan.limits)?;
            Some(decide(store, &shape.layout, key, &ask, sink))
        })
        .ok()
        .flatten()
}

/// The check of the one key `key`, laid out as `layout`.
fn decide(
    store: &MemoryStore,
    layout: &Layout,
    key: &str,
    ask: &Ask<'_>,
    sink: &mut impl Sink,
) -> Summary {
    let inner = &*store.inner;
    let now = store.now();
    let hash = inner.hash(key);
    let mut guard = lock(inner.shard(hash));
    let shard = &mut *guard;
    let limits = ask.limits;
    let mut decide = |slot: &mut [Option<State>; 1]| {
        algorithm::decide_within_into(
            slot,
            layout,
            limits,
            now,
            ask.cost,
            ask.lease,
            ask.max_wait_us,
            sink,
        )
    };
    let mut found = shard.map.get_mut(hash, key);
    // The usual check: a packed key, decided where its counters lie, on fresh ones when it is
    // new or expired (it decides like none then, and is kept only if charged).
    let packed = ask.max_wait_us == 0
        && layout.is_packed_only()
        && found
            .as_deref()
            .is_none_or(|s| matches!(s.state, State::Counters(_)));
    if packed {
        let mut fresh = Counters::new();
        let (counters, live) = match found.as_deref_mut() {
            Some(Stored {
                state: State::Counters(counters),
                expires_at,
            }) => (counters, *expires_at > now),
            _ => (&mut fresh, false),
        };
        if !live {
            counters.clear();
            counters.extend(limits.iter().map(Counter::fresh));
        }
        let summary = algorithm::decide_packed_into(counters, limits, now, ask.cost, !live, sink);
        let expires_at = summary
            .allowed
            .then(|| algorithm::packed_expires_at(counters, limits));
        match (found, expires_at) {
            (Some(stored), Some(expires_at)) => stored.expires_at = expires_at,
            // A denial changes nothing (all or nothing): a live state keeps its expiry, an
            // expired one goes, and a new key is not kept.
            (Some(_), None) if !live => {
                shard.map.remove(hash, key);
            }
            (None, Some(expires_at)) => {
                make_room(inner, shard, now, hash, |k| k == key);
                let state = State::Counters(fresh);
                shard.map.insert(hash, key, Stored { state, expires_at });
            }
            _ => {}
        }
        return summary;
    }
    let Some(stored) = found else {
        let mut slot = [None];
        let summary = decide(&mut slot);
        if let [Some(state)] = slot {
            make_room(inner, shard, now, hash, |k| k == key);
            let expires_at = algorithm::expires_at(&state, layout, limits, 0);
            shard.map.insert(hash, key, Stored { state, expires_at });
        }
        return summary;
    };
    // The state leaves its entry for the decision (an expired one is dropped: it decides like
    // none) and goes back with its new expiry; the placeholder does not allocate, and is
    // expired while the state is out (as the general way's: a decision cut short by a panic
    // leaves no empty state behind).
    let had = stored.expires_at;
    let live = had > now;
    stored.expires_at = 0;
    let taken = std::mem::replace(&mut stored.state, State::Counters(Counters::new()));
    let mut slot = [live.then_some(taken)];
    let summary = decide(&mut slot);
    match slot {
        [Some(state)] => {
            // A denial changes nothing (all or nothing), so a live state keeps its expiry.
            stored.expires_at = if summary.allowed || !live {
                algorithm::expires_at(&state, layout, limits, 0)
            } else {
                had
            };
            stored.state = state;
        }
        [None] => {
            shard.map.remove(hash, key);
        }
    }
    summary
}

/// The shape of the last policy and namespace checked on this thread (for checks that come
/// as a `Plan`), and the buffer keys are built in.
#[derive(Default)]
struct Scratch {
    limits: Vec<Limit>,
    namespace: Option<String>,
    shape: Option<OneKey>,
    key: String,
}

impl Scratch {
    /// The shape of `limits` in `namespace` and the key of `id` (escaped) under it, when the
    /// state of an identifier is one key.
    fn key(
        &mut self,
        id: &str,
        namespace: Option<&str>,
        limits: &[Limit],
    ) -> Option<(&OneKey, &str)> {
        if self.limits != limits || self.namespace.as_deref() != namespace {
            self.limits.clear();
            self.limits.extend_from_slice(limits);
            self.namespace = namespace.map(str::to_owned);
            self.shape = OneKey::of(namespace, limits);
        }
        let shape = self.shape.as_ref()?;
        self.key.clear();
        self.key.push_str(PREFIX);
        self.key.push_str(":{");
        self.key.push_str(id);
        self.key.push_str(&shape.suffix);
        Some((shape, &self.key))
    }
}

#[cfg(test)]
mod tests;

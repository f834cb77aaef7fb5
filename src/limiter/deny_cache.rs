//! A cache of identifiers the store denied, answered in process until the store said they
//! could be allowed again.
//!
//! When Redis denies an identifier by a rate limit, it says when the same cost would fit
//! "if nothing else happens". Whatever else happens — other requests, other processes — can
//! only use more of the quota, never give it back, so until then Redis would deny that
//! identifier every request of at least that cost. The cache answers those of that cost
//! without a round trip, which is what a flood from one client is made of.
//!
//! It never denies what the store would allow:
//! * the deadline is measured from just *before* the check was sent, so it falls no later
//!   than the store's own (which counts from when it read its clock);
//! * only the cost denied is answered: a smaller one may fit sooner, and a larger one fits
//!   later than the deadline known (answered from it, a waiting request would wait for a
//!   denial, and a client be told to come back too soon);
//! * concurrency limits are never cached: slots free up when requests finish, which nobody
//!   can predict;
//! * it is used only with the real clock (a manual clock can jump).
//!
//! What it gives up: quota given back where this process cannot see it. A reset of the
//! identifier made elsewhere (another process's `Limiter::reset`, or in Redis by hand), or a
//! charge given back — on a Redis Cluster, a check across slots that one slot denied gives
//! back what the others charged, and a check that met that charge in the meantime (a round
//! trip) may have been denied by it. So an entry is kept for at most [`MAX_AGE`] (a second),
//! whatever the retry time it reports: past that, the store is asked again. A flood costs the
//! store one check a second per identifier and process, and nothing given back goes unseen
//! for longer (the retry time of a `100/h` denial can be most of an hour). A reset or a policy
//! change through this limiter empties the entries concerned at once, and a denial the store
//! made before it but that arrives after it is not learnt (each check reads the cache's epoch
//! before it is sent, and a reset moves the epoch on: for every identifier, so that the
//! denials in flight at a reset are all left unlearnt, which costs a round trip each and
//! happens as rarely as resets do). Memory is bounded by a number of identifiers; at the
//! bound, expired entries are swept (at most every [`SWEEP_EVERY`]), and a new denial that
//! finds no room is not cached: the store answers its identifier's next check.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::decision::{Decision, LimitStatus, Origin};
use crate::policy::Limit;
use crate::store::Outcome;

/// The default bound on the identifiers the cache holds.
pub(crate) const DEFAULT_CAPACITY: usize = 10_000;

/// The longest an entry is kept, whatever the retry time it reports: how long quota given
/// back where this process cannot see it (a reset elsewhere, a refund of a check across
/// Cluster slots) may go unseen, and how often a flooding identifier reaches the store.
pub(crate) const MAX_AGE: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub(crate) struct DenyCache {
    entries: Mutex<Entries>,
    capacity: usize,
}

#[derive(Debug, Default)]
struct Entries {
    map: HashMap<String, Entry>,
    /// The version of the limiter's policy the entries were denied by.
    generation: u64,
    /// Moved on by every reset and policy change: a store's answer to a check sent before
    /// one is not learnt.
    epoch: u64,
    /// When the entries were last swept for room, at the bound.
    swept: Option<Instant>,
}

/// How often at most a full cache is swept for room: a sweep visits every entry under the
/// lock, and a flood of new identifiers denied at the bound would otherwise sweep once per
/// denial. A denial that comes between two sweeps is not cached, even if entries expired
/// meanwhile: its identifier's next check goes to the store, which answers it as exactly.
const SWEEP_EVERY: Duration = Duration::from_millis(100);

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Until when `cost` is denied (a larger one is too, until some later time).
    until: Instant,
    /// Until when the entry answers: `until`, or [`MAX_AGE`] after the check was sent.
    kept_until: Instant,
    cost: u64,
    /// When the limit's full quota is back (for headers).
    reset: Instant,
    limit_index: usize,
    limit: Limit,
    remaining: u64,
}

impl DenyCache {
    pub(crate) fn new(capacity: usize) -> DenyCache {
        DenyCache {
            entries: Mutex::default(),
            capacity,
        }
    }

    /// The cache's epoch, read by a check before it is sent (see [`record`](Self::record)).
    pub(crate) fn epoch(&self) -> u64 {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .epoch
    }

    /// A denied decision for a request of `cost` for `ids` (escaped, with the index of each in
    /// the caller's slice) checked on the version `generation` of the policy, if the cache
    /// knows one of them is denied now (under that version: entries of another tell nothing).
    pub(crate) fn lookup(
        &self,
        ids: &[String],
        firsts: &[usize],
        cost: u64,
        generation: u64,
    ) -> Option<Decision> {
        let now = Instant::now();
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.generation != generation {
            return None;
        }
        let entries = &mut entries.map;
        let mut statuses = crate::decision::status_buffer();
        for (k, id) in ids.iter().enumerate() {
            let Some(e) = entries.get(id).copied() else {
                continue;
            };
            if e.kept_until <= now {
                entries.remove(id);
                continue;
            }
            if cost == e.cost {
                statuses.push(LimitStatus {
                    identifier: firsts[k],
                    limit_index: e.limit_index,
                    limit: e.limit,
                    allowed: false,
                    remaining: e.remaining,
                    reset_after: e.reset.saturating_duration_since(now),
                    retry_after: Some(e.until - now),
                });
            }
        }
        if statuses.is_empty() {
            crate::decision::give_back(statuses);
            return None;
        }
        Some(Decision {
            allowed: false,
            shadow: false,
            cost,
            statuses,
            guard: None,
            origin: Origin::DenyCache,
        })
    }

    /// Remembers the rate limits that denied `ids` in `outcome`, for a check of `cost` sent at
    /// `sent` with the version `generation` of the policy, when the cache's epoch was `epoch`
    /// (ignored if either moved on since: the policy changed, or identifiers were reset,
    /// while the check ran).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record(
        &self,
        ids: &[String],
        limits: &[Limit],
        outcome: &Outcome,
        cost: u64,
        sent: Instant,
        generation: u64,
        epoch: u64,
    ) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.generation != generation || entries.epoch != epoch {
            return;
        }
        let Entries {
            map: entries,
            swept,
            ..
        } = &mut *entries;
        for (id, pairs) in ids.iter().zip(outcome.entries.chunks(limits.len())) {
            // The denying rate limit that holds this identifier back longest.
            let Some((limit_index, e)) = pairs
                .iter()
                .enumerate()
                .filter(|(l, e)| !e.allowed && !limits[*l].is_concurrency())
                .max_by_key(|(_, e)| e.retry_after_us)
            else {
                continue;
            };
            if !entries.contains_key(id) && entries.len() >= self.capacity {
                // at the bound: swept for room at most every SWEEP_EVERY; else not learnt
                let now = Instant::now();
                if swept.is_some_and(|at| now.saturating_duration_since(at) < SWEEP_EVERY) {
                    continue;
                }
                *swept = Some(now);
                entries.retain(|_, e| e.kept_until > now);
                if entries.len() >= self.capacity {
                    continue;
                }
            }
            let until = sent + Duration::from_micros(e.retry_after_us);
            entries.insert(
                id.clone(),
                Entry {
                    until,
                    kept_until: until.min(sent + MAX_AGE),
                    cost,
                    reset: sent + Duration::from_micros(e.reset_after_us),
                    limit_index,
                    limit: limits[limit_index],
                    remaining: e.remaining,
                },
            );
        }
    }

    /// Forgets every entry: the policy is now its version `generation`.
    pub(crate) fn reset(&self, generation: u64) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.map.clear();
        entries.generation = generation;
        entries.epoch += 1;
    }

    /// Forgets the entries of `ids` (escaped): their state in the store was reset. The
    /// answers of checks sent before are not learnt either (the epoch moves on).
    pub(crate) fn forget(&self, ids: &[String]) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        for id in ids {
            entries.map.remove(id);
        }
        entries.epoch += 1;
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().unwrap().map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Entry as Pair;

    fn denied(retry_us: u64) -> Pair {
        Pair {
            allowed: false,
            remaining: 0,
            reset_after_us: retry_us * 2,
            retry_after_us: retry_us,
        }
    }

    /// A denied check's outcome, with these entries.
    fn denial<const N: usize>(entries: [Pair; N]) -> Outcome {
        Outcome {
            allowed: false,
            wait_us: 0,
            entries: entries.into_iter().collect(),
            at_us: 0,
            unknown: 0,
            unsure: false,
        }
    }

    fn allowed() -> Pair {
        Pair {
            allowed: true,
            remaining: 3,
            reset_after_us: 10,
            retry_after_us: 0,
        }
    }

    #[test]
    fn answers_only_what_the_store_would_deny() {
        let cache = DenyCache::new(10);
        let limits = [
            "10/s".parse::<Limit>().unwrap(),
            "2 concurrent".parse::<Limit>().unwrap(),
        ];
        let ids = ["a".to_string(), "b".to_string()];
        // a: denied by the rate limit for 1 s; b: denied by the concurrency limit only.
        let outcome = denial([denied(1_000_000), allowed(), allowed(), denied(1_000_000)]);
        cache.record(&ids, &limits, &outcome, 2, Instant::now(), 0, 0);
        assert_eq!(cache.len(), 1);
        let d = cache
            .lookup(&ids[..1], &[0], 2, 0)
            .expect("a at cost 2 is denied");
        assert!(!d.is_allowed());
        assert_eq!(d.origin(), Origin::DenyCache);
        assert!(d.retry_after().unwrap() <= Duration::from_secs(1));
        assert!(
            cache.lookup(&ids[..1], &[0], 3, 0).is_none(),
            "a larger cost fits later than the deadline known: the store tells when"
        );
        assert!(
            cache.lookup(&ids[..1], &[0], 1, 0).is_none(),
            "a smaller cost may fit sooner"
        );
        assert!(
            cache.lookup(&ids[1..], &[0], 2, 0).is_none(),
            "concurrency is not cached"
        );
        // in a request with several identifiers, the cached one's index is reported
        let d = cache
            .lookup(&["x".to_string(), ids[0].clone()], &[0, 3], 2, 0)
            .unwrap();
        assert_eq!(d.denied_by().unwrap().identifier, 3);
    }

    #[test]
    fn entries_expire_and_stay_bounded() {
        let cache = DenyCache::new(2);
        let limits = ["10/s".parse::<Limit>().unwrap()];
        let outcome = denial([denied(1)]);
        for id in ["a", "b", "c"] {
            cache.record(
                &[id.to_string()],
                &limits,
                &outcome,
                1,
                Instant::now(),
                0,
                0,
            );
        }
        assert!(cache.len() <= 2);
        std::thread::sleep(Duration::from_millis(2));
        assert!(
            cache.lookup(&["a".to_string()], &[0], 1, 0).is_none(),
            "expired"
        );
        let long = denial([denied(10_000_000)]);
        cache.record(&["d".to_string()], &limits, &long, 1, Instant::now(), 0, 0);
        assert!(
            cache.lookup(&["d".to_string()], &[0], 1, 0).is_some(),
            "room was swept"
        );
    }

    /// A denial for most of an hour answers for a second, with its whole retry time, then
    /// goes back to the store, which may have been given quota back meanwhile.
    #[test]
    fn an_entry_answers_for_a_second_at_most() {
        let cache = DenyCache::new(10);
        let limits = ["100/h".parse::<Limit>().unwrap()];
        let hour = denial([denied(3_000_000_000)]);
        let now = Instant::now();
        let ids = ["fresh".to_string(), "older".to_string()];
        cache.record(&ids[..1], &limits, &hour, 1, now, 0, 0);
        let d = cache.lookup(&ids[..1], &[0], 1, 0).expect("cached");
        assert!(d.retry_after().unwrap() > Duration::from_secs(2_999));
        // sent just over a second ago: no longer answered
        let older = now.checked_sub(MAX_AGE + Duration::from_millis(1)).unwrap();
        cache.record(&ids[1..], &limits, &hour, 1, older, 0, 0);
        assert!(cache.lookup(&ids[1..], &[0], 1, 0).is_none());
        assert_eq!(cache.len(), 1, "and forgotten");
    }

    /// A full cache is swept for room at most every `SWEEP_EVERY`: a flood of new identifiers
    /// denied at the bound does not sweep every entry, under the lock, once per denial.
    #[test]
    fn a_full_cache_is_swept_at_most_so_often() {
        let cache = DenyCache::new(1);
        let limits = ["10/s".parse::<Limit>().unwrap()];
        let long = denial([denied(10_000_000)]);
        let record = |id: &str| {
            cache.record(&[id.to_string()], &limits, &long, 1, Instant::now(), 0, 0);
        };
        let swept = || cache.entries.lock().unwrap().swept;
        record("a");
        assert_eq!(swept(), None, "room enough");
        record("b");
        let first = swept().expect("swept for room");
        assert_eq!(cache.len(), 1, "a is live: b not learnt");
        record("c");
        assert_eq!(swept(), Some(first), "not swept again so soon");
        assert!(cache.lookup(&["a".to_string()], &[0], 1, 0).is_some());
        // past SWEEP_EVERY, a denial that finds no room sweeps again, and takes the place of
        // an entry that expired
        let earlier = first.checked_sub(SWEEP_EVERY).unwrap();
        cache.entries.lock().unwrap().swept = Some(earlier);
        let old = Instant::now().checked_sub(MAX_AGE * 2).unwrap();
        cache
            .entries
            .lock()
            .unwrap()
            .map
            .get_mut("a")
            .unwrap()
            .kept_until = old;
        record("d");
        assert!(swept().is_some_and(|at| at > first), "swept again");
        assert!(cache.lookup(&["d".to_string()], &[0], 1, 0).is_some());
    }

    #[test]
    fn a_policy_change_empties_it_and_keeps_no_older_denial() {
        let cache = DenyCache::new(10);
        let limits = ["10/s".parse::<Limit>().unwrap()];
        let outcome = denial([denied(10_000_000)]);
        let ids = ["a".to_string()];
        cache.record(&ids, &limits, &outcome, 1, Instant::now(), 0, 0);
        assert!(cache.lookup(&ids, &[0], 1, 0).is_some());
        cache.reset(1);
        assert!(cache.lookup(&ids, &[0], 1, 1).is_none(), "emptied");
        // a check that ran on the old policy finishes after the change
        cache.record(&ids, &limits, &outcome, 1, Instant::now(), 0, 0);
        assert!(cache.lookup(&ids, &[0], 1, 1).is_none(), "not kept");
        cache.record(&ids, &limits, &outcome, 1, Instant::now(), 1, 1);
        assert!(cache.lookup(&ids, &[0], 1, 1).is_some());
        // a check still on the old version is not answered by the new one's entries
        assert!(cache.lookup(&ids, &[0], 1, 0).is_none());
    }

    #[test]
    fn a_reset_keeps_no_denial_of_a_check_sent_before_it() {
        let cache = DenyCache::new(10);
        let limits = ["10/h fixed".parse::<Limit>().unwrap()];
        let outcome = denial([denied(3_600_000_000)]);
        let ids = ["x".to_string()];
        // two checks of x are sent; x is reset while they run; their denials come back
        let epoch = cache.epoch();
        cache.forget(&ids);
        cache.record(&ids, &limits, &outcome, 1, Instant::now(), 0, epoch);
        assert!(
            cache.lookup(&ids, &[0], 1, 0).is_none(),
            "made before the reset"
        );
        // a check sent after the reset is learnt from
        let epoch = cache.epoch();
        cache.record(&ids, &limits, &outcome, 1, Instant::now(), 0, epoch);
        assert!(cache.lookup(&ids, &[0], 1, 0).is_some());
    }
}

//! Sliding log (seeds 000, 001, 004): the times of admitted cost units. Twin of
//! `lua/sliding_log.lua`, function for function.
//!
//! The rolling window at `now` is the half-open interval `(now - w, now]`: an entry at exactly
//! `now - w` has left it. Where Redis keeps a sorted set (members `"<time>-<k>"`, so that two
//! units in the same microsecond are two entries), this keeps the times in ascending order.

use std::collections::VecDeque;

use super::{Entry, Report, Verdict};
use crate::policy::Limit;

/// The times (µs) of the admitted cost units, ascending.
#[derive(Debug, Clone, Default)]
pub(crate) struct Log {
    entries: VecDeque<u64>,
}

/// The entries still inside the rolling window at `now`. (The script asks Redis the same
/// question with `ZCOUNT key (now-w +inf`.)
fn live(st: &Log, now: u64, w: u64) -> std::collections::vec_deque::Iter<'_, u64> {
    let start = if now >= w {
        st.entries.partition_point(|&s| s <= now - w)
    } else {
        0
    };
    st.entries.range(start..)
}

pub(crate) fn evaluate(st: &Log, lim: &Limit, now: u64, cost: u64) -> Verdict {
    let (n, w) = (lim.count(), lim.window_us());
    let live = live(st, now, w);
    let used = live.len() as u64;
    if used + cost <= n {
        return Verdict::ADMIT;
    }
    // The (used + cost - n)-th oldest live entry must leave the window first.
    let k = (used + cost - n) as usize;
    let s_k = live.into_iter().nth(k - 1).copied().unwrap_or(now);
    Verdict::deny(s_k + w)
}

/// Charges `cost` units at `now`; entries that left the window by `real` (the clock's time:
/// `now` is later for a waiting check) are dropped.
pub(crate) fn commit(st: &mut Log, lim: &Limit, real: u64, now: u64, cost: u64) {
    let w = lim.window_us();
    // ZREMRANGEBYSCORE -inf (real - w)
    while st
        .entries
        .front()
        .is_some_and(|&s| real >= w && s <= real - w)
    {
        st.entries.pop_front();
    }
    // ZADD: entries at the same time go after the ones already there, and before those a
    // waiting check reserved later: appended, then, when there are such, rotated into place,
    // the reserved entries moved once (a cost of thousands inserted one unit at a time before
    // them took time in the square of it, under the shard's lock), with no allocation. With
    // none reserved (the usual charge), nothing moves: the ring is made contiguous only then.
    let at = st.entries.partition_point(|&s| s <= now);
    let reserved = st.entries.len() - at;
    let units = usize::try_from(cost).unwrap_or(usize::MAX);
    st.entries.extend(std::iter::repeat_n(now, units));
    if reserved > 0 {
        st.entries.make_contiguous()[at..].rotate_right(units);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Algorithm;
    use std::time::Duration;

    /// Units charged now go after the entries already at or before now and before those
    /// reserved later, in one move.
    #[test]
    fn a_charge_goes_between_the_past_and_the_reserved() {
        let lim = Limit::new(100, Duration::from_secs(1), Algorithm::SlidingLog).unwrap();
        let mut st = Log::default();
        commit(&mut st, &lim, 1_000, 1_000, 2);
        // a waiting check's reservation, half a second on
        commit(&mut st, &lim, 1_000, 501_000, 1);
        commit(&mut st, &lim, 2_000, 2_000, 3);
        assert_eq!(
            st.entries.iter().copied().collect::<Vec<_>>(),
            [1_000, 1_000, 2_000, 2_000, 2_000, 501_000]
        );
    }
}

pub(crate) fn report(st: &Log, lim: &Limit, now: u64) -> Report {
    let (n, w) = (lim.count(), lim.window_us());
    let live = live(st, now, w);
    let used = live.len() as u64;
    match live.last() {
        Some(&newest) => Report {
            remaining: n.saturating_sub(used),
            reset_after: (newest + w).saturating_sub(now),
        },
        None => Report::empty(lim),
    }
}

/// What the check script read of a log, as its reply carries it (see `lua/sliding_log.lua`):
/// the live entries (`None` when a cost of 1 was denied: then at least the count are), the
/// time of the entry that must leave the window before a denied cost fits, and the newest
/// entry's time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) struct Seen {
    pub(crate) used: Option<u64>,
    pub(crate) leaving: Option<u64>,
    pub(crate) newest: Option<u64>,
}

/// The figures of a log the script read as `seen` at `now`, after charging `cost` when
/// `charged`: the script's `report` and the rest of [`evaluate`] and [`report`], on what the
/// script read rather than on every entry (the script sends what it read, and the figures are
/// worked out here: formatting numbers costs Redis more than reading them costs the client).
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn settle(seen: Seen, lim: &Limit, now: u64, cost: u64, charged: bool) -> Entry {
    let (n, w) = (lim.count(), lim.window_us());
    let retry = seen.leaving.map_or(0, |s| s + w);
    let mut used = seen.used.unwrap_or(n);
    let mut newest = seen.newest.unwrap_or(0);
    if charged {
        used += cost;
        newest = newest.max(now);
    }
    let (remaining, reset_after_us) = match used {
        0 => (n, 0),
        _ => (n.saturating_sub(used), (newest + w).saturating_sub(now)),
    };
    Entry {
        allowed: retry == 0,
        remaining,
        reset_after_us,
        retry_after_us: retry.saturating_sub(now),
    }
}

/// When the state stops mattering: the newest entry leaves the window. (The script computes
/// the same instant in `commit` for the key's TTL.)
pub(crate) fn expires_at(st: &Log, lim: &Limit) -> u64 {
    st.entries
        .back()
        .map_or(0, |&newest| newest + lim.window_us())
}

/// Gives back `cost` charged at `at`: the twin of the `refund` fragment, which removes up to
/// `cost` entries scored `at` (entries of one time are interchangeable; Redis removes the
/// newest-numbered members, so that the `<time>-<k>` names stay `1..=count`). Entries that
/// have left the log are not given back twice.
pub(crate) fn refund(st: &mut Log, at: u64, cost: u64) {
    let end = st.entries.partition_point(|&s| s <= at);
    let start = st.entries.partition_point(|&s| s < at);
    let n = (end - start).min(usize::try_from(cost).unwrap_or(usize::MAX));
    st.entries.drain(end - n..end);
}

//! Sliding log (seeds 000, 001, 004): the times of admitted cost units. Twin of
//! `lua/sliding_log.lua`, function for function.
//!
//! The rolling window at `now` is the half-open interval `(now - w, now]`: an entry at exactly
//! `now - w` has left it. Where Redis keeps a sorted set (members `"<time>-<k>"`, so that two
//! units in the same microsecond are two entries), this keeps the times in ascending order.

use std::collections::VecDeque;

use super::{Report, Verdict};
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
    // ZADD: entries at the same time go after the ones already there
    let at = st.entries.partition_point(|&s| s <= now);
    for _ in 0..cost {
        st.entries.insert(at, now);
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

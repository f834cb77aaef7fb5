//! Sliding-window counter (seed 004; the two-counter variant): counts per window aligned to
//! the Unix epoch, and an estimate of the rolling window `prev * (w - e) / w + curr`, where
//! `e` is how far `now` is into the current window. Twin of `lua/sliding_window.lua`,
//! function for function: `FIELDS` and `load` are its `fields`, `evaluate` and `commit` its
//! fragments of the same names, `expires_at` its `expires`; `report`, and the retry time in
//! `evaluate`, are derived here from the state the script returns.
//!
//! The estimate is a double computed in exactly the order the script computes it, so both
//! stores agree bit for bit; offsets derived from it by division are corrected with the
//! admission test itself, so they never disagree with it.

use super::{Report, Verdict};
use crate::policy::Limit;

/// The index of the window last charged, its count and the previous window's count.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Window {
    idx: u64,
    curr: u64,
    prev: u64,
}

/// The fields the script packs: the current and the previous window's counts. The window's
/// index is not stored: it is the packed key's time of the last charge divided by `w` (every
/// limit of the key is charged at that time, and each keeps the later of its index and now's).
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) const FIELDS: &[&str] = &["c", "p"];

/// The state from the packed fields and the time `at` of the key's last charge.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn load(lim: &Limit, at: u64, fields: &[u64]) -> Window {
    Window {
        idx: at / lim.window_us(),
        curr: fields.first().copied().unwrap_or(0),
        prev: fields.get(1).copied().unwrap_or(0),
    }
}

/// The (current, previous) counts of the state seen from window `i`.
fn window_counts(st: &Window, i: u64) -> (u64, u64) {
    if st.idx >= i {
        (st.curr, st.prev)
    } else if st.idx + 1 == i {
        (0, st.curr)
    } else {
        (0, 0)
    }
}

/// `prev * (w - e) / w + (curr + cost) <= n`, in doubles, in exactly the script's order.
fn window_admits(n: u64, w: u64, prev: u64, curr: u64, e: u64, cost: u64) -> bool {
    (prev as f64) * ((w - e) as f64) / (w as f64) + ((curr + cost) as f64) <= n as f64
}

/// The smallest offset in `[lo, hi]` that `admits` (a monotone test), from the estimate `x`.
/// `hi` always admits (it is the start of a later window).
fn first_admitting(x: f64, lo: u64, hi: u64, admits: impl Fn(u64) -> bool) -> u64 {
    let mut o = (x.ceil().max(lo as f64) as u64).min(hi);
    while o > lo && admits(o - 1) {
        o -= 1;
    }
    while o < hi && !admits(o) {
        o += 1;
    }
    o
}

pub(crate) fn evaluate(st: &Window, lim: &Limit, now: u64, cost: u64) -> Verdict {
    let (n, w) = (lim.count(), lim.window_us());
    let (i, e) = (now / w, now % w);
    if st.idx > i {
        // charged as of a later window (a waiting check): full until that window begins,
        // then as its counts say
        let begins = st.idx * w;
        let then = evaluate(st, lim, begins, cost);
        return Verdict::deny(if then.allowed { begins } else { then.retry_at });
    }
    let (curr, prev) = window_counts(st, i);
    if window_admits(n, w, prev, curr, e, cost) {
        return Verdict::ADMIT;
    }
    if curr + cost <= n {
        // Within this window, as the previous window's weight decays (prev > 0 here).
        let x = (w as f64) - ((n - curr - cost) as f64) * (w as f64) / (prev as f64);
        let o = first_admitting(x, e + 1, w, |o| window_admits(n, w, prev, curr, o, cost));
        return Verdict::deny(i * w + o);
    }
    // In the next window, where this window's count becomes the previous one.
    let x = (w as f64) - ((n - cost) as f64) * (w as f64) / (curr as f64);
    let o = first_admitting(x, 0, w, |o| window_admits(n, w, curr, 0, o, cost));
    Verdict::deny((i + 1) * w + o)
}

pub(crate) fn commit(st: &mut Window, lim: &Limit, now: u64, cost: u64) {
    let i = now / lim.window_us();
    let (curr, prev) = window_counts(st, i);
    st.idx = st.idx.max(i);
    st.curr = curr + cost;
    st.prev = prev;
}

pub(crate) fn report(st: &Window, lim: &Limit, now: u64) -> Report {
    let (n, w) = (lim.count(), lim.window_us());
    let (i, e) = (now / w, now % w);
    if st.idx > i {
        // charged as of a later window (a waiting check, or a clock gone back): full until
        // that window begins (as `evaluate` has it), whole again once its counts age out
        let reset_at = expires_at(st, lim).max(st.idx * w);
        return Report {
            remaining: 0,
            reset_after: reset_at - now,
        };
    }
    let (curr, prev) = window_counts(st, i);
    let reset_after = if curr > 0 {
        (i + 2) * w - now
    } else if prev > 0 {
        (i + 1) * w - now
    } else {
        0
    };
    // The largest cost admitted now: the approximate division, then corrected with the
    // admission test itself.
    let estimate = (prev as f64) * ((w - e) as f64) / (w as f64) + (curr as f64);
    let mut k = ((n as f64) - estimate).floor().clamp(0.0, n as f64) as u64;
    while k > 0 && !window_admits(n, w, prev, curr, e, k) {
        k -= 1;
    }
    while k < n && window_admits(n, w, prev, curr, e, k + 1) {
        k += 1;
    }
    Report {
        remaining: k,
        reset_after,
    }
}

/// When the state stops mattering: the current window's count has aged out of the next
/// window's estimate. (The script's TTL in `commit`.)
pub(crate) fn expires_at(st: &Window, lim: &Limit) -> u64 {
    let w = lim.window_us();
    if st.curr > 0 {
        (st.idx + 2) * w
    } else if st.prev > 0 {
        (st.idx + 1) * w
    } else {
        0
    }
}

/// Gives back `cost` charged at `at`: the twin of the `refund` fragment. The charge counts in
/// the window `at` falls in: the state's current window while no later one was charged, its
/// previous window once the next one was; its count goes down by the cost (never below zero).
/// A window older than that no longer weighs on any estimate: nothing to give back.
///
/// Should the clock go back across a window boundary, the charge may sit in the current
/// window while the refund takes it from the previous one: that window weighs less in the
/// estimate, so the refund then gives back less than the charge added, never more.
pub(crate) fn refund(st: &mut Window, lim: &Limit, at: u64, cost: u64) {
    let i = at / lim.window_us();
    if st.idx == i {
        st.curr = st.curr.saturating_sub(cost);
    } else if st.idx == i + 1 {
        st.prev = st.prev.saturating_sub(cost);
    }
}

/// The (current, previous) counts seen from window `i`.
#[cfg(test)]
pub(super) fn counts_for_tests(st: &Window, i: u64) -> (u64, u64) {
    window_counts(st, i)
}

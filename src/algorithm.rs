//! The algorithms on in-process state, for the memory store.
//!
//! Every function here has a twin in `lua/`: the same integer arithmetic on microseconds, the
//! same floating-point expressions in the same order (where one is used), so that the memory
//! store and the Redis store reach the same decision for the same sequence of
//! `(time, identifiers, cost)`. The conformance and property tests hold the two to that.
//!
//! Each algorithm has three steps, mirroring the two-phase script:
//! * `evaluate` reads the state and says whether `cost` fits, and if not, when it will;
//! * `commit` charges `cost` (only called once every limit of every identifier admitted);
//! * `report` reads the remaining quota and the time until the state is back to empty.

use std::collections::VecDeque;

use crate::policy::{Algorithm, Limit};

/// The stored state of one (identifier, limit) pair.
#[derive(Debug, Clone)]
pub(crate) enum State {
    /// Sliding log: the times of admitted cost units, ascending.
    Log(VecDeque<u64>),
    /// Sliding-window counter: the index of the current window, its count and the previous
    /// window's count.
    Window { idx: u64, curr: u64, prev: u64 },
    /// Fixed window: the index of the window and its count.
    Fixed { idx: u64, count: u64 },
    /// GCRA: the theoretical arrival time, `tat + rem / count` microseconds.
    Gcra { tat: u64, rem: u64 },
    /// Concurrency: the leases held, by id, with their deadlines (µs). A lease is live while
    /// its deadline is after now.
    Leases(Vec<(String, u64)>),
}

/// How long a denied concurrency check suggests waiting: slots free up when requests finish,
/// which no one can predict, so this is a hint, capped by the earliest lease deadline.
pub(crate) const CONCURRENCY_RETRY_US: u64 = 1_000_000;

/// The outcome of `evaluate` for one pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub(crate) admitted: bool,
    /// When denied: the earliest time (µs) at which the same cost fits, if nothing else happens.
    pub(crate) retry_at: u64,
}

/// What `report` reads off a state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Report {
    pub(crate) remaining: u64,
    /// Microseconds until the full quota is available again.
    pub(crate) reset_after: u64,
}

pub(crate) fn new_state(limit: &Limit) -> State {
    match limit.algorithm() {
        Algorithm::SlidingLog => State::Log(VecDeque::new()),
        Algorithm::SlidingWindow => State::Window {
            idx: 0,
            curr: 0,
            prev: 0,
        },
        Algorithm::FixedWindow => State::Fixed { idx: 0, count: 0 },
        Algorithm::Concurrency => State::Leases(Vec::new()),
        _ => State::Gcra { tat: 0, rem: 0 },
    }
}

/// Whether `state` (absent: never used) admits `cost` at `now`.
pub(crate) fn evaluate(state: Option<&State>, limit: &Limit, now: u64, cost: u64) -> Verdict {
    let fresh;
    let state = match state {
        Some(s) => s,
        None => {
            fresh = new_state(limit);
            &fresh
        }
    };
    let n = limit.count();
    let w = limit.window_us();
    match state {
        State::Log(entries) => {
            let live = live_entries(entries, now, w);
            let used = live.len() as u64;
            if used + cost <= n {
                return admit();
            }
            // The (used + cost - n)-th oldest live entry must leave the window.
            let k = (used + cost - n) as usize;
            let s_k = live.into_iter().nth(k - 1).copied().unwrap_or(now);
            deny(s_k + w)
        }
        State::Window { idx, curr, prev } => {
            let (i, e) = (now / w, now % w);
            let (curr, prev) = window_counts(*idx, *curr, *prev, i);
            if window_admits(n, w, prev, curr, e, cost) {
                admit()
            } else {
                deny(window_retry_at(n, w, prev, curr, i, e, cost))
            }
        }
        State::Fixed { idx, count } => {
            let i = now / w;
            let count = if *idx >= i { *count } else { 0 };
            if count + cost <= n {
                admit()
            } else {
                deny((i.max(*idx) + 1) * w)
            }
        }
        State::Leases(leases) => {
            let live = leases.iter().filter(|(_, d)| *d > now);
            if (live.clone().count() as u64) < n {
                admit()
            } else {
                let first = live.map(|(_, d)| *d).min().unwrap_or(now);
                deny(first.min(now + CONCURRENCY_RETRY_US))
            }
        }
        State::Gcra { tat, rem } => {
            let g = Gcra::new(limit);
            let m = g.max((*tat, *rem), (now, 0));
            let next = g.add(m, g.times(cost));
            let tau = g.times(g.burst);
            if g.le(g.sub(next, (now, 0)), tau) {
                admit()
            } else {
                // Admitted once tat + cost·T − tau ≤ t.
                let x = g.sub(next, tau);
                deny(x.0 + u64::from(x.1 > 0))
            }
        }
    }
}

/// Charges `cost` at `now` (for a concurrency limit: takes the slot `lease`). Call only after
/// `evaluate` admitted it.
pub(crate) fn commit(state: &mut State, limit: &Limit, now: u64, cost: u64, lease: &str) {
    let w = limit.window_us();
    match state {
        State::Leases(leases) => {
            leases.retain(|(_, d)| *d > now);
            leases.push((lease.to_string(), now + w));
        }
        State::Log(entries) => {
            let cut = now.saturating_sub(w);
            while entries.front().is_some_and(|&s| now >= w && s <= cut) {
                entries.pop_front();
            }
            let at = entries.partition_point(|&s| s <= now);
            for _ in 0..cost {
                entries.insert(at, now);
            }
        }
        State::Window { idx, curr, prev } => {
            let i = now / w;
            let (c, p) = window_counts(*idx, *curr, *prev, i);
            *idx = (*idx).max(i);
            *curr = c + cost;
            *prev = p;
        }
        State::Fixed { idx, count } => {
            let i = now / w;
            if *idx < i {
                *idx = i;
                *count = 0;
            }
            *count += cost;
        }
        State::Gcra { tat, rem } => {
            let g = Gcra::new(limit);
            let m = g.max((*tat, *rem), (now, 0));
            (*tat, *rem) = g.add(m, g.times(cost));
        }
    }
}

/// The remaining quota and the time until the state is empty again.
pub(crate) fn report(state: Option<&State>, limit: &Limit, now: u64) -> Report {
    let n = limit.count();
    let w = limit.window_us();
    let empty = Report {
        remaining: if limit.is_concurrency() {
            n
        } else {
            limit.max_cost()
        },
        reset_after: 0,
    };
    let Some(state) = state else { return empty };
    match state {
        State::Log(entries) => {
            let live = live_entries(entries, now, w);
            let used = live.len() as u64;
            match live.last() {
                Some(&newest) => Report {
                    remaining: n.saturating_sub(used),
                    reset_after: (newest + w).saturating_sub(now),
                },
                None => empty,
            }
        }
        State::Window { idx, curr, prev } => {
            let (i, e) = (now / w, now % w);
            let (curr, prev) = window_counts(*idx, *curr, *prev, i);
            let reset_after = if curr > 0 {
                (i + 2) * w - now
            } else if prev > 0 {
                (i + 1) * w - now
            } else {
                0
            };
            Report {
                remaining: window_remaining(n, w, prev, curr, e),
                reset_after,
            }
        }
        State::Fixed { idx, count } => {
            let i = now / w;
            if *idx < i || *count == 0 {
                return empty;
            }
            Report {
                remaining: n.saturating_sub(*count),
                reset_after: (*idx + 1) * w - now,
            }
        }
        State::Leases(leases) => {
            let live = leases.iter().filter(|(_, d)| *d > now).count() as u64;
            Report {
                remaining: n.saturating_sub(live),
                reset_after: 0,
            }
        }
        State::Gcra { tat, rem } => {
            let g = Gcra::new(limit);
            let m = g.max((*tat, *rem), (now, 0));
            let tau = g.times(g.burst);
            let end = g.add((now, 0), tau);
            let remaining = if g.le(m, end) {
                let slack = g.sub(end, m);
                // floor(slack / T), exactly: both in units of 1/count µs.
                let slack = u128::from(slack.0) * u128::from(n) + u128::from(slack.1);
                (slack / u128::from(w)) as u64
            } else {
                0
            };
            Report {
                remaining,
                reset_after: (m.0 + u64::from(m.1 > 0)) - now,
            }
        }
    }
}

/// The time (µs) from which `state` no longer matters: it decides like a fresh one.
pub(crate) fn expires_at(state: &State, limit: &Limit) -> u64 {
    let w = limit.window_us();
    match state {
        State::Log(entries) => entries.back().map_or(0, |&newest| newest + w),
        State::Window { idx, curr, prev } => {
            if *curr > 0 {
                (idx + 2) * w
            } else if *prev > 0 {
                (idx + 1) * w
            } else {
                0
            }
        }
        State::Fixed { idx, .. } => (idx + 1) * w,
        State::Gcra { tat, rem } => tat + u64::from(*rem > 0),
        State::Leases(leases) => leases.iter().map(|(_, d)| *d).max().unwrap_or(0),
    }
}

/// Extends the lease `id` to `now + lease_us`, if it is still held and live.
pub(crate) fn renew(state: &mut State, id: &str, now: u64, lease_us: u64) {
    if let State::Leases(leases) = state {
        for (lease, deadline) in leases.iter_mut() {
            if lease == id && *deadline > now {
                *deadline = now + lease_us;
            }
        }
    }
}

/// Gives the slot `id` back (idempotent).
pub(crate) fn release(state: &mut State, id: &str) {
    if let State::Leases(leases) = state {
        leases.retain(|(lease, _)| lease != id);
    }
}

fn admit() -> Verdict {
    Verdict {
        admitted: true,
        retry_at: 0,
    }
}

fn deny(retry_at: u64) -> Verdict {
    Verdict {
        admitted: false,
        retry_at,
    }
}

/// The entries still inside the rolling window `(now - w, +inf)`.
fn live_entries(
    entries: &VecDeque<u64>,
    now: u64,
    w: u64,
) -> std::collections::vec_deque::Iter<'_, u64> {
    let start = if now >= w {
        entries.partition_point(|&s| s <= now - w)
    } else {
        0
    };
    entries.range(start..)
}

/// The (current, previous) counts of a sliding-window state seen from window `i`.
fn window_counts(idx: u64, curr: u64, prev: u64, i: u64) -> (u64, u64) {
    if idx >= i {
        (curr, prev)
    } else if idx + 1 == i {
        (0, curr)
    } else {
        (0, 0)
    }
}

/// The sliding-window estimate admits `cost` at offset `e` into the current window.
///
/// `prev * (w - e) / w + (curr + cost) <= n`, in doubles, evaluated in exactly this order here
/// and in `lua/sliding_window.lua`: IEEE arithmetic then gives both the same answer.
fn window_admits(n: u64, w: u64, prev: u64, curr: u64, e: u64, cost: u64) -> bool {
    (prev as f64) * ((w - e) as f64) / (w as f64) + ((curr + cost) as f64) <= n as f64
}

/// The largest cost the sliding window admits now (the approximate division, then corrected
/// with the admission test itself so that the two never disagree).
fn window_remaining(n: u64, w: u64, prev: u64, curr: u64, e: u64) -> u64 {
    let estimate = (prev as f64) * ((w - e) as f64) / (w as f64) + (curr as f64);
    let mut k = ((n as f64) - estimate).floor().clamp(0.0, n as f64) as u64;
    while k > 0 && !window_admits(n, w, prev, curr, e, k) {
        k -= 1;
    }
    while k < n && window_admits(n, w, prev, curr, e, k + 1) {
        k += 1;
    }
    k
}

/// The earliest time at which the sliding window admits `cost`, given that it denies it now.
fn window_retry_at(n: u64, w: u64, prev: u64, curr: u64, i: u64, e: u64, cost: u64) -> u64 {
    if curr + cost <= n {
        // Within this window, as the previous window's weight decays: prev > 0 here.
        let x = (w as f64) - ((n - curr - cost) as f64) * (w as f64) / (prev as f64);
        let at = first_admitting(x, e + 1, w, |o| window_admits(n, w, prev, curr, o, cost));
        i * w + at
    } else {
        // In the next window, where this window's count becomes the previous one.
        let x = (w as f64) - ((n - cost) as f64) * (w as f64) / (curr as f64);
        let at = first_admitting(x, 0, w, |o| window_admits(n, w, curr, 0, o, cost));
        (i + 1) * w + at
    }
}

/// The smallest offset in `[lo, hi]` that `admits` (monotone), starting from the estimate `x`.
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

/// Exact GCRA arithmetic on times `(µs, rem)` meaning `µs + rem / count`, `0 <= rem < count`.
struct Gcra {
    n: u64,
    q: u64,
    r: u64,
    burst: u64,
}

type Rational = (u64, u64);

impl Gcra {
    fn new(limit: &Limit) -> Gcra {
        let (n, w) = (limit.count(), limit.window_us());
        Gcra {
            n,
            q: w / n,
            r: w % n,
            burst: limit.max_cost(),
        }
    }

    /// `k` emission intervals, `k · window / count`.
    fn times(&self, k: u64) -> Rational {
        let kr = k * self.r;
        (k * self.q + kr / self.n, kr % self.n)
    }

    fn add(&self, a: Rational, b: Rational) -> Rational {
        let rem = a.1 + b.1;
        (a.0 + b.0 + rem / self.n, rem % self.n)
    }

    /// `a - b`, for `a >= b`.
    fn sub(&self, a: Rational, b: Rational) -> Rational {
        if a.1 >= b.1 {
            (a.0 - b.0, a.1 - b.1)
        } else {
            (a.0 - b.0 - 1, a.1 + self.n - b.1)
        }
    }

    fn le(&self, a: Rational, b: Rational) -> bool {
        a <= b
    }

    fn max(&self, a: Rational, b: Rational) -> Rational {
        a.max(b)
    }
}

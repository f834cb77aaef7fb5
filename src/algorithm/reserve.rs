//! A check that may wait: admitted at the earliest time every pair admits, when that lies
//! within the caller's longest wait, and charged as of that time. The twin of the passes of
//! `lua/check.lua` (`pass_open` … `pass_close`).
//!
//! Every algorithm here is monotone: a state that admits a cost at `t` admits it at any later
//! time without new charges. So once every pair has said when it would admit (its retry
//! time), every pair admits at the latest of those times, `t*`. The check is then evaluated
//! and charged as of `t*`, and the caller waits until then: each waiting caller holds its own
//! slot, in arrival order, and none re-checks.
//!
//! Charging as of a later time leaves states that run ahead of the clock: a sliding log holds
//! entries in the future (they count against every window until they leave it, so nobody is
//! admitted past them), a window counter a window that has not begun and a rolling window a
//! sub-window that has not begun (full until it begins: `evaluate` denies until then), a
//! GCRA a later arrival time (as any charge
//! does). Its retry time is when it admits, seen from that window: exact, as every other.
//! Two passes therefore decide (at now, then at the latest retry time); a third is a
//! safeguard, and past it, or past the longest wait, the check is denied.

use super::{decide_at_into, evaluate_all, Layout, Limit, Sink, State, Summary};

/// How many times a check is evaluated at most.
const PASSES: usize = 3;

/// [`decide`](super::decide), waiting up to `max_wait_us` for the time every pair admits;
/// its entries given to `sink`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn decide_within_into(
    states: &mut [Option<State>],
    layout: &Layout,
    limits: &[Limit],
    now: u64,
    cost: u64,
    lease: &str,
    max_wait_us: u64,
    sink: &mut impl Sink,
) -> Summary {
    let at = admission_time(states, layout, limits, now, cost, max_wait_us);
    decide_at_into(states, layout, limits, now, at, cost, lease, sink)
}

/// The time the check is decided at: `now`, or the time every pair admits when the passes
/// find it within `max_wait_us`.
pub(crate) fn admission_time(
    states: &mut [Option<State>],
    layout: &Layout,
    limits: &[Limit],
    now: u64,
    cost: u64,
    max_wait_us: u64,
) -> u64 {
    let mut at = now;
    if max_wait_us == 0 {
        return at;
    }
    // the last pass is the decision itself
    for _ in 1..PASSES {
        let verdicts = evaluate_all(states, layout, limits, at, cost);
        if verdicts.iter().all(|v| v.allowed) {
            return at;
        }
        let latest = verdicts
            .iter()
            .filter(|v| !v.allowed)
            .map(|v| v.retry_at)
            .max()
            .unwrap_or(at);
        if latest - now > max_wait_us {
            return at;
        }
        at = latest;
    }
    at
}

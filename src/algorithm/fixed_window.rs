//! Fixed window (seed 003): one counter per window aligned to the Unix epoch. Twin of
//! `lua/fixed_window.lua`, function for function: `FIELDS` and `load` are its `fields`,
//! `evaluate` and `commit` its fragments of the same names, `expires_at` its `expires`;
//! `report`, and the retry time in `evaluate`, are derived here from the state the script
//! returns.

use super::{Report, Verdict};
use crate::policy::Limit;

/// The index of the window last charged and its count.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Fixed {
    idx: u64,
    count: u64,
}

/// The field the script packs: the count. The window's index is the packed key's time of the
/// last charge divided by `w`, as for the sliding window.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) const FIELDS: &[&str] = &["c"];

/// The state from the packed fields and the time `at` of the key's last charge.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn load(lim: &Limit, at: u64, fields: &[u64]) -> Fixed {
    Fixed {
        idx: at / lim.window_us(),
        count: fields.first().copied().unwrap_or(0),
    }
}

pub(crate) fn evaluate(st: &Fixed, lim: &Limit, now: u64, cost: u64) -> Verdict {
    let w = lim.window_us();
    let i = now / w;
    if st.idx > i {
        // charged as of a later window (a waiting check): full until that window begins,
        // then as its count says
        let full = st.count + cost > lim.count();
        return Verdict::deny((st.idx + u64::from(full)) * w);
    }
    let count = if st.idx == i { st.count } else { 0 };
    if count + cost <= lim.count() {
        Verdict::ADMIT
    } else {
        Verdict::deny((i.max(st.idx) + 1) * w)
    }
}

pub(crate) fn commit(st: &mut Fixed, lim: &Limit, now: u64, cost: u64) {
    let i = now / lim.window_us();
    if st.idx < i {
        st.idx = i;
        st.count = 0;
    }
    st.count += cost;
}

pub(crate) fn report(st: &Fixed, lim: &Limit, now: u64) -> Report {
    let w = lim.window_us();
    let i = now / w;
    if st.idx > i {
        // charged as of a later window (a waiting check, or a clock gone back): nothing is
        // admitted until that window begins, as `evaluate` has it, and the quota is whole
        // then, or once that window ends if it holds a count
        let whole = st.idx + u64::from(st.count > 0);
        return Report {
            remaining: 0,
            reset_after: whole * w - now,
        };
    }
    if st.idx < i || st.count == 0 {
        return Report::empty(lim);
    }
    Report {
        remaining: lim.count().saturating_sub(st.count),
        reset_after: (st.idx + 1) * w - now,
    }
}

/// When the state stops mattering: its window ends. (The script's TTL in `commit`.)
pub(crate) fn expires_at(st: &Fixed, lim: &Limit) -> u64 {
    (st.idx + 1) * lim.window_us()
}

/// Gives back `cost` charged at `at`: the twin of the `refund` fragment. The charge counts in
/// the window `at` falls in; while the state is still that window's, its count goes down by
/// the cost (never below zero). Once a later window was charged, the charge no longer counts
/// and there is nothing to give back.
pub(crate) fn refund(st: &mut Fixed, lim: &Limit, at: u64, cost: u64) {
    if st.idx == at / lim.window_us() {
        st.count = st.count.saturating_sub(cost);
    }
}

/// The count seen from window `i`, and the state's window.
#[cfg(test)]
pub(super) fn counts_for_tests(st: &Fixed, i: u64) -> (u64, u64) {
    (if st.idx >= i { st.count } else { 0 }, st.idx.max(i))
}

//! Fixed window (seed 003): one counter per window aligned to the Unix epoch. Twin of
//! `lua/fixed_window.lua`, function for function.

use super::{Report, Verdict};
use crate::policy::Limit;

/// The index of the window last charged and its count (the script's hash fields `i`, `c`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Fixed {
    idx: u64,
    count: u64,
}

pub(crate) fn evaluate(st: &Fixed, lim: &Limit, now: u64, cost: u64) -> Verdict {
    let w = lim.window_us();
    let i = now / w;
    let count = if st.idx >= i { st.count } else { 0 };
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

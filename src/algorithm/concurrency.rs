//! Concurrency slots (seed 002's concurrent-requests limiter, as leases): lease ids with
//! their deadlines. Twin of `lua/concurrency.lua`, function for function; `renew` is the twin
//! of `lua/renew.lua`, and `release` of the plain `ZREM` the Redis store sends.
//!
//! A lease is live while its deadline is after now; expired ones (a process died holding
//! them) are dropped when a slot is taken. The lease id comes from the caller (random), so the
//! caller can renew and release it.

use super::{Entry, Report, Verdict};
use crate::policy::Limit;

/// How long a denied check suggests waiting: slots free up when requests finish, which no
/// one can predict, so this is a hint, capped by the earliest lease deadline.
pub(crate) const RETRY_US: u64 = 1_000_000;

/// The leases held, by id, with their deadlines (µs).
#[derive(Debug, Clone, Default)]
pub(crate) struct Leases {
    held: Vec<(String, u64)>,
}

pub(crate) fn evaluate(st: &Leases, lim: &Limit, now: u64, _cost: u64) -> Verdict {
    let live = || st.held.iter().map(|(_, d)| *d).filter(|d| *d > now);
    if (live().count() as u64) < lim.count() {
        return Verdict::ADMIT;
    }
    let first = live().min().unwrap_or(now);
    Verdict::deny(first.min(now + RETRY_US))
}

pub(crate) fn commit(st: &mut Leases, lim: &Limit, now: u64, lease: &str) {
    st.held.retain(|(_, d)| *d > now);
    st.held.push((lease.to_string(), now + lim.window_us()));
}

pub(crate) fn report(st: &Leases, lim: &Limit, now: u64) -> Report {
    let live = st.held.iter().filter(|(_, d)| *d > now).count() as u64;
    Report {
        remaining: lim.count().saturating_sub(live),
        reset_after: 0,
    }
}

/// The figures of a concurrency limit the script read at `now` (its reply's record: see
/// `lua/concurrency.lua`): `used` the live leases (`None` when denied: then at least the
/// count are), `first` the earliest live deadline when denied; after taking a slot when
/// `charged`. The script's `report` with the rest of [`evaluate`] and [`report`], worked out
/// on what the script read.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn settle(
    used: Option<u64>,
    first: Option<u64>,
    lim: &Limit,
    now: u64,
    charged: bool,
) -> Entry {
    let used = used.unwrap_or(lim.count()) + u64::from(charged);
    Entry {
        allowed: first.is_none(),
        remaining: lim.count().saturating_sub(used),
        reset_after_us: 0,
        retry_after_us: first.map_or(0, |f| f.min(now + RETRY_US).saturating_sub(now)),
    }
}

/// When the state stops mattering: the last deadline. (The script's TTL in `commit`.)
pub(crate) fn expires_at(st: &Leases) -> u64 {
    st.held.iter().map(|(_, d)| *d).max().unwrap_or(0)
}

/// Extends the lease `id` to `now + lease_us`, if it is still held and live; returns whether
/// it was. An expired lease may already count as free, so it is not brought back.
pub(crate) fn renew(st: &mut Leases, id: &str, now: u64, lease_us: u64) -> bool {
    let mut renewed = false;
    for (lease, deadline) in &mut st.held {
        if lease == id && *deadline > now {
            *deadline = now + lease_us;
            renewed = true;
        }
    }
    renewed
}

/// Gives the slot `id` back (idempotent).
pub(crate) fn release(st: &mut Leases, id: &str) {
    st.held.retain(|(lease, _)| lease != id);
}

/// Gives back the slot a check took: the twin of the `refund` fragment (the lease `id` is
/// removed, as [`release`] does).
pub(crate) fn refund(st: &mut Leases, id: &str) {
    release(st, id);
}

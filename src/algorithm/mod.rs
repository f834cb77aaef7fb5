//! The algorithms on in-process state: the twin of `lua/`, file for file.
//!
//! | Lua (Redis store)          | Rust (memory store)                 |
//! |----------------------------|-------------------------------------|
//! | `lua/check.lua`            | [`decide`], here                    |
//! | `lua/sliding_log.lua`      | `sliding_log.rs`                    |
//! | `lua/sliding_window.lua`   | `sliding_window.rs`                 |
//! | `lua/fixed_window.lua`     | `fixed_window.rs`                   |
//! | `lua/gcra.lua`             | `gcra.rs`                           |
//! | `lua/concurrency.lua`      | `concurrency.rs`                    |
//! | `lua/renew.lua`            | `concurrency::renew`                |
//! | `lua/prelude.lua`          | none: Lua-only helpers (number formatting, floor division, the clock, TTLs) |
//!
//! Each algorithm file has the functions of its Lua table, in the same order and under the
//! same names: `evaluate` (does `cost` fit, and if not, when will it), `commit` (charge it),
//! `report` (remaining quota, time until the state is empty). Lua's `load` reads the state
//! from Redis, which the memory store holds already; Rust's `expires_at` is the instant the
//! script turns into the key's TTL inside `commit`. The arithmetic is the same: integer
//! microseconds, and where a double is used, the same expression in the same order, so that
//! both stores reach the same decision for the same `(time, identifiers, cost)` sequence. The
//! conformance, model and differential tests hold the two to that.

use crate::policy::{Algorithm, Limit};

mod concurrency;
mod fixed_window;
mod gcra;
mod sliding_log;
mod sliding_window;

/// The state of one (identifier, limit) pair.
#[derive(Debug, Clone)]
pub(crate) enum State {
    Log(sliding_log::Log),
    Window(sliding_window::Window),
    Fixed(fixed_window::Fixed),
    Gcra(gcra::Tat),
    Leases(concurrency::Leases),
}

/// Whether one pair admits a cost and, if not, when it would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub(crate) allowed: bool,
    /// When denied: the earliest time (µs) at which the same cost fits, if nothing else happens.
    pub(crate) retry_at: u64,
}

impl Verdict {
    pub(crate) const ADMIT: Verdict = Verdict {
        allowed: true,
        retry_at: 0,
    };

    pub(crate) fn deny(retry_at: u64) -> Verdict {
        Verdict {
            allowed: false,
            retry_at,
        }
    }
}

/// What `report` reads off a state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Report {
    pub(crate) remaining: u64,
    /// Microseconds until the full quota is available again.
    pub(crate) reset_after: u64,
}

impl Report {
    /// The report of a state that was never charged (or has expired).
    pub(crate) fn empty(lim: &Limit) -> Report {
        Report {
            remaining: if lim.is_concurrency() {
                lim.count()
            } else {
                lim.max_cost()
            },
            reset_after: 0,
        }
    }
}

/// The answer to one check, per (identifier, limit) pair, identifier-major: what `decide`
/// returns and what the check script's reply carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub(crate) allowed: bool,
    pub(crate) entries: Vec<Entry>,
}

/// One (identifier, limit) pair of an [`Outcome`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) allowed: bool,
    pub(crate) remaining: u64,
    pub(crate) reset_after_us: u64,
    pub(crate) retry_after_us: u64,
}

/// A fresh state for `limit` (what Lua's `load` reads from a missing key).
fn new_state(limit: &Limit) -> State {
    match limit.algorithm() {
        Algorithm::SlidingLog => State::Log(Default::default()),
        Algorithm::SlidingWindow => State::Window(Default::default()),
        Algorithm::FixedWindow => State::Fixed(Default::default()),
        Algorithm::Concurrency => State::Leases(Default::default()),
        Algorithm::TokenBucket { .. } | Algorithm::Gcra { .. } => State::Gcra(Default::default()),
    }
}

fn evaluate(st: &State, lim: &Limit, now: u64, cost: u64) -> Verdict {
    match st {
        State::Log(s) => sliding_log::evaluate(s, lim, now, cost),
        State::Window(s) => sliding_window::evaluate(s, lim, now, cost),
        State::Fixed(s) => fixed_window::evaluate(s, lim, now, cost),
        State::Gcra(s) => gcra::evaluate(s, lim, now, cost),
        State::Leases(s) => concurrency::evaluate(s, lim, now, cost),
    }
}

fn commit(st: &mut State, lim: &Limit, now: u64, cost: u64, lease: &str) {
    match st {
        State::Log(s) => sliding_log::commit(s, lim, now, cost),
        State::Window(s) => sliding_window::commit(s, lim, now, cost),
        State::Fixed(s) => fixed_window::commit(s, lim, now, cost),
        State::Gcra(s) => gcra::commit(s, lim, now, cost),
        State::Leases(s) => concurrency::commit(s, lim, now, lease),
    }
}

fn report(st: &State, lim: &Limit, now: u64) -> Report {
    match st {
        State::Log(s) => sliding_log::report(s, lim, now),
        State::Window(s) => sliding_window::report(s, lim, now),
        State::Fixed(s) => fixed_window::report(s, lim, now),
        State::Gcra(s) => gcra::report(s, lim, now),
        State::Leases(s) => concurrency::report(s, lim, now),
    }
}

/// The time (µs) from which `state` no longer matters: it decides like a fresh one. The
/// memory store forgets it then; the script sets the key's TTL from the same instant.
pub(crate) fn expires_at(st: &State, lim: &Limit) -> u64 {
    match st {
        State::Log(s) => sliding_log::expires_at(s, lim),
        State::Window(s) => sliding_window::expires_at(s, lim),
        State::Fixed(s) => fixed_window::expires_at(s, lim),
        State::Gcra(s) => gcra::expires_at(s),
        State::Leases(s) => concurrency::expires_at(s),
    }
}

/// One check, all-or-nothing: the twin of `lua/check.lua`.
///
/// `states` holds one state per (identifier, limit) pair, identifier-major (`None`: never
/// charged, or expired), for the `limits` of a policy. Phase 1 only reads; only when every
/// pair admits does phase 2 charge `cost` everywhere (a concurrency limit takes the slot
/// `lease`), creating the states it needs. A denied check leaves every state as it was.
pub(crate) fn decide(
    states: &mut [Option<State>],
    limits: &[Limit],
    now: u64,
    cost: u64,
    lease: &str,
) -> Outcome {
    let limit_of = |k: usize| &limits[k % limits.len()];
    let verdicts: Vec<Verdict> = states
        .iter()
        .enumerate()
        .map(|(k, st)| match st {
            Some(st) => evaluate(st, limit_of(k), now, cost),
            None => evaluate(&new_state(limit_of(k)), limit_of(k), now, cost),
        })
        .collect();
    let allowed = verdicts.iter().all(|v| v.allowed);

    if allowed {
        for (k, st) in states.iter_mut().enumerate() {
            let lim = limit_of(k);
            commit(
                st.get_or_insert_with(|| new_state(lim)),
                lim,
                now,
                cost,
                lease,
            );
        }
    }

    let entries = states
        .iter()
        .zip(&verdicts)
        .enumerate()
        .map(|(k, (st, v))| {
            let lim = limit_of(k);
            let r = st
                .as_ref()
                .map_or_else(|| Report::empty(lim), |st| report(st, lim, now));
            Entry {
                allowed: v.allowed,
                remaining: r.remaining,
                reset_after_us: r.reset_after,
                retry_after_us: if v.allowed {
                    0
                } else {
                    v.retry_at.saturating_sub(now)
                },
            }
        })
        .collect();
    Outcome { allowed, entries }
}

/// Extends the lease `id` held in `st` (a concurrency state) to `now + lease_us`, if it is
/// still live; returns whether it was. The twin of `lua/renew.lua`.
pub(crate) fn renew(st: &mut State, id: &str, now: u64, lease_us: u64) -> bool {
    match st {
        State::Leases(s) => concurrency::renew(s, id, now, lease_us),
        _ => false,
    }
}

/// Gives the slot `id` held in `st` back (idempotent).
pub(crate) fn release(st: &mut State, id: &str) {
    if let State::Leases(s) = st {
        concurrency::release(s, id);
    }
}

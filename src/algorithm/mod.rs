//! The algorithms on in-process state: the twin of `lua/`, file for file.
//!
//! | Lua (Redis store)          | Rust (memory store)                 |
//! |----------------------------|-------------------------------------|
//! | `lua/check.lua`            | [`decide`], [`peek`], [`Layout`]    |
//! | `lua/sliding_log.lua`      | `sliding_log.rs`                    |
//! | `lua/sliding_window.lua`   | `sliding_window.rs`                 |
//! | `lua/rolling_window.lua`   | `rolling_window.rs` (counts ≤ 1550) |
//! | `lua/rolling_window_wide.lua` | `rolling_window.rs` (larger)     |
//! | `lua/fixed_window.lua`     | `fixed_window.rs`                   |
//! | `lua/gcra.lua`             | `gcra.rs`                           |
//! | `lua/concurrency.lua`      | `concurrency.rs`                    |
//! | `lua/renew.lua`            | `concurrency::renew`                |
//! | `lua/refund.lua`           | [`refund`], each file's `refund`    |
//! | `lua/schedule.lua`         | `schedule.rs` (the scheduler)       |
//! | `lua/reserve.lua`          | `reserve.rs` (checks that may wait) |
//! | `lua/prelude.lua`          | none: the script's clock            |
//!
//! The Redis check script is generated per policy from those files (`src/store/script.rs`):
//! each algorithm file holds the fragments of one limit, in the order they run — `evaluate`
//! (does `cost` fit), `commit` (charge it), then `report` or, for the algorithms whose state
//! is packed, `expires` (when the state stops mattering). The Rust files have the same
//! functions in the same order: `evaluate` (which also says when a denied cost would fit),
//! `commit`, `report` (remaining quota, time until the state is empty), `expires_at`. The
//! packed algorithms also have `FIELDS` and `load`, the twins of their `fields` (what the
//! script stores); their `fresh` fragment, what `evaluate` and `commit` make of a missing
//! state, is a shortcut of the script's with no twin of its own. Last comes `refund` (the
//! fragment of the refund script, `lua/refund.lua`, and its twin of the same name): what
//! giving back an admitted charge does to the state. The arithmetic is the same:
//! integer microseconds, and where a double is used, the same expression in the same order,
//! so that both stores reach the same decision for the same `(time, identifiers, cost)`
//! sequence. The conformance, model and differential tests hold the two to that.
//!
//! # Keys
//!
//! Per identifier, a policy keeps its state in a few keys ([`Layout`]): one *packed* key
//! holding every counter limit (rolling window, sliding window, fixed window, GCRA and token
//! bucket: a few integers each), then one key per sorted-set limit (sliding log, concurrency), whose state
//! grows with its count. The memory store keeps one [`State`] per key, as Redis does.
//!
//! # Who computes what
//!
//! The script only decides and writes: for the packed key it returns the state it read, and
//! the Redis store derives every report from it with this twin ([`decide`] on that state). A
//! sorted set is read in place by the script, which reports on it itself (a sliding log's
//! report is what the script read, which `sliding_log::settle` turns into figures): the store
//! hands [`decide`] that report as a [`State::Settled`].

use crate::policy::{Algorithm, Limit};
use smallvec::SmallVec;

pub(crate) use reserve::decide_within_into;

pub(crate) mod concurrency;
mod fixed_window;
mod gcra;
mod reserve;
pub(crate) mod rolling_window;
pub(crate) mod schedule;
pub(crate) mod sliding_log;
mod sliding_window;

/// The state of one key.
#[derive(Debug, Clone)]
pub(crate) enum State {
    /// The packed key: one counter per packed limit, in the policy's order.
    Counters(Counters),
    Log(sliding_log::Log),
    Leases(concurrency::Leases),
    /// A sorted set the Redis script decided on and reported on itself: its verdict and its
    /// report, read from the script's reply.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    Settled(Entry),
}

/// The counters of a packed key: the first inline, in the state itself, so that a policy of
/// one counter limit finds its state without following a pointer.
pub(crate) type Counters = SmallVec<[Counter; 1]>;

/// The state of one limit in a packed key.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Counter {
    Window(sliding_window::Window),
    Ring(rolling_window::Ring),
    Fixed(fixed_window::Fixed),
    Gcra(gcra::Tat),
}

/// Whether a limit's state lives in the identifier's packed key (a few integers) rather than
/// in a sorted set of its own.
pub(crate) fn is_packed(limit: &Limit) -> bool {
    !matches!(
        limit.algorithm(),
        Algorithm::SlidingLog | Algorithm::Concurrency
    )
}

/// How one identifier's state is laid out in keys: the packed key first (when the policy has
/// packed limits), then one key per sorted-set limit, in the policy's order. Every
/// identifier of a check has the same layout; `decide` takes the keys identifier-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Per limit of the policy: the index of its key among the identifier's keys, and its
    /// position in the packed key (0 for a key of its own); inline for a policy of up to four
    /// limits, so that working a layout out allocates nothing.
    slots: SmallVec<[(usize, usize); 4]>,
    packed: usize,
}

impl Layout {
    pub(crate) fn of(limits: &[Limit]) -> Layout {
        let packed = limits.iter().filter(|l| is_packed(l)).count();
        let mut next_key = usize::from(packed > 0);
        let mut next_field = 0;
        let slots = limits
            .iter()
            .map(|l| {
                if is_packed(l) {
                    next_field += 1;
                    (0, next_field - 1)
                } else {
                    next_key += 1;
                    (next_key - 1, 0)
                }
            })
            .collect();
        Layout { slots, packed }
    }

    /// How many keys each identifier has.
    pub(crate) fn keys_per_id(&self) -> usize {
        usize::from(self.packed > 0) + self.slots.len() - self.packed
    }

    /// Whether every limit is packed: an identifier's state is its packed key alone.
    pub(crate) fn is_packed_only(&self) -> bool {
        self.packed > 0 && self.packed == self.slots.len()
    }

    /// Whether the identifier's first key is the packed one.
    pub(crate) fn has_packed(&self) -> bool {
        self.packed > 0
    }

    /// The key index (among an identifier's keys) of limit `l`.
    pub(crate) fn key_of(&self, l: usize) -> usize {
        self.slots[l].0
    }

    /// The limits (by index) whose state is key `k` of an identifier.
    pub(crate) fn limits_of(&self, k: usize) -> impl Iterator<Item = usize> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(move |(_, s)| s.0 == k)
            .map(|(l, _)| l)
    }
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

/// The answer to one check, per (identifier, limit) pair, identifier-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub(crate) allowed: bool,
    pub(crate) entries: Entries,
    /// When the check was decided (µs): the memory store's clock reading, or the time the
    /// Redis script read (`TIME`, or the caller's clock). A charge is given back at this time
    /// ([`refund`]).
    pub(crate) at_us: u64,
    /// How long an allowed check waits for the time it was admitted at (0 but for a check
    /// that may wait: see `reserve`).
    pub(crate) wait_us: u64,
    /// The identifiers whose figures are unknown (bit `j`: the check's `j`th), their entries
    /// placeholders to leave out: a denial of a check across Redis Cluster slots, which one
    /// slot denied while the call to another failed (see `RedisStore::check_split`). 0 for
    /// every other outcome.
    pub(crate) unknown: u16,
    /// Whether a failed call of such a denial may have run, and taken a concurrency slot
    /// that its caller then releases, as after a failed check.
    pub(crate) unsure: bool,
}

impl Outcome {
    /// The outcome `summary` sums up, with `entries`.
    pub(crate) fn of(summary: Summary, entries: Entries) -> Outcome {
        Outcome {
            allowed: summary.allowed,
            entries,
            at_us: summary.at_us,
            wait_us: summary.wait_us,
            unknown: 0,
            unsure: false,
        }
    }

    /// Whether the figures of the check's `j`th identifier are known (see
    /// [`unknown`](Outcome::unknown)).
    pub(crate) fn knows(&self, j: usize) -> bool {
        let bit = u32::try_from(j).ok().and_then(|j| 1u16.checked_shl(j));
        bit.is_none_or(|bit| self.unknown & bit == 0)
    }
}

// `Outcome::unknown` holds a bit for each identifier a check may name.
const _: () = assert!(crate::limiter::MAX_IDENTIFIERS <= u16::BITS as usize);

/// An [`Outcome`] without its entries, which went to a [`Sink`] as they were reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Summary {
    pub(crate) allowed: bool,
    pub(crate) at_us: u64,
    pub(crate) wait_us: u64,
}

/// Where a check's entries go as they are reported, one per (identifier, limit) pair,
/// identifier-major (`id` counts the check's identifiers, `limit` the policy's limits): an
/// [`Outcome`]'s [`Entries`], or, for the memory store, straight into a decision's statuses,
/// so that a check's figures are written once rather than moved through every layer of it.
pub(crate) trait Sink {
    fn entry(&mut self, id: usize, limit: usize, entry: Entry);
}

impl Sink for Entries {
    fn entry(&mut self, _id: usize, _limit: usize, entry: Entry) {
        self.push(entry);
    }
}

/// The entries of an [`Outcome`]: inline up to two identifiers of three limits, so that a
/// check of the memory store allocates nothing.
pub(crate) type Entries = SmallVec<[Entry; 6]>;

/// The verdicts of phase 1, inline as [`Entries`].
pub(crate) type Verdicts = SmallVec<[Verdict; 6]>;

/// One (identifier, limit) pair of an [`Outcome`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) allowed: bool,
    pub(crate) remaining: u64,
    pub(crate) reset_after_us: u64,
    pub(crate) retry_after_us: u64,
}

impl Entry {
    /// The entry of a pair whose verdict is `v` and whose state reports `r` as of `at`, the
    /// time decided at (`real`, the clock's time, or later for a waiting check); reset and
    /// retry times are counted from `real`.
    fn of(v: Verdict, r: Report, real: u64, at: u64) -> Entry {
        Entry {
            allowed: v.allowed,
            remaining: r.remaining,
            reset_after_us: match r.reset_after {
                0 => 0,
                reset => reset + (at - real),
            },
            retry_after_us: if v.allowed {
                0
            } else {
                v.retry_at.saturating_sub(real)
            },
        }
    }
}

impl Counter {
    pub(crate) fn fresh(limit: &Limit) -> Counter {
        match limit.algorithm() {
            Algorithm::SlidingWindow => Counter::Window(Default::default()),
            Algorithm::RollingWindow => Counter::Ring(Default::default()),
            Algorithm::FixedWindow => Counter::Fixed(Default::default()),
            _ => Counter::Gcra(Default::default()),
        }
    }

    /// The counter of `limit` from the fields the script packs for it (see `FIELDS` in each
    /// algorithm file), `at` being the packed key's time of the last charge.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn load(limit: &Limit, at: u64, fields: &[u64]) -> Counter {
        match limit.algorithm() {
            Algorithm::SlidingWindow => Counter::Window(sliding_window::load(limit, at, fields)),
            Algorithm::RollingWindow => Counter::Ring(rolling_window::load(limit, at, fields)),
            Algorithm::FixedWindow => Counter::Fixed(fixed_window::load(limit, at, fields)),
            _ => Counter::Gcra(gcra::load(at, fields)),
        }
    }

    /// The names of the fields the script packs for `limit`, in order.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn fields(limit: &Limit) -> &'static [&'static str] {
        match limit.algorithm() {
            Algorithm::SlidingWindow => sliding_window::FIELDS,
            Algorithm::RollingWindow => rolling_window::fields(limit),
            Algorithm::FixedWindow => fixed_window::FIELDS,
            _ => gcra::FIELDS,
        }
    }
}

impl Counter {
    fn evaluate(&self, lim: &Limit, now: u64, cost: u64) -> Verdict {
        match self {
            Counter::Window(s) => sliding_window::evaluate(s, lim, now, cost),
            Counter::Ring(s) => rolling_window::evaluate(s, lim, now, cost),
            Counter::Fixed(s) => fixed_window::evaluate(s, lim, now, cost),
            Counter::Gcra(s) => gcra::evaluate(s, lim, now, cost),
        }
    }

    fn commit(&mut self, lim: &Limit, now: u64, cost: u64) {
        match self {
            Counter::Window(s) => sliding_window::commit(s, lim, now, cost),
            Counter::Ring(s) => rolling_window::commit(s, lim, now, cost),
            Counter::Fixed(s) => fixed_window::commit(s, lim, now, cost),
            Counter::Gcra(s) => gcra::commit(s, lim, now, cost),
        }
    }

    /// [`commit`](Counter::commit), then [`report`](Counter::report).
    fn charge(&mut self, lim: &Limit, now: u64, cost: u64) -> Report {
        match self {
            Counter::Ring(s) => rolling_window::charge(s, lim, now, cost),
            _ => {
                self.commit(lim, now, cost);
                self.report(lim, now)
            }
        }
    }

    /// The check of a packed key whose only limit this is: [`evaluate`](Counter::evaluate),
    /// then [`charge`](Counter::charge) when it admits or else [`report`](Counter::report).
    fn check_alone(&mut self, lim: &Limit, now: u64, cost: u64) -> (Verdict, Report) {
        match self {
            Counter::Ring(s) => rolling_window::check_alone(s, lim, now, cost),
            Counter::Gcra(s) => gcra::check_alone(s, lim, now, cost),
            _ => {
                let verdict = self.evaluate(lim, now, cost);
                let report = if verdict.allowed {
                    self.charge(lim, now, cost)
                } else {
                    self.report(lim, now)
                };
                (verdict, report)
            }
        }
    }

    fn report(&self, lim: &Limit, now: u64) -> Report {
        match self {
            Counter::Window(s) => sliding_window::report(s, lim, now),
            Counter::Ring(s) => rolling_window::report(s, lim, now),
            Counter::Fixed(s) => fixed_window::report(s, lim, now),
            Counter::Gcra(s) => gcra::report(s, lim, now),
        }
    }

    fn expires_at(&self, lim: &Limit) -> u64 {
        match self {
            Counter::Window(s) => sliding_window::expires_at(s, lim),
            Counter::Ring(s) => rolling_window::expires_at(s, lim),
            Counter::Fixed(s) => fixed_window::expires_at(s, lim),
            Counter::Gcra(s) => gcra::expires_at(s),
        }
    }
}

/// A fresh state for key `k` of an identifier (what the script reads from a missing key).
fn fresh(layout: &Layout, limits: &[Limit], k: usize) -> State {
    if k == 0 && layout.has_packed() {
        return State::Counters(
            layout
                .limits_of(0)
                .map(|l| Counter::fresh(&limits[l]))
                .collect(),
        );
    }
    match layout.limits_of(k).next().map(|l| limits[l].algorithm()) {
        Some(Algorithm::Concurrency) => State::Leases(Default::default()),
        _ => State::Log(Default::default()),
    }
}

/// The part of `st` that limit `l` (at `pos` in a packed key) keeps.
enum Part<'a> {
    Counter(&'a mut Counter),
    Log(&'a mut sliding_log::Log),
    Leases(&'a mut concurrency::Leases),
    Settled(&'a Entry),
}

fn part(st: &mut State, pos: usize) -> Part<'_> {
    match st {
        State::Counters(c) => Part::Counter(&mut c[pos]),
        State::Log(s) => Part::Log(s),
        State::Leases(s) => Part::Leases(s),
        State::Settled(e) => Part::Settled(e),
    }
}

fn evaluate(part: Part<'_>, lim: &Limit, now: u64, cost: u64) -> Verdict {
    match part {
        Part::Counter(c) => c.evaluate(lim, now, cost),
        Part::Log(s) => sliding_log::evaluate(s, lim, now, cost),
        Part::Leases(s) => concurrency::evaluate(s, lim, now, cost),
        Part::Settled(e) if e.allowed => Verdict::ADMIT,
        Part::Settled(e) => Verdict::deny(now + e.retry_after_us),
    }
}

/// Charges `cost` at `now`; `real` is the clock's time (earlier for a waiting check).
fn commit(part: Part<'_>, lim: &Limit, real: u64, now: u64, cost: u64, lease: &str) {
    match part {
        Part::Counter(c) => c.commit(lim, now, cost),
        Part::Log(s) => sliding_log::commit(s, lim, real, now, cost),
        Part::Leases(s) => concurrency::commit(s, lim, now, lease),
        // the script charged it already
        Part::Settled(_) => {}
    }
}

fn report(part: Part<'_>, lim: &Limit, now: u64) -> Report {
    match part {
        Part::Counter(c) => c.report(lim, now),
        Part::Log(s) => sliding_log::report(s, lim, now),
        Part::Leases(s) => concurrency::report(s, lim, now),
        Part::Settled(e) => Report {
            remaining: e.remaining,
            reset_after: e.reset_after_us,
        },
    }
}

/// The time (µs) from which key `k` of an identifier no longer matters: it decides like a
/// fresh one. The memory store forgets it then; the script sets the key's TTL from the same
/// instant (for the packed key, the latest of its limits').
pub(crate) fn expires_at(st: &State, layout: &Layout, limits: &[Limit], k: usize) -> u64 {
    match st {
        State::Counters(counters) => layout
            .limits_of(k)
            .zip(counters)
            .map(|(l, c)| c.expires_at(&limits[l]))
            .max()
            .unwrap_or(0),
        State::Log(s) => layout
            .limits_of(k)
            .next()
            .map_or(0, |l| sliding_log::expires_at(s, &limits[l])),
        State::Leases(s) => concurrency::expires_at(s),
        State::Settled(_) => 0,
    }
}

/// Phase 1 of a check: every (identifier, limit) pair's verdict on `cost` at `now`,
/// identifier-major; nothing is changed.
fn evaluate_all(
    states: &mut [Option<State>],
    layout: &Layout,
    limits: &[Limit],
    now: u64,
    cost: u64,
) -> Verdicts {
    let per_id = layout.keys_per_id();
    // A missing state is evaluated as a fresh one, without creating it: one per key, made
    // when a missing state is first met.
    let mut scratch: SmallVec<[Option<State>; 2]> = SmallVec::new();
    let mut verdicts = Verdicts::new();
    for keys in states.chunks_mut(per_id) {
        for (lim, &(k, pos)) in limits.iter().zip(&layout.slots) {
            let st = match &mut keys[k] {
                Some(st) => st,
                None => {
                    if scratch.is_empty() {
                        scratch.resize_with(per_id, || None);
                    }
                    scratch[k].get_or_insert_with(|| fresh(layout, limits, k))
                }
            };
            verdicts.push(evaluate(part(st, pos), lim, now, cost));
        }
    }
    verdicts
}

/// One check, all-or-nothing: the twin of `lua/check.lua`.
///
/// `states` holds the keys of every identifier, identifier-major, as `layout` lays them out
/// for `limits` (`None`: never charged, or expired). Phase 1 only reads; only when every pair
/// admits does phase 2 charge `cost` everywhere (a concurrency limit takes the slot `lease`),
/// creating the states it needs. A denied check leaves every state as it was. The outcome
/// holds one entry per (identifier, limit) pair, identifier-major, limits in policy order.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn decide(
    states: &mut [Option<State>],
    layout: &Layout,
    limits: &[Limit],
    now: u64,
    cost: u64,
    lease: &str,
) -> Outcome {
    decide_at(states, layout, limits, now, now, cost, lease)
}

/// [`decide`] as of `at` (`now` or later: the time a waiting check is admitted at, see
/// `reserve`): every pair is evaluated and charged at `at`; reset and retry times are counted
/// from `now`, and an allowed outcome waits `at - now`.
pub(crate) fn decide_at(
    states: &mut [Option<State>],
    layout: &Layout,
    limits: &[Limit],
    now: u64,
    at: u64,
    cost: u64,
    lease: &str,
) -> Outcome {
    let mut entries = Entries::new();
    let summary = decide_at_into(states, layout, limits, now, at, cost, lease, &mut entries);
    Outcome::of(summary, entries)
}

/// [`decide_at`], its entries given to `sink`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn decide_at_into(
    states: &mut [Option<State>],
    layout: &Layout,
    limits: &[Limit],
    now: u64,
    at: u64,
    cost: u64,
    lease: &str,
    sink: &mut impl Sink,
) -> Summary {
    let (real, now) = (now, at.max(now));
    let per_id = layout.keys_per_id();
    let verdicts = evaluate_all(states, layout, limits, now, cost);
    let allowed = verdicts.iter().all(|v| v.allowed);
    if allowed {
        for j in 0..states.len() / per_id {
            for (l, lim) in limits.iter().enumerate() {
                let k = layout.key_of(l);
                let st = states[j * per_id + k].get_or_insert_with(|| fresh(layout, limits, k));
                commit(part(st, layout.slots[l].1), lim, real, now, cost, lease);
            }
        }
    }
    report_all(states, layout, limits, real, now, &verdicts, sink)
}

/// [`decide`] for one identifier whose state is its packed key alone (every limit of the
/// policy is packed: `counters` are `limits`' own, in order), decided where the counters lie:
/// the same phases (a counter's commit and report made in one step) and the same entries,
/// without the general way's bookkeeping of keys and pairs. `missing`: the key was missing or
/// expired, and `counters` are fresh ones, which a denied check leaves unreported as
/// [`report_all`] leaves a missing state (the caller drops them: a denial creates nothing).
pub(crate) fn decide_packed_into(
    counters: &mut Counters,
    limits: &[Limit],
    now: u64,
    cost: u64,
    missing: bool,
    sink: &mut impl Sink,
) -> Summary {
    if let ([c], [lim]) = (&mut counters[..], limits) {
        // One limit (the usual policy): all or nothing is its own verdict, so it is charged or
        // reported in the same step.
        let (v, r) = c.check_alone(lim, now, cost);
        let r = if !v.allowed && missing {
            Report::empty(lim)
        } else {
            r
        };
        sink.entry(0, 0, Entry::of(v, r, now, now));
        return Summary {
            allowed: v.allowed,
            at_us: now,
            wait_us: 0,
        };
    }
    // pushed one by one: collecting into a `SmallVec` costs several times more
    let mut verdicts = Verdicts::new();
    let mut allowed = true;
    for (c, lim) in counters.iter().zip(limits) {
        let v = c.evaluate(lim, now, cost);
        allowed &= v.allowed;
        verdicts.push(v);
    }
    // Each counter is committed (when all admit) and reported in one step: a commit changes
    // its own counter only, so this is the same as committing all, then reporting each.
    for (l, ((c, lim), &v)) in counters.iter_mut().zip(limits).zip(&verdicts).enumerate() {
        let r = match (allowed, missing) {
            (true, _) => c.charge(lim, now, cost),
            (false, true) => Report::empty(lim),
            (false, false) => c.report(lim, now),
        };
        sink.entry(0, l, Entry::of(v, r, now, now));
    }
    Summary {
        allowed,
        at_us: now,
        wait_us: 0,
    }
}

/// When a packed key whose counters are `limits`' own, in order, stops mattering
/// ([`expires_at`] of such a key).
pub(crate) fn packed_expires_at(counters: &Counters, limits: &[Limit]) -> u64 {
    counters
        .iter()
        .zip(limits)
        .map(|(c, lim)| c.expires_at(lim))
        .max()
        .unwrap_or(0)
}

/// Phase 1 of [`decide`] alone, the twin of the peek script: what a check of `cost` would
/// decide now, with every state left as it is. Each entry reports the quota available now
/// (nothing was charged) and, when denied, when the cost would fit.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn peek(
    states: &mut [Option<State>],
    layout: &Layout,
    limits: &[Limit],
    now: u64,
    cost: u64,
) -> Outcome {
    let mut entries = Entries::new();
    let summary = peek_into(states, layout, limits, now, cost, &mut entries);
    Outcome::of(summary, entries)
}

/// [`peek`], its entries given to `sink`.
pub(crate) fn peek_into(
    states: &mut [Option<State>],
    layout: &Layout,
    limits: &[Limit],
    now: u64,
    cost: u64,
    sink: &mut impl Sink,
) -> Summary {
    let verdicts = evaluate_all(states, layout, limits, now, cost);
    report_all(states, layout, limits, now, now, &verdicts, sink)
}

/// The outcome of `verdicts`, reported on `states` as they are now, entry by entry to `sink`:
/// decided at `at` (`real`, the clock's time, or later for a waiting check), with reset and
/// retry times counted from `real`.
fn report_all(
    states: &mut [Option<State>],
    layout: &Layout,
    limits: &[Limit],
    real: u64,
    at: u64,
    verdicts: &[Verdict],
    sink: &mut impl Sink,
) -> Summary {
    let per_id = layout.keys_per_id();
    let mut verdict = verdicts.iter();
    for (j, keys) in states.chunks_mut(per_id).enumerate() {
        for (l, (lim, &(k, pos))) in limits.iter().zip(&layout.slots).enumerate() {
            let Some(&v) = verdict.next() else { break };
            let r = match &mut keys[k] {
                Some(st) => report(part(st, pos), lim, at),
                None => Report::empty(lim),
            };
            sink.entry(j, l, Entry::of(v, r, real, at));
        }
    }
    let allowed = verdicts.iter().all(|v| v.allowed);
    Summary {
        allowed,
        at_us: at,
        wait_us: if allowed { at - real } else { 0 },
    }
}

/// Gives back the charge of one admitted check: the twin of `lua/refund.lua`.
///
/// `states` holds the check's keys as [`decide`] takes them; `at` is the check's time
/// ([`Outcome::at_us`]), `cost` and `lease` its own. Each limit's `refund` takes back from its
/// state what the charge added, never more, and nothing once the state has moved past it; a
/// missing state has nothing to give back and stays missing. After a refund with nothing
/// charged in between, every state decides, from `at` on, as it did before the check.
pub(crate) fn refund(
    states: &mut [Option<State>],
    layout: &Layout,
    limits: &[Limit],
    at: u64,
    cost: u64,
    lease: &str,
) {
    let per_id = layout.keys_per_id();
    for keys in states.chunks_mut(per_id) {
        for (l, lim) in limits.iter().enumerate() {
            if let Some(st) = &mut keys[layout.key_of(l)] {
                refund_part(part(st, layout.slots[l].1), lim, at, cost, lease);
            }
        }
    }
}

fn refund_part(part: Part<'_>, lim: &Limit, at: u64, cost: u64, lease: &str) {
    match part {
        Part::Counter(Counter::Window(s)) => sliding_window::refund(s, lim, at, cost),
        Part::Counter(Counter::Ring(s)) => rolling_window::refund(s, lim, at, cost),
        Part::Counter(Counter::Fixed(s)) => fixed_window::refund(s, lim, at, cost),
        Part::Counter(Counter::Gcra(s)) => gcra::refund(s, lim, at, cost),
        Part::Log(s) => sliding_log::refund(s, at, cost),
        Part::Leases(s) => concurrency::refund(s, lease),
        // the script gave it back itself
        Part::Settled(_) => {}
    }
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

#[cfg(test)]
mod refund_tests;

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(policy: &str) -> Vec<Limit> {
        policy.parse::<crate::Policy>().unwrap().limits().to_vec()
    }

    #[test]
    fn layout_packs_counters_and_gives_sorted_sets_keys_of_their_own() {
        let l = limits("10/s, 5/s log, 20/min fixed, 3 concurrent, 7/s gcra");
        let layout = Layout::of(&l);
        assert_eq!(layout.keys_per_id(), 3);
        assert!(layout.has_packed());
        let keys: Vec<usize> = (0..l.len()).map(|i| layout.key_of(i)).collect();
        assert_eq!(keys, [0, 1, 0, 2, 0]);
        assert_eq!(layout.limits_of(0).collect::<Vec<_>>(), [0, 2, 4]);
        assert_eq!(layout.limits_of(2).collect::<Vec<_>>(), [3]);

        let logs = Layout::of(&limits("5/s log, 9/min log"));
        assert!(!logs.has_packed());
        assert_eq!(logs.keys_per_id(), 2);
        assert_eq!((logs.key_of(0), logs.key_of(1)), (0, 1));
    }

    /// A counter's report says what its evaluation admits: `remaining` is the largest cost
    /// admitted now, and at `reset_after` from now the whole quota is. States are charged at
    /// several times, some later than the time they are seen from (a waiting check's
    /// reservation, or a clock gone back), where nothing is admitted until their time.
    #[test]
    fn a_report_says_what_the_evaluation_admits() {
        for policy in ["12/s", "12/s sliding", "12/s fixed", "12/min", "12/s gcra"] {
            let lim = limits(policy)[0];
            let w = lim.window_us();
            let t0 = 1_000 * w;
            let offsets = [0, w / 7, w / 2, w - 1, w, w + w / 3, 2 * w + 5];
            for charges in [
                &[(0, 5)][..],
                &[(0, 12)],
                &[(0, 3), (w / 2, 4)],
                &[(w / 3, 7), (w + w / 4, 2)],
                &[(w - 1, 11), (w, 1)],
                &[(0, 2), (2 * w, 6)],
            ] {
                let mut counter = Counter::fresh(&lim);
                for &(at, cost) in charges {
                    counter.commit(&lim, t0 + at, cost);
                }
                // and the same state with its last charge given back (a split check's
                // refund): an empty window of its own can still lie ahead of now
                let mut refunded = counter;
                if let Some(&(at, cost)) = charges.last() {
                    refund_part(Part::Counter(&mut refunded), &lim, t0 + at, cost, "");
                }
                for (counter, seen) in [counter, refunded]
                    .into_iter()
                    .flat_map(|c| offsets.iter().map(move |&seen| (c, seen)))
                {
                    let now = t0 + seen;
                    let report = counter.report(&lim, now);
                    let admitted = (1..=lim.count())
                        .take_while(|&k| counter.evaluate(&lim, now, k).allowed)
                        .last()
                        .unwrap_or(0);
                    let case = format!("{policy}, charged {charges:?}, seen at {seen}");
                    assert_eq!(report.remaining, admitted, "{case}: {report:?}");
                    let whole = now + report.reset_after;
                    assert!(
                        counter.evaluate(&lim, whole, lim.count()).allowed,
                        "{case}: not whole at reset, {report:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_settled_state_is_taken_as_the_script_reported_it() {
        let l = limits("2/s log");
        let layout = Layout::of(&l);
        let entry = Entry {
            allowed: false,
            remaining: 1,
            reset_after_us: 900,
            retry_after_us: 400,
        };
        let mut states = vec![Some(State::Settled(entry))];
        let out = decide(&mut states, &layout, &l, 1_000_000, 2, "");
        assert!(!out.allowed);
        assert_eq!(out.entries[..], [entry]);
    }
}

//! Rolling window (the default algorithm): never more than `n` admitted in any interval of
//! length `w`, wherever it starts, in five counters. Twin of `lua/rolling_window.lua` (counts
//! up to [`COMPACT_MAX`], the ring packed into one number) and `lua/rolling_window_wide.lua`
//! (larger counts, five fields), function for function: `fields` and `load` are their
//! `fields`, `evaluate` and `commit` their fragments of the same names, `expires_at` their
//! `expires`; `report`, and the retry time in `evaluate`, are derived here from the state the
//! script returns. `charge` (commit, then report) and `check_alone` (evaluate, then charge or
//! report, the ring seen from now once, as the script's `evaluate` moves its ring on once for
//! its `commit`) compose them for the memory store. Both files run the same automaton on the
//! same numbers; only the packing differs.
//!
//! The window is cut into [`SUB_WINDOWS`] sub-windows of `g = w / 4` µs, aligned to the Unix
//! epoch, and a ring of `SUB_WINDOWS + 1` counters holds what was admitted in the current
//! sub-window and the ones before it: every sub-window the rolling window `(now - w, now]`
//! touches. The oldest has partly left the rolling window but is counted in full.
//!
//! * Never over: every admitted unit in `(t - w, t]` lies in one of the sub-windows counted at
//!   `t`, so no interval of length `w` ever holds more than `n`.
//! * Under-admission bounded by one sub-window: the ring counts nothing before the start of
//!   the oldest sub-window, which is later than `now - w - g`; so it admits whatever an exact
//!   rolling window of `w + g` would admit (given what was admitted before), a denied cost
//!   waits at most `g` longer than under an exact window of `w`, and a sustained overload is
//!   admitted at `n` per `w + g` at least.
//!
//! The count only changes at sub-window starts, so a denied cost fits again at the start of
//! the first sub-window from which the ring holds little enough: the retry time is exact.
//!
//! A ring charged as of a later sub-window than now's (a check that waited for it, see
//! `reserve`, or a clock that went back) is full until that sub-window begins, then decides
//! by its counts, as the window counters do. Seen from now, it has already dropped the
//! sub-windows older than its oldest, which may hold admissions less than `w` before now:
//! admitting on its counts before it begins could put more than `n` in a window. With the
//! rule, every charge lands in the counter of its own admission time's sub-window, and the
//! bound holds for reserved admission times too.

use super::{Report, Verdict};
use crate::policy::Limit;

/// How many sub-windows a window is cut into (`k`); the ring holds one more counter.
/// Windows are whole milliseconds, so `w / 4` is a whole number of microseconds.
pub(crate) const SUB_WINDOWS: u64 = 4;

/// The ring's counters.
const SLOTS: usize = SUB_WINDOWS as usize + 1;

/// The ring: the index of the sub-window of slot 0, and the counts of that sub-window and the
/// ones before it, newest first.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Ring {
    idx: u64,
    slots: [u32; SLOTS],
}

/// The largest count whose ring the script packs into one number: the five counters are the
/// digits of an integer in base `COMPACT_MAX + 2`, below `(COMPACT_MAX + 2)^5`, which must
/// stay within 2^53 (where doubles are exact).
pub(crate) const COMPACT_MAX: u64 = 1550;

/// The base of a compact ring, the same for every count up to [`COMPACT_MAX`]: each counter,
/// and their sum, is at most the count, below `base - 1`. One base for all counts (rather
/// than `count + 2`) makes the state mean the same whatever the count, so a count change
/// keeps it (see `store/keyspace.rs`). `None` for a count over [`COMPACT_MAX`] (the wide form).
pub(crate) fn base(lim: &Limit) -> Option<u64> {
    (lim.count() <= COMPACT_MAX).then_some(COMPACT_MAX + 2)
}

/// The fields the script packs: the ring in one number (`ring`), or for a count over
/// [`COMPACT_MAX`] its five counters, newest first. The newest sub-window's index is the packed
/// key's time of the last charge divided by `g` (every limit of the key is charged at that
/// time, and each keeps the later of its index and now's).
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn fields(lim: &Limit) -> &'static [&'static str] {
    match base(lim) {
        Some(_) => &["ring"],
        None => &["ra", "rb", "rc", "rd", "re"],
    }
}

/// The sub-window of `lim`, in µs.
pub(crate) fn sub_window_us(lim: &Limit) -> u64 {
    lim.window_us() / SUB_WINDOWS
}

/// The state from the packed fields and the time `at` of the key's last charge.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn load(lim: &Limit, at: u64, fields: &[u64]) -> Ring {
    let mut slots = [0; SLOTS];
    match base(lim) {
        Some(b) => {
            // the digits, lowest (newest) first
            let mut ring = fields.first().copied().unwrap_or(0);
            for slot in &mut slots {
                *slot = u32::try_from(ring % b).unwrap_or(u32::MAX);
                ring /= b;
            }
        }
        None => {
            for (slot, f) in slots.iter_mut().zip(fields) {
                *slot = u32::try_from(*f).unwrap_or(u32::MAX);
            }
        }
    }
    Ring {
        idx: at / sub_window_us(lim),
        slots,
    }
}

/// The ring seen from sub-window `i` (or from its own, when that is later: the clock went
/// back): the index it is seen from, and the counts, newest first.
fn view(st: &Ring, i: u64) -> (u64, [u64; SLOTS]) {
    let e = i.max(st.idx);
    let shift = e - st.idx;
    if shift == 0 {
        // the usual view of a key in use: from its own sub-window, nothing moves
        return (e, st.slots.map(u64::from));
    }
    // Slot by slot, each at a fixed place: a straight copy into `out[shift..]` made the
    // same instructions, and a check that charges took a third longer (`benches/layer.rs`).
    let mut out = [0; SLOTS];
    for (m, slot) in out.iter_mut().enumerate() {
        if let Some(from) = (m as u64).checked_sub(shift) {
            *slot = u64::from(st.slots[from as usize]);
        }
    }
    (e, out)
}

pub(crate) fn evaluate(st: &Ring, lim: &Limit, now: u64, cost: u64) -> Verdict {
    let g = sub_window_us(lim);
    let i = now / g;
    let (e, ring) = view(st, i);
    judge(e, i, &ring, lim, g, cost)
}

/// The verdict on `cost` of the ring whose counts seen from sub-window `e` are `ring`, now
/// being in sub-window `i`.
fn judge(e: u64, i: u64, ring: &[u64; SLOTS], lim: &Limit, g: u64, cost: u64) -> Verdict {
    let n = lim.count();
    let used = ring.iter().sum::<u64>();
    if used + cost <= n {
        if e > i {
            // charged as of a later sub-window (a waiting check's reservation, or a clock
            // that went back): full until that sub-window begins, then as its counts say
            return Verdict::deny(e * g);
        }
        return Verdict::ADMIT;
    }
    // At the start of sub-window e + d, the d oldest counters have left the ring; with all of
    // them gone the cost fits (cost <= n), so some d in 1..=SLOTS does.
    let mut kept = used;
    for d in 1..=SLOTS {
        kept -= ring[SLOTS - d];
        if kept + cost <= n {
            return Verdict::deny((e + d as u64) * g);
        }
    }
    Verdict::deny((e + SLOTS as u64) * g)
}

pub(crate) fn commit(st: &mut Ring, lim: &Limit, now: u64, cost: u64) {
    let (e, ring) = view(st, now / sub_window_us(lim));
    set(st, e, &ring, cost);
}

/// The ring as seen from sub-window `e` (counts `ring`), with `cost` charged to its newest
/// counter.
fn set(st: &mut Ring, e: u64, ring: &[u64; SLOTS], cost: u64) {
    st.idx = e;
    for (slot, &count) in st.slots.iter_mut().zip(ring) {
        *slot = u32::try_from(count).unwrap_or(u32::MAX);
    }
    // counts stay below MAX_COUNT, far below u32::MAX
    st.slots[0] = st.slots[0].saturating_add(u32::try_from(cost).unwrap_or(u32::MAX));
}

/// [`commit`], then [`report`] without seeing the ring from now again: the commit left it
/// seen from its own sub-window, the later of now's and the one it had.
pub(crate) fn charge(st: &mut Ring, lim: &Limit, now: u64, cost: u64) -> Report {
    // `commit`'s own steps, keeping the sub-window of now for the report
    let g = sub_window_us(lim);
    let i = now / g;
    let (e, ring) = view(st, i);
    set(st, e, &ring, cost);
    report_of(e, i, &st.slots.map(u64::from), lim, g, now)
}

/// The check of a key whose only limit this is: [`evaluate`], then [`charge`] when it admits
/// or else [`report`], seeing the ring from now once rather than twice.
pub(crate) fn check_alone(st: &mut Ring, lim: &Limit, now: u64, cost: u64) -> (Verdict, Report) {
    let g = sub_window_us(lim);
    let i = now / g;
    let (e, ring) = view(st, i);
    let verdict = judge(e, i, &ring, lim, g, cost);
    if verdict.allowed {
        set(st, e, &ring, cost);
        let report = report_of(e, i, &st.slots.map(u64::from), lim, g, now);
        return (verdict, report);
    }
    (verdict, report_of(e, i, &ring, lim, g, now))
}

pub(crate) fn report(st: &Ring, lim: &Limit, now: u64) -> Report {
    let g = sub_window_us(lim);
    let i = now / g;
    let (e, ring) = view(st, i);
    report_of(e, i, &ring, lim, g, now)
}

/// The report at `now`, in sub-window `i`, of a ring whose counts seen from sub-window `e`
/// are `ring`.
fn report_of(e: u64, i: u64, ring: &[u64; SLOTS], lim: &Limit, g: u64, now: u64) -> Report {
    let used: u64 = ring.iter().sum();
    // the quota is whole again when the newest counted sub-window leaves the ring
    let reset_after = match ring.iter().position(|&c| c > 0) {
        Some(m) => (e - m as u64 + SLOTS as u64) * g - now,
        None => 0,
    };
    // a ring charged as of a later sub-window (a waiting check, or a clock gone back) admits
    // nothing until that sub-window begins, as `judge` has it, empty or not
    let (remaining, reset_after) = if e > i {
        (0, reset_after.max(e * g - now))
    } else {
        (lim.count().saturating_sub(used), reset_after)
    };
    Report {
        remaining,
        reset_after,
    }
}

/// When the state stops mattering: its newest sub-window has left the ring. (The script's TTL
/// in `expires`.)
pub(crate) fn expires_at(st: &Ring, lim: &Limit) -> u64 {
    if st.slots.iter().all(|&c| c == 0) {
        return 0;
    }
    (st.idx + SLOTS as u64) * sub_window_us(lim)
}

/// Gives back `cost` charged at `at`: the twin of the `refund` fragment. The charge counts in
/// the sub-window `at` falls in; its counter goes down by the cost (never below zero), or
/// nothing once that sub-window has left the ring. (A charge made while the clock stood behind
/// the state's time was counted in a later sub-window; giving it back from `at`'s then takes
/// from an older counter, which leaves the ring first: every later count stays at least what
/// it would have been without the check, so the refund never over-admits.)
pub(crate) fn refund(st: &mut Ring, lim: &Limit, at: u64, cost: u64) {
    let charged = at / sub_window_us(lim);
    if let Some(m) = st.idx.checked_sub(charged).filter(|&m| m < SLOTS as u64) {
        let slot = &mut st.slots[m as usize];
        *slot = slot.saturating_sub(u32::try_from(cost).unwrap_or(u32::MAX));
    }
}

/// The counters seen from sub-window `i`, newest first, and the sub-window they are seen from.
#[cfg(test)]
pub(super) fn counts_for_tests(st: &Ring, i: u64) -> (Vec<u64>, u64) {
    let (e, ring) = view(st, i);
    (ring.to_vec(), e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(text: &str) -> Limit {
        text.parse().unwrap()
    }

    const S: u64 = 1_000_000;

    /// Rings of every age, each with the clocks behind, at, and past their sub-window, and
    /// costs that fill them, overflow them, and overflow a counter: `f(ring, now, cost)` for
    /// each (840 cases) on the limit `20/s rolling`.
    fn each_case(mut f: impl FnMut(Ring, u64, u64)) {
        let g = sub_window_us(&limit("20/s rolling"));
        for idx in [0, 3, 400, 401, 405, 406, 1_000] {
            for slots in [
                [0; SLOTS],
                [1, 0, 0, 0, 2],
                [5, 4, 3, 2, 1],
                [0, 0, 7, 0, 0],
            ] {
                for now in [
                    399 * g,
                    400 * g,
                    400 * g + 1,
                    402 * g + 17,
                    410 * g,
                    10_000 * g,
                ] {
                    for cost in [1, 3, 20, 21, u64::MAX] {
                        f(Ring { idx, slots }, now, cost);
                    }
                }
            }
        }
    }

    #[test]
    fn a_charge_is_a_commit_then_a_report() {
        let l = limit("20/s rolling");
        let mut seen = 0;
        each_case(|st, now, cost| {
            let (mut charged, mut committed) = (st, st);
            let report = charge(&mut charged, &l, now, cost);
            commit(&mut committed, &l, now, cost);
            let then = super::report(&committed, &l, now);
            assert_eq!(
                (charged.idx, charged.slots),
                (committed.idx, committed.slots)
            );
            assert_eq!(report, then);
            seen += 1;
        });
        assert_eq!(seen, 7 * 4 * 6 * 5);
    }

    #[test]
    fn a_check_alone_is_an_evaluation_then_a_charge_or_a_report() {
        // admitted checks (charged), denied ones (left as they were), and rings charged as of
        // a later sub-window than now's
        let l = limit("20/s rolling");
        let (mut admitted, mut denied) = (0, 0);
        each_case(|st, now, cost| {
            if cost > l.count() {
                // never asked: a limiter refuses a cost its policy could never admit
                return;
            }
            let mut checked = st;
            let (verdict, report) = check_alone(&mut checked, &l, now, cost);
            let mut expected = st;
            let v = evaluate(&expected, &l, now, cost);
            let r = if v.allowed {
                admitted += 1;
                charge(&mut expected, &l, now, cost)
            } else {
                denied += 1;
                super::report(&expected, &l, now)
            };
            assert_eq!((verdict, report), (v, r));
            assert_eq!((checked.idx, checked.slots), (expected.idx, expected.slots));
        });
        assert!(
            admitted > 100 && denied > 100,
            "{admitted} admitted, {denied} denied"
        );
    }

    #[test]
    fn the_oldest_sub_window_counts_until_it_has_left_the_ring() {
        let l = limit("10/s rolling");
        let mut st = Ring::default();
        // 10 at 100 s + 0.999: the sub-window [100.75, 101)
        let t0 = 100 * S + 999_000;
        assert_eq!(evaluate(&st, &l, t0, 10), Verdict::ADMIT);
        commit(&mut st, &l, t0, 10);
        // full until that sub-window leaves the ring at 102 s, one sub-window after the
        // exact window would admit again (101.999)
        let v = evaluate(&st, &l, t0 + 1, 1);
        assert_eq!(v, Verdict::deny(102 * S));
        assert!(!evaluate(&st, &l, 102 * S - 1, 1).allowed);
        assert!(evaluate(&st, &l, 102 * S, 10).allowed);
        let r = report(&st, &l, t0);
        assert_eq!((r.remaining, r.reset_after), (0, 102 * S - t0));
        assert_eq!(expires_at(&st, &l), 102 * S);
    }

    #[test]
    fn a_denied_cost_waits_for_just_enough_sub_windows() {
        let l = limit("8/s rolling");
        let mut st = Ring::default();
        // 2 in each quarter of second 50: the ring is full
        for q in 0..4 {
            commit(&mut st, &l, 50 * S + q * 250_000 + 10, 2);
        }
        let now = 50 * S + 900_000;
        // a cost of 3 needs two quarters' counts gone: the first leaves at 51.25, the second
        // at 51.5
        assert_eq!(evaluate(&st, &l, now, 3), Verdict::deny(51 * S + 500_000));
        assert_eq!(evaluate(&st, &l, now, 1), Verdict::deny(51 * S + 250_000));
        assert_eq!(evaluate(&st, &l, now, 8), Verdict::deny(52 * S));
        let r = report(&st, &l, now);
        assert_eq!((r.remaining, r.reset_after), (0, 52 * S - now));
        // seen from later, the ring has moved on
        let r = report(&st, &l, 51 * S + 600_000);
        assert_eq!(r.remaining, 4);
    }

    /// The compact ring read back as the script's arithmetic leaves it: digits in base 1552,
    /// the sum by casting out 1551s, a shift by multiplying.
    #[test]
    fn the_compact_ring_is_five_digits() {
        let l = limit("10/s");
        let b = base(&l).unwrap();
        // one base for every count
        assert_eq!(b, 1552);
        assert_eq!(base(&limit("1550/h")), Some(b));
        assert_eq!(base(&limit("1551/h")), None);
        // counters 3, 0, 2, 4, 1 (newest first)
        let ring = 3 + 2 * b.pow(2) + 4 * b.pow(3) + b.pow(4);
        assert_eq!(ring % (b - 1), 10);
        let st = load(&l, 40 * 250_000 + 7, &[ring]);
        assert_eq!((st.idx, st.slots), (40, [3, 0, 2, 4, 1]));
        // moved on by two sub-windows: (ring % B^3) * B^2
        let moved = ring % b.pow(3) * b.pow(2);
        let (e, seen) = view(&st, 42);
        assert_eq!(e, 42);
        assert_eq!(load(&l, 42 * 250_000, &[moved]).slots.map(u64::from), seen);
        // the largest compact count fits in 2^53, the next one would not
        assert!((COMPACT_MAX + 2).pow(5) <= 1 << 53);
        assert!((COMPACT_MAX + 3).pow(5) > 1 << 53);
        assert_eq!(fields(&limit("1551/s")).len(), 5);
        let wide = load(&limit("1551/s"), 0, &[1, 2, 3, 4, 5]);
        assert_eq!(wide.slots, [1, 2, 3, 4, 5]);
    }

    #[test]
    fn a_ring_charged_ahead_of_the_clock_is_full_until_its_sub_window_begins() {
        let l = limit("5/s rolling");
        let mut st = Ring::default();
        // 5 at 10 s, then one reserved as of 11.25 s, when their sub-window has left the ring
        commit(&mut st, &l, 10 * S, 5);
        assert_eq!(
            evaluate(&st, &l, 10 * S, 1),
            Verdict::deny(11 * S + 250_000)
        );
        commit(&mut st, &l, 11 * S + 250_000, 1);
        // seen from 10.5 s the ring (as of 11.25 s) holds 1: room, but not before 11.25 s,
        // or (9.5 s, 10.5 s] would hold 6
        let at = 11 * S + 250_000;
        assert_eq!(evaluate(&st, &l, 10 * S + 500_000, 1), Verdict::deny(at));
        assert_eq!(evaluate(&st, &l, at - 1, 4), Verdict::deny(at));
        assert!(evaluate(&st, &l, at, 4).allowed);
        assert!(!evaluate(&st, &l, at, 5).allowed);
        // a cost its counts leave no room for waits for them to leave too: 1.25 s after
        assert_eq!(
            evaluate(&st, &l, 10 * S + 500_000, 5),
            Verdict::deny(12 * S + 500_000)
        );
    }

    #[test]
    fn a_clock_that_goes_back_sees_the_ring_from_its_newest_sub_window() {
        let l = limit("4/s rolling");
        let mut st = Ring::default();
        commit(&mut st, &l, 10 * S, 4);
        assert_eq!(evaluate(&st, &l, 9 * S, 1), Verdict::deny(11 * S + 250_000));
        commit(&mut st, &l, 11 * S + 250_000, 1);
        commit(&mut st, &l, 11 * S, 1);
        assert_eq!(st.idx, 45);
        assert_eq!(st.slots[0], 2);
    }
}

//! The scheduler (a leaky bucket used as a queue): each event of a key gets the next free slot at a
//! steady rate. Twin of `lua/schedule.lua`, section for section: [`place`] is its `schedule`,
//! [`give_back`] its `give_back`.
//!
//! The rate is `n` events per `w` µs, so one interval is `T = w / n` µs. The state is one
//! time, `tat`: when the queue is empty again. Placing an event of cost `c` (at most the
//! burst `b`):
//!
//! ```text
//! base = max(tat, now)            the queue's end, or now when it is empty
//! next = base + c·T               the queue's new end
//! slot = max(next - b·T, now)     when the event may go
//! ```
//!
//! The wait is `slot - now` rounded up to the µs; longer than the caller's maximum, the event
//! is rejected and the state left as it was. The script keeps times as pairs `(µs, rem)`
//! meaning `µs + rem / n`; here they are counted in units of `1/n` µs in a `u128` (below
//! 2^53 · 2^26), the same numbers exactly.

use super::{gcra, Counter, State};

/// A rate: `count` events per `window_us`, up to `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Rate {
    pub(crate) count: u64,
    pub(crate) window_us: u64,
    pub(crate) burst: u64,
}

/// A time `us + rem / count` µs, as the script packs it.
pub(crate) type Tat = (u64, u64);

/// What placing one event decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placement {
    /// Whether the event took a slot (its wait is within the caller's maximum).
    pub(crate) placed: bool,
    /// µs from now to the event's slot (rounded up): its wait, or the one it would have had.
    pub(crate) wait_us: u64,
    /// µs from now until the queue is empty: after the placement, or as it stands when
    /// rejected.
    pub(crate) drain_us: u64,
    /// The state before: as stored, or an empty queue at `now` when there was none.
    pub(crate) before: Tat,
    /// The state written (when placed).
    pub(crate) after: Tat,
}

impl Rate {
    fn units(&self, t: Tat) -> u128 {
        u128::from(t.0) * u128::from(self.count) + u128::from(t.1)
    }

    fn tat(&self, units: u128) -> Tat {
        let n = u128::from(self.count);
        ((units / n) as u64, (units % n) as u64)
    }

    /// `k·T` in units of `1/n` µs: `k·w`.
    fn times(&self, k: u64) -> u128 {
        u128::from(k) * u128::from(self.window_us)
    }

    /// Whole µs in `units`, rounded up.
    fn ceil_us(&self, units: u128) -> u64 {
        units.div_ceil(u128::from(self.count)) as u64
    }
}

/// Places an event of `cost` (`1..=burst`) at `now` when its wait is at most `longest_us`;
/// the script's `schedule` section. `st` is the stored state (`None`: no state, or expired).
pub(crate) fn place(
    st: Option<Tat>,
    rate: &Rate,
    now: u64,
    cost: u64,
    longest_us: u64,
) -> Placement {
    let now_u = rate.units((now, 0));
    let before = st.unwrap_or((now, 0));
    let base = rate.units(before).max(now_u);
    let next = base + rate.times(cost);
    let slot = next.saturating_sub(rate.times(rate.burst)).max(now_u);
    let wait_us = rate.ceil_us(slot - now_u);
    if wait_us > longest_us {
        return Placement {
            placed: false,
            wait_us,
            drain_us: rate.ceil_us(base - now_u),
            before,
            after: before,
        };
    }
    Placement {
        placed: true,
        wait_us,
        drain_us: rate.ceil_us(next - now_u),
        before,
        after: rate.tat(next),
    }
}

/// When a placed state stops mattering: the queue is empty (it then decides as no state).
pub(crate) fn expires_at(after: Tat) -> u64 {
    after.0 + u64::from(after.1 > 0)
}

/// The memory store keeps a queue's end as a GCRA state (the same pair `(µs, rem)`), under a
/// key of its own.
pub(crate) fn to_state(t: Tat) -> State {
    State::Counters(smallvec::smallvec![Counter::Gcra(gcra::load(
        0,
        &[t.0, t.1]
    ))])
}

/// The queue's end kept in `st` by [`to_state`].
pub(crate) fn from_state(st: &State) -> Option<Tat> {
    match st {
        State::Counters(c) => match c.as_slice() {
            [Counter::Gcra(g)] => Some(g.fields()),
            _ => None,
        },
        _ => None,
    }
}

/// Gives a placement's slot back when it is still the last one placed: `st` still holds
/// the state it wrote. The script's `give_back` section; returns whether it did.
pub(crate) fn give_back(st: &mut Tat, placement: &Placement) -> bool {
    if *st != placement.after {
        return false;
    }
    *st = placement.before;
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    fn rate(count: u64, window_us: u64, burst: u64) -> Rate {
        Rate {
            count,
            window_us,
            burst,
        }
    }

    /// Places `events` arrivals at `now` in turn (as if all came at once); their waits.
    fn waits(r: &Rate, now: u64, events: usize, longest: u64) -> Vec<Option<u64>> {
        let mut st = None;
        (0..events)
            .map(|_| {
                let p = place(st, r, now, 1, longest);
                if p.placed {
                    st = Some(p.after);
                }
                p.placed.then_some(p.wait_us)
            })
            .collect()
    }

    #[test]
    fn four_per_second_are_250_ms_apart_and_the_excess_is_rejected() {
        let w = waits(&rate(4, S, 1), 10 * S, 8, S);
        let ms = |v: u64| Some(v * 1000);
        assert_eq!(
            w,
            [ms(0), ms(250), ms(500), ms(750), ms(1000), None, None, None]
        );
    }

    #[test]
    fn a_fractional_interval_is_kept_exactly() {
        // 3/s: T = 333,333 1/3 µs; the third event waits 666,667 µs (rounded up), the fourth
        // exactly 1 s: no drift
        let w = waits(&rate(3, S, 1), 5 * S, 4, 10 * S);
        assert_eq!(w, [Some(0), Some(333_334), Some(666_667), Some(S)]);
        // and 3,000 events later, exactly 1,000 s later
        let w = waits(&rate(3, S, 1), 5 * S, 3001, u64::MAX);
        assert_eq!(w[3000], Some(1000 * S));
    }

    #[test]
    fn a_burst_goes_at_once_then_one_per_interval() {
        let w = waits(&rate(4, S, 3), 10 * S, 5, S);
        assert_eq!(w, [Some(0), Some(0), Some(0), Some(250_000), Some(500_000)]);
    }

    #[test]
    fn a_rejection_takes_no_slot_and_reports_the_wait() {
        let r = rate(4, S, 1);
        let first = place(None, &r, 10 * S, 1, 0);
        assert!(first.placed);
        let second = place(Some(first.after), &r, 10 * S, 1, 100_000);
        assert!(!second.placed);
        assert_eq!(second.wait_us, 250_000);
        assert_eq!(second.after, second.before);
        assert_eq!(second.drain_us, 250_000);
        // time passes: the queue empties, and the next event goes at once
        let later = place(Some(first.after), &r, 10 * S + 250_000, 1, 0);
        assert!(later.placed);
        assert_eq!(later.wait_us, 0);
    }

    #[test]
    fn a_larger_cost_takes_as_many_intervals() {
        let r = rate(4, S, 2);
        let a = place(None, &r, 10 * S, 2, S);
        assert_eq!((a.placed, a.wait_us, a.drain_us), (true, 0, 500_000));
        let b = place(Some(a.after), &r, 10 * S, 2, S);
        assert_eq!((b.placed, b.wait_us), (true, 500_000));
    }

    #[test]
    fn only_the_last_placement_comes_back() {
        let r = rate(4, S, 1);
        let now = 10 * S;
        let a = place(None, &r, now, 1, S);
        let b = place(Some(a.after), &r, now, 1, S);
        let mut st = b.after;
        // a is not the last one: its slot stays used
        assert!(!give_back(&mut st, &a));
        assert_eq!(st, b.after);
        // b is: the queue ends where it did before b, then a comes back too
        assert!(give_back(&mut st, &b));
        assert_eq!(st, a.after);
        assert!(give_back(&mut st, &a));
        assert_eq!(place(Some(st), &r, now, 1, S).wait_us, 0);
    }
}

//! GCRA, which is also how the token bucket runs (seed 002's request limiter: a bucket of
//! `burst` tokens refilled at `n` per `w` is the same automaton). Twin of `lua/gcra.lua`,
//! function for function: `FIELDS` and `load` are its `fields`, `evaluate` and `commit` its
//! fragments of the same names, `expires_at` its `expires`; `report`, and the retry time in
//! `evaluate`, are derived here from the state the script returns. `check_alone` (evaluate,
//! then commit and report, or report) composes them for the memory store.
//!
//! One emission interval is `T = w / n` µs, usually not a whole number, so times are kept
//! exactly as pairs `(us, rem)` meaning `us + rem / n`, with `0 <= rem < n`. A request of cost
//! `c` is admitted when `max(tat, now) + c·T - now <= burst·T`; it then moves `tat` to
//! `max(tat, now) + c·T`.

use super::{Report, Verdict};
use crate::policy::Limit;

/// A time `us + rem / n` µs.
type Rational = (u64, u64);

/// The theoretical arrival time, and the time of the last charge (the packed key's `T`,
/// which only a refund reads).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Tat {
    tat: Rational,
    last: u64,
}

/// The fields the script packs: the theoretical arrival time's µs and remainder.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) const FIELDS: &[&str] = &["t", "r"];

impl Tat {
    /// The theoretical arrival time as `(us, rem)`, as the script packs it.
    pub(crate) fn fields(&self) -> (u64, u64) {
        self.tat
    }
}

/// The state from the packed fields and the time `at` of the key's last charge.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn load(at: u64, fields: &[u64]) -> Tat {
    Tat {
        tat: (
            fields.first().copied().unwrap_or(0),
            fields.get(1).copied().unwrap_or(0),
        ),
        last: at,
    }
}

/// `k · T` as a rational time, without ever forming `k · w` (which could overflow).
fn times(lim: &Limit, k: u64) -> Rational {
    let (n, w) = (lim.count(), lim.window_us());
    let (q, r) = (w / n, w % n);
    let kr = k * r;
    (k * q + kr / n, kr % n)
}

fn add(lim: &Limit, a: Rational, b: Rational) -> Rational {
    let rem = a.1 + b.1;
    let n = lim.count();
    (a.0 + b.0 + rem / n, rem % n)
}

/// `a - b`, for `a >= b`.
fn sub(lim: &Limit, a: Rational, b: Rational) -> Rational {
    if a.1 >= b.1 {
        (a.0 - b.0, a.1 - b.1)
    } else {
        (a.0 - b.0 - 1, a.1 + lim.count() - b.1)
    }
}

fn le(a: Rational, b: Rational) -> bool {
    a <= b
}

fn later(a: Rational, b: Rational) -> Rational {
    if le(a, b) {
        b
    } else {
        a
    }
}

pub(crate) fn evaluate(st: &Tat, lim: &Limit, now: u64, cost: u64) -> Verdict {
    let next = add(lim, later(st.tat, (now, 0)), times(lim, cost));
    judge(lim, next, now, times(lim, lim.max_cost()))
}

/// The verdict on a cost that would move the arrival time to `next`, `tau` being the burst's
/// tolerance (`burst·T`).
fn judge(lim: &Limit, next: Rational, now: u64, tau: Rational) -> Verdict {
    if le(sub(lim, next, (now, 0)), tau) {
        return Verdict::ADMIT;
    }
    // Admitted once tat + cost·T - tau <= t.
    let x = sub(lim, next, tau);
    Verdict::deny(x.0 + u64::from(x.1 > 0))
}

pub(crate) fn commit(st: &mut Tat, lim: &Limit, now: u64, cost: u64) {
    st.tat = add(lim, later(st.tat, (now, 0)), times(lim, cost));
    st.last = st.last.max(now);
}

pub(crate) fn report(st: &Tat, lim: &Limit, now: u64) -> Report {
    report_of(
        lim,
        later(st.tat, (now, 0)),
        now,
        times(lim, lim.max_cost()),
    )
}

/// The report of the arrival time `m` (not before now), `tau` being the burst's tolerance.
fn report_of(lim: &Limit, m: Rational, now: u64, tau: Rational) -> Report {
    let fin = add(lim, (now, 0), tau);
    let remaining = if le(m, fin) {
        // floor(slack / T), exactly, in units of 1/n µs. (Lua has no 128-bit integers: the
        // script estimates with a double and corrects the estimate with times().)
        let slack = sub(lim, fin, m);
        let n = u128::from(lim.count());
        let slack = u128::from(slack.0) * n + u128::from(slack.1);
        (slack / u128::from(lim.window_us())) as u64
    } else {
        0
    };
    Report {
        remaining,
        reset_after: (m.0 + u64::from(m.1 > 0)) - now,
    }
}

/// The check of a key whose only limit this is: [`evaluate`], then [`commit`] and [`report`]
/// when it admits or else [`report`], with the arrival time as of now and the burst's
/// tolerance worked out once.
pub(crate) fn check_alone(st: &mut Tat, lim: &Limit, now: u64, cost: u64) -> (Verdict, Report) {
    let tau = times(lim, lim.max_cost());
    let m = later(st.tat, (now, 0));
    let next = add(lim, m, times(lim, cost));
    let verdict = judge(lim, next, now, tau);
    if verdict.allowed {
        // what commit does; `next` is not before now, so it is the report's arrival time
        st.tat = next;
        st.last = st.last.max(now);
        return (verdict, report_of(lim, next, now, tau));
    }
    (verdict, report_of(lim, m, now, tau))
}

/// When the state stops mattering: the theoretical arrival time, rounded up. (The script's
/// TTL in `commit`.)
pub(crate) fn expires_at(st: &Tat) -> u64 {
    st.tat.0 + u64::from(st.tat.1 > 0)
}

/// Gives back `cost` charged at `at`: the twin of the `refund` fragment.
///
/// The charge moved the arrival time to `max(tat, at) + cost·T`. Moving it back by `cost·T`
/// is the exact inverse when nothing was charged since (then `last == at`, and the result,
/// `max(tat, at)`, decides like the state before the charge at any time from `at` on; if it
/// is before now it is as good as now: a full bucket). A charge at `t` after ours may have
/// started from our arrival time where it would otherwise have started from `t`, taking up to
/// `t - at` of our `cost·T` for itself. So the refund gives back `cost·T - (last - at)` (nothing
/// when that is not positive), which is never more than what the charge still adds to the
/// arrival time, and never moves it before `last` (a charge at `last` left it at least there).
/// Should the clock go back, `last` is later than `at` and the refund gives back less.
pub(crate) fn refund(st: &mut Tat, lim: &Limit, at: u64, cost: u64) {
    if st.last < at {
        // the state was not charged at `at`: it was replaced since
        return;
    }
    let c = times(lim, cost);
    let since = st.last - at;
    if c <= (since, 0) {
        return;
    }
    let give = (c.0 - since, c.1);
    let floor = (st.last, 0);
    st.tat = if le(add(lim, floor, give), st.tat) {
        sub(lim, st.tat, give)
    } else {
        floor
    };
}

/// The theoretical arrival time.
#[cfg(test)]
pub(super) fn tat_for_tests(st: &Tat) -> (u64, u64) {
    st.tat
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_alone_is_an_evaluation_then_a_commit_and_a_report_or_a_report() {
        // emission intervals that are whole and that are not, bursts below, at and above the
        // count; arrival times behind now, at it, within the burst and past it
        let (mut admitted, mut denied) = (0, 0);
        for text in [
            "20/s gcra",
            "7/s gcra burst=3",
            "3/s gcra burst=50",
            "1/h gcra",
        ] {
            let lim: Limit = text.parse().unwrap();
            let now = 1_000 * 3_600_000_000;
            for k in [0, 1, 2, 3, 7, 20, 60] {
                for tat in [(0, 0), (now, 0), add(&lim, (now, 0), times(&lim, k))] {
                    for last in [0, now - 1, now] {
                        for cost in [1, 2, 3, 7, 21, 50, 51] {
                            let st = Tat { tat, last };
                            let mut checked = st;
                            let (verdict, report) = check_alone(&mut checked, &lim, now, cost);
                            let mut expected = st;
                            let v = evaluate(&expected, &lim, now, cost);
                            if v.allowed {
                                admitted += 1;
                                commit(&mut expected, &lim, now, cost);
                            } else {
                                denied += 1;
                            }
                            let r = super::report(&expected, &lim, now);
                            assert_eq!((verdict, report), (v, r), "{text} {tat:?} {cost}");
                            assert_eq!((checked.tat, checked.last), (expected.tat, expected.last));
                        }
                    }
                }
            }
        }
        assert!(
            admitted > 200 && denied > 200,
            "{admitted} admitted, {denied} denied"
        );
    }
}

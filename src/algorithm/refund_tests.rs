//! The twins' `refund`: a check and its refund leave a state that decides like the state
//! before the check, for every algorithm, cost and time; a refund never gives back more than
//! the charge still holds.

use super::*;

const LEASE: &str = "lease-refunded";

fn limits(policy: &str) -> Vec<Limit> {
    policy.parse::<crate::Policy>().unwrap().limits().to_vec()
}

/// One policy per algorithm, and all of them together.
const POLICIES: [&str; 8] = [
    "10/s",
    "10/s fixed",
    "10/s gcra",
    "7/3s gcra burst=4",
    "10/s bucket capacity=20",
    "10/s log",
    "3 concurrent",
    "10/s, 20/min fixed, 7/3s gcra burst=4, 10/s log, 3 concurrent",
];

/// A second, aligned to the epoch; every time below is after it.
const T0: u64 = 1_767_225_600_000_000;

struct World {
    limits: Vec<Limit>,
    layout: Layout,
    states: Vec<Option<State>>,
}

impl World {
    fn new(policy: &str, ids: usize) -> World {
        let limits = limits(policy);
        let layout = Layout::of(&limits);
        let states = (0..ids * layout.keys_per_id()).map(|_| None).collect();
        World {
            limits,
            layout,
            states,
        }
    }

    fn check(&mut self, now: u64, cost: u64, lease: &str) -> Outcome {
        decide(
            &mut self.states,
            &self.layout,
            &self.limits,
            now,
            cost,
            lease,
        )
    }

    fn refund(&mut self, at: u64, cost: u64, lease: &str) {
        refund(
            &mut self.states,
            &self.layout,
            &self.limits,
            at,
            cost,
            lease,
        );
    }

    /// The largest window of the policy.
    fn w(&self) -> u64 {
        self.limits.iter().map(Limit::window_us).max().unwrap()
    }

    fn max_cost(&self) -> u64 {
        self.limits.iter().map(Limit::max_cost).min().unwrap()
    }

    /// What checks of every cost would decide at a few times from `from` on (on copies: the
    /// state is not changed).
    fn probes(&self, from: u64) -> Vec<Outcome> {
        let w = self.w();
        let mut out = Vec::new();
        for dt in [0, 1, w / 3, w - 1, w, w + w / 2, 2 * w, 3 * w] {
            for cost in 1..=self.max_cost().min(12) {
                let mut states = self.states.clone();
                out.push(decide(
                    &mut states,
                    &self.layout,
                    &self.limits,
                    from + dt,
                    cost,
                    "probe",
                ));
            }
        }
        out
    }
}

/// A few histories before the check: none, charges earlier in the check's window, in the
/// window before, long before.
fn histories(w: u64) -> Vec<Vec<(u64, u64)>> {
    vec![
        vec![],
        vec![(T0 + 100, 2), (T0 + 2_000, 1)],
        vec![(T0 - w / 2, 3), (T0 + 5, 2)],
        vec![(T0 - 5 * w, 4)],
        vec![(T0 - w + 1, 1), (T0 - 1, 2), (T0, 1)],
    ]
}

#[test]
fn a_check_and_its_refund_leave_the_state_as_it_decided() {
    for policy in POLICIES {
        let probe = World::new(policy, 2);
        let w = probe.w();
        for history in histories(w) {
            for cost in [1, 2, 3, probe.max_cost()] {
                for delay in [0, 10, 2 * w] {
                    let mut world = World::new(policy, 2);
                    for (k, &(t, c)) in history.iter().enumerate() {
                        let _ = world.check(t, c, &format!("old-{k}"));
                    }
                    let now = T0 + 3_000;
                    let before = world.probes(now);
                    let before_later = world.probes(now + delay);
                    let out = world.check(now, cost, LEASE);
                    if !out.allowed {
                        // a state this history fills: nothing was charged
                        assert_eq!(world.probes(now), before, "{policy} {history:?} {cost}");
                        continue;
                    }
                    assert_eq!(out.at_us, now);
                    assert_ne!(world.probes(now), before, "{policy}: the check charged");
                    // the refund at the check's time, whenever it runs
                    world.refund(out.at_us, cost, LEASE);
                    assert_eq!(world.probes(now), before, "{policy} {history:?} {cost}");
                    assert_eq!(
                        world.probes(now + delay),
                        before_later,
                        "{policy} {history:?} cost {cost} delay {delay}"
                    );
                }
            }
        }
    }
}

/// Counters are restored exactly: the same counts, seen from any time after the check.
#[test]
fn counters_are_restored_exactly() {
    for policy in ["10/s", "10/s fixed", "10/min, 5/s fixed"] {
        let mut world = World::new(policy, 1);
        let _ = world.check(T0 + 10, 3, "");
        let _ = world.check(T0 + 1_000_100, 2, "");
        let before = world.states.clone();
        let out = world.check(T0 + 1_000_200, 3, "");
        assert!(out.allowed, "{policy}");
        world.refund(out.at_us, 3, "");
        let counts = |states: &[Option<State>], now: u64| -> Vec<(u64, u64)> {
            match &states[0] {
                Some(State::Counters(c)) => c
                    .iter()
                    .zip(&world.limits)
                    .map(|(c, l)| match c {
                        Counter::Window(s) => {
                            sliding_window::counts_for_tests(s, now / l.window_us())
                        }
                        Counter::Fixed(s) => fixed_window::counts_for_tests(s, now / l.window_us()),
                        Counter::Gcra(_) => unreachable!(),
                    })
                    .collect(),
                _ => panic!("no packed state"),
            }
        };
        for now in [T0 + 1_000_200, T0 + 1_500_000, T0 + 2_000_000] {
            assert_eq!(counts(&world.states, now), counts(&before, now), "{policy}");
        }
    }
}

/// A refund that comes after the check's window moved on gives back from the window the
/// charge is in (the previous one, for the sliding window), or nothing once that window no
/// longer counts; the log and the slots give back exactly; the result decides as if the check
/// had never run.
#[test]
fn a_refund_after_the_window_moved_on() {
    for policy in [
        "10/s",
        "10/s fixed",
        "10/s log",
        "3 concurrent",
        "10/s, 10/s log",
    ] {
        for (cost, later) in [(1, 1_000_000), (4, 1_000_000), (3, 2_300_000), (2, 700_000)] {
            let mut charged = World::new(policy, 1);
            let mut clean = World::new(policy, 1);
            for world in [&mut charged, &mut clean] {
                assert!(world.check(T0 + 500_000, 2, "old").allowed);
            }
            let at = T0 + 900_000;
            assert!(charged.check(at, cost, LEASE).allowed);
            // another request, in a later window, admitted either way
            let t2 = at + later;
            assert!(charged.check(t2, 1, "next").allowed, "{policy}");
            assert!(clean.check(t2, 1, "next").allowed, "{policy}");
            charged.refund(at, cost, LEASE);
            assert_eq!(
                charged.probes(t2),
                clean.probes(t2),
                "{policy} {cost} {later}"
            );
        }
    }
}

/// GCRA: with nothing charged since, the arrival time goes back by cost·T exactly; a charge
/// that came after ours may have used part of it, so the refund gives back less, never more:
/// the refunded state admits nothing the state without the check would deny.
#[test]
fn a_gcra_refund_never_gives_back_more_than_the_charge_holds() {
    for policy in ["10/s gcra", "7/3s gcra burst=4", "10/s bucket capacity=20"] {
        for (cost, gap) in [(1, 0), (1, 50_000), (3, 150_000), (3, 10), (2, 400_000)] {
            let mut charged = World::new(policy, 1);
            let mut clean = World::new(policy, 1);
            for world in [&mut charged, &mut clean] {
                assert!(world.check(T0, 2, "").allowed);
            }
            // the bucket refilled: the state is as good as empty at `at`
            let at = T0 + 5_000_000;
            assert!(charged.check(at, cost, "").allowed);
            let t2 = at + gap;
            assert!(charged.check(t2, 1, "").allowed);
            assert!(clean.check(t2, 1, "").allowed);
            charged.refund(at, cost, "");
            let (a, b) = (charged.probes(t2), clean.probes(t2));
            for (x, y) in a.iter().zip(&b) {
                assert!(
                    !x.allowed || y.allowed,
                    "{policy} {cost} {gap}: {x:?} {y:?}"
                );
                for (ex, ey) in x.entries.iter().zip(&y.entries) {
                    assert!(ex.remaining <= ey.remaining, "{policy} {cost} {gap}");
                }
            }
            let tat = |w: &World| match &w.states[0] {
                Some(State::Counters(c)) => match c[0] {
                    Counter::Gcra(s) => gcra::tat_for_tests(&s),
                    _ => unreachable!(),
                },
                _ => panic!("no state"),
            };
            let (n, window) = (charged.limits[0].count(), charged.limits[0].window_us());
            // in units of 1/n µs: the refunded arrival time is later than the clean one by
            // what the later charge took of ours, at most the gap
            let units = |(us, rem): (u64, u64)| u128::from(us) * u128::from(n) + u128::from(rem);
            let over = units(tat(&charged)) - units(tat(&clean));
            let ours = u128::from(cost) * u128::from(window);
            assert!(
                over <= (u128::from(gap) * u128::from(n)).min(ours),
                "{policy}"
            );
            if gap == 0 {
                assert_eq!(over, 0, "{policy}: nothing charged since: exact");
            }
        }
    }
}

/// A refund of a state that was never charged changes nothing and creates nothing; a lease
/// that is not there is not missed.
#[test]
fn a_missing_state_stays_missing() {
    for policy in POLICIES {
        let mut world = World::new(policy, 2);
        world.refund(T0, 1, LEASE);
        assert!(world.states.iter().all(Option::is_none), "{policy}");
    }
    let mut world = World::new("3 concurrent", 1);
    assert!(world.check(T0, 1, "mine").allowed);
    world.refund(T0, 1, "not-mine");
    // (a probe takes a slot of its own)
    assert_eq!(world.probes(T0)[0].entries[0].remaining, 1);
    world.refund(T0, 1, "mine");
    assert_eq!(world.probes(T0)[0].entries[0].remaining, 2);
}

/// The log gives back `cost` entries of the charge's time, even among others of the same
/// time, and never more than there are.
#[test]
fn the_log_gives_back_entries_of_the_charge_time() {
    let mut world = World::new("10/s log", 1);
    assert!(world.check(T0, 3, "").allowed);
    assert!(world.check(T0 + 7, 2, "").allowed);
    assert!(world.check(T0 + 7, 1, "").allowed);
    world.refund(T0 + 7, 2, "");
    // (a probe charges 1 itself)
    assert_eq!(world.probes(T0 + 7)[0].entries[0].remaining, 5);
    world.refund(T0 + 7, 5, "");
    assert_eq!(world.probes(T0 + 7)[0].entries[0].remaining, 6);
    // nothing at that time any more, and the entries of other times stay
    world.refund(T0 + 7, 5, "");
    world.refund(T0 + 8, 5, "");
    assert_eq!(world.probes(T0 + 7)[0].entries[0].remaining, 6);
}

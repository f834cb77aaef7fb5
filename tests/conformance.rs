//! One suite, run unchanged against the memory store, a real `redis-server` and a Redis Cluster
//! of three masters: same scenarios, same decisions. Time comes from a manual clock shared by
//! the test and the store. In the cluster, the identifiers of most multi-identifier checks
//! live in different hash slots, so those checks run split, one call per slot.

mod common;

use std::time::Duration;

use common::{manual_clock, ClusterServer, RedisServer};
use tollgate::{Clock, Decision, Error, Limiter, ManualClock, MemoryStore, Store};

struct Env {
    clock: ManualClock,
    store: Store,
    _server: Option<RedisServer>,
}

impl Env {
    async fn memory() -> Env {
        let clock = manual_clock();
        let store = MemoryStore::builder()
            .clock(Clock::Manual(clock.clone()))
            .build();
        Env {
            clock,
            store: store.into(),
            _server: None,
        }
    }

    async fn redis() -> Env {
        let server = RedisServer::start();
        let clock = manual_clock();
        let store = server.store(Clock::Manual(clock.clone())).await;
        Env {
            clock,
            store: store.into(),
            _server: Some(server),
        }
    }

    /// A store of its own (its own prefix) on the cluster shared by this test binary.
    async fn cluster() -> Env {
        let clock = manual_clock();
        let store = ClusterServer::shared()
            .store(Clock::Manual(clock.clone()))
            .await;
        Env {
            clock,
            store: store.into(),
            _server: None,
        }
    }

    fn limiter(&self, policy: &str) -> Limiter {
        Limiter::new(self.store.clone(), policy.parse().unwrap())
    }

    fn advance_ms(&self, ms: u64) {
        self.clock.advance(Duration::from_millis(ms));
    }

    fn advance_us(&self, us: u64) {
        self.clock.advance(Duration::from_micros(us));
    }
}

async fn check(l: &Limiter, ids: &[&str]) -> Decision {
    l.check(ids).await.unwrap()
}

async fn admitted_of(l: &Limiter, ids: &[&str], n: usize) -> usize {
    let mut k = 0;
    for _ in 0..n {
        if check(l, ids).await.is_allowed() {
            k += 1;
        }
    }
    k
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(#[tokio::test] async fn $name() { super::$name(super::Env::memory().await).await })*
        }
        mod redis {
            $(#[tokio::test] async fn $name() { super::$name(super::Env::redis().await).await })*
        }
        mod cluster {
            $(#[tokio::test] async fn $name() { super::$name(super::Env::cluster().await).await })*
        }
    };
}

conformance!(
    stripe_request_limiter,
    stripe_burst_with_fractional_refill,
    seed_003_fixed_windows_two_identifiers,
    seed_003_every_limit_binds,
    rolling_window_edge,
    same_microsecond_requests_all_count,
    denied_requests_charge_nothing,
    retry_after_is_exact,
    weighted_costs,
    impossible_costs_are_errors,
    duplicate_identifiers_count_once,
    long_and_hostile_identifiers,
    rolling_window_boundaries,
    rolling_window_weighted_costs,
    rolling_window_all_or_nothing,
    rolling_window_never_over_admits,
    a_denial_in_one_slot_charges_no_other,
);

/// Seed 002's test: a burst of `capacity` admitted, the next denied; one second later exactly
/// `rate` more admitted, then denied.
async fn stripe_request_limiter(env: Env) {
    let l = env.limiter("100/s bucket capacity=500");
    assert_eq!(admitted_of(&l, &["user:1"], 500).await, 500);
    let d = check(&l, &["user:1"]).await;
    assert!(!d.is_allowed());
    assert_eq!(d.retry_after(), Some(Duration::from_millis(10)));
    env.advance_ms(1000);
    assert_eq!(admitted_of(&l, &["user:1"], 100).await, 100);
    assert!(!check(&l, &["user:1"]).await.is_allowed());
    // another user is untouched
    assert_eq!(check(&l, &["user:2"]).await.statuses()[0].remaining, 499);
}

/// The same with a rate whose emission interval is not a whole number of microseconds.
async fn stripe_burst_with_fractional_refill(env: Env) {
    for policy in ["3/s bucket capacity=5", "3/s gcra burst=5", "7/3s gcra"] {
        let l = env.limiter(policy);
        let (rate, burst) = match policy {
            "7/3s gcra" => (7, 7),
            _ => (3, 5),
        };
        let id = policy;
        assert_eq!(admitted_of(&l, &[id], burst + 2).await, burst, "{policy}");
        let window = if policy == "7/3s gcra" { 3000 } else { 1000 };
        env.advance_ms(window);
        assert_eq!(admitted_of(&l, &[id], rate + 2).await, rate, "{policy}");
        // and again: no drift from rounding
        env.advance_ms(window);
        assert_eq!(admitted_of(&l, &[id], rate + 2).await, rate, "{policy}");
    }
}

/// Seed 003's policy, as fixed windows, for an IP and a user in one check: each of the three
/// limits is driven past, in turn, at exactly the expected request.
async fn seed_003_fixed_windows_two_identifiers(env: Env) {
    let l = env.limiter("10/s fixed, 120/min fixed, 240/h fixed");
    let ids = ["ip:198.51.100.7", "user:ada"];
    // 12 seconds of 10 requests fill the minute; the 11th of each second hits 10/s.
    for second in 0..12 {
        assert_eq!(admitted_of(&l, &ids, 10).await, 10, "second {second}");
        let d = check(&l, &ids).await;
        // In second 11 the minute is full too, and it holds the request back longer.
        let (binding, wait) = if second < 11 { (0, 1) } else { (1, 49) };
        assert_eq!(d.denied_by().unwrap().limit_index, binding);
        assert_eq!(d.retry_after(), Some(Duration::from_secs(wait)));
        env.advance_ms(1000);
    }
    let d = check(&l, &ids).await;
    assert_eq!(
        d.denied_by().unwrap().limit_index,
        1,
        "120/min binds at second 12"
    );
    assert_eq!(d.retry_after(), Some(Duration::from_secs(48)));
    env.advance_ms(48_000);
    for _ in 0..12 {
        assert_eq!(admitted_of(&l, &ids, 10).await, 10);
        env.advance_ms(1000);
    }
    env.advance_ms(48_000);
    let d = check(&l, &ids).await;
    assert_eq!(
        d.denied_by().unwrap().limit_index,
        2,
        "240/h binds in minute 2"
    );
    assert_eq!(d.retry_after(), Some(Duration::from_secs(3600 - 120)));
    // Every pair reports: both identifiers are at 0 for the hour.
    let hour: Vec<_> = d.statuses().iter().filter(|s| s.limit_index == 2).collect();
    assert_eq!(hour.len(), 2);
    assert!(hour.iter().all(|s| s.remaining == 0 && !s.allowed));

    // The IP is exhausted for the hour; a second user behind it is denied by the IP's limits
    // only, and is charged nothing.
    let d = check(&l, &["ip:198.51.100.7", "user:bob"]).await;
    assert!(!d.is_allowed());
    assert_eq!(d.denied_by().unwrap().identifier, 0, "{d:#?}");
    for s in d.statuses().iter().filter(|s| s.identifier == 1) {
        assert!(s.allowed);
        assert_eq!(s.remaining, s.limit.count(), "user:bob charged nothing");
    }
    // and after the hour, everything is back
    env.advance_ms(3600 * 1000);
    assert!(check(&l, &ids).await.is_allowed());
}

/// Driving seed 003's policy at 11 requests per second, every algorithm eventually denies
/// with each of its three limits, and never admits more than 10 in a second, 120 in a minute
/// or 240 in the hour.
async fn seed_003_every_limit_binds(env: Env) {
    for alg in ["log", "sliding", "fixed", "rolling"] {
        let l = env.limiter(&format!("10/s {alg}, 120/min {alg}, 240/h {alg}"));
        let ids = [&*format!("ip:{alg}"), "user:x"];
        let mut binding = [0u32; 3];
        let mut per_second = Vec::new();
        for _ in 0..180 {
            let mut admitted = 0;
            for _ in 0..11 {
                let d = check(&l, &ids).await;
                match d.denied_by() {
                    None => admitted += 1,
                    Some(s) => binding[s.limit_index] += 1,
                }
            }
            per_second.push(admitted);
            env.advance_ms(1000);
        }
        assert!(binding.iter().all(|&b| b > 0), "{alg}: {binding:?}");
        assert!(per_second.iter().all(|&a| a <= 10), "{alg}");
        for m in per_second.windows(60) {
            assert!(m.iter().sum::<usize>() <= 120, "{alg}");
        }
        assert_eq!(per_second.iter().sum::<usize>(), 240, "{alg}");
        // start the next algorithm in a fresh hour
        env.advance_ms(3 * 3600 * 1000);
    }
}

/// Seed 000: with 10/s as a sliding log, 10 requests at t=0.999 s and 10 at t=1.000 s are not
/// all admitted. (A fixed window admits all 20: that is the difference.)
async fn rolling_window_edge(env: Env) {
    let log = env.limiter("10/s log");
    let fixed = env.limiter("10/s fixed");
    let rolling = env.limiter("10/s rolling");
    env.advance_ms(999);
    assert_eq!(admitted_of(&log, &["a"], 10).await, 10);
    assert_eq!(admitted_of(&fixed, &["a"], 10).await, 10);
    assert_eq!(admitted_of(&rolling, &["a"], 10).await, 10);
    env.advance_ms(1);
    assert_eq!(admitted_of(&log, &["a"], 10).await, 0);
    assert_eq!(admitted_of(&fixed, &["a"], 10).await, 10);
    assert_eq!(admitted_of(&rolling, &["a"], 10).await, 0);
    // the log admits again exactly when the first entries leave the window
    env.advance_ms(998);
    assert_eq!(admitted_of(&log, &["a"], 1).await, 0);
    env.advance_ms(1);
    assert_eq!(admitted_of(&log, &["a"], 20).await, 10);
    // the rolling window once their sub-window (0.75–1 s) has left its ring, at 2 s: a
    // quarter of a window later at most
    assert_eq!(admitted_of(&rolling, &["a"], 1).await, 0);
    env.advance_ms(1);
    assert_eq!(admitted_of(&rolling, &["a"], 20).await, 10);
}

/// 100 requests within the same microsecond are all counted.
async fn same_microsecond_requests_all_count(env: Env) {
    for policy in [
        "100/s log",
        "100/s sliding",
        "100/s fixed",
        "100/s gcra",
        "100/s rolling",
    ] {
        let l = env.limiter(policy);
        assert_eq!(admitted_of(&l, &["same"], 100).await, 100, "{policy}");
        let d = check(&l, &["same"]).await;
        assert!(!d.is_allowed(), "{policy}");
        assert_eq!(d.statuses()[0].remaining, 0, "{policy}");
    }
}

/// A denied request leaves every other limit and identifier as it was.
async fn denied_requests_charge_nothing(env: Env) {
    let l = env.limiter("2/s fixed, 10/s log, 10/s sliding, 10/s gcra, 10/s bucket capacity=20");
    assert_eq!(admitted_of(&l, &["a", "b"], 2).await, 2);
    let before = check(&l, &["a", "b"]).await;
    assert_eq!(before.denied_by().unwrap().limit_index, 0);
    for _ in 0..50 {
        let d = check(&l, &["a", "b"]).await;
        assert_eq!(d, before, "repeated denials change nothing");
    }
    let remaining: Vec<u64> = before.statuses().iter().map(|s| s.remaining).collect();
    assert_eq!(remaining, [0, 8, 8, 8, 18, 0, 8, 8, 8, 18]);
    // "c" next to the exhausted "a": denied, and "c" has its whole quota afterwards
    assert!(!check(&l, &["a", "c"]).await.is_allowed());
    let c = check(&l, &["c"]).await;
    assert!(c.is_allowed());
    let remaining: Vec<u64> = c.statuses().iter().map(|s| s.remaining).collect();
    assert_eq!(remaining, [1, 9, 9, 9, 19]);
}

/// `retry_after` is exact: denied a millisecond (and a microsecond) before it, admitted at it.
async fn retry_after_is_exact(env: Env) {
    let policies = [
        "5/s log",
        "4/700ms log",
        "5/s sliding",
        "7/1300ms sliding",
        "5/s rolling",
        "7/1300ms rolling",
        "5/s fixed",
        "3/s gcra burst=2",
        "7/s bucket capacity=3",
        "11/min gcra burst=4",
        "5/s sliding, 9/3s log, 20/min fixed",
        "5/s, 9/3s log, 20/min fixed",
        "5/s, 12/3s, 20/min gcra burst=3",
    ];
    // an irregular but reproducible walk
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut step = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % 400_000
    };
    for policy in policies {
        let l = env.limiter(policy);
        for cost in [1, 2] {
            let id = format!("{policy}/{cost}");
            for _round in 0..6 {
                // spend until denied
                let denied = loop {
                    let d = l.check_n(&[&id], cost).await.unwrap();
                    if !d.is_allowed() {
                        break d;
                    }
                    env.advance_us(step() / 4);
                };
                let wait = denied.retry_after().unwrap();
                assert!(wait > Duration::ZERO, "{policy}");
                let wait_us = wait.as_micros() as u64;
                if wait_us > 1000 {
                    env.advance_us(wait_us - 1000);
                    let d = l.check_n(&[&id], cost).await.unwrap();
                    assert!(!d.is_allowed(), "{policy} cost {cost}: admitted 1 ms early");
                    env.advance_us(999);
                } else {
                    env.advance_us(wait_us - 1);
                }
                let d = l.check_n(&[&id], cost).await.unwrap();
                assert!(!d.is_allowed(), "{policy} cost {cost}: admitted 1 µs early");
                env.advance_us(1);
                let d = l.check_n(&[&id], cost).await.unwrap();
                assert!(
                    d.is_allowed(),
                    "{policy} cost {cost}: denied at retry_after"
                );
                env.advance_us(step());
            }
        }
    }
}

/// A request may cost more than 1.
async fn weighted_costs(env: Env) {
    for policy in [
        "10/s log",
        "10/s sliding",
        "10/s fixed",
        "10/s gcra",
        "10/s bucket",
        "10/s rolling",
    ] {
        let l = env.limiter(policy);
        let d = l.check_n(&["w"], 7).await.unwrap();
        assert!(d.is_allowed(), "{policy}");
        assert_eq!(d.statuses()[0].remaining, 3, "{policy}");
        assert_eq!(d.cost(), 7);
        assert!(
            !l.check_n(&["w"], 4).await.unwrap().is_allowed(),
            "{policy}"
        );
        assert!(l.check_n(&["w"], 3).await.unwrap().is_allowed(), "{policy}");
        env.advance_ms(5000);
    }
}

/// A cost that no limit could ever admit is an error, not an eternal denial.
async fn impossible_costs_are_errors(env: Env) {
    let l = env.limiter("10/s, 5/s gcra burst=8");
    assert!(matches!(
        l.check_n(&["x"], 9).await,
        Err(Error::Cost { cost: 9, max: 8 })
    ));
    assert!(matches!(
        l.check_n(&["x"], 0).await,
        Err(Error::Cost { .. })
    ));
    assert!(l.check_n(&["x"], 8).await.unwrap().is_allowed());
    let none: [&str; 0] = [];
    assert!(matches!(l.check(&none).await, Err(Error::NoIdentifiers)));
    let many: Vec<String> = (0..17).map(|i| i.to_string()).collect();
    assert!(matches!(
        l.check(&many).await,
        Err(Error::TooManyIdentifiers(17))
    ));
    // a caller's long list, each identifier twice: its distinct ones counted (in a set: each
    // compared with every other, this took seconds)
    let long: Vec<String> = (0..40_000).map(|i| (i % 20_000).to_string()).collect();
    assert!(matches!(
        l.check(&long).await,
        Err(Error::TooManyIdentifiers(20_000))
    ));
}

/// The same identifier twice is one identifier (it must not be charged twice).
async fn duplicate_identifiers_count_once(env: Env) {
    let l = env.limiter("4/s log");
    let d = check(&l, &["dup", "dup"]).await;
    assert_eq!(d.statuses().len(), 1);
    assert_eq!(d.statuses()[0].remaining, 3);
    assert_eq!(admitted_of(&l, &["dup", "other", "dup"], 5).await, 3);
}

/// Two identifiers in different hash slots of a cluster (`ip:1.2.3.4` in slot 5271, `user:42`
/// in 15880): while the IP is exhausted, checks of both are denied and leave the user's quota
/// whole, in every store.
async fn a_denial_in_one_slot_charges_no_other(env: Env) {
    let l = env.limiter("2/min fixed, 5/min log, 5/min gcra");
    let both = ["ip:1.2.3.4", "user:42"];
    assert_eq!(admitted_of(&l, &["ip:1.2.3.4"], 3).await, 2);
    for _ in 0..10 {
        let d = check(&l, &both).await;
        assert!(!d.is_allowed());
        assert_eq!(d.denied_by().unwrap().identifier, 0, "{d:#?}");
        for s in d.statuses().iter().filter(|s| s.identifier == 1) {
            assert!(s.allowed);
            assert_eq!(s.remaining, s.limit.count(), "user:42 charged: {d:#?}");
        }
    }
    let user = check(&l, &["user:42"]).await;
    assert!(user.is_allowed());
    let remaining: Vec<u64> = user.statuses().iter().map(|s| s.remaining).collect();
    assert_eq!(
        remaining,
        [1, 4, 4],
        "no charge left behind on user:42's slot"
    );
    assert_eq!(admitted_of(&l, &["user:42"], 3).await, 1);
}

/// Identifiers are free text: braces, `%`, `#`, 10 KB values, and none of them collide.
async fn long_and_hostile_identifiers(env: Env) {
    let l = env.limiter("1/min");
    let big = "k".repeat(10 * 1024);
    let mut bigger = big.clone();
    bigger.push('!');
    let ids = [
        "a", "a}", "{a}", "a%7D", "#a", "%23a", "", "}{", &*big, &*bigger, "ключ", "a\0b",
    ];
    for id in ids {
        assert!(check(&l, &[id]).await.is_allowed(), "{id:.20}");
    }
    for id in ids {
        assert!(!check(&l, &[id]).await.is_allowed(), "{id:.20}");
    }
}

/// The rolling window at its boundaries: a charge counts, in full, until its sub-window (a
/// quarter of the window, aligned to the epoch) has left the ring, and not a microsecond
/// longer; the report says when the whole quota is back.
async fn rolling_window_boundaries(env: Env) {
    let l = env.limiter("8/s");
    // 2 per quarter of a second: 0.0, 0.25, 0.5, 0.75 (the manual clock starts on a second)
    for q in 0..4 {
        assert_eq!(admitted_of(&l, &["q"], 2).await, 2, "quarter {q}");
        env.advance_ms(250);
    }
    // at 1.0 s the ring holds all four quarters: the first has just left the exact window
    // but its sub-window is still in the ring (0.0–0.25 leaves at 1.25)
    let d = check(&l, &["q"]).await;
    assert!(!d.is_allowed());
    assert_eq!(d.retry_after(), Some(Duration::from_millis(250)));
    assert_eq!(d.statuses()[0].remaining, 0);
    // the whole quota is back when the newest charge (0.75–1.0) has left the ring, at 2.0 s
    assert_eq!(d.statuses()[0].reset_after, Duration::from_secs(1));
    env.advance_us(249_999);
    assert!(!check(&l, &["q"]).await.is_allowed());
    env.advance_us(1);
    // 1.25 s: the first quarter is gone, two fit
    assert_eq!(admitted_of(&l, &["q"], 3).await, 2);
    let d = check(&l, &["q"]).await;
    assert_eq!(d.retry_after(), Some(Duration::from_millis(250)));
    // a long silence: the ring is empty again
    env.advance_ms(1_250);
    let d = check(&l, &["q"]).await;
    assert!(d.is_allowed());
    assert_eq!(d.statuses()[0].remaining, 7);
    // reset: this sub-window (2.5–2.75) leaves the ring at 3.75
    assert_eq!(d.statuses()[0].reset_after, Duration::from_millis(1_250));
}

/// Costs above 1: a cost fits only whole, and a denied one waits for as many sub-windows as
/// it takes to leave room for all of it.
async fn rolling_window_weighted_costs(env: Env) {
    let l = env.limiter("10/s rolling");
    assert!(l.check_n(&["w"], 4).await.unwrap().is_allowed());
    env.advance_ms(300);
    assert!(l.check_n(&["w"], 4).await.unwrap().is_allowed());
    env.advance_ms(300);
    let d = l.check_n(&["w"], 3).await.unwrap();
    assert!(!d.is_allowed());
    assert_eq!(d.statuses()[0].remaining, 2);
    // 4 at 0.0 leave the ring at 1.25 s: 0.65 s from 0.6
    assert_eq!(d.retry_after(), Some(Duration::from_millis(650)));
    // a cost of 9 must wait for the 4 at 0.3 s too: they leave at 1.5 s
    let d = l.check_n(&["w"], 9).await.unwrap();
    assert_eq!(d.retry_after(), Some(Duration::from_millis(900)));
    assert!(l.check_n(&["w"], 2).await.unwrap().is_allowed());
    env.advance_ms(650);
    assert!(!l.check_n(&["w"], 7).await.unwrap().is_allowed());
    assert!(l.check_n(&["w"], 4).await.unwrap().is_allowed());
}

/// With other limits, in one check for two identifiers: all or nothing, and each pair reports
/// its own figures.
async fn rolling_window_all_or_nothing(env: Env) {
    let l = env.limiter("3/s, 5/min, 4/s log");
    let ids = ["ip:1", "user:1"];
    assert_eq!(admitted_of(&l, &ids, 5).await, 3);
    // "user:2" behind the exhausted IP: denied by the IP's 3/s, charged nothing
    let d = check(&l, &["ip:1", "user:2"]).await;
    assert!(!d.is_allowed());
    let by = d.denied_by().unwrap();
    assert_eq!((by.identifier, by.limit_index), (0, 0));
    for s in d.statuses().iter().filter(|s| s.identifier == 1) {
        assert!(s.allowed);
        assert_eq!(s.remaining, s.limit.count(), "user:2 charged nothing");
    }
    // after the ring has let go of the three, the minute binds: 2 more
    env.advance_ms(1_250);
    assert_eq!(admitted_of(&l, &ids, 3).await, 2);
    let d = check(&l, &ids).await;
    assert_eq!(d.denied_by().unwrap().limit_index, 1);
    // the minute's first quarter (0–15 s) leaves its ring at 75 s
    assert_eq!(d.retry_after(), Some(Duration::from_millis(75_000 - 1_250)));
    assert!(check(&l, &["user:2"]).await.is_allowed());
}

/// Bursts at every offset around the sub-window edges: no interval of one window ever holds
/// more than the limit.
async fn rolling_window_never_over_admits(env: Env) {
    let l = env.limiter("6/s");
    let mut admitted = Vec::new();
    let mut now = 0u64;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..400 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        // around sub-window edges (250 ms), or anywhere
        let dt = match seed % 4 {
            0 => 250_000 - now % 250_000 - 1,
            1 => 250_000 - now % 250_000,
            2 => seed % 1_000,
            _ => seed % 300_000,
        };
        env.advance_us(dt);
        now += dt;
        let cost = 1 + (seed >> 20) % 3;
        if l.check_n(&["o"], cost).await.unwrap().is_allowed() {
            admitted.extend(std::iter::repeat_n(now, cost as usize));
        }
    }
    assert!(admitted.len() > 100, "{}", admitted.len());
    for (i, &t) in admitted.iter().enumerate() {
        let inside = admitted[i..]
            .iter()
            .take_while(|&&u| u < t + 1_000_000)
            .count();
        assert!(inside <= 6, "{inside} admitted in the second from {t} µs");
    }
}

mod concurrency {
    use super::*;

    /// Polls until `check` admits, for a store whose releases are asynchronous (Redis).
    async fn admitted_soon(l: &Limiter, ids: &[&str]) -> Decision {
        for _ in 0..200 {
            let d = check(l, ids).await;
            if d.is_allowed() {
                return d;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the slot never came back");
    }

    macro_rules! both {
        ($($name:ident),* $(,)?) => {
            mod memory {
                $(#[tokio::test] async fn $name() { super::$name(super::Env::memory().await).await })*
            }
            mod redis {
                $(#[tokio::test] async fn $name() { super::$name(super::Env::redis().await).await })*
            }
            mod cluster {
                $(#[tokio::test] async fn $name() { super::$name(super::Env::cluster().await).await })*
            }
        };
    }

    both!(
        at_most_n_in_flight,
        rate_and_concurrency_are_all_or_nothing,
        forgotten_slots_expire_after_the_lease,
    );

    async fn at_most_n_in_flight(env: Env) {
        let l = env.limiter("3 concurrent");
        let mut held = Vec::new();
        for i in 0..3 {
            let d = check(&l, &["k"]).await;
            assert!(d.is_allowed());
            assert_eq!(d.statuses()[0].remaining, 2 - i);
            held.push(d);
        }
        let d = check(&l, &["k"]).await;
        assert!(!d.is_allowed());
        assert!(d.guard().is_none());
        assert!(d.retry_after().unwrap() <= Duration::from_secs(1));
        // another key is independent
        assert!(check(&l, &["other"]).await.is_allowed());
        // a finished request gives its slot back
        held.pop();
        let again = admitted_soon(&l, &["k"]).await;
        assert!(!check(&l, &["k"]).await.is_allowed());
        drop(again);
        drop(held);
        let mut all = Vec::new();
        for _ in 0..3 {
            all.push(admitted_soon(&l, &["k"]).await);
        }
    }

    async fn rate_and_concurrency_are_all_or_nothing(env: Env) {
        let l = env.limiter("2/min log, 1 concurrent");
        let first = check(&l, &["k"]).await;
        assert!(first.is_allowed());
        // the slot is taken: denied by concurrency, and the rate limit is not charged
        for _ in 0..3 {
            let d = check(&l, &["k"]).await;
            assert!(!d.is_allowed());
            assert!(d.denied_by().unwrap().limit.is_concurrency());
            assert_eq!(
                d.statuses()[0].remaining,
                1,
                "rate limit charged by a denial"
            );
        }
        drop(first);
        let second = admitted_soon(&l, &["k"]).await;
        assert_eq!(second.statuses()[0].remaining, 0);
        drop(second);
        // the rate limit is exhausted: denied by it, and no slot is taken
        let mut third = admitted_or_denied_by_rate(&l).await;
        assert!(third.take_guard().is_none());
        assert_eq!(third.statuses()[1].remaining, 1, "slot taken by a denial");
    }

    async fn admitted_or_denied_by_rate(l: &Limiter) -> Decision {
        for _ in 0..200 {
            let d = check(l, &["k"]).await;
            // (once the previous slot is back: Redis releases asynchronously)
            if d.denied_by().is_some_and(|s| !s.limit.is_concurrency()) && d.statuses()[1].allowed {
                return d;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("never denied by the rate limit");
    }

    async fn forgotten_slots_expire_after_the_lease(env: Env) {
        let l = env.limiter("2 concurrent lease=30s");
        for _ in 0..2 {
            let mut d = check(&l, &["k"]).await;
            d.take_guard().unwrap().forget();
        }
        assert!(!check(&l, &["k"]).await.is_allowed());
        env.advance_ms(29_999);
        assert!(!check(&l, &["k"]).await.is_allowed());
        env.advance_ms(1);
        let a = check(&l, &["k"]).await;
        let b = check(&l, &["k"]).await;
        assert!(a.is_allowed() && b.is_allowed());
        assert!(!check(&l, &["k"]).await.is_allowed());
    }
}

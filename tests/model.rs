//! Property tests: every algorithm, in both stores, against a plain reference model over random
//! request sequences on a manual clock.
//!
//! The models are written from the definitions, not from the stores' code: they keep the full
//! list of admitted requests and recompute everything from it (counts by scanning, retry times
//! by search, the token bucket in its refill form with exact integer tokens).

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{manual_clock, RedisServer};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tollgate::{
    Algorithm, Clock, Decision, Limit, Limiter, ManualClock, MemoryStore, Policy, Store,
};

const POLICIES: &[&str] = &[
    "5/s log",
    "4/300ms log",
    "5/s",
    "3/250ms",
    "7/1300ms",
    "3/200ms fixed",
    "6/s fixed",
    "3/s gcra burst=2",
    "7/s gcra",
    "5/700ms bucket capacity=3",
    "2/90ms bucket capacity=4",
    "3/100ms, 7/s log, 12/2s fixed",
    "4/s gcra, 6/1500ms, 9/3s log",
];
const IDS: [&str; 3] = ["a", "b", "c"];

#[derive(Debug, Clone)]
struct Op {
    dt_us: u64,
    ids: Vec<usize>,
    cost: u64,
}

fn op() -> impl Strategy<Value = Op> {
    (
        // small steps, large steps, none, and round steps that land exactly on window edges
        prop_oneof![
            0u64..2_000,
            0u64..400_000,
            Just(0u64),
            prop::sample::select(vec![1_000u64, 10_000, 50_000, 100_000, 250_000]),
        ],
        prop::sample::subsequence(vec![0usize, 1, 2], 1..=3),
        prop_oneof![4 => Just(1u64), 1 => Just(2u64)],
    )
        .prop_map(|(dt_us, ids, cost)| Op { dt_us, ids, cost })
}

fn case() -> impl Strategy<Value = (usize, Vec<Op>)> {
    (0..POLICIES.len(), prop::collection::vec(op(), 1..120))
}

/// What one (identifier, limit) pair should report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pair {
    admitted: bool,
    remaining: u64,
    reset_after_us: u64,
    retry_after_us: u64,
}

/// The reference: admitted (time, cost) events per (identifier, limit).
struct Model {
    limits: Vec<Limit>,
    events: HashMap<(usize, usize), Vec<(u64, u64)>>,
}

impl Model {
    fn decide(&mut self, now: u64, ids: &[usize], cost: u64) -> (bool, Vec<Pair>) {
        let mut verdicts = Vec::new();
        for &id in ids {
            for (l, limit) in self.limits.iter().enumerate() {
                let ev = self.events.get(&(id, l)).map(Vec::as_slice).unwrap_or(&[]);
                verdicts.push(admits(limit, ev, now, cost));
            }
        }
        let allowed = verdicts.iter().all(|v| v.is_none());
        if allowed {
            for &id in ids {
                for l in 0..self.limits.len() {
                    self.events.entry((id, l)).or_default().push((now, cost));
                }
            }
        }
        let mut pairs = Vec::new();
        let mut k = 0;
        for &id in ids {
            for (l, limit) in self.limits.iter().enumerate() {
                let ev = self.events.get(&(id, l)).map(Vec::as_slice).unwrap_or(&[]);
                let (remaining, reset_after_us) = report(limit, ev, now);
                pairs.push(Pair {
                    admitted: verdicts[k].is_none(),
                    remaining,
                    reset_after_us,
                    retry_after_us: verdicts[k].unwrap_or(0),
                });
                k += 1;
            }
        }
        (allowed, pairs)
    }
}

fn sum_in(ev: &[(u64, u64)], from_excl: i128, to_incl: i128) -> u64 {
    ev.iter()
        .filter(|(t, _)| (*t as i128) > from_excl && (*t as i128) <= to_incl)
        .map(|(_, c)| c)
        .sum()
}

/// Sliding-window estimate test, as the algorithm defines it (the same double expression).
fn window_ok(n: u64, w: u64, ev: &[(u64, u64)], at: u64, cost: u64) -> bool {
    let i = at / w;
    let e = at % w;
    let curr = sum_in(ev, (i * w) as i128 - 1, ((i + 1) * w) as i128 - 1);
    let prev = if i == 0 {
        0
    } else {
        sum_in(ev, ((i - 1) * w) as i128 - 1, (i * w) as i128 - 1)
    };
    (prev as f64) * ((w - e) as f64) / (w as f64) + ((curr + cost) as f64) <= n as f64
}

/// Token bucket in refill form: tokens scaled by the window (µs), exact.
fn bucket_tokens(limit: &Limit, burst: u64, ev: &[(u64, u64)], now: u64) -> u128 {
    let (n, w) = (u128::from(limit.count()), limit.window().as_micros());
    let full = u128::from(burst) * w;
    let mut tokens = full;
    let mut last = ev.first().map_or(now, |e| e.0);
    for &(t, c) in ev.iter().chain(std::iter::once(&(now, 0))) {
        tokens = (tokens + u128::from(t - last) * n).min(full);
        tokens -= u128::from(c) * w;
        last = t;
    }
    tokens
}

/// `None` when `limit` admits `cost` at `now`; else the wait (µs) until it would.
fn admits(limit: &Limit, ev: &[(u64, u64)], now: u64, cost: u64) -> Option<u64> {
    let (n, w) = (limit.count(), limit.window().as_micros() as u64);
    match limit.algorithm() {
        Algorithm::SlidingLog => {
            let used = sum_in(ev, now as i128 - w as i128, i128::MAX);
            if used + cost <= n {
                return None;
            }
            let mut units: Vec<u64> = ev
                .iter()
                .filter(|(t, _)| (*t as i128) > now as i128 - w as i128)
                .flat_map(|&(t, c)| std::iter::repeat_n(t, c as usize))
                .collect();
            units.sort_unstable();
            let k = (used + cost - n) as usize;
            Some(units[k - 1] + w - now)
        }
        Algorithm::FixedWindow => {
            let i = now / w;
            let used = sum_in(ev, (i * w) as i128 - 1, ((i + 1) * w) as i128 - 1);
            (used + cost > n).then(|| (i + 1) * w - now)
        }
        Algorithm::SlidingWindow => {
            if window_ok(n, w, ev, now, cost) {
                return None;
            }
            // smallest admitting time: binary search, the estimate only falls with time
            let (mut lo, mut hi) = (now, now + 2 * w);
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if window_ok(n, w, ev, mid, cost) {
                    hi = mid;
                } else {
                    lo = mid;
                }
            }
            Some(hi - now)
        }
        Algorithm::TokenBucket { capacity: b } | Algorithm::Gcra { burst: b } => {
            let tokens = bucket_tokens(limit, b, ev, now);
            let need = u128::from(cost) * limit.window().as_micros();
            (tokens < need).then(|| (need - tokens).div_ceil(u128::from(n)) as u64)
        }
        _ => unreachable!(),
    }
}

fn report(limit: &Limit, ev: &[(u64, u64)], now: u64) -> (u64, u64) {
    let (n, w) = (limit.count(), limit.window().as_micros() as u64);
    match limit.algorithm() {
        Algorithm::SlidingLog => {
            let from = now as i128 - w as i128;
            let used = sum_in(ev, from, i128::MAX);
            let newest = ev.iter().map(|e| e.0).filter(|&t| t as i128 > from).max();
            (n - used, newest.map_or(0, |t| t + w - now))
        }
        Algorithm::FixedWindow => {
            let i = now / w;
            let used = sum_in(ev, (i * w) as i128 - 1, ((i + 1) * w) as i128 - 1);
            (n - used, if used > 0 { (i + 1) * w - now } else { 0 })
        }
        Algorithm::SlidingWindow => {
            let remaining = (0..=n)
                .rev()
                .find(|&k| window_ok(n, w, ev, now, k))
                .unwrap_or(0);
            let i = now / w;
            let curr = sum_in(ev, (i * w) as i128 - 1, ((i + 1) * w) as i128 - 1);
            let prev = if i == 0 {
                0
            } else {
                sum_in(ev, ((i - 1) * w) as i128 - 1, (i * w) as i128 - 1)
            };
            let reset = if curr > 0 {
                (i + 2) * w - now
            } else if prev > 0 {
                (i + 1) * w - now
            } else {
                0
            };
            (remaining, reset)
        }
        Algorithm::TokenBucket { capacity: b } | Algorithm::Gcra { burst: b } => {
            let tokens = bucket_tokens(limit, b, ev, now);
            let wu = limit.window().as_micros();
            let full = u128::from(b) * wu;
            (
                (tokens / wu) as u64,
                (full - tokens).div_ceil(u128::from(n)) as u64,
            )
        }
        _ => unreachable!(),
    }
}

fn observed(d: &Decision) -> (bool, Vec<Pair>) {
    let pairs = d
        .statuses()
        .iter()
        .map(|s| Pair {
            admitted: s.allowed,
            remaining: s.remaining,
            reset_after_us: s.reset_after.as_micros() as u64,
            retry_after_us: s.retry_after.map_or(0, |r| r.as_micros() as u64),
        })
        .collect();
    (d.is_allowed(), pairs)
}

async fn run_case(
    store: Store,
    clock: &ManualClock,
    policy_index: usize,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let policy: Policy = POLICIES[policy_index].parse().unwrap();
    let mut model = Model {
        limits: policy.limits().to_vec(),
        events: HashMap::new(),
    };
    let limiter = Limiter::new(store, policy);
    for (step, op) in ops.iter().enumerate() {
        clock.advance(Duration::from_micros(op.dt_us));
        let names: Vec<&str> = op.ids.iter().map(|&i| IDS[i]).collect();
        let d = limiter.check_n(&names, op.cost).await.unwrap();
        let expected = model.decide(clock.now_micros(), &op.ids, op.cost);
        prop_assert_eq!(
            observed(&d),
            expected,
            "step {} of {}: {:?}",
            step,
            POLICIES[policy_index],
            op
        );
    }
    Ok(())
}

fn runner(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    })
}

#[test]
fn memory_store_matches_the_model() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runner(400)
        .run(&case(), |(p, ops)| {
            let clock = manual_clock();
            let store = MemoryStore::builder()
                .clock(Clock::Manual(clock.clone()))
                .build();
            rt.block_on(run_case(store.into(), &clock, p, &ops))
        })
        .unwrap();
}

#[test]
fn redis_store_matches_the_model() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runner(120)
        .run(&case(), |(p, ops)| {
            rt.block_on(async {
                let clock = manual_clock();
                let store = server.store(Clock::Manual(clock.clone())).await;
                run_case(store.into(), &clock, p, &ops).await
            })
        })
        .unwrap();
}

/// Long sequences at one instant per policy, both stores side by side: identical decisions.
#[test]
fn stores_agree_step_by_step() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runner(40)
        .run(
            &(0..POLICIES.len(), prop::collection::vec(op(), 100..300)),
            |(p, ops)| {
                rt.block_on(async {
                    let clock = manual_clock();
                    let memory = Limiter::new(
                        MemoryStore::builder()
                            .clock(Clock::Manual(clock.clone()))
                            .build(),
                        POLICIES[p].parse().unwrap(),
                    );
                    let redis = Limiter::new(
                        server.store(Clock::Manual(clock.clone())).await,
                        POLICIES[p].parse().unwrap(),
                    );
                    for op in &ops {
                        clock.advance(Duration::from_micros(op.dt_us));
                        let names: Vec<&str> = op.ids.iter().map(|&i| IDS[i]).collect();
                        let a = memory.check_n(&names, op.cost).await.unwrap();
                        let b = redis.check_n(&names, op.cost).await.unwrap();
                        prop_assert_eq!(a, b);
                    }
                    Ok(())
                })
            },
        )
        .unwrap();
}

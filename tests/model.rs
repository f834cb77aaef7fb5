//! Property tests: every algorithm, in both stores, against a plain reference model over random
//! request sequences on a manual clock.
//!
//! The models are written from the definitions, not from the stores' code: they keep the full
//! list of admitted requests and recompute everything from it (counts by scanning, retry times
//! by search, the token bucket in its refill form with exact integer tokens).
//!
//! Concurrency limits are checked store against store, step by step, with slots held, given
//! back and forgotten; limits at the bounds the parser accepts, against the model too.
//! Failing cases are kept in `tests/proptest-regressions/model.txt` and replayed first.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{manual_clock, slot_entries, slot_keys, KeyWatch, RedisServer};
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};
use tollgate::policy::{MAX_COUNT, MAX_LOG_COUNT, MAX_WINDOW};
use tollgate::{
    Algorithm, Clock, ConcurrencyGuard, Decision, Limit, Limiter, ManualClock, MemoryStore, Policy,
    Store,
};

/// `prop_assert_eq!` for a run on Redis: a mismatch after a key expired in real time (see
/// `KeyWatch`) ends the run as unproven (`Ok(false)`), to be repeated, instead of failing it.
macro_rules! assert_same {
    ($watch:expr, $left:expr, $right:expr, $($fmt:tt)+) => {{
        let (left, right) = ($left, $right);
        if left != right && $watch.is_some_and(|w: &KeyWatch| w.lost()) {
            return Ok(false);
        }
        prop_assert_eq!(left, right, $($fmt)+);
    }};
}

const POLICIES: &[&str] = &[
    "5/s log",
    "4/300ms log",
    "5/s sliding",
    "3/250ms sliding",
    "7/1300ms sliding",
    "3/200ms fixed",
    "6/s fixed",
    "3/s gcra burst=2",
    "7/s gcra",
    "5/700ms bucket capacity=3",
    "2/90ms bucket capacity=4",
    "3/100ms sliding, 7/s log, 12/2s fixed",
    "4/s gcra, 6/1500ms sliding, 9/3s log",
    "5/s",
    "3/250ms",
    "7/1300ms rolling",
    "2/1ms",
    "3/100ms, 7/s log, 12/2s",
    "4/s gcra, 6/1500ms, 9/3s log, 4/s sliding",
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

/// The rolling window's sub-windows per window: a quarter of the window each.
const SUB_WINDOWS: u64 = 4;

/// What the rolling window counts at `at`: every admitted cost in the sub-window of `at` and
/// the four before it (the oldest in full, though part of it has left `(at - w, at]`).
fn ring_count(w: u64, ev: &[(u64, u64)], at: u64) -> u64 {
    let g = w / SUB_WINDOWS;
    let oldest = (at / g).saturating_sub(SUB_WINDOWS) * g;
    sum_in(ev, oldest as i128 - 1, at as i128)
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
        Algorithm::RollingWindow => {
            if ring_count(w, ev, now) + cost <= n {
                return None;
            }
            // the count only falls at sub-window starts: the first one where it fits
            let g = w / SUB_WINDOWS;
            let at = (now / g + 1..)
                .map(|j| j * g)
                .find(|&t| ring_count(w, ev, t) + cost <= n)
                .unwrap();
            Some(at - now)
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
        Algorithm::RollingWindow => {
            // whole again once the newest counted charge's sub-window has left the ring
            let used = ring_count(w, ev, now);
            let g = w / SUB_WINDOWS;
            let newest = ev.iter().map(|e| e.0).max().filter(|_| used > 0);
            let reset = newest.map_or(0, |t| (t / g + SUB_WINDOWS + 1) * g - now);
            (n - used, reset)
        }
        Algorithm::SlidingWindow => {
            // the largest k in 0..=n that fits (0 when none does): the test only fails more
            // as k grows, so a binary search finds it (n may be MAX_COUNT)
            let (mut lo, mut hi) = (0u64, n + 1);
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if window_ok(n, w, ev, now, mid) {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            let remaining = lo;
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

/// Runs `ops` against the model. With a `watch` (a Redis store), returns `false` when the run
/// proved nothing (see `assert_same!`) and must be repeated.
async fn run_case(
    store: Store,
    clock: &ManualClock,
    policy_index: usize,
    ops: &[Op],
    mut watch: Option<KeyWatch>,
) -> Result<bool, TestCaseError> {
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
        if let Some(watch) = &mut watch {
            watch.settle(&names, d.is_allowed());
        }
        let expected = model.decide(clock.now_micros(), &op.ids, op.cost);
        assert_same!(
            watch.as_ref(),
            observed(&d),
            expected,
            "step {} of {}: {:?}",
            step,
            POLICIES[policy_index],
            op
        );
    }
    Ok(true)
}

/// Runs a case on Redis until a run proves something (see `assert_same!`), at most 20 times.
async fn attempts<F, R>(mut run: F) -> Result<(), TestCaseError>
where
    F: FnMut() -> R,
    R: std::future::Future<Output = Result<bool, TestCaseError>>,
{
    for _ in 0..20 {
        if run().await? {
            return Ok(());
        }
    }
    Err(TestCaseError::fail(
        "20 runs differed after a key had expired in real time",
    ))
}

/// Where failing cases are saved (as the seeds that generate them), to be replayed before any
/// new case on every later run. The file is committed: a failure found once is kept.
const REGRESSIONS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/proptest-regressions/model.txt"
);

fn runner(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(REGRESSIONS))),
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
            rt.block_on(run_case(store.into(), &clock, p, &ops, None))
                .map(drop)
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
            rt.block_on(attempts(|| async {
                let clock = manual_clock();
                let store = server.store(Clock::Manual(clock.clone())).await;
                let policy = POLICIES[p].parse().unwrap();
                let watch = KeyWatch::new(&server, store.prefix(), &policy);
                run_case(store.into(), &clock, p, &ops, Some(watch)).await
            }))
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
                rt.block_on(attempts(|| async {
                    let clock = manual_clock();
                    let policy: Policy = POLICIES[p].parse().unwrap();
                    let memory = Limiter::new(
                        MemoryStore::builder()
                            .clock(Clock::Manual(clock.clone()))
                            .build(),
                        policy.clone(),
                    );
                    let store = server.store(Clock::Manual(clock.clone())).await;
                    let mut watch = KeyWatch::new(&server, store.prefix(), &policy);
                    let redis = Limiter::new(store, policy);
                    for op in &ops {
                        clock.advance(Duration::from_micros(op.dt_us));
                        let names: Vec<&str> = op.ids.iter().map(|&i| IDS[i]).collect();
                        let a = memory.check_n(&names, op.cost).await.unwrap();
                        let b = redis.check_n(&names, op.cost).await.unwrap();
                        watch.settle(&names, b.is_allowed());
                        assert_same!(Some(&watch), a, b, "{:?}", op);
                    }
                    Ok(true)
                }))
            },
        )
        .unwrap();
}

// ---------------------------------------------------------------------------------------------
// Concurrency limits, both stores side by side.
//
// Slots are held, given back and forgotten; the clock jumps past lease deadlines. Two things
// happen in real time, not on the manual clock, and the steps are built so that neither can
// make the stores differ:
//
// * Releases on Redis go through the keeper task, batched. After requests end, the test waits
//   until Redis holds exactly that many slot entries fewer (a bounded wait, then an assertion),
//   so the next step sees every release, and a release that never comes fails the test.
// * The keeper renews a held slot every third of its lease, in real time, at the manual clock's
//   time: to `now + lease`, whenever that happens to be. A renewal only moves a deadline later,
//   so it changes nothing a check reports as long as every check keeps at least a second
//   before the unrenewed deadline (`retry_after` is capped at a second). A request still held
//   when the clock would pass `taken + lease - 1 s` therefore ends before the clock moves.
//   A forgotten slot is never renewed past its deadline: the test lets the keeper hear of the
//   forgetting before the clock moves, so a renewal before that sets the deadline it had.
//   Forgotten slots are the ones that run out their lease.

const SLOT_POLICIES: &[&str] = &[
    "3 concurrent",
    "1 concurrent lease=1s",
    "2 concurrent lease=2s, 5/s",
    "4/s fixed, 6/3s log, 2 concurrent lease=1500ms",
    "3/s gcra burst=2, 4 concurrent lease=5s, 5/700ms bucket capacity=3",
];

/// What a step does with its decisions once both stores made them.
#[derive(Debug, Clone, Copy)]
enum After {
    /// The request ends at once: its slots are given back.
    End,
    /// The request goes on; the decision (with its slots) is kept.
    KeepDecision,
    /// The request goes on with the guard taken out of the decision.
    KeepGuard,
    /// The guard is forgotten: the slots stay taken until their lease runs out.
    Forget,
}

#[derive(Debug, Clone)]
struct SlotOp {
    /// Requests still running that end before this step, picked among those held.
    end: Vec<prop::sample::Index>,
    dt_us: u64,
    ids: Vec<usize>,
    cost: u64,
    after: After,
}

fn slot_op(lease_us: u64) -> impl Strategy<Value = SlotOp> {
    let near = |at: u64| at.saturating_sub(2)..=at + 2;
    (
        prop_oneof![
            3 => Just(Vec::new()),
            1 => prop::collection::vec(any::<prop::sample::Index>(), 1..=2),
        ],
        prop_oneof![
            4 => Just(0u64),
            3 => 0u64..2_000,
            3 => 0u64..400_000,
            // onto the deadlines of slots taken together, and onto the one-second retry cap
            2 => near(lease_us),
            1 => near(lease_us - 1_000_000),
            1 => 0..=2 * lease_us,
        ],
        prop::sample::subsequence(vec![0usize, 1, 2], 1..=3),
        prop_oneof![4 => Just(1u64), 1 => Just(2u64)],
        prop_oneof![
            3 => Just(After::End),
            3 => Just(After::KeepDecision),
            1 => Just(After::KeepGuard),
            2 => Just(After::Forget),
        ],
    )
        .prop_map(|(end, dt_us, ids, cost, after)| SlotOp {
            end,
            dt_us,
            ids,
            cost,
            after,
        })
}

fn lease_us(policy: &str) -> u64 {
    let policy: Policy = policy.parse().unwrap();
    policy.concurrency().unwrap().window().as_micros() as u64
}

fn slot_case() -> impl Strategy<Value = (usize, Vec<SlotOp>)> {
    (0..SLOT_POLICIES.len()).prop_flat_map(|p| {
        (
            Just(p),
            prop::collection::vec(slot_op(lease_us(SLOT_POLICIES[p])), 40..160),
        )
    })
}

/// A request still running on both sides: what holds its slots there, and when it was taken.
struct Running {
    taken_at: u64,
    /// How many slots it holds (one per identifier).
    slots: usize,
    memory: (Option<Decision>, Option<ConcurrencyGuard>),
    redis: (Option<Decision>, Option<ConcurrencyGuard>),
}

/// Ends `running` on both sides, then waits until the Redis keeper has given their slots back.
async fn end_requests(
    running: Vec<Running>,
    conn: &mut redis::Connection,
    prefix: &str,
) -> Result<(), TestCaseError> {
    let released: usize = running.iter().map(|r| r.slots).sum();
    if released == 0 {
        return Ok(());
    }
    // (releases create no key, and a set they empty reads as 0: these keys are all to count)
    let keys = slot_keys(conn, prefix);
    let before = slot_entries(conn, &keys);
    prop_assert!(
        before >= released,
        "{} slot entries, {} held",
        before,
        released
    );
    for r in running {
        drop((r.memory, r.redis));
    }
    let expected = before - released;
    let start = Instant::now();
    for polls in 0u32.. {
        let now = slot_entries(conn, &keys);
        if now <= expected || start.elapsed() > Duration::from_secs(10) {
            prop_assert_eq!(now, expected, "slot entries in Redis after the releases");
            return Ok(());
        }
        // the keeper runs while this task waits: first a few turns, then 1 ms at a time
        if polls < 100 {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    unreachable!()
}

/// One run of a concurrency case; `false` when the run proved nothing (see `assert_same!`).
async fn run_slot_case(
    server: &RedisServer,
    p: usize,
    ops: &[SlotOp],
) -> Result<bool, TestCaseError> {
    let text = SLOT_POLICIES[p];
    let policy: Policy = text.parse().unwrap();
    let lease = lease_us(text);
    let clock = manual_clock();
    let memory = Limiter::new(
        MemoryStore::builder()
            .clock(Clock::Manual(clock.clone()))
            .build(),
        policy.clone(),
    );
    let store = server.store(Clock::Manual(clock.clone())).await;
    let prefix = store.prefix().to_string();
    let mut watch = KeyWatch::new(server, &prefix, &policy);
    let mut conn = server.conn();
    let redis = Limiter::new(store, policy);
    let mut running: Vec<Running> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        // requests that end now: those picked, and those the clock would take to within a
        // second of their lease
        let next = clock.now_micros() + op.dt_us;
        let mut ending = Vec::new();
        for index in &op.end {
            if !running.is_empty() {
                ending.push(running.swap_remove(index.index(running.len())));
            }
        }
        let (late, on): (Vec<Running>, Vec<Running>) = running
            .into_iter()
            .partition(|r| next + 1_000_000 > r.taken_at + lease);
        running = on;
        ending.extend(late);
        end_requests(ending, &mut conn, &prefix).await?;

        clock.advance(Duration::from_micros(op.dt_us));
        let names: Vec<&str> = op.ids.iter().map(|&i| IDS[i]).collect();
        let mut a = memory.check_n(&names, op.cost).await.unwrap();
        let mut b = redis.check_n(&names, op.cost).await.unwrap();
        watch.settle(&names, b.is_allowed());
        assert_same!(Some(&watch), &a, &b, "step {} of {}: {:?}", step, text, op);
        prop_assert_eq!(a.guard().is_some(), a.is_allowed());
        prop_assert_eq!(b.guard().is_some(), b.is_allowed());
        if !a.is_allowed() {
            continue;
        }
        let request = |memory, redis| Running {
            taken_at: clock.now_micros(),
            slots: op.ids.len(),
            memory,
            redis,
        };
        match op.after {
            After::End => {
                let ended = request((Some(a), None), (Some(b), None));
                end_requests(vec![ended], &mut conn, &prefix).await?;
            }
            After::KeepDecision => running.push(request((Some(a), None), (Some(b), None))),
            After::KeepGuard => {
                let guards = (a.take_guard(), b.take_guard());
                drop((a, b));
                running.push(request((None, guards.0), (None, guards.1)));
            }
            After::Forget => {
                a.take_guard().unwrap().forget();
                b.take_guard().unwrap().forget();
                // let the keepers hear of it before the clock moves
                tokio::task::yield_now().await;
            }
        }
    }
    end_requests(running, &mut conn, &prefix).await?;
    Ok(true)
}

#[test]
fn stores_agree_on_concurrency_limits() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runner(40)
        .run(&slot_case(), |(p, ops)| {
            rt.block_on(attempts(|| run_slot_case(&server, p, &ops)))
        })
        .unwrap();
}

// ---------------------------------------------------------------------------------------------
// Limits at the bounds the parser accepts: both stores and the model, step by step.

/// The largest `param` (`burst` or `capacity`) the parser accepts for `head` (`"7/h gcra"`).
fn largest_burst(head: &str, param: &str) -> u64 {
    let accepts = |b: u64| format!("{head} {param}={b}").parse::<Policy>().is_ok();
    assert!(accepts(1), "{head}");
    let (mut lo, mut hi) = (1, MAX_COUNT + 1);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if accepts(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    assert!(!accepts(lo + 1));
    lo
}

/// Policies at the bounds: the largest count and the longest window for every algorithm, the
/// largest bursts and capacities (the count, or where the burst tolerance caps them, the
/// largest it allows), the largest sliding log; each checked to be a bound (one more is
/// refused). With each, whether Redis runs it too: not where a state can live for mere
/// microseconds (a high rate in a bucket, a fixed window about to end), because Redis counts
/// the TTL down in real time, and the key of a state still alive on the manual clock would be
/// gone before the test could keep it (see `KeyWatch`).
fn bound_policies() -> Vec<(String, bool)> {
    let days = MAX_WINDOW.as_secs() / 86_400;
    assert_eq!(Duration::from_secs(days * 86_400), MAX_WINDOW);
    let (n, w, log) = (MAX_COUNT, format!("{days}d"), MAX_LOG_COUNT);
    for refused in [
        format!("{}/{w}", n + 1),
        format!("{n}/{}d", days + 1),
        format!("{}/{w} log", log + 1),
        format!("1/ms gcra burst={}", n + 1),
    ] {
        assert!(refused.parse::<Policy>().is_err(), "{refused}");
    }
    let b7 = largest_burst("7/h gcra", "burst");
    let mut policies = vec![
        (format!("{n}/{w} sliding"), true),
        (format!("{n}/{w}"), true),
        (format!("{n}/{w} fixed"), true),
        (format!("{n}/{w} gcra"), true),
        (format!("{n}/{w} bucket"), true),
        (format!("{n}/s sliding"), true),
        (format!("{n}/s"), true),
        (format!("{log}/{w} log"), true),
        (format!("{log}/min log"), true),
        (
            format!("{n}/{w} sliding, {log}/{w} log, 7/h gcra burst={b7}"),
            true,
        ),
        (format!("{n}/{w}, {log}/{w} log, 7/h gcra burst={b7}"), true),
        (format!("{log}/s log"), false),
        (format!("{n}/ms sliding"), false),
        (format!("{n}/ms"), false),
        ("1/ms".to_string(), false),
        // the largest ring packed into one number, and the smallest in five
        ("1550/s, 1551/min".to_string(), true),
        (format!("{n}/s fixed"), false),
        (format!("{n}/ms fixed"), false),
        (format!("{n}/s gcra"), false),
    ];
    for (head, redis) in [
        ("1/s", true),
        (&*format!("1/{w}"), true),
        ("7/h", true),
        ("1/ms", false),
        (&*format!("{n}/ms"), false),
    ] {
        for (alg, param) in [("gcra", "burst"), ("bucket", "capacity")] {
            let head = format!("{head} {alg}");
            let b = largest_burst(&head, param);
            policies.push((format!("{head} {param}={b}"), redis));
        }
    }
    policies
}

#[derive(Debug, Clone)]
struct BoundOp {
    dt_us: u64,
    ids: Vec<usize>,
    cost: u64,
}

/// Steps of every size up to two windows (of one of the policy's limits, each time), landing on
/// window edges and one microsecond either side; costs from 1 to the policy's largest.
fn bound_op(windows: Vec<u64>, max_cost: u64) -> impl Strategy<Value = BoundOp> {
    let dt = prop::sample::select(windows).prop_flat_map(|w| {
        prop_oneof![
            Just(0),
            Just(1),
            0..2_000u64,
            Just(w - 1),
            Just(w),
            Just(w + 1),
            Just(w / 2),
            0..=w / 1_000,
            0..=2 * w,
        ]
    });
    let cost = prop_oneof![
        Just(1),
        Just(max_cost),
        Just((max_cost - 1).max(1)),
        Just((max_cost / 2).max(1)),
        1..=max_cost,
        1..=max_cost.min(3),
    ];
    (dt, prop::sample::subsequence(vec![0usize, 1], 1..=2), cost)
        .prop_map(|(dt_us, ids, cost)| BoundOp { dt_us, ids, cost })
}

fn bound_ops(policy: &Policy) -> impl Strategy<Value = Vec<BoundOp>> {
    let windows = policy
        .limits()
        .iter()
        .map(|l| l.window().as_micros() as u64)
        .collect();
    let steps = if has_log(policy) { 2..8 } else { 2..40 };
    prop::collection::vec(bound_op(windows, policy.max_cost()), steps)
}

/// A sliding log of 100,000 entries is slow to write in Redis (a step can take a second on a
/// loaded machine): its cases have fewer steps, and fewer of them run there.
fn has_log(policy: &Policy) -> bool {
    policy
        .limits()
        .iter()
        .any(|l| l.algorithm() == Algorithm::SlidingLog)
}

/// One run of a case at the bounds, with Redis when given; `false` when the run proved
/// nothing (see `assert_same!`).
async fn run_bound_case(
    server: Option<&RedisServer>,
    text: &str,
    ops: &[BoundOp],
) -> Result<bool, TestCaseError> {
    let policy: Policy = text.parse().unwrap();
    let mut model = Model {
        limits: policy.limits().to_vec(),
        events: HashMap::new(),
    };
    let clock = manual_clock();
    let memory = Limiter::new(
        MemoryStore::builder()
            .clock(Clock::Manual(clock.clone()))
            .build(),
        policy.clone(),
    );
    let mut redis = None;
    if let Some(server) = server {
        let store = server.store(Clock::Manual(clock.clone())).await;
        let watch = KeyWatch::new(server, store.prefix(), &policy);
        redis = Some((Limiter::new(store, policy), watch));
    }
    for (step, op) in ops.iter().enumerate() {
        clock.advance(Duration::from_micros(op.dt_us));
        prop_assert!(clock.now_micros() < 1 << 53);
        let names: Vec<&str> = op.ids.iter().map(|&i| IDS[i]).collect();
        let a = memory.check_n(&names, op.cost).await.unwrap();
        let expected = model.decide(clock.now_micros(), &op.ids, op.cost);
        let at = format!("step {step} of {text}: {op:?}");
        prop_assert_eq!(observed(&a), expected, "memory, {}", at);
        if let Some((redis, watch)) = &mut redis {
            let b = redis.check_n(&names, op.cost).await.unwrap();
            watch.settle(&names, b.is_allowed());
            assert_same!(Some(&*watch), &a, &b, "{}", at);
        }
    }
    Ok(true)
}

/// Both stores and the model, at the bounds. At most 40 steps of at most two 400-day windows
/// keep the clock below 2^53 µs, where the scripts' doubles are exact.
#[test]
fn stores_match_the_model_at_the_bounds() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for (text, on_redis) in bound_policies() {
        let policy: Policy = text.parse().unwrap();
        let server = on_redis.then_some(&server);
        let cases = match (on_redis, has_log(&policy)) {
            (false, _) => 10,
            (true, false) => 6,
            (true, true) => 3,
        };
        runner(cases)
            .run(&bound_ops(&policy), |ops| {
                rt.block_on(attempts(|| run_bound_case(server, &text, &ops)))
            })
            .unwrap_or_else(|e| panic!("{text}: {e}"));
    }
}

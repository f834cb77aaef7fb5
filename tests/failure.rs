//! Failure policies and the circuit breaker against real `redis-server` processes that the
//! tests kill, restart and stall, with a recording `metrics` recorder and a capturing
//! `tracing` subscriber to check that every failure is visible.
//!
//! Latency bounds here are correctness bounds with wide margins (a request must not pay the
//! store's timeout once the breaker is open), not performance figures.

mod common;
#[path = "common/observed.rs"]
mod observed;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use common::{Proxy, RedisServer};
use observed::{log_text, metric, observed};
use tollgate::store::StoreHealth;
use tollgate::{Error, Limiter, OnStoreError, Origin, RedisStore, StoreError};

/// A runtime of one thread, with its time and IO drivers, for tests that run several in turn.
fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A Redis store of `prefix` on `server`, connected on `runtime`.
fn connected_on(
    runtime: &tokio::runtime::Runtime,
    server: &RedisServer,
    prefix: &str,
) -> RedisStore {
    runtime
        .block_on(
            RedisStore::builder(server.url())
                .prefix(prefix)
                .timeout(Duration::from_secs(2))
                .build(),
        )
        .unwrap()
}

/// Takes a slot of `slots` on `runtime` for a request still running when the runtime shuts
/// down (its task never ends).
fn hold_a_slot_until_shutdown(runtime: &tokio::runtime::Runtime, slots: &Limiter) {
    runtime.block_on(async {
        let held = slots.check(&["job"]).await.unwrap();
        assert!(held.is_allowed());
        tokio::spawn(async move {
            let _held = held;
            std::future::pending::<()>().await;
        });
        tokio::task::yield_now().await;
    });
}

/// Held by the tests that count the lines of a slot-renewing task lost, one test at a time:
/// the line names the memory store (`memory`), not one of a test's own, so one test's line
/// would fall in the other's count.
static KEEPER_LINES: Mutex<()> = Mutex::new(());

/// How many lines say that a slot-renewing task took over slots that went unrenewed.
fn keeper_lost_lines() -> usize {
    log_text()
        .lines()
        .filter(|l| l.contains("concurrency slots went unrenewed"))
        .count()
}

/// How many log lines contain `text` and name the store `store`.
fn logged(text: &str, store: &str) -> usize {
    let tag = format!("store=\"{store}\"");
    log_text()
        .lines()
        .filter(|l| l.contains(text) && l.contains(&tag))
        .count()
}

async fn store_at(url: &str, prefix: &str, timeout_ms: u64) -> RedisStore {
    RedisStore::builder(url)
        .prefix(prefix)
        .timeout(Duration::from_millis(timeout_ms))
        .build_lazy()
        .unwrap()
}

fn limiter(store: &RedisStore, policy: &str, name: &str, on_error: OnStoreError) -> Limiter {
    Limiter::builder(store.clone(), policy.parse().unwrap())
        .name(name)
        .on_store_error(on_error)
        .build()
}

/// Each policy answers a check the store cannot decide as documented, and counts it.
#[tokio::test]
async fn policies_answer_when_redis_is_down() {
    observed();
    let dead = common::dead_url();
    let store = store_at(&dead, "down", 100).await;

    let open = limiter(&store, "2/min", "down-open", OnStoreError::Open);
    let d = open.check(&["a"]).await.unwrap();
    assert!(d.is_allowed());
    assert_eq!(d.origin(), Origin::FailOpen);
    assert!(d.statuses().is_empty());

    let closed = limiter(&store, "2/min", "down-closed", OnStoreError::Closed);
    match closed.check(&["a"]).await {
        Err(Error::Store(_)) => {}
        other => panic!("closed must fail: {other:?}"),
    }

    // Half of 4/min, 6/h in this process: 2 per minute, then denied by the fallback.
    let fallback = limiter(
        &store,
        "4/min, 6/h",
        "down-fallback",
        OnStoreError::fallback(0.5).unwrap(),
    );
    let mut allowed = 0;
    for _ in 0..5 {
        let d = fallback.check(&["a"]).await.unwrap();
        assert_eq!(d.origin(), Origin::Fallback);
        allowed += usize::from(d.is_allowed());
    }
    assert_eq!(allowed, 2);
    // a cost the store's policy admits and the fallback's (2/min) cannot hold: the store's
    // failure stands, counted as closed, not as fallback
    match fallback.check_n(&["b"], 3).await {
        Err(Error::Store(_)) => {}
        other => panic!("a cost the fallback cannot hold must fail: {other:?}"),
    }
    assert!(OnStoreError::fallback(0.0).is_none());
    assert!(OnStoreError::fallback(1.5).is_none());

    // Limits that scale to one (`2/s` and `3/s` to `1/s`) count once in the fallback, and
    // its statuses still name the limiter's limits by their places in its policy.
    let merged = limiter(
        &store,
        "2/s, 3/s, 2/min",
        "down-merged",
        OnStoreError::fallback(0.5).unwrap(),
    );
    assert!(merged.check(&["a"]).await.unwrap().is_allowed());
    let d = merged.check(&["a"]).await.unwrap();
    assert_eq!(d.origin(), Origin::Fallback);
    let by = d.denied_by().unwrap();
    // held back longest by `1/min`, the fallback's `2/min`
    assert_eq!(
        (by.limit.to_string().as_str(), by.limit_index),
        ("1/min", 2)
    );
    let policy = merged.policy();
    assert_eq!(policy.limits()[by.limit_index].to_string(), "2/min");
    let indices: Vec<usize> = d.limits().map(|s| s.limit_index).collect();
    assert_eq!(indices, [0, 2]);

    for (name, action, n) in [
        ("down-open", "open", 1.0),
        ("down-closed", "closed", 1.0),
        ("down-fallback", "fallback", 5.0),
        ("down-fallback", "closed", 1.0),
    ] {
        assert_eq!(
            metric(
                "tollgate_failure_policy_total",
                &[("limiter", name), ("action", action)]
            ),
            n,
            "{name}"
        );
    }
    assert_eq!(
        metric(
            "tollgate_decisions_total",
            &[("limiter", "down-fallback"), ("outcome", "denied")]
        ),
        3.0
    );
}

/// Redis killed under load and restarted on the same port: no panic, no hung request; every
/// check answered within the timeout plus a margin until the breaker opens, then in a few
/// milliseconds; checks go through Redis again soon after the restart; one warning each way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_under_load() {
    observed();
    let server = RedisServer::start();
    let port = server.port;
    // A kill fails calls at once (the connection drops, then is refused), so the breaker
    // opens within milliseconds whatever the timeout; a timeout this long keeps a stall of
    // the test machine before the kill from opening it too (the warnings are counted below).
    let timeout = Duration::from_secs(1);
    let store = RedisStore::builder(server.url())
        .prefix("outage")
        .timeout(timeout)
        .build()
        .await
        .unwrap();
    let limiter = limiter(&store, "1000/s", "outage", OnStoreError::Open);

    // (when the check started, how long it took, who decided)
    let samples: Arc<Mutex<Vec<(Instant, Duration, Origin)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for t in 0..16 {
        let (limiter, samples, stop) = (limiter.clone(), samples.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                let d = limiter.check(&[format!("k{t}-{}", i % 50)]).await.unwrap();
                samples
                    .lock()
                    .unwrap()
                    .push((started, started.elapsed(), d.origin()));
                i += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let killed = Instant::now();
    drop(server);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let server = RedisServer::start_on(port);
    let restarted = Instant::now();
    // Wait for checks to go through Redis again (bounded).
    let deadline = restarted + Duration::from_secs(10);
    let back = loop {
        let last_store = samples
            .lock()
            .unwrap()
            .iter()
            .filter(|(at, _, o)| *at > restarted && *o == Origin::Store)
            .map(|(at, _, _)| *at)
            .min();
        if let Some(at) = last_store {
            break at;
        }
        assert!(
            Instant::now() < deadline,
            "checks never went through Redis again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("no check panicked or hung");
    }
    drop(server);

    let samples = samples.lock().unwrap();
    let during: Vec<_> = samples
        .iter()
        .filter(|(at, _, _)| *at > killed && *at < restarted)
        .collect();
    assert!(
        during.len() > 100,
        "load went on during the outage: {}",
        during.len()
    );
    // Every check: within the timeout plus a wide margin for a loaded machine.
    let worst = samples.iter().map(|(_, took, _)| *took).max().unwrap();
    assert!(
        worst < timeout + Duration::from_millis(400),
        "worst check {worst:?}"
    );
    // From one second into the outage on, the breaker answers: no check waits for Redis.
    let settled: Vec<Duration> = during
        .iter()
        .filter(|(at, _, _)| *at > killed + Duration::from_secs(1))
        .map(|(_, took, _)| *took)
        .collect();
    assert!(!settled.is_empty());
    // (100 ms: a tenth of the timeout, far above a breaker's answer, and above a loaded
    // machine's pauses)
    let slow = settled
        .iter()
        .filter(|t| **t > Duration::from_millis(100))
        .count();
    assert!(
        slow * 100 <= settled.len(),
        "{slow} of {} checks during the outage took over 100 ms",
        settled.len()
    );
    // The failure policy answered them, and said so.
    assert!(during
        .iter()
        .filter(|(at, _, _)| *at > killed + Duration::from_secs(1))
        .all(|(_, _, o)| *o == Origin::FailOpen));
    let back_after = back.saturating_duration_since(restarted);
    // (about 0.7 s at most: a reconnection's backoff, then the breaker's probe; a store that
    // stopped reconnecting would never be back)
    assert!(
        back_after < Duration::from_secs(5),
        "checks went through Redis {back_after:?} after the restart"
    );
    assert!(
        metric(
            "tollgate_failure_policy_total",
            &[("limiter", "outage"), ("action", "open")]
        ) > 100.0
    );
    assert!(
        metric(
            "tollgate_store_errors_total",
            &[("store", "outage"), ("kind", "unavailable")]
        ) > 100.0
    );
    assert_eq!(
        metric("tollgate_store_breaker_open", &[("store", "outage")]),
        0.0
    );
    assert_eq!(logged("rate-limit store failing", "outage"), 1);
    assert_eq!(logged("rate-limit store answers again", "outage"), 1);
}

/// A stall longer than the timeout: the first checks time out (not retried), the breaker
/// opens after a few, later checks are answered at once; when the stall ends checks go
/// through Redis again.
#[tokio::test]
async fn a_stall_opens_the_breaker_and_recovery_closes_it() {
    observed();
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port).await;
    let store = store_at(&proxy.url(), "stall", 100).await;
    let limiter = limiter(&store, "1000/s", "stall", OnStoreError::Closed);
    assert_eq!(limiter.check(&["a"]).await.unwrap().origin(), Origin::Store);
    assert!(store.health().is_up(), "{:?}", store.health());

    proxy.freeze(true);
    let mut kinds: HashMap<&'static str, usize> = HashMap::new();
    let mut fast = 0;
    for _ in 0..50 {
        let started = Instant::now();
        match limiter.check(&["a"]).await {
            Err(Error::Store(e)) => {
                *kinds.entry(e.kind_label()).or_default() += 1;
                // (well under the 100 ms timeout: answered without waiting for Redis, with
                // room for a loaded machine's pauses)
                if matches!(e, StoreError::Unavailable)
                    && started.elapsed() < Duration::from_millis(60)
                {
                    fast += 1;
                }
            }
            other => panic!("a stalled store cannot decide: {other:?}"),
        }
    }
    // A few timeouts open the breaker; everything after is answered without waiting.
    assert_eq!(kinds.get("timeout"), Some(&3), "{kinds:?}");
    assert_eq!(kinds.get("unavailable"), Some(&47), "{kinds:?}");
    assert_eq!(fast, 47);
    // connected (the silence has not yet lasted long enough to give the connection up), with
    // the breaker open
    let health = store.health();
    assert!(matches!(health, StoreHealth::BreakerOpen), "{health:?}");

    proxy.freeze(false);
    let resumed = Instant::now();
    loop {
        if limiter.check(&["a"]).await.is_ok() {
            break;
        }
        assert!(
            resumed.elapsed() < Duration::from_secs(3),
            "checks never resumed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        resumed.elapsed() < Duration::from_secs(1),
        "{:?}",
        resumed.elapsed()
    );
    assert!(store.health().is_up(), "{:?}", store.health());
    assert_eq!(logged("rate-limit store failing", "stall"), 1);
    assert_eq!(logged("rate-limit store answers again", "stall"), 1);
}

/// A slot let go while Redis cannot be reached is released once it can: the keeper retries
/// the release until it succeeds or the lease has expired anyway, so the identifier is not
/// locked out for the rest of the lease with nothing in flight.
#[tokio::test]
async fn a_release_that_failed_is_retried_once_redis_answers() {
    observed();
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port).await;
    let store = store_at(&proxy.url(), "release", 200).await;
    let limiter = limiter(
        &store,
        "1 concurrent lease=20s",
        "release",
        OnStoreError::Closed,
    );
    let held = limiter.check(&["a"]).await.unwrap();
    assert!(held.guard().is_some());

    proxy.freeze(true);
    drop(held); // the release cannot reach Redis
    tokio::time::sleep(Duration::from_millis(600)).await;
    proxy.freeze(false);

    // Well within the 20 s lease, the slot is free again.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match limiter.check(&["a"]).await {
            Ok(d) if d.is_allowed() => break,
            _ => {
                assert!(Instant::now() < deadline, "the slot was never released");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// A scheduled slot whose waiter gave up while Redis was silent cannot be given back: it
/// stays taken, and that is counted and logged, not dropped without a trace. A lease renewal
/// missed in the same silence is counted and logged too.
#[tokio::test]
async fn slots_and_leases_that_miss_the_store_are_counted_and_logged() {
    observed();
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port).await;
    let store = store_at(&proxy.url(), "give-back", 200).await;
    let scheduler = tollgate::Scheduler::new(store.clone(), "1/min".parse().unwrap());
    assert!(scheduler
        .schedule("psp:acme", Duration::ZERO)
        .await
        .unwrap()
        .is_allowed());
    // placed a minute ahead, waiting (once its script has run)
    let before = server.script_calls();
    let waiter = {
        let scheduler = scheduler.clone();
        tokio::spawn(async move {
            scheduler
                .schedule("psp:acme", Duration::from_secs(120))
                .await
        })
    };
    server
        .ran_scripts_past(before, "the waiter's placement")
        .await;
    // a slot held with a 1 s lease, renewed every third of it
    let slots = limiter(
        &store,
        "1 concurrent lease=1s",
        "give-back-lease",
        OnStoreError::Closed,
    );
    let held = slots.check(&["job"]).await.unwrap();
    assert!(held.is_allowed());
    proxy.freeze(true);
    waiter.abort();
    let failed = || {
        metric(
            "tollgate_give_back_failures_total",
            &[("store", "give-back"), ("kind", "timeout")],
        )
    };
    let missed_renewals = || {
        metric(
            "tollgate_lease_failures_total",
            &[("store", "give-back"), ("call", "renew")],
        )
    };
    let deadline = Instant::now() + Duration::from_secs(3);
    while (failed() < 1.0 || missed_renewals() < 1.0) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(failed(), 1.0);
    assert!(missed_renewals() >= 1.0);
    assert_eq!(
        logged("could not give back scheduled slots", "give-back"),
        1
    );
    assert_eq!(
        logged("could not renew or release concurrency slots", "give-back"),
        1
    );
    proxy.freeze(false);
    drop(held);
}

/// A concurrency check the store never received (its breaker open) took no slot, and none is
/// released: the keeper is not sent one release per check of the outage, to retry and warn
/// of until its lease runs out.
#[tokio::test]
async fn slots_the_store_never_saw_are_not_released() {
    observed();
    let dead = common::dead_url();
    let store = store_at(&dead, "phantom-slots", 100).await;
    // the breaker opened by checks of another limiter on the store
    let rate = limiter(&store, "5/s", "phantom-rate", OnStoreError::Open);
    for _ in 0..5 {
        let _ = rate.check(&["job"]).await.unwrap();
    }
    let unavailable = || {
        metric(
            "tollgate_store_errors_total",
            &[("store", "phantom-slots"), ("kind", "unavailable")],
        )
    };
    assert!(unavailable() >= 1.0, "the breaker is open");
    let slots = limiter(&store, "1 concurrent", "phantom-slots", OnStoreError::Open);
    let before = unavailable();
    for _ in 0..20 {
        let d = slots.check(&["job"]).await.unwrap();
        assert_eq!(d.origin(), Origin::FailOpen);
    }
    assert_eq!(unavailable() - before, 20.0, "none of them sent");
    // the keeper's release ticks (every 250 ms)
    tokio::time::sleep(Duration::from_millis(700)).await;
    let releases = metric(
        "tollgate_lease_failures_total",
        &[("store", "phantom-slots"), ("call", "release")],
    );
    assert_eq!(releases, 0.0, "releases of slots never taken");
}

/// A concurrency slot the store holds no longer while its request runs (its key lost to a
/// flush, or its lease expired unrenewed) is reported, on Redis and in process: the limit
/// may admit more than its count until that request ends, and that must not go unseen.
#[tokio::test]
async fn a_slot_lost_while_its_request_runs_is_counted_and_logged() {
    observed();
    let server = RedisServer::start();
    let store = store_at(&server.url(), "lost-lease", 1000).await;
    let slots = limiter(
        &store,
        "1 concurrent lease=1s",
        "lost",
        OnStoreError::Closed,
    );
    let held = slots.check(&["job"]).await.unwrap();
    assert!(held.is_allowed());
    assert!(!slots.check(&["job"]).await.unwrap().is_allowed());
    // the slot set is lost (a flush, a failover that lost the write)
    let mut conn = server.conn();
    let keys = common::slot_keys(&mut conn, "lost-lease");
    assert_eq!(keys.len(), 1, "{keys:?}");
    let () = redis::cmd("DEL").arg(&keys).query(&mut conn).unwrap();
    let lost = || metric("tollgate_leases_lost_total", &[("store", "lost-lease")]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while lost() < 1.0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(lost(), 1.0);
    assert_eq!(
        logged(
            "concurrency slots expired while their requests ran",
            "lost-lease"
        ),
        1
    );
    // it is renewed no more: the slot another request now takes is not counted as lost
    let second = slots.check(&["job"]).await.unwrap();
    assert!(second.is_allowed(), "the slot is free again");
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(lost(), 1.0);
    drop((held, second));

    // in process: a lease that expired before its renewal came (the clock of the store
    // jumped past it, as a runtime stalled longer than the lease would see it)
    let clock = common::manual_clock();
    let memory = tollgate::MemoryStore::builder()
        .clock(tollgate::Clock::Manual(clock.clone()))
        .build();
    let slots = Limiter::new(memory, "1 concurrent lease=1s".parse().unwrap());
    let held = slots.check(&["job"]).await.unwrap();
    assert!(held.is_allowed());
    clock.advance(Duration::from_secs(2));
    // (every memory store counts under this label: the difference is this one's)
    let before = metric("tollgate_leases_lost_total", &[("store", "memory")]);
    let lost = || metric("tollgate_leases_lost_total", &[("store", "memory")]) - before;
    let deadline = Instant::now() + Duration::from_secs(5);
    while lost() < 1.0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(lost(), 1.0);
    drop(held);
}

/// While the store cannot connect, why is logged (at most a line every 10 s), though the
/// checks answered meanwhile learn only that it is down.
#[tokio::test]
async fn why_the_store_cannot_connect_is_logged() {
    observed();
    let store = store_at(&common::dead_url(), "unreachable", 100).await;
    let limiter = limiter(&store, "2/min", "unreachable", OnStoreError::Open);
    // (a store just built may still be on its first attempt)
    let health = store.health();
    assert!(
        matches!(health, StoreHealth::Connecting | StoreHealth::Down),
        "{health:?}"
    );
    let d = limiter.check(&["a"]).await.unwrap();
    assert_eq!(d.origin(), Origin::FailOpen);
    let lines = || {
        log_text()
            .lines()
            .filter(|l| l.contains("could not connect") && l.contains("store=\"unreachable\""))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while lines().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // the reconnection goes on failing, several times a second: still one line
    tokio::time::sleep(Duration::from_secs(1)).await;
    let lines = lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].to_lowercase().contains("refused"), "{lines:?}");
    let health = store.health();
    assert!(matches!(health, StoreHealth::Down), "{health:?}");
}

/// Redis stops answering while every caller gives up before the store's timeout (a deadline
/// of its own, shorter): the calls they abandon count as unanswered, so the connection is
/// condemned after a silence as with timeouts, and checks are soon answered by the policy at
/// once instead of each waiting out its caller's deadline.
#[tokio::test]
async fn calls_their_callers_abandon_still_condemn_a_silent_connection() {
    observed();
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port).await;
    let store = RedisStore::builder(proxy.url())
        .prefix("abandoned")
        .timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    let limiter = limiter(&store, "100/s", "abandoned", OnStoreError::Open);
    assert_eq!(limiter.check(&["a"]).await.unwrap().origin(), Origin::Store);
    proxy.freeze(true);
    let caller_deadline = Duration::from_millis(50);
    let deadline = Instant::now() + Duration::from_secs(6);
    let answered = loop {
        assert!(
            Instant::now() < deadline,
            "checks still wait out their callers' deadline"
        );
        match tokio::time::timeout(caller_deadline, limiter.check(&["a"])).await {
            Ok(answer) => break answer.unwrap(),
            Err(_) => continue,
        }
    };
    assert_eq!(answered.origin(), Origin::FailOpen);
    proxy.freeze(false);
}

/// A call its caller gives up on (a deadline of its own, shorter than the store's timeout)
/// is in the store's latencies, for as long as it ran: without it the latencies would read
/// low exactly while Redis is slow. It is no store error.
#[tokio::test]
async fn calls_their_callers_give_up_on_are_in_the_latencies() {
    observed();
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port).await;
    let store = store_at(&proxy.url(), "given-up", 300).await;
    let limiter = limiter(&store, "100/s", "given-up", OnStoreError::Open);
    assert_eq!(limiter.check(&["a"]).await.unwrap().origin(), Origin::Store);
    let calls = || metric("tollgate_store_call_seconds", &[("store", "given-up")]);
    let errors = || metric("tollgate_store_errors_total", &[("store", "given-up")]);
    let (before, errors_before) = (calls(), errors());
    proxy.freeze(true);
    let gave_up = tokio::time::timeout(Duration::from_millis(50), limiter.check(&["a"])).await;
    assert!(gave_up.is_err(), "answered by a frozen store: {gave_up:?}");
    assert_eq!(
        calls() - before,
        1.0,
        "the call given up on is not in the latencies"
    );
    assert_eq!(errors(), errors_before);
    proxy.freeze(false);
}

/// Calls dropped as soon as they are sent (a client resetting each request at once) are no
/// silence: Redis had no time to answer them. However many, with no other call answered
/// between them for seconds, they do not have the connection given up and made again.
#[tokio::test]
async fn calls_dropped_at_once_do_not_condemn_the_connection() {
    let server = RedisServer::start();
    let store = store_at(&server.url(), "dropped-at-once", 300).await;
    let limiter = limiter(&store, "1000/s", "dropped-at-once", OnStoreError::Closed);
    assert!(limiter.check(&["a"]).await.unwrap().is_allowed());
    // one connection of the test's own, for both readings
    let mut admin = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let mut connections = || {
        let info: String = redis::cmd("INFO").arg("stats").query(&mut admin).unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .map(|n| n.trim().parse::<u64>().unwrap())
            .unwrap()
    };
    let before = connections();
    // 25 calls dropped right after they are sent, 100 ms apart: no reply seen for 2.5 s
    for _ in 0..25 {
        {
            // polled once (the call sent), then dropped
            let mut call = std::pin::pin!(limiter.check(&["a"]));
            let polled = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
            assert!(polled.is_pending(), "answered before it was dropped");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(connections(), before, "the connection was made again");
    let answer = limiter.check(&["a"]).await.unwrap();
    assert_eq!(answer.origin(), Origin::Store);
}

/// A waiting check the store fails (a timeout) is answered by the fallback within what the
/// failure left of the caller's wait, not a whole wait more: at `2/s gcra burst=1`, after one
/// request, the next fits 500 ms later; a caller waiting up to 400 ms, 200 ms of which the
/// store's timeout took, is denied rather than held 500 ms. So is a scheduled event.
#[tokio::test]
async fn a_fallback_waits_only_what_the_failure_left() {
    observed();
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port).await;
    let store = store_at(&proxy.url(), "wait-left", 200).await;
    let fallback = OnStoreError::Fallback(tollgate::Fallback::WHOLE);
    let limiter = limiter(&store, "2/s gcra burst=1", "wait-left", fallback);
    // a store of its own: three timeouts in a row open a store's breaker, and a failure
    // answered at once would leave the whole wait
    let own_store = store_at(&proxy.url(), "wait-left-s", 200).await;
    let scheduler = tollgate::Scheduler::builder(own_store, "2/s".parse().unwrap())
        .on_store_error(fallback)
        .build();
    assert_eq!(
        limiter.check(&["warm"]).await.unwrap().origin(),
        Origin::Store
    );
    proxy.freeze(true);
    let wait = Duration::from_millis(400);
    let first = limiter.check_waiting(&["k"], wait).await.unwrap();
    assert!(first.is_allowed());
    assert_eq!(first.origin(), Origin::Fallback);
    let second = limiter.check_waiting(&["k"], wait).await.unwrap();
    assert_eq!(second.origin(), Origin::Fallback);
    assert!(
        !second.is_allowed(),
        "held for the whole wait after the timeout"
    );

    let first = scheduler.schedule("e", wait).await.unwrap();
    assert!(first.is_allowed());
    let second = scheduler.schedule("e", wait).await.unwrap();
    assert_eq!(second.origin(), Origin::Fallback);
    assert!(
        !second.is_allowed(),
        "held for the whole wait after the timeout"
    );
    proxy.freeze(false);
}

/// A store used from two runtimes, its slot-renewing task on the first: when that one shuts
/// down, the task started on the second (here by a guard let go) takes over the slots the
/// lost one renewed, so a request still running on the second keeps its slot past its lease,
/// and the takeover is said.
#[test]
fn a_renewing_task_lost_with_its_runtime_is_taken_over() {
    let _serial = KEEPER_LINES.lock().unwrap_or_else(|e| e.into_inner());
    observed();
    let slots = Limiter::builder(
        tollgate::MemoryStore::new(),
        "3 concurrent lease=1s".parse().unwrap(),
    )
    .name("keeper-taken-over")
    .build();
    let before = keeper_lost_lines();
    let first = current_thread();
    let second = current_thread();
    // the task starts on the first runtime, and renews the second's slots too
    let on_first = first.block_on(slots.check(&["job"])).unwrap();
    let long = second.block_on(slots.check(&["job"])).unwrap();
    let short = second.block_on(slots.check(&["job"])).unwrap();
    assert!(on_first.is_allowed() && long.is_allowed() && short.is_allowed());
    drop(first);
    second.block_on(async {
        drop(short);
        // past the lease: the slots still held are still held
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let next = slots.check(&["job"]).await.unwrap();
        assert!(next.is_allowed(), "the short request's slot was given back");
        let over = slots.check(&["job"]).await.unwrap();
        assert!(!over.is_allowed(), "three slots held: {over:?}");
        drop(next);
    });
    assert_eq!(keeper_lost_lines() - before, 1);
    drop((on_first, long));
}

/// A slot taken outside any runtime (a memory store's check, polled by hand) has no task to
/// renew it: the first task started on a runtime (by the next slot taken) takes it over, so
/// it is held past its lease while its request runs.
#[test]
fn a_slot_taken_outside_a_runtime_is_renewed_once_a_task_runs() {
    use futures::FutureExt;
    let _serial = KEEPER_LINES.lock().unwrap_or_else(|e| e.into_inner());
    observed();
    let slots = Limiter::builder(
        tollgate::MemoryStore::new(),
        "2 concurrent lease=1s".parse().unwrap(),
    )
    .name("outside-a-runtime")
    .build();
    let outside = slots
        .check(&["job"])
        .now_or_never()
        .expect("the memory store decides at once")
        .unwrap();
    assert!(outside.is_allowed());
    let runtime = current_thread();
    runtime.block_on(async {
        let inside = slots.check(&["job"]).await.unwrap();
        assert!(inside.is_allowed());
        // past the lease: both slots still held
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let third = slots.check(&["job"]).await.unwrap();
        assert!(!third.is_allowed(), "two slots held: {third:?}");
        drop(inside);
    });
    drop(outside);
}

/// A Redis store's slot let go as its runtime shuts down is released: the release goes to
/// the slot-renewing task started on the next runtime, rather than being lost with the old
/// one and leaving the slot taken until its lease runs out (15 s).
#[test]
fn a_redis_slot_let_go_as_its_runtime_shuts_down_is_released() {
    observed();
    let server = RedisServer::start();
    let first = current_thread();
    let store = connected_on(&first, &server, "shutdown-release");
    let slots = limiter(
        &store,
        "2 concurrent",
        "shutdown-release",
        OnStoreError::Closed,
    );
    hold_a_slot_until_shutdown(&first, &slots);
    drop(first);
    let second = current_thread();
    second.block_on(async {
        let again = slots.check(&["job"]).await.unwrap();
        assert!(again.is_allowed());
        common::eventually(Duration::from_secs(3), || async {
            let d = slots.check(&["job"]).await.unwrap();
            if d.is_allowed() {
                Ok(())
            } else {
                Err("the slot let go at shutdown is still taken")
            }
        })
        .await;
    });
}

/// A memory store at its bound that evicts states still in use (a flood of new identifiers)
/// says so: those identifiers' counts start afresh.
#[tokio::test]
async fn live_states_evicted_at_the_bound_are_counted_and_logged() {
    observed();
    let store = tollgate::MemoryStore::builder()
        .max_keys(64)
        .name("bounded")
        .build();
    let limiter = Limiter::new(store, "1/min".parse().unwrap());
    let evicted = |store| metric("tollgate_memory_evictions_total", &[("store", store)]);
    let before = evicted("bounded");
    for i in 0..1000 {
        let _ = limiter.check(&[format!("ip:{i}")]).await.unwrap();
    }
    assert!(
        evicted("bounded") - before >= 900.0,
        "{}",
        evicted("bounded") - before
    );
    assert!(log_text().lines().any(|l| l
        .contains("at its bound (max_keys) evicted states still in use")
        && l.contains("store=\"bounded\"")));
    // an unnamed store is `memory`
    let unnamed = Limiter::new(
        tollgate::MemoryStore::builder().max_keys(64).build(),
        "1/min".parse().unwrap(),
    );
    let before = evicted("memory");
    for i in 0..200 {
        let _ = unnamed.check(&[format!("ip:{i}")]).await.unwrap();
    }
    assert!(evicted("memory") > before);
}

/// A Redis store used from a second runtime once the first, on which it connected, has shut
/// down: its connection task went with that runtime, and the next check starts another and
/// is answered by Redis (every call timed out before), with a warning of the lost task.
#[test]
fn a_connection_task_lost_with_its_runtime_is_started_again() {
    observed();
    let server = RedisServer::start();
    let first = current_thread();
    let store = connected_on(&first, &server, "lost-task");
    let limiter = limiter(&store, "10/min", "lost-task", OnStoreError::Closed);
    let d = first.block_on(limiter.check(&["a"])).unwrap();
    assert_eq!(d.origin(), Origin::Store);
    drop(first);
    let second = current_thread();
    let d = second.block_on(limiter.check(&["a"])).unwrap();
    assert_eq!(d.origin(), Origin::Store);
    assert_eq!(d.statuses()[0].remaining, 8);
    assert_eq!(
        logged("connection task had ended with its runtime", "lost-task"),
        1
    );
}

/// A runtime shutting down with requests holding slots drops the slot-renewing task before
/// their guards, which then release their slots: nothing is lost, and nothing is said, then
/// or when a later slot is taken.
#[test]
fn slots_let_go_as_their_runtime_shuts_down_are_not_reported() {
    let _serial = KEEPER_LINES.lock().unwrap_or_else(|e| e.into_inner());
    observed();
    let slots = Limiter::builder(
        tollgate::MemoryStore::new(),
        "2 concurrent".parse().unwrap(),
    )
    .name("shutdown-quiet")
    .build();
    let before = keeper_lost_lines();
    let first = current_thread();
    hold_a_slot_until_shutdown(&first, &slots);
    drop(first);
    let second = current_thread();
    let again = second.block_on(slots.check(&["job"])).unwrap();
    assert!(again.is_allowed());
    let third = second.block_on(slots.check(&["job"])).unwrap();
    assert!(
        third.is_allowed(),
        "the slot let go at shutdown was released"
    );
    assert_eq!(keeper_lost_lines() - before, 0);
    drop((again, third));
}

/// A Redis that answers but refuses the scripts' writes (`OOM` at `maxmemory` under
/// `noeviction`) keeps the breaker open: its probe is a check, which fails as the checks do,
/// so the breaker does not close on an answer and open again on the next checks (five times
/// a second, two warnings each time). Once writes are taken again, it closes, once.
#[tokio::test]
async fn a_server_refusing_writes_keeps_the_breaker_open() {
    observed();
    let server = RedisServer::start();
    let store = store_at(&server.url(), "refusing", 200).await;
    let limiter = limiter(&store, "1000/s", "refusing", OnStoreError::Open);
    assert_eq!(limiter.check(&["a"]).await.unwrap().origin(), Origin::Store);
    let mut conn = refusing_writes(&server);
    // two seconds of checks: ten probes would have closed a breaker probed with `TIME`
    let until = Instant::now() + Duration::from_secs(2);
    let mut from_store = 0;
    while Instant::now() < until {
        let d = limiter.check(&["a"]).await.unwrap();
        from_store += usize::from(d.origin() == Origin::Store);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(from_store, 0, "no check passes while writes are refused");
    assert_eq!(logged("rate-limit store failing", "refusing"), 1);
    assert_eq!(logged("rate-limit store answers again", "refusing"), 0);
    config_set(&mut conn, "maxmemory", "0");
    common::eventually(Duration::from_secs(5), || async {
        match limiter.check(&["a"]).await {
            Ok(d) if d.origin() == Origin::Store => Ok(()),
            other => Err(format!("still failing: {other:?}")),
        }
    })
    .await;
    assert_eq!(logged("rate-limit store answers again", "refusing"), 1);
}

/// `CONFIG SET name value` on `conn`.
fn config_set(conn: &mut redis::Connection, name: &str, value: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query(conn)
        .unwrap();
}

/// Makes `server` refuse the scripts' writes (`OOM`: `maxmemory` under `noeviction`), and
/// gives the connection that did it (`maxmemory 0` takes writes again).
fn refusing_writes(server: &RedisServer) -> redis::Connection {
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    config_set(&mut conn, "maxmemory-policy", "noeviction");
    config_set(&mut conn, "maxmemory", "1");
    conn
}

/// A store call that fails now and then, never three in a row, does not open the breaker:
/// the checks it failed were answered by the failure policy all the same, and a warning says
/// so (with the default features, no metric would).
#[tokio::test]
async fn failures_that_never_open_the_breaker_are_logged() {
    observed();
    let server = RedisServer::start();
    let store = store_at(&server.url(), "now-and-then", 200).await;
    let limiter = limiter(&store, "1000/s", "now-and-then", OnStoreError::Open);
    assert_eq!(limiter.check(&["a"]).await.unwrap().origin(), Origin::Store);
    let mut conn = refusing_writes(&server);
    let failed = limiter.check(&["a"]).await.unwrap();
    assert_eq!(failed.origin(), Origin::FailOpen);
    config_set(&mut conn, "maxmemory", "0");
    assert_eq!(limiter.check(&["a"]).await.unwrap().origin(), Origin::Store);
    assert_eq!(logged("rate-limit store calls failed", "now-and-then"), 1);
    assert_eq!(logged("rate-limit store failing", "now-and-then"), 0);
}

/// Whether the metric `name` with the label `store` = `store` has been written.
fn recorded(name: &str, store: &str) -> bool {
    observed::observed()
        .metrics
        .0
        .lock()
        .unwrap()
        .keys()
        .any(|k| k.name() == name && k.labels().any(|l| l.key() == "store" && l.value() == store))
}

/// The breaker's gauge is there, closed, from the store's start (before any failure), is not
/// closed by another store of the prefix made meanwhile, and is not left open by a store
/// dropped while its breaker was open.
#[tokio::test]
async fn the_breaker_gauge_is_there_from_the_start_and_closed_when_its_store_goes() {
    observed();
    let gauge = "tollgate_store_breaker_open";
    let store = store_at(&common::dead_url(), "gauged", 100).await;
    assert!(recorded(gauge, "gauged"));
    assert_eq!(metric(gauge, &[("store", "gauged")]), 0.0);
    let limiter = limiter(&store, "2/min", "gauged", OnStoreError::Open);
    for _ in 0..3 {
        let d = limiter.check(&["a"]).await.unwrap();
        assert_eq!(d.origin(), Origin::FailOpen);
    }
    assert_eq!(metric(gauge, &[("store", "gauged")]), 1.0);
    // another store of the prefix (one rebuilt during the outage) leaves it open
    let rebuilt = store_at(&common::dead_url(), "gauged", 100).await;
    assert_eq!(metric(gauge, &[("store", "gauged")]), 1.0);
    drop((limiter, store));
    assert_eq!(metric(gauge, &[("store", "gauged")]), 0.0);
    drop(rebuilt);
}

/// A peek (`Limiter::peek`) is no check: the failure policy answering it, or the deny cache,
/// is not counted as answering a check; a check is.
#[tokio::test]
async fn peeks_are_not_counted_as_checks_answered() {
    observed();
    let answered = |limiter: &str| {
        metric(
            "tollgate_failure_policy_total",
            &[("limiter", limiter), ("action", "open")],
        )
    };
    let down = store_at(&common::dead_url(), "peek-down", 100).await;
    let open = limiter(&down, "2/min", "peek-down", OnStoreError::Open);
    assert_eq!(open.peek(&["a"]).await.unwrap().origin(), Origin::FailOpen);
    assert_eq!(answered("peek-down"), 0.0);
    let d = open.check(&["a"]).await.unwrap();
    assert_eq!(d.origin(), Origin::FailOpen);
    assert_eq!(answered("peek-down"), 1.0);

    let server = RedisServer::start();
    let store = store_at(&server.url(), "peek-cached", 200).await;
    let cached = limiter(&store, "1/min", "peek-cached", OnStoreError::Open);
    let hits = || {
        metric(
            "tollgate_deny_cache_hits_total",
            &[("limiter", "peek-cached")],
        )
    };
    assert!(cached.check(&["a"]).await.unwrap().is_allowed());
    assert!(!cached.check(&["a"]).await.unwrap().is_allowed());
    let peeked = cached.peek(&["a"]).await.unwrap();
    assert_eq!(peeked.origin(), Origin::DenyCache);
    assert_eq!(hits(), 0.0);
    let d = cached.check(&["a"]).await.unwrap();
    assert_eq!(d.origin(), Origin::DenyCache);
    assert_eq!(hits(), 1.0);
}

/// A waiter of a scheduler under `prefix` (`1/min`, its queue's first slot taken), placed a
/// minute ahead and polled on `runtime` until it waits.
fn a_waiter(
    runtime: &tokio::runtime::Runtime,
    server: &RedisServer,
    prefix: &str,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<tollgate::Decision, Error>>>> {
    let scheduler = runtime.block_on(async {
        let store = store_at(&server.url(), prefix, 200).await;
        let scheduler = tollgate::Scheduler::new(store, "1/min".parse().unwrap());
        let first = scheduler.schedule("psp", Duration::ZERO).await.unwrap();
        assert!(first.is_allowed());
        scheduler
    });
    let mut waiter =
        Box::pin(async move { scheduler.schedule("psp", Duration::from_secs(120)).await });
    let waited = runtime
        .block_on(async { tokio::time::timeout(Duration::from_millis(500), &mut waiter).await });
    assert!(waited.is_err(), "still waiting for its slot");
    waiter
}

/// A scheduled waiter dropped where no Tokio runtime runs (moved to a thread of its own)
/// cannot send its give-back: its slot stays taken, and that is counted and logged.
#[test]
fn a_give_back_without_a_runtime_is_counted_and_logged() {
    observed();
    let server = RedisServer::start();
    let runtime = current_thread();
    drop(a_waiter(&runtime, &server, "give-back-alone"));
    assert_eq!(
        metric(
            "tollgate_give_back_failures_total",
            &[("store", "give-back-alone"), ("kind", "unavailable")],
        ),
        1.0
    );
    assert_eq!(
        logged("could not give back scheduled slots", "give-back-alone"),
        1
    );
}

/// A layer that charges by response peeks first, then charges the responses it selects: a
/// request the failure policy answered is counted once, at the peek, whether it is refused
/// (under `Closed`, where no charge follows) or let through and charged.
#[tokio::test]
async fn a_layer_charging_by_response_counts_each_failure_answer_once() {
    use tower::{Layer, Service, ServiceExt};

    observed();
    let down = store_at(&common::dead_url(), "by-response-down", 100).await;
    let answered = |limiter: &str, action: &str| {
        metric(
            "tollgate_failure_policy_total",
            &[("limiter", limiter), ("action", action)],
        )
    };
    for (name, on_error, action, status) in [
        ("by-response-closed", OnStoreError::Closed, "closed", 503),
        ("by-response-open", OnStoreError::Open, "open", 401),
    ] {
        let layer = tollgate::RateLimitLayer::new(limiter(&down, "5/min", name, on_error))
            .key(|_: &tollgate::key::RequestView<'_>| Some("client".to_string()))
            .charge_if(|res: &http::response::Parts| res.status == http::StatusCode::UNAUTHORIZED);
        let mut svc = layer.layer(tower::service_fn(|_: http::Request<String>| async {
            let mut res = http::Response::new(String::new());
            *res.status_mut() = http::StatusCode::UNAUTHORIZED;
            Ok::<_, std::convert::Infallible>(res)
        }));
        let res = svc
            .ready()
            .await
            .unwrap()
            .call(http::Request::new(String::new()))
            .await
            .unwrap();
        assert_eq!(res.status().as_u16(), status, "{name}");
        assert_eq!(answered(name, action), 1.0, "{name}");
    }
}

/// A store built lazily outside a runtime connects when its health is asked within one: a
/// readiness probe that gates traffic sees it come up without waiting for a check.
#[test]
fn a_lazy_store_asked_its_health_connects() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix("lazy-health")
        .build_lazy()
        .unwrap();
    let health = store.health();
    assert!(matches!(health, StoreHealth::Connecting), "{health:?}");
    current_thread().block_on(async {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !store.health().is_up() {
            assert!(Instant::now() < deadline, "{:?}", store.health());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}

/// A scheduled waiter dropped as its runtime shuts down: the give-back's task is dropped with
/// the runtime before it runs, its slot stays taken, and that is counted and logged.
#[test]
fn a_give_back_dropped_with_its_runtime_is_counted_and_logged() {
    observed();
    let server = RedisServer::start();
    let runtime = current_thread();
    let waiter = a_waiter(&runtime, &server, "give-back-shutdown");
    // dropped on the runtime (its give-back's task is spawned there), which then shuts down
    // before running it
    runtime.block_on(async move { drop(waiter) });
    drop(runtime);
    assert_eq!(
        metric(
            "tollgate_give_back_failures_total",
            &[("store", "give-back-shutdown"), ("kind", "unavailable")],
        ),
        1.0
    );
}

//! What the Redis store writes, looked at in Redis itself; concurrency through real
//! connections; and a Redis that is flushed, down, stalled or restarted.

mod common;

use std::time::{Duration, Instant};

use common::{manual_clock, snapshot, unique_prefix, RedisServer};
use redis::Commands;
use tollgate::{Clock, Error, Limiter, RedisStore, StoreError};

#[tokio::test]
async fn a_denied_request_leaves_redis_exactly_as_it_was() {
    let server = RedisServer::start();
    let clock = manual_clock();
    let store = server.store(Clock::Manual(clock.clone())).await;
    let prefix = store.prefix().to_string();
    let l = Limiter::new(
        store,
        "3/s fixed, 10/s log, 10/s, 10/s gcra, 10/s bucket capacity=20"
            .parse()
            .unwrap(),
    );
    let mut conn = server.conn();
    for _ in 0..3 {
        assert!(l.check(&["ip:1", "user:1"]).await.unwrap().is_allowed());
        clock.advance(Duration::from_millis(7));
    }
    let before = snapshot(&mut conn, &prefix);
    // per identifier: one packed key (the four window and GCRA limits) and the log's
    assert_eq!(before.len(), 4, "5 limits x 2 identifiers, in 2 keys each");
    for _ in 0..5 {
        assert!(!l.check(&["ip:1", "user:1"]).await.unwrap().is_allowed());
        // a fresh identifier denied alongside an exhausted one gets no key at all
        assert!(!l.check(&["ip:1", "user:2"]).await.unwrap().is_allowed());
        clock.advance(Duration::from_millis(3));
    }
    assert_eq!(snapshot(&mut conn, &prefix), before);
    // the log holds exactly the three admitted entries
    let log: Vec<String> = conn.keys(format!("{prefix}:{{ip:1}}:l*")).unwrap();
    let card: usize = conn.zcard(&log[0]).unwrap();
    assert_eq!(card, 3);
}

#[tokio::test]
async fn same_microsecond_entries_are_distinct_members() {
    let server = RedisServer::start();
    let clock = manual_clock();
    let store = server.store(Clock::Manual(clock.clone())).await;
    let prefix = store.prefix().to_string();
    let l = Limiter::new(store, "1000/s log".parse().unwrap());
    for _ in 0..100 {
        assert!(l.check(&["k"]).await.unwrap().is_allowed());
    }
    assert!(l.check_n(&["k"], 5).await.unwrap().is_allowed());
    let mut conn = server.conn();
    let key: Vec<String> = conn.keys(format!("{prefix}:*")).unwrap();
    let members: Vec<(String, f64)> = conn.zrange_withscores(&key[0], 0, -1).unwrap();
    assert_eq!(members.len(), 105);
    let now = clock.now_micros() as f64;
    assert!(members.iter().all(|(_, score)| *score == now));
}

/// Every key gets a positive TTL no shorter than its state's lifetime, and is gone once its
/// state no longer matters. (Manual clock: lifetimes are exact; PTTL counts real time.)
#[tokio::test]
async fn ttls_cover_the_state_lifetime() {
    let server = RedisServer::start();
    let clock = manual_clock(); // midnight: aligned to every window below
    let store = server.store(Clock::Manual(clock.clone())).await;
    let prefix = store.prefix().to_string();
    clock.advance(Duration::from_secs(60));
    let mut conn = server.conn();
    // Each limit alone (its own key, packed or not), then the packed ones together, whose
    // key lives as long as the longest-lived of them. Lifetime from the decision, in ms.
    let expected = [
        ("10/h log", "l", 3_600_000), // the entry leaves the log after the window
        ("10/h sliding", "w", 2 * 3_600_000 - 60_000), // the count weighs on the next window too
        // its sub-window (the hour's first quarter) leaves the ring after 1 h 15 min
        ("10/h", "r", 3_600_000 + 900_000 - 60_000),
        ("10/h fixed", "f", 3_600_000 - 60_000), // the window ends
        ("10/h gcra", "g", 360_000),             // one emission interval of debt
        ("4/h bucket capacity=2", "b", 900_000),
        (
            "10/h fixed, 10/h gcra, 10/h sliding, 4/h bucket capacity=2",
            "f",
            2 * 3_600_000 - 60_000,
        ),
    ];
    for (policy, tag, lifetime) in expected {
        let l = Limiter::new(store.clone(), policy.parse().unwrap());
        assert!(l.check(&["a"]).await.unwrap().is_allowed());
        let keys: Vec<String> = conn.keys(format!("{prefix}:{{a}}:{tag}*")).unwrap();
        let key = keys
            .iter()
            .find(|k| k.contains(',') == policy.contains(','))
            .unwrap();
        let pttl: i64 = conn.pttl(key).unwrap();
        assert!(pttl > 0, "{tag}: {pttl}");
        assert!(pttl <= lifetime + 1, "{tag}: {pttl} > {lifetime}");
        assert!(
            pttl >= lifetime - 2000,
            "{tag}: {pttl} much shorter than {lifetime}"
        );
    }
}

/// With a caller's clock, every key lives at least a minute of Redis' time, the sorted set of
/// a short sliding log too: Redis' clock, on which TTLs run, does not follow the caller's, so
/// a state must not vanish while the caller's clock stands still. (A `3/200ms log` key with
/// a TTL of its window was gone 201 ms of real time later, and the next check at the same
/// instant of the caller's clock admitted three more.)
#[tokio::test]
async fn with_a_callers_clock_a_short_log_outlives_real_time() {
    let server = RedisServer::start();
    let clock = manual_clock();
    let store = server.store(Clock::Manual(clock.clone())).await;
    let prefix = store.prefix().to_string();
    let mut conn = server.conn();
    for policy in ["3/200ms log", "3/200ms log, 5/200ms"] {
        let l = Limiter::new(store.clone(), policy.parse().unwrap());
        let id = format!("short-{}", policy.len());
        for _ in 0..3 {
            assert!(l.check(&[&id]).await.unwrap().is_allowed(), "{policy}");
        }
        assert!(!l.check(&[&id]).await.unwrap().is_allowed(), "{policy}");
        let keys: Vec<String> = conn.keys(format!("{prefix}:{{{id}}}:*")).unwrap();
        assert!(!keys.is_empty(), "{policy}");
        for key in &keys {
            let pttl: i64 = conn.pttl(key).unwrap();
            assert!(pttl > 59_000, "{policy}: {key} lives {pttl} ms");
        }
        // real time passes, the caller's clock does not: still denied
        tokio::time::sleep(Duration::from_millis(300)).await;
        let d = l.check(&[&id]).await.unwrap();
        assert!(!d.is_allowed(), "{policy}: {d:?}");
    }
}

/// With a caller's clock a concurrency slot set lives at least a minute too: real time
/// passing past the lease while the caller's clock stands still frees no slot (the memory
/// store, on the caller's clock alone, frees none either).
#[tokio::test]
async fn with_a_callers_clock_a_slot_set_outlives_real_time() {
    let server = RedisServer::start();
    let clock = manual_clock();
    let store = server.store(Clock::Manual(clock.clone())).await;
    let prefix = store.prefix().to_string();
    let mut conn = server.conn();
    let l = Limiter::new(store, "1 concurrent lease=1s".parse().unwrap());
    let held = l.check(&["job"]).await.unwrap();
    assert!(held.is_allowed());
    let keys = common::slot_keys(&mut conn, &prefix);
    assert_eq!(keys.len(), 1, "{keys:?}");
    let pttl: i64 = conn.pttl(&keys[0]).unwrap();
    assert!(pttl > 59_000, "{} lives {pttl} ms", keys[0]);
    // a renewal gives it a minute too (were the key's TTL shorter, as a key made by an older
    // version would have it)
    let _: bool = conn.pexpire(&keys[0], 2000).unwrap();
    // past the lease in real time, the caller's clock standing still: still taken
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(!l.check(&["job"]).await.unwrap().is_allowed());
    let pttl: i64 = conn.pttl(&keys[0]).unwrap();
    assert!(pttl > 58_000, "{} lives {pttl} ms after renewals", keys[0]);
    drop(held);
}

/// A check that finds a log's entries all out of its window, the key not expired yet, trims
/// them (the set empties, and Redis deletes it) and charges anew: the key it makes again has
/// a TTL. (It had none, and stayed in Redis for good.)
#[tokio::test]
async fn a_log_emptied_and_charged_again_keeps_a_ttl() {
    let server = RedisServer::start();
    let clock = manual_clock();
    let store = server.store(Clock::Manual(clock.clone())).await;
    let prefix = store.prefix().to_string();
    let mut conn = server.conn();
    for policy in ["1/s log", "2/s log, 5/s"] {
        let l = Limiter::new(store.clone(), policy.parse().unwrap());
        let id = format!("emptied-{}", policy.len());
        assert!(l.check(&[&id]).await.unwrap().is_allowed(), "{policy}");
        // the entry leaves the window (an entry at exactly now - 1 s is out of it)
        clock.advance(Duration::from_secs(1));
        assert!(l.check(&[&id]).await.unwrap().is_allowed(), "{policy}");
        let keys: Vec<String> = conn.keys(format!("{prefix}:{{{id}}}:l*")).unwrap();
        assert_eq!(keys.len(), 1, "{policy}: {keys:?}");
        let pttl: i64 = conn.pttl(&keys[0]).unwrap();
        assert!(pttl > 0, "{policy}: {} has no TTL ({pttl})", keys[0]);
        // the same through the script of a check that may wait (admitted at once)
        clock.advance(Duration::from_secs(1));
        let d = l
            .check_waiting(&[&id], Duration::from_secs(2))
            .await
            .unwrap();
        assert!(d.is_allowed(), "{policy}");
        let pttl: i64 = conn.pttl(&keys[0]).unwrap();
        assert!(
            pttl > 0,
            "{policy}: waiting: {} has no TTL ({pttl})",
            keys[0]
        );
    }
}

/// Later checks never leave the packed key a TTL shorter than its state's life.
#[tokio::test]
async fn ttls_are_never_shortened() {
    let server = RedisServer::start();
    let clock = manual_clock(); // midnight
    let store = server.store(Clock::Manual(clock.clone())).await;
    let prefix = store.prefix().to_string();
    let l = Limiter::new(store, "10/h, 100/d fixed".parse().unwrap());
    let mut conn = server.conn();
    let day: i64 = 86_400_000;
    // (advance before the check, lifetime after it in ms: when the day's window ends)
    for (advance, lifetime) in [
        (60_000, day - 60_000),
        (1_800_000, day - 1_860_000),
        (3_600_000, day - 5_460_000),
        (day - 5_460_000 + 10_000, day - 10_000),
    ] {
        clock.advance(Duration::from_millis(advance as u64));
        assert!(l.check(&["a"]).await.unwrap().is_allowed());
        let keys: Vec<String> = conn.keys(format!("{prefix}:{{a}}:*")).unwrap();
        assert_eq!(keys.len(), 1);
        let pttl: i64 = conn.pttl(&keys[0]).unwrap();
        assert!(pttl >= lifetime - 2000, "{pttl} shorter than {lifetime}");
        assert!(pttl <= lifetime + 1, "{pttl} longer than {lifetime}");
    }
}

/// With Redis' own clock, a check whose state lives no longer than the stored one keeps the
/// key's TTL rather than writing it again.
#[tokio::test]
async fn a_ttl_that_covers_the_state_is_kept() {
    let server = RedisServer::start();
    let store = server.store(Clock::Real).await;
    let prefix = store.prefix().to_string();
    let l = Limiter::new(store, "100/d fixed".parse().unwrap());
    let mut conn = server.conn();
    assert!(l.check(&["a"]).await.unwrap().is_allowed());
    let keys: Vec<String> = conn.keys(format!("{prefix}:{{a}}:*")).unwrap();
    let at: i64 = redis::cmd("PEXPIRETIME")
        .arg(&keys[0])
        .query(&mut conn)
        .unwrap();
    // an expiry later than the state needs (midnight UTC) is left alone
    let later = at + 3_600_000;
    let _: i64 = redis::cmd("PEXPIREAT")
        .arg(&keys[0])
        .arg(later)
        .query(&mut conn)
        .unwrap();
    assert!(l.check(&["a"]).await.unwrap().is_allowed());
    let again: i64 = redis::cmd("PEXPIRETIME")
        .arg(&keys[0])
        .query(&mut conn)
        .unwrap();
    // (unless the two checks straddle midnight UTC, when the state lives a day longer)
    assert!(
        again == later || again > at + 86_000_000,
        "{at}, {later}, {again}"
    );
}

/// On Redis' clock, every key gets a TTL of about its state's life (at most two windows) and
/// is gone once its state no longer matters. (Windows of a second: the reads of the TTLs
/// after the checks have most of a second to be made on a busy machine.)
#[tokio::test]
async fn keys_disappear_once_their_state_no_longer_matters() {
    let server = RedisServer::start();
    let store = server.store(Clock::Real).await;
    let prefix = store.prefix().to_string();
    let l = Limiter::new(
        store,
        "5/s log, 5/s, 5/s fixed, 5/s gcra, 5/s bucket"
            .parse()
            .unwrap(),
    );
    let mut conn = server.conn();
    for _ in 0..3 {
        assert!(l.check(&["ip:9", "user:9"]).await.unwrap().is_allowed());
    }
    let keys: Vec<String> = conn.keys(format!("{prefix}:*")).unwrap();
    // per identifier: the packed key of the four window and GCRA limits, and the log
    assert_eq!(keys.len(), 4);
    for k in &keys {
        let pttl: i64 = conn.pttl(k).unwrap();
        assert!(pttl > 0 && pttl <= 2001, "{k}: {pttl}");
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left: Vec<String> = conn.keys(format!("{prefix}:*")).unwrap();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "keys left: {left:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Many tasks on several connections hammering one key never get more than the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_checks_never_exceed_the_limit() {
    let server = RedisServer::start();
    for (policy, exact) in [
        ("50/h log", true),
        ("50/h gcra", true),
        ("50/h bucket", true),
        // the rolling window admits at most its count in any hour: exact in a short run
        ("50/h", true),
        ("50/d fixed", false),
    ] {
        let prefix = unique_prefix();
        let mut tasks = Vec::new();
        for _connection in 0..4 {
            let store = RedisStore::builder(server.url())
                .prefix(prefix.clone())
                .timeout(Duration::from_secs(5))
                .build()
                .await
                .unwrap();
            let l = Limiter::new(store, policy.parse().unwrap());
            for _task in 0..8 {
                let l = l.clone();
                tasks.push(tokio::spawn(async move {
                    let mut admitted = 0;
                    for _ in 0..25 {
                        if l.check(&["hot"]).await.unwrap().is_allowed() {
                            admitted += 1;
                        }
                    }
                    admitted
                }));
            }
        }
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap();
        }
        // 800 attempts at a limit of 50; a boundary of the fixed window may fall inside the
        // run, which then admits at most the limit in each of its windows.
        if exact {
            assert_eq!(total, 50, "{policy}");
        } else {
            assert!((50..=100).contains(&total), "{policy}: {total}");
        }
    }
}

/// After `SCRIPT FLUSH` (as after a restart or failover) the script is loaded again.
#[tokio::test]
async fn script_flush_is_survived() {
    let server = RedisServer::start();
    let store = server.store(Clock::Real).await;
    let l = closed(store, "5/s");
    assert!(l.check(&["a"]).await.unwrap().is_allowed());
    let mut conn = server.conn();
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut conn).unwrap();
    assert!(l.check(&["a"]).await.unwrap().is_allowed());
    let d = l.check(&["a"]).await.unwrap();
    assert_eq!(d.statuses()[0].remaining, 2);
}

/// A limiter that fails closed, so that store failures show as the errors they are.
fn closed(store: RedisStore, policy: &str) -> Limiter {
    Limiter::builder(store, policy.parse().unwrap())
        .on_store_error(tollgate::OnStoreError::Closed)
        .build()
}

/// Nothing listening: a typed error, fast.
#[tokio::test]
async fn redis_down_is_a_store_error() {
    let url = common::dead_url();
    assert!(RedisStore::connect(url.clone()).await.is_err());
    let store = RedisStore::builder(url).build_lazy().unwrap();
    let l = closed(store, "5/s");
    let started = Instant::now();
    let err = l.check(&["a"]).await.unwrap_err();
    assert!(matches!(err, Error::Store(_)), "{err}");
    assert!(started.elapsed() < Duration::from_secs(3));
}

/// A server that accepts connections and never answers: the check times out, with a typed
/// error, after the configured timeout.
#[tokio::test]
async fn a_stalled_redis_times_out() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = listener.accept().await {
            held.push(sock);
        }
    });
    let store = RedisStore::builder(format!("redis://{addr}/"))
        .timeout(Duration::from_millis(200))
        .connect_timeout(Duration::from_millis(200))
        .build_lazy()
        .unwrap();
    let l = closed(store, "5/s");
    let started = Instant::now();
    let err = l.check(&["a"]).await.unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(
            err,
            Error::Store(StoreError::Timeout(_)) | Error::Store(StoreError::Backend(_))
        ),
        "{err}"
    );
    assert!(took < Duration::from_secs(2), "{took:?}");
    hold.abort();
}

/// Redis restarts on the same port: checks fail while it is down, then work again on the same
/// store (reconnected, script reloaded), with the state gone as Redis lost it.
#[tokio::test]
async fn redis_restart_is_survived() {
    let server = RedisServer::start();
    let port = server.port;
    let store = RedisStore::builder(server.url())
        .timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let l = closed(store, "100/min");
    assert!(l.check(&["a"]).await.unwrap().is_allowed());
    drop(server);
    assert!(l.check(&["a"]).await.is_err());
    let _again = common::RedisServer::start_on(port);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match l.check(&["a"]).await {
            Ok(d) => {
                assert!(d.is_allowed());
                assert_eq!(d.statuses()[0].remaining, 99, "fresh state after restart");
                break;
            }
            Err(e) => {
                assert!(Instant::now() < deadline, "never recovered: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[tokio::test]
async fn bad_configuration_is_refused() {
    for prefix in ["", "a{b", "}"] {
        let err = RedisStore::builder("redis://127.0.0.1:1/")
            .prefix(prefix)
            .build_lazy()
            .unwrap_err();
        assert!(matches!(err, StoreError::Config(_)), "{prefix}: {err}");
    }
    let err = RedisStore::builder("not a url").build_lazy().unwrap_err();
    assert!(err.to_string().contains("not a url"), "{err}");
    // timeouts of zero, or past an hour (a deadline `Duration::MAX` ahead cannot be set)
    for (timeout, connect, part) in [
        (Duration::ZERO, Duration::from_secs(1), "timeout"),
        (Duration::MAX, Duration::from_secs(1), "timeout"),
        (Duration::from_secs(3601), Duration::from_secs(1), "timeout"),
        (Duration::from_secs(1), Duration::ZERO, "connect timeout"),
        (Duration::from_secs(1), Duration::MAX, "connect timeout"),
    ] {
        let err = RedisStore::builder("redis://127.0.0.1:1/")
            .timeout(timeout)
            .connect_timeout(connect)
            .build_lazy()
            .unwrap_err();
        assert!(matches!(err, StoreError::Config(_)), "{timeout:?}: {err}");
        assert_eq!(
            err.to_string(),
            format!("{part} must be longer than 0 and at most an hour")
        );
    }
    let hour = Duration::from_secs(3600);
    let store = RedisStore::builder("redis://127.0.0.1:1/")
        .timeout(hour)
        .connect_timeout(hour)
        .build_lazy();
    assert!(store.is_ok(), "an hour is taken");
}

/// The largest policy (16 rolling windows of counts packed in the wide form) checked for the
/// most identifiers (16) at once: Redis compiles its scripts (check, waiting check, peek),
/// and decides as the memory store does, twice admitted, then denied by the first window.
#[tokio::test]
async fn the_largest_policy_is_checked_for_sixteen_identifiers() {
    let server = RedisServer::start();
    let clock = manual_clock();
    let policy: tollgate::Policy = (1..=16)
        .map(|s| format!("{}/{s}s", 2000 + s))
        .collect::<Vec<_>>()
        .join(", ")
        .parse()
        .unwrap();
    let redis = Limiter::new(
        server.store(Clock::Manual(clock.clone())).await,
        policy.clone(),
    );
    let memory = Limiter::new(
        tollgate::MemoryStore::builder()
            .clock(Clock::Manual(clock.clone()))
            .build(),
        policy,
    );
    let ids: Vec<String> = (0..16).map(|i| format!("user:{i}")).collect();
    for (cost, allowed) in [(1000, true), (1001, true), (1, false)] {
        let r = redis.peek_n(&ids, cost).await.unwrap();
        let m = memory.peek_n(&ids, cost).await.unwrap();
        assert_eq!(r.statuses(), m.statuses(), "peek of {cost}");
        let r = redis.check_n(&ids, cost).await.unwrap();
        let m = memory.check_n(&ids, cost).await.unwrap();
        assert_eq!(
            (r.is_allowed(), m.is_allowed()),
            (allowed, allowed),
            "{cost}"
        );
        assert_eq!(r.statuses(), m.statuses(), "check of {cost}");
    }
    // a waiting check: admitted when the first window (1 s) has room again
    let r = redis
        .check_waiting(&ids, Duration::from_secs(2))
        .await
        .unwrap();
    assert!(r.is_allowed());
    assert_eq!(r.origin(), tollgate::Origin::Store);
}

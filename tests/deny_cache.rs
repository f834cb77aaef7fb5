//! The deny cache against a real Redis: one client's flood is answered almost entirely in
//! process, and the cache never denies what Redis would allow.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::RedisServer;
use tollgate::{Clock, Limiter, Origin};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_is_answered_in_process_without_extra_denials() {
    let server = RedisServer::start();
    // the real clock: the deny cache is off with a manual one
    let store = server.store(Clock::Real).await;
    // An exact rolling window: Redis allows 10 in any second, so over a flood of `secs`
    // seconds it allows between 10·secs and 10·(secs + 1).
    let limiter = Limiter::new(store, "10/s log".parse().unwrap());
    // load the script first, so that every call counted below is one check
    let _ = limiter.check(&["warm-up"]).await.unwrap();
    let before = server.script_calls();
    let (requests, allowed, cached) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let flood = Duration::from_millis(2_500);
    let start = Instant::now();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (limiter, requests, allowed, cached) = (
                limiter.clone(),
                requests.clone(),
                allowed.clone(),
                cached.clone(),
            );
            tokio::spawn(async move {
                while start.elapsed() < flood {
                    let d = limiter.check(&["ip:198.51.100.7"]).await.unwrap();
                    requests.fetch_add(1, Ordering::Relaxed);
                    if d.is_allowed() {
                        allowed.fetch_add(1, Ordering::Relaxed);
                    } else if d.origin() == Origin::DenyCache {
                        cached.fetch_add(1, Ordering::Relaxed);
                        assert!(d.retry_after().unwrap() <= Duration::from_secs(1));
                    }
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let calls = server.script_calls() - before;
    let (requests, allowed, cached) = (
        requests.load(Ordering::Relaxed),
        allowed.load(Ordering::Relaxed),
        cached.load(Ordering::Relaxed),
    );
    let secs = flood.as_secs_f64();
    println!(
        "{requests} requests, {allowed} allowed, {cached} from the cache, {calls} Redis calls"
    );
    assert!(
        requests >= 5_000,
        "the flood was too small to tell: {requests}"
    );
    assert!(
        calls * 100 <= requests,
        "{calls} Redis calls for {requests} requests: under 99 % answered in process"
    );
    assert_eq!(
        calls + cached,
        requests,
        "every request: Redis or the cache"
    );
    // No over-admission (Redis decides every allowed request) and no starving either: the
    // cache gives each identifier back to Redis as soon as Redis said it could be allowed.
    assert!(allowed as f64 <= 10.0 * (secs + 1.0), "{allowed} allowed");
    assert!(allowed as f64 >= 10.0 * secs.floor(), "{allowed} allowed");
}

/// A smaller cost than the one denied goes to Redis, which may allow it.
#[tokio::test]
async fn smaller_costs_go_to_redis() {
    let server = RedisServer::start();
    // the real clock: the deny cache is off with a manual one
    let store = server.store(Clock::Real).await;
    let limiter = Limiter::new(store, "10/min log".parse().unwrap());
    assert!(limiter.check_n(&["k"], 8).await.unwrap().is_allowed());
    let d = limiter.check_n(&["k"], 3).await.unwrap();
    assert_eq!((d.is_allowed(), d.origin()), (false, Origin::Store));
    let d = limiter.check_n(&["k"], 3).await.unwrap();
    assert_eq!((d.is_allowed(), d.origin()), (false, Origin::DenyCache));
    let d = limiter.check_n(&["k"], 2).await.unwrap();
    assert_eq!((d.is_allowed(), d.origin()), (true, Origin::Store));
}

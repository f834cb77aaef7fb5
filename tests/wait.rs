//! Checks that wait to be admitted: each request reserves its own time in one store call, so
//! "wait up to D" admits every request whose earliest admission lies within D, in the order
//! they came, and denies the rest at once.

mod common;

use std::time::{Duration, Instant};

use common::{manual_clock, RedisServer};
use redis::Commands;
use tollgate::{Clock, KeyedRateLimitLayer, Limiter, ManualClock, MemoryStore, RateLimited, Store};
use tower::{service_fn, ServiceExt};

/// 20 requests at once that may wait 2 s: how many were admitted, and how long each denied
/// one took to be answered.
async fn twenty_at_once(limiter: &Limiter) -> (usize, Vec<Duration>) {
    let calls: Vec<_> = (0..20)
        .map(|_| {
            let l = limiter.clone();
            tokio::spawn(async move {
                let asked = Instant::now();
                let d = l
                    .check_waiting(&["psp:acme"], Duration::from_secs(2))
                    .await
                    .unwrap();
                (d.is_allowed(), asked.elapsed())
            })
        })
        .collect();
    let (mut admitted, mut denied) = (0, Vec::new());
    for c in calls {
        let (allowed, took) = c.await.unwrap();
        if allowed {
            admitted += 1;
            // at most the 2 s it may wait, and the timer's and a busy machine's lateness
            assert!(took <= Duration::from_secs(3), "{took:?}");
        } else {
            denied.push(took);
        }
    }
    (admitted, denied)
}

async fn stores(server: &RedisServer, clock: &ManualClock) -> [Store; 2] {
    let redis = server.store(Clock::Manual(clock.clone())).await;
    let memory = MemoryStore::builder()
        .clock(Clock::Manual(clock.clone()))
        .build();
    [redis.into(), memory.into()]
}

/// 5/s, 20 requests, 2 s: a log and a GCRA admit 15 (5 now and 5 at 1 s and 2 s; 5 now and
/// one every 200 ms), on both stores; the others are denied at once rather than after a
/// wait. The sliding-window counter admits each request at its own earliest time too, which
/// is later: its estimate weighs the previous window's 5 as spread evenly, so the k-th of the
/// next window fits at 1 + k/5 s (10 in 2 s, from a window's start, as the manual clock is).
/// The default algorithm, the rolling window (sub-windows of 250 ms, its ring the sub-window
/// of now and the four before), counts the first 5 until their sub-window has left the ring,
/// at 1.25 s (not 1 s: the oldest sub-window counts in full): 5 are reserved there, all in
/// the sub-window of 1.25 s, which leaves the ring at 2.5 s, past the 2 s: 10, the other 10
/// denied at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_requests_at_five_a_second_with_two_seconds_to_wait() {
    let server = RedisServer::start();
    let policies = [
        ("5/s log", 15),
        ("5/s gcra", 15),
        ("5/s sliding", 10),
        ("5/s", 10),
        ("5/s fixed", 15),
    ];
    for (policy, expected) in policies {
        let mut later = Vec::new();
        for on_redis in [true, false] {
            let clock = manual_clock();
            let store: Store = if on_redis {
                server.store(Clock::Manual(clock.clone())).await.into()
            } else {
                let memory = MemoryStore::builder().clock(Clock::Manual(clock.clone()));
                memory.build().into()
            };
            let limiter = Limiter::new(store, policy.parse().unwrap());
            let (admitted, denied) = twenty_at_once(&limiter).await;
            assert_eq!(admitted, expected, "{policy}");
            assert_eq!(denied.len(), 20 - expected, "{policy}");
            for took in denied {
                // one store call, among 20 made together, not a wait: one that waited would
                // sleep past the 2 s it was refused for (a second leaves room for a busy
                // test machine)
                assert!(took < Duration::from_secs(1), "{policy}: {took:?}");
            }
            // an ordinary check at 1.5 s does not pass the reservations
            clock.advance(Duration::from_millis(1500));
            let d = limiter.check(&["psp:acme"]).await.unwrap();
            assert!(!d.is_allowed(), "{policy}");
            later.push(d);
        }
        assert_eq!(later[0], later[1], "{policy}");
        if policy == "5/s fixed" {
            // the window of 2 s is reserved full: not before 3 s
            assert_eq!(later[0].retry_after(), Some(Duration::from_millis(1500)));
        }
        if policy == "5/s" {
            // the reserved sub-window of 1.25 s is full and leaves the ring at 2.5 s
            assert_eq!(later[0].retry_after(), Some(Duration::from_secs(1)));
        }
    }
}

/// The same, on Redis' own clock: the log holds the admitted at exactly 1 s and 2 s after the
/// first five, and the callers go then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_time_a_log_sends_five_a_second() {
    let server = RedisServer::start();
    let store = server.store(Clock::Real).await;
    let prefix = store.prefix().to_string();
    let limiter = Limiter::new(store, "5/s log".parse().unwrap());
    let start = Instant::now();
    let calls: Vec<_> = (0..20)
        .map(|_| {
            let l = limiter.clone();
            tokio::spawn(async move {
                let d = l.check_waiting(&["psp:acme"], Duration::from_secs(2)).await;
                (d.unwrap().is_allowed(), start.elapsed())
            })
        })
        .collect();
    let mut starts = Vec::new();
    for c in calls {
        let (allowed, at) = c.await.unwrap();
        if allowed {
            starts.push(at);
        } else {
            // at once, not after a wait of more than the 2 s it was refused for
            assert!(at < Duration::from_secs(1), "denied after {at:?}");
        }
    }
    starts.sort();
    assert_eq!(starts.len(), 15);
    // The times the log holds, in µs of Redis' clock: the first five as each was admitted,
    // each of the others reserved as the entry five before it leaves the window.
    let mut conn = server.conn();
    let keys: Vec<String> = conn.keys(format!("{prefix}:*")).unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let entries: Vec<(String, f64)> = conn.zrange_withscores(&keys[0], 0, -1).unwrap();
    let times: Vec<u64> = entries.iter().map(|(_, t)| *t as u64).collect();
    assert_eq!(times.len(), 15);
    for j in 0..5 {
        assert_eq!(times[5 + j], times[j] + 1_000_000, "{times:?}");
        assert_eq!(times[10 + j], times[j] + 2_000_000, "{times:?}");
    }
    // and the callers went then: never before (they started after `start`; 10 ms for the
    // two clocks and the timer's whole milliseconds), not much after
    for (k, at) in starts.iter().enumerate() {
        let slot = Duration::from_secs((k / 5) as u64);
        assert!(
            *at + Duration::from_millis(10) >= slot && *at < slot + Duration::from_millis(500),
            "{k}: went at {at:?} for {slot:?}"
        );
    }
}

/// Both stores reserve the same times and report the same figures, for every algorithm that
/// can wait and for several limits together, with time passing between requests.
#[tokio::test]
async fn the_memory_store_reserves_as_redis_does() {
    let server = RedisServer::start();
    // (policy, cost): the wide form of the rolling window (counts over 1550) at a cost that
    // fills it as quickly
    for (policy, cost) in [
        ("5/10ms log", 1),
        ("5/10ms", 1),
        ("2000/10ms", 400),
        ("5/10ms sliding", 1),
        ("5/10ms fixed", 1),
        ("3/10ms gcra burst=2", 1),
        ("4/10ms, 10/50ms log, 3/7ms gcra burst=3", 1),
        ("4/10ms fixed, 15/20ms", 1),
    ] {
        let clock = manual_clock();
        let [redis, memory] = stores(&server, &clock).await;
        let on_redis = Limiter::new(redis, policy.parse().unwrap());
        let in_memory = Limiter::new(memory, policy.parse().unwrap());
        let mut waited = 0;
        for step in 0..40u64 {
            // every fourth an ordinary check: it must not pass the reservations before it.
            // (With a caller's clock an ordinary check gives a sliding log's new key the
            // window's TTL in real time, which the waits here outlast: those touch only an
            // identifier charged every step.)
            let ordinary = step % 4 == 3;
            let ids: &[&str] = if step % 5 == 0 && !ordinary {
                &["a", "b"]
            } else {
                &["a"]
            };
            let max_wait = match ordinary {
                true => Duration::ZERO,
                false => Duration::from_micros((step * 3331) % 12_000 + 1),
            };
            let a = on_redis.check_n_waiting(ids, cost, max_wait).await.unwrap();
            let b = in_memory
                .check_n_waiting(ids, cost, max_wait)
                .await
                .unwrap();
            assert_eq!(a, b, "{policy}, step {step}");
            waited += usize::from(a.is_allowed());
            clock.advance(Duration::from_micros((step * 1237) % 1500));
        }
        assert!((10..40).contains(&waited), "{policy}: {waited}");
    }
}

#[tokio::test]
async fn a_client_layer_waiting_up_to_two_seconds_sends_fifteen_of_twenty() {
    let server = RedisServer::start();
    let store = server.store(Clock::Manual(manual_clock())).await;
    let limiter = Limiter::new(store, "5/s log".parse().unwrap());
    let client = tower::ServiceBuilder::new()
        .layer(
            KeyedRateLimitLayer::new(limiter, |c: &String| format!("psp:{c}").into())
                .wait_up_to(Duration::from_secs(2)),
        )
        .service(service_fn(|c: String| async move {
            Ok::<_, std::convert::Infallible>(c)
        }));
    let calls: Vec<_> = (0..20)
        .map(|_| tokio::spawn(client.clone().oneshot("acme".to_string())))
        .collect();
    let (mut sent, mut limited) = (0, 0);
    for c in calls {
        match c.await.unwrap() {
            Ok(_) => sent += 1,
            Err(e) => {
                assert!(e.downcast_ref::<RateLimited>().is_some(), "{e}");
                limited += 1;
            }
        }
    }
    assert_eq!((sent, limited), (15, 5));
}

/// A request waiting for a concurrency slot takes it soon after it frees, though a slot's
/// denial suggests a second: with a wait shorter than that second it is admitted, not denied
/// at once. (Tokio's clock paused: the waits pass as soon as nothing else can run.)
#[tokio::test(start_paused = true)]
async fn a_freed_slot_is_taken_within_a_short_wait() {
    let limiter = Limiter::new(MemoryStore::new(), "1 concurrent".parse().unwrap());
    let held = limiter.check(&["job:1"]).await.unwrap();
    let denied = limiter.check(&["job:1"]).await.unwrap();
    assert!(denied.retry_after().unwrap() >= Duration::from_millis(900));
    let waiting = {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            limiter
                .check_waiting(&["job:1"], Duration::from_millis(300))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiting.is_finished(), "the slot is still held");
    let freed = tokio::time::Instant::now();
    drop(held);
    let decision = waiting.await.unwrap().unwrap();
    assert!(decision.is_allowed(), "{decision:?}");
    // checked again at most 100 ms apart
    assert!(
        freed.elapsed() <= Duration::from_millis(100),
        "{:?}",
        freed.elapsed()
    );
    drop(decision);

    // A slot held past the wait: denied once the wait is over, not before (a last check at
    // its end), and not at once.
    let held = limiter.check(&["job:1"]).await.unwrap();
    let started = tokio::time::Instant::now();
    let decision = limiter
        .check_waiting(&["job:1"], Duration::from_millis(300))
        .await
        .unwrap();
    assert!(!decision.is_allowed());
    assert_eq!(started.elapsed(), Duration::from_millis(300));
    drop(held);
}

/// A wait as long as a `Duration` holds is no deadline: a check of a concurrency limit that
/// may wait `Duration::MAX` waits for the slot, without a deadline to overflow.
#[tokio::test]
async fn a_wait_of_duration_max_waits_for_the_slot() {
    let limiter = Limiter::new(MemoryStore::new(), "1 concurrent".parse().unwrap());
    let held = limiter.check(&["job:1"]).await.unwrap();
    assert!(held.is_allowed());
    let waiting = {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.check_waiting(&["job:1"], Duration::MAX).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the slot is still held");
    drop(held);
    let decision = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("admitted once the slot was let go")
        .unwrap()
        .unwrap();
    assert!(decision.is_allowed());
}

/// A request waiting for a concurrency slot finishes on the policy it started with: a change
/// made while it waits (here one under which its cost could never be admitted) does not
/// reach it.
#[tokio::test]
async fn a_waiting_request_finishes_on_the_policy_it_started_with() {
    let limiter = Limiter::new(MemoryStore::new(), "1 concurrent".parse().unwrap());
    let held = limiter.check(&["a"]).await.unwrap();
    assert!(held.is_allowed());
    let waiting = tokio::spawn({
        let limiter = limiter.clone();
        async move {
            let patience = Duration::from_secs(5);
            limiter.check_n_waiting(&["a"], 2, patience).await
        }
    });
    tokio::time::sleep(Duration::from_millis(30)).await;
    limiter.set_policy("1 concurrent, 1/s".parse().unwrap());
    drop(held);
    let decision = waiting.await.unwrap();
    assert!(
        decision.as_ref().is_ok_and(|d| d.is_allowed()),
        "{decision:?}"
    );
}

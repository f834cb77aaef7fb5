//! The scheduler across a fleet: three processes' worth of stores (each its own Redis
//! connection) sharing one queue, the memory store deciding as Redis does, and callers that
//! give up.

mod common;

use std::time::{Duration, Instant};

use common::{manual_clock, unique_prefix, Proxy, RedisServer};
use tollgate::{
    Clock, Decision, KeyedRateLimitLayer, MemoryStore, OnStoreError, RateLimited, RedisStore,
    Scheduler,
};
use tower::{service_fn, ServiceExt};

/// Three schedulers at `rate` on three stores with their own connections to `server`, all
/// under one prefix: three processes of a fleet, reading `clock`.
async fn fleet(server: &RedisServer, rate: &str, clock: &Clock) -> Vec<Scheduler> {
    let prefix = unique_prefix();
    let mut schedulers = Vec::new();
    for _ in 0..3 {
        let store = RedisStore::builder(server.url())
            .prefix(prefix.clone())
            .clock(clock.clone())
            .timeout(Duration::from_secs(2))
            .build()
            .await
            .unwrap();
        schedulers.push(Scheduler::new(store, rate.parse().unwrap()));
    }
    schedulers
}

/// Runs `events` calls of `id` at once, spread over the schedulers in turn, each waiting up
/// to `max_wait`: per event, when it returned (from a common start taken before any call),
/// how long its call took, and its decision.
async fn burst(
    schedulers: &[Scheduler],
    id: &str,
    events: usize,
    max_wait: Duration,
) -> Vec<(Duration, Duration, Decision)> {
    // the script loaded and the connections made first: the burst measures calls alone
    for s in schedulers {
        let _ = s.schedule("warm-up", Duration::ZERO).await.unwrap();
    }
    let start = Instant::now();
    let tasks: Vec<_> = (0..events)
        .map(|i| {
            let s = schedulers[i % schedulers.len()].clone();
            let id = id.to_string();
            tokio::spawn(async move {
                let called = Instant::now();
                let decision = s.schedule(&id, max_wait).await.unwrap();
                (start.elapsed(), called.elapsed(), decision)
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// An admitted event's `reset_after`: the time from its placement until the queue is empty
/// again, its own slot's interval included.
fn queue_after(d: &Decision) -> Duration {
    assert!(d.is_allowed(), "{d:?}");
    d.statuses()[0].reset_after
}

/// How late a caller may wake after its slot: the reply's way back, then the timer's wake-up
/// on a test machine that may be busy with other tests. Only bounds from above: a caller never
/// goes early (a sleep never ends before its time), and the slots themselves are checked
/// exactly, from what the store reports, not from when callers woke.
const LATE: Duration = Duration::from_millis(250);

/// Asserts that the admitted events of a burst on a caller's clock that stood still took
/// the slots 0, `interval`, 2 × `interval`… once each — one queue across the processes, no
/// slot given twice or skipped — and that each caller returned no earlier than its slot.
fn assert_slots_on_a_still_clock(results: &[(Duration, Duration, Decision)], interval: Duration) {
    let mut admitted: Vec<(Duration, Duration)> = results
        .iter()
        .filter(|(_, _, d)| d.is_allowed())
        .map(|(at, _, d)| (queue_after(d) - interval, *at))
        .collect();
    admitted.sort();
    for (k, (slot, at)) in admitted.iter().enumerate() {
        assert_eq!(*slot, interval * k as u32, "{admitted:?}");
        assert!(
            *at >= *slot && *at < *slot + LATE,
            "slot {slot:?}, went at {at:?}"
        );
    }
}

/// On Redis' own clock: 40 events at once, all willing to wait, from three processes, go
/// one every 250 ms, about 10 s in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_share_four_per_second_250_ms_apart() {
    let server = RedisServer::start();
    let schedulers = fleet(&server, "4/s", &Clock::Real).await;
    let interval = Duration::from_millis(250);
    let results = burst(&schedulers, "psp:acme", 40, Duration::from_secs(11)).await;
    // Each event's queue is measured from its own placement on Redis' clock, all of them
    // within a few milliseconds of the first (far less than an interval): the event of the
    // slot k·250 ms sees the queue empty in (k·250, (k+1)·250] ms.
    let interval_us = interval.as_micros();
    let mut slots: Vec<(u128, Duration)> = results
        .iter()
        .map(|(at, _, d)| {
            let after = queue_after(d).as_micros();
            (after.div_ceil(interval_us) - 1, *at)
        })
        .collect();
    slots.sort();
    let taken: Vec<u128> = slots.iter().map(|(k, _)| *k).collect();
    assert_eq!(taken, (0..40).collect::<Vec<u128>>(), "each slot once");
    // and each caller went at its slot on the wall clock too (it started after `start`;
    // 10 ms for the two clocks and the timer's whole milliseconds)
    for (k, at) in &slots {
        let slot = interval * *k as u32;
        assert!(
            *at + Duration::from_millis(10) >= slot && *at < slot + LATE,
            "slot {slot:?}, went at {at:?}"
        );
    }
}

/// On a caller's clock that stands still, the slots are exact: 40 events from three
/// processes take the slots 50 ms apart, each once, and go at them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_share_twenty_per_second_50_ms_apart() {
    let server = RedisServer::start();
    let clock = Clock::Manual(manual_clock());
    let schedulers = fleet(&server, "20/s", &clock).await;
    let results = burst(&schedulers, "psp:acme", 40, Duration::from_secs(3)).await;
    assert_eq!(results.iter().filter(|r| r.2.is_allowed()).count(), 40);
    assert_slots_on_a_still_clock(&results, Duration::from_millis(50));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_longest_wait_the_excess_is_rejected_at_once() {
    let server = RedisServer::start();
    let clock = Clock::Manual(manual_clock());
    let schedulers = fleet(&server, "4/s", &clock).await;
    let results = burst(&schedulers, "psp:acme", 40, Duration::from_secs(1)).await;
    // slots at 0, 250, 500, 750 and 1000 ms are within a second; the other 35 are rejected
    assert_eq!(results.iter().filter(|r| r.2.is_allowed()).count(), 5);
    assert_slots_on_a_still_clock(&results, Duration::from_millis(250));
    let mut rejected: Vec<Duration> = Vec::new();
    for (_, took, d) in &results {
        if !d.is_allowed() {
            // told the wait it would have needed: to the sixth slot
            assert_eq!(d.retry_after(), Some(Duration::from_millis(1250)));
            rejected.push(*took);
        }
    }
    assert_eq!(rejected.len(), 35);
    // Rejected without waiting: one script call each, 40 of them together on two threads,
    // most in well under 10 ms. A rejection that waited would take its 1.25 s; half a
    // second leaves room for a busy test machine and still tells the two apart.
    assert!(
        rejected.iter().all(|t| *t < Duration::from_millis(500)),
        "{rejected:?}"
    );
}

/// The wait the next event would need, as a zero-wait placement is told (it is refused and
/// takes no slot while the queue holds one); polled until it is `expected`.
async fn next_slot_is(scheduler: &Scheduler, expected: Duration) {
    common::eventually(Duration::from_secs(5), || async move {
        let probe = scheduler
            .schedule("psp:acme", Duration::ZERO)
            .await
            .unwrap();
        match probe.retry_after() {
            Some(wait) if wait == expected => Ok(()),
            other => Err(format!("the next slot is {other:?} away, not {expected:?}")),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_waiters_do_not_stall_the_rest() {
    let server = RedisServer::start();
    // a caller's clock that stands still: every slot is an exact multiple of 250 ms
    let clock = Clock::Manual(manual_clock());
    let schedulers = fleet(&server, "4/s", &clock).await;
    let interval = Duration::from_millis(250);
    // eight waiters, each placed before the next (the probe sees its slot taken), so
    // waiter i has the slot at i × 250 ms; the first goes at once. Each measures its own
    // wait, from its call: the clock standing still, waiter i waits i × 250 ms whenever it
    // was placed.
    let first = schedulers[0]
        .schedule("psp:acme", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(queue_after(&first), interval);
    let mut waiters = vec![None];
    for i in 1..8u32 {
        let s = schedulers[i as usize % 3].clone();
        waiters.push(Some(tokio::spawn(async move {
            let called = Instant::now();
            let turn = s.schedule("psp:acme", Duration::from_secs(5)).await;
            (turn.unwrap(), called.elapsed())
        })));
        next_slot_is(&schedulers[1], interval * (i + 1)).await;
    }
    let abort = |i: usize| waiters[i].as_ref().map(|w| w.abort());
    // waiters 3 and 4 give up in the middle of the queue: their slots stay used
    abort(3);
    abort(4);
    // the last two give up, the last first: each is the last one placed when it gives up,
    // so both slots come back
    abort(7);
    next_slot_is(&schedulers[2], interval * 7).await;
    abort(6);
    next_slot_is(&schedulers[2], interval * 6).await;
    // a newcomer goes right after waiter 5 (1500 ms), not after the dropped 7 (2000 ms)
    let newcomer = {
        let s = schedulers[1].clone();
        tokio::spawn(async move {
            let called = Instant::now();
            let turn = s.schedule("psp:acme", Duration::from_secs(5)).await;
            (turn.unwrap(), called.elapsed())
        })
    };
    let mut kept = Vec::new();
    for (i, w) in waiters.into_iter().enumerate().skip(1) {
        match w.unwrap().await {
            Ok(turn) => kept.push((i as u32, turn)),
            Err(e) => assert!(e.is_cancelled() && [3, 4, 6, 7].contains(&i), "{i}: {e}"),
        }
    }
    let kept_at: Vec<u32> = kept.iter().map(|(i, _)| *i).collect();
    assert_eq!(kept_at, [1, 2, 5]);
    // the ones that stayed keep their own slots, and go no earlier, and not much later, for
    // the others' leaving
    for (i, (turn, at)) in kept {
        let slot = interval * i;
        assert_eq!(queue_after(&turn), slot + interval, "waiter {i}");
        assert!(at >= slot && at < slot + LATE, "waiter {i} went at {at:?}");
    }
    let (turn, at) = newcomer.await.unwrap();
    assert_eq!(
        queue_after(&turn),
        interval * 7,
        "the newcomer's slot is 1500 ms"
    );
    let slot = interval * 6;
    assert!(
        at >= slot && at < slot + LATE,
        "the newcomer went at {at:?}"
    );
}

/// A `1/min` scheduler on Redis through a proxy that can hold its calls.
async fn scheduler_behind_proxy() -> (RedisServer, Proxy, Scheduler) {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port).await;
    let store = RedisStore::builder(proxy.url())
        .prefix(unique_prefix())
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let scheduler = Scheduler::new(store, "1/min".parse().unwrap());
    (server, proxy, scheduler)
}

/// Schedules an event waiting up to `max_wait` while the proxy holds the call, gives up, and
/// returns once the placement has reached Redis and run for nobody.
async fn give_up_during_the_round_trip(
    server: &RedisServer,
    proxy: &Proxy,
    scheduler: &Scheduler,
    max_wait: Duration,
) {
    proxy.freeze(true);
    let gone = {
        let scheduler = scheduler.clone();
        tokio::spawn(async move { scheduler.schedule("psp:acme", max_wait).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    gone.abort();
    assert!(gone.await.unwrap_err().is_cancelled());
    let before = server.script_calls();
    proxy.freeze(false);
    server
        .ran_scripts_past(before, "the placement held by the proxy")
        .await;
}

/// A caller that gives up while its placement is on its way to Redis (the server silent
/// for a moment) leaves no slot behind: the script places the event when it arrives, and,
/// nobody waiting for it, the slot is given back.
#[tokio::test]
async fn a_caller_gone_during_the_round_trip_gives_its_slot_back() {
    let (server, proxy, scheduler) = scheduler_behind_proxy().await;
    // the first event goes at once; the next slot is a minute away
    assert!(scheduler
        .schedule("psp:acme", Duration::ZERO)
        .await
        .unwrap()
        .is_allowed());
    // the placement, a minute ahead, runs for nobody
    give_up_during_the_round_trip(&server, &proxy, &scheduler, Duration::from_secs(120)).await;
    // its slot comes back, so the next event's slot is the one a minute after the first
    // (two minutes after it, were the slot kept)
    let (wait, _) = common::eventually(Duration::from_secs(3), || async {
        let d = scheduler
            .schedule("psp:acme", Duration::from_millis(1))
            .await
            .unwrap();
        match d.retry_after() {
            Some(wait) if wait <= Duration::from_secs(60) => Ok(wait),
            other => Err(format!("the next slot in {other:?}")),
        }
    })
    .await;
    assert!(
        wait > Duration::from_secs(50),
        "the first event's minute: {wait:?}"
    );
}

/// A slot for now is given back too when its caller is gone before the placement's answer
/// came: a `1/min` queue that nobody used stays empty.
#[tokio::test]
async fn a_caller_gone_during_the_round_trip_gives_a_slot_for_now_back() {
    let (server, proxy, scheduler) = scheduler_behind_proxy().await;
    // the placement (an empty queue: its slot is now) runs for nobody
    give_up_during_the_round_trip(&server, &proxy, &scheduler, Duration::ZERO).await;
    // its slot comes back: the next event goes at once, not a minute later
    common::eventually(Duration::from_secs(3), || async {
        let d = scheduler
            .schedule("psp:acme", Duration::ZERO)
            .await
            .unwrap();
        match d.retry_after() {
            None => Ok(()),
            Some(wait) => Err(format!("the next slot in {wait:?}")),
        }
    })
    .await;
}

/// The memory store places events exactly as Redis does (the same waits, the same queue
/// ends), for a fractional interval, a burst, costs above 1, rejections and time passing.
#[tokio::test]
async fn the_memory_store_schedules_as_redis_does() {
    let server = RedisServer::start();
    // 2 per 3 ms: an interval of 1.5 ms, so the waits are short and not whole
    for rate in ["2/3ms", "5/7ms gcra burst=3", "3/2ms bucket capacity=2"] {
        let clock = manual_clock();
        let redis = server.store(Clock::Manual(clock.clone())).await;
        let memory = MemoryStore::builder()
            .clock(Clock::Manual(clock.clone()))
            .build();
        let on_redis = Scheduler::builder(redis, rate.parse().unwrap())
            .on_store_error(OnStoreError::Closed)
            .build();
        let in_memory = Scheduler::new(memory, rate.parse().unwrap());
        let mut placed = 0;
        for step in 0..60u64 {
            let id = if step % 7 == 0 { "other" } else { "psp:acme" };
            let cost = 1 + step % on_redis.burst();
            let max_wait = Duration::from_micros((step * 977) % 9000);
            let a = on_redis.schedule_n(id, cost, max_wait).await.unwrap();
            let b = in_memory.schedule_n(id, cost, max_wait).await.unwrap();
            assert_eq!(a, b, "{rate}, step {step}");
            placed += usize::from(a.is_allowed());
            clock.advance(Duration::from_micros((step * 389) % 1700));
        }
        // both kinds of answer were compared
        assert!((10..60).contains(&placed), "{rate}: {placed} placed");
    }
}

/// On Redis, schedulers in two namespaces keep their queues apart under one prefix, and the
/// processes of one namespace share theirs; a waiter that gives up gives its namespaced slot
/// back.
#[tokio::test]
async fn namespaces_keep_queues_apart_on_redis() {
    let server = RedisServer::start();
    let clock = manual_clock();
    let redis = server.store(Clock::Manual(clock.clone())).await;
    let in_space = |namespace: &str| {
        Scheduler::builder(redis.clone(), "4/s".parse().unwrap())
            .namespace(namespace.parse().unwrap())
            .on_store_error(OnStoreError::Closed)
            .build()
    };
    let (mail, sms, mail_too) = (in_space("mail"), in_space("sms"), in_space("mail"));
    let wait_of = |d: Decision| d.retry_after();
    // each namespace's first event goes at once
    for s in [&mail, &sms] {
        assert!(s
            .schedule("tenant:42", Duration::ZERO)
            .await
            .unwrap()
            .is_allowed());
    }
    // the mail queue is shared by the other process of its namespace: the next slot is 250 ms
    // away; the sms queue's is too, and no further
    for s in [&mail_too, &sms] {
        let d = s.schedule("tenant:42", Duration::ZERO).await.unwrap();
        assert_eq!(wait_of(d), Some(Duration::from_millis(250)));
    }
    // a waiter that gives up (the last one placed) gives its slot back
    let waiting = mail.schedule("tenant:42", Duration::from_secs(1));
    let gave_up = tokio::time::timeout(Duration::from_millis(20), waiting).await;
    assert!(gave_up.is_err(), "the slot lies 250 ms ahead");
    common::eventually(Duration::from_secs(2), || async {
        let d = mail_too.schedule("tenant:42", Duration::ZERO).await;
        let d = d.map_err(|e| e.to_string())?;
        match wait_of(d) {
            Some(w) if w == Duration::from_millis(250) => Ok(()),
            other => Err(format!("next mail slot {other:?} away")),
        }
    })
    .await;
}

#[tokio::test]
async fn a_client_waits_for_its_slot_through_the_layer() {
    let server = RedisServer::start();
    // a caller's clock that stands still: the slots lie exactly 0, 50, 100… ms ahead, however
    // far apart in real time the five calls are placed
    let store = server.store(Clock::Manual(manual_clock())).await;
    let scheduler = Scheduler::new(store, "20/s".parse().unwrap());
    let client = KeyedRateLimitLayer::scheduled(scheduler, |c: &String| format!("psp:{c}").into())
        .wait_up_to(Duration::from_millis(120));
    let service = tower::ServiceBuilder::new()
        .layer(client)
        .service(service_fn(|c: String| async move {
            Ok::<_, std::convert::Infallible>(c)
        }));
    let start = Instant::now();
    let calls: Vec<_> = (0..5)
        .map(|_| {
            let s = service.clone();
            tokio::spawn(async move { (s.oneshot("acme".to_string()).await, start.elapsed()) })
        })
        .collect();
    let mut sent = Vec::new();
    let mut limited = 0;
    for c in calls {
        match c.await.unwrap() {
            (Ok(_), at) => sent.push(at),
            (Err(e), at) => {
                let limited_by = e.downcast_ref::<RateLimited>().expect("RateLimited");
                // the next free slot, which a refusal does not take
                assert_eq!(limited_by.retry_after(), Duration::from_millis(150));
                assert!(at < Duration::from_millis(100), "rejected after {at:?}");
                limited += 1;
            }
        }
    }
    // slots at 0, 50 and 100 ms are within 120 ms; 150 and 200 ms are not
    sent.sort();
    assert_eq!((sent.len(), limited), (3, 2));
    assert!(sent[2] >= Duration::from_millis(100), "{sent:?}");
    // several identifiers cannot share one queue
    let scheduler = Scheduler::new(MemoryStore::new(), "20/s".parse().unwrap());
    let two = KeyedRateLimitLayer::scheduled(scheduler, |_: &()| {
        vec!["a".to_string(), "b".to_string()].into()
    });
    let err = tower::ServiceBuilder::new()
        .layer(two)
        .service(service_fn(|()| async {
            Ok::<_, std::convert::Infallible>(())
        }))
        .oneshot(())
        .await
        .unwrap_err();
    assert!(matches!(
        err.downcast_ref::<tollgate::Error>(),
        Some(tollgate::Error::NotOneIdentifier(2))
    ));
}

#[tokio::test]
async fn a_failed_store_answers_through_the_failure_policy() {
    // a server that is gone: connect lazily to a port nobody listens on
    let dead = || {
        RedisStore::builder(common::dead_url())
            .timeout(Duration::from_millis(50))
            .connect_timeout(Duration::from_millis(50))
            .build_lazy()
            .unwrap()
    };
    let open = Scheduler::new(dead(), "4/s".parse().unwrap());
    let d = open
        .schedule("psp:acme", Duration::from_secs(1))
        .await
        .unwrap();
    assert!(d.is_allowed());
    assert_eq!(d.origin(), tollgate::Origin::FailOpen);

    let closed = Scheduler::builder(dead(), "4/s".parse().unwrap())
        .on_store_error(OnStoreError::Closed)
        .build();
    let err = closed
        .schedule("psp:acme", Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(matches!(err, tollgate::Error::Store(_)), "{err}");

    let fallback = Scheduler::builder(dead(), "4/s".parse().unwrap())
        .on_store_error(OnStoreError::fallback(0.5).unwrap())
        .build();
    // half of 4/s in process: 2/s, one every 500 ms
    let a = fallback.schedule("psp:acme", Duration::ZERO).await.unwrap();
    let b = fallback.schedule("psp:acme", Duration::ZERO).await.unwrap();
    assert_eq!(a.origin(), tollgate::Origin::Fallback);
    assert!(a.is_allowed() && !b.is_allowed());
    let wait = b.retry_after().unwrap();
    assert!(
        wait > Duration::from_millis(400) && wait <= Duration::from_millis(500),
        "{wait:?}"
    );
}

/// A scheduler says what it was built with, as a limiter does.
#[test]
fn a_scheduler_says_what_it_was_built_with() {
    use tollgate::Store;
    let rate: tollgate::Limit = "10/s".parse().unwrap();
    let plain = Scheduler::new(MemoryStore::new(), rate);
    assert_eq!(plain.name(), "10/s");
    assert_eq!(plain.on_store_error(), OnStoreError::Open);
    assert!(matches!(plain.store(), Store::Memory(_)));
    let named = Scheduler::builder(MemoryStore::new(), rate)
        .name("psp")
        .on_store_error(OnStoreError::Closed)
        .build();
    assert_eq!(named.name(), "psp");
    assert_eq!(named.on_store_error(), OnStoreError::Closed);
}

//! Reading a client's state without charging it (`peek`, `usage`), and giving it its quota
//! back (`reset`), on both stores.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{manual_clock, snapshot, RedisServer};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use redis::Commands;
use tollgate::{Clock, Limiter, ManualClock, MemoryStore, Policy, Store};

/// Every algorithm, a concurrency limit among them.
const EVERY: &str = "4/s, 3/s log, 5/min fixed, 2 concurrent, 6/s gcra burst=3, 5/s bucket";

fn policy(text: &str) -> Policy {
    text.parse().unwrap()
}

fn memory(clock: &ManualClock) -> Store {
    MemoryStore::builder()
        .clock(Clock::Manual(clock.clone()))
        .build()
        .into()
}

/// A peek says what the check made right after it decides, and charges nothing: on both
/// stores, for every algorithm, one identifier and several, and the two stores agree.
#[tokio::test]
async fn a_peek_foretells_the_check_and_charges_nothing() {
    let server = RedisServer::start();
    for text in ["4/s", "3/s log", "5/min fixed", "6/s gcra burst=3", EVERY] {
        let clock = manual_clock();
        let redis = server.store(Clock::Manual(clock.clone())).await;
        let limiters = [
            Limiter::new(memory(&clock), policy(text)),
            Limiter::new(redis, policy(text)),
        ];
        let mut guards = Vec::new();
        for step in 0..24 {
            let ids: &[&str] = if step % 3 == 0 {
                &["ip:1", "user:1"]
            } else {
                &["user:1"]
            };
            let cost = if step % 5 == 4 { 2 } else { 1 };
            let mut peeks = Vec::new();
            for l in &limiters {
                let first = l.peek_n(ids, cost).await.unwrap();
                assert!(first.guard().is_none(), "a peek takes no slot");
                for _ in 0..3 {
                    assert_eq!(l.peek_n(ids, cost).await.unwrap(), first, "{text} {step}");
                }
                let mut check = l.check_n(ids, cost).await.unwrap();
                assert_eq!(
                    check.is_allowed(),
                    first.is_allowed(),
                    "{text} step {step}: {first:?} {check:?}"
                );
                if check.is_allowed() {
                    // the peek saw the quota before the charge
                    for (p, c) in first.statuses().iter().zip(check.statuses()) {
                        assert!(p.remaining >= c.remaining, "{text} {step}");
                    }
                } else {
                    assert_eq!(check.statuses(), first.statuses(), "{text} {step}");
                }
                if let Some(g) = check.take_guard() {
                    guards.push(g);
                }
                peeks.push(first);
            }
            assert_eq!(peeks[0], peeks[1], "{text} step {step}: the stores agree");
            if step % 4 == 3 {
                guards.clear();
                // Redis slots are given back by the store's keeper task, in the background:
                // wait until it has, so that both stores start the next step alike.
                let redis = &limiters[1];
                common::eventually(Duration::from_secs(5), || async move {
                    let usage = redis.usage(&["ip:1", "user:1"]).await.unwrap();
                    match usage.iter().any(|u| u.limit.is_concurrency() && u.used > 0) {
                        true => Err(format!("{text} step {step}: slots still held")),
                        false => Ok(()),
                    }
                })
                .await;
            }
            clock.advance(Duration::from_millis(90));
        }
    }
}

/// On Redis a peek changes no key, no value and no TTL, allowed or denied, whatever the
/// algorithm; the keys of a client never seen are not created.
#[tokio::test]
async fn a_peek_leaves_redis_exactly_as_it_was() {
    let server = RedisServer::start();
    let store = server.store(Clock::Real).await;
    let prefix = store.prefix().to_string();
    let l = Limiter::builder(store, policy(EVERY)).deny_cache(0).build();
    let mut conn = server.conn();
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut d = l.check(&["ip:1", "user:1"]).await.unwrap();
        assert!(d.is_allowed());
        held.extend(d.take_guard());
    }
    let before = snapshot(&mut conn, &prefix);
    assert_eq!(before.len(), 2 * 3, "{before:?}");
    for cost in [1, 2, 3] {
        for ids in [
            &["ip:1"][..],
            &["ip:1", "user:1"],
            &["user:2"],
            &["ip:1", "x"],
        ] {
            let d = l.peek_n(ids, cost).await.unwrap();
            assert!(
                !d.is_allowed() || ids == ["user:2"],
                "{ids:?} {cost}: {d:?}"
            );
        }
    }
    assert_eq!(snapshot(&mut conn, &prefix), before);
    drop(held);
}

/// The quota of each limit as `usage` counts it.
fn quota(limit: &tollgate::Limit) -> u64 {
    if limit.is_concurrency() {
        limit.count()
    } else {
        limit.max_cost()
    }
}

/// `usage` reads what was charged, per identifier and limit, the slots held included, and
/// charges nothing: the stores agree, and on Redis no key changes.
#[tokio::test]
async fn usage_reads_what_was_charged_and_changes_nothing() {
    let server = RedisServer::start();
    let clock = manual_clock();
    let redis = server.store(Clock::Manual(clock.clone())).await;
    let prefix = redis.prefix().to_string();
    let mut conn = server.conn();
    let limiters = [
        Limiter::new(memory(&clock), policy(EVERY)),
        Limiter::new(redis, policy(EVERY)),
    ];
    let mut held = Vec::new();
    for l in &limiters {
        let fresh = l.usage(&["user:1"]).await.unwrap();
        assert_eq!(fresh.len(), 6);
        for u in &fresh {
            assert_eq!((u.used, u.remaining), (0, quota(&u.limit)), "{u:?}");
            assert_eq!(u.reset_after, Duration::ZERO);
        }
        for _ in 0..2 {
            let mut d = l.check(&["user:1", "ip:1"]).await.unwrap();
            assert!(d.is_allowed());
            held.extend(d.take_guard());
        }
    }
    let before = snapshot(&mut conn, &prefix);
    assert!(!before.is_empty());
    let mut seen = Vec::new();
    for l in &limiters {
        let usage = l.usage(&["user:1", "ip:2", "user:1"]).await.unwrap();
        assert_eq!(usage.len(), 2 * 6, "duplicates count once");
        for u in &usage[..6] {
            assert_eq!(u.identifier, 0);
            assert_eq!(u.used, 2, "{u:?}");
            assert_eq!(u.used + u.remaining, quota(&u.limit), "{u:?}");
            if u.limit.is_concurrency() {
                assert_eq!(u.reset_after, Duration::ZERO);
            } else {
                assert!(u.reset_after > Duration::ZERO, "{u:?}");
            }
        }
        for u in &usage[6..] {
            assert_eq!((u.identifier, u.used), (1, 0), "{u:?}");
        }
        // reading again reads the same
        assert_eq!(l.usage(&["user:1", "ip:2"]).await.unwrap(), usage);
        seen.push(usage);
    }
    assert_eq!(seen[0], seen[1], "the stores agree");
    assert_eq!(snapshot(&mut conn, &prefix), before, "usage wrote nothing");
    drop(held);
}

/// `reset` gives an identifier its whole quota back on both stores, slots included, and
/// touches nothing else: on Redis, exactly its keys go.
#[tokio::test]
async fn reset_gives_the_whole_quota_back_and_nothing_else() {
    let server = RedisServer::start();
    let clock = manual_clock();
    let redis = server.store(Clock::Manual(clock.clone())).await;
    let prefix = redis.prefix().to_string();
    let mut conn = server.conn();
    let limiters = [
        Limiter::new(memory(&clock), policy(EVERY)),
        Limiter::new(redis, policy(EVERY)),
    ];
    let other = Limiter::new(limiters[1].store().clone(), policy("7/h"));
    let mut held = Vec::new();
    for l in &limiters {
        // user:1 uses everything it may, user:2 a little
        while let Ok(mut d) = l.check(&["user:1"]).await {
            if !d.is_allowed() {
                break;
            }
            held.extend(d.take_guard());
        }
        let mut d = l.check(&["user:2"]).await.unwrap();
        held.extend(d.take_guard());
    }
    assert!(other.check(&["user:1"]).await.unwrap().is_allowed());
    let keep = |all: BTreeMap<String, (Vec<u8>, i64)>| -> BTreeMap<_, _> {
        all.into_iter()
            .filter(|(k, _)| !k.contains("{user:1}"))
            .collect()
    };
    let others = keep(snapshot(&mut conn, &prefix));
    let user1_keys = |conn: &mut redis::Connection| -> Vec<String> {
        conn.keys(format!("{prefix}:{{user:1}}:*")).unwrap()
    };
    let before: Vec<String> = user1_keys(&mut conn);
    assert_eq!(before.len(), 3 + 1, "{before:?}");
    for l in &limiters {
        assert!(!l.check(&["user:1"]).await.unwrap().is_allowed());
        l.reset(&["user:1"]).await.unwrap();
        for u in l.usage(&["user:1"]).await.unwrap() {
            assert_eq!((u.used, u.remaining), (0, quota(&u.limit)), "{u:?}");
        }
        let d = l.check(&["user:1"]).await.unwrap();
        assert!(d.is_allowed(), "{d:?}");
        // user:2 keeps what it used
        let u = l.usage(&["user:2"]).await.unwrap();
        assert!(u.iter().all(|u| u.used == 1), "{u:?}");
    }
    // on Redis, the other policy's key of user:1 is still there, and nothing else moved
    let after: Vec<String> = user1_keys(&mut conn);
    assert_eq!(
        after.len(),
        3 + 1,
        "the reset keys are written again by the check"
    );
    let mut after_others = keep(snapshot(&mut conn, &prefix));
    for (k, v) in &others {
        assert_eq!(after_others.remove(k).as_ref(), Some(v), "{k}");
    }
    assert!(after_others.is_empty(), "{after_others:?}");
    assert!(other.usage(&["user:1"]).await.unwrap()[0].used == 1);
    drop(held);
}

/// Random sequences of peeks and checks, every algorithm, both stores side by side: the
/// stores peek alike, and every check decides as the peek just before it said.
#[test]
fn stores_peek_alike_and_peeks_foretell_checks() {
    const POLICIES: &[&str] = &[
        "5/s log",
        "3/250ms",
        "3/200ms fixed",
        "3/s gcra burst=2",
        "5/700ms bucket capacity=3",
        "3/100ms, 7/s log, 12/2s fixed",
        "4/s gcra, 6/1500ms, 9/3s log",
    ];
    const IDS: [&str; 3] = ["a", "b", "c"];
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let op = (
        prop_oneof![0u64..2_000, 0u64..400_000, Just(0u64)],
        prop::sample::subsequence(vec![0usize, 1, 2], 1..=3),
        prop_oneof![4 => Just(1u64), 1 => Just(2u64)],
        any::<bool>(),
    );
    let mut runner = TestRunner::new(Config {
        cases: 24,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(
            &(0..POLICIES.len(), prop::collection::vec(op, 20..150)),
            |(p, ops)| {
                rt.block_on(async {
                    let clock = manual_clock();
                    let redis = server.store(Clock::Manual(clock.clone())).await;
                    let limiters = [
                        Limiter::new(memory(&clock), policy(POLICIES[p])),
                        Limiter::new(redis, policy(POLICIES[p])),
                    ];
                    for (dt_us, ids, cost, check) in &ops {
                        clock.advance(Duration::from_micros(*dt_us));
                        let names: Vec<&str> = ids.iter().map(|&i| IDS[i]).collect();
                        let mut peeks = Vec::new();
                        for l in &limiters {
                            peeks.push(l.peek_n(&names, *cost).await.unwrap());
                        }
                        prop_assert_eq!(&peeks[0], &peeks[1], "{:?}", names);
                        if *check {
                            for l in &limiters {
                                let d = l.check_n(&names, *cost).await.unwrap();
                                prop_assert_eq!(d.is_allowed(), peeks[0].is_allowed());
                                if !d.is_allowed() {
                                    prop_assert_eq!(d.statuses(), peeks[0].statuses());
                                }
                            }
                        }
                    }
                    Ok(())
                })
            },
        )
        .unwrap();
}

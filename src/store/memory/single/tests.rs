use std::time::Duration;

use super::*;
use crate::algorithm::Entries;
use crate::clock::{Clock, ManualClock};
use crate::Policy;

const NAMESPACES: [Option<&str>; 3] = [None, Some("login"), Some("api")];

/// Policies of every algorithm, one and several limits, one key per identifier or more.
const POLICIES: [&str; 9] = [
    "10/s",
    "2000/s",
    "10/s, 120/min, 240/h",
    "10/s sliding",
    "4/s fixed",
    "10/s, 120/min gcra, 240/h fixed",
    "5/s bucket capacity=8",
    "5/s log",
    "3 concurrent",
];

/// A memory store reading `clock`.
fn store_on(clock: &ManualClock) -> MemoryStore {
    MemoryStore::builder()
        .clock(Clock::Manual(clock.clone()))
        .build()
}

fn limits(policy: &str) -> Vec<Limit> {
    policy.parse::<Policy>().unwrap().limits().to_vec()
}

#[test]
fn the_reused_key_is_the_key_of_the_identifier() {
    let mut scratch = Scratch::default();
    for policy in [
        // the default algorithm, the rolling window, in both its forms
        "10/s",
        "2000/s",
        "10/s, 120/min, 240/h",
        "10/s sliding",
        "10/s, 120/min gcra, 240/h fixed",
        "100/s bucket capacity=500",
        "5/s log",
        "3 concurrent",
    ] {
        let limits = limits(policy);
        // the same policy in turn without a namespace and in two: the cache follows both
        for namespace in NAMESPACES.into_iter().chain(NAMESPACES) {
            for id in ["ip:1.2.3.4", "", "%7B", "#0123abcd"] {
                let (_, key) = scratch.key(id, namespace, &limits).unwrap();
                let keys = keyspace::keys_of(PREFIX, id, namespace, &limits);
                assert_eq!([key], keys.as_slice(), "{policy} in {namespace:?}");
            }
            // the key built on the stack for an identifier written as it is, as long as it
            // fits there
            let shape = OneKey::of(namespace, &limits).unwrap();
            for id in ["ip:1.2.3.4".to_string(), "u".repeat(80), "u".repeat(110)] {
                let keys = keyspace::keys_of(PREFIX, &id, namespace, &limits);
                match on_stack(&id, &shape.suffix) {
                    Some(key) => assert_eq!([key.as_str()], keys.as_slice()),
                    None => assert!(keys[0].len() > STACK_KEY, "{}", keys[0]),
                }
            }
        }
    }
    // a policy whose identifiers have several keys takes the general way
    for policy in ["10/s, 5/s log", "10/s log, 20/s log", "10/s, 3 concurrent"] {
        for namespace in NAMESPACES {
            assert!(scratch.key("a", namespace, &limits(policy)).is_none());
        }
    }
}

/// Every state of `store`: key, state and expiry, by key.
fn contents(store: &MemoryStore) -> Vec<(String, String, u64)> {
    let mut all: Vec<_> = store
        .inner
        .shards
        .iter()
        .flat_map(|shard| {
            lock(shard)
                .map
                .iter()
                .map(|(k, s)| (k.into_owned(), format!("{:?}", s.state), s.expires_at))
                .collect::<Vec<_>>()
        })
        .collect();
    all.sort();
    all
}

#[test]
fn the_short_way_decides_as_the_general_way() {
    let clock = ManualClock::new(1_000_000_000_000);
    let store = || store_on(&clock);
    // a fixed pseudo-random sequence (xorshift)
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for policy in POLICIES {
        let limits = limits(policy);
        // costs up to a third of the smallest quota, so that every policy denies some
        let max_cost = limits
            .iter()
            .map(|l| if l.is_concurrency() { 1 } else { l.max_cost() })
            .min()
            .unwrap()
            .div_ceil(3);
        let (short, general, one) = (store(), store(), store());
        // escaped, and as a caller gives them (to `check_one`, which escapes them itself)
        // (the last, written as it is, too long for a key built on the stack)
        let long = "u".repeat(STACK_KEY);
        let ids = ["ip:1.2.3.4".to_string(), "%7B".to_string(), long.clone()];
        let raw_ids = ["ip:1.2.3.4", "{", &long];
        let concurrency = policy.contains("concurrent");
        let mut allowed = 0;
        for round in 0..600 {
            let namespace = NAMESPACES[round % 3];
            let lease = format!("lease-{round}");
            // the first two identifiers in turns, the long one now and then
            let which = if round % 10 == 9 { 2 } else { round / 3 % 2 };
            let plan = Plan {
                ids: &ids[which..][..1],
                namespace,
                limits: &limits,
                cost: 1 + next(max_cost),
                lease: &lease,
            };
            // a third of the checks may wait up to a quarter second (none with a slot to
            // take: the limiter refuses those waits)
            let waits = !concurrency && next(3) == 0;
            let max_wait_us = if waits { 250_000 } else { 0 };
            let mut expected = Entries::new();
            let summary = general.decide_general(&plan, Some(max_wait_us), &mut expected);
            let mut entries = Entries::new();
            let short_summary = check(&short, &plan.ids[0], &plan, max_wait_us, &mut entries);
            assert_eq!(short_summary, Some(summary), "{policy}, round {round}");
            assert_eq!(entries, expected, "{policy}, round {round}");
            allowed += u64::from(summary.allowed);
            assert_eq!(
                contents(&short),
                contents(&general),
                "{policy}, round {round}"
            );
            // the limiter's way, for a policy without a slot to take: the caller's identifier,
            // the shape worked out beforehand
            if !concurrency {
                let shape = OneKey::of(namespace, &limits).unwrap();
                let raw = raw_ids[which];
                let mut entries = Entries::new();
                let ask = Ask {
                    limits: &limits,
                    cost: plan.cost,
                    lease: "",
                    max_wait_us,
                };
                let one_summary = check_one(&one, &shape, raw, &ask, &mut entries);
                assert_eq!(one_summary, summary, "{policy}, round {round}");
                assert_eq!(entries, expected, "{policy}, round {round}");
                assert_eq!(contents(&one), contents(&general), "{policy}, {round}");
            }
            // a peek (the general way) finds the state the short way wrote
            assert_eq!(short.peek(&plan), general.peek(&plan), "{policy}");
            clock.advance(Duration::from_micros(next(150_000)));
            if round % 199 == 198 {
                // now and then long enough for every state to expire: the next check of each
                // finds an expired state, which decides as a missing one
                clock.advance(Duration::from_secs(7_200));
            }
        }
        assert!(0 < allowed && allowed < 600, "{policy}: {allowed} allowed");
        // and so does a reset
        for namespace in NAMESPACES {
            for id in &ids {
                short.reset(&Plan {
                    ids: std::slice::from_ref(id),
                    namespace,
                    limits: &limits,
                    cost: 1,
                    lease: "",
                });
            }
        }
        assert!(short.is_empty(), "{policy}");
    }
}

#[test]
fn a_denial_after_a_refund_leaves_the_state_as_it_was_either_way() {
    // A refund shrinks a state and keeps its expiry; the denial that follows changes nothing
    // (all or nothing), so the short way and the general way keep the same state and expiry,
    // as the script leaves a key's TTL when it denies.
    let clock = ManualClock::new(1_000_000_000_000);
    for policy in POLICIES.into_iter().filter(|p| !p.contains("concurrent")) {
        let limits = limits(policy);
        let (short, general) = (store_on(&clock), store_on(&clock));
        let ids = ["ip:1.2.3.4".to_string()];
        let plan = |cost| Plan {
            ids: &ids,
            namespace: None,
            limits: &limits,
            cost,
            lease: "",
        };
        let max = limits.iter().map(Limit::max_cost).min().unwrap();
        // each way: its own check of the whole quota, given back in part
        let charged = clock.now_micros();
        let mut entries = Entries::new();
        let summary = general.decide_general(&plan(max), Some(0), &mut entries);
        assert!(summary.allowed, "{policy}");
        let short_summary = check(&short, &ids[0], &plan(max), 0, &mut Entries::new());
        assert_eq!(short_summary, Some(summary), "{policy}");
        clock.advance(Duration::from_millis(1));
        for store in [&short, &general] {
            store.refund(&plan(1), charged);
        }
        assert_eq!(contents(&short), contents(&general), "{policy}");
        // the whole quota again: denied, and nothing changes
        let mut expected = Entries::new();
        let denial = general.decide_general(&plan(max), Some(0), &mut expected);
        assert!(!denial.allowed, "{policy}");
        let mut entries = Entries::new();
        let short_denial = check(&short, &ids[0], &plan(max), 0, &mut entries);
        assert_eq!(short_denial, Some(denial), "{policy}");
        assert_eq!(entries, expected, "{policy}");
        assert_eq!(contents(&short), contents(&general), "{policy}");
    }
}

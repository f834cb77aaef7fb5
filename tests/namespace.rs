//! Limiters on one store: without namespaces their limits of one name share an identifier's
//! state; in namespaces of their own they count apart, across policy changes too. On both
//! stores.

mod common;

use std::time::Duration;

use common::{manual_clock, RedisServer};
use tollgate::store::{ConfigErrorKind, Namespace};
use tollgate::{Clock, ConcurrencyGuard, Limiter, ManualClock, MemoryStore, Origin, Policy, Store};

fn memory(clock: &ManualClock) -> Store {
    MemoryStore::builder()
        .clock(Clock::Manual(clock.clone()))
        .build()
        .into()
}

fn policy(text: &str) -> Policy {
    text.parse().unwrap()
}

/// A limiter of `policy` on `store`, in `namespace` when one is given.
fn limiter(store: &Store, policy_text: &str, namespace: Option<&str>) -> Limiter {
    let mut builder = Limiter::builder(store.clone(), policy(policy_text));
    if let Some(ns) = namespace {
        builder = builder.namespace(ns.parse().unwrap());
    }
    builder.build()
}

/// A memory store and a Redis store on `server`, both on `clock`.
async fn stores(server: &RedisServer, clock: &ManualClock) -> [Store; 2] {
    let redis = server.store(Clock::Manual(clock.clone())).await;
    [memory(clock), redis.into()]
}

/// How many of `n` checks of `id` are allowed (slots taken are kept in `held`).
async fn admitted(l: &Limiter, id: &str, n: usize, held: &mut Vec<ConcurrencyGuard>) -> usize {
    let mut allowed = 0;
    for _ in 0..n {
        let mut d = l.check(&[id]).await.unwrap();
        if d.is_allowed() {
            allowed += 1;
            held.extend(d.take_guard());
        }
    }
    allowed
}

/// `10/min` and `100/min` on one store, for one identifier: without namespaces both are
/// sliding windows over a minute, one state, so each counts the other's requests (the
/// documented sharing); in two namespaces each counts its own.
#[tokio::test]
async fn limits_of_one_name_count_together_unless_in_namespaces_of_their_own() {
    let server = RedisServer::start();
    let clock = manual_clock();
    for store in stores(&server, &clock).await {
        let held = &mut Vec::new();
        let login = limiter(&store, "10/min", None);
        let default = limiter(&store, "100/min", None);
        assert_eq!(admitted(&login, "ip:1", 10, held).await, 10);
        assert_eq!(
            default.usage(&["ip:1"]).await.unwrap()[0].used,
            10,
            "shared"
        );
        assert_eq!(admitted(&default, "ip:1", 5, held).await, 5);
        assert_eq!(admitted(&login, "ip:1", 1, held).await, 0);
        assert_eq!(
            default.usage(&["ip:1"]).await.unwrap()[0].used,
            15,
            "shared"
        );

        let login = limiter(&store, "10/min", Some("login"));
        let default = limiter(&store, "100/min", Some("default"));
        assert_eq!(admitted(&login, "ip:2", 12, held).await, 10);
        let usage = default.usage(&["ip:2"]).await.unwrap();
        assert_eq!((usage[0].used, usage[0].remaining), (0, 100), "apart");
        assert_eq!(admitted(&default, "ip:2", 100, held).await, 100);
        assert_eq!(admitted(&default, "ip:2", 1, held).await, 0);
        assert_eq!(login.usage(&["ip:2"]).await.unwrap()[0].used, 10);
        // the shared space saw none of it
        let shared = limiter(&store, "10/min", None);
        assert_eq!(shared.usage(&["ip:2"]).await.unwrap()[0].used, 0);
        // peeks read each namespace's own state
        assert!(!login.peek(&["ip:2"]).await.unwrap().is_allowed());
        assert!(shared.peek(&["ip:2"]).await.unwrap().is_allowed());
        // a reset in one namespace leaves the other alone
        login.reset(&["ip:2"]).await.unwrap();
        assert_eq!(login.usage(&["ip:2"]).await.unwrap()[0].used, 0);
        assert_eq!(default.usage(&["ip:2"]).await.unwrap()[0].used, 100);
    }
}

/// A namespace stays through policy changes: what was counted carries over (8 used of
/// 10/min raised to 12/min admits 4 more), and slots held stay held, in the namespace and
/// nowhere else.
#[tokio::test]
async fn a_namespace_keeps_its_counts_through_a_policy_change() {
    let server = RedisServer::start();
    let clock = manual_clock();
    for store in stores(&server, &clock).await {
        let held = &mut Vec::new();
        let login = limiter(&store, "10/min", Some("login"));
        assert_eq!(admitted(&login, "u", 8, held).await, 8);
        login.set_policy(policy("12/min"));
        assert_eq!(login.namespace().map(Namespace::as_str), Some("login"));
        assert_eq!(admitted(&login, "u", 10, held).await, 4, "12 - 8 used");
        let (reload, policies) = tokio::sync::watch::channel(policy("20/min"));
        tokio::spawn(login.follow(policies));
        let l = &login;
        common::eventually(Duration::from_secs(5), || async move {
            match l.usage(&["u"]).await.unwrap()[0].limit.count() {
                20 => Ok(()),
                n => Err(format!("still {n}/min")),
            }
        })
        .await;
        assert_eq!(admitted(&login, "u", 10, held).await, 8, "20 - 12 used");
        drop(reload);
        // the store's shared space never counted any of it
        let shared = limiter(&store, "20/min", None);
        assert_eq!(shared.usage(&["u"]).await.unwrap()[0].used, 0);

        let jobs = limiter(&store, "2 concurrent", Some("jobs"));
        assert_eq!(admitted(&jobs, "u", 2, held).await, 2);
        jobs.set_policy(policy("3 concurrent lease=30s"));
        assert_eq!(admitted(&jobs, "u", 3, held).await, 1, "3 - 2 held");
        let shared = limiter(&store, "3 concurrent", None);
        assert_eq!(admitted(&shared, "u", 3, held).await, 3, "none held there");
    }
}

/// Two concurrency limits on one store hold an identifier's slots together without
/// namespaces, apart in namespaces of their own; a slot given back is given back in its
/// namespace.
#[tokio::test]
async fn concurrency_limits_in_namespaces_of_their_own_hold_slots_apart() {
    let server = RedisServer::start();
    let clock = manual_clock();
    for store in stores(&server, &clock).await {
        let shared_a = limiter(&store, "1 concurrent", None);
        let shared_b = limiter(&store, "2 concurrent", None);
        let held = &mut Vec::new();
        assert_eq!(admitted(&shared_a, "u", 1, held).await, 1);
        assert_eq!(admitted(&shared_b, "u", 2, held).await, 1, "one slot taken");
        held.clear();

        let a = limiter(&store, "1 concurrent", Some("a"));
        let b = limiter(&store, "1 concurrent", Some("b"));
        let mut first = a.check(&["v"]).await.unwrap();
        assert!(first.is_allowed());
        let guard = first.take_guard().unwrap();
        let mut second = b.check(&["v"]).await.unwrap();
        assert!(second.is_allowed(), "b's slot is its own");
        let _held_b = second.take_guard().unwrap();
        assert!(!a.check(&["v"]).await.unwrap().is_allowed());
        assert!(shared_a.check(&["v"]).await.unwrap().is_allowed());
        assert_eq!(b.usage(&["v"]).await.unwrap()[0].used, 1);
        drop(guard);
        // the release reached a's slot (on Redis the keeper sends it a moment later)
        let a = &a;
        common::eventually(Duration::from_secs(5), || async move {
            match a.usage(&["v"]).await.unwrap()[0].used {
                0 => Ok(()),
                n => Err(format!("{n} slot(s) still held")),
            }
        })
        .await;
        assert_eq!(b.usage(&["v"]).await.unwrap()[0].used, 1, "b's still held");
    }
}

/// On Redis, a namespaced limiter's keys are `PREFIX:{IDENTIFIER}:NAMESPACE:LIMIT`: the hash
/// tag stays the identifier's.
#[tokio::test]
async fn namespaced_keys_keep_the_identifier_hash_tag() {
    let server = RedisServer::start();
    let redis = server.store(Clock::Real).await;
    let prefix = redis.prefix().to_string();
    let store: Store = redis.into();
    let login = limiter(&store, "10/min, 5/s log, 2 concurrent", Some("login"));
    let _d = login.check(&["ip:1.2.3.4"]).await.unwrap();
    let mut conn = server.conn();
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query(&mut conn)
        .unwrap();
    keys.sort();
    assert_eq!(
        keys,
        ["c", "l1s", "r1m"].map(|l| format!("{prefix}:{{ip:1.2.3.4}}:login:{l}"))
    );
}

/// A namespace that could make two limiters' keys meet is refused where it is made, with an
/// error that names it.
#[test]
fn a_bad_namespace_is_refused_clearly() {
    for bad in ["", "login:v2", "{login}", "log}in", "two words", "tab\t"] {
        let e = Namespace::new(bad).unwrap_err();
        assert_eq!(e.kind(), ConfigErrorKind::Namespace, "{bad:?}");
        assert_eq!(e.part(), bad);
        assert!(e.to_string().starts_with("namespace "), "{e}");
        assert!(bad.parse::<Namespace>().is_err());
    }
    assert!(Namespace::new("x".repeat(Namespace::MAX_LEN + 1)).is_err());
    assert_eq!(Namespace::new("login").unwrap().to_string(), "login");
}

/// On Redis on the real clock, with the deny cache: a namespaced limiter's denials are
/// remembered for it alone, and its reset reaches its own keys and its own cache.
#[tokio::test]
async fn the_deny_cache_and_reset_keep_to_the_namespace() {
    let server = RedisServer::start();
    let store: Store = server.store(Clock::Real).await.into();
    let login = limiter(&store, "2/min", Some("login"));
    let default = limiter(&store, "100/min", Some("default"));
    let held = &mut Vec::new();
    assert_eq!(admitted(&login, "ip:9", 2, held).await, 2);
    let d = login.check(&["ip:9"]).await.unwrap();
    assert_eq!((d.is_allowed(), d.origin()), (false, Origin::Store));
    let d = login.check(&["ip:9"]).await.unwrap();
    assert_eq!((d.is_allowed(), d.origin()), (false, Origin::DenyCache));
    let d = default.check(&["ip:9"]).await.unwrap();
    assert_eq!((d.is_allowed(), d.origin()), (true, Origin::Store));
    login.reset(&["ip:9"]).await.unwrap();
    let d = login.check(&["ip:9"]).await.unwrap();
    assert_eq!((d.is_allowed(), d.origin()), (true, Origin::Store));
    assert_eq!(default.usage(&["ip:9"]).await.unwrap()[0].used, 1);
}

//! The Redis store's connection through the failures of a real `redis-server`: a killed
//! connection, a stall, a password changed and back, a master turned replica and back, max
//! clients. Each ends with checks going through Redis again, on the same store, within a
//! bound asserted generously (the machine may be loaded); none ever admits without Redis.

mod common;

use std::time::Duration;

use common::{eventually, unique_prefix, RedisServer};
use redis::Commands;
use tollgate::store::{MisconfigurationKind, StoreHealth};
use tollgate::{Error, Limiter, RedisStore, Store, StoreError};

/// How long recovery may take in these tests: the store retries at most every 500 ms, so
/// this leaves a loaded machine plenty of room.
const RECOVERY: Duration = Duration::from_secs(5);

async fn limiter(url: String, policy: &str, timeout: Duration) -> Limiter {
    limiter_with_prefix(url, policy, timeout).await.0
}

async fn limiter_with_prefix(url: String, policy: &str, timeout: Duration) -> (Limiter, String) {
    let prefix = unique_prefix();
    let store = RedisStore::builder(url)
        .prefix(prefix.clone())
        .timeout(timeout)
        .build()
        .await
        .unwrap();
    (closed(store, policy.parse().unwrap()), prefix)
}

/// What the limiter's Redis store knows of its server now.
fn health(l: &Limiter) -> StoreHealth {
    match l.store() {
        Store::Redis(store) => store.health(),
        other => panic!("not a Redis store: {other:?}"),
    }
}

/// A check that went through Redis and was allowed.
async fn allowed(l: &Limiter, id: &str) -> Result<(), String> {
    match l.check(&[id]).await {
        Ok(d) if d.is_allowed() => Ok(()),
        Ok(_) => Err("denied".into()),
        Err(e) => Err(e.to_string()),
    }
}

fn misconfigured(err: &Error) -> Option<MisconfigurationKind> {
    match err {
        Error::Store(StoreError::Misconfigured(m)) => Some(m.kind()),
        _ => None,
    }
}

fn kill_normal_clients(admin: &mut redis::Connection) {
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query(admin)
        .unwrap();
    assert!(killed >= 1, "no connection of the store to kill");
}

/// `CLIENT KILL`: the store learns of it from the connection itself and reconnects before the
/// next check needs it.
#[tokio::test]
async fn a_killed_connection_is_replaced() {
    let server = RedisServer::start();
    let l = limiter(server.url(), "1000/min", Duration::from_secs(1)).await;
    allowed(&l, "a").await.unwrap();
    let mut admin = server.conn();
    for round in 0..3 {
        kill_normal_clients(&mut admin);
        let (_, took) = eventually(RECOVERY, || allowed(&l, "a")).await;
        eprintln!("round {round}: checks back after {took:?}");
    }
    let remaining = l.check(&["a"]).await.unwrap().statuses()[0].remaining;
    assert!(remaining <= 1000 - 4, "every check counted: {remaining}");
}

/// `DEBUG SLEEP` longer than the timeout: the check times out, is not retried (it runs once,
/// when Redis wakes up, and is counted once), and checks work again afterwards.
#[tokio::test]
async fn a_stall_longer_than_the_timeout_is_not_retried() {
    let server = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let (l, prefix) =
        limiter_with_prefix(server.url(), "1000/min log", Duration::from_millis(200)).await;
    allowed(&l, "a").await.unwrap();
    let mut admin = server.conn();
    let sleeper = std::thread::spawn(move || {
        let _: () = redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg("1.5")
            .query(&mut admin)
            .unwrap();
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let err = l.check(&["a"]).await.unwrap_err();
    assert!(
        matches!(err, Error::Store(StoreError::Timeout(_))),
        "{err:?}"
    );
    tokio::task::spawn_blocking(move || sleeper.join().unwrap())
        .await
        .unwrap();
    let mut attempts = 0;
    let (_, took) = eventually(RECOVERY, || {
        attempts += 1;
        allowed(&l, "a")
    })
    .await;
    eprintln!("checks back {took:?} after the stall");
    let mut conn = server.conn();
    let keys: Vec<String> = conn.keys(format!("{prefix}:*")).unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let entries: usize = conn.zcard(&keys[0]).unwrap();
    // The first check, the timed-out one (run once, when Redis woke up), and the one after
    // (on a loaded machine, the failed attempts before it may have reached Redis too).
    assert!(
        (3..=2 + attempts).contains(&entries),
        "{entries} entries, {attempts} attempts after the stall"
    );
}

/// The password changes while the store's connection is dropped, then changes back: checks
/// fail with a typed authentication error (never an admission) while it is wrong, and work
/// again on the same store soon after the right one is back.
#[tokio::test]
async fn a_password_changed_and_back_is_survived() {
    let password = "right#/pass@word";
    let server = RedisServer::start_with(&["--requirepass", password]);
    let url = format!("redis://:{password}@127.0.0.1:{}/", server.port);
    let l = limiter(url, "1000/min", Duration::from_millis(250)).await;
    allowed(&l, "a").await.unwrap();
    assert!(health(&l).is_up(), "{:?}", health(&l));
    let mut admin = server.conn();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("another")
        .query(&mut admin)
        .unwrap();
    kill_normal_clients(&mut admin);
    let (kind, _) = eventually(RECOVERY, || async {
        match l.check(&["a"]).await {
            Ok(d) => panic!("checked without Redis: {d:?}"),
            Err(e) => misconfigured(&e).ok_or(e.to_string()),
        }
    })
    .await;
    assert_eq!(kind, MisconfigurationKind::Authentication);
    // the store's health says so too, without a check
    match health(&l) {
        StoreHealth::Misconfigured(m) => {
            assert_eq!(m.kind(), MisconfigurationKind::Authentication);
            assert!(!format!("{m} {m:?}").contains(password), "{m:?}");
        }
        other => panic!("{other:?}"),
    }
    let err = l.check(&["a"]).await.unwrap_err();
    assert!(!format!("{err} {err:?}").contains(password), "{err:?}");
    assert!(!format!("{:?}", l.store()).contains(password));

    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg(password)
        .query(&mut admin)
        .unwrap();
    let (_, took) = eventually(RECOVERY, || allowed(&l, "a")).await;
    assert!(health(&l).is_up(), "{:?}", health(&l));
    eprintln!("checks back {took:?} after the right password");
    // the store retries at most every 500 ms: about half a second, with room for a loaded
    // machine
    assert!(took < Duration::from_secs(2), "{took:?}");
}

/// The master becomes a replica (`REPLICAOF`), then a master again, as a failover does
/// behind an address that follows the master (a managed service's endpoint): meanwhile
/// checks fail as while the store is down, with errors naming the replica, and never as a
/// misconfiguration (the URL is right, and the failure passes by itself: an alert on
/// misconfigurations would be a false one); then they work again.
#[tokio::test]
async fn a_master_turned_replica_and_back_is_survived() {
    let server = RedisServer::start();
    let other = RedisServer::start();
    let l = limiter(server.url(), "1000/min", Duration::from_millis(500)).await;
    allowed(&l, "a").await.unwrap();
    let mut admin = server.conn();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(other.port)
        .query(&mut admin)
        .unwrap();
    let mut n = 0;
    eventually(RECOVERY, || {
        n += 1;
        let id = format!("fresh-{n}"); // never denied: an admission would write
        let l = &l;
        async move {
            match l.check(&[id]).await {
                Ok(d) => panic!("checked on a replica: {d:?}"),
                Err(e) => {
                    // (its sources show in `Debug`)
                    let text = format!("{e} {e:?}");
                    assert!(misconfigured(&e).is_none(), "a failover told as: {text}");
                    match text.contains("replica") {
                        true => Ok(()),
                        false => Err(text),
                    }
                }
            }
        }
    })
    .await;
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut admin)
        .unwrap();
    let (_, took) = eventually(RECOVERY, || allowed(&l, "b")).await;
    eprintln!("checks back {took:?} after REPLICAOF NO ONE");
}

/// The server refuses new connections (max clients) when the store's is dropped: checks fail
/// until it accepts them again, then work on the same store.
#[tokio::test]
async fn max_clients_is_survived() {
    let server = RedisServer::start();
    let l = limiter(server.url(), "1000/min", Duration::from_millis(250)).await;
    allowed(&l, "a").await.unwrap();
    let mut admin = server.conn();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxclients")
        .arg(1)
        .query(&mut admin)
        .unwrap();
    kill_normal_clients(&mut admin);
    // a few checks fail (never admitted without Redis)
    for _ in 0..5 {
        assert!(l.check(&["a"]).await.is_err());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxclients")
        .arg(100)
        .query(&mut admin)
        .unwrap();
    let (_, took) = eventually(RECOVERY, || allowed(&l, "a")).await;
    eprintln!("checks back {took:?} after maxclients was raised");
}

/// `SCRIPT FLUSH` and a restart of Redis on the same port, one after the other, on one store.
#[tokio::test]
async fn an_empty_script_cache_and_a_restart_are_survived() {
    let server = RedisServer::start();
    let port = server.port;
    let l = limiter(server.url(), "1000/min", Duration::from_millis(250)).await;
    allowed(&l, "a").await.unwrap();
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut server.conn())
        .unwrap();
    allowed(&l, "a").await.unwrap();
    drop(server);
    assert!(l.check(&["a"]).await.is_err());
    let _again = RedisServer::start_on(port);
    let (_, took) = eventually(RECOVERY, || allowed(&l, "a")).await;
    eprintln!("checks back {took:?} after the restart");
}

/// Takes slots of `l` for `id` until one is denied (at most `limit + 1` tries, each retried
/// while the store fails); returns the decisions that hold a slot.
async fn take_all(l: &Limiter, id: &str, limit: usize) -> Vec<tollgate::Decision> {
    let mut held = Vec::new();
    for _ in 0..=limit {
        let (d, _) = eventually(RECOVERY, || async move { l.check(&[id]).await }).await;
        if !d.is_allowed() {
            return held;
        }
        held.push(d);
    }
    panic!("more than {limit} slots taken at once");
}

/// What a stall longer than the lease does to a concurrency limit: the held leases expire
/// in Redis (their renewals cannot reach it), so once Redis answers again up to `limit` more
/// requests are let in while the old ones still run — at most twice the limit in flight, and
/// only until the old requests end.
#[tokio::test]
async fn a_stall_longer_than_the_lease_lets_in_at_most_the_limit_again() {
    let server = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let l = limiter(
        server.url(),
        "3 concurrent lease=1s",
        Duration::from_millis(200),
    )
    .await;
    let old = take_all(&l, "k", 3).await;
    assert_eq!(old.len(), 3);
    let mut admin = server.conn();
    let stall = std::thread::spawn(move || {
        let _: () = redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg("2.5")
            .query(&mut admin)
            .unwrap();
    });
    tokio::task::spawn_blocking(move || stall.join().unwrap())
        .await
        .unwrap();
    let new = take_all(&l, "k", 3).await;
    eprintln!(
        "{} in flight at once after a stall longer than the lease",
        old.len() + new.len()
    );
    assert_eq!(new.len(), 3, "the old leases expired during the stall");
    old_leases_stay_gone(&l, old, new).await;
}

/// After a stall or a restart took the `old` leases from Redis and `new` took their place:
/// the old ones' renewals do not bring them back. Once the new requests end, the old still
/// running, the limit's three slots are free again, and held as before.
async fn old_leases_stay_gone(
    l: &Limiter,
    old: Vec<tollgate::Decision>,
    new: Vec<tollgate::Decision>,
) {
    // past a few renewal rounds (every third of the 1 s lease)
    tokio::time::sleep(Duration::from_millis(800)).await;
    drop(new);
    // (the releases go through the keeper: taken once they are through)
    let (again, _) = eventually(RECOVERY, || async move {
        match take_all(l, "k", 3).await {
            again if again.len() == 3 => Ok(again),
            again => Err(format!(
                "{} slots free with the old requests running",
                again.len()
            )),
        }
    })
    .await;
    assert!(
        !l.check(&["k"]).await.unwrap().is_allowed(),
        "the limit holds"
    );
    drop((old, again));
}

/// What a restart without persistence does to a concurrency limit: the slots are gone with
/// the data, so up to `limit` more requests are let in while the old ones still run (their
/// renewals do not bring the leases back).
#[tokio::test]
async fn a_restart_without_persistence_lets_in_at_most_the_limit_again() {
    let server = RedisServer::start();
    let port = server.port;
    let l = limiter(
        server.url(),
        "3 concurrent lease=1s",
        Duration::from_millis(250),
    )
    .await;
    let old = take_all(&l, "k", 3).await;
    assert_eq!(old.len(), 3);
    drop(server);
    let _again = RedisServer::start_on(port);
    let new = take_all(&l, "k", 3).await;
    eprintln!(
        "{} in flight at once after a restart without persistence",
        old.len() + new.len()
    );
    assert_eq!(new.len(), 3, "the old slots were lost with the data");
    old_leases_stay_gone(&l, old, new).await;
}

/// The server goes silent without closing the connection (a dead network path, through a
/// proxy that stops forwarding): once calls have kept timing out for a second the store
/// gives up the connection, answers at once while it cannot make a new one, and uses Redis
/// again as soon as the path is back.
#[tokio::test]
async fn a_silent_connection_is_given_up() {
    let server = RedisServer::start();
    let proxy = common::Proxy::start(server.port).await;
    let timeout = Duration::from_millis(200);
    let store = RedisStore::builder(proxy.url())
        .prefix(unique_prefix())
        .timeout(timeout)
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let l = closed(store, "1000/min".parse().unwrap());
    allowed(&l, "a").await.unwrap();
    proxy.freeze(true);
    let (took, _) = eventually(RECOVERY, || async {
        let started = std::time::Instant::now();
        match l.check(&["a"]).await {
            Ok(d) => panic!("checked without Redis: {d:?}"),
            Err(Error::Store(StoreError::Unavailable)) => Ok(started.elapsed()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
    assert!(took < timeout, "answered at once while down: {took:?}");
    proxy.freeze(false);
    let (_, took) = eventually(RECOVERY, || allowed(&l, "a")).await;
    eprintln!("checks back {took:?} after the path came back");
}

/// A limiter that fails closed, so that a store failure shows as the error it is rather
/// than as an allowed decision.
fn closed(store: impl Into<tollgate::Store>, policy: tollgate::Policy) -> Limiter {
    Limiter::builder(store, policy)
        .on_store_error(tollgate::OnStoreError::Closed)
        .build()
}

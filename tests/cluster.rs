//! The store on a Redis Cluster of the test's own: scripts reloaded on every shard, the errors
//! of a wrong URL or password, peeks across slots, and a master killed under load.

mod common;
#[path = "common/observed.rs"]
mod observed;

use std::time::{Duration, Instant};

use common::{ClusterServer, RedisServer};
use tollgate::store::MisconfigurationKind;
use tollgate::{Error, Limiter, OnStoreError, Origin, RedisStore, StoreError};

/// One identifier served by each master of `cluster`.
fn one_id_per_master(cluster: &ClusterServer, tag: &str) -> Vec<String> {
    let mut ids: Vec<String> = Vec::new();
    let mut masters = cluster.masters();
    masters.sort_unstable();
    masters.dedup();
    for i in 0.. {
        let id = format!("{tag}:{i}");
        let master = cluster.master_of(&format!("{{{id}}}"));
        if !ids
            .iter()
            .any(|known| cluster.master_of(&format!("{{{known}}}")) == master)
        {
            ids.push(id);
        }
        if ids.len() == masters.len() {
            return ids;
        }
    }
    unreachable!()
}

/// A store on `cluster` under `prefix` whose calls time out after `timeout`.
async fn impatient_store(cluster: &ClusterServer, prefix: &str, timeout: Duration) -> RedisStore {
    RedisStore::builder(cluster.url())
        .prefix(prefix)
        .timeout(timeout)
        .connect_timeout(Duration::from_secs(3))
        .build()
        .await
        .unwrap()
}

/// A store on `cluster` under a prefix of its own.
async fn store_on(cluster: &ClusterServer) -> RedisStore {
    RedisStore::builder(cluster.url())
        .prefix(common::unique_prefix())
        .timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap()
}

/// After `SCRIPT FLUSH` on every master, the next check on each master loads the script again
/// (on the master that answered `NOSCRIPT`) and is answered.
#[tokio::test]
async fn scripts_are_reloaded_on_every_shard() {
    let cluster = ClusterServer::shared();
    let store = store_on(cluster).await;
    let limiter = Limiter::new(store, "100/min, 5/s log".parse().unwrap());
    let ids = one_id_per_master(cluster, "flush");
    assert_eq!(ids.len(), 3);
    for id in &ids {
        assert!(limiter.check(&[id]).await.unwrap().is_allowed());
    }
    for round in 0..2 {
        for port in cluster.masters() {
            let mut conn = cluster.node_conn(port).unwrap();
            let () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut conn).unwrap();
        }
        for id in &ids {
            let d = limiter.check(&[id]).await.unwrap();
            assert!(d.is_allowed(), "{id}, round {round}");
            assert_eq!(d.statuses()[0].remaining, 98 - round, "{id}");
        }
    }
}

/// A `redis://` URL to a cluster node fails with the misconfiguration that names
/// `redis+cluster://`; a `redis+cluster://` URL to a standalone server names `redis://`.
#[tokio::test]
async fn the_wrong_kind_of_url_is_misconfigured() {
    let cluster = ClusterServer::shared();
    let port = cluster.masters()[0];
    let err = RedisStore::connect(format!("redis://127.0.0.1:{port}/"))
        .await
        .unwrap_err();
    let StoreError::Misconfigured(m) = &err else {
        panic!("{err:?}");
    };
    assert_eq!(m.kind(), MisconfigurationKind::Cluster);
    assert!(err.to_string().contains("redis+cluster://"), "{err}");

    let server = RedisServer::start();
    let err = RedisStore::connect(format!("redis+cluster://127.0.0.1:{}", server.port))
        .await
        .unwrap_err();
    let StoreError::Misconfigured(m) = &err else {
        panic!("{err:?}");
    };
    assert_eq!(m.kind(), MisconfigurationKind::NotCluster);
    assert!(err.to_string().contains("redis://"), "{err}");
}

/// A wrong password on a cluster fails at start-up with the authentication error, and the
/// password is in no message; the right one works.
#[tokio::test]
async fn a_wrong_password_fails_clearly() {
    let cluster = ClusterServer::start_with(3, 0, Some("s3cret pass"));
    let nodes: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let url = format!("redis+cluster://:wr0ng@{}", nodes.join(","));
    let err = RedisStore::builder(url.clone()).build().await.unwrap_err();
    let StoreError::Misconfigured(m) = &err else {
        panic!("{err:?}");
    };
    assert_eq!(m.kind(), MisconfigurationKind::Authentication);
    let text = format!("{err} {err:?} {:?}", std::error::Error::source(&err));
    assert!(!text.contains("wr0ng"), "{text}");
    let builder = RedisStore::builder(url);
    assert!(!format!("{builder:?}").contains("wr0ng"));

    let store = RedisStore::builder(cluster.url())
        .connect_timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let limiter = Limiter::new(store, "2/min".parse().unwrap());
    assert!(limiter
        .check(&["ip:1.2.3.4", "user:42"])
        .await
        .unwrap()
        .is_allowed());
}

/// A master killed under a steady load, once its replica has every charge: checks of its
/// slot fail (closed policy) until the replica is promoted, then are admitted again, and the
/// whole run never admits more than the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_under_load_never_over_admits() {
    const LIMIT: u64 = 120;
    let mut cluster = ClusterServer::start(3, 1);
    let store = RedisStore::builder(cluster.url())
        .prefix("failover")
        .timeout(Duration::from_millis(200))
        .connect_timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    // (the rolling window: at most the limit in any hour, where a fixed window's run
    // crossing the top of the hour could admit twice)
    let limiter = Limiter::builder(store, format!("{LIMIT}/h").parse().unwrap())
        .on_store_error(OnStoreError::Closed)
        .build();
    let id = "ip:203.0.113.9";
    let master = cluster.master_of(&format!("{{{id}}}"));

    let pace = Duration::from_millis(15);
    let (mut admitted, mut failed, mut denied) = (0u64, 0u64, 0u64);
    // checks that timed out before the kill: a stall of the test machine, not the outage
    let mut stalled_before_kill = 0u32;
    let mut admitted_after_failure = 0u64;
    let started = Instant::now();
    let mut killed_at = None;
    let mut recovered = None;
    let mut last_denied = None::<Instant>;
    let mut kinds = std::collections::BTreeMap::new();
    loop {
        let tick = Instant::now();
        if killed_at.is_none() && started.elapsed() > Duration::from_millis(800) {
            // Every charge made so far has reached the replica (no check is under way): the
            // failover loses none of them. One the master had not passed on would be lost
            // with it, by design (DESIGN.md, "Failover"), and a loaded machine can hold a
            // replica back by hundreds of milliseconds.
            cluster.wait_replicated(master);
            cluster.node(master).kill();
            killed_at = Some(Instant::now());
        }
        match limiter.check(&[id]).await {
            Ok(d) if d.is_allowed() => {
                admitted += 1;
                if failed > 0 {
                    admitted_after_failure += 1;
                    recovered.get_or_insert(Instant::now());
                }
            }
            Ok(_) => {
                denied += 1;
                last_denied.get_or_insert(Instant::now());
            }
            // Before the kill, only a timeout (the machine busy for 200 ms): such a check may
            // have charged, unseen, which counts against the limit and leaves the bound on
            // what was admitted as it is.
            Err(Error::Store(StoreError::Timeout(_))) if killed_at.is_none() => {
                stalled_before_kill += 1;
            }
            Err(Error::Store(e)) => {
                // a slot without a master is an outage, not a misconfiguration
                assert!(
                    !matches!(e, StoreError::Misconfigured(_) | StoreError::Config(_)),
                    "{e:?}"
                );
                assert!(killed_at.is_some(), "a failure before the kill: {e:?}");
                *kinds.entry(e.kind_label()).or_insert(0u32) += 1;
                failed += 1;
            }
            Err(e) => panic!("{e}"),
        }
        // run until the limit has denied for a while after the recovery
        if last_denied.is_some_and(|t| t.elapsed() > Duration::from_millis(500)) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no recovery: admitted {admitted}, failed {failed}, denied {denied}"
        );
        tokio::time::sleep(pace.saturating_sub(tick.elapsed())).await;
    }
    let killed_at = killed_at.unwrap();
    let outage = recovered.unwrap().duration_since(killed_at);
    eprintln!(
        "admitted {admitted}, failed {failed} ({kinds:?}), denied {denied}, first admitted \
         again {outage:?} after the kill; {stalled_before_kill} timed out before it"
    );
    assert!(failed > 0, "no failure while the slot had no master");
    assert!(
        admitted_after_failure > 0,
        "never admitted after the promotion"
    );
    assert!(
        admitted <= LIMIT,
        "{admitted} admitted for a limit of {LIMIT}"
    );
    assert!(denied > 0);
    // The replica was promoted: the cluster is whole again without the killed node.
    cluster.wait_ok();
    assert_ne!(cluster.master_of(&format!("{{{id}}}")), master);
}

/// A slot held for an IP and a user, which live in different slots: renewed past its lease
/// (one renewal call per slot), and released on both slots when dropped.
#[tokio::test]
async fn leases_across_slots_are_renewed_and_released() {
    let cluster = ClusterServer::shared();
    let store = store_on(cluster).await;
    let limiter = Limiter::new(store, "1 concurrent lease=1s".parse().unwrap());
    let (ip, user) = ("ip:1.2.3.4", "user:42");
    assert_ne!(
        cluster.master_of(&format!("{{{ip}}}")),
        cluster.master_of(&format!("{{{user}}}"))
    );
    let held = limiter.check(&[ip, user]).await.unwrap();
    assert!(held.is_allowed());
    // twice the lease: only renewals keep the slots taken
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        !limiter.check(&[ip]).await.unwrap().is_allowed(),
        "ip's lease expired"
    );
    assert!(
        !limiter.check(&[user]).await.unwrap().is_allowed(),
        "user's lease expired"
    );
    drop(held);
    for id in [ip, user] {
        let (d, _) = common::eventually(Duration::from_millis(900), || async {
            match limiter.check(&[id]).await {
                Ok(d) if d.is_allowed() => Ok(d),
                other => Err(format!("{id} still held: {other:?}")),
            }
        })
        .await;
        drop(d);
    }
}

/// A check of identifiers in two hash slots that may wait without end (`Duration::MAX`)
/// waits for its turn: checked again when its denial says, with no deadline to reach.
#[tokio::test]
async fn a_wait_without_end_across_slots_waits_its_turn() {
    let cluster = ClusterServer::shared();
    let limiter = Limiter::new(store_on(cluster).await, "1/s gcra".parse().unwrap());
    let ids = ["ip:5.6.7.8", "user:43"];
    assert_ne!(
        cluster.master_of(&format!("{{{}}}", ids[0])),
        cluster.master_of(&format!("{{{}}}", ids[1]))
    );
    let started = std::time::Instant::now();
    assert!(limiter.check(&ids).await.unwrap().is_allowed());
    let waited = limiter.check_waiting(&ids, Duration::MAX).await.unwrap();
    assert!(waited.is_allowed(), "{waited:?}");
    // its turn came once the first's second was over
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
}

/// Checks across slots that wait for a fast limit ask Redis again at a pace of their own,
/// not every time their denial says (a millisecond for `1000/s`), when they are a crowd
/// that the limit admits one by one: each is told the same time, and all but one are denied
/// again. Forty waiters of 5 units each, admitted one every 5 ms, make about ten calls each
/// (two a try, one per slot); asking at every denial's time, they made some 27.
#[tokio::test]
async fn waiters_across_slots_ask_again_at_a_bounded_pace() {
    observed::observed();
    let cluster = ClusterServer::shared();
    let prefix = common::unique_prefix();
    let store = RedisStore::builder(cluster.url())
        .prefix(prefix.clone())
        .timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let limiter = Limiter::new(store, "1000/s gcra".parse().unwrap());
    let ids: Vec<String> = one_id_per_master(cluster, "paced")
        .into_iter()
        .take(2)
        .collect();
    assert!(limiter.check_n(&ids, 1000).await.unwrap().is_allowed());
    let calls = || observed::metric("tollgate_store_call_seconds", &[("store", &prefix)]);
    let before = calls();
    const WAITERS: usize = 40;
    let waiters: Vec<_> = (0..WAITERS)
        .map(|_| {
            let (limiter, ids) = (limiter.clone(), ids.clone());
            tokio::spawn(async move {
                let waited = limiter
                    .check_n_waiting(&ids, 5, Duration::from_secs(3))
                    .await;
                waited.unwrap().is_allowed()
            })
        })
        .collect();
    for waiter in waiters {
        assert!(waiter.await.unwrap(), "a waiter was not admitted");
    }
    // each try is a call per slot: two here
    let per_waiter = (calls() - before) / WAITERS as f64;
    eprintln!("{per_waiter} calls per waiter");
    assert!(per_waiter <= 16.0, "{per_waiter} calls per waiter");
}

/// A peek and a usage read of identifiers in two hash slots answer, and say what the memory
/// store says after the same checks: one call per slot, merged as one peek.
#[tokio::test]
async fn peeks_across_slots_answer_as_in_process() {
    let cluster = ClusterServer::shared();
    let store = store_on(cluster).await;
    let policy: tollgate::Policy = "3/min, 5/h".parse().unwrap();
    // no deny cache: every peek goes to the store
    let limiter = Limiter::builder(store, policy.clone())
        .on_store_error(OnStoreError::Closed)
        .deny_cache(0)
        .build();
    let memory = Limiter::new(tollgate::MemoryStore::new(), policy);
    let (ip, user) = ("ip:1.2.3.4", "user:42");
    assert_ne!(
        cluster.master_of(&format!("{{{ip}}}")),
        cluster.master_of(&format!("{{{user}}}"))
    );
    // the same checks on both: twice for both, then once more for the user alone, who then
    // has no quota left this minute
    for ids in [&[ip, user][..], &[ip, user], &[user]] {
        for l in [&limiter, &memory] {
            assert!(l.check(ids).await.unwrap().is_allowed());
        }
    }
    let figures = |d: &tollgate::Decision| {
        d.statuses()
            .iter()
            .map(|s| (s.identifier, s.limit_index, s.allowed, s.remaining))
            .collect::<Vec<_>>()
    };
    for cost in [1, 2] {
        let (on_redis, in_process) = (
            limiter.peek_n(&[ip, user], cost).await.unwrap(),
            memory.peek_n(&[ip, user], cost).await.unwrap(),
        );
        assert!(!on_redis.is_allowed(), "the user has nothing left");
        assert_eq!(figures(&on_redis), figures(&in_process), "cost {cost}");
        // the IP alone has one left this minute
        let peek = limiter.peek_n(&[ip], cost).await.unwrap();
        assert_eq!(peek.is_allowed(), cost == 1, "cost {cost}");
    }
    let usage = |u: Vec<tollgate::Usage>| {
        u.iter()
            .map(|u| (u.identifier, u.limit_index, u.used, u.remaining))
            .collect::<Vec<_>>()
    };
    let on_redis = usage(limiter.usage(&[ip, user]).await.unwrap());
    assert_eq!(on_redis, usage(memory.usage(&[ip, user]).await.unwrap()));
    assert_eq!(
        on_redis,
        [(0, 0, 2, 1), (0, 1, 2, 3), (1, 0, 3, 0), (1, 1, 3, 2)]
    );
    // a reset across the slots too (the client splits its `DEL`)
    limiter.reset(&[ip, user]).await.unwrap();
    let after = usage(limiter.usage(&[ip, user]).await.unwrap());
    assert_eq!(
        after,
        [(0, 0, 0, 3), (0, 1, 0, 5), (1, 0, 0, 3), (1, 1, 0, 5)]
    );
}

/// An ACL user with the store's commands and the cluster's own (`+ping +cluster|slots
/// +asking`, as the README's rule) on every node serves the store, checks across slots
/// included.
#[tokio::test]
async fn an_acl_user_with_the_documented_rule_works() {
    let cluster = ClusterServer::shared();
    let prefix = common::unique_prefix();
    let readme = include_str!("../README.md");
    let rule = readme
        .lines()
        .find(|l| l.trim_start().starts_with("ACL SETUSER"))
        .unwrap();
    let commands: Vec<&str> = rule
        .split_whitespace()
        .filter(|w| w.starts_with('+'))
        .chain(["+ping", "+cluster|slots", "+asking"])
        .collect();
    for node in &cluster.nodes {
        let mut conn = cluster.node_conn(node.port).unwrap();
        let mut setuser = redis::cmd("ACL");
        setuser
            .arg("SETUSER")
            .arg(format!("{prefix}-user"))
            .arg("reset")
            .arg("on")
            .arg(">pw")
            .arg(format!("~{prefix}:*"))
            .arg(&commands);
        let () = setuser.query(&mut conn).unwrap();
    }
    let nodes: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let url = format!("redis+cluster://{prefix}-user:pw@{}", nodes.join(","));
    let store = RedisStore::builder(url)
        .prefix(&prefix)
        .connect_timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let limiter = Limiter::new(store, "1/min, 2 concurrent".parse().unwrap());
    let d = limiter.check(&["ip:1.2.3.4", "user:42"]).await.unwrap();
    assert!(d.is_allowed());
    assert!(!limiter
        .check(&["ip:1.2.3.4", "user:7"])
        .await
        .unwrap()
        .is_allowed());
    // user:7's slot admitted that check and was given its charge back (the refund script
    // runs under the same rule)
    assert!(limiter.check(&["user:7"]).await.unwrap().is_allowed());
}

/// A master without the store's ACL user (ACLs are per node in a cluster, and one was
/// missed) refuses the store's login: the store does not connect without it, as if it were
/// down, but fails with an error that says what to fix.
#[tokio::test]
async fn a_master_without_the_acl_user_fails_the_connection() {
    let cluster = ClusterServer::shared();
    let prefix = common::unique_prefix();
    let masters = cluster.masters();
    let missed = masters[0];
    for node in cluster.nodes.iter().filter(|n| n.port != missed) {
        let mut conn = cluster.node_conn(node.port).unwrap();
        let () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg(format!("{prefix}-user"))
            .arg("on")
            .arg(">pw")
            .arg(format!("~{prefix}:*"))
            .arg("+@all")
            .query(&mut conn)
            .unwrap();
    }
    let nodes: Vec<String> = cluster
        .nodes
        .iter()
        .filter(|n| n.port != missed)
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let url = format!("redis+cluster://{prefix}-user:pw@{}", nodes.join(","));
    let built = RedisStore::builder(url)
        .prefix(&prefix)
        .connect_timeout(Duration::from_secs(3))
        .build()
        .await;
    match built {
        Err(StoreError::Misconfigured(m)) => {
            assert_eq!(m.kind(), MisconfigurationKind::Authentication, "{m}")
        }
        other => panic!("expected a refused login, got {other:?}"),
    }
}

/// `CLUSTER SETSLOT slot what node` on `conn`.
fn setslot(conn: &mut redis::Connection, slot: u16, what: &str, node: &str) {
    let () = redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg(what)
        .arg(node)
        .query(conn)
        .unwrap();
}

/// Begins moving the slot of `id` from the master on `source` to the one on `target`
/// (`IMPORTING` on the target, `MIGRATING` on the source): the slot, and the target's id.
fn begin_migration(cluster: &ClusterServer, id: &str, source: u16, target: u16) -> (u16, String) {
    let node_id = |port: u16| -> String {
        let mut conn = cluster.node_conn(port).unwrap();
        redis::cmd("CLUSTER").arg("MYID").query(&mut conn).unwrap()
    };
    let (source_id, target_id) = (node_id(source), node_id(target));
    let mut on_source = cluster.node_conn(source).unwrap();
    let mut on_target = cluster.node_conn(target).unwrap();
    let slot = cluster.slot_of(id);
    setslot(&mut on_target, slot, "IMPORTING", &source_id);
    setslot(&mut on_source, slot, "MIGRATING", &target_id);
    (slot, target_id)
}

/// Two checks of `id` (a `9/min` limit, with 8 and 7 left), while its slot migrates to the
/// master on `target`: made there, where its keys are.
async fn checked_on_the_target(limiter: &Limiter, cluster: &ClusterServer, id: &str, target: u16) {
    for expected in [8, 7] {
        let d = limiter.check(&[id]).await.unwrap();
        assert!(d.is_allowed());
        assert_eq!(d.statuses()[0].remaining, expected);
    }
    let mut on_target = cluster.node_conn(target).unwrap();
    let on_target_keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("*{{{id}}}*"))
        .query(&mut on_target)
        .unwrap();
    assert!(!on_target_keys.is_empty(), "the check ran on the target");
}

/// A slot migrated while checks run: while it is half-way, its fresh keys live on the target
/// and the source answers `ASK`; once moved, the client's slot map is stale and the source
/// answers `MOVED`. Both are followed (the check script loaded on the target when it answers
/// `NOSCRIPT`), and the count carries on across the move.
#[tokio::test]
async fn checks_follow_a_slot_migration() {
    let cluster = ClusterServer::shared();
    let store = store_on(cluster).await;
    // A policy of its own, so that no master has its script yet; window limits only, one key
    // per identifier (a script of several keys meets TRYAGAIN on the importing node while the
    // slot is half-way: Redis serves a multi-key command there only once all its keys moved).
    let limiter = Limiter::builder(store.clone(), "9/min, 30/s".parse().unwrap())
        .on_store_error(OnStoreError::Closed)
        .build();
    let id = "migrate:1";
    // warm the client's connections, with another policy (another script)
    let warm = Limiter::new(store, "1/s".parse().unwrap());
    assert!(warm.check(&["warm:1"]).await.unwrap().is_allowed());
    let source = cluster.master_of(&format!("{{{id}}}"));
    let target = cluster
        .masters()
        .into_iter()
        .find(|&p| p != source)
        .unwrap();
    let (slot, target_id) = begin_migration(cluster, id, source, target);
    checked_on_the_target(&limiter, cluster, id, target).await;
    // the migration ends: every master learns the slot's new owner
    for port in cluster.masters() {
        let mut conn = cluster.node_conn(port).unwrap();
        setslot(&mut conn, slot, "NODE", &target_id);
    }
    for expected in [6, 5] {
        let d = limiter.check(&[id]).await.unwrap();
        assert!(d.is_allowed());
        assert_eq!(d.statuses()[0].remaining, expected);
    }
    assert_eq!(cluster.master_of(&format!("{{{id}}}")), target);
}

/// A slot migrating to a master new to the cluster, which serves no slot yet (so the
/// client's slot map, and its connections, do not include it): the `ASK` is followed over a
/// connection of the store's own, and the check runs there.
#[tokio::test]
async fn checks_follow_a_migration_to_a_new_master() {
    let mut cluster = ClusterServer::start(3, 0);
    let store = store_on(&cluster).await;
    let limiter = Limiter::builder(store, "9/min".parse().unwrap())
        .on_store_error(OnStoreError::Closed)
        .build();
    let id = "migrate:2";
    // the client's connections made, before the new master joins
    assert!(limiter.check(&["warm:2"]).await.unwrap().is_allowed());
    let target = cluster.add_empty_master();
    let source = cluster.master_of(&format!("{{{id}}}"));
    begin_migration(&cluster, id, source, target);
    checked_on_the_target(&limiter, &cluster, id, target).await;
}

/// A check across slots whose caller gives up while one group's call is still out (a client
/// disconnecting, a deadline of its own) still gives back what the other group charged: the
/// calls and the refunds run in a task of their own, which the caller's going does not cut
/// short.
#[tokio::test]
async fn a_check_across_slots_given_up_on_still_gives_back_its_charge() {
    let cluster = ClusterServer::start(3, 0);
    let ids = one_id_per_master(&cluster, "given-up");
    let (admits, stalls) = (&ids[0], &ids[1]);
    let store = impatient_store(&cluster, "given-up", Duration::from_millis(500)).await;
    let limiter = Limiter::new(store, "1/min".parse().unwrap());
    let node = cluster.master_node_of(stalls);
    node.stall(true);
    let both = [admits, stalls];
    let gave_up = tokio::time::timeout(Duration::from_millis(100), limiter.check(&both)).await;
    // the stalled group times out (500 ms), and the one that admitted is given its charge back
    tokio::time::sleep(Duration::from_millis(900)).await;
    node.stall(false);
    assert!(
        gave_up.is_err(),
        "answered with a master stalled: {gave_up:?}"
    );
    let alone = limiter.check(&[admits]).await.unwrap();
    assert!(
        alone.is_allowed(),
        "the charge of the check given up on was kept"
    );
}

/// A check across slots that one slot denies while another's master is silent is denied, as
/// that slot says: the failure policy (open here) answers only checks that no answer settles,
/// and failing open would admit a request Redis just refused. The silent group's identifier
/// has no statuses. With a concurrency limit, the slot the silent master's script takes once
/// it runs, under the lease of the denied check, is given back.
#[tokio::test]
async fn a_denial_across_slots_stands_when_another_slot_fails() {
    let cluster = ClusterServer::start(3, 0);
    let ids = one_id_per_master(&cluster, "partly");
    let (silent, spent) = (&ids[0], &ids[1]);
    let store = impatient_store(&cluster, "partly", Duration::from_millis(300)).await;
    let rate = Limiter::builder(store.clone(), "1/min".parse().unwrap())
        .name("rate")
        .on_store_error(OnStoreError::Open)
        .build();
    assert!(rate.check(&[spent]).await.unwrap().is_allowed());
    // (the default lease, 15 s: longer than the test waits for the slot)
    let slots = Limiter::builder(store, "100/min, 1 concurrent".parse().unwrap())
        .name("slots")
        .on_store_error(OnStoreError::Open)
        .build();
    let held = slots.check(&[spent]).await.unwrap();
    assert!(held.is_allowed());
    // The silent master learns the script first (a check it did not know would be answered
    // `NOSCRIPT` once it woke, and run by no one), and the slot is given back.
    drop(slots.check(&[silent]).await.unwrap());
    tokio::time::sleep(Duration::from_millis(600)).await;
    let node = cluster.master_node_of(silent);
    node.stall(true);
    let by_rate = rate.check(&[silent, spent]).await;
    let by_slots = slots.check(&[silent, spent]).await;
    node.stall(false);
    for (decision, limit) in [(by_rate, "1/min"), (by_slots, "1 concurrent")] {
        let decision = decision.unwrap();
        assert!(!decision.is_allowed(), "{limit}: {decision:?}");
        assert_eq!(decision.origin(), Origin::Store, "{limit}");
        assert_eq!(
            decision
                .denied_by()
                .map(|s| (s.identifier, s.limit.to_string())),
            Some((1, limit.to_string())),
            "{decision:?}"
        );
        assert!(
            decision.statuses().iter().all(|s| s.identifier == 1),
            "the silent slot's figures are unknown: {decision:?}"
        );
        assert!(decision.retry_after().is_some());
    }
    // The silent master ran the slots check's script once it woke, taking a slot for the
    // denied check: it is given back well before its lease would run out.
    let started = Instant::now();
    loop {
        if slots.check(&[silent]).await.unwrap().is_allowed() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the slot taken by the denied check was kept"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(held);
}

/// A master that does not answer when the store connects (stalled, or down before its
/// failover) fails only its own slots, where the cluster serves the others meanwhile
/// (`cluster-require-full-coverage no`): the store connects without it, the other masters'
/// identifiers are checked as usual, and a warning names the master left out.
#[tokio::test]
async fn a_master_silent_at_connect_fails_only_its_slots() {
    observed::observed();
    let cluster = ClusterServer::start(3, 0);
    // the other masters go on serving their slots once the silent one is marked failed
    for port in cluster.masters() {
        let mut conn = cluster.node_conn(port).unwrap();
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("cluster-require-full-coverage")
            .arg("no")
            .query(&mut conn)
            .unwrap();
    }
    let ids = one_id_per_master(&cluster, "silent");
    let node = cluster.master_node_of(&ids[0]);
    let silent = node.port;
    node.stall(true);
    let store = RedisStore::builder(cluster.url())
        .prefix("silent")
        .timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_secs(3))
        .build()
        .await;
    let store = match store {
        Ok(store) => store,
        Err(e) => {
            node.stall(false);
            panic!("not connected without the silent master: {e:?}");
        }
    };
    let limiter = Limiter::builder(store, "10/min".parse().unwrap())
        .on_store_error(OnStoreError::Closed)
        .build();
    for id in &ids[1..] {
        let d = limiter.check(&[id]).await.unwrap();
        assert!(d.is_allowed(), "{id}");
    }
    assert!(limiter.check(&[&ids[0]]).await.is_err());
    node.stall(false);
    let warned = observed::log_text()
        .lines()
        .filter(|l| l.contains("without masters it could not reach"))
        .filter(|l| l.contains("store=\"silent\"") && l.contains(&format!("127.0.0.1:{silent}")))
        .count();
    assert_eq!(warned, 1, "{}", observed::log_text());
}

/// Leases of four identifiers in one hash slot, renewed while the slot migrates with two of
/// their slot sets moved and two not: either node answers a renewal of all four `TRYAGAIN`
/// (Redis runs a command of several keys only where all of them are), so they are renewed
/// one a call, each where its key is, and stay held past their lease.
#[tokio::test]
async fn leases_in_a_migrating_slot_are_renewed() {
    let cluster = ClusterServer::shared();
    let store = store_on(cluster).await;
    let limiter = Limiter::new(store, "1 concurrent lease=1s".parse().unwrap());
    // four identifiers in one slot: the first, and three found among many (1 in 16,384)
    let id = |i: usize| format!("renew-migrating:{i}");
    let slot = cluster.slot_of(&id(0));
    let source = cluster.master_of(&format!("{{{}}}", id(0)));
    let mut on_source = cluster.node_conn(source).unwrap();
    let mut pipe = redis::pipe();
    for i in 1..150_000 {
        pipe.cmd("CLUSTER").arg("KEYSLOT").arg(id(i));
    }
    let slots: Vec<u16> = pipe.query(&mut on_source).unwrap();
    let mut ids = vec![id(0)];
    ids.extend(
        (1..150_000)
            .zip(slots)
            .filter(|&(_, s)| s == slot)
            .map(|(i, _)| id(i))
            .take(3),
    );
    assert_eq!(ids.len(), 4, "identifiers of slot {slot}");
    let mut held = Vec::new();
    for id in &ids {
        let d = limiter.check(&[id]).await.unwrap();
        assert!(d.is_allowed(), "{id}");
        held.push(d);
    }
    let target = cluster
        .masters()
        .into_iter()
        .find(|&p| p != source)
        .unwrap();
    let (slot, target_id) = begin_migration(cluster, &ids[0], source, target);
    // the slot sets of the first two identifiers move to the target; the others stay
    let keys: Vec<String> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(1000)
        .query(&mut on_source)
        .unwrap();
    let of = |ids: &[String]| -> Vec<String> {
        let tags: Vec<String> = ids.iter().map(|id| format!("{{{id}}}")).collect();
        keys.iter()
            .filter(|k| tags.iter().any(|t| k.contains(t.as_str())))
            .cloned()
            .collect()
    };
    let migrate = |conn: &mut redis::Connection, keys: Vec<String>| {
        assert!(!keys.is_empty());
        let mut cmd = redis::cmd("MIGRATE");
        cmd.arg("127.0.0.1").arg(target).arg("").arg(0).arg(5000);
        cmd.arg("KEYS").arg(keys);
        let () = cmd.query(conn).unwrap();
    };
    migrate(&mut on_source, of(&ids[..2]));
    // more than twice the lease: only renewals keep the slots taken
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for id in &ids {
        let d = limiter.check(&[id]).await.unwrap();
        assert!(!d.is_allowed(), "{id}'s lease expired during the migration");
    }
    // the migration ends: the other slot sets move, and every master learns the new owner
    migrate(&mut on_source, of(&ids[2..]));
    for port in cluster.masters() {
        let mut conn = cluster.node_conn(port).unwrap();
        setslot(&mut conn, slot, "NODE", &target_id);
    }
    drop(held);
}

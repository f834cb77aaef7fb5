//! The Redis store behind Sentinel, with real processes: three sentinels (quorum 2), a master
//! and a replica, all with passwords; the master is failed over twice (`SENTINEL FAILOVER`,
//! then killed) and checks follow it through the sentinels each time.

mod common;
#[path = "common/observed.rs"]
mod observed;

use std::time::{Duration, Instant};

use common::{eventually, unique_prefix, RedisServer, SentinelServer};
use tollgate::store::MisconfigurationKind;
use tollgate::{Limiter, RedisStore, StoreError};

const MASTER_PASSWORD: &str = "m#ster/pw";
const SENTINEL_PASSWORD: &str = "sentinel-pw";
const SERVICE: &str = "mymaster";

fn data_server(replica_of: Option<u16>) -> RedisServer {
    let mut args = vec![
        "--requirepass",
        MASTER_PASSWORD,
        "--masterauth",
        MASTER_PASSWORD,
    ];
    let port;
    if let Some(p) = replica_of {
        port = p.to_string();
        args.extend(["--replicaof", "127.0.0.1", &port]);
    }
    RedisServer::start_with(&args)
}

fn sentinel(master_port: u16) -> SentinelServer {
    SentinelServer::start(&format!(
        "requirepass {SENTINEL_PASSWORD}\n\
         sentinel sentinel-pass {SENTINEL_PASSWORD}\n\
         sentinel monitor {SERVICE} 127.0.0.1 {master_port} 2\n\
         sentinel auth-pass {SERVICE} {MASTER_PASSWORD}\n\
         sentinel down-after-milliseconds {SERVICE} 1000\n\
         sentinel failover-timeout {SERVICE} 4000\n\
         sentinel parallel-syncs {SERVICE} 1"
    ))
}

fn sentinel_conn(s: &SentinelServer) -> redis::Connection {
    let url = format!("redis://:{SENTINEL_PASSWORD}@127.0.0.1:{}/", s.port);
    redis::Client::open(url).unwrap().get_connection().unwrap()
}

/// The master's port as `sentinel` sees it.
fn master_port(sentinel: &SentinelServer) -> u16 {
    let (_, port): (String, String) = redis::cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(SERVICE)
        .query(&mut sentinel_conn(sentinel))
        .unwrap();
    port.parse().unwrap()
}

/// Waits until `check` holds, for at most `within`.
fn wait_until(within: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// How many `EVALSHA` calls `server` has run for clients.
fn evalsha_calls(server: &RedisServer) -> u64 {
    info(server, "commandstats")
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A section of `INFO`, or empty text while the server drops connections (when it turns
/// replica).
fn info(server: &RedisServer, section: &str) -> String {
    redis::Client::open(server.admin_url())
        .and_then(|c| c.get_connection())
        .and_then(|mut c| redis::cmd("INFO").arg(section).query(&mut c))
        .unwrap_or_default()
}

async fn allowed(l: &Limiter, id: &str) -> Result<(), String> {
    match l.check(&[id]).await {
        Ok(d) if d.is_allowed() => Ok(()),
        Ok(_) => Err("denied".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// Checks run on `server` (it ran `EVALSHA` for them).
async fn checks_run_on(l: &Limiter, server: &RedisServer) -> Result<(), String> {
    let before = evalsha_calls(server);
    allowed(l, "a").await?;
    match evalsha_calls(server) > before {
        true => Ok(()),
        false => Err(format!("the check did not run on port {}", server.port)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failovers_are_followed() {
    let t0 = Instant::now();
    let master = data_server(None);
    let mut servers = vec![
        data_server(Some(master.port)),
        data_server(Some(master.port)),
        master,
    ];
    let sentinels: Vec<SentinelServer> = (0..3).map(|_| sentinel(servers[2].port)).collect();
    // every sentinel knows both replicas and the other sentinels before the failover
    for s in &sentinels {
        wait_until(Duration::from_secs(20), "the sentinels to meet", || {
            let mut c = sentinel_conn(s);
            let replicas: Vec<redis::Value> = redis::cmd("SENTINEL")
                .arg("REPLICAS")
                .arg(SERVICE)
                .query(&mut c)
                .unwrap();
            let others: Vec<redis::Value> = redis::cmd("SENTINEL")
                .arg("SENTINELS")
                .arg(SERVICE)
                .query(&mut c)
                .unwrap();
            replicas.len() == 2 && others.len() == 2
        });
    }
    eprintln!("{:?}: the sentinels met", t0.elapsed());

    let hosts: Vec<String> = sentinels
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port))
        .collect();
    let store = store_through(&hosts.join(",")).await;
    let debug = format!("{store:?}");
    assert!(!debug.contains(MASTER_PASSWORD) && !debug.contains(SENTINEL_PASSWORD));
    let l = closed(store, "100000/min".parse().unwrap());
    checks_run_on(&l, &servers[2]).await.unwrap();

    // 1. A forced failover. The old master stays up and writable until the sentinels next
    // poll it (up to 10 s): the store asks the sentinels every second and moves.
    let _: () = redis::cmd("SENTINEL")
        .arg("FAILOVER")
        .arg(SERVICE)
        .query(&mut sentinel_conn(&sentinels[0]))
        .unwrap();
    let mut promoted = 0;
    wait_until(Duration::from_secs(20), "the failover", || {
        let port = master_port(&sentinels[0]);
        promoted = servers.iter().position(|s| s.port == port).unwrap();
        promoted != 2
    });
    eprintln!("{:?}: failed over", t0.elapsed());
    let (_, took) = eventually(Duration::from_secs(10), || {
        checks_run_on(&l, &servers[promoted])
    })
    .await;
    eprintln!("checks through the new master {took:?} after the failover");
    for _ in 0..5 {
        checks_run_on(&l, &servers[promoted]).await.unwrap();
    }

    // 2. The new master dies: the sentinels agree that it is down and promote the other
    // replica (which they pointed at it during the failover); the store's connection drops
    // and it asks the sentinels again.
    let other = 1 - promoted;
    let promoted_port = servers[promoted].port;
    wait_until(
        Duration::from_secs(20),
        "the other replica to follow",
        || {
            let text = info(&servers[other], "replication");
            text.contains(&format!("master_port:{promoted_port}"))
                && text.contains("master_link_status:up")
        },
    );
    eprintln!("{:?}: the other replica follows", t0.elapsed());
    drop(servers.remove(promoted));
    let servers = &servers;
    let sentinel = &sentinels[0];
    let l = &l;
    let (port, took) = eventually(Duration::from_secs(30), || async move {
        let port = master_port(sentinel);
        let master = servers
            .iter()
            .find(|s| s.port == port)
            .ok_or("the sentinels still name the dead master")?;
        checks_run_on(l, master).await.map(|()| port)
    })
    .await;
    eprintln!("checks through the promoted replica ({port}) {took:?} after the master died");
}

#[tokio::test]
async fn sentinel_misconfigurations_are_refused() {
    let master = data_server(None);
    let s = sentinel(master.port);
    let plain = RedisServer::start();
    let url = |hosts: String, service: &str| {
        format!("redis+sentinel://:{MASTER_PASSWORD}@{hosts}/{service}")
    };
    let kind = |e: StoreError| match e {
        StoreError::Misconfigured(m) => m.kind(),
        other => panic!("expected a misconfiguration, got {other:?}"),
    };
    let sentinel_host = format!("127.0.0.1:{}", s.port);

    let err = RedisStore::builder(url(sentinel_host.clone(), "nosuch"))
        .sentinel_password(SENTINEL_PASSWORD)
        .build()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("\"nosuch\""), "{err}");
    assert_eq!(kind(err), MisconfigurationKind::UnknownService);

    let err = RedisStore::connect(url(sentinel_host.clone(), SERVICE))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("sentinel_password"), "{err}");
    assert_eq!(kind(err), MisconfigurationKind::Authentication);

    let err = RedisStore::connect(url(format!("127.0.0.1:{}", plain.port), SERVICE))
        .await
        .unwrap_err();
    assert_eq!(kind(err), MisconfigurationKind::NotSentinel);

    let err = RedisStore::builder(format!("redis+sentinel://{sentinel_host}/{SERVICE}"))
        .sentinel_password(SENTINEL_PASSWORD)
        .build()
        .await
        .unwrap_err();
    assert_eq!(kind(err), MisconfigurationKind::Authentication);

    let store = RedisStore::builder(url(sentinel_host, SERVICE))
        .sentinel_password(SENTINEL_PASSWORD)
        .build()
        .await
        .unwrap();
    let l = closed(store, "10/s".parse().unwrap());
    assert!(l.check(&["a"]).await.unwrap().is_allowed());
}

/// A store of the service through the sentinels at `hosts` (`host:port,…`), with both
/// passwords, a prefix of its own and a 500 ms timeout.
async fn store_through(hosts: &str) -> RedisStore {
    RedisStore::builder(format!(
        "redis+sentinel://:{MASTER_PASSWORD}@{hosts}/{SERVICE}"
    ))
    .sentinel_password(SENTINEL_PASSWORD)
    .prefix(unique_prefix())
    .timeout(Duration::from_millis(500))
    .build()
    .await
    .unwrap()
}

/// A limiter that fails closed, so that a store failure shows as the error it is rather
/// than as an allowed decision.
fn closed(store: impl Into<tollgate::Store>, policy: tollgate::Policy) -> Limiter {
    Limiter::builder(store, policy)
        .on_store_error(tollgate::OnStoreError::Closed)
        .build()
}

/// With its sentinels out of reach, a connected store keeps its master (its checks go on),
/// and says that it cannot ask them whether the master moved: a failover would go unseen.
#[tokio::test]
async fn sentinels_out_of_reach_are_logged() {
    observed::observed();
    let master = data_server(None);
    let watcher = sentinel(master.port);
    let store = store_through(&format!("127.0.0.1:{}", watcher.port)).await;
    let l = closed(store, "100000/min".parse().unwrap());
    checks_run_on(&l, &master).await.unwrap();
    drop(watcher);
    let warned = || {
        observed::log_text()
            .lines()
            .filter(|l| l.contains("could not ask the sentinels whether the master moved"))
            .filter(|l| l.contains(&format!("service=\"{SERVICE}\"")))
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while warned() == 0 {
        assert!(
            Instant::now() < deadline,
            "no word of the sentinels' silence"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    checks_run_on(&l, &master).await.unwrap();
}

/// Sentinels lost while another answers are logged, whether the lookup asked them first
/// (and moved on to the next: logged at once) or never asks them (the one before them
/// answers: every so often the store asks them too, and logs those that fail, all in one
/// line).
#[tokio::test]
async fn sentinels_lost_while_another_answers_are_logged() {
    observed::observed();
    let master = data_server(None);
    let watcher = sentinel(master.port);
    // ports 1 and 2: where nothing listens, so a connection is refused at once
    let lost = ["127.0.0.1:1", "127.0.0.1:2"];
    let warned = |names: &[&str]| {
        observed::log_text()
            .lines()
            .filter(|l| l.contains("failed while another answered"))
            .filter(|l| names.iter().all(|name| l.contains(&format!("{name} ("))))
            .count()
    };
    let live = format!("127.0.0.1:{}", watcher.port);
    // asked first: logged as the store connects
    let store = store_through(&format!("{},{live}", lost[0])).await;
    assert_eq!(warned(&lost[..1]), 1, "{}", observed::log_text());
    let l = closed(store, "100000/min".parse().unwrap());
    checks_run_on(&l, &master).await.unwrap();
    // never asked by a lookup: logged by the sweep, both in one line
    let store = store_through(&format!("{live},{},{}", lost[0], lost[1])).await;
    let l = closed(store, "100000/min".parse().unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    while warned(&lost) == 0 {
        assert!(Instant::now() < deadline, "no word of {lost:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    checks_run_on(&l, &master).await.unwrap();
}

//! The store over TLS, on servers of the test's own that speak it beside their plain port: a
//! server of its own (`rediss://`), a Redis Cluster (`rediss+cluster://`: every node, found
//! through the slot map, over TLS) and a service behind Sentinel (`rediss+sentinel://`: the
//! sentinels and the master over TLS). The store is given the TLS ports alone, where a client
//! that does not speak TLS gets no answer, so a check answered is a check made over TLS.

mod common;

use std::time::Duration;

use common::{ClusterServer, RedisServer, SentinelServer, Tls};
use tollgate::{Limiter, RedisStore};

/// A store on `url` under a prefix of its own.
async fn store(url: &str) -> RedisStore {
    RedisStore::builder(url)
        .prefix(common::unique_prefix())
        .timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"))
}

/// Checks `ids` together under `2/min` three times: admitted twice, then denied; and a
/// concurrency slot taken and given back.
async fn limits_over(store: RedisStore, ids: &[String]) {
    let limiter = Limiter::new(store.clone(), "2/min".parse().unwrap());
    for expected in [true, true, false] {
        let d = limiter.check(ids).await.unwrap();
        assert_eq!(d.is_allowed(), expected, "{d:?}");
    }
    let slots = Limiter::builder(store, "1 concurrent".parse().unwrap())
        .namespace("slots".parse().unwrap())
        .build();
    let held = slots.check(ids).await.unwrap();
    assert!(held.is_allowed());
    assert!(!slots.check(ids).await.unwrap().is_allowed());
    drop(held);
    common::eventually(Duration::from_secs(5), || async {
        match slots.check(ids).await {
            Ok(d) if d.is_allowed() => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

/// A server that speaks TLS too: it, and its TLS port.
fn tls_server() -> (RedisServer, u16) {
    let port = common::free_port();
    let args = Tls::get().server_args(port);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    (RedisServer::start_with(&args), port)
}

#[tokio::test]
async fn a_server_of_its_own_over_tls() {
    let (_server, port) = tls_server();
    let store = store(&format!("rediss://127.0.0.1:{port}/")).await;
    limits_over(store, &["ip:203.0.113.7".to_string()]).await;
}

#[tokio::test]
async fn a_cluster_over_tls() {
    Tls::get();
    let cluster = ClusterServer::start_tls(3);
    let store = store(&cluster.tls_url()).await;
    // identifiers of every master, checked together: one call per slot, each over TLS to a
    // node the slot map named
    let mut ids: Vec<String> = Vec::new();
    let mut masters = Vec::new();
    for i in 0.. {
        let id = format!("user:{i}");
        let master = cluster.master_of(&format!("{{{id}}}"));
        if !masters.contains(&master) {
            masters.push(master);
            ids.push(id);
        }
        if masters.len() == 3 {
            break;
        }
    }
    limits_over(store, &ids).await;
}

#[tokio::test]
async fn a_service_behind_sentinel_over_tls() {
    let (_master, master_port) = tls_server();
    let sentinel_port = common::free_port();
    // (the sentinel watches the master over TLS, so it names the master's TLS port)
    let _sentinel = SentinelServer::start(&format!(
        "{}tls-replication yes\nsentinel monitor tls-service 127.0.0.1 {master_port} 1\n",
        Tls::get().config_lines(sentinel_port)
    ));
    let url = format!("rediss+sentinel://127.0.0.1:{sentinel_port}/tls-service");
    limits_over(store(&url).await, &["ip:203.0.113.8".to_string()]).await;
}

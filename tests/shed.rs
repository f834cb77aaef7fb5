//! The fleet-usage load shedder across two servers sharing Redis.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use common::{unique_prefix, RedisServer};
use http::StatusCode;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tollgate::shed::{FleetShedder, Priority};
use tollgate::RedisStore;

async fn server(store: RedisStore) -> SocketAddr {
    let shed = FleetShedder::new(store, 10)
        .reserve_for_critical(0.2)
        .classify(|req| match req.headers.get("x-priority") {
            Some(v) if v == "critical" => Priority::Critical,
            _ => Priority::Normal,
        })
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(400)).await;
                "done"
            }),
        )
        .layer(shed);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn critical_traffic_always_passes_while_the_rest_is_shed() {
    let redis = RedisServer::start();
    let prefix = unique_prefix();
    let mut addrs = Vec::new();
    for _ in 0..2 {
        let store = RedisStore::builder(redis.url())
            .prefix(prefix.clone())
            // a loaded test machine must not make the store fail open
            .timeout(Duration::from_secs(5))
            .build()
            .await
            .unwrap();
        addrs.push(server(store).await);
    }
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut calls = Vec::new();
    for i in 0..60 {
        let critical = i % 3 == 0;
        let addr = addrs[i % 2];
        let client = client.clone();
        calls.push(tokio::spawn(async move {
            let mut req = http::Request::get(format!("http://{addr}/slow"));
            if critical {
                req = req.header("x-priority", "critical");
            }
            let res = client
                .request(req.body(Empty::new()).unwrap())
                .await
                .unwrap();
            let retry = res.headers().get("retry-after").cloned();
            (critical, res.status(), retry)
        }));
    }
    let (mut critical_ok, mut other_ok, mut shed) = (0, 0, 0);
    for c in calls {
        match c.await.unwrap() {
            (true, StatusCode::OK, _) => critical_ok += 1,
            (true, status, _) => panic!("critical request answered {status}"),
            (false, StatusCode::OK, _) => other_ok += 1,
            (false, StatusCode::SERVICE_UNAVAILABLE, retry) => {
                assert_eq!(retry.unwrap(), "1");
                shed += 1;
            }
            (false, status, _) => panic!("unexpected {status}"),
        }
    }
    assert_eq!(critical_ok, 20, "critical traffic: 100% success");
    // 40 non-critical requests at once against a share of 8 slots (10 minus 20%) for the
    // whole fleet of two servers
    assert!(
        (1..=8).contains(&other_ok),
        "{other_ok} non-critical admitted"
    );
    assert_eq!(other_ok + shed, 40);
}

//! The fleet-usage load shedder across two servers sharing Redis.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use common::{unique_prefix, RedisServer};
use http::StatusCode;
use http_body_util::Empty;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::watch;
use tollgate::shed::{FleetShedder, Priority};
use tollgate::RedisStore;

/// Holds non-critical requests in their handler until the test lets them go, so that their
/// slots stay taken for as long as the test needs, whatever the machine's speed.
#[derive(Clone)]
struct Gate {
    /// Non-critical requests that reached the handler (were admitted).
    entered: Arc<AtomicUsize>,
    open: watch::Receiver<bool>,
}

async fn server(store: RedisStore, gate: Gate) -> SocketAddr {
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
            get(move |headers: http::HeaderMap| {
                let mut gate = gate.clone();
                async move {
                    if headers.get("x-priority").is_none() {
                        gate.entered.fetch_add(1, Ordering::SeqCst);
                        let _ = gate.open.wait_for(|open| *open).await;
                    }
                    "done"
                }
            }),
        )
        .layer(shed);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// Sends a request to `/slow` at `addr`; its status and `Retry-After`.
async fn call(
    client: &Client<HttpConnector, Empty<Bytes>>,
    addr: SocketAddr,
    critical: bool,
) -> (StatusCode, Option<http::HeaderValue>) {
    let mut req = http::Request::get(format!("http://{addr}/slow"));
    if critical {
        req = req.header("x-priority", "critical");
    }
    let res = client
        .request(req.body(Empty::new()).unwrap())
        .await
        .unwrap();
    (res.status(), res.headers().get("retry-after").cloned())
}

/// Two servers share 8 slots for non-critical traffic (10 minus 20%): of 40 non-critical
/// requests at once, 8 are admitted and the rest shed; with those 8 still in their handlers,
/// every critical request goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn critical_traffic_always_passes_while_the_rest_is_shed() {
    let redis = RedisServer::start();
    let prefix = unique_prefix();
    let (let_go, open) = watch::channel(false);
    let gate = Gate {
        entered: Arc::default(),
        open,
    };
    let mut addrs = Vec::new();
    for _ in 0..2 {
        let store = RedisStore::builder(redis.url())
            .prefix(prefix.clone())
            // a loaded test machine must not make the store fail open
            .timeout(Duration::from_secs(5))
            .build()
            .await
            .unwrap();
        addrs.push(server(store, gate.clone()).await);
    }
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let shed = Arc::new(AtomicUsize::new(0));
    let mut others = Vec::new();
    for i in 0..40 {
        let (client, addr, shed) = (client.clone(), addrs[i % 2], shed.clone());
        others.push(tokio::spawn(async move {
            let (status, retry) = call(&client, addr, false).await;
            if status == StatusCode::SERVICE_UNAVAILABLE {
                assert_eq!(retry.unwrap(), "1");
                shed.fetch_add(1, Ordering::SeqCst);
            }
            status
        }));
    }
    // every non-critical request decided: in its handler, or shed
    let decided = || gate.entered.load(Ordering::SeqCst) + shed.load(Ordering::SeqCst);
    common::eventually(Duration::from_secs(20), || async {
        match decided() {
            40 => Ok(()),
            n => Err(format!("{n} of 40 decided")),
        }
    })
    .await;
    assert_eq!(gate.entered.load(Ordering::SeqCst), 8, "the fleet's share");
    // the share full, critical traffic goes through all the same: 100% success
    let critical: Vec<_> = (0..20)
        .map(|i| {
            let (client, addr) = (client.clone(), addrs[i % 2]);
            tokio::spawn(async move { call(&client, addr, true).await.0 })
        })
        .collect();
    for c in critical {
        assert_eq!(c.await.unwrap(), StatusCode::OK, "a critical request");
    }
    let_go.send(true).unwrap();
    let mut ok = 0;
    for o in others {
        match o.await.unwrap() {
            StatusCode::OK => ok += 1,
            StatusCode::SERVICE_UNAVAILABLE => {}
            status => panic!("unexpected {status}"),
        }
    }
    assert_eq!((ok, shed.load(Ordering::SeqCst)), (8, 32));
}

/// The fleet's budget is kept apart from the limits of other limiters on its store: a
/// limiter keyed on what clients send, asked for `shed:fleet` (the budget's identifier),
/// takes slots of its own, not the fleet's.
#[tokio::test]
async fn the_fleets_budget_is_not_shared_with_other_limiters() {
    use tower::ServiceExt;
    let store = tollgate::MemoryStore::new();
    let shed = FleetShedder::new(store.clone(), 1)
        .reserve_for_critical(0.0)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "done" }))
        .layer(shed);
    let other = tollgate::Limiter::new(store, "1 concurrent".parse().unwrap());
    let held = other.check(&["shed:fleet"]).await.unwrap();
    assert!(held.is_allowed());
    let req = http::Request::get("/")
        .body(axum::body::Body::empty())
        .unwrap();
    let res = app.oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK, "the fleet's one slot is free");
    drop(held);
}

/// A fleet shedder's refusal says the service is overloaded and nothing of the fleet's
/// capacity, in text, in problem details and in gRPC's message: it does not name its limit
/// (`1 concurrent`, the share) as a rate limit's refusal does, which would tell every client
/// the capacity and blame its own concurrency.
#[tokio::test]
async fn a_fleet_refusal_names_no_limit() {
    use tower::ServiceExt;
    let (release, released) = watch::channel(false);
    let (entered_tx, mut entered) = tokio::sync::mpsc::channel::<()>(1);
    let app = |layer: tollgate::RateLimitLayer| {
        let (released, entered_tx) = (released.clone(), entered_tx.clone());
        Router::new()
            .route(
                "/",
                axum::routing::any(move || {
                    let (mut released, entered_tx) = (released.clone(), entered_tx.clone());
                    async move {
                        let _ = entered_tx.send(()).await;
                        let _ = released.wait_for(|r| *r).await;
                        "done"
                    }
                }),
            )
            .layer(layer)
    };
    let fleet = || {
        FleetShedder::new(tollgate::MemoryStore::new(), 1)
            .reserve_for_critical(0.0)
            .build()
            .unwrap()
    };
    let request = |grpc: bool| {
        let mut req = http::Request::post("/");
        if grpc {
            req = req.header("content-type", "application/grpc");
        }
        req.body(axum::body::Body::empty()).unwrap()
    };
    for (problem, grpc) in [(false, false), (true, false), (false, true)] {
        let app = app(fleet().problem_details(problem));
        // one request holds the one slot...
        let held = tokio::spawn(app.clone().oneshot(request(false)));
        entered.recv().await.unwrap();
        // ...and the next is shed
        let res = app.oneshot(request(grpc)).await.unwrap();
        let headers = res.headers().clone();
        let body = axum::body::to_bytes(res.into_body(), 1 << 16)
            .await
            .unwrap();
        let body = String::from_utf8_lossy(&body).into_owned();
        let told = match grpc {
            true => {
                assert_eq!(headers["grpc-status"], "14", "UNAVAILABLE");
                headers["grpc-message"].to_str().unwrap().to_string()
            }
            false => body,
        };
        assert!(told.contains("overloaded"), "{told}");
        for secret in ["concurrent", "1", "violated"] {
            assert!(!told.contains(secret), "{secret:?} told: {told}");
        }
        if problem {
            assert!(told.contains("temporary-reduced-capacity"), "{told}");
        }
        release.send(true).unwrap();
        assert_eq!(held.await.unwrap().unwrap().status(), StatusCode::OK);
        release.send(false).unwrap();
    }
}

/// While its store cannot answer, a fleet shedder sheds as its failure policy says: by default
/// nothing, with a fallback each process at its share of the budget, closed every request
/// that is not critical.
#[tokio::test]
async fn a_fleet_shedder_without_its_store_sheds_as_its_failure_policy_says() {
    use tollgate::OnStoreError;
    use tower::ServiceExt;
    let dead = RedisStore::builder(common::dead_url())
        .timeout(Duration::from_millis(200))
        .build_lazy()
        .unwrap();
    let policies = [
        (OnStoreError::Open, 6),
        (OnStoreError::fallback(0.5).unwrap(), 2),
        (OnStoreError::Closed, 0),
    ];
    for (on_error, admitted) in policies {
        let shed = FleetShedder::new(dead.clone(), 4)
            .reserve_for_critical(0.0)
            .on_store_error(on_error)
            .build()
            .unwrap();
        let app = Router::new()
            .route("/", axum::routing::post(|| async { "ok" }))
            .layer(shed);
        // (a response kept unread keeps its slot)
        let mut held = Vec::new();
        for _ in 0..6 {
            let req = http::Request::post("/")
                .body(axum::body::Body::empty())
                .unwrap();
            held.push(app.clone().oneshot(req).await.unwrap());
        }
        let statuses: Vec<StatusCode> = held.iter().map(|r| r.status()).collect();
        let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
        assert_eq!(ok, admitted, "{on_error:?}: {statuses:?}");
        // every other request is shed, and told so, whoever refused it
        for res in held.drain(admitted..) {
            assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
            let body = http_body_util::BodyExt::collect(res.into_body()).await;
            let body = body.unwrap().to_bytes();
            assert!(
                String::from_utf8_lossy(&body).contains("overloaded"),
                "{on_error:?}: {body:?}"
            );
        }
    }
}

//! Concurrency limits through Redis: several instances on separate connections and
//! processes, leases that outlive a killed process, and 10,000 HTTP requests that end every
//! way a request can end, leaving no slot behind.

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use common::{unique_prefix, RedisServer};
use http::StatusCode;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use redis::Commands;
use tollgate::key::Header;
use tollgate::{Limiter, RateLimitLayer, RedisStore};

async fn store(server: &RedisServer, prefix: &str) -> RedisStore {
    RedisStore::builder(server.url())
        .prefix(prefix)
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap()
}

/// The number of live slots in every concurrency key under `prefix`.
fn slots_in_redis(server: &RedisServer, prefix: &str) -> usize {
    let mut conn = server.conn();
    let keys: Vec<String> = conn.keys(format!("{prefix}:*:c*")).unwrap();
    keys.iter()
        .map(|k| conn.zcard::<_, usize>(k).unwrap())
        .sum()
}

async fn wait_for_no_slots(server: &RedisServer, prefix: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n = slots_in_redis(server, prefix);
        if n == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "{n} slots leaked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn never_more_than_n_in_flight_across_connections() {
    let server = RedisServer::start();
    let prefix = unique_prefix();
    let in_flight = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let admitted = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let limiter = Limiter::new(
            store(&server, &prefix).await,
            "5 concurrent".parse().unwrap(),
        );
        for t in 0..10u64 {
            let (limiter, in_flight, most, admitted) = (
                limiter.clone(),
                in_flight.clone(),
                most.clone(),
                admitted.clone(),
            );
            tasks.push(tokio::spawn(async move {
                for i in 0..30u64 {
                    let d = limiter.check(&["shared"]).await.unwrap();
                    if d.is_allowed() {
                        let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        admitted.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(1 + (t + i) % 3)).await;
                        in_flight.fetch_sub(1, Ordering::SeqCst);
                    }
                    drop(d);
                    tokio::task::yield_now().await;
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 5, "{most} in flight");
    assert!(admitted.load(Ordering::SeqCst) >= 5);
    wait_for_no_slots(&server, &prefix).await;
}

/// A request that outlives its lease keeps its slot: the lease is renewed while the guard
/// lives.
#[tokio::test]
async fn long_requests_keep_their_slot() {
    let server = RedisServer::start();
    let prefix = unique_prefix();
    let limiter = Limiter::new(
        store(&server, &prefix).await,
        "1 concurrent lease=2s".parse().unwrap(),
    );
    let held = limiter.check(&["k"]).await.unwrap();
    assert!(held.is_allowed());
    // three lease times: only renewals keep it
    tokio::time::sleep(Duration::from_millis(6000)).await;
    assert!(
        !limiter.check(&["k"]).await.unwrap().is_allowed(),
        "slot lost while held"
    );
    drop(held);
    wait_for_no_slots(&server, &prefix).await;
    assert!(limiter.check(&["k"]).await.unwrap().is_allowed());
}

/// The child half of `a_killed_process_gets_its_slots_back`: takes two slots, says so, and
/// waits to be killed. Run only by that test.
#[test]
#[ignore = "run as a child process by a_killed_process_gets_its_slots_back"]
fn child_holds_slots_until_killed() {
    let Ok(url) = std::env::var("TOLLGATE_CHILD_REDIS") else {
        return;
    };
    let prefix = std::env::var("TOLLGATE_CHILD_PREFIX").unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = RedisStore::builder(url)
            .prefix(prefix)
            .timeout(Duration::from_secs(5))
            .build()
            .await
            .unwrap();
        let limiter = Limiter::new(store, "2 concurrent lease=1s".parse().unwrap());
        let a = limiter.check(&["k"]).await.unwrap();
        let b = limiter.check(&["k"]).await.unwrap();
        assert!(a.is_allowed() && b.is_allowed());
        println!("HOLDING");
        tokio::time::sleep(Duration::from_secs(60)).await;
        drop((a, b));
    });
}

#[tokio::test]
async fn a_killed_process_gets_its_slots_back() {
    use std::io::{BufRead, BufReader};
    let server = RedisServer::start();
    let prefix = unique_prefix();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "child_holds_slots_until_killed",
            "--nocapture",
        ])
        .env("TOLLGATE_CHILD_REDIS", server.url())
        .env("TOLLGATE_CHILD_PREFIX", &prefix)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    assert!(
        lines.any(|l| l.is_ok_and(|l| l.contains("HOLDING"))),
        "child never held"
    );

    let limiter = Limiter::new(
        store(&server, &prefix).await,
        "2 concurrent lease=1s".parse().unwrap(),
    );
    // While the child lives, it renews its slots past the lease.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!limiter.check(&["k"]).await.unwrap().is_allowed());
    child.kill().unwrap(); // SIGKILL: no release, no more renewals
    child.wait().unwrap();
    let killed = Instant::now();
    let deadline = killed + Duration::from_secs(20);
    loop {
        let d = limiter.check(&["k"]).await.unwrap();
        if d.is_allowed() {
            break;
        }
        assert!(Instant::now() < deadline, "slots never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // back after the 1 s lease (with room for a loaded machine), not after a minute
    let took = killed.elapsed();
    assert!(took <= Duration::from_secs(5), "back after {took:?}");
}

/// 10,000 requests through a real server: plain, streamed to the end, streamed and abandoned,
/// abandoned before the answer, and handlers that panic. None leaks a slot, and no more than
/// the limit were ever in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_requests_leave_no_slot_behind() {
    // Panicking handlers are part of the test; keep their messages out of the output.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if info.payload().downcast_ref::<&str>() != Some(&"handler failed") {
            default_hook(info);
        }
    }));
    let server = RedisServer::start();
    let prefix = unique_prefix();
    let limiter = Limiter::new(
        store(&server, &prefix).await,
        "8 concurrent".parse().unwrap(),
    );
    let in_flight = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));

    // Counts a request as in flight from the handler until its body is gone.
    struct Counted(Arc<AtomicUsize>);
    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }
    let enter = {
        let (in_flight, most) = (in_flight.clone(), most.clone());
        move || {
            let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            Counted(in_flight.clone())
        }
    };
    let (e1, e2, e3) = (enter.clone(), enter.clone(), enter.clone());
    let app = Router::new()
        .route(
            "/",
            get(move || {
                let c = e1();
                async move {
                    drop(c);
                    "ok"
                }
            }),
        )
        .route(
            "/stream",
            get(move || {
                let c = e2();
                async move {
                    let chunks = futures::stream::unfold((0, c), |(i, c)| async move {
                        if i == 4 {
                            drop(c);
                            return None;
                        }
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        Some((
                            Ok::<_, Infallible>(Bytes::from_static(b"chunk ")),
                            (i + 1, c),
                        ))
                    });
                    Body::from_stream(chunks)
                }
            }),
        )
        .route(
            "/slow",
            get(move || {
                let c = e3();
                async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    drop(c);
                    "late"
                }
            }),
        )
        .route(
            "/panic",
            get(|| async {
                if true {
                    panic!("handler failed");
                }
                "unreachable"
            }),
        )
        .layer(RateLimitLayer::new(limiter).key(Header::named("x-tenant").unwrap()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let counts: Arc<[AtomicUsize; 3]> = Arc::new(Default::default()); // ok, limited, other
    const CLIENTS: u32 = 12;
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|t| {
            let (client, counts) = (client.clone(), counts.clone());
            tokio::spawn(async move {
                // requests t, t + CLIENTS, t + 2 * CLIENTS, … below 10,000
                for n in (t..10_000).step_by(CLIENTS as usize) {
                    let path = match n % 10 {
                        0..=4 => "/",
                        5 | 6 => "/stream",
                        7 => "/stream?abandon",
                        8 => "/slow",
                        _ => "/panic",
                    };
                    let req = http::Request::get(format!("http://{addr}{path}"))
                        .header("x-tenant", "t")
                        .body(Empty::new())
                        .unwrap();
                    let call = client.request(req);
                    let res = if path == "/slow" && n % 20 == 8 {
                        // the client gives up before the answer
                        let _ = tokio::time::timeout(Duration::from_millis(5), call).await;
                        counts[2].fetch_add(1, Ordering::Relaxed);
                        continue;
                    } else {
                        call.await
                    };
                    let Ok(res) = res else {
                        counts[2].fetch_add(1, Ordering::Relaxed);
                        continue;
                    };
                    let status = res.status();
                    let slot = if status == StatusCode::TOO_MANY_REQUESTS {
                        1
                    } else {
                        0
                    };
                    counts[slot].fetch_add(1, Ordering::Relaxed);
                    let mut body = res.into_body();
                    if path.ends_with("abandon") {
                        // read one chunk, then hang up
                        let _ = body.frame().await;
                        drop(body);
                    } else {
                        let _ = body.collect().await;
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let [ok, limited, other] = [0, 1, 2].map(|i| counts[i].load(Ordering::Relaxed));
    assert_eq!(ok + limited + other, 10_000);
    assert!(
        ok > 2000,
        "{ok} admitted, {limited} limited, {other} failed"
    );
    assert!(limited > 0, "the limit never bit");
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 8, "{most} requests in flight at once");
    wait_for_no_slots(&server, &prefix).await;
}

/// A check whose answer is lost (a timeout) after the script ran gives its slot back: Redis is
/// paused, the client times out, the queued script then runs and takes the slot; the release
/// that follows on the same connection frees it.
#[tokio::test]
async fn a_timed_out_check_does_not_keep_its_slot() {
    let server = RedisServer::start();
    let prefix = unique_prefix();
    let store = RedisStore::builder(server.url())
        .prefix(prefix.clone())
        .timeout(Duration::from_millis(200))
        .build()
        .await
        .unwrap();
    // closed, so that the lost answer shows as the error it is
    let limiter = Limiter::builder(store, "1 concurrent".parse().unwrap())
        .on_store_error(tollgate::OnStoreError::Closed)
        .build();
    // load the script first, so that the paused call is the EVALSHA itself
    drop(limiter.check(&["warm-up"]).await.unwrap());
    let mut admin = server.conn();
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(700)
        .arg("WRITE")
        .query(&mut admin)
        .unwrap();
    let err = limiter.check(&["k"]).await.unwrap_err();
    assert!(matches!(err, tollgate::Error::Store(_)), "{err}");
    // the script runs once the pause ends; the release queued behind it undoes it
    tokio::time::sleep(Duration::from_millis(900)).await;
    wait_for_no_slots(&server, &prefix).await;
    assert!(limiter.check(&["k"]).await.unwrap().is_allowed());
}

/// The number of keys of every `EVALSHA` the server logged (its slow log, set to log every
/// command), of more than one key: the renewals of a test whose checks are of one key.
fn renewal_calls(server: &RedisServer) -> Vec<u64> {
    let entries: Vec<redis::Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(100_000)
        .query(&mut server.conn())
        .unwrap();
    let text = |v: &redis::Value| match v {
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        _ => String::new(),
    };
    entries
        .iter()
        .filter_map(|entry| match entry {
            // id, time, duration, the command and its arguments, ...
            redis::Value::Array(fields) => match fields.get(3) {
                Some(redis::Value::Array(args)) => Some(args.clone()),
                _ => None,
            },
            _ => None,
        })
        .filter(|args| {
            args.first()
                .is_some_and(|c| text(c).eq_ignore_ascii_case("evalsha"))
        })
        .filter_map(|args| text(args.get(2)?).parse::<u64>().ok())
        .filter(|&keys| keys > 1)
        .collect()
}

/// A process holding many slots renews them in calls of a few hundred at most, so that no
/// renewal holds Redis (which runs a script with nothing beside it) for long: 600 slots
/// taken at once are renewed by calls of at most 256 slots, every one of them kept.
#[tokio::test]
async fn many_slots_are_renewed_in_short_calls() {
    let server = RedisServer::start();
    let prefix = unique_prefix();
    let limiter = Limiter::new(
        store(&server, &prefix).await,
        "600 concurrent lease=3s".parse().unwrap(),
    );
    // taken at once (the calls pipelined), so that they come due for renewal together: one
    // call for all of them unless the store cuts it
    let held = futures::future::join_all((0..600).map(|_| limiter.check(&["streams"]))).await;
    assert!(held.iter().all(|d| d.as_ref().unwrap().is_allowed()));
    let mut conn = server.conn();
    for (name, value) in [
        ("slowlog-log-slower-than", "0"),
        ("slowlog-max-len", "100000"),
    ] {
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query(&mut conn)
            .unwrap();
    }
    let () = redis::cmd("SLOWLOG").arg("RESET").query(&mut conn).unwrap();
    // past the lease: only renewals keep the slots
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let calls = renewal_calls(&server);
    assert!(calls.iter().sum::<u64>() >= 600, "renewals: {calls:?}");
    assert!(calls.iter().all(|&keys| keys <= 256), "renewals: {calls:?}");
    assert!(!limiter.check(&["streams"]).await.unwrap().is_allowed());
    drop(held);
    wait_for_no_slots(&server, &prefix).await;
}

/// Opens a WebSocket at `addr` by hand (the HTTP/1.1 handshake on a TCP stream): the stream,
/// open while it is kept, and the status line of the answer.
async fn open_socket(addr: SocketAddr) -> (tokio::net::TcpStream, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let handshake = format!(
        "GET /ws HTTP/1.1\r\nHost: {addr}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    );
    stream.write_all(handshake.as_bytes()).await.unwrap();
    // the answer's head (a 101's ends the HTTP part; a refusal's body follows it)
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        if stream.read(&mut byte).await.unwrap() == 0 {
            break;
        }
        head.push(byte[0]);
    }
    let status = String::from_utf8_lossy(&head)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    (stream, status)
}

/// A WebSocket opened at `addr` once the server admits one (within 5 s).
async fn open_socket_eventually(addr: SocketAddr) -> tokio::net::TcpStream {
    common::eventually(Duration::from_secs(5), || async {
        match open_socket(addr).await {
            (stream, status) if status.contains(" 101 ") => Ok(stream),
            (_, status) => Err(status),
        }
    })
    .await
    .0
}

/// A server of WebSockets at `/ws` behind a layer of `policy` on one global key, whose handler
/// takes its request's slots (`UpgradeSlots`, extracted as the docs show it: a request
/// holding no slot has none) and keeps them with the socket; `slots`: whether the requests
/// hold slots (asserted in the handler).
async fn socket_server(policy: &str, slots: bool) -> SocketAddr {
    socket_server_of(&[policy], slots).await
}

/// [`socket_server`] behind a layer for each of `policies`, the first innermost, each on a
/// store of its own.
async fn socket_server_of(policies: &[&str], slots: bool) -> SocketAddr {
    use axum::extract::ws::WebSocketUpgrade;
    use axum::Extension;
    use tollgate::layer::UpgradeSlots;
    let mut app = Router::new().route(
        "/ws",
        get(
            move |ws: WebSocketUpgrade, offered: Option<Extension<UpgradeSlots>>| async move {
                let held = offered.and_then(|Extension(offered)| offered.take());
                assert_eq!(held.is_some(), slots, "the request's slot is offered");
                ws.on_upgrade(move |mut socket| async move {
                    let _held = held;
                    while let Some(Ok(_)) = socket.recv().await {}
                })
            },
        ),
    );
    for policy in policies {
        let limiter = Limiter::new(tollgate::MemoryStore::new(), policy.parse().unwrap());
        app = app.layer(RateLimitLayer::new(limiter).key(tollgate::key::Global));
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// A WebSocket's handler written as the docs show it serves a request that holds no slot
/// (a policy without a concurrency limit), rather than failing to find the slots offered.
#[tokio::test]
async fn an_upgrade_holding_no_slot_is_served() {
    let addr = socket_server("10/s", false).await;
    let (_socket, status) = open_socket(addr).await;
    assert_eq!(status, "HTTP/1.1 101 Switching Protocols");
}

/// A WebSocket's handler that takes its request's slot (`UpgradeSlots`) and keeps it with the
/// socket holds it until the socket closes: with `1 concurrent`, a second socket is refused
/// while the first is open, and admitted once it closed. Left to the response, the slot
/// would go back as the `101` is sent.
#[tokio::test]
async fn an_upgraded_connection_keeps_the_slot_its_handler_took() {
    let addr = socket_server("1 concurrent", true).await;

    let (first, status) = open_socket(addr).await;
    assert_eq!(status, "HTTP/1.1 101 Switching Protocols");
    let (_, status) = open_socket(addr).await;
    assert_eq!(
        status, "HTTP/1.1 429 Too Many Requests",
        "one socket at a time"
    );
    drop(first);
    // the slots back once the first socket closed
    let _third = open_socket_eventually(addr).await;
}

/// Two layers with concurrency limits on one upgrading route: the handler takes the slots of
/// both, and the socket holds them. (The inner layer's offer once replaced the outer's, whose
/// slot then went back as the `101` was sent: any number of sockets passed the outer limit.)
#[tokio::test]
async fn an_upgraded_connection_keeps_the_slots_of_stacked_layers() {
    // inner: 5 at a time; outer: 1
    let addr = socket_server_of(&["5 concurrent", "1 concurrent"], true).await;
    let (first, status) = open_socket(addr).await;
    assert_eq!(status, "HTTP/1.1 101 Switching Protocols");
    let (_, status) = open_socket(addr).await;
    assert_eq!(
        status, "HTTP/1.1 429 Too Many Requests",
        "the outer layer's one socket at a time"
    );
    drop(first);
    // the slots back once the first socket closed
    let _third = open_socket_eventually(addr).await;
}

/// The slots offered to an upgrading request's handler go back when the response future is
/// dropped first (the client gone), though the handler kept a handle on them without taking
/// them.
#[tokio::test]
async fn offered_slots_go_back_with_a_dropped_response_future() {
    use std::sync::Mutex;
    use tollgate::layer::UpgradeSlots;
    use tower::{Layer, ServiceExt};
    let limiter = Limiter::new(
        tollgate::MemoryStore::new(),
        "1 concurrent".parse().unwrap(),
    );
    let kept: Arc<Mutex<Vec<UpgradeSlots>>> = Arc::default();
    let handler = {
        let kept = kept.clone();
        tower::service_fn(move |req: http::Request<Body>| {
            let kept = kept.clone();
            async move {
                let slots = req.extensions().get::<UpgradeSlots>().cloned();
                kept.lock().unwrap().extend(slots);
                std::future::pending::<()>().await;
                Ok::<_, Infallible>(http::Response::new(Body::empty()))
            }
        })
    };
    let svc = RateLimitLayer::new(limiter.clone())
        .key(tollgate::key::Global)
        .layer(handler);
    let upgrade = http::Request::get("/ws")
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .body(Body::empty())
        .unwrap();
    let call = tokio::spawn(svc.oneshot(upgrade));
    common::eventually(Duration::from_secs(5), || async {
        match kept.lock().unwrap().len() {
            1 => Ok(()),
            n => Err(format!("{n} handles kept")),
        }
    })
    .await;
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    let next = limiter.check(&["global"]).await.unwrap();
    assert!(next.is_allowed(), "the dropped request's slot went back");
}

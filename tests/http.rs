//! The HTTP layer in a real axum server over TCP, with a real HTTP client.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use common::{manual_clock, RedisServer};
use http::{HeaderMap, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tollgate::key::{ClientIp, Header, IpCidr, PeerIp};
use tollgate::layer::{HeaderStyle, MissingKey};
use tollgate::{
    Clock, Limiter, ManualClock, MemoryStore, OnStoreError, RateLimitLayer, RedisStore, Store,
};

/// Serves `app` on a free loopback port (with the peer address available to extractors).
async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

async fn get_with(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    send(http::Method::GET, addr, path, headers).await
}

async fn send(
    method: http::Method,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> Reply {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut req = http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let res = client
        .request(req.body(Empty::new()).unwrap())
        .await
        .unwrap();
    let status = res.status();
    let headers = res.headers().clone();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

async fn get_path(addr: SocketAddr, path: &str) -> Reply {
    get_with(addr, path, &[]).await
}

fn app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/login", get(|| async { "welcome" }))
        .route("/health", get(|| async { "healthy" }))
        .layer(layer)
}

fn memory(clock: &ManualClock) -> Store {
    MemoryStore::builder()
        .clock(Clock::Manual(clock.clone()))
        .build()
        .into()
}

/// A structured-field list header: per item, its string and the two named integer
/// parameters.
fn sf_items(headers: &HeaderMap, name: &str, params: [&str; 2]) -> Vec<(String, i64, i64)> {
    let raw = headers
        .get(name)
        .unwrap_or_else(|| panic!("{name} header"))
        .as_bytes();
    let list = sfv::Parser::new(raw)
        .parse::<sfv::List>()
        .unwrap_or_else(|e| panic!("{name} does not parse as a structured-field list: {e}"));
    list.iter()
        .map(|member| {
            let sfv::ListEntry::Item(item) = member else {
                panic!("inner list in {name}")
            };
            let label = item
                .bare_item
                .as_string()
                .expect("a string item")
                .as_str()
                .to_string();
            let int = |k: &str| {
                item.params
                    .iter()
                    .find(|(key, _)| key.as_str() == k)
                    .and_then(|(_, v)| v.as_integer())
                    .map(i64::from)
                    .unwrap_or_else(|| panic!("{name}: parameter {k} missing"))
            };
            (label, int(params[0]), int(params[1]))
        })
        .collect()
}

/// The `RateLimit` field: (name, r, t) per item.
fn ratelimit_items(headers: &HeaderMap) -> Vec<(String, i64, i64)> {
    sf_items(headers, "ratelimit", ["r", "t"])
}

/// The `RateLimit-Policy` field: (name, q, w) per item.
fn policy_items(headers: &HeaderMap) -> Vec<(String, i64, i64)> {
    sf_items(headers, "ratelimit-policy", ["q", "w"])
}

#[tokio::test]
async fn limited_requests_get_429_and_every_response_carries_the_headers() {
    let clock = manual_clock();
    let limiter = Limiter::new(memory(&clock), "3/s log, 5/min".parse().unwrap());
    let addr = serve(app(RateLimitLayer::new(limiter))).await;
    for n in 0..3 {
        let r = get_path(addr, "/").await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body, "ok");
        assert_eq!(
            policy_items(&r.headers),
            [("3/s log".to_string(), 3, 1), ("5/min".to_string(), 5, 60)]
        );
        let items = ratelimit_items(&r.headers);
        assert_eq!(items[0], ("3/s log".to_string(), 2 - n, 1));
        assert_eq!(items[1].1, 4 - n);
        assert!(r.headers.get("retry-after").is_none());
    }
    let r = get_path(addr, "/").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers["retry-after"], "1");
    assert_eq!(r.headers["content-type"], "text/plain; charset=utf-8");
    assert!(r.body.contains("3/s log"), "{}", r.body);
    assert_eq!(ratelimit_items(&r.headers)[0].1, 0);
    policy_items(&r.headers);
}

/// `Retry-After` is whole seconds, rounded up: never early.
#[tokio::test]
async fn retry_after_rounds_up() {
    let clock = manual_clock();
    let limiter = Limiter::new(memory(&clock), "1/2500ms log".parse().unwrap());
    let addr = serve(app(RateLimitLayer::new(limiter))).await;
    assert_eq!(get_path(addr, "/").await.status, StatusCode::OK);
    for (advance_ms, expected) in [(0, "3"), (500, "2"), (1, "2"), (999, "1"), (999, "1")] {
        clock.advance(Duration::from_millis(advance_ms));
        let r = get_path(addr, "/").await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers["retry-after"], expected, "after +{advance_ms} ms");
    }
    clock.advance(Duration::from_millis(1));
    assert_eq!(get_path(addr, "/").await.status, StatusCode::OK);
}

/// An API key and a user together: admitted only if both are under the limit, and a
/// rejected request charges neither.
#[tokio::test]
async fn two_identifiers_are_all_or_nothing_over_http() {
    let clock = manual_clock();
    let limiter = Limiter::new(memory(&clock), "2/min log".parse().unwrap());
    let layer = RateLimitLayer::new(limiter)
        .key(Header::named("x-api-key").unwrap())
        .key(Header::named("x-user").unwrap());
    let addr = serve(app(layer)).await;
    let k1u1 = [("x-api-key", "k1"), ("x-user", "u1")];
    assert_eq!(get_with(addr, "/", &k1u1).await.status, StatusCode::OK);
    assert_eq!(get_with(addr, "/", &k1u1).await.status, StatusCode::OK);
    let r = get_with(addr, "/", &[("x-api-key", "k1"), ("x-user", "u2")]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "k1 is exhausted");
    // u2 was not charged by that rejection: with a fresh key it has both requests left
    let r = get_with(addr, "/", &[("x-api-key", "k2"), ("x-user", "u2")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(ratelimit_items(&r.headers)[0].1, 1);
    let r = get_with(addr, "/", &[("x-api-key", "k3"), ("x-user", "u2")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(ratelimit_items(&r.headers)[0].1, 0);
}

#[tokio::test]
async fn routes_have_their_own_policies_and_health_checks_bypass() {
    let clock = manual_clock();
    let store = memory(&clock);
    let strict = Limiter::new(store.clone(), "1/min".parse().unwrap());
    let layer = RateLimitLayer::new(Limiter::new(store, "100/min".parse().unwrap()))
        .key(Header::named("x-api-key").unwrap())
        .bypass(|req| req.uri.path() == "/health")
        .route_replacing(|req| req.uri.path() == "/login", strict);
    let addr = serve(app(layer)).await;
    let key = [("x-api-key", "k")];
    assert_eq!(get_with(addr, "/login", &key).await.status, StatusCode::OK);
    let r = get_with(addr, "/login", &key).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(policy_items(&r.headers)[0].0, "1/min");
    let r = get_with(addr, "/", &key).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(policy_items(&r.headers)[0].0, "100/min");
    for _ in 0..5 {
        let r = get_path(addr, "/health").await;
        assert_eq!(r.status, StatusCode::OK);
        assert!(r.headers.get("ratelimit").is_none());
    }
}

#[tokio::test]
async fn a_missing_key_is_rejected_or_allowed_as_configured() {
    let clock = manual_clock();
    let limiter = Limiter::new(memory(&clock), "1/min".parse().unwrap());
    let strict = RateLimitLayer::new(limiter.clone()).key(Header::named("x-api-key").unwrap());
    let addr = serve(app(strict)).await;
    let r = get_path(addr, "/").await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(r.body.contains("no rate-limit key"), "{}", r.body);

    let lenient = RateLimitLayer::new(limiter)
        .key(Header::named("x-api-key").unwrap())
        .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED));
    let addr = serve(app(lenient.clone())).await;
    assert_eq!(get_path(addr, "/").await.status, StatusCode::UNAUTHORIZED);
    // a layer answering in problem details answers this in them too
    let addr = serve(app(lenient.clone().problem_details(true))).await;
    let r = get_path(addr, "/").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(r.headers["content-type"], "application/problem+json");
    assert_eq!(
        r.body,
        "{\"type\":\"about:blank\",\"title\":\"Unauthorized\",\"status\":401,\
         \"detail\":\"no rate-limit key found in the request\"}\n"
    );
    let addr = serve(app(lenient.on_missing_key(MissingKey::Allow))).await;
    for _ in 0..3 {
        assert_eq!(get_path(addr, "/").await.status, StatusCode::OK);
    }
}

#[tokio::test]
async fn a_custom_rejection_and_the_legacy_headers() {
    let clock = manual_clock();
    let limiter = Limiter::new(memory(&clock), "1/min sliding".parse().unwrap());
    let layer = RateLimitLayer::new(limiter)
        .key(Header::named("x-api-key").unwrap())
        .headers(HeaderStyle::Both)
        .on_limited(|_req, decision| {
            let body = format!(
                "{{\"error\":\"slow down\",\"retry_ms\":{}}}",
                decision.retry_after().unwrap().as_millis()
            );
            http::Response::builder()
                .status(StatusCode::SERVICE_UNAVAILABLE)
                .header("content-type", "application/json")
                .body(Bytes::from(body))
                .unwrap()
        });
    let addr = serve(app(layer)).await;
    let key = [("x-api-key", "k")];
    let r = get_with(addr, "/", &key).await;
    assert_eq!(r.headers["x-ratelimit-limit"], "1");
    assert_eq!(r.headers["x-ratelimit-remaining"], "0");
    assert_eq!(r.headers["x-ratelimit-reset"], "120");
    let r = get_with(addr, "/", &key).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.headers["content-type"], "application/json");
    assert!(r.body.contains("\"retry_ms\":"), "{}", r.body);
    assert!(r.headers.contains_key("retry-after"));
    assert!(r.headers.contains_key("ratelimit"));
    assert_eq!(r.headers["x-ratelimit-remaining"], "0");
}

/// Header values that are not UTF-8, and 10 KB keys, are keys like any other.
#[tokio::test]
async fn odd_header_values_are_keys_too() {
    let clock = manual_clock();
    let limiter = Limiter::new(memory(&clock), "1/min".parse().unwrap());
    let layer = RateLimitLayer::new(limiter).key(Header::named("x-api-key").unwrap());
    let addr = serve(app(layer)).await;
    let big = "k".repeat(10 * 1024);
    for value in ["caf\u{e9}", &big, "plain"] {
        assert_eq!(
            get_with(addr, "/", &[("x-api-key", value)]).await.status,
            StatusCode::OK
        );
        assert_eq!(
            get_with(addr, "/", &[("x-api-key", value)]).await.status,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
}

/// The peer address keys requests by default; a forged `X-Forwarded-For` from an untrusted
/// peer changes nothing, while one from a trusted proxy does.
#[tokio::test]
async fn forwarded_headers_are_believed_only_from_trusted_proxies() {
    let clock = manual_clock();
    let store = memory(&clock);
    // The test client connects from 127.0.0.1.
    let untrusted = RateLimitLayer::new(Limiter::new(store.clone(), "2/min".parse().unwrap())).key(
        ClientIp::trusted_proxies(["10.0.0.0/8".parse::<IpCidr>().unwrap()]),
    );
    let addr = serve(app(untrusted)).await;
    for forged in ["1.1.1.1", "2.2.2.2", "3.3.3.3"] {
        let _ = get_with(addr, "/", &[("x-forwarded-for", forged)]).await;
    }
    // three requests, three different forged addresses: still one client, limited
    let r = get_with(addr, "/", &[("x-forwarded-for", "4.4.4.4")]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);

    let trusted = RateLimitLayer::new(Limiter::new(store.clone(), "2/min".parse().unwrap())).key(
        ClientIp::trusted_proxies(["127.0.0.0/8".parse::<IpCidr>().unwrap()]),
    );
    let addr = serve(app(trusted)).await;
    for client in ["203.0.113.1", "203.0.113.2", "203.0.113.3"] {
        let r = get_with(addr, "/", &[("x-forwarded-for", client)]).await;
        assert_eq!(r.status, StatusCode::OK, "{client} is its own client");
    }
    // a client prepending a fake address behind the trusted proxy is still itself
    for _ in 0..2 {
        let _ = get_with(addr, "/", &[("x-forwarded-for", "9.9.9.9, 203.0.113.1")]).await;
    }
    let r = get_with(addr, "/", &[("x-forwarded-for", "8.8.8.8, 203.0.113.1")]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);

    // (a namespace of its own: in the store's shared space its 1/min would count with the
    // first layer's 2/min, which keyed 127.0.0.1 too)
    let peer = RateLimitLayer::new(
        Limiter::builder(store, "1/min".parse().unwrap())
            .namespace("peer".parse().unwrap())
            .build(),
    )
    .key(PeerIp::default());
    let addr = serve(app(peer)).await;
    assert_eq!(get_path(addr, "/").await.status, StatusCode::OK);
    let r = get_with(addr, "/", &[("x-forwarded-for", "5.5.5.5")]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
}

/// With Redis, the same layer; and with Redis gone, the failure policy decides.
#[tokio::test]
async fn redis_backed_layer_and_its_failure_policy() {
    let server = RedisServer::start();
    let store = server.store(Clock::Real).await;
    let limiter = Limiter::new(store, "2/min".parse().unwrap());
    let key = [("x-api-key", "k")];
    let addr = serve(app(
        RateLimitLayer::new(limiter).key(Header::named("x-api-key").unwrap())
    ))
    .await;
    assert_eq!(get_with(addr, "/", &key).await.status, StatusCode::OK);
    assert_eq!(get_with(addr, "/", &key).await.status, StatusCode::OK);
    assert_eq!(
        get_with(addr, "/", &key).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );

    let dead = RedisStore::builder(common::dead_url())
        .timeout(Duration::from_millis(200))
        .build_lazy()
        .unwrap();
    let limiter = Limiter::new(dead.clone(), "2/min".parse().unwrap());
    let open = RateLimitLayer::new(limiter).key(Header::named("x-api-key").unwrap());
    let addr = serve(app(open)).await;
    let r = get_with(addr, "/", &key).await;
    assert_eq!(r.status, StatusCode::OK, "fails open by default");
    assert!(r.headers.get("ratelimit").is_none());
    let closed = Limiter::builder(dead, "2/min".parse().unwrap())
        .on_store_error(OnStoreError::Closed)
        .build();
    let closed = RateLimitLayer::new(closed).key(Header::named("x-api-key").unwrap());
    let addr = serve(app(closed.clone())).await;
    let r = get_with(addr, "/", &key).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.headers["retry-after"], "1");
    // The store's error (addresses, timeouts) stays out of the response.
    assert_eq!(r.body, "rate limiting unavailable\n");
    // in problem details, when the layer answers in them
    let addr = serve(app(closed.clone().problem_details(true))).await;
    let r = get_with(addr, "/", &key).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.headers["retry-after"], "1");
    assert_eq!(r.headers["content-type"], "application/problem+json");
    assert_eq!(
        r.body,
        "{\"type\":\"about:blank\",\"title\":\"Service Unavailable\",\"status\":503,\
         \"detail\":\"rate limiting unavailable\"}\n"
    );
    // and so is a request the layer could not check: a cost no policy admits
    let addr = serve(app(closed.cost(|_| 5).problem_details(true))).await;
    let r = get_with(addr, "/", &key).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.headers["content-type"], "application/problem+json");
    assert!(
        r.body
            .starts_with("{\"type\":\"about:blank\",\"title\":\"Bad Request\",\"status\":400,"),
        "{}",
        r.body
    );
}

/// In the decision of a route that adds a limiter, the layer's own limiter's statuses are
/// numbered on from the route limiter's limits, also when the route's limiter listed none (its
/// store down, the check failing open).
#[tokio::test]
async fn limit_indices_of_an_added_route_count_on_from_its_limits() {
    let dead = RedisStore::builder(common::dead_url())
        .timeout(Duration::from_millis(200))
        .build_lazy()
        .unwrap();
    let route = Limiter::builder(dead, "5/min, 50/h".parse().unwrap())
        .namespace("route".parse().unwrap())
        .build();
    let clock = manual_clock();
    let default = Limiter::new(memory(&clock), "1/min".parse().unwrap());
    let layer = RateLimitLayer::new(default)
        .key(Header::named("x-api-key").unwrap())
        .route_adding(|_req: &tollgate::key::RequestView<'_>| true, route)
        .on_limited(|_req, decision| {
            let indices: Vec<String> = decision
                .statuses()
                .iter()
                .map(|s| format!("{}={}", s.limit_index, s.limit))
                .collect();
            http::Response::builder()
                .status(StatusCode::TOO_MANY_REQUESTS)
                .body(Bytes::from(indices.join(",")))
                .unwrap()
        });
    let addr = serve(app(layer)).await;
    let key = [("x-api-key", "k")];
    assert_eq!(get_with(addr, "/", &key).await.status, StatusCode::OK);
    let r = get_with(addr, "/", &key).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.body, "2=1/min");
}

/// A service that cannot fail stays one that cannot fail: rejections are responses, so the
/// layered service's error type is still `Infallible`, as axum requires of every route.
#[tokio::test]
async fn infallible_services_stay_infallible() {
    use std::convert::Infallible;
    use tower::{service_fn, Service, ServiceBuilder, ServiceExt};

    fn assert_infallible<S: Service<http::Request<()>, Error = Infallible>>(_: &S) {}

    let limiter = Limiter::new(MemoryStore::new(), "1/min".parse().unwrap());
    let svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(limiter).key(Header::named("x-api-key").unwrap()))
        .service(service_fn(|_req: http::Request<()>| async {
            Ok::<_, Infallible>(http::Response::new(String::from("ok")))
        }));
    assert_infallible(&svc);
    let req = || {
        http::Request::get("/")
            .header("x-api-key", "k")
            .body(())
            .unwrap()
    };
    let Ok(first) = svc.clone().oneshot(req()).await;
    assert_eq!(first.status(), StatusCode::OK);
    let Ok(second) = svc.oneshot(req()).await;
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// tower-http's CORS and timeout layers wrap the rate limit in one stack, in the order a
/// browser needs: a preflight answered before the limit (not charged), a refusal carrying
/// the CORS fields (else the page reads a network error, not the 429), and the rate-limit
/// fields exposed to scripts. (Both layers build responses of their own, so the limit's
/// body type must have a default.)
#[tokio::test]
async fn cors_and_timeout_layers_wrap_the_limit() {
    use http::header::{HeaderName, RETRY_AFTER};
    use tower_http::cors::{Any, CorsLayer};
    use tower_http::timeout::TimeoutLayer;

    let limiter = Limiter::new(MemoryStore::new(), "1/min".parse().unwrap());
    let cors = CorsLayer::new()
        .allow_origin(Any)
        .allow_methods([http::Method::GET])
        .expose_headers([
            HeaderName::from_static("ratelimit"),
            HeaderName::from_static("ratelimit-policy"),
            RETRY_AFTER,
        ]);
    let stack = tower::ServiceBuilder::new()
        .layer(cors)
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            Duration::from_secs(30),
        ))
        .layer(RateLimitLayer::new(limiter).key(PeerIp::new()));
    let addr = serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(stack),
    )
    .await;
    let origin = ("origin", "https://app.example");
    for _ in 0..3 {
        let preflight = send(
            http::Method::OPTIONS,
            addr,
            "/",
            &[origin, ("access-control-request-method", "GET")],
        )
        .await;
        assert_eq!(preflight.status, StatusCode::OK);
        assert!(preflight
            .headers
            .contains_key("access-control-allow-origin"));
    }
    // the one request a minute is the page's own, the preflights took none of it
    let first = get_with(addr, "/", &[origin]).await;
    assert_eq!(first.status, StatusCode::OK);
    let exposed = first.headers["access-control-expose-headers"]
        .to_str()
        .unwrap()
        .to_ascii_lowercase();
    assert!(exposed.contains("ratelimit"), "{exposed}");
    assert!(first.headers.contains_key("ratelimit"));
    let second = get_with(addr, "/", &[origin]).await;
    assert_eq!(second.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(second.headers.contains_key("access-control-allow-origin"));
    assert!(second.headers.contains_key("retry-after"));
}

/// A layer set to hand its decisions over puts a copy of each admitted request's decision in
/// the request's extensions, for the handler: decided at once (the memory store) and after
/// a wait (Redis, here failing open); a request the layer does not check carries none, and a
/// layer not set to carries none either.
#[tokio::test]
async fn handlers_read_the_decision_when_the_layer_hands_it_over() {
    use axum::Extension;
    use tollgate::{Decision, Origin};
    let told = |decision: Option<Extension<Decision>>| async move {
        match decision {
            None => "none".to_string(),
            Some(Extension(d)) => {
                let left = d.limits().map(|s| s.remaining).min();
                format!("{:?} {left:?} {}", d.origin(), d.guard().is_some())
            }
        }
    };
    let app = |layer: RateLimitLayer| {
        Router::new()
            .route("/", get(told))
            .route("/health", get(told))
            .layer(layer.bypass(|req: &tollgate::key::RequestView<'_>| req.uri.path() == "/health"))
    };
    let key = [("x-api-key", "k")];
    let clock = manual_clock();
    let memory = Limiter::new(memory(&clock), "10/min, 100/h".parse().unwrap());
    let layer = RateLimitLayer::new(memory).key(Header::named("x-api-key").unwrap());
    let addr = serve(app(layer.clone().decision_in_extensions(true))).await;
    assert_eq!(get_with(addr, "/", &key).await.body, "Store Some(9) false");
    assert_eq!(get_with(addr, "/", &key).await.body, "Store Some(8) false");
    assert_eq!(get_with(addr, "/health", &key).await.body, "none");
    let addr = serve(app(layer)).await;
    assert_eq!(get_with(addr, "/", &key).await.body, "none");

    let dead = RedisStore::builder(common::dead_url())
        .timeout(Duration::from_millis(200))
        .build_lazy()
        .unwrap();
    let failing = Limiter::new(dead, "10/min".parse().unwrap());
    let layer = RateLimitLayer::new(failing)
        .key(Header::named("x-api-key").unwrap())
        .decision_in_extensions(true);
    let addr = serve(app(layer)).await;
    let r = get_with(addr, "/", &key).await;
    assert_eq!(r.body, format!("{:?} None false", Origin::FailOpen));
}

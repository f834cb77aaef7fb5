//! The rate-limit headers against draft-ietf-httpapi-ratelimit-headers-11: every field of
//! every response parsed with `sfv`, for every algorithm, a sub-second window, a concurrency
//! limit, two stacked layers and a route that adds its limits to the default ones.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use common::manual_clock;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use sfv::{BareItem, List, ListEntry, Parser};
use tollgate::key::{Header, RequestView};
use tollgate::layer::HeaderStyle;
use tollgate::{Clock, Limit, Limiter, ManualClock, MemoryStore, Policy, RateLimitLayer, Store};
use tower::ServiceExt;

fn memory(clock: &ManualClock) -> Store {
    MemoryStore::builder()
        .clock(Clock::Manual(clock.clone()))
        .build()
        .into()
}

fn limiter(store: &Store, policy: &str) -> Limiter {
    Limiter::new(store.clone(), policy.parse().unwrap())
}

fn keyed(limiter: Limiter) -> RateLimitLayer {
    RateLimitLayer::new(limiter).key(Header::named("x-key").unwrap())
}

fn app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/login", get(|| async { "welcome" }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                "late"
            }),
        )
        .layer(layer)
}

/// [`app`], but `/slow` held until the test lets it go: requests that hold their slots for as
/// long as the test needs, however loaded the machine. The router, the sender that lets them
/// go (`true`), and a receiver told of each request held.
fn held_app(
    layer: RateLimitLayer,
) -> (
    Router,
    tokio::sync::watch::Sender<bool>,
    tokio::sync::mpsc::UnboundedReceiver<()>,
) {
    let (release, released) = tokio::sync::watch::channel(false);
    let (entered_tx, entered) = tokio::sync::mpsc::unbounded_channel();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route(
            "/slow",
            get(move || {
                let (mut released, entered_tx) = (released.clone(), entered_tx.clone());
                async move {
                    let _ = entered_tx.send(());
                    let _ = released.wait_for(|go| *go).await;
                    "late"
                }
            }),
        )
        .layer(layer);
    (app, release, entered)
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

async fn call(app: &Router, path: &str) -> Reply {
    let req = Request::get(path)
        .header("x-key", "k")
        .body(Body::empty())
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status();
    let headers = res.headers().clone();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// One list item: its name and integer or string parameters.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    name: String,
    params: HashMap<String, Param>,
}

#[derive(Debug, Clone, PartialEq)]
enum Param {
    Int(i64),
    Str(String),
    Bytes(Vec<u8>),
}

impl Entry {
    fn int(&self, key: &str) -> Option<i64> {
        match self.params.get(key) {
            Some(Param::Int(n)) => Some(*n),
            Some(other) => panic!("{}: {key} is not an integer: {other:?}", self.name),
            None => None,
        }
    }
}

/// Parses a list field as the draft says it is: a list of string items with parameters.
fn list(headers: &HeaderMap, name: &str) -> Vec<Entry> {
    let values: Vec<&str> = headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert!(!values.is_empty(), "no {name} field");
    let list: List = Parser::new(&values.join(", "))
        .parse()
        .unwrap_or_else(|e| panic!("{name} is not a structured-field list: {e}"));
    list.into_iter()
        .map(|member| {
            let ListEntry::Item(item) = member else {
                panic!("an inner list in {name}")
            };
            let name = item
                .bare_item
                .as_string()
                .unwrap_or_else(|| panic!("{name}: an item that is not a string"))
                .as_str()
                .to_owned();
            let params = item
                .params
                .iter()
                .map(|(k, v)| {
                    let v = match v {
                        BareItem::Integer(n) => Param::Int(i64::from(*n)),
                        BareItem::String(s) => Param::Str(s.as_str().to_owned()),
                        BareItem::ByteSequence(b) => Param::Bytes(b.clone()),
                        other => panic!("{name}: unexpected parameter {k:?}={other:?}"),
                    };
                    (k.as_str().to_owned(), v)
                })
                .collect();
            Entry { name, params }
        })
        .collect()
}

/// Checks every draft-11 rule on a response of a layer enforcing `enforced`, and returns the
/// `RateLimit` items by name.
fn check_fields(reply: &Reply, enforced: &[&Policy]) -> HashMap<String, Entry> {
    let limits: HashMap<String, Limit> = enforced
        .iter()
        .flat_map(|p| p.limits())
        .map(|l| (l.to_string(), *l))
        .collect();
    let policy = list(&reply.headers, "ratelimit-policy");
    let state = list(&reply.headers, "ratelimit");
    let mut quotas = HashMap::new();
    for item in &policy {
        assert!(
            quotas.insert(item.name.clone(), item.clone()).is_none(),
            "{} listed twice in RateLimit-Policy",
            item.name
        );
        let limit = limits
            .get(&item.name)
            .unwrap_or_else(|| panic!("{} is not an enforced limit", item.name));
        let q = item.int("q").expect("q is required");
        assert!(q >= 0);
        if limit.is_concurrency() {
            assert_eq!(
                item.params.get("qu"),
                Some(&Param::Str("concurrent-requests".into())),
                "{}",
                item.name
            );
            assert_eq!(q, limit.count() as i64);
            assert_eq!(
                item.int("w"),
                None,
                "{}: a concurrency limit has no window",
                item.name
            );
        } else {
            assert_eq!(item.params.get("qu"), None);
            let w = item.int("w").expect("w");
            assert!(w >= 1, "{}: w={w}", item.name);
            // Never a larger quota than enforced: q per w at most count per window.
            let (q, w) = (q as u128, w as u128);
            assert!(
                q * limit.window().as_micros() <= u128::from(limit.count()) * w * 1_000_000,
                "{}: q={q};w={w} advertises more than enforced",
                item.name
            );
        }
    }
    let retry_after: Option<i64> = reply
        .headers
        .get("retry-after")
        .map(|v| v.to_str().unwrap().parse().expect("Retry-After in seconds"));
    let mut items = HashMap::new();
    for item in &state {
        assert!(
            items.insert(item.name.clone(), item.clone()).is_none(),
            "{} listed twice in RateLimit",
            item.name
        );
        let quota = quotas
            .get(&item.name)
            .unwrap_or_else(|| panic!("{} has no RateLimit-Policy item", item.name));
        let (r, q) = (
            item.int("r").expect("r is required"),
            quota.int("q").unwrap(),
        );
        assert!(
            (0..=q).contains(&r),
            "{}: r={r} outside 0..=q={q}",
            item.name
        );
        let concurrent = limits[&item.name].is_concurrency();
        match item.int("t") {
            Some(t) => {
                assert!(!concurrent, "{}: a concurrency limit has no t", item.name);
                assert!(t >= 0);
                if let Some(ra) = retry_after {
                    assert!(t <= ra, "{}: t={t} ends after Retry-After: {ra}", item.name);
                }
                if r > 0 {
                    assert!(t <= quota.int("w").unwrap(), "{}: t beyond w", item.name);
                }
            }
            None => assert!(concurrent, "{}: t missing", item.name),
        }
    }
    assert_eq!(items.len(), quotas.len(), "every limit has a state");
    match (reply.status, retry_after) {
        (StatusCode::OK, None) => {}
        (StatusCode::TOO_MANY_REQUESTS, Some(ra)) => {
            assert!(ra >= 1);
            assert!(
                items.values().any(|i| i.int("r") == Some(0)),
                "a denial shows the exhausted limit"
            );
        }
        other => panic!("unexpected status and Retry-After: {other:?}"),
    }
    items
}

fn r_of(items: &HashMap<String, Entry>, name: &str) -> i64 {
    items[name].int("r").unwrap()
}

fn t_of(items: &HashMap<String, Entry>, name: &str) -> i64 {
    items[name].int("t").unwrap()
}

/// Drives one limit until it denies, checking every response, and returns the (r, t) seen.
async fn drive(text: &str, clock: &ManualClock, step: Duration) -> Vec<(StatusCode, i64, i64)> {
    let store = memory(clock);
    let policy: Policy = text.parse().unwrap();
    let app = app(keyed(Limiter::new(store, policy.clone())));
    let mut seen = Vec::new();
    for _ in 0..200 {
        let reply = call(&app, "/").await;
        let items = check_fields(&reply, &[&policy]);
        let name = policy.limits()[0].to_string();
        seen.push((reply.status, r_of(&items, &name), t_of(&items, &name)));
        if reply.status == StatusCode::TOO_MANY_REQUESTS {
            return seen;
        }
        clock.advance(step);
    }
    panic!("{text} never denied");
}

#[tokio::test]
async fn every_algorithm_follows_the_draft() {
    for (text, step_ms) in [
        ("10/s log", 10),
        ("10/s", 10),
        ("10/s fixed", 10),
        ("100/h", 1000),
        ("5/s bucket capacity=20", 10),
        ("5/s gcra burst=20", 10),
        ("3/s gcra burst=1", 100),
    ] {
        let seen = drive(text, &manual_clock(), Duration::from_millis(step_ms)).await;
        let (status, r, t) = *seen.last().unwrap();
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{text}");
        assert_eq!(r, 0, "{text}");
        assert!(t >= 1, "{text}");
    }
}

/// A token bucket advertises its burst over its refill time, and `r` never exceeds it.
#[tokio::test]
async fn a_bucket_advertises_its_burst() {
    let clock = manual_clock();
    let store = memory(&clock);
    let policy: Policy = "100/s bucket capacity=500".parse().unwrap();
    let app = app(keyed(Limiter::new(store, policy.clone())));
    let reply = call(&app, "/").await;
    let items = check_fields(&reply, &[&policy]);
    assert_eq!(
        reply.headers["ratelimit-policy"],
        r#""100/s bucket capacity=500";q=500;w=5"#
    );
    assert_eq!(r_of(&items, "100/s bucket capacity=500"), 499);
}

/// `5/500ms` is 10 per second: advertised as such, not halved.
#[tokio::test]
async fn a_sub_second_window_scales_to_a_second() {
    let clock = manual_clock();
    let seen = drive("5/500ms log", &clock, Duration::from_millis(1)).await;
    assert_eq!(seen.len(), 6, "5 allowed, the 6th denied");
    let store = memory(&clock);
    let app = app(keyed(limiter(&store, "5/500ms")));
    let reply = call(&app, "/").await;
    assert_eq!(reply.headers["ratelimit-policy"], r#""5/500ms";q=10;w=1"#);
    assert_eq!(reply.headers["ratelimit"], r#""5/500ms";r=4;t=1"#);
}

/// A client refused for concurrency sees the concurrency limit exhausted.
#[tokio::test]
async fn a_concurrency_limit_is_advertised_and_explains_its_denials() {
    let clock = manual_clock();
    let store = memory(&clock);
    let policy: Policy = "100/min, 2 concurrent".parse().unwrap();
    let (app, release, mut entered) = held_app(keyed(Limiter::new(store, policy.clone())));
    let slow: Vec<_> = (0..2)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { call(&app, "/slow").await })
        })
        .collect();
    for _ in 0..2 {
        entered.recv().await.unwrap();
    }
    let refused = call(&app, "/").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let items = check_fields(&refused, &[&policy]);
    assert_eq!(r_of(&items, "2 concurrent"), 0);
    assert_eq!(r_of(&items, "100/min"), 98);
    assert!(list(&refused.headers, "ratelimit-policy")
        .iter()
        .any(|i| i.params.get("qu") == Some(&Param::Str("concurrent-requests".into()))));
    release.send(true).unwrap();
    for task in slow {
        let reply = task.await.unwrap();
        assert_eq!(reply.status, StatusCode::OK);
        check_fields(&reply, &[&policy]);
    }
    let items = check_fields(&call(&app, "/").await, &[&policy]);
    assert_eq!(r_of(&items, "2 concurrent"), 1);
}

/// Two layers, one inside the other: the response lists the limits of both, each once.
#[tokio::test]
async fn stacked_layers_add_their_items() {
    let clock = manual_clock();
    let store = memory(&clock);
    let outer: Policy = "100/min, 1000/d fixed".parse().unwrap();
    let inner: Policy = "3/s log, 100/min".parse().unwrap();
    let outer_store = MemoryStore::builder()
        .clock(Clock::Manual(clock.clone()))
        .build();
    let app = app(keyed(Limiter::new(store, inner.clone())))
        .layer(keyed(Limiter::new(outer_store, outer.clone())));
    for n in 0..3 {
        let reply = call(&app, "/").await;
        assert_eq!(reply.status, StatusCode::OK);
        let items = check_fields(&reply, &[&outer, &inner]);
        assert_eq!(items.len(), 3, "{:?}", reply.headers);
        assert_eq!(r_of(&items, "3/s log"), 2 - n);
        assert_eq!(r_of(&items, "100/min"), 99 - n);
        assert_eq!(r_of(&items, "1000/d fixed"), 999 - n);
    }
    clock.advance(Duration::from_millis(400));
    // the inner layer denies; the outer one (which allowed, and was charged) still reports
    let reply = call(&app, "/").await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    let items = check_fields(&reply, &[&outer, &inner]);
    assert_eq!(reply.headers["retry-after"], "1");
    assert_eq!(r_of(&items, "3/s log"), 0);
    assert_eq!(r_of(&items, "1000/d fixed"), 996);
    assert_eq!(t_of(&items, "1000/d fixed"), 1, "capped at Retry-After");
}

/// A route that adds its limiter: both checked, both listed; the default one is not charged
/// by what the route's limiter denies. A route that replaces: its limits only.
#[tokio::test]
async fn routes_add_or_replace_as_said() {
    let clock = manual_clock();
    let store = memory(&clock);
    let default: Policy = "100/min".parse().unwrap();
    let login: Policy = "2/min log".parse().unwrap();
    let export: Policy = "1/h".parse().unwrap();
    let layer = keyed(limiter(&store, "100/min"))
        .route_adding(
            |req: &RequestView<'_>| req.uri.path() == "/login",
            limiter(&store, "2/min log"),
        )
        .route_replacing(
            |req: &RequestView<'_>| req.uri.path() == "/slow",
            limiter(&store, "1/h"),
        );
    let app = app(layer);
    for n in 0..2 {
        let reply = call(&app, "/login").await;
        assert_eq!(reply.status, StatusCode::OK);
        let items = check_fields(&reply, &[&default, &login]);
        assert_eq!(r_of(&items, "2/min log"), 1 - n);
        assert_eq!(r_of(&items, "100/min"), 99 - n);
    }
    for _ in 0..3 {
        let reply = call(&app, "/login").await;
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
        let items = check_fields(&reply, &[&default, &login]);
        assert_eq!(items.keys().collect::<Vec<_>>(), ["2/min log"]);
    }
    let items = check_fields(&call(&app, "/").await, &[&default]);
    assert_eq!(
        r_of(&items, "100/min"),
        97,
        "denied logins spent none of it"
    );
    let reply = call(&app, "/slow").await;
    assert_eq!(reply.status, StatusCode::OK);
    let items = check_fields(&reply, &[&export]);
    assert_eq!(items.keys().collect::<Vec<_>>(), ["1/h"]);
    let items = check_fields(&call(&app, "/").await, &[&default]);
    assert_eq!(
        r_of(&items, "100/min"),
        96,
        "the replacing route spent none of it"
    );
}

/// An adding route holds the concurrency slots of both limiters until the response ends.
#[tokio::test]
async fn an_adding_route_holds_both_slots() {
    let clock = manual_clock();
    let store = memory(&clock);
    // the route's limiter in a namespace of its own: in the store's shared space, two
    // concurrency limits hold an identifier's slots together
    let route = Limiter::builder(
        store.clone(),
        "100/min, 5 concurrent lease=30s".parse().unwrap(),
    )
    .namespace("slow".parse().unwrap())
    .build();
    let layer = keyed(limiter(&store, "1 concurrent"))
        .route_adding(|req: &RequestView<'_>| req.uri.path() == "/slow", route);
    let (app, release, mut entered) = held_app(layer);
    let slow = {
        let app = app.clone();
        tokio::spawn(async move { call(&app, "/slow").await })
    };
    entered.recv().await.unwrap();
    let refused = call(&app, "/").await;
    assert_eq!(
        refused.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the default slot is held"
    );
    assert_eq!(refused.headers["ratelimit"], r#""1 concurrent";r=0"#);
    release.send(true).unwrap();
    let reply = slow.await.unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.headers["ratelimit"],
        r#""100/min";r=99;t=60, "5 concurrent lease=30s";r=4, "1 concurrent";r=0"#
    );
    assert_eq!(
        call(&app, "/").await.status,
        StatusCode::OK,
        "both slots are back"
    );
}

#[tokio::test]
async fn problem_details_name_the_violated_policies() {
    let clock = manual_clock();
    let store = memory(&clock);
    let app = app(keyed(limiter(&store, "1/min, 10/h")).problem_details(true));
    assert_eq!(call(&app, "/").await.status, StatusCode::OK);
    let reply = call(&app, "/").await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.headers["content-type"], "application/problem+json");
    assert!(reply.body.starts_with(
        r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Quota Exceeded","status":429,"#
    ), "{}", reply.body);
    assert!(
        reply.body.ends_with("\"violated-policies\":[\"1/min\"]}\n"),
        "{}",
        reply.body
    );
    assert!(reply.headers.contains_key("retry-after"));

    let shed = app_503(&store);
    assert_eq!(call(&shed, "/").await.status, StatusCode::OK);
    let reply = call(&shed, "/").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        reply.body.contains("#temporary-reduced-capacity\""),
        "{}",
        reply.body
    );
    assert!(reply.body.contains("\"status\":503"), "{}", reply.body);
}

fn app_503(store: &Store) -> Router {
    app(keyed(limiter(store, "1/min fixed"))
        .limited_status(StatusCode::SERVICE_UNAVAILABLE)
        .problem_details(true))
}

#[tokio::test]
async fn the_legacy_style_replaces_the_draft_fields() {
    let clock = manual_clock();
    let store = memory(&clock);
    let app = app(keyed(limiter(&store, "10/s, 3/min fixed")).headers(HeaderStyle::Legacy));
    let reply = call(&app, "/").await;
    assert!(reply.headers.get("ratelimit").is_none());
    assert!(reply.headers.get("ratelimit-policy").is_none());
    assert_eq!(reply.headers["x-ratelimit-limit"], "3");
    assert_eq!(reply.headers["x-ratelimit-remaining"], "2");
    assert_eq!(reply.headers["x-ratelimit-reset"], "60");
}

/// With partition keys on, every `RateLimit` item carries `pk`: a byte sequence, the same for
/// the same identifier and secret, another for another identifier, never the identifier.
#[tokio::test]
async fn partition_keys_are_byte_sequences_that_hide_the_identifier() {
    let clock = manual_clock();
    let store = memory(&clock);
    let policy: Policy = "10/s, 100/min, 3 concurrent".parse().unwrap();
    let layer =
        |secret: &str| keyed(limiter(&store, "10/s, 100/min, 3 concurrent")).partition_keys(secret);
    let pks = |reply: &Reply| -> Vec<Vec<u8>> {
        let items = check_fields(reply, &[&policy]);
        let mut pks: Vec<Vec<u8>> = ["10/s", "100/min", "3 concurrent"]
            .iter()
            .map(|name| match items[*name].params.get("pk") {
                Some(Param::Bytes(b)) => b.clone(),
                other => panic!("{name}: pk is {other:?}"),
            })
            .collect();
        pks.dedup();
        pks
    };
    let a = pks(&call(&app(layer("s3cret")), "/").await);
    assert_eq!(a.len(), 1, "one identifier, one partition key: {a:?}");
    assert_eq!(a[0].len(), 12);
    let shown = call(&app(layer("s3cret")), "/").await;
    let text = shown.headers["ratelimit"].to_str().unwrap();
    assert!(!text.contains("x-key"), "{text}");
    assert_eq!(pks(&call(&app(layer("s3cret")), "/").await), a, "stable");
    assert_ne!(pks(&call(&app(layer("other")), "/").await), a, "keyed");
    // another identifier, another key
    let req = Request::get("/")
        .header("x-key", "k2")
        .body(Body::empty())
        .unwrap();
    let res = app(layer("s3cret")).oneshot(req).await.unwrap();
    let text = res.headers()["ratelimit"].to_str().unwrap().to_owned();
    let list: List = Parser::new(&text).parse().unwrap();
    let ListEntry::Item(first) = &list[0] else {
        panic!("{text}")
    };
    let pk = first.params.get("pk").and_then(BareItem::as_byte_sequence);
    assert!(pk.is_some_and(|pk| pk != a[0].as_slice()), "{text}");
    // off by default
    let plain = call(&app(keyed(limiter(&store, "10/s"))), "/").await;
    assert!(!plain.headers["ratelimit"].to_str().unwrap().contains("pk="));
}

/// An empty secret (read from a variable that is not set, say) would hash every identifier
/// under a key everyone knows: the layer refuses it where it is built.
#[test]
#[should_panic(expected = "empty secret")]
fn an_empty_partition_key_secret_is_refused() {
    let store = memory(&manual_clock());
    let unset = std::env::var("TOLLGATE_TEST_UNSET_SECRET").unwrap_or_default();
    let _ = keyed(limiter(&store, "10/s")).partition_keys(unset);
}

/// A refusal is an HTTP answer no cache keeps, whatever the request says of itself: a `GET`
/// claiming `content-type: application/grpc` gets the HTTP `429`, not gRPC's `200` (a shared
/// cache keeping that `200` for the path would serve an empty body to everyone).
#[tokio::test]
async fn a_refusal_is_never_a_200_a_cache_keeps() {
    let clock = manual_clock();
    let store = memory(&clock);
    let app = app(keyed(limiter(&store, "1/min")));
    assert_eq!(call(&app, "/").await.status, StatusCode::OK);
    let req = Request::get("/")
        .header("x-key", "k")
        .header("content-type", "application/grpc")
        .body(Body::empty())
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(res.headers().get("grpc-status").is_none());
    assert_eq!(res.headers()["cache-control"], "no-store");
    // a gRPC call (a POST) is answered in gRPC's form, not kept either
    let req = Request::post("/")
        .header("x-key", "k")
        .header("content-type", "Application/GRPC")
        .body(Body::empty())
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    assert_eq!(res.headers()["grpc-status"], "8");
    assert_eq!(res.headers()["cache-control"], "no-store");
}

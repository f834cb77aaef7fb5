//! What operators do with limiters in production: try a policy in shadow mode, change a
//! policy without a restart, charge only some responses.

mod common;

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{manual_clock, snapshot, RedisServer};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tollgate::key::Header;
use tollgate::{
    Clock, Error, KeyedRateLimitLayer, Limiter, ManualClock, MemoryStore, OnStoreError, Origin,
    Policy, RateLimitLayer, RateLimited, RedisStore, Store,
};
use tower::{service_fn, Layer, Service, ServiceExt};

fn memory(clock: &ManualClock) -> Store {
    MemoryStore::builder()
        .clock(Clock::Manual(clock.clone()))
        .build()
        .into()
}

fn policy(text: &str) -> Policy {
    text.parse().unwrap()
}

/// A store whose server is not there: every check fails at once (connection refused).
fn dead_store() -> RedisStore {
    RedisStore::builder(common::dead_url())
        .timeout(Duration::from_millis(200))
        .build_lazy()
        .unwrap()
}

/// The identifier of user `a`'s requests.
const USER_A: &str = "header:x-user:a";

/// A request from `user` (the `x-user` header is the key).
fn request(user: &str, path: &str) -> Request<Full<bytes::Bytes>> {
    Request::get(path)
        .header("x-user", user)
        .body(Full::default())
        .unwrap()
}

/// A handler answering `401` on `/fail` and `200` elsewhere, counting its calls.
fn handler(
    calls: Arc<AtomicU64>,
) -> impl Service<
    Request<Full<bytes::Bytes>>,
    Response = Response<Full<bytes::Bytes>>,
    Error = Infallible,
    Future = impl Send,
> + Clone
       + Send
       + 'static {
    service_fn(move |req: Request<Full<bytes::Bytes>>| {
        calls.fetch_add(1, Ordering::SeqCst);
        let status = if req.uri().path() == "/fail" {
            StatusCode::UNAUTHORIZED
        } else {
            StatusCode::OK
        };
        async move {
            Ok::<_, Infallible>(
                Response::builder()
                    .status(status)
                    .body(Full::default())
                    .unwrap(),
            )
        }
    })
}

// ---------------------------------------------------------------------------------------
// Shadow mode
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn shadow_mode_lets_everything_through_and_counts_as_enforcing_would() {
    let clock = manual_clock();
    let shadow = Limiter::builder(memory(&clock), policy("3/s log, 5/min"))
        .shadow(true)
        .build();
    let enforced = Limiter::new(memory(&clock), policy("3/s log, 5/min"));
    assert!(shadow.is_shadow() && !enforced.is_shadow());
    for step in 0..40 {
        let s = shadow.check(&["user:1"]).await.unwrap();
        let e = enforced.check(&["user:1"]).await.unwrap();
        assert!(s.is_allowed(), "step {step}: shadow mode never refuses");
        assert!(s.is_shadow() && !e.is_shadow());
        // what the policy decided, and the figures, are the enforced limiter's
        assert_eq!(s.would_deny(), !e.is_allowed(), "step {step}");
        assert_eq!(s.statuses(), e.statuses(), "step {step}");
        assert_eq!(s.would_deny_by(), e.denied_by(), "step {step}");
        // a shadow decision is not a denial: nobody is told to wait
        assert_eq!(s.retry_after(), None);
        assert_eq!(s.denied_by(), None);
        clock.advance(Duration::from_millis(150));
    }
    // Switching to enforcement changes the answers, not the counts.
    shadow.set_shadow(false);
    let s = shadow.check(&["user:1"]).await.unwrap();
    let e = enforced.check(&["user:1"]).await.unwrap();
    assert_eq!(s, e);
}

#[tokio::test]
async fn shadow_mode_lets_through_what_the_limiter_could_not_check() {
    let limiter = Limiter::builder(dead_store(), policy("3/s"))
        .on_store_error(OnStoreError::Closed)
        .shadow(true)
        .build();
    let d = limiter.check(&["user:1"]).await.unwrap();
    assert!(d.is_allowed() && d.would_deny(), "closed would refuse");
    assert_eq!(d.origin(), Origin::FailOpen);
    assert!(d.statuses().is_empty());
    // a cost the policy never admits: an error when enforcing, a would-be denial here
    let d = limiter.check_n(&["user:1"], 50).await.unwrap();
    assert!(d.is_allowed() && d.would_deny());
    // errors of the caller stay errors
    let none: [&str; 0] = [];
    assert!(matches!(
        limiter.check(&none).await,
        Err(Error::NoIdentifiers)
    ));
    // ...whatever the cost (a shadow answer to the cost's error hid them)
    assert!(matches!(
        limiter.check_n(&none, 0).await,
        Err(Error::NoIdentifiers)
    ));
    let many: Vec<String> = (0..17).map(|i| format!("user:{i}")).collect();
    assert!(matches!(
        limiter.check_n(&many, 50).await,
        Err(Error::TooManyIdentifiers { .. })
    ));
    // open would not have refused
    let open = Limiter::builder(dead_store(), policy("3/s"))
        .shadow(true)
        .build();
    let d = open.check(&["user:1"]).await.unwrap();
    assert!(d.is_allowed() && !d.would_deny());
}

#[tokio::test]
async fn a_shadow_layer_refuses_nothing_and_shows_nothing() {
    let clock = manual_clock();
    let limiter = Limiter::new(memory(&clock), policy("2/min"));
    let calls = Arc::new(AtomicU64::new(0));
    let layer = RateLimitLayer::new(limiter.clone())
        .key(Header::named("x-user").unwrap())
        .shadow(true);
    assert_eq!(layer.settings().shadow, Some(true));
    let mut svc = layer.layer(handler(calls.clone()));
    for _ in 0..5 {
        let res = svc
            .ready()
            .await
            .unwrap()
            .call(request("a", "/"))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert!(
            res.headers().get("ratelimit").is_none(),
            "a trial is invisible"
        );
        assert!(res.headers().get("ratelimit-policy").is_none());
        assert!(res.headers().get("retry-after").is_none());
    }
    assert_eq!(calls.load(Ordering::SeqCst), 5);
    // charged as enforcing: the first 2 were, and the quota is used up
    assert!(!limiter.check(&[USER_A]).await.unwrap().is_allowed());
}

#[tokio::test]
async fn a_shadow_route_beside_an_enforced_one_leaves_the_enforced_answers_alone() {
    let clock = manual_clock();
    let store = memory(&clock);
    let enforced = Limiter::new(store.clone(), policy("3/min"));
    let trial = Limiter::builder(store, policy("1/min fixed"))
        .shadow(true)
        .build();
    let layer = RateLimitLayer::new(enforced)
        .key(Header::named("x-user").unwrap())
        .route_adding(|_: &tollgate::key::RequestView<'_>| true, trial);
    let mut svc = layer.layer(handler(Arc::new(AtomicU64::new(0))));
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let res = svc
            .ready()
            .await
            .unwrap()
            .call(request("a", "/"))
            .await
            .unwrap();
        if res.status() == StatusCode::OK {
            // only the enforced limit is advertised
            let policy = res.headers()["ratelimit-policy"].to_str().unwrap();
            assert!(
                policy.contains("3/min") && !policy.contains("1/min"),
                "{policy}"
            );
        }
        statuses.push(res.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
}

/// A layer in shadow mode charges as enforcing would: a request the route's limiter would
/// deny spends nothing of the default one, as an enforced denial does not.
#[tokio::test]
async fn a_shadow_layer_spends_nothing_of_the_default_limiter_past_a_route_denial() {
    let clock = manual_clock();
    let store = memory(&clock);
    let default = Limiter::new(store.clone(), policy("10/min"));
    let login = Limiter::new(store, policy("3/min log"));
    let layer = RateLimitLayer::new(default.clone())
        .key(Header::named("x-user").unwrap())
        .route_adding(
            |req: &tollgate::key::RequestView<'_>| req.uri.path() == "/login",
            login,
        )
        .shadow(true);
    let mut svc = layer.layer(handler(Arc::new(AtomicU64::new(0))));
    for _ in 0..10 {
        let res = svc
            .ready()
            .await
            .unwrap()
            .call(request("a", "/login"))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "shadow mode refuses nothing");
    }
    // three logins got past the route's limit: the default one was charged for those alone
    let usage = default.usage(&[USER_A]).await.unwrap();
    assert_eq!((usage[0].used, usage[0].remaining), (3, 7));
}

#[tokio::test]
async fn a_shadow_generic_layer_never_fails_a_call() {
    let clock = manual_clock();
    let limiter = Limiter::new(memory(&clock), policy("1/min"));
    let layer = KeyedRateLimitLayer::new(limiter, |_: &u32| "psp:acme".into())
        .wait_up_to(Duration::from_secs(30))
        .shadow(true);
    let mut svc = layer.layer(service_fn(|n: u32| async move { Ok::<_, Infallible>(n) }));
    for n in 0..4 {
        // no call waits for a limit in shadow mode
        let out = tokio::time::timeout(Duration::from_secs(5), svc.ready().await.unwrap().call(n))
            .await
            .expect("no wait")
            .unwrap();
        assert_eq!(out, n);
    }
    let enforced =
        KeyedRateLimitLayer::new(Limiter::new(memory(&clock), policy("1/min")), |_: &u32| {
            "psp:acme".into()
        });
    let mut svc = enforced.layer(service_fn(|n: u32| async move { Ok::<_, Infallible>(n) }));
    svc.ready().await.unwrap().call(1).await.unwrap();
    let err = svc.ready().await.unwrap().call(2).await.unwrap_err();
    assert!(err.downcast_ref::<RateLimited>().is_some());
}

// ---------------------------------------------------------------------------------------
// Live policy changes
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn a_new_policy_applies_to_every_clone_and_renames_the_limiter() {
    let clock = manual_clock();
    let limiter = Limiter::new(memory(&clock), policy("2/min"));
    let clone = limiter.clone();
    assert_eq!(limiter.name(), "2/min");
    for _ in 0..2 {
        assert!(limiter.check(&["a"]).await.unwrap().is_allowed());
    }
    assert!(!limiter.check(&["a"]).await.unwrap().is_allowed());

    clone.set_policy(policy("5/min fixed, 100/h"));
    assert_eq!(limiter.policy(), policy("5/min fixed, 100/h"));
    assert_eq!(limiter.name(), "5/min fixed, 100/h");
    let d = limiter.check(&["b"]).await.unwrap();
    let limits: Vec<String> = d.limits().map(|s| s.limit.to_string()).collect();
    assert_eq!(limits, ["5/min fixed", "100/h"]);
    for _ in 0..4 {
        assert!(limiter.check(&["b"]).await.unwrap().is_allowed());
    }
    assert!(!limiter.check(&["b"]).await.unwrap().is_allowed());

    // a given name stays
    let named = Limiter::builder(memory(&clock), policy("2/min"))
        .name("api")
        .build();
    named.set_policy(policy("3/min"));
    assert_eq!(named.name(), "api");
}

#[tokio::test]
async fn under_load_every_check_started_after_the_change_sees_the_new_policy() {
    let limiter = Limiter::new(MemoryStore::new(), policy("1000000/s"));
    let old = policy("1000000/s");
    let new = policy("999999/s, 5000000/min");
    let changed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // checks made so far: the policy changes once a good many ran on the old one, and each
    // task goes on until it has made as many after the change (a fixed count of checks and
    // a sleep before the change raced the tasks: on a fast machine they could all end first)
    let made = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    const AFTER: usize = 500;
    let mut tasks = Vec::new();
    for t in 0..4 {
        let limiter = limiter.clone();
        let (changed, made) = (changed.clone(), made.clone());
        let (old, new) = (old.clone(), new.clone());
        tasks.push(tokio::spawn(async move {
            let mut after = 0;
            for i in 0.. {
                let was_changed = changed.load(Ordering::SeqCst);
                let d = limiter
                    .check(&[format!("user:{t}:{}", i % 7)])
                    .await
                    .unwrap();
                assert!(d.is_allowed());
                let limits: Vec<_> = d.limits().map(|s| s.limit).collect();
                if was_changed {
                    assert_eq!(limits, new.limits(), "a check after the change");
                    after += 1;
                    if after == AFTER {
                        break;
                    }
                } else {
                    assert!(limits == old.limits() || limits == new.limits());
                }
                made.fetch_add(1, Ordering::SeqCst);
                if i % 64 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            after
        }));
    }
    while made.load(Ordering::SeqCst) < 2000 {
        tokio::task::yield_now().await;
    }
    limiter.set_policy(new.clone());
    changed.store(true, Ordering::SeqCst);
    let mut after = 0;
    for t in tasks {
        after += t.await.unwrap();
    }
    assert_eq!(after, 4 * AFTER, "every task checked after the change");
}

#[tokio::test]
async fn the_fallback_follows_the_new_policy() {
    let limiter = Limiter::builder(dead_store(), policy("2/min"))
        .on_store_error(OnStoreError::fallback(1.0).unwrap())
        .build();
    for _ in 0..2 {
        let d = limiter.check(&["a"]).await.unwrap();
        assert_eq!(d.origin(), Origin::Fallback);
        assert!(d.is_allowed());
    }
    assert!(!limiter.check(&["a"]).await.unwrap().is_allowed());
    limiter.set_policy(policy("4/h"));
    let d = limiter.check(&["b"]).await.unwrap();
    assert_eq!(d.origin(), Origin::Fallback);
    assert_eq!(d.limits().next().unwrap().limit.to_string(), "4/h");
    for _ in 0..3 {
        assert!(limiter.check(&["b"]).await.unwrap().is_allowed());
    }
    assert!(!limiter.check(&["b"]).await.unwrap().is_allowed());
}

#[tokio::test]
async fn a_watch_channel_drives_the_policy() {
    let clock = manual_clock();
    let (reload, policies) = tokio::sync::watch::channel(policy("1/min"));
    let limiter = Limiter::new(memory(&clock), policy("50/min"));
    let task = tokio::spawn(limiter.follow(policies));
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        limiter.policy(),
        policy("1/min"),
        "the current value applies at once"
    );
    reload.send(policy("3/h")).unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(limiter.policy(), policy("3/h"));
    drop(reload);
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("ends with its sender")
        .unwrap();
}

/// The task following a channel ends with the limiter, though the channel's sender lives on
/// and sends nothing more (it used to wait for the next change, which may never come, holding
/// the limiter's memory meanwhile).
#[tokio::test]
async fn following_ends_when_the_limiter_goes() {
    let clock = manual_clock();
    let (_reload, policies) = tokio::sync::watch::channel(policy("1/min"));
    let limiter = Limiter::new(memory(&clock), policy("50/min"));
    let task = tokio::spawn(limiter.follow(policies));
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(limiter.policy(), policy("1/min"));
    drop(limiter);
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("ends with its limiter")
        .unwrap();
}

#[tokio::test]
async fn a_raised_limit_is_not_held_back_by_the_deny_cache() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix(common::unique_prefix())
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let limiter = Limiter::new(store, policy("1/min"));
    assert!(limiter.check(&["a"]).await.unwrap().is_allowed());
    let d = limiter.check(&["a"]).await.unwrap();
    assert!(!d.is_allowed());
    assert_eq!(
        limiter.check(&["a"]).await.unwrap().origin(),
        Origin::DenyCache
    );
    limiter.set_policy(policy("100/min"));
    let d = limiter.check(&["a"]).await.unwrap();
    assert!(d.is_allowed(), "{d:?}");
    assert_eq!(d.origin(), Origin::Store);
}

// ---------------------------------------------------------------------------------------
// Charging by response
// ---------------------------------------------------------------------------------------

/// A layer keyed by the `x-user` header that charges only `401` responses.
fn failures_only(limiter: Limiter) -> RateLimitLayer {
    RateLimitLayer::new(limiter)
        .key(Header::named("x-user").unwrap())
        .charge_if(|res: &http::response::Parts| res.status == StatusCode::UNAUTHORIZED)
}

/// The `r` of the `RateLimit` item named `name`, read as a structured field.
fn remaining_in(
    res: &Response<tollgate::layer::ResponseBody<Full<bytes::Bytes>>>,
    name: &str,
) -> i64 {
    let text = res.headers()["ratelimit"].to_str().unwrap();
    let list: sfv::List = sfv::Parser::new(text).parse().unwrap();
    list.iter()
        .find_map(|entry| match entry {
            sfv::ListEntry::Item(item)
                if item.bare_item.as_string().map(|s| s.as_str()) == Some(name) =>
            {
                item.params
                    .get("r")
                    .and_then(|r| r.as_integer())
                    .map(i64::from)
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

/// Only the selected responses are charged; a request is refused before the handler once
/// the quota is used up, whatever its response would have been; the fields say what is
/// left. On both stores.
#[tokio::test]
async fn only_the_selected_responses_are_charged() {
    let server = RedisServer::start();
    let clock = manual_clock();
    let redis = server.store(Clock::Manual(clock.clone())).await;
    for store in [memory(&clock), redis.into()] {
        let limiter = Limiter::new(store, policy("3/min"));
        let calls = Arc::new(AtomicU64::new(0));
        let mut svc = failures_only(limiter.clone()).layer(handler(calls.clone()));
        for _ in 0..5 {
            let res = svc.ready_oneshot_call(request("a", "/")).await;
            assert_eq!(res.status(), StatusCode::OK);
            assert_eq!(remaining_in(&res, "3/min"), 3, "a 200 charges nothing");
        }
        for left in [2, 1, 0] {
            let res = svc.ready_oneshot_call(request("a", "/fail")).await;
            assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
            assert_eq!(remaining_in(&res, "3/min"), left, "a 401 is charged");
            assert!(res.headers().get("retry-after").is_none());
        }
        assert_eq!(calls.load(Ordering::SeqCst), 8);
        // the quota is used up: refused before the handler, a 200 as a 401 would be
        for path in ["/fail", "/"] {
            let res = svc.ready_oneshot_call(request("a", path)).await;
            assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS, "{path}");
            assert_eq!(remaining_in(&res, "3/min"), 0);
            assert!(res.headers().get("retry-after").is_some());
        }
        assert_eq!(
            calls.load(Ordering::SeqCst),
            8,
            "the handler was not called"
        );
        assert_eq!(limiter.usage(&[USER_A]).await.unwrap()[0].used, 3);
        // another user is untouched
        let mut other = failures_only(limiter.clone()).layer(handler(calls.clone()));
        let res = other.ready_oneshot_call(request("b", "/fail")).await;
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(remaining_in(&res, "3/min"), 2);
    }
}

/// Requests whose responses are not selected leave Redis exactly as it was: the layer's
/// check before the handler is a peek.
#[tokio::test]
async fn responses_not_charged_leave_redis_as_it_was() {
    let server = RedisServer::start();
    let store = server.store(Clock::Real).await;
    let prefix = store.prefix().to_string();
    let limiter = Limiter::new(store, policy("5/min, 3/min log, 9/h gcra"));
    let mut svc = failures_only(limiter).layer(handler(Arc::new(AtomicU64::new(0))));
    let res = svc.ready_oneshot_call(request("a", "/fail")).await;
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let mut conn = server.conn();
    let before = snapshot(&mut conn, &prefix);
    assert_eq!(before.len(), 2, "{before:?}");
    for user in ["a", "a", "b", "a"] {
        let res = svc.ready_oneshot_call(request(user, "/")).await;
        assert_eq!(res.status(), StatusCode::OK);
    }
    assert_eq!(snapshot(&mut conn, &prefix), before);
}

/// Requests in flight together all pass the peek: more than the quota may reach the
/// handler, but no more than the quota is ever charged.
#[tokio::test]
async fn requests_in_flight_together_may_pass_the_quota_but_never_the_count() {
    let clock = manual_clock();
    let limiter = Limiter::new(memory(&clock), policy("3/min"));
    let arrived = Arc::new(tokio::sync::Barrier::new(5));
    let calls = Arc::new(AtomicU64::new(0));
    let inner = {
        let (arrived, calls) = (arrived.clone(), calls.clone());
        service_fn(move |_req: Request<Full<bytes::Bytes>>| {
            let (arrived, calls) = (arrived.clone(), calls.clone());
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                // every request is in the handler before any answers
                arrived.wait().await;
                Ok::<_, Infallible>(
                    Response::builder()
                        .status(StatusCode::UNAUTHORIZED)
                        .body(Full::<bytes::Bytes>::default())
                        .unwrap(),
                )
            }
        })
    };
    let svc = failures_only(limiter.clone()).layer(inner);
    let tasks: Vec<_> = (0..5)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move { svc.oneshot(request("a", "/")).await.unwrap().status() })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), StatusCode::UNAUTHORIZED);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 5, "all five passed the peek");
    assert_eq!(limiter.usage(&[USER_A]).await.unwrap()[0].used, 3);
    let mut svc = svc;
    let res = svc.ready_oneshot_call(request("a", "/")).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// `ready().await.call(req).await.unwrap()` in one call.
trait ReadyCall<Req> {
    type Out;
    fn ready_oneshot_call(&mut self, req: Req) -> impl std::future::Future<Output = Self::Out>;
}

impl<S, Req> ReadyCall<Req> for S
where
    S: Service<Req>,
    S::Error: std::fmt::Debug,
{
    type Out = S::Response;
    async fn ready_oneshot_call(&mut self, req: Req) -> S::Response {
        self.ready().await.unwrap().call(req).await.unwrap()
    }
}

// ---------------------------------------------------------------------------------------
// Counts carried over a policy change
// ---------------------------------------------------------------------------------------

/// How many of `n` checks of `id` are allowed (slots taken are kept in `held`).
async fn admitted(
    l: &Limiter,
    id: &str,
    n: usize,
    held: &mut Vec<tollgate::ConcurrencyGuard>,
) -> usize {
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

/// A new count applies to what was already counted, limit by limit, on both stores: 8 used
/// of 10/min raised to 12/min admits 4 more; lowered below the usage, it denies. A bucket's
/// or GCRA's burst carries over; its rate starts afresh.
#[tokio::test]
async fn counts_carry_over_a_change_of_count() {
    let server = RedisServer::start();
    for algorithm in ["", " log", " fixed"] {
        let clock = manual_clock();
        let redis = server.store(Clock::Manual(clock.clone())).await;
        for store in [memory(&clock), redis.into()] {
            let l = Limiter::new(
                store,
                policy(&format!("10/min{algorithm}, 100/h{algorithm}")),
            );
            let held = &mut Vec::new();
            assert_eq!(admitted(&l, "u", 8, held).await, 8);
            l.set_policy(policy(&format!("12/min{algorithm}, 100/h{algorithm}")));
            assert_eq!(
                admitted(&l, "u", 10, held).await,
                4,
                "{algorithm}: 12 - 8, not 12"
            );
            let u = l.usage(&["u"]).await.unwrap();
            assert_eq!((u[0].used, u[1].used), (12, 12), "{algorithm}");
            l.set_policy(policy(&format!("5/min{algorithm}, 100/h{algorithm}")));
            assert_eq!(
                admitted(&l, "u", 3, held).await,
                0,
                "{algorithm}: 12 used of 5"
            );
            assert_eq!(l.usage(&["u"]).await.unwrap()[0].remaining, 0);
        }
    }
    let clock = manual_clock();
    let redis = server.store(Clock::Manual(clock.clone())).await;
    for store in [memory(&clock), redis.into()] {
        let held = &mut Vec::new();
        // slots held stay held under a new count
        let l = Limiter::new(store.clone(), policy("3 concurrent"));
        assert_eq!(admitted(&l, "c", 2, held).await, 2);
        l.set_policy(policy("5 concurrent lease=30s"));
        assert_eq!(admitted(&l, "c", 5, held).await, 3, "5 - 2 held");
        // GCRA: a new burst keeps the arrival time; a new rate starts afresh
        let g = Limiter::new(store, policy("10/min gcra burst=10"));
        assert_eq!(admitted(&g, "g", 8, held).await, 8);
        g.set_policy(policy("10/min gcra burst=12"));
        assert_eq!(admitted(&g, "g", 10, held).await, 4, "burst 12 - 8 used");
        g.set_policy(policy("20/min gcra burst=12"));
        assert_eq!(
            admitted(&g, "g", 20, held).await,
            12,
            "a new rate starts afresh"
        );
    }
}

/// Under load: tasks keep checking one identifier while the count is raised, then lowered.
/// Every check that starts after a change runs on the new policy, and the count carries over
/// both changes: 12 admitted in all, whatever the timing (the clock stands still).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_load_a_new_count_applies_at_once_to_what_was_counted() {
    let server = RedisServer::start();
    let clock = manual_clock();
    let redis = server.store(Clock::Manual(clock.clone())).await;
    for store in [memory(&clock), redis.into()] {
        let limiter = Limiter::new(store, policy("10/min"));
        // 0: the first policy; 1: raised to 12/min; 2: lowered to 6/min; 3: stop
        let phase = Arc::new(AtomicU64::new(0));
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (limiter, phase) = (limiter.clone(), phase.clone());
                tokio::spawn(async move {
                    let mut allowed = 0;
                    loop {
                        let before = phase.load(Ordering::SeqCst);
                        if before == 3 {
                            return allowed;
                        }
                        let d = limiter.check(&["shared"]).await.unwrap();
                        let limit = d.limits().next().unwrap().limit.to_string();
                        match before {
                            1 => assert!(limit == "12/min" || limit == "6/min", "{limit}"),
                            2 => {
                                assert_eq!(limit, "6/min");
                                assert!(!d.is_allowed(), "12 used of 6");
                            }
                            _ => {}
                        }
                        allowed += u64::from(d.is_allowed());
                        tokio::task::yield_now().await;
                    }
                })
            })
            .collect();
        // each phase lasts until its count is reached (on a loaded machine, 8 tasks on
        // Redis may take a while to make their first checks)
        let used = |n: u64| {
            let limiter = limiter.clone();
            async move {
                common::eventually(Duration::from_secs(10), || async {
                    match limiter.usage(&["shared"]).await.unwrap()[0].used {
                        used if used == n => Ok(()),
                        used => Err(format!("{used} used, waiting for {n}")),
                    }
                })
                .await;
            }
        };
        used(10).await;
        limiter.set_policy(policy("12/min"));
        phase.store(1, Ordering::SeqCst);
        used(12).await;
        limiter.set_policy(policy("6/min"));
        phase.store(2, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(30)).await;
        phase.store(3, Ordering::SeqCst);
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap();
        }
        assert_eq!(
            total, 12,
            "10, then 2 more under 12/min, then none under 6/min"
        );
    }
}

/// A manual clock holds times up to 2^53 µs (the latest the scripts' doubles hold to the
/// µs): set or moved past it, it holds there, and both stores decide at that time as at any
/// other, every algorithm, with no arithmetic overflowing (the tests run with overflow
/// checks, so an overflow would fail them).
#[tokio::test]
async fn a_manual_clock_at_its_latest_time_is_decided_on() {
    let server = RedisServer::start();
    let clock = ManualClock::new(u64::MAX);
    assert_eq!(clock.now_micros(), ManualClock::MAX_MICROS);
    let start = ManualClock::MAX_MICROS - 100_000_000;
    clock.set_micros(start);
    let redis = server.store(Clock::Manual(clock.clone())).await;
    let policies = [
        "3/s",
        "3/s sliding",
        "3/s fixed",
        "3/s log",
        "3/s gcra",
        "3/s bucket",
        "3 concurrent",
    ];
    for store in [memory(&clock), redis.into()] {
        for (i, text) in policies.iter().enumerate() {
            clock.set_micros(start);
            let limiter = Limiter::new(store.clone(), policy(text));
            let id = format!("latest-{i}");
            let mut held = Vec::new();
            for n in 0..5 {
                let decision = limiter.check(&[&id]).await.unwrap();
                assert_eq!(decision.is_allowed(), n < 3, "{text}: check {n}");
                held.push(decision);
            }
            // past every window and lease (100 s), and past the latest time
            clock.advance(Duration::MAX);
            assert_eq!(clock.now_micros(), ManualClock::MAX_MICROS);
            let decision = limiter.check(&[&id]).await.unwrap();
            assert!(decision.is_allowed(), "{text}: after the window");
            assert!(limiter.peek(&[&id]).await.is_ok(), "{text}");
            drop(held);
        }
    }
    clock.set_micros(u64::MAX);
    assert_eq!(clock.now_micros(), ManualClock::MAX_MICROS);
}

//! What operators see of shadow mode and of charging by response: the decision counters
//! through a recording `metrics` recorder, and the bounded log through a capturing `tracing`
//! subscriber. The process has one recorder and one subscriber, so these tests live in a
//! binary of their own, and each uses limiters of its own names.

mod common;
#[path = "common/observed.rs"]
mod observed;

use std::collections::HashMap;
use std::convert::Infallible;

use common::manual_clock;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use observed::{described, log_text, observed};
use tollgate::key::Header;
use tollgate::{Clock, Limiter, MemoryStore, RateLimitLayer};
use tower::{service_fn, Layer, Service, ServiceExt};

/// `tollgate_decisions_total` for `limiter` and `outcome`, summed over its other labels, and
/// by limit.
fn decisions(limiter: &str, outcome: &str) -> (f64, HashMap<String, f64>) {
    let values = observed().metrics.0.lock().unwrap();
    let mut total = 0.0;
    let mut by_limit = HashMap::new();
    for (key, value) in values.iter() {
        let label = |name: &str| {
            key.labels()
                .find(|l| l.key() == name)
                .map(|l| l.value().to_string())
        };
        if key.name() == "tollgate_decisions_total"
            && label("limiter").as_deref() == Some(limiter)
            && label("outcome").as_deref() == Some(outcome)
        {
            total += value;
            *by_limit
                .entry(label("limit").unwrap_or_default())
                .or_insert(0.0) += value;
        }
    }
    (total, by_limit)
}

/// The captured log lines that mention `needle`.
fn log_lines(needle: &str) -> Vec<String> {
    log_text()
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_string)
        .collect()
}

fn memory_limiter(policy: &str, name: &str, shadow: bool) -> Limiter {
    let store = MemoryStore::builder()
        .clock(Clock::Manual(manual_clock()))
        .build();
    Limiter::builder(store, policy.parse().unwrap())
        .name(name)
        .shadow(shadow)
        .build()
}

#[tokio::test]
async fn would_be_denials_are_counted_exactly_apart_from_denials() {
    observed();
    let limiter = memory_limiter("3/min, 10/h", "shadow-exact", true);
    for _ in 0..50 {
        assert!(limiter.check(&["user:1"]).await.unwrap().is_allowed());
    }
    assert_eq!(decisions("shadow-exact", "allowed").0, 3.0);
    let (shadow_denied, by_limit) = decisions("shadow-exact", "shadow_denied");
    assert_eq!(shadow_denied, 47.0);
    assert_eq!(by_limit.get("3/min"), Some(&47.0), "{by_limit:?}");
    assert_eq!(decisions("shadow-exact", "denied").0, 0.0);

    // enforcing, the same limiter counts denials as such
    limiter.set_shadow(false);
    for _ in 0..5 {
        assert!(!limiter.check(&["user:1"]).await.unwrap().is_allowed());
    }
    assert_eq!(decisions("shadow-exact", "denied").0, 5.0);
    assert_eq!(decisions("shadow-exact", "shadow_denied").0, 47.0);
}

#[tokio::test]
async fn each_denial_is_counted_under_the_limit_that_denied_it() {
    observed();
    // the second limit denies: its text labels the denials; an admission has no limit
    let limiter = memory_limiter("10/h, 2/min", "by-limit", false);
    for _ in 0..5 {
        let _ = limiter.check(&["user:1"]).await.unwrap();
    }
    let (allowed, by_limit) = decisions("by-limit", "allowed");
    assert_eq!(allowed, 2.0);
    assert_eq!(by_limit.get(""), Some(&2.0), "{by_limit:?}");
    let (denied, by_limit) = decisions("by-limit", "denied");
    assert_eq!(denied, 3.0);
    assert_eq!(by_limit.get("2/min"), Some(&3.0), "{by_limit:?}");
}

#[tokio::test]
async fn would_be_denials_are_logged_once_per_limiter_per_period() {
    observed();
    let a = memory_limiter("1/min", "shadow-log-a", true);
    let b = memory_limiter("1/min", "shadow-log-b", true);
    for _ in 0..500 {
        assert!(a.check(&["user:1"]).await.unwrap().is_allowed());
        assert!(b.check(&["user:1"]).await.unwrap().is_allowed());
    }
    for name in ["shadow-log-a", "shadow-log-b"] {
        let lines = log_lines(&format!("limiter=\"{name}\""));
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains("shadow mode"), "{}", lines[0]);
        assert!(lines[0].contains("would_deny=1"), "{}", lines[0]);
    }
    assert_eq!(decisions("shadow-log-a", "shadow_denied").0, 499.0);
}

#[tokio::test]
async fn a_shadow_layer_counts_what_it_lets_through() {
    observed();
    let limiter = memory_limiter("2/min", "shadow-layer", false);
    let layer = RateLimitLayer::new(limiter)
        .key(Header::named("x-user").unwrap())
        .shadow(true);
    for _ in 0..7 {
        assert_eq!(status_of(&layer, of_user("a")).await, StatusCode::OK);
    }
    assert_eq!(decisions("shadow-layer", "allowed").0, 2.0);
    assert_eq!(decisions("shadow-layer", "shadow_denied").0, 5.0);
}

/// Requests without a key are counted by what the layer did with them, and logged at a
/// bounded rate: refused as configured, let through as configured, and let through in shadow
/// mode, which refuses nothing, where enforcing would refuse them.
#[tokio::test]
async fn requests_without_a_key_are_counted_and_shadow_mode_lets_them_through() {
    observed();
    let missing = |name: &str, action: &str| {
        observed::metric(
            "tollgate_missing_key_total",
            &[("limiter", name), ("action", action)],
        )
    };
    // (in shadow mode: the layer, or its limiter alone)
    let reject = StatusCode::INTERNAL_SERVER_ERROR;
    for (name, layer_shadow, limiter_shadow, allow, status, action) in [
        ("keyless-reject", false, false, false, reject, "reject"),
        (
            "keyless-shadow",
            true,
            false,
            false,
            StatusCode::OK,
            "shadow",
        ),
        (
            "keyless-shadow-limiter",
            false,
            true,
            false,
            StatusCode::OK,
            "shadow",
        ),
        ("keyless-allow", false, false, true, StatusCode::OK, "allow"),
    ] {
        let mut layer = RateLimitLayer::new(memory_limiter("2/min", name, limiter_shadow))
            .key(Header::named("x-user").unwrap())
            .shadow(layer_shadow);
        if allow {
            layer = layer.on_missing_key(tollgate::layer::MissingKey::Allow);
        }
        let mut svc = layer.layer(service_fn(|_: Request<Full<bytes::Bytes>>| async {
            Ok::<_, Infallible>(Response::new(Full::<bytes::Bytes>::default()))
        }));
        for _ in 0..5 {
            let req = Request::get("/").body(Full::default()).unwrap();
            let res = svc.ready().await.unwrap().call(req).await.unwrap();
            assert_eq!(res.status(), status, "{name}");
        }
        assert_eq!(missing(name, action), 5.0, "{name}");
        let lines = log_lines(&format!("limiter=\"{name}\""));
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains("found no key"), "{}", lines[0]);
        assert!(
            lines[0].contains(if allow { "INFO" } else { "WARN" }),
            "{}",
            lines[0]
        );
    }
}

/// A request without a key on a route with a limiter of its own is counted and logged under
/// that limiter's name, not the default one's.
#[tokio::test]
async fn a_route_request_without_a_key_is_counted_under_the_routes_limiter() {
    observed();
    let missing = |name: &str| {
        observed::metric(
            "tollgate_missing_key_total",
            &[("limiter", name), ("action", "reject")],
        )
    };
    let layer = RateLimitLayer::new(memory_limiter("2/min", "keyless-default", false))
        .key(Header::named("x-user").unwrap())
        .route_replacing(
            |req: &tollgate::key::RequestView<'_>| req.uri.path() == "/login",
            memory_limiter("1/min", "keyless-login", false),
        );
    let req = Request::get("/login").body(Full::default()).unwrap();
    assert_ne!(status_of(&layer, req).await, StatusCode::OK);
    assert_eq!(missing("keyless-login"), 1.0);
    assert_eq!(missing("keyless-default"), 0.0);
    assert_eq!(log_lines("limiter=\"keyless-login\"").len(), 1);
}

/// A request the layer cannot check (a cost of 0 from its cost function) is answered 400, and
/// that is counted under the limiter and logged at a bounded rate, not left unseen.
#[tokio::test]
async fn requests_a_layer_cannot_check_are_counted_and_logged() {
    observed();
    let layer = RateLimitLayer::new(memory_limiter("2/min", "uncheckable", false))
        .key(Header::named("x-user").unwrap())
        .cost(|_| 0);
    for _ in 0..3 {
        assert_eq!(
            status_of(&layer, of_user("a")).await,
            StatusCode::BAD_REQUEST
        );
    }
    let errors = observed::metric(
        "tollgate_check_errors_total",
        &[("limiter", "uncheckable"), ("error", "cost")],
    );
    assert_eq!(errors, 3.0);
    let lines = log_lines("answered requests it could not check");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("status=400"), "{}", lines[0]);
}

/// A denial by the fallback's policy is counted under the limit it stands for, also when
/// limits of the policy scaled to one: `10/min, 11/min, 1/s` at half the fleet falls back to
/// `5/min, 1/s`, and the fallback's second limit is the policy's third.
#[tokio::test]
async fn a_fallback_denial_is_counted_under_the_limit_it_stands_for() {
    observed();
    let dead = common::dead_url();
    let store = tollgate::RedisStore::builder(dead)
        .prefix("fallback-labels")
        .timeout(std::time::Duration::from_millis(100))
        .build_lazy()
        .unwrap();
    let limiter = Limiter::builder(store, "10/min, 11/min, 1/s".parse().unwrap())
        .name("fallback-labels")
        .on_store_error(tollgate::OnStoreError::fallback(0.5).unwrap())
        .build();
    let first = limiter.check(&["user:1"]).await.unwrap();
    assert_eq!(first.origin(), tollgate::Origin::Fallback);
    assert!(first.is_allowed());
    let second = limiter.check(&["user:1"]).await.unwrap();
    assert!(!second.is_allowed());
    assert_eq!(second.would_deny_by().unwrap().limit.to_string(), "1/s");
    let (denied, by_limit) = decisions("fallback-labels", "denied");
    assert_eq!(denied, 1.0);
    assert_eq!(by_limit.get("1/s"), Some(&1.0), "{by_limit:?}");
}

/// A scheduled client layer counts its placements as a limiter counts its checks; in shadow
/// mode every call goes at once, a would-be rejection is counted and logged as one, and a
/// call the enforcing layer would fail (a cost above the burst, a store failing closed) goes
/// too, as a would-be rejection.
#[tokio::test]
async fn a_scheduled_layer_counts_its_placements_and_shadow_mode_refuses_nothing() {
    use tollgate::{KeyedRateLimitLayer, OnStoreError, RateLimited, Scheduler};
    observed();
    let clock = manual_clock();
    let memory = || {
        MemoryStore::builder()
            .clock(Clock::Manual(clock.clone()))
            .build()
    };
    let service = |scheduler: Scheduler, cost: u64, shadow: bool| {
        let ids = move |_: &()| tollgate::service::Identifiers::from((vec!["psp:x".into()], cost));
        KeyedRateLimitLayer::scheduled(scheduler, ids)
            .shadow(shadow)
            .layer(service_fn(|()| async { Ok::<_, Infallible>(()) }))
    };
    // enforcing: one call goes, the next is rejected
    let enforcing = Scheduler::builder(memory(), "1/min".parse().unwrap())
        .name("sched-enforcing")
        .build();
    let mut svc = service(enforcing, 1, false);
    svc.ready().await.unwrap().call(()).await.unwrap();
    let err = svc.ready().await.unwrap().call(()).await.unwrap_err();
    assert!(err.downcast_ref::<RateLimited>().is_some(), "{err}");
    assert_eq!(decisions("sched-enforcing", "allowed").0, 1.0);
    let (denied, by_limit) = decisions("sched-enforcing", "denied");
    assert_eq!(denied, 1.0);
    assert_eq!(by_limit.get("1/min"), Some(&1.0), "{by_limit:?}");

    // in shadow mode: every call goes, would-be rejections counted and logged once
    let trial = Scheduler::builder(memory(), "1/min".parse().unwrap())
        .name("sched-shadow")
        .build();
    let mut svc = service(trial.clone(), 1, true);
    for _ in 0..3 {
        svc.ready().await.unwrap().call(()).await.unwrap();
    }
    assert_eq!(decisions("sched-shadow", "allowed").0, 1.0);
    let (shadow_denied, by_limit) = decisions("sched-shadow", "shadow_denied");
    assert_eq!(shadow_denied, 2.0);
    assert_eq!(by_limit.get("1/min"), Some(&2.0), "{by_limit:?}");
    assert_eq!(decisions("sched-shadow", "denied").0, 0.0);
    let lines = log_lines("limiter=\"sched-shadow\"");
    assert_eq!(lines.len(), 1, "{lines:?}");
    // a cost above the burst: an error when enforcing, a would-be rejection in shadow mode
    let mut svc = service(trial, 2, true);
    svc.ready().await.unwrap().call(()).await.unwrap();
    assert_eq!(decisions("sched-shadow", "shadow_denied").0, 3.0);
    // a store failing closed: the same
    let dead = tollgate::RedisStore::builder(common::dead_url())
        .prefix("sched-dead")
        .build_lazy()
        .unwrap();
    let closed = Scheduler::builder(dead, "1/min".parse().unwrap())
        .name("sched-closed")
        .on_store_error(OnStoreError::Closed)
        .build();
    let mut svc = service(closed.clone(), 1, false);
    let err = svc.ready().await.unwrap().call(()).await.unwrap_err();
    assert!(
        matches!(
            err.downcast_ref::<tollgate::Error>(),
            Some(tollgate::Error::Store(_))
        ),
        "{err}"
    );
    let mut svc = service(closed, 1, true);
    svc.ready().await.unwrap().call(()).await.unwrap();
    assert_eq!(decisions("sched-closed", "shadow_denied").0, 1.0);
}

/// A policy change says which counts start afresh: none when only counts change, the packed
/// key's when a rolling window crosses 1,550 (its counters take another form above it).
#[tokio::test]
async fn a_policy_change_says_which_counts_start_afresh() {
    observed();
    let limiter = memory_limiter("10/min", "policy-afresh", false);
    for _ in 0..8 {
        assert!(limiter.check(&["user:1"]).await.unwrap().is_allowed());
    }
    limiter.set_policy("12/min".parse().unwrap());
    let usage = limiter.usage(&["user:1"]).await.unwrap();
    assert_eq!(usage[0].used, 8, "carried over");
    let lines = log_lines("limiter=\"policy-afresh\"");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("INFO") && lines[0].contains("every count carries over"),
        "{}",
        lines[0]
    );

    let limiter = memory_limiter("10/s, 1000/min", "policy-crossing", false);
    assert!(limiter.check_n(&["user:1"], 10).await.unwrap().is_allowed());
    limiter.set_policy("10/s, 2000/min".parse().unwrap());
    let usage = limiter.usage(&["user:1"]).await.unwrap();
    assert_eq!(usage[0].used, 0, "started afresh: {usage:?}");
    let lines = log_lines("limiter=\"policy-crossing\"");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("WARN") && lines[0].contains("afresh=\"r1s,r1m\""),
        "{}",
        lines[0]
    );
}

/// A scheduler's rejection by its fallback's scaled rate is counted under the rate it stands
/// for, as a limiter's fallback denials are.
#[tokio::test]
async fn a_scheduler_fallback_rejection_is_counted_under_its_rate() {
    observed();
    let dead = tollgate::RedisStore::builder(common::dead_url())
        .prefix("sched-fallback")
        .timeout(std::time::Duration::from_millis(100))
        .build_lazy()
        .unwrap();
    let scheduler = tollgate::Scheduler::builder(dead, "2/min".parse().unwrap())
        .name("sched-fallback")
        .on_store_error(tollgate::OnStoreError::fallback(0.5).unwrap())
        .build();
    let wait = std::time::Duration::ZERO;
    let first = scheduler.schedule("psp:x", wait).await.unwrap();
    assert_eq!(first.origin(), tollgate::Origin::Fallback);
    assert!(first.is_allowed());
    let second = scheduler.schedule("psp:x", wait).await.unwrap();
    assert!(!second.is_allowed());
    let (denied, by_limit) = decisions("sched-fallback", "denied");
    assert_eq!(denied, 1.0);
    assert_eq!(by_limit.get("2/min"), Some(&1.0), "{by_limit:?}");
}

/// A waiting check of a policy with a concurrency limit, which checks again when a slot may
/// have freed, counts one decision for its request, as a check that reserves does: not the
/// denials it waited out.
#[tokio::test(start_paused = true)]
async fn a_waiting_check_of_slots_counts_one_decision() {
    observed();
    let limiter = Limiter::builder(MemoryStore::new(), "1 concurrent".parse().unwrap())
        .name("rechecks")
        .build();
    let held = limiter.check(&["job"]).await.unwrap();
    assert!(held.is_allowed());
    tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        drop(held);
    });
    let waited = limiter
        .check_waiting(&["job"], std::time::Duration::from_secs(3))
        .await
        .unwrap();
    assert!(waited.is_allowed());
    assert_eq!(decisions("rechecks", "allowed").0, 2.0);
    assert_eq!(decisions("rechecks", "denied").0, 0.0);
}

/// A request of user `user` (its `x-user` header).
fn of_user(user: &str) -> Request<Full<bytes::Bytes>> {
    Request::get("/")
        .header("x-user", user)
        .body(Full::default())
        .unwrap()
}

/// The status of `req` sent through `layer` over a service answering `200 OK`.
async fn status_of<L, B>(layer: &L, req: Request<Full<bytes::Bytes>>) -> StatusCode
where
    L: Layer<
        tower::util::BoxCloneService<
            Request<Full<bytes::Bytes>>,
            Response<Full<bytes::Bytes>>,
            Infallible,
        >,
    >,
    L::Service: Service<Request<Full<bytes::Bytes>>, Response = Response<B>>,
    <L::Service as Service<Request<Full<bytes::Bytes>>>>::Error: std::fmt::Debug,
{
    let ok =
        tower::util::BoxCloneService::new(service_fn(|_: Request<Full<bytes::Bytes>>| async {
            Ok::<_, Infallible>(Response::new(Full::new(bytes::Bytes::new())))
        }));
    let mut svc = layer.layer(ok);
    let response = svc.ready().await.unwrap().call(req).await.unwrap();
    response.status()
}

/// A fleet shedder's decisions are counted under its name (`shed:NAME`), not under its
/// policy's text, which shedders of one capacity share.
#[tokio::test]
async fn a_fleet_shedders_decisions_bear_its_name() {
    observed();
    let layer = tollgate::shed::FleetShedder::new(MemoryStore::new(), 1)
        .name("metrics-fleet")
        .build()
        .unwrap();
    assert_eq!(
        status_of(&layer, Request::new(Full::default())).await,
        StatusCode::OK
    );
    assert_eq!(decisions("shed:metrics-fleet", "allowed").0, 1.0);
}

/// The requests a utilization shedder's layer sheds are counted by priority, and logged.
#[tokio::test]
async fn shed_requests_are_counted_and_logged() {
    use tollgate::shed::{Priority, ShedConfig, UtilizationShedLayer, UtilizationShedder};

    observed();
    let clock = manual_clock();
    let shedder =
        UtilizationShedder::new(ShedConfig::default(), || 1.0).clock(Clock::Manual(clock.clone()));
    // full utilization for long enough to shed everything but critical traffic
    for _ in 0..150 {
        shedder.should_shed(Priority::Low);
        clock.advance(std::time::Duration::from_secs(1));
    }
    let shed = |priority: &str| {
        observed::metric(
            "tollgate_shed_total",
            &[("shedder", "utilization"), ("priority", priority)],
        )
    };
    let before = shed("normal");
    let layer = UtilizationShedLayer::new(shedder);
    for _ in 0..3 {
        let status = status_of(&layer, Request::new(Full::default())).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    }
    assert_eq!(shed("normal") - before, 3.0);
    // (this shedder's line: a fleet shedder's test logs the same message)
    let logged = log_text();
    assert!(
        logged
            .lines()
            .any(|l| l.contains("load shedder refused requests")
                && l.contains("shedder=\"utilization\"")),
        "{logged}"
    );
    // a named shedder's, under its name
    let named = UtilizationShedder::new(ShedConfig::default(), || 1.0)
        .clock(Clock::Manual(clock.clone()))
        .name("pool");
    for _ in 0..150 {
        named.should_shed(Priority::Low);
        clock.advance(std::time::Duration::from_secs(1));
    }
    let layer = UtilizationShedLayer::new(named);
    let status = status_of(&layer, Request::new(Full::default())).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let named_sheds = observed::metric(
        "tollgate_shed_total",
        &[("shedder", "utilization:pool"), ("priority", "normal")],
    );
    assert_eq!(named_sheds, 1.0);
    assert_eq!(shed("normal") - before, 3.0, "the unnamed shedder's count");
}

/// A fleet shedder's refusals are counted as sheds, under its name and by the priority its
/// classifier gives, and logged: not only as denials of its limiter.
#[tokio::test]
async fn fleet_sheds_are_counted_and_logged() {
    use tollgate::shed::{FleetShedder, Priority};

    observed();
    let store = MemoryStore::new();
    let layer = FleetShedder::new(store.clone(), 1)
        .name("counted-fleet")
        .reserve_for_critical(0.0)
        .classify(|_| Priority::Low)
        .build()
        .unwrap();
    // the fleet's one slot, held by a limiter sharing its budget (its namespace and key)
    let holder = Limiter::builder(store, "1 concurrent".parse().unwrap())
        .namespace(tollgate::store::Namespace::new("shed").unwrap())
        .build();
    let held = holder.check(&["shed:counted-fleet"]).await.unwrap();
    assert!(held.is_allowed());
    let shed = || {
        observed::metric(
            "tollgate_shed_total",
            &[("shedder", "shed:counted-fleet"), ("priority", "low")],
        )
    };
    let before = shed();
    for _ in 0..2 {
        let status = status_of(&layer, Request::new(Full::default())).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    }
    assert_eq!(shed() - before, 2.0);
    assert!(log_text().contains("shed:counted-fleet"), "{}", log_text());
    drop(held);
    // a fleet shedder failing closed, its store down, sheds: counted as its other refusals
    let dead = tollgate::RedisStore::builder(common::dead_url())
        .timeout(std::time::Duration::from_millis(200))
        .build_lazy()
        .unwrap();
    let closed = FleetShedder::new(dead, 1)
        .name("closed-fleet")
        .classify(|_| Priority::Low)
        .on_store_error(tollgate::OnStoreError::Closed)
        .build()
        .unwrap();
    let status = status_of(&closed, Request::new(Full::default())).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let closed_sheds = observed::metric(
        "tollgate_shed_total",
        &[("shedder", "shed:closed-fleet"), ("priority", "low")],
    );
    assert_eq!(closed_sheds, 1.0);
}

/// Every metric of the table in `src/observe.rs` is described to a recorder installed before
/// the first limiter is built (Prometheus' `HELP` line, and the unit), durations in seconds.
#[test]
fn every_metric_is_described_with_its_unit() {
    observed();
    let _limiter = memory_limiter("5/s", "described", false);
    let table = include_str!("../src/observe.rs");
    let names: Vec<&str> = table
        .lines()
        .filter_map(|line| line.strip_prefix("//! | `")?.split('`').next())
        .collect();
    assert!(names.len() >= 14, "{names:?}");
    for name in names {
        let (unit, help) = described(name).unwrap_or_else(|| panic!("{name} not described"));
        assert!(!help.is_empty(), "{name}");
        let expected = match name.ends_with("_seconds") {
            true => metrics::Unit::Seconds,
            false => metrics::Unit::Count,
        };
        assert_eq!(unit, Some(expected), "{name}");
    }
}

/// A request that came through the proxies but whose forwarding headers give no client is
/// keyed by a proxy's address, as documented, and that is counted by reason and logged:
/// when it is every request, every client shares one quota. A request whose headers agree,
/// or that did not come through the proxies, is not counted.
#[test]
fn client_ip_fallbacks_to_a_proxy_are_counted_and_logged() {
    use std::net::SocketAddr;
    use tollgate::key::{ClientIp, KeyExtractor, RequestView};

    observed();
    let fallbacks = |reason: &str| {
        observed::metric("tollgate_client_ip_fallbacks_total", &[("reason", reason)])
    };
    let key = |extractor: &ClientIp, peer: &str, headers: &[(&str, &str)]| {
        let mut req = Request::new(());
        for (name, value) in headers {
            req.headers_mut().append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        req.extensions_mut()
            .insert(peer.parse::<SocketAddr>().unwrap());
        extractor.extract(&RequestView::of(&req))
    };
    let proxies = ClientIp::trusted_proxies(["10.0.0.0/8".parse().unwrap()]);
    let two_hops = ClientIp::hops(2);
    let before = ["headers_disagree", "not_an_address", "too_few_hops"].map(fallbacks);

    // headers that agree, and a request straight from a client: the client, nothing counted
    let agree = [
        ("x-forwarded-for", "203.0.113.7"),
        ("x-real-ip", "203.0.113.7"),
    ];
    let found = key(&proxies, "10.0.0.2:4000", &agree);
    assert_eq!(found.as_deref(), Some("ip:203.0.113.7"));
    let direct = key(&proxies, "198.51.100.1:4000", &agree);
    assert_eq!(direct.as_deref(), Some("ip:198.51.100.1"));
    assert_eq!(
        key(&two_hops, "10.0.0.2:4000", &[]).as_deref(),
        Some("ip:10.0.0.2")
    );
    let after = ["headers_disagree", "not_an_address", "too_few_hops"].map(fallbacks);
    assert_eq!(after, before, "nothing fell back");

    // a second proxy set X-Real-IP to the first one's address: every client is the proxy
    let disagree = [
        ("x-forwarded-for", "203.0.113.7"),
        ("x-real-ip", "10.0.0.1"),
    ];
    let proxy = key(&proxies, "10.0.0.2:4000", &disagree);
    assert_eq!(proxy.as_deref(), Some("ip:10.0.0.2"));
    assert_eq!(fallbacks("headers_disagree") - before[0], 1.0);
    // a proxy that hides the client
    let hidden = key(&proxies, "10.0.0.2:4000", &[("forwarded", "for=unknown")]);
    assert_eq!(hidden.as_deref(), Some("ip:10.0.0.2"));
    assert_eq!(fallbacks("not_an_address") - before[1], 1.0);
    // one proxy of the two appended
    let short = key(
        &two_hops,
        "10.0.0.2:4000",
        &[("x-forwarded-for", "203.0.113.7")],
    );
    assert_eq!(short.as_deref(), Some("ip:10.0.0.2"));
    assert_eq!(fallbacks("too_few_hops") - before[2], 1.0);
    // one request, one count: two headers hiding the client alike, or one hiding it and the
    // other naming it (they disagree), count once
    let both_hidden = [("forwarded", "for=unknown"), ("x-forwarded-for", "unknown")];
    let hidden = key(&proxies, "10.0.0.2:4000", &both_hidden);
    assert_eq!(hidden.as_deref(), Some("ip:10.0.0.2"));
    let hidden_named = [
        ("forwarded", "for=unknown"),
        ("x-forwarded-for", "203.0.113.7"),
    ];
    let proxy = key(&proxies, "10.0.0.2:4000", &hidden_named);
    assert_eq!(proxy.as_deref(), Some("ip:10.0.0.2"));
    let after = ["headers_disagree", "not_an_address", "too_few_hops"].map(fallbacks);
    assert_eq!(
        after.map(|n| n as i64),
        [before[0] + 2.0, before[1] + 2.0, before[2] + 1.0].map(|n| n as i64)
    );
    // an X-Real-IP that hides the client, or is repeated (one not overwritten by the proxy)
    for real_ip in [
        &[("x-real-ip", "unknown")][..],
        &[("x-real-ip", "203.0.113.7"); 2],
    ] {
        let hidden = key(&proxies, "10.0.0.2:4000", real_ip);
        assert_eq!(hidden.as_deref(), Some("ip:10.0.0.2"), "{real_ip:?}");
    }
    assert_eq!(fallbacks("not_an_address") - before[1], 4.0);

    assert!(
        log_text().contains("client IP not found in the forwarding headers"),
        "{}",
        log_text()
    );
}

/// A utilization reading that is not a fraction (a percentage, a negative, NaN from a failing
/// source) is clamped, as documented, and said in a warning: the shedder's decisions then
/// rest on a figure its source did not mean. A fraction is not.
#[test]
fn utilization_readings_out_of_range_are_warned_about() {
    use tollgate::shed::{ShedConfig, UtilizationShedder};

    observed();
    let warned = || log_lines("utilization reading is not a fraction").len();
    let shedder = UtilizationShedder::new(ShedConfig::default(), || 0.5);
    let before = warned();
    for fraction in [0.0, 0.45, 1.0] {
        shedder.update(fraction);
    }
    assert_eq!(warned(), before, "fractions are not warned about");
    shedder.update(45.0);
    assert_eq!(warned(), before + 1, "{}", log_text());
    assert!(log_text().contains("reading=45"), "{}", log_text());
    // at most a line every 10 s, counting the readings since
    shedder.update(f64::NAN);
    shedder.update(-0.2);
    assert_eq!(warned(), before + 1);
}

/// A layer keyed by the peer's address and a user, on a server that records no peer
/// address: a request with a user is checked by the user alone — the address's limit lost
/// for it — and that is counted (`action="partial"`) and logged; a request with both keys is
/// not, and one with neither is a request without a key.
#[tokio::test]
async fn requests_checked_without_their_address_are_counted_and_logged() {
    use std::net::SocketAddr;
    use tollgate::key::PeerIp;

    observed();
    let name = "no-address";
    let missing = |action: &str| {
        observed::metric(
            "tollgate_missing_key_total",
            &[("limiter", name), ("action", action)],
        )
    };
    let layer = RateLimitLayer::new(memory_limiter("100/min", name, false))
        .key(PeerIp::new())
        .key(Header::named("x-user").unwrap());
    let with_peer = || {
        let mut req = of_user("u1");
        req.extensions_mut()
            .insert("192.0.2.1:4000".parse::<SocketAddr>().unwrap());
        req
    };
    assert_eq!(status_of(&layer, with_peer()).await, StatusCode::OK);
    assert_eq!(missing("partial"), 0.0, "both keys found");
    for _ in 0..3 {
        assert_eq!(status_of(&layer, of_user("u1")).await, StatusCode::OK);
    }
    assert_eq!(missing("partial"), 3.0);
    let lines = log_lines(&format!("limiter=\"{name}\""));
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("found no peer address"), "{}", lines[0]);
    let none = Request::get("/").body(Full::default()).unwrap();
    let status = status_of(&layer, none).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!((missing("partial"), missing("reject")), (3.0, 1.0));
}

/// A layer charging by response whose limits no longer admit a response's charge (another
/// request was charged between its peek and its response) serves that request over the
/// limit, as documented, and counts and logs it.
#[tokio::test]
async fn charges_the_limits_no_longer_admit_are_counted_and_logged() {
    observed();
    let name = "refused-charges";
    let refused = || observed::metric("tollgate_charges_refused_total", &[("limiter", name)]);
    let layer = RateLimitLayer::new(memory_limiter("1/min", name, false))
        .key(Header::named("x-user").unwrap())
        .charge_if(|_: &http::response::Parts| true);
    // the handler holds each request until both are in it: both passed the peek
    let (open, gate) = tokio::sync::watch::channel(false);
    let inside = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let handler = {
        let inside = inside.clone();
        service_fn(move |_: Request<Full<bytes::Bytes>>| {
            let (mut gate, inside) = (gate.clone(), inside.clone());
            async move {
                inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                gate.wait_for(|open| *open).await.unwrap();
                Ok::<_, Infallible>(Response::new(Full::<bytes::Bytes>::default()))
            }
        })
    };
    let svc = layer.layer(handler);
    let before = refused();
    let calls: Vec<_> = (0..2)
        .map(|_| tokio::spawn(svc.clone().oneshot(of_user("u-charged"))))
        .collect();
    while inside.load(std::sync::atomic::Ordering::SeqCst) < 2 {
        tokio::task::yield_now().await;
    }
    open.send(true).unwrap();
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    assert_eq!(refused() - before, 1.0, "one of the two charges fits 1/min");
    let lines = log_lines(&format!("limiter=\"{name}\""));
    assert!(
        lines.iter().any(|l| l.contains("no longer admitted")),
        "{lines:?}"
    );
}

/// A waiting check of slots given up on while it waits (a client gone, a deadline of its
/// own) counts one decision too: the denial it had last.
#[tokio::test(start_paused = true)]
async fn a_waiting_check_of_slots_given_up_on_counts_its_denial() {
    observed();
    let limiter = Limiter::builder(MemoryStore::new(), "1 concurrent".parse().unwrap())
        .name("gave-up-waiting")
        .build();
    let held = limiter.check(&["job"]).await.unwrap();
    assert!(held.is_allowed());
    let wait = limiter.check_waiting(&["job"], std::time::Duration::from_secs(3));
    let gave_up = tokio::time::timeout(std::time::Duration::from_millis(200), wait).await;
    assert!(
        gave_up.is_err(),
        "answered while the slot was held: {gave_up:?}"
    );
    assert_eq!(decisions("gave-up-waiting", "allowed").0, 1.0);
    assert_eq!(decisions("gave-up-waiting", "denied").0, 1.0);
    drop(held);
}

/// The same when it is given up on during one of its checks rather than between them: here,
/// a check it makes again that a silent Redis leaves unanswered.
#[tokio::test]
async fn a_waiting_check_of_slots_given_up_on_mid_check_counts_its_denial() {
    observed();
    let server = common::RedisServer::start();
    let proxy = common::Proxy::start(server.port).await;
    let store = tollgate::RedisStore::builder(proxy.url())
        .timeout(std::time::Duration::from_secs(3))
        .build()
        .await
        .unwrap();
    let limiter = Limiter::builder(store, "1 concurrent".parse().unwrap())
        .name("gave-up-mid-check")
        .build();
    let held = limiter.check(&["job"]).await.unwrap();
    assert!(held.is_allowed());
    let wait = limiter.check_waiting(&["job"], std::time::Duration::from_secs(10));
    let freeze = async {
        // Its first check is answered (denied), the ones it makes again stop answering: given
        // up on half a second later, it is in one of them (it waits at most 100 ms between).
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        proxy.freeze(true);
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    };
    tokio::select! {
        answer = wait => panic!("answered while the slot was held: {answer:?}"),
        () = freeze => {}
    }
    proxy.freeze(false);
    assert_eq!(decisions("gave-up-mid-check", "allowed").0, 1.0);
    assert_eq!(decisions("gave-up-mid-check", "denied").0, 1.0);
    drop(held);
}

/// A fallback that holds a limit at a count of 1, above the process's share of it, says so
/// where the limiter (or scheduler) is built: while the store fails, the fleet would admit
/// more than the limit.
#[test]
fn a_fallback_held_above_its_share_is_warned_about() {
    use tollgate::{OnStoreError, Scheduler};
    observed();
    let tenth = OnStoreError::fallback(0.1).unwrap();
    let lines = |name: &str| {
        log_text()
            .lines()
            .filter(|l| l.contains("fallback holds a limit at a count of 1"))
            .filter(|l| l.contains(&format!("limiter=\"{name}\"")))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    // 5/min at a tenth is half a request a minute: held at 1; 100/h at a tenth is 10
    let _held = Limiter::builder(MemoryStore::new(), "5/min, 100/h".parse().unwrap())
        .name("fallback-raised")
        .on_store_error(tenth)
        .build();
    let held = lines("fallback-raised");
    assert_eq!(held.len(), 1, "{held:?}");
    assert!(held[0].contains("limit=5/min"), "{held:?}");
    let _fine = Limiter::builder(MemoryStore::new(), "50/min".parse().unwrap())
        .name("fallback-fine")
        .on_store_error(tenth)
        .build();
    assert!(lines("fallback-fine").is_empty());
    let _scheduler = Scheduler::builder(MemoryStore::new(), "2/s".parse().unwrap())
        .name("fallback-scheduler")
        .on_store_error(tenth)
        .build();
    assert_eq!(lines("fallback-scheduler").len(), 1);
}

//! The keyed layer around services that are not HTTP servers: an outbound client.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use tollgate::{KeyedRateLimitLayer, Limiter, MemoryStore, RateLimited};
use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};

#[derive(Debug)]
struct Charge {
    provider: &'static str,
    cents: u64,
}

async fn provider(charge: Charge) -> Result<String, Infallible> {
    Ok(format!("charged {} at {}", charge.cents, charge.provider))
}

#[tokio::test]
async fn a_limited_call_fails_with_a_downcastable_error() {
    let limiter = Limiter::new(MemoryStore::new(), "2/min".parse().unwrap());
    let svc = ServiceBuilder::new()
        .layer(KeyedRateLimitLayer::new(limiter, |c: &Charge| {
            format!("psp:{}", c.provider).into()
        }))
        .service(service_fn(provider));
    for cents in [100, 200] {
        let out = svc
            .clone()
            .oneshot(Charge {
                provider: "acme",
                cents,
            })
            .await
            .unwrap();
        assert_eq!(out, format!("charged {cents} at acme"));
    }
    let err: BoxError = svc
        .clone()
        .oneshot(Charge {
            provider: "acme",
            cents: 300,
        })
        .await
        .unwrap_err();
    let limited = err
        .downcast_ref::<RateLimited>()
        .expect("a RateLimited error");
    assert!(limited.retry_after() > Duration::ZERO);
    assert!(!limited.decision().is_allowed());
    assert!(limited.to_string().contains("2/min"), "{limited}");
    // another provider has its own budget
    svc.oneshot(Charge {
        provider: "other",
        cents: 1,
    })
    .await
    .unwrap();
}

/// The inner service's own errors pass through unchanged (boxed).
#[tokio::test]
async fn inner_errors_pass_through() {
    #[derive(Debug)]
    struct Declined;
    impl std::fmt::Display for Declined {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("card declined")
        }
    }
    impl std::error::Error for Declined {}

    let limiter = Limiter::new(MemoryStore::new(), "5/min".parse().unwrap());
    let svc = ServiceBuilder::new()
        .layer(KeyedRateLimitLayer::new(limiter, |_: &Charge| "psp".into()))
        .service(service_fn(|_c: Charge| async {
            Err::<String, _>(Declined)
        }));
    let err = svc
        .oneshot(Charge {
            provider: "x",
            cents: 1,
        })
        .await
        .unwrap_err();
    assert!(err.downcast_ref::<Declined>().is_some());
}

/// With `wait_up_to`, a call waits for the limit instead of failing: the provider sees a
/// paced stream (seed 000's throttling), and calls that would wait too long still fail fast.
#[tokio::test]
async fn calls_can_wait_for_their_turn() {
    let limiter = Limiter::new(MemoryStore::new(), "2/300ms log".parse().unwrap());
    let svc = ServiceBuilder::new()
        .layer(
            KeyedRateLimitLayer::new(limiter.clone(), |_: &Charge| "psp".into())
                .wait_up_to(Duration::from_secs(2)),
        )
        .service(service_fn(provider));
    let started = Instant::now();
    for cents in 0..6 {
        svc.clone()
            .oneshot(Charge {
                provider: "p",
                cents,
            })
            .await
            .unwrap();
    }
    // six calls at two per 300 ms: the last two had to wait for two windows
    assert!(
        started.elapsed() >= Duration::from_millis(550),
        "{:?}",
        started.elapsed()
    );

    let impatient = ServiceBuilder::new()
        .layer(
            KeyedRateLimitLayer::new(limiter, |_: &Charge| "psp".into())
                .wait_up_to(Duration::from_millis(10)),
        )
        .service(service_fn(provider));
    let err = impatient
        .oneshot(Charge {
            provider: "p",
            cents: 9,
        })
        .await
        .unwrap_err();
    assert!(err.is::<RateLimited>());
}

/// A cost that can never fit is an error of its own, not a rate limit.
#[tokio::test]
async fn impossible_costs_are_errors() {
    let limiter = Limiter::new(MemoryStore::new(), "10/s".parse().unwrap());
    let svc = ServiceBuilder::new()
        .layer(KeyedRateLimitLayer::new(limiter, |c: &Charge| {
            (vec!["psp".to_string()], c.cents).into()
        }))
        .service(service_fn(provider));
    let err = svc
        .oneshot(Charge {
            provider: "p",
            cents: 11,
        })
        .await
        .unwrap_err();
    assert!(matches!(
        err.downcast_ref::<tollgate::Error>(),
        Some(tollgate::Error::Cost { cost: 11, max: 10 })
    ));
}

/// A call waiting for its turn does not hold the inner service's readiness: behind a
/// concurrency limit of one, another key's call goes ahead of it.
#[tokio::test]
async fn a_waiting_call_does_not_block_others() {
    let limiter = Limiter::new(MemoryStore::new(), "1/400ms log".parse().unwrap());
    let svc = ServiceBuilder::new()
        .layer(
            KeyedRateLimitLayer::new(limiter, |c: &Charge| c.provider.into())
                .wait_up_to(Duration::from_secs(2)),
        )
        .concurrency_limit(1)
        .service(service_fn(provider));
    // spend "busy"'s budget, so that its next call waits ~400 ms
    svc.clone()
        .oneshot(Charge {
            provider: "busy",
            cents: 1,
        })
        .await
        .unwrap();
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let waiting = {
        let (svc, order) = (svc.clone(), order.clone());
        tokio::spawn(async move {
            svc.oneshot(Charge {
                provider: "busy",
                cents: 2,
            })
            .await
            .unwrap();
            order.lock().unwrap().push("busy");
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    svc.oneshot(Charge {
        provider: "idle",
        cents: 3,
    })
    .await
    .unwrap();
    order.lock().unwrap().push("idle");
    waiting.await.unwrap();
    assert_eq!(*order.lock().unwrap(), ["idle", "busy"]);
}

/// A service that is not `Send` (state in an `Rc`, run on one thread), keyed by a closure
/// that is not either: the layer asks neither to be.
#[tokio::test]
async fn a_service_that_is_not_send_is_limited() {
    use std::rc::Rc;

    let calls = Rc::new(std::cell::Cell::new(0));
    let counted = calls.clone();
    let service = service_fn(move |charge: Charge| {
        counted.set(counted.get() + 1);
        provider(charge)
    });
    let prefix = Rc::new("psp:".to_string());
    let limiter = Limiter::new(MemoryStore::new(), "1/min".parse().unwrap());
    let svc = ServiceBuilder::new()
        .layer(KeyedRateLimitLayer::new(limiter, move |c: &Charge| {
            format!("{prefix}{}", c.provider).into()
        }))
        .service(service);
    let charge = || Charge {
        provider: "acme",
        cents: 1,
    };
    assert!(svc.clone().oneshot(charge()).await.is_ok());
    let err = svc.clone().oneshot(charge()).await.unwrap_err();
    assert!(err.is::<RateLimited>(), "{err}");
    assert_eq!(calls.get(), 1);
}

/// A closure that returns `Identifiers::none()` lets the call through unlimited, unchecked and
/// uncounted; one that returns an empty list by mistake fails the call.
#[tokio::test]
async fn calls_identified_by_none_pass_unlimited() {
    use tollgate::service::Identifiers;
    let limiter = Limiter::new(MemoryStore::new(), "1/min".parse().unwrap());
    let svc = ServiceBuilder::new()
        .layer(KeyedRateLimitLayer::new(limiter, |c: &Charge| {
            match c.provider {
                "internal" => Identifiers::none(),
                "nobody" => Vec::<String>::new().into(),
                provider => Identifiers::new([format!("psp:{provider}")], c.cents),
            }
        }))
        .service(service_fn(provider));
    let call = |provider, cents| svc.clone().oneshot(Charge { provider, cents });
    for _ in 0..5 {
        call("internal", 1).await.unwrap();
    }
    let err = call("nobody", 1).await.unwrap_err();
    assert!(
        matches!(err.downcast_ref(), Some(tollgate::Error::NoIdentifiers)),
        "{err}"
    );
    call("acme", 1).await.unwrap();
    let err = call("acme", 1).await.unwrap_err();
    assert!(err.downcast_ref::<RateLimited>().is_some(), "{err}");
}

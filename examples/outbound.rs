//! Calling a third party that rate-limits us (seed 001's payment providers): every process of
//! the fleet shares one budget per provider through Redis (or one process, in memory), and a
//! call waits for its turn instead of collecting a 429 from the provider.
//!
//! ```text
//! cargo run --example outbound                         # in memory
//! cargo run --example outbound -- redis://127.0.0.1/   # a budget shared by the fleet
//! ```

use std::convert::Infallible;
use std::time::{Duration, Instant};

use tollgate::{KeyedRateLimitLayer, Limiter, MemoryStore, RateLimited, RedisStore, Store};
use tower::{service_fn, ServiceBuilder, ServiceExt};

#[derive(Debug)]
struct Charge {
    provider: &'static str,
    cents: u64,
}

/// Stands in for the HTTP client of a payment provider.
async fn call_provider(charge: Charge) -> Result<String, Infallible> {
    Ok(format!(
        "{} charged {} cents",
        charge.provider, charge.cents
    ))
}

#[tokio::main]
async fn main() -> Result<(), tower::BoxError> {
    let store: Store = match std::env::args().nth(1) {
        Some(url) => RedisStore::connect(url).await?.into(),
        None => MemoryStore::new().into(),
    };
    // The provider's documented limit: 5 calls per second, exact rolling window.
    let limiter = Limiter::new(store, "5/s log".parse()?);
    let client = ServiceBuilder::new()
        .layer(
            KeyedRateLimitLayer::new(limiter, |c: &Charge| format!("psp:{}", c.provider).into())
                .wait_up_to(Duration::from_secs(3)),
        )
        .service(service_fn(call_provider));

    let start = Instant::now();
    for cents in 1..=12 {
        match client
            .clone()
            .oneshot(Charge {
                provider: "acme-pay",
                cents,
            })
            .await
        {
            Ok(done) => println!("{:>6.3}s  {done}", start.elapsed().as_secs_f64()),
            Err(e) => match e.downcast_ref::<RateLimited>() {
                Some(limited) => println!("gave up: {limited}"),
                None => return Err(e),
            },
        }
    }
    Ok(())
}

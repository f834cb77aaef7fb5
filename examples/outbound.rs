//! Calling a third party that limits us (a payment provider allowing 4 calls a second):
//! every call waits for its own slot, and every process sharing one Redis shares the slots.
//!
//! ```text
//! cargo run --example outbound                                  # in memory, 4/s, 12 calls
//! cargo run --example outbound -- --redis redis://127.0.0.1/ --rate 4/s --events 20 \
//!     --max-wait 3s --label A
//! ```
//!
//! Run it in two or three terminals at once against one Redis (`--label A`, `--label B`…):
//! the `start_ms` of all of them together are one interval apart, and the calls whose slot
//! lies further ahead than `--max-wait` are `rejected` at once. Each line is
//! `LABEL-<n> start_ms=<unix ms>` or `LABEL-<n> rejected`.

mod report;

use std::convert::Infallible;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tollgate::{KeyedRateLimitLayer, MemoryStore, RateLimited, RedisStore, Scheduler, Store};
use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};

/// What to run, from the command line.
struct Args {
    redis: Option<String>,
    rate: String,
    events: usize,
    max_wait: Duration,
    label: String,
}

/// The arguments; `None` for `--help`.
fn parse_args() -> Result<Option<Args>, BoxError> {
    let mut args = Args {
        redis: None,
        rate: "4/s".into(),
        events: 12,
        max_wait: Duration::from_secs(3),
        label: "A".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            return Ok(None);
        }
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {value}: {e}");
        match flag.as_str() {
            "--redis" => args.redis = Some(value),
            "--rate" => args.rate = value,
            "--events" => args.events = value.parse().map_err(|e| bad(&e))?,
            "--max-wait" => args.max_wait = parse_duration(&value).map_err(|e| bad(&e))?,
            "--label" => args.label = value,
            other => return Err(format!("unknown flag {other} (see --help)").into()),
        }
    }
    Ok(Some(args))
}

const USAGE: &str = "usage: outbound [--redis URL] [--rate 4/s] [--events 12] \
    [--max-wait 3s|500ms] [--label A]";

/// `3s`, `500ms` or a number of seconds.
fn parse_duration(text: &str) -> Result<Duration, BoxError> {
    Ok(match text.strip_suffix("ms") {
        Some(ms) => Duration::from_millis(ms.parse()?),
        None => Duration::try_from_secs_f64(text.trim_end_matches('s').parse()?)?,
    })
}

/// One call to the provider.
struct Charge {
    provider: &'static str,
    n: usize,
}

/// Stands in for the provider's HTTP client: says when the call went out.
async fn call_provider(charge: Charge) -> Result<String, Infallible> {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    Ok(format!("{} start_ms={ms}", charge.n))
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => report::failure(&*e),
    }
}

async fn run() -> Result<(), BoxError> {
    let Some(args) = parse_args()? else {
        println!("{USAGE}");
        return Ok(());
    };
    let store: Store = match &args.redis {
        Some(url) => RedisStore::connect(url.clone()).await?.into(),
        None => MemoryStore::new().into(),
    };
    // One queue per provider, paced to its rate, shared by every process on the same Redis.
    let scheduler = Scheduler::new(store, args.rate.parse()?);
    let client = ServiceBuilder::new()
        .layer(
            KeyedRateLimitLayer::scheduled(scheduler, |c: &Charge| {
                format!("psp:{}", c.provider).into()
            })
            .wait_up_to(args.max_wait),
        )
        .service(service_fn(call_provider));

    // Every call at once: the scheduler orders them.
    let calls: Vec<_> = (1..=args.events)
        .map(|n| {
            let call = client.clone().oneshot(Charge {
                provider: "acme-pay",
                n,
            });
            tokio::spawn(call)
        })
        .collect();
    for (n, call) in (1..=args.events).zip(calls) {
        match call.await? {
            Ok(started) => println!("{}-{started}", args.label),
            Err(e) if e.is::<RateLimited>() => println!("{}-{n} rejected", args.label),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

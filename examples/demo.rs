//! Drives a burst of traffic through a limiter and prints, per tenth of a second, how many
//! requests were admitted and how many were limited, by which limit.
//!
//! ```text
//! cargo run --example demo                                  # in-memory store
//! cargo run --example demo -- --redis redis://127.0.0.1/    # Redis store
//! cargo run --example demo -- --policy "5/s log, 20/min"    # another policy
//! ```

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use tollgate::{Limiter, MemoryStore, Policy, RedisStore, Store};

const USAGE: &str = "usage: demo [--redis URL] [--policy TEXT] [--seconds N] [--rate PER_SECOND]";

struct Args {
    redis: Option<String>,
    policy: String,
    seconds: u64,
    rate: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        redis: None,
        policy: "10/s, 120/min, 240/h".into(),
        seconds: 3,
        rate: 40,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
        };
        match flag.as_str() {
            "--redis" => args.redis = Some(value()?),
            "--policy" => args.policy = value()?,
            "--seconds" => {
                args.seconds = value()?.parse().map_err(|e| format!("--seconds: {e}"))?
            }
            "--rate" => args.rate = value()?.parse().map_err(|e| format!("--rate: {e}"))?,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    if args.rate == 0 || args.rate > 100_000 {
        return Err("--rate must be between 1 and 100000".into());
    }
    Ok(args)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let policy: Policy = match args.policy.parse() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let store: Store = match &args.redis {
        None => MemoryStore::new().into(),
        Some(url) => match RedisStore::connect(url.clone()).await {
            Ok(s) => s.into(),
            Err(e) => {
                eprintln!("cannot use Redis at {url}: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let backend = if args.redis.is_some() {
        "redis"
    } else {
        "memory"
    };
    let limiter = Limiter::new(store, policy.clone());
    // A fresh client identity per run, so repeated runs against one Redis start clean.
    let client = format!("demo:{}", std::process::id());

    println!(
        "policy {policy} | store {backend} | {} requests/s for {} s from one client\n",
        args.rate, args.seconds
    );
    println!(
        "{:>6}  {:>8}  {:>7}  limited by",
        "time", "admitted", "limited"
    );
    let interval = Duration::from_secs(1) / args.rate as u32;
    let start = Instant::now();
    let mut ticker = tokio::time::interval(interval);
    let slices = args.seconds * 10;
    let (mut total_ok, mut total_limited) = (0u64, 0u64);
    for slice in 0..slices {
        let (mut ok, mut limited) = (0u64, 0u64);
        let mut by: BTreeMap<String, u64> = BTreeMap::new();
        let end = start + Duration::from_millis(100 * (slice + 1));
        while Instant::now() < end {
            ticker.tick().await;
            match limiter.check(&[&client]).await {
                Ok(d) if d.is_allowed() => ok += 1,
                Ok(d) => {
                    limited += 1;
                    if let Some(s) = d.denied_by() {
                        *by.entry(s.limit.to_string()).or_default() += 1;
                    }
                }
                Err(e) => {
                    eprintln!("check failed: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        total_ok += ok;
        total_limited += limited;
        let by: Vec<String> = by.iter().map(|(l, n)| format!("{l} ×{n}")).collect();
        println!(
            "{:>5.1}s  {ok:>8}  {limited:>7}  {}",
            (slice + 1) as f64 / 10.0,
            by.join(", ")
        );
    }
    println!("\ntotal: {total_ok} admitted, {total_limited} limited");
    ExitCode::SUCCESS
}

//! tollgate's demo: an axum server behind a `RateLimitLayer`.
//!
//! ```text
//! cargo run --example demo -- [--chart] [--serve] [--listen ADDR] [--redis URL]
//!     [--policy TEXT] [--key ip|header:NAME]... [--concurrency N] [--seconds N] [--rate N]
//!     [--on-store-error open|closed|fallback[:SHARE]] [--store-timeout MS]
//! ```
//!
//! Without `--serve`: starts the server on an ephemeral port (in-memory store, or Redis with
//! `--redis`), drives a burst of traffic at it over HTTP, prints per second how many requests
//! were admitted and how many limited, by which limit, then the rate-limit fields of the last
//! `429`, and exits.
//!
//! With `--chart`: the same traffic, drawn live in the terminal — admitted and limited per
//! second over the last minute, and the fields of the last `429` — until `q` (or for
//! `--seconds`, when given). `+` and `-` change the rate.
//!
//! With `--serve`: serves on `--listen` (default 127.0.0.1:3000) until killed. `GET /` answers
//! `ok`; `GET /slow?ms=N` answers after N ms. Try `curl -i localhost:3000/` a few times in a
//! row, or `--concurrency 2` and three `curl localhost:3000/slow?ms=5000 &` at once.
//!
//! `--redis` takes any URL the store takes: `redis://127.0.0.1/`,
//! `redis+sentinel://127.0.0.1:26379/mymaster`, `redis+cluster://127.0.0.1:7000` (a Redis
//! Cluster, through any of its nodes). `--key` may be given several times: each request is then
//! checked for every identifier at once, all-or-nothing (`--key ip --key header:x-user` limits
//! the client IP and the user together; on a cluster, the two usually live in different hash
//! slots, so each check runs one call per slot). The demo's client sends `demo-client` in every
//! header named by a `--key`.
//!
//! With `--redis`, stop Redis while the demo runs (with `--serve`, `--chart`, or a longer
//! `--seconds`; Redis must answer when it starts): the store's warnings go to stderr, and
//! `--on-store-error` decides what requests get meanwhile (`open`: allowed, `closed`: 503,
//! `fallback:0.5`: half the policy, counted in this process).
//!
//! `--concurrency N` adds a limit of N requests in flight; the demo's own client sends one
//! request at a time, so it shows with `--serve` and requests of your own (see above).

mod chart;

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::Query;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tollgate::key::{Header, PeerIp};
use tollgate::{
    Limit, Limiter, MemoryStore, OnStoreError, Policy, RateLimitLayer, RedisStore, Store,
};

const USAGE: &str =
    "usage: demo [--chart] [--serve] [--listen ADDR] [--redis URL] [--policy TEXT] \
[--key ip|header:NAME]... [--concurrency N] [--seconds N] [--rate PER_SECOND] \
[--on-store-error open|closed|fallback[:SHARE]] [--store-timeout MS]";

struct Args {
    serve: bool,
    chart: bool,
    listen: SocketAddr,
    redis: Option<String>,
    policy: Policy,
    /// The key extractors, checked together (the peer IP when none is given).
    keys: Vec<Key>,
    seconds: u64,
    /// Whether `--seconds` was given (a chart runs until `q` otherwise).
    seconds_given: bool,
    rate: u32,
    on_error: OnStoreError,
    store_timeout: Option<Duration>,
}

#[derive(Clone)]
enum Key {
    Ip,
    Header(Header, String),
}

/// The arguments; `None` for `--help`.
fn parse_args() -> Result<Option<Args>, String> {
    let mut args = Args {
        serve: false,
        chart: false,
        listen: SocketAddr::from(([127, 0, 0, 1], 3000)),
        redis: None,
        policy: "10/s, 120/min, 240/h".parse().map_err(|e| format!("{e}"))?,
        keys: Vec::new(),
        seconds: 4,
        seconds_given: false,
        rate: 40,
        on_error: OnStoreError::Open,
        store_timeout: None,
    };
    let mut concurrency = None;
    let mut listen_given = false;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--serve" => args.serve = true,
            "--chart" => args.chart = true,
            "--listen" => {
                args.listen = value()?.parse().map_err(|e| format!("--listen: {e}"))?;
                listen_given = true;
            }
            "--redis" => args.redis = Some(value()?),
            "--policy" => args.policy = value()?.parse().map_err(|e| format!("--policy: {e}"))?,
            "--key" => {
                let v = value()?;
                let key = match v.split_once(':') {
                    None if v == "ip" => Key::Ip,
                    Some(("header", name)) => Key::Header(
                        Header::named(name).map_err(|e| format!("--key {v}: {e}"))?,
                        name.to_string(),
                    ),
                    _ => return Err(format!("--key {v}: expected ip or header:NAME")),
                };
                args.keys.push(key);
            }
            "--concurrency" => {
                let n: u64 = value()?
                    .parse()
                    .map_err(|e| format!("--concurrency: {e}"))?;
                let slots = Limit::concurrent(n).map_err(|e| format!("--concurrency: {e}"))?;
                concurrency = Some(slots);
            }
            "--seconds" => {
                args.seconds = value()?.parse().map_err(|e| format!("--seconds: {e}"))?;
                args.seconds_given = true;
            }
            "--rate" => args.rate = value()?.parse().map_err(|e| format!("--rate: {e}"))?,
            "--on-store-error" => {
                let v = value()?;
                args.on_error = match v.split_once(':') {
                    None if v == "open" => OnStoreError::Open,
                    None if v == "closed" => OnStoreError::Closed,
                    None if v == "fallback" => OnStoreError::fallback(1.0).ok_or("share")?,
                    Some(("fallback", share)) => share
                        .parse()
                        .ok()
                        .and_then(OnStoreError::fallback)
                        .ok_or_else(|| format!("--on-store-error {v}: a share in (0, 1]"))?,
                    _ => {
                        return Err(format!(
                            "--on-store-error {v}: expected open, closed or fallback[:SHARE]"
                        ))
                    }
                };
            }
            "--store-timeout" => {
                let ms: u64 = value()?
                    .parse()
                    .map_err(|e| format!("--store-timeout: {e}"))?;
                args.store_timeout = Some(Duration::from_millis(ms));
            }
            "-h" | "--help" => return Ok(None),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if args.rate == 0 || args.rate > 10_000 {
        return Err("--rate must be between 1 and 10000".into());
    }
    // options that would otherwise be ignored without a word
    if args.store_timeout.is_some() && args.redis.is_none() {
        return Err("--store-timeout applies to --redis only".into());
    }
    if listen_given && !args.serve {
        return Err("--listen applies to --serve only (the burst uses an ephemeral port)".into());
    }
    if args.chart && args.serve {
        return Err("--chart and --serve are two ways to run: pick one".into());
    }
    if let Some(slots) = concurrency {
        let mut limits = args.policy.limits().to_vec();
        limits.retain(|l| !l.is_concurrency());
        limits.push(slots);
        args.policy = Policy::new(limits).map_err(|e| format!("--concurrency: {e}"))?;
    }
    if args.keys.is_empty() {
        args.keys.push(Key::Ip);
    }
    Ok(Some(args))
}

fn app(limiter: Limiter, keys: &[Key]) -> Router {
    let mut layer = RateLimitLayer::new(limiter);
    for key in keys {
        layer = match key {
            Key::Ip => layer.key(PeerIp::default()),
            Key::Header(h, _) => layer.key(h.clone()),
        };
    }
    Router::new()
        .route("/", get(|| async { "ok\n" }))
        .route(
            "/slow",
            get(|Query(q): Query<HashMap<String, u64>>| async move {
                let ms = q.get("ms").copied().unwrap_or(0).min(60_000);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                format!("ok after {ms} ms\n")
            }),
        )
        .layer(layer)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("{e}");
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    // The store's warnings (failing, recovering): on stderr, or in the chart's log pane.
    let log = Log::default();
    if args.chart {
        let log = log.clone();
        tracing_subscriber::fmt()
            .with_writer(move || log.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .init();
    } else {
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_max_level(tracing::Level::WARN)
            .init();
    }
    let store: Store = match &args.redis {
        None => MemoryStore::new().into(),
        Some(url) => match redis_store(url, args.store_timeout).await {
            Ok(s) => s.into(),
            Err(e) => {
                // The error names the cause and the fix, with any password redacted; the URL
                // itself is not printed, since it may hold one.
                eprintln!("cannot use Redis: {e}");
                let mut source = std::error::Error::source(&e);
                while let Some(cause) = source {
                    eprintln!("  caused by: {cause}");
                    source = cause.source();
                }
                return ExitCode::FAILURE;
            }
        },
    };
    let backend = if args.redis.is_some() {
        "redis"
    } else {
        "memory"
    };
    let limiter = Limiter::builder(store, args.policy.clone())
        .on_store_error(args.on_error)
        .build();
    let listen = if args.serve {
        args.listen
    } else {
        SocketAddr::from(([127, 0, 0, 1], 0))
    };
    let listener = match tokio::net::TcpListener::bind(listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("cannot listen on {listen}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let addr = listener
        .local_addr()
        .expect("bound listener has an address");
    let service = app(limiter, &args.keys).into_make_service_with_connect_info::<SocketAddr>();
    let server = tokio::spawn(async move { axum::serve(listener, service).await });
    println!(
        "policy {} | store {backend} | listening on http://{addr}",
        args.policy
    );
    if args.serve {
        return match server.await {
            Ok(Ok(())) => ExitCode::SUCCESS,
            Ok(Err(e)) => {
                eprintln!("server failed: {e}");
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("server task failed: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if args.chart {
        let title = format!("{} · {backend} store", args.policy);
        return chart::run(addr, &args, log, title).await;
    }
    drive(addr, &args).await
}

async fn redis_store(
    url: &str,
    timeout: Option<Duration>,
) -> Result<RedisStore, tollgate::StoreError> {
    let builder = RedisStore::builder(url);
    match timeout {
        Some(t) => builder.timeout(t).build().await,
        None => builder.build().await,
    }
}

/// What became of one request.
enum Outcome {
    Admitted,
    /// Limited, by this limit; with the response's rate-limit fields.
    Limited(String, Vec<(String, String)>),
    /// The store failed and the limiter fails closed.
    Unavailable,
}

/// Sends one request and reads what became of it.
async fn send(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>,
    addr: SocketAddr,
    keys: &[Key],
) -> Result<Outcome, String> {
    let mut req = http::Request::get(format!("http://{addr}/"));
    for key in keys {
        if let Key::Header(_, name) = key {
            req = req.header(name.as_str(), "demo-client");
        }
    }
    let req = req
        .body(Empty::new())
        .map_err(|e| format!("could not build a request: {e}"))?;
    let res = client
        .request(req)
        .await
        .map_err(|e| format!("request failed: {e}"))?;
    let status = res.status();
    if status.is_success() {
        return Ok(Outcome::Admitted);
    }
    if status == http::StatusCode::SERVICE_UNAVAILABLE {
        return Ok(Outcome::Unavailable);
    }
    let fields: Vec<(String, String)> = res
        .headers()
        .iter()
        .filter(|(name, _)| name.as_str().starts_with("ratelimit") || *name == "retry-after")
        .map(|(name, value)| {
            let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
            (name.to_string(), value)
        })
        .collect();
    let body = res
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    // "rate limit exceeded: 10/s (retry in 1 s)", "too many concurrent requests: 5 concurrent…"
    let text = String::from_utf8_lossy(&body);
    let limit = ["rate limit exceeded: ", "too many concurrent requests: "]
        .iter()
        .find_map(|prefix| text.strip_prefix(prefix))
        .and_then(|t| t.split(" (").next())
        .unwrap_or(status.as_str());
    Ok(Outcome::Limited(limit.to_string(), fields))
}

/// The store's log lines, kept for the chart.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Log {
    /// The last `n` lines.
    fn last(&self, n: usize) -> Vec<String> {
        let bytes = self.0.lock().map(|b| b.clone()).unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes);
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..]
            .iter()
            .map(|l| l.to_string())
            .collect()
    }
}

impl Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut log) = self.0.lock() {
            log.extend_from_slice(buf);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Per-second figures, shared by the traffic and whoever shows them.
#[derive(Default)]
struct Figures {
    /// (admitted, limited, unavailable) per second since the start.
    seconds: Vec<(u32, u32, u32)>,
    /// The rate-limit fields of the last `429`.
    last_limited: Vec<(String, String)>,
}

/// Sends requests at `rate` per second from one client until `stop`, counting them in
/// `figures` by the second since `start`; the error that stopped it, if one did.
async fn traffic(
    addr: SocketAddr,
    keys: &[Key],
    rate: &AtomicU32,
    stop: &AtomicBool,
    figures: &Mutex<Figures>,
    start: Instant,
) -> Result<(), String> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut next = tokio::time::Instant::now();
    while !stop.load(Ordering::Relaxed) {
        next += Duration::from_secs(1) / rate.load(Ordering::Relaxed).max(1);
        tokio::time::sleep_until(next).await;
        let outcome = send(&client, addr, keys).await?;
        let second = start.elapsed().as_secs() as usize;
        let mut f = figures.lock().map_err(|_| "figures poisoned")?;
        if f.seconds.len() <= second {
            f.seconds.resize(second + 1, (0, 0, 0));
        }
        match outcome {
            Outcome::Admitted => f.seconds[second].0 += 1,
            Outcome::Limited(_, fields) => {
                f.seconds[second].1 += 1;
                f.last_limited = fields;
            }
            Outcome::Unavailable => f.seconds[second].2 += 1,
        }
    }
    Ok(())
}

/// The most requests admitted within any one second, wherever it starts (`times` ascending),
/// and where that second starts: the figure a per-second limit promises to keep.
fn busiest_second(times: &[Duration]) -> (usize, Duration) {
    let (mut most, mut from, mut lo) = (0, Duration::ZERO, 0);
    for hi in 0..times.len() {
        while times[hi] - times[lo] >= Duration::from_secs(1) {
            lo += 1;
        }
        if hi - lo + 1 > most {
            (most, from) = (hi - lo + 1, times[lo]);
        }
    }
    (most, from)
}

/// Sends `rate` requests per second for `seconds` seconds and prints what happened.
async fn drive(addr: SocketAddr, args: &Args) -> ExitCode {
    println!(
        "driving {} requests/s for {} s from one client\n",
        args.rate, args.seconds
    );
    println!(
        "{:>4}  {:>8}  {:>7}  {:>11}  limited by",
        "sec", "admitted", "limited", "unavailable"
    );
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut ticker = tokio::time::interval(Duration::from_secs(1) / args.rate);
    let start = Instant::now();
    let (mut total_ok, mut total_limited, mut total_unavailable) = (0, 0, 0);
    let mut last_limited = Vec::new();
    // when each admitted request was answered, for the busiest rolling second
    let mut admitted_at = Vec::new();
    for second in 1..=args.seconds {
        let (mut ok, mut limited, mut unavailable) = (0, 0, 0);
        let mut by: BTreeMap<String, u32> = BTreeMap::new();
        while start.elapsed() < Duration::from_secs(second) {
            ticker.tick().await;
            match send(&client, addr, &args.keys).await {
                Ok(Outcome::Admitted) => {
                    ok += 1;
                    admitted_at.push(start.elapsed());
                }
                Ok(Outcome::Unavailable) => unavailable += 1,
                Ok(Outcome::Limited(limit, fields)) => {
                    limited += 1;
                    *by.entry(limit).or_default() += 1;
                    last_limited = fields;
                }
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        total_ok += ok;
        total_limited += limited;
        total_unavailable += unavailable;
        let by: Vec<String> = by.iter().map(|(l, n)| format!("{l} ×{n}")).collect();
        println!(
            "{second:>4}  {ok:>8}  {limited:>7}  {unavailable:>11}  {}",
            by.join(", ")
        );
    }
    println!(
        "\ntotal: {total_ok} admitted, {total_limited} limited, {total_unavailable} unavailable"
    );
    // The table counts by calendar second; a rolling second can straddle two of them.
    let (most, from) = busiest_second(&admitted_at);
    println!(
        "most admitted in any rolling second: {most} (from {:.3} s to {:.3} s)",
        from.as_secs_f64(),
        (from + Duration::from_secs(1)).as_secs_f64(),
    );
    if !last_limited.is_empty() {
        println!("\nthe last 429 said:");
        for (name, value) in &last_limited {
            println!("  {name}: {value}");
        }
    }
    ExitCode::SUCCESS
}

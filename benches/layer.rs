//! The HTTP layer's cost in process: an axum hello-world router called bare, behind
//! `tower_governor`, and behind `RateLimitLayer` on the memory store, measured in the same run.
//!
//! `cargo bench --bench layer [-- --iters N] [--rounds R] [--only ROW] [--svg FILE]` (`--svg`:
//! also draws the table as a bar chart into FILE; `--only tollgate`
//! measures the rows whose name contains `tollgate`, `--only "=tollgate, 1 limit"` that row
//! alone, for a profiler; the ratios then read 0).
//! The rows take turns for R rounds (default 3), and each shows its best.
//!
//! Every request carries the same peer address in `ConnectInfo` (both layers key on it), and
//! both layers add their rate-limit headers, but in the "no headers" rows, which tell what the
//! headers cost each layer and what the rest of it costs (their ratio is to tower_governor
//! without headers). In the first rows the limits are never reached;
//! in the "refused" rows (a client flooding a limit) every timed request is refused with a
//! 429, which a layer writes itself, and the ratio is to tower_governor's refusals. Each router is
//! prepared as `axum::serve` prepares it (`with_state(())`: its layers applied once); each
//! request is built, sent with `ServiceExt::oneshot` on a clone of the router and its response
//! dropped, on a current-thread runtime. "x bare" and "x tower_governor" are throughputs relative to
//! those rows (higher is better); allocations are counted by a global allocator. Below the
//! table, `Limiter::check` of the same key on its own: the limiter's part of the tollgate
//! rows, the rest being the layer's and axum's. The row of a layer doing nothing (tower's
//! `Identity`) is what axum costs for any layer; the row of a layer of its own body type (a
//! response body mapped to another type, as `RateLimitLayer`'s holds a concurrency slot to
//! the body's end) what axum adds for that: it boxes a body not of its own type.

use std::net::SocketAddr;
use std::time::Instant;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use tollgate::layer::HeaderStyle;
use tollgate::{Limiter, MemoryStore, RateLimitLayer};
use tower::ServiceExt;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::GovernorLayer;

#[path = "support/chart.rs"]
mod chart;
#[path = "support/counting.rs"]
mod counting;

fn hello() -> Router {
    Router::new().route("/", get(|| async { "Hello, World!" }))
}

/// ns and allocations per request through `router`, every timed request answered `expect`.
async fn measure(router: Router, iters: usize, expect: StatusCode) -> (f64, f64) {
    let peer: SocketAddr = ([203, 0, 113, 9], 40000).into();
    let request = || {
        let mut req = axum::http::Request::get("/")
            .body(Body::empty())
            .unwrap_or_default();
        req.extensions_mut().insert(ConnectInfo(peer));
        req
    };
    for _ in 0..iters / 10 {
        let _ = router.clone().oneshot(request()).await;
    }
    let before = counting::allocations();
    let started = Instant::now();
    let mut ok = 0usize;
    for _ in 0..iters {
        let res = match router.clone().oneshot(request()).await {
            Ok(res) => res,
            Err(never) => match never {},
        };
        ok += usize::from(res.status() == expect);
    }
    let ns = started.elapsed().as_nanos() as f64 / iters as f64;
    let allocs = (counting::allocations() - before) as f64 / iters as f64;
    assert_eq!(ok, iters, "every request must be answered {expect}");
    (ns, allocs)
}

/// ns and allocations per `Limiter::check` of the key the layer checks, alone: the part of a
/// tollgate row that is the limiter's, not the layer's.
async fn measure_check(limiter: &Limiter, iters: usize) -> (f64, f64) {
    let ids = ["ip:203.0.113.9"];
    for _ in 0..iters / 10 {
        let _ = limiter.check(&ids).await;
    }
    let before = counting::allocations();
    let started = Instant::now();
    let mut ok = 0usize;
    for _ in 0..iters {
        ok += usize::from(limiter.check(&ids).await.is_ok_and(|d| d.is_allowed()));
    }
    let ns = started.elapsed().as_nanos() as f64 / iters as f64;
    let allocs = (counting::allocations() - before) as f64 / iters as f64;
    assert_eq!(ok, iters, "every check must be allowed");
    (ns, allocs)
}

/// The row the refused rows are compared with.
const REFUSED_BASELINE: &str = "tower_governor, refused";
/// The row the rows without rate-limit headers are compared with.
const BARE_BASELINE: &str = "tower_governor, no headers";

/// Whether the row `name` is one of refusals.
fn refused(name: &str) -> bool {
    name.ends_with("refused")
}

/// Whether the row `name` is one of a layer that adds no rate-limit headers.
fn headerless(name: &str) -> bool {
    name.ends_with("no headers")
}

fn main() {
    let mut iters = 300_000usize;
    let mut only = String::new();
    let mut rounds = 3usize;
    let mut svg = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--iters" {
            iters = args.next().and_then(|v| v.parse().ok()).unwrap_or(iters);
        } else if a == "--only" {
            only = args.next().unwrap_or_default();
        } else if a == "--rounds" {
            rounds = args.next().and_then(|v| v.parse().ok()).unwrap_or(rounds);
        } else if a == "--svg" {
            svg = args.next();
        }
    }
    // `--only =NAME` measures the row named NAME alone
    let runs = |name: &str| match only.strip_prefix('=') {
        Some(exact) => name == exact,
        None => name.contains(only.as_str()),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let config = GovernorConfigBuilder::default()
            .per_nanosecond(1)
            .burst_size(1_000_000_000)
            .use_headers()
            .finish()
            .expect("governor config");
        let mut routers: Vec<(String, Router)> = vec![
            ("bare axum (baseline)".to_string(), hello()),
            (
                "axum, a layer doing nothing".to_string(),
                hello().layer(tower::layer::util::Identity::new()),
            ),
            // A layer whose response body is a type of its own (as a layer that holds
            // something until the body ends must have): axum boxes such a body.
            (
                "axum, a layer of its own body type".to_string(),
                hello().layer(tower::util::MapResponseLayer::new(
                    |res: axum::response::Response| {
                        res.map(|body| {
                            http_body_util::BodyExt::map_err(
                                body,
                                std::convert::identity::<axum::Error>,
                            )
                        })
                    },
                )),
            ),
            (
                "tower_governor, headers".to_string(),
                hello().layer(GovernorLayer::new(config)),
            ),
        ];
        for policy in ["1000000/s", "1000000/s, 10000000/min, 50000000/h"] {
            let limiter = Limiter::new(MemoryStore::new(), policy.parse().expect("policy"));
            let n = policy.split(',').count();
            routers.push((
                format!("tollgate, {n} limit{}", if n > 1 { "s" } else { "" }),
                hello().layer(RateLimitLayer::new(limiter)),
            ));
        }
        // The same layers without their rate-limit headers: what the headers cost each, and
        // what the rest of each layer costs.
        let headerless_config = GovernorConfigBuilder::default()
            .per_nanosecond(1)
            .burst_size(1_000_000_000)
            .finish()
            .expect("governor config");
        routers.push((
            BARE_BASELINE.to_string(),
            hello().layer(GovernorLayer::new(headerless_config)),
        ));
        let limiter = Limiter::new(MemoryStore::new(), "1000000/s".parse().expect("policy"));
        routers.push((
            "tollgate, 1 limit, no headers".to_string(),
            hello().layer(RateLimitLayer::new(limiter).headers(HeaderStyle::None)),
        ));
        // A client over its limit: one request an hour, the rest refused.
        let refusing = GovernorConfigBuilder::default()
            .per_second(3600)
            .burst_size(1)
            .use_headers()
            .finish()
            .expect("governor config");
        routers.push((
            REFUSED_BASELINE.to_string(),
            hello().layer(GovernorLayer::new(refusing)),
        ));
        for policy in ["1/h", "1/h, 2/d, 3/7d"] {
            let limiter = Limiter::new(MemoryStore::new(), policy.parse().expect("policy"));
            let n = policy.split(',').count();
            routers.push((
                format!(
                    "tollgate, {n} limit{}, refused",
                    if n > 1 { "s" } else { "" }
                ),
                hello().layer(RateLimitLayer::new(limiter)),
            ));
        }
        // As `axum::serve` does (through `into_make_service*`): every endpoint is turned into
        // a service once, not layered anew for each request.
        let mut routers: Vec<(String, Router)> = routers
            .into_iter()
            .map(|(name, router)| (name, router.with_state(())))
            .collect();
        routers.retain(|(name, _)| runs(name));
        let mut limiters = Vec::new();
        for policy in ["1000000/s", "1000000/s, 10000000/min, 50000000/h"] {
            let name = format!("Limiter::check alone, {policy}");
            if runs(&name) {
                let limiter = Limiter::new(MemoryStore::new(), policy.parse().expect("policy"));
                limiters.push((name, limiter));
            }
        }
        if routers.is_empty() && limiters.is_empty() {
            // (a profile of a run that measured nothing would count the set-up alone)
            eprintln!("no row is named like {only:?}");
            std::process::exit(2);
        }
        // The rows take turns, round after round, and each keeps its best round: a machine
        // busy with something else for a while slows one round of every row, not one row.
        let best = |kept: &mut Option<(f64, f64)>, figures: (f64, f64)| {
            if kept.is_none_or(|k| figures.0 < k.0) {
                *kept = Some(figures);
            }
        };
        let mut rows: Vec<(String, Option<(f64, f64)>)> =
            routers.iter().map(|(n, _)| (n.clone(), None)).collect();
        let mut checks: Vec<(String, Option<(f64, f64)>)> =
            limiters.iter().map(|(n, _)| (n.clone(), None)).collect();
        for _ in 0..rounds.max(1) {
            for (k, (name, router)) in routers.iter().enumerate() {
                let expect = match refused(name) {
                    true => StatusCode::TOO_MANY_REQUESTS,
                    false => StatusCode::OK,
                };
                best(&mut rows[k].1, measure(router.clone(), iters, expect).await);
            }
            for (k, (_, limiter)) in limiters.iter().enumerate() {
                best(&mut checks[k].1, measure_check(limiter, iters).await);
            }
        }
        let rows: Vec<(String, (f64, f64))> = rows
            .into_iter()
            .filter_map(|(n, f)| Some((n, f?)))
            .collect();
        let checks: Vec<(String, (f64, f64))> = checks
            .into_iter()
            .filter_map(|(n, f)| Some((n, f?)))
            .collect();
        // (with `--only`, the baselines may not have run: the ratios then read 0)
        let ns_of = |name: &str| {
            rows.iter()
                .find(|r| r.0.starts_with(name))
                .filter(|_| only.is_empty())
                .map_or(f64::INFINITY, |r| r.1 .0)
        };
        let (bare, governed) = (ns_of("bare axum"), ns_of("tower_governor, headers"));
        let governed_refusing = ns_of(REFUSED_BASELINE);
        let governed_headerless = ns_of(BARE_BASELINE);

        println!(
            "{iters} requests per row and round, best of {rounds} rounds taken in turns, one peer \
             address, headers on but in the \"no headers\" rows (their ratios are to \
             tower_governor's without headers); limits never reached but in the refused rows, \
             where every timed request is refused (their ratios are to tower_governor's \
             refusals)\n"
        );
        println!(
            "{:<34} {:>9} {:>8} {:>18} {:>10}",
            "router", "ns/req", "x bare", "x tower_governor", "allocs/req"
        );
        let mut chart = chart::Chart {
            title: "The layer in process: ns per request (lower is better)".to_string(),
            unit: "ns",
            series: vec!["ns per request"],
            note_title: "throughput x tower_governor",
            rows: Vec::new(),
        };
        for (name, (ns, allocs)) in &rows {
            let (x_bare, x_governor) = match (refused(name), headerless(name)) {
                (true, _) => (String::from("-"), governed_refusing / ns),
                (false, true) => (format!("{:.2}", bare / ns), governed_headerless / ns),
                (false, false) => (format!("{:.2}", bare / ns), governed / ns),
            };
            let x_governor = if x_governor.is_finite() {
                x_governor
            } else {
                0.0
            };
            println!(
                "{:<34} {:>9.0} {:>8} {:>18.2} {:>10.1}",
                name,
                ns,
                if bare.is_finite() { x_bare } else { "0".into() },
                x_governor,
                allocs
            );
            chart.rows.push(chart::Row {
                label: name.clone(),
                values: vec![Some(*ns)],
                note: format!("{x_governor:.2}\u{d7}"),
            });
        }
        if let Some(path) = &svg {
            chart.write(path);
        }
        if !checks.is_empty() {
            println!("\nthe limiter's part of the tollgate rows (no HTTP, no layer)");
        }
        for (name, (ns, allocs)) in &checks {
            println!("{name:<52} {ns:>9.0} {:>10} {allocs:>10.1}", "");
        }
    });
}

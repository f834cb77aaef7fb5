//! The HTTP layer's cost in process: an axum hello-world router called bare, behind
//! `tower_governor`, and behind `RateLimitLayer` on the memory store, measured in the same run.
//!
//! `cargo bench --bench layer [-- --iters N] [--only ROW]` (`--only tollgate` measures the
//! rows whose name contains `tollgate`, for a profiler; the ratios then read 0)
//!
//! Every request carries the same peer address in `ConnectInfo` (both layers key on it), the
//! limits are never reached, and both layers add their rate-limit headers. Each request is
//! built, sent with `ServiceExt::oneshot` on a clone of the service and its response dropped,
//! on a current-thread runtime. "x bare" and "x tower_governor" are throughputs relative to
//! those rows (higher is better); allocations are counted by a global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::Router;
use tollgate::{Limiter, MemoryStore, RateLimitLayer};
use tower::ServiceExt;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::GovernorLayer;

/// Counts allocations (and reallocations) made anywhere in the process.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn hello() -> Router {
    Router::new().route("/", get(|| async { "Hello, World!" }))
}

/// ns and allocations per request through `router`.
async fn measure(router: Router, iters: usize) -> (f64, f64) {
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
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let started = Instant::now();
    let mut ok = 0usize;
    for _ in 0..iters {
        let res = match router.clone().oneshot(request()).await {
            Ok(res) => res,
            Err(never) => match never {},
        };
        ok += usize::from(res.status().is_success());
    }
    let ns = started.elapsed().as_nanos() as f64 / iters as f64;
    let allocs = (ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / iters as f64;
    assert_eq!(ok, iters, "every request must be answered 200");
    (ns, allocs)
}

fn main() {
    let mut iters = 300_000usize;
    let mut only = String::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--iters" {
            iters = args.next().and_then(|v| v.parse().ok()).unwrap_or(iters);
        } else if a == "--only" {
            only = args.next().unwrap_or_default();
        }
    }
    let runs = |name: &str| name.contains(only.as_str());
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
        let mut routers = vec![
            ("bare axum (baseline)".to_string(), hello()),
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
        let mut rows = Vec::new();
        for (name, router) in routers {
            if runs(&name) {
                let figures = measure(router, iters).await;
                rows.push((name, figures));
            }
        }
        let ns_of = |k: usize| {
            rows.get(k)
                .filter(|_| only.is_empty())
                .map_or(0.0, |r| r.1 .0)
        };
        let (bare, governed) = (ns_of(0), ns_of(1));

        println!("{iters} requests per row, one peer address, limits never reached, headers on\n");
        println!(
            "{:<34} {:>9} {:>8} {:>18} {:>10}",
            "router", "ns/req", "x bare", "x tower_governor", "allocs/req"
        );
        for (name, (ns, allocs)) in &rows {
            println!(
                "{:<34} {:>9.0} {:>8.2} {:>18.2} {:>10.1}",
                name,
                ns,
                bare / ns,
                governed / ns,
                allocs
            );
        }
    });
}

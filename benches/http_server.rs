//! A hello-world axum server for `scripts/bench-http.sh`: bare, behind `tower_governor` or
//! behind `RateLimitLayer` on the memory store (both keyed by the peer IP, limits never
//! reached, rate-limit headers on), on a one-worker runtime.
//!
//! `cargo bench --bench http_server -- VARIANT PORT` with VARIANT `bare`, `governor`,
//! `tollgate` or `tollgate3` (the three-limit policy). Without a variant (as `cargo bench`
//! runs every bench) it returns at once.
//!
//! `http_server chart FILE TITLE [instr]` draws the table `scripts/bench-http.sh` measured as a
//! bar chart: it reads one row a line from stdin (`label<TAB>requests/s<TAB>note`; with
//! `instr`, instructions per request instead of requests per second).

use std::net::SocketAddr;

use axum::routing::get;
use axum::Router;
use tollgate::{Limiter, MemoryStore, RateLimitLayer};
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::GovernorLayer;

#[path = "support/chart.rs"]
mod chart;

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let Some(variant) = args.first() else {
        eprintln!("usage: http_server bare|governor|tollgate|tollgate3 [PORT]");
        return;
    };
    if variant == "chart" {
        let (Some(path), Some(title)) = (args.get(1), args.get(2)) else {
            eprintln!("usage: http_server chart FILE TITLE [instr] < rows");
            std::process::exit(2);
        };
        draw(path, title, args.get(3).is_some_and(|a| a == "instr"));
        return;
    }
    let port: u16 = args.get(1).and_then(|p| p.parse().ok()).unwrap_or(3000);
    let hello = Router::new().route("/", get(|| async { "Hello, World!" }));
    let app = match variant.as_str() {
        "bare" => hello,
        "governor" => {
            let config = GovernorConfigBuilder::default()
                .per_nanosecond(1)
                .burst_size(1_000_000_000)
                .use_headers()
                .finish()
                .expect("governor config");
            hello.layer(GovernorLayer::new(config))
        }
        "tollgate" | "tollgate3" => {
            let policy = if variant == "tollgate" {
                "1000000/s"
            } else {
                "1000000/s, 10000000/min, 50000000/h"
            };
            let limiter = Limiter::new(MemoryStore::new(), policy.parse().expect("policy"));
            hello.layer(RateLimitLayer::new(limiter))
        }
        other => {
            eprintln!("unknown variant {other}");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind");
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .expect("serve");
    });
}

/// Draws the rows read from stdin (`label<TAB>requests/s<TAB>note`) into `path`.
fn draw(path: &str, title: &str, instructions: bool) {
    let mut chart = chart::Chart {
        title: title.to_string(),
        unit: if instructions { "instr" } else { "req/s" },
        series: vec![if instructions {
            "instructions per request (lower is better)"
        } else {
            "requests per second (higher is better)"
        }],
        note_title: if instructions {
            "x bare, x tower_governor"
        } else {
            "throughput x bare, x tower_governor"
        },
        rows: Vec::new(),
    };
    for line in std::io::stdin().lines().map_while(Result::ok) {
        let mut fields = line.split('\t');
        let (Some(label), Some(value)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            eprintln!("not a number: {value:?}");
            std::process::exit(2);
        };
        chart.rows.push(chart::Row {
            label: label.to_string(),
            values: vec![Some(value)],
            note: fields.next().unwrap_or_default().to_string(),
        });
    }
    chart.write(path);
}

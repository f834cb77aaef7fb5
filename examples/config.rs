//! Rate limits read from a TOML file, with environment variables overriding it.
//!
//! ```text
//! cargo run --example config --features serde                     # examples/tollgate.toml
//! cargo run --example config --features serde -- my-limits.toml
//! TOLLGATE_POLICY="2/s" cargo run --example config --features serde
//! TOLLGATE_LAYER='headers = "legacy"' cargo run --example config --features serde
//! ```
//!
//! Policies deserialize from their text (`"10/s, 120/min"`) and
//! [`LayerSettings`] from plain values, so an application's own settings struct can hold
//! them directly.

use std::error::Error;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use tollgate::key::{Header, RequestView};
use tollgate::layer::LayerSettings;
use tollgate::{Limiter, MemoryStore, Policy, RateLimitLayer};
use tower::ServiceExt;

/// The application's rate-limit settings.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    policy: Policy,
    #[serde(default)]
    routes: Vec<RouteSettings>,
    #[serde(default)]
    layer: LayerSettings,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteSettings {
    path: String,
    mode: Mode,
    policy: Policy,
}

/// Whether a route's policy applies on top of the default one or instead of it.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Mode {
    Adding,
    Replacing,
}

fn load() -> Result<Settings, Box<dyn Error>> {
    let path = std::env::args().nth(1).unwrap_or_else(|| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/examples/tollgate.toml").to_string()
    });
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    let mut settings: Settings = toml::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
    // The environment overrides the file: a whole policy as text…
    if let Ok(policy) = std::env::var("TOLLGATE_POLICY") {
        settings.policy = policy
            .parse()
            .map_err(|e| format!("TOLLGATE_POLICY: {e}"))?;
    }
    // …or layer settings, as TOML.
    if let Ok(layer) = std::env::var("TOLLGATE_LAYER") {
        settings.layer = toml::from_str(&layer).map_err(|e| format!("TOLLGATE_LAYER: {e}"))?;
    }
    Ok(settings)
}

fn layer(settings: Settings) -> RateLimitLayer {
    let store = MemoryStore::new();
    let mut layer = RateLimitLayer::new(Limiter::new(store.clone(), settings.policy))
        // by the key's SHA-1: the secret stays out of the store's key names
        .key(
            Header::named("x-api-key")
                .expect("a valid header name")
                .hashed(),
        )
        .with_settings(settings.layer);
    for route in settings.routes {
        let limiter = Limiter::new(store.clone(), route.policy);
        let path = route.path;
        let matches = move |req: &RequestView<'_>| req.uri.path() == path;
        layer = match route.mode {
            Mode::Adding => layer.route_adding(matches, limiter),
            Mode::Replacing => layer.route_replacing(matches, limiter),
        };
    }
    layer
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let settings = load()?;
    println!("policy: {}", settings.policy);
    println!("layer:  {:?}", settings.layer);
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/login", get(|| async { "welcome" }))
        .route("/export", get(|| async { "exported" }))
        .layer(layer(settings));

    for path in ["/", "/login", "/login", "/login", "/login", "/export"] {
        let req = http::Request::get(path)
            .header("x-api-key", "demo")
            .body(Body::empty())?;
        let res = app.clone().oneshot(req).await?;
        println!("\nGET {path} -> {}", res.status());
        for (name, value) in res.headers() {
            let name = name.as_str();
            if name.contains("ratelimit") || name == "retry-after" || name == "content-type" {
                println!("  {name}: {}", value.to_str().unwrap_or("?"));
            }
        }
    }
    Ok(())
}

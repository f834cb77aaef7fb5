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
//! them directly. `TOLLGATE_LAYER` overrides the settings it names, one by one.

mod report;

use std::error::Error;
use std::process::ExitCode;

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use tollgate::key::{Header, PeerIp, RequestView};
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
    /// The route's namespace on the store: its counters are found by this name, whatever
    /// the route's place in the file.
    name: String,
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
    let mut file: toml::Table = toml::from_str(&text).map_err(|e| format!("{path}:\n{e}"))?;
    // The environment overrides the file: layer settings as TOML, each one it names (the
    // file's others stay)…
    if let Ok(layer) = std::env::var("TOLLGATE_LAYER") {
        let over: toml::Table =
            toml::from_str(&layer).map_err(|e| format!("TOLLGATE_LAYER:\n{e}"))?;
        // read alone first, so that a mistake there is not blamed on the file
        let _: LayerSettings = toml::Value::Table(over.clone())
            .try_into()
            .map_err(|e| format!("TOLLGATE_LAYER:\n{e}"))?;
        let table = file
            .entry("layer")
            .or_insert_with(|| toml::Table::new().into())
            .as_table_mut()
            .ok_or(format!("{path}: `layer` is not a table"))?;
        table.extend(over);
    }
    let mut settings: Settings = toml::Value::Table(file)
        .try_into()
        .map_err(|e| format!("{path}:\n{e}"))?;
    // …or a whole policy as text.
    if let Ok(policy) = std::env::var("TOLLGATE_POLICY") {
        settings.policy = policy
            .parse()
            .map_err(|e| format!("TOLLGATE_POLICY: {e}"))?;
    }
    Ok(settings)
}

fn layer(settings: Settings) -> Result<RateLimitLayer, Box<dyn Error>> {
    let store = MemoryStore::new();
    let mut layer = RateLimitLayer::new(Limiter::new(store.clone(), settings.policy))
        // The client's address and its API key, both checked. The key alone would let a
        // client that sends a new value each time start afresh each time (the layer runs
        // before anything checks the key), and a request without one would have no key.
        .key(PeerIp::new())
        // by the key's SHA-1: the secret stays out of the store's key names
        .key(Header::named("x-api-key")?.hashed())
        .with_settings(settings.layer);
    for route in settings.routes {
        // A namespace of its own: a route's limits would otherwise count together with the
        // default ones wherever their store keys have the same name (`10/min` beside a
        // default `100/min`, say). Named in the file rather than by the route's place in it,
        // so that adding or moving a route moves no counters from one route to another.
        let namespace = route
            .name
            .parse()
            .map_err(|e| format!("route {:?}: {e}", route.name))?;
        let limiter = Limiter::builder(store.clone(), route.policy)
            .namespace(namespace)
            .build();
        let path = route.path;
        let matches = move |req: &RequestView<'_>| req.uri.path() == path;
        layer = match route.mode {
            Mode::Adding => layer.route_adding(matches, limiter),
            Mode::Replacing => layer.route_replacing(matches, limiter),
        };
    }
    Ok(layer)
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => report::failure(&*e),
    }
}

async fn run() -> Result<(), Box<dyn Error>> {
    let settings = load()?;
    println!("policy: {}", settings.policy);
    println!("layer:  {:?}", settings.layer);
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/login", get(|| async { "welcome" }))
        .route("/export", get(|| async { "exported" }))
        .layer(layer(settings)?);

    for path in ["/", "/login", "/login", "/login", "/login", "/export"] {
        // the peer's address, as a server built with `into_make_service_with_connect_info`
        // records it (here, calling the router directly, the example puts it in)
        let peer = SocketAddr::from(([203, 0, 113, 7], 40_000));
        let req = http::Request::get(path)
            .header("x-api-key", "demo")
            .extension(ConnectInfo(peer))
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

//! An axum app limited per client IP and per user, with a stricter policy on `/login` on top
//! of the general one, and health checks left alone.
//!
//! ```text
//! cargo run --example axum            # in memory
//! cargo run --example axum -- redis://127.0.0.1/
//! curl -i localhost:3000/ -H 'authorization: Bearer alice'
//! ```
//!
//! With Redis, the server starts even while Redis is down: checks then follow the limiter's
//! failure policy (by default, requests go through, counted and logged) until it is back.

mod report;

use std::net::SocketAddr;
use std::process::ExitCode;

use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use tollgate::key::{Extension, PeerIp, RequestView};
use tollgate::{Limiter, MemoryStore, RateLimitLayer, RedisStore, Store};

/// Set by the authentication middleware below, read by the rate limiter. A real one inserts
/// it only once the credentials are verified — anyone can send `Bearer alice`, and would use
/// up alice's quota — and holds a stable id that is no secret (a session token would end up
/// in the store's key names).
#[derive(Clone, Debug)]
struct UserId(String);

impl std::fmt::Display for UserId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

async fn authenticate(mut req: Request, next: Next) -> Response {
    let user = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|u| UserId(u.to_string()));
    if let Some(user) = user {
        req.extensions_mut().insert(user);
    }
    next.run(req).await
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => report::failure(&*e),
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    // The store's warnings (Redis down, misconfigured, back), on stderr: without a
    // subscriber, a store that cannot serve would pass unnoticed, every request let through.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::WARN)
        .init();
    let store: Store = match std::env::args().nth(1) {
        // Connects in the background (`RedisStore::connect(url).await?` would wait for Redis
        // and stop here, with the message naming the fix, while it cannot serve the store).
        Some(url) => RedisStore::builder(url).build_lazy()?.into(),
        None => MemoryStore::new().into(),
    };
    let general = Limiter::new(store.clone(), "10/s, 120/min, 240/h".parse()?);
    // A namespace of its own: on one store, limiters' limits of one name (two per-minute
    // windows, two concurrency limits) would count together.
    let login = Limiter::builder(store, "5/min log".parse()?)
        .namespace("login".parse()?)
        .build();

    let limits = RateLimitLayer::new(general)
        // the client IP: the peer's address, as nothing stands in front of this server.
        // Behind reverse proxies, `ClientIp::trusted_proxies([their networks])` reads the
        // forwarding headers they add; never trust an address clients can connect from (a
        // client sending its own `X-Forwarded-For` would pick its key)…
        .key(PeerIp::new())
        // …and the user, when there is one: both are checked, all-or-nothing
        .key(Extension::<UserId>::new())
        // `/login` is held to 5 a minute as well as to the general limits…
        .route_adding(|req: &RequestView<'_>| req.uri.path() == "/login", login)
        // …and health checks are not limited at all
        .bypass(|req: &RequestView<'_>| req.uri.path() == "/health");

    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/login", post(|| async { "welcome\n" }))
        .route("/health", get(|| async { "ok\n" }))
        .layer(limits)
        .layer(middleware::from_fn(authenticate));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

//! An axum app limited per client IP and per user, with a stricter policy on `/login` on top
//! of the general one, and health checks left alone.
//!
//! ```text
//! cargo run --example axum            # in memory
//! cargo run --example axum -- redis://127.0.0.1/
//! curl -i localhost:3000/ -H 'authorization: Bearer alice'
//! ```

use std::net::SocketAddr;

use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use tollgate::key::{ClientIp, Extension, IpCidr, RequestView};
use tollgate::{Limiter, MemoryStore, RateLimitLayer, RedisStore, Store};

/// Set by the (toy) authentication middleware below, read by the rate limiter.
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
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store: Store = match std::env::args().nth(1) {
        Some(url) => RedisStore::connect(url).await?.into(),
        None => MemoryStore::new().into(),
    };
    let general = Limiter::new(store.clone(), "10/s, 120/min, 240/h".parse()?);
    // A namespace of its own: on one store, limiters' limits of one name (two per-minute
    // windows, two concurrency limits) would count together.
    let login = Limiter::builder(store, "5/min log".parse()?)
        .namespace("login".parse()?)
        .build();

    let limits = RateLimitLayer::new(general)
        // the client IP as seen through our own proxies (here: any private address)…
        .key(ClientIp::trusted_proxies(IpCidr::private_networks()))
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

//! # tollgate
//!
//! Distributed rate limiting: multi-limit policies such as `10/s, 120/min, 240/h`, checked
//! for several identifiers at once (the client IP *and* the user), decided all-or-nothing in
//! one atomic Redis script call (on a Redis Cluster, one per hash slot: see below) — or in
//! process, with the same algorithms and the same decisions.
//!
//! ```no_run
//! use std::net::SocketAddr;
//!
//! use axum::routing::get;
//! use axum::Router;
//! use tollgate::key::{ClientIp, IpCidr, RequestView};
//! use tollgate::{Limiter, MemoryStore, RateLimitLayer};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // `RedisStore::connect("redis://127.0.0.1/").await?` shares the counters with a fleet.
//!     let store = MemoryStore::new();
//!     let limits = RateLimitLayer::new(Limiter::new(store.clone(), "10/s, 120/min".parse()?))
//!         // the client IP, from the header the proxies of your own network maintain
//!         .key(ClientIp::trusted_proxies(IpCidr::private_networks()).only_x_forwarded_for())
//!         // `/login`: 5 a minute on top of the limits above, in a namespace of its own (on
//!         // one store, limits of one name count together)
//!         .route_adding(
//!             |req: &RequestView<'_>| req.uri.path() == "/login",
//!             Limiter::builder(store, "5/min log".parse()?)
//!                 .namespace("login".parse()?)
//!                 .build(),
//!         )
//!         .bypass(|req: &RequestView<'_>| req.uri.path() == "/health");
//!     let app = Router::new()
//!         .route("/", get(|| async { "hello" }))
//!         .route("/login", get(|| async { "welcome" }))
//!         .route("/health", get(|| async { "ok" }))
//!         .layer(limits);
//!     let listener = tokio::net::TcpListener::bind("0.0.0.0:3000").await?;
//!     axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//!     Ok(())
//! }
//! ```
//!
//! Limited requests get `429 Too Many Requests` with `Retry-After` (gRPC
//! `RESOURCE_EXHAUSTED`), and checked responses the `RateLimit-Policy` and `RateLimit` fields
//! of draft-ietf-httpapi-ratelimit-headers-11 (see [`layer`] for what they say).
//!
//! Two rules to know:
//!
//! * **A missing key is an error.** The key is the peer IP unless
//!   [`key`](RateLimitLayer::key) says otherwise. A request in which no key is found is
//!   answered `500` ("no rate-limit key found in the request"), so that a server that does
//!   not record peer addresses is loud rather than silently unlimited: serve axum with
//!   `into_make_service_with_connect_info::<SocketAddr>()`; tonic's is read with the `tonic`
//!   feature. [`MissingKey`](layer::MissingKey) lets such requests through or picks the status.
//! * **A route replaces or adds, as you say.**
//!   [`route_replacing`](RateLimitLayer::route_replacing) checks matching requests against
//!   its limiter *instead of* the default one;
//!   [`route_adding`](RateLimitLayer::route_adding) against both (both must allow);
//!   [`bypass`](RateLimitLayer::bypass) not at all. The first rule that matches applies.
//!
//! ## Features
//!
//! | feature | default | what it adds |
//! | --- | --- | --- |
//! | `redis` | yes | [`RedisStore`] |
//! | `axum` | yes | the peer address from axum's `ConnectInfo`, route templates from `MatchedPath` |
//! | `tonic` | yes | the peer address from tonic's `TcpConnectInfo` |
//! | `tracing` | yes | log events: a store failing and recovering, failed calls, lost slots and give-backs, would-be denials in shadow mode, requests without a key, policy changes, sheds |
//! | `metrics` | no | counters, a gauge and a histogram through the `metrics` facade (decisions, failure-policy answers, store errors and latency, sheds and more: the README's failures table lists them) |
//! | `serde` | no | `Serialize`/`Deserialize` for [`Policy`] and [`Limit`] (as their text), [`LayerSettings`](layer::LayerSettings), [`HeaderStyle`](layer::HeaderStyle) and [`MissingKey`](layer::MissingKey) |
//!
//! ## Without tower
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{Limiter, MemoryStore, Policy};
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let policy: Policy = "3/s log, 100/h".parse()?;
//! // For a fleet: `RedisStore::connect("redis://127.0.0.1/").await?` instead.
//! let limiter = Limiter::new(MemoryStore::new(), policy);
//!
//! for _ in 0..3 {
//!     assert!(limiter.check(&["ip:203.0.113.9", "user:42"]).await?.is_allowed());
//! }
//! let denied = limiter.check(&["ip:203.0.113.9", "user:42"]).await?;
//! assert!(!denied.is_allowed());
//! let wait = denied.retry_after().unwrap();
//! assert!(wait > Duration::ZERO && wait <= Duration::from_secs(1));
//! println!("limited by {}: retry in {wait:?}", denied.denied_by().unwrap().limit);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! ## The parts
//!
//! * [`Policy`] / [`Limit`] / [`Algorithm`]: what is limited, and how; the text syntax is
//!   described in [`policy`].
//! * [`Limiter`]: checks requests; returns a [`Decision`].
//! * [`Scheduler`]: paces events to a rate, each waiting for its own slot (calls to a third
//!   party that limits you).
//! * [`MemoryStore`] and [`RedisStore`]: where the counters live.
//! * [`RateLimitLayer`] ([`layer`]): tower middleware for HTTP services (axum, tonic, hyper),
//!   with [`key`] extractors; [`KeyedRateLimitLayer`] ([`service`]): for any tower service.
//! * [`ConcurrencyGuard`]: the slot of a `N concurrent` limit; [`shed`]: load shedders.
//!
//! Guarantees, for both stores:
//!
//! * **All-or-nothing.** Every limit is evaluated for every identifier before anything is
//!   written; a denied request charges nothing anywhere. On a Redis Cluster, identifiers in
//!   different hash slots are checked one call per slot: when one slot denies, what the others
//!   charged is given back by a second call, and may deny other requests until then
//!   ([`RedisStore::builder`] says more).
//! * **One clock.** The Redis store reads the time from Redis `TIME`, so application servers'
//!   clock drift does not matter. A manual [`Clock`] exists for tests and replays.
//! * **Exact retry times.** [`Decision::retry_after`] is the earliest moment at which the
//!   same request would be admitted if nothing else happened, to the microsecond, for every
//!   rate limit. A concurrency limit cannot know when a slot frees: its retry time is a hint,
//!   the earliest lease deadline or a second, whichever comes first.
//! * **A Tokio runtime, for what waits.** Checks that wait
//!   ([`Limiter::check_n_waiting`], [`Scheduler::schedule_n`]) sleep on Tokio's timer (they
//!   panic outside a runtime with its time driver), and a concurrency slot's lease is renewed
//!   by a task on the runtime of its first check, which also needs the time driver
//!   (`enable_time`, or `enable_all`). A slot taken outside a runtime is renewed once a slot
//!   is taken within one, and lapses after its lease if none is; a store used from several
//!   runtimes moves the task to another when the runtime it ran on shuts down.
//! * **Bounded state.** Every Redis key has a TTL no shorter than its state's lifetime; the
//!   memory store evicts expired state and holds a bounded number of keys.

#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod algorithm;
mod clock;
mod decision;
mod guard;
mod http;
pub mod key;
pub mod layer;
mod limiter;
mod macros;
mod observe;
pub mod policy;
pub mod service;
pub mod shed;
pub mod store;

pub use clock::{Clock, ManualClock};
pub use decision::{Decision, LimitStatus, Origin, Usage};
pub use guard::ConcurrencyGuard;
pub use layer::RateLimitLayer;
pub use limiter::{
    Error, Fallback, Limiter, LimiterBuilder, OnStoreError, Scheduler, SchedulerBuilder,
    MAX_IDENTIFIERS,
};
pub use policy::{Algorithm, Limit, Policy, PolicyError};
pub use service::{KeyedRateLimitLayer, RateLimited};
#[cfg(feature = "redis")]
pub use store::RedisStore;
pub use store::{MemoryStore, Store, StoreError};

/// The README's examples, compiled and run as doctests.
#[cfg(all(doctest, feature = "redis", feature = "axum", feature = "tonic"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

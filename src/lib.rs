//! # tollgate
//!
//! Distributed rate limiting: multi-limit policies such as `10/s, 120/min, 240/h`, checked
//! for several identifiers at once (the client IP *and* the user), decided all-or-nothing in
//! one atomic Redis script call — or in process, with the same algorithms and the same
//! decisions.
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
//! * [`Policy`] / [`Limit`] / [`Algorithm`]: what is limited, and how; the text syntax is
//!   described in [`policy`].
//! * [`Limiter`]: checks requests; returns a [`Decision`].
//! * [`MemoryStore`] and [`RedisStore`]: where the counters live.
//! * [`RateLimitLayer`] ([`layer`]): tower middleware for HTTP services (axum, tonic, hyper),
//!   with [`key`] extractors; [`KeyedRateLimitLayer`] ([`service`]): for any tower service.
//! * [`ConcurrencyGuard`]: the slot of a `N concurrent` limit; [`shed`]: load shedders.
//!
//! Guarantees, for both stores:
//!
//! * **All-or-nothing.** Every limit is evaluated for every identifier before anything is
//!   written; a denied request charges nothing anywhere.
//! * **One clock.** The Redis store reads the time from Redis `TIME`, so application servers'
//!   clock drift does not matter. A manual [`Clock`] exists for tests and replays.
//! * **Exact retry times.** [`Decision::retry_after`] is the earliest moment at which the
//!   same request would be admitted if nothing else happened, to the microsecond.
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
pub use decision::{Decision, LimitStatus, Origin};
pub use guard::ConcurrencyGuard;
pub use layer::RateLimitLayer;
pub use limiter::{Error, Fallback, Limiter, LimiterBuilder, OnStoreError, MAX_IDENTIFIERS};
pub use policy::{Algorithm, Limit, Policy, PolicyError};
pub use service::{KeyedRateLimitLayer, RateLimited};
#[cfg(feature = "redis")]
pub use store::RedisStore;
pub use store::{MemoryStore, Store, StoreError};

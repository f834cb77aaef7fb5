//! Rate limiting for HTTP services.
//!
//! [`RateLimitLayer`] wraps any `Service<http::Request<B>>` (axum, tonic, hyper):
//! identifiers come from [key extractors](crate::key), and rejections are responses — `429`
//! with `Retry-After` and `RateLimit` headers, or a gRPC trailers-only `RESOURCE_EXHAUSTED`
//! for gRPC requests — so infallible services stay infallible.
//!
//! For any other service, clients included, see the [`service`](crate::service) module:
//! [`KeyedRateLimitLayer`](crate::KeyedRateLimitLayer) takes identifiers from a closure over
//! the request, and rejects with a [`RateLimited`](crate::RateLimited) error.
//!
//! `poll_ready` only asks the inner service, because the key is in the request (and axum
//! expects services to be always ready). The check is made in the response future, or — for
//! [`RateLimitLayer`] with a limiter that decides in process (a memory store, concurrency
//! limits included) — at once in `call`.
//!
//! # Rules
//!
//! Rules are tried in the order given; the first that matches a request applies, and a
//! request no rule matches is checked against the default limiter:
//!
//! * [`route_replacing`](RateLimitLayer::route_replacing): the rule's limiter *instead of*
//!   the default one;
//! * [`route_adding`](RateLimitLayer::route_adding): the rule's limiter, then the default
//!   one; both must allow;
//! * [`bypass`](RateLimitLayer::bypass): no check, no headers.
//!
//! # Charging by response
//!
//! By default a request is charged before it is handled. With
//! [`charge_if`](RateLimitLayer::charge_if) the layer only peeks before the handler (refusing
//! once the quota is used up) and charges the responses a predicate selects, such as a login
//! endpoint's `401`s.
//!
//! # Headers
//!
//! With the default [`HeaderStyle::Ietf`], checked responses (allowed or not) carry the
//! fields of draft-ietf-httpapi-ratelimit-headers-11, serialized as structured fields, one
//! item per limit named by its text:
//!
//! ```text
//! RateLimit-Policy: "10/s";q=10;w=1, "120/min";q=120;w=60, "5 concurrent";q=5;qu="concurrent-requests"
//! RateLimit: "10/s";r=0;t=1, "120/min";r=104;t=1, "5 concurrent";r=4
//! Retry-After: 1
//! ```
//!
//! * `q` and `w`: the quota and its window in whole seconds. A window that is not a whole
//!   number of seconds is rounded up and the count scaled to it, rounding down: `5/500ms` is
//!   `q=10;w=1`, `3/700ms` is `q=4;w=1` — the enforced rate or a little less, never more. A
//!   token bucket or GCRA advertises its burst over the time it takes to refill:
//!   `100/s bucket capacity=500` is `q=500;w=5`.
//! * `qu="concurrent-requests"` (and no `w`): a concurrency limit.
//! * `r`: the quota available now, after this request, for the most constrained identifier;
//!   never above `q`. For a concurrency limit, the free slots.
//! * `t`: the effective window, "the number of seconds within which the client can use no
//!   more than the available quota" (draft §4.1.2), rounded up. For a limit that denied the
//!   request, the time until it would admit it; for the others, the time until their quota
//!   is whole again, at most `w` (and `w` when nothing is used). A concurrency limit has no
//!   `t`: slots come back when requests end.
//! * `Retry-After`, on a denial: the decision's [`retry_after`](crate::Decision::retry_after)
//!   in whole seconds, rounded up. No `t` of the response ends after it ("the Retry-After
//!   field value SHOULD NOT reference a point in time earlier than the end of the effective
//!   window", §6): `t` is capped at it.
//!
//! Layers add their items to those already there, so a response that went through two
//! layers (or a route that adds its limiter) lists the limits of both; a limit listed by
//! both appears once, with the tighter state. Requests let through without a check (bypass,
//! a missing key allowed, a store failing open) carry no items.
//!
//! With [`partition_keys`](RateLimitLayer::partition_keys), each `RateLimit` item also
//! carries `pk`, a keyed hash of the identifier it describes (never the identifier).
//!
//! [`HeaderStyle::Legacy`] sends `X-RateLimit-Limit`, `X-RateLimit-Remaining` (the `q` and `r`
//! of the rate limit closest to exhaustion, or on a denial of the limit that holds the
//! request back longest; a concurrency limit is reported in this style only when it denies)
//! and `X-RateLimit-Reset` (the seconds until its whole quota is back, on a denial no sooner
//! than the `Retry-After`) instead.

mod check;
mod config;
pub(crate) mod future;
#[allow(clippy::module_inception)]
mod layer;
mod service;
mod upgrade;

pub use self::config::{LayerSettings, MissingKey};
pub use self::future::ResponseFuture;
pub use self::layer::RateLimitLayer;
pub use self::service::RateLimit;
pub use self::upgrade::UpgradeSlots;
pub use crate::http::headers::HeaderStyle;
pub use crate::http::ResponseBody;

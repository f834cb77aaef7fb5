//! Rate limiting for any service.
//!
//! [`KeyedRateLimitLayer`] wraps any `tower::Service`, servers and clients alike: a closure
//! names the [`Identifiers`] of a request, and a limited request fails with [`RateLimited`] —
//! or, for outbound calls that may wait, is delayed until the limit admits it
//! ([`wait_up_to`](KeyedRateLimitLayer::wait_up_to)). A client calling a third party can
//! instead be paced by a [`Scheduler`](crate::Scheduler)
//! ([`scheduled`](KeyedRateLimitLayer::scheduled)): every call waits for its own slot at the
//! third party's rate, fleet-wide.
//!
//! For HTTP services, [`RateLimitLayer`](crate::RateLimitLayer) (in [`layer`](crate::layer))
//! answers limited requests with responses instead.
//!
//! A policy's concurrency limit counts calls in flight: the slot a call takes is let go when
//! the inner service's future completes, since a service's response is opaque here. For an
//! HTTP response whose body streams on after that (server-sent events, a download),
//! [`RateLimitLayer`](crate::RateLimitLayer) holds the slot until the body ends, and is the
//! layer to limit concurrent streams with.

mod error;
mod future;
mod layer;
#[allow(clippy::module_inception)]
mod service;

pub use self::error::RateLimited;
pub use self::future::KeyedResponseFuture;
pub use self::layer::{Identifiers, KeyedRateLimitLayer};
pub use self::service::KeyedRateLimit;

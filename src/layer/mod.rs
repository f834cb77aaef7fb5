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
//! Both check in the response future: `poll_ready` only asks the inner service, because the
//! key is in the request (and axum expects services to be always ready).

mod config;
pub(crate) mod future;
#[allow(clippy::module_inception)]
mod layer;
mod service;

pub use self::config::{LayerSettings, MissingKey};
pub use self::future::ResponseFuture;
pub use self::layer::RateLimitLayer;
pub use self::service::RateLimit;
pub use crate::http::headers::HeaderStyle;
pub use crate::http::ResponseBody;
pub use crate::limiter::OnStoreError;

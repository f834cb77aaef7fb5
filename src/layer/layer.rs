//! [`RateLimitLayer`]: the configuration of the HTTP middleware.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::StatusCode;

use super::config::{Config, MissingKey};
use super::RateLimit;
use crate::key::{AnyExtractor, KeyExtractor, RequestView};
use crate::{Decision, Limiter};

/// Rate limiting for HTTP services. See the [`layer`](super) module documentation.
///
/// ```
/// use tollgate::key::{Header, PeerIp};
/// use tollgate::{Limiter, MemoryStore, RateLimitLayer};
///
/// let limiter = Limiter::new(MemoryStore::new(), "10/s, 120/min".parse().unwrap());
/// let layer = RateLimitLayer::new(limiter)
///     .key(PeerIp::default())                                   // the client IP…
///     .key(Header::named("x-api-key").unwrap())                 // …and the API key, together
///     .bypass(|req| req.uri.path() == "/health");
/// # let _ = layer;
/// ```
#[derive(Clone)]
pub struct RateLimitLayer {
    config: Arc<Config>,
}

impl fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        f.debug_struct("RateLimitLayer")
            .field("default", &c.default)
            .field("rules", &c.rules.len())
            .field("keys", &c.keys.len())
            .field("missing", &c.missing)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayer {
    /// A layer checking every request against `limiter`, keyed by the peer IP until
    /// [`key`](Self::key) says otherwise.
    pub fn new(limiter: Limiter) -> RateLimitLayer {
        RateLimitLayer {
            config: Arc::new(Config::new(limiter)),
        }
    }

    fn edit(mut self, f: impl FnOnce(&mut Config)) -> Self {
        f(Arc::make_mut(&mut self.config));
        self
    }

    /// Adds a key extractor. With several, a request is checked for all the identifiers
    /// found, at once, all-or-nothing (e.g. the client IP *and* the user). Without any, the
    /// peer IP ([`PeerIp`](crate::key::PeerIp)) is used.
    pub fn key(self, extractor: impl KeyExtractor) -> Self {
        let e = AnyExtractor(Arc::new(extractor));
        self.edit(|c| c.keys.push(e))
    }

    /// Requests matching `matcher` are checked against `limiter` instead of the default
    /// one (per-route or per-method policies). Rules are tried in the order given.
    pub fn route<F>(self, matcher: F, limiter: Limiter) -> Self
    where
        F: Fn(&RequestView<'_>) -> bool + Send + Sync + 'static,
    {
        self.edit(|c| c.rules.push((Arc::new(matcher), Some(limiter))))
    }

    /// Requests matching `matcher` are not limited (health checks, allow-listed keys).
    pub fn bypass<F>(self, matcher: F) -> Self
    where
        F: Fn(&RequestView<'_>) -> bool + Send + Sync + 'static,
    {
        self.edit(|c| c.rules.push((Arc::new(matcher), None)))
    }

    /// What to do when no extractor finds a key (default: reject with 500, so that a
    /// misconfigured deployment is loud rather than silently unlimited).
    pub fn on_missing_key(self, missing: MissingKey) -> Self {
        self.edit(|c| c.missing = missing)
    }

    /// The cost (weight) of a request, default 1. A cost no limit could ever admit is
    /// answered with `400 Bad Request`.
    pub fn cost<F>(self, cost: F) -> Self
    where
        F: Fn(&RequestView<'_>) -> u64 + Send + Sync + 'static,
    {
        self.edit(|c| c.cost = Some(Arc::new(cost)))
    }

    /// Whether responses carry the IETF `RateLimit-Policy` and `RateLimit` headers
    /// (default: yes).
    pub fn ietf_headers(self, on: bool) -> Self {
        self.edit(|c| c.headers.ietf = on)
    }

    /// Whether responses carry the legacy `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
    /// `X-RateLimit-Reset` headers, for the limit closest to exhaustion (default: no).
    pub fn legacy_headers(self, on: bool) -> Self {
        self.edit(|c| c.headers.legacy = on)
    }

    /// The status of a limited request (default `429 Too Many Requests`; a load shedder
    /// answers `503 Service Unavailable`). gRPC requests get the matching gRPC code
    /// (`RESOURCE_EXHAUSTED` for 429, `UNAVAILABLE` for 503).
    pub fn limited_status(self, status: StatusCode) -> Self {
        self.edit(|c| c.limited_status = status)
    }

    /// Builds the response to a limited HTTP request (gRPC requests always get
    /// `RESOURCE_EXHAUSTED`). `Retry-After` and the rate-limit headers are added unless the
    /// handler set them.
    pub fn on_limited<F>(self, handler: F) -> Self
    where
        F: Fn(&RequestView<'_>, &Decision) -> http::Response<Bytes> + Send + Sync + 'static,
    {
        self.edit(|c| c.on_limited = Some(Arc::new(handler)))
    }
}

impl<S> tower_layer::Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit::new(inner, self.config.clone())
    }
}

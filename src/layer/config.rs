//! What a [`RateLimitLayer`](super::RateLimitLayer) is configured with.

use std::sync::Arc;

use bytes::Bytes;
use http::StatusCode;

use crate::http::headers::HeaderStyle;
use crate::key::{AnyExtractor, RequestView};
use crate::{Decision, Limiter};

/// Whether a rule applies to a request.
pub(crate) type Matcher = Arc<dyn Fn(&RequestView<'_>) -> bool + Send + Sync>;
/// The cost of a request.
pub(crate) type CostFn = Arc<dyn Fn(&RequestView<'_>) -> u64 + Send + Sync>;
/// The response to a limited HTTP request.
pub(crate) type LimitedFn =
    Arc<dyn Fn(&RequestView<'_>, &Decision) -> http::Response<Bytes> + Send + Sync>;

/// What to do with a request none of the key extractors found a key in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingKey {
    /// Let it through unlimited.
    Allow,
    /// Answer with this status (for gRPC requests, the matching gRPC code) and a message
    /// saying that no rate-limit key was found.
    Reject(StatusCode),
}

/// The settings of a [`RateLimitLayer`](super::RateLimitLayer), shared by its services.
#[derive(Clone)]
pub(crate) struct Config {
    /// The limiter of requests no rule matches.
    pub(crate) default: Limiter,
    /// Per-request limiters (`None`: bypass), tried in order.
    pub(crate) rules: Vec<(Matcher, Option<Limiter>)>,
    /// The key extractors (none: the peer IP).
    pub(crate) keys: Vec<AnyExtractor>,
    pub(crate) missing: MissingKey,
    /// The cost of a request (none: 1).
    pub(crate) cost: Option<CostFn>,
    pub(crate) headers: HeaderStyle,
    /// The response to a limited HTTP request (none: a text of the layer's own).
    pub(crate) on_limited: Option<LimitedFn>,
    pub(crate) limited_status: StatusCode,
}

impl Config {
    /// The defaults: keyed by the peer IP, a missing key answered with 500, failing open,
    /// IETF headers, 429.
    pub(crate) fn new(limiter: Limiter) -> Config {
        Config {
            default: limiter,
            rules: Vec::new(),
            keys: Vec::new(),
            missing: MissingKey::Reject(StatusCode::INTERNAL_SERVER_ERROR),
            cost: None,
            headers: HeaderStyle {
                ietf: true,
                legacy: false,
            },
            on_limited: None,
            limited_status: StatusCode::TOO_MANY_REQUESTS,
        }
    }
}

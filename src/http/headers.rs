//! The rate-limit headers of responses.
//!
//! Headers follow draft-ietf-httpapi-ratelimit-headers (structured fields, one list item per
//! limit, named by the limit's text):
//!
//! ```text
//! RateLimit-Policy: "10/s";q=10;w=1, "120/min";q=120;w=60
//! RateLimit: "10/s";r=0;t=1, "120/min";r=104;t=60
//! ```
//!
//! `q` is the limit's count and `w` its window in seconds (rounded up, for sub-second
//! windows); `r` is what remains for the most constrained identifier and `t` the seconds until
//! its full quota is back (rounded up). `Retry-After` is in whole seconds, rounded up, so a
//! client that honours it is never early.

use std::fmt::Write;
use std::time::Duration;

use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::HeaderMap;

use crate::Decision;

/// `RateLimit`: the state of each limit.
pub(crate) const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `RateLimit-Policy`: the limits.
pub(crate) const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `X-RateLimit-Limit`: the count of the limit closest to exhaustion.
pub(crate) const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`: what remains of it.
pub(crate) const X_RATELIMIT_REMAINING: HeaderName =
    HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`: the seconds until it is full again.
pub(crate) const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
/// `grpc-status`: the gRPC status code of a trailers-only response.
pub(crate) const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// `grpc-message`: the percent-encoded message of a trailers-only response.
pub(crate) const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

/// Which rate-limit headers responses carry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeaderStyle {
    /// `RateLimit-Policy` and `RateLimit`.
    pub(crate) ietf: bool,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset`.
    pub(crate) legacy: bool,
}

/// Whole seconds, rounded up.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// `text` as a header value, if it is a valid one.
pub(crate) fn header_value(text: String) -> Option<HeaderValue> {
    HeaderValue::try_from(text).ok()
}

/// Adds the rate-limit headers describing `decision` (but never overwrites a header the
/// application set itself).
pub(crate) fn add_headers(headers: &mut HeaderMap, decision: &Decision, style: HeaderStyle) {
    let mut put = |name: HeaderName, v: Option<HeaderValue>| {
        if let Some(v) = v {
            headers.entry(name).or_insert(v);
        }
    };
    if style.ietf {
        let (mut policy, mut state) = (String::new(), String::new());
        for s in decision.limits().filter(|s| !s.limit.is_concurrency()) {
            let sep = if policy.is_empty() { "" } else { ", " };
            let name = s.limit.to_string();
            let w = ceil_secs(s.limit.window());
            let _ = write!(policy, "{sep}\"{name}\";q={};w={w}", s.limit.count());
            let t = ceil_secs(s.reset_after);
            let _ = write!(state, "{sep}\"{name}\";r={};t={t}", s.remaining);
        }
        if !policy.is_empty() {
            put(RATELIMIT_POLICY, header_value(policy));
            put(RATELIMIT, header_value(state));
        }
    }
    if style.legacy {
        // The limit closest to exhaustion (least remaining, then longest reset).
        if let Some(s) = decision
            .limits()
            .filter(|s| !s.limit.is_concurrency())
            .min_by_key(|s| (s.remaining, std::cmp::Reverse(s.reset_after)))
        {
            put(X_RATELIMIT_LIMIT, header_value(s.limit.count().to_string()));
            put(X_RATELIMIT_REMAINING, header_value(s.remaining.to_string()));
            put(
                X_RATELIMIT_RESET,
                header_value(ceil_secs(s.reset_after).to_string()),
            );
        }
    }
    if let Some(wait) = decision.retry_after() {
        put(
            RETRY_AFTER,
            header_value(ceil_secs(wait).max(1).to_string()),
        );
    }
}

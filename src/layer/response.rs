//! Rate-limit headers and the responses the layer produces itself.
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

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};

use crate::decision::Decision;

pub(crate) const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
pub(crate) const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

/// Which rate-limit headers responses carry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeaderStyle {
    pub(crate) ietf: bool,
    pub(crate) legacy: bool,
}

/// Whole seconds, rounded up.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

fn value(text: String) -> Option<HeaderValue> {
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
            put(RATELIMIT_POLICY, value(policy));
            put(RATELIMIT, value(state));
        }
    }
    if style.legacy {
        // The limit closest to exhaustion (least remaining, then longest reset).
        if let Some(s) = decision
            .limits()
            .filter(|s| !s.limit.is_concurrency())
            .min_by_key(|s| (s.remaining, std::cmp::Reverse(s.reset_after)))
        {
            put(X_LIMIT, value(s.limit.count().to_string()));
            put(X_REMAINING, value(s.remaining.to_string()));
            put(X_RESET, value(ceil_secs(s.reset_after).to_string()));
        }
    }
    if let Some(wait) = decision.retry_after() {
        put(RETRY_AFTER, value(ceil_secs(wait).max(1).to_string()));
    }
}

/// gRPC status codes the layer answers with.
#[derive(Debug, Clone, Copy)]
pub(crate) enum GrpcCode {
    InvalidArgument = 3,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    Internal = 13,
    Unavailable = 14,
    Unauthenticated = 16,
}

impl GrpcCode {
    pub(crate) fn for_status(status: StatusCode) -> GrpcCode {
        match status {
            StatusCode::TOO_MANY_REQUESTS => GrpcCode::ResourceExhausted,
            StatusCode::UNAUTHORIZED => GrpcCode::Unauthenticated,
            StatusCode::FORBIDDEN => GrpcCode::PermissionDenied,
            StatusCode::SERVICE_UNAVAILABLE => GrpcCode::Unavailable,
            s if s.is_client_error() => GrpcCode::InvalidArgument,
            _ => GrpcCode::Internal,
        }
    }
}

/// A response of the layer's own: plain text for HTTP; for gRPC a trailers-only response
/// (HTTP 200, `grpc-status` and `grpc-message` in the headers), which is what gRPC clients
/// read — a bare HTTP 429 would reach them as an opaque transport error.
pub(crate) fn own_response(status: StatusCode, message: &str, grpc: bool) -> Response<Bytes> {
    let mut res = if grpc {
        let mut res = Response::new(Bytes::new());
        let code = GrpcCode::for_status(status) as u16;
        let h = res.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        h.insert(GRPC_STATUS, HeaderValue::from(code));
        if let Some(v) = value(grpc_percent_encode(message)) {
            h.insert(GRPC_MESSAGE, v);
        }
        res
    } else {
        let mut res = Response::new(Bytes::from(format!("{message}\n")));
        *res.status_mut() = status;
        res.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        res
    };
    res.extensions_mut().insert(OwnResponse);
    res
}

/// Marks responses the layer produced itself (in their extensions).
#[derive(Debug, Clone, Copy)]
pub(crate) struct OwnResponse;

/// gRPC's `grpc-message` encoding: bytes outside printable ASCII, and `%`, percent-encoded.
fn grpc_percent_encode(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    for b in message.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The message of a limited request.
pub(crate) fn limited_message(decision: &Decision) -> String {
    match decision.denied_by() {
        Some(s) if s.limit.is_concurrency() => format!(
            "too many concurrent requests: {} (retry in {} s)",
            s.limit,
            ceil_secs(s.retry_after.unwrap_or_default()).max(1)
        ),
        Some(s) => format!(
            "rate limit exceeded: {} (retry in {} s)",
            s.limit,
            ceil_secs(s.retry_after.unwrap_or_default()).max(1)
        ),
        None => "rate limit exceeded".into(),
    }
}

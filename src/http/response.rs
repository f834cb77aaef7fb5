//! The responses the middlewares produce themselves: plain text for HTTP, trailers-only
//! responses for gRPC.

use std::fmt::Write;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};

use super::headers::{ceil_secs, header_value, GRPC_MESSAGE, GRPC_STATUS};
use crate::Decision;

/// gRPC status codes the middlewares answer with.
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
    /// The gRPC code matching an HTTP status.
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

/// Marks responses a middleware produced itself (in their extensions).
#[derive(Debug, Clone, Copy)]
pub(crate) struct OwnResponse;

/// A response of the middleware's own: plain text for HTTP; for gRPC a trailers-only response
/// (HTTP 200, `grpc-status` and `grpc-message` in the headers), which is what gRPC clients
/// read — a bare HTTP 429 would reach them as an opaque transport error.
pub(crate) fn own_response(status: StatusCode, message: &str, grpc: bool) -> Response<Bytes> {
    let mut res = if grpc {
        let mut res = Response::new(Bytes::new());
        let code = GrpcCode::for_status(status) as u16;
        let h = res.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        h.insert(GRPC_STATUS, HeaderValue::from(code));
        if let Some(v) = header_value(grpc_percent_encode(message)) {
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

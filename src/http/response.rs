//! The responses the middlewares produce themselves: plain text (or RFC 9457 problem details)
//! for HTTP, trailers-only responses for gRPC.

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

/// The problem type of a request over its quota (draft-ietf-httpapi-ratelimit-headers-11
/// §5.1; recommended status 429).
pub(crate) const QUOTA_EXCEEDED: &str =
    "https://iana.org/assignments/http-problem-types#quota-exceeded";
/// The problem type of a request refused for lack of capacity (§5.2; recommended status 503).
pub(crate) const TEMPORARY_REDUCED_CAPACITY: &str =
    "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity";

/// An RFC 9457 `application/problem+json` response to a limited request: the draft's
/// `quota-exceeded` problem type, or `temporary-reduced-capacity` when the status is 503
/// (a load shedder), with the limits that denied as `violated-policies` (named as in the
/// `RateLimit` fields).
pub(crate) fn problem_response(status: StatusCode, decision: &Decision) -> Response<Bytes> {
    let mut violated: Vec<String> = Vec::new();
    for s in decision.statuses().iter().filter(|s| !s.allowed) {
        let name = s.limit.to_string();
        if !violated.contains(&name) {
            violated.push(name);
        }
    }
    problem(status, &limited_message(decision), Some(&violated))
}

/// The RFC 9457 `application/problem+json` answer of a load shedder: status 503, the draft's
/// `temporary-reduced-capacity` problem type, `detail`, and no `violated-policies` (no
/// quota was exceeded).
pub(crate) fn shed_problem_response(detail: &str) -> Response<Bytes> {
    problem(StatusCode::SERVICE_UNAVAILABLE, detail, None)
}

/// A problem+json response: `quota-exceeded`, or `temporary-reduced-capacity` when the
/// status is 503, with `violated-policies` when given.
fn problem(status: StatusCode, detail: &str, violated: Option<&[String]>) -> Response<Bytes> {
    let (kind, title) = if status == StatusCode::SERVICE_UNAVAILABLE {
        (TEMPORARY_REDUCED_CAPACITY, "Temporary Reduced Capacity")
    } else {
        (QUOTA_EXCEEDED, "Quota Exceeded")
    };
    let mut body = String::from("{");
    let _ = write!(
        body,
        "\"type\":{},\"title\":{},\"status\":{},\"detail\":{}",
        json_string(kind),
        json_string(title),
        status.as_u16(),
        json_string(detail),
    );
    if let Some(violated) = violated {
        body.push_str(",\"violated-policies\":[");
        for (i, name) in violated.iter().enumerate() {
            if i > 0 {
                body.push(',');
            }
            body.push_str(&json_string(name));
        }
        body.push(']');
    }
    body.push_str("}\n");
    let mut res = Response::new(Bytes::from(body));
    *res.status_mut() = status;
    res.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    res.extensions_mut().insert(OwnResponse);
    res
}

/// `text` as a JSON string.
fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::json_string;

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_string("10/s"), r#""10/s""#);
        assert_eq!(json_string("a\"b\\c\n"), r#""a\"b\\c\u000a""#);
    }
}

//! The responses the middlewares produce themselves: plain text (or RFC 9457 problem details)
//! for HTTP, trailers-only responses for gRPC.

use std::fmt::{self, Write};

use bytes::{Bytes, BytesMut};
use http::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use http::{Response, StatusCode};

use super::chunk;
use super::headers::{ceil_secs, GRPC_MESSAGE, GRPC_STATUS};
use crate::Decision;

/// What a shed request is told, by either load shedder: the service is overloaded, and
/// nothing of its capacity.
pub(crate) const SHED_MESSAGE: &str = "server overloaded: request shed; retry later";

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
            StatusCode::SERVICE_UNAVAILABLE
            | StatusCode::BAD_GATEWAY
            | StatusCode::GATEWAY_TIMEOUT => GrpcCode::Unavailable,
            s if s.is_client_error() => GrpcCode::InvalidArgument,
            _ => GrpcCode::Internal,
        }
    }

    /// The gRPC code of a call a limit refused, answered `status` over HTTP: the status's own
    /// code where gRPC has one (401, 403), else `RESOURCE_EXHAUSTED` for a 4xx and
    /// `UNAVAILABLE` for a 5xx. A limit is never a malformed call (`INVALID_ARGUMENT`, which
    /// clients do not retry) nor a fault of the server (`INTERNAL`).
    pub(crate) fn for_limit(status: StatusCode) -> GrpcCode {
        match status {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => GrpcCode::for_status(status),
            s if s.is_client_error() => GrpcCode::ResourceExhausted,
            _ => GrpcCode::Unavailable,
        }
    }
}

/// A response of the middleware's own: plain text for HTTP; for gRPC (`grpc`: the request's
/// `content-type`, one of gRPC's) a trailers-only response (HTTP 200, `grpc-status` and
/// `grpc-message` in the headers), which is what gRPC clients read — a bare HTTP 429 would
/// reach them as an opaque transport error.
pub(crate) fn own_response(
    status: StatusCode,
    message: impl fmt::Display,
    grpc: Option<&HeaderValue>,
) -> Response<Bytes> {
    if let Some(content_type) = grpc {
        return grpc_response(GrpcCode::for_status(status), message, content_type);
    }
    let text = chunk::text(|out| writeln!(out, "{message}").ok()).unwrap_or_default();
    let mut res = Response::new(text);
    *res.status_mut() = status;
    let h = res.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(CACHE_CONTROL, NO_STORE);
    res
}

/// A trailers-only gRPC response of `code` and `message`, in the request's `content_type`:
/// a grpc-web client (`application/grpc-web`, `application/grpc-web-text`) reads the status
/// only from a response of its own kind, as a gRPC one does from `application/grpc`.
pub(crate) fn grpc_response(
    code: GrpcCode,
    message: impl fmt::Display,
    content_type: &HeaderValue,
) -> Response<Bytes> {
    let mut res = Response::new(Bytes::new());
    let h = res.headers_mut();
    h.insert(CONTENT_TYPE, content_type.clone());
    h.insert(CACHE_CONTROL, NO_STORE);
    h.insert(GRPC_STATUS, HeaderValue::from(code as u16));
    let encoded = chunk::text(|out| write!(GrpcMessage(out), "{message}").ok());
    if let Some(v) = encoded.and_then(|text| HeaderValue::from_maybe_shared(text).ok()) {
        h.insert(GRPC_MESSAGE, v);
    }
    res
}

/// Tells a gRPC client's retry policy when to try again (gRFC A6's `grpc-retry-pushback-ms`):
/// gRPC clients do not read `Retry-After`, and without it retry a refused call after their
/// own backoff, often a tenth of a second.
pub(crate) fn grpc_pushback(headers: &mut http::HeaderMap, wait: std::time::Duration) {
    headers.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from(pushback_ms(wait)));
}

/// `wait` in whole milliseconds, rounded up: a client that comes back then is admitted.
pub(crate) fn pushback_ms(wait: std::time::Duration) -> u64 {
    u64::try_from(wait.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// gRFC A6's pushback header.
const GRPC_RETRY_PUSHBACK_MS: http::HeaderName =
    http::HeaderName::from_static("grpc-retry-pushback-ms");

/// The middlewares' own answers are about one request at one moment: no cache keeps them.
const NO_STORE: HeaderValue = HeaderValue::from_static("no-store");

/// Text written in gRPC's `grpc-message` encoding: bytes outside printable ASCII, and `%`,
/// percent-encoded.
struct GrpcMessage<'a>(&'a mut BytesMut);

impl Write for GrpcMessage<'_> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        const HEX: &[u8; 16] = b"0123456789ABCDEF";
        for b in text.bytes() {
            if (0x20..=0x7e).contains(&b) && b != b'%' {
                self.0.extend_from_slice(&[b]);
            } else {
                let (high, low) = (HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]);
                self.0.extend_from_slice(&[b'%', high, low]);
            }
        }
        Ok(())
    }
}

/// The message of a limited request, written where it goes.
pub(crate) struct LimitedMessage<'a>(pub(crate) &'a Decision);

impl fmt::Display for LimitedMessage<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(s) = self.0.denied_by() else {
            return f.write_str("rate limit exceeded");
        };
        let what = match s.limit.is_concurrency() {
            true => "too many concurrent requests",
            false => "rate limit exceeded",
        };
        let secs = ceil_secs(s.retry_after.unwrap_or_default()).max(1);
        write!(f, "{what}: {} (retry in {secs} s)", s.limit)
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
    problem(
        status,
        &LimitedMessage(decision).to_string(),
        Some(&violated),
    )
}

/// A load shedder's answer of `status` (problem details with `problem`, for HTTP), before
/// its `Retry-After` or gRPC pushback.
pub(crate) fn shed_answer(
    status: StatusCode,
    grpc: Option<&HeaderValue>,
    problem: bool,
) -> Response<Bytes> {
    match (problem, grpc) {
        (true, None) => shed_problem_response(status),
        _ => own_response(status, SHED_MESSAGE, grpc),
    }
}

/// The RFC 9457 `application/problem+json` answer of a load shedder: `status` (503, the
/// draft's `temporary-reduced-capacity` problem type, unless the application chose
/// another), the shedder's message, and no `violated-policies` (no client's quota was
/// exceeded, and the shedder's limit is the service's capacity).
pub(crate) fn shed_problem_response(status: StatusCode) -> Response<Bytes> {
    problem(status, SHED_MESSAGE, None)
}

/// The answer of a middleware of its own that is not a refusal — the store unavailable under a
/// closed failure policy, a request it could not check, a request without a key — as
/// `own_response` writes it, or, with `problem` (the layer answers in problem details) and
/// for HTTP, as an RFC 9457 `application/problem+json` body: of no problem type of its own
/// (`about:blank`: the status says what happened), titled with the status's reason phrase,
/// `message` as its detail. An API whose errors are problem details gets them for these
/// answers too.
pub(crate) fn error_response(
    status: StatusCode,
    message: impl fmt::Display,
    grpc: Option<&HeaderValue>,
    problem: bool,
) -> Response<Bytes> {
    if !problem || grpc.is_some() {
        return own_response(status, message, grpc);
    }
    let title = status.canonical_reason().unwrap_or("Error");
    problem_of(("about:blank", title), status, &message.to_string(), None)
}

/// A problem+json response: `quota-exceeded`, or `temporary-reduced-capacity` when the
/// status is 503, with `violated-policies` when given.
fn problem(status: StatusCode, detail: &str, violated: Option<&[String]>) -> Response<Bytes> {
    let kind = if status == StatusCode::SERVICE_UNAVAILABLE {
        (TEMPORARY_REDUCED_CAPACITY, "Temporary Reduced Capacity")
    } else {
        (QUOTA_EXCEEDED, "Quota Exceeded")
    };
    problem_of(kind, status, detail, violated)
}

/// A problem+json response of the problem type and title `kind`, with `violated-policies`
/// when given.
fn problem_of(
    (kind, title): (&str, &str),
    status: StatusCode,
    detail: &str,
    violated: Option<&[String]>,
) -> Response<Bytes> {
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
    let h = res.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    h.insert(CACHE_CONTROL, NO_STORE);
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
    use std::time::Duration;

    use super::*;
    use crate::decision::{LimitStatus, Origin};

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_string("10/s"), r#""10/s""#);
        assert_eq!(json_string("a\"b\\c\n"), r#""a\"b\\c\u000a""#);
    }

    fn denied_by(limit: &str, retry_after: Option<Duration>) -> Decision {
        let status = LimitStatus {
            identifier: 0,
            limit_index: 0,
            limit: limit.parse().unwrap(),
            allowed: retry_after.is_none(),
            remaining: 0,
            reset_after: Duration::from_secs(1),
            retry_after,
        };
        Decision {
            allowed: false,
            shadow: false,
            cost: 1,
            statuses: vec![status],
            guard: None,
            origin: Origin::Store,
        }
    }

    fn body(res: Response<Bytes>) -> String {
        String::from_utf8(res.into_body().to_vec()).unwrap()
    }

    #[test]
    fn a_refusal_says_what_refused_it_and_when_to_come_back() {
        let retry = Some(Duration::from_millis(2_500));
        let cases = [
            (
                denied_by("10/s", retry),
                "rate limit exceeded: 10/s (retry in 3 s)\n",
            ),
            (
                denied_by("5 concurrent", retry),
                "too many concurrent requests: 5 concurrent (retry in 3 s)\n",
            ),
            // under a second is still a second; no limit named, nothing to say about it
            (
                denied_by("10/s", Some(Duration::from_millis(1))),
                "rate limit exceeded: 10/s (retry in 1 s)\n",
            ),
            (denied_by("10/s", None), "rate limit exceeded\n"),
        ];
        for (decision, text) in cases {
            let res = own_response(
                StatusCode::TOO_MANY_REQUESTS,
                LimitedMessage(&decision),
                None,
            );
            assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(body(res), text);
        }
        // a text longer than a chunk's strings is one of its own
        let long = "x".repeat(chunk::MAX_BYTES * 2);
        let res = own_response(StatusCode::SERVICE_UNAVAILABLE, &long, None);
        assert_eq!(body(res), format!("{long}\n"));
    }

    #[test]
    fn a_grpc_refusal_says_it_in_grpc_message_percent_encoded() {
        let decision = denied_by("10/s", Some(Duration::from_millis(2_500)));
        let grpc = HeaderValue::from_static("application/grpc");
        let res = own_response(
            StatusCode::TOO_MANY_REQUESTS,
            LimitedMessage(&decision),
            Some(&grpc),
        );
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()[CONTENT_TYPE], "application/grpc");
        assert_eq!(res.headers()["grpc-status"], "8");
        assert_eq!(
            res.headers()["grpc-message"],
            "rate limit exceeded: 10/s (retry in 3 s)"
        );
        assert!(res.body().is_empty());
        // `%`, and bytes outside printable ASCII (a line end, UTF-8), as `%XX`
        let res = own_response(StatusCode::BAD_REQUEST, "50% off: \u{e9}\n", Some(&grpc));
        assert_eq!(res.headers()["grpc-message"], "50%25 off: %C3%A9%0A");
        assert_eq!(res.headers()["grpc-status"], "3");
        // longer than a chunk's strings once encoded: a value of its own
        let res = own_response(StatusCode::BAD_REQUEST, "\u{e9}".repeat(100), Some(&grpc));
        assert_eq!(res.headers()["grpc-message"], "%C3%A9".repeat(100).as_str());
    }
}

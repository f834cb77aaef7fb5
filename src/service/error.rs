//! [`RateLimited`]: the error of a limited call.

use std::fmt;
use std::time::Duration;

use crate::Decision;

/// The request was rate-limited: the error a [`KeyedRateLimit`](super::KeyedRateLimit)
/// service fails with, inside its `BoxError`. Downcast to read when to retry.
///
/// ```
/// use tollgate::RateLimited;
///
/// fn retry_in(err: &(dyn std::error::Error + 'static)) -> Option<std::time::Duration> {
///     err.downcast_ref::<RateLimited>().map(RateLimited::retry_after)
/// }
/// # let _ = retry_in;
/// ```
///
/// With the `tonic` feature, tonic reads it as a `RESOURCE_EXHAUSTED` status (its source is
/// that `tonic::Status`, the `retry-after` and `grpc-retry-pushback-ms` metadata with it): a
/// tonic client whose channel is limited, or a tonic server whose routes are, gets
/// `Code::ResourceExhausted` rather than `Code::Unknown` or a reset stream. `Status::from`
/// makes the same status.
#[derive(Debug)]
pub struct RateLimited {
    decision: Decision,
    /// The status tonic finds in the source chain, made when first asked for.
    #[cfg(feature = "tonic")]
    status: std::sync::OnceLock<tonic::Status>,
}

impl Clone for RateLimited {
    fn clone(&self) -> Self {
        RateLimited::new(self.decision.clone())
    }
}

impl RateLimited {
    pub(crate) fn new(decision: Decision) -> Self {
        RateLimited {
            decision,
            #[cfg(feature = "tonic")]
            status: std::sync::OnceLock::new(),
        }
    }

    /// How long until the same request would be admitted.
    pub fn retry_after(&self) -> Duration {
        self.decision.retry_after().unwrap_or_default()
    }

    /// The whole decision.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }
}

impl fmt::Display for RateLimited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.decision.denied_by() {
            Some(s) => write!(
                f,
                "rate limited by {}; retry in {:?}",
                s.limit,
                self.retry_after()
            ),
            None => f.write_str("rate limited"),
        }
    }
}

impl std::error::Error for RateLimited {
    /// With the `tonic` feature, the `RESOURCE_EXHAUSTED` status tonic looks for in an
    /// error's source chain (see the type's documentation).
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        #[cfg(feature = "tonic")]
        return Some(self.status.get_or_init(|| grpc_status(self)));
        #[cfg(not(feature = "tonic"))]
        None
    }
}

#[cfg(feature = "tonic")]
impl From<RateLimited> for tonic::Status {
    fn from(limited: RateLimited) -> tonic::Status {
        grpc_status(&limited)
    }
}

/// The gRPC status of a limited call: `RESOURCE_EXHAUSTED`, with the wait as `retry-after`
/// (whole seconds, as the HTTP layer sends it) and `grpc-retry-pushback-ms` (gRFC A6, which
/// gRPC clients' retry policies read).
#[cfg(feature = "tonic")]
fn grpc_status(limited: &RateLimited) -> tonic::Status {
    let mut status = tonic::Status::resource_exhausted(limited.to_string());
    if let Some(wait) = limited.decision.retry_after() {
        let metadata = status.metadata_mut();
        let secs = crate::http::headers::ceil_secs(wait).max(1);
        metadata.insert("retry-after", secs.into());
        let ms = crate::http::response::pushback_ms(wait);
        metadata.insert("grpc-retry-pushback-ms", ms.into());
    }
    status
}

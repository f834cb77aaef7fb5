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
#[derive(Debug, Clone)]
pub struct RateLimited {
    decision: Decision,
}

impl RateLimited {
    pub(crate) fn new(decision: Decision) -> Self {
        RateLimited { decision }
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

impl std::error::Error for RateLimited {}

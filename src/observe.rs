//! What tollgate tells the application about itself: log events through `tracing` and
//! measurements through `metrics`, each behind its feature. Without the features these are
//! no-ops.
//!
//! Label sets are bounded: a limiter's name (its policy text unless named), a limit's text, a
//! failure kind, a store's key prefix — never an identifier.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `tollgate_decisions_total` | counter | `limiter`, `outcome` (`allowed`, `denied`, `shadow_denied`), `limit` (the denying limit, or empty) |
//! | `tollgate_deny_cache_hits_total` | counter | `limiter` |
//! | `tollgate_failure_policy_total` | counter | `limiter`, `action` (`open`, `closed`, `fallback`) |
//! | `tollgate_store_errors_total` | counter | `store`, `kind` ([`StoreError::kind_label`]) |
//! | `tollgate_store_breaker_open` | gauge (0 or 1) | `store` |
//! | `tollgate_store_call_seconds` | histogram | `store` |
//! | `tollgate_refund_failures_total` | counter | `store`, `kind` ([`StoreError::kind_label`]) |

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::decision::Decision;
use crate::policy::{Limit, Policy};
use crate::store::StoreError;

/// How often at most a limiter in shadow mode logs the requests it let through.
pub(crate) const SHADOW_LOG_EVERY: Duration = Duration::from_secs(10);

/// The error and its sources, `: `-separated (store errors carry no secrets).
#[cfg_attr(not(all(feature = "tracing", feature = "redis")), allow(dead_code))]
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// One check of a store: its latency (none when the breaker answered without calling it),
/// and its failure if it failed.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn store_call(
    store: &Arc<str>,
    took: Option<Duration>,
    result: Result<(), &StoreError>,
) {
    #[cfg(feature = "metrics")]
    {
        if let Some(took) = took {
            metrics::histogram!("tollgate_store_call_seconds", "store" => store.clone())
                .record(took.as_secs_f64());
        }
        if let Err(e) = result {
            metrics::counter!(
                "tollgate_store_errors_total",
                "store" => store.clone(),
                "kind" => e.kind_label()
            )
            .increment(1);
        }
    }
    #[cfg(feature = "tracing")]
    if let (Err(e), Some(_)) = (result, took) {
        tracing::debug!(target: "tollgate", store = &**store, kind = e.kind_label(), error = %chain(e), "rate-limit store call failed");
    }
    let _ = (store, took, result);
}

/// A charge could not be given back (a check split across Redis Cluster slots was denied by
/// one slot and admitted by another): it stays until its state expires, and may deny a few
/// requests it should not have (never admit one). The failed call itself is counted with the
/// store's other failures too.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn refund_failed(store: &str, e: &StoreError) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "tollgate_refund_failures_total",
        "store" => store.to_string(),
        "kind" => e.kind_label()
    )
    .increment(1);
    #[cfg(feature = "tracing")]
    tracing::warn!(
        target: "tollgate",
        store,
        kind = e.kind_label(),
        error = %chain(e),
        "rate-limit store could not give back a charge: it holds until its state expires"
    );
    let _ = (store, e);
}

/// A store's breaker opened: it is failing, and checks are answered by the failure policies.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn breaker_opened(store: &str, e: &StoreError) {
    #[cfg(feature = "metrics")]
    metrics::gauge!("tollgate_store_breaker_open", "store" => store.to_string()).set(1.0);
    #[cfg(feature = "tracing")]
    tracing::warn!(
        target: "tollgate",
        store,
        kind = e.kind_label(),
        error = %chain(e),
        "rate-limit store failing: checks are answered by each limiter's failure policy until it answers again"
    );
    let _ = (store, e);
}

/// A store's breaker closed: it answers again.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn breaker_closed(store: &str) {
    #[cfg(feature = "metrics")]
    metrics::gauge!("tollgate_store_breaker_open", "store" => store.to_string()).set(0.0);
    #[cfg(feature = "tracing")]
    tracing::warn!(target: "tollgate", store, "rate-limit store answers again: checks go through it");
    let _ = store;
}

/// How a limiter's failure policy answered a check the store could not decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Open,
    Closed,
    Fallback,
}

impl Action {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn label(self) -> &'static str {
        match self {
            Action::Open => "open",
            Action::Closed => "closed",
            Action::Fallback => "fallback",
        }
    }
}

/// A check the store could not decide, answered by the failure policy.
pub(crate) fn failure_answered(limiter: &str, action: Action, e: &StoreError) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "tollgate_failure_policy_total",
        "limiter" => limiter.to_string(),
        "action" => action.label()
    )
    .increment(1);
    #[cfg(feature = "tracing")]
    tracing::trace!(target: "tollgate", limiter, action = ?action, kind = e.kind_label(), "check answered by the failure policy");
    let _ = (limiter, action, e);
}

/// A denial answered by the deny cache, without the store.
pub(crate) fn deny_cache_hit(limiter: &str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("tollgate_deny_cache_hits_total", "limiter" => limiter.to_string())
        .increment(1);
    let _ = limiter;
}

/// A decision (from the store or the fallback, enforced or in shadow mode).
pub(crate) fn decision(limiter: &Arc<str>, limits: &[Arc<str>], decision: &Decision) {
    #[cfg(feature = "metrics")]
    {
        // The labels are shared, not copied: the limiter's name and its limits' texts are
        // made once per policy version.
        let limit: metrics::SharedString = decision
            .would_deny_by()
            .and_then(|s| limits.get(s.limit_index))
            .map_or_else(
                || metrics::SharedString::const_str(""),
                |l| l.clone().into(),
            );
        let outcome = match (decision.would_deny(), decision.is_shadow()) {
            (false, _) => "allowed",
            (true, false) => "denied",
            (true, true) => "shadow_denied",
        };
        metrics::counter!(
            "tollgate_decisions_total",
            "limiter" => limiter.clone(),
            "outcome" => outcome,
            "limit" => limit
        )
        .increment(1);
    }
    let _ = (limiter, limits, decision);
}

/// A limiter's policy changed.
pub(crate) fn policy_changed(limiter: &str, old: &Policy, new: &Policy) {
    #[cfg(feature = "tracing")]
    tracing::info!(target: "tollgate", limiter, old = %old, new = %new, "rate-limit policy changed");
    let _ = (limiter, old, new);
}

/// The would-be denials of a limiter in shadow mode, logged at a bounded rate: the first at
/// once, then at most one line every [`SHADOW_LOG_EVERY`], with the number let through since
/// the previous line. The exact figures are in the metrics.
#[derive(Debug, Default)]
pub(crate) struct ShadowLog {
    /// Would-be denials not logged yet.
    pending: AtomicU64,
    /// When the last line was written.
    last: Mutex<Option<Instant>>,
}

impl ShadowLog {
    /// A request `limiter` let through that the policy would have denied (by `limit`, when
    /// a limit decided).
    pub(crate) fn would_deny(&self, limiter: &str, limit: Option<&Limit>) {
        #[cfg(feature = "tracing")]
        if let Some((count, since)) = self.count(Instant::now()) {
            let limit = limit.map(ToString::to_string).unwrap_or_default();
            tracing::info!(
                target: "tollgate",
                limiter,
                would_deny = count,
                since_s = since.map(|d| d.as_secs()),
                limit,
                "rate limit in shadow mode let through requests its policy denies"
            );
        }
        let _ = (limiter, limit);
    }

    /// Counts a would-be denial at `now`; when a line is due, the number to log and the
    /// time since the previous line (none for the first).
    #[cfg_attr(not(feature = "tracing"), allow(dead_code))]
    fn count(&self, now: Instant) -> Option<(u64, Option<Duration>)> {
        self.pending.fetch_add(1, Ordering::Relaxed);
        // Whoever holds the lock is writing the line: this denial is in its count or the
        // next one's.
        let mut last = self.last.try_lock().ok()?;
        let since = last.map(|t| now.saturating_duration_since(t));
        if since.is_some_and(|d| d < SHADOW_LOG_EVERY) {
            return None;
        }
        *last = Some(now);
        Some((self.pending.swap(0, Ordering::Relaxed), since))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shadow_lines_are_bounded_and_lose_no_count() {
        let log = ShadowLog::default();
        let t0 = Instant::now();
        assert_eq!(log.count(t0), Some((1, None)), "the first at once");
        for k in 1..500 {
            assert_eq!(log.count(t0 + Duration::from_millis(k)), None);
        }
        let t1 = t0 + SHADOW_LOG_EVERY;
        assert_eq!(log.count(t1), Some((500, Some(SHADOW_LOG_EVERY))));
        assert_eq!(log.count(t1 + Duration::from_secs(1)), None);
        let t2 = t1 + Duration::from_secs(60);
        assert_eq!(log.count(t2), Some((2, Some(Duration::from_secs(60)))));
    }
}

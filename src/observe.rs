//! What tollgate tells the application about itself: log events through `tracing` and
//! measurements through `metrics`, each behind its feature. Without the features these are
//! no-ops.
//!
//! Label sets are bounded: a limiter's name (its policy text unless named), a limit's text, a
//! failure kind, a store's key prefix — never an identifier.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `tollgate_decisions_total` | counter | `limiter`, `outcome` (`allowed`, `denied`), `limit` (the denying limit, or empty) |
//! | `tollgate_deny_cache_hits_total` | counter | `limiter` |
//! | `tollgate_failure_policy_total` | counter | `limiter`, `action` (`open`, `closed`, `fallback`) |
//! | `tollgate_store_errors_total` | counter | `store`, `kind` ([`StoreError::kind_label`]) |
//! | `tollgate_store_breaker_open` | gauge (0 or 1) | `store` |
//! | `tollgate_store_call_seconds` | histogram | `store` |

use std::time::Duration;

use crate::decision::Decision;
use crate::store::StoreError;

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
pub(crate) fn store_call(store: &str, took: Option<Duration>, result: Result<(), &StoreError>) {
    #[cfg(feature = "metrics")]
    {
        if let Some(took) = took {
            metrics::histogram!("tollgate_store_call_seconds", "store" => store.to_string())
                .record(took.as_secs_f64());
        }
        if let Err(e) = result {
            metrics::counter!(
                "tollgate_store_errors_total",
                "store" => store.to_string(),
                "kind" => e.kind_label()
            )
            .increment(1);
        }
    }
    #[cfg(feature = "tracing")]
    if let (Err(e), Some(_)) = (result, took) {
        tracing::debug!(target: "tollgate", store, kind = e.kind_label(), error = %chain(e), "rate-limit store call failed");
    }
    let _ = (store, took, result);
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

/// A decision (from the store or the fallback).
pub(crate) fn decision(limiter: &str, decision: &Decision) {
    #[cfg(feature = "metrics")]
    {
        let (outcome, limit) = match decision.denied_by() {
            None => ("allowed", String::new()),
            Some(s) => ("denied", s.limit.to_string()),
        };
        metrics::counter!(
            "tollgate_decisions_total",
            "limiter" => limiter.to_string(),
            "outcome" => outcome,
            "limit" => limit
        )
        .increment(1);
    }
    let _ = (limiter, decision);
}

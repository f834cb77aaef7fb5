//! What tollgate tells the application about itself: log events through `tracing` and
//! measurements through `metrics`, each behind its feature. Without the features these are
//! no-ops.
//!
//! Label sets are bounded: a limiter's name (its policy text unless named), a limit's text, a
//! failure kind, a store's key prefix — never an identifier. Every metric is described to the
//! recorder (its help text and unit) as limiters, schedulers, stores and shedders are built.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `tollgate_decisions_total` | counter | `limiter` (a limiter's or a scheduler's name), `outcome` (`allowed`, `denied`, `shadow_denied`), `limit` (the denying limit, or empty) |
//! | `tollgate_deny_cache_hits_total` | counter | `limiter` |
//! | `tollgate_check_errors_total` | counter | `limiter`, `error` (`cost`, `no_identifiers`, `too_many_identifiers`, `not_one_identifier`: a check that could not be made, returned as an error, which a layer answers with 400 or 500) |
//! | `tollgate_failure_policy_total` | counter | `limiter`, `action` (`open`, `closed`, `fallback`) |
//! | `tollgate_store_errors_total` | counter | `store`, `kind` ([`StoreError::kind_label`]) |
//! | `tollgate_store_breaker_open` | gauge (the store's breaker open: 1, or 0 from its start; stores of one prefix add up) | `store` |
//! | `tollgate_store_call_seconds` | histogram (calls that reached the store; one its caller dropped, for as long as it ran) | `store` |
//! | `tollgate_refund_failures_total` | counter | `store`, `kind` ([`StoreError::kind_label`]) |
//! | `tollgate_missing_key_total` | counter | `limiter` (the one that would have checked the request: a route's, or the layer's default), `action` (`allow`, `reject`, `shadow`: let through in shadow mode; `partial`: no peer address for the address extractors, checked by the other keys found) |
//! | `tollgate_give_back_failures_total` | counter | `store`, `kind` ([`StoreError::kind_label`]) |
//! | `tollgate_lease_failures_total` | counter | `store`, `call` (`renew`, `release`), `kind` ([`StoreError::kind_label`]) |
//! | `tollgate_leases_lost_total` | counter | `store` (`memory` for the memory store) |
//! | `tollgate_memory_evictions_total` | counter | `store` (the memory store's name: `memory`, a [name](crate::store::MemoryStoreBuilder::name) of its own, or `fallback:NAME` for a limiter's or scheduler's fallback), for states still in use that a memory store at its bound evicted |
//! | `tollgate_charges_refused_total` | counter | `limiter` (the one that checked the request first: a route's, or the layer's default; a layer charging by response whose charge the limits no longer admitted, its request served over the limit) |
//! | `tollgate_client_ip_fallbacks_total` | counter | `reason` (`headers_disagree`, `not_an_address`, `too_few_hops`: a request through the proxies keyed by a proxy's address, its forwarding headers giving no client; see [`ClientIp`](crate::key::ClientIp)) |
//! | `tollgate_shed_total` | counter | `shedder` (`utilization`, or `utilization:NAME` when [named](crate::shed::UtilizationShedder::name), for a [`UtilizationShedLayer`](crate::shed::UtilizationShedLayer), `shed:NAME` for a [`FleetShedder`](crate::shed::FleetShedder)'s layer), `priority` (`high`, `normal`, `low`) |

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::decision::Decision;
use crate::policy::{Limit, Policy};
use crate::store::StoreError;

/// Describes every metric of this module to the recorder installed (its `HELP` line and
/// unit, in Prometheus' exposition): called as limiters, schedulers, stores and load shedders
/// are built, so that a recorder installed at start-up, before them, has the descriptions
/// before the first value. (Recorders keep the last description given; giving it again is a
/// map lookup, and building is rare.)
pub(crate) fn describe_metrics() {
    #[cfg(feature = "metrics")]
    {
        use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
        describe_counter!(
            "tollgate_decisions_total",
            Unit::Count,
            "Checks decided by a rate limiter or placements by a scheduler, by outcome and denying limit"
        );
        describe_counter!(
            "tollgate_deny_cache_hits_total",
            Unit::Count,
            "Checks refused from the limiter's cache of denials, without asking the store"
        );
        describe_counter!(
            "tollgate_check_errors_total",
            Unit::Count,
            "Checks that could not be made (a cost the policy never admits, no or too many identifiers)"
        );
        describe_counter!(
            "tollgate_failure_policy_total",
            Unit::Count,
            "Checks answered by the limiter's failure policy because the store could not decide"
        );
        describe_counter!(
            "tollgate_store_errors_total",
            Unit::Count,
            "Calls to a rate-limit store that failed, by kind"
        );
        describe_gauge!(
            "tollgate_store_breaker_open",
            Unit::Count,
            "Whether the store's circuit breaker is open (1) or closed (0)"
        );
        describe_histogram!(
            "tollgate_store_call_seconds",
            Unit::Seconds,
            "Time a call to a rate-limit store took"
        );
        describe_counter!(
            "tollgate_refund_failures_total",
            Unit::Count,
            "Charges of a check across Redis Cluster slots that could not be given back"
        );
        describe_counter!(
            "tollgate_missing_key_total",
            Unit::Count,
            "Requests in which no key extractor found a rate-limit key, by what was done with them"
        );
        describe_counter!(
            "tollgate_give_back_failures_total",
            Unit::Count,
            "Scheduler slots that could not be given back when their waiter left"
        );
        describe_counter!(
            "tollgate_lease_failures_total",
            Unit::Count,
            "Calls renewing or releasing concurrency slots that failed"
        );
        describe_counter!(
            "tollgate_leases_lost_total",
            Unit::Count,
            "Concurrency slots whose lease ran out while their request was still running"
        );
        describe_counter!(
            "tollgate_memory_evictions_total",
            Unit::Count,
            "States still in use evicted by a memory store at its bound (max_keys)"
        );
        describe_counter!(
            "tollgate_charges_refused_total",
            Unit::Count,
            "Responses a layer charging by response could not charge: the limits no longer admitted them, their requests served over the limit"
        );
        describe_counter!(
            "tollgate_client_ip_fallbacks_total",
            Unit::Count,
            "Requests through the proxies that ClientIp keyed by a proxy's address, their forwarding headers giving no client"
        );
        describe_counter!(
            "tollgate_shed_total",
            Unit::Count,
            "Requests load shedders refused, by shedder and priority"
        );
    }
}

/// A cluster connection of the store `store` was made without the masters `skipped`, which
/// could not be reached for their start-up checks: calls to their slots fail until they
/// answer (or their replicas take over), and the rest go through.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn cluster_masters_skipped(store: &str, skipped: &[String]) {
    #[cfg(feature = "tracing")]
    tracing::warn!(
        target: "tollgate",
        store,
        masters = %skipped.join(", "),
        "rate-limit store connected to the cluster without masters it could not reach: checks of their slots fail until they answer"
    );
    let _ = (store, skipped);
}

/// How often at most a [`BoundedLog`] writes a line: a limiter in shadow mode of the requests
/// it let through, a store of the lease calls that failed.
pub(crate) const LOG_EVERY: Duration = Duration::from_secs(10);

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

/// The keys of a store's call latencies and failures in the metrics, built once with the
/// store (see [`LimiterKeys`]): a store whose breaker is open fails every check at once, and
/// counts each failure without building its key.
#[derive(Debug)]
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) struct StoreKeys {
    #[cfg(feature = "metrics")]
    call_seconds: metrics::Key,
    /// `tollgate_store_errors_total` of each kind, in the order of `StoreError::kind_index`.
    #[cfg(feature = "metrics")]
    errors: [metrics::Key; crate::store::KIND_LABELS.len()],
}

impl StoreKeys {
    /// The keys of the store named `store`.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn new(store: &Arc<str>) -> StoreKeys {
        #[cfg(feature = "metrics")]
        {
            let store = metrics::Label::new("store", store.clone());
            let errors = crate::store::KIND_LABELS.map(|kind| {
                let labels = vec![
                    store.clone(),
                    metrics::Label::from_static_parts("kind", kind),
                ];
                metrics::Key::from_parts("tollgate_store_errors_total", labels)
            });
            StoreKeys {
                call_seconds: metrics::Key::from_parts("tollgate_store_call_seconds", vec![store]),
                errors,
            }
        }
        #[cfg(not(feature = "metrics"))]
        {
            let _ = store;
            StoreKeys {}
        }
    }
}

/// One check of the store `store` (whose keys are `keys`): its latency (none when the breaker
/// answered without calling it), and its failure if it failed.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn store_call(
    store: &Arc<str>,
    keys: &StoreKeys,
    took: Option<Duration>,
    result: Result<(), &StoreError>,
) {
    #[cfg(feature = "metrics")]
    {
        if let Some(took) = took {
            metrics::with_recorder(|r| r.register_histogram(&keys.call_seconds, &METADATA))
                .record(took.as_secs_f64());
        }
        if let Some(key) = result.err().and_then(|e| keys.errors.get(e.kind_index())) {
            metrics::with_recorder(|r| r.register_counter(key, &METADATA)).increment(1);
        }
    }
    #[cfg(feature = "tracing")]
    if let (Err(e), Some(_)) = (result, took) {
        tracing::debug!(target: "tollgate", store = &**store, kind = e.kind_label(), error = %chain(e), "rate-limit store call failed");
    }
    let _ = (store, keys, took, result);
}

/// A store's breaker opened: it is failing, and checks are answered by the failure policies.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn breaker_opened(store: &str, e: &StoreError) {
    #[cfg(feature = "metrics")]
    metrics::gauge!("tollgate_store_breaker_open", "store" => store.to_string()).increment(1.0);
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

/// A store's breaker was made: its gauge is there, at rest, before any failure (counted
/// from where it is: stores of one prefix share the gauge, which counts their open
/// breakers).
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn breaker_made(store: &str) {
    describe_metrics();
    #[cfg(feature = "metrics")]
    metrics::gauge!("tollgate_store_breaker_open", "store" => store.to_string()).increment(0.0);
    let _ = store;
}

/// A store's breaker was let go (its store dropped) while open: it is no longer counted
/// open, so that a store gone while failing does not leave the gauge open for good.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn breaker_dropped_open(store: &str) {
    #[cfg(feature = "metrics")]
    metrics::gauge!("tollgate_store_breaker_open", "store" => store.to_string()).decrement(1.0);
    let _ = store;
}

/// A store's open breaker had no probe running (its task went with the runtime it ran on):
/// a call started another.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn breaker_probe_restarted(store: &str) {
    #[cfg(feature = "tracing")]
    tracing::warn!(
        target: "tollgate",
        store,
        "rate-limit store's breaker had lost the task asking whether the store is back (its runtime shut down): started another"
    );
    let _ = store;
}

/// A store's breaker closed: it answers again.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn breaker_closed(store: &str) {
    #[cfg(feature = "metrics")]
    metrics::gauge!("tollgate_store_breaker_open", "store" => store.to_string()).decrement(1.0);
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
    /// Its place in `LimiterKeys::failure_policy`.
    #[cfg(feature = "metrics")]
    fn index(self) -> usize {
        match self {
            Action::Open => 0,
            Action::Closed => 1,
            Action::Fallback => 2,
        }
    }

    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn label(self) -> &'static str {
        match self {
            Action::Open => "open",
            Action::Closed => "closed",
            Action::Fallback => "fallback",
        }
    }
}

/// A check of the limiter `limiter` (whose keys are `keys`) the store could not decide,
/// answered by the failure policy.
pub(crate) fn failure_answered(limiter: &str, keys: &LimiterKeys, action: Action, e: &StoreError) {
    #[cfg(feature = "metrics")]
    count(&keys.failure_policy[action.index()]);
    #[cfg(feature = "tracing")]
    tracing::trace!(target: "tollgate", limiter, action = ?action, kind = e.kind_label(), "check answered by the failure policy");
    let _ = (limiter, keys, action, e);
}

/// A check of the limiter `limiter` that could not be made (`e`: a cost its policy never
/// admits, no identifiers or too many), returned to the caller: counted, as a layer answers
/// it itself (400 or 500).
#[cold]
#[inline(never)]
pub(crate) fn check_failed(limiter: &str, e: &crate::limiter::Error) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "tollgate_check_errors_total",
        "limiter" => limiter.to_string(),
        "error" => e.label()
    )
    .increment(1);
    let _ = (limiter, e);
}

/// A denial answered by the deny cache, without the store, for the limiter whose keys are
/// `keys`.
pub(crate) fn deny_cache_hit(keys: &LimiterKeys) {
    #[cfg(feature = "metrics")]
    count(&keys.deny_cache_hits);
    let _ = keys;
}

/// The keys of the metrics a limiter (one version of its policy) counts check by check, built
/// with the version.
///
/// `counter!` with labels that are not literals builds its key at every call: the list of
/// labels (an allocation) and the key's hash over the name and every label. Built here once,
/// a count costs the recorder's lookup alone. Each count still asks the recorder in effect for
/// its counter, as `counter!` does (no handle is kept from one count to the next): a recorder
/// installed later, a thread's local recorder, or one that drops idle metrics sees every count,
/// as it would from the macro.
#[derive(Debug)]
pub(crate) struct LimiterKeys {
    #[cfg(feature = "metrics")]
    allowed: metrics::Key,
    /// `denied` by each limit, in the policy's order, then with an empty `limit`.
    #[cfg(feature = "metrics")]
    denied: Box<[metrics::Key]>,
    /// `shadow_denied`, laid out as `denied`.
    #[cfg(feature = "metrics")]
    shadow_denied: Box<[metrics::Key]>,
    #[cfg(feature = "metrics")]
    deny_cache_hits: metrics::Key,
    /// `tollgate_failure_policy_total` by action: open, closed, fallback.
    #[cfg(feature = "metrics")]
    failure_policy: [metrics::Key; 3],
}

impl LimiterKeys {
    /// The keys of the limiter `name` with the limits `limits` (a fallback decision's
    /// statuses name these too: see `Limiter::answer`).
    pub(crate) fn new(name: &Arc<str>, limits: &[Limit]) -> LimiterKeys {
        #[cfg(feature = "metrics")]
        {
            use metrics::{Key, Label};
            let limiter = || Label::new("limiter", name.clone());
            let decisions = |outcome: &'static str, limit: Option<&Limit>| {
                let limit: metrics::SharedString = limit.map_or_else(
                    || metrics::SharedString::const_str(""),
                    |l| l.to_string().into(),
                );
                Key::from_parts(
                    "tollgate_decisions_total",
                    vec![
                        limiter(),
                        Label::new("outcome", outcome),
                        Label::new("limit", limit),
                    ],
                )
            };
            let by_limit = |outcome: &'static str| -> Box<[Key]> {
                let by_limit = limits.iter().map(|l| decisions(outcome, Some(l)));
                by_limit.chain([decisions(outcome, None)]).collect()
            };
            let failure = |action: Action| {
                Key::from_parts(
                    "tollgate_failure_policy_total",
                    vec![limiter(), Label::new("action", action.label())],
                )
            };
            LimiterKeys {
                allowed: decisions("allowed", None),
                denied: by_limit("denied"),
                shadow_denied: by_limit("shadow_denied"),
                deny_cache_hits: Key::from_parts("tollgate_deny_cache_hits_total", vec![limiter()]),
                failure_policy: [Action::Open, Action::Closed, Action::Fallback].map(failure),
            }
        }
        #[cfg(not(feature = "metrics"))]
        {
            let _ = (name, limits);
            LimiterKeys {}
        }
    }
}

/// What `counter!` and `histogram!` pass the recorder with a metric of this module.
#[cfg(feature = "metrics")]
static METADATA: metrics::Metadata<'static> =
    metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

/// Adds one to the counter `key` of the recorder in effect.
#[cfg(feature = "metrics")]
fn count(key: &metrics::Key) {
    metrics::with_recorder(|recorder| recorder.register_counter(key, &METADATA)).increment(1);
}

/// A decision (from the store or the fallback, enforced or in shadow mode) of the limiter (or
/// scheduler) named `name`, whose keys are `keys`: counted, and a would-be denial in shadow
/// mode logged in `shadow_log`.
pub(crate) fn decision(
    keys: &LimiterKeys,
    decision: &Decision,
    shadow_log: &BoundedLog,
    name: &str,
) {
    if decision.is_shadow() && decision.would_deny() {
        shadow_log.would_deny(name, decision.would_deny_by().map(|s| &s.limit));
    }
    #[cfg(feature = "metrics")]
    {
        let by_limit = match (decision.would_deny(), decision.is_shadow()) {
            (false, _) => return count(&keys.allowed),
            (true, false) => &keys.denied,
            (true, true) => &keys.shadow_denied,
        };
        // the denying limit's key, or the last (an empty `limit`) when no limit denied
        let last = by_limit.len().saturating_sub(1);
        let k = decision
            .would_deny_by()
            .map_or(last, |s| s.limit_index.min(last));
        if let Some(key) = by_limit.get(k) {
            count(key);
        }
    }
    let _ = (keys, decision);
}

/// The policy channel the limiter `limiter` followed closed (its sender dropped: a reloader
/// that ended, or panicked): the limiter keeps the policy it has, and follows no more.
pub(crate) fn policy_channel_closed(limiter: &str) {
    #[cfg(feature = "tracing")]
    tracing::info!(
        target: "tollgate",
        limiter,
        "rate-limit policy channel closed (its sender dropped): the limiter keeps its current policy"
    );
    let _ = limiter;
}

/// A limiter's policy changed.
/// `afresh`: the limit parts of the store keys whose counts the new policy does not carry over
/// (`r1s,r1m`): a warning, since requests counted there are admitted again.
pub(crate) fn policy_changed(limiter: &str, old: &Policy, new: &Policy, afresh: &[String]) {
    #[cfg(feature = "tracing")]
    if afresh.is_empty() {
        tracing::info!(target: "tollgate", limiter, old = %old, new = %new, "rate-limit policy changed; every count carries over");
    } else {
        let afresh = afresh
            .iter()
            .map(|t| t.trim_start_matches("}:"))
            .collect::<Vec<_>>()
            .join(" ");
        tracing::warn!(target: "tollgate", limiter, old = %old, new = %new, afresh, "rate-limit policy changed; the counts of these keys start afresh");
    }
    let _ = (limiter, old, new, afresh);
}

/// The fallback of the limiter `limiter` at `share` of the fleet raises `limit` to a count of
/// 1 (its share of the count is below 1): while the store fails, each process admits more
/// than its share of that limit, and the fleet more than the limit.
pub(crate) fn fallback_raised(limiter: &str, limit: &Limit, share: f64) {
    #[cfg(feature = "tracing")]
    let share_count = limit.count() as f64 * share;
    #[cfg(feature = "tracing")]
    tracing::warn!(
        target: "tollgate",
        limiter,
        limit = %limit,
        share,
        share_count,
        "rate-limit fallback holds a limit at a count of 1, above this process's share of it: while the store fails, the fleet admits more than the limit"
    );
    let _ = (limiter, limit, share);
}

/// Events logged at a bounded rate: the first at once, then at most one line every
/// [`LOG_EVERY`], with the number of events since the previous line. The exact figures are in
/// the metrics. One for each kind of event: a limiter's would-be denials in shadow mode, a
/// store's failed lease calls.
#[derive(Debug, Default)]
pub(crate) struct BoundedLog {
    /// Events not logged yet.
    pending: AtomicU64,
    /// When the last line was written.
    last: Mutex<Option<Instant>>,
    /// When the next line is due, in nanoseconds since [`epoch`] (0: at once): an event
    /// before then is counted without the lock, as events on a hot path are (a flood of
    /// would-be denials, or of evictions).
    due_ns: AtomicU64,
}

/// The time [`BoundedLog`]s count their due times from.
fn epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// `t` in nanoseconds since [`epoch`] (0 before it).
fn since_epoch(t: Instant) -> u64 {
    u64::try_from(t.saturating_duration_since(epoch()).as_nanos()).unwrap_or(u64::MAX)
}

impl BoundedLog {
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

    /// A lease call (`renew` or `release`) to the store `store` failed with `e`: a renewal
    /// missed lets a lease expire while its request runs (its slot is then free for
    /// another: over-admission, until the next renewal that reaches the store); a release
    /// missed holds a slot until the release is retried or the lease expires
    /// (under-admission). The keeper retries both on its next tick.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn lease_call_failed(&self, store: &str, call: &'static str, e: &StoreError) {
        #[cfg(feature = "metrics")]
        metrics::counter!(
            "tollgate_lease_failures_total",
            "store" => store.to_string(),
            "call" => call,
            "kind" => e.kind_label()
        )
        .increment(1);
        self.warn_store_failed(
            store,
            call,
            e,
            "rate-limit store could not renew or release concurrency slots: a slot not renewed may expire while its request runs, one not released stays taken until its lease ends; retried every tick",
        );
    }

    /// The store `store` answered a renewal of `count` concurrency leases that it holds them
    /// no longer: they expired before the renewal came (the store unreachable, or the
    /// process stalled, for longer than the lease) or their keys were lost. Their requests
    /// still run, and their slots may be others' now: the limit may admit more than its
    /// count until they end.
    pub(crate) fn leases_lost(&self, store: &str, count: u64) {
        #[cfg(feature = "metrics")]
        metrics::counter!("tollgate_leases_lost_total", "store" => store.to_string())
            .increment(count);
        #[cfg(feature = "tracing")]
        if let Some((events, since)) = self.count_n(Instant::now(), count) {
            tracing::warn!(
                target: "tollgate",
                store,
                lost_leases = events,
                since_s = since.map(|d| d.as_secs()),
                "concurrency slots expired while their requests ran (not renewed within their lease): the limit may admit more than its count until those requests end"
            );
        }
        let _ = (store, count);
    }

    /// A call to the store `store` failed with `e` (the breaker closed: it went to the
    /// store): a check among such calls was answered by its limiter's failure policy. Failures
    /// that come now and then never open the breaker, and without this line only the
    /// `debug` log and the metrics would show them.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn store_call_failed(&self, store: &str, e: &StoreError) {
        self.warn_store_failed(
            store,
            "call",
            e,
            "rate-limit store calls failed: each check among them was answered by its limiter's failure policy (or, across Cluster slots, denied by another slot)",
        );
    }

    /// The load shedder `shedder` (`utilization[:NAME]`, or a fleet shedder's `shed:NAME`) shed a
    /// request of `priority` (its label), under the shedding amount `amount` when the shedder
    /// has one (a utilization shedder; a fleet shedder sheds when its share is full): counted,
    /// and logged at `info` (shedding is the policy working, not a failure) at most every
    /// 10 s. (`amount` is read only when a line is written: it takes the shedder's lock.)
    pub(crate) fn shed(
        &self,
        shedder: &str,
        priority: &'static str,
        amount: impl FnOnce() -> Option<f64>,
    ) {
        #[cfg(feature = "metrics")]
        metrics::counter!(
            "tollgate_shed_total",
            "shedder" => shedder.to_string(),
            "priority" => priority
        )
        .increment(1);
        #[cfg(feature = "tracing")]
        if let Some((count, since)) = self.count(Instant::now()) {
            tracing::info!(
                target: "tollgate",
                shedder,
                shed = count,
                since_s = since.map(|d| d.as_secs()),
                priority,
                amount = amount(),
                "load shedder refused requests with 503 (or UNAVAILABLE) to keep the service within its capacity"
            );
        }
        #[cfg(not(feature = "tracing"))]
        let _ = (shedder, priority, amount);
    }

    /// An attempt to connect to the store `store` failed with `e`: checks are answered by
    /// the failure policy (as `Unavailable`, without the cause) until one succeeds, and the
    /// task keeps trying with a backoff. Logged only (each check answered meanwhile is
    /// counted in `tollgate_store_errors_total`).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn connect_failed(&self, store: &str, e: &StoreError) {
        self.warn_store_failed(
            store,
            "connect",
            e,
            "rate-limit store could not connect; checks are answered by the failure policy until it does, retrying",
        );
    }

    /// The sentinels of `service` could not be asked whether its master moved (`why`: the
    /// kind of failure): the connection in use stays, and a failover whose old master still
    /// takes writes goes unseen until they answer again.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn sentinel_recheck_failed(&self, service: &str, why: &str) {
        #[cfg(feature = "tracing")]
        if let Some((count, since)) = self.count(Instant::now()) {
            tracing::warn!(
                target: "tollgate",
                service,
                why,
                failed_rechecks = count,
                since_s = since.map(|d| d.as_secs()),
                "rate-limit store could not ask the sentinels whether the master moved: a failover goes unseen until they answer"
            );
        }
        let _ = (service, why);
    }

    /// `count` sentinels of `service` failed while another answered (`sentinels`: each one's
    /// address and why: the kind of failure, or that it does not know the service): the
    /// store goes on, but the sentinels are fewer than they look, and a failover may need
    /// them.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn sentinels_failed(&self, service: &str, sentinels: &str, count: u64) {
        #[cfg(feature = "tracing")]
        if let Some((failures, since)) = self.count_n(Instant::now(), count) {
            tracing::warn!(
                target: "tollgate",
                service,
                sentinels,
                failures,
                since_s = since.map(|d| d.as_secs()),
                "sentinels of the rate-limit store's service failed while another answered: the sentinels are fewer than they look"
            );
        }
        let _ = (service, sentinels, count);
    }

    /// A memory store at its bound (`max_keys`) evicted a state still in use: that
    /// identifier's counts start afresh (its quota comes back early) and a concurrency slot it
    /// held is free again. A flood of new identifiers (spoofed addresses, random keys) does
    /// this; a bound too small for the traffic too.
    pub(crate) fn state_evicted(&self, store: &str) {
        #[cfg(feature = "metrics")]
        metrics::counter!("tollgate_memory_evictions_total", "store" => store.to_string())
            .increment(1);
        #[cfg(feature = "tracing")]
        if let Some((count, since)) = self.count(Instant::now()) {
            tracing::warn!(
                target: "tollgate",
                store,
                evicted = count,
                since_s = since.map(|d| d.as_secs()),
                "in-process rate-limit store at its bound (max_keys) evicted states still in use: their counts start afresh"
            );
        }
        let _ = store;
    }

    /// The task keeping the connection of the Redis store `store` had ended under it (its
    /// runtime shut down): a call started another, on its own runtime.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn connection_task_lost(&self, store: &str) {
        #[cfg(feature = "tracing")]
        if let Some((count, since)) = self.count(Instant::now()) {
            tracing::warn!(
                target: "tollgate",
                store,
                restarts = count,
                since_s = since.map(|d| d.as_secs()),
                "rate-limit store's connection task had ended with its runtime: connecting again from this one"
            );
        }
        let _ = store;
    }

    /// The slots of `leases` requests on the store `store` went unrenewed for a while (the
    /// task renewing them ended under them, its runtime shut down, or they were taken outside
    /// a runtime): a task started on this runtime took them over. Renewed late, a slot whose
    /// lease ran out meanwhile is reported lost when the new task renews it.
    pub(crate) fn keeper_lost(&self, store: &str, leases: usize) {
        #[cfg(feature = "tracing")]
        if let Some((count, since)) = self.count_n(Instant::now(), leases as u64) {
            tracing::warn!(
                target: "tollgate",
                store,
                leases = count,
                since_s = since.map(|d| d.as_secs()),
                "rate-limit store's concurrency slots went unrenewed (the task renewing them ended with its runtime, or they were taken outside a runtime): a task started on this runtime took them over, late (a slot whose lease ran out meanwhile is reported lost)"
            );
        }
        let _ = (store, leases);
    }

    /// A charge could not be given back to the store `store` (`e`; a check split across
    /// Redis Cluster slots was denied by one slot and admitted by another): it stays until
    /// its state expires, and may deny a few requests it should not have (never admit one).
    /// Counted, and a warning at a bounded rate: a client whose identifiers span slots could
    /// otherwise write a line a request while Redis fails. (A refund does not go through the
    /// breaker, so it is not in `tollgate_store_errors_total`.)
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn refund_failed(&self, store: &str, e: &StoreError) {
        #[cfg(feature = "metrics")]
        metrics::counter!(
            "tollgate_refund_failures_total",
            "store" => store.to_string(),
            "kind" => e.kind_label()
        )
        .increment(1);
        self.warn_store_failed(
            store,
            "refund",
            e,
            "rate-limit store could not give back charges: they hold until their state expires",
        );
    }

    /// A scheduler's slot whose waiter gave up could not be given back to the store `store`
    /// (`e`): it stays taken, and the events placed after it wait that much longer.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn give_back_failed(&self, store: &str, e: &StoreError) {
        #[cfg(feature = "metrics")]
        metrics::counter!(
            "tollgate_give_back_failures_total",
            "store" => store.to_string(),
            "kind" => e.kind_label()
        )
        .increment(1);
        self.warn_store_failed(
            store,
            "give_back",
            e,
            "rate-limit store could not give back scheduled slots whose waiters gave up: they stay taken",
        );
    }

    /// The bounded warning of a call (`call`) to the store `store` that failed with `e`,
    /// saying `message`, with the number of failures since the previous line.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    fn warn_store_failed(&self, store: &str, call: &str, e: &StoreError, message: &str) {
        #[cfg(feature = "tracing")]
        if let Some((count, since)) = self.count(Instant::now()) {
            tracing::warn!(
                target: "tollgate",
                store,
                call,
                failed_calls = count,
                since_s = since.map(|d| d.as_secs()),
                kind = e.kind_label(),
                error = %chain(e),
                "{message}"
            );
        }
        let _ = (store, call, e, message);
    }

    /// An HTTP layer whose default limiter is `limiter` found no key in a request, and
    /// answered as `action` says: `allow` (let through unlimited, as configured), `reject`
    /// (refused, as configured), `shadow` (let through: the layer is in shadow mode, and
    /// would refuse it when enforcing), `partial` (no peer address for the layer's address
    /// extractors, the request checked by the keys its other extractors found). A request let
    /// through unlimited is logged at `info` (a policy the application chose), the others at
    /// `warn`.
    pub(crate) fn missing_key(&self, limiter: &str, action: &'static str) {
        #[cfg(feature = "metrics")]
        metrics::counter!(
            "tollgate_missing_key_total",
            "limiter" => limiter.to_string(),
            "action" => action
        )
        .increment(1);
        #[cfg(feature = "tracing")]
        if let Some((count, since)) = self.count(Instant::now()) {
            let since_s = since.map(|d| d.as_secs());
            let message = match action {
                "partial" => "rate-limit layer found no peer address in requests: checked by their other keys alone, without the address's limit (serve axum with into_make_service_with_connect_info::<SocketAddr>())",
                _ => "rate-limit layer found no key in requests",
            };
            if action == "allow" {
                tracing::info!(target: "tollgate", limiter, action, requests = count, since_s, "{message}");
            } else {
                tracing::warn!(target: "tollgate", limiter, action, requests = count, since_s, "{message}");
            }
        }
        let _ = (limiter, action);
    }

    /// A layer charging by response found the limits of `limiter` (the one that checked the
    /// request first) no longer admitting a response's charge: others were charged since its
    /// peek, and its request was served over the limit. Counted, and logged at `info` (the
    /// way charging by response works under concurrency) at most every 10 s.
    pub(crate) fn charge_refused(&self, limiter: &str) {
        #[cfg(feature = "metrics")]
        metrics::counter!("tollgate_charges_refused_total", "limiter" => limiter.to_string())
            .increment(1);
        #[cfg(feature = "tracing")]
        if let Some((count, since)) = self.count(Instant::now()) {
            tracing::info!(
                target: "tollgate",
                limiter,
                requests = count,
                since_s = since.map(|d| d.as_secs()),
                "rate-limit layer served requests whose charge by response the limits no longer admitted: others were charged between their peek and their response"
            );
        }
        let _ = limiter;
    }

    /// A utilization shedder was given a reading outside [0, 1] (`reading`: NaN, negative, a
    /// percentage), which it clamps: a warning at a bounded rate, as the shedder's decisions
    /// then rest on a figure its source did not mean.
    pub(crate) fn utilization_out_of_range(&self, reading: f64) {
        #[cfg(feature = "tracing")]
        if let Some((count, since)) = self.count(Instant::now()) {
            tracing::warn!(
                target: "tollgate",
                reading,
                readings = count,
                since_s = since.map(|d| d.as_secs()),
                "load shedder's utilization reading is not a fraction from 0 to 1: NaN counts as 0, others as the nearest bound (a percentage must be divided by 100)"
            );
        }
        let _ = reading;
    }

    /// A [`ClientIp`](crate::key::ClientIp) keyed a request that came through the proxies by
    /// a proxy's address, its forwarding headers giving no client for `reason`: counted, and
    /// a warning at a bounded rate (when it is every request, every client shares one quota).
    pub(crate) fn client_ip_fell_back(&self, reason: &'static str) {
        #[cfg(feature = "metrics")]
        metrics::counter!("tollgate_client_ip_fallbacks_total", "reason" => reason).increment(1);
        #[cfg(feature = "tracing")]
        if let Some((count, since)) = self.count(Instant::now()) {
            tracing::warn!(
                target: "tollgate",
                reason,
                requests = count,
                since_s = since.map(|d| d.as_secs()),
                "client IP not found in the forwarding headers: keyed by a proxy's address; name the header the proxies maintain (ClientIp::only_x_forwarded_for, say)"
            );
        }
        let _ = reason;
    }

    /// An HTTP layer answered requests it could not check (`e`: a cost the policy never
    /// admits, say, from the layer's cost function) with `status`: a warning, at a bounded
    /// rate.
    pub(crate) fn unchecked_answered(&self, status: u16, e: &crate::limiter::Error) {
        #[cfg(feature = "tracing")]
        if let Some((count, since)) = self.count(Instant::now()) {
            tracing::warn!(
                target: "tollgate",
                status,
                requests = count,
                since_s = since.map(|d| d.as_secs()),
                kind = e.label(),
                error = %e,
                "rate-limit layer answered requests it could not check"
            );
        }
        let _ = (status, e);
    }

    /// Counts an event at `now`; when a line is due, the number to log and the time since
    /// the previous line (none for the first).
    #[cfg_attr(not(feature = "tracing"), allow(dead_code))]
    fn count(&self, now: Instant) -> Option<(u64, Option<Duration>)> {
        self.count_n(now, 1)
    }

    /// [`count`](Self::count) of `n` events at once.
    #[cfg_attr(not(feature = "tracing"), allow(dead_code))]
    fn count_n(&self, now: Instant, n: u64) -> Option<(u64, Option<Duration>)> {
        self.pending.fetch_add(n, Ordering::Relaxed);
        if since_epoch(now) < self.due_ns.load(Ordering::Relaxed) {
            return None;
        }
        // Whoever holds the lock is writing the line: this denial is in its count or the
        // next one's.
        let mut last = self.last.try_lock().ok()?;
        let since = last.map(|t| now.saturating_duration_since(t));
        if since.is_some_and(|d| d < LOG_EVERY) {
            return None;
        }
        *last = Some(now);
        let due = now.checked_add(LOG_EVERY).map_or(u64::MAX, since_epoch);
        self.due_ns.store(due, Ordering::Relaxed);
        Some((self.pending.swap(0, Ordering::Relaxed), since))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_lines_are_bounded_and_lose_no_count() {
        let log = BoundedLog::default();
        let t0 = Instant::now();
        assert_eq!(log.count(t0), Some((1, None)), "the first at once");
        for k in 1..500 {
            assert_eq!(log.count(t0 + Duration::from_millis(k)), None);
        }
        let t1 = t0 + LOG_EVERY;
        assert_eq!(log.count(t1), Some((500, Some(LOG_EVERY))));
        assert_eq!(log.count(t1 + Duration::from_secs(1)), None);
        let t2 = t1 + Duration::from_secs(60);
        assert_eq!(log.count(t2), Some((2, Some(Duration::from_secs(60)))));
    }
}

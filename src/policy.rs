//! Limits, algorithms and policies, and the text syntax they parse from.
//!
//! # Syntax
//!
//! A policy is a comma-separated list of limits. A limit is
//!
//! ```text
//! COUNT "/" [N] UNIT [ALGORITHM] [burst=B | capacity=B]
//! ```
//!
//! * `COUNT` — how many requests (cost units) the limit admits per window; digits, `_` allowed.
//! * `[N] UNIT` — the window: `ms`, `s`/`sec`/`second(s)`, `m`/`min`/`minute(s)`,
//!   `h`/`hr`/`hour(s)`, `d`/`day(s)`, optionally preceded by a multiplier (`5min`, `1500ms`).
//! * `ALGORITHM` — one of `sliding` (the default, [`Algorithm::SlidingWindow`]), `log`
//!   ([`Algorithm::SlidingLog`]), `fixed` ([`Algorithm::FixedWindow`]), `bucket`
//!   ([`Algorithm::TokenBucket`]) or `gcra` ([`Algorithm::Gcra`]).
//! * `burst=B` (or `capacity=B`) — only for `bucket` and `gcra`: how many requests may arrive at
//!   once; defaults to `COUNT`.
//!
//! A concurrency limit is written `N concurrent [lease=DURATION]`: at most N requests in flight
//! per identifier ([`Algorithm::Concurrency`]); the lease (default 60 s) bounds how long a
//! slot outlives a process that died holding it.
//!
//! Examples: `10/s, 120/min, 240/h` (seed-style multi-limit, default algorithm),
//! `100/s bucket capacity=500` (Stripe's request limiter), `5/s gcra burst=20`,
//! `10/s log` (exact rolling window), `1000/d fixed` (a daily quota aligned to UTC midnight).
//!
//! [`Policy`] and [`Limit`] implement `Display` in this syntax, and parsing what they display
//! gives back an equal value.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// The largest count, burst or capacity a limit accepts.
///
/// The scripts run on Lua numbers (IEEE doubles), exact for integers below 2^53; keeping counts
/// and bursts below this bound keeps every product the algorithms compute exact.
pub const MAX_COUNT: u64 = 50_000_000;

/// The longest window a limit accepts: 400 days.
pub const MAX_WINDOW: Duration = Duration::from_secs(400 * 86_400);

/// The largest count of a sliding log, which keeps one entry per admitted unit.
pub const MAX_LOG_COUNT: u64 = 100_000;

/// The shortest lease of a concurrency limit: leases are renewed a few times a second, so a
/// shorter one could lapse under a request that is still running.
pub const MIN_LEASE: Duration = Duration::from_secs(1);

/// The lease of a concurrency limit when the text gives none.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);

/// The longest burst tolerance (burst × window / count) of a token bucket or GCRA limit.
const MAX_TOLERANCE_US: u128 = 1 << 50;

/// How a limit counts requests.
///
/// All algorithms decide with integer microseconds, read from the store's clock (Redis `TIME`
/// for the Redis store), and admit a request of cost `c` only if it fits entirely.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// Exact rolling window: every interval of length `window`, wherever it starts, holds at
    /// most `count` admitted cost units. Keeps one entry per admitted unit (a Redis sorted
    /// set), so memory grows with `count`.
    SlidingLog,
    /// The O(1) approximation of the rolling window: two aligned fixed windows, the previous one
    /// weighted by how much of it still overlaps the rolling window (Cloudflare's variant).
    /// It assumes the previous window's requests were spread evenly; when they were bunched at
    /// its end the estimate undercounts. The default algorithm.
    SlidingWindow,
    /// Counters per window aligned to the Unix epoch (days start at 00:00 UTC). Admits up to
    /// twice `count` around a window boundary.
    FixedWindow,
    /// Token bucket: refills `count` tokens per `window`, holds at most `capacity`. Stripe's
    /// request limiter. Decided on the same exact integer automaton as [`Algorithm::Gcra`]
    /// (the two are the same algorithm written two ways).
    TokenBucket {
        /// How many tokens the bucket holds, i.e. the largest burst.
        capacity: u64,
    },
    /// Generic cell rate algorithm: one request per `window / count` on average, with up to
    /// `burst` admitted at once. One stored number (the theoretical arrival time) per key.
    Gcra {
        /// How many requests may arrive at once.
        burst: u64,
    },
    /// At most `count` requests in flight at once; `window` is the lease: how long a slot
    /// outlives a process that died holding it. Slots are held by a
    /// [`ConcurrencyGuard`](crate::ConcurrencyGuard) and renewed while it lives. A request
    /// takes one slot whatever its cost.
    Concurrency,
}

impl Algorithm {
    /// The algorithm used when the text names none: [`Algorithm::SlidingWindow`].
    pub const DEFAULT: Algorithm = Algorithm::SlidingWindow;

    fn name(&self) -> &'static str {
        match self {
            Algorithm::SlidingLog => "log",
            Algorithm::SlidingWindow => "sliding",
            Algorithm::FixedWindow => "fixed",
            Algorithm::TokenBucket { .. } => "bucket",
            Algorithm::Gcra { .. } => "gcra",
            Algorithm::Concurrency => "concurrent",
        }
    }
}

impl Default for Algorithm {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// One limit: at most `count` cost units per `window`, counted by an [`Algorithm`].
///
/// A `Limit` is always valid: its constructors check it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    count: u64,
    window: Duration,
    algorithm: Algorithm,
}

impl Limit {
    /// A limit of `count` per `window` counted with `algorithm`.
    ///
    /// `count` (and a bucket's capacity or a GCRA burst) must be in `1..=MAX_COUNT`; `window`
    /// must be a whole number of milliseconds between 1 ms and [`MAX_WINDOW`].
    pub fn new(count: u64, window: Duration, algorithm: Algorithm) -> Result<Limit, PolicyError> {
        let limit = Limit {
            count,
            window,
            algorithm,
        };
        let err = |kind| Err(PolicyError::new(kind, limit.to_string()));
        if count == 0 {
            return err(PolicyErrorKind::ZeroCount);
        }
        if count > MAX_COUNT {
            return err(PolicyErrorKind::Overflow);
        }
        if window.is_zero() {
            return err(PolicyErrorKind::ZeroWindow);
        }
        if window > MAX_WINDOW {
            return err(PolicyErrorKind::Overflow);
        }
        if !window.subsec_nanos().is_multiple_of(1_000_000) {
            return err(PolicyErrorKind::SubMillisecondWindow);
        }
        if algorithm == Algorithm::SlidingLog && count > MAX_LOG_COUNT {
            return err(PolicyErrorKind::LogTooLarge);
        }
        if algorithm == Algorithm::Concurrency && window < MIN_LEASE {
            return err(PolicyErrorKind::LeaseTooShort);
        }
        if let Some(burst) = limit.burst() {
            if burst == 0 {
                return err(PolicyErrorKind::ZeroBurst);
            }
            if burst > MAX_COUNT
                || u128::from(burst) * window.as_micros() / u128::from(count) > MAX_TOLERANCE_US
            {
                return err(PolicyErrorKind::Overflow);
            }
        }
        Ok(limit)
    }

    /// `count` per second with the default algorithm.
    pub fn per_second(count: u64) -> Result<Limit, PolicyError> {
        Limit::new(count, Duration::from_secs(1), Algorithm::DEFAULT)
    }

    /// `count` per minute with the default algorithm.
    pub fn per_minute(count: u64) -> Result<Limit, PolicyError> {
        Limit::new(count, Duration::from_secs(60), Algorithm::DEFAULT)
    }

    /// `count` per hour with the default algorithm.
    pub fn per_hour(count: u64) -> Result<Limit, PolicyError> {
        Limit::new(count, Duration::from_secs(3600), Algorithm::DEFAULT)
    }

    /// `count` per day with the default algorithm.
    pub fn per_day(count: u64) -> Result<Limit, PolicyError> {
        Limit::new(count, Duration::from_secs(86_400), Algorithm::DEFAULT)
    }

    /// The same limit counted with another algorithm.
    pub fn with_algorithm(self, algorithm: Algorithm) -> Result<Limit, PolicyError> {
        Limit::new(self.count, self.window, algorithm)
    }

    /// How many cost units the limit admits per window (the refill per window for a bucket).
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The window.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// At most `count` requests in flight, with the default lease of 60 s.
    pub fn concurrent(count: u64) -> Result<Limit, PolicyError> {
        Limit::new(count, DEFAULT_LEASE, Algorithm::Concurrency)
    }

    /// The largest cost a single request may have under this limit: `count` for the window
    /// algorithms, the capacity or burst for a token bucket or GCRA; unbounded for a
    /// concurrency limit (a request takes one slot whatever its cost).
    pub fn max_cost(&self) -> u64 {
        match self.algorithm {
            Algorithm::Concurrency => u64::MAX,
            _ => self.burst().unwrap_or(self.count),
        }
    }

    /// Whether this is a concurrency limit.
    pub fn is_concurrency(&self) -> bool {
        self.algorithm == Algorithm::Concurrency
    }

    fn burst(&self) -> Option<u64> {
        match self.algorithm {
            Algorithm::TokenBucket { capacity } => Some(capacity),
            Algorithm::Gcra { burst } => Some(burst),
            _ => None,
        }
    }

    pub(crate) fn window_us(&self) -> u64 {
        // Bounded by MAX_WINDOW, so this fits easily.
        self.window.as_micros() as u64
    }
}

/// Writes a duration in the policy syntax: `s`, `5min`, `1500ms`.
fn write_window(f: &mut fmt::Formatter<'_>, window: Duration) -> fmt::Result {
    let ms = window.as_millis();
    let (n, unit) = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "min"),
        (1000, "s"),
    ]
    .into_iter()
    .find(|(size, _)| ms != 0 && ms.is_multiple_of(*size))
    .map(|(size, unit)| (ms / size, unit))
    .unwrap_or((ms, "ms"));
    if n != 1 || unit == "ms" {
        write!(f, "{n}")?;
    }
    f.write_str(unit)
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.algorithm == Algorithm::Concurrency {
            write!(f, "{} concurrent", self.count)?;
            if self.window != DEFAULT_LEASE {
                f.write_str(" lease=")?;
                write_window(f, self.window)?;
            }
            return Ok(());
        }
        write!(f, "{}/", self.count)?;
        write_window(f, self.window)?;
        if self.algorithm != Algorithm::DEFAULT {
            write!(f, " {}", self.algorithm.name())?;
        }
        match self.algorithm {
            Algorithm::TokenBucket { capacity } if capacity != self.count => {
                write!(f, " capacity={capacity}")
            }
            Algorithm::Gcra { burst } if burst != self.count => write!(f, " burst={burst}"),
            _ => Ok(()),
        }
    }
}

impl FromStr for Limit {
    type Err = PolicyError;

    fn from_str(text: &str) -> Result<Limit, PolicyError> {
        let text = text.trim();
        let err = |kind| PolicyError::new(kind, text);
        if text.is_empty() {
            return Err(err(PolicyErrorKind::Empty));
        }
        if !text.contains('/') {
            return parse_concurrency(text).map_err(err);
        }
        let (count, rest) = text
            .split_once('/')
            .ok_or_else(|| err(PolicyErrorKind::Syntax("expected COUNT/WINDOW, as in 10/s")))?;
        let count = parse_number(count).map_err(err)?;
        let mut words = rest.split_whitespace();
        let window_text = words
            .next()
            .ok_or_else(|| err(PolicyErrorKind::Syntax("missing window unit after '/'")))?;
        let window = parse_window(window_text).map_err(err)?;
        let mut algorithm = Algorithm::DEFAULT;
        let mut burst = None;
        for word in words {
            if let Some((name, value)) = word.split_once('=') {
                if !matches!(name, "burst" | "capacity") {
                    return Err(err(PolicyErrorKind::UnknownParameter(name.to_string())));
                }
                let value = parse_number(value).map_err(err)?;
                if burst.replace(value).is_some() {
                    return Err(err(PolicyErrorKind::Syntax("burst given twice")));
                }
                continue;
            }
            if algorithm != Algorithm::DEFAULT || burst.is_some() {
                return Err(err(PolicyErrorKind::Syntax(
                    "expected at most one algorithm, before burst=",
                )));
            }
            algorithm = match word {
                "sliding" => Algorithm::SlidingWindow,
                "log" => Algorithm::SlidingLog,
                "fixed" => Algorithm::FixedWindow,
                "bucket" => Algorithm::TokenBucket { capacity: count },
                "gcra" => Algorithm::Gcra { burst: count },
                other => return Err(err(PolicyErrorKind::UnknownAlgorithm(other.to_string()))),
            };
        }
        if let Some(b) = burst {
            algorithm = match algorithm {
                Algorithm::TokenBucket { .. } => Algorithm::TokenBucket { capacity: b },
                Algorithm::Gcra { .. } => Algorithm::Gcra { burst: b },
                _ => return Err(err(PolicyErrorKind::BurstNotAllowed)),
            };
        }
        Limit::new(count, window, algorithm).map_err(|e| PolicyError::new(e.kind, text))
    }
}

/// Parses `N concurrent [lease=DURATION]`.
fn parse_concurrency(text: &str) -> Result<Limit, PolicyErrorKind> {
    let mut words = text.split_whitespace();
    let (Some(count), Some("concurrent")) = (words.next(), words.next()) else {
        return Err(PolicyErrorKind::Syntax(
            "expected COUNT/WINDOW (as in 10/s) or COUNT concurrent",
        ));
    };
    let count = parse_number(count)?;
    let mut lease = DEFAULT_LEASE;
    for word in words {
        match word.split_once('=') {
            Some(("lease", value)) => lease = parse_window(value)?,
            Some((name, _)) => return Err(PolicyErrorKind::UnknownParameter(name.to_string())),
            None => return Err(PolicyErrorKind::Syntax("expected lease=DURATION")),
        }
    }
    Limit::new(count, lease, Algorithm::Concurrency).map_err(|e| e.kind)
}

/// Parses `123` or `1_000`.
fn parse_number(text: &str) -> Result<u64, PolicyErrorKind> {
    let text = text.trim();
    if text.is_empty()
        || text.starts_with('_')
        || !text.bytes().all(|b| b.is_ascii_digit() || b == b'_')
    {
        return Err(PolicyErrorKind::BadCount);
    }
    text.bytes()
        .filter(|b| *b != b'_')
        .try_fold(0u64, |acc, b| {
            acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        })
        .ok_or(PolicyErrorKind::Overflow)
}

fn parse_window(text: &str) -> Result<Duration, PolicyErrorKind> {
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '_')
        .unwrap_or(text.len());
    let (n, unit) = text.split_at(split);
    let n = if n.is_empty() { 1 } else { parse_number(n)? };
    let unit_ms: u64 = match unit {
        "ms" => 1,
        "s" | "sec" | "second" | "seconds" => 1000,
        "m" | "min" | "minute" | "minutes" => 60_000,
        "h" | "hr" | "hour" | "hours" => 3_600_000,
        "d" | "day" | "days" => 86_400_000,
        "" => return Err(PolicyErrorKind::Syntax("missing window unit")),
        other => return Err(PolicyErrorKind::UnknownUnit(other.to_string())),
    };
    let ms = n.checked_mul(unit_ms).ok_or(PolicyErrorKind::Overflow)?;
    Ok(Duration::from_millis(ms))
}

/// A set of limits checked together: a request is admitted only if every limit admits it.
///
/// Parse one from text (`"10/s, 120/min, 240/h".parse()`) or build one from [`Limit`]s.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Policy {
    limits: Vec<Limit>,
}

/// The most limits one policy may hold.
pub const MAX_LIMITS: usize = 16;

impl Policy {
    /// A policy of the given limits (at least one, at most [`MAX_LIMITS`], no two equal).
    pub fn new(limits: impl IntoIterator<Item = Limit>) -> Result<Policy, PolicyError> {
        let limits: Vec<Limit> = limits.into_iter().collect();
        let text = Policy {
            limits: limits.clone(),
        }
        .to_string();
        if limits.is_empty() {
            return Err(PolicyError::new(PolicyErrorKind::Empty, text));
        }
        if limits.len() > MAX_LIMITS {
            return Err(PolicyError::new(PolicyErrorKind::TooManyLimits, text));
        }
        if limits.iter().filter(|l| l.is_concurrency()).count() > 1 {
            return Err(PolicyError::new(PolicyErrorKind::Duplicate, text));
        }
        for (i, limit) in limits.iter().enumerate() {
            if limits[..i].contains(limit) {
                return Err(PolicyError::new(
                    PolicyErrorKind::Duplicate,
                    limit.to_string(),
                ));
            }
        }
        Ok(Policy { limits })
    }

    /// The limits, in the order given.
    pub fn limits(&self) -> &[Limit] {
        &self.limits
    }

    /// The largest cost a request may have: the smallest [`Limit::max_cost`].
    pub fn max_cost(&self) -> u64 {
        self.limits.iter().map(Limit::max_cost).min().unwrap_or(0)
    }

    /// The concurrency limit, if the policy has one (at most one).
    pub fn concurrency(&self) -> Option<&Limit> {
        self.limits.iter().find(|l| l.is_concurrency())
    }
}

impl From<Limit> for Policy {
    fn from(limit: Limit) -> Policy {
        Policy {
            limits: vec![limit],
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, limit) in self.limits.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{limit}")?;
        }
        Ok(())
    }
}

impl FromStr for Policy {
    type Err = PolicyError;

    fn from_str(text: &str) -> Result<Policy, PolicyError> {
        if text.trim().is_empty() {
            return Err(PolicyError::new(PolicyErrorKind::Empty, text));
        }
        let limits = text
            .split(',')
            .map(str::parse)
            .collect::<Result<Vec<Limit>, _>>()?;
        Policy::new(limits)
    }
}

/// A policy or limit that cannot be built, with the text of the offending part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError {
    kind: PolicyErrorKind,
    part: String,
}

impl PolicyError {
    fn new(kind: PolicyErrorKind, part: impl Into<String>) -> Self {
        PolicyError {
            kind,
            part: part.into(),
        }
    }

    /// What is wrong.
    pub fn kind(&self) -> &PolicyErrorKind {
        &self.kind
    }

    /// The offending part of the text (or the limit, displayed).
    pub fn part(&self) -> &str {
        &self.part
    }
}

/// What is wrong with a policy or a limit.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PolicyErrorKind {
    /// The policy or a limit is empty.
    Empty,
    /// The text does not follow the syntax; the message says what was expected.
    Syntax(&'static str),
    /// The count (or burst) is not a number.
    BadCount,
    /// The count is 0.
    ZeroCount,
    /// The window is 0.
    ZeroWindow,
    /// The burst or capacity is 0.
    ZeroBurst,
    /// The window is not a whole number of milliseconds.
    SubMillisecondWindow,
    /// The window unit is not one tollgate knows.
    UnknownUnit(String),
    /// The algorithm is not one tollgate knows.
    UnknownAlgorithm(String),
    /// A `name=value` parameter other than `burst` or `capacity`.
    UnknownParameter(String),
    /// `burst=` given to an algorithm that has no burst.
    BurstNotAllowed,
    /// A number is beyond what tollgate accepts ([`MAX_COUNT`], [`MAX_WINDOW`]).
    Overflow,
    /// The same limit appears twice.
    Duplicate,
    /// More than [`MAX_LIMITS`] limits.
    TooManyLimits,
    /// A sliding log of more than [`MAX_LOG_COUNT`] (it keeps an entry per admitted unit).
    LogTooLarge,
    /// A concurrency lease shorter than [`MIN_LEASE`].
    LeaseTooShort,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid rate limit {:?}: ", self.part)?;
        match &self.kind {
            PolicyErrorKind::Empty => {
                f.write_str("no limit given (expected e.g. \"10/s, 120/min\")")
            }
            PolicyErrorKind::Syntax(what) => f.write_str(what),
            PolicyErrorKind::BadCount => f.write_str("the count is not a whole number"),
            PolicyErrorKind::ZeroCount => f.write_str("the count must be at least 1"),
            PolicyErrorKind::ZeroWindow => f.write_str("the window must be longer than 0"),
            PolicyErrorKind::ZeroBurst => f.write_str("the burst/capacity must be at least 1"),
            PolicyErrorKind::SubMillisecondWindow => {
                f.write_str("the window must be a whole number of milliseconds")
            }
            PolicyErrorKind::UnknownUnit(u) => {
                write!(f, "unknown window unit {u:?} (expected ms, s, min, h or d)")
            }
            PolicyErrorKind::UnknownAlgorithm(a) => write!(
                f,
                "unknown algorithm {a:?} (expected sliding, log, fixed, bucket or gcra)"
            ),
            PolicyErrorKind::UnknownParameter(p) => {
                write!(f, "unknown parameter {p:?} (expected burst= or capacity=)")
            }
            PolicyErrorKind::BurstNotAllowed => {
                f.write_str("burst= only applies to the bucket and gcra algorithms")
            }
            PolicyErrorKind::Overflow => write!(
                f,
                "too large (counts and bursts up to {MAX_COUNT}, windows up to 400 days)"
            ),
            PolicyErrorKind::Duplicate => {
                f.write_str("the same limit (or two concurrency limits) given twice")
            }
            PolicyErrorKind::TooManyLimits => {
                write!(f, "a policy holds at most {MAX_LIMITS} limits")
            }
            PolicyErrorKind::LogTooLarge => write!(
                f,
                "a sliding log keeps one entry per request: at most {MAX_LOG_COUNT} \
                 (use the sliding-window counter or gcra for larger counts)"
            ),
            PolicyErrorKind::LeaseTooShort => write!(
                f,
                "a concurrency lease must be at least {} s",
                MIN_LEASE.as_secs()
            ),
        }
    }
}

impl std::error::Error for PolicyError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_seed_policy() {
        let p: Policy = "10/s, 120/min, 240/h".parse().unwrap();
        let l = p.limits();
        assert_eq!(l.len(), 3);
        assert_eq!((l[0].count(), l[0].window()), (10, Duration::from_secs(1)));
        assert_eq!(
            (l[1].count(), l[1].window()),
            (120, Duration::from_secs(60))
        );
        assert_eq!(
            (l[2].count(), l[2].window()),
            (240, Duration::from_secs(3600))
        );
        assert!(l.iter().all(|l| l.algorithm() == Algorithm::SlidingWindow));
        assert_eq!(p.to_string(), "10/s, 120/min, 240/h");
    }

    #[test]
    fn parses_algorithms_and_bursts() {
        let p: Policy = "100/s bucket capacity=500, 5/s gcra burst=20, 10/1500ms log, 1_000/day fixed, 3/5min gcra"
            .parse()
            .unwrap();
        let l = p.limits();
        assert_eq!(l[0].algorithm(), Algorithm::TokenBucket { capacity: 500 });
        assert_eq!(l[1].algorithm(), Algorithm::Gcra { burst: 20 });
        assert_eq!(l[2].algorithm(), Algorithm::SlidingLog);
        assert_eq!(l[2].window(), Duration::from_millis(1500));
        assert_eq!(l[3].algorithm(), Algorithm::FixedWindow);
        assert_eq!(l[3].count(), 1000);
        assert_eq!(l[4].algorithm(), Algorithm::Gcra { burst: 3 });
        assert_eq!(
            p.to_string(),
            "100/s bucket capacity=500, 5/s gcra burst=20, 10/1500ms log, 1000/d fixed, 3/5min gcra"
        );
        assert_eq!(p.max_cost(), 3);
    }

    #[test]
    fn display_round_trips() {
        for text in [
            "1/ms",
            "7/90s",
            "2/61min sliding",
            "9/25h bucket burst=1",
            "50000000/400d gcra",
            "5/s, 5/s log, 5/s fixed, 5/s bucket, 5/s gcra burst=2",
            "10/s, 3 concurrent",
            "4 concurrent lease=90s",
        ] {
            let p: Policy = text.parse().unwrap();
            let again: Policy = p.to_string().parse().unwrap();
            assert_eq!(p, again, "{text} -> {p}");
        }
    }

    #[test]
    fn errors_name_the_bad_part() {
        let cases = [
            ("", PolicyErrorKind::Empty),
            ("10/s,", PolicyErrorKind::Empty),
            ("0/s", PolicyErrorKind::ZeroCount),
            ("10/0s", PolicyErrorKind::ZeroWindow),
            (
                "10/fortnight",
                PolicyErrorKind::UnknownUnit("fortnight".into()),
            ),
            (
                "10/s leaky",
                PolicyErrorKind::UnknownAlgorithm("leaky".into()),
            ),
            ("10/s burst=5", PolicyErrorKind::BurstNotAllowed),
            ("10/s gcra burst=0", PolicyErrorKind::ZeroBurst),
            (
                "10/s gcra rate=5",
                PolicyErrorKind::UnknownParameter("rate".into()),
            ),
            ("99999999999999999999999/s", PolicyErrorKind::Overflow),
            ("60000000/s", PolicyErrorKind::Overflow),
            ("1/99999999999999d", PolicyErrorKind::Overflow),
            ("1/401d", PolicyErrorKind::Overflow),
            ("ten/s", PolicyErrorKind::BadCount),
            (
                "10 per second",
                PolicyErrorKind::Syntax("expected COUNT/WINDOW (as in 10/s) or COUNT concurrent"),
            ),
            ("10/s, 10/s", PolicyErrorKind::Duplicate),
            ("2 concurrent, 3 concurrent", PolicyErrorKind::Duplicate),
            ("0 concurrent", PolicyErrorKind::ZeroCount),
            ("3 concurrent lease=0s", PolicyErrorKind::ZeroWindow),
            ("3 concurrent lease=999ms", PolicyErrorKind::LeaseTooShort),
            ("100001/h log", PolicyErrorKind::LogTooLarge),
            (
                "3 concurrent ttl=5s",
                PolicyErrorKind::UnknownParameter("ttl".into()),
            ),
        ];
        for (text, kind) in cases {
            let e = text.parse::<Policy>().unwrap_err();
            assert_eq!(e.kind(), &kind, "{text}: {e}");
        }
        let e = "10/s, 5/fortnight, 3/h".parse::<Policy>().unwrap_err();
        assert_eq!(e.part(), "5/fortnight");
        assert!(e.to_string().contains("5/fortnight"), "{e}");
        assert!(e.to_string().contains("unknown window unit"), "{e}");
    }

    #[test]
    fn limits_validate_their_fields() {
        assert!(Limit::new(1, Duration::from_micros(1500), Algorithm::DEFAULT).is_err());
        assert!(Limit::new(
            1,
            Duration::from_secs(1),
            Algorithm::Gcra {
                burst: MAX_COUNT + 1
            }
        )
        .is_err());
        // a burst of 50,000 at 1/day would tolerate 137 years of debt: refused
        let long = Limit::new(
            1,
            Duration::from_secs(86_400),
            Algorithm::Gcra { burst: 50_000 },
        );
        assert_eq!(long.unwrap_err().kind(), &PolicyErrorKind::Overflow);
        assert!(Limit::new(
            1,
            Duration::from_secs(86_400),
            Algorithm::Gcra { burst: 1000 }
        )
        .is_ok());
        assert!(Limit::per_second(10).is_ok());
        let l: Limit = " 10 / s ".replace(' ', "").parse().unwrap();
        assert_eq!(l, Limit::per_second(10).unwrap());
    }
}

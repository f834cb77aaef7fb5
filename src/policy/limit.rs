//! [`Limit`] and [`Algorithm`]: what one limit counts and how.

use std::time::Duration;

use super::{
    PolicyError, PolicyErrorKind, DEFAULT_LEASE, MAX_COUNT, MAX_LOG_COUNT, MAX_WINDOW, MIN_LEASE,
};

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
    /// its end the estimate undercounts, and it admits more than `count` in a window: up to
    /// twice `count` in the worst case. Measured against an exact rolling window on bursty
    /// traffic (Pareto on/off sources, 40,000–400,000 identifiers, 66 million decisions), it
    /// decided wrongly on 0.031 % (a light mix) to 11.8 % (an abusive mix) of requests, and some
    /// 1-second windows held 1.55–1.92 times the limit. It was the default before
    /// [`Algorithm::RollingWindow`]; write `sliding` to keep it.
    SlidingWindow,
    /// A rolling window that never admits more than `count` in any interval of length `window`,
    /// wherever it starts (as [`Algorithm::SlidingLog`]), in a fixed state of five counters.
    /// The default algorithm.
    ///
    /// The window is cut into four sub-windows of `window / 4`, aligned to the Unix epoch
    /// (windows are whole milliseconds, so a quarter is whole microseconds), and a ring of five counters
    /// holds what was admitted in the current sub-window and the four before it: every
    /// sub-window the rolling window `(now - window, now]` touches. The oldest one has partly
    /// left the rolling window but is still counted in full, so the count is never below the
    /// exact one: it never over-admits.
    ///
    /// What that costs is bounded by one sub-window: the ring counts nothing older than
    /// `window + window / 4`, so it admits every request that an exact rolling window of
    /// `1.25 × window` would admit (given what was admitted before), and a denied request fits
    /// at most `window / 4` later than under an exact window. A client that never stops
    /// sending gets `count` per `1.25 × window`: 80 % of the limit, where the exact window
    /// gives 100 % (and [`Algorithm::SlidingWindow`] about 100 %, over-admitting at times).
    /// On bursty traffic over many identifiers it admitted 95–99 % of what an exact window
    /// admits (`BENCHMARKS.md`). Where the last fifth of a steady client's rate matters more
    /// than an exact ceiling, use `sliding`; where both matter, `log`.
    ///
    /// `retry_after` is exact (the start of the sub-window from which the cost fits);
    /// `reset_after` is when the newest counted sub-window leaves the ring, at most
    /// `1.25 × window` away.
    RollingWindow,
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

/// The identity of each algorithm, written once: its keyword in the text syntax, the code of
/// its automaton and its letter in store keys.
impl Algorithm {
    /// The algorithm used when the text names none: [`Algorithm::RollingWindow`]. (It was
    /// [`Algorithm::SlidingWindow`] before; write `sliding` to keep that.)
    pub const DEFAULT: Algorithm = Algorithm::RollingWindow;

    /// The keyword naming the algorithm in the text syntax (`10/s log`, `3 concurrent`), read
    /// by `FromStr` and written by `Display`.
    pub(crate) const fn keyword(&self) -> &'static str {
        match self {
            Algorithm::SlidingLog => "log",
            Algorithm::SlidingWindow => "sliding",
            Algorithm::RollingWindow => "rolling",
            Algorithm::FixedWindow => "fixed",
            Algorithm::TokenBucket { .. } => "bucket",
            Algorithm::Gcra { .. } => "gcra",
            Algorithm::Concurrency => "concurrent",
        }
    }

    /// The code naming the automaton that runs the algorithm: the Redis store picks the
    /// algorithm's Lua fragments (`lua/`) by it, and a test checks each code against its
    /// file. A token bucket and a GCRA share code 4: they run on the same automaton.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) const fn code(&self) -> u8 {
        match self {
            Algorithm::SlidingLog => 1,
            Algorithm::SlidingWindow => 2,
            Algorithm::FixedWindow => 3,
            Algorithm::TokenBucket { .. } | Algorithm::Gcra { .. } => 4,
            Algorithm::Concurrency => 5,
            Algorithm::RollingWindow => 6,
        }
    }

    /// The letter naming the algorithm in a store key (`w10/1s`). Unlike the
    /// [code](Self::code), it tells a token bucket from a GCRA, so the two never share state.
    pub(crate) const fn key_letter(&self) -> char {
        match self {
            Algorithm::SlidingLog => 'l',
            Algorithm::SlidingWindow => 'w',
            Algorithm::RollingWindow => 'r',
            Algorithm::FixedWindow => 'f',
            Algorithm::TokenBucket { .. } => 'b',
            Algorithm::Gcra { .. } => 'g',
            Algorithm::Concurrency => 'c',
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
    ///
    /// # Errors
    ///
    /// Fails, with the limit displayed as the error's [part](PolicyError::part) (a window of a
    /// fraction of a millisecond as given, `1/1.5ms`), when:
    /// * `count` is 0 ([`PolicyErrorKind::ZeroCount`]) or the capacity/burst is 0
    ///   ([`PolicyErrorKind::ZeroBurst`]);
    /// * `window` is 0 ([`PolicyErrorKind::ZeroWindow`]) or not a whole number of milliseconds
    ///   ([`PolicyErrorKind::SubMillisecondWindow`]);
    /// * `count` or the capacity/burst is over [`MAX_COUNT`], `window` is over [`MAX_WINDOW`],
    ///   or a bucket's or GCRA's burst tolerance (burst × window / count) is over 2^50 µs,
    ///   about 35 years ([`PolicyErrorKind::Overflow`]);
    /// * a sliding log counts more than [`MAX_LOG_COUNT`] ([`PolicyErrorKind::LogTooLarge`]);
    /// * a concurrency lease is shorter than [`MIN_LEASE`] ([`PolicyErrorKind::LeaseTooShort`]).
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
            // (named with the window as given: displayed, it would be rounded to a valid one)
            let part = format!("{count}/{window:?}");
            return Err(PolicyError::new(
                PolicyErrorKind::SubMillisecondWindow,
                part,
            ));
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

    /// Whether [`scaled`](Self::scaled) to `share` holds this limit's count at 1, above its
    /// share of it (below one request a window).
    pub(crate) fn held_at_one(&self, share: f64) -> bool {
        scaled_down(self.count, share) == 0
    }

    /// This limit with its count (and burst) multiplied by `share`, rounded down, never below
    /// one. A burst scaled less than its count (rounded down to a count of 1, say) may stand
    /// for a longer run ahead than a limit may hold (`burst × window / count`, about 35
    /// years): it is then cut to the longest that holds, so the scaled limit is valid.
    pub(crate) fn scaled(&self, share: f64) -> Limit {
        let scale = |n: u64| scaled_down(n, share).clamp(1, n);
        let count = scale(self.count);
        // (at least 32: a count of 1 over the longest window, 400 days)
        let longest = MAX_TOLERANCE_US * u128::from(count) / self.window.as_micros().max(1);
        let burst = |n: u64| u64::try_from(longest).map_or(scale(n), |l| scale(n).min(l));
        let algorithm = match self.algorithm {
            Algorithm::TokenBucket { capacity } => Algorithm::TokenBucket {
                capacity: burst(capacity),
            },
            Algorithm::Gcra { burst: b } => Algorithm::Gcra { burst: burst(b) },
            other => other,
        };
        // (never fails: every part is at most the valid limit's, and the burst holds)
        let scaled = Limit::new(count, self.window, algorithm);
        debug_assert!(scaled.is_ok(), "{self} scaled by {share}: {scaled:?}");
        scaled.unwrap_or(*self)
    }

    /// `count` per second with the default algorithm.
    ///
    /// # Errors
    ///
    /// Fails when `count` is 0 or over [`MAX_COUNT`], as [`Limit::new`] does.
    pub fn per_second(count: u64) -> Result<Limit, PolicyError> {
        Limit::new(count, Duration::from_secs(1), Algorithm::DEFAULT)
    }

    /// `count` per minute with the default algorithm.
    ///
    /// # Errors
    ///
    /// Fails when `count` is 0 or over [`MAX_COUNT`], as [`Limit::new`] does.
    pub fn per_minute(count: u64) -> Result<Limit, PolicyError> {
        Limit::new(count, Duration::from_secs(60), Algorithm::DEFAULT)
    }

    /// `count` per hour with the default algorithm.
    ///
    /// # Errors
    ///
    /// Fails when `count` is 0 or over [`MAX_COUNT`], as [`Limit::new`] does.
    pub fn per_hour(count: u64) -> Result<Limit, PolicyError> {
        Limit::new(count, Duration::from_secs(3600), Algorithm::DEFAULT)
    }

    /// `count` per day with the default algorithm.
    ///
    /// # Errors
    ///
    /// Fails when `count` is 0 or over [`MAX_COUNT`], as [`Limit::new`] does.
    pub fn per_day(count: u64) -> Result<Limit, PolicyError> {
        Limit::new(count, Duration::from_secs(86_400), Algorithm::DEFAULT)
    }

    /// The same limit counted with another algorithm.
    ///
    /// # Errors
    ///
    /// Fails when the count and window do not suit `algorithm`, as [`Limit::new`] does: a
    /// sliding log over [`MAX_LOG_COUNT`], a concurrency lease under [`MIN_LEASE`], a zero or
    /// too large capacity/burst.
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

    /// At most `count` requests in flight, with the [default lease](DEFAULT_LEASE) of 15 s.
    ///
    /// # Errors
    ///
    /// Fails when `count` is 0 or over [`MAX_COUNT`], as [`Limit::new`] does.
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

/// `n × share`, rounded down. A product that is whole but for the floating point's last bit
/// is that whole number: `100 × 0.29` is 28.999999999999996, and `98 × (1/49)`
/// 1.9999999999999998.
fn scaled_down(n: u64, share: f64) -> u64 {
    let product = n as f64 * share;
    let near = product.round();
    // (a few units in the last place: 49,999,999.95 is no whole number)
    let whole = match (product - near).abs() <= near * 8.0 * f64::EPSILON {
        true => near,
        false => product.floor(),
    };
    whole as u64
}

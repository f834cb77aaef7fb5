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
//! * `ALGORITHM` — one of `rolling` (the default, [`Algorithm::RollingWindow`]), `sliding`
//!   ([`Algorithm::SlidingWindow`], the default before), `log` ([`Algorithm::SlidingLog`]),
//!   `fixed` ([`Algorithm::FixedWindow`]), `bucket` ([`Algorithm::TokenBucket`]) or `gcra`
//!   ([`Algorithm::Gcra`]).
//! * `burst=B` (or `capacity=B`) — only for `bucket` and `gcra`: how many requests may arrive at
//!   once; defaults to `COUNT`.
//!
//! A concurrency limit is written `N concurrent [lease=DURATION]`: at most N requests in flight
//! per identifier ([`Algorithm::Concurrency`]); the lease (default 15 s) bounds how long a
//! slot outlives a process that died holding it.
//!
//! Examples: `10/s, 120/min, 240/h` (seed-style multi-limit, default algorithm),
//! `100/s bucket capacity=500` (Stripe's request limiter), `5/s gcra burst=20`,
//! `10/s log` (exact rolling window, one entry per request), `10/s sliding` (the two-counter
//! estimate), `1000/d fixed` (a daily quota aligned to UTC midnight).
//!
//! [`Policy`] and [`Limit`] implement `Display` in this syntax, and parsing what they display
//! gives back an equal value. With the `serde` feature they serialize as this text too.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

mod error;
mod limit;
mod parse;
#[cfg(feature = "serde")]
mod serde_text;
#[cfg(test)]
mod tests;

pub use error::{PolicyError, PolicyErrorKind};
pub use limit::{Algorithm, Limit};

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

/// The lease of a concurrency limit when the text gives none: a process that dies holding a
/// slot locks it for at most this long. Held slots are renewed every third of it, so a store
/// outage shorter than two thirds of it loses no slot.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(15);

/// The most limits one policy may hold.
pub const MAX_LIMITS: usize = 16;

/// A set of limits checked together: a request is admitted only if every limit admits it.
///
/// Parse one from text (`"10/s, 120/min, 240/h".parse()`) or build one from [`Limit`]s.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Policy {
    limits: Vec<Limit>,
    /// The smallest [`Limit::max_cost`], which every check compares its cost with: worked
    /// out once, with the limits it follows from.
    max_cost: u64,
}

impl Policy {
    /// A policy of the given limits (at least one, at most [`MAX_LIMITS`], no two equal).
    ///
    /// # Errors
    ///
    /// Fails with [`PolicyErrorKind::Empty`] when no limit is given,
    /// [`PolicyErrorKind::TooManyLimits`] when more than [`MAX_LIMITS`] are, and
    /// [`PolicyErrorKind::Duplicate`] when a limit is given twice or the policy holds more than
    /// one concurrency limit.
    pub fn new(limits: impl IntoIterator<Item = Limit>) -> Result<Policy, PolicyError> {
        let limits: Vec<Limit> = limits.into_iter().collect();
        if limits.is_empty() {
            return Err(PolicyError::new(PolicyErrorKind::Empty, ""));
        }
        if limits.len() > MAX_LIMITS {
            let part = format!("{} limits", limits.len());
            return Err(PolicyError::new(PolicyErrorKind::TooManyLimits, part));
        }
        if limits.iter().filter(|l| l.is_concurrency()).count() > 1 {
            let text = Policy::of(limits).to_string();
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
        Ok(Policy::of(limits))
    }

    /// The policy of `limits`, as they are.
    fn of(limits: Vec<Limit>) -> Policy {
        let max_cost = limits.iter().map(Limit::max_cost).min().unwrap_or(0);
        Policy { limits, max_cost }
    }

    /// The limits, in the order given.
    pub fn limits(&self) -> &[Limit] {
        &self.limits
    }

    /// The largest cost a request may have: the smallest [`Limit::max_cost`].
    pub fn max_cost(&self) -> u64 {
        self.max_cost
    }

    /// The concurrency limit, if the policy has one (at most one).
    pub fn concurrency(&self) -> Option<&Limit> {
        self.limits.iter().find(|l| l.is_concurrency())
    }

    /// This policy for one process's `share` (in `(0, 1]`) of the fleet: every count (and
    /// burst) multiplied by `share`, rounded down, never below 1. Limits that become equal
    /// count once. The fallback limiter of a process runs this while Redis is down.
    ///
    /// With it, for each of its limits, the index of the first limit of this policy it stands
    /// for (a decision of the scaled policy names its limits by their own index).
    pub(crate) fn scaled(&self, share: f64) -> (Policy, Vec<usize>) {
        let mut limits: Vec<Limit> = Vec::with_capacity(self.limits.len());
        let mut origins = Vec::with_capacity(self.limits.len());
        for (i, limit) in self.limits.iter().map(|l| l.scaled(share)).enumerate() {
            if !limits.contains(&limit) {
                limits.push(limit);
                origins.push(i);
            }
        }
        (Policy::of(limits), origins)
    }
}

impl From<Limit> for Policy {
    fn from(limit: Limit) -> Policy {
        Policy::of(vec![limit])
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

/// Parses a comma-separated list of limits in the [module's syntax](self).
///
/// # Errors
///
/// Fails when the text is blank, when a limit does not parse (the error names that limit, see
/// [`Limit`'s `FromStr`](Limit#impl-FromStr-for-Limit)), or when [`Policy::new`] refuses the
/// limits.
impl FromStr for Policy {
    type Err = PolicyError;

    fn from_str(text: &str) -> Result<Policy, PolicyError> {
        if text.trim().is_empty() {
            return Err(PolicyError::new(PolicyErrorKind::Empty, text));
        }
        // Counted before any is parsed: text from a request or a file may hold any number.
        let parts = text.split(',').count();
        if parts > MAX_LIMITS {
            let part = format!("{parts} limits");
            return Err(PolicyError::new(PolicyErrorKind::TooManyLimits, part));
        }
        let limits = text
            .split(',')
            .map(|part| {
                if part.trim().is_empty() {
                    // named by the whole text: the empty part says nothing of where it lies
                    return Err(PolicyError::new(PolicyErrorKind::Empty, text.trim()));
                }
                part.parse()
            })
            .collect::<Result<Vec<Limit>, _>>()?;
        Policy::new(limits)
    }
}

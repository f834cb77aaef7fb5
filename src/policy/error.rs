//! [`PolicyError`]: why a limit or a policy cannot be built.

use std::fmt;

#[cfg(doc)]
use super::MAX_WINDOW;
use super::{MAX_COUNT, MAX_LIMITS, MAX_LOG_COUNT, MIN_LEASE};

/// `text` cut to its first [`MAX_PART`] bytes (at a character's start) and `…`, when longer.
fn clip(text: &mut String) {
    if text.len() > MAX_PART {
        let mut end = MAX_PART;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
}

/// A policy or limit that cannot be built, with the text of the offending part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError {
    kind: PolicyErrorKind,
    part: String,
}

/// The longest part an error keeps, in bytes: text read from a request or a file may be of
/// any size, and its error goes into logs.
const MAX_PART: usize = 200;

impl PolicyError {
    pub(crate) fn new(mut kind: PolicyErrorKind, part: impl Into<String>) -> Self {
        let mut part = part.into();
        clip(&mut part);
        match &mut kind {
            PolicyErrorKind::UnknownUnit(word)
            | PolicyErrorKind::UnknownAlgorithm(word)
            | PolicyErrorKind::UnknownParameter(word) => clip(word),
            _ => {}
        }
        PolicyError { kind, part }
    }

    /// The same error, naming another part (the text a limit was parsed from rather than the
    /// limit displayed).
    pub(super) fn with_part(self, part: impl Into<String>) -> Self {
        PolicyError::new(self.kind, part)
    }

    /// What is wrong, without the part.
    pub(super) fn into_kind(self) -> PolicyErrorKind {
        self.kind
    }

    /// What is wrong.
    pub fn kind(&self) -> &PolicyErrorKind {
        &self.kind
    }

    /// The offending part of the text (or the limit, displayed): its first 200 bytes and `…`
    /// when it is longer; for a policy of too many limits, their count (`17 limits`).
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
    /// A count, window, burst or lease is not a whole number.
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
    /// The share of a [fleet shedder](crate::shed::FleetShedder)'s capacity reserved for
    /// critical traffic is not a number from 0 up to (not including) 1.
    ReservedShare,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // (not a rate limit: the setting the shedder was given)
        if self.kind == PolicyErrorKind::ReservedShare {
            write!(f, "invalid {}: ", self.part)?;
        } else {
            write!(f, "invalid rate limit {:?}: ", self.part)?;
        }
        match &self.kind {
            // (a policy with text around an empty limit names the whole policy)
            PolicyErrorKind::Empty if !self.part.trim().is_empty() => {
                f.write_str("an empty limit between two commas, or a comma at either end")
            }
            PolicyErrorKind::Empty => {
                f.write_str("no limit given (expected e.g. \"10/s, 120/min\")")
            }
            PolicyErrorKind::Syntax(what) => f.write_str(what),
            PolicyErrorKind::BadCount => {
                f.write_str("a count, window, burst or lease is not a whole number")
            }
            PolicyErrorKind::ZeroCount => f.write_str("the count must be at least 1"),
            PolicyErrorKind::ZeroWindow => f.write_str("the window must be longer than 0"),
            PolicyErrorKind::ZeroBurst => f.write_str("the burst/capacity must be at least 1"),
            PolicyErrorKind::SubMillisecondWindow => {
                f.write_str("the window must be a whole number of milliseconds")
            }
            PolicyErrorKind::UnknownUnit(u) => {
                write!(
                    f,
                    "unknown window unit {u:?} (expected ms, s, min, h or d, or a word such as \
                     sec, secs, minutes, hours, days; a window is a whole number of its unit: \
                     1500ms, not 1.5s)"
                )
            }
            PolicyErrorKind::UnknownAlgorithm(a) => write!(
                f,
                "unknown algorithm {a:?} (expected rolling, sliding, log, fixed, bucket or \
                 gcra; a concurrency limit is written COUNT concurrent)"
            ),
            PolicyErrorKind::UnknownParameter(p) => {
                write!(
                    f,
                    "unknown parameter {p:?} (expected burst= or capacity= after bucket or \
                     gcra, lease= after concurrent)"
                )
            }
            PolicyErrorKind::BurstNotAllowed => {
                f.write_str("burst= only applies to the bucket and gcra algorithms")
            }
            PolicyErrorKind::Overflow => write!(
                f,
                "too large (counts and bursts up to {MAX_COUNT}, windows up to 400 days, and a \
                 burst's run ahead, burst × window / count, up to about 35 years)"
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
                 (for larger counts, use the default rolling window, the sliding-window \
                 counter or gcra)"
            ),
            PolicyErrorKind::LeaseTooShort => write!(
                f,
                "a concurrency lease must be at least {} s",
                MIN_LEASE.as_secs()
            ),
            PolicyErrorKind::ReservedShare => f.write_str(
                "the share reserved for critical traffic must be from 0 up to (not including) 1, \
                 e.g. 0.2 for 20%",
            ),
        }
    }
}

impl std::error::Error for PolicyError {}

//! The text syntax of a limit, both ways: `FromStr` reads it, `Display` writes it.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use super::{Algorithm, Limit, PolicyError, PolicyErrorKind, DEFAULT_LEASE};

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let algorithm = self.algorithm();
        if algorithm == Algorithm::Concurrency {
            write!(f, "{} {}", self.count(), algorithm.keyword())?;
            if self.window() != DEFAULT_LEASE {
                f.write_str(" lease=")?;
                write_window(f, self.window())?;
            }
            return Ok(());
        }
        write!(f, "{}/", self.count())?;
        write_window(f, self.window())?;
        if algorithm != Algorithm::DEFAULT {
            write!(f, " {}", algorithm.keyword())?;
        }
        match algorithm {
            Algorithm::TokenBucket { capacity } if capacity != self.count() => {
                write!(f, " capacity={capacity}")
            }
            Algorithm::Gcra { burst } if burst != self.count() => write!(f, " burst={burst}"),
            _ => Ok(()),
        }
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

/// Parses one limit in the [policy syntax](super): `COUNT/WINDOW [ALGORITHM] [burst=B]` or
/// `COUNT concurrent [lease=DURATION]`; surrounding whitespace is ignored.
///
/// # Errors
///
/// Fails, with the trimmed text as the error's [part](PolicyError::part), when the text does
/// not follow the syntax (an unknown unit, algorithm or parameter, a count that is not a
/// number, `burst=` on an algorithm without one, ...) or when [`Limit::new`] refuses the
/// limit it describes.
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
        let mut named: Option<Algorithm> = None;
        let mut burst = None;
        for word in words {
            if let Some((name, value)) = word.split_once('=') {
                if !matches!(name, "burst" | "capacity") {
                    return Err(err(PolicyErrorKind::UnknownParameter(name.to_string())));
                }
                let value = parse_number(value).map_err(err)?;
                if burst.replace(value).is_some() {
                    return Err(err(PolicyErrorKind::Syntax("burst/capacity given twice")));
                }
                continue;
            }
            if matches!(word, "burst" | "capacity" | "lease") || word.starts_with('=') {
                return Err(err(PolicyErrorKind::Syntax(
                    "a parameter is written without spaces, as in burst=20",
                )));
            }
            if named.is_some() || burst.is_some() {
                return Err(err(PolicyErrorKind::Syntax(
                    "expected at most one algorithm, before burst=",
                )));
            }
            named = Some(
                window_algorithm(word, count)
                    .ok_or_else(|| err(PolicyErrorKind::UnknownAlgorithm(word.to_string())))?,
            );
        }
        let mut algorithm = named.unwrap_or(Algorithm::DEFAULT);
        if let Some(b) = burst {
            algorithm = match algorithm {
                Algorithm::TokenBucket { .. } => Algorithm::TokenBucket { capacity: b },
                Algorithm::Gcra { .. } => Algorithm::Gcra { burst: b },
                _ => return Err(err(PolicyErrorKind::BurstNotAllowed)),
            };
        }
        Limit::new(count, window, algorithm).map_err(|e| e.with_part(text))
    }
}

/// The algorithm a `COUNT/WINDOW` limit names by `keyword`, a bucket's capacity or a GCRA
/// burst defaulting to `count`. A concurrency limit has its own form, so `concurrent` is not
/// one of these.
fn window_algorithm(keyword: &str, count: u64) -> Option<Algorithm> {
    [
        Algorithm::RollingWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
        Algorithm::FixedWindow,
        Algorithm::TokenBucket { capacity: count },
        Algorithm::Gcra { burst: count },
    ]
    .into_iter()
    .find(|algorithm| algorithm.keyword() == keyword)
}

/// Parses `N concurrent [lease=DURATION]`.
fn parse_concurrency(text: &str) -> Result<Limit, PolicyErrorKind> {
    let mut words = text.split_whitespace();
    let count = match (words.next(), words.next()) {
        (Some(count), Some(word)) if word == Algorithm::Concurrency.keyword() => count,
        _ => {
            return Err(PolicyErrorKind::Syntax(
                "expected COUNT/WINDOW (as in 10/s) or COUNT concurrent",
            ))
        }
    };
    let count = parse_number(count)?;
    let mut lease = None;
    for word in words {
        match word.split_once('=') {
            Some(("lease", value)) => {
                if lease.replace(parse_window(value)?).is_some() {
                    return Err(PolicyErrorKind::Syntax("lease given twice"));
                }
            }
            Some((name, _)) => return Err(PolicyErrorKind::UnknownParameter(name.to_string())),
            None => return Err(PolicyErrorKind::Syntax("expected lease=DURATION")),
        }
    }
    let lease = lease.unwrap_or(DEFAULT_LEASE);
    Limit::new(count, lease, Algorithm::Concurrency).map_err(PolicyError::into_kind)
}

/// Parses `123` or `1_000` (an underscore only between two digits).
fn parse_number(text: &str) -> Result<u64, PolicyErrorKind> {
    let text = text.trim();
    if text.is_empty()
        || text.starts_with('_')
        || text.ends_with('_')
        || text.contains("__")
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

/// Parses a window or a lease: `s`, `5min`, `1500ms`.
fn parse_window(text: &str) -> Result<Duration, PolicyErrorKind> {
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '_')
        .unwrap_or(text.len());
    let (n, unit) = text.split_at(split);
    let n = if n.is_empty() { 1 } else { parse_number(n)? };
    let unit_ms: u64 = match unit {
        "ms" => 1,
        "s" | "sec" | "secs" | "second" | "seconds" => 1000,
        "m" | "min" | "mins" | "minute" | "minutes" => 60_000,
        "h" | "hr" | "hrs" | "hour" | "hours" => 3_600_000,
        "d" | "day" | "days" => 86_400_000,
        "" => {
            return Err(PolicyErrorKind::Syntax(
                "missing window unit (written right after the number, as in 5min)",
            ))
        }
        other => return Err(PolicyErrorKind::UnknownUnit(other.to_string())),
    };
    let ms = n.checked_mul(unit_ms).ok_or(PolicyErrorKind::Overflow)?;
    Ok(Duration::from_millis(ms))
}

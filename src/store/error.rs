//! What a store reports when it cannot decide, or cannot be built.

use std::fmt;
use std::time::Duration;

/// A store could not decide: it is unreachable, too slow, or answered nonsense.
///
/// The limiter returns it as is; what to do then (admit, deny, fall back) is the caller's
/// choice. The details of a backend failure are in [`source()`](std::error::Error::source),
/// for the application's logs; the message itself names only the kind of failure.
#[derive(Debug)]
#[non_exhaustive]
pub enum StoreError {
    /// No answer within the store's timeout. The script may still have run: it is never
    /// retried, so a request is charged at most once.
    Timeout(Duration),
    /// The backend failed: connection refused or lost, a server error.
    Backend(Box<dyn std::error::Error + Send + Sync>),
    /// The backend answered something the script never returns.
    UnexpectedReply(String),
    /// The store's configuration is unusable.
    Config(ConfigError),
    /// The store is known to be down (its circuit breaker is open, or it is reconnecting): the
    /// check was answered at once, without calling it.
    Unavailable,
}

impl StoreError {
    /// A short, stable name of the kind of failure, for logs and metric labels: `timeout`,
    /// `backend`, `unexpected_reply`, `config` or `unavailable`.
    pub fn kind_label(&self) -> &'static str {
        match self {
            StoreError::Timeout(_) => "timeout",
            StoreError::Backend(_) => "backend",
            StoreError::UnexpectedReply(_) => "unexpected_reply",
            StoreError::Config(_) => "config",
            StoreError::Unavailable => "unavailable",
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Timeout(d) => write!(f, "rate-limit store did not answer within {d:?}"),
            StoreError::Backend(_) => f.write_str("rate-limit store failed"),
            StoreError::UnexpectedReply(what) => {
                write!(f, "rate-limit store answered unexpectedly: {what}")
            }
            StoreError::Config(e) => fmt::Display::fmt(e, f),
            StoreError::Unavailable => f.write_str("rate-limit store unavailable"),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StoreError::Backend(e) => Some(&**e),
            StoreError::Config(e) => e.source(),
            _ => None,
        }
    }
}

impl From<ConfigError> for StoreError {
    fn from(e: ConfigError) -> StoreError {
        StoreError::Config(e)
    }
}

/// A store's configuration is unusable: which setting, and what is wrong with it.
#[derive(Debug)]
pub struct ConfigError {
    kind: ConfigErrorKind,
    part: String,
}

/// What is wrong with a store's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigErrorKind {
    /// The key prefix is empty or contains `{` or `}` (they would break the hash tag).
    Prefix,
    /// A timeout of zero.
    Timeout,
    /// The URL is not a Redis URL the store can use.
    Url,
}

impl ConfigError {
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn new(kind: ConfigErrorKind, part: impl Into<String>) -> ConfigError {
        ConfigError {
            kind,
            part: part.into(),
        }
    }

    /// What is wrong.
    pub fn kind(&self) -> ConfigErrorKind {
        self.kind
    }

    /// The offending setting as given (a URL with its password replaced by `***`).
    pub fn part(&self) -> &str {
        &self.part
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let part = &self.part;
        match self.kind {
            ConfigErrorKind::Prefix => write!(
                f,
                "key prefix {part:?} must be non-empty and contain no braces"
            ),
            ConfigErrorKind::Timeout => write!(f, "{part} must be longer than 0"),
            ConfigErrorKind::Url => write!(
                f,
                "{part:?} is not a usable Redis URL (redis://[[user]:password@]host[:port][/db], \
                 rediss:// for TLS, redis+unix:///path)"
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

/// `url` with anything between `scheme://` and the last `@` (the credentials) replaced by
/// `***`, so that a password never reaches an error message or a log. Works on text that does
/// not parse as a URL too (a password with `#` or `/` in it).
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn redact_url(url: &str) -> String {
    let Some(start) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    match url[start..].rfind('@') {
        Some(at) => format!("{}***{}", &url[..start], &url[start + at..]),
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact_url("redis://h:1/0"), "redis://h:1/0");
        assert_eq!(redact_url("redis://:s3cret@h:1/0"), "redis://***@h:1/0");
        assert_eq!(redact_url("redis://u:p#/x@y@h:1"), "redis://***@h:1");
        assert_eq!(redact_url("not a url @ all"), "not a url @ all");
        let e = ConfigError::new(ConfigErrorKind::Url, redact_url("redis://:pa/ss@h"));
        assert!(!e.to_string().contains("pa/ss"), "{e}");
    }
}

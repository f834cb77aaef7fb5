//! What a store reports when it cannot decide, or cannot be built.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// A store could not decide: it is unreachable, too slow, or answered nonsense.
///
/// What a check does then is its limiter's [`OnStoreError`](crate::OnStoreError) (by
/// default, admit): a check returns it, as [`Error::Store`](crate::Error::Store), when the
/// limiter fails closed (or its fallback cannot hold the cost); `usage` and `reset` always do.
/// The details of a backend failure are in [`source()`](std::error::Error::source), for the
/// application's logs; the message itself names only the kind of failure.
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
    /// The server answers but cannot serve the store as configured (a wrong password, an ACL
    /// user missing a command, a replica, a Cluster node…): unlike a server that is down, this
    /// does not pass by itself. The message names the cause and the fix. The store keeps
    /// checking in the background and picks up a fixed server without a restart.
    Misconfigured(Misconfiguration),
}

impl StoreError {
    /// A short, stable name of the kind of failure, for logs and metric labels: `timeout`,
    /// `backend`, `unexpected_reply`, `config`, `unavailable` or `misconfigured`.
    pub fn kind_label(&self) -> &'static str {
        KIND_LABELS[self.kind_index()]
    }

    /// Whether the call that failed may have run on the server before the failure (its
    /// answer lost, or it answered nonsense): not when the store is known not to have been
    /// called (its breaker open, or answering at once while it reconnects) or its
    /// configuration is unusable. Other failures are taken as possibly run.
    pub(crate) fn may_have_run(&self) -> bool {
        !matches!(self, StoreError::Unavailable | StoreError::Config(_))
    }

    /// The place of this kind in [`KIND_LABELS`].
    pub(crate) fn kind_index(&self) -> usize {
        match self {
            StoreError::Timeout(_) => 0,
            StoreError::Backend(_) => 1,
            StoreError::UnexpectedReply(_) => 2,
            StoreError::Config(_) => 3,
            StoreError::Unavailable => 4,
            StoreError::Misconfigured(_) => 5,
        }
    }
}

/// Every [`StoreError::kind_label`], in the order of [`StoreError::kind_index`].
pub(crate) const KIND_LABELS: [&str; 6] = [
    "timeout",
    "backend",
    "unexpected_reply",
    "config",
    "unavailable",
    "misconfigured",
];

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
            StoreError::Misconfigured(e) => fmt::Display::fmt(e, f),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StoreError::Backend(e) => Some(&**e),
            StoreError::Config(e) => e.source(),
            StoreError::Misconfigured(e) => e.source(),
            _ => None,
        }
    }
}

impl From<ConfigError> for StoreError {
    fn from(e: ConfigError) -> StoreError {
        StoreError::Config(e)
    }
}

/// A store's configuration (or a limiter's [namespace](crate::store::Namespace) on it) is
/// unusable: which setting, and what is wrong with it.
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
    /// A timeout of zero, or of more than an hour.
    Timeout,
    /// The URL is not a Redis URL the store can use.
    Url,
    /// Sentinel credentials were given for a URL without sentinels.
    SentinelCredentials,
    /// A limiter's [`Namespace`](crate::store::Namespace) is empty, too long, or holds `:`,
    /// `{`, `}`, whitespace or a control character.
    Namespace,
    /// A URL asking for TLS (`rediss://`, `rediss+cluster://`, `rediss+sentinel://`), in a
    /// build whose `redis` crate has none of its TLS features.
    Tls,
}

/// The Redis commands the store sends, as an ACL rule: its own calls (`EVALSHA`,
/// `SCRIPT LOAD` after a `NOSCRIPT`, `ZREM` to release slots, `INFO` in the start-up checks,
/// `DEL` for `Limiter::reset`) and those the Lua scripts call. A unit test checks it against
/// the scripts.
pub(crate) const ACL_COMMANDS: &str = "+evalsha +script|load +zrem +info +del +time +get \
     +mget +set +psetex +pexpire +zadd +zcount +zrange +zremrangebyscore +zscore";

/// What a Redis Cluster's nodes are sent besides [`ACL_COMMANDS`]: the cluster client's
/// `PING` on each new node connection and `CLUSTER SLOTS` for the slot map, and `ASKING` before
/// a call redirected during a slot migration.
pub(crate) const ACL_CLUSTER_COMMANDS: &str = "+ping +cluster|slots +asking";

/// The server answers, but cannot serve the store as configured: what is wrong, in words that
/// name the fix. The server's own answer, when there is one, is the
/// [`source()`](std::error::Error::source).
#[derive(Debug, Clone)]
pub struct Misconfiguration {
    kind: MisconfigurationKind,
    /// What the message needs besides the kind: the key prefix, the version found, the
    /// Sentinel service name.
    context: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

/// What is wrong with the server a store was pointed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MisconfigurationKind {
    /// The server refused the credentials (wrong or missing password or user), or the
    /// sentinels refused theirs.
    Authentication,
    /// The ACL user may not run a command the store sends (or one its scripts call), or the
    /// command is disabled or renamed.
    CommandDenied,
    /// The ACL user's key patterns do not cover the store's keys (`PREFIX:*`).
    KeyDenied,
    /// The server is a read-only replica, and has not served the store as its master (one
    /// that has, demoted by a failover, is a store down until its address leads to the new
    /// master).
    Replica,
    /// The address is a Redis Sentinel reached with a `redis://` URL.
    Sentinel,
    /// An address in a `redis+sentinel://` URL is not a Sentinel.
    NotSentinel,
    /// No Sentinel knows the service name of a `redis+sentinel://` URL.
    UnknownService,
    /// The server is a Redis Cluster node reached with a `redis://` URL.
    Cluster,
    /// An address in a `redis+cluster://` URL is not a Redis Cluster node.
    NotCluster,
    /// The server's Redis is older than 7.0.
    Version,
    /// The server refused to switch to the URL's database (`/N`): no such database, or an
    /// ACL user without `+select`.
    Database,
}

impl Misconfiguration {
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn new(kind: MisconfigurationKind, context: impl Into<String>) -> Misconfiguration {
        Misconfiguration {
            kind,
            context: context.into(),
            source: None,
        }
    }

    /// The server's answer behind it, kept for the application's logs.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn with_source(
        mut self,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Misconfiguration {
        self.source = Some(Arc::new(source));
        self
    }

    /// What is wrong.
    pub fn kind(&self) -> MisconfigurationKind {
        self.kind
    }
}

impl fmt::Display for Misconfiguration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let context = &self.context;
        match self.kind {
            MisconfigurationKind::Authentication if context == "sentinel" => f.write_str(
                "the sentinels refused the credentials: give theirs with \
                 RedisStoreBuilder::sentinel_password (and sentinel_username); the master's go \
                 in the URL",
            ),
            MisconfigurationKind::Authentication => f.write_str(
                "Redis refused the credentials: give the user and password in the \
                 URL (redis://USER:PASSWORD@HOST:PORT, or redis://:PASSWORD@HOST:PORT for the \
                 default user), or fix the server's ACL or requirepass",
            ),
            MisconfigurationKind::CommandDenied if context == "cluster" => write!(
                f,
                "the Redis user may not run a command rate limiting needs: grant them on every \
                 node with `ACL SETUSER USER {ACL_COMMANDS} {ACL_CLUSTER_COMMANDS}` (none of \
                 them may be renamed or disabled)"
            ),
            MisconfigurationKind::CommandDenied => write!(
                f,
                "the Redis user may not run a command rate limiting needs: grant them with \
                 `ACL SETUSER USER {ACL_COMMANDS}` (none of them may be renamed or disabled)"
            ),
            MisconfigurationKind::KeyDenied => write!(
                f,
                "the Redis user may not access the rate limiter's keys: add the key pattern \
                 `~{context}:*` to its ACL (`ACL SETUSER USER ~{context}:*`)"
            ),
            MisconfigurationKind::Replica => f.write_str(
                "the Redis server is a read-only replica: give the master's address, or a \
                 redis+sentinel:// URL so that the store follows failovers",
            ),
            MisconfigurationKind::Sentinel => f.write_str(
                "the address is a Redis Sentinel, not a data server: use \
                 redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE_NAME",
            ),
            MisconfigurationKind::NotSentinel => f.write_str(
                "no address of the redis+sentinel:// URL is a Sentinel: list the sentinels' \
                 ports (26379 by default), not the data servers'",
            ),
            MisconfigurationKind::UnknownService => write!(
                f,
                "no Sentinel monitors a service named {context:?}: check the name in \
                 redis+sentinel://HOSTS/SERVICE_NAME (SENTINEL MASTERS lists them)"
            ),
            MisconfigurationKind::Cluster => f.write_str(
                "the server is a Redis Cluster node, not a standalone server: use \
                 redis+cluster://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...] (any of its nodes)",
            ),
            MisconfigurationKind::NotCluster => f.write_str(
                "the redis+cluster:// URL names a server without cluster mode: use \
                 redis://HOST:PORT for a standalone server, or list the cluster's nodes",
            ),
            MisconfigurationKind::Database => f.write_str(
                "the Redis server refused to switch to the URL's database (redis://HOST:PORT/N): \
                 N must be below the server's `databases` setting (16 by default), and an ACL \
                 user needs `+select` for any database but 0",
            ),
            MisconfigurationKind::Version => write!(
                f,
                "Redis {context} is too old: the store needs 7.0 or later (its scripts read \
                 TIME before writing, which needs effects replication, the only mode since \
                 7.0, and renew leases with PEXPIRE ... GT, new in 7.0)"
            ),
        }
    }
}

impl std::error::Error for Misconfiguration {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl ConfigError {
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
            ConfigErrorKind::Timeout => {
                write!(f, "{part} must be longer than 0 and at most an hour")
            }
            ConfigErrorKind::Namespace => write!(
                f,
                "namespace {part:?} must be 1 to 64 bytes without ':', '{{', '}}', whitespace \
                 or control characters"
            ),
            ConfigErrorKind::SentinelCredentials => write!(
                f,
                "a Sentinel user or password was given, but {part:?} is not a \
                 redis+sentinel:// URL: give the server's own credentials in the URL"
            ),
            ConfigErrorKind::Tls => write!(
                f,
                "{part:?} asks for TLS, which this build cannot speak: turn on one of the redis \
                 crate's TLS features in your Cargo.toml (redis = {{ version = \"1.8\", \
                 features = [\"tokio-rustls-comp\"] }}, or \"tokio-native-tls-comp\")"
            ),
            ConfigErrorKind::Url => write!(
                f,
                "{part:?} is not a usable Redis URL (redis://[[user]:password@]host[:port][/db], \
                 rediss:// for TLS, redis+unix:///path, \
                 redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db], \
                 redis+cluster://[[user]:password@]host:port[,host:port...])"
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

/// `url` with anything between `scheme://` and the last `@` (the credentials) replaced by
/// `***`, and so the value of a `pass=` or `password=` query parameter (`redis+unix://` URLs
/// carry the password there), so that a password never reaches an error message or a log.
/// Works on text that does not parse as a URL too (a password with `#` or `/` in it).
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn redact_url(url: &str) -> String {
    let mut out = match url.find("://").map(|i| i + 3) {
        Some(start) => match url[start..].rfind('@') {
            Some(at) => format!("{}***{}", &url[..start], &url[start + at..]),
            None => url.to_string(),
        },
        None => url.to_string(),
    };
    for name in ["pass=", "password="] {
        let mut from = 0;
        while let Some(i) = out[from..].find(name).map(|i| i + from) {
            let value = i + name.len();
            let end = out[value..].find('&').map_or(out.len(), |e| value + e);
            if i > 0 && matches!(out.as_bytes()[i - 1], b'?' | b'&') {
                out.replace_range(value..end, "***");
            }
            from = value.min(out.len());
        }
    }
    out
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
        assert_eq!(
            redact_url("redis+unix:///run/r.sock?db=1&pass=s3cret&user=u"),
            "redis+unix:///run/r.sock?db=1&pass=***&user=u"
        );
        assert_eq!(
            redact_url("redis+unix:///r?password=x#y"),
            "redis+unix:///r?password=***"
        );
        assert_eq!(
            redact_url("redis+sentinel://:pw@h:1,h:2/mymaster"),
            "redis+sentinel://***@h:1,h:2/mymaster"
        );
        let e = ConfigError::new(ConfigErrorKind::Url, redact_url("redis://:pa/ss@h"));
        assert!(!e.to_string().contains("pa/ss"), "{e}");
    }
}

//! The Redis store.
//!
//! One multiplexed connection (the `redis` crate's `ConnectionManager`) is shared by every
//! task and clone: no connection per request, and it reconnects by itself after a failure.
//! Each check is one `EVALSHA` of the check script (`lua/`); the script is loaded only when
//! Redis answers `NOSCRIPT` (after `SCRIPT FLUSH`, a restart or a failover), and a call is
//! never retried after a timeout or a lost connection, because the script may have run and
//! a retry would charge twice.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Script;

use super::breaker::Breaker;
use super::error::{redact_url, ConfigError, ConfigErrorKind};
use super::keyspace;
use super::lease::{KeeperSlot, Lease};
use super::script;
use super::{Outcome, Plan, StoreError};
use crate::clock::Clock;

const DEFAULT_PREFIX: &str = "tollgate";
/// The default per-call timeout. A healthy Redis answers a check in well under a
/// millisecond on a LAN, and under load (a persistence fork, a busy neighbour) a few
/// milliseconds; 50 ms is ten times that, yet small against a request's own budget. The
/// breaker opens after three failures in a row, so a dead Redis costs a few requests this
/// much, and the rest nothing.
const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);

/// State in Redis, shared by every process that uses the same server and prefix.
///
/// A cheap handle: clones share one connection.
#[derive(Clone)]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub struct RedisStore {
    conn: ConnectionManager,
    script: Arc<Script>,
    renew_script: Arc<Script>,
    keeper: Arc<KeeperSlot>,
    breaker: Arc<Breaker>,
    prefix: Arc<str>,
    clock: Clock,
    timeout: Duration,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("clock", &self.clock)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// Configures a [`RedisStore`].
#[derive(Debug, Clone)]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub struct RedisStoreBuilder {
    url: String,
    prefix: String,
    clock: Clock,
    timeout: Duration,
    connect_timeout: Duration,
}

impl RedisStoreBuilder {
    /// The prefix of every key (default `tollgate`), to keep applications that share one
    /// Redis apart. It may not contain `{` or `}`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long one check may take, round trip included (default 50 ms). Past it the check
    /// fails with [`StoreError::Timeout`] and is not retried.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long connecting may take (default 1 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Reads the time from `clock` instead of Redis `TIME`: for tests and replays only.
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    fn manager(&self) -> Result<(redis::Client, ConnectionManagerConfig), StoreError> {
        if !keyspace::valid_prefix(&self.prefix) {
            return Err(ConfigError::new(ConfigErrorKind::Prefix, &self.prefix).into());
        }
        if self.timeout.is_zero() {
            return Err(ConfigError::new(ConfigErrorKind::Timeout, "timeout").into());
        }
        if self.connect_timeout.is_zero() {
            return Err(ConfigError::new(ConfigErrorKind::Timeout, "connect timeout").into());
        }
        // The redis crate's own message may quote the URL: only the redacted form is kept.
        let client = redis::Client::open(self.url.as_str())
            .map_err(|_| ConfigError::new(ConfigErrorKind::Url, redact_url(&self.url)))?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(self.timeout))
            .set_connection_timeout(Some(self.connect_timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_secs(1));
        Ok((client, config))
    }

    fn finish(self, conn: ConnectionManager) -> RedisStore {
        let prefix: Arc<str> = self.prefix.into();
        RedisStore {
            breaker: Arc::new(Breaker::new(prefix.clone())),
            conn,
            script: Arc::new(Script::new(script::CHECK)),
            renew_script: Arc::new(Script::new(script::RENEW)),
            keeper: Arc::default(),
            prefix,
            clock: self.clock,
            timeout: self.timeout,
        }
    }

    /// Connects, and fails if Redis cannot be reached now.
    ///
    /// # Errors
    ///
    /// [`StoreError::Config`] for an unusable setting (the URL, the prefix, a zero timeout);
    /// [`StoreError::Backend`] or [`StoreError::Timeout`] when Redis cannot be reached.
    pub async fn build(self) -> Result<RedisStore, StoreError> {
        let (client, config) = self.manager()?;
        let conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(backend)?;
        Ok(self.finish(conn))
    }

    /// Returns at once and connects on first use: the application starts even while Redis
    /// is down, and checks fail with a [`StoreError`] until it is back. Must be called
    /// within a Tokio runtime.
    ///
    /// # Errors
    ///
    /// [`StoreError::Config`] for an unusable setting (the URL, the prefix, a zero timeout).
    pub fn build_lazy(self) -> Result<RedisStore, StoreError> {
        let (client, config) = self.manager()?;
        let conn = ConnectionManager::new_lazy_with_config(client, config).map_err(backend)?;
        Ok(self.finish(conn))
    }
}

fn backend(e: redis::RedisError) -> StoreError {
    StoreError::Backend(Box::new(e))
}

impl RedisStore {
    /// Configures a store for the server at `url` (`redis://host:port/db`, `rediss://` for
    /// TLS when the `redis` crate is built with it, `redis+unix:///path`).
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url: url.into(),
            prefix: DEFAULT_PREFIX.into(),
            clock: Clock::Real,
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: Duration::from_secs(1),
        }
    }

    /// Connects to `url` with the default settings.
    ///
    /// # Errors
    ///
    /// As [`RedisStoreBuilder::build`].
    pub async fn connect(url: impl Into<String>) -> Result<RedisStore, StoreError> {
        RedisStore::builder(url).build().await
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub(crate) fn clock(&self) -> &Clock {
        &self.clock
    }

    /// One check, through the breaker: while Redis is known to be down it fails at once.
    pub(crate) async fn check(&self, plan: &Plan<'_>) -> Result<Outcome, StoreError> {
        let call = async {
            let mut call = self.script.prepare_invoke();
            script::check_args(&mut call, &self.prefix, self.clock.manual_now(), plan);
            let reply: Vec<i64> = self.run(call.invoke_async(&mut self.conn.clone())).await?;
            script::parse_reply(&reply, plan.ids.len() * plan.limits.len())
        };
        self.breaker.call(call, || self.prober()).await
    }

    /// What the breaker runs to learn whether Redis is back: a `PING` under the timeout, on
    /// a handle that does not keep the store's keeper or breaker alive.
    fn prober(&self) -> impl Fn() -> Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send>> {
        let (conn, timeout) = (self.conn.clone(), self.timeout);
        move || {
            let mut conn = conn.clone();
            Box::pin(async move {
                let ping = redis::cmd("PING");
                match tokio::time::timeout(timeout, ping.query_async::<()>(&mut conn)).await {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(e)) => Err(backend(e)),
                    Err(_) => Err(StoreError::Timeout(timeout)),
                }
            })
        }
    }

    /// Runs one call under the store's timeout.
    async fn run<T>(
        &self,
        call: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| StoreError::Timeout(self.timeout))?
            .map_err(|e| {
                if e.is_timeout() {
                    StoreError::Timeout(self.timeout)
                } else {
                    backend(e)
                }
            })
    }

    /// Extends live leases: one script call per distinct lease time (usually one in all).
    pub(crate) async fn renew(&self, leases: &[&Lease]) -> Result<(), StoreError> {
        let mut times: Vec<u64> = leases.iter().map(|l| l.lease_us).collect();
        times.sort_unstable();
        times.dedup();
        for lease_us in times {
            let mut call = self.renew_script.prepare_invoke();
            call.arg(script::now_arg(self.clock.manual_now()))
                .arg(lease_us);
            for lease in leases.iter().filter(|l| l.lease_us == lease_us) {
                for key in &lease.keys {
                    call.key(key).arg(&lease.id);
                }
            }
            let _: i64 = self.run(call.invoke_async(&mut self.conn.clone())).await?;
        }
        Ok(())
    }

    /// Releases leases: one pipelined `ZREM` per slot, idempotent.
    pub(crate) async fn release(&self, leases: &[Lease]) -> Result<(), StoreError> {
        let mut pipe = redis::pipe();
        for lease in leases {
            for key in &lease.keys {
                pipe.zrem(key, &lease.id).ignore();
            }
        }
        self.run(pipe.query_async::<()>(&mut self.conn.clone()))
            .await
    }

    pub(crate) fn keeper_slot(&self) -> &KeeperSlot {
        &self.keeper
    }

    /// The same store without the keeper handle, for the keeper task itself: holding its own
    /// sender would keep it (and the connection) alive forever.
    pub(crate) fn detached(&self) -> RedisStore {
        RedisStore {
            keeper: Arc::default(),
            ..self.clone()
        }
    }
}

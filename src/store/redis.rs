//! The Redis store.
//!
//! One multiplexed connection (the `redis` crate's `ConnectionManager`) is shared by every
//! task and clone: no connection per request, and it reconnects by itself after a failure.
//! Each check is one `EVALSHA` of the check script (`lua/`); the script is loaded only when
//! Redis answers `NOSCRIPT` (after `SCRIPT FLUSH`, a restart or a failover), and a call is
//! never retried after a timeout or a lost connection, because the script may have run and
//! a retry would charge twice.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Script;

use super::{Clock, Entry, Lease, Outcome, Plan, StoreError};
use crate::concurrency::KeeperSlot;
use crate::keys;
use crate::policy::Algorithm;

/// The check script: the helpers, one file per algorithm, then the driver.
const CHECK_SCRIPT: &str = concat!(
    include_str!("../../lua/prelude.lua"),
    include_str!("../../lua/sliding_log.lua"),
    include_str!("../../lua/sliding_window.lua"),
    include_str!("../../lua/fixed_window.lua"),
    include_str!("../../lua/gcra.lua"),
    include_str!("../../lua/concurrency.lua"),
    include_str!("../../lua/check.lua"),
);

/// Renews concurrency leases (with the shared helpers).
const RENEW_SCRIPT: &str = concat!(
    include_str!("../../lua/prelude.lua"),
    include_str!("../../lua/renew.lua"),
);

const DEFAULT_PREFIX: &str = "tollgate";
const DEFAULT_TIMEOUT: Duration = Duration::from_millis(250);

/// State in Redis, shared by every process that uses the same server and prefix.
///
/// A cheap handle: clones share one connection.
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    script: Arc<Script>,
    renew_script: Arc<Script>,
    keeper: Arc<KeeperSlot>,
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

    /// How long one check may take, round trip included (default 250 ms). Past it the check
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
        if !keys::valid_prefix(&self.prefix) {
            return Err(StoreError::Config(format!(
                "key prefix {:?} must be non-empty and contain no braces",
                self.prefix
            )));
        }
        if self.timeout.is_zero() {
            return Err(StoreError::Config("timeout must be longer than 0".into()));
        }
        let client = redis::Client::open(self.url.as_str())
            .map_err(|e| StoreError::Config(format!("Redis URL {:?}: {e}", self.url)))?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(self.timeout))
            .set_connection_timeout(Some(self.connect_timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_secs(1));
        Ok((client, config))
    }

    fn finish(self, conn: ConnectionManager) -> RedisStore {
        RedisStore {
            conn,
            script: Arc::new(Script::new(CHECK_SCRIPT)),
            renew_script: Arc::new(Script::new(RENEW_SCRIPT)),
            keeper: Arc::default(),
            prefix: self.prefix.into(),
            clock: self.clock,
            timeout: self.timeout,
        }
    }

    /// Connects, and fails if Redis cannot be reached now.
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
    pub async fn connect(url: impl Into<String>) -> Result<RedisStore, StoreError> {
        RedisStore::builder(url).build().await
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub(crate) async fn check(&self, plan: &Plan<'_>) -> Result<Outcome, StoreError> {
        let mut call = self.script.prepare_invoke();
        for id in plan.ids {
            for limit in plan.limits {
                call.key(keys::key(&self.prefix, id, limit));
            }
        }
        match self.clock.manual_now() {
            Some(now) => call.arg(now),
            None => call.arg(""),
        };
        call.arg(plan.cost).arg(plan.limits.len()).arg(plan.lease);
        for limit in plan.limits {
            let code = match limit.algorithm() {
                Algorithm::SlidingLog => 1,
                Algorithm::SlidingWindow => 2,
                Algorithm::FixedWindow => 3,
                Algorithm::TokenBucket { .. } | Algorithm::Gcra { .. } => 4,
                Algorithm::Concurrency => 5,
            };
            call.arg(code)
                .arg(limit.count())
                .arg(limit.window_us())
                .arg(limit.max_cost().min(u64::from(u32::MAX)));
        }
        let reply: Vec<i64> = self.run(call.invoke_async(&mut self.conn.clone())).await?;
        parse_reply(&reply, plan.ids.len() * plan.limits.len())
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
            call.arg(
                self.clock
                    .manual_now()
                    .map_or(String::new(), |n| n.to_string()),
            )
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

fn parse_reply(reply: &[i64], pairs: usize) -> Result<Outcome, StoreError> {
    if reply.len() != 2 + 4 * pairs {
        return Err(StoreError::UnexpectedReply(format!(
            "{} integers for {pairs} keys",
            reply.len()
        )));
    }
    let nonneg = |v: i64| {
        u64::try_from(v).map_err(|_| StoreError::UnexpectedReply(format!("negative value {v}")))
    };
    let entries = reply[2..]
        .chunks_exact(4)
        .map(|c| {
            Ok(Entry {
                remaining: nonneg(c[0])?,
                reset_after_us: nonneg(c[1])?,
                retry_after_us: nonneg(c[2])?,
                admitted: c[3] == 1,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    Ok(Outcome {
        allowed: reply[0] == 1,
        entries,
    })
}

//! The Redis store.
//!
//! One multiplexed connection is shared by every task and clone, kept by a background task
//! that replaces it whenever it breaks (`connection`), and only after the server has passed
//! the start-up checks (`validate`). The URL names one server, a service behind Sentinel, or a
//! Redis Cluster (`url`); a cluster's connection is the `redis` crate's cluster client with the
//! store's rules on top (`cluster`), and a call goes to one hash slot: a check whose
//! identifiers live in several slots is split, one call per slot. Each check is one `EVALSHA` of the check script (`lua/`); the script is loaded
//! only when Redis answers `NOSCRIPT` (after `SCRIPT FLUSH`, a restart or a failover), and a
//! call is never retried after a timeout or a lost connection, because the script may have
//! run and a retry would charge twice.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{self, StreamExt};
use redis::{ErrorKind, RedisResult, Script, ScriptInvocation, ServerErrorKind};
use tokio::time::Instant;

use super::breaker::Breaker;
use super::error::{redact_url, ConfigError, ConfigErrorKind, Misconfiguration};
use super::keyspace;
use super::lease::{lease_id, KeeperSlot, Lease, Reached};
use super::script;
use super::{Outcome, Plan, StoreError};
use crate::clock::Clock;
use crate::observe::BoundedLog;

mod cluster;
mod connection;
mod schedule;
mod sentinel;
mod split;
mod url;
mod validate;

use cluster::Conn;
use connection::{Connector, Link};

const DEFAULT_PREFIX: &str = "tollgate";
/// The default per-call timeout. A healthy Redis answers a check in well under a
/// millisecond on a LAN, and under load (a persistence fork, a busy neighbour) a few
/// milliseconds; 50 ms is ten times that, yet small against a request's own budget. The
/// breaker opens after three failures in a row, so a stalled Redis costs a few requests this
/// much, and the rest nothing.
const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The most slots one lease call renews or releases. A renewal costs Redis a few microseconds
/// a slot, in one script that nothing else runs beside: a process holding tens of thousands
/// of slots (long-lived streams under a concurrency limit) would otherwise block Redis past
/// every client's timeout, and its own call would time out, be taken as missed, and be sent
/// whole again on every tick. Cut at 256, a call holds Redis for about a millisecond.
const LEASES_PER_CALL: usize = 256;

/// The most lease calls in flight at once. Calls to a master that is down or stalled each
/// wait out the timeout; one after another, a few hundred of them (slots of many hash slots
/// on it) would hold up the keeper's round for seconds, and the leases of the healthy masters
/// would miss their renewals. Sixteen at a time keep such a round short without queueing
/// more than a few milliseconds of scripts at a healthy server.
const CALLS_IN_FLIGHT: usize = 16;

/// The first pause of a waiting check across cluster slots before it asks again (at least
/// its retry time); each next one is twice as long, up to [`LONGEST_SPLIT_PAUSE`]: the
/// polls of a wait for a concurrency slot.
const FIRST_SPLIT_PAUSE: Duration = crate::limiter::FIRST_POLL;

/// The longest pause of a waiting check across cluster slots between two tries.
const LONGEST_SPLIT_PAUSE: Duration = crate::limiter::LONGEST_POLL;

/// State in Redis, shared by every process that uses the same server and prefix.
///
/// A cheap handle: clones share one connection. The connection comes back by itself after
/// any failure (a lost connection, a refused password, a failover, a restart), within about
/// half a second of a usable master answering; every new connection passes the same checks
/// as [`RedisStoreBuilder::build`] first.
#[derive(Clone)]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub struct RedisStore {
    link: Link,
    renew_script: Arc<Script>,
    keeper: Arc<KeeperSlot>,
    breaker: Arc<Breaker>,
    /// The lease calls that failed, logged at a bounded rate.
    lease_log: Arc<BoundedLog>,
    /// The scheduled slots that could not be given back, logged at a bounded rate.
    give_back_log: Arc<BoundedLog>,
    /// The charges of checks across cluster slots that could not be given back, logged at
    /// a bounded rate.
    refund_log: Arc<BoundedLog>,
    prefix: Arc<str>,
    /// The URL with its credentials redacted.
    url: Arc<str>,
    clock: Clock,
    timeout: Duration,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.url)
            .field("prefix", &self.prefix)
            .field("connection", &self.link.state_label())
            .field("clock", &self.clock)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// What a [`RedisStore`] knows of its server now ([`RedisStore::health`]). Only
/// [`Up`](StoreHealth::Up) means checks are being decided by Redis; in every other state
/// they are answered by their limiters' [failure policies](crate::OnStoreError) (or wait for
/// a connection under way, up to their timeout).
///
/// For a Redis Cluster, the connection is the cluster client's as a whole: a master that
/// fails while the others answer shows as [`BreakerOpen`](StoreHealth::BreakerOpen) once its
/// slots' calls keep failing, and in the store's error metrics.
#[derive(Debug, Clone)]
#[non_exhaustive]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub enum StoreHealth {
    /// Connected, and calls go to Redis.
    Up,
    /// Connecting: the first connection, or a new one after the last was lost. Checks wait
    /// for it, up to their timeout.
    Connecting,
    /// The last connection attempt failed (refused, unreachable, timed out); the store tries
    /// again in the background, and checks fail at once meanwhile.
    Down,
    /// The server answers but cannot serve the store as configured (a wrong password, a
    /// replica, an ACL user without a command the store needs): what is wrong, and the fix.
    /// The store tries again in the background, so a fixed server is used without a restart.
    Misconfigured(Misconfiguration),
    /// Connected, but calls have been failing or timing out: the breaker is open, and checks
    /// are answered at once until a probe gets an answer.
    BreakerOpen,
}

impl StoreHealth {
    /// Whether checks are being decided by Redis ([`Up`](StoreHealth::Up)).
    pub fn is_up(&self) -> bool {
        matches!(self, StoreHealth::Up)
    }
}

/// The longest timeout a store takes: longer ones are refused when it is built (a deadline
/// so far ahead would not be one, and past what a clock holds, `Duration::MAX` say, it could
/// not be set at all).
const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// Configures a [`RedisStore`].
#[derive(Clone)]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub struct RedisStoreBuilder {
    url: String,
    prefix: String,
    clock: Clock,
    timeout: Duration,
    connect_timeout: Duration,
    sentinel_username: Option<String>,
    sentinel_password: Option<String>,
}

impl fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStoreBuilder")
            .field("url", &redact_url(&self.url))
            .field("prefix", &self.prefix)
            .field("clock", &self.clock)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("sentinel_username", &self.sentinel_username)
            .field(
                "sentinel_password",
                &self.sentinel_password.as_ref().map(|_| "***"),
            )
            .finish()
    }
}

impl RedisStoreBuilder {
    /// The prefix of every key (default `tollgate`), to keep applications that share one
    /// Redis apart. It may not contain `{` or `}`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long one check may take, round trip included (default 50 ms; at most an hour).
    /// Past it the check fails with [`StoreError::Timeout`] and is not retried. On a Redis
    /// Cluster, a check whose identifiers live in several slots that one master admits and
    /// another denies then waits for the first one's refund, a call of its own under the
    /// same timeout: up to twice as long.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long each step of making a connection may take (default 1 s; at most an hour):
    /// asking the sentinels, connecting and logging in, the start-up checks.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Reads the time from `clock` instead of Redis `TIME`: for tests and replays only.
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The sentinels' own password (Sentinel's `requirepass`), for a `redis+sentinel://` URL
    /// whose sentinels require one. The URL's credentials are the master's.
    pub fn sentinel_password(mut self, password: impl Into<String>) -> Self {
        self.sentinel_password = Some(password.into());
        self
    }

    /// The sentinels' own ACL user, with [`sentinel_password`](Self::sentinel_password)
    /// (a user without a password is not sent: the sentinels are asked as the default
    /// user).
    pub fn sentinel_username(mut self, username: impl Into<String>) -> Self {
        self.sentinel_username = Some(username.into());
        self
    }

    fn connector(&self) -> Result<Connector, StoreError> {
        if !keyspace::valid_prefix(&self.prefix) {
            return Err(ConfigError::new(ConfigErrorKind::Prefix, &self.prefix).into());
        }
        if self.timeout.is_zero() || self.timeout > MAX_TIMEOUT {
            return Err(ConfigError::new(ConfigErrorKind::Timeout, "timeout").into());
        }
        if self.connect_timeout.is_zero() || self.connect_timeout > MAX_TIMEOUT {
            return Err(ConfigError::new(ConfigErrorKind::Timeout, "connect timeout").into());
        }
        let mut target = url::parse(&self.url)?;
        let sentinel_auth = self.sentinel_username.is_some() || self.sentinel_password.is_some();
        if sentinel_auth
            && !target.set_sentinel_auth(
                self.sentinel_username.as_deref(),
                self.sentinel_password.as_deref(),
            )
        {
            let kind = ConfigErrorKind::SentinelCredentials;
            return Err(ConfigError::new(kind, redact_url(&self.url)).into());
        }
        Ok(Connector::new(
            target,
            self.prefix.as_str().into(),
            self.connect_timeout,
            self.timeout,
        ))
    }

    fn finish(self, link: Link) -> RedisStore {
        let prefix: Arc<str> = self.prefix.into();
        RedisStore {
            breaker: Arc::new(Breaker::new(prefix.clone())),
            link,
            renew_script: Arc::new(Script::new(script::RENEW)),
            keeper: Arc::default(),
            lease_log: Arc::default(),
            give_back_log: Arc::default(),
            refund_log: Arc::default(),
            prefix,
            url: redact_url(&self.url).into(),
            clock: self.clock,
            timeout: self.timeout,
        }
    }

    /// Connects and checks that the server can serve the store, with one real round of the
    /// store's commands on reserved keys (`PREFIX:{tollgate-probe-…}:…`, deleted at the end).
    /// Must be called within a Tokio runtime, which then runs the task that keeps
    /// the connection.
    ///
    /// # Errors
    ///
    /// * [`StoreError::Config`] for an unusable setting (the URL, the prefix, a zero timeout,
    ///   a Sentinel password without a `redis+sentinel://` URL);
    /// * [`StoreError::Misconfigured`] when the server answers but cannot serve the store: a
    ///   refused password, an ACL user missing a command or key pattern, a replica, a
    ///   Sentinel or Cluster node reached with `redis://`, a server without cluster mode
    ///   reached with `redis+cluster://`, Redis older than 7.0, a service no sentinel knows;
    ///   the message names the fix;
    /// * [`StoreError::Backend`] or [`StoreError::Timeout`] when Redis cannot be reached.
    pub async fn build(self) -> Result<RedisStore, StoreError> {
        let link = Link::connect(self.connector()?).await?;
        Ok(self.finish(link))
    }

    /// Returns at once and connects in the background: the application starts even while
    /// Redis is down, and checks fail with a [`StoreError`] until it is back — the same
    /// [`StoreError::Misconfigured`] as [`build`](Self::build) for a server that cannot serve
    /// the store. The connection is made at once within a Tokio runtime, else on first use.
    ///
    /// # Errors
    ///
    /// [`StoreError::Config`] for an unusable setting, as [`build`](Self::build).
    pub fn build_lazy(self) -> Result<RedisStore, StoreError> {
        let link = Link::lazy(self.connector()?);
        Ok(self.finish(link))
    }
}

impl RedisStore {
    /// Configures a store for the server at `url`:
    ///
    /// * `redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]` (`rediss://` for TLS, once one of the
    ///   `redis` crate's TLS features is on in the application's `Cargo.toml`, e.g.
    ///   `tokio-rustls-comp`), `redis+unix:///PATH[?db=DB&user=USER&pass=PASSWORD]`;
    /// * `redis+sentinel://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]...]/SERVICE[/DB]`: the
    ///   master of `SERVICE`, asked of the sentinels (port 26379 by default), followed across
    ///   failovers. The credentials are the master's; the sentinels' own are given with
    ///   [`RedisStoreBuilder::sentinel_password`].
    /// * `redis+cluster://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]...]`: a Redis Cluster,
    ///   found through any of the nodes listed (port 6379 by default), followed across
    ///   failovers and slot migrations. Every node takes the same credentials. An identifier's
    ///   keys share one hash slot; a check of identifiers in several slots runs one call per
    ///   slot, and gives back what admitting slots charged when another slot denies.
    /// * `rediss+cluster://…`, `rediss+sentinel://…`: the same over TLS, to every node (for
    ///   Sentinel, the sentinels and the master), with a TLS feature on as for `rediss://`.
    ///   Certificates are checked against the system's roots (`SSL_CERT_FILE` names a
    ///   private authority's, with `tokio-rustls-comp`).
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), tollgate::StoreError> {
    /// let store = tollgate::RedisStore::connect("redis+cluster://10.0.0.1:7000,10.0.0.2:7000").await?;
    /// # Ok(()) }
    /// ```
    ///
    /// Passwords may contain any character; the credentials end at the last `@`.
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url: url.into(),
            prefix: DEFAULT_PREFIX.into(),
            clock: Clock::Real,
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            sentinel_username: None,
            sentinel_password: None,
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

    /// What the store knows of its server now, without asking it (no check or `PING` is
    /// sent): for a readiness probe, a status page, a log line at start-up. See
    /// [`StoreHealth`]. Called within a Tokio runtime, it starts connecting a store built
    /// lazily outside one, which would otherwise wait for its first check.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), tollgate::StoreError> {
    /// use tollgate::store::StoreHealth;
    ///
    /// let store = tollgate::RedisStore::builder("redis://127.0.0.1:6379").build_lazy()?;
    /// // in a readiness handler:
    /// let ready = store.health().is_up();
    /// if let StoreHealth::Misconfigured(why) = store.health() {
    ///     eprintln!("rate limiting cannot work until this is fixed: {why}");
    /// }
    /// # let _ = ready; Ok(()) }
    /// ```
    pub fn health(&self) -> StoreHealth {
        match self.link.health() {
            StoreHealth::Up if !self.breaker.is_closed() => StoreHealth::BreakerOpen,
            health => health,
        }
    }

    pub(crate) fn clock(&self) -> &Clock {
        &self.clock
    }

    /// One check that may wait up to `max_wait_us` to be admitted (see `Store::check_within`).
    /// In a cluster, identifiers in several hash slots are checked one call per slot
    /// ([`check_split`](Self::check_split)); otherwise it is one call.
    ///
    /// No one script call can reserve a time across slots, so a check across slots that may
    /// wait is checked, and checked again when its denial says the cost may fit, as long as
    /// that lies within the wait (the way a policy with a concurrency limit waits).
    pub(crate) async fn check_within(
        &self,
        plan: &Plan<'_>,
        max_wait_us: u64,
    ) -> Result<Outcome, StoreError> {
        if !self.link.is_cluster() || plan.ids.len() < 2 {
            return self.check_call(plan, max_wait_us).await;
        }
        let groups = self.slot_groups(plan.ids);
        if groups.len() <= 1 {
            return self.check_call(plan, max_wait_us).await;
        }
        // (a wait past what the clock holds has no deadline)
        let deadline = Instant::now().checked_add(Duration::from_micros(max_wait_us));
        let mut pause = FIRST_SPLIT_PAUSE;
        loop {
            let outcome = self.check_split(plan, &groups).await?;
            if outcome.allowed || max_wait_us == 0 {
                return Ok(outcome);
            }
            let retry = outcome.entries.iter().map(|e| e.retry_after_us).max();
            let retry = Duration::from_micros(retry.unwrap_or(0).max(1));
            let now = Instant::now();
            let Some(fits) = now
                .checked_add(retry)
                .filter(|at| deadline.is_none_or(|d| *at <= d))
            else {
                return Ok(outcome);
            };
            // Unlike a check in one slot, which reserves its turn in one call, these ask
            // again, and every waiter of a limit is told the same time: woken together, one
            // is admitted and the others ask again, each time a call per slot and refunds.
            // Each waits at least a pause that doubles, jittered, so that a crowd of waiters
            // on a fast limit (a retry of a millisecond) costs Redis a few calls each, not
            // one every millisecond. The deadline still gets its last try.
            let paced = now.checked_add(connection::jittered(pause)).unwrap_or(fits);
            pause = (pause * 2).min(LONGEST_SPLIT_PAUSE);
            let at = fits.max(paced);
            tokio::time::sleep_until(deadline.map_or(at, |d| at.min(d))).await;
        }
    }

    /// One check as one script call (its keys in one slot), through the breaker: while Redis
    /// is known to be failing it fails at once. It may wait up to `max_wait_us` to be admitted.
    pub(crate) async fn check_call(
        &self,
        plan: &Plan<'_>,
        max_wait_us: u64,
    ) -> Result<Outcome, StoreError> {
        let call = async {
            // a check that may wait has a script of its own (never with a concurrency limit)
            let reserving = max_wait_us > 0 && plan.lease.is_empty();
            let compiled = script::check_script_within(plan.limits, plan.ids.len(), reserving);
            let mut call = compiled.call(plan);
            let now = self.clock.manual_now();
            script::check_args(&mut call, &self.prefix, now, plan);
            if reserving {
                script::reserve_arg(&mut call, now, max_wait_us);
            }
            let reply: redis::Value = self
                .run(|mut conn| async move { call.invoke_async(&mut conn).await })
                .await?;
            script::parse_reply(
                reply,
                &compiled,
                plan,
                if reserving { max_wait_us } else { 0 },
            )
        };
        self.breaker.call(call, || self.prober()).await
    }

    /// What a check of `plan` would decide now, with nothing written: the peek script (the
    /// check's phase 1, declared `no-writes`), through the breaker as a check. In a cluster,
    /// identifiers in several hash slots are peeked one call per slot
    /// ([`peek_split`](Self::peek_split)).
    pub(crate) async fn peek(&self, plan: &Plan<'_>) -> Result<Outcome, StoreError> {
        if self.link.is_cluster() && plan.ids.len() > 1 {
            let groups = self.slot_groups(plan.ids);
            if groups.len() > 1 {
                return self.peek_split(plan, &groups).await;
            }
        }
        self.peek_call(plan).await
    }

    /// [`peek`](Self::peek) as one script call (its keys in one slot).
    pub(crate) async fn peek_call(&self, plan: &Plan<'_>) -> Result<Outcome, StoreError> {
        let call = async {
            let compiled = script::peek_script(plan.limits, plan.ids.len());
            let mut call = compiled.script.prepare_invoke();
            let now = self.clock.manual_now();
            script::check_args(&mut call, &self.prefix, now, plan);
            let reply: redis::Value = self
                .run(|mut conn| async move { call.invoke_async(&mut conn).await })
                .await?;
            script::parse_peek_reply(reply, &compiled, plan)
        };
        self.breaker.call(call, || self.prober()).await
    }

    /// Deletes every key of `plan`'s identifiers for its limits: one `DEL` naming exactly
    /// those keys.
    pub(crate) async fn reset(&self, plan: &Plan<'_>) -> Result<(), StoreError> {
        let mut del = redis::cmd("DEL");
        for id in plan.ids {
            del.arg(keyspace::keys_of(
                &self.prefix,
                id,
                plan.namespace,
                plan.limits,
            ));
        }
        let call = async {
            let _: i64 = self
                .run(|mut conn| async move { del.query_async(&mut conn).await })
                .await?;
            Ok(())
        };
        self.breaker.call(call, || self.prober()).await
    }

    /// What the breaker runs to learn whether Redis is back: a check, as the store sends
    /// them, of a limit of its own (`1/s fixed`) on an identifier of its own, new each time
    /// (`PREFIX:{tollgate-probe-breaker-RANDOM}:…`, a key that expires within seconds: in a
    /// cluster, on any master, as the breaker counts the failures of every master), on a
    /// connection that passed the start-up checks, under the timeout. It holds the
    /// connection's handle only, not the store's keeper or breaker.
    ///
    /// A check rather than a command that merely answers (`TIME`): a server that answers but
    /// refuses the scripts' writes (`OOM` at `maxmemory` under `noeviction`, `MISCONF` after
    /// a failed save) would pass such a probe, close the breaker, fail the next three checks
    /// and open it again, five times a second, each time with a warning.
    fn prober(&self) -> impl Fn() -> Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send>> {
        let (link, timeout, prefix) = (self.link.clone(), self.timeout, self.prefix.clone());
        let limits: Arc<[crate::policy::Limit]> = validate::breaker_probe_limits().into();
        let check = script::check_script(&limits, 1);
        move || {
            let (link, prefix, limits, check) =
                (link.clone(), prefix.clone(), limits.clone(), check.clone());
            Box::pin(async move {
                let ids = [format!(
                    "{}-breaker-{}",
                    validate::PROBE_ID,
                    &lease_id()[..8]
                )];
                let plan = Plan {
                    ids: &ids,
                    namespace: None,
                    limits: &limits,
                    cost: 1,
                    lease: "",
                };
                let mut call = check.script.prepare_invoke();
                script::check_args(&mut call, &prefix, None, &plan);
                run_on(&link, timeout, |mut conn| async move {
                    call.invoke_async::<redis::Value>(&mut conn).await.map(drop)
                })
                .await
            })
        }
    }

    /// Runs one call on the current connection, under the store's timeout (waiting for a
    /// connection included). Never retried.
    async fn run<T, F, Fut>(&self, call: F) -> Result<T, StoreError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        run_on(&self.link, self.timeout, call).await
    }

    /// The (escaped) identifiers of a check grouped by hash slot, as indices into `ids`: one
    /// group on a single server, one per slot in a cluster.
    pub(crate) fn slot_groups(&self, ids: &[String]) -> Vec<Vec<usize>> {
        if !self.link.is_cluster() || ids.len() < 2 {
            return vec![(0..ids.len()).collect()];
        }
        let keys: Vec<String> = ids
            .iter()
            .map(|id| cluster::id_key(&self.prefix, id))
            .collect();
        cluster::by_slot(&keys, |k| k)
    }

    /// Groups store keys by hash slot (one group on a single server).
    fn key_groups<T>(&self, items: &[T], key: impl Fn(&T) -> &str) -> Vec<Vec<usize>> {
        if !self.link.is_cluster() {
            return vec![(0..items.len()).collect()];
        }
        cluster::by_slot(items, key)
    }

    /// Extends live leases: one script call per distinct lease time (usually one in all), and
    /// in a cluster per hash slot, of at most [`LEASES_PER_CALL`] slots each. Every call is
    /// made, whatever the others answer, up to [`CALLS_IN_FLIGHT`] at once: a master that is
    /// down or stalled holds back only the leases with keys on it, and only its calls wait
    /// for the timeout.
    ///
    /// A call of several slot sets whose hash slot is migrating, some of its keys moved and
    /// others not, is answered `TRYAGAIN` (by either node: Redis runs a command of several
    /// keys only where all of them are) for as long as the migration lasts, which may outlast
    /// the leases. Its slot sets are then renewed one a call, each where its key is (the
    /// source, or the target its `ASK` names).
    pub(crate) async fn renew(&self, leases: &[&Lease]) -> Reached<StoreError> {
        let mut reached = Reached::all(leases.len());
        let mut times: Vec<u64> = leases.iter().map(|l| l.lease_us).collect();
        times.sort_unstable();
        times.dedup();
        // (slot set key, lease index, key index in the lease) of each lease time
        let by_time: Vec<(u64, Vec<Pair<'_>>)> = times
            .into_iter()
            .map(|lease_us| {
                let pairs = leases
                    .iter()
                    .enumerate()
                    .filter(|(_, lease)| lease.lease_us == lease_us)
                    .flat_map(|(i, lease)| {
                        let keys = lease.keys.iter().enumerate();
                        keys.map(move |(k, key)| (key.as_str(), i, k))
                    })
                    .collect();
                (lease_us, pairs)
            })
            .collect();
        let mut calls: Vec<(usize, Vec<usize>)> = Vec::new();
        for (t, (_, pairs)) in by_time.iter().enumerate() {
            calls.extend(
                self.lease_calls(pairs, |p| p.0)
                    .into_iter()
                    .map(|chunk| (t, chunk)),
            );
        }
        // (a second round, of the slot sets of calls answered `TRYAGAIN`, one a call)
        while !calls.is_empty() {
            let mut answers = stream::iter(calls)
                .map(|(t, chunk)| self.renew_call(t, &by_time[t], leases, chunk))
                .buffer_unordered(CALLS_IN_FLIGHT);
            let mut alone = Vec::new();
            while let Some((t, chunk, result)) = answers.next().await {
                let pairs = &by_time[t].1;
                match result {
                    // one flag per key, in the call's order: 0 when the set held the lease no
                    // longer
                    Ok(Renewed::Flags(renewed)) if renewed.len() == chunk.len() => {
                        for (&g, _) in chunk.iter().zip(renewed).filter(|(_, r)| *r == 0) {
                            let (_, i, k) = pairs[g];
                            reached.lost(i, k);
                        }
                    }
                    // a reply of another shape than the script gives: nothing can be told of
                    // these leases, which are tried again (and the failure logged and counted)
                    Ok(Renewed::Flags(renewed)) => {
                        let what =
                            format!("{} renewal flags for {} slots", renewed.len(), chunk.len());
                        let e = StoreError::UnexpectedReply(what);
                        reached.missed(chunk.iter().map(|&g| pairs[g].1), e);
                    }
                    Ok(Renewed::TryAgain(_)) if chunk.len() > 1 => {
                        alone.extend(chunk.into_iter().map(|g| (t, vec![g])));
                    }
                    Ok(Renewed::TryAgain(e)) => {
                        let e = StoreError::Backend(Box::new(e));
                        reached.missed(chunk.iter().map(|&g| pairs[g].1), e);
                    }
                    Err(e) => reached.missed(chunk.iter().map(|&g| pairs[g].1), e),
                }
            }
            calls = alone;
        }
        reached
    }

    /// One renewal call: the leases of the pairs at `chunk` (indices into `pairs`, those of
    /// the `t`-th lease time), and the script's answer, with `t` and `chunk`.
    async fn renew_call(
        &self,
        t: usize,
        (lease_us, pairs): &(u64, Vec<Pair<'_>>),
        leases: &[&Lease],
        chunk: Vec<usize>,
    ) -> (usize, Vec<usize>, Result<Renewed, StoreError>) {
        let now = self.clock.manual_now();
        let slot_pairs = chunk
            .iter()
            .map(|&g| (pairs[g].0, leases[pairs[g].1].id.as_str()));
        let call = renew_call(&self.renew_script, now, *lease_us, slot_pairs);
        let result = self
            .run(|mut conn| async move {
                match call.invoke_async(&mut conn).await {
                    Ok(flags) => Ok(Renewed::Flags(flags)),
                    // a reply: the server is there (and nothing condemns the connection)
                    Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::TryAgain) => {
                        Ok(Renewed::TryAgain(e))
                    }
                    Err(e) => Err(e),
                }
            })
            .await;
        (t, chunk, result)
    }

    /// Releases leases: one pipelined `ZREM` per slot set, idempotent; in a cluster one
    /// pipeline per hash slot, of at most [`LEASES_PER_CALL`] each, every one sent whatever
    /// the others answer, up to [`CALLS_IN_FLIGHT`] at once.
    pub(crate) async fn release(&self, leases: &[Lease]) -> Reached<StoreError> {
        let mut reached = Reached::all(leases.len());
        let pairs: Vec<(&str, (usize, &Lease))> = lease_pairs(leases.iter()).collect();
        let calls = self.lease_calls(&pairs, |p| p.0).into_iter().map(|chunk| {
            let mut pipe = redis::pipe();
            for &g in &chunk {
                let (key, (_, lease)) = pairs[g];
                pipe.zrem(key, &lease.id).ignore();
            }
            async move {
                let result = self
                    .run(|mut conn| async move { pipe.query_async::<()>(&mut conn).await })
                    .await;
                (chunk, result)
            }
        });
        let mut answers = stream::iter(calls).buffer_unordered(CALLS_IN_FLIGHT);
        while let Some((chunk, result)) = answers.next().await {
            if let Err(e) = result {
                reached.missed(chunk.iter().map(|&g| pairs[g].1 .0), e);
            }
        }
        reached
    }

    /// The calls of a lease renewal or release: indices into `items`, grouped by hash slot
    /// (one group on a single server), cut into calls of at most [`LEASES_PER_CALL`].
    fn lease_calls<T>(&self, items: &[T], key: impl Fn(&T) -> &str) -> Vec<Vec<usize>> {
        self.key_groups(items, key)
            .iter()
            .flat_map(|group| group.chunks(LEASES_PER_CALL).map(<[usize]>::to_vec))
            .collect()
    }

    /// The leases of a lease call (`renew` or `release`) that reached the store; a failure
    /// is logged and counted (`observe`'s `lease_call_failed`).
    pub(crate) fn reached(&self, call: &'static str, reached: Reached<StoreError>) -> Vec<bool> {
        if let Some(e) = &reached.error {
            self.lease_log.lease_call_failed(&self.prefix, call, e);
        }
        reached.leases
    }

    /// A slot that could not be given back (`e`), logged and counted.
    pub(crate) fn give_back_failed(&self, e: &StoreError) {
        self.give_back_log.give_back_failed(&self.prefix, e);
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

/// Runs one call on `link`'s current connection within `timeout`, waiting for a connection
/// included, and tells the link how it went. Never retried.
async fn run_on<T, F, Fut>(link: &Link, timeout: Duration, call: F) -> Result<T, StoreError>
where
    F: FnOnce(Conn) -> Fut,
    Fut: Future<Output = RedisResult<T>>,
{
    let deadline = Instant::now() + timeout;
    let (conn, generation) = link.connection(deadline).await?;
    let mut waiting = Unanswered {
        link,
        generation,
        answered: false,
        counts_from: Instant::now() + (timeout / 2).min(UNANSWERED_AFTER),
    };
    let answer = tokio::time::timeout_at(deadline, call(conn)).await;
    waiting.answered = true;
    match answer {
        Err(_) => {
            link.timed_out(generation);
            Err(StoreError::Timeout(timeout))
        }
        Ok(Ok(value)) => {
            link.replied();
            Ok(value)
        }
        Ok(Err(e)) => Err(link.failed(generation, e)),
    }
}

/// A call sent on the connection of `generation` and not answered yet. Dropped so (its
/// caller gave up first: a deadline of its own shorter than the store's timeout, a client
/// that disconnected), it counts as a call without a reply, as a timeout does: otherwise a
/// Redis that stopped answering, whose callers all give up before the store's timeout,
/// would never have its connection condemned, and every request would wait out its own
/// deadline. A reply to any later call clears it. The breaker does not count it: a client
/// going away is no failure of the store (the connection's replacement, if it comes to
/// that, fails the calls after it, which the breaker counts).
///
/// Only a call that went unanswered for a while counts: [`UNANSWERED_AFTER`], or half the
/// timeout when that is shorter. One dropped sooner says nothing of Redis, which had no
/// time to answer, and a client that resets its requests as soon as it sends them (an
/// HTTP/2 `RST_STREAM` each) would otherwise have a quiet process's connection replaced,
/// and validated anew, every second.
struct Unanswered<'a> {
    link: &'a Link,
    generation: u64,
    answered: bool,
    /// When the call, unanswered, starts to count as a silence.
    counts_from: Instant,
}

/// How long a call dropped unanswered must have waited to count as a call without a reply
/// (at most half the timeout): far longer than Redis takes to answer, far shorter than the
/// deadlines that drop calls to a Redis gone silent.
const UNANSWERED_AFTER: Duration = Duration::from_millis(10);

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if !self.answered && Instant::now() >= self.counts_from {
            self.link.timed_out(self.generation);
        }
    }
}

/// A slot set of a lease renewed: its key, the lease's index in the call, and the key's index
/// in the lease.
type Pair<'a> = (&'a str, usize, usize);

/// Every (slot set key, (index of the lease, lease)) pair of `leases`.
fn lease_pairs<'a>(
    leases: impl Iterator<Item = &'a Lease>,
) -> impl Iterator<Item = (&'a str, (usize, &'a Lease))> {
    leases
        .enumerate()
        .flat_map(|(i, lease)| lease.keys.iter().map(move |key| (key.as_str(), (i, lease))))
}

/// The renew script's call for the leases of lease time `lease_us` among `leases`.
fn renew_invocation<'a>(
    renew: &'a Script,
    now: Option<u64>,
    lease_us: u64,
    leases: &[&Lease],
) -> ScriptInvocation<'a> {
    let pairs = lease_pairs(leases.iter().copied())
        .filter(|(_, (_, lease))| lease.lease_us == lease_us)
        .map(|(key, (_, lease))| (key, lease.id.as_str()));
    renew_call(renew, now, lease_us, pairs)
}

/// The renew script's call for (slot set key, lease id) pairs of one lease time.
fn renew_call<'a, 'b>(
    renew: &'a Script,
    now: Option<u64>,
    lease_us: u64,
    pairs: impl Iterator<Item = (&'b str, &'b str)>,
) -> ScriptInvocation<'a> {
    let mut call = renew.prepare_invoke();
    call.arg(lease_us).arg(script::now_arg(now));
    for (key, id) in pairs {
        call.key(key).arg(id);
    }
    call
}

/// The answer to a renewal call.
enum Renewed {
    /// One flag a slot set, in the call's order: 1 renewed, 0 the set held the lease no
    /// longer.
    Flags(Vec<i64>),
    /// `TRYAGAIN`: the call's hash slot is migrating, its keys on both nodes.
    TryAgain(redis::RedisError),
}

/// One `ZREM` per slot of `leases`, pipelined.
fn release_pipe(leases: &[Lease]) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    for (key, (_, lease)) in lease_pairs(leases.iter()) {
        pipe.zrem(key, &lease.id).ignore();
    }
    pipe
}

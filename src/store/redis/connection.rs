//! The connection's lifecycle: one current multiplexed connection, shared by every call, and
//! one background task that replaces it whenever it breaks.
//!
//! The `redis` crate's `ConnectionManager` reconnects only after I/O errors and gives up on
//! others (a failed authentication leaves it without a connection for good), and it cannot
//! follow Sentinel. So the store owns the lifecycle and builds on the crate's
//! `MultiplexedConnection`:
//!
//! * The current connection lives in a `watch` channel: `Up` (with its generation),
//!   `Connecting` (the first attempt, or the one after a working connection was lost) or
//!   `Down` (the last attempt failed, and why).
//! * A call that fails in a way that condemns the connection (an I/O error, a refused
//!   authentication, `READONLY` after a failover, `MASTERDOWN`; or no reply at all for a
//!   while) reports it; so does the connection itself when it closes (a RESP3 push the crate
//!   sends on disconnection). The first report for a generation turns it `Connecting` and
//!   wakes the task. Nothing is ever retried: the failed call returns its error.
//! * The task connects (behind Sentinel: asks the sentinels where the master is), runs the
//!   start-up checks (`validate`), and on success publishes the connection; on failure it
//!   publishes why and tries again after a backoff of at most [`MAX_BACKOFF`], so checks work
//!   again within about half a second of a healthy master answering.
//! * Callers never wait beyond their own timeout: while `Connecting` they wait for the
//!   attempt (a killed connection is replaced within a round trip, unnoticed), while `Down`
//!   they fail at once ([`StoreError::Unavailable`], or the misconfiguration found).
//! * A Redis Cluster's connection is the `redis` crate's cluster client (`cluster`), which
//!   repairs its node connections and follows the slot map by itself: a failed call never
//!   condemns it (a master lost makes only its slots fail, until a replica takes over). Only
//!   silence condemns it — calls timing out with no reply from any node — and the new one is
//!   found again from the URL's nodes and checked on every master.

use std::collections::hash_map::RandomState;
use std::error::Error as StdError;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use redis::{AsyncConnectionConfig, Client, ConnectionInfo, PushInfo, PushKind, RedisError};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::cluster::{self, Conn};
use super::sentinel::{Lookup, Sentinels, RECHECK};
use super::url::{tcp_info, ClusterTarget, Target};
use super::validate::{self, Failure, Role};
use super::StoreHealth;
use crate::observe::BoundedLog;
use crate::store::error::{Misconfiguration, MisconfigurationKind};
use crate::store::StoreError;

/// The longest wait between two connection attempts.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_millis(500);
/// The first wait after a failed attempt.
const MIN_BACKOFF: Duration = Duration::from_millis(25);
/// When calls have kept timing out without any reply for this long (or twice the call
/// timeout, if longer), the next one to time out condemns the connection: a peer that vanished
/// without closing it would otherwise hold every call until TCP gives up, minutes later.
const SILENCE: Duration = Duration::from_secs(1);
/// The fewest calls without a reply, in a row, that condemn a connection (however long
/// ago the first): two could be a lone timeout long ago (or a caller that gave up) and one
/// now, the store idle between them.
const MISSES: u32 = 3;
/// No time recorded.
const NONE: u64 = u64::MAX;

/// The calls without a reply on the current connection since the last reply: when they
/// have gone on long enough, and are enough of them, the connection is given up.
#[derive(Debug)]
struct Silence {
    /// When the first of them timed out, in ms since the link's epoch ([`NONE`]: none).
    first_ms: AtomicU64,
    /// How many.
    misses: AtomicU32,
}

impl Silence {
    fn new() -> Silence {
        Silence {
            first_ms: AtomicU64::new(NONE),
            misses: AtomicU32::new(0),
        }
    }

    /// A reply came, or a new connection is in use: nothing missed.
    fn clear(&self) {
        if self.first_ms.load(Ordering::Relaxed) != NONE {
            self.first_ms.store(NONE, Ordering::Relaxed);
        }
        if self.misses.load(Ordering::Relaxed) != 0 {
            self.misses.store(0, Ordering::Relaxed);
        }
    }

    /// A call got no reply at `now_ms`: whether the connection has been silent for `silence`,
    /// through at least [`MISSES`] calls.
    fn missed(&self, now_ms: u64, silence: Duration) -> bool {
        let first =
            match self
                .first_ms
                .compare_exchange(NONE, now_ms, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => now_ms,
                Err(first) => first,
            };
        let misses = self
            .misses
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        misses >= MISSES && u128::from(now_ms.saturating_sub(first)) >= silence.as_millis()
    }
}

/// The store's handle on its connection. Clones share it; the background task ends when the
/// last clone is gone.
#[derive(Clone)]
pub(crate) struct Link {
    shared: Arc<Shared>,
    task: Arc<Task>,
}

struct Shared {
    state: watch::Sender<State>,
    /// Wakes the task when its connection was reported broken.
    wake: Notify,
    next_generation: AtomicU64,
    /// The calls on the current connection that got no reply since the last that did.
    silence: Silence,
    epoch: Instant,
    /// How long a call may take: the longest a caller waits for a connection attempt.
    timeout: Duration,
    behind_sentinel: bool,
    /// Whether a connection of the link has served the store: a standalone server found a
    /// replica since was demoted by a failover, not named by mistake.
    served: AtomicBool,
    /// Whether the connection is a cluster's.
    cluster: bool,
    /// The key prefix, for the message of an ACL key pattern that misses it.
    prefix: Arc<str>,
    /// The passwords of the URL, scrubbed from any error text kept.
    secrets: Vec<String>,
}

#[derive(Clone)]
enum State {
    Connecting,
    Up { conn: Conn, generation: u64 },
    Down(Cause),
}

/// Why the last connection attempt failed.
#[derive(Clone)]
pub(crate) enum Cause {
    /// The server cannot serve the store as configured.
    Misconfigured(Misconfiguration),
    /// The server could not be reached or answered an error; the details, scrubbed.
    Failed(Arc<dyn StdError + Send + Sync>),
    /// An attempt took longer than the connect timeout.
    Timeout(Duration),
}

impl Cause {
    /// The error for the caller that waited for the attempt: the whole cause.
    pub(crate) fn into_error(self) -> StoreError {
        match self {
            Cause::Misconfigured(m) => StoreError::Misconfigured(m),
            Cause::Failed(e) => StoreError::Backend(Box::new(Kept(e))),
            Cause::Timeout(d) => StoreError::Timeout(d),
        }
    }

    /// The error for a caller that found the store down: answered at once.
    fn at_once(&self) -> StoreError {
        match self {
            Cause::Misconfigured(m) => StoreError::Misconfigured(m.clone()),
            Cause::Failed(_) | Cause::Timeout(_) => StoreError::Unavailable,
        }
    }

    fn label(&self) -> &'static str {
        match self {
            Cause::Misconfigured(_) => "down: misconfigured",
            Cause::Failed(_) => "down",
            Cause::Timeout(_) => "down: timed out",
        }
    }
}

/// A shared error shown as itself.
#[derive(Debug)]
struct Kept(Arc<dyn StdError + Send + Sync>);

impl fmt::Display for Kept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl StdError for Kept {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.0.source()
    }
}

/// The text of an error whose own text held a secret, with the secret replaced by `***`.
#[derive(Debug)]
struct Scrubbed(String);

impl fmt::Display for Scrubbed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl StdError for Scrubbed {}

/// A reason of the store's own, for the logs.
#[derive(Debug)]
struct Reason(&'static str);

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl StdError for Reason {}

/// The background task, stopped when the last handle goes.
struct Task {
    handle: Mutex<Option<JoinHandle<()>>>,
    /// What the task needs to start, until it has (a lazily built store outside a runtime
    /// starts it on first use).
    pending: Mutex<Option<Connector>>,
    /// Whether `pending` holds it, read without the lock on every call.
    has_pending: AtomicBool,
    /// Whether `pending` holds a connector made anew for a task that ended under its link
    /// (see [`Ended`]), whose start is logged (at most every 10 s).
    restarting: AtomicBool,
    restart_log: BoundedLog,
}

/// Held by the connection task, which runs for as long as its link: dropped otherwise (its
/// runtime shut down under a store that lives on, shared by several runtimes or kept past
/// one; or a panic), it leaves a connector made anew where a lazy link keeps the one it has
/// not started, so that the next call starts a task again on its own runtime. Without it,
/// nothing would connect again: a broken connection would wake no task, and every call
/// would wait out its timeout.
struct Ended {
    task: Weak<Task>,
    shared: Weak<Shared>,
    spare: Option<Connector>,
}

impl Drop for Ended {
    fn drop(&mut self) {
        // The link itself is gone (its task aborted with it): nothing to restart.
        let (Some(task), Some(shared)) = (self.task.upgrade(), self.shared.upgrade()) else {
            return;
        };
        // The connection went with the task's runtime (its driver ran there): wait for the
        // new one. (Logged when a call starts it: a store kept in a static sees its task end
        // at every shutdown, and needs no word of it then.)
        shared.state.send_replace(State::Connecting);
        *task.pending.lock().unwrap_or_else(PoisonError::into_inner) = self.spare.take();
        task.restarting.store(true, Ordering::Release);
        task.has_pending.store(true, Ordering::Release);
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        let handle = self
            .handle
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(h) = handle.take() {
            h.abort();
        }
    }
}

impl Shared {
    /// Keeps an error for the logs: as it is, unless its text holds a password.
    fn keep(&self, e: impl StdError + Send + Sync + 'static) -> Arc<dyn StdError + Send + Sync> {
        let text = e.to_string();
        let secrets = self.secrets.iter().filter(|s| text.contains(s.as_str()));
        let mut scrubbed = None::<String>;
        for s in secrets {
            scrubbed = Some(
                scrubbed
                    .unwrap_or_else(|| text.clone())
                    .replace(s.as_str(), "***"),
            );
        }
        match scrubbed {
            Some(text) => Arc::new(Scrubbed(text)),
            None => Arc::new(e),
        }
    }

    fn cause(&self, failure: Failure) -> Cause {
        match failure {
            Failure::Misconfigured(m) => Cause::Misconfigured(m),
            Failure::Transient(why) => Cause::Failed(Arc::new(Reason(why))),
            Failure::Reply(e) => Cause::Failed(Arc::new(e)),
            Failure::Refused(kind, e) => {
                let context = match kind {
                    MisconfigurationKind::CommandDenied => "cluster",
                    _ => "",
                };
                Cause::Misconfigured(
                    Misconfiguration::new(kind, context).with_source(Kept(self.keep(e))),
                )
            }
            Failure::Redis(e) => {
                let verdict = match self.cluster {
                    true => validate::classify_cluster(&e),
                    false => validate::classify(&e),
                };
                match verdict.misconfigured {
                    // Behind Sentinel, or once the server has served as the store's master, a
                    // replica is a failover under way, not a mistake.
                    Some(MisconfigurationKind::Replica) if self.replica_is_failover() => {
                        Cause::Failed(self.keep(e))
                    }
                    Some(kind) => {
                        let context = match kind {
                            MisconfigurationKind::KeyDenied => &*self.prefix,
                            MisconfigurationKind::CommandDenied if self.cluster => "cluster",
                            _ => "",
                        };
                        let m =
                            Misconfiguration::new(kind, context).with_source(Kept(self.keep(e)));
                        Cause::Misconfigured(m)
                    }
                    None => Cause::Failed(self.keep(e)),
                }
            }
        }
    }

    fn lookup_cause(&self, lookup: Lookup, service: &str) -> Cause {
        let kind = match lookup {
            Lookup::Failed(e) => return Cause::Failed(self.keep(e)),
            Lookup::Misconfigured(kind) => kind,
        };
        let context = match kind {
            MisconfigurationKind::UnknownService => service,
            MisconfigurationKind::Authentication => "sentinel",
            _ => "",
        };
        Cause::Misconfigured(Misconfiguration::new(kind, context))
    }

    /// Condemns the connection of `generation`, if it is still the current one.
    fn broken(&self, generation: u64) {
        let condemned = self.state.send_if_modified(|state| match state {
            State::Up { generation: g, .. } if *g == generation => {
                *state = State::Connecting;
                true
            }
            _ => false,
        });
        if condemned {
            self.wake.notify_one();
        }
    }

    /// Whether a replica where the master should be is a failover under way.
    fn replica_is_failover(&self) -> bool {
        self.behind_sentinel || self.served.load(Ordering::Relaxed)
    }

    /// The connection of `generation` is the one in use.
    fn up(&self, conn: Conn, generation: u64) {
        // (the misses of the connection it replaces are not this one's)
        self.silence.clear();
        self.served.store(true, Ordering::Relaxed);
        self.state.send_replace(State::Up { conn, generation });
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

impl Link {
    /// Connects now, checks the server, and starts the task that keeps the connection: the
    /// whole cause when the first attempt fails.
    pub(crate) async fn connect(mut connector: Connector) -> Result<Link, StoreError> {
        let link = Link::new(&connector, State::Connecting);
        let weak = Arc::downgrade(&link.shared);
        let first = connector
            .attempt(&link.shared, weak)
            .await
            .map_err(Cause::into_error)?;
        link.shared.up(first.conn, first.generation);
        link.start(connector);
        Ok(link)
    }

    /// A link without a connection yet: the task connects as soon as it runs (at once within
    /// a Tokio runtime, else on first use).
    pub(crate) fn lazy(connector: Connector) -> Link {
        let link = Link::new(&connector, State::Connecting);
        if tokio::runtime::Handle::try_current().is_ok() {
            link.start(connector);
        } else {
            *link
                .task
                .pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(connector);
            link.task.has_pending.store(true, Ordering::Release);
        }
        link
    }

    fn new(connector: &Connector, state: State) -> Link {
        let shared = Arc::new(Shared {
            state: watch::Sender::new(state),
            wake: Notify::new(),
            next_generation: AtomicU64::new(0),
            silence: Silence::new(),
            epoch: Instant::now(),
            timeout: connector.call_timeout,
            behind_sentinel: matches!(connector.source, Source::Sentinels(_)),
            served: AtomicBool::new(false),
            cluster: matches!(connector.source, Source::Cluster(_)),
            prefix: connector.prefix.clone(),
            secrets: connector.secrets.clone(),
        });
        Link {
            shared,
            task: Arc::new(Task {
                handle: Mutex::new(None),
                pending: Mutex::new(None),
                has_pending: AtomicBool::new(false),
                restarting: AtomicBool::new(false),
                restart_log: BoundedLog::default(),
            }),
        }
    }

    fn start(&self, connector: Connector) {
        let connected = match &*self.shared.state.borrow() {
            State::Up { generation, .. } => Some(*generation),
            _ => None,
        };
        let ended = Ended {
            task: Arc::downgrade(&self.task),
            shared: Arc::downgrade(&self.shared),
            spare: Some(connector.again()),
        };
        let shared = self.shared.clone();
        let handle = tokio::spawn(async move {
            let _ended = ended;
            run(shared, connector, connected).await;
        });
        *self
            .task
            .handle
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(handle);
    }

    /// The current connection and its generation. While a connection attempt is under way,
    /// waits for it until `deadline`; while the store is down, fails at once.
    pub(crate) async fn connection(&self, deadline: Instant) -> Result<(Conn, u64), StoreError> {
        self.start_pending();
        let mut rx = self.shared.state.subscribe();
        let waited = matches!(*rx.borrow_and_update(), State::Connecting);
        let settled =
            tokio::time::timeout_at(deadline, rx.wait_for(|s| !matches!(s, State::Connecting)))
                .await;
        let state = match settled {
            Err(_) => return Err(StoreError::Timeout(self.shared.timeout)),
            Ok(Err(_)) => return Err(StoreError::Unavailable),
            Ok(Ok(state)) => state.clone(),
        };
        match state {
            State::Up {
                conn: Conn::Cluster(c),
                generation,
            } => Ok((Conn::Cluster(c.fresh()), generation)),
            State::Up { conn, generation } => Ok((conn, generation)),
            State::Down(cause) if waited => Err(cause.into_error()),
            State::Down(cause) => Err(cause.at_once()),
            State::Connecting => Err(StoreError::Unavailable),
        }
    }

    /// A call got its reply.
    pub(crate) fn replied(&self) {
        self.shared.silence.clear();
    }

    /// A call on the connection of `generation` got no reply in time: the connection is
    /// condemned once calls have kept timing out, without any reply, for a while.
    pub(crate) fn timed_out(&self, generation: u64) {
        // (a call of a connection replaced since counts against none: the new one's misses
        // are its own)
        let current = matches!(
            &*self.shared.state.borrow(),
            State::Up { generation: g, .. } if *g == generation
        );
        if !current {
            return;
        }
        let silence = SILENCE.max(self.shared.timeout.saturating_mul(2));
        if self.shared.silence.missed(self.shared.now_ms(), silence) {
            self.broken(generation);
        }
    }

    fn broken(&self, generation: u64) {
        self.shared.broken(generation);
    }

    /// A call on the connection of `generation` failed with `err`: condemns the connection if
    /// the error says so, and turns the error into the store's.
    pub(crate) fn failed(&self, generation: u64, err: RedisError) -> StoreError {
        let verdict = match self.shared.cluster {
            true => validate::classify_cluster(&err),
            false => validate::classify(&err),
        };
        if verdict.reconnect {
            self.broken(generation);
        } else {
            // An error reply is a reply: the server is there.
            self.replied();
        }
        match self.shared.cause(Failure::Redis(err)) {
            Cause::Misconfigured(m) => StoreError::Misconfigured(m),
            Cause::Failed(e) => StoreError::Backend(Box::new(Kept(e))),
            Cause::Timeout(d) => StoreError::Timeout(d),
        }
    }

    /// Whether the connection is a Redis Cluster's: calls then go one slot at a time.
    pub(crate) fn is_cluster(&self) -> bool {
        self.shared.cluster
    }

    /// Starts the connection task if it waits to be started (a lazy store built outside a
    /// runtime, or one whose task ended with its runtime), within a runtime.
    fn start_pending(&self) {
        if !self.task.has_pending.load(Ordering::Acquire)
            || tokio::runtime::Handle::try_current().is_err()
        {
            return;
        }
        let pending = self
            .task
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(connector) = pending {
            self.task.has_pending.store(false, Ordering::Release);
            if self.task.restarting.swap(false, Ordering::AcqRel) {
                self.task
                    .restart_log
                    .connection_task_lost(&self.shared.prefix);
            }
            self.start(connector);
        }
    }

    /// The connection's part of [`RedisStore::health`](super::RedisStore::health); within a
    /// runtime, it starts the connection task that waits to be (a readiness probe would
    /// otherwise see `Connecting` until a check came).
    pub(crate) fn health(&self) -> StoreHealth {
        self.start_pending();
        match &*self.shared.state.borrow() {
            State::Connecting => StoreHealth::Connecting,
            State::Up { .. } => StoreHealth::Up,
            State::Down(Cause::Misconfigured(m)) => StoreHealth::Misconfigured(m.clone()),
            State::Down(_) => StoreHealth::Down,
        }
    }

    /// The state, in a word, for `Debug`.
    pub(crate) fn state_label(&self) -> &'static str {
        match &*self.shared.state.borrow() {
            State::Connecting => "connecting",
            State::Up { .. } => "up",
            State::Down(cause) => cause.label(),
        }
    }
}

/// A connection made, and the generation it was given.
struct Attempted {
    conn: Conn,
    generation: u64,
}

/// Makes connections: where to (asking the sentinels), with what timeouts, checked how.
pub(crate) struct Connector {
    /// What it was made from, to make it again.
    target: Target,
    source: Source,
    secrets: Vec<String>,
    prefix: Arc<str>,
    connect_timeout: Duration,
    call_timeout: Duration,
}

/// Where the server is.
enum Source {
    Fixed(ConnectionInfo),
    Sentinels(Box<Sentinels>),
    Cluster(ClusterTarget),
}

impl Connector {
    pub(crate) fn new(
        target: Target,
        prefix: Arc<str>,
        connect_timeout: Duration,
        call_timeout: Duration,
    ) -> Connector {
        let secrets = target.secrets();
        let source = match target.clone() {
            Target::Standalone(info) => Source::Fixed(info),
            Target::Sentinel(s) => Source::Sentinels(Box::new(Sentinels::new(s, connect_timeout))),
            Target::Cluster(c) => Source::Cluster(c),
        };
        Connector {
            target,
            source,
            secrets,
            prefix,
            connect_timeout,
            call_timeout,
        }
    }

    /// A connector as this one was made, for a task started anew.
    fn again(&self) -> Connector {
        Connector::new(
            self.target.clone(),
            self.prefix.clone(),
            self.connect_timeout,
            self.call_timeout,
        )
    }

    /// One attempt: resolve, connect, check. `notify` hears of the connection's end.
    async fn attempt(&mut self, shared: &Shared, notify: Weak<Shared>) -> Result<Attempted, Cause> {
        let generation = shared.next_generation.fetch_add(1, Ordering::Relaxed);
        let limit = self.connect_timeout;
        let info = match &mut self.source {
            Source::Cluster(target) => {
                return match cluster::attempt(target, &self.prefix, limit).await {
                    Ok(conn) => Ok(Attempted {
                        conn: Conn::Cluster(conn),
                        generation,
                    }),
                    Err(None) => Err(Cause::Timeout(limit)),
                    Err(Some(failure)) => Err(shared.cause(failure)),
                };
            }
            Source::Fixed(info) => info.clone(),
            Source::Sentinels(sentinels) => {
                let (host, port) = sentinels
                    .master()
                    .await
                    .map_err(|e| shared.lookup_cause(e, &sentinels.target().service))?;
                let target = sentinels.target();
                let info = tcp_info(&host, port, &target.master, target.tls)
                    .map_err(|e| shared.cause(e.into()))?;
                sentinels.current = Some((host, port));
                info
            }
        };
        let on_push = move |push: PushInfo| {
            if push.kind == PushKind::Disconnection {
                if let Some(shared) = notify.upgrade() {
                    shared.broken(generation);
                }
            }
            Ok::<(), std::convert::Infallible>(())
        };
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(limit))
            .set_response_timeout(None)
            .set_push_sender(on_push);
        let client = Client::open(info).map_err(|e| shared.cause(e.into()))?;
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| shared.cause(e.into()))?;
        let checks = async {
            let role = match (
                shared.behind_sentinel,
                shared.served.load(Ordering::Relaxed),
            ) {
                (true, _) => Role::BehindSentinel,
                (false, true) => Role::Demoted,
                (false, false) => Role::Standalone,
            };
            validate::check_server(&mut conn, role).await?;
            validate::probe(&mut conn, &self.prefix, &validate::probe_ids()).await
        };
        match tokio::time::timeout(limit, checks).await {
            Ok(Ok(())) => Ok(Attempted {
                conn: Conn::Single(conn),
                generation,
            }),
            Ok(Err(failure)) => Err(shared.cause(failure)),
            Err(_) => Err(Cause::Timeout(limit)),
        }
    }

    /// Waits until the connection in use is condemned; behind Sentinel, condemns it when the
    /// sentinels name another master.
    async fn watch(&mut self, shared: &Shared, generation: u64) {
        let Source::Sentinels(sentinels) = &mut self.source else {
            return shared.wake.notified().await;
        };
        loop {
            tokio::select! {
                () = shared.wake.notified() => return,
                () = tokio::time::sleep(RECHECK) => {
                    if sentinels.moved().await {
                        shared.broken(generation);
                    }
                }
            }
        }
    }
}

/// The task: keeps a connection, replacing it when it is reported broken; retries failed
/// attempts with a growing, jittered backoff up to [`MAX_BACKOFF`].
async fn run(shared: Arc<Shared>, mut connector: Connector, mut connected: Option<u64>) {
    // Why attempts fail, at most a line every 10 s: checks meanwhile learn only that the
    // store is down (`Unavailable`), and the cause may change during an outage (refused,
    // then out of memory once it answers, say).
    let failed = BoundedLog::default();
    let mut backoff = MIN_BACKOFF;
    loop {
        if let Some(generation) = connected.take() {
            connector.watch(&shared, generation).await;
            backoff = MIN_BACKOFF;
        }
        match connector.attempt(&shared, Arc::downgrade(&shared)).await {
            Ok(Attempted { conn, generation }) => {
                shared.up(conn, generation);
                connected = Some(generation);
            }
            Err(cause) => {
                failed.connect_failed(&shared.prefix, &cause.clone().into_error());
                shared.state.send_replace(State::Down(cause));
                tokio::time::sleep(jittered(backoff)).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// Between half of `d` and all of it, so that a fleet does not reconnect in step.
pub(super) fn jittered(d: Duration) -> Duration {
    let r = RandomState::new().hash_one(std::time::Instant::now());
    let half = d / 2;
    half + Duration::from_nanos(r % (u64::try_from(half.as_nanos()).unwrap_or(1).max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection is given up after a second of calls without a reply, three of them at
    /// least: not for a lone timeout long ago and one now, with the store idle between (nor
    /// for the misses of the connection it replaced).
    #[test]
    fn silence_is_calls_without_a_reply_for_a_while() {
        let second = Duration::from_secs(1);
        // calls timing out one after another: given up once they span the second
        let silence = Silence::new();
        let condemned = (0..=40).find(|i| silence.missed(i * 50, second));
        assert_eq!(condemned, Some(20));
        // a lone miss, a reply, then misses again: counted from the new first
        let silence = Silence::new();
        assert!(!silence.missed(0, second));
        silence.clear();
        assert!(!silence.missed(5_000, second));
        assert!(!silence.missed(5_500, second));
        assert!(silence.missed(6_000, second));
        // a lone miss long ago and one now: not silence (the store was idle between)
        let silence = Silence::new();
        assert!(!silence.missed(0, second));
        assert!(!silence.missed(300_000, second));
        // sparse calls all unanswered: the third gives it up
        assert!(silence.missed(302_000, second));
        // a new connection starts with nothing missed
        silence.clear();
        assert!(!silence.missed(400_000, second));
    }

    #[test]
    fn backoff_is_jittered_within_bounds() {
        for _ in 0..100 {
            let d = jittered(MAX_BACKOFF);
            assert!(d >= MAX_BACKOFF / 2 && d <= MAX_BACKOFF, "{d:?}");
        }
    }
}

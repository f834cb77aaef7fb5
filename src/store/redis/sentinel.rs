//! Finding the master of a service through its sentinels.
//!
//! The sentinels are asked in turn (`SENTINEL GET-MASTER-ADDR-BY-NAME`), starting with the one
//! that answered last, over a connection kept to it. The `redis` crate's `Sentinel` asks
//! `SENTINEL MASTERS` without timeouts and cannot tell a service no sentinel knows from
//! sentinels that are down; the store needs both.
//!
//! While connected, the store asks again every [`RECHECK`]: a failover whose old master is
//! still up and writable (a `SENTINEL FAILOVER`, a partition) would otherwise go unnoticed
//! until the old master is turned into a replica, which the sentinels do only when they next
//! poll it (every 10 s).
//!
//! A lookup stops at the first sentinel that answers, so a sentinel lost while another
//! answers would never be asked again, and its loss (a quorum one failure from gone) would
//! pass unseen. The sentinels that failed before another answered are logged; and every
//! [`SWEEP`], the sentinels the lookup did not ask are asked too, in a task of their own
//! (the recheck does not wait for them), each over a connection of its own, and those that
//! fail or do not know the service are logged, all of them in one line. (One that names
//! another master is not: sentinels disagree for a moment during every failover.)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use redis::aio::MultiplexedConnection;
use redis::RedisError;

use super::url::{node_connection, SentinelTarget};
use super::validate;
use crate::observe::BoundedLog;
use crate::store::error::MisconfigurationKind;

/// How often a connected store asks whether the master moved.
pub(crate) const RECHECK: Duration = Duration::from_secs(1);

/// How often a connected store asks every sentinel, not only the first that answers.
const SWEEP: Duration = Duration::from_secs(30);

/// Why no master was found.
#[derive(Debug)]
pub(crate) enum Lookup {
    /// Every sentinel answered, and the answers show a mistake: a service none knows, no
    /// sentinel at all, or refused credentials everywhere.
    Misconfigured(MisconfigurationKind),
    /// Some sentinel failed; its error.
    Failed(RedisError),
}

/// The sentinels of one service.
pub(crate) struct Sentinels {
    target: SentinelTarget,
    timeout: Duration,
    /// The sentinel that answered last, asked first next time.
    preferred: usize,
    /// A connection to the sentinel of that index that answered well.
    conn: Option<(usize, MultiplexedConnection)>,
    /// The master of the connection in use.
    pub(crate) current: Option<(String, u16)>,
    /// Rechecks that found no master, logged at most every 10 s.
    recheck_log: BoundedLog,
    /// Sentinels that failed while another answered, logged at most every 10 s.
    sentinel_log: Arc<BoundedLog>,
    /// When the sentinels the lookups skip were last asked (none yet: at the first recheck).
    swept: Option<Instant>,
    /// A sweep is under way, in its task.
    sweeping: Arc<AtomicBool>,
    /// The sentinels the last lookup asked: the first, and how many from it on.
    asked: (usize, usize),
}

impl Sentinels {
    pub(crate) fn new(target: SentinelTarget, timeout: Duration) -> Sentinels {
        Sentinels {
            target,
            timeout,
            preferred: 0,
            conn: None,
            current: None,
            recheck_log: BoundedLog::default(),
            sentinel_log: Arc::default(),
            swept: None,
            sweeping: Arc::default(),
            asked: (0, 0),
        }
    }

    pub(crate) fn target(&self) -> &SentinelTarget {
        &self.target
    }

    /// The master's address, from the first sentinel that knows it. Sentinels that failed
    /// before it are logged.
    pub(crate) async fn master(&mut self) -> Result<(String, u16), Lookup> {
        let n = self.target.sentinels.len();
        let (mut unknown, mut not_sentinel, mut refused) = (0, 0, 0);
        let mut last = None;
        // the sentinels that failed or did not know the service, and why
        let mut failed: Vec<(usize, String)> = Vec::new();
        let first = self.preferred;
        for i in 0..n {
            let index = (first + i) % n;
            match tokio::time::timeout(self.timeout, self.ask(index)).await {
                Ok(Ok(Some(master))) => {
                    self.preferred = index;
                    self.asked = (first, i + 1);
                    failed_while_answered(&self.sentinel_log, &self.target, &failed);
                    return Ok(master);
                }
                Ok(Ok(None)) => {
                    unknown += 1;
                    failed.push((index, UNKNOWN_SERVICE.into()));
                }
                Ok(Err(e)) => {
                    match validate::classify(&e).misconfigured {
                        Some(MisconfigurationKind::Authentication) => refused += 1,
                        Some(MisconfigurationKind::CommandDenied) => not_sentinel += 1,
                        _ => {}
                    }
                    failed.push((index, validate::error_label(&e)));
                    last = Some(e);
                }
                Err(elapsed) => {
                    failed.push((index, "timed out".into()));
                    last = Some(std::io::Error::from(elapsed).into());
                }
            }
        }
        let kind = if unknown == n {
            MisconfigurationKind::UnknownService
        } else if not_sentinel == n {
            MisconfigurationKind::NotSentinel
        } else if refused == n {
            MisconfigurationKind::Authentication
        } else {
            let e = last.unwrap_or_else(|| RedisError::from(std::io::Error::other("no sentinel")));
            return Err(Lookup::Failed(e));
        };
        Err(Lookup::Misconfigured(kind))
    }

    /// Whether the sentinels now name another master than the one in use (a failed lookup
    /// says nothing: the connection in use stays, and the failure is logged, as a failover
    /// goes unseen meanwhile).
    pub(crate) async fn moved(&mut self) -> bool {
        match self.master().await {
            Ok(master) => {
                let moved = self.current.as_ref() != Some(&master);
                if !moved && self.swept.is_none_or(|at| at.elapsed() >= SWEEP) {
                    self.swept = Some(Instant::now());
                    self.sweep();
                }
                moved
            }
            Err(lookup) => {
                // the kind of failure, not its text (which could quote a password)
                let why = match &lookup {
                    Lookup::Misconfigured(kind) => format!("{kind:?}"),
                    Lookup::Failed(e) => validate::error_label(e),
                };
                self.recheck_log
                    .sentinel_recheck_failed(&self.target.service, &why);
                false
            }
        }
    }

    /// Asks the sentinels the last lookup did not, in a task of its own (none while another
    /// sweep is under way, or outside a runtime), each over a connection of its own (the one
    /// kept stays with the sentinel that answers), all at once, and logs those that fail or do
    /// not know the service.
    fn sweep(&self) {
        let n = self.target.sentinels.len();
        let (first, count) = self.asked;
        let others: Vec<usize> = (count..n).map(|k| (first + k) % n).collect();
        if others.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.sweeping.swap(true, Ordering::AcqRel) {
            return;
        }
        let sweeping = Sweeping(self.sweeping.clone());
        let (target, timeout, log) = (self.target.clone(), self.timeout, self.sentinel_log.clone());
        runtime.spawn(async move {
            let _sweeping = sweeping;
            let answers = join_all(others.into_iter().map(|index| {
                let target = &target;
                async move {
                    let asked = async {
                        let mut conn = connect(target, index, timeout).await?;
                        query(target, &mut conn).await
                    };
                    (index, tokio::time::timeout(timeout, asked).await)
                }
            }))
            .await;
            let failed: Vec<(usize, String)> = answers
                .into_iter()
                .filter_map(|(index, answer)| {
                    let why = match answer {
                        Ok(Ok(Some(_))) => return None,
                        Ok(Ok(None)) => UNKNOWN_SERVICE.to_string(),
                        Ok(Err(e)) => validate::error_label(&e),
                        Err(_) => "timed out".to_string(),
                    };
                    Some((index, why))
                })
                .collect();
            failed_while_answered(&log, &target, &failed);
        });
    }

    /// One sentinel's answer: the master's address, or `None` when it knows no such service.
    async fn ask(&mut self, index: usize) -> redis::RedisResult<Option<(String, u16)>> {
        let mut conn = match self.conn.take() {
            Some((i, conn)) if i == index => conn,
            _ => connect(&self.target, index, self.timeout).await?,
        };
        let reply = query(&self.target, &mut conn).await?;
        // Kept only after a good answer, for the next question to the same sentinel.
        self.conn = Some((index, conn));
        Ok(reply)
    }
}

/// A connection of its own to the sentinel of `index` among `target`'s.
async fn connect(
    target: &SentinelTarget,
    index: usize,
    timeout: Duration,
) -> redis::RedisResult<MultiplexedConnection> {
    let (host, port) = &target.sentinels[index];
    node_connection(host, *port, (&target.auth, target.tls), timeout).await
}

/// The master of `target`'s service the sentinel at the end of `conn` names, or `None` when
/// it knows no such service.
async fn query(
    target: &SentinelTarget,
    conn: &mut MultiplexedConnection,
) -> redis::RedisResult<Option<(String, u16)>> {
    let reply: Option<(String, String)> = redis::cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(&target.service)
        .query_async(conn)
        .await?;
    Ok(reply.and_then(|(host, port)| Some((host, port.parse().ok()?))))
}

/// Logs, in one line, the sentinels of `target` that `failed` (their index, and why) while
/// another answered.
fn failed_while_answered(log: &BoundedLog, target: &SentinelTarget, failed: &[(usize, String)]) {
    if failed.is_empty() {
        return;
    }
    let sentinels = failed
        .iter()
        .map(|(index, why)| {
            let (host, port) = &target.sentinels[*index];
            format!("{host}:{port} ({why})")
        })
        .collect::<Vec<_>>()
        .join(", ");
    log.sentinels_failed(&target.service, &sentinels, failed.len() as u64);
}

/// Marks the sweep done however its task ends.
struct Sweeping(Arc<AtomicBool>);

impl Drop for Sweeping {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Why a sentinel that answers is of no use: it does not know the service.
const UNKNOWN_SERVICE: &str = "does not know the service";

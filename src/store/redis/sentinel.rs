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

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::RedisError;

use super::url::{node_connection, SentinelTarget};
use super::validate;
use crate::observe::BoundedLog;
use crate::store::error::MisconfigurationKind;

/// How often a connected store asks whether the master moved.
pub(crate) const RECHECK: Duration = Duration::from_secs(1);

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
        }
    }

    pub(crate) fn target(&self) -> &SentinelTarget {
        &self.target
    }

    /// The master's address, from the first sentinel that knows it.
    pub(crate) async fn master(&mut self) -> Result<(String, u16), Lookup> {
        let n = self.target.sentinels.len();
        let (mut unknown, mut not_sentinel, mut refused) = (0, 0, 0);
        let mut last = None;
        let first = self.preferred;
        for i in 0..n {
            let index = (first + i) % n;
            match tokio::time::timeout(self.timeout, self.ask(index)).await {
                Ok(Ok(Some(master))) => {
                    self.preferred = index;
                    return Ok(master);
                }
                Ok(Ok(None)) => unknown += 1,
                Ok(Err(e)) => {
                    match validate::classify(&e).misconfigured {
                        Some(MisconfigurationKind::Authentication) => refused += 1,
                        Some(MisconfigurationKind::CommandDenied) => not_sentinel += 1,
                        _ => {}
                    }
                    last = Some(e);
                }
                Err(elapsed) => last = Some(std::io::Error::from(elapsed).into()),
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
            Ok(master) => self.current.as_ref() != Some(&master),
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

    /// One sentinel's answer: the master's address, or `None` when it knows no such service.
    async fn ask(&mut self, index: usize) -> redis::RedisResult<Option<(String, u16)>> {
        let mut conn = match self.conn.take() {
            Some((i, conn)) if i == index => conn,
            _ => {
                let (host, port) = &self.target.sentinels[index];
                node_connection(
                    host,
                    *port,
                    (&self.target.auth, self.target.tls),
                    self.timeout,
                )
                .await?
            }
        };
        let reply: Option<(String, String)> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&self.target.service)
            .query_async(&mut conn)
            .await?;
        // Kept only after a good answer, for the next question to the same sentinel.
        self.conn = Some((index, conn));
        Ok(reply.and_then(|(host, port)| Some((host, port.parse().ok()?))))
    }
}

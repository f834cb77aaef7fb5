//! Test support: real `redis-server` processes on free loopback ports.
#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tollgate::{Clock, ManualClock, RedisStore};

/// A `redis-server` of the test's own, stopped (and its data dropped) on drop.
pub struct RedisServer {
    child: Child,
    pub port: u16,
}

impl RedisServer {
    /// Starts a server on a free loopback port. Panics (failing the test, never skipping it)
    /// when `redis-server` is not installed: `scripts/test.sh` installs it.
    pub fn start() -> RedisServer {
        for _ in 0..5 {
            if let Some(server) = RedisServer::try_start(free_port()) {
                return server;
            }
        }
        panic!("could not start redis-server");
    }

    /// Starts a server on `port` (after a restart, say), retrying while the port is busy.
    pub fn start_on(port: u16) -> RedisServer {
        for _ in 0..50 {
            if let Some(server) = RedisServer::try_start(port) {
                return server;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("could not start redis-server on port {port}");
    }

    fn try_start(port: u16) -> Option<RedisServer> {
        {
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                .args(["--loglevel", "warning"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server is required for the tests: run scripts/test.sh, which installs it");
            let mut server = RedisServer { child, port };
            if server.wait_ready() {
                return Some(server);
            }
            None
        }
    }

    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false; // exited: port taken meanwhile
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                if let Ok(mut c) = redis::Client::open(self.url()).and_then(|c| c.get_connection())
                {
                    if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                        return true;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A plain synchronous connection, to look at what the scripts wrote.
    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .unwrap()
    }

    /// A store on this server with a fresh prefix and the given clock.
    pub async fn store(&self, clock: Clock) -> RedisStore {
        RedisStore::builder(self.url())
            .prefix(unique_prefix())
            .clock(clock)
            .timeout(Duration::from_secs(5))
            .build()
            .await
            .unwrap()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn unique_prefix() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!("t{}", N.fetch_add(1, Ordering::Relaxed))
}

/// A manual clock at a round, realistic time: 2026-01-01T00:00:00Z (aligned to days).
pub fn manual_clock() -> ManualClock {
    ManualClock::new(1_767_225_600_000_000)
}

/// The keys of the concurrency slot sets under `prefix` (for identifiers without `:c`).
pub fn slot_keys(conn: &mut redis::Connection, prefix: &str) -> Vec<String> {
    redis::cmd("KEYS")
        .arg(format!("{prefix}:*:c*"))
        .query(conn)
        .unwrap()
}

/// The entries of the slot sets `keys` (live and expired alike, until a check removes them).
pub fn slot_entries(conn: &mut redis::Connection, keys: &[String]) -> usize {
    if keys.is_empty() {
        return 0;
    }
    let mut pipe = redis::pipe();
    for k in keys {
        pipe.zcard(k);
    }
    let cards: Vec<usize> = pipe.query(conn).unwrap();
    cards.iter().sum()
}

/// Keeps a Redis store's keys from expiring in real time while a test runs it on a manual
/// clock, and tells when one expired before it could be kept.
///
/// The scripts set each key's TTL from the manual clock, but Redis counts it down in real time:
/// where the manual clock moves slower than real time, a key would vanish while its state is
/// still alive on the manual clock, and the store would start that key afresh. After every
/// check, [`KeyWatch::settle`] removes the TTL of every key under the store's prefix (a key
/// kept past its state's lifetime decides like a missing one, so this changes no decision; the
/// comparisons hold the stores to that) and counts them: every identifier admitted so far must
/// have one key per rate limit. A key missing expired between its script and `settle` ([`KeyWatch::lost`]): from
/// then on, the store may differ from a store on the same clock, and such a run proves
/// nothing. Concurrency slot sets are not counted (giving back the last slot deletes one).
/// The keys are deleted when the watch is dropped.
pub struct KeyWatch {
    conn: redis::Connection,
    prefix: String,
    rate_limits: usize,
    admitted: std::collections::HashSet<String>,
    lost: bool,
}

impl KeyWatch {
    pub fn new(server: &RedisServer, prefix: &str, policy: &tollgate::Policy) -> KeyWatch {
        KeyWatch {
            conn: server.conn(),
            prefix: prefix.to_string(),
            rate_limits: policy
                .limits()
                .iter()
                .filter(|l| !l.is_concurrency())
                .count(),
            admitted: Default::default(),
            lost: false,
        }
    }

    /// Right after a check of `ids` on the store: keeps every key, and notes whether one that
    /// should be there is not. Panics on a key that should not be there.
    pub fn settle(&mut self, ids: &[&str], allowed: bool) {
        if allowed {
            self.admitted.extend(ids.iter().map(|id| id.to_string()));
        }
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}:*", self.prefix))
            .query(&mut self.conn)
            .unwrap();
        // (a key listed may expire before its PERSIST: count those still there after it)
        let mut pipe = redis::pipe();
        for k in &keys {
            pipe.persist(k).ignore().exists(k);
        }
        let there: Vec<bool> = if keys.is_empty() {
            Vec::new()
        } else {
            pipe.query(&mut self.conn).unwrap()
        };
        let rate_keys = keys
            .iter()
            .zip(&there)
            .filter(|(k, &there)| there && !k.rsplit(':').next().unwrap().starts_with('c'))
            .count();
        let expected = self.admitted.len() * self.rate_limits;
        assert!(
            rate_keys <= expected,
            "{rate_keys} keys, {expected} expected: {keys:?}"
        );
        self.lost |= rate_keys < expected;
    }

    /// Whether a key expired in real time since the watch began.
    pub fn lost(&self) -> bool {
        self.lost
    }
}

impl Drop for KeyWatch {
    fn drop(&mut self) {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}:*", self.prefix))
            .query(&mut self.conn)
            .unwrap_or_default();
        if !keys.is_empty() {
            let _: redis::RedisResult<()> = redis::cmd("UNLINK").arg(&keys).query(&mut self.conn);
        }
    }
}

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

//! Test support: a `redis-server` of the test's own, and a `metrics` recorder.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::clock::{Clock, ManualClock};
use crate::store::RedisStore;

/// A `redis-server` of the test's own on a free loopback port, stopped on drop. Panics
/// (failing the test, never skipping it) when `redis-server` is not installed.
pub(super) struct Server {
    child: Child,
    port: u16,
}

impl Server {
    pub(super) fn start() -> Server {
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .expect("a free port");
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no", "--loglevel", "warning"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server is required for the tests: scripts/test.sh installs it");
            let mut server = Server { child, port };
            if server.wait_ready() {
                return server;
            }
        }
        panic!("could not start redis-server");
    }

    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false; // its port was taken meanwhile
            }
            if let Ok(mut c) = redis::Client::open(self.url()).and_then(|c| c.get_connection()) {
                // the server answering is this one, not another test's that took the port
                // first (this one then exits: tried again on another port)
                if let Ok(info) = redis::cmd("INFO").arg("server").query::<String>(&mut c) {
                    let pid = info
                        .lines()
                        .find_map(|l| l.strip_prefix("process_id:"))
                        .and_then(|p| p.trim().parse::<u32>().ok());
                    return pid == Some(self.child.id());
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub(super) fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .unwrap()
    }

    /// A store with a prefix of its own and the caller's clock.
    pub(super) async fn store(&self, clock: &ManualClock) -> RedisStore {
        static N: AtomicU64 = AtomicU64::new(0);
        let prefix = format!("split{}", N.fetch_add(1, Ordering::Relaxed));
        RedisStore::builder(self.url())
            .prefix(prefix)
            .clock(Clock::Manual(clock.clone()))
            .timeout(Duration::from_secs(5))
            .build()
            .await
            .unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `metrics` recorder keeping counters' totals by name and labels (gauges and histograms
/// are dropped).
#[cfg(feature = "metrics")]
#[derive(Default)]
pub(super) struct Counted(pub(super) std::sync::Arc<std::sync::Mutex<Vec<(metrics::Key, u64)>>>);

#[cfg(feature = "metrics")]
struct CountedHandle(
    metrics::Key,
    std::sync::Arc<std::sync::Mutex<Vec<(metrics::Key, u64)>>>,
);

#[cfg(feature = "metrics")]
impl metrics::CounterFn for CountedHandle {
    fn increment(&self, value: u64) {
        self.1.lock().unwrap().push((self.0.clone(), value));
    }
    fn absolute(&self, _: u64) {}
}

#[cfg(feature = "metrics")]
impl metrics::Recorder for Counted {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::from_arc(std::sync::Arc::new(CountedHandle(
            key.clone(),
            self.0.clone(),
        )))
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

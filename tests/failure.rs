//! Failure policies and the circuit breaker against real `redis-server` processes that the
//! tests kill, restart and stall, with a recording `metrics` recorder and a capturing
//! `tracing` subscriber to check that every failure is visible.
//!
//! Latency bounds here are correctness bounds with wide margins (a request must not pay the
//! store's timeout once the breaker is open), not performance figures.

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use common::RedisServer;
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate::{Error, Limiter, OnStoreError, Origin, RedisStore, StoreError};

/// A `metrics` recorder that keeps every counter's total, every gauge's value and every
/// histogram's sample count, by name and labels.
#[derive(Clone, Default)]
struct Recorded(Arc<Mutex<HashMap<Key, f64>>>);

struct Handle {
    key: Key,
    values: Recorded,
}

impl Handle {
    fn update(&self, f: impl FnOnce(&mut f64)) {
        f(self
            .values
            .0
            .lock()
            .unwrap()
            .entry(self.key.clone())
            .or_insert(0.0));
    }
}

impl CounterFn for Handle {
    fn increment(&self, value: u64) {
        self.update(|v| *v += value as f64);
    }
    fn absolute(&self, value: u64) {
        self.update(|v| *v = value as f64);
    }
}

impl GaugeFn for Handle {
    fn increment(&self, value: f64) {
        self.update(|v| *v += value);
    }
    fn decrement(&self, value: f64) {
        self.update(|v| *v -= value);
    }
    fn set(&self, value: f64) {
        self.update(|v| *v = value);
    }
}

impl HistogramFn for Handle {
    fn record(&self, _: f64) {
        self.update(|v| *v += 1.0);
    }
}

impl Recorded {
    fn handle(&self, key: &Key) -> Arc<Handle> {
        Arc::new(Handle {
            key: key.clone(),
            values: self.clone(),
        })
    }
}

impl Recorder for Recorded {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.handle(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.handle(key))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.handle(key))
    }
}

/// The process's recorder and log, installed once for the whole test binary. Each test uses
/// its own limiter names and store prefixes, so its figures are its own.
struct Observed {
    metrics: Recorded,
    log: Arc<Mutex<Vec<u8>>>,
}

#[derive(Clone)]
struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn observed() -> &'static Observed {
    static OBSERVED: OnceLock<Observed> = OnceLock::new();
    OBSERVED.get_or_init(|| {
        let metrics = Recorded::default();
        metrics::set_global_recorder(metrics.clone()).unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let writer = LogWriter(log.clone());
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
        Observed { metrics, log }
    })
}

/// The value of the metric `name` summed over the label sets that include every
/// `(key, value)` of `labels`.
fn metric(name: &str, labels: &[(&str, &str)]) -> f64 {
    observed()
        .metrics
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|(key, _)| {
            key.name() == name
                && labels
                    .iter()
                    .all(|(k, v)| key.labels().any(|l| l.key() == *k && l.value() == *v))
        })
        .map(|(_, value)| value)
        .sum()
}

/// How many log lines contain `text` and `store=PREFIX`.
fn logged(text: &str, store: &str) -> usize {
    let log = observed().log.lock().unwrap();
    let tag = format!("store=\"{store}\"");
    String::from_utf8_lossy(&log)
        .lines()
        .filter(|l| l.contains(text) && (l.contains(&tag) || l.contains(&format!("store={store}"))))
        .count()
}

async fn store_at(url: &str, prefix: &str, timeout_ms: u64) -> RedisStore {
    RedisStore::builder(url)
        .prefix(prefix)
        .timeout(Duration::from_millis(timeout_ms))
        .build_lazy()
        .unwrap()
}

fn limiter(store: &RedisStore, policy: &str, name: &str, on_error: OnStoreError) -> Limiter {
    Limiter::builder(store.clone(), policy.parse().unwrap())
        .name(name)
        .on_store_error(on_error)
        .build()
}

/// Each policy answers a check the store cannot decide as documented, and counts it.
#[tokio::test]
async fn policies_answer_when_redis_is_down() {
    observed();
    let dead = format!("redis://127.0.0.1:{}/", common::free_port());
    let store = store_at(&dead, "down", 100).await;

    let open = limiter(&store, "2/min", "down-open", OnStoreError::Open);
    let d = open.check(&["a"]).await.unwrap();
    assert!(d.is_allowed());
    assert_eq!(d.origin(), Origin::FailOpen);
    assert!(d.statuses().is_empty());

    let closed = limiter(&store, "2/min", "down-closed", OnStoreError::Closed);
    match closed.check(&["a"]).await {
        Err(Error::Store(_)) => {}
        other => panic!("closed must fail: {other:?}"),
    }

    // Half of 4/min, 6/h in this process: 2 per minute, then denied by the fallback.
    let fallback = limiter(
        &store,
        "4/min, 6/h",
        "down-fallback",
        OnStoreError::fallback(0.5).unwrap(),
    );
    let mut allowed = 0;
    for _ in 0..5 {
        let d = fallback.check(&["a"]).await.unwrap();
        assert_eq!(d.origin(), Origin::Fallback);
        allowed += usize::from(d.is_allowed());
    }
    assert_eq!(allowed, 2);
    assert!(OnStoreError::fallback(0.0).is_none());
    assert!(OnStoreError::fallback(1.5).is_none());

    for (name, action, n) in [
        ("down-open", "open", 1.0),
        ("down-closed", "closed", 1.0),
        ("down-fallback", "fallback", 5.0),
    ] {
        assert_eq!(
            metric(
                "tollgate_failure_policy_total",
                &[("limiter", name), ("action", action)]
            ),
            n,
            "{name}"
        );
    }
    assert_eq!(
        metric(
            "tollgate_decisions_total",
            &[("limiter", "down-fallback"), ("outcome", "denied")]
        ),
        3.0
    );
}

/// Redis killed under load and restarted on the same port: no panic, no hung request; every
/// check answered within the timeout plus a margin until the breaker opens, then in a few
/// milliseconds; checks go through Redis again soon after the restart; one warning each way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_under_load() {
    observed();
    let server = RedisServer::start();
    let port = server.port;
    let timeout = Duration::from_millis(150);
    let store = RedisStore::builder(server.url())
        .prefix("outage")
        .timeout(timeout)
        .build()
        .await
        .unwrap();
    let limiter = limiter(&store, "1000/s", "outage", OnStoreError::Open);

    // (when the check started, how long it took, who decided)
    let samples: Arc<Mutex<Vec<(Instant, Duration, Origin)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for t in 0..16 {
        let (limiter, samples, stop) = (limiter.clone(), samples.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                let d = limiter.check(&[format!("k{t}-{}", i % 50)]).await.unwrap();
                samples
                    .lock()
                    .unwrap()
                    .push((started, started.elapsed(), d.origin()));
                i += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let killed = Instant::now();
    drop(server);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let server = RedisServer::start_on(port);
    let restarted = Instant::now();
    // Wait for checks to go through Redis again (bounded).
    let deadline = restarted + Duration::from_secs(10);
    let back = loop {
        let last_store = samples
            .lock()
            .unwrap()
            .iter()
            .filter(|(at, _, o)| *at > restarted && *o == Origin::Store)
            .map(|(at, _, _)| *at)
            .min();
        if let Some(at) = last_store {
            break at;
        }
        assert!(
            Instant::now() < deadline,
            "checks never went through Redis again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("no check panicked or hung");
    }
    drop(server);

    let samples = samples.lock().unwrap();
    let during: Vec<_> = samples
        .iter()
        .filter(|(at, _, _)| *at > killed && *at < restarted)
        .collect();
    assert!(
        during.len() > 100,
        "load went on during the outage: {}",
        during.len()
    );
    // Every check: within the timeout plus a wide margin for a loaded machine.
    let worst = samples.iter().map(|(_, took, _)| *took).max().unwrap();
    assert!(
        worst < timeout + Duration::from_millis(400),
        "worst check {worst:?}"
    );
    // From one second into the outage on, the breaker answers: no check waits for Redis.
    let settled: Vec<Duration> = during
        .iter()
        .filter(|(at, _, _)| *at > killed + Duration::from_secs(1))
        .map(|(_, took, _)| *took)
        .collect();
    assert!(!settled.is_empty());
    let slow = settled
        .iter()
        .filter(|t| **t > Duration::from_millis(20))
        .count();
    assert!(
        slow * 100 <= settled.len(),
        "{slow} of {} checks during the outage took over 20 ms",
        settled.len()
    );
    // The failure policy answered them, and said so.
    assert!(during
        .iter()
        .filter(|(at, _, _)| *at > killed + Duration::from_secs(1))
        .all(|(_, _, o)| *o == Origin::FailOpen));
    let back_after = back.saturating_duration_since(restarted);
    assert!(
        back_after < Duration::from_secs(2),
        "checks went through Redis {back_after:?} after the restart"
    );
    assert!(
        metric(
            "tollgate_failure_policy_total",
            &[("limiter", "outage"), ("action", "open")]
        ) > 100.0
    );
    assert!(
        metric(
            "tollgate_store_errors_total",
            &[("store", "outage"), ("kind", "unavailable")]
        ) > 100.0
    );
    assert_eq!(
        metric("tollgate_store_breaker_open", &[("store", "outage")]),
        0.0
    );
    assert_eq!(logged("rate-limit store failing", "outage"), 1);
    assert_eq!(logged("rate-limit store answers again", "outage"), 1);
}

/// A TCP proxy in front of Redis that can stop forwarding (a stalled server or network).
struct Proxy {
    port: u16,
    stalled: Arc<AtomicBool>,
}

impl Proxy {
    async fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let stalled = Arc::new(AtomicBool::new(false));
        let flag = stalled.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pipe(cr, sw, flag.clone()));
                tokio::spawn(pipe(sr, cw, flag.clone()));
            }
        });
        Proxy { port, stalled }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

/// Copies bytes, holding them back while `stalled` is set.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    stalled: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        while stalled.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A stall longer than the timeout: the first checks time out (not retried), the breaker
/// opens after a few, later checks are answered at once; when the stall ends checks go
/// through Redis again.
#[tokio::test]
async fn a_stall_opens_the_breaker_and_recovery_closes_it() {
    observed();
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port).await;
    let store = store_at(&proxy.url(), "stall", 100).await;
    let limiter = limiter(&store, "1000/s", "stall", OnStoreError::Closed);
    assert_eq!(limiter.check(&["a"]).await.unwrap().origin(), Origin::Store);

    proxy.stalled.store(true, Ordering::Relaxed);
    let mut kinds: HashMap<&'static str, usize> = HashMap::new();
    let mut fast = 0;
    for _ in 0..50 {
        let started = Instant::now();
        match limiter.check(&["a"]).await {
            Err(Error::Store(e)) => {
                *kinds.entry(e.kind_label()).or_default() += 1;
                if matches!(e, StoreError::Unavailable)
                    && started.elapsed() < Duration::from_millis(20)
                {
                    fast += 1;
                }
            }
            other => panic!("a stalled store cannot decide: {other:?}"),
        }
    }
    // A few timeouts open the breaker; everything after is answered without waiting.
    assert_eq!(kinds.get("timeout"), Some(&3), "{kinds:?}");
    assert_eq!(kinds.get("unavailable"), Some(&47), "{kinds:?}");
    assert_eq!(fast, 47);

    proxy.stalled.store(false, Ordering::Relaxed);
    let resumed = Instant::now();
    loop {
        if limiter.check(&["a"]).await.is_ok() {
            break;
        }
        assert!(
            resumed.elapsed() < Duration::from_secs(3),
            "checks never resumed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        resumed.elapsed() < Duration::from_secs(1),
        "{:?}",
        resumed.elapsed()
    );
    assert_eq!(logged("rate-limit store failing", "stall"), 1);
    assert_eq!(logged("rate-limit store answers again", "stall"), 1);
}

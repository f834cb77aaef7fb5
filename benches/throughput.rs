//! Checks per second through each store, against baselines measured in the same run.
//!
//! `cargo bench --bench throughput [-- --redis URL] [--seconds N] [--tasks N]`
//!
//! Without `--redis`, starts its own `redis-server` on a free loopback port. Redis phases
//! compare a tollgate check with the ceiling for any script-based limiter — `EVALSHA` of a
//! script that only returns 1, on the same server, connection kind and concurrency — and
//! report Redis' own CPU time per call (`INFO commandstats`). The memory phase compares a
//! check with a bare `Mutex<HashMap>` counter increment. Each row also says what share of its
//! checks were admitted: a refusal writes nothing, so a row that refuses most of its checks
//! measures refusals.

use std::collections::HashMap;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use tollgate::key::Header;
use tollgate::{Limiter, MemoryStore, RateLimitLayer, RedisStore, Store};

struct Options {
    redis: Option<String>,
    seconds: u64,
    tasks: usize,
}

fn options() -> Options {
    let mut o = Options {
        redis: None,
        seconds: 3,
        tasks: 32,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--redis" => o.redis = args.next(),
            "--seconds" => o.seconds = args.next().and_then(|v| v.parse().ok()).unwrap_or(3),
            "--tasks" => o.tasks = args.next().and_then(|v| v.parse().ok()).unwrap_or(32),
            _ => {} // cargo bench passes --bench
        }
    }
    o
}

/// The identifiers of the "10k keys" rows: operation `i` uses key `i % KEYS`.
const KEYS: u64 = 10_000;

/// Operations per second, and the share of them admitted.
struct Measured {
    ops: f64,
    admitted: f64,
}

/// Runs `op` (which says whether it admitted) from `tasks` concurrent tasks for `seconds`.
///
/// The tasks start `KEYS / tasks` keys apart, so that each walks keys of its own: started
/// together on one key, all of them checked each key at once, a burst that the rows' limits
/// mostly refused.
async fn measure<F, Fut>(tasks: usize, seconds: u64, op: F) -> Measured
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let admitted = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let stride = (KEYS / tasks.max(1) as u64).max(1);
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (stop, count, op) = (stop.clone(), count.clone(), op.clone());
            let admitted = admitted.clone();
            tokio::spawn(async move {
                let mut i = t as u64 * stride;
                while !stop.load(Ordering::Relaxed) {
                    if op(i).await {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    i += 1;
                    count.fetch_add(1, Ordering::Relaxed);
                    // memory-store checks never wait: let the timer run
                    if i.is_multiple_of(64) {
                        tokio::task::yield_now().await;
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        let _ = h.await;
    }
    let (count, admitted) = (
        count.load(Ordering::Relaxed),
        admitted.load(Ordering::Relaxed),
    );
    Measured {
        ops: count as f64 / started.elapsed().as_secs_f64(),
        admitted: admitted as f64 / count.max(1) as f64,
    }
}

/// Redis' own time per EVALSHA since the last reset, in µs.
async fn usec_per_call(conn: &mut ConnectionManager) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap_or_default();
    info.lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .and_then(|l| l.split(',').find(|f| f.starts_with("usec_per_call=")))
        .and_then(|f| f["usec_per_call=".len()..].parse().ok())
        .unwrap_or(f64::NAN)
}

async fn reset_stats(conn: &mut ConnectionManager) {
    let _: Result<(), _> = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await;
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_redis() -> (Server, String) {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port");
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .args(["--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server is required (scripts/test.sh installs it)");
    let url = format!("redis://127.0.0.1:{port}/");
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    (Server(child), url)
}

fn row(name: &str, m: &Measured, baseline: &Measured, usec: Option<f64>) {
    let usec = usec.map_or(String::new(), |u| format!("{u:>10.2}"));
    let (ops, admitted) = (m.ops, m.admitted * 100.0);
    let ratio = ops / baseline.ops;
    println!("{name:<44} {ops:>12.0} {ratio:>8.2} {admitted:>9.1}% {usec}");
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let o = options();
    let (_server, url) = match o.redis.clone() {
        Some(url) => (None, url),
        None => {
            let (s, url) = start_redis();
            (Some(s), url)
        }
    };
    let (tasks, secs) = (o.tasks, o.seconds);
    println!("{tasks} concurrent tasks, {secs} s per row; ratio = ops/s relative to the row's baseline\n");
    println!(
        "{:<44} {:>12} {:>8} {:>10} {:>10}",
        "redis", "ops/s", "ratio", "admitted", "µs/call"
    );

    let client = redis::Client::open(url.as_str()).unwrap();
    let mut admin = ConnectionManager::new(client.clone()).await.unwrap();
    let conn = ConnectionManager::new(client).await.unwrap();
    let trivial = Arc::new(redis::Script::new("return 1"));

    reset_stats(&mut admin).await;
    let baseline = measure(tasks, secs, {
        let (conn, trivial) = (conn.clone(), trivial.clone());
        move |_| {
            let (mut conn, trivial) = (conn.clone(), trivial.clone());
            async move {
                let _: i64 = trivial.invoke_async(&mut conn).await.unwrap();
                true
            }
        }
    })
    .await;
    let u = usec_per_call(&mut admin).await;
    row(
        "EVALSHA 'return 1' (baseline)",
        &baseline,
        &baseline,
        Some(u),
    );

    let store = RedisStore::connect(url.clone()).await.unwrap();
    for (name, policy, n_ids, spread) in [
        ("1 limit, 1 identifier, hot key", "1000000/s gcra", 1, false),
        ("1 limit, 1 identifier, 10k keys", "100/s", 1, true),
        (
            "10/s,120/min,240/h x ip+user (2 keys)",
            "10/s, 120/min, 240/h",
            2,
            true,
        ),
        ("sliding log 1000/s, 10k keys", "1000/s log", 1, true),
    ] {
        let limiter = Limiter::new(Store::from(store.clone()), policy.parse().unwrap());
        reset_stats(&mut admin).await;
        let ops = measure(tasks, secs, move |i| {
            let limiter = limiter.clone();
            async move {
                let k = if spread { i % KEYS } else { 0 };
                let ids = [format!("ip:{k}"), format!("user:{k}")];
                admitted(limiter.check(&ids[..n_ids]).await)
            }
        })
        .await;
        let u = usec_per_call(&mut admin).await;
        row(&format!("tollgate {name}"), &ops, &baseline, Some(u));
    }

    println!(
        "\n{:<44} {:>12} {:>8} {:>10}",
        "memory", "ops/s", "ratio", "admitted"
    );
    let map: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let floor = measure(tasks, secs, move |i| {
        let map = map.clone();
        async move {
            let key = format!("ip:{}", i % KEYS);
            *map.lock().unwrap().entry(key).or_default() += 1;
            true
        }
    })
    .await;
    row("Mutex<HashMap> counter (baseline)", &floor, &floor, None);
    let memory = MemoryStore::new();
    // Limits a hundred times those of the Redis rows: in process, the tasks check each of the
    // 10k keys some hundreds of times a second, and limits that refused most of them would
    // measure refusals (the `admitted` column says).
    for (name, policy) in [
        ("rolling window 10000/s, 10k keys", "10000/s"),
        (
            "1000/s,12000/min,24000/h, 10k keys",
            "1000/s, 12000/min, 24000/h",
        ),
        ("gcra 10000/s, 10k keys", "10000/s gcra"),
    ] {
        let limiter = Limiter::new(memory.clone(), policy.parse().unwrap());
        let ops = measure(tasks, secs, move |i| {
            let limiter = limiter.clone();
            async move { admitted(limiter.check(&[format!("ip:{}", i % KEYS)]).await) }
        })
        .await;
        row(&format!("tollgate {name}"), &ops, &floor, None);
    }

    println!(
        "\n{:<44} {:>12} {:>8} {:>10}",
        "HTTP layer (memory store)", "ops/s", "ratio", "admitted"
    );
    // The middleware's own cost: the same HTTP service called bare and through the layer
    // (header key, 10k clients, a policy that admits everything it sees).
    let bare = measure(tasks, secs, move |i| async move {
        let req = http_request(i);
        let res = tower::ServiceExt::oneshot(tower::service_fn(handler), req).await;
        res.is_ok_and(|r| r.status().is_success())
    })
    .await;
    row("bare service (baseline)", &bare, &bare, None);
    for (name, policy) in [
        ("RateLimitLayer, 1 limit", "1000000/s gcra"),
        (
            "RateLimitLayer, 3 limits",
            "1000000/s, 10000000/min, 50000000/h",
        ),
    ] {
        let layer = RateLimitLayer::new(Limiter::new(MemoryStore::new(), policy.parse().unwrap()))
            .key(Header::named("x-api-key").unwrap());
        let svc = tower::ServiceBuilder::new()
            .layer(layer)
            .service(tower::service_fn(handler));
        let ops = measure(tasks, secs, move |i| {
            let svc = svc.clone();
            async move {
                let res = tower::ServiceExt::oneshot(svc, http_request(i)).await;
                res.is_ok_and(|r| r.status().is_success())
            }
        })
        .await;
        row(&format!("tollgate {name}"), &ops, &bare, None);
    }
}

fn http_request(i: u64) -> http::Request<()> {
    http::Request::get("/")
        .header("x-api-key", format!("key-{}", i % KEYS))
        .body(())
        .unwrap_or_default()
}

/// Whether a check admitted (an error, as a refusal: the rows' stores do not fail).
fn admitted(checked: Result<tollgate::Decision, tollgate::Error>) -> bool {
    checked.is_ok_and(|d| d.is_allowed())
}

async fn handler(
    _req: http::Request<()>,
) -> Result<http::Response<String>, std::convert::Infallible> {
    Ok(http::Response::new("ok".to_string()))
}

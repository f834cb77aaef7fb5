//! What a check costs Redis, next to the naive scripts of the seed articles, on a
//! `redis-server` of its own.
//!
//! `scripts/bench-redis.sh [--rounds N] [--calls N] [--seconds S]` (or `cargo bench --bench
//! redis_cost -- …`; `redis-server` and `redis-benchmark` must be installed).
//!
//! 1. Redis per call: `INFO commandstats` `usec_per_call` of `EVALSHA` after `CONFIG
//!    RESETSTAT`, and the instructions the server ran per call (`perf stat`, when available;
//!    they include reading the request, the same for every row), `redis-benchmark` driving the
//!    script (4 connections pipelining 8). A
//!    tollgate row runs exactly the command a `Limiter` sends (captured from `SLOWLOG`), with
//!    its identifiers replaced. Admitted: random identifiers, so every check is admitted and
//!    writes. Denied: one hot identifier, exhausted before the run (a denied check writes
//!    nothing). The machine is shared and noisy: each row is the best of `--rounds` runs,
//!    interleaved, and each ratio is taken against a baseline of the same run.
//! 2. `MEMORY USAGE` of one identifier's keys, after one request and at the limit.
//! 3. Checks per second and latency through `Limiter::check` (one multiplexed connection) at
//!    1, 16, 64 and 256 concurrent tasks, next to `redis-benchmark` running the same script
//!    with as many requests in flight on as many connections, and pipelined on one.
//! 4. The same `Limiter::check` rows on a Redis Cluster of three masters of the bench's own
//!    (`redis+cluster://`), with each master's share of the `EVALSHA` calls (`INFO
//!    commandstats`) and the calls per check: an IP and a user usually live in different hash
//!    slots, so a check is one call per slot. A row of one identifier with twice the checks in
//!    flight puts as many calls in flight as the split check. `--only cluster` runs this
//!    section alone.
//!
//! `--only GROUP` (the first word of a group's title in section 1, as `log` or
//! `concurrency`) runs sections 1 and 2 for that group alone.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[path = "support/slowlog.rs"]
mod slowlog;

use tollgate::{Limiter, OnStoreError, RedisStore};

/// Seed 003 (Part 1's `over_limit_multi_lua`): for each limit and identifier, INCR a counter
/// named after its window and EXPIRE it; stop at the first limit over.
const SEED_003: &str = r"
local limits = cjson.decode(ARGV[1])
local now = tonumber(ARGV[2])
for i, limit in ipairs(limits) do
    local duration = limit[1]
    local bucket = ':' .. duration .. ':' .. math.floor(now / duration)
    for j, id in ipairs(KEYS) do
        local key = id .. bucket
        local count = redis.call('INCR', key)
        redis.call('EXPIRE', key, duration)
        if tonumber(count) > limit[2] then
            return 1
        end
    end
end
return 0
";

/// Seed 002's `request_rate_limiter.lua` (Stripe's token bucket), as published.
const SEED_002_BUCKET: &str = r#"
local tokens_key = KEYS[1]
local timestamp_key = KEYS[2]
local rate = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local requested = tonumber(ARGV[4])
local fill_time = capacity/rate
local ttl = math.floor(fill_time*2)
local last_tokens = tonumber(redis.call("get", tokens_key))
if last_tokens == nil then
  last_tokens = capacity
end
local last_refreshed = tonumber(redis.call("get", timestamp_key))
if last_refreshed == nil then
  last_refreshed = 0
end
local delta = math.max(0, now-last_refreshed)
local filled_tokens = math.min(capacity, last_tokens+(delta*rate))
local allowed = filled_tokens >= requested
local new_tokens = filled_tokens
if allowed then
  new_tokens = filled_tokens - requested
end
redis.call("setex", tokens_key, ttl, new_tokens)
redis.call("setex", timestamp_key, ttl, now)
return { allowed, new_tokens }
"#;

/// Seed 002's `concurrent_requests_limiter.lua`, as published.
const SEED_002_CONCURRENT: &str = r#"
local key = KEYS[1]
local capacity = tonumber(ARGV[1])
local timestamp = tonumber(ARGV[2])
local id = ARGV[3]
local count = redis.call("zcard", key)
local allowed = count < capacity
if allowed then
  redis.call("zadd", key, timestamp, id)
end
return { allowed, count }
"#;

/// Seed 001's sorted-set log, with the member given apart from the time (the published
/// script uses the time as the member, so two requests at the same time are one entry).
const SEED_001_STYLE: &str = r"
local key = KEYS[1]
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', key, 0, now - window)
local amount = redis.call('ZCARD', key)
if amount < limit then
  redis.call('ZADD', key, now, ARGV[4])
end
redis.call('EXPIRE', key, window)
return limit - amount
";

/// Seed 004's two-counter sliding window, written the naive way: GET this window's and the
/// previous window's counters, weigh the previous one, INCR and EXPIRE when admitted.
const SEED_004_STYLE: &str = r"
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local i = math.floor(now / window)
local curr_key = KEYS[1] .. ':' .. i
local prev_key = KEYS[1] .. ':' .. (i - 1)
local curr = tonumber(redis.call('GET', curr_key) or '0')
local prev = tonumber(redis.call('GET', prev_key) or '0')
local estimate = prev * (window - (now - i * window)) / window + curr
if estimate + 1 > limit then
  return 0
end
redis.call('INCR', curr_key)
redis.call('EXPIRE', curr_key, window * 2)
return 1
";

const TRIVIAL: &str = "return 1";

/// Marks where an identifier goes in a row's arguments: `ID0`, `ID1`.
const ID: &str = "ID";
const NOW_S: &str = "1767225600";

struct Options {
    rounds: usize,
    calls: usize,
    seconds: f64,
    /// Run only the cluster section.
    cluster_only: bool,
    /// Run sections 1 and 2 for the group whose title starts with this word alone.
    group: Option<String>,
}

fn options() -> Options {
    let mut o = Options {
        rounds: 5,
        calls: 20_000,
        seconds: 2.0,
        cluster_only: false,
        group: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rounds" => o.rounds = args.next().and_then(|v| v.parse().ok()).unwrap_or(o.rounds),
            "--calls" => o.calls = args.next().and_then(|v| v.parse().ok()).unwrap_or(o.calls),
            "--seconds" => {
                o.seconds = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(o.seconds)
            }
            "--only" => match args.next() {
                Some(g) if g == "cluster" => o.cluster_only = true,
                g => o.group = g,
            },
            _ => {} // cargo bench passes --bench
        }
    }
    o
}

/// A `redis-server` of the bench's own, stopped on drop.
struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start() -> Server {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("no free port");
        // Raised priority where allowed (as root), so that other work on a shared machine
        // preempts the server less; elsewhere `nice` only warns and runs it as is.
        let child = Command::new("nice")
            .args(["-n", "-10", "redis-server"])
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--loglevel", "warning"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is required (scripts/bench-redis.sh installs it)");
        let server = Server { child, port };
        let deadline = Instant::now() + Duration::from_secs(5);
        while redis::cmd("PING")
            .query::<String>(&mut server.conn_or_none())
            .is_err()
        {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn conn_or_none(&self) -> redis::Connection {
        loop {
            if let Ok(c) = redis::Client::open(self.url()).and_then(|c| c.get_connection()) {
                return c;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs `redis-benchmark` with `args` before the command; returns its CSV figures:
    /// requests per second, p50 and p99 latency (ms).
    fn benchmark(&self, args: &[String], command: &[String]) -> (f64, f64, f64) {
        let out = Command::new("redis-benchmark")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "--csv"])
            .args(["-r", "1000000000"])
            .args(args)
            .args(command)
            .output()
            .expect("redis-benchmark is required (scripts/bench-redis.sh installs it)");
        let text = String::from_utf8_lossy(&out.stdout);
        // the last line; its name may hold commas, so the figures are read from the end
        let fields: Vec<f64> = text
            .lines()
            .last()
            .unwrap_or_default()
            .rsplit(',')
            .take(7)
            .map(|f| f.trim_matches('"').parse().unwrap_or(f64::NAN))
            .collect();
        // rps, avg, min, p50, p95, p99, max (reversed)
        match fields.as_slice() {
            [_, p99, _, p50, _, _, rps] => (*rps, *p50, *p99),
            _ => (f64::NAN, f64::NAN, f64::NAN),
        }
    }
}

fn cmd(conn: &mut redis::Connection, args: &[&str]) -> redis::Value {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query(conn).unwrap_or(redis::Value::Nil)
}

/// `usec_per_call` of `EVALSHA` since the last reset.
fn usec_per_call(conn: &mut redis::Connection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .unwrap_or_default();
    info.lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .and_then(|l| {
            l.split([':', ','])
                .find_map(|f| f.strip_prefix("usec_per_call="))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

/// One script run by `redis-benchmark`: `EVALSHA sha` and arguments in which `ID0`, `ID1`…
/// stand for identifiers.
#[derive(Clone)]
struct Row {
    name: String,
    sha: String,
    args: Vec<String>,
    /// Arguments replaced by a random number in both runs (lease ids, log members).
    unique: Vec<usize>,
}

impl Row {
    fn seed(conn: &mut redis::Connection, name: &str, script: &str, args: &[&str]) -> Row {
        let sha = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(script)
            .query(conn)
            .expect("SCRIPT LOAD");
        let mut row = Row {
            name: name.into(),
            sha,
            args: args.iter().map(|a| a.to_string()).collect(),
            unique: vec![],
        };
        row.unique = (0..row.args.len())
            .filter(|&i| row.args[i] == "UNIQUE")
            .collect();
        row
    }

    /// The command a `Limiter` sends for `policy` and `ids` identifiers, as `SLOWLOG`
    /// recorded it.
    async fn tollgate(server: &Server, name: &str, policy: &str, ids: usize) -> Row {
        let mut conn = server.conn_or_none();
        cmd(
            &mut conn,
            &["CONFIG", "SET", "slowlog-log-slower-than", "0"],
        );
        cmd(&mut conn, &["SLOWLOG", "RESET"]);
        let store = RedisStore::connect(server.url()).await.unwrap();
        let limiter = Limiter::new(store, policy.parse().unwrap());
        let names: Vec<String> = (0..ids).map(|i| format!("{ID}{i}")).collect();
        let _ = limiter.check(&names).await.unwrap();
        let log: Vec<Vec<redis::Value>> = redis::cmd("SLOWLOG")
            .arg("GET")
            .arg(100)
            .query(&mut conn)
            .unwrap();
        cmd(
            &mut conn,
            &["CONFIG", "SET", "slowlog-log-slower-than", "10000"],
        );
        cmd(&mut conn, &["FLUSHALL"]);
        let args: Vec<String> =
            slowlog::newest_evalsha(&log).expect("the check's EVALSHA in SLOWLOG");
        // numkeys, the keys, then now, cost and the lease id
        let numkeys: usize = args[2].parse().unwrap();
        let lease = numkeys + 3;
        Row {
            name: name.into(),
            sha: args[1].clone(),
            args: args[2..].to_vec(),
            // a concurrency limit's lease id: a fresh one for every call
            unique: if policy.contains("concurrent") {
                vec![lease]
            } else {
                vec![]
            },
        }
    }

    /// The command with identifiers and unique arguments filled in.
    fn command(&self, hot: bool) -> Vec<String> {
        let id = if hot { "hot" } else { "__rand_int__" };
        let mut out = vec!["EVALSHA".to_string(), self.sha.clone()];
        for (i, a) in self.args.iter().enumerate() {
            out.push(if self.unique.contains(&i) {
                "__rand_int__".into()
            } else {
                a.replace(ID, &format!("{id}:"))
            });
        }
        out
    }
}

/// Counts the instructions the server runs while `f` runs, with `perf stat` (NaN where perf
/// is missing or not allowed): unlike times, counts do not change with the machine's load.
fn instructions(server: &Server, f: impl FnOnce()) -> f64 {
    let out = std::env::temp_dir().join(format!("tollgate-perf-{}", server.port));
    let perf = Command::new("perf")
        .args(["stat", "-x,", "-e", "instructions", "-p"])
        .arg(server.child.id().to_string())
        .arg("-o")
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let Ok(mut perf) = perf else {
        f();
        return f64::NAN;
    };
    std::thread::sleep(Duration::from_millis(200));
    f();
    let _ = Command::new("kill")
        .args(["-INT", &perf.id().to_string()])
        .status();
    let _ = perf.wait();
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    text.lines()
        .find(|l| l.contains("instructions"))
        .and_then(|l| l.split(',').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(f64::NAN)
}

/// Redis' cost per call of `row`: `usec_per_call` (µs) and server instructions (thousands),
/// admitted (random identifiers) or denied (one hot identifier, exhausted first).
fn cost(server: &Server, row: &Row, hot: bool, calls: usize) -> (f64, f64) {
    let mut conn = server.conn_or_none();
    cmd(&mut conn, &["FLUSHALL"]);
    let load = ["-c", "4", "-P", "8"].map(String::from);
    if hot {
        let warm = [&load[..], &["-n".into(), "2000".into()]].concat();
        server.benchmark(&warm, &row.command(true));
    }
    cmd(&mut conn, &["CONFIG", "RESETSTAT"]);
    let args = [&load[..], &["-n".into(), calls.to_string()]].concat();
    let instr = instructions(server, || {
        server.benchmark(&args, &row.command(hot));
    });
    (usec_per_call(&mut conn), instr / calls as f64 / 1000.0)
}

/// Sums `MEMORY USAGE` of every key of identifier `hot` after `requests` checks (the
/// seeds' keys hold the identifier in their names too).
fn memory(server: &Server, row: &Row, requests: usize) -> i64 {
    let mut conn = server.conn_or_none();
    cmd(&mut conn, &["FLUSHALL"]);
    let args = ["-c", "1", "-P", "1", "-n"].map(String::from);
    let n = [&args[..], &[requests.to_string()]].concat();
    server.benchmark(&n, &row.command(true));
    let keys: Vec<String> = redis::cmd("KEYS").arg("*hot*").query(&mut conn).unwrap();
    keys.iter()
        .map(|k| {
            redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(k)
                .query::<i64>(&mut conn)
                .unwrap_or(0)
        })
        .sum()
}

/// A group of rows compared with its first one.
struct Group {
    title: &'static str,
    rows: Vec<Row>,
    /// The requests that fill the limit, for the memory figure.
    fill: usize,
}

async fn groups(server: &Server) -> Vec<Group> {
    let mut c = server.conn_or_none();
    let c = &mut c;
    let id0 = "ID0";
    let id1 = "ID1";
    let t = |name, policy, ids| Row::tollgate(server, name, policy, ids);
    vec![
        Group {
            title: "reference: 10/s, 120/min, 240/h x ip + user",
            rows: vec![
                Row::seed(
                    c,
                    "seed 003 (6 INCR + 6 EXPIRE)",
                    SEED_003,
                    &["2", id0, id1, "[[1,10],[60,120],[3600,240]]", NOW_S],
                ),
                t("tollgate, default (rolling)", "10/s, 120/min, 240/h", 2).await,
                t(
                    "tollgate sliding (default before)",
                    "10/s sliding, 120/min sliding, 240/h sliding",
                    2,
                )
                .await,
                Row::seed(c, "trivial script (return 1)", TRIVIAL, &["0"]),
            ],
            fill: 10,
        },
        Group {
            title: "fixed: 10/s, one identifier",
            rows: vec![
                Row::seed(
                    c,
                    "seed 003, one limit",
                    SEED_003,
                    &["1", id0, "[[1,10]]", NOW_S],
                ),
                t("tollgate fixed", "10/s fixed", 1).await,
            ],
            fill: 10,
        },
        Group {
            title: "sliding: 10/s, one identifier",
            rows: vec![
                Row::seed(
                    c,
                    "seed-004-style two counters",
                    SEED_004_STYLE,
                    &["1", id0, "10", "1", "1767225600.25"],
                ),
                t("tollgate sliding", "10/s sliding", 1).await,
            ],
            fill: 10,
        },
        Group {
            title: "rolling: 10/s, one identifier",
            rows: vec![
                Row::seed(
                    c,
                    "seed-001-style sorted set",
                    SEED_001_STYLE,
                    &["1", id0, "1767225600.25", "1", "10", "UNIQUE"],
                ),
                t("tollgate rolling", "10/s rolling", 1).await,
            ],
            fill: 10,
        },
        Group {
            title: "log: 10/s, one identifier",
            rows: vec![
                Row::seed(
                    c,
                    "seed-001-style sorted set",
                    SEED_001_STYLE,
                    &["1", id0, "1767225600.25", "1", "10", "UNIQUE"],
                ),
                t("tollgate log", "10/s log", 1).await,
            ],
            fill: 10,
        },
        Group {
            title: "bucket / gcra: 100/s, burst 500, one identifier",
            rows: vec![
                Row::seed(
                    c,
                    "seed 002 token bucket",
                    SEED_002_BUCKET,
                    &[
                        "2",
                        &format!("{id0}.tokens"),
                        &format!("{id0}.timestamp"),
                        "100",
                        "500",
                        NOW_S,
                        "1",
                    ],
                ),
                t("tollgate bucket", "100/s bucket capacity=500", 1).await,
                t("tollgate gcra", "100/s gcra burst=500", 1).await,
            ],
            fill: 500,
        },
        Group {
            title: "concurrency: 10 in flight, one identifier",
            rows: vec![
                Row::seed(
                    c,
                    "seed 002 concurrent requests",
                    SEED_002_CONCURRENT,
                    &["1", id0, "10", NOW_S, "UNIQUE"],
                ),
                t("tollgate concurrent", "10 concurrent", 1).await,
            ],
            fill: 10,
        },
    ]
}

fn ratio(x: f64, base: f64) -> String {
    format!("{:.2}", x / base)
}

fn cpu_section(server: &Server, groups: &[Group], o: &Options) {
    println!(
        "## Redis per check: usec_per_call (µs) and server instructions per call (thousands, \
         with `perf stat`), best of {} runs of {} calls\n",
        o.rounds, o.calls
    );
    let rows: Vec<&Row> = groups.iter().flat_map(|g| &g.rows).collect();
    // (admitted usec, admitted instructions, denied usec, denied instructions)
    let mut best = vec![[f64::INFINITY; 4]; rows.len()];
    for _ in 0..o.rounds {
        for (i, row) in rows.iter().enumerate() {
            let (a, b) = cost(server, row, false, o.calls);
            let (c, d) = cost(server, row, true, o.calls);
            for (slot, v) in best[i].iter_mut().zip([a, b, c, d]) {
                // NaN (no perf) stays NaN
                *slot = if v.is_nan() { v } else { slot.min(v) };
            }
        }
    }
    println!(
        "{:<38} {:>15} {:>15} {:>15} {:>15}",
        "", "admitted usec", "admitted kinstr", "denied usec", "denied kinstr"
    );
    let mut i = 0;
    for g in groups {
        println!("{}", g.title);
        let base = best[i];
        for row in &g.rows {
            let cells: Vec<String> = (0..4)
                .map(|k| {
                    let ratio = format!("{:.2}x", best[i][k] / base[k]);
                    format!("{:>7.2} {ratio:>7}", best[i][k])
                })
                .collect();
            println!("  {:<36} {}", row.name, cells.join(" "));
            i += 1;
        }
    }
    println!();
}

fn memory_section(server: &Server, groups: &[Group]) {
    println!("## MEMORY USAGE of one identifier's keys (bytes)\n");
    println!("{:<40} {:>9} {:>9}", "", "1 request", "at limit");
    for g in groups {
        println!("{}", g.title);
        for row in g.rows.iter().filter(|r| !r.name.starts_with("trivial")) {
            let one = memory(server, row, 1);
            let full = memory(server, row, g.fill);
            println!("  {:<38} {one:>9} {full:>9}", row.name);
        }
    }
    println!();
}

/// Checks per second and p50/p99 latency (µs) of `Limiter::check` of an IP and a user from
/// `tasks` tasks.
async fn limiter_run(limiter: &Limiter, tasks: usize, seconds: f64) -> (f64, f64, f64) {
    let (rps, p50, p99, _, _) = limiter_run_ids(limiter, tasks, seconds, 2).await;
    (rps, p50, p99)
}

/// Checks per second, p50/p99 latency (µs), the share of checks that failed and the checks
/// made, of `Limiter::check` of `ids` identifiers (an IP, then a user) from `tasks` tasks.
async fn limiter_run_ids(
    limiter: &Limiter,
    tasks: usize,
    seconds: f64,
    ids: usize,
) -> (f64, f64, f64, f64, f64) {
    let failed = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (limiter, latencies, failed) = (limiter.clone(), latencies.clone(), failed.clone());
            tokio::spawn(async move {
                let mut mine = Vec::new();
                let mut i = (t as u64) << 32;
                while Instant::now() < deadline {
                    i += 1;
                    let both = [format!("ip:{i}"), format!("user:{i}")];
                    let at = Instant::now();
                    if limiter.check(&both[..ids]).await.is_err() {
                        failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    mine.push(at.elapsed().as_micros() as u64);
                }
                latencies.lock().unwrap().extend(mine);
            })
        })
        .collect();
    for h in handles {
        let _ = h.await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let mut l = std::mem::take(&mut *latencies.lock().unwrap());
    l.sort_unstable();
    let at = |q: f64| {
        l.get(((l.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or(0) as f64
    };
    let failed = failed.load(std::sync::atomic::Ordering::Relaxed) as f64;
    (
        l.len() as f64 / elapsed,
        at(0.5),
        at(0.99),
        failed / (l.len() as f64).max(1.0),
        l.len() as f64,
    )
}

async fn throughput_section(server: &Server, reference: &Row, o: &Options) {
    println!("## Throughput of the reference check: Limiter::check next to redis-benchmark\n");
    println!(
        "{:<34} {:>9} {:>8} {:>8} {:>7} {:>8}",
        "", "checks/s", "p50 µs", "p99 µs", "ratio", "µs/call"
    );
    let store = RedisStore::connect(server.url()).await.unwrap();
    let limiter = Limiter::new(store, "10/s, 120/min, 240/h".parse().unwrap());
    let mut conn = server.conn_or_none();
    for tasks in [1usize, 16, 64, 256] {
        cmd(&mut conn, &["FLUSHALL"]);
        cmd(&mut conn, &["CONFIG", "RESETSTAT"]);
        let (rps, p50, p99) = limiter_run(&limiter, tasks, o.seconds).await;
        let usec = usec_per_call(&mut conn);
        let mut bench = |args: [String; 4]| {
            cmd(&mut conn, &["FLUSHALL"]);
            cmd(&mut conn, &["CONFIG", "RESETSTAT"]);
            let n = [
                "-n".to_string(),
                ((rps * o.seconds) as usize).max(1000).to_string(),
            ];
            let (b, p50, p99) =
                server.benchmark(&[&args[..], &n[..]].concat(), &reference.command(false));
            (b, p50 * 1000.0, p99 * 1000.0, usec_per_call(&mut conn))
        };
        let t = tasks.to_string();
        let conns = bench(["-c".into(), t.clone(), "-P".into(), "1".into()]);
        let piped = bench(["-c".into(), "1".into(), "-P".into(), t.clone()]);
        println!("{tasks} in flight");
        let line = |name: &str, (r, p50, p99, u): (f64, f64, f64, f64), base: f64| {
            println!(
                "  {name:<32} {r:>9.0} {p50:>8.0} {p99:>8.0} {:>7} {u:>8.2}",
                ratio(r, base)
            );
        };
        line(
            "Limiter::check, 1 connection",
            (rps, p50, p99, usec),
            conns.0,
        );
        line(
            &format!("redis-benchmark, {tasks} connections"),
            conns,
            conns.0,
        );
        line("redis-benchmark, 1 conn pipelined", piped, conns.0);
    }
    println!();
}

/// A Redis Cluster of three masters of the bench's own, stopped on drop.
struct Cluster {
    nodes: Vec<Server>,
    dir: std::path::PathBuf,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.nodes.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Cluster {
    fn start(masters: usize) -> Cluster {
        let dir =
            std::env::temp_dir().join(format!("tollgate-bench-cluster-{}", std::process::id()));
        let mut nodes = Vec::new();
        while nodes.len() < masters {
            // the cluster bus listens on port + 10000
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .expect("no free port");
            if port >= 55_000 || TcpListener::bind(("127.0.0.1", port + 10_000)).is_err() {
                continue;
            }
            let node_dir = dir.join(port.to_string());
            std::fs::create_dir_all(&node_dir).unwrap();
            let child = Command::new("nice")
                .args(["-n", "-10", "redis-server"])
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no", "--loglevel", "warning"])
                .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "1000"])
                .arg("--cluster-config-file")
                .arg(node_dir.join("nodes.conf"))
                .arg("--dir")
                .arg(&node_dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server is required (scripts/bench-redis.sh installs it)");
            let server = Server { child, port };
            let deadline = Instant::now() + Duration::from_secs(5);
            while redis::Client::open(server.url())
                .and_then(|c| c.get_connection())
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                .is_err()
            {
                assert!(Instant::now() < deadline, "redis-server did not start");
                std::thread::sleep(Duration::from_millis(20));
            }
            nodes.push(server);
        }
        let cluster = Cluster { nodes, dir };
        let status = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(
                cluster
                    .nodes
                    .iter()
                    .map(|n| format!("127.0.0.1:{}", n.port)),
            )
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli is required");
        assert!(status.success(), "redis-cli --cluster create failed");
        let deadline = Instant::now() + Duration::from_secs(20);
        for node in &cluster.nodes {
            loop {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut node.conn_or_none())
                    .unwrap_or_default();
                if info.contains("cluster_state:ok") {
                    break;
                }
                assert!(Instant::now() < deadline, "the cluster never came up");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        cluster
    }

    fn url(&self) -> String {
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", nodes.join(","))
    }
}

/// `EVALSHA` calls since the last reset.
fn evalsha_calls(conn: &mut redis::Connection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .unwrap_or_default();
    info.lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .and_then(|l| l.split("calls=").nth(1))
        .and_then(|v| v.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// One cluster row's figures: checks/s, p50 and p99 (µs), the share of failed checks, the
/// script calls per check, and each master's share of them.
type Measured = (f64, f64, f64, f64, f64, String);

/// The reference check through `Limiter::check` on a cluster of three masters: checks per
/// second, latency, each master's share of the script calls, and the calls per check; next to
/// one identifier alone (one call per check), one identifier alone with twice the checks in
/// flight (as many calls in flight as the split check), and the single server of the other
/// sections. The limiters fail closed with a 1 s timeout, so a failed check shows as one, not
/// as a fast answer of the failure policy. The rows of one level take turns, and each is the
/// round with the most checks per second of up to three (`--rounds`), so a burst of other
/// work on the machine does not fall on one row alone.
async fn cluster_section(server: &Server, o: &Options) {
    println!(
        "## The reference check on a 3-master Redis Cluster: Limiter::check, best of {} \
         interleaved rounds\n",
        o.rounds.clamp(1, 3)
    );
    let cluster = Cluster::start(3);
    let limiter = |store: RedisStore| {
        Limiter::builder(store, "10/s, 120/min, 240/h".parse().unwrap())
            .on_store_error(OnStoreError::Closed)
            .build()
    };
    let connect = |url: String| async move {
        RedisStore::builder(url)
            .timeout(Duration::from_secs(1))
            .build()
            .await
            .unwrap()
    };
    let on_cluster = limiter(connect(cluster.url()).await);
    let on_server = limiter(connect(server.url()).await);
    println!(
        "{:<36} {:>9} {:>8} {:>8} {:>7} {:>11}  EVALSHA share per master",
        "", "checks/s", "p50 µs", "p99 µs", "failed", "calls/check"
    );
    let mut conns: Vec<redis::Connection> =
        cluster.nodes.iter().map(|n| n.conn_or_none()).collect();
    let mut server_conn = server.conn_or_none();
    // (name, identifiers, tasks as a multiple of the level's, on the cluster)
    let rows = [
        ("cluster, ip + user", 2, 1, true),
        ("cluster, ip alone", 1, 1, true),
        ("cluster, ip alone, 2x in flight", 1, 2, true),
        ("single server, ip + user", 2, 1, false),
    ];
    for tasks in [1usize, 16, 64, 256] {
        println!("{tasks} in flight");
        let mut best: Vec<Option<Measured>> = vec![None; rows.len()];
        for _ in 0..o.rounds.clamp(1, 3) {
            for (row, &(_, ids, times, on)) in rows.iter().enumerate() {
                let nodes = if on {
                    &mut conns[..]
                } else {
                    std::slice::from_mut(&mut server_conn)
                };
                for conn in nodes.iter_mut() {
                    cmd(conn, &["FLUSHALL"]);
                    cmd(conn, &["CONFIG", "RESETSTAT"]);
                }
                let limiter = if on { &on_cluster } else { &on_server };
                let (rps, p50, p99, failed, checks) =
                    limiter_run_ids(limiter, tasks * times, o.seconds, ids).await;
                let calls: Vec<f64> = nodes.iter_mut().map(evalsha_calls).collect();
                let total: f64 = calls.iter().sum();
                let shares: Vec<String> = calls
                    .iter()
                    .map(|c| format!("{:.0}%", 100.0 * c / total.max(1.0)))
                    .collect();
                let shares = if on {
                    shares.join(" / ")
                } else {
                    String::new()
                };
                // (by the checks made: the run lasts past its seconds by the last calls)
                let per_check = total / checks.max(1.0);
                if best[row].as_ref().is_none_or(|b| rps > b.0) {
                    best[row] = Some((rps, p50, p99, failed, per_check, shares));
                }
            }
        }
        for ((name, ..), result) in rows.iter().zip(best) {
            let Some((rps, p50, p99, failed, per_check, shares)) = result else {
                continue;
            };
            let line = format!(
                "  {name:<34} {rps:>9.0} {p50:>8.0} {p99:>8.0} {:>6.1}% {per_check:>11.2}  {shares}",
                failed * 100.0,
            );
            println!("{}", line.trim_end());
        }
    }
    println!();
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let o = options();
    let server = Server::start();
    let version = String::from_utf8_lossy(
        &Command::new("redis-server")
            .arg("--version")
            .output()
            .map(|o| o.stdout)
            .unwrap_or_default(),
    )
    .trim()
    .to_string();
    println!("# tollgate's cost on Redis ({version})\n");
    if let Some(only) = &o.group {
        println!("Ratios are against each group's first row, measured in the same run.\n");
        let mut groups = groups(&server).await;
        groups.retain(|g| g.title.split([' ', ':']).next() == Some(only.as_str()));
        cpu_section(&server, &groups, &o);
        memory_section(&server, &groups);
        return;
    }
    if !o.cluster_only {
        println!("Ratios are against each group's first row, measured in the same run.\n");
        let groups = groups(&server).await;
        cpu_section(&server, &groups, &o);
        memory_section(&server, &groups);
        throughput_section(&server, &groups[0].rows[1], &o).await;
    }
    cluster_section(&server, &o).await;
}

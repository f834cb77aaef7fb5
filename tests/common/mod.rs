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
    /// The `requirepass` it was started with, for [`RedisServer::conn`].
    password: Option<String>,
    /// Its working directory, of its own (a replica writes the master's data there, a
    /// Cluster node its config file), removed on drop.
    dir: std::path::PathBuf,
}

impl RedisServer {
    /// Starts a server on a free loopback port. Panics (failing the test, never skipping it)
    /// when `redis-server` is not installed: `scripts/test.sh` installs it.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments (`--requirepass`, `--replicaof`,
    /// `--cluster-enabled`…) on a free port.
    pub fn start_with(args: &[&str]) -> RedisServer {
        for _ in 0..5 {
            if let Some(server) = RedisServer::try_start(free_port(), args) {
                return server;
            }
        }
        panic!("could not start redis-server");
    }

    /// Starts a server on `port` (after a restart, say), retrying while the port is busy.
    pub fn start_on(port: u16) -> RedisServer {
        RedisServer::start_on_with(port, &[])
    }

    /// [`RedisServer::start_on`] with extra arguments.
    pub fn start_on_with(port: u16, args: &[&str]) -> RedisServer {
        for _ in 0..50 {
            if let Some(server) = RedisServer::try_start(port, args) {
                return server;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("could not start redis-server on port {port}");
    }

    fn try_start(port: u16, args: &[&str]) -> Option<RedisServer> {
        let password = args
            .iter()
            .position(|a| *a == "--requirepass")
            .and_then(|i| args.get(i + 1))
            .map(|p| p.to_string());
        let dir = temp_dir(&format!("server-{port}"));
        let mut command = Command::new("redis-server");
        command
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(["--loglevel", "warning", "--dir", dir.to_str().unwrap()])
            .args(args);
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect(
                "redis-server is required for the tests: run scripts/test.sh, which installs it",
            );
        let mut server = RedisServer {
            child,
            port,
            password,
            dir,
        };
        if server.wait_ready() && server.answers_itself() {
            return Some(server);
        }
        None
    }

    fn wait_ready(&mut self) -> bool {
        let url = self.admin_url();
        wait_ready(&mut self.child, self.port, &url)
    }

    /// Whether the server answering on the port is this process, not another test's that
    /// took the port meanwhile (then this one fails to bind and exits, but the other answers
    /// `PING` first). A server that will not say (`INFO` refused: another's password, say) is
    /// this one if this process is still running a moment later: one that lost the port has
    /// exited by then.
    fn answers_itself(&mut self) -> bool {
        let Ok(mut conn) = redis::Client::open(self.admin_url()).and_then(|c| c.get_connection())
        else {
            return false;
        };
        match redis::cmd("INFO").arg("server").query::<String>(&mut conn) {
            Ok(info) => {
                info.lines()
                    .find_map(|l| l.strip_prefix("process_id:"))
                    .and_then(|p| p.trim().parse::<u32>().ok())
                    == Some(self.child.id())
            }
            Err(_) => {
                std::thread::sleep(Duration::from_millis(100));
                matches!(self.child.try_wait(), Ok(None))
            }
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The URL with the server's own password, if it has one.
    pub fn admin_url(&self) -> String {
        match &self.password {
            Some(pw) => format!("redis://:{}@127.0.0.1:{}/", encode(pw), self.port),
            None => self.url(),
        }
    }

    /// How many scripts the server has run (`EVALSHA` and `EVAL` calls).
    pub fn script_calls(&self) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.conn())
            .unwrap();
        info.lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .filter_map(|l| {
                l.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    }

    /// Waits (up to 3 s) until the server has run more scripts than `before`
    /// ([`script_calls`](Self::script_calls)): a call on its way has arrived and run.
    pub async fn ran_scripts_past(&self, before: u64, what: &str) {
        eventually(Duration::from_secs(3), || async {
            match self.script_calls() {
                n if n > before => Ok(()),
                n => Err(format!("{n} scripts run: {what} has not run yet")),
            }
        })
        .await;
    }

    /// A plain synchronous connection, to look at what the scripts wrote.
    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.admin_url())
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
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits until the process answers `PING` (an error reply such as `NOAUTH` counts: the server
/// is up). `false` if it exited (its port was taken) or never answered.
fn wait_ready(child: &mut Child, port: u16, url: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return false; // exited: port taken meanwhile
        }
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            if let Ok(mut c) = redis::Client::open(url).and_then(|c| c.get_connection()) {
                match redis::cmd("PING").query::<String>(&mut c) {
                    Ok(_) => return true,
                    Err(e) if e.code().is_some() => return true,
                    Err(_) => {}
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// Percent-encodes everything but letters and digits, for a password in a test URL.
pub fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A fresh directory under the system's temporary directory.
pub fn temp_dir(name: &str) -> std::path::PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "tollgate-{}-{}-{name}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A certificate authority, and a certificate for `127.0.0.1` it signed, made with `openssl`
/// once per test process, for servers that speak TLS beside their plain port (the tests talk
/// to them on the plain one, the store under test on the TLS one). Made, it is what the
/// process's TLS clients trust: `SSL_CERT_FILE`, which the system's root store reads, names
/// it, so a binary that uses it must get it before any TLS client connects.
pub struct Tls {
    ca: std::path::PathBuf,
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
}

impl Tls {
    pub fn get() -> &'static Tls {
        static TLS: std::sync::OnceLock<Tls> = std::sync::OnceLock::new();
        TLS.get_or_init(|| {
            let dir = temp_dir("tls");
            let openssl = |args: &str| {
                let status = Command::new("openssl")
                    .args(args.split_whitespace())
                    .current_dir(&dir)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .expect("openssl is required for the TLS tests: run scripts/test.sh");
                assert!(status.success(), "openssl {args}");
            };
            openssl(
                "req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 \
                 -subj /CN=tollgate-test-ca",
            );
            openssl(
                "req -newkey rsa:2048 -nodes -keyout server.key -out server.csr \
                 -subj /CN=127.0.0.1",
            );
            std::fs::write(dir.join("san"), "subjectAltName=IP:127.0.0.1\n").unwrap();
            openssl(
                "x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
                 -out server.crt -days 2 -extfile san",
            );
            let tls = Tls {
                ca: dir.join("ca.crt"),
                cert: dir.join("server.crt"),
                key: dir.join("server.key"),
            };
            // (set once, before this process's first TLS client)
            std::env::set_var("SSL_CERT_FILE", &tls.ca);
            tls
        })
    }

    /// [`Tls::server_args`] as lines of a config file (a sentinel's).
    pub fn config_lines(&self, port: u16) -> String {
        let args = self.server_args(port);
        args.chunks(2)
            .map(|pair| format!("{} {}\n", pair[0].trim_start_matches("--"), pair[1]))
            .collect()
    }

    /// The arguments that make a server speak TLS on `port` too, without asking clients
    /// for a certificate.
    pub fn server_args(&self, port: u16) -> Vec<String> {
        let path = |p: &std::path::Path| p.to_str().unwrap().to_string();
        vec![
            "--tls-port".into(),
            port.to_string(),
            "--tls-cert-file".into(),
            path(&self.cert),
            "--tls-key-file".into(),
            path(&self.key),
            "--tls-ca-cert-file".into(),
            path(&self.ca),
            "--tls-auth-clients".into(),
            "no".into(),
        ]
    }
}

/// A `redis-server --sentinel` of the test's own, with its config file in a directory of its
/// own; stopped and removed on drop.
pub struct SentinelServer {
    child: Child,
    pub port: u16,
    dir: std::path::PathBuf,
}

impl SentinelServer {
    /// Starts a sentinel whose config file holds `config` (lines such as
    /// `sentinel monitor mymaster 127.0.0.1 6379 2`) after its port.
    pub fn start(config: &str) -> SentinelServer {
        for _ in 0..5 {
            let port = free_port();
            let dir = temp_dir(&format!("sentinel-{port}"));
            let conf = dir.join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\nloglevel warning\ndir {}\n{config}\n",
                    dir.display()
                ),
            )
            .unwrap();
            let mut child = Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server is required for the tests");
            let url = format!("redis://127.0.0.1:{port}/");
            let password = config
                .lines()
                .find_map(|l| l.strip_prefix("requirepass "))
                .map(|p| format!("redis://:{}@127.0.0.1:{port}/", encode(p)));
            if wait_ready(&mut child, port, password.as_deref().unwrap_or(&url)) {
                return SentinelServer { child, port, dir };
            }
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_dir_all(&dir);
        }
        panic!("could not start a sentinel");
    }
}

impl Drop for SentinelServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `check` until it succeeds, for at most `within`; returns how long that took, or
/// panics with the last error.
pub async fn eventually<T, E: std::fmt::Display, F, Fut>(
    within: Duration,
    mut check: F,
) -> (T, Duration)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let started = Instant::now();
    loop {
        match check().await {
            Ok(v) => return (v, started.elapsed()),
            Err(e) => {
                assert!(
                    started.elapsed() < within,
                    "still failing after {within:?}: {e}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// The URL of a Redis server that is not there: port 1, where nothing listens on a test
/// machine (the tests' own servers take ports the system hands out, far above it), so a
/// connection is refused at once. A port found free a moment ago could be taken since by
/// another test's server.
pub fn dead_url() -> String {
    "redis://127.0.0.1:1/".to_string()
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

/// A TCP proxy in front of a server that can stop forwarding (both ways, connections left
/// open): a server that went silent, as a peer behind a dead network path looks.
pub struct Proxy {
    pub port: u16,
    frozen: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: u16) -> Proxy {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let frozen = Arc::new(AtomicBool::new(false));
        let flag = frozen.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                else {
                    continue;
                };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(pump(client_read, server_write, flag.clone()));
                tokio::spawn(pump(server_read, client_write, flag.clone()));
            }
        });
        Proxy { port, frozen, task }
    }

    /// Stops (`true`) or resumes forwarding.
    pub fn freeze(&self, frozen: bool) {
        self.frozen.store(frozen, Ordering::SeqCst);
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    frozen: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0; 16 * 1024];
    loop {
        if frozen.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        }
        // reading is cancellation-safe: nothing read is lost when the wait ends
        match tokio::time::timeout(Duration::from_millis(20), from.read(&mut buf)).await {
            Err(_) => continue,
            Ok(Ok(0)) | Ok(Err(_)) => return,
            Ok(Ok(n)) => {
                // what arrives as the proxy freezes waits until it thaws
                while frozen.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                if to.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
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
/// have one key per sliding log and one packed key for its other rate limits. A key missing expired between its script and `settle` ([`KeyWatch::lost`]): from
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
            // A sorted set per sliding log, and one packed key for all the window and GCRA
            // limits (concurrency sets are not counted).
            rate_limits: {
                let limits = policy.limits();
                let logs = limits
                    .iter()
                    .filter(|l| l.algorithm() == tollgate::Algorithm::SlidingLog)
                    .count();
                let packed = limits.iter().any(|l| {
                    !l.is_concurrency() && l.algorithm() != tollgate::Algorithm::SlidingLog
                });
                logs + usize::from(packed)
            },
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

/// One node of a [`ClusterServer`]: a `redis-server` run by a small shell that kills it when
/// the test process is gone (a cluster shared by a test binary lives in a `static`, which is
/// never dropped).
pub struct ClusterNode {
    pub port: u16,
    /// The port it speaks TLS on, in a cluster started with [`ClusterServer::start_tls`].
    pub tls_port: Option<u16>,
    /// The `redis-server` process (the shell's child).
    pub pid: u32,
    shell: Child,
    alive: bool,
}

impl ClusterNode {
    /// Stops the node (SIGSTOP) or lets it go on (SIGCONT): a stalled master, which keeps
    /// its connections open and answers nothing. Waits until the process is stopped.
    pub fn stall(&self, stalled: bool) {
        let signal = if stalled { "-STOP" } else { "-CONT" };
        let status = Command::new("kill")
            .args([signal, &self.pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal} {}", self.pid);
        if !stalled {
            return;
        }
        let stat = format!("/proc/{}/stat", self.pid);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let state = std::fs::read_to_string(&stat).unwrap_or_default();
            // the state follows the command name, in parentheses
            if state
                .rsplit(')')
                .next()
                .is_some_and(|rest| rest.trim_start().starts_with('T'))
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "node {} never stopped",
                self.port
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Kills the node at once (SIGKILL): no goodbye to the cluster or the clients.
    pub fn kill(&mut self) {
        self.alive = false;
        let _ = Command::new("kill")
            .args(["-9", &self.pid.to_string()])
            .status();
        let _ = self.shell.wait();
    }
}

/// A Redis Cluster of the test's own on loopback: `masters` masters with `replicas` replicas
/// each, created with `redis-cli --cluster create`; every node killed on drop.
pub struct ClusterServer {
    pub nodes: Vec<ClusterNode>,
    /// The `requirepass` of every node, if any.
    password: Option<String>,
    /// Whether every node speaks TLS too, its cluster bus included.
    tls: bool,
    dir: std::path::PathBuf,
}

impl ClusterServer {
    /// Starts a cluster and waits until every node says `cluster_state:ok` with all slots
    /// covered. Panics (failing the test, never skipping it) when it cannot.
    pub fn start(masters: usize, replicas: usize) -> ClusterServer {
        ClusterServer::start_with(masters, replicas, None)
    }

    /// [`ClusterServer::start`] with a password on every node.
    pub fn start_with(masters: usize, replicas: usize, password: Option<&str>) -> ClusterServer {
        ClusterServer::start_as(masters, replicas, password, false)
    }

    /// [`ClusterServer::start`] with nodes that speak TLS too, on a port of their own
    /// ([`ClusterNode::tls_port`]), and over their cluster bus: a TLS client is told their TLS
    /// ports, a plain one (the tests') their plain ports.
    pub fn start_tls(masters: usize) -> ClusterServer {
        ClusterServer::start_as(masters, 0, None, true)
    }

    fn start_as(
        masters: usize,
        replicas: usize,
        password: Option<&str>,
        tls: bool,
    ) -> ClusterServer {
        let count = masters * (1 + replicas);
        let dir = temp_dir("cluster");
        let mut cluster = ClusterServer {
            nodes: Vec::new(),
            password: password.map(str::to_string),
            tls,
            dir,
        };
        while cluster.nodes.len() < count {
            let port = cluster_port();
            if let Some(node) = cluster.start_node(port) {
                cluster.nodes.push(node);
            }
        }
        let mut create = Command::new("redis-cli");
        if let Some(pw) = &cluster.password {
            create.args(["-a", pw, "--no-auth-warning"]);
        }
        create.arg("--cluster").arg("create");
        for node in &cluster.nodes {
            create.arg(format!("127.0.0.1:{}", node.port));
        }
        let status = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-cli is required for the cluster tests");
        assert!(status.success(), "redis-cli --cluster create failed");
        cluster.wait_ok();
        cluster
    }

    /// One cluster per test binary, shared by its tests (each with a prefix of its own): three
    /// masters without replicas.
    pub fn shared() -> &'static ClusterServer {
        static SHARED: std::sync::OnceLock<ClusterServer> = std::sync::OnceLock::new();
        SHARED.get_or_init(|| ClusterServer::start(3, 0))
    }

    /// Starts a master that serves no slot yet, joins it to the cluster and waits until every
    /// node knows it: its port.
    pub fn add_empty_master(&mut self) -> u16 {
        let node = loop {
            if let Some(node) = self.start_node(cluster_port()) {
                break node;
            }
        };
        let port = node.port;
        let mut conn = self.node_conn(self.nodes[0].port).unwrap();
        let () = redis::cmd("CLUSTER")
            .arg("MEET")
            .arg("127.0.0.1")
            .arg(port)
            .query(&mut conn)
            .unwrap();
        self.nodes.push(node);
        self.wait_ok();
        port
    }

    fn start_node(&self, port: u16) -> Option<ClusterNode> {
        let node_dir = self.dir.join(port.to_string());
        std::fs::create_dir_all(&node_dir).unwrap();
        let conf = node_dir.join("nodes.conf");
        let mut args: Vec<String> = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            conf.to_str().unwrap(),
            "--cluster-node-timeout",
            "1000",
            "--appendonly",
            "no",
            "--save",
            "",
            "--dir",
            node_dir.to_str().unwrap(),
            "--loglevel",
            "warning",
            // A replica syncs at once (not 5 s later): one that never synced does not take
            // over from its master.
            "--repl-diskless-sync-delay",
            "0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if let Some(pw) = &self.password {
            args.extend(["--requirepass".into(), pw.clone()]);
            args.extend(["--masterauth".into(), pw.clone()]);
        }
        let tls_port = self.tls.then(free_port);
        if let Some(tls_port) = tls_port {
            args.extend(Tls::get().server_args(tls_port));
            args.extend(["--tls-cluster".into(), "yes".into()]);
        }
        // The shell starts the node and kills it once the test process is gone.
        let watchdog = format!(
            "redis-server \"$@\" & c=$!; while kill -0 $c 2>/dev/null; do \
             kill -0 {} 2>/dev/null || {{ kill -9 $c; exit 0; }}; sleep 0.2; done",
            std::process::id()
        );
        let mut shell = Command::new("sh")
            .arg("-c")
            .arg(watchdog)
            .arg("sh")
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("sh and redis-server are required for the cluster tests");
        let url = self.node_url(port);
        if !wait_ready(&mut shell, port, &url) {
            let _ = shell.kill();
            let _ = shell.wait();
            return None;
        }
        let mut conn = redis::Client::open(url).ok()?.get_connection().ok()?;
        let info: String = redis::cmd("INFO").arg("server").query(&mut conn).ok()?;
        let pid = info
            .lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .and_then(|p| p.trim().parse().ok())?;
        Some(ClusterNode {
            port,
            tls_port,
            pid,
            shell,
            alive: true,
        })
    }

    fn node_url(&self, port: u16) -> String {
        match &self.password {
            Some(pw) => format!("redis://:{}@127.0.0.1:{port}/", encode(pw)),
            None => format!("redis://127.0.0.1:{port}/"),
        }
    }

    /// Waits until every live node says `cluster_state:ok` and serves all 16384 slots, and
    /// every replica has synced with its master.
    pub fn wait_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        for node in self.nodes.iter().filter(|n| n.alive) {
            loop {
                let info = self.node_conn(node.port).and_then(|mut c| {
                    redis::cmd("CLUSTER")
                        .arg("INFO")
                        .query::<String>(&mut c)
                        .ok()
                });
                let replication = self.node_conn(node.port).and_then(|mut c| {
                    redis::cmd("INFO")
                        .arg("replication")
                        .query::<String>(&mut c)
                        .ok()
                });
                let synced = replication.as_deref().is_some_and(|r| {
                    r.contains("role:master") || r.contains("master_link_status:up")
                });
                let known = format!("cluster_known_nodes:{}", self.nodes.len());
                let ok = synced
                    && info.as_deref().is_some_and(|i| {
                        i.contains("cluster_state:ok")
                            && i.contains("cluster_slots_ok:16384")
                            && i.contains(&known)
                    });
                if ok {
                    break;
                }
                assert!(Instant::now() < deadline, "cluster not ok: {info:?}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// Waits until every replica of the master on `port` has every write the master has
    /// (its replication offset). Replication is asynchronous: a write a master acknowledged
    /// and had not passed on when it died is lost with it (DESIGN.md, "Failover"), so a test
    /// that must lose none waits for this between its writes and the kill.
    pub fn wait_replicated(&self, port: u16) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let info = self.node_conn(port).and_then(|mut c| {
                redis::cmd("INFO")
                    .arg("replication")
                    .query::<String>(&mut c)
                    .ok()
            });
            let caught_up = info.as_deref().and_then(|info| {
                let field = |name: &str| {
                    info.lines()
                        .find_map(|l| l.strip_prefix(name))
                        .and_then(|v| v.trim().parse::<u64>().ok())
                };
                let master = field("master_repl_offset:")?;
                let replicas = field("connected_slaves:")?;
                // `slave0:ip=…,port=…,state=online,offset=N,lag=…`
                let offsets: Vec<u64> = info
                    .lines()
                    .filter(|l| l.starts_with("slave") && l.contains("state=online"))
                    .filter_map(|l| {
                        l.split(',')
                            .find_map(|kv| kv.strip_prefix("offset="))
                            .and_then(|v| v.parse().ok())
                    })
                    .collect();
                Some(
                    replicas > 0
                        && offsets.len() as u64 == replicas
                        && offsets.iter().all(|o| *o >= master),
                )
            });
            if caught_up == Some(true) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the replicas of {port} did not catch up: {info:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The store's URL: every node, as `redis+cluster://`.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        match &self.password {
            Some(pw) => format!("redis+cluster://:{}@{}", encode(pw), nodes.join(",")),
            None => format!("redis+cluster://{}", nodes.join(",")),
        }
    }

    /// The store's URL over TLS: every node's TLS port, as `rediss+cluster://`.
    pub fn tls_url(&self) -> String {
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.tls_port.expect("a cluster speaking TLS")))
            .collect();
        format!("rediss+cluster://{}", nodes.join(","))
    }

    /// A plain connection to the node on `port`.
    pub fn node_conn(&self, port: u16) -> Option<redis::Connection> {
        let client = redis::Client::open(self.node_url(port)).ok()?;
        client
            .get_connection_with_timeout(Duration::from_secs(1))
            .ok()
    }

    /// The ports of the masters, as the first live node sees them.
    pub fn masters(&self) -> Vec<u16> {
        self.slot_masters().into_iter().map(|(_, _, p)| p).collect()
    }

    /// Each slot range and its master's port, as the first live node sees them.
    pub fn slot_masters(&self) -> Vec<(u16, u16, u16)> {
        for node in self.nodes.iter().filter(|n| n.alive) {
            let Some(mut conn) = self.node_conn(node.port) else {
                continue;
            };
            let Ok(ranges) = redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query::<Vec<Vec<redis::Value>>>(&mut conn)
            else {
                continue;
            };
            let int = |v: &redis::Value| match v {
                redis::Value::Int(n) => u16::try_from(*n).unwrap(),
                other => panic!("{other:?}"),
            };
            return ranges
                .iter()
                .map(|r| {
                    let redis::Value::Array(master) = &r[2] else {
                        panic!("{r:?}");
                    };
                    (int(&r[0]), int(&r[1]), int(&master[1]))
                })
                .collect();
        }
        panic!("no node answers CLUSTER SLOTS");
    }

    /// The hash slot of `key`.
    pub fn slot_of(&self, key: &str) -> u16 {
        let mut conn = self.node_conn(self.masters()[0]).unwrap();
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut conn)
            .unwrap()
    }

    /// The port of the master serving `key`'s slot.
    pub fn master_of(&self, key: &str) -> u16 {
        let slot = self.slot_of(key);
        self.slot_masters()
            .into_iter()
            .find(|(a, b, _)| (*a..=*b).contains(&slot))
            .map(|(_, _, p)| p)
            .unwrap()
    }

    /// The node of the master serving identifier `id`'s slot (its keys' hash tag).
    pub fn master_node_of(&self, id: &str) -> &ClusterNode {
        let port = self.master_of(&format!("{{{id}}}"));
        self.nodes.iter().find(|n| n.port == port).unwrap()
    }

    /// The node on `port`.
    pub fn node(&mut self, port: u16) -> &mut ClusterNode {
        self.nodes.iter_mut().find(|n| n.port == port).unwrap()
    }

    /// The keys under `prefix` on every master.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        let mut out = Vec::new();
        for port in self.masters() {
            let mut conn = self.node_conn(port).unwrap();
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("{prefix}:*"))
                .query(&mut conn)
                .unwrap();
            out.extend(keys);
        }
        out
    }

    /// A store on this cluster with a fresh prefix and the given clock.
    pub async fn store(&self, clock: Clock) -> RedisStore {
        RedisStore::builder(self.url())
            .prefix(unique_prefix())
            .clock(clock)
            .timeout(Duration::from_secs(5))
            .connect_timeout(Duration::from_secs(5))
            .build()
            .await
            .unwrap()
    }
}

impl Drop for ClusterServer {
    fn drop(&mut self) {
        for node in self.nodes.iter_mut().filter(|n| n.alive) {
            node.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A free loopback port whose cluster bus port (port + 10000) is free too.
fn cluster_port() -> u16 {
    loop {
        let port = free_port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// Every key under `prefix`, with its DUMP and absolute expiry time (ms): what a test compares
/// to show that a call changed nothing.
pub fn snapshot(
    conn: &mut redis::Connection,
    prefix: &str,
) -> std::collections::BTreeMap<String, (Vec<u8>, i64)> {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query(conn)
        .unwrap();
    keys.into_iter()
        .map(|k| {
            let dump: Vec<u8> = redis::cmd("DUMP").arg(&k).query(conn).unwrap();
            let at: i64 = redis::cmd("PEXPIRETIME").arg(&k).query(conn).unwrap();
            (k, (dump, at))
        })
        .collect()
}

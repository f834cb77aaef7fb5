//! Redis Cluster: the connection the store's calls run on, the start-up checks of every master,
//! and the hash slots of identifiers.
//!
//! The `redis` crate's cluster client keeps a connection to every node, learns the slot map
//! (`CLUSTER SLOTS`), routes each command by its first key, repairs node connections and
//! refreshes the slot map when a node answers `MOVED`, `READONLY` or cannot be reached. The store
//! builds it **without retries**: the crate would resend a command whose connection dropped, and
//! an `EVALSHA` may have run before its reply was lost, so a resend could charge twice. What is
//! safe to resend — a call answered `MOVED` or `ASK`, which says the node did not run it — the
//! store resends itself ([`ClusterConn`]), at most [`MAX_REDIRECTS`] times per call. One more
//! rule: `SCRIPT LOAD` after a `NOSCRIPT` goes to the node that answered it (the master of the
//! call's slot, or the node a redirection named). The crate would send it to every node,
//! masters and replicas, and fail it when any one of them cannot be reached, so one lost
//! replica would stop the reload on every shard.
//!
//! The crate's client sends every command through one task of its own, whatever node it goes
//! to: with hundreds of calls in flight (a check split over two slots doubles them), their
//! latency grows a tail there that one server's multiplexed connection does not show. The
//! store keeps one client all the same (DESIGN.md, "Checks across Cluster slots", says what
//! was measured).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use futures_util::future::join_all;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, ResponsePolicy, Route, RoutingInfo, SingleNodeRoutingInfo, Slot,
    SlotAddr,
};
use redis::{
    Arg, Cmd, ErrorKind, ProtocolVersion, RedisConnectionInfo, RedisError, RedisFuture,
    RedisResult, ServerErrorKind, Value,
};

use super::url::{node_connection, tcp_info, ClusterTarget};
use super::validate::{self, Failure, ProbeIds, Role};
use crate::store::error::MisconfigurationKind;

/// The most redirections one call follows: a slot moves once at a time, and an `ASK` may be
/// followed by a `MOVED` when the migration ends meanwhile.
const MAX_REDIRECTS: usize = 2;
/// The number of hash slots.
const SLOTS: u16 = 16_384;

/// A connection the store runs its calls on: one server's, or a cluster's.
#[derive(Clone)]
pub(crate) enum Conn {
    /// A standalone server (or the master behind Sentinel).
    Single(MultiplexedConnection),
    /// A Redis Cluster.
    Cluster(ClusterConn),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.inner.get_db(),
        }
    }
}

/// The crate's cluster connection with the store's rules on top (see the module
/// documentation). A clone serves one call: it remembers where that call's `EVALSHA` went.
#[derive(Clone)]
pub(crate) struct ClusterConn {
    inner: ClusterConnection,
    /// The first key of the last `EVALSHA` sent through this handle.
    last_key: Option<Vec<u8>>,
    /// The node the last `EVALSHA` was redirected to, if it was: the node that answered.
    last_node: Option<(String, u16)>,
    /// Connections to the nodes redirections name.
    redirected: Arc<Redirected>,
}

/// Connections of the store's own to the nodes a `MOVED` or `ASK` names. The crate's client
/// sends a command to a node by its address only over a connection it has, and a node new to
/// the cluster — a master without slots, importing its first — is none of them until the
/// migration ends (`CLUSTER SLOTS` does not list it): a check redirected there would fail,
/// and the crate, told of a node it has no connection to, would reconnect to every node.
/// Redirections are rare (a slot migrating, a failover), so these are opened when first
/// needed, kept while they work, and opened again when they fail.
struct Redirected {
    /// How to log in to every node.
    login: RedisConnectionInfo,
    /// Whether every node is reached over TLS.
    tls: bool,
    /// How long a connection to a node may take to open.
    connect_timeout: Duration,
    /// One cell a node, filled by the first call redirected there once its connection is
    /// open: calls redirected to one node wait for one connection to open, and nothing else
    /// waits for it (a node slow to answer, or gone, holds up the calls sent to it alone).
    nodes: Mutex<HashMap<(String, u16), Arc<NodeConn>>>,
}

/// The store's connection to one node, once open.
type NodeConn = tokio::sync::OnceCell<MultiplexedConnection>;

impl Redirected {
    /// The connection to the node at `host:port`, opened if there is none.
    async fn conn(
        &self,
        host: &str,
        port: u16,
    ) -> RedisResult<(Arc<NodeConn>, MultiplexedConnection)> {
        let cell = self
            .nodes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry((host.to_string(), port))
            .or_default()
            .clone();
        // (a connection that fails to open leaves the cell empty: the next call tries again)
        let conn = cell
            .get_or_try_init(|| {
                node_connection(host, port, (&self.login, self.tls), self.connect_timeout)
            })
            .await?
            .clone();
        Ok((cell, conn))
    }

    /// Sends `pipe` to the node at `host:port`; a connection that failed is dropped, for the
    /// next redirection there to open another.
    async fn send(&self, host: &str, port: u16, pipe: &redis::Pipeline) -> RedisResult<Vec<Value>> {
        let (cell, mut conn) = self.conn(host, port).await?;
        let reply = conn.req_packed_commands(pipe, 0, pipe.len()).await;
        if reply
            .as_ref()
            .is_err_and(|e| e.is_io_error() || e.is_connection_dropped())
        {
            let mut nodes = self.nodes.lock().unwrap_or_else(PoisonError::into_inner);
            let key = (host.to_string(), port);
            // (unless another call replaced it already)
            if nodes.get(&key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
                nodes.remove(&key);
            }
        }
        reply
    }
}

impl ClusterConn {
    /// A handle for a new call.
    pub(crate) fn fresh(&self) -> ClusterConn {
        ClusterConn {
            inner: self.inner.clone(),
            last_key: None,
            last_node: None,
            redirected: self.redirected.clone(),
        }
    }

    /// `cmd` sent to the node at `host:port` over the store's own connection to it, after
    /// `ASKING` when `asking`: its reply.
    async fn send_to(&self, host: &str, port: u16, cmd: &Cmd, asking: bool) -> RedisResult<Value> {
        let mut pipe = redis::pipe();
        if asking {
            pipe.cmd("ASKING");
        }
        pipe.add_command(cmd.clone());
        let mut values = self.redirected.send(host, port, &pipe).await?;
        values
            .pop()
            .ok_or_else(|| RedisError::from((ErrorKind::Parse, "no reply to a redirected call")))
    }

    /// Resends a call answered `MOVED` or `ASK` to the node named, a few times at most; any
    /// other reply is returned as it is.
    async fn follow(&mut self, cmd: &Cmd, mut reply: RedisResult<Value>) -> RedisResult<Value> {
        for _ in 0..MAX_REDIRECTS {
            let err = match &reply {
                Err(e) => e.clone(),
                Ok(Value::ServerError(e)) => RedisError::from(e.clone()),
                Ok(_) => return reply,
            };
            let Some((host, port)) = err
                .redirect_node()
                .and_then(|(addr, _)| addr.rsplit_once(':'))
                .and_then(|(h, p)| Some((h.to_string(), p.parse::<u16>().ok()?)))
            else {
                return reply;
            };
            self.last_node = Some((host.clone(), port));
            let asking = matches!(err.kind(), ErrorKind::Server(ServerErrorKind::Ask));
            reply = self.send_to(&host, port, cmd, asking).await;
        }
        reply
    }
}

impl ConnectionLike for ClusterConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            match command(cmd) {
                Command::Evalsha(key) => {
                    self.last_key = key;
                    self.last_node = None;
                    let reply = self.inner.req_packed_command(cmd).await;
                    self.follow(cmd, reply).await
                }
                Command::ScriptLoad => {
                    // (a node a redirection named: over the store's own connection to it)
                    if let Some((host, port)) = self.last_node.clone() {
                        return self.send_to(&host, port, cmd, false).await;
                    }
                    let routing = match &self.last_key {
                        Some(key) => RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                            Route::with_key(key, SlotAddr::Master),
                        )),
                        None => RoutingInfo::MultiNode((
                            MultipleNodeRoutingInfo::AllMasters,
                            Some(ResponsePolicy::AllSucceeded),
                        )),
                    };
                    self.inner.route_command(cmd.clone(), routing).await
                }
                Command::Other => self.inner.req_packed_command(cmd).await,
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        // Pipelines (releases) are retried by the keeper on its next tick, with the slot map
        // the error refreshed: no redirection here.
        self.inner.req_packed_commands(cmd, offset, count)
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// What the cluster handle does with a command.
enum Command {
    /// `EVALSHA`, with its first key (none without keys).
    Evalsha(Option<Vec<u8>>),
    ScriptLoad,
    Other,
}

fn command(cmd: &Cmd) -> Command {
    let mut args = cmd.args_iter().map(|a| match a {
        Arg::Simple(bytes) => bytes,
        _ => &[][..],
    });
    let name = args.next().unwrap_or_default();
    if name.eq_ignore_ascii_case(b"EVALSHA") {
        let _sha = args.next();
        let keys = args
            .next()
            .and_then(|n| std::str::from_utf8(n).ok()?.parse::<u64>().ok());
        let key = match keys {
            Some(n) if n > 0 => args.next().map(<[u8]>::to_vec),
            _ => None,
        };
        return Command::Evalsha(key);
    }
    if name.eq_ignore_ascii_case(b"SCRIPT")
        && args.next().is_some_and(|a| a.eq_ignore_ascii_case(b"LOAD"))
    {
        return Command::ScriptLoad;
    }
    Command::Other
}

/// The hash slot of `key` (its hash tag's, when it has one).
pub(crate) fn slot_of(key: &str) -> Slot {
    Slot::for_key(key)
}

/// Groups `items` by the hash slot of their keys, in the order each slot first appears: the
/// indices of the items of each slot.
pub(crate) fn by_slot<T>(items: &[T], key: impl Fn(&T) -> &str) -> Vec<Vec<usize>> {
    let mut slots: Vec<Slot> = Vec::new();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let slot = slot_of(key(item));
        match slots.iter().position(|s| *s == slot) {
            Some(g) => groups[g].push(i),
            None => {
                slots.push(slot);
                groups.push(vec![i]);
            }
        }
    }
    groups
}

/// The number of a slot (the crate's [`Slot`] does not show it).
fn slot_number(slot: Slot) -> u16 {
    static NUMBERS: OnceLock<HashMap<Slot, u16>> = OnceLock::new();
    let numbers = NUMBERS.get_or_init(|| {
        (0..SLOTS)
            .filter_map(|n| Slot::new(n).map(|s| (s, n)))
            .collect()
    });
    numbers.get(&slot).copied().unwrap_or(0)
}

/// Opens the cluster client on the nodes of `target` and waits for its first slot map.
async fn connect(target: &ClusterTarget, connect_timeout: Duration) -> RedisResult<ClusterConn> {
    let nodes = target
        .nodes
        .iter()
        .map(|(host, port)| tcp_info(host, *port, &target.login, target.tls))
        .collect::<RedisResult<Vec<_>>>()?;
    // A third of the attempt's time for each node's connection: the client connects to the
    // nodes it was given, then to every master of the slot map, and a silent node takes the
    // whole of it each time; the checks after must still find time for the others.
    let client = ClusterClientBuilder::new(nodes)
        .retries(0)
        .connection_timeout(connect_timeout / 3)
        .use_protocol(ProtocolVersion::RESP3)
        .build()?;
    let inner = client.get_async_connection().await?;
    let redirected = Redirected {
        login: target.login.clone(),
        tls: target.tls,
        connect_timeout: connect_timeout / 3,
        nodes: Mutex::default(),
    };
    Ok(ClusterConn {
        inner,
        last_key: None,
        last_node: None,
        redirected: Arc::new(redirected),
    })
}

/// What a failure to open the cluster client says about the configuration. The client reports
/// a node's refusal inside an I/O error of its own ("Failed to create initial connections -
/// Io: WRONGPASS ..."), so its text is read for the server's error codes.
fn misconfiguration(err: &RedisError) -> Option<MisconfigurationKind> {
    if err.code().is_some() {
        return None;
    }
    let text = err.to_string();
    if text.contains("WRONGPASS") || text.contains("NOAUTH") {
        Some(MisconfigurationKind::Authentication)
    } else if text.contains("cluster support disabled") {
        Some(MisconfigurationKind::NotCluster)
    } else if text.contains("NOPERM") {
        Some(MisconfigurationKind::CommandDenied)
    } else {
        None
    }
}

/// One connection attempt on a cluster: the cluster client and its first slot map, then the
/// checks on every master, each step within `limit`. `None` when a step took longer.
pub(crate) async fn attempt(
    target: &ClusterTarget,
    prefix: &str,
    limit: Duration,
) -> Result<ClusterConn, Option<Failure>> {
    let mut conn = match tokio::time::timeout(limit, connect(target, limit)).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => {
            return Err(Some(match misconfiguration(&e) {
                Some(kind) => Failure::Refused(kind, e),
                None => Failure::Redis(e),
            }))
        }
        Err(_) => return Err(None),
    };
    check(&mut conn, target, prefix, limit).await?;
    Ok(conn)
}

/// A master and the slots it serves.
#[derive(Debug, PartialEq, Eq)]
struct Master {
    host: String,
    port: u16,
    slots: Vec<(u16, u16)>,
}

/// Reads `CLUSTER SLOTS`: each range, its master first.
fn masters(reply: Value) -> Result<Vec<Master>, Failure> {
    let bad = || Failure::Transient("CLUSTER SLOTS answered something unexpected");
    let Value::Array(ranges) = reply else {
        return Err(bad());
    };
    let mut out: Vec<Master> = Vec::new();
    for range in ranges {
        let Value::Array(parts) = range else {
            return Err(bad());
        };
        let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(node))) =
            (parts.first(), parts.get(1), parts.get(2))
        else {
            return Err(bad());
        };
        let host = match node.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => return Err(bad()),
        };
        let Some(Value::Int(port)) = node.get(1) else {
            return Err(bad());
        };
        let (Ok(start), Ok(end), Ok(port)) = (
            u16::try_from(*start),
            u16::try_from(*end),
            u16::try_from(*port),
        ) else {
            return Err(bad());
        };
        // A range no slot is in would have the start-up probe look for an identifier in it
        // for ever.
        if start > end || end >= SLOTS {
            return Err(bad());
        }
        match out.iter_mut().find(|m| m.host == host && m.port == port) {
            Some(m) => m.slots.push((start, end)),
            None => out.push(Master {
                host,
                port,
                slots: vec![(start, end)],
            }),
        }
    }
    if out.is_empty() {
        return Err(Failure::Transient("the cluster serves no slot yet"));
    }
    Ok(out)
}

/// The start-up checks on every master of the cluster: `INFO` (a cluster node, a master, Redis
/// 7.0 or later), then the probe on keys in one of its own slots, so that every master's ACL
/// is put to the test. The masters are checked at once, each within `limit`, and one that
/// failed is asked directly within a third more (the healthy masters' checks need the whole
/// of `limit` while the client's connection to a silent node times out under them). A master
/// that cannot be reached (down before its failover, stalled, partitioned) must fail only
/// its own slots, so the connection is made without it (and a warning names it) when another
/// master passed. A master that answers but cannot serve the store fails the attempt: its
/// setup is wrong, which no wait mends. `None` when a step took longer than `limit` (no
/// master passed).
async fn check(
    conn: &mut ClusterConn,
    target: &ClusterTarget,
    prefix: &str,
    limit: Duration,
) -> Result<(), Option<Failure>> {
    let mut slots_cmd = redis::cmd("CLUSTER");
    slots_cmd.arg("SLOTS");
    let slots = conn.inner.route_command(
        slots_cmd,
        RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
    );
    let reply = match tokio::time::timeout(limit, slots).await {
        Ok(reply) => reply.map_err(|e| Some(e.into()))?,
        Err(_) => return Err(None),
    };
    let masters = masters(reply)?;
    let base = validate::probe_base();
    let checks = masters.iter().map(|master| {
        let mut conn = conn.fresh();
        let ids = probe_ids(&base, &master.slots);
        async move {
            let checked = check_master(&mut conn, master, prefix, &ids);
            match tokio::time::timeout(limit, checked).await {
                // The cluster client drops a node it could not log in to without saying
                // why: asked directly, a master that refuses the store's login (ACLs are
                // per node) fails the attempt, as one whose checks it refused.
                Ok(Err(failure)) if !misconfigured(&failure) => {
                    let refused = refused_directly(target, master, limit).await;
                    Ok(Err(refused.unwrap_or(failure)))
                }
                other => other,
            }
        }
    });
    let mut passed = 0;
    let mut unreachable = Vec::new();
    let mut first_failure = None;
    for (master, result) in masters.iter().zip(join_all(checks).await) {
        match result {
            Ok(Ok(())) => passed += 1,
            Ok(Err(failure)) if misconfigured(&failure) => return Err(Some(failure)),
            Ok(Err(failure)) => {
                let why = why_unreachable(&failure);
                unreachable.push(format!("{}:{} ({why})", master.host, master.port));
                first_failure.get_or_insert(failure);
            }
            Err(_) => {
                let why = format!("no answer within {limit:?}");
                unreachable.push(format!("{}:{} ({why})", master.host, master.port));
            }
        }
    }
    if passed == 0 {
        return Err(first_failure);
    }
    if !unreachable.is_empty() {
        crate::observe::cluster_masters_skipped(prefix, &unreachable);
    }
    Ok(())
}

/// The start-up checks of one master (see [`check`]).
async fn check_master(
    conn: &mut ClusterConn,
    master: &Master,
    prefix: &str,
    ids: &ProbeIds,
) -> Result<(), Failure> {
    let at = SingleNodeRoutingInfo::ByAddress {
        host: master.host.clone(),
        port: master.port,
    };
    let info: String = redis::FromRedisValue::from_redis_value(
        conn.inner
            .route_command(redis::cmd("INFO"), RoutingInfo::SingleNode(at))
            .await?
            .extract_error()?,
    )
    .map_err(RedisError::from)?;
    validate::judge_server(&info, Role::ClusterMaster)?;
    validate::probe(conn, prefix, ids).await
}

/// Whether `master`, asked directly within a third of `limit` (a connection and a `PING`),
/// refuses the store's login or commands: the failure to report then. `None` when it cannot
/// be reached, or answers.
async fn refused_directly(
    target: &ClusterTarget,
    master: &Master,
    limit: Duration,
) -> Option<Failure> {
    let asked = async {
        let mut conn = node_connection(
            &master.host,
            master.port,
            (&target.login, target.tls),
            limit / 3,
        )
        .await?;
        redis::cmd("PING").query_async::<()>(&mut conn).await
    };
    let e = match tokio::time::timeout(limit / 3, asked).await {
        Ok(Err(e)) => e,
        _ => return None,
    };
    let kind = misconfiguration(&e).or(validate::classify_cluster(&e).misconfigured)?;
    Some(Failure::Refused(kind, e))
}

/// What kept a master from passing its checks, for the warning: the error's kind and code,
/// not its text (which could quote the URL's password).
fn why_unreachable(failure: &Failure) -> String {
    match failure {
        Failure::Redis(e) => validate::error_label(e),
        Failure::Transient(why) => (*why).to_string(),
        Failure::Reply(_) => "an unexpected reply".to_string(),
        Failure::Misconfigured(_) | Failure::Refused(..) => "misconfigured".to_string(),
    }
}

/// Whether a master's failed check says it cannot serve the store (rather than that it could
/// not be reached or is in a failover).
fn misconfigured(failure: &Failure) -> bool {
    match failure {
        Failure::Misconfigured(_) | Failure::Refused(..) => true,
        Failure::Redis(e) => validate::classify_cluster(e).misconfigured.is_some(),
        Failure::Transient(_) | Failure::Reply(_) => false,
    }
}

/// Probe identifiers whose keys fall in `slots` (both in one slot, as the probe's second part
/// checks them in one call).
fn probe_ids(base: &str, slots: &[(u16, u16)]) -> ProbeIds {
    let inside = |id: &str| {
        let n = slot_number(slot_of(id));
        slots.iter().any(|&(a, b)| (a..=b).contains(&n))
    };
    // (bounded as the second search is: 2^20 tries miss a one-slot range one time in
    // e^64, and the probe of an identifier outside the master's slots fails, naming it)
    let first = (0u32..1 << 20)
        .map(|i| format!("{base}-{i}"))
        .find(|id| inside(id))
        .unwrap_or_else(|| base.to_string());
    let slot = slot_of(&first);
    let second = (0u32..1 << 20)
        .map(|i| format!("{first}-{i}"))
        .find(|id| slot_of(id) == slot)
        .unwrap_or_else(|| format!("{first}-2"));
    ProbeIds { first, second }
}

/// The key an identifier's slot is computed on: all its keys share its hash tag.
pub(crate) fn id_key(prefix: &str, escaped: &str) -> String {
    let mut key = String::with_capacity(prefix.len() + escaped.len() + 4);
    key.push_str(prefix);
    key.push_str(":{");
    key.push_str(escaped);
    key.push('}');
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_hash_tag() {
        // Known slots (CLUSTER KEYSLOT): "foo" 12182, "bar" 5061.
        assert_eq!(slot_number(slot_of("foo")), 12182);
        assert_eq!(slot_number(slot_of("bar")), 5061);
        assert_eq!(slot_of("tollgate:{foo}:w10/1s"), slot_of("foo"));
        assert_eq!(slot_of(&id_key("p", "foo")), slot_of("foo"));
        assert_eq!(
            slot_of(&id_key("p", "ip:1.2.3.4")),
            slot_of("x:{ip:1.2.3.4}:l1/1s")
        );
    }

    #[test]
    fn every_key_of_an_identifier_lies_in_its_slot() {
        // the empty identifier too: an empty hash tag (`{}`) would be none
        let policy: crate::Policy = "10/s, 5/s log, 3 concurrent".parse().unwrap();
        for id in ["", "ip:1.2.3.4", "{", "}", "%", "x".repeat(300).as_str()] {
            let escaped = crate::store::keyspace::escape_identifier(id);
            let keys = crate::store::keyspace::keys_of("rl", &escaped, Some("ns"), policy.limits());
            assert_eq!(keys.len(), 3, "{id}");
            let own = slot_of(&id_key("rl", &escaped));
            for key in &keys {
                assert!(slot_of(key) == own, "{id:?}: {key}");
            }
        }
    }

    #[test]
    fn identifiers_are_grouped_by_slot() {
        let keys = ["{foo}a", "{bar}a", "{foo}b", "{baz}", "{bar}b"];
        let groups = by_slot(&keys, |k| k);
        assert_eq!(groups, [vec![0, 2], vec![1, 4], vec![3]]);
        assert_eq!(by_slot(&["{a}x"], |k| k), [vec![0]]);
        assert!(by_slot::<&str>(&[], |k| k).is_empty());
    }

    #[test]
    fn probe_ids_land_in_the_masters_slots() {
        for slots in [
            vec![(0, 5460)],
            vec![(5461, 10922)],
            vec![(10923, 16383)],
            vec![(42, 42)],
        ] {
            let ids = probe_ids("tollgate-probe-0123456789abcdef", &slots);
            let n = slot_number(slot_of(&ids.first));
            assert!(slots.iter().any(|&(a, b)| (a..=b).contains(&n)), "{ids:?}");
            assert_eq!(slot_of(&ids.first), slot_of(&ids.second));
            assert_ne!(ids.first, ids.second);
        }
    }

    #[test]
    fn commands_are_read() {
        let mut eval = redis::cmd("EVALSHA");
        eval.arg("abc").arg(2).arg("k1").arg("k2").arg("x");
        assert!(matches!(command(&eval), Command::Evalsha(Some(k)) if k == b"k1"));
        let mut keyless = redis::cmd("evalsha");
        keyless.arg("abc").arg(0);
        assert!(matches!(command(&keyless), Command::Evalsha(None)));
        let mut load = redis::cmd("SCRIPT");
        load.arg("load").arg("return 1");
        assert!(matches!(command(&load), Command::ScriptLoad));
        let mut flush = redis::cmd("SCRIPT");
        flush.arg("FLUSH");
        assert!(matches!(command(&flush), Command::Other));
        assert!(matches!(command(&redis::cmd("TIME")), Command::Other));
    }

    #[test]
    fn cluster_slots_are_read() {
        let node = |host: &str, port| {
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let range = |a, b, master: Value| Value::Array(vec![Value::Int(a), Value::Int(b), master]);
        let reply = Value::Array(vec![
            range(0, 100, node("h", 1)),
            range(101, 200, node("h", 2)),
            range(201, 300, node("h", 1)),
        ]);
        assert_eq!(
            masters(reply).unwrap(),
            [
                Master {
                    host: "h".into(),
                    port: 1,
                    slots: vec![(0, 100), (201, 300)]
                },
                Master {
                    host: "h".into(),
                    port: 2,
                    slots: vec![(101, 200)]
                },
            ]
        );
        assert!(masters(Value::Array(vec![])).is_err());
        assert!(masters(Value::Nil).is_err());
        // a range that holds no slot: the start-up probe would look for an identifier in it
        // for ever
        let one = |a, b| masters(Value::Array(vec![range(a, b, node("h", 1))]));
        assert!(one(200, 100).is_err());
        assert!(one(0, 16_384).is_err());
        assert!(one(16_384, 16_384).is_err());
        assert_eq!(one(16_383, 16_383).unwrap()[0].slots, [(16_383, 16_383)]);
    }
}

//! The checks every new connection passes before the store uses it, and what a server's error
//! says about its configuration.
//!
//! A connection is used only once the server has shown that it can serve the store: `INFO`
//! says it is a standalone master (not a replica, a Sentinel or a Cluster node) of Redis 7.0 or
//! later — in a cluster, that every master is a cluster master of 7.0 or later, each probed in
//! one of its own slots (`cluster`) — and a probe runs every command the store will send, as the store sends it, on
//! reserved keys under the store's prefix (`PREFIX:{tollgate-probe-RANDOM}:…`): `SCRIPT LOAD` of both
//! scripts, the check script once admitted (every algorithm's writes) and once denied (every
//! algorithm's reads), a lease renewal and a release; then the keys are deleted with `DEL`, as
//! `Limiter::reset` deletes (they would expire within seconds anyway). An ACL user missing a command or a key pattern is refused
//! here, not on the first busy minute.

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{ErrorKind, RedisError, RedisResult, Script};

use super::super::error::{Misconfiguration, MisconfigurationKind};
use super::super::keyspace;
use super::super::lease::{lease_id, Lease};
use super::super::script;
use super::super::{Plan, StoreError};
use super::{release_pipe, renew_invocation};
use crate::policy::{Algorithm, Limit};

/// The oldest Redis the scripts run on: they read `TIME` before writing, which needs effects
/// replication (the default since 5.0, the only mode since 7.0), and renew leases with
/// `PEXPIRE … GT` (new in 7.0).
pub(crate) const MIN_VERSION: (u32, u32) = (7, 0);

/// The start of the identifier of the probe's keys (a random part follows).
pub(crate) const PROBE_ID: &str = "tollgate-probe";

/// Why a connection did not pass.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The server answered a command with an error, or the connection failed.
    Redis(RedisError),
    /// The server is not one the store can use, as its `INFO` shows.
    Misconfigured(Misconfiguration),
    /// The server cannot serve the store now, but may soon (a failover under way).
    Transient(&'static str),
    /// The scripts answered something they never return.
    Reply(StoreError),
    /// A cluster's node refused the client, in an error of the client's own.
    Refused(MisconfigurationKind, RedisError),
}

impl From<RedisError> for Failure {
    fn from(e: RedisError) -> Failure {
        Failure::Redis(e)
    }
}

/// A Redis error as a warning may name it: its code, or its kind, never its text (which
/// could quote a URL's password).
pub(crate) fn error_label(e: &RedisError) -> String {
    match e.code() {
        Some(code) => format!("answered {code}"),
        None => format!("{:?}", e.kind()),
    }
}

/// What a failed call says about the connection and the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// The connection is not worth keeping: make a new one (and, behind Sentinel, ask the
    /// sentinels again where the master is).
    pub(crate) reconnect: bool,
    /// The server cannot serve the store as configured.
    pub(crate) misconfigured: Option<MisconfigurationKind>,
}

/// Reads a failed call on a cluster connection. The cluster client repairs node connections and
/// follows the slot map itself, so nothing condemns the connection; a redirection, a slot
/// without a master (`CLUSTERDOWN`, `TRYAGAIN`, a `READONLY` replica, `MASTERDOWN`) is a
/// failover or a migration under way, not a misconfiguration.
pub(crate) fn classify_cluster(err: &RedisError) -> Verdict {
    let verdict = classify(err);
    let misconfigured = match verdict.misconfigured {
        Some(MisconfigurationKind::Cluster | MisconfigurationKind::Replica) => None,
        other => other,
    };
    Verdict {
        reconnect: false,
        misconfigured,
    }
}

/// Reads a failed call.
pub(crate) fn classify(err: &RedisError) -> Verdict {
    let verdict = |reconnect, misconfigured| Verdict {
        reconnect,
        misconfigured,
    };
    match err.kind() {
        ErrorKind::AuthenticationFailed => {
            return verdict(true, Some(MisconfigurationKind::Authentication))
        }
        ErrorKind::RESP3NotSupported => return verdict(true, Some(MisconfigurationKind::Version)),
        ErrorKind::Io | ErrorKind::Parse | ErrorKind::ClusterConnectionNotFound => {
            return verdict(true, None)
        }
        _ => {}
    }
    // The URL's database refused when the connection opened (`SELECT`, which the crate sends
    // and reports apart from the server's errors).
    if err.to_string().contains("refused to switch database") {
        return verdict(false, Some(MisconfigurationKind::Database));
    }
    // A pipeline's error stands for its first failed command.
    let first = err
        .clone()
        .into_server_errors()
        .and_then(|errors| errors.first().map(|(_, e)| e.clone()));
    match first {
        Some(e) => classify_reply(e.code(), e.details().unwrap_or("")),
        None => verdict(false, None),
    }
}

/// Reads a server's error reply: its code and the text after it.
fn classify_reply(code: &str, detail: &str) -> Verdict {
    use MisconfigurationKind::*;
    let detail = detail.to_ascii_lowercase();
    let (reconnect, misconfigured) = match code {
        "WRONGPASS" | "NOAUTH" => (true, Some(Authentication)),
        "NOPERM" => (false, Some(acl_denial(&detail))),
        "READONLY" | "MASTERDOWN" => (true, Some(Replica)),
        "MOVED" | "ASK" | "CROSSSLOT" | "CLUSTERDOWN" | "TRYAGAIN" => (false, Some(Cluster)),
        // CLUSTER SLOTS on a server without cluster mode (a redis+cluster:// URL).
        "ERR" if detail.contains("cluster support disabled") => (false, Some(NotCluster)),
        // A command or key the ACL denies inside a script (Redis 7.2 and later, Valkey).
        "ERR" if detail.contains("acl failure in script") => (false, Some(acl_denial(&detail))),
        // A command the ACL denies inside a script (Redis 7.0 and 7.1), or one renamed or
        // disabled.
        "ERR"
            if detail.contains("can't run this command")
                || detail.contains("unknown command")
                || detail.contains("unknown redis command") =>
        {
            (false, Some(CommandDenied))
        }
        "ERR" if detail.contains("max number of clients") => (true, None),
        _ => (false, None),
    };
    Verdict {
        reconnect,
        misconfigured,
    }
}

/// What an ACL denial (`detail`, lowercase) refused: a command or a key. Redis 7.0 says "this
/// user has no permissions to run the 'evalsha' command" or "… to access one of the keys";
/// 7.2 and later name the user ("user apikey-svc has no permissions to run …", a name that
/// may contain "key") or say "no permissions to access a key".
fn acl_denial(detail: &str) -> MisconfigurationKind {
    if !detail.contains("permissions to run") && detail.contains("access") && detail.contains("key")
    {
        MisconfigurationKind::KeyDenied
    } else {
        MisconfigurationKind::CommandDenied
    }
}

/// What `INFO` tells about a server.
#[derive(Debug, Default, PartialEq, Eq)]
struct ServerInfo {
    version: String,
    mode: String,
    role: String,
    cluster: bool,
}

impl ServerInfo {
    fn parse(text: &str) -> ServerInfo {
        let mut info = ServerInfo::default();
        for line in text.lines() {
            let Some((name, value)) = line.trim_end().split_once(':') else {
                continue;
            };
            match name {
                "redis_version" => info.version = value.to_string(),
                "redis_mode" => info.mode = value.to_string(),
                "role" => info.role = value.to_string(),
                "cluster_enabled" => info.cluster = value == "1",
                _ => {}
            }
        }
        info
    }

    /// Whether the version is at least [`MIN_VERSION`] (an unreadable one is given the benefit
    /// of the doubt: the probe then shows whether the scripts run).
    fn recent_enough(&self) -> bool {
        let mut parts = self.version.split('.').map(|p| p.parse::<u32>().ok());
        match (parts.next().flatten(), parts.next().flatten()) {
            (Some(major), Some(minor)) => (major, minor) >= MIN_VERSION,
            _ => true,
        }
    }
}

/// What the store expects a server to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// A standalone master (`redis://`).
    Standalone,
    /// The master a sentinel named: a replica there is a failover under way.
    BehindSentinel,
    /// A standalone server (`redis://`) that served the store as its master before: a
    /// replica now is a failover under way (a managed service's address moving to the new
    /// master), not a mistake in the URL.
    Demoted,
    /// A master of a Redis Cluster, as `CLUSTER SLOTS` named it.
    ClusterMaster,
}

/// Checks with `INFO` that the server is a standalone master recent enough, as `role`
/// expects it.
pub(crate) async fn check_server(
    conn: &mut impl ConnectionLike,
    role: Role,
) -> Result<(), Failure> {
    let text: String = redis::cmd("INFO").query_async(conn).await?;
    judge_server(&text, role)
}

/// Judges a server by its `INFO` text: what it is, against what the store expects.
pub(crate) fn judge_server(text: &str, expected: Role) -> Result<(), Failure> {
    let info = ServerInfo::parse(text);
    let wrong = |kind| Err(Failure::Misconfigured(Misconfiguration::new(kind, "")));
    if info.mode == "sentinel" {
        return wrong(MisconfigurationKind::Sentinel);
    }
    let cluster = info.mode == "cluster" || info.cluster;
    match (cluster, expected) {
        (true, Role::Standalone | Role::BehindSentinel | Role::Demoted) => {
            return wrong(MisconfigurationKind::Cluster)
        }
        (false, Role::ClusterMaster) => return wrong(MisconfigurationKind::NotCluster),
        _ => {}
    }
    if !info.recent_enough() {
        return Err(Failure::Misconfigured(Misconfiguration::new(
            MisconfigurationKind::Version,
            info.version,
        )));
    }
    if info.role != "master" {
        return match expected {
            Role::BehindSentinel => Err(Failure::Transient(
                "the server the sentinels name as master is a replica (a failover is under way)",
            )),
            Role::ClusterMaster => Err(Failure::Transient(
                "a server the cluster names as master is a replica (a failover is under way)",
            )),
            Role::Demoted => Err(Failure::Transient(
                "the server, the store's master before, is a replica now (a failover is under way)",
            )),
            Role::Standalone => wrong(MisconfigurationKind::Replica),
        };
    }
    Ok(())
}

/// One limit of each algorithm, count 1 over 1 s, for the probe.
fn probe_limits() -> Vec<Limit> {
    let second = Duration::from_secs(1);
    [
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
        Algorithm::Gcra { burst: 1 },
        Algorithm::Concurrency,
    ]
    .into_iter()
    .filter_map(|a| Limit::new(1, second, a).ok())
    .collect()
}

/// The limit of the breaker's probe (`RedisStore::prober`): one check a second, in a key that
/// expires with its window.
pub(crate) fn breaker_probe_limits() -> Vec<Limit> {
    Limit::new(1, Duration::from_secs(1), Algorithm::FixedWindow)
        .into_iter()
        .collect()
}

/// A packed limit alone, for the probe's second part: a day long, so that its two checks
/// fall in one window (the second keeps the key's TTL).
fn probe_packed() -> Vec<Limit> {
    Limit::new(3, Duration::from_secs(86_400), Algorithm::FixedWindow)
        .into_iter()
        .collect()
}

/// The identifiers a probe runs on: its first part on `first`, its second part on both (in
/// one call: in a cluster, both in one slot).
#[derive(Debug, Clone)]
pub(crate) struct ProbeIds {
    pub(crate) first: String,
    pub(crate) second: String,
}

/// The start of a probe's identifiers: of its own for each probe, so that probes of processes
/// starting together (or a probe that failed half-way) never deny each other: the first call
/// always admits.
pub(crate) fn probe_base() -> String {
    let id = lease_id();
    format!("{PROBE_ID}-{}", &id[..16])
}

/// The identifiers of a probe on a single server.
pub(crate) fn probe_ids() -> ProbeIds {
    let first = probe_base();
    ProbeIds {
        second: format!("{first}-2"),
        first,
    }
}

/// Runs every command the store sends, as it sends them, on keys of the probe's own (see the
/// module documentation), and deletes them, even when the probe fails. The time is always
/// Redis `TIME`, whatever the store's clock: the ACL user must be allowed to read it.
pub(crate) async fn probe(
    conn: &mut (impl ConnectionLike + Send),
    prefix: &str,
    ids: &ProbeIds,
) -> Result<(), Failure> {
    let id = lease_id();
    let probe_id = ids.first.as_str();
    let limits = probe_limits();
    let result = run_probe(conn, prefix, ids, &id, &limits).await;
    // Leave nothing behind, with the `DEL` that `Limiter::reset` sends (so a user who may
    // not run it is refused here, not at the first reset). Should this fail, the keys expire
    // within seconds. One key per `DEL`: on a cluster the keys need not share a slot.
    let mut clean = redis::pipe();
    let packed = limits.iter().filter(|l| crate::algorithm::is_packed(l));
    let day = probe_packed();
    for key in [
        keyspace::packed_key(prefix, probe_id, None, packed),
        keyspace::packed_key(prefix, probe_id, None, &day),
        keyspace::packed_key(prefix, &ids.second, None, &day),
    ] {
        clean.cmd("DEL").arg(key).ignore();
    }
    for limit in limits.iter().filter(|l| !crate::algorithm::is_packed(l)) {
        clean
            .cmd("DEL")
            .arg(keyspace::key(prefix, probe_id, None, limit))
            .ignore();
    }
    let cleaned: RedisResult<()> = clean.query_async(conn).await;
    result?;
    Ok(cleaned?)
}

async fn run_probe(
    conn: &mut (impl ConnectionLike + Send),
    prefix: &str,
    probe_ids: &ProbeIds,
    lease_id: &str,
    limits: &[Limit],
) -> Result<(), Failure> {
    let probe_id = probe_ids.first.as_str();
    // The probe's own check script (scripts are generated per policy), and the renew script.
    let check = script::check_script(limits, 1);
    let renew = Script::new(script::RENEW);
    let _: String = check.script.prepare_invoke().load_async(conn).await?;
    let _: String = renew.prepare_invoke().load_async(conn).await?;

    let ids = [probe_id.to_string()];
    let plan = Plan {
        ids: &ids,
        namespace: None,
        limits,
        cost: 1,
        lease: lease_id,
    };
    // The first call admits (every algorithm writes), the second is denied (every algorithm
    // reads what a full limit holds).
    for _ in 0..2 {
        let mut call = check.script.prepare_invoke();
        script::check_args(&mut call, prefix, None, &plan);
        let reply: redis::Value = call.invoke_async(conn).await?;
        script::parse_reply(reply, &check, &plan, 0).map_err(Failure::Reply)?;
    }
    // Packed limits alone, for two identifiers: one MGET reads both keys, the first check
    // creates them (PSETEX), the second keeps their TTLs (SET KEEPTTL).
    let packed_only = probe_packed();
    let ids = [probe_id.to_string(), probe_ids.second.clone()];
    let check = script::check_script(&packed_only, ids.len());
    let _: String = check.script.prepare_invoke().load_async(conn).await?;
    for _ in 0..2 {
        let plan = Plan {
            ids: &ids,
            namespace: None,
            limits: &packed_only,
            cost: 1,
            lease: "",
        };
        let mut call = check.script.prepare_invoke();
        script::check_args(&mut call, prefix, None, &plan);
        let reply: redis::Value = call.invoke_async(conn).await?;
        script::parse_reply(reply, &check, &plan, 0).map_err(Failure::Reply)?;
    }
    let lease = Lease {
        keys: limits
            .iter()
            .filter(|l| l.is_concurrency())
            .map(|l| keyspace::key(prefix, probe_id, None, l))
            .collect(),
        id: lease_id.to_string(),
        lease_us: 1_000_000,
    };
    let _: Vec<i64> = renew_invocation(&renew, None, lease.lease_us, &[&lease])
        .invoke_async(conn)
        .await?;
    let () = release_pipe(std::slice::from_ref(&lease))
        .query_async(conn)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests;

//! The store's URL: a server of its own (`redis://`, `rediss://`, `redis+unix://`, parsed by
//! the `redis` crate), a service behind Sentinel (`redis+sentinel://`, parsed here) or a Redis
//! Cluster (`redis+cluster://`, parsed here); `rediss+sentinel://` and `rediss+cluster://`
//! speak TLS to every node, as `rediss://` does to its server.
//!
//! Credentials may hold any character: those the URL syntax reserves (`#`, `/`, `?`, `@`) are
//! percent-encoded before the `redis` crate parses the URL, which decodes them again. The
//! credentials end at the last `@`.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, RedisConnectionInfo};
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, ProtocolVersion};

use crate::store::error::{redact_url, ConfigError, ConfigErrorKind};

/// The port of a Sentinel when the URL gives none.
const SENTINEL_PORT: u16 = 26379;
/// The port of a Cluster node when the URL gives none.
const CLUSTER_PORT: u16 = 6379;

/// Where the store's server is.
#[derive(Clone)]
pub(crate) enum Target {
    /// One server at a fixed address.
    Standalone(ConnectionInfo),
    /// The master of a service, asked of the sentinels.
    Sentinel(SentinelTarget),
    /// A Redis Cluster, found through any of its nodes.
    Cluster(ClusterTarget),
}

/// A Redis Cluster.
#[derive(Clone)]
pub(crate) struct ClusterTarget {
    /// The nodes to start from, in the URL's order (the cluster names the others).
    pub(crate) nodes: Vec<(String, u16)>,
    /// How to log in to every node: user and password.
    pub(crate) login: RedisConnectionInfo,
    /// Whether every node is reached over TLS (`rediss+cluster://`).
    pub(crate) tls: bool,
}

/// A service behind Sentinel.
#[derive(Clone)]
pub(crate) struct SentinelTarget {
    /// The sentinels' addresses, in the URL's order.
    pub(crate) sentinels: Vec<(String, u16)>,
    /// The service (master) name.
    pub(crate) service: String,
    /// How to log in to the master: user, password, database.
    pub(crate) master: RedisConnectionInfo,
    /// How to log in to the sentinels (their own user and password, if any).
    pub(crate) auth: RedisConnectionInfo,
    /// Whether the sentinels and the master are reached over TLS (`rediss+sentinel://`).
    pub(crate) tls: bool,
}

impl Target {
    /// The passwords in the target, to scrub from any error text.
    pub(crate) fn secrets(&self) -> Vec<String> {
        let mut out = Vec::new();
        let infos: Vec<&RedisConnectionInfo> = match self {
            Target::Standalone(info) => vec![info.redis_settings()],
            Target::Sentinel(s) => vec![&s.master, &s.auth],
            Target::Cluster(c) => vec![&c.login],
        };
        for info in infos {
            if let Some(pw) = info.password().filter(|p| !p.is_empty()) {
                out.push(pw.to_string());
            }
        }
        out
    }

    /// Sets the sentinels' own credentials; `false` for a target without sentinels.
    pub(crate) fn set_sentinel_auth(&mut self, user: Option<&str>, password: Option<&str>) -> bool {
        let Target::Sentinel(s) = self else {
            return false;
        };
        let mut auth = RedisConnectionInfo::default().set_skip_set_lib_name();
        if let Some(user) = user {
            auth = auth.set_username(user);
        }
        if let Some(password) = password {
            auth = auth.set_password(password);
        }
        s.auth = auth;
        true
    }
}

/// The connection settings every data connection gets: RESP3 (the store learns at once when a
/// connection drops), and no `CLIENT SETINFO` (one command less for an ACL user to need).
pub(crate) fn data_settings(info: RedisConnectionInfo) -> RedisConnectionInfo {
    info.set_protocol(ProtocolVersion::RESP3)
        .set_skip_set_lib_name()
}

/// Parses the store's URL. Errors quote the URL with its credentials redacted.
pub(crate) fn parse(url: &str) -> Result<Target, ConfigError> {
    parse_with(url, speaks_tls())
}

/// [`parse`] in a build that speaks TLS or not (`supported`; a `rediss://` URL's support is
/// the `redis` crate's own to tell).
fn parse_with(url: &str, supported: bool) -> Result<Target, ConfigError> {
    let bad = || ConfigError::new(ConfigErrorKind::Url, redact_url(url));
    let unsupported = || ConfigError::new(ConfigErrorKind::Tls, redact_url(url));
    let schemes: [(&str, bool, SchemeParser); 4] = [
        ("redis+sentinel://", false, |r, tls| {
            parse_sentinel(r, tls).map(Target::Sentinel)
        }),
        ("rediss+sentinel://", true, |r, tls| {
            parse_sentinel(r, tls).map(Target::Sentinel)
        }),
        ("redis+cluster://", false, |r, tls| {
            parse_cluster(r, tls).map(Target::Cluster)
        }),
        ("rediss+cluster://", true, |r, tls| {
            parse_cluster(r, tls).map(Target::Cluster)
        }),
    ];
    for (scheme, tls, parse) in schemes {
        if let Some(rest) = url.strip_prefix(scheme) {
            let target = parse(rest, tls).ok_or_else(bad)?;
            return (!tls || supported)
                .then_some(target)
                .ok_or_else(unsupported);
        }
    }
    let info = encode_credentials(url)
        .as_str()
        .into_connection_info()
        .map_err(|e| {
            // (the crate's reason, when it is one the caller can act on)
            if e.to_string().contains("TLS") {
                ConfigError::new(ConfigErrorKind::Tls, redact_url(url))
            } else {
                bad()
            }
        })?;
    let redis = data_settings(info.redis_settings().clone());
    Ok(Target::Standalone(info.set_redis_settings(redis)))
}

/// Parses what follows a scheme of this module's own, over TLS or not.
type SchemeParser = fn(&str, bool) -> Option<Target>;

/// Whether this build can reach a node over TLS: with one of the `redis` crate's TLS
/// features only.
fn speaks_tls() -> bool {
    addr("localhost", 0, true).is_supported()
}

/// `redis+sentinel://[user:password@]host[:port][,host[:port]…]/service_name[/db]`, after the
/// scheme (`tls`: of `rediss+sentinel://`).
fn parse_sentinel(rest: &str, tls: bool) -> Option<SentinelTarget> {
    let (credentials, rest) = split_credentials(rest);
    let (hosts, path) = rest.split_once('/')?;
    let sentinels = hosts
        .split(',')
        .map(|h| host_port(h, SENTINEL_PORT))
        .collect::<Option<Vec<_>>>()?;
    let mut parts = path.trim_end_matches('/').split('/');
    let service = decode(parts.next().filter(|s| !s.is_empty())?)?;
    let db = match parts.next() {
        Some(db) => db.parse::<i64>().ok()?,
        None => 0,
    };
    if parts.next().is_some() {
        return None;
    }
    let master = login(RedisConnectionInfo::default().set_db(db), credentials)?;
    Some(SentinelTarget {
        sentinels,
        service,
        master: data_settings(master),
        auth: RedisConnectionInfo::default().set_skip_set_lib_name(),
        tls,
    })
}

/// `redis+cluster://[user:password@]host[:port][,host[:port]…][/]`, after the scheme (`tls`:
/// of `rediss+cluster://`). A cluster has database 0 only, so the URL names none.
fn parse_cluster(rest: &str, tls: bool) -> Option<ClusterTarget> {
    let (credentials, rest) = split_credentials(rest);
    let hosts = rest.strip_suffix('/').unwrap_or(rest);
    let nodes = hosts
        .split(',')
        .map(|h| host_port(h, CLUSTER_PORT))
        .collect::<Option<Vec<_>>>()?;
    let login = login(RedisConnectionInfo::default(), credentials)?;
    Some(ClusterTarget {
        nodes,
        login: data_settings(login),
        tls,
    })
}

/// The credentials (up to the last `@`) and the rest.
fn split_credentials(rest: &str) -> (Option<&str>, &str) {
    match rest.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    }
}

/// `info` with the user and password of `credentials` (`[user][:password]`, percent-encoded).
fn login(mut info: RedisConnectionInfo, credentials: Option<&str>) -> Option<RedisConnectionInfo> {
    if let Some(credentials) = credentials {
        let (user, password) = match credentials.split_once(':') {
            Some((user, password)) => (user, Some(password)),
            None => (credentials, None),
        };
        if !user.is_empty() {
            info = info.set_username(decode(user)?);
        }
        if let Some(password) = password {
            info = info.set_password(decode(password)?);
        }
    }
    Some(info)
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`; `default_port` when it names none.
fn host_port(text: &str, default_port: u16) -> Option<(String, u16)> {
    let (host, port) = if let Some(v6) = text.strip_prefix('[') {
        let (host, after) = v6.split_once(']')?;
        match after {
            "" => (host, None),
            _ => (host, Some(after.strip_prefix(':')?)),
        }
    } else {
        match text.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    if host.is_empty() {
        return None;
    }
    let port = match port {
        Some(p) => p.parse().ok()?,
        None => default_port,
    };
    Some((host.to_string(), port))
}

/// The address `host:port`, over TLS if `tls` (checking the node's certificate and name
/// against the system's roots, as `rediss://` does).
fn addr(host: &str, port: u16, tls: bool) -> ConnectionAddr {
    match tls {
        false => ConnectionAddr::Tcp(host.to_string(), port),
        true => ConnectionAddr::TcpTls {
            host: host.to_string(),
            port,
            insecure: false,
            tls_params: None,
        },
    }
}

/// The address of a Sentinel, of the master it names or of a cluster node, with the given
/// login, over TLS if `tls`.
pub(crate) fn tcp_info(
    host: &str,
    port: u16,
    login: &RedisConnectionInfo,
    tls: bool,
) -> redis::RedisResult<ConnectionInfo> {
    Ok(addr(host, port, tls)
        .into_connection_info()?
        .set_redis_settings(login.clone()))
}

/// A connection of its own to the node at `host:port` (a Sentinel, a cluster node), logged
/// in with `login`: connecting, and each reply after, within `timeout`.
pub(crate) async fn node_connection(
    host: &str,
    port: u16,
    (login, tls): (&RedisConnectionInfo, bool),
    timeout: Duration,
) -> redis::RedisResult<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout));
    Client::open(tcp_info(host, port, login, tls)?)?
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

/// Percent-encodes what the URL syntax reserves inside the credentials of a `redis://` or
/// `rediss://` URL (between `://` and the last `@`), except the first `:` (user from password)
/// and `%` (already encoded text stays as it is).
fn encode_credentials(url: &str) -> String {
    let Some(start) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    if !matches!(
        &url[..start],
        "redis://" | "rediss://" | "valkey://" | "valkeys://"
    ) {
        return url.to_string();
    }
    let Some(at) = url[start..].rfind('@').map(|i| i + start) else {
        return url.to_string();
    };
    let mut out = String::with_capacity(url.len() + 16);
    out.push_str(&url[..start]);
    let mut seen_colon = false;
    for c in url[start..at].chars() {
        let keep = c.is_ascii_alphanumeric()
            || matches!(c, '-' | '.' | '_' | '~' | '%')
            || (c == ':' && !seen_colon);
        seen_colon |= c == ':';
        if keep {
            out.push(c);
        } else {
            let mut buf = [0; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        }
    }
    out.push_str(&url[at..]);
    out
}

/// Decodes `%XX` escapes; a `%` not followed by two hex digits stays as it is.
fn decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sentinel(url: &str) -> SentinelTarget {
        match parse(url) {
            Ok(Target::Sentinel(s)) => s,
            Ok(_) => panic!("{url}: not sentinel"),
            Err(e) => panic!("{url}: {e}"),
        }
    }

    fn cluster(url: &str) -> ClusterTarget {
        match parse(url) {
            Ok(Target::Cluster(c)) => c,
            Ok(_) => panic!("{url}: not cluster"),
            Err(e) => panic!("{url}: {e}"),
        }
    }

    /// TLS URLs reach every node over TLS (the tests' build speaks TLS, as an application's
    /// that turns on one of the `redis` crate's TLS features); in a build that cannot, the
    /// error says which feature to turn on, not that the URL is not a Redis URL.
    #[test]
    fn tls_urls_reach_their_nodes_over_tls() {
        assert!(speaks_tls(), "the tests' build speaks TLS");
        for url in [
            "rediss://:secret@127.0.0.1:6380/",
            "valkeys://127.0.0.1:6380",
        ] {
            let Ok(Target::Standalone(info)) = parse(url) else {
                panic!("{url} not parsed as one server");
            };
            assert!(matches!(
                info.addr(),
                ConnectionAddr::TcpTls {
                    insecure: false,
                    ..
                }
            ));
        }
        let c = cluster("rediss+cluster://:secret@127.0.0.1:7000,127.0.0.1:7001");
        assert!(c.tls);
        assert!(!cluster("redis+cluster://127.0.0.1:7000").tls);
        let s = sentinel("rediss+sentinel://127.0.0.1:26379/mymaster");
        assert!(s.tls);
        assert!(!sentinel("redis+sentinel://127.0.0.1:26379/mymaster").tls);
        let info = tcp_info("127.0.0.1", 7000, &c.login, true).unwrap();
        assert!(matches!(
            info.addr(),
            ConnectionAddr::TcpTls {
                insecure: false,
                ..
            }
        ));
        // a build without TLS refuses them, naming the feature, and reads the others
        for url in [
            "rediss+cluster://:secret@127.0.0.1:7000",
            "rediss+sentinel://:secret@127.0.0.1:26379/mymaster",
        ] {
            let Err(e) = parse_with(url, false) else {
                panic!("{url} parsed without TLS");
            };
            assert_eq!(e.kind(), ConfigErrorKind::Tls, "{e}");
            assert!(e.to_string().contains("tokio-rustls-comp"), "{e}");
            assert!(!e.to_string().contains("secret"), "{e}");
        }
        for url in [
            "redis+cluster://127.0.0.1:7000",
            "redis+sentinel://127.0.0.1:26379/mymaster",
        ] {
            assert!(parse_with(url, false).is_ok(), "{url}");
        }
    }

    #[test]
    fn cluster_urls() {
        let c = cluster("redis+cluster://127.0.0.1:7000");
        assert_eq!(c.nodes, [("127.0.0.1".to_string(), 7000)]);
        assert_eq!(c.login.username(), None);
        assert_eq!(c.login.password(), None);
        assert_eq!(c.login.protocol(), ProtocolVersion::RESP3);

        let c = cluster("redis+cluster://h1:7000,[::1]:7001,h3/");
        assert_eq!(
            c.nodes,
            [
                ("h1".to_string(), 7000),
                ("::1".to_string(), 7001),
                ("h3".to_string(), 6379)
            ]
        );

        let c = cluster("redis+cluster://app:p%40ss#/w@rd@h:1,h:2");
        assert_eq!(c.login.username(), Some("app"));
        assert_eq!(c.login.password(), Some("p@ss#/w@rd"));
        assert_eq!(c.nodes.len(), 2);

        let c = cluster("redis+cluster://:pw@h:1");
        assert_eq!(c.login.username(), None);
        assert_eq!(c.login.password(), Some("pw"));

        for bad in [
            "redis+cluster://",
            "redis+cluster://h:x",
            "redis+cluster://h:1,",
            "redis+cluster://h:1/0",
            "redis+cluster://h:1/svc",
            "redis+cluster://:s3cret@h:x",
            "redis+cluster://:s3cret@",
        ] {
            let err = parse(bad).err().unwrap_or_else(|| panic!("{bad} parsed"));
            assert_eq!(err.kind(), ConfigErrorKind::Url);
            assert!(!err.to_string().contains("s3cret"), "{err}");
        }
    }

    #[test]
    fn sentinel_urls() {
        let s = sentinel("redis+sentinel://h1:26380,[::1],h3/mymaster");
        assert_eq!(
            s.sentinels,
            [
                ("h1".to_string(), 26380),
                ("::1".to_string(), 26379),
                ("h3".to_string(), 26379)
            ]
        );
        assert_eq!(s.service, "mymaster");
        assert_eq!(s.master.db(), 0);
        assert_eq!(s.master.password(), None);
        assert_eq!(s.master.protocol(), ProtocolVersion::RESP3);

        let s = sentinel("redis+sentinel://app:p%40ss#/w@rd@h:1/svc/3");
        assert_eq!(s.master.username(), Some("app"));
        assert_eq!(s.master.password(), Some("p@ss#/w@rd"));
        assert_eq!(s.master.db(), 3);
        assert_eq!(s.sentinels, [("h".to_string(), 1)]);

        let s = sentinel("redis+sentinel://:pw@h/svc/");
        assert_eq!(s.master.username(), None);
        assert_eq!(s.master.password(), Some("pw"));

        for bad in [
            "redis+sentinel://h:1",
            "redis+sentinel://h:1/",
            "redis+sentinel://h:x/svc",
            "redis+sentinel://h:1,/svc",
            "redis+sentinel://h:1/svc/db",
            "redis+sentinel://h:1/svc/1/2",
            "redis+sentinel://:s3cret@h:x/svc",
        ] {
            let err = parse(bad).err().unwrap_or_else(|| panic!("{bad} parsed"));
            assert_eq!(err.kind(), ConfigErrorKind::Url);
            assert!(!err.to_string().contains("s3cret"), "{err}");
        }
    }

    #[test]
    fn passwords_with_reserved_characters() {
        let Ok(Target::Standalone(info)) = parse("redis://u:p#/x?y:z@w@127.0.0.1:7000/2") else {
            panic!("did not parse");
        };
        let redis = info.redis_settings();
        assert_eq!(redis.username(), Some("u"));
        assert_eq!(redis.password(), Some("p#/x?y:z@w"));
        assert_eq!(redis.db(), 2);
        assert_eq!(redis.protocol(), ProtocolVersion::RESP3);
        assert_eq!(
            info.addr(),
            &ConnectionAddr::Tcp("127.0.0.1".to_string(), 7000)
        );
        // already encoded text is decoded once, as before
        let Ok(Target::Standalone(info)) = parse("redis://:a%23b@h/") else {
            panic!("did not parse");
        };
        assert_eq!(info.redis_settings().password(), Some("a#b"));
        let Ok(Target::Standalone(info)) = parse("redis://127.0.0.1:6379/") else {
            panic!("did not parse");
        };
        assert_eq!(info.redis_settings().password(), None);
        // as the README says: a literal `%` is written `%25`; in a unix URL's query, `+`
        // reads as a space and a literal `+` is written `%2B`
        let Ok(Target::Standalone(info)) = parse("redis://:100%25@h/") else {
            panic!("did not parse");
        };
        assert_eq!(info.redis_settings().password(), Some("100%"));
        let Ok(Target::Standalone(info)) = parse("redis+unix:///tmp/r.sock?pass=a%2Bb+c%26") else {
            panic!("did not parse");
        };
        assert_eq!(info.redis_settings().password(), Some("a+b c&"));
    }

    #[test]
    fn secrets_are_listed_for_scrubbing() {
        let mut t = parse("redis+sentinel://:mpw@h/svc").unwrap();
        assert!(t.set_sentinel_auth(None, Some("spw")));
        assert_eq!(t.secrets(), ["mpw", "spw"]);
        let mut t = parse("redis://:pw@h/").unwrap();
        assert!(!t.set_sentinel_auth(None, Some("spw")));
        assert_eq!(t.secrets(), ["pw"]);
        let mut t = parse("redis+cluster://u:cpw@h:1,h:2").unwrap();
        assert!(!t.set_sentinel_auth(None, Some("spw")));
        assert_eq!(t.secrets(), ["cpw"]);
    }
}

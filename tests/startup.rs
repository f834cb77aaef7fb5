//! Start-up checks of the Redis store against real servers that cannot serve it: each is
//! refused by `build()` with a typed error whose message names the fix, and reported the same
//! way by the checks of a store built with `build_lazy()` — never as an admission.

mod common;

use std::time::Duration;

use common::{encode, RedisServer, SentinelServer};
use tollgate::store::{MisconfigurationKind, RedisStoreBuilder};
use tollgate::{Error, Limiter, RedisStore, StoreError};

use MisconfigurationKind::*;

/// Refused by `build()` and by the first check of a lazily built store, with `kind`; returns
/// the message.
async fn refused(builder: impl Fn() -> RedisStoreBuilder, kind: MisconfigurationKind) -> String {
    let err = builder().build().await.unwrap_err();
    match &err {
        StoreError::Misconfigured(m) => assert_eq!(m.kind(), kind, "{err}"),
        other => panic!("expected {kind:?}, got {other:?}"),
    }
    let l = closed(builder().build_lazy().unwrap(), "10/s".parse().unwrap());
    for _ in 0..3 {
        match l.check(&["a"]).await {
            Err(Error::Store(StoreError::Misconfigured(m))) => assert_eq!(m.kind(), kind),
            other => panic!("lazily built, expected {kind:?}, got {other:?}"),
        }
    }
    err.to_string()
}

fn builder(url: String) -> impl Fn() -> RedisStoreBuilder {
    move || RedisStore::builder(url.clone()).timeout(Duration::from_secs(2))
}

/// A missing or wrong password is refused; the right one, with characters URLs reserve, works.
/// No password appears in an error or a `Debug` output.
#[tokio::test]
async fn a_missing_or_wrong_password_is_refused() {
    let password = "s3#cr/t@x?y";
    let server = RedisServer::start_with(&["--requirepass", password]);
    let port = server.port;
    let message = refused(builder(server.url()), Authentication).await;
    assert!(message.contains("redis://USER:PASSWORD@"), "{message}");

    let wrong = format!("redis://:wr#ng/pw@127.0.0.1:{port}/");
    let err = RedisStore::connect(wrong.clone()).await.unwrap_err();
    assert!(!format!("{err} {err:?}").contains("wr#ng/pw"), "{err:?}");
    refused(builder(wrong), Authentication).await;

    let right = format!("redis://:{password}@127.0.0.1:{port}/");
    let b = RedisStore::builder(right.clone());
    assert!(!format!("{b:?}").contains(password), "{b:?}");
    let store = b.build().await.unwrap();
    assert!(!format!("{store:?}").contains(password), "{store:?}");
    // encoded the usual way, too
    let encoded = format!("redis://:{}@127.0.0.1:{port}/", encode(password));
    RedisStore::connect(encoded).await.unwrap();
    let l = closed(store, "10/s".parse().unwrap());
    assert!(l.check(&["a"]).await.unwrap().is_allowed());
}

/// The README's ACL line works; without any one of its commands, or with a key pattern that
/// misses the prefix, the store is refused.
#[tokio::test]
async fn acl_users_missing_a_command_or_key_pattern_are_refused() {
    let server = RedisServer::start();
    let readme = include_str!("../README.md");
    let line: Vec<&str> = readme
        .lines()
        .find(|l| l.trim_start().starts_with("ACL SETUSER"))
        .unwrap()
        .split_whitespace()
        .collect();
    let mut admin = server.conn();
    let mut set_user = |name: &str, rules: &[&str]| {
        let mut cmd = redis::cmd("ACL");
        cmd.arg("SETUSER").arg(name);
        for rule in rules {
            cmd.arg(rule.replace("PASSWORD", "pw"));
        }
        let () = cmd.query(&mut admin).unwrap();
        format!("redis://{name}:pw@127.0.0.1:{}/", server.port)
    };
    // the line as the README shows it
    let rules = &line[3..];
    let url = set_user("app", rules);
    let l = closed(
        RedisStore::connect(url).await.unwrap(),
        "10/s, 2/s log, 2/s fixed, 2/s gcra, 1 concurrent"
            .parse()
            .unwrap(),
    );
    let d = l.check(&["a"]).await.unwrap();
    assert!(d.is_allowed());
    assert!(!l.check(&["a"]).await.unwrap().is_allowed());
    drop(d);

    // without each command in turn
    let commands: Vec<&str> = rules
        .iter()
        .copied()
        .filter(|r| r.starts_with('+'))
        .collect();
    assert!(commands.len() >= 10, "{commands:?}");
    for (i, command) in commands.iter().enumerate() {
        let without: Vec<&str> = rules.iter().copied().filter(|r| r != command).collect();
        let url = set_user(&format!("without{i}"), &without);
        let message = refused(builder(url), CommandDenied).await;
        assert!(message.contains("ACL SETUSER"), "{command}: {message}");
        assert!(message.contains(command), "{command}: {message}");
    }

    // a key pattern that misses the prefix
    let other: Vec<&str> = rules
        .iter()
        .map(|r| if r.starts_with('~') { "~other:*" } else { r })
        .collect();
    let url = set_user("elsewhere", &other);
    let message = refused(builder(url), KeyDenied).await;
    assert!(message.contains("~tollgate:*"), "{message}");

    // another database: the README's line with `+select`, as it says; without, refused
    let mut with_select = rules.to_vec();
    with_select.push("+select");
    let url = set_user("db2", &with_select);
    RedisStore::connect(format!("{url}2")).await.unwrap();
    let url = set_user("db2-without", rules);
    let message = refused(builder(format!("{url}2")), Database).await;
    assert!(message.contains("+select"), "{message}");
}

/// A database the server does not have is a misconfiguration to fix, named as such, not an
/// outage to wait out.
#[tokio::test]
async fn a_database_the_server_lacks_is_refused() {
    let server = RedisServer::start();
    let message = refused(builder(format!("{}20", server.url())), Database).await;
    assert!(message.contains("databases"), "{message}");
    RedisStore::connect(format!("{}15", server.url()))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_replica_is_refused() {
    let master = RedisServer::start();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &master.port.to_string()]);
    let message = refused(builder(replica.url()), Replica).await;
    assert!(message.contains("redis+sentinel://"), "{message}");
    RedisStore::connect(master.url()).await.unwrap();
}

#[tokio::test]
async fn a_cluster_node_is_refused() {
    let node = RedisServer::start_with(&["--cluster-enabled", "yes"]);
    let message = refused(builder(node.url()), Cluster).await;
    assert!(message.contains("standalone"), "{message}");
}

#[tokio::test]
async fn a_sentinel_port_given_as_redis_is_refused() {
    let sentinel = SentinelServer::start("");
    let url = format!("redis://127.0.0.1:{}/", sentinel.port);
    let message = refused(builder(url), Sentinel).await;
    assert!(message.contains("redis+sentinel://"), "{message}");
}

/// The start-up probe leaves no key behind.
#[tokio::test]
async fn the_probe_leaves_nothing_behind() {
    let server = RedisServer::start();
    let _store = RedisStore::connect(server.url()).await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut server.conn())
        .unwrap();
    assert_eq!(keys, Vec::<String>::new());
}

/// Settings that cannot work are refused before connecting, with the password redacted.
#[tokio::test]
async fn unusable_settings_are_refused_before_connecting() {
    use tollgate::store::ConfigErrorKind;
    let config = |e: StoreError| match e {
        StoreError::Config(c) => c,
        other => panic!("expected a configuration error, got {other:?}"),
    };
    let err = RedisStore::builder("redis://:s3cret@127.0.0.1:1/")
        .sentinel_password("x")
        .build_lazy()
        .unwrap_err();
    let err = config(err);
    assert_eq!(err.kind(), ConfigErrorKind::SentinelCredentials);
    assert!(!err.to_string().contains("s3cret"), "{err}");
    for url in [
        "redis+sentinel://:s3cret@127.0.0.1:1",
        "redis+sentinel://:s3cret@127.0.0.1:x/svc",
        "http://:s3cret@127.0.0.1:1/",
    ] {
        let err = config(RedisStore::builder(url).build_lazy().unwrap_err());
        assert_eq!(err.kind(), ConfigErrorKind::Url, "{url}");
        assert!(!format!("{err} {err:?}").contains("s3cret"), "{err:?}");
    }
}

/// A limiter that fails closed, so that a store failure shows as the error it is rather
/// than as an allowed decision.
fn closed(store: impl Into<tollgate::Store>, policy: tollgate::Policy) -> Limiter {
    Limiter::builder(store, policy)
        .on_store_error(tollgate::OnStoreError::Closed)
        .build()
}

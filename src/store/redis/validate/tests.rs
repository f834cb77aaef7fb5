//! The start-up checks' and error classification's tests.

use super::*;
use crate::store::error::ACL_COMMANDS;
use std::collections::BTreeSet;

/// The ACL rule in the error message (and the README) grants exactly the commands the
/// scripts call, plus the store's own.
#[test]
fn the_acl_rule_covers_the_scripts() {
    let mut called = BTreeSet::new();
    for text in [
        include_str!("../../../../lua/prelude.lua"),
        include_str!("../../../../lua/check.lua"),
        include_str!("../../../../lua/sliding_log.lua"),
        include_str!("../../../../lua/sliding_window.lua"),
        include_str!("../../../../lua/fixed_window.lua"),
        include_str!("../../../../lua/gcra.lua"),
        include_str!("../../../../lua/concurrency.lua"),
        include_str!("../../../../lua/renew.lua"),
        include_str!("../../../../lua/peek.lua"),
        include_str!("../../../../lua/refund.lua"),
        include_str!("../../../../lua/reserve.lua"),
        include_str!("../../../../lua/rolling_window.lua"),
        include_str!("../../../../lua/rolling_window_wide.lua"),
        include_str!("../../../../lua/schedule.lua"),
    ] {
        for piece in text.split("redis.call(").skip(1) {
            let name: String = piece
                .trim_start_matches(['\'', '"'])
                .chars()
                .take_while(|c| c.is_ascii_alphabetic())
                .collect();
            if !name.is_empty() {
                called.insert(format!("+{}", name.to_ascii_lowercase()));
            }
        }
    }
    for own in ["+evalsha", "+script|load", "+zrem", "+info", "+del"] {
        called.insert(own.to_string());
    }
    let granted: BTreeSet<String> = ACL_COMMANDS
        .split_whitespace()
        .map(str::to_string)
        .collect();
    assert_eq!(granted, called);
    let readme = include_str!("../../../../README.md");
    let line = readme
        .lines()
        .find(|l| l.trim_start().starts_with("ACL SETUSER"))
        .expect("the README shows an ACL line");
    for command in &granted {
        assert!(
            line.split_whitespace().any(|w| w == command),
            "the README's ACL line lacks {command}"
        );
    }
}

#[test]
fn info_is_read() {
    let text = "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n\r\n\
                # Replication\r\nrole:master\r\n# Cluster\r\ncluster_enabled:0\r\n";
    let info = ServerInfo::parse(text);
    assert_eq!(
        info,
        ServerInfo {
            version: "7.0.15".into(),
            mode: "standalone".into(),
            role: "master".into(),
            cluster: false,
        }
    );
    assert!(info.recent_enough());
    for (version, ok) in [
        ("6.2.14", false),
        ("5.0.0", false),
        ("7.0.0", true),
        ("7.2.4", true),
        ("10.0", true),
        ("", true),
    ] {
        let info = ServerInfo {
            version: version.into(),
            ..ServerInfo::default()
        };
        assert_eq!(info.recent_enough(), ok, "{version}");
    }
}

#[test]
fn errors_are_read() {
    use MisconfigurationKind::*;
    let cases = [
        (
            "WRONGPASS",
            "invalid username-password pair",
            true,
            Some(Authentication),
        ),
        (
            "NOAUTH",
            "Authentication required.",
            true,
            Some(Authentication),
        ),
        (
            "NOPERM",
            "this user has no permissions to run the 'evalsha' command",
            false,
            Some(CommandDenied),
        ),
        (
            "NOPERM",
            "this user has no permissions to access one of the keys used as arguments",
            false,
            Some(KeyDenied),
        ),
        (
            "ERR",
            "The user executing the script can't run this command or subcommand script: \
             abc, on @user_script:1.",
            false,
            Some(CommandDenied),
        ),
        (
            "ERR",
            "unknown command 'EVALSHA', with args",
            false,
            Some(CommandDenied),
        ),
        // Redis 7.2 and later (and Valkey): the user named, which may hold "key"
        (
            "NOPERM",
            "User apikey-svc has no permissions to run the 'evalsha' command",
            false,
            Some(CommandDenied),
        ),
        (
            "NOPERM",
            "No permissions to access a key",
            false,
            Some(KeyDenied),
        ),
        (
            "ERR",
            "ACL failure in script: User app has no permissions to run the 'zadd' command \
             script: abc, on @user_script:12.",
            false,
            Some(CommandDenied),
        ),
        (
            "ERR",
            "ACL failure in script: No permissions to access a key script: abc, on \
             @user_script:3.",
            false,
            Some(KeyDenied),
        ),
        (
            "READONLY",
            "You can't write against a read only replica.",
            true,
            Some(Replica),
        ),
        (
            "MASTERDOWN",
            "Link with MASTER is down",
            true,
            Some(Replica),
        ),
        ("MOVED", "3999 127.0.0.1:6381", false, Some(Cluster)),
        (
            "CROSSSLOT",
            "Keys in request don't hash to the same slot",
            false,
            Some(Cluster),
        ),
        ("ERR", "max number of clients reached", true, None),
        (
            "LOADING",
            "Redis is loading the dataset in memory",
            false,
            None,
        ),
        ("ERR", "something else", false, None),
    ];
    for (code, detail, reconnect, misconfigured) in cases {
        assert_eq!(
            classify_reply(code, detail),
            Verdict {
                reconnect,
                misconfigured
            },
            "{code} {detail}"
        );
    }
    let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
    assert_eq!(
        classify(&io),
        Verdict {
            reconnect: true,
            misconfigured: None
        }
    );
    let ext = redis::make_extension_error("WRONGPASS".into(), Some("no".into()));
    assert_eq!(classify(&ext).misconfigured, Some(Authentication));
    assert_eq!(
        classify_reply("ERR", "This instance has cluster support disabled").misconfigured,
        Some(NotCluster)
    );
    // On a cluster connection, nothing condemns the connection, and a redirection or a
    // slot without a master is not a misconfiguration.
    for (code, misconfigured) in [
        ("MOVED", None),
        ("CLUSTERDOWN", None),
        ("TRYAGAIN", None),
        ("READONLY", None),
        ("WRONGPASS", Some(Authentication)),
        ("NOPERM", Some(CommandDenied)),
    ] {
        let e = redis::make_extension_error(code.into(), Some("x".into()));
        let verdict = classify_cluster(&e);
        assert_eq!(verdict.misconfigured, misconfigured, "{code}");
        assert!(!verdict.reconnect, "{code}");
    }
    let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
    assert!(!classify_cluster(&io).reconnect);
}

#[test]
fn cluster_masters_are_judged() {
    let info = |mode: &str, role: &str, cluster: u8| {
        format!(
            "redis_version:7.2.0\r\nredis_mode:{mode}\r\nrole:{role}\r\n\
             cluster_enabled:{cluster}\r\n"
        )
    };
    assert!(judge_server(&info("cluster", "master", 1), Role::ClusterMaster).is_ok());
    let kind = |r: Result<(), Failure>| match r {
        Err(Failure::Misconfigured(m)) => Some(m.kind()),
        _ => None,
    };
    assert_eq!(
        kind(judge_server(
            &info("cluster", "master", 1),
            Role::Standalone
        )),
        Some(MisconfigurationKind::Cluster)
    );
    assert_eq!(
        kind(judge_server(
            &info("standalone", "master", 0),
            Role::ClusterMaster
        )),
        Some(MisconfigurationKind::NotCluster)
    );
    assert!(matches!(
        judge_server(&info("cluster", "slave", 1), Role::ClusterMaster),
        Err(Failure::Transient(_))
    ));
}

/// A standalone replica is a mistake in the URL, unless the server served as the store's
/// master before: then it is a failover under way.
#[test]
fn a_demoted_master_is_a_failover() {
    let replica = "redis_version:7.2.0\r\nredis_mode:standalone\r\nrole:slave\r\n";
    assert!(matches!(
        judge_server(replica, Role::Standalone),
        Err(Failure::Misconfigured(m)) if m.kind() == MisconfigurationKind::Replica
    ));
    assert!(matches!(
        judge_server(replica, Role::Demoted),
        Err(Failure::Transient(why)) if why.contains("replica")
    ));
}

#[test]
fn the_probe_covers_every_algorithm() {
    let limits = probe_limits();
    assert_eq!(limits.len(), 5);
    assert_eq!(limits.iter().filter(|l| l.is_concurrency()).count(), 1);
}

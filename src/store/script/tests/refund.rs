//! The refund script's assembly (it runs against a real server in `store::redis::split`).

use super::*;
use crate::store::error::ACL_COMMANDS;
use crate::store::script::refund::{generate as generate_refund, REFUND};

const ALL: &str = "10/s, 5/s log, 20/min fixed, 2 concurrent, 7/3s gcra burst=2, 4/s bucket";

/// Every algorithm, and all of them in one policy, give a complete script for one and several
/// identifiers: no placeholder left, no clock read, nothing but lowering writes.
#[test]
fn every_shape_makes_a_complete_refund_script() {
    for policy in algorithms().map(|a| a.0).into_iter().chain([ALL]) {
        let l = limits(policy);
        for ids in [1, 2, 16] {
            let (text, _) = generate_refund(&l, ids);
            assert!(
                !text.contains('$'),
                "{policy}: a placeholder is left:\n{text}"
            );
            assert_eq!(text.matches("-- identifier ").count(), ids, "{policy}");
            for absent in ["'TIME'", "PSETEX", "PEXPIRE", "ZADD", "ARGV[4]", "ARGV[5]"] {
                assert!(!text.contains(absent), "{policy}: {absent}");
            }
            let packed = Layout::of(&l).has_packed();
            assert_eq!(
                text.contains("redis.call('GET', KEYS[1])"),
                packed,
                "{policy}"
            );
            assert_eq!(
                text.matches("redis.call('SET'").count(),
                if packed { ids } else { 0 },
                "{policy}"
            );
            assert_eq!(
                text.matches("'KEEPTTL')").count(),
                text.matches("redis.call('SET'").count()
            );
        }
    }
    let (text, _) = generate_refund(&limits(ALL), 2);
    // the second identifier's keys start after the first one's three
    assert!(text.contains("local j, base = 2, 3"));
    assert!(text.contains("redis.call('GET', KEYS[4])"));
    assert!(text.contains("redis.call('ZREM', KEYS[base + 3], lease)"));
    assert!(text.contains("redis.call('ZCOUNT', KEYS[base + 2], t, t)"));
    // 7/3s: T = 3e6/7 µs = 428571 + 3/7
    assert!(text.contains("local gu, gr = cost * 428571 + kq - (T - at), kr - kq * 7"));
    assert!(text.contains("if T - T % 60000000 == at - at % 60000000 then"));
}

/// The refund reads and writes the packed state in the check script's format.
#[test]
fn the_packed_state_has_the_check_scripts_format() {
    for policy in ["10/s", "10/s gcra, 5/min fixed", ALL] {
        let l = limits(policy);
        let (_, format) = generate_refund(&l, 1);
        let (_, _, _, wire) = generate(&l, 1);
        let check: String = std::iter::once("<")
            .chain(wire.iter().map(|w| w.code()))
            .collect();
        assert_eq!(format, check, "{policy}");
    }
}

/// Its ARGV: cost, the charge's time, the lease id; the fragments read what the driver
/// declares.
#[test]
fn the_refund_driver_reads_its_arguments() {
    assert_eq!(
        section_names(REFUND),
        ["head", "id_open", "packed_open", "packed_close", "id_close"]
    );
    let head = section(REFUND, "head");
    assert!(head.contains("local cost = tonumber(ARGV[1])"));
    assert!(head.contains("local at = tonumber(ARGV[2])"));
    assert!(head.contains("local lease = ARGV[3]"));
    assert!(section(REFUND, "packed_open").contains("local T, $fields = struct.unpack("));
    assert!(section(CONCURRENCY, "refund").contains("lease"));
}

/// The refund script calls only commands the store's ACL rule grants.
#[test]
fn the_refund_script_needs_no_other_command() {
    let mut texts = vec![REFUND];
    texts.extend(
        algorithms()
            .iter()
            .map(|(_, lua, _)| section(lua, "refund")),
    );
    let mut called = 0;
    for text in texts {
        for piece in text.split("redis.call(").skip(1) {
            let name: String = piece
                .trim_start_matches(['\'', '"'])
                .chars()
                .take_while(|c| c.is_ascii_alphabetic())
                .collect();
            let rule = format!("+{}", name.to_ascii_lowercase());
            assert!(ACL_COMMANDS.split_whitespace().any(|c| c == rule), "{rule}");
            called += 1;
        }
    }
    assert!(called >= 5, "{called}");
}

/// One refund script per policy and number of identifiers, generated once.
#[test]
fn refund_scripts_are_cached_per_policy() {
    let a = refund_script(&limits("11/s, 13/min"), 2);
    let b = refund_script(&limits("11/s, 13/min"), 2);
    assert!(Arc::ptr_eq(&a, &b));
    assert_ne!(
        a.script.get_hash(),
        refund_script(&limits("11/s, 13/h"), 2).script.get_hash()
    );
    // a window's count does not enter its refund: the same text, one script on the server
    assert_eq!(
        a.script.get_hash(),
        refund_script(&limits("11/s, 14/min"), 2).script.get_hash()
    );
    assert_ne!(
        a.script.get_hash(),
        refund_script(&limits("11/s, 13/min"), 3).script.get_hash()
    );
    // not the check script of the same policy
    assert_ne!(
        a.script.get_hash(),
        check_script(&limits("11/s, 13/min"), 2).script.get_hash()
    );
}

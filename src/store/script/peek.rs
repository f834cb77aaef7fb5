//! The peek script: a policy's check without its phase 2, generated from `lua/peek.lua`, the
//! driver's sections and the fragments, for the same KEYS, ARGV and reply as the check (see
//! that file's header). Its reply is read as the check's, then decided by the twin's
//! [`peek`](algorithm::peek).

use std::sync::Arc;

use redis::Value;

use super::{
    agree, cached, fill, fragments_of, limit_vars, read_reply, section, CheckScript, Kind, Reply,
    Shape, Wire, DRIVER, PRELUDE,
};
use crate::algorithm::{self, Layout};
use crate::policy::Limit;
use crate::store::{Outcome, Plan, StoreError};

const PEEK: &str = include_str!("../../../lua/peek.lua");

/// The peek script of `limits` for `ids` identifiers, generated on first use and then cached
/// (apart from the check scripts: the same policy has both).
pub(crate) fn peek_script(limits: &[Limit], ids: usize) -> Arc<CheckScript> {
    cached(Kind::Peek, limits, ids, || generate(limits, ids))
}

/// Reads the peek script's reply: as a check's, the figures derived by the twin's
/// [`peek`](algorithm::peek), whose verdict must agree with the script's.
pub(crate) fn parse_peek_reply(
    reply: Value,
    compiled: &CheckScript,
    plan: &Plan<'_>,
) -> Result<Outcome, StoreError> {
    let Reply {
        allowed,
        now,
        mut states,
        ..
    } = read_reply(reply, compiled, plan, true)?;
    let outcome = algorithm::peek(&mut states, &compiled.layout, plan.limits, now, plan.cost);
    agree(allowed, outcome)
}

/// The peek script of a policy for `ids` identifiers, and what reading its reply needs.
pub(super) fn generate(limits: &[Limit], ids: usize) -> (String, Layout, Vec<usize>, Vec<Wire>) {
    let shape = Shape::of(limits);
    let (common, replies) = shape.common_vars(ids);
    let Shape {
        layout,
        per_id,
        packed,
        sorted,
        wire,
        ..
    } = shape;
    let id_vars = |j: usize| {
        let mut v = common.clone();
        v.push(("j", j.to_string()));
        v.push(("b", ((j - 1) * per_id).to_string()));
        v
    };
    let vars: Vec<_> = (0..limits.len())
        .map(|l| limit_vars(limits, l, layout.key_of(l), false))
        .collect();
    let all: Vec<usize> = (0..limits.len()).collect();

    let mut out = String::with_capacity(4096 * ids);
    let emit = |out: &mut String, file: &str, name: &str, vars: &[(&str, String)]| {
        fill(out, section(file, name), vars)
    };
    emit(&mut out, PEEK, "shebang", &common);
    out.push_str(section(PRELUDE, "clock"));
    emit(&mut out, DRIVER, "head", &common);
    fragments_of(&mut out, limits, &vars, &all, "prepare", false);
    if !packed.is_empty() {
        let read = if ids == 1 { "read_one" } else { "read_many" };
        emit(&mut out, DRIVER, read, &common);
    }
    // phase 1 alone: read and decide
    for j in 1..=ids {
        let v = id_vars(j);
        emit(&mut out, DRIVER, "id_open", &v);
        if !packed.is_empty() {
            emit(&mut out, PEEK, "open", &v);
            fragments_of(&mut out, limits, &vars, &packed, "evaluate", true);
            emit(&mut out, PEEK, "close", &v);
        }
        fragments_of(&mut out, limits, &vars, &sorted, "evaluate", false);
        emit(&mut out, DRIVER, "id_close", &v);
    }
    if sorted.is_empty() {
        let mut v = common.clone();
        v.push(("replies", replies));
        emit(&mut out, DRIVER, "reply_only", &v);
    } else {
        emit(&mut out, PEEK, "reply_open", &common);
        for j in 1..=ids {
            let v = id_vars(j);
            emit(&mut out, DRIVER, "id_open", &v);
            if !packed.is_empty() {
                emit(&mut out, DRIVER, "reply_packed", &v);
            }
            fragments_of(&mut out, limits, &vars, &sorted, "report", false);
            emit(&mut out, DRIVER, "id_close", &v);
        }
        emit(&mut out, DRIVER, "tail", &common);
    }
    (out, layout, packed, wire)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(policy: &str) -> Vec<Limit> {
        policy.parse::<crate::Policy>().unwrap().limits().to_vec()
    }

    /// Every shape generates a complete script that writes nothing: no write command, no
    /// TTL, declared `no-writes` on its first line.
    #[test]
    fn peek_scripts_are_complete_and_read_only() {
        let all = "10/s, 5/s log, 20/min fixed, 2 concurrent, 7/3s gcra burst=2, 4/s bucket";
        for policy in ["10/s", "5/s log", "3 concurrent", "7/3s gcra", all] {
            for ids in [1, 2, 16] {
                let (text, layout, ..) = generate(&limits(policy), ids);
                assert!(text.starts_with("#!lua flags=no-writes\n"), "{policy}");
                assert!(!text.contains('$'), "{policy}: a placeholder is left");
                for write in [
                    "'SET'",
                    "'PSETEX'",
                    "'ZADD'",
                    "'ZREM",
                    "'PEXPIRE'",
                    "'DEL'",
                    "ARGV[3]",
                ] {
                    assert!(!text.contains(write), "{policy}: {write}");
                }
                let reads = text.contains("redis.call('MGET'") || text.contains("redis.call('GET'");
                assert_eq!(reads, layout.has_packed(), "{policy}");
                let sorted = layout.keys_per_id() > usize::from(layout.has_packed());
                let passes = if sorted { 2 } else { 1 };
                assert_eq!(text.matches("-- identifier ").count(), passes * ids);
            }
        }
    }

    #[test]
    fn peek_scripts_are_cached_apart_from_checks() {
        let l = limits("11/s, 13/min log");
        let a = peek_script(&l, 1);
        assert!(Arc::ptr_eq(&a, &peek_script(&l, 1)));
        let check = super::super::check_script(&l, 1);
        assert_ne!(a.script.get_hash(), check.script.get_hash());
    }
}

//! The wire protocol of the Lua scripts, defined once: how the scripts are assembled from
//! `lua/`, what their KEYS and ARGV hold, and how their replies read. A unit test checks these
//! against the Lua files themselves.

use redis::ScriptInvocation;

use super::keyspace;
use super::{Outcome, Plan, StoreError};
use crate::algorithm::Entry;
use crate::policy::Limit;

/// The check script: the shared helpers, one file per algorithm, then the driver.
pub(crate) const CHECK: &str = concat!(
    include_str!("../../lua/prelude.lua"),
    include_str!("../../lua/sliding_log.lua"),
    include_str!("../../lua/sliding_window.lua"),
    include_str!("../../lua/fixed_window.lua"),
    include_str!("../../lua/gcra.lua"),
    include_str!("../../lua/concurrency.lua"),
    include_str!("../../lua/check.lua"),
);

/// The script renewing concurrency leases (with the shared helpers).
pub(crate) const RENEW: &str = concat!(
    include_str!("../../lua/prelude.lua"),
    include_str!("../../lua/renew.lua"),
);

/// The reply: allowed, now, then per key…
const REPLY_HEAD: usize = 2;
/// …remaining, reset_after, retry_after, allowed.
const REPLY_PER_KEY: usize = 4;

/// The time argument: the manual clock's reading, or empty for Redis `TIME`.
pub(crate) fn now_arg(now: Option<u64>) -> String {
    now.map_or(String::new(), |n| n.to_string())
}

/// Fills in the KEYS and ARGV of one check: one key per (identifier, limit) pair,
/// identifier-major; ARGV: now, cost, number of limits, lease id, then per limit its
/// algorithm code, count, window (µs) and largest cost.
pub(crate) fn check_args(
    call: &mut ScriptInvocation<'_>,
    prefix: &str,
    now: Option<u64>,
    plan: &Plan<'_>,
) {
    for id in plan.ids {
        for limit in plan.limits {
            call.key(keyspace::key(prefix, id, limit));
        }
    }
    call.arg(now_arg(now))
        .arg(plan.cost)
        .arg(plan.limits.len())
        .arg(plan.lease);
    for limit in plan.limits {
        limit_args(call, limit);
    }
}

fn limit_args(call: &mut ScriptInvocation<'_>, limit: &Limit) {
    call.arg(limit.algorithm().code())
        .arg(limit.count())
        .arg(limit.window_us())
        .arg(limit.max_cost().min(u64::from(u32::MAX)));
}

/// Reads the check script's reply for `pairs` (identifier, limit) pairs.
pub(crate) fn parse_reply(reply: &[i64], pairs: usize) -> Result<Outcome, StoreError> {
    if reply.len() != REPLY_HEAD + REPLY_PER_KEY * pairs {
        return Err(StoreError::UnexpectedReply(format!(
            "{} integers for {pairs} keys",
            reply.len()
        )));
    }
    let nonneg = |v: i64| {
        u64::try_from(v).map_err(|_| StoreError::UnexpectedReply(format!("negative value {v}")))
    };
    let entries = reply[REPLY_HEAD..]
        .chunks_exact(REPLY_PER_KEY)
        .map(|c| {
            Ok(Entry {
                remaining: nonneg(c[0])?,
                reset_after_us: nonneg(c[1])?,
                retry_after_us: nonneg(c[2])?,
                allowed: c[3] == 1,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    Ok(Outcome {
        allowed: reply[0] == 1,
        entries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Algorithm;

    /// Every algorithm's code is the index its Lua file gives its table, and the driver's
    /// header documents the same numbers.
    #[test]
    fn codes_match_the_lua_tables() {
        let files = [
            (
                Algorithm::SlidingLog,
                include_str!("../../lua/sliding_log.lua"),
            ),
            (
                Algorithm::SlidingWindow,
                include_str!("../../lua/sliding_window.lua"),
            ),
            (
                Algorithm::FixedWindow,
                include_str!("../../lua/fixed_window.lua"),
            ),
            (
                Algorithm::Gcra { burst: 1 },
                include_str!("../../lua/gcra.lua"),
            ),
            (
                Algorithm::TokenBucket { capacity: 1 },
                include_str!("../../lua/gcra.lua"),
            ),
            (
                Algorithm::Concurrency,
                include_str!("../../lua/concurrency.lua"),
            ),
        ];
        let driver = include_str!("../../lua/check.lua");
        for (algorithm, lua) in files {
            let table = format!("ALG[{}] = {{", algorithm.code());
            assert_eq!(lua.matches("ALG[").count(), 1, "{algorithm:?}");
            assert!(lua.contains(&table), "{algorithm:?} is not {table}");
        }
        for doc in [
            "1 sliding log",
            "2 sliding window",
            "3 fixed window",
            "4 GCRA",
            "5 concurrency",
        ] {
            assert!(
                driver.contains(doc),
                "lua/check.lua does not document {doc}"
            );
        }
    }

    /// The driver reads ARGV and builds its reply the way this module lays them out.
    #[test]
    fn layout_matches_the_driver() {
        let driver = include_str!("../../lua/check.lua");
        let read = |needle: &str| assert!(driver.contains(needle), "lua/check.lua lacks {needle}");
        read("local now = clock(ARGV[1])");
        read("local cost = tonumber(ARGV[2])");
        read("local nlimits = tonumber(ARGV[3])");
        read("LEASE = ARGV[4]");
        // four fixed arguments, then four per limit, in limit_args' order
        read("local a = 4 + (l - 1) * 4");
        for field in [
            "alg = ALG[tonumber(ARGV[a + 1])]",
            "n = tonumber(ARGV[a + 2])",
            "w = tonumber(ARGV[a + 3])",
            "burst = tonumber(ARGV[a + 4])",
        ] {
            read(field);
        }
        read("local out = { allowed and 1 or 0, now }");
        assert_eq!(REPLY_HEAD, 2);
        let per_key = driver.matches("out[#out + 1] =").count();
        assert_eq!(per_key, REPLY_PER_KEY);

        let ok = parse_reply(&[1, 7, 2, 900, 0, 1], 1).unwrap();
        assert!(ok.allowed && ok.entries[0].allowed && ok.entries[0].remaining == 2);
        assert!(parse_reply(&[1, 7, 2, 900, 0], 1).is_err());
        assert!(parse_reply(&[1, 7, -2, 900, 0, 1], 1).is_err());
    }

    /// The scripts are assembled from every Lua file in the right order.
    #[test]
    fn scripts_are_assembled_from_the_files() {
        assert!(CHECK.starts_with(include_str!("../../lua/prelude.lua")));
        assert!(CHECK.ends_with(include_str!("../../lua/check.lua")));
        assert!(RENEW.ends_with(include_str!("../../lua/renew.lua")));
    }
}

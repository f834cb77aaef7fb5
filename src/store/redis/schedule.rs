//! The scheduler's calls: one `EVALSHA` of `lua/schedule.lua`'s `schedule` section places an
//! event, one of its `give_back` section returns a slot. Fixed scripts, loaded on `NOSCRIPT`
//! like the check script, never retried after a timeout (the event may have been placed).

use std::sync::OnceLock;

use redis::{Script, Value};

use super::RedisStore;
use crate::algorithm::schedule::{Placement, Rate, Tat};
use crate::store::script::{now_arg, section};
use crate::store::StoreError;

const PRELUDE: &str = include_str!("../../../lua/prelude.lua");
const SCHEDULE: &str = include_str!("../../../lua/schedule.lua");

/// The placing script: the prelude's clock, then the `schedule` section.
fn schedule_script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| {
        let text = format!(
            "{}{}",
            section(PRELUDE, "clock"),
            section(SCHEDULE, "schedule")
        );
        Script::new(&text)
    })
}

/// The give-back script: the `give_back` section alone (it reads no clock).
fn give_back_script() -> &'static Script {
    static SCRIPT: OnceLock<Script> = OnceLock::new();
    SCRIPT.get_or_init(|| Script::new(section(SCHEDULE, "give_back")))
}

/// A queue's end as the script packs it (struct `<dI4`): a little-endian double, exact for
/// integers below 2^53, and a little-endian `u32` remainder (below the count).
fn pack(t: Tat) -> Vec<u8> {
    let mut out = Vec::with_capacity(12);
    out.extend_from_slice(&(t.0 as f64).to_le_bytes());
    out.extend_from_slice(&(t.1 as u32).to_le_bytes());
    out
}

fn unexpected(what: impl Into<String>) -> StoreError {
    StoreError::UnexpectedReply(what.into())
}

fn unpack(bytes: &[u8], rate: &Rate) -> Result<Tat, StoreError> {
    let (us, rem) = match bytes {
        [us @ .., a, b, c, d] if us.len() == 8 => {
            let us = f64::from_le_bytes(us.try_into().unwrap_or_default());
            (us, u64::from(u32::from_le_bytes([*a, *b, *c, *d])))
        }
        _ => {
            return Err(unexpected(format!(
                "a queue state of {} bytes",
                bytes.len()
            )))
        }
    };
    if !(0.0..=9_007_199_254_740_992.0).contains(&us) || us.fract() != 0.0 || rem >= rate.count {
        return Err(unexpected(format!("a queue state of ({us}, {rem})")));
    }
    Ok((us as u64, rem))
}

/// Reads `{placed, wait, drain, before, after}`.
fn parse(reply: Value, rate: &Rate, longest_us: u64) -> Result<Placement, StoreError> {
    let Value::Array(items) = reply else {
        return Err(unexpected(format!("{reply:?}")));
    };
    let int = |v: &Value| match v {
        Value::Int(i) if *i >= 0 => Ok(*i as u64),
        other => Err(unexpected(format!("{other:?} for a number"))),
    };
    let bytes = |v: &Value| match v {
        Value::BulkString(b) => Ok(b.clone()),
        other => Err(unexpected(format!("{other:?} for a state"))),
    };
    let [placed, wait, drain, before, after] = items.as_slice() else {
        return Err(unexpected(format!("a reply of {} items", items.len())));
    };
    let placed = match int(placed)? {
        0 => false,
        1 => true,
        other => return Err(unexpected(format!("{other} for whether it placed"))),
    };
    // The script places only within the longest wait: a longer one would be slept through.
    let wait_us = int(wait)?;
    if placed && wait_us > longest_us {
        return Err(unexpected(format!(
            "a wait of {wait_us} µs for a call that may wait {longest_us} µs"
        )));
    }
    let before = unpack(&bytes(before)?, rate)?;
    Ok(Placement {
        placed,
        wait_us,
        drain_us: int(drain)?,
        before,
        after: if placed {
            unpack(&bytes(after)?, rate)?
        } else {
            before
        },
    })
}

impl RedisStore {
    /// Places an event in the queue at `key`, through the breaker.
    pub(crate) async fn schedule(
        &self,
        key: &str,
        rate: &Rate,
        cost: u64,
        longest_us: u64,
    ) -> Result<Placement, StoreError> {
        let call = async {
            let mut call = schedule_script().prepare_invoke();
            call.key(key)
                .arg(cost)
                .arg(now_arg(self.clock.manual_now()))
                .arg(rate.count)
                .arg(rate.window_us)
                .arg(rate.burst)
                .arg(longest_us);
            let reply: Value = self
                .run(|mut conn| async move { call.invoke_async(&mut conn).await })
                .await?;
            parse(reply, rate, longest_us)
        };
        self.breaker.call(call, || self.prober()).await
    }

    /// Gives a placement's slot back when it is still the last one placed; whether it did.
    pub(crate) async fn give_back(
        &self,
        key: &str,
        placement: &Placement,
    ) -> Result<bool, StoreError> {
        let call = async {
            let mut call = give_back_script().prepare_invoke();
            call.key(key)
                .arg(pack(placement.after))
                .arg(pack(placement.before));
            let done: i64 = self
                .run(|mut conn| async move { call.invoke_async(&mut conn).await })
                .await?;
            Ok(done == 1)
        };
        self.breaker.call(call, || self.prober()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_pack_as_the_script_packs_them() {
        let rate = Rate {
            count: 3,
            window_us: 1_000_000,
            burst: 1,
        };
        let t = (1_767_225_600_333_333, 2);
        assert_eq!(unpack(&pack(t), &rate).unwrap(), t);
        assert!(unpack(&pack((5, 3)), &rate).is_err());
        assert!(unpack(&[0; 11], &rate).is_err());
    }

    /// A reply the script cannot have written is an error, not a placement: a wait past the
    /// longest the call may wait (it would be slept through), a "placed" neither 0 nor 1.
    #[test]
    fn replies_the_script_cannot_write_are_errors() {
        let rate = Rate {
            count: 3,
            window_us: 1_000_000,
            burst: 1,
        };
        let state = pack((1_767_225_600_333_333, 2));
        let reply = |placed: i64, wait: i64| {
            Value::Array(vec![
                Value::Int(placed),
                Value::Int(wait),
                Value::Int(0),
                Value::BulkString(state.clone()),
                Value::BulkString(state.clone()),
            ])
        };
        let placement = parse(reply(1, 500_000), &rate, 500_000).unwrap();
        assert!(placement.placed);
        assert_eq!(placement.wait_us, 500_000);
        assert!(!parse(reply(0, 900_000), &rate, 500_000).unwrap().placed);
        assert!(parse(reply(1, 500_001), &rate, 500_000).is_err());
        assert!(parse(reply(2, 0), &rate, 500_000).is_err());
        assert!(parse(reply(-1, 0), &rate, 500_000).is_err());
    }

    #[test]
    fn the_scripts_are_the_sections_of_the_lua_file() {
        assert!(section(SCHEDULE, "schedule").contains("redis.call('PSETEX'"));
        assert!(section(SCHEDULE, "give_back").contains("'KEEPTTL'"));
        // the placing script reads its clock from ARGV[2], as the check script does
        assert!(section(PRELUDE, "clock").contains("ARGV[2]"));
    }
}

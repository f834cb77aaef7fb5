//! The check script's second form, for a check that may wait (`lua/reserve.lua`): each
//! limit's retry section, the longest wait in ARGV, and the wait the reply carries.

use super::ScriptArgs;

use super::{fill, now_arg, section, stamp, unexpected, RESERVE};
use crate::algorithm::rolling_window;
use crate::policy::Limit;
use crate::store::StoreError;

/// The section of `reserve.lua` that says when a denying `limit` admits (empty for an
/// algorithm that has none: its pairs then never make a check wait). A rolling window has one
/// per form, as its fragments do.
fn retry(limit: &Limit) -> &'static str {
    match limit.algorithm().code() {
        1 => section(RESERVE, "retry_sliding_log"),
        2 => section(RESERVE, "retry_sliding_window"),
        3 => section(RESERVE, "retry_fixed_window"),
        4 => section(RESERVE, "retry_gcra"),
        6 if rolling_window::base(limit).is_some() => section(RESERVE, "retry_rolling_window"),
        6 => section(RESERVE, "retry_rolling_window_wide"),
        _ => "",
    }
}

/// Emits each limit in `ls`'s retry section (see [`retry`]), in a block of its own when
/// `scoped`.
pub(super) fn retries_of(
    out: &mut String,
    limits: &[Limit],
    vars: &[Vec<(&str, String)>],
    ls: &[usize],
    scoped: bool,
) {
    for &l in ls {
        let text = retry(&limits[l]);
        if text.trim().is_empty() {
            continue;
        }
        if scoped {
            out.push_str("do\n");
        }
        fill(out, text, &vars[l]);
        if scoped {
            out.push_str("end\n");
        }
    }
}

/// The longest wait of a check that may wait, after `check_args`'s: the time argument first
/// when `check_args` left it out. Only for a script generated `reserving`.
pub(crate) fn reserve_arg(call: &mut impl ScriptArgs, now: Option<u64>, max_wait_us: u64) {
    if now.is_none() {
        call.arg(now_arg(now));
    }
    call.arg(max_wait_us);
}

/// Reads the time the script stamped its reply with, `SECONDS,MICROSECONDS`, and the wait
/// of a check admitted as of a later time (`,WAIT` after it; 0 without).
pub(super) fn stamp_and_wait(text: &[u8]) -> Result<(u64, u64), StoreError> {
    let text = std::str::from_utf8(text).map_err(|_| unexpected("a time that is not text"))?;
    match text.splitn(3, ',').nth(2) {
        None => Ok((stamp(text.as_bytes())?, 0)),
        Some(wait) => {
            let time = &text[..text.len() - wait.len() - 1];
            let bad = || unexpected(format!("a wait of {wait:?}"));
            let wait = wait.parse::<u64>().map_err(|_| bad())?;
            let time = stamp(time.as_bytes())?;
            // the time admitted at, `time + wait`, must be a time
            time.checked_add(wait)
                .filter(|&at| at <= super::MAX_TIME_US)
                .ok_or_else(bad)?;
            Ok((time, wait))
        }
    }
}

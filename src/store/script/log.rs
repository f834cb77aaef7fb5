//! The sliding log's record in the check script's reply (`lua/sliding_log.lua`): what the
//! script read of the log, as text, from which the twin works out the figures.

use super::{unexpected, MAX_EXACT};
use crate::algorithm::sliding_log::{self, Seen};
use crate::algorithm::Entry;
use crate::policy::Limit;
use crate::store::StoreError;

/// Reads the record at the start of `bytes`, `<used>,<entry>,<newest>;` (see the header of
/// `lua/sliding_log.lua`); returns the figures of `limit` the twin derives from it at `now`
/// (the time the script decided at), with `cost` charged when `charged`, and the bytes left
/// after the record.
pub(super) fn read<'a>(
    bytes: &'a [u8],
    limit: &Limit,
    now: u64,
    cost: u64,
    charged: bool,
) -> Result<(Entry, &'a [u8]), StoreError> {
    let end = bytes
        .iter()
        .position(|&b| b == b';')
        .ok_or_else(|| unexpected("a log record without its end"))?;
    let text = std::str::from_utf8(&bytes[..end])
        .map_err(|_| unexpected("a log record that is not text"))?;
    let bad = || unexpected(format!("a log record of {text:?}"));
    let mut fields = text.split(',');
    let (Some(used), Some(leaving), Some(newest), None) =
        (fields.next(), fields.next(), fields.next(), fields.next())
    else {
        return Err(bad());
    };
    let seen = Seen {
        used: optional(used, number).ok_or_else(bad)?,
        leaving: optional(leaving, time).ok_or_else(bad)?,
        newest: optional(newest, time).ok_or_else(bad)?,
    };
    // the entry that must leave is live: the newest is there too, and a cost of 1 counted
    // nothing only when it was denied
    if seen.leaving.is_some() && seen.newest.is_none()
        || seen.used.is_none() && (seen.leaving.is_none() || cost != 1)
    {
        return Err(bad());
    }
    let entry = sliding_log::settle(seen, limit, now, cost, charged);
    Ok((entry, &bytes[end + 1..]))
}

/// `None` for an empty field, else the field read by `read` (`None` inside when it reads
/// nothing).
fn optional(field: &str, read: fn(&str) -> Option<u64>) -> Option<Option<u64>> {
    match field {
        "" => Some(None),
        f => read(f).map(Some),
    }
}

/// A count or a time: decimal digits, exact as a double.
fn number(text: &str) -> Option<u64> {
    if text.is_empty() || text.len() > 16 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok().filter(|&v| v as f64 <= MAX_EXACT)
}

/// The time of a member, `<time>-<k>`.
fn time(member: &str) -> Option<u64> {
    let (t, k) = member.split_once('-')?;
    number(k)?;
    number(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(policy: &str) -> Limit {
        policy.parse::<crate::Policy>().unwrap().limits()[0]
    }

    #[test]
    fn records_are_read_through_the_twin() {
        let l = limit("5/s log");
        let now = 10_000_000;
        // two live entries, the newest 0.2 s ago, charged one more
        let (e, rest) = read(b"2,,9800000-1;xy", &l, now, 1, true).unwrap();
        assert_eq!(rest, b"xy");
        assert_eq!(
            e,
            Entry {
                allowed: true,
                remaining: 2,
                reset_after_us: 1_000_000,
                retry_after_us: 0
            }
        );
        // the same, not charged (a peek, or another limit denied)
        let (e, _) = read(b"2,,9800000-1;", &l, now, 1, false).unwrap();
        assert_eq!((e.remaining, e.reset_after_us), (3, 800_000));
        // denied at a cost of 1: the entry at 9.3 s leaves the window at 10.3 s
        let (e, _) = read(b",9300000-2,9900000-1;", &l, now, 1, false).unwrap();
        assert_eq!(
            e,
            Entry {
                allowed: false,
                remaining: 0,
                reset_after_us: 900_000,
                retry_after_us: 300_000
            }
        );
        // denied at a cost of 3 with 4 live
        let (e, _) = read(b"4,9300000-1,9900000-1;", &l, now, 3, false).unwrap();
        assert_eq!((e.allowed, e.remaining), (false, 1));
        // a missing key, charged
        let (e, _) = read(b"0,,;", &l, now, 2, true).unwrap();
        assert_eq!((e.remaining, e.reset_after_us), (3, 1_000_000));
        let (e, _) = read(b"0,,;", &l, now, 2, false).unwrap();
        assert_eq!((e.remaining, e.reset_after_us), (5, 0));
    }

    #[test]
    fn malformed_records_are_errors() {
        let l = limit("5/s log");
        for bad in [
            &b"2,,9800000-1"[..],
            b"2,9800000-1;",
            b"2,,9800000-1,;",
            b"-2,,;",
            b"2.5,,;",
            b"x,,;",
            b"2,,9800000;",
            b"2,,-1;",
            b"2,9300000-1,;",
            b",,9900000-1;",
            b",9300000-1,9900000-1;",
            b"99999999999999999,,;",
            b"\xff,,;",
        ] {
            let cost = if bad == b",9300000-1,9900000-1;" {
                2
            } else {
                1
            };
            assert!(read(bad, &l, 10_000_000, cost, false).is_err(), "{bad:?}");
        }
    }
}

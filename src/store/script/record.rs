//! The records of the sorted sets in the check script's reply (`lua/sliding_log.lua`,
//! `lua/concurrency.lua`): what the script read of each, as text ending in `;`, from which
//! the twin works out the figures.

use super::{unexpected, MAX_EXACT};
use crate::algorithm::sliding_log::{self, Seen};
use crate::algorithm::{concurrency, Entry};
use crate::policy::{Algorithm, Limit};
use crate::store::StoreError;

/// Reads the record of the sorted-set limit `limit` at the start of `bytes`; returns its
/// figures, which the twin derives at `now` (the time the script decided at) with `cost`
/// charged when `charged`, and the bytes left after the record.
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
        .ok_or_else(|| unexpected("a record without its end"))?;
    let text =
        std::str::from_utf8(&bytes[..end]).map_err(|_| unexpected("a record that is not text"))?;
    let entry = match limit.algorithm() {
        Algorithm::Concurrency => leases(text, limit, now, charged),
        _ => log(text, limit, now, cost, charged),
    }
    .ok_or_else(|| unexpected(format!("a record of {text:?}")))?;
    Ok((entry, &bytes[end + 1..]))
}

/// A sliding log's record, `<used>,<entry>,<newest>;`.
fn log(text: &str, limit: &Limit, now: u64, cost: u64, charged: bool) -> Option<Entry> {
    let mut fields = text.split(',');
    let (Some(used), Some(leaving), Some(newest), None) =
        (fields.next(), fields.next(), fields.next(), fields.next())
    else {
        return None;
    };
    let seen = Seen {
        used: optional(used, number)?,
        leaving: optional(leaving, time)?,
        newest: optional(newest, time)?,
    };
    // the entry that must leave is live: the newest is there too, and a cost of 1 counted
    // nothing only when it was denied
    if seen.leaving.is_some() && seen.newest.is_none()
        || seen.used.is_none() && (seen.leaving.is_none() || cost != 1)
    {
        return None;
    }
    Some(sliding_log::settle(seen, limit, now, cost, charged))
}

/// A concurrency limit's record, `<used>,<deadline>;`: one of the two.
fn leases(text: &str, limit: &Limit, now: u64, charged: bool) -> Option<Entry> {
    let (used, first) = text.split_once(',')?;
    let (used, first) = (optional(used, number)?, optional(first, score)?);
    if used.is_some() == first.is_some() {
        return None;
    }
    Some(concurrency::settle(used, first, limit, now, charged))
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

/// A score as Redis writes it: an integer exact as a double.
fn score(text: &str) -> Option<u64> {
    let v: f64 = text.parse().ok()?;
    ((0.0..=MAX_EXACT).contains(&v) && v.fract() == 0.0).then_some(v as u64)
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
    fn log_records_are_read_through_the_twin() {
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
    fn malformed_log_records_are_errors() {
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

#[cfg(test)]
mod lease_tests {
    use super::*;

    #[test]
    fn lease_records_are_read_through_the_twin() {
        let l = "3 concurrent lease=10s"
            .parse::<crate::Policy>()
            .unwrap()
            .limits()[0];
        let now = 10_000_000;
        let (e, rest) = read(b"1,;", &l, now, 1, true).unwrap();
        assert!(rest.is_empty());
        assert_eq!((e.allowed, e.remaining, e.retry_after_us), (true, 1, 0));
        let (e, _) = read(b"1,;", &l, now, 1, false).unwrap();
        assert_eq!(e.remaining, 2);
        // denied: the earliest deadline in 0.4 s, or in a second at the latest
        let (e, _) = read(b",10400000;", &l, now, 1, false).unwrap();
        assert_eq!(
            e,
            Entry {
                allowed: false,
                remaining: 0,
                reset_after_us: 0,
                retry_after_us: 400_000
            }
        );
        let (e, _) = read(b",15000000;", &l, now, 1, false).unwrap();
        assert_eq!(e.retry_after_us, 1_000_000);
        for bad in [
            &b"1,10400000;"[..],
            b",;",
            b"1;",
            b"1,,;",
            b",1.5;",
            b",-3;",
            b"1,",
        ] {
            assert!(read(bad, &l, now, 1, false).is_err(), "{bad:?}");
        }
    }
}

//! Store keys: `PREFIX:{IDENTIFIER}:LIMIT,LIMIT…` for an identifier's packed key (every
//! window and GCRA limit of a policy in one string: `tollgate:{ip:1.2.3.4}:w10/1s,w120/1m`),
//! `PREFIX:{IDENTIFIER}:LIMIT` for a sorted set (a sliding log, a concurrency limit:
//! `tollgate:{ip:1.2.3.4}:l10/1s`).
//!
//! * All keys of one identifier share the `{hash tag}`, so in Redis Cluster they live in one
//!   slot.
//! * The identifier is escaped so that user input cannot close the tag or collide with another
//!   identifier: `%`, `{`, `}` and `#` become `%25`, `%7B`, `%7D` and `%23`. Escaping is
//!   injective, and the prefix may not contain braces, so the key determines prefix,
//!   identifier and limit uniquely.
//! * An identifier longer than [`MAX_PLAIN_ID`] bytes (once escaped) is replaced by `#` and its
//!   SHA-1 in hex: a 10 KB header value costs 41 bytes of key, not 10 KB, in every key and
//!   every memory-store entry. `#` cannot start an escaped identifier, so hashed and plain
//!   identifiers never meet; two long identifiers would need a SHA-1 collision to share state,
//!   which gives the party who forged it nothing but sharing its own budget.
//! * The limit part names the algorithm and all its parameters — for the packed key, of every
//!   limit it holds, in order — so that changing a policy starts new state instead of reading
//!   state of another shape. A packed key names only window and GCRA limits, a sorted set one
//!   log or concurrency limit, so the two never meet; names are short, because Redis hashes
//!   and copies them in every command.

use std::fmt::Write;

use crate::policy::{Algorithm, Limit};

/// Identifiers longer than this (escaped) are hashed.
pub(crate) const MAX_PLAIN_ID: usize = 128;

/// Escapes (or hashes) an identifier for use inside a hash tag.
pub(crate) fn escape_identifier(id: &str) -> String {
    let mut out = String::with_capacity(id.len().min(MAX_PLAIN_ID + 8));
    escape_identifier_into(&mut out, id);
    out
}

/// [`escape_identifier`] into `out`, replacing what it held (a buffer reused from check to
/// check does not allocate once it is large enough).
pub(crate) fn escape_identifier_into(out: &mut String, id: &str) {
    out.clear();
    // The usual identifier has nothing to escape and is short: copied whole.
    if id.len() <= MAX_PLAIN_ID && !id.bytes().any(|b| matches!(b, b'%' | b'{' | b'}' | b'#')) {
        out.push_str(id);
        return;
    }
    for c in id.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            '#' => out.push_str("%23"),
            c => out.push(c),
        }
        if out.len() > MAX_PLAIN_ID {
            let digest = sha1_smol::Sha1::from(id.as_bytes()).digest();
            out.clear();
            let _ = write!(out, "#{digest}");
            return;
        }
    }
}

/// The limit part of a key, e.g. `w10/1s` (sliding window, 10 per second), `g3/1300msb2`
/// (GCRA, 3 per 1.3 s, burst 2): the algorithm's letter, the count, `/`, the window in its
/// largest whole unit (`d`, `h`, `m`, `s` or `ms`), then a bucket's or GCRA's burst after `b`.
/// Every limit has exactly one such name, and the name gives the limit back.
fn limit_tag(out: &mut String, limit: &Limit) {
    let algorithm = limit.algorithm();
    let burst = match algorithm {
        Algorithm::TokenBucket { capacity } => Some(capacity),
        Algorithm::Gcra { burst } => Some(burst),
        _ => None,
    };
    let letter = algorithm.key_letter();
    let ms = limit.window_us() / 1000;
    let (n, unit) = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1000, "s"),
    ]
    .into_iter()
    .find(|(u, _)| ms.is_multiple_of(*u))
    .map_or((ms, "ms"), |(u, name)| (ms / u, name));
    let _ = write!(out, "{letter}{}/{n}{unit}", limit.count());
    if let Some(b) = burst {
        let _ = write!(out, "b{b}");
    }
}

/// Builds the key of one (identifier, limit) pair; `escaped` comes from [`escape_identifier`].
pub(crate) fn key(prefix: &str, escaped: &str, limit: &Limit) -> String {
    let mut out = String::with_capacity(prefix.len() + escaped.len() + 32);
    out.push_str(prefix);
    out.push_str(":{");
    out.push_str(escaped);
    out.push_str("}:");
    limit_tag(&mut out, limit);
    out
}

/// Builds the packed key of an identifier for `limits` (the policy's window and GCRA limits,
/// in order); `escaped` comes from [`escape_identifier`].
pub(crate) fn packed_key<'a>(
    prefix: &str,
    escaped: &str,
    limits: impl IntoIterator<Item = &'a Limit>,
) -> String {
    let mut out = String::with_capacity(prefix.len() + escaped.len() + 64);
    out.push_str(prefix);
    out.push_str(":{");
    out.push_str(escaped);
    out.push_str("}:");
    for (i, limit) in limits.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        limit_tag(&mut out, limit);
    }
    out
}

/// Whether `prefix` is usable: not empty, no braces (they would break the hash tag).
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn valid_prefix(prefix: &str) -> bool {
    !prefix.is_empty() && !prefix.contains(['{', '}'])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn identifiers_cannot_inject_tags_or_collide() {
        let limit = Limit::per_second(10).unwrap();
        let ids = [
            "a",
            "a}",
            "{a}",
            "a%7D",
            "a%257D",
            "#a",
            "%23a",
            "",
            "}",
            "{",
            "a:b",
            "a}:w10/1s",
        ];
        let keys: HashSet<String> = ids
            .iter()
            .map(|id| key("rl", &escape_identifier(id), &limit))
            .collect();
        assert_eq!(keys.len(), ids.len());
        for k in &keys {
            // exactly one hash tag, and it is the identifier's
            assert_eq!(k.matches('{').count(), 1, "{k}");
            assert_eq!(k.matches('}').count(), 1, "{k}");
        }
        assert_eq!(
            key("rl", &escape_identifier("ip:1.2.3.4"), &limit),
            "rl:{ip:1.2.3.4}:w10/1s"
        );
    }

    #[test]
    fn long_identifiers_are_hashed_and_distinct() {
        let a = "x".repeat(10 * 1024);
        let mut b = a.clone();
        b.push('y');
        let (ea, eb) = (escape_identifier(&a), escape_identifier(&b));
        assert_eq!(ea.len(), 41);
        assert!(ea.starts_with('#'));
        assert_ne!(ea, eb);
        // at the boundary: 128 plain bytes stay plain, 129 are hashed
        assert_eq!(escape_identifier(&"y".repeat(128)), "y".repeat(128));
        assert!(escape_identifier(&"y".repeat(129)).starts_with('#'));
        // escaping counts: 43 braces escape to 129 bytes
        assert!(escape_identifier(&"{".repeat(43)).starts_with('#'));
    }

    #[test]
    fn packed_keys_name_every_limit_and_never_meet_single_limit_keys() {
        let policy: crate::Policy = "10/s, 120/min, 240/h".parse().unwrap();
        let id = escape_identifier("ip:1.2.3.4");
        let packed = packed_key("rl", &id, policy.limits());
        assert_eq!(packed, "rl:{ip:1.2.3.4}:w10/1s,w120/1m,w240/1h");
        let log = Limit::per_second(10)
            .unwrap()
            .with_algorithm(Algorithm::SlidingLog)
            .unwrap();
        assert_eq!(key("rl", &id, &log), "rl:{ip:1.2.3.4}:l10/1s");
        // another policy, another key
        let other: crate::Policy = "10/s, 120/min".parse().unwrap();
        assert_ne!(packed_key("rl", &id, other.limits()), packed);
    }

    #[test]
    fn limit_names_are_short_and_one_to_one() {
        let names: Vec<String> = [
            "1/ms",
            "1/1000ms",
            "1/1001ms",
            "1/60s",
            "1/61s",
            "1/90min",
            "1/24h",
            "1/25h",
            "1/2d",
            "3/1300ms gcra burst=2",
            "3/1300ms bucket capacity=2",
            "3/1300ms gcra burst=21",
            "31/300ms gcra burst=2",
            "3 concurrent",
            "3 concurrent lease=90s",
        ]
        .iter()
        .map(|p| {
            let limit: Limit = p.parse().unwrap();
            let mut out = String::new();
            limit_tag(&mut out, &limit);
            out
        })
        .collect();
        assert_eq!(names[..4], ["w1/1ms", "w1/1s", "w1/1001ms", "w1/1m"]);
        assert_eq!(names[9], "g3/1300msb2");
        let distinct: HashSet<&String> = names.iter().collect();
        assert_eq!(distinct.len(), names.len(), "{names:?}");
    }

    #[test]
    fn prefixes_without_braces_only() {
        assert!(valid_prefix("tollgate"));
        assert!(valid_prefix("app:v2"));
        assert!(!valid_prefix(""));
        assert!(!valid_prefix("a{b"));
    }
}

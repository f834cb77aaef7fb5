//! Store keys: `PREFIX:{IDENTIFIER}:LIMIT,LIMIT…` for an identifier's packed key (every
//! window and GCRA limit of a policy in one string: `tollgate:{ip:1.2.3.4}:r1s,r1m`),
//! `PREFIX:{IDENTIFIER}:LIMIT` for a sorted set (a sliding log, a concurrency limit:
//! `tollgate:{ip:1.2.3.4}:l1s`, `tollgate:{ip:1.2.3.4}:c`).
//!
//! * All keys of one identifier share the `{hash tag}`, so in Redis Cluster they live in one
//!   slot.
//! * The identifier is escaped so that user input cannot close the tag or collide with another
//!   identifier: `%`, `{`, `}` and `#` become `%25`, `%7B`, `%7D` and `%23`. Escaping is
//!   injective, and the prefix may not contain braces, so the key determines prefix,
//!   identifier and limit part uniquely.
//! * The empty identifier is written `%`, which escaping never writes alone: `{}` would be an
//!   empty hash tag, which Redis ignores, hashing the whole key, so that the identifier's keys
//!   would lie in several slots.
//! * An identifier longer than [`MAX_PLAIN_ID`] bytes (once escaped) is replaced by `#` and its
//!   SHA-1 in hex: a 10 KB header value costs 41 bytes of key, not 10 KB, in every key and
//!   every memory-store entry. `#` cannot start an escaped identifier, so hashed and plain
//!   identifiers never meet; two long identifiers would need a SHA-1 collision to share state,
//!   which gives the party who forged it nothing but sharing its own budget.
//! * A packed key names only window and GCRA limits, a sorted set one log or concurrency
//!   limit, so the two never meet; names are short, because Redis hashes and copies them in
//!   every command.
//!
//! # What a limit's name holds, and what carries over a policy change
//!
//! A limit's part of a key names what its state *means*, and nothing else, so that a policy
//! change keeps the state of every limit whose state still means the same (both stores, since
//! both name their state this way):
//!
//! * **sliding window, fixed window, sliding log**: the algorithm and the window (`w1s`,
//!   `f1m`, `l1s`), not the count. Their state — counts per window, entry times — is what was
//!   charged, whatever the count: `10/min` raised to `12/min` with 8 used admits 4 more, and
//!   lowered to `5/min` denies until the usage falls below 5.
//! * **concurrency**: `c` alone. Its state is the slots held, each with its own deadline; a
//!   new count or lease applies to the slots taken from then on.
//! * **token bucket, GCRA**: the algorithm, count and window (`g3/1300ms`), not the burst (or
//!   capacity). The state is a theoretical arrival time kept in steps of `window / count`
//!   (the fraction in units of `1 / count` µs): it means the same whatever the burst, which
//!   only decides how far ahead of now it may run, but another rate would read it wrongly.
//!   A rate change starts afresh.
//! * A changed window or algorithm starts afresh; the old state expires by itself.
//!
//! Every window and GCRA limit of a policy lives in the one packed key, whose name lists
//! theirs in order: they carry over together, when each keeps its name, or start afresh
//! together, when one changes or one is added or removed among them. Two sliding logs of
//! one policy with the same window (`10/s log, 20/s log`) would share a name: there, and only
//! there, the name holds the count too (`l10/1s`), so each has its set.
//!
//! The price: two limiters on one store whose limits share a name (`100/min` on one route,
//! `10/min` on another, or two concurrency limits) share that state for an identifier, as
//! two equal limits always did.
//!
//! # Namespaces
//!
//! Limiters that must count apart each take a [`Namespace`]
//! ([`LimiterBuilder::namespace`](crate::LimiterBuilder::namespace)), and schedulers whose
//! queues must stay apart too
//! ([`SchedulerBuilder::namespace`](crate::SchedulerBuilder::namespace)), which goes between the
//! hash tag and the limit part of every key: `PREFIX:{IDENTIFIER}:NAMESPACE:LIMIT…`
//! (`tollgate:{ip:1.2.3.4}:login:r1m`). The hash tag, and so the Cluster slot, stays the
//! identifier's. No limit part holds a `:` and no namespace may, so the part after the tag is
//! either a limit part alone (the shared space) or one namespace, `:`, and a limit part: keys
//! of two namespaces, or of a namespace and the shared space, never meet. A namespace is
//! limiter-wide and outlives policy changes, so what carries over above carries over in it.

use std::cell::{Cell, RefCell};
use std::fmt::{self, Write};
use std::str::FromStr;
use std::sync::Arc;

use super::{ConfigError, ConfigErrorKind};
use crate::algorithm;
use crate::algorithm::schedule::Rate;
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
    push_escaped(out, id);
}

/// Whether `id` holds a byte its escaping replaces (`%`, `{`, `}` or `#`), eight bytes at a
/// time: a byte equal to one of them is a zero byte of the word XORed with that byte repeated,
/// and `(w - 0x01…01) & !w & 0x80…80` is not zero exactly when the word `w` has a zero byte.
/// A byte at a time (a table lookup or a comparison a byte), `ip:10.0.0.1` took about 75
/// instructions to check, where this takes about 30, on every check.
fn needs_escaping(id: &[u8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    fn has_escaped_byte(word: u64) -> bool {
        let zero_byte = |w: u64| w.wrapping_sub(ONES) & !w & HIGHS;
        let with = |byte: u8| zero_byte(word ^ (ONES * u64::from(byte)));
        (with(b'%') | with(b'{') | with(b'}') | with(b'#')) != 0
    }
    let word = |bytes: &[u8]| {
        let mut word = [0; 8];
        word.copy_from_slice(bytes);
        u64::from_ne_bytes(word)
    };
    if id.len() < 8 {
        return id.iter().any(|&b| matches!(b, b'%' | b'{' | b'}' | b'#'));
    }
    let mut words = id.chunks_exact(8);
    if words.any(|w| has_escaped_byte(word(w))) {
        return true;
    }
    // the last eight bytes, which overlap the last whole word when the length is not a
    // multiple of eight
    has_escaped_byte(word(&id[id.len() - 8..]))
}

/// Whether `id` is written into a key as it is: not empty, short, nothing to escape.
#[inline]
pub(crate) fn is_plain(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_PLAIN_ID && !needs_escaping(id.as_bytes())
}

/// [`escape_identifier`], appended to `out` (a key being built).
pub(crate) fn push_escaped(out: &mut String, id: &str) {
    // The usual identifier has nothing to escape and is short: copied whole.
    if is_plain(id) {
        out.push_str(id);
        return;
    }
    if id.is_empty() {
        // An empty hash tag is no tag (Redis hashes the whole key then): the empty identifier
        // is a lone `%`, which escaping never writes (it writes `%` only before two hex
        // digits).
        out.push('%');
        return;
    }
    let start = out.len();
    for c in id.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            '#' => out.push_str("%23"),
            c => out.push(c),
        }
        if out.len() - start > MAX_PLAIN_ID {
            let digest = sha1_smol::Sha1::from(id.as_bytes()).digest();
            out.truncate(start);
            let _ = write!(out, "#{digest}");
            return;
        }
    }
}

/// The limit part of a key: the algorithm's letter, then the window in its largest whole
/// unit (`d`, `h`, `m`, `s` or `ms`) — `r1s` (rolling window over a second; `R1s` for a count over 1550, whose ring has
/// another shape), `w1s` (sliding window), `f1m`, `l90m` —
/// with the count before it (`g3/1300ms`) for a bucket or GCRA, or when `count` asks for it;
/// a concurrency limit is `c`. See the module documentation for why.
fn limit_tag(out: &mut String, limit: &Limit, count: bool) {
    let algorithm = limit.algorithm();
    if algorithm == Algorithm::RollingWindow && algorithm::rolling_window::base(limit).is_none() {
        // the wide form of the rolling window (counts over 1550) keeps its ring in another
        // shape: another name
        out.push('R');
    } else {
        out.push(algorithm.key_letter());
    }
    if algorithm == Algorithm::Concurrency {
        return;
    }
    let rate = matches!(
        algorithm,
        Algorithm::TokenBucket { .. } | Algorithm::Gcra { .. }
    );
    if count || rate {
        let _ = write!(out, "{}/", limit.count());
    }
    window_tag(out, limit.window_us());
}

/// A window in its largest whole unit (`d`, `h`, `m`, `s` or `ms`): `1s`, `90m`, `1300ms`.
fn window_tag(out: &mut String, window_us: u64) {
    let ms = window_us / 1000;
    let (n, unit) = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1000, "s"),
    ]
    .into_iter()
    .find(|(u, _)| ms.is_multiple_of(*u))
    .map_or((ms, "ms"), |(u, name)| (ms / u, name));
    let _ = write!(out, "{n}{unit}");
}

/// Where a store key starts: `PREFIX:{IDENTIFIER}:`, then `NAMESPACE:` when the limiter has
/// one; room is made for `tail` more bytes.
fn key_head(prefix: &str, escaped: &str, namespace: Option<&str>, tail: usize) -> String {
    let ns = namespace.map_or(0, |n| n.len() + 1);
    let mut out = String::with_capacity(prefix.len() + escaped.len() + ns + 4 + tail);
    head_into(&mut out, prefix, escaped, namespace);
    out
}

/// Writes the part of a key before its limits into `out` (cleared first).
fn head_into(out: &mut String, prefix: &str, escaped: &str, namespace: Option<&str>) {
    out.clear();
    out.push_str(prefix);
    out.push_str(":{");
    out.push_str(escaped);
    close_tag_into(out, namespace);
}

/// Appends what follows the identifier before the limit part: `}:`, then `NAMESPACE:` when
/// the limiter has one.
fn close_tag_into(out: &mut String, namespace: Option<&str>) {
    out.push_str("}:");
    if let Some(namespace) = namespace {
        out.push_str(namespace);
        out.push(':');
    }
}

/// Builds the key of one (identifier, limit) pair in `namespace` (none: the store's shared
/// space); `escaped` comes from [`escape_identifier`].
pub(crate) fn key(prefix: &str, escaped: &str, namespace: Option<&str>, limit: &Limit) -> String {
    let mut out = key_head(prefix, escaped, namespace, 16);
    limit_tag(&mut out, limit, false);
    out
}

/// Builds the packed key of an identifier for `limits` (the policy's window and GCRA limits,
/// in order) in `namespace`; `escaped` comes from [`escape_identifier`].
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn packed_key<'a>(
    prefix: &str,
    escaped: &str,
    namespace: Option<&str>,
    limits: impl IntoIterator<Item = &'a Limit>,
) -> String {
    let mut out = key_head(prefix, escaped, namespace, 48);
    for (i, limit) in limits.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        limit_tag(&mut out, limit, false);
    }
    out
}

/// Every key of one identifier for a policy's `limits`, as [`Layout`] orders them: the packed
/// key (when the policy has window or GCRA limits), then one key per sorted-set limit, in
/// policy order, all in `namespace`; `escaped` comes from [`escape_identifier`].
///
/// [`Layout`]: crate::algorithm::Layout
pub(crate) fn keys_of(
    prefix: &str,
    escaped: &str,
    namespace: Option<&str>,
    limits: &[Limit],
) -> Vec<String> {
    let mut keys = Vec::with_capacity(limits.len());
    each_key(prefix, escaped, namespace, limits, |key| {
        keys.push(key.to_owned())
    });
    keys
}

/// [`keys_of`], each key given to `f` in turn, built in a buffer reused from call to call on
/// the thread: a script call copies its keys anyway, and need not own them first.
///
/// A key is the prefix, `:{`, the identifier, and a tail that depends on the namespace and
/// the limits alone; the tails of the last few (namespace, limits) pairs seen on the thread
/// are kept, so that a check of the same policy as one before it writes no limit's name again.
pub(crate) fn each_key(
    prefix: &str,
    escaped: &str,
    namespace: Option<&str>,
    limits: &[Limit],
    mut f: impl FnMut(&str),
) {
    thread_local! {
        static BUFFER: Cell<String> = const { Cell::new(String::new()) };
        static TAILS: RefCell<Tails> = RefCell::default();
    }
    // `try_with`: on a thread being torn down, a buffer of its own.
    let mut out = BUFFER.try_with(Cell::take).unwrap_or_default();
    let mut emit = |tails: &[String]| {
        for tail in tails {
            out.clear();
            out.push_str(prefix);
            out.push_str(":{");
            out.push_str(escaped);
            out.push_str(tail);
            f(&out);
        }
    };
    // The memo cannot be borrowed already (nothing here checks again), but if it were, or on
    // a thread being torn down, the tails are worked out for this call alone.
    let memo = TAILS.try_with(|memo| match memo.try_borrow_mut() {
        Ok(mut memo) => emit(memo.of(namespace, limits)),
        Err(_) => emit(&tails_of(namespace, limits)),
    });
    if memo.is_err() {
        emit(&tails_of(namespace, limits));
    }
    let _ = BUFFER.try_with(|b| b.set(out));
}

/// The tails of the keys of the last few (namespace, limits) pairs seen on a thread.
#[derive(Default)]
struct Tails {
    entries: Vec<(Option<String>, Vec<Limit>, Vec<String>)>,
    /// The entry the next new pair replaces once every place is taken.
    next: usize,
}

impl Tails {
    /// How many pairs a thread keeps: a few policies in turn (one per route, say) each find
    /// theirs.
    const PLACES: usize = 4;

    fn of(&mut self, namespace: Option<&str>, limits: &[Limit]) -> &[String] {
        let found = self
            .entries
            .iter()
            .position(|(ns, l, _)| l[..] == *limits && ns.as_deref() == namespace);
        let i = match found {
            Some(i) => i,
            None => {
                let entry = (
                    namespace.map(str::to_owned),
                    limits.to_vec(),
                    tails_of(namespace, limits),
                );
                if self.entries.len() < Self::PLACES {
                    self.entries.push(entry);
                    self.entries.len() - 1
                } else {
                    let i = self.next;
                    self.next = (i + 1) % Self::PLACES;
                    self.entries[i] = entry;
                    i
                }
            }
        };
        &self.entries[i].2
    }
}

/// The tail of each key of an identifier, in [`keys_of`]'s order: what follows the
/// identifier (`}:`, then `NAMESPACE:` when there is one, then the limit part).
pub(crate) fn tails_of(namespace: Option<&str>, limits: &[Limit]) -> Vec<String> {
    let head = |out: &mut String| close_tag_into(out, namespace);
    let mut tails = Vec::with_capacity(limits.len());
    if limits.iter().any(algorithm::is_packed) {
        let mut out = String::new();
        head(&mut out);
        let packed = limits.iter().filter(|l| algorithm::is_packed(l));
        for (i, limit) in packed.enumerate() {
            if i > 0 {
                out.push(',');
            }
            limit_tag(&mut out, limit, false);
        }
        tails.push(out);
    }
    for limit in limits.iter().filter(|l| !algorithm::is_packed(l)) {
        // another sorted set of the policy with the same name: both name their count
        let shared = limits.iter().any(|o| {
            o != limit && o.algorithm() == limit.algorithm() && o.window_us() == limit.window_us()
        });
        let mut out = String::new();
        head(&mut out);
        limit_tag(&mut out, limit, shared);
        tails.push(out);
    }
    tails
}

/// The space of a limiter's keys on its store, apart from other limiters' state: see
/// [`LimiterBuilder::namespace`](crate::LimiterBuilder::namespace).
///
/// A short name: 1 to [`Namespace::MAX_LEN`] bytes, none of them `:`, `{`, `}`, whitespace or
/// a control character. The key of a namespaced limit is `PREFIX:{IDENTIFIER}:NAMESPACE:LIMIT`
/// (`tollgate:{ip:1.2.3.4}:login:r1m`): the hash tag stays the identifier's, so in Redis
/// Cluster an identifier's keys of every namespace live in one slot, and since no limit's part
/// of a key holds a `:`, neither may a namespace: no two (namespace, identifier, limit)
/// triples, and no namespaced and shared limit, ever meet in one key.
///
/// ```
/// use tollgate::store::{ConfigErrorKind, Namespace};
///
/// let login: Namespace = "login".parse().unwrap();
/// assert_eq!(login.as_str(), "login");
/// let refused = Namespace::new("login:v2").unwrap_err();
/// assert_eq!(refused.kind(), ConfigErrorKind::Namespace);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Namespace(Arc<str>);

impl Namespace {
    /// The longest namespace, in bytes: it is part of every key of the limiter.
    pub const MAX_LEN: usize = 64;

    /// Validates `name` as a namespace.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] of kind [`ConfigErrorKind::Namespace`] when `name` is empty, longer
    /// than [`Namespace::MAX_LEN`] bytes, or holds `:`, `{`, `}`, whitespace or a control
    /// character.
    pub fn new(name: impl Into<String>) -> Result<Namespace, ConfigError> {
        let name = name.into();
        let usable = !name.is_empty()
            && name.len() <= Self::MAX_LEN
            && !name
                .chars()
                .any(|c| matches!(c, ':' | '{' | '}') || c.is_whitespace() || c.is_control());
        if usable {
            Ok(Namespace(name.into()))
        } else {
            Err(ConfigError::new(ConfigErrorKind::Namespace, name))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for Namespace {
    type Err = ConfigError;

    fn from_str(name: &str) -> Result<Namespace, ConfigError> {
        Namespace::new(name)
    }
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Builds the key of a scheduler's queue for an identifier: `PREFIX:{ID}:q4/1s`, or
/// `PREFIX:{ID}:NAMESPACE:q4/1s` in a namespace, as a limit's key; the rate in the same form
/// as a limit's name (`q`, the count, `/`, the window), then the burst after `b` when it is
/// not 1 (`q4/1sb3`). `escaped` comes from [`escape_identifier`]. A queue holds another kind
/// of state than any limit; its letter is none of theirs, so the two never meet.
pub(crate) fn schedule_key(
    prefix: &str,
    escaped: &str,
    namespace: Option<&str>,
    rate: &Rate,
) -> String {
    let mut out = key_head(prefix, escaped, namespace, 16);
    out.push('q');
    let _ = write!(out, "{}/", rate.count);
    window_tag(&mut out, rate.window_us);
    if rate.burst != 1 {
        let _ = write!(out, "b{}", rate.burst);
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

    #[test]
    fn escaping_is_found_wherever_the_byte_lies() {
        let escaped = |b: u8| matches!(b, b'%' | b'{' | b'}' | b'#');
        // every byte value, at every place of identifiers of every length up to 40 (words,
        // the overlapping last word, and the short way), among bytes that escape nothing,
        // bytes next to them and bytes above 0x7F
        for filler in [b'a', b'$', b'|', b'"', 0xFF, 0x00, 0x7E] {
            for len in 1..=40 {
                let plain = vec![filler; len];
                assert!(!needs_escaping(&plain), "{filler} × {len}");
                for at in 0..len {
                    for b in 0..=255u8 {
                        let mut id = plain.clone();
                        id[at] = b;
                        assert_eq!(needs_escaping(&id), escaped(b), "{b} at {at} of {len}");
                    }
                }
            }
        }
        assert!(!needs_escaping(b""));
    }

    #[test]
    fn an_identifier_escaped_after_a_prefix_is_escaped_as_alone() {
        let long = "x".repeat(MAX_PLAIN_ID + 1);
        let almost = "{".repeat(MAX_PLAIN_ID / 3);
        let over = "{".repeat(MAX_PLAIN_ID / 3 + 1);
        for id in ["ip:1.2.3.4", "", "{a}%#", &long, &almost, &over] {
            let mut key = String::from("m:{");
            push_escaped(&mut key, id);
            assert_eq!(key, format!("m:{{{}", escape_identifier(id)), "{id}");
        }
        // a hashed identifier is hashed whatever came before it
        assert!(escape_identifier(&over).starts_with('#'));
        assert!(!escape_identifier(&almost).starts_with('#'));
    }
    use std::collections::HashSet;

    #[test]
    fn identifiers_cannot_inject_tags_or_collide() {
        let limit = Limit::per_second(10)
            .unwrap()
            .with_algorithm(Algorithm::SlidingWindow)
            .unwrap();
        let ids = [
            "a", "a}", "{a}", "a%7D", "a%257D", "#a", "%23a", "", "}", "{", "a:b", "a}:w1s",
        ];
        let keys: HashSet<String> = ids
            .iter()
            .map(|id| key("rl", &escape_identifier(id), None, &limit))
            .collect();
        assert_eq!(keys.len(), ids.len());
        for k in &keys {
            // exactly one hash tag, and it is the identifier's, never empty (Redis ignores an
            // empty tag and hashes the whole key)
            assert_eq!(k.matches('{').count(), 1, "{k}");
            assert_eq!(k.matches('}').count(), 1, "{k}");
            assert!(!k.contains("{}"), "{k}");
        }
        assert_eq!(escape_identifier(""), "%");
        assert_eq!(
            key("rl", &escape_identifier("ip:1.2.3.4"), None, &limit),
            "rl:{ip:1.2.3.4}:w1s"
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
        let policy: crate::Policy = "10/s sliding, 120/min sliding, 240/h sliding"
            .parse()
            .unwrap();
        let id = escape_identifier("ip:1.2.3.4");
        let packed = packed_key("rl", &id, None, policy.limits());
        assert_eq!(packed, "rl:{ip:1.2.3.4}:w1s,w1m,w1h");
        // the default algorithm, the rolling window
        let default: crate::Policy = "10/s, 120/min, 240/h".parse().unwrap();
        assert_eq!(
            packed_key("rl", &id, None, default.limits()),
            "rl:{ip:1.2.3.4}:r1s,r1m,r1h"
        );
        let log = Limit::per_second(10)
            .unwrap()
            .with_algorithm(Algorithm::SlidingLog)
            .unwrap();
        assert_eq!(key("rl", &id, None, &log), "rl:{ip:1.2.3.4}:l1s");
        // another policy, another key
        let other: crate::Policy = "10/s sliding, 120/min sliding".parse().unwrap();
        assert_ne!(packed_key("rl", &id, None, other.limits()), packed);
    }

    #[test]
    fn keys_from_the_thread_memo_are_the_keys_built_afresh() {
        // more (namespace, policy) pairs than the memo keeps, in turn, twice
        let policies = [
            "10/s",
            "10/s, 120/min, 240/h",
            "5/s log",
            "10/s, 5/s log, 100/min fixed, 3 concurrent",
            "3/s gcra burst=9, 2000/s",
            "7/s sliding",
        ];
        for round in 0..2 {
            for namespace in [None, Some("login"), Some("api")] {
                for policy in policies {
                    let policy: crate::Policy = policy.parse().unwrap();
                    let limits = policy.limits();
                    for id in ["ip:1.2.3.4", "", "%7B"] {
                        let mut expected = Vec::new();
                        let packed: Vec<&Limit> =
                            limits.iter().filter(|l| algorithm::is_packed(l)).collect();
                        if !packed.is_empty() {
                            expected.push(packed_key("rl", id, namespace, packed));
                        }
                        for limit in limits.iter().filter(|l| !algorithm::is_packed(l)) {
                            expected.push(key("rl", id, namespace, limit));
                        }
                        let got = keys_of("rl", id, namespace, limits);
                        assert_eq!(got, expected, "{policy} in {namespace:?}, round {round}");
                    }
                }
            }
        }
    }

    #[test]
    fn limit_names_are_short_and_name_what_the_state_means() {
        let names: Vec<String> = [
            "1/ms sliding",
            "1/1000ms sliding",
            "1/1001ms sliding",
            "1/60s sliding",
            "1/61s",
            "1/61s sliding",
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
            "7/1001ms sliding",
            "5/s log",
            "5/s fixed",
        ]
        .iter()
        .map(|p| {
            let limit: Limit = p.parse().unwrap();
            let mut out = String::new();
            limit_tag(&mut out, &limit, false);
            out
        })
        .collect();
        assert_eq!(names[..4], ["w1ms", "w1s", "w1001ms", "w1m"]);
        assert_eq!(names[4..6], ["r61s", "w61s"]);
        assert_eq!(names[10], "g3/1300ms");
        assert_eq!(names[14], "c");
        assert_eq!(names[17..], ["l1s", "f1s"]);
        // the same state whatever the burst, the lease or the count of a window
        assert_eq!(names[10], names[12]);
        assert_eq!(names[14], names[15]);
        assert_eq!(names[2], names[16]);
        // every other difference is another name
        let distinct: HashSet<&String> = names.iter().collect();
        assert_eq!(distinct.len(), names.len() - 3, "{names:?}");
    }

    #[test]
    fn counts_stay_out_of_keys_unless_two_logs_would_share_one() {
        let id = escape_identifier("u");
        let keys = |p: &str| {
            keys_of(
                "rl",
                &id,
                None,
                p.parse::<crate::Policy>().unwrap().limits(),
            )
        };
        // a count change keeps every key; a window change or a new limit does not
        assert_eq!(
            keys("10/s, 5/s log, 100/min fixed, 3 concurrent"),
            ["rl:{u}:r1s,f1m", "rl:{u}:l1s", "rl:{u}:c"]
        );
        assert_eq!(
            keys("20/s, 2/s log, 90/min fixed, 1 concurrent lease=1m"),
            keys("10/s, 5/s log, 100/min fixed, 3 concurrent")
        );
        assert_ne!(keys("10/2s")[0], keys("10/s")[0]);
        assert_ne!(keys("10/s, 100/h")[0], keys("10/s")[0]);
        // a GCRA names its rate, not its burst
        assert_eq!(keys("3/s gcra burst=9"), ["rl:{u}:g3/1s"]);
        assert_ne!(keys("4/s gcra"), keys("3/s gcra"));
        // two logs of one window: each names its count, so each has its set
        assert_eq!(
            keys("10/s log, 20/s log, 5/min log"),
            ["rl:{u}:l10/1s", "rl:{u}:l20/1s", "rl:{u}:l1m"]
        );
    }

    #[test]
    fn namespaces_keep_the_identifier_tag_and_never_meet() {
        let id = escape_identifier("ip:1.2.3.4");
        let keys = |ns: Option<&str>, p: &str| {
            keys_of("rl", &id, ns, p.parse::<crate::Policy>().unwrap().limits())
        };
        assert_eq!(
            keys(Some("login"), "10/min, 5/s log, 2 concurrent"),
            [
                "rl:{ip:1.2.3.4}:login:r1m",
                "rl:{ip:1.2.3.4}:login:l1s",
                "rl:{ip:1.2.3.4}:login:c"
            ]
        );
        // the same limit in two namespaces, and in none: three keys, one hash tag
        let limit: Limit = "1 concurrent".parse().unwrap();
        let three = [None, Some("a"), Some("b")].map(|ns| key("rl", &id, ns, &limit));
        assert_eq!(three.iter().collect::<HashSet<_>>().len(), 3);
        for k in &three {
            assert!(k.starts_with("rl:{ip:1.2.3.4}:"), "{k}");
            assert_eq!(k.matches('{').count(), 1, "{k}");
        }
        // a namespace change is another key; a count change within one is not
        assert_eq!(keys(Some("a"), "10/min"), keys(Some("a"), "100/min"));
        assert_ne!(keys(Some("a"), "10/min"), keys(Some("b"), "10/min"));
        // every name the keyspace could confuse is refused
        for bad in [
            "",
            "a:b",
            "w1m:x",
            "{a}",
            "a}",
            "a b",
            "a\n",
            &"n".repeat(65),
        ] {
            let e = Namespace::new(bad).unwrap_err();
            assert_eq!(e.kind(), ConfigErrorKind::Namespace, "{bad:?}");
            assert_eq!(e.part(), bad);
        }
        for good in ["login", "api-v2", "w1m", "%7B", "ünï", &"n".repeat(64)] {
            assert_eq!(Namespace::new(good).unwrap().as_str(), good);
        }
        assert!("a:b".parse::<Namespace>().is_err());
    }

    #[test]
    fn schedule_keys_name_the_rate_and_never_meet_limit_keys() {
        let id = escape_identifier("psp:acme");
        let rate = |count, window_us, burst| Rate {
            count,
            window_us,
            burst,
        };
        assert_eq!(
            schedule_key("rl", &id, None, &rate(4, 1_000_000, 1)),
            "rl:{psp:acme}:q4/1s"
        );
        assert_eq!(
            schedule_key("rl", &id, None, &rate(3, 1_300_000, 2)),
            "rl:{psp:acme}:q3/1300msb2"
        );
        assert_eq!(
            schedule_key("rl", &id, Some("payments"), &rate(4, 1_000_000, 1)),
            "rl:{psp:acme}:payments:q4/1s"
        );
        let letters = [
            Algorithm::SlidingLog,
            Algorithm::SlidingWindow,
            Algorithm::FixedWindow,
            Algorithm::TokenBucket { capacity: 1 },
            Algorithm::Gcra { burst: 1 },
            Algorithm::Concurrency,
        ]
        .map(|a| a.key_letter());
        assert!(!letters.contains(&'q'));
    }

    #[test]
    fn prefixes_without_braces_only() {
        assert!(valid_prefix("tollgate"));
        assert!(valid_prefix("app:v2"));
        assert!(!valid_prefix(""));
        assert!(!valid_prefix("a{b"));
    }
}

//! The rate-limit headers of responses: the fields of draft-ietf-httpapi-ratelimit-headers-11
//! (or the legacy `X-RateLimit-*` ones), merged with those already in the response. The rules
//! are described in the [`layer`](crate::layer#headers) module documentation.

use std::cmp::Reverse;
use std::time::Duration;

use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::HeaderMap;
use sfv::{key_ref, BareItem, FieldType, Item, KeyRef, List, ListEntry, Parameters, Parser};

use crate::{Algorithm, Decision, Limit, LimitStatus};

mod fresh;

pub(crate) use fresh::HeaderCache;

/// `RateLimit`: the state of each limit.
pub(crate) const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `RateLimit-Policy`: the limits.
pub(crate) const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `X-RateLimit-Limit`: the quota of the limit closest to exhaustion (on a denial, of the one
/// that denied longest).
pub(crate) const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`: what remains of it.
pub(crate) const X_RATELIMIT_REMAINING: HeaderName =
    HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`: the seconds until its whole quota is back (on a denial, no sooner than
/// the request is admitted).
pub(crate) const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
/// `grpc-status`: the gRPC status code of a trailers-only response.
pub(crate) const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// `grpc-message`: the percent-encoded message of a trailers-only response.
pub(crate) const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

const Q: &KeyRef = key_ref("q");
const QU: &KeyRef = key_ref("qu");
const W: &KeyRef = key_ref("w");
const R: &KeyRef = key_ref("r");
const T: &KeyRef = key_ref("t");
const PK: &KeyRef = key_ref("pk");

/// The quota unit of a concurrency limit.
const CONCURRENT_REQUESTS: &str = "concurrent-requests";

/// Which rate-limit headers responses carry. `Retry-After` is sent on denials whatever the
/// style.
///
/// With the `serde` feature it is written as `"ietf"`, `"legacy"`, `"both"` or `"none"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "lowercase"))]
#[non_exhaustive]
pub enum HeaderStyle {
    /// `RateLimit-Policy` and `RateLimit` as draft-ietf-httpapi-ratelimit-headers-11 defines
    /// them (the default).
    #[default]
    Ietf,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset`, for the rate
    /// limit closest to exhaustion, or on a denial for the limit that holds the request back
    /// longest (a concurrency limit is reported in this style only when it denies).
    Legacy,
    /// Both sets.
    Both,
    /// Neither.
    None,
}

impl HeaderStyle {
    fn ietf(self) -> bool {
        matches!(self, HeaderStyle::Ietf | HeaderStyle::Both)
    }

    fn legacy(self) -> bool {
        matches!(self, HeaderStyle::Legacy | HeaderStyle::Both)
    }
}

/// Whole seconds, rounded up (`u64::MAX` for `Duration::MAX`).
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// `text` as a header value, if it is a valid one.
pub(crate) fn header_value(text: String) -> Option<HeaderValue> {
    HeaderValue::try_from(text).ok()
}

/// What one limit advertises.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Advert {
    /// The limit's text, naming its items.
    pub(crate) name: String,
    /// The quota.
    pub(crate) q: u64,
    /// The window in seconds; `None` for a concurrency limit.
    pub(crate) w: Option<u64>,
    /// The quota available now.
    pub(crate) r: u64,
    /// The effective window in seconds; `None` for a concurrency limit.
    pub(crate) t: Option<u64>,
    /// The seconds until the whole quota is back (the legacy `X-RateLimit-Reset`).
    pub(crate) full: u64,
    /// The partition key (`pk`): a keyed hash of the identifier the item describes.
    pub(crate) pk: Option<Vec<u8>>,
    /// When the limit denied: the seconds until it would admit the request (rounded up).
    pub(crate) retry: Option<u64>,
}

impl Advert {
    fn is_concurrency(&self) -> bool {
        self.w.is_none()
    }
}

/// `RateLimit-Policy`'s `q` and `w` of a rate limit: the window rounded up to whole seconds
/// (for a bucket or GCRA, the time its burst takes to refill), and the count scaled to it,
/// rounded down.
pub(crate) fn quota_and_window(limit: &Limit) -> (u64, u64) {
    const SEC_US: u128 = 1_000_000;
    let count = u128::from(limit.count());
    let window_us = limit.window().as_micros().max(1);
    let period_us = match limit.algorithm() {
        Algorithm::TokenBucket { capacity: burst } | Algorithm::Gcra { burst } => {
            (u128::from(burst) * window_us).div_ceil(count.max(1))
        }
        _ => window_us,
    };
    let w = period_us.div_ceil(SEC_US).max(1);
    let q = count * w * SEC_US / window_us;
    (saturate(q), saturate(w))
}

fn saturate(n: u128) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// The bytes of a partition key.
const PK_LEN: usize = 12;

/// The partition key of `identifier` under `secret`: HMAC-SHA-1, truncated to 12 bytes. A
/// keyed hash, so that a client cannot tell an identifier (an IP address) from its key by
/// hashing candidates; the same secret gives every process of a fleet the same keys.
pub(crate) fn partition_key(secret: &[u8], identifier: &str) -> Vec<u8> {
    const BLOCK: usize = 64;
    let mut key = [0u8; BLOCK];
    if secret.len() > BLOCK {
        key[..20].copy_from_slice(&sha1_smol::Sha1::from(secret).digest().bytes());
    } else {
        key[..secret.len()].copy_from_slice(secret);
    }
    let pad = |byte: u8| key.map(|k| k ^ byte);
    let mut inner = sha1_smol::Sha1::new();
    inner.update(&pad(0x36));
    inner.update(identifier.as_bytes());
    let mut outer = sha1_smol::Sha1::new();
    outer.update(&pad(0x5c));
    outer.update(&inner.digest().bytes());
    outer.digest().bytes()[..PK_LEN].to_vec()
}

/// The adverts of `decision`, one per limit, in the order of the decision's limits; with
/// `pks` (the partition key of each identifier of the check, by index), each with the
/// partition key of the identifier it describes.
pub(crate) fn adverts(decision: &Decision, pks: Option<&[Vec<u8>]>) -> Vec<Advert> {
    limit_indexes(decision)
        .filter_map(|l| {
            let pick = pick(decision, l)?;
            let mut advert = advert(pick);
            advert.pk = pks.and_then(|pks| pks.get(pick.identifier)).cloned();
            Some(advert)
        })
        .collect()
}

/// The index of each limit of `decision`, in the order the statuses first name it.
fn limit_indexes(decision: &Decision) -> impl Iterator<Item = usize> + '_ {
    let statuses = decision.statuses();
    statuses.iter().enumerate().filter_map(move |(k, s)| {
        let seen = statuses[..k].iter().any(|e| e.limit_index == s.limit_index);
        (!seen).then_some(s.limit_index)
    })
}

/// The status an item of limit `l` describes: the identifier that holds the request back
/// longest, else the most constrained.
fn pick(decision: &Decision, l: usize) -> Option<&LimitStatus> {
    let of_limit = || {
        decision
            .statuses()
            .iter()
            .filter(move |s| s.limit_index == l)
    };
    of_limit()
        .filter(|s| !s.allowed)
        .max_by_key(|s| s.retry_after)
        .or_else(|| of_limit().min_by_key(|s| (s.remaining, Reverse(s.reset_after))))
}

/// `t`: the effective window of a rate limit whose window is `w` seconds.
fn effective_window(s: &LimitStatus, w: u64) -> u64 {
    if s.allowed {
        match ceil_secs(s.reset_after) {
            0 => w,
            t => t.min(w),
        }
    } else {
        ceil_secs(s.retry_after.unwrap_or_default())
    }
}

fn advert(s: &LimitStatus) -> Advert {
    let name = s.limit.to_string();
    if s.limit.is_concurrency() {
        let q = s.limit.count();
        return Advert {
            name,
            q,
            w: None,
            r: s.remaining.min(q),
            t: None,
            full: 0,
            pk: None,
            retry: s.retry_after.map(ceil_secs),
        };
    }
    let (q, w) = quota_and_window(&s.limit);
    Advert {
        name,
        q,
        w: Some(w),
        r: s.remaining.min(q),
        t: Some(effective_window(s, w)),
        full: ceil_secs(s.reset_after),
        pk: None,
        retry: s.retry_after.map(ceil_secs),
    }
}

/// Adds the headers describing `decision` in `style`, and `Retry-After` when it was denied,
/// to those already there: another layer's items are kept (a limit listed by both appears
/// once, with the tighter state), and so is a `Retry-After` already set. With `pks` (the
/// partition key of each identifier of the check), the `RateLimit` items carry `pk`.
///
/// The IETF fields of a response that has none yet are written from `cache`, which keeps
/// what does not change from one response to the next.
pub(crate) fn add_headers(
    headers: &mut HeaderMap,
    decision: &Decision,
    style: HeaderStyle,
    pks: Option<&[Vec<u8>]>,
    cache: &HeaderCache,
) {
    let wait = decision.retry_after();
    if style == HeaderStyle::None && wait.is_none() {
        return;
    }
    let present = Present::of(headers);
    let mut retry_after = None;
    if let Some(wait) = wait {
        if !present.retry_after {
            let secs = ceil_secs(wait).max(1);
            headers.insert(RETRY_AFTER, fresh::number(secs));
            retry_after = Some(secs);
        }
    }
    if style == HeaderStyle::None {
        return;
    }
    if present.retry_after {
        retry_after = retry_after_set(headers);
    }
    if !present.ratelimit && !present.policy && decision.statuses().is_empty() {
        // Nothing to tell and nothing to merge with (a shadow decision, shown as none, or a
        // check nobody made): the merge below would write nothing either.
        return;
    }
    if style == HeaderStyle::Ietf && !present.ratelimit && !present.policy {
        // Neither field there yet: written whole (else merged below).
        if let Some((policy, state)) = cache.fields(decision, pks, retry_after) {
            headers.append(RATELIMIT_POLICY, policy);
            headers.append(RATELIMIT, state);
            return;
        }
    }
    merge(headers, decision, style, pks, retry_after);
}

/// The seconds of the `Retry-After` a response already has, if it is a number.
#[cold]
#[inline(never)]
fn retry_after_set(headers: &HeaderMap) -> Option<u64> {
    header_number(headers.get(RETRY_AFTER)?)
}

/// The whole number a header's `value` holds, if it is one.
fn header_number(value: &HeaderValue) -> Option<u64> {
    value.to_str().ok()?.trim().parse().ok()
}

/// The fields of `decision` in `style`, merged with those the response has: the way of a
/// response whose fields another layer wrote, of the legacy style (alone or with the IETF
/// fields), and of limits whose fields the cache does not write (a name that needs escaping,
/// a name listed twice, a quota beyond a structured field's integers, more than 16 limits, a
/// value too long).
// Out of line and cold: the usual response — IETF fields, none there yet, limits the cache
// writes — takes the cached fields above, and a decision without statuses returns before
// this; keeping this code (several kilobytes) out of `add_headers` keeps the usual path in
// fewer cache lines.
#[cold]
#[inline(never)]
fn merge(
    headers: &mut HeaderMap,
    decision: &Decision,
    style: HeaderStyle,
    pks: Option<&[Vec<u8>]>,
    retry_after: Option<u64>,
) {
    let ours = adverts(decision, pks);
    if style.ietf() {
        merge_ietf(headers, &ours, retry_after);
    }
    if style.legacy() {
        merge_legacy(headers, &ours, retry_after);
    }
}

/// Which of the fields [`add_headers`] reads a response has.
struct Present {
    retry_after: bool,
    ratelimit: bool,
    policy: bool,
}

impl Present {
    /// The most names of a response compared one by one with the three (a comparison with a
    /// name of another length, or with a standard name, ends at once); a response with more
    /// is looked up.
    const SCAN: usize = 16;

    /// Most responses have a handful of fields: comparing their names with these three is
    /// cheaper than three hashed lookups (`ratelimit` and `ratelimit-policy` are not standard
    /// names, each hashed byte by byte).
    fn of(headers: &HeaderMap) -> Present {
        if headers.keys_len() > Present::SCAN {
            return Present {
                retry_after: headers.contains_key(RETRY_AFTER),
                ratelimit: headers.contains_key(RATELIMIT),
                policy: headers.contains_key(RATELIMIT_POLICY),
            };
        }
        let mut present = Present {
            retry_after: false,
            ratelimit: false,
            policy: false,
        };
        for name in headers.keys() {
            present.retry_after |= *name == RETRY_AFTER;
            present.ratelimit |= *name == RATELIMIT;
            present.policy |= *name == RATELIMIT_POLICY;
        }
        present
    }
}

/// The list in the fields `name` (several lines are one list), or `None` when they are not a
/// valid list (left as they are).
fn read_list(headers: &HeaderMap, name: &HeaderName) -> Option<List> {
    let mut joined = String::new();
    for value in headers.get_all(name) {
        if !joined.is_empty() {
            joined.push_str(", ");
        }
        joined.push_str(value.to_str().ok()?);
    }
    if joined.trim().is_empty() {
        return Some(List::new());
    }
    Parser::new(&joined).parse::<List>().ok()
}

fn write_list(headers: &mut HeaderMap, name: HeaderName, list: &List) {
    if let Some(value) = list.serialize().and_then(header_value) {
        headers.insert(name, value);
    }
}

/// The name of a list item (its string), if it is an item with one.
fn item_name(entry: &ListEntry) -> Option<&str> {
    match entry {
        ListEntry::Item(item) => item.bare_item.as_string().map(|s| s.as_str()),
        ListEntry::InnerList(_) => None,
    }
}

fn integer_param(entry: &ListEntry, key: &KeyRef) -> Option<i64> {
    match entry {
        ListEntry::Item(item) => item
            .params
            .get(key)
            .and_then(BareItem::as_integer)
            .map(i64::from),
        ListEntry::InnerList(_) => None,
    }
}

fn item(name: &str, params: &[(&KeyRef, BareItem)]) -> Option<ListEntry> {
    let name = sfv::String::from_string(name.to_owned()).ok()?;
    let mut map = Parameters::new();
    for (key, value) in params {
        map.insert((*key).to_owned(), value.clone());
    }
    Some(Item::with_params(name, map).into())
}

fn int(n: u64) -> Option<BareItem> {
    BareItem::try_from(n).ok()
}

fn policy_item(a: &Advert) -> Option<ListEntry> {
    let mut params = vec![(Q, int(a.q)?)];
    match a.w {
        Some(w) => params.push((W, int(w)?)),
        None => params.push((
            QU,
            BareItem::String(sfv::string_ref(CONCURRENT_REQUESTS).to_owned()),
        )),
    }
    item(&a.name, &params)
}

fn state_item(a: &Advert) -> Option<ListEntry> {
    let mut params = vec![(R, int(a.r)?)];
    if let Some(t) = a.t {
        params.push((T, int(t)?));
    }
    if let Some(pk) = &a.pk {
        params.push((PK, BareItem::ByteSequence(pk.clone())));
    }
    item(&a.name, &params)
}

/// How constrained a `RateLimit` item says its client is: lower `r`, then longer `t`, is
/// tighter (smaller).
fn tightness(entry: &ListEntry) -> (i64, Reverse<i64>) {
    (
        integer_param(entry, R).unwrap_or(i64::MAX),
        Reverse(integer_param(entry, T).unwrap_or(0)),
    )
}

fn merge_ietf(headers: &mut HeaderMap, ours: &[Advert], retry_after: Option<u64>) {
    if !headers.contains_key(RATELIMIT_POLICY) && !headers.contains_key(RATELIMIT) {
        if let Some((policy, state)) = fresh_ietf(ours, retry_after) {
            if let (false, Some(policy), Some(state)) =
                (ours.is_empty(), header_value(policy), header_value(state))
            {
                headers.insert(RATELIMIT_POLICY, policy);
                headers.insert(RATELIMIT, state);
            }
            return;
        }
    }
    if let Some(mut policy) = read_list(headers, &RATELIMIT_POLICY) {
        let before = policy.len();
        for a in ours {
            if !policy.iter().any(|e| item_name(e) == Some(&a.name)) {
                policy.extend(policy_item(a));
            }
        }
        if policy.len() != before {
            write_list(headers, RATELIMIT_POLICY, &policy);
        }
    }
    if let Some(mut state) = read_list(headers, &RATELIMIT) {
        for a in ours {
            let Some(mine) = state_item(a) else { continue };
            match state.iter_mut().find(|e| item_name(e) == Some(&a.name)) {
                Some(theirs) if tightness(&mine) < tightness(theirs) => *theirs = mine,
                Some(_) => {}
                None => state.push(mine),
            }
        }
        // Every effective window ends by the time Retry-After says to come back.
        if let Some(cap) = retry_after.and_then(|c| i64::try_from(c).ok()) {
            for entry in &mut state {
                let ListEntry::Item(item) = entry else {
                    continue;
                };
                if let Some(t) = item.params.get_mut(T) {
                    if t.as_integer().is_some_and(|t| i64::from(t) > cap) {
                        if let Ok(cap) = BareItem::try_from(cap) {
                            *t = cap;
                        }
                    }
                }
            }
        }
        if !state.is_empty() {
            write_list(headers, RATELIMIT, &state);
        }
    }
}

/// The fields `merge_ietf` writes when the response has none yet, formatted directly rather
/// than through the structured-field lists (the usual case, once per response): the same
/// bytes the serializer would give. `None` when an advert needs the general path (a name
/// that needs escaping, a repeated name, a number too large for a structured field).
fn fresh_ietf(ours: &[Advert], retry_after: Option<u64>) -> Option<(String, String)> {
    use std::fmt::Write;
    let mut policy = String::with_capacity(40 * ours.len());
    // a partition key of n bytes takes `;pk=::` and 4 characters per 3 bytes
    let pks: usize = ours
        .iter()
        .filter_map(|a| a.pk.as_ref())
        .map(|pk| 6 + pk.len().div_ceil(3) * 4)
        .sum();
    let mut state = String::with_capacity(32 * ours.len() + pks);
    for (i, a) in ours.iter().enumerate() {
        let numbers = [Some(a.q), Some(a.r), a.w, a.t];
        if !is_plain(&a.name)
            || ours[..i].iter().any(|o| o.name == a.name)
            || numbers.iter().flatten().any(|&n| n > MAX_INTEGER)
        {
            return None;
        }
        if i > 0 {
            policy.push_str(", ");
            state.push_str(", ");
        }
        let _ = write!(policy, "\"{}\";q={}", a.name, a.q);
        let _ = match a.w {
            Some(w) => write!(policy, ";w={w}"),
            None => write!(policy, ";qu=\"{CONCURRENT_REQUESTS}\""),
        };
        let _ = write!(state, "\"{}\";r={}", a.name, a.r);
        if let Some(t) = a.t {
            // Every effective window ends by the time Retry-After says to come back.
            let t = retry_after.map_or(t, |cap| t.min(cap));
            let _ = write!(state, ";t={t}");
        }
        if let Some(pk) = &a.pk {
            state.push_str(";pk=:");
            let _ = push_base64(&mut state, pk);
            state.push(':');
        }
    }
    Some((policy, state))
}

/// The largest integer a structured field holds.
const MAX_INTEGER: u64 = 999_999_999_999_999;

/// Whether a limit's name is written as a structured-field string without escapes.
fn is_plain(name: &str) -> bool {
    name.bytes()
        .all(|b| (0x20..=0x7e).contains(&b) && b != b'"' && b != b'\\')
}

/// `bytes` in base64 with padding (RFC 4648's standard alphabet), as a structured field's
/// byte sequence holds them.
fn push_base64(out: &mut impl std::fmt::Write, bytes: &[u8]) -> std::fmt::Result {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for chunk in bytes.chunks(3) {
        let b = [0, 1, 2].map(|i| chunk.get(i).copied().unwrap_or(0));
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        // a chunk of k bytes gives k + 1 characters, then padding to 4
        for (k, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if k <= chunk.len() {
                out.write_char(char::from(ALPHABET[(n >> shift & 63) as usize]))?;
            } else {
                out.write_char('=')?;
            }
        }
    }
    Ok(())
}

/// The legacy fields describe one limit: on a denial the one that holds the request back
/// longest, otherwise the rate limit closest to exhaustion. Their reset is never sooner
/// than the response's `Retry-After` (`retry_after`, ours or an inner layer's): a client
/// retrying then must not be refused again.
fn merge_legacy(headers: &mut HeaderMap, ours: &[Advert], retry_after: Option<u64>) {
    let denying = ours
        .iter()
        .filter(|a| a.retry.is_some())
        .max_by_key(|a| a.retry);
    let Some(tightest) = denying.or_else(|| {
        ours.iter()
            .filter(|a| !a.is_concurrency())
            .min_by_key(|a| (a.r, Reverse(a.full)))
    }) else {
        return;
    };
    if let Some(theirs) = headers.get(X_RATELIMIT_REMAINING) {
        // Another layer's fields: kept when they show as little left, or when they describe
        // its refusal and ours refuses nothing.
        let theirs = header_number(theirs);
        let refused_there = retry_after.is_some() && denying.is_none();
        if refused_there || theirs.is_none_or(|r| r <= tightest.r) {
            return;
        }
    }
    let reset = tightest
        .full
        .max(tightest.retry.unwrap_or(0))
        .max(retry_after.unwrap_or(0));
    headers.insert(X_RATELIMIT_LIMIT, HeaderValue::from(tightest.q));
    headers.insert(X_RATELIMIT_REMAINING, HeaderValue::from(tightest.r));
    headers.insert(X_RATELIMIT_RESET, HeaderValue::from(reset));
}

#[cfg(test)]
mod tests;

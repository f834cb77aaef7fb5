//! The IETF fields of a response that has none yet — the usual case, once per response —
//! without building adverts: the `RateLimit-Policy` value depends only on the list of limits,
//! so it is built once per list and cloned; the `RateLimit` value is written from parts built
//! once (each item's `"NAME";r=`) and the decision's numbers straight into a per-thread chunk
//! it is cut from ([`written`]), without an allocation of its own.
//! The bytes are those `fresh_ietf` writes (and the structured-field serializer would).

use std::fmt::Write;
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use bytes::BytesMut;
use http::header::HeaderValue;

use super::{
    effective_window, is_plain, limit_indexes, pick, push_base64, quota_and_window,
    CONCURRENT_REQUESTS, MAX_INTEGER,
};
use crate::http::chunk::{self, push_u64};
use crate::{Decision, Limit, LimitStatus};

/// The most items written this way; a decision naming more limits takes the general path.
const MAX_ITEMS: usize = 16;
/// The most lists of limits kept. A layer sees few: one per limiter (or pair of limiters, for
/// a route that adds its own), and one more per version of a changed policy. When the cache
/// is full, a new list takes the place of all the others.
const MAX_ENTRIES: usize = 16;
/// The longest `RateLimit` value written this way (three limits with partition keys take
/// about 160 bytes); a longer one takes the general path.
const STATE_BYTES: usize = chunk::MAX_BYTES;

/// What the IETF fields of a list of limits share from one response to the next, for the
/// lists a layer has seen.
#[derive(Default)]
pub(crate) struct HeaderCache {
    /// The first list seen — for most layers the only one (a single limiter whose policy
    /// never changes) —, read without the cost of a guard.
    first: OnceLock<Arc<Entry>>,
    /// The others.
    entries: ArcSwap<Vec<Arc<Entry>>>,
}

/// The fields of one list of limits.
struct Entry {
    limits: Vec<Limit>,
    /// `None` when the list needs the general path (a name that needs escaping, a name
    /// listed twice, a quota too large for a structured field).
    fields: Option<Fields>,
}

struct Fields {
    /// `RateLimit-Policy`.
    policy: HeaderValue,
    /// Each limit's `RateLimit` item, but for its numbers.
    items: Vec<Item>,
}

struct Item {
    /// `"NAME";r=`.
    prefix: Box<str>,
    /// The quota, which `r` never exceeds.
    q: u64,
    /// The window in seconds; `None` for a concurrency limit (an item without `t`).
    w: Option<u64>,
}

impl HeaderCache {
    /// The `RateLimit-Policy` and `RateLimit` values of `decision` for a response that has
    /// neither, or `None` when they take the general path. `retry_after` is the response's
    /// `Retry-After` in seconds, which caps every `t`.
    pub(crate) fn fields(
        &self,
        decision: &Decision,
        pks: Option<&[Vec<u8>]>,
        retry_after: Option<u64>,
    ) -> Option<(HeaderValue, HeaderValue)> {
        let statuses = decision.statuses();
        if statuses.iter().enumerate().all(|(k, s)| s.limit_index == k) {
            // A status per limit, in the order of the limits (a check of one identifier, the
            // usual case): each is the one its limit's item describes, as `pick` would find.
            if statuses.len() > MAX_ITEMS {
                return None;
            }
            return self.fields_of(statuses.iter(), statuses.len(), pks, retry_after);
        }
        let mut picks: [Option<&LimitStatus>; MAX_ITEMS] = [None; MAX_ITEMS];
        let mut count = 0;
        for l in limit_indexes(decision) {
            if let Some(s) = pick(decision, l) {
                *picks.get_mut(count)? = Some(s);
                count += 1;
            }
        }
        let picks = picks[..count].iter().flatten().copied();
        self.fields_of(picks, count, pks, retry_after)
    }

    /// [`fields`](Self::fields) of the `count` statuses `picks`, the one each item describes,
    /// in the order of the items.
    fn fields_of<'a>(
        &self,
        picks: impl Iterator<Item = &'a LimitStatus> + Clone,
        count: usize,
        pks: Option<&[Vec<u8>]>,
        retry_after: Option<u64>,
    ) -> Option<(HeaderValue, HeaderValue)> {
        if count == 0 {
            return None;
        }
        if let Some(first) = self.first.get().filter(|e| e.lists(picks.clone(), count)) {
            return first.fields.as_ref()?.write(picks, pks, retry_after);
        }
        let entries = self.entries.load();
        match entries.iter().find(|e| e.lists(picks.clone(), count)) {
            Some(entry) => entry.fields.as_ref()?.write(picks, pks, retry_after),
            None => self
                .add(picks.clone())
                .fields
                .as_ref()?
                .write(picks, pks, retry_after),
        }
    }

    /// Builds the entry of the limits of `picks`, and keeps it.
    fn add<'a>(&self, picks: impl Iterator<Item = &'a LimitStatus>) -> Arc<Entry> {
        let limits: Vec<Limit> = picks.map(|s| s.limit).collect();
        let fields = Fields::of(&limits);
        let entry = Arc::new(Entry { limits, fields });
        if self.first.set(entry.clone()).is_ok() {
            return entry;
        }
        self.entries.rcu(|entries| {
            if entries.iter().any(|e| e.limits == entry.limits) {
                return Vec::clone(entries);
            }
            let mut entries = if entries.len() < MAX_ENTRIES {
                Vec::clone(entries)
            } else {
                Vec::new()
            };
            entries.push(entry.clone());
            entries
        });
        entry
    }
}

impl Entry {
    /// Whether this is the entry of the limits of the `count` statuses `picks`.
    fn lists<'a>(&self, picks: impl Iterator<Item = &'a LimitStatus>, count: usize) -> bool {
        self.limits.len() == count && self.limits.iter().zip(picks).all(|(l, s)| *l == s.limit)
    }
}

impl Fields {
    /// The values, for the statuses `picks` of this entry's limits.
    fn write<'a>(
        &self,
        picks: impl Iterator<Item = &'a LimitStatus>,
        pks: Option<&[Vec<u8>]>,
        retry_after: Option<u64>,
    ) -> Option<(HeaderValue, HeaderValue)> {
        let state = written(|state| {
            for (i, (s, item)) in picks.zip(&self.items).enumerate() {
                if i > 0 {
                    state.extend_from_slice(b", ");
                }
                state.extend_from_slice(item.prefix.as_bytes());
                push_u64(state, s.remaining.min(item.q));
                if let Some(w) = item.w {
                    let t = effective_window(s, w);
                    if t > MAX_INTEGER {
                        return None;
                    }
                    // Every effective window ends by the time Retry-After says to come back.
                    state.extend_from_slice(b";t=");
                    push_u64(state, retry_after.map_or(t, |cap| t.min(cap)));
                }
                if let Some(pk) = pks.and_then(|pks| pks.get(s.identifier)) {
                    state.extend_from_slice(b";pk=:");
                    push_base64(state, pk).ok()?;
                    state.extend_from_slice(b":");
                }
            }
            Some(())
        })?;
        Some((self.policy.clone(), state))
    }

    fn of(limits: &[Limit]) -> Option<Fields> {
        let mut policy = String::new();
        let mut items = Vec::with_capacity(limits.len());
        let mut names: Vec<String> = Vec::with_capacity(limits.len());
        for (i, limit) in limits.iter().enumerate() {
            let name = limit.to_string();
            let (q, w) = if limit.is_concurrency() {
                (limit.count(), None)
            } else {
                let (q, w) = quota_and_window(limit);
                (q, Some(w))
            };
            if !is_plain(&name) || names.contains(&name) || q > MAX_INTEGER {
                return None;
            }
            if w.is_some_and(|w| w > MAX_INTEGER) {
                return None;
            }
            if i > 0 {
                policy.push_str(", ");
            }
            let _ = write!(policy, "\"{name}\";q={q}");
            let _ = match w {
                Some(w) => write!(policy, ";w={w}"),
                None => write!(policy, ";qu=\"{CONCURRENT_REQUESTS}\""),
            };
            items.push(Item {
                prefix: format!("\"{name}\";r=").into(),
                q,
                w,
            });
            names.push(name);
        }
        Some(Fields {
            policy: HeaderValue::from_str(&policy).ok()?,
            items,
        })
    }
}

/// `value` as a header value, copied into the thread's chunk and cut from it (see
/// [`written`]).
#[cfg(test)]
pub(super) fn cut(value: &[u8]) -> Option<HeaderValue> {
    written(|chunk| {
        chunk.extend_from_slice(value);
        Some(())
    })
}

/// The header value `write` writes (at most [`STATE_BYTES`]; `None` when it gives up or
/// writes more), cut from the thread's chunk ([`chunk::cut`]): a response's value takes no
/// allocation of its own, and is copied nowhere before it is sent.
pub(super) fn written(write: impl FnOnce(&mut BytesMut) -> Option<()>) -> Option<HeaderValue> {
    HeaderValue::from_maybe_shared(chunk::cut(STATE_BYTES, write)?).ok()
}

/// `n` as a header value, cut from the thread's chunk like the `RateLimit` values.
pub(super) fn number(n: u64) -> HeaderValue {
    written(|chunk| {
        push_u64(chunk, n);
        Some(())
    })
    .unwrap_or_else(|| HeaderValue::from(n))
}

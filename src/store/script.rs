//! The wire protocol of the Lua scripts, defined once: how the check script is generated for a
//! policy from the fragments in `lua/`, what its KEYS and ARGV hold, how the packed state and
//! the reply read. Unit tests check these against the Lua files themselves.
//!
//! # Generation
//!
//! A Lua file is a header comment and sections, each starting at a line `--@ name`. The check
//! script of a policy is the prelude's sections, then `check.lua`'s sections with each limit's
//! fragments (the sections of its algorithm's file) in between, in the order of
//! [`generate`]; placeholders (`$name`) are replaced by the policy's numbers, so the script
//! parses no limit and dispatches on nothing at run time. Scripts are cached per policy
//! ([`check_script`]) with their SHA-1, and run by `EVALSHA`. The refund script, which gives
//! back what a check charged, is generated the same way from `refund.lua` and each limit's
//! `refund` fragment (`refund`: [`refund_script`]).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use redis::{Script, Value};
use smallvec::SmallVec;

use super::keyspace;
use super::{Outcome, Plan, StoreError};
use crate::algorithm::{self, rolling_window, Counter, Counters, Layout, State};
use crate::policy::{Algorithm, Limit};
pub(crate) use reserve::reserve_arg;
use reserve::{retries_of, stamp_and_wait};

const PRELUDE: &str = include_str!("../../lua/prelude.lua");
const DRIVER: &str = include_str!("../../lua/check.lua");
const SLIDING_LOG: &str = include_str!("../../lua/sliding_log.lua");
const SLIDING_WINDOW: &str = include_str!("../../lua/sliding_window.lua");
const ROLLING_WINDOW: &str = include_str!("../../lua/rolling_window.lua");
const ROLLING_WINDOW_WIDE: &str = include_str!("../../lua/rolling_window_wide.lua");
const FIXED_WINDOW: &str = include_str!("../../lua/fixed_window.lua");
const GCRA: &str = include_str!("../../lua/gcra.lua");
const CONCURRENCY: &str = include_str!("../../lua/concurrency.lua");
const RESERVE: &str = include_str!("../../lua/reserve.lua");

/// The largest integer a double holds exactly: 2^53.
const MAX_EXACT: f64 = 9_007_199_254_740_992.0;

/// The most scripts (policies times numbers of identifiers) kept; past it the cache starts
/// over.
const MAX_CACHED: usize = 1024;

/// The script renewing concurrency leases (with the shared helpers; the section markers are
/// Lua comments).
pub(crate) const RENEW: &str = concat!(
    include_str!("../../lua/prelude.lua"),
    include_str!("../../lua/renew.lua"),
);

/// How one packed field is stored (a Lua `struct` format code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wire {
    /// `d`: a little-endian double, exact for integers below 2^53.
    Double,
    /// `I4`: a little-endian unsigned 32-bit integer (counts stay below `MAX_COUNT`).
    U32,
}

impl Wire {
    fn parse(code: &str) -> Option<Wire> {
        match code {
            "d" => Some(Wire::Double),
            "I4" => Some(Wire::U32),
            _ => None,
        }
    }

    fn code(self) -> &'static str {
        match self {
            Wire::Double => "d",
            Wire::U32 => "I4",
        }
    }

    fn len(self) -> usize {
        match self {
            Wire::Double => 8,
            Wire::U32 => 4,
        }
    }
}

/// The check script of one policy, with what reading its reply needs.
#[derive(Debug)]
pub(crate) struct CheckScript {
    pub(crate) script: Script,
    layout: Layout,
    /// The packed limits (by index), in order.
    packed: Vec<usize>,
    /// The packed fields' formats, `T` first.
    wire: Vec<Wire>,
}

/// The text of a Lua file's section `name` (empty when it has none).
pub(crate) fn section<'a>(file: &'a str, name: &str) -> &'a str {
    let marker = format!("--@ {name}\n");
    let Some(start) = file.find(&marker).map(|i| i + marker.len()) else {
        return "";
    };
    let end = file[start..]
        .find("\n--@ ")
        .map_or(file.len(), |i| start + i + 1);
    &file[start..end]
}

/// The fragment files, by automaton code ([`Algorithm::code`]).
const FRAGMENTS: [&str; 6] = [
    SLIDING_LOG,
    SLIDING_WINDOW,
    FIXED_WINDOW,
    GCRA,
    CONCURRENCY,
    ROLLING_WINDOW,
];

/// The fragment file of a limit: its algorithm's, except that a rolling window whose ring does
/// not fit in one number runs the wide form.
fn fragments(limit: &Limit) -> &'static str {
    let algorithm = limit.algorithm();
    if algorithm == Algorithm::RollingWindow && rolling_window::base(limit).is_none() {
        return ROLLING_WINDOW_WIDE;
    }
    FRAGMENTS[usize::from(algorithm.code()).clamp(1, FRAGMENTS.len()) - 1]
}

/// The packed fields of `limit` as declared by its fragment file: `name:format` pairs.
fn fields(limit: &Limit) -> impl Iterator<Item = (&'static str, Option<Wire>)> {
    section(fragments(limit), "fields")
        .split_whitespace()
        .map(|f| {
            let (name, code) = f.split_once(':').unwrap_or((f, ""));
            (name, Wire::parse(code))
        })
}

/// Replaces every `$name` in `text` by its value in `vars`; unknown names stay as they are.
fn fill(out: &mut String, text: &str, vars: &[(&str, String)]) {
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let len = after
            .find(|c: char| !c.is_ascii_lowercase())
            .unwrap_or(after.len());
        match vars.iter().find(|(name, _)| *name == &after[..len]) {
            Some((_, value)) => out.push_str(value),
            None => out.push_str(&rest[i..=i + len]),
        }
        rest = &after[len..];
    }
    out.push_str(rest);
}

/// The placeholders of limit `l` (key `key` of its identifier), in the script of a check that
/// may wait when `reserving`.
fn limit_vars(
    limits: &[Limit],
    l: usize,
    key: usize,
    reserving: bool,
) -> Vec<(&'static str, String)> {
    let limit = &limits[l];
    let (n, w) = (limit.count(), limit.window_us());
    let ttl = w.div_ceil(1000) + 1;
    let (cut, life) = if reserving {
        (
            format!("string.format('%d', real - {w})"),
            // longer by the wait; with a caller's clock at least a minute, as a packed key's
            // (Redis' clock, on which the TTL runs, does not follow the caller's, and a
            // waiting caller sleeps in real time)
            format!(
                "string.format('%d', (realtime and {ttl} or {}) + math.ceil((now - real) / 1000))",
                ttl.max(60_000)
            ),
        )
    } else {
        (
            format!("string.format('%d', now - {w})"),
            // with a caller's clock at least a minute, as a packed key's (see above)
            format!("(realtime and '{ttl}' or '{}')", ttl.max(60_000)),
        )
    };
    let mut vars = vec![
        ("x", (l + 1).to_string()),
        ("n", n.to_string()),
        ("w", w.to_string()),
        ("key", format!("KEYS[base + {}]", key + 1)),
        ("cut", cut),
        ("life", life),
    ];
    if limit.algorithm() == Algorithm::RollingWindow {
        // the sub-window; for a compact ring, base - 1 and the powers of the base
        vars.push(("g", rolling_window::sub_window_us(limit).to_string()));
        if let Some(b) = rolling_window::base(limit) {
            vars.push(("m", (b - 1).to_string()));
            for (name, power) in [("pa", 1), ("pb", 2), ("pc", 3), ("pd", 4)] {
                vars.push((name, b.pow(power).to_string()));
            }
        }
    }
    if let Algorithm::TokenBucket { .. } | Algorithm::Gcra { .. } = limit.algorithm() {
        // burst·T as (µs, remainder), as the twin's `times` computes it
        let (q, r, burst) = (w / n, w % n, limit.max_cost());
        vars.push(("q", q.to_string()));
        vars.push(("r", r.to_string()));
        vars.push(("tu", (burst * q + burst * r / n).to_string()));
        vars.push(("tr", (burst * r % n).to_string()));
    }
    vars
}

/// Emits `section` of each limit in `ls`, each in a block of its own when `scoped` (its
/// locals end with it).
fn fragments_of(
    out: &mut String,
    limits: &[Limit],
    vars: &[Vec<(&str, String)>],
    ls: &[usize],
    name: &str,
    scoped: bool,
) {
    for &l in ls {
        let text = section(fragments(&limits[l]), name);
        if scoped && !text.trim().is_empty() {
            out.push_str("do\n");
            fill(out, text, &vars[l]);
            out.push_str("end\n");
        } else {
            fill(out, text, &vars[l]);
        }
    }
}

/// The check script of a policy for `ids` identifiers: the text, and what reading its reply
/// needs.
#[cfg(test)]
fn generate(limits: &[Limit], ids: usize) -> (String, Layout, Vec<usize>, Vec<Wire>) {
    generate_within(limits, ids, false)
}

/// What every script generated for a policy lays out alike: its keys per identifier, the
/// packed limits and the sorted-set ones (indices into the policy), and the packed state's
/// fields — `T`, then each packed limit's fields, named `<field><limit>` — with their wire
/// formats, `struct` format and length in bytes.
struct Shape {
    layout: Layout,
    per_id: usize,
    packed: Vec<usize>,
    sorted: Vec<usize>,
    wire: Vec<Wire>,
    names: Vec<String>,
    format: String,
    state_len: usize,
}

impl Shape {
    /// The variables every generated script for `ids` identifiers fills its driver's sections
    /// with, and the reply's expression of the packed states read (as many zero bytes for
    /// a missing one).
    fn common_vars(&self, ids: usize) -> (Vec<(&'static str, String)>, String) {
        let zero = "\\0".repeat(self.state_len);
        let list = |f: &dyn Fn(usize) -> String| (1..=ids).map(f).collect::<Vec<_>>().join(", ");
        let replies = (1..=ids)
            .map(|j| format!("(got{j} or '{zero}')"))
            .collect::<Vec<_>>()
            .join(" .. ");
        let per_id = self.per_id;
        let vars = vec![
            ("fields", self.names.join(", ")),
            ("zeros", vec!["0"; self.names.len()].join(", ")),
            ("format", self.format.clone()),
            ("zero", zero),
            ("states", list(&|j| format!("got{j}"))),
            (
                "news",
                if ids > LOCAL_STATES {
                    "put, ttl = {}, {}".to_string()
                } else {
                    list(&|j| format!("put{j}, ttl{j}"))
                },
            ),
            (
                "names",
                list(&|j| format!("KEYS[{}]", (j - 1) * per_id + 1)),
            ),
        ];
        (vars, replies)
    }

    fn of(limits: &[Limit]) -> Shape {
        let layout = Layout::of(limits);
        let per_id = layout.keys_per_id();
        let packed: Vec<usize> = layout
            .limits_of(0)
            .filter(|_| layout.has_packed())
            .collect();
        let sorted: Vec<usize> = (0..limits.len())
            .filter(|l| !algorithm::is_packed(&limits[*l]))
            .collect();

        let mut wire = vec![Wire::Double];
        let mut names = Vec::new();
        for &l in &packed {
            for (name, w) in fields(&limits[l]) {
                names.push(format!("{name}{}", l + 1));
                wire.push(w.unwrap_or(Wire::Double));
            }
        }
        let format: String = std::iter::once("<")
            .chain(wire.iter().map(|w| w.code()))
            .collect();
        let state_len: usize = wire.iter().map(|w| w.len()).sum();
        Shape {
            layout,
            per_id,
            packed,
            sorted,
            wire,
            names,
            format,
            state_len,
        }
    }
}

/// The most identifiers whose new packed states and TTLs a check script keeps in locals
/// (`put1`, `ttl1`, …); beyond, they go in the tables `put` and `ttl`. Lua gives a function
/// at most 250 registers: with three locals an identifier, 16 rolling windows of wide counts
/// left no room for 14 identifiers (12 in a check that may wait), and Redis would not compile
/// the script. Four identifiers in locals (12 registers) take fewer than sixteen with tables
/// (18, the states read among them), which the largest policy fits; a table costs a check
/// two allocations, spared to the usual checks of one or two identifiers.
const LOCAL_STATES: usize = 4;

/// The names of identifier `j`'s new packed state and TTL in a script of `ids` identifiers.
fn state_names(ids: usize, j: usize) -> (String, String) {
    if ids > LOCAL_STATES {
        (format!("put[{j}]"), format!("ttl[{j}]"))
    } else {
        (format!("put{j}"), format!("ttl{j}"))
    }
}

/// [`generate`], or when `reserving` (a policy without a concurrency limit) the script of a
/// check that may wait: phase 1 in passes (`lua/reserve.lua`).
fn generate_within(
    limits: &[Limit],
    ids: usize,
    reserving: bool,
) -> (String, Layout, Vec<usize>, Vec<Wire>) {
    let shape = Shape::of(limits);
    let (mut common, replies) = shape.common_vars(ids);
    let Shape {
        layout,
        per_id,
        packed,
        sorted,
        wire,
        ..
    } = shape;
    // the largest cost every packed limit admits (what a fresh state admits)
    let most = packed
        .iter()
        .map(|&l| limits[l].max_cost())
        .min()
        .unwrap_or(0);
    common.extend([
        ("most", most.to_string()),
        (
            "skip",
            if reserving { "false" } else { "not ok" }.to_string(),
        ),
        ("real", if reserving { "real" } else { "now" }.to_string()),
    ]);
    let id_vars = |j: usize| {
        let mut v = common.clone();
        v.push(("j", j.to_string()));
        v.push(("b", ((j - 1) * per_id).to_string()));
        v.push(("first", ((j - 1) * per_id + 1).to_string()));
        // the first identifier has no one before it: a branch never taken, naming itself
        let same = if j == 1 {
            "false".to_string()
        } else {
            format!("got{j} == got{}", j - 1)
        };
        v.push(("same", same));
        let (put, ttl) = state_names(ids, j);
        let (putp, ttlp) = state_names(ids, (j - 1).max(1));
        v.extend([("put", put), ("ttl", ttl), ("putp", putp), ("ttlp", ttlp)]);
        v
    };
    let vars: Vec<_> = (0..limits.len())
        .map(|l| limit_vars(limits, l, layout.key_of(l), reserving))
        .collect();

    let mut out = String::with_capacity(4096 * ids);
    let driver = |out: &mut String, name: &str, vars: &[(&str, String)]| {
        fill(out, section(DRIVER, name), vars)
    };
    let all: Vec<usize> = (0..limits.len()).collect();

    out.push_str(section(PRELUDE, "clock"));
    driver(&mut out, "head", &common);
    if reserving {
        out.push_str(section(RESERVE, "pass_open"));
    }
    fragments_of(&mut out, limits, &vars, &all, "prepare", false);
    if !packed.is_empty() {
        driver(
            &mut out,
            if ids == 1 { "read_one" } else { "read_many" },
            &common,
        );
    }
    // phase 1: read and decide
    for j in 1..=ids {
        let v = id_vars(j);
        driver(&mut out, "id_open", &v);
        if !packed.is_empty() {
            driver(&mut out, "unpack", &v);
            fragments_of(&mut out, limits, &vars, &packed, "fresh", true);
            driver(&mut out, "fresh_pack", &v);
            driver(&mut out, "ttl", &v);
            driver(&mut out, "stored", &v);
            fragments_of(&mut out, limits, &vars, &packed, "evaluate", true);
            if reserving {
                retries_of(&mut out, limits, &vars, &packed, true);
            }
            driver(&mut out, "pack_open", &v);
            fragments_of(&mut out, limits, &vars, &packed, "commit", true);
            fragments_of(&mut out, limits, &vars, &packed, "expires", true);
            driver(&mut out, "pack_close", &v);
            driver(&mut out, "ttl", &v);
            driver(&mut out, "stored_close", &v);
        }
        fragments_of(&mut out, limits, &vars, &sorted, "evaluate", false);
        if reserving {
            retries_of(&mut out, limits, &vars, &sorted, false);
        }
        driver(&mut out, "id_close", &v);
    }
    if reserving {
        out.push_str(section(RESERVE, "pass_final"));
    }
    // phase 2: write, only when every pair admits
    driver(&mut out, "phase2", &common);
    for j in 1..=ids {
        let v = id_vars(j);
        driver(&mut out, "id_open", &v);
        if !packed.is_empty() {
            driver(&mut out, "write", &v);
        }
        fragments_of(&mut out, limits, &vars, &sorted, "commit", false);
        driver(&mut out, "id_close", &v);
    }
    driver(&mut out, "reply", &common);
    if sorted.is_empty() {
        // one expression: the verdict, the time and the states read
        let mut v = common.clone();
        v.push(("replies", replies));
        driver(&mut out, "reply_only", &v);
    } else {
        driver(&mut out, "reply_open", &common);
        for j in 1..=ids {
            let v = id_vars(j);
            driver(&mut out, "id_open", &v);
            if !packed.is_empty() {
                driver(&mut out, "reply_packed", &v);
            }
            fragments_of(&mut out, limits, &vars, &sorted, "report", false);
            driver(&mut out, "id_close", &v);
        }
        driver(&mut out, "tail", &common);
    }
    if reserving {
        out.push_str(section(RESERVE, "pass_close"));
    }
    (out, layout, packed, wire)
}

/// The check script of `limits` for `ids` identifiers, generated on first use and then cached.
pub(crate) fn check_script(limits: &[Limit], ids: usize) -> Arc<CheckScript> {
    check_script_within(limits, ids, false)
}

/// [`check_script`], or when `reserving` the script of a check that may wait (for a policy
/// without a concurrency limit).
pub(crate) fn check_script_within(
    limits: &[Limit],
    ids: usize,
    reserving: bool,
) -> Arc<CheckScript> {
    let kind = if reserving {
        Kind::Reserving
    } else {
        Kind::Check
    };
    cached(kind, limits, ids, || {
        generate_within(limits, ids, reserving)
    })
}

/// Which of a policy's generated scripts: each is cached apart (the same policy may use all).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Check,
    Reserving,
    Peek,
}

/// The generated script of `kind` for `limits` and `ids` identifiers: `generate` runs on
/// first use, and the script is cached (up to `MAX_CACHED` shapes) by the process and,
/// for the last one used, by the thread — a limiter runs one shape over and over, and finding
/// it there takes no lock and no copy of the limits for a key.
fn cached(
    kind: Kind,
    limits: &[Limit],
    ids: usize,
    generate: impl FnOnce() -> (String, Layout, Vec<usize>, Vec<Wire>),
) -> Arc<CheckScript> {
    type Key = (Vec<Limit>, usize, Kind);
    static CACHE: OnceLock<Mutex<HashMap<Key, Arc<CheckScript>>>> = OnceLock::new();
    thread_local! {
        static LAST: RefCell<Option<(Key, Arc<CheckScript>)>> = const { RefCell::new(None) };
    }
    // `try_with`: a thread being torn down has no memo, and goes to the shared cache.
    let last = LAST.try_with(|l| match &*l.try_borrow().ok()? {
        Some(((ls, i, k), s)) if ls == limits && *i == ids && *k == kind => Some(s.clone()),
        _ => None,
    });
    let last = last.ok().flatten();
    if let Some(found) = last {
        return found;
    }
    let key = (limits.to_vec(), ids, kind);
    let cache = CACHE.get_or_init(Mutex::default);
    let found = cache
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&key)
        .cloned();
    let compiled = found.unwrap_or_else(|| {
        let (text, layout, packed, wire) = generate();
        let compiled = Arc::new(CheckScript {
            script: Script::new(&text),
            layout,
            packed,
            wire,
        });
        let mut cache = cache.lock().unwrap_or_else(PoisonError::into_inner);
        if cache.len() >= MAX_CACHED {
            cache.clear();
        }
        cache.insert(key.clone(), compiled.clone());
        compiled
    });
    let _ = LAST.try_with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            *l = Some((key, compiled.clone()));
        }
    });
    compiled
}

/// The time argument: the manual clock's reading, or empty for Redis `TIME`.
pub(crate) fn now_arg(now: Option<u64>) -> String {
    now.map_or(String::new(), |n| n.to_string())
}

impl CheckScript {
    /// A call of this script for `plan`'s identifiers, sized for their keys (then filled in
    /// by [`check_args`]).
    pub(crate) fn call(&self, plan: &Plan<'_>) -> Call<'_> {
        let per_id = self.layout.keys_per_id();
        let bytes = plan
            .ids
            .iter()
            .map(|i| (i.len() + 48) * per_id)
            .sum::<usize>()
            + 64;
        Call::new(&self.script, per_id * plan.ids.len(), bytes)
    }
}

/// Fills in the KEYS and ARGV of one check: per identifier, its packed key (when the policy
/// has packed limits), then one key per sorted-set limit; ARGV: cost, now (only with a manual
/// clock, or before a lease id), lease id (only with a concurrency limit). Every argument
/// costs Redis a little, so none is sent in vain.
pub(crate) fn check_args(
    call: &mut impl ScriptArgs,
    prefix: &str,
    now: Option<u64>,
    plan: &Plan<'_>,
) {
    push_keys(call, prefix, plan);
    call.arg(plan.cost);
    if now.is_some() || !plan.lease.is_empty() {
        call.arg(now_arg(now));
    }
    if !plan.lease.is_empty() {
        call.arg(plan.lease);
    }
}

/// The KEYS of a check of `plan` (and of its refund and peek): per identifier, its packed key
/// (when the policy has packed limits), then one key per sorted-set limit.
fn push_keys(call: &mut impl ScriptArgs, prefix: &str, plan: &Plan<'_>) {
    for id in plan.ids {
        keyspace::each_key(prefix, id, plan.namespace, plan.limits, |key| {
            call.key(key);
        });
    }
}

fn unexpected(what: impl Into<String>) -> StoreError {
    StoreError::UnexpectedReply(what.into())
}

/// A packed state as the script wrote it: `T`, then every packed limit's fields.
fn decode(bytes: &[u8], compiled: &CheckScript, limits: &[Limit]) -> Result<State, StoreError> {
    let expected: usize = compiled.wire.iter().map(|w| w.len()).sum();
    if bytes.len() != expected {
        return Err(unexpected(format!(
            "a packed state of {} bytes, not {expected}",
            bytes.len()
        )));
    }
    let mut values: SmallVec<[u64; 16]> = SmallVec::with_capacity(compiled.wire.len());
    let mut at = 0;
    for w in &compiled.wire {
        let field = &bytes[at..at + w.len()];
        at += w.len();
        let value = match w {
            Wire::U32 => u64::from(u32::from_le_bytes(field.try_into().unwrap_or_default())),
            Wire::Double => {
                let v = f64::from_le_bytes(field.try_into().unwrap_or_default());
                if !(0.0..=MAX_EXACT).contains(&v) || v.fract() != 0.0 {
                    return Err(unexpected(format!("a packed field of {v}")));
                }
                v as u64
            }
        };
        values.push(value);
    }
    let mut rest = &values[1..];
    let counters: Counters = compiled
        .packed
        .iter()
        .map(|&l| {
            let n = Counter::fields(&limits[l]).len();
            let (mine, others) = rest.split_at(n.min(rest.len()));
            rest = others;
            Counter::load(&limits[l], values[0], mine)
        })
        .collect();
    // A GCRA time is µs and n-ths of a µs: a remainder of n or more was written by something
    // else (a foreign or corrupted key), and the twin's arithmetic on it would report figures
    // that mean nothing. (Checked after the collection, which then knows its size: collected
    // through a `Result` it would grow, and allocate, step by step.)
    for (&l, counter) in compiled.packed.iter().zip(&counters) {
        if let Counter::Gcra(tat) = counter {
            let (remainder, count) = (tat.fields().1, limits[l].count());
            if remainder >= count {
                return Err(unexpected(format!(
                    "a GCRA remainder of {remainder} for a count of {count}"
                )));
            }
        }
    }
    Ok(State::Counters(counters))
}

/// Reads the time the script stamped its reply with: `SECONDS,MICROSECONDS`.
fn stamp(text: &[u8]) -> Result<u64, StoreError> {
    let text = std::str::from_utf8(text).map_err(|_| unexpected("a time that is not text"))?;
    let (s, us) = text
        .split_once(',')
        .ok_or_else(|| unexpected(format!("a time of {text:?}")))?;
    let number = |v: &str| {
        v.parse::<u64>()
            .map_err(|_| unexpected(format!("a time of {text:?}")))
    };
    // Times are doubles in the scripts, exact below 2^53 µs (the year 2255): a time past
    // that is no time the twin can work with, and its figures would overflow.
    number(s)?
        .checked_mul(1_000_000)
        .and_then(|s| s.checked_add(number(us).ok()?))
        .filter(|&t| t <= MAX_TIME_US)
        .ok_or_else(|| unexpected(format!("a time of {text:?}")))
}

/// The latest time a script's reply may carry (the time it read, plus a check's wait): 2^53
/// µs, up to which a double holds every µs, and the latest a manual clock reads.
const MAX_TIME_US: u64 = crate::clock::ManualClock::MAX_MICROS;

/// Reads the check script's reply: the states it returns go through the twin
/// ([`decide_at`]), which derives every figure; the script's own verdict must agree with
/// it. A wait longer than `max_wait_us`, what the check may wait (0 for a check that does
/// not), is an error: the caller would sleep through it.
///
/// [`decide_at`]: algorithm::decide_at
pub(crate) fn parse_reply(
    reply: Value,
    compiled: &CheckScript,
    plan: &Plan<'_>,
    max_wait_us: u64,
) -> Result<Outcome, StoreError> {
    let Reply {
        allowed,
        now,
        wait,
        mut states,
    } = read_reply(reply, compiled, plan, false)?;
    if wait > max_wait_us {
        return Err(unexpected(format!(
            "a wait of {wait} µs for a check that may wait {max_wait_us} µs"
        )));
    }
    let outcome = algorithm::decide_at(
        &mut states,
        &compiled.layout,
        plan.limits,
        now,
        now + wait,
        plan.cost,
        plan.lease,
    );
    agree(allowed, outcome)
}

/// What a check script's reply says.
struct Reply {
    /// The script's verdict.
    allowed: bool,
    /// The time it read.
    now: u64,
    /// The wait it decided (0 but for a check that may wait).
    wait: u64,
    /// The states it returned (a sorted set's as the script's report on it).
    states: Vec<Option<State>>,
}

/// Reads a check script's reply (a peek script's when `peek`: nothing was charged).
fn read_reply(
    reply: Value,
    compiled: &CheckScript,
    plan: &Plan<'_>,
    peek: bool,
) -> Result<Reply, StoreError> {
    let layout = &compiled.layout;
    let ids = plan.ids.len();
    let Value::BulkString(reply) = reply else {
        return Err(unexpected(format!("{reply:?}")));
    };
    // "1" or "0", the time, ";", then per identifier its packed state and sorted-set entries
    let split = reply
        .iter()
        .position(|&b| b == b';')
        .ok_or_else(|| unexpected("a reply without states"))?;
    let allowed = match reply.first() {
        Some(b'1') => true,
        Some(b'0') => false,
        _ => return Err(unexpected("a reply without a verdict")),
    };
    let (now, wait) = stamp_and_wait(&reply[1..split])?;
    let state_len = if layout.has_packed() {
        compiled.wire.iter().map(|w| w.len()).sum()
    } else {
        0
    };
    // a sorted set's record is text (see `record`), what the script read; the client charges
    // it when the check admitted
    let charged = allowed && !peek;
    let mut rest = &reply[split + 1..];
    let short = |rest: &[u8]| {
        unexpected(format!(
            "states that do not fit the policy ({} bytes at the end)",
            rest.len()
        ))
    };
    let mut states = Vec::with_capacity(ids * layout.keys_per_id());
    for _ in 0..ids {
        if layout.has_packed() {
            let state = rest.get(..state_len).ok_or_else(|| short(rest))?;
            rest = &rest[state_len..];
            // a stored state's T is a time, never 0: all zeros stand for no state
            states.push(match state.iter().all(|&b| b == 0) {
                true => None,
                false => Some(decode(state, compiled, plan.limits)?),
            });
        }
        for l in plan.limits.iter().filter(|l| !algorithm::is_packed(l)) {
            let (entry, after) = record::read(rest, l, now + wait, plan.cost, charged)?;
            rest = after;
            states.push(Some(State::Settled(entry)));
        }
    }
    if !rest.is_empty() {
        return Err(short(rest));
    }
    Ok(Reply {
        allowed,
        now,
        wait,
        states,
    })
}

/// The twin's outcome, if the script's verdict agrees with it.
fn agree(allowed: bool, outcome: Outcome) -> Result<Outcome, StoreError> {
    if outcome.allowed != allowed {
        return Err(unexpected(format!(
            "the script {} what the state it returned {}",
            if allowed { "admitted" } else { "denied" },
            if allowed { "denies" } else { "admits" },
        )));
    }
    Ok(outcome)
}

mod call;
mod peek;
mod record;
mod refund;
mod reserve;

pub(crate) use call::{Call, ScriptArgs};

pub(crate) use peek::{parse_peek_reply, peek_script};
pub(crate) use refund::{refund_args, refund_script};

#[cfg(test)]
mod tests;

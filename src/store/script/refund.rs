//! The refund script: generated per policy and number of identifiers from `lua/refund.lua`
//! and each limit's `refund` fragment, as the check script is from `check.lua`; cached with
//! its SHA-1 and run by `EVALSHA`. Its KEYS are the check's, its ARGV the cost, the time of
//! the charge and the lease id (only with a concurrency limit).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use redis::Script;

use super::ScriptArgs;

use super::{fill, fragments_of, limit_vars, push_keys, section, Shape, MAX_CACHED};
use crate::policy::Limit;
use crate::store::Plan;

pub(super) const REFUND: &str = include_str!("../../../lua/refund.lua");

/// The refund script of one policy.
#[derive(Debug)]
pub(crate) struct RefundScript {
    pub(crate) script: Script,
}

/// The refund script of a policy for `ids` identifiers, and its packed fields' format.
pub(super) fn generate(limits: &[Limit], ids: usize) -> (String, String) {
    let Shape {
        layout,
        per_id,
        packed,
        sorted,
        names,
        format,
        ..
    } = Shape::of(limits);
    let vars: Vec<_> = (0..limits.len())
        .map(|l| limit_vars(limits, l, layout.key_of(l), false))
        .collect();
    let driver = |out: &mut String, name: &str, vars: &[(&str, String)]| {
        fill(out, section(REFUND, name), vars)
    };

    let mut out = String::with_capacity(1024 * ids);
    driver(&mut out, "head", &[]);
    for j in 1..=ids {
        let v = vec![
            ("j", j.to_string()),
            ("b", ((j - 1) * per_id).to_string()),
            ("first", ((j - 1) * per_id + 1).to_string()),
            ("fields", names.join(", ")),
            ("format", format.clone()),
        ];
        driver(&mut out, "id_open", &v);
        if !packed.is_empty() {
            driver(&mut out, "packed_open", &v);
            fragments_of(&mut out, limits, &vars, &packed, "refund", true);
            driver(&mut out, "packed_close", &v);
        }
        fragments_of(&mut out, limits, &vars, &sorted, "refund", false);
        driver(&mut out, "id_close", &v);
    }
    (out, format)
}

/// The refund script of `limits` for `ids` identifiers, generated on first use and then
/// cached.
pub(crate) fn refund_script(limits: &[Limit], ids: usize) -> Arc<RefundScript> {
    type Cache = HashMap<(Vec<Limit>, usize), Arc<RefundScript>>;
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    let cache = CACHE.get_or_init(Mutex::default);
    let key = (limits.to_vec(), ids);
    if let Some(found) = cache
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&key)
    {
        return found.clone();
    }
    let (text, _) = generate(limits, ids);
    let compiled = Arc::new(RefundScript {
        script: Script::new(&text),
    });
    let mut cache = cache.lock().unwrap_or_else(PoisonError::into_inner);
    if cache.len() >= MAX_CACHED {
        cache.clear();
    }
    cache.insert(key, compiled.clone());
    compiled
}

/// Fills in the KEYS and ARGV of the refund of a check of `plan` decided at `at_us`: the
/// check's KEYS; ARGV: cost, the charge's time, the lease id (only with a concurrency limit).
pub(crate) fn refund_args(call: &mut impl ScriptArgs, prefix: &str, plan: &Plan<'_>, at_us: u64) {
    push_keys(call, prefix, plan);
    call.arg(plan.cost).arg(at_us);
    if !plan.lease.is_empty() {
        call.arg(plan.lease);
    }
}

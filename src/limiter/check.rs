//! One check of a limiter, from the identifiers to the decision: validation, deduplication,
//! escaping, the deny cache, the store (or its read-only twin), the failure policy and shadow
//! mode.

use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::deny_cache::DenyCache;
use super::peek::store_peek;
use super::{Error, Limiter, OnStoreError, Version, MAX_IDENTIFIERS};
use crate::decision::{Decision, LimitStatus, Origin};
use crate::guard::ConcurrencyGuard;
use crate::observe::{self, Action};
use crate::policy::{Limit, Policy};
use crate::store::keyspace;
use crate::store::lease::{lease_id, Lease};
use crate::store::{Outcome, Plan, Store, StoreError};

/// How a check runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mode {
    /// Let the request through whatever the policy says (also when the limiter is in
    /// shadow mode itself).
    pub(crate) shadow: bool,
    /// Charge the request when it is allowed; otherwise only read (a peek).
    pub(crate) charge: bool,
    /// Count the decision in the metrics and the shadow log.
    pub(crate) record: bool,
}

impl Mode {
    /// A check as [`Limiter::check_n`] makes it.
    pub(crate) const CHECK: Mode = Mode {
        shadow: false,
        charge: true,
        record: true,
    };

    /// A read-only check as [`Limiter::peek_n`] makes it: not counted as a decision.
    pub(crate) const PEEK: Mode = Mode {
        shadow: false,
        charge: false,
        record: false,
    };

    /// The same mode, in shadow mode if `shadow`.
    pub(crate) const fn shadowed(mut self, shadow: bool) -> Mode {
        self.shadow |= shadow;
        self
    }
}

/// Where a check looks: the store, the deny cache in front of it, and the version of the
/// policy.
struct Target<'a> {
    store: &'a Store,
    policy: &'a Policy,
    deny_cache: Option<(&'a DenyCache, u64)>,
    name: &'a str,
}

impl Limiter {
    /// A check of `identifiers` for `cost` in `mode`, on the version of the policy in force
    /// when it starts (a policy change while it runs does not reach it).
    pub(crate) async fn run<I: AsRef<str>>(
        &self,
        identifiers: &[I],
        cost: u64,
        mode: Mode,
    ) -> Result<Decision, Error> {
        let version = self.inner.version.load_full();
        let shadow = mode.shadow || self.inner.shadow.load(Ordering::Relaxed);
        let answer = match self.answer(&version, identifiers, cost, mode.charge).await {
            Ok(mut decision) => {
                decision.shadow = shadow;
                decision
            }
            // Shadow mode never refuses: a check the enforcing limiter would refuse as
            // impossible, or for want of a store, lets the request through as a would-be
            // denial.
            Err(Error::Cost { .. } | Error::Store(_)) if shadow => {
                Decision::refused_unchecked(cost)
            }
            Err(e) => return Err(e),
        };
        if mode.record {
            observe::decision(&version.name, &answer);
            if answer.shadow && answer.would_deny() {
                self.inner
                    .shadow_log
                    .would_deny(&version.name, answer.would_deny_by().map(|s| &s.limit));
            }
        }
        Ok(answer)
    }

    /// The check with the failure policy, without shadow mode.
    async fn answer<I: AsRef<str>>(
        &self,
        version: &Arc<Version>,
        identifiers: &[I],
        cost: u64,
        charge: bool,
    ) -> Result<Decision, Error> {
        let target = Target {
            store: &self.inner.store,
            policy: &version.policy,
            deny_cache: self
                .inner
                .deny_cache
                .as_ref()
                .map(|c| (c, version.generation)),
            name: &version.name,
        };
        let error = match decide(&target, identifiers, cost, charge).await {
            Err(Error::Store(e)) => e,
            other => return other,
        };
        let name = &*version.name;
        match (
            self.inner.on_error,
            &self.inner.fallback_store,
            &version.fallback,
        ) {
            (OnStoreError::Fallback(_), Some(store), Some(policy)) => {
                observe::failure_answered(name, Action::Fallback, &error);
                let fallback = Target {
                    store,
                    policy,
                    deny_cache: None,
                    name,
                };
                match decide(&fallback, identifiers, cost, charge).await {
                    Ok(mut decision) => {
                        decision.origin = Origin::Fallback;
                        Ok(decision)
                    }
                    // The scaled policy cannot hold this cost: the store's failure stands.
                    Err(_) => Err(Error::Store(error)),
                }
            }
            (OnStoreError::Closed, ..) => {
                observe::failure_answered(name, Action::Closed, &error);
                Err(Error::Store(error))
            }
            _ => {
                observe::failure_answered(name, Action::Open, &error);
                Ok(Decision::unchecked(cost))
            }
        }
    }
}

/// The check itself, on one store with one policy.
async fn decide<I: AsRef<str>>(
    target: &Target<'_>,
    identifiers: &[I],
    cost: u64,
    charge: bool,
) -> Result<Decision, Error> {
    let policy = target.policy;
    let max = policy.max_cost();
    if cost == 0 || cost > max {
        return Err(Error::Cost { cost, max });
    }
    // Distinct identifiers, each with the index of its first occurrence (on the stack: a
    // check names at most `MAX_IDENTIFIERS`).
    let mut first_ix = [0usize; MAX_IDENTIFIERS];
    let mut distinct = 0;
    for (i, id) in identifiers.iter().enumerate() {
        let id = id.as_ref();
        let earlier = if distinct <= MAX_IDENTIFIERS {
            first_ix[..distinct]
                .iter()
                .any(|&f| identifiers[f].as_ref() == id)
        } else {
            // Already too many: the rest are only counted, for the error.
            identifiers[..i].iter().any(|e| e.as_ref() == id)
        };
        if !earlier {
            if let Some(slot) = first_ix.get_mut(distinct) {
                *slot = i;
            }
            distinct += 1;
        }
    }
    if distinct == 0 {
        return Err(Error::NoIdentifiers);
    }
    if distinct > MAX_IDENTIFIERS {
        return Err(Error::TooManyIdentifiers(distinct));
    }
    let firsts = &first_ix[..distinct];
    // The escaped identifiers, in buffers reused from check to check on this thread (taken
    // out for the check, which may wait on the store, and put back when it is decided).
    let mut ids = ID_BUFFERS.with(Cell::take);
    ids.truncate(distinct);
    for (k, &i) in firsts.iter().enumerate() {
        match ids.get_mut(k) {
            Some(buffer) => keyspace::escape_identifier_into(buffer, identifiers[i].as_ref()),
            None => ids.push(keyspace::escape_identifier(identifiers[i].as_ref())),
        }
    }
    let decision = decide_escaped(target, &ids, firsts, cost, charge).await;
    ID_BUFFERS.with(|b| b.set(ids));
    decision
}

thread_local! {
    /// Escaped-identifier buffers, reused by the checks on this thread.
    static ID_BUFFERS: Cell<Vec<String>> = const { Cell::new(Vec::new()) };
}

/// The check of escaped, distinct identifiers (`firsts`: the index of each among the
/// caller's).
async fn decide_escaped(
    target: &Target<'_>,
    ids: &[String],
    firsts: &[usize],
    cost: u64,
    charge: bool,
) -> Result<Decision, Error> {
    let policy = target.policy;
    let limits = policy.limits();
    if let Some((cache, _)) = target.deny_cache {
        if let Some(decision) = cache.lookup(ids, firsts, cost) {
            observe::deny_cache_hit(target.name);
            return Ok(decision);
        }
    }
    let sent = Instant::now();
    let store = target.store;
    let (outcome, guard) = match policy.concurrency() {
        _ if !charge => {
            let plan = Plan {
                ids,
                limits,
                cost,
                lease: "",
            };
            (store_peek(store, &plan).await.map_err(Error::Store)?, None)
        }
        None => {
            let plan = Plan {
                ids,
                limits,
                cost,
                lease: "",
            };
            (store.check(&plan).await.map_err(Error::Store)?, None)
        }
        Some(&slot) => {
            // Taking a slot must not be cut short: a caller that gives up (a client
            // that disconnects) while the script runs would leave a slot taken with no
            // guard to give it back. The check therefore runs in a task of its own, which
            // finishes and drops its guard whatever becomes of the caller.
            let task = take_slot(store.clone(), ids.to_vec(), limits.to_vec(), slot, cost);
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => match runtime.spawn(task).await {
                    Ok(result) => result?,
                    // A panic in the check is a bug, not a store failure for the failure
                    // policy to paper over: it goes on in the caller.
                    Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                    // Cancelled: the runtime is shutting down under the check.
                    Err(e) => return Err(Error::Store(StoreError::Backend(Box::new(e)))),
                },
                Err(_) => task.await?,
            }
        }
    };
    if let (Some((cache, generation)), false) = (target.deny_cache, outcome.allowed) {
        cache.record(ids, limits, &outcome, cost, sent, generation);
    }
    let statuses = outcome
        .entries
        .iter()
        .enumerate()
        .map(|(k, e)| LimitStatus {
            identifier: firsts[k / limits.len()],
            limit_index: k % limits.len(),
            limit: limits[k % limits.len()],
            allowed: e.allowed,
            remaining: e.remaining,
            reset_after: Duration::from_micros(e.reset_after_us),
            retry_after: (!e.allowed).then(|| Duration::from_micros(e.retry_after_us)),
        })
        .collect();
    Ok(Decision {
        allowed: outcome.allowed,
        shadow: false,
        cost,
        statuses,
        guard,
        origin: Origin::Store,
    })
}

/// Checks a policy with a concurrency limit; when allowed, holds the slot in a guard.
async fn take_slot(
    store: Store,
    ids: Vec<String>,
    limits: Vec<Limit>,
    slot: Limit,
    cost: u64,
) -> Result<(Outcome, Option<ConcurrencyGuard>), Error> {
    let id = lease_id();
    let plan = Plan {
        ids: &ids,
        limits: &limits,
        cost,
        lease: &id,
    };
    let result = store.check(&plan).await;
    let lease = Lease {
        keys: ids.iter().map(|i| store.key(i, &slot)).collect(),
        id,
        lease_us: slot.window_us(),
    };
    match result {
        Ok(outcome) if outcome.allowed => Ok((outcome, Some(ConcurrencyGuard::new(lease, store)))),
        Ok(outcome) => Ok((outcome, None)),
        Err(e) => {
            // The script may have run and taken the slot before the answer was lost (a
            // timeout, a dropped connection): give it back, as a guard dropped at once would.
            drop(ConcurrencyGuard::new(lease, store));
            Err(Error::Store(e))
        }
    }
}

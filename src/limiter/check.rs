//! One check of a limiter, from the identifiers to the decision: validation, deduplication,
//! escaping, the deny cache, the store (or its read-only twin), the failure policy and shadow
//! mode.

use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::deny_cache::DenyCache;
use super::{Error, Limiter, OnStoreError, Version, MAX_IDENTIFIERS};
use crate::algorithm::{Entry, Sink, Summary};
use crate::decision::{Decision, LimitStatus, Origin};
use crate::guard::ConcurrencyGuard;
use crate::observe::{self, Action, LimiterKeys};
use crate::policy::{Limit, Policy};
use crate::store::keyspace;
use crate::store::lease::{lease_id, Lease};
use crate::store::{LetGo, MemoryStore, Namespace, OneKey, Outcome, Plan, Store, StoreError};

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
    /// Count an answer of the failure policy or the deny cache (a check does; a peek does
    /// not, nor the layer's charge after its peek, which counted them; a waiting check's
    /// every check does, though it records one decision).
    pub(crate) answers: bool,
}

impl Mode {
    /// A check as [`Limiter::check_n`] makes it.
    pub(crate) const CHECK: Mode = Mode {
        shadow: false,
        charge: true,
        record: true,
        answers: true,
    };

    /// A read-only check as [`Limiter::peek_n`] makes it: not counted as a decision.
    pub(crate) const PEEK: Mode = Mode {
        shadow: false,
        charge: false,
        record: false,
        answers: false,
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
    /// The keys of what the check counts in the metrics.
    keys: &'a LimiterKeys,
    /// The limiter's namespace on both its stores.
    namespace: Option<&'a Namespace>,
    /// The shape of an identifier's one key on the memory store, if it has one.
    one_key: Option<&'a OneKey>,
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
        // Decided here when the store decides at once, so that its answer is not handed up
        // through the futures of the remote check.
        if let Some(answer) = self.run_now(identifiers, cost, mode) {
            return answer;
        }
        self.run_within(identifiers, cost, mode, Duration::ZERO)
            .await
            .map(|(decision, _)| decision)
    }

    /// [`run`](Limiter::run) for a check that may wait up to `max_wait` to be admitted (see
    /// `algorithm::reserve`): the decision, and how long the caller waits for the time it was
    /// admitted at (zero in shadow mode: the request goes at once, charged as when
    /// enforcing).
    pub(crate) async fn run_within<I: AsRef<str>>(
        &self,
        identifiers: &[I],
        cost: u64,
        mode: Mode,
        max_wait: Duration,
    ) -> Result<(Decision, Duration), Error> {
        if let Some(answer) = self.run_at_once(identifiers, cost, mode, max_wait) {
            return answer;
        }
        let version = self.inner.version.load_full();
        self.run_remote(&version, identifiers, cost, mode, max_wait)
            .await
    }

    /// [`run_within`](Limiter::run_within) on `version` of the policy, whichever is in force
    /// now: the checks of one waiting request, which finish on the policy they started with.
    pub(super) async fn run_within_on<I: AsRef<str>>(
        &self,
        version: &Arc<Version>,
        identifiers: &[I],
        cost: u64,
        mode: Mode,
        max_wait: Duration,
    ) -> Result<(Decision, Duration), Error> {
        if let Some(store) = self.inner.store.as_memory() {
            return self.at_once_on(store, version, identifiers, cost, mode, max_wait);
        }
        self.run_remote(version, identifiers, cost, mode, max_wait)
            .await
    }

    /// [`run_within`](Limiter::run_within) on a store that must be waited on, on `version`.
    async fn run_remote<I: AsRef<str>>(
        &self,
        version: &Arc<Version>,
        identifiers: &[I],
        cost: u64,
        mode: Mode,
        max_wait: Duration,
    ) -> Result<(Decision, Duration), Error> {
        let shadow = mode.shadow || self.inner.shadow.load(Ordering::Relaxed);
        // A denial the deny cache answers is made here, without the remote check's future.
        // On a miss the remote check escapes the identifiers again: keeping them escaped
        // across its `await` would add their buffers (160 bytes) to every check's future,
        // the memory store's too, to save a few hundred instructions beside a round trip.
        let target = self.target(version, None);
        if let Some(decision) = cached_denial(&target, identifiers, cost, max_wait) {
            // (a peek answered by the cache is no check the cache saved)
            if mode.answers {
                observe::deny_cache_hit(target.keys);
            }
            let mut answer = Ok((decision, Duration::ZERO));
            self.settle(version, &mut answer, cost, mode, shadow);
            return answer;
        }
        // Boxed: the remote check's state machine runs to kilobytes, and a future that held
        // it inline would be copied whole wherever it is moved.
        let mut answer = Box::pin(self.answer(version, identifiers, cost, mode, max_wait)).await;
        self.settle(version, &mut answer, cost, mode, shadow);
        answer
    }

    /// [`run_within`](Limiter::run_within) when the store decides at once (the memory store:
    /// it never waits), made here and now, without a future, on the version read without
    /// touching its count; `None` for a store that must be waited on.
    ///
    /// Inlined, with `decide_now`'s short way and `settle`, into the caller: the decision is
    /// then built once, where the caller keeps it. Handed up by value through functions of
    /// their own, its fields were copied at each step, wider than they had been written,
    /// which stalls the processor on every copy (each load waits for the stores it spans).
    #[inline(always)]
    pub(crate) fn run_at_once<I: AsRef<str>>(
        &self,
        identifiers: &[I],
        cost: u64,
        mode: Mode,
        max_wait: Duration,
    ) -> Option<Result<(Decision, Duration), Error>> {
        let store = self.inner.store.as_memory()?;
        let version = self.inner.version.load();
        Some(self.at_once_on(store, &version, identifiers, cost, mode, max_wait))
    }

    /// [`run_at_once`](Limiter::run_at_once) on the memory store `store` and `version`.
    #[inline(always)]
    fn at_once_on<I: AsRef<str>>(
        &self,
        store: &MemoryStore,
        version: &Version,
        identifiers: &[I],
        cost: u64,
        mode: Mode,
        max_wait: Duration,
    ) -> Result<(Decision, Duration), Error> {
        let shadow = mode.shadow || self.inner.shadow.load(Ordering::Relaxed);
        let target = self.target(version, None);
        let mut answer = decide_now(store, &target, identifiers, cost, mode.charge, max_wait);
        self.settle(version, &mut answer, cost, mode, shadow);
        answer
    }

    /// Where a check on `version` looks first (`fallback`: the fallback store and policy
    /// instead of the store).
    fn target<'a>(
        &'a self,
        version: &'a Version,
        fallback: Option<(&'a Store, &'a Policy)>,
    ) -> Target<'a> {
        let (store, policy, deny_cache, one_key) = match fallback {
            Some((store, policy)) => (store, policy, None, None),
            None => (
                &self.inner.store,
                &version.policy,
                self.inner
                    .deny_cache
                    .as_ref()
                    .map(|c| (c, version.generation)),
                version.one_key.as_ref(),
            ),
        };
        Target {
            store,
            policy,
            deny_cache,
            keys: &version.keys,
            namespace: self.inner.namespace.as_ref(),
            one_key,
        }
    }

    /// Shadow mode and the record of a check's answer, made on the answer where it lies (see
    /// `run_at_once`).
    #[inline(always)]
    fn settle(
        &self,
        version: &Version,
        answer: &mut Result<(Decision, Duration), Error>,
        cost: u64,
        mode: Mode,
        shadow: bool,
    ) {
        match answer {
            Ok((decision, wait)) => {
                decision.shadow = shadow;
                // in shadow mode the request goes at once, charged as when enforcing
                if shadow {
                    *wait = Duration::ZERO;
                }
            }
            // Shadow mode never refuses: a check the enforcing limiter would refuse as
            // impossible, or for want of a store, lets the request through as a would-be
            // denial.
            Err(Error::Cost { .. } | Error::Store(_)) if shadow => {
                *answer = Ok((Decision::refused_unchecked(cost), Duration::ZERO));
            }
            // (a store's failure is counted by the failure policy's answer)
            Err(Error::Store(_)) => return,
            Err(e) => {
                if mode.record {
                    observe::check_failed(&version.name, e);
                }
                return;
            }
        }
        if let (true, Ok((answer, _))) = (mode.record, &*answer) {
            self.record(version, answer);
        }
    }

    /// Counts a decision made on `version` in the metrics, and logs it if a would-be denial.
    pub(super) fn record(&self, version: &Version, decision: &Decision) {
        let log = &self.inner.shadow_log;
        observe::decision(&version.keys, decision, log, &version.name);
    }

    /// The check with the failure policy, without shadow mode. A failure policy's answer is
    /// counted when the mode counts answers ([`Mode::answers`]): a peek's is not.
    async fn answer<I: AsRef<str>>(
        &self,
        version: &Arc<Version>,
        identifiers: &[I],
        cost: u64,
        mode: Mode,
        max_wait: Duration,
    ) -> Result<(Decision, Duration), Error> {
        let charge = mode.charge;
        let target = self.target(version, None);
        let started = tokio::time::Instant::now();
        let error = match decide(&target, identifiers, cost, charge, max_wait).await {
            Err(Error::Store(e)) => e,
            other => return other,
        };
        // The caller's longest wait counts from its call: the fallback has what the store's
        // failure left of it (a timeout may have taken much of it).
        let max_wait = max_wait.saturating_sub(started.elapsed());
        let name = &*version.name;
        let answered = |action| {
            if mode.answers {
                observe::failure_answered(name, &version.keys, action, &error);
            }
        };
        match (
            self.inner.on_error,
            &self.inner.fallback_store,
            &version.fallback,
        ) {
            (OnStoreError::Fallback(_), Some(store), Some((policy, origins))) => {
                let fallback = self.target(version, Some((store, policy)));
                match decide(&fallback, identifiers, cost, charge, max_wait).await {
                    Ok((mut decision, wait)) => {
                        answered(Action::Fallback);
                        decision.origin = Origin::Fallback;
                        // Its statuses name the limits of the limiter's policy they stand for
                        // (with the scaled limit, which is the one enforced), as every other
                        // decision's do: not their places in the scaled policy.
                        for s in &mut decision.statuses {
                            s.limit_index = origins.get(s.limit_index).copied().unwrap_or(0);
                        }
                        Ok((decision, wait))
                    }
                    // The scaled policy cannot hold this cost: the store's failure stands,
                    // counted as the closed answer it is.
                    Err(_) => {
                        answered(Action::Closed);
                        Err(Error::Store(error))
                    }
                }
            }
            (OnStoreError::Closed, ..) => {
                answered(Action::Closed);
                Err(Error::Store(error))
            }
            _ => {
                answered(Action::Open);
                Ok((Decision::unchecked(cost), Duration::ZERO))
            }
        }
    }
}

/// The distinct identifiers of a check, escaped for the store, in buffers reused from check
/// to check on this thread: taken out for the check, which may wait on the store, and put
/// back when it is decided (a check cut short drops them, and the next one starts with fresh
/// buffers).
struct Escaped {
    ids: Vec<String>,
    /// The index of each among the caller's identifiers (its first occurrence).
    first_ix: [usize; MAX_IDENTIFIERS],
    count: usize,
}

impl Escaped {
    /// Checks the identifiers, then `cost` against `policy` (in that order: shadow mode
    /// answers a cost's error, never the caller's identifiers'), and escapes the distinct
    /// identifiers.
    fn of<I: AsRef<str>>(identifiers: &[I], cost: u64, policy: &Policy) -> Result<Escaped, Error> {
        let (first_ix, count) = first_occurrences(identifiers)?;
        admissible(cost, policy)?;
        // `try_with`: on a thread being torn down, buffers of its own.
        let mut ids = ID_BUFFERS.try_with(Cell::take).unwrap_or_default();
        ids.truncate(count);
        for (k, &i) in first_ix[..count].iter().enumerate() {
            match ids.get_mut(k) {
                Some(buffer) => keyspace::escape_identifier_into(buffer, identifiers[i].as_ref()),
                None => ids.push(keyspace::escape_identifier(identifiers[i].as_ref())),
            }
        }
        Ok(Escaped {
            ids,
            first_ix,
            count,
        })
    }

    fn firsts(&self) -> &[usize] {
        &self.first_ix[..self.count]
    }
}

impl Drop for Escaped {
    fn drop(&mut self) {
        let ids = std::mem::take(&mut self.ids);
        let _ = ID_BUFFERS.try_with(|b| b.set(ids));
    }
}

thread_local! {
    /// Escaped-identifier buffers, reused by the checks on this thread.
    static ID_BUFFERS: Cell<Vec<String>> = const { Cell::new(Vec::new()) };
}

/// Whether `policy` could ever admit `cost`.
#[inline(always)]
fn admissible(cost: u64, policy: &Policy) -> Result<(), Error> {
    let max = policy.max_cost();
    if cost == 0 || cost > max {
        return Err(Error::Cost { cost, max });
    }
    Ok(())
}

/// The check on the memory store, made at once (it never fails, so no failure policy
/// answers; it holds no deny cache: the store itself answers as fast).
#[inline(always)]
fn decide_now<I: AsRef<str>>(
    store: &MemoryStore,
    target: &Target<'_>,
    identifiers: &[I],
    cost: u64,
    charge: bool,
    max_wait: Duration,
) -> Result<(Decision, Duration), Error> {
    // One identifier whose state is one key: escaped straight into its key, in the shape the
    // limiter worked out with its policy.
    if let (true, Some(shape), [id]) = (charge, target.one_key, identifiers) {
        admissible(cost, target.policy)?;
        let limits = target.policy.limits();
        let mut statuses = crate::decision::status_buffer();
        let mut sink = Statuses {
            out: &mut statuses,
            firsts: &[0],
            limits,
        };
        let wait = max_wait_us(max_wait);
        let summary = store.check_one(shape, id.as_ref(), limits, cost, wait, &mut sink);
        return Ok(decided(summary, cost, statuses, None));
    }
    decide_now_general(store, target, identifiers, cost, charge, max_wait)
}

/// [`decide_now`] the general way: several identifiers (or none), a policy with several keys
/// per identifier or a concurrency limit, or a peek.
#[inline(never)]
fn decide_now_general<I: AsRef<str>>(
    store: &MemoryStore,
    target: &Target<'_>,
    identifiers: &[I],
    cost: u64,
    charge: bool,
    max_wait: Duration,
) -> Result<(Decision, Duration), Error> {
    let escaped = Escaped::of(identifiers, cost, target.policy)?;
    let limits = target.policy.limits();
    let namespace = target.namespace.map(Namespace::as_str);
    let plan = Plan {
        ids: &escaped.ids,
        namespace,
        limits,
        cost,
        lease: "",
    };
    let mut statuses = crate::decision::status_buffer();
    let mut sink = Statuses {
        out: &mut statuses,
        firsts: escaped.firsts(),
        limits,
    };
    let (summary, guard) = match target.policy.concurrency() {
        _ if !charge => (store.peek_into(&plan, &mut sink), None),
        None => (
            store.check_into(&plan, max_wait_us(max_wait), &mut sink),
            None,
        ),
        // Made at once, the check cannot be cut short between taking the slot and guarding
        // it.
        Some(slot) => {
            let id = lease_id();
            let plan = Plan { lease: &id, ..plan };
            let summary = store.check_into(&plan, 0, &mut sink);
            let held = (&escaped.ids[..], namespace);
            let store = Store::Memory(store.clone());
            let guard = summary
                .allowed
                .then(|| ConcurrencyGuard::new(lease(&store, held, slot, id), store));
            (summary, guard)
        }
    };
    Ok(decided(summary, cost, statuses, guard))
}

/// The decision a store made at once: `summary`, with the `statuses` of its entries.
#[inline(always)]
fn decided(
    summary: Summary,
    cost: u64,
    statuses: Vec<LimitStatus>,
    guard: Option<ConcurrencyGuard>,
) -> (Decision, Duration) {
    let decision = Decision {
        allowed: summary.allowed,
        shadow: false,
        cost,
        statuses,
        guard,
        origin: Origin::Store,
    };
    (decision, Duration::from_micros(summary.wait_us))
}

/// The deny cache's answer to a check (see `deny_cache`), if `target` has one: a denial
/// until later than the caller would wait, which the store could not better. A check the
/// cache cannot answer (none of its identifiers cached, a cost the policy never admits,
/// identifiers it refuses) goes to the store, whose answer the cache then learns from.
fn cached_denial<I: AsRef<str>>(
    target: &Target<'_>,
    identifiers: &[I],
    cost: u64,
    max_wait: Duration,
) -> Option<Decision> {
    let (cache, generation) = target.deny_cache?;
    let escaped = Escaped::of(identifiers, cost, target.policy).ok()?;
    let decision = cache
        .lookup(&escaped.ids, escaped.firsts(), cost, generation)
        .filter(|d| d.retry_after().is_some_and(|r| r > max_wait))?;
    Some(decision)
}

/// The check itself, on one store with one policy; a check that may wait up to `max_wait`
/// (not with a concurrency limit) also says how long it waits.
async fn decide<I: AsRef<str>>(
    target: &Target<'_>,
    identifiers: &[I],
    cost: u64,
    charge: bool,
    max_wait: Duration,
) -> Result<(Decision, Duration), Error> {
    let escaped = Escaped::of(identifiers, cost, target.policy)?;
    let (ids, firsts) = (&escaped.ids, escaped.firsts());
    let limits = target.policy.limits();
    let sent = Instant::now();
    // (read before the check is sent: a reset made while it runs moves it on)
    let epoch = target.deny_cache.map(|(cache, _)| cache.epoch());
    let store = target.store;
    let namespace = target.namespace.map(Namespace::as_str);
    let plan = Plan {
        ids,
        namespace,
        limits,
        cost,
        lease: "",
    };
    let (outcome, guard) = match target.policy.concurrency() {
        _ if !charge => (store.peek(&plan).await.map_err(Error::Store)?, None),
        None => {
            let outcome = store.check_within(&plan, max_wait_us(max_wait)).await;
            (outcome.map_err(Error::Store)?, None)
        }
        Some(&slot) => {
            // Taking a slot must not be cut short: a caller that gives up (a client
            // that disconnects) while the script runs would leave a slot taken with no
            // guard to give it back. The check therefore runs in a task of its own, which
            // finishes and drops its guard whatever becomes of the caller.
            let task = take_slot(
                store.clone(),
                ids.to_vec(),
                target.namespace.cloned(),
                limits.to_vec(),
                slot,
                cost,
            );
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
    if let (Some((cache, generation)), Some(epoch), false) =
        (target.deny_cache, epoch, outcome.allowed)
    {
        cache.record(ids, limits, &outcome, cost, sent, generation, epoch);
    }
    Ok(decision_of(outcome, firsts, limits, cost, guard))
}

/// The longest wait in whole µs (saturated).
fn max_wait_us(max_wait: Duration) -> u64 {
    u64::try_from(max_wait.as_micros()).unwrap_or(u64::MAX)
}

/// The decision a store's outcome makes, for identifiers `firsts` (their index among the
/// caller's) and `limits`, with wait it says.
fn decision_of(
    outcome: Outcome,
    firsts: &[usize],
    limits: &[Limit],
    cost: u64,
    guard: Option<ConcurrencyGuard>,
) -> (Decision, Duration) {
    let mut statuses = crate::decision::status_buffer();
    let mut sink = Statuses {
        out: &mut statuses,
        firsts,
        limits,
    };
    let per_id = limits.len();
    for (k, &entry) in outcome.entries.iter().enumerate() {
        // (an identifier whose figures are unknown has no statuses)
        if outcome.knows(k / per_id) {
            sink.entry(k / per_id, k % per_id, entry);
        }
    }
    let summary = Summary {
        allowed: outcome.allowed,
        at_us: outcome.at_us,
        wait_us: outcome.wait_us,
    };
    decided(summary, cost, statuses, guard)
}

/// A decision's statuses, written from a store's entries: for the `j`th distinct identifier,
/// its index among the caller's (`firsts[j]`).
struct Statuses<'a> {
    out: &'a mut Vec<LimitStatus>,
    firsts: &'a [usize],
    limits: &'a [Limit],
}

impl Sink for Statuses<'_> {
    fn entry(&mut self, id: usize, limit: usize, e: Entry) {
        self.out.push(LimitStatus {
            identifier: self.firsts[id],
            limit_index: limit,
            limit: self.limits[limit],
            allowed: e.allowed,
            remaining: e.remaining,
            reset_after: Duration::from_micros(e.reset_after_us),
            retry_after: (!e.allowed).then(|| Duration::from_micros(e.retry_after_us)),
        });
    }
}

/// The distinct identifiers among `identifiers`: the index of each one's first occurrence,
/// and each escaped for the store.
pub(super) fn distinct<I: AsRef<str>>(
    identifiers: &[I],
) -> Result<(Vec<usize>, Vec<String>), Error> {
    let (first_ix, count) = first_occurrences(identifiers)?;
    let firsts = first_ix[..count].to_vec();
    let ids = firsts
        .iter()
        .map(|&i| keyspace::escape_identifier(identifiers[i].as_ref()))
        .collect();
    Ok((firsts, ids))
}

/// The index of each distinct identifier's first occurrence among `identifiers`, in the
/// first `count` places (on the stack: a check names at most `MAX_IDENTIFIERS`).
fn first_occurrences<I: AsRef<str>>(
    identifiers: &[I],
) -> Result<([usize; MAX_IDENTIFIERS], usize), Error> {
    let mut first_ix = [0usize; MAX_IDENTIFIERS];
    let mut count = 0;
    for (i, id) in identifiers.iter().enumerate() {
        let id = id.as_ref();
        let earlier = first_ix[..count]
            .iter()
            .any(|&f| identifiers[f].as_ref() == id);
        if earlier {
            continue;
        }
        let Some(slot) = first_ix.get_mut(count) else {
            // Too many: the distinct ones are counted for the error, in a set rather than
            // each against every other (a caller's list of thousands would take seconds).
            let distinct: std::collections::HashSet<&str> =
                identifiers.iter().map(AsRef::as_ref).collect();
            return Err(Error::TooManyIdentifiers(distinct.len()));
        };
        *slot = i;
        count += 1;
    }
    if count == 0 {
        return Err(Error::NoIdentifiers);
    }
    Ok((first_ix, count))
}

/// The slot a check of `plan`'s identifiers (escaped) in its namespace takes under the lease
/// id `id` for concurrency limit `slot`, on every identifier.
fn lease(store: &Store, plan: (&[String], Option<&str>), slot: &Limit, id: String) -> Lease {
    let (ids, namespace) = plan;
    Lease {
        keys: ids.iter().map(|i| store.key(i, namespace, slot)).collect(),
        id,
        lease_us: slot.window_us(),
    }
}

/// Checks a policy with a concurrency limit; when allowed, holds the slot in a guard.
async fn take_slot(
    store: Store,
    ids: Vec<String>,
    namespace: Option<Namespace>,
    limits: Vec<Limit>,
    slot: Limit,
    cost: u64,
) -> Result<(Outcome, Option<ConcurrencyGuard>), Error> {
    let id = lease_id();
    let namespace = namespace.as_ref().map(Namespace::as_str);
    let plan = Plan {
        ids: &ids,
        namespace,
        limits: &limits,
        cost,
        lease: &id,
    };
    let result = store.check(&plan).await;
    let lease = lease(&store, (&ids[..], namespace), &slot, id);
    match result {
        Ok(outcome) if outcome.allowed => Ok((outcome, Some(ConcurrencyGuard::new(lease, store)))),
        Ok(outcome) => {
            // A denial across Cluster slots, one of whose calls failed and may have run (see
            // `Outcome::unsure`): its slot is given back as after a failed check (below).
            if outcome.unsure {
                store.let_go(lease, LetGo::Unsure);
            }
            Ok((outcome, None))
        }
        Err(e) => {
            // The script may have run and taken the slot before the answer was lost (a
            // timeout, a dropped connection), or may still be on its way: give it back now
            // and until its lease would have expired (a release on another connection could
            // overtake the script). Not when the store was known not to be called (its breaker open, its
            // configuration unusable): there is no slot, and a release of it would be
            // retried, and warned of, until its lease ran out, for every check of the outage.
            // (A failure while connecting is a backend failure like any other, and releases
            // to be safe.)
            if e.may_have_run() {
                store.let_go(lease, LetGo::Unsure);
            }
            Err(Error::Store(e))
        }
    }
}

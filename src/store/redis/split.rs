//! Checks whose identifiers live in several hash slots, and refunds.
//!
//! One identifier's keys share a hash tag, so they live in one slot; a check of several
//! identifiers (an IP and a user) may span slots, and one script call cannot touch keys of two
//! slots in Redis Cluster. [`RedisStore::check_split`] runs one check call per group of
//! identifiers, concurrently, and merges their answers all-or-nothing: when some group denies,
//! the groups that admitted are given their charge back ([`RedisStore::refund`], the script of
//! `lua/refund.lua`). DESIGN.md ("Checks across Cluster slots") says what this guarantees.

use futures_util::future::join_all;

use super::{script, RedisStore};
use crate::algorithm::Entry;
use crate::store::{Outcome, Plan, StoreError};

impl RedisStore {
    /// Gives back what an admitted check of `plan` charged, decided at `at_us` (its
    /// [`Outcome::at_us`]): one call of the policy's refund script, under the timeout like a
    /// check, never retried. Not through the breaker: the master it goes to answered the
    /// check a moment ago, and a breaker opened by the failures of another master (the one
    /// whose group failed) would leave the charge in place. Each limit gives back at most what the
    /// charge still holds (see `lua/refund.lua`); the slot of a concurrency limit
    /// (`plan.lease`) is released; a missing key is not created, a packed key keeps its TTL.
    ///
    /// # Errors
    ///
    /// As a check: the store is unavailable, timed out or failed. The refund may then have
    /// run or not; either way the store never admits more than its limits.
    pub(crate) async fn refund(&self, plan: &Plan<'_>, at_us: u64) -> Result<(), StoreError> {
        let compiled = script::refund_script(plan.limits, plan.ids.len());
        let mut call = compiled.script.prepare_invoke();
        script::refund_args(&mut call, &self.prefix, plan, at_us);
        self.run(|mut conn| async move { call.invoke_async::<()>(&mut conn).await })
            .await
    }

    /// A check of `plan` whose identifiers are split into `groups` (indices into `plan.ids`,
    /// each identifier in exactly one group): one check call per group, all at once, each
    /// through the breaker and under the timeout exactly as [`check`](Self::check). Their
    /// answers are merged into one [`Outcome`] laid out as a single check's (per identifier
    /// in the plan's order, per limit), stamped with the earliest group's time:
    ///
    /// Each group is one script call ([`check_call`](Self::check_call)): on a cluster, the
    /// caller groups by hash slot.
    ///
    /// * every group admits: admitted, in one round trip;
    /// * every group denies: denied; nothing was charged anywhere;
    /// * some admit, some deny: denied, and each admitting group is refunded (its own call),
    ///   which releases the slot a concurrency limit took there. The remaining quota of an
    ///   admitting group is reported with its charge given back, as a denied single check
    ///   reports it; its times until reset are those its check reported.
    /// * a group fails (a timeout, an error) and another denies: denied, as the denying group
    ///   says (no answer of the failed group could admit the check), once the admitting groups
    ///   were refunded. The failed group's identifiers have no figures
    ///   ([`Outcome::unknown`]); when its call may have run, the outcome says so
    ///   ([`Outcome::unsure`]) and the limiter releases the slot it may have taken.
    /// * a group fails and none denies: the check fails with the first group's error that may
    ///   have run, or else the first (the limiter's failure policy answers it), once the
    ///   admitting groups were refunded.
    ///
    /// A group that failed may have charged, and is not refunded (nothing says it ran): that
    /// charge can only deny requests later, never admit one, and the limiter releases the
    /// slot it may have taken, as after any failed check.
    ///
    /// The check never admits more than each group's limits allow. Between a charge and its
    /// refund, other checks see the charge, so a few may be denied that would have been
    /// admitted: the under-admission is bounded by the charges in flight, and lasts a round
    /// trip. A refund that fails is logged and counted (`BoundedLog::refund_failed`); its charge
    /// then stays until its state expires. The calls and refunds run in a task of their own,
    /// so a caller that gives up meanwhile (a client disconnecting) cuts none of them short.
    ///
    /// Groups that do not partition the identifiers are checked as one group.
    ///
    /// # Errors
    ///
    /// As [`check`](Self::check), for the first group that failed, when no group denied.
    pub(crate) async fn check_split(
        &self,
        plan: &Plan<'_>,
        groups: &[Vec<usize>],
    ) -> Result<Outcome, StoreError> {
        if !partitions(groups, plan.ids.len()) {
            return self.check_call(plan, 0).await;
        }
        // The calls, and the refunds a denial among them needs, run in a task of their own:
        // a caller that gives up meanwhile (a client disconnecting) would otherwise leave
        // the groups that admitted charged, or a slot taken, until their state expires.
        let task = charge_groups(self.clone(), Owned::of(plan), group_ids(plan, groups));
        let results = match tokio::runtime::Handle::try_current() {
            Ok(runtime) => match runtime.spawn(task).await {
                Ok(results) => results,
                // a bug, not a store failure: it goes on in the caller
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                // cancelled: the runtime is shutting down under the check
                Err(e) => return Err(StoreError::Backend(Box::new(e))),
            },
            Err(_) => task.await,
        };
        let Settled {
            mut outcomes,
            unsure,
        } = settled(results)?;
        if outcomes.iter().flatten().any(|o| !o.allowed) {
            for outcome in outcomes.iter_mut().flatten().filter(|o| o.allowed) {
                uncharged(outcome, plan.limits, plan.cost);
            }
        }
        let mut merged = merge(groups, &outcomes, plan.ids.len(), plan.limits.len())
            .ok_or_else(|| StoreError::UnexpectedReply("a check of the wrong size".into()))?;
        merged.unsure = unsure;
        Ok(merged)
    }

    /// A peek of `plan` whose identifiers are split into `groups` (as
    /// [`check_split`](Self::check_split)'s): one peek call per group, all at once, merged
    /// into one [`Outcome`] laid out as a single peek's. A peek charges nothing, and each
    /// identifier's figures come from its own states alone, so the merged peek reports what
    /// one call would: admitted when every group admits. It fails with the first group's
    /// error, even when another group denies: unlike a check, which a denial settles, a peek
    /// is also asked for every figure ([`Limiter::usage`](crate::Limiter::usage)), and
    /// admits nothing.
    pub(crate) async fn peek_split(
        &self,
        plan: &Plan<'_>,
        groups: &[Vec<usize>],
    ) -> Result<Outcome, StoreError> {
        if !partitions(groups, plan.ids.len()) {
            return self.peek_call(plan).await;
        }
        let ids = group_ids(plan, groups);
        let plans = group_plans(plan, &ids);
        let results = join_all(plans.iter().map(|p| self.peek_call(p))).await;
        let outcomes = results
            .into_iter()
            .map(|r| r.map(Some))
            .collect::<Result<Vec<_>, _>>()?;
        merge(groups, &outcomes, plan.ids.len(), plan.limits.len())
            .ok_or_else(|| StoreError::UnexpectedReply("a peek of the wrong size".into()))
    }
}

/// What a plan holds besides its identifiers, owned, for a task of its own.
struct Owned {
    namespace: Option<String>,
    limits: Vec<crate::policy::Limit>,
    cost: u64,
    lease: String,
}

impl Owned {
    fn of(plan: &Plan<'_>) -> Owned {
        Owned {
            namespace: plan.namespace.map(str::to_string),
            limits: plan.limits.to_vec(),
            cost: plan.cost,
            lease: plan.lease.to_string(),
        }
    }

    /// The plan of the identifiers `ids`.
    fn plan<'a>(&'a self, ids: &'a [String]) -> Plan<'a> {
        Plan {
            ids,
            namespace: self.namespace.as_deref(),
            limits: &self.limits,
            cost: self.cost,
            lease: &self.lease,
        }
    }
}

/// Checks each group of identifiers `ids` (one call each, all at once) and, when some group
/// did not admit, refunds the groups that did, all at once, logging and counting the refunds
/// that fail. The answers of the groups' checks, in order.
///
/// The denial waits for its refunds: once the caller is told, the check holds nothing
/// (unless a refund failed), so a retry of its own never meets its own charge, and a test or
/// a caller sees a settled state. It costs one more round trip, only when the groups
/// disagree.
async fn charge_groups(
    store: RedisStore,
    plan: Owned,
    ids: Vec<Vec<String>>,
) -> Vec<Result<Outcome, StoreError>> {
    let plans: Vec<Plan<'_>> = ids.iter().map(|ids| plan.plan(ids)).collect();
    let results = join_all(plans.iter().map(|p| store.check_call(p, 0))).await;
    let admitted: Vec<(&Plan<'_>, u64)> = results
        .iter()
        .zip(&plans)
        .filter_map(|(r, p)| match r {
            Ok(o) if o.allowed => Some((p, o.at_us)),
            _ => None,
        })
        .collect();
    if !admitted.is_empty() && admitted.len() < plans.len() {
        refund_charges(&store, &admitted).await;
    }
    results
}

/// Gives back `charges` (each a plan and the time it was charged at), all at once, logging
/// and counting the refunds that fail.
async fn refund_charges(store: &RedisStore, charges: &[(&Plan<'_>, u64)]) {
    let refunds = charges.iter().map(|&(plan, at)| store.refund(plan, at));
    for result in join_all(refunds).await {
        if let Err(e) = result {
            store.refund_log.refund_failed(&store.prefix, &e);
        }
    }
}

/// The figures of a refunded check as a check that charged nothing reports them, as a denied
/// single check does (and the memory store): each limit's remaining quota with the charge
/// given back — the cost, or the one slot of a concurrency limit. (An admitted check fitted,
/// so the quota before it was exactly that much more.) The times until reset stay as the
/// check reported them.
fn uncharged(outcome: &mut Outcome, limits: &[crate::policy::Limit], cost: u64) {
    if limits.is_empty() {
        return;
    }
    for (k, entry) in outcome.entries.iter_mut().enumerate() {
        let limit = &limits[k % limits.len()];
        let back = if limit.is_concurrency() { 1 } else { cost };
        entry.remaining = entry.remaining.saturating_add(back);
    }
}

/// The identifiers of each group of `plan`.
fn group_ids(plan: &Plan<'_>, groups: &[Vec<usize>]) -> Vec<Vec<String>> {
    groups
        .iter()
        .map(|g| g.iter().map(|&i| plan.ids[i].clone()).collect())
        .collect()
}

/// `plan` for each group's identifiers.
fn group_plans<'a>(plan: &Plan<'a>, ids: &'a [Vec<String>]) -> Vec<Plan<'a>> {
    ids.iter()
        .map(|ids| Plan {
            ids,
            namespace: plan.namespace,
            limits: plan.limits,
            cost: plan.cost,
            lease: plan.lease,
        })
        .collect()
}

/// Whether `groups` hold each of `0..ids` exactly once.
fn partitions(groups: &[Vec<usize>], ids: usize) -> bool {
    let mut seen = vec![false; ids];
    for &i in groups.iter().flatten() {
        match seen.get_mut(i) {
            Some(s) if !*s => *s = true,
            _ => return false,
        }
    }
    seen.iter().all(|&s| s)
}

/// The groups' outcomes as one check's: admitted when every group admitted, the entries per
/// identifier in the plan's order (`per_id` per identifier), stamped with the earliest time.
/// A group without an outcome (its call failed) has its identifiers' figures unknown
/// ([`Outcome::unknown`]), their entries placeholders, and the check is not admitted.
/// `None` when an outcome does not hold its group's entries, or no group has one.
fn merge(
    groups: &[Vec<usize>],
    outcomes: &[Option<Outcome>],
    ids: usize,
    per_id: usize,
) -> Option<Outcome> {
    // where each identifier's entries are: (group, position in it)
    let mut at = vec![(0, 0); ids];
    for (g, group) in groups.iter().enumerate() {
        for (p, &i) in group.iter().enumerate() {
            *at.get_mut(i)? = (g, p);
        }
    }
    let mut entries = Vec::with_capacity(ids * per_id);
    let mut unknown = 0u16;
    for (j, (g, p)) in at.into_iter().enumerate() {
        match outcomes.get(g)? {
            Some(outcome) => {
                entries.extend_from_slice(outcome.entries.get(p * per_id..(p + 1) * per_id)?);
            }
            None => {
                unknown |= 1u16.checked_shl(u32::try_from(j).ok()?)?;
                entries.extend(std::iter::repeat_n(UNKNOWN, per_id));
            }
        }
    }
    let answered = || outcomes.iter().flatten();
    Some(Outcome {
        allowed: unknown == 0 && answered().all(|o| o.allowed),
        entries: entries.into(),
        at_us: answered().map(|o| o.at_us).min()?,
        wait_us: 0,
        unknown,
        unsure: false,
    })
}

/// The entry of an (identifier, limit) pair whose figures are unknown: a placeholder, left
/// out of the decision. Were it read, it would hold nothing back (no retry time, nothing for
/// the deny cache to learn).
const UNKNOWN: Entry = Entry {
    allowed: true,
    remaining: 0,
    reset_after_us: 0,
    retry_after_us: 0,
};

/// What the groups of a check across slots answered.
#[derive(Debug)]
struct Settled {
    /// Each group's outcome, `None` for a group whose call failed.
    outcomes: Vec<Option<Outcome>>,
    /// Whether a call that failed may have run.
    unsure: bool,
}

/// The groups' outcomes, or the error the check fails with.
///
/// A group that denied decides the check whatever became of the others (all or nothing: no
/// answer of theirs could admit it), so a check with a denial among its answers is settled,
/// its failed groups without outcomes. Failing open, or to a fallback, on such a check would
/// admit a request Redis just refused.
///
/// Otherwise a failure fails the check with the first error that may have run (a timeout, an
/// answer lost), else the first. A group that may have run may hold a concurrency slot, which
/// the limiter releases after a failed check only when its error says the check may have run:
/// an `Unavailable` of another group (its breaker opened between the groups' calls) must not
/// hide it.
fn settled(results: Vec<Result<Outcome, StoreError>>) -> Result<Settled, StoreError> {
    let denied = results.iter().any(|r| matches!(r, Ok(o) if !o.allowed));
    let mut outcomes = Vec::with_capacity(results.len());
    let mut failed: Option<StoreError> = None;
    let mut unsure = false;
    for result in results {
        match result {
            Ok(outcome) => outcomes.push(Some(outcome)),
            Err(e) => {
                outcomes.push(None);
                unsure |= e.may_have_run();
                if failed
                    .as_ref()
                    .is_none_or(|f| !f.may_have_run() && e.may_have_run())
                {
                    failed = Some(e);
                }
            }
        }
    }
    match failed {
        Some(e) if !denied => Err(e),
        _ => Ok(Settled { outcomes, unsure }),
    }
}

#[cfg(test)]
mod tests;

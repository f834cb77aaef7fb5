//! The layer's checks: one or two limiters per request, and — when the layer charges by
//! response — the charge made once the response is known.
//!
//! Limiters that decide at once (the memory store) are checked in the service's `call`,
//! without a future of their own; the others in the response future.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::key::{Identifier, Identifiers};
use crate::limiter::Mode;
use crate::observe::BoundedLog;
use crate::{Decision, Error, Limiter, Origin};

/// Where a check made at once got to.
pub(super) enum AtOnce {
    /// Decided.
    Decided(Result<Decision, Error>),
    /// To be made by [`check_both`]: nothing decided, or (`Some`) the first limiter's
    /// decision, when the second does not decide at once.
    Later(Option<Decision>),
}

/// [`check_both`], at once, when both limiters decide at once.
pub(super) fn check_both_now(
    first: &Limiter,
    then: Option<&Limiter>,
    ids: &[Identifier],
    cost: u64,
    mode: Mode,
) -> AtOnce {
    if !first.decides_at_once() || then.is_some_and(|then| !then.decides_at_once()) {
        return AtOnce::Later(None);
    }
    let decision = match first.run_now(ids, cost, mode) {
        Some(Ok(decision)) => decision,
        Some(Err(e)) => return AtOnce::Decided(Err(e)),
        None => return AtOnce::Later(None),
    };
    match then {
        Some(then) if checks_second(&decision, then, mode) => {
            then_now((decision, first), then, ids, cost, mode)
        }
        _ => AtOnce::Decided(Ok(decision.visible())),
    }
}

/// The first limiter's decision, as the layer shows it, and whether it was a trial (shadow
/// mode), which [`Decision::visible`] no longer says.
struct First {
    decision: Decision,
    trial: bool,
}

impl First {
    fn of(decision: Decision) -> First {
        First {
            trial: decision.is_shadow(),
            decision: decision.visible(),
        }
    }
}

/// Whether a request the first limiter decided (`first`) is checked by the second, `then`:
/// when the first admits; when it denies, never; when it would deny in shadow mode, only if
/// the second enforces. A trial of both (the layer in shadow mode, or both limiters) charges
/// as enforcing would, nothing of the second; a trial of the first alone leaves the second's
/// answers as they were without it.
fn checks_second(first: &Decision, then: &Limiter, mode: Mode) -> bool {
    !first.would_deny() || (first.is_shadow() && !(mode.shadow || then.is_shadow()))
}

/// The second limiter of [`check_both_now`], once the first allowed `decision` (or would
/// deny it in a trial of its own).
// Out of line: a layer has one limiter per request far more often than two, and inlining
// a second check here would double the code the usual request runs through.
#[inline(never)]
fn then_now(
    (decision, first): (Decision, &Limiter),
    then: &Limiter,
    ids: &[Identifier],
    cost: u64,
    mode: Mode,
) -> AtOnce {
    match then.run_now(ids, cost, mode) {
        Some(Ok(second)) => AtOnce::Decided(Ok(joined(First::of(decision), second, first))),
        // An error drops the first decision, and with it any slot it took.
        Some(Err(e)) => AtOnce::Decided(Err(e)),
        None => AtOnce::Later(Some(decision)),
    }
}

/// Checks `ids` against `first` (unless `done` is its decision already), then — if it
/// allowed — against `then`: one decision listing the limits of both, allowed if both
/// allowed, holding the concurrency slots of both.
///
/// Each decision is taken as the layer shows it ([`Decision::visible`]): a shadow decision
/// lets the request through and lists nothing.
pub(super) async fn check_both(
    first: &Limiter,
    then: Option<&Limiter>,
    ids: &[Identifier],
    cost: u64,
    mode: Mode,
    done: Option<Decision>,
) -> Result<Decision, Error> {
    let decision = match done {
        Some(decision) => decision,
        None => first.run(ids, cost, mode).await?,
    };
    let Some(then) = then.filter(|then| checks_second(&decision, then, mode)) else {
        return Ok(decision.visible());
    };
    let limiter = first;
    let first = First::of(decision);
    // An error or a denial here drops the first decision, and with it any slot it took.
    let second = then.run(ids, cost, mode).await?;
    Ok(joined(first, second, limiter))
}

/// The decision of two limiters, the first of which allowed (or would deny in a trial of its
/// own): the limits of both, allowed if the second allowed, holding the slots of both then.
/// When both are trials and the second would deny, the first's slot is given back: enforcing,
/// the request is refused and holds none, and a trial holds the slots enforcing would.
///
/// The second's statuses follow the first's, their limit indices counted on from the first
/// limiter's (`limiter`'s) limits.
fn joined(first: First, second: Decision, limiter: &Limiter) -> Decision {
    let First {
        mut decision,
        trial,
    } = first;
    if trial && second.is_shadow() && second.would_deny() {
        drop(decision.take_guard());
    }
    let mut second = second.visible();
    // The first decision's own count when it lists its limits (an allowed decision lists
    // them all, on the policy it was made on, which a policy change meanwhile leaves as it
    // was); the limiter's now when it lists none (answered by the failure policy).
    let offset = (decision.statuses.iter())
        .map(|s| s.limit_index + 1)
        .max()
        .unwrap_or_else(|| limiter.limit_count());
    decision.statuses.extend(second.statuses.iter().map(|s| {
        let mut s = *s;
        s.limit_index += offset;
        s
    }));
    decision.allowed = second.is_allowed();
    decision.guard = match (decision.guard.take(), second.take_guard()) {
        _ if !decision.allowed => None,
        (Some(a), Some(b)) => Some(a.join(b)),
        (a, b) => a.or(b),
    };
    decision
}

/// Whether a response is charged, for a layer that charges by response.
pub(crate) type ChargeFn = std::sync::Arc<dyn Fn(&http::response::Parts) -> bool + Send + Sync>;

/// The charge of a request that passed a layer's peek, made if its response is selected.
pub(crate) struct Pending {
    pub(super) first: Limiter,
    pub(super) then: Option<Limiter>,
    pub(super) ids: Identifiers,
    pub(super) cost: u64,
    pub(super) shadow: bool,
    /// Where a charge the limits no longer admit is counted and logged.
    pub(super) refused: Arc<BoundedLog>,
}

/// A charge under way; its decision when it allowed.
pub(super) type ChargeFuture = Pin<Box<dyn Future<Output = Option<Decision>> + Send>>;

/// A charge: made at once, or under way.
pub(super) enum Charge {
    /// Made: its decision when it allowed.
    Made(Option<Decision>),
    /// Under way.
    Running(ChargeFuture),
}

impl Pending {
    /// Charges the request, all-or-nothing for each limiter as a check does. A charge the
    /// limiters make at once is made here; any other runs in a task of its own. Either way
    /// it is made even if the response is dropped before it is sent. It counts no decision
    /// (the peek before the handler did); a charge the limits no longer admit (others were
    /// charged since the peek) charges nothing, and is counted and logged: its request was
    /// served over the limit.
    pub(super) fn charge(self) -> Charge {
        let mode = Mode {
            shadow: self.shadow,
            charge: true,
            record: false,
            answers: false,
        };
        let done = match check_both_now(
            &self.first,
            self.then.as_ref(),
            self.ids.as_slice(),
            self.cost,
            mode,
        ) {
            AtOnce::Decided(outcome) => return Charge::Made(charged(outcome, &self)),
            AtOnce::Later(done) => done,
        };
        let task = async move {
            let ids = self.ids.as_slice();
            let first = &self.first;
            let outcome = check_both(first, self.then.as_ref(), ids, self.cost, mode, done).await;
            charged(outcome, &self)
        };
        Charge::Running(match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let handle = runtime.spawn(task);
                Box::pin(async move {
                    match handle.await {
                        Ok(charged) => charged,
                        // A panic in the charge is a bug: it goes on in the response's
                        // caller, as a check's does, rather than pass for "nothing charged".
                        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                        // Cancelled: the runtime is shutting down under the charge.
                        Err(_) => None,
                    }
                })
            }
            Err(_) => Box::pin(task),
        })
    }
}

/// The decision of `pending`'s charge, when it charged.
fn charged(outcome: Result<Decision, Error>, pending: &Pending) -> Option<Decision> {
    let mut decision = outcome.ok()?;
    // A slot taken now would outlive nothing: it is given back at once.
    drop(decision.take_guard());
    if !decision.is_allowed() {
        refused(pending);
    }
    (decision.is_allowed() && decision.origin() != Origin::FailOpen).then_some(decision)
}

/// A charge the limits no longer admitted: counted and logged under the limiter that
/// checked the request first (a route's, or the layer's default).
#[cold]
#[inline(never)]
fn refused(pending: &Pending) {
    pending.refused.charge_refused(&pending.first.name());
}

#[cfg(test)]
mod tests {
    use super::{check_both_now, AtOnce};
    use crate::key::Identifier;
    use crate::limiter::Mode;
    use crate::{Limiter, MemoryStore};

    fn remaining(outcome: &AtOnce) -> Option<Vec<u64>> {
        match outcome {
            AtOnce::Decided(Ok(d)) if d.is_allowed() => {
                Some(d.statuses().iter().map(|s| s.remaining).collect())
            }
            _ => None,
        }
    }

    #[tokio::test]
    async fn in_process_limiters_are_checked_at_once_and_the_others_later() {
        let ids = [Identifier::Owned("ip:192.0.2.1".into())];
        let rate = Limiter::new(MemoryStore::new(), "2/min".parse().unwrap());
        let first = check_both_now(&rate, None, &ids, 1, Mode::CHECK);
        assert_eq!(remaining(&first), Some(vec![1]));
        // a concurrency limit in process takes its slot at once, and the decision holds it
        let slots = Limiter::new(MemoryStore::new(), "5/min, 1 concurrent".parse().unwrap());
        let mut held = check_both_now(&slots, None, &ids, 1, Mode::CHECK);
        assert_eq!(remaining(&held), Some(vec![4, 0]));
        let full = check_both_now(&slots, None, &ids, 1, Mode::CHECK);
        assert!(matches!(full, AtOnce::Decided(Ok(ref d)) if !d.is_allowed()));
        if let AtOnce::Decided(Ok(d)) = &mut held {
            drop(d.take_guard());
        }
        assert_eq!(slots.peek(&ids).await.unwrap().statuses()[1].remaining, 1);
        // a store that must be waited on: nothing is checked now, in either place
        #[cfg(feature = "redis")]
        {
            let remote = crate::RedisStore::builder("redis://127.0.0.1:1/")
                .build_lazy()
                .unwrap();
            let remote = Limiter::new(remote, "5/min".parse().unwrap());
            for (a, b) in [
                (&remote, None),
                (&rate, Some(&remote)),
                (&remote, Some(&rate)),
            ] {
                let later = check_both_now(a, b, &ids, 1, Mode::CHECK);
                assert!(matches!(later, AtOnce::Later(None)));
            }
            assert_eq!(rate.peek(&ids).await.unwrap().statuses()[0].remaining, 1);
        }
        // two in-process limiters: both listed, the second's limits after the first's
        let other = Limiter::new(MemoryStore::new(), "3/min".parse().unwrap());
        let both = check_both_now(&rate, Some(&other), &ids, 1, Mode::CHECK);
        assert_eq!(remaining(&both), Some(vec![0, 2]));
        let denied = check_both_now(&rate, Some(&other), &ids, 1, Mode::CHECK);
        assert!(matches!(denied, AtOnce::Decided(Ok(ref d)) if !d.is_allowed()));
        // the second limiter was not asked once the first denied
        assert_eq!(other.peek(&ids).await.unwrap().statuses()[0].remaining, 2);
    }

    /// A trial of a route's limiter and the default one holds the slots enforcing would: the
    /// default would refuse the request, so enforcing it takes no slot of the route's, and
    /// neither does the trial (in the layer's shadow mode, or both limiters' own). A trial of
    /// the default alone leaves the route's enforced slot as it is.
    #[tokio::test]
    async fn a_trial_holds_the_slots_enforcing_would() {
        let ids = [Identifier::Owned("ip:192.0.2.9".into())];
        let store = MemoryStore::new();
        let build = |policy: &str, namespace: &str, shadow: bool| {
            Limiter::builder(store.clone(), policy.parse().unwrap())
                .namespace(namespace.parse().unwrap())
                .shadow(shadow)
                .build()
        };
        // (route's shadow mode, default's, the layer's, whether the route's slot is held)
        for (route_trial, default_trial, layer_trial, held) in [
            (false, false, false, false), // enforcing: refused, no slot
            (false, false, true, false),  // the layer's trial
            (true, true, false, false),   // both limiters' trials
            (false, true, false, true),   // the default's trial alone: the route's slot stays
        ] {
            let ns = format!("{route_trial}{default_trial}{layer_trial}");
            let route = build("1 concurrent", &format!("r{ns}"), route_trial);
            let default = build("1/min", &format!("d{ns}"), default_trial);
            // the default's quota used up
            let _ = default.check(&ids).await.unwrap();
            let mode = Mode::CHECK.shadowed(layer_trial);
            let decided = check_both_now(&route, Some(&default), &ids, 1, mode);
            let AtOnce::Decided(Ok(decision)) = &decided else {
                panic!("decided at once");
            };
            let trial = route_trial || default_trial || layer_trial;
            assert_eq!(decision.is_allowed(), trial, "{ns}");
            let used = route.usage(&ids).await.unwrap()[0].used;
            assert_eq!(used, u64::from(held), "{ns}: the route's slot");
            drop(decided);
        }
    }
}

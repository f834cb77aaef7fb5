//! What a check decided.

use std::cell::{Cell, RefCell};
use std::time::Duration;

use crate::guard::ConcurrencyGuard;
use crate::policy::Limit;

/// The decision of one check: allowed or not, and for every (identifier, limit) pair its
/// remaining quota and reset time.
///
/// A denied check charged nothing anywhere (on a Redis Cluster, a check across hash slots
/// gives back what the admitting slots charged); [`Decision::retry_after`] says when the same
/// request would be allowed if nothing else happened in between.
///
/// When the policy has a concurrency limit, an allowed decision holds the request's slots
/// until it — or the guard taken out of it with [`Decision::take_guard`] — is dropped. A
/// clone carries the figures only: the slots stay with the original.
///
/// A decision made in shadow mode ([`LimiterBuilder::shadow`](crate::LimiterBuilder::shadow))
/// is always allowed; [`Decision::would_deny`] and the [statuses](Decision::statuses) say
/// what the policy decided.
#[derive(Debug)]
#[must_use = "a decision says whether the request may proceed, and may hold its concurrency slots"]
pub struct Decision {
    /// What the policy decided (in shadow mode, the request is let through regardless).
    pub(crate) allowed: bool,
    /// Decided in shadow mode: let through whatever `allowed` says.
    pub(crate) shadow: bool,
    pub(crate) cost: u64,
    pub(crate) statuses: Vec<LimitStatus>,
    pub(crate) guard: Option<ConcurrencyGuard>,
    pub(crate) origin: Origin,
}

/// Who decided: the store, or — when the store could not — the limiter's
/// [`OnStoreError`](crate::OnStoreError) policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Origin {
    /// The store (Redis, or the memory store).
    Store,
    /// Nobody: the store failed and the limiter fails open. The decision is allowed and has
    /// no limit figures. In shadow mode, also a check that could not be made (a failed store
    /// under [`OnStoreError::Closed`](crate::OnStoreError::Closed), a cost the policy can
    /// never admit): the request is let through and [`Decision::would_deny`] is true.
    FailOpen,
    /// The limiter's in-process fallback, while the store failed.
    Fallback,
    /// The limiter, in process: the store denied one of the identifiers a moment ago, for at
    /// least this cost, until a time that has not come yet (see
    /// [`LimiterBuilder::deny_cache`](crate::LimiterBuilder::deny_cache)). Its statuses are
    /// those the cache keeps: for each identifier it knows denied, the limit that denied it
    /// (so a layer's rate-limit fields list that limit alone).
    DenyCache,
}

/// Status buffers of dropped decisions, reused by the next decisions made on the thread: a
/// check in the steady state allocates none. At most `SPARE_BUFFERS` are kept (the first
/// place and the list together), each of at most `SPARE_CAPACITY` statuses (a decision kept
/// for good takes its buffer with it; the next one allocates).
const SPARE_BUFFERS: usize = 8;
const SPARE_CAPACITY: usize = 64;

thread_local! {
    /// The spare buffer a check takes first: a `Cell`, taken and put back without a borrow
    /// flag or a list to pop from. A thread that keeps one decision alive at a time uses
    /// this place alone.
    static FIRST: Cell<Vec<LimitStatus>> = const { Cell::new(Vec::new()) };
    /// The other spare buffers, for a thread that keeps several decisions alive at once.
    static SPARE: RefCell<Vec<Vec<LimitStatus>>> = const { RefCell::new(Vec::new()) };
}

/// An empty status buffer, reused when the thread has one.
pub(crate) fn status_buffer() -> Vec<LimitStatus> {
    match FIRST.try_with(Cell::take) {
        Ok(buffer) if buffer.capacity() > 0 => buffer,
        _ => other_spare(),
    }
}

/// [`status_buffer`] when the first place is empty.
#[cold]
fn other_spare() -> Vec<LimitStatus> {
    SPARE
        .try_with(|spare| spare.try_borrow_mut().ok()?.pop())
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Gives a status buffer back for reuse by the next decisions on the thread (or frees it).
pub(crate) fn give_back(mut statuses: Vec<LimitStatus>) {
    if statuses.capacity() == 0 || statuses.capacity() > SPARE_CAPACITY {
        return;
    }
    statuses.clear();
    // On a thread being torn down, the buffer is freed.
    let _ = FIRST.try_with(|first| {
        let other = first.replace(statuses);
        if other.capacity() > 0 {
            keep_spare(other);
        }
    });
}

/// Keeps a spare buffer the first place had (or frees it, with every place taken).
#[cold]
fn keep_spare(statuses: Vec<LimitStatus>) {
    let _ = SPARE.try_with(|spare| {
        if let Ok(mut spare) = spare.try_borrow_mut() {
            if spare.len() < SPARE_BUFFERS - 1 {
                spare.push(statuses);
            }
        }
    });
}

impl Drop for Decision {
    fn drop(&mut self) {
        give_back(std::mem::take(&mut self.statuses));
    }
}

impl Clone for Decision {
    fn clone(&self) -> Decision {
        Decision {
            allowed: self.allowed,
            shadow: self.shadow,
            cost: self.cost,
            statuses: self.statuses.clone(),
            guard: None,
            origin: self.origin,
        }
    }
}

/// Decisions compare by what was decided; the slots they hold do not take part.
impl PartialEq for Decision {
    fn eq(&self, other: &Decision) -> bool {
        self.allowed == other.allowed
            && self.shadow == other.shadow
            && self.cost == other.cost
            && self.statuses == other.statuses
    }
}

impl Eq for Decision {}

/// The state of one limit for one identifier, as seen by a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LimitStatus {
    /// Index of the identifier in the slice given to the check (its first occurrence, when
    /// the same identifier was given twice).
    pub identifier: usize,
    /// Index of the limit in the limiter's policy (in a decision of the fallback
    /// ([`Origin::Fallback`]), of the limit its scaled limit stands for). In the decision a
    /// layer hands [`on_limited`](crate::RateLimitLayer::on_limited) for a route that adds a
    /// limiter ([`route_adding`](crate::RateLimitLayer::route_adding)), the statuses of the
    /// route's limiter come first, and those of the layer's own limiter follow, their indices
    /// counted on from the route's: index `n` past the route's limits is the layer limiter's
    /// `n`th. [`limit`](Self::limit) names the limit either way.
    pub limit_index: usize,
    /// The limit (in a decision of the fallback, the scaled limit it enforced).
    pub limit: Limit,
    /// Whether this limit allowed the request for this identifier.
    pub allowed: bool,
    /// How many more cost units this limit admits right now, after this decision.
    pub remaining: u64,
    /// Time until this limit's full quota is available again (zero when it already is).
    pub reset_after: Duration,
    /// When this limit denied: time until it would admit the same cost (for a concurrency
    /// limit a hint: the earliest lease deadline, or a second).
    pub retry_after: Option<Duration>,
}

/// How much of one limit one identifier uses, as [`Limiter::usage`](crate::Limiter::usage)
/// reads it without charging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Usage {
    /// Index of the identifier in the slice given (its first occurrence, when the same
    /// identifier was given twice).
    pub identifier: usize,
    /// Index of the limit in the policy.
    pub limit_index: usize,
    /// The limit.
    pub limit: Limit,
    /// The quota in use: the limit's quota (its count; a bucket's capacity, a GCRA's burst)
    /// less what remains, so never above the quota — after a policy lowered a count, a
    /// client may have used more than the new quota. For a concurrency limit, the slots
    /// held, likewise never above its count (slots held when a policy lowered it count as
    /// the whole count).
    pub used: u64,
    /// How many more cost units the limit admits right now (free slots, for a concurrency
    /// limit).
    pub remaining: u64,
    /// Time until the limit's whole quota is available again (zero when it already is; for
    /// a concurrency limit, always zero: slots come back when requests end).
    pub reset_after: Duration,
}

impl Decision {
    /// An allowed decision that nobody checked (the store failed; the limiter fails open).
    pub(crate) fn unchecked(cost: u64) -> Decision {
        Decision {
            allowed: true,
            shadow: false,
            cost,
            statuses: Vec::new(),
            guard: None,
            origin: Origin::FailOpen,
        }
    }

    /// In shadow mode: a request let through although the check could not be made and the
    /// limiter, enforcing, would have refused it (a failed store it fails closed on, a cost
    /// the policy never admits).
    pub(crate) fn refused_unchecked(cost: u64) -> Decision {
        let mut decision = Decision::unchecked(cost);
        decision.allowed = false;
        decision.shadow = true;
        decision
    }

    /// The decision as the HTTP layer shows it: a shadow decision lets the request through
    /// and, being a trial, shows the client nothing (no rate-limit fields); its slots stay.
    pub(crate) fn visible(mut self) -> Decision {
        if self.shadow {
            self.allowed = true;
            self.shadow = false;
            self.statuses.clear();
        }
        self
    }

    /// Who decided: the store, or the limiter's failure policy when the store failed.
    pub fn origin(&self) -> Origin {
        self.origin
    }

    /// Whether the request may proceed: allowed by every limit for every identifier, or
    /// decided in shadow mode (always).
    pub fn is_allowed(&self) -> bool {
        self.allowed || self.shadow
    }

    /// Whether the policy denies the request: `!is_allowed()` when the limiter enforces it;
    /// in shadow mode, what enforcing would have done (the request was let through).
    pub fn would_deny(&self) -> bool {
        !self.allowed
    }

    /// Whether the decision was made in shadow mode: the request is let through whatever
    /// the policy says ([`would_deny`](Decision::would_deny)).
    pub fn is_shadow(&self) -> bool {
        self.shadow
    }

    /// The cost the request was checked with.
    pub fn cost(&self) -> u64 {
        self.cost
    }

    /// When denied: the earliest time from the decision at which the same request would be
    /// allowed if nothing else happens — the longest wait among the limits that denied (a
    /// concurrency limit's being a hint: slots free when requests finish).
    /// `None` when allowed (in shadow mode too: see
    /// [`would_deny_by`](Decision::would_deny_by)).
    pub fn retry_after(&self) -> Option<Duration> {
        self.denied_by().and_then(|s| s.retry_after)
    }

    /// When denied: the limit (and identifier) that holds the request back longest. `None`
    /// when allowed (in shadow mode too: see [`would_deny_by`](Decision::would_deny_by)).
    pub fn denied_by(&self) -> Option<&LimitStatus> {
        if self.is_allowed() {
            return None;
        }
        self.would_deny_by()
    }

    /// When the policy denies the request, enforced or in shadow mode: the limit (and
    /// identifier) that holds it back longest. `None` when the policy allows it, or when no
    /// limit was evaluated (a check that could not be made).
    pub fn would_deny_by(&self) -> Option<&LimitStatus> {
        if self.allowed {
            return None;
        }
        self.statuses
            .iter()
            .filter(|s| !s.allowed)
            .max_by_key(|s| s.retry_after)
    }

    /// The concurrency slots this decision holds (allowed, policy with a concurrency limit).
    pub fn guard(&self) -> Option<&ConcurrencyGuard> {
        self.guard.as_ref()
    }

    /// Takes the concurrency slots out of the decision, to hold them as long as the work
    /// lasts (the decision can then be dropped or kept for its figures).
    pub fn take_guard(&mut self) -> Option<ConcurrencyGuard> {
        self.guard.take()
    }

    /// Every (identifier, limit) pair, identifier-major — of a decision the store made; one
    /// the failure policy or the deny cache answered has fewer (see [`Origin`]), and so does
    /// a denial of a check across Redis Cluster slots that one slot denied while the call to
    /// another failed: the identifiers of the slot that failed have no statuses.
    pub fn statuses(&self) -> &[LimitStatus] {
        &self.statuses
    }

    /// For each limit of the policy, in order, the status of the most constrained identifier
    /// (least remaining, then longest reset). A concurrency limit is listed as the others
    /// are: its remaining is the free slots, its reset zero (slots come back when requests
    /// end). The rate-limit headers report one item per limit too, concurrency limits
    /// included (as `qu="concurrent-requests"`), except that when the request was denied
    /// they show the identifier that holds it back longest.
    pub fn limits(&self) -> impl Iterator<Item = &LimitStatus> + '_ {
        let n = self
            .statuses
            .iter()
            .map(|s| s.limit_index + 1)
            .max()
            .unwrap_or(0);
        (0..n).filter_map(move |l| {
            self.statuses
                .iter()
                .filter(|s| s.limit_index == l)
                .min_by_key(|s| (s.remaining, std::cmp::Reverse(s.reset_after)))
        })
    }
}

//! [`Scheduler`]: events paced to a rate across the fleet, each waiting for its own slot.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::{Error, OnStoreError};
use crate::algorithm::schedule::{Placement, Rate};
use crate::decision::{Decision, LimitStatus, Origin};
use crate::observe::{self, Action, BoundedLog, LimiterKeys};
use crate::policy::{Algorithm, Limit};
use crate::store::{keyspace, MemoryStore, Namespace, Store, StoreError};

/// The longest wait a caller may ask for: about 142 years, far past any real one, and small
/// enough for every store's arithmetic.
const LONGEST_WAIT_US: u64 = 1 << 52;

/// Paces events to a rate, fleet-wide: each event of an identifier gets the next free slot
/// (a leaky bucket used as a queue), the caller sleeps until it, and an event whose slot lies further
/// than the caller will wait is rejected at once without taking one.
///
/// For calls to a third party that limits you: where a [`Limiter`](crate::Limiter) answers
/// "not now" and leaves the caller to retry, a scheduler answers "at 12:00:00.750" and every
/// process of the fleet agrees on the order. With a [`RedisStore`](crate::RedisStore), one
/// script call places the event (one key per identifier, in the identifier's hash slot, so
/// Redis Cluster is fine); the [`MemoryStore`] places it the same way in process.
///
/// The rate is a [`Limit`]: `4/s` spaces events 250 ms apart. A GCRA's burst or a token
/// bucket's capacity (`4/s gcra burst=2`, `4/s bucket capacity=2`) lets that many go at once
/// before the spacing starts; every other algorithm means a burst of 1, evenly spaced events
/// (a `4/s gcra` has a burst of 4, as a limit). A concurrency limit is read as its count per
/// lease.
///
/// ```
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use tollgate::{MemoryStore, Scheduler};
///
/// // At most 4 calls a second to the provider, evenly spaced; with a RedisStore, fleet-wide.
/// let scheduler = Scheduler::new(MemoryStore::new(), "4/s".parse()?);
/// for _ in 0..3 {
///     // returns when the call may go (after 0, 250 and 500 ms), or at once when its slot
///     // lies more than a second ahead
///     let turn = scheduler.schedule("psp:acme", Duration::from_secs(1)).await?;
///     if turn.is_allowed() {
///         // call the provider
///     } else {
///         println!("rejected: the slot was {:?} away", turn.retry_after().unwrap());
///     }
/// }
/// # Ok(()) }
/// # tokio::runtime::Runtime::new().unwrap().block_on(run()).unwrap();
/// ```
///
/// # A caller that gives up
///
/// Dropping the future of [`schedule`](Scheduler::schedule) before its slot — also a slot
/// for now, while its placement is on its way back from Redis — gives the slot back when it
/// is still the last one placed for its identifier (one compare-and-set script call, in the
/// background): the next event goes where it would have. Otherwise its slot stays used and
/// passes unused — the events placed after it keep their own slots, so nobody waits longer
/// than they were told, but the queue does not close up behind it.
///
/// # Schedulers sharing a store
///
/// A queue is named by its identifier and its rate: schedulers of the same rate on one store
/// (or on Redis stores of one prefix) share the queue of an identifier, as the processes of a
/// fleet must. Schedulers that pace different things at the same rate, with identifiers that
/// may be equal, each take a [namespace](SchedulerBuilder::namespace).
///
/// # When the store fails
///
/// As for a check: the scheduler's [`OnStoreError`] answers. Open lets the event go at once
/// ([`Origin::FailOpen`]); closed fails with [`Error::Store`]; a fallback places the event in
/// a queue in this process at the rate scaled to the process's share.
#[derive(Clone)]
pub struct Scheduler {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    limit: Limit,
    rate: Rate,
    on_error: OnStoreError,
    /// The in-process queue and its rate, under [`OnStoreError::Fallback`].
    fallback: Option<(Store, Limit, Rate)>,
    /// Where its queues live on its stores (none: the shared space).
    namespace: Option<Namespace>,
    name: Arc<str>,
    /// The keys of what its requests count in the metrics.
    keys: LimiterKeys,
    /// The would-be rejections of a scheduled layer in shadow mode, logged at a bounded rate.
    shadow_log: BoundedLog,
}

impl fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scheduler")
            .field("name", &self.inner.name)
            .field("store", &self.inner.store)
            .field("rate", &self.inner.limit.to_string())
            .field("on_store_error", &self.inner.on_error)
            .field("namespace", &self.inner.namespace)
            .finish()
    }
}

/// Configures a [`Scheduler`]: [`Scheduler::builder`].
#[derive(Debug, Clone)]
pub struct SchedulerBuilder {
    store: Store,
    rate: Limit,
    on_error: OnStoreError,
    name: Option<String>,
    namespace: Option<Namespace>,
}

impl SchedulerBuilder {
    /// What to do when the store cannot place an event (default: [`OnStoreError::Open`]).
    pub fn on_store_error(mut self, on_error: OnStoreError) -> Self {
        self.on_error = on_error;
        self
    }

    /// The scheduler's name in logs and metric labels (default: the rate's text).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Keeps the scheduler's queues apart from those of schedulers in other namespaces (or in
    /// none) on the same store, as [`LimiterBuilder::namespace`](crate::LimiterBuilder::namespace)
    /// keeps a limiter's counts: two schedulers of the same rate pacing calls to two
    /// providers, say, whose identifiers may be equal. Every process of a fleet gives its
    /// scheduler the same namespace, to share its queues. The in-process fallback's queues
    /// are the scheduler's own anyway.
    ///
    /// ```
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use tollgate::{MemoryStore, Scheduler};
    ///
    /// let store = MemoryStore::new();
    /// let mail = Scheduler::builder(store.clone(), "1/s".parse()?)
    ///     .namespace("mail".parse()?)
    ///     .build();
    /// let sms = Scheduler::builder(store, "1/s".parse()?)
    ///     .namespace("sms".parse()?)
    ///     .build();
    /// // one queue each: both go at once
    /// assert!(mail.schedule("tenant:42", Duration::ZERO).await?.is_allowed());
    /// assert!(sms.schedule("tenant:42", Duration::ZERO).await?.is_allowed());
    /// # Ok(()) }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(run()).unwrap();
    /// ```
    pub fn namespace(mut self, namespace: Namespace) -> Self {
        self.namespace = Some(namespace);
        self
    }

    /// Builds the scheduler.
    pub fn build(self) -> Scheduler {
        crate::observe::describe_metrics();
        let name: Arc<str> = self.name.unwrap_or_else(|| self.rate.to_string()).into();
        let fallback = match self.on_error {
            OnStoreError::Fallback(f) => {
                let share = f.share_of_fleet();
                if self.rate.held_at_one(share) {
                    crate::observe::fallback_raised(&name, &self.rate, share);
                }
                let scaled = self.rate.scaled(share);
                let store = MemoryStore::builder()
                    .name(format!("fallback:{name}"))
                    .build();
                Some((Store::from(store), scaled, rate_of(&scaled)))
            }
            _ => None,
        };
        Scheduler {
            inner: Arc::new(Inner {
                // (a fallback's rejections are labelled with the rate they stand for: its one
                // limit is the rate's, index 0)
                keys: LimiterKeys::new(&name, &[self.rate]),
                shadow_log: BoundedLog::default(),
                name,
                rate: rate_of(&self.rate),
                limit: self.rate,
                store: self.store,
                on_error: self.on_error,
                fallback,
                namespace: self.namespace,
            }),
        }
    }
}

/// The pace of `limit`: its count per window, its burst (1 but for a bucket or a GCRA).
fn rate_of(limit: &Limit) -> Rate {
    let burst = match limit.algorithm() {
        Algorithm::TokenBucket { capacity } => capacity,
        Algorithm::Gcra { burst } => burst,
        _ => 1,
    };
    Rate {
        count: limit.count(),
        window_us: limit.window().as_micros() as u64,
        burst,
    }
}

impl Scheduler {
    /// A scheduler pacing events to `rate` with its queues in `store`, failing open when the
    /// store fails ([`OnStoreError::Open`]).
    pub fn new(store: impl Into<Store>, rate: Limit) -> Scheduler {
        Scheduler::builder(store, rate).build()
    }

    /// Configures a scheduler pacing events to `rate` with its queues in `store`.
    pub fn builder(store: impl Into<Store>, rate: Limit) -> SchedulerBuilder {
        SchedulerBuilder {
            store: store.into(),
            rate,
            on_error: OnStoreError::default(),
            name: None,
            namespace: None,
        }
    }

    /// The rate.
    pub fn rate(&self) -> Limit {
        self.inner.limit
    }

    /// The scheduler's namespace on its store ([`SchedulerBuilder::namespace`]), if it has
    /// one.
    pub fn namespace(&self) -> Option<&Namespace> {
        self.inner.namespace.as_ref()
    }

    /// The most events that may go at once (and so the largest cost of one event).
    pub fn burst(&self) -> u64 {
        self.inner.rate.burst
    }

    /// The scheduler's name in logs and metric labels: the name it was built with, or the
    /// rate's text.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The store its queues live in.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// What an event gets when the store cannot place it.
    pub fn on_store_error(&self) -> OnStoreError {
        self.inner.on_error
    }

    /// Waits for the next free slot of `identifier`, when it lies at most `max_wait` ahead.
    /// See [`Scheduler::schedule_n`].
    ///
    /// # Errors
    ///
    /// As [`Scheduler::schedule_n`].
    pub async fn schedule(&self, identifier: &str, max_wait: Duration) -> Result<Decision, Error> {
        self.schedule_n(identifier, 1, max_wait).await
    }

    /// Places an event of `cost` intervals in `identifier`'s queue and waits for its slot,
    /// when that lies at most `max_wait` ahead.
    ///
    /// The decision is allowed once the slot has come: the caller goes now. It is denied at
    /// once, having taken no slot, when the slot would lie further ahead; its
    /// [`retry_after`](Decision::retry_after) is then the wait the event would have needed.
    /// Its one [status](Decision::statuses) names the rate, with `reset_after` the time until
    /// the queue is empty and `remaining` 0.
    ///
    /// Dropping the future before the slot comes gives the slot back if no one was placed
    /// after it (see [A caller that gives up](Scheduler#a-caller-that-gives-up)).
    ///
    /// # Errors
    ///
    /// [`Error::Cost`] when `cost` is 0 or more than the [burst](Scheduler::burst), and
    /// [`Error::Store`] when the store could not place the event and the scheduler fails
    /// closed ([`OnStoreError::Closed`]), or falls back to a scaled rate whose burst is below
    /// `cost` ([`OnStoreError::Fallback`]).
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime with its time driver, when the slot lies ahead (the wait is
    /// Tokio's timer).
    pub async fn schedule_n(
        &self,
        identifier: &str,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Decision, Error> {
        let (decision, pending) = self.place(identifier, cost, max_wait, false).await?;
        if let Some(mut pending) = pending {
            if pending.placement.wait_us > 0 {
                tokio::time::sleep(Duration::from_micros(pending.placement.wait_us)).await;
            }
            // the slot has come: it is the caller's, whatever it does next
            pending.store = None;
        }
        Ok(decision)
    }

    /// Places the event without waiting: the decision, and when it was placed its slot
    /// (ahead, or now), given back if dropped before [`Pending::store`] is cleared. Counted
    /// in the decision metrics as a limiter's checks are; in `shadow` mode (a scheduled
    /// layer's) as a would-be rejection when the event would be rejected, logged at a
    /// bounded rate, and never an error for want of a store or for a cost above the burst:
    /// the event goes, as a would-be rejection.
    pub(crate) async fn place(
        &self,
        identifier: &str,
        cost: u64,
        max_wait: Duration,
        shadow: bool,
    ) -> Result<(Decision, Option<Pending>), Error> {
        let placed = match self.place_enforcing(identifier, cost, max_wait).await {
            Ok(placed) => placed,
            Err(Error::Cost { .. } | Error::Store(_)) if shadow => {
                (Decision::refused_unchecked(cost), None)
            }
            Err(e) => return Err(e),
        };
        let (mut decision, pending) = placed;
        decision.shadow |= shadow;
        let inner = &*self.inner;
        observe::decision(&inner.keys, &decision, &inner.shadow_log, &inner.name);
        Ok((decision, pending))
    }

    /// [`place`](Self::place) as when enforcing, not counted.
    async fn place_enforcing(
        &self,
        identifier: &str,
        cost: u64,
        max_wait: Duration,
    ) -> Result<(Decision, Option<Pending>), Error> {
        let inner = &*self.inner;
        if cost == 0 || cost > inner.rate.burst {
            return Err(Error::Cost {
                cost,
                max: inner.rate.burst,
            });
        }
        let longest = u64::try_from(max_wait.as_micros())
            .unwrap_or(u64::MAX)
            .min(LONGEST_WAIT_US);
        let id = keyspace::escape_identifier(identifier);
        let ask = Ask {
            id: &id,
            namespace: inner.namespace.as_ref(),
            cost,
            longest,
        };
        let started = tokio::time::Instant::now();
        let error = match place_in(&inner.store, &inner.limit, &inner.rate, &ask).await {
            Ok(placed) => return Ok(placed),
            Err(e) => e,
        };
        // The caller's longest wait counts from its call: the fallback has what the store's
        // failure left of it (a timeout may have taken much of it).
        let spent = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        let ask = Ask {
            longest: ask.longest.saturating_sub(spent),
            ..ask
        };
        let name = &*inner.name;
        match (inner.on_error, &inner.fallback) {
            (OnStoreError::Fallback(_), Some((store, limit, rate))) if cost <= rate.burst => {
                observe::failure_answered(name, &inner.keys, Action::Fallback, &error);
                let (mut decision, pending) = place_in(store, limit, rate, &ask)
                    .await
                    .map_err(Error::Store)?;
                decision.origin = Origin::Fallback;
                Ok((decision, pending))
            }
            (OnStoreError::Closed, _) | (OnStoreError::Fallback(_), _) => {
                observe::failure_answered(name, &inner.keys, Action::Closed, &error);
                Err(Error::Store(error))
            }
            _ => {
                observe::failure_answered(name, &inner.keys, Action::Open, &error);
                Ok((Decision::unchecked(cost), None))
            }
        }
    }
}

/// What one event asks of a queue.
struct Ask<'a> {
    /// The identifier, escaped.
    id: &'a str,
    namespace: Option<&'a Namespace>,
    cost: u64,
    /// The longest wait, in microseconds.
    longest: u64,
}

/// Places the event in `store`'s queue for the identifier it names.
///
/// On Redis the placement runs in a task of its own: a caller that gives up while the script
/// runs (a client disconnecting) drops only its wait for the task, whose answer, a slot still
/// to come, is then dropped with nobody waiting for it, which gives the slot back. Cut short
/// in the caller, the script would have placed the event all the same, and the slot would
/// have stayed taken with no waiter.
async fn place_in(
    store: &Store,
    limit: &Limit,
    rate: &Rate,
    ask: &Ask<'_>,
) -> Result<(Decision, Option<Pending>), StoreError> {
    if store.as_memory().is_some() {
        return place_now(store, limit, rate, ask).await;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return place_now(store, limit, rate, ask).await;
    };
    let (store, limit, rate) = (store.clone(), *limit, *rate);
    let (id, namespace) = (ask.id.to_string(), ask.namespace.cloned());
    let (cost, longest) = (ask.cost, ask.longest);
    let task = runtime.spawn(async move {
        let ask = Ask {
            id: &id,
            namespace: namespace.as_ref(),
            cost,
            longest,
        };
        place_now(&store, &limit, &rate, &ask).await
    });
    match task.await {
        Ok(placed) => placed,
        // A panic in the placement is a bug, not a store failure for the failure policy to
        // paper over: it goes on in the caller.
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // Cancelled: the runtime is shutting down under the placement.
        Err(e) => Err(StoreError::Backend(Box::new(e))),
    }
}

/// [`place_in`], in the caller's task.
async fn place_now(
    store: &Store,
    limit: &Limit,
    rate: &Rate,
    ask: &Ask<'_>,
) -> Result<(Decision, Option<Pending>), StoreError> {
    let Ask {
        id,
        namespace,
        cost,
        longest,
    } = *ask;
    let (placement, key) = store.schedule(id, namespace, rate, cost, longest).await?;
    let status = LimitStatus {
        identifier: 0,
        limit_index: 0,
        limit: *limit,
        allowed: placement.placed,
        remaining: 0,
        reset_after: Duration::from_micros(placement.drain_us),
        retry_after: (!placement.placed).then(|| Duration::from_micros(placement.wait_us)),
    };
    let decision = Decision {
        allowed: placement.placed,
        shadow: false,
        cost,
        statuses: vec![status],
        guard: None,
        origin: Origin::Store,
    };
    // Every placed slot, one for now included: on Redis a caller gone during the round trip
    // drops it unseen, and a slot nobody uses goes back.
    let pending = placement.placed.then(|| Pending {
        store: Some(store.clone()),
        key,
        placement,
    });
    Ok((decision, pending))
}

/// A slot placed but not yet come: dropped before [`Pending::store`] is cleared, it is given
/// back (in the background, when it is still the last one placed).
pub(crate) struct Pending {
    pub(crate) store: Option<Store>,
    key: String,
    pub(crate) placement: Placement,
}

impl fmt::Debug for Pending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pending")
            .field("key", &self.key)
            .field("wait_us", &self.placement.wait_us)
            .finish_non_exhaustive()
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(store) = self.store.take() {
            store.give_back_soon(std::mem::take(&mut self.key), self.placement);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};

    const MS: u64 = 1000;

    fn scheduler(clock: &ManualClock, rate: &str) -> Scheduler {
        let store = MemoryStore::builder()
            .clock(Clock::Manual(clock.clone()))
            .build();
        Scheduler::new(store, rate.parse().unwrap())
    }

    /// Places `events` at the clock's time through `schedulers` in turn: each one's wait
    /// (µs), or `None` when rejected.
    async fn waits(
        schedulers: &[Scheduler],
        events: usize,
        max_wait: Duration,
    ) -> Vec<Option<u64>> {
        let mut out = Vec::new();
        for i in 0..events {
            let s = &schedulers[i % schedulers.len()];
            let (decision, pending) = s.place("psp:acme", 1, max_wait, false).await.unwrap();
            let wait = pending.as_ref().map_or(0, |p| p.placement.wait_us);
            if let Some(mut p) = pending {
                p.store = None;
            }
            out.push(match decision.retry_after() {
                None => Some(wait),
                Some(_) => None,
            });
        }
        out
    }

    #[tokio::test]
    async fn clones_share_one_queue_250_ms_apart() {
        let clock = ManualClock::new(1_767_225_600_000_000);
        let one = scheduler(&clock, "4/s");
        let fleet = [one.clone(), one.clone(), one];
        let w = waits(&fleet, 40, Duration::from_secs(11)).await;
        let expected: Vec<Option<u64>> = (0..40).map(|i| Some(i * 250 * MS)).collect();
        assert_eq!(w, expected);
    }

    #[tokio::test]
    async fn a_namespace_has_queues_of_its_own() {
        let clock = ManualClock::new(1_767_225_600_000_000);
        let store = MemoryStore::builder()
            .clock(Clock::Manual(clock.clone()))
            .build();
        let in_space = |namespace: Option<&str>| {
            let builder = Scheduler::builder(store.clone(), "4/s".parse().unwrap());
            match namespace {
                Some(n) => builder.namespace(n.parse().unwrap()),
                None => builder,
            }
            .build()
        };
        let (shared, mail, sms) = (
            in_space(None),
            in_space(Some("mail")),
            in_space(Some("sms")),
        );
        assert_eq!(mail.namespace().map(Namespace::as_str), Some("mail"));
        // one queue each: each one's first event goes at once, its second 250 ms later
        let all = [shared.clone(), mail.clone(), sms, shared, mail.clone()];
        let w = waits(&all, 5, Duration::from_secs(1)).await;
        assert_eq!(
            w,
            [Some(0), Some(0), Some(0), Some(250 * MS), Some(250 * MS)]
        );
        // a scheduler of the same namespace (another process of the fleet) shares its queue
        let again = in_space(Some("mail"));
        let w = waits(&[again], 1, Duration::from_secs(1)).await;
        assert_eq!(w, [Some(500 * MS)]);
    }

    #[tokio::test]
    async fn past_the_longest_wait_the_excess_takes_no_slot() {
        let clock = ManualClock::new(1_767_225_600_000_000);
        let s = scheduler(&clock, "4/s");
        let w = waits(std::slice::from_ref(&s), 40, Duration::from_secs(1)).await;
        assert_eq!(
            &w[..5],
            [
                Some(0),
                Some(250 * MS),
                Some(500 * MS),
                Some(750 * MS),
                Some(1000 * MS)
            ]
        );
        assert!(w[5..].iter().all(Option::is_none));
        // the rejected took nothing: 300 ms later, the next slot is the sixth, at 1250 ms
        clock.advance(Duration::from_millis(300));
        let d = s.schedule("psp:acme", Duration::ZERO).await.unwrap();
        assert_eq!(d.retry_after(), Some(Duration::from_millis(950)));
        assert_eq!(d.statuses()[0].reset_after, Duration::from_millis(950));
    }

    #[tokio::test]
    async fn a_dropped_waiter_gives_its_slot_back_only_when_it_is_the_last() {
        let clock = ManualClock::new(1_767_225_600_000_000);
        let s = scheduler(&clock, "4/s");
        let long = Duration::from_secs(5);
        let (_, first) = s.place("psp:acme", 1, long, false).await.unwrap();
        let mut first = first.expect("placed");
        assert_eq!(first.placement.wait_us, 0, "the first goes at once");
        first.store = None;
        let (_, second) = s.place("psp:acme", 1, long, false).await.unwrap();
        let (_, third) = s.place("psp:acme", 1, long, false).await.unwrap();
        // the second is not the last one placed: its slot stays used
        drop(second);
        let next = |s: Scheduler| async move {
            let (d, p) = s.place("psp:acme", 1, Duration::ZERO, false).await.unwrap();
            drop(p);
            d.retry_after()
        };
        assert_eq!(next(s.clone()).await, Some(Duration::from_millis(750)));
        // the third is: the queue ends at 500 ms again
        drop(third);
        assert_eq!(next(s.clone()).await, Some(Duration::from_millis(500)));
        // a caller that waited out its slot keeps it
        let (_, p) = s.place("psp:acme", 1, long, false).await.unwrap();
        let mut p = p.unwrap();
        p.store = None;
        drop(p);
        assert_eq!(next(s).await, Some(Duration::from_millis(750)));
    }

    #[tokio::test]
    async fn costs_past_the_burst_are_errors() {
        let clock = ManualClock::new(1_767_225_600_000_000);
        let s = scheduler(&clock, "4/s gcra burst=2");
        assert_eq!(s.burst(), 2);
        assert!(matches!(
            s.schedule_n("a", 3, Duration::ZERO).await,
            Err(Error::Cost { cost: 3, max: 2 })
        ));
        assert!(matches!(
            s.schedule_n("a", 0, Duration::ZERO).await,
            Err(Error::Cost { .. })
        ));
        // the burst goes at once
        for _ in 0..2 {
            assert!(s.schedule("a", Duration::ZERO).await.unwrap().is_allowed());
        }
        assert!(!s.schedule("a", Duration::ZERO).await.unwrap().is_allowed());
    }
}

//! The limiter: a store and a policy, usable without tower.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::decision::Decision;
use crate::observe::{self, BoundedLog, LimiterKeys};
use crate::policy::Policy;
use crate::store::{keyspace, MemoryStore, Namespace, OneKey, Store};

mod check;
mod deny_cache;
mod error;
mod failure;
mod inspect;
mod schedule;
mod wait;

use deny_cache::DenyCache;

pub(crate) use check::Mode;
pub use error::Error;
pub use failure::{Fallback, OnStoreError};
pub use schedule::{Scheduler, SchedulerBuilder};
#[cfg(feature = "redis")]
pub(crate) use wait::{FIRST_POLL, LONGEST_POLL};

/// The most distinct identifiers one check may name.
pub const MAX_IDENTIFIERS: usize = 16;

/// Checks requests against a [`Policy`], with its state in a [`Store`].
///
/// A cheap handle: clones share the store and the policy.
///
/// ```
/// # async fn run() -> Result<(), tollgate::Error> {
/// use tollgate::{Limiter, MemoryStore};
///
/// let limiter = Limiter::new(MemoryStore::new(), "10/s, 120/min, 240/h".parse().unwrap());
/// // The client IP and the user together: allowed only if both are under every limit.
/// let decision = limiter.check(&["ip:203.0.113.9", "user:42"]).await?;
/// assert!(decision.is_allowed());
/// # Ok(()) }
/// # tokio::runtime::Runtime::new().unwrap().block_on(run()).unwrap();
/// ```
#[derive(Clone)]
pub struct Limiter {
    inner: Arc<Inner>,
}

// In this order (`repr(C)`): what every check reads — the version, shadow mode, the
// namespace, the store — first and together, rather than spread over the lines of the
// processor's cache this structure spans (in the compiler's order, a layered request read 6
// of them; 3 fewer lines of data a request, `scripts/hot-data-lines.py`).
#[repr(C)]
struct Inner {
    /// The policy in force, swapped whole by [`Limiter::set_policy`]: a check loads it once
    /// and runs on that version to the end.
    version: ArcSwap<Version>,
    /// Whether checks let every request through, recording what the policy decided.
    shadow: AtomicBool,
    /// Where the limiter's keys live on its stores (none: the store's shared space).
    namespace: Option<Namespace>,
    store: Store,
    /// Identifiers the store denied a moment ago (remote stores on the real clock only).
    deny_cache: Option<DenyCache>,
    on_error: OnStoreError,
    /// The name given to the builder; without one, each version is named by its policy.
    given_name: Option<Arc<str>>,
    /// The in-process store of the fallback, under [`OnStoreError::Fallback`]: it keeps its
    /// counts across policy changes, as the main store does.
    fallback_store: Option<Store>,
    shadow_log: BoundedLog,
    /// Serializes policy changes, so that versions are numbered in the order they apply.
    changing: Mutex<()>,
    /// Never sent to: dropped with the limiter, which tells the tasks that follow a policy
    /// channel for it ([`Limiter::follow`]) to end.
    alive: tokio::sync::watch::Sender<()>,
}

/// One version of a limiter's policy, with what follows from it.
struct Version {
    policy: Policy,
    /// The limiter's name in logs and metrics.
    name: Arc<str>,
    /// The keys of what its checks count in the metrics.
    keys: LimiterKeys,
    /// The fallback's policy: this one scaled to the process's share; and for each of its
    /// limits, the index of the first limit of this policy it stands for (limits that scale
    /// to one count once).
    fallback: Option<(Policy, Box<[usize]>)>,
    /// Counts the versions, so that the deny cache keeps no denial of an older one.
    generation: u64,
    /// On the memory store, when an identifier's state under this policy is one key: its
    /// shape, worked out once here rather than at every check.
    one_key: Option<OneKey>,
}

impl Version {
    fn new(
        policy: Policy,
        given_name: Option<&Arc<str>>,
        on_error: OnStoreError,
        generation: u64,
        at: (&Store, Option<&Namespace>),
    ) -> Version {
        let (store, namespace) = at;
        // (a concurrency limit takes the general way: it takes a lease and guards it)
        let one_key = store
            .as_memory()
            .filter(|_| policy.concurrency().is_none())
            .and_then(|_| OneKey::of(namespace.map(Namespace::as_str), policy.limits()));
        let name = given_name
            .cloned()
            .unwrap_or_else(|| policy.to_string().into());
        let fallback = match on_error {
            OnStoreError::Fallback(f) => {
                let share = f.share_of_fleet();
                // A count scaled below 1 is held at 1: said where it is decided, as the
                // limiter is built or its policy changes.
                for limit in policy.limits().iter().filter(|l| l.held_at_one(share)) {
                    observe::fallback_raised(&name, limit, share);
                }
                let (scaled, origins) = policy.scaled(share);
                Some((scaled, origins.into()))
            }
            _ => None,
        };
        let keys = LimiterKeys::new(&name, policy.limits());
        Version {
            policy,
            name,
            keys,
            fallback,
            generation,
            one_key,
        }
    }
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let version = self.inner.version.load();
        f.debug_struct("Limiter")
            .field("name", &version.name)
            .field("store", &self.inner.store)
            .field("namespace", &self.inner.namespace)
            .field("policy", &version.policy.to_string())
            .field("on_store_error", &self.inner.on_error)
            .field("shadow", &self.is_shadow())
            .finish()
    }
}

/// Configures a [`Limiter`]: [`Limiter::builder`].
#[derive(Debug, Clone)]
pub struct LimiterBuilder {
    store: Store,
    policy: Policy,
    on_error: OnStoreError,
    name: Option<String>,
    namespace: Option<Namespace>,
    deny_cache: usize,
    shadow: bool,
}

impl LimiterBuilder {
    /// How many identifiers the deny cache holds at most (default 10,000; 0 turns it off).
    ///
    /// With a Redis store, when Redis denies an identifier by a rate limit until some time,
    /// the limiter answers that identifier's requests (of at least the same cost) in process
    /// until then, without a round trip: a client flooding the fleet is answered without
    /// touching Redis. It never denies a request Redis would allow (others' requests only
    /// use quota; concurrency limits are never cached). What it gives up is quota given back
    /// where this process cannot see it — the identifier reset elsewhere (another process's
    /// [`Limiter::reset`], or in Redis by hand), a charge given back after a check across
    /// Redis Cluster slots —, so an entry answers for a second at most, then the store is
    /// asked again. The memory store and a manual clock never use it.
    pub fn deny_cache(mut self, max_identifiers: usize) -> Self {
        self.deny_cache = max_identifiers;
        self
    }

    /// What to do with a check the store could not decide (default: [`OnStoreError::Open`]).
    pub fn on_store_error(mut self, on_error: OnStoreError) -> Self {
        self.on_error = on_error;
        self
    }

    /// The limiter's name in logs and metric labels (default: the policy's text, which
    /// follows [policy changes](Limiter::set_policy)). Keep the set of names small: it is a
    /// label value.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Keeps the limiter's state in a space of its own on the store (default: none, the
    /// store's shared space), so that it counts apart from every other limiter.
    ///
    /// A store names an identifier's state by what it means — the algorithm and window of a
    /// limit, not its count (so that [a policy change](Limiter::set_policy) carries counts
    /// over). Without a namespace, two limiters on one store whose limits share a name share
    /// that state for an identifier: a login route's `10/min` and the default `100/min`
    /// count the same requests together, and any two concurrency limits hold the same
    /// slots. That is what the processes of one fleet, configured alike, want (and sharing
    /// can only admit less, never more); limiters with different jobs — one per route —
    /// each want a namespace.
    ///
    /// The namespace is part of every key of the limiter (`tollgate:{user:42}:login:r1m`),
    /// in the check, the peek, [`usage`](Limiter::usage), [`reset`](Limiter::reset), the
    /// renewal and release of concurrency slots and the fallback store; it stays across
    /// policy changes, so counts carry over as without one. Every process of a fleet gives
    /// the same limiter the same namespace. Two limiters in one namespace share state as two
    /// limiters without one do.
    ///
    /// ```
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use tollgate::{Limiter, MemoryStore};
    ///
    /// let store = MemoryStore::new();
    /// let default = Limiter::builder(store.clone(), "100/min".parse()?)
    ///     .namespace("default".parse()?)
    ///     .build();
    /// let login = Limiter::builder(store, "10/min".parse()?)
    ///     .namespace("login".parse()?)
    ///     .build();
    ///
    /// for _ in 0..10 {
    ///     assert!(login.check(&["ip:203.0.113.9"]).await?.is_allowed());
    /// }
    /// assert!(!login.check(&["ip:203.0.113.9"]).await?.is_allowed());
    /// // the default limiter counted none of them
    /// let usage = default.usage(&["ip:203.0.113.9"]).await?;
    /// assert_eq!(usage[0].remaining, 100);
    /// # Ok(()) }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(run()).unwrap();
    /// ```
    ///
    /// A [`Namespace`] is validated where it is made ([`Namespace::new`] or `parse`), so
    /// that building the limiter cannot fail.
    pub fn namespace(mut self, namespace: Namespace) -> Self {
        self.namespace = Some(namespace);
        self
    }

    /// Shadow mode (default: off): every request is let through, and what the policy
    /// decided is recorded — to try a policy on real traffic before enforcing it.
    ///
    /// Every check is made and charged exactly as when enforcing: a request the policy
    /// allows is charged, one it would deny is let through *uncharged*, as a denied request
    /// is. The counts are therefore those the enforced policy would have, and turning
    /// enforcement on ([`Limiter::set_shadow`]) changes nothing but the answers. Decisions
    /// are allowed, with [`Decision::would_deny`] and the statuses telling what enforcing
    /// would have done; would-be denials are counted as `outcome="shadow_denied"` in
    /// `tollgate_decisions_total` (the `metrics` feature) and logged at most once every
    /// 10 seconds per limiter, with their number (the `tracing` feature). A check that
    /// could not be made is let through too (a failed store under
    /// [`OnStoreError::Closed`], a cost the policy can never admit), as a would-be denial.
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// Builds the limiter.
    pub fn build(self) -> Limiter {
        crate::observe::describe_metrics();
        let given_name: Option<Arc<str>> = self.name.map(Into::into);
        let fallback_store = matches!(self.on_error, OnStoreError::Fallback(_)).then(|| {
            let name = given_name
                .as_deref()
                .map_or_else(|| self.policy.to_string(), str::to_string);
            Store::from(
                MemoryStore::builder()
                    .name(format!("fallback:{name}"))
                    .build(),
            )
        });
        let version = Version::new(
            self.policy,
            given_name.as_ref(),
            self.on_error,
            0,
            (&self.store, self.namespace.as_ref()),
        );
        let deny_cache = (self.deny_cache > 0 && self.store.is_remote_on_real_clock())
            .then(|| DenyCache::new(self.deny_cache));
        Limiter {
            inner: Arc::new(Inner {
                store: self.store,
                namespace: self.namespace,
                on_error: self.on_error,
                given_name,
                deny_cache,
                fallback_store,
                shadow: AtomicBool::new(self.shadow),
                shadow_log: BoundedLog::default(),
                version: ArcSwap::from_pointee(version),
                changing: Mutex::new(()),
                alive: tokio::sync::watch::Sender::new(()),
            }),
        }
    }
}

impl Limiter {
    /// A limiter applying `policy`, keeping its state in `store`, failing open when the store
    /// fails ([`OnStoreError::Open`]). [`Limiter::builder`] configures the rest.
    pub fn new(store: impl Into<Store>, policy: Policy) -> Limiter {
        Limiter::builder(store, policy).build()
    }

    /// Configures a limiter applying `policy`, keeping its state in `store`.
    pub fn builder(store: impl Into<Store>, policy: Policy) -> LimiterBuilder {
        LimiterBuilder {
            store: store.into(),
            policy,
            on_error: OnStoreError::default(),
            name: None,
            namespace: None,
            deny_cache: deny_cache::DEFAULT_CAPACITY,
            shadow: false,
        }
    }

    /// What the limiter does with a check the store could not decide.
    pub fn on_store_error(&self) -> OnStoreError {
        self.inner.on_error
    }

    /// The policy in force.
    pub fn policy(&self) -> Policy {
        self.inner.version.load().policy.clone()
    }

    /// How many limits the policy in force has (without a copy of it).
    pub(crate) fn limit_count(&self) -> usize {
        self.inner.version.load().policy.limits().len()
    }

    /// The limiter's name in logs and metric labels: the name it was built with, or the
    /// text of the policy in force.
    pub fn name(&self) -> String {
        self.inner.version.load().name.to_string()
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// The limiter's namespace on its store ([`LimiterBuilder::namespace`]), if it has one.
    pub fn namespace(&self) -> Option<&Namespace> {
        self.inner.namespace.as_ref()
    }

    /// Replaces the policy, for every clone of this limiter, without a restart.
    ///
    /// Checks that have started finish on the policy they started with; every check that
    /// starts afterwards uses the new one. The fallback ([`OnStoreError::Fallback`]) follows
    /// it, scaled as before, and so does the limiter's name unless it was given one. The
    /// deny cache is emptied.
    ///
    /// What was counted carries over limit by limit, in the store, where the new limit's
    /// state means what the old one's meant (the rule is the store's key naming, so every
    /// process of a fleet and every restart agree; the limiter's
    /// [namespace](LimiterBuilder::namespace) stays):
    ///
    /// * a rolling window (the default), sliding window, fixed window or sliding log whose
    ///   count alone changes keeps what was counted for it: `10/min` raised to `12/min` with
    ///   8 used admits 4 more, not 12; lowered to `5/min`, it denies until the usage has
    ///   fallen below 5. A rolling window whose count crosses 1,550 (`1000/min` to
    ///   `2000/min`, or back) is the exception: its counters take another form above it, so
    ///   it starts afresh, with the limits that share its key (see below);
    /// * a concurrency limit keeps its held slots whatever its count or lease;
    /// * a token bucket or GCRA keeps its usage when its burst (capacity) changes, and starts
    ///   afresh when its rate (count or window) does: its state is a time measured in steps
    ///   of that rate;
    /// * a limit whose window or algorithm changes starts afresh (its old state expires by
    ///   itself); so does a limit that is new to the policy;
    /// * the window, fixed-window, bucket and GCRA limits of a policy keep their state
    ///   together (one store key per identifier): they carry over when each of them does, and
    ///   all start afresh when one of them starts afresh, is added or is removed.
    ///
    /// The change is logged (with the `tracing` feature): at `info` when every count carries
    /// over, at `warn` naming the store keys whose counts start afresh.
    ///
    /// ```
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use tollgate::{Limiter, MemoryStore};
    ///
    /// let limiter = Limiter::new(MemoryStore::new(), "10/min".parse()?);
    /// for _ in 0..8 {
    ///     let _ = limiter.check(&["user:42"]).await?;
    /// }
    /// limiter.set_policy("12/min".parse()?);
    /// assert_eq!(limiter.peek(&["user:42"]).await?.statuses()[0].remaining, 4);
    /// # Ok(()) }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(run()).unwrap();
    /// ```
    ///
    /// Setting the policy in force again changes nothing.
    pub fn set_policy(&self, policy: Policy) {
        let _changing = self
            .inner
            .changing
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let old = self.inner.version.load_full();
        if old.policy == policy {
            return;
        }
        let generation = old.generation + 1;
        let version = Version::new(
            policy,
            self.inner.given_name.as_ref(),
            self.inner.on_error,
            generation,
            (&self.inner.store, self.inner.namespace.as_ref()),
        );
        // the store keys of the old policy the new one does not use: their counts are left
        // to expire, and the new policy's limits on them start afresh
        let namespace = self.inner.namespace.as_ref().map(Namespace::as_str);
        let kept = keyspace::tails_of(namespace, version.policy.limits());
        let mut afresh = keyspace::tails_of(namespace, old.policy.limits());
        afresh.retain(|tail| !kept.contains(tail));
        observe::policy_changed(&old.name, &old.policy, &version.policy, &afresh);
        self.inner.version.store(Arc::new(version));
        if let Some(cache) = &self.inner.deny_cache {
            cache.reset(generation);
        }
    }

    /// Follows `policies`: applies its current value, then every value sent to it
    /// ([`set_policy`](Limiter::set_policy)), until the sender is dropped (logged: the
    /// limiter keeps the policy it has) or every clone of the limiter is (the future ends
    /// then, whether the channel still lives or not). Spawn the returned future; the
    /// channel's sender is the handle that changes the policy (a configuration reloader, an
    /// admin endpoint).
    ///
    /// ```
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use tollgate::{Limiter, MemoryStore, Policy};
    ///
    /// let policy: Policy = "10/s".parse()?;
    /// let (reload, policies) = tokio::sync::watch::channel(policy.clone());
    /// let limiter = Limiter::new(MemoryStore::new(), policy);
    /// tokio::spawn(limiter.follow(policies));
    ///
    /// reload.send("20/s, 600/h".parse()?)?;
    /// # tokio::task::yield_now().await;
    /// # Ok(()) }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(run()).unwrap();
    /// ```
    pub fn follow(
        &self,
        mut policies: tokio::sync::watch::Receiver<Policy>,
    ) -> impl Future<Output = ()> + Send + 'static {
        // Held weakly: the task must not keep a limiter nobody uses alive; and told when it is
        // gone, rather than finding out at the next change, which may never come.
        let limiter: Weak<Inner> = Arc::downgrade(&self.inner);
        let mut alive = self.inner.alive.subscribe();
        async move {
            loop {
                let policy = policies.borrow_and_update().clone();
                let name = match limiter.upgrade() {
                    Some(inner) => {
                        let limiter = Limiter { inner };
                        limiter.set_policy(policy);
                        limiter.inner.version.load().name.clone()
                    }
                    None => return,
                };
                tokio::select! {
                    // (the limiter gone first: one dropped with the channel says nothing)
                    biased;
                    // (never sent to: this is its sender dropped with the limiter)
                    _ = alive.changed() => return,
                    changed = policies.changed() => {
                        if changed.is_err() {
                            observe::policy_channel_closed(&name);
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Turns shadow mode on or off for every clone of this limiter, at once (see
    /// [`LimiterBuilder::shadow`]). Counting is the same in both modes, so switching
    /// changes only the answers.
    pub fn set_shadow(&self, shadow: bool) {
        self.inner.shadow.store(shadow, Ordering::Relaxed);
    }

    /// Whether the limiter is in shadow mode.
    pub fn is_shadow(&self) -> bool {
        self.inner.shadow.load(Ordering::Relaxed)
    }

    /// Checks one request of cost 1 for the given identifiers. See [`Limiter::check_n`].
    ///
    /// # Errors
    ///
    /// As [`Limiter::check_n`].
    pub async fn check<I: AsRef<str>>(&self, identifiers: &[I]) -> Result<Decision, Error> {
        self.run(identifiers, 1, Mode::CHECK).await
    }

    /// Checks one request of cost `cost` (its weight) for the given identifiers: allowed
    /// only if every limit admits it for every identifier, and then charged everywhere; when
    /// denied, charged nowhere. On Redis this is one script call.
    ///
    /// Identifiers are free text (`"ip:203.0.113.9"`, `"user:42"`); any bytes are safe, long
    /// ones are hashed. Giving the same identifier twice counts it once.
    ///
    /// When the store cannot decide (Redis down, slow, misconfigured), the limiter's
    /// [`OnStoreError`] answers: an allowed decision ([`Origin::FailOpen`](crate::Origin)),
    /// the error, or the fallback limiter's decision ([`Origin::Fallback`](crate::Origin)).
    /// A check whose answer was lost (a timeout) is never retried: it may have been charged
    /// already.
    ///
    /// In [shadow mode](LimiterBuilder::shadow) the decision is always allowed; it is
    /// charged as it would be when enforcing.
    ///
    /// # Errors
    ///
    /// [`Error::Cost`] when `cost` is 0 or more than some limit could ever admit
    /// (a request that can never fit is an error, not an eternal denial),
    /// [`Error::NoIdentifiers`] / [`Error::TooManyIdentifiers`], and [`Error::Store`] when
    /// the store could not decide and the limiter fails closed ([`OnStoreError::Closed`]),
    /// or falls back to a scaled policy that cannot hold `cost` ([`OnStoreError::Fallback`]:
    /// `10/s` at a tenth of the fleet is `1/s`, which no cost above 1 fits). In shadow mode,
    /// only the identifier errors.
    pub async fn check_n<I: AsRef<str>>(
        &self,
        identifiers: &[I],
        cost: u64,
    ) -> Result<Decision, Error> {
        self.run(identifiers, cost, Mode::CHECK).await
    }

    /// What a check of cost 1 would decide now, without charging anything. See
    /// [`Limiter::peek_n`].
    ///
    /// # Errors
    ///
    /// As [`Limiter::peek_n`].
    pub async fn peek<I: AsRef<str>>(&self, identifiers: &[I]) -> Result<Decision, Error> {
        self.peek_n(identifiers, 1).await
    }

    /// What a check of cost `cost` would decide now, without charging anything: whether the
    /// request would be allowed (every limit admits `cost` for every identifier), and per
    /// (identifier, limit) pair the quota available now and, for the limits that would deny,
    /// when the cost would fit. It is the check's evaluation alone: the store writes nothing
    /// (on Redis a read-only script runs, and no key, value or TTL changes), so peeking any
    /// number of times charges nothing, and no concurrency slot is taken (the decision holds
    /// no guard). A check made right after may still decide otherwise: others' requests may
    /// be charged in between.
    ///
    /// It answers as a check does in every other respect:
    ///
    /// * when the store cannot decide, the limiter's [`OnStoreError`]: an allowed decision
    ///   without figures ([`Origin::FailOpen`](crate::Origin)), the error, or the fallback's
    ///   peek on its own counts;
    /// * the deny cache: an identifier the store denied a moment ago is answered in process
    ///   ([`Origin::DenyCache`](crate::Origin)), and a peek the store denies is remembered as a
    ///   check's denial is (it is as exact: until then a check of that cost would be denied);
    /// * in shadow mode the decision is allowed, with [`Decision::would_deny`] telling what
    ///   enforcing would say.
    ///
    /// Peeks are not counted in the decision metrics.
    ///
    /// ```
    /// # async fn run() -> Result<(), tollgate::Error> {
    /// use tollgate::{Limiter, MemoryStore};
    ///
    /// let limiter = Limiter::new(MemoryStore::new(), "2/min".parse().unwrap());
    /// let peek = limiter.peek(&["user:42"]).await?;
    /// assert!(peek.is_allowed());
    /// assert_eq!(peek.statuses()[0].remaining, 2); // nothing was charged
    ///
    /// for _ in 0..2 {
    ///     assert!(limiter.check(&["user:42"]).await?.is_allowed());
    /// }
    /// let peek = limiter.peek(&["user:42"]).await?;
    /// assert!(!peek.is_allowed());
    /// assert!(peek.retry_after().is_some());
    /// # Ok(()) }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(run()).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Limiter::check_n`].
    pub async fn peek_n<I: AsRef<str>>(
        &self,
        identifiers: &[I],
        cost: u64,
    ) -> Result<Decision, Error> {
        self.run(identifiers, cost, Mode::PEEK).await
    }
}

impl Limiter {
    /// Whether a check is decided in process, without waiting (the memory store): the HTTP
    /// layer then checks in `call`, with [`run_now`](Limiter::run_now).
    pub(crate) fn decides_at_once(&self) -> bool {
        self.inner.store.as_memory().is_some()
    }

    /// [`run`](Limiter::run), made at once (`run_at_once`); `None` for a store that must be
    /// waited on.
    #[inline(always)]
    pub(crate) fn run_now<I: AsRef<str>>(
        &self,
        identifiers: &[I],
        cost: u64,
        mode: Mode,
    ) -> Option<Result<Decision, Error>> {
        self.run_at_once(identifiers, cost, mode, Duration::ZERO)
            .map(|answer| answer.map(|(decision, _)| decision))
    }
}

/// A limiter's check of one request. It owns the request while it runs and hands it back
/// with the outcome, so that the request can then be passed on (or answered).
pub(crate) type CheckFuture<R> = Pin<Box<dyn Future<Output = (Result<Decision, Error>, R)> + Send>>;

#[cfg(test)]
mod tests {
    use super::*;

    /// A limiter's fallback store is named after it, so that its evictions are told apart
    /// from the main store's.
    #[test]
    fn a_fallback_store_is_named_after_its_limiter() {
        let fallback = |builder: LimiterBuilder| {
            let limiter = builder
                .on_store_error(OnStoreError::fallback(0.5).unwrap())
                .build();
            match limiter.inner.fallback_store.as_ref() {
                Some(Store::Memory(m)) => m.name().to_string(),
                other => panic!("{other:?}"),
            }
        };
        let policy = || "10/min".parse::<Policy>().unwrap();
        let named = Limiter::builder(MemoryStore::new(), policy()).name("api");
        assert_eq!(fallback(named), "fallback:api");
        assert_eq!(
            fallback(Limiter::builder(MemoryStore::new(), policy())),
            "fallback:10/min"
        );
        assert_eq!(MemoryStore::new().name(), "memory");
    }
}

//! Concurrency slots as leases: the lease, its id, and the keeper task that renews held
//! leases and releases dropped ones.
//!
//! A slot is a lease in the store: a random id with a deadline (the store's time plus the
//! lease time). Checking drops expired leases and counts the live ones in the same atomic step
//! that takes a new one. While its guard lives, the keeper renews a lease every third of the
//! lease time, so a long request keeps its slot. A lease let go is released by the store —
//! at once in process, batched by the keeper for Redis, so `Drop` never waits on the network.
//! A release that fails is retried on every tick until it succeeds or the lease has expired
//! anyway. A process that dies holding slots stops renewing them, and they expire after the
//! lease time; the Redis key itself carries a TTL as the last resort.
//!
//! This module knows nothing of the stores: the keeper drives any [`Backend`].

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::clock::system_micros;
use crate::observe::BoundedLog;

/// A concurrency slot held in a store: the key of each identifier's slot set, the lease id,
/// and the lease time.
#[derive(Debug, Clone, Default)]
pub(crate) struct Lease {
    pub(crate) keys: Vec<String>,
    pub(crate) id: String,
    pub(crate) lease_us: u64,
}

/// A random 128-bit lease id, in hex. `RandomState` is seeded from the operating system's
/// randomness once per thread; the counter and the time keep ids apart within a thread.
pub(crate) fn lease_id() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let seed = (
        N.fetch_add(1, Ordering::Relaxed),
        system_micros(),
        std::process::id(),
    );
    let a = RandomState::new().hash_one(seed);
    let b = RandomState::new().hash_one((a, seed));
    format!("{a:016x}{b:016x}")
}

/// Which leases of a renewal or a release reached the store: a lease did when every call
/// its keys needed was answered (in a cluster, its keys may lie on several masters, each
/// called apart). With the first error met, if any, and for a renewal the leases the store
/// answered it holds no longer.
#[derive(Debug)]
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) struct Reached<E> {
    /// By the lease's index in the call.
    pub(crate) leases: Vec<bool>,
    /// By the lease's index: the indices of its keys whose slot sets a renewal found
    /// without it.
    pub(crate) lost: Vec<Vec<usize>>,
    pub(crate) error: Option<E>,
}

#[cfg_attr(not(feature = "redis"), allow(dead_code))]
impl<E> Reached<E> {
    /// Every one of `n` leases reached the store (and none was lost).
    pub(crate) fn all(n: usize) -> Reached<E> {
        Reached {
            leases: vec![true; n],
            lost: vec![Vec::new(); n],
            error: None,
        }
    }

    /// The lease at `index` is gone from the slot set of its key `key` (an index into its
    /// keys), which the store answered for.
    pub(crate) fn lost(&mut self, index: usize, key: usize) {
        if let Some(lost) = self.lost.get_mut(index) {
            lost.push(key);
        }
    }

    /// What the renewal did to each lease (a lease whose calls did not all reach the store
    /// is missed, though another call found it lost).
    pub(crate) fn renewals(&self) -> Vec<Renewal> {
        self.leases
            .iter()
            .zip(&self.lost)
            .map(|(&reached, lost)| match reached {
                false => Renewal::Missed,
                true => Renewal::of_lost(lost.clone()),
            })
            .collect()
    }

    /// The leases at `indices` missed the store, for `error`.
    pub(crate) fn missed(&mut self, indices: impl Iterator<Item = usize>, error: E) {
        for i in indices {
            if let Some(reached) = self.leases.get_mut(i) {
                *reached = false;
            }
        }
        self.error.get_or_insert(error);
    }
}

/// What a renewal did to one lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// Extended to its full lease time from now.
    Renewed,
    /// The slot sets of these keys (indices into the lease's keys) hold it no longer: it
    /// expired before the renewal came (the store was unreachable, or the process stalled,
    /// for longer than the lease), or the key was lost (a flush, a failover that lost
    /// writes, eviction). Its slot there may be another request's now, so that limit may
    /// admit more than its count until the request ends. Its other keys were renewed.
    Lost(Vec<usize>),
    /// The call did not reach the store; tried again on the next tick.
    Missed,
}

impl Renewal {
    /// The renewal that reached the store of a lease whose keys `lost` (indices) held it no
    /// longer: renewed when there are none.
    pub(crate) fn of_lost(lost: Vec<usize>) -> Renewal {
        if lost.is_empty() {
            Renewal::Renewed
        } else {
            Renewal::Lost(lost)
        }
    }
}

/// What the keeper needs of a store.
pub(crate) trait Backend: Send + Sync + 'static {
    /// The store's name in logs and metrics.
    fn label(&self) -> &str;
    /// Extends live leases to their full lease time from now: what it did to each.
    fn renew(&self, leases: &[&Lease]) -> impl Future<Output = Vec<Renewal>> + Send;
    /// Gives slots back (idempotent): which reached the store.
    fn release(&self, leases: &[Lease]) -> impl Future<Output = Vec<bool>> + Send;
}

enum Msg {
    /// A slot was taken: renew it until told otherwise.
    Hold(Lease),
    /// A guard was dropped: release the slot (Redis only: in process it is released at once).
    Release(Lease),
    /// A check that may have taken the slot failed (a timeout): release it now, and again
    /// each tick until its lease would have expired. Its script may still be on its way
    /// when the first release arrives (sent on another connection, after the timeouts had
    /// the connection replaced, or a cluster redirect), and would then take the slot with
    /// no guard to give it back.
    ReleaseUntilExpired(Lease),
    /// Stop renewing (the slot was forgotten, or released already).
    Forget(String),
}

/// The handle of a store's keeper task.
struct Keeper {
    tx: mpsc::UnboundedSender<Msg>,
}

impl fmt::Debug for Keeper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keeper")
            .field("running", &!self.tx.is_closed())
            .finish()
    }
}

impl Keeper {
    /// Sends `msg`; the message back when the task is gone (its runtime shut down).
    fn send(&self, msg: Msg) -> Result<(), Msg> {
        self.tx.send(msg).map_err(|e| e.0)
    }
}

/// Where a store keeps its keeper, started on first use.
#[derive(Debug, Default)]
pub(crate) struct KeeperSlot {
    keeper: Mutex<Option<Keeper>>,
    /// What a keeper left when its task was dropped under it (its runtime shut down), and the
    /// messages no keeper could take, for the next one to take over.
    orphans: Arc<Mutex<Orphans>>,
    /// Where keepers say they took over slots, at a bounded rate whichever keeper says it.
    taken_over_log: Arc<BoundedLog>,
}

/// What a keeper dropped with its runtime leaves behind: the leases it renewed and the
/// releases it had still to make. A store used from several runtimes (or kept past one)
/// starts its next keeper on another runtime, which takes them over: the requests still
/// running keep their slots, and the slots let go are released.
#[derive(Default)]
struct Orphans {
    held: HashMap<String, Held>,
    unreleased: Vec<Held>,
}

impl fmt::Debug for Orphans {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Orphans")
            .field("held", &self.held.len())
            .field("unreleased", &self.unreleased.len())
            .finish()
    }
}

impl KeeperSlot {
    /// Renews `lease` (a slot a check took) until it is let go, in the keeper started within
    /// the current Tokio runtime if not running (on a backend that `backend` makes). Outside
    /// a runtime, with no keeper running, the lease is left for the next keeper to take over,
    /// or expires by itself.
    pub(crate) fn hold<B: Backend>(&self, backend: impl FnOnce() -> B, lease: Lease) {
        self.send(backend, Msg::Hold(lease));
    }

    /// Ends `lease`'s renewal and gives its slot back through the keeper (Redis: batched,
    /// retried while it fails).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn release<B: Backend>(&self, backend: impl FnOnce() -> B, lease: Lease) {
        self.send(backend, Msg::Release(lease));
    }

    /// Releases the slot of `lease`, which a check that failed may have taken (a timeout), now
    /// and again each tick until its lease would have expired (see
    /// [`Msg::ReleaseUntilExpired`]).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn release_until_expired<B: Backend>(
        &self,
        backend: impl FnOnce() -> B,
        lease: Lease,
    ) {
        self.send(backend, Msg::ReleaseUntilExpired(lease));
    }

    /// Ends the renewal of the lease `id` (a slot in process its store releases at once, or
    /// one left to expire).
    pub(crate) fn forget<B: Backend>(&self, backend: impl FnOnce() -> B, id: String) {
        self.send(backend, Msg::Forget(id));
    }

    /// Sends `msg` to the keeper, started within the current Tokio runtime if not running
    /// (taking over what a lost keeper left). A message no keeper takes — outside a runtime,
    /// or on a runtime shutting down, whose tasks are dropped as they are spawned — is
    /// applied to the orphans, for the next keeper.
    ///
    /// Under the keeper's lock throughout, so that no keeper starts (and takes the orphans
    /// over) between a send that fails and the orphans it then changes; and a keeper dropped
    /// closes its channel under the orphans' lock before it leaves them what it held, so that
    /// a message is either among those it leaves or refused (see `Holding`'s `Drop`).
    fn send<B: Backend>(&self, backend: impl FnOnce() -> B, msg: Msg) {
        let mut current = lock(&self.keeper);
        let Some(msg) = unsent(current.as_ref(), msg) else {
            return;
        };
        // No keeper yet, or its task ended under it with its runtime (this slot holds a
        // sender, so its channel closes for no other reason).
        let Some(msg) = unsent(self.start(&mut current, backend), msg) else {
            return;
        };
        let orphans = &mut *lock(&self.orphans);
        apply(msg, &mut orphans.held, &mut orphans.unreleased);
    }

    /// Starts a keeper within the current Tokio runtime (on a backend that `backend` makes),
    /// taking over what a lost keeper left, as `current`; `None` outside a runtime.
    ///
    /// The task must hold the store without this slot (and so without a sender): once every
    /// handle of the store and every guard is gone, its channel closes and it ends.
    fn start<'a, B: Backend>(
        &self,
        current: &'a mut Option<Keeper>,
        backend: impl FnOnce() -> B,
    ) -> Option<&'a Keeper> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let (tx, rx) = mpsc::unbounded_channel();
        // Made here, not in the task, so that what it took over goes back to the orphans even
        // if the task is dropped before it first runs (spawned on a runtime shutting down).
        let holding = Holding::taking_over(rx, self.orphans.clone(), self.taken_over_log.clone());
        runtime.spawn(run(backend(), holding));
        Some(current.insert(Keeper { tx }))
    }
}

/// `msg` sent to `keeper`: `None` once sent, the message back when there is no keeper or its
/// task is gone.
fn unsent(keeper: Option<&Keeper>, msg: Msg) -> Option<Msg> {
    match keeper {
        Some(k) => k.send(msg).err(),
        None => Some(msg),
    }
}

/// `mutex` locked, poisoned or not (nothing under these locks panics half way).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How often the keeper looks for leases to renew and releases to retry.
const TICK: Duration = Duration::from_millis(250);

/// A lease the keeper renews: when it last did (the lease lasts at least until then plus the
/// lease time).
struct Held {
    lease: Lease,
    renewed: Instant,
    /// Released again each tick until it expires, reached or not (see
    /// [`Msg::ReleaseUntilExpired`]).
    again: bool,
}

impl Held {
    fn expires(&self) -> Instant {
        self.renewed + Duration::from_micros(self.lease.lease_us)
    }
}

/// The keeper: renews held leases every third of their lease time, releases dropped ones in
/// batches and retries failed releases until their lease would have expired. A lease the
/// store no longer holds is reported (logged and counted) and renewed no more. It ends when
/// the store's handles and guards are all gone.
async fn run<B: Backend>(backend: B, mut holding: Holding) {
    let lost_log = BoundedLog::default();
    let Holding {
        leases: held,
        unreleased,
        rx,
        taken_over,
        taken_over_log,
        ..
    } = &mut holding;
    // The slots taken over from a keeper lost with its runtime, still held once the messages
    // sent before this first ran are read, are said: not those let go meanwhile, as a
    // runtime's guards are when it shuts down (a keeper started then never runs).
    let mut released = Vec::new();
    drain(rx, held, &mut released);
    unreleased.append(&mut released);
    let still_held = taken_over
        .iter()
        .filter(|id| held.contains_key(*id))
        .count();
    if still_held > 0 {
        taken_over_log.keeper_lost(backend.label(), still_held);
    }
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            msg = rx.recv() => {
                let Some(msg) = msg else { return };
                let mut released = Vec::new();
                apply(msg, held, &mut released);
                drain(rx, held, &mut released);
                release(&backend, released, unreleased).await;
            }
            _ = tick.tick() => {
                let now = Instant::now();
                unreleased.retain(|h| h.expires() > now);
                let retried = std::mem::take(unreleased);
                release(&backend, retried, unreleased).await;
                let due: Vec<&Lease> = held
                    .values()
                    .filter(|h| now.duration_since(h.renewed) >= Duration::from_micros(h.lease.lease_us / 3))
                    .map(|h| &h.lease)
                    .collect();
                if due.is_empty() {
                    continue;
                }
                let ids: Vec<String> = due.iter().map(|l| l.id.clone()).collect();
                let renewals = backend.renew(&due).await;
                // A lease let go while its renewal ran is not lost: its guard released it
                // (in process at once, before telling the keeper, which it does first).
                let mut released = Vec::new();
                drain(rx, held, &mut released);
                let mut lost = 0;
                for (id, renewal) in ids.into_iter().zip(renewals) {
                    let Some(h) = held.get_mut(&id) else { continue };
                    match renewal {
                        Renewal::Renewed => h.renewed = now,
                        // Renewing those keys again would not bring the slot back; the
                        // lease's other keys go on being renewed, and its guard still
                        // releases them all (a no-op where it is gone) when dropped.
                        Renewal::Lost(keys) => {
                            lost += 1;
                            let mut k = 0;
                            h.lease.keys.retain(|_| {
                                k += 1;
                                !keys.contains(&(k - 1))
                            });
                            if h.lease.keys.is_empty() {
                                held.remove(&id);
                            } else {
                                h.renewed = now;
                            }
                        }
                        Renewal::Missed => {}
                    }
                }
                if lost > 0 {
                    lost_log.leases_lost(backend.label(), lost);
                }
                release(&backend, released, unreleased).await;
            }
        }
    }
}

/// The leases a keeper renews, the releases it retries, and its messages. Dropped with its
/// task (the runtime shut down: it never ends so otherwise, as its channel closes only once
/// every guard is gone), it leaves them, those it had not read yet applied, to the next
/// keeper.
struct Holding {
    leases: HashMap<String, Held>,
    /// Releases that did not reach the store, kept until their lease has expired anyway.
    unreleased: Vec<Held>,
    /// The keeper's messages, some perhaps not read yet when it is dropped.
    rx: mpsc::UnboundedReceiver<Msg>,
    orphans: Arc<Mutex<Orphans>>,
    /// The ids of the leases taken over from a lost keeper, and where that is said.
    taken_over: Vec<String>,
    taken_over_log: Arc<BoundedLog>,
}

impl Holding {
    /// A keeper's holding on the channel `rx`, taking over what a lost keeper left in
    /// `orphans` (and the messages no keeper took), to be said in `log`.
    fn taking_over(
        rx: mpsc::UnboundedReceiver<Msg>,
        orphans: Arc<Mutex<Orphans>>,
        log: Arc<BoundedLog>,
    ) -> Holding {
        let (leases, unreleased, taken_over) = {
            let mut left = lock(&orphans);
            let taken_over = left.held.keys().cloned().collect();
            let leases = std::mem::take(&mut left.held);
            (leases, std::mem::take(&mut left.unreleased), taken_over)
        };
        Holding {
            leases,
            unreleased,
            rx,
            orphans,
            taken_over,
            taken_over_log: log,
        }
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        // The channel closed under the orphans' lock: a message sent before is read here and
        // left to the next keeper, one sent after is refused, and its sender leaves it to the
        // orphans itself (see `KeeperSlot::send`).
        let mut orphans = lock(&self.orphans);
        self.rx.close();
        let mut released = Vec::new();
        // Until the channel says no message can come: a send that began before the close
        // counts its message before it queues it, and meanwhile the channel reads as empty.
        // Stopping at that (as `drain` does) would lose a message whose send then succeeds.
        // (From Tokio 1.52.3 on, the crate's least version. Before 1.49 a closed channel
        // with senders read as empty for good; from 1.49 to 1.52.3 it read as disconnected
        // even with a send under way, whose message was then lost.)
        loop {
            match self.rx.try_recv() {
                Ok(msg) => apply(msg, &mut self.leases, &mut released),
                Err(mpsc::error::TryRecvError::Empty) => std::thread::yield_now(),
                Err(mpsc::error::TryRecvError::Disconnected) => break,
            }
        }
        orphans.held.extend(self.leases.drain());
        orphans.unreleased.append(&mut self.unreleased);
        orphans.unreleased.append(&mut released);
    }
}

/// Applies the messages waiting in `rx`.
fn drain(
    rx: &mut mpsc::UnboundedReceiver<Msg>,
    held: &mut HashMap<String, Held>,
    released: &mut Vec<Held>,
) {
    while let Ok(msg) = rx.try_recv() {
        apply(msg, held, released);
    }
}

/// Releases `released` in the store, keeping those whose release missed it in `unreleased`
/// (a lease the answer does not cover counts as missed). They are among the unreleased while
/// the call runs: a keeper dropped meanwhile (its runtime shutting down) leaves them to the
/// next one.
async fn release<B: Backend>(backend: &B, released: Vec<Held>, unreleased: &mut Vec<Held>) {
    if released.is_empty() {
        return;
    }
    let leases: Vec<Lease> = released.iter().map(|h| h.lease.clone()).collect();
    let from = unreleased.len();
    unreleased.extend(released);
    let reached = backend.release(&leases).await;
    let mut i = 0;
    unreleased.retain(|h| {
        let keep = i < from || h.again || !reached.get(i - from).copied().unwrap_or(false);
        i += 1;
        keep
    });
}

fn apply(msg: Msg, held: &mut HashMap<String, Held>, released: &mut Vec<Held>) {
    match msg {
        Msg::Hold(lease) => {
            let renewed = Instant::now();
            let again = false;
            held.insert(
                lease.id.clone(),
                Held {
                    lease,
                    renewed,
                    again,
                },
            );
        }
        Msg::Release(lease) => {
            let renewed = held
                .remove(&lease.id)
                .map_or_else(Instant::now, |h| h.renewed);
            released.push(Held {
                lease,
                renewed,
                again: false,
            });
        }
        Msg::ReleaseUntilExpired(lease) => {
            held.remove(&lease.id);
            released.push(Held {
                lease,
                renewed: Instant::now(),
                again: true,
            });
        }
        Msg::Forget(id) => {
            held.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::Arc;

    use super::*;

    /// A call the keeper made: `renew` or `release`, and the lease ids.
    type Call = (&'static str, Vec<String>);

    /// A store that records the lease ids of each call, and misses those it is told are down
    /// (a master of a cluster that is down, say).
    #[derive(Clone, Default)]
    struct Recorder {
        calls: Arc<Mutex<Vec<Call>>>,
        down: Arc<Mutex<HashSet<String>>>,
        /// Slot set keys that hold their leases no longer.
        lost: Arc<Mutex<HashSet<String>>>,
        /// The keys of each lease renewed, in the order renewed.
        renewed_keys: Arc<Mutex<Vec<Vec<String>>>>,
    }

    impl Recorder {
        /// Which of `ids` (in the order of the call) reached the store; the call is recorded
        /// with its ids sorted (the keeper's order of held leases is a map's).
        fn answer(&self, call: &'static str, ids: Vec<String>) -> Vec<bool> {
            let down = self.down.lock().unwrap();
            let reached = ids.iter().map(|id| !down.contains(id)).collect();
            let mut sorted = ids;
            sorted.sort();
            self.calls.lock().unwrap().push((call, sorted));
            reached
        }

        fn take(&self) -> Vec<Call> {
            std::mem::take(&mut *self.calls.lock().unwrap())
        }
    }

    impl Backend for Recorder {
        fn label(&self) -> &str {
            "recorder"
        }

        async fn renew(&self, leases: &[&Lease]) -> Vec<Renewal> {
            let ids = leases.iter().map(|l| l.id.clone()).collect();
            let lost = self.lost.lock().unwrap();
            let renewals = leases.iter().map(|l| {
                self.renewed_keys.lock().unwrap().push(l.keys.clone());
                let gone: Vec<usize> = (0..l.keys.len())
                    .filter(|&k| lost.contains(&l.keys[k]))
                    .collect();
                Renewal::of_lost(gone)
            });
            let reached = self.answer("renew", ids);
            reached
                .into_iter()
                .zip(renewals)
                .map(|(reached, renewal)| if reached { renewal } else { Renewal::Missed })
                .collect()
        }

        async fn release(&self, leases: &[Lease]) -> Vec<bool> {
            let ids = leases.iter().map(|l| l.id.clone()).collect();
            self.answer("release", ids)
        }
    }

    fn lease(id: &str) -> Lease {
        Lease {
            keys: vec![format!("k:{{{id}}}")],
            id: id.to_string(),
            // renewed every second
            lease_us: 3_000_000,
        }
    }

    /// Lets the keeper run its ticks up to `by` from now.
    async fn run_for(by: Duration) {
        tokio::time::sleep(by).await;
        tokio::task::yield_now().await;
    }

    /// A renewal or a release that misses the store for some leases (their master is down)
    /// holds back only those: the others are renewed on time, and only the missed release is
    /// tried again, until it reaches the store.
    #[tokio::test(start_paused = true)]
    async fn a_lease_the_store_missed_holds_back_no_other() {
        let store = Recorder::default();
        let (tx, rx) = mpsc::unbounded_channel();
        let keeper = tokio::spawn(run(
            store.clone(),
            Holding::taking_over(rx, Arc::default(), Arc::default()),
        ));
        store.down.lock().unwrap().insert("b".into());
        tx.send(Msg::Hold(lease("a"))).unwrap();
        tx.send(Msg::Hold(lease("b"))).unwrap();
        // a third of the lease: both are due, `b` misses
        run_for(Duration::from_millis(1100)).await;
        assert_eq!(store.take(), [("renew", vec!["a".into(), "b".into()])]);
        // the next tick: `b` only, `a` was renewed
        run_for(TICK).await;
        assert_eq!(store.take(), [("renew", vec!["b".into()])]);
        tx.send(Msg::Release(lease("a"))).unwrap();
        tx.send(Msg::Release(lease("b"))).unwrap();
        run_for(Duration::ZERO).await;
        assert_eq!(store.take(), [("release", vec!["a".into(), "b".into()])]);
        // only `b`'s release is tried again, on each tick, until it reaches the store
        run_for(TICK).await;
        assert_eq!(store.take(), [("release", vec!["b".into()])]);
        store.down.lock().unwrap().clear();
        run_for(TICK).await;
        assert_eq!(store.take(), [("release", vec!["b".into()])]);
        run_for(TICK * 4).await;
        assert_eq!(store.take(), []);
        drop(tx);
        keeper.await.unwrap();
    }

    /// The slot of a check that failed and may have taken it is released at once, and again
    /// each tick though the release reached the store, until its lease would have expired:
    /// the check's script may still be on its way, and take the slot after a release that
    /// overtook it. A release of a guard is made once.
    #[tokio::test(start_paused = true)]
    async fn an_unsure_slot_is_released_until_its_lease_would_have_expired() {
        let store = Recorder::default();
        let (tx, rx) = mpsc::unbounded_channel();
        let keeper = tokio::spawn(run(
            store.clone(),
            Holding::taking_over(rx, Arc::default(), Arc::default()),
        ));
        tx.send(Msg::ReleaseUntilExpired(lease("u"))).unwrap();
        tx.send(Msg::Release(lease("r"))).unwrap();
        run_for(Duration::ZERO).await;
        assert_eq!(store.take(), [("release", vec!["r".into(), "u".into()])]);
        for _ in 0..4 {
            run_for(TICK).await;
            assert_eq!(store.take(), [("release", vec!["u".into()])]);
        }
        // its lease (3 s) over: no more
        run_for(Duration::from_secs(3)).await;
        store.take();
        run_for(TICK * 2).await;
        assert_eq!(store.take(), []);
        drop(tx);
        keeper.await.unwrap();
    }

    /// A lease the store answers it holds no longer is renewed no more (renewing would not
    /// bring it back), while the others go on being renewed; its guard's release still goes
    /// out.
    #[tokio::test(start_paused = true)]
    async fn a_lost_lease_is_renewed_no_more() {
        let store = Recorder::default();
        let (tx, rx) = mpsc::unbounded_channel();
        let keeper = tokio::spawn(run(
            store.clone(),
            Holding::taking_over(rx, Arc::default(), Arc::default()),
        ));
        store.lost.lock().unwrap().insert("k:{b}".into());
        tx.send(Msg::Hold(lease("a"))).unwrap();
        tx.send(Msg::Hold(lease("b"))).unwrap();
        run_for(Duration::from_millis(1100)).await;
        assert_eq!(store.take(), [("renew", vec!["a".into(), "b".into()])]);
        // a second later only `a` is due, and `b` is not tried again
        run_for(Duration::from_millis(1000)).await;
        assert_eq!(store.take(), [("renew", vec!["a".into()])]);
        tx.send(Msg::Release(lease("b"))).unwrap();
        run_for(Duration::ZERO).await;
        assert_eq!(store.take(), [("release", vec!["b".into()])]);
        drop(tx);
        keeper.await.unwrap();
    }

    /// A lease of two identifiers whose slot set is lost for one of them goes on being
    /// renewed for the other, and no longer for the lost one.
    #[tokio::test(start_paused = true)]
    async fn a_lease_lost_for_one_identifier_is_renewed_for_the_other() {
        let store = Recorder::default();
        let (tx, rx) = mpsc::unbounded_channel();
        let keeper = tokio::spawn(run(
            store.clone(),
            Holding::taking_over(rx, Arc::default(), Arc::default()),
        ));
        store.lost.lock().unwrap().insert("user:{7}".into());
        let mut two = lease("c");
        two.keys = vec!["ip:{1}".into(), "user:{7}".into()];
        tx.send(Msg::Hold(two)).unwrap();
        run_for(Duration::from_millis(1100)).await;
        run_for(Duration::from_millis(1000)).await;
        let renewed = std::mem::take(&mut *store.renewed_keys.lock().unwrap());
        assert_eq!(
            renewed,
            [
                vec!["ip:{1}".to_string(), "user:{7}".to_string()],
                vec!["ip:{1}".to_string()],
            ]
        );
        drop(tx);
        keeper.await.unwrap();
    }
}

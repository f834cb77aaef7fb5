//! A circuit breaker in front of a remote store.
//!
//! While the store answers, every check calls it. After [`THRESHOLD`] failures in a row (a
//! timeout, a refused or lost connection, a server error) the breaker opens: checks stop
//! calling the store and fail at once with [`StoreError::Unavailable`], which the limiter's
//! failure policy answers in microseconds instead of after a timeout. One probe task then asks
//! the store every [`PROBE_EVERY`] whether it is back, and closes the breaker when it is, so
//! checks go through the store again within that interval of its return.
//!
//! A failure count rather than a failure rate: a store that is down fails every call, and a
//! handful in a row is the clearest signal there is; a healthy store that drops one call in a
//! while never opens it. While the breaker is closed, a check is never refused by it.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::StoreError;
use crate::observe::{self, BoundedLog, StoreKeys};

/// Failures in a row that open the breaker.
pub(crate) const THRESHOLD: u32 = 3;
/// How often an open breaker asks the store whether it is back.
pub(crate) const PROBE_EVERY: Duration = Duration::from_millis(200);

/// The breaker of one store (shared by its clones).
#[derive(Debug)]
pub(crate) struct Breaker {
    /// The store's name in logs and metrics (its key prefix).
    store: Arc<str>,
    keys: StoreKeys,
    failures: AtomicU32,
    open: AtomicBool,
    /// Probe tasks running: one while the breaker is open, unless its task was dropped (its
    /// runtime shut down) before the store answered.
    probes: AtomicU32,
    /// Calls that failed, logged at most every 10 s.
    failed_calls: BoundedLog,
}

/// What a call's result means for the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tripped {
    /// Nothing changed, or the breaker was open already.
    No,
    /// This failure opened the breaker: start probing.
    Opened,
}

impl Breaker {
    pub(crate) fn new(store: Arc<str>) -> Breaker {
        observe::breaker_made(&store);
        Breaker {
            keys: StoreKeys::new(&store),
            store,
            failures: AtomicU32::new(0),
            open: AtomicBool::new(false),
            probes: AtomicU32::new(0),
            failed_calls: BoundedLog::default(),
        }
    }

    /// Runs `call` unless the breaker is open (then fails at once with
    /// [`StoreError::Unavailable`]), records its latency and result, and when this call opens
    /// the breaker, starts a task that runs `probe` every [`PROBE_EVERY`] until it succeeds.
    /// The task holds the breaker weakly: it ends with the store.
    pub(crate) async fn call<T, P, F>(
        self: &Arc<Self>,
        call: impl Future<Output = Result<T, StoreError>>,
        probe: impl FnOnce() -> P,
    ) -> Result<T, StoreError>
    where
        P: Fn() -> F + Send + 'static,
        F: Future<Output = Result<(), StoreError>> + Send + 'static,
    {
        if !self.is_closed() {
            // An open breaker whose probe is gone (the runtime it ran on shut down: a store
            // shared by several runtimes, or kept past one) would stay open for good, every
            // check answered by the failure policy: this call starts another.
            // (The call that opens it counts its probe before it shows open, so a count of 0
            // here is a probe lost, not one about to start.)
            let lost = self
                .probes
                .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire);
            if lost.is_ok() {
                if self.is_closed() {
                    // The probe closed the breaker and ended between the two reads: none was
                    // lost. (A call that opens it again meanwhile counted its own probe.)
                    self.probes.fetch_sub(1, Ordering::AcqRel);
                } else {
                    observe::breaker_probe_restarted(&self.store);
                    self.probe(probe());
                }
            }
            observe::store_call(&self.store, &self.keys, None, Err(&StoreError::Unavailable));
            return Err(StoreError::Unavailable);
        }
        let mut timing = Timing {
            breaker: self,
            started: Instant::now(),
            done: false,
        };
        let result = call.await;
        timing.done = true;
        let started = timing.started;
        let outcome = result.as_ref().map(|_| ());
        observe::store_call(&self.store, &self.keys, Some(started.elapsed()), outcome);
        if let Err(e) = outcome {
            self.failed_calls.store_call_failed(&self.store, e);
        }
        if self.record(outcome) == Tripped::Opened {
            self.probe(probe());
        }
        result
    }

    /// Starts a task that runs `probe` every [`PROBE_EVERY`] until the store answers, on the
    /// current runtime, for the probe already counted in `probes`; without a runtime, closes
    /// the breaker (the next call finds out).
    fn probe<P, F>(self: &Arc<Self>, probe: P)
    where
        P: Fn() -> F + Send + 'static,
        F: Future<Output = Result<(), StoreError>> + Send + 'static,
    {
        // counted down however the task ends: done, panicked, or dropped with its runtime
        let running = Running(Arc::downgrade(self));
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            drop(running);
            return self.close();
        };
        runtime.spawn(async move {
            let running = running;
            probing(running.0.clone(), probe).await;
        });
    }

    /// Whether calls go to the store (the breaker is closed).
    pub(crate) fn is_closed(&self) -> bool {
        !self.open.load(Ordering::Acquire)
    }

    /// Records the result of a call that went to the store. [`Tripped::Opened`] counts a
    /// probe the caller must start ([`probe`](Self::probe)).
    pub(crate) fn record(&self, result: Result<(), &StoreError>) -> Tripped {
        match result {
            Ok(()) => {
                self.failures.store(0, Ordering::Release);
                Tripped::No
            }
            Err(e) => {
                let n = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
                if n < THRESHOLD || !self.is_closed() {
                    return Tripped::No;
                }
                // The probe the caller starts is counted before the breaker shows open: a
                // call that finds it open without one takes the probe for lost.
                self.probes.fetch_add(1, Ordering::AcqRel);
                if self.open.swap(true, Ordering::AcqRel) {
                    self.probes.fetch_sub(1, Ordering::AcqRel);
                    return Tripped::No;
                }
                observe::breaker_opened(&self.store, e);
                Tripped::Opened
            }
        }
    }

    /// The store answered a probe: calls go to it again.
    pub(crate) fn close(&self) {
        self.failures.store(0, Ordering::Release);
        if self.open.swap(false, Ordering::AcqRel) {
            observe::breaker_closed(&self.store);
        }
    }
}

impl Drop for Breaker {
    fn drop(&mut self) {
        if !self.is_closed() {
            observe::breaker_dropped_open(&self.store);
        }
    }
}

/// The time of a call that went to the store: recorded as the call's latency, if its
/// caller drops it before it ends (a deadline of its own, a client gone), for as long as it
/// ran. Otherwise the calls a slow store makes its callers give up on would be missing from
/// the latencies, which would read low exactly while the store is slow. (Neither the breaker
/// nor the error counts take such a call: its caller gave up, the store did not fail.)
struct Timing<'a> {
    breaker: &'a Breaker,
    started: Instant,
    done: bool,
}

impl Drop for Timing<'_> {
    fn drop(&mut self) {
        if !self.done {
            let breaker = self.breaker;
            // its latency so far, and no failure: its caller gave up, not the store
            let took = Some(self.started.elapsed());
            observe::store_call(&breaker.store, &breaker.keys, took, Ok(()));
        }
    }
}

/// A probe task of the breaker, counted while it lives.
struct Running(Weak<Breaker>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(b) = self.0.upgrade() {
            b.probes.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Probes until the store answers (or is gone), then closes the breaker.
async fn probing<F>(breaker: Weak<Breaker>, probe: impl Fn() -> F)
where
    F: Future<Output = Result<(), StoreError>>,
{
    loop {
        tokio::time::sleep(PROBE_EVERY).await;
        if breaker.strong_count() == 0 {
            return;
        }
        if probe().await.is_ok() {
            if let Some(b) = breaker.upgrade() {
                b.close();
            }
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_a_run_of_failures_and_closes_on_probe() {
        let b = Breaker::new("test".into());
        let e = StoreError::Timeout(Duration::from_millis(1));
        assert_eq!(b.record(Err(&e)), Tripped::No);
        assert_eq!(b.record(Err(&e)), Tripped::No);
        // a success in between starts the count again
        assert_eq!(b.record(Ok(())), Tripped::No);
        for _ in 1..THRESHOLD {
            assert_eq!(b.record(Err(&e)), Tripped::No);
            assert!(b.is_closed());
        }
        assert_eq!(b.record(Err(&e)), Tripped::Opened);
        assert!(!b.is_closed());
        // further failures (calls that were in flight) do not open it twice
        assert_eq!(b.record(Err(&e)), Tripped::No);
        b.close();
        assert!(b.is_closed());
        assert_eq!(b.record(Err(&e)), Tripped::No);
    }

    /// A breaker opened on a runtime that then shut down lost its probe with it: the next
    /// call, on another runtime, finds no probe running and starts one, which closes the
    /// breaker once the store answers (it stayed open for good before).
    #[test]
    fn a_probe_lost_with_its_runtime_is_started_again() {
        let b = Arc::new(Breaker::new("test".into()));
        let failing = || async { Err::<(), _>(StoreError::Timeout(Duration::from_millis(1))) };
        let answering = || || async { Ok(()) };
        let first = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        first.block_on(async {
            // a probe that never gets an answer
            let silent = || || async { Err(StoreError::Unavailable) };
            for _ in 0..THRESHOLD {
                let _ = b.call(failing(), silent).await;
            }
        });
        assert!(!b.is_closed());
        assert_eq!(b.probes.load(Ordering::Acquire), 1);
        drop(first);
        assert_eq!(
            b.probes.load(Ordering::Acquire),
            0,
            "the probe went with its runtime"
        );
        let second = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        second.block_on(async {
            let answer = b.call(async { Ok(()) }, answering).await;
            assert!(matches!(answer, Err(StoreError::Unavailable)));
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while !b.is_closed() {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the new probe never closed it"
                );
                tokio::time::sleep(PROBE_EVERY / 4).await;
            }
        });
        assert_eq!(b.probes.load(Ordering::Acquire), 0, "one probe, done");
    }
}

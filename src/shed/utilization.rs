//! The worker-utilization load shedder: how much traffic to shed, from how busy the process
//! is, moving slowly in both directions.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use super::{InFlight, Priority, ShedConfig, UtilizationSource};
use crate::clock::{system_micros, Clock};
use crate::observe::BoundedLog;

/// The mutable part of a shedder.
#[derive(Debug)]
struct State {
    /// From the resting amount to 1.
    amount: f64,
    /// When the amount was last updated, in the shedder's clock microseconds.
    last_update: Option<u64>,
}

/// A small, lock-free pseudo-random generator (SplitMix64): decisions only need cheap,
/// well-spread numbers, not cryptographic ones.
#[derive(Debug)]
struct SplitMix(AtomicU64);

const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

impl SplitMix {
    fn seeded(seed: u64) -> SplitMix {
        SplitMix(AtomicU64::new(seed))
    }

    /// Seeded from the standard library's per-process random keys and the time.
    fn from_entropy() -> SplitMix {
        SplitMix::seeded(RandomState::new().hash_one(system_micros()))
    }

    fn next_u64(&self) -> u64 {
        let mut z = self
            .0
            .fetch_add(GOLDEN_GAMMA, Ordering::Relaxed)
            .wrapping_add(GOLDEN_GAMMA);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn next_unit(&self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Decides which requests to shed from how busy the process is, after Stripe's "worker
/// utilization load shedder": the last resort, for a process that must offload.
///
/// Each decision reads the [utilization](UtilizationSource), turns it into a rate of change
/// of the *shedding amount* (see [`ShedConfig`]), and integrates that rate over the time since
/// the previous decision. The amount then sets the probability that a request of each
/// [`Priority`] is shed ([`Priority::shed_probability`]). With the defaults, a fully busy
/// process sheds nothing for 28 s, then sheds more and more for 120 s until only critical
/// traffic gets through; once the load is gone the amount falls back as gradually, so that
/// shedding never swings sharply.
///
/// The state is process-local, behind a mutex held for a few arithmetic operations per
/// decision. Share one shedder (e.g. through a [`UtilizationShedLayer`](super::UtilizationShedLayer),
/// whose clones share it) rather than making one per connection.
///
/// ```
/// use std::time::Duration;
/// use tollgate::shed::{Priority, ShedConfig, UtilizationShedder};
/// use tollgate::{Clock, ManualClock};
///
/// let clock = ManualClock::new(0);
/// let shedder = UtilizationShedder::new(ShedConfig::default(), || 1.0)
///     .clock(Clock::Manual(clock.clone()));
/// for _ in 0..=28 {
///     assert!(!shedder.should_shed(Priority::Low)); // not yet: it may be a blip
///     clock.advance(Duration::from_secs(1));
/// }
/// for _ in 0..120 {
///     shedder.should_shed(Priority::Low);
///     clock.advance(Duration::from_secs(1));
/// }
/// assert!(shedder.should_shed(Priority::High)); // everything but critical traffic
/// assert!(!shedder.should_shed(Priority::Critical));
/// ```
pub struct UtilizationShedder {
    config: ShedConfig,
    source: Box<dyn UtilizationSource>,
    in_flight: Option<InFlight>,
    clock: Clock,
    epoch: Instant,
    rng: SplitMix,
    state: Mutex<State>,
    /// Its name in logs and metric labels: `utilization`, or `utilization:NAME`.
    label: String,
    /// Requests a layer shed, logged at most every 10 s.
    shed_log: BoundedLog,
    /// Readings outside [0, 1], logged at a bounded rate.
    reading_log: BoundedLog,
}

impl fmt::Debug for UtilizationShedder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UtilizationShedder")
            .field("name", &self.label)
            .field("config", &self.config)
            .field("in_flight", &self.in_flight)
            .field("clock", &self.clock)
            .field("amount", &self.amount())
            .finish_non_exhaustive()
    }
}

impl UtilizationShedder {
    /// A shedder reading the utilization from `source`, at rest (shedding nothing). An
    /// [`InFlight`] given as the source is the shedder's [in-flight
    /// counter](Self::in_flight_counter), as with [`in_flight`](Self::in_flight): a
    /// [`UtilizationShedLayer`](super::UtilizationShedLayer) counts the requests in it.
    pub fn new(config: ShedConfig, source: impl UtilizationSource + 'static) -> Self {
        // (else a layer would count nothing in it, and nothing would ever be shed)
        let in_flight = (&source as &dyn std::any::Any)
            .downcast_ref::<InFlight>()
            .cloned();
        UtilizationShedder {
            config,
            source: Box::new(source),
            in_flight,
            clock: Clock::Real,
            epoch: Instant::now(),
            rng: SplitMix::from_entropy(),
            state: Mutex::new(State {
                amount: config.resting_amount(),
                last_update: None,
            }),
            label: "utilization".into(),
            shed_log: BoundedLog::default(),
            reading_log: BoundedLog::default(),
        }
    }

    /// A request of `priority` a layer shed: counted
    /// (`tollgate_shed_total{shedder="utilization",priority}`, or `utilization:NAME` for a
    /// named shedder) and logged at most every 10 s, with the shedding amount.
    pub(crate) fn record_shed(&self, priority: Priority) {
        self.shed_log
            .shed(&self.label, priority.label(), || Some(self.amount()));
    }

    /// Names the shedder in logs and metric labels (`shedder="utilization:NAME"`; unnamed,
    /// `utilization`), to tell apart the shedders of one process (of a thread pool and of a
    /// connection pool, say).
    pub fn name(mut self, name: impl AsRef<str>) -> Self {
        self.label = format!("utilization:{}", name.as_ref());
        self
    }

    /// A shedder whose utilization is the number of requests in flight out of `capacity`
    /// (see [`InFlight`]). A [`UtilizationShedLayer`](super::UtilizationShedLayer) counts
    /// them; elsewhere, count them with [`in_flight`](Self::in_flight)`.start()`.
    pub fn in_flight(config: ShedConfig, capacity: usize) -> Self {
        UtilizationShedder::new(config, InFlight::new(capacity))
    }

    /// Reads the time from `clock` instead of the system's monotonic clock: a
    /// [`ManualClock`](crate::ManualClock) for tests and simulations.
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Seeds the random numbers the decisions draw, for reproducible runs (by default they
    /// are seeded from the standard library's random keys and the time).
    pub fn seed(mut self, seed: u64) -> Self {
        self.rng = SplitMix::seeded(seed);
        self
    }

    /// The configuration.
    pub fn config(&self) -> &ShedConfig {
        &self.config
    }

    /// The in-flight counter, for a shedder made by [`in_flight`](Self::in_flight) (or by
    /// [`new`](Self::new) with an [`InFlight`]).
    pub fn in_flight_counter(&self) -> Option<&InFlight> {
        self.in_flight.as_ref()
    }

    /// The current shedding amount, as of the last decision or update: from the
    /// [resting amount](ShedConfig::resting_amount) to 1; nothing is shed at or below 0.
    pub fn amount(&self) -> f64 {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .amount
    }

    /// The clock's time in microseconds: the manual clock's, or the monotonic time since the
    /// shedder was made.
    fn now_micros(&self) -> u64 {
        self.clock
            .manual_now()
            .unwrap_or_else(|| u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX))
    }

    /// Moves the shedding amount as `utilization` (clamped to [0, 1]; NaN counts as 0, and
    /// either is logged as a warning at most every 10 s: a percentage given as 45.0 reads as
    /// full utilization, and a source failing with NaN would never shed) says,
    /// for the time since the previous update — when the amount rises, at most a third of the
    /// [time before shedding](ShedConfig::time_before_shedding), so that it takes three
    /// samples of full utilization, however far apart, to reach the point where shedding
    /// starts; when it falls, the whole time — and returns the new amount. Decisions call this with the source's utilization; call it directly to drive
    /// the shedder with utilization samples of your own.
    pub fn update(&self, utilization: f64) -> f64 {
        let reading = utilization;
        let utilization = if utilization.is_nan() {
            0.0
        } else {
            utilization.clamp(0.0, 1.0)
        };
        if utilization != reading {
            self.reading_log.utilization_out_of_range(reading);
        }
        let derivative = self.config.derivative(utilization);
        // Stripe's sketch samples the utilization every 8 s, and waits 28 s: several samples,
        // each standing for its 8 s. Sampled as requests come instead, irregularly, one
        // sample of a quiet process must not stand for the whole wait (two blips 30 s apart
        // would then shed): one that raises the amount stands for at most a third of it. A
        // gap without requests is itself a sign of idleness, so one that lowers it stands
        // for the whole gap, as the sketch's samples through the gap would have: a process
        // back from a pause (traffic sent elsewhere while it shed) has come to rest, rather
        // than shedding on with nothing in flight.
        let max_elapsed = if derivative > 0.0 {
            self.config.time_before_shedding().as_secs_f64() / 3.0
        } else {
            f64::INFINITY
        };
        let resting = self.config.resting_amount();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        // Read under the lock, so that updates see the time in order.
        let now = self.now_micros();
        let elapsed = match state.last_update {
            Some(last) => (now.saturating_sub(last) as f64 / 1e6).min(max_elapsed),
            None => 0.0,
        };
        state.last_update = Some(now);
        let amount = state.amount + elapsed * derivative;
        state.amount = if amount.is_nan() {
            resting
        } else {
            amount.clamp(resting, 1.0)
        };
        state.amount
    }

    /// Whether to shed a request of class `priority`: updates the shedding amount from the
    /// utilization source, then sheds with the class's
    /// [probability](Priority::shed_probability). [`Critical`](Priority::Critical) requests
    /// are never shed (but still update the amount).
    pub fn should_shed(&self, priority: Priority) -> bool {
        self.should_shed_with(priority, self.rng.next_unit())
    }

    /// [`should_shed`](Self::should_shed) with the random number given: `random` in [0, 1),
    /// and the request is shed when `random` is below the class's probability (so a random
    /// of 1 or more, or NaN, never sheds).
    pub fn should_shed_with(&self, priority: Priority, random: f64) -> bool {
        let amount = self.update(self.source.utilization());
        random < priority.shed_probability(amount)
    }
}

#[cfg(test)]
mod tests;

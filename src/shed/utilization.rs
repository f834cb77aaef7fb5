//! The worker-utilization load shedder: how much traffic to shed, from how busy the process
//! is, moving slowly in both directions.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::clock::{system_micros, Clock};
use crate::key::RequestView;

/// How important a request is. The shedder throws out the least important classes first and
/// never sheds [`Critical`](Priority::Critical) traffic.
///
/// The variants are declared from most to least important, and the derived ordering follows
/// the declaration: `Critical < High < Normal < Low`.
///
/// At Stripe, for instance, the classes were: critical methods (creating charges), `POST`s,
/// `GET`s, and test-mode traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[non_exhaustive]
pub enum Priority {
    /// Never shed by this shedder: the traffic the service exists for.
    Critical,
    /// Shed last, once the shedding amount is above 2/3 (e.g. writes).
    High,
    /// Shed once the shedding amount is above 1/3 (e.g. reads). The default.
    #[default]
    Normal,
    /// Shed first (e.g. test-mode traffic, analytics, prefetches).
    Low,
}

impl Priority {
    /// A classifier by HTTP method: `GET`, `HEAD` and `OPTIONS` are [`Normal`](Self::Normal),
    /// every other method [`High`](Self::High). Since gRPC calls are `POST`s, they are all
    /// `High` under this classifier.
    ///
    /// Pass it to [`UtilizationShedLayer::classify`](super::UtilizationShedLayer::classify).
    pub fn by_method(req: &RequestView<'_>) -> Priority {
        match *req.method {
            http::Method::GET | http::Method::HEAD | http::Method::OPTIONS => Priority::Normal,
            _ => Priority::High,
        }
    }

    /// The probability that a request of this class is shed when the shedding amount is
    /// `amount` (0 = shed nothing, 1 = shed everything sheddable).
    ///
    /// The amount is spread over the three sheddable classes, least important first, each
    /// taking a third of the range:
    ///
    /// | amount       | `Low`            | `Normal`               | `High`                 |
    /// |--------------|------------------|------------------------|------------------------|
    /// | ≤ 0          | 0                | 0                      | 0                      |
    /// | (0, 1/3]     | `3·amount`       | 0                      | 0                      |
    /// | (1/3, 2/3]   | 1                | `3·(amount − 1/3)`     | 0                      |
    /// | (2/3, 1]     | 1                | 1                      | `3·(amount − 2/3)`     |
    ///
    /// [`Critical`](Self::Critical) is never shed. This is our reading of "start throwing out
    /// your least important requests with higher and higher probability; after a period of
    /// time move on to more requests until you are throwing out everything except the most
    /// critical traffic". The three probabilities add up to `3·amount`, so a stream mixing
    /// the three sheddable classes in equal parts loses a fraction `amount` of its requests,
    /// as with a single drop chance of `amount`.
    pub fn shed_probability(self, amount: f64) -> f64 {
        // How many sheddable classes are less important than this one.
        let before = match self {
            Priority::Critical => return 0.0,
            Priority::Low => 0.0,
            Priority::Normal => 1.0,
            Priority::High => 2.0,
        };
        let p = 3.0 * amount - before;
        if p > 0.0 {
            p.min(1.0)
        } else {
            // Also NaN.
            0.0
        }
    }
}

/// A [`ShedConfig`] that cannot work.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ShedConfigError {
    /// A utilization threshold is not in (0, 1] (or is not a number).
    ThresholdOutOfRange {
        /// Which threshold: `"end_of_good_utilization"` or `"start_of_bad_utilization"`.
        which: &'static str,
        /// The value given.
        value: f64,
    },
    /// The end of good utilization is not below the start of bad utilization.
    ThresholdsNotOrdered {
        /// The end of good utilization given.
        end_of_good: f64,
        /// The start of bad utilization given.
        start_of_bad: f64,
    },
    /// A duration is zero.
    ZeroDuration {
        /// Which duration: `"time_before_shedding"` or `"time_to_shed_all"`.
        which: &'static str,
    },
}

impl fmt::Display for ShedConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShedConfigError::ThresholdOutOfRange { which, value } => {
                write!(f, "{which} must be in (0, 1], not {value}")
            }
            ShedConfigError::ThresholdsNotOrdered {
                end_of_good,
                start_of_bad,
            } => write!(
                f,
                "end_of_good_utilization ({end_of_good}) must be below \
                 start_of_bad_utilization ({start_of_bad})"
            ),
            ShedConfigError::ZeroDuration { which } => write!(f, "{which} must not be zero"),
        }
    }
}

impl std::error::Error for ShedConfigError {}

/// The shape of a [`UtilizationShedder`]'s response to load. Build one with
/// [`ShedConfig::builder`]; [`ShedConfig::default`] holds the values Stripe published.
///
/// * Below the **end of good utilization** the shedding amount falls, faster the idler the
///   process is; between it and the **start of bad utilization** (a dead zone) the amount
///   stays where it is; above, it rises, faster the busier the process is.
/// * At full utilization the amount rises by 1 every **time to shed all**; at zero
///   utilization it falls at the same rate.
/// * At rest the amount sits at `−(time before shedding / time to shed all)`, so a process
///   fully busy from rest sheds nothing for the **time before shedding**, then sheds more and
///   more for the time to shed all, and recovers as gradually.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShedConfig {
    end_of_good: f64,
    start_of_bad: f64,
    before_shedding: Duration,
    to_shed_all: Duration,
}

impl Default for ShedConfig {
    /// End of good utilization 0.7, start of bad utilization 0.8, 28 s before shedding
    /// starts (with a utilization sampled every 8 s, that guarantees 3 samples), 120 s to
    /// shed all traffic.
    fn default() -> Self {
        ShedConfig {
            end_of_good: 0.7,
            start_of_bad: 0.8,
            before_shedding: Duration::from_secs(28),
            to_shed_all: Duration::from_secs(120),
        }
    }
}

impl ShedConfig {
    /// A builder starting from the [default](ShedConfig::default) values.
    pub fn builder() -> ShedConfigBuilder {
        ShedConfigBuilder {
            config: ShedConfig::default(),
        }
    }

    /// Below this utilization the shedding amount falls.
    pub fn end_of_good_utilization(&self) -> f64 {
        self.end_of_good
    }

    /// From this utilization on the shedding amount rises.
    pub fn start_of_bad_utilization(&self) -> f64 {
        self.start_of_bad
    }

    /// How long full utilization must last, from rest, before anything is shed.
    pub fn time_before_shedding(&self) -> Duration {
        self.before_shedding
    }

    /// How long full utilization takes to move the shedding amount from 0 to 1.
    pub fn time_to_shed_all(&self) -> Duration {
        self.to_shed_all
    }

    /// The lowest shedding amount, where an idle process rests:
    /// `−(time before shedding / time to shed all)`, −28/120 by default.
    ///
    /// Stripe's published Ruby computes this with integer division, which gives 0 and makes
    /// shedding start at once; this is the real division the comments describe.
    pub fn resting_amount(&self) -> f64 {
        -(self.before_shedding.as_secs_f64() / self.to_shed_all.as_secs_f64())
    }

    /// How fast the shedding amount moves at `utilization` (in [0, 1]), per second.
    fn derivative(&self, utilization: f64) -> f64 {
        let direction = if utilization < self.end_of_good {
            // Linearly reduce shedding: −1 when idle, 0 at the end of good utilization.
            utilization / self.end_of_good - 1.0
        } else if utilization < self.start_of_bad {
            // The dead zone.
            0.0
        } else if self.start_of_bad >= 1.0 {
            // Shedding starts only at full utilization: rise at full speed there.
            1.0
        } else {
            (utilization - self.start_of_bad) / (1.0 - self.start_of_bad)
        };
        direction.clamp(-1.0, 1.0) / self.to_shed_all.as_secs_f64()
    }
}

/// Builds a [`ShedConfig`]; [`build`](Self::build) checks it.
#[derive(Debug, Clone)]
pub struct ShedConfigBuilder {
    config: ShedConfig,
}

impl ShedConfigBuilder {
    /// Below this utilization the shedding amount falls (default 0.7). In (0, 1], below the
    /// start of bad utilization.
    pub fn end_of_good_utilization(mut self, utilization: f64) -> Self {
        self.config.end_of_good = utilization;
        self
    }

    /// From this utilization on the shedding amount rises (default 0.8). In (0, 1]; at 1,
    /// only full utilization sheds (at full speed).
    pub fn start_of_bad_utilization(mut self, utilization: f64) -> Self {
        self.config.start_of_bad = utilization;
        self
    }

    /// How long full utilization must last, from rest, before anything is shed (default
    /// 28 s). Not zero.
    ///
    /// It also caps the time one update integrates: after a gap with no requests, the next
    /// one moves the amount at most as far as this much time would.
    pub fn time_before_shedding(mut self, time: Duration) -> Self {
        self.config.before_shedding = time;
        self
    }

    /// How long full utilization takes to move the shedding amount from 0 to 1, i.e. from
    /// shedding nothing to shedding everything but critical traffic (default 120 s). Not
    /// zero.
    pub fn time_to_shed_all(mut self, time: Duration) -> Self {
        self.config.to_shed_all = time;
        self
    }

    /// The configuration, or what is wrong with it.
    pub fn build(self) -> Result<ShedConfig, ShedConfigError> {
        let c = self.config;
        for (which, value) in [
            ("end_of_good_utilization", c.end_of_good),
            ("start_of_bad_utilization", c.start_of_bad),
        ] {
            if !(value > 0.0 && value <= 1.0) {
                return Err(ShedConfigError::ThresholdOutOfRange { which, value });
            }
        }
        if c.end_of_good >= c.start_of_bad {
            return Err(ShedConfigError::ThresholdsNotOrdered {
                end_of_good: c.end_of_good,
                start_of_bad: c.start_of_bad,
            });
        }
        for (which, time) in [
            ("time_before_shedding", c.before_shedding),
            ("time_to_shed_all", c.to_shed_all),
        ] {
            if time.is_zero() {
                return Err(ShedConfigError::ZeroDuration { which });
            }
        }
        Ok(c)
    }
}

/// How busy the process is: 0 = idle, 1 = every worker busy.
///
/// How to measure this depends on the infrastructure (busy worker processes, in-flight
/// requests against a concurrency limit, a thread pool's queue). [`InFlight`] counts the
/// requests in flight through a [`UtilizationShedLayer`](super::UtilizationShedLayer);
/// closures `Fn() -> f64` work too.
///
/// The shedder clamps what it reads to [0, 1] and takes NaN as 0. It reads the source on
/// every decision, so a source should be cheap (read an atomic a sampler updates, rather
/// than sample on the spot).
pub trait UtilizationSource: Send + Sync {
    /// The current utilization, from 0 to 1.
    fn utilization(&self) -> f64;
}

impl<F> UtilizationSource for F
where
    F: Fn() -> f64 + Send + Sync,
{
    fn utilization(&self) -> f64 {
        self()
    }
}

/// The requests in flight against a capacity: `utilization = in flight / capacity`.
///
/// A cheap handle: clones share the count. A [`UtilizationShedder::in_flight`] shedder under
/// a [`UtilizationShedLayer`](super::UtilizationShedLayer) is counted by the layer; elsewhere,
/// hold an [`InFlight::start`] guard for the duration of each request.
#[derive(Debug, Clone)]
pub struct InFlight {
    count: Arc<AtomicUsize>,
    capacity: usize,
}

impl InFlight {
    /// No requests in flight yet, out of `capacity` (a capacity of 0 counts as 1).
    pub fn new(capacity: usize) -> InFlight {
        InFlight {
            count: Arc::new(AtomicUsize::new(0)),
            capacity: capacity.max(1),
        }
    }

    /// Counts one more request in flight until the guard is dropped.
    pub fn start(&self) -> InFlightGuard {
        self.count.fetch_add(1, Ordering::Relaxed);
        InFlightGuard {
            count: self.count.clone(),
        }
    }

    /// How many requests are in flight.
    pub fn current(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// The capacity.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

impl UtilizationSource for InFlight {
    fn utilization(&self) -> f64 {
        self.current() as f64 / self.capacity as f64
    }
}

/// One request in flight, from [`InFlight::start`]; the count goes down when it is dropped.
#[derive(Debug)]
pub struct InFlightGuard {
    count: Arc<AtomicUsize>,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        // Never below zero, whatever happens.
        let _ = self
            .count
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }
}

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
}

impl fmt::Debug for UtilizationShedder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UtilizationShedder")
            .field("config", &self.config)
            .field("in_flight", &self.in_flight)
            .field("clock", &self.clock)
            .field("amount", &self.amount())
            .finish_non_exhaustive()
    }
}

impl UtilizationShedder {
    /// A shedder reading the utilization from `source`, at rest (shedding nothing).
    pub fn new(config: ShedConfig, source: impl UtilizationSource + 'static) -> Self {
        UtilizationShedder {
            config,
            source: Box::new(source),
            in_flight: None,
            clock: Clock::Real,
            epoch: Instant::now(),
            rng: SplitMix::from_entropy(),
            state: Mutex::new(State {
                amount: config.resting_amount(),
                last_update: None,
            }),
        }
    }

    /// A shedder whose utilization is the number of requests in flight out of `capacity`
    /// (see [`InFlight`]). A [`UtilizationShedLayer`](super::UtilizationShedLayer) counts
    /// them; elsewhere, count them with [`in_flight`](Self::in_flight)`.start()`.
    pub fn in_flight(config: ShedConfig, capacity: usize) -> Self {
        let counter = InFlight::new(capacity);
        let mut shedder = UtilizationShedder::new(config, counter.clone());
        shedder.in_flight = Some(counter);
        shedder
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

    /// The in-flight counter, for a shedder made by [`in_flight`](Self::in_flight).
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

    /// Moves the shedding amount as `utilization` (clamped to [0, 1]; NaN counts as 0) says,
    /// for the time since the previous update (at most the
    /// [time before shedding](ShedConfig::time_before_shedding)), and returns the new
    /// amount. Decisions call this with the source's utilization; call it directly to drive
    /// the shedder with utilization samples of your own.
    pub fn update(&self, utilization: f64) -> f64 {
        let utilization = if utilization.is_nan() {
            0.0
        } else {
            utilization.clamp(0.0, 1.0)
        };
        let derivative = self.config.derivative(utilization);
        let max_elapsed = self.config.before_shedding.as_secs_f64();
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
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    const SECOND: Duration = Duration::from_secs(1);

    /// A shedder reading a utilization the test sets, on a fake clock.
    struct Rig {
        clock: ManualClock,
        utilization: Arc<AtomicU64>,
        shedder: UtilizationShedder,
    }

    impl Rig {
        fn new(seed: u64) -> Rig {
            let clock = ManualClock::new(1_000_000_000);
            let utilization = Arc::new(AtomicU64::new(0f64.to_bits()));
            let source = {
                let u = utilization.clone();
                move || f64::from_bits(u.load(Ordering::Relaxed))
            };
            let shedder = UtilizationShedder::new(ShedConfig::default(), source)
                .clock(Clock::Manual(clock.clone()))
                .seed(seed);
            Rig {
                clock,
                utilization,
                shedder,
            }
        }

        fn set(&self, utilization: f64) {
            self.utilization
                .store(utilization.to_bits(), Ordering::Relaxed);
        }

        /// One decision, then one second passes.
        fn tick(&self, priority: Priority) -> bool {
            let shed = self.shedder.should_shed(priority);
            self.clock.advance(SECOND);
            shed
        }
    }

    const SHEDDABLE: [Priority; 3] = [Priority::Low, Priority::Normal, Priority::High];
    const ALL: [Priority; 4] = [
        Priority::Critical,
        Priority::High,
        Priority::Normal,
        Priority::Low,
    ];

    #[test]
    fn defaults_are_the_published_values() {
        let c = ShedConfig::default();
        assert_eq!(c.end_of_good_utilization(), 0.7);
        assert_eq!(c.start_of_bad_utilization(), 0.8);
        assert_eq!(c.time_before_shedding(), Duration::from_secs(28));
        assert_eq!(c.time_to_shed_all(), Duration::from_secs(120));
        assert!((c.resting_amount() + 28.0 / 120.0).abs() < 1e-12);
        assert_eq!(ShedConfig::builder().build(), Ok(c));
    }

    #[test]
    fn derivative_follows_the_utilization() {
        let c = ShedConfig::default();
        let per_s = 1.0 / 120.0;
        assert!((c.derivative(0.0) + per_s).abs() < 1e-12);
        assert!((c.derivative(0.35) + 0.5 * per_s).abs() < 1e-12);
        assert_eq!(c.derivative(0.7), 0.0);
        assert_eq!(c.derivative(0.75), 0.0);
        assert!(c.derivative(0.8).abs() < 1e-12);
        assert!((c.derivative(0.9) - 0.5 * per_s).abs() < 1e-12);
        assert!((c.derivative(1.0) - per_s).abs() < 1e-12);
        let strict = ShedConfig::builder()
            .start_of_bad_utilization(1.0)
            .build()
            .unwrap();
        assert!((strict.derivative(1.0) - per_s).abs() < 1e-12);
        assert_eq!(strict.derivative(0.99), 0.0);
    }

    #[test]
    fn overload_timeline() {
        let rig = Rig::new(1);
        rig.set(1.0);
        // Nothing is shed for the first 28 s of full overload.
        for second in 0..=28 {
            for _ in 0..10 {
                for p in ALL {
                    assert!(!rig.shedder.should_shed(p), "{p:?} shed at {second} s");
                }
            }
            assert!(rig.shedder.amount() <= 1e-9, "at {second} s");
            rig.clock.advance(SECOND);
        }
        // Then the amount rises, Low first, and reaches 1 after 28 + 120 s.
        let mut first_shed = [None; 3];
        for second in 29..=150 {
            let amount = rig.shedder.update(1.0);
            for (i, p) in SHEDDABLE.into_iter().enumerate() {
                if first_shed[i].is_none() && p.shed_probability(amount) > 1e-9 {
                    first_shed[i] = Some(second);
                }
            }
            assert!(!rig.shedder.should_shed(Priority::Critical));
            rig.clock.advance(SECOND);
        }
        assert_eq!(first_shed, [Some(29), Some(69), Some(109)]);
        assert_eq!(rig.shedder.amount(), 1.0);
        for _ in 0..100 {
            for p in SHEDDABLE {
                assert!(rig.shedder.should_shed(p), "{p:?} admitted at amount 1");
            }
            assert!(!rig.shedder.should_shed(Priority::Critical));
        }

        // Recovery is gradual: 1/120 per second at zero utilization.
        rig.set(0.0);
        for _ in 0..10 {
            rig.tick(Priority::Critical);
        }
        let amount = rig.shedder.update(0.0);
        assert!((amount - (1.0 - 10.0 / 120.0)).abs() < 1e-9, "{amount}");
        assert!(rig.shedder.should_shed_with(Priority::Low, 0.999));
        assert!(rig.shedder.should_shed_with(Priority::High, 0.5));
        // After 120 s, nothing is shed any more, and it goes on falling to rest.
        for _ in 10..120 {
            rig.tick(Priority::Normal);
        }
        assert!(rig.shedder.update(0.0) <= 1e-9);
        for p in ALL {
            assert!(!rig.shedder.should_shed_with(p, 1e-6));
        }
        for _ in 0..100 {
            rig.tick(Priority::Low);
        }
        assert_eq!(rig.shedder.amount(), ShedConfig::default().resting_amount());
    }

    #[test]
    fn dead_zone_holds_the_amount() {
        let rig = Rig::new(2);
        rig.set(1.0);
        for _ in 0..88 {
            rig.tick(Priority::Critical);
        }
        let before = rig.shedder.update(1.0);
        assert!((before - 60.0 / 120.0).abs() < 1e-9, "{before}");
        rig.set(0.75);
        for _ in 0..1000 {
            rig.tick(Priority::Normal);
        }
        assert_eq!(rig.shedder.amount(), before);
        // At the dead zone's edges too.
        rig.set(0.7);
        rig.tick(Priority::Normal);
        assert_eq!(rig.shedder.amount(), before);
        rig.set(0.8);
        rig.tick(Priority::Normal);
        assert_eq!(rig.shedder.amount(), before);
    }

    #[test]
    fn elapsed_time_is_capped_and_clock_steps_back_are_ignored() {
        let rig = Rig::new(3);
        rig.shedder.update(1.0);
        // An hour without requests counts as 28 s: from rest to the verge of shedding.
        rig.clock.advance(Duration::from_secs(3600));
        assert!(rig.shedder.update(1.0).abs() < 1e-9);
        rig.clock.set_micros(rig.clock.now_micros() - 10_000_000);
        assert!(rig.shedder.update(1.0).abs() < 1e-9);
        rig.clock.advance(Duration::from_secs(12));
        assert!((rig.shedder.update(1.0) - 0.1).abs() < 1e-9);
    }

    #[test]
    fn odd_utilizations_are_clamped() {
        let rig = Rig::new(4);
        rig.shedder.update(0.0);
        rig.clock.advance(Duration::from_secs(12));
        // NaN counts as idle, and idle rests.
        assert_eq!(
            rig.shedder.update(f64::NAN),
            rig.shedder.config().resting_amount()
        );
        rig.clock.advance(Duration::from_secs(28));
        assert!(rig.shedder.update(f64::INFINITY).abs() < 1e-9);
        rig.clock.advance(Duration::from_secs(12));
        assert!((rig.shedder.update(7.0) - 0.1).abs() < 1e-9);
        rig.clock.advance(Duration::from_secs(12));
        assert!(rig.shedder.update(-3.0).abs() < 1e-9);
    }

    #[test]
    fn class_probabilities() {
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        // amount 0.1: Low with probability 0.3, nothing else.
        assert!(close(Priority::Low.shed_probability(0.1), 0.3));
        assert_eq!(Priority::Normal.shed_probability(0.1), 0.0);
        assert_eq!(Priority::High.shed_probability(0.1), 0.0);
        // amount 0.5: all Low, Normal with probability 0.5.
        assert_eq!(Priority::Low.shed_probability(0.5), 1.0);
        assert!(close(Priority::Normal.shed_probability(0.5), 0.5));
        assert_eq!(Priority::High.shed_probability(0.5), 0.0);
        // amount 0.9: all Low and Normal, High with probability 0.7.
        assert_eq!(Priority::Low.shed_probability(0.9), 1.0);
        assert_eq!(Priority::Normal.shed_probability(0.9), 1.0);
        assert!(close(Priority::High.shed_probability(0.9), 0.7));
        for amount in [-0.2, 0.0, 0.1, 0.5, 0.9, 1.0, f64::NAN] {
            assert_eq!(Priority::Critical.shed_probability(amount), 0.0);
        }
        for p in ALL {
            assert_eq!(p.shed_probability(-0.2), 0.0);
            assert_eq!(p.shed_probability(f64::NAN), 0.0);
        }
    }

    /// A shedder held at `amount` (reached on a fake clock at full utilization), deciding
    /// with the random numbers given.
    fn at_amount(amount: f64) -> UtilizationShedder {
        let clock = ManualClock::new(0);
        let shedder = UtilizationShedder::new(ShedConfig::default(), || 0.75)
            .clock(Clock::Manual(clock.clone()));
        shedder.update(1.0);
        // 28 s to reach 0, then 120 s per unit.
        clock.advance(Duration::from_secs(28));
        shedder.update(1.0);
        // In steps: one update integrates at most 28 s.
        for _ in 0..10 {
            clock.advance(Duration::from_secs_f64(12.0 * amount));
            shedder.update(1.0);
        }
        let reached = shedder.amount();
        assert!((reached - amount).abs() < 1e-6, "{reached}");
        shedder
    }

    #[test]
    fn decisions_with_injected_random_numbers() {
        // amount 0.1: Low shed below 0.3.
        let s = at_amount(0.1);
        assert!(s.should_shed_with(Priority::Low, 0.0));
        assert!(s.should_shed_with(Priority::Low, 0.29));
        assert!(!s.should_shed_with(Priority::Low, 0.31));
        assert!(!s.should_shed_with(Priority::Normal, 0.0));
        assert!(!s.should_shed_with(Priority::High, 0.0));
        assert!(!s.should_shed_with(Priority::Critical, 0.0));
        // amount 0.5: Low always, Normal below 0.5.
        let s = at_amount(0.5);
        assert!(s.should_shed_with(Priority::Low, 0.999_999));
        assert!(s.should_shed_with(Priority::Normal, 0.49));
        assert!(!s.should_shed_with(Priority::Normal, 0.51));
        assert!(!s.should_shed_with(Priority::High, 0.0));
        assert!(!s.should_shed_with(Priority::Critical, 0.0));
        // amount 0.9: Low and Normal always, High below 0.7.
        let s = at_amount(0.9);
        assert!(s.should_shed_with(Priority::Low, 0.999_999));
        assert!(s.should_shed_with(Priority::Normal, 0.999_999));
        assert!(s.should_shed_with(Priority::High, 0.69));
        assert!(!s.should_shed_with(Priority::High, 0.71));
        assert!(!s.should_shed_with(Priority::Critical, 0.0));
        // Out-of-range random numbers never shed.
        assert!(!s.should_shed_with(Priority::Low, 1.0));
        assert!(!s.should_shed_with(Priority::Low, f64::NAN));
    }

    #[test]
    fn seeded_random_decisions_match_the_probabilities() {
        let s = at_amount(0.5).seed(7);
        let n = 20_000;
        let shed = (0..n).filter(|_| s.should_shed(Priority::Normal)).count();
        // p = 0.5: standard deviation ~71; allow 5.
        assert!((9_650..=10_350).contains(&shed), "{shed}");
        assert!((0..1000).all(|_| s.should_shed(Priority::Low)));
        assert!((0..1000).all(|_| !s.should_shed(Priority::High)));
    }

    /// The published test: idle, then 0..=(28 + 120) seconds of full utilization with one
    /// request per second ("Should be ~60" dropped), then everything is shed.
    ///
    /// With one class, `Normal` (the layer's default), the expected count is exactly that of
    /// the published single drop chance: the amount after `k` seconds is `(k − 28)/120`,
    /// `Normal` is shed with probability `clamp(3·amount − 1, 0, 1)`, which is 0 up to 68 s,
    /// rises linearly to 1 at 108 s, and stays 1 to 148 s: 20.5 + 40 = 60.5 expected, with
    /// a variance of Σ p(1 − p) ≈ 6.66 (standard deviation 2.58).
    fn published_run(seed: u64) -> usize {
        let rig = Rig::new(seed);
        rig.set(0.0);
        for _ in 0..=1000 {
            assert!(!rig.shedder.should_shed(Priority::Normal));
        }
        rig.set(1.0);
        let shed = (0..=28 + 120)
            .filter(|_| rig.tick(Priority::Normal))
            .count();
        // Should be shedding all (sheddable) traffic.
        assert!(rig.shedder.should_shed(Priority::Normal));
        shed
    }

    #[test]
    fn published_test_sheds_about_sixty() {
        // The expectation, from the probabilities themselves.
        let expected: f64 = (0..=148)
            .map(|k| {
                let amount = ((k as f64 - 28.0) / 120.0).clamp(-28.0 / 120.0, 1.0);
                Priority::Normal.shed_probability(amount)
            })
            .sum();
        assert!((expected - 60.5).abs() < 1e-6, "{expected}");
        // One run: within 4 standard deviations.
        let shed = published_run(42);
        assert!((50..=71).contains(&shed), "{shed}");
        // 200 runs: the mean's standard deviation is 0.18.
        let runs = 200;
        let total: usize = (0..runs).map(published_run).sum();
        let mean = total as f64 / runs as f64;
        assert!((mean - 60.5).abs() < 0.75, "{mean}");
    }

    #[test]
    fn in_flight_counts_guards() {
        let f = InFlight::new(4);
        assert_eq!(f.utilization(), 0.0);
        let a = f.start();
        let b = f.clone().start();
        assert_eq!(f.current(), 2);
        assert_eq!(f.utilization(), 0.5);
        drop(a);
        assert_eq!(f.current(), 1);
        drop(b);
        assert_eq!(f.current(), 0);
        let zero = InFlight::new(0);
        assert_eq!(zero.capacity(), 1);
        let _g = zero.start();
        assert_eq!(zero.utilization(), 1.0);
        let shedder = UtilizationShedder::in_flight(ShedConfig::default(), 10);
        let counter = shedder.in_flight_counter().unwrap();
        assert_eq!(counter.capacity(), 10);
        assert_eq!(counter.current(), 0);
    }

    #[test]
    fn config_validation() {
        let b = ShedConfig::builder;
        assert_eq!(
            b().end_of_good_utilization(0.0).build(),
            Err(ShedConfigError::ThresholdOutOfRange {
                which: "end_of_good_utilization",
                value: 0.0
            })
        );
        assert!(matches!(
            b().end_of_good_utilization(f64::NAN).build(),
            Err(ShedConfigError::ThresholdOutOfRange {
                which: "end_of_good_utilization",
                ..
            })
        ));
        assert_eq!(
            b().start_of_bad_utilization(1.5).build(),
            Err(ShedConfigError::ThresholdOutOfRange {
                which: "start_of_bad_utilization",
                value: 1.5
            })
        );
        assert_eq!(
            b().start_of_bad_utilization(-0.1).build(),
            Err(ShedConfigError::ThresholdOutOfRange {
                which: "start_of_bad_utilization",
                value: -0.1
            })
        );
        assert_eq!(
            b().end_of_good_utilization(0.8).build(),
            Err(ShedConfigError::ThresholdsNotOrdered {
                end_of_good: 0.8,
                start_of_bad: 0.8
            })
        );
        assert_eq!(
            b().end_of_good_utilization(0.9).build(),
            Err(ShedConfigError::ThresholdsNotOrdered {
                end_of_good: 0.9,
                start_of_bad: 0.8
            })
        );
        assert_eq!(
            b().time_before_shedding(Duration::ZERO).build(),
            Err(ShedConfigError::ZeroDuration {
                which: "time_before_shedding"
            })
        );
        assert_eq!(
            b().time_to_shed_all(Duration::ZERO).build(),
            Err(ShedConfigError::ZeroDuration {
                which: "time_to_shed_all"
            })
        );
        let custom = b()
            .end_of_good_utilization(0.5)
            .start_of_bad_utilization(1.0)
            .time_before_shedding(Duration::from_secs(10))
            .time_to_shed_all(Duration::from_secs(40))
            .build()
            .unwrap();
        assert_eq!(custom.resting_amount(), -0.25);
        let message = b()
            .end_of_good_utilization(0.9)
            .build()
            .unwrap_err()
            .to_string();
        assert!(message.contains("must be below"), "{message}");
    }

    #[test]
    fn by_method() {
        let view = |method: http::Method| {
            let req = http::Request::builder().method(method).body(()).unwrap();
            Priority::by_method(&RequestView::of(&req))
        };
        assert_eq!(view(http::Method::GET), Priority::Normal);
        assert_eq!(view(http::Method::HEAD), Priority::Normal);
        assert_eq!(view(http::Method::OPTIONS), Priority::Normal);
        assert_eq!(view(http::Method::POST), Priority::High);
        assert_eq!(view(http::Method::DELETE), Priority::High);
        assert!(Priority::Critical < Priority::Low);
        assert_eq!(Priority::default(), Priority::Normal);
    }
}

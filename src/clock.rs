//! Where the stores and the load shedders read the time.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Where a store (or a [load shedder](crate::shed::UtilizationShedder)) reads the time.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub enum Clock {
    /// The real clock: Redis `TIME` for the Redis store (one clock for the whole fleet), the
    /// system clock for the memory store (read through the processor's time-stamp counter, which
    /// reads faster, and set from the system clock once a second), a monotonic clock for a load
    /// shedder.
    #[default]
    Real,
    /// A clock the caller sets: for tests and replays only.
    Manual(ManualClock),
}

impl Clock {
    /// Microseconds since the Unix epoch, or `None` when the reader should use its own clock.
    pub(crate) fn manual_now(&self) -> Option<u64> {
        match self {
            Clock::Real => None,
            Clock::Manual(m) => Some(m.now_micros()),
        }
    }
}

/// A clock that moves only when told to, shared by its clones.
#[derive(Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock reading `micros` microseconds since the Unix epoch.
    pub fn new(micros: u64) -> ManualClock {
        ManualClock(Arc::new(AtomicU64::new(micros)))
    }

    /// A clock reading the current system time.
    pub fn starting_now() -> ManualClock {
        ManualClock::new(system_micros())
    }

    /// The time, in microseconds since the Unix epoch.
    pub fn now_micros(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    /// Sets the time, in microseconds since the Unix epoch.
    pub fn set_micros(&self, micros: u64) {
        self.0.store(micros, Ordering::SeqCst);
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_micros() as u64, Ordering::SeqCst);
    }
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ManualClock")
            .field(&self.now_micros())
            .finish()
    }
}

/// The system time in microseconds since the Unix epoch (0 before it).
pub(crate) fn system_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// The memory store's real clock: the system clock, read through the processor's time-stamp
/// counter (`quanta`, which falls back to the operating system's monotonic clock where the
/// counter is not reliable) and set from the system clock again once a second.
///
/// A check reads the clock once; the system clock costs a call into the vDSO (a few hundred
/// instructions on a virtual machine), the counter a few dozen. Between two settings the
/// counter's calibration drifts from the system clock by some parts in 100,000 (13 µs a
/// second on the machine the benches ran on), so the clock moves by that much when it is set
/// again, back or forth, as the system clock itself may (the algorithms take a clock that
/// goes back). Setting it keeps windows aligned to the Unix epoch aligned, however long the
/// store lives.
#[derive(Debug)]
pub(crate) struct CounterClock {
    counter: quanta::Clock,
    /// The counter's reading when the clock was made.
    start: u64,
    /// The system time (µs since the Unix epoch) less the counter's µs since `start`, as of
    /// the last setting.
    offset: AtomicU64,
    /// The counter's µs since `start` from which the clock is set again.
    next_setting: AtomicU64,
}

/// How often the counter clock is set from the system clock (µs).
const SETTING_EVERY_US: u64 = 1_000_000;

impl CounterClock {
    pub(crate) fn new() -> CounterClock {
        let counter = quanta::Clock::new();
        let start = counter.raw();
        CounterClock {
            counter,
            start,
            offset: AtomicU64::new(system_micros()),
            next_setting: AtomicU64::new(SETTING_EVERY_US),
        }
    }

    /// Microseconds since the Unix epoch.
    pub(crate) fn now_micros(&self) -> u64 {
        let since = self.counter.delta_as_nanos(self.start, self.counter.raw()) / 1_000;
        if since < self.next_setting.load(Ordering::Relaxed) {
            return self.offset.load(Ordering::Relaxed) + since;
        }
        // (two threads setting it at once store the same figures, to within their reads)
        let now = system_micros();
        self.offset
            .store(now.saturating_sub(since), Ordering::Relaxed);
        self.next_setting
            .store(since + SETTING_EVERY_US, Ordering::Relaxed);
        now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_counter_clock_follows_the_system_clock() {
        let clock = CounterClock::new();
        let mut last = clock.now_micros();
        // across a setting (every second)
        for _ in 0..12 {
            std::thread::sleep(Duration::from_millis(100));
            // the system clock read on both sides, so that the thread being preempted between
            // two readings cannot fail the test
            let (before, now, after) = (system_micros(), clock.now_micros(), system_micros());
            // (a setting may move it back by some µs)
            assert!(now >= last + 99_000, "{now} after {last}");
            // within 2 ms of the system clock
            assert!(
                before.saturating_sub(2_000) <= now && now <= after + 2_000,
                "{now} vs {before}..{after}"
            );
            last = now;
        }
        assert!(clock.next_setting.load(Ordering::Relaxed) > SETTING_EVERY_US);
    }
}

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
    /// system clock for the memory store (read when the store is made, then carried on by the
    /// processor's time-stamp counter, which reads faster and never steps back), a monotonic
    /// clock for a load shedder.
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

/// The memory store's real clock: the system time read when the store is made, carried on by
/// a monotonic clock that reads the processor's time-stamp counter (`quanta`, which falls
/// back to the operating system's monotonic clock where the counter is not reliable).
///
/// A check reads the clock once; the system clock costs a call into the vDSO (a few hundred
/// instructions on a virtual machine), the counter a few dozen. Being monotonic, it never
/// steps back when the system clock is set. It follows the system clock as closely as the
/// counter's calibration does, which is all the memory store needs: its times are compared
/// only with each other, and windows aligned to the Unix epoch stay aligned to within that
/// drift.
#[derive(Debug, Clone)]
pub(crate) struct CounterClock {
    counter: quanta::Clock,
    /// The counter's reading and the system time (µs since the Unix epoch) at the start.
    start: (u64, u64),
}

impl CounterClock {
    pub(crate) fn new() -> CounterClock {
        let counter = quanta::Clock::new();
        let start = (counter.raw(), system_micros());
        CounterClock { counter, start }
    }

    /// Microseconds since the Unix epoch.
    pub(crate) fn now_micros(&self) -> u64 {
        let (raw, micros) = self.start;
        micros + self.counter.delta_as_nanos(raw, self.counter.raw()) / 1_000
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_counter_clock_follows_the_system_clock() {
        let clock = CounterClock::new();
        let mut last = clock.now_micros();
        for _ in 0..5 {
            std::thread::sleep(Duration::from_millis(20));
            let (now, system) = (clock.now_micros(), system_micros());
            assert!(now >= last + 20_000, "{now} after {last}");
            // within 2 ms of the system clock, 100 ms after it was read
            assert!(now.abs_diff(system) < 2_000, "{now} vs {system}");
            last = now;
        }
    }
}

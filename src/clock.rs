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
    /// system clock for the memory store, a monotonic clock for a load shedder.
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

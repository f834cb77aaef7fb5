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
    /// reads faster, and set from the system clock once a second; a step of the system clock
    /// back is caught up with by at most 10 ms a setting, rather than at once), a monotonic
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
///
/// It holds times up to [`ManualClock::MAX_MICROS`] (2^53 µs, in the year 2255): the latest
/// time the Redis scripts, whose numbers are doubles, hold to the microsecond. A later time
/// given to it is held as that one, so that no store computes past it.
#[derive(Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// The latest time the clock holds, in microseconds since the Unix epoch: 2^53.
    pub const MAX_MICROS: u64 = 1 << 53;

    /// A clock reading `micros` microseconds since the Unix epoch (at most
    /// [`MAX_MICROS`](Self::MAX_MICROS)).
    pub fn new(micros: u64) -> ManualClock {
        ManualClock(Arc::new(AtomicU64::new(micros.min(Self::MAX_MICROS))))
    }

    /// A clock reading the current system time.
    pub fn starting_now() -> ManualClock {
        ManualClock::new(system_micros())
    }

    /// The time, in microseconds since the Unix epoch.
    pub fn now_micros(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    /// Sets the time, in microseconds since the Unix epoch (at most
    /// [`MAX_MICROS`](Self::MAX_MICROS)).
    pub fn set_micros(&self, micros: u64) {
        self.0.store(micros.min(Self::MAX_MICROS), Ordering::SeqCst);
    }

    /// Moves the clock forward (up to [`MAX_MICROS`](Self::MAX_MICROS)).
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        let moved = |t: u64| Some(t.saturating_add(by).min(Self::MAX_MICROS));
        // (the closure always gives a time, so the update cannot fail)
        let _ = self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, moved);
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
/// again, back or forth (the algorithms take a clock that goes back). Setting it keeps
/// windows aligned to the Unix epoch aligned, however long the store lives.
///
/// A step of the system clock forward is followed at once; one back (an NTP step, a virtual
/// machine restored, a hand) is followed by at most [`MAX_BACK_PER_SETTING`] a setting (1% of
/// the time between settings; a setting is made by the first read due, so a store nobody
/// checks catches up only as checks come). Followed at once, it would put every state
/// charged since the time the clock went back to in the future, and the algorithms refuse
/// the client of such a state until the clock reaches it again: a step back of an hour
/// refused every recent client for an hour.
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
    /// Where the system time is read (`system_micros`; a clock of the tests' own in tests).
    system: fn() -> u64,
    /// How often the clock is set (µs).
    every: u64,
}

/// How often the counter clock is set from the system clock (µs).
const SETTING_EVERY_US: u64 = 1_000_000;

/// How far back a setting moves the counter clock at most: 1% of the time between settings,
/// far more than the counter's drift, so that a system clock gone back is caught up with in
/// 100 times the step (an hour's step in about four days) while the clock goes on forward.
const MAX_BACK_PER_SETTING: u64 = SETTING_EVERY_US / 100;

impl CounterClock {
    pub(crate) fn new() -> CounterClock {
        CounterClock::reading(system_micros, SETTING_EVERY_US)
    }

    /// A clock set from `system` every `every` µs.
    fn reading(system: fn() -> u64, every: u64) -> CounterClock {
        let counter = quanta::Clock::new();
        let start = counter.raw();
        CounterClock {
            counter,
            start,
            offset: AtomicU64::new(system()),
            next_setting: AtomicU64::new(every),
            system,
            every,
        }
    }

    /// Microseconds since the Unix epoch.
    pub(crate) fn now_micros(&self) -> u64 {
        let since = self.counter.delta_as_nanos(self.start, self.counter.raw()) / 1_000;
        let offset = self.offset.load(Ordering::Relaxed);
        let next = self.next_setting.load(Ordering::Relaxed);
        if since < next {
            return offset + since;
        }
        // One thread sets it: two at once would each move it back, and the clock would go
        // back by more than a setting's share. The others read it as it was meanwhile.
        let claimed = self.next_setting.compare_exchange(
            next,
            since + self.every,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        if claimed.is_err() {
            return offset + since;
        }
        let ours = offset + since;
        let back = (self.every / 100).min(MAX_BACK_PER_SETTING);
        let now = (self.system)().max(ours.saturating_sub(back));
        self.offset
            .store(now.saturating_sub(since), Ordering::Relaxed);
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

    /// The system time of `a_step_back_of_the_system_clock_is_caught_up_with_slowly`.
    static SYSTEM: AtomicU64 = AtomicU64::new(0);

    /// A system clock stepped back an hour moves the clock back by 1% of the time passing,
    /// not by the hour (which would put the states charged in the last hour in the future,
    /// and refuse their clients for an hour); one stepped forward is followed at once.
    #[test]
    fn a_step_back_of_the_system_clock_is_caught_up_with_slowly() {
        const HOUR: u64 = 3_600_000_000;
        SYSTEM.store(1_000 * HOUR, Ordering::Relaxed);
        // set every 2 ms: at most 20 µs back a setting
        let clock = CounterClock::reading(|| SYSTEM.load(Ordering::Relaxed), 2_000);
        let before = clock.now_micros();
        SYSTEM.fetch_sub(HOUR, Ordering::Relaxed);
        let mut last = before;
        for _ in 0..20 {
            std::thread::sleep(Duration::from_millis(3));
            let now = clock.now_micros();
            // (each sleep of 3 ms or more is at least one setting of at most 20 µs back)
            assert!(now + 20 >= last, "{now} after {last}: went back an hour");
            last = now;
        }
        assert!(last > before, "the clock went on forward");
        // forward: followed at once, to the system time itself (which stands still in this
        // test, while `before` was read some µs after it was set)
        SYSTEM.fetch_add(2 * HOUR, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(3));
        let now = clock.now_micros();
        assert_eq!(now, SYSTEM.load(Ordering::Relaxed), "{now} vs {before}");
    }
}

//! Checks that wait to be admitted: [`Limiter::check_waiting`].

use std::sync::Arc;
use std::time::Duration;

use super::{Error, Limiter, Mode, Version};
use crate::decision::Decision;

impl Limiter {
    /// Checks one request of cost 1, waiting up to `max_wait` for the limits to admit it. See
    /// [`Limiter::check_n_waiting`].
    ///
    /// # Errors
    ///
    /// As [`Limiter::check_n`].
    ///
    /// # Panics
    ///
    /// As [`Limiter::check_n_waiting`].
    pub async fn check_waiting<I: AsRef<str>>(
        &self,
        identifiers: &[I],
        max_wait: Duration,
    ) -> Result<Decision, Error> {
        self.check_n_waiting(identifiers, 1, max_wait).await
    }

    /// Checks one request of cost `cost` and, when the limits deny it now but admit it
    /// within `max_wait`, reserves it: the request is charged as of the earliest time every
    /// limit admits it for every identifier, and the returned future sleeps until then. A
    /// request that would wait longer is denied at once, charged nothing, with its
    /// [`retry_after`](Decision::retry_after).
    ///
    /// One store call decides and reserves (on Redis, one script call): waiting callers are
    /// admitted in the order they asked, each at its own time, without re-checking. So with
    /// `5/s log` and 20 requests at once that may wait 2 s, 5 go now, 5 at 1 s and 5 at 2 s,
    /// and the last 5 are denied at once; with the default rolling window (`5/s`), 5 go now
    /// and 5 at 1.25 s, when the first five's sub-window has left its ring, and the other 10
    /// are denied at once. A reservation holds until its time even when its
    /// caller gives up (the future dropped): the charge stays.
    ///
    /// A policy with a concurrency limit cannot reserve (a slot frees when a request ends,
    /// not at a known time): its requests check again, as long as `max_wait` lasts. A rate
    /// limit's denial says when to; one for want of a slot is checked again after 5 ms, then
    /// after twice as long each time up to 100 ms apart, and once more when `max_wait` ends.
    /// Slots are not handed out in the order their waiters asked: a freed slot goes to the
    /// first check that finds it, a newcomer's as well as a waiter's, so under steady
    /// contention a waiter may wait out `max_wait` while later requests get slots.
    /// Nor can a check whose identifiers lie in several Redis Cluster hash slots (no one
    /// script call touches two slots): it checks again at each denial's retry time, in the
    /// store's call, and so waits in shadow mode too. Otherwise,
    /// in shadow mode nothing waits: the request is charged as when enforcing and let
    /// through at once. (So in shadow mode a request of a policy with a concurrency limit
    /// that finds no slot free is recorded as a would-be denial, where enforcing, it would
    /// have waited for one, and perhaps got it.)
    ///
    /// ```
    /// # async fn run() -> Result<(), tollgate::Error> {
    /// use std::time::Duration;
    /// use tollgate::{Limiter, MemoryStore};
    ///
    /// let limiter = Limiter::new(MemoryStore::new(), "2/s gcra".parse().unwrap());
    /// let mut admitted = 0;
    /// for _ in 0..3 {
    ///     // the third waits 500 ms for its turn
    ///     let decision = limiter.check_waiting(&["psp:acme"], Duration::from_secs(1)).await?;
    ///     admitted += usize::from(decision.is_allowed());
    /// }
    /// assert_eq!(admitted, 3);
    /// # Ok(()) }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(run()).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Limiter::check_n`].
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime with its time driver, when the request waits (the wait is
    /// Tokio's timer).
    pub async fn check_n_waiting<I: AsRef<str>>(
        &self,
        identifiers: &[I],
        cost: u64,
        max_wait: Duration,
    ) -> Result<Decision, Error> {
        self.wait_within(identifiers, cost, Mode::CHECK, max_wait)
            .await
    }

    /// [`check_n_waiting`](Limiter::check_n_waiting) in `mode`.
    pub(crate) async fn wait_within<I: AsRef<str>>(
        &self,
        identifiers: &[I],
        cost: u64,
        mode: Mode,
        max_wait: Duration,
    ) -> Result<Decision, Error> {
        // One version of the policy for the whole wait: whether it reserves or checks again,
        // and every check it makes (a request finishes on the policy it started with).
        let version = self.inner.version.load_full();
        if version.policy.concurrency().is_some() {
            return self
                .recheck_within(&version, identifiers, cost, mode, max_wait)
                .await;
        }
        let (decision, wait) = self
            .run_within_on(&version, identifiers, cost, mode, max_wait)
            .await?;
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        Ok(decision)
    }

    /// For a policy with a concurrency limit: checks again while `max_wait` from the first
    /// check lasts, when [`next_check`] says.
    async fn recheck_within<I: AsRef<str>>(
        &self,
        version: &Arc<Version>,
        identifiers: &[I],
        cost: u64,
        mode: Mode,
        max_wait: Duration,
    ) -> Result<Decision, Error> {
        // (a wait past what a clock holds, `Duration::MAX` say, has no deadline)
        let deadline = tokio::time::Instant::now().checked_add(max_wait);
        // One request, one decision in the metrics, as a check that reserves makes: the
        // denials it waits out are not counted, the answer it gets is.
        let each = Mode {
            record: false,
            ..mode
        };
        let mut poll = FIRST_POLL;
        // A request given up on while it waits (a client gone, a deadline of its own) is
        // counted too, as the denial it had last.
        let mut waiting = Waiting {
            limiter: self,
            version,
            denied: None,
        };
        loop {
            // The denial stays counted-if-dropped through the next check too: a caller can
            // give up during a check (a round trip to Redis) as well as between checks.
            let checked = self.run_within_on(version, identifiers, cost, each, Duration::ZERO);
            let (decision, _) = match checked.await {
                Ok(answer) => answer,
                // (the error is the request's answer, counted as such)
                Err(e) => {
                    waiting.denied = None;
                    return Err(e);
                }
            };
            let left = deadline.map(|d| d.saturating_duration_since(tokio::time::Instant::now()));
            match next_check(&decision, &mut poll, left) {
                Some(wait) => {
                    waiting.denied = mode.record.then_some(decision);
                    tokio::time::sleep(wait).await;
                }
                None => {
                    waiting.denied = None;
                    if mode.record {
                        self.record(version, &decision);
                    }
                    return Ok(decision);
                }
            }
        }
    }
}

/// A waiting check of slots, once denied: the denial it had last, counted if it is dropped
/// before it is answered (its caller gave up while it slept or checked again), so that every
/// request waiting for a slot counts one decision, answered or not.
struct Waiting<'a> {
    limiter: &'a Limiter,
    version: &'a Version,
    denied: Option<Decision>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(denied) = self.denied.take() {
            self.limiter.record(self.version, &denied);
        }
    }
}

/// The first wait before a check denied a concurrency slot checks again; each next one is
/// twice as long, up to [`LONGEST_POLL`].
pub(crate) const FIRST_POLL: Duration = Duration::from_millis(5);

/// The longest wait between two checks of a request denied a concurrency slot.
pub(crate) const LONGEST_POLL: Duration = Duration::from_millis(100);

/// How long a request `decision` denied waits before it checks again, when `left` of its wait
/// remains (`None`: no deadline); `None` when it is not to check again. A rate limit says when
/// it admits, and that is waited for, or nothing when it lies past the deadline. A concurrency
/// slot frees when some request ends, which no one knows ahead (its retry time, at most a
/// second, is only a bound): a denial by one is checked again after `poll`, which doubles each
/// time up to [`LONGEST_POLL`], and once more at the deadline.
fn next_check(
    decision: &Decision,
    poll: &mut Duration,
    left: Option<Duration>,
) -> Option<Duration> {
    decision.retry_after()?;
    let (mut known, mut slots) = (Duration::ZERO, None::<Duration>);
    for status in decision.statuses().iter().filter(|s| !s.allowed) {
        let retry = status.retry_after.unwrap_or_default();
        if status.limit.is_concurrency() {
            // (at least a millisecond: a retry time of zero must not make a loop of checks)
            let poll = retry.min(*poll).max(Duration::from_millis(1));
            slots = Some(slots.unwrap_or_default().max(poll));
        } else {
            // (at least a millisecond too: a denial always names a later time, but a loop of
            // checks must not hang on that)
            known = known.max(retry).max(Duration::from_millis(1));
        }
    }
    *poll = (*poll * 2).min(LONGEST_POLL);
    let wait = slots.map_or(known, |slots| slots.max(known));
    match left {
        None => Some(wait),
        Some(left) if wait <= left => Some(wait),
        // A slot may free before the deadline, a rate limit not: one last check there.
        Some(left) if slots.is_some() && known <= left && !left.is_zero() => Some(left),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::MemoryStore;

    const S: u64 = 1_000_000;

    fn limiter(clock: &ManualClock, policy: &str) -> Limiter {
        let store = MemoryStore::builder()
            .clock(Clock::Manual(clock.clone()))
            .build();
        Limiter::new(store, policy.parse().unwrap())
    }

    /// 20 requests at once, each willing to wait 2 s: per request its wait (µs) when
    /// admitted, else `None`; and the retry times of the denied.
    async fn twenty(l: &Limiter) -> (Vec<Option<u64>>, Vec<Duration>) {
        let (mut waits, mut retries) = (Vec::new(), Vec::new());
        for _ in 0..20 {
            let (d, wait) = l
                .run_within(&["psp:acme"], 1, Mode::CHECK, Duration::from_secs(2))
                .await
                .unwrap();
            if d.is_allowed() {
                waits.push(Some(wait.as_micros() as u64));
            } else {
                waits.push(None);
                retries.push(d.retry_after().unwrap());
            }
        }
        (waits, retries)
    }

    fn at(times: &[u64]) -> Vec<Option<u64>> {
        let mut v: Vec<Option<u64>> = times.iter().map(|&t| Some(t)).collect();
        v.resize(20, None);
        v
    }

    #[tokio::test]
    async fn a_log_admits_fifteen_of_twenty_in_two_seconds() {
        let clock = ManualClock::new(1_767_225_600_000_000);
        let l = limiter(&clock, "5/s log");
        let (waits, retries) = twenty(&l).await;
        let expected: Vec<u64> = [0, S, 2 * S].iter().flat_map(|&t| [t; 5]).collect();
        assert_eq!(waits, at(&expected));
        // the other 5 would have had to wait until 3 s
        assert_eq!(retries, [Duration::from_secs(3); 5]);
        // nobody is admitted before the reservations: at 0.5 s the window is full until 3 s
        clock.advance(Duration::from_millis(500));
        let d = l.check(&["psp:acme"]).await.unwrap();
        assert_eq!(d.retry_after(), Some(Duration::from_millis(2500)));
        // and once they are through, the log admits again
        clock.advance(Duration::from_millis(2500));
        assert!(l.check(&["psp:acme"]).await.unwrap().is_allowed());
    }

    #[tokio::test]
    async fn gcra_admits_fifteen_of_twenty_in_two_seconds() {
        let clock = ManualClock::new(1_767_225_600_000_000);
        let l = limiter(&clock, "5/s gcra");
        let (waits, retries) = twenty(&l).await;
        let mut expected = vec![0; 5];
        expected.extend((1..=10).map(|k| k * S / 5));
        assert_eq!(waits, at(&expected));
        assert_eq!(retries[0], Duration::from_millis(2200));
    }

    #[tokio::test]
    async fn the_sliding_window_admits_each_at_its_earliest_time() {
        // The estimate weighs the previous window as if its 5 were spread evenly, so in the
        // next window the k-th fits at 1 + k/5 s: 5 now, 4 in (1 s, 2 s), 1 at 2 s.
        let clock = ManualClock::new(1_767_225_600_000_000);
        let l = limiter(&clock, "5/s sliding");
        let (waits, _) = twenty(&l).await;
        let mut expected = vec![0; 5];
        expected.extend((6..=10).map(|k| k * S / 5));
        assert_eq!(waits, at(&expected));
    }

    #[tokio::test]
    async fn a_fixed_window_is_full_until_a_reserved_window_begins() {
        let clock = ManualClock::new(1_767_225_600_000_000);
        let l = limiter(&clock, "5/s fixed");
        let (waits, _) = twenty(&l).await;
        let expected: Vec<u64> = [0, S, 2 * S].iter().flat_map(|&t| [t; 5]).collect();
        assert_eq!(waits, at(&expected));
        // reservations charged the windows of 1 s and 2 s: a check at 1.5 s finds its window
        // full, and the next one too (charged ahead, full until it begins, then by its
        // count): not before 3 s; one at 2.5 s, the same
        clock.advance(Duration::from_millis(1500));
        let d = l.check(&["psp:acme"]).await.unwrap();
        assert_eq!(d.retry_after(), Some(Duration::from_millis(1500)));
        clock.advance(Duration::from_secs(1));
        let d = l.check(&["psp:acme"]).await.unwrap();
        assert_eq!(d.retry_after(), Some(Duration::from_millis(500)));
    }

    #[tokio::test]
    async fn the_rolling_window_admits_ten_of_twenty_in_two_seconds() {
        // Sub-windows of 250 ms, the ring the sub-window of now and the four before: the 5 of
        // now count until their sub-window leaves the ring at 1.25 s, where 5 are reserved;
        // theirs leaves it at 2.5 s, past the 2 s. Every reserved admission in one sub-window
        // and 5 in any second.
        let clock = ManualClock::new(1_767_225_600_000_000);
        let l = limiter(&clock, "5/s");
        let (waits, retries) = twenty(&l).await;
        let expected: Vec<u64> = [0, 5 * S / 4].iter().flat_map(|&t| [t; 5]).collect();
        assert_eq!(waits, at(&expected));
        assert_eq!(retries, [Duration::from_millis(2500); 10]);
        // nobody is admitted before the reservations: at 0.5 s the ring (as of 1.25 s) is
        // full until 1.25 s, and its 5 leave it at 2.5 s
        clock.advance(Duration::from_millis(500));
        let d = l.check(&["psp:acme"]).await.unwrap();
        assert_eq!(d.retry_after(), Some(Duration::from_secs(2)));
        clock.advance(Duration::from_secs(2));
        assert!(l.check(&["psp:acme"]).await.unwrap().is_allowed());
    }

    #[tokio::test]
    async fn a_ring_charged_ahead_is_full_until_its_sub_window_begins() {
        // 5 now, one reserved at 1.25 s: the ring as of 1.25 s holds 1, but a check at 0.5 s
        // admitted on that would put 6 in (-0.5 s, 0.5 s]; it waits for 1.25 s
        let clock = ManualClock::new(1_767_225_600_000_000);
        let l = limiter(&clock, "5/s");
        for _ in 0..5 {
            assert!(l.check(&["psp:acme"]).await.unwrap().is_allowed());
        }
        let (d, wait) = l
            .run_within(&["psp:acme"], 1, Mode::CHECK, Duration::from_secs(2))
            .await
            .unwrap();
        assert!(d.is_allowed());
        assert_eq!(wait, Duration::from_millis(1250));
        clock.advance(Duration::from_millis(500));
        let d = l.check(&["psp:acme"]).await.unwrap();
        assert_eq!(d.retry_after(), Some(Duration::from_millis(750)));
        let (d, wait) = l
            .run_within(&["psp:acme"], 4, Mode::CHECK, Duration::from_secs(1))
            .await
            .unwrap();
        assert!(d.is_allowed());
        assert_eq!(wait, Duration::from_millis(750));
    }

    #[tokio::test]
    async fn every_identifier_and_limit_is_waited_for() {
        let clock = ManualClock::new(1_767_225_600_000_000);
        let l = limiter(&clock, "2/s gcra burst=1, 3/10s log");
        // a second identifier at its log's limit: charged at 0, 0.5 and 1 s
        for _ in 0..3 {
            assert!(l.check(&["user:7"]).await.unwrap().is_allowed());
            clock.advance(Duration::from_millis(500));
        }
        clock.advance(Duration::from_millis(2500));
        let first = l
            .run_within(
                &["psp:acme", "user:7"],
                1,
                Mode::CHECK,
                Duration::from_secs(10),
            )
            .await
            .unwrap();
        // at 4 s: user:7's log admits at 10 s, 6 s from now
        assert!(first.0.is_allowed());
        assert_eq!(first.1, Duration::from_secs(6));
        // past the longest wait: denied at once, with the wait it needed (the GCRA's next
        // arrival after the reservation at 10 s)
        let (d, wait) = l
            .run_within(&["psp:acme"], 1, Mode::CHECK, Duration::from_millis(100))
            .await
            .unwrap();
        assert!(!d.is_allowed());
        assert!(wait.is_zero());
        assert_eq!(d.retry_after(), Some(Duration::from_millis(6500)));
    }

    /// A denial for want of a slot is checked again after 5 ms, then twice as long each time
    /// up to 100 ms, with a last check at the deadline; a rate limit's denial after its
    /// retry time, or never when that lies past the deadline.
    #[tokio::test]
    async fn checks_for_a_slot_again_sooner_and_sooner_apart() {
        let clock = ManualClock::new(1_000 * S);
        let slots = limiter(&clock, "1 concurrent");
        let held = slots.check(&["a"]).await.unwrap();
        let denied = slots.check(&["a"]).await.unwrap();
        assert!(!denied.is_allowed());
        let ms = Duration::from_millis;
        let mut poll = FIRST_POLL;
        let waits: Vec<_> = (0..7)
            .map(|_| next_check(&denied, &mut poll, None).unwrap())
            .collect();
        assert_eq!(
            waits,
            [ms(5), ms(10), ms(20), ms(40), ms(80), ms(100), ms(100)]
        );
        // a last check at the deadline, and none once it has come
        let mut poll = FIRST_POLL;
        assert_eq!(next_check(&denied, &mut poll, Some(ms(3))), Some(ms(3)));
        assert_eq!(next_check(&denied, &mut poll, Some(Duration::ZERO)), None);
        // a lease half a millisecond from its deadline: checked again no sooner than a
        // millisecond on, not in a loop
        clock.advance(Duration::from_secs(15) - Duration::from_micros(500));
        let denied = slots.check(&["a"]).await.unwrap();
        assert_eq!(denied.retry_after(), Some(Duration::from_micros(500)));
        let mut poll = FIRST_POLL;
        assert_eq!(next_check(&denied, &mut poll, None), Some(ms(1)));
        drop(held);

        // a slot and a rate limit, both denying: the rate limit's retry time decides
        let both = limiter(&clock, "1/min, 1 concurrent");
        let held = both.check(&["a"]).await.unwrap();
        let denied = both.check(&["a"]).await.unwrap();
        let retry = denied.retry_after().unwrap();
        assert!(retry > Duration::from_secs(50), "{retry:?}");
        let mut poll = FIRST_POLL;
        assert_eq!(next_check(&denied, &mut poll, None), Some(retry));
        assert_eq!(
            next_check(&denied, &mut poll, Some(Duration::from_secs(1))),
            None
        );
        drop(held);
        // an admission is not checked again
        let allowed = both.check(&["b"]).await.unwrap();
        assert_eq!(next_check(&allowed, &mut poll, None), None);
    }
}

#[cfg(test)]
mod never_over_admits {
    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::MemoryStore;

    /// Arrivals at random steps, some waiting up to random times, some not at all: the times
    /// requests were admitted at (the arrival plus the wait), in order.
    async fn admissions(policy: &str, seed: u64) -> Vec<u64> {
        admissions_of(policy, 1, seed).await
    }

    /// [`admissions`] of requests of cost `cost`.
    async fn admissions_of(policy: &str, cost: u64, seed: u64) -> Vec<u64> {
        let clock = ManualClock::new(1_767_225_600_000_000);
        let store = MemoryStore::builder()
            .clock(Clock::Manual(clock.clone()))
            .build();
        let l = Limiter::new(store, policy.parse().unwrap());
        let mut x = seed;
        let mut next = |m: u64| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (x >> 33) % m
        };
        let mut admitted = Vec::new();
        for _ in 0..400 {
            let max_wait = match next(3) {
                0 => Duration::ZERO,
                _ => Duration::from_micros(next(3_000_000)),
            };
            let (d, wait) = l
                .run_within(&["k"], cost, Mode::CHECK, max_wait)
                .await
                .unwrap();
            if d.is_allowed() {
                admitted.push(clock.now_micros() + wait.as_micros() as u64);
            }
            clock.advance(Duration::from_micros(next(150_000)));
        }
        admitted
    }

    #[tokio::test]
    async fn a_log_never_holds_more_than_its_count_in_any_window() {
        for seed in 1..6 {
            let mut times = admissions("5/s log", seed).await;
            assert!(times.len() > 50);
            times.sort_unstable();
            // every window (t - 1 s, t] ending at an admission holds at most 5
            for (i, &t) in times.iter().enumerate() {
                let inside = times[..=i].iter().filter(|&&s| s + 1_000_000 > t).count();
                assert!(
                    inside <= 5,
                    "seed {seed}: {inside} in the window ending at {t}"
                );
            }
        }
    }

    #[tokio::test]
    async fn a_rolling_window_never_holds_more_than_its_count_in_any_window() {
        for policy in ["5/s", "2000/s"] {
            // the wide form at costs that fill it as quickly: 400 a request
            let cost = if policy == "5/s" { 1 } else { 400 };
            for seed in 1..6 {
                let mut times = admissions_of(policy, cost, seed).await;
                assert!(times.len() > 50, "{policy}");
                times.sort_unstable();
                // every window (t - 1 s, t] ending at an admission holds at most 5 requests
                for (i, &t) in times.iter().enumerate() {
                    let inside = times[..=i].iter().filter(|&&s| s + 1_000_000 > t).count();
                    assert!(
                        inside <= 5,
                        "{policy}, seed {seed}: {inside} in the window ending at {t}"
                    );
                }
            }
        }
    }

    #[tokio::test]
    async fn a_fixed_window_never_holds_more_than_its_count() {
        for seed in 1..6 {
            let times = admissions("5/s fixed", seed).await;
            let mut per_window = std::collections::HashMap::new();
            for t in times {
                *per_window.entry(t / 1_000_000).or_insert(0) += 1;
            }
            assert!(
                per_window.values().all(|&n| n <= 5),
                "seed {seed}: {per_window:?}"
            );
        }
    }

    #[tokio::test]
    async fn gcra_admissions_conform() {
        // 5/s with a burst of 2: admitting at t needs max(tat, t) + T - t <= 2T
        for seed in 1..6 {
            let mut times = admissions("5/s gcra burst=2", seed).await;
            times.sort_unstable();
            let mut tat = 0u64;
            for t in times {
                let next = tat.max(t) + 200_000;
                assert!(next - t <= 400_000, "seed {seed}: at {t}");
                tat = next;
            }
        }
    }
}

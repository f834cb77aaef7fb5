use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::ManualClock;

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

/// What one update of full utilization adds at most: a third of the 28 s before shedding,
/// at 1/120 a second.
const THIRD: f64 = 28.0 / 3.0 / 120.0;

#[test]
fn elapsed_time_is_capped_and_clock_steps_back_are_ignored() {
    let rig = Rig::new(3);
    let rest = ShedConfig::default().resting_amount();
    rig.shedder.update(1.0);
    // An hour without requests counts as a third of 28 s.
    rig.clock.advance(Duration::from_secs(3600));
    assert!((rig.shedder.update(1.0) - (rest + THIRD)).abs() < 1e-9);
    rig.clock.set_micros(rig.clock.now_micros() - 10_000_000);
    assert!((rig.shedder.update(1.0) - (rest + THIRD)).abs() < 1e-9);
    rig.clock.advance(Duration::from_secs(6));
    assert!((rig.shedder.update(1.0) - (rest + THIRD + 0.05)).abs() < 1e-9);
}

/// A quiet process's lone samples of full utilization (a blip as a request comes, every 30
/// s) each stand for a third of the 28 s before shedding: three of them shed nothing, and
/// only a fourth starts shedding. Standing for the whole gap, two would have shed.
#[test]
fn lone_samples_of_full_utilization_shed_nothing_before_the_fourth() {
    let rig = Rig::new(5);
    rig.shedder.update(0.0);
    for blip in 1..=3 {
        rig.clock.advance(Duration::from_secs(30));
        assert!(rig.shedder.update(1.0) <= 1e-9, "blip {blip}");
        assert!(
            !rig.shedder.should_shed_with(Priority::Low, 1e-6),
            "blip {blip}"
        );
    }
    rig.clock.advance(Duration::from_secs(30));
    assert!(rig.shedder.update(1.0) > 0.05);
}

/// A gap without requests lowers the amount as far as the whole gap of idleness would, as
/// Stripe's sketch, sampling through the gap, would have: a process back from a pause (its
/// traffic sent elsewhere while it shed) is at rest, not shedding on with nothing in flight.
#[test]
fn a_pause_lowers_the_amount_as_far_as_the_whole_gap() {
    let rig = Rig::new(6);
    rig.shedder.update(1.0);
    // 84 s of full utilization, in steps a rise takes whole: 28 s to reach 0, then 0.47
    for _ in 0..14 {
        rig.clock.advance(Duration::from_secs(6));
        rig.shedder.update(1.0);
    }
    let reached = rig.shedder.update(1.0);
    assert!((reached - 56.0 / 120.0).abs() < 1e-9, "{reached}");
    // 40 s idle: 40 s of the way down, not 28
    rig.clock.advance(Duration::from_secs(40));
    let after = rig.shedder.update(0.0);
    assert!(
        (reached - after - 40.0 / 120.0).abs() < 1e-9,
        "{reached} -> {after}"
    );
    // an hour: at rest, shedding nothing
    rig.clock.advance(Duration::from_secs(3600));
    let rest = rig.shedder.config().resting_amount();
    assert_eq!(rig.shedder.update(0.0), rest);
    assert!(!rig.shedder.should_shed_with(Priority::Low, 0.0));
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
    let rest = rig.shedder.config().resting_amount();
    rig.clock.advance(Duration::from_secs(28));
    assert!((rig.shedder.update(f64::INFINITY) - (rest + THIRD)).abs() < 1e-9);
    rig.clock.advance(Duration::from_secs(6));
    assert!((rig.shedder.update(7.0) - (rest + THIRD + 0.05)).abs() < 1e-9);
    rig.clock.advance(Duration::from_secs(6));
    assert!((rig.shedder.update(-3.0) - (rest + THIRD)).abs() < 1e-9);
}

/// A shedder held at `amount` (reached on a fake clock at full utilization), deciding
/// with the random numbers given.
fn at_amount(amount: f64) -> UtilizationShedder {
    let clock = ManualClock::new(0);
    let shedder =
        UtilizationShedder::new(ShedConfig::default(), || 0.75).clock(Clock::Manual(clock.clone()));
    shedder.update(1.0);
    // 28 s to reach 0, then 120 s per unit, in steps: one update integrates at most a third
    // of 28 s.
    for _ in 0..4 {
        clock.advance(Duration::from_secs(7));
        shedder.update(1.0);
    }
    for _ in 0..20 {
        clock.advance(Duration::from_secs_f64(6.0 * amount));
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
fn in_flight_shedder_has_a_counter() {
    let shedder = UtilizationShedder::in_flight(ShedConfig::default(), 10);
    let counter = shedder.in_flight_counter().unwrap();
    assert_eq!(counter.capacity(), 10);
    assert_eq!(counter.current(), 0);
}

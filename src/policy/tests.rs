//! Tests of the limits, the policies and their text syntax.

use super::*;

#[test]
fn parses_the_seed_policy() {
    let p: Policy = "10/s, 120/min, 240/h".parse().unwrap();
    let l = p.limits();
    assert_eq!(l.len(), 3);
    assert_eq!((l[0].count(), l[0].window()), (10, Duration::from_secs(1)));
    assert_eq!(
        (l[1].count(), l[1].window()),
        (120, Duration::from_secs(60))
    );
    assert_eq!(
        (l[2].count(), l[2].window()),
        (240, Duration::from_secs(3600))
    );
    assert!(l.iter().all(|l| l.algorithm() == Algorithm::DEFAULT));
    assert_eq!(Algorithm::DEFAULT, Algorithm::RollingWindow);
    assert_eq!(p.to_string(), "10/s, 120/min, 240/h");
    // the sliding-window counter, the default before, by name
    let p: Policy = "10/s sliding, 120/min sliding, 240/h sliding"
        .parse()
        .unwrap();
    assert!(p
        .limits()
        .iter()
        .all(|l| l.algorithm() == Algorithm::SlidingWindow));
    assert_eq!(
        p.to_string(),
        "10/s sliding, 120/min sliding, 240/h sliding"
    );
    assert_eq!(
        "10/s rolling".parse::<Limit>().unwrap(),
        Limit::per_second(10).unwrap()
    );
}

#[test]
fn at_most_one_algorithm_whichever_the_default() {
    for text in [
        "10/s rolling sliding",
        "10/s sliding log",
        "10/s log rolling",
        "10/s rolling rolling",
    ] {
        let e = text.parse::<Limit>().unwrap_err();
        assert!(
            matches!(e.kind(), PolicyErrorKind::Syntax(_)),
            "{text}: {e}"
        );
    }
}

#[test]
fn parses_algorithms_and_bursts() {
    let p: Policy =
        "100/s bucket capacity=500, 5/s gcra burst=20, 10/1500ms log, 1_000/day fixed, 3/5min gcra"
            .parse()
            .unwrap();
    let l = p.limits();
    assert_eq!(l[0].algorithm(), Algorithm::TokenBucket { capacity: 500 });
    assert_eq!(l[1].algorithm(), Algorithm::Gcra { burst: 20 });
    assert_eq!(l[2].algorithm(), Algorithm::SlidingLog);
    assert_eq!(l[2].window(), Duration::from_millis(1500));
    assert_eq!(l[3].algorithm(), Algorithm::FixedWindow);
    assert_eq!(l[3].count(), 1000);
    assert_eq!(l[4].algorithm(), Algorithm::Gcra { burst: 3 });
    assert_eq!(
        p.to_string(),
        "100/s bucket capacity=500, 5/s gcra burst=20, 10/1500ms log, 1000/d fixed, 3/5min gcra"
    );
    assert_eq!(p.max_cost(), 3);
}

#[test]
fn display_round_trips() {
    for text in [
        "1/ms",
        "7/90s",
        "2/61min sliding",
        "2/61min rolling",
        "3/7ms sliding, 3/7ms",
        "9/25h bucket burst=1",
        "50000000/400d gcra",
        "5/s, 5/s log, 5/s fixed, 5/s bucket, 5/s gcra burst=2",
        "10/s, 3 concurrent",
        "4 concurrent lease=90s",
    ] {
        let p: Policy = text.parse().unwrap();
        let again: Policy = p.to_string().parse().unwrap();
        assert_eq!(p, again, "{text} -> {p}");
    }
}

#[test]
fn errors_name_the_bad_part() {
    let cases = [
        ("", PolicyErrorKind::Empty),
        ("10/s,", PolicyErrorKind::Empty),
        ("0/s", PolicyErrorKind::ZeroCount),
        ("10/0s", PolicyErrorKind::ZeroWindow),
        (
            "10/fortnight",
            PolicyErrorKind::UnknownUnit("fortnight".into()),
        ),
        (
            "10/s leaky",
            PolicyErrorKind::UnknownAlgorithm("leaky".into()),
        ),
        ("10/s burst=5", PolicyErrorKind::BurstNotAllowed),
        ("10/s gcra burst=0", PolicyErrorKind::ZeroBurst),
        (
            "10/s gcra rate=5",
            PolicyErrorKind::UnknownParameter("rate".into()),
        ),
        ("99999999999999999999999/s", PolicyErrorKind::Overflow),
        ("60000000/s", PolicyErrorKind::Overflow),
        ("1/99999999999999d", PolicyErrorKind::Overflow),
        ("1/401d", PolicyErrorKind::Overflow),
        ("ten/s", PolicyErrorKind::BadCount),
        (
            "10 per second",
            PolicyErrorKind::Syntax("expected COUNT/WINDOW (as in 10/s) or COUNT concurrent"),
        ),
        ("10/s, 10/s", PolicyErrorKind::Duplicate),
        ("2 concurrent, 3 concurrent", PolicyErrorKind::Duplicate),
        ("0 concurrent", PolicyErrorKind::ZeroCount),
        ("3 concurrent lease=0s", PolicyErrorKind::ZeroWindow),
        ("3 concurrent lease=999ms", PolicyErrorKind::LeaseTooShort),
        (
            "3 concurrent lease=1s lease=30s",
            PolicyErrorKind::Syntax("lease given twice"),
        ),
        (
            "10/s gcra burst=3 burst=4",
            PolicyErrorKind::Syntax("burst/capacity given twice"),
        ),
        ("100001/h log", PolicyErrorKind::LogTooLarge),
        (
            "3 concurrent ttl=5s",
            PolicyErrorKind::UnknownParameter("ttl".into()),
        ),
        // an underscore between two digits only
        ("10_/s", PolicyErrorKind::BadCount),
        ("1__0/s", PolicyErrorKind::BadCount),
        ("10/5_min", PolicyErrorKind::BadCount),
        // a parameter with spaces around its `=`
        (
            "100/s bucket capacity = 500",
            PolicyErrorKind::Syntax("a parameter is written without spaces, as in burst=20"),
        ),
        (
            "5/s gcra burst =20",
            PolicyErrorKind::Syntax("a parameter is written without spaces, as in burst=20"),
        ),
    ];
    for (text, kind) in cases {
        let e = text.parse::<Policy>().unwrap_err();
        assert_eq!(e.kind(), &kind, "{text}: {e}");
    }
    let e = "10/s, 5/fortnight, 3/h".parse::<Policy>().unwrap_err();
    assert_eq!(e.part(), "5/fortnight");
    assert!(e.to_string().contains("5/fortnight"), "{e}");
    assert!(e.to_string().contains("unknown window unit"), "{e}");
}

#[test]
fn limits_validate_their_fields() {
    let e = Limit::new(1, Duration::from_micros(1500), Algorithm::DEFAULT).unwrap_err();
    // named as given, not rounded to the valid `1/ms`
    assert_eq!(e.part(), "1/1.5ms");
    assert!(Limit::new(
        1,
        Duration::from_secs(1),
        Algorithm::Gcra {
            burst: MAX_COUNT + 1
        }
    )
    .is_err());
    // a burst of 50,000 at 1/day would tolerate 137 years of debt: refused
    let long = Limit::new(
        1,
        Duration::from_secs(86_400),
        Algorithm::Gcra { burst: 50_000 },
    );
    assert_eq!(long.unwrap_err().kind(), &PolicyErrorKind::Overflow);
    assert!(Limit::new(
        1,
        Duration::from_secs(86_400),
        Algorithm::Gcra { burst: 1000 }
    )
    .is_ok());
    assert!(Limit::per_second(10).is_ok());
    let l: Limit = " 10 / s ".replace(' ', "").parse().unwrap();
    assert_eq!(l, Limit::per_second(10).unwrap());
}

#[test]
fn algorithms_have_distinct_identities() {
    let all = [
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::RollingWindow,
        Algorithm::FixedWindow,
        Algorithm::TokenBucket { capacity: 1 },
        Algorithm::Gcra { burst: 1 },
        Algorithm::Concurrency,
    ];
    for (i, a) in all.iter().enumerate() {
        for b in &all[..i] {
            assert_ne!(a.keyword(), b.keyword(), "{a:?} {b:?}");
            assert_ne!(a.key_letter(), b.key_letter(), "{a:?} {b:?}");
            let same_automaton = matches!(
                (a, b),
                (Algorithm::Gcra { .. }, Algorithm::TokenBucket { .. })
            );
            assert_eq!(a.code() == b.code(), same_automaton, "{a:?} {b:?}");
        }
    }
}

#[test]
fn a_limit_scaled_down_keeps_a_burst_it_can_hold() {
    // a count of 3 a day with a burst just under the longest run ahead a limit may hold: half
    // of it rounds the count down to 1, and half the burst would then stand for 49 years
    let limit: Policy = "3/d gcra burst=39000".parse().unwrap();
    let (scaled, origins) = limit.scaled(0.5);
    assert_eq!(origins, vec![0]);
    let scaled = scaled.limits()[0];
    assert_eq!(scaled.count(), 1);
    // the burst cut to the longest that holds (2^50 µs over a day's window), not the fleet's
    // whole limit given to the process
    let longest = (1u64 << 50) / 86_400_000_000;
    assert_eq!(scaled.algorithm(), Algorithm::Gcra { burst: longest });
    assert_eq!(scaled.to_string().parse::<Limit>().unwrap(), scaled);
    // the usual case: count and burst halved
    let (scaled, _) = "100/s gcra burst=40, 10/min bucket capacity=30"
        .parse::<Policy>()
        .unwrap()
        .scaled(0.5);
    assert_eq!(
        scaled.to_string(),
        "50/s gcra burst=20, 5/min bucket capacity=15"
    );
}

#[test]
fn errors_say_what_is_wrong_where() {
    let message = |text: &str| text.parse::<Policy>().unwrap_err().to_string();
    assert_eq!(
        message("10/s,,20/min"),
        "invalid rate limit \"10/s,,20/min\": an empty limit between two commas, or a comma at \
         either end"
    );
    assert!(message("10/s,").contains("a comma at either end"));
    assert_eq!(
        message(""),
        "invalid rate limit \"\": no limit given (expected e.g. \"10/s, 120/min\")"
    );
    // the parameters of each form
    assert_eq!(
        message("3 concurrent ttl=5s"),
        "invalid rate limit \"3 concurrent ttl=5s\": unknown parameter \"ttl\" (expected \
         burst= or capacity= after bucket or gcra, lease= after concurrent)"
    );
    // the default algorithm is one of those named
    assert!(message("10/s leaky").contains("expected rolling, sliding"));
    // a burst within every bound alone, whose run ahead is too long
    let overflow = message("1/d gcra burst=50000");
    assert!(overflow.contains("burst × window / count"), "{overflow}");
    // a number other than the count
    assert!(message("10/s gcra burst=x").contains("a count, window, burst or lease"));
    assert!(message("10/5 min").contains("right after the number"));
    // a fraction of a unit: the whole number of a smaller one
    assert!(message("10/1.5s").contains("1500ms, not 1.5s"));
}

#[test]
fn units_take_their_short_plurals() {
    for (text, expected) in [
        ("10/5secs", "10/5s"),
        ("10/2mins", "10/2min"),
        ("10/3hrs", "10/3h"),
    ] {
        assert_eq!(text.parse::<Policy>().unwrap().to_string(), expected);
    }
    assert_eq!("1_000/s".parse::<Policy>().unwrap().to_string(), "1000/s");
}

/// A huge text (from a request, a file) is refused without being parsed whole, and its error
/// stays short: it goes into logs.
#[test]
fn a_huge_policy_text_gets_a_short_error() {
    let many = vec!["10/s"; 100_000].join(", ");
    let e = many.parse::<Policy>().unwrap_err();
    assert_eq!(e.kind(), &PolicyErrorKind::TooManyLimits);
    assert_eq!(e.part(), "100000 limits");
    let long = format!("1/s {}", "é".repeat(1_000_000));
    let e = long.parse::<Policy>().unwrap_err();
    assert!(e.to_string().len() < 600, "{}", e.to_string().len());
    assert!(e.part().ends_with('…'), "{}", e.part());
}

/// A share whose product with a count is whole keeps that whole count, whatever the last bit
/// of the floating-point product: the fallback's limits are what the share says.
#[test]
fn a_whole_share_of_a_count_is_not_rounded_down() {
    let count = |limit: &str, share: f64| limit.parse::<Limit>().unwrap().scaled(share).count();
    assert_eq!(count("100/s", 0.29), 29);
    assert_eq!(count("100/s", 0.57), 57);
    assert_eq!(count("98/min", 1.0 / 49.0), 2);
    // a share between two wholes still rounds down
    assert_eq!(count("100/s", 0.295), 29);
    assert_eq!(count("10/s", 1.0 / 3.0), 3);
    assert_eq!(count("50000000/d", 0.999_999_999), 49_999_999);
    for n in 1..=500u64 {
        for d in 1..=50u64 {
            let whole = n * d;
            let limit = format!("{whole}/min");
            assert_eq!(count(&limit, 1.0 / d as f64), n, "{whole} / {d}");
        }
    }
}

/// A limit is held at 1 by its fallback only when its share is below one request a window:
/// not when the share is 1 but for the floating point's last bit.
#[test]
fn a_limit_is_held_at_one_only_below_one_request() {
    let held = |limit: &str, share: f64| limit.parse::<Limit>().unwrap().held_at_one(share);
    assert!(held("5/min", 0.1));
    assert!(!held("10/min", 0.1));
    assert!(!held("50/min", 0.1));
    for n in 2..=200u64 {
        // n × (1/n) may be 0.9999999999999999
        assert!(!held(&format!("{n}/min"), 1.0 / n as f64), "{n}");
        assert!(held(&format!("{n}/min"), 1.0 / (n + 1) as f64), "{n}");
    }
}

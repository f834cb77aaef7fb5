use super::*;

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

/// The error `build` returns: its kind and setting.
fn error(builder: ShedConfigBuilder) -> (ShedConfigErrorKind, &'static str) {
    let e = builder.build().unwrap_err();
    (e.kind().clone(), e.setting())
}

#[test]
fn config_validation() {
    use ShedConfigErrorKind::*;

    let b = ShedConfig::builder;
    assert_eq!(
        error(b().end_of_good_utilization(0.0)),
        (
            ThresholdOutOfRange { value: 0.0 },
            "end_of_good_utilization"
        )
    );
    assert!(matches!(
        error(b().end_of_good_utilization(f64::NAN)),
        (ThresholdOutOfRange { .. }, "end_of_good_utilization")
    ));
    assert_eq!(
        error(b().start_of_bad_utilization(1.5)),
        (
            ThresholdOutOfRange { value: 1.5 },
            "start_of_bad_utilization"
        )
    );
    assert_eq!(
        error(b().start_of_bad_utilization(-0.1)),
        (
            ThresholdOutOfRange { value: -0.1 },
            "start_of_bad_utilization"
        )
    );
    assert_eq!(
        error(b().end_of_good_utilization(0.8)),
        (
            ThresholdsNotOrdered {
                end_of_good: 0.8,
                start_of_bad: 0.8
            },
            "end_of_good_utilization"
        )
    );
    assert_eq!(
        error(b().end_of_good_utilization(0.9)),
        (
            ThresholdsNotOrdered {
                end_of_good: 0.9,
                start_of_bad: 0.8
            },
            "end_of_good_utilization"
        )
    );
    assert_eq!(
        error(b().time_before_shedding(Duration::ZERO)),
        (ZeroDuration, "time_before_shedding")
    );
    assert_eq!(
        error(b().time_to_shed_all(Duration::ZERO)),
        (ZeroDuration, "time_to_shed_all")
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
fn errors_name_the_setting_and_the_value() {
    let b = ShedConfig::builder;
    let message = b().start_of_bad_utilization(1.5).build().unwrap_err();
    assert_eq!(
        message.to_string(),
        "invalid load-shedding setting start_of_bad_utilization: 1.5 is not in (0, 1]"
    );
    let message = b().end_of_good_utilization(0.9).build().unwrap_err();
    assert_eq!(
        message.to_string(),
        "invalid load-shedding setting end_of_good_utilization: \
         0.9 must be below start_of_bad_utilization (0.8)"
    );
    let message = b().time_to_shed_all(Duration::ZERO).build().unwrap_err();
    assert_eq!(
        message.to_string(),
        "invalid load-shedding setting time_to_shed_all: the duration must not be zero"
    );
}

//! The shape of a utilization shedder's response to load, and how it is built and checked.

use std::fmt;
use std::time::Duration;

/// The shape of a [`UtilizationShedder`](super::UtilizationShedder)'s response to load.
/// Build one with [`ShedConfig::builder`]; [`ShedConfig::default`] holds the values Stripe
/// published.
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
    /// Stripe's published Ruby computes this with integer division, which floors `-28 / 120`
    /// to −1 (a process at rest would take two minutes of full utilization to start
    /// shedding), and starts its amount at 0 rather than at rest (a new process sheds at
    /// once); this is the real division the comments describe, and a new shedder starts at
    /// rest.
    pub fn resting_amount(&self) -> f64 {
        -(self.before_shedding.as_secs_f64() / self.to_shed_all.as_secs_f64())
    }

    /// How fast the shedding amount moves at `utilization` (in [0, 1]), per second.
    pub(super) fn derivative(&self, utilization: f64) -> f64 {
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
    /// one lowers the amount at most as far as this much time would, and raises it at most
    /// as far as a third of it would, so that it takes three samples of full utilization,
    /// however far apart, to reach the point where shedding starts.
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

    /// The configuration, checked.
    ///
    /// # Errors
    ///
    /// A [`ShedConfigError`] naming the first setting that cannot work:
    ///
    /// * [`ThresholdOutOfRange`](ShedConfigErrorKind::ThresholdOutOfRange): a utilization
    ///   threshold outside (0, 1], or NaN;
    /// * [`ThresholdsNotOrdered`](ShedConfigErrorKind::ThresholdsNotOrdered): the end of good
    ///   utilization not below the start of bad utilization;
    /// * [`ZeroDuration`](ShedConfigErrorKind::ZeroDuration): a zero time before shedding or
    ///   time to shed all.
    pub fn build(self) -> Result<ShedConfig, ShedConfigError> {
        let c = self.config;
        for (setting, value) in [(END_OF_GOOD, c.end_of_good), (START_OF_BAD, c.start_of_bad)] {
            if !(value > 0.0 && value <= 1.0) {
                return Err(ShedConfigError::new(
                    ShedConfigErrorKind::ThresholdOutOfRange { value },
                    setting,
                ));
            }
        }
        if c.end_of_good >= c.start_of_bad {
            return Err(ShedConfigError::new(
                ShedConfigErrorKind::ThresholdsNotOrdered {
                    end_of_good: c.end_of_good,
                    start_of_bad: c.start_of_bad,
                },
                END_OF_GOOD,
            ));
        }
        for (setting, time) in [
            ("time_before_shedding", c.before_shedding),
            ("time_to_shed_all", c.to_shed_all),
        ] {
            if time.is_zero() {
                return Err(ShedConfigError::new(
                    ShedConfigErrorKind::ZeroDuration,
                    setting,
                ));
            }
        }
        Ok(c)
    }
}

const END_OF_GOOD: &str = "end_of_good_utilization";
const START_OF_BAD: &str = "start_of_bad_utilization";

/// A [`ShedConfig`] that cannot work: [what is wrong](Self::kind), and with which
/// [setting](Self::setting).
#[derive(Debug, Clone, PartialEq)]
pub struct ShedConfigError {
    kind: ShedConfigErrorKind,
    setting: &'static str,
}

impl ShedConfigError {
    fn new(kind: ShedConfigErrorKind, setting: &'static str) -> Self {
        ShedConfigError { kind, setting }
    }

    /// What is wrong.
    pub fn kind(&self) -> &ShedConfigErrorKind {
        &self.kind
    }

    /// The offending setting, named as its [`ShedConfigBuilder`] method:
    /// `"end_of_good_utilization"`, `"start_of_bad_utilization"`, `"time_before_shedding"` or
    /// `"time_to_shed_all"`. When the two thresholds are out of order, the end of good
    /// utilization (the one that must be below the other).
    pub fn setting(&self) -> &'static str {
        self.setting
    }
}

/// What is wrong with a [`ShedConfig`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ShedConfigErrorKind {
    /// A utilization threshold is not in (0, 1] (or is not a number).
    ThresholdOutOfRange {
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
    ZeroDuration,
}

impl fmt::Display for ShedConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let setting = self.setting;
        write!(f, "invalid load-shedding setting {setting}: ")?;
        match &self.kind {
            ShedConfigErrorKind::ThresholdOutOfRange { value } => {
                write!(f, "{value} is not in (0, 1]")
            }
            ShedConfigErrorKind::ThresholdsNotOrdered {
                end_of_good,
                start_of_bad,
            } => write!(
                f,
                "{end_of_good} must be below {START_OF_BAD} ({start_of_bad})"
            ),
            ShedConfigErrorKind::ZeroDuration => f.write_str("the duration must not be zero"),
        }
    }
}

impl std::error::Error for ShedConfigError {}

#[cfg(test)]
mod tests;

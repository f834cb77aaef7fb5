//! How important a request is, and how the shedding amount is spread over the classes.

use std::sync::Arc;

use crate::key::RequestView;

/// A request classifier, shared by the clones of a layer.
pub(super) type Classifier = Arc<dyn Fn(&RequestView<'_>) -> Priority + Send + Sync>;

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
    /// Its name in metrics and logs: `critical`, `high`, `normal`, `low`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Priority::Critical => "critical",
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Priority; 4] = [
        Priority::Critical,
        Priority::High,
        Priority::Normal,
        Priority::Low,
    ];

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

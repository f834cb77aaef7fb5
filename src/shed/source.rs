//! Where a utilization shedder reads how busy the process is.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// How busy the process is: 0 = idle, 1 = every worker busy.
///
/// How to measure this depends on the infrastructure (busy worker processes, in-flight
/// requests against a concurrency limit, a thread pool's queue). [`InFlight`] counts the
/// requests in flight through a [`UtilizationShedLayer`](super::UtilizationShedLayer);
/// closures `Fn() -> f64` work too.
///
/// The shedder clamps what it reads to [0, 1] and takes NaN as 0. It reads the source on
/// every decision, so a source should be cheap (read an atomic a sampler updates, rather
/// than sample on the spot).
pub trait UtilizationSource: Send + Sync {
    /// The current utilization, from 0 to 1.
    fn utilization(&self) -> f64;
}

impl<F> UtilizationSource for F
where
    F: Fn() -> f64 + Send + Sync,
{
    fn utilization(&self) -> f64 {
        self()
    }
}

/// The requests in flight against a capacity: `utilization = in flight / capacity`.
///
/// A cheap handle: clones share the count. A shedder reading it
/// ([`UtilizationShedder::in_flight`](super::UtilizationShedder::in_flight), or
/// [`UtilizationShedder::new`](super::UtilizationShedder::new) given an `InFlight`) under a
/// [`UtilizationShedLayer`](super::UtilizationShedLayer) is counted by the layer; elsewhere,
/// hold an [`InFlight::start`] guard for the duration of each request.
#[derive(Debug, Clone)]
pub struct InFlight {
    count: Arc<AtomicUsize>,
    capacity: usize,
}

impl InFlight {
    /// No requests in flight yet, out of `capacity` (a capacity of 0 counts as 1).
    pub fn new(capacity: usize) -> InFlight {
        InFlight {
            count: Arc::new(AtomicUsize::new(0)),
            capacity: capacity.max(1),
        }
    }

    /// Counts one more request in flight until the guard is dropped.
    pub fn start(&self) -> InFlightGuard {
        self.count.fetch_add(1, Ordering::Relaxed);
        InFlightGuard {
            count: self.count.clone(),
        }
    }

    /// How many requests are in flight.
    pub fn current(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// The capacity.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

impl UtilizationSource for InFlight {
    fn utilization(&self) -> f64 {
        self.current() as f64 / self.capacity as f64
    }
}

/// One request in flight, from [`InFlight::start`]; the count goes down when it is dropped.
#[derive(Debug)]
#[must_use = "the request stops being counted as soon as the guard is dropped"]
pub struct InFlightGuard {
    count: Arc<AtomicUsize>,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        // Never below zero, whatever happens.
        let _ = self
            .count
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_flight_counts_guards() {
        let f = InFlight::new(4);
        assert_eq!(f.utilization(), 0.0);
        let a = f.start();
        let b = f.clone().start();
        assert_eq!(f.current(), 2);
        assert_eq!(f.utilization(), 0.5);
        drop(a);
        assert_eq!(f.current(), 1);
        drop(b);
        assert_eq!(f.current(), 0);
        let zero = InFlight::new(0);
        assert_eq!(zero.capacity(), 1);
        let _g = zero.start();
        assert_eq!(zero.utilization(), 1.0);
    }

    #[test]
    fn closures_are_sources() {
        let source = || 0.25;
        assert_eq!(UtilizationSource::utilization(&source), 0.25);
    }
}

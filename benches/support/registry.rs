//! A `metrics` recorder that keeps its metrics in `metrics-util`'s registry of atomics, as an
//! exporter does (Prometheus's keeps them in the same registry, with the time of each update):
//! for the benches that measure a check with the `metrics` feature and a recorder installed.
//! Every registration looks its key up in the registry, as with any exporter.

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_util::registry::{AtomicStorage, Registry};

struct Registered(Registry<Key, AtomicStorage>);

impl Recorder for Registered {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.0
            .get_or_create_counter(key, |c| Counter::from_arc(c.clone()))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.0
            .get_or_create_gauge(key, |g| Gauge::from_arc(g.clone()))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.0
            .get_or_create_histogram(key, |h| Histogram::from_arc(h.clone()))
    }
}

/// Installs the registry as the process's recorder.
pub fn install() {
    if metrics::set_global_recorder(Registered(Registry::atomic())).is_err() {
        eprintln!("a recorder was installed already");
    }
}

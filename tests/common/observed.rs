//! What tollgate reports, recorded for the tests that check it: a `metrics` recorder that
//! keeps every value, and a `tracing` subscriber writing to a buffer. Installed once per test
//! binary (a process has one of each); tests tell their figures apart by limiter names and
//! store prefixes. Included by the binaries that need the `metrics` and `tracing` features.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};

/// A `metrics` recorder that keeps every counter's total, every gauge's value and every
/// histogram's sample count, by name and labels.
#[derive(Clone, Default)]
pub struct Recorded(pub Arc<Mutex<HashMap<Key, f64>>>);

struct Handle {
    key: Key,
    values: Recorded,
}

impl Handle {
    fn update(&self, f: impl FnOnce(&mut f64)) {
        f(self
            .values
            .0
            .lock()
            .unwrap()
            .entry(self.key.clone())
            .or_insert(0.0));
    }
}

impl CounterFn for Handle {
    fn increment(&self, value: u64) {
        self.update(|v| *v += value as f64);
    }
    fn absolute(&self, value: u64) {
        self.update(|v| *v = value as f64);
    }
}

impl GaugeFn for Handle {
    fn increment(&self, value: f64) {
        self.update(|v| *v += value);
    }
    fn decrement(&self, value: f64) {
        self.update(|v| *v -= value);
    }
    fn set(&self, value: f64) {
        self.update(|v| *v = value);
    }
}

impl HistogramFn for Handle {
    fn record(&self, _: f64) {
        self.update(|v| *v += 1.0);
    }
}

impl Recorded {
    fn handle(&self, key: &Key) -> Arc<Handle> {
        Arc::new(Handle {
            key: key.clone(),
            values: self.clone(),
        })
    }
}

/// The descriptions given to the recorder: by metric name, its unit and help text.
type Descriptions = Mutex<HashMap<String, (Option<Unit>, String)>>;

fn descriptions() -> &'static Descriptions {
    static DESCRIBED: OnceLock<Descriptions> = OnceLock::new();
    DESCRIBED.get_or_init(Mutex::default)
}

fn describe(name: KeyName, unit: Option<Unit>, help: SharedString) {
    let described = (unit, help.into_owned());
    descriptions()
        .lock()
        .unwrap()
        .insert(name.as_str().to_string(), described);
}

/// The unit and help text the metric `name` was described with, if it was.
pub fn described(name: &str) -> Option<(Option<Unit>, String)> {
    descriptions().lock().unwrap().get(name).cloned()
}

impl Recorder for Recorded {
    fn describe_counter(&self, name: KeyName, unit: Option<Unit>, help: SharedString) {
        describe(name, unit, help);
    }
    fn describe_gauge(&self, name: KeyName, unit: Option<Unit>, help: SharedString) {
        describe(name, unit, help);
    }
    fn describe_histogram(&self, name: KeyName, unit: Option<Unit>, help: SharedString) {
        describe(name, unit, help);
    }
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.handle(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.handle(key))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.handle(key))
    }
}

/// The process's recorder and log, installed once for the whole test binary. Each test uses
/// its own limiter names and store prefixes, so its figures are its own.
pub struct Observed {
    pub metrics: Recorded,
    pub log: Arc<Mutex<Vec<u8>>>,
}

#[derive(Clone)]
struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub fn observed() -> &'static Observed {
    static OBSERVED: OnceLock<Observed> = OnceLock::new();
    OBSERVED.get_or_init(|| {
        let metrics = Recorded::default();
        metrics::set_global_recorder(metrics.clone()).unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let writer = LogWriter(log.clone());
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
        Observed { metrics, log }
    })
}

/// The value of the metric `name` summed over the label sets that include every
/// `(key, value)` of `labels`.
pub fn metric(name: &str, labels: &[(&str, &str)]) -> f64 {
    observed()
        .metrics
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|(key, _)| {
            key.name() == name
                && labels
                    .iter()
                    .all(|(k, v)| key.labels().any(|l| l.key() == *k && l.value() == *v))
        })
        .map(|(_, value)| value)
        .sum()
}

/// Everything logged so far.
pub fn log_text() -> String {
    String::from_utf8_lossy(&observed().log.lock().unwrap()).into_owned()
}

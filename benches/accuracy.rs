//! How far each algorithm strays from "at most N in any window of length W".
//!
//! `cargo bench --bench accuracy` drives the same arrival sequences through every algorithm
//! (memory store, manual clock: deterministic) and prints, per traffic pattern, the most
//! requests admitted in any rolling window, as a multiple of N, and how many were admitted in
//! all, relative to the exact sliding log. A second table judges every decision against an
//! exact rolling window over what the algorithm itself admitted before: an over-admission is a
//! request admitted although the window `(t - W, t]` already held N, an under-admission one
//! denied although it had room.

use std::collections::HashMap;
use std::time::Duration;

use tollgate::{Clock, Limiter, ManualClock, MemoryStore};

const N: u64 = 100;
const W_US: u64 = 1_000_000;
const START: u64 = 1_767_225_600_000_000; // aligned to every window

/// One arrival: its time (µs offset from START) and its identifier.
type Arrival = (u64, u32);

/// Arrivals in time order.
fn patterns() -> Vec<(&'static str, Vec<Arrival>)> {
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut poisson = |rate_per_s: f64, seconds: u64| {
        let mut t = 0f64;
        let mut out = Vec::new();
        loop {
            let u = (next() >> 11) as f64 / (1u64 << 53) as f64;
            t += -(1.0 - u).ln() / rate_per_s * 1e6;
            if t >= (seconds * 1_000_000) as f64 {
                return out;
            }
            out.push(t as u64);
        }
    };
    let steady = poisson(150.0, 60);
    let heavy = poisson(500.0, 60);
    // N requests in the last millisecond of every window, N in the first of the next.
    let edges: Vec<u64> = (1..60)
        .flat_map(|s| {
            let end = s * W_US;
            (0..N)
                .map(move |k| end - 1000 + k)
                .chain((0..N).map(move |k| end + k))
        })
        .collect();
    // bursts of 3N every 1.7 windows
    let bursts: Vec<u64> = (0..35)
        .flat_map(|b| (0..3 * N).map(move |k| b * 1_700_000 + k * 10))
        .collect();
    // The sliding counter's worst case: N bunched at the end of a window, then a steady
    // stream through the next one, which the counter believes evenly spread.
    let worst: Vec<u64> = (0..20)
        .flat_map(|s| {
            let end = (2 * s + 1) * W_US;
            (0..N)
                .map(move |k| end - 100 + k)
                .chain((0..1000).map(move |k| end + k * 1000))
        })
        .collect();
    // on/off sources over 200 identifiers: bursts at 3N/W lasting a Pareto time (mean 0.6 s,
    // heavy-tailed), then Pareto silences (mean 6 s)
    let mut pareto = |xm: f64, alpha: f64| {
        let u = ((next() >> 11) + 1) as f64 / (1u64 << 53) as f64;
        xm / u.powf(1.0 / alpha)
    };
    let mut on_off: Vec<Arrival> = Vec::new();
    for key in 0..200u32 {
        let mut t = 0f64;
        while t < 120e6 {
            let end = t + pareto(0.2e6, 1.5);
            while t < end && t < 120e6 {
                on_off.push((t as u64, key));
                t += 1e6 / (3 * N) as f64;
            }
            t = end.max(t) + pareto(1e6, 1.2);
        }
    }
    on_off.sort_unstable();
    let one = |v: Vec<u64>| v.into_iter().map(|t| (t, 0)).collect::<Vec<Arrival>>();
    vec![
        ("poisson 1.5N/W", one(steady)),
        ("poisson 5N/W", one(heavy)),
        ("N at each window edge", one(edges)),
        ("bursts of 3N", one(bursts)),
        ("N at an end, then 1/ms", one(worst)),
        ("on/off, 200 keys", on_off),
    ]
}

/// The most admitted by one identifier in any rolling window (t - W, t].
fn max_in_window(admitted: &HashMap<u32, Vec<u64>>) -> usize {
    let mut best = 0;
    for times in admitted.values() {
        let mut lo = 0;
        for hi in 0..times.len() {
            while times[hi] - times[lo] >= W_US {
                lo += 1;
            }
            best = best.max(hi - lo + 1);
        }
    }
    best
}

/// What one algorithm did with one pattern.
struct Run {
    /// Admitted times per identifier.
    admitted: HashMap<u32, Vec<u64>>,
    decisions: u64,
    /// Admitted although the exact window over the algorithm's own admissions was full.
    over: u64,
    /// Denied although it had room.
    under: u64,
}

impl Run {
    fn total(&self) -> usize {
        self.admitted.values().map(Vec::len).sum()
    }
}

async fn run(policy: &str, arrivals: &[Arrival]) -> Run {
    let clock = ManualClock::new(START);
    let store = MemoryStore::builder()
        .clock(Clock::Manual(clock.clone()))
        .build();
    let limiter = Limiter::new(store, policy.parse().unwrap());
    let mut out = Run {
        admitted: HashMap::new(),
        decisions: 0,
        over: 0,
        under: 0,
    };
    let mut now = 0;
    for &(t, key) in arrivals {
        clock.advance(Duration::from_micros(t - now));
        now = t;
        let id = key.to_string();
        let allowed = limiter.check(&[&id]).await.unwrap().is_allowed();
        let mine = out.admitted.entry(key).or_default();
        let from = mine.partition_point(|&a| a + W_US <= t);
        let room = ((mine.len() - from) as u64) < N;
        out.decisions += 1;
        if allowed {
            out.over += u64::from(!room);
            mine.push(t);
        } else {
            out.under += u64::from(room);
        }
    }
    out
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let algorithms = [
        ("log", format!("{N}/s log")),
        ("rolling", format!("{N}/s rolling")),
        ("sliding", format!("{N}/s sliding")),
        ("fixed", format!("{N}/s fixed")),
        ("gcra", format!("{N}/s gcra")),
    ];
    let mut runs = Vec::new();
    for (pattern, arrivals) in patterns() {
        let mut row = Vec::new();
        for (_, policy) in &algorithms {
            row.push(run(policy, &arrivals).await);
        }
        runs.push((pattern, row));
    }

    println!("limit {N} per 1 s; max = most admitted in any 1 s window, as a multiple of {N}");
    println!("admitted = total admitted relative to the exact sliding log\n");
    print!("{:<24}", "traffic");
    for (name, _) in &algorithms {
        print!(" {:>18}", name);
    }
    println!();
    for (pattern, row) in &runs {
        let exact = row[0].total() as f64;
        print!("{pattern:<24}");
        for r in row {
            let max = max_in_window(&r.admitted) as f64 / N as f64;
            let ratio = r.total() as f64 / exact;
            print!(" {:>18}", format!("max {max:.2} / {ratio:.3}"));
        }
        println!();
    }

    println!("\nwrong decisions against an exact 1 s window over the algorithm's own admissions,");
    println!("in % of decisions: over-admitted / under-admitted\n");
    print!("{:<24}", "traffic");
    for (name, _) in &algorithms {
        print!(" {:>18}", name);
    }
    println!();
    for (pattern, row) in &runs {
        print!("{pattern:<24}");
        for r in row {
            let pct = |k: u64| 100.0 * k as f64 / r.decisions as f64;
            print!(
                " {:>18}",
                format!("{:.2} / {:.2}", pct(r.over), pct(r.under))
            );
        }
        println!();
    }
}

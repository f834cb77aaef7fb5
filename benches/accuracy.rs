//! How far each algorithm strays from "at most N in any window of length W".
//!
//! `cargo bench --bench accuracy` drives the same arrival sequences through every algorithm
//! (memory store, manual clock: deterministic) and prints, per traffic pattern, the most
//! requests admitted in any rolling window, as a multiple of N, and how many were admitted in
//! all, relative to the exact sliding log.

use std::time::Duration;

use tollgate::{Clock, Limiter, ManualClock, MemoryStore};

const N: u64 = 100;
const W_US: u64 = 1_000_000;
const START: u64 = 1_767_225_600_000_000; // aligned to every window

/// Arrival times (µs offsets from START), ascending.
fn patterns() -> Vec<(&'static str, Vec<u64>)> {
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
    vec![
        ("poisson 1.5N/W", steady),
        ("poisson 5N/W", heavy),
        ("N at each window edge", edges),
        ("bursts of 3N", bursts),
        ("N at an end, then 1/ms", worst),
    ]
}

/// The most admitted in any rolling window (t - W, t].
fn max_in_window(admitted: &[u64]) -> usize {
    let mut best = 0;
    let mut lo = 0;
    for hi in 0..admitted.len() {
        while admitted[hi] - admitted[lo] >= W_US {
            lo += 1;
        }
        best = best.max(hi - lo + 1);
    }
    best
}

async fn run(policy: &str, arrivals: &[u64]) -> Vec<u64> {
    let clock = ManualClock::new(START);
    let store = MemoryStore::builder()
        .clock(Clock::Manual(clock.clone()))
        .build();
    let limiter = Limiter::new(store, policy.parse().unwrap());
    let mut admitted = Vec::new();
    let mut now = 0;
    for &t in arrivals {
        clock.advance(Duration::from_micros(t - now));
        now = t;
        if limiter.check(&["k"]).await.unwrap().is_allowed() {
            admitted.push(t);
        }
    }
    admitted
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let algorithms = [
        ("log", format!("{N}/s log")),
        ("sliding", format!("{N}/s")),
        ("fixed", format!("{N}/s fixed")),
        ("gcra", format!("{N}/s gcra")),
    ];
    println!("limit {N} per 1 s; max = most admitted in any 1 s window, as a multiple of {N}");
    println!("admitted = total admitted relative to the exact sliding log\n");
    print!("{:<24}", "traffic");
    for (name, _) in &algorithms {
        print!(" {:>18}", name);
    }
    println!();
    for (pattern, arrivals) in patterns() {
        let exact = run(&algorithms[0].1, &arrivals).await.len() as f64;
        print!("{pattern:<24}");
        for (_, policy) in &algorithms {
            let admitted = run(policy, &arrivals).await;
            let max = max_in_window(&admitted) as f64 / N as f64;
            let ratio = admitted.len() as f64 / exact;
            print!(" {:>18}", format!("max {max:.2} / {ratio:.3}"));
        }
        println!();
    }
}

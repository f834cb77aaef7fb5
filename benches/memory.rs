//! The memory store's hot path next to `governor`'s keyed limiter, measured in the same run.
//!
//! `cargo bench --bench memory [-- --iters N] [--rounds R] [--only TEXT] [--svg FILE]` (`--svg`:
//! also draws the table as a bar chart into FILE; `--only`: the rows
//! whose name holds TEXT, e.g. `--only "hot key, 1 thread"`, or with `=` the row named TEXT
//! alone, e.g. `--only "=1 limit, hot key, 1 thread"`, for a profiler; `--rounds`: each row runs governor
//! and tollgate in turns R times, default 3, and keeps each side's best time, so that a burst
//! of load from elsewhere on a shared machine weighs on one round rather than on the ratio).
//! With the `metrics` feature, `--recorder` installs a recorder first (`metrics-util`'s
//! registry, which exporters keep their metrics in): tollgate's checks then count their
//! decisions, as they do in a service that exports its metrics.
//!
//! Each row runs the same keys through `governor` (`DefaultKeyedRateLimiter<String>`; for the
//! three-limit policy, three limiters checked in sequence, stopping at the first refusal) and
//! through `Limiter::check` on a `MemoryStore`, awaited on a current-thread runtime. The
//! "1 limit" rows check tollgate's default algorithm (a rolling window), the "1 limit gcra"
//! rows the one governor runs (GCRA, of the same quota and burst). The
//! "ip + user" rows check two identifiers a request (tollgate: both in one all-or-nothing
//! check; governor: each limiter for the IP, then for the user, stopping at the first
//! refusal). With 2
//! threads, each thread runs its own loop on the shared limiter; "ns" is then the wall time
//! from the first thread's start to the last one's end (each thread reads the clock itself),
//! divided by the checks of one thread (the latency each thread sees). Allocations are counted
//! by a global allocator over the whole timed loop (every thread), divided by all checks.

use std::num::NonZeroU32;
use std::sync::Barrier;
use std::time::Instant;

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use tollgate::{Limiter, MemoryStore};

#[path = "support/chart.rs"]
mod chart;
#[path = "support/counting.rs"]
mod counting;
#[cfg(feature = "metrics")]
#[path = "support/registry.rs"]
mod registry;

const KEYS: usize = 100_000;

/// ns per check (per thread) and allocations per check.
#[derive(Clone, Copy)]
struct Figures {
    ns: f64,
    allocs: f64,
}

impl Figures {
    const WORST: Figures = Figures {
        ns: f64::INFINITY,
        allocs: 0.0,
    };

    /// The faster of two rounds (allocations: the most either made).
    fn best(self, other: Figures) -> Figures {
        Figures {
            ns: self.ns.min(other.ns),
            allocs: self.allocs.max(other.allocs),
        }
    }
}

/// Runs `check(thread, i)` for `i` in `0..iters` on `threads` threads at once.
fn run<F>(threads: usize, iters: usize, check: F) -> Figures
where
    F: Fn(usize, usize) + Sync,
{
    let barrier = Barrier::new(threads + 1);
    // Each thread times its own loop, and the run is from the first start to the last end:
    // timed from the main thread, a run looked shorter whenever that thread, a third on two
    // cores, was scheduled late after releasing the others.
    let (elapsed, allocs) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, check) = (&barrier, &check);
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    for i in 0..iters {
                        check(t, i);
                    }
                    (start, Instant::now())
                })
            })
            .collect();
        let before = counting::allocations();
        barrier.wait();
        let (mut first, mut last) = (None::<Instant>, None::<Instant>);
        for handle in handles {
            let Ok((start, end)) = handle.join() else {
                panic!("a checking thread panicked");
            };
            first = Some(first.map_or(start, |f| f.min(start)));
            last = Some(last.map_or(end, |l| l.max(end)));
        }
        let allocs = counting::allocations() - before;
        let elapsed = match (first, last) {
            (Some(first), Some(last)) => last.duration_since(first),
            _ => std::time::Duration::ZERO,
        };
        (elapsed, allocs)
    });
    Figures {
        ns: elapsed.as_nanos() as f64 / iters as f64,
        allocs: allocs as f64 / (threads * iters) as f64,
    }
}

/// The key thread `t` checks at step `i`: one hot key, or one of 100k.
fn key_index(spread: bool, t: usize, i: usize) -> usize {
    if spread {
        (i * 7919 + t * (KEYS / 2)) % KEYS
    } else {
        0
    }
}

fn governor_limiters(reference: bool) -> Vec<DefaultKeyedRateLimiter<String>> {
    let n = |v: u32| NonZeroU32::new(v).unwrap_or(NonZeroU32::MIN);
    if reference {
        vec![
            RateLimiter::keyed(Quota::per_second(n(10))),
            RateLimiter::keyed(Quota::per_minute(n(120))),
            RateLimiter::keyed(Quota::per_hour(n(240))),
        ]
    } else {
        vec![RateLimiter::keyed(Quota::per_second(n(100)))]
    }
}

fn main() {
    let mut iters = 1_000_000usize;
    let mut rounds = 3usize;
    let mut only = String::new();
    let mut svg = None;
    let recorder = std::env::args().any(|a| a == "--recorder");
    if recorder {
        install_recorder();
    }
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--iters" {
            iters = args.next().and_then(|v| v.parse().ok()).unwrap_or(iters);
        } else if a == "--rounds" {
            rounds = args
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(rounds)
                .max(1);
        } else if a == "--only" {
            only = args.next().unwrap_or_default();
        } else if a == "--svg" {
            svg = args.next();
        }
    }
    let keys: Vec<String> = (0..KEYS)
        .map(|i| format!("ip:10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255))
        .collect();
    let users: Vec<String> = (0..KEYS).map(|i| format!("user:{i}")).collect();

    println!(
        "{iters} checks per thread per round, best of {rounds} rounds; ns = per check per \
         thread; ratio = tollgate / governor{}\n",
        if recorder {
            "; tollgate counts its decisions in a metrics recorder"
        } else {
            ""
        }
    );
    println!(
        "{:<46} {:>9} {:>9} {:>7} {:>10} {:>10}",
        "scenario", "governor", "tollgate", "ratio", "gov alloc", "tg alloc"
    );
    let mut chart = chart::Chart {
        title: format!(
            "The memory store next to governor: ns per check (lower is better){}",
            if recorder { ", metrics recorded" } else { "" }
        ),
        unit: "ns",
        series: vec!["governor", "tollgate"],
        note_title: "tollgate / governor",
        rows: Vec::new(),
    };
    // (the IP and the user of each request: over 100k keys only)
    let shapes = [(false, false), (true, false), (true, true)];
    let mut ran = 0;
    // The default (a rolling window), the algorithm governor runs (GCRA: the same quota and
    // burst as governor's `per_second(100)`), and the reference policy.
    let policies = [
        ("1 limit", false, "100/s"),
        ("1 limit gcra", false, "100/s gcra"),
        ("3 limits", true, "10/s, 120/min, 240/h"),
    ];
    for (label, reference, policy) in policies {
        for (spread, pair) in shapes {
            for threads in [1, 2] {
                let name = format!(
                    "{label}, {}{}, {} thread{}",
                    if spread { "100k keys" } else { "hot key" },
                    if pair { ", ip + user" } else { "" },
                    threads,
                    if threads > 1 { "s" } else { "" },
                );
                let runs = match only.strip_prefix('=') {
                    Some(exact) => name == exact,
                    None => name.contains(only.as_str()),
                };
                if !runs {
                    continue;
                }
                ran += 1;
                let limiters = governor_limiters(reference);
                let ids = Ids {
                    keys: &keys,
                    users: pair.then_some(&users[..]),
                    spread,
                };
                // governor: each limiter for the IP, then for the user, stopping at the first
                // refusal (it has no all-or-nothing check of two keys)
                let governor_check = |t: usize, i: usize| {
                    let (ip, user) = ids.of(t, i);
                    for l in &limiters {
                        if l.check_key(ip).is_err() || user.is_some_and(|u| l.check_key(u).is_err())
                        {
                            break;
                        }
                    }
                };
                // Warm-up: every key exists before the timed loop.
                for i in 0..KEYS.min(iters) {
                    governor_check(0, i);
                    governor_check(1, i);
                }
                let limiter = Limiter::new(MemoryStore::new(), policy.parse().expect("policy"));
                warm_up(&limiter, &ids, iters);
                let (mut g, mut t) = (Figures::WORST, Figures::WORST);
                for _ in 0..rounds {
                    g = g.best(run(threads, iters, governor_check));
                    t = t.best(run_tollgate(&limiter, &ids, threads, iters));
                }

                println!(
                    "{:<46} {:>9.0} {:>9.0} {:>7.2} {:>10.2} {:>10.2}",
                    name,
                    g.ns,
                    t.ns,
                    t.ns / g.ns,
                    g.allocs,
                    t.allocs
                );
                chart.rows.push(chart::Row {
                    label: name,
                    values: vec![Some(g.ns), Some(t.ns)],
                    note: format!("{:.2}", t.ns / g.ns),
                });
            }
        }
    }
    if ran == 0 {
        // (a profile of a run that checked nothing would count the set-up alone)
        eprintln!("no row is named like {only:?}");
        std::process::exit(2);
    }
    if let Some(path) = svg {
        chart.write(&path);
    }
}

/// Installs a recorder of the `metrics` feature's counts (`--recorder`).
#[cfg(feature = "metrics")]
fn install_recorder() {
    registry::install();
}

#[cfg(not(feature = "metrics"))]
fn install_recorder() {
    eprintln!("--recorder needs the `metrics` feature (cargo bench --features metrics)");
    std::process::exit(2);
}

/// The identifiers of a row's checks: an IP, and with `users` a user too.
#[derive(Clone, Copy)]
struct Ids<'a> {
    keys: &'a [String],
    users: Option<&'a [String]>,
    spread: bool,
}

impl<'a> Ids<'a> {
    /// The IP and the user thread `t` checks at step `i`.
    fn of(&self, t: usize, i: usize) -> (&'a String, Option<&'a String>) {
        let k = key_index(self.spread, t, i);
        // each IP with a user of its own, not in the same order
        let user = self.users.map(|u| &u[(k * 31 + 7) % KEYS]);
        (&self.keys[k], user)
    }

    /// `Limiter::check` of the identifiers of thread `t`'s step `i`.
    async fn check(&self, limiter: &Limiter, t: usize, i: usize) {
        let _ = match self.of(t, i) {
            (ip, Some(user)) => limiter.check(&[ip, user]).await,
            (ip, None) => limiter.check(&[ip]).await,
        };
    }
}

/// Every key of a row checked once by each thread's sequence, before the timed loops.
fn warm_up(limiter: &Limiter, ids: &Ids<'_>, iters: usize) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        for t in 0..2 {
            for i in 0..KEYS.min(iters) {
                ids.check(limiter, t, i).await;
            }
        }
    });
}

/// Tollgate's side of a row: each thread drives its checks from one current-thread runtime,
/// awaiting `Limiter::check` in a loop.
fn run_tollgate(limiter: &Limiter, ids: &Ids<'_>, threads: usize, iters: usize) -> Figures {
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    };
    let runtimes: Vec<_> = (0..threads).map(|_| runtime()).collect();
    let barrier = Barrier::new(threads + 1);
    let (started, before) = std::thread::scope(|s| {
        for (t, rt) in runtimes.iter().enumerate() {
            let barrier = &barrier;
            s.spawn(move || {
                rt.block_on(async {
                    barrier.wait();
                    for i in 0..iters {
                        ids.check(limiter, t, i).await;
                    }
                })
            });
        }
        let before = counting::allocations();
        barrier.wait();
        (Instant::now(), before)
    });
    let elapsed = started.elapsed();
    let allocs = counting::allocations() - before;
    Figures {
        ns: elapsed.as_nanos() as f64 / iters as f64,
        allocs: allocs as f64 / (threads * iters) as f64,
    }
}

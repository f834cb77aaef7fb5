//! Allocations of a steady-state check on the memory store, counted by a global allocator.
//!
//! Once a key exists (and the thread has checked once), a `Limiter::check` of it allocates
//! nothing, allowed or denied, for one limit, for a three-limit policy and for a policy of
//! several keys per identifier, of one identifier or two, with the `metrics` feature or
//! without (the keys of what a check counts are built with the limiter).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

mod common;
#[path = "../benches/support/slowlog.rs"]
mod slowlog;

use common::{unique_prefix, RedisServer};
use tollgate::{Limiter, MemoryStore, Origin, RedisStore};

/// Counts the allocations (and reallocations) of the thread that asked to be counted.
struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

fn note() {
    // `try_with`: the allocator may run while the thread's locals are torn down.
    let _ = COUNTING.try_with(|on| {
        if on.get() {
            let _ = COUNT.try_with(|c| c.set(c.get() + 1));
        }
    });
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The runtime the checks run on: one thread, the one that counts.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Allocations per check of `rounds` checks of `ids` by a limiter in `namespace` (none: the
/// store's shared space), after a warm-up, and how many of them were allowed.
fn per_check(policy: &str, namespace: Option<&str>, ids: &[&str], rounds: u64) -> (f64, u64) {
    let rt = runtime();
    let mut limiter = Limiter::builder(MemoryStore::new(), policy.parse().unwrap());
    if let Some(namespace) = namespace {
        limiter = limiter.namespace(namespace.parse().unwrap());
    }
    let limiter = limiter.build();
    rt.block_on(async {
        for _ in 0..3 {
            let _ = limiter.check(ids).await.unwrap();
        }
        COUNT.with(|c| c.set(0));
        COUNTING.with(|c| c.set(true));
        let mut allowed = 0;
        for _ in 0..rounds {
            let decision = limiter.check(ids).await.unwrap();
            allowed += u64::from(decision.is_allowed());
        }
        COUNTING.with(|c| c.set(false));
        (COUNT.with(Cell::get) as f64 / rounds as f64, allowed)
    })
}

#[test]
fn a_steady_check_of_an_existing_key_allocates_nothing() {
    for (policy, rounds, allowed) in [
        // always allowed
        ("1000000/s", 1000, 1000),
        // (a GCRA state expires one emission interval after its check when the checks come
        // slower than that: at 1,000,000/s every check would start a fresh state, at /min a
        // check slower than 60 µs would; at /h each check puts it 3.6 ms further ahead)
        ("1000000/h gcra", 1000, 1000),
        ("1000000/s, 10000000/min, 50000000/h", 1000, 1000),
        // denied after the warm-up: a denial costs no more
        ("3/h", 1000, 0),
        ("10/s, 120/min, 240/h", 1000, 7),
        // an identifier of several keys (a sliding log next to window limits)
        ("1000000/s, 3/h log", 1000, 0),
    ] {
        // a limiter of its own namespace costs no more, nor does a second identifier (the
        // IP and the user)
        for namespace in [None, Some("login")] {
            for ids in [&["ip:203.0.113.9"][..], &["ip:203.0.113.9", "user:42"]] {
                let (allocs, admitted) = per_check(policy, namespace, ids, rounds);
                assert_eq!(admitted, allowed, "{policy} in {namespace:?} for {ids:?}");
                assert!(
                    allocs == 0.0,
                    "{policy} in {namespace:?} for {ids:?}: {allocs} allocations per check, \
                     expected none"
                );
            }
        }
    }
}

#[test]
fn decisions_held_a_few_at_a_time_allocate_nothing_once_warm() {
    // A service answering several requests at once on one thread holds their decisions
    // together: their status buffers come back when they are dropped and serve the next ones.
    // Up to eight buffers are kept; each round here holds eight decisions at once.
    let rt = runtime();
    let limiter = Limiter::new(
        MemoryStore::new(),
        "1000000/s, 10000000/min, 50000000/h".parse().unwrap(),
    );
    rt.block_on(async {
        let mut held = Vec::with_capacity(8);
        for round in 0..4 {
            // two rounds to warm up, two counted
            if round == 2 {
                COUNT.with(|c| c.set(0));
                COUNTING.with(|c| c.set(true));
            }
            for _ in 0..8 {
                held.push(limiter.check(&["ip:203.0.113.9"]).await.unwrap());
            }
            held.clear();
        }
        COUNTING.with(|c| c.set(false));
    });
    let allocs = COUNT.with(Cell::get);
    assert_eq!(
        allocs, 0,
        "{allocs} allocations in two rounds of eight decisions held"
    );
}

#[test]
fn the_count_sees_allocations() {
    // the counter itself works: a check of a new key too long to be kept in its slot of the
    // store's table allocates the key
    let rt = runtime();
    let limiter = Limiter::new(MemoryStore::new(), "10/s".parse().unwrap());
    let ids: Vec<String> = (0..100).map(|i| format!("new:{i:0>60}")).collect();
    let count = rt.block_on(async {
        let _ = limiter.check(&["warm"]).await.unwrap();
        COUNT.with(|c| c.set(0));
        COUNTING.with(|c| c.set(true));
        for id in &ids {
            let _ = limiter.check(&[id]).await.unwrap();
        }
        COUNTING.with(|c| c.set(false));
        COUNT.with(Cell::get)
    });
    assert!(count >= 100, "{count}");
}

/// Allocations per call of `call`, run `rounds` times after three warm-up calls, on this
/// thread (the runtime is current-thread: the connection's driver runs here too).
async fn count_per_call<F, Fut>(rounds: u64, mut call: F) -> f64
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for _ in 0..3 {
        call().await;
    }
    COUNT.with(|c| c.set(0));
    COUNTING.with(|c| c.set(true));
    for _ in 0..rounds {
        call().await;
    }
    COUNTING.with(|c| c.set(false));
    COUNT.with(Cell::get) as f64 / rounds as f64
}

/// A check on Redis allocates no more than the `redis` crate needs to make the same call
/// itself: the `EVALSHA` the limiter sends (captured from `SLOWLOG`), sent on a multiplexed
/// connection of the crate's own and read as a `redis::Value`, with the `metrics` feature or
/// without. Per call counts are averages over the rounds: the runtime's own occasional
/// allocations (its timer wheel, the connection's buffers) add a few hundredths, to either
/// side.
#[test]
fn a_redis_check_allocates_no_more_than_its_call() {
    let server = RedisServer::start();
    let rt = runtime();
    rt.block_on(async {
        for (policy, ids) in [
            ("1000000/s", &["ip:203.0.113.9"][..]),
            (
                "1000000/s, 10000000/min, 50000000/h",
                &["ip:203.0.113.9", "user:42"][..],
            ),
        ] {
            let mut admin = server.conn();
            let _: () = redis::cmd("CONFIG")
                .arg(&["SET", "slowlog-log-slower-than", "0"])
                .query(&mut admin)
                .unwrap();
            let _: () = redis::cmd("SLOWLOG")
                .arg("RESET")
                .query(&mut admin)
                .unwrap();
            let store = RedisStore::builder(server.url())
                .prefix(unique_prefix())
                .build()
                .await
                .unwrap();
            let limiter = Limiter::builder(store, policy.parse().unwrap())
                .deny_cache(0)
                .build();
            assert!(limiter.check(ids).await.unwrap().is_allowed());
            let log: Vec<Vec<redis::Value>> = redis::cmd("SLOWLOG")
                .arg(&["GET", "100"])
                .query(&mut admin)
                .unwrap();
            let call: Vec<String> =
                slowlog::newest_evalsha(&log).expect("the check's EVALSHA in SLOWLOG");
            let _: () = redis::cmd("CONFIG")
                .arg(&["SET", "slowlog-log-slower-than", "10000"])
                .query(&mut admin)
                .unwrap();

            let client = redis::Client::open(server.url()).unwrap();
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            let raw = count_per_call(200, || {
                let mut conn = conn.clone();
                let call = &call;
                async move {
                    let _: redis::Value = redis::cmd("EVALSHA")
                        .arg(&call[1..])
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                }
            })
            .await;
            let _ = &mut conn;
            let tollgate = count_per_call(200, || async {
                assert!(limiter.check(ids).await.unwrap().is_allowed());
            })
            .await;
            println!(
                "{policy} x {}: redis crate {raw}, tollgate {tollgate}",
                ids.len()
            );
            assert!(
                tollgate <= raw + 0.05,
                "{policy} x {}: {tollgate} allocations per check, the call alone {raw}",
                ids.len()
            );
        }
    });
}

/// A denial the deny cache answers (a client flooding a limit on Redis) allocates nothing: no
/// call is made, and the decision's buffer is one reused from the thread's earlier decisions.
#[test]
fn a_denial_from_the_deny_cache_allocates_nothing() {
    let server = RedisServer::start();
    let rt = runtime();
    rt.block_on(async {
        let store = RedisStore::builder(server.url())
            .prefix(unique_prefix())
            .build()
            .await
            .unwrap();
        let limiter = Limiter::new(store, "1/h, 10/d".parse().unwrap());
        for ids in [&["ip:203.0.113.9"][..], &["ip:203.0.113.10", "user:42"]] {
            // admitted, then denied by the store, which the cache remembers
            assert!(limiter.check(ids).await.unwrap().is_allowed());
            assert!(!limiter.check(ids).await.unwrap().is_allowed());
            let cached = count_per_call(200, || async {
                let decision = limiter.check(ids).await.unwrap();
                assert_eq!(decision.origin(), Origin::DenyCache);
            })
            .await;
            assert!(
                cached <= 0.05,
                "{ids:?}: {cached} allocations per denial from the deny cache"
            );
        }
    });
}

/// A check the failure policy answers while the store is down allocates no more than the
/// remote check's boxed future: the store's failure is counted under a key built with the
/// store, with the `metrics` feature or without.
#[test]
fn a_check_answered_while_the_store_is_down_allocates_only_its_future() {
    let rt = runtime();
    rt.block_on(async {
        let dead = common::dead_url();
        let store = RedisStore::builder(dead)
            .prefix(unique_prefix())
            .timeout(std::time::Duration::from_millis(100))
            .build_lazy()
            .unwrap();
        let limiter = Limiter::builder(store, "10/s".parse().unwrap())
            .on_store_error(tollgate::OnStoreError::Open)
            .build();
        // the first failures open the store's breaker; from then on it answers at once
        for _ in 0..50 {
            let decision = limiter.check(&["ip:203.0.113.9"]).await.unwrap();
            assert_eq!(decision.origin(), Origin::FailOpen);
        }
        // The least of five windows: the store's attempts to reconnect run on this thread
        // too, and one falls in one window at most.
        let mut answered = f64::INFINITY;
        for _ in 0..5 {
            let window = count_per_call(200, || async {
                let decision = limiter.check(&["ip:203.0.113.9"]).await.unwrap();
                assert_eq!(decision.origin(), Origin::FailOpen);
            })
            .await;
            answered = answered.min(window);
        }
        assert!(
            answered <= 1.02,
            "{answered} allocations per check answered by the failure policy"
        );
    });
}

/// The client's address read through trusted proxies from an RFC 7239 `Forwarded` header
/// allocates nothing: its elements and parameters are split where they lie, and a quoted
/// node without escapes (an IPv6 address, which must be quoted) is read in place.
#[test]
fn the_client_ip_from_forwarded_allocates_nothing() {
    use std::net::{IpAddr, SocketAddr};
    use tollgate::key::{ClientIp, IpCidr, RequestView};

    let client_ip = ClientIp::trusted_proxies(["10.0.0.0/8".parse::<IpCidr>().unwrap()]);
    let mut req = http::Request::builder()
        .header(
            "forwarded",
            r#"for=198.51.100.1;proto=https, for="[2001:db8::17]:4711";by=_edge, for=10.0.0.3"#,
        )
        .body(())
        .unwrap();
    req.extensions_mut()
        .insert("10.0.0.2:41000".parse::<SocketAddr>().unwrap());
    let view = RequestView::of(&req);
    let client: IpAddr = "2001:db8::17".parse().unwrap();
    let rt = runtime();
    let allocs = rt.block_on(count_per_call(100, || async {
        assert_eq!(client_ip.ip(&view), Some(client));
    }));
    assert!(
        allocs == 0.0,
        "{allocs} allocations per address read from Forwarded"
    );
}

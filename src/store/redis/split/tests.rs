//! The refund script and split checks on a real `redis-server`, against the memory store: the
//! same sequence of checks, split checks and refunds decides the same on both.

use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::clock::{Clock, ManualClock};
use crate::policy::Limit;
use crate::store::{keyspace, MemoryStore, Store};
use crate::Policy;

mod support;

#[cfg(feature = "metrics")]
use support::Counted;
use support::Server;

fn limits(policy: &str) -> Vec<Limit> {
    policy.parse::<Policy>().unwrap().limits().to_vec()
}

/// One policy per algorithm, and all of them together; windows of a minute or more, so that
/// no key's TTL (on Redis' own clock) runs out during a test.
const POLICIES: [&str; 10] = [
    "5/min sliding",
    "5/min",
    "2000/min, 5/min",
    "5/min fixed",
    "5/min gcra",
    "7/3min gcra burst=3",
    "6/min bucket capacity=4",
    "5/min log",
    "2 concurrent",
    "5/min sliding, 8/h fixed, 4/min log, 2 concurrent, 7/3min gcra burst=3",
];

const T0: u64 = 1_767_225_600_000_000;

/// The same state on both stores, and the clock they share.
struct Pair {
    clock: ManualClock,
    memory: MemoryStore,
    redis: RedisStore,
    limits: Vec<Limit>,
    next_lease: u64,
}

impl Pair {
    async fn new(server: &Server, policy: &str) -> Pair {
        let clock = ManualClock::new(T0);
        let memory = MemoryStore::builder()
            .clock(Clock::Manual(clock.clone()))
            .build();
        let redis = server.store(&clock).await;
        Pair {
            clock,
            memory,
            redis,
            limits: limits(policy),
            next_lease: 0,
        }
    }

    fn lease(&mut self) -> String {
        if self.limits.iter().any(Limit::is_concurrency) {
            self.next_lease += 1;
            format!("lease-{}", self.next_lease)
        } else {
            String::new()
        }
    }

    fn advance(&self, us: u64) {
        self.clock.advance(Duration::from_micros(us));
    }

    /// One check of `ids` as one call on both stores; the outcomes must agree.
    async fn check(&mut self, ids: &[&str], cost: u64) -> (Outcome, String) {
        let ids: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
        let lease = self.lease();
        let plan = Plan {
            namespace: None,
            ids: &ids,
            limits: &self.limits,
            cost,
            lease: &lease,
        };
        let redis = self.redis.check_within(&plan, 0).await.unwrap();
        let memory = self.memory.check(&plan);
        assert_eq!(redis, memory, "{ids:?} cost {cost}");
        (redis, lease)
    }

    /// A check of `ids` split into `groups` on both stores (the memory store's split run
    /// by hand, as `check_split` runs it); the outcomes must agree.
    async fn split(&mut self, ids: &[&str], groups: &[Vec<usize>], cost: u64) -> Outcome {
        let ids: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
        let lease = self.lease();
        let plan = Plan {
            namespace: None,
            ids: &ids,
            limits: &self.limits,
            cost,
            lease: &lease,
        };
        let redis = self.redis.check_split(&plan, groups).await.unwrap();
        let memory = memory_split(&self.memory, &plan, groups);
        assert_eq!(redis, memory, "{ids:?} {groups:?} cost {cost}");
        redis
    }

    /// Gives back a check of `ids` on both stores.
    async fn refund(&self, ids: &[&str], cost: u64, lease: &str, at: u64) {
        let ids: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
        let plan = Plan {
            namespace: None,
            ids: &ids,
            limits: &self.limits,
            cost,
            lease,
        };
        self.redis.refund(&plan, at).await.unwrap();
        Store::Memory(self.memory.clone())
            .refund(&plan, at)
            .await
            .unwrap();
    }

    /// What checks of `id` of every cost would decide at a few times from now: the same
    /// on both stores, and charged on neither (each probe is refunded at once).
    async fn probe(&mut self, id: &str) -> Vec<Outcome> {
        let most = self.max_cost().min(6);
        let mut seen = Vec::new();
        for cost in 1..=most {
            let (out, lease) = self.check(&[id], cost).await;
            if out.allowed {
                self.refund(&[id], cost, &lease, out.at_us).await;
            }
            seen.push(out);
        }
        seen
    }

    /// Writes what no script writes to the first key of `id` on Redis, so that a check of it
    /// fails there; that key.
    fn spoil(&self, id: &str, conn: &mut redis::Connection) -> String {
        let l = &self.limits;
        let key = if crate::algorithm::is_packed(&l[0]) {
            let packed = l.iter().filter(|l| crate::algorithm::is_packed(l));
            keyspace::packed_key(self.redis.prefix(), id, None, packed)
        } else {
            keyspace::key(self.redis.prefix(), id, None, &l[0])
        };
        let () = redis::cmd("SET")
            .arg(&key)
            .arg("not a state")
            .query(conn)
            .unwrap();
        key
    }

    fn max_cost(&self) -> u64 {
        self.limits.iter().map(Limit::max_cost).min().unwrap()
    }
}

/// `check_split` on the memory store, by hand: a check per group, merged, the admitting
/// groups refunded when the others deny.
fn memory_split(memory: &MemoryStore, plan: &Plan<'_>, groups: &[Vec<usize>]) -> Outcome {
    let ids: Vec<Vec<String>> = groups
        .iter()
        .map(|g| g.iter().map(|&i| plan.ids[i].clone()).collect())
        .collect();
    let plans: Vec<Plan<'_>> = ids
        .iter()
        .map(|ids| Plan {
            namespace: None,
            ids,
            limits: plan.limits,
            cost: plan.cost,
            lease: plan.lease,
        })
        .collect();
    let mut outcomes: Vec<Outcome> = plans.iter().map(|p| memory.check(p)).collect();
    if !outcomes.iter().all(|o| o.allowed) {
        for (p, o) in plans.iter().zip(&mut outcomes) {
            if o.allowed {
                memory.refund(p, o.at_us);
                uncharged(o, plan.limits, plan.cost);
            }
        }
    }
    let outcomes: Vec<Option<Outcome>> = outcomes.into_iter().map(Some).collect();
    merge(groups, &outcomes, plan.ids.len(), plan.limits.len()).unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn each_alone() -> Vec<Vec<usize>> {
    vec![vec![0], vec![1]]
}

/// All admit, mixed, all deny: a split check over a standalone server with every identifier
/// in a group of its own decides as the memory store does, and the admitting group's state
/// after its refund decides exactly like the memory store's, for every algorithm.
#[test]
fn split_checks_agree_with_the_memory_store() {
    let server = Server::start();
    runtime().block_on(async {
        for policy in POLICIES {
            for cost in [1, 2] {
                let mut p = Pair::new(&server, policy).await;
                let cost = cost.min(p.max_cost());
                // all admit: one round trip, charged everywhere
                let out = p.split(&["a", "b"], &each_alone(), cost).await;
                assert!(out.allowed, "{policy}");
                assert_eq!(out.entries.len(), 2 * p.limits.len());
                // until every state is as good as empty again
                p.advance(200_000_000);
                // b alone until it is full
                let mut n = 0;
                while p.check(&["b"], cost).await.0.allowed {
                    n += 1;
                    assert!(n < 100, "{policy}: b never fills");
                }
                p.advance(2_000);
                let before = p.probe("a").await;
                // mixed: a admits, b denies; a is given its charge back
                let out = p.split(&["a", "b"], &each_alone(), cost).await;
                assert!(!out.allowed, "{policy}");
                let l = p.limits.len();
                assert!(out.entries[..l].iter().all(|e| e.allowed), "{policy}");
                assert!(out.entries[l..].iter().any(|e| !e.allowed), "{policy}");
                assert_eq!(p.probe("a").await, before, "{policy}: a as it was");
                // in the other order, with the groups named the other way round
                let out = p.split(&["b", "a"], &[vec![1], vec![0]], cost).await;
                assert!(!out.allowed);
                assert!(out.entries[l..].iter().all(|e| e.allowed), "{policy}");
                assert_eq!(p.probe("a").await, before, "{policy}: a as it was");
                // all deny: a full too
                while p.check(&["a"], cost).await.0.allowed {}
                let before = p.probe("a").await;
                let out = p.split(&["a", "b"], &each_alone(), cost).await;
                assert!(!out.allowed);
                for per_id in out.entries.chunks(l) {
                    assert!(per_id.iter().any(|e| !e.allowed), "{policy}: both deny");
                }
                assert_eq!(p.probe("a").await, before, "{policy}: nothing charged");
                // later, the windows moved on: the states still agree
                p.advance(150_000_000);
                assert_eq!(p.probe("a").await.len(), p.max_cost().min(6) as usize);
                let _ = p.split(&["a", "b"], &each_alone(), cost).await;
            }
        }
    });
}

/// The refund keeps the packed key's TTL, lowers only what was charged, and creates nothing
/// for an identifier that holds no state; the slot and the log entries of the check are gone.
#[test]
fn a_refund_keeps_the_ttl_and_creates_no_key() {
    let server = Server::start();
    let mut conn = server.conn();
    runtime().block_on(async {
        let policy = "5/min, 4/min log, 2 concurrent";
        let mut p = Pair::new(&server, policy).await;
        let (out, lease) = p.check(&["a"], 2).await;
        assert!(out.allowed);
        let packed = keyspace::packed_key(p.redis.prefix(), "a", None, &p.limits[..1]);
        let log = keyspace::key(p.redis.prefix(), "a", None, &p.limits[1]);
        let slots = keyspace::key(p.redis.prefix(), "a", None, &p.limits[2]);
        let expiry = |conn: &mut redis::Connection, key: &str| -> i64 {
            redis::cmd("PEXPIRETIME").arg(key).query(conn).unwrap()
        };
        let value = |conn: &mut redis::Connection, key: &str| -> Vec<u8> {
            redis::cmd("GET").arg(key).query(conn).unwrap()
        };
        let (ttl, charged) = (expiry(&mut conn, &packed), value(&mut conn, &packed));
        assert!(ttl > 0);
        let zcard = |conn: &mut redis::Connection, key: &str| -> i64 {
            redis::cmd("ZCARD").arg(key).query(conn).unwrap()
        };
        assert_eq!((zcard(&mut conn, &log), zcard(&mut conn, &slots)), (2, 1));
        p.advance(5_000);
        p.refund(&["a"], 2, &lease, out.at_us).await;
        assert_eq!(expiry(&mut conn, &packed), ttl, "the TTL is kept");
        assert_ne!(value(&mut conn, &packed), charged, "the count went down");
        // the log's entries and the slot went, and with them their keys
        let exists = |conn: &mut redis::Connection, key: &str| -> i64 {
            redis::cmd("EXISTS").arg(key).query(conn).unwrap()
        };
        assert_eq!((exists(&mut conn, &log), exists(&mut conn, &slots)), (0, 0));
        // a refund for an identifier never charged writes nothing
        p.refund(&["never"], 2, "lease-x", out.at_us).await;
        for limit in &p.limits {
            let key = keyspace::key(p.redis.prefix(), "never", None, limit);
            assert_eq!(exists(&mut conn, &key), 0, "{key}");
        }
        let key = keyspace::packed_key(p.redis.prefix(), "never", None, &p.limits[..1]);
        assert_eq!(exists(&mut conn, &key), 0);
    });
}

/// The log's members of one time stay numbered `1..=count` across refunds: a charge in the
/// same microsecond after a refund adds entries rather than overwriting others.
#[test]
fn log_members_stay_numbered_across_refunds() {
    let server = Server::start();
    let mut conn = server.conn();
    runtime().block_on(async {
        let mut p = Pair::new(&server, "20/min log").await;
        let (first, _) = p.check(&["a"], 3).await;
        let _ = p.check(&["a"], 2).await;
        p.refund(&["a"], 3, "", first.at_us).await;
        let (out, _) = p.check(&["a"], 2).await;
        assert_eq!(out.entries[0].remaining, 16);
        let key = keyspace::key(p.redis.prefix(), "a", None, &p.limits[0]);
        let mut members: Vec<String> = redis::cmd("ZRANGE")
            .arg(&key)
            .arg(0)
            .arg(-1)
            .query(&mut conn)
            .unwrap();
        members.sort();
        let at = first.at_us;
        let expected: Vec<String> = (1..=4).map(|k| format!("{at}-{k}")).collect();
        assert_eq!(members, expected);
        p.refund(&["a"], 4, "", at).await;
        assert_eq!(p.probe("a").await[0].entries[0].remaining, 19);

        // more members than one ZREM takes, given back from among others of the same time
        let mut p = Pair::new(&server, "2000/min log").await;
        let _ = p.check(&["a"], 300).await;
        let (big, _) = p.check(&["a"], 1_200).await;
        assert!(big.allowed);
        p.refund(&["a"], 1_200, "", big.at_us).await;
        let key = keyspace::key(p.redis.prefix(), "a", None, &p.limits[0]);
        let count: i64 = redis::cmd("ZCARD").arg(&key).query(&mut conn).unwrap();
        assert_eq!(count, 300);
        assert_eq!(p.probe("a").await[0].entries[0].remaining, 1_699);
    });
}

/// A group that fails makes the whole check fail, after the groups that admitted were
/// refunded, unless another group denies: that denial settles the check, and the failed
/// group's figures are unknown. A peek, asked for every figure, fails in both cases.
#[test]
fn a_failing_group_fails_the_check_unless_another_denies() {
    let server = Server::start();
    let mut conn = server.conn();
    runtime().block_on(async {
        for policy in [
            "5/min sliding",
            "5/min log",
            "5/min gcra, 2 concurrent",
            "5/min",
        ] {
            let mut p = Pair::new(&server, policy).await;
            // a is spent, c admits, and b's first key holds what no script wrote: its check
            // fails on the server
            let spend = p.max_cost();
            let (out, _) = p.check(&["a"], spend).await;
            assert!(out.allowed, "{policy}");
            let before = p.probe("c").await;
            p.spoil("b", &mut conn);
            let lease = p.lease();
            for (ids, denied) in [(["c", "b"].as_slice(), false), (&["c", "b", "a"], true)] {
                let ids: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
                let plan = Plan {
                    namespace: None,
                    ids: &ids,
                    limits: &p.limits,
                    cost: 1,
                    lease: &lease,
                };
                let groups: Vec<Vec<usize>> = (0..ids.len()).map(|i| vec![i]).collect();
                assert!(
                    p.redis.peek_split(&plan, &groups).await.is_err(),
                    "{policy}"
                );
                let result = p.redis.check_split(&plan, &groups).await;
                if !denied {
                    assert!(result.is_err(), "{policy}: {result:?}");
                    continue;
                }
                let out = result.unwrap_or_else(|e| panic!("{policy}: {e:?}"));
                assert!(!out.allowed, "{policy}");
                assert_eq!(out.unknown, 0b010, "{policy}: b's figures are unknown");
                assert!(out.knows(0) && !out.knows(1) && out.knows(2), "{policy}");
                // (an answer no script writes may come from a script that ran)
                assert!(out.unsure, "{policy}");
                let a = &out.entries[2 * p.limits.len()..];
                let held_back = |e: &Entry| !e.allowed && e.retry_after_us > 0;
                assert!(a.iter().any(held_back), "{policy}: {a:?}");
            }
            // c was charged and given back each time: it decides as before, on both stores
            assert_eq!(p.probe("c").await, before, "{policy}");
        }
    });
}

/// Groups that do not partition the identifiers: the check runs as one call.
#[test]
fn groups_must_partition_the_identifiers() {
    assert!(partitions(&[vec![0], vec![2, 1]], 3));
    assert!(!partitions(&[vec![0], vec![1]], 3), "2 is missing");
    assert!(!partitions(&[vec![0, 1], vec![1]], 2), "1 twice");
    assert!(!partitions(&[vec![0, 5]], 2), "out of range");
    let server = Server::start();
    runtime().block_on(async {
        let mut p = Pair::new(&server, "3/min").await;
        let out = p.split(&["a", "b"], &[vec![0, 1]], 1).await;
        assert!(out.allowed);
        let ids = ["a".to_string(), "b".to_string()];
        let plan = Plan {
            namespace: None,
            ids: &ids,
            limits: &p.limits,
            cost: 1,
            lease: "",
        };
        let out = p.redis.check_split(&plan, &[vec![0]]).await.unwrap();
        assert!(out.allowed);
        assert_eq!(out.entries[0].remaining, 1);
        assert_eq!(out.entries[1].remaining, 1, "b was checked too");
    });
}

/// What the differential test does.
#[derive(Debug, Clone)]
enum Op {
    Advance(u64),
    /// A check in one call: of a (0), of b (1), of both (2).
    One(usize, u64),
    /// A split check of a and b, in the plan order given (`true`: b first).
    Split(bool, u64),
    /// The last admitted single check given back.
    RefundLast,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u64..40_000_000).prop_map(Op::Advance),
        (0u64..3_000).prop_map(Op::Advance),
        // several checks in one microsecond
        Just(Op::Advance(0)),
        (0usize..3, 1u64..4).prop_map(|(i, c)| Op::One(i, c)),
        (any::<bool>(), 1u64..4).prop_map(|(b, c)| Op::Split(b, c)),
        Just(Op::RefundLast),
    ]
}

/// Random sequences of checks, split checks and refunds decide the same on Redis and in
/// memory, for every algorithm.
#[test]
fn random_sequences_agree_with_the_memory_store() {
    let server = Server::start();
    let rt = runtime();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 32,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let ops = proptest::collection::vec(op(), 1..40);
    runner
        .run(&(0..POLICIES.len(), ops), |(policy, ops)| {
            rt.block_on(run_sequence(&server, POLICIES[policy], ops));
            Ok(())
        })
        .unwrap();
}

/// The identifiers of a check in one call, by `Op::One`'s index.
const CALLS: [&[&str]; 3] = [&["a"], &["b"], &["a", "b"]];

async fn run_sequence(server: &Server, policy: &str, ops: Vec<Op>) {
    let mut p = Pair::new(server, policy).await;
    let most = p.max_cost();
    let mut last: Option<(usize, u64, String, u64)> = None;
    for op in ops {
        match op {
            Op::Advance(us) => p.advance(us),
            Op::One(i, cost) => {
                let cost = cost.min(most);
                let (out, lease) = p.check(CALLS[i], cost).await;
                if out.allowed {
                    last = Some((i, cost, lease, out.at_us));
                }
            }
            Op::Split(b_first, cost) => {
                let cost = cost.min(most);
                let ids = if b_first { ["b", "a"] } else { ["a", "b"] };
                let _ = p.split(&ids, &each_alone(), cost).await;
            }
            Op::RefundLast => {
                if let Some((i, cost, lease, at)) = last.take() {
                    p.refund(CALLS[i], cost, &lease, at).await;
                }
            }
        }
    }
    for id in ["a", "b"] {
        let _ = p.probe(id).await;
    }
}

/// A refund that fails is counted (and logged), not lost in silence; the denial still comes.
#[cfg(feature = "metrics")]
#[test]
fn a_refund_that_fails_is_counted() {
    let recorder = Counted::default();
    metrics::with_local_recorder(&recorder, || {
        runtime().block_on(async {
            let server = Server::start();
            let p = Pair::new(&server, "5/min").await;
            let ids = vec!["a".to_string()];
            let plan = Plan {
                namespace: None,
                ids: &ids,
                limits: &p.limits,
                cost: 1,
                lease: "",
            };
            let out = p.redis.check_within(&plan, 0).await.unwrap();
            assert!(out.allowed);
            // Redis goes away before the refund
            drop(server);
            refund_charges(&p.redis, &[(&plan, out.at_us)]).await;
        });
    });
    let counted = recorder.0.lock().unwrap();
    let failures: Vec<_> = counted
        .iter()
        .filter(|(k, _)| k.name() == "tollgate_refund_failures_total")
        .collect();
    assert_eq!(failures.len(), 1, "{counted:?}");
    assert!(failures[0]
        .0
        .labels()
        .any(|l| l.key() == "store" && l.value().starts_with("split")));
}

/// A split check fails with an error that may have run when a group's did, though another
/// group's error, earlier, says it did not (its breaker opened between the calls): the
/// limiter then releases the concurrency slot the group that may have run may hold.
#[test]
fn a_failed_split_check_fails_with_an_error_that_may_have_run() {
    let unavailable = || Err(StoreError::Unavailable);
    let timeout = || Err(StoreError::Timeout(Duration::from_millis(50)));
    let failed = settled(vec![unavailable(), timeout()]).unwrap_err();
    assert!(failed.may_have_run(), "{failed:?}");
    let failed = settled(vec![timeout(), unavailable()]).unwrap_err();
    assert!(matches!(failed, StoreError::Timeout(_)), "{failed:?}");
    let failed = settled(vec![unavailable(), unavailable()]).unwrap_err();
    assert!(!failed.may_have_run());
    // a denial settles the check, and says whether a failed call may have run
    let denied = || {
        let entry = Entry {
            allowed: false,
            remaining: 0,
            reset_after_us: 9,
            retry_after_us: 9,
        };
        Ok(Outcome::of(
            crate::algorithm::Summary {
                allowed: false,
                at_us: 1,
                wait_us: 0,
            },
            [entry].into_iter().collect(),
        ))
    };
    let s = settled(vec![unavailable(), denied()]).unwrap();
    assert!(!s.unsure);
    assert!(s.outcomes[0].is_none() && s.outcomes[1].is_some());
    let s = settled(vec![denied(), unavailable(), timeout()]).unwrap();
    assert!(s.unsure);
    let merged = merge(&[vec![0], vec![1], vec![2]], &s.outcomes, 3, 1).unwrap();
    assert!(!merged.allowed);
    assert_eq!(merged.unknown, 0b110);
}

/// A refund goes to a master that answered a moment ago: a breaker opened meanwhile by the
/// failures of another master does not stop it, and the charge is given back.
#[test]
fn a_refund_is_not_stopped_by_an_open_breaker() {
    let server = Server::start();
    runtime().block_on(async {
        let mut p = Pair::new(&server, "5/min").await;
        let before = p.probe("a").await;
        let (out, lease) = p.check(&["a"], 1).await;
        assert!(out.allowed);
        let down = StoreError::Unavailable;
        for _ in 0..3 {
            let _ = p.redis.breaker.record(Err(&down));
        }
        assert!(!p.redis.breaker.is_closed());
        // (given back on both stores, so that both decide alike after)
        p.refund(&["a"], 1, &lease, out.at_us).await;
        p.redis.breaker.close();
        assert_eq!(p.probe("a").await, before);
    });
}

use std::time::Duration;

use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderValue};

use super::{adverts, quota_and_window, Advert, HeaderCache, HeaderStyle, RATELIMIT};
use crate::{Clock, Decision, Limiter, ManualClock, MemoryStore};

/// Adds the fields of `decision`, with a cache of its own.
fn add_headers(
    headers: &mut HeaderMap,
    decision: &Decision,
    style: HeaderStyle,
    pks: Option<&[Vec<u8>]>,
) {
    super::add_headers(headers, decision, style, pks, &HeaderCache::default());
}

/// 2026-01-01T00:00:00Z: the start of every window.
const EPOCH_ALIGNED_US: u64 = 1_767_225_600_000_000;

fn limiter(policy: &str) -> (Limiter, ManualClock) {
    let clock = ManualClock::new(EPOCH_ALIGNED_US);
    let store = MemoryStore::builder()
        .clock(Clock::Manual(clock.clone()))
        .build();
    (Limiter::new(store, policy.parse().unwrap()), clock)
}

async fn check(limiter: &Limiter) -> Decision {
    limiter.check(&["k"]).await.unwrap()
}

fn advert(name: &str, q: u64, w: u64, r: u64, t: u64) -> Advert {
    Advert {
        name: name.into(),
        q,
        w: Some(w),
        r,
        t: Some(t),
        full: 0,
        pk: None,
        retry: None,
    }
}

/// Name, q, w, r and t of a limit.
type Figures = (String, u64, Option<u64>, u64, Option<u64>);

/// The figures of each limit, leaving the legacy reset out.
fn figures(decision: &Decision) -> Vec<Figures> {
    adverts(decision, None)
        .into_iter()
        .map(|a| (a.name, a.q, a.w, a.r, a.t))
        .collect()
}

#[test]
fn windows_are_whole_seconds_and_quotas_never_grow() {
    for (text, q, w) in [
        ("10/s", 10, 1),
        ("120/min", 120, 60),
        ("1000/d fixed", 1000, 86_400),
        // sub-second windows scale to a second when that is exact…
        ("5/500ms", 10, 1),
        ("1/250ms log", 4, 1),
        // …and round down otherwise: 4.29 per second enforced, 4 advertised
        ("3/700ms", 4, 1),
        ("1/1500ms", 1, 2),
        ("10/1500ms", 13, 2),
        // a bucket or GCRA: its burst, over the time it takes to refill it
        ("100/s bucket capacity=500", 500, 5),
        ("5/s gcra burst=20", 20, 4),
        ("10/s gcra", 10, 1),
        ("3/s gcra burst=1", 3, 1),
        ("10/s bucket capacity=2", 10, 1),
        ("1/h gcra burst=3", 3, 3 * 3600),
    ] {
        let limit = text.parse().unwrap();
        assert_eq!(quota_and_window(&limit), (q, w), "{text}");
    }
}

/// `r` never exceeds `q`; `t` is the time until the quota is whole again, never beyond `w`.
#[tokio::test]
async fn each_algorithm_reports_r_and_t_within_q_and_w() {
    let (l, clock) = limiter("10/min fixed");
    clock.advance(Duration::from_secs(15));
    let d = check(&l).await;
    assert_eq!(
        figures(&d),
        [("10/min fixed".into(), 10, Some(60), 9, Some(45))]
    );

    let (l, _) = limiter("100/s bucket capacity=500");
    let d = check(&l).await;
    // one token out of 500 refills in 10 ms: t rounds up to a second
    assert_eq!(
        figures(&d),
        [(
            "100/s bucket capacity=500".into(),
            500,
            Some(5),
            499,
            Some(1)
        )]
    );

    let (l, _) = limiter("5/s gcra burst=20");
    for _ in 0..10 {
        let _ = check(&l).await;
    }
    let d = check(&l).await;
    // 11 out of 20 used: full again in 11 × 200 ms
    assert_eq!(
        figures(&d),
        [("5/s gcra burst=20".into(), 20, Some(4), 9, Some(3))]
    );

    // the sliding-window counter may take up to two windows to empty: t stops at w
    let (l, clock) = limiter("100/h");
    let _ = check(&l).await;
    clock.advance(Duration::from_secs(3000));
    let d = check(&l).await;
    let [(_, q, w, r, t)] = &figures(&d)[..] else {
        panic!()
    };
    assert_eq!((*q, *w, *r), (100, Some(3600), 98));
    assert_eq!(*t, Some(3600));
    assert!(d.statuses()[0].reset_after > Duration::from_secs(3600));

    let (l, _) = limiter("5/500ms log");
    let d = check(&l).await;
    assert_eq!(
        figures(&d),
        [("5/500ms log".into(), 10, Some(1), 4, Some(1))]
    );
}

#[tokio::test]
async fn a_concurrency_limit_is_advertised_in_concurrent_requests() {
    let (l, _) = limiter("10/s, 2 concurrent");
    let held = check(&l).await;
    let mut headers = HeaderMap::new();
    add_headers(&mut headers, &held, HeaderStyle::Ietf, None);
    assert_eq!(
        headers["ratelimit-policy"],
        r#""10/s";q=10;w=1, "2 concurrent";q=2;qu="concurrent-requests""#
    );
    assert_eq!(
        headers["ratelimit"],
        r#""10/s";r=9;t=1, "2 concurrent";r=1"#
    );
    let _second = check(&l).await;
    let refused = check(&l).await;
    assert!(!refused.is_allowed());
    let mut headers = HeaderMap::new();
    add_headers(&mut headers, &refused, HeaderStyle::Ietf, None);
    assert_eq!(
        headers["ratelimit"],
        r#""10/s";r=8;t=1, "2 concurrent";r=0"#
    );
    assert_eq!(headers[RETRY_AFTER], "1");
}

/// On a denial, the denying limit's `t` is its wait, and no `t` goes beyond `Retry-After`.
#[tokio::test]
async fn a_denial_never_points_before_the_effective_windows() {
    let (l, clock) = limiter("2/min log, 1000/d fixed");
    let _ = check(&l).await;
    clock.advance(Duration::from_secs(10));
    let _ = check(&l).await;
    clock.advance(Duration::from_secs(5));
    let denied = check(&l).await;
    assert!(!denied.is_allowed());
    let mut headers = HeaderMap::new();
    add_headers(&mut headers, &denied, HeaderStyle::Ietf, None);
    // the first entry leaves the log 45 s from now; the day has 86,385 s left, capped at 45
    assert_eq!(headers[RETRY_AFTER], "45");
    assert_eq!(
        headers["ratelimit"],
        r#""2/min log";r=0;t=45, "1000/d fixed";r=998;t=45"#
    );
}

#[tokio::test]
async fn a_heavier_request_waits_for_its_cost() {
    let (l, _) = limiter("10/s bucket");
    let _ = l.check_n(&["k"], 8).await.unwrap();
    let denied = l.check_n(&["k"], 5).await.unwrap();
    assert!(!denied.is_allowed());
    let mut headers = HeaderMap::new();
    add_headers(&mut headers, &denied, HeaderStyle::Ietf, None);
    // 2 left; 5 fit again once 3 tokens have come back, 300 ms from now
    assert_eq!(headers["ratelimit"], r#""10/s bucket";r=2;t=1"#);
    assert_eq!(headers[RETRY_AFTER], "1");
}

#[tokio::test]
async fn stacked_layers_list_every_limit_once() {
    let (outer, _) = limiter("100/min, 10/s");
    let (inner, _) = limiter("10/s, 5 concurrent");
    let mut headers = HeaderMap::new();
    for _ in 0..3 {
        let _ = check(&inner).await;
    }
    let inner_d = check(&inner).await;
    let outer_d = check(&outer).await;
    add_headers(&mut headers, &inner_d, HeaderStyle::Ietf, None);
    add_headers(&mut headers, &outer_d, HeaderStyle::Ietf, None);
    assert_eq!(
        headers["ratelimit-policy"],
        r#""10/s";q=10;w=1, "5 concurrent";q=5;qu="concurrent-requests", "100/min";q=100;w=60"#
    );
    // "10/s" is in both: the tighter state (the inner layer's, with 6 left) is the one shown
    assert_eq!(
        headers["ratelimit"],
        r#""10/s";r=6;t=1, "5 concurrent";r=4, "100/min";r=99;t=60"#
    );
    drop(inner_d);
}

/// A `Retry-After` set further in caps the effective windows of the layers around it.
#[tokio::test]
async fn an_inner_retry_after_caps_the_outer_windows() {
    let (outer, _) = limiter("1000/d fixed");
    let mut headers = HeaderMap::new();
    headers.insert(RETRY_AFTER, HeaderValue::from_static("7"));
    headers.insert(RATELIMIT, HeaderValue::from_static(r#""1/min";r=0;t=7"#));
    add_headers(&mut headers, &check(&outer).await, HeaderStyle::Ietf, None);
    assert_eq!(
        headers["ratelimit"],
        r#""1/min";r=0;t=7, "1000/d fixed";r=999;t=7"#
    );
    assert_eq!(headers[RETRY_AFTER], "7");
}

#[tokio::test]
async fn fields_the_application_broke_are_left_alone() {
    let (l, _) = limiter("10/s");
    let mut headers = HeaderMap::new();
    headers.insert(RATELIMIT, HeaderValue::from_static("not, a ;; list"));
    add_headers(&mut headers, &check(&l).await, HeaderStyle::Ietf, None);
    assert_eq!(headers[RATELIMIT], "not, a ;; list");
    assert_eq!(headers["ratelimit-policy"], r#""10/s";q=10;w=1"#);
}

#[tokio::test]
async fn the_legacy_style_shows_the_limit_closest_to_exhaustion() {
    let (l, _) = limiter("10/s, 3/min fixed");
    let d = check(&l).await;
    let mut headers = HeaderMap::new();
    add_headers(&mut headers, &d, HeaderStyle::Legacy, None);
    assert!(headers.get(RATELIMIT).is_none());
    assert_eq!(headers["x-ratelimit-limit"], "3");
    assert_eq!(headers["x-ratelimit-remaining"], "2");
    assert_eq!(headers["x-ratelimit-reset"], "60");
    // a layer around it with more left does not replace it
    let (outer, _) = limiter("100/min");
    add_headers(&mut headers, &check(&outer).await, HeaderStyle::Both, None);
    assert_eq!(headers["x-ratelimit-remaining"], "2");
    assert_eq!(headers[RATELIMIT], r#""100/min";r=99;t=60"#);
}

/// On a denial the legacy fields describe the limit that holds the request back longest, so
/// that a client retrying at `X-RateLimit-Reset` is not refused again: not the one with the
/// least left, which may admit the request a second later while the other refuses it for an
/// hour.
#[tokio::test]
async fn the_legacy_style_shows_the_limit_that_denied_longest() {
    let (l, _) = limiter("10/s fixed, 12/h fixed");
    assert!(l.check_n(&["k"], 9).await.unwrap().is_allowed());
    // 1 left of 10/s, 3 of 12/h: a cost of 4 fits neither
    let d = l.check_n(&["k"], 4).await.unwrap();
    assert!(!d.is_allowed());
    let mut headers = HeaderMap::new();
    add_headers(&mut headers, &d, HeaderStyle::Legacy, None);
    assert_eq!(headers["x-ratelimit-limit"], "12");
    assert_eq!(headers["x-ratelimit-remaining"], "3");
    let reset: u64 = headers["x-ratelimit-reset"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(
        retry > 3000 && reset >= retry,
        "reset {reset}, retry {retry}"
    );
    // an outer layer that allowed, with less left, leaves the inner refusal's fields alone
    let (outer, _) = limiter("1/min");
    add_headers(
        &mut headers,
        &check(&outer).await,
        HeaderStyle::Legacy,
        None,
    );
    assert_eq!(headers["x-ratelimit-limit"], "12");
    assert_eq!(headers["x-ratelimit-reset"], reset.to_string().as_str());
}

#[test]
fn adverts_serialize_as_structured_fields() {
    let mut headers = HeaderMap::new();
    super::merge_ietf(&mut headers, &[advert("10/s", 10, 1, 3, 1)], None);
    assert_eq!(headers[RATELIMIT], r#""10/s";r=3;t=1"#);
    assert_eq!(headers["ratelimit-policy"], r#""10/s";q=10;w=1"#);
}

#[test]
fn partition_keys_are_keyed_hashes_in_byte_sequences() {
    use super::partition_key;
    // RFC 2202's first HMAC-SHA-1 test case, truncated to 12 bytes
    let key = [0x0b; 20];
    assert_eq!(
        partition_key(&key, "Hi There"),
        [0xb6, 0x17, 0x31, 0x86, 0x55, 0x05, 0x72, 0x64, 0xe2, 0x8b, 0xc0, 0xb6]
    );
    // a long secret is hashed first (RFC 2202 case 6)
    assert_eq!(
        partition_key(
            &[0xaa; 80],
            "Test Using Larger Than Block-Size Key - Hash Key First"
        )[..4],
        [0xaa, 0x4a, 0xe5, 0xe1]
    );
    assert_ne!(partition_key(b"s", "ip:1"), partition_key(b"t", "ip:1"));
    assert_ne!(partition_key(b"s", "ip:1"), partition_key(b"s", "ip:2"));

    let mut a = advert("10/s", 10, 1, 3, 1);
    a.pk = Some(vec![0xb6, 0x17, 0x31]);
    let mut headers = HeaderMap::new();
    super::merge_ietf(&mut headers, &[a], None);
    assert_eq!(headers[RATELIMIT], r#""10/s";r=3;t=1;pk=:thcx:"#);
}

#[test]
fn fields_written_directly_are_those_the_serializer_writes() {
    use super::{fresh_ietf, policy_item, state_item};
    use sfv::{FieldType, List};
    let concurrent = Advert {
        name: "2 concurrent".to_string(),
        q: 2,
        w: None,
        r: 1,
        t: None,
        full: 0,
        pk: None,
        retry: None,
    };
    for ours in [
        vec![advert("10/s", 10, 1, 9, 1)],
        vec![
            advert("10/s", 10, 1, 0, 1),
            concurrent.clone(),
            advert("240/h gcra", 240, 3600, 17, 15),
        ],
        vec![advert("5/min log", 5, 60, 5, 60), concurrent.clone()],
        // partition keys of every length modulo 3, and none
        vec![
            with_pk(advert("10/s", 10, 1, 3, 1), &[0xb6, 0x17, 0x31]),
            with_pk(concurrent.clone(), &[0xff]),
            with_pk(advert("240/h gcra", 240, 3600, 17, 15), &[0xfb, 0xef]),
            with_pk(advert("1/min", 1, 60, 0, 60), &[]),
            advert("5/min log", 5, 60, 5, 60),
            with_pk(
                advert("7/h", 7, 3600, 2, 900),
                &(0u8..=255).step_by(21).collect::<Vec<_>>(),
            ),
        ],
    ] {
        let (policy, state) = fresh_ietf(&ours, None).unwrap();
        let list = |f: fn(&Advert) -> Option<sfv::ListEntry>| {
            let list: List = ours.iter().filter_map(f).collect();
            list.serialize().unwrap()
        };
        assert_eq!(policy, list(policy_item));
        assert_eq!(state, list(state_item));
    }
    // names the serializer would escape, repeated names and huge numbers go the long way
    assert!(fresh_ietf(&[advert("a\"b", 1, 1, 1, 1)], None).is_none());
    assert!(fresh_ietf(&[advert("a", 1, 1, 1, 1), advert("a", 2, 1, 1, 1)], None).is_none());
    assert!(fresh_ietf(&[advert("a", u64::MAX, 1, 1, 1)], None).is_none());
    // the effective window is capped by Retry-After
    let (_, state) = fresh_ietf(&[advert("1/min", 1, 60, 0, 45)], Some(7)).unwrap();
    assert_eq!(state, r#""1/min";r=0;t=7"#);
}

fn with_pk(mut a: Advert, pk: &[u8]) -> Advert {
    a.pk = Some(pk.to_vec());
    a
}

/// The fields written from the cache are those written from the adverts, whatever the
/// policy, the decision, the partition keys and the `Retry-After`, for a cache shared by many
/// lists of limits — more than it keeps.
#[tokio::test]
async fn fields_from_the_cache_are_those_from_the_adverts() {
    use super::fresh_ietf;
    let cache = HeaderCache::default();
    let pks = [vec![0xb6, 0x17, 0x31, 0x86], vec![0xff; 12]];
    let mut policies: Vec<String> = [
        "10/s",
        "3/s, 2 concurrent, 240/h gcra",
        "2/min log, 1000/d fixed",
        "5/500ms, 3/700ms, 100/s bucket capacity=500",
        "1/1500ms sliding",
    ]
    .iter()
    .map(|p| p.to_string())
    .collect();
    // more lists of limits than the cache keeps
    policies.extend((1..=20).map(|n| format!("{n}/min")));
    let mut compared = 0;
    for policy in &policies {
        let (l, clock) = limiter(policy);
        for round in 0..6 {
            let ids: &[&str] = if round % 2 == 0 { &["a"] } else { &["a", "b"] };
            let decision = l.check(ids).await.unwrap();
            clock.advance(Duration::from_millis(300));
            for (keys, retry_after) in [(None, None), (Some(&pks[..]), Some(1))] {
                let cached = cache.fields(&decision, keys, retry_after);
                let ours = adverts(&decision, keys);
                let general = fresh_ietf(&ours, retry_after);
                let (policy_field, state_field) = cached.expect("written from the cache");
                let (policy_text, state_text) = general.expect("written directly");
                assert_eq!(policy_field, policy_text, "{policy}");
                assert_eq!(state_field, state_text, "{policy}");
                compared += 1;
            }
        }
    }
    assert_eq!(compared, policies.len() * 12);
    // a list the general path must write (a name listed twice) is not written from the cache
    let (a, _) = limiter("10/s");
    let (b, _) = limiter("10/s");
    let mut both = a.check(&["k"]).await.unwrap();
    let other = b.check(&["k"]).await.unwrap();
    let mut second = other.statuses[0];
    second.limit_index = 1;
    both.statuses.push(second);
    assert!(cache.fields(&both, None, None).is_none());
    let mut headers = HeaderMap::new();
    super::add_headers(&mut headers, &both, HeaderStyle::Ietf, None, &cache);
    assert_eq!(headers["ratelimit-policy"], r#""10/s";q=10;w=1"#);
}

/// The fields already there are found whether the response has few fields (compared by
/// name) or many (looked up): a `Retry-After`, a `RateLimit` or a `RateLimit-Policy` among
/// them is merged with, not written over.
#[tokio::test]
async fn fields_already_there_are_found_among_few_fields_or_many() {
    let (l, _) = limiter("1000/d fixed");
    let decision = check(&l).await;
    for others in [0, 3, 20] {
        let mut headers = HeaderMap::new();
        for k in 0..others {
            let name = http::HeaderName::try_from(format!("x-other-{k}")).unwrap();
            headers.insert(name, HeaderValue::from_static("1"));
        }
        headers.insert(RETRY_AFTER, HeaderValue::from_static("7"));
        add_headers(&mut headers, &decision, HeaderStyle::Ietf, None);
        assert_eq!(
            headers[RATELIMIT], r#""1000/d fixed";r=999;t=7"#,
            "{others}"
        );
        assert_eq!(headers[RETRY_AFTER], "7", "{others}");

        let mut headers = HeaderMap::new();
        for k in 0..others {
            let name = http::HeaderName::try_from(format!("x-other-{k}")).unwrap();
            headers.insert(name, HeaderValue::from_static("1"));
        }
        headers.insert(
            "ratelimit-policy",
            HeaderValue::from_static(r#""1/min";q=1;w=60"#),
        );
        add_headers(&mut headers, &decision, HeaderStyle::Ietf, None);
        assert_eq!(
            headers["ratelimit-policy"], r#""1/min";q=1;w=60, "1000/d fixed";q=1000;w=86400"#,
            "{others}"
        );
        assert_eq!(
            headers[RATELIMIT], r#""1000/d fixed";r=999;t=86400"#,
            "{others}"
        );
    }
}

/// Values cut from the per-thread chunks keep their bytes when the chunk they were cut from
/// is replaced, and while later values are cut; a value that is not one is refused.
#[test]
fn values_cut_from_the_chunks_keep_their_bytes() {
    let texts: Vec<String> = (0..2_000u64)
        .map(|n| format!(r#""{n}/s";r={};t={}"#, n * 7919 % 1000, n % 60 + 1))
        .collect();
    let values: Vec<HeaderValue> = texts
        .iter()
        .map(|t| super::fresh::cut(t.as_bytes()).unwrap())
        .collect();
    for (text, value) in texts.iter().zip(&values) {
        assert_eq!(value.as_bytes(), text.as_bytes());
    }
    assert!(super::fresh::cut(b"no\nline breaks").is_none());
    assert_eq!(super::fresh::cut(b"after").unwrap(), "after");
}

/// The digits written into a `RateLimit` value are those `Display` gives; a value longer than
/// a value written in place may be is refused, and leaves nothing behind it.
#[test]
fn numbers_are_their_display() {
    use super::fresh::written;
    use crate::http::chunk::push_u64;
    let mut numbers = vec![u64::MAX, 999_999_999_999_999, 1 << 53];
    numbers.extend(0..=1_000);
    numbers.extend((1..20).map(|k| 10u64.pow(k)));
    numbers.extend((1..20).map(|k| 10u64.pow(k) - 1));
    numbers.extend((1..20).map(|k| 10u64.pow(k) + 7));
    for n in numbers {
        let mut text = bytes::BytesMut::new();
        push_u64(&mut text, n);
        assert_eq!(text, n.to_string().as_bytes());
    }
    let too_long = written(|chunk| {
        (0..100).for_each(|_| push_u64(chunk, 1_000_000));
        Some(())
    });
    assert!(too_long.is_none());
    let given_up = written(|chunk| {
        push_u64(chunk, 100);
        None
    });
    assert!(given_up.is_none());
    let next = written(|chunk| {
        push_u64(chunk, 42);
        Some(())
    });
    assert_eq!(next.unwrap(), "42");
}

#[test]
fn seconds_round_up_and_saturate() {
    use super::ceil_secs;
    assert_eq!(ceil_secs(Duration::ZERO), 0);
    assert_eq!(ceil_secs(Duration::from_millis(1)), 1);
    assert_eq!(ceil_secs(Duration::from_secs(3)), 3);
    assert_eq!(ceil_secs(Duration::from_millis(3001)), 4);
    // a duration past any header's needs, as a caller may give the shed layer
    assert_eq!(ceil_secs(Duration::MAX), u64::MAX);
}

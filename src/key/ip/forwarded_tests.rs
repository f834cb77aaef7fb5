//! Tests of the forwarding headers as clients may write them: quoting, parameters, entries
//! that are not addresses, bytes that are not text, and long or random input.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::tests::{behind_proxies, ip, ip_of, key, nets, request, CLIENT};
use super::ClientIp;

#[test]
fn forwarded_quoted_ipv6_ports_and_parameters() {
    let cases: &[(&str, &str)] = &[
        ("for=\"[2001:db8:cafe::17]:4711\"", "2001:db8:cafe::17"),
        ("for=\"[2001:db8:cafe::17]\"", "2001:db8:cafe::17"),
        ("for=192.0.2.60;proto=http;by=203.0.113.43", "192.0.2.60"),
        ("For=\"192.0.2.60:8080\"", "192.0.2.60"),
        ("proto=https; FOR=192.0.2.60 ;by=10.0.0.2", "192.0.2.60"),
        ("for=\"192.0.2.60:_port-1\"", "192.0.2.60"),
        ("for=\"\\[2001:db8::1\\]\"", "2001:db8::1"),
        // Proxies skipped, quoted or not.
        (
            "for=192.0.2.60, for=\"[::ffff:10.0.0.8]:1\", for=10.0.0.9",
            "192.0.2.60",
        ),
        // A comma inside a quoted string does not split elements.
        (
            "for=1.1.1.1, for=192.0.2.60;ext=\"a, for=9.9.9.9\"",
            "192.0.2.60",
        ),
        // Several lines.
        ("for=192.0.2.60,", "192.0.2.60"),
    ];
    for &(value, client) in cases {
        let req = request(Some("10.0.0.2:1"), &[("forwarded", value.as_bytes())]);
        assert_eq!(
            ip_of(&behind_proxies(), &req),
            Some(ip(client)),
            "{value:?}"
        );
    }
    let req = request(
        Some("10.0.0.2:1"),
        &[
            ("forwarded", b"for=192.0.2.60"),
            ("forwarded", b"for=10.0.0.9"),
        ],
    );
    assert_eq!(ip_of(&behind_proxies(), &req), Some(ip("192.0.2.60")));
}

#[test]
fn entries_that_are_not_addresses_stop_the_walk() {
    let peer = ip("10.0.0.2");
    let cases: &[(&str, &[u8], IpAddr)] = &[
        // Nothing to the right: the peer.
        ("forwarded", b"for=unknown", peer),
        ("forwarded", b"for=\"_hidden\"", peer),
        ("forwarded", b"for=_hidden", peer),
        // The last address to its right (a trusted proxy); never the forged one at left.
        (
            "forwarded",
            b"for=198.51.100.1, for=unknown, for=10.0.0.9",
            ip("10.0.0.9"),
        ),
        ("forwarded", b"for=198.51.100.1, for=\"_x\"", peer),
        (
            "x-forwarded-for",
            b"198.51.100.1, unknown, 10.0.0.9",
            ip("10.0.0.9"),
        ),
        ("x-forwarded-for", b"198.51.100.1, garbage", peer),
        ("x-forwarded-for", b"198.51.100.1, fe80::1%eth0", peer),
        ("x-forwarded-for", b"198.51.100.1, \"203.0.113.7\"", peer),
        ("x-forwarded-for", b"198.51.100.1, 203.0.113.7:123456", peer),
        ("x-forwarded-for", b"198.51.100.1, [203.0.113.7]", peer),
        (
            "x-forwarded-for",
            b"198.51.100.1, 203.0.113.7 8.8.8.8",
            peer,
        ),
        // Malformed Forwarded elements.
        ("forwarded", b"for=198.51.100.1, by=10.0.0.9", peer),
        (
            "forwarded",
            b"for=198.51.100.1, for=1.1.1.1;for=2.2.2.2",
            peer,
        ),
        ("forwarded", b"for=198.51.100.1, for=\"203.0.113.7\"x", peer),
        ("forwarded", b"for=198.51.100.1, for=203.0.113.7;junk", peer),
        ("forwarded", b"for=198.51.100.1, for=\"203.0.113.7", peer),
        // A client-opened quote swallows what the proxy appended: not believed.
        ("forwarded", b"for=\"198.51.100.1, for=203.0.113.7", peer),
        (
            "forwarded",
            b"for=1.1.1.1;x=\", for=\"[2001:db8::1]:443\"",
            peer,
        ),
    ];
    for &(name, value, expected) in cases {
        let req = request(Some("10.0.0.2:1"), &[(name, value)]);
        let client_ip = behind_proxies();
        assert_eq!(
            ip_of(&client_ip, &req),
            Some(expected),
            "{name}: {}",
            value.escape_ascii()
        );
    }
    let req = request(
        Some("10.0.0.2:1"),
        &[
            ("forwarded", b"for=\"198.51.100.1"),
            ("forwarded", b"for=203.0.113.7"),
        ],
    );
    assert_eq!(ip_of(&behind_proxies(), &req), Some(ip(CLIENT)));
}

// --- Hostile input ---------------------------------------------------------------------

#[test]
fn non_utf8_values_are_opaque_entries() {
    let client_ip = behind_proxies();
    // Only the entry holding the bytes is opaque.
    let req = request(
        Some("10.0.0.2:1"),
        &[("x-forwarded-for", b"\xff\xfe, 203.0.113.7")],
    );
    assert_eq!(ip_of(&client_ip, &req), Some(ip(CLIENT)));
    let req = request(
        Some("10.0.0.2:1"),
        &[("x-forwarded-for", b"203.0.113.7, 10.0.0.9, 1.2.3.4\xe9")],
    );
    assert_eq!(ip_of(&client_ip, &req), Some(ip("10.0.0.2")));
    let req = request(Some("10.0.0.2:1"), &[("forwarded", b"for=\"\xc3\x28\"")]);
    assert_eq!(ip_of(&client_ip, &req), Some(ip("10.0.0.2")));
    let req = request(
        Some("10.0.0.2:1"),
        &[("forwarded", b"for=\"\xff\", for=203.0.113.7")],
    );
    assert_eq!(ip_of(&client_ip, &req), Some(ip(CLIENT)));
    let req = request(Some("10.0.0.2:1"), &[("x-real-ip", b"\xff")]);
    assert_eq!(ip_of(&client_ip, &req), Some(ip("10.0.0.2")));
    let req = request(Some("10.0.0.2:1"), &[("x-forwarded-for", b"\xff")]);
    assert_eq!(ip_of(&ClientIp::hops(1), &req), Some(ip("10.0.0.2")));
}

/// 10 KB of pseudo-random header bytes (visible ASCII, tab, obs-text), biased towards the
/// characters the parsers care about.
fn garbage(seed: u64) -> Vec<u8> {
    const SPECIAL: &[u8] = b",;=\"\\[]:_ \tfor.0123456789abcdef";
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..10 * 1024)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let r = (state >> 33) as usize;
            match r % 4 {
                0 => 0x80 + (r >> 2) as u8 % 0x80,
                1 => 0x20 + (r >> 2) as u8 % 0x5f,
                _ => SPECIAL[(r >> 2) % SPECIAL.len()],
            }
        })
        .collect()
}

#[test]
fn ten_kilobytes_of_garbage_is_handled_quickly() {
    // A pattern repeated to at least 10 KB.
    let fill = |pattern: &[u8]| pattern.repeat((10 * 1024usize).div_ceil(pattern.len()));
    let mut values: Vec<Vec<u8>> = (0..8).map(garbage).collect();
    for pattern in [
        &b"["[..],
        b"\"",
        b",",
        b"for=",
        b"\\\"",
        b"1.1.1.1:",
        // Long chains of trusted entries, walked to the end.
        b"10.0.0.1,",
        b"for=10.0.0.1;by=x,",
        b"for=\"[fd00::1]:1\",",
    ] {
        values.push(fill(pattern));
    }
    let extractors = [
        behind_proxies(),
        ClientIp::trusted_proxies(nets(&["0.0.0.0/0", "::/0"])),
        behind_proxies().only_forwarded(),
        behind_proxies().only_x_real_ip(),
        ClientIp::hops(1),
        ClientIp::hops(1000),
        ClientIp::hops(usize::MAX).ipv6_prefix(64),
    ];
    let started = Instant::now();
    for value in &values {
        assert!(value.len() >= 10 * 1024);
        for name in ["forwarded", "x-forwarded-for", "x-real-ip"] {
            let req = request(Some("10.0.0.2:1"), &[(name, value), (name, value)]);
            for client_ip in &extractors {
                // The peer is known, so there is always an answer.
                assert!(ip_of(client_ip, &req).is_some());
                assert!(key(client_ip, &req).is_some());
            }
        }
    }
    // 17 values x 3 headers x 7 extractors x 2 lookups, each over 20 KB of header: a few
    // hundred milliseconds at most, unoptimised, on a slow machine.
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");

    // The long trusted chains were walked to their left end.
    let trust_all = ClientIp::trusted_proxies(nets(&["0.0.0.0/0", "::/0"]));
    let chain = fill(b"10.0.0.1,");
    let req = request(Some("10.0.0.2:1"), &[("x-forwarded-for", &chain)]);
    assert_eq!(ip_of(&trust_all, &req), Some(ip("10.0.0.1")));
    assert_eq!(ip_of(&ClientIp::hops(1000), &req), Some(ip("10.0.0.1")));
    let chain = fill(b"for=\"[fd00::1]:1\",");
    let req = request(Some("10.0.0.2:1"), &[("forwarded", &chain)]);
    assert_eq!(ip_of(&trust_all, &req), Some(ip("fd00::1")));
}

/// Header text a client may send: fragments that matter to the parsers.
fn hostile_text() -> impl Strategy<Value = Vec<u8>> {
    let fragment = prop_oneof![
        Just(b"for=".to_vec()),
        Just(b"For=".to_vec()),
        Just(b"\"".to_vec()),
        Just(b",".to_vec()),
        Just(b";".to_vec()),
        Just(b"\\".to_vec()),
        Just(b"[".to_vec()),
        Just(b"]".to_vec()),
        Just(b":".to_vec()),
        Just(b"=".to_vec()),
        Just(b" ".to_vec()),
        Just(b"198.51.100.1".to_vec()),
        Just(b"2001:db8::66".to_vec()),
        Just(b"10.0.0.9".to_vec()),
        Just(b"unknown".to_vec()),
        Just(b"_x".to_vec()),
        Just(b"\xff".to_vec()),
        proptest::collection::vec(prop_oneof![Just(b'\t'), 0x20u8..0x7f, 0x80u8..=0xff], 1..4),
    ];
    proptest::collection::vec(fragment, 0..16).prop_map(|parts| parts.concat())
}

proptest! {
    // No regression files: this crate's test data stays in the sources.
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    /// Whatever a client writes before the entry its proxy appends, the key is the real
    /// client — or, when the client's text swallows the appended entry (an unclosed
    /// quote in `Forwarded`), the proxy. Never anything the client chose.
    #[test]
    fn clients_cannot_choose_their_address(prefix in hostile_text()) {
        // (header, what the proxy appends, the address in it)
        let appended: [(&str, &str, &str); 4] = [
            ("x-forwarded-for", "203.0.113.7", CLIENT),
            ("x-forwarded-for", "[2001:db8::7]:443", "2001:db8::7"),
            ("forwarded", "for=203.0.113.7", CLIENT),
            ("forwarded", "For=\"[2001:db8::7]:443\";proto=https", "2001:db8::7"),
        ];
        let proxy = Some(ip("10.0.0.2"));
        for (name, entry, real) in appended {
            let real = Some(ip(real));
            let only = if name == "forwarded" {
                behind_proxies().only_forwarded()
            } else {
                behind_proxies().only_x_forwarded_for()
            };
            let client_ips = [only, behind_proxies(), ClientIp::hops(1)];
            // Appended to the client's line.
            let value = [&prefix[..], b", ", entry.as_bytes()].concat();
            let req = request(Some("10.0.0.2:1"), &[(name, &value)]);
            for client_ip in &client_ips {
                let found = ip_of(client_ip, &req);
                prop_assert!(
                    found == real || (name == "forwarded" && found == proxy),
                    "{name}: {} -> {found:?}",
                    value.escape_ascii()
                );
            }
            // As a line of its own: always the real client.
            let req = request(Some("10.0.0.2:1"), &[(name, &prefix), (name, entry.as_bytes())]);
            for client_ip in &client_ips {
                prop_assert_eq!(ip_of(client_ip, &req), real);
            }
        }
    }

    /// Arbitrary header bytes never panic, in any header or mode.
    #[test]
    fn arbitrary_values_never_panic(
        value in proptest::collection::vec(prop_oneof![Just(b'\t'), 0x20u8..0x7f, 0x80u8..=0xff], 0..256),
    ) {
        for name in ["forwarded", "x-forwarded-for", "x-real-ip"] {
            let req = request(Some("10.0.0.2:1"), &[(name, &value)]);
            for client_ip in [behind_proxies(), ClientIp::hops(1), ClientIp::hops(3).ipv6_prefix(64)] {
                let _ = key(&client_ip, &req);
            }
        }
    }
}

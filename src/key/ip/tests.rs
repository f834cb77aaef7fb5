//! Tests of `IpCidr`, `PeerIp` and `ClientIp`; the parsing of hostile headers is tested in
//! `forwarded_tests`.

use super::*;
use http::HeaderValue;

pub(super) const CLIENT: &str = "203.0.113.7";

pub(super) fn request(peer: Option<&str>, headers: &[(&str, &[u8])]) -> http::Request<()> {
    let mut builder = http::Request::builder();
    for &(name, value) in headers {
        builder = builder.header(name, HeaderValue::from_bytes(value).unwrap());
    }
    let mut req = builder.body(()).unwrap();
    if let Some(peer) = peer {
        req.extensions_mut()
            .insert(peer.parse::<SocketAddr>().unwrap());
    }
    req
}

pub(super) fn key(extractor: &impl KeyExtractor, req: &http::Request<()>) -> Option<String> {
    extractor.extract(&RequestView::of(req))
}

pub(super) fn ip_of(client_ip: &ClientIp, req: &http::Request<()>) -> Option<IpAddr> {
    client_ip.ip(&RequestView::of(req))
}

pub(super) fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

pub(super) fn nets(list: &[&str]) -> Vec<IpCidr> {
    list.iter().map(|n| n.parse().unwrap()).collect()
}

/// Trusts 10.0.0.0/8 (the load balancers) and 192.168.0.0/16 (an inner tier).
pub(super) fn behind_proxies() -> ClientIp {
    ClientIp::trusted_proxies(nets(&["10.0.0.0/8", "192.168.0.0/16"]))
}

// --- IpCidr --------------------------------------------------------------------------

#[test]
fn cidr_parses_networks_and_bare_addresses() {
    let net: IpCidr = "10.0.0.0/8".parse().unwrap();
    assert_eq!(net.network(), ip("10.0.0.0"));
    assert_eq!(net.prefix_len(), 8);
    assert!(net.contains(ip("10.255.1.2")));
    assert!(!net.contains(ip("11.0.0.0")));

    let net: IpCidr = "2001:db8::/32".parse().unwrap();
    assert!(net.contains(ip("2001:db8:ffff::1")));
    assert!(!net.contains(ip("2001:db9::1")));
    assert_eq!(net.to_string(), "2001:db8::/32");

    let host: IpCidr = "192.0.2.1".parse().unwrap();
    assert_eq!(host.prefix_len(), 32);
    assert!(host.contains(ip("192.0.2.1")));
    assert!(!host.contains(ip("192.0.2.2")));
    let host: IpCidr = "2001:db8::1".parse().unwrap();
    assert_eq!(host.prefix_len(), 128);
    assert_eq!(host, IpCidr::from(ip("2001:db8::1")));

    // Whitespace around, /0, /32.
    assert_eq!(
        " 10.0.0.0/8\t".parse::<IpCidr>().unwrap(),
        net_of("10.0.0.0/8")
    );
    assert!(net_of("0.0.0.0/0").contains(ip("255.255.255.255")));
    assert!(net_of("::/0").contains(ip("ffff::1")));
    assert!(net_of("192.0.2.1/32").contains(ip("192.0.2.1")));
}

fn net_of(text: &str) -> IpCidr {
    text.parse().unwrap()
}

#[test]
fn cidr_masks_host_bits() {
    let net = net_of("10.1.2.3/8");
    assert_eq!(net, net_of("10.0.0.0/8"));
    assert_eq!(net.to_string(), "10.0.0.0/8");
    assert_eq!(
        net_of("2001:db8:1:2:3::1/48").to_string(),
        "2001:db8:1::/48"
    );
    assert_eq!(net_of("172.31.255.255/12").to_string(), "172.16.0.0/12");
    assert_eq!(
        IpCidr::new(ip("192.0.2.77"), 24).unwrap().to_string(),
        "192.0.2.0/24"
    );
}

#[test]
fn cidr_errors_name_the_text_and_the_reason() {
    let cases: &[(&str, IpCidrErrorKind)] = &[
        ("", IpCidrErrorKind::BadAddress),
        ("10.0.0/8", IpCidrErrorKind::BadAddress),
        ("/8", IpCidrErrorKind::BadAddress),
        ("localhost", IpCidrErrorKind::BadAddress),
        ("010.0.0.0/8", IpCidrErrorKind::BadAddress),
        ("[2001:db8::]/32", IpCidrErrorKind::BadAddress),
        ("10.0.0.0 /8", IpCidrErrorKind::BadAddress),
        ("10.0.0.0/", IpCidrErrorKind::BadPrefix),
        ("10.0.0.0/+8", IpCidrErrorKind::BadPrefix),
        ("10.0.0.0/-1", IpCidrErrorKind::BadPrefix),
        ("10.0.0.0/8/8", IpCidrErrorKind::BadPrefix),
        ("10.0.0.0/eight", IpCidrErrorKind::BadPrefix),
        ("10.0.0.0/ 8", IpCidrErrorKind::BadPrefix),
        ("10.0.0.0/33", IpCidrErrorKind::PrefixTooLong { max: 32 }),
        (
            "10.0.0.0/99999999999999999999",
            IpCidrErrorKind::PrefixTooLong { max: 32 },
        ),
        (
            "2001:db8::/129",
            IpCidrErrorKind::PrefixTooLong { max: 128 },
        ),
        (
            "2001:db8::/256",
            IpCidrErrorKind::PrefixTooLong { max: 128 },
        ),
    ];
    for (text, reason) in cases {
        let err = text.parse::<IpCidr>().unwrap_err();
        assert_eq!(*err.kind(), *reason, "{text:?}");
        assert_eq!(err.part(), *text);
        let message = err.to_string();
        assert!(message.contains(&format!("{text:?}")), "{message}");
    }
    assert_eq!(
        "10.0.0.0/33".parse::<IpCidr>().unwrap_err().to_string(),
        "invalid IP network \"10.0.0.0/33\": the prefix length is longer than 32 bits"
    );
    assert_eq!(
        "nope/8".parse::<IpCidr>().unwrap_err().to_string(),
        "invalid IP network \"nope/8\": not an IPv4 or IPv6 address"
    );
    let err = IpCidr::new(ip("10.0.0.0"), 33).unwrap_err();
    assert_eq!(*err.kind(), IpCidrErrorKind::PrefixTooLong { max: 32 });
    assert_eq!(err.part(), "10.0.0.0/33");
    assert!(IpCidr::new(ip("::"), 129).is_err());
    let boxed: Box<dyn std::error::Error> = Box::new("x".parse::<IpCidr>().unwrap_err());
    assert!(boxed.to_string().contains("\"x\""));
}

#[test]
fn cidr_treats_ipv4_mapped_as_ipv4() {
    let net = net_of("10.0.0.0/8");
    assert!(net.contains(ip("::ffff:10.1.2.3")));
    assert!(!net.contains(ip("::ffff:11.1.2.3")));
    // A mapped network is the IPv4 network.
    assert_eq!(net_of("::ffff:10.0.0.0/104"), net);
    assert_eq!(net_of("::ffff:192.0.2.1"), net_of("192.0.2.1/32"));
    assert_eq!(net_of("::ffff:0:0/96"), net_of("0.0.0.0/0"));
    assert!(net_of("::ffff:10.0.0.0/104").contains(ip("10.9.9.9")));
    // Families do not mix; IPv4-compatible (::a.b.c.d) is not mapped.
    assert!(!net_of("::/0").contains(ip("192.0.2.1")));
    assert!(!net_of("::/0").contains(ip("::ffff:192.0.2.1")));
    assert!(!net_of("0.0.0.0/0").contains(ip("2001:db8::1")));
    assert!(!net.contains(ip("::10.1.2.3")));
}

#[test]
fn private_networks_cover_internal_ranges_only() {
    let private = IpCidr::private_networks();
    for inside in [
        "127.0.0.1",
        "10.200.0.1",
        "172.16.0.1",
        "172.31.255.254",
        "192.168.1.1",
        "169.254.169.254",
        "::1",
        "fd00::1",
        "fc12::1",
        "fe80::1",
        "::ffff:10.0.0.1",
    ] {
        assert!(is_trusted(&private, ip(inside)), "{inside}");
    }
    for outside in [
        "8.8.8.8",
        "172.32.0.1",
        "192.0.2.1",
        "2001:db8::1",
        "fec0::1",
        "::",
        "::ffff:8.8.8.8",
    ] {
        assert!(!is_trusted(&private, ip(outside)), "{outside}");
    }
    // Each network is already in canonical (masked) form.
    for net in private {
        assert_eq!(net.to_string().parse::<IpCidr>().unwrap(), net);
    }
}

// --- PeerIp --------------------------------------------------------------------------

#[test]
fn peer_ip_reads_socket_addr_then_ip_addr() {
    let req = request(Some("192.0.2.1:5000"), &[]);
    assert_eq!(key(&PeerIp::new(), &req).as_deref(), Some("ip:192.0.2.1"));

    let mut req = request(None, &[]);
    req.extensions_mut().insert(ip("2001:db8::5"));
    assert_eq!(
        key(&PeerIp::new(), &req).as_deref(),
        Some("ip:2001:db8::/64")
    );

    // A SocketAddr wins over an IpAddr.
    req.extensions_mut()
        .insert("198.51.100.2:1".parse::<SocketAddr>().unwrap());
    assert_eq!(
        key(&PeerIp::default(), &req).as_deref(),
        Some("ip:198.51.100.2")
    );

    assert_eq!(key(&PeerIp::new(), &request(None, &[])), None);
    // Headers mean nothing to PeerIp.
    let req = request(None, &[("x-forwarded-for", b"192.0.2.1")]);
    assert_eq!(key(&PeerIp::new(), &req), None);
}

#[cfg(feature = "axum")]
#[test]
fn peer_ip_prefers_axum_connect_info() {
    let mut req = request(Some("192.0.2.1:5000"), &[]);
    req.extensions_mut().insert(axum::extract::ConnectInfo(
        "198.51.100.9:443".parse::<SocketAddr>().unwrap(),
    ));
    assert_eq!(
        key(&PeerIp::new(), &req).as_deref(),
        Some("ip:198.51.100.9")
    );

    // ClientIp reads the same peer: trusted proxy via ConnectInfo.
    let mut req = request(None, &[("x-forwarded-for", CLIENT.as_bytes())]);
    req.extensions_mut().insert(axum::extract::ConnectInfo(
        "10.0.0.2:443".parse::<SocketAddr>().unwrap(),
    ));
    assert_eq!(ip_of(&behind_proxies(), &req), Some(ip(CLIENT)));
}

/// IPv6 clients are keyed by their /64 unless told otherwise: a client rotating through the
/// addresses of its /64 has one key, not a new one each request.
#[test]
fn ipv6_prefix_groups_ipv6_only() {
    let grouped = PeerIp::new();
    let a = request(Some("[2001:db8:1:2:aaaa::1]:443"), &[]);
    let b = request(Some("[2001:db8:1:2:ffff:ffff:ffff:ffff]:80"), &[]);
    let c = request(Some("[2001:db8:1:3::1]:443"), &[]);
    assert_eq!(key(&grouped, &a).as_deref(), Some("ip:2001:db8:1:2::/64"));
    assert_eq!(key(&grouped, &a), key(&grouped, &b));
    assert_ne!(key(&grouped, &a), key(&grouped, &c));
    assert_eq!(key(&PeerIp::new().ipv6_prefix(64), &a), key(&grouped, &a));
    // Without grouping, the full address.
    let whole = PeerIp::new().ipv6_prefix(128);
    assert_eq!(key(&whole, &a).as_deref(), Some("ip:2001:db8:1:2:aaaa::1"));
    // Addresses that carry an IPv4 client's are keyed by it, whatever the prefix: NAT64's
    // well-known prefix, Teredo (its client's public address inverted in the last 32 bits;
    // the port the NAT gave it, also in the address, changes nothing) and 6to4 (every /64 of
    // the site's /48); the local-use NAT64 prefix whole.
    for (peer, v4_key) in [
        ("[64:ff9b::c000:201]:1", "ip:192.0.2.1"),
        ("[2001:0:4136:e378:8000:63bf:3fff:fdd2]:1", "ip:192.0.2.45"),
        ("[2001:0:4136:e378:8000:1234:3fff:fdd2]:1", "ip:192.0.2.45"),
        ("[2002:c000:201:1::5]:1", "ip:192.0.2.1"),
        ("[2002:c000:201:ffff::7]:1", "ip:192.0.2.1"),
        ("[2002:c000:202:1::5]:1", "ip:192.0.2.2"),
    ] {
        let req = request(Some(peer), &[]);
        assert_eq!(key(&grouped, &req).as_deref(), Some(v4_key), "{peer}");
        let wide = PeerIp::new().ipv6_prefix(32);
        assert_eq!(key(&wide, &req).as_deref(), Some(v4_key), "{peer}");
        assert_eq!(key(&whole, &req).as_deref(), Some(v4_key), "{peer}");
    }
    let local_nat64 = request(Some("[64:ff9b:1::c000:201]:1"), &[]);
    assert_eq!(
        key(&grouped, &local_nat64).as_deref(),
        Some("ip:64:ff9b:1::c000:201")
    );
    // IPv4 untouched.
    let v4 = request(Some("192.0.2.1:1"), &[]);
    assert_eq!(key(&grouped, &v4).as_deref(), Some("ip:192.0.2.1"));
    // 128 and above: no grouping; 0: one group for all of IPv6.
    assert_eq!(key(&PeerIp::new().ipv6_prefix(255), &a), key(&whole, &a));
    assert_eq!(
        key(&PeerIp::new().ipv6_prefix(0), &a).as_deref(),
        Some("ip:::/0")
    );
    assert_eq!(
        key(&PeerIp::new().ipv6_prefix(56), &a).as_deref(),
        Some("ip:2001:db8:1::/56")
    );

    // ClientIp groups the client, and trusts by full address.
    let client_ip = behind_proxies().ipv6_prefix(48);
    let req = request(
        Some("10.0.0.2:1"),
        &[("x-forwarded-for", b"[2001:db8:7:8::1]:5000")],
    );
    assert_eq!(key(&client_ip, &req).as_deref(), Some("ip:2001:db8:7::/48"));
    assert_eq!(ip_of(&client_ip, &req), Some(ip("2001:db8:7:8::1")));
}

#[test]
fn ipv4_mapped_peers_and_entries_are_ipv4() {
    let req = request(Some("[::ffff:203.0.113.7]:80"), &[]);
    assert_eq!(key(&PeerIp::new(), &req).as_deref(), Some("ip:203.0.113.7"));
    // Not an IPv6 address, so not grouped.
    assert_eq!(
        key(&PeerIp::new().ipv6_prefix(64), &req).as_deref(),
        Some("ip:203.0.113.7")
    );

    // A mapped proxy is trusted by the IPv4 network; mapped entries are IPv4.
    let req = request(
        Some("[::ffff:10.0.0.2]:80"),
        &[(
            "x-forwarded-for",
            b"::ffff:203.0.113.7, [::ffff:10.0.0.9]:80",
        )],
    );
    assert_eq!(
        key(&behind_proxies(), &req).as_deref(),
        Some("ip:203.0.113.7")
    );
    let req = request(
        Some("10.0.0.2:80"),
        &[("forwarded", b"for=\"[::ffff:203.0.113.7]:1\"")],
    );
    assert_eq!(
        key(&behind_proxies(), &req).as_deref(),
        Some("ip:203.0.113.7")
    );
}

// --- ClientIp: trusted proxies ---------------------------------------------------------

#[test]
fn forged_headers_from_an_untrusted_peer_are_ignored() {
    let req = request(
        Some("203.0.113.7:5000"),
        &[
            ("x-forwarded-for", b"10.0.0.1"),
            ("forwarded", b"for=10.0.0.1"),
            ("x-real-ip", b"10.0.0.1"),
        ],
    );
    for client_ip in [
        behind_proxies(),
        behind_proxies().only_forwarded(),
        behind_proxies().only_x_forwarded_for(),
        behind_proxies().only_x_real_ip(),
    ] {
        assert_eq!(key(&client_ip, &req).as_deref(), Some("ip:203.0.113.7"));
    }
    // No proxies trusted at all: the peer, always.
    let none = ClientIp::trusted_proxies([]);
    let req = request(Some("10.0.0.2:1"), &[("x-forwarded-for", b"198.51.100.1")]);
    assert_eq!(key(&none, &req).as_deref(), Some("ip:10.0.0.2"));
}

#[test]
fn x_forwarded_for_through_a_trusted_proxy_is_used() {
    let req = request(
        Some("10.0.0.2:41000"),
        &[("x-forwarded-for", CLIENT.as_bytes())],
    );
    assert_eq!(
        key(&behind_proxies(), &req).as_deref(),
        Some("ip:203.0.113.7")
    );
    // With a port, with spaces, bracketed IPv6.
    for value in ["203.0.113.7:5678", "  203.0.113.7  ", "\t203.0.113.7"] {
        let req = request(Some("10.0.0.2:1"), &[("x-forwarded-for", value.as_bytes())]);
        assert_eq!(
            ip_of(&behind_proxies(), &req),
            Some(ip(CLIENT)),
            "{value:?}"
        );
    }
    for value in ["2001:db8::1", "[2001:db8::1]", "[2001:db8::1]:443"] {
        let req = request(Some("10.0.0.2:1"), &[("x-forwarded-for", value.as_bytes())]);
        assert_eq!(
            ip_of(&behind_proxies(), &req),
            Some(ip("2001:db8::1")),
            "{value:?}"
        );
        assert_eq!(
            key(&behind_proxies(), &req).as_deref(),
            Some("ip:2001:db8::/64"),
            "{value:?}"
        );
    }
    // A trusted peer without any header is itself the client (e.g. a health check).
    let req = request(Some("10.0.0.2:1"), &[]);
    assert_eq!(key(&behind_proxies(), &req).as_deref(), Some("ip:10.0.0.2"));
}

#[test]
fn trusted_hops_are_skipped() {
    let req = request(
        Some("10.0.0.2:1"),
        &[("x-forwarded-for", b"203.0.113.7, 192.168.1.1, 10.0.0.9")],
    );
    assert_eq!(ip_of(&behind_proxies(), &req), Some(ip(CLIENT)));

    // Several lines form one list, in order.
    let req = request(
        Some("10.0.0.2:1"),
        &[
            ("x-forwarded-for", b"203.0.113.7"),
            ("x-forwarded-for", b"192.168.1.1, 10.0.0.9"),
        ],
    );
    assert_eq!(ip_of(&behind_proxies(), &req), Some(ip(CLIENT)));

    // Everything trusted: the leftmost.
    let req = request(
        Some("10.0.0.2:1"),
        &[("x-forwarded-for", b"192.168.7.7, 10.0.0.9")],
    );
    assert_eq!(ip_of(&behind_proxies(), &req), Some(ip("192.168.7.7")));

    // Empty list elements are ignored.
    let req = request(
        Some("10.0.0.2:1"),
        &[("x-forwarded-for", b", 203.0.113.7,, 10.0.0.9,")],
    );
    assert_eq!(ip_of(&behind_proxies(), &req), Some(ip(CLIENT)));
}

#[test]
fn forged_left_entries_are_never_reached() {
    // The client sent "X-Forwarded-For: 1.1.1.1, 10.0.0.77"; the balancer appended the
    // real address. The rightmost untrusted entry is the client.
    let req = request(
        Some("10.0.0.2:1"),
        &[(
            "x-forwarded-for",
            b"1.1.1.1, 10.0.0.77, 203.0.113.7, 10.0.0.9",
        )],
    );
    assert_eq!(ip_of(&behind_proxies(), &req), Some(ip(CLIENT)));

    // The client's own line, then the proxy's line.
    let req = request(
        Some("10.0.0.2:1"),
        &[
            ("x-forwarded-for", b"10.0.0.1, 192.168.0.1"),
            ("x-forwarded-for", b"203.0.113.7"),
        ],
    );
    assert_eq!(ip_of(&behind_proxies(), &req), Some(ip(CLIENT)));

    // Same with Forwarded.
    let req = request(
        Some("10.0.0.2:1"),
        &[("forwarded", b"for=1.1.1.1, for=10.0.0.1, for=203.0.113.7")],
    );
    assert_eq!(ip_of(&behind_proxies(), &req), Some(ip(CLIENT)));
}

#[test]
fn headers_must_agree_unless_one_is_chosen() {
    // The proxy maintains X-Forwarded-For; the client added a Forwarded header.
    let req = request(
        Some("10.0.0.2:1"),
        &[
            ("x-forwarded-for", b"203.0.113.7"),
            ("forwarded", b"for=198.51.100.1"),
        ],
    );
    assert_eq!(ip_of(&behind_proxies(), &req), Some(ip("10.0.0.2")));
    assert_eq!(
        ip_of(&behind_proxies().only_x_forwarded_for(), &req),
        Some(ip(CLIENT))
    );
    assert_eq!(
        ip_of(&behind_proxies().only_forwarded(), &req),
        Some(ip("198.51.100.1"))
    );
    assert_eq!(
        ip_of(&behind_proxies().only_x_real_ip(), &req),
        Some(ip("10.0.0.2"))
    );

    // nginx-style: both set, in agreement.
    let req = request(
        Some("10.0.0.2:1"),
        &[
            ("x-forwarded-for", b"1.1.1.1, 203.0.113.7"),
            ("x-real-ip", b"203.0.113.7"),
            ("forwarded", b"for=203.0.113.7"),
        ],
    );
    assert_eq!(ip_of(&behind_proxies(), &req), Some(ip(CLIENT)));

    // A forged X-Real-IP next to the proxy's X-Forwarded-For.
    let req = request(
        Some("10.0.0.2:1"),
        &[
            ("x-forwarded-for", b"203.0.113.7"),
            ("x-real-ip", b"198.51.100.1"),
        ],
    );
    assert_eq!(ip_of(&behind_proxies(), &req), Some(ip("10.0.0.2")));
}

#[test]
fn x_real_ip_is_one_address_from_a_trusted_peer() {
    let only = behind_proxies().only_x_real_ip();
    let req = request(Some("10.0.0.2:1"), &[("x-real-ip", CLIENT.as_bytes())]);
    assert_eq!(ip_of(&only, &req), Some(ip(CLIENT)));
    assert_eq!(ip_of(&behind_proxies(), &req), Some(ip(CLIENT)));
    let req = request(Some("10.0.0.2:1"), &[("x-real-ip", b"[2001:db8::1]:80")]);
    assert_eq!(ip_of(&only, &req), Some(ip("2001:db8::1")));

    // From an untrusted peer: ignored.
    let req = request(Some("198.51.100.1:1"), &[("x-real-ip", CLIENT.as_bytes())]);
    assert_eq!(ip_of(&only, &req), Some(ip("198.51.100.1")));

    // Not one address: the peer.
    for lines in [
        &[("x-real-ip", &b"203.0.113.7, 1.1.1.1"[..])][..],
        &[("x-real-ip", b"203.0.113.7"), ("x-real-ip", b"1.1.1.1")],
        &[("x-real-ip", b"unknown")],
        &[("x-real-ip", b"")],
    ] {
        let req = request(Some("10.0.0.2:1"), lines);
        assert_eq!(ip_of(&only, &req), Some(ip("10.0.0.2")), "{lines:?}");
    }
}

#[test]
fn no_peer_address_with_trusted_proxies_is_missing() {
    let req = request(None, &[("x-forwarded-for", CLIENT.as_bytes())]);
    assert_eq!(key(&behind_proxies(), &req), None);
    assert_eq!(key(&behind_proxies(), &request(None, &[])), None);
}

// --- ClientIp: hops ----------------------------------------------------------------------

#[test]
fn hops_take_the_nth_entry_from_the_right() {
    let one = ClientIp::hops(1);
    let two = ClientIp::hops(2);
    let peer = Some("10.0.0.2:1");

    let req = request(peer, &[("x-forwarded-for", b"1.1.1.1, 203.0.113.7")]);
    assert_eq!(ip_of(&one, &req), Some(ip(CLIENT)));
    assert_eq!(ip_of(&two, &req), Some(ip("1.1.1.1")));

    let req = request(
        peer,
        &[("x-forwarded-for", b"1.1.1.1, 203.0.113.7, 192.168.0.5")],
    );
    assert_eq!(ip_of(&two, &req), Some(ip(CLIENT)));
    // Hops do not look at trust: the address is whatever the proxy wrote.
    let req = request(peer, &[("x-forwarded-for", b"1.1.1.1, 10.0.0.5")]);
    assert_eq!(ip_of(&one, &req), Some(ip("10.0.0.5")));

    // Forwarded works the same.
    let req = request(
        peer,
        &[(
            "forwarded",
            b"for=1.1.1.1, for=\"[2001:db8::9]:1\", for=10.0.0.3",
        )],
    );
    assert_eq!(
        ip_of(&two.clone().only_forwarded(), &req),
        Some(ip("2001:db8::9"))
    );

    // X-Real-IP with hops >= 1.
    let req = request(peer, &[("x-real-ip", CLIENT.as_bytes())]);
    assert_eq!(ip_of(&one, &req), Some(ip(CLIENT)));
    assert_eq!(ip_of(&two.clone().only_x_real_ip(), &req), Some(ip(CLIENT)));
    assert_eq!(ip_of(&ClientIp::hops(0), &req), Some(ip("10.0.0.2")));
}

#[test]
fn fewer_entries_than_hops_fall_back_to_the_peer() {
    let three = ClientIp::hops(3);
    let req = request(
        Some("10.0.0.2:1"),
        &[("x-forwarded-for", b"203.0.113.7, 192.168.0.5")],
    );
    assert_eq!(ip_of(&three, &req), Some(ip("10.0.0.2")));
    let req = request(Some("10.0.0.2:1"), &[]);
    assert_eq!(ip_of(&three, &req), Some(ip("10.0.0.2")));
    // And without a peer, nothing.
    let req = request(None, &[("x-forwarded-for", b"203.0.113.7, 192.168.0.5")]);
    assert_eq!(ip_of(&three, &req), None);
    // Enough entries: no peer needed.
    assert_eq!(ip_of(&ClientIp::hops(2), &req), Some(ip(CLIENT)));
    // hops(0): the peer, headers ignored.
    let req = request(
        Some("198.51.100.1:1"),
        &[("x-forwarded-for", CLIENT.as_bytes())],
    );
    assert_eq!(ip_of(&ClientIp::hops(0), &req), Some(ip("198.51.100.1")));
}

#[test]
fn hops_stop_at_entries_that_are_not_addresses() {
    let two = ClientIp::hops(2);
    let req = request(
        Some("10.0.0.2:1"),
        &[("x-forwarded-for", b"1.1.1.1, unknown, 192.168.0.5")],
    );
    assert_eq!(ip_of(&two, &req), Some(ip("192.168.0.5")));
    let req = request(
        Some("10.0.0.2:1"),
        &[("forwarded", b"for=1.1.1.1, for=unknown")],
    );
    assert_eq!(ip_of(&two, &req), Some(ip("10.0.0.2")));
}

// --- Keys written in place -------------------------------------------------------------

#[test]
fn ip_keys_are_the_display_of_the_address() {
    let mut addresses: Vec<IpAddr> = Vec::new();
    for a in [0u8, 1, 9, 10, 99, 100, 199, 200, 255] {
        for b in [0u8, 7, 42, 250] {
            addresses.push(IpAddr::from([a, b, 255 - a, b.wrapping_mul(3)]));
        }
    }
    // every octet, in every place
    for o in 0..=255u8 {
        addresses.push(IpAddr::from([o, 255 - o, o / 2, o.wrapping_mul(7)]));
    }
    for text in [
        "::",
        "::1",
        "2001:db8::7",
        "2001:db8:1:2:aaaa::1",
        "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        "fe80::1:2:3:4",
    ] {
        addresses.push(ip(text));
    }
    for address in addresses {
        for prefix in [0u8, 48, 64, 127, 128] {
            let expected = match address {
                IpAddr::V6(v6) if prefix < 128 => {
                    format!("ip:{}", Ipv6Net::new(v6, prefix).unwrap().trunc())
                }
                _ => format!("ip:{address}"),
            };
            assert_eq!(ip_key(address, prefix), expected);
            let id = ip_identifier(address, prefix);
            assert!(matches!(id, Identifier::Inline(_)), "{expected}");
            assert_eq!(id.as_ref(), expected);
        }
    }
}

#[test]
fn identifiers_in_place_match_the_extracted_keys() {
    let client_ip = behind_proxies();
    for (peer, headers) in [
        (Some("203.0.113.7:1"), &[][..]),
        (Some("[2001:db8::9]:1"), &[][..]),
        (
            Some("10.0.0.2:1"),
            &[("x-forwarded-for", &b"198.51.100.4"[..])][..],
        ),
        (None, &[][..]),
    ] {
        let req = request(peer, headers);
        let view = RequestView::of(&req);
        let texts = |id: Option<Identifier>| id.map(|id| id.as_ref().to_owned());
        assert_eq!(
            texts(PeerIp::new().identifier(&view)),
            key(&PeerIp::new(), &req)
        );
        assert_eq!(texts(client_ip.identifier(&view)), key(&client_ip, &req));
    }
}

//! Peer and client IP extractors, and the IP networks they trust.
//!
//! Every address is canonicalised before it is compared or keyed: an IPv4-mapped IPv6 address
//! (`::ffff:192.0.2.1`) *is* the IPv4 address (`192.0.2.1`), so a dual-stack listener and an
//! IPv4 listener key the same client identically, and IPv4 networks match it.
//!
//! The networks are in `cidr`, the parsing of the forwarding headers in `forwarded`.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ops::ControlFlow;
use std::sync::Arc;

use http::header::HeaderMap;
use http::Extensions;
use ipnet::Ipv6Net;

use super::id::{Identifier, InlineText};
use super::{KeyExtractor, RequestView};
use crate::observe::BoundedLog;

mod cidr;
mod forwarded;
#[cfg(test)]
mod forwarded_tests;
#[cfg(test)]
mod tests;

pub use cidr::{IpCidr, IpCidrError, IpCidrErrorKind};
use forwarded::{real_ip, walk_chain, ForwardingHeader, Hop};

// ---------------------------------------------------------------------------------------------
// Keys and the peer address
// ---------------------------------------------------------------------------------------------

/// The key of `ip`: `ip:ADDRESS`, or `ip:NETWORK/PREFIX` for IPv6 grouped by a prefix shorter
/// than 128 bits. `ip` is canonical (never IPv4-mapped).
fn ip_key(ip: IpAddr, ipv6_prefix: u8) -> String {
    let mut key = String::with_capacity(24);
    let _ = write_ip_key(&mut key, ip, ipv6_prefix);
    key
}

/// [`ip_key`], in place when it fits (it always does: `ip:` and at most 43 bytes).
fn ip_identifier(ip: IpAddr, ipv6_prefix: u8) -> Identifier {
    let mut key = InlineText::new();
    let written = match ip {
        IpAddr::V4(v4) => push_v4_key(&mut key, v4),
        IpAddr::V6(_) => write_ip_key(&mut key, ip, ipv6_prefix),
    };
    match written {
        Ok(()) => Identifier::Inline(key),
        Err(_) => Identifier::Owned(ip_key(ip, ipv6_prefix)),
    }
}

/// The key of `v4`, the key of most requests, in place: each octet's slot of [`OCTET_TEXT`]
/// copied whole, then cut to its digits and dot. The text is never checked again. The count
/// of digits is worked out rather than read from [`OCTETS`], which would be another line of
/// data on the request's path for each octet.
fn push_v4_key(key: &mut InlineText, v4: Ipv4Addr) -> fmt::Result {
    key.push_cut("ip:", 3)?;
    for (i, octet) in v4.octets().into_iter().enumerate() {
        let slot = usize::from(octet) * 4;
        let text = OCTET_TEXT.get(slot..slot + 4).ok_or(fmt::Error)?;
        key.push_cut(text, digits(octet) + usize::from(i < 3))?;
    }
    Ok(())
}

/// The key of `v4` (see [`ip_key`]), from the same slots, without the formatting machinery.
fn write_v4_key(out: &mut impl fmt::Write, v4: Ipv4Addr) -> fmt::Result {
    out.write_str("ip:")?;
    for (i, octet) in v4.octets().into_iter().enumerate() {
        let slot = usize::from(octet) * 4;
        let end = slot + digits(octet) + usize::from(i < 3);
        out.write_str(OCTET_TEXT.get(slot..end).ok_or(fmt::Error)?)?;
    }
    Ok(())
}

/// How many decimal digits `octet` has.
fn digits(octet: u8) -> usize {
    1 + usize::from(octet >= 10) + usize::from(octet >= 100)
}

/// Each octet's digits and a dot, in a slot of 4 bytes (the rest NUL): `0.\0\0`, …,
/// `255.`.
const OCTET_SLOTS: [u8; 1024] = {
    let mut slots = [0u8; 1024];
    let mut n = 0;
    while n < 256 {
        let [a, b, c, len] = OCTETS[n];
        let digits = [a, b, c];
        let mut k = 0;
        while k < len as usize {
            slots[n * 4 + k] = digits[k];
            k += 1;
        }
        slots[n * 4 + k] = b'.';
        n += 1;
    }
    slots
};

/// [`OCTET_SLOTS`] as text, checked once, when the crate is compiled.
const OCTET_TEXT: &str = match std::str::from_utf8(&OCTET_SLOTS) {
    Ok(text) => text,
    Err(_) => "",
};

/// The IPv6 prefix a client is keyed by unless told otherwise: a `/64`, the network one
/// subscriber or host is given and can rotate through (one address per request would be a new
/// key each time).
pub(crate) const DEFAULT_IPV6_PREFIX: u8 = 64;

/// The IPv4 client a `v6` address stands for, when it carries one whose place is fixed: the
/// well-known NAT64 prefix (`64:ff9b::/96`, the address in the last 32 bits), Teredo
/// (`2001::/32`, the client's public address in the last 32 bits, inverted) and 6to4
/// (`2002::/16`, bits 16 to 48: a site's whole `/48` is one IPv4 address's). Such a client is
/// keyed by its IPv4 address: by its IPv6 one, a Teredo client got a new key for each port
/// its NAT gave it (the port is in the address), and a 6to4 site one for each of its 65,536
/// `/64`s.
fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let (s, o) = (v6.segments(), v6.octets());
    let last = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    match (s[0], s[1]) {
        (0x64, 0xff9b) if s[2..6] == [0; 4] => Some(last),
        (0x2001, 0) => Some(Ipv4Addr::from(!u32::from(last))),
        (0x2002, _) => Some(Ipv4Addr::new(o[2], o[3], o[4], o[5])),
        _ => None,
    }
}

/// The shortest prefix a `v6` client may be grouped by without putting many IPv4 clients
/// under one key: the whole address (128) for the local-use NAT64 prefix (`64:ff9b:1::/48`),
/// whose IPv4 address lies where its operator's prefix length puts it; none (0) for the rest.
fn shortest_prefix(v6: Ipv6Addr) -> u8 {
    let s = v6.segments();
    match (s[0], s[1], s[2]) {
        (0x64, 0xff9b, 1) => 128,
        _ => 0,
    }
}

/// Writes the key of `ip` (see [`ip_key`]).
fn write_ip_key(out: &mut impl fmt::Write, ip: IpAddr, ipv6_prefix: u8) -> fmt::Result {
    let v6 = match ip {
        IpAddr::V4(v4) => return write_v4_key(out, v4),
        IpAddr::V6(v6) => v6,
    };
    if let Some(v4) = embedded_v4(v6) {
        return write_v4_key(out, v4);
    }
    match ipv6_prefix.max(shortest_prefix(v6)) {
        bits @ 0..128 => match Ipv6Net::new(v6, bits) {
            Ok(net) => write!(out, "ip:{}", net.trunc()),
            Err(_) => write!(out, "ip:{v6}"),
        },
        _ => write!(out, "ip:{v6}"),
    }
}

/// The decimal digits of each octet, then their count: `[b'7', 0, 0, 1]`, `[b'2', b'5',
/// b'5', 3]`.
const OCTETS: [[u8; 4]; 256] = {
    let mut table = [[0u8; 4]; 256];
    let mut n = 0;
    while n < 256 {
        let o = n as u8;
        table[n] = if o >= 100 {
            [b'0' + o / 100, b'0' + o / 10 % 10, b'0' + o % 10, 3]
        } else if o >= 10 {
            [b'0' + o / 10, b'0' + o % 10, 0, 2]
        } else {
            [b'0' + o, 0, 0, 1]
        };
        n += 1;
    }
    table
};

/// The TCP peer's address, canonicalised, from the request extensions: axum's
/// `ConnectInfo<SocketAddr>` (with the `axum` feature), else tonic's `TcpConnectInfo` (with
/// the `tonic` feature), else a `SocketAddr`, else an `IpAddr`.
fn peer_addr(extensions: &Extensions) -> Option<IpAddr> {
    #[cfg(feature = "axum")]
    if let Some(info) = extensions.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(info.0.ip().to_canonical());
    }
    #[cfg(feature = "tonic")]
    if let Some(addr) = extensions
        .get::<tonic::transport::server::TcpConnectInfo>()
        .and_then(|info| info.remote_addr())
    {
        return Some(addr.ip().to_canonical());
    }
    extensions
        .get::<SocketAddr>()
        .map(SocketAddr::ip)
        .or_else(|| extensions.get::<IpAddr>().copied())
        .map(|ip| ip.to_canonical())
}

// ---------------------------------------------------------------------------------------------
// PeerIp
// ---------------------------------------------------------------------------------------------

/// The TCP peer's IP address: `ip:192.0.2.1`, or for IPv6 its `/64`, `ip:2001:db8::/64`.
///
/// The address comes from the request extensions, the first found of:
///
/// * `axum::extract::ConnectInfo<SocketAddr>` (with the `axum` feature; serve with
///   `into_make_service_with_connect_info::<SocketAddr>()`),
/// * tonic's `TcpConnectInfo` (with the `tonic` feature; tonic records it over its own TLS
///   too, but a server fed TLS streams of its own gets only a `TlsConnectInfo`, which is not
///   read: copy its `get_ref().remote_addr()` into the request as a `SocketAddr` in a layer
///   of your own that runs before the rate limit),
/// * a `std::net::SocketAddr`,
/// * a `std::net::IpAddr`.
///
/// The key is missing when none is there. Behind a reverse proxy the peer is the proxy: use
/// [`ClientIp`] there.
///
/// An IPv6 client usually controls a whole `/64` (or more) and can rotate through its
/// addresses, so IPv6 peers are keyed by their `/64` (`ip:2001:db8:1:2::/64`);
/// [`PeerIp::ipv6_prefix`] picks another prefix. Addresses that carry an IPv4 client's
/// (NAT64's `64:ff9b::/96`, Teredo, 6to4) are keyed by that IPv4 address.
#[derive(Debug, Clone, Copy)]
pub struct PeerIp {
    ipv6_prefix: u8,
}

impl PeerIp {
    /// Keys by the peer address: an IPv4 address whole, an IPv6 one by its `/64`.
    pub fn new() -> PeerIp {
        PeerIp {
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }

    /// Keys IPv6 peers by their network of `bits` bits (default 64): with `56`,
    /// `2001:db8:1:2::7` is `ip:2001:db8:1::/56`. IPv4 peers are not grouped; IPv6
    /// addresses that carry an IPv4 client's are keyed by it (NAT64's `64:ff9b::/96`,
    /// Teredo's `2001::/32`, 6to4's `2002::/16`: `2002:c000:201:1::5` is `ip:192.0.2.1`),
    /// and the local-use NAT64 prefix `64:ff9b:1::/48` whole. `bits` of 128 and above key
    /// every other address whole.
    pub fn ipv6_prefix(mut self, bits: u8) -> PeerIp {
        self.ipv6_prefix = bits.min(128);
        self
    }

    /// The peer address of `req` (canonical, not grouped), if the server recorded it.
    pub fn ip(&self, req: &RequestView<'_>) -> Option<IpAddr> {
        peer_addr(req.extensions)
    }
}

impl Default for PeerIp {
    fn default() -> PeerIp {
        PeerIp::new()
    }
}

impl KeyExtractor for PeerIp {
    fn extract(&self, req: &RequestView<'_>) -> Option<String> {
        Some(ip_key(self.ip(req)?, self.ipv6_prefix))
    }
}

impl PeerIp {
    /// [`extract`](KeyExtractor::extract)'s key, in place.
    pub(crate) fn identifier(&self, req: &RequestView<'_>) -> Option<Identifier> {
        Some(ip_identifier(self.ip(req)?, self.ipv6_prefix))
    }
}

// ---------------------------------------------------------------------------------------------
// ClientIp
// ---------------------------------------------------------------------------------------------

/// The client's IP address behind reverse proxies: `ip:203.0.113.7`.
///
/// # Security model
///
/// Forwarding headers are written by whoever sent the request, so a client can put any
/// address in them. Only entries written by proxies you trust are believed, and proxies
/// *append*: the trustworthy part of a chain is its right end. `ClientIp` therefore:
///
/// 1. starts from the TCP peer address (found as by [`PeerIp`]);
/// 2. with [`ClientIp::trusted_proxies`], keys by the peer itself when the peer is not a
///    trusted proxy, ignoring every header — a client that connects directly cannot forge
///    anything;
/// 3. otherwise walks the chain from the right (nearest proxy first; several header lines are
///    read in order, as one list), skipping trusted proxies. The first untrusted address is
///    the client; if every entry is trusted, the leftmost is. Addresses the client prepended
///    lie to the left of the one your proxy appended and are never reached.
///
/// An entry that is not an IP address (`unknown`, an obfuscated `_name`, garbage, bytes
/// that are not text) stops the walk: the client is the last address read before it — the
/// proxy that received the request from that unknown hop — or the peer when there is none.
/// Nothing beyond it is read.
///
/// With [`ClientIp::hops`] the proxies are counted instead of recognised; see there.
///
/// ```
/// use std::net::SocketAddr;
/// use tollgate::key::{ClientIp, IpCidr, KeyExtractor, RequestView};
///
/// let client_ip = ClientIp::trusted_proxies(["10.0.0.0/8".parse::<IpCidr>()?]);
///
/// // Through the load balancer 10.0.0.2: the client prepended a forged address, the balancer
/// // appended the real one.
/// let mut req = http::Request::builder()
///     .header("x-forwarded-for", "198.51.100.1, 203.0.113.7")
///     .body(())?;
/// req.extensions_mut().insert("10.0.0.2:41000".parse::<SocketAddr>()?);
/// assert_eq!(client_ip.extract(&RequestView::of(&req)).as_deref(), Some("ip:203.0.113.7"));
///
/// // Straight from the internet: the header is not believed at all.
/// let mut req = http::Request::builder()
///     .header("x-forwarded-for", "198.51.100.1")
///     .body(())?;
/// req.extensions_mut().insert("203.0.113.7:52000".parse::<SocketAddr>()?);
/// assert_eq!(client_ip.extract(&RequestView::of(&req)).as_deref(), Some("ip:203.0.113.7"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Headers
///
/// By default `ClientIp` reads every one of RFC 7239 `Forwarded`, `X-Forwarded-For` and
/// `X-Real-IP` that the request carries, and uses the answer only when they all give the same
/// client; when they disagree it keys by the peer. That is because a proxy usually maintains
/// one of them and passes the others through untouched: reading `Forwarded` "if present"
/// would let a client behind an `X-Forwarded-For` proxy choose its key by sending a
/// `Forwarded` header. The price of this caution: if your proxies legitimately write
/// headers that disagree (say, a second proxy sets `X-Real-IP` to the first proxy's
/// address), every client gets the proxy's key. A client can bring that about for itself
/// too, by sending a header its proxy passes through (or a `Forwarded` line it leaves
/// unclosed for the proxy to append to): it then shares the proxy's key with every client
/// whose headers disagree too, one more quota than its own. It cannot take another client's
/// key, but it can spend that shared quota, and with it deny the clients that share it
/// innocently (behind an intermediary that adds an element without `for`, say). Name the
/// header your proxies maintain with [`ClientIp::only_forwarded`],
/// [`ClientIp::only_x_forwarded_for`] or [`ClientIp::only_x_real_ip`] — which is the better
/// configuration anyway: headers the proxy does not maintain are then not read at all.
///
/// `X-Real-IP` is a single address (several lines, or a list, is not usable), believed when
/// the peer is a trusted proxy or `hops` is at least 1; your proxy must overwrite any
/// `X-Real-IP` the client sent.
///
/// # Missing
///
/// The key is missing when the server recorded no peer address and the headers give no
/// usable answer. With `trusted_proxies` a missing peer address always means a missing key:
/// without it nobody can be told apart from a trusted proxy.
///
/// # Falling back to a proxy's address
///
/// Each time the headers of a request that came through the proxies give no client — they
/// disagree, an entry is not an address, or (`hops`) there are fewer entries than hops — and
/// the request is keyed by a proxy's address instead, that is counted in
/// `tollgate_client_ip_fallbacks_total{reason}` (`headers_disagree`, `not_an_address`,
/// `too_few_hops`) and logged as a warning at most every 10 s: when it is every request,
/// every client shares one quota, and the cause is the proxies' headers.
#[derive(Debug, Clone)]
pub struct ClientIp {
    trust: Trust,
    source: Source,
    ipv6_prefix: u8,
    /// The requests keyed by a proxy's address because the headers gave no client.
    fallbacks: Arc<BoundedLog>,
}

#[derive(Debug, Clone)]
enum Trust {
    /// Proxies recognised by address.
    Proxies(Vec<IpCidr>),
    /// Exactly this many proxies in front of us.
    Hops(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// All present headers, which must agree.
    Any,
    /// Only this one.
    Only(ForwardingHeader),
}

impl ClientIp {
    /// Believes forwarding headers only from the given proxies, recognised by address: the
    /// peer, and each entry walked from the right, is skipped while it is in one of
    /// `proxies`. With no proxies at all this keys by the peer, like [`PeerIp`].
    ///
    /// This is the robust configuration: it stays safe when a request reaches the server
    /// without passing through the proxies.
    pub fn trusted_proxies(proxies: impl IntoIterator<Item = IpCidr>) -> ClientIp {
        ClientIp {
            trust: Trust::Proxies(proxies.into_iter().collect()),
            source: Source::Any,
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
            fallbacks: Arc::default(),
        }
    }

    /// Believes that exactly `n` proxies stand in front of the server, each appending one
    /// entry: the client is the `n`-th entry from the right. `hops(0)` keys by the peer.
    ///
    /// * With fewer than `n` entries the request did not come through all the proxies (or
    ///   one of them does not append), so no entry is known to be written by them: the key
    ///   is the peer address.
    /// * An entry that is not an address among the last `n` stops the walk as described on
    ///   [`ClientIp`].
    ///
    /// Only use this when the server cannot be reached except through those proxies: a
    /// client that connects directly can write all `n` entries itself. Prefer
    /// [`ClientIp::trusted_proxies`] when the proxies' addresses are known.
    pub fn hops(n: usize) -> ClientIp {
        ClientIp {
            trust: Trust::Hops(n),
            source: Source::Any,
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
            fallbacks: Arc::default(),
        }
    }

    /// Keys IPv6 clients by their network of `bits` bits (default 64), like
    /// [`PeerIp::ipv6_prefix`]. `bits` of 128 and above key every address whole. Trust
    /// decisions always use full addresses.
    pub fn ipv6_prefix(mut self, bits: u8) -> ClientIp {
        self.ipv6_prefix = bits.min(128);
        self
    }

    /// Reads only RFC 7239 `Forwarded` (its `for=` parameters), ignoring the other headers.
    pub fn only_forwarded(mut self) -> ClientIp {
        self.source = Source::Only(ForwardingHeader::Forwarded);
        self
    }

    /// Reads only `X-Forwarded-For`, ignoring the other headers.
    pub fn only_x_forwarded_for(mut self) -> ClientIp {
        self.source = Source::Only(ForwardingHeader::XForwardedFor);
        self
    }

    /// Reads only `X-Real-IP`, ignoring the other headers.
    pub fn only_x_real_ip(mut self) -> ClientIp {
        self.source = Source::Only(ForwardingHeader::XRealIp);
        self
    }

    /// The client address of `req` (canonical, not grouped), if known.
    pub fn ip(&self, req: &RequestView<'_>) -> Option<IpAddr> {
        let mut fell = None;
        let ip = self.locate(req, &mut fell);
        if let Some(reason) = fell {
            self.fell_back(reason);
        }
        ip
    }

    /// [`ip`](Self::ip), setting `fell` to the reason when the headers gave no client and
    /// the answer is a proxy's address (the last reason found: one per request).
    fn locate(&self, req: &RequestView<'_>, fell: &mut Option<&'static str>) -> Option<IpAddr> {
        let peer = peer_addr(req.extensions);
        match &self.trust {
            Trust::Proxies(proxies) => {
                // Without the peer nobody can be told apart from a trusted proxy.
                let peer = peer?;
                if !is_trusted(proxies, peer) {
                    return Some(peer);
                }
            }
            Trust::Hops(0) => return peer,
            Trust::Hops(_) => {}
        }
        match self.source {
            Source::Only(header) => self.client_by(req.headers, header, peer, fell),
            Source::Any => {
                let mut answer = None;
                for header in ForwardingHeader::ALL {
                    if !req.headers.contains_key(header.name()) {
                        continue;
                    }
                    let found = self.client_by(req.headers, header, peer, fell);
                    match answer {
                        None => answer = Some(found),
                        Some(earlier) if earlier == found => {}
                        // Disagreement: one of them was passed through from the client.
                        Some(_) => {
                            *fell = Some("headers_disagree");
                            return peer;
                        }
                    }
                }
                answer.unwrap_or(peer)
            }
        }
    }

    /// The client according to `header` alone, once the peer has been found fit to forward.
    fn client_by(
        &self,
        headers: &HeaderMap,
        header: ForwardingHeader,
        peer: Option<IpAddr>,
        fell: &mut Option<&'static str>,
    ) -> Option<IpAddr> {
        match header {
            ForwardingHeader::XRealIp => {
                let found = real_ip(headers);
                // present but of no use (`unknown`, not an address, repeated): the proxy's
                // address keys the request, as for a chain's entry that is no address
                if found.is_none() && headers.contains_key(header.name()) {
                    *fell = Some("not_an_address");
                }
                found.or(peer)
            }
            ForwardingHeader::Forwarded | ForwardingHeader::XForwardedFor => {
                self.client_by_chain(headers, header, peer, fell)
            }
        }
    }

    /// Walks the chain of `header` from the right (see the type's documentation).
    fn client_by_chain(
        &self,
        headers: &HeaderMap,
        header: ForwardingHeader,
        peer: Option<IpAddr>,
        fell: &mut Option<&'static str>,
    ) -> Option<IpAddr> {
        // The last address walked: the leftmost so far, and the proxy nearest to whatever
        // comes next.
        let mut last = None;
        let mut count = 0usize;
        let flow = walk_chain(headers, header, |hop| {
            let Hop::Addr(ip) = hop else {
                // Not an address: nothing to its left can be trusted.
                *fell = Some("not_an_address");
                return ControlFlow::Break(last.or(peer));
            };
            match &self.trust {
                Trust::Proxies(proxies) => {
                    if !is_trusted(proxies, ip) {
                        return ControlFlow::Break(Some(ip));
                    }
                }
                Trust::Hops(n) => {
                    count += 1;
                    if count >= *n {
                        return ControlFlow::Break(Some(ip));
                    }
                }
            }
            last = Some(ip);
            ControlFlow::Continue(())
        });
        match flow {
            ControlFlow::Break(client) => client,
            ControlFlow::Continue(()) => match self.trust {
                // Every entry trusted: the leftmost is the client (or the peer, when the
                // chain is empty).
                Trust::Proxies(_) => last.or(peer),
                // Fewer entries than hops: none is known to come from our proxies. (None at
                // all: a request that did not come through them, a health check say.)
                Trust::Hops(_) if count > 0 => {
                    *fell = Some("too_few_hops");
                    peer
                }
                Trust::Hops(_) => peer,
            },
        }
    }

    /// A request keyed by a proxy's address, its headers giving no client for `reason`:
    /// counted and logged (see "Falling back to a proxy's address").
    #[cold]
    #[inline(never)]
    fn fell_back(&self, reason: &'static str) {
        self.fallbacks.client_ip_fell_back(reason);
    }
}

impl KeyExtractor for ClientIp {
    fn extract(&self, req: &RequestView<'_>) -> Option<String> {
        Some(ip_key(self.ip(req)?, self.ipv6_prefix))
    }
}

impl ClientIp {
    /// [`extract`](KeyExtractor::extract)'s key, in place.
    pub(crate) fn identifier(&self, req: &RequestView<'_>) -> Option<Identifier> {
        Some(ip_identifier(self.ip(req)?, self.ipv6_prefix))
    }
}

fn is_trusted(proxies: &[IpCidr], ip: IpAddr) -> bool {
    proxies.iter().any(|net| net.contains(ip))
}

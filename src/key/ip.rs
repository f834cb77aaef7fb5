//! Peer and client IP extractors, and the IP networks they trust.
//!
//! Every address is canonicalised before it is compared or keyed: an IPv4-mapped IPv6 address
//! (`::ffff:192.0.2.1`) *is* the IPv4 address (`192.0.2.1`), so a dual-stack listener and an
//! IPv4 listener key the same client identically, and IPv4 networks match it.

use std::borrow::Cow;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ops::ControlFlow;
use std::str::FromStr;

use http::header::{HeaderMap, HeaderName, FORWARDED};
use http::Extensions;

use super::{KeyExtractor, RequestView};

// ---------------------------------------------------------------------------------------------
// IpCidr
// ---------------------------------------------------------------------------------------------

/// An IPv4 or IPv6 network, such as `10.0.0.0/8` or `2001:db8::/32`.
///
/// Parsed from `ADDRESS/PREFIX` or from a bare address, which is a single host (`/32` for
/// IPv4, `/128` for IPv6). Surrounding whitespace is ignored.
///
/// * **Host bits are masked**, not rejected: `10.1.2.3/8` is `10.0.0.0/8`. The network
///   displays in its masked form, so `"10.1.2.3/8".parse::<IpCidr>()?.to_string()` is
///   `"10.0.0.0/8"`.
/// * **IPv4-mapped IPv6 is IPv4**: `::ffff:10.0.0.0/104` is `10.0.0.0/8`, and `::ffff:192.0.2.1`
///   is `192.0.2.1/32`.
/// * **Families do not mix**: an IPv4 network contains IPv4 addresses (and their mapped IPv6
///   forms); an IPv6 network contains only other IPv6 addresses. In particular `::/0` does not
///   contain `192.0.2.1` nor `::ffff:192.0.2.1`.
///
/// ```
/// use std::net::IpAddr;
/// use tollgate::key::IpCidr;
///
/// let net: IpCidr = "10.0.0.0/8".parse()?;
/// assert!(net.contains("10.20.30.40".parse::<IpAddr>()?));
/// assert!(net.contains("::ffff:10.20.30.40".parse::<IpAddr>()?));
/// assert!(!net.contains("192.0.2.1".parse::<IpAddr>()?));
/// assert!("10.0.0.0/33".parse::<IpCidr>().is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpCidr {
    /// The network address: host bits zero, never an IPv4-mapped IPv6 address when the prefix
    /// covers the whole mapped block (`/96` or longer).
    addr: IpAddr,
    /// The prefix length: at most 32 for IPv4, 128 for IPv6.
    prefix: u8,
}

impl IpCidr {
    /// The network of `addr` with a prefix of `prefix` bits (host bits of `addr` are masked).
    ///
    /// Fails when `prefix` is longer than the address (32 bits for IPv4, 128 for IPv6).
    pub fn new(addr: IpAddr, prefix: u8) -> Result<IpCidr, IpCidrError> {
        if prefix > max_prefix(addr) {
            return Err(IpCidrError {
                text: format!("{addr}/{prefix}"),
                reason: Reason::PrefixTooLong {
                    max: max_prefix(addr),
                },
            });
        }
        Ok(IpCidr::masked(addr, prefix))
    }

    /// The network address (host bits zero).
    pub fn network(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length, in bits.
    pub fn prefix_len(&self) -> u8 {
        self.prefix
    }

    /// Whether `ip` is in this network. An IPv4-mapped IPv6 `ip` is checked as its IPv4
    /// address.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => mask_v4(ip, self.prefix) == net,
            (IpAddr::V6(net), IpAddr::V6(ip)) => mask_v6(ip, self.prefix) == net,
            // Families do not mix (see the type's documentation).
            _ => false,
        }
    }

    /// Loopback, private and link-local networks: `127.0.0.0/8`, `10.0.0.0/8`,
    /// `172.16.0.0/12`, `192.168.0.0/16`, `169.254.0.0/16`, `::1/128`, `fc00::/7` (unique
    /// local) and `fe80::/10`.
    ///
    /// Handy for trusting the reverse proxies of an internal network:
    /// `ClientIp::trusted_proxies(IpCidr::private_networks())`. Only do so when no client
    /// can connect from such an address; otherwise list your proxies precisely.
    pub fn private_networks() -> Vec<IpCidr> {
        let v4 = |a, b, c, d, prefix| IpCidr {
            addr: IpAddr::V4(Ipv4Addr::new(a, b, c, d)),
            prefix,
        };
        let v6 = |first: u16, last: u16, prefix| IpCidr {
            addr: IpAddr::V6(Ipv6Addr::new(first, 0, 0, 0, 0, 0, 0, last)),
            prefix,
        };
        vec![
            v4(127, 0, 0, 0, 8),
            v4(10, 0, 0, 0, 8),
            v4(172, 16, 0, 0, 12),
            v4(192, 168, 0, 0, 16),
            v4(169, 254, 0, 0, 16),
            v6(0, 1, 128),
            v6(0xfc00, 0, 7),
            v6(0xfe80, 0, 10),
        ]
    }

    /// The network of `addr` with `prefix` bits (`prefix` already checked), canonicalised.
    fn masked(addr: IpAddr, prefix: u8) -> IpCidr {
        match addr {
            IpAddr::V4(a) => IpCidr {
                addr: IpAddr::V4(mask_v4(a, prefix)),
                prefix,
            },
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                // A network inside ::ffff:0:0/96 is an IPv4 network. (A shorter prefix is a
                // genuine IPv6 network that merely contains the mapped block.)
                Some(v4) if prefix >= 96 => IpCidr::masked(IpAddr::V4(v4), prefix - 96),
                _ => IpCidr {
                    addr: IpAddr::V6(mask_v6(a, prefix)),
                    prefix,
                },
            },
        }
    }
}

impl From<IpAddr> for IpCidr {
    /// The single-host network of `addr` (`/32` or `/128`).
    fn from(addr: IpAddr) -> IpCidr {
        IpCidr::masked(addr, max_prefix(addr))
    }
}

impl fmt::Display for IpCidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl FromStr for IpCidr {
    type Err = IpCidrError;

    fn from_str(s: &str) -> Result<IpCidr, IpCidrError> {
        let err = |reason| IpCidrError {
            text: s.to_string(),
            reason,
        };
        let text = s.trim();
        let (addr_text, prefix_text) = match text.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (text, None),
        };
        let addr: IpAddr = addr_text.parse().map_err(|_| err(Reason::BadAddress))?;
        let max = max_prefix(addr);
        let prefix = match prefix_text {
            None => max,
            Some(p) => {
                // Plain decimal digits only: `u8::from_str` would also take "+8".
                if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(err(Reason::BadPrefix));
                }
                match p.parse::<u8>() {
                    Ok(n) if n <= max => n,
                    // Too large for `max`, or for a u8 (all digits, so overflow is the only
                    // way the parse can fail).
                    _ => return Err(err(Reason::PrefixTooLong { max })),
                }
            }
        };
        Ok(IpCidr::masked(addr, prefix))
    }
}

/// A text that is not an IP network: names the text and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpCidrError {
    text: String,
    reason: Reason,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reason {
    /// The part before `/` is not an IPv4 or IPv6 address.
    BadAddress,
    /// The part after `/` is not a decimal number.
    BadPrefix,
    /// The prefix is longer than the address.
    PrefixTooLong { max: u8 },
}

impl fmt::Display for IpCidrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid IP network {:?}: ", self.text)?;
        match self.reason {
            Reason::BadAddress => f.write_str("not an IPv4 or IPv6 address"),
            Reason::BadPrefix => f.write_str("the prefix length is not a decimal number"),
            Reason::PrefixTooLong { max } => {
                write!(f, "the prefix length is longer than {max} bits")
            }
        }
    }
}

impl std::error::Error for IpCidrError {}

fn max_prefix(addr: IpAddr) -> u8 {
    match addr {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

/// `ip` with all but its first `prefix` bits cleared (`prefix` ≥ 32 keeps it whole).
fn mask_v4(ip: Ipv4Addr, prefix: u8) -> Ipv4Addr {
    let mask = u32::MAX
        .checked_shl(32u32.saturating_sub(u32::from(prefix)))
        .unwrap_or(0);
    Ipv4Addr::from_bits(ip.to_bits() & mask)
}

/// `ip` with all but its first `prefix` bits cleared (`prefix` ≥ 128 keeps it whole).
fn mask_v6(ip: Ipv6Addr, prefix: u8) -> Ipv6Addr {
    let mask = u128::MAX
        .checked_shl(128u32.saturating_sub(u32::from(prefix)))
        .unwrap_or(0);
    Ipv6Addr::from_bits(ip.to_bits() & mask)
}

// ---------------------------------------------------------------------------------------------
// Keys and the peer address
// ---------------------------------------------------------------------------------------------

/// The key of `ip`: `ip:ADDRESS`, or `ip:NETWORK/PREFIX` for IPv6 grouped by a prefix shorter
/// than 128 bits. `ip` is canonical (never IPv4-mapped).
fn ip_key(ip: IpAddr, ipv6_prefix: u8) -> String {
    match ip {
        IpAddr::V6(v6) if ipv6_prefix < 128 => {
            format!("ip:{}/{ipv6_prefix}", mask_v6(v6, ipv6_prefix))
        }
        ip => format!("ip:{ip}"),
    }
}

/// The TCP peer's address, canonicalised, from the request extensions: axum's
/// `ConnectInfo<SocketAddr>` (with the `axum` feature), else a `SocketAddr`, else an `IpAddr`.
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

/// The TCP peer's IP address: `ip:192.0.2.1`, `ip:2001:db8::1`.
///
/// The address comes from the request extensions, the first found of:
///
/// * `axum::extract::ConnectInfo<SocketAddr>` (with the `axum` feature; serve with
///   `into_make_service_with_connect_info::<SocketAddr>()`),
/// * tonic's `TcpConnectInfo` (with the `tonic` feature),
/// * a `std::net::SocketAddr`,
/// * a `std::net::IpAddr`.
///
/// The key is missing when none is there. Behind a reverse proxy the peer is the proxy: use
/// [`ClientIp`] there.
///
/// An IPv6 client usually controls a whole `/64` (or more) and can rotate through its
/// addresses; [`PeerIp::ipv6_prefix`] keys IPv6 clients by their network instead.
#[derive(Debug, Clone, Copy)]
pub struct PeerIp {
    ipv6_prefix: u8,
}

impl PeerIp {
    /// Keys by the full peer address.
    pub fn new() -> PeerIp {
        PeerIp { ipv6_prefix: 128 }
    }

    /// Keys IPv6 peers by their network of `bits` bits instead: with `64`,
    /// `2001:db8:1:2::7` is `ip:2001:db8:1:2::/64`. IPv4 peers are not grouped. `bits` above
    /// 128 are taken as 128 (no grouping).
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
/// address), every client gets the proxy's key. Name the header your proxies maintain with
/// [`ClientIp::only_forwarded`], [`ClientIp::only_x_forwarded_for`] or
/// [`ClientIp::only_x_real_ip`] — which is the better configuration anyway.
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
#[derive(Debug, Clone)]
pub struct ClientIp {
    trust: Trust,
    source: Source,
    ipv6_prefix: u8,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ForwardingHeader {
    Forwarded,
    XForwardedFor,
    XRealIp,
}

impl ForwardingHeader {
    const ALL: [ForwardingHeader; 3] = [
        ForwardingHeader::Forwarded,
        ForwardingHeader::XForwardedFor,
        ForwardingHeader::XRealIp,
    ];

    fn name(self) -> HeaderName {
        match self {
            ForwardingHeader::Forwarded => FORWARDED,
            ForwardingHeader::XForwardedFor => HeaderName::from_static("x-forwarded-for"),
            ForwardingHeader::XRealIp => HeaderName::from_static("x-real-ip"),
        }
    }
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
            ipv6_prefix: 128,
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
            ipv6_prefix: 128,
        }
    }

    /// Keys IPv6 clients by their network of `bits` bits, like [`PeerIp::ipv6_prefix`].
    /// `bits` above 128 are taken as 128 (no grouping). Trust decisions always use full
    /// addresses.
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
            Source::Only(header) => self.client_by(req.headers, header, peer),
            Source::Any => {
                let mut answer = None;
                for header in ForwardingHeader::ALL {
                    if !req.headers.contains_key(header.name()) {
                        continue;
                    }
                    let found = self.client_by(req.headers, header, peer);
                    match answer {
                        None => answer = Some(found),
                        Some(earlier) if earlier == found => {}
                        // Disagreement: one of them was passed through from the client.
                        Some(_) => return peer,
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
    ) -> Option<IpAddr> {
        match header {
            ForwardingHeader::XRealIp => real_ip(headers).or(peer),
            ForwardingHeader::Forwarded | ForwardingHeader::XForwardedFor => {
                self.client_by_chain(headers, header, peer)
            }
        }
    }

    /// Walks the chain of `header` from the right (see the type's documentation).
    fn client_by_chain(
        &self,
        headers: &HeaderMap,
        header: ForwardingHeader,
        peer: Option<IpAddr>,
    ) -> Option<IpAddr> {
        // The last address walked: the leftmost so far, and the proxy nearest to whatever
        // comes next.
        let mut last = None;
        let mut count = 0usize;
        let flow = walk_chain(headers, header, |hop| {
            let Hop::Addr(ip) = hop else {
                // Not an address: nothing to its left can be trusted.
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
                // Fewer entries than hops: none is known to come from our proxies.
                Trust::Hops(_) => peer,
            },
        }
    }
}

impl KeyExtractor for ClientIp {
    fn extract(&self, req: &RequestView<'_>) -> Option<String> {
        Some(ip_key(self.ip(req)?, self.ipv6_prefix))
    }
}

fn is_trusted(proxies: &[IpCidr], ip: IpAddr) -> bool {
    proxies.iter().any(|net| net.contains(ip))
}

// ---------------------------------------------------------------------------------------------
// Header parsing
// ---------------------------------------------------------------------------------------------

/// One entry of a forwarding chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hop {
    /// An IP address (canonical).
    Addr(IpAddr),
    /// Something else: `unknown`, an obfuscated name, a malformed entry.
    Opaque,
}

/// Optional whitespace (RFC 9110).
const OWS: [char; 2] = [' ', '\t'];

/// Calls `visit` with the entries of the chain in `header` (`Forwarded` or
/// `X-Forwarded-For`) from right to left — the last line first — until it breaks. Empty list
/// elements are skipped, as RFC 9110 requires.
///
/// The walk is lazy where it can be, so that whatever a client wrote at the left of a long
/// header is usually never parsed.
fn walk_chain<B>(
    headers: &HeaderMap,
    header: ForwardingHeader,
    mut visit: impl FnMut(Hop) -> ControlFlow<B>,
) -> ControlFlow<B> {
    for line in headers.get_all(header.name()).iter().rev() {
        // Bytes that are not UTF-8 become U+FFFD, which no address contains: the entries
        // holding them are opaque, the others still parse.
        let text = String::from_utf8_lossy(line.as_bytes());
        if header == ForwardingHeader::Forwarded {
            for element in split_unquoted(&text, ',').into_iter().rev() {
                match element {
                    // An unclosed quoted string swallows the rest of the line, so this
                    // element may contain text of several writers: opaque.
                    None => visit(Hop::Opaque)?,
                    Some(e) if e.trim_matches(OWS).is_empty() => {}
                    Some(e) => visit(forwarded_hop(e))?,
                }
            }
        } else {
            for entry in text.rsplit(',') {
                let entry = entry.trim_matches(OWS);
                if !entry.is_empty() {
                    visit(parse_node(entry))?;
                }
            }
        }
    }
    ControlFlow::Continue(())
}

/// The address in `X-Real-IP`: one line holding one address, else nothing.
fn real_ip(headers: &HeaderMap) -> Option<IpAddr> {
    let mut lines = headers.get_all(ForwardingHeader::XRealIp.name()).iter();
    let (Some(line), None) = (lines.next(), lines.next()) else {
        // Absent, or repeated: a repeated line means one was not overwritten by the proxy.
        return None;
    };
    let text = String::from_utf8_lossy(line.as_bytes());
    match parse_node(text.trim_matches(OWS)) {
        Hop::Addr(ip) => Some(ip),
        Hop::Opaque => None,
    }
}

/// Splits `text` at each `sep` outside quoted strings (RFC 9110 `quoted-string`, with `\`
/// escapes). A part in which a quoted string is still open at the end of `text` is `None`.
fn split_unquoted(text: &str, sep: char) -> Vec<Option<&str>> {
    let mut parts = Vec::new();
    let mut start = 0;
    let mut in_quote = false;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        if in_quote {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_quote = false;
            }
        } else if c == '"' {
            in_quote = true;
        } else if c == sep {
            // `start` and `i` are char boundaries, so `get` always succeeds; if it did not,
            // the part would be opaque.
            parts.push(text.get(start..i));
            start = i + c.len_utf8();
        }
    }
    parts.push(if in_quote { None } else { text.get(start..) });
    parts
}

/// The hop one `Forwarded` element names in its `for` parameter (RFC 7239 §4-6). Parameter
/// names are case-insensitive; an element without `for`, with `for` twice, or with a pair
/// that is not `name=value` is opaque.
fn forwarded_hop(element: &str) -> Hop {
    let mut node = None;
    for pair in split_unquoted(element, ';') {
        // The element's quotes are balanced, so no pair can be unclosed.
        let Some(pair) = pair else { return Hop::Opaque };
        let pair = pair.trim_matches(OWS);
        if pair.is_empty() {
            continue;
        }
        let Some((name, value)) = pair.split_once('=') else {
            return Hop::Opaque;
        };
        if !name.trim_matches(OWS).eq_ignore_ascii_case("for") {
            continue;
        }
        if node.is_some() {
            return Hop::Opaque;
        }
        node = Some(value.trim_matches(OWS));
    }
    match node.and_then(unquote) {
        Some(node) => parse_node(&node),
        None => Hop::Opaque,
    }
}

/// The content of a parameter value: a token as is, a quoted string unescaped. `None` when
/// it is neither (a stray quote or backslash, text after the closing quote).
fn unquote(value: &str) -> Option<Cow<'_, str>> {
    let Some(inner) = value.strip_prefix('"') else {
        return (!value.contains(['"', '\\'])).then_some(Cow::Borrowed(value));
    };
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.push(chars.next()?),
            '"' => return chars.as_str().is_empty().then_some(Cow::Owned(out)),
            c => out.push(c),
        }
    }
    None
}

/// A node (RFC 7239 §6; the same forms appear in `X-Forwarded-For`): `192.0.2.1`,
/// `192.0.2.1:8080`, `2001:db8::1`, `[2001:db8::1]`, `[2001:db8::1]:443`, with an optional
/// numeric or obfuscated (`_name`) port. Anything else — `unknown`, `_hidden`, an IPv6 zone —
/// is opaque. An unbracketed IPv6 address is never read as having a port.
fn parse_node(text: &str) -> Hop {
    node_addr(text).map_or(Hop::Opaque, |ip| Hop::Addr(ip.to_canonical()))
}

fn node_addr(text: &str) -> Option<IpAddr> {
    if let Some(rest) = text.strip_prefix('[') {
        let (addr, after) = rest.split_once(']')?;
        if !after.is_empty() && !is_port(after.strip_prefix(':')?) {
            return None;
        }
        return addr.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip);
    }
    let (addr, port) = text.split_once(':')?;
    if !is_port(port) {
        return None;
    }
    addr.parse::<Ipv4Addr>().ok().map(IpAddr::V4)
}

/// `1*5DIGIT`, or an obfuscated port `_` followed by letters, digits, `.`, `_`, `-`.
fn is_port(text: &str) -> bool {
    let numeric = (1..=5).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_digit());
    let obfuscated = text.strip_prefix('_').is_some_and(|name| {
        !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    });
    numeric || obfuscated
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use proptest::prelude::*;
    use std::time::{Duration, Instant};

    const CLIENT: &str = "203.0.113.7";

    fn request(peer: Option<&str>, headers: &[(&str, &[u8])]) -> http::Request<()> {
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

    fn key(extractor: &impl KeyExtractor, req: &http::Request<()>) -> Option<String> {
        extractor.extract(&RequestView::of(req))
    }

    fn ip_of(client_ip: &ClientIp, req: &http::Request<()>) -> Option<IpAddr> {
        client_ip.ip(&RequestView::of(req))
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn nets(list: &[&str]) -> Vec<IpCidr> {
        list.iter().map(|n| n.parse().unwrap()).collect()
    }

    /// Trusts 10.0.0.0/8 (the load balancers) and 192.168.0.0/16 (an inner tier).
    fn behind_proxies() -> ClientIp {
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
        let cases: &[(&str, Reason)] = &[
            ("", Reason::BadAddress),
            ("10.0.0/8", Reason::BadAddress),
            ("/8", Reason::BadAddress),
            ("localhost", Reason::BadAddress),
            ("010.0.0.0/8", Reason::BadAddress),
            ("[2001:db8::]/32", Reason::BadAddress),
            ("10.0.0.0 /8", Reason::BadAddress),
            ("10.0.0.0/", Reason::BadPrefix),
            ("10.0.0.0/+8", Reason::BadPrefix),
            ("10.0.0.0/-1", Reason::BadPrefix),
            ("10.0.0.0/8/8", Reason::BadPrefix),
            ("10.0.0.0/eight", Reason::BadPrefix),
            ("10.0.0.0/ 8", Reason::BadPrefix),
            ("10.0.0.0/33", Reason::PrefixTooLong { max: 32 }),
            (
                "10.0.0.0/99999999999999999999",
                Reason::PrefixTooLong { max: 32 },
            ),
            ("2001:db8::/129", Reason::PrefixTooLong { max: 128 }),
            ("2001:db8::/256", Reason::PrefixTooLong { max: 128 }),
        ];
        for (text, reason) in cases {
            let err = text.parse::<IpCidr>().unwrap_err();
            assert_eq!(err.reason, *reason, "{text:?}");
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
        assert_eq!(
            IpCidr::new(ip("10.0.0.0"), 33).unwrap_err().reason,
            Reason::PrefixTooLong { max: 32 }
        );
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
        assert_eq!(key(&PeerIp::new(), &req).as_deref(), Some("ip:2001:db8::5"));

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

    #[test]
    fn ipv6_prefix_groups_ipv6_only() {
        let grouped = PeerIp::new().ipv6_prefix(64);
        let a = request(Some("[2001:db8:1:2:aaaa::1]:443"), &[]);
        let b = request(Some("[2001:db8:1:2:ffff:ffff:ffff:ffff]:80"), &[]);
        let c = request(Some("[2001:db8:1:3::1]:443"), &[]);
        assert_eq!(key(&grouped, &a).as_deref(), Some("ip:2001:db8:1:2::/64"));
        assert_eq!(key(&grouped, &a), key(&grouped, &b));
        assert_ne!(key(&grouped, &a), key(&grouped, &c));
        // Without grouping, the full address.
        assert_eq!(
            key(&PeerIp::new(), &a).as_deref(),
            Some("ip:2001:db8:1:2:aaaa::1")
        );
        // IPv4 untouched.
        let v4 = request(Some("192.0.2.1:1"), &[]);
        assert_eq!(key(&grouped, &v4).as_deref(), Some("ip:192.0.2.1"));
        // 128 and above: no grouping; 0: one group for all of IPv6.
        assert_eq!(
            key(&PeerIp::new().ipv6_prefix(128), &a),
            key(&PeerIp::new(), &a)
        );
        assert_eq!(
            key(&PeerIp::new().ipv6_prefix(255), &a),
            key(&PeerIp::new(), &a)
        );
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
                key(&behind_proxies(), &req).as_deref(),
                Some("ip:2001:db8::1"),
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
}

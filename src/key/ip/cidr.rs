//! IP networks ([`IpCidr`]) and the error of parsing one.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

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
pub struct IpCidr(
    /// Always truncated (host bits zero), and never a network inside the IPv4-mapped block
    /// `::ffff:0:0/96`: such a network is stored as the IPv4 network it maps.
    IpNet,
);

/// Loopback, private and link-local networks; see [`IpCidr::private_networks`]. Built in a
/// constant, so a wrong prefix length fails the build.
const PRIVATE_NETWORKS: [IpNet; 8] = [
    v4(127, 0, 0, 0, 8),
    v4(10, 0, 0, 0, 8),
    v4(172, 16, 0, 0, 12),
    v4(192, 168, 0, 0, 16),
    v4(169, 254, 0, 0, 16),
    v6(Ipv6Addr::LOCALHOST, 128),
    v6(Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0), 7),
    v6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10),
];

const fn v4(a: u8, b: u8, c: u8, d: u8, prefix: u8) -> IpNet {
    IpNet::V4(Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), prefix))
}

const fn v6(addr: Ipv6Addr, prefix: u8) -> IpNet {
    IpNet::V6(Ipv6Net::new_assert(addr, prefix))
}

impl IpCidr {
    /// The network of `addr` with a prefix of `prefix` bits (host bits of `addr` are masked).
    ///
    /// # Errors
    ///
    /// [`IpCidrErrorKind::PrefixTooLong`] when `prefix` is longer than the address (32 bits
    /// for IPv4, 128 for IPv6).
    pub fn new(addr: IpAddr, prefix: u8) -> Result<IpCidr, IpCidrError> {
        IpCidr::checked(addr, prefix).map_err(|kind| IpCidrError {
            kind,
            part: format!("{addr}/{prefix}"),
        })
    }

    /// The network address (host bits zero).
    pub fn network(&self) -> IpAddr {
        self.0.network()
    }

    /// The prefix length, in bits.
    pub fn prefix_len(&self) -> u8 {
        self.0.prefix_len()
    }

    /// Whether `ip` is in this network. An IPv4-mapped IPv6 `ip` is checked as its IPv4
    /// address.
    pub fn contains(&self, ip: IpAddr) -> bool {
        // `IpNet` contains no address of the other family (see the type's documentation).
        self.0.contains(&ip.to_canonical())
    }

    /// Loopback, private and link-local networks: `127.0.0.0/8`, `10.0.0.0/8`,
    /// `172.16.0.0/12`, `192.168.0.0/16`, `169.254.0.0/16`, `::1/128`, `fc00::/7` (unique
    /// local) and `fe80::/10`.
    ///
    /// Handy for trusting the reverse proxies of an internal network:
    /// `ClientIp::trusted_proxies(IpCidr::private_networks())`. Only do so when no client
    /// can connect from such an address; otherwise list your proxies precisely.
    pub fn private_networks() -> Vec<IpCidr> {
        PRIVATE_NETWORKS
            .into_iter()
            .map(IpCidr::canonical)
            .collect()
    }

    /// The network of `addr` with `prefix` bits, or why there is none.
    fn checked(addr: IpAddr, prefix: u8) -> Result<IpCidr, IpCidrErrorKind> {
        let max = match addr {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        };
        IpNet::new(addr, prefix)
            .map(IpCidr::canonical)
            .map_err(|_| IpCidrErrorKind::PrefixTooLong { max })
    }

    /// `net` with its host bits masked, and as IPv4 when it lies inside the IPv4-mapped block.
    fn canonical(net: IpNet) -> IpCidr {
        let net = net.trunc();
        if let IpNet::V6(v6) = net {
            // A network inside ::ffff:0:0/96 is an IPv4 network. (A shorter prefix is a
            // genuine IPv6 network that merely contains the mapped block.)
            let mapped = v6
                .network()
                .to_ipv4_mapped()
                .filter(|_| v6.prefix_len() >= 96)
                .and_then(|v4| Ipv4Net::new(v4, v6.prefix_len() - 96).ok());
            if let Some(v4) = mapped {
                return IpCidr(IpNet::V4(v4));
            }
        }
        IpCidr(net)
    }
}

impl From<IpAddr> for IpCidr {
    /// The single-host network of `addr` (`/32` or `/128`).
    fn from(addr: IpAddr) -> IpCidr {
        IpCidr::canonical(IpNet::from(addr))
    }
}

impl fmt::Display for IpCidr {
    /// `NETWORK/PREFIX`, e.g. `10.0.0.0/8`, which parses back to the same network.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl FromStr for IpCidr {
    type Err = IpCidrError;

    /// Parses `ADDRESS/PREFIX` or a bare `ADDRESS`, as described on [`IpCidr`].
    ///
    /// # Errors
    ///
    /// When the address is not an IPv4 or IPv6 address, the prefix length is not a decimal
    /// number, or it is longer than the address; the error's [`part`](IpCidrError::part) is
    /// the whole text.
    fn from_str(s: &str) -> Result<IpCidr, IpCidrError> {
        // `ipnet`'s own parser needs a prefix and does not say what is wrong, so the text is
        // split and checked here.
        let err = |kind| IpCidrError {
            kind,
            part: s.to_string(),
        };
        let text = s.trim();
        let (addr_text, prefix_text) = match text.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (text, None),
        };
        let addr: IpAddr = addr_text
            .parse()
            .map_err(|_| err(IpCidrErrorKind::BadAddress))?;
        let Some(prefix) = prefix_text else {
            return Ok(IpCidr::from(addr));
        };
        // Plain decimal digits only: `u8::from_str` would also take "+8".
        if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err(IpCidrErrorKind::BadPrefix));
        }
        // All digits, so a number that does not fit a u8 is too long for any address.
        let prefix = prefix.parse::<u8>().unwrap_or(u8::MAX);
        IpCidr::checked(addr, prefix).map_err(err)
    }
}

/// A text that is not an IP network: what is wrong ([`kind`](IpCidrError::kind)) and the
/// offending text ([`part`](IpCidrError::part)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpCidrError {
    kind: IpCidrErrorKind,
    part: String,
}

impl IpCidrError {
    /// What is wrong.
    pub fn kind(&self) -> &IpCidrErrorKind {
        &self.kind
    }

    /// The offending text: the whole text parsed, or `ADDRESS/PREFIX` as given to
    /// [`IpCidr::new`].
    pub fn part(&self) -> &str {
        &self.part
    }
}

/// What is wrong with an IP network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum IpCidrErrorKind {
    /// The part before `/` is not an IPv4 or IPv6 address.
    BadAddress,
    /// The part after `/` is not a decimal number.
    BadPrefix,
    /// The prefix is longer than the address.
    PrefixTooLong {
        /// The longest prefix of the address: 32 for IPv4, 128 for IPv6.
        max: u8,
    },
}

impl fmt::Display for IpCidrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid IP network {:?}: ", self.part)?;
        match self.kind {
            IpCidrErrorKind::BadAddress => f.write_str("not an IPv4 or IPv6 address"),
            IpCidrErrorKind::BadPrefix => f.write_str("the prefix length is not a decimal number"),
            IpCidrErrorKind::PrefixTooLong { max } => {
                write!(f, "the prefix length is longer than {max} bits")
            }
        }
    }
}

impl std::error::Error for IpCidrError {}

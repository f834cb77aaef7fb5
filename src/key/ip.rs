//! Peer and client IP extractors (being written).

use super::{KeyExtractor, RequestView};

/// The TCP peer's IP address.
#[derive(Debug, Clone, Default)]
pub struct PeerIp {}

impl KeyExtractor for PeerIp {
    fn extract(&self, _req: &RequestView<'_>) -> Option<String> {
        None
    }
}

/// The client's IP address behind proxies.
#[derive(Debug, Clone, Default)]
pub struct ClientIp {}

impl KeyExtractor for ClientIp {
    fn extract(&self, _req: &RequestView<'_>) -> Option<String> {
        None
    }
}

/// An IP network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpCidr {}

/// A CIDR that does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpCidrError {}

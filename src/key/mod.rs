//! Key extractors: what identifies the client of an HTTP request.
//!
//! Each extractor returns one identifier, namespaced by its kind (`ip:…`, `user:…`,
//! `header:x-api-key:…`), or `None` when the request does not carry it. A layer given several
//! extractors checks all their identifiers together, all-or-nothing.
//!
//! The extractors shipped here:
//!
//! * [`PeerIp`] and [`ClientIp`]: the TCP peer's address, and the client's address behind
//!   trusted reverse proxies (networks given as [`IpCidr`]);
//! * [`Header`], [`Extension`], [`Route`], [`GrpcMethod`] and [`Global`]: a header value, a
//!   value an earlier layer stored (the authenticated user), the route, the gRPC method, and
//!   one key for everything.
//!
//! Write your own by implementing [`KeyExtractor`], or pass a closure
//! `Fn(&RequestView<'_>) -> Option<String>`.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use http::{Extensions, HeaderMap, Method, Uri};

mod id;
mod ip;
mod simple;

pub(crate) use id::{Identifier, Identifiers};
pub use ip::{ClientIp, IpCidr, IpCidrError, IpCidrErrorKind, PeerIp};
pub use simple::{Extension, Global, GrpcMethod, Header, Route};

/// What an extractor may look at: the request without its body.
///
/// Built with [`RequestView::of`]; more fields may be added, so it cannot be built from its
/// fields outside this crate.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct RequestView<'a> {
    /// The method.
    pub method: &'a Method,
    /// The URI.
    pub uri: &'a Uri,
    /// The headers.
    pub headers: &'a HeaderMap,
    /// The extensions (where servers put the peer address and auth layers the user).
    pub extensions: &'a Extensions,
}

impl<'a> RequestView<'a> {
    /// A view of `req`.
    pub fn of<B>(req: &'a http::Request<B>) -> RequestView<'a> {
        RequestView {
            method: req.method(),
            uri: req.uri(),
            headers: req.headers(),
            extensions: req.extensions(),
        }
    }

    /// Whether this is a gRPC request: a `POST` (gRPC calls always are) with
    /// `content-type: application/grpc…` (in any case). The middlewares answer such a request
    /// in gRPC's form (HTTP 200 with a `grpc-status`); any other request as HTTP, so that a
    /// client cannot turn a refusal of a `GET` into a `200` a cache might keep.
    pub fn is_grpc(&self) -> bool {
        self.grpc_content_type().is_some()
    }

    /// The `content-type` of a gRPC call ([`is_grpc`](Self::is_grpc)): `application/grpc`,
    /// `application/grpc-web` or `application/grpc-web-text`, with a `+proto` or other
    /// suffix perhaps. The layers answer a refused call in the same type.
    pub(crate) fn grpc_content_type(&self) -> Option<&'a http::HeaderValue> {
        const GRPC: &[u8] = b"application/grpc";
        if self.method != http::Method::POST {
            return None;
        }
        let value = self.headers.get(http::header::CONTENT_TYPE)?;
        let prefix = value.as_bytes().get(..GRPC.len())?;
        prefix.eq_ignore_ascii_case(GRPC).then_some(value)
    }
}

/// Finds an identifier in a request.
pub trait KeyExtractor: Send + Sync + 'static {
    /// The identifier, or `None` when the request does not carry one.
    fn extract(&self, req: &RequestView<'_>) -> Option<String>;
}

impl<F> KeyExtractor for F
where
    F: Fn(&RequestView<'_>) -> Option<String> + Send + Sync + 'static,
{
    fn extract(&self, req: &RequestView<'_>) -> Option<String> {
        self(req)
    }
}

/// A shareable, type-erased extractor. The IP extractors are kept as themselves, so that
/// their keys are written in place rather than allocated.
#[derive(Clone)]
pub(crate) enum AnyExtractor {
    Peer(PeerIp),
    Client(Arc<ClientIp>),
    Other(Arc<dyn KeyExtractor>),
}

impl AnyExtractor {
    pub(crate) fn new<E: KeyExtractor>(extractor: E) -> AnyExtractor {
        let any: &dyn Any = &extractor;
        if let Some(peer) = any.downcast_ref::<PeerIp>() {
            return AnyExtractor::Peer(*peer);
        }
        if let Some(client) = any.downcast_ref::<ClientIp>() {
            return AnyExtractor::Client(Arc::new(client.clone()));
        }
        AnyExtractor::Other(Arc::new(extractor))
    }

    /// Whether the extractor keys by an address ([`PeerIp`], [`ClientIp`]), which it finds
    /// in every request of a server that records its peers.
    pub(crate) fn reads_address(&self) -> bool {
        matches!(self, AnyExtractor::Peer(_) | AnyExtractor::Client(_))
    }

    /// The identifier the extractor finds in `req`.
    pub(crate) fn identifier(&self, req: &RequestView<'_>) -> Option<Identifier> {
        match self {
            AnyExtractor::Peer(peer) => peer.identifier(req),
            AnyExtractor::Client(client) => client.identifier(req),
            AnyExtractor::Other(other) => other.extract(req).map(Identifier::Owned),
        }
    }
}

impl fmt::Debug for AnyExtractor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyExtractor")
    }
}

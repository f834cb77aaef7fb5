//! Key extractors: what identifies the client of an HTTP request.
//!
//! Each extractor returns one identifier, namespaced by its kind (`ip:…`, `user:…`,
//! `header:x-api-key:…`), or `None` when the request does not carry it. A layer given several
//! extractors checks all their identifiers together, all-or-nothing.
//!
//! Write your own by implementing [`KeyExtractor`], or pass a closure
//! `Fn(&RequestView<'_>) -> Option<String>`.

use std::fmt;
use std::sync::Arc;

use http::{Extensions, HeaderMap, HeaderName, Method, Uri};

mod ip;

pub use ip::{ClientIp, IpCidr, IpCidrError, PeerIp};

/// What an extractor may look at: the request without its body.
#[derive(Debug, Clone, Copy)]
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

    /// Whether this is a gRPC request (`content-type: application/grpc…`).
    pub fn is_grpc(&self) -> bool {
        self.headers
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
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

/// A shareable, type-erased extractor.
#[derive(Clone)]
pub(crate) struct AnyExtractor(pub(crate) Arc<dyn KeyExtractor>);

impl fmt::Debug for AnyExtractor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyExtractor")
    }
}

/// The value of a request header, e.g. an API key: `header:NAME:VALUE`.
///
/// Any bytes make a key (escaped, so that distinct values stay distinct); an empty value is
/// missing.
#[derive(Debug, Clone)]
pub struct Header(HeaderName);

impl Header {
    /// Keys by the header `name`.
    pub fn new(name: HeaderName) -> Header {
        Header(name)
    }

    /// Keys by the header `name`, given as text; fails when it is not a valid header name.
    pub fn named(name: &str) -> Result<Header, http::header::InvalidHeaderName> {
        Ok(Header(HeaderName::from_bytes(name.as_bytes())?))
    }
}

impl KeyExtractor for Header {
    fn extract(&self, req: &RequestView<'_>) -> Option<String> {
        let value = req.headers.get(&self.0)?;
        if value.is_empty() {
            return None;
        }
        // Every value escaped the same way (`\xff`, `\\`, …): an escaping that is applied to
        // some values only would let a printable value spell another one's escape.
        let text = value.as_bytes().escape_ascii();
        Some(format!("header:{}:{text}", self.0))
    }
}

/// A value an earlier layer put in the request extensions — typically the authenticated
/// user: `user:VALUE` (or another kind, see [`Extension::kind`]).
pub struct Extension<T> {
    kind: &'static str,
    _t: std::marker::PhantomData<fn() -> T>,
}

impl<T> fmt::Debug for Extension<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Extension")
            .field("kind", &self.kind)
            .finish()
    }
}

impl<T> Clone for Extension<T> {
    fn clone(&self) -> Self {
        Extension {
            kind: self.kind,
            _t: std::marker::PhantomData,
        }
    }
}

impl<T: fmt::Display + Send + Sync + 'static> Extension<T> {
    /// Keys by the extension of type `T`, as `user:VALUE`.
    pub fn new() -> Extension<T> {
        Extension {
            kind: "user",
            _t: std::marker::PhantomData,
        }
    }

    /// Namespaces the identifier as `KIND:VALUE` instead of `user:VALUE`.
    pub fn kind(mut self, kind: &'static str) -> Self {
        self.kind = kind;
        self
    }
}

impl<T: fmt::Display + Send + Sync + 'static> Default for Extension<T> {
    fn default() -> Self {
        Extension::new()
    }
}

impl<T: fmt::Display + Send + Sync + 'static> KeyExtractor for Extension<T> {
    fn extract(&self, req: &RequestView<'_>) -> Option<String> {
        let value = req.extensions.get::<T>()?;
        Some(format!("{}:{value}", self.kind))
    }
}

/// The request path: `path:/users/42`. Behind axum, prefer the route template (axum's
/// `MatchedPath`, e.g. `/users/{id}`), which [`Route`] uses when the `axum` feature is on.
#[derive(Debug, Clone, Copy, Default)]
pub struct Route;

impl KeyExtractor for Route {
    fn extract(&self, req: &RequestView<'_>) -> Option<String> {
        #[cfg(feature = "axum")]
        if let Some(m) = req.extensions.get::<axum::extract::MatchedPath>() {
            return Some(format!("route:{}", m.as_str()));
        }
        Some(format!("path:{}", req.uri.path()))
    }
}

/// The gRPC method of a gRPC request (`grpc:/package.Service/Method`); missing on other
/// requests.
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcMethod;

impl KeyExtractor for GrpcMethod {
    fn extract(&self, req: &RequestView<'_>) -> Option<String> {
        req.is_grpc().then(|| format!("grpc:{}", req.uri.path()))
    }
}

/// One key for every request: a global limit.
#[derive(Debug, Clone, Copy, Default)]
pub struct Global;

impl KeyExtractor for Global {
    fn extract(&self, _req: &RequestView<'_>) -> Option<String> {
        Some("global".into())
    }
}

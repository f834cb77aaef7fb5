//! The simple extractors: a header, an extension, the route, the gRPC method, one global key.

use std::fmt;
use std::marker::PhantomData;

use http::HeaderName;

use super::{KeyExtractor, RequestView};

/// The value of a request header, e.g. an API key: `header:NAME:VALUE`.
///
/// Any bytes make a key (escaped, so that distinct values stay distinct); an empty value is
/// missing. A value longer than 1 KiB is keyed by its SHA-1, as [`hashed`](Header::hashed)
/// keys every value: written out and escaped in full (four bytes for one, at worst), a
/// header of hundreds of kilobytes would cost megabytes and passes over them for each
/// request, only to be hashed where it becomes a key name.
///
/// The value is part of the store's key names, where whoever can list the store's keys
/// (`SCAN` on Redis, a monitoring tool, a dump) reads it. For a secret such as an API key,
/// use [`hashed`](Header::hashed).
///
/// The layer runs before anything checks the value, so a client that sends a new made-up
/// value with each request gets a new quota each time: key by a header beside the client's
/// address ([`PeerIp`](super::PeerIp) or [`ClientIp`](super::ClientIp), both checked), or by
/// an [`Extension`] an authenticating layer in front inserts once it has checked the value.
/// The value is read as sent, from the header's first line: `Bearer T` and `bearer T` are two
/// keys.
#[derive(Debug, Clone)]
pub struct Header {
    name: HeaderName,
    hashed: bool,
}

impl Header {
    /// Keys by the header `name`.
    pub fn new(name: HeaderName) -> Header {
        Header {
            name,
            hashed: false,
        }
    }

    /// Keys by the SHA-1 of the value instead of the value, `header-sha1:NAME:HEX`: the
    /// value, a secret, does not appear in the store's key names. Distinct values stay distinct
    /// (unless SHA-1 collides for them); a low-entropy value can still be found by hashing
    /// guesses, which a random API key cannot.
    ///
    /// ```
    /// use tollgate::key::Header;
    ///
    /// let api_key = Header::named("x-api-key").unwrap().hashed();
    /// # let _ = api_key;
    /// ```
    pub fn hashed(mut self) -> Header {
        self.hashed = true;
        self
    }

    /// Keys by the header `name`, given as text.
    ///
    /// # Errors
    ///
    /// When `name` is not a valid header name.
    pub fn named(name: &str) -> Result<Header, http::header::InvalidHeaderName> {
        Ok(Header::new(HeaderName::from_bytes(name.as_bytes())?))
    }
}

/// The longest header value [`Header`] keys by itself rather than by its SHA-1.
const LONGEST_PLAIN_VALUE: usize = 1024;

impl KeyExtractor for Header {
    fn extract(&self, req: &RequestView<'_>) -> Option<String> {
        let value = req.headers.get(&self.name)?;
        if value.is_empty() {
            return None;
        }
        if self.hashed || value.len() > LONGEST_PLAIN_VALUE {
            // A kind of its own, so that no plain value's key can spell a hashed one.
            let digest = sha1_smol::Sha1::from(value.as_bytes()).digest();
            return Some(format!("header-sha1:{}:{digest}", self.name));
        }
        // Every value escaped the same way (`\xff`, `\\`, …): an escaping that is applied to
        // some values only would let a printable value spell another one's escape.
        let text = value.as_bytes().escape_ascii();
        Some(format!("header:{}:{text}", self.name))
    }
}

/// A value an earlier layer put in the request extensions — typically the authenticated
/// user: `user:VALUE` (or another kind, see [`Extension::kind`]).
pub struct Extension<T> {
    kind: &'static str,
    _t: PhantomData<fn() -> T>,
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
            _t: PhantomData,
        }
    }
}

impl<T: fmt::Display + Send + Sync + 'static> Extension<T> {
    /// Keys by the extension of type `T`, as `user:VALUE`. Two extractors of other types on
    /// one store (a user id and an organisation id, say) need a [kind](Extension::kind) each:
    /// under the same kind, user 7 and organisation 7 are one identifier and share its budget.
    pub fn new() -> Extension<T> {
        Extension {
            kind: "user",
            _t: PhantomData,
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
///
/// A path is chosen by the client, so keyed by paths a client makes as many keys as paths it
/// asks for, each with a quota of its own. Behind axum, only a request a route matched has
/// a template: apply the layer with `Router::route_layer`, which leaves out the requests no
/// route matches (the fallback's 404s), rather than `Router::layer`, which keys those by
/// their paths. A layer wrapped around the whole router sees no template at all.
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

/// The gRPC method of a request (`grpc:/package.Service/Method`): the path of every `POST`,
/// whatever its `content-type`, which the client chooses and tonic does not check (a call sent
/// with another would otherwise go by unkeyed); missing on other requests. On a server that
/// also answers HTTP, its `POST`s are keyed by their path the same way. The method is read
/// from the path before any service answers, so a made-up method (which the server will
/// answer with `UNIMPLEMENTED`) is a key of its own, as a made-up path is for [`Route`].
///
/// As a layer's only key, it leaves the requests that are not `POST`s without one, and a
/// request without a key is refused by default (500): a grpc-web server's CORS preflights
/// (`OPTIONS`) and an HTTP health check among them. Let them through with
/// `.bypass(|req: &RequestView<'_>| req.method != http::Method::POST)`, or
/// [`MissingKey::Allow`](crate::layer::MissingKey::Allow).
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcMethod;

impl KeyExtractor for GrpcMethod {
    fn extract(&self, req: &RequestView<'_>) -> Option<String> {
        (req.method == http::Method::POST).then(|| format!("grpc:{}", req.uri.path()))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn key(extractor: &impl KeyExtractor, req: &http::Request<()>) -> Option<String> {
        extractor.extract(&RequestView::of(req))
    }

    fn get(uri: &str, headers: &[(&str, &[u8])]) -> http::Request<()> {
        let mut builder = http::Request::builder().uri(uri);
        for &(name, value) in headers {
            builder = builder.header(name, http::HeaderValue::from_bytes(value).unwrap());
        }
        builder.body(()).unwrap()
    }

    #[test]
    fn header_keys_by_the_escaped_value() {
        let api_key = Header::named("X-Api-Key").unwrap();
        let req = get("/", &[("x-api-key", b"abc123")]);
        assert_eq!(
            key(&api_key, &req).as_deref(),
            Some("header:x-api-key:abc123")
        );

        // Escaped alike, so distinct values stay distinct.
        let raw = key(&api_key, &get("/", &[("x-api-key", b"a\xffb")]));
        let spelled = key(&api_key, &get("/", &[("x-api-key", b"a\\xffb")]));
        assert_eq!(raw.as_deref(), Some("header:x-api-key:a\\xffb"));
        assert_eq!(spelled.as_deref(), Some("header:x-api-key:a\\\\xffb"));

        // Empty or absent: missing.
        assert_eq!(key(&api_key, &get("/", &[("x-api-key", b"")])), None);
        assert_eq!(key(&api_key, &get("/", &[])), None);

        assert!(Header::named("not a header").is_err());
        let by_name = Header::new(HeaderName::from_static("x-api-key"));
        assert_eq!(
            key(&by_name, &get("/", &[("x-api-key", b"k")])).as_deref(),
            Some("header:x-api-key:k")
        );

        // Hashed: the value's SHA-1, never the value; distinct values stay distinct, and an
        // empty value is still missing.
        let hashed = Header::named("x-api-key").unwrap().hashed();
        let secret = key(&hashed, &get("/", &[("x-api-key", b"sk_live_abc")])).unwrap();
        assert_eq!(
            secret,
            format!(
                "header-sha1:x-api-key:{}",
                sha1_smol::Sha1::from("sk_live_abc").digest()
            )
        );
        assert!(!secret.contains("sk_live"));
        let other = key(&hashed, &get("/", &[("x-api-key", b"sk_live_abd")])).unwrap();
        assert_ne!(secret, other);
        assert_eq!(key(&hashed, &get("/", &[("x-api-key", b"")])), None);

        // A value over 1 KiB is keyed by its SHA-1, not written out (escaped, up to four
        // times its size) only to be hashed into a key name; 1 KiB still is written out.
        let api_key = Header::named("x-api-key").unwrap();
        let long = vec![0xffu8; 400 * 1024];
        let keyed = key(&api_key, &get("/", &[("x-api-key", &long)])).unwrap();
        let digest = sha1_smol::Sha1::from(&long[..]).digest();
        assert_eq!(keyed, format!("header-sha1:x-api-key:{digest}"));
        let kib = vec![b'k'; 1024];
        let plain = key(&api_key, &get("/", &[("x-api-key", &kib)])).unwrap();
        assert_eq!(plain.len(), "header:x-api-key:".len() + 1024);
        let mut longer = kib.clone();
        longer.push(b'k');
        let hashed = key(&api_key, &get("/", &[("x-api-key", &longer)])).unwrap();
        assert!(hashed.starts_with("header-sha1:"), "{hashed}");
    }

    #[test]
    fn extension_keys_by_the_stored_value() {
        #[derive(Clone)]
        struct UserId(u64);
        impl fmt::Display for UserId {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }

        let mut req = get("/", &[]);
        assert_eq!(key(&Extension::<UserId>::new(), &req), None);
        req.extensions_mut().insert(UserId(42));
        assert_eq!(
            key(&Extension::<UserId>::default(), &req).as_deref(),
            Some("user:42")
        );
        assert_eq!(
            key(&Extension::<UserId>::new().kind("tenant"), &req).as_deref(),
            Some("tenant:42")
        );
    }

    #[test]
    fn route_grpc_method_and_global() {
        let req = get("/users/42?x=1", &[]);
        assert_eq!(key(&Route, &req).as_deref(), Some("path:/users/42"));
        assert_eq!(key(&GrpcMethod, &req), None);
        assert_eq!(key(&Global, &req).as_deref(), Some("global"));

        // a gRPC call, and a POST that does not say it is one (tonic serves it all the same)
        for content_type in [&b"application/grpc+proto"[..], b"application/octet-stream"] {
            let mut req = get("/pkg.Service/Method", &[("content-type", content_type)]);
            *req.method_mut() = http::Method::POST;
            assert_eq!(
                key(&GrpcMethod, &req).as_deref(),
                Some("grpc:/pkg.Service/Method")
            );
        }
        // a GET is no gRPC call, whatever it says
        let req = get(
            "/pkg.Service/Method",
            &[("content-type", b"application/grpc+proto")],
        );
        assert_eq!(key(&GrpcMethod, &req), None);
    }

    /// A request is answered in gRPC's form (a `200` with a `grpc-status`) only when it is a
    /// `POST` saying `application/grpc…`, in any case: a client cannot turn the refusal of a
    /// `GET` into a `200`.
    #[test]
    fn grpc_requests_are_posts_of_grpc_content() {
        let request = |method: http::Method, content_type: &[u8]| {
            let mut req = get("/pkg.Service/Method", &[("content-type", content_type)]);
            *req.method_mut() = method;
            req
        };
        let is_grpc = |req: &http::Request<()>| RequestView::of(req).is_grpc();
        assert!(is_grpc(&request(http::Method::POST, b"application/grpc")));
        assert!(is_grpc(&request(
            http::Method::POST,
            b"Application/GRPC+proto"
        )));
        assert!(!is_grpc(&request(http::Method::GET, b"application/grpc")));
        assert!(!is_grpc(&request(http::Method::POST, b"application/json")));
        assert!(!is_grpc(&request(http::Method::POST, b"application/grp")));
    }

    #[cfg(feature = "axum")]
    #[test]
    fn route_prefers_the_matched_template() {
        use axum::routing::get as route;
        use tower::ServiceExt;

        // axum puts the matched template in the extensions of the request it routes.
        let seen = std::sync::Arc::new(std::sync::Mutex::new(None));
        let record = seen.clone();
        let app = axum::Router::new().route(
            "/users/{id}",
            route(move |req: axum::extract::Request| {
                *record.lock().unwrap() = Route.extract(&RequestView::of(&req));
                async {}
            }),
        );
        let req = http::Request::builder()
            .uri("/users/42")
            .body(axum::body::Body::empty())
            .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(app.oneshot(req)).unwrap();
        assert_eq!(seen.lock().unwrap().as_deref(), Some("route:/users/{id}"));
    }
}

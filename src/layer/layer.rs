//! [`RateLimitLayer`]: the configuration of the HTTP middleware.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::StatusCode;

use super::config::{Action, Config, LayerSettings, MissingKey, Rule};
use super::RateLimit;
use crate::http::headers::HeaderStyle;
use crate::key::{AnyExtractor, KeyExtractor, RequestView};
use crate::{Decision, Limiter};

/// Rate limiting for HTTP services. See the [`layer`](super) module documentation.
///
/// ```
/// use tollgate::key::{Header, PeerIp, RequestView};
/// use tollgate::{Limiter, MemoryStore, RateLimitLayer};
///
/// let store = MemoryStore::new();
/// let limiter = Limiter::new(store.clone(), "10/s, 120/min".parse().unwrap());
/// // a namespace of its own: its counts stay apart from the default limiter's
/// let login = Limiter::builder(store, "5/min log".parse().unwrap())
///     .namespace("login".parse().unwrap())
///     .build();
/// let layer = RateLimitLayer::new(limiter)
///     .key(PeerIp::default())                                   // the client IP…
///     .key(Header::named("x-api-key").unwrap().hashed())        // …and the API key, together
///     // `/login` is also held to 5 a minute, on top of the default limits
///     .route_adding(|req: &RequestView<'_>| req.uri.path() == "/login", login)
///     .bypass(|req: &RequestView<'_>| req.uri.path() == "/health");
/// # let _ = layer;
/// ```
#[derive(Clone)]
pub struct RateLimitLayer {
    config: Arc<Config>,
}

impl fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        f.debug_struct("RateLimitLayer")
            .field("default", &c.default)
            .field("rules", &c.rules.len())
            .field("keys", &c.keys.len())
            .field("missing", &c.missing)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayer {
    /// A layer checking every request against `limiter`, keyed by the peer IP until
    /// [`key`](Self::key) says otherwise.
    pub fn new(limiter: Limiter) -> RateLimitLayer {
        RateLimitLayer {
            config: Arc::new(Config::new(limiter)),
        }
    }

    fn edit(mut self, f: impl FnOnce(&mut Config)) -> Self {
        let config = Arc::make_mut(&mut self.config);
        f(config);
        config.settle();
        self
    }

    /// Adds a key extractor. With several, a request is checked for all the identifiers
    /// found, at once, all-or-nothing (e.g. the client IP *and* the user). Without any, the
    /// peer IP ([`PeerIp`](crate::key::PeerIp)) is used.
    pub fn key(self, extractor: impl KeyExtractor) -> Self {
        let e = AnyExtractor::new(extractor);
        self.edit(|c| c.keys.push(e))
    }

    /// Requests matching `matcher` are checked against `limiter` **instead of** the default
    /// limiter: the route has its own budget, and does not spend the default one.
    ///
    /// `matcher` is a `Fn(&RequestView<'_>) -> bool` (a [`RequestView`] has the method, URI,
    /// headers and extensions as fields: `|req: &RequestView<'_>| req.uri.path() ==
    /// "/export"`). Rules — this one, [`route_adding`](Self::route_adding) and
    /// [`bypass`](Self::bypass) — are tried in the order given; the first that matches
    /// applies.
    ///
    /// A route's limiter on the default limiter's store shares an identifier's state with it
    /// where their limits share a name (two sliding windows over a minute, two concurrency
    /// limits): give it a [namespace](crate::LimiterBuilder::namespace) of its own.
    pub fn route_replacing<F>(self, matcher: F, limiter: Limiter) -> Self
    where
        F: Fn(&RequestView<'_>) -> bool + Send + Sync + 'static,
    {
        self.rule(matcher, Action::Replace(limiter))
    }

    /// Requests matching `matcher` are checked against `limiter` **in addition to** the
    /// default limiter: both must allow (a stricter budget for `/login` on top of the general
    /// one). `matcher` is as for [`route_replacing`](Self::route_replacing).
    ///
    /// The two limiters are asked one after the other, the route's first, each all-or-nothing
    /// for itself: a request the route's limiter denies spends nothing of the default one, but
    /// one the default limiter denies has spent its share of the route's (as with two stacked
    /// layers). The response lists the limits of both in its rate-limit headers (only the
    /// route's when the route's limiter denied), and holds the concurrency slots of both
    /// until its body ends.
    ///
    /// On one store, give the route's limiter a [namespace](crate::LimiterBuilder::namespace)
    /// of its own, or its limits count together with the default limiter's of the same name.
    pub fn route_adding<F>(self, matcher: F, limiter: Limiter) -> Self
    where
        F: Fn(&RequestView<'_>) -> bool + Send + Sync + 'static,
    {
        self.rule(matcher, Action::Add(limiter))
    }

    /// Requests matching `matcher` are not limited (health checks, allow-listed keys), and
    /// carry no rate-limit headers. `matcher` is as for
    /// [`route_replacing`](Self::route_replacing).
    pub fn bypass<F>(self, matcher: F) -> Self
    where
        F: Fn(&RequestView<'_>) -> bool + Send + Sync + 'static,
    {
        self.rule(matcher, Action::Bypass)
    }

    fn rule<F>(self, matcher: F, action: Action) -> Self
    where
        F: Fn(&RequestView<'_>) -> bool + Send + Sync + 'static,
    {
        let rule = Rule {
            matches: Arc::new(matcher),
            action,
        };
        self.edit(|c| c.rules.push(rule))
    }

    /// What to do when no extractor finds a key (default: reject with 500, so that a
    /// misconfigured deployment is loud rather than silently unlimited). In
    /// [shadow mode](Self::shadow) (the layer's, or that of every limiter that would check
    /// the request) such a request is let through whatever this says. Each
    /// is counted in `tollgate_missing_key_total` (`action`: `allow`, `reject` or `shadow`)
    /// and logged at most once every 10 seconds (`info` when let through as configured,
    /// `warn` otherwise).
    ///
    /// Without [`key`](Self::key) the key is the peer IP, which the server must record: axum
    /// with `into_make_service_with_connect_info::<SocketAddr>()`, tonic with the `tonic`
    /// feature (on by default), hyper by inserting the `SocketAddr` into the request
    /// extensions. See [`PeerIp`](crate::key::PeerIp).
    ///
    /// # Panics
    ///
    /// When the status of [`MissingKey::Reject`] is not a 4xx or 5xx code.
    pub fn on_missing_key(self, missing: MissingKey) -> Self {
        self.edit(|c| c.missing = missing)
    }

    /// The cost (weight) of a request, default 1. A cost of 0, or more than some limit of the
    /// policy could ever admit ([`Policy::max_cost`](crate::Policy::max_cost)), is answered
    /// with `400 Bad Request` (let through in shadow mode).
    ///
    /// The rate-limit fields then count units of cost, which clients read as requests (the
    /// draft's unit when none is given): see the README's section on the headers.
    pub fn cost<F>(self, cost: F) -> Self
    where
        F: Fn(&RequestView<'_>) -> u64 + Send + Sync + 'static,
    {
        self.edit(|c| c.cost = Some(Arc::new(cost)))
    }

    /// Charges only the requests whose response `selects` picks (default: every request is
    /// charged before it is handled). A login endpoint that counts failed attempts only:
    ///
    /// ```
    /// use http::StatusCode;
    /// use tollgate::key::PeerIp;
    /// use tollgate::{Limiter, MemoryStore, RateLimitLayer};
    ///
    /// let failures = Limiter::new(MemoryStore::new(), "5/15min".parse().unwrap());
    /// let layer = RateLimitLayer::new(failures)
    ///     .key(PeerIp::default())
    ///     .charge_if(|res: &http::response::Parts| res.status == StatusCode::UNAUTHORIZED);
    /// # let _ = layer;
    /// ```
    ///
    /// What happens to a request:
    ///
    /// 1. Before the handler, the layer [peeks](crate::Limiter::peek_n): it asks what a check
    ///    would decide, charging nothing. A request the limits would deny now — the quota is
    ///    used up — is refused as usual (429, `Retry-After`, the rate-limit fields) without
    ///    reaching the handler. The peek is the request's decision in the metrics.
    /// 2. The handler answers, and `selects` is asked about the response's head (status,
    ///    headers, extensions; for a gRPC response, `grpc-status` is in the headers only when
    ///    it is trailers-only).
    /// 3. A selected response is charged by an ordinary check, all-or-nothing, as if the
    ///    request had arrived then; a charge the limits no longer admit charges nothing. The
    ///    charge runs in a task of its own, so a response dropped before it is sent is
    ///    charged all the same. A response that is not selected charges nothing.
    ///
    /// The response carries the rate-limit fields of its charge when it was charged (the
    /// quota left after it), else those of the peek (the quota left, untouched).
    ///
    /// The count never exceeds the limit, but requests can: peek and charge are two steps,
    /// and requests of one client in flight together all pass the peek before any of them is
    /// charged. Up to that many requests may reach the handler past the quota — with 5 left,
    /// 8 requests arriving together are all handled, and only 5 of them can be charged.
    /// Where that matters, add a concurrency limit for the client on a layer of its own.
    ///
    /// No concurrency slot is held: a peek takes none, and a charge gives back at once the
    /// one it takes. A concurrency limit in the policy still holds charges back: a charge made
    /// while another request's charge holds the slot for its moment is refused whole, its rate
    /// limits uncharged. Put concurrency limits on a layer of their own. Under
    /// [shadow mode](Self::shadow) both steps run, and nothing is refused.
    pub fn charge_if<F>(self, selects: F) -> Self
    where
        F: Fn(&http::response::Parts) -> bool + Send + Sync + 'static,
    {
        self.edit(|c| c.charge_if = Some(Arc::new(selects)))
    }

    /// Which rate-limit headers responses carry (default [`HeaderStyle::Ietf`]: the
    /// `RateLimit-Policy` and `RateLimit` fields of draft-ietf-httpapi-ratelimit-headers-11,
    /// described in the [`layer`](super#headers) module).
    pub fn headers(self, style: HeaderStyle) -> Self {
        self.edit(|c| c.headers = style)
    }

    /// Hands the handler each admitted request's decision (default: off): a copy of it, with
    /// its figures but not its slots (which the layer holds until the response ends), in
    /// the request's extensions, for `Extension<Decision>` in axum or
    /// `req.extensions().get::<Decision>()` in tonic, hyper or any tower service. A handler
    /// can then put the remaining quota in its body, or tell a request let through because
    /// the store failed ([`Origin::FailOpen`](crate::Origin::FailOpen)) from one the store
    /// admitted. Requests the layer does not check (a [bypass](Self::bypass), a missing key
    /// let through) carry none.
    ///
    /// ```
    /// use axum::{routing::get, Extension, Router};
    /// use tollgate::key::Header;
    /// use tollgate::{Decision, Limiter, MemoryStore, RateLimitLayer};
    ///
    /// async fn quota(Extension(decision): Extension<Decision>) -> String {
    ///     let left = decision.limits().map(|s| s.remaining).min().unwrap_or(0);
    ///     format!("{left} requests left")
    /// }
    ///
    /// let limiter = Limiter::new(MemoryStore::new(), "100/min".parse().unwrap());
    /// let layer = RateLimitLayer::new(limiter)
    ///     .key(Header::named("x-api-key").unwrap())
    ///     .decision_in_extensions(true);
    /// let _app: Router = Router::new().route("/quota", get(quota)).layer(layer);
    /// ```
    ///
    /// It costs a copy of the statuses a request; off, nothing. With
    /// [`charge_if`](Self::charge_if) the copy is of the peek made before the handler.
    pub fn decision_in_extensions(self, on: bool) -> Self {
        self.edit(|c| c.decision_in_extensions = on)
    }

    /// Adds draft-11's `pk` parameter (partition key) to each `RateLimit` item: the keyed
    /// hash (HMAC-SHA-1 under `secret`, 12 bytes, a structured-field byte sequence) of the
    /// identifier the item describes, never the identifier itself. Off by default.
    ///
    /// A client may use it to tell which of its quotas an item counts (the same key, the same
    /// partition). Give every process of a fleet the same secret, so that they agree, and
    /// keep it secret: without it, nobody can recover an identifier (an IP address) by
    /// hashing candidates.
    ///
    /// ```text
    /// RateLimit: "10/s";r=7;t=1;pk=:x4sWbYlQk0PA2ndV:
    /// ```
    ///
    /// Use at least 16 random bytes: anyone who can guess the secret can hash every IPv4
    /// address in minutes.
    ///
    /// # Panics
    ///
    /// When `secret` is empty (a secret read from an unset variable, say): the keys would be
    /// hashed under a key everyone knows, and hide nothing.
    pub fn partition_keys(self, secret: impl AsRef<[u8]>) -> Self {
        let secret: Arc<[u8]> = secret.as_ref().into();
        assert!(
            !secret.is_empty(),
            "tollgate: partition_keys(secret) with an empty secret hides no identifier: give \
             every process of the fleet the same random secret of 16 bytes or more"
        );
        self.edit(|c| c.partition_secret = Some(secret))
    }

    /// Whether limited HTTP requests are answered with an RFC 9457
    /// `application/problem+json` body (default: no, a line of text): the problem type
    /// `quota-exceeded`, or `temporary-reduced-capacity` when the
    /// [status](Self::limited_status) is 503, with the denying limits as
    /// `violated-policies`. A handler given to [`on_limited`](Self::on_limited) takes
    /// precedence.
    ///
    /// The layer's other answers of its own then come as problem details too, of no problem
    /// type of their own (`about:blank`, titled with the status): the store unavailable under
    /// [`OnStoreError::Closed`](crate::OnStoreError::Closed) (503), a request it could not
    /// check (a cost the policy never admits: 400; 500 otherwise), and a request without a
    /// key under [`MissingKey::Reject`]. gRPC calls are answered in gRPC's way either way.
    pub fn problem_details(self, on: bool) -> Self {
        self.edit(|c| c.problem_details = on)
    }

    /// Applies the plain-data settings (read from a configuration file with the `serde`
    /// feature, for instance): those `settings` gives replace the layer's, the others
    /// (`None`) stay as they are.
    ///
    /// # Panics
    ///
    /// When a refusal's status in `settings` is not a 4xx or 5xx code (settings read from a
    /// file with the `serde` feature cannot hold one).
    pub fn with_settings(self, settings: LayerSettings) -> Self {
        self.edit(|c| c.apply(settings))
    }

    /// The plain-data settings in force, every one given.
    pub fn settings(&self) -> LayerSettings {
        self.config.settings()
    }

    /// The status of a limited request (default `429 Too Many Requests`; a load shedder
    /// answers `503 Service Unavailable`). gRPC requests get the matching gRPC code
    /// (`RESOURCE_EXHAUSTED` for 429, `UNAVAILABLE` for 503).
    ///
    /// # Panics
    ///
    /// When `status` is not a 4xx or 5xx code: a limited request answered `200 OK` would
    /// look served to its client, and to caches and retry logic.
    pub fn limited_status(self, status: StatusCode) -> Self {
        self.edit(|c| c.limited_status = status)
    }

    /// Shadow mode for every limiter of the layer (default: off): every request is let
    /// through, and what the limits decide is recorded — to try limits on real traffic
    /// before enforcing them. A limiter can be in shadow mode by itself too
    /// ([`LimiterBuilder::shadow`](crate::LimiterBuilder::shadow)).
    ///
    /// Requests are charged as when enforcing (one the limits would deny is let through
    /// uncharged, as a denied request is), so the figures are those enforcement would give:
    /// would-be denials count as `outcome="shadow_denied"` in `tollgate_decisions_total` and
    /// are logged at most once every 10 seconds per limiter. Responses carry no rate-limit
    /// fields of a limiter in shadow mode: clients see nothing of a trial. Concurrency
    /// slots are taken and held as when enforcing. A request without a key is let through
    /// too, counted as `action="shadow"` in `tollgate_missing_key_total` (see
    /// [`on_missing_key`](Self::on_missing_key)).
    pub fn shadow(self, shadow: bool) -> Self {
        self.edit(|c| c.shadow = shadow)
    }

    /// Makes the layer a fleet load shedder's: its refusals say that the server is
    /// overloaded and name no limit, and `record` counts and logs each as a shed.
    pub(crate) fn shedding<F>(self, record: F) -> Self
    where
        F: Fn(&RequestView<'_>) + Send + Sync + 'static,
    {
        let record: super::config::ShedFn = Arc::new(record);
        self.edit(|c| c.shed = Some(record))
    }

    /// Builds the response to a limited HTTP request. gRPC requests do not reach it: they get
    /// the gRPC code of the [status](Self::limited_status) (`RESOURCE_EXHAUSTED` for 429,
    /// `UNAVAILABLE` for 503). `Retry-After` is added unless the handler set it, and the
    /// layer's rate-limit items are merged into any the handler wrote.
    pub fn on_limited<F>(self, handler: F) -> Self
    where
        F: Fn(&RequestView<'_>, &Decision) -> http::Response<Bytes> + Send + Sync + 'static,
    {
        self.edit(|c| c.custom_limited = Some(Arc::new(handler)))
    }
}

impl<S> tower_layer::Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit::new(inner, self.config.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Limiter, MemoryStore};

    fn layer() -> RateLimitLayer {
        RateLimitLayer::new(Limiter::new(MemoryStore::new(), "1/min".parse().unwrap()))
    }

    /// Settings change what they give and nothing else: a file that sets one thing over a
    /// layer configured in code (a shedder's 503 without headers, shadow mode) leaves the
    /// rest as the code set it.
    #[test]
    fn settings_change_only_what_they_give() {
        let configured = || {
            layer()
                .shadow(true)
                .limited_status(StatusCode::SERVICE_UNAVAILABLE)
                .headers(HeaderStyle::None)
                .on_missing_key(MissingKey::Allow)
        };
        let changed = configured().with_settings(LayerSettings {
            problem_details: Some(true),
            ..LayerSettings::default()
        });
        let expected = LayerSettings {
            headers: Some(HeaderStyle::None),
            limited_status: Some(StatusCode::SERVICE_UNAVAILABLE),
            missing_key: Some(MissingKey::Allow),
            problem_details: Some(true),
            shadow: Some(true),
        };
        assert_eq!(changed.settings(), expected);
        // no change at all, and every setting given back as it was
        let kept = configured().with_settings(LayerSettings::default());
        assert_eq!(kept.settings(), configured().settings());
        assert_eq!(layer().with_settings(expected.clone()).settings(), expected);
    }

    /// A refusal answered with a status that is no error (a limited request answered
    /// `200 OK` looks served) is refused when the layer is built, as it is when read from a
    /// file, whichever way it is given.
    #[test]
    fn a_refusal_status_that_is_no_error_is_refused_when_built() {
        // the panic's message, which must be the refusal's
        let refused = |built: std::thread::Result<RateLimitLayer>| match built {
            Ok(_) => false,
            Err(panic) => panic
                .downcast_ref::<String>()
                .is_some_and(|m| m.contains("is not the status of a refusal")),
        };
        for status in [StatusCode::OK, StatusCode::CONTINUE, StatusCode::FOUND] {
            let built = std::panic::catch_unwind(|| layer().limited_status(status));
            assert!(refused(built), "limited_status({status}) accepted");
            let built =
                std::panic::catch_unwind(|| layer().on_missing_key(MissingKey::Reject(status)));
            assert!(refused(built), "MissingKey::Reject({status}) accepted");
            let settings = LayerSettings {
                limited_status: Some(status),
                ..LayerSettings::default()
            };
            let built = std::panic::catch_unwind(|| layer().with_settings(settings.clone()));
            assert!(refused(built), "settings with {status} accepted");
        }
        let _ = layer()
            .limited_status(StatusCode::SERVICE_UNAVAILABLE)
            .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED));
    }
}

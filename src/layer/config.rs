//! What a [`RateLimitLayer`](super::RateLimitLayer) is configured with.

use std::sync::Arc;

use bytes::Bytes;
use http::StatusCode;

use super::check::ChargeFn;
use crate::http::headers::{HeaderCache, HeaderStyle};
use crate::http::response::{problem_response, shed_problem_response};
use crate::key::{AnyExtractor, RequestView};
use crate::observe::BoundedLog;
use crate::{Decision, Limiter};

/// Whether a rule applies to a request.
pub(crate) type Matcher = Arc<dyn Fn(&RequestView<'_>) -> bool + Send + Sync>;
/// The cost of a request.
pub(crate) type CostFn = Arc<dyn Fn(&RequestView<'_>) -> u64 + Send + Sync>;
/// Records a refusal of a load shedder's layer as a shed.
pub(crate) type ShedFn = Arc<dyn Fn(&RequestView<'_>) + Send + Sync>;
/// The response to a limited HTTP request.
pub(crate) type LimitedFn =
    Arc<dyn Fn(&RequestView<'_>, &Decision) -> http::Response<Bytes> + Send + Sync>;

/// What to do with a request none of the key extractors found a key in.
///
/// With the `serde` feature it is written as `"allow"`, or as the status to reject with
/// (`500`); `"reject"` reads as `500`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingKey {
    /// Let it through unlimited.
    Allow,
    /// Answer with this status (for gRPC requests, the matching gRPC code) and a message
    /// saying that no rate-limit key was found.
    Reject(StatusCode),
}

impl Default for MissingKey {
    /// `Reject(500)`: a deployment that lost its keys should be loud, not silently unlimited.
    fn default() -> MissingKey {
        MissingKey::Reject(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

/// The settings of a [`RateLimitLayer`](super::RateLimitLayer) that are plain data, to read
/// from a configuration file (with the `serde` feature) and apply with
/// [`RateLimitLayer::with_settings`](super::RateLimitLayer::with_settings).
///
/// Each field is a change: `None` (a field missing from the file) leaves the layer's setting
/// as it is, whether its default or one set in code, so a file that sets one thing changes
/// one thing:
///
/// ```toml
/// headers = "ietf"           # or "legacy", "both", "none"
/// limited_status = 429       # a 4xx or 5xx code
/// missing_key = 500          # or "allow"; a code: 4xx or 5xx
/// problem_details = false
/// shadow = false             # true: record what the limits decide, refuse nothing
/// ```
///
/// [`RateLimitLayer::settings`](super::RateLimitLayer::settings) gives every field.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(default, deny_unknown_fields)
)]
#[non_exhaustive]
pub struct LayerSettings {
    /// Which rate-limit headers responses carry (the layer's default:
    /// [`HeaderStyle::Ietf`]).
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub headers: Option<HeaderStyle>,
    /// The status of a limited request (the layer's default: 429): a 4xx or 5xx code, as a
    /// limited request answered `200` would look served (read from a file, another code is
    /// an error; applied with [`with_settings`](super::RateLimitLayer::with_settings), a
    /// panic).
    #[cfg_attr(
        feature = "serde",
        serde(with = "status_code", skip_serializing_if = "Option::is_none")
    )]
    pub limited_status: Option<StatusCode>,
    /// What to do with a request without a key (the layer's default: reject with 500).
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub missing_key: Option<MissingKey>,
    /// Whether limited HTTP requests get an RFC 9457 `application/problem+json` body (the
    /// layer's default: no, a line of text).
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub problem_details: Option<bool>,
    /// Shadow mode: every request is let through and what the limits decide is recorded
    /// (the layer's default: no). See [`RateLimitLayer::shadow`](super::RateLimitLayer::shadow).
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub shadow: Option<bool>,
}

/// What a rule does with the requests it matches.
#[derive(Clone, Debug)]
pub(crate) enum Action {
    /// Not limited.
    Bypass,
    /// Checked against this limiter instead of the default one.
    Replace(Limiter),
    /// Checked against this limiter and the default one: both must allow.
    Add(Limiter),
}

/// A per-request rule.
#[derive(Clone)]
pub(crate) struct Rule {
    pub(crate) matches: Matcher,
    pub(crate) action: Action,
}

/// The settings of a [`RateLimitLayer`](super::RateLimitLayer), shared by its services.
#[derive(Clone)]
pub(crate) struct Config {
    /// The limiter of requests no rule matches.
    pub(crate) default: Limiter,
    /// Per-request rules, tried in order; the first that matches applies.
    pub(crate) rules: Vec<Rule>,
    /// The key extractors (none: the peer IP).
    pub(crate) keys: Vec<AnyExtractor>,
    pub(crate) missing: MissingKey,
    /// The cost of a request (none: 1).
    pub(crate) cost: Option<CostFn>,
    pub(crate) headers: HeaderStyle,
    /// The response to a limited HTTP request (none: a text of the layer's own): the
    /// application's handler, else the problem details when asked for.
    pub(crate) on_limited: Option<LimitedFn>,
    pub(crate) limited_status: StatusCode,
    /// The application's handler of limited requests.
    pub(crate) custom_limited: Option<LimitedFn>,
    pub(crate) problem_details: bool,
    /// A copy of each admitted request's decision in its extensions, for the handler.
    pub(crate) decision_in_extensions: bool,
    /// Every check of the layer in shadow mode.
    pub(crate) shadow: bool,
    /// Charged by response: a peek before the handler, the charge after it for the responses
    /// this selects.
    pub(crate) charge_if: Option<ChargeFn>,
    /// The secret of the `pk` parameters (none: no `pk`).
    pub(crate) partition_secret: Option<Arc<[u8]>>,
    /// The parts of the rate-limit fields that do not change from one response to the next.
    pub(crate) header_cache: Arc<HeaderCache>,
    /// The requests without a key, logged at a bounded rate.
    pub(crate) missing_log: Arc<BoundedLog>,
    /// The requests without the peer's address, checked by their other keys alone, logged at
    /// a bounded rate.
    pub(crate) no_address_log: Arc<BoundedLog>,
    /// The charges by response the limits no longer admitted, logged at a bounded rate.
    pub(crate) refused_charges_log: Arc<BoundedLog>,
    /// The requests the layer could not check (answered 400 or 500), logged at a bounded
    /// rate.
    pub(crate) unchecked_log: Arc<BoundedLog>,
    /// The fleet load shedder the layer is, if it is one: its refusals name no limit, and
    /// are recorded as sheds by this (it counts and logs them).
    pub(crate) shed: Option<ShedFn>,
}

impl Config {
    /// The defaults: keyed by the peer IP, a missing key answered with 500, failing open,
    /// IETF headers, 429.
    pub(crate) fn new(limiter: Limiter) -> Config {
        Config {
            default: limiter,
            rules: Vec::new(),
            keys: Vec::new(),
            missing: MissingKey::default(),
            cost: None,
            headers: HeaderStyle::default(),
            on_limited: None,
            limited_status: StatusCode::TOO_MANY_REQUESTS,
            custom_limited: None,
            problem_details: false,
            decision_in_extensions: false,
            shadow: false,
            charge_if: None,
            partition_secret: None,
            header_cache: Arc::default(),
            missing_log: Arc::default(),
            no_address_log: Arc::default(),
            refused_charges_log: Arc::default(),
            unchecked_log: Arc::default(),
            shed: None,
        }
    }

    /// The plain-data settings, every one given.
    pub(crate) fn settings(&self) -> LayerSettings {
        LayerSettings {
            headers: Some(self.headers),
            limited_status: Some(self.limited_status),
            missing_key: Some(self.missing),
            problem_details: Some(self.problem_details),
            shadow: Some(self.shadow),
        }
    }

    /// Applies the settings `settings` gives; the others stay as they are.
    pub(crate) fn apply(&mut self, settings: LayerSettings) {
        let LayerSettings {
            headers,
            limited_status,
            missing_key,
            problem_details,
            shadow,
        } = settings;
        self.headers = headers.unwrap_or(self.headers);
        self.limited_status = limited_status.unwrap_or(self.limited_status);
        self.missing = missing_key.unwrap_or(self.missing);
        self.problem_details = problem_details.unwrap_or(self.problem_details);
        self.shadow = shadow.unwrap_or(self.shadow);
    }

    /// Settles which handler answers limited requests, after a change.
    ///
    /// # Panics
    ///
    /// When a refusal's status is not a 4xx or 5xx code (see [`refusal_status`]).
    pub(crate) fn settle(&mut self) {
        refusal_status(self.limited_status, "limited_status");
        if let MissingKey::Reject(status) = self.missing {
            refusal_status(status, "MissingKey::Reject");
        }
        self.on_limited = match (&self.custom_limited, self.problem_details) {
            (Some(handler), _) => Some(handler.clone()),
            (None, true) => {
                let status = self.limited_status;
                let problem: LimitedFn = match self.shed {
                    None => Arc::new(move |_: &RequestView<'_>, d: &Decision| {
                        problem_response(status, d)
                    }),
                    // (a shedder's refusal names no limit: see `shed::FleetRefusals`)
                    Some(_) => Arc::new(move |_: &RequestView<'_>, _: &Decision| {
                        shed_problem_response(status)
                    }),
                };
                Some(problem)
            }
            (None, false) => None,
        };
    }
}

/// Whether `status` can answer a refusal: a 4xx or 5xx code. A limited request answered
/// `200 OK` would look served to its client (and to caches, retry logic, and gRPC clients,
/// which would see `INTERNAL`), and a 1xx or 3xx would not be a refusal at all.
fn is_refusal(status: StatusCode) -> bool {
    status.is_client_error() || status.is_server_error()
}

/// Panics, naming `setting`, when `status` cannot answer a refusal ([`is_refusal`]): a
/// mistake in the program's own configuration, found when the layer is built rather than
/// on the first refused request. (A status read from a file is checked as it is read, with
/// an error.)
fn refusal_status(status: StatusCode, setting: &str) {
    assert!(
        is_refusal(status),
        "tollgate: {setting}({status}) is not the status of a refusal: expected a 4xx or 5xx \
         code"
    );
}

#[cfg(feature = "serde")]
mod status_code {
    use http::StatusCode;
    use serde::{de, Deserializer, Serializer};

    // (a missing status is not written: see the field's `skip_serializing_if`)
    pub(super) fn serialize<S: Serializer>(
        status: &Option<StatusCode>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match status {
            Some(status) => s.serialize_u16(status.as_u16()),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<StatusCode>, D::Error> {
        d.deserialize_any(Code)
    }

    /// A status as a number, as text (configuration read from environment variables gives
    /// every value as a string), or `null` for none.
    struct Code;

    impl<'de> de::Visitor<'de> for Code {
        type Value = Option<StatusCode>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an HTTP status code of a refusal (4xx or 5xx)")
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            let code = u16::try_from(v)
                .map_err(|_| E::custom(format!("{v} is not an HTTP status code")))?;
            refusal(code).map(Some).map_err(E::custom)
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
            match u64::try_from(v) {
                Ok(v) => self.visit_u64(v),
                Err(_) => Err(E::invalid_value(de::Unexpected::Signed(v), &self)),
            }
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            match v.trim().parse::<u64>() {
                Ok(code) => self.visit_u64(code),
                Err(_) => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
            }
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(self)
        }
    }

    /// `code` as the status of a refusal: an HTTP status code of an error (4xx or 5xx). A
    /// limited request answered `200 OK` (a slip of the pen in a file) would look served to
    /// its client, and a 1xx or 3xx would not be a refusal at all.
    pub(super) fn refusal(code: u16) -> Result<StatusCode, String> {
        let status =
            StatusCode::from_u16(code).map_err(|_| format!("{code} is not an HTTP status code"))?;
        if super::is_refusal(status) {
            Ok(status)
        } else {
            Err(format!(
                "{code} is not the status of a refusal: expected a 4xx or 5xx code"
            ))
        }
    }
}

#[cfg(feature = "serde")]
mod missing_key_serde {
    use std::fmt;

    use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

    use super::MissingKey;

    impl Serialize for MissingKey {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            match self {
                MissingKey::Allow => s.serialize_str("allow"),
                MissingKey::Reject(status) => s.serialize_u16(status.as_u16()),
            }
        }
    }

    impl<'de> Deserialize<'de> for MissingKey {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<MissingKey, D::Error> {
            d.deserialize_any(Visitor)
        }
    }

    struct Visitor;

    impl de::Visitor<'_> for Visitor {
        type Value = MissingKey;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(r#""allow", "reject" or an HTTP status code"#)
        }

        // A code may come as text too: configuration read from environment variables hands
        // every value over as a string.
        fn visit_str<E: de::Error>(self, v: &str) -> Result<MissingKey, E> {
            let word = v.trim();
            if word.eq_ignore_ascii_case("allow") {
                Ok(MissingKey::Allow)
            } else if word.eq_ignore_ascii_case("reject") {
                Ok(MissingKey::default())
            } else if let Ok(code) = word.parse::<u64>() {
                self.visit_u64(code)
            } else {
                Err(E::invalid_value(de::Unexpected::Str(v), &self))
            }
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> Result<MissingKey, E> {
            let code = u16::try_from(v)
                .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))?;
            super::status_code::refusal(code)
                .map(MissingKey::Reject)
                .map_err(E::custom)
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<MissingKey, E> {
            match u64::try_from(v) {
                Ok(v) => self.visit_u64(v),
                Err(_) => Err(E::invalid_value(de::Unexpected::Signed(v), &self)),
            }
        }
    }
}

#[cfg(all(test, feature = "serde"))]
mod tests {
    use http::StatusCode;

    use super::{LayerSettings, MissingKey};
    use crate::layer::HeaderStyle;

    #[test]
    fn settings_read_from_toml() {
        let s: LayerSettings = toml::from_str(
            "headers = \"both\"\nlimited_status = 503\nmissing_key = \"allow\"\nproblem_details = true\n",
        )
        .unwrap();
        assert_eq!(s.headers, Some(HeaderStyle::Both));
        assert_eq!(s.limited_status, Some(StatusCode::SERVICE_UNAVAILABLE));
        assert_eq!(s.missing_key, Some(MissingKey::Allow));
        assert_eq!(s.problem_details, Some(true));
        assert_eq!(s.shadow, None);
        let text = toml::to_string(&s).unwrap();
        assert!(!text.contains("shadow"), "{text}");
        assert_eq!(toml::from_str::<LayerSettings>(&text).unwrap(), s);

        // what a file leaves out is left out: applied, it changes nothing
        let partial: LayerSettings = toml::from_str("missing_key = 401").unwrap();
        let expected = LayerSettings {
            missing_key: Some(MissingKey::Reject(StatusCode::UNAUTHORIZED)),
            ..LayerSettings::default()
        };
        assert_eq!(partial, expected);
        let reject: LayerSettings = toml::from_str("missing_key = \"reject\"").unwrap();
        assert_eq!(reject.missing_key, Some(MissingKey::default()));
        assert_eq!(
            toml::from_str::<LayerSettings>("").unwrap(),
            LayerSettings::default()
        );
    }

    #[test]
    fn a_limited_status_may_be_written_as_text() {
        let read: LayerSettings = toml::from_str("limited_status = \"503\"").unwrap();
        assert_eq!(read.limited_status, Some(StatusCode::SERVICE_UNAVAILABLE));
        for bad in ["\"200\"", "\"x\"", "-1", "70000"] {
            let read = toml::from_str::<LayerSettings>(&format!("limited_status = {bad}"));
            assert!(read.is_err(), "{bad}");
        }
    }

    #[test]
    fn a_missing_key_rule_may_be_written_as_text() {
        for (text, rule) in [
            ("\"401\"", MissingKey::Reject(StatusCode::UNAUTHORIZED)),
            (
                "\" 503 \"",
                MissingKey::Reject(StatusCode::SERVICE_UNAVAILABLE),
            ),
            ("\"Allow\"", MissingKey::Allow),
            ("\"REJECT\"", MissingKey::default()),
        ] {
            let read: LayerSettings = toml::from_str(&format!("missing_key = {text}")).unwrap();
            assert_eq!(read.missing_key, Some(rule), "{text}");
        }
        for bad in ["\"200\"", "\"4o1\"", "\"\"", "\"-1\""] {
            let read = toml::from_str::<LayerSettings>(&format!("missing_key = {bad}"));
            assert!(read.is_err(), "{bad}");
        }
    }

    #[test]
    fn bad_settings_are_refused() {
        for bad in [
            "limited_status = 42",
            "limited_status = 200",
            "limited_status = 302",
            "missing_key = 1000",
            "missing_key = 204",
            "missing_key = \"maybe\"",
            "headers = \"x\"",
            "limited_statuss = 429",
        ] {
            assert!(toml::from_str::<LayerSettings>(bad).is_err(), "{bad}");
        }
    }
}

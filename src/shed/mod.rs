//! Load shedding: Stripe's two load shedders.
//!
//! Rate limits protect a service from one client; a load shedder protects it from everyone
//! at once.
//!
//! [`FleetShedder`] is the *fleet usage load shedder*: one concurrency budget for the whole
//! fleet (through the store), with a share always kept free for critical traffic.
//!
//! [`UtilizationShedder`] is the *worker utilization load shedder*, the last resort, local to
//! the process:
//!
//! * It watches how busy the process is (a [`UtilizationSource`], from 0 to 1; by default
//!   [`InFlight`], the requests in flight against a capacity).
//! * When the process has been too busy for a while (28 s by default, so that a blip or an
//!   imprecise measurement sheds nothing; sampled as requests come, each sample stands for at
//!   most a third of those 28 s), it starts throwing out the least important requests with a
//!   growing probability, then more important ones, until everything but
//!   [`Critical`](Priority::Critical) traffic is shed (120 s later by default).
//! * When the load goes, it lets traffic back as gradually. Sharp changes in the amount shed
//!   cause wild swings and failures that are hard to diagnose; slow ones do not.
//!
//! [`ShedConfig`] holds the thresholds and times, [`Priority::shed_probability`] the way the
//! shedding amount is spread over the four [priorities](Priority).
//!
//! [`UtilizationShedLayer`] applies a shedder to HTTP services (axum, tonic, hyper, any
//! `Service<http::Request<B>>`): shed requests are answered `503 Service Unavailable` with
//! `Retry-After`, or gRPC `UNAVAILABLE`, without reaching the service.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::shed::{Priority, UtilizationShedLayer};
//!
//! // Up to 512 requests in flight is 100 % utilization.
//! let layer = UtilizationShedLayer::in_flight(512)
//!     .classify(|req| {
//!         if req.uri.path().starts_with("/v1/charges") {
//!             Priority::Critical // the traffic the service exists for: never shed
//!         } else if req.headers.contains_key("x-test-mode") {
//!             Priority::Low // shed first
//!         } else {
//!             Priority::by_method(req) // reads (Normal) before writes (High)
//!         }
//!     })
//!     .retry_after(Duration::from_secs(5));
//! # let _ = layer;
//! ```
//!
//! The utilization shedder's state lives in the process: each process sheds by its own load.
//! The fleet shedder's state lives in the store.

mod config;
mod fleet;
mod layer;
mod priority;
mod source;
mod utilization;

pub use config::{ShedConfig, ShedConfigBuilder, ShedConfigError, ShedConfigErrorKind};
pub use fleet::FleetShedder;
pub use layer::{ResponseFuture, UtilizationShed, UtilizationShedLayer};
pub use priority::Priority;
pub use source::{InFlight, InFlightGuard, UtilizationSource};
pub use utilization::UtilizationShedder;

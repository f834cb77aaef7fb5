//! The layer's checks: one or two limiters per request, and — when the layer charges by
//! response — the charge made once the response is known.

use std::future::Future;
use std::pin::Pin;

use crate::limiter::Mode;
use crate::{Decision, Error, Limiter, Origin};

/// Checks `ids` against `first`, then — if it allowed — against `then`: one decision listing
/// the limits of both, allowed if both allowed, holding the concurrency slots of both.
///
/// Each decision is taken as the layer shows it ([`Decision::visible`]): a shadow decision
/// lets the request through and lists nothing.
pub(super) async fn check_both(
    first: &Limiter,
    then: Option<&Limiter>,
    ids: &[String],
    cost: u64,
    mode: Mode,
) -> Result<Decision, Error> {
    let mut decision = first.run(ids, cost, mode).await?.visible();
    let Some(then) = then else {
        return Ok(decision);
    };
    if !decision.is_allowed() {
        return Ok(decision);
    }
    // An error or a denial here drops the first decision, and with it any slot it took.
    let mut second = then.run(ids, cost, mode).await?.visible();
    let offset = decision
        .statuses
        .iter()
        .map(|s| s.limit_index + 1)
        .max()
        .unwrap_or(0);
    decision.statuses.extend(second.statuses.iter().map(|s| {
        let mut s = *s;
        s.limit_index += offset;
        s
    }));
    decision.allowed = second.is_allowed();
    decision.guard = match (decision.guard.take(), second.take_guard()) {
        _ if !decision.allowed => None,
        (Some(a), Some(b)) => Some(a.join(b)),
        (a, b) => a.or(b),
    };
    Ok(decision)
}

/// Whether a response is charged, for a layer that charges by response.
pub(crate) type ChargeFn = std::sync::Arc<dyn Fn(&http::response::Parts) -> bool + Send + Sync>;

/// The charge of a request that passed a layer's peek, made if its response is selected.
pub(crate) struct Pending {
    pub(super) first: Limiter,
    pub(super) then: Option<Limiter>,
    pub(super) ids: Vec<String>,
    pub(super) cost: u64,
    pub(super) shadow: bool,
}

/// A charge under way; its decision when it allowed.
pub(super) type ChargeFuture = Pin<Box<dyn Future<Output = Option<Decision>> + Send>>;

impl Pending {
    /// Charges the request, all-or-nothing for each limiter as a check does. The charge runs
    /// in a task of its own, so that it is made even if the response is dropped before it
    /// is sent. It counts no decision (the peek before the handler did); a charge the
    /// limits no longer admit (others were charged since the peek) charges nothing.
    pub(super) fn charge(self) -> ChargeFuture {
        let mode = Mode {
            shadow: self.shadow,
            charge: true,
            record: false,
        };
        let task = async move {
            let decision = check_both(&self.first, self.then.as_ref(), &self.ids, self.cost, mode)
                .await
                .ok()?;
            // A slot taken now would outlive nothing: it is given back at once.
            let mut decision = decision;
            drop(decision.take_guard());
            (decision.is_allowed() && decision.origin() != Origin::FailOpen).then_some(decision)
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let handle = runtime.spawn(task);
                Box::pin(async move { handle.await.ok().flatten() })
            }
            Err(_) => Box::pin(task),
        }
    }
}

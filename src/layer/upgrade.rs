//! The concurrency slots of a request that upgrades its connection, offered to its handler.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use http::{Method, Request};

use crate::guard::ConcurrencyGuard;
use crate::Decision;

/// The concurrency slots of a request that asks to upgrade its connection (a WebSocket
/// handshake's `Upgrade`, or `CONNECT`), offered to its handler in the request's extensions.
/// Only a request that holds slots has them (not one checked by a policy without a
/// concurrency limit, one a failure policy let through, a bypassed one, one without a key):
/// extract them as an `Option`.
///
/// The layer holds a request's slots until its response body ends. An upgraded connection
/// outlives its response — a `101 Switching Protocols` with an empty body, sent and dropped
/// at once — so its slots would go back as the `101` is sent, and an `N concurrent` policy
/// would let any number of sockets open. A handler that takes the slots before it returns
/// its response, and keeps them with the connection, holds them until the connection ends.
/// Slots the handler leaves are held by the response as any request's are. Layers stacked
/// on one route offer their slots together: one `take` hands the slots of all of them.
///
/// ```
/// use axum::extract::ws::{WebSocket, WebSocketUpgrade};
/// use axum::response::Response;
/// use axum::Extension;
/// use tollgate::layer::UpgradeSlots;
///
/// async fn socket(ws: WebSocketUpgrade, slots: Option<Extension<UpgradeSlots>>) -> Response {
///     // taken now: once the 101 is out, the layer would have given them back
///     let held = slots.and_then(|Extension(slots)| slots.take());
///     ws.on_upgrade(move |socket: WebSocket| async move {
///         let _held = held; // the slots go back when the socket closes
///         serve(socket).await
///     })
/// }
/// # async fn serve(_: WebSocket) {}
/// ```
#[derive(Clone, Default)]
pub struct UpgradeSlots(Arc<Mutex<Option<ConcurrencyGuard>>>);

impl UpgradeSlots {
    /// The request's slots, which then go back when the guard is dropped rather than with
    /// the response; `None` once taken.
    pub fn take(&self) -> Option<ConcurrencyGuard> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

impl fmt::Debug for UpgradeSlots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let held = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some();
        f.debug_struct("UpgradeSlots").field("held", &held).finish()
    }
}

/// The slots offered to a handler, as the layer keeps them: taken back for the response's
/// body if the handler left them, and given back when dropped first (the response future
/// dropped: a client gone, say), however long the request's extensions live.
pub(super) struct Offered(UpgradeSlots);

impl Offered {
    /// The slots, if the handler left them.
    pub(super) fn take_back(&self) -> Option<ConcurrencyGuard> {
        self.0.take()
    }
}

impl Drop for Offered {
    fn drop(&mut self) {
        drop(self.0.take());
    }
}

/// Offers the slots `decision` holds to the handler of `req`, if it asks to upgrade its
/// connection: the handle the layer takes them back from when the handler left them.
#[inline(always)]
pub(super) fn offer<B>(req: &mut Request<B>, decision: &mut Decision) -> Option<Offered> {
    decision.guard.as_ref()?;
    offer_held(req, decision)
}

/// [`offer`], for a decision that holds slots.
///
/// Slots an outer layer offered already are joined by these, in one offer that both layers
/// share: the handler takes all of them, and whichever layer answers first takes back what
/// it left for its response's body, which the outer response's holds. (A second offer in
/// the extensions would replace the first, whose slots would then go back with the `101`.)
#[cold]
#[inline(never)]
fn offer_held<B>(req: &mut Request<B>, decision: &mut Decision) -> Option<Offered> {
    if !asks_to_upgrade(req) {
        return None;
    }
    let guard = decision.take_guard();
    if let Some(outer) = req.extensions().get::<UpgradeSlots>() {
        let slots = outer.clone();
        {
            let mut held = slots.0.lock().unwrap_or_else(PoisonError::into_inner);
            *held = match (held.take(), guard) {
                (Some(outer), Some(inner)) => Some(outer.join(inner)),
                (outer, inner) => outer.or(inner),
            };
        }
        return Some(Offered(slots));
    }
    let slots = UpgradeSlots(Arc::new(Mutex::new(guard)));
    req.extensions_mut().insert(slots.clone());
    Some(Offered(slots))
}

/// Whether `req` asks to upgrade its connection: an HTTP/1.1 `Upgrade` (a WebSocket
/// handshake), or a `CONNECT` (a tunnel, or an HTTP/2 WebSocket).
fn asks_to_upgrade<B>(req: &Request<B>) -> bool {
    req.method() == Method::CONNECT || req.headers().contains_key(http::header::UPGRADE)
}

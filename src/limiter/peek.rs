//! The read-only check a peek asks the store for.
//!
//! A peek is the first phase of a check alone: every (identifier, limit) pair evaluated for
//! the cost, nothing written — on Redis no key, value or TTL changes. Its [`Outcome`] has the
//! layout of a check's: per pair whether the cost fits, the quota available now (nothing
//! was charged), the time until the quota is whole, and when denied the time until the cost
//! fits. The plan's lease is empty: a peek takes no slot.

use crate::store::{Outcome, Plan, Store, StoreError};

/// What a check of `plan` would decide now, without charging anything.
///
/// The stores have no read-only check yet: until they do, a peek fails as a store error,
/// which the limiter's failure policy answers.
pub(super) async fn store_peek(store: &Store, plan: &Plan<'_>) -> Result<Outcome, StoreError> {
    let _ = (store, plan);
    Err(StoreError::UnexpectedReply(
        "this store cannot check without charging".into(),
    ))
}

//! Placeholder for the split check, until it lands.

use super::RedisStore;
use crate::store::{Outcome, Plan, StoreError};

impl RedisStore {
    /// A check whose identifiers fall in several hash slots.
    pub(crate) async fn check_split(
        &self,
        _plan: &Plan<'_>,
        _groups: &[Vec<usize>],
    ) -> Result<Outcome, StoreError> {
        Err(StoreError::UnexpectedReply(
            "identifiers in several hash slots".into(),
        ))
    }
}

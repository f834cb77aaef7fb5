//! What a check reports when it cannot be decided.

use std::fmt;

use super::MAX_IDENTIFIERS;
use crate::store::StoreError;

/// A check that could not be decided.
///
/// Being limited is not an error: that is a [`Decision`](crate::Decision) that is not allowed. These are the
/// two other outcomes — a request that is impossible as asked, and a store that failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The cost is 0, or more than the policy could ever admit at once.
    Cost {
        /// The cost asked for.
        cost: u64,
        /// The largest cost the policy admits ([`Policy::max_cost`](crate::Policy::max_cost)).
        max: u64,
    },
    /// No identifier was given.
    NoIdentifiers,
    /// More than [`MAX_IDENTIFIERS`] distinct identifiers were given.
    TooManyIdentifiers(usize),
    /// A [`Scheduler`](crate::Scheduler)'s queue is one identifier's: a scheduled call named
    /// this many distinct identifiers.
    NotOneIdentifier(usize),
    /// The store could not decide.
    Store(StoreError),
}

impl Error {
    /// The kind of the error, as the metrics label it (`cost`, `no_identifiers`,
    /// `too_many_identifiers`, `not_one_identifier`, `store`).
    #[cfg_attr(not(any(feature = "metrics", feature = "tracing")), allow(dead_code))]
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Error::Cost { .. } => "cost",
            Error::NoIdentifiers => "no_identifiers",
            Error::TooManyIdentifiers(_) => "too_many_identifiers",
            Error::NotOneIdentifier(_) => "not_one_identifier",
            Error::Store(_) => "store",
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Cost { cost, max } => write!(
                f,
                "a request of cost {cost} can never be admitted (costs must be between 1 and {max})"
            ),
            Error::NoIdentifiers => f.write_str("no identifier to rate-limit"),
            Error::TooManyIdentifiers(n) => write!(
                f,
                "{n} identifiers in one check (at most {MAX_IDENTIFIERS})"
            ),
            Error::NotOneIdentifier(n) => write!(
                f,
                "{n} identifiers for one scheduled call (a queue is one identifier's)"
            ),
            Error::Store(e) => fmt::Display::fmt(e, f),
        }
    }
}

/// A store failure is shown as itself: its message here, its cause as the source.
impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Store(e) => e.source(),
            _ => None,
        }
    }
}

//! One error type for the whole core.
//!
//! Each variant carries what a user needs to fix the input (an index, the offending
//! value, the limit). The binding crate maps the *kind* of error to a Python exception
//! class, so keep the kinds few and meaningful.

use thiserror::Error;

/// Convenience alias used by every fallible function of the core.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong in the core.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Error {
    /// A value is outside its domain (negative length, zero budget, unknown option, ...).
    #[error("{0}")]
    InvalidValue(String),
    /// A sequence is longer than the budget and the policy says to refuse it.
    #[error(
        "sequence {index} has {length} tokens, more than max_tokens={max_tokens}{detail}; \
         pass oversize='truncate', 'split' or 'drop' to handle it"
    )]
    Oversize {
        index: usize,
        length: i64,
        max_tokens: u64,
        detail: String,
    },
    /// An integer result does not fit in its type (totals beyond 2^63, too many items).
    #[error("{0}")]
    Overflow(String),
}

impl Error {
    /// Shorthand for [`Error::InvalidValue`] with a formatted message.
    pub fn invalid(message: impl Into<String>) -> Self {
        Error::InvalidValue(message.into())
    }

    /// Shorthand for [`Error::Overflow`] with a formatted message.
    pub fn overflow(message: impl Into<String>) -> Self {
        Error::Overflow(message.into())
    }
}

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
    /// A group of sequences (or a sequence under several budgets) costs more than a budget
    /// and the policy says to refuse it; the message names it, its cost and the budget.
    #[error("{0}")]
    OversizeGroup(String),
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

/// `value` as a count of at least `minimum`, refusing smaller values with a message naming
/// the parameter. Counts from Python arrive signed so that a negative one is reported as
/// such instead of failing a conversion.
pub fn at_least(value: i64, minimum: u64, name: &str) -> Result<u64> {
    match u64::try_from(value) {
        Ok(count) if count >= minimum => Ok(count),
        _ => Err(Error::invalid(format!(
            "{name} must be at least {minimum}, got {value}"
        ))),
    }
}

/// [`at_least`], as a `usize` (an overflow error where it does not fit).
pub fn at_least_usize(value: i64, minimum: u64, name: &str) -> Result<usize> {
    let count = at_least(value, minimum, name)?;
    usize::try_from(count)
        .map_err(|_| Error::overflow(format!("{name}={count} does not fit in memory")))
}

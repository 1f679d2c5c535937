//! Options shared by every packing entry point, parsed and validated once.

use std::str::FromStr;

use crate::error::{Error, Result};

/// The largest token budget accepted: segment lengths and remaining capacities (+1) are
/// stored as `u32`, which keeps working memory small. No real micro-batch comes close.
pub const MAX_TOKENS_LIMIT: u64 = u32::MAX as u64 - 1;

/// How sequences are assigned to bins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// Best-fit decreasing: longest first, each into the fullest bin it fits.
    BestFitDecreasing,
    /// First-fit decreasing: longest first, each into the first bin it fits.
    FirstFitDecreasing,
    /// Input order, a single open bin that is closed as soon as a sequence does not fit.
    NextFit,
    /// First-fit over a seeded random permutation: bins stay random in composition.
    FirstFitShuffled,
}

impl FromStr for Algorithm {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        match name {
            "bfd" => Ok(Self::BestFitDecreasing),
            "ffd" => Ok(Self::FirstFitDecreasing),
            "next_fit" => Ok(Self::NextFit),
            "first_fit_shuffled" => Ok(Self::FirstFitShuffled),
            other => Err(Error::invalid(format!(
                "unknown algorithm '{other}'; expected one of 'bfd', 'ffd', 'next_fit', 'first_fit_shuffled'"
            ))),
        }
    }
}

/// What happens to a sequence whose cost exceeds the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Oversize {
    /// Refuse the input, naming the first offending sequence.
    Error,
    /// Keep only the first `capacity` tokens.
    Truncate,
    /// Cut into pieces of at most `capacity` tokens; no token is lost.
    Split,
    /// Leave the sequence out and count it in the summary.
    Drop,
}

impl FromStr for Oversize {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        match name {
            "error" => Ok(Self::Error),
            "truncate" => Ok(Self::Truncate),
            "split" => Ok(Self::Split),
            "drop" => Ok(Self::Drop),
            other => Err(Error::invalid(format!(
                "unknown oversize policy '{other}'; expected one of 'error', 'truncate', 'split', 'drop'"
            ))),
        }
    }
}

/// Validated packing options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackOptions {
    /// Token budget of one bin (after rounding each segment up to `pad_to_multiple_of`).
    pub max_tokens: u64,
    /// At most this many segments in one bin (`u64::MAX` when unlimited).
    pub max_seqs: u64,
    /// Each segment costs its length rounded up to a multiple of this.
    pub pad_to_multiple_of: u64,
    /// Policy for sequences longer than [`PackOptions::capacity`].
    pub oversize: Oversize,
    /// Assignment algorithm (ignored by padded batching, which always sorts by length).
    pub algorithm: Algorithm,
    /// Seed of every random choice.
    pub seed: u64,
}

impl PackOptions {
    /// Check and build options from the raw values a caller passes.
    ///
    /// Integers arrive signed so that a negative value from Python is reported as such
    /// instead of failing a conversion with an unhelpful message.
    pub fn new(
        max_tokens: i64,
        max_seqs: Option<i64>,
        pad_to_multiple_of: i64,
        oversize: &str,
        algorithm: &str,
        seed: u64,
    ) -> Result<Self> {
        if max_tokens <= 0 {
            return Err(Error::invalid(format!(
                "max_tokens must be positive, got {max_tokens}"
            )));
        }
        let max_tokens = max_tokens as u64;
        if max_tokens > MAX_TOKENS_LIMIT {
            return Err(Error::invalid(format!(
                "max_tokens={max_tokens} is larger than the supported maximum {MAX_TOKENS_LIMIT}"
            )));
        }
        let max_seqs = match max_seqs {
            None => u64::MAX,
            Some(n) if n < 1 => {
                return Err(Error::invalid(format!(
                    "max_seqs must be at least 1 (or None for no limit), got {n}"
                )))
            }
            Some(n) => n as u64,
        };
        if pad_to_multiple_of < 1 {
            return Err(Error::invalid(format!(
                "pad_to_multiple_of must be at least 1, got {pad_to_multiple_of}"
            )));
        }
        let pad_to_multiple_of = pad_to_multiple_of as u64;
        if pad_to_multiple_of > max_tokens {
            return Err(Error::invalid(format!(
                "pad_to_multiple_of={pad_to_multiple_of} is larger than max_tokens={max_tokens}: \
                 no non-empty sequence could fit"
            )));
        }
        Ok(Self {
            max_tokens,
            max_seqs,
            pad_to_multiple_of,
            oversize: oversize.parse()?,
            algorithm: algorithm.parse()?,
            seed,
        })
    }

    /// The longest segment that fits a bin: `max_tokens` rounded down to the multiple.
    pub fn capacity(&self) -> u64 {
        self.max_tokens / self.pad_to_multiple_of * self.pad_to_multiple_of
    }

    /// The budget cost of a segment of `length` tokens.
    #[inline]
    pub fn cost(&self, length: u64) -> u64 {
        if self.pad_to_multiple_of == 1 {
            length
        } else {
            length.div_ceil(self.pad_to_multiple_of) * self.pad_to_multiple_of
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(max_tokens: i64, k: i64) -> Result<PackOptions> {
        PackOptions::new(max_tokens, None, k, "error", "bfd", 0)
    }

    #[test]
    fn rejects_bad_values_with_named_parameter() {
        let msg = |r: Result<PackOptions>| r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg(opts(0, 1)).contains("max_tokens"));
        assert!(msg(opts(-3, 1)).contains("max_tokens"));
        assert!(msg(opts(8, 0)).contains("pad_to_multiple_of"));
        assert!(msg(opts(8, 16)).contains("pad_to_multiple_of"));
        assert!(msg(PackOptions::new(8, Some(0), 1, "error", "bfd", 0)).contains("max_seqs"));
        assert!(msg(PackOptions::new(8, None, 1, "error", "best", 0)).contains("algorithm"));
        assert!(msg(PackOptions::new(8, None, 1, "cut", "bfd", 0)).contains("oversize"));
        assert!(msg(opts(1 << 40, 1)).contains("maximum"));
    }

    #[test]
    fn capacity_and_cost_round_to_the_multiple() {
        let o = opts(10, 4).unwrap();
        assert_eq!(o.capacity(), 8);
        assert_eq!(o.cost(0), 0);
        assert_eq!(o.cost(1), 4);
        assert_eq!(o.cost(8), 8);
        assert_eq!(o.cost(9), 12);
    }
}

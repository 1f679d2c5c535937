//! Token mixtures: which sequences of which source go into every optimizer step, and the
//! deal of each step's sequences to the ranks.
//!
//! Several sources (web, code, math...) are trained on in target shares of *tokens*. A
//! pass composes optimizer steps one after the other ([`compose`]): step `k` starts after
//! `c_k` consumed tokens, its budget is the batch schedule's `batch_tokens_at(c_k)` and
//! each source fills `share_s(c_k) x budget` of it from its own stream, a fresh seeded
//! permutation of its sequences for every repetition. A source takes its next sequence
//! while that brings it closer to its quota, so its tokens in a step are within half of
//! its longest sequence of the quota. What a step holds depends on the sources, the
//! shares, the batch schedule and `(seed, epoch)` only, not on the number of ranks.
//!
//! Each step's sequences (sources mixed) are then packed and dealt to the ranks like any
//! packing ([`plan`]): every rank runs the same number of micro-batches in every step.
//! Steps are packed and dealt in parallel, each from its own seed, so the plan is the
//! same on every rank and at any thread count.

mod assemble;
mod compose;
mod shares;
mod shuffle;
#[cfg(test)]
mod tests;

use std::str::FromStr;

use crate::error::{Error, Result};

pub use assemble::{plan, MixturePlan};
pub use compose::{compose, Composition, StepTake};
pub use shares::{Interpolation, ShareSchedule};

/// What a pass does when a source has used up its repetitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exhausted {
    /// The pass ends with that step (shrunk so that the shares still hold).
    Stop,
    /// The source leaves the mixture and the other sources' shares are scaled up to sum
    /// to 1; the pass ends when every source with a share has run out.
    Renormalize,
}

impl Exhausted {
    /// The name Python uses.
    pub fn name(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Renormalize => "renormalize",
        }
    }
}

impl FromStr for Exhausted {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        match name {
            "stop" => Ok(Self::Stop),
            "renormalize" => Ok(Self::Renormalize),
            other => Err(Error::invalid(format!(
                "exhausted must be 'stop' or 'renormalize', got '{other}'"
            ))),
        }
    }
}

/// Named sources, their sequence lengths, and how they mix.
#[derive(Debug, Clone, PartialEq)]
pub struct Mixture {
    names: Vec<String>,
    /// Lengths of every source, concatenated in source order.
    lengths: Vec<i64>,
    /// `n_sources + 1` offsets into `lengths`: source `s` holds the sequences (and global
    /// indices) `offsets[s]..offsets[s + 1]`.
    offsets: Vec<usize>,
    max_repetition: Vec<u64>,
    shares: ShareSchedule,
    exhausted: Exhausted,
}

impl Mixture {
    /// Check and build a mixture. `sizes[s]` sequences of `lengths` belong to source `s`
    /// (named `names[s]`), which may be used at most `max_repetition[s]` times per pass.
    pub fn new(
        names: Vec<String>,
        lengths: Vec<i64>,
        sizes: &[i64],
        max_repetition: &[i64],
        shares: ShareSchedule,
        exhausted: Exhausted,
    ) -> Result<Self> {
        let n_sources = names.len();
        if sizes.len() != n_sources
            || max_repetition.len() != n_sources
            || shares.n_sources() != n_sources
        {
            return Err(Error::invalid(format!(
                "a mixture of {n_sources} sources needs {n_sources} sizes, repetition caps \
                 and shares per change point"
            )));
        }
        let mut offsets = Vec::with_capacity(n_sources + 1);
        offsets.push(0usize);
        for (name, &size) in names.iter().zip(sizes) {
            if size <= 0 {
                return Err(Error::invalid(format!(
                    "source '{name}' has no sequences; a mixture needs at least one in every \
                     source"
                )));
            }
            if size >= i64::from(u32::MAX) {
                return Err(Error::overflow(format!(
                    "source '{name}' has {size} sequences, more than the supported {}",
                    u32::MAX - 1
                )));
            }
            offsets.push(offsets[offsets.len() - 1] + size as usize);
        }
        if offsets[n_sources] != lengths.len() {
            return Err(Error::invalid(format!(
                "the sources' sizes sum to {} but {} lengths were given",
                offsets[n_sources],
                lengths.len()
            )));
        }
        if let Some(index) = lengths.iter().position(|&l| l < 0) {
            return Err(Error::invalid(format!(
                "lengths must be non-negative, got {} at index {index}",
                lengths[index]
            )));
        }
        let mut caps = Vec::with_capacity(n_sources);
        for (name, &cap) in names.iter().zip(max_repetition) {
            if cap < 1 {
                return Err(Error::invalid(format!(
                    "max_repetition of source '{name}' must be at least 1, got {cap}"
                )));
            }
            caps.push(cap as u64);
        }
        let mixture = Self {
            names,
            lengths,
            offsets,
            max_repetition: caps,
            shares,
            exhausted,
        };
        if let Some(s) = (0..n_sources).find(|&s| mixture.source_lengths(s).iter().all(|&l| l == 0))
        {
            return Err(Error::invalid(format!(
                "source '{}' has no tokens (every sequence is empty)",
                mixture.names[s]
            )));
        }
        Ok(mixture)
    }

    /// Source names.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Number of sources.
    pub fn n_sources(&self) -> usize {
        self.names.len()
    }

    /// Lengths of every source, concatenated.
    pub fn lengths(&self) -> &[i64] {
        &self.lengths
    }

    /// `n_sources + 1` offsets of the sources in [`Mixture::lengths`].
    pub fn offsets(&self) -> &[usize] {
        &self.offsets
    }

    /// Lengths of source `s`.
    pub fn source_lengths(&self, s: usize) -> &[i64] {
        &self.lengths[self.offsets[s]..self.offsets[s + 1]]
    }

    /// Repetition cap of every source.
    pub fn max_repetition(&self) -> &[u64] {
        &self.max_repetition
    }

    /// Target shares over consumed tokens.
    pub fn shares(&self) -> &ShareSchedule {
        &self.shares
    }

    /// What happens when a source runs out.
    pub fn exhausted(&self) -> Exhausted {
        self.exhausted
    }

    /// The source of global sequence index `index`.
    pub fn source_of(&self, index: usize) -> usize {
        self.offsets.partition_point(|&o| o <= index) - 1
    }
}

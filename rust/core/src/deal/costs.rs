//! What a bin costs on a rank.
//!
//! Every cost is computed on padded lengths: with `pad_to_multiple_of = k` a segment of `L`
//! tokens occupies `ceil(L / k) * k` slots, and a kernel that needs the padding (context
//! parallelism pads every document to a multiple of `2 * cp`) also spends attention time
//! on it, so the segment's attention cost is its padded length squared.

use std::str::FromStr;

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::packing::PackingKind;

/// A cost a deal can balance or report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CostKind {
    /// Tokens the linear layers process, padding included.
    Tokens,
    /// Sum of squared attention spans (padded lengths).
    Attention,
    /// Tokens + attention / (12 hidden_size).
    Flops,
}

impl FromStr for CostKind {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        match name {
            "tokens" => Ok(Self::Tokens),
            "attention" => Ok(Self::Attention),
            "flops" => Ok(Self::Flops),
            other => Err(Error::invalid(format!(
                "kind must be 'tokens', 'attention' or 'flops', got '{other}'"
            ))),
        }
    }
}

impl CostKind {
    /// The name used in statistics keys.
    pub fn name(self) -> &'static str {
        match self {
            Self::Tokens => "tokens",
            Self::Attention => "attention",
            Self::Flops => "flops",
        }
    }
}

/// Costs of one bin.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BinCost {
    /// Tokens processed: padded lengths summed, or `count x longest` for padded batches.
    pub tokens: u64,
    /// Sum of squared padded lengths, or `count x longest^2` for padded batches.
    pub attention: u64,
    /// Real (non-padding) tokens.
    pub real: u64,
}

impl BinCost {
    /// The cost of `kind` (`per_attention`: FLOPs per unit of attention, for `Flops`).
    pub fn of(self, kind: CostKind, per_attention: Option<f64>) -> f64 {
        match kind {
            CostKind::Tokens => self.tokens as f64,
            CostKind::Attention => self.attention as f64,
            CostKind::Flops => {
                self.tokens as f64 + self.attention as f64 * per_attention.unwrap_or(0.0)
            }
        }
    }

    /// A key whose order is the order of the cost of `kind`: the integer itself, or the bits
    /// of a non-negative float (which order like the float).
    pub fn key(self, kind: CostKind, per_attention: Option<f64>) -> u64 {
        match kind {
            CostKind::Tokens => self.tokens,
            CostKind::Attention => self.attention,
            CostKind::Flops => self.of(kind, per_attention).to_bits(),
        }
    }
}

/// Bins per parallel task.
const CHUNK: usize = 1 << 12;

/// Costs of the bins `offsets` cuts `lengths` into.
pub fn bin_costs(
    offsets: &[i64],
    lengths: &[i64],
    kind: PackingKind,
    multiple: u64,
) -> Vec<BinCost> {
    let padded = |length: i64| {
        let length = length as u64;
        if multiple == 1 {
            length
        } else {
            length.div_ceil(multiple).saturating_mul(multiple)
        }
    };
    let one = |window: &[i64]| {
        let segment = &lengths[window[0] as usize..window[1] as usize];
        let real = segment.iter().map(|&l| l as u64).sum();
        match kind {
            PackingKind::Packed => {
                let (tokens, attention) = segment.iter().fold((0u64, 0u64), |(t, a), &l| {
                    let p = padded(l);
                    (t.saturating_add(p), a.saturating_add(p.saturating_mul(p)))
                });
                BinCost {
                    tokens,
                    attention,
                    real,
                }
            }
            PackingKind::Padded => {
                let longest = segment.iter().map(|&l| padded(l)).max().unwrap_or(0);
                let tokens = longest.saturating_mul(segment.len() as u64);
                BinCost {
                    tokens,
                    attention: tokens.saturating_mul(longest),
                    real,
                }
            }
        }
    };
    let mut costs = Vec::with_capacity(offsets.len().saturating_sub(1));
    offsets
        .par_windows(2)
        .with_min_len(CHUNK)
        .map(one)
        .collect_into_vec(&mut costs);
    costs
}

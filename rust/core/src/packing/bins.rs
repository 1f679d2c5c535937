//! A packing together with what its summary and its deals need to know: the budget, the
//! number of input sequences, how its bins were formed; and the check of a packing rebuilt
//! from outside.

use std::str::FromStr;
use std::sync::Arc;

use super::{PackOptions, Packing};
use crate::buffers::with_capacity_huge;
use crate::error::{Error, Result};

/// How the bins of a packing were formed, which decides what a bin costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackingKind {
    /// Segments concatenated: a bin costs the sum of its (padded) segment lengths.
    Packed,
    /// Segments padded to the longest of their bin: a bin costs `count x longest`.
    Padded,
}

impl PackingKind {
    /// The name Python uses (`"packed"` or `"padded"`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Packed => "packed",
            Self::Padded => "padded",
        }
    }
}

impl FromStr for PackingKind {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        match name {
            "packed" => Ok(Self::Packed),
            "padded" => Ok(Self::Padded),
            other => Err(Error::invalid(format!(
                "kind must be 'packed' or 'padded', got '{other}'"
            ))),
        }
    }
}

/// A packing together with what its summary and its deals need to know about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bins {
    /// The CSR arrays and the oversize policy's counts.
    pub packing: Packing,
    /// The token budget of one bin.
    pub max_tokens: u64,
    /// Number of input sequences (segment indices are below it).
    pub n_seqs: u64,
    /// How bins were formed.
    pub kind: PackingKind,
    /// Fewest bins any packing of these segments could use.
    pub lower_bound: u64,
    /// The atomic-group id of every input sequence, when the packing was made with groups:
    /// the deals cut bins only between groups.
    pub group_ids: Option<Arc<Vec<i64>>>,
}

impl Bins {
    /// The bins of a packing made by [`crate::packing::pack`] or
    /// [`crate::packing::batch_padded`] with `options` from `n_seqs` sequences.
    pub fn new(packing: Packing, options: &PackOptions, n_seqs: usize, kind: PackingKind) -> Self {
        let lower_bound = packing.lower_bound(options);
        Self {
            packing,
            max_tokens: options.max_tokens,
            n_seqs: n_seqs as u64,
            kind,
            lower_bound,
            group_ids: None,
        }
    }

    /// These bins with the group id of every input sequence, so that no deal cuts a group.
    pub fn with_group_ids(self, group_ids: &[i64]) -> Self {
        // A copy into huge pages: 10M ids fault in 40 pages instead of 20,000.
        let mut ids = with_capacity_huge(group_ids.len());
        ids.extend_from_slice(group_ids);
        Self {
            group_ids: Some(Arc::new(ids)),
            ..self
        }
    }

    /// Whether a bin may be cut just before segment position `j` (`j >= 1`): always,
    /// unless segments `j - 1` and `j` belong to one group.
    pub fn may_cut_before(&self, j: usize) -> bool {
        let indices = &self.packing.indices;
        self.group_ids
            .as_ref()
            .is_none_or(|ids| ids[indices[j - 1] as usize] != ids[indices[j] as usize])
    }

    /// Check that the arrays form a packing (for bins rebuilt from outside, e.g. unpickled):
    /// offsets from 0 to the segment count, never decreasing; segments of known sequences,
    /// each token placed once; no bin over the budget.
    pub fn validate(&self) -> Result<()> {
        if self.max_tokens == 0 {
            return Err(Error::invalid("max_tokens must be at least 1, got 0"));
        }
        if let Some(ids) = &self.group_ids {
            if ids.len() as u64 != self.n_seqs {
                return Err(Error::invalid(format!(
                    "a packing of {} sequences needs one group id per sequence, got {}",
                    self.n_seqs,
                    ids.len()
                )));
            }
        }
        let p = &self.packing;
        let n = p.indices.len();
        if p.starts.as_ref().is_some_and(|starts| starts.len() != n) || p.lengths.len() != n {
            return Err(Error::invalid(
                "indices, starts and lengths of a packing must have the same length",
            ));
        }
        if p.bin_offsets.first() != Some(&0)
            || p.bin_offsets.last().map(|&o| o as usize) != Some(n)
            || p.bin_offsets.windows(2).any(|w| w[0] > w[1])
        {
            return Err(Error::invalid(
                "bin_offsets must rise from 0 to the number of segments",
            ));
        }
        if p.bin_tokens.len() + 1 != p.bin_offsets.len() {
            return Err(Error::invalid("bin_tokens must hold one cost per bin"));
        }
        let bad_segment = (0..n).find(|&j| {
            p.indices[j] < 0
                || p.indices[j] as u64 >= self.n_seqs
                || p.start(j) < 0
                || p.lengths[j] < 0
                || p.lengths[j] as u64 > self.max_tokens
        });
        if let Some(j) = bad_segment {
            return Err(Error::invalid(format!(
                "segment {j} (index {}, start {}, length {}) is not a segment of one of \
                 {} sequences within max_tokens={}",
                p.indices[j],
                p.start(j),
                p.lengths[j],
                self.n_seqs,
                self.max_tokens
            )));
        }
        // Each segment fits the budget, and so must each bin (padding only adds to it).
        let over_budget = p.bin_offsets.windows(2).enumerate().find_map(|(bin, w)| {
            let tokens: u128 = p.lengths[w[0] as usize..w[1] as usize]
                .iter()
                .map(|&l| l as u128)
                .sum();
            (tokens > u128::from(self.max_tokens)).then_some((bin, tokens))
        });
        if let Some((bin, tokens)) = over_budget {
            return Err(Error::invalid(format!(
                "bin {bin} holds {tokens} tokens, more than max_tokens={}",
                self.max_tokens
            )));
        }
        if let Some((a, b)) = overlapping_segments(p, self.n_seqs) {
            return Err(Error::invalid(format!(
                "segments {a} and {b} both hold tokens of sequence {} (a packing places \
                 each token once)",
                p.indices[a]
            )));
        }
        Ok(())
    }

    /// Number of bins.
    pub fn n_bins(&self) -> usize {
        self.packing.n_bins()
    }

    /// Real (non-padding) tokens placed in bins.
    pub fn total_tokens(&self) -> u64 {
        self.packing.lengths.iter().map(|&l| l as u64).sum()
    }
}

/// Two non-empty segments of a packing (whose indices are below `n_seqs`) that hold the
/// same token of a sequence, if any: sorted by sequence and start, each segment of a
/// sequence must end where the next one starts or before. Only sequences with two segments
/// or more are sorted (a bit per sequence finds them in one pass), so checking a packing
/// that split few sequences costs two passes, not a sort of every segment.
fn overlapping_segments(p: &Packing, n_seqs: u64) -> Option<(usize, usize)> {
    let nonempty = || (0..p.indices.len()).filter(|&j| p.lengths[j] > 0);
    let word_bit = |j: usize| {
        let sequence = p.indices[j] as usize;
        (sequence / 64, 1u64 << (sequence % 64))
    };
    let mut candidates: Vec<usize> = if n_seqs <= 64 * (p.indices.len() as u64 + 1) {
        let words = n_seqs.div_ceil(64) as usize;
        let (mut seen, mut repeated) = (vec![0u64; words], vec![0u64; words]);
        for j in nonempty() {
            let (word, bit) = word_bit(j);
            repeated[word] |= seen[word] & bit;
            seen[word] |= bit;
        }
        nonempty()
            .filter(|&j| {
                let (word, bit) = word_bit(j);
                repeated[word] & bit != 0
            })
            .collect()
    } else {
        nonempty().collect()
    };
    candidates.sort_unstable_by_key(|&j| (p.indices[j], p.start(j), j));
    candidates
        .windows(2)
        .find(|w| {
            let (a, b) = (w[0], w[1]);
            p.indices[a] == p.indices[b]
                && i128::from(p.start(a)) + i128::from(p.lengths[a]) > i128::from(p.start(b))
        })
        .map(|w| (w[0].min(w[1]), w[0].max(w[1])))
}

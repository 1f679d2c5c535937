//! Token-budget packing: sequences into bins whose total cost stays within `max_tokens`.
//!
//! The result is a CSR layout over segments (see [`Packing`]): bin `i` holds segments
//! `bin_offsets[i]..bin_offsets[i + 1]`, each an input sequence index, a token offset
//! inside it and a length. The same layout serves packing, padded batching and split
//! sequences, and moves to numpy without copies.
//!
//! Zero-length sequences are placed like any other: they cost no tokens but take one of a
//! bin's `max_seqs` slots, so every input index still appears exactly once.

mod assign;
mod capacity_index;
mod options;
mod order;
mod segments;

pub use options::{Algorithm, Oversize, PackOptions, MAX_TOKENS_LIMIT};
pub use segments::{Length, PolicyCounts};

use crate::error::Result;
use assign::Assignment;
use segments::Segments;

/// A packing in CSR form. All arrays are `i64` so they map one-to-one onto numpy int64.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packing {
    /// `n_bins + 1` offsets into the segment arrays.
    pub bin_offsets: Vec<i64>,
    /// Input sequence of each segment.
    pub indices: Vec<i64>,
    /// Token offset of each segment inside its sequence (0 unless split).
    pub starts: Vec<i64>,
    /// Tokens of each segment.
    pub lengths: Vec<i64>,
    /// Budget cost of each bin: tokens rounded up to the multiple, or `count x longest`
    /// for padded batching. Never above `max_tokens`.
    pub bin_tokens: Vec<i64>,
    /// What the oversize policy did.
    pub counts: PolicyCounts,
    /// Sum over segments of their individual costs (for the lower bound).
    pub segment_cost: u64,
}

impl Packing {
    /// Number of bins.
    pub fn n_bins(&self) -> usize {
        self.bin_offsets.len().saturating_sub(1)
    }

    /// Fewest bins any packing could use: every bin holds at most `max_tokens` of cost and
    /// at most `max_seqs` segments.
    pub fn lower_bound(&self, options: &PackOptions) -> u64 {
        let by_tokens = self.segment_cost.div_ceil(options.max_tokens);
        let by_count = (self.indices.len() as u64).div_ceil(options.max_seqs);
        by_tokens.max(by_count)
    }
}

/// Pack `lengths` into bins of at most `options.max_tokens` cost.
pub fn pack<L: Length>(lengths: &[L], options: &PackOptions) -> Result<Packing> {
    let segments = segments::segment(lengths, options)?;
    let assignment_order = match options.algorithm {
        Algorithm::BestFitDecreasing | Algorithm::FirstFitDecreasing => {
            order::decreasing_cost(&segments, options)
        }
        Algorithm::NextFit => order::input_order(&segments),
        Algorithm::FirstFitShuffled => order::shuffled(&segments, options.seed),
    };
    let assignment = match options.algorithm {
        Algorithm::BestFitDecreasing => assign::best_fit(&segments, &assignment_order, options),
        Algorithm::FirstFitDecreasing | Algorithm::FirstFitShuffled => {
            assign::first_fit(&segments, &assignment_order, options)
        }
        Algorithm::NextFit => assign::next_fit(&segments, &assignment_order, options),
    };
    Ok(layout(
        segments,
        &assignment_order,
        &assignment,
        options,
        None,
    ))
}

/// Padded token-budget batching: a batch of `n` segments costs `n x` its longest cost.
/// Segments are sorted by decreasing length so that batch-mates have similar lengths.
pub fn batch_padded<L: Length>(lengths: &[L], options: &PackOptions) -> Result<Packing> {
    let segments = segments::segment(lengths, options)?;
    let assignment_order = order::decreasing_cost(&segments, options);
    let (assignment, batch_cost) = assign::padded(&segments, &assignment_order, options);
    Ok(layout(
        segments,
        &assignment_order,
        &assignment,
        options,
        Some(batch_cost),
    ))
}

/// Build the CSR arrays: bins in creation order, segments in assignment order inside a bin.
fn layout(
    segments: Segments,
    order: &[u32],
    assignment: &Assignment,
    options: &PackOptions,
    padded_cost: Option<Vec<u64>>,
) -> Packing {
    let n_bins = assignment.n_bins;
    let mut bin_offsets = vec![0i64; n_bins + 1];
    for &bin in &assignment.bin_of {
        bin_offsets[bin as usize + 1] += 1;
    }
    for i in 0..n_bins {
        bin_offsets[i + 1] += bin_offsets[i];
    }
    let n = order.len();
    let mut cursor: Vec<i64> = bin_offsets[..n_bins].to_vec();
    let mut indices = vec![0i64; n];
    let mut lengths = vec![0i64; n];
    let mut starts = vec![0i64; n];
    let mut bin_tokens = vec![0i64; n_bins];
    let mut segment_cost = 0u64;
    for (&id, &bin) in order.iter().zip(&assignment.bin_of) {
        let id = id as usize;
        let slot = &mut cursor[bin as usize];
        let position = *slot as usize;
        *slot += 1;
        let length = u64::from(segments.lengths[id]);
        indices[position] = i64::from(segments.sequence_of(id));
        lengths[position] = length as i64;
        starts[position] = segments.start_of(id) as i64;
        let cost = options.cost(length);
        segment_cost += cost;
        bin_tokens[bin as usize] += cost as i64;
    }
    if let Some(padded_cost) = padded_cost {
        for (tokens, cost) in bin_tokens.iter_mut().zip(padded_cost) {
            *tokens = cost as i64;
        }
    }
    Packing {
        bin_offsets,
        indices,
        starts,
        lengths,
        bin_tokens,
        counts: segments.counts,
        segment_cost,
    }
}

#[cfg(test)]
mod tests;

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
mod bins;
mod capacity_index;
mod columns;
mod grouped;
mod layout;
mod options;
mod order;
mod segments;
pub mod stream;
mod units;

pub use bins::{Bins, PackingKind};
pub use grouped::{batch_padded_grouped, pack_costs, pack_grouped, CostOptions, MAX_COST_COLUMNS};
pub use options::{Algorithm, Oversize, PackOptions, MAX_TOKENS_LIMIT};
pub use segments::{pieces, Length, PolicyCounts};

use crate::error::Result;
use assign::Assignment;
use order::OfferOrder;
use segments::Segments;

/// A packing in CSR form. All arrays are `i64` so they map one-to-one onto numpy int64.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packing {
    /// `n_bins + 1` offsets into the segment arrays.
    pub bin_offsets: Vec<i64>,
    /// Input sequence of each segment.
    pub indices: Vec<i64>,
    /// Token offset of each segment inside its sequence; `None` when no sequence was split
    /// (every offset is 0).
    pub starts: Option<Vec<i64>>,
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

    /// Token offset of segment `j` inside its sequence.
    pub fn start(&self, j: usize) -> i64 {
        self.starts.as_ref().map_or(0, |starts| starts[j])
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
    let order = offer_order(&segments, options);
    let (assignment, outputs) =
        with_outputs(segments.output_shape(), || order.assign(&segments, options));
    Ok(finish(segments, &order, assignment, options, None, outputs))
}

/// The order in which `options.algorithm` offers the segments.
fn offer_order(segments: &Segments, options: &PackOptions) -> OfferOrder {
    match options.algorithm {
        Algorithm::BestFitDecreasing | Algorithm::FirstFitDecreasing => {
            OfferOrder::decreasing_cost(segments, options)
        }
        Algorithm::NextFit => OfferOrder::Input,
        Algorithm::FirstFitShuffled => OfferOrder::shuffled(segments, options.seed),
    }
}

/// The bin of each of `lengths` (by index) under `options`, which must keep every
/// sequence whole, and what each bin holds.
fn bins_by_index<L: Length>(
    lengths: &[L],
    options: &PackOptions,
) -> Result<(Vec<u32>, assign::BinTotals)> {
    let segments = segments::segment(lengths, options)?;
    let order = offer_order(&segments, options);
    let assignment = order.assign(&segments, options);
    let bins = order.segment_bins(&segments, options, assignment.bin_of);
    Ok((bins.into_listed(), assignment.bins))
}

/// Padded token-budget batching: a batch of `n` segments costs `n x` its longest cost.
/// Segments are sorted by decreasing length so that batch-mates have similar lengths.
pub fn batch_padded<L: Length>(lengths: &[L], options: &PackOptions) -> Result<Packing> {
    let segments = segments::segment(lengths, options)?;
    let order = OfferOrder::decreasing_cost(&segments, options);
    let ((assignment, batch_cost), outputs) = with_outputs(segments.output_shape(), || {
        order.assign_padded(&segments, options)
    });
    Ok(finish(
        segments,
        &order,
        assignment,
        options,
        Some(batch_cost),
        outputs,
    ))
}

/// Run `assign` (one core's work) and meanwhile, on another core of the pool, make the
/// layout's zeroed outputs, page faults included. With one thread, or outputs too small
/// for their page faults to matter, the outputs are made after and mapped as the layout
/// writes them.
///
/// Kept because it pays: a build that makes the outputs after spends 17-25% more CPU time
/// on warm `pack` and `batch_padded` of 1M lengths (benches/RESULTS.md, low-level tricks).
/// The outputs have `shape` (see [`Segments::output_shape`]).
fn with_outputs<A: Send>(
    shape: (usize, bool),
    assign: impl FnOnce() -> A + Send,
) -> (A, layout::OutputBuffers) {
    if shape.0 < OUTPUTS_ALONGSIDE_MIN || rayon::current_num_threads() < 2 {
        let assignment = assign();
        return (assignment, layout::OutputBuffers::zeroed(shape, false));
    }
    rayon::join(assign, || layout::OutputBuffers::zeroed(shape, true))
}

/// Fewest segments whose outputs (16 bytes each, 1 MiB here) are made alongside the
/// assignment: below, waking another thread costs about what the page faults do.
const OUTPUTS_ALONGSIDE_MIN: usize = 1 << 16;

/// Lay out an assignment (a bin per offer position) as CSR arrays.
fn finish(
    segments: Segments,
    order: &OfferOrder,
    assignment: Assignment,
    options: &PackOptions,
    padded_cost: Option<Vec<u64>>,
    outputs: layout::OutputBuffers,
) -> Packing {
    let bins = order.segment_bins(&segments, options, assignment.bin_of);
    layout::build(
        &segments,
        bins,
        assignment.bins,
        options,
        padded_cost,
        outputs,
    )
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod units_tests;

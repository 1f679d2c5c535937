//! Building the CSR arrays from a bin per segment.
//!
//! Inside a bin, segments appear in input order (by sequence index, then token offset).
//!
//! With millions of segments the output is written through cache-sized buckets: a first
//! pass appends each segment (its output slot, sequence and length) to the bucket of
//! 32,768 output slots it falls in, streaming; a second pass replays each bucket into
//! its slice of the outputs, which then stays in the L2 cache. Two streaming passes beat
//! one pass of scattered writes into 80 MB arrays by a wide margin.

use super::options::PackOptions;
use super::segments::Segments;
use super::Packing;
use crate::buffers::zeroed_vec;

const BUCKET_SHIFT: u32 = 15;

/// A segment on its way to the outputs: `[output slot, sequence, length]`.
type Staged = [u32; 3];

/// The packing of `segments` into `n_bins` bins, segment `i` going to `bin_of_segment[i]`.
pub fn build(
    mut segments: Segments,
    bin_of_segment: Vec<u32>,
    n_bins: usize,
    options: &PackOptions,
    padded_cost: Option<Vec<u64>>,
) -> Packing {
    let n = segments.len();
    let mut bin_offsets = vec![0i64; n_bins + 1];
    for &bin in &bin_of_segment {
        bin_offsets[bin as usize + 1] += 1;
    }
    for i in 0..n_bins {
        bin_offsets[i + 1] += bin_offsets[i];
    }

    // Pass 1: output slot of every segment, appended to its bucket. Every bucket but the
    // last receives exactly 2^BUCKET_SHIFT segments (slots are a permutation of 0..n).
    let mut staged = zeroed_vec!(Staged, n);
    let mut staged_starts = vec![0u64; if segments.starts.is_some() { n } else { 0 }];
    let mut bucket_next: Vec<usize> = (0..n.div_ceil(1 << BUCKET_SHIFT))
        .map(|b| b << BUCKET_SHIFT)
        .collect();
    let mut cursor: Vec<u32> = bin_offsets[..n_bins].iter().map(|&o| o as u32).collect();
    for (id, &bin) in bin_of_segment.iter().enumerate() {
        let next_slot = &mut cursor[bin as usize];
        let slot = *next_slot;
        *next_slot += 1;
        let position = &mut bucket_next[(slot >> BUCKET_SHIFT) as usize];
        staged[*position] = [slot, segments.sequence_of(id), segments.lengths[id]];
        if let Some(starts) = &segments.starts {
            staged_starts[*position] = starts[id];
        }
        *position += 1;
    }
    // Free what pass 2 does not read before it allocates the outputs: this keeps peak
    // working memory near 12 bytes per segment beyond the outputs.
    drop(cursor);
    drop(bin_of_segment);
    segments.lengths = Vec::new();
    segments.sequence = None;
    segments.starts = None;

    // Pass 2: each bucket writes only inside its own 32,768-slot window.
    let mut indices = zeroed_vec!(i64, n);
    let mut lengths = zeroed_vec!(i64, n);
    // Zeroed allocations are mapped lazily: `starts` costs nothing unless something split.
    let mut starts = vec![0i64; n];
    for (position, &[slot, sequence, length]) in staged.iter().enumerate() {
        let slot = slot as usize;
        indices[slot] = i64::from(sequence);
        lengths[slot] = i64::from(length);
        if let Some(&start) = staged_starts.get(position) {
            starts[slot] = start as i64;
        }
    }
    drop(staged);

    let mut bin_tokens: Vec<i64> = bin_offsets
        .windows(2)
        .map(|w| {
            lengths[w[0] as usize..w[1] as usize]
                .iter()
                .map(|&length| options.cost(length as u64) as i64)
                .sum()
        })
        .collect();
    let segment_cost = bin_tokens.iter().map(|&t| t as u64).sum();
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

//! Building the CSR arrays from a bin per segment.
//!
//! Inside a bin, segments appear in input order (by sequence index, then token offset).
//!
//! Up to about a million segments the outputs fit the last-level cache and each segment
//! is written straight to its slot. Beyond that the output is written through cache-sized
//! buckets: a first
//! pass appends each segment (its output slot, sequence and length) to the bucket of
//! 32,768 output slots it falls in, streaming; a second pass replays each bucket into
//! its slice of the outputs, which then stays in the L2 cache. Two streaming passes beat
//! one pass of scattered writes into 80 MB arrays by a wide margin.

use super::options::PackOptions;
use super::segments::Segments;
use super::Packing;
use rayon::prelude::*;

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

    let counts = std::mem::take(&mut segments.counts);
    let (indices, lengths, starts) = if n <= DIRECT_SCATTER_MAX {
        scatter_direct(&segments, &bin_of_segment, &bin_offsets)
    } else {
        scatter_bucketed(segments, bin_of_segment, &bin_offsets)
    };

    let mut bin_tokens: Vec<i64> = bin_offsets
        .par_windows(2)
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
        counts,
        segment_cost,
    }
}

/// Outputs up to this many segments (16 bytes each) stay in the last-level cache, where
/// scattered writes are cheap and staging would only cost an extra buffer.
const DIRECT_SCATTER_MAX: usize = 1 << 20;

type Outputs = (Vec<i64>, Vec<i64>, Vec<i64>);

/// Next free slot of every bin.
fn cursor_at_bin_starts(bin_offsets: &[i64]) -> Vec<u32> {
    bin_offsets[..bin_offsets.len() - 1]
        .iter()
        .map(|&o| o as u32)
        .collect()
}

/// One pass: each segment written straight to its slot.
fn scatter_direct(segments: &Segments, bin_of_segment: &[u32], bin_offsets: &[i64]) -> Outputs {
    let n = segments.len();
    let mut indices = zeroed_vec!(i64, n);
    let mut lengths = zeroed_vec!(i64, n);
    let mut starts = vec![0i64; n]; // lazily mapped: touched only if something split
    let mut cursor = cursor_at_bin_starts(bin_offsets);
    for (id, &bin) in bin_of_segment.iter().enumerate() {
        let next_slot = &mut cursor[bin as usize];
        let slot = *next_slot as usize;
        *next_slot += 1;
        indices[slot] = i64::from(segments.sequence_of(id));
        lengths[slot] = i64::from(segments.lengths[id]);
        if let Some(segment_starts) = &segments.starts {
            starts[slot] = segment_starts[id] as i64;
        }
    }
    (indices, lengths, starts)
}

/// Two streaming passes through cache-sized buckets (see the module docs).
fn scatter_bucketed(segments: Segments, bin_of_segment: Vec<u32>, bin_offsets: &[i64]) -> Outputs {
    let n = segments.len();
    // Pass 1: output slot of every segment, appended to its bucket. Every bucket but the
    // last receives exactly 2^BUCKET_SHIFT segments (slots are a permutation of 0..n).
    let mut staged = zeroed_vec!(Staged, n);
    let mut staged_starts = vec![0u64; if segments.starts.is_some() { n } else { 0 }];
    let mut bucket_next: Vec<usize> = (0..n.div_ceil(1 << BUCKET_SHIFT))
        .map(|b| b << BUCKET_SHIFT)
        .collect();
    let mut cursor = cursor_at_bin_starts(bin_offsets);
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
    drop(segments);

    // Pass 2: bucket `b` holds exactly the segments of output window `b`, so windows fill
    // independently, in parallel, each staying in its core's cache.
    const WINDOW: usize = 1 << BUCKET_SHIFT;
    let mut indices = zeroed_vec!(i64, n);
    let mut lengths = zeroed_vec!(i64, n);
    // Zeroed allocations are mapped lazily: `starts` costs nothing unless something split.
    let mut starts = vec![0i64; n];
    indices
        .par_chunks_mut(WINDOW)
        .zip(lengths.par_chunks_mut(WINDOW))
        .zip(staged.par_chunks(WINDOW))
        .enumerate()
        .for_each(|(window, ((indices, lengths), staged))| {
            let base = window * WINDOW;
            for &[slot, sequence, length] in staged {
                let local = slot as usize - base;
                indices[local] = i64::from(sequence);
                lengths[local] = i64::from(length);
            }
        });
    if !staged_starts.is_empty() {
        for (&[slot, ..], &start) in staged.iter().zip(&staged_starts) {
            starts[slot as usize] = start as i64;
        }
    }
    drop(staged);
    (indices, lengths, starts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packing::segments::PolicyCounts;
    use crate::rng::SplitMix64;

    fn random_segments(n: usize, with_starts: bool) -> (Segments, Vec<u32>, Vec<i64>) {
        let mut rng = SplitMix64::new(11);
        let n_bins = n / 5 + 1;
        let bin_of: Vec<u32> = (0..n).map(|_| rng.below(n_bins as u64) as u32).collect();
        let mut offsets = vec![0i64; n_bins + 1];
        for &bin in &bin_of {
            offsets[bin as usize + 1] += 1;
        }
        for i in 0..n_bins {
            offsets[i + 1] += offsets[i];
        }
        let segments = Segments {
            lengths: (0..n).map(|_| rng.below(4096) as u32).collect(),
            sequence: Some((0..n as u32).map(|i| i / 2).collect()),
            starts: with_starts.then(|| (0..n as u64).map(|i| i % 7).collect()),
            counts: PolicyCounts::default(),
        };
        (segments, bin_of, offsets)
    }

    #[test]
    fn bucketed_and_direct_scatter_agree() {
        for with_starts in [false, true] {
            // Several buckets, the last one partial.
            let (segments, bin_of, offsets) =
                random_segments(3 * (1 << BUCKET_SHIFT) + 123, with_starts);
            let direct = scatter_direct(&segments, &bin_of, &offsets);
            let bucketed = scatter_bucketed(segments, bin_of, &offsets);
            assert_eq!(direct, bucketed);
        }
    }
}

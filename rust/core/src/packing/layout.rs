//! Building the CSR arrays from a bin per segment.
//!
//! Inside a bin, segments appear in input order (by sequence index, then token offset).
//!
//! Up to about a million segments the outputs fit the last-level cache and each segment
//! is written straight to its slot. Beyond that the output is written through cache-sized
//! buckets: a first pass appends each segment (its output slot, sequence and length) to
//! the bucket of 32,768 output slots it falls in, streaming; a second pass replays each
//! bucket into its slice of the outputs, which then stays in the L2 cache. Two streaming
//! passes beat one pass of scattered writes into 80 MB arrays by a wide margin. The
//! buckets wait in the outputs themselves, so the layout needs no memory beyond them.

use super::options::PackOptions;
use super::segments::Segments;
use super::Packing;
use rayon::prelude::*;

use crate::buffers::zeroed_vec;

/// Output slots per bucket of the bucketed layout: 32,768 (three 256 KB windows of the
/// outputs fit a core's L2 cache).
const WINDOW: usize = 1 << 15;

/// The packing of `segments` into `n_bins` bins, segment `i` going to `bin_of_segment[i]`.
pub fn build(
    mut segments: Segments,
    bin_of_segment: Vec<u32>,
    n_bins: usize,
    options: &PackOptions,
    padded_cost: Option<Vec<u64>>,
) -> Packing {
    let n = segments.len();
    let counts = std::mem::take(&mut segments.counts);
    let (bin_offsets, (indices, lengths, starts)) = if n <= DIRECT_SCATTER_MAX {
        let bin_offsets = offsets_of(&bin_of_segment, n_bins);
        let outputs = scatter_direct(&segments, &bin_of_segment, &bin_offsets);
        (bin_offsets, outputs)
    } else {
        scatter_bucketed(&segments, &bin_of_segment, n_bins)
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

/// `n_bins + 1` offsets of the bins' segments, from the bin of each segment.
fn offsets_of(bin_of_segment: &[u32], n_bins: usize) -> Vec<i64> {
    let mut bin_offsets = vec![0i64; n_bins + 1];
    for &bin in bin_of_segment {
        bin_offsets[bin as usize + 1] += 1;
    }
    for i in 0..n_bins {
        bin_offsets[i + 1] += bin_offsets[i];
    }
    bin_offsets
}

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

/// Two streaming passes through cache-sized buckets (see the module docs), both parallel,
/// staged in the output arrays themselves.
///
/// Every window of `WINDOW` output slots receives exactly that many segments (slots are a
/// permutation of `0..n`), so the segments bound for window `w` can wait in window `w`
/// until pass 2 moves each to its slot there: no staging buffer is allocated (fresh
/// memory is what the kernel must zero, which is most of a first call's time). Pass 1
/// runs over chunks of segments in parallel: chunk `c` knows, from per-chunk counts of
/// segments per bin, the first slot of each bin it fills and the part of each window its
/// segments wait in, so chunks write disjoint places and the result is that of one
/// sequential pass.
fn scatter_bucketed(
    segments: &Segments,
    bin_of_segment: &[u32],
    n_bins: usize,
) -> (Vec<i64>, Outputs) {
    let n = segments.len();
    // One chunk per thread, while the per-chunk counts (4 bytes per bin) stay within
    // 4 bytes per segment.
    let chunks = rayon::current_num_threads().min(n / n_bins.max(1)).max(1);
    let chunk_len = n.div_ceil(chunks);
    // Segments per bin in each chunk, then (in place) each chunk's first slot per bin.
    let mut cursors: Vec<Vec<u32>> = bin_of_segment
        .par_chunks(chunk_len)
        .map(|bins| {
            let mut counts = vec![0u32; n_bins];
            for &bin in bins {
                counts[bin as usize] += 1;
            }
            counts
        })
        .collect();
    let windows = n.div_ceil(WINDOW);
    let mut arrivals = vec![vec![0usize; windows]; cursors.len()];
    let mut bin_offsets = Vec::with_capacity(n_bins + 1);
    let mut slot = 0usize;
    for bin in 0..n_bins {
        bin_offsets.push(slot as i64);
        for (cursor, arrivals) in cursors.iter_mut().zip(arrivals.iter_mut()) {
            let count = cursor[bin] as usize;
            cursor[bin] = slot as u32;
            // Slots `slot..slot + count` of this chunk, window by window.
            let mut first = slot;
            slot += count;
            while first < slot {
                let window_end = (first / WINDOW + 1) * WINDOW;
                let end = window_end.min(slot);
                arrivals[first / WINDOW] += end - first;
                first = end;
            }
        }
    }
    bin_offsets.push(slot as i64);

    let mut indices = zeroed_vec!(i64, n);
    let mut lengths = zeroed_vec!(i64, n);
    // Zeroed allocations are mapped lazily: `starts` costs nothing unless something split.
    let mut starts = vec![0i64; n];
    let split = segments.starts.is_some();
    // Where each chunk's arrivals wait: its part of every window, of each output array.
    let mut places: Vec<Places<'_>> = (0..cursors.len()).map(|_| Places::default()).collect();
    for (((window_indices, window_lengths), window_starts), w) in indices
        .chunks_mut(WINDOW)
        .zip(lengths.chunks_mut(WINDOW))
        .zip(starts.chunks_mut(WINDOW))
        .zip(0..)
    {
        let (mut rest_indices, mut rest_lengths, mut rest_starts) =
            (window_indices, window_lengths, window_starts);
        for (place, arrivals) in places.iter_mut().zip(&arrivals) {
            let count = arrivals[w];
            let (head, tail) = rest_indices.split_at_mut(count);
            place.indices.push(head);
            rest_indices = tail;
            let (head, tail) = rest_lengths.split_at_mut(count);
            place.lengths.push(head);
            rest_lengths = tail;
            let (head, tail) = rest_starts.split_at_mut(if split { count } else { 0 });
            place.starts.push(head);
            rest_starts = tail;
        }
    }
    // Pass 1: a segment bound for output slot `slot` waits in window `slot / WINDOW` as
    // `(slot % WINDOW) << 32 | sequence` in `indices`, its length in `lengths` and its
    // start in `starts`.
    places
        .into_par_iter()
        .zip(cursors.into_par_iter())
        .enumerate()
        .for_each(|(chunk, (mut place, mut cursor))| {
            let first = chunk * chunk_len;
            let ids = first..(first + chunk_len).min(n);
            let mut filled = vec![0usize; windows];
            for id in ids {
                let next_slot = &mut cursor[bin_of_segment[id] as usize];
                let slot = *next_slot as usize;
                *next_slot += 1;
                let window = slot / WINDOW;
                let k = filled[window];
                filled[window] += 1;
                let local = (slot % WINDOW) as i64;
                place.indices[window][k] = local << 32 | i64::from(segments.sequence_of(id));
                place.lengths[window][k] = i64::from(segments.lengths[id]);
                if let Some(segment_starts) = &segments.starts {
                    place.starts[window][k] = segment_starts[id] as i64;
                }
            }
        });
    // Pass 2: each window, in parallel, copies its arrivals aside (into its core's cache)
    // and writes each to its slot.
    let windows = indices
        .par_chunks_mut(WINDOW)
        .zip(lengths.par_chunks_mut(WINDOW))
        .zip(starts.par_chunks_mut(WINDOW));
    windows.for_each_init(
        || [Vec::new(), Vec::new(), Vec::new()],
        |[staged, staged_lengths, staged_starts], ((indices, lengths), starts)| {
            staged.clear();
            staged.extend_from_slice(indices);
            staged_lengths.clear();
            staged_lengths.extend_from_slice(lengths);
            if split {
                staged_starts.clear();
                staged_starts.extend_from_slice(starts);
            }
            for (k, &packed) in staged.iter().enumerate() {
                let local = (packed >> 32) as usize;
                indices[local] = packed & 0xFFFF_FFFF;
                lengths[local] = staged_lengths[k];
                if split {
                    starts[local] = staged_starts[k];
                }
            }
        },
    );
    (bin_offsets, (indices, lengths, starts))
}

/// One chunk's parts of every output window, for pass 1 of [`scatter_bucketed`].
#[derive(Default)]
struct Places<'a> {
    indices: Vec<&'a mut [i64]>,
    lengths: Vec<&'a mut [i64]>,
    starts: Vec<&'a mut [i64]>,
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
            let (segments, bin_of, offsets) = random_segments(3 * WINDOW + 123, with_starts);
            let direct = scatter_direct(&segments, &bin_of, &offsets);
            for threads in [1, 2, 3, 8] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let n_bins = offsets.len() - 1;
                let (bucketed_offsets, bucketed) =
                    pool.install(|| scatter_bucketed(&segments, &bin_of, n_bins));
                assert_eq!(bucketed_offsets, offsets);
                assert_eq!(direct, bucketed, "{threads} threads");
            }
        }
    }
}

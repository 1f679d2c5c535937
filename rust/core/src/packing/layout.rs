//! Building the CSR arrays from a bin per segment.
//!
//! Inside a bin, segments appear in input order (by sequence index, then token offset).
//!
//! Up to about a million segments the outputs fit the last-level cache and each segment
//! is written straight to its slot. Beyond that the output is written through cache-sized
//! buckets: a first pass appends each segment (its output slot, sequence and length,
//! packed in one 64-bit word) to the bucket of 32,768 output slots it falls in,
//! streaming; a second pass replays each bucket into its slice of the outputs, which then
//! stays in the L2 cache. Two streaming passes beat one pass of scattered writes into
//! 80 MB arrays by a wide margin. The buckets wait in the outputs themselves, so the
//! layout needs no memory beyond them.

use super::assign::BinTotals;
use super::options::PackOptions;
use super::segments::Segments;
use super::Packing;
use rayon::prelude::*;

use crate::buffers::zeroed_vec;

/// Output slots per bucket of the bucketed layout: 32,768 (three 256 KB windows of the
/// outputs fit a core's L2 cache).
const WINDOW: usize = 1 << 15;

/// The packing of `segments` into `bins`, segment `i` going to bin `bin_of_segment[i]`.
pub fn build(
    mut segments: Segments,
    bin_of_segment: Vec<u32>,
    bins: BinTotals,
    options: &PackOptions,
    padded_cost: Option<Vec<u64>>,
) -> Packing {
    let n = segments.len();
    let counts = std::mem::take(&mut segments.counts);
    let bin_offsets = offsets_of(&bins.sizes);
    let (indices, lengths, starts) = if n <= DIRECT_SCATTER_MAX {
        scatter_direct(&segments, &bin_of_segment, &bin_offsets)
    } else {
        scatter_bucketed(&segments, &bin_of_segment, &bin_offsets, options.capacity())
    };
    let segment_cost = bins.costs.iter().sum();
    let bin_tokens = padded_cost
        .unwrap_or(bins.costs)
        .into_iter()
        .map(|cost| cost as i64)
        .collect();
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

/// `n_bins + 1` offsets of the bins' segments, from the number of segments in each.
fn offsets_of(sizes: &[u32]) -> Vec<i64> {
    let mut bin_offsets = Vec::with_capacity(sizes.len() + 1);
    let mut offset = 0i64;
    bin_offsets.push(offset);
    for &size in sizes {
        offset += i64::from(size);
        bin_offsets.push(offset);
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
    bin_offsets: &[i64],
    capacity: u64,
) -> Outputs {
    let n = segments.len();
    let n_bins = bin_offsets.len() - 1;
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
    for (bin, &offset) in bin_offsets[..n_bins].iter().enumerate() {
        let mut slot = offset as usize;
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
        debug_assert_eq!(slot as i64, bin_offsets[bin + 1]);
    }

    let mut indices = zeroed_vec!(i64, n);
    let mut lengths = zeroed_vec!(i64, n);
    // Zeroed allocations are mapped lazily: `starts` costs nothing unless something split.
    let mut starts = vec![0i64; n];
    let split = segments.starts.is_some();
    let entry = Entry::new(segments, capacity);
    // Pass 1: a segment bound for output slot `slot` waits in window `slot / WINDOW` as an
    // `Entry` in `indices`, its length in `lengths` if the entry cannot hold it, and its
    // start in `starts` if sequences were split.
    places(&mut indices, &arrivals, true)
        .into_par_iter()
        .zip(places(&mut lengths, &arrivals, !entry.holds_length))
        .zip(places(&mut starts, &arrivals, split))
        .zip(cursors)
        .enumerate()
        .for_each(
            |(chunk, (((mut indices, mut lengths), mut starts), mut cursor))| {
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
                    let length = segments.lengths[id];
                    indices[window][k] =
                        entry.encode(slot % WINDOW, length, segments.sequence_of(id));
                    if !entry.holds_length {
                        lengths[window][k] = i64::from(length);
                    }
                    if let Some(segment_starts) = &segments.starts {
                        starts[window][k] = segment_starts[id] as i64;
                    }
                }
            },
        );
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
            if !entry.holds_length {
                staged_lengths.clear();
                staged_lengths.extend_from_slice(lengths);
            }
            if split {
                staged_starts.clear();
                staged_starts.extend_from_slice(starts);
            }
            for (k, &waiting) in staged.iter().enumerate() {
                let (local, length, sequence) = entry.decode(waiting);
                indices[local] = sequence;
                lengths[local] = if entry.holds_length {
                    length
                } else {
                    staged_lengths[k]
                };
                if split {
                    starts[local] = staged_starts[k];
                }
            }
        },
    );
    (indices, lengths, starts)
}

/// Each chunk's part of every window of `array`, where its arrivals wait in pass 1 of
/// [`scatter_bucketed`]: `arrivals[c][w]` slots of window `w` for chunk `c`, in chunk
/// order (empty parts if nothing waits in `array`).
fn places<'a>(
    array: &'a mut [i64],
    arrivals: &[Vec<usize>],
    waits: bool,
) -> Vec<Vec<&'a mut [i64]>> {
    let mut places: Vec<Vec<&mut [i64]>> = arrivals.iter().map(|_| Vec::new()).collect();
    for (window, w) in array.chunks_mut(WINDOW).zip(0..) {
        let mut rest = window;
        for (place, arrivals) in places.iter_mut().zip(arrivals) {
            let (head, tail) = rest.split_at_mut(if waits { arrivals[w] } else { 0 });
            place.push(head);
            rest = tail;
        }
    }
    places
}

/// How a segment waits in pass 1 of [`scatter_bucketed`]: one 64-bit word with its slot
/// in the window in the top bits, then its length, then its sequence, so that pass 1
/// writes and pass 2 reads 8 bytes per segment instead of 16. The length is left out (and
/// waits in `lengths` instead) when the sequence numbers and the capacity need more than
/// the bits the slot leaves.
#[derive(Debug, Clone, Copy)]
struct Entry {
    sequence_bits: u32,
    holds_length: bool,
}

/// Bits of a slot in a window, at the top of an [`Entry`].
const SLOT_SHIFT: u32 = u64::BITS - WINDOW.trailing_zeros();

impl Entry {
    fn new(segments: &Segments, capacity: u64) -> Self {
        let bits = |value: u64| u64::BITS - value.leading_zeros();
        // Sequence numbers never decrease along the segments: the last is the largest.
        let largest_sequence = segments
            .len()
            .checked_sub(1)
            .map_or(0, |last| segments.sequence_of(last));
        let sequence_bits = bits(u64::from(largest_sequence));
        Self {
            sequence_bits,
            holds_length: sequence_bits + bits(capacity) <= SLOT_SHIFT,
        }
    }

    #[inline]
    fn encode(self, local: usize, length: u32, sequence: u32) -> i64 {
        let length = if self.holds_length {
            u64::from(length) << self.sequence_bits
        } else {
            0
        };
        ((local as u64) << SLOT_SHIFT | length | u64::from(sequence)) as i64
    }

    /// Slot in the window, length (if held) and sequence.
    #[inline]
    fn decode(self, entry: i64) -> (usize, i64, i64) {
        let entry = entry as u64;
        let below_slot = entry & ((1 << SLOT_SHIFT) - 1);
        let sequence = below_slot & ((1 << self.sequence_bits) - 1);
        let length = below_slot >> self.sequence_bits;
        (
            (entry >> SLOT_SHIFT) as usize,
            length as i64,
            sequence as i64,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packing::segments::PolicyCounts;
    use crate::rng::SplitMix64;

    /// `n` segments of at most `capacity` tokens in random bins, of sequences
    /// `0, stride, 2 stride...` (two segments each), with starts if `with_starts`.
    fn random_segments(
        n: usize,
        capacity: u64,
        stride: u32,
        with_starts: bool,
    ) -> (Segments, Vec<u32>, Vec<i64>) {
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
            lengths: (0..n).map(|_| rng.below(capacity + 1) as u32).collect(),
            sequence: Some((0..n as u32).map(|i| i / 2 * stride).collect()),
            starts: with_starts.then(|| (0..n as u64).map(|i| i % 7).collect()),
            counts: PolicyCounts::default(),
        };
        (segments, bin_of, offsets)
    }

    #[test]
    fn bucketed_and_direct_scatter_agree() {
        // Entries that hold the length (small budget), and entries that cannot (sequence
        // numbers up to 2^31 and a budget of 2^30: 61 bits).
        for (capacity, stride) in [(4096, 1), (1 << 30, 1 << 15)] {
            for with_starts in [false, true] {
                // Several buckets, the last one partial.
                let n = 3 * WINDOW + 123;
                let (segments, bin_of, offsets) = random_segments(n, capacity, stride, with_starts);
                let entry = Entry::new(&segments, capacity);
                assert_eq!(entry.holds_length, capacity < 1 << 20);
                let direct = scatter_direct(&segments, &bin_of, &offsets);
                for threads in [1, 2, 3, 8] {
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()
                        .unwrap();
                    let bucketed =
                        pool.install(|| scatter_bucketed(&segments, &bin_of, &offsets, capacity));
                    assert_eq!(direct, bucketed, "{threads} threads");
                }
            }
        }
    }

    #[test]
    fn entries_round_trip() {
        for (sequence_bits, capacity) in [(0u32, 1u64), (17, 8192), (31, 1 << 17), (24, 1 << 24)] {
            let largest = (1u64 << sequence_bits) - 1;
            let entry = Entry {
                sequence_bits,
                holds_length: true,
            };
            assert!(sequence_bits + u64::BITS - capacity.leading_zeros() <= SLOT_SHIFT);
            for (local, length, sequence) in [
                (0, 0, 0),
                (WINDOW - 1, capacity, largest),
                (12_345, capacity / 3, largest / 2),
            ] {
                let encoded = entry.encode(local, length as u32, sequence as u32);
                assert_eq!(
                    entry.decode(encoded),
                    (local, length as i64, sequence as i64)
                );
            }
        }
    }
}

//! Building the CSR arrays from a bin per segment.
//!
//! Inside a bin, segments appear in input order (by sequence index, then token offset).
//!
//! Up to about a million segments the outputs fit the last-level cache and each segment
//! is written straight to its slot. Beyond that the output is written through cache-sized
//! buckets of consecutive bins (about 32,768 output slots each): a first pass appends each
//! segment (its bin in the bucket, length and sequence, packed in one 64-bit word) to its
//! bucket, streaming; a second pass sorts each bucket by bin into its slice of the
//! outputs, which then stays in the L2 cache. Two streaming passes beat one pass of
//! scattered writes into 80 MB arrays by a wide margin. The buckets wait in the outputs
//! themselves, so the layout needs no memory beyond them.

use super::assign::BinTotals;
use super::options::PackOptions;
use super::order::SegmentBins;
use super::segments::Segments;
use super::Packing;
use rayon::prelude::*;

use crate::buffers::zeroed_vec;

/// Output slots per bucket of the bucketed layout, on average: 32,768 (a bucket of the
/// outputs, 256 KB per array, and its copy fit a core's L2 cache).
const WINDOW: usize = 1 << 15;

/// Most bins in a bucket: 2^15, so that a bin's place in its bucket takes 15 bits.
const MAX_BUCKET_SHIFT: u32 = 15;

/// The packing of `segments`, segment `i` going to bin `bin_of` of `i`, into bins of
/// `totals`.
pub fn build(
    segments: &Segments,
    bin_of: SegmentBins<'_>,
    totals: BinTotals,
    options: &PackOptions,
    padded_cost: Option<Vec<u64>>,
    outputs: OutputBuffers,
) -> Packing {
    let n = segments.len();
    let bin_offsets = offsets_of(&totals.sizes);
    let (indices, lengths, starts) = if n <= DIRECT_SCATTER_MAX {
        scatter_direct(segments, &bin_of.into_listed(), &bin_offsets, outputs)
    } else {
        scatter_bucketed(segments, &bin_of, &bin_offsets, options.capacity(), outputs)
    };
    let segment_cost = totals.costs.iter().sum();
    let bin_tokens = padded_cost
        .unwrap_or(totals.costs)
        .into_iter()
        .map(|cost| cost as i64)
        .collect();
    Packing {
        bin_offsets,
        indices,
        starts: segments.starts.is_some().then_some(starts),
        lengths,
        bin_tokens,
        counts: segments.counts.clone(),
        segment_cost,
    }
}

/// Outputs up to this many segments (16 bytes each) stay in the last-level cache, where
/// scattered writes are cheap and staging would only cost an extra buffer.
const DIRECT_SCATTER_MAX: usize = 1 << 20;

type Outputs = (Vec<i64>, Vec<i64>, Vec<i64>);

/// The output arrays of a packing, zeroed, for the layout to fill: `indices`, `lengths`
/// and, if some sequence was split, `starts`.
pub struct OutputBuffers(Outputs);

impl OutputBuffers {
    /// Zeroed outputs for `n` segments, `starts` included if `with_starts` (see
    /// [`Segments::output_shape`]). With `touched`, every page is written now: made on one
    /// core while the assignment runs on another, the page faults and clearing of the fresh
    /// memory (about a sixth of packing a million sequences) leave the path of the pack.
    /// Otherwise the memory is mapped as the layout first writes it.
    pub fn zeroed((n, with_starts): (usize, bool), touched: bool) -> Self {
        let zeros = |n: usize| {
            let mut zeros = zeroed_vec!(i64, n);
            if touched {
                // One write per page maps it (fresh memory is cleared by the kernel; reused
                // memory was cleared by the allocator). The compiler may not know the
                // memory is zero already, or it would drop the writes.
                for page in std::hint::black_box(&mut zeros[..]).chunks_mut(I64_PER_PAGE) {
                    page[0] = 0;
                }
            }
            zeros
        };
        let starts = if with_starts { zeros(n) } else { Vec::new() };
        Self((zeros(n), zeros(n), starts))
    }
}

/// `i64`s per (small) page of memory.
const I64_PER_PAGE: usize = 4096 / std::mem::size_of::<i64>();

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
fn scatter_direct(
    segments: &Segments,
    bin_of_segment: &[u32],
    bin_offsets: &[i64],
    OutputBuffers((mut indices, mut lengths, mut starts)): OutputBuffers,
) -> Outputs {
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
/// A bucket is `2^shift` consecutive bins, whose segments fill a contiguous range of
/// output slots: the segments bound for a bucket wait there until pass 2 sorts them by
/// bin, so no staging buffer is allocated (fresh memory is what the kernel must zero,
/// which is most of a first call's time). Pass 1 runs over chunks of segments in
/// parallel: chunk `c` knows, from per-chunk counts of segments per bucket, the part of
/// each bucket its segments wait in, so chunks write disjoint places; each bucket then
/// holds its segments in id order, which the stable sort by bin of pass 2 keeps within
/// each bin.
fn scatter_bucketed(
    segments: &Segments,
    bin_of: &SegmentBins<'_>,
    bin_offsets: &[i64],
    capacity: u64,
    OutputBuffers((mut indices, mut lengths, mut starts)): OutputBuffers,
) -> Outputs {
    let n = segments.len();
    let n_bins = bin_offsets.len() - 1;
    let shift = bucket_shift(n, n_bins);
    let n_buckets = n_bins.div_ceil(1 << shift).max(1);
    // Output slots of each bucket.
    let bucket_sizes: Vec<usize> = (0..n_buckets)
        .map(|b| {
            let first = bin_offsets[(b << shift).min(n_bins)];
            let end = bin_offsets[((b + 1) << shift).min(n_bins)];
            (end - first) as usize
        })
        .collect();
    // Several chunks per thread, so that a thread that falls behind (on a busy machine)
    // leaves its other chunks to the rest.
    let chunks = bin_of.chunks(4 * rayon::current_num_threads());
    // Segments of each chunk per bucket.
    let arrivals: Vec<Vec<usize>> = chunks
        .par_iter()
        .map(|chunk| {
            let mut counts = vec![0usize; n_buckets];
            bin_of.count_groups(chunk, shift, &mut counts);
            counts
        })
        .collect();
    let split = segments.starts.is_some();
    let entry = Entry::new(segments, shift, capacity);
    let in_bucket = (1u32 << shift) - 1;
    // Pass 1: a segment waits in its bucket as an `Entry` in `indices`, its length in
    // `lengths` if the entry cannot hold it, and its start in `starts` if sequences were
    // split.
    places(&mut indices, &bucket_sizes, &arrivals, true)
        .into_par_iter()
        .zip(places(
            &mut lengths,
            &bucket_sizes,
            &arrivals,
            !entry.holds_length,
        ))
        .zip(places(&mut starts, &bucket_sizes, &arrivals, split))
        .zip(&chunks)
        .for_each(|(((mut indices, mut lengths), mut starts), chunk)| {
            let mut filled = vec![0usize; n_buckets];
            bin_of.blocks(chunk, |ids, bins| {
                for (id, &bin) in ids.zip(bins) {
                    let bucket = (bin >> shift) as usize;
                    let k = filled[bucket];
                    filled[bucket] += 1;
                    let length = segments.lengths[id];
                    indices[bucket][k] =
                        entry.encode(bin & in_bucket, length, segments.sequence_of(id));
                    if !entry.holds_length {
                        lengths[bucket][k] = i64::from(length);
                    }
                    if let Some(segment_starts) = &segments.starts {
                        starts[bucket][k] = segment_starts[id] as i64;
                    }
                }
            });
        });
    // Pass 2: each bucket, in parallel, copies its segments aside (into its core's cache)
    // and writes each to the next slot of its bin.
    let buckets = split_by(&mut indices, &bucket_sizes, true)
        .into_par_iter()
        .zip(split_by(&mut lengths, &bucket_sizes, true))
        .zip(split_by(&mut starts, &bucket_sizes, split))
        .enumerate();
    buckets.for_each_init(
        || (Vec::new(), [Vec::new(), Vec::new(), Vec::new()]),
        |(next_slot, [staged, staged_lengths, staged_starts]),
         (bucket, ((indices, lengths), starts))| {
            let first_bin = bucket << shift;
            let end_bin = (first_bin + (1 << shift)).min(n_bins);
            let first_slot = bin_offsets[first_bin];
            next_slot.clear();
            next_slot.extend(
                bin_offsets[first_bin..end_bin]
                    .iter()
                    .map(|&offset| (offset - first_slot) as usize),
            );
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
                let (bin, length, sequence) = entry.decode(waiting);
                let slot = next_slot[bin];
                next_slot[bin] += 1;
                indices[slot] = sequence;
                lengths[slot] = if entry.holds_length {
                    length
                } else {
                    staged_lengths[k]
                };
                if split {
                    starts[slot] = staged_starts[k];
                }
            }
        },
    );
    (indices, lengths, starts)
}

/// Bins per bucket, as a power of two: about [`WINDOW`] segments per bucket on average.
fn bucket_shift(n: usize, n_bins: usize) -> u32 {
    let bins_per_bucket = (WINDOW as u64 * n_bins as u64 / n.max(1) as u64).max(1);
    (u64::BITS - 1 - bins_per_bucket.leading_zeros()).min(MAX_BUCKET_SHIFT)
}

/// `array` cut into consecutive parts of `sizes` (empty parts if `cut` is false).
fn split_by<'a>(array: &'a mut [i64], sizes: &[usize], cut: bool) -> Vec<&'a mut [i64]> {
    let mut parts = Vec::with_capacity(sizes.len());
    let mut rest = array;
    for &size in sizes {
        let (head, tail) = rest.split_at_mut(if cut { size } else { 0 });
        parts.push(head);
        rest = tail;
    }
    parts
}

/// Each chunk's part of every bucket of `array`, where its segments wait in pass 1 of
/// [`scatter_bucketed`]: `arrivals[c][b]` slots of bucket `b` (of `bucket_sizes[b]`
/// slots) for chunk `c`, in chunk order (empty parts if nothing waits in `array`).
fn places<'a>(
    array: &'a mut [i64],
    bucket_sizes: &[usize],
    arrivals: &[Vec<usize>],
    waits: bool,
) -> Vec<Vec<&'a mut [i64]>> {
    let mut places: Vec<Vec<&mut [i64]>> = arrivals.iter().map(|_| Vec::new()).collect();
    for (bucket, b) in split_by(array, bucket_sizes, waits).into_iter().zip(0..) {
        let mut rest = bucket;
        for (place, arrivals) in places.iter_mut().zip(arrivals) {
            let (head, tail) = rest.split_at_mut(if waits { arrivals[b] } else { 0 });
            place.push(head);
            rest = tail;
        }
    }
    places
}

/// How a segment waits in pass 1 of [`scatter_bucketed`]: one 64-bit word with its bin's
/// place in the bucket in the top bits, then its length, then its sequence, so that pass 1
/// writes and pass 2 reads 8 bytes per segment instead of 16. The length is left out (and
/// waits in `lengths` instead) when the sequence numbers and the capacity need more than
/// the bits the bin leaves.
#[derive(Debug, Clone, Copy)]
struct Entry {
    sequence_bits: u32,
    holds_length: bool,
}

/// Where the bin's place in its bucket starts in an [`Entry`].
const BIN_SHIFT: u32 = u64::BITS - MAX_BUCKET_SHIFT;

impl Entry {
    fn new(segments: &Segments, bucket_shift: u32, capacity: u64) -> Self {
        debug_assert!(bucket_shift <= MAX_BUCKET_SHIFT);
        let bits = |value: u64| u64::BITS - value.leading_zeros();
        // Sequence numbers never decrease along the segments: the last is the largest.
        let largest_sequence = segments
            .len()
            .checked_sub(1)
            .map_or(0, |last| segments.sequence_of(last));
        let sequence_bits = bits(u64::from(largest_sequence));
        Self {
            sequence_bits,
            holds_length: sequence_bits + bits(capacity) <= BIN_SHIFT,
        }
    }

    #[inline]
    fn encode(self, bin: u32, length: u32, sequence: u32) -> i64 {
        let length = if self.holds_length {
            u64::from(length) << self.sequence_bits
        } else {
            0
        };
        (u64::from(bin) << BIN_SHIFT | length | u64::from(sequence)) as i64
    }

    /// Bin in the bucket, length (if held) and sequence.
    #[inline]
    fn decode(self, entry: i64) -> (usize, i64, i64) {
        let entry = entry as u64;
        let below_bin = entry & ((1 << BIN_SHIFT) - 1);
        let sequence = below_bin & ((1 << self.sequence_bits) - 1);
        let length = below_bin >> self.sequence_bits;
        (
            (entry >> BIN_SHIFT) as usize,
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

    /// `n` segments of at most `capacity` tokens in `n_bins` random bins, of sequences
    /// `0, stride, 2 stride...` (two segments each), with starts if `with_starts`.
    fn random_segments(
        n: usize,
        n_bins: usize,
        capacity: u64,
        stride: u32,
        with_starts: bool,
    ) -> (Segments, Vec<u32>, Vec<i64>) {
        let mut rng = SplitMix64::new(11);
        let bin_of: Vec<u32> = (0..n).map(|_| rng.below(n_bins as u64) as u32).collect();
        let mut sizes = vec![0u32; n_bins];
        for &bin in &bin_of {
            sizes[bin as usize] += 1;
        }
        let segments = Segments {
            lengths: (0..n).map(|_| rng.below(capacity + 1) as u32).collect(),
            sequence: Some((0..n as u32).map(|i| i / 2 * stride).collect()),
            starts: with_starts.then(|| (0..n as u64).map(|i| i % 7).collect()),
            counts: PolicyCounts::default(),
        };
        (segments, bin_of, offsets_of(&sizes))
    }

    #[test]
    fn bucketed_and_direct_scatter_agree() {
        let n = 3 * WINDOW + 123;
        // Entries that hold the length (small budget), and entries that cannot (sequence
        // numbers up to 2^31 and a budget of 2^30: 61 bits).
        for (capacity, stride) in [(4096, 1), (1 << 30, 1 << 15)] {
            // Buckets of 4,096 bins (five, the last partial), of one bin (huge bins), and
            // of the most bins a bucket may hold.
            for (n_bins, shift) in [(n / 5 + 1, 12), (3, 0), (n, MAX_BUCKET_SHIFT)] {
                assert_eq!(bucket_shift(n, n_bins), shift);
                for with_starts in [false, true] {
                    let (segments, bin_of, offsets) =
                        random_segments(n, n_bins, capacity, stride, with_starts);
                    let entry = Entry::new(&segments, shift, capacity);
                    assert_eq!(entry.holds_length, capacity < 1 << 20);
                    let direct = scatter_direct(
                        &segments,
                        &bin_of,
                        &offsets,
                        OutputBuffers::zeroed(segments.output_shape(), false),
                    );
                    for threads in [1, 2, 3, 8] {
                        let pool = rayon::ThreadPoolBuilder::new()
                            .num_threads(threads)
                            .build()
                            .unwrap();
                        let listed = SegmentBins::Listed(bin_of.clone());
                        let bucketed = pool.install(|| {
                            let outputs = OutputBuffers::zeroed(segments.output_shape(), true);
                            scatter_bucketed(&segments, &listed, &offsets, capacity, outputs)
                        });
                        assert_eq!(direct, bucketed, "{threads} threads, {n_bins} bins");
                    }
                }
            }
        }
    }

    #[test]
    fn walked_and_listed_bins_give_the_same_layout() {
        use crate::packing::order::OfferOrder;
        use crate::packing::segments::segment;
        let mut rng = SplitMix64::new(5);
        let lengths: Vec<i64> = (0..300_000).map(|_| rng.below(3000) as i64).collect();
        let pool = |threads| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
        };
        for (k, split) in [(1, false), (8, true)] {
            let oversize = if split { "split" } else { "truncate" };
            let options = PackOptions::new(2048, None, k, oversize, "bfd", 0).unwrap();
            let segments = segment(&lengths, &options).unwrap();
            let compared = OfferOrder::decreasing_cost_by_comparison(&segments, &options);
            let assignment = compared.assign(&segments, &options);
            let offsets = offsets_of(&assignment.bins.sizes);
            let listed = compared
                .segment_bins(&segments, &options, assignment.bin_of)
                .into_listed();
            let expected = scatter_direct(
                &segments,
                &listed,
                &offsets,
                OutputBuffers::zeroed(segments.output_shape(), true),
            );
            // Orders cut into 1 to 5 chunks, laid out by 1 to 8 threads (grouping chunks).
            for order_threads in [1, 3, 8] {
                let counted = pool(order_threads)
                    .install(|| OfferOrder::decreasing_cost_by_counting(&segments, &options));
                let assignment = counted.assign(&segments, &options);
                for threads in [1, 2, 8] {
                    let walked =
                        counted.segment_bins(&segments, &options, assignment.bin_of.clone());
                    let layout = pool(threads).install(|| {
                        let outputs = OutputBuffers::zeroed(segments.output_shape(), false);
                        scatter_bucketed(&segments, &walked, &offsets, options.capacity(), outputs)
                    });
                    assert_eq!(layout, expected, "{order_threads} and {threads} threads");
                    assert_eq!(pool(threads).install(|| walked.into_listed()), listed);
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
            assert!(sequence_bits + u64::BITS - capacity.leading_zeros() <= BIN_SHIFT);
            for (bin, length, sequence) in [
                (0, 0, 0),
                ((1 << MAX_BUCKET_SHIFT) - 1, capacity, largest),
                (12_345, capacity / 3, largest / 2),
            ] {
                let encoded = entry.encode(bin, length as u32, sequence as u32);
                assert_eq!(
                    entry.decode(encoded),
                    (bin as usize, length as i64, sequence as i64)
                );
            }
        }
    }
}

//! The order in which segments are offered to the bins.
//!
//! Performance note: with millions of segments, every random memory access per segment
//! costs more than the bin search itself. So a decreasing-cost order is never
//! materialized as a permutation: the assignment walks the cost histogram as runs, and the
//! layout recovers each segment's offer position from the histogram's running offsets
//! while it reads the segments in id order (see [`SegmentBins`]).

use std::ops::Range;

use rayon::prelude::*;

use super::assign::{self, Assignment};
use super::options::{Algorithm, PackOptions};
use super::segments::Segments;
use crate::buffers::{with_capacity_huge, zeroed_vec};
use crate::rng::{mix_seed, SplitMix64};

/// The decreasing-cost order is found by counting (one pass and a histogram with a
/// counter per sort key) while the keys are at most this many per segment...
const COUNTING_SORT_KEYS_PER_SEGMENT: u64 = 4;

/// ... or at most this many in all; beyond, a comparison sort keeps the order's memory and
/// time proportional to the input instead of the budget.
const COUNTING_SORT_SMALL_KEYS: u64 = 1 << 14;

/// How segments are offered to the bins.
pub enum OfferOrder {
    /// Decreasing cost, ties by increasing id. `runs` lists `(cost, count)` in offer
    /// order. The segments are cut into chunks of `chunk_len` ids; `chunk_starts[c][key]`
    /// is the offer position of the first segment of chunk `c` with sort key `key`
    /// (cost / k): the segments of one key occupy consecutive positions in id order. One
    /// entry more than chunks: the last holds where each key's positions end.
    ByCost {
        runs: Vec<(u64, u32)>,
        chunk_len: usize,
        chunk_starts: Vec<Vec<u32>>,
    },
    /// `ids[p]` is offered at position `p`.
    Permutation(Vec<u32>),
    /// Segment `p` is offered at position `p`.
    Input,
}

type Runs<'a> = std::iter::FlatMap<
    std::slice::Iter<'a, (u64, u32)>,
    std::iter::RepeatN<u64>,
    fn(&(u64, u32)) -> std::iter::RepeatN<u64>,
>;

/// Segment costs in offer order: expanded from runs, or computed from lengths.
pub enum CostIter<'a> {
    Runs(Runs<'a>),
    Lengths(std::slice::Iter<'a, u32>, &'a PackOptions),
}

impl Iterator for CostIter<'_> {
    type Item = u64;

    #[inline]
    fn next(&mut self) -> Option<u64> {
        match self {
            Self::Runs(runs) => runs.next(),
            Self::Lengths(lengths, options) => lengths
                .next()
                .map(|&length| options.cost(u64::from(length))),
        }
    }
}

/// Sort key of a segment: its cost divided by the multiple (the division is skipped for
/// k = 1, where it would otherwise dominate the pass).
#[inline]
fn sort_key(length: u32, k: u64) -> usize {
    if k == 1 {
        length as usize
    } else {
        u64::from(length).div_ceil(k) as usize
    }
}

impl OfferOrder {
    /// Decreasing cost, ties by increasing id (a unique order), by counting or by
    /// comparison, whichever suits the input's size; both give the same order.
    pub fn decreasing_cost(segments: &Segments, options: &PackOptions) -> Self {
        let keys = options.capacity() / options.pad_to_multiple_of + 1;
        let counting_limit = (segments.len() as u64)
            .saturating_mul(COUNTING_SORT_KEYS_PER_SEGMENT)
            .max(COUNTING_SORT_SMALL_KEYS);
        if keys <= counting_limit {
            Self::decreasing_cost_by_counting(segments, options)
        } else {
            Self::decreasing_cost_by_comparison(segments, options)
        }
    }

    /// [`decreasing_cost`](Self::decreasing_cost) by a counting sort over the sort keys:
    /// one histogram per chunk of segments, counted in parallel, which also tell where
    /// each chunk's segments of each key are offered (for [`bins_by_segment`]).
    ///
    /// [`bins_by_segment`]: Self::bins_by_segment
    pub fn decreasing_cost_by_counting(segments: &Segments, options: &PackOptions) -> Self {
        let k = options.pad_to_multiple_of;
        let keys = (options.capacity() / k) as usize + 1;
        let n = segments.len();
        // Four chunks per thread (the layout reads its chunks in parallel too, and on a
        // busy machine a thread that falls behind leaves its other chunks to the rest), if
        // the histograms stay small; else one chunk.
        let chunk_len = n.div_ceil(4 * rayon::current_num_threads()).max(1 << 16);
        let chunk_len = if n.div_ceil(chunk_len) * keys <= 1 << 22 {
            chunk_len
        } else {
            n.max(1)
        };
        let histograms: Vec<Vec<u32>> = segments
            .lengths
            .par_chunks(chunk_len)
            .map(|lengths| {
                let mut counts = vec![0u32; keys];
                for &length in lengths {
                    counts[sort_key(length, k)] += 1;
                }
                counts
            })
            .collect();
        let mut runs = Vec::new();
        let mut next = vec![0u32; keys];
        let mut offset = 0u32;
        for key in (0..keys).rev() {
            next[key] = offset;
            let count: u32 = histograms.iter().map(|counts| counts[key]).sum();
            if count > 0 {
                runs.push((key as u64 * k, count));
                offset += count;
            }
        }
        let mut chunk_starts = Vec::with_capacity(histograms.len() + 1);
        for counts in &histograms {
            chunk_starts.push(next.clone());
            for (position, count) in next.iter_mut().zip(counts) {
                *position += count;
            }
        }
        chunk_starts.push(next);
        Self::ByCost {
            runs,
            chunk_len,
            chunk_starts,
        }
    }

    /// [`decreasing_cost`](Self::decreasing_cost) by a comparison sort of the segment ids.
    pub fn decreasing_cost_by_comparison(segments: &Segments, options: &PackOptions) -> Self {
        let k = options.pad_to_multiple_of;
        let mut ids: Vec<u32> = (0..segments.len() as u32).collect();
        ids.sort_unstable_by_key(|&id| {
            (
                std::cmp::Reverse(sort_key(segments.lengths[id as usize], k)),
                id,
            )
        });
        Self::Permutation(ids)
    }

    /// A random order that depends only on `seed`.
    pub fn shuffled(segments: &Segments, seed: u64) -> Self {
        let mut ids: Vec<u32> = (0..segments.len() as u32).collect();
        SplitMix64::new(mix_seed(&[seed])).shuffle(&mut ids);
        Self::Permutation(ids)
    }

    /// Run `assign` over the segment costs in offer order, monomorphized per order kind.
    /// The by-cost order expands its runs lazily; a permutation gathers the costs first
    /// in a tight loop, where independent loads overlap (inside the assignment loop each
    /// would be a stall).
    fn with_costs<R>(
        &self,
        segments: &Segments,
        options: &PackOptions,
        assign: impl FnOnce(CostIter<'_>) -> R,
    ) -> R {
        match self {
            Self::ByCost { runs, .. } => {
                assign(CostIter::Runs(runs.iter().flat_map(|&(cost, count)| {
                    std::iter::repeat_n(cost, count as usize)
                })))
            }
            Self::Input => assign(CostIter::Lengths(segments.lengths.iter(), options)),
            Self::Permutation(ids) => {
                let mut lengths = with_capacity_huge(ids.len());
                lengths.extend(ids.iter().map(|&id| segments.lengths[id as usize]));
                assign(CostIter::Lengths(lengths.iter(), options))
            }
        }
    }

    /// Bin of every segment under the packing algorithm of `options`.
    pub fn assign(&self, segments: &Segments, options: &PackOptions) -> Assignment {
        if let Self::ByCost { runs, .. } = self {
            match options.algorithm {
                Algorithm::BestFitDecreasing => {
                    let index = assign::best_fit_index(segments.len(), options);
                    return assign::best_fit_runs(index, runs, segments.len(), options);
                }
                Algorithm::FirstFitDecreasing => {
                    return assign::first_fit_runs(runs, segments.len(), options)
                }
                Algorithm::NextFit | Algorithm::FirstFitShuffled => {}
            }
        }
        self.with_costs(segments, options, |costs| {
            assign::run(costs, segments.len(), options)
        })
    }

    /// Bin of every segment under padded batching, and each batch's padded cost.
    pub fn assign_padded(
        &self,
        segments: &Segments,
        options: &PackOptions,
    ) -> (Assignment, Vec<u64>) {
        self.with_costs(segments, options, |costs| {
            assign::padded(costs, segments.len(), options)
        })
    }

    /// The bin of every segment by id, from `bin_of` (a bin per offer position).
    pub fn segment_bins<'a>(
        &'a self,
        segments: &'a Segments,
        options: &PackOptions,
        bin_of: Vec<u32>,
    ) -> SegmentBins<'a> {
        match self {
            Self::Input => SegmentBins::Listed(bin_of),
            Self::Permutation(ids) => {
                let mut by_segment = zeroed_vec!(u32, bin_of.len());
                for (&id, &bin) in ids.iter().zip(&bin_of) {
                    by_segment[id as usize] = bin;
                }
                SegmentBins::Listed(by_segment)
            }
            Self::ByCost {
                chunk_len,
                chunk_starts,
                ..
            } => SegmentBins::Walked(Walk {
                bin_of,
                lengths: &segments.lengths,
                k: options.pad_to_multiple_of,
                chunk_len: *chunk_len,
                chunk_starts,
            }),
        }
    }
}

/// The bin of every segment, read by segment id, in chunks of consecutive ids that can be
/// read in parallel.
pub enum SegmentBins<'a> {
    /// `bins[id]` is the bin of segment `id`.
    Listed(Vec<u32>),
    /// Found from the bins in offer order while reading.
    Walked(Walk<'a>),
}

/// The bins of segments offered by decreasing cost, recovered from the bin of each offer
/// position: the segments of one sort key occupy consecutive offer positions in id order,
/// so a running position per key walks `bin_of` as a few thousand forward streams. A chunk
/// of ids starts from the positions that the order noted for it, so chunk boundaries fall
/// on the order's chunks.
pub struct Walk<'a> {
    /// Bin of each offer position.
    bin_of: Vec<u32>,
    /// Segment lengths, by id: they give the sort keys.
    lengths: &'a [u32],
    /// The cost multiple of the sort keys.
    k: u64,
    /// Ids per chunk of the order.
    chunk_len: usize,
    /// See [`OfferOrder::ByCost`].
    chunk_starts: &'a [Vec<u32>],
}

/// Consecutive segment ids that one task reads.
#[derive(Debug, Clone)]
pub struct IdChunk {
    /// The segment ids.
    pub ids: Range<usize>,
    /// For a walk: the order's chunks it spans.
    order_chunks: Range<usize>,
}

/// Segments whose bins a walk looks up before handing them on: the look-ups of a block
/// are independent of each other and overlap, where one look-up per segment handed on
/// would make the reader wait for it.
const WALK_BLOCK: usize = 256;

impl SegmentBins<'_> {
    /// The bin of every segment as a vector indexed by id (walked in parallel if need be).
    pub fn into_listed(self) -> Vec<u32> {
        match self {
            Self::Listed(bins) => bins,
            Self::Walked(walk) => {
                let mut by_segment = zeroed_vec!(u32, walk.bin_of.len());
                let chunks = walk.chunk_starts.len() - 1;
                by_segment
                    .par_chunks_mut(walk.chunk_len)
                    .zip(walk.chunks(chunks))
                    .for_each(|(out, chunk)| {
                        walk.blocks(&chunk, |ids, bins| {
                            let first = ids.start - chunk.ids.start;
                            out[first..first + bins.len()].copy_from_slice(bins);
                        });
                    });
                by_segment
            }
        }
    }

    /// At most `max` chunks (at least one) that cover all segments in id order; fewer
    /// when a walk's chunk boundaries do not allow that many.
    pub fn chunks(&self, max: usize) -> Vec<IdChunk> {
        match self {
            Self::Listed(bins) => {
                let n = bins.len();
                let chunk_len = n.div_ceil(max.max(1)).max(1);
                (0..n.div_ceil(chunk_len).max(1))
                    .map(|c| IdChunk {
                        ids: c * chunk_len..((c + 1) * chunk_len).min(n),
                        order_chunks: 0..0,
                    })
                    .collect()
            }
            Self::Walked(walk) => walk.chunks(max),
        }
    }

    /// Add the number of segments of `chunk` in each group of `2^shift` consecutive bins
    /// to `counts`.
    pub fn count_groups(&self, chunk: &IdChunk, shift: u32, counts: &mut [usize]) {
        // Four tallies taken in turn: in offer order a bin often repeats, and adding to one
        // counter again and again would wait for each addition to land.
        let mut tallies = vec![[0usize; 4]; counts.len()];
        let mut add = |bins: &[u32]| {
            let mut quads = bins.chunks_exact(4);
            for quad in &mut quads {
                for (lane, &bin) in quad.iter().enumerate() {
                    tallies[(bin >> shift) as usize][lane] += 1;
                }
            }
            for &bin in quads.remainder() {
                tallies[(bin >> shift) as usize][0] += 1;
            }
        };
        match self {
            Self::Listed(bins) => add(&bins[chunk.ids.clone()]),
            Self::Walked(walk) => {
                // The chunk's segments of each key sit at consecutive offer positions.
                let first = &walk.chunk_starts[chunk.order_chunks.start];
                let end = &walk.chunk_starts[chunk.order_chunks.end];
                for (&from, &to) in first.iter().zip(end) {
                    add(&walk.bin_of[from as usize..to as usize]);
                }
            }
        }
        for (count, tally) in counts.iter_mut().zip(tallies) {
            *count += tally.iter().sum::<usize>();
        }
    }

    /// Hand the bins of the segments of `chunk` to `visit`, in id order, a block of
    /// consecutive ids at a time.
    #[inline]
    pub fn blocks(&self, chunk: &IdChunk, mut visit: impl FnMut(Range<usize>, &[u32])) {
        match self {
            Self::Listed(bins) => visit(chunk.ids.clone(), &bins[chunk.ids.clone()]),
            Self::Walked(walk) => walk.blocks(chunk, visit),
        }
    }
}

impl Walk<'_> {
    /// See [`SegmentBins::chunks`]: groups of consecutive order chunks.
    fn chunks(&self, max: usize) -> Vec<IdChunk> {
        let n = self.bin_of.len();
        let order_chunks = self.chunk_starts.len() - 1;
        let group = order_chunks.div_ceil(max.max(1)).max(1);
        (0..order_chunks.div_ceil(group).max(1))
            .map(|c| {
                let first = c * group;
                let end = (first + group).min(order_chunks);
                IdChunk {
                    ids: (first * self.chunk_len).min(n)..(end * self.chunk_len).min(n),
                    order_chunks: first..end,
                }
            })
            .collect()
    }

    /// See [`SegmentBins::blocks`].
    #[inline]
    fn blocks(&self, chunk: &IdChunk, mut visit: impl FnMut(Range<usize>, &[u32])) {
        let mut next_position = self.chunk_starts[chunk.order_chunks.start].clone();
        let mut block = [0u32; WALK_BLOCK];
        let mut first = chunk.ids.start;
        while first < chunk.ids.end {
            let end = (first + WALK_BLOCK).min(chunk.ids.end);
            let bins = &mut block[..end - first];
            for (bin, &length) in bins.iter_mut().zip(&self.lengths[first..end]) {
                let position = &mut next_position[sort_key(length, self.k)];
                *bin = self.bin_of[*position as usize];
                *position += 1;
            }
            visit(first..end, bins);
            first = end;
        }
    }
}

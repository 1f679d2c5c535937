//! Making the number of bins divide by the number of ranks.
//!
//! With `drop_last`, the least-filled remainder bins are left out. Otherwise bins are cut
//! between their segments, the costliest first, until the count divides: every piece
//! stays within the budget and no segment moves, only offsets are inserted. When there are
//! too few segments for that and `split_sequences` is on, the longest segments are first
//! cut into pieces with the splitter of the oversize policy ([`crate::packing::pieces`]);
//! the pieces stay in their bin until the bin is cut.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use super::costs::{bin_costs, BinCost, CostKind};
use super::DealOptions;
use crate::error::{Error, Result};
use crate::packing::Bins;
use crate::packing::{pieces, Packing};

/// Segment arrays of a packing whose sequences were cut further.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentArrays {
    pub indices: Vec<i64>,
    pub starts: Vec<i64>,
    pub lengths: Vec<i64>,
}

/// What making the bin count divide did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DivideReport {
    /// Bins added by cutting bins between their segments.
    pub split_bins: u64,
    /// Segments cut into pieces (only with `split_sequences`).
    pub split_seqs: u64,
    /// Bins left out by `drop_last`.
    pub dropped_bins: u64,
    /// Segments in those bins.
    pub dropped_seqs: u64,
    /// Real tokens in those bins.
    pub dropped_tokens: u64,
}

/// Bins whose count divides by the number of ranks.
pub struct Divided {
    pub bin_offsets: Vec<i64>,
    pub cut: Option<SegmentArrays>,
    pub costs: Vec<BinCost>,
    /// Bins left out by `drop_last`, increasing.
    pub dropped: Vec<u32>,
    pub report: DivideReport,
}

/// Drop, or cut segments and bins, until the bin count divides by `num_replicas`.
pub fn divide(bins: &Bins, options: &DealOptions) -> Result<Divided> {
    let packing = &bins.packing;
    let multiple = options.pad_to_multiple_of;
    let costs = bin_costs(&packing.bin_offsets, &packing.lengths, bins.kind, multiple);
    let mut divided = Divided {
        bin_offsets: packing.bin_offsets.clone(),
        cut: None,
        costs,
        dropped: Vec::new(),
        report: DivideReport::default(),
    };
    let ranks = options.num_replicas;
    let remainder = divided.costs.len() % ranks;
    if remainder == 0 {
        return Ok(divided);
    }
    if options.drop_last {
        let dropped = least_filled(&divided.costs, remainder);
        let report = &mut divided.report;
        report.dropped_bins = remainder as u64;
        for &bin in &dropped {
            let bin = bin as usize;
            report.dropped_seqs += (packing.bin_offsets[bin + 1] - packing.bin_offsets[bin]) as u64;
            report.dropped_tokens += divided.costs[bin].real;
        }
        divided.dropped = dropped;
        return Ok(divided);
    }
    let needed = ranks - remainder;
    let grouped = Grouped(bins.group_ids.is_some().then_some(bins));
    let capacity = cut_capacity(&divided.bin_offsets, grouped);
    if options.split_sequences && capacity < needed as u64 {
        let shortfall = needed as u64 - capacity;
        if let Some((arrays, offsets, n_cut)) = cut_sequences(packing, shortfall) {
            divided.bin_offsets = offsets;
            divided.cut = Some(arrays);
            divided.report.split_seqs = n_cut;
        }
    }
    let lengths = divided
        .cut
        .as_ref()
        .map_or(&packing.lengths, |cut| &cut.lengths);
    if divided.cut.is_some() {
        divided.costs = bin_costs(&divided.bin_offsets, lengths, bins.kind, multiple);
    }
    let weights: Vec<f64> = {
        let kind = options.balance.unwrap_or(CostKind::Tokens);
        let per_attention = options.flops_per_attention();
        divided
            .costs
            .iter()
            .map(|cost| cost.of(kind, per_attention))
            .collect()
    };
    // Sequences are cut only without groups, so with groups the segment positions are
    // still the packing's.
    let cuts = cut_bins(
        &divided.bin_offsets,
        lengths,
        &weights,
        needed,
        ranks,
        grouped,
    )?;
    let (offsets, costs) = apply_cuts(&divided.bin_offsets, &divided.costs, &cuts, |pieces| {
        bin_costs(pieces, lengths, bins.kind, multiple)
    });
    divided.bin_offsets = offsets;
    divided.costs = costs;
    divided.report.split_bins = needed as u64;
    Ok(divided)
}

/// The `count` bins with the fewest real tokens (ties: the later bin), increasing.
fn least_filled(costs: &[BinCost], count: usize) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..costs.len() as u32).collect();
    let order = |a: &u32, b: &u32| {
        costs[*a as usize]
            .real
            .cmp(&costs[*b as usize].real)
            .then(b.cmp(a))
    };
    if count < ids.len() {
        ids.select_nth_unstable_by(count, order);
        ids.truncate(count);
    }
    ids.sort_unstable();
    ids
}

/// Where bins may be cut: between any two segments, or, for a packing with groups (the
/// bins held), only between groups.
#[derive(Clone, Copy)]
struct Grouped<'a>(Option<&'a Bins>);

impl<'a> Grouped<'a> {
    /// Positions inside bin `lo..hi` where it may be cut (before segment `j`, `lo < j < hi`).
    fn positions(self, lo: i64, hi: i64) -> impl Iterator<Item = usize> + 'a {
        (lo + 1..hi)
            .map(|j| j as usize)
            .filter(move |&j| self.0.is_none_or(|bins| bins.may_cut_before(j)))
    }

    fn count(self, lo: i64, hi: i64) -> u64 {
        match self.0 {
            // An empty bin (possible in bins rebuilt from outside) adds none, not -1 as u64.
            None => (hi - lo).max(1) as u64 - 1,
            Some(_) => self.positions(lo, hi).count() as u64,
        }
    }
}

/// Bins that cutting between segments (between groups, with groups) can add.
fn cut_capacity(offsets: &[i64], grouped: Grouped<'_>) -> u64 {
    offsets.windows(2).map(|w| grouped.count(w[0], w[1])).sum()
}

/// The first `count` items of `items` in the total order `order`, in that order.
fn top<T: Copy>(mut items: Vec<T>, count: usize, order: impl Fn(&T, &T) -> Ordering) -> Vec<T> {
    if count < items.len() {
        items.select_nth_unstable_by(count, &order);
        items.truncate(count);
    }
    items.sort_unstable_by(order);
    items
}

/// Cut the longest segments into at least `shortfall` more pieces in all.
///
/// Greedy: each cut goes to the segment whose pieces are the longest (ties: the lower
/// segment), which is then cut into one piece more, as evenly as the splitter allows.
/// Returns the new segments, the bin offsets into them and the number of segments cut, or
/// `None` when all segments together have fewer than `shortfall` tokens to spare.
fn cut_sequences(packing: &Packing, shortfall: u64) -> Option<(SegmentArrays, Vec<i64>, u64)> {
    let (indices, lengths) = (&packing.indices, &packing.lengths);
    let spare: u64 = lengths.iter().map(|&l| (l as u64).saturating_sub(1)).sum();
    if spare < shortfall {
        return None;
    }
    // Each cut adds at least one piece, so only the `shortfall` longest segments are ever
    // cut (ties: the lower segment first).
    let cuttable: Vec<u32> = (0..lengths.len() as u32)
        .filter(|&j| lengths[j as usize] >= 2)
        .collect();
    let candidates = top(cuttable, shortfall as usize, |a, b| {
        lengths[*b as usize]
            .cmp(&lengths[*a as usize])
            .then(a.cmp(b))
    });
    let mut piece_size: Vec<u64> = candidates
        .iter()
        .map(|&j| lengths[j as usize] as u64)
        .collect();
    let mut heap: BinaryHeap<(u64, Reverse<u32>, usize)> = candidates
        .iter()
        .enumerate()
        .map(|(slot, &j)| (piece_size[slot], Reverse(j), slot))
        .collect();
    let mut added = 0;
    while added < shortfall {
        let Some((size, Reverse(j), slot)) = heap.pop() else {
            break;
        };
        let length = lengths[j as usize] as u64;
        let count = length.div_ceil(size);
        // The piece size of `count + 1` even pieces; when the splitter's full-pieces-first
        // cut still makes `count` pieces of that size, one token less makes more.
        let mut smaller = length.div_ceil(count + 1);
        if length.div_ceil(smaller) <= count {
            smaller -= 1;
        }
        added += length.div_ceil(smaller) - count;
        piece_size[slot] = smaller;
        if smaller >= 2 {
            heap.push((smaller, Reverse(j), slot));
        }
    }
    let mut cut_size = vec![0u64; lengths.len()];
    let mut n_cut = 0;
    for (slot, &j) in candidates.iter().enumerate() {
        if piece_size[slot] < lengths[j as usize] as u64 {
            cut_size[j as usize] = piece_size[slot];
            n_cut += 1;
        }
    }
    let total = lengths.len() + added as usize;
    let mut arrays = SegmentArrays {
        indices: Vec::with_capacity(total),
        starts: Vec::with_capacity(total),
        lengths: Vec::with_capacity(total),
    };
    // first[j]: position of the first piece of segment j (first[n]: the total).
    let mut first = Vec::with_capacity(lengths.len() + 1);
    for j in 0..lengths.len() {
        first.push(arrays.indices.len() as i64);
        let length = lengths[j] as u64;
        let size = if cut_size[j] == 0 {
            length
        } else {
            cut_size[j]
        };
        for (start, piece) in pieces(length, size.max(1)) {
            arrays.indices.push(indices[j]);
            arrays.starts.push(packing.start(j) + start as i64);
            arrays.lengths.push(piece as i64);
        }
        if length == 0 {
            // `pieces` of nothing is nothing; a zero-length segment stays one segment.
            arrays.indices.push(indices[j]);
            arrays.starts.push(packing.start(j));
            arrays.lengths.push(0);
        }
    }
    first.push(arrays.indices.len() as i64);
    let offsets = packing
        .bin_offsets
        .iter()
        .map(|&o| first[o as usize])
        .collect();
    Some((arrays, offsets, n_cut))
}

/// A candidate bin while cuts are shared out: the costliest per piece is cut next.
#[derive(Clone, Copy)]
struct Share {
    weight: f64,
    pieces: u64,
    bin: u32,
}

impl Share {
    fn per_piece(&self) -> f64 {
        self.weight / self.pieces as f64
    }
}

impl PartialEq for Share {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Share {}

impl PartialOrd for Share {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Share {
    /// Greater is cut first: the higher cost per piece, then the lower bin.
    fn cmp(&self, other: &Self) -> Ordering {
        self.per_piece()
            .total_cmp(&other.per_piece())
            .then(other.bin.cmp(&self.bin))
    }
}

/// Add `needed` bins by cutting bins between their segments.
///
/// Greedy: each new bin goes to the bin whose pieces are currently the costliest (by
/// `weights`); a bin is cut into runs of about equal tokens, each holding at least one
/// segment. That bin is always one of the `needed` costliest bins that can be cut, so only
/// those are considered. Returns the offsets to insert into each cut bin, by bin.
fn cut_bins(
    offsets: &[i64],
    lengths: &[i64],
    weights: &[f64],
    needed: usize,
    ranks: usize,
    grouped: Grouped<'_>,
) -> Result<Vec<(u32, Vec<i64>)>> {
    let n_bins = weights.len();
    let capacity = cut_capacity(offsets, grouped);
    if capacity < needed as u64 {
        let n_segments = offsets.last().copied().unwrap_or(0);
        return Err(Error::invalid(format!(
            "cannot give each of num_replicas={ranks} ranks the same number of batches: the \
             packing has {n_bins} bins holding {n_segments} sequences, and {} non-empty bins \
             would be needed{}; pass drop_last=True to leave the remainder out, use a \
             smaller max_tokens or fewer replicas",
            n_bins + needed,
            if grouped.0.is_some() {
                " (bins are cut only between atomic groups)"
            } else {
                ""
            }
        )));
    }
    // The most pieces bin `bin` can be cut into.
    let count = |bin: usize| 1 + grouped.count(offsets[bin], offsets[bin + 1]);
    let splittable: Vec<u32> = (0..n_bins as u32)
        .filter(|&b| count(b as usize) >= 2)
        .collect();
    let candidates = top(splittable, needed, |a, b| {
        weights[*b as usize]
            .total_cmp(&weights[*a as usize])
            .then(a.cmp(b))
    });
    let mut heap: BinaryHeap<Share> = candidates
        .iter()
        .map(|&bin| Share {
            weight: weights[bin as usize],
            pieces: 1,
            bin,
        })
        .collect();
    let mut pieces_of: Vec<(u32, u64)> = Vec::with_capacity(needed);
    for _ in 0..needed {
        let Some(mut share) = heap.pop() else {
            break;
        };
        share.pieces += 1;
        if share.pieces < count(share.bin as usize) {
            heap.push(share);
        } else {
            pieces_of.push((share.bin, share.pieces));
        }
    }
    pieces_of.extend(heap.into_iter().map(|share| (share.bin, share.pieces)));
    pieces_of.retain(|&(_, pieces)| pieces > 1);
    pieces_of.sort_unstable();
    Ok(pieces_of
        .into_iter()
        .map(|(bin, pieces)| {
            let (lo, hi) = (offsets[bin as usize], offsets[bin as usize + 1]);
            // The bin's units: runs of segments between the positions where it may be cut.
            let starts: Vec<usize> = std::iter::once(lo as usize)
                .chain(grouped.positions(lo, hi))
                .collect();
            let units: Vec<i64> = starts
                .iter()
                .zip(starts.iter().skip(1).copied().chain([hi as usize]))
                .map(|(&a, b)| lengths[a..b].iter().sum())
                .collect();
            let cuts = cut_points(&units, pieces as usize);
            (
                bin,
                cuts.into_iter().map(|cut| starts[cut] as i64).collect(),
            )
        })
        .collect())
}

/// The offsets and costs of the bins after cutting bin `b` at the offsets `cuts[b]`
/// (`cuts` sorted by bin); `costs_of` gives the costs of the pieces from their offsets.
/// Bins not cut keep their costs.
fn apply_cuts(
    offsets: &[i64],
    costs: &[BinCost],
    cuts: &[(u32, Vec<i64>)],
    costs_of: impl Fn(&[i64]) -> Vec<BinCost>,
) -> (Vec<i64>, Vec<BinCost>) {
    let added: usize = cuts.iter().map(|(_, at)| at.len()).sum();
    let mut new_offsets = Vec::with_capacity(offsets.len() + added);
    let mut new_costs = Vec::with_capacity(costs.len() + added);
    let mut next = cuts.iter().peekable();
    for (bin, &cost) in costs.iter().enumerate() {
        let lo = offsets[bin];
        match next.next_if(|(b, _)| *b as usize == bin) {
            Some((_, at)) => {
                let mut pieces = Vec::with_capacity(at.len() + 2);
                pieces.push(lo);
                pieces.extend_from_slice(at);
                pieces.push(offsets[bin + 1]);
                new_offsets.extend_from_slice(&pieces[..pieces.len() - 1]);
                new_costs.extend(costs_of(&pieces));
            }
            None => {
                new_offsets.push(lo);
                new_costs.push(cost);
            }
        }
    }
    new_offsets.push(offsets.last().copied().unwrap_or(0));
    (new_offsets, new_costs)
}

/// Positions strictly inside `1..lengths.len()` that cut a bin into `pieces` runs of about
/// equal tokens, each holding at least one segment: piece `p` ends at the first segment
/// where the running total reaches `p / pieces` of the bin's tokens.
pub(super) fn cut_points(lengths: &[i64], pieces: usize) -> Vec<usize> {
    let count = lengths.len();
    let mut running = Vec::with_capacity(count);
    let mut total = 0u128;
    for &length in lengths {
        total += length as u128;
        running.push(total);
    }
    let n = pieces as u128;
    let mut cuts = Vec::with_capacity(pieces - 1);
    let mut previous = 0;
    for piece in 1..pieces {
        let reached = running.partition_point(|&sum| sum * n < total * piece as u128);
        let cut = (reached + 1)
            .max(previous + 1)
            .min(count - (pieces - piece));
        cuts.push(cut);
        previous = cut;
    }
    cuts
}

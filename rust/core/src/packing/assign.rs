//! Assigning segments to bins. Each function walks the segment costs in offer order once
//! and returns, for each offer position, the bin it went to, plus the size and cost of
//! every bin (which the assignment knows anyway, so that the layout need not count them).

use super::capacity_index::{BestFitIndex, FirstFitIndex, OpenBin};
use super::options::{Algorithm, PackOptions};
use crate::buffers::with_capacity_huge;

/// Bin of each offer position, and what each bin holds.
pub struct Assignment {
    pub bin_of: Vec<u32>,
    pub bins: BinTotals,
}

/// Segments and budget cost of every bin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BinTotals {
    /// Segments in each bin.
    pub sizes: Vec<u32>,
    /// Sum of the costs of each bin's segments.
    pub costs: Vec<u64>,
}

impl BinTotals {
    /// Totals for `n_bins` bins, all empty until [`set`](Self::set).
    fn new(n_bins: usize) -> Self {
        Self {
            sizes: vec![0; n_bins],
            costs: vec![0; n_bins],
        }
    }

    /// Bins whose remaining capacity out of `capacity` is `remaining`, after `size`
    /// segments.
    #[inline]
    fn set(&mut self, bin: u32, size: u32, remaining: u64, capacity: u64) {
        self.sizes[bin as usize] = size;
        self.costs[bin as usize] = capacity - remaining;
    }

    /// Number of bins.
    pub fn len(&self) -> usize {
        self.sizes.len()
    }
}

/// Assign with the packing algorithm of `options`.
pub fn run(costs: impl Iterator<Item = u64>, n: usize, options: &PackOptions) -> Assignment {
    match options.algorithm {
        Algorithm::BestFitDecreasing => best_fit(best_fit_index(n, options), costs, n, options),
        Algorithm::FirstFitDecreasing | Algorithm::FirstFitShuffled => first_fit(costs, n, options),
        Algorithm::NextFit => next_fit(costs, n, options),
    }
}

/// The best-fit index for `n` segments under `options` (see [`BestFitIndex::for_input`]).
pub fn best_fit_index(n: usize, options: &PackOptions) -> BestFitIndex {
    BestFitIndex::for_input(options.max_tokens, n)
}

/// Best fit: each segment goes to the open bin it leaves with the least room. `index`
/// starts empty; which kind it is changes the speed, never the result.
pub fn best_fit(
    mut index: BestFitIndex,
    costs: impl Iterator<Item = u64>,
    n: usize,
    options: &PackOptions,
) -> Assignment {
    let capacity = options.max_tokens;
    let mut n_bins = 0u32;
    let mut bin_of = with_capacity_huge(n);
    let mut closed = Vec::new();
    for cost in costs {
        let (remaining, open) = index.take_best_or_open(cost, capacity, &mut n_bins);
        let count = open.count + 1;
        if u64::from(count) < options.max_seqs {
            index.insert(remaining - cost, OpenBin { count, ..open });
        } else {
            closed.push((remaining - cost, OpenBin { count, ..open }));
        }
        bin_of.push(open.bin);
    }
    Assignment {
        bin_of,
        bins: best_fit_totals(index, closed, n_bins, capacity),
    }
}

/// The totals of the bins still in `index` and of the `closed` ones, each with its
/// remaining capacity.
fn best_fit_totals(
    index: BestFitIndex,
    closed: Vec<(u64, OpenBin)>,
    n_bins: u32,
    capacity: u64,
) -> BinTotals {
    let mut totals = BinTotals::new(n_bins as usize);
    let mut set = |remaining: u64, open: OpenBin| {
        totals.set(open.bin, open.count, remaining, capacity);
    };
    for (remaining, open) in closed {
        set(remaining, open);
    }
    index.drain(set);
    totals
}

/// Best fit over segments sorted by decreasing cost, given as `(cost, count)` runs.
///
/// Makes exactly the choices of [`best_fit`] (the same bins, in the same order) but
/// handles many segments per search:
/// - when the best bin can still take another segment of the run after this one, it is
///   again the best bin for the next (every capacity in `[cost, remaining)` is empty), so
///   it takes `remaining / cost` segments at once;
/// - otherwise each bin of its capacity class takes one segment and drops below `cost`,
///   out of the run's reach: the whole stack moves down without further searches.
pub fn best_fit_runs(
    mut index: BestFitIndex,
    runs: &[(u64, u32)],
    n: usize,
    options: &PackOptions,
) -> Assignment {
    let capacity = options.max_tokens;
    let max_seqs = options.max_seqs;
    let mut n_bins = 0u32;
    let mut bin_of: Vec<u32> = with_capacity_huge(n);
    let mut closed = Vec::new();
    for &(cost, count) in runs {
        let mut left = u64::from(count);
        while left > 0 {
            let (remaining, open) = index.take_best_or_open(cost, capacity, &mut n_bins);
            let fits = remaining.checked_div(cost).unwrap_or(u64::MAX);
            let slots = max_seqs - u64::from(open.count);
            if fits >= 2 || slots == 1 || left == 1 {
                let take = left.min(fits).min(slots);
                bin_of.extend(std::iter::repeat_n(open.bin, take as usize));
                left -= take;
                let count = open.count + take as u32;
                let left_over = remaining - take * cost;
                if u64::from(count) < max_seqs {
                    index.insert(left_over, OpenBin { count, ..open });
                } else {
                    closed.push((left_over, OpenBin { count, ..open }));
                }
                continue;
            }
            // One segment per bin, for this bin and the rest of its capacity class.
            let to = remaining - cost;
            let mut place = |open: OpenBin| {
                bin_of.push(open.bin);
                let grown = OpenBin {
                    count: open.count + 1,
                    ..open
                };
                if u64::from(grown.count) < max_seqs {
                    return Some(grown);
                }
                closed.push((to, grown));
                None
            };
            if let Some(kept) = place(open) {
                index.insert(to, kept);
            }
            left -= 1;
            left -= index.transfer(remaining, to, left, place);
        }
    }
    Assignment {
        bin_of,
        bins: best_fit_totals(index, closed, n_bins, capacity),
    }
}

/// First fit: each segment goes to the lowest-numbered open bin with room for it.
pub fn first_fit(costs: impl Iterator<Item = u64>, n: usize, options: &PackOptions) -> Assignment {
    let mut index = FirstFitIndex::new();
    let mut bin_of = with_capacity_huge(n);
    for cost in costs {
        let (bin, remaining) = index.find_or_open(cost, options.max_tokens);
        index.place(bin, 1, remaining - cost, options.max_seqs);
        bin_of.push(bin);
    }
    Assignment {
        bin_of,
        bins: first_fit_totals(&index, options.max_tokens),
    }
}

/// First fit over segments sorted by decreasing cost, given as `(cost, count)` runs.
///
/// Makes exactly the choices of [`first_fit`]: a bin that still has room for another
/// segment of the run stays the lowest-numbered bin with room (every earlier bin had
/// less than `cost` left), so it takes as many as fit in one step.
pub fn first_fit_runs(runs: &[(u64, u32)], n: usize, options: &PackOptions) -> Assignment {
    let mut index = FirstFitIndex::new();
    let mut bin_of = with_capacity_huge(n);
    for &(cost, count) in runs {
        let mut left = u64::from(count);
        while left > 0 {
            let (bin, remaining) = index.find_or_open(cost, options.max_tokens);
            let fits = remaining.checked_div(cost).unwrap_or(u64::MAX);
            let take = left.min(fits).min(options.max_seqs - index.count(bin));
            bin_of.extend(std::iter::repeat_n(bin, take as usize));
            left -= take;
            index.place(bin, take, remaining - take * cost, options.max_seqs);
        }
    }
    Assignment {
        bin_of,
        bins: first_fit_totals(&index, options.max_tokens),
    }
}

/// Segments and cost of every bin `index` opened, bins of `capacity`.
fn first_fit_totals(index: &FirstFitIndex, capacity: u64) -> BinTotals {
    BinTotals {
        sizes: index.counts().iter().map(|&count| count as u32).collect(),
        costs: index
            .remaining()
            .iter()
            .map(|&left| capacity - left)
            .collect(),
    }
}

/// Next fit: one open bin, closed as soon as a segment does not fit.
pub fn next_fit(costs: impl Iterator<Item = u64>, n: usize, options: &PackOptions) -> Assignment {
    let mut bin_of = with_capacity_huge(n);
    let mut bins = BinTotals::new(0);
    let mut remaining = 0u64;
    let mut count = u64::MAX;
    for cost in costs {
        if bins.len() == 0 || cost > remaining || count >= options.max_seqs {
            bins.sizes.push(0);
            bins.costs.push(0);
            remaining = options.max_tokens;
            count = 0;
        }
        remaining -= cost;
        count += 1;
        let last = bins.len() - 1;
        bins.sizes[last] += 1;
        bins.costs[last] += cost;
        bin_of.push(last as u32);
    }
    Assignment { bin_of, bins }
}

/// Padded batching (fairseq's `batch_by_size`): consecutive segments (sorted by
/// decreasing cost) share a batch while `count x longest` stays within the budget.
/// Returns the assignment and each batch's padded cost.
pub fn padded(
    costs: impl Iterator<Item = u64>,
    n: usize,
    options: &PackOptions,
) -> (Assignment, Vec<u64>) {
    let mut bin_of = with_capacity_huge(n);
    let mut bins = BinTotals::new(0);
    let mut batch_cost: Vec<u64> = Vec::new();
    let mut longest = 0u64;
    let mut count = 0u64;
    for cost in costs {
        let grown_longest = longest.max(cost);
        let fits = !batch_cost.is_empty()
            && count < options.max_seqs
            && (count + 1).saturating_mul(grown_longest) <= options.max_tokens;
        if fits {
            longest = grown_longest;
            count += 1;
        } else {
            batch_cost.push(0);
            bins.sizes.push(0);
            bins.costs.push(0);
            longest = cost;
            count = 1;
        }
        let last = batch_cost.len() - 1;
        batch_cost[last] = count * longest;
        bins.sizes[last] += 1;
        bins.costs[last] += cost;
        bin_of.push(last as u32);
    }
    (Assignment { bin_of, bins }, batch_cost)
}

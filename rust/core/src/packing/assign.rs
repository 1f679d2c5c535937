//! Assigning segments to bins. Each function walks `order` once and returns, for each
//! position in `order`, the bin it went to, plus the number of bins.

use super::capacity_index::{BestFitIndex, FirstFitIndex};
use super::options::PackOptions;
use super::segments::Segments;

/// Bin of each position of `order`, and the number of bins.
pub struct Assignment {
    pub bin_of: Vec<u32>,
    pub n_bins: usize,
}

/// Best fit: each segment goes to the open bin it leaves with the least room.
pub fn best_fit(segments: &Segments, order: &[u32], options: &PackOptions) -> Assignment {
    let capacity = options.max_tokens;
    let mut index = BestFitIndex::new(capacity);
    let mut counts: Vec<u64> = Vec::new();
    let mut bin_of = Vec::with_capacity(order.len());
    for &id in order {
        let cost = options.cost(u64::from(segments.lengths[id as usize]));
        let (remaining, bin) = match index.take_best(cost) {
            Some(found) => found,
            None => {
                counts.push(0);
                (capacity, (counts.len() - 1) as u32)
            }
        };
        let count = &mut counts[bin as usize];
        *count += 1;
        if *count < options.max_seqs {
            index.insert(remaining - cost, bin);
        }
        bin_of.push(bin);
    }
    Assignment {
        bin_of,
        n_bins: counts.len(),
    }
}

/// First fit: each segment goes to the lowest-numbered open bin with room for it.
pub fn first_fit(segments: &Segments, order: &[u32], options: &PackOptions) -> Assignment {
    let capacity = options.max_tokens;
    let mut index = FirstFitIndex::new();
    let mut counts: Vec<u64> = Vec::new();
    let mut bin_of = Vec::with_capacity(order.len());
    for &id in order {
        let cost = options.cost(u64::from(segments.lengths[id as usize]));
        let (bin, remaining) = match index.first_fit(cost) {
            Some(found) => found,
            None => {
                counts.push(0);
                (index.open(capacity), capacity)
            }
        };
        let count = &mut counts[bin as usize];
        *count += 1;
        let still_open = *count < options.max_seqs;
        index.update(bin, still_open.then_some(remaining - cost));
        bin_of.push(bin);
    }
    Assignment {
        bin_of,
        n_bins: counts.len(),
    }
}

/// Next fit: one open bin, closed as soon as a segment does not fit.
pub fn next_fit(segments: &Segments, order: &[u32], options: &PackOptions) -> Assignment {
    let mut bin_of = Vec::with_capacity(order.len());
    let mut n_bins = 0usize;
    let mut remaining = 0u64;
    let mut count = u64::MAX;
    for &id in order {
        let cost = options.cost(u64::from(segments.lengths[id as usize]));
        if n_bins == 0 || cost > remaining || count >= options.max_seqs {
            n_bins += 1;
            remaining = options.max_tokens;
            count = 0;
        }
        remaining -= cost;
        count += 1;
        bin_of.push((n_bins - 1) as u32);
    }
    Assignment { bin_of, n_bins }
}

/// Padded batching (fairseq's `batch_by_size`): consecutive segments of `order` (sorted by
/// decreasing cost) share a batch while `count x longest` stays within the budget.
/// Returns the assignment and each batch's padded cost.
pub fn padded(segments: &Segments, order: &[u32], options: &PackOptions) -> (Assignment, Vec<u64>) {
    let mut bin_of = Vec::with_capacity(order.len());
    let mut batch_cost: Vec<u64> = Vec::new();
    let mut longest = 0u64;
    let mut count = 0u64;
    for &id in order {
        let cost = options.cost(u64::from(segments.lengths[id as usize]));
        let grown_longest = longest.max(cost);
        let fits = !batch_cost.is_empty()
            && count < options.max_seqs
            && (count + 1).saturating_mul(grown_longest) <= options.max_tokens;
        if fits {
            longest = grown_longest;
            count += 1;
        } else {
            batch_cost.push(0);
            longest = cost;
            count = 1;
        }
        if let Some(last) = batch_cost.last_mut() {
            *last = count * longest;
        }
        bin_of.push((batch_cost.len() - 1) as u32);
    }
    let n_bins = batch_cost.len();
    (Assignment { bin_of, n_bins }, batch_cost)
}

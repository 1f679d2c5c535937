//! The order in which segments are offered to the bins.

use super::options::PackOptions;
use super::segments::Segments;
use crate::rng::{mix_seed, SplitMix64};

/// Budgets up to this size are sorted by counting (one pass, a histogram of this many
/// counters); larger ones fall back to a comparison sort.
const COUNTING_SORT_MAX_KEYS: u64 = 1 << 22;

/// Segment ids by decreasing cost, ties by increasing id (a stable, unique order).
pub fn decreasing_cost(segments: &Segments, options: &PackOptions) -> Vec<u32> {
    let n = segments.len();
    let capacity = options.capacity();
    if capacity <= COUNTING_SORT_MAX_KEYS.max(n as u64) {
        // Bucket by cost / k: costs are multiples of k, so this keeps the histogram small.
        let k = options.pad_to_multiple_of;
        let n_keys = (capacity / k) as usize + 1;
        let key = |length: u32| (options.cost(u64::from(length)) / k) as usize;
        let mut next_slot = vec![0u32; n_keys];
        for &length in &segments.lengths {
            next_slot[key(length)] += 1;
        }
        // Largest key first: exclusive prefix sums from the top.
        let mut offset = 0u32;
        for slot in next_slot.iter_mut().rev() {
            let count = *slot;
            *slot = offset;
            offset += count;
        }
        let mut order = vec![0u32; n];
        for (id, &length) in segments.lengths.iter().enumerate() {
            let slot = &mut next_slot[key(length)];
            order[*slot as usize] = id as u32;
            *slot += 1;
        }
        order
    } else {
        let mut order: Vec<u32> = (0..n as u32).collect();
        order.sort_by_key(|&id| std::cmp::Reverse(segments.lengths[id as usize]));
        order
    }
}

/// Segment ids in input order.
pub fn input_order(segments: &Segments) -> Vec<u32> {
    (0..segments.len() as u32).collect()
}

/// Segment ids in a random order that depends only on `seed`.
pub fn shuffled(segments: &Segments, seed: u64) -> Vec<u32> {
    let mut order = input_order(segments);
    SplitMix64::new(mix_seed(&[seed])).shuffle(&mut order);
    order
}

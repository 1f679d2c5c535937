//! Dealing bins into steps: bins of similar cost side by side, then shuffled.
//!
//! Bins are ordered once by decreasing cost (ties by increasing index) and every
//! `num_replicas` neighbours of that order form a step, so the ranks of one step run
//! bins of about the same cost. Each epoch shuffles the bins within every run of equal
//! cost (so that the grouping still changes between epochs), the order of steps, and which
//! rank gets which bin of a step: three unrelated streams of [`SplitMix64`].

use rayon::prelude::*;

use super::costs::BinCost;
use super::{stream, DealOptions};
use crate::rng::{mix_seed, SplitMix64};

/// Bins to deal (all but `dropped`, which is increasing) by decreasing balance cost, ties
/// by increasing index; and the start of every run of equal cost, then the count. Without
/// a balance, bins keep their packing order and form one run.
pub fn order_by_cost(
    costs: &[BinCost],
    dropped: &[u32],
    options: &DealOptions,
) -> (Vec<u32>, Vec<u32>) {
    let mut is_dropped = vec![false; costs.len()];
    for &bin in dropped {
        is_dropped[bin as usize] = true;
    }
    let kept = (0..costs.len() as u32).filter(|&b| !is_dropped[b as usize]);
    let Some(kind) = options.balance else {
        let order: Vec<u32> = kept.collect();
        let groups = vec![0, order.len() as u32];
        return (order, groups);
    };
    let per_attention = options.flops_per_attention();
    // One u128 per bin: the inverted cost above the index, so that increasing keys are
    // decreasing costs with ties by increasing index: a total order, whatever the sort.
    let mut keys: Vec<u128> = kept
        .map(|b| (u128::from(!costs[b as usize].key(kind, per_attention)) << 32) | u128::from(b))
        .collect();
    keys.par_sort_unstable();
    let order: Vec<u32> = keys.iter().map(|&key| key as u32).collect();
    let mut groups = Vec::new();
    for (position, pair) in keys.windows(2).enumerate() {
        if pair[0] >> 32 != pair[1] >> 32 {
            groups.push(position as u32 + 1);
        }
    }
    let mut starts = Vec::with_capacity(groups.len() + 2);
    starts.push(0);
    starts.extend(groups);
    starts.push(order.len() as u32);
    (order, starts)
}

/// The `(n_steps x num_replicas)` table of bins of one epoch, row-major; `seed` is the
/// epoch's seed.
pub fn table(order: &[u32], groups: &[u32], options: &DealOptions, seed: u64) -> Vec<i64> {
    let ranks = options.num_replicas;
    if !options.shuffle {
        return order.iter().map(|&b| i64::from(b)).collect();
    }
    let mut shuffled = order.to_vec();
    let mut ties = SplitMix64::new(mix_seed(&[seed, stream::TIES]));
    for run in groups.windows(2) {
        if run[1] - run[0] > 1 {
            ties.shuffle(&mut shuffled[run[0] as usize..run[1] as usize]);
        }
    }
    let n_steps = shuffled.len() / ranks;
    let mut step_order: Vec<u32> = (0..n_steps as u32).collect();
    SplitMix64::new(mix_seed(&[seed, stream::STEPS])).shuffle(&mut step_order);
    let mut rank_order = SplitMix64::new(mix_seed(&[seed, stream::RANKS]));
    let mut table = Vec::with_capacity(shuffled.len());
    for &step in &step_order {
        let start = table.len();
        let source = step as usize * ranks;
        table.extend(
            shuffled[source..source + ranks]
                .iter()
                .map(|&b| i64::from(b)),
        );
        rank_order.shuffle(&mut table[start..]);
    }
    table
}

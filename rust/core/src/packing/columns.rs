//! Packing units against several budgets at once, and padded batching of units.
//!
//! Units that cost more than tokens are offered first, by decreasing *size*: the largest
//! share of a budget any of their columns takes, `max_c cost_c / budget_c` (compared
//! exactly as integers, rounded down to a multiple of 2^-32), ties by input order. Each
//! goes to the lowest-numbered open bin where every column fits (first fit), found in a
//! segment tree that keeps, per node, the largest remaining capacity of each column among
//! its bins. A node whose maxima do not all fit holds no fitting bin; one whose maxima fit
//! may still hold none (the maxima can come from different bins), and the search then
//! backtracks. Units that cost only tokens follow, by best fit on the token column.

use rayon::prelude::*;

use super::assign::BinTotals;
use super::capacity_index::{BestFitIndex, OpenBin};
use super::units::Units;

/// A max segment tree over bins (in the order they were opened), with one value per
/// column: remaining capacity + 1, so that 0 marks a bin not opened yet.
struct ColumnTree {
    columns: usize,
    leaves: usize,
    max: Vec<u64>,
}

impl ColumnTree {
    fn new(columns: usize) -> Self {
        Self {
            columns,
            leaves: 1,
            max: vec![0; 2 * columns],
        }
    }

    #[inline]
    fn node(&self, node: usize) -> &[u64] {
        &self.max[node * self.columns..(node + 1) * self.columns]
    }

    #[inline]
    fn fits(&self, node: usize, need: &[u64]) -> bool {
        self.node(node)
            .iter()
            .zip(need)
            .all(|(&room, &cost)| room > cost)
    }

    /// The lowest-numbered bin whose every column has room for `need`.
    fn first_fit(&self, need: &[u64]) -> Option<usize> {
        let mut stack = vec![1usize];
        while let Some(node) = stack.pop() {
            if !self.fits(node, need) {
                continue;
            }
            if node >= self.leaves {
                return Some(node - self.leaves);
            }
            stack.push(2 * node + 1);
            stack.push(2 * node);
        }
        None
    }

    /// Set bin `bin`'s remaining capacities (+ 1) to `room`, growing the tree if need be.
    fn set(&mut self, bin: usize, room: &[u64]) {
        while bin >= self.leaves {
            self.grow();
        }
        let m = self.columns;
        let mut node = bin + self.leaves;
        self.max[node * m..(node + 1) * m].copy_from_slice(room);
        while node > 1 {
            node /= 2;
            for c in 0..m {
                let value = self.max[2 * node * m + c].max(self.max[(2 * node + 1) * m + c]);
                self.max[node * m + c] = value;
            }
        }
    }

    /// Double the leaves, keeping the bins.
    fn grow(&mut self) {
        let m = self.columns;
        let leaves = self.leaves * 2;
        let mut max = vec![0u64; 2 * leaves * m];
        max[leaves * m..(leaves + self.leaves) * m]
            .copy_from_slice(&self.max[self.leaves * m..2 * self.leaves * m]);
        for node in (1..leaves).rev() {
            for c in 0..m {
                max[node * m + c] = max[2 * node * m + c].max(max[(2 * node + 1) * m + c]);
            }
        }
        self.leaves = leaves;
        self.max = max;
    }
}

/// Size of a unit: its largest share of a budget, in units of 2^-32 of the budget.
#[inline]
fn size(cost: &[u64], budgets: &[u64]) -> u64 {
    cost.iter()
        .zip(budgets)
        .map(|(&c, &b)| (u128::from(c) << 32) / u128::from(b))
        .max()
        .unwrap_or(0) as u64
}

/// First-fit decreasing by size over every column, then best fit for the units that
/// cost only column 0: the bin of each unit, and the units and column-0 cost of each bin.
///
/// Units that cost only tokens (text beside images) fit wherever tokens fit, so they go
/// last, by decreasing tokens, each to the bin with the least token room that holds it,
/// as `tb.pack` places sequences. Offered among the others, they fill bins' token room
/// while leaving their other columns free, and the first-fit search then meets nodes whose
/// maxima come from different bins at every step.
pub fn first_fit_columns(units: &Units) -> (Vec<u32>, BinTotals) {
    let m = units.columns();
    let mut order: Vec<(bool, u64, u32)> = (0..units.len() as u32)
        .into_par_iter()
        .map(|u| {
            let cost = units.cost(u as usize);
            let tokens_only = cost[1..].iter().all(|&c| c == 0);
            (tokens_only, u64::MAX - size(cost, &units.budgets), u)
        })
        .collect();
    order.par_sort_unstable();
    let tokens_only = order.partition_point(|&(only, _, _)| !only);
    let mut tree = ColumnTree::new(m);
    let mut room = vec![0u64; m];
    let mut bin_of = vec![0u32; units.len()];
    let mut totals = BinTotals {
        sizes: Vec::new(),
        costs: Vec::new(),
    };
    for &(_, _, u) in &order[..tokens_only] {
        let need = units.cost(u as usize);
        let bin = match tree.first_fit(need) {
            Some(bin) => {
                room.copy_from_slice(tree.node(bin + tree.leaves));
                bin
            }
            None => {
                for (r, &b) in room.iter_mut().zip(&units.budgets) {
                    *r = b + 1;
                }
                totals.sizes.push(0);
                totals.costs.push(0);
                totals.len() - 1
            }
        };
        totals.sizes[bin] += 1;
        totals.costs[bin] += need[0];
        for (r, &c) in room.iter_mut().zip(need) {
            *r -= c;
        }
        tree.set(bin, &room);
        bin_of[u as usize] = bin as u32;
    }
    let budget = units.budgets[0];
    let mut index = BestFitIndex::for_input(budget, order.len() - tokens_only);
    for bin in 0..totals.len() {
        let open = OpenBin {
            bin: bin as u32,
            count: 0,
        };
        index.insert(tree.node(bin + tree.leaves)[0] - 1, open);
    }
    let mut n_bins = totals.len() as u32;
    for &(_, _, u) in &order[tokens_only..] {
        let need = units.cost(u as usize)[0];
        let (remaining, open) = index.take_best_or_open(need, budget, &mut n_bins);
        if open.bin as usize == totals.len() {
            totals.sizes.push(0);
            totals.costs.push(0);
        }
        totals.sizes[open.bin as usize] += 1;
        totals.costs[open.bin as usize] += need;
        index.insert(remaining - need, open);
        bin_of[u as usize] = open.bin;
    }
    (bin_of, totals)
}

/// Padded batching of units: units by decreasing longest member cost (ties by input
/// order) share a batch while `members x longest` stays within `max_tokens` and the
/// members within `max_seqs`. The bin of each unit, the units and column-0 cost of each
/// batch, and each batch's padded cost.
pub fn padded_units(
    units: &Units,
    longest: &[u64],
    max_tokens: u64,
    max_seqs: u64,
) -> (Vec<u32>, BinTotals, Vec<u64>) {
    let mut order: Vec<(u64, u32)> = (0..units.len() as u32)
        .map(|u| (u64::MAX - longest[u as usize], u))
        .collect();
    order.par_sort_unstable();
    let mut bin_of = vec![0u32; units.len()];
    let mut batch_cost: Vec<u64> = Vec::new();
    let mut totals = BinTotals {
        sizes: Vec::new(),
        costs: Vec::new(),
    };
    let (mut batch_longest, mut count) = (0u64, 0u64);
    for &(_, u) in &order {
        let members = units.members(u as usize).len() as u64;
        let grown_longest = batch_longest.max(longest[u as usize]);
        let grown_count = count + members;
        let fits = !batch_cost.is_empty()
            && grown_count <= max_seqs
            && grown_count.saturating_mul(grown_longest) <= max_tokens;
        if fits {
            batch_longest = grown_longest;
            count = grown_count;
        } else {
            batch_cost.push(0);
            totals.sizes.push(0);
            totals.costs.push(0);
            batch_longest = longest[u as usize];
            count = members;
        }
        let last = batch_cost.len() - 1;
        batch_cost[last] = count * batch_longest;
        totals.sizes[last] += 1;
        totals.costs[last] += units.tokens(u as usize);
        bin_of[u as usize] = last as u32;
    }
    (bin_of, totals, batch_cost)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_finds_the_first_bin_where_every_column_fits() {
        let mut tree = ColumnTree::new(2);
        // Bin 0 has token room but no image room; bin 1 image room but no token room;
        // bin 2 both.
        tree.set(0, &[11, 1]);
        tree.set(1, &[2, 5]);
        tree.set(2, &[9, 3]);
        assert_eq!(tree.first_fit(&[5, 1]), Some(2));
        assert_eq!(tree.first_fit(&[5, 0]), Some(0));
        assert_eq!(tree.first_fit(&[1, 4]), Some(1));
        assert_eq!(tree.first_fit(&[9, 0]), Some(0));
        assert_eq!(tree.first_fit(&[11, 0]), None);
        // Bins not opened never match, even a unit that costs nothing.
        assert_eq!(ColumnTree::new(1).first_fit(&[0]), None);
    }

    #[test]
    fn size_is_the_largest_share_of_a_budget() {
        assert_eq!(size(&[4, 1], &[8, 4]), 1 << 31);
        assert_eq!(size(&[1, 3], &[8, 4]), 3 << 30);
        assert_eq!(size(&[0, 0], &[8, 4]), 0);
    }
}

//! Look-up structures for the bins that are still open.
//!
//! Best fit needs "the open bin with the smallest remaining capacity that is at least c".
//! Remaining capacities are integers in `0..=capacity`, so when there are many segments
//! for the budget, a stack of bins per capacity value plus a 64-ary bit tree over the
//! non-empty stacks answers that in O(log64 capacity) — three word scans for a
//! 262,144-token budget. That dense index costs about 25 bytes per capacity value, so it is
//! only built while the budget is small next to the input; otherwise (a few sequences under
//! a budget of millions of tokens, a stream packer's buffer) an ordered map keyed by the
//! capacities that actually occur keeps memory and set-up proportional to the input.
//!
//! First fit needs "the lowest-numbered open bin with room for c": a max segment tree over
//! the bins answers it in O(log bins).

use std::collections::BTreeMap;

/// Budgets above this always use the ordered map (the dense index would need 400 MB).
const BUCKET_INDEX_MAX_CAPACITY: u64 = 1 << 24;

/// The dense index is built while the budget is at most this many capacity values per
/// segment packed (about 100 bytes per segment)...
const BUCKET_INDEX_VALUES_PER_SEGMENT: u64 = 4;

/// ... or at most this budget, whose dense index (400 KB) costs less to set up than the
/// smallest packing's other work.
const BUCKET_INDEX_SMALL_CAPACITY: u64 = 1 << 14;

/// A set of integers in `0..n` with "smallest member >= i" in O(log64 n).
#[derive(Debug, Clone)]
pub struct BitTree {
    /// `levels[0]` holds one bit per member; each higher level one bit per non-zero word below.
    levels: Vec<Vec<u64>>,
}

impl BitTree {
    fn new(n: usize) -> Self {
        let mut levels = Vec::new();
        let mut bits = n.max(1);
        loop {
            let words = bits.div_ceil(64);
            levels.push(vec![0u64; words]);
            if words == 1 {
                break;
            }
            bits = words;
        }
        Self { levels }
    }

    fn insert(&mut self, mut i: usize) {
        for level in &mut self.levels {
            let word = &mut level[i >> 6];
            let was_empty = *word == 0;
            *word |= 1 << (i & 63);
            if !was_empty {
                break;
            }
            i >>= 6;
        }
    }

    fn remove(&mut self, mut i: usize) {
        for level in &mut self.levels {
            let word = &mut level[i >> 6];
            *word &= !(1 << (i & 63));
            if *word != 0 {
                break;
            }
            i >>= 6;
        }
    }

    fn next_at_or_after(&self, mut i: usize) -> Option<usize> {
        let mut level = 0;
        loop {
            let words = &self.levels[level];
            let w = i >> 6;
            if w >= words.len() {
                return None;
            }
            let bits = words[w] & (!0u64 << (i & 63));
            if bits != 0 {
                i = (w << 6) | bits.trailing_zeros() as usize;
                break;
            }
            level += 1;
            if level == self.levels.len() {
                return None;
            }
            i = w + 1;
        }
        while level > 0 {
            level -= 1;
            i = (i << 6) | self.levels[level][i].trailing_zeros() as usize;
        }
        Some(i)
    }
}

/// An open bin as the best-fit index stores it: its number and how many segments it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenBin {
    pub bin: u32,
    pub count: u32,
}

/// Open bins keyed by remaining capacity, for best fit.
///
/// Among bins with equal remaining capacity the one inserted last is taken first (a
/// stack); `tokenbatch.reference` follows the same rule so results can be compared exactly.
/// Each capacity has its own small stack rather than a linked list through per-bin
/// arrays: the tops of the stacks in use stay in cache, where per-bin links would cost a
/// cache miss per segment once there are millions of bins.
#[derive(Debug, Clone)]
pub enum BestFitIndex {
    /// Bit tree over remaining capacities plus a stack of bins per capacity.
    Buckets {
        non_empty: BitTree,
        stacks: Vec<Vec<OpenBin>>,
    },
    /// Ordered map over the capacities in use, for budgets large next to the input.
    Ordered(BTreeMap<u64, Vec<OpenBin>>),
}

impl BestFitIndex {
    /// An empty index for packing `n_segments` segments into bins of `capacity`: the dense
    /// one when the budget is small next to the input, else the ordered map. Both take and
    /// give back bins in the same order, so the choice never changes a packing.
    pub fn for_input(capacity: u64, n_segments: usize) -> Self {
        let dense_limit = (n_segments as u64)
            .saturating_mul(BUCKET_INDEX_VALUES_PER_SEGMENT)
            .clamp(BUCKET_INDEX_SMALL_CAPACITY, BUCKET_INDEX_MAX_CAPACITY);
        if capacity <= dense_limit {
            Self::dense(capacity)
        } else {
            Self::sparse()
        }
    }

    /// An empty dense index for remaining capacities in `0..=capacity`.
    pub fn dense(capacity: u64) -> Self {
        let n = capacity as usize + 1;
        Self::Buckets {
            non_empty: BitTree::new(n),
            stacks: vec![Vec::new(); n],
        }
    }

    /// An empty ordered-map index (any capacity).
    pub fn sparse() -> Self {
        Self::Ordered(BTreeMap::new())
    }

    /// Add an open bin with `remaining` free capacity.
    #[inline]
    pub fn insert(&mut self, remaining: u64, open: OpenBin) {
        match self {
            Self::Buckets { non_empty, stacks } => {
                let stack = &mut stacks[remaining as usize];
                if stack.is_empty() {
                    non_empty.insert(remaining as usize);
                }
                stack.push(open);
            }
            Self::Ordered(map) => map.entry(remaining).or_default().push(open),
        }
    }

    /// Move up to `limit` bins from the top of the `from` stack, one at a time, handing
    /// each to `moved`, which returns the bin to push on the `to` stack (or `None` if the
    /// bin closed). Equivalent to `limit` rounds of `take_best` + `insert` when no bin
    /// can exist with remaining capacity in `[need, from)` and `to < need`, but without
    /// searching. Returns how many bins were moved.
    pub fn transfer(
        &mut self,
        from: u64,
        to: u64,
        limit: u64,
        mut moved: impl FnMut(OpenBin) -> Option<OpenBin>,
    ) -> u64 {
        let mut done = 0;
        match self {
            Self::Buckets { non_empty, stacks } => {
                let (from, to) = (from as usize, to as usize);
                while done < limit {
                    let Some(open) = stacks[from].pop() else {
                        break;
                    };
                    done += 1;
                    if let Some(kept) = moved(open) {
                        if stacks[to].is_empty() {
                            non_empty.insert(to);
                        }
                        stacks[to].push(kept);
                    }
                }
                if stacks[from].is_empty() {
                    non_empty.remove(from);
                }
            }
            Self::Ordered(map) => {
                let mut arrived = Vec::new();
                if let Some(stack) = map.get_mut(&from) {
                    while done < limit {
                        let Some(open) = stack.pop() else { break };
                        done += 1;
                        arrived.extend(moved(open));
                    }
                    if stack.is_empty() {
                        map.remove(&from);
                    }
                }
                if !arrived.is_empty() {
                    map.entry(to).or_default().extend(arrived);
                }
            }
        }
        done
    }

    /// [`take_best`](Self::take_best), or else a new empty bin of `capacity` numbered
    /// `*n_bins` (which then counts it).
    #[inline]
    pub fn take_best_or_open(
        &mut self,
        need: u64,
        capacity: u64,
        n_bins: &mut u32,
    ) -> (u64, OpenBin) {
        self.take_best(need).unwrap_or_else(|| {
            *n_bins += 1;
            let fresh = OpenBin {
                bin: *n_bins - 1,
                count: 0,
            };
            (capacity, fresh)
        })
    }

    /// Hand every bin left in the index to `visit`, with its remaining capacity.
    pub fn drain(self, mut visit: impl FnMut(u64, OpenBin)) {
        match self {
            Self::Buckets { stacks, .. } => {
                for (remaining, stack) in stacks.into_iter().enumerate() {
                    for open in stack {
                        visit(remaining as u64, open);
                    }
                }
            }
            Self::Ordered(map) => {
                for (remaining, stack) in map {
                    for open in stack {
                        visit(remaining, open);
                    }
                }
            }
        }
    }

    /// Remove and return the bin with the least remaining capacity that is at least `need`.
    #[inline]
    pub fn take_best(&mut self, need: u64) -> Option<(u64, OpenBin)> {
        match self {
            Self::Buckets { non_empty, stacks } => {
                if need as usize >= stacks.len() {
                    return None;
                }
                let r = non_empty.next_at_or_after(need as usize)?;
                let stack = &mut stacks[r];
                let open = stack.pop()?;
                if stack.is_empty() {
                    non_empty.remove(r);
                }
                Some((r as u64, open))
            }
            Self::Ordered(map) => {
                let (&remaining, bins) = map.range_mut(need..).next()?;
                let open = bins.pop()?;
                if bins.is_empty() {
                    map.remove(&remaining);
                }
                Some((remaining, open))
            }
        }
    }
}

/// Max segment tree over bins, for first fit. A bin's value is `remaining + 1` while it is
/// open and 0 once closed, so a closed bin never matches even a zero-cost segment.
#[derive(Debug, Clone)]
pub struct FirstFitIndex {
    leaves: usize,
    /// `u32` halves the tree (it stays in cache longer); `remaining + 1` fits because
    /// budgets are below `u32::MAX`.
    tree: Vec<u32>,
    n_bins: usize,
    /// Segments in each bin.
    counts: Vec<u64>,
    /// Remaining capacity of each bin (kept apart from the tree, which forgets it when
    /// the bin closes).
    remaining: Vec<u64>,
}

impl FirstFitIndex {
    /// An empty index.
    pub fn new() -> Self {
        let leaves = 1024;
        Self {
            leaves,
            tree: vec![0; 2 * leaves],
            n_bins: 0,
            counts: Vec::new(),
            remaining: Vec::new(),
        }
    }

    fn set(&mut self, bin: usize, value: u64) {
        let mut node = bin + self.leaves;
        self.tree[node] = value as u32;
        while node > 1 {
            node /= 2;
            let max = self.tree[2 * node].max(self.tree[2 * node + 1]);
            if self.tree[node] == max {
                break; // ancestors already hold the right maximum
            }
            self.tree[node] = max;
        }
    }

    /// Open a new bin with `remaining` capacity; returns its number.
    pub fn open(&mut self, remaining: u64) -> u32 {
        if self.n_bins == self.leaves {
            // Double the tree; amortised O(1) per bin.
            let leaves = self.leaves * 2;
            let mut tree = vec![0; 2 * leaves];
            tree[leaves..leaves + self.n_bins]
                .copy_from_slice(&self.tree[self.leaves..self.leaves + self.n_bins]);
            for node in (1..leaves).rev() {
                tree[node] = tree[2 * node].max(tree[2 * node + 1]);
            }
            self.leaves = leaves;
            self.tree = tree;
        }
        let bin = self.n_bins;
        self.n_bins += 1;
        self.counts.push(0);
        self.remaining.push(remaining);
        self.set(bin, remaining + 1);
        bin as u32
    }

    /// Update a bin's remaining capacity, or close it (`None`).
    fn update(&mut self, bin: u32, remaining: Option<u64>) {
        self.set(bin as usize, remaining.map_or(0, |r| r + 1));
    }

    /// Segments in `bin`.
    pub fn count(&self, bin: u32) -> u64 {
        self.counts[bin as usize]
    }

    /// The lowest-numbered open bin with room for `need`, or a new bin of `capacity`;
    /// with its remaining capacity.
    pub fn find_or_open(&mut self, need: u64, capacity: u64) -> (u32, u64) {
        self.first_fit(need)
            .unwrap_or_else(|| (self.open(capacity), capacity))
    }

    /// Record `take` more segments in `bin`, leaving it `remaining`; the bin closes when
    /// it holds `max_seqs`.
    pub fn place(&mut self, bin: u32, take: u64, remaining: u64, max_seqs: u64) {
        let count = &mut self.counts[bin as usize];
        *count += take;
        let still_open = *count < max_seqs;
        self.remaining[bin as usize] = remaining;
        self.update(bin, still_open.then_some(remaining));
    }

    /// Segments in every bin opened, by bin.
    pub fn counts(&self) -> &[u64] {
        &self.counts
    }

    /// Remaining capacity of every bin opened, by bin.
    pub fn remaining(&self) -> &[u64] {
        &self.remaining
    }

    /// The lowest-numbered open bin with at least `need` remaining, and its remaining capacity.
    pub fn first_fit(&self, need: u64) -> Option<(u32, u64)> {
        let want = need + 1;
        if u64::from(self.tree[1]) < want {
            return None;
        }
        let mut node = 1;
        while node < self.leaves {
            node = if u64::from(self.tree[2 * node]) >= want {
                2 * node
            } else {
                2 * node + 1
            };
        }
        Some(((node - self.leaves) as u32, u64::from(self.tree[node]) - 1))
    }
}

impl Default for FirstFitIndex {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_tree_finds_the_next_member() {
        let mut set = BitTree::new(300_000);
        for i in [5usize, 64, 4095, 4096, 262_143, 299_999] {
            set.insert(i);
        }
        assert_eq!(set.next_at_or_after(0), Some(5));
        assert_eq!(set.next_at_or_after(6), Some(64));
        assert_eq!(set.next_at_or_after(65), Some(4095));
        assert_eq!(set.next_at_or_after(4097), Some(262_143));
        set.remove(262_143);
        assert_eq!(set.next_at_or_after(4097), Some(299_999));
        set.remove(299_999);
        assert_eq!(set.next_at_or_after(4097), None);
        assert_eq!(set.next_at_or_after(1 << 30), None);
    }

    #[test]
    fn both_best_fit_indexes_agree() {
        let mut small = BestFitIndex::dense(1000);
        let mut large = BestFitIndex::sparse();
        let ops: Vec<(u64, u32)> = (0..200).map(|i| ((i * 37 % 1001) as u64, i)).collect();
        for &(r, bin) in &ops {
            small.insert(r, OpenBin { bin, count: 1 });
            large.insert(r, OpenBin { bin, count: 1 });
        }
        for need in (0..1001).step_by(7) {
            assert_eq!(small.take_best(need), large.take_best(need));
        }
    }

    #[test]
    fn first_fit_index_grows_and_closes() {
        let mut index = FirstFitIndex::new();
        for i in 0..5000u32 {
            assert_eq!(index.open(u64::from(i % 10)), i);
        }
        assert_eq!(index.first_fit(9), Some((9, 9)));
        index.update(9, None);
        assert_eq!(index.first_fit(9), Some((19, 9)));
        assert_eq!(index.first_fit(10), None);
        assert_eq!(index.first_fit(0), Some((0, 0)));
    }
}

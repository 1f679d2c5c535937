//! Epoch plans for data-parallel training: which rank runs which bin at which step.
//!
//! A plan turns a packing into a table of `n_steps x num_replicas` bins so that every rank
//! runs the same number of micro-batches, every placed segment is used exactly once, and
//! the bins that run side by side in one step cost about the same. It is computed from
//! `(packing, options, epoch)` alone: every sort and selection that can meet equal keys
//! breaks the tie by the bin or segment index, randomness comes from [`crate::rng`] only,
//! and nothing depends on the thread count, so every rank on every machine computes the
//! same plan without communicating.
//!
//! The work splits into what depends only on the packing and the options ([`Planner`]:
//! cutting bins so that their count divides by the world size, costs, the order by cost),
//! and the cheap part that changes every epoch (dealing: [`Planner::plan`]).

mod costs;
mod deal;
mod divide;
mod rest;
mod stats;

#[cfg(test)]
mod tests;

use std::str::FromStr;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::packing::{PackOptions, Packing};
use crate::rng::mix_seed;

pub use costs::{BinCost, CostKind};
pub use divide::DivideReport;
pub use rest::Run;
pub use stats::{Imbalance, PlanStats};

/// Version of the planning rules. A plan of format `n` is the same on every machine and
/// version that plans with format `n`; any change to what a rank receives bumps it, so
/// that a saved position is never restored into a different plan. Format 1 was the numpy
/// planner of tokenbatch 0.1.
pub const PLAN_FORMAT: u32 = 2;

/// How the bins of a packing were formed, which decides what a bin costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackingKind {
    /// Segments concatenated: a bin costs the sum of its (padded) segment lengths.
    Packed,
    /// Segments padded to the longest of their bin: a bin costs `count x longest`.
    Padded,
}

impl PackingKind {
    /// The name Python uses (`"packed"` or `"padded"`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Packed => "packed",
            Self::Padded => "padded",
        }
    }
}

impl FromStr for PackingKind {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        match name {
            "packed" => Ok(Self::Packed),
            "padded" => Ok(Self::Padded),
            other => Err(Error::invalid(format!(
                "kind must be 'packed' or 'padded', got '{other}'"
            ))),
        }
    }
}

/// A packing together with what its summary and its plans need to know about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bins {
    /// The CSR arrays and the oversize policy's counts.
    pub packing: Packing,
    /// The token budget of one bin.
    pub max_tokens: u64,
    /// Number of input sequences (segment indices are below it).
    pub n_seqs: u64,
    /// How bins were formed.
    pub kind: PackingKind,
    /// Fewest bins any packing of these segments could use.
    pub lower_bound: u64,
}

impl Bins {
    /// The bins of a packing made by [`crate::packing::pack`] or
    /// [`crate::packing::batch_padded`] with `options` from `n_seqs` sequences.
    pub fn new(packing: Packing, options: &PackOptions, n_seqs: usize, kind: PackingKind) -> Self {
        let lower_bound = packing.lower_bound(options);
        Self {
            packing,
            max_tokens: options.max_tokens,
            n_seqs: n_seqs as u64,
            kind,
            lower_bound,
        }
    }

    /// Check that the arrays form a packing (for bins rebuilt from outside, e.g. unpickled):
    /// offsets from 0 to the segment count, never decreasing; segments of known sequences,
    /// each token placed once; no bin over the budget.
    pub fn validate(&self) -> Result<()> {
        if self.max_tokens == 0 {
            return Err(Error::invalid("max_tokens must be at least 1, got 0"));
        }
        let p = &self.packing;
        let n = p.indices.len();
        if p.starts.len() != n || p.lengths.len() != n {
            return Err(Error::invalid(
                "indices, starts and lengths of a packing must have the same length",
            ));
        }
        if p.bin_offsets.first() != Some(&0)
            || p.bin_offsets.last().map(|&o| o as usize) != Some(n)
            || p.bin_offsets.windows(2).any(|w| w[0] > w[1])
        {
            return Err(Error::invalid(
                "bin_offsets must rise from 0 to the number of segments",
            ));
        }
        if p.bin_tokens.len() + 1 != p.bin_offsets.len() {
            return Err(Error::invalid("bin_tokens must hold one cost per bin"));
        }
        let bad_segment = (0..n).find(|&j| {
            p.indices[j] < 0
                || p.indices[j] as u64 >= self.n_seqs
                || p.starts[j] < 0
                || p.lengths[j] < 0
                || p.lengths[j] as u64 > self.max_tokens
        });
        if let Some(j) = bad_segment {
            return Err(Error::invalid(format!(
                "segment {j} (index {}, start {}, length {}) is not a segment of one of \
                 {} sequences within max_tokens={}",
                p.indices[j], p.starts[j], p.lengths[j], self.n_seqs, self.max_tokens
            )));
        }
        // Each segment fits the budget, and so must each bin (padding only adds to it).
        let over_budget = p.bin_offsets.windows(2).enumerate().find_map(|(bin, w)| {
            let tokens: u128 = p.lengths[w[0] as usize..w[1] as usize]
                .iter()
                .map(|&l| l as u128)
                .sum();
            (tokens > u128::from(self.max_tokens)).then_some((bin, tokens))
        });
        if let Some((bin, tokens)) = over_budget {
            return Err(Error::invalid(format!(
                "bin {bin} holds {tokens} tokens, more than max_tokens={}",
                self.max_tokens
            )));
        }
        if let Some((a, b)) = overlapping_segments(p, self.n_seqs) {
            return Err(Error::invalid(format!(
                "segments {a} and {b} both hold tokens of sequence {} (a packing places \
                 each token once)",
                p.indices[a]
            )));
        }
        Ok(())
    }

    /// Number of bins.
    pub fn n_bins(&self) -> usize {
        self.packing.n_bins()
    }

    /// Real (non-padding) tokens placed in bins.
    pub fn total_tokens(&self) -> u64 {
        self.packing.lengths.iter().map(|&l| l as u64).sum()
    }
}

/// Two non-empty segments of a packing (whose indices are below `n_seqs`) that hold the
/// same token of a sequence, if any: sorted by sequence and start, each segment of a
/// sequence must end where the next one starts or before. Only sequences with two segments
/// or more are sorted (a bit per sequence finds them in one pass), so checking a packing
/// that split few sequences costs two passes, not a sort of every segment.
fn overlapping_segments(p: &Packing, n_seqs: u64) -> Option<(usize, usize)> {
    let nonempty = || (0..p.indices.len()).filter(|&j| p.lengths[j] > 0);
    let word_bit = |j: usize| {
        let sequence = p.indices[j] as usize;
        (sequence / 64, 1u64 << (sequence % 64))
    };
    let mut candidates: Vec<usize> = if n_seqs <= 64 * (p.indices.len() as u64 + 1) {
        let words = n_seqs.div_ceil(64) as usize;
        let (mut seen, mut repeated) = (vec![0u64; words], vec![0u64; words]);
        for j in nonempty() {
            let (word, bit) = word_bit(j);
            repeated[word] |= seen[word] & bit;
            seen[word] |= bit;
        }
        nonempty()
            .filter(|&j| {
                let (word, bit) = word_bit(j);
                repeated[word] & bit != 0
            })
            .collect()
    } else {
        nonempty().collect()
    };
    candidates.sort_unstable_by_key(|&j| (p.indices[j], p.starts[j], j));
    candidates
        .windows(2)
        .find(|w| {
            let (a, b) = (w[0], w[1]);
            p.indices[a] == p.indices[b]
                && i128::from(p.starts[a]) + i128::from(p.lengths[a]) > i128::from(p.starts[b])
        })
        .map(|w| (w[0].min(w[1]), w[0].max(w[1])))
}

/// Options of a plan.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanOptions {
    /// Data-parallel ranks.
    pub num_replicas: usize,
    /// The same on every rank; with the epoch it selects the random order.
    pub seed: u64,
    /// Shuffle steps, ranks within a step and bins of equal cost every epoch.
    pub shuffle: bool,
    /// The cost evened out within a step (tokens, attention or FLOPs); `None` deals bins
    /// in packing order.
    pub balance: Option<CostKind>,
    /// Leave out the least-filled remainder bins instead of cutting bins.
    pub drop_last: bool,
    /// Each segment costs its length rounded up to this multiple.
    pub pad_to_multiple_of: u64,
    /// Cut sequences too when cutting bins between sequences cannot make enough bins.
    pub split_sequences: bool,
    /// The model's hidden size, for the FLOPs cost.
    pub hidden_size: Option<u64>,
}

impl Default for PlanOptions {
    fn default() -> Self {
        Self {
            num_replicas: 1,
            seed: 0,
            shuffle: true,
            balance: Some(CostKind::Attention),
            drop_last: false,
            pad_to_multiple_of: 1,
            split_sequences: false,
            hidden_size: None,
        }
    }
}

impl PlanOptions {
    /// Refuse options no plan can follow.
    pub fn validate(&self) -> Result<()> {
        if self.num_replicas == 0 {
            return Err(Error::invalid("num_replicas must be at least 1, got 0"));
        }
        if self.pad_to_multiple_of == 0 {
            return Err(Error::invalid(
                "pad_to_multiple_of must be at least 1, got 0",
            ));
        }
        if self.hidden_size == Some(0) {
            return Err(Error::invalid("hidden_size must be at least 1, got 0"));
        }
        if self.balance == Some(CostKind::Flops) && self.hidden_size.is_none() {
            return Err(Error::invalid(
                "balance='flops' needs hidden_size, the model's hidden size (it sets how much \
                 attention costs against the matmuls)",
            ));
        }
        Ok(())
    }

    /// FLOPs per unit of attention cost, in units of one token's matmul FLOPs: a layer
    /// spends 6 x 12 h^2 FLOPs per token on matmuls (forward and backward) and 6 h L^2 on
    /// causal attention over L tokens, so a sequence costs L + L^2 / (12 h).
    pub fn flops_per_attention(&self) -> Option<f64> {
        self.hidden_size.map(|h| 1.0 / (12.0 * h as f64))
    }
}

/// Seed streams of one epoch, so that the random choices are unrelated to each other.
mod stream {
    pub const TIES: u64 = 1;
    pub const STEPS: u64 = 2;
    pub const RANKS: u64 = 3;
    /// Plans that finish an epoch after a change of world size.
    pub const RESIZE: u64 = 0x7265_7369_7A65;
}

/// The epoch-independent part of the plans of one packing: bins cut or dropped so that
/// their count divides by the number of ranks, their costs, and their order by cost.
#[derive(Debug)]
pub struct Layout {
    source: Arc<Bins>,
    options: PlanOptions,
    bin_offsets: Vec<i64>,
    /// Segments after cutting sequences (`None`: those of the packing).
    cut: Option<divide::SegmentArrays>,
    costs: Vec<BinCost>,
    /// Bins dealt, by decreasing balance cost (ties by increasing index).
    order: Vec<u32>,
    /// Start of every run of equal cost in `order`, then `order.len()`.
    groups: Vec<u32>,
    report: DivideReport,
}

impl Layout {
    fn new(source: Arc<Bins>, options: PlanOptions) -> Result<Self> {
        options.validate()?;
        let divided = divide::divide(&source, &options)?;
        let (order, groups) = deal::order_by_cost(&divided.costs, &divided.dropped, &options);
        Ok(Self {
            source,
            options,
            bin_offsets: divided.bin_offsets,
            cut: divided.cut,
            costs: divided.costs,
            order,
            groups,
            report: divided.report,
        })
    }

    /// The packing these bins come from.
    pub fn source(&self) -> &Arc<Bins> {
        &self.source
    }

    /// The options of the plans.
    pub fn options(&self) -> &PlanOptions {
        &self.options
    }

    /// `n_bins + 1` offsets into the segment arrays (bins after cutting).
    pub fn bin_offsets(&self) -> &[i64] {
        &self.bin_offsets
    }

    /// Input sequence of each segment.
    pub fn indices(&self) -> &[i64] {
        self.cut
            .as_ref()
            .map_or(&self.source.packing.indices, |cut| &cut.indices)
    }

    /// Token offset of each segment in its sequence.
    pub fn starts(&self) -> &[i64] {
        self.cut
            .as_ref()
            .map_or(&self.source.packing.starts, |cut| &cut.starts)
    }

    /// Tokens of each segment.
    pub fn lengths(&self) -> &[i64] {
        self.cut
            .as_ref()
            .map_or(&self.source.packing.lengths, |cut| &cut.lengths)
    }

    /// Costs of every bin.
    pub fn costs(&self) -> &[BinCost] {
        &self.costs
    }

    /// What making the bin count divide did.
    pub fn report(&self) -> &DivideReport {
        &self.report
    }

    /// Real tokens of all bins dealt (those `drop_last` kept).
    pub fn dealt_tokens(&self) -> u64 {
        self.order
            .iter()
            .map(|&b| self.costs[b as usize].real)
            .sum()
    }

    /// Segment range of bin `bin`.
    pub fn segment_range(&self, bin: usize) -> std::ops::Range<usize> {
        self.bin_offsets[bin] as usize..self.bin_offsets[bin + 1] as usize
    }
}

/// Plans of one packing for every epoch, sharing the epoch-independent work.
#[derive(Debug, Clone)]
pub struct Planner {
    layout: Arc<Layout>,
}

impl Planner {
    /// Cut (or drop) bins so that their count divides by `options.num_replicas`, compute
    /// their costs and their order by cost.
    ///
    /// Errors when there are too few segments to give every rank the same number of
    /// non-empty bins (and `drop_last` is off), or on invalid options.
    pub fn new(bins: Arc<Bins>, options: PlanOptions) -> Result<Self> {
        Ok(Self {
            layout: Arc::new(Layout::new(bins, options)?),
        })
    }

    /// The epoch-independent part shared by the plans.
    pub fn layout(&self) -> &Arc<Layout> {
        &self.layout
    }

    /// The plan of `epoch`.
    pub fn plan(&self, epoch: u64) -> EpochPlan {
        let options = &self.layout.options;
        let seed = mix_seed(&[options.seed, epoch]);
        let steps = deal::deal(&self.layout.order, &self.layout.groups, options, seed);
        EpochPlan {
            layout: Arc::clone(&self.layout),
            steps,
            epoch,
        }
    }

    /// The plan that finishes `epoch` on this planner's number of ranks after `runs` of it
    /// on other world sizes (run `i`: `runs[i].num_replicas` ranks ran `runs[i].steps`
    /// steps). Each run's unused bins are dealt again to the next world size, so every
    /// segment of the epoch is still used exactly once.
    pub fn plan_after(&self, epoch: u64, runs: &[Run]) -> Result<EpochPlan> {
        rest::plan_after(self, epoch, runs)
    }
}

/// One epoch of data-parallel micro-batches: `steps()[s * num_replicas + r]` is the bin
/// rank `r` runs at step `s`.
#[derive(Debug, Clone)]
pub struct EpochPlan {
    layout: Arc<Layout>,
    steps: Vec<i64>,
    epoch: u64,
}

impl EpochPlan {
    /// The epoch this plan is for.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Number of ranks.
    pub fn num_replicas(&self) -> usize {
        self.layout.options.num_replicas
    }

    /// Micro-batches every rank runs.
    pub fn n_steps(&self) -> usize {
        self.steps.len() / self.num_replicas()
    }

    /// The `n_steps x num_replicas` table of bins, row-major.
    pub fn steps(&self) -> &[i64] {
        &self.steps
    }

    /// The bins and segments the table refers to.
    pub fn layout(&self) -> &Arc<Layout> {
        &self.layout
    }

    /// Check `rank` against the number of ranks.
    pub fn check_rank(&self, rank: i64) -> Result<usize> {
        if rank < 0 {
            return Err(Error::invalid(format!(
                "rank must be at least 0, got {rank}"
            )));
        }
        if rank as u64 >= self.num_replicas() as u64 {
            return Err(Error::invalid(format!(
                "rank must be smaller than num_replicas={}, got {rank}",
                self.num_replicas()
            )));
        }
        Ok(rank as usize)
    }

    /// The bin `rank` runs at `step`.
    pub fn bin_at(&self, step: usize, rank: usize) -> usize {
        self.steps[step * self.num_replicas() + rank] as usize
    }

    /// Cost of every bin of the table (row-major, like [`EpochPlan::steps`]).
    pub fn step_costs(&self, kind: CostKind) -> Result<Vec<f64>> {
        let per_attention = self.layout.options.flops_per_attention();
        if kind == CostKind::Flops && per_attention.is_none() {
            return Err(Error::invalid(
                "the flops cost needs hidden_size (the model's hidden size)",
            ));
        }
        let costs = &self.layout.costs;
        Ok(self
            .steps
            .iter()
            .map(|&b| costs[b as usize].of(kind, per_attention))
            .collect())
    }

    /// Real (non-padding) tokens of every bin of the table (row-major).
    pub fn real_tokens(&self) -> Vec<i64> {
        let costs = &self.layout.costs;
        self.steps
            .iter()
            .map(|&b| costs[b as usize].real as i64)
            .collect()
    }

    /// Real tokens of all bins of the table.
    pub fn total_real_tokens(&self) -> u64 {
        let costs = &self.layout.costs;
        self.steps.iter().map(|&b| costs[b as usize].real).sum()
    }

    /// Counts and balance of this plan.
    pub fn stats(&self) -> PlanStats {
        stats::stats(self)
    }

    /// The bins no rank has run before `step`, as a packing of their own: bins in step
    /// order, ranks in order within a step, each keeping its segments.
    pub fn rest(&self, step: usize) -> Result<Bins> {
        rest::rest(self, step)
    }
}

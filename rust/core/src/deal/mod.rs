//! Epoch deals for data-parallel training: which rank runs which bin at which step.
//!
//! A deal turns a packing into a table of `n_steps x num_replicas` bins so that every rank
//! runs the same number of micro-batches, every placed segment is used exactly once, and
//! the bins that run side by side in one step cost about the same. It is computed from
//! `(packing, options, epoch)` alone: every sort and selection that can meet equal keys
//! breaks the tie by the bin or segment index, randomness comes from [`crate::rng`] only,
//! and nothing depends on the thread count, so every rank on every machine computes the
//! same deal without communicating.
//!
//! The work splits into what depends only on the packing and the options ([`Dealer`]:
//! cutting bins so that their count divides by the world size, costs, the order by cost),
//! and the cheap part that changes every epoch (dealing: [`Dealer::deal`]).

mod costs;
mod divide;
mod evaluation;
pub mod mixture;
mod rest;
mod stats;
mod steps;

#[cfg(test)]
mod tests;

use std::sync::Arc;

use crate::error::{at_least, at_least_usize, Error, Result};
use crate::packing::Bins;
use crate::rng::mix_seed;

pub use costs::{BinCost, CostKind};
pub use divide::DivideReport;
pub use evaluation::{evaluation_table, EMPTY_SLOT};
pub use rest::Run;
pub use stats::{DealStats, Imbalance};

/// Version of the dealing rules. A deal of format `n` is the same on every machine and
/// version that deals with format `n`; any change to what a rank receives bumps it, so
/// that a saved position is never restored into a different deal.
pub const DEAL_FORMAT: u32 = 2;

/// Options of a deal.
#[derive(Debug, Clone, PartialEq)]
pub struct DealOptions {
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

impl Default for DealOptions {
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

impl DealOptions {
    /// Check and build options from the raw values a caller passes.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        num_replicas: i64,
        seed: u64,
        shuffle: bool,
        balance: Option<&str>,
        drop_last: bool,
        pad_to_multiple_of: i64,
        split_sequences: bool,
        hidden_size: Option<i64>,
    ) -> Result<Self> {
        let balance = balance
            .map(|name| {
                name.parse().map_err(|_| {
                    Error::invalid(format!(
                        "balance must be 'attention', 'tokens', 'flops' or None, got '{name}'"
                    ))
                })
            })
            .transpose()?;
        let options = Self {
            num_replicas: at_least_usize(num_replicas, 1, "num_replicas")?,
            seed,
            shuffle,
            balance,
            drop_last,
            pad_to_multiple_of: at_least(pad_to_multiple_of, 1, "pad_to_multiple_of")?,
            split_sequences,
            hidden_size: hidden_size
                .map(|h| at_least(h, 1, "hidden_size"))
                .transpose()?,
        };
        options.validate()?;
        Ok(options)
    }

    /// Refuse options no deal can follow.
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
    /// Deals that finish an epoch after a change of world size.
    pub const RESIZE: u64 = 0x7265_7369_7A65;
}

/// The epoch-independent part of the deals of one packing: bins cut or dropped so that
/// their count divides by the number of ranks, their costs, and their order by cost.
#[derive(Debug)]
pub struct Deck {
    source: Arc<Bins>,
    options: DealOptions,
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

impl Deck {
    fn new(source: Arc<Bins>, options: DealOptions) -> Result<Self> {
        options.validate()?;
        let divided = divide::divide(&source, &options)?;
        let (order, groups) = steps::order_by_cost(&divided.costs, &divided.dropped, &options);
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

    /// The options of the deals.
    pub fn options(&self) -> &DealOptions {
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

    /// Token offset of each segment in its sequence (`None`: every offset is 0).
    pub fn starts(&self) -> Option<&[i64]> {
        self.cut
            .as_ref()
            .map_or(self.source.packing.starts.as_deref(), |cut| {
                Some(&cut.starts)
            })
    }

    /// Token offset of segment `j` in its sequence.
    pub fn start(&self, j: usize) -> i64 {
        self.starts().map_or(0, |starts| starts[j])
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

/// Deals of one packing for every epoch, sharing the epoch-independent work.
#[derive(Debug, Clone)]
pub struct Dealer {
    deck: Arc<Deck>,
}

impl Dealer {
    /// Cut (or drop) bins so that their count divides by `options.num_replicas`, compute
    /// their costs and their order by cost.
    ///
    /// Errors when there are too few segments to give every rank the same number of
    /// non-empty bins (and `drop_last` is off), or on invalid options.
    pub fn new(bins: Arc<Bins>, options: DealOptions) -> Result<Self> {
        Ok(Self {
            deck: Arc::new(Deck::new(bins, options)?),
        })
    }

    /// The epoch-independent part shared by the deals.
    pub fn deck(&self) -> &Arc<Deck> {
        &self.deck
    }

    /// The deal of `epoch`.
    pub fn deal(&self, epoch: u64) -> EpochDeal {
        let options = &self.deck.options;
        let seed = mix_seed(&[options.seed, epoch]);
        let steps = steps::table(&self.deck.order, &self.deck.groups, options, seed);
        EpochDeal {
            deck: Arc::clone(&self.deck),
            steps,
            epoch,
        }
    }

    /// The deal that finishes `epoch` on this dealer's number of ranks after `runs` of it
    /// on other world sizes (run `i`: `runs[i].num_replicas` ranks ran `runs[i].steps`
    /// steps). Each run's unused bins are dealt again to the next world size, so every
    /// segment of the epoch is still used exactly once.
    pub fn deal_after(&self, epoch: u64, runs: &[Run]) -> Result<EpochDeal> {
        rest::deal_after(self, epoch, runs)
    }
}

/// One epoch of data-parallel micro-batches: `steps()[s * num_replicas + r]` is the bin
/// rank `r` runs at step `s`.
#[derive(Debug, Clone)]
pub struct EpochDeal {
    deck: Arc<Deck>,
    steps: Vec<i64>,
    epoch: u64,
}

impl EpochDeal {
    /// The epoch this deal is for.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Number of ranks.
    pub fn num_replicas(&self) -> usize {
        self.deck.options.num_replicas
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
    pub fn deck(&self) -> &Arc<Deck> {
        &self.deck
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

    /// Cost of every bin of the table (row-major, like [`EpochDeal::steps`]).
    pub fn step_costs(&self, kind: CostKind) -> Result<Vec<f64>> {
        let per_attention = self.deck.options.flops_per_attention();
        if kind == CostKind::Flops && per_attention.is_none() {
            return Err(Error::invalid(
                "the flops cost needs hidden_size (the model's hidden size)",
            ));
        }
        let costs = &self.deck.costs;
        Ok(self
            .steps
            .iter()
            .map(|&b| costs[b as usize].of(kind, per_attention))
            .collect())
    }

    /// Real (non-padding) tokens of every bin of the table (row-major).
    pub fn real_tokens(&self) -> Vec<i64> {
        let costs = &self.deck.costs;
        self.steps
            .iter()
            .map(|&b| costs[b as usize].real as i64)
            .collect()
    }

    /// Real tokens of all bins of the table.
    pub fn total_real_tokens(&self) -> u64 {
        let costs = &self.deck.costs;
        self.steps.iter().map(|&b| costs[b as usize].real).sum()
    }

    /// Counts and balance of this deal.
    pub fn stats(&self) -> DealStats {
        stats::stats(self)
    }

    /// The bins no rank has run before `step`, as a packing of their own: bins in step
    /// order, ranks in order within a step, each keeping its segments.
    pub fn rest(&self, step: usize) -> Result<Bins> {
        rest::rest(self, step)
    }
}

//! Counts and balance of an epoch deal.

use super::costs::CostKind;
use super::EpochDeal;

/// How evenly the ranks of each step are loaded, by one cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Imbalance {
    /// The cost measured.
    pub kind: CostKind,
    /// Worst step's `max / mean` across ranks.
    pub max: f64,
    /// Average over steps of `max / mean`.
    pub mean: f64,
    /// Sum of per-step maxima over sum of per-step means: how much longer lockstep ranks
    /// take than perfectly balanced ones (1.0 is perfect).
    pub sync_overhead: f64,
}

/// Counts and balance of an epoch deal.
#[derive(Debug, Clone, PartialEq)]
pub struct DealStats {
    pub epoch: u64,
    pub num_replicas: u64,
    pub n_steps: u64,
    /// Bins in the table.
    pub n_bins: u64,
    pub n_seqs: u64,
    /// Segments in the table.
    pub n_segments: u64,
    pub max_tokens: u64,
    /// Real tokens in the table.
    pub total_tokens: u64,
    /// Tokens processed minus real tokens.
    pub padding_tokens: u64,
    pub padding_ratio: f64,
    /// Real tokens / (bins x max_tokens).
    pub efficiency: f64,
    pub split_bins: u64,
    pub split_seqs: u64,
    pub dropped_bins: u64,
    pub drop_last_seqs: u64,
    pub drop_last_tokens: u64,
    /// Sequences left out by `drop_last` or by the packing's oversize policy.
    pub dropped_seqs: u64,
    /// Tokens, attention and (with a hidden size) FLOPs.
    pub imbalance: Vec<Imbalance>,
}

pub fn stats(deal: &EpochDeal) -> DealStats {
    let deck = deal.deck();
    let source = deck.source();
    let report = deck.report();
    let costs = deck.costs();
    let offsets = deck.bin_offsets();
    let (mut real, mut processed, mut segments) = (0u64, 0u64, 0u64);
    for &bin in deal.steps() {
        let bin = bin as usize;
        real += costs[bin].real;
        processed += costs[bin].tokens;
        segments += (offsets[bin + 1] - offsets[bin]) as u64;
    }
    let n_bins = deal.steps().len() as u64;
    let per_attention = deck.options().flops_per_attention();
    let mut kinds = vec![CostKind::Tokens, CostKind::Attention];
    if per_attention.is_some() {
        kinds.push(CostKind::Flops);
    }
    let imbalance = kinds
        .into_iter()
        .map(|kind| {
            let table: Vec<f64> = deal
                .steps()
                .iter()
                .map(|&b| costs[b as usize].of(kind, per_attention))
                .collect();
            imbalance(kind, &table, deal.num_replicas())
        })
        .collect();
    DealStats {
        epoch: deal.epoch(),
        num_replicas: deal.num_replicas() as u64,
        n_steps: deal.n_steps() as u64,
        n_bins,
        n_seqs: source.n_seqs,
        n_segments: segments,
        max_tokens: source.max_tokens,
        total_tokens: real,
        padding_tokens: processed.saturating_sub(real),
        padding_ratio: if processed == 0 {
            0.0
        } else {
            1.0 - real as f64 / processed as f64
        },
        efficiency: if n_bins == 0 {
            1.0
        } else {
            real as f64 / (n_bins as f64 * source.max_tokens as f64)
        },
        split_bins: report.split_bins,
        split_seqs: report.split_seqs,
        dropped_bins: report.dropped_bins,
        drop_last_seqs: report.dropped_seqs,
        drop_last_tokens: report.dropped_tokens,
        dropped_seqs: report.dropped_seqs + source.packing.counts.dropped_seqs,
        imbalance,
    }
}

/// Imbalance of a row-major `(steps x ranks)` table of costs.
fn imbalance(kind: CostKind, table: &[f64], ranks: usize) -> Imbalance {
    let n_steps = table.len() / ranks;
    if n_steps == 0 {
        return Imbalance {
            kind,
            max: 1.0,
            mean: 1.0,
            sync_overhead: 1.0,
        };
    }
    let (mut worst, mut ratio_sum, mut highest_sum, mut mean_sum) = (0.0f64, 0.0, 0.0, 0.0);
    for row in table.chunks_exact(ranks) {
        let highest = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mean = row.iter().sum::<f64>() / ranks as f64;
        let ratio = if mean > 0.0 { highest / mean } else { 1.0 };
        worst = worst.max(ratio);
        ratio_sum += ratio;
        highest_sum += highest;
        mean_sum += mean;
    }
    Imbalance {
        kind,
        max: worst,
        mean: ratio_sum / n_steps as f64,
        sync_overhead: if mean_sum == 0.0 {
            1.0
        } else {
            highest_sum / mean_sum
        },
    }
}

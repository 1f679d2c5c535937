//! Packing and dealing every step of a composed pass, and joining the steps' deals into
//! one epoch deal.

use std::sync::Arc;

use rayon::prelude::*;

use super::super::costs::BinCost;
use super::super::{DealOptions, Dealer, Deck, DivideReport, EpochDeal};
use super::compose::{compose, Composition};
use super::Mixture;
use crate::buffers::with_capacity_huge;
use crate::error::{Error, Result};
use crate::packing::{batch_padded, pack, Bins, Oversize, PackOptions, Packing, PackingKind};
use crate::rng::mix_seed;
use crate::schedule::Schedule;

/// Seed stream of the steps' packings and deals.
const STREAM_STEPS: u64 = 0x6D69_7873_7465_7073;

/// One pass over a mixture: the deal of its micro-batches, and its optimizer steps.
#[derive(Debug, Clone)]
pub struct MixturePlan {
    /// The micro-batches of every rank; optimizer step `k` is micro-steps
    /// `step_offsets[k]..step_offsets[k + 1]` of its table.
    pub deal: EpochDeal,
    /// `n_steps + 1` offsets into the deal's micro-steps.
    pub step_offsets: Vec<i64>,
    /// `n_steps x n_sources` real tokens, row-major.
    pub source_tokens: Vec<i64>,
    /// `n_steps x n_sources` target tokens, row-major.
    pub target_tokens: Vec<f64>,
    /// The batch schedule's budget of every step.
    pub budgets: Vec<i64>,
    /// Per source, the repetitions the pass began.
    pub repetitions: Vec<i64>,
    /// Real tokens of the pass.
    pub total_tokens: u64,
}

/// One step's deal, with global sequence indices.
struct StepDeal {
    bin_offsets: Vec<i64>,
    indices: Vec<i64>,
    starts: Option<Vec<i64>>,
    lengths: Vec<i64>,
    costs: Vec<BinCost>,
    /// The step's `micro-steps x num_replicas` table of its own bins.
    table: Vec<i64>,
    report: DivideReport,
    counts: crate::packing::PolicyCounts,
}

/// The plan of pass `epoch` of `mixture`, which starts after `consumed_before` tokens:
/// steps composed by [`compose`], each packed with `pack_options` (its seed mixed with the
/// epoch and step) and dealt with `deal_options` (likewise).
#[allow(clippy::too_many_arguments)]
pub fn plan(
    mixture: &Mixture,
    schedule: &Schedule,
    pack_options: &PackOptions,
    kind: PackingKind,
    deal_options: &DealOptions,
    epoch: u64,
    consumed_before: u64,
) -> Result<MixturePlan> {
    deal_options.validate()?;
    refuse_oversize(mixture, pack_options)?;
    let composition = compose(
        mixture,
        schedule,
        pack_options,
        deal_options.seed,
        epoch,
        consumed_before,
    )?;
    let results: Vec<Result<StepDeal>> = (0..composition.steps.len())
        .into_par_iter()
        .map(|k| {
            deal_step(
                mixture,
                &composition,
                k,
                pack_options,
                kind,
                deal_options,
                epoch,
            )
        })
        .collect();
    let mut steps = Vec::with_capacity(results.len());
    for result in results {
        steps.push(result?);
    }
    Ok(join(
        mixture,
        &composition,
        steps,
        pack_options,
        kind,
        deal_options,
        epoch,
    ))
}

/// Refuse, with its global index and source, the first sequence over the budget under
/// `oversize="error"` (every sequence, whether or not the pass reaches it).
fn refuse_oversize(mixture: &Mixture, options: &PackOptions) -> Result<()> {
    if options.oversize != Oversize::Error {
        return Ok(());
    }
    let capacity = options.capacity();
    let Some(index) = mixture.lengths().iter().position(|&l| l as u64 > capacity) else {
        return Ok(());
    };
    let source = mixture.source_of(index);
    Err(Error::Oversize {
        index,
        length: mixture.lengths()[index],
        max_tokens: options.max_tokens,
        detail: format!(
            " (sequence {} of source '{}'{})",
            index - mixture.offsets()[source],
            mixture.names()[source],
            if capacity < options.max_tokens {
                format!(", at most {capacity} with pad_to_multiple_of")
            } else {
                String::new()
            }
        ),
    })
}

/// Pack and deal the sequences of step `k`.
fn deal_step(
    mixture: &Mixture,
    composition: &Composition,
    k: usize,
    pack_options: &PackOptions,
    kind: PackingKind,
    deal_options: &DealOptions,
    epoch: u64,
) -> Result<StepDeal> {
    let take = &composition.steps[k];
    let size: u64 = take.ranges.iter().map(|(a, b)| b - a).sum();
    let mut global = Vec::with_capacity(size as usize);
    let mut lengths = Vec::with_capacity(size as usize);
    for (s, &(start, end)) in take.ranges.iter().enumerate() {
        let n = (mixture.offsets()[s + 1] - mixture.offsets()[s]) as u64;
        let offset = mixture.offsets()[s];
        for position in start..end {
            let (repetition, at) = ((position / n) as usize, (position % n) as usize);
            global.push((offset + composition.orders[s][repetition][at] as usize) as i64);
            lengths.push(composition.ordered_lengths[s][repetition][at]);
        }
    }
    let step_seed = mix_seed(&[deal_options.seed, STREAM_STEPS, epoch, k as u64]);
    let options = PackOptions {
        seed: mix_seed(&[pack_options.seed, STREAM_STEPS, epoch, k as u64]),
        ..pack_options.clone()
    };
    let packing = match kind {
        PackingKind::Packed => pack(&lengths, &options)?,
        PackingKind::Padded => batch_padded(&lengths, &options)?,
    };
    let bins = Bins::new(packing, &options, lengths.len(), kind);
    let dealer = Dealer::new(
        Arc::new(bins),
        DealOptions {
            seed: step_seed,
            ..deal_options.clone()
        },
    )
    .map_err(|error| {
        Error::invalid(format!(
            "optimizer step {k} of epoch {epoch} ({size} sequences) cannot give each of \
             {} ranks the same number of micro-batches: {error}",
            deal_options.num_replicas
        ))
    })?;
    let deal = dealer.deal(epoch);
    let deck = deal.deck();
    Ok(StepDeal {
        bin_offsets: deck.bin_offsets().to_vec(),
        indices: deck.indices().iter().map(|&i| global[i as usize]).collect(),
        starts: deck.starts().map(<[i64]>::to_vec),
        lengths: deck.lengths().to_vec(),
        costs: deck.costs().to_vec(),
        table: deal.steps().to_vec(),
        report: deck.report().clone(),
        counts: deck.source().packing.counts.clone(),
    })
}

/// Join the steps' deals into one deal of the pass.
fn join(
    mixture: &Mixture,
    composition: &Composition,
    steps: Vec<StepDeal>,
    pack_options: &PackOptions,
    kind: PackingKind,
    deal_options: &DealOptions,
    epoch: u64,
) -> MixturePlan {
    let ranks = deal_options.num_replicas;
    let n_segments: usize = steps.iter().map(|s| s.indices.len()).sum();
    let n_bins: usize = steps.iter().map(|s| s.costs.len()).sum();
    let any_starts = steps.iter().any(|s| s.starts.is_some());
    let mut packing = Packing {
        bin_offsets: with_capacity_huge(n_bins + 1),
        indices: with_capacity_huge(n_segments),
        starts: any_starts.then(|| with_capacity_huge(n_segments)),
        lengths: with_capacity_huge(n_segments),
        bin_tokens: with_capacity_huge(n_bins),
        counts: Default::default(),
        segment_cost: 0,
    };
    packing.bin_offsets.push(0);
    let mut costs = with_capacity_huge(n_bins);
    let mut table = with_capacity_huge(n_bins);
    let mut report = DivideReport::default();
    let mut step_offsets = Vec::with_capacity(steps.len() + 1);
    step_offsets.push(0i64);
    for step in steps {
        let (base, first) = (costs.len() as i64, packing.indices.len() as i64);
        packing
            .bin_offsets
            .extend(step.bin_offsets[1..].iter().map(|&o| o + first));
        packing.indices.extend_from_slice(&step.indices);
        if let Some(starts) = &mut packing.starts {
            match &step.starts {
                Some(s) => starts.extend_from_slice(s),
                None => starts.resize(starts.len() + step.indices.len(), 0),
            }
        }
        packing.lengths.extend_from_slice(&step.lengths);
        packing
            .bin_tokens
            .extend(step.costs.iter().map(|c| c.tokens as i64));
        packing.segment_cost += step.costs.iter().map(|c| c.tokens).sum::<u64>();
        costs.extend_from_slice(&step.costs);
        table.extend(step.table.iter().map(|&b| b + base));
        step_offsets.push((table.len() / ranks) as i64);
        add_report(&mut report, &step.report);
        add_counts(&mut packing.counts, &step.counts);
    }
    let n_sources = mixture.n_sources();
    let mut source_tokens = Vec::with_capacity(composition.steps.len() * n_sources);
    let mut target_tokens = Vec::with_capacity(composition.steps.len() * n_sources);
    for take in &composition.steps {
        source_tokens.extend(take.tokens.iter().map(|&t| t as i64));
        target_tokens.extend_from_slice(&take.targets);
    }
    let bins = Bins::new(packing, pack_options, mixture.lengths().len(), kind);
    let deck = Deck {
        bin_offsets: bins.packing.bin_offsets.clone(),
        source: Arc::new(bins),
        options: deal_options.clone(),
        cut: None,
        costs,
        order: (0..n_bins as u32).collect(),
        groups: vec![0, n_bins as u32],
        report,
    };
    MixturePlan {
        deal: EpochDeal {
            deck: Arc::new(deck),
            steps: table,
            epoch,
        },
        step_offsets,
        source_tokens,
        target_tokens,
        budgets: composition.steps.iter().map(|t| t.budget as i64).collect(),
        repetitions: composition
            .orders
            .iter()
            .map(|orders| orders.len() as i64)
            .collect(),
        total_tokens: composition.total_tokens,
    }
}

fn add_report(total: &mut DivideReport, step: &DivideReport) {
    total.split_bins += step.split_bins;
    total.split_seqs += step.split_seqs;
    total.dropped_bins += step.dropped_bins;
    total.dropped_seqs += step.dropped_seqs;
    total.dropped_tokens += step.dropped_tokens;
}

fn add_counts(total: &mut crate::packing::PolicyCounts, step: &crate::packing::PolicyCounts) {
    total.input_tokens += step.input_tokens;
    total.dropped_seqs += step.dropped_seqs;
    total.dropped_tokens += step.dropped_tokens;
    total.truncated_seqs += step.truncated_seqs;
    total.truncated_tokens += step.truncated_tokens;
    total.split_seqs += step.split_seqs;
    total.split_pieces += step.split_pieces;
}

//! Packing and dealing every step of a composed pass, and joining the steps' deals into
//! one epoch deal.

use std::sync::Arc;

use rayon::prelude::*;

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

/// One step's deal, and the global index of each of its sequences.
struct StepDeal {
    deal: EpochDeal,
    global: Vec<i64>,
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
    Ok(StepDeal {
        deal: dealer.deal(epoch),
        global,
    })
}

/// The concatenation of `parts`, each value of part `k` mapped by `map(k, value)`,
/// written in parallel into huge-page-advised memory.
fn concatenate<T, F>(parts: &[&[T]], map: F) -> Vec<T>
where
    T: Copy + Default + Send + Sync,
    F: Fn(usize, T) -> T + Sync,
{
    let total = parts.iter().map(|part| part.len()).sum();
    let mut joined = with_capacity_huge(total);
    joined.resize(total, T::default());
    let mut pieces = Vec::with_capacity(parts.len());
    let mut rest = &mut joined[..];
    for part in parts {
        let (head, tail) = rest.split_at_mut(part.len());
        pieces.push(head);
        rest = tail;
    }
    pieces
        .into_par_iter()
        .zip(parts)
        .enumerate()
        .for_each(|(k, (piece, part))| {
            for (slot, &value) in piece.iter_mut().zip(*part) {
                *slot = map(k, value);
            }
        });
    joined
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
    // Where each step's bins and segments begin in the joined deal.
    let (mut first_bin, mut first_segment) = (vec![0i64], vec![0i64]);
    for step in &steps {
        let deck = step.deal.deck();
        first_bin.push(first_bin[first_bin.len() - 1] + deck.costs().len() as i64);
        first_segment.push(first_segment[first_segment.len() - 1] + deck.indices().len() as i64);
    }
    let n_bins = first_bin[steps.len()] as usize;
    let parts = |field: fn(&Deck) -> &[i64]| {
        steps
            .iter()
            .map(|s| field(s.deal.deck()))
            .collect::<Vec<_>>()
    };
    let mut bin_offsets = vec![0i64];
    bin_offsets.extend(concatenate(
        &steps
            .iter()
            .map(|s| &s.deal.deck().bin_offsets()[1..])
            .collect::<Vec<_>>(),
        |k, offset| offset + first_segment[k],
    ));
    let starts = steps
        .iter()
        .any(|s| s.deal.deck().starts().is_some())
        .then(|| {
            let longest = first_segment.windows(2).map(|w| w[1] - w[0]).max();
            let zeros = vec![0i64; longest.unwrap_or(0) as usize];
            let parts: Vec<&[i64]> = steps
                .iter()
                .map(|s| {
                    let deck = s.deal.deck();
                    deck.starts().unwrap_or(&zeros[..deck.indices().len()])
                })
                .collect();
            concatenate(&parts, |_, start| start)
        });
    let costs = concatenate(
        &steps
            .iter()
            .map(|s| s.deal.deck().costs())
            .collect::<Vec<_>>(),
        |_, cost| cost,
    );
    let mut packing = Packing {
        bin_offsets,
        indices: concatenate(&parts(Deck::indices), |k, index| {
            steps[k].global[index as usize]
        }),
        starts,
        lengths: concatenate(&parts(Deck::lengths), |_, length| length),
        bin_tokens: costs.par_iter().map(|c| c.tokens as i64).collect(),
        counts: Default::default(),
        segment_cost: costs.iter().map(|c| c.tokens).sum(),
    };
    let tables: Vec<&[i64]> = steps.iter().map(|s| s.deal.steps()).collect();
    let table = concatenate(&tables, |k, bin| bin + first_bin[k]);
    let mut report = DivideReport::default();
    let mut step_offsets = vec![0i64];
    for step in &steps {
        let deck = step.deal.deck();
        step_offsets
            .push(step_offsets[step_offsets.len() - 1] + (step.deal.steps().len() / ranks) as i64);
        add_report(&mut report, deck.report());
        add_counts(&mut packing.counts, &deck.source().packing.counts);
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

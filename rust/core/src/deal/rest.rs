//! What is left of an epoch after some steps, and finishing it on another world size.

use std::sync::Arc;

use super::{stream, DealOptions, Dealer, EpochDeal};
use crate::error::{at_least_usize, Error, Result};
use crate::packing::{Bins, Packing};
use crate::rng::mix_seed;

/// Part of an epoch that ran on one world size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// Ranks of the run.
    pub num_replicas: usize,
    /// Steps every rank ran.
    pub steps: usize,
}

impl Run {
    /// A run of `steps` steps on `num_replicas` ranks, checked.
    pub fn new(num_replicas: i64, steps: i64) -> Result<Self> {
        Ok(Self {
            num_replicas: at_least_usize(num_replicas, 1, "num_replicas of a run")?,
            steps: at_least_usize(steps, 0, "steps of a run")?,
        })
    }
}

/// The bins of `deal` from step `step` on (all ranks), as bins of their own.
pub fn rest(deal: &EpochDeal, step: usize) -> Result<Bins> {
    if step > deal.n_steps() {
        return Err(Error::invalid(format!(
            "step={step} is beyond the {} steps of the deal",
            deal.n_steps()
        )));
    }
    let deck = deal.deck();
    let source = deck.source();
    let (indices, starts, lengths) = (deck.indices(), deck.starts(), deck.lengths());
    let bins = &deal.steps()[step * deal.num_replicas()..];
    let n_segments: usize = bins
        .iter()
        .map(|&b| deck.segment_range(b as usize).len())
        .sum();
    let mut packing = Packing {
        bin_offsets: Vec::with_capacity(bins.len() + 1),
        indices: Vec::with_capacity(n_segments),
        starts: None,
        lengths: Vec::with_capacity(n_segments),
        bin_tokens: Vec::with_capacity(bins.len()),
        counts: source.packing.counts.clone(),
        segment_cost: 0,
    };
    let mut rest_starts = starts.map(|_| Vec::with_capacity(n_segments));
    packing.bin_offsets.push(0);
    for &bin in bins {
        let range = deck.segment_range(bin as usize);
        packing.indices.extend_from_slice(&indices[range.clone()]);
        if let (Some(rest), Some(starts)) = (&mut rest_starts, starts) {
            rest.extend_from_slice(&starts[range.clone()]);
        }
        packing.lengths.extend_from_slice(&lengths[range]);
        packing.bin_offsets.push(packing.indices.len() as i64);
        let tokens = deck.costs()[bin as usize].tokens;
        packing.bin_tokens.push(tokens as i64);
        packing.segment_cost += tokens;
    }
    packing.starts = rest_starts;
    packing.counts.input_tokens = packing.lengths.iter().map(|&l| l as u64).sum();
    Ok(Bins {
        lower_bound: packing.segment_cost.div_ceil(source.max_tokens),
        packing,
        max_tokens: source.max_tokens,
        n_seqs: source.n_seqs,
        kind: source.kind,
        group_ids: source.group_ids.clone(),
    })
}

/// See [`Dealer::deal_after`].
pub fn deal_after(dealer: &Dealer, epoch: u64, runs: &[Run]) -> Result<EpochDeal> {
    let deck = dealer.deck();
    let options = deck.options();
    let Some(first) = runs.first() else {
        return Ok(dealer.deal(epoch));
    };
    let with = |num_replicas: usize, seed: u64| DealOptions {
        num_replicas,
        seed,
        ..options.clone()
    };
    let mut deal = Dealer::new(
        Arc::clone(deck.source()),
        with(first.num_replicas, options.seed),
    )?
    .deal(epoch);
    for (index, run) in runs.iter().enumerate() {
        let size = runs
            .get(index + 1)
            .map_or(options.num_replicas, |next| next.num_replicas);
        let n_steps = deal.n_steps();
        if run.steps > n_steps {
            return Err(Error::invalid(format!(
                "the resize history does not match the deal of epoch {epoch}: run {index} has \
                 {n_steps} steps on {} ranks, the history says {}",
                run.num_replicas, run.steps
            )));
        }
        let rest = deal.rest(run.steps)?;
        let seed = mix_seed(&[options.seed, stream::RESIZE, index as u64]);
        let dealer = Dealer::new(Arc::new(rest), with(size, seed)).map_err(|error| {
            Error::invalid(format!(
                "epoch {epoch} cannot be finished on {size} ranks after {} of its {n_steps} \
                 steps ran on {}: {error}",
                run.steps, run.num_replicas
            ))
        })?;
        deal = dealer.deal(epoch);
    }
    Ok(deal)
}

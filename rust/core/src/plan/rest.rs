//! What is left of an epoch after some steps, and finishing it on another world size.

use std::sync::Arc;

use super::{stream, Bins, EpochPlan, PlanOptions, Planner};
use crate::error::{Error, Result};
use crate::packing::Packing;
use crate::rng::mix_seed;

/// Part of an epoch that ran on one world size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// Ranks of the run.
    pub num_replicas: usize,
    /// Steps every rank ran.
    pub steps: usize,
}

/// The bins of `plan` from step `step` on (all ranks), as bins of their own.
pub fn rest(plan: &EpochPlan, step: usize) -> Result<Bins> {
    if step > plan.n_steps() {
        return Err(Error::invalid(format!(
            "step={step} is beyond the {} steps of the plan",
            plan.n_steps()
        )));
    }
    let layout = plan.layout();
    let source = layout.source();
    let (indices, starts, lengths) = (layout.indices(), layout.starts(), layout.lengths());
    let bins = &plan.steps()[step * plan.num_replicas()..];
    let n_segments: usize = bins
        .iter()
        .map(|&b| layout.segment_range(b as usize).len())
        .sum();
    let mut packing = Packing {
        bin_offsets: Vec::with_capacity(bins.len() + 1),
        indices: Vec::with_capacity(n_segments),
        starts: Vec::new().into(),
        lengths: Vec::with_capacity(n_segments),
        bin_tokens: Vec::with_capacity(bins.len()),
        counts: source.packing.counts.clone(),
        segment_cost: 0,
    };
    let mut rest_starts = Vec::with_capacity(n_segments);
    packing.bin_offsets.push(0);
    for &bin in bins {
        let range = layout.segment_range(bin as usize);
        packing.indices.extend_from_slice(&indices[range.clone()]);
        rest_starts.extend_from_slice(&starts[range.clone()]);
        packing.lengths.extend_from_slice(&lengths[range]);
        packing.bin_offsets.push(packing.indices.len() as i64);
        let tokens = layout.costs()[bin as usize].tokens;
        packing.bin_tokens.push(tokens as i64);
        packing.segment_cost += tokens;
    }
    packing.starts = rest_starts.into();
    packing.counts.input_tokens = packing.lengths.iter().map(|&l| l as u64).sum();
    Ok(Bins {
        lower_bound: packing.segment_cost.div_ceil(source.max_tokens),
        packing,
        max_tokens: source.max_tokens,
        n_seqs: source.n_seqs,
        kind: source.kind,
    })
}

/// See [`Planner::plan_after`].
pub fn plan_after(planner: &Planner, epoch: u64, runs: &[Run]) -> Result<EpochPlan> {
    let layout = planner.layout();
    let options = layout.options();
    let Some(first) = runs.first() else {
        return Ok(planner.plan(epoch));
    };
    let with = |num_replicas: usize, seed: u64| PlanOptions {
        num_replicas,
        seed,
        ..options.clone()
    };
    let mut plan = Planner::new(
        Arc::clone(layout.source()),
        with(first.num_replicas, options.seed),
    )?
    .plan(epoch);
    for (index, run) in runs.iter().enumerate() {
        let size = runs
            .get(index + 1)
            .map_or(options.num_replicas, |next| next.num_replicas);
        let n_steps = plan.n_steps();
        if run.steps > n_steps {
            return Err(Error::invalid(format!(
                "the resize history does not match the plan of epoch {epoch}: run {index} has \
                 {n_steps} steps on {} ranks, the history says {}",
                run.num_replicas, run.steps
            )));
        }
        let rest = plan.rest(run.steps)?;
        let seed = mix_seed(&[options.seed, stream::RESIZE, index as u64]);
        let planner = Planner::new(Arc::new(rest), with(size, seed)).map_err(|error| {
            Error::invalid(format!(
                "epoch {epoch} cannot be finished on {size} ranks after {} of its {n_steps} \
                 steps ran on {}: {error}",
                run.steps, run.num_replicas
            ))
        })?;
        plan = planner.plan(epoch);
    }
    Ok(plan)
}

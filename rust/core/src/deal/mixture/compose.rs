//! Composing the optimizer steps of a pass: how many tokens of each source every step
//! takes, and which sequences.

use super::shuffle::shuffled;
use super::{Exhausted, Mixture};
use crate::error::{Error, Result};
use crate::packing::{Oversize, PackOptions};
use crate::rng::mix_seed;
use crate::schedule::Schedule;

/// Seed stream of the sources' permutations.
const STREAM_ORDER: u64 = 0x006D_6978_7475_7265;

/// What one optimizer step takes from the sources.
#[derive(Debug, Clone, PartialEq)]
pub struct StepTake {
    /// Per source, the positions `start..end` of its stream the step takes (a stream is
    /// the source's sequences in the order of repetition 0, then of repetition 1...).
    pub ranges: Vec<(u64, u64)>,
    /// Per source, the real tokens taken.
    pub tokens: Vec<u64>,
    /// Per source, the tokens the step aimed at (share x budget, or what was left of a
    /// source that ran out).
    pub targets: Vec<f64>,
    /// The batch schedule's budget for the step.
    pub budget: u64,
}

/// The steps of one pass over a mixture.
#[derive(Debug, Clone, PartialEq)]
pub struct Composition {
    pub steps: Vec<StepTake>,
    /// Per source, the permutation of every repetition the pass started.
    pub orders: Vec<Vec<Vec<u32>>>,
    /// Per source and repetition, the lengths in the order of the permutation.
    pub ordered_lengths: Vec<Vec<Vec<i64>>>,
    /// Real tokens of the pass.
    pub total_tokens: u64,
}

/// Real tokens a sequence contributes under the oversize policy (the policy `error` is
/// checked before composing).
#[derive(Clone, Copy)]
struct Placed {
    capacity: u64,
    oversize: Oversize,
}

impl Placed {
    fn new(options: &PackOptions) -> Self {
        Self {
            capacity: options.capacity(),
            oversize: options.oversize,
        }
    }

    fn tokens(self, length: i64) -> u64 {
        let length = length as u64;
        if length <= self.capacity {
            return length;
        }
        match self.oversize {
            Oversize::Truncate => self.capacity,
            Oversize::Drop => 0,
            Oversize::Error | Oversize::Split => length,
        }
    }
}

/// One source's stream of sequences through its repetitions.
struct Stream<'a> {
    lengths: &'a [i64],
    placed: Placed,
    /// Real tokens of one repetition.
    total: u64,
    max_repetition: u64,
    seed: u64,
    orders: Vec<Vec<u32>>,
    ordered_lengths: Vec<Vec<i64>>,
    /// Position in the stream (over all repetitions).
    position: u64,
    /// Repetition of `position`, and the position in it.
    repetition: usize,
    in_repetition: usize,
    /// Real tokens of the current repetition already taken.
    taken_in_repetition: u64,
}

impl<'a> Stream<'a> {
    fn new(lengths: &'a [i64], max_repetition: u64, options: &'a PackOptions, seed: u64) -> Self {
        let placed = Placed::new(options);
        Self {
            lengths,
            placed,
            total: lengths.iter().map(|&l| placed.tokens(l)).sum(),
            max_repetition,
            seed,
            orders: Vec::new(),
            ordered_lengths: Vec::new(),
            position: 0,
            repetition: 0,
            in_repetition: 0,
            taken_in_repetition: 0,
        }
    }

    fn n(&self) -> u64 {
        self.lengths.len() as u64
    }

    fn exhausted(&self) -> bool {
        self.position >= self.n() * self.max_repetition
    }

    /// Tokens left in the stream (this repetition's rest and the repetitions not begun).
    fn remaining(&self) -> u64 {
        if self.exhausted() {
            return 0;
        }
        self.total * (self.max_repetition - self.repetition as u64) - self.taken_in_repetition
    }

    /// The lengths left in the current repetition, making the permutation of a new
    /// repetition first; `None` when the stream is exhausted.
    fn rest(&mut self) -> Option<&[i64]> {
        if self.exhausted() {
            return None;
        }
        if self.repetition == self.orders.len() {
            let (order, ordered) =
                shuffled(self.lengths, mix_seed(&[self.seed, self.repetition as u64]));
            self.orders.push(order);
            self.ordered_lengths.push(ordered);
        }
        Some(&self.ordered_lengths[self.repetition][self.in_repetition..])
    }

    /// Take the next `count` sequences of the current repetition, holding `tokens`.
    fn advance(&mut self, count: usize, tokens: u64) {
        self.position += count as u64;
        self.in_repetition += count;
        self.taken_in_repetition += tokens;
        if self.in_repetition == self.lengths.len() {
            self.repetition += 1;
            self.in_repetition = 0;
            self.taken_in_repetition = 0;
        }
    }

    /// Take sequences while each brings the tokens taken closer to `quota`: the result is
    /// within half a sequence of it (or all that is left).
    fn fill(&mut self, quota: f64) -> u64 {
        let (mut taken, placed) = (0u64, self.placed);
        while let Some(rest) = self.rest() {
            let (mut count, before) = (0usize, taken);
            for &length in rest {
                let tokens = placed.tokens(length);
                if (2 * taken + tokens) as f64 >= 2.0 * quota {
                    break;
                }
                taken += tokens;
                count += 1;
            }
            let stopped = count < rest.len();
            self.advance(count, taken - before);
            if stopped {
                break;
            }
        }
        taken
    }

    /// Take every sequence left.
    fn drain(&mut self) -> u64 {
        let (mut taken, placed) = (0u64, self.placed);
        while let Some(rest) = self.rest() {
            let (count, tokens) = (rest.len(), rest.iter().map(|&l| placed.tokens(l)).sum());
            self.advance(count, tokens);
            taken += tokens;
        }
        taken
    }
}

/// Compose the optimizer steps of pass `epoch`, which starts after `consumed_before`
/// tokens (those of earlier passes): see the module documentation.
///
/// The last step of a pass holds what is left of it; when that is under half its budget
/// it joins the step before, so that no step is too small for the shares to hold.
pub fn compose(
    mixture: &Mixture,
    schedule: &Schedule,
    options: &PackOptions,
    seed: u64,
    epoch: u64,
    consumed_before: u64,
) -> Result<Composition> {
    let n_sources = mixture.n_sources();
    let mut streams: Vec<Stream<'_>> = (0..n_sources)
        .map(|s| {
            let seed = mix_seed(&[seed, STREAM_ORDER, epoch, s as u64]);
            Stream::new(
                mixture.source_lengths(s),
                mixture.max_repetition()[s],
                options,
                seed,
            )
        })
        .collect();
    let mut steps: Vec<StepTake> = Vec::new();
    let mut consumed = consumed_before;
    loop {
        let budget = schedule.batch_tokens_at(consumed)?;
        let shares = mixture.shares().at(consumed);
        let starts: Vec<u64> = streams.iter().map(|s| s.position).collect();
        let step = match mixture.exhausted() {
            Exhausted::Stop => stop_step(&mut streams, &shares, budget),
            Exhausted::Renormalize => renormalize_step(&mut streams, &shares, budget),
        };
        let Some((tokens, targets, last)) = step else {
            break;
        };
        let taken: u64 = tokens.iter().sum();
        let ranges = starts
            .iter()
            .zip(&streams)
            .map(|(&start, stream)| (start, stream.position))
            .collect::<Vec<_>>();
        if ranges.iter().all(|(a, b)| a == b) {
            if last {
                break;
            }
            return Err(Error::invalid(format!(
                "the batch of {budget} tokens after {consumed} consumed tokens is too small \
                 for the mixture: no source's share of it reaches half of its next sequence"
            )));
        }
        consumed += taken;
        steps.push(StepTake {
            ranges,
            tokens,
            targets,
            budget,
        });
        if last {
            break;
        }
    }
    join_short_last_step(&mut steps);
    let (orders, ordered_lengths) = streams
        .into_iter()
        .map(|s| (s.orders, s.ordered_lengths))
        .unzip();
    Ok(Composition {
        total_tokens: consumed - consumed_before,
        steps,
        orders,
        ordered_lengths,
    })
}

/// Tokens and targets per source of one step, and whether the pass ends with it; `None`
/// when the pass ended before it.
type Step = Option<(Vec<u64>, Vec<f64>, bool)>;

/// A step under [`Exhausted::Stop`]: when a source with a share cannot fill its quota, the
/// step shrinks to what that source has left (the shares hold) and the pass ends.
fn stop_step(streams: &mut [Stream<'_>], shares: &[f64], budget: u64) -> Step {
    let quotas: Vec<f64> = shares.iter().map(|&w| w * budget as f64).collect();
    let mut scale = 1.0f64;
    for (stream, &quota) in streams.iter().zip(&quotas) {
        if quota > 0.0 {
            if stream.exhausted() {
                return None;
            }
            scale = scale.min(stream.remaining() as f64 / quota);
        }
    }
    let last = scale < 1.0;
    let mut tokens = vec![0u64; streams.len()];
    let mut targets = vec![0f64; streams.len()];
    for (s, stream) in streams.iter_mut().enumerate() {
        let quota = quotas[s] * scale;
        if quota <= 0.0 {
            continue;
        }
        targets[s] = quota;
        tokens[s] = if last && stream.remaining() as f64 <= quota {
            stream.drain()
        } else {
            stream.fill(quota)
        };
    }
    let ends = streams
        .iter()
        .zip(&quotas)
        .any(|(stream, &quota)| quota > 0.0 && stream.exhausted());
    Some((tokens, targets, last || ends))
}

/// A step under [`Exhausted::Renormalize`]: a source that cannot fill its quota gives all
/// it has left and leaves; the other sources with a share split the rest of the budget in
/// proportion to their shares.
fn renormalize_step(streams: &mut [Stream<'_>], shares: &[f64], budget: u64) -> Step {
    let mut active: Vec<usize> = (0..streams.len())
        .filter(|&s| shares[s] > 0.0 && !streams[s].exhausted())
        .collect();
    if active.is_empty() {
        return None;
    }
    let mut tokens = vec![0u64; streams.len()];
    let mut targets = vec![0f64; streams.len()];
    let mut left = budget as f64;
    loop {
        let weight: f64 = active.iter().map(|&s| shares[s]).sum();
        let short: Vec<usize> = active
            .iter()
            .copied()
            .filter(|&s| (streams[s].remaining() as f64) < shares[s] / weight * left)
            .collect();
        if short.is_empty() {
            for &s in &active {
                targets[s] = shares[s] / weight * left;
                tokens[s] = streams[s].fill(targets[s]);
            }
            break;
        }
        for &s in &short {
            tokens[s] = streams[s].drain();
            targets[s] = tokens[s] as f64;
            left = (left - tokens[s] as f64).max(0.0);
        }
        active.retain(|s| !short.contains(s));
        if active.is_empty() {
            break;
        }
    }
    let last = (0..streams.len()).all(|s| shares[s] == 0.0 || streams[s].exhausted());
    Some((tokens, targets, last))
}

/// Join the last step to the one before when it holds less than half its budget.
fn join_short_last_step(steps: &mut Vec<StepTake>) {
    if steps.len() < 2 {
        return;
    }
    let last = &steps[steps.len() - 1];
    if 2 * last.tokens.iter().sum::<u64>() >= last.budget {
        return;
    }
    let Some(last) = steps.pop() else { return };
    if let Some(before) = steps.last_mut() {
        for s in 0..last.ranges.len() {
            before.ranges[s].1 = last.ranges[s].1;
            before.tokens[s] += last.tokens[s];
            before.targets[s] += last.targets[s];
        }
    }
}

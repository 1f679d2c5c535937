//! Grouping measured micro-batches into optimizer steps that follow a schedule.

use super::{positive, to_i64, Schedule};
use crate::error::{Error, Result};

/// Group consecutive rounds of micro-batches into optimizer steps.
///
/// `micro_batch_tokens` lists the tokens of every micro-batch in global order: micro-batch
/// `j` goes to data-parallel rank `j % dp` in round `j / dp`, so its length must be a
/// multiple of `dp`. A round is the unit of accumulation (every rank does one forward and
/// backward), so steps are made of whole rounds.
///
/// Greedy, in order: a step takes its first round, then keeps taking the next round while
/// that brings its token total closer to the schedule's batch at the tokens consumed
/// before the step (ties close the step). The last step holds what is left, which may be
/// less than its target.
///
/// `consumed_before` is the number of tokens trained on before the first micro-batch (for
/// example in earlier epochs), so the schedule continues where it left off.
///
/// Returns `step_offsets` (length `n_steps + 1`, in rounds): step `s` is made of rounds
/// `step_offsets[s]..step_offsets[s + 1]`, so every rank accumulates
/// `step_offsets[s + 1] - step_offsets[s]` micro-batches in it.
pub fn group_into_steps(
    micro_batch_tokens: &[i64],
    schedule: &Schedule,
    dp: i64,
    consumed_before: u64,
) -> Result<Vec<i64>> {
    let dp = positive(dp, "dp")?;
    let ranks = usize::try_from(dp).map_err(|_| Error::invalid(format!("dp={dp} is too large")))?;
    if micro_batch_tokens.len() % ranks != 0 {
        return Err(Error::invalid(format!(
            "{} micro-batches do not split into rounds of dp={dp}; give every rank the same \
             number of micro-batches",
            micro_batch_tokens.len()
        )));
    }
    let mut offsets = vec![0_i64];
    let mut consumed: u64 = consumed_before;
    let mut step_tokens: u64 = 0;
    let mut step_start = 0_usize;
    let mut target = schedule.batch_tokens_at(consumed)?;
    for (round, chunk) in micro_batch_tokens.chunks_exact(ranks).enumerate() {
        let mut round_tokens: u64 = 0;
        for (rank, &tokens) in chunk.iter().enumerate() {
            let tokens = u64::try_from(tokens).map_err(|_| {
                Error::invalid(format!(
                    "micro_batch_tokens[{}] = {tokens} is negative",
                    round * ranks + rank
                ))
            })?;
            round_tokens = round_tokens
                .checked_add(tokens)
                .ok_or_else(|| Error::overflow("micro-batch token total overflows 64 bits"))?;
        }
        if round > step_start && !closer_with(step_tokens, round_tokens, target) {
            offsets.push(to_i64(round as u64, "step offset")?);
            consumed = consumed
                .checked_add(step_tokens)
                .ok_or_else(|| Error::overflow("consumed tokens overflow 64 bits"))?;
            step_tokens = 0;
            step_start = round;
            target = schedule.batch_tokens_at(consumed)?;
        }
        step_tokens = step_tokens
            .checked_add(round_tokens)
            .ok_or_else(|| Error::overflow("step token total overflows 64 bits"))?;
    }
    let rounds = micro_batch_tokens.len() / ranks;
    if rounds > step_start {
        offsets.push(to_i64(rounds as u64, "step offset")?);
    }
    Ok(offsets)
}

/// Whether adding `extra` tokens to a step of `total` brings it strictly closer to `target`.
fn closer_with(total: u64, extra: u64, target: u64) -> bool {
    if total >= target {
        return false;
    }
    let with = total.saturating_add(extra);
    with <= target || with - target < target - total
}

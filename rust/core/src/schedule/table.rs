//! The per-optimizer-step table of a schedule.

use super::{positive, to_i64, BatchUnit, Schedule};
use crate::error::{Error, Result};

/// The most steps a table may hold (4 arrays of 8 bytes per step: 2 GiB at the limit).
pub const MAX_TABLE_STEPS: u64 = 1 << 26;

/// One row per optimizer step, as four parallel `i64` arrays.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepTable {
    /// Sequences in the global batch of the step.
    pub batch_sequences: Vec<i64>,
    /// Tokens in the global batch of the step.
    pub batch_tokens: Vec<i64>,
    /// Micro-batches each data-parallel rank accumulates in the step.
    pub grad_accum_steps: Vec<i64>,
    /// Tokens consumed once the step is done.
    pub consumed_tokens: Vec<i64>,
}

impl StepTable {
    /// Number of optimizer steps.
    pub fn len(&self) -> usize {
        self.batch_tokens.len()
    }

    /// Whether the table has no step.
    pub fn is_empty(&self) -> bool {
        self.batch_tokens.is_empty()
    }
}

impl Schedule {
    /// Tabulate the schedule per optimizer step until `total_tokens` are consumed.
    ///
    /// Each step consumes the global batch the schedule gives at the tokens consumed
    /// before it; a step is taken only if it fits in the budget, so the table ends with
    /// less than one batch of `total_tokens` left over (as Megatron-LM drops a partial
    /// last batch). Every batch must be a whole number of rounds of `micro_batch_tokens`
    /// on each of `dp` ranks; the first one that is not is reported, never rounded.
    ///
    /// `batch_sequences` counts sequences of the schedule's `seq_len`; without one, a
    /// sequence is a packed row of `micro_batch_tokens` tokens.
    pub fn table(&self, total_tokens: i64, micro_batch_tokens: i64, dp: i64) -> Result<StepTable> {
        let total = super::non_negative(total_tokens, "total_tokens")?;
        let micro = positive(micro_batch_tokens, "micro_batch_tokens")?;
        let dp = positive(dp, "dp")?;
        let round = micro.checked_mul(dp).ok_or_else(|| {
            Error::overflow(format!(
                "micro_batch_tokens x dp = {micro} x {dp} overflows 64 bits"
            ))
        })?;
        let row_len = self.seq_len.unwrap_or(micro);
        if micro % row_len != 0 {
            return Err(Error::invalid(format!(
                "micro_batch_tokens={micro} is not a whole number of sequences of seq_len={row_len}"
            )));
        }
        // Steps are at least total / largest batch: reserve that much up front.
        let unit_tokens = match self.unit {
            BatchUnit::Tokens => 1,
            BatchUnit::Sequences => self.seq_len.unwrap_or(1),
        };
        let largest = self.curve.max_batch().saturating_mul(unit_tokens).max(1);
        let fewest_steps = total / largest;
        if fewest_steps > MAX_TABLE_STEPS {
            return Err(too_many_steps());
        }
        let reserve = usize::try_from(fewest_steps).unwrap_or(0);
        let mut table = StepTable {
            batch_sequences: Vec::with_capacity(reserve),
            batch_tokens: Vec::with_capacity(reserve),
            grad_accum_steps: Vec::with_capacity(reserve),
            consumed_tokens: Vec::with_capacity(reserve),
        };
        let mut consumed: u64 = 0;
        loop {
            let batch = self.batch_tokens_at(consumed)?;
            if batch > total - consumed {
                break;
            }
            if batch % round != 0 {
                let hint = match self.unit {
                    BatchUnit::Sequences if round % unit_tokens == 0 => {
                        format!("{} sequences", round / unit_tokens)
                    }
                    _ => format!("{round} tokens"),
                };
                return Err(Error::invalid(format!(
                    "step {} (after {consumed} tokens): the global batch of {batch} tokens is not a \
                     multiple of micro_batch_tokens x dp = {micro} x {dp} = {round}; round the \
                     schedule to a multiple of it (multiple_of={hint})",
                    table.len()
                )));
            }
            if table.len() as u64 >= MAX_TABLE_STEPS {
                return Err(too_many_steps());
            }
            consumed += batch;
            table
                .batch_sequences
                .push(to_i64(batch / row_len, "batch_sequences")?);
            table.batch_tokens.push(to_i64(batch, "batch_tokens")?);
            table
                .grad_accum_steps
                .push(to_i64(batch / round, "grad_accum_steps")?);
            table
                .consumed_tokens
                .push(to_i64(consumed, "consumed_tokens")?);
        }
        Ok(table)
    }
}

fn too_many_steps() -> Error {
    Error::invalid(format!(
        "the table would have more than {MAX_TABLE_STEPS} steps; use a smaller total_tokens or \
         larger batches"
    ))
}

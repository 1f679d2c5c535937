//! Batch-size schedules: the global batch as a function of training progress.
//!
//! A [`Schedule`] maps consumed training (tokens, or samples for Megatron-LM's ramp) to a
//! global batch size, counted in tokens or in sequences. Three curves cover what large
//! runs use in practice:
//!
//! * [`Schedule::megatron`]: Megatron-LM's `--rampup-batch-size`, reproduced bit for bit
//!   (including its floating-point division), keyed by consumed samples;
//! * [`Schedule::linear`]: a linear ramp over the first `ramp_tokens` tokens (DeepSeek-V3,
//!   GPT-3), either linear in consumed tokens or linear in optimizer steps, rounded down
//!   to a multiple;
//! * [`Schedule::piecewise`]: constant batch sizes switching at token boundaries
//!   (Llama 3 405B);
//! * [`Schedule::megatron_steps`]: Megatron-LM's `--step-batch-size-schedule`, constant
//!   batch sizes (in samples) switching at consumed-sample thresholds.
//!
//! [`Schedule::table`] tabulates a schedule per optimizer step, and
//! [`group_into_steps`] groups measured micro-batches into optimizer steps that follow it.

mod curve;
mod grouping;
mod table;
#[cfg(test)]
mod tests;

use std::str::FromStr;

pub use curve::{Curve, LinearRamp, MegatronRampup, Piecewise};
pub use grouping::group_into_steps;
pub use table::{StepTable, MAX_TABLE_STEPS};

use rayon::prelude::*;

use crate::error::{Error, Result};

/// Arrays at least this long are evaluated on the rayon thread pool.
const PARALLEL_MIN_LEN: usize = 1 << 16;

/// What a schedule's batch size counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchUnit {
    /// The batch is a number of tokens.
    Tokens,
    /// The batch is a number of sequences of `seq_len` tokens each.
    Sequences,
}

impl FromStr for BatchUnit {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        match name {
            "tokens" => Ok(Self::Tokens),
            "sequences" => Ok(Self::Sequences),
            other => Err(Error::invalid(format!(
                "unknown unit {other:?}; expected 'tokens' or 'sequences'"
            ))),
        }
    }
}

/// What a linear ramp is linear in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RampBy {
    /// The batch grows by the same amount per consumed token.
    Tokens,
    /// The batch grows by the same amount per optimizer step.
    Steps,
}

impl FromStr for RampBy {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        match name {
            "tokens" => Ok(Self::Tokens),
            "steps" => Ok(Self::Steps),
            other => Err(Error::invalid(format!(
                "unknown by={other:?}; expected 'tokens' or 'steps'"
            ))),
        }
    }
}

/// What a schedule reads to give the batch: consumed tokens, or consumed samples
/// (sequences), as Megatron-LM's schedules do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// The batch is a function of consumed tokens.
    Tokens,
    /// The batch is a function of consumed samples (Megatron-LM).
    Samples,
}

impl Key {
    /// The unit's name in messages and argument names.
    pub fn name(self) -> &'static str {
        match self {
            Key::Tokens => "tokens",
            Key::Samples => "samples",
        }
    }
}

/// A validated batch-size schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    curve: Curve,
    unit: BatchUnit,
    seq_len: Option<u64>,
    key: Key,
}

/// `value` as a `u64`, refusing negatives with a message naming the parameter.
pub(crate) fn non_negative(value: i64, name: &str) -> Result<u64> {
    u64::try_from(value).map_err(|_| Error::invalid(format!("{name} must be >= 0, got {value}")))
}

/// `value` as a `u64`, refusing zero and negatives with a message naming the parameter.
pub(crate) fn positive(value: i64, name: &str) -> Result<u64> {
    match u64::try_from(value) {
        Ok(v) if v > 0 => Ok(v),
        _ => Err(Error::invalid(format!("{name} must be > 0, got {value}"))),
    }
}

fn optional_seq_len(seq_len: Option<i64>) -> Result<Option<u64>> {
    seq_len.map(|value| positive(value, "seq_len")).transpose()
}

impl Schedule {
    /// Megatron-LM's `--rampup-batch-size start increment ramp_samples` with
    /// `--global-batch-size global_batch`; batches count sequences (samples).
    pub fn megatron(
        start: i64,
        increment: i64,
        ramp_samples: i64,
        global_batch: i64,
        seq_len: Option<i64>,
    ) -> Result<Self> {
        Ok(Self {
            curve: Curve::Megatron(MegatronRampup::new(
                start,
                increment,
                ramp_samples,
                global_batch,
            )?),
            unit: BatchUnit::Sequences,
            seq_len: optional_seq_len(seq_len)?,
            key: Key::Samples,
        })
    }

    /// A linear ramp from `start` to `end` over the first `ramp_tokens` tokens, then `end`.
    #[allow(clippy::too_many_arguments)]
    pub fn linear(
        start: i64,
        end: i64,
        ramp_tokens: i64,
        unit: BatchUnit,
        seq_len: Option<i64>,
        by: RampBy,
        multiple_of: i64,
    ) -> Result<Self> {
        Ok(Self {
            curve: Curve::Linear(LinearRamp::new(start, end, ramp_tokens, by, multiple_of)?),
            unit,
            seq_len: optional_seq_len(seq_len)?,
            key: Key::Tokens,
        })
    }

    /// Batch `batches[i]` from `from_tokens[i]` consumed tokens on.
    pub fn piecewise(
        from_tokens: &[i64],
        batches: &[i64],
        unit: BatchUnit,
        seq_len: Option<i64>,
        allow_decrease: bool,
    ) -> Result<Self> {
        Ok(Self {
            curve: Curve::Piecewise(Piecewise::new(
                from_tokens,
                batches,
                allow_decrease,
                Key::Tokens,
            )?),
            unit,
            seq_len: optional_seq_len(seq_len)?,
            key: Key::Tokens,
        })
    }

    /// Megatron-LM's `--step-batch-size-schedule`: `batches[i]` sequences per step from
    /// `from_samples[i]` consumed samples on (thresholds already converted to samples, as
    /// Megatron does with `--seq-length`). Batches may decrease, as Megatron allows.
    pub fn megatron_steps(
        from_samples: &[i64],
        batches: &[i64],
        seq_len: Option<i64>,
    ) -> Result<Self> {
        Ok(Self {
            curve: Curve::Piecewise(Piecewise::new(from_samples, batches, true, Key::Samples)?),
            unit: BatchUnit::Sequences,
            seq_len: optional_seq_len(seq_len)?,
            key: Key::Samples,
        })
    }

    /// The curve of this schedule.
    pub fn curve(&self) -> &Curve {
        &self.curve
    }

    /// What the batch counts.
    pub fn unit(&self) -> BatchUnit {
        self.unit
    }

    /// Tokens per sequence, when known.
    pub fn seq_len(&self) -> Option<u64> {
        self.seq_len
    }

    /// What [`Schedule::batch_at`] reads: consumed tokens or consumed samples.
    pub fn key(&self) -> Key {
        self.key
    }

    /// The batch (in the schedule's unit) at each consumed amount, in the unit of the
    /// schedule's [`Key`] (samples for Megatron-LM's schedules, tokens otherwise).
    pub fn batch_at(&self, consumed: &[i64]) -> Result<Vec<i64>> {
        if let Some(position) = consumed.iter().position(|&value| value < 0) {
            let name = match self.key {
                Key::Samples => "consumed_samples",
                Key::Tokens => "tokens",
            };
            return Err(Error::invalid(format!(
                "{name}[{position}] = {} is negative",
                consumed[position]
            )));
        }
        // Every batch is at most one of the validated (i64) inputs, so it fits in i64.
        let batch = |&value: &i64| {
            let batch = self.curve.batch_at(value.unsigned_abs());
            i64::try_from(batch).unwrap_or(i64::MAX)
        };
        if consumed.len() >= PARALLEL_MIN_LEN {
            Ok(consumed.par_iter().map(batch).collect())
        } else {
            Ok(consumed.iter().map(batch).collect())
        }
    }

    /// Tokens per sequence, required when batches or the key count sequences.
    fn required_seq_len(&self) -> Result<u64> {
        self.seq_len.ok_or_else(|| {
            Error::invalid(
                "this schedule counts sequences: give it seq_len to convert to tokens".to_string(),
            )
        })
    }

    /// Tokens of one unit of batch: `seq_len` for sequences, 1 for tokens.
    fn unit_tokens(&self) -> Result<u64> {
        match self.unit {
            BatchUnit::Tokens => Ok(1),
            BatchUnit::Sequences => self.required_seq_len(),
        }
    }

    /// The global batch in tokens for the step that starts after `consumed_tokens` tokens.
    pub fn batch_tokens_at(&self, consumed_tokens: u64) -> Result<u64> {
        let unit_tokens = self.unit_tokens()?;
        let at = match self.key {
            Key::Samples => consumed_tokens / self.required_seq_len()?,
            Key::Tokens => consumed_tokens,
        };
        let batch = self.curve.batch_at(at);
        batch.checked_mul(unit_tokens).ok_or_else(|| {
            Error::overflow(format!(
                "a batch of {batch} sequences of {unit_tokens} tokens overflows 64 bits"
            ))
        })
    }
}

/// `value` as an `i64` for numpy, or an overflow error naming `what`.
pub(crate) fn to_i64(value: u64, what: &str) -> Result<i64> {
    i64::try_from(value).map_err(|_| {
        Error::overflow(format!(
            "{what} = {value} does not fit in a signed 64-bit integer"
        ))
    })
}

/// Nearest values `base + k * step` below and above `value` (k >= 0), for error messages.
pub(crate) fn nearest_on_grid(value: u64, base: u64, step: u64) -> String {
    if step == 0 || value <= base {
        return format!("{base}");
    }
    let below = base + (value - base) / step * step;
    match below.checked_add(step) {
        Some(above) if below == 0 => format!("{above}"),
        Some(above) => format!("{below} or {above}"),
        None => format!("{below}"),
    }
}

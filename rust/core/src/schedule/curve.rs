//! The curves: batch size (in the schedule's unit) as a function of one key value.

use super::{nearest_on_grid, non_negative, positive, Key, RampBy, MAX_TABLE_STEPS};
use crate::error::{Error, Result};

/// One of the supported schedule shapes.
#[derive(Debug, Clone, PartialEq)]
pub enum Curve {
    /// Megatron-LM's batch-size ramp, keyed by consumed samples.
    Megatron(MegatronRampup),
    /// A linear ramp keyed by consumed tokens.
    Linear(LinearRamp),
    /// Constant pieces, keyed by consumed tokens or (Megatron-LM's step schedule) samples.
    Piecewise(Piecewise),
}

impl Curve {
    /// The batch at key value `at` (in the unit of the schedule's [`Key`]).
    pub fn batch_at(&self, at: u64) -> u64 {
        match self {
            Curve::Megatron(ramp) => ramp.batch_at(at),
            Curve::Linear(ramp) => ramp.batch_at(at),
            Curve::Piecewise(pieces) => pieces.batch_at(at),
        }
    }

    /// The largest batch the curve ever returns.
    pub fn max_batch(&self) -> u64 {
        match self {
            Curve::Megatron(ramp) => ramp.global_batch,
            Curve::Linear(ramp) => ramp.end,
            Curve::Piecewise(pieces) => pieces.batches.iter().copied().max().unwrap_or(1),
        }
    }
}

/// Megatron-LM's `--rampup-batch-size`: the batch grows by `increment` every
/// `ramp_samples / ((global_batch - start) / increment)` consumed samples.
#[derive(Debug, Clone, PartialEq)]
pub struct MegatronRampup {
    pub start: u64,
    pub increment: u64,
    pub ramp_samples: u64,
    pub global_batch: u64,
    /// `ramp_samples / num_increments` as Megatron computes it, in floating point.
    samples_per_increment: f64,
}

impl MegatronRampup {
    /// Validate as Megatron-LM's calculator asserts, with messages instead of asserts.
    pub fn new(start: i64, increment: i64, ramp_samples: i64, global_batch: i64) -> Result<Self> {
        let start = positive(start, "start")?;
        let increment = positive(increment, "increment")?;
        let ramp_samples = non_negative(ramp_samples, "ramp_samples")?;
        let global_batch = positive(global_batch, "global_batch")?;
        if global_batch < start {
            return Err(Error::invalid(format!(
                "the ramp must not decrease: global_batch={global_batch} is below start={start}"
            )));
        }
        let span = global_batch - start;
        if span % increment != 0 {
            return Err(Error::invalid(format!(
                "global_batch - start = {span} is not a multiple of increment={increment}; \
                 nearest valid global_batch: {}",
                nearest_on_grid(global_batch, start, increment)
            )));
        }
        let num_increments = span / increment;
        if num_increments > 0 && ramp_samples == 0 {
            return Err(Error::invalid(format!(
                "ramp_samples must be > 0 to ramp from start={start} to global_batch={global_batch}"
            )));
        }
        // Megatron divides Python ints with `/`, which is a correctly rounded float division.
        let samples_per_increment = if num_increments == 0 {
            f64::INFINITY
        } else {
            ramp_samples as f64 / num_increments as f64
        };
        Ok(Self {
            start,
            increment,
            ramp_samples,
            global_batch,
            samples_per_increment,
        })
    }

    /// The global batch after `consumed_samples` samples (Megatron's `update`).
    pub fn batch_at(&self, consumed_samples: u64) -> u64 {
        if consumed_samples > self.ramp_samples {
            return self.global_batch;
        }
        // `int(consumed_samples / rampup_samples_per_increment)` in Megatron: truncation.
        let increments = (consumed_samples as f64 / self.samples_per_increment) as u64;
        increments
            .checked_mul(self.increment)
            .and_then(|grown| grown.checked_add(self.start))
            .map_or(self.global_batch, |batch| batch.min(self.global_batch))
    }

    /// Optimizer steps Megatron-LM runs for `train_samples` (its `update_train_iters`):
    /// every step of the ramp loop (which runs while consumed samples <= ramp_samples,
    /// whatever `train_samples` is), then whole global batches of what is left, rounded
    /// towards minus infinity like Python's `//`.
    pub fn train_iters(&self, train_samples: i64) -> Result<u64> {
        let train_samples = non_negative(train_samples, "train_samples")?;
        let mut iterations: u64 = 0;
        let mut consumed: u64 = 0;
        while consumed <= self.ramp_samples {
            consumed = consumed.saturating_add(self.batch_at(consumed));
            iterations += 1;
            if iterations > MAX_TABLE_STEPS {
                return Err(Error::invalid(format!(
                    "the ramp takes more than {MAX_TABLE_STEPS} steps (ramp_samples={}, start={})",
                    self.ramp_samples, self.start
                )));
            }
        }
        let global = self.global_batch;
        Ok(if train_samples >= consumed {
            iterations + (train_samples - consumed) / global
        } else {
            // Python floor division of a negative number.
            let deficit_batches = (consumed - train_samples).div_ceil(global);
            iterations.saturating_sub(deficit_batches)
        })
    }
}

/// A linear ramp from `start` to `end` over `ramp_tokens` tokens, rounded down to a
/// multiple of `multiple_of`, then constant at `end`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinearRamp {
    pub start: u64,
    pub end: u64,
    pub ramp_tokens: u64,
    pub by: RampBy,
    pub multiple_of: u64,
}

/// Ramps linear in steps square the batch; keep the squares within `u128` arithmetic.
const MAX_STEP_RAMP_BATCH: u64 = u32::MAX as u64;

impl LinearRamp {
    /// Validate a ramp: positive, non-decreasing, ends on the rounding grid.
    pub fn new(
        start: i64,
        end: i64,
        ramp_tokens: i64,
        by: RampBy,
        multiple_of: i64,
    ) -> Result<Self> {
        let start = positive(start, "start")?;
        let end = positive(end, "end")?;
        let ramp_tokens = positive(ramp_tokens, "ramp_tokens")?;
        let multiple_of = positive(multiple_of, "multiple_of")?;
        if end < start {
            return Err(Error::invalid(format!(
                "the ramp must not decrease: end={end} is below start={start}"
            )));
        }
        for (name, value) in [("start", start), ("end", end)] {
            if value % multiple_of != 0 {
                return Err(Error::invalid(format!(
                    "{name}={value} is not a multiple of multiple_of={multiple_of}; nearest valid \
                     {name}: {}",
                    nearest_on_grid(value, 0, multiple_of)
                )));
            }
        }
        if by == RampBy::Steps && end > MAX_STEP_RAMP_BATCH {
            return Err(Error::invalid(format!(
                "end={end} is too large for by='steps' (at most {MAX_STEP_RAMP_BATCH})"
            )));
        }
        Ok(Self {
            start,
            end,
            ramp_tokens,
            by,
            multiple_of,
        })
    }

    /// The batch after `tokens` consumed tokens.
    ///
    /// Linear in tokens: `start + (end - start) * tokens / ramp_tokens`. Linear in steps:
    /// a batch growing by a constant per step has consumed `T(b) ~ (b^2 - start^2) / (2 r)`
    /// tokens when it reaches `b`, so `b(T) = sqrt(start^2 + (end^2 - start^2) T / ramp)`,
    /// which reaches `end` exactly at `ramp_tokens`. Both are rounded down to the grid.
    pub fn batch_at(&self, tokens: u64) -> u64 {
        if tokens >= self.ramp_tokens {
            return self.end;
        }
        // Fast path: the product fits in 64 bits for any realistic ramp.
        if self.by == RampBy::Tokens {
            if let Some(product) = (self.end - self.start).checked_mul(tokens) {
                let exact = self.start + product / self.ramp_tokens;
                return self.round_down(exact);
            }
        }
        let (start, end) = (u128::from(self.start), u128::from(self.end));
        let (tokens, ramp) = (u128::from(tokens), u128::from(self.ramp_tokens));
        // tokens < ramp < 2^63 and (end - start) < 2^64: the products fit in u128.
        let exact = match self.by {
            RampBy::Tokens => start + (end - start) * tokens / ramp,
            RampBy::Steps => {
                // end <= 2^32, so the squares are < 2^64 and the product < 2^127.
                let squared = start * start + (end * end - start * start) * tokens / ramp;
                squared.isqrt()
            }
        };
        let exact = u64::try_from(exact).unwrap_or(self.end).min(self.end);
        self.round_down(exact)
    }

    /// `value` rounded down to the grid, never below `start`.
    fn round_down(&self, value: u64) -> u64 {
        if self.multiple_of == 1 {
            return value;
        }
        (value / self.multiple_of * self.multiple_of).max(self.start)
    }
}

/// Constant batches switching at boundaries of the schedule's key (consumed tokens, or
/// consumed samples for Megatron-LM's step schedule).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piecewise {
    /// Where each piece starts, in the key's unit.
    pub from: Vec<u64>,
    pub batches: Vec<u64>,
}

impl Piecewise {
    /// Validate: starts at 0, boundaries strictly increase, batches are positive and
    /// (unless `allow_decrease`) never decrease. `key` names the boundaries' unit in errors.
    pub fn new(from: &[i64], batches: &[i64], allow_decrease: bool, key: Key) -> Result<Self> {
        let unit = key.name();
        if from.is_empty() {
            return Err(Error::invalid(format!(
                "a piecewise schedule needs at least one (from_{unit}, batch) piece"
            )));
        }
        if from.len() != batches.len() {
            return Err(Error::invalid(format!(
                "{} boundaries for {} batches",
                from.len(),
                batches.len()
            )));
        }
        let mut starts = Vec::with_capacity(from.len());
        let mut sizes = Vec::with_capacity(batches.len());
        for (i, (&start, &batch)) in from.iter().zip(batches).enumerate() {
            let start = non_negative(start, &format!("from_{unit} of piece {i}"))?;
            let batch = positive(batch, &format!("batch of piece {i}"))?;
            if i == 0 && start != 0 {
                return Err(Error::invalid(format!(
                    "the first piece must start at 0 {unit}, got {start}"
                )));
            }
            if let (Some(&previous_from), Some(&previous_batch)) = (starts.last(), sizes.last()) {
                if start <= previous_from {
                    return Err(Error::invalid(format!(
                        "from_{unit} must increase: piece {i} starts at {start}, piece {} at \
                         {previous_from}",
                        i - 1
                    )));
                }
                if batch < previous_batch && !allow_decrease {
                    return Err(Error::invalid(format!(
                        "the schedule decreases at piece {i} (from {previous_batch} to {batch}); \
                         pass allow_decrease=True if that is intended"
                    )));
                }
            }
            starts.push(start);
            sizes.push(batch);
        }
        Ok(Self {
            from: starts,
            batches: sizes,
        })
    }

    /// The batch of the last piece starting at or before `at`.
    pub fn batch_at(&self, at: u64) -> u64 {
        let piece = self
            .from
            .partition_point(|&from| from <= at)
            .saturating_sub(1);
        self.batches.get(piece).copied().unwrap_or(1)
    }
}

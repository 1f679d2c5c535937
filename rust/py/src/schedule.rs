//! Bindings of `tokenbatch_core::schedule`.

use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;
use tokenbatch_core::schedule::{self, BatchUnit, Curve, RampBy};

use crate::arrays::as_slice;
use crate::error::{guard, IntoPyResult};
use crate::parallel::detach_parallel;

type Arr<'py> = Bound<'py, PyArray1<i64>>;

/// A validated batch-size schedule (see `tokenbatch.schedule`).
#[pyclass(module = "tokenbatch._core", name = "Schedule", frozen)]
pub struct PySchedule {
    pub(crate) inner: schedule::Schedule,
}

#[pymethods]
impl PySchedule {
    /// Megatron-LM's `--rampup-batch-size`, in sequences, keyed by consumed samples.
    #[staticmethod]
    #[pyo3(signature = (start, increment, ramp_samples, global_batch, seq_len))]
    fn megatron(
        start: i64,
        increment: i64,
        ramp_samples: i64,
        global_batch: i64,
        seq_len: Option<i64>,
    ) -> PyResult<Self> {
        guard("Schedule.megatron", || {
            let inner =
                schedule::Schedule::megatron(start, increment, ramp_samples, global_batch, seq_len)
                    .into_py_result()?;
            Ok(Self { inner })
        })
    }

    /// A linear ramp over the first `ramp_tokens` tokens.
    #[staticmethod]
    #[pyo3(signature = (start, end, ramp_tokens, *, unit, seq_len, by, multiple_of))]
    fn linear(
        start: i64,
        end: i64,
        ramp_tokens: i64,
        unit: &str,
        seq_len: Option<i64>,
        by: &str,
        multiple_of: i64,
    ) -> PyResult<Self> {
        guard("Schedule.linear", || {
            let unit: BatchUnit = unit.parse().into_py_result()?;
            let by: RampBy = by.parse().into_py_result()?;
            let inner =
                schedule::Schedule::linear(start, end, ramp_tokens, unit, seq_len, by, multiple_of)
                    .into_py_result()?;
            Ok(Self { inner })
        })
    }

    /// Constant batches switching at token boundaries.
    #[staticmethod]
    #[pyo3(signature = (from_tokens, batches, *, unit, seq_len, allow_decrease))]
    fn piecewise(
        from_tokens: PyReadonlyArray1<'_, i64>,
        batches: PyReadonlyArray1<'_, i64>,
        unit: &str,
        seq_len: Option<i64>,
        allow_decrease: bool,
    ) -> PyResult<Self> {
        guard("Schedule.piecewise", || {
            let unit: BatchUnit = unit.parse().into_py_result()?;
            let inner = schedule::Schedule::piecewise(
                as_slice(&from_tokens)?,
                as_slice(&batches)?,
                unit,
                seq_len,
                allow_decrease,
            )
            .into_py_result()?;
            Ok(Self { inner })
        })
    }

    /// Megatron-LM's `--step-batch-size-schedule`, thresholds in consumed samples.
    #[staticmethod]
    #[pyo3(signature = (from_samples, batches, seq_len))]
    fn megatron_steps(
        from_samples: PyReadonlyArray1<'_, i64>,
        batches: PyReadonlyArray1<'_, i64>,
        seq_len: Option<i64>,
    ) -> PyResult<Self> {
        guard("Schedule.megatron_steps", || {
            let inner = schedule::Schedule::megatron_steps(
                as_slice(&from_samples)?,
                as_slice(&batches)?,
                seq_len,
            )
            .into_py_result()?;
            Ok(Self { inner })
        })
    }

    /// Batch (in the schedule's unit) at each consumed amount.
    fn batch_at<'py>(
        &self,
        py: Python<'py>,
        consumed: PyReadonlyArray1<'py, i64>,
    ) -> PyResult<Arr<'py>> {
        guard("Schedule.batch_at", || {
            let consumed = as_slice(&consumed)?;
            // Parallel over large arrays: run in tokenbatch's fork-safe pool.
            let batches = detach_parallel(py, || self.inner.batch_at(consumed)).into_py_result()?;
            Ok(batches.into_pyarray(py))
        })
    }

    /// Per-step table: (batch_sequences, batch_tokens, grad_accum_steps, consumed_tokens).
    fn table<'py>(
        &self,
        py: Python<'py>,
        total_tokens: i64,
        micro_batch_tokens: i64,
        dp: i64,
    ) -> PyResult<(Arr<'py>, Arr<'py>, Arr<'py>, Arr<'py>)> {
        guard("Schedule.table", || {
            let table = py
                .detach(|| self.inner.table(total_tokens, micro_batch_tokens, dp))
                .into_py_result()?;
            Ok((
                table.batch_sequences.into_pyarray(py),
                table.batch_tokens.into_pyarray(py),
                table.grad_accum_steps.into_pyarray(py),
                table.consumed_tokens.into_pyarray(py),
            ))
        })
    }

    /// Step offsets (in rounds of `dp` micro-batches) that follow the schedule.
    fn group_into_steps<'py>(
        &self,
        py: Python<'py>,
        micro_batch_tokens: PyReadonlyArray1<'py, i64>,
        dp: i64,
        consumed_tokens: u64,
    ) -> PyResult<Arr<'py>> {
        guard("Schedule.group_into_steps", || {
            let tokens = as_slice(&micro_batch_tokens)?;
            let offsets = py
                .detach(|| schedule::group_into_steps(tokens, &self.inner, dp, consumed_tokens))
                .into_py_result()?;
            Ok(offsets.into_pyarray(py))
        })
    }

    /// Megatron-LM's `train_iters` for `train_samples`; `None` for other curves.
    fn megatron_train_iters(&self, train_samples: i64) -> PyResult<Option<u64>> {
        guard("Schedule.megatron_train_iters", || {
            let Curve::Megatron(ramp) = self.inner.curve() else {
                return Ok(None);
            };
            ramp.train_iters(train_samples).into_py_result().map(Some)
        })
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySchedule>()?;
    Ok(())
}

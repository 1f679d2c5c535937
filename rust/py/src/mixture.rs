//! Bindings of `tokenbatch_core::deal::mixture`: the classes behind the mixtures of
//! `tokenbatch.mixture` and the mixture plans of the sampler.

use numpy::{PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1};
use pyo3::prelude::*;
use tokenbatch_core::deal::mixture::{
    self, Exhausted, Interpolation, Mixture, MixturePlan, ShareSchedule,
};
use tokenbatch_core::deal::DealOptions;
use tokenbatch_core::error::at_least;
use tokenbatch_core::packing::{PackOptions, PackingKind};

use crate::arrays::{as_slice, readonly_vec};
use crate::deal::PyEpochDeal;
use crate::error::{guard, IntoPyResult};
use crate::parallel::detach_parallel;
use crate::schedule::PySchedule;

/// Target shares of named sources over consumed tokens (see ``tokenbatch.Mixture``).
#[pyclass(module = "tokenbatch._core", name = "ShareSchedule", frozen)]
pub struct PyShareSchedule {
    inner: ShareSchedule,
}

#[pymethods]
impl PyShareSchedule {
    #[new]
    #[pyo3(signature = (points, shares, n_sources, interpolation))]
    fn new(
        points: Vec<i64>,
        shares: Vec<f64>,
        n_sources: usize,
        interpolation: &str,
    ) -> PyResult<Self> {
        guard("ShareSchedule.__new__", || {
            let interpolation: Interpolation = interpolation.parse().into_py_result()?;
            let inner =
                ShareSchedule::new(&points, &shares, n_sources, interpolation).into_py_result()?;
            Ok(Self { inner })
        })
    }

    /// Shares of every source after `consumed` tokens.
    fn at<'py>(&self, py: Python<'py>, consumed: i64) -> PyResult<Bound<'py, PyArray1<f64>>> {
        guard("ShareSchedule.at", || {
            let consumed = at_least(consumed, 0, "consumed").into_py_result()?;
            Ok(readonly_vec(py, self.inner.at(consumed)))
        })
    }
}

/// Plans passes over a mixture of sources for the sampler: one step after another, each
/// packed and dealt to the ranks.
#[pyclass(module = "tokenbatch._core", name = "MixtureDealer", frozen)]
pub struct PyMixtureDealer {
    mixture: Mixture,
    schedule: tokenbatch_core::schedule::Schedule,
    pack_options: PackOptions,
    kind: PackingKind,
    deal_options: DealOptions,
}

#[pymethods]
impl PyMixtureDealer {
    #[new]
    #[pyo3(signature = (
        names, lengths, sizes, max_repetition, shares, exhausted, schedule, *, max_tokens,
        kind, algorithm, max_seqs, pad_to_multiple_of, oversize, num_replicas, seed, shuffle,
        balance, drop_last, hidden_size
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        names: Vec<String>,
        lengths: PyReadonlyArray1<'_, i64>,
        sizes: Vec<i64>,
        max_repetition: Vec<i64>,
        shares: &PyShareSchedule,
        exhausted: &str,
        schedule: &PySchedule,
        max_tokens: i64,
        kind: &str,
        algorithm: &str,
        max_seqs: Option<i64>,
        pad_to_multiple_of: i64,
        oversize: &str,
        num_replicas: i64,
        seed: u64,
        shuffle: bool,
        balance: Option<&str>,
        drop_last: bool,
        hidden_size: Option<i64>,
    ) -> PyResult<Self> {
        guard("MixtureDealer.__new__", || {
            let exhausted: Exhausted = exhausted.parse().into_py_result()?;
            let kind: PackingKind = kind.parse().into_py_result()?;
            let lengths = as_slice(&lengths)?.to_vec();
            let pack_options = PackOptions::new(
                max_tokens,
                max_seqs,
                pad_to_multiple_of,
                oversize,
                algorithm,
                seed,
            )
            .into_py_result()?;
            let deal_options = DealOptions::new(
                num_replicas,
                seed,
                shuffle,
                balance,
                drop_last,
                pad_to_multiple_of,
                oversize == "split",
                hidden_size,
            )
            .into_py_result()?;
            let shares = shares.inner.clone();
            let mixture = py
                .detach(|| Mixture::new(names, lengths, &sizes, &max_repetition, shares, exhausted))
                .into_py_result()?;
            Ok(Self {
                mixture,
                schedule: schedule.inner.clone(),
                pack_options,
                kind,
                deal_options,
            })
        })
    }

    /// The plan of pass `epoch`, which starts after `consumed_before` tokens.
    fn plan(&self, py: Python<'_>, epoch: i64, consumed_before: i64) -> PyResult<PyMixturePlan> {
        guard("MixtureDealer.plan", || {
            let epoch = at_least(epoch, 0, "epoch").into_py_result()?;
            let consumed = at_least(consumed_before, 0, "consumed_before").into_py_result()?;
            let plan = detach_parallel(py, || {
                mixture::plan(
                    &self.mixture,
                    &self.schedule,
                    &self.pack_options,
                    self.kind,
                    &self.deal_options,
                    epoch,
                    consumed,
                )
            })
            .into_py_result()?;
            PyMixturePlan::from_plan(py, plan, self.mixture.n_sources())
        })
    }

    /// Real tokens of pass `epoch` (its steps composed, not packed).
    fn epoch_tokens(&self, py: Python<'_>, epoch: i64, consumed_before: i64) -> PyResult<u64> {
        guard("MixtureDealer.epoch_tokens", || {
            let epoch = at_least(epoch, 0, "epoch").into_py_result()?;
            let consumed = at_least(consumed_before, 0, "consumed_before").into_py_result()?;
            let composition = py
                .detach(|| {
                    mixture::compose(
                        &self.mixture,
                        &self.schedule,
                        &self.pack_options,
                        self.deal_options.seed,
                        epoch,
                        consumed,
                    )
                })
                .into_py_result()?;
            Ok(composition.total_tokens)
        })
    }
}

/// One pass over a mixture: its deal, its optimizer steps and their tokens per source.
#[pyclass(module = "tokenbatch._core", name = "MixturePlan", frozen)]
pub struct PyMixturePlan {
    #[pyo3(get)]
    deal: Py<PyEpochDeal>,
    #[pyo3(get)]
    step_offsets: Py<PyArray1<i64>>,
    #[pyo3(get)]
    source_tokens: Py<PyArray2<i64>>,
    #[pyo3(get)]
    target_tokens: Py<PyArray2<f64>>,
    #[pyo3(get)]
    budgets: Py<PyArray1<i64>>,
    #[pyo3(get)]
    repetitions: Py<PyArray1<i64>>,
    #[pyo3(get)]
    total_tokens: u64,
}

impl PyMixturePlan {
    fn from_plan(py: Python<'_>, plan: MixturePlan, n_sources: usize) -> PyResult<Self> {
        let n_steps = plan.budgets.len();
        Ok(Self {
            deal: Py::new(py, PyEpochDeal::from(plan.deal))?,
            step_offsets: readonly_vec(py, plan.step_offsets).unbind(),
            source_tokens: readonly_vec(py, plan.source_tokens)
                .reshape([n_steps, n_sources])?
                .unbind(),
            target_tokens: readonly_vec(py, plan.target_tokens)
                .reshape([n_steps, n_sources])?
                .unbind(),
            budgets: readonly_vec(py, plan.budgets).unbind(),
            repetitions: readonly_vec(py, plan.repetitions).unbind(),
            total_tokens: plan.total_tokens,
        })
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyShareSchedule>()?;
    m.add_class::<PyMixtureDealer>()?;
    m.add_class::<PyMixturePlan>()?;
    Ok(())
}

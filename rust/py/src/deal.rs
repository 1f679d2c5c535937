//! Bindings of `tokenbatch_core::deal`: the classes behind `tokenbatch.distribute.Dealer`
//! and `tokenbatch.distribute.EpochDeal`, which read the user's arguments.

use std::sync::Arc;

use numpy::ndarray::ArrayView2;
use numpy::{IntoPyArray, PyArray1, PyArray2, PyArrayMethods};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList};
use tokenbatch_core::deal::{
    CostKind, DealOptions, DealStats, Dealer, EpochDeal, Run, DEAL_FORMAT,
};
use tokenbatch_core::error::{at_least, at_least_usize};
use tokenbatch_core::rng;

use crate::arrays::{readonly_or_zeros, readonly_slice, readonly_view};
use crate::error::{guard, IntoPyResult};
use crate::packing::PyPacking;
use crate::parallel::detach_parallel;

type Arr<'py> = Bound<'py, PyArray1<i64>>;

/// Deals the bins of one packing to ranks, epoch by epoch, reusing the epoch-independent
/// work (see ``tokenbatch.distribute.Dealer``).
#[pyclass(module = "tokenbatch._core", name = "Dealer", frozen)]
pub struct PyDealer {
    dealer: Dealer,
    packing: Py<PyPacking>,
}

#[pymethods]
impl PyDealer {
    #[new]
    #[pyo3(signature = (
        packing, num_replicas, *, seed, shuffle, balance, drop_last, pad_to_multiple_of,
        split_sequences, hidden_size
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        packing: Bound<'_, PyPacking>,
        num_replicas: i64,
        seed: u64,
        shuffle: bool,
        balance: Option<&str>,
        drop_last: bool,
        pad_to_multiple_of: i64,
        split_sequences: bool,
        hidden_size: Option<i64>,
    ) -> PyResult<Self> {
        guard("Dealer.__new__", || {
            let options = DealOptions::new(
                num_replicas,
                seed,
                shuffle,
                balance,
                drop_last,
                pad_to_multiple_of,
                split_sequences,
                hidden_size,
            )
            .into_py_result()?;
            let bins = Arc::clone(packing.get().bins());
            let dealer = detach_parallel(py, || Dealer::new(bins, options)).into_py_result()?;
            Ok(Self {
                dealer,
                packing: packing.unbind(),
            })
        })
    }

    /// The packing dealt.
    #[getter]
    fn packing(&self, py: Python<'_>) -> Py<PyPacking> {
        self.packing.clone_ref(py)
    }

    #[getter]
    fn num_replicas(&self) -> usize {
        self.options().num_replicas
    }

    #[getter]
    fn seed(&self) -> u64 {
        self.options().seed
    }

    #[getter]
    fn shuffle(&self) -> bool {
        self.options().shuffle
    }

    #[getter]
    fn balance(&self) -> Option<&'static str> {
        self.options().balance.map(CostKind::name)
    }

    #[getter]
    fn drop_last(&self) -> bool {
        self.options().drop_last
    }

    #[getter]
    fn pad_to_multiple_of(&self) -> u64 {
        self.options().pad_to_multiple_of
    }

    #[getter]
    fn split_sequences(&self) -> bool {
        self.options().split_sequences
    }

    #[getter]
    fn hidden_size(&self) -> Option<u64> {
        self.options().hidden_size
    }

    /// Real tokens of every epoch's deal.
    #[getter]
    fn epoch_tokens(&self) -> u64 {
        self.dealer.deck().dealt_tokens()
    }

    /// The deal of `epoch`.
    fn deal(&self, py: Python<'_>, epoch: i64) -> PyResult<PyEpochDeal> {
        guard("Dealer.deal", || {
            let epoch = at_least(epoch, 0, "epoch").into_py_result()?;
            Ok(detach_parallel(py, || self.dealer.deal(epoch)).into())
        })
    }

    /// The deal that finishes `epoch` after `runs` `(num_replicas, steps)` on other world
    /// sizes.
    fn deal_after(
        &self,
        py: Python<'_>,
        epoch: i64,
        runs: Vec<(i64, i64)>,
    ) -> PyResult<PyEpochDeal> {
        guard("Dealer.deal_after", || {
            let epoch = at_least(epoch, 0, "epoch").into_py_result()?;
            let runs = runs
                .into_iter()
                .map(|(num_replicas, steps)| Run::new(num_replicas, steps))
                .collect::<Result<Vec<Run>, _>>()
                .into_py_result()?;
            let deal =
                detach_parallel(py, || self.dealer.deal_after(epoch, &runs)).into_py_result()?;
            Ok(deal.into())
        })
    }
}

impl PyDealer {
    fn options(&self) -> &DealOptions {
        self.dealer.deck().options()
    }
}

/// One epoch of data-parallel micro-batches (see ``tokenbatch.distribute.EpochDeal``).
#[pyclass(module = "tokenbatch._core", name = "EpochDeal", frozen)]
pub struct PyEpochDeal {
    deal: EpochDeal,
    /// `starts` when no sequence was split, made on first use.
    zero_starts: PyOnceLock<Py<PyArray1<i64>>>,
}

impl From<EpochDeal> for PyEpochDeal {
    fn from(deal: EpochDeal) -> Self {
        Self {
            deal,
            zero_starts: PyOnceLock::new(),
        }
    }
}

impl PyEpochDeal {
    /// A read-only view of `data`, which this deal owns.
    fn view<'py>(slf: &Bound<'py, Self>, data: &[i64]) -> Arr<'py> {
        // SAFETY: every `data` passed is a slice of the frozen deal's arrays (its table, or
        // its deck's, behind an `Arc` the deal holds), which never change.
        unsafe { readonly_slice(slf.as_any(), data) }
    }

    /// The table of bins as an `(n_steps, num_replicas)` array view.
    fn table_view(&self) -> PyResult<ArrayView2<'_, i64>> {
        let shape = (self.deal.n_steps(), self.deal.num_replicas());
        ArrayView2::from_shape(shape, self.deal.steps())
            .map_err(|error| PyRuntimeError::new_err(error.to_string()))
    }

    fn table<'py, T: numpy::Element>(
        &self,
        py: Python<'py>,
        values: Vec<T>,
    ) -> PyResult<Bound<'py, PyArray2<T>>> {
        let shape = [self.deal.n_steps(), self.deal.num_replicas()];
        values.into_pyarray(py).reshape(shape)
    }
}

#[pymethods]
impl PyEpochDeal {
    #[getter]
    fn steps<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyArray2<i64>>> {
        // SAFETY: the table belongs to the frozen deal and never changes.
        Ok(unsafe { readonly_view(slf.as_any(), &slf.get().table_view()?) })
    }

    #[getter]
    fn bin_offsets<'py>(slf: &Bound<'py, Self>) -> Arr<'py> {
        Self::view(slf, slf.get().deal.deck().bin_offsets())
    }

    #[getter]
    fn indices<'py>(slf: &Bound<'py, Self>) -> Arr<'py> {
        Self::view(slf, slf.get().deal.deck().indices())
    }

    #[getter]
    fn starts<'py>(slf: &Bound<'py, Self>) -> Arr<'py> {
        let this = slf.get();
        let deck = this.deal.deck();
        let n = deck.indices().len();
        // SAFETY: the starts belong to the frozen deal's deck, which never changes.
        unsafe { readonly_or_zeros(slf.as_any(), deck.starts(), n, &this.zero_starts) }
    }

    #[getter]
    fn lengths<'py>(slf: &Bound<'py, Self>) -> Arr<'py> {
        Self::view(slf, slf.get().deal.deck().lengths())
    }

    #[getter]
    fn epoch(&self) -> u64 {
        self.deal.epoch()
    }

    #[getter]
    fn num_replicas(&self) -> usize {
        self.deal.num_replicas()
    }

    #[getter]
    fn n_steps(&self) -> usize {
        self.deal.n_steps()
    }

    /// Bins of `rank`, in step order (a read-only view of a column of `steps`).
    fn rank_bins<'py>(slf: &Bound<'py, Self>, rank: i64) -> PyResult<Arr<'py>> {
        guard("EpochDeal.rank_bins", || {
            let this = slf.get();
            let rank = this.deal.check_rank(rank).into_py_result()?;
            // SAFETY: the column is part of the frozen deal's table, which never changes.
            Ok(unsafe { readonly_view(slf.as_any(), &this.table_view()?.column(rank)) })
        })
    }

    /// The batches of `rank` from step `start` on.
    fn batches(
        slf: &Bound<'_, Self>,
        rank: i64,
        start: i64,
        segments: bool,
    ) -> PyResult<RankBatches> {
        guard("EpochDeal.batches", || {
            let rank = slf.get().deal.check_rank(rank).into_py_result()?;
            let next = at_least_usize(start, 0, "start").into_py_result()?;
            Ok(RankBatches {
                deal: slf.clone().unbind(),
                rank,
                next,
                segments,
            })
        })
    }

    /// The bins no rank has run before step `step`, as a packing of their own.
    fn rest(&self, py: Python<'_>, step: i64) -> PyResult<PyPacking> {
        guard("EpochDeal.rest", || {
            let step = at_least_usize(step, 0, "step").into_py_result()?;
            let bins = py.detach(|| self.deal.rest(step)).into_py_result()?;
            Ok(PyPacking::new(bins))
        })
    }

    /// Cost of `kind` of every bin of the table.
    fn step_costs<'py>(&self, py: Python<'py>, kind: &str) -> PyResult<Bound<'py, PyArray2<f64>>> {
        guard("EpochDeal.step_costs", || {
            let kind: CostKind = kind.parse().into_py_result()?;
            let costs = self.deal.step_costs(kind).into_py_result()?;
            self.table(py, costs)
        })
    }

    /// Real (non-padding) tokens of every bin of the table.
    fn real_tokens<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<i64>>> {
        guard("EpochDeal.real_tokens", || {
            self.table(py, self.deal.real_tokens())
        })
    }

    /// Counts and balance of this epoch.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        guard("EpochDeal.stats", || stats_dict(py, &self.deal.stats()))
    }
}

fn stats_dict<'py>(py: Python<'py>, stats: &DealStats) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("epoch", stats.epoch)?;
    dict.set_item("num_replicas", stats.num_replicas)?;
    dict.set_item("n_steps", stats.n_steps)?;
    dict.set_item("n_bins", stats.n_bins)?;
    dict.set_item("n_seqs", stats.n_seqs)?;
    dict.set_item("n_segments", stats.n_segments)?;
    dict.set_item("max_tokens", stats.max_tokens)?;
    dict.set_item("total_tokens", stats.total_tokens)?;
    dict.set_item("padding_tokens", stats.padding_tokens)?;
    dict.set_item("padding_ratio", stats.padding_ratio)?;
    dict.set_item("efficiency", stats.efficiency)?;
    dict.set_item("split_bins", stats.split_bins)?;
    dict.set_item("split_seqs", stats.split_seqs)?;
    dict.set_item("dropped_bins", stats.dropped_bins)?;
    dict.set_item("drop_last_seqs", stats.drop_last_seqs)?;
    dict.set_item("drop_last_tokens", stats.drop_last_tokens)?;
    dict.set_item("dropped_seqs", stats.dropped_seqs)?;
    for imbalance in &stats.imbalance {
        let name = imbalance.kind.name();
        dict.set_item(format!("{name}_imbalance_max"), imbalance.max)?;
        dict.set_item(format!("{name}_imbalance_mean"), imbalance.mean)?;
        dict.set_item(format!("{name}_sync_overhead"), imbalance.sync_overhead)?;
    }
    Ok(dict)
}

/// Iterator over the batches of one rank of an `EpochDeal` (lists of sequence indices, or
/// of `(index, start, length)` tuples).
#[pyclass(module = "tokenbatch._core", name = "RankBatches")]
pub struct RankBatches {
    deal: Py<PyEpochDeal>,
    rank: usize,
    next: usize,
    segments: bool,
}

#[pymethods]
impl RankBatches {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyList>>> {
        let deal = &self.deal.get().deal;
        if self.next >= deal.n_steps() {
            return Ok(None);
        }
        let deck = deal.deck();
        let range = deck.segment_range(deal.bin_at(self.next, self.rank));
        self.next += 1;
        let indices = &deck.indices()[range.clone()];
        if !self.segments {
            return PyList::new(py, indices).map(Some);
        }
        let first = range.start;
        let lengths = &deck.lengths()[range];
        let triples = (0..indices.len()).map(|j| (indices[j], deck.start(first + j), lengths[j]));
        PyList::new(py, triples).map(Some)
    }

    /// Batches left.
    fn __length_hint__(&self) -> usize {
        self.deal.get().deal.n_steps().saturating_sub(self.next)
    }
}

/// Mix integers (each in ``[0, 2**64)``) into one 64-bit seed, as every random choice of
/// tokenbatch does.
#[pyfunction]
fn mix_seed(parts: Vec<u64>) -> u64 {
    rng::mix_seed(&parts)
}

/// A seeded random permutation of ``range(n)`` (Fisher-Yates with SplitMix64).
#[pyfunction]
fn permutation(py: Python<'_>, seed: u64, n: usize) -> PyResult<Bound<'_, PyArray1<i64>>> {
    guard("permutation", || {
        let mut items: Vec<i64> = (0..n as i64).collect();
        rng::SplitMix64::new(seed).shuffle(&mut items);
        Ok(items.into_pyarray(py))
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("DEAL_FORMAT", DEAL_FORMAT)?;
    m.add_class::<PyDealer>()?;
    m.add_class::<PyEpochDeal>()?;
    m.add_class::<RankBatches>()?;
    m.add_function(wrap_pyfunction!(mix_seed, m)?)?;
    m.add_function(wrap_pyfunction!(permutation, m)?)?;
    Ok(())
}

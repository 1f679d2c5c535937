//! Bindings of `tokenbatch_core::deal`: the `Dealer` and `EpochDeal` classes.

use std::sync::Arc;

use numpy::ndarray::ArrayView2;
use numpy::{IntoPyArray, PyArray1, PyArray2, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList};
use tokenbatch_core::deal::{
    CostKind, DealOptions, DealStats, Dealer, EpochDeal, Run, DEAL_FORMAT,
};
use tokenbatch_core::rng;

use crate::args::{self, Arg};
use crate::arrays::{readonly_or_zeros, readonly_slice, readonly_view};
use crate::error::{guard, invalid_type, invalid_value, IntoPyResult};
use crate::packing::PyPacking;
use crate::parallel::detach_parallel;

type Arr<'py> = Bound<'py, PyArray1<i64>>;

/// Builds :class:`EpochDeal` objects for one packing, reusing the epoch-independent work
/// (cutting bins so that their count divides by ``num_replicas``, costs, the order by cost)
/// across epochs.
///
/// Args:
///     packing: a result of :func:`tokenbatch.pack` or :func:`tokenbatch.batch_padded`.
///     num_replicas: number of data-parallel ranks.
///     seed: the same on every rank; deals are identical for equal arguments.
///     shuffle: shuffle, every epoch, the order of steps, which rank runs which bin of a
///         step, and bins of equal cost; ``False`` keeps the deterministic order
///         (costliest steps first when balancing).
///     balance: ``"attention"`` groups bins of similar attention cost (sum of squared
///         padded sequence lengths) into the same step, ``"tokens"`` bins of similar token
///         count, ``"flops"`` bins of similar total FLOPs (tokens plus
///         attention / (12 hidden_size), needs ``hidden_size``); ``None`` deals bins in
///         (shuffled) packing order.
///     drop_last: when the number of bins does not divide by ``num_replicas``, leave out
///         the least-filled remainder bins instead of cutting bins.
///     pad_to_multiple_of: the value the packing was built with: every cost counts each
///         sequence at its length rounded up to this multiple (a kernel that needs the
///         padding, as context parallelism does, spends attention time on it too).
///     split_sequences: when cutting bins between their sequences cannot make enough
///         bins, cut the longest sequences into pieces first (the batches then hold
///         ``(index, start, length)`` segments, as with ``oversize="split"``).
///     hidden_size: the model's hidden size, for the ``"flops"`` cost (and its imbalance
///         in :meth:`EpochDeal.stats`).
///
/// Without ``drop_last``, bins are cut between their sequences (the costliest first)
/// until their number divides by ``num_replicas``; no sequence is lost or repeated. Every
/// tie is broken by bin or sequence index and randomness comes from the Rust core's
/// SplitMix64, so deals are identical on every machine, numpy version and thread count.
///
/// Raises:
///     InvalidValueError: too few sequences to give every rank the same number of
///         non-empty batches (pass ``drop_last=True``), or an invalid option.
#[pyclass(module = "tokenbatch._core", name = "Dealer", frozen)]
pub struct PyDealer {
    dealer: Dealer,
    packing: Py<PyPacking>,
}

#[pymethods]
impl PyDealer {
    #[new]
    #[pyo3(signature = (
        packing, num_replicas, *, seed = Arg::MISSING, shuffle = Arg::MISSING,
        balance = Arg::MISSING, drop_last = Arg::MISSING, pad_to_multiple_of = Arg::MISSING,
        split_sequences = Arg::MISSING, hidden_size = Arg::MISSING
    ), text_signature = "(packing, num_replicas, *, seed=0, shuffle=True, balance='attention', \
        drop_last=False, pad_to_multiple_of=1, split_sequences=False, hidden_size=None)")]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        packing: &Bound<'_, PyAny>,
        num_replicas: &Bound<'_, PyAny>,
        seed: Arg<'_>,
        shuffle: Arg<'_>,
        balance: Arg<'_>,
        drop_last: Arg<'_>,
        pad_to_multiple_of: Arg<'_>,
        split_sequences: Arg<'_>,
        hidden_size: Arg<'_>,
    ) -> PyResult<Self> {
        guard("Dealer.__new__", || {
            let packing = packing.cast::<PyPacking>().map_err(|_| {
                invalid_type(format!(
                    "packing must be a tokenbatch.Packing, got {}",
                    args::repr(packing)
                ))
            })?;
            let balance = match balance.given() {
                None => Some(CostKind::Attention),
                Some(value) if value.is_none() => None,
                Some(value) => Some(args::choice(value, "balance").map_err(|_| {
                    invalid_value(format!(
                        "balance must be 'attention', 'tokens', 'flops' or None, got {}",
                        args::repr(value)
                    ))
                })?),
            };
            let options = DealOptions {
                num_replicas: args::int(num_replicas, "num_replicas", 1)? as usize,
                seed: seed.given().map_or(Ok(0), args::seed)?,
                shuffle: shuffle.flag_or("shuffle", true)?,
                balance,
                drop_last: drop_last.flag_or("drop_last", false)?,
                pad_to_multiple_of: pad_to_multiple_of.int_or("pad_to_multiple_of", 1, 1)? as u64,
                split_sequences: split_sequences.flag_or("split_sequences", false)?,
                hidden_size: match hidden_size.given() {
                    None => None,
                    Some(value) => args::optional_int(value, "hidden_size", 1)?.map(|h| h as u64),
                },
            };
            let bins = Arc::clone(packing.get().bins());
            let dealer = detach_parallel(py, || Dealer::new(bins, options)).into_py_result()?;
            Ok(Self {
                dealer,
                packing: packing.clone().unbind(),
            })
        })
    }

    /// The packing the deals distribute.
    #[getter]
    fn packing(&self, py: Python<'_>) -> PyResult<Py<PyPacking>> {
        guard("Dealer.packing", || Ok(self.packing.clone_ref(py)))
    }

    /// Number of data-parallel ranks.
    #[getter]
    fn num_replicas(&self) -> PyResult<usize> {
        guard("Dealer.num_replicas", || Ok(self.options().num_replicas))
    }

    /// The seed of the deals.
    #[getter]
    fn seed(&self) -> PyResult<u64> {
        guard("Dealer.seed", || Ok(self.options().seed))
    }

    /// Whether deals are shuffled every epoch.
    #[getter]
    fn shuffle(&self) -> PyResult<bool> {
        guard("Dealer.shuffle", || Ok(self.options().shuffle))
    }

    /// The cost balanced within a step (``None``: packing order).
    #[getter]
    fn balance(&self) -> PyResult<Option<&'static str>> {
        guard("Dealer.balance", || {
            Ok(self.options().balance.map(CostKind::name))
        })
    }

    /// Whether the remainder bins are left out.
    #[getter]
    fn drop_last(&self) -> PyResult<bool> {
        guard("Dealer.drop_last", || Ok(self.options().drop_last))
    }

    /// The multiple costs round each sequence up to.
    #[getter]
    fn pad_to_multiple_of(&self) -> PyResult<u64> {
        guard("Dealer.pad_to_multiple_of", || {
            Ok(self.options().pad_to_multiple_of)
        })
    }

    /// Whether sequences may be cut to give every rank the same number of batches.
    #[getter]
    fn split_sequences(&self) -> PyResult<bool> {
        guard("Dealer.split_sequences", || {
            Ok(self.options().split_sequences)
        })
    }

    /// The model's hidden size, for the FLOPs cost.
    #[getter]
    fn hidden_size(&self) -> PyResult<Option<u64>> {
        guard("Dealer.hidden_size", || Ok(self.options().hidden_size))
    }

    /// Real tokens every epoch's deal holds: the packing's, less what ``drop_last`` leaves
    /// out (the same every epoch: epochs only deal the same bins differently).
    #[getter]
    fn epoch_tokens(&self) -> PyResult<u64> {
        guard("Dealer.epoch_tokens", || {
            Ok(self.dealer.deck().dealt_tokens())
        })
    }

    /// The deal of ``epoch``.
    fn deal(&self, py: Python<'_>, epoch: &Bound<'_, PyAny>) -> PyResult<PyEpochDeal> {
        guard("Dealer.deal", || {
            let epoch = args::int(epoch, "epoch", 0)? as u64;
            let deal = detach_parallel(py, || self.dealer.deal(epoch));
            Ok(PyEpochDeal::from(deal))
        })
    }

    /// The deal that finishes ``epoch`` on this dealer's ``num_replicas`` after ``runs``
    /// of it on other world sizes, for a job resized mid-epoch.
    ///
    /// ``runs[i] = (num_replicas, steps)``: run ``i`` ran ``steps`` steps on
    /// ``num_replicas`` ranks. The first run's deal is the ordinary deal of ``epoch`` for its
    /// world size; the bins each run left are dealt again to the next world size (cut
    /// between their sequences when their number does not divide, as for any deal), so
    /// every sequence of the epoch is still used exactly once. With no runs this is
    /// :meth:`deal`.
    ///
    /// Raises:
    ///     InvalidValueError: a run has more steps than its deal, or too few sequences are
    ///         left to give every rank of the next world size a batch.
    fn deal_after(
        &self,
        py: Python<'_>,
        epoch: &Bound<'_, PyAny>,
        runs: &Bound<'_, PyAny>,
    ) -> PyResult<PyEpochDeal> {
        guard("Dealer.deal_after", || {
            let epoch = args::int(epoch, "epoch", 0)? as u64;
            let runs = runs
                .try_iter()
                .map_err(|_| {
                    invalid_type("runs must be a sequence of (num_replicas, steps) pairs")
                })?
                .map(|run| {
                    let (replicas, steps): (Bound<'_, PyAny>, Bound<'_, PyAny>) = run?
                        .extract()
                        .map_err(|_| invalid_type("runs must hold (num_replicas, steps) pairs"))?;
                    Ok(Run {
                        num_replicas: args::int(&replicas, "num_replicas of a run", 1)? as usize,
                        steps: args::int(&steps, "steps of a run", 0)? as usize,
                    })
                })
                .collect::<PyResult<Vec<Run>>>()?;
            let deal =
                detach_parallel(py, || self.dealer.deal_after(epoch, &runs)).into_py_result()?;
            Ok(PyEpochDeal::from(deal))
        })
    }

    fn __repr__(&self) -> PyResult<String> {
        guard("Dealer.__repr__", || {
            Ok({
                let options = self.options();
                format!(
                    "Dealer(num_replicas={}, seed={}, shuffle={}, balance={})",
                    options.num_replicas,
                    options.seed,
                    if options.shuffle { "True" } else { "False" },
                    options
                        .balance
                        .map_or("None".to_string(), |kind| format!("'{}'", kind.name()))
                )
            })
        })
    }
}

impl PyDealer {
    fn options(&self) -> &DealOptions {
        self.dealer.deck().options()
    }
}

/// One epoch of data-parallel micro-batches: ``steps[s, r]`` is the bin rank ``r`` runs
/// at step ``s``; bin ``b`` holds segments ``bin_offsets[b]:bin_offsets[b + 1]`` of
/// ``indices`` / ``starts`` / ``lengths`` (read-only views, no copies).
///
/// Every rank runs :attr:`n_steps` bins; every segment of the packing appears in exactly
/// one of them, except the bins ``drop_last`` left out (see :meth:`stats`). Made by
/// :meth:`Dealer.deal` and :func:`deal_epoch`.
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
    /// The ``(n_steps, num_replicas)`` table of bins.
    #[getter]
    fn steps<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyArray2<i64>>> {
        guard("EpochDeal.steps", || {
            let deal = &slf.get().deal;
            let table = ArrayView2::from_shape((deal.n_steps(), deal.num_replicas()), deal.steps())
                .map_err(|error| pyo3::exceptions::PyRuntimeError::new_err(error.to_string()))?;
            // SAFETY: the table belongs to the frozen deal and never changes.
            Ok(unsafe { readonly_view(slf.as_any(), &table) })
        })
    }

    /// ``n_bins + 1`` offsets into the segment arrays.
    #[getter]
    fn bin_offsets<'py>(slf: &Bound<'py, Self>) -> PyResult<Arr<'py>> {
        guard("EpochDeal.bin_offsets", || {
            Ok(Self::view(slf, slf.get().deal.deck().bin_offsets()))
        })
    }

    /// Input sequence of each segment.
    #[getter]
    fn indices<'py>(slf: &Bound<'py, Self>) -> PyResult<Arr<'py>> {
        guard("EpochDeal.indices", || {
            Ok(Self::view(slf, slf.get().deal.deck().indices()))
        })
    }

    /// Token offset of each segment inside its sequence.
    #[getter]
    fn starts<'py>(slf: &Bound<'py, Self>) -> PyResult<Arr<'py>> {
        guard("EpochDeal.starts", || {
            let this = slf.get();
            let deck = this.deal.deck();
            let n = deck.indices().len();
            // SAFETY: the starts belong to the frozen deal's deck, which never changes.
            Ok(unsafe { readonly_or_zeros(slf.as_any(), deck.starts(), n, &this.zero_starts) })
        })
    }

    /// Tokens of each segment.
    #[getter]
    fn lengths<'py>(slf: &Bound<'py, Self>) -> PyResult<Arr<'py>> {
        guard("EpochDeal.lengths", || {
            Ok(Self::view(slf, slf.get().deal.deck().lengths()))
        })
    }

    /// The epoch this deal is for.
    #[getter]
    fn epoch(&self) -> PyResult<u64> {
        guard("EpochDeal.epoch", || Ok(self.deal.epoch()))
    }

    /// Number of ranks.
    #[getter]
    fn num_replicas(&self) -> PyResult<usize> {
        guard("EpochDeal.num_replicas", || Ok(self.deal.num_replicas()))
    }

    /// Micro-batches every rank runs this epoch.
    #[getter]
    fn n_steps(&self) -> PyResult<usize> {
        guard("EpochDeal.n_steps", || Ok(self.deal.n_steps()))
    }

    fn __len__(&self) -> PyResult<usize> {
        guard("EpochDeal.__len__", || Ok(self.deal.n_steps()))
    }

    /// Bins of ``rank``, in step order (a read-only view of a column of :attr:`steps`).
    fn rank_bins<'py>(slf: &Bound<'py, Self>, rank: &Bound<'py, PyAny>) -> PyResult<Arr<'py>> {
        guard("EpochDeal.rank_bins", || {
            let deal = &slf.get().deal;
            let rank = deal
                .check_rank(args::int(rank, "rank", i64::MIN)?)
                .into_py_result()?;
            let table = ArrayView2::from_shape((deal.n_steps(), deal.num_replicas()), deal.steps())
                .map_err(|error| pyo3::exceptions::PyRuntimeError::new_err(error.to_string()))?;
            // SAFETY: the column is part of the frozen deal's table, which never changes.
            Ok(unsafe { readonly_view(slf.as_any(), &table.column(rank)) })
        })
    }

    /// Iterate over the batches of ``rank`` from step ``start`` on.
    ///
    /// A batch is a list of sequence indices, or with ``segments=True`` a list of
    /// ``(index, start, length)`` tuples (needed when sequences were split or truncated).
    /// Skipping ahead costs nothing: the deal is a table, not a stream.
    #[pyo3(
        signature = (rank, start = Arg::MISSING, *, segments = Arg::MISSING),
        text_signature = "($self, rank, start=0, *, segments=False)"
    )]
    fn batches(
        slf: &Bound<'_, Self>,
        rank: &Bound<'_, PyAny>,
        start: Arg<'_>,
        segments: Arg<'_>,
    ) -> PyResult<RankBatches> {
        guard("EpochDeal.batches", || {
            let deal = &slf.get().deal;
            let rank = deal
                .check_rank(args::int(rank, "rank", i64::MIN)?)
                .into_py_result()?;
            let start = start.int_or("start", 0, 0)? as usize;
            Ok(RankBatches {
                deal: slf.clone().unbind(),
                rank,
                next: start,
                segments: segments.flag_or("segments", false)?,
            })
        })
    }

    /// The bins no rank has run before step ``step``, as a packing of their own.
    ///
    /// Deal it for another number of ranks (:func:`deal_epoch`, :class:`Dealer`) to
    /// finish the epoch on a resized job: the bins keep their segments, so every sequence
    /// of the epoch is still used exactly once. Bins are listed in step order, ranks in
    /// order within a step; the packing keeps this deal's ``max_tokens``, ``n_seqs`` and
    /// kind, and the counts of sequences the original packing dropped, truncated or
    /// split; its ``lower_bound`` and ``input_tokens`` are those of the bins it holds.
    fn rest(&self, py: Python<'_>, step: &Bound<'_, PyAny>) -> PyResult<PyPacking> {
        guard("EpochDeal.rest", || {
            let step = args::int(step, "step", 0)? as usize;
            let bins = py.detach(|| self.deal.rest(step)).into_py_result()?;
            Ok(PyPacking::new(bins))
        })
    }

    /// Cost of every bin of the table, shape ``(n_steps, num_replicas)``: tokens (padding
    /// included), attention (sum of squared padded lengths) or flops (tokens plus
    /// attention / (12 hidden_size): matmul and attention FLOPs in units of one token's
    /// matmul FLOPs; needs ``hidden_size``).
    #[pyo3(signature = (kind = Arg::MISSING), text_signature = "($self, kind='tokens')")]
    fn step_costs<'py>(
        &self,
        py: Python<'py>,
        kind: Arg<'py>,
    ) -> PyResult<Bound<'py, PyArray2<f64>>> {
        guard("EpochDeal.step_costs", || {
            let kind = match kind.given() {
                None => CostKind::Tokens,
                Some(value) => args::choice(value, "kind")?,
            };
            let costs = self.deal.step_costs(kind).into_py_result()?;
            self.table(py, costs)
        })
    }

    /// Real (non-padding) tokens of every bin of the table, shape
    /// ``(n_steps, num_replicas)``.
    fn real_tokens<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<i64>>> {
        guard("EpochDeal.real_tokens", || {
            self.table(py, self.deal.real_tokens())
        })
    }

    /// Counts and balance of this epoch.
    ///
    /// ``*_imbalance_max`` / ``*_imbalance_mean`` are the worst and average over steps of
    /// ``max / mean`` cost across ranks; ``*_sync_overhead`` is ``sum of per-step maxima /
    /// sum of per-step means``: how much longer lockstep ranks take than perfectly
    /// balanced ones, by that cost model (1.0 is perfect). ``tokens`` counts what the
    /// linear layers process (padding included), ``attention`` the sum of squared spans.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        guard("EpochDeal.stats", || stats_dict(py, &self.deal.stats()))
    }

    fn __repr__(&self) -> PyResult<String> {
        guard("EpochDeal.__repr__", || {
            Ok({
                format!(
                    "EpochDeal(epoch={}, num_replicas={}, n_steps={})",
                    self.deal.epoch(),
                    self.deal.num_replicas(),
                    self.deal.n_steps()
                )
            })
        })
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

/// Iterator over the batches of one rank of an :class:`EpochDeal` (lists of sequence
/// indices, or of ``(index, start, length)`` tuples).
#[pyclass(module = "tokenbatch._core", name = "RankBatches")]
pub struct RankBatches {
    deal: Py<PyEpochDeal>,
    rank: usize,
    next: usize,
    segments: bool,
}

#[pymethods]
impl RankBatches {
    fn __iter__(slf: PyRef<'_, Self>) -> PyResult<PyRef<'_, Self>> {
        guard("RankBatches.__iter__", || Ok(slf))
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyList>>> {
        guard("RankBatches.__next__", || {
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
            let triples =
                (0..indices.len()).map(|j| (indices[j], deck.start(first + j), lengths[j]));
            PyList::new(py, triples).map(Some)
        })
    }

    /// Batches left.
    fn __length_hint__(&self) -> PyResult<usize> {
        guard("RankBatches.__length_hint__", || {
            Ok(self.deal.get().deal.n_steps().saturating_sub(self.next))
        })
    }
}

/// Mix integers (each in ``[0, 2**64)``) into one 64-bit seed, as every random choice of
/// tokenbatch does.
#[pyfunction]
fn mix_seed(parts: Vec<u64>) -> PyResult<u64> {
    guard("mix_seed", || Ok(rng::mix_seed(&parts)))
}

/// A seeded random permutation of ``range(n)`` (Fisher-Yates with SplitMix64).
#[pyfunction]
fn permutation(py: Python<'_>, seed: u64, n: usize) -> PyResult<Bound<'_, PyArray1<i64>>> {
    guard("permutation", || {
        Ok({
            let mut items: Vec<i64> = (0..n as i64).collect();
            rng::SplitMix64::new(seed).shuffle(&mut items);
            items.into_pyarray(py)
        })
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

//! Bindings of `tokenbatch_core::packing`: `pack`, `batch_padded` and the `Packing` class.

use std::sync::Arc;

use numpy::{PyArray1, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::exceptions::PyIndexError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple};
use tokenbatch_core::packing::{
    self, Bins, CostOptions, Length, PackOptions, Packing, PackingKind, PolicyCounts,
};

use crate::arrays::{as_slice, readonly_or_zeros, readonly_slice, readonly_zeros, IntArray};
use crate::error::{guard, IntoPyResult, InvalidTypeError};
use crate::parallel::detach_parallel;

type Arr<'py> = Bound<'py, PyArray1<i64>>;

/// A packing in CSR form: bin ``i`` holds segments ``bin_offsets[i]:bin_offsets[i + 1]``.
///
/// A segment is a run of tokens of one input sequence: ``indices[j]`` is the sequence,
/// ``starts[j]`` the token offset inside it (0 unless the sequence was split) and
/// ``lengths[j]`` the number of tokens. Bins are numbered in the order the algorithm
/// opened them; inside a bin, segments are listed in input order. All arrays are
/// read-only int64 numpy views of memory this object owns (no copy is made); when no
/// sequence was split, ``starts`` is a ``numpy.zeros`` array made on first use.
///
/// ``bin_tokens[i]`` is bin ``i``'s cost against the budget: its tokens, each segment
/// rounded up to ``pad_to_multiple_of``; for :func:`batch_padded`, ``count x longest``.
///
/// ``len(packing)`` is the number of bins, ``packing[i]`` the sequence indices of bin ``i``
/// (a read-only view; negative indices count from the end) and iterating yields them bin
/// by bin. Made by :func:`pack`, :func:`batch_padded` and :meth:`EpochDeal.rest`; it
/// pickles.
#[pyclass(module = "tokenbatch._core", name = "Packing", frozen)]
pub struct PyPacking {
    bins: Arc<Bins>,
    /// `starts` when no sequence was split, made on first use.
    zero_starts: PyOnceLock<Py<PyArray1<i64>>>,
}

impl PyPacking {
    /// A packing object owning `bins`.
    pub fn new(bins: Bins) -> Self {
        Self {
            bins: Arc::new(bins),
            zero_starts: PyOnceLock::new(),
        }
    }

    /// The bins (shared, never changed).
    pub fn bins(&self) -> &Arc<Bins> {
        &self.bins
    }

    fn packing(&self) -> &Packing {
        &self.bins.packing
    }

    /// Segment range of bin `bin_index` (negative indices count from the end).
    fn bounds(&self, bin_index: &Bound<'_, PyAny>) -> PyResult<(usize, usize)> {
        let n_bins = self.packing().n_bins() as i64;
        let position: i64 = bin_index.extract().map_err(|_| {
            let type_name = bin_index
                .get_type()
                .name()
                .map_or_else(|_| "?".to_string(), |name| name.to_string());
            InvalidTypeError::new_err(format!("bin index must be an integer, got {type_name}"))
        })?;
        let resolved = if position < 0 {
            position + n_bins
        } else {
            position
        };
        if !(0..n_bins).contains(&resolved) {
            return Err(PyIndexError::new_err(format!(
                "bin index {position} out of range for a packing of {n_bins} bins"
            )));
        }
        let offsets = &self.packing().bin_offsets;
        let bin = resolved as usize;
        Ok((offsets[bin] as usize, offsets[bin + 1] as usize))
    }

    /// A read-only view of `data`, which this packing owns.
    fn view<'py>(slf: &Bound<'py, Self>, data: &[i64]) -> Arr<'py> {
        // SAFETY: every `data` passed is a slice of the arrays of `slf`'s frozen, immutable
        // `Bins`, which live as long as `slf`.
        unsafe { readonly_slice(slf.as_any(), data) }
    }
}

#[pymethods]
impl PyPacking {
    /// ``n_bins + 1`` offsets into the segment arrays.
    #[getter]
    fn bin_offsets<'py>(slf: &Bound<'py, Self>) -> Arr<'py> {
        Self::view(slf, &slf.get().packing().bin_offsets)
    }

    /// Input sequence of each segment.
    #[getter]
    fn indices<'py>(slf: &Bound<'py, Self>) -> Arr<'py> {
        Self::view(slf, &slf.get().packing().indices)
    }

    /// Token offset of each segment inside its sequence.
    #[getter]
    fn starts<'py>(slf: &Bound<'py, Self>) -> Arr<'py> {
        let this = slf.get();
        let packing = this.packing();
        let (starts, n) = (packing.starts.as_deref(), packing.indices.len());
        // SAFETY: the starts belong to the frozen packing's `Bins`, which never change.
        unsafe { readonly_or_zeros(slf.as_any(), starts, n, &this.zero_starts) }
    }

    /// Tokens of each segment.
    #[getter]
    fn lengths<'py>(slf: &Bound<'py, Self>) -> Arr<'py> {
        Self::view(slf, &slf.get().packing().lengths)
    }

    /// Budget cost of each bin (padding included).
    #[getter]
    fn bin_tokens<'py>(slf: &Bound<'py, Self>) -> Arr<'py> {
        Self::view(slf, &slf.get().packing().bin_tokens)
    }

    /// The token budget of one bin.
    #[getter]
    fn max_tokens(&self) -> u64 {
        self.bins.max_tokens
    }

    /// Number of input sequences.
    #[getter]
    fn n_seqs(&self) -> u64 {
        self.bins.n_seqs
    }

    /// ``"packed"`` (sequences concatenated) or ``"padded"`` (padded to the longest).
    #[getter]
    fn kind(&self) -> &'static str {
        self.bins.kind.name()
    }

    /// Number of bins.
    #[getter]
    fn n_bins(&self) -> usize {
        self.packing().n_bins()
    }

    /// Number of segments (sequences, or pieces of split sequences, that were placed).
    #[getter]
    fn n_segments(&self) -> usize {
        self.packing().indices.len()
    }

    fn __len__(&self) -> usize {
        self.packing().n_bins()
    }

    /// Sequence indices in bin ``bin_index`` (a read-only view, negative indices allowed).
    fn __getitem__<'py>(
        slf: &Bound<'py, Self>,
        bin_index: &Bound<'py, PyAny>,
    ) -> PyResult<Arr<'py>> {
        let (lo, hi) = slf.get().bounds(bin_index)?;
        Ok(Self::view(slf, &slf.get().packing().indices[lo..hi]))
    }

    /// The sequence indices of every bin in turn (read-only views).
    fn __iter__(slf: &Bound<'_, Self>) -> PackingBins {
        PackingBins {
            packing: slf.clone().unbind(),
            next: 0,
        }
    }

    /// ``(indices, starts, lengths)`` of the segments in bin ``bin_index``.
    fn segments<'py>(
        slf: &Bound<'py, Self>,
        bin_index: &Bound<'py, PyAny>,
    ) -> PyResult<(Arr<'py>, Arr<'py>, Arr<'py>)> {
        let (lo, hi) = slf.get().bounds(bin_index)?;
        let packing = slf.get().packing();
        Ok((
            Self::view(slf, &packing.indices[lo..hi]),
            match &packing.starts {
                Some(starts) => Self::view(slf, &starts[lo..hi]),
                None => readonly_zeros(slf.py(), hi - lo),
            },
            Self::view(slf, &packing.lengths[lo..hi]),
        ))
    }

    /// Real (non-padding) tokens placed in bins.
    #[getter]
    fn total_tokens(&self) -> u64 {
        self.bins.total_tokens()
    }

    /// Real tokens / (n_bins x max_tokens); 1.0 for an empty packing.
    #[getter]
    fn efficiency(&self) -> f64 {
        let n_bins = self.packing().n_bins() as u64;
        if n_bins == 0 {
            return 1.0;
        }
        self.bins.total_tokens() as f64 / (n_bins as f64 * self.bins.max_tokens as f64)
    }

    /// Fewest bins any packing could use: ceil(total cost / max_tokens), or more when
    /// ``max_seqs`` forces it.
    #[getter]
    fn lower_bound(&self) -> u64 {
        self.bins.lower_bound
    }

    /// Summary counts.
    ///
    /// ``padding_tokens`` is padding that is actually materialized (rounding segments up
    /// to ``pad_to_multiple_of``, or padding to the longest for padded batches);
    /// ``unused_tokens`` is budget left empty in bins (``n_bins x max_tokens`` minus
    /// costs). ``efficiency`` is ``total_tokens / (n_bins x max_tokens)``.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let packing = self.packing();
        let counts = &packing.counts;
        let total_tokens = i128::from(self.bins.total_tokens());
        let total_cost: i128 = packing.bin_tokens.iter().map(|&t| i128::from(t)).sum();
        let budget = packing.n_bins() as i128 * i128::from(self.bins.max_tokens);
        let stats = PyDict::new(py);
        stats.set_item("n_seqs", self.bins.n_seqs)?;
        stats.set_item("n_segments", packing.indices.len())?;
        stats.set_item("n_bins", packing.n_bins())?;
        stats.set_item("lower_bound", self.bins.lower_bound)?;
        stats.set_item("max_tokens", self.bins.max_tokens)?;
        stats.set_item("input_tokens", counts.input_tokens)?;
        stats.set_item("total_tokens", total_tokens)?;
        stats.set_item("padding_tokens", total_cost - total_tokens)?;
        stats.set_item("unused_tokens", budget - total_cost)?;
        stats.set_item("efficiency", self.efficiency())?;
        stats.set_item("dropped_seqs", counts.dropped_seqs)?;
        stats.set_item("dropped_tokens", counts.dropped_tokens)?;
        stats.set_item("truncated_seqs", counts.truncated_seqs)?;
        stats.set_item("truncated_tokens", counts.truncated_tokens)?;
        stats.set_item("split_seqs", counts.split_seqs)?;
        stats.set_item("split_pieces", counts.split_pieces)?;
        Ok(stats)
    }

    fn __repr__(&self) -> String {
        format!(
            "Packing(kind='{}', n_seqs={}, n_bins={}, max_tokens={}, efficiency={:.4})",
            self.bins.kind.name(),
            self.bins.n_seqs,
            self.packing().n_bins(),
            self.bins.max_tokens,
            self.efficiency()
        )
    }

    /// Pickling: the arrays and counts, rebuilt (and checked) by ``_from_parts``.
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let py = slf.py();
        let this = slf.get();
        let c = &this.packing().counts;
        let counts = [
            c.input_tokens,
            c.dropped_seqs,
            c.dropped_tokens,
            c.truncated_seqs,
            c.truncated_tokens,
            c.split_seqs,
            c.split_pieces,
        ];
        let parts = (
            Self::bin_offsets(slf),
            Self::indices(slf),
            Self::starts(slf),
            Self::lengths(slf),
            Self::bin_tokens(slf),
            counts,
            this.bins.max_tokens,
            this.bins.n_seqs,
            this.bins.kind.name(),
            this.bins.lower_bound,
            this.bins
                .group_ids
                .as_ref()
                .map(|ids| PyArray1::from_slice(py, ids)),
        );
        let rebuild = py.get_type::<Self>().getattr("_from_parts")?;
        Ok((rebuild, parts.into_pyobject(py)?))
    }

    /// Rebuild a pickled packing (private).
    #[staticmethod]
    #[pyo3(signature = (
        bin_offsets, indices, starts, lengths, bin_tokens, counts, max_tokens, n_seqs, kind,
        lower_bound, group_ids=None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn _from_parts(
        bin_offsets: PyReadonlyArray1<'_, i64>,
        indices: PyReadonlyArray1<'_, i64>,
        starts: PyReadonlyArray1<'_, i64>,
        lengths: PyReadonlyArray1<'_, i64>,
        bin_tokens: PyReadonlyArray1<'_, i64>,
        counts: [u64; 7],
        max_tokens: u64,
        n_seqs: u64,
        kind: &str,
        lower_bound: u64,
        group_ids: Option<PyReadonlyArray1<'_, i64>>,
    ) -> PyResult<Self> {
        guard("Packing._from_parts", || {
            let [input_tokens, dropped_seqs, dropped_tokens, truncated_seqs, truncated_tokens, split_seqs, split_pieces] =
                counts;
            let bin_tokens = as_slice(&bin_tokens)?.to_vec();
            let mut bins = Bins {
                packing: Packing {
                    bin_offsets: as_slice(&bin_offsets)?.to_vec(),
                    indices: as_slice(&indices)?.to_vec(),
                    starts: Some(as_slice(&starts)?.to_vec()),
                    lengths: as_slice(&lengths)?.to_vec(),
                    segment_cost: bin_tokens.iter().map(|&t| t.max(0) as u64).sum(),
                    bin_tokens,
                    counts: PolicyCounts {
                        input_tokens,
                        dropped_seqs,
                        dropped_tokens,
                        truncated_seqs,
                        truncated_tokens,
                        split_seqs,
                        split_pieces,
                    },
                },
                max_tokens,
                n_seqs,
                kind: kind.parse().into_py_result()?,
                lower_bound,
                group_ids: group_ids
                    .as_ref()
                    .map(as_slice)
                    .transpose()?
                    .map(|ids| Arc::new(ids.to_vec())),
            };
            bins.validate().into_py_result()?;
            // All zero: no sequence was split, as `pack` records it.
            let packing = &mut bins.packing;
            if packing
                .starts
                .as_ref()
                .is_some_and(|starts| starts.iter().all(|&s| s == 0))
            {
                packing.starts = None;
            }
            Ok(Self::new(bins))
        })
    }
}

/// Iterator over the bins of a packing: the sequence indices of each, as read-only views.
#[pyclass(module = "tokenbatch._core", name = "PackingBins")]
pub struct PackingBins {
    packing: Py<PyPacking>,
    next: usize,
}

#[pymethods]
impl PackingBins {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> Option<Arr<'py>> {
        let packing = self.packing.bind(py);
        let offsets = &packing.get().packing().bin_offsets;
        if self.next + 1 >= offsets.len() {
            return None;
        }
        let (lo, hi) = (offsets[self.next] as usize, offsets[self.next + 1] as usize);
        self.next += 1;
        Some(PyPacking::view(
            packing,
            &packing.get().packing().indices[lo..hi],
        ))
    }
}

fn run<'py>(
    py: Python<'py>,
    lengths: IntArray<'py>,
    groups: Option<PyReadonlyArray1<'py, i64>>,
    options: PackOptions,
    kind: PackingKind,
) -> PyResult<Bound<'py, PyPacking>> {
    fn call<L: Length>(
        lengths: &[L],
        groups: Option<&[i64]>,
        options: &PackOptions,
        kind: PackingKind,
    ) -> tokenbatch_core::Result<Bins> {
        let packing = match (kind, groups) {
            (PackingKind::Padded, None) => packing::batch_padded(lengths, options),
            (PackingKind::Packed, None) => packing::pack(lengths, options),
            (PackingKind::Padded, Some(ids)) => {
                packing::batch_padded_grouped(lengths, ids, options)
            }
            (PackingKind::Packed, Some(ids)) => packing::pack_grouped(lengths, ids, options),
        }?;
        let bins = Bins::new(packing, options, lengths.len(), kind);
        Ok(match groups {
            Some(ids) => bins.with_group_ids(ids),
            None => bins,
        })
    }
    let groups = groups.as_ref().map(as_slice).transpose()?;
    let bins = match &lengths {
        IntArray::I64(array) => {
            let slice = as_slice(array)?;
            detach_parallel(py, || call(slice, groups, &options, kind))
        }
        IntArray::I32(array) => {
            let slice = as_slice(array)?;
            detach_parallel(py, || call(slice, groups, &options, kind))
        }
    }
    .into_py_result()?;
    Bound::new(py, PyPacking::new(bins))
}

/// Pack lengths into token budgets (see `tokenbatch.pack`).
#[pyfunction]
#[pyo3(signature = (lengths, max_tokens, *, algorithm, max_seqs, pad_to_multiple_of, oversize, seed, groups=None))]
#[allow(clippy::too_many_arguments)]
fn pack<'py>(
    py: Python<'py>,
    lengths: IntArray<'py>,
    max_tokens: i64,
    algorithm: &str,
    max_seqs: Option<i64>,
    pad_to_multiple_of: i64,
    oversize: &str,
    seed: u64,
    groups: Option<PyReadonlyArray1<'py, i64>>,
) -> PyResult<Bound<'py, PyPacking>> {
    guard("pack", || {
        let options = PackOptions::new(
            max_tokens,
            max_seqs,
            pad_to_multiple_of,
            oversize,
            algorithm,
            seed,
        )
        .into_py_result()?;
        run(py, lengths, groups, options, PackingKind::Packed)
    })
}

/// Padded token-budget batching (see `tokenbatch.batch_padded`).
#[pyfunction]
#[pyo3(signature = (lengths, max_tokens, *, max_seqs, pad_to_multiple_of, oversize, groups=None))]
fn batch_padded<'py>(
    py: Python<'py>,
    lengths: IntArray<'py>,
    max_tokens: i64,
    max_seqs: Option<i64>,
    pad_to_multiple_of: i64,
    oversize: &str,
    groups: Option<PyReadonlyArray1<'py, i64>>,
) -> PyResult<Bound<'py, PyPacking>> {
    guard("batch_padded", || {
        let options =
            PackOptions::new(max_tokens, max_seqs, pad_to_multiple_of, oversize, "bfd", 0)
                .into_py_result()?;
        run(py, lengths, groups, options, PackingKind::Padded)
    })
}

/// Pack under several budgets at once (see `tokenbatch.pack_costs`).
#[pyfunction]
#[pyo3(signature = (costs, max_costs, *, groups, max_seqs, pad_to_multiple_of, oversize))]
fn pack_costs<'py>(
    py: Python<'py>,
    costs: PyReadonlyArray2<'py, i64>,
    max_costs: Vec<i64>,
    groups: Option<PyReadonlyArray1<'py, i64>>,
    max_seqs: Option<i64>,
    pad_to_multiple_of: i64,
    oversize: &str,
) -> PyResult<Bound<'py, PyPacking>> {
    guard("pack_costs", || {
        let columns = costs.shape()[1];
        let values = costs
            .as_slice()
            .map_err(|_| InvalidTypeError::new_err("costs must be a C-contiguous 2-D array"))?;
        let groups = groups.as_ref().map(as_slice).transpose()?;
        let options = CostOptions {
            max_seqs,
            pad_to_multiple_of,
            oversize,
        };
        let bins = detach_parallel(py, || {
            packing::pack_costs(values, columns, &max_costs, groups, options)
        })
        .into_py_result()?;
        Bound::new(py, PyPacking::new(bins))
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPacking>()?;
    m.add_class::<PackingBins>()?;
    m.add_function(wrap_pyfunction!(pack, m)?)?;
    m.add_function(wrap_pyfunction!(batch_padded, m)?)?;
    m.add_function(wrap_pyfunction!(pack_costs, m)?)?;
    m.add("MAX_COST_COLUMNS", packing::MAX_COST_COLUMNS)?;
    Ok(())
}

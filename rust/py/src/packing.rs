//! Bindings of `tokenbatch_core::packing`.

use numpy::{IntoPyArray, PyArray1};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tokenbatch_core::packing::{self, Length, PackOptions, Packing};

use crate::arrays::{as_slice, IntArray};
use crate::error::{guard, IntoPyResult};
use crate::parallel::detach_parallel;

type Arr<'py> = Bound<'py, PyArray1<i64>>;

/// The arrays of a packing plus a dict of counts, as `tokenbatch.Packing` expects them.
type RawPacking<'py> = (
    Arr<'py>,
    Arr<'py>,
    Arr<'py>,
    Arr<'py>,
    Arr<'py>,
    Bound<'py, PyDict>,
);

fn run<'py>(
    py: Python<'py>,
    lengths: IntArray<'py>,
    options: PackOptions,
    padded: bool,
) -> PyResult<RawPacking<'py>> {
    fn call<L: Length>(
        lengths: &[L],
        options: &PackOptions,
        padded: bool,
    ) -> tokenbatch_core::Result<Packing> {
        if padded {
            packing::batch_padded(lengths, options)
        } else {
            packing::pack(lengths, options)
        }
    }
    let result = match &lengths {
        IntArray::I64(array) => {
            let slice = as_slice(array)?;
            detach_parallel(py, || call(slice, &options, padded))
        }
        IntArray::I32(array) => {
            let slice = as_slice(array)?;
            detach_parallel(py, || call(slice, &options, padded))
        }
    }
    .into_py_result()?;
    let counts = PyDict::new(py);
    counts.set_item("lower_bound", result.lower_bound(&options))?;
    counts.set_item("input_tokens", result.counts.input_tokens)?;
    counts.set_item("dropped_seqs", result.counts.dropped_seqs)?;
    counts.set_item("dropped_tokens", result.counts.dropped_tokens)?;
    counts.set_item("truncated_seqs", result.counts.truncated_seqs)?;
    counts.set_item("truncated_tokens", result.counts.truncated_tokens)?;
    counts.set_item("split_seqs", result.counts.split_seqs)?;
    counts.set_item("split_pieces", result.counts.split_pieces)?;
    Ok((
        result.bin_offsets.into_pyarray(py),
        result.indices.into_pyarray(py),
        result.starts.into_pyarray(py),
        result.lengths.into_pyarray(py),
        result.bin_tokens.into_pyarray(py),
        counts,
    ))
}

/// Pack lengths into token budgets (see `tokenbatch.pack`).
#[pyfunction]
#[pyo3(signature = (lengths, max_tokens, *, algorithm, max_seqs, pad_to_multiple_of, oversize, seed))]
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
) -> PyResult<RawPacking<'py>> {
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
        run(py, lengths, options, false)
    })
}

/// Padded token-budget batching (see `tokenbatch.batch_padded`).
#[pyfunction]
#[pyo3(signature = (lengths, max_tokens, *, max_seqs, pad_to_multiple_of, oversize))]
fn batch_padded<'py>(
    py: Python<'py>,
    lengths: IntArray<'py>,
    max_tokens: i64,
    max_seqs: Option<i64>,
    pad_to_multiple_of: i64,
    oversize: &str,
) -> PyResult<RawPacking<'py>> {
    guard("batch_padded", || {
        let options =
            PackOptions::new(max_tokens, max_seqs, pad_to_multiple_of, oversize, "bfd", 0)
                .into_py_result()?;
        run(py, lengths, options, true)
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(pack, m)?)?;
    m.add_function(wrap_pyfunction!(batch_padded, m)?)?;
    Ok(())
}

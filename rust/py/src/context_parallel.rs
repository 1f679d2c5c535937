//! Bindings of `tokenbatch_core::context_parallel`.

use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1, PyUntypedArrayMethods};
use pyo3::prelude::*;
use tokenbatch_core::context_parallel;

use crate::arrays::{as_slice, readonly_vec};
use crate::error::{guard, IntoPyResult};

/// The part of a packed row that one context-parallel rank processes.
///
/// ``indices``: positions in the padded row of this rank's tokens, in its order (for each
/// document, chunk ``cp_rank`` then chunk ``2 * cp_size - 1 - cp_rank``);
/// ``cu_seqlens``: cumulative real tokens of each document on this rank;
/// ``cu_seqlens_padded``: cumulative tokens of each document on this rank
/// (``cu_seqlens_padded // cp_size`` of the whole row). Read-only int64 arrays.
#[pyclass(module = "tokenbatch._core", name = "ContextParallelShard", frozen)]
pub struct PyShard {
    /// Positions in the padded row of this rank's tokens, in the rank's order.
    #[pyo3(get)]
    indices: Py<PyArray1<i64>>,
    /// Cumulative count of each document's real (not padding) tokens on this rank.
    #[pyo3(get)]
    cu_seqlens: Py<PyArray1<i64>>,
    /// Cumulative count of each document's tokens on this rank, padding included.
    #[pyo3(get)]
    cu_seqlens_padded: Py<PyArray1<i64>>,
}

#[pymethods]
impl PyShard {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "ContextParallelShard(tokens={}, documents={})",
            self.indices.bind(py).len(),
            self.cu_seqlens.bind(py).len().saturating_sub(1)
        )
    }
}

/// Hand a vector to numpy without a copy, as a read-only array.
fn read_only(py: Python<'_>, values: Vec<i64>) -> Py<PyArray1<i64>> {
    readonly_vec(py, values).unbind()
}

/// The load-balanced shard of rank `cp_rank` of `cp_size` (see `tokenbatch.context_parallel`).
#[pyfunction]
fn cp_shard(
    py: Python<'_>,
    cu_seqlens: PyReadonlyArray1<'_, i64>,
    cu_seqlens_padded: PyReadonlyArray1<'_, i64>,
    cp_size: i64,
    cp_rank: i64,
) -> PyResult<PyShard> {
    guard("cp_shard", || {
        let (real, padded) = (as_slice(&cu_seqlens)?, as_slice(&cu_seqlens_padded)?);
        let shard = py
            .detach(|| context_parallel::shard(real, padded, cp_size, cp_rank))
            .into_py_result()?;
        Ok(PyShard {
            indices: read_only(py, shard.indices),
            cu_seqlens: read_only(py, shard.cu_seqlens),
            cu_seqlens_padded: read_only(py, shard.cu_seqlens_padded),
        })
    })
}

/// Row positions of the shards of all ranks concatenated in rank order.
#[pyfunction]
fn cp_rank_major_order<'py>(
    py: Python<'py>,
    cu_seqlens_padded: PyReadonlyArray1<'py, i64>,
    cp_size: i64,
) -> PyResult<Bound<'py, PyArray1<i64>>> {
    guard("cp_rank_major_order", || {
        let padded = as_slice(&cu_seqlens_padded)?;
        let order = py
            .detach(|| context_parallel::rank_major_order(padded, cp_size))
            .into_py_result()?;
        Ok(order.into_pyarray(py))
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyShard>()?;
    m.add_function(wrap_pyfunction!(cp_shard, m)?)?;
    m.add_function(wrap_pyfunction!(cp_rank_major_order, m)?)?;
    Ok(())
}

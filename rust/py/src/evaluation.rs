//! Binding of `tokenbatch_core::deal::evaluation_table`, behind
//! `tokenbatch.torch.EvaluationBatchSampler`.

use numpy::{IntoPyArray, PyArray2, PyArrayMethods};
use pyo3::prelude::*;
use tokenbatch_core::deal::{evaluation_table as core_table, CostKind, EMPTY_SLOT};
use tokenbatch_core::error::{at_least, at_least_usize};

use crate::error::{guard, IntoPyResult};
use crate::packing::PyPacking;
use crate::parallel::detach_parallel;

/// The ``(n_steps, num_replicas)`` table of an evaluation pass over ``packing``: the bin
/// each rank runs at each step, or ``EMPTY_SLOT`` for an empty micro-batch. Every bin
/// appears once; only the last step has empty slots.
#[pyfunction]
#[pyo3(signature = (packing, num_replicas, *, balance, pad_to_multiple_of, hidden_size))]
fn evaluation_table<'py>(
    py: Python<'py>,
    packing: Bound<'py, PyPacking>,
    num_replicas: i64,
    balance: Option<&str>,
    pad_to_multiple_of: i64,
    hidden_size: Option<i64>,
) -> PyResult<Bound<'py, PyArray2<i64>>> {
    guard("evaluation_table", || {
        let num_replicas = at_least_usize(num_replicas, 1, "num_replicas").into_py_result()?;
        let balance = balance
            .map(str::parse::<CostKind>)
            .transpose()
            .into_py_result()?;
        let multiple = at_least(pad_to_multiple_of, 1, "pad_to_multiple_of").into_py_result()?;
        let hidden_size = hidden_size
            .map(|h| at_least(h, 1, "hidden_size"))
            .transpose()
            .into_py_result()?;
        let bins = packing.get().bins();
        let table = detach_parallel(py, || {
            core_table(bins, num_replicas, balance, multiple, hidden_size)
        })
        .into_py_result()?;
        let shape = [table.len() / num_replicas, num_replicas];
        table.into_pyarray(py).reshape(shape)
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("EMPTY_SLOT", EMPTY_SLOT)?;
    m.add_function(wrap_pyfunction!(evaluation_table, m)?)?;
    Ok(())
}

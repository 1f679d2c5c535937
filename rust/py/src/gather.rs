//! Bindings of `tokenbatch_core::gather`.

use numpy::{Element, IntoPyArray, PyReadonlyArray1};
use pyo3::prelude::*;

use crate::arrays::as_slice;
use crate::error::{guard, IntoPyResult};
use crate::parallel::detach_parallel;

/// A value buffer of any fixed-width dtype, viewed as the unsigned integer of its width.
#[derive(FromPyObject)]
enum Words<'py> {
    U8(PyReadonlyArray1<'py, u8>),
    U16(PyReadonlyArray1<'py, u16>),
    U32(PyReadonlyArray1<'py, u32>),
    U64(PyReadonlyArray1<'py, u64>),
}

fn gather<'py, T: Element + Copy + Send + Sync>(
    py: Python<'py>,
    values: &PyReadonlyArray1<'py, T>,
    starts: &[i64],
    lengths: &[i64],
) -> PyResult<Bound<'py, PyAny>> {
    let values = as_slice(values)?;
    let out = detach_parallel(py, || {
        tokenbatch_core::gather::gather_segments(values, starts, lengths)
    })
    .into_py_result()?;
    Ok(out.into_pyarray(py).into_any())
}

/// Concatenate `values[starts[i] : starts[i] + lengths[i]]` in order (same dtype out).
#[pyfunction]
fn gather_segments<'py>(
    py: Python<'py>,
    values: Words<'py>,
    starts: PyReadonlyArray1<'py, i64>,
    lengths: PyReadonlyArray1<'py, i64>,
) -> PyResult<Bound<'py, PyAny>> {
    guard("gather_segments", || {
        let (starts, lengths) = (as_slice(&starts)?, as_slice(&lengths)?);
        match &values {
            Words::U8(v) => gather(py, v, starts, lengths),
            Words::U16(v) => gather(py, v, starts, lengths),
            Words::U32(v) => gather(py, v, starts, lengths),
            Words::U64(v) => gather(py, v, starts, lengths),
        }
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(gather_segments, m)?)?;
    Ok(())
}

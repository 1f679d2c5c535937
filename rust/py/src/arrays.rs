//! Borrowing numpy arrays as slices.

use numpy::{Element, PyReadonlyArray1};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

/// A one-dimensional integer array of one of the dtypes the core reads without a copy.
#[derive(FromPyObject)]
pub enum IntArray<'py> {
    I64(PyReadonlyArray1<'py, i64>),
    I32(PyReadonlyArray1<'py, i32>),
}

/// Borrow a contiguous array as a slice; the Python wrappers make arrays contiguous first,
/// so failing here means the private API was called directly.
pub fn as_slice<'a, T: Element>(array: &'a PyReadonlyArray1<'_, T>) -> PyResult<&'a [T]> {
    array
        .as_slice()
        .map_err(|_| PyTypeError::new_err("expected a C-contiguous one-dimensional array"))
}

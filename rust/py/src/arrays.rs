//! Borrowing numpy arrays as slices, and lending Rust arrays to numpy as read-only views.

use numpy::ndarray::{ArrayView, ArrayView1, Dimension};
use numpy::npyffi::flags::NPY_ARRAY_WRITEABLE;
use numpy::{Element, IntoPyArray, PyArray, PyArray1, PyReadonlyArray1, PyUntypedArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

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

/// A read-only numpy view of `data`, kept alive by `owner`, without a copy.
///
/// # Safety
/// `data` must be owned by `owner` (directly or through an `Arc`) and must neither move
/// nor change while `owner` lives: the view reads it in place and holds only `owner`.
/// Frozen classes whose arrays are never mutated satisfy this.
pub unsafe fn readonly_view<'py, T: Element, D: Dimension>(
    owner: &Bound<'py, PyAny>,
    data: &ArrayView<'_, T, D>,
) -> Bound<'py, PyArray<T, D>> {
    // SAFETY: the caller guarantees that `data` lives, unchanged, as long as `owner`,
    // which becomes the view's base object.
    let view = unsafe { PyArray::borrow_from_array(data, owner.clone()) };
    read_only(view)
}

/// `array`, no longer writeable.
fn read_only<T: Element, D: Dimension>(
    array: Bound<'_, PyArray<T, D>>,
) -> Bound<'_, PyArray<T, D>> {
    // SAFETY: `array` is a valid array object; clearing a flag is what numpy's
    // PyArray_CLEARFLAGS does.
    unsafe { (*array.as_array_ptr()).fields.flags &= !NPY_ARRAY_WRITEABLE };
    array
}

/// `values` handed to numpy without a copy, as a read-only array.
pub fn readonly_vec<T: Element>(py: Python<'_>, values: Vec<T>) -> Bound<'_, PyArray1<T>> {
    read_only(values.into_pyarray(py))
}

/// `n` zeros as a read-only int64 array: `numpy.zeros`, whose pages the kernel maps
/// only when they are read.
pub fn readonly_zeros(py: Python<'_>, n: usize) -> Bound<'_, PyArray1<i64>> {
    read_only(PyArray1::zeros(py, n, false))
}

/// The read-only view of `data` owned by `owner`, or when there is no `data`, `n` zeros
/// made once and kept in `zeros`.
///
/// # Safety
/// As for [`readonly_view`].
pub unsafe fn readonly_or_zeros<'py>(
    owner: &Bound<'py, PyAny>,
    data: Option<&[i64]>,
    n: usize,
    zeros: &PyOnceLock<Py<PyArray1<i64>>>,
) -> Bound<'py, PyArray1<i64>> {
    let py = owner.py();
    match data {
        // SAFETY: forwarded to the caller.
        Some(data) => unsafe { readonly_slice(owner, data) },
        None => zeros
            .get_or_init(py, || readonly_zeros(py, n).unbind())
            .bind(py)
            .clone(),
    }
}

/// A read-only 1-D view of `data` owned by `owner` (see [`readonly_view`]).
///
/// # Safety
/// As for [`readonly_view`].
pub unsafe fn readonly_slice<'py, T: Element>(
    owner: &Bound<'py, PyAny>,
    data: &[T],
) -> Bound<'py, PyArray1<T>> {
    // SAFETY: forwarded to the caller.
    unsafe { readonly_view(owner, &ArrayView1::from(data)) }
}

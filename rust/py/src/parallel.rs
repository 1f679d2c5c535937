//! Thread-count control, and the helper every parallel binding goes through.

use std::ffi::CString;

use pyo3::exceptions::PyRuntimeWarning;
use pyo3::prelude::*;
use tokenbatch_core::parallel;

use crate::error::{guard, IntoPyResult};

/// Release the GIL and run `work` in tokenbatch's thread pool (fork-safe, sized by
/// `set_num_threads`). If the pool could not be built, the work ran on the calling thread
/// and a `RuntimeWarning` says why, once per failure.
pub fn detach_parallel<R: Send>(py: Python<'_>, work: impl FnOnce() -> R + Send) -> R {
    let result = py.detach(|| parallel::install(work));
    if let Some(reason) = parallel::take_failure() {
        warn_serial(py, &reason);
    }
    result
}

fn warn_serial(py: Python<'_>, reason: &str) {
    let message = format!(
        "tokenbatch {reason}; parallel work runs on the calling thread instead. \
         Ask for fewer threads with tokenbatch.set_num_threads() or TOKENBATCH_NUM_THREADS."
    );
    let message = CString::new(message.replace('\0', " ")).unwrap_or_default();
    let category = py.get_type::<PyRuntimeWarning>();
    if let Err(error) = PyErr::warn(py, &category, &message, 1) {
        // Warnings turned into errors: the result is still valid, so show the error
        // rather than lose the result.
        error.write_unraisable(py, None);
    }
}

/// Set the number of threads of parallel work (None: `TOKENBATCH_NUM_THREADS` or all cores).
///
/// The threads belong to the process: a forked child (a DataLoader worker) starts its
/// own on first use. If the system refuses to start them, work runs on the calling thread
/// and a `RuntimeWarning` says why, once; the same count is not tried again.
#[pyfunction]
#[pyo3(signature = (threads))]
fn set_num_threads(threads: Option<i64>) -> PyResult<()> {
    guard("set_num_threads", || {
        parallel::set_num_threads(threads).into_py_result()
    })
}

/// The number of threads parallel work uses.
#[pyfunction]
fn get_num_threads() -> usize {
    parallel::num_threads()
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(get_num_threads, m)?)?;
    Ok(())
}

//! Thread-count control, and the helper every parallel binding goes through.

use pyo3::prelude::*;
use tokenbatch_core::parallel;

use crate::error::{guard, IntoPyResult};

/// Release the GIL and run `work` in tokenbatch's thread pool (fork-safe, sized by
/// `set_num_threads`).
pub fn detach_parallel<R: Send>(py: Python<'_>, work: impl FnOnce() -> R + Send) -> R {
    py.detach(|| parallel::install(work))
}

/// Set the number of threads of parallel work (None: `TOKENBATCH_NUM_THREADS` or all cores).
#[pyfunction]
#[pyo3(signature = (threads))]
fn set_num_threads(threads: Option<i64>) -> PyResult<()> {
    guard("set_num_threads", || {
        let threads = match threads {
            None => None,
            Some(n) if n < 1 => {
                return Err(crate::error::to_py_err(tokenbatch_core::Error::invalid(
                    format!("num_threads must be at least 1 (or None for the default), got {n}"),
                )))
            }
            Some(n) => Some(n as usize),
        };
        parallel::set_num_threads(threads).into_py_result()
    })
}

/// The number of threads parallel work uses.
#[pyfunction]
fn get_num_threads() -> PyResult<usize> {
    guard("get_num_threads", || Ok(parallel::num_threads()))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(get_num_threads, m)?)?;
    Ok(())
}

//! The Python extension module `tokenbatch._core`.
//!
//! Every function here is a thin shell around `tokenbatch-core`: borrow the numpy input
//! as a slice, release the GIL while the core works, map its error to the matching
//! `tokenbatch` exception ([`error`]), hand the result back to numpy without copying.
//! Arguments arrive typed: the Python wrappers read user input (`tokenbatch._convert`)
//! and the core checks every value. Each call into the core runs inside
//! [`error::guard`], so a Rust panic becomes `tokenbatch.InternalError`.

mod arrays;
mod context_parallel;
mod deal;
mod error;
mod evaluation;
mod gather;
mod memory;
mod mixture;
mod model_spec;
mod packing;
mod parallel;
mod planner;
mod schedule;
mod stream;

use pyo3::prelude::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(_panic_for_test, m)?)?;
    context_parallel::register(m)?;
    deal::register(m)?;
    evaluation::register(m)?;
    gather::register(m)?;
    memory::register(m)?;
    mixture::register(m)?;
    model_spec::register(m)?;
    packing::register(m)?;
    parallel::register(m)?;
    planner::register(m)?;
    schedule::register(m)?;
    stream::register(m)?;
    Ok(())
}

/// Test hook, not API: panic on purpose inside [`error::guard`], with the GIL held
/// (`"binding"`), with it released (`"detached"`), or on a worker thread of the parallel
/// pool (`"worker"`), so the tests see what a real panic at each place becomes.
#[pyfunction]
#[allow(clippy::panic)] // the point of the function
fn _panic_for_test(py: Python<'_>, location: &str) -> PyResult<()> {
    error::guard("_panic_for_test", || match location {
        "binding" => panic!("deliberate panic with the GIL held"),
        "detached" => py.detach(|| panic!("deliberate panic with the GIL released")),
        "worker" => parallel::detach_parallel(py, || panic!("deliberate panic on a worker thread")),
        other => Err(error::InvalidValueError::new_err(format!(
            "location must be 'binding', 'detached' or 'worker', got {other:?}"
        ))),
    })
}

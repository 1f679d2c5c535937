//! The Python extension module `tokenbatch._core`.
//!
//! Every function here is a thin shell around `tokenbatch-core`: borrow the numpy input
//! as a slice, release the GIL while the core works, map its error to the matching
//! `tokenbatch` exception, hand the result back to numpy without copying. Each body runs
//! inside [`error::guard`], so a Rust panic becomes `tokenbatch.InternalError`.

mod args;
mod arrays;
mod context_parallel;
mod deal;
mod error;
mod gather;
mod memory;
mod packing;
mod parallel;
mod schedule;
mod stream;

use pyo3::prelude::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(error::_panic_for_test, m)?)?;
    context_parallel::register(m)?;
    deal::register(m)?;
    gather::register(m)?;
    memory::register(m)?;
    packing::register(m)?;
    parallel::register(m)?;
    schedule::register(m)?;
    stream::register(m)?;
    Ok(())
}

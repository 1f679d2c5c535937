//! Mapping core errors, and panics, to the exception classes of `tokenbatch.errors`.
//!
//! The classes are defined in Python because each one derives from both
//! `TokenBatchError` and a builtin (`ValueError`, `OverflowError`), which a single-base
//! `create_exception!` cannot express.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use tokenbatch_core::Error;

/// Convert a core error into the matching `tokenbatch.errors` exception.
pub fn to_py_err(error: Error) -> PyErr {
    let class_name = match &error {
        Error::InvalidValue(_) => "InvalidValueError",
        Error::Oversize { .. } => "OversizeError",
        Error::Overflow(_) => "TokenBatchOverflowError",
    };
    raise(class_name, error.to_string())
}

/// A `tokenbatch.errors.InvalidTypeError` (the core has no type errors: its inputs are typed).
pub fn invalid_type(message: impl Into<String>) -> PyErr {
    raise("InvalidTypeError", message.into())
}

/// A `tokenbatch.errors.InvalidValueError`.
pub fn invalid_value(message: impl Into<String>) -> PyErr {
    to_py_err(Error::invalid(message))
}

/// An instance of the exception class `class_name` of `tokenbatch.errors`.
fn raise(class_name: &str, message: String) -> PyErr {
    Python::attach(|py| {
        let raised = py
            .import("tokenbatch.errors")
            .and_then(|module| module.getattr(class_name))
            .and_then(|class| class.call1((message.as_str(),)));
        match raised {
            Ok(exception) => PyErr::from_value(exception),
            Err(import_failure) => {
                let err = PyRuntimeError::new_err(message);
                err.set_cause(py, Some(import_failure));
                err
            }
        }
    })
}

/// Run the body of the binding `function`, turning a Rust panic into
/// `tokenbatch.errors.InternalError` naming it.
///
/// Left alone, pyo3 raises a panic as `pyo3_runtime.PanicException`, a `BaseException`
/// that neither `except TokenBatchError` nor `except Exception` catches. Panics raised
/// with the GIL released (`py.detach` reacquires it while unwinding) or on a worker of
/// the thread pool (rayon resumes them on the calling thread) arrive here too. Every
/// function and method the extension exports goes through this; a test checks it.
pub fn guard<T>(function: &str, body: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    // Unwind safety: a panicking call leaves nothing behind that a later call reads; the
    // core is pure functions over their arguments, and results are built after it returns.
    catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|payload| {
        Err(raise(
            "InternalError",
            format!(
                "internal error in tokenbatch._core.{function}: {}; this is a bug in tokenbatch, \
                 please report it with the input that caused it",
                panic_message(payload.as_ref())
            ),
        ))
    })
}

fn panic_message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a Rust panic")
}

/// Extension trait: `core_call().map_py_err()?`.
pub trait IntoPyResult<T> {
    fn into_py_result(self) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for Result<T, Error> {
    fn into_py_result(self) -> PyResult<T> {
        self.map_err(to_py_err)
    }
}

/// Test hook, not API: panic on purpose inside [`guard`], with the GIL held
/// (`"binding"`), with it released (`"detached"`), or on a worker thread of the parallel
/// pool (`"worker"`), so the tests see what a real panic at each place becomes.
#[pyfunction]
#[allow(clippy::panic)] // the point of the function
pub fn _panic_for_test(py: Python<'_>, location: &str) -> PyResult<()> {
    guard("_panic_for_test", || match location {
        "binding" => panic!("deliberate panic with the GIL held"),
        "detached" => py.detach(|| panic!("deliberate panic with the GIL released")),
        "worker" => {
            crate::parallel::detach_parallel(py, || panic!("deliberate panic on a worker thread"))
        }
        other => Err(to_py_err(Error::invalid(format!(
            "location must be 'binding', 'detached' or 'worker', got {other:?}"
        )))),
    })
}

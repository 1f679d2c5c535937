//! The exceptions the extension raises, declared once, the one mapping from the core's
//! error kinds to them, and the guard that turns a panic of core code into one.
//!
//! The classes are defined in `tokenbatch.errors` because each derives from both
//! `TokenBatchError` and a builtin (`ValueError`, `TypeError`, `OverflowError`,
//! `RuntimeError`), which `create_exception!` (one base class) cannot express;
//! `import_exception!` binds them here, looked up once per process.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::prelude::*;
use tokenbatch_core::Error;

pyo3::import_exception!(tokenbatch.errors, InvalidValueError);
pyo3::import_exception!(tokenbatch.errors, OversizeError);
pyo3::import_exception!(tokenbatch.errors, InvalidTypeError);
pyo3::import_exception!(tokenbatch.errors, TokenBatchOverflowError);
pyo3::import_exception!(tokenbatch.errors, InternalError);

/// A core error on its way to Python (the orphan rule forbids `From<Error> for PyErr` in
/// this crate, so the conversion goes through this wrapper).
pub struct CoreError(Error);

impl From<Error> for CoreError {
    fn from(error: Error) -> Self {
        Self(error)
    }
}

impl From<CoreError> for PyErr {
    fn from(CoreError(error): CoreError) -> Self {
        let message = error.to_string();
        match error {
            Error::InvalidValue(_) => InvalidValueError::new_err(message),
            Error::Oversize { .. } | Error::OversizeGroup(_) => OversizeError::new_err(message),
            Error::Overflow(_) => TokenBatchOverflowError::new_err(message),
        }
    }
}

/// `core_call().into_py_result()?`: a core result, its error raised as its exception.
pub trait IntoPyResult<T> {
    fn into_py_result(self) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for Result<T, Error> {
    fn into_py_result(self) -> PyResult<T> {
        self.map_err(|error| CoreError(error).into())
    }
}

/// Run `body`, which calls into the core, turning a Rust panic into
/// `tokenbatch.errors.InternalError` naming `function`.
///
/// Left alone, pyo3 raises a panic as `pyo3_runtime.PanicException`, a `BaseException`
/// that neither `except TokenBatchError` nor `except Exception` catches. Panics raised
/// with the GIL released (`py.detach` reacquires it while unwinding) or on a worker of
/// the thread pool (rayon resumes them on the calling thread) arrive here too. Every
/// binding that runs core code (not one that reads a field) goes through this.
pub fn guard<T>(function: &str, body: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    // Unwind safety: a panicking call leaves nothing behind that a later call reads; the
    // core is pure functions over their arguments, and results are built after it returns.
    catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|payload| {
        Err(InternalError::new_err(format!(
            "internal error in tokenbatch._core.{function}: {}; this is a bug in tokenbatch, \
             please report it with the input that caused it",
            panic_message(payload.as_ref())
        )))
    })
}

fn panic_message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a Rust panic")
}

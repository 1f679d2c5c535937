//! Mapping core errors to the exception classes of `tokenbatch.errors`.
//!
//! The classes are defined in Python because each one derives from both
//! `TokenBatchError` and a builtin (`ValueError`, `OverflowError`), which a single-base
//! `create_exception!` cannot express.

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

/// Extension trait: `core_call().map_py_err()?`.
pub trait IntoPyResult<T> {
    fn into_py_result(self) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for Result<T, Error> {
    fn into_py_result(self) -> PyResult<T> {
        self.map_err(to_py_err)
    }
}

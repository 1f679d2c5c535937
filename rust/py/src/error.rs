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
    Python::attach(|py| {
        let raised = py
            .import("tokenbatch.errors")
            .and_then(|module| module.getattr(class_name))
            .and_then(|class| class.call1((error.to_string(),)));
        match raised {
            Ok(exception) => PyErr::from_value(exception),
            Err(import_failure) => {
                let err = PyRuntimeError::new_err(error.to_string());
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

//! Reading Python arguments with the checks and exception classes of `tokenbatch`.
//!
//! PyO3's own conversions raise plain `TypeError`s that do not name the parameter and are
//! not `TokenBatchError`s, and they accept `True` as the integer 1. Methods of the classes
//! take their arguments as Python objects and read them here, where the parameter's name is
//! known, with the rules of the Python wrappers (`tokenbatch._convert`).

use std::str::FromStr;

use pyo3::exceptions::PyOverflowError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyString};
use tokenbatch_core::Error;

use crate::error::{invalid_type, invalid_value, to_py_err};

/// An argument as passed, or nothing when it was left out (so that a default and an
/// explicit `None` can differ).
pub struct Arg<'py>(Option<Bound<'py, PyAny>>);

impl<'a, 'py> FromPyObject<'a, 'py> for Arg<'py> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        Ok(Self(Some(obj.to_owned())))
    }
}

impl<'py> Arg<'py> {
    /// The argument was left out.
    pub const MISSING: Self = Self(None);

    /// An integer of at least `minimum`, or `default` when left out.
    pub fn int_or(&self, name: &str, default: i64, minimum: i64) -> PyResult<i64> {
        self.0
            .as_ref()
            .map_or(Ok(default), |value| int(value, name, minimum))
    }

    /// A bool, or `default` when left out.
    pub fn flag_or(&self, name: &str, default: bool) -> PyResult<bool> {
        self.0
            .as_ref()
            .map_or(Ok(default), |value| flag(value, name))
    }

    /// The value, unless left out.
    pub fn given(&self) -> Option<&Bound<'py, PyAny>> {
        self.0.as_ref()
    }
}

/// `repr(value)`, for messages.
pub fn repr(value: &Bound<'_, PyAny>) -> String {
    value
        .repr()
        .map_or_else(|_| "?".to_string(), |r| r.to_string())
}

/// `repr(value) (type name)`, for messages about types.
fn describe(value: &Bound<'_, PyAny>) -> String {
    let repr = repr(value);
    let type_name = value
        .get_type()
        .name()
        .map_or_else(|_| "?".to_string(), |n| n.to_string());
    format!("{repr} ({type_name})")
}

/// An integer in the signed 64-bit range, at least `minimum`: not a bool; a float only if
/// it holds a whole number (`2e3`), as `tokenbatch._convert.as_int` reads counts.
pub fn int(value: &Bound<'_, PyAny>, name: &str, minimum: i64) -> PyResult<i64> {
    if value.is_instance_of::<PyBool>() {
        return Err(invalid_type(format!(
            "{name} must be an integer, got {}",
            describe(value)
        )));
    }
    let result = if is_float(value) {
        whole(value.extract::<f64>()?, name)?
    } else {
        exact_int(value, name)?
    };
    if result < minimum {
        return Err(invalid_value(format!(
            "{name} must be at least {minimum}, got {result}"
        )));
    }
    Ok(result)
}

/// A Python or numpy float.
fn is_float(value: &Bound<'_, PyAny>) -> bool {
    value.is_instance_of::<PyFloat>()
        || value
            .get_type()
            .name()
            .is_ok_and(|n| n.to_str().is_ok_and(|n| n.starts_with("float")))
}

/// A float holding a whole number in the signed 64-bit range, as that integer.
fn whole(x: f64, name: &str) -> PyResult<i64> {
    if !x.is_finite() || x.fract() != 0.0 {
        return Err(invalid_type(format!(
            "{name} must be an integer, got {x:?} (not a whole number)"
        )));
    }
    // 2^63 is exactly representable; every whole float below it fits in i64.
    if !(-(2f64.powi(63))..2f64.powi(63)).contains(&x) {
        return Err(to_py_err(Error::overflow(format!(
            "{name}={x:?} does not fit in a signed 64-bit integer"
        ))));
    }
    Ok(x as i64)
}

fn exact_int(value: &Bound<'_, PyAny>, name: &str) -> PyResult<i64> {
    value.extract::<i64>().map_err(|error| {
        if error.is_instance_of::<PyOverflowError>(value.py()) {
            to_py_err(Error::overflow(format!(
                "{name}={value} does not fit in a signed 64-bit integer"
            )))
        } else {
            invalid_type(format!(
                "{name} must be an integer, got {}",
                describe(value)
            ))
        }
    })
}

/// `None`, or an integer of at least `minimum`.
pub fn optional_int(value: &Bound<'_, PyAny>, name: &str, minimum: i64) -> PyResult<Option<i64>> {
    if value.is_none() {
        Ok(None)
    } else {
        int(value, name, minimum).map(Some)
    }
}

/// A seed: an integer in `[0, 2**64)`.
pub fn seed(value: &Bound<'_, PyAny>) -> PyResult<u64> {
    if value.is_instance_of::<PyBool>() {
        return Err(invalid_type(format!(
            "seed must be an integer, got {}",
            describe(value)
        )));
    }
    value.extract::<u64>().map_err(|error| {
        if error.is_instance_of::<PyOverflowError>(value.py()) {
            invalid_value(format!("seed must be in [0, 2**64), got {value}"))
        } else {
            invalid_type(format!("seed must be an integer, got {}", describe(value)))
        }
    })
}

/// A bool (Python's or numpy's).
pub fn flag(value: &Bound<'_, PyAny>, name: &str) -> PyResult<bool> {
    let is_bool = value.is_instance_of::<PyBool>()
        || value
            .get_type()
            .name()
            .is_ok_and(|n| n.to_str().is_ok_and(|n| n == "bool" || n == "bool_"));
    if !is_bool {
        return Err(invalid_type(format!(
            "{name} must be a bool, got {}",
            describe(value)
        )));
    }
    value.is_truthy()
}

/// One of the names `T` parses.
pub fn choice<T: FromStr<Err = Error>>(value: &Bound<'_, PyAny>, name: &str) -> PyResult<T> {
    let text = value
        .cast::<PyString>()
        .map_err(|_| invalid_type(format!("{name} must be a string, got {}", describe(value))))?;
    text.to_str()?.parse().map_err(to_py_err)
}

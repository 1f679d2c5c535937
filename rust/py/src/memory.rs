//! Bindings of `tokenbatch_core::memory`.

use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use tokenbatch_core::memory::{
    self, GridInput, Invalid, Layout, Recompute, Values, INVALID_REASONS, LAYOUT_FIELDS,
    MAX_RECOMPUTE_CODE, N_LAYOUT_FIELDS, OUTPUT_FIELDS,
};

use crate::arrays::as_slice;
use crate::error::{guard, IntoPyResult};
use crate::model_spec::PyModelSpec;
use crate::parallel::detach_parallel;

/// A grid's values table and reason codes.
type GridArrays<'py> = (Bound<'py, PyArray1<f64>>, Bound<'py, PyArray1<u8>>);

/// A grid input's values: float64, int64, int32 or bool, read in place.
#[derive(FromPyObject)]
enum NumberArray<'py> {
    F64(PyReadonlyArray1<'py, f64>),
    I64(PyReadonlyArray1<'py, i64>),
    I32(PyReadonlyArray1<'py, i32>),
    Bool(PyReadonlyArray1<'py, bool>),
}

/// Evaluate a broadcast grid (each input a compact array with its element strides);
/// returns the `(len(OUTPUT_FIELDS), cells)` table, flat and row-major (one contiguous run
/// per field), and the per-cell reason codes (0: valid).
#[pyfunction]
fn memory_grid<'py>(
    py: Python<'py>,
    spec: &Bound<'py, PyModelSpec>,
    shape: Vec<usize>,
    inputs: Vec<(NumberArray<'py>, Vec<usize>)>,
) -> PyResult<GridArrays<'py>> {
    guard("memory_grid", || {
        let spec = &spec.get().spec;
        let slices = inputs
            .iter()
            .map(|(array, strides)| {
                let data = match array {
                    NumberArray::F64(array) => Values::F64(as_slice(array)?),
                    NumberArray::I64(array) => Values::I64(as_slice(array)?),
                    NumberArray::I32(array) => Values::I32(as_slice(array)?),
                    NumberArray::Bool(array) => Values::Bool(as_slice(array)?),
                };
                Ok(GridInput {
                    data,
                    strides: strides.as_slice(),
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        // Parallel over the grid: run in tokenbatch's fork-safe pool.
        let table = detach_parallel(py, || memory::estimate_grid(spec, &shape, &slices))
            .into_py_result()?;
        Ok((
            table.values.into_pyarray(py),
            table.reasons.into_pyarray(py),
        ))
    })
}

/// One configuration (layout values in `LAYOUT_FIELDS` order): its `OUTPUT_FIELDS`
/// values and 0, or no values and the reason code. Plain lists, no arrays: a single
/// estimate is a call users make in loops.
#[pyfunction]
fn memory_estimate(
    spec: &Bound<'_, PyModelSpec>,
    layout: [f64; N_LAYOUT_FIELDS],
) -> PyResult<(Vec<f64>, u8)> {
    guard("memory_estimate", || {
        let layout = Layout::from_values(&layout);
        Ok(
            match memory::estimate_one(&spec.get().spec, &layout).into_py_result()? {
                Ok(breakdown) => (breakdown.to_values().to_vec(), 0),
                Err(invalid) => (Vec::new(), invalid.code()),
            },
        )
    })
}

/// Every pipeline stage of one configuration (layout values in `LAYOUT_FIELDS` order):
/// the `(stages, len(OUTPUT_FIELDS))` table, flat and row-major, and the reason code (0:
/// valid; the table is then empty unless valid).
#[pyfunction]
fn memory_stages<'py>(
    py: Python<'py>,
    spec: &Bound<'py, PyModelSpec>,
    layout: [f64; N_LAYOUT_FIELDS],
) -> PyResult<(Bound<'py, PyArray1<f64>>, u8)> {
    guard("memory_stages", || {
        let layout = Layout::from_values(&layout);
        Ok(
            match memory::estimate_all_stages(&spec.get().spec, &layout).into_py_result()? {
                Ok(stages) => {
                    let flat: Vec<f64> = stages.iter().flat_map(|b| b.to_values()).collect();
                    (flat.into_pyarray(py), 0)
                }
                Err(invalid) => (Vec::new().into_pyarray(py), invalid.code()),
            },
        )
    })
}

/// The largest micro-batch of one packed row that fits in `gpu_memory` bytes (see
/// [`memory::max_micro_batch_tokens`]): the tokens and 0, or 0, the reason code and the
/// `seq_len` of the smallest row, invalid.
#[pyfunction]
fn memory_max_tokens(
    spec: &Bound<'_, PyModelSpec>,
    layout: [f64; N_LAYOUT_FIELDS],
    gpu_memory: f64,
    multiple_of: u64,
) -> PyResult<(u64, u8, u64)> {
    guard("memory_max_tokens", || {
        let layout = Layout::from_values(&layout);
        let spec = &spec.get().spec;
        Ok(
            match memory::max_micro_batch_tokens(spec, &layout, gpu_memory, multiple_of)
                .into_py_result()?
            {
                Ok(tokens) => (tokens, 0, 0),
                Err((invalid, seq_len)) => (0, invalid.code(), seq_len),
            },
        )
    })
}

/// The number layout field `option` holds for `name` (any case); an error listing the
/// choices when it names none.
#[pyfunction]
fn memory_option_code(option: &str, name: &str) -> PyResult<f64> {
    guard("memory_option_code", || {
        memory::option_code(option, name).into_py_result()
    })
}

/// [`memory_option_code`] of each string of a `<U` array viewed as `(n, width)` uint32
/// code points, NaN where it names nothing.
#[pyfunction]
fn memory_option_codes<'py>(
    py: Python<'py>,
    option: &str,
    text: PyReadonlyArray2<'py, u32>,
) -> PyResult<Bound<'py, PyArray1<f64>>> {
    guard("memory_option_codes", || {
        let width = text.shape()[1];
        let rows = text
            .as_slice()
            .map_err(|_| PyTypeError::new_err("expected a C-contiguous array"))?;
        let codes = detach_parallel(py, || memory::option_codes(option, rows, width));
        Ok(codes.into_py_result()?.into_pyarray(py))
    })
}

/// The names option `option` accepts with their values (`recompute`: its modes).
#[pyfunction]
fn memory_option_choices(option: &str) -> PyResult<Vec<(&'static str, f64)>> {
    guard("memory_option_choices", || {
        memory::option_choices(option).into_py_result()
    })
}

/// Megatron-Core's modules that `recompute` may name, with their bits.
#[pyfunction]
fn memory_recompute_modules() -> Vec<(&'static str, u8)> {
    memory::options::RECOMPUTE_MODULES.to_vec()
}

/// The name of a `recompute` code; `None` for a number that is no code.
#[pyfunction]
fn memory_recompute_name(code: f64) -> Option<String> {
    let whole = code.fract() == 0.0 && (0.0..=MAX_RECOMPUTE_CODE).contains(&code);
    whole.then(|| Recompute::from_code(code).name())
}

/// Names, in the order the grid uses them.
type Names = Vec<&'static str>;

/// Names of the grid inputs, of the output columns, the invalid-reason messages (reason
/// code `i` is `messages[i - 1]`) and the code of an estimate past the range of a float.
#[pyfunction]
fn memory_fields() -> PyResult<(Names, Names, Names, u8)> {
    guard("memory_fields", || {
        Ok((
            LAYOUT_FIELDS.to_vec(),
            OUTPUT_FIELDS.to_vec(),
            INVALID_REASONS.iter().map(|r| r.message()).collect(),
            Invalid::Overflow.code(),
        ))
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(memory_grid, m)?)?;
    m.add_function(wrap_pyfunction!(memory_estimate, m)?)?;
    m.add_function(wrap_pyfunction!(memory_stages, m)?)?;
    m.add_function(wrap_pyfunction!(memory_max_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(memory_option_code, m)?)?;
    m.add_function(wrap_pyfunction!(memory_option_codes, m)?)?;
    m.add_function(wrap_pyfunction!(memory_option_choices, m)?)?;
    m.add_function(wrap_pyfunction!(memory_recompute_modules, m)?)?;
    m.add_function(wrap_pyfunction!(memory_recompute_name, m)?)?;
    m.add_function(wrap_pyfunction!(memory_fields, m)?)?;
    Ok(())
}

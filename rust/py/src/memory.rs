//! Bindings of `tokenbatch_core::memory`.

use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use tokenbatch_core::memory::{
    self, GridInput, Invalid, Layout, NameSets, NameTable, Values, INVALID_REASONS, LAYOUT_FIELDS,
    N_LAYOUT_FIELDS, OUTPUT_FIELDS,
};

use crate::arrays::as_slice;
use crate::error::{guard, IntoPyResult};
use crate::model_spec::PyModelSpec;
use crate::parallel::detach_parallel;

/// Parameters of a dense layer, of an MoE layer, and of an MoE layer counting only the
/// `top_k` routed experts, each as (replicated, tensor-parallel, key/value, routed experts);
/// then the embedding and the output projection (0 when tied).
type LayerParamTable = ([f64; 4], [f64; 4], [f64; 4], f64, f64);

/// A spec's per-layer parameter counts (see [`LayerParamTable`]).
#[pyfunction]
fn memory_layer_params(spec: &Bound<'_, PyModelSpec>) -> PyResult<LayerParamTable> {
    guard("memory_layer_params", || {
        let spec = &spec.get().spec;
        let row = |p: memory::LayerParams| [p.replicated, p.tp_split, p.kv, p.experts];
        let moe_index = spec.first_dense_layers.min(spec.num_layers - 1);
        let (embedding, _) = spec.embedding_params();
        let (_, projection) = spec.head_params(false);
        Ok((
            row(spec.layer_params(0, false)),
            row(spec.layer_params(moe_index, false)),
            row(spec.layer_params(moe_index, true)),
            embedding,
            projection,
        ))
    })
}

/// Layers of each pipeline stage under a split rule (a `pipeline_split` code and explicit
/// first/last stage layers, 0 when not given); `None` when the layers do not split so.
#[pyfunction]
fn memory_pipeline_layers(
    num_layers: u64,
    pp: u64,
    vpp: u64,
    split: f64,
    first: u64,
    last: u64,
) -> PyResult<Option<Vec<u64>>> {
    guard("memory_pipeline_layers", || {
        let stages = memory::PipelineSplit::from_code(split)
            .and_then(|split| memory::StageLayers::new(num_layers, pp, vpp, split, first, last));
        Ok(stages.map(|stages| (0..pp).map(|stage| stages.stage_layers(stage)).collect()))
    })
}

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

/// Names made of parts: the separator, the parts' names and bits, and the code of the
/// empty set (see [`NameSets`]).
type SetsArg = (char, Vec<String>, Vec<u32>, f64);

/// One grid input with its element strides: numbers, or the code points of a `<U` array
/// (viewed as `(n, width)` uint32) with the names it may hold, their codes, and the
/// names made of parts it may hold (or `None`).
#[derive(FromPyObject)]
enum GridColumn<'py> {
    Numbers(NumberArray<'py>, Vec<usize>),
    Names(
        PyReadonlyArray2<'py, u32>,
        Vec<usize>,
        Vec<String>,
        Vec<f64>,
        Option<SetsArg>,
    ),
}

/// Evaluate a broadcast grid; returns the `(len(OUTPUT_FIELDS), cells)` table, flat and
/// row-major (one contiguous run per field), and the per-cell reason codes (0: valid).
#[pyfunction]
fn memory_grid<'py>(
    py: Python<'py>,
    spec: &Bound<'py, PyModelSpec>,
    shape: Vec<usize>,
    inputs: Vec<GridColumn<'py>>,
) -> PyResult<GridArrays<'py>> {
    guard("memory_grid", || {
        let spec = &spec.get().spec;
        let tables = inputs
            .iter()
            .map(|input| match input {
                GridColumn::Names(text, _, names, codes, sets) => {
                    name_table(text.shape()[1], names, codes, sets.as_ref()).map(Some)
                }
                GridColumn::Numbers(..) => Ok(None),
            })
            .collect::<PyResult<Vec<_>>>()?;
        let slices = inputs
            .iter()
            .zip(&tables)
            .map(|(input, table)| {
                let (data, strides) = match (input, table) {
                    (GridColumn::Numbers(NumberArray::F64(array), strides), _) => {
                        (Values::F64(as_slice(array)?), strides)
                    }
                    (GridColumn::Numbers(NumberArray::I64(array), strides), _) => {
                        (Values::I64(as_slice(array)?), strides)
                    }
                    (GridColumn::Numbers(NumberArray::I32(array), strides), _) => {
                        (Values::I32(as_slice(array)?), strides)
                    }
                    (GridColumn::Numbers(NumberArray::Bool(array), strides), _) => {
                        (Values::Bool(as_slice(array)?), strides)
                    }
                    (GridColumn::Names(text, strides, ..), Some(table)) => {
                        (Values::Names(code_points(text)?, table), strides)
                    }
                    (GridColumn::Names(..), None) => {
                        return Err(PyValueError::new_err("a names column without its table"))
                    }
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

/// The table of `names` (with their `codes`, and the `sets` of parts) for strings
/// `width` code points wide.
fn name_table(
    width: usize,
    names: &[String],
    codes: &[f64],
    sets: Option<&SetsArg>,
) -> PyResult<NameTable> {
    if names.len() != codes.len() {
        return Err(PyValueError::new_err("one code per name"));
    }
    if width == 0 {
        return Err(PyValueError::new_err("strings of width 0"));
    }
    let points = |names: &[String]| -> Vec<Vec<u32>> {
        names
            .iter()
            .map(|name| name.chars().map(u32::from).collect())
            .collect()
    };
    let table = NameTable::new(width, &points(names), codes);
    Ok(match sets {
        None => table,
        Some((separator, parts, bits, base)) => {
            if parts.len() != bits.len() {
                return Err(PyValueError::new_err("one bit per part"));
            }
            let sets = NameSets::new(u32::from(*separator), &points(parts), bits, *base);
            table.with_sets(sets)
        }
    })
}

/// The code points of a `<U` array viewed as `(n, width)` uint32, in place.
fn code_points<'a>(text: &'a PyReadonlyArray2<'_, u32>) -> PyResult<&'a [u32]> {
    text.as_slice()
        .map_err(|_| PyTypeError::new_err("expected a C-contiguous array"))
}

/// For each row of `text` (a numpy `<U` array viewed as `(n, width)` uint32 code points),
/// the code of the name it equals (`codes[i]` for `names[i]`), or of the set of parts it
/// names (`sets`), or NaN.
#[pyfunction]
fn memory_name_codes<'py>(
    py: Python<'py>,
    text: PyReadonlyArray2<'py, u32>,
    names: Vec<String>,
    codes: Vec<f64>,
    sets: Option<SetsArg>,
) -> PyResult<Bound<'py, PyArray1<f64>>> {
    guard("memory_name_codes", || {
        let points = code_points(&text)?;
        let table = name_table(text.shape()[1], &names, &codes, sets.as_ref())?;
        let found = detach_parallel(py, || memory::name_codes(points, &table));
        Ok(found.into_pyarray(py))
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
        let spec = &spec.get().spec;
        let layout = Layout::from_values(&layout);
        let stages = py
            .detach(|| memory::estimate_all_stages(spec, &layout))
            .into_py_result()?;
        Ok(match stages {
            Ok(stages) => (
                stages
                    .iter()
                    .flat_map(|b| b.to_values())
                    .collect::<Vec<f64>>()
                    .into_pyarray(py),
                0,
            ),
            Err(invalid) => (Vec::new().into_pyarray(py), invalid.code()),
        })
    })
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
    m.add_function(wrap_pyfunction!(memory_layer_params, m)?)?;
    m.add_function(wrap_pyfunction!(memory_pipeline_layers, m)?)?;
    m.add_function(wrap_pyfunction!(memory_grid, m)?)?;
    m.add_function(wrap_pyfunction!(memory_name_codes, m)?)?;
    m.add_function(wrap_pyfunction!(memory_fields, m)?)?;
    m.add_function(wrap_pyfunction!(memory_stages, m)?)?;
    Ok(())
}

//! Bindings of `tokenbatch_core::memory::planner`: the layout search and the step-time
//! model.

use numpy::{IntoPyArray, PyReadonlyArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tokenbatch_core::memory::planner::{
    self, Candidate, Constants, Hardware, Overrides, Request, CANDIDATE_FIELDS, CHOSEN,
    HARDWARE_FIGURES, HARDWARE_PRESETS, OVERLAP_TAX, TIME_PARTS,
};
use tokenbatch_core::memory::{Layout, N_LAYOUT_FIELDS};

use crate::arrays::as_slice;
use crate::error::{guard, IntoPyResult};
use crate::model_spec::PyModelSpec;
use crate::parallel::detach_parallel;

/// A GPU's figures in `HARDWARE_FIGURES` order and its GPUs per node.
type HardwareArg = ([f64; 6], i64);

/// Figures that replace the hardware's: `gpu_memory`, `peak_flops`,
/// `intra_node_bandwidth`, `inter_node_bandwidth`, `gpus_per_node`.
type OverridesArg = (
    Option<f64>,
    Option<f64>,
    Option<f64>,
    Option<f64>,
    Option<i64>,
);

/// The step-time model's constants: efficiency, seconds per layer pass, overlap tax (the
/// model's own when `None`).
type ConstantsArg = (f64, f64, Option<f64>);

fn hardware(arg: HardwareArg) -> PyResult<Hardware> {
    Hardware::new(arg.0, arg.1).into_py_result()
}

fn constants(arg: ConstantsArg, overlap_ep_comm: bool, deduplicated_dispatch: bool) -> Constants {
    Constants {
        efficiency: arg.0,
        layer_pass_overhead: arg.1,
        overlap_tax: arg.2.unwrap_or(OVERLAP_TAX),
        overlap_ep_comm,
        deduplicated_dispatch,
    }
}

/// The planner's names, each list under the name of what it lists: `presets` (name,
/// figures, GPUs per node of each hardware preset), `figures` (the figures' names, in
/// their order), `time_parts` (the parts of a step's time), `candidate_fields` (the fields
/// of a `planner_step_time` candidate) and `chosen` (the layout fields the plan chooses).
#[pyfunction]
fn planner_names(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    guard("planner_names", || {
        let names = PyDict::new(py);
        let presets: Vec<(&str, [f64; 6], u64)> = HARDWARE_PRESETS
            .iter()
            .map(|(name, hw)| (*name, hw.figures(), hw.gpus_per_node))
            .collect();
        names.set_item("presets", presets)?;
        names.set_item("figures", HARDWARE_FIGURES.to_vec())?;
        names.set_item("time_parts", TIME_PARTS.to_vec())?;
        names.set_item("candidate_fields", CANDIDATE_FIELDS.to_vec())?;
        names.set_item("chosen", CHOSEN.to_vec())?;
        Ok(names)
    })
}

/// Check a GPU's figures: raises naming the first that is not a positive number.
#[pyfunction]
fn planner_check_hardware(figures: [f64; 6], gpus_per_node: i64) -> PyResult<()> {
    guard("planner_check_hardware", || {
        hardware((figures, gpus_per_node)).map(|_| ())
    })
}

/// The layouts that fit, fastest first, as columns: numbers as numpy arrays, names and
/// stage layers as lists.
#[pyfunction]
#[pyo3(signature = (
    spec, *, num_gpus, seq_len, global_batch_tokens, hardware, overrides, options, constants,
    overlap_ep_comm, deduplicated_dispatch, usable_fraction, recompute, distinct, top
))]
#[allow(clippy::too_many_arguments)]
fn planner_plan<'py>(
    py: Python<'py>,
    spec: &Bound<'py, PyModelSpec>,
    num_gpus: i64,
    seq_len: i64,
    global_batch_tokens: i64,
    hardware: HardwareArg,
    overrides: OverridesArg,
    options: [f64; N_LAYOUT_FIELDS],
    constants: ConstantsArg,
    overlap_ep_comm: bool,
    deduplicated_dispatch: bool,
    usable_fraction: f64,
    recompute: Vec<String>,
    distinct: bool,
    top: Option<i64>,
) -> PyResult<Bound<'py, PyDict>> {
    guard("planner_plan", || {
        let spec = &spec.get().spec;
        let request = Request {
            num_gpus,
            seq_len,
            global_batch_tokens,
            hardware: self::hardware(hardware)?,
            overrides: Overrides {
                gpu_memory: overrides.0,
                peak_flops: overrides.1,
                intra_node_bandwidth: overrides.2,
                inter_node_bandwidth: overrides.3,
                gpus_per_node: overrides.4,
            },
            options: Layout::from_values(&options),
            constants: self::constants(constants, overlap_ep_comm, deduplicated_dispatch),
            usable_fraction,
            recompute: &recompute,
            distinct,
            top,
        };
        // Parallel over the candidates: run in tokenbatch's fork-safe pool.
        let plan =
            detach_parallel(py, || planner::plan_layouts(spec, &request)).into_py_result()?;
        let table = PyDict::new(py);
        for (name, column) in [
            ("dp", plan.dp),
            ("tp", plan.tp),
            ("pp", plan.pp),
            ("cp", plan.cp),
            ("ep", plan.ep),
            ("vpp", plan.vpp),
            ("zero", plan.zero),
            ("micro_batch", plan.micro_batch),
            ("grad_accum_steps", plan.grad_accum_steps),
            ("first_stage_layers", plan.first_stage_layers),
            ("last_stage_layers", plan.last_stage_layers),
        ] {
            table.set_item(name, column.into_pyarray(py))?;
        }
        for (name, column) in [
            ("memory", plan.memory),
            ("step_time", plan.step_time),
            ("mfu", plan.mfu),
            ("tokens_per_second", plan.tokens_per_second),
        ] {
            table.set_item(name, column.into_pyarray(py))?;
        }
        for (name, column) in TIME_PARTS.iter().zip(plan.time_parts) {
            table.set_item(name, column.into_pyarray(py))?;
        }
        let names: Vec<String> = plan.recompute.iter().map(|mode| mode.name()).collect();
        table.set_item("recompute", names)?;
        let splits: Vec<&str> = plan
            .pipeline_split
            .iter()
            .map(|split| split.name())
            .collect();
        table.set_item("pipeline_split", splits)?;
        table.set_item("stage_layers", plan.stage_layers)?;
        Ok(table)
    })
}

/// The step time of candidates given as columns (float64, in `CANDIDATE_FIELDS` order):
/// each part of `TIME_PARTS`, `total` and `model_flops`, as arrays.
#[pyfunction]
#[pyo3(signature = (
    spec, columns, *, hardware, seq_len, options, constants, overlap_ep_comm,
    deduplicated_dispatch
))]
#[allow(clippy::too_many_arguments)]
fn planner_step_time<'py>(
    py: Python<'py>,
    spec: &Bound<'py, PyModelSpec>,
    columns: Vec<PyReadonlyArray1<'py, f64>>,
    hardware: HardwareArg,
    seq_len: f64,
    options: [f64; N_LAYOUT_FIELDS],
    constants: ConstantsArg,
    overlap_ep_comm: bool,
    deduplicated_dispatch: bool,
) -> PyResult<Bound<'py, PyDict>> {
    guard("planner_step_time", || {
        let spec = &spec.get().spec;
        let columns = columns
            .iter()
            .map(as_slice)
            .collect::<PyResult<Vec<&[f64]>>>()?;
        let n = columns.first().map_or(0, |column| column.len());
        if columns.len() != CANDIDATE_FIELDS.len() || columns.iter().any(|c| c.len() != n) {
            return Err(PyValueError::new_err(format!(
                "expected {} columns of one length",
                CANDIDATE_FIELDS.len()
            )));
        }
        let candidates: Vec<Candidate> = (0..n)
            .map(|i| Candidate::from_values(std::array::from_fn(|f| columns[f][i])))
            .collect();
        let hw = self::hardware(hardware)?;
        let inputs = Layout::from_values(&options);
        let constants = self::constants(constants, overlap_ep_comm, deduplicated_dispatch);
        let times = detach_parallel(py, || {
            planner::step_times(spec, &candidates, &hw, seq_len, &inputs, &constants)
        })
        .into_py_result()?;
        let table = PyDict::new(py);
        for (index, name) in TIME_PARTS.iter().enumerate() {
            let part: Vec<f64> = times.iter().map(|t| t.parts[index]).collect();
            table.set_item(name, part.into_pyarray(py))?;
        }
        let total: Vec<f64> = times.iter().map(|t| t.total).collect();
        table.set_item("total", total.into_pyarray(py))?;
        let flops: Vec<f64> = times.iter().map(|t| t.model_flops).collect();
        table.set_item("model_flops", flops.into_pyarray(py))?;
        Ok(table)
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(planner_names, m)?)?;
    m.add_function(wrap_pyfunction!(planner_check_hardware, m)?)?;
    m.add_function(wrap_pyfunction!(planner_plan, m)?)?;
    m.add_function(wrap_pyfunction!(planner_step_time, m)?)?;
    Ok(())
}

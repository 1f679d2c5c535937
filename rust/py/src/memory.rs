//! Bindings of `tokenbatch_core::memory`.

use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;
use tokenbatch_core::memory::{
    self, FfnType, GridInput, ModelSpec, NormType, INVALID_REASONS, LAYOUT_FIELDS, OUTPUT_FIELDS,
};

use crate::arrays::as_slice;
use crate::error::{guard, IntoPyResult};
use crate::parallel::detach_parallel;

/// The fields of `tokenbatch.ModelSpec.to_dict()`, read by key.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
struct SpecDict {
    hidden_size: u64,
    num_layers: u64,
    num_heads: u64,
    num_kv_heads: u64,
    head_dim: u64,
    ffn_size: u64,
    ffn_type: String,
    vocab_size: u64,
    tied_embeddings: bool,
    norm: String,
    qkv_bias: bool,
    linear_bias: bool,
    learned_positions: u64,
    num_experts: u64,
    top_k: u64,
    num_shared_experts: u64,
    moe_ffn_size: u64,
    first_dense_layers: u64,
    router_bias: bool,
    q_lora_rank: u64,
    kv_lora_rank: u64,
    qk_nope_head_dim: u64,
    qk_rope_head_dim: u64,
    v_head_dim: u64,
}

impl SpecDict {
    fn into_core(self) -> tokenbatch_core::Result<ModelSpec> {
        Ok(ModelSpec {
            hidden_size: self.hidden_size,
            num_layers: self.num_layers,
            num_heads: self.num_heads,
            num_kv_heads: self.num_kv_heads,
            head_dim: self.head_dim,
            ffn_size: self.ffn_size,
            ffn_type: FfnType::parse(&self.ffn_type)?,
            vocab_size: self.vocab_size,
            tied_embeddings: self.tied_embeddings,
            norm: NormType::parse(&self.norm)?,
            qkv_bias: self.qkv_bias,
            linear_bias: self.linear_bias,
            learned_positions: self.learned_positions,
            num_experts: self.num_experts,
            top_k: self.top_k,
            num_shared_experts: self.num_shared_experts,
            moe_ffn_size: self.moe_ffn_size,
            first_dense_layers: self.first_dense_layers,
            router_bias: self.router_bias,
            q_lora_rank: self.q_lora_rank,
            kv_lora_rank: self.kv_lora_rank,
            qk_nope_head_dim: self.qk_nope_head_dim,
            qk_rope_head_dim: self.qk_rope_head_dim,
            v_head_dim: self.v_head_dim,
        })
    }
}

/// Validate a spec and return its (total, active) parameter counts.
#[pyfunction]
fn memory_param_counts(spec: SpecDict) -> PyResult<(f64, f64)> {
    guard("memory_param_counts", || {
        let spec = spec.into_core().into_py_result()?;
        spec.validate().into_py_result()?;
        Ok((spec.total_params(), spec.active_params()))
    })
}

/// A grid's values table and reason codes.
type GridArrays<'py> = (Bound<'py, PyArray1<f64>>, Bound<'py, PyArray1<u8>>);

/// Evaluate a broadcast grid; returns the `(len(OUTPUT_FIELDS), cells)` table, flat and
/// row-major (one contiguous run per field), and the per-cell reason codes (0: valid).
#[pyfunction]
fn memory_grid<'py>(
    py: Python<'py>,
    spec: SpecDict,
    shape: Vec<usize>,
    inputs: Vec<(PyReadonlyArray1<'py, f64>, Vec<usize>)>,
) -> PyResult<GridArrays<'py>> {
    guard("memory_grid", || {
        let spec = spec.into_core().into_py_result()?;
        let slices = inputs
            .iter()
            .map(|(array, strides)| {
                as_slice(array).map(|data| GridInput {
                    data,
                    strides: strides.as_slice(),
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        // Parallel over the grid: run in tokenbatch's fork-safe pool.
        let table = detach_parallel(py, || memory::estimate_grid(&spec, &shape, &slices))
            .into_py_result()?;
        Ok((
            table.values.into_pyarray(py),
            table.reasons.into_pyarray(py),
        ))
    })
}

/// Names of the grid inputs, of the output columns, and the invalid-reason messages
/// (reason code `i` is `messages[i - 1]`).
#[pyfunction]
fn memory_fields() -> PyResult<(Vec<&'static str>, Vec<&'static str>, Vec<&'static str>)> {
    guard("memory_fields", || {
        Ok((
            LAYOUT_FIELDS.to_vec(),
            OUTPUT_FIELDS.to_vec(),
            INVALID_REASONS.iter().map(|r| r.message()).collect(),
        ))
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(memory_param_counts, m)?)?;
    m.add_function(wrap_pyfunction!(memory_grid, m)?)?;
    m.add_function(wrap_pyfunction!(memory_fields, m)?)?;
    Ok(())
}

//! `tokenbatch.ModelSpec`: the core's model spec as a frozen Python class, built and
//! validated once; every estimate borrows it as it is.

use pyo3::exceptions::PyOverflowError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyString, PyTuple};
use tokenbatch_core::memory::{Field, ModelSpec, SPEC_FIELDS};

use crate::error::{guard, IntoPyResult, InvalidTypeError, TokenBatchOverflowError};

/// Shape of a decoder-only transformer (see `tokenbatch.ModelSpec` for the fields).
#[pyclass(
    frozen,
    eq,
    hash,
    subclass,
    module = "tokenbatch._core",
    name = "ModelSpec"
)]
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PyModelSpec {
    pub spec: ModelSpec,
    /// Whether `head_dim` was given; otherwise it follows `hidden_size / num_heads`, also
    /// through `replace`.
    head_dim_given: bool,
    name: String,
}

/// A count: an integer (not a bool), or a float holding a whole number, as configs write
/// sizes (`4096.0`).
fn count(value: &Bound<'_, PyAny>, name: &str) -> PyResult<i64> {
    if let Ok(float) = value.cast::<PyFloat>() {
        let number = float.value();
        // 2^63 itself does not fit; every float below it that is whole does.
        if number.is_finite() && number.fract() == 0.0 && number.abs() < 9.223_372_036_854_776e18 {
            return Ok(number as i64);
        }
        return Err(InvalidTypeError::new_err(format!(
            "{name} must be an integer, got {number:?} (not a whole number)"
        )));
    }
    if value.is_instance_of::<PyBool>() {
        return Err(InvalidTypeError::new_err(format!(
            "{name} must be an integer, got {value}"
        )));
    }
    value.extract::<i64>().map_err(|error| {
        if error.is_instance_of::<PyOverflowError>(value.py()) {
            TokenBatchOverflowError::new_err(format!(
                "{name}={value} does not fit in a signed 64-bit integer"
            ))
        } else {
            let kind = value
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default();
            InvalidTypeError::new_err(format!("{name} must be an integer, got {value} ({kind})"))
        }
    })
}

/// The field `name` of a Python value, converted as the core's field of that name is typed.
fn field(name: &str, value: &Bound<'_, PyAny>) -> PyResult<Field> {
    let refuse = |kind: &str| {
        let shown = value.repr().map(|r| r.to_string()).unwrap_or_default();
        InvalidTypeError::new_err(format!("{name} must be {kind}, got {shown}"))
    };
    Ok(match ModelSpec::default().get(name) {
        Some(Field::Count(_)) => Field::Count(count(value, name)?),
        Some(Field::Flag(_)) => Field::Flag(value.extract().map_err(|_| refuse("a bool"))?),
        Some(Field::Name(_)) => Field::Name(value.extract().map_err(|_| refuse("a string"))?),
        None => {
            return Err(InvalidTypeError::new_err(format!(
                "ModelSpec has no field '{name}'; fields: {}",
                SPEC_FIELDS.join(", ")
            )))
        }
    })
}

impl PyModelSpec {
    /// Every field as the constructor takes it (`head_dim` only where it was given) and
    /// the name.
    fn kwargs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let kwargs = PyDict::new(py);
        for name in SPEC_FIELDS {
            if name == "head_dim" && !self.head_dim_given {
                continue;
            }
            match self.spec.get(name) {
                Some(Field::Count(value)) => kwargs.set_item(name, value)?,
                Some(Field::Flag(value)) => kwargs.set_item(name, value)?,
                Some(Field::Name(value)) => kwargs.set_item(name, value)?,
                None => {}
            }
        }
        kwargs.set_item("name", &self.name)?;
        Ok(kwargs)
    }
}

#[pymethods]
impl PyModelSpec {
    #[new]
    #[pyo3(signature = (hidden_size, num_layers, num_heads, ffn_size, vocab_size, **fields))]
    fn new(
        hidden_size: &Bound<'_, PyAny>,
        num_layers: &Bound<'_, PyAny>,
        num_heads: &Bound<'_, PyAny>,
        ffn_size: &Bound<'_, PyAny>,
        vocab_size: &Bound<'_, PyAny>,
        fields: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let required = [hidden_size, num_layers, num_heads, ffn_size, vocab_size];
        let mut given = SPEC_FIELDS
            .iter()
            .zip(required)
            .map(|(name, value)| Ok((*name, field(name, value)?)))
            .collect::<PyResult<Vec<_>>>()?;
        let mut name = "custom".to_string();
        let mut head_dim_given = false;
        for (key, value) in fields.into_iter().flat_map(|fields| fields.iter()) {
            let key = key.cast_into::<PyString>()?.to_string();
            if key == "name" {
                name = value.extract().map_err(|_| {
                    InvalidTypeError::new_err(format!("name must be a string, got {value}"))
                })?;
                continue;
            }
            // `None` leaves the two derived counts to their defaults.
            if value.is_none() && (key == "head_dim" || key == "num_kv_heads") {
                continue;
            }
            let parsed = field(&key, &value)?;
            if let Some(&known) = SPEC_FIELDS.iter().find(|known| **known == key) {
                head_dim_given |= known == "head_dim";
                given.push((known, parsed));
            }
        }
        let spec = guard("ModelSpec", || {
            ModelSpec::from_fields(given).into_py_result()
        })?;
        Ok(PyModelSpec {
            spec,
            head_dim_given,
            name,
        })
    }

    /// A copy with some fields changed, validated again.
    #[pyo3(signature = (**changes))]
    fn replace<'py>(
        slf: &Bound<'py, Self>,
        changes: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let kwargs = slf.get().kwargs(slf.py())?;
        if let Some(changes) = changes {
            kwargs.update(changes.as_mapping())?;
        }
        slf.get_type().call((), Some(&kwargs))
    }

    /// Every field with its defaults resolved, and the name.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let kwargs = self.kwargs(py)?;
        kwargs.set_item("head_dim", self.spec.head_dim)?;
        Ok(kwargs)
    }

    /// What pickling and `copy` rebuild the spec from: the constructor's keywords.
    fn __getnewargs_ex__<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(Bound<'py, PyTuple>, Bound<'py, PyDict>)> {
        Ok((PyTuple::empty(py), self.kwargs(py)?))
    }

    /// The fields that differ from their defaults, as the constructor takes them.
    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        let this = slf.get();
        let defaults = ModelSpec {
            num_kv_heads: this.spec.num_heads,
            ..ModelSpec::default()
        };
        let mut shown = vec![format!("name={}", Field::Name(this.name.clone()))];
        for (index, name) in SPEC_FIELDS.iter().enumerate() {
            let value = this.spec.get(name);
            let show = match *name {
                "head_dim" => this.head_dim_given,
                _ => index < 5 || value != defaults.get(name),
            };
            if let (true, Some(value)) = (show, value) {
                shown.push(format!("{name}={value}"));
            }
        }
        let class = slf.get_type().name()?;
        Ok(format!("{class}({})", shown.join(", ")))
    }

    /// The model's name (a preset's, a config's directory, or `"custom"`).
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// Width of the residual stream.
    #[getter]
    fn hidden_size(&self) -> u64 {
        self.spec.hidden_size
    }

    /// Transformer layers.
    #[getter]
    fn num_layers(&self) -> u64 {
        self.spec.num_layers
    }

    /// Attention (query) heads.
    #[getter]
    fn num_heads(&self) -> u64 {
        self.spec.num_heads
    }

    /// Inner size of a dense layer's MLP.
    #[getter]
    fn ffn_size(&self) -> u64 {
        self.spec.ffn_size
    }

    /// Vocabulary size (rows of the embedding).
    #[getter]
    fn vocab_size(&self) -> u64 {
        self.spec.vocab_size
    }

    /// Key/value heads as given (`num_heads` when not given).
    #[getter]
    fn num_kv_heads(&self) -> u64 {
        self.spec.num_kv_heads
    }

    /// The per-head size given, or `None` when it is `hidden_size // num_heads`.
    #[getter]
    fn head_dim(&self) -> Option<u64> {
        self.head_dim_given.then_some(self.spec.head_dim)
    }

    /// The MLP block: `"swiglu"` (three matrices) or `"gelu"` (two).
    #[getter]
    fn ffn_type(&self) -> &'static str {
        self.spec.ffn_type.name()
    }

    /// Whether the output projection reuses the input embedding.
    #[getter]
    fn tied_embeddings(&self) -> bool {
        self.spec.tied_embeddings
    }

    /// Normalization layers: `"rmsnorm"` or `"layernorm"`.
    #[getter]
    fn norm(&self) -> &'static str {
        self.spec.norm.name()
    }

    /// Biases on the query, key and value projections (Qwen2).
    #[getter]
    fn qkv_bias(&self) -> bool {
        self.spec.qkv_bias
    }

    /// Biases on every linear layer of the blocks (GPT-2/3 style).
    #[getter]
    fn linear_bias(&self) -> bool {
        self.spec.linear_bias
    }

    /// Learned absolute position embeddings (0 for rotary models).
    #[getter]
    fn learned_positions(&self) -> u64 {
        self.spec.learned_positions
    }

    /// Routed experts per MoE layer; 0 for a dense model.
    #[getter]
    fn num_experts(&self) -> u64 {
        self.spec.num_experts
    }

    /// Routed experts each token is sent to.
    #[getter]
    fn top_k(&self) -> u64 {
        self.spec.top_k
    }

    /// Shared experts every token goes through, per MoE layer.
    #[getter]
    fn num_shared_experts(&self) -> u64 {
        self.spec.num_shared_experts
    }

    /// Inner size of one expert.
    #[getter]
    fn moe_ffn_size(&self) -> u64 {
        self.spec.moe_ffn_size
    }

    /// Leading layers that keep a dense MLP (DeepSeek-V3: 3).
    #[getter]
    fn first_dense_layers(&self) -> u64 {
        self.spec.first_dense_layers
    }

    /// Sigmoid routing with a per-expert correction bias (a buffer, not a parameter).
    #[getter]
    fn router_bias(&self) -> bool {
        self.spec.router_bias
    }

    /// Group-limited routing: experts in this many groups (0 or 1: no groups).
    #[getter]
    fn router_groups(&self) -> u64 {
        self.spec.router_groups
    }

    /// Groups a token's experts may come from.
    #[getter]
    fn router_group_top_k(&self) -> u64 {
        self.spec.router_group_top_k
    }

    /// Multi-head latent attention: rank of the query projection (0: full rank).
    #[getter]
    fn q_lora_rank(&self) -> u64 {
        self.spec.q_lora_rank
    }

    /// Multi-head latent attention: rank of the key/value projection (0: no MLA).
    #[getter]
    fn kv_lora_rank(&self) -> u64 {
        self.spec.kv_lora_rank
    }

    /// Multi-head latent attention: per-head query/key size without rotary positions.
    #[getter]
    fn qk_nope_head_dim(&self) -> u64 {
        self.spec.qk_nope_head_dim
    }

    /// Multi-head latent attention: per-head query/key size with rotary positions.
    #[getter]
    fn qk_rope_head_dim(&self) -> u64 {
        self.spec.qk_rope_head_dim
    }

    /// Multi-head latent attention: per-head value size.
    #[getter]
    fn v_head_dim(&self) -> u64 {
        self.spec.v_head_dim
    }

    /// Multi-token-prediction modules, on the last pipeline stage.
    #[getter]
    fn mtp_layers(&self) -> u64 {
        self.spec.mtp_layers
    }

    /// Whose kernels run the model: `"hf"` or `"fused"`.
    #[getter]
    fn implementation(&self) -> &'static str {
        self.spec.implementation.name()
    }

    /// Megatron-Core's token dispatcher: `"alltoall"` or `"allgather"`.
    #[getter]
    fn moe_dispatcher(&self) -> &'static str {
        self.spec.moe_dispatcher.name()
    }

    /// Key/value heads (`num_heads` unless grouped-query attention).
    #[getter]
    fn kv_heads(&self) -> u64 {
        self.spec.num_kv_heads
    }

    /// Per-head size of queries and keys for ordinary attention.
    #[getter]
    fn head_size(&self) -> u64 {
        self.spec.head_dim
    }

    /// Whether the model has routed experts.
    #[getter]
    fn is_moe(&self) -> bool {
        self.spec.is_moe()
    }

    /// Whether attention is multi-head latent attention.
    #[getter]
    fn is_mla(&self) -> bool {
        self.spec.is_mla()
    }

    /// Exact number of parameters (tied embeddings counted once).
    fn num_params(&self) -> u64 {
        // Validation bounds the count by 2^53, where floats are exact.
        self.spec.total_params() as u64
    }

    /// Parameters a token goes through: all but the routed experts it is not sent to.
    fn num_active_params(&self) -> u64 {
        self.spec.active_params() as u64
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyModelSpec>()
}

//! Transformer shapes and exact parameter counts.
//!
//! Counts follow the module layout of the Hugging Face reference implementations
//! (`LlamaForCausalLM`, `MixtralForCausalLM`, `Qwen2ForCausalLM`, `DeepseekV3ForCausalLM`)
//! and GPT-3 (Brown et al. 2020, learned positions, biases everywhere), so `num_params`
//! matches `sum(p.numel() for p in model.parameters())` of those models.

use std::str::FromStr;

use crate::error::{Error, Result};

/// The MLP block of a layer (dense layers, experts and shared experts alike).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum FfnType {
    /// `down(silu(gate(x)) * up(x))`: three matrices.
    #[default]
    SwiGlu,
    /// `fc2(gelu(fc1(x)))`: two matrices.
    Gelu,
}

impl FfnType {
    /// The name `ffn_type` takes for this choice.
    pub fn name(self) -> &'static str {
        match self {
            FfnType::SwiGlu => "swiglu",
            FfnType::Gelu => "gelu",
        }
    }
}

impl FromStr for FfnType {
    type Err = Error;

    /// Parse `"swiglu"` or `"gelu"`.
    fn from_str(name: &str) -> Result<Self> {
        match name {
            "swiglu" => Ok(FfnType::SwiGlu),
            "gelu" => Ok(FfnType::Gelu),
            other => Err(Error::invalid(format!(
                "ffn_type must be 'swiglu' or 'gelu', got {other:?}"
            ))),
        }
    }
}

/// Normalization layers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum NormType {
    /// One weight vector; saves the input and one fp32 statistic per token.
    #[default]
    RmsNorm,
    /// Weight and bias; saves the input and two fp32 statistics per token.
    LayerNorm,
}

impl NormType {
    /// The name `norm` takes for this choice.
    pub fn name(self) -> &'static str {
        match self {
            NormType::RmsNorm => "rmsnorm",
            NormType::LayerNorm => "layernorm",
        }
    }
}

impl FromStr for NormType {
    type Err = Error;

    /// Parse `"rmsnorm"` or `"layernorm"`.
    fn from_str(name: &str) -> Result<Self> {
        match name {
            "rmsnorm" => Ok(NormType::RmsNorm),
            "layernorm" => Ok(NormType::LayerNorm),
            other => Err(Error::invalid(format!(
                "norm must be 'rmsnorm' or 'layernorm', got {other:?}"
            ))),
        }
    }
}

/// Whose kernels run the model: what is saved for backward differs between code bases
/// (see [`crate::memory::activations`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Implementation {
    /// Hugging Face `transformers`' PyTorch modules (norms that upcast to fp32, an fp32
    /// sigmoid router, grouped-GEMM experts after a sort by expert).
    #[default]
    Hf,
    /// Fused kernels as Megatron-Core with Transformer Engine runs them (norms that keep
    /// only their input and fp32 statistics).
    Fused,
}

impl Implementation {
    /// The name `implementation` takes for this choice.
    pub fn name(self) -> &'static str {
        match self {
            Implementation::Hf => "hf",
            Implementation::Fused => "fused",
        }
    }
}

impl FromStr for Implementation {
    type Err = Error;

    /// Parse `"hf"` or `"fused"`.
    fn from_str(name: &str) -> Result<Self> {
        match name {
            "hf" => Ok(Implementation::Hf),
            "fused" => Ok(Implementation::Fused),
            other => Err(Error::invalid(format!(
                "implementation must be 'hf' or 'fused', got {other:?}"
            ))),
        }
    }
}

/// How Megatron-Core's MoE layers send routed copies to the experts' ranks (its
/// `moe_token_dispatcher_type`); only fused kernels (`Implementation::Fused`) have one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum MoeDispatcher {
    /// Each rank sorts its own tokens' copies and exchanges them with the expert-parallel
    /// ranks (`alltoall`; DeepSeek-V3-style runs use it).
    #[default]
    AllToAll,
    /// Each rank gathers every token of its tensor- and expert-parallel group and keeps the
    /// copies routed to its experts (`allgather`, Megatron-Core's default): under sequence
    /// parallelism its sort index and routing map cover the whole group's tokens.
    AllGather,
}

impl MoeDispatcher {
    /// The name `moe_dispatcher` takes for this choice.
    pub fn name(self) -> &'static str {
        match self {
            MoeDispatcher::AllToAll => "alltoall",
            MoeDispatcher::AllGather => "allgather",
        }
    }
}

impl FromStr for MoeDispatcher {
    type Err = Error;

    /// Parse `"alltoall"` or `"allgather"`.
    fn from_str(name: &str) -> Result<Self> {
        match name {
            "alltoall" => Ok(MoeDispatcher::AllToAll),
            "allgather" => Ok(MoeDispatcher::AllGather),
            other => Err(Error::invalid(format!(
                "moe_dispatcher must be 'alltoall' or 'allgather', got {other:?}"
            ))),
        }
    }
}

/// Shape of a decoder-only transformer. Sizes are counts of elements, not bytes.
///
/// Build one from named fields with [`ModelSpec::from_fields`](crate::memory::spec_fields),
/// which checks each value and the whole shape once.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ModelSpec {
    pub hidden_size: u64,
    pub num_layers: u64,
    pub num_heads: u64,
    pub num_kv_heads: u64,
    /// Per-head size of queries and keys (and values, unless MLA sets `v_head_dim`).
    pub head_dim: u64,
    pub ffn_size: u64,
    pub ffn_type: FfnType,
    pub vocab_size: u64,
    pub tied_embeddings: bool,
    pub norm: NormType,
    /// Biases on the query, key and value projections (Qwen2).
    pub qkv_bias: bool,
    /// Biases on every linear layer of the blocks (GPT-2/3 style).
    pub linear_bias: bool,
    /// Learned absolute position embeddings (0 for rotary models).
    pub learned_positions: u64,
    /// Routed experts per MoE layer; 0 for a dense model.
    pub num_experts: u64,
    pub top_k: u64,
    pub num_shared_experts: u64,
    pub moe_ffn_size: u64,
    /// Leading layers that keep a dense MLP (DeepSeek-V3: 3).
    pub first_dense_layers: u64,
    /// Sigmoid routing with a per-expert correction bias (DeepSeek-V3's
    /// `e_score_correction_bias`). The bias is a buffer, updated by the load-balancing rule
    /// rather than by gradients, so it is not a parameter.
    pub router_bias: bool,
    /// Group-limited routing (DeepSeek-V3's `n_group`): experts in this many groups; 1 or
    /// 0 for no groups.
    pub router_groups: u64,
    /// Groups a token's experts may come from (DeepSeek-V3's `topk_group`).
    pub router_group_top_k: u64,
    /// Multi-head latent attention (DeepSeek): 0 means a full-rank query projection.
    pub q_lora_rank: u64,
    /// Multi-head latent attention: 0 means ordinary (GQA) attention.
    pub kv_lora_rank: u64,
    pub qk_nope_head_dim: u64,
    pub qk_rope_head_dim: u64,
    pub v_head_dim: u64,
    /// Multi-token-prediction modules (DeepSeek-V3: 1; Megatron's `--mtp-num-layers`), each
    /// a projection of `[norm(embedding); norm(hidden)]` (2h x h), a transformer layer like
    /// the last one and a final norm, sharing the embedding and output layer.
    pub mtp_layers: u64,
    /// Whose kernels run the model.
    pub implementation: Implementation,
    /// Megatron-Core's token dispatcher (fused kernels only).
    pub moe_dispatcher: MoeDispatcher,
}

/// Parameters of one layer, split by how model parallelism shards them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LayerParams {
    /// Replicated on every tensor-parallel rank (norms, router, MLA down-projections).
    pub replicated: f64,
    /// Split across tensor-parallel ranks (attention heads, MLP columns, shared experts).
    pub tp_split: f64,
    /// Key/value projections of GQA attention, split by heads (replicated when tp > kv heads).
    pub kv: f64,
    /// Routed experts: split across expert-parallel ranks (and tensor-parallel ranks).
    pub experts: f64,
}

impl LayerParams {
    /// Parameters held by one rank of a `tp` x `ep` group.
    pub fn per_rank(&self, tp: f64, ep: f64, kv_per_rank_fraction: f64) -> (f64, f64) {
        let dense = self.replicated + self.tp_split / tp + self.kv * kv_per_rank_fraction;
        (dense, self.experts / (ep * tp))
    }

    /// All parameters of the layer.
    pub fn total(&self) -> f64 {
        self.replicated + self.tp_split + self.kv + self.experts
    }
}

impl ModelSpec {
    /// Check the shape; errors name the offending field.
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("hidden_size", self.hidden_size),
            ("num_layers", self.num_layers),
            ("num_heads", self.num_heads),
            ("num_kv_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab_size),
        ];
        for (name, value) in positive {
            if value == 0 {
                return Err(Error::invalid(format!("{name} must be positive, got 0")));
            }
        }
        if self.num_layers > 4095 {
            return Err(Error::invalid(format!(
                "num_layers={} is more than the 4,095 layers a pipeline split handles",
                self.num_layers
            )));
        }
        if self.num_heads % self.num_kv_heads != 0 {
            return Err(Error::invalid(format!(
                "num_kv_heads={} must divide num_heads={}",
                self.num_kv_heads, self.num_heads
            )));
        }
        if !self.is_moe()
            && (self.top_k > 0 || self.moe_ffn_size > 0 || self.num_shared_experts > 0)
        {
            return Err(Error::invalid(
                "top_k, moe_ffn_size and num_shared_experts need num_experts",
            ));
        }
        let has_dense = !self.is_moe() || self.first_dense_layers > 0;
        if has_dense && self.ffn_size == 0 {
            return Err(Error::invalid("ffn_size must be positive"));
        }
        if self.is_moe() {
            if self.top_k == 0 || self.top_k > self.num_experts {
                return Err(Error::invalid(format!(
                    "top_k={} must be in [1, num_experts={}]",
                    self.top_k, self.num_experts
                )));
            }
            if self.moe_ffn_size == 0 {
                return Err(Error::invalid(
                    "moe_ffn_size must be positive for an MoE model",
                ));
            }
            if self.router_groups > 1
                && (self.num_experts % self.router_groups != 0
                    || self.router_group_top_k == 0
                    || self.router_group_top_k > self.router_groups)
            {
                return Err(Error::invalid(format!(
                    "router_groups={} must divide num_experts={} and router_group_top_k={} \
                     be in [1, router_groups]",
                    self.router_groups, self.num_experts, self.router_group_top_k
                )));
            }
            if self.first_dense_layers > self.num_layers {
                return Err(Error::invalid(format!(
                    "first_dense_layers={} exceeds num_layers={}",
                    self.first_dense_layers, self.num_layers
                )));
            }
        }
        if self.moe_dispatcher == MoeDispatcher::AllGather
            && self.implementation != Implementation::Fused
        {
            return Err(Error::invalid(
                "moe_dispatcher='allgather' is Megatron-Core's all-gather token dispatcher: \
                 it needs implementation='fused'",
            ));
        }
        if self.is_mla() && (self.qk_head_dim() == 0 || self.v_head_dim == 0) {
            return Err(Error::invalid(
                "MLA attention needs qk_nope_head_dim + qk_rope_head_dim > 0 and v_head_dim > 0",
            ));
        }
        if self.total_params() > 2f64.powi(53) {
            return Err(Error::overflow("the model has more than 2^53 parameters"));
        }
        Ok(())
    }

    /// Whether the model has routed experts.
    pub fn is_moe(&self) -> bool {
        self.num_experts > 0
    }

    /// Whether attention is multi-head latent attention.
    pub fn is_mla(&self) -> bool {
        self.kv_lora_rank > 0
    }

    /// Number of layers with routed experts.
    pub fn moe_layers(&self) -> u64 {
        if self.is_moe() {
            self.num_layers - self.first_dense_layers.min(self.num_layers)
        } else {
            0
        }
    }

    /// Per-head size of queries and keys.
    pub fn qk_head_dim(&self) -> u64 {
        if self.is_mla() {
            // Saturating: an absurd size must reach the parameter-count check, not wrap.
            self.qk_nope_head_dim.saturating_add(self.qk_rope_head_dim)
        } else {
            self.head_dim
        }
    }

    /// Per-head size of values (and of the attention output).
    pub fn v_dim(&self) -> u64 {
        if self.is_mla() {
            self.v_head_dim
        } else {
            self.head_dim
        }
    }

    fn norm_params(&self, width: u64) -> f64 {
        match self.norm {
            NormType::RmsNorm => width as f64,
            NormType::LayerNorm => 2.0 * width as f64,
        }
    }

    /// Parameters of an MLP of inner width `ffn` (weights and, with `linear_bias`, biases).
    pub fn mlp_params(&self, ffn: u64) -> f64 {
        let (h, f) = (self.hidden_size as f64, ffn as f64);
        let bias = self.linear_bias as u64 as f64;
        match self.ffn_type {
            FfnType::SwiGlu => 3.0 * h * f + bias * (2.0 * f + h),
            FfnType::Gelu => 2.0 * h * f + bias * (f + h),
        }
    }

    fn attention_params(&self) -> LayerParams {
        let h = self.hidden_size as f64;
        let a = self.num_heads as f64;
        if self.is_mla() {
            let qk = self.qk_head_dim() as f64;
            let v = self.v_head_dim as f64;
            let kv_rank = self.kv_lora_rank as f64;
            let rope = self.qk_rope_head_dim as f64;
            let nope = self.qk_nope_head_dim as f64;
            let (q_down, q_up) = if self.q_lora_rank > 0 {
                let r = self.q_lora_rank as f64;
                (h * r + self.norm_params(self.q_lora_rank), r * a * qk)
            } else {
                (0.0, h * a * qk)
            };
            let kv_down = h * (kv_rank + rope) + self.norm_params(self.kv_lora_rank);
            let kv_up = kv_rank * a * (nope + v);
            let out = a * v * h;
            LayerParams {
                replicated: q_down + kv_down,
                tp_split: q_up + kv_up + out,
                kv: 0.0,
                experts: 0.0,
            }
        } else {
            let d = self.head_dim as f64;
            let k = self.num_kv_heads as f64;
            let qkv_bias = (self.qkv_bias || self.linear_bias) as u64 as f64;
            let out_bias = self.linear_bias as u64 as f64;
            LayerParams {
                replicated: 0.0,
                tp_split: h * a * d + qkv_bias * a * d + a * d * h + out_bias * h,
                kv: 2.0 * (h * k * d + qkv_bias * k * d),
                experts: 0.0,
            }
        }
    }

    /// Parameters of layer `index` (0-based). `active` counts only the `top_k` routed experts.
    pub fn layer_params(&self, index: u64, active: bool) -> LayerParams {
        let mut params = self.attention_params();
        params.replicated += 2.0 * self.norm_params(self.hidden_size);
        if self.is_moe() && index >= self.first_dense_layers {
            let e = self.num_experts as f64;
            let h = self.hidden_size as f64;
            params.replicated += h * e;
            params.tp_split += self.num_shared_experts as f64 * self.mlp_params(self.moe_ffn_size);
            let routed = if active { self.top_k as f64 } else { e };
            params.experts += routed * self.mlp_params(self.moe_ffn_size);
        } else {
            params.tp_split += self.mlp_params(self.ffn_size);
        }
        params
    }

    /// Input embedding (vocabulary-parallel under TP) and learned positions (replicated).
    pub fn embedding_params(&self) -> (f64, f64) {
        let h = self.hidden_size as f64;
        (
            self.vocab_size as f64 * h,
            self.learned_positions as f64 * h,
        )
    }

    /// Output head parameters on the last stage: (final norm, output projection).
    /// A tied projection reuses the embedding, except that the last pipeline stage keeps a
    /// copy when `pp > 1` (Megatron's convention); `separate_copy` asks for that copy.
    pub fn head_params(&self, separate_copy: bool) -> (f64, f64) {
        let projection = if !self.tied_embeddings || separate_copy {
            self.vocab_size as f64 * self.hidden_size as f64
        } else {
            0.0
        };
        (self.norm_params(self.hidden_size), projection)
    }

    /// Parameters of one multi-token-prediction module besides its transformer layer:
    /// (replicated norms, tensor-parallel projection).
    pub fn mtp_extra_params(&self) -> (f64, f64) {
        let h = self.hidden_size as f64;
        (3.0 * self.norm_params(self.hidden_size), 2.0 * h * h)
    }

    /// Parameters of one multi-token-prediction module's transformer layer (like the last).
    pub fn mtp_layer_params(&self, active: bool) -> LayerParams {
        self.layer_params(self.num_layers - 1, active)
    }

    fn count(&self, active: bool) -> f64 {
        let (embedding, positions) = self.embedding_params();
        let (final_norm, projection) = self.head_params(false);
        let dense_layers = if self.is_moe() {
            self.first_dense_layers.min(self.num_layers)
        } else {
            self.num_layers
        };
        let mut total = embedding + positions + final_norm + projection;
        total += dense_layers as f64 * self.layer_params(0, active).total();
        if self.is_moe() {
            let moe_index = self.first_dense_layers;
            total += self.moe_layers() as f64 * self.layer_params(moe_index, active).total();
        }
        let (norms, projection) = self.mtp_extra_params();
        total
            + self.mtp_layers as f64 * (norms + projection + self.mtp_layer_params(active).total())
    }

    /// Every parameter of the model (embeddings included, tied ones once; multi-token
    /// prediction modules included, their embedding and output layer being the model's).
    pub fn total_params(&self) -> f64 {
        self.count(false)
    }

    /// Parameters used per token: all but the routed experts a token is not sent to.
    pub fn active_params(&self) -> f64 {
        self.count(true)
    }
}

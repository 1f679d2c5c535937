//! Closed-form per-GPU memory of one training configuration.
//!
//! # Model states (bytes per parameter held by a GPU)
//! `param_bytes` weights, `grad_bytes + grad_buffer_bytes` gradients and
//! `master_bytes + optimizer_state_bytes` optimizer state; mixed-precision AdamW is
//! 2 + 2 + (4 + 4 + 4) = 16 bytes (Rajbhandari et al. 2020, "ZeRO", section 3.1;
//! Ultra-Scale Playbook, "Memory usage in Transformers"). fp32 master weights are optimizer
//! state, so ZeRO-1 shards them with the moments. ZeRO stage `z` divides optimizer state
//! (z >= 1), gradients (z >= 2) and weights (z >= 3) by the sharding group: `dp * cp` for
//! dense weights (Megatron shards the distributed optimizer over data and context
//! parallel ranks) and `dp * cp / ep` for routed experts.
//!
//! Tensor parallelism (Shoeybi et al. 2019) splits attention heads, MLP columns and the
//! vocabulary; norms, the MoE router and MLA's down-projections stay replicated; key/value
//! heads are replicated when `tp` exceeds their number. Expert parallelism splits routed
//! experts over `ep` ranks, and experts are also split over `tp` (Megatron-Core's default
//! expert tensor parallelism). Pipeline parallelism gives each stage `num_layers / pp`
//! layers; the first stage also holds the embedding, the last the final norm and output
//! projection (a copy of it when embeddings are tied and `pp > 1`).
//!
//! # Activations
//! Bytes saved for backward per token of a micro-batch (`micro_batch * seq_len / cp` tokens
//! per GPU), per layer, times the layers and micro-batches in flight on the stage:
//! 1F1B keeps `min(m, pp - i)` micro-batches on stage `i` (Narayanan et al. 2021); the
//! interleaved schedule with `vpp` chunks keeps `min(m * vpp, 2 (pp - i - 1) + (vpp - 1) pp + 1)`
//! chunks, which on stage 0 is Megatron's `pp * (1 + (pp - 1) / (pp * vpp))` stage
//! equivalents. The reported breakdown is the busiest stage (largest total).
//!
//! `korthikanti`: Korthikanti et al. 2022, table 2, per layer
//! `sbh (10 + 24/t + 5as/(ht))` without sequence parallelism, `sbh/t (34 + 5as/h)` with it,
//! the `5as/h` term removed by selective recomputation and `2sbh` (`/t` with sequence
//! parallelism) kept by full recomputation, plus the `sbh` dropout mask of the input
//! embedding per micro-batch in flight (their section 4.3). It assumes GPT blocks (4h GeLU
//! MLP, LayerNorm, dropout, 16-bit activations); applied to other shapes it reproduces
//! published estimates such as the Ultra-Scale Playbook's, not the real allocation.
//!
//! `modern`: the tensors a pre-norm block keeps with fused norm kernels (input plus fp32
//! statistics), flash attention (q, k, v, output and the fp32 log-sum-exp; GQA keys and
//! values unexpanded), no dropout, an element-wise SwiGLU (gate, up, silu(gate) and
//! their product; 3 tensors when fused), top-k routing (router probabilities in fp32,
//! top-k indices and weights; per chosen expert the gathered input, the expert output
//! and the weighted output kept by the scatter-add) and fp32 logits for the loss. Selective recomputation recomputes the attention core and the
//! MLP activation function (Megatron-Core `recompute_modules = core_attn, mlp activation`);
//! full recomputation keeps each layer's input and needs one layer's activations while it
//! recomputes (Chen et al. 2016).

use crate::memory::layout::{ActivationModel, Invalid, Layout, Recompute};
use crate::memory::spec::{FfnType, LayerParams, ModelSpec, NormType};

/// Names of the output columns, in [`Breakdown::to_values`] order.
pub const OUTPUT_FIELDS: [&str; 14] = [
    "params",
    "grads",
    "optimizer",
    "activations",
    "overhead",
    "total",
    "act_attention",
    "act_mlp",
    "act_norm",
    "act_embedding",
    "act_logits",
    "act_checkpoints",
    "act_working",
    "stage",
];

/// Number of output columns.
pub const N_OUTPUT_FIELDS: usize = OUTPUT_FIELDS.len();

/// Per-GPU bytes of the busiest pipeline stage.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Breakdown {
    pub params: f64,
    pub grads: f64,
    pub optimizer: f64,
    pub activations: f64,
    pub overhead: f64,
    pub total: f64,
    /// Attention blocks of the layers in flight.
    pub act_attention: f64,
    /// MLP / MoE blocks of the layers in flight.
    pub act_mlp: f64,
    /// Norm inputs and statistics (the residual stream) of the layers in flight.
    pub act_norm: f64,
    /// Token ids (modern) or the embedding dropout mask (korthikanti) on the first stage.
    pub act_embedding: f64,
    /// Final norm, output projection input and logits on the last stage.
    pub act_logits: f64,
    /// Layer inputs kept by full recomputation.
    pub act_checkpoints: f64,
    /// One layer's activations rebuilt during backward under full recomputation.
    pub act_working: f64,
    /// Index of the pipeline stage reported.
    pub stage: f64,
}

impl Breakdown {
    /// Values in [`OUTPUT_FIELDS`] order.
    pub fn to_values(&self) -> [f64; N_OUTPUT_FIELDS] {
        [
            self.params,
            self.grads,
            self.optimizer,
            self.activations,
            self.overhead,
            self.total,
            self.act_attention,
            self.act_mlp,
            self.act_norm,
            self.act_embedding,
            self.act_logits,
            self.act_checkpoints,
            self.act_working,
            self.stage,
        ]
    }
}

/// Quantities derived once per model, shared by every configuration of a grid.
#[derive(Debug, Clone)]
pub struct Prepared {
    spec: ModelSpec,
    dense_layer: LayerParams,
    moe_layer: LayerParams,
    embedding: f64,
    positions: f64,
    final_norm: f64,
    norm_stat_bytes: f64,
}

impl Prepared {
    /// Precompute per-layer parameter counts. The spec must have been validated.
    pub fn new(spec: &ModelSpec) -> Self {
        let (embedding, positions) = spec.embedding_params();
        let (final_norm, _) = spec.head_params(false);
        Prepared {
            spec: spec.clone(),
            dense_layer: spec.layer_params(0, false),
            moe_layer: spec.layer_params(spec.first_dense_layers, false),
            embedding,
            positions,
            final_norm,
            norm_stat_bytes: match spec.norm {
                NormType::RmsNorm => 4.0,
                NormType::LayerNorm => 8.0,
            },
        }
    }

    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }
}

/// `x.ceil()` for the byte counts here (|x| < 2^63). Portable x86-64 has no rounding
/// instruction, so `f64::ceil` is a libm call, a tenth of the grid's time; the integer
/// round trip compiles to two conversions.
#[inline]
fn ceil(x: f64) -> f64 {
    if x.abs() < 9.0e18 {
        let truncated = x as i64 as f64;
        if truncated < x {
            truncated + 1.0
        } else {
            truncated
        }
    } else {
        x.ceil()
    }
}

/// Whether a finite `x` is a whole number (as [`ceil`], without a libm call).
#[inline]
fn is_whole(x: f64) -> bool {
    if x.abs() < 9.0e18 {
        x as i64 as f64 == x
    } else {
        x.fract() == 0.0
    }
}

fn is_pos_int(x: f64) -> bool {
    x.is_finite() && x >= 1.0 && is_whole(x)
}

fn is_flag(x: f64) -> bool {
    x == 0.0 || x == 1.0
}

/// Whether `d` (a validated positive whole number) divides `n`. Integer arithmetic,
/// because float remainders are several times slower in a grid's inner loop, and a mask
/// for the powers of two that most parallel degrees are, because a division is still
/// tens of cycles and a cell checks several.
#[inline]
fn divides(d: f64, n: u64) -> bool {
    let d = d as u64;
    if d.is_power_of_two() {
        n & (d - 1) == 0
    } else {
        n % d == 0
    }
}

/// Check a configuration against the model; the first problem found is returned (fields
/// in [`LAYOUT_FIELDS`](crate::memory::LAYOUT_FIELDS) order, then how they fit the model).
pub fn validate(spec: &ModelSpec, l: &Layout) -> Result<(), Invalid> {
    for (field, &value) in l.to_values().iter().enumerate() {
        check_field(field, value)?;
    }
    validate_fit(spec, l)
}

/// Check the value of field `field` (an index into
/// [`LAYOUT_FIELDS`](crate::memory::LAYOUT_FIELDS)) on its own.
///
/// A grid checks each distinct value of an input once with this, rather than every field
/// of every cell.
pub fn check_field(field: usize, x: f64) -> Result<(), Invalid> {
    let (ok, reason) = match field {
        0 => (is_pos_int(x), Invalid::SeqLen),
        1 => (is_pos_int(x), Invalid::MicroBatch),
        2 => (is_pos_int(x), Invalid::Dp),
        3 => (is_pos_int(x), Invalid::Tp),
        4 => (is_pos_int(x), Invalid::Pp),
        5 => (is_pos_int(x), Invalid::Cp),
        6 => (is_pos_int(x), Invalid::Ep),
        7 => (is_pos_int(x), Invalid::Vpp),
        8 => (
            x.is_finite() && is_whole(x) && (0.0..=3.0).contains(&x),
            Invalid::Zero,
        ),
        9 => (is_flag(x), Invalid::SequenceParallel),
        10 => (x == 0.0 || x == 1.0 || x == 2.0, Invalid::Recompute),
        11 => (
            x.is_finite() && x >= 0.0 && is_whole(x),
            Invalid::GradAccumSteps,
        ),
        19 => (is_flag(x), Invalid::ActivationModel),
        20 => (is_flag(x), Invalid::Attention),
        21 => (is_flag(x), Invalid::FusedSwiglu),
        // 12..=18 and 22: byte counts.
        _ => (x.is_finite() && x >= 0.0, Invalid::Bytes),
    };
    if ok {
        Ok(())
    } else {
        Err(reason)
    }
}

/// Check how a configuration whose fields each passed [`check_field`] fits the model.
fn validate_fit(spec: &ModelSpec, l: &Layout) -> Result<(), Invalid> {
    if !divides(l.tp, spec.num_heads) {
        return Err(Invalid::TpHeads);
    }
    if !spec.is_mla() && !divides(l.tp, spec.num_kv_heads) && (l.tp as u64) % spec.num_kv_heads != 0
    {
        return Err(Invalid::TpKvHeads);
    }
    let has_dense = !spec.is_moe() || spec.first_dense_layers > 0;
    if (has_dense && !divides(l.tp, spec.ffn_size))
        || (spec.is_moe() && !divides(l.tp, spec.moe_ffn_size))
    {
        return Err(Invalid::TpFfn);
    }
    if !divides(l.pp * l.vpp, spec.num_layers) {
        return Err(Invalid::PpLayers);
    }
    if spec.is_moe() {
        if !divides(l.ep, spec.num_experts) {
            return Err(Invalid::EpExperts);
        }
    } else if l.ep != 1.0 {
        return Err(Invalid::EpDense);
    }
    if !divides(l.ep, (l.dp * l.cp) as u64) {
        return Err(Invalid::EpDpCp);
    }
    if !divides(l.cp, l.seq_len as u64) {
        return Err(Invalid::CpSeqLen);
    }
    Ok(())
}

/// Activation bytes per local token of one layer, by block.
#[derive(Debug, Clone, Copy, Default)]
struct LayerActs {
    attention: f64,
    mlp: f64,
    norm: f64,
}

impl LayerActs {
    fn total(&self) -> f64 {
        self.attention + self.mlp + self.norm
    }
}

/// Per-configuration constants of the activation formulas.
struct ActCtx {
    e: f64,
    t: f64,
    /// Divisor of tensors on the residual stream: `tp` with sequence parallelism, else 1.
    rep: f64,
    kv_per_rank: f64,
    key_len: f64,
    eager: bool,
    fused: bool,
}

impl Prepared {
    fn mlp_inner(&self, ffn: f64, c: &ActCtx, selective: bool) -> f64 {
        let tensors = match (self.spec.ffn_type, selective, c.fused) {
            (FfnType::SwiGlu, true, _) => 2.0,
            (FfnType::SwiGlu, false, true) => 3.0,
            (FfnType::SwiGlu, false, false) => 4.0,
            (FfnType::Gelu, true, _) => 1.0,
            (FfnType::Gelu, false, _) => 2.0,
        };
        tensors * c.e * ffn / c.t
    }

    fn modern_layer(&self, c: &ActCtx, moe: bool, selective: bool) -> LayerActs {
        let s = &self.spec;
        let e = c.e;
        let h_rep = e * s.hidden_size as f64 / c.rep;
        let a = s.num_heads as f64 / c.t;
        let dq = s.qk_head_dim() as f64;
        let dv = s.v_dim() as f64;
        let core = if selective {
            0.0
        } else if c.eager {
            e * a * c.key_len
        } else {
            4.0 * a
        };
        let mut attention = h_rep + core + e * a * (dq + dv);
        if s.is_mla() {
            let stat = 4.0 / c.rep;
            let q_path = if s.q_lora_rank > 0 {
                2.0 * e * s.q_lora_rank as f64 / c.rep + stat
            } else {
                0.0
            };
            let kv_path = 2.0 * e * s.kv_lora_rank as f64 / c.rep
                + stat
                + e * s.qk_rope_head_dim as f64 / c.rep;
            attention += q_path + kv_path + e * a * (dq + dv);
        } else {
            attention += e * c.kv_per_rank * (dq + dv);
        }
        let norm = 2.0 * (h_rep + self.norm_stat_bytes / c.rep);
        let mlp = if moe {
            let k = s.top_k as f64;
            let routed = k * (3.0 * h_rep + self.mlp_inner(s.moe_ffn_size as f64, c, selective));
            // In f64, as the parameter counts are: the u64 product can overflow.
            let shared_width = s.num_shared_experts as f64 * s.moe_ffn_size as f64;
            let shared = self.mlp_inner(shared_width, c, selective);
            let router = (4.0 * s.num_experts as f64 + 32.0 * k) / c.rep;
            h_rep + router + routed + shared
        } else {
            h_rep + self.mlp_inner(s.ffn_size as f64, c, selective)
        };
        LayerActs {
            attention,
            mlp,
            norm,
        }
    }

    fn korthikanti_layer(&self, c: &ActCtx, selective: bool) -> LayerActs {
        let s = &self.spec;
        let h = s.hidden_size as f64;
        let scores = if selective {
            0.0
        } else {
            5.0 * s.num_heads as f64 * c.key_len / c.t
        };
        LayerActs {
            attention: 3.0 * h / c.rep + 8.0 * h / c.t + scores,
            mlp: 3.0 * h / c.rep + 16.0 * h / c.t,
            norm: 4.0 * h / c.rep,
        }
    }
}

/// Dense and MoE layers among the `chunk`-layer model chunks a stage holds.
fn stage_layer_counts(spec: &ModelSpec, stage: u64, pp: u64, vpp: u64, chunk: u64) -> (f64, f64) {
    if !spec.is_moe() {
        return ((chunk * vpp) as f64, 0.0);
    }
    let mut dense = 0u64;
    for j in 0..vpp {
        let start = (stage + j * pp) * chunk;
        dense += spec.first_dense_layers.saturating_sub(start).min(chunk);
    }
    (dense as f64, (chunk * vpp - dense) as f64)
}

/// Estimate one configuration (the spec must have been validated).
pub fn estimate(prep: &Prepared, l: &Layout) -> Result<Breakdown, Invalid> {
    validate(&prep.spec, l)?;
    Ok(estimate_valid(prep, l))
}

/// [`estimate`] for a layout whose fields each passed [`check_field`].
pub(crate) fn estimate_checked_fields(prep: &Prepared, l: &Layout) -> Result<Breakdown, Invalid> {
    validate_fit(&prep.spec, l)?;
    Ok(estimate_valid(prep, l))
}

/// The busiest stage of a valid configuration.
fn estimate_valid(prep: &Prepared, l: &Layout) -> Breakdown {
    let config = Config::new(prep, l);
    let pp = l.pp as u64;
    let first_counts = config.layer_counts(0);
    let mut best = config.stage(0, first_counts);
    let mut previous_middle = (f64::NAN, f64::NAN);
    for stage in 1..pp {
        let counts = config.layer_counts(stage);
        // A middle stage holding the same layers as the first stage or as the middle stage
        // before it cannot be the busiest: it has the same layer states, fewer micro-batches
        // in flight and no embedding. Skipping it leaves two stages to evaluate for a dense
        // model, whatever `pp`.
        if stage < pp - 1 {
            if counts == first_counts || counts == previous_middle {
                continue;
            }
            previous_middle = counts;
        }
        let candidate = config.stage(stage, counts);
        if candidate.total > best.total {
            best = candidate;
        }
    }
    best
}

/// The breakdown of every pipeline stage of a configuration (the spec must have been
/// validated); [`estimate`] reports the first stage with the largest total.
pub fn estimate_stages(prep: &Prepared, l: &Layout) -> Result<Vec<Breakdown>, Invalid> {
    validate(&prep.spec, l)?;
    let config = Config::new(prep, l);
    Ok((0..l.pp as u64)
        .map(|stage| config.stage(stage, config.layer_counts(stage)))
        .collect())
}

/// What the stages of one valid configuration share.
struct Config<'a> {
    prep: &'a Prepared,
    l: &'a Layout,
    recompute: Recompute,
    tokens: f64,
    dense_acts: LayerActs,
    moe_acts: LayerActs,
    checkpoint: f64,
    working: f64,
    embedding_per_mb: f64,
    logits_per_mb: f64,
    /// Per-layer (dense, expert) parameters per rank of dense and of MoE layers.
    dense_layer: (f64, f64),
    moe_layer: (f64, f64),
    dense_group: f64,
    expert_group: f64,
    pp: u64,
    vpp: u64,
    chunk: u64,
}

impl<'a> Config<'a> {
    fn new(prep: &'a Prepared, l: &'a Layout) -> Self {
        let spec = &prep.spec;
        let t = l.tp;
        let sp = l.sequence_parallel == 1.0 && t > 1.0;
        let recompute = l.recompute_mode();
        let selective = recompute == Recompute::Selective;
        let c = ActCtx {
            e: l.activation_bytes,
            t,
            rep: if sp { t } else { 1.0 },
            kv_per_rank: (spec.num_kv_heads as f64 / t).max(1.0),
            key_len: l.seq_len / l.cp,
            eager: l.attention == 1.0,
            fused: l.fused_swiglu == 1.0,
        };
        let tokens = l.micro_batch * l.seq_len / l.cp;
        let h = spec.hidden_size as f64;
        let korthikanti = l.activation_model_kind() == ActivationModel::Korthikanti;

        // Per-layer activations per token: what a layer keeps, and its full set (working set).
        let (dense_acts, moe_acts) = if korthikanti {
            let kept = prep.korthikanti_layer(&c, selective);
            (kept, kept)
        } else if spec.is_moe() {
            (
                prep.modern_layer(&c, false, selective),
                prep.modern_layer(&c, true, selective),
            )
        } else {
            let kept = prep.modern_layer(&c, false, selective);
            (kept, kept)
        };
        let checkpoint = if korthikanti {
            2.0 * h / c.rep
        } else {
            c.e * h / c.rep
        };
        let working = if recompute != Recompute::Full || korthikanti {
            0.0
        } else if spec.is_moe() {
            let moe = prep.modern_layer(&c, true, false).total();
            let dense = if spec.first_dense_layers > 0 {
                prep.modern_layer(&c, false, false).total()
            } else {
                0.0
            };
            tokens * dense.max(moe)
        } else {
            tokens * prep.modern_layer(&c, false, false).total()
        };
        let embedding_per_mb = if korthikanti { h / c.rep } else { 8.0 } * tokens;
        let logits_per_mb = if korthikanti {
            0.0
        } else {
            tokens
                * (2.0 * c.e * h / c.rep
                    + prep.norm_stat_bytes / c.rep
                    + l.logits_bytes * spec.vocab_size as f64 / t
                    + 8.0)
        };
        let kv_fraction = c.kv_per_rank / spec.num_kv_heads as f64;
        let dense_group = l.dp * l.cp;
        let pp = l.pp as u64;
        let vpp = l.vpp as u64;
        Config {
            prep,
            l,
            recompute,
            tokens,
            dense_acts,
            moe_acts,
            checkpoint,
            working,
            embedding_per_mb,
            logits_per_mb,
            dense_layer: prep.dense_layer.per_rank(t, l.ep, kv_fraction),
            moe_layer: prep.moe_layer.per_rank(t, l.ep, kv_fraction),
            dense_group,
            expert_group: dense_group / l.ep,
            pp,
            vpp,
            chunk: spec.num_layers / (pp * vpp),
        }
    }

    /// (dense, MoE) layers held by `stage`.
    fn layer_counts(&self, stage: u64) -> (f64, f64) {
        stage_layer_counts(&self.prep.spec, stage, self.pp, self.vpp, self.chunk)
    }

    /// The breakdown of `stage`, which holds `(n_dense, n_moe)` layers.
    fn stage(&self, stage: u64, (n_dense, n_moe): (f64, f64)) -> Breakdown {
        let (prep, l, spec) = (self.prep, self.l, &self.prep.spec);
        let (pp, vpp) = (self.pp, self.vpp);
        let t = l.tp;
        let first = stage == 0;
        let last = stage == pp - 1;

        // Sharding of model states.
        let z = l.zero;
        let shard = |states: f64, threshold: f64, group: f64| {
            if z >= threshold {
                states / group
            } else {
                states
            }
        };
        let mut dense_params = n_dense * self.dense_layer.0 + n_moe * self.moe_layer.0;
        let expert_params = n_dense * self.dense_layer.1 + n_moe * self.moe_layer.1;
        if first {
            dense_params += prep.embedding / t + prep.positions;
        }
        if last {
            // A tied projection is the embedding itself unless the pipeline puts them on
            // different stages, where Megatron keeps a synchronized copy on the last one.
            let head = if spec.tied_embeddings && pp == 1 {
                0.0
            } else {
                prep.embedding / t
            };
            dense_params += prep.final_norm + head;
        }
        let per_param = |bytes: f64, threshold: f64| {
            bytes
                * (shard(dense_params, threshold, self.dense_group)
                    + shard(expert_params, threshold, self.expert_group))
        };
        let params = ceil(per_param(l.param_bytes, 3.0));
        let grads = ceil(per_param(l.grad_bytes + l.grad_buffer_bytes, 2.0));
        let optimizer = ceil(per_param(l.master_bytes + l.optimizer_state_bytes, 1.0));

        // Micro-batches in flight on this stage, in units of "all the stage's layers once".
        let m = l.grad_accum_steps;
        let remaining = (pp - stage) as f64;
        let in_flight = if pp == 1 {
            1.0
        } else if vpp == 1 {
            if m > 0.0 {
                remaining.min(m)
            } else {
                remaining
            }
        } else {
            let chunks = 2.0 * (remaining - 1.0) + ((vpp - 1) * pp) as f64 + 1.0;
            let chunks = if m > 0.0 {
                chunks.min(m * vpp as f64)
            } else {
                chunks
            };
            chunks / vpp as f64
        };
        let layer_tokens = self.tokens * in_flight;
        let (mut act_attention, mut act_mlp, mut act_norm, mut act_checkpoints) =
            (0.0, 0.0, 0.0, 0.0);
        if self.recompute == Recompute::Full {
            act_checkpoints = layer_tokens * (n_dense + n_moe) * self.checkpoint;
        } else {
            let (d, e) = (&self.dense_acts, &self.moe_acts);
            act_attention = layer_tokens * (n_dense * d.attention + n_moe * e.attention);
            act_mlp = layer_tokens * (n_dense * d.mlp + n_moe * e.mlp);
            act_norm = layer_tokens * (n_dense * d.norm + n_moe * e.norm);
        }
        let act_embedding = if first {
            self.embedding_per_mb * in_flight
        } else {
            0.0
        };
        let act_logits = if last { self.logits_per_mb } else { 0.0 };
        let act_working = if n_dense + n_moe > 0.0 {
            self.working
        } else {
            0.0
        };
        let activations = ceil(
            act_attention
                + act_mlp
                + act_norm
                + act_embedding
                + act_logits
                + act_checkpoints
                + act_working,
        );
        Breakdown {
            params,
            grads,
            optimizer,
            activations,
            overhead: l.overhead_bytes,
            total: params + grads + optimizer + activations + l.overhead_bytes,
            act_attention,
            act_mlp,
            act_norm,
            act_embedding,
            act_logits,
            act_checkpoints,
            act_working,
            stage: stage as f64,
        }
    }
}

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
//! per GPU, each sequence padded to a multiple of `2 * cp` when `cp > 1`, as load-balanced
//! context parallelism needs), per layer, times the layers and micro-batches in flight on the stage:
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
//! `modern`: the tensors today's blocks save, listed in [`crate::memory::activations`],
//! for Hugging Face's modules or fused kernels (the spec's `implementation`); the head
//! keeps the final norm, its output and the logits in `logits_bytes` for the loss.
//! Full recomputation keeps each layer's input and needs one layer's activations while it
//! recomputes (Chen et al. 2016).

use crate::memory::activations::{ActCtx, Activations, CpComm, LayerActs};
use crate::memory::layout::{ActivationModel, Invalid, Layout, Recompute};
use crate::memory::pipeline::{PipelineSplit, StageLayers};
use crate::memory::spec::{LayerParams, ModelSpec};

/// Names of the output columns, in [`Breakdown::to_values`] order.
pub const OUTPUT_FIELDS: [&str; 18] = [
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
    "act_comm",
    "act_mtp",
    "stage",
    "layers",
    "cpu_optimizer",
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
    /// Communication buffers of one layer at a time: expert-parallel all-to-all, context-
    /// parallel key/value exchange.
    pub act_comm: f64,
    /// Multi-token-prediction modules on the last stage: their inputs, layer, head and loss.
    pub act_mtp: f64,
    /// Index of the pipeline stage reported.
    pub stage: f64,
    /// Transformer layers held by that stage (multi-token-prediction layers not included).
    pub layers: f64,
    /// Optimizer state offloaded to CPU memory (not in `total`).
    pub cpu_optimizer: f64,
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
            self.act_comm,
            self.act_mtp,
            self.stage,
            self.layers,
            self.cpu_optimizer,
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
    /// One multi-token-prediction module: its layer, its norms and its projection.
    mtp_layer: LayerParams,
    mtp_norms: f64,
    mtp_projection: f64,
}

impl Prepared {
    /// Precompute per-layer parameter counts. The spec must have been validated.
    pub fn new(spec: &ModelSpec) -> Self {
        let (embedding, positions) = spec.embedding_params();
        let (final_norm, _) = spec.head_params(false);
        let (mtp_norms, mtp_projection) = spec.mtp_extra_params();
        Prepared {
            mtp_layer: spec.mtp_layer_params(false),
            mtp_norms,
            mtp_projection,
            spec: spec.clone(),
            dense_layer: spec.layer_params(0, false),
            moe_layer: spec.layer_params(spec.first_dense_layers, false),
            embedding,
            positions,
            final_norm,
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

const TWO_POW_52: f64 = 4_503_599_627_370_496.0;

/// Whether `x` is a whole number in `[low, high]` (`0 <= low`, `high` finite), without
/// branches or conversions (a grid checks every value of a list of configurations):
/// below 2^52, adding and removing 2^52 rounds `x` to an integer (it changes only a
/// fractional `x`); from 2^52 on every double is whole. NaN fails every comparison.
#[inline(always)]
fn is_whole_in(x: f64, low: f64, high: f64) -> bool {
    let whole = (x >= TWO_POW_52) | ((x + TWO_POW_52) - TWO_POW_52 == x);
    (x >= low) & (x <= high) & whole
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
    check_fields(l)?;
    validate_fit(spec, l).map(|_| ())
}

/// [`check_field`] on every field, in field order.
fn check_fields(l: &Layout) -> Result<(), Invalid> {
    for (field, &value) in l.to_values().iter().enumerate() {
        check_field(field, value)?;
    }
    Ok(())
}

/// What the value of a layout field must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FieldRule {
    PositiveInteger,
    /// A non-negative whole number.
    Count,
    /// 0, 1, 2 or 3.
    ZeroStage,
    /// 0 or 1.
    Flag,
    /// 0, 1 or 2.
    ThreeWay,
    /// A [`PipelineSplit`] code.
    PipelineSplit,
    /// A finite number at least 0.
    NonNegative,
    /// A number between 0 and 1.
    Fraction,
}

impl FieldRule {
    #[inline(always)]
    pub(crate) fn accepts(self, x: f64) -> bool {
        match self {
            FieldRule::PositiveInteger => is_whole_in(x, 1.0, f64::MAX),
            FieldRule::Count => is_whole_in(x, 0.0, f64::MAX),
            FieldRule::ZeroStage => is_whole_in(x, 0.0, 3.0),
            FieldRule::Flag => is_whole_in(x, 0.0, 1.0),
            FieldRule::ThreeWay => is_whole_in(x, 0.0, 2.0),
            FieldRule::PipelineSplit => is_whole_in(x, 0.0, 4.0),
            FieldRule::NonNegative => (0.0..=f64::MAX).contains(&x),
            FieldRule::Fraction => (0.0..=1.0).contains(&x),
        }
    }
}

/// The rule field `field` (an index into [`LAYOUT_FIELDS`](crate::memory::LAYOUT_FIELDS))
/// follows, and the reason reported when a value breaks it.
pub(crate) fn field_rule(field: usize) -> (FieldRule, Invalid) {
    use FieldRule as R;
    match field {
        0 => (R::PositiveInteger, Invalid::SeqLen),
        1 => (R::PositiveInteger, Invalid::MicroBatch),
        2 => (R::PositiveInteger, Invalid::Dp),
        3 => (R::PositiveInteger, Invalid::Tp),
        4 => (R::PositiveInteger, Invalid::Pp),
        5 => (R::PositiveInteger, Invalid::Cp),
        6 => (R::PositiveInteger, Invalid::Ep),
        7 => (R::PositiveInteger, Invalid::Vpp),
        8 => (R::ZeroStage, Invalid::Zero),
        9 => (R::Flag, Invalid::SequenceParallel),
        10 => (R::ThreeWay, Invalid::Recompute),
        11 => (R::Count, Invalid::GradAccumSteps),
        19 => (R::Flag, Invalid::ActivationModel),
        20 => (R::Flag, Invalid::Attention),
        21 => (R::Flag, Invalid::FusedSwiglu),
        23 => (R::Count, Invalid::FirstStageLayers),
        24 => (R::Count, Invalid::LastStageLayers),
        25 => (R::PipelineSplit, Invalid::PipelineSplit),
        26 => (R::NonNegative, Invalid::MoeCapacityFactor),
        27 => (R::ThreeWay, Invalid::CpComm),
        28 => (R::Flag, Invalid::Loss),
        29 => (R::Flag, Invalid::Fp8),
        30 => (R::Fraction, Invalid::OptimizerOffload),
        // 12..=18 and 22: byte counts.
        _ => (R::NonNegative, Invalid::Bytes),
    }
}

/// Check the value of field `field` (an index into
/// [`LAYOUT_FIELDS`](crate::memory::LAYOUT_FIELDS)) on its own.
///
/// A grid checks each distinct value of an input once with this, rather than every field
/// of every cell.
pub fn check_field(field: usize, x: f64) -> Result<(), Invalid> {
    let (rule, reason) = field_rule(field);
    if rule.accepts(x) {
        Ok(())
    } else {
        Err(reason)
    }
}

/// Check how a configuration whose fields each passed [`check_field`] fits the model, and
/// split its layers over the pipeline stages. Inlined, so that the split is built where it
/// is used rather than copied out of a return slot for every cell of a grid.
#[inline(always)]
fn validate_fit(spec: &ModelSpec, l: &Layout) -> Result<StageLayers, Invalid> {
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
    let split = PipelineSplit::from_code(l.pipeline_split).ok_or(Invalid::PipelineSplit)?;
    let stages = StageLayers::new(
        spec.num_layers,
        l.pp as u64,
        l.vpp as u64,
        split,
        l.first_stage_layers as u64,
        l.last_stage_layers as u64,
    )
    .ok_or(Invalid::PpLayers)?;
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
    Ok(stages)
}

/// Routed copies per token relative to `top_k`: the capacity factor when experts' inputs
/// are padded to capacity, 1 for dropless routing with a balanced load.
fn capacity_multiple(capacity_factor: f64) -> f64 {
    if capacity_factor > 0.0 {
        capacity_factor
    } else {
        1.0
    }
}

/// Tokens of a `seq_len`-token sequence on each of `cp` context-parallel ranks: with load
/// balancing, a sequence is padded to a multiple of `2 * cp` and cut into `2 * cp` chunks,
/// two per rank (Transformer Engine's and Megatron's convention).
fn cp_rank_tokens(seq_len: f64, cp: f64) -> f64 {
    if cp == 1.0 {
        seq_len
    } else {
        ceil(seq_len / (2.0 * cp)) * 2.0
    }
}

/// Estimate one configuration (the spec must have been validated).
pub fn estimate(prep: &Prepared, l: &Layout) -> Result<Breakdown, Invalid> {
    check_fields(l)?;
    estimate_checked_fields(prep, l)
}

/// [`estimate`] for a layout whose fields each passed [`check_field`].
pub(crate) fn estimate_checked_fields(prep: &Prepared, l: &Layout) -> Result<Breakdown, Invalid> {
    let stages = validate_fit(&prep.spec, l)?;
    Ok(estimate_valid(prep, l, stages))
}

/// The busiest stage of a valid configuration.
fn estimate_valid(prep: &Prepared, l: &Layout, stages: StageLayers) -> Breakdown {
    let config = Config::new(prep, l, stages);
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
    check_fields(l)?;
    let stages = validate_fit(&prep.spec, l)?;
    let config = Config::new(prep, l, stages);
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
    /// Bytes per micro-batch of an MoE layer that do not scale with tokens.
    moe_fixed: f64,
    /// Rotary tables kept per micro-batch (shared by the layers).
    rotary_per_mb: f64,
    checkpoint: f64,
    working: f64,
    embedding_per_mb: f64,
    logits_per_mb: f64,
    /// Communication buffers of one layer (EP all-to-all, CP key/value exchange).
    comm: f64,
    /// One multi-token-prediction module's activations per micro-batch.
    mtp_per_mb: f64,
    /// Per-layer (dense, expert) parameters per rank of dense and of MoE layers, and of a
    /// multi-token-prediction module (its layer, norms and projection).
    dense_layer: (f64, f64),
    moe_layer: (f64, f64),
    mtp_module: (f64, f64),
    dense_group: f64,
    expert_group: f64,
    pp: u64,
    vpp: u64,
    stages: StageLayers,
}

impl<'a> Config<'a> {
    /// Inlined: a grid builds one for every cell, and a `Config` returned through memory
    /// stalled when its fields were read back in pairs over their fresh stores.
    #[inline(always)]
    fn new(prep: &'a Prepared, l: &'a Layout, stages: StageLayers) -> Self {
        let spec = &prep.spec;
        let t = l.tp;
        let sp = l.sequence_parallel == 1.0 && t > 1.0;
        let recompute = l.recompute_mode();
        let selective = recompute == Recompute::Selective;
        let e = l.activation_bytes;
        let copies = spec.top_k as f64 * capacity_multiple(l.moe_capacity_factor);
        let c = ActCtx {
            e,
            t,
            rep: if sp { t } else { 1.0 },
            kv_per_rank: (spec.num_kv_heads as f64 / t).max(1.0),
            key_len: cp_rank_tokens(l.seq_len, l.cp),
            eager: l.attention == 1.0,
            fused_swiglu: l.fused_swiglu == 1.0,
            selective,
            param_bytes: l.param_bytes,
            lin: if l.fp8 == 1.0 { 1.0 } else { e },
            copies,
        };
        let tokens = l.micro_batch * cp_rank_tokens(l.seq_len, l.cp);
        let h = spec.hidden_size as f64;
        let korthikanti = l.activation_model_kind() == ActivationModel::Korthikanti;
        let acts = Activations::new(spec, c);

        // Per-layer activations per token (and per micro-batch for what does not scale with
        // tokens) of dense and MoE layers, and a layer's full set (the working set of full
        // recomputation, which rebuilds one layer with nothing recomputed away).
        let kept = |moe: bool| {
            if korthikanti {
                (acts.korthikanti_layer(), 0.0)
            } else {
                acts.layer(moe)
            }
        };
        let (dense_acts, _) = kept(false);
        let (moe_acts, moe_fixed) = if spec.is_moe() {
            kept(true)
        } else {
            (dense_acts, 0.0)
        };
        let checkpoint = if korthikanti { 2.0 * h } else { e * h } / c.rep;
        let working = if recompute != Recompute::Full || korthikanti {
            0.0
        } else {
            let full = Activations::new(
                spec,
                ActCtx {
                    selective: false,
                    ..c
                },
            );
            let layer = |moe: bool| {
                let (per_token, fixed) = full.layer(moe);
                tokens * per_token.total() + fixed
            };
            let has_dense = !spec.is_moe() || spec.first_dense_layers > 0;
            let dense = if has_dense { layer(false) } else { 0.0 };
            let moe = if spec.is_moe() { layer(true) } else { 0.0 };
            dense.max(moe)
        };
        let embedding_per_mb = if korthikanti { h / c.rep } else { 8.0 } * tokens;
        let rotary_per_mb = if korthikanti || recompute == Recompute::Full {
            0.0
        } else {
            acts.rotary_tables(c.key_len)
        };
        // The loss keeps the logits (`logits_bytes`, vocabulary-parallel) and the labels; a
        // fused cross-entropy keeps only an fp32 log-sum-exp per token.
        let loss_per_token = if l.loss == 1.0 {
            4.0
        } else {
            l.logits_bytes * spec.vocab_size as f64 / t
        } + 8.0;
        let logits_per_mb = if korthikanti {
            0.0
        } else {
            tokens * (acts.head() + loss_per_token)
        };
        // A multi-token-prediction module: two norms, the projection's input (2h), a layer
        // like the last, and its own head and loss.
        let mtp_moe = spec.is_moe() && spec.num_layers > spec.first_dense_layers;
        let mtp_per_mb = if korthikanti || spec.mtp_layers == 0 {
            0.0
        } else {
            let (layer, fixed) = if recompute == Recompute::Full {
                (checkpoint, 0.0)
            } else {
                let (layer, fixed) = kept(mtp_moe);
                (layer.total(), fixed)
            };
            tokens * (acts.mtp_inputs() + layer + acts.head() + loss_per_token) + fixed
        };
        let comm = if korthikanti {
            0.0
        } else {
            tokens * acts.comm_buffers(l.ep, l.cp, CpComm::from_code(l.cp_comm))
        };
        let kv_fraction = c.kv_per_rank / spec.num_kv_heads as f64;
        let (mtp_dense, mtp_experts) = prep.mtp_layer.per_rank(t, l.ep, kv_fraction);
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
            moe_fixed,
            rotary_per_mb,
            checkpoint,
            working,
            embedding_per_mb,
            logits_per_mb,
            comm,
            mtp_per_mb,
            dense_layer: prep.dense_layer.per_rank(t, l.ep, kv_fraction),
            moe_layer: prep.moe_layer.per_rank(t, l.ep, kv_fraction),
            mtp_module: (
                mtp_dense + prep.mtp_norms + prep.mtp_projection / t,
                mtp_experts,
            ),
            dense_group,
            expert_group: dense_group / l.ep,
            pp,
            vpp,
            stages,
        }
    }

    /// (dense, MoE) layers held by `stage`.
    fn layer_counts(&self, stage: u64) -> (f64, f64) {
        let spec = &self.prep.spec;
        let layers = self.stages.stage_layers(stage);
        let dense = if spec.is_moe() {
            self.stages
                .leading_layers_on(stage, spec.first_dense_layers)
        } else {
            layers
        };
        (dense as f64, (layers - dense) as f64)
    }

    /// The breakdown of `stage`, which holds `(n_dense, n_moe)` layers. Inlined, for the
    /// same reason as [`Config::new`].
    #[inline(always)]
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
        let mut expert_params = n_dense * self.dense_layer.1 + n_moe * self.moe_layer.1;
        let mtp = if last { spec.mtp_layers as f64 } else { 0.0 };
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
            // Multi-token prediction runs on the last stage, which then needs the
            // embedding too (Megatron-LM builds it there when pp > 1).
            dense_params += mtp * self.mtp_module.0;
            expert_params += mtp * self.mtp_module.1;
            if mtp > 0.0 && pp > 1 {
                dense_params += prep.embedding / t;
            }
        }
        let per_param = |bytes: f64, threshold: f64| {
            bytes
                * (shard(dense_params, threshold, self.dense_group)
                    + shard(expert_params, threshold, self.expert_group))
        };
        let params = ceil(per_param(l.param_bytes, 3.0));
        let grads = ceil(per_param(l.grad_bytes + l.grad_buffer_bytes, 2.0));
        let all_optimizer = ceil(per_param(l.master_bytes + l.optimizer_state_bytes, 1.0));
        let cpu_optimizer = ceil(all_optimizer * l.optimizer_offload);
        let optimizer = all_optimizer - cpu_optimizer;

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
            act_attention = layer_tokens * (n_dense * d.attention + n_moe * e.attention)
                + in_flight * self.rotary_per_mb;
            act_mlp = layer_tokens * (n_dense * d.mlp + n_moe * e.mlp)
                + in_flight * n_moe * self.moe_fixed;
            act_norm = layer_tokens * (n_dense * d.norm + n_moe * e.norm);
        }
        let act_embedding = if first {
            self.embedding_per_mb * in_flight
        } else {
            0.0
        };
        let act_logits = if last { self.logits_per_mb } else { 0.0 };
        let act_mtp = mtp * self.mtp_per_mb;
        let (act_working, act_comm) = if n_dense + n_moe + mtp > 0.0 {
            (self.working, self.comm)
        } else {
            (0.0, 0.0)
        };
        let activations = ceil(
            act_attention
                + act_mlp
                + act_norm
                + act_embedding
                + act_logits
                + act_checkpoints
                + act_working
                + act_comm
                + act_mtp,
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
            act_comm,
            act_mtp,
            stage: stage as f64,
            layers: n_dense + n_moe,
            cpu_optimizer,
        }
    }
}

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

use crate::memory::activations::{rotary_tables, ActCtx, Activations, CpComm, LayerActs};
use crate::memory::layout::{ActivationModel, Invalid, Layout, Recompute, MAX_RECOMPUTE_CODE};
use crate::memory::memo::Memo;
use crate::memory::pipeline::{PipelineSplit, StageLayers};
use crate::memory::spec::{Implementation, LayerParams, ModelSpec};

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

/// `x.ceil()`, without a rounding instruction (portable x86-64 has none, and `f64::ceil`
/// is a libm call, a tenth of the grid's time) nor a branch (whether a byte count is whole
/// varies from cell to cell): below 2^52 in magnitude, adding and removing 2^52 (with the
/// sign of `x`) rounds `x` to the nearest integer, one is added where that is below `x`;
/// from 2^52 on, every double is whole. Zero and negative zero give zero, as the integer
/// round trip this replaces did.
#[inline(always)]
fn ceil(x: f64) -> f64 {
    let shift = TWO_POW_52.copysign(x);
    let nearest = (x + shift) - shift;
    let up = nearest + if nearest < x { 1.0 } else { 0.0 };
    if x.abs() < TWO_POW_52 {
        up
    } else {
        x
    }
}

/// A count below 2^32 (stages, chunks and layers of a pipeline: at most 4,095) as an
/// `f64`, by the one-instruction signed conversion rather than the unsigned 64-bit one.
#[inline(always)]
fn count(n: u64) -> f64 {
    f64::from(n as u32)
}

/// Clear `ok[i]` where `accepts(values[i])` is false. The values are checked together
/// first, and one by one only when one fails: a fold is a comparison per value and no
/// store (a store to `ok` per value cost more than converting integer values to floats),
/// and the values of a grid are nearly all fine.
#[inline(always)]
pub(crate) fn clear_failing(values: &[f64], ok: &mut [bool], accepts: impl Fn(f64) -> bool) {
    if !values.iter().fold(true, |all, &x| all & accepts(x)) {
        for (ok, &x) in ok.iter_mut().zip(values) {
            *ok &= accepts(x);
        }
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
    /// 0, 1, 2 or 3 (a ZeRO stage).
    FourWay,
    /// A `recompute` code: 0 to [`MAX_RECOMPUTE_CODE`].
    RecomputeCode,
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
    /// Whether `x` is in the rule's [`FieldRule::range`] and, unless the rule takes any
    /// number in it, a whole number.
    #[inline(always)]
    pub(crate) fn accepts(self, x: f64) -> bool {
        let (low, high) = self.range();
        match self {
            FieldRule::NonNegative | FieldRule::Fraction => (low..=high).contains(&x),
            _ => is_whole_in(x, low, high),
        }
    }

    /// Clear `ok[i]` where `values[i]` breaks the rule: one rule for a whole column, so
    /// the loop has no branch on it.
    #[inline(always)]
    pub(crate) fn check_all(self, values: &[f64], ok: &mut [bool]) {
        macro_rules! each {
            ($($rule:ident)*) => {
                match self {
                    $(FieldRule::$rule => {
                        clear_failing(values, ok, |x| FieldRule::$rule.accepts(x))
                    })*
                }
            };
        }
        each!(PositiveInteger Count FourWay RecomputeCode Flag ThreeWay PipelineSplit NonNegative Fraction);
    }

    /// The least and the largest value the rule accepts: for whole numbers (an integer
    /// column), [`FieldRule::accepts`] is just this range check.
    #[inline(always)]
    pub(crate) fn range(self) -> (f64, f64) {
        match self {
            FieldRule::PositiveInteger => (1.0, f64::MAX),
            FieldRule::Count | FieldRule::NonNegative => (0.0, f64::MAX),
            FieldRule::FourWay => (0.0, 3.0),
            FieldRule::RecomputeCode => (0.0, MAX_RECOMPUTE_CODE),
            FieldRule::Flag | FieldRule::Fraction => (0.0, 1.0),
            FieldRule::ThreeWay => (0.0, 2.0),
            FieldRule::PipelineSplit => (0.0, 4.0),
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
        8 => (R::FourWay, Invalid::Zero),
        9 => (R::Flag, Invalid::SequenceParallel),
        10 => (R::RecomputeCode, Invalid::Recompute),
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
/// split its layers over the pipeline stages.
fn validate_fit(spec: &ModelSpec, l: &Layout) -> Result<StageLayers, Invalid> {
    tp_fit(spec, l.tp)?;
    let stages = split_fit(spec, l)?;
    ep_fit(spec, l.ep)?;
    ep_group_fit(l)?;
    Ok(stages)
}

/// Whether `tp` divides the heads and MLP widths of the model (key/value heads: divides
/// them or is a multiple of them).
fn tp_fit(spec: &ModelSpec, tp: f64) -> Result<(), Invalid> {
    if !divides(tp, spec.num_heads) {
        return Err(Invalid::TpHeads);
    }
    if !spec.is_mla() && !divides(tp, spec.num_kv_heads) && (tp as u64) % spec.num_kv_heads != 0 {
        return Err(Invalid::TpKvHeads);
    }
    let has_dense = !spec.is_moe() || spec.first_dense_layers > 0;
    if (has_dense && !divides(tp, spec.ffn_size))
        || (spec.is_moe() && !divides(tp, spec.moe_ffn_size))
    {
        return Err(Invalid::TpFfn);
    }
    Ok(())
}

/// The split of the model's layers over the pipeline stages. Inlined, so that the split is
/// built where it is used rather than copied out of a return slot for every cell of a grid.
#[inline(always)]
fn split_fit(spec: &ModelSpec, l: &Layout) -> Result<StageLayers, Invalid> {
    let split = PipelineSplit::from_code(l.pipeline_split).ok_or(Invalid::PipelineSplit)?;
    StageLayers::new(
        spec.num_layers,
        l.pp as u64,
        l.vpp as u64,
        split,
        l.first_stage_layers as u64,
        l.last_stage_layers as u64,
    )
    .ok_or(Invalid::PpLayers)
}

/// Whether `ep` divides the routed experts (1 for a dense model).
fn ep_fit(spec: &ModelSpec, ep: f64) -> Result<(), Invalid> {
    if spec.is_moe() {
        if !divides(ep, spec.num_experts) {
            return Err(Invalid::EpExperts);
        }
    } else if ep != 1.0 {
        return Err(Invalid::EpDense);
    }
    Ok(())
}

/// Whether `ep` divides the data- and context-parallel ranks that shard the experts.
#[inline(always)]
fn ep_group_fit(l: &Layout) -> Result<(), Invalid> {
    // Below 2^53 the float product is exact (and is below 2^53 only if the exact one is).
    let fits = if l.dp * l.cp < TWO_POW_53 {
        divides(l.ep, (l.dp * l.cp) as u64)
    } else {
        divides_product(l.ep, l.dp, l.cp)
    };
    if fits {
        Ok(())
    } else {
        Err(Invalid::EpDpCp)
    }
}

/// 2^53: whole numbers up to it are exact in an `f64`.
const TWO_POW_53: f64 = 9_007_199_254_740_992.0;

/// Whether `d` (a validated positive whole number, at most the number of experts) divides
/// `a * b` (validated positive whole numbers whose product may be past 2^53): `d / gcd(d, a)` must divide
/// `b`. A float's remainder is exact, so huge `a` and `b` are read as they are.
#[cold]
fn divides_product(d: f64, a: f64, b: f64) -> bool {
    let d = d as u64;
    let mut x = d;
    let mut y = (a % d as f64) as u64;
    while y != 0 {
        (x, y) = (y, x % y);
    }
    let rest = d / x;
    b % rest as f64 == 0.0
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
#[inline(always)]
fn cp_rank_tokens(seq_len: f64, cp: f64) -> f64 {
    if cp == 1.0 {
        seq_len
    } else {
        ceil(seq_len / (2.0 * cp)) * 2.0
    }
}

/// Whether `l` recomputes fully. A comparison of the code (validated) rather
/// than of the [`Recompute`] mode: a float comparison chooses between values with masks,
/// where a branch on the mode, which varies from cell to cell in a list of layouts, was
/// mispredicted.
#[inline(always)]
fn full_recompute(l: &Layout) -> bool {
    l.recompute == 2.0
}

/// Estimate one configuration (the spec must have been validated).
pub fn estimate(prep: &Prepared, l: &Layout) -> Result<Breakdown, Invalid> {
    check_fields(l)?;
    let stages = validate_fit(&prep.spec, l)?;
    let terms = Terms::new(prep, &TermsKey::new(l));
    finite(estimate_valid(prep, l, &terms, stages))
}

/// Estimates configurations one after the other, as a grid does: the [`Terms`] of each
/// distinct [`TermsKey`] are computed once, and cells with the same key share them.
pub(crate) struct Estimator<'p> {
    prep: &'p Prepared,
    terms: Memo<TERMS_KEY_WORDS, Terms>,
    list_terms: Memo<LIST_KEY_WORDS, Terms>,
}

/// Words of the key of a cell of a list ([`Estimator::estimate_list_cell`]).
pub(crate) const LIST_KEY_WORDS: usize = 4;

impl<'p> Estimator<'p> {
    pub fn new(prep: &'p Prepared) -> Self {
        Estimator {
            prep,
            terms: Memo::new(),
            list_terms: Memo::new(),
        }
    }

    /// [`Estimator::estimate_checked_fields`] for a cell of a list of configurations whose
    /// `key` holds the values of the list's columns that its terms depend on: cells of one
    /// list with equal keys have equal [`TermsKey`]s (the list's other fields are the same
    /// in every cell). A shorter key than a [`TermsKey`] is quicker to find.
    #[inline(always)]
    pub fn estimate_list_cell(
        &mut self,
        l: &Layout,
        key: [u64; LIST_KEY_WORDS],
    ) -> Result<Breakdown, Invalid> {
        let prep = self.prep;
        let terms = self
            .list_terms
            .get_or_insert_with(key, || Terms::of(prep, l));
        estimate_with_terms(prep, l, terms)
    }

    /// [`estimate`] for a layout whose fields each passed [`check_field`]. Inlined into
    /// the grid's loops, for the reasons [`Config::new`] gives.
    #[inline(always)]
    pub fn estimate_checked_fields(&mut self, l: &Layout) -> Result<Breakdown, Invalid> {
        let prep = self.prep;
        let key = TermsKey::new(l);
        let terms = self
            .terms
            .get_or_insert_with(key.words(), || Terms::new(prep, &key));
        estimate_with_terms(prep, l, terms)
    }
}

/// [`estimate`] for a layout whose fields each passed [`check_field`], given its terms
/// (those of its [`TermsKey`]).
#[inline(always)]
pub(crate) fn estimate_with_terms(
    prep: &Prepared,
    l: &Layout,
    terms: &Terms,
) -> Result<Breakdown, Invalid> {
    // The checks of `validate_fit`, in its order.
    terms.tp_fit?;
    let stages = split_fit(&prep.spec, l)?;
    terms.ep_fit?;
    ep_group_fit(l)?;
    finite(estimate_valid(prep, l, terms, stages))
}

/// A breakdown whose total is a number, or [`Invalid::Overflow`]: an estimate of absurd
/// inputs is refused rather than reported as valid.
#[inline(always)]
fn finite(breakdown: Breakdown) -> Result<Breakdown, Invalid> {
    if breakdown.total.is_finite() {
        Ok(breakdown)
    } else {
        Err(Invalid::Overflow)
    }
}

/// The busiest stage of a valid configuration, with an infinite total where some stage's
/// total is past the largest `f64` (infinite, or NaN where an infinite count of tokens met
/// zero bytes; a NaN stage would never win the comparison below). Every non-negative
/// output of a stage adds up into its total (or, for the offloaded optimizer state, is at
/// most a part of it), so one check of each evaluated stage's total covers them all; the
/// middle stages skipped below hold at most what the first holds.
#[inline(always)]
fn estimate_valid(prep: &Prepared, l: &Layout, terms: &Terms, stages: StageLayers) -> Breakdown {
    let config = Config::new(prep, l, terms, stages);
    let pp = l.pp as u64;
    let first_counts = config.layer_counts(0);
    let mut best = config.stage(0, first_counts);
    let mut finite = best.total.is_finite();
    // A middle stage holding the same layers as the first stage or as the middle stage
    // before it cannot be the busiest: it has the same layer states, fewer micro-batches in
    // flight and no embedding. That leaves two stages to evaluate for a dense model,
    // whatever `pp`; when its split is even, not even a look at the middle stages, whose
    // number varies from cell to cell (a mispredicted loop exit in a list of layouts).
    let middles = if !prep.spec.is_moe() && stages.middle_stages_like_first() {
        1..1
    } else {
        1..pp.saturating_sub(1)
    };
    let mut previous_middle = (f64::NAN, f64::NAN);
    for stage in middles {
        let counts = config.layer_counts(stage);
        if counts == first_counts || counts == previous_middle {
            continue;
        }
        previous_middle = counts;
        let candidate = config.stage(stage, counts);
        finite &= candidate.total.is_finite();
        if candidate.total > best.total {
            best = candidate;
        }
    }
    if pp > 1 {
        let candidate = config.stage(pp - 1, config.layer_counts(pp - 1));
        finite &= candidate.total.is_finite();
        if candidate.total > best.total {
            best = candidate;
        }
    }
    if !finite {
        best.total = f64::INFINITY;
    }
    best
}

/// The breakdown of every pipeline stage of a configuration (the spec must have been
/// validated); [`estimate`] reports the first stage with the largest total. As there, a
/// stage whose total is past the largest `f64` makes it [`Invalid::Overflow`].
pub fn estimate_stages(prep: &Prepared, l: &Layout) -> Result<Vec<Breakdown>, Invalid> {
    check_fields(l)?;
    let stages = validate_fit(&prep.spec, l)?;
    let terms = Terms::new(prep, &TermsKey::new(l));
    let config = Config::new(prep, l, &terms, stages);
    let breakdowns: Vec<Breakdown> = (0..l.pp as u64)
        .map(|stage| config.stage(stage, config.layer_counts(stage)))
        .collect();
    if breakdowns.iter().all(|b| b.total.is_finite()) {
        Ok(breakdowns)
    } else {
        Err(Invalid::Overflow)
    }
}

/// Words of a [`TermsKey`].
const TERMS_KEY_WORDS: usize = 16;

/// The fields of a configuration that its [`Terms`] depend on: all but the batch shape,
/// the data-parallel and pipeline layout, ZeRO and the bytes of the model states.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TermsKey {
    tp: f64,
    sequence_parallel: f64,
    recompute: f64,
    activation_bytes: f64,
    attention: f64,
    fused_swiglu: f64,
    fp8: f64,
    activation_model: f64,
    moe_capacity_factor: f64,
    param_bytes: f64,
    ep: f64,
    cp: f64,
    cp_comm: f64,
    loss: f64,
    logits_bytes: f64,
    /// Keys each query attends to, where a layer's activations depend on them (eager
    /// attention keeps its probabilities, `korthikanti` its scores); NaN elsewhere, so that
    /// cells of every sequence length share the key.
    key_len: f64,
}

/// The layout fields (indices into [`LAYOUT_FIELDS`](crate::memory::LAYOUT_FIELDS)) a
/// [`TermsKey`] holds, besides `seq_len`, which it holds only where a cell's attention is
/// eager or its activation model `korthikanti` ([`KEY_LEN_FIELDS`]).
pub(crate) const TERMS_FIELDS: [usize; 15] =
    [3, 9, 10, 17, 20, 21, 29, 19, 26, 12, 6, 5, 27, 28, 18];

/// `seq_len`, and the fields whose value 1 makes a [`TermsKey`] depend on it: `attention`
/// (eager) and `activation_model` (`korthikanti`).
pub(crate) const KEY_LEN_FIELDS: (usize, [usize; 2]) = (0, [20, 19]);

impl TermsKey {
    #[inline(always)]
    pub fn new(l: &Layout) -> Self {
        let key_len = if l.attention == 1.0 || l.activation_model == 1.0 {
            cp_rank_tokens(l.seq_len, l.cp)
        } else {
            f64::NAN
        };
        TermsKey {
            tp: l.tp,
            sequence_parallel: l.sequence_parallel,
            recompute: l.recompute,
            activation_bytes: l.activation_bytes,
            attention: l.attention,
            fused_swiglu: l.fused_swiglu,
            fp8: l.fp8,
            activation_model: l.activation_model,
            moe_capacity_factor: l.moe_capacity_factor,
            param_bytes: l.param_bytes,
            ep: l.ep,
            cp: l.cp,
            cp_comm: l.cp_comm,
            loss: l.loss,
            logits_bytes: l.logits_bytes,
            key_len,
        }
    }

    /// The fields' bits: equal bits, equal terms.
    #[inline(always)]
    pub fn words(&self) -> [u64; TERMS_KEY_WORDS] {
        [
            self.tp,
            self.sequence_parallel,
            self.recompute,
            self.activation_bytes,
            self.attention,
            self.fused_swiglu,
            self.fp8,
            self.activation_model,
            self.moe_capacity_factor,
            self.param_bytes,
            self.ep,
            self.cp,
            self.cp_comm,
            self.loss,
            self.logits_bytes,
            self.key_len,
        ]
        .map(f64::to_bits)
    }
}

/// What a configuration's estimate needs per token of a micro-batch and per rank: the
/// activations of a layer, of the head and loss, of multi-token prediction and of the
/// communication buffers per token, and the parameters a rank holds of each kind of
/// layer. A function of [`TermsKey`] alone.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Terms {
    /// How `tp` fits the heads and MLP widths, and `ep` the experts.
    tp_fit: Result<(), Invalid>,
    ep_fit: Result<(), Invalid>,
    korthikanti: bool,
    dense_acts: LayerActs,
    moe_acts: LayerActs,
    /// Bytes per micro-batch of an MoE layer that do not scale with tokens.
    moe_fixed: f64,
    checkpoint: f64,
    /// Full recomputation's working layer, dense and MoE: bytes per token and per
    /// micro-batch of a layer with nothing recomputed away (unused unless recompute is
    /// full).
    working_dense: (f64, f64),
    working_moe: (f64, f64),
    embedding_per_token: f64,
    /// The rotary tables' width and element bytes, when they are kept.
    rotary: Option<(f64, f64)>,
    /// Final norm, output projection input and loss per token.
    head_per_token: f64,
    /// One multi-token-prediction module per token and per micro-batch.
    mtp: (f64, f64),
    /// Communication buffers of one layer per token (EP all-to-all, CP key/value exchange).
    comm_per_token: f64,
    /// Per-layer (dense, expert) parameters per rank of dense and of MoE layers, and of a
    /// multi-token-prediction module (its layer, norms and projection).
    dense_layer: (f64, f64),
    moe_layer: (f64, f64),
    mtp_module: (f64, f64),
    /// The embedding's (and an untied output layer's) parameters per rank.
    embedding_per_rank: f64,
}

impl Terms {
    /// The terms of `l`'s key.
    pub fn of(prep: &Prepared, l: &Layout) -> Self {
        Terms::new(prep, &TermsKey::new(l))
    }

    fn new(prep: &Prepared, k: &TermsKey) -> Self {
        let spec = &prep.spec;
        let t = k.tp;
        let sp = k.sequence_parallel == 1.0 && t > 1.0;
        let recompute = Recompute::from_code(k.recompute);
        let e = k.activation_bytes;
        let copies = spec.top_k as f64 * capacity_multiple(k.moe_capacity_factor);
        let c = ActCtx {
            e,
            t,
            rep: if sp { t } else { 1.0 },
            kv_per_rank: (spec.num_kv_heads as f64 / t).max(1.0),
            key_len: k.key_len,
            eager: k.attention == 1.0,
            fused_swiglu: k.fused_swiglu == 1.0,
            recompute,
            param_bytes: k.param_bytes,
            lin: if k.fp8 == 1.0 { 1.0 } else { e },
            copies,
        };
        let h = spec.hidden_size as f64;
        let korthikanti =
            ActivationModel::from_code(k.activation_model) == ActivationModel::Korthikanti;
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
        let (mut working_dense, mut working_moe) = ((0.0, 0.0), (0.0, 0.0));
        if recompute == Recompute::Full && !korthikanti {
            let full = Activations::new(
                spec,
                ActCtx {
                    recompute: Recompute::None,
                    ..c
                },
            );
            let layer = |moe: bool| {
                let (per_token, fixed) = full.layer(moe);
                (per_token.total(), fixed)
            };
            if !spec.is_moe() || spec.first_dense_layers > 0 {
                working_dense = layer(false);
            }
            if spec.is_moe() {
                working_moe = layer(true);
            }
        }
        // Megatron's vocabulary-parallel modules keep a bool mask per token: the embedding
        // of the ids outside its rank's part of the vocabulary (`tp > 1`), the loss of the
        // labels outside it (measured in tests/runs/megatron_cpu.py).
        let megatron = spec.implementation == Implementation::Fused;
        let embedding_per_token = if korthikanti {
            h / c.rep
        } else if megatron && t > 1.0 {
            9.0
        } else {
            8.0
        };
        // Kept unless full recomputation rebuilds them ([`Config::new`] leaves them out then).
        let rotary = if korthikanti {
            None
        } else {
            acts.rotary_table_widths()
        };
        // The loss keeps the logits (`logits_bytes`, vocabulary-parallel), the labels and
        // (Megatron) the labels' mask; a fused cross-entropy keeps only an fp32 log-sum-exp
        // per token and the labels.
        let loss_per_token = if k.loss == 1.0 {
            4.0
        } else {
            k.logits_bytes * spec.vocab_size as f64 / t + f64::from(u8::from(megatron))
        } + 8.0;
        // A multi-token-prediction module: two norms, the projection's input (2h), a layer
        // like the last, and its own head and loss.
        let mtp_moe = spec.is_moe() && spec.num_layers > spec.first_dense_layers;
        let mtp = if korthikanti || spec.mtp_layers == 0 {
            (0.0, 0.0)
        } else {
            let (layer, fixed) = if recompute == Recompute::Full {
                (checkpoint, 0.0)
            } else {
                let (layer, fixed) = kept(mtp_moe);
                (layer.total(), fixed)
            };
            (
                acts.mtp_inputs() + layer + acts.head() + loss_per_token,
                fixed,
            )
        };
        let comm_per_token = if korthikanti {
            0.0
        } else {
            acts.comm_buffers(k.ep, k.cp, CpComm::from_code(k.cp_comm))
        };
        let kv_fraction = c.kv_per_rank / spec.num_kv_heads as f64;
        let (mtp_dense, mtp_experts) = prep.mtp_layer.per_rank(t, k.ep, kv_fraction);
        Terms {
            tp_fit: tp_fit(spec, t),
            ep_fit: ep_fit(spec, k.ep),
            korthikanti,
            dense_acts,
            moe_acts,
            moe_fixed,
            checkpoint,
            working_dense,
            working_moe,
            embedding_per_token,
            rotary,
            head_per_token: acts.head() + loss_per_token,
            mtp,
            comm_per_token,
            dense_layer: prep.dense_layer.per_rank(t, k.ep, kv_fraction),
            moe_layer: prep.moe_layer.per_rank(t, k.ep, kv_fraction),
            mtp_module: (
                mtp_dense + prep.mtp_norms + prep.mtp_projection / t,
                mtp_experts,
            ),
            embedding_per_rank: prep.embedding / t,
        }
    }
}

/// What the stages of one valid configuration share.
struct Config<'a> {
    prep: &'a Prepared,
    l: &'a Layout,
    terms: &'a Terms,
    tokens: f64,
    /// Rotary tables kept per micro-batch (shared by the layers).
    rotary_per_mb: f64,
    working: f64,
    embedding_per_mb: f64,
    logits_per_mb: f64,
    /// Communication buffers of one layer (EP all-to-all, CP key/value exchange).
    comm: f64,
    /// One multi-token-prediction module's activations per micro-batch.
    mtp_per_mb: f64,
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
    fn new(prep: &'a Prepared, l: &'a Layout, terms: &'a Terms, stages: StageLayers) -> Self {
        let spec = &prep.spec;
        let tokens = l.micro_batch * cp_rank_tokens(l.seq_len, l.cp);
        let korthikanti = terms.korthikanti;
        // What depends on full recomputation is computed either way and chosen by
        // `full_recompute`, a mask rather than a branch.
        let full = full_recompute(l);
        let working = if korthikanti {
            0.0
        } else {
            let layer = |(per_token, fixed): (f64, f64)| tokens * per_token + fixed;
            let has_dense = !spec.is_moe() || spec.first_dense_layers > 0;
            let dense = if has_dense {
                layer(terms.working_dense)
            } else {
                0.0
            };
            let moe = if spec.is_moe() {
                layer(terms.working_moe)
            } else {
                0.0
            };
            let working = dense.max(moe);
            if full {
                working
            } else {
                0.0
            }
        };
        let rotary = terms.rotary.map_or(0.0, |widths| {
            rotary_tables(cp_rank_tokens(l.seq_len, l.cp), widths)
        });
        let dense_group = l.dp * l.cp;
        Config {
            prep,
            l,
            terms,
            tokens,
            rotary_per_mb: if full { 0.0 } else { rotary },
            working,
            embedding_per_mb: terms.embedding_per_token * tokens,
            logits_per_mb: if korthikanti {
                0.0
            } else {
                tokens * terms.head_per_token
            },
            // No buffer is no bytes, even for a token count that overflowed to infinity
            // (infinity x 0 would make the whole estimate NaN).
            comm: if terms.comm_per_token == 0.0 {
                0.0
            } else {
                tokens * terms.comm_per_token
            },
            mtp_per_mb: if korthikanti || spec.mtp_layers == 0 {
                0.0
            } else {
                tokens * terms.mtp.0 + terms.mtp.1
            },
            dense_group,
            expert_group: dense_group / l.ep,
            pp: l.pp as u64,
            vpp: l.vpp as u64,
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
        (count(dense), count(layers - dense))
    }

    /// The breakdown of `stage`, which holds `(n_dense, n_moe)` layers. Inlined, for the
    /// same reason as [`Config::new`].
    #[inline(always)]
    fn stage(&self, stage: u64, (n_dense, n_moe): (f64, f64)) -> Breakdown {
        let (prep, l, spec) = (self.prep, self.l, &self.prep.spec);
        let (pp, vpp) = (self.pp, self.vpp);
        let first = stage == 0;
        let last = stage == pp - 1;

        // Sharding of model states.
        let z = l.zero;
        // Divided by 1 below the threshold (exact): a choice of divisor is a mask, where a
        // branch on `zero`, which varies from cell to cell in a list, was mispredicted.
        let shard = |states: f64, threshold: f64, group: f64| {
            states / if z >= threshold { group } else { 1.0 }
        };
        let terms = self.terms;
        let mut dense_params = n_dense * terms.dense_layer.0 + n_moe * terms.moe_layer.0;
        let mut expert_params = n_dense * terms.dense_layer.1 + n_moe * terms.moe_layer.1;
        let mtp = if last { spec.mtp_layers as f64 } else { 0.0 };
        if first {
            dense_params += terms.embedding_per_rank + prep.positions;
        }
        if last {
            // A tied projection is the embedding itself unless the pipeline puts them on
            // different stages, where Megatron keeps a synchronized copy on the last one.
            let head = if spec.tied_embeddings && pp == 1 {
                0.0
            } else {
                terms.embedding_per_rank
            };
            dense_params += prep.final_norm + head;
            // Multi-token prediction runs on the last stage, which then needs the
            // embedding too (Megatron-LM builds it there when pp > 1).
            dense_params += mtp * terms.mtp_module.0;
            expert_params += mtp * terms.mtp_module.1;
            if mtp > 0.0 && pp > 1 {
                dense_params += terms.embedding_per_rank;
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
        let remaining = count(pp - stage);
        // With one stage, both forms give 1 (`m`, when set, is at least 1); `pp` varies
        // from cell to cell in a list, and a branch on it was mispredicted, as one on
        // whether `m` is set would be (the choice below is a mask).
        let in_flight = if vpp == 1 {
            let capped = remaining.min(m);
            if m > 0.0 {
                capped
            } else {
                remaining
            }
        } else {
            let chunks = 2.0 * (remaining - 1.0) + count((vpp - 1) * pp) + 1.0;
            let chunks = if m > 0.0 {
                chunks.min(m * count(vpp))
            } else {
                chunks
            };
            chunks / count(vpp)
        };
        let layer_tokens = self.tokens * in_flight;
        // What full recomputation keeps and what the other modes keep are both computed,
        // and `full_recompute` chooses.
        let full = full_recompute(l);
        let (d, e) = (&terms.dense_acts, &terms.moe_acts);
        let checkpoints = layer_tokens * (n_dense + n_moe) * terms.checkpoint;
        let attention = layer_tokens * (n_dense * d.attention + n_moe * e.attention)
            + in_flight * self.rotary_per_mb;
        let mlp =
            layer_tokens * (n_dense * d.mlp + n_moe * e.mlp) + in_flight * n_moe * terms.moe_fixed;
        let norm = layer_tokens * (n_dense * d.norm + n_moe * e.norm);
        let kept = |x: f64| if full { 0.0 } else { x };
        let act_attention = kept(attention);
        let act_mlp = kept(mlp);
        let act_norm = kept(norm);
        let act_checkpoints = if full { checkpoints } else { 0.0 };
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
            stage: count(stage),
            layers: n_dense + n_moe,
            cpu_optimizer,
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// `ceil` is `f64::ceil`, except that what rounds up to zero is +0.0 (as the byte
    /// counts' integer round trip gave).
    fn expected_ceil(x: f64) -> f64 {
        let c = x.ceil();
        if c == 0.0 {
            0.0
        } else {
            c
        }
    }

    #[test]
    fn ceil_of_edge_values() {
        let edges = [
            0.0,
            -0.0,
            0.5,
            -0.5,
            1.0,
            1.5,
            2.5,
            -2.5,
            TWO_POW_52 - 0.5,
            TWO_POW_52,
            TWO_POW_52 + 1.0,
            -TWO_POW_52 + 0.5,
            2f64.powi(63),
            9.0e18,
            1e300,
            f64::MAX,
            f64::MIN_POSITIVE,
            5e-324,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ];
        for x in edges {
            assert_eq!(ceil(x).to_bits(), expected_ceil(x).to_bits(), "{x}");
        }
        assert!(ceil(f64::NAN).is_nan());
    }

    proptest! {
        #[test]
        fn ceil_is_the_ceiling(x in any::<f64>(), whole in -(1i64 << 53)..(1i64 << 53)) {
            prop_assume!(!x.is_nan());
            prop_assert_eq!(ceil(x).to_bits(), expected_ceil(x).to_bits());
            let near = whole as f64;
            for y in [near, near + 0.25, near - 0.25, near / 3.0, near * 1e-9] {
                prop_assert_eq!(ceil(y).to_bits(), expected_ceil(y).to_bits(), "{}", y);
            }
        }
    }
}

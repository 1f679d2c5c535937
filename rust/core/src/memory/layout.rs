//! The per-configuration inputs of an estimate and the reasons a configuration is invalid.
//!
//! Every field is an `f64` so that a grid can broadcast any of them; integer fields are
//! checked to hold whole numbers. Names and order are part of the binding contract
//! ([`LAYOUT_FIELDS`]).

use crate::memory::numeric::is_whole_in;

/// Activation recomputation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recompute {
    None,
    /// The attention core and the activation functions.
    Selective,
    Full,
    /// Megatron-Core's selective recomputation of the modules named in
    /// `recompute_modules`; `core_attn` alone (code 3) is its default.
    Modules(Modules),
}

/// A set of Megatron-Core modules recomputed in backward (`recompute_modules`), one bit
/// each; its `recompute` code is 2 plus the bits, so that `core_attn` alone is 3.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Modules(u8);

impl Modules {
    /// The attention core (`core_attn`).
    pub const CORE_ATTN: u8 = 1;
    /// A dense layer's MLP (`mlp`; not the MoE layers').
    pub const MLP: u8 = 2;
    /// The norms that run as modules of their own (`layernorm`).
    pub const LAYERNORM: u8 = 4;
    /// A MoE layer: router, dispatch, experts (`moe`).
    pub const MOE: u8 = 8;
    /// The shared experts of a MoE layer (`shared_experts`).
    pub const SHARED_EXPERTS: u8 = 16;
    /// MLA's up-projections (`mla_up_proj`).
    pub const MLA_UP_PROJ: u8 = 32;
    /// The routed experts' activation function (`moe_act`).
    pub const MOE_ACT: u8 = 64;
    /// The bits of every module.
    pub const ALL: u8 = 127;

    /// No module.
    pub const NONE: Modules = Modules(0);

    /// The bits of the modules.
    pub fn bits(self) -> u8 {
        self.0
    }

    /// Whether `module` (one of the constants) is recomputed.
    pub fn has(self, module: u8) -> bool {
        self.0 & module != 0
    }
}

/// The largest `recompute` code: every Megatron-Core module.
pub const MAX_RECOMPUTE_CODE: f64 = 2.0 + Modules::ALL as f64;

impl Recompute {
    /// The mode of a `recompute` code (0 to [`MAX_RECOMPUTE_CODE`]; validated before).
    pub fn from_code(code: f64) -> Self {
        match code as u8 {
            1 => Recompute::Selective,
            2 => Recompute::Full,
            code @ 3.. => Recompute::Modules(Modules((code - 2) & Modules::ALL)),
            _ => Recompute::None,
        }
    }

    /// The Megatron-Core modules recomputed ([`Modules::NONE`] for the other modes).
    pub fn modules(self) -> Modules {
        match self {
            Recompute::Modules(modules) => modules,
            _ => Modules::NONE,
        }
    }
}

/// Which activation formula to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActivationModel {
    /// Today's blocks, tensor by tensor (see `estimate.rs`).
    Modern,
    /// Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models".
    Korthikanti,
}

impl ActivationModel {
    /// The model of an `activation_model` code (0 or 1; validated before).
    pub fn from_code(code: f64) -> Self {
        if code == 1.0 {
            ActivationModel::Korthikanti
        } else {
            ActivationModel::Modern
        }
    }
}

/// Defines [`Layout`], its field names in order ([`LAYOUT_FIELDS`]), its defaults, the
/// rule of each field's value ([`FIELD_RULES`]) and the access by index a grid uses: one
/// list of the fields, so that names, order, defaults and checks cannot drift apart.
macro_rules! layout {
    ($($(#[doc = $doc:literal])* $index:literal $name:ident = $default:literal, $rule:ident $reason:ident,)*) => {
        /// Names of the layout fields, in the order [`Layout::from_values`] reads them.
        pub const LAYOUT_FIELDS: [&str; N_LAYOUT_FIELDS] = [$(stringify!($name)),*];

        /// Number of layout fields.
        pub const N_LAYOUT_FIELDS: usize = [$($index),*].len();

        /// The rule each field's value follows, and the reason reported when it breaks it.
        pub(crate) const FIELD_RULES: [(FieldRule, Invalid); N_LAYOUT_FIELDS] =
            [$((FieldRule::$rule, Invalid::$reason)),*];

        /// One configuration: parallel layout, batch shape, precisions and modelling options.
        #[derive(Debug, Clone, Copy, PartialEq)]
        pub struct Layout {
            $($(#[doc = $doc])* pub $name: f64,)*
        }

        impl Default for Layout {
            fn default() -> Self {
                Layout { $($name: $default,)* }
            }
        }

        impl Layout {
            /// Set field `field` (an index into [`LAYOUT_FIELDS`]; others are ignored).
            ///
            /// A grid updates the fields that change from one cell to the next in place.
            #[inline]
            pub fn set(&mut self, field: usize, value: f64) {
                match field {
                    $($index => self.$name = value,)*
                    _ => {}
                }
            }

            /// The values in [`LAYOUT_FIELDS`] order.
            pub fn to_values(&self) -> [f64; N_LAYOUT_FIELDS] {
                [$(self.$name),*]
            }

            /// Build a layout from values in [`LAYOUT_FIELDS`] order.
            #[inline]
            pub fn from_values(v: &[f64; N_LAYOUT_FIELDS]) -> Self {
                Layout { $($name: v[$index],)* }
            }
        }
    };
}

layout! {
    0 seq_len = 4096.0, PositiveInteger SeqLen,
    1 micro_batch = 1.0, PositiveInteger MicroBatch,
    2 dp = 1.0, PositiveInteger Dp,
    3 tp = 1.0, PositiveInteger Tp,
    4 pp = 1.0, PositiveInteger Pp,
    5 cp = 1.0, PositiveInteger Cp,
    6 ep = 1.0, PositiveInteger Ep,
    /// Virtual pipeline stages (model chunks) per rank; 1 is plain 1F1B.
    7 vpp = 1.0, PositiveInteger Vpp,
    8 zero = 0.0, FourWay Zero,
    9 sequence_parallel = 0.0, Flag SequenceParallel,
    /// A [`Recompute`] code: 0 none, 1 selective, 2 full, 2 + [`Modules`] bits.
    10 recompute = 0.0, RecomputeCode Recompute,
    /// Micro-batches per optimizer step; 0 means enough to fill the pipeline.
    11 grad_accum_steps = 0.0, Count GradAccumSteps,
    12 param_bytes = 2.0, NonNegative Bytes,
    13 grad_bytes = 2.0, NonNegative Bytes,
    /// An extra gradient accumulation buffer per parameter (4 for fp32 accumulation).
    14 grad_buffer_bytes = 0.0, NonNegative Bytes,
    /// Master weights kept by the optimizer (4 for fp32 master weights).
    15 master_bytes = 4.0, NonNegative Bytes,
    /// All optimizer moments per parameter (8 for AdamW in fp32).
    16 optimizer_state_bytes = 8.0, NonNegative Bytes,
    17 activation_bytes = 2.0, NonNegative Bytes,
    18 logits_bytes = 4.0, NonNegative Bytes,
    /// 0 modern, 1 korthikanti.
    19 activation_model = 0.0, Flag ActivationModel,
    /// 0 flash (no s x s scores kept), 1 eager (softmax probabilities kept).
    20 attention = 0.0, Flag Attention,
    /// 1 when the SwiGLU product is a fused kernel that saves only its two inputs.
    21 fused_swiglu = 0.0, Flag FusedSwiglu,
    /// Constant bytes added to every GPU (CUDA context, communication buffers...).
    22 overhead_bytes = 0.0, NonNegative Bytes,
    /// Layers of the first pipeline stage; 0 lets `pipeline_split` decide.
    23 first_stage_layers = 0.0, Count FirstStageLayers,
    /// Layers of the last pipeline stage; 0 lets `pipeline_split` decide.
    24 last_stage_layers = 0.0, Count LastStageLayers,
    /// A [`PipelineSplit`](crate::memory::PipelineSplit) code: 0 even, 1 auto, 2 embedding,
    /// 3 loss, 4 embedding and loss counted as layers.
    25 pipeline_split = 0.0, PipelineSplit PipelineSplit,
    /// Expert capacity as a multiple of the balanced load, each expert's input padded to
    /// it (`k * moe_capacity_factor` routed copies per token); 0 for dropless routing with
    /// a balanced load (`k` copies).
    26 moe_capacity_factor = 0.0, NonNegative MoeCapacityFactor,
    /// Context-parallel exchange of keys and values: 0 ring (p2p), 1 all-gather, 2 all-to-all.
    27 cp_comm = 0.0, ThreeWay CpComm,
    /// 0: logits kept for the loss; 1: fused (chunked) cross-entropy keeps no logits.
    28 loss = 0.0, Flag Loss,
    /// 1: FP8 linear layers, whose saved inputs are kept in FP8 (1 byte).
    29 fp8 = 0.0, Flag Fp8,
    /// Fraction of the optimizer state kept in CPU memory (0 to 1).
    30 optimizer_offload = 0.0, Fraction OptimizerOffload,
}

impl Layout {
    pub fn recompute_mode(&self) -> Recompute {
        Recompute::from_code(self.recompute)
    }

    pub fn activation_model_kind(&self) -> ActivationModel {
        ActivationModel::from_code(self.activation_model)
    }
}

/// Defines [`Invalid`], the list of every reason in code order ([`INVALID_REASONS`]) and
/// each reason's message, from one list.
macro_rules! invalid {
    ($($(#[doc = $doc:literal])* $variant:ident => $message:expr,)*) => {
        /// Why a configuration cannot be estimated. The discriminant (from 1, in the order
        /// listed) is the code a grid reports.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(u8)]
        pub enum Invalid {
            $($(#[doc = $doc])* $variant,)*
        }

        /// Every invalid reason, in code order (code = index + 1).
        pub const INVALID_REASONS: [Invalid; [$(Invalid::$variant),*].len()] = [$(Invalid::$variant),*];

        impl Invalid {
            /// A message naming the parameter at fault.
            pub fn message(self) -> &'static str {
                match self {
                    $(Invalid::$variant => $message,)*
                }
            }
        }
    };
}

invalid! {
    SeqLen => "seq_len must be a positive integer",
    MicroBatch => "micro_batch must be a positive integer",
    Dp => "dp must be a positive integer",
    Tp => "tp must be a positive integer",
    Pp => "pp must be a positive integer",
    Cp => "cp must be a positive integer",
    Ep => "ep must be a positive integer",
    Vpp => "vpp must be a positive integer (1 unless pp > 1)",
    Zero => "zero must be 0, 1, 2 or 3",
    SequenceParallel => "sequence_parallel must be a boolean",
    Recompute => "recompute must be 'none', 'selective', 'full' or Megatron-Core modules joined \
        with '+' ('core_attn', 'mlp', 'layernorm', 'moe', 'shared_experts', \
        'mla_up_proj', 'moe_act')",
    GradAccumSteps => "grad_accum_steps must be a non-negative integer (0 or None: fills the pipeline)",
    Bytes => "byte sizes (dtypes, optimizer states, overhead_bytes) must be finite and \
        non-negative, and master_weights and fp32_grad_accum booleans",
    ActivationModel => "activation_model must be 'modern' or 'korthikanti'",
    Attention => "attention must be 'flash' or 'eager'",
    FusedSwiglu => "fused_swiglu must be a boolean",
    FirstStageLayers => "first_stage_layers must be a non-negative integer (0 or None: set by pipeline_split)",
    LastStageLayers => "last_stage_layers must be a non-negative integer (0 or None: set by pipeline_split)",
    PipelineSplit => "pipeline_split must be 'even', 'auto', 'embedding', 'loss' or 'embedding_and_loss'",
    MoeCapacityFactor => "moe_capacity_factor must be a positive number (0 or None: dropless routing)",
    CpComm => "cp_comm must be 'p2p', 'all_gather' or 'a2a'",
    Loss => "loss must be 'standard' or 'fused'",
    Fp8 => "fp8 must be a boolean",
    OptimizerOffload => "optimizer_offload must be a fraction between 0 and 1",
    TpHeads => "tp must divide num_heads",
    TpKvHeads => "tp must divide num_kv_heads or be a multiple of it",
    TpFfn => "tp must divide ffn_size (and moe_ffn_size)",
    PpLayers => "the layers do not split over pp * vpp pipeline chunks: pp * vpp must divide \
        num_layers, or first_stage_layers/last_stage_layers (multiples of vpp, with pp > 1 \
        and pipeline_split='even') must leave a multiple of the middle stages, or \
        pipeline_split must count the embedding/loss so that the units divide \
        (pipeline_split='auto' takes layers off the first and last stages)",
    EpExperts => "ep must divide num_experts",
    EpDense => "ep must be 1 for a dense model",
    EpDpCp => "ep must divide dp * cp (experts are sharded inside the data-parallel group)",
    /// The estimate of a configuration that passed every other check is infinite or NaN:
    /// an input is so large that the bytes are past the largest `f64`.
    Overflow => "the estimate exceeds the range of a float (about 1.8e308 bytes): an input is too \
        large (seq_len, micro_batch, moe_capacity_factor, overhead_bytes or another byte \
        size)",
}

impl Invalid {
    /// The code stored in a grid's `reason` column (0 means valid).
    pub fn code(self) -> u8 {
        self as u8 + 1
    }
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

    /// [`FieldRule::accepts`] as numbers: the least and the largest value, and whether the
    /// value must be whole. A grid checks each value it reads against these, without a
    /// branch on the rule.
    #[inline]
    pub(crate) fn bounds(self) -> (f64, f64, bool) {
        let (low, high) = self.range();
        (
            low,
            high,
            !matches!(self, FieldRule::NonNegative | FieldRule::Fraction),
        )
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
/// follows, and the reason reported when a value breaks it (byte sizes for an index past
/// the fields).
pub(crate) fn field_rule(field: usize) -> (FieldRule, Invalid) {
    FIELD_RULES
        .get(field)
        .copied()
        .unwrap_or((FieldRule::NonNegative, Invalid::Bytes))
}

//! The per-configuration inputs of an estimate and the reasons a configuration is invalid.
//!
//! Every field is an `f64` so that a grid can broadcast any of them; integer fields are
//! checked to hold whole numbers. Names and order are part of the binding contract
//! ([`LAYOUT_FIELDS`]).

/// Names of the layout fields, in the order [`Layout::from_values`] reads them.
pub const LAYOUT_FIELDS: [&str; 31] = [
    "seq_len",
    "micro_batch",
    "dp",
    "tp",
    "pp",
    "cp",
    "ep",
    "vpp",
    "zero",
    "sequence_parallel",
    "recompute",
    "grad_accum_steps",
    "param_bytes",
    "grad_bytes",
    "grad_buffer_bytes",
    "master_bytes",
    "optimizer_state_bytes",
    "activation_bytes",
    "logits_bytes",
    "activation_model",
    "attention",
    "fused_swiglu",
    "overhead_bytes",
    "first_stage_layers",
    "last_stage_layers",
    "pipeline_split",
    "moe_capacity_factor",
    "cp_comm",
    "loss",
    "fp8",
    "optimizer_offload",
];

/// Number of layout fields.
pub const N_LAYOUT_FIELDS: usize = LAYOUT_FIELDS.len();

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

/// One configuration: parallel layout, batch shape, precisions and modelling options.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Layout {
    pub seq_len: f64,
    pub micro_batch: f64,
    pub dp: f64,
    pub tp: f64,
    pub pp: f64,
    pub cp: f64,
    pub ep: f64,
    /// Virtual pipeline stages (model chunks) per rank; 1 is plain 1F1B.
    pub vpp: f64,
    pub zero: f64,
    pub sequence_parallel: f64,
    /// 0 none, 1 selective, 2 full, 3 core_attn.
    pub recompute: f64,
    /// Micro-batches per optimizer step; 0 means enough to fill the pipeline.
    pub grad_accum_steps: f64,
    pub param_bytes: f64,
    pub grad_bytes: f64,
    /// An extra gradient accumulation buffer per parameter (4 for fp32 accumulation).
    pub grad_buffer_bytes: f64,
    /// Master weights kept by the optimizer (4 for fp32 master weights).
    pub master_bytes: f64,
    /// All optimizer moments per parameter (8 for AdamW in fp32).
    pub optimizer_state_bytes: f64,
    pub activation_bytes: f64,
    pub logits_bytes: f64,
    /// 0 modern, 1 korthikanti.
    pub activation_model: f64,
    /// 0 flash (no s x s scores kept), 1 eager (softmax probabilities kept).
    pub attention: f64,
    /// 1 when the SwiGLU product is a fused kernel that saves only its two inputs.
    pub fused_swiglu: f64,
    /// Constant bytes added to every GPU (CUDA context, communication buffers...).
    pub overhead_bytes: f64,
    /// Layers of the first pipeline stage; 0 lets `pipeline_split` decide.
    pub first_stage_layers: f64,
    /// Layers of the last pipeline stage; 0 lets `pipeline_split` decide.
    pub last_stage_layers: f64,
    /// A [`PipelineSplit`](crate::memory::PipelineSplit) code: 0 even, 1 auto, 2 embedding,
    /// 3 loss, 4 embedding and loss counted as layers.
    pub pipeline_split: f64,
    /// Expert capacity as a multiple of the balanced load, each expert's input padded to
    /// it (`k * moe_capacity_factor` routed copies per token); 0 for dropless routing with
    /// a balanced load (`k` copies).
    pub moe_capacity_factor: f64,
    /// Context-parallel exchange of keys and values: 0 ring (p2p), 1 all-gather, 2 all-to-all.
    pub cp_comm: f64,
    /// 0: logits kept for the loss; 1: fused (chunked) cross-entropy keeps no logits.
    pub loss: f64,
    /// 1: FP8 linear layers, whose saved inputs are kept in FP8 (1 byte).
    pub fp8: f64,
    /// Fraction of the optimizer state kept in CPU memory (0 to 1).
    pub optimizer_offload: f64,
}

impl Default for Layout {
    fn default() -> Self {
        Layout {
            seq_len: 4096.0,
            micro_batch: 1.0,
            dp: 1.0,
            tp: 1.0,
            pp: 1.0,
            cp: 1.0,
            ep: 1.0,
            vpp: 1.0,
            zero: 0.0,
            sequence_parallel: 0.0,
            recompute: 0.0,
            grad_accum_steps: 0.0,
            param_bytes: 2.0,
            grad_bytes: 2.0,
            grad_buffer_bytes: 0.0,
            master_bytes: 4.0,
            optimizer_state_bytes: 8.0,
            activation_bytes: 2.0,
            logits_bytes: 4.0,
            activation_model: 0.0,
            attention: 0.0,
            fused_swiglu: 0.0,
            overhead_bytes: 0.0,
            first_stage_layers: 0.0,
            last_stage_layers: 0.0,
            pipeline_split: 0.0,
            moe_capacity_factor: 0.0,
            cp_comm: 0.0,
            loss: 0.0,
            fp8: 0.0,
            optimizer_offload: 0.0,
        }
    }
}

impl Layout {
    /// Build a layout from values in [`LAYOUT_FIELDS`] order.
    pub fn from_values(v: &[f64; N_LAYOUT_FIELDS]) -> Self {
        let mut layout = Layout::default();
        for (field, &value) in v.iter().enumerate() {
            layout.set(field, value);
        }
        layout
    }

    /// Set field `field` (an index into [`LAYOUT_FIELDS`]; others are ignored).
    ///
    /// A grid updates the fields that change from one cell to the next in place.
    #[inline]
    pub fn set(&mut self, field: usize, value: f64) {
        Layout::set_all(std::slice::from_mut(self), field, &[value]);
    }

    /// Set field `field` of each layout to its value in `values` (a column of a list of
    /// configurations): one branch on the field for the whole column.
    #[inline(always)]
    pub fn set_all(layouts: &mut [Layout], field: usize, values: &[f64]) {
        macro_rules! each {
            ($($index:literal $name:ident)*) => {
                match field {
                    $($index => {
                        for (layout, &x) in layouts.iter_mut().zip(values) {
                            layout.$name = x;
                        }
                    })*
                    _ => {}
                }
            };
        }
        each!(0 seq_len 1 micro_batch 2 dp 3 tp 4 pp 5 cp 6 ep 7 vpp 8 zero 9 sequence_parallel 10 recompute 11 grad_accum_steps 12 param_bytes 13 grad_bytes 14 grad_buffer_bytes 15 master_bytes 16 optimizer_state_bytes 17 activation_bytes 18 logits_bytes 19 activation_model 20 attention 21 fused_swiglu 22 overhead_bytes 23 first_stage_layers 24 last_stage_layers 25 pipeline_split 26 moe_capacity_factor 27 cp_comm 28 loss 29 fp8 30 optimizer_offload);
    }

    /// The values in [`LAYOUT_FIELDS`] order.
    pub fn to_values(&self) -> [f64; N_LAYOUT_FIELDS] {
        [
            self.seq_len,
            self.micro_batch,
            self.dp,
            self.tp,
            self.pp,
            self.cp,
            self.ep,
            self.vpp,
            self.zero,
            self.sequence_parallel,
            self.recompute,
            self.grad_accum_steps,
            self.param_bytes,
            self.grad_bytes,
            self.grad_buffer_bytes,
            self.master_bytes,
            self.optimizer_state_bytes,
            self.activation_bytes,
            self.logits_bytes,
            self.activation_model,
            self.attention,
            self.fused_swiglu,
            self.overhead_bytes,
            self.first_stage_layers,
            self.last_stage_layers,
            self.pipeline_split,
            self.moe_capacity_factor,
            self.cp_comm,
            self.loss,
            self.fp8,
            self.optimizer_offload,
        ]
    }

    pub fn recompute_mode(&self) -> Recompute {
        Recompute::from_code(self.recompute)
    }

    pub fn activation_model_kind(&self) -> ActivationModel {
        ActivationModel::from_code(self.activation_model)
    }
}

/// Why a configuration cannot be estimated. The discriminant is the code a grid reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Invalid {
    SeqLen = 1,
    MicroBatch,
    Dp,
    Tp,
    Pp,
    Cp,
    Ep,
    Vpp,
    Zero,
    SequenceParallel,
    Recompute,
    GradAccumSteps,
    Bytes,
    ActivationModel,
    Attention,
    FusedSwiglu,
    FirstStageLayers,
    LastStageLayers,
    PipelineSplit,
    MoeCapacityFactor,
    CpComm,
    Loss,
    Fp8,
    OptimizerOffload,
    TpHeads,
    TpKvHeads,
    TpFfn,
    PpLayers,
    EpExperts,
    EpDense,
    EpDpCp,
    /// The estimate of a configuration that passed every other check is infinite or NaN:
    /// an input is so large that the bytes are past the largest `f64`.
    Overflow,
}

/// Every invalid reason, in code order (code = index + 1).
pub const INVALID_REASONS: [Invalid; 32] = [
    Invalid::SeqLen,
    Invalid::MicroBatch,
    Invalid::Dp,
    Invalid::Tp,
    Invalid::Pp,
    Invalid::Cp,
    Invalid::Ep,
    Invalid::Vpp,
    Invalid::Zero,
    Invalid::SequenceParallel,
    Invalid::Recompute,
    Invalid::GradAccumSteps,
    Invalid::Bytes,
    Invalid::ActivationModel,
    Invalid::Attention,
    Invalid::FusedSwiglu,
    Invalid::FirstStageLayers,
    Invalid::LastStageLayers,
    Invalid::PipelineSplit,
    Invalid::MoeCapacityFactor,
    Invalid::CpComm,
    Invalid::Loss,
    Invalid::Fp8,
    Invalid::OptimizerOffload,
    Invalid::TpHeads,
    Invalid::TpKvHeads,
    Invalid::TpFfn,
    Invalid::PpLayers,
    Invalid::EpExperts,
    Invalid::EpDense,
    Invalid::EpDpCp,
    Invalid::Overflow,
];

impl Invalid {
    /// The code stored in a grid's `reason` column (0 means valid).
    pub fn code(self) -> u8 {
        self as u8
    }

    /// A message naming the parameter at fault.
    pub fn message(self) -> &'static str {
        match self {
            Invalid::SeqLen => "seq_len must be a positive integer",
            Invalid::MicroBatch => "micro_batch must be a positive integer",
            Invalid::Dp => "dp must be a positive integer",
            Invalid::Tp => "tp must be a positive integer",
            Invalid::Pp => "pp must be a positive integer",
            Invalid::Cp => "cp must be a positive integer",
            Invalid::Ep => "ep must be a positive integer",
            Invalid::Vpp => "vpp must be a positive integer (1 unless pp > 1)",
            Invalid::Zero => "zero must be 0, 1, 2 or 3",
            Invalid::SequenceParallel => "sequence_parallel must be a boolean",
            Invalid::Recompute => {
                "recompute must be 'none', 'selective', 'full' or Megatron-Core modules joined \
                 with '+' ('core_attn', 'mlp', 'layernorm', 'moe', 'shared_experts', \
                 'mla_up_proj', 'moe_act')"
            }
            Invalid::GradAccumSteps => {
                "grad_accum_steps must be a non-negative integer (0 or None: fills the pipeline)"
            }
            Invalid::Bytes => {
                "byte sizes (dtypes, optimizer states, overhead_bytes) must be finite and \
                 non-negative, and master_weights and fp32_grad_accum booleans"
            }
            Invalid::ActivationModel => "activation_model must be 'modern' or 'korthikanti'",
            Invalid::Attention => "attention must be 'flash' or 'eager'",
            Invalid::FusedSwiglu => "fused_swiglu must be a boolean",
            Invalid::FirstStageLayers => {
                "first_stage_layers must be a non-negative integer (0 or None: set by pipeline_split)"
            }
            Invalid::LastStageLayers => {
                "last_stage_layers must be a non-negative integer (0 or None: set by pipeline_split)"
            }
            Invalid::PipelineSplit => {
                "pipeline_split must be 'even', 'auto', 'embedding', 'loss' or 'embedding_and_loss'"
            }
            Invalid::MoeCapacityFactor => {
                "moe_capacity_factor must be a positive number (0 or None: dropless routing)"
            }
            Invalid::CpComm => "cp_comm must be 'p2p', 'all_gather' or 'a2a'",
            Invalid::Loss => "loss must be 'standard' or 'fused'",
            Invalid::Fp8 => "fp8 must be a boolean",
            Invalid::OptimizerOffload => "optimizer_offload must be a fraction between 0 and 1",
            Invalid::TpHeads => "tp must divide num_heads",
            Invalid::TpKvHeads => "tp must divide num_kv_heads or be a multiple of it",
            Invalid::TpFfn => "tp must divide ffn_size (and moe_ffn_size)",
            Invalid::PpLayers => {
                "the layers do not split over pp * vpp pipeline chunks: pp * vpp must divide \
                 num_layers, or first_stage_layers/last_stage_layers (multiples of vpp, with pp > 1 \
                 and pipeline_split='even') must leave a multiple of the middle stages, or \
                 pipeline_split must count the embedding/loss so that the units divide \
                 (pipeline_split='auto' takes layers off the first and last stages)"
            }
            Invalid::EpExperts => "ep must divide num_experts",
            Invalid::EpDense => "ep must be 1 for a dense model",
            Invalid::EpDpCp => "ep must divide dp * cp (experts are sharded inside the data-parallel group)",
            Invalid::Overflow => {
                "the estimate exceeds the range of a float (about 1.8e308 bytes): an input is too \
                 large (seq_len, micro_batch, moe_capacity_factor, overhead_bytes or another byte \
                 size)"
            }
        }
    }
}

//! What the step-time model reads: a candidate layout, the model's constants and what it
//! needs of a spec, derived once.

use crate::memory::spec::ModelSpec;

/// Element-wise passes of one layer's forward, in tensors of the hidden size per token:
/// the two norms (read, write) and the two residual adds with their dropout (read two,
/// write).
pub(super) const HIDDEN_PASSES: f64 = 10.0;

/// The share of a collective hidden behind compute that the compute still loses to it:
/// NCCL runs each of its 16 to 32 channels as a thread block on its own streaming
/// multiprocessor (of 108 on an A100, 132 on an H100), and its traffic shares HBM.
pub const OVERLAP_TAX: f64 = 0.2;

/// One candidate layout as the model reads it. `first_layers`, `middle_layers` and
/// `last_layers` are the layers of the first stage, of the largest stage and of the last.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    pub dp: f64,
    pub tp: f64,
    pub pp: f64,
    pub cp: f64,
    pub ep: f64,
    pub vpp: f64,
    pub zero: f64,
    /// A `recompute` code of the layout field.
    pub recompute: f64,
    pub micro_batch: f64,
    pub grad_accum_steps: f64,
    pub first_layers: f64,
    pub middle_layers: f64,
    pub last_layers: f64,
}

/// The names of a [`Candidate`]'s fields, in the order of [`Candidate::from_values`].
pub const CANDIDATE_FIELDS: [&str; 13] = [
    "dp",
    "tp",
    "pp",
    "cp",
    "ep",
    "vpp",
    "zero",
    "recompute",
    "micro_batch",
    "grad_accum_steps",
    "first_layers",
    "middle_layers",
    "last_layers",
];

impl Candidate {
    /// A candidate from values in [`CANDIDATE_FIELDS`] order.
    pub fn from_values(v: [f64; 13]) -> Self {
        let [dp, tp, pp, cp, ep, vpp, zero, recompute, micro_batch, grad_accum_steps, first_layers, middle_layers, last_layers] =
            v;
        Candidate {
            dp,
            tp,
            pp,
            cp,
            ep,
            vpp,
            zero,
            recompute,
            micro_batch,
            grad_accum_steps,
            first_layers,
            middle_layers,
            last_layers,
        }
    }
}

/// The model's constants and switches.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Constants {
    /// Fraction of the dense peak that large matmuls and the attention core reach.
    pub efficiency: f64,
    /// Seconds of fixed cost per pass (forward or backward) of one layer over one
    /// micro-batch: kernel launches and synchronizations.
    pub layer_pass_overhead: f64,
    /// See [`OVERLAP_TAX`].
    pub overlap_tax: f64,
    /// Expert-parallel all-to-alls hidden behind another micro-batch's compute
    /// (DeepSeek-V3's DualPipe, Megatron-Core's `--overlap-moe-expert-parallel-comm`).
    pub overlap_ep_comm: bool,
    /// A token sent once to each remote node that hosts some of its experts (DeepEP).
    pub deduplicated_dispatch: bool,
}

impl Constants {
    /// The efficiency in (0, 1], the overhead and the tax finite and non-negative, else
    /// an error naming the constant.
    pub fn check(&self) -> crate::error::Result<()> {
        let efficiency = super::hardware::positive("compute_efficiency", self.efficiency)?;
        if efficiency > 1.0 {
            return Err(crate::error::Error::invalid(format!(
                "compute_efficiency must be at most 1, got {efficiency}"
            )));
        }
        for (name, value) in [
            ("layer_pass_overhead", self.layer_pass_overhead),
            ("overlap_tax", self.overlap_tax),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(crate::error::Error::invalid(format!(
                    "{name} must be a non-negative number, got {}",
                    super::hardware::shown(value)
                )));
            }
        }
        Ok(())
    }
}

/// Parameters of a layer: replicated, tensor-parallel, key/value, routed experts.
pub(super) type Row = [f64; 4];

/// What the model needs of a spec, derived once.
#[derive(Debug, Clone)]
pub struct SpecTerms {
    pub(super) spec: ModelSpec,
    pub(super) dense_row: Row,
    pub(super) moe_row: Row,
    pub(super) embedding: f64,
    pub(super) projection: f64,
    pub(super) active_params: f64,
    /// Query-key plus value dimensions of a head.
    pub(super) head_dims: f64,
}

impl SpecTerms {
    /// The spec must have been validated.
    pub fn new(spec: &ModelSpec) -> Self {
        let row = |p: crate::memory::LayerParams| [p.replicated, p.tp_split, p.kv, p.experts];
        let moe_index = spec
            .first_dense_layers
            .min(spec.num_layers.saturating_sub(1));
        SpecTerms {
            spec: spec.clone(),
            dense_row: row(spec.layer_params(0, false)),
            moe_row: row(spec.layer_params(moe_index, false)),
            embedding: spec.embedding_params().0,
            projection: spec.head_params(false).1,
            active_params: spec.active_params(),
            head_dims: if spec.is_mla() {
                (spec.qk_nope_head_dim + spec.qk_rope_head_dim + spec.v_head_dim) as f64
            } else {
                (2 * spec.head_dim) as f64
            },
        }
    }
}

/// Python's `a or b` for a count: `b` where `a` is 0.
pub(super) fn or(a: u64, b: u64) -> f64 {
    if a == 0 {
        b as f64
    } else {
        a as f64
    }
}

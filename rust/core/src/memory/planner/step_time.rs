//! The planner's step-time model: seconds per optimizer step of a parallel layout.
//!
//! Standard formulas on stated hardware figures ([`Hardware`]) and two constants fitted
//! once on 19 published runs (the efficiency large matmuls reach and a fixed cost per
//! layer pass, kept with the fit in `tokenbatch/memory/steptime_fit.py`). The formulas,
//! their sources and what is not modelled are listed in `docs/memory.md`; in short:
//! matmuls by roofline (FLOPs at the peak times the efficiency, or their weights at the
//! HBM bandwidth, plus their inputs and outputs at the HBM bandwidth); element-wise
//! kernels, the loss and the optimizer step at the HBM bandwidth; a fixed overhead per
//! layer pass; the pipeline bubble of interleaved 1F1B; ring collectives with NCCL's
//! latency model for tensor, context, expert and data parallelism, on the links their
//! ranks share (ranks laid out tensor-parallel first, then context-, then data-parallel,
//! then pipeline stages, as Megatron-LM does).

use crate::memory::layout::{Layout, Modules};
use crate::memory::spec::{FfnType, ModelSpec};

use super::hardware::Hardware;

/// The parts of a step's time, in the order [`StepTime::parts`] gives them.
pub const TIME_PARTS: [&str; 10] = [
    "compute",
    "elementwise",
    "overhead",
    "optimizer",
    "bubble",
    "tp_comm",
    "cp_comm",
    "ep_comm",
    "pp_comm",
    "dp_comm",
];

/// Element-wise passes of one layer's forward, in tensors of the hidden size per token:
/// the two norms (read, write) and the two residual adds with their dropout (read two,
/// write).
const HIDDEN_PASSES: f64 = 10.0;

/// NCCL's cost model for ring collectives with its Simple protocol (NCCL
/// `src/graph/tuning.cc`): a base latency per collective and one per step, by link.
const BASE_LATENCY: f64 = 8.4e-6;
const NVLINK_STEP: f64 = 3.4e-6;
const NETWORK_STEP: f64 = 9.6e-6;

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

/// Seconds per step and its parts (see [`TIME_PARTS`]), and the model FLOPs of a step.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepTime {
    pub parts: [f64; 10],
    pub total: f64,
    pub model_flops: f64,
}

/// Parameters of a layer: replicated, tensor-parallel, key/value, routed experts.
type Row = [f64; 4];

/// What the model needs of a spec, derived once.
#[derive(Debug, Clone)]
pub struct SpecTerms {
    spec: ModelSpec,
    dense_row: Row,
    moe_row: Row,
    embedding: f64,
    projection: f64,
    active_params: f64,
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
        }
    }
}

/// Python's `a or b` for a count: `b` where `a` is 0.
fn or(a: u64, b: u64) -> f64 {
    if a == 0 {
        b as f64
    } else {
        a as f64
    }
}

/// Latency of a ring collective over `group` ranks, `on_node` of them per node.
fn steps_latency(group: f64, on_node: f64) -> f64 {
    let nodes = group / group.min(on_node);
    if group > 1.0 {
        BASE_LATENCY + (group - nodes) * NVLINK_STEP + (nodes - 1.0) * NETWORK_STEP
    } else {
        0.0
    }
}

/// Bandwidth of a group whose ranks are `stride` apart: intra-node if it fits in one.
fn group_bandwidth(group: f64, stride: f64, hw: &Hardware) -> f64 {
    if group * stride <= hw.gpus_per_node as f64 {
        hw.intra_node_bandwidth
    } else {
        hw.inter_node_bandwidth
    }
}

/// Ranks `stride` apart that share a node (at least 1).
fn on_node(stride: f64, hw: &Hardware) -> f64 {
    1.0f64.max((hw.gpus_per_node as f64 / stride).floor())
}

/// A ring all-gather or reduce-scatter of `bytes` per rank over `group` ranks that are
/// `stride` apart: NCCL's latency plus the bandwidth term.
fn ring(bytes: f64, group: f64, stride: f64, hw: &Hardware) -> f64 {
    steps_latency(group, on_node(stride, hw))
        + (group - 1.0) / group * bytes / group_bandwidth(group, stride, hw)
}

/// The seconds per step of `c`, with `inputs` the memory estimate's fields (dtypes,
/// `fp8`, `attention`, `moe_capacity_factor`, `cp_comm`...; its layout fields unread).
pub fn step_time(
    terms: &SpecTerms,
    c: &Candidate,
    hw: &Hardware,
    seq_len: f64,
    inputs: &Layout,
    k: &Constants,
) -> StepTime {
    let spec = &terms.spec;
    let (dp, tp, pp, cp, ep, vpp) = (c.dp, c.tp, c.pp, c.cp, c.ep, c.vpp);
    let (recompute, m) = (c.recompute, c.grad_accum_steps);
    let full = recompute == 2.0;
    let fp8 = inputs.fp8 == 1.0;
    let e = inputs.activation_bytes;
    let dispatch_bytes = if fp8 { 1.0 } else { e };
    let weight_bytes = if fp8 { 1.0 } else { inputs.param_bytes };
    let matmul_peak = (if fp8 { hw.fp8_flops } else { hw.peak_flops }) * k.efficiency;
    let attention_peak = hw.peak_flops * k.efficiency;
    let hbm = hw.memory_bandwidth;
    let h = spec.hidden_size as f64;
    let num_heads = spec.num_heads as f64;
    let kv_heads = spec.num_kv_heads as f64;
    let head_size = spec.head_dim as f64;
    let (nope, rope, v_dim) = (
        spec.qk_nope_head_dim as f64,
        spec.qk_rope_head_dim as f64,
        spec.v_head_dim as f64,
    );
    let (q_lora, kv_lora) = (spec.q_lora_rank as f64, spec.kv_lora_rank as f64);
    let mla = spec.is_mla();
    let moe = spec.is_moe();
    let tokens = c.micro_batch * seq_len / cp;
    let kv_fraction = 1.0f64.min(1.0f64.max(kv_heads / tp) / kv_heads);
    let local_weights = |row: &Row| row[0] + row[1] / tp + row[2] * kv_fraction;

    // Forward and backward of matmuls holding `weights`, over `rows` tokens whose inputs
    // and outputs are `widths` wide in all (each pass reads its inputs and writes its
    // outputs once, on top of the roofline); `used` weights do the FLOPs.
    let matmul_used = |weights: f64, rows: f64, widths: f64, used: f64| {
        3.0 * ((2.0 * used * rows / matmul_peak).max(weights * weight_bytes / hbm)
            + rows * widths * e / hbm)
    };
    let matmul = |weights: f64, rows: f64, widths: f64| matmul_used(weights, rows, widths, weights);

    // Inputs plus outputs of each matmul, per token (the tensor-parallel side split).
    let heads_local = num_heads / tp;
    let kv_local = kv_heads * kv_fraction;
    let gated = spec.ffn_type == FfnType::SwiGlu;
    let mlp_widths =
        |width: f64| (if gated { 2.0 } else { 1.0 }) * width / tp + width / tp + 2.0 * h;
    let (up_widths, attention_widths, mut rotary) = if mla {
        let query = nope + rope;
        let up_widths = (if spec.q_lora_rank > 0 {
            q_lora + heads_local * query
        } else {
            0.0
        }) + kv_lora
            + heads_local * (nope + v_dim);
        let attention_widths = (if spec.q_lora_rank > 0 {
            h + q_lora
        } else {
            h + heads_local * query
        }) + h
            + kv_lora
            + rope
            + up_widths
            + heads_local * v_dim
            + h;
        (up_widths, attention_widths, heads_local * rope + rope)
    } else {
        (
            0.0,
            2.0 * h + (2.0 * heads_local + 2.0 * kv_local) * head_size,
            (heads_local + kv_local) * head_size,
        )
    };
    if spec.learned_positions > 0 {
        rotary = 0.0;
    }

    // One layer, forward and backward, per micro-batch (without recomputation).
    let head_dims = if mla {
        (spec.qk_nope_head_dim + spec.qk_rope_head_dim + spec.v_head_dim) as f64
    } else {
        (2 * spec.head_dim) as f64
    };
    // Eager attention computes every score, masked or not, and moves the s x s scores
    // through softmax and dropout (Megatron-LM's fused softmax): written by the first
    // matmul, read and written by softmax and by dropout with a 1-byte mask, read by the
    // second; backward twice that.
    let eager = inputs.attention == 1.0;
    let attention_fwd_flops =
        tokens * seq_len * heads_local * head_dims * if eager { 2.0 } else { 1.0 };
    let score_bytes = if eager {
        tokens * seq_len * heads_local * (6.0 * e + 1.0)
    } else {
        0.0
    };
    let attention_core = 3.0 * attention_fwd_flops / attention_peak;
    let ffn = spec.ffn_size as f64;
    let dense_layer = matmul(
        local_weights(&terms.dense_row),
        tokens,
        attention_widths + mlp_widths(ffn),
    ) + attention_core;
    let mlp_matrices = if gated { 3.0 } else { 2.0 };
    let mlp_forward =
        |width: f64| matmul(mlp_matrices * h * width / tp, tokens, mlp_widths(width)) / 3.0;

    let modules = if recompute > 2.0 {
        recompute as u64 - 2
    } else {
        0
    };
    let recomputed = |module: u8| modules & u64::from(module) != 0;
    let core_rebuilt = recompute == 1.0 || recomputed(Modules::CORE_ATTN);
    // MLA's up-projections: the query's from its low-rank path (or from the hidden
    // state), the keys' and values' from theirs.
    let query_rank = or(spec.q_lora_rank, spec.hidden_size);
    let up_weights = num_heads * (query_rank * (nope + rope) + kv_lora * (nope + v_dim));
    let up_cost = if recomputed(Modules::MLA_UP_PROJ) && mla {
        matmul(up_weights / tp, tokens, up_widths) / 3.0
    } else {
        0.0
    };
    let moe_ffn = spec.moe_ffn_size as f64;
    let shared = spec.num_shared_experts as f64;
    let shared_forward = mlp_forward(shared * moe_ffn);
    let (copies, experts, moe_layer, moe_share) = if moe {
        let capacity = inputs.moe_capacity_factor;
        let copies = spec.top_k as f64 * if capacity == 0.0 { 1.0 } else { capacity };
        let num_experts = spec.num_experts as f64;
        let per_expert = terms.moe_row[3] / num_experts;
        // Each of a rank's E / ep experts gets k ep / E of the ranks' tokens.
        let shared_width = shared * moe_ffn;
        let experts = matmul_used(
            per_expert * num_experts / (ep * tp),
            tokens,
            copies * mlp_widths(moe_ffn),
            per_expert * copies / tp,
        );
        let shared_widths = if shared_width > 0.0 {
            mlp_widths(shared_width)
        } else {
            0.0
        };
        let moe_layer = matmul(
            local_weights(&terms.moe_row),
            tokens,
            attention_widths + shared_widths,
        ) + attention_core
            + experts;
        let moe_share = (spec.num_layers - spec.first_dense_layers) as f64 / spec.num_layers as f64;
        (copies, experts, moe_layer, moe_share)
    } else {
        (0.0, 0.0, dense_layer, 0.0)
    };
    let layer = moe_share * moe_layer + (1.0 - moe_share) * dense_layer;
    // Selective modes rebuild the attention core (and elementwise activations, whose
    // time is not modelled), Megatron-Core's modules each their own forward pass.
    let attention_cost = (if core_rebuilt {
        attention_core / 3.0
    } else {
        0.0
    }) + up_cost;
    let dense_cost = attention_cost
        + if recomputed(Modules::MLP) {
            mlp_forward(ffn)
        } else {
            0.0
        };
    let moe_cost = if moe {
        attention_cost
            + if recomputed(Modules::MOE) {
                experts / 3.0 + shared_forward
            } else if recomputed(Modules::SHARED_EXPERTS) {
                shared_forward
            } else {
                0.0
            }
    } else {
        dense_cost
    };
    let recompute_cost = if full {
        layer / 3.0
    } else {
        moe_share * moe_cost + (1.0 - moe_share) * dense_cost
    };
    let vocab = spec.vocab_size as f64;
    let head = matmul(
        if terms.projection == 0.0 {
            terms.embedding
        } else {
            terms.projection
        } / tp,
        tokens,
        h + vocab / tp,
    );

    // Element-wise kernels, memory-bound: each pass reads and writes its tensors at the
    // HBM bandwidth; backward moves twice what forward does, full recomputation once
    // more. Sequence parallelism splits the hidden-size tensors over tp.
    let activation_passes = if gated { 3.0 } else { 2.0 };
    // Bytes of one layer's element-wise forward with an MLP `width` wide over `rows`
    // routed tokens.
    let elementwise_forward = |width: f64, rows: f64| {
        e * tokens * (HIDDEN_PASSES * h / tp + 2.0 * rotary + activation_passes * rows * width / tp)
            + score_bytes
    };
    let dense_bytes = elementwise_forward(ffn, 1.0);
    let moe_bytes = elementwise_forward(moe_ffn, copies)
        + e * tokens * activation_passes * shared * moe_ffn / tp;
    let passes = if full { 4.0 } else { 3.0 };
    let layer_elementwise =
        passes * (moe_share * moe_bytes + (1.0 - moe_share) * dense_bytes) / hbm;
    // The loss: softmax over the logits read in their dtype, kept in logits_dtype, and
    // their gradient written back.
    let loss = tokens * vocab / tp * 2.0 * (e + inputs.logits_bytes) / hbm;
    let layer_overhead = k.layer_pass_overhead * if full { 3.0 } else { 2.0 };
    // The last stage also runs the output layer and the multi-token-prediction modules.
    let mtp_layers = spec.mtp_layers as f64;
    let end_compute = head + mtp_layers * (moe_layer + recompute_cost + head);
    let end_elementwise = (1.0 + mtp_layers) * loss + mtp_layers * layer_elementwise;
    let end_overhead = (1.0 + 2.0 * mtp_layers) * layer_overhead;
    let per_layer = layer + recompute_cost;
    let stages = [c.first_layers, c.middle_layers, c.last_layers];
    let mut stage_times =
        stages.map(|layers| layers * (per_layer + layer_elementwise + layer_overhead));
    stage_times[2] = stage_times[2] + end_compute + end_elementwise + end_overhead;
    // The slowest stage, the first of equals.
    let slowest = (1..3).fold(0, |best, i| {
        if stage_times[i] > stage_times[best] {
            i
        } else {
            best
        }
    });
    let slowest_layers = stages[slowest];
    let last = slowest == 2;
    let end = |value: f64| if last { value } else { 0.0 };
    let stage_compute = slowest_layers * per_layer + end(end_compute);
    let stage_elementwise = slowest_layers * layer_elementwise + end(end_elementwise);
    let stage_overhead = slowest_layers * layer_overhead + end(end_overhead);
    let stage_layers = stages[0].max(stages[1]).max(stages[2]);

    // Communication per micro-batch on that stage.
    let tp_collectives = if full { 12.0 } else { 8.0 };
    let tp_comm = stage_layers * tp_collectives * ring(tokens * h * e, tp, 1.0, hw);
    let kv_width = if mla {
        (spec.num_heads * (spec.qk_nope_head_dim + spec.qk_rope_head_dim + spec.v_head_dim)) as f64
            * (1.0 / tp)
    } else {
        (2 * spec.num_kv_heads * spec.head_dim) as f64 * kv_fraction
    };
    // Forward, backward (keys and values again, and their gradients) and, with full
    // recomputation, the forward again: each moves (cp - 1) chunks of keys and values.
    let cp_bytes = passes * (cp - 1.0) * tokens * kv_width * e;
    let mut cp_time = cp_bytes / group_bandwidth(cp, tp, hw);
    let cp_latency = passes * steps_latency(cp, on_node(tp, hw));
    if inputs.cp_comm == 0.0 {
        // The ring overlaps each step's transfer with the attention of the chunk in hand;
        // the latency of its steps stays on the critical path.
        cp_time = 0.0f64.max(cp_time - attention_core);
    }
    let cp_comm = stage_layers * (cp_time + cp_latency);
    let ep_comm = if moe {
        stage_layers
            * moe_share
            * expert_exchange(spec, c, hw, k, (tokens, copies, layer), (e, dispatch_bytes))
    } else {
        0.0
    };
    let point_to_point =
        BASE_LATENCY + NETWORK_STEP + tokens * h * e / tp / hw.inter_node_bandwidth;
    let pp_comm = if pp > 1.0 {
        2.0 * vpp * point_to_point
    } else {
        0.0
    };
    let micro_batch_time =
        stage_compute + stage_elementwise + stage_overhead + tp_comm + cp_comm + ep_comm + pp_comm;

    // Data parallelism, on the stage with the most weights.
    let dense_weights = stage_layers
        * (moe_share * local_weights(&terms.moe_row)
            + (1.0 - moe_share) * local_weights(&terms.dense_row))
        + if pp > 1.0 {
            terms.embedding
        } else {
            terms.embedding + terms.projection
        } / tp;
    let expert_weights = stage_layers * moe_share * terms.moe_row[3] / (ep * tp);
    let dp_comm = data_parallel(
        c,
        hw,
        k,
        (dense_weights, expert_weights),
        micro_batch_time,
        (
            inputs.grad_bytes + inputs.grad_buffer_bytes,
            inputs.param_bytes,
        ),
    );
    // The optimizer step (Adam) on the local shard: reads the gradient, reads and writes
    // the master weights and both moments, writes the weights.
    let (dense_group, expert_group) = (dp * cp, dp * cp / ep);
    let sharded = c.zero >= 1.0;
    let local_params = dense_weights / if sharded { dense_group } else { 1.0 }
        + expert_weights / if sharded { expert_group } else { 1.0 };
    let update_bytes = inputs.grad_bytes
        + 2.0 * (inputs.master_bytes + inputs.optimizer_state_bytes)
        + inputs.param_bytes;
    let optimizer = local_params * update_bytes / hbm;
    let bubble = (pp - 1.0) / vpp * micro_batch_time;
    let total = m * micro_batch_time + bubble + dp_comm + optimizer;
    let step_tokens = dp * m * c.micro_batch * seq_len;
    let active = terms.active_params - terms.embedding;
    let model_flops = step_tokens
        * (6.0 * active
            + 3.0 * spec.num_layers as f64 * seq_len * spec.num_heads as f64 * head_dims);
    StepTime {
        parts: [
            m * stage_compute,
            m * stage_elementwise,
            m * stage_overhead,
            optimizer,
            bubble,
            m * tp_comm,
            m * cp_comm,
            m * ep_comm,
            m * pp_comm,
            dp_comm,
        ],
        total,
        model_flops,
    }
}

/// One MoE layer's expert-parallel all-to-alls per micro-batch: dispatch and combine of
/// the routed copies forward and backward (the forward dispatch in FP8 with `fp8`), the
/// share of each rank's traffic that stays in its node at the intra-node bandwidth, the
/// rest over the network. `work` is the micro-batch's tokens, routed copies per token
/// and the layer's compute; `bytes` the activation and dispatch bytes per element.
fn expert_exchange(
    spec: &ModelSpec,
    c: &Candidate,
    hw: &Hardware,
    k: &Constants,
    (tokens, copies, layer): (f64, f64, f64),
    (e, dispatch_bytes): (f64, f64),
) -> f64 {
    let (tp, ep) = (c.tp, c.ep);
    // Expert-parallel ranks are tp apart: on_node of them share a node.
    let on_node = ep.min(on_node(tp, hw));
    let nodes = ep / on_node;
    let intra_copies = copies * (on_node - 1.0) / ep;
    let inter_copies = if k.deduplicated_dispatch {
        // Once per remote node that hosts some of the token's experts: of `nodes` nodes,
        // a token's k experts (or its topk_group groups, each on one node when the nodes
        // hold whole groups) touch nodes * (1 - (1 - 1/nodes)^picks).
        let groups = spec.router_groups as f64;
        let picks = if spec.router_groups > 1 && nodes <= groups {
            spec.router_group_top_k
        } else {
            spec.top_k
        } as f64;
        let touched = nodes * (1.0 - (1.0 - 1.0 / nodes).powf(picks));
        touched * (nodes - 1.0) / nodes
    } else {
        copies * (ep - on_node) / ep
    };
    let per_byte = intra_copies / hw.intra_node_bandwidth + inter_copies / hw.inter_node_bandwidth;
    let routed = tokens / tp * spec.hidden_size as f64;
    // Full recomputation and `moe` repeat the forward dispatch and combine.
    let again = c.recompute == 2.0
        || (c.recompute > 2.0 && (c.recompute as u64 - 2) & u64::from(Modules::MOE) != 0);
    let exchanges = routed * (dispatch_bytes + 3.0 * e + if again { 2.0 * e } else { 0.0 });
    let latency = 4.0 * steps_latency(ep, on_node);
    let time = if ep > 1.0 {
        exchanges * per_byte + latency
    } else {
        0.0
    };
    if k.overlap_ep_comm {
        0.0f64.max(time - layer)
    } else {
        time
    }
}

/// The data-parallel collectives not hidden by compute (ring reduce-scatter and
/// all-gather over `dp x cp` ranks, over `dp x cp / ep` for experts): ZeRO-0 all-reduces
/// the gradients once per step behind the last micro-batch's backward; ZeRO-1
/// reduce-scatters them there and all-gathers the updated weights behind the next step's
/// first forward; ZeRO-2 reduce-scatters after every micro-batch's backward; ZeRO-3 also
/// gathers the weights before every micro-batch's forward and backward (Rajbhandari et
/// al. 2020), each hidden only behind the compute of the same micro-batch. `weights` are
/// the stage's dense and expert weights, `bytes` the gradient and weight bytes of each.
fn data_parallel(
    c: &Candidate,
    hw: &Hardware,
    k: &Constants,
    (dense_weights, expert_weights): (f64, f64),
    micro_batch_time: f64,
    (grad_bytes, param_bytes): (f64, f64),
) -> f64 {
    let (tp, ep, m) = (c.tp, c.ep, c.grad_accum_steps);
    let forward = micro_batch_time / 3.0;
    let backward = micro_batch_time - forward;
    // The dense weights' and the experts' collectives share the same compute to hide
    // behind.
    let (dense_group, expert_group) = (c.dp * c.cp, c.dp * c.cp / ep);
    let collective = |bytes: f64| {
        ring(dense_weights * bytes, dense_group, tp, hw)
            + ring(expert_weights * bytes, expert_group, tp * ep, hw)
    };
    let reduce = collective(grad_bytes);
    let gather = collective(param_bytes);
    // What `comm` adds to `window` of compute it overlaps: the part the window does not
    // hide, and the share of the hidden part the collective's kernels take from the
    // compute (streaming multiprocessors and memory bandwidth).
    let exposed =
        |comm: f64, window: f64| 0.0f64.max(comm - window) + k.overlap_tax * comm.min(window);
    match c.zero {
        z if z == 0.0 => exposed(2.0 * reduce, backward),
        z if z == 1.0 => exposed(reduce, backward) + exposed(gather, forward),
        z if z == 2.0 => m * exposed(reduce, backward) + exposed(gather, forward),
        _ => m * (exposed(gather, forward) + exposed(gather + reduce, backward)),
    }
}

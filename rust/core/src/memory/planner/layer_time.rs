//! The step-time model's terms of one layer over one micro-batch: what a candidate's
//! time is made of before its pipeline stages and data parallelism are known, shared by
//! every candidate with the same tensor, context and expert parallelism, micro-batch and
//! recomputation.

use crate::memory::layout::{Layout, Modules};
use crate::memory::spec::{FfnType, ModelSpec};

use super::collectives::{
    group_bandwidth, on_node, ring, steps_latency, BASE_LATENCY, NETWORK_STEP,
};
use super::hardware::Hardware;
use super::inputs::{or, Candidate, Constants, Row, SpecTerms, HIDDEN_PASSES};

/// What a layer's terms depend on among a candidate's fields.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerKey {
    pub tp: f64,
    pub cp: f64,
    pub ep: f64,
    pub micro_batch: f64,
    /// A `recompute` code of the layout field.
    pub recompute: f64,
}

impl LayerKey {
    pub fn of(c: &Candidate) -> Self {
        LayerKey {
            tp: c.tp,
            cp: c.cp,
            ep: c.ep,
            micro_batch: c.micro_batch,
            recompute: c.recompute,
        }
    }
}

/// Seconds (and counts) of one layer over one micro-batch; `end_*` are the last stage's
/// extra work (the output layer, the loss and the multi-token-prediction modules).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LayerTerms {
    /// Tokens per micro-batch on a rank.
    pub tokens: f64,
    /// Matmuls and attention, forward, backward and recomputation.
    pub per_layer: f64,
    pub layer_elementwise: f64,
    pub layer_overhead: f64,
    pub end_compute: f64,
    pub end_elementwise: f64,
    pub end_overhead: f64,
    /// Tensor-parallel collectives per layer and the time of each.
    pub tp_collectives: f64,
    pub tp_ring: f64,
    /// Exposed context-parallel exchange per layer.
    pub cp_time: f64,
    /// The share of layers with routed experts.
    pub moe_share: f64,
    /// Exposed expert-parallel exchange per MoE layer.
    pub ep_time: f64,
    /// One pipeline send.
    pub point_to_point: f64,
    /// Dense weights per layer on a rank.
    pub layer_weights: f64,
    /// The embedding on a rank, and with the output layer.
    pub embedding: f64,
    pub embedding_and_head: f64,
}

/// The terms of `key` (`inputs`: the memory estimate's fields; see
/// [`step_time`](super::step_time::step_time)).
pub fn layer_terms(
    terms: &SpecTerms,
    key: &LayerKey,
    hw: &Hardware,
    seq_len: f64,
    inputs: &Layout,
    k: &Constants,
) -> LayerTerms {
    let spec = &terms.spec;
    let (tp, cp, ep) = (key.tp, key.cp, key.ep);
    let recompute = key.recompute;
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
    let tokens = key.micro_batch * seq_len / cp;
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
    let head_dims = terms.head_dims;
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

    // Communication per micro-batch and layer.
    let tp_collectives = if full { 12.0 } else { 8.0 };
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
    let ep_time = if moe {
        expert_exchange(
            spec,
            key,
            hw,
            k,
            (tokens, copies, layer),
            (e, dispatch_bytes),
        )
    } else {
        0.0
    };
    LayerTerms {
        tokens,
        per_layer,
        layer_elementwise,
        layer_overhead,
        end_compute,
        end_elementwise,
        end_overhead,
        tp_collectives,
        tp_ring: ring(tokens * h * e, tp, 1.0, hw),
        cp_time: cp_time + cp_latency,
        moe_share,
        ep_time,
        point_to_point: BASE_LATENCY + NETWORK_STEP + tokens * h * e / tp / hw.inter_node_bandwidth,
        layer_weights: moe_share * local_weights(&terms.moe_row)
            + (1.0 - moe_share) * local_weights(&terms.dense_row),
        embedding: terms.embedding / tp,
        embedding_and_head: (terms.embedding + terms.projection) / tp,
    }
}

/// One MoE layer's expert-parallel all-to-alls per micro-batch: dispatch and combine of
/// the routed copies forward and backward (the forward dispatch in FP8 with `fp8`), the
/// share of each rank's traffic that stays in its node at the intra-node bandwidth, the
/// rest over the network. `work` is the micro-batch's tokens, routed copies per token
/// and the layer's compute; `bytes` the activation and dispatch bytes per element.
fn expert_exchange(
    spec: &ModelSpec,
    c: &LayerKey,
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

//! Bytes a transformer layer saves for its backward pass, per token of a micro-batch.
//!
//! `modern` counts the tensors today's blocks keep, as the spec's [`Implementation`]
//! (`hf`: `transformers`' modules; `fused`: Megatron-Core with Transformer Engine) and the
//! recomputation modes decide; `korthikanti` is Korthikanti et al. 2022, table 2. The
//! tensors, their sizes and the measurements behind them are listed once, in
//! docs/memory.md ("Formulas and sources"), in the notation used here: `e` the activation
//! dtype's bytes, `h` the hidden size, `a`/`g` a rank's query and key/value heads, `dq`/`dv`
//! the head sizes, `f` a rank's MLP width, `s` the key length, `k` experts per token, `E`
//! the routed experts.

use crate::memory::layout::{Modules, Recompute};
use crate::memory::spec::{FfnType, Implementation, ModelSpec, MoeDispatcher, NormType};

/// How context-parallel ranks exchange keys and values (the `cp_comm` layout field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpComm {
    /// A ring (Transformer Engine's p2p): each rank sends its chunk on while it receives
    /// the next, two chunks of keys and values in flight.
    P2p,
    /// Every rank gathers the keys and values of the whole sequence.
    AllGather,
    /// Ulysses-style all-to-all: q, k, v and the output re-laid out from sequence to heads.
    A2a,
}

impl CpComm {
    /// The kind of a `cp_comm` code (0, 1 or 2; validated before).
    pub fn from_code(code: f64) -> Self {
        match code as u8 {
            1 => CpComm::AllGather,
            2 => CpComm::A2a,
            _ => CpComm::P2p,
        }
    }
}

/// Bytes of the rotary tables (cos and sin) of `positions` positions, `rope` wide, in
/// elements of `e` bytes.
pub(crate) fn rotary_tables(positions: f64, (rope, e): (f64, f64)) -> f64 {
    2.0 * positions * rope * e
}

/// Activation bytes per local token of one layer, by block.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct LayerActs {
    pub attention: f64,
    pub mlp: f64,
    pub norm: f64,
}

impl LayerActs {
    pub fn total(&self) -> f64 {
        self.attention + self.mlp + self.norm
    }
}

/// Per-configuration constants of the activation formulas.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ActCtx {
    /// Bytes per element of activations.
    pub e: f64,
    pub t: f64,
    /// Divisor of tensors on the residual stream: `tp` with sequence parallelism, else 1.
    pub rep: f64,
    /// Key/value heads on a rank (at least one: replicated when `tp` exceeds them).
    pub kv_per_rank: f64,
    /// Keys each query attends to (the local sequence).
    pub key_len: f64,
    pub eager: bool,
    pub fused_swiglu: bool,
    /// Recomputation within a layer (full recomputation's working set, the layer
    /// rebuilt, is estimated with `None`).
    pub recompute: Recompute,
    /// Bytes per element of the weights (an fp32 router copies lower-precision ones).
    pub param_bytes: f64,
    /// Bytes per element of the inputs linear layers keep (1 with FP8 linear layers).
    pub lin: f64,
    /// Routed copies of a token an expert-parallel rank processes (`k`, or `k` times the
    /// capacity factor when experts' inputs are padded to capacity).
    pub copies: f64,
}

/// The activation formulas of one model under one configuration.
pub(crate) struct Activations<'a> {
    spec: &'a ModelSpec,
    c: ActCtx,
    hf: bool,
    all_gather: bool,
}

impl<'a> Activations<'a> {
    pub fn new(spec: &'a ModelSpec, c: ActCtx) -> Self {
        Activations {
            spec,
            c,
            hf: spec.implementation == Implementation::Hf,
            all_gather: spec.moe_dispatcher == MoeDispatcher::AllGather,
        }
    }

    /// The Megatron-Core modules recomputed.
    fn modules(&self) -> Modules {
        self.c.recompute.modules()
    }

    /// Whether the attention core is recomputed in backward (`selective`, `core_attn`).
    fn core_recomputed(&self) -> bool {
        self.c.recompute == Recompute::Selective || self.modules().has(Modules::CORE_ATTN)
    }

    /// Whether the MLP activation functions are recomputed: `selective` where the code
    /// base does (Megatron-Core's `moe_act`, and for a dense MLP the same rebuilt from
    /// fc1's output); `transformers` has no such mode.
    fn activation_recomputed(&self) -> bool {
        self.c.recompute == Recompute::Selective && !self.hf
    }

    /// A norm of width `width` on the residual stream's tokens.
    fn norm(&self, width: f64) -> f64 {
        let e = self.c.e;
        let bytes = match (self.spec.norm, self.hf) {
            (NormType::RmsNorm, true) => (4.0 + e) * width + 4.0,
            (NormType::RmsNorm, false) => e * width + 4.0,
            (NormType::LayerNorm, _) => e * width + 8.0,
        };
        bytes / self.c.rep
    }

    /// The inner activations of an MLP of width `ffn` (whole, not per rank): for SwiGLU
    /// gate and up, and unless recomputed silu(gate) (not kept with `fused_swiglu`) and the
    /// product, the down projection's input; for GeLU fc1's output and the GeLU output.
    /// `routed`: the routed experts', whose activation `moe_act` also recomputes.
    fn mlp_inner(&self, ffn: f64, routed: bool) -> f64 {
        let c = &self.c;
        let recomputed =
            self.activation_recomputed() || (routed && self.modules().has(Modules::MOE_ACT));
        let (kept, down_input) = match (self.spec.ffn_type, recomputed, c.fused_swiglu) {
            (FfnType::SwiGlu, true, _) => (2.0, false),
            (FfnType::SwiGlu, false, true) => (2.0, true),
            (FfnType::SwiGlu, false, false) => (3.0, true),
            (FfnType::Gelu, true, _) => (1.0, false),
            (FfnType::Gelu, false, _) => (1.0, true),
        };
        let down = if down_input { c.lin } else { 0.0 };
        (kept * c.e + down) * ffn / c.t
    }

    /// The attention block: projections' input (unless freed: `input_kept` false), q/k/v,
    /// core, output.
    fn attention(&self, input_kept: bool) -> f64 {
        let (s, c) = (self.spec, &self.c);
        let e = c.e;
        let h = s.hidden_size as f64;
        let a = s.num_heads as f64 / c.t;
        let dq = s.qk_head_dim() as f64;
        let dv = s.v_dim() as f64;
        let input = if input_kept { c.lin * h / c.rep } else { 0.0 };
        // MLA's up-projections recomputed (`mla_up_proj`): q, k and v are a checkpoint's
        // output, freed once the core has run; the low-rank paths keep its inputs.
        let up_recomputed = s.is_mla() && self.modules().has(Modules::MLA_UP_PROJ);
        let qkv_kept = if up_recomputed { 0.0 } else { 1.0 };
        let query = qkv_kept * e * a * dq;
        let mla_paths = match (s.is_mla(), up_recomputed) {
            (false, _) => 0.0,
            (true, false) => self.mla_paths(),
            (true, true) => self.mla_checkpoint_inputs(),
        };
        let projection_input = c.lin * a * dv;
        let core_recomputed = self.core_recomputed();
        if c.eager && !core_recomputed {
            let probabilities = if self.hf {
                let copy = if e < 4.0 { e } else { 0.0 };
                (4.0 + copy) * a * c.key_len
            } else {
                e * a * c.key_len
            };
            // Keys and values expanded to every query head; the output copied for `o_proj`.
            let keys_values = qkv_kept * e * a * (dq + dv);
            return input + mla_paths + query + keys_values + probabilities + projection_input;
        }
        // Flash attention's inputs as the kernel gets them, which are also all a recomputed
        // core keeps (eager attention expands keys and values inside the core).
        let keys_values = qkv_kept
            * if !s.is_mla() {
                e * c.kv_per_rank * (dq + dv)
            } else if self.hf {
                // Keys with the rotary part expanded; values a view of the up-projection's
                // output (no-position keys and values).
                e * a * dq + e * a * (s.qk_nope_head_dim as f64 + dv)
            } else if core_recomputed {
                // The checkpoint keeps q, k and v only (measured).
                e * a * (dq + dv)
            } else {
                // And the rotary key part, kept apart (not measured: Transformer Engine),
                // of the whole sequence, as MLA gathers it.
                e * a * (dq + dv) + e * s.qk_rope_head_dim as f64
            };
        if core_recomputed {
            // The core's output is rebuilt in backward; `o_proj` keeps its own input.
            return input + mla_paths + query + keys_values + projection_input + self.qkv_view();
        }
        // The kernel keeps its output and log-sum-exp; `o_proj` keeps the same tensor,
        // unless it keeps an FP8 copy or (`hf` MLA) a contiguous copy.
        let output = e * a * dv + 4.0 * a;
        let copy = if (s.is_mla() && self.hf) || c.lin < e {
            projection_input
        } else {
            0.0
        };
        input + mla_paths + query + keys_values + output + copy
    }

    /// What a checkpointed core keeps beyond q, k and v under Megatron-Core's
    /// `core_attn`: the values it saves are a view of the fused QKV projection's output,
    /// so the queries and keys before rotary stay alive with them. Without rotary
    /// positions q and k are views of the same output, and MLA builds its own q, k and v
    /// (measured: the checkpoint keeps them only). Measured with eager attention: a flash kernel
    /// saving the values as the same view would keep the output without recomputation
    /// too, which is not counted.
    fn qkv_view(&self) -> f64 {
        let (s, c) = (self.spec, &self.c);
        if !self.modules().has(Modules::CORE_ATTN)
            || self.hf
            || s.is_mla()
            || s.learned_positions > 0
        {
            return 0.0;
        }
        let a = s.num_heads as f64 / c.t;
        c.e * (a + c.kv_per_rank) * s.qk_head_dim() as f64
    }

    /// What MLA's low-rank paths keep when the up-projections are recomputed: the
    /// checkpoint's inputs, the compressed query and the compressed keys and values, a
    /// view of the down-projection's output that holds the rotary key part too (the
    /// norms of the paths, fused into the up-projections, are recomputed with them).
    fn mla_checkpoint_inputs(&self) -> f64 {
        let (s, c) = (self.spec, &self.c);
        let kv = (s.kv_lora_rank + s.qk_rope_head_dim) as f64;
        c.e * (s.q_lora_rank as f64 + kv) / c.rep + self.gathered_rotary_key()
    }

    /// Under sequence parallelism MLA gathers the rotary key part of its rank's part of
    /// the sequence into one of the whole sequence (a copy, where without it the part is a
    /// view of the down-projection's output), per token (measured under `mla_up_proj`,
    /// which keeps it).
    fn gathered_rotary_key(&self) -> f64 {
        let c = &self.c;
        if c.rep > 1.0 {
            c.e * self.spec.qk_rope_head_dim as f64
        } else {
            0.0
        }
    }

    /// MLA's low-rank query and key/value paths: a norm and the up-projection's input each.
    fn mla_paths(&self) -> f64 {
        let (s, c) = (self.spec, &self.c);
        let path = |rank: u64| {
            if rank == 0 {
                0.0
            } else {
                self.norm(rank as f64) + c.lin * rank as f64 / c.rep
            }
        };
        path(s.q_lora_rank) + path(s.kv_lora_rank)
    }

    /// The MLP or MoE block of a layer, per token, and bytes per micro-batch that do not
    /// scale with its tokens (an fp32 copy of the router weight). `input_kept` false: the
    /// block's input (the pre-MLP norm's output) is freed.
    fn mlp(&self, moe: bool, input_kept: bool) -> (f64, f64) {
        let (s, c) = (self.spec, &self.c);
        let e = c.e;
        let h = s.hidden_size as f64;
        let kept = if input_kept { 1.0 } else { 0.0 };
        if !moe {
            return (
                kept * c.lin * h / c.rep + self.mlp_inner(s.ffn_size as f64, false),
                0.0,
            );
        }
        // The MoE input goes to the router, which is not an FP8 layer.
        let input = kept * e * h / c.rep;
        let k = s.top_k as f64;
        let experts = s.num_experts as f64;
        // In f64, as the parameter counts are: the u64 product can overflow.
        let shared = if self.modules().has(Modules::SHARED_EXPERTS) {
            0.0
        } else {
            self.mlp_inner(s.num_shared_experts as f64 * s.moe_ffn_size as f64, false)
        };
        if !self.hf {
            return (self.fused_moe(input, shared), 0.0);
        }
        let (router, router_weight) = if s.router_bias {
            // Sigmoid router in fp32 (DeepSeek-V3): an fp32 copy of the input (and of the
            // weight) unless they are fp32 already, the scores, the expert mask, top-k
            // indices, the normalizer and the normalized weights.
            let input_copy = if e < 4.0 { 4.0 * h } else { 0.0 };
            let weight_copy = if c.param_bytes < 4.0 {
                4.0 * experts * h
            } else {
                0.0
            };
            // Group-limited routing keeps the int64 indices of each group's top two scores
            // and of the chosen groups.
            let groups = if s.router_groups > 1 {
                16.0 * s.router_groups as f64 + 8.0 * s.router_group_top_k as f64
            } else {
                0.0
            };
            (
                input_copy + 5.0 * experts + 12.0 * k + 4.0 + groups,
                weight_copy,
            )
        } else {
            // Softmax router: fp32 probabilities, top-k indices, normalizer and weights.
            (4.0 * experts + 12.0 * k + 4.0, 0.0)
        };
        // A low-precision input upcast by an fp32 router is kept only by shared experts.
        let keeps_input = !s.router_bias || e >= 4.0 || s.num_shared_experts > 0;
        // Per routed copy: the gathered input, the expert's inner activations, the expert
        // output and fp32 weight of the weighted sum, three int64 indices of the sort.
        let routed = c.copies
            * ((c.lin + e) * h / c.rep
                + self.mlp_inner(s.moe_ffn_size as f64, true)
                + 28.0 / c.rep);
        let per_token = if keeps_input { input } else { 0.0 } + router / c.rep + routed + shared;
        (per_token, router_weight)
    }

    /// A Megatron-Core MoE block per token (measured in tests/test_memory_megatron_core.py):
    /// the router's input, the router's tensors, per routed copy the gathered input, the
    /// expert's inner activations, its routing weight and one int64 index of the sort by
    /// expert; the routing weight is applied inside the activation function, so the
    /// expert's output is not kept.
    fn fused_moe(&self, input: f64, shared: f64) -> f64 {
        let (s, c) = (self.spec, &self.c);
        let (e, h) = (c.e, s.hidden_size as f64);
        let k = s.top_k as f64;
        let experts = s.num_experts as f64;
        // Both routers keep the int64 top-k indices, a byte mask of each token's experts
        // and its probabilities over the experts in the activation dtype. Group-limited
        // routing adds the int64 indices of each group's top `k / group_top_k` scores and
        // of the chosen groups, and a byte mask over the experts.
        let groups = if s.router_groups > 1 {
            let top = s.router_group_top_k.max(1) as f64;
            8.0 * s.router_groups as f64 * (k / top).floor() + 8.0 * top + experts
        } else {
            0.0
        };
        let common = 8.0 * k + experts + e * experts + groups;
        let router = if s.router_bias {
            // Sigmoid scores in fp32 and their cast back, the normalizer and the chosen
            // weights.
            let cast = if e < 4.0 { e * experts } else { 0.0 };
            common + 4.0 * experts + cast + e + e * k
        } else {
            // Softmax over the top-k scores, in fp32.
            common + 4.0 * k
        };
        // The experts are split over the tensor-parallel ranks (Megatron-Core's default
        // expert tensor parallelism), each of which runs every routed copy of the group's
        // tokens: the dispatcher gathers the copies over the group, so their input and
        // weight are not divided by sequence parallelism. The all-to-all dispatcher takes
        // the sort's index before the gather; the all-gather one sorts the gathered
        // copies, and keeps a byte mask and a probability per expert of every gathered
        // token (both measured in tests/runs/megatron_parallel.py, with tp = 2 and with
        // ep = 2). Under expert parallelism it gathers `ep` times more tokens but keeps
        // only its `1 / ep` of the experts' columns and copies: the same bytes.
        let (index, gathered_map) = if self.all_gather {
            (8.0, (1.0 + e) * experts * (1.0 - 1.0 / c.rep))
        } else {
            (8.0 / c.rep, 0.0)
        };
        let routed =
            c.copies * (c.lin * h + self.mlp_inner(s.moe_ffn_size as f64, true) + e + index);
        input + router / c.rep + gathered_map + routed + shared
    }

    /// One layer per token, and its bytes per micro-batch that do not scale with tokens.
    ///
    /// Inlined: a grid calls it for every cell, and the result returned through memory
    /// stalled when copied back over its fresh stores.
    #[inline(always)]
    pub fn layer(&self, moe: bool) -> (LayerActs, f64) {
        let h = self.spec.hidden_size as f64;
        let modules = self.modules();
        // What a checkpoint keeps of its input: a residual-stream tensor.
        let checkpoint_input = self.c.e * h / self.c.rep;
        // Norms that are modules of their own (Transformer Engine fuses the others into
        // the next projection), and whether `layernorm` recomputes them.
        let mlp_norm_alone = self.hf || moe;
        let input_norm_recomputed =
            modules.has(Modules::LAYERNORM) && (self.hf || self.spec.is_mla());
        let mlp_norm_recomputed = modules.has(Modules::LAYERNORM) && mlp_norm_alone;
        let norm = |recomputed: bool| {
            if recomputed {
                checkpoint_input
            } else {
                self.norm(h)
            }
        };
        let block_recomputed = if moe {
            modules.has(Modules::MOE)
        } else {
            modules.has(Modules::MLP)
        };
        let (mlp, fixed, mlp_norm) = if block_recomputed {
            // The block keeps its input, the pre-MLP norm's output (freed where the norm
            // is recomputed); a norm fused into the block is recomputed with it, and the
            // block keeps the norm's input instead.
            let input = if mlp_norm_recomputed {
                0.0
            } else {
                checkpoint_input
            };
            let mlp_norm = if mlp_norm_alone {
                norm(mlp_norm_recomputed)
            } else {
                0.0
            };
            (input, 0.0, mlp_norm)
        } else {
            let (mlp, fixed) = self.mlp(moe, !mlp_norm_recomputed);
            (mlp, fixed, norm(mlp_norm_recomputed))
        };
        let acts = LayerActs {
            attention: self.attention(!input_norm_recomputed),
            mlp,
            norm: norm(input_norm_recomputed) + mlp_norm,
        };
        (acts, fixed)
    }

    /// The final norm and the output projection's input, per token (logits excluded).
    pub fn head(&self) -> f64 {
        let h = self.spec.hidden_size as f64;
        self.norm(h) + self.c.e * h / self.c.rep
    }

    /// A multi-token-prediction module's own inputs per token: the norms of the embedding
    /// and of the hidden state, and their concatenation, the projection's input.
    pub fn mtp_inputs(&self) -> f64 {
        let h = self.spec.hidden_size as f64;
        2.0 * self.norm(h) + 2.0 * self.c.lin * h / self.c.rep
    }

    /// Communication buffers per token of the busiest layer, live while it runs: the
    /// all-to-all send buffer of the routed copies (`ep > 1`), or the keys and values in
    /// flight between context-parallel ranks (`cp > 1`); the larger, since they are
    /// not live at once.
    pub fn comm_buffers(&self, ep: f64, cp: f64, cp_comm: CpComm) -> f64 {
        let (s, c) = (self.spec, &self.c);
        let h = s.hidden_size as f64;
        let expert = if ep > 1.0 && s.is_moe() {
            c.copies * c.e * h / c.rep
        } else {
            0.0
        };
        let context = if cp > 1.0 {
            let a = s.num_heads as f64 / c.t;
            let (dq, dv) = (s.qk_head_dim() as f64, s.v_dim() as f64);
            let kv_heads = if s.is_mla() { a } else { c.kv_per_rank };
            let keys_values = c.e * kv_heads * (dq + dv);
            match cp_comm {
                CpComm::P2p => 2.0 * keys_values,
                CpComm::AllGather => cp * keys_values,
                CpComm::A2a => keys_values + c.e * a * (dq + dv),
            }
        } else {
            0.0
        };
        expert.max(context)
    }

    /// The head size of the rotary tables kept per micro-batch (`hf`: cos and sin of every
    /// position) and the bytes of their elements; `None` when none are kept. Their bytes
    /// for a number of positions are [`rotary_tables`].
    pub fn rotary_table_widths(&self) -> Option<(f64, f64)> {
        if !self.hf || self.spec.learned_positions > 0 {
            return None;
        }
        let rope = if self.spec.is_mla() {
            self.spec.qk_rope_head_dim
        } else {
            self.spec.head_dim
        };
        Some((rope as f64, self.c.e))
    }

    /// Korthikanti et al. 2022, table 2, per token of one layer.
    #[inline(always)]
    pub fn korthikanti_layer(&self) -> LayerActs {
        let (s, c) = (self.spec, &self.c);
        let h = s.hidden_size as f64;
        let scores = if self.core_recomputed() {
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

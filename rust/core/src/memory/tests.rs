use proptest::prelude::*;

use super::*;

fn llama(h: u64, layers: u64, heads: u64, kv: u64, ffn: u64) -> ModelSpec {
    ModelSpec {
        hidden_size: h,
        num_layers: layers,
        num_heads: heads,
        num_kv_heads: kv,
        head_dim: h / heads,
        ffn_size: ffn,
        ffn_type: FfnType::SwiGlu,
        vocab_size: 128_256,
        tied_embeddings: false,
        norm: NormType::RmsNorm,
        qkv_bias: false,
        linear_bias: false,
        learned_positions: 0,
        num_experts: 0,
        top_k: 0,
        num_shared_experts: 0,
        moe_ffn_size: 0,
        first_dense_layers: 0,
        router_bias: false,
        router_groups: 0,
        router_group_top_k: 0,
        q_lora_rank: 0,
        kv_lora_rank: 0,
        qk_nope_head_dim: 0,
        qk_rope_head_dim: 0,
        v_head_dim: 0,
        mtp_layers: 0,
        implementation: Implementation::Fused,
        moe_dispatcher: MoeDispatcher::AllToAll,
    }
}

fn llama_8b() -> ModelSpec {
    llama(4096, 32, 32, 8, 14336)
}

fn mixtral() -> ModelSpec {
    ModelSpec {
        vocab_size: 32_000,
        num_experts: 8,
        top_k: 2,
        moe_ffn_size: 14336,
        ..llama_8b()
    }
}

fn deepseek_v3() -> ModelSpec {
    ModelSpec {
        hidden_size: 7168,
        num_layers: 61,
        num_heads: 128,
        num_kv_heads: 128,
        head_dim: 56,
        ffn_size: 18432,
        vocab_size: 129_280,
        num_experts: 256,
        top_k: 8,
        num_shared_experts: 1,
        moe_ffn_size: 2048,
        first_dense_layers: 3,
        router_bias: true,
        router_groups: 8,
        router_group_top_k: 4,
        q_lora_rank: 1536,
        kv_lora_rank: 512,
        qk_nope_head_dim: 128,
        qk_rope_head_dim: 64,
        v_head_dim: 128,
        ..llama_8b()
    }
}

fn one(spec: &ModelSpec, layout: &Layout) -> Breakdown {
    estimate_one(spec, layout).unwrap().unwrap()
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

#[test]
fn exact_parameter_counts() {
    assert_eq!(llama_8b().total_params(), 8_030_261_248.0);
    assert_eq!(
        llama(8192, 80, 64, 8, 28672).total_params(),
        70_553_706_496.0
    );
    assert_eq!(
        llama(16384, 126, 128, 8, 53248).total_params(),
        405_853_388_800.0
    );
    assert_eq!(mixtral().total_params(), 46_702_792_704.0);
    assert_eq!(mixtral().active_params(), 12_879_925_248.0);
    // DeepSeek-V3 without its multi-token-prediction module: "671B total, 37B activated"
    // (the routing correction bias is a buffer, not a parameter).
    let ds = deepseek_v3();
    assert_eq!(ds.total_params(), 671_026_404_352.0);
    assert!((ds.active_params() / 1e9 - 37.55).abs() < 0.01);
}

#[test]
fn playbook_activation_memory_llama3_8b() {
    // Ultra-Scale Playbook: L=32, h=4096, a=32, s=1024, b=1.
    let spec = llama_8b();
    let base = Layout {
        seq_len: 1024.0,
        activation_model: 1.0,
        ..Layout::default()
    };
    let gib = |recompute: f64| one(&spec, &Layout { recompute, ..base }).activations / GIB;
    assert!((gib(0.0) - 9.2539).abs() < 5e-5, "{}", gib(0.0));
    assert!((gib(1.0) - 4.2539).abs() < 5e-5, "{}", gib(1.0));
    assert!((gib(2.0) - 0.2539).abs() < 5e-5, "{}", gib(2.0));
}

#[test]
fn korthikanti_tensor_and_sequence_parallel_variants() {
    let spec = llama_8b();
    let (s, h, a, t) = (2048.0, 4096.0, 32.0, 4.0);
    let base = Layout {
        seq_len: s,
        tp: t,
        activation_model: 1.0,
        ..Layout::default()
    };
    let layers = |l: &Layout| {
        let b = one(&spec, l);
        (b.act_attention + b.act_mlp + b.act_norm + b.act_checkpoints) / 32.0
    };
    let sbh = s * h;
    assert_eq!(
        layers(&base),
        sbh * (10.0 + 24.0 / t + 5.0 * a * s / (h * t))
    );
    let sp = Layout {
        sequence_parallel: 1.0,
        ..base
    };
    assert_eq!(layers(&sp), sbh / t * (34.0 + 5.0 * a * s / h));
    let sel = Layout {
        recompute: 1.0,
        ..base
    };
    assert_eq!(layers(&sel), sbh * (10.0 + 24.0 / t));
    let sel_sp = Layout {
        recompute: 1.0,
        ..sp
    };
    assert_eq!(layers(&sel_sp), sbh * 34.0 / t);
    let full_sp = Layout {
        recompute: 2.0,
        ..sp
    };
    assert_eq!(layers(&full_sp), 2.0 * sbh / t);
}

#[test]
fn sixteen_and_twenty_bytes_per_parameter() {
    let spec = llama_8b();
    let n = spec.total_params();
    let b = one(&spec, &Layout::default());
    assert_eq!(b.params + b.grads + b.optimizer, 16.0 * n);
    let fp32_accum = Layout {
        grad_buffer_bytes: 4.0,
        ..Layout::default()
    };
    let b = one(&spec, &fp32_accum);
    assert_eq!(b.params + b.grads + b.optimizer, 20.0 * n);
}

#[test]
fn zero_stages_divide_the_right_states() {
    let spec = llama_8b();
    let n = spec.total_params();
    let d = 64.0;
    let states = |zero: f64| {
        let b = one(
            &spec,
            &Layout {
                dp: d,
                zero,
                ..Layout::default()
            },
        );
        (b.params, b.grads, b.optimizer)
    };
    assert_eq!(states(0.0), (2.0 * n, 2.0 * n, 12.0 * n));
    assert_eq!(states(1.0), (2.0 * n, 2.0 * n, (12.0 * n / d).ceil()));
    assert_eq!(
        states(2.0),
        (2.0 * n, (2.0 * n / d).ceil(), (12.0 * n / d).ceil())
    );
    assert_eq!(
        states(3.0),
        (
            (2.0 * n / d).ceil(),
            (2.0 * n / d).ceil(),
            (12.0 * n / d).ceil()
        )
    );
}

#[test]
fn pipeline_stage_holds_its_layers_and_in_flight_micro_batches() {
    let spec = llama_8b();
    let base = Layout {
        seq_len: 2048.0,
        ..Layout::default()
    };
    let single = one(&spec, &base);
    let layer_acts = single.act_attention + single.act_mlp + single.act_norm;
    let pp4 = one(&spec, &Layout { pp: 4.0, ..base });
    // 1F1B: stage 0 holds 8 layers x 4 micro-batches = all 32 layers once.
    assert_eq!(pp4.stage, 0.0);
    assert_eq!(pp4.act_attention + pp4.act_mlp + pp4.act_norm, layer_acts);
    // Fewer micro-batches than stages: only those are in flight.
    let few = one(
        &spec,
        &Layout {
            pp: 4.0,
            grad_accum_steps: 2.0,
            ..base
        },
    );
    assert_eq!(
        few.act_attention + few.act_mlp + few.act_norm,
        layer_acts / 2.0
    );
    // Interleaving keeps pp * (1 + (pp - 1) / (pp * vpp)) stage-equivalents on stage 0.
    let inter = one(
        &spec,
        &Layout {
            pp: 4.0,
            vpp: 2.0,
            ..base
        },
    );
    let expected = layer_acts / 4.0 * 4.0 * (1.0 + 3.0 / 8.0);
    assert!(((inter.act_attention + inter.act_mlp + inter.act_norm) - expected).abs() < 1.0);
}

#[test]
fn modern_layer_counts_every_saved_tensor() {
    // Llama-3-8B, one token: norms 2 (2h + 4), qkv input 2h, q 2h, k and v 2 x 2 x 1024,
    // output 2h, lse 4a, MLP input 2h, SwiGLU 4 x 2f; the loss the fp32 logits, the labels
    // and Megatron's mask of the labels outside the rank's part of the vocabulary.
    let spec = llama_8b();
    let b = one(
        &spec,
        &Layout {
            seq_len: 1.0,
            ..Layout::default()
        },
    );
    let h = 4096.0;
    assert_eq!(b.act_norm, 32.0 * 2.0 * (2.0 * h + 4.0));
    assert_eq!(
        b.act_attention,
        32.0 * (2.0 * h + 2.0 * h + 4.0 * 1024.0 + 2.0 * h + 128.0)
    );
    assert_eq!(b.act_mlp, 32.0 * (2.0 * h + 8.0 * 14336.0));
    assert_eq!(b.act_logits, 4.0 * h + 4.0 + 4.0 * 128_256.0 + 8.0 + 1.0);
    assert_eq!(b.act_embedding, 8.0);
    // Tensor-parallel, the embedding keeps its mask of the ids outside the rank's part.
    let tp = one(
        &spec,
        &Layout {
            seq_len: 1.0,
            tp: 2.0,
            ..Layout::default()
        },
    );
    assert_eq!(tp.act_embedding, 9.0);
}

#[test]
fn hf_norms_keep_an_fp32_copy_of_their_input() {
    // Hugging Face's RMSNorm keeps the fp32 upcast input (4h), the fp32 statistic and the
    // normalized tensor cast back (2h): 4h more per norm than a fused kernel.
    let fused = llama_8b();
    let hf = ModelSpec {
        implementation: Implementation::Hf,
        moe_dispatcher: MoeDispatcher::AllToAll,
        ..llama_8b()
    };
    let layout = Layout {
        seq_len: 1.0,
        ..Layout::default()
    };
    let (f, h) = (one(&fused, &layout), one(&hf, &layout));
    let width = 4096.0;
    assert_eq!(h.act_norm - f.act_norm, 32.0 * 2.0 * 4.0 * width);
    // (and not Megatron's mask of the labels)
    assert_eq!(h.act_logits - f.act_logits, 4.0 * width - 1.0);
    assert_eq!(h.act_mlp, f.act_mlp);
    // The cos and sin tables of every position: 2 x 128 head dims x 2 bytes.
    assert_eq!(h.act_attention - f.act_attention, 2.0 * 128.0 * 2.0);
}

#[test]
fn selective_recomputation_keeps_only_the_attention_cores_inputs() {
    // Llama-3-8B, one sequence of 1,024 tokens: selective recomputation frees the core's
    // fp32 log-sum-exp (4a) with flash attention, and with eager attention its
    // probabilities and expanded keys and values too (both keep q, unexpanded k and v, and
    // o_proj's input). Megatron-Core (`fused`) also rebuilds silu(gate) and the product
    // (2ef); `hf` keeps the MLP.
    let (layers, tokens, a, h, f) = (32.0, 1024.0, 32.0, 4096.0, 14336.0);
    let per_layer_token = layers * tokens;
    let at = |spec: &ModelSpec, recompute: f64, attention: f64, fp8: f64| {
        one(
            spec,
            &Layout {
                seq_len: tokens,
                recompute,
                attention,
                fp8,
                ..Layout::default()
            },
        )
    };
    let fused = llama_8b();
    let hf = ModelSpec {
        implementation: Implementation::Hf,
        moe_dispatcher: MoeDispatcher::AllToAll,
        ..llama_8b()
    };
    for spec in [&fused, &hf] {
        let (none, selective) = (at(spec, 0.0, 0.0, 0.0), at(spec, 1.0, 0.0, 0.0));
        let eager = at(spec, 1.0, 1.0, 0.0);
        assert_eq!(
            none.act_attention - selective.act_attention,
            per_layer_token * 4.0 * a
        );
        assert_eq!(eager.act_attention, selective.act_attention);
        assert!(at(spec, 0.0, 1.0, 0.0).act_attention > eager.act_attention + 1e6);
        assert_eq!(none.act_norm, selective.act_norm);
        let rebuilt = if spec.implementation == Implementation::Fused {
            per_layer_token * 2.0 * 2.0 * f
        } else {
            0.0
        };
        assert_eq!(none.act_mlp - selective.act_mlp, rebuilt);
    }
    // With FP8 linear layers the core's 16-bit output was kept besides o_proj's FP8 copy.
    let (none, selective) = (at(&fused, 0.0, 0.0, 1.0), at(&fused, 1.0, 0.0, 1.0));
    assert_eq!(
        none.act_attention - selective.act_attention,
        per_layer_token * (4.0 * a + 2.0 * h)
    );
    // Hugging Face's MLA copies the output for o_proj: the core's own output is freed too.
    let mla = ModelSpec {
        implementation: Implementation::Hf,
        moe_dispatcher: MoeDispatcher::AllToAll,
        ..deepseek_v3()
    };
    let (none, selective) = (at(&mla, 0.0, 0.0, 0.0), at(&mla, 1.0, 0.0, 0.0));
    assert_eq!(
        none.act_attention - selective.act_attention,
        61.0 * tokens * 128.0 * (4.0 + 2.0 * 128.0)
    );
}

#[test]
fn core_attn_keeps_the_mlp_and_the_fused_qkv_output() {
    // Megatron-Core's default selective recomputation (`core_attn`, code 3) against
    // `selective` (code 1), Llama-3-8B on 1,024 tokens: the same attention core rebuilt,
    // but the MLP keeps silu(gate) and the product (2 x 2f bytes) and the checkpoint's
    // values keep the fused QKV output alive, so the queries and keys before rotary too
    // (2 (a + g) d bytes); everything else as `selective`.
    let (layers, tokens, a, g, d, f) = (32.0, 1024.0, 32.0, 8.0, 128.0, 14336.0);
    let per_layer_token = layers * tokens;
    let at = |spec: &ModelSpec, recompute: f64, activation_model: f64| {
        one(
            spec,
            &Layout {
                seq_len: tokens,
                recompute,
                activation_model,
                ..Layout::default()
            },
        )
    };
    let fused = llama_8b();
    let (selective, core_attn) = (at(&fused, 1.0, 0.0), at(&fused, 3.0, 0.0));
    assert_eq!(
        core_attn.act_mlp - selective.act_mlp,
        per_layer_token * 4.0 * f
    );
    assert_eq!(
        core_attn.act_attention - selective.act_attention,
        per_layer_token * 2.0 * (a + g) * d
    );
    assert_eq!(core_attn.act_norm, selective.act_norm);
    // The MLP as without recomputation.
    assert_eq!(core_attn.act_mlp, at(&fused, 0.0, 0.0).act_mlp);
    // Learned positions: q and k are views of the QKV output as well, nothing more kept.
    let learned = ModelSpec {
        learned_positions: 4096,
        ..llama_8b()
    };
    assert_eq!(
        at(&learned, 3.0, 0.0).act_attention,
        at(&learned, 1.0, 0.0).act_attention
    );
    // MoE experts keep their activation too (Megatron-Core's `moe_act` is not in it).
    assert!(at(&mixtral(), 3.0, 0.0).act_mlp > at(&mixtral(), 1.0, 0.0).act_mlp);
    // `hf` has no selective mode of its own, and Korthikanti's table one selective mode:
    // the two are the same there.
    let hf = ModelSpec {
        implementation: Implementation::Hf,
        moe_dispatcher: MoeDispatcher::AllToAll,
        ..llama_8b()
    };
    assert_eq!(at(&hf, 3.0, 0.0), at(&hf, 1.0, 0.0));
    assert_eq!(at(&fused, 3.0, 1.0), at(&fused, 1.0, 1.0));
}

#[test]
fn megatron_modules_keep_the_inputs_of_their_checkpoints() {
    // Megatron-Core's `recompute_modules` (code 2 + the modules' bits), Llama-3-8B and
    // Mixtral on 1,024 tokens in bf16: a recomputed module keeps its input (2 h bytes
    // per token) and nothing inside it.
    let (layers, tokens, h) = (32.0, 1024.0, 4096.0);
    let per_layer_token = layers * tokens;
    let at = |spec: &ModelSpec, modules: u8| {
        one(
            spec,
            &Layout {
                seq_len: tokens,
                recompute: 2.0 + f64::from(modules),
                ..Layout::default()
            },
        )
    };
    let none = |spec: &ModelSpec| {
        one(
            spec,
            &Layout {
                seq_len: tokens,
                ..Layout::default()
            },
        )
    };
    // `core_attn` alone is code 3, Megatron-Core's default.
    let core_attn = Recompute::from_code(3.0).modules();
    assert!(core_attn.has(Modules::CORE_ATTN) && !core_attn.has(Modules::ALL - Modules::CORE_ATTN));
    let fused = llama_8b();
    let plain = none(&fused);
    // Dense `mlp`: the MLP and the pre-MLP norm fused into its first projection keep the
    // norm's input, the residual, only.
    let mlp = at(&fused, Modules::MLP);
    assert_eq!(mlp.act_mlp, per_layer_token * 2.0 * h);
    assert_eq!(
        plain.act_norm - mlp.act_norm,
        per_layer_token * (2.0 * h + 4.0)
    );
    assert_eq!(mlp.act_attention, plain.act_attention);
    // Transformer Engine fuses a dense layer's norms into the next projections, where
    // `layernorm` does not recompute them.
    assert_eq!(at(&fused, Modules::LAYERNORM), plain);
    // `hf` runs its norms alone: each keeps its input (2 h) instead of its fp32 copy,
    // statistic and output ((4 + 2) h + 4), and frees the next block's input.
    let hf = ModelSpec {
        implementation: Implementation::Hf,
        moe_dispatcher: MoeDispatcher::AllToAll,
        ..llama_8b()
    };
    let (hf_plain, hf_norms) = (none(&hf), at(&hf, Modules::LAYERNORM));
    assert_eq!(
        hf_plain.act_norm - hf_norms.act_norm,
        per_layer_token * 2.0 * (4.0 * h + 4.0)
    );
    assert_eq!(
        hf_plain.act_attention - hf_norms.act_attention,
        per_layer_token * 2.0 * h
    );
    assert_eq!(
        hf_plain.act_mlp - hf_norms.act_mlp,
        per_layer_token * 2.0 * h
    );
    // With `mlp` too the MLP keeps nothing: its input is the freed norm output.
    assert_eq!(at(&hf, Modules::MLP | Modules::LAYERNORM).act_mlp, 0.0);
    assert_eq!(at(&hf, Modules::MLP).act_mlp, per_layer_token * 2.0 * h);
    // MoE: `moe` keeps the layer's input; with `layernorm` (the pre-MLP norm is alone in
    // a MoE layer) not even that, and the norm keeps its input without its statistic.
    let mx = mixtral();
    let mx_plain = none(&mx);
    let moe = at(&mx, Modules::MOE);
    assert_eq!(moe.act_mlp, per_layer_token * 2.0 * h);
    assert_eq!(
        (moe.act_norm, moe.act_attention),
        (mx_plain.act_norm, mx_plain.act_attention)
    );
    let moe_norm = at(&mx, Modules::MOE | Modules::LAYERNORM);
    assert_eq!(moe_norm.act_mlp, 0.0);
    assert_eq!(mx_plain.act_norm - moe_norm.act_norm, per_layer_token * 4.0);
    assert_eq!(
        mx_plain.act_mlp - at(&mx, Modules::LAYERNORM).act_mlp,
        per_layer_token * 2.0 * h
    );
    // `mlp` is a dense layer's: nothing changes in a MoE layer.
    assert_eq!(at(&mx, Modules::MLP), mx_plain);
    // `shared_experts`: their gate, up, silu(gate) and product (4 x 2 x 2048 bytes per
    // token) in DeepSeek-V3's 58 MoE layers; the dense ones are untouched.
    let ds = deepseek_v3();
    let ds_tokens = 58.0 * tokens;
    assert_eq!(
        none(&ds).act_mlp - at(&ds, Modules::SHARED_EXPERTS).act_mlp,
        ds_tokens * 4.0 * 2.0 * 2048.0
    );
    // `mla_up_proj`: q, k, v and the rotary key part freed; each low-rank path keeps its
    // compressed input (the keys' and values' a view of the down projection's output,
    // rotary part included) instead of its norm and the up-projection's input.
    let (ql, kvl, rope, a, dq, dv) = (1536.0, 512.0, 64.0, 128.0, 192.0, 128.0);
    let up = at(&ds, Modules::MLA_UP_PROJ);
    let freed = (2.0 * 2.0 * ql + 4.0)
        + (2.0 * 2.0 * kvl + 4.0)
        + 2.0 * a * dq
        + 2.0 * a * (dq + dv)
        + 2.0 * rope
        - 2.0 * ql
        - 2.0 * (kvl + rope);
    assert_eq!(
        none(&ds).act_attention - up.act_attention,
        61.0 * tokens * freed
    );
    assert_eq!(up.act_mlp, none(&ds).act_mlp);
    // A model without MLA has no such projections.
    assert_eq!(at(&fused, Modules::MLA_UP_PROJ), plain);
    // `moe_act`: each routed copy rebuilds silu(gate) and the product (2 x 14336 bytes
    // each) from gate and up, as `selective` does; a dense MLP keeps its own.
    let act = at(&mx, Modules::MOE_ACT);
    assert_eq!(
        mx_plain.act_mlp - act.act_mlp,
        per_layer_token * 2.0 * 2.0 * 2.0 * 14336.0
    );
    assert_eq!(at(&fused, Modules::MOE_ACT), plain);
    // With `core_attn`, the routed experts keep what `selective` keeps.
    let selective = one(
        &mx,
        &Layout {
            seq_len: tokens,
            recompute: 1.0,
            ..Layout::default()
        },
    );
    assert_eq!(
        at(&mx, Modules::CORE_ATTN | Modules::MOE_ACT).act_mlp,
        selective.act_mlp
    );
}

#[test]
fn invalid_configurations_report_a_reason() {
    let spec = llama_8b();
    let check = |layout: Layout, reason: Invalid| {
        assert_eq!(
            estimate_one(&spec, &layout).unwrap(),
            Err(reason),
            "{layout:?}"
        );
    };
    let base = Layout::default();
    check(Layout { tp: 3.0, ..base }, Invalid::TpHeads);
    check(Layout { tp: 64.0, ..base }, Invalid::TpHeads);
    check(Layout { pp: 3.0, ..base }, Invalid::PpLayers);
    check(Layout { zero: 4.0, ..base }, Invalid::Zero);
    check(
        Layout {
            recompute: 130.0,
            ..base
        },
        Invalid::Recompute,
    );
    check(
        Layout {
            seq_len: f64::NAN,
            ..base
        },
        Invalid::SeqLen,
    );
    check(Layout { dp: -1.0, ..base }, Invalid::Dp);
    check(
        Layout {
            micro_batch: 1.5,
            ..base
        },
        Invalid::MicroBatch,
    );
    check(Layout { ep: 2.0, ..base }, Invalid::EpDense);
    check(
        Layout {
            param_bytes: -2.0,
            ..base
        },
        Invalid::Bytes,
    );
    let moe = mixtral();
    let layout = Layout {
        ep: 4.0,
        dp: 2.0,
        ..base
    };
    assert_eq!(estimate_one(&moe, &layout).unwrap(), Err(Invalid::EpDpCp));
    let layout = Layout {
        ep: 3.0,
        dp: 3.0,
        ..base
    };
    assert_eq!(
        estimate_one(&moe, &layout).unwrap(),
        Err(Invalid::EpExperts)
    );
    for (i, reason) in INVALID_REASONS.iter().enumerate() {
        assert_eq!(usize::from(reason.code()), i + 1);
        assert!(!reason.message().is_empty());
    }
}

#[test]
fn context_parallel_ranks_hold_sequences_padded_to_twice_cp() {
    // Load-balanced CP pads each sequence to a multiple of 2 cp: 4097 tokens on 4 ranks
    // become 4104, 1026 per rank, the same as a 4104-token sequence.
    let spec = llama_8b();
    let at = |seq_len: f64, cp: f64| {
        one(
            &spec,
            &Layout {
                seq_len,
                cp,
                ..Layout::default()
            },
        )
    };
    assert_eq!(at(4097.0, 4.0).activations, at(4104.0, 4.0).activations);
    assert!(at(4096.0, 4.0).activations < at(4097.0, 4.0).activations);
    // cp = 3 pads 4096 to 4098: 1366 tokens per rank.
    let per_token = at(1.0, 1.0).act_mlp;
    assert_eq!(at(4096.0, 3.0).act_mlp, 1366.0 * per_token);
    // No padding without CP.
    assert_eq!(at(4097.0, 1.0).act_mlp, 4097.0 * per_token);
}

#[test]
fn moe_capacity_and_expert_parallel_buffers() {
    let spec = mixtral();
    let base = Layout {
        seq_len: 1.0,
        dp: 8.0,
        ..Layout::default()
    };
    let dropless = one(&spec, &base);
    let padded = |moe_capacity_factor: f64, ep: f64| {
        one(
            &spec,
            &Layout {
                moe_capacity_factor,
                ep,
                ..base
            },
        )
    };
    assert_eq!(padded(1.0, 1.0), dropless);
    // Per routed copy (Megatron-Core): the gathered input (h), gate, up, silu(gate) and
    // the product (4 x 14336), the routing weight in bf16 and an int64 index; capacity
    // 1.5 adds half a copy of each of the top 2, in every one of the 32 layers.
    let h = 4096.0;
    let copy = 2.0 * (h + 4.0 * 14336.0) + 2.0 + 8.0;
    assert_eq!(
        padded(1.5, 1.0).act_mlp - dropless.act_mlp,
        32.0 * 2.0 * 0.5 * copy
    );
    // Expert parallelism adds the all-to-all send buffer of one layer's routed copies.
    assert_eq!(dropless.act_comm, 0.0);
    assert_eq!(padded(0.0, 8.0).act_comm, 2.0 * 2.0 * h);
    assert_eq!(padded(1.5, 8.0).act_comm, 3.0 * 2.0 * h);
}

#[test]
fn context_parallel_key_value_buffers() {
    // Llama-3-8B has 8 KV heads of 128: 2 x 8 x 128 x 2 bytes of keys and values per token.
    let spec = llama_8b();
    let at = |cp: f64, cp_comm: f64| {
        one(
            &spec,
            &Layout {
                seq_len: 8192.0,
                cp,
                cp_comm,
                ..Layout::default()
            },
        )
        .act_comm
    };
    let kv = 2.0 * 8.0 * 128.0 * 2.0;
    let local = 8192.0 / 4.0;
    assert_eq!(at(1.0, 0.0), 0.0);
    assert_eq!(at(4.0, 0.0), local * 2.0 * kv);
    assert_eq!(at(4.0, 1.0), local * 4.0 * kv);
    assert_eq!(at(4.0, 2.0), local * (kv + 2.0 * 32.0 * 256.0));
}

#[test]
fn fused_loss_fp8_and_optimizer_offload() {
    let spec = llama_8b();
    let base = Layout {
        seq_len: 1.0,
        ..Layout::default()
    };
    let plain = one(&spec, &base);
    let fused_loss = one(&spec, &Layout { loss: 1.0, ..base });
    assert_eq!(
        plain.act_logits - fused_loss.act_logits,
        4.0 * 128_256.0 + 1.0 - 4.0
    );
    // FP8 linear inputs, one byte instead of two: per layer the q/k/v input (saves h), the
    // MLP input (h) and the down projection's input (f); o_proj keeps a one-byte copy of
    // the attention output, which the kernel keeps in bf16 (costs h).
    let fp8 = one(&spec, &Layout { fp8: 1.0, ..base });
    let (h, f) = (4096.0, 14336.0);
    assert_eq!(plain.activations - fp8.activations, 32.0 * (h + h + f - h));
    let offload = one(
        &spec,
        &Layout {
            optimizer_offload: 0.25,
            ..base
        },
    );
    assert_eq!(offload.cpu_optimizer, plain.optimizer / 4.0);
    assert_eq!(offload.optimizer + offload.cpu_optimizer, plain.optimizer);
    assert_eq!(plain.total - offload.total, offload.cpu_optimizer);
}

#[test]
fn multi_token_prediction_lives_on_the_last_stage() {
    let without = deepseek_v3();
    let with = ModelSpec {
        mtp_layers: 1,
        ..deepseek_v3()
    };
    // One MTP module: an MoE layer like the last, three norms and a 2h x h projection.
    let h = 7168.0;
    let extra = with.total_params() - without.total_params();
    let moe_layer = without.layer_params(60, false).total();
    assert_eq!(extra, moe_layer + 3.0 * h + 2.0 * h * h);
    let layout = Layout {
        seq_len: 4096.0,
        pp: 16.0,
        dp: 64.0,
        ep: 64.0,
        pipeline_split: 1.0,
        ..Layout::default()
    };
    let stages = |spec: &ModelSpec| estimate_stages(&Prepared::new(spec), &layout).unwrap();
    let (plain, mtp) = (stages(&without), stages(&with));
    assert_eq!(plain[..15], mtp[..15]);
    assert_eq!(plain[15].act_mtp, 0.0);
    assert!(mtp[15].act_mtp > 0.0);
    // The last stage also holds a copy of the embedding (129,280 x 7168).
    let params = |b: &Breakdown| b.params / 2.0;
    let embedding = 129_280.0 * h;
    let expected = params(&plain[15]) + embedding + 3.0 * h + 2.0 * h * h;
    assert!(params(&mtp[15]) > expected);
}

#[test]
fn bad_spec_is_an_error() {
    let mut spec = llama_8b();
    spec.num_kv_heads = 5;
    assert!(estimate_one(&spec, &Layout::default()).is_err());
    let mut spec = mixtral();
    spec.top_k = 9;
    assert!(estimate_one(&spec, &Layout::default()).is_err());
}

#[test]
fn expert_parallelism_splits_only_experts() {
    let spec = mixtral();
    let b1 = one(
        &spec,
        &Layout {
            dp: 8.0,
            ..Layout::default()
        },
    );
    let b8 = one(
        &spec,
        &Layout {
            dp: 8.0,
            ep: 8.0,
            ..Layout::default()
        },
    );
    let experts = 32.0 * 8.0 * 3.0 * 4096.0 * 14336.0;
    assert_eq!(b1.params - b8.params, 2.0 * (experts - experts / 8.0));
    // Saved activations are the same; the all-to-all needs its buffers.
    assert_eq!(b1.activations + b8.act_comm, b8.activations);
}

/// Grid inputs holding `defaults` as scalars, except the listed `(field, values, strides)`.
fn grid_inputs<'a>(
    defaults: &'a [f64],
    scalar_strides: &'a [usize],
    varying: &[(usize, &'a [f64], &'a [usize])],
) -> Vec<GridInput<'a>> {
    let mut inputs: Vec<GridInput<'a>> = defaults
        .iter()
        .map(|v| GridInput {
            data: std::slice::from_ref(v).into(),
            strides: scalar_strides,
        })
        .collect();
    for &(field, data, strides) in varying {
        inputs[field] = GridInput {
            data: data.into(),
            strides,
        };
    }
    inputs
}

#[test]
fn grid_broadcasts_and_marks_invalid_cells() {
    let spec = llama_8b();
    let defaults = Layout::default().to_values();
    let tp = [1.0, 2.0, 3.0];
    let seq = [1024.0, 4096.0];
    let mut inputs = grid_inputs(&defaults, &[0, 0], &[(0, &seq, &[0, 1]), (3, &tp, &[1, 0])]);
    let out = estimate_grid(&spec, &[3, 2], &inputs).unwrap();
    assert_eq!(out.cells(), 6);
    assert_eq!(out.values.len(), 6 * N_OUTPUT_FIELDS);
    let mut invalid = 0;
    for cell in 0..6 {
        let layout = Layout {
            tp: tp[cell / 2],
            seq_len: seq[cell % 2],
            ..Layout::default()
        };
        let row: Vec<f64> = (0..N_OUTPUT_FIELDS).map(|f| out.field(f)[cell]).collect();
        match estimate_one(&spec, &layout).unwrap() {
            Ok(b) => {
                assert_eq!(row, b.to_values());
                assert_eq!(out.reasons[cell], 0);
            }
            Err(reason) => {
                invalid += 1;
                assert_eq!(out.reasons[cell], reason.code());
                assert!(row.iter().all(|v| v.is_nan()));
            }
        }
    }
    // tp = 3 divides neither the 32 heads nor the 8 KV heads.
    assert_eq!(invalid, 2);
    let bad = GridInput {
        data: tp[..].into(),
        strides: &[1, 1],
    };
    inputs[3] = bad;
    assert!(estimate_grid(&spec, &[3, 2], &inputs).is_err());
}

fn arb_layout() -> impl Strategy<Value = Layout> {
    (
        prop::sample::select(vec![128.0, 1024.0, 4096.0, 32768.0]),
        1u32..8,
        prop::sample::select(vec![1.0, 2.0, 4.0, 8.0]),
        prop::sample::select(vec![1.0, 2.0, 4.0, 8.0]),
        prop::sample::select(vec![1.0, 2.0, 4.0]),
        0u32..4,
        // Every code: the plain modes and the sets of Megatron-Core modules.
        0u32..130,
        0u32..2,
        0u32..2,
    )
        .prop_map(
            |(seq_len, mb, dp, tp, pp, zero, recompute, sp, model)| Layout {
                seq_len,
                micro_batch: f64::from(mb),
                dp,
                tp,
                pp,
                zero: f64::from(zero),
                recompute: f64::from(recompute),
                sequence_parallel: f64::from(sp),
                activation_model: f64::from(model),
                ..Layout::default()
            },
        )
}

proptest! {
    #[test]
    fn totals_add_up_and_more_tokens_never_use_less(layout in arb_layout()) {
        for spec in [llama_8b(), mixtral(), deepseek_v3()] {
            let Ok(b) = estimate_one(&spec, &layout).unwrap() else { continue };
            prop_assert_eq!(b.total, b.params + b.grads + b.optimizer + b.activations + b.overhead);
            let parts = b.act_attention + b.act_mlp + b.act_norm + b.act_embedding
                + b.act_logits + b.act_checkpoints + b.act_working;
            prop_assert!((b.activations - parts.ceil()).abs() < 1.0);
            let bigger = one(&spec, &Layout { micro_batch: layout.micro_batch + 1.0, ..layout });
            prop_assert!(bigger.total >= b.total);
        }
    }

    #[test]
    fn more_sharding_and_recompute_never_use_more(layout in arb_layout()) {
        let spec = llama_8b();
        let Ok(b) = estimate_one(&spec, &layout).unwrap() else { return Ok(()) };
        if layout.zero < 3.0 {
            let z = one(&spec, &Layout { zero: layout.zero + 1.0, ..layout });
            prop_assert!(z.params + z.grads + z.optimizer <= b.params + b.grads + b.optimizer);
        }
        // Recompute codes from the most kept to the least: none, core_attn, selective,
        // full, each step compared with both attentions where it holds. With flash
        // attention `core_attn` frees only the log-sum-exp and keeps the fused QKV output,
        // more than it frees: that step with eager attention only, whose probabilities
        // and expanded keys and values it frees (more than the QKV output for this
        // grouped-query model; not for every model at short lengths). Full keeps one
        // layer's working set beside the checkpoints: compared in Korthikanti's model.
        let (lighter, attentions): (f64, &[f64]) = match layout.recompute as u8 {
            0 => (3.0, &[1.0]),
            3 => (1.0, &[0.0, 1.0]),
            1 if layout.activation_model == 1.0 => (2.0, &[0.0, 1.0]),
            _ => (layout.recompute, &[]),
        };
        for &attention in attentions {
            let heavier = Layout { attention, ..layout };
            let r = one(&spec, &Layout { recompute: lighter, ..heavier });
            prop_assert!(r.activations <= one(&spec, &heavier).activations);
        }
    }

    #[test]
    fn recomputing_one_more_module_never_keeps_more(
        layout in arb_layout(),
        module in prop::sample::select(vec![
            Modules::MLP, Modules::LAYERNORM, Modules::MOE, Modules::SHARED_EXPERTS,
            Modules::MLA_UP_PROJ, Modules::MOE_ACT,
        ]),
        hf in any::<bool>(),
    ) {
        // A set of Megatron-Core modules with one more of them (not `core_attn`, which
        // keeps the fused QKV output alive), for dense and MoE models of both code bases.
        let set = if layout.recompute >= 3.0 { layout.recompute as u8 - 2 } else { 0 };
        let with = 2.0 + f64::from(set | module);
        let without = if set == 0 { 0.0 } else { layout.recompute };
        let implementation = if hf { Implementation::Hf } else { Implementation::Fused };
        for spec in [llama_8b(), mixtral(), deepseek_v3()] {
            let spec = ModelSpec { implementation, ..spec };
            let Ok(b) = estimate_one(&spec, &Layout { recompute: without, ..layout }).unwrap()
            else { continue };
            let r = one(&spec, &Layout { recompute: with, ..layout });
            prop_assert!(r.activations <= b.activations, "{} {} -> {}", module, without, with);
        }
    }
}

proptest! {
    #[test]
    fn the_reported_stage_is_the_first_busiest(
        (seq_len, mb, dp, tp, zero, recompute, model) in (
            prop::sample::select(vec![1024.0, 8192.0]),
            1u32..4,
            prop::sample::select(vec![1.0, 8.0]),
            prop::sample::select(vec![1.0, 4.0]),
            0u32..4,
            0u32..4,
            0u32..2,
        ),
        pp in prop::sample::select(vec![1.0, 2.0, 4.0, 8.0]),
        vpp in prop::sample::select(vec![1.0, 2.0]),
        accum in 0u32..12,
        first_dense in 0u64..6,
        tied in any::<bool>(),
    ) {
        // Dense, MoE and MoE with leading dense layers (DeepSeek-shaped, 64 layers so
        // that every pp divides), so stages differ in their layers as well as in flight.
        let deepseek = ModelSpec { num_layers: 64, first_dense_layers: first_dense, ..deepseek_v3() };
        let llama = ModelSpec { tied_embeddings: tied, ..llama_8b() };
        // And uneven stages: 61 layers split by the auto rule, 126 with explicit ends.
        let deepseek_61 = ModelSpec { first_dense_layers: first_dense, ..deepseek_v3() };
        let llama_126 = ModelSpec { num_layers: 126, ..llama_8b() };
        let uneven = [(deepseek_61, 1.0, 0.0, 0.0), (llama_126, 0.0, 6.0, 8.0)];
        let even = [llama, mixtral(), deepseek].map(|spec| (spec, 0.0, 0.0, 0.0));
        for (spec, pipeline_split, first_stage_layers, last_stage_layers) in even.into_iter().chain(uneven) {
            let layout = Layout {
                pipeline_split,
                first_stage_layers: if pp > 1.0 { first_stage_layers } else { 0.0 },
                last_stage_layers: if pp > 1.0 { last_stage_layers } else { 0.0 },
                seq_len,
                micro_batch: f64::from(mb),
                dp,
                tp,
                pp,
                vpp,
                zero: f64::from(zero),
                recompute: f64::from(recompute),
                activation_model: f64::from(model),
                grad_accum_steps: f64::from(accum),
                ..Layout::default()
            };
            let prep = Prepared::new(&spec);
            let Ok(stages) = estimate_stages(&prep, &layout) else { continue };
            let busiest = stages
                .iter()
                .fold(None::<&Breakdown>, |best, b| match best {
                    Some(best) if best.total >= b.total => Some(best),
                    _ => Some(b),
                })
                .unwrap();
            prop_assert_eq!(estimate(&prep, &layout).unwrap(), *busiest);
        }
    }
}

#[test]
fn grid_cells_across_blocks_equal_single_estimates() {
    // More cells than one worker block, four axes moving at different rates, so the
    // cursor both steps, wraps and restarts at block boundaries.
    let spec = llama_8b();
    let defaults = Layout::default().to_values();
    let shape = [7usize, 5, 3, 41];
    // Invalid values too: dp = 0 and zero = 4 in the same cells (dp is reported, being
    // the earlier field), tp = 5 and pp = 3 (they do not fit the model), micro_batch -1
    // (reported before dp where both are bad).
    let dp = [1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 0.0];
    let tp = [1.0, 2.0, 4.0, 8.0, 5.0];
    let pp = [1.0, 2.0, 3.0];
    let mut micro: Vec<f64> = (1..=41).map(f64::from).collect();
    micro[7] = -1.0;
    let zero = [0.0, 1.0, 2.0, 3.0, 1.0, 2.0, 4.0];
    let inputs = grid_inputs(
        &defaults,
        &[0; 4],
        &[
            (1, &micro, &[0, 0, 0, 1]),
            (2, &dp, &[1, 0, 0, 0]),
            (3, &tp, &[0, 1, 0, 0]),
            (4, &pp, &[0, 0, 1, 0]),
            (8, &zero, &[1, 0, 0, 0]),
        ],
    );
    let out = estimate_grid(&spec, &shape, &inputs).unwrap();
    assert!(out.cells() > 4096);
    let mut cell = 0;
    for (a, (&dp, &zero)) in dp.iter().zip(&zero).enumerate() {
        for &tp in &tp {
            for &pp in &pp {
                for &micro_batch in &micro {
                    let layout = Layout {
                        dp,
                        zero,
                        tp,
                        pp,
                        micro_batch,
                        ..Layout::default()
                    };
                    let row: Vec<f64> = (0..N_OUTPUT_FIELDS).map(|f| out.field(f)[cell]).collect();
                    match estimate_one(&spec, &layout).unwrap() {
                        Ok(b) => assert_eq!(row, b.to_values(), "cell {cell} (axis 0 = {a})"),
                        Err(reason) => assert_eq!(out.reasons[cell], reason.code()),
                    }
                    cell += 1;
                }
            }
        }
    }
    assert_eq!(cell, out.cells());
    let count = |reason: Invalid| out.reasons.iter().filter(|&&r| r == reason.code()).count();
    // micro_batch comes before dp in field order.
    assert_eq!(count(Invalid::Dp), 5 * 3 * 40);
    assert_eq!(count(Invalid::Zero), 0);
    assert_eq!(count(Invalid::MicroBatch), 7 * 5 * 3);
    assert!(count(Invalid::TpHeads) > 0 && count(Invalid::PpLayers) > 0);
}

#[test]
fn each_field_check_names_its_field() {
    let defaults = Layout::default().to_values();
    for (field, name) in LAYOUT_FIELDS.iter().enumerate() {
        assert_eq!(check_field(field, defaults[field]), Ok(()), "{name}");
        let reason = check_field(field, f64::NAN).unwrap_err();
        let message = reason.message();
        assert!(
            message.starts_with(name) || (reason == Invalid::Bytes && name.ends_with("_bytes")),
            "{name}: {message}"
        );
        assert_eq!(check_field(field, -1.0).unwrap_err(), reason, "{name}");
    }
}

#[test]
fn absurd_mla_head_sizes_are_an_error_not_an_overflow() {
    // qk_nope_head_dim + qk_rope_head_dim used to overflow u64 (a panic with overflow
    // checks, a wrapped size that passed validation without). Found by the `memory_grid`
    // fuzz target.
    let mut spec = deepseek_v3();
    spec.qk_nope_head_dim = u64::MAX;
    spec.qk_rope_head_dim = 560;
    assert!(spec.validate().is_err());
    assert!(estimate_one(&spec, &Layout::default()).is_err());
}

#[test]
fn unused_shared_expert_width_does_not_overflow() {
    // Every layer dense, so the (absurd) shared-expert width adds no parameter and the
    // spec is valid; its activations used to multiply it in u64 and overflow. Found by
    // the `memory_grid` fuzz target.
    let mut spec = mixtral();
    spec.first_dense_layers = spec.num_layers;
    spec.num_shared_experts = u64::MAX / 2;
    let breakdown = one(&spec, &Layout::default());
    assert!(breakdown.total.is_finite() && breakdown.total > 0.0);
}

#[test]
fn pipeline_splits_of_published_layouts() {
    // Llama 3.1 405B on 16 stages: one layer fewer on the first and the last stage
    // (Dubey et al. 2024), which is Megatron's embedding-and-loss accounting.
    let auto = StageLayers::new(126, 16, 1, PipelineSplit::Auto, 0, 0).unwrap();
    let accounted = StageLayers::new(126, 16, 1, PipelineSplit::EmbeddingAndLoss, 0, 0).unwrap();
    let explicit = StageLayers::new(126, 16, 1, PipelineSplit::Even, 7, 7).unwrap();
    for split in [auto, accounted, explicit] {
        let layers: Vec<u64> = (0..16).map(|i| split.stage_layers(i)).collect();
        assert_eq!(layers, [vec![7], vec![8; 14], vec![7]].concat());
    }
    // 61 layers on 16 stages: 3 + 14 x 4 + 2 (Megatron-LM's Kimi-K2 configuration).
    let deepseek = StageLayers::new(61, 16, 1, PipelineSplit::Auto, 0, 0).unwrap();
    let layers: Vec<u64> = (0..16).map(|i| deepseek.stage_layers(i)).collect();
    assert_eq!(layers, [vec![3], vec![4; 14], vec![2]].concat());
    assert_eq!(deepseek.leading_layers_on(0, 3), 3);
    assert_eq!(deepseek.leading_layers_on(1, 3), 0);
    // Even splits need divisibility; so do the accounted units.
    assert!(StageLayers::new(61, 16, 1, PipelineSplit::Even, 0, 0).is_none());
    assert!(StageLayers::new(61, 16, 1, PipelineSplit::EmbeddingAndLoss, 0, 0).is_none());
    assert!(StageLayers::new(126, 16, 1, PipelineSplit::Auto, 7, 7).is_none());
    assert!(StageLayers::new(126, 1, 1, PipelineSplit::Even, 7, 0).is_none());
    // Interleaving: explicit stage sizes must be multiples of vpp.
    assert!(StageLayers::new(126, 16, 2, PipelineSplit::Even, 7, 7).is_none());
    let interleaved = StageLayers::new(128, 16, 2, PipelineSplit::Even, 6, 10).unwrap();
    assert_eq!(interleaved.chunk_layers(0, 1), 3);
    assert_eq!(interleaved.chunk_layers(15, 0), 5);
    assert_eq!(interleaved.stage_layers(7), 8);
}

#[test]
fn huge_pipeline_degrees_are_an_invalid_cell() {
    // `pp * vpp` wrapped to 0 for these (a division by zero); such a cell is invalid.
    let huge = 1u64 << 33;
    let mut layout = Layout {
        pp: huge as f64,
        vpp: huge as f64,
        ..Layout::default()
    };
    assert_eq!(
        estimate_one(&llama_8b(), &layout).unwrap(),
        Err(Invalid::PpLayers)
    );
    layout.vpp = 1.0;
    assert_eq!(
        estimate_one(&llama_8b(), &layout).unwrap(),
        Err(Invalid::PpLayers)
    );
}

/// Megatron-LM's `get_num_layers_to_build` and `get_transformer_layer_offset` for one
/// virtual stage, transcribed (vpp given explicitly; `first`/`last` 0 when not set).
fn megatron_chunk(
    num_layers: u64,
    pp: u64,
    vpp: u64,
    split: PipelineSplit,
    (first, last): (u64, u64),
    (stage, chunk): (u64, u64),
) -> (u64, u64) {
    let (is_first, is_last) = (stage == 0, stage == pp - 1);
    let (embedding, loss) = match split {
        PipelineSplit::Embedding => (true, false),
        PipelineSplit::Loss => (false, true),
        PipelineSplit::EmbeddingAndLoss => (true, true),
        _ => (false, false),
    };
    if first > 0 || last > 0 {
        let middle_stages = pp - u64::from(first > 0) - u64::from(last > 0);
        let middle_layers = num_layers - first - last;
        let per_stage = if is_first && first > 0 {
            first
        } else if is_last && last > 0 {
            last
        } else {
            middle_layers.checked_div(middle_stages).unwrap_or(0)
        };
        let (f, l, m) = (first / vpp, last / vpp, middle_layers / vpp);
        let middle_rank = if first > 0 {
            stage.saturating_sub(1)
        } else {
            stage
        };
        let offset = if stage == 0 {
            chunk * (f + m + l)
        } else {
            // Megatron divides by the middle stages here even when there are none (pp = 2
            // with both ends given); the product is 0 then.
            chunk * (f + m + l) + f + middle_rank * m.checked_div(middle_stages).unwrap_or(0)
        };
        return (per_stage / vpp, offset);
    }
    let units = num_layers + u64::from(embedding) + u64::from(loss);
    let per_chunk = units / pp / vpp;
    let mut count = per_chunk;
    if embedding && is_first && chunk == 0 {
        count -= 1;
    }
    if loss && is_last && chunk == vpp - 1 {
        count -= 1;
    }
    let mut offset = (chunk * pp + stage) * per_chunk;
    if embedding && (stage, chunk) != (0, 0) {
        offset -= 1;
    }
    (count, offset)
}

proptest! {
    #[test]
    fn pipeline_splits_agree_with_megatron(
        num_layers in 1u64..140,
        pp in 1u64..17,
        vpp in 1u64..4,
        split in 0u8..5,
        first in 0u64..12,
        last in 0u64..12,
        leading in 0u64..8,
    ) {
        let split = PipelineSplit::from_code(f64::from(split)).unwrap();
        let Some(stages) = StageLayers::new(num_layers, pp, vpp, split, first, last) else {
            return Ok(());
        };
        let mut next_layer = 0;
        for virtual_stage in 0..pp * vpp {
            let (stage, chunk) = (virtual_stage % pp, virtual_stage / pp);
            let count = stages.chunk_layers(stage, chunk);
            if split != PipelineSplit::Auto {
                let reference = megatron_chunk(num_layers, pp, vpp, split, (first, last), (stage, chunk));
                prop_assert_eq!((count, next_layer), reference, "stage {} chunk {}", stage, chunk);
            }
            next_layer += count;
        }
        prop_assert_eq!(next_layer, num_layers);
        let total: u64 = (0..pp).map(|i| stages.stage_layers(i)).sum();
        prop_assert_eq!(total, num_layers);
        let leading_total: u64 = (0..pp).map(|i| stages.leading_layers_on(i, leading)).sum();
        prop_assert_eq!(leading_total, leading.min(num_layers));
        if split == PipelineSplit::Auto {
            // Auto never gives the first or last stage more layers than a middle one, and
            // is the even split whenever that exists.
            let most = (0..pp).map(|i| stages.stage_layers(i)).max().unwrap();
            prop_assert!(stages.stage_layers(0) <= most && stages.stage_layers(pp - 1) <= most);
            if num_layers % (pp * vpp) == 0 {
                prop_assert!((0..pp).all(|i| stages.stage_layers(i) == num_layers / pp));
            }
        }
    }
}

/// seq_len, dp, tp, pp, recompute, pipeline split, expert parallelism (0: 1, 1: 2).
type ListCell = (f64, f64, f64, f64, u32, u32, u32);

proptest! {
    #[test]
    fn a_list_of_configurations_equals_single_estimates(
        cells in prop::collection::vec(
            (
                prop::sample::select(vec![1024.0, 4096.0, 8192.0, -1.0]),
                prop::sample::select(vec![1.0, 2.0, 3.0, 8.0]),
                prop::sample::select(vec![1.0, 2.0, 4.0, 3.0]),
                prop::sample::select(vec![1.0, 2.0, 3.0, 4.0]),
                0u32..5,
                0u32..3,
                0u32..2,
            ),
            1..200,
        ),
        zero in prop::sample::select(vec![0.0, 1.0, 7.0]),
    ) {
        // Columns for seq_len, dp, tp, pp, zero... and a scalar `zero` that may itself be
        // invalid (then every cell reports it, unless an earlier field fails first).
        let spec = mixtral();
        let defaults = Layout::default().to_values();
        let column = |f: &dyn Fn(&ListCell) -> f64| -> Vec<f64> {
            cells.iter().map(f).collect()
        };
        let seq = column(&|c| c.0);
        let dp = column(&|c| c.1);
        let tp = column(&|c| c.2);
        let pp = column(&|c| c.3);
        let recompute = column(&|c| f64::from(c.4));
        let split = column(&|c| f64::from(c.5));
        let ep = column(&|c| if c.6 == 1 { 2.0 } else { 1.0 });
        let zero_value = [zero];
        let mut inputs = grid_inputs(
            &defaults,
            &[0],
            &[
                (0, &seq, &[1]),
                (2, &dp, &[1]),
                (3, &tp, &[1]),
                (4, &pp, &[1]),
                (6, &ep, &[1]),
                (10, &recompute, &[1]),
                (25, &split, &[1]),
            ],
        );
        inputs[8] = GridInput { data: zero_value[..].into(), strides: &[0] };
        let out = estimate_grid(&spec, &[cells.len()], &inputs).unwrap();
        for (i, _) in cells.iter().enumerate() {
            let layout = Layout {
                seq_len: seq[i],
                dp: dp[i],
                tp: tp[i],
                pp: pp[i],
                ep: ep[i],
                recompute: recompute[i],
                pipeline_split: split[i],
                zero,
                ..Layout::default()
            };
            let row: Vec<f64> = (0..N_OUTPUT_FIELDS).map(|f| out.field(f)[i]).collect();
            match estimate_one(&spec, &layout).unwrap() {
                Ok(b) => {
                    prop_assert_eq!(out.reasons[i], 0);
                    prop_assert_eq!(row, b.to_values().to_vec());
                }
                Err(reason) => {
                    prop_assert_eq!(out.reasons[i], reason.code());
                    prop_assert!(row.iter().all(|v| v.is_nan()));
                }
            }
        }
    }
}

proptest! {
    #[test]
    fn field_checks_are_the_plain_definitions(
        field in 0usize..N_LAYOUT_FIELDS,
        x in prop_oneof![
            prop::sample::select(vec![
                0.0, -0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 0.5, 1.5, -1.0, 2.0f64.powi(52),
                2.0f64.powi(52) + 1.0, 2.0f64.powi(53) + 2.0, 1e300, f64::MAX, f64::INFINITY,
                f64::NEG_INFINITY, f64::NAN, f64::MIN_POSITIVE, 4503599627370495.5,
            ]),
            any::<f64>(),
            (0u64..135).prop_map(|n| n as f64),
        ],
    ) {
        // The branch-free checks, against their definitions.
        let whole = x.is_finite() && x.fract() == 0.0;
        let expected = match field {
            0..=7 => whole && x >= 1.0,
            8 => whole && (0.0..=3.0).contains(&x),
            // 0 to 2 the plain modes, 3 to 129 the sets of Megatron-Core modules.
            10 => whole && (0.0..=129.0).contains(&x),
            9 | 19 | 20 | 21 | 28 | 29 => x == 0.0 || x == 1.0,
            27 => x == 0.0 || x == 1.0 || x == 2.0,
            11 | 23 | 24 => whole && x >= 0.0,
            25 => whole && (0.0..=4.0).contains(&x),
            30 => (0.0..=1.0).contains(&x),
            _ => x.is_finite() && x >= 0.0,
        };
        prop_assert_eq!(check_field(field, x).is_ok(), expected, "field {} x {}", field, x);
    }
}

#[test]
fn set_writes_the_field_named_by_its_index() {
    for field in 0..N_LAYOUT_FIELDS {
        let mut layout = Layout::default();
        layout.set(field, 1234.5);
        let values = layout.to_values();
        for (other, &value) in values.iter().enumerate() {
            let expected = if other == field {
                1234.5
            } else {
                Layout::default().to_values()[other]
            };
            assert_eq!(value, expected, "set({field}) changed field {other}");
        }
        assert_eq!(Layout::from_values(&values), layout);
    }
    let mut layout = Layout::default();
    layout.set(N_LAYOUT_FIELDS, 1.0);
    assert_eq!(layout, Layout::default());
}

/// Values each layout field takes in the tests that vary every field, the default first:
/// mostly valid, some that do not fit every model (cp 3 pads, pp 4 with explicit first and
/// last stages may not split).
const FIELD_VALUES: [&[f64]; N_LAYOUT_FIELDS] = [
    &[512.0, 1000.0, 4096.0],
    &[1.0, 2.0, 3.0],
    &[1.0, 2.0, 4.0, 8.0],
    &[1.0, 2.0, 4.0],
    &[1.0, 2.0, 4.0],
    &[1.0, 2.0, 3.0],
    &[1.0, 2.0, 4.0],
    &[1.0, 2.0],
    &[0.0, 1.0, 2.0, 3.0],
    &[0.0, 1.0],
    &[0.0, 1.0, 2.0],
    &[0.0, 1.0, 3.0, 8.0],
    &[2.0, 1.0, 4.0],
    &[2.0, 4.0],
    &[0.0, 4.0],
    &[4.0, 0.0],
    &[8.0, 0.0, 4.0],
    &[2.0, 1.0, 4.0],
    &[4.0, 2.0],
    &[0.0, 1.0],
    &[0.0, 1.0],
    &[0.0, 1.0],
    &[0.0, 1e9],
    &[0.0, 0.0, 2.0],
    &[0.0, 0.0, 1.0],
    &[0.0, 1.0, 2.0, 3.0, 4.0],
    &[0.0, 1.25],
    &[0.0, 1.0, 2.0],
    &[0.0, 1.0],
    &[0.0, 1.0],
    &[0.0, 0.5],
];

/// An index into a field's [`FIELD_VALUES`] (modulo their number), the first (a default
/// that fits every model) half of the time, so that many configurations are valid.
fn value_pick() -> impl Strategy<Value = usize> {
    prop_oneof![Just(0usize), 0usize..60]
}

/// Models that take every branch of the formulas: Hugging Face and fused kernels, dense,
/// MoE with a sigmoid grouped router, MLA with multi-token prediction, GPT-style blocks.
fn every_kind_of_model() -> Vec<ModelSpec> {
    let small = |spec: ModelSpec| ModelSpec {
        num_layers: 16,
        ..spec
    };
    vec![
        small(ModelSpec {
            implementation: Implementation::Hf,
            moe_dispatcher: MoeDispatcher::AllToAll,
            num_kv_heads: 4,
            ..llama_8b()
        }),
        small(mixtral()),
        ModelSpec {
            num_layers: 16,
            first_dense_layers: 1,
            mtp_layers: 1,
            implementation: Implementation::Hf,
            moe_dispatcher: MoeDispatcher::AllToAll,
            ..deepseek_v3()
        },
        small(ModelSpec {
            ffn_type: FfnType::Gelu,
            norm: NormType::LayerNorm,
            learned_positions: 2048,
            tied_embeddings: true,
            linear_bias: true,
            num_kv_heads: 32,
            ..llama_8b()
        }),
    ]
}

/// The layout of every cell of a grid whose field `f` takes `values[f][index[axes[f]]]`
/// (`axes[f]` None: its only value), the last axis fastest.
fn cell_layouts(shape: &[usize], axes: &[Option<usize>], values: &[Vec<f64>]) -> Vec<Layout> {
    let cells: usize = shape.iter().product();
    (0..cells)
        .map(|cell| {
            let mut index = vec![0; shape.len()];
            let mut rest = cell;
            for d in (0..shape.len()).rev() {
                index[d] = rest % shape[d];
                rest /= shape[d];
            }
            let mut row = [0.0; N_LAYOUT_FIELDS];
            for (f, value) in row.iter_mut().enumerate() {
                *value = values[f][axes[f].map_or(0, |a| index[a])];
            }
            Layout::from_values(&row)
        })
        .collect()
}

/// Every cell of `out` equals the single estimate of its layout (or its reason).
fn assert_cells_are_single_estimates(
    spec: &ModelSpec,
    out: &GridTable,
    layouts: &[Layout],
) -> std::result::Result<usize, TestCaseError> {
    prop_assert_eq!(out.cells(), layouts.len());
    let mut valid = 0;
    for (i, layout) in layouts.iter().enumerate() {
        let row: Vec<f64> = (0..N_OUTPUT_FIELDS).map(|f| out.field(f)[i]).collect();
        match estimate_one(spec, layout).unwrap() {
            Ok(b) => {
                prop_assert_eq!(out.reasons[i], 0, "cell {} {:?}", i, layout);
                prop_assert_eq!(row, b.to_values().to_vec(), "cell {} {:?}", i, layout);
                valid += 1;
            }
            Err(reason) => prop_assert_eq!(out.reasons[i], reason.code(), "cell {}", i),
        }
    }
    Ok(valid)
}

proptest! {
    /// Each configuration followed by its variants in one field: what a grid computes once
    /// for cells that share the fields it depends on must not miss a field it also depends
    /// on (a variant would then get its configuration's values).
    #[test]
    fn cells_differing_in_any_one_field_equal_single_estimates(
        picks in prop::collection::vec(prop::array::uniform31(value_pick()), 1..12),
    ) {
        let mut rows = Vec::new();
        for pick in &picks {
            let base: [f64; N_LAYOUT_FIELDS] =
                std::array::from_fn(|f| FIELD_VALUES[f][pick[f] % FIELD_VALUES[f].len()]);
            rows.push(base);
            for f in 0..N_LAYOUT_FIELDS {
                let mut variant = base;
                variant[f] = FIELD_VALUES[f][(pick[f] + 1) % FIELD_VALUES[f].len()];
                rows.push(variant);
                rows.push(base);
            }
        }
        let columns: Vec<Vec<f64>> =
            (0..N_LAYOUT_FIELDS).map(|f| rows.iter().map(|row| row[f]).collect()).collect();
        let n = rows.len();
        let layouts = cell_layouts(&[n], &[Some(0); N_LAYOUT_FIELDS], &columns);
        for spec in every_kind_of_model() {
            // As a list of configurations, and as a two-dimensional broadcast of the same
            // cells (another path through the grid).
            let list: Vec<GridInput> = columns
                .iter()
                .map(|c| GridInput { data: c[..].into(), strides: &[1] })
                .collect();
            let out = estimate_grid(&spec, &[n], &list).unwrap();
            assert_cells_are_single_estimates(&spec, &out, &layouts)?;
            let broadcast: Vec<GridInput> = columns
                .iter()
                .map(|c| GridInput { data: c[..].into(), strides: &[1, 0] })
                .collect();
            let out = estimate_grid(&spec, &[n, 1], &broadcast).unwrap();
            assert_cells_are_single_estimates(&spec, &out, &layouts)?;
        }
    }

}

/// The grid's cells (a list, then the same cells as a two-dimensional broadcast) and the
/// stages of each cell's single estimate, checked against its single estimate.
fn assert_grid_and_stages_agree(
    spec: &ModelSpec,
    layouts: &[Layout],
) -> std::result::Result<GridTable, TestCaseError> {
    let n = layouts.len();
    let columns: Vec<Vec<f64>> = (0..N_LAYOUT_FIELDS)
        .map(|f| layouts.iter().map(|l| l.to_values()[f]).collect())
        .collect();
    let list: Vec<GridInput> = columns
        .iter()
        .map(|c| GridInput {
            data: c[..].into(),
            strides: &[1],
        })
        .collect();
    let out = estimate_grid(spec, &[n], &list).unwrap();
    assert_cells_are_single_estimates(spec, &out, layouts)?;
    let broadcast: Vec<GridInput> = columns
        .iter()
        .map(|c| GridInput {
            data: c[..].into(),
            strides: &[1, 0],
        })
        .collect();
    let grid = estimate_grid(spec, &[n, 1], &broadcast).unwrap();
    prop_assert_eq!(&grid.reasons, &out.reasons);
    let prep = Prepared::new(spec);
    for layout in layouts {
        // `estimate_memory_stages` refuses what `estimate_memory` refuses.
        let single = estimate(&prep, layout).map(|_| ());
        let stages = estimate_stages(&prep, layout).map(|_| ());
        prop_assert_eq!(single, stages, "{:?}", layout);
    }
    Ok(out)
}

#[test]
fn absurd_inputs_are_an_overflow_not_infinite_or_nan_bytes() {
    // seq_len x micro_batch beyond f64 made the activations infinite and, times a zero
    // communication buffer, the total NaN in a cell reported valid (found by the
    // `memory_grid` fuzz target); the same for every input that multiplies bytes.
    let base = Layout::default();
    let dense = [
        Layout {
            seq_len: 1.3e241,
            micro_batch: 5.9e170,
            ..base
        },
        Layout {
            seq_len: f64::MAX,
            ..base
        },
        Layout {
            micro_batch: 1e300,
            ..base
        },
        Layout {
            micro_batch: 1e300,
            pp: 4.0,
            recompute: 2.0,
            ..base
        },
        Layout {
            seq_len: 1e303,
            cp: 2.0,
            recompute: 1.0,
            ..base
        },
        // Eager attention keeps seq_len^2 probabilities: 1e160 tokens are enough.
        Layout {
            seq_len: 1e160,
            attention: 1.0,
            ..base
        },
        Layout {
            seq_len: 1e160,
            activation_model: 1.0,
            ..base
        },
        Layout {
            param_bytes: f64::MAX,
            ..base
        },
        Layout {
            grad_buffer_bytes: 1e300,
            ..base
        },
        Layout {
            master_bytes: f64::MAX,
            optimizer_offload: 0.5,
            ..base
        },
        Layout {
            optimizer_state_bytes: f64::MAX,
            optimizer_offload: 1.0,
            ..base
        },
        Layout {
            activation_bytes: f64::MAX,
            ..base
        },
        Layout {
            logits_bytes: f64::MAX,
            pp: 2.0,
            ..base
        },
        Layout {
            overhead_bytes: f64::MAX,
            micro_batch: 1e290,
            ..base
        },
    ];
    let moe = [
        Layout {
            moe_capacity_factor: 1e300,
            ep: 2.0,
            dp: 2.0,
            ..base
        },
        Layout {
            moe_capacity_factor: f64::MAX,
            pp: 2.0,
            recompute: 2.0,
            ..base
        },
        Layout {
            seq_len: 1e303,
            ep: 4.0,
            dp: 4.0,
            ..base
        },
    ];
    for (spec, layouts) in [(llama_8b(), &dense[..]), (mixtral(), &moe[..])] {
        for layout in layouts {
            assert_eq!(
                estimate_one(&spec, layout).unwrap(),
                Err(Invalid::Overflow),
                "{layout:?}"
            );
        }
        let out = assert_grid_and_stages_agree(&spec, layouts).unwrap();
        assert!(out.reasons.iter().all(|&r| r == Invalid::Overflow.code()));
    }
    // Large but representable inputs stay valid: 1e300 bytes of overhead, and 2^60 tokens.
    for layout in [
        Layout {
            overhead_bytes: 1e300,
            ..base
        },
        Layout {
            micro_batch: 2f64.powi(48),
            ..base
        },
    ] {
        let b = one(&llama_8b(), &layout);
        assert!(b.to_values().iter().all(|v| v.is_finite()), "{b:?}");
    }
}

/// Fields that take unbounded values, each with the largest of them passing its own check
/// (from 2^53 on every double is a whole number, so counts can be huge too).
const UNBOUNDED_FIELDS: [usize; 19] = [
    0, 1, 2, 3, 4, 5, 6, 7, 11, 12, 13, 14, 15, 16, 17, 18, 22, 23, 24,
];

/// A huge finite value: a power of ten from 1e16 (whole) to 1e308, or the largest double.
fn huge() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(f64::MAX),
        (16i32..=308, 1.0f64..1.79).prop_map(|(e, m)| (m * 10f64.powi(e)).min(f64::MAX)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    /// Every valid cell's outputs are finite and non-negative, whatever huge finite values
    /// its fields take, on dense, MoE, MLA and GPT-style models, with and without context,
    /// expert and pipeline parallelism and recomputation (the configurations of
    /// `FIELD_VALUES`); a cell past the range of a float is `Overflow`, in the grid, the
    /// single estimate and the estimate of every stage alike.
    #[test]
    fn valid_cells_have_finite_outputs_over_huge_inputs(
        cells in prop::collection::vec(
            (
                prop::array::uniform31(value_pick()),
                prop::collection::vec((prop::sample::select(&UNBOUNDED_FIELDS[..]), huge()), 1..4),
                // moe_capacity_factor, huge or not (its values otherwise keep MoE valid).
                prop::option::of(huge()),
            ),
            1..8,
        ),
    ) {
        let layouts: Vec<Layout> = cells
            .iter()
            .map(|(picks, huge_fields, capacity)| {
                let mut row: [f64; N_LAYOUT_FIELDS] =
                    std::array::from_fn(|f| FIELD_VALUES[f][picks[f] % FIELD_VALUES[f].len()]);
                for &(field, value) in huge_fields {
                    row[field] = value;
                }
                if let Some(capacity) = capacity {
                    row[26] = *capacity;
                }
                Layout::from_values(&row)
            })
            .collect();
        for spec in every_kind_of_model() {
            let out = assert_grid_and_stages_agree(&spec, &layouts)?;
            for (cell, layout) in layouts.iter().enumerate() {
                let row: Vec<f64> = (0..N_OUTPUT_FIELDS).map(|f| out.field(f)[cell]).collect();
                if out.reasons[cell] == 0 {
                    prop_assert!(
                        row.iter().all(|v| v.is_finite() && *v >= 0.0),
                        "{:?}: {:?}", layout, row
                    );
                } else {
                    prop_assert!(row.iter().all(|v| v.is_nan()));
                }
            }
        }
    }
}

#[test]
fn an_empty_grid_reads_no_input() {
    // A grid of zero cells whose inputs are empty read value 0 of an empty buffer (an
    // out-of-bounds panic). Found by the `memory_grid` fuzz target.
    let empty: [f64; 0] = [];
    let strides = [0usize];
    let inputs = vec![
        GridInput {
            data: Values::F64(&empty),
            strides: &strides,
        };
        N_LAYOUT_FIELDS
    ];
    let table = estimate_grid(&llama_8b(), &[0], &inputs).unwrap();
    assert_eq!(table.cells(), 0);
}

#[test]
fn pipeline_splits_of_absurd_sizes_are_none_not_an_overflow() {
    // pp x vpp (and the layer sums after it) overflowed u64 for sizes no split can hold.
    // Found by the `memory_grid` fuzz target.
    for (layers, pp, vpp, first, last) in [
        (32, u64::MAX / 2, 3, 0, 0),
        (u64::MAX, 4, 1, 0, 0),
        (32, 4, 1, u64::MAX, u64::MAX),
    ] {
        for split in [
            PipelineSplit::Even,
            PipelineSplit::Auto,
            PipelineSplit::EmbeddingAndLoss,
        ] {
            assert!(StageLayers::new(layers, pp, vpp, split, first, last).is_none());
        }
    }
    assert!(StageLayers::new(32, 4, 1, PipelineSplit::Even, 0, 0).is_some());
}

#[test]
fn experts_divide_huge_data_parallel_groups_exactly() {
    // `ep` must divide `dp * cp`, also where the product is past 2^64 (as a float, its
    // conversion to an integer would saturate) or past 2^53 (where it would round).
    let spec = mixtral();
    let two_pow = |k: i32| 2f64.powi(k);
    for (dp, cp, ep, fits) in [
        (two_pow(70), 1.0, 2.0, true),
        (two_pow(70), 1.0, 8.0, true),
        (3.0 * two_pow(70), 1.0, 8.0, true),
        // An odd dp times 3: odd, though the float product rounds to an even number.
        (two_pow(53) - 1.0, 3.0, 2.0, false),
        (two_pow(53) - 1.0, 6.0, 2.0, true),
        (two_pow(53) - 1.0, 6.0, 4.0, false),
        (two_pow(53) - 1.0, 3.0 * two_pow(60), 8.0, true),
        (1e300, 1.0, 4.0, true),
    ] {
        let layout = Layout {
            seq_len: 1024.0,
            dp,
            cp,
            ep,
            ..Layout::default()
        };
        let group = validate(&spec, &layout);
        assert_eq!(
            group != Err(Invalid::EpDpCp),
            fits,
            "dp {dp:e} cp {cp} ep {ep}: {group:?}"
        );
    }
}

#[test]
fn routed_copies_are_not_divided_by_sequence_parallelism() {
    // Mixtral, fused, tp = 2: sequence parallelism halves what a rank keeps of its part of
    // the sequence (the MoE block's input, the router's tensors, the sort's int64 index per
    // copy), not the routed copies, which every rank of the group runs for all its tokens
    // (measured against Megatron-Core in tests/test_memory_megatron_core_parallel.py).
    let spec = ModelSpec {
        implementation: Implementation::Fused,
        ..mixtral()
    };
    let at = |sequence_parallel: f64| {
        one(
            &spec,
            &Layout {
                seq_len: 1.0,
                tp: 2.0,
                sequence_parallel,
                ..Layout::default()
            },
        )
        .act_mlp
    };
    let (h, k, experts) = (4096.0, 2.0, 8.0);
    // Softmax router: int64 top-k indices, a byte mask and bf16 probabilities per
    // expert, fp32 softmax over the top-k scores.
    let router = 8.0 * k + experts + 2.0 * experts + 4.0 * k;
    let halved = 2.0 * h + router + 8.0 * k;
    assert_eq!(at(0.0) - at(1.0), 32.0 * halved / 2.0);
}

#[test]
fn the_all_gather_dispatcher_keeps_its_sort_and_map_for_the_whole_group() {
    // Mixtral, fused, tp = 2 with sequence parallelism: the all-gather dispatcher sorts
    // the copies of every token of the group (an int64 index per copy, not halved) and
    // keeps a byte mask and a bf16 probability per expert of the gathered tokens, half of
    // them another rank's. Without sequence parallelism every rank holds the whole
    // sequence already, and the two dispatchers keep the same.
    let with = |moe_dispatcher| ModelSpec {
        implementation: Implementation::Fused,
        moe_dispatcher,
        ..mixtral()
    };
    let (all_to_all, all_gather) = (
        with(MoeDispatcher::AllToAll),
        with(MoeDispatcher::AllGather),
    );
    let act = |spec: &ModelSpec, sequence_parallel: f64| {
        let layout = Layout {
            seq_len: 1.0,
            tp: 2.0,
            sequence_parallel,
            ..Layout::default()
        };
        one(spec, &layout).act_mlp
    };
    let (k, experts) = (2.0, 8.0);
    let per_token = 8.0 * k + (1.0 + 2.0) * experts;
    assert_eq!(
        act(&all_gather, 1.0) - act(&all_to_all, 1.0),
        32.0 * per_token / 2.0
    );
    assert_eq!(act(&all_gather, 0.0), act(&all_to_all, 0.0));
}

#[test]
fn the_all_gather_dispatcher_needs_fused_kernels() {
    let spec = ModelSpec {
        implementation: Implementation::Hf,
        moe_dispatcher: MoeDispatcher::AllGather,
        ..mixtral()
    };
    let message = spec.validate().unwrap_err().to_string();
    assert!(message.contains("implementation='fused'"), "{message}");
}

/// The named fields of `spec`, as a binding passes them back in.
fn fields_of(spec: &ModelSpec) -> Vec<(&'static str, Field)> {
    SPEC_FIELDS
        .iter()
        .filter_map(|name| Some((*name, spec.get(name)?)))
        .collect()
}

#[test]
fn a_spec_rebuilds_from_its_named_fields() {
    for spec in [llama_8b(), mixtral(), deepseek_v3()] {
        assert_eq!(ModelSpec::from_fields(fields_of(&spec)), Ok(spec));
    }
}

#[test]
fn named_fields_default_the_derived_head_counts() {
    let mut fields = fields_of(&llama_8b());
    fields.retain(|(name, _)| *name != "head_dim" && *name != "num_kv_heads");
    let spec = ModelSpec::from_fields(fields).unwrap();
    assert_eq!((spec.num_kv_heads, spec.head_dim), (32, 128));
}

#[test]
fn named_fields_refuse_bad_values_naming_the_field() {
    let with = |name: &'static str, value: Field| {
        let mut fields = fields_of(&llama_8b());
        fields.retain(|(field, _)| *field != name);
        fields.push((name, value));
        ModelSpec::from_fields(fields).unwrap_err().to_string()
    };
    assert_eq!(
        with("hidden_size", Field::Count(-64)),
        "hidden_size must be at least 1, got -64"
    );
    assert_eq!(
        with("norm", Field::Name("batchnorm".into())),
        "norm must be 'rmsnorm' or 'layernorm', got \"batchnorm\""
    );
    assert_eq!(
        with("qkv_bias", Field::Count(1)),
        "qkv_bias must be a bool, got 1"
    );
    assert!(with("heads", Field::Count(1)).starts_with("unknown ModelSpec field 'heads'"));
    assert!(with("num_kv_heads", Field::Count(3)).contains("num_kv_heads=3 must divide"));
    let mut fields = fields_of(&llama_8b());
    fields.retain(|(name, _)| *name != "vocab_size");
    assert_eq!(
        ModelSpec::from_fields(fields).unwrap_err().to_string(),
        "vocab_size is required"
    );
}

proptest! {
    /// Every option name a field reads back is one the field parses.
    #[test]
    fn option_names_round_trip(
        ffn in prop_oneof![Just(FfnType::SwiGlu), Just(FfnType::Gelu)],
        norm in prop_oneof![Just(NormType::RmsNorm), Just(NormType::LayerNorm)],
        fused in any::<bool>(),
    ) {
        let spec = ModelSpec {
            ffn_type: ffn,
            norm,
            implementation: if fused { Implementation::Fused } else { Implementation::Hf },
            ..llama_8b()
        };
        prop_assert_eq!(ModelSpec::from_fields(fields_of(&spec)), Ok(spec));
    }
}

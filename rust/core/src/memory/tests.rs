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
        q_lora_rank: 0,
        kv_lora_rank: 0,
        qk_nope_head_dim: 0,
        qk_rope_head_dim: 0,
        v_head_dim: 0,
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
    // DeepSeek-V3 without its multi-token-prediction module: "671B total, 37B activated".
    let ds = deepseek_v3();
    assert_eq!(ds.total_params(), 671_026_419_200.0);
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
    // output 2h, lse 4a, MLP input 2h, SwiGLU 4 x 2f.
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
    assert_eq!(b.act_logits, 4.0 * h + 4.0 + 4.0 * 128_256.0 + 8.0);
    assert_eq!(b.act_embedding, 8.0);
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
    check(Layout { cp: 3.0, ..base }, Invalid::CpSeqLen);
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
    assert_eq!(b1.activations, b8.activations);
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
            data: std::slice::from_ref(v),
            strides: scalar_strides,
        })
        .collect();
    for &(field, data, strides) in varying {
        inputs[field] = GridInput { data, strides };
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
        data: &tp,
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
        0u32..3,
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
        if layout.recompute < 2.0 && layout.activation_model == 1.0 {
            let r = one(&spec, &Layout { recompute: layout.recompute + 1.0, ..layout });
            prop_assert!(r.activations <= b.activations);
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
            0u32..3,
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
        for spec in [llama, mixtral(), deepseek] {
            let layout = Layout {
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

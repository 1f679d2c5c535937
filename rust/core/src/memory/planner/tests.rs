use proptest::prelude::*;

use super::candidates::{balanced_split, divisors, end_cost};
use super::*;
use crate::memory::spec::FfnType;

fn llama_8b() -> ModelSpec {
    ModelSpec {
        hidden_size: 4096,
        num_layers: 32,
        num_heads: 32,
        num_kv_heads: 8,
        head_dim: 128,
        ffn_size: 14336,
        ffn_type: FfnType::SwiGlu,
        vocab_size: 128_256,
        ..ModelSpec::default()
    }
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

fn h100() -> Hardware {
    HARDWARE_PRESETS[0].1
}

fn request(modes: &[&'static str]) -> Request<'static, &'static str> {
    // A leaked slice keeps the request `'static` in tests.
    let recompute: &'static [&'static str] = Box::leak(modes.to_vec().into_boxed_slice());
    Request {
        num_gpus: 16,
        seq_len: 4096,
        global_batch_tokens: 4096 * 64,
        hardware: h100(),
        overrides: Overrides::default(),
        options: Layout::default(),
        constants: Constants {
            efficiency: 0.648,
            layer_pass_overhead: 0.000374,
            overlap_tax: OVERLAP_TAX,
            overlap_ep_comm: false,
            deduplicated_dispatch: false,
        },
        usable_fraction: 0.9,
        recompute,
        distinct: true,
        top: Some(20),
    }
}

#[test]
fn recompute_names_round_trip_in_any_case() {
    for name in [
        "none",
        "selective",
        "full",
        "core_attn",
        "core_attn+mlp",
        "moe+mla_up_proj",
    ] {
        let mode: Recompute = name.parse().unwrap();
        assert_eq!(mode.name(), name);
        assert_eq!(Recompute::from_code(mode.code()), mode);
    }
    let mode: Recompute = "MLP+core_attn".parse().unwrap();
    assert_eq!(mode.name(), "core_attn+mlp");
    assert_eq!(mode.code(), 5.0);
    let error = recompute_modes(&["mlp+"]).unwrap_err().to_string();
    assert!(error.contains("recompute modes must be none, selective, full or Megatron-Core"));
    assert!(error.contains("got 'mlp+'"), "{error}");
    let modes = recompute_modes(&["full", "none", "FULL"]).unwrap();
    assert_eq!(modes, vec![Recompute::Full, Recompute::None]);
    let empty: [&str; 0] = [];
    assert!(recompute_modes(&empty)
        .unwrap_err()
        .to_string()
        .contains("at least one mode"));
}

#[test]
fn split_names_and_codes_agree_with_the_layout_field() {
    for code in 0..5 {
        let split = PipelineSplit::from_code(f64::from(code)).unwrap();
        assert_eq!(split.code(), f64::from(code));
    }
    assert_eq!(PipelineSplit::EmbeddingAndLoss.name(), "embedding_and_loss");
}

#[test]
fn hardware_figures_are_checked_by_name() {
    for (_, hw) in HARDWARE_PRESETS {
        hw.check().unwrap();
    }
    let mut figures = h100().figures();
    figures[2] = 0.0;
    let error = Hardware::new(figures, 8).unwrap_err().to_string();
    assert!(
        error.contains("memory_bandwidth must be a positive number, got 0"),
        "{error}"
    );
    assert!(Hardware::new(h100().figures(), 0).is_err());
    let overrides = Overrides {
        gpu_memory: Some(-1.0),
        ..Overrides::default()
    };
    let error = overrides.apply(&h100()).unwrap_err().to_string();
    assert!(
        error.contains("gpu_memory must be a positive number, got -1"),
        "{error}"
    );
}

#[test]
fn divisors_in_increasing_order() {
    assert_eq!(divisors(1), vec![1]);
    assert_eq!(divisors(12), vec![1, 2, 3, 4, 6, 12]);
    assert_eq!(divisors(16), vec![1, 2, 4, 8, 16]);
}

#[test]
fn uneven_layers_split_over_the_stages_with_the_head_on_the_last() {
    // 126 layers over 16 stages: no even split; the ends take fewer layers.
    let spec = ModelSpec {
        num_layers: 126,
        ..llama_8b()
    };
    let split = balanced_split(&spec, 16, 1, end_cost(&spec)).unwrap();
    let stages = split.stage_layers();
    assert_eq!(stages.iter().sum::<u64>(), 126);
    let (first, middle, last) = split.first_middle_last;
    assert!(first <= middle && last < middle, "{stages:?}");
    // An even split that exists is kept when the head costs less than a layer.
    let even = balanced_split(&llama_8b(), 1, 1, end_cost(&llama_8b())).unwrap();
    assert_eq!(even.rule, PipelineSplit::Even);
    assert_eq!(even.stage_layers(), vec![32]);
}

#[test]
fn plans_are_fastest_first_distinct_and_fit() {
    let r = request(&["none", "selective", "full"]);
    let plan = plan_layouts(&llama_8b(), &r).unwrap();
    assert!(!plan.is_empty() && plan.len() <= 20);
    assert!(plan.step_time.windows(2).all(|w| w[0] <= w[1]));
    let keys: HashSet<_> = (0..plan.len())
        .map(|i| (plan.dp[i], plan.tp[i], plan.pp[i], plan.cp[i], plan.ep[i]))
        .collect();
    assert_eq!(keys.len(), plan.len());
    for i in 0..plan.len() {
        assert_eq!(plan.dp[i] * plan.tp[i] * plan.pp[i] * plan.cp[i], 16);
        assert!(plan.memory[i] <= 0.9 * h100().memory);
        let parts: f64 = plan.time_parts.iter().map(|part| part[i]).sum();
        assert!((parts - plan.step_time[i]).abs() <= 1e-9 * plan.step_time[i]);
        assert_eq!(plan.stage_layers[i].iter().sum::<u64>(), 32);
    }
    // Every combination: the distinct plan is its first of each layout.
    let all = plan_layouts(
        &llama_8b(),
        &Request {
            distinct: false,
            top: None,
            ..r.clone()
        },
    )
    .unwrap();
    assert!(all.len() > plan.len());
    assert_eq!(all.step_time[0], plan.step_time[0]);
    assert!(all
        .step_time
        .windows(2)
        .zip(all.memory.windows(2))
        .all(|(t, m)| t[0] < t[1] || (t[0] == t[1] && m[0] <= m[1])));
}

#[test]
fn a_model_that_fits_nowhere_is_an_empty_plan_and_a_bad_option_an_error() {
    let mut r = request(&["none"]);
    r.overrides.gpu_memory = Some(1e9);
    assert!(plan_layouts(&llama_8b(), &r).unwrap().is_empty());
    let mut r = request(&["none"]);
    r.options.fused_swiglu = 0.5;
    let error = plan_layouts(&llama_8b(), &r).unwrap_err().to_string();
    assert!(
        error.starts_with("fused_swiglu must be a boolean"),
        "{error}"
    );
    assert!(error.contains("fused_swiglu=0.5"), "{error}");
    let mut r = request(&["none"]);
    r.global_batch_tokens = 1000;
    let error = plan_layouts(&llama_8b(), &r).unwrap_err().to_string();
    assert!(error.contains("multiple of seq_len"), "{error}");
    let mut r = request(&["none"]);
    r.num_gpus = 0;
    let error = plan_layouts(&llama_8b(), &r).unwrap_err().to_string();
    assert_eq!(error, "num_gpus must be at least 1, got 0");
}

#[test]
fn experts_are_sharded_inside_data_parallelism() {
    let plan = plan_layouts(&mixtral(), &request(&["none", "full"])).unwrap();
    assert!(!plan.is_empty());
    assert!((0..plan.len()).all(|i| (plan.dp[i] * plan.cp[i]) % plan.ep[i] == 0));
    assert!(plan.ep.iter().any(|&ep| ep > 1));
}

/// The search's candidates of a model on `num_gpus` GPUs, as the step-time model reads
/// them.
fn searched(spec: &ModelSpec, num_gpus: u64) -> Vec<Candidate> {
    let bounds = Bounds {
        num_gpus,
        seq_len: 4096,
        sequences: 64,
        gpus_per_node: 8,
        modes: recompute_modes(&["none", "selective", "full", "core_attn+mlp"]).unwrap(),
    };
    let found = candidates::candidates(spec, &bounds);
    found
        .rows
        .iter()
        .map(|x| candidate(x, &found.splits[x.split]))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// More FLOP/s, memory bandwidth or link bandwidth never slows a layout.
    #[test]
    fn faster_hardware_never_slows_a_layout(
        moe in any::<bool>(),
        figure in 0usize..5,
        faster in 1.0f64..4.0,
        pick in any::<prop::sample::Index>(),
        overlap in any::<bool>(),
    ) {
        let spec = if moe { mixtral() } else { llama_8b() };
        let all = searched(&spec, 32);
        let c = all[pick.index(all.len())];
        let k = Constants {
            overlap_ep_comm: overlap,
            deduplicated_dispatch: overlap,
            ..request(&["none"]).constants
        };
        let hw = h100();
        let mut figures = hw.figures();
        figures[figure] *= faster;
        let quick = Hardware::new(figures, 8).unwrap();
        let terms = SpecTerms::new(&spec);
        let options = Layout::default();
        let slow = step_time::step_time(&terms, &c, &hw, 4096.0, &options, &k);
        let fast = step_time::step_time(&terms, &c, &quick, 4096.0, &options, &k);
        prop_assert!(fast.total <= slow.total * (1.0 + 1e-12), "{} > {}", fast.total, slow.total);
        prop_assert!(slow.parts.iter().all(|&part| part >= 0.0));
    }

    /// The terms shared by candidates give what the candidate's own terms give.
    #[test]
    fn shared_layer_terms_are_the_candidates_own(pick in any::<prop::sample::Index>()) {
        let spec = mixtral();
        let all = searched(&spec, 64);
        let c = all[pick.index(all.len())];
        let k = request(&["none"]).constants;
        let terms = SpecTerms::new(&spec);
        let options = Layout::default();
        let layer = layer_time::layer_terms(&terms, &LayerKey::of(&c), &h100(), 4096.0, &options, &k);
        let groups = DataGroups::of(&c, &h100());
        let once = step_time::finish(&terms, &c, (&layer, &groups), &h100(), 4096.0, &options, &k);
        prop_assert_eq!(once, step_time::step_time(&terms, &c, &h100(), 4096.0, &options, &k));
    }
}

#[test]
fn rank_keys_order_by_time_then_by_index() {
    let times = [f64::NAN, 2.5, -1.0, 0.0, 1e-300, 2.5, f64::INFINITY];
    let mut keys: Vec<_> = times
        .iter()
        .enumerate()
        .map(|(i, &t)| rank_key(t, i))
        .collect();
    keys.sort_by(|a, b| b.cmp(a));
    let order: Vec<usize> = keys.iter().map(|k| k.0 as u64 as usize).collect();
    assert_eq!(order, vec![2, 3, 4, 1, 5, 6, 0]);
}

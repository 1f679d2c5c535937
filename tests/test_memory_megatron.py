"""Model states against Megatron-LM's own estimator, transcribed.

``megatron_weight_and_optimizer_memory`` is Megatron-LM's
``compute_weight_and_optimizer_memory`` (megatron/training/theoretical_memory_usage.py),
reduced to the arguments these models use: bf16 weights, fp32 main gradients, fp32 main
weights and Adam moments (18 bytes per parameter, or ``6 + 12 / dp`` with the
distributed optimizer), the bytes of the most loaded pipeline stage, the first. Its
vocabulary is the model's (Megatron pads it to a multiple of 128 x tp; the padding is a
tokenizer setting, not a property of the model), and it counts no biases and no learned
position embeddings, so the GPT-3 here is GPT-3 175B's shape without them.
"""

from __future__ import annotations

from typing import Any

import pytest

from tokenbatch import ModelSpec
from tokenbatch.memory import estimate_memory_stages

MIB = 1024 * 1024


def megatron_weight_and_optimizer_memory(
    spec: ModelSpec, *, tp: int, pp: int, dp: int, ep: int, distributed_optimizer: bool
) -> float:
    """Megatron-LM's estimate, in bytes, of the first pipeline stage's model states."""
    h = spec.hidden_size
    heads, groups, kv_channels = spec.num_heads, spec.kv_heads, spec.head_size
    swiglu = 3 / 2 if spec.ffn_type == "swiglu" else 1
    num_experts = spec.num_experts or 1
    moe_pattern = [
        1 if spec.is_moe and i >= spec.first_dense_layers else 0 for i in range(spec.num_layers)
    ]
    num_moe_layers = sum(moe_pattern)
    num_dense_layers = spec.num_layers - num_moe_layers
    norm_size = 1 if spec.norm == "rmsnorm" else 2
    if spec.is_mla:
        rope = spec.qk_rope_head_dim
        q_term = spec.q_lora_rank * (h + heads * (spec.qk_nope_head_dim + rope) + norm_size)
        self_attn = (
            q_term
            + spec.kv_lora_rank
            * (h + heads * (spec.qk_nope_head_dim + spec.v_head_dim) + norm_size)
            + h * rope
            + heads * spec.v_head_dim * h
        )
    else:
        self_attn = 2 * h * h * ((1 + groups / heads) * (kv_channels * heads / h))
    embedding_size = h * spec.vocab_size
    final_layernorm = norm_size * h
    dense_mlp = 2 * h * spec.ffn_size * swiglu
    shared_expert = 2 * h * spec.num_shared_experts * spec.moe_ffn_size * swiglu
    routed_experts = 2 * h * spec.moe_ffn_size * num_experts * swiglu
    layernorms = 2 * h * norm_size
    router = h * num_experts if spec.is_moe else 0
    tp_sharded = (self_attn + dense_mlp) * num_dense_layers + (
        self_attn + shared_expert
    ) * num_moe_layers
    replicated = (
        layernorms * num_dense_layers + (layernorms + router) * num_moe_layers + final_layernorm
    )
    expert_sharded = routed_experts * num_moe_layers
    tp_on_first = (tp_sharded / pp + embedding_size) / tp
    replicated_on_first = replicated / pp
    expert_on_first = (expert_sharded / pp) / (tp * ep)
    if not spec.tied_embeddings and pp == 1:
        tp_on_first += embedding_size / tp
    world = dp * tp * pp
    expert_dp = world // (tp * ep * pp)

    def bytes_per_parameter(data_parallel_size: int) -> float:
        return 6 + 12 / data_parallel_size if distributed_optimizer else 18

    return (tp_on_first + replicated_on_first) * bytes_per_parameter(
        dp
    ) + expert_on_first * bytes_per_parameter(expert_dp)


GPT3_SHAPE = ModelSpec.preset("gpt3-175b").replace(
    name="gpt3-175b-shape", linear_bias=False, learned_positions=0
)

LAYOUTS: list[tuple[ModelSpec, dict[str, Any]]] = [
    (ModelSpec.preset("llama-3.1-8b"), {"tp": 1, "pp": 1, "dp": 8, "ep": 1}),
    (ModelSpec.preset("llama-3.1-8b"), {"tp": 2, "pp": 2, "dp": 4, "ep": 1}),
    (ModelSpec.preset("llama-3.1-70b"), {"tp": 8, "pp": 4, "dp": 4, "ep": 1}),
    (ModelSpec.preset("llama-3.1-70b"), {"tp": 4, "pp": 8, "dp": 2, "ep": 1}),
    (ModelSpec.preset("llama-3.1-405b"), {"tp": 8, "pp": 9, "dp": 16, "ep": 1}),
    (ModelSpec.preset("llama-3.1-405b"), {"tp": 8, "pp": 14, "dp": 8, "ep": 1}),
    (GPT3_SHAPE, {"tp": 8, "pp": 8, "dp": 16, "ep": 1}),
    (ModelSpec.preset("mixtral-8x7b"), {"tp": 1, "pp": 4, "dp": 8, "ep": 8}),
    (ModelSpec.preset("mixtral-8x7b"), {"tp": 2, "pp": 2, "dp": 8, "ep": 4}),
    (ModelSpec.preset("deepseek-v3"), {"tp": 1, "pp": 1, "dp": 64, "ep": 64}),
]


@pytest.mark.parametrize("distributed_optimizer", [False, True])
@pytest.mark.parametrize(
    ("spec", "layout"), LAYOUTS, ids=[f"{s.name}-{i}" for i, (s, _) in enumerate(LAYOUTS)]
)
def test_model_states_agree_with_megatron_to_the_mib(
    spec: ModelSpec, layout: dict[str, Any], distributed_optimizer: bool
) -> None:
    first = estimate_memory_stages(
        spec,
        seq_len=4096,
        zero=1 if distributed_optimizer else 0,
        grad_dtype="fp32",
        **layout,
    )[0]
    megatron = megatron_weight_and_optimizer_memory(
        spec, distributed_optimizer=distributed_optimizer, **layout
    )
    assert abs(first.model_states - megatron) < MIB
    # To the byte, but for one difference: Megatron spreads the final norm over the stages
    # where the model puts it on the last one (and each state rounds up to whole bytes).
    pp, dp = layout["pp"], layout["dp"]
    per_parameter = 6 + 12 / dp if distributed_optimizer else 18
    norm_share = spec.hidden_size * (1 if spec.norm == "rmsnorm" else 2) / pp if pp > 1 else 0
    assert megatron - first.model_states == pytest.approx(norm_share * per_parameter, abs=4)

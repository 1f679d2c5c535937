"""The activation model against real Hugging Face ``transformers`` models, on CPU.

Each model family is built from a small config, trained for one step, and measured with
:func:`tokenbatch.profile`: weights, gradients and optimizer state must match the estimate
exactly, and the bytes saved for backward (saved-tensor hooks, deduplicated by storage,
parameters excluded) within 5%. ``python tests/test_memory_transformers.py`` prints the
accuracy table of docs/memory.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import transformers

from tokenbatch import MemoryEstimate, ModelSpec, ProfileResult, estimate_memory, profile
from tokenbatch.memory import master_weight_adamw

BATCH, SEQ_LEN = 2, 64
_COMMON: dict[str, Any] = {
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "vocab_size": 256,
    "use_cache": False,
}


def _deepseek(attention: str) -> transformers.PretrainedConfig:
    # PyTorch's CPU flash kernel needs equal query and value head sizes (otherwise SDPA
    # falls back to its math kernel, which keeps fp32 copies): 8 + 8 = 16 for SDPA, the
    # real model's unequal sizes for eager attention.
    return transformers.DeepseekV3Config(
        intermediate_size=256,
        moe_intermediate_size=48,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_shared_experts=1,
        first_k_dense_replace=1,
        n_group=2,
        topk_group=1,
        q_lora_rank=48,
        kv_lora_rank=32,
        qk_nope_head_dim=8 if attention == "sdpa" else 16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        num_key_value_heads=4,
        **_COMMON,
    )


#: Small configs of each family, by name; the argument is the attention implementation.
FAMILIES: dict[str, Callable[[str], transformers.PretrainedConfig]] = {
    "llama": lambda _: transformers.LlamaConfig(
        intermediate_size=352, num_key_value_heads=2, **_COMMON
    ),
    "qwen2": lambda _: transformers.Qwen2Config(
        intermediate_size=352, num_key_value_heads=2, **_COMMON
    ),
    "mistral": lambda _: transformers.MistralConfig(
        intermediate_size=352, num_key_value_heads=2, **_COMMON
    ),
    "mixtral": lambda _: transformers.MixtralConfig(
        intermediate_size=96,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        **_COMMON,
    ),
    "deepseek_v3": _deepseek,
}

_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def measure(
    family: str, dtype: str, attention: str, recompute: str
) -> tuple[MemoryEstimate, ProfileResult]:
    """One training step of ``family`` and the estimate of the same configuration."""
    config = FAMILIES[family](attention)
    config._attn_implementation = attention
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to(_DTYPES[dtype])
    model.train()
    if recompute == "full":
        model.activation_checkpointing_enable()
    if dtype == "fp32":
        optimizer: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        step = None
        options: dict[str, Any] = {"param_dtype": "fp32"}
    else:
        optimizer, step = master_weight_adamw(model, lr=1e-3)
        options = {}
    ids = torch.randint(0, config.vocab_size, (BATCH, SEQ_LEN), generator=torch.Generator())
    measured = profile(
        model,
        {"input_ids": ids, "labels": ids},
        loss_fn=lambda output: output.loss,
        optimizer=optimizer,
        optimizer_step=step,
    )
    spec = ModelSpec.from_hf_config(config.to_dict())
    attention_option = "eager" if attention == "eager" else "flash"
    estimate = estimate_memory(
        spec,
        seq_len=SEQ_LEN,
        micro_batch=BATCH,
        recompute=recompute,
        attention=attention_option,
        **options,
    )
    return estimate, measured


CASES = [
    (family, dtype, attention, recompute)
    for family in FAMILIES
    for dtype in _DTYPES
    for attention in ("sdpa", "eager")
    for recompute in ("none", "full")
    if recompute == "none" or attention == "sdpa"
]


@pytest.mark.parametrize(("family", "dtype", "attention", "recompute"), CASES)
def test_estimate_matches_a_real_training_step(
    family: str, dtype: str, attention: str, recompute: str
) -> None:
    estimate, measured = measure(family, dtype, attention, recompute)
    assert measured.params == estimate.params
    assert measured.grads == estimate.grads
    assert measured.optimizer == estimate.optimizer
    error = estimate.saved_activations / measured.activations - 1
    assert abs(error) < 0.05, (error, estimate.activation_parts, measured.activations)


def accuracy_table() -> str:
    """The Markdown table of docs/memory.md: every case, estimate against measurement."""
    rows = [
        "| model | dtype | attention | recompute | measured (KiB) | estimate (KiB) | error |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    for family, dtype, attention, recompute in CASES:
        estimate, measured = measure(family, dtype, attention, recompute)
        error = estimate.saved_activations / measured.activations - 1
        rows.append(
            f"| {family} | {dtype} | {attention} | {recompute} | "
            f"{measured.activations / 1024:,.1f} | {estimate.saved_activations / 1024:,.1f} | "
            f"{error:+.2%} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    print(accuracy_table())

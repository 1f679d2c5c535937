"""``implementation="fused"`` against real Megatron-Core modules, on CPU, one process.

The models, the measurement and the substitutions that run Megatron-Core on CPU are in
tests/runs/megatron_cpu.py; tests/test_memory_megatron_core_parallel.py runs the same
models tensor- and expert-parallel over several processes. Each model trains one step
without recomputation, with Megatron-Core's default selective recomputation
(``recompute_granularity="selective"``, ``recompute_modules=["core_attn"]``, estimated as
``recompute="core_attn"``), with its other modules (``mlp``, ``layernorm``, ``moe``,
``shared_experts``, alone and together: ``recompute="core_attn+mlp+layernorm"``; with
MLA its ``mla_up_proj`` too) and with full recomputation. The test requires the
measurement to equal the estimate plus what the local spec keeps beyond the fused modules,
to the byte.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

if __name__ == "__main__":  # run as a script: the helpers' folder, as conftest.py adds it
    sys.path.insert(0, str(Path(__file__).resolve().parent / "runs"))

pytest.importorskip("torch")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed"
    pytest.importorskip("megatron.core")
    from megatron_cpu import MODELS, local_spec_extra, measure, megatron_on_cpu

# No, full, and Megatron-Core's selective recomputation of the modules named (its
# default, core_attn, alone, and the others alone or together).
RECOMPUTE = (
    "none",
    "core_attn",
    "full",
    "mlp",
    "layernorm",
    "core_attn+mlp+layernorm",
    "moe",
    "moe+layernorm",
    "shared_experts",
)
# And for multi-latent attention, its up-projections.
MLA_RECOMPUTE = ("mla_up_proj", "core_attn+mla_up_proj", "mla_up_proj+layernorm")
# Every model with every mode, and MLA with its own.
CASES = [(model, mode) for model in MODELS for mode in RECOMPUTE] + [
    ("mla", mode) for mode in MLA_RECOMPUTE
]

# Megatron-Core warns about its own defaults (CUDA graph scopes, missing Transformer
# Engine, the MLP width taken from the config, recomputation with Transformer Engine).
pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning:megatron"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning:megatron"),
    pytest.mark.filterwarnings("ignore::FutureWarning:megatron"),
    # Raised inside torch.compile while it traces the fused SwiGLU on CPU.
    pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf"),
]


@pytest.fixture(scope="module")
def megatron() -> Iterator[None]:
    with megatron_on_cpu():
        yield


@pytest.mark.parametrize(("model_name", "recompute"), CASES)
def test_fused_estimate_against_megatron_core(
    megatron: None, recompute: str, model_name: str
) -> None:
    measured, estimate = measure(recompute, model_name)
    assert (measured.params, measured.grads, measured.optimizer) == (
        estimate.params,
        estimate.grads,
        estimate.optimizer,
    )
    extra = local_spec_extra(recompute, model_name)
    assert measured.activations == estimate.saved_activations + sum(extra.values()), extra


def table() -> str:
    """The Markdown rows of docs/memory.md: measured against estimated, per setting."""
    rows = [
        "| model | recompute | measured (KiB) | estimate (KiB) | local-spec extra (KiB) "
        "| unexplained (bytes) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for model_name, recompute in CASES:
        measured, estimate = measure(recompute, model_name)
        extra = sum(local_spec_extra(recompute, model_name).values())
        left = measured.activations - estimate.saved_activations - extra
        rows.append(
            f"| {model_name} | {recompute} | {measured.activations / 1024:,.1f} | "
            f"{estimate.saved_activations / 1024:,.1f} | {extra / 1024:,.1f} | {left} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with megatron_on_cpu():
            print(table())

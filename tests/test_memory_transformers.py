"""The activation model against real Hugging Face ``transformers`` models, on CPU.

Each family is built from a small config (the ``tiny`` size of
benches/gpu/memory_check.py, which measures the same models on a GPU), trained for one
step and measured with :func:`tokenbatch.profile`: weights, gradients and optimizer state
must match the estimate exactly, and the bytes saved for backward (saved-tensor hooks,
deduplicated by storage, parameters excluded) within 5%, without recomputation, with
selective recomputation (the attention core under a checkpoint: ``selective_attention`` of
the script) and with full recomputation. ``python
tests/test_memory_transformers.py`` prints the accuracy table of docs/memory.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from script_module import load_script

memory_check = load_script(
    Path(__file__).resolve().parents[1] / "benches" / "gpu" / "memory_check.py", "memory_check"
)

CASES = [
    (family, dtype, attention, recompute)
    for family in memory_check.FAMILIES
    for dtype in ("bf16", "fp32")
    for attention in ("sdpa", "eager")
    for recompute in memory_check.RECOMPUTE
    if recompute != "full" or attention == "sdpa"
]


@pytest.mark.parametrize(("family", "dtype", "attention", "recompute"), CASES)
def test_estimate_matches_a_real_training_step(
    family: str, dtype: str, attention: str, recompute: str
) -> None:
    check = memory_check.measure(family, recompute=recompute, dtype=dtype, attention=attention)
    assert check.measured_model_states == check.model_states
    assert abs(check.activation_error) < 0.05, check


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("family", memory_check.FAMILIES)
def test_selective_recomputation_frees_what_the_estimate_says(family: str, attention: str) -> None:
    # What recomputing the attention core frees is small next to a layer (with SDPA, the
    # log-sum-exp; for DeepSeek-V3 also the output that `o_proj` copies), so the 5% of
    # the totals would not catch a wrong core: its bytes must match on their own.
    none, selective = (
        memory_check.measure(family, recompute=recompute, attention=attention)
        for recompute in ("none", "selective")
    )
    freed = none.measured_saved - selective.measured_saved
    assert freed > 0
    assert none.saved_activations - selective.saved_activations == freed


def test_gpu_script_runs_on_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    # The GPU check's own entry point, at the size a CPU runs in seconds: every family,
    # without, with selective and with full recomputation, model states exact (its exit
    # status).
    assert memory_check.main(["--device", "cpu", "--size", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "model states exact: True" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "GiB" not in line]
    assert len(rows) == 3 * len(memory_check.FAMILIES)
    assert sum("| selective |" in row for row in rows) == len(memory_check.FAMILIES)
    with pytest.raises(ValueError, match="unknown family"):
        memory_check.config("gpt2", "sdpa")


def accuracy_table() -> str:
    """The Markdown table of docs/memory.md: every case, estimate against measurement."""
    rows = [
        "| model | dtype | attention | recompute | measured (KiB) | estimate (KiB) | error |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    for family, dtype, attention, recompute in CASES:
        check = memory_check.measure(family, recompute=recompute, dtype=dtype, attention=attention)
        rows.append(
            f"| {family} | {dtype} | {attention} | {recompute} | "
            f"{check.measured_saved / 1024:,.1f} | {check.saved_activations / 1024:,.1f} | "
            f"{check.activation_error:+.2%} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    print(accuracy_table())

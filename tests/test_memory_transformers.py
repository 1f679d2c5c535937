"""The activation model against real Hugging Face ``transformers`` models, on CPU.

Each family is built from a small config (the ``tiny`` size of
benches/gpu/memory_check.py, which measures the same models on a GPU), trained for one
step and measured with :func:`tokenbatch.profile`: weights, gradients and optimizer state
must match the estimate exactly, and the bytes saved for backward (saved-tensor hooks,
deduplicated by storage, parameters excluded) within 5%. ``python
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
    for recompute in ("none", "full")
    if recompute == "none" or attention == "sdpa"
]


@pytest.mark.parametrize(("family", "dtype", "attention", "recompute"), CASES)
def test_estimate_matches_a_real_training_step(
    family: str, dtype: str, attention: str, recompute: str
) -> None:
    check = memory_check.measure(family, recompute=recompute, dtype=dtype, attention=attention)
    assert check.measured_model_states == check.model_states
    assert abs(check.activation_error) < 0.05, check


def test_gpu_script_runs_on_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    # The GPU check's own entry point, at the size a CPU runs in seconds: every family,
    # without and with recomputation, model states exact (its exit status).
    assert memory_check.main(["--device", "cpu", "--size", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "model states exact: True" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "GiB" not in line]
    assert len(rows) == 2 * len(memory_check.FAMILIES)
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

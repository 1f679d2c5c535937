"""``implementation="fused"`` against Megatron-Core trained tensor- and expert-parallel:
tests/runs/megatron_parallel.py under torchrun, two CPU processes on the gloo backend,
the models of tests/runs/megatron_cpu.py.

* Tensor parallelism (``tp=2``), with and without sequence parallelism: on every rank
  the weights, gradients and optimizer states equal the estimate's and the saved
  activations equal it plus what the local spec keeps beyond the fused modules, to the
  byte (Megatron-Core refuses a MoE layer tensor-parallel without sequence parallelism).
* Expert parallelism (``ep=2``, the two ranks also data-parallel): every rank holds half
  the experts, as estimated, to the byte. The router sends each rank the copies for its
  experts, as many as it happens to choose, where the estimate assumes a balanced load:
  the ranks' activations sum to twice the estimate to the byte, and each is within
  the imbalance this router makes of it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

if __name__ == "__main__":  # run as a script: the helpers' folder, as conftest.py adds it
    sys.path.insert(0, str(Path(__file__).resolve().parent / "runs"))

pytest.importorskip("torch")
pytest.importorskip("megatron.core")
from run_support import torchrun

RUN = Path(__file__).resolve().parent / "runs" / "megatron_parallel.py"
TIMEOUT_S = 600
RANKS = 2

SEQUENCE_PARALLEL_CASES = [
    "dense:none",
    "dense:core_attn",
    "dense:mlp",
    "dense:core_attn+mlp+layernorm",
    "dense:full",
    "mla:none",
    "mla:mla_up_proj",
    "mla:core_attn+mla_up_proj",
    "mla:mla_up_proj+layernorm",
    "moe:none",
    "moe:layernorm",
    "moe:moe",
    "deepseek_moe:none",
    "deepseek_moe:shared_experts",
    "deepseek_moe:core_attn+mlp+layernorm",
    "deepseek_moe:full",
]
TENSOR_PARALLEL_CASES = ["dense:none", "dense:core_attn", "dense:full", "mla:mla_up_proj"]
EXPERT_PARALLEL_CASES = [
    "moe:none",
    "moe:moe",
    "deepseek_moe:none",
    "deepseek_moe:core_attn",
    "deepseek_moe:moe",
    "deepseek_moe:full",
]
# How far one rank's activations may be from the balanced estimate: the router of these
# small random models sends one rank up to about 5% more copies than the other.
IMBALANCE = 0.05


# Each layout's name, its options to the script and its cases.
LAYOUTS = [
    ("TP2 + SP", ["--tp", "2", "--sp"], SEQUENCE_PARALLEL_CASES),
    ("TP2", ["--tp", "2"], TENSOR_PARALLEL_CASES),
    ("EP2", ["--ep", "2"], EXPERT_PARALLEL_CASES),
]


def run(tmp_path: Path, options: list[str], cases: list[str]) -> list[dict[str, Any]]:
    """The records of every rank of one torchrun of the script."""
    torchrun(RUN, [str(tmp_path), *options, *cases], nproc=RANKS, cwd=tmp_path, timeout=TIMEOUT_S)
    return [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(RANKS)]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "options", "cases"),
    [pytest.param(*layout, id=layout[0]) for layout in LAYOUTS if layout[0] != "EP2"],
)
def test_tensor_parallel_ranks_match_the_estimate(
    tmp_path: Path, name: str, options: list[str], cases: list[str]
) -> None:
    for rank, records in enumerate(run(tmp_path, options, cases)):
        assert sorted(records) == sorted(cases)
        for case, record in records.items():
            measured, estimate = record["measured"], record["estimate"]
            extra = sum(record["extra"].values())
            assert measured[:3] == estimate[:3], (rank, case)
            assert measured[3] == estimate[3] + extra, (rank, case, record)


@pytest.mark.slow
def test_expert_parallel_ranks_match_the_estimate(tmp_path: Path) -> None:
    _, options, _ = LAYOUTS[2]
    ranks = run(tmp_path, options, EXPERT_PARALLEL_CASES)
    for case in EXPERT_PARALLEL_CASES:
        records = [records[case] for records in ranks]
        for record in records:
            assert record["measured"][:3] == record["estimate"][:3], case
        # The estimate and the local spec's extra are the same on every rank.
        expected = records[0]["estimate"][3] + sum(records[0]["extra"].values())
        assert all(r["estimate"][3] + sum(r["extra"].values()) == expected for r in records)
        activations = [record["measured"][3] for record in records]
        assert sum(activations) == RANKS * expected, (case, activations, expected)
        for measured in activations:
            assert abs(measured - expected) <= IMBALANCE * expected, (case, activations)
        if case.endswith((":moe", ":full")):
            # The routed copies are recomputed: nothing on a rank depends on the routing.
            assert activations == [expected] * RANKS, case


def table() -> str:
    """The Markdown rows of docs/memory.md: each rank's measurement against the estimate."""
    import tempfile

    rows = [
        "| layout | model | recompute | rank 0 (KiB) | rank 1 (KiB) | estimate (KiB) "
        "| local-spec extra (KiB) | unexplained, both ranks (bytes) |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, options, cases in LAYOUTS:
        with tempfile.TemporaryDirectory() as folder:
            ranks = run(Path(folder), options, cases)
        for case in cases:
            records = [records[case] for records in ranks]
            measured = [record["measured"][3] for record in records]
            estimate = records[0]["estimate"][3]
            extra = sum(records[0]["extra"].values())
            left = sum(measured) - RANKS * (estimate + extra)
            model_name, recompute = case.split(":")
            rows.append(
                f"| {name} | {model_name} | {recompute} | {measured[0] / 1024:,.1f} | "
                f"{measured[1] / 1024:,.1f} | {estimate / 1024:,.1f} | {extra / 1024:,.1f} "
                f"| {left} |"
            )
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())

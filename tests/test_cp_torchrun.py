"""Context parallelism in real processes: examples/context_parallel_attention.py under
torchrun with the gloo backend, each rank attending from its load-balanced chunks with keys
and values all-gathered from the others, against one process computing the whole row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from run_support import torchrun

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "context_parallel_attention.py"
TIMEOUT_S = 180


@pytest.mark.parametrize("cp_size", [2, 4])
def test_cp_ranks_reproduce_the_unsharded_row(cp_size: int, tmp_path: Path) -> None:
    options = ["--docs", "7", "--max-length", "45", "--log-dir", str(tmp_path)]
    torchrun(EXAMPLE, options, nproc=cp_size, cwd=tmp_path, timeout=TIMEOUT_S)
    # One file per rank: lines the ranks print at the same moment can interleave on stdout.
    records = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("rank*.json"))]
    assert sorted(record["rank"] for record in records) == list(range(cp_size))
    for record in records:
        assert record["cp_size"] == cp_size
        assert record["local_tokens"] * cp_size == record["tokens"]
        assert record["tokens"] % (2 * cp_size) == 0
        # Outputs, loss and gradients match one process (float64: rounding only).
        assert record["max_error_logits"] < 1e-9
        assert record["max_error_loss"] < 1e-9
        assert record["max_error_grads"] < 1e-9
    # Load balance: every rank computes the same number of query-key pairs.
    assert len({record["attended_pairs"] for record in records}) == 1

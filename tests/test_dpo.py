"""DPO from packed rows on 2 ranks equals DPO from padded pairs on one process
(tests/runs/dpo_ddp.py under torchrun, gloo): the loss and the gradients of every
optimizer step of gradient accumulation, in float64."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import run_support
from dpo_support import N_PAIRS

RUNS = Path(__file__).resolve().parent / "runs"
TIMEOUT_S = 300
FORMS = ("pairs", "sequences")  # pair items with a reference model; sequence items, precomputed


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("dpo")
    run_support.torchrun(RUNS / "dpo_ddp.py", [str(out)], nproc=2, cwd=out, timeout=TIMEOUT_S)
    logs: dict[str, Any] = collections.defaultdict(dict)
    for path in sorted(out.glob("*.rank*.jsonl")):
        form, rank = path.name.removesuffix(".jsonl").split(".rank")
        logs[form][int(rank)] = [json.loads(line) for line in path.read_text().splitlines()]
    return dict(logs), out


@pytest.mark.parametrize("form", FORMS)
def test_packed_rows_give_the_loss_and_gradients_of_padded_pairs(
    run: tuple[dict[str, Any], Path], form: str
) -> None:
    _, out = run
    results = np.load(out / "grads.npz")
    reference = results["padded_grads"]
    assert reference.shape[0] >= 4, "several optimizer steps"
    assert np.abs(reference).max() > 1e-3, "gradients worth comparing"
    np.testing.assert_allclose(results[f"{form}_grads"], reference, rtol=0, atol=1e-10)
    np.testing.assert_allclose(
        results[f"{form}_losses"], results["padded_losses"], rtol=0, atol=1e-10
    )


def test_averaging_micro_batch_means_would_weigh_pairs_unequally(
    run: tuple[dict[str, Any], Path],
) -> None:
    _, out = run
    results = np.load(out / "grads.npz")
    reference, means = results["padded_grads"][0], results["means_grads"][0]
    error = np.linalg.norm(means - reference) / np.linalg.norm(reference)
    assert error > 1e-3, f"the step's first gradients barely differ: {error:.2e}"


@pytest.mark.parametrize("form", FORMS)
def test_every_pair_is_used_once_and_normalizes_its_step(
    run: tuple[dict[str, Any], Path], form: str
) -> None:
    logs, _ = run
    records = logs[form]
    assert sorted(records) == [0, 1]
    assert len(records[0]) == len(records[1]), "ranks ran different numbers of micro-batches"
    seen = [pair for rank in records.values() for record in rank for pair in record["pairs"]]
    assert sorted(seen) == list(range(N_PAIRS))
    pairs_per_step: collections.Counter[int] = collections.Counter()
    for rank in records.values():
        for record in rank:
            pairs_per_step[record["step"]] += len(record["pairs"])
    for rank in records.values():
        for record in rank:
            assert record["num_pairs"] == pairs_per_step[record["step"]]

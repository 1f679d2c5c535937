"""Evaluation passes on 1, 2 and 3 CPU processes (torchrun, gloo): every document exactly
once, equal steps, and the losses of a float64 tiny Llama on packed micro-batches equal to
a single-process evaluation of each document alone, unpacked; the same through
``TokenBudgetTrainer.evaluate()`` and Lightning's ``validate`` on 2 ranks."""

from __future__ import annotations

import collections
import json
import math
from pathlib import Path
from typing import Any

import pytest
import run_support
import torch

RUNS = Path(__file__).resolve().parent / "runs"
TIMEOUT_S = 600

pytestmark = pytest.mark.slow

Logs = dict[str, dict[int, list[dict[str, Any]]]]  # corpus name -> rank -> records


def launch(out: Path, nproc: int) -> Logs:
    script = RUNS / "evaluation.py"
    run_support.torchrun(script, [str(out)], nproc=nproc, cwd=out, timeout=TIMEOUT_S)
    logs: Logs = collections.defaultdict(dict)
    for path in sorted(out.glob("*.rank*.jsonl")):
        name, rank = path.name.removesuffix(".jsonl").split(".rank")
        logs[name][int(rank)] = [json.loads(line) for line in path.read_text().splitlines()]
    return dict(logs)


@pytest.fixture(scope="module", params=[1, 2, 3], ids=lambda n: f"{n}ranks")
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Logs:
    nproc: int = request.param
    logs = launch(tmp_path_factory.mktemp(f"evaluation{nproc}"), nproc)
    assert all(len(ranks) == nproc for ranks in logs.values())
    return logs


@pytest.fixture(scope="module")
def unpacked() -> dict[str, Any]:
    """Each document of the corpus evaluated alone, in one process, unpacked."""
    from evaluation import corpus

    model = run_support.tiny_llama().double().eval()
    sums, tokens = [], []
    with torch.no_grad():
        for doc in corpus():
            ids = torch.tensor([doc["input_ids"]], dtype=torch.int64)
            if ids.shape[1] < 2:
                sums.append(0.0)
                tokens.append(0)
                continue
            logits = model(input_ids=ids).logits[0]
            loss = torch.nn.functional.cross_entropy(logits[:-1], ids[0, 1:], reduction="sum")
            sums.append(float(loss))
            tokens.append(ids.shape[1] - 1)
    return {"sums": sums, "tokens": tokens}


def test_every_document_exactly_once_with_equal_steps(runs: Logs) -> None:
    from evaluation import N_EVAL_DOCS

    for name, n_docs in (("corpus", N_EVAL_DOCS), ("one_document", 1)):
        batches = {
            r: [x for x in records if x["kind"] == "batch"] for r, records in runs[name].items()
        }
        steps = {r: len(b) for r, b in batches.items()}
        assert len(set(steps.values())) == 1, f"{name}: ranks ran different step counts {steps}"
        results = [records[-1] for records in runs[name].values()]
        assert all(result["steps"] == steps[0] for result in results)
        docs = [d for b in batches.values() for x in b for d in x["docs"]]
        empty = [d for b in batches.values() for x in b for d in x["empty_docs"]]
        # The empty document has no sequence in any row; every other one is in exactly one.
        assert empty == ([5] if name == "corpus" else [])
        assert sorted(docs + empty) == list(range(n_docs)), f"{name}: documents missing or repeated"
        for b in batches.values():
            assert all(x["labels"] == 0 and not x["docs"] for x in b if x["padding"])
        if name == "one_document":
            assert sum(x["padding"] for b in batches.values() for x in b) == len(runs[name]) - 1


def test_losses_equal_each_document_evaluated_alone(runs: Logs, unpacked: dict[str, Any]) -> None:
    results = [records[-1] for records in runs["corpus"].values()]
    assert all(result == results[0] for result in results), "ranks reduced different results"
    result = results[0]
    assert result["document_tokens"] == unpacked["tokens"]
    expected_means = [
        s / t if t else None for s, t in zip(unpacked["sums"], unpacked["tokens"], strict=True)
    ]
    for got, expected in zip(result["document_losses"], expected_means, strict=True):
        if expected is None:
            assert got is None
        else:
            assert math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-9), (got, expected)
    corpus_mean = math.fsum(unpacked["sums"]) / sum(unpacked["tokens"])
    assert math.isclose(result["loss"], corpus_mean, rel_tol=1e-6)
    assert result["tokens"] == sum(unpacked["tokens"])


def trainer_log(script: str, out: Path) -> dict[int, dict[str, Any]]:
    """Run ``tests/runs/<script>`` on 2 ranks; each rank's last record."""
    run_support.torchrun(RUNS / script, [str(out)], nproc=2, cwd=out, timeout=TIMEOUT_S)
    return {
        int(path.name.removesuffix(".jsonl").split(".rank")[1]): json.loads(
            path.read_text().splitlines()[-1]
        )
        for path in out.glob("*.rank*.jsonl")
    }


@pytest.fixture(scope="module", params=["hf_evaluate.py", "lightning_validate.py"])
def trainer_run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, dict[int, dict[str, Any]]]:
    script: str = request.param
    return script, trainer_log(script, tmp_path_factory.mktemp(script.removesuffix(".py")))


def test_trainers_report_the_exact_corpus_loss(
    trainer_run: tuple[str, dict[int, dict[str, Any]]], unpacked: dict[str, Any]
) -> None:
    script, results = trainer_run
    assert sorted(results) == [0, 1]
    # The metrics hold each rank's own timings.
    reduced = [{k: v for k, v in result.items() if k != "metrics"} for result in results.values()]
    assert reduced[0] == reduced[1], "ranks reduced different results"
    result = results[0]
    prefix = "eval" if script == "hf_evaluate.py" else "val"
    corpus_mean = math.fsum(unpacked["sums"]) / sum(unpacked["tokens"])
    assert math.isclose(result["loss"], corpus_mean, rel_tol=1e-6)
    # Lightning logs metrics in float32.
    assert math.isclose(result["metrics"][f"{prefix}_loss"], corpus_mean, rel_tol=1e-6)
    assert result["metrics"][f"{prefix}_tokens"] == result["tokens"] == sum(unpacked["tokens"])
    assert result["document_tokens"] == unpacked["tokens"]
    pairs = zip(result["document_losses"], unpacked["sums"], unpacked["tokens"], strict=True)
    for got, s, t in pairs:
        assert got is None if t == 0 else math.isclose(got, s / t, rel_tol=1e-6, abs_tol=1e-9)

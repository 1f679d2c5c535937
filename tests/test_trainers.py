"""Real 2-process runs of the trainer integrations on CPU (gloo): Hugging Face Trainer,
TRL's SFTTrainer, a plain Accelerate loop, Lightning and torchdata's StatefulDataLoader,
each training a tiny Llama on padding-free token-budget micro-batches.

The scripts in ``tests/runs`` log every micro-batch each rank trains on (its documents,
label tokens and loss); the tests check that every document is used exactly once per
epoch with equal steps on every rank, that optimizer steps group the plan's
micro-batches, and that a run stopped mid-epoch and resumed from its checkpoint trains
on exactly the batches of an uninterrupted run.
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import run_support

from tokenbatch.torch import TokenBudgetBatchSampler, optimizer_steps

RUNS = Path(__file__).resolve().parent / "runs"

# Generous: a hang is caught all the same, and a machine shared with other jobs runs the
# six trainings of the Trainer script in up to twice its usual 3 to 5 minutes.
TIMEOUT_S = 900

Records = list[dict[str, Any]]
Logs = dict[str, dict[int, Records]]  # run name -> rank -> records

pytestmark = pytest.mark.slow


def launch(script: str, out: Path, *, torchrun: bool = True) -> Logs:
    """Run ``tests/runs/<script>`` on 2 CPU processes (under torchrun, or launching its
    own), and read the logs it writes to ``out``."""
    if torchrun:
        run_support.torchrun(RUNS / script, [str(out)], nproc=2, cwd=out, timeout=TIMEOUT_S)
    else:
        run_support.run([sys.executable, str(RUNS / script), str(out)], cwd=out, timeout=TIMEOUT_S)
    logs: Logs = collections.defaultdict(dict)
    for path in sorted(out.glob("*.rank*.jsonl")):
        name, rank = path.name.removesuffix(".jsonl").split(".rank")
        logs[name][int(rank)] = [json.loads(line) for line in path.read_text().splitlines()]
    return dict(logs)


def assert_each_document_once_per_epoch(logs: dict[int, Records], epochs: int = 2) -> None:
    lengths = {rank: len(records) for rank, records in logs.items()}
    assert len(logs) == 2
    assert len(set(lengths.values())) == 1, (
        f"ranks ran different numbers of micro-batches: {lengths}"
    )
    for epoch in range(epochs):
        docs = [
            d
            for records in logs.values()
            for r in records
            if r["epoch"] == epoch
            for d in r["docs"]
        ]
        assert len(docs) == len(set(docs)), f"a document repeated in epoch {epoch}"
        assert sorted(docs) == list(range(run_support.N_DOCS)), (
            f"documents missing in epoch {epoch}"
        )


def assert_resumed_exactly(
    uninterrupted: dict[int, Records], stopped: dict[int, Records], resumed: dict[int, Records]
) -> None:
    for rank, records in uninterrupted.items():
        assert 0 < len(stopped[rank]) < len(records), "the first run stopped mid-training"
        both = stopped[rank] + resumed[rank]
        assert [(r["epoch"], r["step"], r["docs"]) for r in both] == [
            (r["epoch"], r["step"], r["docs"]) for r in records
        ]
        np.testing.assert_allclose(
            [r["loss"] for r in both], [r["loss"] for r in records], rtol=1e-5, atol=1e-6
        )


def micro_batches_per_step(records: Records, epoch: int) -> list[int]:
    counts = collections.Counter(r["step"] for r in records if r["epoch"] == epoch)
    return [counts[step] for step in sorted(counts)]


def assert_num_items_count_every_rank(logs: dict[int, Records]) -> None:
    """``num_items`` of each optimizer step equals the labels of all its micro-batches on
    all ranks, and every rank was given the same number."""
    labels: collections.Counter[tuple[int, int]] = collections.Counter()
    given: dict[tuple[int, int], set[int]] = collections.defaultdict(set)
    for records in logs.values():
        for r in records:
            labels[r["epoch"], r["step"]] += r["labels"]
            given[r["epoch"], r["step"]].add(r["num_items"])
    assert labels
    assert all(given[step] == {labels[step]} for step in labels)


def sampler_of_the_runs(lengths: Any = None, **options: Any) -> TokenBudgetBatchSampler:
    """Rank 0's sampler of the runs (all of them plan with ``seed=1``)."""
    if lengths is None:
        lengths = run_support.lengths()
    return TokenBudgetBatchSampler(
        lengths, run_support.MAX_TOKENS, num_replicas=2, rank=0, seed=1, **options
    )


# -- Hugging Face Trainer ------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_trainer(tmp_path_factory: pytest.TempPathFactory) -> Logs:
    return launch("hf_trainer.py", tmp_path_factory.mktemp("hf_trainer"))


@pytest.mark.parametrize("run", ["uninterrupted", "schedule_uninterrupted"])
def test_trainer_uses_each_document_once_with_equal_steps(hf_trainer: Logs, run: str) -> None:
    assert_each_document_once_per_epoch(hf_trainer[run])


def test_trainer_accumulates_micro_batches_of_the_plan(hf_trainer: Logs) -> None:
    n = len(sampler_of_the_runs())
    for records in hf_trainer["uninterrupted"].values():
        for epoch in (0, 1):
            assert micro_batches_per_step(records, epoch) == [2] * (n // 2) + [1] * (n % 2)


def test_trainer_steps_follow_the_schedule(hf_trainer: Logs) -> None:
    sampler = sampler_of_the_runs(schedule=run_support.SCHEDULE)
    expected = []
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        expected.append(np.diff(optimizer_steps(sampler).offsets).tolist())
    assert len({n for sizes in expected for n in sizes}) > 2, "the ramp grows the steps"
    for records in hf_trainer["schedule_uninterrupted"].values():
        assert [micro_batches_per_step(records, epoch) for epoch in (0, 1)] == expected


@pytest.mark.parametrize("prefix", ["", "schedule_"])
def test_trainer_normalizes_by_the_label_tokens_of_all_ranks(hf_trainer: Logs, prefix: str) -> None:
    assert_num_items_count_every_rank(hf_trainer[f"{prefix}uninterrupted"])


def test_trainer_trains_each_rank_on_its_share_of_a_mixture_of_datasets(hf_trainer: Logs) -> None:
    # The sources are two datasets.Dataset and the Trainer's dataset their concatenation:
    # each rank trains on its own sampler's micro-batches, in the plan's steps; the steps
    # of both ranks together hold the plan's tokens of each source; every rank logs them.
    steps, every = run_support.MIXTURE_STEPS, run_support.MIXTURE_LOGGING_STEPS
    source_of = np.zeros(run_support.N_DOCS, dtype=np.int64)
    for s, part in enumerate(run_support.MIXTURE_SOURCES.values()):
        source_of[part] = s
    doc_lengths = run_support.lengths()
    trained = np.zeros((steps, len(run_support.MIXTURE_SOURCES)), dtype=np.int64)
    for rank, records in hf_trainer["mixture"].items():
        sampler = run_support.mixture_sampler(rank)
        plan_steps = optimizer_steps(sampler)
        n_micro = int(plan_steps.offsets[steps])
        expected = [batch for _, batch in zip(range(n_micro), sampler, strict=False)]
        assert [r["docs"] for r in records] == expected
        assert [r["step"] for r in records] == [plan_steps.step_of(i) for i in range(n_micro)]
        for r in records:
            np.add.at(trained[r["step"]], source_of[r["docs"]], doc_lengths[r["docs"]])
    plan = run_support.mixture_sampler(0).mixture_plan()
    assert plan is not None
    np.testing.assert_array_equal(trained, plan.source_tokens[:steps])
    assert sorted(hf_trainer["mixture_logs"]) == [0, 1]
    for (log,) in hf_trainer["mixture_logs"].values():
        logged = [entry for entry in log["history"] if "loss" in entry]
        assert [entry["step"] for entry in logged] == list(range(every, steps + 1, every))
        for entry in logged:
            since = trained[entry["step"] - every : entry["step"]].sum(axis=0)
            counts = [entry[f"source_tokens/{name}"] for name in run_support.MIXTURE_SOURCES]
            assert counts == since.tolist()


def test_trainer_trains_on_micro_batches_within_every_budget(hf_trainer: Logs) -> None:
    # A sampler packing images besides tokens: each rank trains on its own sampler's
    # micro-batches, two to a step, each document once, no micro-batch over a budget.
    images = run_support.IMAGES[np.arange(run_support.N_DOCS) % 4]
    doc_lengths = run_support.lengths()
    logs = hf_trainer["extra_costs"]
    assert_each_document_once_per_epoch(logs, epochs=1)
    for rank, records in logs.items():
        assert [r["docs"] for r in records] == list(run_support.extra_costs_sampler(rank))
        n = len(records)
        assert micro_batches_per_step(records, 0) == [2] * (n // 2) + [1] * (n % 2)
        for r in records:
            assert images[r["docs"]].sum() <= run_support.MAX_IMAGES
            assert doc_lengths[r["docs"]].sum() <= run_support.MAX_TOKENS
    assert any(images[r["docs"]].sum() == run_support.MAX_IMAGES for r in logs[0])


@pytest.mark.parametrize("prefix", ["", "schedule_"])
def test_trainer_resumes_mid_epoch_exactly(hf_trainer: Logs, prefix: str) -> None:
    assert_resumed_exactly(
        hf_trainer[f"{prefix}uninterrupted"],
        hf_trainer[f"{prefix}stopped"],
        hf_trainer[f"{prefix}resumed"],
    )


# -- TRL SFTTrainer ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def trl_sft(tmp_path_factory: pytest.TempPathFactory) -> Logs:
    return launch("trl_sft.py", tmp_path_factory.mktemp("trl_sft"))


def test_sft_trainer_uses_each_document_once_with_equal_steps(trl_sft: Logs) -> None:
    assert_each_document_once_per_epoch(trl_sft["sft"])
    # The sampler was built from TRL's tokenization, which appends EOS to every text.
    n = len(sampler_of_the_runs(run_support.lengths() + 1))
    for records in trl_sft["sft"].values():
        for epoch in (0, 1):
            assert micro_batches_per_step(records, epoch) == [2] * (n // 2) + [1] * (n % 2)


def test_sft_trainer_normalizes_by_the_label_tokens_of_all_ranks(trl_sft: Logs) -> None:
    assert_num_items_count_every_rank(trl_sft["sft"])


# -- Accelerate --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def accelerate_loop(tmp_path_factory: pytest.TempPathFactory) -> Logs:
    return launch("accelerate_loop.py", tmp_path_factory.mktemp("accelerate"))


def test_accelerate_loop_uses_each_document_once_with_equal_steps(accelerate_loop: Logs) -> None:
    assert_each_document_once_per_epoch(accelerate_loop["accelerate"])
    assert_num_items_count_every_rank(accelerate_loop["accelerate"])
    n = len(sampler_of_the_runs())
    assert all(len(records) == 2 * n for records in accelerate_loop["accelerate"].values())


def test_plain_accelerate_prepare_is_refused_before_any_batch(accelerate_loop: Logs) -> None:
    # accelerator.prepare would keep every other batch of each rank's already distributed
    # micro-batches (about half the data never seen): every rank refuses at the first
    # batch, naming the supported way.
    plain = accelerate_loop["plain"]
    assert sorted(plain) == [0, 1]
    for records in plain.values():
        assert len(records) == 1
        assert "docs" not in records[0]
        assert "prepare_data_loader(accelerator, loader)" in records[0]["error"]
        assert "over 2 processes" in records[0]["error"]


# -- torchdata StatefulDataLoader, and the gradients of a normalized step -----------------


@pytest.fixture(scope="module")
def stateful_loader(tmp_path_factory: pytest.TempPathFactory) -> tuple[Logs, Path]:
    out = tmp_path_factory.mktemp("stateful_loader")
    return launch("stateful_loader.py", out), out


def test_stateful_loader_uses_each_document_once_with_equal_steps(
    stateful_loader: tuple[Logs, Path],
) -> None:
    logs, _ = stateful_loader
    assert_each_document_once_per_epoch(logs["uninterrupted"])
    assert_num_items_count_every_rank(logs["uninterrupted"])


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_loader_resumes_mid_epoch_exactly(
    stateful_loader: tuple[Logs, Path], workers: int
) -> None:
    logs, _ = stateful_loader
    assert_resumed_exactly(
        logs["uninterrupted"], logs[f"stopped_w{workers}"], logs[f"resumed_w{workers}"]
    )


def flat_gradients(path: Path) -> Any:
    import torch

    grads = torch.load(path)
    return torch.cat([grads[name].flatten() for name in sorted(grads)]).double()


def test_step_normalization_gives_the_gradients_of_one_process_over_the_global_batch(
    stateful_loader: tuple[Logs, Path],
) -> None:
    # Two ranks accumulate three token-budget micro-batches each under DDP; the reference
    # is one process over all six with sum-over-tokens / total-tokens.
    _, out = stateful_loader
    meta = json.loads((out / "grads.json").read_text())
    assert meta["num_items_in_batch"] == meta["label_tokens"], "counted from the plan"
    reference = flat_gradients(out / "grads_reference.pt")
    normalized = flat_gradients(out / "grads_step.pt")
    per_micro_batch_mean = flat_gradients(out / "grads_mean.pt")
    error = float((normalized - reference).norm() / reference.norm())
    assert error < 1e-5, f"normalized by the step's label tokens: relative error {error:.2e}"
    error = float((per_micro_batch_mean - reference).norm() / reference.norm())
    assert error > 1e-3, f"per-micro-batch means should weigh tokens unequally: {error:.2e}"


# -- Lightning ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lightning_fit(tmp_path_factory: pytest.TempPathFactory) -> Logs:
    return launch("lightning_fit.py", tmp_path_factory.mktemp("lightning"))


def test_lightning_uses_each_document_once_with_equal_steps(lightning_fit: Logs) -> None:
    assert_each_document_once_per_epoch(lightning_fit["uninterrupted"])
    assert_num_items_count_every_rank(lightning_fit["uninterrupted"])
    n = len(sampler_of_the_runs())
    for records in lightning_fit["uninterrupted"].values():
        for epoch in (0, 1):
            assert micro_batches_per_step(records, epoch) == [2] * (n // 2) + [1] * (n % 2)


def test_lightning_resumes_mid_epoch_exactly(lightning_fit: Logs) -> None:
    assert_resumed_exactly(
        lightning_fit["uninterrupted"], lightning_fit["stopped"], lightning_fit["resumed"]
    )


def test_lightning_refuses_to_have_the_sampler_replaced(lightning_fit: Logs) -> None:
    for records in lightning_fit["refused"].values():
        assert "use_distributed_sampler=False" in records[0]["error"]

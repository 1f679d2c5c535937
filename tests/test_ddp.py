"""Real multi-process training: examples/train_ddp.py under torchrun with the gloo backend.

Each run trains a tiny model for a few seconds on a few hundred synthetic documents and
writes one JSON line per step and rank; the tests read those logs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import run_support
from script_module import load_script

from tokenbatch import pack

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_ddp.py"
N_SEQS = 400
COMMON = [
    "--num-seqs", str(N_SEQS), "--max-length", "256", "--max-tokens", "256",
    "--d-model", "32", "--n-layers", "2", "--epochs", "2", "--log-every", "1000",
]  # fmt: skip
TIMEOUT_S = 240

Logs = dict[int, list[dict[str, Any]]]


def document_lengths(distribution: str, n: int, max_length: int, seed: int) -> Any:
    """The example's length distribution (imported from the script file)."""
    module = load_script(EXAMPLE, "train_ddp_lengths")
    return module.document_lengths(distribution, n, max_length, seed)


def torchrun(nproc: int, log_dir: Path, *extra: str) -> Logs:
    """Run the example on ``nproc`` CPU processes; return each rank's step records."""
    run_support.torchrun(
        EXAMPLE, [*COMMON, "--log-dir", str(log_dir), *extra],
        nproc=nproc, cwd=log_dir, timeout=TIMEOUT_S,
    )  # fmt: skip
    return read_logs(log_dir, nproc)


def read_logs(log_dir: Path, nproc: int) -> Logs:
    logs: Logs = {}
    for rank in range(nproc):
        lines = (log_dir / f"rank{rank}.jsonl").read_text().splitlines()
        logs[rank] = [json.loads(line) for line in lines]
    return logs


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Logs:
    return torchrun(2, tmp_path_factory.mktemp("ddp2"))


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory: pytest.TempPathFactory) -> Logs:
    return torchrun(4, tmp_path_factory.mktemp("ddp4"))


def assert_disjoint_cover(logs: Logs) -> None:
    n_steps = {rank: len(records) for rank, records in logs.items()}
    assert len(set(n_steps.values())) == 1, f"ranks ran different numbers of steps: {n_steps}"
    for epoch in (0, 1):
        per_rank = [
            [i for record in records if record["epoch"] == epoch for i in record["indices"]]
            for records in logs.values()
        ]
        everything = [i for indices in per_rank for i in indices]
        assert len(everything) == len(set(everything)), f"a sequence repeated in epoch {epoch}"
        assert sorted(everything) == list(range(N_SEQS)), f"sequences missing in epoch {epoch}"
    steps = [[record["step"] for record in records] for records in logs.values()]
    assert all(s == steps[0] for s in steps)


def expected_steps_per_epoch(nproc: int) -> int:
    """Bins of the packing, rounded up to a multiple of the ranks, per rank."""
    lengths = document_lengths("lognormal", N_SEQS, 256, 0)
    return -(-len(pack(lengths, 256)) // nproc)


def test_two_ranks_see_disjoint_sequences_covering_the_dataset(two_ranks: Logs) -> None:
    assert_disjoint_cover(two_ranks)
    assert len(two_ranks[0]) == 2 * expected_steps_per_epoch(2)


def test_four_ranks_see_disjoint_sequences_covering_the_dataset(four_ranks: Logs) -> None:
    assert_disjoint_cover(four_ranks)
    assert len(four_ranks[0]) == 2 * expected_steps_per_epoch(4)


def test_loss_goes_down(two_ranks: Logs) -> None:
    losses = [record["loss"] for record in two_ranks[0]]
    # Every rank logs the same global loss.
    np.testing.assert_allclose(losses, [record["loss"] for record in two_ranks[1]])
    first, last = np.mean(losses[:5]), np.mean(losses[-5:])
    assert last < 0.8 * first, f"loss did not go down: {first:.3f} -> {last:.3f}"


def test_stopped_and_resumed_run_sees_the_same_batches(two_ranks: Logs, tmp_path: Path) -> None:
    steps_per_epoch = sum(1 for record in two_ranks[0] if record["epoch"] == 0)
    stop = steps_per_epoch + steps_per_epoch // 2  # in the middle of the second epoch
    checkpoint = tmp_path / "checkpoint.pt"
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    first_dir.mkdir()
    second_dir.mkdir()
    # DataLoader workers fetch ahead; the checkpoint must still count consumed batches.
    workers = ["--num-workers", "1"]
    first = torchrun(
        2, first_dir, *workers, "--checkpoint", str(checkpoint),
        "--checkpoint-at", str(stop), "--stop-after-checkpoint",
    )  # fmt: skip
    assert [len(records) for records in first.values()] == [stop, stop]
    second = torchrun(2, second_dir, *workers, "--resume", str(checkpoint))
    for rank in (0, 1):
        uninterrupted = two_ranks[rank]
        resumed = first[rank] + second[rank]
        assert [r["step"] for r in resumed] == [r["step"] for r in uninterrupted]
        assert [r["indices"] for r in resumed] == [r["indices"] for r in uninterrupted]
        np.testing.assert_allclose(
            [r["loss"] for r in resumed], [r["loss"] for r in uninterrupted], rtol=1e-5
        )


def test_resumed_on_fewer_ranks_finishes_the_epoch_with_each_sequence_once(
    tmp_path: Path,
) -> None:
    # Four processes stop in the middle of the second epoch (a lost node); two resume
    # from the checkpoint and finish that epoch.
    stop = expected_steps_per_epoch(4) + 3
    checkpoint = tmp_path / "checkpoint.pt"
    first_dir, second_dir = tmp_path / "four", tmp_path / "two"
    first_dir.mkdir()
    second_dir.mkdir()
    first = torchrun(
        4, first_dir, "--checkpoint", str(checkpoint),
        "--checkpoint-at", str(stop), "--stop-after-checkpoint",
    )  # fmt: skip
    second = torchrun(2, second_dir, "--resume", str(checkpoint), "--allow-resize")
    assert len({len(records) for records in second.values()}) == 1, "equal steps on both ranks"
    assert [r["step"] for r in second[0]] == list(range(stop + 1, stop + 1 + len(second[0])))
    used = [
        i
        for logs in (first, second)
        for records in logs.values()
        for record in records
        if record["epoch"] == 1
        for i in record["indices"]
    ]
    assert sorted(used) == list(range(N_SEQS)), "every sequence of the epoch exactly once"

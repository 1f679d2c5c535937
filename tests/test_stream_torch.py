"""StreamingDataset in a torch DataLoader: sharding by rank and worker, collation, resume."""

from __future__ import annotations

import copy
import multiprocessing
import subprocess
import sys
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from tokenbatch.errors import InvalidValueError
from tokenbatch.torch import PackedCollator, StreamingDataset

MAX_TOKENS = 256


def corpus(n: int = 600) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    # token 0 of item i is i, so batches say which items they hold
    return [
        {"input_ids": np.concatenate([[i], rng.integers(1000, 2000, int(length) - 1)])}
        for i, length in enumerate(rng.integers(1, 200, n))
    ]


def first_tokens(batch: dict[str, Any]) -> list[int]:
    cu = batch["cu_seqlens"].tolist()
    row = batch["input_ids"][0]
    return [int(row[start]) for start in cu[:-1]]


def make(items: list[dict[str, Any]], **options: Any) -> Any:
    return StreamingDataset(
        items, MAX_TOKENS, collate_fn=PackedCollator(), buffer_size=64, seed=1, **options
    )


def test_is_an_iterable_dataset_of_the_torch_package() -> None:
    dataset = make(corpus(10))
    assert isinstance(dataset, IterableDataset)
    assert type(dataset).__module__ == "tokenbatch.torch.streaming"


def test_the_stream_module_imports_without_torch_and_holds_no_dataset() -> None:
    code = "import sys, tokenbatch, tokenbatch.stream; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr
    import tokenbatch.stream

    # The dataset lives in tokenbatch.torch only; the stream module never imports it.
    assert not hasattr(tokenbatch.stream, "StreamingDataset")
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        tokenbatch.stream.Nothing  # type: ignore[attr-defined]  # noqa: B018


@pytest.mark.parametrize("num_workers", [0, 2])
def test_ranks_and_workers_read_every_item_exactly_once(num_workers: int) -> None:
    items = corpus()
    seen: Counter[int] = Counter()
    for rank in range(2):
        dataset = make(items, num_replicas=2, rank=rank)
        loader = DataLoader(dataset, batch_size=None, num_workers=num_workers)
        for batch in loader:
            assert batch["input_ids"].shape[1] <= MAX_TOKENS
            assert batch["input_ids"].dtype == torch.int64
            tokens = first_tokens(batch)
            assert all(t % 2 == rank for t in tokens)
            seen.update(tokens)
    assert seen == Counter(range(len(items)))


def test_resume_without_workers_is_exact() -> None:
    items = corpus()
    expected = [first_tokens(b) for b in DataLoader(make(items), batch_size=None)]
    dataset = make(items)
    loader = DataLoader(dataset, batch_size=None)
    taken = []
    for step, batch in enumerate(loader):
        taken.append(first_tokens(batch))
        if step == 9:
            break
    state = dataset.state_dict()
    assert state["consumed_batches"] == 10
    fresh = make(items)
    fresh.load_state_dict(state)
    rest = [first_tokens(b) for b in DataLoader(fresh, batch_size=None)]
    assert taken + rest == expected


def test_resume_with_workers_skips_consumed_batches() -> None:
    items = corpus()
    loader = DataLoader(make(items), batch_size=None, num_workers=2)
    expected = [first_tokens(b) for b in loader]
    fresh = make(items)
    fresh.load_state_dict(make(items).state_dict(consumed_batches=7, num_workers=2))
    rest = [first_tokens(b) for b in DataLoader(fresh, batch_size=None, num_workers=2)]
    assert rest == expected[7:]
    # counts are totals since the start of the stream, so a second resume works too
    again = make(items)
    again.load_state_dict(fresh.state_dict(consumed_batches=12, num_workers=2))
    assert [first_tokens(b) for b in DataLoader(again, batch_size=None, num_workers=2)] == (
        expected[12:]
    )


@pytest.mark.parametrize(
    ("num_workers", "context", "persistent"),
    [(0, None, False), (2, "fork", False), (2, "fork", True), (2, "forkserver", False)],
)
def test_a_resume_applies_to_the_next_epoch_only(
    num_workers: int, context: str | None, persistent: bool
) -> None:
    # The saved position was cleared only in the workers' copies of the dataset, so every
    # later epoch skipped the resumed epoch's batches again (292 of 302 batches, each epoch).
    # "forkserver" (Python 3.14's default on Linux) pickles the dataset into each worker,
    # like "spawn", and starts faster once torch is preloaded.
    items = corpus()
    if context == "forkserver":
        multiprocessing.get_context(context).set_forkserver_preload(["tokenbatch.torch"])
    options: dict[str, Any] = {
        "batch_size": None,
        "num_workers": num_workers,
        "multiprocessing_context": context,
        "persistent_workers": persistent,
    }
    plain = {"batch_size": None, "num_workers": num_workers}
    fresh = [first_tokens(b) for b in DataLoader(make(items), **plain)]
    dataset = make(items)
    if num_workers:
        dataset.load_state_dict(make(items).state_dict(consumed_batches=7, num_workers=2))
    else:
        interrupted = make(items)
        for step, _ in enumerate(interrupted):
            if step == 6:
                break
        dataset.load_state_dict(interrupted.state_dict())
    loader = DataLoader(dataset, **options)
    assert [first_tokens(b) for b in loader] == fresh[7:]
    assert [first_tokens(b) for b in loader] == fresh
    assert [first_tokens(b) for b in loader] == fresh


def test_a_copy_of_a_resumed_dataset_resumes_on_its_own() -> None:
    items = corpus()
    fresh = [first_tokens(b) for b in DataLoader(make(items), batch_size=None, num_workers=2)]
    dataset = make(items)
    dataset.load_state_dict(make(items).state_dict(consumed_batches=5, num_workers=2))
    twin = copy.deepcopy(dataset)
    for resumed in (dataset, twin):
        loader = DataLoader(resumed, batch_size=None, num_workers=2)
        assert [first_tokens(b) for b in loader] == fresh[5:]
        assert [first_tokens(b) for b in loader] == fresh


def test_state_errors() -> None:
    items = corpus(20)
    with pytest.raises(InvalidValueError, match="not iterated in this process"):
        make(items).state_dict()
    with pytest.raises(InvalidValueError, match="pass consumed_batches"):
        make(items).state_dict(num_workers=2)
    state = make(items, num_replicas=2, rank=0).state_dict(consumed_batches=1, num_workers=2)
    with pytest.raises(InvalidValueError, match="rank=0"):
        make(items, num_replicas=2, rank=1).load_state_dict(state)
    dataset = make(items, num_replicas=2, rank=0)
    dataset.load_state_dict(state)
    with pytest.raises(InvalidValueError, match="num_workers=2"):
        list(dataset)
    with pytest.raises(InvalidValueError, match="rank must be in"):
        make(items, num_replicas=2, rank=2)


STOP_TOGETHER_SCRIPT = """
import json, os, sys
import torch.distributed as dist
from tokenbatch.torch import StreamingDataset, stop_together

dist.init_process_group("gloo")
rank = dist.get_rank()
# Uneven shards of one stream of 60-token items, one item per bin.
lengths = [int(x) for x in sys.argv[1].split(",")]
shard = StreamingDataset(lengths, 64, buffer_size=4, length_fn=int, num_replicas=3, rank=rank)
own = sum(1 for _ in shard)
seen = 0
for batch in stop_together(shard):
    dist.barrier()  # a collective per step, as DDP's gradient all-reduce would be
    seen += 1
with open(os.path.join(sys.argv[2], f"rank{rank}.json"), "w") as out:
    json.dump({"own": own, "seen": seen}, out)
dist.destroy_process_group()
"""


def test_stop_together_ends_uneven_ranks_at_the_shortest(tmp_path: Any) -> None:
    import os
    import socket
    import subprocess
    import sys

    script = tmp_path / "uneven.py"
    script.write_text(STOP_TOGETHER_SCRIPT)
    # 3 ranks over 40 items of 60 tokens: one bin per item, so the shards hold 14, 13, 13.
    lengths = ",".join(["60"] * 40)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=3",
         f"--master_port={port}", str(script), lengths, str(tmp_path)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    import json

    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    assert sorted(r["own"] for r in ranks) == [13, 13, 14]
    assert [r["seen"] for r in ranks] == [13, 13, 13]


def test_stop_together_is_plain_iteration_without_a_process_group() -> None:
    from tokenbatch.torch import stop_together

    assert list(stop_together(iter([1, 2, 3]))) == [1, 2, 3]

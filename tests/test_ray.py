"""tokenbatch.ray.pack on a small local Ray cluster: exactly-once placement, balanced
shards, a manifest that matches the files, and nothing presented as complete on failure."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray

import tokenbatch.ray as tb_ray
from tokenbatch.errors import InvalidTypeError, InvalidValueError

MAX_TOKENS = 512


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        yield
    finally:
        ray.shutdown()


def corpus(n: int, seed: int = 0) -> pa.Table:
    """Token ``j`` of row ``i`` is ``i * 10_000 + j``."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 900, n)
    ids = [np.arange(length, dtype=np.int64) + i * 10_000 for i, length in enumerate(lengths)]
    return pa.table({"input_ids": ids, "labels": [-row for row in ids]})


def test_exactly_once_across_shards(cluster: None, tmp_path: Path) -> None:
    table = corpus(3_000)
    dataset = ray.data.from_arrow(table).repartition(6)
    manifest = tb_ray.pack(
        dataset, MAX_TOKENS, tmp_path, oversize="split", num_shards=4, position_ids=True
    )
    on_disk = json.loads((tmp_path / "manifest.json").read_text())
    assert on_disk == manifest
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "manifest.json",
        *(f"part-{i:05d}.parquet" for i in range(4)),
    ]
    placed: dict[int, list[int]] = {}
    for entry in manifest["shards"]:
        shard = pq.read_table(tmp_path / entry["file"]).to_pydict()
        assert entry["rows"] == len(shard["input_ids"])
        assert entry["tokens"] == sum(map(len, shard["input_ids"]))
        assert entry["sequences"] == sum(map(len, shard["seq_lengths"]))
        for ids, labels, lengths, positions in zip(
            shard["input_ids"],
            shard["labels"],
            shard["seq_lengths"],
            shard["position_ids"],
            strict=True,
        ):
            assert len(ids) <= MAX_TOKENS
            assert labels == [-t for t in ids]
            assert sum(lengths) == len(ids)
            assert positions == [p for n in lengths for p in range(n)]
            for token in ids:
                placed.setdefault(token // 10_000, []).append(token % 10_000)
    lengths = [len(row) for row in table.column("input_ids").to_pylist()]
    assert sorted(placed) == list(range(len(lengths)))
    for row, n in enumerate(lengths):
        assert sorted(placed[row]) == list(range(n)), f"row {row} lost or repeated tokens"
    assert manifest["tokens"] == sum(lengths)
    rows = [entry["rows"] for entry in manifest["shards"]]
    assert max(rows) - min(rows) <= 1, "balanced shards"
    # Each block was packed as a whole: nearly as few rows as one global packing.
    assert manifest["rows"] <= 1.02 * sum(lengths) / MAX_TOKENS + 6


def test_failing_block_leaves_nothing(cluster: None, tmp_path: Path) -> None:
    def poison(batch: pa.Table) -> pa.Table:
        if batch.column("input_ids")[0].values[0].as_py() >= 2_500 * 10_000:
            raise RuntimeError("corrupt block")
        return batch

    dataset = ray.data.from_arrow(corpus(3_000)).repartition(6)
    failing = dataset.map_batches(poison, batch_format="pyarrow", batch_size=None)
    with pytest.raises(tb_ray.PackingFailedError, match="corrupt block"):
        tb_ray.pack(failing, MAX_TOKENS, tmp_path, num_shards=2)
    assert list(tmp_path.iterdir()) == []


def test_bad_input(cluster: None, tmp_path: Path) -> None:
    mixed = ray.data.from_items([{"input_ids": [1, 2], "id": 0}])
    with pytest.raises(InvalidTypeError, match=r"pass columns=\['input_ids'\]"):
        tb_ray.pack(mixed, 8, tmp_path)
    with pytest.raises(InvalidTypeError, match=r"ray\.data\.Dataset"):
        tb_ray.pack(corpus(3), 8, tmp_path)
    with pytest.raises(InvalidValueError, match="algorithm"):
        tb_ray.pack(ray.data.from_arrow(corpus(3)), 8, tmp_path, algorithm="best")  # type: ignore[arg-type]
    empty = ray.data.from_arrow(corpus(3).slice(0, 0))
    with pytest.raises(InvalidValueError, match="empty"):
        tb_ray.pack(empty, 8, tmp_path / "empty")
    assert list((tmp_path / "empty").iterdir()) == []
    done = tmp_path / "done"
    tb_ray.pack(ray.data.from_arrow(corpus(10)), MAX_TOKENS, done)
    with pytest.raises(InvalidValueError, match="holds a finished packing"):
        tb_ray.pack(ray.data.from_arrow(corpus(10)), MAX_TOKENS, done)

"""tokenbatch.ray.pack on a small local Ray cluster: exactly-once placement, balanced
shards, a manifest that matches the files, outputs through pyarrow.fs (file:// URIs and an
S3-compatible server), and nothing presented as complete on failure."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import ray
from moto.server import ThreadedMotoServer

import tokenbatch.ray as tb_ray
from tokenbatch.errors import InvalidTypeError, InvalidValueError
from tokenbatch.hf import pack_table

# Ray 2.52 leaves its log files and child processes to its own shutdown, which Python
# reports as resource warnings while the tests run.
pytestmark = [
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]

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


def read_shards(manifest: dict[str, Any], read: Callable[[str], pa.Table]) -> list[dict[str, Any]]:
    """Every shard of ``manifest`` as columns, after checking the counts the manifest gives."""
    shards = []
    for entry in manifest["shards"]:
        shard = read(entry["file"]).to_pydict()
        assert entry["rows"] == len(shard["input_ids"])
        assert entry["tokens"] == sum(map(len, shard["input_ids"]))
        assert entry["sequences"] == sum(map(len, shard["seq_lengths"]))
        shards.append(shard)
    return shards


def assert_exactly_once(
    table: pa.Table, shards: list[dict[str, Any]], manifest: dict[str, Any]
) -> None:
    """Every token of every row of ``table`` in exactly one packed row, labels and
    sequence lengths consistent, no row over the budget."""
    placed: dict[int, list[int]] = {}
    for shard in shards:
        for ids, labels, lengths in zip(
            shard["input_ids"], shard["labels"], shard["seq_lengths"], strict=True
        ):
            assert len(ids) <= MAX_TOKENS
            assert labels == [-t for t in ids]
            assert sum(lengths) == len(ids)
            for token in ids:
                placed.setdefault(token // 10_000, []).append(token % 10_000)
    lengths = [len(row) for row in table.column("input_ids").to_pylist()]
    assert sorted(placed) == list(range(len(lengths)))
    for row, n in enumerate(lengths):
        assert sorted(placed[row]) == list(range(n)), f"row {row} lost or repeated tokens"
    assert manifest["tokens"] == sum(lengths)


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
    shards = read_shards(manifest, lambda name: pq.read_table(tmp_path / name))
    assert_exactly_once(table, shards, manifest)
    for shard in shards:
        for lengths, positions in zip(shard["seq_lengths"], shard["position_ids"], strict=True):
            assert positions == [p for n in lengths for p in range(n)]
    rows = [entry["rows"] for entry in manifest["shards"]]
    assert max(rows) - min(rows) <= 1, "balanced shards"
    # Each block was packed as a whole: nearly as few rows as one global packing.
    assert manifest["rows"] <= 1.02 * manifest["tokens"] / MAX_TOKENS + 6


def test_file_uri_output(cluster: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``file://`` used to become ``file:/...`` under pathlib: a stray folder, orphaned shards."""
    monkeypatch.chdir(tmp_path)
    table = corpus(400)
    output = tmp_path / "packed"
    dataset = ray.data.from_arrow(table)
    manifest = tb_ray.pack(dataset, MAX_TOKENS, output.as_uri(), oversize="split", num_shards=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["packed"]
    assert sorted(p.name for p in output.iterdir()) == [
        "manifest.json",
        "part-00000.parquet",
        "part-00001.parquet",
    ]
    assert json.loads((output / "manifest.json").read_text()) == manifest
    assert_exactly_once(
        table, read_shards(manifest, lambda name: pq.read_table(output / name)), manifest
    )


@pytest.fixture(scope="module")
def s3() -> Iterator[pafs.S3FileSystem]:
    """A local S3-compatible server (moto) and a filesystem on it."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    filesystem = pafs.S3FileSystem(
        access_key="testing",
        secret_key="testing",
        region="us-east-1",
        scheme="http",
        endpoint_override=f"{host}:{port}",
        allow_bucket_creation=True,
        # moto 5 answers CompleteMultipartUpload with a root element the AWS SDK inside
        # pyarrow rejects; a delayed open sends small objects in one PUT instead.
        allow_delayed_open=True,
    )
    filesystem.create_dir("corpus")
    try:
        yield filesystem
    finally:
        server.stop()


def test_object_storage_output(cluster: None, s3: pafs.S3FileSystem) -> None:
    table = corpus(600)
    dataset = ray.data.from_arrow(table).repartition(3)
    manifest = tb_ray.pack(
        dataset, MAX_TOKENS, "corpus/packed", filesystem=s3, oversize="split", num_shards=3
    )
    listing = s3.get_file_info(pafs.FileSelector("corpus/packed", recursive=True))
    assert sorted(info.base_name for info in listing) == [
        "manifest.json",
        *(f"part-{i:05d}.parquet" for i in range(3)),
    ]
    with s3.open_input_stream("corpus/packed/manifest.json") as stream:
        assert json.loads(stream.read()) == manifest

    def read(name: str) -> pa.Table:
        with s3.open_input_file(f"corpus/packed/{name}") as source:
            return pq.read_table(source)

    assert_exactly_once(table, read_shards(manifest, read), manifest)
    with pytest.raises(InvalidValueError, match="holds a finished packing"):
        tb_ray.pack(dataset, MAX_TOKENS, "corpus/packed", filesystem=s3)


def test_output_uris_resolve_to_their_filesystem(tmp_path: Path) -> None:
    local, path = tb_ray._resolve_output(tmp_path.as_uri() + "/out/", None)
    assert (local.type_name, path) == ("local", f"{tmp_path}/out")
    s3, key = tb_ray._resolve_output("s3://bucket/packed?region=us-east-1", None)
    assert (s3.type_name, key) == ("s3", "bucket/packed")
    assert tb_ray._resolve_output("packed", None)[1] == str(Path("packed").resolve())
    with pytest.raises(InvalidValueError, match="not a URI"):
        tb_ray._resolve_output("nosuchscheme://x", None)
    with pytest.raises(InvalidTypeError, match=r"pyarrow\.fs\.FileSystem"):
        tb_ray._resolve_output("x", "not a filesystem")


def test_driver_refuses_shards_it_cannot_see_as_written(tmp_path: Path) -> None:
    """What a task reports is checked against the file the driver reads."""
    local = pafs.LocalFileSystem()
    folder = str(tmp_path)
    packed, _ = pack_table(corpus(20), MAX_TOKENS)
    pq.write_table(packed, tmp_path / "shard.parquet")
    counts = tb_ray._counts(packed)
    good = {"written": "shard.parquet", "node": "a", **counts}
    assert tb_ray._check_shards(local, folder, [good])[0]["tokens"] == counts["tokens"]
    missing = {**good, "written": "elsewhere.parquet", "node": "b"}
    with pytest.raises(tb_ray.PackingFailedError, match=r"written on node b\) cannot be read"):
        tb_ray._check_shards(local, folder, [good, missing])
    different = {**good, "tokens": counts["tokens"] + 1}
    with pytest.raises(tb_ray.PackingFailedError, match="1 of 1 shards are not as their tasks"):
        tb_ray._check_shards(local, folder, [different])


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

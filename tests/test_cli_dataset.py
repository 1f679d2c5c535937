"""The `tokenbatch pack-dataset` command line: Parquet files, directories and save_to_disk
datasets in, one packed Parquet file out, written only when complete."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tokenbatch import hf
from tokenbatch.cli import dataset_command, main
from tokenbatch.cli.progress import Progress
from tokenbatch.hf import pack_table


def tokenized(n: int, seed: int) -> pa.Table:
    """``n`` rows whose tokens encode (row, position) so the packed rows can be checked."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 300, n)
    rows = [[1000 * (seed * 10_000 + i) + t for t in range(k)] for i, k in enumerate(lengths)]
    return pa.table(
        {
            "input_ids": pa.array(rows, type=pa.list_(pa.int64())),
            "labels": pa.array(rows, type=pa.list_(pa.int64())),
        }
    )


def check_packed(path: Path, sources: list[pa.Table], max_tokens: int) -> None:
    packed = pq.read_table(path).to_pydict()
    assert packed["input_ids"] == packed["labels"]
    for ids, lengths in zip(packed["input_ids"], packed["seq_lengths"], strict=True):
        assert 0 < len(ids) <= max_tokens
        assert sum(lengths) == len(ids)
    expected = sorted(t for table in sources for row in table["input_ids"].to_pylist() for t in row)
    assert sorted(t for ids in packed["input_ids"] for t in ids) == expected


def test_packs_a_parquet_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = tokenized(3000, seed=1)
    pq.write_table(table, tmp_path / "in.parquet", row_group_size=500)
    out = tmp_path / "packed.parquet"
    assert main(["pack-dataset", str(tmp_path / "in.parquet"), str(out), "--max-tokens", "512",
                 "--json"]) == 0  # fmt: skip
    summary = json.loads(capsys.readouterr().out)
    assert summary["input_rows"] == 3000
    assert summary["output_rows"] == pq.read_metadata(out).num_rows
    assert summary["efficiency"] > 0.99
    check_packed(out, [table], 512)
    assert not list(tmp_path.glob("*.partial")), "no temporary file left behind"


def test_packs_a_directory_and_a_saved_dataset(tmp_path: Path) -> None:
    parts = [tokenized(400, seed=s) for s in (2, 3)]
    shards = tmp_path / "shards"
    shards.mkdir()
    for i, part in enumerate(parts):
        pq.write_table(part, shards / f"part-{i}.parquet")
    out = tmp_path / "from-dir.parquet"
    args = ["--max-tokens", "700", "--columns", "input_ids,labels", "--position-ids"]
    assert main(["pack-dataset", str(shards), str(out), *args]) == 0
    check_packed(out, parts, 700)
    positions = pq.read_table(out, columns=["position_ids", "seq_lengths"]).to_pydict()
    for row, lengths in zip(positions["position_ids"], positions["seq_lengths"], strict=True):
        assert row == [p for n in lengths for p in range(n)]

    saved = tmp_path / "saved"
    datasets.Dataset(datasets.table.InMemoryTable(parts[0])).save_to_disk(str(saved))
    out = tmp_path / "from-saved.parquet"
    assert main(["pack-dataset", str(saved), str(out), "--max-tokens", "300"]) == 0
    check_packed(out, parts[:1], 300)


def test_bad_input_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pq.write_table(tokenized(50, seed=4), tmp_path / "in.parquet")
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [
        ([str(tmp_path / "missing.parquet"), str(tmp_path / "o.parquet")], "does not exist"),
        ([str(empty), str(tmp_path / "o.parquet")], "holds no .parquet files"),
        ([str(tmp_path / "in.parquet"), str(tmp_path / "o.parquet"), "--columns", "nope"],
         "unknown columns"),
        ([str(tmp_path / "in.parquet"), str(tmp_path / "o.parquet"), "--oversize", "error",
          "--max-tokens", "5"], "more than max_tokens=5"),
    ]  # fmt: skip
    for args, message in cases:
        options = [] if "--max-tokens" in args else ["--max-tokens", "512"]
        assert main(["pack-dataset", *args, *options]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "o.parquet").exists()


def test_an_interrupted_write_leaves_no_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pq.write_table(tokenized(2000, seed=5), tmp_path / "in.parquet")
    out = tmp_path / "packed.parquet"
    monkeypatch.setattr(dataset_command, "WRITE_BATCH_ROWS", 10)
    written = []

    def interrupt_after_two(self: Any, batch: pa.RecordBatch) -> None:
        written.append(batch.num_rows)
        if len(written) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(pq.ParquetWriter, "write_batch", interrupt_after_two)
    assert main(["pack-dataset", str(tmp_path / "in.parquet"), str(out), "--max-tokens", "512"]) \
        == 130  # fmt: skip
    assert "interrupted" in capsys.readouterr().err
    assert written == [10, 10]
    assert not out.exists()
    assert not list(tmp_path.glob("*.partial"))


def test_assembly_reports_progress_up_to_the_total() -> None:
    table = tokenized(500, seed=6)
    calls: list[tuple[int, int]] = []
    default = hf._CHUNK_TOKENS
    hf._CHUNK_TOKENS = 5000  # several groups
    try:
        pack_table(table, 512, progress=lambda done, total: calls.append((done, total)))
    finally:
        hf._CHUNK_TOKENS = default
    total = sum(len(row) for row in table["input_ids"].to_pylist())
    assert len(calls) > 3
    assert all(t == total for _, t in calls)
    done = [d for d, _ in calls]
    assert done == sorted(done)
    assert done[-1] == total


def test_progress_bar_draws_on_a_terminal_only() -> None:
    stream = io.StringIO()
    with Progress("assembling rows", 1, stream=stream, enabled=True) as bar:
        bar.update(50, 200)
        bar.update(200, 200)
    assert "assembling rows [" in stream.getvalue()
    assert "100%" in stream.getvalue()
    quiet = io.StringIO()
    with Progress("reading", 10, stream=quiet) as bar:  # a StringIO is not a terminal
        bar.advance(10)
    assert quiet.getvalue() == ""
